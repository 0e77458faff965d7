// The co-located rollout engine through the C API: determinism, stop tokens
// and strings, max_tokens, finish reasons, n samples per prompt, greedy
// decoding, logprobs against the trainer, waves, sleep / wake_up, bad input.
#include "train_util.hpp"

#include <nlohmann/json.hpp>

using namespace rl_train_test;
using nlohmann::json;

namespace {

struct Gen {
    std::vector<int64_t> tokens, cu, prompt_index;
    std::vector<float> logprobs;
    std::vector<std::string> texts, reasons;
    double version = -1;
    std::vector<int64_t> sample(size_t s) const {
        return std::vector<int64_t>(tokens.begin() + cu[s], tokens.begin() + cu[s + 1]);
    }
    size_t samples() const { return cu.size() - 1; }
};

class Prompts {
public:
    explicit Prompts(const std::vector<std::vector<int64_t>> &ps) : ps_(ps) {
        cu_.push_back(0);
        for (const auto &p : ps) {
            ids_.insert(ids_.end(), p.begin(), p.end());
            cu_.push_back(static_cast<int64_t>(ids_.size()));
        }
        n_ids_ = static_cast<int64_t>(ids_.size());
        n_cu_ = static_cast<int64_t>(cu_.size());
        ids_v_ = view_of(ids_.data(), &n_ids_, kI64);
        cu_v_ = view_of(cu_.data(), &n_cu_, kI64);
    }
    const rl_tensor_view_t *ids() const { return &ids_v_; }
    const rl_tensor_view_t *cu() const { return &cu_v_; }
    const std::vector<int64_t> &operator[](size_t i) const { return ps_[i]; }

private:
    std::vector<std::vector<int64_t>> ps_;
    std::vector<int64_t> ids_, cu_;
    int64_t n_ids_ = 0, n_cu_ = 0;
    rl_tensor_view_t ids_v_{}, cu_v_{};
};

Gen generate(rl_engine_t *e, const Prompts &p, const std::string &params) {
    Result r;
    Gen g;
    if (rl_engine_generate(e, p.ids(), p.cu(), params.c_str(), r.out()) != RL_OK) {
        ADD_FAILURE() << rl_last_error();
        return g;
    }
    g.tokens = r.tensor<int64_t>("token_ids");
    g.cu = r.tensor<int64_t>("cu_seqlens");
    g.prompt_index = r.tensor<int64_t>("prompt_index");
    g.logprobs = r.tensor<float>("logprobs");
    g.texts = json::parse(r.text("completions")).get<std::vector<std::string>>();
    g.reasons = json::parse(r.text("finish_reasons")).get<std::vector<std::string>>();
    g.version = r.scalar("policy_version");
    return g;
}

// One training sequence per sample: its prompt, then its completion.
Batch prompts_and_samples(const Prompts &p, const Gen &g) {
    Batch b;
    for (size_t s = 0; s < g.samples(); ++s) {
        std::vector<int64_t> seq = p[g.prompt_index[s]];
        const auto c = g.sample(s);
        seq.insert(seq.end(), c.begin(), c.end());
        b.add(seq);
    }
    return b;
}

std::string decode(rl_model_t *m, const std::vector<int64_t> &ids) {
    Result r;
    if (rl_tokenizer_decode(m, ids.data(), ids.size(), r.out()) != RL_OK) {
        ADD_FAILURE() << rl_last_error();
        return {};
    }
    return r.text("text");
}

class EngineTest : public ::testing::Test {
protected:
    void SetUp() override {
        model = load_model();
        engine = make_engine(model.get());
        prompts = std::make_unique<Prompts>(std::vector<std::vector<int64_t>>{
            encode(model.get(), "Reverse: abc\n"), encode(model.get(), "Hi"),
            encode(model.get(), "Count: 1 2 3")});
    }
    ModelPtr model;
    EnginePtr engine;
    std::unique_ptr<Prompts> prompts;
};

} // namespace

