// The transformer: packed vs per-sequence forward, chunked logprobs and their
// gradients, KV-cache decoding, save / load, the tiny preset.
#include "rl/core/error.hpp"
#include "rl/core/model.hpp"
#include "rl/core/pretrained.hpp"
#include "rl/core/safetensors.hpp"
#include "rl/core/tensor_io.hpp"
#include "rl/core/tiny.hpp"
#include "rl/core/tokenizer.hpp"
#include "test_util.hpp"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <random>
#include <set>

namespace rl::core {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using test::error_of;
using test::TempDir;

Json small_config(const std::string &arch) {
    Json j{{"vocab_size", 97},       {"hidden_size", 48},        {"intermediate_size", 80},
           {"num_hidden_layers", 2}, {"num_attention_heads", 6}, {"num_key_value_heads", 2},
           {"rms_norm_eps", 1e-6},   {"rope_theta", 10000.0},    {"tie_word_embeddings", false}};
    if (arch == "qwen3") {
        j["architectures"] = {"Qwen3ForCausalLM"};
        j["head_dim"] = 16;
    } else if (arch == "qwen2") {
        j["architectures"] = {"Qwen2ForCausalLM"};
        j["tie_word_embeddings"] = true;
    } else {
        j["architectures"] = {"LlamaForCausalLM"};
        j["rope_scaling"] = {{"rope_type", "llama3"},
                             {"factor", 4.0},
                             {"low_freq_factor", 1.0},
                             {"high_freq_factor", 4.0},
                             {"original_max_position_embeddings", 32}};
    }
    return j;
}

std::shared_ptr<CausalLM> make_model(const std::string &arch, uint64_t seed = 1,
                                     at::ScalarType dtype = at::kFloat) {
    auto m = std::make_shared<CausalLM>(ModelConfig::parse(small_config(arch).dump(), arch),
                                        ModelOptions{dtype, at::kCPU});
    // A larger init than 0.02 so that logits are far from uniform.
    m->init_weights(seed, 0.2);
    return m;
}

std::vector<std::vector<int64_t>> random_seqs(const std::vector<int64_t> &lens, int64_t vocab,
                                              uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<std::vector<int64_t>> out;
    for (int64_t len : lens) {
        std::vector<int64_t> s;
        for (int64_t i = 0; i < len; ++i) s.push_back(static_cast<int64_t>(rng() % vocab));
        out.push_back(s);
    }
    return out;
}

// Next-token labels per sequence; the last token of each sequence is ignored.
at::Tensor next_labels(const std::vector<std::vector<int64_t>> &seqs) {
    std::vector<int64_t> l;
    for (const auto &s : seqs) {
        for (size_t i = 0; i + 1 < s.size(); ++i) l.push_back(s[i + 1]);
        l.push_back(-100);
    }
    return at::tensor(l, at::kLong);
}

class PerArchitecture : public ::testing::TestWithParam<std::string> {};

TEST_P(PerArchitecture, PackedForwardEqualsPerSequenceForward) {
    auto m = make_model(GetParam());
    // Mixed lengths: several padding groups, a single token, equal lengths.
    const auto seqs = random_seqs({5, 17, 1, 9, 17, 3, 40, 2}, 97, 7);
    const PackedBatch packed = PackedBatch::from_sequences(seqs);
    at::NoGradGuard no_grad;
    TokenLogprobs all = m->token_logprobs(packed, next_labels(seqs), {});
    at::Tensor all_logits = m->logits(packed);
    int64_t offset = 0;
    for (const auto &s : seqs) {
        const PackedBatch one = PackedBatch::from_sequences({s});
        TokenLogprobs lp = m->token_logprobs(one, next_labels({s}), {});
        const int64_t n = static_cast<int64_t>(s.size());
        EXPECT_LT((all.logprobs.narrow(0, offset, n) - lp.logprobs).abs().max().item<float>(),
                  1e-5);
        EXPECT_LT((all_logits.narrow(0, offset, n) - m->logits(one)).abs().max().item<float>(),
                  1e-5);
        offset += n;
    }
}

TEST_P(PerArchitecture, KVCacheDecodeEqualsPackedForwardLogits) {
    auto m = make_model(GetParam(), 3);
    const auto seqs = random_seqs({6, 11, 3}, 97, 11);
    const int64_t prompt_len[] = {2, 7, 3};
    KVCache cache = m->make_cache(/*slots=*/5, /*capacity=*/4); // grows while decoding
    const std::vector<int64_t> slots = {4, 0, 2};               // non-consecutive
    std::vector<std::vector<int64_t>> prompts;
    for (size_t i = 0; i < seqs.size(); ++i)
        prompts.emplace_back(seqs[i].begin(), seqs[i].begin() + prompt_len[i]);
    at::Tensor last = m->prefill(cache, slots, prompts);
    at::Tensor full;
    {
        at::NoGradGuard g;
        full = m->logits(PackedBatch::from_sequences(seqs));
    }
    std::vector<int64_t> starts = {0, 6, 17};
    for (size_t i = 0; i < seqs.size(); ++i) {
        EXPECT_EQ(cache.length(slots[i]), prompt_len[i]);
        at::Tensor ref = full[starts[i] + prompt_len[i] - 1];
        EXPECT_LT((last[static_cast<int64_t>(i)] - ref).abs().max().item<float>(), 1e-4) << i;
    }
    // Decode the rest one token per step, dropping sequences as they end.
    for (int64_t step = 0;; ++step) {
        std::vector<int64_t> active, toks, idx;
        for (size_t i = 0; i < seqs.size(); ++i) {
            const int64_t pos = prompt_len[i] + step;
            if (pos < static_cast<int64_t>(seqs[i].size())) {
                active.push_back(slots[i]);
                toks.push_back(seqs[i][pos]);
                idx.push_back(static_cast<int64_t>(i));
            }
        }
        if (active.empty()) break;
        at::Tensor logits = m->decode(cache, active, at::tensor(toks, at::kLong));
        for (size_t k = 0; k < idx.size(); ++k) {
            const int64_t i = idx[k];
            at::Tensor ref = full[starts[i] + prompt_len[i] + step];
            EXPECT_LT((logits[static_cast<int64_t>(k)] - ref).abs().max().item<float>(), 1e-4)
                << "seq " << i << " step " << step;
        }
    }
    EXPECT_GE(cache.capacity(), 11);
}

INSTANTIATE_TEST_SUITE_P(Architectures, PerArchitecture,
                         ::testing::Values("llama", "qwen2", "qwen3"));

TEST(Model, ParameterNamesFollowTheHuggingFaceLayout) {
    auto q3 = make_model("qwen3");
    std::vector<std::string> names;
    for (const auto &[n, p] : q3->named_weights()) names.push_back(n);
    const std::vector<std::string> first = {"model.embed_tokens.weight",
                                            "model.layers.0.self_attn.q_proj.weight",
                                            "model.layers.0.self_attn.k_proj.weight",
                                            "model.layers.0.self_attn.v_proj.weight",
                                            "model.layers.0.self_attn.o_proj.weight",
                                            "model.layers.0.self_attn.q_norm.weight",
                                            "model.layers.0.self_attn.k_norm.weight",
                                            "model.layers.0.mlp.gate_proj.weight",
                                            "model.layers.0.mlp.up_proj.weight",
                                            "model.layers.0.mlp.down_proj.weight",
                                            "model.layers.0.input_layernorm.weight",
                                            "model.layers.0.post_attention_layernorm.weight"};
    ASSERT_GE(names.size(), first.size());
    EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + first.size()), first);
    EXPECT_EQ(names.back(), "lm_head.weight");
    auto q2 = make_model("qwen2"); // tied: no lm_head, q/k/v bias
    std::set<std::string> n2;
    for (const auto &[n, p] : q2->named_weights()) n2.insert(n);
    EXPECT_FALSE(n2.count("lm_head.weight"));
    EXPECT_TRUE(n2.count("model.layers.1.self_attn.q_proj.bias"));
    EXPECT_FALSE(n2.count("model.layers.1.self_attn.o_proj.bias"));
    EXPECT_EQ(&q2->lm_head_weight(), &q2->model->embed_tokens->weight);
}

