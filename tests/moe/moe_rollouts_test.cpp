// Routing replay (R3) through the C API on the tiny-moe preset: rollouts
// sampled with sampling.return_routed_experts carry the engine's routing of
// every token, the batch packs it as routed_experts [T, L_moe, K] aligned with
// its tokens (also when split), and the trainer replays it: after a router
// change that flips some top-k choices, the replayed logprobs are the
// rollouts' while routing itself moves them. The router change is made on a
// copy of the model loaded in process (rl/core) and saved for the C API.
#include "../train/train_util.hpp"
#include "flip_router.hpp"

#include "rl/core/model.hpp"
#include "rl/core/moe.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/pretrained.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace rl_train_test;
using nlohmann::json;

// Short prompts and completions: few tokens per expert, so that a router
// change can flip some tokens while keeping the others' weights
// (flip_router.hpp needs fewer than E - 1 tokens on the expert it moves).
const char *kTasks = R"([{"prompt": "ab", "answer": "ba"}, {"prompt": "moe", "answer": "eom"}])";
const char *kSampling =
    R"({"n": 2, "max_tokens": 4, "seed": 17, "temperature": 1.0, "return_routed_experts": true})";

// Rollouts of kTasks sampled by `e` with kSampling (the routing recorded).
RolloutsPtr routed_rollouts(rl_engine_t *e) {
    rl_rollouts_t *r = nullptr;
    const std::string options = std::string(R"({"sampling": )") + kSampling + "}";
    if (rl_rollouts_generate(e, kTasks, options.c_str(), &r) != RL_OK)
        ADD_FAILURE() << "generate: " << rl_last_error();
    return RolloutsPtr(r);
}

// A result tensor as int64 values and its shape.
struct IntTensor {
    std::vector<int64_t> shape, values;
};
IntTensor int_tensor(const Result &r, const char *name) {
    rl_tensor_view_t v{};
    EXPECT_EQ(rl_result_tensor(r.get(), name, &v), RL_OK) << name << ": " << rl_last_error();
    IntTensor t;
    int64_t n = 1;
    for (int32_t d = 0; d < v.ndim; ++d) {
        t.shape.push_back(v.shape[d]);
        n *= v.shape[d];
    }
    EXPECT_EQ(v.dtype.code, RL_DTYPE_INT) << name;
    for (int64_t i = 0; i < n; ++i)
        t.values.push_back(v.dtype.bits == 32 ? static_cast<const int32_t *>(v.data)[i]
                                              : static_cast<const int64_t *>(v.data)[i]);
    return t;
}

// A float32 result tensor's values, flattened (any rank).
std::vector<float> floats(const Result &r, const char *name) {
    rl_tensor_view_t v{};
    EXPECT_EQ(rl_result_tensor(r.get(), name, &v), RL_OK) << name << ": " << rl_last_error();
    EXPECT_EQ(v.dtype.code, RL_DTYPE_FLOAT) << name;
    EXPECT_EQ(v.dtype.bits, 32) << name;
    int64_t n = 1;
    for (int32_t d = 0; d < v.ndim; ++d) n *= v.shape[d];
    const float *p = static_cast<const float *>(v.data);
    return p ? std::vector<float>(p, p + n) : std::vector<float>{};
}

// The batch's rl_batch_t without its tensor `name` (by default its
// routed_experts: the trainer routes itself).
struct WithoutRoutes {
    rl_batch_t b{};
    std::vector<rl_tensor_arg_t> args;
    explicit WithoutRoutes(const rl_train_batch_t *batch, const char *name = "routed_experts") {
        b.struct_size = sizeof b;
        EXPECT_EQ(rl_train_batch_view(batch, &b), RL_OK) << rl_last_error();
        for (uint64_t i = 0; i < b.tensors.count; ++i)
            if (std::strcmp(b.tensors.items[i].name, name) != 0) args.push_back(b.tensors.items[i]);
        b.tensors = rl_tensor_list_t{args.data(), args.size()};
    }
};

std::vector<float> logprobs(rl_trainer_t *t, const rl_batch_t *b) {
    Result out;
    EXPECT_EQ(rl_trainer_forward(t, b, nullptr, out.out()), RL_OK) << rl_last_error();
    return floats(out, "logprobs");
}

