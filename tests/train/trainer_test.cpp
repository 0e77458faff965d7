// The trainer through the C API: weight sync with the co-located engine,
// packing / micro-batching invariance, gradient accumulation, schedules,
// clipping, learning, and the errors bad input gets.
#include "train_util.hpp"

#include <nlohmann/json.hpp>

#include <cstring>

using namespace rl_train_test;

namespace {

// Forward logprobs of a batch.
std::vector<float> forward_logprobs(rl_trainer_t *t, Batch &b) {
    Result r;
    if (rl_trainer_forward(t, b.view(), nullptr, r.out()) != RL_OK) {
        ADD_FAILURE() << rl_last_error();
        return {};
    }
    return r.tensor<float>("logprobs");
}

// A policy-loss batch: random sequences with old_logprobs from the current weights.
Batch policy_batch(rl_trainer_t *t, uint32_t seed, int n_seqs) {
    Batch b = random_batch(seed, n_seqs, 5, 40);
    b.floats["old_logprobs"] = forward_logprobs(t, b);
    // Pretend the behaviour policy differed a little, so ratios are not all 1.
    std::mt19937 rng(seed + 1);
    std::normal_distribution<float> noise(0.0f, 0.05f);
    for (auto &x : b.floats["old_logprobs"]) x += noise(rng);
    return b;
}

struct StepOut {
    double loss = 0, grad_norm = 0;
    std::vector<float> before, probe; // forward logprobs of a probe batch before / after the step
};

// One optimizer step over `calls` (each a batch given to forward_backward).
StepOut train_step(const std::string &config, std::vector<Batch> calls, rl_instance_t *loss,
                   Batch probe) {
    ModelPtr m = load_model();
    TrainerPtr t = make_trainer(m.get(), config);
    StepOut out;
    out.before = forward_logprobs(t.get(), probe);
    for (auto &b : calls) {
        Result r;
        if (rl_trainer_forward_backward(t.get(), b.view(), loss, r.out()) != RL_OK) {
            ADD_FAILURE() << rl_last_error();
            return out;
        }
        out.loss += r.scalar("loss");
    }
    Result o;
    if (rl_trainer_optim_step(t.get(), nullptr, o.out()) != RL_OK) {
        ADD_FAILURE() << rl_last_error();
        return out;
    }
    out.grad_norm = o.scalar("grad_norm");
    out.probe = forward_logprobs(t.get(), probe);
    return out;
}

std::string cfg(const std::string &extra) {
    return R"({"learning_rate": 1e-3, "gradient_clip": 0)" + (extra.empty() ? "" : ", " + extra) +
           "}";
}

// AdamW with eps = 1: its first step is ~ learning_rate * gradient (for the
// small gradients here), so parameters after one step compare gradients
// elementwise. (With a tiny eps the first step is ~ lr * sign(g), which turns
// float rounding of near-zero gradients into visible differences.)
std::string linear_cfg(const std::string &extra) {
    return R"({"learning_rate": 0.1, "eps": 1.0, "gradient_clip": 0)" +
           (extra.empty() ? "" : ", " + extra) + "}";
}

} // namespace

// -- weight sync ------------------------------------------------------------------

