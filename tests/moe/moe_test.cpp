// Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE; docs/model.md): config
// keys and their refusals, per-expert checkpoints in and out, the sparse block
// against a token-by-token reference, cached decoding, the router losses, the
// tiny-moe preset training and generating, and what is refused.
#include "../platform/platform_util.hpp"
#include "flip_router.hpp"
#include "moe_test_util.hpp"

#include "rl/core/config.hpp"
#include "rl/core/engine.hpp"
#include "rl/core/lora.hpp"
#include "rl/core/moe.hpp"
#include "rl/core/moe_weights.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/pretrained.hpp"
#include "rl/core/safetensors.hpp"
#include "rl/core/scheduler.hpp"
#include "rl/core/tensor_io.hpp"
#include "rl/core/tiny.hpp"
#include "rl/core/trainer.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

using namespace rl::core;
using Json = nlohmann::json;
using test::error_of;
using test::flip_some_in_the_last_layer;
using test::moe_config;
using test::nll_loss;
using test::small_moe_spec;
using test::TempDir;

namespace {

// A model of `config` with weights drawn from `seed`; the router weights are
// scaled up so that tokens prefer experts clearly.
std::shared_ptr<CausalLM> make_model(const Json &config, uint64_t seed) {
    auto m = std::make_shared<CausalLM>(ModelConfig::parse(config.dump()));
    m->init_weights(seed, 0.08);
    at::NoGradGuard g;
    for (auto &[name, p] : m->named_weights())
        if (name.find("mlp.gate.weight") != std::string::npos) p.mul_(8.0);
    return m;
}

std::vector<std::vector<int64_t>> random_seqs(const std::vector<int64_t> &lens, int64_t vocab,
                                              uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    std::vector<std::vector<int64_t>> out;
    for (int64_t n : lens) {
        at::Tensor t = at::randint(vocab, {n}, gen, at::kLong);
        out.emplace_back(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
    }
    return out;
}

// The sparse block written token by token from the equations, in float64:
// p = softmax(x W_r^T); the k largest p_e (renormalized when norm_topk_prob);
// y = sum_e p_e * down_e(silu(gate_e x) * up_e x) + sigmoid(g . x) * shared(x).
at::Tensor reference_block(const SparseMoeBlock &b, const at::Tensor &x) {
    auto d = [](const at::Tensor &t) { return t.detach().to(at::kDouble); };
    auto mlp = [&](const MLP &m, const at::Tensor &v) {
        return at::matmul(d(m.down_proj->weight), at::silu(at::matmul(d(m.gate_proj->weight), v)) *
                                                      at::matmul(d(m.up_proj->weight), v));
    };
    at::Tensor out = at::zeros({x.size(0), x.size(1)}, at::kDouble);
    for (int64_t t = 0; t < x.size(0); ++t) {
        const at::Tensor v = d(x[t]);
        const at::Tensor p = at::softmax(at::matmul(d(b.gate->weight), v), 0);
        std::vector<std::pair<double, int64_t>> ranked;
        for (int64_t e = 0; e < b.num_experts; ++e) ranked.emplace_back(p[e].item<double>(), e);
        std::sort(ranked.rbegin(), ranked.rend());
        double total = 0;
        for (int64_t k = 0; k < b.top_k; ++k) total += ranked[static_cast<size_t>(k)].first;
        at::Tensor y = at::zeros({x.size(1)}, at::kDouble);
        for (int64_t k = 0; k < b.top_k; ++k) {
            const auto [w, e] = ranked[static_cast<size_t>(k)];
            y += (b.norm_topk_prob ? w / total : w) * mlp(*b.experts[static_cast<size_t>(e)], v);
        }
        if (b.shared_expert)
            y += at::sigmoid(at::dot(d(b.shared_expert_gate->weight[0]), v)) *
                 mlp(*b.shared_expert, v);
        out[t] = y;
    }
    return out;
}

TrainBatch batch_of(const std::vector<std::vector<int64_t>> &seqs) {
    TrainBatch b;
    std::vector<int64_t> ids;
    b.cu_seqlens = {0};
    for (const auto &s : seqs) {
        ids.insert(ids.end(), s.begin(), s.end());
        b.cu_seqlens.push_back(static_cast<int64_t>(ids.size()));
    }
    b.input_ids = at::tensor(ids, at::kLong);
    return b;
}

// A small MoE model (small_moe_spec) initialised from `seed`, written under
// `dir` and loaded.
std::shared_ptr<Policy> small_moe_policy(const std::string &dir, uint64_t seed) {
    write_tiny_model(dir, seed, small_moe_spec());
    return Policy::load(dir);
}

} // namespace

// -- config ---------------------------------------------------------------------

TEST(MoeConfig, ReadsTheSparseLayoutOfQwen3MoeAndQwen2Moe) {
    Json j = moe_config("qwen3_moe");
    j["decoder_sparse_step"] = 2;
    j["num_hidden_layers"] = 4;
    j["mlp_only_layers"] = {3};
    const ModelConfig c = ModelConfig::parse(j.dump());
    EXPECT_EQ(c.architecture, Architecture::Qwen3Moe);
    EXPECT_EQ(c.num_experts, 6);
    EXPECT_EQ(c.num_experts_per_tok, 2);
    EXPECT_EQ(c.moe_intermediate_size, 24);
    EXPECT_TRUE(c.norm_topk_prob && c.qk_norm);
    EXPECT_DOUBLE_EQ(c.router_aux_loss_coef, 0.001); // transformers' default
    // (i + 1) % 2 == 0 and not listed: only layer 1 (layer 3 is mlp-only).
    EXPECT_FALSE(c.is_moe_layer(0));
    EXPECT_TRUE(c.is_moe_layer(1));
    EXPECT_FALSE(c.is_moe_layer(2));
    EXPECT_FALSE(c.is_moe_layer(3));

    // transformers 5 saves Qwen3-MoE's expert count as num_local_experts.
    Json local = moe_config("qwen3_moe");
    local.erase("num_experts");
    local["num_local_experts"] = 5;
    EXPECT_EQ(ModelConfig::parse(local.dump()).num_experts, 5);

    const ModelConfig q2 = ModelConfig::parse(moe_config("qwen2_moe").dump());
    EXPECT_EQ(q2.architecture, Architecture::Qwen2Moe);
    EXPECT_EQ(q2.shared_expert_intermediate_size, 40);
    EXPECT_TRUE(q2.qkv_bias);
    EXPECT_FALSE(q2.qk_norm);
    EXPECT_EQ(q2.head_dim, 12); // derived: hidden / heads
    // model_type alone names the architecture too.
    Json by_type = moe_config("qwen2_moe");
    by_type.erase("architectures");
    EXPECT_EQ(ModelConfig::parse(by_type.dump()).architecture, Architecture::Qwen2Moe);
}

TEST(MoeConfig, BadValuesAreRefusedNamingTheKey) {
    // A key of a good config set to a bad value (null: left out), and what the
    // refusal says.
    struct Case {
        const char *arch, *key;
        Json value;
        const char *error;
    };
    const Case cases[] = {
        {"qwen3_moe", "num_experts_per_tok", 7,
         "'num_experts_per_tok' (7) must not exceed num_experts (6)"},
        {"qwen3_moe", "moe_intermediate_size", nullptr, "'moe_intermediate_size' is required"},
        {"qwen3_moe", "mlp_only_layers", Json::array({0, 3}),
         "'mlp_only_layers' holds 3: layer indices must be in [0, 3)"},
        {"qwen3_moe", "num_local_experts", 4,
         "'num_local_experts' (4) differs from num_experts (6)"},
        {"qwen2_moe", "shared_expert_intermediate_size", nullptr,
         "'shared_expert_intermediate_size' is required"},
        {"qwen3_moe", "decoder_sparse_step", 0, "'decoder_sparse_step' must be >= 1"},
        {"qwen3_moe", "num_experts_per_tok", 0, "'num_experts_per_tok' must be >= 1"},
    };
    for (const Case &c : cases) {
        Json j = moe_config(c.arch);
        if (c.value.is_null())
            j.erase(c.key);
        else
            j[c.key] = c.value;
        const std::string msg = error_of([&] { ModelConfig::parse(j.dump()); });
        EXPECT_NE(msg.find(c.error), std::string::npos) << c.arch << " " << c.key << ": " << msg;
    }
}

// -- checkpoints ------------------------------------------------------------------

TEST(MoeCheckpoint, PerExpertTensorsRoundTripAndAMissingOneIsNamed) {
    TempDir d;
    auto m = make_model(moe_config("qwen2_moe", /*mixed=*/true), 3);
    std::map<std::string, at::Tensor> names;
    for (auto &[n, p] : m->named_weights()) names[n] = p;
    for (const char *n :
         {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.5.down_proj.weight",
          "model.layers.2.mlp.experts.0.gate_proj.weight",
          "model.layers.2.mlp.shared_expert.up_proj.weight",
          "model.layers.2.mlp.shared_expert_gate.weight",
          "model.layers.1.mlp.up_proj.weight"}) // the dense layer
        EXPECT_TRUE(names.count(n)) << n;
    EXPECT_FALSE(names.count("model.layers.1.mlp.gate.weight"));
    EXPECT_EQ(names["model.layers.0.mlp.experts.5.down_proj.weight"].sizes(),
              (at::IntArrayRef{48, 24}));
    EXPECT_EQ(names["model.layers.0.mlp.shared_expert_gate.weight"].sizes(),
              (at::IntArrayRef{1, 48}));

    // Sharded (experts split across files) and whole.
    for (uint64_t shard_bytes : {uint64_t{40000}, uint64_t{5} << 30}) {
        SaveOptions so;
        so.max_shard_bytes = shard_bytes;
        save_pretrained(*m, d.path(), so);
        EXPECT_EQ(std::filesystem::exists(d / "model.safetensors.index.json"),
                  shard_bytes < 1000000);
        auto back = load_pretrained(d.path());
        auto wa = m->named_weights(), wb = back->named_weights();
        ASSERT_EQ(wa.size(), wb.size());
        for (size_t i = 0; i < wa.size(); ++i) {
            EXPECT_EQ(wa[i].first, wb[i].first);
            EXPECT_TRUE(at::equal(wa[i].second, wb[i].second)) << wa[i].first;
        }
    }

    const std::string file = d / "model.safetensors";
    auto weights = load_safetensors(file);
    weights.erase("model.layers.2.mlp.experts.3.up_proj.weight");
    save_safetensors(file, {weights.begin(), weights.end()});
    const std::string msg = error_of([&] { load_pretrained(d.path()); });
    EXPECT_NE(msg.find("missing tensor(s) model.layers.2.mlp.experts.3.up_proj.weight"),
              std::string::npos)
        << msg;
}

// -- forward ----------------------------------------------------------------------

TEST(MoeForward, SparseBlockEqualsATokenByTokenReference) {
    for (const char *arch : {"qwen3_moe", "qwen2_moe"}) {
        auto m = make_model(moe_config(arch), 5);
        const SparseMoeBlock &b = *m->model->layers[0]->moe;
        ASSERT_EQ(b.shared_expert != nullptr, std::string(arch) == "qwen2_moe");
        at::Tensor x = at::randn({13, 48}, at::make_generator<at::CPUGeneratorImpl>(1));
        MoeRouting r;
        const at::Tensor y = b.forward(x, false, &r);
        EXPECT_LT((y.to(at::kDouble) - reference_block(b, x)).abs().max().item<double>(), 1e-5)
            << arch;
        // The routing picks several experts overall (the test exercises the loop).
        EXPECT_GE(std::get<0>(at::_unique(r.experts)).numel(), 4) << arch;
        if (b.norm_topk_prob) {
            EXPECT_LT((r.weights.sum(-1) - 1).abs().max().item<double>(), 1e-6);
        }
        // The decoding path (row kernel where it applies) gives the same.
        EXPECT_LT((b.forward(x, /*decoding=*/true) - y).abs().max().item<double>(), 1e-5) << arch;
    }
}

TEST(MoeForward, ARoutingWithExpertIdsOutOfRangeIsRefused) {
    auto m = make_model(moe_config("qwen3_moe"), 5);
    const SparseMoeBlock &b = *m->model->layers[0]->moe;
    const at::Tensor x = at::randn({3, 48});
    MoeRouting r = b.route(x);
    r.experts[1][0] = 9;
    EXPECT_NE(error_of([&] { b.mix(x, r); }).find("routing names expert 9 but the block has 6"),
              std::string::npos);
    r.experts[1][0] = -1;
    EXPECT_NE(error_of([&] { b.mix(x, r); }).find("negative expert id"), std::string::npos);
    r = b.route(x);
    r.weights = r.weights.narrow(1, 0, 1);
    EXPECT_NE(
        error_of([&] { b.mix(x, r); }).find("routing must give [3, k] expert ids and weights"),
        std::string::npos);
}

TEST(MoeForward, GradientsReachTheRouterTheChosenExpertsAndTheSharedExpert) {
    auto m = make_model(moe_config("qwen2_moe"), 6);
    const auto seqs = random_seqs({9, 4}, 97, 2);
    m->logits(PackedBatch::from_sequences(seqs)).logsumexp(-1).sum().backward();
    const SparseMoeBlock &b = *m->model->layers[0]->moe;
    EXPECT_GT(b.gate->weight.grad().abs().sum().item<double>(), 0);
    EXPECT_GT(b.shared_expert_gate->weight.grad().abs().sum().item<double>(), 0);
    EXPECT_GT(b.shared_expert->down_proj->weight.grad().abs().sum().item<double>(), 0);
    int64_t with_grad = 0;
    for (const auto &e : b.experts)
        with_grad += e->down_proj->weight.grad().defined() &&
                     e->down_proj->weight.grad().abs().sum().item<double>() > 0;
    EXPECT_GE(with_grad, 2);
}

TEST(MoeForward, CachedDecodingEqualsThePackedForward) {
    for (const char *arch : {"qwen3_moe", "qwen2_moe"}) {
        auto m = make_model(moe_config(arch, /*mixed=*/true), 7);
        const auto seqs = random_seqs({11, 6}, 97, 4);
        const at::Tensor full = m->logits(PackedBatch::from_sequences(seqs)).detach();
        KVCache cache = m->make_cache(2, 4);
        // Prefill all but the last 3 tokens of each, then decode them one by one.
        std::vector<std::vector<int64_t>> prompts;
        for (const auto &s : seqs) prompts.emplace_back(s.begin(), s.end() - 3);
        at::Tensor last = m->prefill(cache, {0, 1}, prompts);
        const int64_t off[2] = {0, 11};
        for (int step = 0; step < 3; ++step) {
            for (int64_t s = 0; s < 2; ++s) {
                const int64_t pos = static_cast<int64_t>(seqs[s].size()) - 4 + step;
                EXPECT_LT((last[s] - full[off[s] + pos]).abs().max().item<double>(), 1e-4)
                    << arch << " sequence " << s << " step " << step;
            }
            std::vector<int64_t> next;
            for (const auto &s : seqs) next.push_back(s[s.size() - 3 + step]);
            last = m->decode(cache, {0, 1}, at::tensor(next, at::kLong));
        }
    }
}

TEST(MoeForward, Bfloat16ModelRoutesInFloat32UnlessTurnedOff) {
    for (bool fp32 : {true, false}) {
        ModelConfig c = ModelConfig::parse(moe_config("qwen3_moe").dump());
        c.router_fp32 = fp32;
        CausalLM m(c, ModelOptions{at::kBFloat16, at::kCPU});
        m.init_weights(3, 0.08);
        const SparseMoeBlock &b = *m.model->layers[0]->moe;
        const at::Tensor x = at::randn({5, 48}).to(at::kBFloat16);
        const MoeRouting r = b.route(x);
        EXPECT_EQ(r.logits.scalar_type(), fp32 ? at::kFloat : at::kBFloat16);
        EXPECT_EQ(r.weights.scalar_type(), at::kFloat);
        const at::Tensor y = b.forward(x);
        EXPECT_EQ(y.scalar_type(), at::kBFloat16);
        EXPECT_TRUE(at::isfinite(y).all().item<bool>());
        // The router product in float32 is the float32 product of the bf16 values.
        if (fp32) {
            const at::Tensor want = at::matmul(x.to(at::kFloat), b.gate->weight.to(at::kFloat).t());
            EXPECT_TRUE(at::equal(r.logits, want));
        }
    }
}

TEST(MoeForward, ActivationCheckpointingGivesTheSameGradients) {
    TempDir tmp;
    write_tiny_model(tmp / "m", 5, small_moe_spec());
    const TrainBatch batch = batch_of(random_seqs({10, 6, 3}, 256, 1));
    std::vector<std::map<std::string, at::Tensor>> grads;
    for (bool checkpoint : {false, true}) {
        auto policy = Policy::load(tmp / "m");
        TrainerConfig tc;
        tc.activation_checkpointing = checkpoint;
        Trainer t(policy, tc);
        t.forward_backward(batch, nll_loss());
        std::map<std::string, at::Tensor> g;
        for (auto &[name, p] : policy->model().named_weights())
            if (p.grad().defined()) g[name] = p.grad().clone();
        grads.push_back(std::move(g));
    }
    ASSERT_EQ(grads[0].size(), grads[1].size());
    EXPECT_TRUE(grads[0].count("model.layers.1.mlp.gate.weight"));
    for (const auto &[name, g] : grads[0])
        EXPECT_LT((g - grads[1].at(name)).abs().max().item<double>(), 1e-6) << name;
}

// -- router losses ----------------------------------------------------------------

TEST(MoeLosses, LoadBalancingAndZLossHaveTheirClosedFormValues) {
    // Uniform routing: P_e = 1/E, the assignments sum to k per token, so
    // E * sum_e f_e P_e = k; z-loss = (log E)^2.
    const at::Tensor uniform = at::zeros({10, 4});
    EXPECT_NEAR(load_balancing_loss({uniform, uniform}, 4, 2).item<double>(), 2.0, 1e-6);
    EXPECT_NEAR(router_z_loss({uniform}).item<double>(), std::pow(std::log(4.0), 2), 1e-6);
    // One token, logits (2, 0, 0), top-1: f = (1, 0, 0), P = softmax.
    const at::Tensor one = at::tensor({2.0f, 0.0f, 0.0f}).unsqueeze(0);
    const double p0 = std::exp(2.0) / (std::exp(2.0) + 2.0);
    EXPECT_NEAR(load_balancing_loss({one}, 3, 1).item<double>(), 3.0 * p0, 1e-6);
    EXPECT_NEAR(router_z_loss({one}).item<double>(), std::pow(std::log(std::exp(2.0) + 2.0), 2),
                1e-5);
    // A masked token does not count: the same as leaving it out.
    const at::Tensor two = at::cat({one, at::tensor({0.0f, 3.0f, 1.0f}).unsqueeze(0)});
    EXPECT_NEAR(load_balancing_loss({two}, 3, 1, at::tensor({1.0f, 0.0f})).item<double>(), 3.0 * p0,
                1e-6);
    // The gradient flows through the probabilities only: d/dlogit of E * f . softmax.
    at::Tensor l = one.clone().requires_grad_(true);
    load_balancing_loss({l}, 3, 1).backward();
    const at::Tensor p = at::softmax(one, -1)[0];
    const at::Tensor f = at::tensor({1.0f, 0.0f, 0.0f});
    const at::Tensor expected = 3.0 * p * (f - (f * p).sum());
    EXPECT_LT((l.grad()[0] - expected).abs().max().item<double>(), 1e-6);

    EXPECT_NE(error_of([&] { load_balancing_loss({uniform}, 4, 5); }).find("top_k"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  load_balancing_loss({uniform, at::zeros({9, 4})}, 4, 2);
              }).find("router logits of layer 1"),
              std::string::npos);
}

