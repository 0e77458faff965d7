// The typed RL step of abi/rl/step.h on the tiny model: each verb's output is
// checked against what the lower-level calls (rl_engine_generate,
// rl_env_score, rl_filter_check, rl_advantage_compute) give for the same
// input, and the batch layout against the rl_batch_t convention.
#include "train_util.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <memory>

namespace {

using namespace rl_train_test;
using nlohmann::json;

InstancePtr make(const char *kind, const char *name, const char *params = "{}") {
    rl_instance_t *i = nullptr;
    if (rl_instance_create(runtime(), kind, name, params, &i) != RL_OK)
        ADD_FAILURE() << kind << " " << name << ": " << rl_last_error();
    return InstancePtr(i);
}

BufferPtr make_buffer(const char *config) {
    rl_buffer_t *b = nullptr;
    if (rl_buffer_create(config, &b) != RL_OK) ADD_FAILURE() << rl_last_error();
    return BufferPtr(b);
}

// A training batch of `n` rollouts popped from `buf` (null when none is
// ready), with its info in *info.
BatchPtr pop_batch(rl_buffer_t *buf, uint64_t n, Result *info) {
    rl_train_batch_t *raw = nullptr;
    EXPECT_EQ(rl_buffer_pop_train_batch(buf, n, 0, &raw), RL_OK) << rl_last_error();
    BatchPtr batch(raw);
    if (batch) {
        EXPECT_EQ(rl_train_batch_info(batch.get(), info->out()), RL_OK) << rl_last_error();
    }
    return batch;
}

const char *kTasks = R"([{"prompt": "Reverse: abc\n", "answer": "cba"},
                         {"prompt": "Reverse: hello\n", "answer": "olleh"}])";
const char *kOptions =
    R"({"group_offset": 100, "sampling": {"n": 3, "max_tokens": 5, "seed": 11}})";

RolloutsPtr generate(rl_engine_t *e, const char *options = kOptions) {
    rl_rollouts_t *r = nullptr;
    if (rl_rollouts_generate(e, kTasks, options, &r) != RL_OK) ADD_FAILURE() << rl_last_error();
    return RolloutsPtr(r);
}

TEST(Step, GenerateEncodesPromptsAndSamplesLikeTheEngine) {
    ModelPtr m = load_model();
    EnginePtr e = make_engine(m.get());
    RolloutsPtr r = generate(e.get());
    Result info;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), info.out()));
    EXPECT_EQ(info.scalar("rollouts"), 6);
    EXPECT_EQ(info.scalar("groups"), 2);
    EXPECT_EQ(info.tensor<int64_t>("group_ids"),
              (std::vector<int64_t>{100, 100, 100, 101, 101, 101}));
    EXPECT_EQ(info.tensor<int64_t>("prompt_index"), (std::vector<int64_t>{0, 0, 0, 1, 1, 1}));

    // The same prompts and sampling parameters through rl_engine_generate.
    Result g;
    ASSERT_TRUE(engine_generate(m.get(), {"Reverse: abc\n", "Reverse: hello\n"},
                                R"({"n": 3, "max_tokens": 5, "seed": 11})", &g));
    EXPECT_EQ(json::parse(info.text("completions")), json::parse(g.text("completions")));
    std::vector<int64_t> lengths;
    const auto gcu = g.tensor<int64_t>("cu_seqlens");
    for (size_t i = 0; i + 1 < gcu.size(); ++i) lengths.push_back(gcu[i + 1] - gcu[i]);
    EXPECT_EQ(info.tensor<int64_t>("completion_lengths"), lengths);
}