// A fresh trainer of `m` on `batch` (described by `binfo`) replays its
// routed_experts: its logprobs are the batch's old_logprobs (the engine's) at
// every trained token.
void expect_replay_gives_the_engine_logprobs(rl_model_t *m, const rl_train_batch_t *batch,
                                             const Result &binfo) {
    const std::vector<float> old = floats(binfo, "old_logprobs");
    const std::vector<float> mask = floats(binfo, "loss_mask");
    rl_batch_t view{};
    view.struct_size = sizeof view;
    RL_ASSERT_OK(rl_train_batch_view(batch, &view));
    TrainerPtr t = make_trainer(m, "{}");
    const std::vector<float> lp = logprobs(t.get(), &view);
    ASSERT_EQ(lp.size(), old.size());
    for (size_t i = 0; i < lp.size(); ++i) {
        if (mask[i] != 0) {
            EXPECT_NEAR(lp[i], old[i], 1e-4) << "token " << i;
        }
    }
}

// `r` (scored, 4 rollouts in groups of 2) pushed into a buffer (*first),
// saved to `state` and loaded into a second buffer: the batch that one pops.
BatchPtr through_a_saved_buffer(rl_rollouts_t *r, const std::string &state, BufferPtr *first) {
    const char *config = R"({"group_size": 2})";
    rl_buffer_t *b1 = nullptr, *b2 = nullptr;
    EXPECT_EQ(rl_buffer_create(config, &b1), RL_OK) << rl_last_error();
    first->reset(b1);
    EXPECT_EQ(rl_buffer_push_rollouts(b1, r, nullptr), RL_OK) << rl_last_error();
    EXPECT_EQ(rl_buffer_save(b1, state.c_str()), RL_OK) << rl_last_error();
    EXPECT_EQ(rl_buffer_create(config, &b2), RL_OK) << rl_last_error();
    BufferPtr second(b2);
    EXPECT_EQ(rl_buffer_load(b2, state.c_str()), RL_OK) << rl_last_error();
    rl_train_batch_t *braw = nullptr;
    EXPECT_EQ(rl_buffer_pop_train_batch(b2, 4, 0, &braw), RL_OK) << rl_last_error();
    EXPECT_NE(braw, nullptr);
    return BatchPtr(braw);
}

// The infos of the two parts of rl_train_batch_split(batch, 2).
std::vector<std::unique_ptr<Result>> halves(const rl_train_batch_t *batch) {
    std::vector<rl_train_batch_t *> parts(2, nullptr);
    uint64_t n_parts = 0;
    EXPECT_EQ(rl_train_batch_split(batch, 2, parts.data(), &n_parts), RL_OK) << rl_last_error();
    EXPECT_EQ(n_parts, 2u);
    std::vector<std::unique_ptr<Result>> out;
    for (uint64_t p = 0; p < n_parts; ++p) {
        BatchPtr part(parts[p]);
        out.push_back(std::make_unique<Result>());
        EXPECT_EQ(rl_train_batch_info(part.get(), out.back()->out()), RL_OK) << rl_last_error();
    }
    return out;
}

// The router of the model in `dir` scaled by 3, saved to `out`: the same
// top-k everywhere (a monotone change), other mixing weights.
void save_sharper_router(const std::string &dir, const std::string &out) {
    auto policy = rl::core::Policy::load(dir);
    rl::core::CausalLM &cm = policy->model();
    at::NoGradGuard ng;
    for (auto &layer : cm.model->layers)
        if (layer->moe) layer->moe->gate->weight.mul_(3.0);
    rl::core::save_pretrained(cm, out);
}