// Expert parallelism pools the routing statistics of every rank: each
// rank's parts of the losses add up to the losses of all tokens, gradients too.
TEST(MoeLosses, PartsOfTokensSplitOverRanksAddUpToTheLossesOfAllTokens) {
    at::manual_seed(3);
    const int64_t E = 6, K = 2;
    const at::Tensor l0 = at::randn({10, E}, at::kFloat), l1 = at::randn({10, E}, at::kFloat);
    auto leaf = [](const at::Tensor &t) { return t.clone().requires_grad_(true); };
    // One process: all 10 tokens of both layers.
    const at::Tensor a0 = leaf(l0), a1 = leaf(l1);
    const at::Tensor whole = load_balancing_loss({a0, a1}, E, K) + 0.5 * router_z_loss({a0, a1});
    whole.backward();
    // Two "ranks": tokens 0..3 and 4..9, statistics pooled.
    const at::Tensor b0 = leaf(l0), b1 = leaf(l1);
    const std::vector<at::Tensor> first = {b0.narrow(0, 0, 4), b1.narrow(0, 0, 4)};
    const std::vector<at::Tensor> second = {b0.narrow(0, 4, 6), b1.narrow(0, 4, 6)};
    const at::Tensor pooled =
        router_assignment_counts(first, E, K) + router_assignment_counts(second, E, K);
    EXPECT_EQ(pooled[E].item<double>(), 20.0);                    // rows: tokens x layers
    EXPECT_EQ(pooled.narrow(0, 0, E).sum().item<double>(), 40.0); // k per row
    const double rows = pooled[E].item<double>();
    const at::Tensor parts =
        load_balancing_loss_part(first, E, K, pooled) +
        load_balancing_loss_part(second, E, K, pooled) +
        0.5 * (router_z_loss_part(first, rows) + router_z_loss_part(second, rows));
    parts.backward();
    EXPECT_NEAR(parts.item<double>(), whole.item<double>(), 1e-6);
    EXPECT_LE((b0.grad() - a0.grad()).abs().max().item<double>(), 1e-7);
    EXPECT_LE((b1.grad() - a1.grad()).abs().max().item<double>(), 1e-7);
    // A rank's part alone is not the loss of its own tokens.
    EXPECT_GT(std::abs(load_balancing_loss_part(first, E, K, pooled).item<double>() -
                       load_balancing_loss(first, E, K).item<double>()),
              1e-4);
}