TEST(WeightSync, EngineLogprobsEqualTrainerForwardAfterOptimStep) {
    ModelPtr model = load_model();
    ModelPtr reference = load_model(); // never trained: the weights before the step
    TrainerPtr trainer = make_trainer(model.get(), cfg(""));
    TrainerPtr ref_trainer = make_trainer(reference.get(), cfg(""));
    EnginePtr engine = make_engine(model.get());
    const std::vector<int64_t> prompt = encode(model.get(), "Reverse: abc\n");
    ASSERT_FALSE(prompt.empty());
    const int64_t shape = static_cast<int64_t>(prompt.size());
    const int64_t cu[2] = {0, shape}, cu_shape = 2;
    const rl_tensor_view_t pv = view_of(prompt.data(), &shape, kI64);
    const rl_tensor_view_t cv = view_of(cu, &cu_shape, kI64);
    const char *params = R"({"n": 3, "seed": 11, "max_tokens": 12, "stop_token_ids": []})";

    // Sample, then score prompt + completion with the trainer.
    auto sample_and_score = [&](rl_trainer_t *scorer, std::vector<float> *engine_lp,
                                std::vector<float> *trainer_lp) {
        Result g;
        ASSERT_EQ(rl_engine_generate(engine.get(), &pv, &cv, params, g.out()), RL_OK)
            << rl_last_error();
        const auto toks = g.tensor<int64_t>("token_ids");
        const auto cus = g.tensor<int64_t>("cu_seqlens");
        *engine_lp = g.tensor<float>("logprobs");
        Batch b;
        for (size_t s = 0; s + 1 < cus.size(); ++s) {
            std::vector<int64_t> seq = prompt;
            seq.insert(seq.end(), toks.begin() + cus[s], toks.begin() + cus[s + 1]);
            b.add(seq);
        }
        const auto lp = forward_logprobs(scorer, b);
        trainer_lp->clear();
        for (int64_t s = 0; s < b.n_seqs(); ++s)
            for (int64_t t = b.cu[s] + shape; t < b.cu[s + 1]; ++t) trainer_lp->push_back(lp[t]);
    };

    std::vector<float> e0, f0;
    sample_and_score(trainer.get(), &e0, &f0);
    ASSERT_EQ(e0.size(), 36u);
    EXPECT_LT(max_abs_diff(e0, f0), 2e-5);

    // One SFT step changes the weights.
    Batch sft;
    sft.add(encode(model.get(), "Reverse: abc\ncba"));
    sft.add(encode(model.get(), "Reverse: hello\nolleh"));
    InstancePtr ce = make_loss("causallm_loss");
    Result fb, os;
    RL_ASSERT_OK(rl_trainer_forward_backward(trainer.get(), sft.view(), ce.get(), fb.out()));
    RL_ASSERT_OK(rl_trainer_optim_step(trainer.get(), nullptr, os.out()));
    EXPECT_EQ(os.scalar("policy_version"), 1.0);

    // The engine refuses to sample with weights it has not synced.
    Result stale;
    EXPECT_EQ(rl_engine_generate(engine.get(), &pv, &cv, params, stale.out()), RL_ERR_BAD_STATE);
    EXPECT_NE(std::string(rl_last_error()).find("sync"), std::string::npos) << rl_last_error();
    Result sync;
    RL_ASSERT_OK(rl_engine_sync_weights(engine.get(), sync.out()));
    EXPECT_EQ(sync.scalar("policy_version"), 1.0);

    std::vector<float> e1, f1, before;
    sample_and_score(trainer.get(), &e1, &f1);
    EXPECT_LT(max_abs_diff(e1, f1), 2e-5);
    // The same sequences under the weights before the step score differently.
    std::vector<float> e1_again;
    sample_and_score(ref_trainer.get(), &e1_again, &before);
    EXPECT_EQ(e1, e1_again); // same seed, same weights: same samples
    EXPECT_GT(max_abs_diff(e1, before), 1e-3);
    Result info;
    RL_ASSERT_OK(rl_model_info(model.get(), info.out()));
    EXPECT_EQ(nlohmann::json::parse(info.text("info"))["policy_version"], 1);
}

// -- packing -------------------------------------------------------------------