// A trainer of the model in `dir` with a sharper router (save_sharper_router)
// on `batch` (described by `binfo`), which carries routed_experts and
// routed_expert_weights: replaying both gives the batch's old_logprobs (the
// engine's) at every trained token; the ids alone move some of them.
void expect_weights_replay_survives_a_sharper_router(const std::string &dir,
                                                     const std::string &sharper_dir,
                                                     const rl_train_batch_t *batch,
                                                     const Result &binfo) {
    save_sharper_router(dir, sharper_dir);
    ModelPtr m2 = load_model(sharper_dir);
    TrainerPtr t2 = make_trainer(m2.get(), "{}");
    rl_batch_t view{};
    view.struct_size = sizeof view;
    RL_ASSERT_OK(rl_train_batch_view(batch, &view));
    const std::vector<float> old = floats(binfo, "old_logprobs");
    const std::vector<float> mask = floats(binfo, "loss_mask");
    const std::vector<float> replayed = logprobs(t2.get(), &view);
    WithoutRoutes ids_only(batch, "routed_expert_weights");
    const std::vector<float> reweighed = logprobs(t2.get(), &ids_only.b);
    ASSERT_EQ(replayed.size(), old.size());
    int64_t moved = 0;
    for (size_t i = 0; i < old.size(); ++i) {
        if (mask[i] == 0) continue;
        EXPECT_NEAR(replayed[i], old[i], 1e-4) << "token " << i << " (ids and weights replayed)";
        moved += std::abs(reweighed[i] - old[i]) > 1e-3;
    }
    EXPECT_GE(moved, 1) << "the sharper router should move the ids-only replay's logprobs";
}