TEST(MoeLosses, TrainerReportsRouterMetricsAndAddsTheWeightedAuxLoss) {
    TempDir tmp;
    write_tiny_model(tmp / "m", 3, small_moe_spec());
    const TrainBatch batch = batch_of(random_seqs({12, 7}, 256, 9));
    const LossFunction nll = nll_loss();
    auto router_grad = [&](std::optional<double> coef, double *aux, double *loss) {
        auto policy = Policy::load(tmp / "m");
        TrainerConfig tc;
        tc.moe_aux_loss_coef = coef;
        Trainer t(policy, tc);
        const StepResult r = t.forward_backward(batch, nll);
        *aux = r.metrics.at("moe/aux_loss");
        *loss = r.loss;
        EXPECT_GE(r.metrics.at("moe/max_load_ratio/layer_1"), 1.0);
        EXPECT_LE(r.metrics.at("moe/min_load_ratio"), 1.0);
        EXPECT_GT(r.metrics.at("moe/z_loss"), 0.0);
        return policy->model().model->layers[1]->moe->gate->weight.grad().clone();
    };
    double aux0 = 0, aux1 = 0, loss0 = 0, loss1 = 0;
    const at::Tensor g0 =
        router_grad(std::nullopt, &aux0, &loss0); // config: no output_router_logits
    const at::Tensor g1 = router_grad(0.5, &aux1, &loss1);
    EXPECT_NEAR(aux0, aux1, 1e-9);
    EXPECT_GE(aux0, 2.0 - 1e-6);                  // k = 2 is its minimum (uniform load)
    EXPECT_NEAR(loss1 - loss0, 0.5 * aux0, 1e-5); // one micro-batch: the pooled value
    EXPECT_GT((g1 - g0).abs().max().item<double>(), 1e-6);

    // The aux loss's gradient cannot pass through recomputed layers.
    TrainerConfig ck;
    ck.moe_aux_loss_coef = 0.1;
    ck.activation_checkpointing = true;
    EXPECT_NE(error_of([&] {
                  Trainer(Policy::load(tmp / "m"), ck);
              }).find("need trainer.activation_checkpointing off"),
              std::string::npos);
}