TEST(Packing, PackedAndUnpackedBatchesGiveTheSameLossAndGradients) {
    InstancePtr loss = make_loss("policy_loss", R"({"loss_agg_mode": "seq-mean-token-mean"})");
    Batch batch;
    {
        ModelPtr m = load_model();
        TrainerPtr t = make_trainer(m.get(), cfg(""));
        batch = policy_batch(t.get(), 3, 12);
    }
    Batch probe = random_batch(99, 4, 10, 20);
    const StepOut whole = train_step(linear_cfg(R"("sample_packing_sequence_len": 4096)"), {batch},
                                     loss.get(), probe);
    ASSERT_GT(whole.grad_norm, 0);
    ASSERT_GT(max_abs_diff(whole.probe, whole.before), 1e-2); // the step moved the model
    const std::vector<std::string> configs = {
        R"("enable_packing": false)",
        R"("enable_packing": false, "micro_batch_tokens": 1)",
        R"("sample_packing_sequence_len": 48, "micro_batch_tokens": 48)",
        R"("sample_packing_sequence_len": 64, "micro_batch_tokens": 130)",
        R"("sample_packing_sequence_len": 40, "micro_batch_tokens": 8192)",
    };
    for (const auto &c : configs) {
        SCOPED_TRACE(c);
        const StepOut s = train_step(linear_cfg(c), {batch}, loss.get(), probe);
        EXPECT_NEAR(s.loss, whole.loss, 1e-6);
        EXPECT_NEAR(s.grad_norm, whole.grad_norm, 1e-5 * whole.grad_norm);
        EXPECT_LT(max_abs_diff(s.probe, whole.probe), 1e-5);
    }
}

TEST(Packing, ResultReportsBinsAndMicroBatches) {
    ModelPtr m = load_model();
    TrainerPtr t = make_trainer(
        m.get(), cfg(R"("sample_packing_sequence_len": 10, "micro_batch_tokens": 20)"));
    Batch b;
    for (int len : {4, 5, 6, 3, 10}) b.add(std::vector<int64_t>(static_cast<size_t>(len), 65));
    Result r;
    RL_ASSERT_OK(rl_trainer_forward(t.get(), b.view(), nullptr, r.out()));
    // Greedy in order: [4,5] [6,3] [10]; micro-batches of <= 20 tokens: [9+9] [10].
    EXPECT_EQ(r.scalar("bins"), 3);
    EXPECT_EQ(r.scalar("micro_batches"), 2);
    EXPECT_EQ(r.scalar("tokens"), 28);
    const auto lp = r.tensor<float>("logprobs");
    const auto ent = r.tensor<float>("entropy");
    ASSERT_EQ(lp.size(), 28u);
    for (int64_t s = 0; s < b.n_seqs(); ++s) {
        EXPECT_EQ(lp[b.cu[s]], 0.0f) << "first token of sequence " << s;
        EXPECT_EQ(ent[b.cu[s]], 0.0f) << "first token of sequence " << s;
        if (b.cu[s] + 1 < b.cu[s + 1]) {
            EXPECT_LT(lp[b.cu[s] + 1], 0.0f);
        }
    }
}

TEST(Packing, LossExtraTensorsComeBackInBatchOrderAcrossMicroBatches) {
    InstancePtr loss = make_loss("per_token_ce");
    ModelPtr m = load_model();
    TrainerPtr t = make_trainer(
        m.get(), cfg(R"("sample_packing_sequence_len": 32, "micro_batch_tokens": 32)"));
    Batch b = random_batch(12, 7, 6, 30);
    b.floats.erase("advantages");
    const auto lp = forward_logprobs(t.get(), b);
    Result r;
    RL_ASSERT_OK(rl_trainer_forward_backward(t.get(), b.view(), loss.get(), r.out()));
    EXPECT_GT(r.scalar("micro_batches"), 2);
    const auto el = r.tensor<double>("elementwise_loss");
    ASSERT_EQ(el.size(), b.ids.size());
    const auto &mask = b.floats.at("loss_mask");
    double sum = 0;
    for (size_t i = 0; i < el.size(); ++i) {
        EXPECT_NEAR(el[i], mask[i] != 0 ? -lp[i] : 0.0, 1e-5) << "token " << i;
        sum += el[i];
    }
    EXPECT_NEAR(r.scalar("loss"), sum / static_cast<double>(mask_tokens(b)), 1e-5);
    EXPECT_EQ(r.scalar("loss_tokens"), mask_tokens(b));
}