TEST(MoeRollouts, RolloutsCarryTheEngineRoutingAndTheTrainerReplaysIt) {
    TempDir tmp("moe-r3");
    const std::string dir = tmp.sub("m"), flipped_dir = tmp.sub("flipped");
    RL_ASSERT_OK(rl_model_init_preset("tiny-moe", dir.c_str(), 5));
    ModelPtr m = load_model(dir);
    EnginePtr e = make_engine(m.get());

    RolloutsPtr r = routed_rollouts(e.get());
    ASSERT_NE(r, nullptr);
    Result info;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), info.out()));
    const int64_t L = static_cast<int64_t>(info.scalar("routed_layers"));
    const int64_t K = static_cast<int64_t>(info.scalar("routed_k"));
    { // tiny-moe: every layer sparse
        std::ifstream in(dir + "/config.json");
        const json config = json::parse(in);
        EXPECT_EQ(L, config.at("num_hidden_layers").get<int64_t>());
        EXPECT_EQ(K, config.at("num_experts_per_tok").get<int64_t>());
    }
    const IntTensor routes = int_tensor(info, "routed_experts");
    const std::vector<int64_t> rcu = info.tensor<int64_t>("routed_cu_seqlens");
    const std::vector<int64_t> lengths = info.tensor<int64_t>("completion_lengths");
    ASSERT_EQ(rcu.size(), 5u);
    const std::vector<size_t> prompt_len = {encode(m.get(), "ab").size(),
                                            encode(m.get(), "moe").size()};
    for (size_t i = 0; i < 4; ++i) // prompt + completion rows per rollout
        EXPECT_EQ(rcu[i + 1] - rcu[i], static_cast<int64_t>(prompt_len[i / 2]) + lengths[i]);
    ASSERT_EQ(routes.shape, (std::vector<int64_t>{rcu.back(), L, K}));

    // Exactly what rl_engine_generate records for the same prompts and seed.
    Result g;
    ASSERT_TRUE(engine_generate(m.get(), {"ab", "moe"}, kSampling, &g));
    const IntTensor engine_routes = int_tensor(g, "routed_experts");
    EXPECT_EQ(engine_routes.shape, routes.shape);
    EXPECT_EQ(engine_routes.values, routes.values);
    EXPECT_EQ(g.tensor<int64_t>("routed_cu_seqlens"), rcu);
    // The last token of each rollout is never read by the engine: -1.
    for (size_t i = 1; i < rcu.size(); ++i)
        EXPECT_EQ(routes.values[static_cast<size_t>((rcu[i] - 1) * L * K)], -1);

    // The batch packs them with the tokens; a split keeps them aligned.
    const std::vector<double> rewards = {1, 0, 0, 1};
    RL_ASSERT_OK(rl_rollouts_set_rewards(r.get(), rewards.data(), rewards.size()));
    Result binfo;
    BatchPtr batch = to_batch(r.get(), &binfo);
    ASSERT_NE(batch, nullptr);
    const IntTensor packed = int_tensor(binfo, "routed_experts");
    EXPECT_EQ(packed.shape, routes.shape);
    EXPECT_EQ(packed.values, routes.values);
    EXPECT_EQ(binfo.tensor<int64_t>("cu_seqlens"), rcu);
    const auto parts = halves(batch.get());
    for (size_t p = 0; p < parts.size(); ++p) {
        const IntTensor pr = int_tensor(*parts[p], "routed_experts");
        const int64_t a = rcu[2 * p], b = rcu[2 * p + 2];
        EXPECT_EQ(pr.shape, (std::vector<int64_t>{b - a, L, K}));
        EXPECT_EQ(pr.values, std::vector<int64_t>(routes.values.begin() + a * L * K,
                                                  routes.values.begin() + b * L * K));
    }

    // The trainer on the rollouts' weights: the replayed logprobs are the
    // rollouts' at every completion token.
    expect_replay_gives_the_engine_logprobs(m.get(), batch.get(), binfo);
    const std::vector<float> old = floats(binfo, "old_logprobs");
    const std::vector<float> mask = floats(binfo, "loss_mask");
    rl_batch_t view{};
    view.struct_size = sizeof view;
    RL_ASSERT_OK(rl_train_batch_view(batch.get(), &view));

    // A router change that routes some tokens elsewhere (on a copy loaded in
    // process, saved for the C API), aimed at tokens that score a completion.
    const int64_t T = static_cast<int64_t>(old.size());
    at::Tensor own, flipped;
    {
        auto policy = rl::core::Policy::load(dir);
        rl::core::CausalLM &cm = policy->model();
        at::NoGradGuard ng;
        auto route = [&](at::Tensor *logits_out) {
            rl::core::RouterLogitsRecorder rec;
            rl::core::PackedBatch pb;
            const std::vector<int64_t> bids = binfo.tensor<int64_t>("input_ids");
            pb.input_ids = at::tensor(bids, at::kLong);
            pb.cu_seqlens = at::tensor(rcu, at::kLong);
            cm.logits(pb);
            std::vector<at::Tensor> top, lg;
            for (const at::Tensor &l : rec.logits()) {
                lg.push_back(l.to(at::kDouble));
                top.push_back(std::get<1>(at::topk(at::softmax(l, -1, at::kFloat), K, -1)));
            }
            if (logits_out) *logits_out = at::stack(lg, 1);
            return at::stack(top, 1);
        };
        at::Tensor logits;
        own = route(&logits);
        at::Tensor targets = at::zeros({T}, at::kBool);
        for (int64_t i = 1; i < T; ++i)
            if (mask[static_cast<size_t>(i)] != 0) targets[i - 1] = true;
        ASSERT_TRUE(rl::core::test::flip_some_in_the_last_layer(cm, own, logits, targets));
        const at::Tensor now = route(nullptr);
        flipped =
            (std::get<0>(at::sort(now, -1)) != std::get<0>(at::sort(own, -1))).any(-1).any(-1);
        rl::core::save_pretrained(cm, flipped_dir);
    }
    int64_t scored_at_flip = 0;
    for (int64_t i = 1; i < T; ++i)
        scored_at_flip += mask[static_cast<size_t>(i)] != 0 && flipped[i - 1].item<bool>();
    ASSERT_GE(scored_at_flip, 1);

    ModelPtr m2 = load_model(flipped_dir);
    TrainerPtr t2 = make_trainer(m2.get(), "{}");
    const std::vector<float> replayed = logprobs(t2.get(), &view);
    WithoutRoutes self(batch.get());
    const std::vector<float> routed_self = logprobs(t2.get(), &self.b);
    for (int64_t i = 1; i < T; ++i) {
        const size_t u = static_cast<size_t>(i);
        if (mask[u] == 0) continue;
        EXPECT_NEAR(replayed[u], old[u], 1e-4) << "token " << i << " (replayed)";
        if (flipped[i - 1].item<bool>()) {
            EXPECT_GT(std::abs(routed_self[u] - old[u]), 1e-4) << "token " << i << " (flipped)";
        } else {
            EXPECT_NEAR(routed_self[u], old[u], 1e-4) << "token " << i;
        }
    }
}