// -- the tiny-moe preset ----------------------------------------------------------

TEST(TinyMoe, PresetIsAQwen3MoeAndUnknownPresetsAreNamed) {
    const TinyModelSpec s = tiny_preset_spec("tiny-moe");
    const ModelConfig c = ModelConfig::parse(tiny_config_json(s));
    EXPECT_EQ(c.architecture, Architecture::Qwen3Moe);
    EXPECT_EQ(c.num_experts, 8);
    EXPECT_EQ(c.num_experts_per_tok, 2);
    EXPECT_TRUE(c.has_moe());
    EXPECT_FALSE(ModelConfig::parse(tiny_config_json(tiny_preset_spec("tiny"))).has_moe());
    EXPECT_NE(error_of([] { tiny_preset_spec("huge"); }).find("valid: tiny, tiny-moe"),
              std::string::npos);
}

TEST(TinyMoe, TrainingLowersTheLoss) {
    TempDir tmp;
    auto policy = small_moe_policy(tmp / "m", 1);
    TrainerConfig tc;
    tc.learning_rate = 3e-3;
    Trainer t(policy, tc);
    const TrainBatch batch = batch_of({{'a', 'b', 'c', 'a', 'b', 'c', 'a', 'b', 'c'},
                                       {'h', 'e', 'l', 'l', 'o', ' ', 'm', 'o', 'e'},
                                       {'x', 'y', 'z'}});
    const LossFunction nll = nll_loss();
    std::vector<double> losses;
    for (int i = 0; i < 8; ++i) {
        losses.push_back(t.forward_backward(batch, nll).loss);
        t.optim_step();
    }
    EXPECT_LT(losses.back(), 0.7 * losses.front())
        << "first " << losses.front() << " last " << losses.back();
}

TEST(TinyMoe, EngineGeneratesTheTokensAStepByStepRecomputePicks) {
    TempDir tmp;
    auto policy = small_moe_policy(tmp / "m", 2);
    {
        at::NoGradGuard g; // routers that pick clearly
        for (auto &[name, p] : policy->model().named_weights())
            if (name.find("mlp.gate.weight") != std::string::npos) p.mul_(20.0);
    }
    Engine e(policy);
    SamplingParams sp;
    sp.temperature = 0.0;
    sp.max_tokens = 10;
    sp.stop_token_ids = std::vector<int64_t>{};
    const std::vector<std::vector<int64_t>> prompts{{'t', 'h', 'e', ' '}, {'m', 'o'}};
    const Generation g = e.generate(prompts, sp);
    ASSERT_EQ(g.samples(), 2);
    CausalLM &m = policy->model();
    for (int64_t s = 0; s < 2; ++s) {
        std::vector<int64_t> ids = prompts[static_cast<size_t>(s)];
        for (int64_t i = g.cu_seqlens[s]; i < g.cu_seqlens[s + 1]; ++i) {
            at::NoGradGuard ng;
            const at::Tensor logits = m.logits(PackedBatch::from_sequences({ids}));
            const int64_t want =
                logits[static_cast<int64_t>(ids.size()) - 1].argmax().item<int64_t>();
            ASSERT_EQ(g.token_ids[static_cast<size_t>(i)], want)
                << "sample " << s << " token " << i - g.cu_seqlens[s];
            ids.push_back(want);
        }
        EXPECT_EQ(g.cu_seqlens[s + 1] - g.cu_seqlens[s], 10);
    }
}

TEST(TinyMoe, LoraOnTheAttentionAloneLeavesTheExpertsUnadapted) {
    // Expert adapters: tests/lora/lora_moe_test.cpp.
    TempDir tmp;
    auto policy = small_moe_policy(tmp / "m", 4);
    LoraConfig lc;
    lc.rank = 2;
    lc.target_modules = {"q_proj", "v_proj"};
    auto a = policy->create_adapter("b", lc);
    EXPECT_EQ(a->named_parameters().size(), 2u * 2u * 2u);
    for (int64_t e = 0; e < 8; ++e) EXPECT_EQ(a->find_expert(0, e, LoraTarget::Gate), nullptr);
    Trainer t(policy, TrainerConfig{}, a);
    EXPECT_TRUE(
        std::isfinite(t.forward_backward(batch_of({{'a', 'b', 'c', 'd'}}), nll_loss()).loss));
}

// -- routing replay (R3) ------------------------------------------------------------

namespace {

// The routing `m` chooses for `batch` now: [T, L_moe, K] expert ids (the top-k
// of each sparse layer's router softmax) and the router logits [T, L_moe, E].
std::pair<at::Tensor, at::Tensor> routing_of(CausalLM &m, const TrainBatch &batch) {
    at::NoGradGuard g;
    RouterLogitsRecorder rec;
    PackedBatch pb;
    pb.input_ids = batch.input_ids;
    pb.cu_seqlens = at::tensor(batch.cu_seqlens, at::kLong);
    m.logits(pb);
    std::vector<at::Tensor> ids, logits;
    for (const at::Tensor &l : rec.logits()) {
        logits.push_back(l.to(at::kDouble));
        ids.push_back(std::get<1>(
            at::topk(at::softmax(l, -1, at::kFloat), m.config().num_experts_per_tok, -1)));
    }
    return {at::stack(ids, 1), at::stack(logits, 1)};
}

at::Tensor logprobs_of(Trainer &t, const TrainBatch &batch) {
    return t.forward(batch, nullptr).tensors.at("logprobs").to(at::kDouble);
}

} // namespace