// Metrics declared with a reduction (ABI 0.6) come out of several micro-batches
// as out of one call: min / max over every token, token means weighted by
// each call's tokens, counts summed.
TEST(Packing, MetricsReduceOverMicroBatchesAsOverOneCall) {
    InstancePtr loss = make_loss("policy_loss", R"({"compute_kl_stats": true})");
    ModelPtr m = load_model();
    TrainerPtr one = make_trainer(m.get(), cfg(R"("sample_packing_sequence_len": 4096)"));
    Batch b = policy_batch(one.get(), 7, 9);
    Result whole;
    RL_ASSERT_OK(rl_trainer_forward_backward(one.get(), b.view(), loss.get(), whole.out()));
    ASSERT_EQ(whole.scalar("micro_batches"), 1);
    TrainerPtr split = make_trainer(
        m.get(), cfg(R"("sample_packing_sequence_len": 48, "micro_batch_tokens": 48)"));
    Result parts;
    RL_ASSERT_OK(rl_trainer_forward_backward(split.get(), b.view(), loss.get(), parts.out()));
    ASSERT_GE(parts.scalar("micro_batches"), 3);
    for (const char *name : {"ratio_min", "ratio_max", "ratio_mean", "pg_clipfrac",
                             "kl_sample_train_k3", "valid_tokens", "pg_loss"}) {
        SCOPED_TRACE(name);
        EXPECT_NEAR(parts.metric(name), whole.metric(name),
                    1e-9 + 1e-6 * std::fabs(whole.metric(name)));
    }
    EXPECT_EQ(whole.metric("valid_tokens"), mask_tokens(b));
    EXPECT_LT(whole.metric("ratio_min"), whole.metric("ratio_mean"));
    EXPECT_GT(whole.metric("ratio_max"), whole.metric("ratio_mean"));
}

// z-loss through the trainer: the loss input "logsumexp" comes from the
// chunked log-softmax pass (never from the batch), and the loss is the cross
// entropy plus z_loss times the mean log^2 Z the loss reports.
TEST(ZLoss, TheTrainerComputesLogsumexpForALossThatAsksForIt) {
    InstancePtr ce = make_loss("causallm_loss");
    InstancePtr ce_z = make_loss("causallm_loss", R"({"z_loss": 0.01})");
    ModelPtr m = load_model();
    TrainerPtr t = make_trainer(
        m.get(), cfg(R"("sample_packing_sequence_len": 32, "micro_batch_tokens": 32)"));
    Batch b = random_batch(5, 6, 6, 20);
    b.floats.erase("advantages");
    Result plain, with_z;
    RL_ASSERT_OK(rl_trainer_forward(t.get(), b.view(), ce.get(), plain.out()));
    RL_ASSERT_OK(rl_trainer_forward_backward(t.get(), b.view(), ce_z.get(), with_z.out()));
    const double z = with_z.metric("z_loss");
    EXPECT_GT(z, 0.0);
    EXPECT_NEAR(with_z.scalar("loss"), plain.scalar("loss") + 0.01 * z, 1e-5);
    b.floats["logsumexp"] = std::vector<float>(b.ids.size(), 1.0f);
    Result refused;
    EXPECT_NE(rl_trainer_forward(t.get(), b.view(), ce_z.get(), refused.out()), RL_OK);
    EXPECT_NE(std::string(rl_last_error()).find("'logsumexp' is computed by the trainer"),
              std::string::npos)
        << rl_last_error();
}

// The temperature of the logits-level inputs (logprobs, entropy) must be > 0;
// the refusal names the key.
TEST(ZLoss, AZeroLogprobTemperatureIsRefusedNamingTheKey) {
    ModelPtr m = load_model();
    rl_trainer_t *t = nullptr;
    EXPECT_NE(rl_trainer_create(m.get(), cfg(R"("logprob_temperature": 0)").c_str(), &t), RL_OK);
    EXPECT_EQ(t, nullptr);
    EXPECT_NE(std::string(rl_last_error()).find("logprob_temperature"), std::string::npos)
        << rl_last_error();
}