TEST(MoeRollouts, TheBufferKeepsTheRoutingThroughSaveAndLoadAndRefusesMixedBatches) {
    TempDir tmp("moe-r3-buffer");
    const std::string dir = tmp.sub("m");
    RL_ASSERT_OK(rl_model_init_preset("tiny-moe", dir.c_str(), 6));
    ModelPtr m = load_model(dir);
    EnginePtr e = make_engine(m.get());
    RolloutsPtr r = routed_rollouts(e.get());
    ASSERT_NE(r, nullptr);
    const std::vector<double> rewards = {1, 0, 0, 1};
    RL_ASSERT_OK(rl_rollouts_set_rewards(r.get(), rewards.data(), rewards.size()));
    Result info;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), info.out()));
    const IntTensor routes = int_tensor(info, "routed_experts");

    BufferPtr first;
    BatchPtr batch = through_a_saved_buffer(r.get(), tmp.sub("buffer.json"), &first);
    ASSERT_NE(batch, nullptr);
    Result binfo;
    RL_ASSERT_OK(rl_train_batch_info(batch.get(), binfo.out()));
    const IntTensor packed = int_tensor(binfo, "routed_experts");
    EXPECT_EQ(packed.shape, routes.shape);
    EXPECT_EQ(packed.values, routes.values);

    // A group pushed without a routing cannot share a batch with them.
    RL_ASSERT_OK(rl_buffer_push_rollouts(first.get(), r.get(), nullptr));
    for (int k = 0; k < 2; ++k) {
        std::vector<int64_t> ids = {'a', 'b', 'c'};
        const int64_t n = static_cast<int64_t>(ids.size());
        rl_tensor_arg_t arg{"token_ids", view_of(ids.data(), &n, kI64)};
        const rl_tensor_list_t list{&arg, 1};
        RL_ASSERT_OK(rl_buffer_push(
            first.get(),
            (R"({"group_id": 9, "sampling_temperature": 1.0, "reward": )" + std::to_string(k) + "}")
                .c_str(),
            &list));
    }
    rl_train_batch_t *mixed = nullptr;
    EXPECT_EQ(rl_buffer_pop_train_batch(first.get(), 6, 0, &mixed), RL_ERR_BAD_STATE);
    EXPECT_NE(std::string(rl_last_error()).find("carry different routed_experts (group 9: none"),
              std::string::npos)
        << rl_last_error();
    EXPECT_EQ(mixed, nullptr);
}

// Multi-turn episodes of the guess_number env, a routing recorded per episode.
const char *kGame = R"({"lo": 1, "hi": 8, "max_guesses": 3})";
const char *kEpisodeOptions =
    R"({"sampling": {"n": 2, "max_tokens": 4, "seed": 7, "temperature": 1.0,
                     "return_routed_experts": true}, "max_turns": 3})";

InstancePtr guess_number() {
    rl_instance_t *i = nullptr;
    EXPECT_EQ(rl_instance_create(runtime(), "env", "guess_number", kGame, &i), RL_OK)
        << rl_last_error();
    return InstancePtr(i);
}

std::string game_tasks(rl_instance_t *env) {
    Result r;
    EXPECT_EQ(rl_env_sample(env, 2, 5, r.out()), RL_OK) << rl_last_error();
    return r.text("tasks");
}