TEST(Logprobs, ChunkedLogprobsAndEntropyEqualTheFullLogSoftmax) {
    auto m = make_model("qwen3");
    const auto seqs = random_seqs({13, 8, 21}, 97, 5);
    const PackedBatch b = PackedBatch::from_sequences(seqs);
    const at::Tensor labels = next_labels(seqs);
    LogprobOptions o;
    o.chunk_tokens = 4; // many chunks, last one partial
    o.entropy = true;
    at::NoGradGuard g;
    TokenLogprobs lp = m->token_logprobs(b, labels, o);
    at::Tensor logp = at::log_softmax(m->logits(b), -1);
    at::Tensor valid = labels.ne(-100);
    at::Tensor ref = logp.gather(1, labels.clamp_min(0).unsqueeze(1)).squeeze(1) * valid;
    EXPECT_LT((lp.logprobs - ref).abs().max().item<float>(), 1e-5);
    at::Tensor ent = -(logp.exp() * logp).sum(-1);
    EXPECT_LT((lp.entropy - ent).abs().max().item<float>(), 1e-5);
    EXPECT_TRUE(lp.logprobs.masked_select(valid.logical_not()).eq(0).all().item<bool>());
}

TEST(Logprobs, TemperatureDividesTheLogits) {
    auto m = make_model("llama");
    const auto seqs = random_seqs({10}, 97, 9);
    const PackedBatch b = PackedBatch::from_sequences(seqs);
    LogprobOptions o;
    o.temperature = 0.7;
    at::NoGradGuard g;
    TokenLogprobs lp = m->token_logprobs(b, next_labels(seqs), o);
    at::Tensor logp = at::log_softmax(m->logits(b) / 0.7, -1);
    at::Tensor labels = next_labels(seqs);
    at::Tensor ref = logp.gather(1, labels.clamp_min(0).unsqueeze(1)).squeeze(1) * labels.ne(-100);
    EXPECT_LT((lp.logprobs - ref).abs().max().item<float>(), 1e-5);
}