TEST_F(EngineTest, SameSeedGivesTheSameSamplesAndAnotherSeedDoesNot) {
    const Gen a = generate(engine.get(), *prompts, R"({"n": 2, "seed": 7, "max_tokens": 10})");
    const Gen b = generate(engine.get(), *prompts, R"({"n": 2, "seed": 7, "max_tokens": 10})");
    const Gen c = generate(engine.get(), *prompts, R"({"n": 2, "seed": 8, "max_tokens": 10})");
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.logprobs, b.logprobs);
    EXPECT_EQ(a.texts, b.texts);
    EXPECT_NE(a.tokens, c.tokens);
    // Without a seed, calls draw from the policy's stream: two calls differ.
    const Gen d = generate(engine.get(), *prompts, R"({"n": 2, "max_tokens": 10})");
    const Gen e = generate(engine.get(), *prompts, R"({"n": 2, "max_tokens": 10})");
    EXPECT_NE(d.tokens, e.tokens);
}

TEST_F(EngineTest, NSamplesPerPromptComePromptMajorAndDiffer) {
    const Gen g = generate(engine.get(), *prompts, R"({"n": 4, "seed": 1, "max_tokens": 8})");
    ASSERT_EQ(g.samples(), 12u);
    EXPECT_EQ(g.prompt_index, (std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}));
    EXPECT_EQ(g.texts.size(), 12u);
    EXPECT_EQ(g.reasons.size(), 12u);
    EXPECT_EQ(g.logprobs.size(), g.tokens.size());
    EXPECT_NE(g.sample(0), g.sample(1));
    EXPECT_EQ(g.version, 0);
}

TEST_F(EngineTest, MaxTokensEndsEverySampleWithFinishReasonLength) {
    const Gen g = generate(engine.get(), *prompts,
                           R"({"n": 2, "seed": 3, "max_tokens": 5, "stop_token_ids": []})");
    for (size_t s = 0; s < g.samples(); ++s) {
        EXPECT_EQ(g.sample(s).size(), 5u);
        EXPECT_EQ(g.reasons[s], "length");
        EXPECT_EQ(g.texts[s], decode(model.get(), g.sample(s)));
    }
}

TEST_F(EngineTest, TopK1IsGreedyWhateverTheSeedAndReportsLogprobZero) {
    const Gen a = generate(engine.get(), *prompts,
                           R"({"top_k": 1, "seed": 1, "max_tokens": 8, "stop_token_ids": []})");
    const Gen b = generate(engine.get(), *prompts,
                           R"({"top_k": 1, "seed": 2, "max_tokens": 8, "stop_token_ids": []})");
    const Gen c = generate(engine.get(), *prompts,
                           R"({"temperature": 0, "max_tokens": 8, "stop_token_ids": []})");
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.tokens, c.tokens);
    for (float lp : a.logprobs) EXPECT_EQ(lp, 0.0f);
    // Greedy picks the most likely token: every other seed's first token is at most as likely.
    TrainerPtr t = make_trainer(model.get(), "{}");
    auto first_token_logprob = [&](const Gen &g, size_t s) {
        Batch b;
        std::vector<int64_t> seq = (*prompts)[g.prompt_index[s]];
        seq.push_back(g.sample(s)[0]);
        b.add(seq);
        Result r;
        EXPECT_EQ(rl_trainer_forward(t.get(), b.view(), nullptr, r.out()), RL_OK);
        return r.tensor<float>("logprobs").back();
    };
    const Gen sampled = generate(engine.get(), *prompts, R"({"n": 8, "seed": 5, "max_tokens": 1})");
    for (size_t s = 0; s < sampled.samples(); ++s)
        EXPECT_LE(first_token_logprob(sampled, s),
                  first_token_logprob(a, static_cast<size_t>(sampled.prompt_index[s])) + 1e-6);
}

