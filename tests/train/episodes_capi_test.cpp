// Multi-turn episodes through the C API (rl_rollouts_generate_episodes,
// rl_env_step) on the tiny model with the guess_number env: what the env
// answered is in the sequence with loss mask 0, the sampled turns with mask 1;
// rewards are the sums of the turns' rewards; a failing step drops only its
// episode.
#include "train_util.hpp"

#include <nlohmann/json.hpp>

namespace {

using namespace rl_train_test;
using nlohmann::json;

InstancePtr make_env(const char *name, const char *params = "{}") {
    rl_instance_t *i = nullptr;
    if (rl_instance_create(runtime(), "env", name, params, &i) != RL_OK)
        ADD_FAILURE() << name << ": " << rl_last_error();
    return InstancePtr(i);
}

const char *kGame = R"({"lo": 1, "hi": 8, "max_guesses": 4})";

std::string sample_tasks(rl_instance_t *env, uint64_t n) {
    Result r;
    EXPECT_EQ(rl_env_sample(env, n, 5, r.out()), RL_OK) << rl_last_error();
    return r.text("tasks");
}

RolloutsPtr episodes(rl_engine_t *e, rl_instance_t *env, const std::string &tasks,
                     const char *options) {
    rl_rollouts_t *r = nullptr;
    if (rl_rollouts_generate_episodes(e, env, tasks.c_str(), options, &r) != RL_OK)
        ADD_FAILURE() << rl_last_error();
    return RolloutsPtr(r);
}

const char *kOptions = R"({"sampling": {"n": 4, "max_tokens": 4, "seed": 3}, "max_turns": 4})";

TEST(Episodes, ObservationsAreUntrainedAndRewardsAreTheSumOfTheTurns) {
    ModelPtr m = load_model();
    EnginePtr e = make_engine(m.get());
    InstancePtr env = make_env("guess_number", kGame);
    const std::string tasks = sample_tasks(env.get(), 3);
    RolloutsPtr r = episodes(e.get(), env.get(), tasks, kOptions);
    ASSERT_NE(r, nullptr);
    Result info;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), info.out()));
    EXPECT_EQ(info.scalar("rollouts"), 12);
    EXPECT_EQ(info.scalar("episode_errors"), 0);
    const auto turns = info.tensor<int64_t>("turns");
    const json turn_rewards = json::parse(info.text("turn_rewards"));
    const json spans = json::parse(info.text("turn_spans"));
    const json reasons = json::parse(info.text("finish_reasons"));
    const json task_list = json::parse(tasks);
    const auto rewards = info.tensor<double>("rewards");

    Result bi;
    BatchPtr batch = to_batch(r.get(), &bi);
    ASSERT_NE(batch, nullptr);
    const auto [ids, cu, mask] = packed_tokens(bi);
    const auto old = bi.tensor<float>("old_logprobs");
    const std::vector<std::vector<int64_t>> answers = {
        encode(m.get(), "higher\n"), encode(m.get(), "lower\n"), encode(m.get(), "say a number\n")};

    bool some_continued = false;
    for (size_t s = 0; s < 12; ++s) {
        const json &task = task_list[s / 4];
        const std::vector<int64_t> prompt = encode(m.get(), task["prompt"].get<std::string>());
        const int64_t a = cu[s] + static_cast<int64_t>(prompt.size()), b = cu[s + 1];
        ASSERT_EQ(std::vector<int64_t>(ids.begin() + cu[s], ids.begin() + a), prompt);
        ASSERT_GE(turns[s], 1);
        ASSERT_LE(turns[s], 4);
        EXPECT_TRUE(reasons[s] == "done" || reasons[s] == "max_turns") << reasons[s];
        some_continued = some_continued || turns[s] > 1;
        // Walk the sequence: a turn is a run of mask-1 tokens; what follows it
        // (mask 0) is the env's answer, one of its three texts.
        int64_t t = a;
        ASSERT_EQ(spans[s].size(), static_cast<size_t>(turns[s]));
        for (int64_t k = 0; k < turns[s]; ++k) {
            const int64_t start = t;
            EXPECT_EQ(spans[s][k][0].get<int64_t>(), start - a) << "episode " << s << " turn " << k;
            while (t < b && mask[t] == 1.0f) {
                EXPECT_LE(old[t], 0.0f);
                ++t;
            }
            ASSERT_GT(t, start) << "episode " << s << " turn " << k << " is empty";
            EXPECT_EQ(spans[s][k][1].get<int64_t>(), t - a) << "episode " << s << " turn " << k;
            std::vector<int64_t> obs;
            while (t < b && mask[t] == 0.0f) {
                EXPECT_EQ(old[t], 0.0f);
                obs.push_back(ids[t++]);
            }
            if (k + 1 < turns[s]) {
                EXPECT_NE(std::find(answers.begin(), answers.end(), obs), answers.end())
                    << "episode " << s << " turn " << k;
            } else {
                EXPECT_TRUE(obs.empty()) << "nothing follows the last turn";
            }
        }
        EXPECT_EQ(t, b);
        // The rewards: one per turn, summed.
        ASSERT_EQ(turn_rewards[s].size(), static_cast<size_t>(turns[s]));
        double sum = 0;
        for (const auto &x : turn_rewards[s]) sum += x.get<double>();
        EXPECT_DOUBLE_EQ(rewards[s], sum);
    }
    EXPECT_TRUE(some_continued) << "no episode got past its first turn";
}