TEST(MoeReplay, ReplayedRoutingKeepsTheRecordedLogprobsWhenTheRouterFlipsSomeTokens) {
    TempDir tmp;
    auto policy = small_moe_policy(tmp / "m", 5); // norm_topk_prob, 2 sparse layers
    CausalLM &m = policy->model();
    Trainer t(policy, TrainerConfig{});
    TrainBatch batch = batch_of(random_seqs({14, 9, 11}, 256, 21));
    const int64_t T = batch.input_ids.size(0);

    // The rollout: its routing and logprobs.
    const auto [recorded, logits] = routing_of(m, batch);
    const at::Tensor lp0 = logprobs_of(t, batch);

    ASSERT_TRUE(flip_some_in_the_last_layer(m, recorded, logits));

    // Which tokens the moved router now routes elsewhere (as sets of experts).
    const at::Tensor now = routing_of(m, batch).first;
    const at::Tensor flipped =
        (std::get<0>(at::sort(now, -1)) != std::get<0>(at::sort(recorded, -1)))
            .any(-1)
            .any(-1); // [T]
    const int64_t n_flipped = flipped.sum().item<int64_t>();
    ASSERT_GE(n_flipped, 1);
    ASSERT_LT(n_flipped, T);
    // The first layer routes as recorded: only the last layer flipped.
    ASSERT_TRUE(at::equal(std::get<0>(at::sort(now.select(1, 0), -1)),
                          std::get<0>(at::sort(recorded.select(1, 0), -1))));

    // Replayed: every logprob is the recorded one.
    TrainBatch replayed = batch;
    replayed.tensors["routed_experts"] = recorded;
    const at::Tensor lp_replay = logprobs_of(t, replayed);
    EXPECT_LT((lp_replay - lp0).abs().max().item<double>(), 1e-6);

    // Routing itself: the logprob scored at a flipped token (of the next
    // token of its sequence) moves, and only those.
    const at::Tensor lp_self = logprobs_of(t, batch);
    std::vector<uint8_t> scored_at_flip(static_cast<size_t>(T), 0);
    for (size_t s = 0; s + 1 < batch.cu_seqlens.size(); ++s)
        for (int64_t i = batch.cu_seqlens[s]; i + 1 < batch.cu_seqlens[s + 1]; ++i)
            scored_at_flip[static_cast<size_t>(i + 1)] = flipped[i].item<bool>() ? 1 : 0;
    int64_t moved = 0;
    for (int64_t i = 0; i < T; ++i) {
        const double d = std::abs(lp_self[i].item<double>() - lp0[i].item<double>());
        if (scored_at_flip[static_cast<size_t>(i)]) {
            EXPECT_GT(d, 1e-4) << "token " << i << " was routed elsewhere";
            ++moved;
        } else {
            EXPECT_LT(d, 1e-5) << "token " << i << " kept its routing";
        }
    }
    EXPECT_GE(moved, 1);

    // A row of -1 routes itself: all -1 is the unreplayed forward.
    replayed.tensors["routed_experts"] = at::full_like(recorded, -1);
    EXPECT_LT((logprobs_of(t, replayed) - lp_self).abs().max().item<double>(), 1e-6);
}

// Recorded routing weights (RoutingWeightsScope, xorl's routed_expert_logits):
// the model's own weights replayed with its own ids give its own logits; the
// weights are taken as given (doubled, the logits move: nothing renormalizes
// them) and are constants (the routers get no gradient through them, while
// an ids-only replay trains them); weights without ids, of another shape or
// not finite are refused naming the tensor.
TEST(MoeReplay, RecordedWeightsMixTheReplayedExpertsAsGivenWithNoGradientToTheRouter) {
    for (const std::string arch : {"qwen3_moe", "qwen2_moe"}) {
        SCOPED_TRACE(arch);
        auto m = make_model(moe_config(arch), 4);
        const PackedBatch pb = PackedBatch::from_sequences(random_seqs({7, 5}, 97, 3));
        const int64_t K = m->config().num_experts_per_tok;
        at::Tensor ids, w, base;
        {
            at::NoGradGuard g;
            RouterLogitsRecorder rec;
            base = m->logits(pb);
            ids = routed_experts_of(rec.logits(), K);
            w = routed_expert_weights_of(rec.logits(), K, m->config().norm_topk_prob);
        }
        auto replayed = [&](const at::Tensor &weights) {
            at::NoGradGuard g;
            RoutingReplayScope r(ids);
            RoutingWeightsScope s(weights);
            return m->logits(pb);
        };
        EXPECT_LT((replayed(w) - base).abs().max().item<double>(), 1e-5);
        EXPECT_GT((replayed(w * 2) - base).abs().max().item<double>(), 1e-3);

        // Gradients: none reach a router through recorded weights.
        auto gate_grad = [&](bool with_weights) {
            for (auto &p : m->parameters()) p.mutable_grad() = at::Tensor();
            {
                RoutingReplayScope r(ids);
                std::optional<RoutingWeightsScope> s;
                if (with_weights) s.emplace(w);
                m->logits(pb).logsumexp(-1).sum().backward();
            }
            double total = 0;
            for (const auto &layer : m->model->layers) {
                const at::Tensor &g = layer->moe->gate->weight.grad();
                if (g.defined()) total += g.abs().sum().item<double>();
            }
            return total;
        };
        EXPECT_EQ(gate_grad(true), 0.0);
        EXPECT_GT(gate_grad(false), 0.0);

        // Refusals name the tensor.
        at::NoGradGuard g;
        {
            RoutingWeightsScope s(w);
            EXPECT_NE(test::error_of([&] { m->logits(pb); }).find("need the routed experts"),
                      std::string::npos);
        }
        EXPECT_NE(test::error_of([&] {
                      replayed(w.narrow(0, 0, 3));
                  }).find("must have the shape of routed_experts"),
                  std::string::npos);
        at::Tensor bad = w.clone();
        bad[4][1][0] = std::numeric_limits<float>::infinity();
        EXPECT_NE(test::error_of([&] {
                      replayed(bad);
                  }).find("at token 4, sparse layer 1, slot 0: inf is not a finite weight"),
                  std::string::npos);
    }
}

TEST(MoeReplay, ReplayedRoutingReachesTheGradientsUnderActivationCheckpointing) {
    TempDir tmp;
    write_tiny_model(tmp / "m", 6, small_moe_spec());
    const TrainBatch batch = batch_of(random_seqs({10, 7}, 256, 3));
    auto policy = Policy::load(tmp / "m");
    const at::Tensor recorded = routing_of(policy->model(), batch).first;
    // A routing the router would not choose: each token's experts shifted by one.
    TrainBatch replayed = batch;
    replayed.tensors["routed_experts"] = (recorded + 1) % policy->model().config().num_experts;
    auto grads = [&](bool checkpointing, const TrainBatch &b) {
        auto p = Policy::load(tmp / "m");
        TrainerConfig tc;
        tc.activation_checkpointing = checkpointing;
        Trainer t(p, tc);
        t.forward_backward(b, nll_loss());
        return p->model().model->layers[0]->moe->gate->weight.grad().clone();
    };
    const at::Tensor plain = grads(false, replayed);
    EXPECT_LT((grads(true, replayed) - plain).abs().max().item<double>(), 1e-6);
    EXPECT_GT((grads(false, batch) - plain).abs().max().item<double>(), 1e-6);
}

