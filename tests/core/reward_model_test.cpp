// Reward models: ...ForSequenceClassification folders load with their score
// head, score each sequence at the token transformers pools (the last one
// that is not the pad token), run through a forward-only trainer, and refuse
// what they cannot do (generate, train, a missing head). The comparison with
// transformers itself is tests/core/test_reward_model_hf.py.
#include "rl/core/config.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/pretrained.hpp"
#include "rl/core/tiny.hpp"
#include "rl/core/trainer.hpp"
#include "test_util.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

namespace rl::core {
namespace {

using nlohmann::json;

std::string reward_config(const std::string &cls, const json &extra) {
    json j = json::parse(tiny_config_json());
    j["architectures"] = json::array({cls});
    for (const auto &[k, v] : extra.items()) j[k] = v;
    return j.dump();
}

TEST(RewardModelConfig, ReadsTheClassifierClassAndItsLabels) {
    const ModelConfig a = ModelConfig::parse(
        reward_config("Qwen3ForSequenceClassification",
                      {{"id2label", {{"0", "bad"}, {"1", "ok"}, {"2", "good"}}}}));
    EXPECT_TRUE(a.is_classifier());
    EXPECT_EQ(a.architecture, Architecture::Qwen3);
    EXPECT_EQ(a.num_labels, 3);
    EXPECT_EQ(a.class_name(), "Qwen3ForSequenceClassification");

    // "num_labels" wins over id2label; neither: transformers' default of 2.
    EXPECT_EQ(ModelConfig::parse(reward_config("Qwen3ForSequenceClassification",
                                               {{"num_labels", 1}, {"id2label", {{"0", "x"}}}}))
                  .num_labels,
              1);
    EXPECT_EQ(ModelConfig::parse(reward_config("Qwen3ForSequenceClassification", json::object()))
                  .num_labels,
              2);
    const ModelConfig lm = ModelConfig::parse(tiny_config_json());
    EXPECT_FALSE(lm.is_classifier());
    EXPECT_EQ(lm.num_labels, 0);
    EXPECT_EQ(lm.class_name(), "Qwen3ForCausalLM");

    // A config written from code keeps the class and the labels.
    ModelConfig copy = a;
    copy.json.clear();
    const ModelConfig back = ModelConfig::parse(copy.to_json());
    EXPECT_EQ(back.class_name(), "Qwen3ForSequenceClassification");
    EXPECT_EQ(back.num_labels, 3);
}

TEST(RewardModelConfig, NamesWhatIsWrong) {
    std::string e = test::error_of([] {
        ModelConfig::parse(reward_config("MistralForSequenceClassification", json::object()),
                           "rm/config.json");
    });
    EXPECT_NE(e.find("rm/config.json: 'architectures' = 'MistralForSequenceClassification' is "
                     "not supported"),
              std::string::npos)
        << e;
    e = test::error_of([] {
        ModelConfig::parse(
            reward_config("Qwen3ForSequenceClassification", {{"id2label", json::array()}}),
            "rm/config.json");
    });
    EXPECT_NE(e.find("'id2label' must be a non-empty object"), std::string::npos) << e;
    e = test::error_of([] {
        ModelConfig::parse(reward_config("Qwen3ForSequenceClassification", {{"num_labels", 0}}),
                           "rm/config.json");
    });
    EXPECT_NE(e.find("'num_labels' must be >= 1"), std::string::npos) << e;
    e = test::error_of([] {
        ModelConfig::parse(
            reward_config("Qwen2ForSequenceClassification", {{"model_type", "qwen3"}}),
            "rm/config.json");
    });
    EXPECT_NE(e.find("but architectures says Qwen2ForSequenceClassification"), std::string::npos)
        << e;
}

class RewardModel : public ::testing::Test {
protected:
    void SetUp() override {
        TinyModelSpec spec;
        spec.num_labels = 2;
        write_tiny_model(dir_.path(), 11, spec);
        policy_ = Policy::load(dir_.path());
        // The init's score head is small; scale it so scores differ clearly.
        at::NoGradGuard g;
        policy_->model().score->weight.mul_(30.0);
    }
    test::TempDir dir_;
    std::shared_ptr<Policy> policy_;
};

// Three sequences: plain, ending in pad tokens, and all pad.
const std::vector<std::vector<int64_t>> kSeqs = {
    {kTinyImStart, 'a', 'b', 'c', kTinyImEnd, '\n'},
    {kTinyImStart, 'x', 'y', kTinyImEnd, kTinyEndOfText, kTinyEndOfText},
    {kTinyEndOfText, kTinyEndOfText, kTinyEndOfText},
};

TEST_F(RewardModel, ScoresEachSequenceAtItsLastTokenThatIsNotPad) {
    CausalLM &m = policy_->model();
    ASSERT_TRUE(m.config().is_classifier());
    ASSERT_EQ(m.config().pad_token_id.value_or(-1), kTinyEndOfText);
    EXPECT_EQ(m.lm_head, nullptr);
    const at::Tensor scores = m.sequence_scores(PackedBatch::from_sequences(kSeqs));
    ASSERT_EQ(scores.sizes(), (at::IntArrayRef{3, 2}));
    EXPECT_EQ(scores.scalar_type(), at::kFloat);
    // Each sequence alone, pooled by hand: score . h at the position transformers takes.
    const std::vector<int64_t> pooled = {5, 3, 0};
    for (size_t s = 0; s < kSeqs.size(); ++s) {
        const at::Tensor h = m.hidden_states(PackedBatch::from_sequences({kSeqs[s]}));
        const at::Tensor want = at::matmul(m.score->weight, h[pooled[s]]);
        EXPECT_TRUE(at::allclose(scores[static_cast<int64_t>(s)], want, 1e-5, 1e-5))
            << "sequence " << s << ": " << scores[static_cast<int64_t>(s)] << " vs " << want;
    }
    // The pooled position matters: the plain sequence's scores differ from
    // those at its second-to-last token.
    const at::Tensor h0 = m.hidden_states(PackedBatch::from_sequences({kSeqs[0]}));
    EXPECT_FALSE(at::allclose(scores[0], at::matmul(m.score->weight, h0[4]), 1e-3, 1e-3));
}

TEST_F(RewardModel, ForwardOnlyTrainerReturnsScoresOverMicroBatches) {
    TrainerConfig tc;
    tc.forward_only = true;
    tc.packing.micro_batch_tokens = 6; // one sequence per micro-batch
    tc.packing.sample_packing_sequence_len = 6;
    Trainer trainer(policy_, tc);
    TrainBatch b;
    std::vector<int64_t> ids;
    b.cu_seqlens = {0};
    for (const auto &s : kSeqs) {
        ids.insert(ids.end(), s.begin(), s.end());
        b.cu_seqlens.push_back(static_cast<int64_t>(ids.size()));
    }
    b.input_ids = at::tensor(ids, at::kLong);
    const StepResult r = trainer.forward(b, nullptr);
    EXPECT_GE(r.micro_batches, 2);
    ASSERT_TRUE(r.tensors.count("scores"));
    EXPECT_EQ(r.tensors.count("logprobs"), 0u);
    const at::Tensor want = policy_->model().sequence_scores(PackedBatch::from_sequences(kSeqs));
    EXPECT_TRUE(at::allclose(r.tensors.at("scores"), want, 1e-5, 1e-5))
        << r.tensors.at("scores") << " vs " << want;

    LossFunction any;
    any.name = "any";
    std::string e = test::error_of([&] { trainer.forward(b, &any); });
    EXPECT_NE(e.find("call forward without a loss"), std::string::npos) << e;
}

TEST_F(RewardModel, IsNeitherTrainedNorAskedForTokenLogprobs) {
    std::string e = test::error_of([&] { Trainer t(policy_, TrainerConfig{}); });
    EXPECT_NE(e.find("Qwen3ForSequenceClassification (a reward model)"), std::string::npos) << e;
    EXPECT_NE(e.find("trainer.forward_only"), std::string::npos) << e;
    e = test::error_of([&] {
        policy_->model().token_logprobs(PackedBatch::from_sequences({kSeqs[0]}),
                                        at::zeros({6}, at::kLong));
    });
    EXPECT_NE(e.find("has no language-model head"), std::string::npos) << e;
    // And a causal LM gives no sequence scores.
    test::TempDir lm_dir;
    write_tiny_model(lm_dir.path(), 1);
    auto lm = load_pretrained(lm_dir.path());
    e = test::error_of([&] { lm->sequence_scores(PackedBatch::from_sequences({kSeqs[0]})); });
    EXPECT_NE(e.find("Qwen3ForCausalLM is a causal language model"), std::string::npos) << e;
}

TEST(RewardModelFolder, WithoutAScoreHeadIsRefusedNamingTheTensor) {
    // A causal LM folder whose config was edited to a classifier: no score head.
    test::TempDir dir;
    write_tiny_model(dir.path(), 2);
    json j = json::parse(test::slurp(dir / "config.json"));
    j["architectures"] = json::array({"Qwen3ForSequenceClassification"});
    j["num_labels"] = 1;
    test::spit(dir / "config.json", j.dump());
    const std::string e = test::error_of([&] { load_pretrained(dir.path()); });
    EXPECT_NE(e.find("missing tensor(s) score.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("this folder's weights have no score head"), std::string::npos) << e;
}

TEST(RewardModelFolder, SavesAndLoadsBackTheSameScores) {
    test::TempDir a, b;
    TinyModelSpec spec;
    spec.num_labels = 1;
    write_tiny_model(a.path(), 5, spec);
    auto m = load_pretrained(a.path());
    save_pretrained(*m, b.path());
    auto back = load_pretrained(b.path());
    EXPECT_EQ(back->config().class_name(), "Qwen3ForSequenceClassification");
    const PackedBatch pb = PackedBatch::from_sequences(kSeqs);
    EXPECT_TRUE(at::equal(m->sequence_scores(pb), back->sequence_scores(pb)));
}

} // namespace
} // namespace rl::core