TEST(Packing, SequenceLongerThanABinIsRefusedWithItsIndexAndLength) {
    ModelPtr m = load_model();
    TrainerPtr t = make_trainer(m.get(), cfg(R"("sample_packing_sequence_len": 8)"));
    Batch b;
    b.add({65, 66, 67});
    b.add(std::vector<int64_t>(9, 65));
    Result r;
    EXPECT_EQ(rl_trainer_forward(t.get(), b.view(), nullptr, r.out()), RL_ERR_INVALID_ARG);
    const std::string e = rl_last_error();
    EXPECT_NE(e.find("sequence 1 has 9 tokens"), std::string::npos) << e;
    EXPECT_NE(e.find("sample_packing_sequence_len"), std::string::npos) << e;
}

// -- gradient accumulation ----------------------------------------------------------

TEST(Accumulation, TwoHalfCallsWithGlobalNormalizersEqualOneCall) {
    InstancePtr loss = make_loss("policy_loss"); // token-mean
    Batch batch;
    {
        ModelPtr m = load_model();
        TrainerPtr t = make_trainer(m.get(), cfg(""));
        batch = policy_batch(t.get(), 5, 10);
    }
    Batch probe = random_batch(98, 4, 10, 20);
    const StepOut whole = train_step(linear_cfg(""), {batch}, loss.get(), probe);

    Batch a = batch.slice(0, 3), b = batch.slice(3, 10);
    ASSERT_NE(mask_tokens(a), mask_tokens(b));
    for (Batch *h : {&a, &b}) {
        h->global_tokens = static_cast<double>(mask_tokens(batch));
        h->global_seqs = static_cast<double>(batch.n_seqs());
    }
    const StepOut halves = train_step(linear_cfg(""), {a, b}, loss.get(), probe);
    EXPECT_NEAR(halves.loss, whole.loss, 1e-6);
    EXPECT_NEAR(halves.grad_norm, whole.grad_norm, 1e-5 * whole.grad_norm);
    EXPECT_LT(max_abs_diff(halves.probe, whole.probe), 1e-5);

    // Without the normalizers each half is averaged on its own: a different gradient.
    Batch a2 = batch.slice(0, 3), b2 = batch.slice(3, 10);
    const StepOut naive = train_step(linear_cfg(""), {a2, b2}, loss.get(), probe);
    EXPECT_GT(std::fabs(naive.grad_norm - whole.grad_norm), 1e-3 * whole.grad_norm);
}

TEST(Accumulation, GlobalTokensBelowTheCallsOwnCountIsRefused) {
    InstancePtr loss = make_loss("policy_loss");
    ModelPtr m = load_model();
    TrainerPtr t = make_trainer(m.get(), cfg(""));
    Batch b = policy_batch(t.get(), 6, 4);
    b.global_tokens = 1;
    Result r;
    EXPECT_EQ(rl_trainer_forward_backward(t.get(), b.view(), loss.get(), r.out()),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("global_tokens"), std::string::npos)
        << rl_last_error();
}

// -- optimizer ------------------------------------------------------------------------

namespace {

std::vector<double> lr_curve(const std::string &config, int steps,
                             const char *overrides = nullptr) {
    ModelPtr m = load_model();
    TrainerPtr t = make_trainer(m.get(), config);
    InstancePtr ce = make_loss("causallm_loss");
    std::vector<double> lrs;
    for (int i = 0; i < steps; ++i) {
        Batch b;
        b.add({72, 105, 33});
        Result r, o;
        EXPECT_EQ(rl_trainer_forward_backward(t.get(), b.view(), ce.get(), r.out()), RL_OK)
            << rl_last_error();
        EXPECT_EQ(rl_trainer_optim_step(t.get(), i == 1 ? overrides : nullptr, o.out()), RL_OK)
            << rl_last_error();
        lrs.push_back(o.scalar("learning_rate"));
        EXPECT_EQ(o.scalar("step"), i + 1);
    }
    return lrs;
}

} // namespace