TEST(Episodes, EnvStepAnswersAndRefusesASingleTurnEnv) {
    InstancePtr env = make_env("guess_number", kGame);
    const std::string task = R"({"prompt": "guess", "answer": "3",
                                 "metadata": {"secret": 3, "lo": 1, "hi": 8}})";
    const auto step = [&](const std::string &state, const std::string &completion, Result &r) {
        return rl_env_step(env.get(), {task.data(), task.size()}, {state.data(), state.size()},
                           {completion.data(), completion.size()}, r.out());
    };
    Result r1;
    RL_ASSERT_OK(step("null", "5\n", r1));
    EXPECT_EQ(r1.scalar("done"), 0);
    EXPECT_EQ(r1.text("observation"), "lower\n");
    EXPECT_EQ(r1.text("role"), "user");
    Result r2;
    RL_ASSERT_OK(step(r1.text("state"), "3", r2));
    EXPECT_EQ(r2.scalar("done"), 1);
    EXPECT_DOUBLE_EQ(r2.scalar("reward"), 0.8); // right on the second guess: 0.8^1

    InstancePtr single = make_env("reverse_text");
    Result r3;
    const std::string t = R"({"prompt": "reverse: ab\n", "answer": "ba"})", c = "ba";
    EXPECT_EQ(rl_env_step(single.get(), {t.data(), t.size()}, {"null", 4}, {c.data(), c.size()},
                          r3.out()),
              RL_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(rl_last_error()).find("env 'reverse_text': this env is single-turn"),
              std::string::npos)
        << rl_last_error();
}

TEST(Episodes, AStepResultThatBreaksTheContractIsNamed) {
    RL_ASSERT_OK(rl_runtime_load_plugin(runtime(), RL_TEST_BAD_STEP_PLUGIN));
    InstancePtr env = make_env("fixture_bad_step");
    const std::string task = R"({"prompt": "p"})";
    const auto step = [&](const std::string &turn) {
        Result r;
        const rl_status_t st = rl_env_step(env.get(), {task.data(), task.size()}, {"null", 4},
                                           {turn.data(), turn.size()}, r.out());
        return std::make_pair(st, st == RL_OK ? std::string() : std::string(rl_last_error()));
    };
    EXPECT_EQ(step("fine").first, RL_OK);
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"not-object", "step() must emit a JSON object as 'state', got: [1]"},
        {"no-done", "step() result has no boolean 'done'"},
        {"bad-reward", "step() result 'reward' is not a number"},
        {"nan-reward", "step() returned a non-finite reward"}, // caught before JSON makes it null
        {"no-observation", "step() result is not done but has no string 'observation'"},
        {"bad-role", "step() result 'role' must be \"user\" or \"tool\""},
        {"number-observation", "step() result 'observation' is not a string"},
    };
    for (const auto &[turn, why] : cases) {
        const auto [st, msg] = step(turn);
        EXPECT_NE(st, RL_OK) << turn;
        EXPECT_NE(msg.find("env 'fixture_bad_step': " + why), std::string::npos)
            << turn << ": " << msg;
    }
}