TEST(Step, ScoreFilterAndInfoAgreeWithThePlugins) {
    ModelPtr m = load_model();
    EnginePtr e = make_engine(m.get());
    RolloutsPtr r = generate(e.get());
    InstancePtr env = make("env", "reverse_text");
    RL_ASSERT_OK(rl_rollouts_score(r.get(), env.get()));
    Result info;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), info.out()));
    const auto rewards = info.tensor<double>("rewards");
    const json completions = json::parse(info.text("completions"));
    const json tasks = json::parse(info.text("tasks"));
    double sum = 0, sq = 0;
    for (size_t i = 0; i < rewards.size(); ++i) {
        const std::string task = tasks[i].get<std::string>(),
                          text = completions[i].get<std::string>();
        Result s;
        RL_ASSERT_OK(rl_env_score(env.get(), {task.data(), task.size()}, {text.data(), text.size()},
                                  s.out()));
        EXPECT_EQ(rewards[i], s.scalar("reward")) << i;
        sum += rewards[i];
        sq += rewards[i] * rewards[i];
    }
    const double mean = sum / 6;
    EXPECT_DOUBLE_EQ(info.scalar("reward_mean"), mean);
    EXPECT_DOUBLE_EQ(info.scalar("reward_std"), std::sqrt(std::max(sq / 6 - mean * mean, 0.0)));

    // A filter that flags everything: it masks only when it enforces.
    // (every token has probability > 0, so window 1 flags every rollout)
    InstancePtr report = make("filter", "repetition", R"({"window": 1, "prob_threshold": 0.0})");
    Result f;
    RL_ASSERT_OK(rl_rollouts_filter(r.get(), nullptr, 0, f.out()));
    EXPECT_EQ(f.scalar("flagged"), 0);
    rl_instance_t *filters[] = {report.get()};
    RL_ASSERT_OK(rl_rollouts_filter(r.get(), filters, 1, f.out()));
    EXPECT_EQ(f.scalar("flagged"), 6);
    EXPECT_EQ(f.scalar("flagged.repetition"), 6);
    EXPECT_EQ(f.scalar("masked"), 0); // the filter reports, it does not enforce
    Result after;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), after.out()));
    EXPECT_EQ(json::parse(after.text("flags"))[0], json({"repetition"}));

    // The same filter enforcing (the instance's setting): no token reaches the loss.
    InstancePtr enforcing =
        make("filter", "repetition", R"({"window": 1, "prob_threshold": 0.0, "enforce": true})");
    rl_instance_t *enforced[] = {enforcing.get()};
    RL_ASSERT_OK(rl_rollouts_filter(r.get(), enforced, 1, f.out()));
    EXPECT_EQ(f.scalar("masked"), 6);
    Result bi;
    BatchPtr batch = to_batch(r.get(), &bi);
    ASSERT_NE(batch, nullptr);
    EXPECT_EQ(bi.scalar("loss_tokens"), 0);
}

// Rewards from outside an env plugin (ABI 0.8): they replace the env's, make
// unscored rollouts trainable, keep the env metrics, and a wrong count or a
// non-finite value is refused by name, leaving the rewards as they were.
TEST(Step, SetRewardsReplacesTheRewardsAndRefusesWrongCountsAndNonFiniteValues) {
    ModelPtr m = load_model();
    EnginePtr e = make_engine(m.get());
    RolloutsPtr r = generate(e.get());
    rl_train_batch_t *b = nullptr;
    EXPECT_EQ(rl_rollouts_to_batch(r.get(), &b), RL_ERR_INVALID_ARG) << "not scored yet";
    const std::vector<double> mine{0.5, -1.0, 2.0, 0.0, 0.25, 1.0};
    RL_ASSERT_OK(rl_rollouts_set_rewards(r.get(), mine.data(), mine.size()));
    Result info;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), info.out()));
    EXPECT_EQ(info.tensor<double>("rewards"), mine);
    RL_ASSERT_OK(rl_rollouts_to_batch(r.get(), &b));
    BatchPtr batch(b);

    InstancePtr env = make("env", "reverse_text");
    RL_ASSERT_OK(rl_rollouts_score(r.get(), env.get()));
    Result scored;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), scored.out()));
    std::vector<double> shaped = scored.tensor<double>("rewards");
    for (double &v : shaped) v -= 0.125;
    RL_ASSERT_OK(rl_rollouts_set_rewards(r.get(), shaped.data(), shaped.size()));
    Result after;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), after.out()));
    EXPECT_EQ(after.tensor<double>("rewards"), shaped);
    EXPECT_EQ(after.scalar("env/exact_match"), scored.scalar("env/exact_match"));

    EXPECT_EQ(rl_rollouts_set_rewards(r.get(), shaped.data(), 5), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("got 5 rewards for 6 rollouts"), std::string::npos)
        << rl_last_error();
    std::vector<double> bad = shaped;
    bad[3] = std::nan("");
    EXPECT_EQ(rl_rollouts_set_rewards(r.get(), bad.data(), bad.size()), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("rewards[3] is not finite"), std::string::npos)
        << rl_last_error();
    Result kept;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), kept.out()));
    EXPECT_EQ(kept.tensor<double>("rewards"), shaped) << "a refused call changes nothing";
}