TEST(Schedule, LinearWarmupRampsThenHolds) {
    const auto lrs = lr_curve(
        R"({"learning_rate": 0.01, "lr_schedule": "linear_warmup", "warmup_steps": 4})", 6);
    const std::vector<double> want = {0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01};
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(lrs[i], want[i], 1e-12) << i;
}

TEST(Schedule, CosineDecaysToTheFloorAtTotalSteps) {
    const auto lrs = lr_curve(
        R"({"learning_rate": 0.01, "lr_schedule": "cosine", "warmup_steps": 2, "min_lr_ratio": 0.1, "total_steps": 6})",
        7);
    EXPECT_NEAR(lrs[0], 0.005, 1e-12);
    EXPECT_NEAR(lrs[1], 0.01, 1e-12);
    // step 2..6: progress 0, 1/4, 1/2, 3/4, 1 of the cosine from 0.01 to 0.001
    for (int s = 2; s <= 6; ++s) {
        const double p = std::min(1.0, (s - 2) / 4.0);
        EXPECT_NEAR(lrs[s], 0.01 * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * p))), 1e-12) << s;
    }
    EXPECT_NEAR(lrs[6], 0.001, 1e-12);
}

TEST(Schedule, LearningRateOverrideAppliesToOneStep) {
    const auto lrs = lr_curve(R"({"learning_rate": 0.01})", 3, R"({"learning_rate": 0.5})");
    EXPECT_DOUBLE_EQ(lrs[0], 0.01);
    EXPECT_DOUBLE_EQ(lrs[1], 0.5);
    EXPECT_DOUBLE_EQ(lrs[2], 0.01);
}

TEST(Schedule, ContradictorySettingsAreRefusedByName) {
    ModelPtr m = load_model();
    rl_trainer_t *t = nullptr;
    EXPECT_EQ(rl_trainer_create(m.get(), R"({"lr_schedule": "cosine"})", &t), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("total_steps"), std::string::npos);
    EXPECT_EQ(rl_trainer_create(m.get(), R"({"warmup_steps": 3})", &t), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("warmup_steps"), std::string::npos);
    EXPECT_EQ(rl_trainer_create(m.get(), R"({"learning_rat": 0.1})", &t), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("learning_rat'"), std::string::npos);
    EXPECT_EQ(rl_trainer_create(m.get(), R"({"beta2": 1.5})", &t), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("trainer.beta2"), std::string::npos);
    EXPECT_EQ(t, nullptr);
}

TEST(Optimizer, GradNormIsReportedBeforeClippingAndClippingShrinksTheStep) {
    InstancePtr ce = make_loss("causallm_loss");
    Batch data;
    data.add(encode(load_model().get(), "clip me if you can"));
    Batch probe = data;
    // eps = 1 makes AdamW's first step proportional to the (clipped) gradient.
    auto run = [&](double clip, double *norm) {
        ModelPtr m = load_model();
        TrainerPtr t =
            make_trainer(m.get(), R"({"learning_rate": 1.0, "eps": 1.0, "gradient_clip": )" +
                                      std::to_string(clip) + "}");
        const auto before = forward_logprobs(t.get(), probe);
        Result r, o;
        EXPECT_EQ(rl_trainer_forward_backward(t.get(), data.view(), ce.get(), r.out()), RL_OK);
        EXPECT_EQ(rl_trainer_optim_step(t.get(), nullptr, o.out()), RL_OK) << rl_last_error();
        *norm = o.scalar("grad_norm");
        return max_abs_diff(before, forward_logprobs(t.get(), probe));
    };
    double n_free = 0, n_clipped = 0;
    const double free_change = run(0.0, &n_free);
    const double clipped_change = run(1e-3, &n_clipped);
    EXPECT_NEAR(n_free, n_clipped, 1e-6 * n_free); // reported before clipping
    EXPECT_GT(n_free, 1e-2);
    EXPECT_GT(free_change, 0);
    EXPECT_LT(clipped_change, 0.2 * free_change);
}