TEST(Episodes, AFailingStepDropsOnlyItsEpisodeAndScoreIsRefused) {
    ModelPtr m = load_model();
    EnginePtr e = make_engine(m.get());
    InstancePtr env = make_env("guess_number", kGame);
    // The second task has no secret: guess_number's step() fails on it.
    const std::string tasks = R"([{"prompt": "guess a number from 1 to 8\n", "answer": "2",
                                   "metadata": {"secret": 2}},
                                  {"prompt": "guess a number from 1 to 8\n", "answer": "2"}])";
    RolloutsPtr r = episodes(e.get(), env.get(), tasks, kOptions);
    ASSERT_NE(r, nullptr);
    Result info;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), info.out()));
    EXPECT_EQ(info.scalar("episode_errors"), 4);
    const json reasons = json::parse(info.text("finish_reasons"));
    const json errors = json::parse(info.text("errors"));
    const auto masked = info.tensor<uint8_t>("masked");
    for (size_t s = 0; s < 8; ++s) {
        if (s < 4) {
            EXPECT_NE(reasons[s], "error");
            EXPECT_EQ(errors[s], "");
            EXPECT_EQ(masked[s], 0);
        } else {
            EXPECT_EQ(reasons[s], "error");
            EXPECT_NE(errors[s].get<std::string>().find("metadata.secret"), std::string::npos)
                << errors[s];
            EXPECT_EQ(masked[s], 1);
        }
    }
    InstancePtr env2 = make_env("guess_number", kGame);
    EXPECT_EQ(rl_rollouts_score(r.get(), env2.get()), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("multi-turn episodes"), std::string::npos)
        << rl_last_error();
}

TEST(Episodes, AChatTemplateRendersTheObservationAsItsNextMessage) {
    ModelPtr m = load_model();
    EnginePtr e = make_engine(m.get());
    InstancePtr env = make_env("guess_number", kGame);
    const std::string tasks = R"([{"prompt": "guess a number from 1 to 8", "answer": "6",
                                   "metadata": {"secret": 6}}])";
    RolloutsPtr r =
        episodes(e.get(), env.get(), tasks,
                 R"({"chat_template": "chatml", "sampling": {"n": 4, "max_tokens": 3, "seed": 1},
            "max_turns": 2})");
    ASSERT_NE(r, nullptr);
    Result bi;
    BatchPtr batch = to_batch(r.get(), &bi);
    ASSERT_NE(batch, nullptr);
    const auto [ids, cu, mask] = packed_tokens(bi);
    // The tiny model's stop token is not <|im_end|>, so the observation closes
    // the turn as ChatML does, then opens the user message and the next
    // assistant header.
    const auto closing = [&](const std::string &obs) {
        return encode(m.get(), "<|im_end|>\n<|im_start|>user\n" + obs +
                                   "<|im_end|>\n<|im_start|>assistant\n");
    };
    int continued = 0;
    for (size_t s = 0; s + 1 < cu.size(); ++s) {
        std::vector<int64_t> obs;
        bool after_turn = false;
        for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
            if (mask[t] == 1.0f) after_turn = true;
            if (after_turn && mask[t] == 0.0f) obs.push_back(ids[t]);
            if (after_turn && mask[t] == 1.0f && !obs.empty()) break;
        }
        if (obs.empty()) continue; // solved at once
        ++continued;
        EXPECT_TRUE(obs == closing("higher\n") || obs == closing("lower\n") ||
                    obs == closing("say a number\n"))
            << "episode " << s;
    }
    EXPECT_GT(continued, 0);
}