// Also log Z of the raw logits (z-loss's input, whatever the temperature of the
// logprobs), computed in the same chunks.
TEST(Logprobs, GradientsEqualAutogradThroughTheFullLogSoftmax) {
    // Double precision so the comparison is tight.
    for (const std::string arch : {"qwen3", "qwen2"}) {
        auto m = make_model(arch, 2, at::kDouble);
        const auto seqs = random_seqs({9, 4, 12}, 97, 13);
        const PackedBatch b = PackedBatch::from_sequences(seqs);
        const at::Tensor labels = next_labels(seqs);
        const at::Tensor w_lp = at::randn({labels.size(0)}, at::kDouble);
        const at::Tensor w_ent = at::randn({labels.size(0)}, at::kDouble);
        const at::Tensor w_lse = at::randn({labels.size(0)}, at::kDouble);
        LogprobOptions o;
        o.chunk_tokens = 5;
        o.entropy = true;
        o.temperature = 1.3;
        EXPECT_FALSE(m->token_logprobs(b, labels, o).logsumexp.defined());
        o.logsumexp = true;
        TokenLogprobs lp = m->token_logprobs(b, labels, o);
        at::Tensor loss = (lp.logprobs.to(at::kDouble) * w_lp).sum() +
                          (lp.entropy.to(at::kDouble) * w_ent).sum() +
                          (lp.logsumexp.to(at::kDouble) * w_lse).sum();
        auto params = m->parameters();
        auto g1 = torch::autograd::grad({loss}, params);

        at::Tensor logp = at::log_softmax(m->logits(b).to(at::kDouble) / 1.3, -1);
        at::Tensor ref_lp =
            logp.gather(1, labels.clamp_min(0).unsqueeze(1)).squeeze(1) * labels.ne(-100);
        at::Tensor ref_ent = -(logp.exp() * logp).sum(-1);
        at::Tensor ref_lse = at::logsumexp(m->logits(b).to(at::kDouble), -1);
        EXPECT_LT((lp.logsumexp.to(at::kDouble) - ref_lse).abs().max().item<double>(), 1e-4);
        at::Tensor ref_loss =
            (ref_lp * w_lp).sum() + (ref_ent * w_ent).sum() + (ref_lse * w_lse).sum();
        auto g2 = torch::autograd::grad({ref_loss}, params);
        for (size_t i = 0; i < params.size(); ++i) {
            const double scale = g2[i].abs().max().item<double>() + 1e-12;
            EXPECT_LT((g1[i] - g2[i]).abs().max().item<double>() / scale, 1e-4)
                << arch << " parameter " << i;
        }
    }
}