TEST(MoeRollouts, EpisodesCarryTheirRoutingIntoTheBatchAndTheTrainerReplaysIt) {
    TempDir tmp("moe-r3-episodes");
    const std::string dir = tmp.sub("m");
    RL_ASSERT_OK(rl_model_init_preset("tiny-moe", dir.c_str(), 8));
    ModelPtr m = load_model(dir);
    EnginePtr e = make_engine(m.get());
    InstancePtr env = guess_number();
    rl_rollouts_t *raw = nullptr;
    RL_ASSERT_OK(rl_rollouts_generate_episodes(e.get(), env.get(), game_tasks(env.get()).c_str(),
                                               kEpisodeOptions, &raw));
    RolloutsPtr r(raw);
    Result info;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), info.out()));
    const int64_t L = static_cast<int64_t>(info.scalar("routed_layers"));
    const int64_t K = static_cast<int64_t>(info.scalar("routed_k"));
    EXPECT_EQ(L, 4); // tiny-moe: every layer sparse, top-2
    EXPECT_EQ(K, 2);
    const auto turns = info.tensor<int64_t>("turns");
    EXPECT_GT(*std::max_element(turns.begin(), turns.end()), 1)
        << "no episode got past its first turn";
    const IntTensor routes = int_tensor(info, "routed_experts");
    const std::vector<int64_t> rcu = info.tensor<int64_t>("routed_cu_seqlens");
    ASSERT_EQ(rcu.size(), 5u);
    ASSERT_EQ(routes.shape, (std::vector<int64_t>{rcu.back(), L, K}));

    // The batch: one routing row per token of each episode's sequence (prompt,
    // turns and observations), -1 only at its last token, never read.
    Result binfo;
    BatchPtr batch = to_batch(r.get(), &binfo);
    ASSERT_NE(batch, nullptr);
    const std::vector<int64_t> cu = binfo.tensor<int64_t>("cu_seqlens");
    EXPECT_EQ(cu, rcu);
    const IntTensor packed = int_tensor(binfo, "routed_experts");
    EXPECT_EQ(packed.shape, routes.shape);
    EXPECT_EQ(packed.values, routes.values);
    for (size_t s = 0; s + 1 < cu.size(); ++s)
        for (int64_t i = cu[s]; i < cu[s + 1]; ++i)
            EXPECT_EQ(packed.values[static_cast<size_t>(i * L * K)] < 0, i == cu[s + 1] - 1)
                << "episode " << s << " token " << i - cu[s];

    // The trainer replays it: its logprobs are the engine's at every sampled
    // token (mask 1), the turns after an observation included.
    expect_replay_gives_the_engine_logprobs(m.get(), batch.get(), binfo);
}

TEST(MoeRollouts, EpisodesCarryTheirRoutingWeightsAlignedWithTheirTokens) {
    TempDir tmp("moe-r3-episode-weights");
    const std::string dir = tmp.sub("m");
    RL_ASSERT_OK(rl_model_init_preset("tiny-moe", dir.c_str(), 8));
    ModelPtr m = load_model(dir);
    EnginePtr e = make_engine(m.get());
    InstancePtr env = guess_number();
    json options = json::parse(kEpisodeOptions);
    options["sampling"]["return_expert_logits"] = true;
    rl_rollouts_t *raw = nullptr;
    RL_ASSERT_OK(rl_rollouts_generate_episodes(e.get(), env.get(), game_tasks(env.get()).c_str(),
                                               options.dump().c_str(), &raw));
    RolloutsPtr r(raw);
    Result info;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), info.out()));
    const IntTensor routes = int_tensor(info, "routed_experts");
    const std::vector<float> weights = floats(info, "routed_expert_weights");
    ASSERT_EQ(weights.size(), routes.values.size());
    // A weight where an expert was read, 0 in the never-read rows.
    for (size_t i = 0; i < weights.size(); ++i)
        EXPECT_EQ(weights[i] > 0.0f, routes.values[i] >= 0) << "value " << i;

    Result binfo;
    BatchPtr batch = to_batch(r.get(), &binfo);
    ASSERT_NE(batch, nullptr);
    EXPECT_EQ(floats(binfo, "routed_expert_weights"), weights);
    // Each row's weights belong to the forward that read the token (turns
    // after an observation included): replayed under a sharper router, they
    // still give the engine's logprobs.
    expect_weights_replay_survives_a_sharper_router(dir, tmp.sub("sharper"), batch.get(), binfo);
}