TEST(Step, TheBatchFollowsTheBatchConventionAndTheBufferFiltersOnce) {
    ModelPtr m = load_model();
    EnginePtr e = make_engine(m.get());
    InstancePtr env = make("env", "reverse_text");
    RolloutsPtr r = generate(e.get());
    BufferPtr buf = make_buffer(R"({"group_size": 3, "drop_zero_variance": false})");
    Result res;
    EXPECT_EQ(rl_buffer_push_rollouts(buf.get(), r.get(), res.out()), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("rollout 0 is not scored"), std::string::npos);
    RL_ASSERT_OK(rl_rollouts_score(r.get(), env.get()));
    const bool masked_all = false;
    RL_ASSERT_OK(rl_buffer_push_rollouts(buf.get(), r.get(), res.out()));
    EXPECT_EQ(res.scalar("pushed"), 6);

    rl_train_batch_t *raw = nullptr;
    RL_ASSERT_OK(rl_buffer_pop_train_batch(buf.get(), 7, 0, &raw));
    EXPECT_EQ(raw, nullptr); // only 6 ready: nothing taken
    Result bi;
    BatchPtr batch = pop_batch(buf.get(), 6, &bi);
    ASSERT_NE(batch, nullptr);
    EXPECT_EQ(bi.scalar("groups"), 2);
    EXPECT_EQ(bi.scalar("rollouts"), 6);

    // input_ids = prompt then completion; loss mask 0 on the prompt (and on
    // masked rollouts); old_logprobs = each completion token's sampling logprob.
    Result info;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), info.out()));
    const auto ids = bi.tensor<int64_t>("input_ids");
    const auto cu = bi.tensor<int64_t>("cu_seqlens");
    const auto mask = bi.tensor<float>("loss_mask");
    const auto old = bi.tensor<float>("old_logprobs");
    const auto lengths = info.tensor<int64_t>("completion_lengths");
    ASSERT_EQ(cu.size(), 7u);
    const std::vector<int64_t> prompt0 = encode(m.get(), "Reverse: abc\n");
    for (size_t s = 0; s < 6; ++s) {
        const int64_t p = cu[s + 1] - cu[s] - lengths[s];
        if (s < 3) {
            EXPECT_EQ(p, static_cast<int64_t>(prompt0.size()));
            EXPECT_EQ(std::vector<int64_t>(ids.begin() + cu[s], ids.begin() + cu[s] + p), prompt0);
        }
        for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
            const bool completion = t >= cu[s] + p;
            EXPECT_EQ(mask[t], completion && !masked_all ? 1.0f : 0.0f) << s << " " << t;
            if (completion) {
                EXPECT_LE(old[t], 0.0f);
            } else {
                EXPECT_EQ(old[t], 0.0f);
            }
        }
    }

    // Advantages equal the plugin's on the same inputs.
    InstancePtr grpo = make("advantage", "grpo");
    Result a;
    RL_ASSERT_OK(rl_train_batch_compute_advantages(batch.get(), grpo.get(), a.out()));
    rl_batch_t view{};
    view.struct_size = sizeof(view);
    RL_ASSERT_OK(rl_train_batch_view(batch.get(), &view));
    std::vector<std::string> names;
    for (uint64_t i = 0; i < view.tensors.count; ++i) names.push_back(view.tensors.items[i].name);
    EXPECT_EQ(names, (std::vector<std::string>{"advantages", "loss_mask", "old_logprobs"}));

    // Split: whole groups; sync moves the buffer's version.
    rl_train_batch_t *parts[4] = {nullptr, nullptr, nullptr, nullptr};
    uint64_t n = 0;
    RL_ASSERT_OK(rl_train_batch_split(batch.get(), 4, parts, &n));
    EXPECT_EQ(n, 2u); // two groups
    for (uint64_t i = 0; i < n; ++i) {
        Result pi;
        RL_EXPECT_OK(rl_train_batch_info(parts[i], pi.out()));
        EXPECT_EQ(pi.scalar("groups"), 1);
        EXPECT_EQ(pi.scalar("rollouts"), 3);
        rl_train_batch_destroy(parts[i]);
    }
    Result sync;
    RL_ASSERT_OK(rl_sync_weights(e.get(), buf.get(), sync.out()));
    Result stats;
    RL_ASSERT_OK(rl_buffer_stats(buf.get(), 0, stats.out()));
    EXPECT_EQ(stats.scalar("policy_version"), sync.scalar("policy_version"));
}

