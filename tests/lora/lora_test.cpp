// LoRA adapters in the model core, the trainer and the engine (docs/lora.md),
// on a small tiny-architecture model.
#include "lora_test_util.hpp"

#include "rl/core/engine.hpp"
#include "rl/core/lora.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/tiny.hpp"
#include "rl/core/trainer.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace fs = std::filesystem;
using namespace rl::core;

namespace {

using namespace test;

TinyModelSpec small_spec() {
    TinyModelSpec s = test::small_tiny_spec(2);
    s.max_position_embeddings = 256;
    return s;
}

// A fresh policy over the same seeded small model.
std::shared_ptr<Policy> make_policy(const TempDir &tmp) {
    return seeded_policy(tmp / "base", 7, small_spec());
}

at::Tensor logits_of(Policy &p, const std::shared_ptr<const LoraAdapter> &a,
                     const std::string &text) {
    AdapterScope scope(a);
    std::vector<int64_t> ids(text.begin(), text.end());
    return p.model().logits(PackedBatch::from_sequences({ids}));
}

bool all_equal(const std::map<std::string, at::Tensor> &a,
               const std::vector<std::pair<std::string, at::Tensor>> &b) {
    for (const auto &kv : b)
        if (!at::equal(a.at(kv.first), kv.second.detach())) return false;
    return true;
}

LoraConfig small_lora(uint64_t seed = 1) {
    LoraConfig c;
    c.rank = 4;
    c.alpha = 8;
    c.seed = seed;
    return c;
}

// A policy over the small model, its adapter "a" (small_lora()) and a trainer
// of it, trained `steps` steps on `texts`.
struct TrainedAdapter {
    std::shared_ptr<Policy> p;
    std::shared_ptr<LoraAdapter> a;
    Trainer t;
    TrainedAdapter(const TempDir &tmp, int steps, const std::vector<std::string> &texts)
        : p(make_policy(tmp)), a(p->create_adapter("a", small_lora())),
          t(p, lora_trainer_config(), a) {
        train_steps(t, steps, texts);
    }
};

} // namespace

