// LoRA on the experts of mixture-of-experts models (docs/lora.md, docs/moe.md):
// per-expert adapters on gate_proj / up_proj / down_proj (and Qwen2-MoE's
// shared expert) in the trainer, the engine, routing replay, activation
// checkpointing, merged exports and PEFT files.
#include "../moe/moe_test_util.hpp"
#include "lora_test_util.hpp"

#include "rl/core/engine.hpp"
#include "rl/core/lora.hpp"
#include "rl/core/moe.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/tiny.hpp"
#include "rl/core/trainer.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <string>

using namespace rl::core;

namespace {

using namespace test;

std::shared_ptr<Policy> moe_policy(const TempDir &tmp) {
    return seeded_policy(tmp / "moe", 11, small_moe_spec());
}

LoraConfig expert_lora(uint64_t seed = 1) {
    LoraConfig c;
    c.rank = 4;
    c.alpha = 8;
    c.seed = seed;
    return c; // all-linear: attention and every expert's projections
}

at::Tensor logits_of(CausalLM &m, const std::shared_ptr<const LoraAdapter> &a,
                     const std::vector<int64_t> &ids) {
    AdapterScope scope(a);
    at::NoGradGuard g;
    return m.logits(PackedBatch::from_sequences({ids}));
}

at::Tensor logits_of(Policy &p, const std::shared_ptr<const LoraAdapter> &a,
                     const std::string &text) {
    return logits_of(p.model(), a, std::vector<int64_t>(text.begin(), text.end()));
}

// Every B of `a` drawn at random (a fresh adapter's B is zero): an adapter
// that changes every module it sits on.
void randomize_b(LoraAdapter &a, uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    at::NoGradGuard g;
    for (auto &[name, t] : a.named_parameters())
        if (name.find("lora_B") != std::string::npos)
            t.copy_(at::randn(t.sizes(), gen, at::kFloat).mul_(0.2));
}

const std::string kExpert = "base_model.model.model.layers.";

} // namespace

TEST(LoraMoe, FreshExpertAdapterIsTheIdentityOnTheTinyMoePreset) {
    TempDir tmp;
    const TinyModelSpec spec = tiny_moe_spec();
    write_tiny_model(tmp / "m", 3, spec);
    auto p = Policy::load(tmp / "m");
    auto a = p->create_adapter("a", expert_lora());
    // Every expert of every layer has its pairs: 4 attention + 8 experts x 3.
    EXPECT_EQ(a->named_parameters().size(),
              static_cast<size_t>(spec.num_hidden_layers * (4 + spec.num_experts * 3) * 2));
    const auto *down = a->find_expert(3, 7, LoraTarget::Down);
    ASSERT_NE(down, nullptr);
    EXPECT_EQ(down->A.sizes().vec(), (std::vector<int64_t>{4, spec.moe_intermediate_size}));
    EXPECT_EQ(down->B.sizes().vec(), (std::vector<int64_t>{spec.hidden_size, 4}));
    EXPECT_EQ(a->find(3, LoraTarget::Down), nullptr); // a sparse layer has no dense MLP
    EXPECT_EQ(down->B.abs().max().item<double>(), 0.0);
    EXPECT_GT(down->A.abs().max().item<double>(), 0.0);
    const auto names = snapshot(a->named_parameters());
    EXPECT_TRUE(names.count(kExpert + "3.mlp.experts.7.down_proj.lora_B.weight"));
    EXPECT_TRUE(names.count(kExpert + "0.mlp.experts.0.gate_proj.lora_A.weight"));
    const at::Tensor base = logits_of(*p, nullptr, "hello experts");
    EXPECT_TRUE(at::equal(base, logits_of(*p, a, "hello experts")));
}