// Rollouts sampled at T = 0.7 carry it through the buffer into the batch, and
// the trainer scores the batch at it: the trainer's logprobs equal the
// rollouts' old_logprobs on every completion token (issue 16).
TEST(Step, TheBatchCarriesTheSamplingTemperatureAndTheTrainerScoresAtIt) {
    ModelPtr m = load_model();
    EnginePtr e = make_engine(m.get());
    InstancePtr env = make("env", "reverse_text");
    RolloutsPtr r = generate(
        e.get(), R"({"sampling": {"n": 3, "max_tokens": 6, "seed": 5, "temperature": 0.7}})");
    Result ri;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), ri.out()));
    EXPECT_DOUBLE_EQ(ri.scalar("sampling_temperature"), 0.7);
    RL_ASSERT_OK(rl_rollouts_score(r.get(), env.get()));
    BufferPtr buf = make_buffer(R"({"group_size": 3, "drop_zero_variance": false})");
    Result pushed;
    RL_ASSERT_OK(rl_buffer_push_rollouts(buf.get(), r.get(), pushed.out()));
    Result bi;
    BatchPtr batch = pop_batch(buf.get(), 6, &bi);
    ASSERT_NE(batch, nullptr);
    EXPECT_DOUBLE_EQ(bi.scalar("sampling_temperature"), 0.7);

    rl_batch_t view{};
    view.struct_size = sizeof(view);
    RL_ASSERT_OK(rl_train_batch_view(batch.get(), &view));
    EXPECT_EQ(view.flags, static_cast<uint32_t>(RL_BATCH_HAS_SAMPLING_TEMPERATURE));
    EXPECT_DOUBLE_EQ(view.sampling_temperature, 0.7);
    TrainerPtr t = make_trainer(m.get(), "{}");
    Result f;
    RL_ASSERT_OK(rl_trainer_forward(t.get(), &view, nullptr, f.out()));
    EXPECT_DOUBLE_EQ(f.scalar("logprob_temperature"), 0.7);
    const auto lp = f.tensor<float>("logprobs");
    const auto old = bi.tensor<float>("old_logprobs");
    const auto mask = bi.tensor<float>("loss_mask");
    double worst = 0;
    int64_t n = 0;
    for (size_t i = 0; i < lp.size(); ++i)
        if (mask[i] != 0) {
            worst = std::max(worst, std::fabs(double(lp[i]) - old[i]));
            ++n;
        }
    EXPECT_GT(n, 0);
    EXPECT_LT(worst, 2e-5);

    // Split parts keep the temperature; a view of the 0.1 layout has no room for it.
    rl_train_batch_t *parts[2] = {nullptr, nullptr};
    uint64_t k = 0;
    RL_ASSERT_OK(rl_train_batch_split(batch.get(), 2, parts, &k));
    for (uint64_t i = 0; i < k; ++i) {
        Result pi;
        RL_EXPECT_OK(rl_train_batch_info(parts[i], pi.out()));
        EXPECT_DOUBLE_EQ(pi.scalar("sampling_temperature"), 0.7);
        rl_train_batch_destroy(parts[i]);
    }
    rl_batch_t small{};
    small.struct_size = RL_SIZE_THROUGH(rl_batch_t, tensors);
    RL_ASSERT_OK(rl_train_batch_view(batch.get(), &small));
    EXPECT_EQ(small.flags, 0u);
}