// sampling.return_expert_logits as well: the rollouts carry the weights the
// engine mixed the experts with, the buffer keeps them, the batch packs them as
// routed_expert_weights next to routed_experts, and the trainer mixes the
// replayed experts with exactly them. A router change that keeps every top-k
// choice but moves the probabilities (the router scaled by 3): replaying ids
// and weights still gives the rollouts' logprobs, ids alone do not.
TEST(MoeRollouts, RecordedRoutingWeightsReachTheTrainerWhichMixesWithThem) {
    TempDir tmp("moe-r3-weights");
    const std::string dir = tmp.sub("m"), sharper_dir = tmp.sub("sharper");
    RL_ASSERT_OK(rl_model_init_preset("tiny-moe", dir.c_str(), 5));
    ModelPtr m = load_model(dir);
    EnginePtr e = make_engine(m.get());
    const std::string sampling =
        R"({"n": 2, "max_tokens": 4, "seed": 17, "temperature": 1.0,
            "return_routed_experts": true, "return_expert_logits": true})";
    rl_rollouts_t *raw = nullptr;
    RL_ASSERT_OK(
        rl_rollouts_generate(e.get(), kTasks, (R"({"sampling": )" + sampling + "}").c_str(), &raw));
    RolloutsPtr r(raw);
    Result info;
    RL_ASSERT_OK(rl_rollouts_info(r.get(), info.out()));
    const IntTensor routes = int_tensor(info, "routed_experts");
    const std::vector<float> weights = floats(info, "routed_expert_weights");
    const std::vector<int64_t> rcu = info.tensor<int64_t>("routed_cu_seqlens");
    ASSERT_EQ(weights.size(), routes.values.size());
    const int64_t L = routes.shape[1], K = routes.shape[2];

    // Exactly what rl_engine_generate records; 0 in the never-read rows.
    Result g;
    ASSERT_TRUE(engine_generate(m.get(), {"ab", "moe"}, sampling.c_str(), &g));
    EXPECT_EQ(floats(g, "routed_expert_weights"), weights);
    for (size_t i = 1; i < rcu.size(); ++i)
        for (int64_t j = 0; j < L * K; ++j)
            EXPECT_EQ(weights[static_cast<size_t>((rcu[i] - 1) * L * K + j)], 0.0f);

    // Through the buffer (saved and loaded) into a batch and its split.
    const std::vector<double> rewards = {1, 0, 0, 1};
    RL_ASSERT_OK(rl_rollouts_set_rewards(r.get(), rewards.data(), rewards.size()));
    BufferPtr first;
    BatchPtr batch = through_a_saved_buffer(r.get(), tmp.sub("buffer.json"), &first);
    ASSERT_NE(batch, nullptr);
    Result binfo;
    RL_ASSERT_OK(rl_train_batch_info(batch.get(), binfo.out()));
    EXPECT_EQ(floats(binfo, "routed_expert_weights"), weights);
    const auto parts = halves(batch.get());
    for (size_t p = 0; p < parts.size(); ++p) {
        const int64_t a = rcu[2 * p], b = rcu[2 * p + 2];
        EXPECT_EQ(floats(*parts[p], "routed_expert_weights"),
                  std::vector<float>(weights.begin() + a * L * K, weights.begin() + b * L * K));
    }

    expect_weights_replay_survives_a_sharper_router(dir, sharper_dir, batch.get(), binfo);

    // Rollouts with weights and rollouts without cannot share a batch.
    rl_rollouts_t *plain = nullptr;
    RL_ASSERT_OK(rl_rollouts_generate(
        e.get(), kTasks,
        (std::string(R"({"group_offset": 5, "sampling": )") + kSampling + "}").c_str(), &plain));
    RolloutsPtr without(plain);
    RL_ASSERT_OK(rl_rollouts_set_rewards(without.get(), rewards.data(), rewards.size()));
    RL_ASSERT_OK(rl_buffer_push_rollouts(first.get(), without.get(), nullptr));
    rl_train_batch_t *mixed = nullptr;
    EXPECT_EQ(rl_buffer_pop_train_batch(first.get(), 8, 0, &mixed), RL_ERR_BAD_STATE);
    EXPECT_NE(std::string(rl_last_error()).find("return_expert_logits"), std::string::npos)
        << rl_last_error();
    EXPECT_EQ(mixed, nullptr);
}