TEST(Logprobs, IgnoredLabelsHaveNoGradientAndBadLabelsAreErrors) {
    auto m = make_model("qwen3");
    const auto seqs = random_seqs({6}, 97, 3);
    const PackedBatch b = PackedBatch::from_sequences(seqs);
    at::Tensor labels = at::full({6}, -100, at::kLong);
    TokenLogprobs lp = m->token_logprobs(b, labels, {});
    lp.logprobs.sum().backward();
    for (const auto &p : m->parameters()) {
        if (p.grad().defined()) {
            EXPECT_EQ(p.grad().abs().max().item<float>(), 0.0f);
        }
    }
    at::Tensor bad = at::tensor({1, 2, 3, 97, 4, 5}, at::kLong);
    EXPECT_NE(error_of([&] { m->token_logprobs(b, bad, {}); }).find("labels[3] = 97"),
              std::string::npos);
    EXPECT_NE(error_of([&] { m->token_logprobs(b, at::zeros({5}, at::kLong), {}); }).find("labels"),
              std::string::npos);
}

TEST(Model, BadPackedInputsAreErrorsNamingTheTensor) {
    auto m = make_model("qwen3");
    PackedBatch b = PackedBatch::from_sequences({{1, 2, 3}, {4, 5}});
    PackedBatch x = b;
    x.input_ids = at::tensor({1, 2, 300, 4, 5}, at::kLong);
    EXPECT_NE(error_of([&] { m->hidden_states(x); }).find("input_ids[2] = 300"), std::string::npos);
    x = b;
    x.cu_seqlens = at::tensor({0, 3, 4}, at::kLong);
    EXPECT_NE(error_of([&] { m->hidden_states(x); }).find("cu_seqlens ends at 4"),
              std::string::npos);
    x.cu_seqlens = at::tensor({0, 4, 3, 5}, at::kLong);
    EXPECT_NE(error_of([&] { m->hidden_states(x); }).find("must not decrease"), std::string::npos);
    x.cu_seqlens = at::tensor({1, 5}, at::kLong);
    EXPECT_NE(error_of([&] { m->hidden_states(x); }).find("cu_seqlens[0]"), std::string::npos);
    x = b;
    x.position_ids = at::tensor({0, 1}, at::kLong);
    EXPECT_NE(error_of([&] { m->hidden_states(x); }).find("position_ids"), std::string::npos);
    x.position_ids = at::tensor({0, 1, 2, -1, 0}, at::kLong);
    EXPECT_NE(error_of([&] { m->hidden_states(x); }).find("non-negative"), std::string::npos);
    x = b;
    x.input_ids = at::tensor({1.0, 2.0, 3.0, 4.0, 5.0});
    EXPECT_NE(error_of([&] { m->hidden_states(x); }).find("int64"), std::string::npos);
}

TEST(Model, PositionIdsEnterOnlyThroughRelativeRotaryPhases) {
    auto m = make_model("qwen3");
    PackedBatch a = PackedBatch::from_sequences({{5, 6, 7}});
    at::NoGradGuard g;
    const at::Tensor base = m->logits(a);
    // RoPE depends on relative positions only: a constant shift changes nothing...
    PackedBatch shifted = a;
    shifted.position_ids = at::tensor({37, 38, 39}, at::kLong);
    EXPECT_LT((m->logits(shifted) - base).abs().max().item<float>(), 1e-4);
    // ...while a gap between positions does.
    PackedBatch gap = a;
    gap.position_ids = at::tensor({0, 1, 9}, at::kLong);
    const at::Tensor g_logits = m->logits(gap);
    EXPECT_LT((g_logits.narrow(0, 0, 2) - base.narrow(0, 0, 2)).abs().max().item<float>(), 1e-5);
    EXPECT_GT((g_logits[2] - base[2]).abs().max().item<float>(), 1e-3);
}