TEST(Step, RolloutsSampledAtDifferentTemperaturesDoNotShareABatch) {
    BufferPtr buf = make_buffer(R"({"group_size": 2, "drop_zero_variance": false})");
    std::vector<int64_t> ids = {1, 2, 3};
    const int64_t n = 3;
    rl_tensor_arg_t arg{"token_ids", view_of(ids.data(), &n, kI64)};
    const rl_tensor_list_t list{&arg, 1};
    RL_ASSERT_OK(rl_buffer_push(
        buf.get(), R"({"group_id": 1, "reward": 1, "sampling_temperature": 0.7})", &list));
    RL_ASSERT_OK(rl_buffer_push(
        buf.get(), R"({"group_id": 1, "reward": 0, "sampling_temperature": 1.0})", &list));
    rl_train_batch_t *raw = nullptr;
    EXPECT_EQ(rl_buffer_pop_train_batch(buf.get(), 2, 0, &raw), RL_ERR_BAD_STATE);
    EXPECT_NE(std::string(rl_last_error()).find("different temperatures (0.7 and 1.0"),
              std::string::npos)
        << rl_last_error();
    EXPECT_EQ(rl_buffer_push(buf.get(),
                             R"({"group_id": 2, "reward": 0, "sampling_temperature": -1})", &list),
              RL_ERR_INVALID_ARG);
}

TEST(Step, BadInputsAreRefusedByName) {
    ModelPtr m = load_model();
    EnginePtr e = make_engine(m.get());
    rl_rollouts_t *r = nullptr;
    EXPECT_EQ(rl_rollouts_generate(e.get(), "[]", nullptr, &r), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("non-empty JSON array"), std::string::npos);
    EXPECT_EQ(rl_rollouts_generate(e.get(), R"([{"question": "x"}])", nullptr, &r),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("tasks[0] has no string 'prompt'"),
              std::string::npos);
    EXPECT_EQ(rl_rollouts_generate(e.get(), kTasks, R"({"temperature": 0.5})", &r),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("unknown option 'temperature'"), std::string::npos);
    EXPECT_EQ(r, nullptr);
    RolloutsPtr ok = generate(e.get());
    InstancePtr loss = make("loss", "policy_loss");
    EXPECT_NE(rl_rollouts_score(ok.get(), loss.get()), RL_OK);
    EXPECT_NE(std::string(rl_last_error()).find("is not a env plugin"), std::string::npos)
        << rl_last_error();
    rl_train_batch_t *b = nullptr;
    EXPECT_EQ(rl_rollouts_to_batch(ok.get(), &b), RL_ERR_INVALID_ARG);
    InstancePtr env = make("env", "reverse_text");
    RL_ASSERT_OK(rl_rollouts_score(ok.get(), env.get()));
    RL_ASSERT_OK(rl_rollouts_to_batch(ok.get(), &b));
    BatchPtr batch(b);
    const std::vector<float> short_t(3, 0.0f);
    const int64_t three = 3;
    const rl_tensor_view_t v = view_of(short_t.data(), &three, {RL_DTYPE_FLOAT, 32, 1});
    EXPECT_EQ(rl_train_batch_set_tensor(batch.get(), "ref_logprobs", &v), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("must hold one value per token"),
              std::string::npos);
}

} // namespace