// rl_buffer_push takes a rollout's routing as tensors (what the disaggregated
// orchestrator forwards): [n, L, K] ids and weights reach the batch; a wrong
// rank, weights without ids, ids that do not cover the tokens are refused.
TEST(MoeRollouts, BufferPushTakesRoutingTensorsAndRefusesBadOnes) {
    rl_buffer_t *raw = nullptr;
    RL_ASSERT_OK(rl_buffer_create(R"({"group_size": 2})", &raw));
    BufferPtr buffer(raw);
    const std::vector<int64_t> ids = {'a', 'b', 'c'};
    const int64_t n = 3;
    const std::vector<int32_t> routes = {0, 1, 2, 3, 1, 2, 3, 0, -1, -1, -1, -1}; // [3, 2, 2]
    const std::vector<float> weights = {.6f, .4f, .7f, .3f, .5f, .5f, .9f, .1f, 0, 0, 0, 0};
    const int64_t shape[3] = {3, 2, 2}, short_shape[3] = {2, 2, 2};
    auto routed_view = [&](const void *data, const int64_t *s, rl_dtype_t dtype, int32_t ndim) {
        rl_tensor_view_t v = view_of(data, s, dtype);
        v.ndim = ndim;
        return v;
    };
    const rl_dtype_t i32{RL_DTYPE_INT, 32, 1};
    auto push = [&](int64_t group, double reward, std::vector<rl_tensor_arg_t> extra) {
        std::vector<rl_tensor_arg_t> args = {{"token_ids", view_of(ids.data(), &n, kI64)}};
        args.insert(args.end(), extra.begin(), extra.end());
        const rl_tensor_list_t list{args.data(), args.size()};
        return rl_buffer_push(buffer.get(),
                              (R"({"group_id": )" + std::to_string(group) + R"(, "reward": )" +
                               std::to_string(reward) + "}")
                                  .c_str(),
                              &list);
    };
    const rl_tensor_arg_t good_ids{"routed_experts", routed_view(routes.data(), shape, i32, 3)};
    const rl_tensor_arg_t good_w{"routed_expert_weights",
                                 routed_view(weights.data(), shape, kF32, 3)};
    for (int k = 0; k < 2; ++k) RL_ASSERT_OK(push(1, k, {good_ids, good_w}));
    rl_train_batch_t *braw = nullptr;
    RL_ASSERT_OK(rl_buffer_pop_train_batch(buffer.get(), 2, 0, &braw));
    BatchPtr batch(braw);
    Result binfo;
    RL_ASSERT_OK(rl_train_batch_info(batch.get(), binfo.out()));
    const IntTensor packed = int_tensor(binfo, "routed_experts");
    EXPECT_EQ(packed.shape, (std::vector<int64_t>{6, 2, 2}));
    std::vector<int64_t> twice(routes.begin(), routes.end());
    twice.insert(twice.end(), routes.begin(), routes.end());
    EXPECT_EQ(packed.values, twice);
    std::vector<float> twice_w = weights;
    twice_w.insert(twice_w.end(), weights.begin(), weights.end());
    EXPECT_EQ(floats(binfo, "routed_expert_weights"), twice_w);

    auto refused = [&](std::vector<rl_tensor_arg_t> extra, const std::string &want) {
        EXPECT_EQ(push(2, 0, std::move(extra)), RL_ERR_INVALID_ARG) << want;
        EXPECT_NE(std::string(rl_last_error()).find(want), std::string::npos) << rl_last_error();
    };
    refused({{"routed_experts", routed_view(routes.data(), &n, i32, 1)}},
            "tensor 'routed_experts' must be 3-D [tokens, sparse layers, experts per token]");
    refused({good_w}, "tensor 'routed_expert_weights' weighs routed experts: it needs "
                      "'routed_experts'");
    refused({{"routed_experts", routed_view(routes.data(), short_shape, i32, 3)}},
            "routed_experts has 8 ids, token_ids x routed_layers x routed_k = 12");
    refused({{"routed_experts", routed_view(weights.data(), shape, kF32, 3)}},
            "must hold integer expert ids");
}

TEST(MoeRollouts, RecordingIsRefusedOnADenseModelNamingTheOption) {
    ModelPtr m = load_model(); // the dense tiny preset
    EnginePtr e = make_engine(m.get());
    rl_rollouts_t *r = nullptr;
    const std::string options = std::string(R"({"sampling": )") + kSampling + "}";
    EXPECT_EQ(rl_rollouts_generate(e.get(), kTasks, options.c_str(), &r), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("return_routed_experts"), std::string::npos)
        << rl_last_error();
    EXPECT_EQ(r, nullptr);
    InstancePtr env = guess_number();
    EXPECT_EQ(rl_rollouts_generate_episodes(e.get(), env.get(), game_tasks(env.get()).c_str(),
                                            kEpisodeOptions, &r),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error())
                  .find("generate_episodes: return_routed_experts: the model has no sparse MoE "
                        "layer"),
              std::string::npos)
        << rl_last_error();
    EXPECT_EQ(r, nullptr);
}

} // namespace