TEST(KVCache, ExtendContinuesSlotsWithChunksAndCopySlotForksAPrompt) {
    auto m = make_model("qwen3", 5);
    const auto seqs = random_seqs({12}, 97, 21);
    const auto &s = seqs[0];
    at::Tensor full;
    {
        at::NoGradGuard g;
        full = m->logits(PackedBatch::from_sequences(seqs));
    }
    KVCache cache = m->make_cache(3, 64);
    m->prefill(cache, {1}, {{s.begin(), s.begin() + 5}});
    cache.copy_slot(1, 2);
    // Slot 1 gets a 4-token chunk, slot 2 a 2-token chunk, in one call.
    std::vector<int64_t> toks(s.begin() + 5, s.begin() + 9);
    toks.insert(toks.end(), s.begin() + 5, s.begin() + 7);
    at::Tensor all =
        m->extend(cache, {1, 2}, at::tensor(toks, at::kLong), {4, 2}, /*all_logits=*/true);
    ASSERT_EQ(all.size(0), 6);
    EXPECT_LT((all.narrow(0, 0, 4) - full.narrow(0, 5, 4)).abs().max().item<float>(), 1e-4);
    EXPECT_LT((all.narrow(0, 4, 2) - full.narrow(0, 5, 2)).abs().max().item<float>(), 1e-4);
    EXPECT_EQ(cache.length(1), 9);
    EXPECT_EQ(cache.length(2), 7);
    cache.truncate(1, 6);
    at::Tensor l = m->decode(cache, {1}, at::tensor({s[6]}, at::kLong));
    EXPECT_LT((l[0] - full[6]).abs().max().item<float>(), 1e-4);
    // release / allocate (engine sleep / wake-up) empties the cache.
    EXPECT_GT(cache.bytes(), 0);
    cache.release();
    EXPECT_EQ(cache.bytes(), 0);
    EXPECT_NE(
        error_of([&] { m->decode(cache, {1}, at::tensor({s[6]}, at::kLong)); }).find("released"),
        std::string::npos);
    cache.allocate();
    EXPECT_EQ(cache.length(1), 0);
}

TEST(KVCache, BadArgumentsAreErrors) {
    auto m = make_model("qwen3");
    KVCache cache = m->make_cache(2, 8);
    EXPECT_NE(error_of([&] { m->decode(cache, {5}, at::tensor({1}, at::kLong)); }).find("slot 5"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  m->decode(cache, {0, 0}, at::tensor({1, 2}, at::kLong));
              }).find("twice"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  m->decode(cache, {0}, at::tensor({1, 2}, at::kLong));
              }).find("decode"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  m->extend(cache, {0}, at::tensor({1, 2}, at::kLong), {3});
              }).find("add up"),
              std::string::npos);
    EXPECT_NE(error_of([&] { m->prefill(cache, {0}, {{}}); }).find("empty"), std::string::npos);
    EXPECT_NE(error_of([&] { cache.copy_slot(0, 9); }).find("slot 9"), std::string::npos);
}

TEST(KVCache, EngineReadsTheTrainersParametersInPlace) {
    // The engine decodes with the same module the optimizer updates: an
    // in-place parameter update shows up in the next decode with no copy.
    auto m = make_model("qwen3", 8);
    KVCache cache = m->make_cache(1, 16);
    at::Tensor before = m->prefill(cache, {0}, {{1, 2, 3}});
    {
        at::NoGradGuard g;
        m->model->norm->weight.mul_(1.5);
    }
    at::Tensor after = m->prefill(cache, {0}, {{1, 2, 3}});
    EXPECT_GT((before - after).abs().max().item<float>(), 1e-3);
    at::NoGradGuard g;
    at::Tensor full = m->logits(PackedBatch::from_sequences({{1, 2, 3}}));
    EXPECT_LT((after[0] - full[2]).abs().max().item<float>(), 1e-4);
}

// -- save / load ------------------------------------------------------------

void expect_same_weights(const CausalLM &a, const CausalLM &b) {
    auto wa = a.named_weights(), wb = b.named_weights();
    ASSERT_EQ(wa.size(), wb.size());
    for (size_t i = 0; i < wa.size(); ++i) {
        EXPECT_EQ(wa[i].first, wb[i].first);
        EXPECT_TRUE(at::equal(wa[i].second, wb[i].second)) << wa[i].first;
    }
}

TEST(Pretrained, SaveLoadRoundTripIsBitExact) {
    TempDir d1, d2;
    auto m = make_model("qwen3", 4);
    m->aux_files()["tokenizer.json"] = R"({"not": "parsed by the model loader"})";
    save_pretrained(*m, d1.path());
    auto back = load_pretrained(d1.path());
    expect_same_weights(*m, *back);
    EXPECT_EQ(back->aux_files(), m->aux_files());
    save_pretrained(*back, d2.path());
    for (const char *f : {"config.json", "model.safetensors", "tokenizer.json"})
        EXPECT_EQ(test::slurp(d1 / f), test::slurp(d2 / f)) << f;
    EXPECT_EQ(SafetensorsFile::open(d1 / "model.safetensors")->metadata().at("format"), "pt");
}