TEST(MoeReplay, BadRoutedExpertsAreRefusedNamingTheTensorLayerAndToken) {
    TempDir tmp;
    auto policy = small_moe_policy(tmp / "m", 7);
    Trainer t(policy, TrainerConfig{});
    TrainBatch batch = batch_of(random_seqs({6, 4}, 256, 8));
    const at::Tensor good = routing_of(policy->model(), batch).first; // [10, 2, 2]
    auto refusal = [&](const at::Tensor &routed) {
        TrainBatch b = batch;
        b.tensors["routed_experts"] = routed;
        return error_of([&] { t.forward_backward(b, nll_loss()); });
    };
    EXPECT_NE(refusal(good.narrow(0, 0, 9))
                  .find("'routed_experts' must be [10, 2, 2] (tokens, "
                        "sparse layers, experts per token), got [9, 2, 2]"),
              std::string::npos);
    EXPECT_NE(refusal(good.reshape({10, 4})).find("got [10, 4]"), std::string::npos);
    EXPECT_NE(refusal(good.to(at::kFloat)).find("must hold integer expert ids"), std::string::npos);
    at::Tensor bad = good.clone();
    bad[7][1][0] = 8;
    EXPECT_NE(refusal(bad).find("'routed_experts' at token 7, sparse layer 1 (decoder layer 1): "
                                "expert id 8 is outside [0, 8)"),
              std::string::npos);
    bad = good.clone();
    bad[3][0][1] = -1;
    EXPECT_NE(refusal(bad).find("at token 3, sparse layer 0 (decoder layer 0): expert id -1"),
              std::string::npos);
    bad = good.clone();
    bad[2][1][1] = bad[2][1][0].item<int64_t>();
    EXPECT_NE(refusal(bad).find("at token 2, sparse layer 1 (decoder layer 1): expert " +
                                std::to_string(bad[2][1][0].item<int64_t>()) + " is named twice"),
              std::string::npos);
    bad = good.clone();
    bad[4][0][0] = -1;
    EXPECT_NE(refusal(bad).find("a row that starts with -1 (route yourself) must be all -1"),
              std::string::npos);

    // A dense model has nothing to replay.
    write_tiny_model(tmp / "d", 7, test::small_tiny_spec(2));
    Trainer dense(Policy::load(tmp / "d"), TrainerConfig{});
    TrainBatch b = batch;
    b.tensors["routed_experts"] = good;
    EXPECT_NE(error_of([&] { dense.forward_backward(b, nll_loss()); })
                  .find("'routed_experts' replays a mixture-of-experts routing but the model has "
                        "no sparse MoE layer"),
              std::string::npos);
}

TEST(MoeReplay, EngineRecordsTheRoutingThatGivesItsLogprobsBackAfterARouterChange) {
    TempDir tmp;
    auto policy = small_moe_policy(tmp / "m", 11);
    CausalLM &m = policy->model();
    const int64_t L = 2, K = m.config().num_experts_per_tok;
    Engine engine(policy);
    SamplingParams sp;
    sp.temperature = 1.0;
    sp.max_tokens = 8;
    sp.n = 2;
    sp.stop_token_ids = std::vector<int64_t>{};
    sp.return_routed_experts = true;
    const std::vector<std::vector<int64_t>> prompts{{'t', 'h', 'e', ' '}, {'m', 'o', 'e'}};
    const Generation g = engine.generate(prompts, sp);
    ASSERT_EQ(g.routed_layers, L);
    ASSERT_EQ(g.routed_k, K);

    // The rollouts as a batch: prompt + completion per sample, the recorded
    // routing of every token, the engine's logprobs at the completion tokens.
    std::vector<std::vector<int64_t>> seqs;
    std::vector<int64_t> completion_row; // batch row of each completion token
    for (int64_t s = 0; s < g.samples(); ++s) {
        std::vector<int64_t> seq = prompts[static_cast<size_t>(g.prompt_index[s])];
        int64_t start = 0;
        for (const auto &q : seqs) start += static_cast<int64_t>(q.size());
        for (int64_t i = g.cu_seqlens[s]; i < g.cu_seqlens[s + 1]; ++i) {
            completion_row.push_back(start + static_cast<int64_t>(seq.size()));
            seq.push_back(g.token_ids[static_cast<size_t>(i)]);
        }
        seqs.push_back(seq);
    }
    TrainBatch batch = batch_of(seqs);
    batch.sampling_temperature = 1.0;
    const int64_t T = batch.input_ids.size(0);
    ASSERT_EQ(static_cast<int64_t>(g.routed_experts.size()), T * L * K);
    const at::Tensor recorded = at::tensor(g.routed_experts, at::kLong).view({T, L, K});
    const at::Tensor engine_lp = at::tensor(g.logprobs, at::kFloat).to(at::kDouble);
    const at::Tensor rows = at::tensor(completion_row, at::kLong);

    // What the engine recorded is what the packed forward routes (as sets),
    // but for the last token of each sample, which the engine never read (-1).
    const auto [own, logits] = routing_of(m, batch);
    const at::Tensor unread = recorded.select(2, 0).select(1, 0).lt(0);
    for (size_t s = 1; s < batch.cu_seqlens.size(); ++s)
        EXPECT_TRUE(unread[batch.cu_seqlens[s] - 1].item<bool>()) << "sample " << s - 1;
    EXPECT_EQ(unread.sum().item<int64_t>(), g.samples());
    const at::Tensor read = unread.logical_not();
    EXPECT_TRUE(at::equal(std::get<0>(at::sort(recorded.index({read}), -1)),
                          std::get<0>(at::sort(own.index({read}), -1))));

    Trainer t(policy, TrainerConfig{});
    TrainBatch replayed = batch;
    replayed.tensors["routed_experts"] = recorded;
    EXPECT_LT(
        (logprobs_of(t, replayed).index_select(0, rows) - engine_lp).abs().max().item<double>(),
        1e-4);

    // After a router change that routes some tokens elsewhere, replay still
    // gives the engine's logprobs; routing itself moves those scored at them.
    at::Tensor before_completion = at::zeros({T}, at::kBool);
    for (int64_t r : completion_row) before_completion[r - 1] = true;
    ASSERT_TRUE(flip_some_in_the_last_layer(m, own, logits, before_completion));
    const at::Tensor now = routing_of(m, batch).first;
    const at::Tensor flipped =
        (std::get<0>(at::sort(now, -1)) != std::get<0>(at::sort(own, -1))).any(-1).any(-1);
    int64_t flipped_before_completion = 0;
    for (int64_t r : completion_row) flipped_before_completion += flipped[r - 1].item<bool>();
    ASSERT_GE(flipped_before_completion, 1);
    EXPECT_LT(
        (logprobs_of(t, replayed).index_select(0, rows) - engine_lp).abs().max().item<double>(),
        1e-4);
    const at::Tensor self_lp = logprobs_of(t, batch).index_select(0, rows);
    for (size_t i = 0; i < completion_row.size(); ++i) {
        const double d = std::abs(self_lp[static_cast<int64_t>(i)].item<double>() -
                                  engine_lp[static_cast<int64_t>(i)].item<double>());
        if (flipped[completion_row[i] - 1].item<bool>())
            EXPECT_GT(d, 1e-4) << "completion token " << i << " is scored at a flipped token";
        else
            EXPECT_LT(d, 1e-4) << "completion token " << i;
    }
}