TEST_F(EngineTest, StopTokenEndsTheSampleKeepsTheTokenAndDropsItsText) {
    const Gen greedy = generate(engine.get(), *prompts,
                                R"({"temperature": 0, "max_tokens": 6, "stop_token_ids": []})");
    const std::vector<int64_t> s0 = greedy.sample(0);
    // Stop at the greedy third token of prompt 0.
    const std::string params =
        R"({"temperature": 0, "max_tokens": 6, "stop_token_ids": [)" + std::to_string(s0[2]) + "]}";
    const Gen g = generate(engine.get(), *prompts, params);
    const std::vector<int64_t> got = g.sample(0);
    size_t first_hit = 0;
    while (s0[first_hit] != s0[2]) ++first_hit;
    EXPECT_EQ(got, std::vector<int64_t>(s0.begin(), s0.begin() + first_hit + 1));
    EXPECT_EQ(g.reasons[0], "stop");
    EXPECT_EQ(g.texts[0],
              decode(model.get(), std::vector<int64_t>(s0.begin(), s0.begin() + first_hit)));
}

TEST_F(EngineTest, TheModelsEosStopsByDefault) {
    Result info;
    RL_ASSERT_OK(rl_model_info(model.get(), info.out()));
    const auto eos = json::parse(info.text("info"))["eos_token_ids"].get<std::vector<int64_t>>();
    ASSERT_FALSE(eos.empty());
    const Gen g = generate(engine.get(), *prompts, R"({"n": 16, "seed": 4, "max_tokens": 24})");
    for (size_t s = 0; s < g.samples(); ++s) {
        const auto toks = g.sample(s);
        for (size_t i = 0; i + 1 < toks.size(); ++i)
            EXPECT_EQ(std::count(eos.begin(), eos.end(), toks[i]), 0) << "EOS before the end";
        const bool ended_by_eos = std::count(eos.begin(), eos.end(), toks.back()) > 0;
        EXPECT_EQ(g.reasons[s], ended_by_eos ? "stop" : "length");
        if (!ended_by_eos) {
            EXPECT_EQ(toks.size(), 24u);
        }
    }
}

TEST_F(EngineTest, StopStringIsCutFromTheTextAndEndsTheSample) {
    const Gen greedy = generate(engine.get(), *prompts,
                                R"({"temperature": 0, "max_tokens": 12, "stop_token_ids": []})");
    const std::string text = greedy.texts[1];
    // A single ASCII character of the greedy text (past its first byte) as the stop string.
    size_t at = 1;
    while (at < text.size() / 2 && static_cast<unsigned char>(text[at]) >= 0x80) ++at;
    ASSERT_LT(at, text.size() / 2) << "no ASCII character in the greedy text";
    const std::string stop = text.substr(at, 1);
    const json params = {{"temperature", 0},
                         {"max_tokens", 12},
                         {"stop_token_ids", json::array()},
                         {"stop", {stop, "\x01never\x02"}}};
    const Gen g = generate(engine.get(), *prompts, params.dump());
    EXPECT_EQ(g.reasons[1], "stop");
    EXPECT_EQ(g.texts[1], text.substr(0, text.find(stop)));
    const std::vector<int64_t> cut = g.sample(1), full = greedy.sample(1);
    EXPECT_LT(cut.size(), full.size());
    EXPECT_EQ(cut, std::vector<int64_t>(full.begin(), full.begin() + cut.size()));
}

TEST_F(EngineTest, LogprobsMatchTheTrainersRecomputation) {
    TrainerPtr t = make_trainer(model.get(), "{}");
    const Gen g = generate(engine.get(), *prompts, R"({"n": 3, "seed": 9, "max_tokens": 10})");
    Batch b = prompts_and_samples(*prompts, g);
    Result r;
    RL_ASSERT_OK(rl_trainer_forward(t.get(), b.view(), nullptr, r.out()));
    const auto lp = r.tensor<float>("logprobs");
    std::vector<float> scored;
    for (size_t s = 0; s < g.samples(); ++s) {
        const int64_t plen = static_cast<int64_t>((*prompts)[g.prompt_index[s]].size());
        for (int64_t t2 = b.cu[s] + plen; t2 < b.cu[s + 1]; ++t2) scored.push_back(lp[t2]);
    }
    EXPECT_LT(max_abs_diff(g.logprobs, scored), 2e-5);

    // With top-k the sampling distribution is renormalized over k tokens: each
    // reported logprob is at least the full-distribution one.
    const Gen k = generate(engine.get(), *prompts,
                           R"({"n": 3, "seed": 9, "max_tokens": 10, "top_k": 20, "top_p": 0.9})");
    Batch kb = prompts_and_samples(*prompts, k);
    Result kr;
    RL_ASSERT_OK(rl_trainer_forward(t.get(), kb.view(), nullptr, kr.out()));
    const auto klp = kr.tensor<float>("logprobs");
    size_t i = 0;
    double gap = 0;
    for (size_t s = 0; s < k.samples(); ++s) {
        const int64_t plen = static_cast<int64_t>((*prompts)[k.prompt_index[s]].size());
        for (int64_t t2 = kb.cu[s] + plen; t2 < kb.cu[s + 1]; ++t2, ++i) {
            EXPECT_GE(k.logprobs[i], klp[t2] - 1e-5);
            gap = std::max(gap, double(k.logprobs[i]) - klp[t2]);
        }
    }
    EXPECT_GT(gap, 0.1); // the filtering is visible
}