TEST(LoraMoe, TrainingChangesOnlyTheAdapterAndReachesTheExperts) {
    TempDir tmp;
    auto p = moe_policy(tmp);
    const auto base_before = snapshot(p->model().named_weights());
    auto a = p->create_adapter("a", expert_lora());
    Trainer t(p, lora_trainer_config(), a);
    const std::vector<std::string> texts{"abcabcabc", "hello hello"};
    const double first = t.forward_backward(text_batch(texts), nll_loss()).loss;
    t.optim_step();
    train_steps(t, 4, texts);
    const double last = t.forward_backward(text_batch(texts), nll_loss()).loss;
    EXPECT_LT(last, first);
    for (const auto &[name, w] : p->model().named_weights())
        EXPECT_TRUE(at::equal(base_before.at(name), w.detach())) << name;
    // The routed experts' B moved off zero; experts no token reached keep it.
    int moved = 0;
    for (int64_t e = 0; e < 8; ++e)
        if (a->find_expert(1, e, LoraTarget::Down)->B.abs().max().item<double>() > 0) ++moved;
    EXPECT_GE(moved, 2);
    EXPECT_EQ(p->version(), 0);
    EXPECT_EQ(a->version(), 5);
}

TEST(LoraMoe, EngineLogprobsWithExpertAdapterEqualTrainerLogprobsAndReplay) {
    TempDir tmp;
    auto p = moe_policy(tmp);
    auto a = p->create_adapter("a", expert_lora());
    Trainer t(p, lora_trainer_config(), a);
    train_steps(t, 3, {"the cat sat on the mat"});
    Engine e(p);
    SamplingParams sp = adapter_sampling("a");
    sp.return_routed_experts = true;
    const std::vector<int64_t> prompt{'t', 'h', 'e', ' '};
    const Generation g = e.generate({prompt}, sp);
    SamplingParams base = sp;
    base.adapter.clear();
    EXPECT_NE(g.token_ids, e.generate({prompt}, base).token_ids);
    int64_t row = 0;
    TrainBatch first;
    at::Tensor first_lp;
    for (int64_t s = 0; s < g.samples(); ++s) {
        std::vector<int64_t> ids = prompt;
        ids.insert(ids.end(), g.token_ids.begin() + g.cu_seqlens[s],
                   g.token_ids.begin() + g.cu_seqlens[s + 1]);
        const auto n = static_cast<int64_t>(ids.size());
        TrainBatch b;
        b.input_ids = at::tensor(ids, at::kLong);
        b.cu_seqlens = {0, n};
        const at::Tensor lp = t.forward(b, nullptr).tensors.at("logprobs");
        // The same with the engine's routing replayed (R3).
        const at::Tensor routed =
            at::tensor(std::vector<int64_t>(
                           g.routed_experts.begin() + row * g.routed_layers * g.routed_k,
                           g.routed_experts.begin() + (row + n) * g.routed_layers * g.routed_k),
                       at::kLong)
                .view({n, g.routed_layers, g.routed_k});
        row += n;
        b.tensors["routed_experts"] = routed;
        const at::Tensor lp_replayed = t.forward(b, nullptr).tensors.at("logprobs");
        double worst = 0, worst_replayed = 0;
        for (int64_t i = g.cu_seqlens[s]; i < g.cu_seqlens[s + 1]; ++i) {
            const int64_t pos = static_cast<int64_t>(prompt.size()) + (i - g.cu_seqlens[s]);
            worst = std::max(worst, std::abs(lp[pos].item<double>() - g.logprobs[i]));
            worst_replayed =
                std::max(worst_replayed, std::abs(lp_replayed[pos].item<double>() - g.logprobs[i]));
        }
        EXPECT_LT(worst, 2e-5) << "sample " << s;
        EXPECT_LT(worst_replayed, 2e-5) << "sample " << s << " replayed";
        if (s == 0) {
            first = b;
            first_lp = lp;
        }
    }
    // The experts' pairs took part: without them the trainer scores otherwise.
    {
        at::NoGradGuard ng;
        for (auto &[name, w] : a->named_parameters())
            if (name.find(".experts.") != std::string::npos &&
                name.find("lora_B") != std::string::npos)
                w.zero_();
    }
    EXPECT_GT(
        (t.forward(first, nullptr).tensors.at("logprobs") - first_lp).abs().max().item<double>(),
        1e-4);
}