namespace {

// Multi-turn episodes for the R3 tests: turns end at one of many stop ids or
// max_tokens (so they differ in length and a step decodes some episodes while
// it appends the observations of others); every turn is answered with a short
// observation whose length depends on the episode and turn, except that
// episode 1 is done after its first turn.
struct RecordedEpisodes {
    Episodes eps;
    TrainBatch batch;                 ///< prompt + tokens per episode
    at::Tensor recorded;              ///< the episodes' routing [T, L_moe, K]
    std::vector<int64_t> sampled_row; ///< the batch row of every sampled token
    at::Tensor engine_lp;             ///< their sampling logprobs (float64)
};

RecordedEpisodes record_episodes(Engine &engine, const std::vector<std::vector<int64_t>> &prompts,
                                 uint64_t seed, int64_t max_tokens, int64_t max_turns) {
    SamplingParams sp;
    sp.temperature = 1.0;
    sp.max_tokens = max_tokens;
    sp.n = 2;
    sp.seed = seed;
    std::vector<int64_t> stops;
    for (int64_t t = 0; t < 90; ++t) stops.push_back(t);
    sp.stop_token_ids = stops;
    sp.return_routed_experts = true;
    EpisodeOptions eo;
    eo.max_turns = max_turns;
    RecordedEpisodes r;
    r.eps = engine.generate_episodes(prompts, sp, eo, [](const TurnEnd &te) {
        TurnReply reply;
        if (te.episode == 1) {
            reply.done = true;
            return reply;
        }
        const std::string obs =
            "\n" + std::string(static_cast<size_t>(1 + (te.episode + te.turn) % 3), 'o') + ":";
        reply.observation.assign(obs.begin(), obs.end());
        return reply;
    });
    std::vector<std::vector<int64_t>> seqs;
    std::vector<int64_t> routed;
    std::vector<float> lp;
    int64_t start = 0;
    for (size_t s = 0; s < r.eps.episodes.size(); ++s) {
        const Episode &e = r.eps.episodes[s];
        std::vector<int64_t> seq = prompts[static_cast<size_t>(r.eps.prompt_index[s])];
        const int64_t prompt_len = static_cast<int64_t>(seq.size());
        seq.insert(seq.end(), e.tokens.begin(), e.tokens.end());
        for (size_t i = 0; i < e.tokens.size(); ++i)
            if (e.mask[i] != 0) {
                r.sampled_row.push_back(start + prompt_len + static_cast<int64_t>(i));
                lp.push_back(e.logprobs[i]);
            }
        routed.insert(routed.end(), e.routed_experts.begin(), e.routed_experts.end());
        start += static_cast<int64_t>(seq.size());
        seqs.push_back(std::move(seq));
    }
    r.batch = batch_of(seqs);
    r.batch.sampling_temperature = 1.0;
    r.recorded = at::tensor(routed, at::kLong);
    r.engine_lp = at::tensor(lp, at::kFloat).to(at::kDouble);
    return r;
}

} // namespace

TEST(MoeReplay, EpisodesRecordTheRoutingOfOnePackedForwardOverTheirWholeSequence) {
    TempDir tmp;
    auto policy = small_moe_policy(tmp / "m", 14);
    CausalLM &m = policy->model();
    const int64_t L = 2, K = m.config().num_experts_per_tok;
    Engine engine(policy);
    const std::vector<std::vector<int64_t>> prompts{{'t', 'h', 'e', ' '}, {'m', 'o', 'e'}};
    RecordedEpisodes r = record_episodes(engine, prompts, 5, 4, 3);
    ASSERT_EQ(r.eps.routed_layers, L);
    ASSERT_EQ(r.eps.routed_k, K);
    const int64_t T = r.batch.input_ids.size(0);
    ASSERT_EQ(r.recorded.numel(), T * L * K);
    const at::Tensor recorded = r.recorded.view({T, L, K});

    // Episodes that went on after an observation, with turns of different
    // lengths: some step appended an episode's observation while it decoded
    // another (the sampled count at which a turn ended in one episode, and
    // another went on past it without a turn end there).
    std::vector<std::set<int64_t>> turn_ends(r.eps.episodes.size());
    std::vector<int64_t> sampled(r.eps.episodes.size(), 0);
    int64_t observed = 0;
    for (size_t s = 0; s < r.eps.episodes.size(); ++s) {
        const Episode &e = r.eps.episodes[s];
        for (size_t i = 0; i < e.tokens.size(); ++i) {
            sampled[s] += e.mask[i];
            if (i > 0 && e.mask[i] == 0 && e.mask[i - 1] != 0) turn_ends[s].insert(sampled[s]);
            observed += e.mask[i] == 0;
        }
    }
    ASSERT_GE(observed, 3) << "no episode got an observation";
    bool mixed = false;
    for (size_t a = 0; a < turn_ends.size(); ++a)
        for (int64_t v : turn_ends[a])
            for (size_t b = 0; b < turn_ends.size(); ++b)
                mixed = mixed || (b != a && sampled[b] > v && !turn_ends[b].count(v));
    ASSERT_TRUE(mixed) << "every step either decoded all episodes or appended to all";

    // Every token but each episode's last was read; their ids are what one
    // packed forward over the episode's whole sequence routes.
    const auto [own, logits] = routing_of(m, r.batch);
    const at::Tensor unread = recorded.select(2, 0).select(1, 0).lt(0);
    for (size_t s = 1; s < r.batch.cu_seqlens.size(); ++s)
        EXPECT_TRUE(unread[r.batch.cu_seqlens[s] - 1].item<bool>()) << "episode " << s - 1;
    EXPECT_EQ(unread.sum().item<int64_t>(), static_cast<int64_t>(r.eps.episodes.size()));
    EXPECT_TRUE(recorded.index({unread}).eq(-1).all().item<bool>());
    const at::Tensor read = unread.logical_not();
    EXPECT_TRUE(recorded.index({read}).ge(0).all().item<bool>());
    EXPECT_TRUE(at::equal(std::get<0>(at::sort(recorded.index({read}), -1)),
                          std::get<0>(at::sort(own.index({read}), -1))));
}