// Temperature-consistent logprobs (issue 16): the engine reports log-probs of
// the tempered distribution it sampled from; a batch that carries the sampling
// temperature is scored by the trainer at it, so old and new logprobs agree.
// Scored at temperature 1 (the temperature ignored) they disagree by far more.
TEST_F(EngineTest, TrainerLogprobsAgreeWithTheEngineAtTheSamplingTemperature) {
    TrainerPtr t = make_trainer(model.get(), "{}");
    const Gen g = generate(engine.get(), *prompts,
                           R"({"n": 3, "seed": 9, "max_tokens": 10, "temperature": 0.7})");
    Batch b = prompts_and_samples(*prompts, g);
    auto completion_logprobs = [&](const std::vector<float> &lp) {
        std::vector<float> out;
        for (size_t s = 0; s < g.samples(); ++s) {
            const int64_t plen = static_cast<int64_t>((*prompts)[g.prompt_index[s]].size());
            for (int64_t t2 = b.cu[s] + plen; t2 < b.cu[s + 1]; ++t2) out.push_back(lp[t2]);
        }
        return out;
    };

    b.sampling_temperature = 0.7;
    Result r;
    RL_ASSERT_OK(rl_trainer_forward(t.get(), b.view(), nullptr, r.out()));
    EXPECT_DOUBLE_EQ(r.scalar("logprob_temperature"), 0.7);
    EXPECT_LT(max_abs_diff(g.logprobs, completion_logprobs(r.tensor<float>("logprobs"))), 2e-5);

    // The same through trainer.logprob_temperature, with a batch that carries none.
    TrainerPtr t07 = make_trainer(model.get(), R"({"logprob_temperature": 0.7})");
    b.sampling_temperature = -1;
    Result r07;
    RL_ASSERT_OK(rl_trainer_forward(t07.get(), b.view(), nullptr, r07.out()));
    EXPECT_LT(max_abs_diff(g.logprobs, completion_logprobs(r07.tensor<float>("logprobs"))), 2e-5);

    // Ignoring the temperature (scoring at 1) is visibly wrong: this test
    // would fail without the fix.
    Result r1;
    RL_ASSERT_OK(rl_trainer_forward(t.get(), b.view(), nullptr, r1.out()));
    EXPECT_DOUBLE_EQ(r1.scalar("logprob_temperature"), 1.0);
    EXPECT_GT(max_abs_diff(g.logprobs, completion_logprobs(r1.tensor<float>("logprobs"))), 0.05);

    // Entropy is the tempered distribution's too: sharper at 0.7 than at 1.
    const auto e07 = r.tensor<float>("entropy"), e1 = r1.tensor<float>("entropy");
    double s07 = 0, s1 = 0;
    for (size_t i = 0; i < e07.size(); ++i) {
        s07 += e07[i];
        s1 += e1[i];
    }
    EXPECT_LT(s07, s1);
}