TEST(Episodes, ASupervisedBatchPlaysTheReferenceTurnsAgainstTheEnv) {
    ModelPtr m = load_model();
    InstancePtr env = make_env("guess_number", kGame);
    const json tasks = json::parse(sample_tasks(env.get(), 4));
    Result mi;
    RL_ASSERT_OK(rl_model_info(m.get(), mi.out()));
    const int64_t eos = json::parse(mi.text("info"))["eos_token_ids"][0].get<int64_t>();
    rl_train_batch_t *raw = nullptr;
    RL_ASSERT_OK(rl_train_batch_supervised_episodes(m.get(), env.get(), tasks.dump().c_str(),
                                                    nullptr, &raw));
    BatchPtr batch(raw);
    Result bi;
    RL_ASSERT_OK(rl_train_batch_info(batch.get(), bi.out()));
    const auto [ids, cu, mask] = packed_tokens(bi);
    ASSERT_EQ(cu.size(), 5u);
    for (size_t i = 0; i < 4; ++i) {
        // The expected layout, rebuilt from the reference turns and the game's rules.
        const json &t = tasks[i];
        const int64_t secret = t["metadata"]["secret"].get<int64_t>();
        std::vector<int64_t> want = encode(m.get(), t["prompt"].get<std::string>());
        std::vector<float> want_mask(want.size(), 0.0f);
        const json &turns = t["metadata"]["reference_turns"];
        ASSERT_GE(turns.size(), 1u);
        for (size_t k = 0; k < turns.size(); ++k) {
            const std::string g = turns[k].get<std::string>();
            std::vector<int64_t> turn = encode(m.get(), g + "\n");
            turn.push_back(eos);
            want.insert(want.end(), turn.begin(), turn.end());
            want_mask.insert(want_mask.end(), turn.size(), 1.0f);
            if (k + 1 == turns.size()) {
                EXPECT_TRUE(std::stoll(g) == secret || k + 1 == 4) << "episode " << i;
                break;
            }
            const auto obs = encode(m.get(), std::stoll(g) < secret ? "higher\n" : "lower\n");
            want.insert(want.end(), obs.begin(), obs.end());
            want_mask.insert(want_mask.end(), obs.size(), 0.0f);
        }
        EXPECT_EQ(std::vector<int64_t>(ids.begin() + cu[i], ids.begin() + cu[i + 1]), want)
            << "episode " << i;
        EXPECT_EQ(std::vector<float>(mask.begin() + cu[i], mask.begin() + cu[i + 1]), want_mask)
            << "episode " << i;
    }
    // A task without a reference episode is named.
    const std::string bare = R"([{"prompt": "guess", "answer": "2", "metadata": {"secret": 2}}])";
    EXPECT_EQ(rl_train_batch_supervised_episodes(m.get(), env.get(), bare.c_str(), nullptr, &raw),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("tasks[0] has no reference episode"),
              std::string::npos)
        << rl_last_error();
}

// A Python env through the `command` env's step protocol.
std::string echo_game(double timeout_s) {
    return json{
        {"command",
         {"python3", std::string(RL_TEST_SOURCE_DIR) + "/tests/envs/verifiers/echo_game.py"}},
        {"multi_turn", true},
        {"timeout_s", timeout_s}}
        .dump();
}

TEST(Episodes, APythonEnvPlaysEpisodesOverTheCommandProtocol) {
    ModelPtr m = load_model();
    EnginePtr e = make_engine(m.get());
    InstancePtr env = make_env("command", echo_game(30).c_str());
    const std::string tasks = R"([{"prompt": "say a word\n"}, {"prompt": "say two\n"}])";
    RolloutsPtr r = episodes(e.get(), env.get(), tasks,
                             R"({"sampling": {"n": 2, "max_tokens": 3, "seed": 1}})");
    ASSERT_NE(r, nullptr);
    Result info;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), info.out()));
    EXPECT_EQ(info.tensor<int64_t>("turns"), (std::vector<int64_t>{3, 3, 3, 3}));
    EXPECT_EQ(info.tensor<double>("rewards"), (std::vector<double>{0.75, 0.75, 0.75, 0.75}));
    EXPECT_EQ(json::parse(info.text("finish_reasons")),
              json::parse(R"(["done", "done", "done", "done"])"));
    EXPECT_EQ(info.scalar("env/turn"), 2); // the last step's metrics
}