TEST(MoeReplay, ReplayedEpisodeRoutingGivesTheEngineLogprobsBackAfterARouterChange) {
    TempDir tmp;
    auto policy = small_moe_policy(tmp / "m", 15);
    CausalLM &m = policy->model();
    const int64_t K = m.config().num_experts_per_tok;
    Engine engine(policy);
    const std::vector<std::vector<int64_t>> prompts{{'a', 'b'}, {'x', 'y', 'z'}};
    RecordedEpisodes r = record_episodes(engine, prompts, 3, 3, 2);
    const int64_t T = r.batch.input_ids.size(0);
    const at::Tensor recorded = r.recorded.view({T, -1, K});
    const at::Tensor rows = at::tensor(r.sampled_row, at::kLong);

    Trainer t(policy, TrainerConfig{});
    TrainBatch replayed = r.batch;
    replayed.tensors["routed_experts"] = recorded;
    EXPECT_LT(
        (logprobs_of(t, replayed).index_select(0, rows) - r.engine_lp).abs().max().item<double>(),
        1e-4);

    // A router change that routes some tokens elsewhere, aimed at tokens
    // read right before a sampled token (turn starts after an observation included).
    const auto [own, logits] = routing_of(m, r.batch);
    at::Tensor before_sampled = at::zeros({T}, at::kBool);
    for (int64_t row : r.sampled_row) before_sampled[row - 1] = true;
    ASSERT_TRUE(flip_some_in_the_last_layer(m, own, logits, before_sampled));
    const at::Tensor now = routing_of(m, r.batch).first;
    const at::Tensor flipped =
        (std::get<0>(at::sort(now, -1)) != std::get<0>(at::sort(own, -1))).any(-1).any(-1);
    int64_t flipped_before_sampled = 0;
    for (int64_t row : r.sampled_row) flipped_before_sampled += flipped[row - 1].item<bool>();
    ASSERT_GE(flipped_before_sampled, 1);
    // Routing itself now differs from the recording at the flipped tokens.
    for (int64_t i = 0; i < T; ++i) {
        if (flipped[i].item<bool>()) {
            EXPECT_FALSE(at::equal(std::get<0>(at::sort(now[i], -1)),
                                   std::get<0>(at::sort(recorded[i], -1))))
                << "token " << i;
        }
    }

    // Replayed: the engine's logprobs still; routed itself: those scored at
    // a flipped token move (a flip at a near tie moves little: the largest
    // move is checked), the others stay.
    EXPECT_LT(
        (logprobs_of(t, replayed).index_select(0, rows) - r.engine_lp).abs().max().item<double>(),
        1e-4);
    const at::Tensor self_lp = logprobs_of(t, r.batch).index_select(0, rows);
    double flipped_moved = 0;
    for (size_t i = 0; i < r.sampled_row.size(); ++i) {
        const double d = std::abs(self_lp[static_cast<int64_t>(i)].item<double>() -
                                  r.engine_lp[static_cast<int64_t>(i)].item<double>());
        if (flipped[r.sampled_row[i] - 1].item<bool>())
            flipped_moved = std::max(flipped_moved, d);
        else
            EXPECT_LT(d, 1e-4) << "sampled token " << i;
    }
    EXPECT_GT(flipped_moved, 1e-4);
}

TEST(MoeReplay, TheServingSchedulerRecordsTheRoutingsEngineGenerateRecords) {
    TempDir tmp;
    auto policy = small_moe_policy(tmp / "m", 13);
    const int64_t L = 2, K = policy->model().config().num_experts_per_tok;
    SamplingParams sp;
    sp.temperature = 1.0;
    sp.max_tokens = 7;
    sp.seed = 3;
    sp.stop_token_ids = std::vector<int64_t>{};
    sp.return_routed_experts = true;
    const std::vector<std::vector<int64_t>> prompts{{'r', 'o', 'u', 't', 'e'}, {'x', 'y'}};
    Scheduler scheduler(policy);
    std::vector<std::promise<RequestResult>> done(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) { // both run in the same steps
        ServeRequest request;
        request.prompt = prompts[i];
        request.params = sp;
        request.on_done = [&done, i](RequestResult r) { done[i].set_value(std::move(r)); };
        scheduler.submit(std::move(request));
    }
    Engine engine(policy);
    for (size_t i = 0; i < prompts.size(); ++i) {
        const RequestResult r = done[i].get_future().get();
        const Generation g = engine.generate({prompts[i]}, sp);
        ASSERT_EQ(r.tokens, g.token_ids) << "prompt " << i;
        EXPECT_EQ(r.routed_layers, L);
        EXPECT_EQ(r.routed_k, K);
        ASSERT_EQ(r.routed_experts.size(), (prompts[i].size() + r.tokens.size()) * L * K);
        EXPECT_EQ(std::vector<int64_t>(r.routed_experts.begin(), r.routed_experts.end()),
                  g.routed_experts)
            << "prompt " << i;
    }
    // Not asked: nothing recorded.
    std::promise<RequestResult> plain;
    ServeRequest request;
    request.prompt = prompts[0];
    request.params = sp;
    request.params.return_routed_experts = false;
    request.on_done = [&plain](RequestResult r) { plain.set_value(std::move(r)); };
    scheduler.submit(std::move(request));
    EXPECT_TRUE(plain.get_future().get().routed_experts.empty());
}

TEST(MoeReplay, RecordingRoutingsIsRefusedWhereItIsNotSupported) {
    TempDir tmp;
    write_tiny_model(tmp / "d", 12, test::small_tiny_spec(2));
    Engine dense(Policy::load(tmp / "d"));
    SamplingParams sp;
    sp.max_tokens = 2;
    sp.return_routed_experts = true;
    EXPECT_NE(error_of([&] {
                  dense.generate({{'a', 'b'}}, sp);
              }).find("generate: return_routed_experts: the model has no sparse MoE layer"),
              std::string::npos);
    Scheduler dense_scheduler(Policy::load(tmp / "d"));
    ServeRequest dense_request;
    dense_request.prompt = {'a', 'b'};
    dense_request.params = sp;
    EXPECT_NE(error_of([&] {
                  dense_scheduler.submit(dense_request);
              }).find("return_routed_experts: the model has no sparse MoE layer"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  dense.generate_episodes({{'a', 'b'}}, sp, EpisodeOptions{}, [](const TurnEnd &) {
                      return TurnReply{true, {}, {}};
                  });
              })
                  .find("generate_episodes: return_routed_experts: the model has no sparse MoE "
                        "layer"),
              std::string::npos);
    EXPECT_TRUE(
        SamplingParams::from_json(R"({"return_routed_experts": true})").return_routed_experts);
    EXPECT_NE(error_of([] {
                  SamplingParams::from_json(R"({"return_routed_experts": 1})");
              }).find("return_routed_experts must be true or false"),
              std::string::npos);
    // The routing weights (return_expert_logits): with the ids only; episodes
    // record them too, in the layout of their ids.
    EXPECT_TRUE(SamplingParams::from_json(
                    R"({"return_routed_experts": true, "return_expert_logits": true})")
                    .return_expert_logits);
    EXPECT_NE(error_of([] { SamplingParams::from_json(R"({"return_expert_logits": true})"); })
                  .find("return_expert_logits records the weights of the routed experts: it needs "
                        "return_routed_experts"),
              std::string::npos);
    write_tiny_model(tmp / "moe", 12, small_moe_spec());
    Engine moe(Policy::load(tmp / "moe"));
    sp.return_expert_logits = true;
    const Episodes eps =
        moe.generate_episodes({{'a', 'b'}}, sp, EpisodeOptions{}, [](const TurnEnd &) {
            return TurnReply{true, {}, {}};
        });
    for (const Episode &e : eps.episodes) {
        ASSERT_FALSE(e.routed_experts.empty());
        ASSERT_EQ(e.routed_expert_weights.size(), e.routed_experts.size());
        for (size_t i = 0; i < e.routed_experts.size(); ++i)
            EXPECT_EQ(e.routed_expert_weights[i] > 0.0f, e.routed_experts[i] >= 0) << i;
    }
}