TEST(Optimizer, OptimStepWithoutGradientsIsBadState) {
    ModelPtr m = load_model();
    TrainerPtr t = make_trainer(m.get(), cfg(""));
    Result o;
    EXPECT_EQ(rl_trainer_optim_step(t.get(), nullptr, o.out()), RL_ERR_BAD_STATE);
    EXPECT_NE(std::string(rl_last_error()).find("forward_backward"), std::string::npos);
    EXPECT_EQ(rl_trainer_optim_step(t.get(), R"({"betas": 1})", o.out()), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("'betas'"), std::string::npos);
}

TEST(Optimizer, AStepWithAllZeroLossGradientsLeavesTheParametersAlone) {
    InstancePtr loss = make_loss("policy_loss");
    ModelPtr m = load_model();
    TrainerPtr t = make_trainer(m.get(), R"({"learning_rate": 0.1, "weight_decay": 0.1})");
    Batch b = policy_batch(t.get(), 8, 4);
    for (auto &a : b.floats["advantages"]) a = 0.0f; // no signal (a GRPO group of equal rewards)
    Batch probe = random_batch(97, 2, 8, 12);
    const auto before = forward_logprobs(t.get(), probe);
    Result r, o;
    RL_ASSERT_OK(rl_trainer_forward_backward(t.get(), b.view(), loss.get(), r.out()));
    RL_ASSERT_OK(rl_trainer_optim_step(t.get(), nullptr, o.out()));
    EXPECT_EQ(o.scalar("grad_norm"), 0.0);
    EXPECT_EQ(o.scalar("policy_version"), 1.0);
    EXPECT_EQ(forward_logprobs(t.get(), probe), before);
}

// -- learning ---------------------------------------------------------------------------

TEST(Learning, SftOnAFixedDatasetLowersTheLossClearly) {
    ModelPtr m = load_model();
    TrainerPtr t = make_trainer(m.get(), R"({"learning_rate": 3e-3, "gradient_clip": 1.0})");
    InstancePtr ce = make_loss("causallm_loss");
    Batch data;
    for (const char *w : {"abc", "hello", "world", "tiny", "model", "rl", "loop", "learns"}) {
        std::string s = w, r(s.rbegin(), s.rend());
        const auto prompt = encode(m.get(), "Reverse: " + s + "\n");
        auto full = encode(m.get(), "Reverse: " + s + "\n" + r + "\n");
        std::vector<float> mask(full.size(), 0.0f);
        for (size_t i = prompt.size(); i < full.size(); ++i) mask[i] = 1.0f;
        data.add(full, {{"loss_mask", mask}});
    }
    std::vector<double> losses;
    for (int step = 0; step < 40; ++step) {
        Result r, o;
        RL_ASSERT_OK(rl_trainer_forward_backward(t.get(), data.view(), ce.get(), r.out()));
        RL_ASSERT_OK(rl_trainer_optim_step(t.get(), nullptr, o.out()));
        losses.push_back(r.scalar("loss"));
        EXPECT_GT(r.metric("perplexity"), 1.0);
    }
    EXPECT_GT(losses.front(), 4.0); // ~ln(259) at init
    EXPECT_LT(losses.back(), 0.5 * losses.front())
        << "first " << losses.front() << " last " << losses.back();
}

// -- bad input ----------------------------------------------------------------------------

// A trainer on the tiny model, and what it refuses.
class BadInput : public ::testing::Test {
protected:
    ModelPtr m = load_model();
    TrainerPtr t = make_trainer(m.get(), cfg(""));