TEST(Pretrained, ShardedCheckpointLoadsLikeSingleFile) {
    TempDir single, sharded;
    auto m = make_model("llama", 6);
    save_pretrained(*m, single.path());
    SaveOptions o;
    o.max_shard_bytes = 40000;
    save_pretrained(*m, sharded.path(), o);
    EXPECT_TRUE(fs::exists(sharded / "model.safetensors.index.json"));
    EXPECT_FALSE(fs::exists(sharded / "model.safetensors"));
    int shards = 0;
    for (const auto &e : fs::directory_iterator(sharded.path()))
        if (e.path().filename().string().rfind("model-", 0) == 0) ++shards;
    EXPECT_GT(shards, 2);
    auto a = load_pretrained(single.path());
    auto b = load_pretrained(sharded.path());
    expect_same_weights(*a, *b);
    at::NoGradGuard g;
    const PackedBatch batch = PackedBatch::from_sequences(random_seqs({7, 3}, 97, 1));
    EXPECT_TRUE(at::equal(a->logits(batch), b->logits(batch)));
    // Saving single-file over the sharded folder removes the stale shards.
    save_pretrained(*m, sharded.path());
    EXPECT_FALSE(fs::exists(sharded / "model.safetensors.index.json"));
    for (const auto &e : fs::directory_iterator(sharded.path()))
        EXPECT_NE(e.path().filename().string().rfind("model-", 0), 0u) << e.path();
}

TEST(Pretrained, Bf16OnDiskLoadsAsRoundedFloat32) {
    TempDir d;
    auto m = make_model("qwen2", 9);
    SaveOptions o;
    o.dtype = at::kBFloat16;
    save_pretrained(*m, d.path(), o);
    auto f = SafetensorsFile::open(d / "model.safetensors");
    EXPECT_EQ(f->tensors()[0].dtype, DType::BF16);
    auto back = load_pretrained(d.path());
    EXPECT_EQ(ModelConfig::load(d / "config.json").torch_dtype, "bfloat16");
    auto wa = m->named_weights(), wb = back->named_weights();
    for (size_t i = 0; i < wa.size(); ++i)
        EXPECT_TRUE(at::equal(wa[i].second.to(at::kBFloat16).to(at::kFloat), wb[i].second));
    auto half = load_pretrained(d.path(), LoadOptions{at::kBFloat16, at::kCPU, true});
    EXPECT_EQ(half->named_weights()[0].second.scalar_type(), at::kBFloat16);
}

TEST(Pretrained, ZeroCopyLoadNeverWritesBackToTheFile) {
    TempDir d;
    auto m = make_model("qwen3", 10);
    save_pretrained(*m, d.path());
    const std::string before = test::slurp(d / "model.safetensors");
    auto back = load_pretrained(d.path());
    {
        at::NoGradGuard g;
        for (auto &p : back->parameters()) p.add_(1.0); // what an optimizer step does
    }
    EXPECT_EQ(test::slurp(d / "model.safetensors"), before);
    // Training still works on adopted parameters.
    const auto seqs = random_seqs({5}, 97, 2);
    back->token_logprobs(PackedBatch::from_sequences(seqs), next_labels(seqs))
        .logprobs.sum()
        .backward();
    EXPECT_TRUE(back->model->embed_tokens->weight.grad().defined());
}