TEST(LoraConfig, ReadsOurAndPeftKeysAndRefusesBadOnes) {
    LoraConfig c = LoraConfig::from_json(
        R"({"r": 16, "lora_alpha": 32, "lora_dropout": 0.1, "target_modules": ["v_proj", "q_proj"]})");
    EXPECT_EQ(c.rank, 16);
    EXPECT_DOUBLE_EQ(c.scale(), 2.0);
    EXPECT_EQ(c.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
    EXPECT_TRUE(c.targets(LoraTarget::Q));
    EXPECT_FALSE(c.targets(LoraTarget::Down));
    c = LoraConfig::from_json(R"({"rank": 4, "alpha": 8, "use_rslora": true})");
    EXPECT_DOUBLE_EQ(c.scale(), 4.0);
    EXPECT_EQ(c.target_modules, (std::vector<std::string>{"all-linear"}));
    auto message = [](const std::string &json) {
        try {
            LoraConfig::from_json(json);
        } catch (const Error &e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    EXPECT_NE(message(R"({"rank": 0})").find("lora.rank"), std::string::npos);
    EXPECT_NE(message(R"({"ranks": 4})").find("unknown key 'ranks'"), std::string::npos);
    EXPECT_NE(message(R"({"target_modules": ["lm_head"]})").find("unknown module 'lm_head'"),
              std::string::npos);
    EXPECT_NE(message(R"({"dropout": 1})").find("lora.dropout"), std::string::npos);
    // A rank from a request field is bounded: 65536 would allocate gigabytes per adapter.
    EXPECT_NE(
        message(R"({"rank": 65536})").find("lora.rank must be an integer in [1, 1024], got 65536"),
        std::string::npos);
    EXPECT_EQ(LoraConfig::from_json(R"({"rank": 1024})").rank, 1024);
    EXPECT_NE(message(R"({"rank": 4, "alpha": 1e400})").find("out of range"), std::string::npos);
}

TEST(Lora, FreshAdapterIsTheIdentity) {
    TempDir tmp;
    auto p = make_policy(tmp);
    auto a = p->create_adapter("a", small_lora());
    // A is Kaiming-uniform (bound 1/sqrt(in)), B is zero.
    const auto *pair = a->find(0, LoraTarget::Q);
    ASSERT_NE(pair, nullptr);
    EXPECT_GT(pair->A.abs().max().item<double>(), 0.0);
    EXPECT_LE(pair->A.abs().max().item<double>(), 1.0 / std::sqrt(64.0));
    EXPECT_EQ(pair->B.abs().max().item<double>(), 0.0);
    EXPECT_EQ(a->named_parameters().size(), 2u * 7u * 2u);
    EXPECT_EQ(a->named_parameters()[0].first,
              "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    const at::Tensor base = logits_of(*p, nullptr, "hello world");
    EXPECT_TRUE(at::equal(base, logits_of(*p, a, "hello world")));
}

TEST(Lora, TrainingChangesOnlyTheAdapter) {
    TempDir tmp;
    auto p = make_policy(tmp);
    const auto base_before = snapshot(p->model().named_weights());
    auto a = p->create_adapter("a", small_lora());
    const auto adapter_before = snapshot(a->named_parameters());
    Trainer t(p, lora_trainer_config(), a);
    const LossFunction ce = nll_loss();
    const double first = t.forward_backward(text_batch({"abcabcabc", "hello hello"}), ce).loss;
    const OptimResult r = t.optim_step();
    EXPECT_EQ(r.policy_version, 1);
    EXPECT_EQ(a->version(), 1);
    EXPECT_EQ(p->version(), 0); // the base did not move
    train_steps(t, 4, {"abcabcabc", "hello hello"});
    const double last = t.forward_backward(text_batch({"abcabcabc", "hello hello"}), ce).loss;
    EXPECT_LT(last, first);
    EXPECT_TRUE(all_equal(base_before, p->model().named_weights()));
    EXPECT_FALSE(all_equal(adapter_before, a->named_parameters()));
    // Only the adapter is optimizer state.
    EXPECT_LT(t.state_bytes(), 4 * a->num_parameters() * 4 + 1);
}

TEST(Lora, TwoAdaptersTrainedInTurnDoNotInterfere) {
    TempDir tmp;
    // Interleaved: a and b over one base, each with its own trainer.
    auto p = make_policy(tmp);
    auto a = p->create_adapter("a", small_lora(1));
    auto b = p->create_adapter("b", small_lora(2));
    Trainer ta(p, lora_trainer_config(), a), tb(p, lora_trainer_config(), b);
    for (int i = 0; i < 3; ++i) {
        const auto b_before = snapshot(b->named_parameters());
        train_steps(ta, 1, {"aaaa bbbb"});
        EXPECT_TRUE(all_equal(b_before, b->named_parameters()));
        const auto a_before = snapshot(a->named_parameters());
        train_steps(tb, 1, {"zyxw zyxw zyxw"});
        EXPECT_TRUE(all_equal(a_before, a->named_parameters()));
    }
    // Alone: a fresh base and adapter a trained on the same batches gives the same a.
    auto p2 = make_policy(tmp);
    auto a2 = p2->create_adapter("a", small_lora(1));
    Trainer t2(p2, lora_trainer_config(), a2);
    train_steps(t2, 3, {"aaaa bbbb"});
    const auto a_alone = snapshot(a2->named_parameters());
    EXPECT_TRUE(all_equal(a_alone, a->named_parameters()));
    // Each adapter changes the model differently.
    EXPECT_FALSE(at::allclose(logits_of(*p, a, "aaaa"), logits_of(*p, b, "aaaa")));
}

TEST(Lora, SaveLoadRoundTripInPeftLayout) {
    TempDir tmp;
    TrainedAdapter trained(tmp, 2, {"round trip"});
    auto &[p, a, t] = trained;
    save_adapter(*a, tmp / "adapter");
    const auto cfg = nlohmann::json::parse(std::ifstream(tmp / "adapter/adapter_config.json"));
    EXPECT_EQ(cfg["peft_type"], "LORA");
    EXPECT_EQ(cfg["r"], 4);
    EXPECT_EQ(cfg["lora_alpha"], 8.0);
    EXPECT_EQ(cfg["target_modules"].size(), 7u);
    EXPECT_EQ(cfg["base_model_name_or_path"], tmp / "base");
    auto loaded = load_adapter(p->model(), tmp / "adapter", "b");
    EXPECT_TRUE(all_equal(snapshot(a->named_parameters()), loaded->named_parameters()));
    EXPECT_TRUE(at::equal(logits_of(*p, a, "round trip"), logits_of(*p, loaded, "round trip")));
    // A folder that does not fit: another rank.
    LoraConfig other = small_lora();
    other.rank = 2;
    auto c = p->create_adapter("c", other);
    save_adapter(*c, tmp / "rank2");
    fs::copy_file(tmp / "adapter/adapter_config.json", tmp / "rank2/adapter_config.json",
                  fs::copy_options::overwrite_existing);
    try {
        load_adapter(p->model(), tmp / "rank2", "d");
        ADD_FAILURE() << "a rank-2 file loaded as rank 4";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("has shape"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("adapter_model.safetensors"), std::string::npos);
    }
}

TEST(Lora, MergedExportLoadsWithTheAdaptersLogits) {
    TempDir tmp;
    TrainedAdapter trained(tmp, 3, {"merge me", "and me too"});
    auto &[p, a, t] = trained;
    const auto base_before = snapshot(p->model().named_weights());
    save_merged(p->model(), *a, tmp / "merged");
    EXPECT_TRUE(all_equal(base_before, p->model().named_weights()));
    auto merged = Policy::load(tmp / "merged");
    const at::Tensor want = logits_of(*p, a, "merge me please");
    const at::Tensor got = logits_of(*merged, nullptr, "merge me please");
    EXPECT_LT((want - got).abs().max().item<double>(), 1e-4);
    EXPECT_GT((want - logits_of(*p, nullptr, "merge me please")).abs().max().item<double>(), 1e-3);
}

TEST(Lora, EngineLogprobsWithAdapterEqualTrainerLogprobs) {
    TempDir tmp;
    TrainedAdapter trained(tmp, 3, {"the cat sat on the mat"});
    auto &[p, a, t] = trained;
    Engine e(p);
    SamplingParams sp = adapter_sampling("a");
    const std::vector<int64_t> prompt{'t', 'h', 'e', ' '};
    const Generation g = e.generate({prompt}, sp);
    EXPECT_EQ(g.policy_version, a->version());
    // The base model samples something else from the same seed.
    SamplingParams base = sp;
    base.adapter.clear();
    const Generation gb = e.generate({prompt}, base);
    EXPECT_NE(g.token_ids, gb.token_ids);
    for (int64_t s = 0; s < g.samples(); ++s) {
        std::vector<int64_t> ids = prompt;
        ids.insert(ids.end(), g.token_ids.begin() + g.cu_seqlens[s],
                   g.token_ids.begin() + g.cu_seqlens[s + 1]);
        TrainBatch b;
        b.input_ids = at::tensor(ids, at::kLong);
        b.cu_seqlens = {0, static_cast<int64_t>(ids.size())};
        const StepResult r = t.forward(b, nullptr);
        const at::Tensor lp = r.tensors.at("logprobs");
        double worst = 0;
        for (int64_t i = g.cu_seqlens[s]; i < g.cu_seqlens[s + 1]; ++i) {
            const int64_t pos = static_cast<int64_t>(prompt.size()) + (i - g.cu_seqlens[s]);
            worst = std::max(worst, std::abs(lp[pos].item<double>() - g.logprobs[i]));
        }
        EXPECT_LT(worst, 2e-5) << "sample " << s;
    }
}

TEST(Lora, TrainerCheckpointHoldsTheAdapterAlone) {
    TempDir tmp;
    TrainedAdapter trained(tmp, 2, {"checkpoint"});
    auto &[p, a, t] = trained;
    const auto saved = snapshot(a->named_parameters());
    const std::string path = t.save_checkpoint(tmp / "ckpt", "{}");
    EXPECT_TRUE(fs::exists(fs::path(path) / "adapter/adapter_model.safetensors"));
    EXPECT_FALSE(fs::exists(fs::path(path) / "model"));
    train_steps(t, 2, {"checkpoint"});
    EXPECT_FALSE(all_equal(saved, a->named_parameters()));
    const CheckpointInfo info = t.load_checkpoint(tmp / "ckpt");
    EXPECT_EQ(info.step, 2);
    EXPECT_EQ(a->version(), 2);
    EXPECT_TRUE(all_equal(saved, a->named_parameters()));
    // A full-weight trainer refuses the adapter checkpoint, naming the reason.
    auto p2 = make_policy(tmp);
    Trainer full(p2, TrainerConfig{});
    try {
        full.load_checkpoint(tmp / "ckpt");
        ADD_FAILURE() << "a full trainer loaded a LoRA checkpoint";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("LoRA adapter"), std::string::npos) << e.what();
    }
}

TEST(Lora, DropoutTrainsWithActivationCheckpointingLikeWithout) {
    // The same dropout masks in the recomputed layers: gradients with and
    // without activation checkpointing agree.
    TempDir tmp;
    LoraConfig c = small_lora();
    c.dropout = 0.3;
    std::vector<std::map<std::string, at::Tensor>> results;
    for (int run = 0; run < 3; ++run) {
        const bool ckpt = run == 1;
        auto p = make_policy(tmp);
        LoraConfig cr = c;
        if (run == 2) cr.dropout = 0; // the reference without dropout
        auto a = p->create_adapter("a", cr);
        TrainerConfig tc = lora_trainer_config();
        tc.activation_checkpointing = ckpt;
        Trainer t(p, tc, a);
        t.forward_backward(text_batch({"dropout dropout"}), nll_loss());
        std::map<std::string, at::Tensor> g;
        for (const auto &kv : a->named_parameters()) g[kv.first] = kv.second.grad().clone();
        results.push_back(g);
    }
    bool dropped = false;
    for (const auto &kv : results[0]) {
        ASSERT_TRUE(kv.second.defined());
        EXPECT_TRUE(at::allclose(kv.second, results[1].at(kv.first), 1e-4, 1e-6)) << kv.first;
        dropped = dropped || !at::allclose(kv.second, results[2].at(kv.first), 1e-3, 1e-6);
    }
    EXPECT_TRUE(dropped) << "dropout 0.3 gave the gradients of dropout 0";
}

TEST(Lora, RegistryNamesAdapters) {
    TempDir tmp;
    auto p = make_policy(tmp);
    p->create_adapter("x", small_lora());
    EXPECT_THROW(p->create_adapter("x", small_lora()), Error);
    try {
        p->adapter("y");
        ADD_FAILURE();
    } catch (const Error &e) {
        EXPECT_EQ(e.kind(), ErrorKind::NotFound);
        EXPECT_NE(std::string(e.what()).find("adapters: x"), std::string::npos) << e.what();
    }
    Engine e(p);
    SamplingParams sp;
    sp.adapter = "nope";
    EXPECT_THROW(e.generate({{'a'}}, sp), Error);
    EXPECT_TRUE(p->remove_adapter("x"));
    EXPECT_TRUE(p->adapter_names().empty());
}