    // forward_backward of `b` with `loss` (forward without one) must be
    // refused as an invalid argument: the error message.
    std::string refused(Batch &b, rl_instance_t *loss = nullptr) {
        Result r;
        const rl_status_t st = loss ? rl_trainer_forward_backward(t.get(), b.view(), loss, r.out())
                                    : rl_trainer_forward(t.get(), b.view(), nullptr, r.out());
        EXPECT_EQ(st, RL_ERR_INVALID_ARG);
        return rl_last_error();
    }
};

TEST_F(BadInput, MissingRequiredLossInputIsNamed) {
    InstancePtr loss = make_loss("policy_loss");
    Batch b;
    b.add({65, 66, 67}, {{"advantages", {1, 1, 1}}});
    const std::string err = refused(b, loss.get());
    EXPECT_NE(err.find("'old_logprobs'"), std::string::npos) << err;
}

TEST_F(BadInput, TensorsTheLossDoesNotReadOrOfTheWrongLengthAreNamed) {
    InstancePtr ce = make_loss("causallm_loss");
    Batch b;
    b.add({65, 66, 67}, {{"advantages", {1, 1, 1}}});
    EXPECT_NE(refused(b, ce.get()).find("'advantages'"), std::string::npos);

    Batch c;
    c.add({65, 66, 67}, {{"loss_mask", {0, 1, 1}}});
    c.floats["loss_mask"].push_back(1); // 4 values for 3 tokens
    EXPECT_NE(refused(c, ce.get()).find("'loss_mask'"), std::string::npos);

    Batch d;
    d.add({65, 66, 300});
    std::string err = refused(d);
    EXPECT_NE(err.find("input_ids[2] = 300"), std::string::npos) << err;

    Batch e;
    e.add({65, 66, 67}, {{"logprobs", {0, 0, 0}}});
    EXPECT_NE(refused(e).find("computed by the trainer"), std::string::npos);

    Batch f;
    f.add({65, 66, 67});
    f.cu = {0, 2, 2, 3};
    err = refused(f);
    EXPECT_NE(err.find("sequence 1 is empty"), std::string::npos) << err;
}

TEST_F(BadInput, LabelsAreAlignedWithTokensAndIgnoredWhereMinus100) {
    Batch b;
    b.add({72, 101, 108, 108, 111});
    const auto plain = forward_logprobs(t.get(), b);
    b.labels = {72, 101, -100, 108, 111};
    const auto masked = forward_logprobs(t.get(), b);
    EXPECT_EQ(masked[2], 0.0f);
    EXPECT_EQ(masked[1], plain[1]);
    EXPECT_EQ(masked[4], plain[4]);
    b.labels = {72, 101, 259, 108, 111};
    const std::string err = refused(b);
    EXPECT_NE(err.find("labels[2] = 259"), std::string::npos) << err;
}

namespace {

// trainer.forward_only: a frozen scorer (a reference model) that gives the
// same logprobs as a trainer of the same weights and refuses to train.
TEST(ForwardOnly, ScoresLikeATrainerAndRefusesToTrain) {
    ModelPtr m = load_model();
    TrainerPtr scorer = make_trainer(m.get(), R"({"forward_only": true})");
    Batch b = random_batch(3, 4, 5, 30);
    const std::vector<float> frozen = forward_logprobs(scorer.get(), b);
    TrainerPtr t = make_trainer(m.get(), cfg(""));
    EXPECT_EQ(frozen, forward_logprobs(t.get(), b));
    InstancePtr ce = make_loss("causallm_loss");
    Result r;
    EXPECT_EQ(rl_trainer_forward_backward(scorer.get(), b.view(), ce.get(), r.out()),
              RL_ERR_BAD_STATE);
    EXPECT_NE(std::string(rl_last_error()).find("forward-only"), std::string::npos)
        << rl_last_error();
    Result o;
    EXPECT_EQ(rl_trainer_optim_step(scorer.get(), nullptr, o.out()), RL_ERR_BAD_STATE);
}

} // namespace