TEST(LoraMoe, ExpertDropoutTrainsWithActivationCheckpointingLikeWithout) {
    TempDir tmp;
    std::vector<std::map<std::string, at::Tensor>> grads;
    for (int run = 0; run < 3; ++run) {
        auto p = moe_policy(tmp);
        LoraConfig c = expert_lora();
        c.dropout = run == 2 ? 0.0 : 0.3; // run 2: the reference without dropout
        auto a = p->create_adapter("a", c);
        TrainerConfig tc = lora_trainer_config();
        tc.activation_checkpointing = run == 1;
        Trainer t(p, tc, a);
        // B is zero at init: give the experts' A a gradient that depends on the mask.
        randomize_b(*a, 5);
        t.forward_backward(text_batch({"dropout on the experts"}), nll_loss());
        std::map<std::string, at::Tensor> g;
        for (const auto &kv : a->named_parameters())
            if (kv.second.grad().defined()) g[kv.first] = kv.second.grad().clone();
        grads.push_back(g);
    }
    bool dropped = false;
    int experts = 0;
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (const auto &[name, g] : grads[0]) {
        if (name.find(".experts.") == std::string::npos) continue;
        ++experts;
        EXPECT_TRUE(at::allclose(g, grads[1].at(name), 1e-4, 1e-6)) << name;
        dropped = dropped || !at::allclose(g, grads[2].at(name), 1e-3, 1e-6);
    }
    EXPECT_GT(experts, 0);
    EXPECT_TRUE(dropped) << "dropout 0.3 gave the experts the gradients of dropout 0";
}

TEST(LoraMoe, MergedExportGivesTheExpertAdapterLogits) {
    TempDir tmp;
    auto p = moe_policy(tmp);
    auto a = p->create_adapter("a", expert_lora());
    Trainer t(p, lora_trainer_config(), a);
    train_steps(t, 3, {"merge the experts", "and me too"});
    randomize_b(*a, 7); // every expert's pair, also those no token reached
    save_merged(p->model(), *a, tmp / "merged");
    auto merged = Policy::load(tmp / "merged");
    const at::Tensor want = logits_of(*p, a, "merge the experts please");
    EXPECT_LT(
        (want - logits_of(*merged, nullptr, "merge the experts please")).abs().max().item<double>(),
        1e-4);
    EXPECT_GT(
        (want - logits_of(*p, nullptr, "merge the experts please")).abs().max().item<double>(),
        1e-3);
}