// "turn_rewards": "tokens": each turn's reward lands on the turn's last token
// as token_rewards; an estimator that reads them (reinforce_pp, discounting
// over the trained tokens) gives every turn its own return; the batch keeps
// its episode rewards (the sums) for the buffer and the logs, and
// compute_advantages consumes token_rewards. One that does not read them
// (grpo) refuses them and the batch is left as it was.
TEST(Episodes, PerTurnRewardsLandOnEachTurnsLastTokenForTheEstimator) {
    ModelPtr m = load_model();
    EnginePtr e = make_engine(m.get());
    InstancePtr env = make_env("command", echo_game(30).c_str());
    const std::string tasks = R"([{"prompt": "go\n", "metadata": {"turn_rewards": [1, 0, 2]}},
                                  {"prompt": "on\n", "metadata": {"turn_rewards": [0, 0.5, 0]}}])";
    RolloutsPtr r = episodes(e.get(), env.get(), tasks,
                             R"({"sampling": {"n": 2, "max_tokens": 3, "seed": 4},
                                 "turn_rewards": "tokens"})");
    ASSERT_NE(r, nullptr);
    Result info;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), info.out()));
    EXPECT_EQ(info.tensor<double>("rewards"), (std::vector<double>{3, 3, 0.5, 0.5}));
    const json spans = json::parse(info.text("turn_spans"));
    const std::vector<std::vector<double>> per_turn = {
        {1, 0, 2}, {1, 0, 2}, {0, 0.5, 0}, {0, 0.5, 0}};

    Result bi;
    BatchPtr batch = to_batch(r.get(), &bi);
    ASSERT_NE(batch, nullptr);
    const auto cu = bi.tensor<int64_t>("cu_seqlens");
    const auto mask = bi.tensor<float>("loss_mask");
    const auto tr = bi.tensor<float>("token_rewards");
    EXPECT_EQ(bi.tensor<double>("rewards"), (std::vector<double>{3, 3, 0.5, 0.5}));
    ASSERT_EQ(tr.size(), mask.size());
    std::vector<double> want(tr.size(), 0.0);
    for (size_t s = 0; s < 4; ++s) {
        const int64_t completion = cu[s + 1] - static_cast<int64_t>(spans[s].back()[1]);
        ASSERT_EQ(spans[s].size(), 3u);
        for (size_t k = 0; k < 3; ++k)
            want[static_cast<size_t>(completion + spans[s][k][1].get<int64_t>() - 1)] =
                per_turn[s][k];
    }
    for (size_t t = 0; t < tr.size(); ++t) EXPECT_EQ(tr[t], want[t]) << "token " << t;

    // grpo reads no token_rewards: refused, the batch unchanged.
    InstancePtr grpo(nullptr);
    {
        rl_instance_t *i = nullptr;
        RL_ASSERT_OK(rl_instance_create(runtime(), "advantage", "grpo", "{}", &i));
        grpo.reset(i);
    }
    EXPECT_EQ(rl_train_batch_compute_advantages(batch.get(), grpo.get(), nullptr),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(
        std::string(rl_last_error()).find("input 'token_rewards' is not used by this estimator"),
        std::string::npos)
        << rl_last_error();
    {
        Result again;
        RL_ASSERT_OK(rl_train_batch_info(batch.get(), again.out()));
        EXPECT_EQ(again.tensor<float>("token_rewards"), tr);
    }

    // reinforce_pp, gamma 0.5, no baseline, no whitening: the discounted
    // return over the trained tokens, each turn's reward where the turn ends.
    rl_instance_t *raw_adv = nullptr;
    RL_ASSERT_OK(rl_instance_create(runtime(), "advantage", "reinforce_pp",
                                    R"({"gamma": 0.5, "whiten": false})", &raw_adv));
    InstancePtr adv(raw_adv);
    RL_ASSERT_OK(rl_train_batch_compute_advantages(batch.get(), adv.get(), nullptr));
    Result after;
    RL_ASSERT_OK(rl_train_batch_info(batch.get(), after.out()));
    const auto a = after.tensor<double>("advantages");
    EXPECT_FALSE(after.has_tensor("token_rewards")) << "consumed by compute_advantages";
    for (size_t s = 0; s < 4; ++s) {
        double g = 0;
        for (int64_t t = cu[s + 1] - 1; t >= cu[s]; --t) {
            if (mask[static_cast<size_t>(t)] == 0.0f) continue;
            g = want[static_cast<size_t>(t)] + 0.5 * g;
            EXPECT_NEAR(a[static_cast<size_t>(t)], g, 1e-6) << "sequence " << s << " token " << t;
        }
    }
    // The first turn's tokens see the later turns' rewards discounted: not the episode sum.
    bool differs = false;
    for (size_t t = 0; t < a.size(); ++t)
        if (mask[t] == 1.0f && std::abs(a[t] - 3.0) > 1e-3 && std::abs(a[t] - 0.5) > 1e-3)
            differs = true;
    EXPECT_TRUE(differs);
}