TEST(Pretrained, LoaderErrorsNameTheFolderFileAndTensor) {
    TempDir d;
    auto m = make_model("qwen3", 11);
    save_pretrained(*m, d.path());
    const std::string file = d / "model.safetensors";
    auto weights = load_safetensors(file);
    auto rewrite = [&](std::map<std::string, at::Tensor> w) {
        std::vector<std::pair<std::string, at::Tensor>> v(w.begin(), w.end());
        save_safetensors(file, v);
    };
    {
        auto w = weights;
        w.erase("model.layers.1.mlp.up_proj.weight");
        rewrite(w);
        const std::string msg = error_of([&] { load_pretrained(d.path()); });
        EXPECT_NE(msg.find("missing tensor(s) model.layers.1.mlp.up_proj.weight"),
                  std::string::npos)
            << msg;
        EXPECT_NE(msg.find(d.path()), std::string::npos) << msg;
    }
    {
        auto w = weights;
        w["model.layers.7.mlp.up_proj.weight"] = at::zeros({2});
        rewrite(w);
        const std::string msg = error_of([&] { load_pretrained(d.path()); });
        EXPECT_NE(msg.find(file + ": tensor 'model.layers.7.mlp.up_proj.weight' is unexpected"),
                  std::string::npos)
            << msg;
    }
    {
        auto w = weights;
        w["model.norm.weight"] = at::zeros({47});
        rewrite(w);
        const std::string msg = error_of([&] { load_pretrained(d.path()); });
        EXPECT_NE(msg.find("'model.norm.weight' has shape [47] but the config needs [48]"),
                  std::string::npos)
            << msg;
    }
    {
        rewrite(weights);
        std::string bytes = test::slurp(file);
        test::spit(file, bytes.substr(0, bytes.size() - 100));
        const std::string msg = error_of([&] { load_pretrained(d.path()); });
        EXPECT_NE(msg.find(file), std::string::npos) << msg;
        EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
    }
    {
        fs::remove(file);
        EXPECT_NE(error_of([&] { load_pretrained(d.path()); }).find("neither model.safetensors"),
                  std::string::npos);
        EXPECT_NE(error_of([&] { load_pretrained(d / "nope"); }).find("does not exist"),
                  std::string::npos);
    }
}

TEST(Pretrained, IndexPointingAtTheWrongShardIsAnError) {
    TempDir d;
    auto m = make_model("qwen3", 12);
    SaveOptions o;
    o.max_shard_bytes = 50000;
    save_pretrained(*m, d.path(), o);
    const std::string idx_path = d / "model.safetensors.index.json";
    Json idx = Json::parse(test::slurp(idx_path));
    const std::string name = "model.embed_tokens.weight";
    const std::string real = idx["weight_map"][name];
    std::string other;
    for (const auto &[n, f] : idx["weight_map"].items())
        if (f != real) other = f;
    ASSERT_FALSE(other.empty());
    idx["weight_map"][name] = other;
    test::spit(idx_path, idx.dump());
    const std::string msg = error_of([&] { load_pretrained(d.path()); });
    EXPECT_NE(msg.find("'" + name + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(other), std::string::npos) << msg;
}

// -- tiny preset ------------------------------------------------------------

TEST(TinyPreset, WritesALoadableFolderWithTokenizerAndChatTemplate) {
    TempDir d;
    write_tiny_model(d.path(), 1234);
    for (const char *f :
         {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "generation_config.json"})
        EXPECT_TRUE(fs::exists(d / f)) << f;
    auto m = load_pretrained(d.path());
    EXPECT_EQ(m->config().architecture, Architecture::Qwen3);
    EXPECT_EQ(m->config().vocab_size, kTinyVocabSize);
    EXPECT_GT(m->num_parameters(), 1'000'000);
    EXPECT_LT(m->num_parameters(), 10'000'000);
    auto tok = Tokenizer::from_folder(d.path());
    EXPECT_EQ(tok->vocab_size(), kTinyVocabSize);
    EXPECT_EQ(tok->eos_token_id(), kTinyImEnd);
    EXPECT_EQ(tok->pad_token_id(), kTinyEndOfText);
    ASSERT_FALSE(tok->chat_template_source().empty());
    const std::string prompt = tok->apply_chat_template({{"user", "reverse: abc"}});
    EXPECT_EQ(prompt, "<|im_start|>user\nreverse: abc<|im_end|>\n<|im_start|>assistant\n");
    const auto ids = tok->encode(prompt);
    EXPECT_EQ(ids.front(), kTinyImStart);
    EXPECT_EQ(tok->decode(ids), prompt);
    // Byte b is token b.
    EXPECT_EQ(tok->encode("AZ"), (std::vector<int32_t>{'A', 'Z'}));
    // Every id the model can emit decodes.
    for (int32_t id = 0; id < kTinyVocabSize; ++id) EXPECT_NO_THROW(tok->token_bytes(id));
}

TEST(TinyPreset, SameSeedSameBytesOtherSeedOtherWeights) {
    TempDir a, b, c;
    write_tiny_model(a.path(), 7);
    write_tiny_model(b.path(), 7);
    write_tiny_model(c.path(), 8);
    EXPECT_EQ(test::slurp(a / "model.safetensors"), test::slurp(b / "model.safetensors"));
    EXPECT_NE(test::slurp(a / "model.safetensors"), test::slurp(c / "model.safetensors"));
}

} // namespace
} // namespace rl::core