TEST(LoraMoe, SharedExpertOfQwen2MoeTakesTheAdapterAsMergingDoesAndDenseLayersNone) {
    // Qwen2-MoE, layer 1 dense (mlp_only_layers), a gated shared expert.
    const ModelConfig c = ModelConfig::parse(moe_config("qwen2_moe", /*mixed=*/true).dump());
    auto m = std::make_shared<CausalLM>(c);
    m->init_weights(4, 0.08);
    LoraConfig lc = expert_lora();
    lc.target_modules = {"gate_proj", "up_proj", "down_proj"};
    auto a = std::make_shared<LoraAdapter>(*m, "a", lc);
    EXPECT_NE(a->find_expert(0, LoraAdapter::kSharedExpert, LoraTarget::Up), nullptr);
    // The dense layer's MLP is not adapted (PEFT over transformers 5 adapts no dense MLP
    // of an MoE model).
    EXPECT_EQ(a->find(1, LoraTarget::Up), nullptr);
    EXPECT_EQ(a->find_expert(0, LoraAdapter::kSharedExpert, LoraTarget::Up)->B.size(0), 40);
    // 2 sparse layers x (6 experts + shared) x 3 pairs.
    EXPECT_EQ(a->named_parameters().size(), static_cast<size_t>(2 * 7 * 3 * 2));
    const auto names = snapshot(a->named_parameters());
    EXPECT_TRUE(names.count(kExpert + "2.mlp.shared_expert.down_proj.lora_A.weight"));
    EXPECT_FALSE(names.count(kExpert + "1.mlp.gate_proj.lora_B.weight"));
    randomize_b(*a, 9);
    auto copy = std::make_shared<CausalLM>(c);
    {
        at::NoGradGuard g;
        std::map<std::string, at::Tensor> merged;
        for (auto &kv : merged_weights(*m, *a)) merged[kv.first] = kv.second;
        for (auto &[name, w] : copy->named_weights()) w.copy_(merged.at(name));
    }
    const std::vector<int64_t> ids{5, 17, 3, 44, 90, 12, 7, 7, 61};
    const at::Tensor want = logits_of(*m, a, ids);
    EXPECT_LT((want - logits_of(*copy, nullptr, ids)).abs().max().item<double>(), 1e-4);
    EXPECT_GT((want - logits_of(*m, nullptr, ids)).abs().max().item<double>(), 1e-3);
    // Without the shared expert's pairs the adapter is another function.
    at::NoGradGuard g;
    a->find_expert(0, LoraAdapter::kSharedExpert, LoraTarget::Down)->B.zero_();
    EXPECT_GT((want - logits_of(*m, a, ids)).abs().max().item<double>(), 1e-5);
}

TEST(LoraMoe, SaveLoadRoundTripWithPeftExpertKeys) {
    TempDir tmp;
    auto p = moe_policy(tmp);
    auto a = p->create_adapter("a", expert_lora());
    Trainer t(p, lora_trainer_config(), a);
    train_steps(t, 2, {"round trip"});
    save_adapter(*a, tmp / "adapter");
    const auto cfg = nlohmann::json::parse(std::ifstream(tmp / "adapter/adapter_config.json"));
    EXPECT_EQ(cfg["target_modules"].size(), 7u);
    auto loaded = load_adapter(p->model(), tmp / "adapter", "b");
    const auto want = snapshot(a->named_parameters());
    EXPECT_TRUE(want.count(kExpert + "1.mlp.experts.5.up_proj.lora_B.weight"));
    for (const auto &[name, w] : loaded->named_parameters())
        EXPECT_TRUE(at::equal(want.at(name), w.detach())) << name;
    EXPECT_TRUE(at::equal(logits_of(*p, a, "round trip"), logits_of(*p, loaded, "round trip")));
    // The experts named twice, per expert by target_modules and fused by
    // target_parameters (PEFT's fused layout: test_lora_moe_peft_fused.py),
    // are refused naming the keys.
    auto edited = cfg;
    edited["target_parameters"] = {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
    std::ofstream(tmp / "adapter/adapter_config.json") << edited.dump();
    EXPECT_NE(error_of([&] {
                  load_adapter(p->model(), tmp / "adapter", "c");
              }).find("target_modules names down_proj beside target_parameters"),
              std::string::npos);
}

TEST(LoraMoe, GateWithoutUpAndExpertParallelAreRefusedNamingTheKey) {
    TempDir tmp;
    auto p = moe_policy(tmp);
    LoraConfig lc = expert_lora();
    lc.target_modules = {"gate_proj", "down_proj"};
    EXPECT_NE(error_of([&] {
                  p->create_adapter("a", lc);
              }).find("lora.target_modules: gate_proj without up_proj"),
              std::string::npos);
    auto a = p->create_adapter("b", expert_lora());
    TrainerConfig tc = lora_trainer_config();
    tc.expert_parallel = 2;
    EXPECT_NE(error_of([&] {
                  Trainer t(p, tc, a);
              }).find("trainer.expert_parallel (2) is not supported with LoRA adapters"),
              std::string::npos);
}