TEST(Episodes, APythonEnvThatDiesOrHangsMidEpisodeDropsOnlyThatEpisode) {
    ModelPtr m = load_model();
    EnginePtr e = make_engine(m.get());
    InstancePtr env = make_env("command", echo_game(1.0).c_str());
    for (const char *how : {"crash", "hang"}) {
        const json tasks = json::parse(R"([{"prompt": "a\n"},
                                           {"prompt": "b\n", "metadata": {"at": 1}}])");
        json t = tasks;
        t[1]["metadata"]["misbehave"] = how;
        RolloutsPtr r = episodes(e.get(), env.get(), t.dump(),
                                 R"({"sampling": {"n": 1, "max_tokens": 3, "seed": 2}})");
        ASSERT_NE(r, nullptr) << how;
        Result info;
        RL_ASSERT_OK(rl_rollouts_info(r.get(), info.out()));
        const json reasons = json::parse(info.text("finish_reasons"));
        const json errors = json::parse(info.text("errors"));
        EXPECT_EQ(reasons[0], "done") << how;
        EXPECT_EQ(reasons[1], "error") << how;
        EXPECT_EQ(info.scalar("episode_errors"), 1) << how;
        const std::string why = errors[1].get<std::string>();
        EXPECT_NE(why.find("env 'command'"), std::string::npos) << why;
        if (std::string(how) == "hang")
            EXPECT_NE(why.find("timeout_s"), std::string::npos) << why;
        else
            EXPECT_NE(why.find("exit"), std::string::npos) << why;
        EXPECT_EQ(info.tensor<uint8_t>("masked"), (std::vector<uint8_t>{0, 1})) << how;
    }
}

TEST(Episodes, BadOptionsAreRefusedByName) {
    ModelPtr m = load_model();
    EnginePtr e = make_engine(m.get());
    InstancePtr env = make_env("guess_number", kGame);
    const std::string tasks = sample_tasks(env.get(), 1);
    rl_rollouts_t *r = nullptr;
    EXPECT_EQ(
        rl_rollouts_generate_episodes(e.get(), env.get(), tasks.c_str(), R"({"max_turns": 0})", &r),
        RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("options.max_turns must be an integer >= 1"),
              std::string::npos)
        << rl_last_error();
    EXPECT_EQ(
        rl_rollouts_generate_episodes(e.get(), env.get(), tasks.c_str(), R"({"max_turn": 3})", &r),
        RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("unknown option 'max_turn'"), std::string::npos)
        << rl_last_error();
    EXPECT_EQ(rl_rollouts_generate_episodes(e.get(), env.get(), tasks.c_str(),
                                            R"({"turn_rewards": "turn"})", &r),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("options.turn_rewards must be \"episode\""),
              std::string::npos)
        << rl_last_error();
    EXPECT_EQ(r, nullptr);
}

} // namespace