TEST_F(EngineTest, AnExplicitLogprobTemperatureThatDiffersFromTheBatchsIsRefused) {
    TrainerPtr t = make_trainer(model.get(), R"({"logprob_temperature": 1.0})");
    Batch b;
    b.add((*prompts)[0]);
    b.sampling_temperature = 0.7;
    Result r;
    EXPECT_EQ(rl_trainer_forward(t.get(), b.view(), nullptr, r.out()), RL_ERR_INVALID_ARG);
    const std::string why = rl_last_error();
    EXPECT_NE(why.find("trainer.logprob_temperature is 1"), std::string::npos) << why;
    EXPECT_NE(why.find("sampled at temperature 0.7"), std::string::npos) << why;

    // A greedy batch (temperature 0) has no tempered distribution: scored at
    // logprob_temperature (here 1) with a warning, not refused.
    b.sampling_temperature = 0;
    Result g;
    RL_ASSERT_OK(rl_trainer_forward(t.get(), b.view(), nullptr, g.out()));
    EXPECT_DOUBLE_EQ(g.scalar("logprob_temperature"), 1.0);

    // A caller of the 0.1 layout (struct_size without the temperature fields).
    b.sampling_temperature = 0.7;
    rl_batch_t old = *b.view();
    old.struct_size = RL_SIZE_THROUGH(rl_batch_t, tensors);
    Result o;
    RL_ASSERT_OK(rl_trainer_forward(t.get(), &old, nullptr, o.out()));
    EXPECT_DOUBLE_EQ(o.scalar("logprob_temperature"), 1.0);
}

TEST_F(EngineTest, WavesGiveTheSameSamplesAsOneBatch) {
    EnginePtr small = make_engine(model.get(), R"({"max_batch_sequences": 3})");
    const char *params = R"({"n": 4, "seed": 21, "max_tokens": 9})";
    const Gen a = generate(engine.get(), *prompts, params);
    const Gen b = generate(small.get(), *prompts, params);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_LT(max_abs_diff(a.logprobs, b.logprobs), 1e-5);
    EXPECT_EQ(a.reasons, b.reasons);
}

TEST_F(EngineTest, SleepRefusesGenerationAndWakeUpRestoresIt) {
    const char *params = R"({"n": 2, "seed": 2, "max_tokens": 6})";
    const Gen a = generate(engine.get(), *prompts, params);
    RL_ASSERT_OK(rl_engine_sleep(engine.get()));
    Result r;
    EXPECT_EQ(rl_engine_generate(engine.get(), prompts->ids(), prompts->cu(), params, r.out()),
              RL_ERR_BAD_STATE);
    EXPECT_NE(std::string(rl_last_error()).find("asleep"), std::string::npos);
    RL_ASSERT_OK(rl_engine_wake_up(engine.get()));
    const Gen b = generate(engine.get(), *prompts, params);
    EXPECT_EQ(a.tokens, b.tokens);
}

TEST_F(EngineTest, BadParametersAndPromptsAreNamed) {
    Result r;
    auto expect_error = [&](const char *params, const std::string &needle) {
        EXPECT_EQ(rl_engine_generate(engine.get(), prompts->ids(), prompts->cu(), params, r.out()),
                  RL_ERR_INVALID_ARG)
            << params;
        EXPECT_NE(std::string(rl_last_error()).find(needle), std::string::npos)
            << params << " -> " << rl_last_error();
    };
    expect_error(R"({"temprature": 1})", "'temprature'");
    expect_error(R"({"top_p": 0})", "top_p");
    expect_error(R"({"n": 0})", "n must be");
    expect_error(R"({"max_tokens": -1})", "max_tokens");
    expect_error(R"({"stop_token_ids": [999]})", "stop_token_ids[0]");
    expect_error(R"({"stop": [""]})", "stop[0]");

    Prompts bad({{65, 66}, {65, 400}});
    EXPECT_EQ(rl_engine_generate(engine.get(), bad.ids(), bad.cu(), nullptr, r.out()),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("prompt 1 token 1 = 400"), std::string::npos)
        << rl_last_error();
    const int64_t ids[2] = {65, 66}, n = 2, cu[3] = {0, 0, 2}, ncu = 3;
    const rl_tensor_view_t iv = view_of(ids, &n, kI64), cv = view_of(cu, &ncu, kI64);
    EXPECT_EQ(rl_engine_generate(engine.get(), &iv, &cv, nullptr, r.out()), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("prompt 0 is empty"), std::string::npos)
        << rl_last_error();
}
