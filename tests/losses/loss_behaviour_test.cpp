// Hand-computed small cases: each parameter's effect, each aggregation mode's
// normalizer, the shared KL / entropy terms.
#include "loss_test_util.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace rl::losses::test {
namespace {

template <class L>
T::LossRun run(const std::string &params, const Batch &b, bool want_grads = true) {
    return run_once<L>(params, b.inputs(), want_grads);
}

Batch make(std::vector<int64_t> cu, std::map<std::string, std::vector<double>> f) {
    Batch b;
    b.cu = std::move(cu);
    b.f = std::move(f);
    return b;
}

// old_logprobs such that exp(logprobs - old) equals the given ratios.
std::vector<double> old_for(const std::vector<double> &lp, const std::vector<double> &ratios) {
    std::vector<double> old(lp.size());
    for (size_t i = 0; i < lp.size(); ++i) old[i] = lp[i] - std::log(ratios[i]);
    return old;
}

// ---- policy_loss ----------------------------------------------------------------

TEST(PolicyLoss, DualClipEngagesOnlyForNegativeAdvantages) {
    const std::vector<double> lp = {-1.0, -1.0, -1.0, -1.0}, r = {5.0, 5.0, 2.0, 0.5},
                              A = {1.0, -1.0, -1.0, -1.0};
    const Batch b =
        make({0, 4}, {{"logprobs", lp}, {"old_logprobs", old_for(lp, r)}, {"advantages", A}});
    const auto dual = run<PolicyLoss>(R"({"eps_clip_c": 3, "loss_agg_mode": "sum"})", b);
    ASSERT_EQ(dual.status, RL_OK) << dual.error;
    // t0: A > 0, clipped at 1.2: -1.2. t1: A < 0, 5 capped at c = 3. t2: r = 2 < c: 2.
    // t3: r = 0.5 clipped up to 0.8: 0.8.
    EXPECT_NEAR(dual.loss, -1.2 + 3.0 + 2.0 + 0.8, 1e-12);
    const auto &g = dual.grads.at("logprobs");
    EXPECT_EQ(g[0], 0.0);
    EXPECT_EQ(g[1], 0.0);
    EXPECT_NEAR(g[2], 2.0, 1e-12); // -A * r
    EXPECT_EQ(g[3], 0.0);
    EXPECT_DOUBLE_EQ(dual.metric("pg_clipfrac"), 0.75);

    const auto plain = run<PolicyLoss>(R"({"loss_agg_mode": "sum"})", b);
    ASSERT_EQ(plain.status, RL_OK) << plain.error;
    EXPECT_NEAR(plain.loss, -1.2 + 5.0 + 2.0 + 0.8, 1e-12);
    EXPECT_NEAR(plain.grads.at("logprobs")[1], 5.0, 1e-12);
    EXPECT_EQ(plain.grads.at("logprobs")[0], 0.0); // A > 0: the same with or without dual clip
    EXPECT_DOUBLE_EQ(plain.metric("pg_clipfrac"), 0.5);
}

TEST(PolicyLoss, AsymmetricClipUsesEpsClipHighAboveAndEpsClipBelow) {
    const std::vector<double> lp = {-1.0, -1.0}, r = {1.25, 0.75}, A = {1.0, -1.0};
    const Batch b =
        make({0, 2}, {{"logprobs", lp}, {"old_logprobs", old_for(lp, r)}, {"advantages", A}});
    const auto sym = run<PolicyLoss>(R"({"loss_agg_mode": "sum"})", b);
    EXPECT_EQ(sym.grads.at("logprobs")[0], 0.0); // 1.25 > 1.2: clipped
    EXPECT_EQ(sym.grads.at("logprobs")[1], 0.0); // 0.75 < 0.8 with A < 0: clipped
    const auto wide =
        run<PolicyLoss>(R"({"eps_clip": 0.3, "eps_clip_high": 0.28, "loss_agg_mode": "sum"})", b);
    EXPECT_NEAR(wide.grads.at("logprobs")[0], -1.25, 1e-12);
    EXPECT_NEAR(wide.grads.at("logprobs")[1], 0.75, 1e-12);
    EXPECT_NEAR(wide.loss, -1.25 + 0.75, 1e-12);
}

TEST(PolicyLoss, IcePopZeroesExactlyTheOutOfBandTokens) {
    const std::vector<double> lp = {-1, -1, -1, -1, -1}, r = {0.4, 0.6, 1.0, 1.9, 2.1},
                              A = {1, -1, 1, -1, 1};
    const Batch b =
        make({0, 5}, {{"logprobs", lp}, {"old_logprobs", old_for(lp, r)}, {"advantages", A}});
    // Wide PPO band so only IcePop acts.
    const auto out = run<PolicyLoss>(
        R"({"icepop_beta": 2, "eps_clip": 0.99, "eps_clip_high": 100, "loss_agg_mode": "sum"})", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    const auto &g = out.grads.at("logprobs");
    EXPECT_EQ(g[0], 0.0); // 0.4 < 1/2
    EXPECT_EQ(g[4], 0.0); // 2.1 > 2
    double loss = 0;
    for (int t : {1, 2, 3}) {
        EXPECT_NEAR(g[t], -A[t] * r[t], 1e-12) << t;
        loss += -A[t] * r[t];
    }
    EXPECT_NEAR(out.loss, loss, 1e-12);
    EXPECT_DOUBLE_EQ(out.metric("icepop_maskfrac"), 0.4);
    EXPECT_DOUBLE_EQ(out.metric("pg_clipfrac"), 0.0);
}

TEST(PolicyLoss, TisWeightIsDetachedAndClipped) {
    const std::vector<double> lp = {-1.0, -1.0, -1.0}, raw = {1.5, 3.0, 0.05};
    std::vector<double> roll(3);
    for (int t = 0; t < 3; ++t) roll[t] = lp[t] - std::log(raw[t]);
    const Batch b = make({0, 3}, {{"logprobs", lp},
                                  {"old_logprobs", lp}, // ratio 1
                                  {"advantages", {1.0, 1.0, 1.0}},
                                  {"rollout_logprobs", roll}});
    const auto out = run<PolicyLoss>(R"({"use_tis": true, "loss_agg_mode": "sum"})", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    // Weights 1.5, clip(3) = 2, clip(0.05) = 0.1. A weight that carried gradient
    // would double the first gradient (d/dlp of exp(lp) * exp(lp - roll)).
    const auto &g = out.grads.at("logprobs");
    EXPECT_NEAR(g[0], -1.5, 1e-12);
    EXPECT_NEAR(g[1], -2.0, 1e-12);
    EXPECT_NEAR(g[2], -0.1, 1e-12);
    EXPECT_NEAR(out.loss, -3.6, 1e-12);
    EXPECT_NEAR(out.metric("tis_mean"), (1.5 + 3.0 + 0.05) / 3, 1e-12);
    EXPECT_NEAR(out.metric("tis_min"), 0.05, 1e-12);
    EXPECT_NEAR(out.metric("tis_max"), 3.0, 1e-12);
    EXPECT_DOUBLE_EQ(out.metric("tis_clipfrac"), 2.0 / 3.0);
}

TEST(PolicyLoss, KlStatsOnlyWhenAsked) {
    const std::vector<double> lp = {-1.0, -2.0};
    const Batch b = make(
        {0, 2},
        {{"logprobs", lp}, {"old_logprobs", old_for(lp, {1.1, 0.9})}, {"advantages", {1.0, 1.0}}});
    const auto off = run<PolicyLoss>("{}", b);
    EXPECT_FALSE(off.has_metric("kl_sample_train_k3"));
    EXPECT_FALSE(off.has_metric("ratio_mean"));
    const auto on = run<PolicyLoss>(R"({"compute_kl_stats": true})", b);
    const double k3 = (1.1 - std::log(1.1) - 1 + 0.9 - std::log(0.9) - 1) / 2;
    EXPECT_NEAR(on.metric("kl_sample_train_k3"), k3, 1e-12);
    EXPECT_NEAR(on.metric("entropy_sample"), -(b["old_logprobs"][0] + b["old_logprobs"][1]) / 2,
                1e-12);
    EXPECT_NEAR(on.metric("ratio_mean"), 1.0, 1e-12);
    EXPECT_NEAR(on.metric("ratio_min"), 0.9, 1e-12);
    EXPECT_NEAR(on.metric("ratio_max"), 1.1, 1e-12);
}

// ---- aggregation ----------------------------------------------------------------

// Four sequences: 2, 2, 3 and 0 loss tokens (the last is padding); l_t = -lp_t.
struct AggFixture {
    Batch b;
    double s0, s1, s2;
    AggFixture() {
        const std::vector<double> lp = {-9, -1, -2, -3, -4, -9, -5, -6, -7, -9};
        b = make({0, 3, 5, 9, 10},
                 {{"logprobs", lp}, {"loss_mask", {0, 1, 1, 1, 1, 0, 1, 1, 1, 0}}});
        b.labels = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
        b.has_labels = true;
        s0 = 1 + 2;
        s1 = 3 + 4;
        s2 = 5 + 6 + 7;
    }
};

TEST(Aggregation, EachModeUsesItsNormalizer) {
    const AggFixture f;
    struct Mode {
        const char *params;
        double loss;
        double g0, g2; // gradient on a token of sequence 0 and of sequence 2
    };
    const double sum = f.s0 + f.s1 + f.s2;
    const std::vector<Mode> modes = {
        {R"({"loss_agg_mode": "token-mean"})", sum / 7, -1.0 / 7, -1.0 / 7},
        {R"({"loss_agg_mode": "seq-mean-token-sum"})", sum / 3, -1.0 / 3, -1.0 / 3},
        {R"({"loss_agg_mode": "seq-mean-token-mean"})", (f.s0 / 2 + f.s1 / 2 + f.s2 / 3) / 3,
         -1.0 / 6, -1.0 / 9},
        {R"({"loss_agg_mode": "seq-mean-token-sum-norm", "max_seq_len": 8})", sum / 24, -1.0 / 24,
         -1.0 / 24},
        {R"({"loss_agg_mode": "sum"})", sum, -1.0, -1.0},
    };
    for (const auto &m : modes) {
        SCOPED_TRACE(m.params);
        const auto out = run<CausalLmLoss>(m.params, f.b);
        ASSERT_EQ(out.status, RL_OK) << out.error;
        EXPECT_NEAR(out.loss, m.loss, 1e-12);
        const auto &g = out.grads.at("logprobs");
        EXPECT_NEAR(g[1], m.g0, 1e-15);
        EXPECT_NEAR(g[7], m.g2, 1e-15);
        EXPECT_EQ(g[0], 0.0);
        EXPECT_EQ(g[5], 0.0);
        EXPECT_EQ(g[9], 0.0);
    }
}

TEST(Aggregation, GlobalCountsReplaceTheCallsOwn) {
    AggFixture f;
    const double sum = f.s0 + f.s1 + f.s2;
    f.b.global_tokens = 20;
    f.b.global_seqs = 6;
    auto out = run<CausalLmLoss>(R"({"loss_agg_mode": "token-mean"})", f.b);
    EXPECT_NEAR(out.loss, sum / 20, 1e-12);
    out = run<CausalLmLoss>(R"({"loss_agg_mode": "seq-mean-token-mean"})", f.b);
    EXPECT_NEAR(out.loss, (f.s0 / 2 + f.s1 / 2 + f.s2 / 3) / 6, 1e-12);
    out =
        run<CausalLmLoss>(R"({"loss_agg_mode": "seq-mean-token-sum-norm", "max_seq_len": 8})", f.b);
    EXPECT_NEAR(out.loss, sum / 48, 1e-12);
    out = run<CausalLmLoss>(R"({"loss_agg_mode": "sum"})", f.b);
    EXPECT_NEAR(out.loss, sum, 1e-12);
}

TEST(Aggregation, NoLossTokensGiveZeroLossAndGradient) {
    const Batch b = make({0, 2, 3}, {{"logprobs", {-1, -2, -3}},
                                     {"old_logprobs", {-1, -1, -1}},
                                     {"advantages", {1, 1, 1}},
                                     {"loss_mask", {0, 0, 0}}});
    for (const char *mode : {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "sum"}) {
        const auto out = run<PolicyLoss>(std::string(R"({"loss_agg_mode": ")") + mode + "\"}", b);
        ASSERT_EQ(out.status, RL_OK) << out.error;
        EXPECT_EQ(out.loss, 0.0);
        for (double g : out.grads.at("logprobs")) EXPECT_EQ(g, 0.0);
        EXPECT_EQ(out.metric("valid_tokens"), 0.0);
        EXPECT_EQ(out.metric("pg_clipfrac"), 0.0);
    }
}

// ---- cross-entropy ----------------------------------------------------------------

TEST(CausalLmLoss, LabelsEqualToIgnoreIndexAreNotLossTokens) {
    Batch b = make({0, 4}, {{"logprobs", {-1.0, -2.0, -3.0, -4.0}}});
    b.labels = {-100, 5, 7, -100};
    b.has_labels = true;
    auto out = run<CausalLmLoss>("{}", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    EXPECT_NEAR(out.loss, 2.5, 1e-12);
    EXPECT_EQ(out.grads.at("logprobs"), (std::vector<double>{0, -0.5, -0.5, 0}));
    EXPECT_EQ(out.metric("valid_tokens"), 2.0);
    EXPECT_NEAR(out.metric("perplexity"), std::exp(2.5), 1e-12);
    out = run<CausalLmLoss>(R"({"ignore_index": 7})", b);
    EXPECT_NEAR(out.loss, (1.0 + 2.0 + 4.0) / 3, 1e-12);
}

TEST(PerTokenCe, EmitsLogprobsAndElementwiseLoss) {
    Batch b =
        make({0, 2, 4}, {{"logprobs", {-1.0, -2.0, -3.0, -4.0}}, {"loss_mask", {1, 1, 0, 1}}});
    b.labels = {-100, 5, 7, 8};
    b.has_labels = true;
    const auto out = run<PerTokenCe>("{}", b, false);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    EXPECT_NEAR(out.loss, 3.0, 1e-12);
    EXPECT_TRUE(out.grads.empty());
    EXPECT_EQ(out.tensors.at("logprobs"), (std::vector<double>{0, -2, 0, -4}));
    EXPECT_EQ(out.tensors.at("elementwise_loss"), (std::vector<double>{0, 2, 0, 4}));
    const auto plain = run<CausalLmLoss>("{}", b);
    EXPECT_TRUE(plain.tensors.empty());
    EXPECT_EQ(plain.loss, out.loss);
}

// ---- importance_sampling and the shared terms ------------------------------------

TEST(ImportanceSampling, IsTheUnclippedRatioTimesAdvantage) {
    const std::vector<double> lp = {-1.0, -1.0}, r = {5.0, 0.1}, A = {2.0, -1.0};
    const Batch b =
        make({0, 2}, {{"logprobs", lp}, {"old_logprobs", old_for(lp, r)}, {"advantages", A}});
    const auto out = run<ImportanceSampling>("{}", b);
    EXPECT_NEAR(out.loss, (-10.0 + 0.1) / 2, 1e-12);
    EXPECT_NEAR(out.grads.at("logprobs")[0], -5.0, 1e-12);
    EXPECT_NEAR(out.grads.at("logprobs")[1], 0.05, 1e-12);
    EXPECT_NEAR(out.metric("ratio_max"), 5.0, 1e-12);
}

TEST(Regularizers, KlEstimatorsHaveTheirTextbookValuesAndGradients) {
    // A = 0: only the KL term remains. d = lp - ref = 0.5.
    const Batch b = make({0, 1}, {{"logprobs", {-1.0}},
                                  {"old_logprobs", {-1.0}},
                                  {"advantages", {0.0}},
                                  {"ref_logprobs", {-1.5}}});
    struct K {
        const char *type;
        double value, grad;
    };
    const double d = 0.5;
    // The "+" variants keep the value of their estimator and take k2's gradient d.
    for (const K &k :
         {K{"k1", d, 1.0}, K{"k2", d * d / 2, d}, K{"k3", std::exp(-d) + d - 1, 1 - std::exp(-d)},
          K{"low_var_kl", std::exp(-d) + d - 1, 1 - std::exp(-d)}, K{"abs", d, 1.0}, K{"k1+", d, d},
          K{"k3+", std::exp(-d) + d - 1, d}, K{"low_var_kl+", std::exp(-d) + d - 1, d}}) {
        SCOPED_TRACE(k.type);
        const auto out = run<ImportanceSampling>(
            std::string(R"({"kl_coef": 0.5, "kl_type": ")") + k.type + "\"}", b);
        ASSERT_EQ(out.status, RL_OK) << out.error;
        EXPECT_NEAR(out.loss, 0.5 * k.value, 1e-12);
        EXPECT_NEAR(out.grads.at("logprobs")[0], 0.5 * k.grad, 1e-12);
        EXPECT_NEAR(out.metric("ref_kl"), k.value, 1e-12);
    }
    // kl_coef 0: ref_logprobs only feeds the metric.
    const auto metric_only = run<ImportanceSampling>(R"({"kl_type": "k2"})", b);
    EXPECT_EQ(metric_only.loss, 0.0);
    EXPECT_NEAR(metric_only.metric("ref_kl"), d * d / 2, 1e-12);
}

TEST(Regularizers, AbsAndStraightThroughEstimatorsBelowTheReference) {
    // d = lp - ref = -0.5: abs is |d| with gradient -1; k1+ is d with gradient d.
    const double d = -0.5;
    const Batch b = make({0, 1}, {{"logprobs", {-1.0}},
                                  {"old_logprobs", {-1.0}},
                                  {"advantages", {0.0}},
                                  {"ref_logprobs", {-0.5}}});
    const auto abs = run<PolicyLoss>(R"({"kl_coef": 2, "kl_type": "abs"})", b);
    ASSERT_EQ(abs.status, RL_OK) << abs.error;
    EXPECT_NEAR(abs.loss, 2 * 0.5, 1e-12);
    EXPECT_NEAR(abs.grads.at("logprobs")[0], -2.0, 1e-12);
    const auto k1p = run<PolicyLoss>(R"({"kl_coef": 2, "kl_type": "k1+"})", b);
    EXPECT_NEAR(k1p.loss, 2 * d, 1e-12);
    EXPECT_NEAR(k1p.grads.at("logprobs")[0], 2 * d, 1e-12);
    EXPECT_NEAR(k1p.metric("ref_kl"), d, 1e-12);
}

TEST(Regularizers, EntropyBonusDifferentiatesTheEntropyInput) {
    const Batch b = make({0, 2}, {{"logprobs", {-1.0, -1.0}},
                                  {"old_logprobs", {-1.0, -1.0}},
                                  {"advantages", {0.0, 0.0}},
                                  {"entropy", {2.0, 4.0}}});
    T::Host host;
    T::Instance<ImportanceSampling> on(host, R"({"entropy_coef": 0.1})");
    const auto sig = T::loss_signature(on);
    EXPECT_EQ(sig.differentiable, (std::vector<std::string>{"logprobs", "entropy"}));
    const auto out = T::run_loss(on, b.inputs());
    ASSERT_EQ(out.status, RL_OK) << out.error;
    EXPECT_NEAR(out.loss, -0.1 * 3.0, 1e-12);
    EXPECT_EQ(out.grads.at("entropy"), (std::vector<double>{-0.05, -0.05}));
    EXPECT_NEAR(out.metric("entropy"), 3.0, 1e-12);

    T::Instance<ImportanceSampling> off(host, "{}");
    EXPECT_EQ(T::loss_signature(off).differentiable, (std::vector<std::string>{"logprobs"}));
    const auto metric_only = T::run_loss(off, b.inputs());
    EXPECT_EQ(metric_only.loss, 0.0);
    EXPECT_FALSE(metric_only.grads.count("entropy"));
    EXPECT_NEAR(metric_only.metric("entropy"), 3.0, 1e-12);
}

// ---- grpo -------------------------------------------------------------------------

TEST(Grpo, GeometricMaskDropsWholeSequences) {
    const std::vector<double> lp(6, -1.0), r = {3, 5, 6, 6, 7, 7.5}, A = {1, 1, 1, 1, 1, 1};
    const Batch b =
        make({0, 3, 6}, {{"logprobs", lp}, {"old_logprobs", old_for(lp, r)}, {"advantages", A}});
    // Every token is inside the token band [0.125, 8]; sequence 1's geometric
    // mean (6.9) is above geo_mask_high = 5, sequence 0's (4.48) is not.
    const auto out = run<GrpoLoss>(R"({"geo_mask_high": 5, "loss_agg_mode": "sum"})", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    const auto &g = out.grads.at("logprobs");
    for (int t = 0; t < 3; ++t) EXPECT_NEAR(g[t], -r[t], 1e-12) << t; // -coeff = -r * A
    for (int t = 3; t < 6; ++t) EXPECT_EQ(g[t], 0.0) << t;
    EXPECT_NEAR(out.loss, -(3 + 5 + 6) * -1.0, 1e-12); // -coeff * lp
    EXPECT_DOUBLE_EQ(out.metric("masked"), 0.5);
    EXPECT_DOUBLE_EQ(out.metric("masked_seqs"), 0.5);
    EXPECT_EQ(out.metric("tokens"), 6.0);

    // geo_mask_low: a sequence of moderately low ratios, none below the token band.
    const std::vector<double> low = {0.2, 0.3, 0.25, 1, 1, 1};
    const Batch b2 =
        make({0, 3, 6}, {{"logprobs", lp}, {"old_logprobs", old_for(lp, low)}, {"advantages", A}});
    const auto out2 = run<GrpoLoss>(R"({"geo_mask_low": 0.3, "loss_agg_mode": "sum"})", b2);
    for (int t = 0; t < 3; ++t) EXPECT_EQ(out2.grads.at("logprobs")[t], 0.0) << t;
    for (int t = 3; t < 6; ++t) EXPECT_NEAR(out2.grads.at("logprobs")[t], -1.0, 1e-12) << t;
}

TEST(Grpo, TokenMaskDropsOnlyThatToken) {
    const std::vector<double> lp(3, -1.0), r = {0.1, 1.0, 9.0};
    const Batch b = make(
        {0, 3}, {{"logprobs", lp}, {"old_logprobs", old_for(lp, r)}, {"advantages", {1, 1, 1}}});
    const auto out = run<GrpoLoss>(R"({"loss_agg_mode": "sum"})", b);
    const auto &g = out.grads.at("logprobs");
    EXPECT_EQ(g[0], 0.0);
    EXPECT_NEAR(g[1], -1.0, 1e-12);
    EXPECT_EQ(g[2], 0.0);
    EXPECT_DOUBLE_EQ(out.metric("masked"), 2.0 / 3.0);
    EXPECT_DOUBLE_EQ(out.metric("masked_seqs"), 0.0);
}

TEST(Grpo, SequenceMasksUseTheMinAndMaxTokenRatio) {
    const std::vector<double> lp(6, -1.0), r = {1, 1, 6, 0.4, 1, 1};
    const Batch b = make({0, 3, 6}, {{"logprobs", lp},
                                     {"old_logprobs", old_for(lp, r)},
                                     {"advantages", std::vector<double>(6, 1.0)}});
    const auto high = run<GrpoLoss>(R"({"sequence_mask_high": 5, "loss_agg_mode": "sum"})", b);
    for (int t = 0; t < 3; ++t) EXPECT_EQ(high.grads.at("logprobs")[t], 0.0) << t;
    EXPECT_NEAR(high.grads.at("logprobs")[4], -1.0, 1e-12);
    const auto low = run<GrpoLoss>(R"({"sequence_mask_low": 0.5, "loss_agg_mode": "sum"})", b);
    EXPECT_NEAR(low.grads.at("logprobs")[1], -1.0, 1e-12);
    for (int t = 3; t < 6; ++t) EXPECT_EQ(low.grads.at("logprobs")[t], 0.0) << t;
}

TEST(Grpo, CoefficientCombinesAdvantageTeacherAndKlTerms) {
    const double lp = -1.0, old = -1.2, A = 0.5, teacher = -0.5, r = std::exp(0.2);
    const Batch b = make({0, 1}, {{"logprobs", {lp}},
                                  {"old_logprobs", {old}},
                                  {"advantages", {A}},
                                  {"teacher_logprobs", {teacher}}});
    const auto out = run<GrpoLoss>(
        R"({"adv_tau": 2, "teacher_tau": 0.5, "kl_tau": 0.1, "loss_agg_mode": "sum"})", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    const double coeff = r * (2 * A + 0.5 * (teacher - lp) - 0.1 * 0.2);
    EXPECT_NEAR(out.grads.at("logprobs")[0], -coeff, 1e-12);
    EXPECT_NEAR(out.loss, -coeff * lp, 1e-12);
    EXPECT_NEAR(out.metric("teacher_kl"), teacher - lp, 1e-12);
    EXPECT_NEAR(out.metric("kl"), r - 0.2 - 1, 1e-12);
    // Without teacher_logprobs there is no teacher term and no teacher_kl.
    const Batch no_teacher = b.only({"logprobs", "old_logprobs", "advantages"});
    const auto plain =
        run<GrpoLoss>(R"({"adv_tau": 2, "kl_tau": 0.1, "loss_agg_mode": "sum"})", no_teacher);
    EXPECT_NEAR(plain.grads.at("logprobs")[0], -r * (2 * A - 0.1 * 0.2), 1e-12);
    EXPECT_FALSE(plain.has_metric("teacher_kl"));
}

TEST(Grpo, SequenceRatioIsTheClippedProductOfTokenRatios) {
    const std::vector<double> lp = {-1, -1, -1}, lr = {0.5, 0.4, 0.3};
    std::vector<double> old(3);
    for (int t = 0; t < 3; ++t) old[t] = lp[t] - lr[t];
    const Batch b =
        make({0, 3}, {{"logprobs", lp}, {"old_logprobs", old}, {"advantages", {1, 1, 1}}});
    const auto out = run<GrpoLoss>(R"({"ratio_type": "sequence", "loss_agg_mode": "sum"})", b);
    for (int t = 0; t < 3; ++t) EXPECT_NEAR(out.grads.at("logprobs")[t], -std::exp(1.2), 1e-12);
    const auto clipped = run<GrpoLoss>(
        R"({"ratio_type": "sequence", "sequence_clip_high": 2, "loss_agg_mode": "sum"})", b);
    for (int t = 0; t < 3; ++t) EXPECT_NEAR(clipped.grads.at("logprobs")[t], -2.0, 1e-12);
    const auto token = run<GrpoLoss>(R"({"loss_agg_mode": "sum"})", b);
    EXPECT_NEAR(token.grads.at("logprobs")[0], -std::exp(0.5), 1e-12);
}

// ---- decoupled_ppo, cispo, gspo, value_loss --------------------------------------------

TEST(DecoupledPpo, ClipsAroundTheProximalPolicyAndWeightsByBehaviour) {
    const std::vector<double> lp = {-1, -1, -1}, r_prox = {1.5, 1.1, 1.0}, w = {0.8, 1.5, 3.0};
    std::vector<double> prox = old_for(lp, r_prox), old(3);
    for (int t = 0; t < 3; ++t) old[t] = prox[t] - std::log(w[t]);
    const Batch b = make({0, 3}, {{"logprobs", lp},
                                  {"prox_logprobs", prox},
                                  {"old_logprobs", old},
                                  {"advantages", {1, 1, 1}}});
    const auto out = run<DecoupledPpo>(R"({"behav_imp_weight_cap": 2, "loss_agg_mode": "sum"})", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    const auto &g = out.grads.at("logprobs");
    EXPECT_EQ(g[0], 0.0);                 // 1.5 vs prox: clipped at 1.2
    EXPECT_NEAR(g[1], -1.1 * 1.5, 1e-12); // vs old it would be 1.65, clipped
    EXPECT_EQ(g[2], 0.0);                 // behaviour weight 3 > cap 2: dropped
    EXPECT_NEAR(out.loss, 0.8 * -1.2 + 1.5 * -1.1, 1e-12);
    EXPECT_DOUBLE_EQ(out.metric("behav_maskfrac"), 1.0 / 3.0);
    EXPECT_NEAR(out.metric("behav_imp_weight"), (0.8 + 1.5) / 2, 1e-12);
    EXPECT_DOUBLE_EQ(out.metric("pg_clipfrac"), 1.0 / 3.0);
    // Without the cap the third token counts with weight 3.
    const auto uncapped = run<DecoupledPpo>(R"({"loss_agg_mode": "sum"})", b);
    EXPECT_NEAR(uncapped.grads.at("logprobs")[2], -3.0, 1e-12);
}

TEST(DecoupledPpo, DualClipCapsNegativeAdvantages) {
    const std::vector<double> lp = {-1, -1};
    const Batch b = make({0, 2}, {{"logprobs", lp},
                                  {"prox_logprobs", old_for(lp, {5.0, 5.0})},
                                  {"old_logprobs", old_for(lp, {5.0, 5.0})},
                                  {"advantages", {-1, 1}}});
    const auto out = run<DecoupledPpo>(R"({"c_clip": 3, "loss_agg_mode": "sum"})", b);
    EXPECT_NEAR(out.loss, 3.0 + -1.2, 1e-12);
    EXPECT_DOUBLE_EQ(out.metric("dual_clipfrac"), 0.5);
}

TEST(Cispo, ClippedTokensKeepTheirGradient) {
    const std::vector<double> lp = {-1, -2}, r = {5.0, 0.5}, A = {1.0, 2.0};
    const Batch b =
        make({0, 2}, {{"logprobs", lp}, {"old_logprobs", old_for(lp, r)}, {"advantages", A}});
    const auto out = run<Cispo>(R"({"loss_agg_mode": "sum"})", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    EXPECT_NEAR(out.grads.at("logprobs")[0], -4.0, 1e-12); // clip(5) = 4
    EXPECT_NEAR(out.grads.at("logprobs")[1], -1.0, 1e-12); // 0.5 * 2
    EXPECT_NEAR(out.loss, -4.0 * -1 + -1.0 * -2, 1e-12);
    EXPECT_DOUBLE_EQ(out.metric("clip_fraction"), 0.5);
    const auto low = run<Cispo>(R"({"clip_low": 0.8, "loss_agg_mode": "sum"})", b);
    EXPECT_NEAR(low.grads.at("logprobs")[1], -1.6, 1e-12);
}

TEST(Gspo, RatioIsTheSequenceGeometricMean) {
    const std::vector<double> lp = {-1, -1, -1}, lr = {0.1, 0.3, 0.0};
    std::vector<double> old(3);
    for (int t = 0; t < 3; ++t) old[t] = lp[t] - lr[t];
    Batch b = make({0, 3}, {{"logprobs", lp},
                            {"old_logprobs", old},
                            {"advantages", {1, 1, 1}},
                            {"loss_mask", {1, 1, 0}}});
    const double s = std::exp(0.2);
    const auto wide = run<Gspo>(R"({"eps_clip": 0.5, "eps_clip_high": 0.5})", b);
    ASSERT_EQ(wide.status, RL_OK) << wide.error;
    // seq-mean-token-mean over 2 tokens: L = -s; dL/dlp_u = -s / 2.
    EXPECT_NEAR(wide.loss, -s, 1e-12);
    EXPECT_NEAR(wide.grads.at("logprobs")[0], -s / 2, 1e-12);
    EXPECT_NEAR(wide.grads.at("logprobs")[1], -s / 2, 1e-12);
    EXPECT_EQ(wide.grads.at("logprobs")[2], 0.0);
    EXPECT_NEAR(wide.metric("seq_ratio_mean"), s, 1e-12);
    // Default band (3e-4, 4e-4): s = 1.22 is clipped for A > 0 ...
    const auto clipped = run<Gspo>("{}", b);
    EXPECT_NEAR(clipped.loss, -(1 + 4e-4), 1e-12);
    EXPECT_EQ(clipped.grads.at("logprobs")[0], 0.0);
    EXPECT_DOUBLE_EQ(clipped.metric("pg_clipfrac"), 1.0);
    // ... and not for A < 0.
    b["advantages"] = {-1, -1, -1};
    const auto neg = run<Gspo>("{}", b);
    EXPECT_NEAR(neg.loss, s, 1e-12);
    EXPECT_NEAR(neg.grads.at("logprobs")[0], s / 2, 1e-12);
}

TEST(ValueLoss, ClipsAroundOldValues) {
    const Batch b =
        make({0, 2}, {{"values", {1.0, 1.0}}, {"old_values", {0.0, 0.0}}, {"returns", {2.0, 0.0}}});
    const auto out = run<ValueLoss>(R"({"vf_clip": 0.2, "loss_agg_mode": "sum"})", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    // t0: clipped value 0.2, error 1.8 > 1: clipped branch, no gradient.
    // t1: error 1 > clipped error 0.2: unclipped, gradient v - R = 1.
    EXPECT_NEAR(out.loss, 0.5 * 3.24 + 0.5 * 1.0, 1e-12);
    EXPECT_EQ(out.grads.at("values")[0], 0.0);
    EXPECT_NEAR(out.grads.at("values")[1], 1.0, 1e-12);
    EXPECT_DOUBLE_EQ(out.metric("vf_clipfrac"), 0.5);
    const auto unclipped =
        run<ValueLoss>(R"({"vf_coef": 2, "loss_agg_mode": "sum"})", b.only({"values", "returns"}));
    EXPECT_NEAR(unclipped.loss, 2 * 0.5 * (1.0 + 1.0), 1e-12);
    EXPECT_NEAR(unclipped.grads.at("values")[0], -2.0, 1e-12);
    EXPECT_FALSE(unclipped.has_metric("vf_clipfrac"));
}

// ---- sapo, gmpo, clip_cov, kl_cov, value_loss huber ------------------------------------

double sigmoid(double x) {
    return 1.0 / (1.0 + std::exp(-x));
}

TEST(Sapo, SigmoidGateWithAPerSignTemperature) {
    const std::vector<double> lp = {-1, -1, -1}, r = {1.0, 2.0, 0.5}, A = {1, -1, 2};
    const Batch b =
        make({0, 3}, {{"logprobs", lp}, {"old_logprobs", old_for(lp, r)}, {"advantages", A}});
    const auto out = run<Sapo>(R"({"tau_pos": 1, "tau_neg": 2, "loss_agg_mode": "sum"})", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    // t0: A > 0, tau 1, r = 1: gate 4 * 0.5 = 2, gradient -A * 4 * 0.25 * 1 = -1 (the plain
    //     policy gradient -A r at r = 1).
    // t1: A < 0, tau 2, r = 2: s = sigmoid(2), gate (4 / 2) s, loss +2 s,
    //     gradient 1 * 4 s (1 - s) * 2.
    // t2: A = 2, tau 1, r = 0.5: s = sigmoid(-0.5), gate 4 s, loss -8 s,
    //     gradient -2 * 4 s (1 - s) * 0.5.
    const double s1 = sigmoid(2.0), s2 = sigmoid(-0.5);
    EXPECT_NEAR(out.loss, -2.0 + 2 * s1 - 8 * s2, 1e-12);
    const auto &g = out.grads.at("logprobs");
    EXPECT_NEAR(g[0], -1.0, 1e-12);
    EXPECT_NEAR(g[1], 8 * s1 * (1 - s1), 1e-12);
    EXPECT_NEAR(g[2], -4 * s2 * (1 - s2), 1e-12);
    EXPECT_NEAR(out.metric("gate_mean"), (2.0 + 2 * s1 + 4 * s2) / 3, 1e-12);
}

TEST(Sapo, DefaultsAreVerlsAndAggregationIsSeqMeanTokenMean) {
    // Two sequences (2 tokens, 1 token), ratio 1 everywhere: gate 2 / tau, with
    // tau_pos = 1 for A > 0 and tau_neg = 1.05 for A < 0. Default
    // seq-mean-token-mean: ((-2 - 4) / 2 + 2 / 1.05) / 2.
    const std::vector<double> lp = {-1, -2, -3};
    const Batch b =
        make({0, 2, 3}, {{"logprobs", lp}, {"old_logprobs", lp}, {"advantages", {1, 2, -1}}});
    const auto out = run<Sapo>("{}", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    EXPECT_NEAR(out.loss, (-3.0 + 2.0 / 1.05) / 2, 1e-12);
    // d l / d lp at r = 1 is -A whatever tau; weights 1/4, 1/4, 1/2.
    EXPECT_NEAR(out.grads.at("logprobs")[0], -0.25, 1e-12);
    EXPECT_NEAR(out.grads.at("logprobs")[1], -0.5, 1e-12);
    EXPECT_NEAR(out.grads.at("logprobs")[2], 0.5, 1e-12);
}

Batch log_ratio_batch(const std::vector<double> &lr, const std::vector<double> &A) {
    std::vector<double> lp(lr.size(), -1.0), old(lr.size());
    for (size_t t = 0; t < lr.size(); ++t) old[t] = lp[t] - lr[t];
    return make({0, int64_t(lr.size())},
                {{"logprobs", lp}, {"old_logprobs", old}, {"advantages", A}});
}

TEST(Gmpo, ClipsLogRatiosOneSidedByAdvantageSign) {
    // eps 0.4 (default). A > 0: lr' = min(lr, clip(lr)) = {0.1, 0.4, -0.6}; token 1 clipped.
    const auto pos = run<Gmpo>("{}", log_ratio_batch({0.1, 0.6, -0.6}, {1, 1, 1}));
    ASSERT_EQ(pos.status, RL_OK) << pos.error;
    const double sp = std::exp((0.1 + 0.4 - 0.6) / 3);
    EXPECT_NEAR(pos.loss, -sp, 1e-12); // one sequence, Abar = 1
    EXPECT_NEAR(pos.grads.at("logprobs")[0], -sp / 3, 1e-12);
    EXPECT_EQ(pos.grads.at("logprobs")[1], 0.0);
    EXPECT_NEAR(pos.grads.at("logprobs")[2], -sp / 3, 1e-12);
    EXPECT_DOUBLE_EQ(pos.metric("pg_clipfrac"), 1.0 / 3);
    EXPECT_NEAR(pos.metric("seq_ratio_mean"), sp, 1e-12);
    // A < 0: lr' = max(lr, clip(lr)) = {0.1, 0.6, -0.4}; token 2 clipped.
    const auto neg = run<Gmpo>("{}", log_ratio_batch({0.1, 0.6, -0.6}, {-1, -1, -1}));
    const double sn = std::exp((0.1 + 0.6 - 0.4) / 3);
    EXPECT_NEAR(neg.loss, sn, 1e-12);
    EXPECT_NEAR(neg.grads.at("logprobs")[1], sn / 3, 1e-12);
    EXPECT_EQ(neg.grads.at("logprobs")[2], 0.0);
}

TEST(Gmpo, SequenceAdvantageIsTheMeanAndZeroAdvantageTokensAddNoLogRatio) {
    // A = {1, 0, 1}: lr' = {0.1, 0, 0.3}, Abar = 2/3; the middle token has no gradient.
    const auto out =
        run<Gmpo>(R"({"eps_clip_high": 1})", log_ratio_batch({0.1, 0.2, 0.3}, {1, 0, 1}));
    ASSERT_EQ(out.status, RL_OK) << out.error;
    const double s = std::exp(0.4 / 3);
    EXPECT_NEAR(out.loss, -2.0 / 3 * s, 1e-12);
    EXPECT_NEAR(out.grads.at("logprobs")[0], -2.0 / 9 * s, 1e-12);
    EXPECT_EQ(out.grads.at("logprobs")[1], 0.0);
    EXPECT_NEAR(out.grads.at("logprobs")[2], -2.0 / 9 * s, 1e-12);
}

// A = {2, -2, 1, -1}, lp = {-1, -3, -1.5, -2.5}: means 0 and -2, so
// cov = {2, 2, 0.5, 0.5} (a tie between tokens 0 and 1).
Batch cov_batch(const std::vector<double> &ratios) {
    const std::vector<double> lp = {-1, -3, -1.5, -2.5};
    return make(
        {0, 4},
        {{"logprobs", lp}, {"old_logprobs", old_for(lp, ratios)}, {"advantages", {2, -2, 1, -1}}});
}

TEST(ClipCov, DropsTheHighestCovarianceUnclippedTokens) {
    const Batch b = cov_batch({1, 1, 1, 1});
    // k = max(floor(0.25 * 4), 1) = 1; candidates cov in (1, 5): tokens 0 and 1; the
    // tie goes to token 0, which is dropped: l = {0, 2, -1, 1}.
    const auto top =
        run<ClipCov>(R"({"selection": "top", "clip_cov_ratio": 0.25, "loss_agg_mode": "sum"})", b);
    ASSERT_EQ(top.status, RL_OK) << top.error;
    EXPECT_NEAR(top.loss, 2.0, 1e-12);
    const auto &g = top.grads.at("logprobs");
    EXPECT_EQ(g[0], 0.0);
    EXPECT_NEAR(g[1], 2.0, 1e-12);
    EXPECT_NEAR(g[2], -1.0, 1e-12);
    EXPECT_NEAR(g[3], 1.0, 1e-12);
    EXPECT_DOUBLE_EQ(top.metric("cov_clipfrac"), 0.25);
    EXPECT_DOUBLE_EQ(top.metric("cov_candidates"), 2.0);
    EXPECT_DOUBLE_EQ(top.metric("pg_clipfrac"), 0.0);
    // k = 2 drops both.
    const auto two =
        run<ClipCov>(R"({"selection": "top", "clip_cov_ratio": 0.5, "loss_agg_mode": "sum"})", b);
    EXPECT_NEAR(two.loss, 0.0, 1e-12);
    EXPECT_EQ(two.grads.at("logprobs")[1], 0.0);
    // Token 0 clipped by PPO (ratio 1.5, A > 0) is no candidate: token 1 goes instead.
    const auto clipped =
        run<ClipCov>(R"({"selection": "top", "clip_cov_ratio": 0.25, "loss_agg_mode": "sum"})",
                     cov_batch({1.5, 1, 1, 1}));
    EXPECT_NEAR(clipped.loss, -2 * 1.2 + 0 - 1 + 1, 1e-12);
    EXPECT_EQ(clipped.grads.at("logprobs")[1], 0.0);
    EXPECT_DOUBLE_EQ(clipped.metric("cov_candidates"), 1.0);
    EXPECT_DOUBLE_EQ(clipped.metric("pg_clipfrac"), 0.25);
}

TEST(ClipCov, RandomSelectionIsSeededReproducibleAndAmongTheCandidates) {
    const Batch b = cov_batch({1, 1, 1, 1});
    const char *params = R"({"clip_cov_ratio": 0.25, "loss_agg_mode": "sum", "seed": 3})";
    const auto a = run<ClipCov>(params, b), again = run<ClipCov>(params, b);
    ASSERT_EQ(a.status, RL_OK) << a.error;
    EXPECT_EQ(a.grads.at("logprobs"), again.grads.at("logprobs"));
    const auto &g = a.grads.at("logprobs");
    EXPECT_EQ((g[0] == 0.0) + (g[1] == 0.0), 1); // exactly one of the two candidates
    EXPECT_NE(g[2], 0.0);
    EXPECT_NE(g[3], 0.0);
    // Over seeds, every candidate is drawn, and never more than k of them.
    Rng r(5);
    Batch big;
    big.cu = {0, 200};
    std::vector<double> lp(200), adv(200);
    for (int t = 0; t < 200; ++t) {
        lp[t] = r.uni(-3, -0.1);
        adv[t] = r.uni(-2, 2);
    }
    big.f = {{"logprobs", lp}, {"old_logprobs", lp}, {"advantages", adv}};
    std::vector<int> drawn(200, 0);
    double candidates = 0;
    for (int seed = 0; seed < 200; ++seed) {
        const auto o = run<ClipCov>(R"({"clip_cov_ratio": 0.02, "clip_cov_lb": 0.1, "seed": )" +
                                        std::to_string(seed) + "}",
                                    big);
        ASSERT_EQ(o.status, RL_OK) << o.error;
        candidates = o.metric("cov_candidates");
        EXPECT_DOUBLE_EQ(o.metric("cov_clipfrac"), 4.0 / 200); // k = floor(0.02 * 200)
        for (int t = 0; t < 200; ++t) drawn[t] += o.grads.at("logprobs")[t] == 0.0;
    }
    int distinct = 0;
    for (int t = 0; t < 200; ++t) distinct += drawn[t] > 0;
    EXPECT_EQ(distinct, int(candidates));
}

TEST(KlCov, PenalizesTheHighestCovarianceTokens) {
    // Log ratios {0.2, -0.1, 0.3, -0.2}; k = 1 picks token 0 (tie with token 1).
    std::vector<double> lr = {0.2, -0.1, 0.3, -0.2}, r(4);
    for (int t = 0; t < 4; ++t) r[t] = std::exp(lr[t]);
    const Batch b = cov_batch(r);
    const std::vector<double> A = {2, -2, 1, -1};
    const auto out =
        run<KlCov>(R"({"kl_cov_ratio": 0.25, "ppo_kl_coef": 0.5, "loss_agg_mode": "sum"})", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    double loss = 0.5 * 0.2;
    for (int t = 0; t < 4; ++t) loss += -A[t] * r[t];
    EXPECT_NEAR(out.loss, loss, 1e-12);
    const auto &g = out.grads.at("logprobs");
    EXPECT_NEAR(g[0], -A[0] * r[0] + 0.5, 1e-12);
    EXPECT_NEAR(g[1], -A[1] * r[1], 1e-12);
    EXPECT_NEAR(out.metric("abs_kl"), 0.2, 1e-12);
    EXPECT_DOUBLE_EQ(out.metric("kl_cov_frac"), 0.25);
    // k = 2 adds token 1, whose log ratio is negative: gradient -0.5.
    const auto two =
        run<KlCov>(R"({"kl_cov_ratio": 0.5, "ppo_kl_coef": 0.5, "loss_agg_mode": "sum"})", b);
    EXPECT_NEAR(two.loss, loss + 0.5 * 0.1, 1e-12);
    EXPECT_NEAR(two.grads.at("logprobs")[1], -A[1] * r[1] - 0.5, 1e-12);
}

TEST(ValueLoss, HuberIsQuadraticInsideDeltaAndLinearOutside) {
    const Batch b = make({0, 3}, {{"values", {1.0, 1.0, 1.0}}, {"returns", {0.8, -1.0, 3.0}}});
    const auto out = run<ValueLoss>(R"({"huber_delta": 0.5, "loss_agg_mode": "sum"})", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    // errors {0.2, 2, -2}: 0.02, 0.5 * (2 - 0.25) twice.
    EXPECT_NEAR(out.loss, 0.02 + 2 * 0.875, 1e-12);
    const auto &g = out.grads.at("values");
    EXPECT_NEAR(g[0], 0.2, 1e-12);
    EXPECT_NEAR(g[1], 0.5, 1e-12);
    EXPECT_NEAR(g[2], -0.5, 1e-12);
    EXPECT_DOUBLE_EQ(out.metric("huber_linear_frac"), 2.0 / 3);
    // With the value clip of ValueLoss.ClipsAroundOldValues and delta 1: t0 takes the
    // clipped error -1.8 (linear: 1.8 - 0.5, no gradient); t1 error 1 (quadratic).
    const Batch c =
        make({0, 2}, {{"values", {1.0, 1.0}}, {"old_values", {0.0, 0.0}}, {"returns", {2.0, 0.0}}});
    const auto clip = run<ValueLoss>(
        R"({"vf_clip": 0.2, "huber_delta": 1, "vf_coef": 2, "loss_agg_mode": "sum"})", c);
    ASSERT_EQ(clip.status, RL_OK) << clip.error;
    EXPECT_NEAR(clip.loss, 2 * (1.3 + 0.5), 1e-12);
    EXPECT_EQ(clip.grads.at("values")[0], 0.0);
    EXPECT_NEAR(clip.grads.at("values")[1], 2.0, 1e-12);
    EXPECT_DOUBLE_EQ(clip.metric("huber_linear_frac"), 0.5);
}

// ---- decoupled_ppo: rejection sampling, AReaL's older modes, sequence level ------------

// Two sequences of two tokens; logprobs = prox_logprobs (PPO ratio 1, term -A, gradient
// -A b) and behaviour weights b = exp(prox - old) = {0.5, 3, 1.2, 1.1}, A = {1, 1, -1, 2}.
Batch behaviour_batch() {
    const std::vector<double> lp = {-1, -1, -1, -1}, b = {0.5, 3.0, 1.2, 1.1};
    return make({0, 2, 4}, {{"logprobs", lp},
                            {"prox_logprobs", lp},
                            {"old_logprobs", old_for(lp, b)},
                            {"advantages", {1, 1, -1, 2}}});
}

// The summed loss and its gradient for behaviour weights bw (0 = dropped).
void expect_weights(const T::LossRun &out, const std::vector<double> &bw) {
    ASSERT_EQ(out.status, RL_OK) << out.error;
    const std::vector<double> A = {1, 1, -1, 2};
    double loss = 0;
    for (int t = 0; t < 4; ++t) loss += -A[t] * bw[t];
    EXPECT_NEAR(out.loss, loss, 1e-12);
    for (int t = 0; t < 4; ++t) EXPECT_NEAR(out.grads.at("logprobs")[t], -A[t] * bw[t], 1e-12) << t;
}

TEST(DecoupledPpo, TokenRejectionMasksOrTruncatesBetweenTheBounds) {
    const Batch b = behaviour_batch();
    const std::string sum = R"(, "loss_agg_mode": "sum"})";
    expect_weights(run<DecoupledPpo>(R"({"loss_agg_mode": "sum"})", b), {0.5, 3, 1.2, 1.1});
    const auto mask =
        run<DecoupledPpo>(R"({"rejection_sampling": {"upper": 2, "lower": 0.6})" + sum, b);
    expect_weights(mask, {0, 0, 1.2, 1.1});
    EXPECT_DOUBLE_EQ(mask.metric("behav_maskfrac"), 0.5);
    EXPECT_NEAR(mask.metric("behav_imp_weight"), 1.15, 1e-12);
    const auto clamp = run<DecoupledPpo>(
        R"({"rejection_sampling": {"action": "clamp", "upper": 2, "lower": 0.6})" + sum, b);
    expect_weights(clamp, {0.6, 2, 1.2, 1.1});
    EXPECT_DOUBLE_EQ(clamp.metric("behav_truncfrac"), 0.5);
    EXPECT_FALSE(clamp.has_metric("behav_maskfrac"));
    // KL metrics: k1 = log b; upper 0.5 drops t1 (log 3), no lower bound keeps t0.
    expect_weights(
        run<DecoupledPpo>(R"({"rejection_sampling": {"metric": "kl_k1", "upper": 0.5})" + sum, b),
        {0.5, 0, 1.2, 1.1});
    // k3 = 1/b - 1 + log b: {0.307, 0.432, 0.0156, 0.0044}; upper 0.35 drops t1.
    expect_weights(
        run<DecoupledPpo>(R"({"rejection_sampling": {"metric": "kl_k3", "upper": 0.35})" + sum, b),
        {0.5, 0, 1.2, 1.1});
}

TEST(DecoupledPpo, SequenceRejectionUsesTheGeometricMeanWeightForTheRatioMetric) {
    const Batch b = behaviour_batch();
    const std::string sum = R"(, "loss_agg_mode": "sum"})";
    const double g0 = std::sqrt(1.5), g1 = std::sqrt(1.32); // per-sequence geometric means
    // mean (default agg): g0 > 1.2 drops sequence 0; sequence 1 keeps weight g1 on each token.
    const auto mask =
        run<DecoupledPpo>(R"({"rejection_sampling": {"level": "sequence", "upper": 1.2})" + sum, b);
    expect_weights(mask, {0, 0, g1, g1});
    EXPECT_DOUBLE_EQ(mask.metric("behav_maskfrac"), 0.5);
    // sum: exp(sum log b) = {1.5, 1.32}; upper 1.4 drops sequence 0 too.
    expect_weights(run<DecoupledPpo>(R"({"rejection_sampling": {"level": "sequence", "agg": "sum",
                                         "upper": 1.4})" +
                                         sum,
                                     b),
                   {0, 0, g1, g1});
    // max: {3, 1.2}; upper 4 keeps both.
    expect_weights(run<DecoupledPpo>(R"({"rejection_sampling": {"level": "sequence", "agg": "max",
                                         "upper": 4})" +
                                         sum,
                                     b),
                   {g0, g0, g1, g1});
    // clamp truncates the out-of-bounds sequence's weight to the upper bound.
    const auto clamp = run<DecoupledPpo>(
        R"({"rejection_sampling": {"level": "sequence", "action": "clamp", "upper": 1.2})" + sum,
        b);
    expect_weights(clamp, {1.2, 1.2, g1, g1});
    EXPECT_DOUBLE_EQ(clamp.metric("behav_truncfrac"), 0.5);
    // A KL metric aggregates arithmetically and keeps token weights: mean k2 of sequence
    // 0 is 0.42, of sequence 1 0.0104; upper 0.2 drops sequence 0.
    expect_weights(run<DecoupledPpo>(R"({"rejection_sampling": {"level": "sequence",
                                         "metric": "kl_k2", "upper": 0.2})" +
                                         sum,
                                     b),
                   {0, 0, 1.2, 1.1});
}

TEST(DecoupledPpo, AReaLsOlderModesAreShorthandsForRejectionSampling) {
    const Batch b = behaviour_batch();
    const double g1 = std::sqrt(1.32);
    auto legacy = [&](const std::string &mode, double cap) {
        return run<DecoupledPpo>(R"({"behave_imp_weight_mode": ")" + mode +
                                     R"(", "behave_imp_weight_cap": )" + std::to_string(cap) +
                                     R"(, "loss_agg_mode": "sum"})",
                                 b);
    };
    expect_weights(legacy("token_mask", 2), {0.5, 0, 1.2, 1.1});
    expect_weights(legacy("token_truncate", 2), {0.5, 2, 1.2, 1.1});
    expect_weights(legacy("sequence_mask", 1.2), {0, 0, g1, g1});
    expect_weights(legacy("sequence_truncate", 1.2), {1.2, 1.2, g1, g1});
    // Our spelling, and the cap alone (token_mask, as before).
    expect_weights(run<DecoupledPpo>(R"({"behav_imp_weight_cap": 2, "loss_agg_mode": "sum"})", b),
                   {0.5, 0, 1.2, 1.1});
    // 'disabled': no behaviour weight at all.
    expect_weights(
        run<DecoupledPpo>(R"({"behav_imp_weight_mode": "disabled", "loss_agg_mode": "sum"})", b),
        {1, 1, 1, 1});
}

TEST(DecoupledPpo, SequenceLevelRatioIsGspoAroundTheProximalPolicy) {
    // One sequence; log ratios to prox {0.1, 0.3, 0.5}, behaviour weights {1, 1, 3}.
    const std::vector<double> lp = {-1, -1, -1}, prox = {-1.1, -1.3, -1.5};
    Batch b = make({0, 3}, {{"logprobs", lp},
                            {"prox_logprobs", prox},
                            {"old_logprobs", old_for(prox, {1, 1, 3})},
                            {"advantages", {1, 2, 3}}});
    // All kept: s = exp(0.3), Abar = 2; 1 + 0.28 < s: clipped for A > 0, no gradient.
    auto out = run<DecoupledPpo>(
        R"({"importance_sampling_level": "sequence", "eps_clip_higher": 0.28,
            "loss_agg_mode": "sum"})",
        b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    EXPECT_NEAR(out.loss, -2 * 1.28 * (1 + 1 + 3), 1e-12);
    for (int t = 0; t < 3; ++t) EXPECT_EQ(out.grads.at("logprobs")[t], 0.0);
    EXPECT_DOUBLE_EQ(out.metric("pg_clipfrac"), 1.0);
    // Token rejection (upper 2) drops t2 first: s = exp(0.2) < 1.28, Abar = 1.5; each kept
    // token's loss -1.5 s, gradient sum_t w_t b_t (-Abar s) / 2 = -1.5 s.
    out = run<DecoupledPpo>(
        R"({"importance_sampling_level": "sequence", "eps_clip_higher": 0.28,
            "rejection_sampling": {"upper": 2}, "loss_agg_mode": "sum"})",
        b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    const double s = std::exp(0.2);
    EXPECT_NEAR(out.loss, -3 * s, 1e-12);
    EXPECT_NEAR(out.grads.at("logprobs")[0], -1.5 * s, 1e-12);
    EXPECT_NEAR(out.grads.at("logprobs")[1], -1.5 * s, 1e-12);
    EXPECT_EQ(out.grads.at("logprobs")[2], 0.0);
    EXPECT_NEAR(out.metric("ratio_mean"), s, 1e-12);
    // Dual clip on a negative sequence advantage: s = exp(1.6) > c_clip = 3.
    b["advantages"] = {-1, -2, -3};
    b["logprobs"] = {0.4, 0.2, 0.0};
    out = run<DecoupledPpo>(
        R"({"importance_sampling_level": "sequence", "c_clip": 3, "loss_agg_mode": "sum",
            "behav_imp_weight_mode": "disabled"})",
        b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    EXPECT_NEAR(out.loss, 3 * 2 * 3, 1e-12);
    EXPECT_DOUBLE_EQ(out.metric("dual_clipfrac"), 1.0);
    for (int t = 0; t < 3; ++t) EXPECT_EQ(out.grads.at("logprobs")[t], 0.0);
}

// ---- dppo, ipo (prime-rl) ------------------------------------------------------------

// Probabilities p = exp(logprobs) and q = exp(old_logprobs) per token.
Batch prob_batch(const std::vector<double> &p, const std::vector<double> &q,
                 const std::vector<double> &A) {
    std::vector<double> lp(p.size()), old(q.size());
    for (size_t t = 0; t < p.size(); ++t) {
        lp[t] = std::log(p[t]);
        old[t] = std::log(q[t]);
    }
    return make({0, int64_t(p.size())},
                {{"logprobs", lp}, {"old_logprobs", old}, {"advantages", A}});
}

double mismatch(double r) {
    return r - std::log(r) - 1.0;
}

TEST(Dppo, MasksByProbabilityDifferenceOnTheAdvantagesSide) {
    // dp = p - q = {0.3, 0.3, -0.3, -0.1}; default bounds 0.2: t0 (A > 0, dp > 0.2) and
    // t2 (A < 0, dp < -0.2) are masked; t1 (A < 0, dp > 0) and t3 (|dp| small) are kept.
    const Batch b = prob_batch({0.5, 0.5, 0.2, 0.3}, {0.2, 0.2, 0.5, 0.4}, {1, -1, -1, 2});
    const auto out = run<Dppo>(R"({"kl_tau": 0.1, "loss_agg_mode": "sum"})", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    const double l0 = std::log(2.5), l2 = std::log(0.4), l3 = std::log(0.75);
    EXPECT_NEAR(out.loss, 0.1 * (2 * l0 * l0 + l2 * l2 + l3 * l3) + 2.5 - 1.5, 1e-12);
    const auto &g = out.grads.at("logprobs");
    EXPECT_NEAR(g[0], 0.2 * l0, 1e-12); // masked: the KL term alone
    EXPECT_NEAR(g[1], 2.5 + 0.2 * l0, 1e-12);
    EXPECT_NEAR(g[2], 0.2 * l2, 1e-12);
    EXPECT_NEAR(g[3], -1.5 + 0.2 * l3, 1e-12);
    EXPECT_DOUBLE_EQ(out.metric("is_masked"), 0.5);
    EXPECT_DOUBLE_EQ(out.metric("is_masked_low"), 0.25);
    EXPECT_DOUBLE_EQ(out.metric("is_masked_high"), 0.25);
    EXPECT_DOUBLE_EQ(out.metric("masked_advantage_positive"), 0.5);
    EXPECT_DOUBLE_EQ(out.metric("masked_advantage_negative"), 0.5);
    EXPECT_NEAR(out.metric("masked_mismatch_kl"), (mismatch(2.5) + mismatch(0.4)) / 2, 1e-12);
    EXPECT_NEAR(out.metric("unmasked_mismatch_kl"), (mismatch(2.5) + mismatch(0.75)) / 2, 1e-12);
    EXPECT_NEAR(out.metric("pg_loss"), out.loss, 1e-12);
    // Wider bounds keep every token; adv_tau scales the policy term only.
    const auto wide = run<Dppo>(
        R"({"dppo_mask_low": 0.5, "dppo_mask_high": 0.5, "adv_tau": 2, "kl_tau": 0,
            "loss_agg_mode": "sum"})",
        b);
    ASSERT_EQ(wide.status, RL_OK) << wide.error;
    EXPECT_NEAR(wide.loss, 2 * (-2.5 + 2.5 + 0.4 - 1.5), 1e-12);
    EXPECT_DOUBLE_EQ(wide.metric("is_masked"), 0.0);
    // Defaults: kl_tau 1e-3, token-mean.
    const auto def = run<Dppo>("{}", b);
    EXPECT_NEAR(def.loss, (1e-3 * (2 * l0 * l0 + l2 * l2 + l3 * l3) + 1.0) / 4, 1e-12);
}

TEST(Ipo, MasksSymmetricallyByTheAbsoluteProbabilityDifference) {
    // dp = {0.3, 0.3, -0.3, -0.05}: threshold 0.1 masks t0..t2 whatever the sign of A.
    const Batch b = prob_batch({0.5, 0.5, 0.2, 0.3}, {0.2, 0.2, 0.5, 0.35}, {1, -1, -1, 2});
    const auto out = run<Ipo>(R"({"kl_tau": 0, "loss_agg_mode": "sum"})", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    const double r3 = 0.3 / 0.35;
    EXPECT_NEAR(out.loss, -2 * r3, 1e-12);
    const auto &g = out.grads.at("logprobs");
    EXPECT_EQ(g[0], 0.0);
    EXPECT_EQ(g[1], 0.0);
    EXPECT_EQ(g[2], 0.0);
    EXPECT_NEAR(g[3], -2 * r3, 1e-12);
    EXPECT_DOUBLE_EQ(out.metric("is_masked"), 0.75);
    EXPECT_FALSE(out.has_metric("is_masked_low"));
    const auto loose =
        run<Ipo>(R"({"ipo_threshold": 0.35, "kl_tau": 0, "loss_agg_mode": "sum"})", b);
    EXPECT_NEAR(loose.loss, -2.5 + 2.5 + 0.4 - 2 * r3, 1e-12);
}

TEST(Dppo, CeAndRefKlComponentsAreNormalizedOverTheirOwnTokens) {
    Batch b = prob_batch({0.5, 0.5, 0.2, 0.3}, {0.2, 0.2, 0.5, 0.4}, {1, -1, -1, 2});
    const std::vector<double> lp = b["logprobs"];
    b.f["ce_weights"] = {1, 0, 0, 2};
    b.f["ref_kl_weights"] = {0, 1, 1, 0};
    b.f["rl_weights"] = {1, 1, 1, 0.5};
    b.f["ref_logprobs"] = {-1, lp[1] + 0.4, -1, -1};
    const auto out = run<Dppo>(R"({"kl_tau": 0})", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    // rl over the 4 loss tokens (t3 weighted 0.5): (2.5 - 0.5 * 1.5) / 4.
    const double rl = (2.5 - 0.75) / 4;
    // ce over t0, t3: (-lp0 - 2 lp3) / 2.
    const double ce = (-lp[0] - 2 * lp[3]) / 2;
    // ref_kl over t1, t2: t1 kept (dp = 0.3), advantage ref - lp = 0.4, r = 2.5; t2 masked
    // (dp = -0.3 < -0.2); both add 1e-3 (log r)^2.
    const double l1 = std::log(2.5), l2 = std::log(0.4);
    const double rk = (-0.4 * 2.5 + 1e-3 * (l1 * l1 + l2 * l2)) / 2;
    EXPECT_NEAR(out.metric("rl_loss"), rl, 1e-12);
    EXPECT_NEAR(out.metric("ce_loss"), ce, 1e-12);
    EXPECT_NEAR(out.metric("ref_kl_loss"), rk, 1e-12);
    EXPECT_NEAR(out.loss, rl + ce + rk, 1e-12);
    const auto &g = out.grads.at("logprobs");
    EXPECT_NEAR(g[0], -0.5, 1e-12);                                   // rl masked, ce 1/2
    EXPECT_NEAR(g[1], 2.5 / 4 + (-0.4 * 2.5 + 2e-3 * l1) / 2, 1e-12); // rl + ref_kl
    EXPECT_NEAR(g[2], 2e-3 * l2 / 2, 1e-12);                          // ref_kl KL term only
    EXPECT_NEAR(g[3], -0.5 * 2 * 0.75 / 4 - 1.0, 1e-12);              // rl (weight 0.5) + ce
    EXPECT_DOUBLE_EQ(out.metric("ce_tokens"), 2.0);
    EXPECT_DOUBLE_EQ(out.metric("ref_kl_tokens"), 2.0);
    EXPECT_DOUBLE_EQ(out.metric("ref_kl_is_masked"), 0.5);
    EXPECT_NEAR(out.metric("nll"), (-lp[0] - lp[3]) / 2, 1e-12);
    EXPECT_NEAR(out.metric("ref_kl_reverse"), (0.4 + (-1 - lp[2])) / 2, 1e-12);
}

TEST(Dppo, RefusesComponentsWithoutWhatTheyNeed) {
    Batch b = prob_batch({0.5, 0.5}, {0.2, 0.2}, {1, -1});
    b.f["ref_kl_weights"] = {1, 1};
    auto r = run<Dppo>("{}", b);
    EXPECT_EQ(r.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(r.error.find("'ref_kl_weights' needs input 'ref_logprobs'"), std::string::npos)
        << r.error;
    Batch c = prob_batch({0.5, 0.5}, {0.2, 0.2}, {1, -1});
    c.f["ce_weights"] = {1, 1};
    c.global_tokens = 10;
    r = run<Ipo>("{}", c);
    EXPECT_EQ(r.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(r.error.find("'ce_weights' with global_tokens"), std::string::npos) << r.error;
    EXPECT_EQ(run<Ipo>(R"({"loss_agg_mode": "sum"})", c).status, RL_OK);
    c.f["ce_weights"] = {1, -1};
    r = run<Ipo>(R"({"loss_agg_mode": "sum"})", c);
    EXPECT_EQ(r.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(r.error.find("'ce_weights' must be >= 0"), std::string::npos) << r.error;
}

// ---- rollout_is_weights (every policy loss) -----------------------------------------------

TEST(PolicyGradient, RolloutIsWeightsMultiplyThePolicyTermOnly) {
    const std::vector<double> lp = {-1.0, -1.0, -1.0}, r = {1.1, 5.0, 0.5}, A = {1.0, -1.0, 2.0};
    Batch b = make({0, 3}, {{"logprobs", lp}, {"old_logprobs", old_for(lp, r)}, {"advantages", A}});
    b.f["rollout_is_weights"] = {0.5, 2.0, 0.0};
    b.f["ref_logprobs"] = {-1.5, -0.5, -1.0};
    const auto out =
        run<PolicyLoss>(R"({"kl_coef": 0.1, "kl_type": "k1", "loss_agg_mode": "sum"})", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    // PPO terms: t0 -1.1 (inside the band), t1 max(5, 1.2) = 5, t2 max(-1, -1.6) = -1, all on
    // the unclipped branch. Weighted: 0.5 * -1.1 + 2 * 5 + 0 * -1; the k1 KL term
    // (0.5, -0.5, 0) is not weighted.
    EXPECT_NEAR(out.metric("pg_loss"), -0.55 + 10.0, 1e-12);
    EXPECT_NEAR(out.loss, -0.55 + 10.0 + 0.1 * (0.5 - 0.5 + 0.0), 1e-12);
    const auto &g = out.grads.at("logprobs");
    EXPECT_NEAR(g[0], 0.5 * -1.1 + 0.1, 1e-12);
    EXPECT_NEAR(g[1], 2.0 * 5.0 + 0.1, 1e-12);
    EXPECT_NEAR(g[2], 0.1, 1e-12); // weight 0: the KL term alone
    b.f["rollout_is_weights"] = {0.5, -1.0, 0.0};
    const auto bad = run<PolicyLoss>("{}", b);
    EXPECT_EQ(bad.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(bad.error.find("'rollout_is_weights' must be >= 0"), std::string::npos) << bad.error;
}

TEST(PolicyGradient, EveryPolicyLossScalesItsPolicyTermByConstantRolloutIsWeights) {
    for (const auto &name : loss_names()) {
        with_loss(name, [&](auto tag) {
            using L = typename decltype(tag)::type;
            T::Host host;
            const std::string params = R"({"kl_coef": 0.1})";
            T::Instance<L> inst(host, params);
            if (!inst.ok()) return; // not a policy loss (no kl_coef)
            const auto acc = accepted_inputs(inst);
            if (std::find(acc.begin(), acc.end(), "rollout_is_weights") == acc.end()) return;
            SCOPED_TRACE(name);
            Batch b = random_batch(4).only(acc);
            b.f.erase("ce_weights");
            b.f.erase("ref_kl_weights");
            b.f["rollout_is_weights"].assign(size_t(b.n()), 1.0);
            const auto one = T::run_loss(inst, b.inputs());
            b.f["rollout_is_weights"].assign(size_t(b.n()), 3.0);
            const auto three = T::run_loss(inst, b.inputs());
            ASSERT_EQ(one.status, RL_OK) << one.error;
            ASSERT_EQ(three.status, RL_OK) << three.error;
            const double pg1 = one.metric("pg_loss"), pg3 = three.metric("pg_loss");
            EXPECT_NEAR(pg3, 3 * pg1, 1e-12 * (1 + std::fabs(pg1)));
            EXPECT_NEAR(three.loss - pg3, one.loss - pg1, 1e-12 * (1 + std::fabs(one.loss)));
            EXPECT_NE(pg1, 0.0);
        });
    }
}

// ---- weights (every loss) -------------------------------------------------------------------

TEST(Weights, ScaleTheWholePerTokenLossAndKeepTheNormalizer) {
    const std::vector<double> lp = {-1.0, -1.0, -1.0}, r = {1.1, 5.0, 0.5}, A = {1.0, -1.0, 2.0};
    Batch b = make({0, 3}, {{"logprobs", lp}, {"old_logprobs", old_for(lp, r)}, {"advantages", A}});
    b.f["ref_logprobs"] = {-1.5, -0.5, -1.0};
    b.f["weights"] = {0.5, 2.0, 0.0};
    // Token-mean over 3 tokens (the zero weight stays in the normalizer); the k1 KL term
    // (0.5, -0.5, 0) is weighted too: ((-1.1 + 0.1 * 0.5) * 0.5 + (5 - 0.05) * 2) / 3.
    const auto out = run<PolicyLoss>(R"({"kl_coef": 0.1, "kl_type": "k1"})", b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    EXPECT_NEAR(out.loss, ((-1.1 + 0.05) * 0.5 + (5 - 0.05) * 2) / 3, 1e-12);
    const auto &g = out.grads.at("logprobs");
    EXPECT_NEAR(g[0], 0.5 * (-1.1 + 0.1) / 3, 1e-12);
    EXPECT_NEAR(g[1], 2.0 * (5.0 + 0.1) / 3, 1e-12);
    EXPECT_EQ(g[2], 0.0);
    // Cross-entropy and the critic take them too.
    Batch ce = make({0, 2}, {{"logprobs", {-1.0, -3.0}}, {"weights", {2.0, 0.5}}});
    ce.labels = {1, 2};
    ce.has_labels = true;
    const auto c = run<CausalLmLoss>("{}", ce);
    ASSERT_EQ(c.status, RL_OK) << c.error;
    EXPECT_NEAR(c.loss, (2.0 * 1.0 + 0.5 * 3.0) / 2, 1e-12);
    const Batch v =
        make({0, 2}, {{"values", {1.0, 1.0}}, {"returns", {0.0, 3.0}}, {"weights", {1.0, 3.0}}});
    const auto val = run<ValueLoss>(R"({"loss_agg_mode": "sum"})", v);
    ASSERT_EQ(val.status, RL_OK) << val.error;
    EXPECT_NEAR(val.loss, 0.5 * 1.0 + 3.0 * 0.5 * 4.0, 1e-12);
    EXPECT_NEAR(val.grads.at("values")[1], 3.0 * -2.0, 1e-12);
    b.f["weights"] = {1.0, -0.5, 1.0};
    const auto bad = run<PolicyLoss>("{}", b);
    EXPECT_EQ(bad.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(bad.error.find("'weights' must be >= 0"), std::string::npos) << bad.error;
}

// Cross-entropy alone takes weights of either sign: Tinker's custom losses send
// -dL/dlogprob as the weights of a summed cross-entropy, so the gradient is the
// weight itself and the loss is the weighted sum.
TEST(Weights, CrossEntropyTakesNegativeWeightsAsTheGradientOfACustomLoss) {
    Batch ce = make({0, 3}, {{"logprobs", {-1.0, -3.0, -0.5}}, {"weights", {2.0, -0.5, 0.0}}});
    ce.labels = {1, 2, 3};
    ce.has_labels = true;
    const auto c = run<CausalLmLoss>(R"({"loss_agg_mode": "sum"})", ce);
    ASSERT_EQ(c.status, RL_OK) << c.error;
    EXPECT_NEAR(c.loss, 2.0 * 1.0 - 0.5 * 3.0, 1e-12);
    const auto &g = c.grads.at("logprobs");
    EXPECT_EQ(g[0], -2.0);
    EXPECT_EQ(g[1], 0.5);
    EXPECT_EQ(g[2], 0.0);
}

// ---- per_token_outputs (every policy loss) ---------------------------------------------

TEST(PerTokenOutputs, PolicyLossEmitsItsTermsMasksAndWeights) {
    const std::vector<double> lp = {-1.0, -1.0, -1.0}, r = {1.1, 5.0, 0.5}, A = {1.0, 1.0, 2.0};
    Batch b = make({0, 3}, {{"logprobs", lp}, {"old_logprobs", old_for(lp, r)}, {"advantages", A}});
    b.f["ref_logprobs"] = {-1.5, -0.5, -1.0};
    const auto out = run<PolicyLoss>(
        R"({"per_token_outputs": true, "icepop_beta": 4, "kl_type": "k1", "loss_agg_mode": "sum"})",
        b);
    ASSERT_EQ(out.status, RL_OK) << out.error;
    // t0 inside the band; t1 r = 5 > beta: dropped by IcePop (clipped too, A > 0);
    // t2 r = 0.5, A > 0: -A r = -1 > -A 0.8 = -1.6, unclipped.
    EXPECT_EQ(out.tensors.at("clip_mask"), (std::vector<double>{0, 1, 0}));
    EXPECT_EQ(out.tensors.at("icepop_mask"), (std::vector<double>{0, 1, 0}));
    const auto &l = out.tensors.at("elementwise_loss");
    EXPECT_NEAR(l[0], -1.1, 1e-12);
    EXPECT_EQ(l[1], 0.0);
    EXPECT_NEAR(l[2], -1.0, 1e-12);
    EXPECT_NEAR(out.tensors.at("ratio")[1], 5.0, 1e-12);
    EXPECT_NEAR(out.tensors.at("kl")[0], 0.5, 1e-12); // k1 = logprobs - ref
    EXPECT_NEAR(out.tensors.at("kl")[1], -0.5, 1e-12);
    EXPECT_FALSE(out.tensors.count("tis_weights"));
    // Off by default.
    EXPECT_TRUE(run<PolicyLoss>("{}", b).tensors.empty());
}

TEST(PerTokenOutputs, EveryPolicyLossesElementwiseLossSumsToItsPolicyTerm) {
    for (const auto &name : loss_names()) {
        with_loss(name, [&](auto tag) {
            using L = typename decltype(tag)::type;
            T::Host host;
            T::Instance<L> inst(host, R"({"per_token_outputs": true, "loss_agg_mode": "sum"})");
            if (!inst.ok()) return; // not a policy loss
            SCOPED_TRACE(name);
            Batch b = random_batch(6).only(accepted_inputs(inst));
            for (const char *x : {"weights", "rollout_is_weights", "ce_weights", "ref_kl_weights"})
                b.f.erase(x);
            const auto out = T::run_loss(inst, b.inputs());
            ASSERT_EQ(out.status, RL_OK) << out.error;
            ASSERT_TRUE(out.tensors.count("elementwise_loss"));
            const auto &l = out.tensors.at("elementwise_loss");
            ASSERT_EQ(int64_t(l.size()), b.n());
            double sum = 0;
            for (int64_t t = 0; t < b.n(); ++t) {
                sum += l[t];
                if (b["loss_mask"][t] == 0) {
                    EXPECT_EQ(l[t], 0.0) << t;
                }
            }
            EXPECT_NEAR(sum, out.metric("pg_loss"), 1e-10 * (1 + std::fabs(sum)));
            for (const auto &kv : out.tensors) {
                EXPECT_EQ(int64_t(kv.second.size()), b.n()) << kv.first;
                if (kv.first.find("mask") == std::string::npos) continue;
                for (double x : kv.second) {
                    EXPECT_TRUE(x == 0 || x == 1) << kv.first;
                }
            }
            if (b.f.count("ref_logprobs")) {
                EXPECT_TRUE(out.tensors.count("kl"));
            }
        });
    }
}

// ---- forward only -------------------------------------------------------------------

TEST(ForwardOnly, GivesTheSameLossAndNoGradients) {
    for (const auto &name : loss_names()) {
        SCOPED_TRACE(name);
        with_loss(name, [&](auto tag) {
            using L = typename decltype(tag)::type;
            T::Host host;
            T::Instance<L> inst(host, name == "gspo" ? R"({"eps_clip": 0.2})" : "{}");
            ASSERT_TRUE(inst.ok()) << inst.error();
            const Batch b = random_batch(3).only(accepted_inputs(inst));
            const auto with = T::run_loss(inst, b.inputs(), true);
            const auto without = T::run_loss(inst, b.inputs(), false);
            ASSERT_EQ(without.status, RL_OK) << without.error;
            EXPECT_EQ(with.loss, without.loss);
            EXPECT_FALSE(with.grads.empty());
            EXPECT_TRUE(without.grads.empty());
            EXPECT_EQ(with.metrics, without.metrics);
        });
    }
}

// ---- rejection_sampling on every policy loss (old_logprobs vs rollout_logprobs) ---------

// The same rejection as decoupled_ppo's (one implementation, rl/sdk/rejection.hpp),
// here judging old_logprobs against the behaviour policy rollout_logprobs: action
// mask drops tokens (weight 0, kept in the normalizer), action clamp multiplies
// the policy term by the truncated weight. Both equal a run with the matching
// rollout_is_weights.
TEST(RejectionSampling, OnAPolicyLossMasksOrTruncatesLikeTheMatchingIsWeights) {
    // old - rollout log ratios: r = 3, 1, 0.25, 1.5 (two sequences).
    const std::vector<double> lp = {-1.0, -0.5, -2.0, -1.2}, old = {-1.1, -0.4, -2.0, -1.0};
    std::vector<double> roll(4);
    const std::vector<double> r = {3.0, 1.0, 0.25, 1.5};
    for (size_t t = 0; t < 4; ++t) roll[t] = old[t] - std::log(r[t]);
    const Batch b = make({0, 2, 4}, {{"logprobs", lp},
                                     {"old_logprobs", old},
                                     {"rollout_logprobs", roll},
                                     {"advantages", {1.0, -1.0, 0.5, 2.0}}});
    Batch plain = b.only({"logprobs", "old_logprobs", "advantages"});
    auto same = [](const T::LossRun &x, const T::LossRun &y) {
        ASSERT_EQ(x.status, RL_OK) << x.error;
        ASSERT_EQ(y.status, RL_OK) << y.error;
        EXPECT_NEAR(x.loss, y.loss, 1e-12);
        for (size_t t = 0; t < 4; ++t)
            EXPECT_NEAR(x.grads.at("logprobs")[t], y.grads.at("logprobs")[t], 1e-12) << t;
    };
    // Token mask in [0.5, 2]: tokens 0 (r 3) and 2 (r 0.25) are dropped.
    const auto masked = run<PolicyLoss>(
        R"({"rejection_sampling": {"upper": 2, "lower": 0.5}, "per_token_outputs": true})", b);
    plain.f["rollout_is_weights"] = {0.0, 1.0, 0.0, 1.0};
    same(masked, run<PolicyLoss>("{}", plain));
    EXPECT_DOUBLE_EQ(masked.metric("behav_maskfrac"), 0.5);
    EXPECT_EQ(masked.reductions.at("behav_maskfrac").first, RL_METRIC_TOKEN_MEAN);
    EXPECT_EQ(masked.tensors.at("rejection_mask"), (std::vector<double>{1, 0, 1, 0}));
    // Clamp into [0.5, 2]: weights 2, 1, 0.5, 1.5; two were truncated.
    const auto clamped = run<PolicyLoss>(
        R"({"rejection_sampling": {"action": "clamp", "upper": 2, "lower": 0.5}})", b);
    plain.f["rollout_is_weights"] = {2.0, 1.0, 0.5, 1.5};
    same(clamped, run<PolicyLoss>("{}", plain));
    EXPECT_DOUBLE_EQ(clamped.metric("behav_truncfrac"), 0.5);
    // Sequence level, max of the log ratios: sequence 0 (max r 3) is dropped,
    // sequence 1 (max r 1.5) kept.
    const auto seq =
        run<Gspo>(R"({"rejection_sampling": {"level": "sequence", "agg": "max", "upper": 2}})", b);
    Batch gplain = plain;
    gplain.f["rollout_is_weights"] = {0.0, 0.0, 1.0, 1.0};
    same(seq, run<Gspo>("{}", gplain));
    // A KL metric (k3 of log r, sum over the sequence): seq 0 k3 = (1/3 - 1 + ln 3)
    // + 0 = 0.432, seq 1 = (4 - 1 - ln 4) + (1/1.5 - 1 + ln 1.5) = 1.68: upper 1 drops seq 1.
    const auto kl = run<Cispo>(
        R"({"rejection_sampling": {"level": "sequence", "agg": "sum", "metric": "kl_k3",
            "upper": 1}})",
        b);
    Batch cplain = plain;
    cplain.f["rollout_is_weights"] = {1.0, 1.0, 0.0, 0.0};
    same(kl, run<Cispo>("{}", cplain));
}

TEST(RejectionSampling, OnAPolicyLossNeedsRolloutLogprobsAndValidBounds) {
    const Batch b = make(
        {0, 2},
        {{"logprobs", {-1.0, -0.5}}, {"old_logprobs", {-1.0, -0.5}}, {"advantages", {1.0, -1.0}}});
    auto r = run<PolicyLoss>(R"({"rejection_sampling": {"upper": 2}})", b);
    EXPECT_NE(r.status, RL_OK);
    EXPECT_NE(r.error.find("rollout_logprobs"), std::string::npos) << r.error;
    r = run<GrpoLoss>(R"({"rejection_sampling": {"upper": 0.5}})", b);
    EXPECT_EQ(r.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(r.error.find("'upper' must be > 1 for metric 'ratio'"), std::string::npos) << r.error;
    r = run<Sapo>(R"({"rejection_sampling": {"agg": "max"}})", b);
    EXPECT_NE(r.error.find("'agg' only applies to level 'sequence'"), std::string::npos) << r.error;
    r = run<PolicyLoss>(R"({"rejection_sampling": null})", b); // null: off
    EXPECT_EQ(r.status, RL_OK) << r.error;
}

// ---- z-loss (the trainer's logsumexp input) -----------------------------------------

// causallm_loss with z_loss: mean(-logprobs) + z mean(log^2 Z) over label
// tokens, d/d logsumexp_t = 2 z log Z_t / n.
TEST(ZLoss, AddsTheMeanSquaredLogNormalizerToCrossEntropy) {
    Batch b = make({0, 3}, {{"logprobs", {-1.0, -2.0, -0.5}}, {"logsumexp", {1.0, 2.0, -3.0}}});
    b.labels = {5, -100, 7};
    b.has_labels = true;
    const auto r = run<CausalLmLoss>(R"({"z_loss": 0.1})", b);
    ASSERT_EQ(r.status, RL_OK) << r.error;
    // Tokens 0 and 2: (1 + 0.5) / 2 + 0.1 (1 + 9) / 2.
    EXPECT_NEAR(r.loss, 0.75 + 0.5, 1e-12);
    EXPECT_NEAR(r.grads.at("logsumexp")[0], 0.1 * 2 * 1.0 / 2, 1e-12);
    EXPECT_EQ(r.grads.at("logsumexp")[1], 0.0);
    EXPECT_NEAR(r.grads.at("logsumexp")[2], 0.1 * 2 * -3.0 / 2, 1e-12);
    EXPECT_NEAR(r.metric("z_loss"), 5.0, 1e-12);
    EXPECT_EQ(r.reductions.at("z_loss").first, RL_METRIC_TOKEN_MEAN);
    // Off (the default): logsumexp is not an input at all.
    EXPECT_NE(run<CausalLmLoss>("{}", b).status, RL_OK);
}

TEST(ZLoss, OnAPolicyLossAddsToTheLossNotToPgLoss) {
    const std::vector<double> lp = {-1.0, -0.5};
    const Batch b = make({0, 2}, {{"logprobs", lp},
                                  {"old_logprobs", lp},
                                  {"advantages", {1.0, -2.0}},
                                  {"logsumexp", {2.0, 4.0}}});
    const auto r = run<PolicyLoss>(R"({"z_loss": 0.01})", b);
    ASSERT_EQ(r.status, RL_OK) << r.error;
    // ratio 1: pg = mean(-A) = 0.5; z term 0.01 * (4 + 16) / 2 = 0.1.
    EXPECT_NEAR(r.metric("pg_loss"), 0.5, 1e-12);
    EXPECT_NEAR(r.loss, 0.6, 1e-12);
    EXPECT_NEAR(r.grads.at("logsumexp")[1], 0.01 * 2 * 4.0 / 2, 1e-12);
}

TEST(ZLoss, NegativeCoefficientIsRefusedByName) {
    const Batch b = make({0, 1}, {{"logprobs", {-1.0}}, {"logsumexp", {1.0}}});
    const auto r = run<CausalLmLoss>(R"({"z_loss": -0.1})", b);
    EXPECT_EQ(r.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(r.error.find("z_loss"), std::string::npos) << r.error;
    const auto g = run<Gspo>(R"({"z_loss": -1})", b);
    EXPECT_NE(g.error.find("z_loss"), std::string::npos) << g.error;
}

// ---- ipo / dppo: Surogate's IPO per-token gradients -------------------------------------

// Surogate's asymmetric bounds: masked where dp > ipo_mask_high or dp < -ipo_mask_low.
TEST(Ipo, AsymmetricMaskBoundsAndTheSurogateRatioClip) {
    // Probabilities: token 0 rose by 0.2, token 1 fell by 0.08, token 2 has r = 3
    // at tiny probabilities (dp ~ 0).
    const std::vector<double> lp = {std::log(0.5), std::log(0.3), std::log(3e-4)};
    const std::vector<double> old = {std::log(0.3), std::log(0.38), std::log(1e-4)};
    const std::vector<double> A = {1.0, -1.0, 2.0};
    const Batch b = make({0, 3}, {{"logprobs", lp}, {"old_logprobs", old}, {"advantages", A}});
    const std::string sum = R"(, "kl_tau": 0, "loss_agg_mode": "sum", "per_token_outputs": true})";
    // Threshold 0.1 both ways: token 0 masked (0.2 > 0.1), token 1 not (0.08).
    auto r = run<Ipo>(R"({"ipo_threshold": 0.1)" + sum, b);
    ASSERT_EQ(r.status, RL_OK) << r.error;
    EXPECT_EQ(r.tensors.at("is_masked"), (std::vector<double>{1, 0, 0}));
    // Low bound 0.05, high 0.5: token 1 (fell 0.08) is masked, token 0 kept.
    r = run<Ipo>(R"({"ipo_mask_low": 0.05, "ipo_mask_high": 0.5)" + sum, b);
    ASSERT_EQ(r.status, RL_OK) << r.error;
    EXPECT_EQ(r.tensors.at("is_masked"), (std::vector<double>{0, 1, 0}));
    const double r0 = 0.5 / 0.3, r2 = 3.0;
    EXPECT_NEAR(r.loss, -1.0 * r0 - 2.0 * r2, 1e-9);
    // ratio_clip 1.5: min(r, 1.5) in value and gradient (r0 = 1.67 and r2 = 3 capped).
    r = run<Ipo>(R"({"ipo_mask_low": 0.05, "ipo_mask_high": 0.5, "ratio_clip": 1.5)" + sum, b);
    ASSERT_EQ(r.status, RL_OK) << r.error;
    EXPECT_NEAR(r.loss, -1.0 * 1.5 - 2.0 * 1.5, 1e-9);
    EXPECT_NEAR(r.grads.at("logprobs")[0], -1.5, 1e-9);
    EXPECT_EQ(r.grads.at("logprobs")[1], 0.0);
    EXPECT_NEAR(r.grads.at("logprobs")[2], -3.0, 1e-9);
    EXPECT_NEAR(r.metric("ratio_clipped"), 2.0 / 3.0, 1e-12);
    // teacher_tau: A' = A + 0.5 (teacher - logprobs), detached.
    Batch t = b;
    t.f["teacher_logprobs"] = {lp[0] + 1.0, lp[1], lp[2] - 2.0};
    r = run<Ipo>(R"({"ipo_mask_low": 0.05, "ipo_mask_high": 0.5, "teacher_tau": 0.5)" + sum, t);
    ASSERT_EQ(r.status, RL_OK) << r.error;
    EXPECT_NEAR(r.loss, -(1.0 + 0.5) * r0 - (2.0 - 1.0) * r2, 1e-9);
    EXPECT_NEAR(r.grads.at("logprobs")[0], -(1.0 + 0.5) * r0, 1e-9);
    EXPECT_NEAR(r.metric("teacher_kl"), (1.0 + 0.0 - 2.0) / 3.0, 1e-12);
    // Bad values name the parameter.
    r = run<Ipo>(R"({"ratio_clip": 0})", b);
    EXPECT_NE(r.error.find("'ratio_clip' must be > 0"), std::string::npos) << r.error;
    r = run<Ipo>(R"({"ipo_mask_low": -0.1})", b);
    EXPECT_NE(r.error.find("ipo_mask_low"), std::string::npos) << r.error;
    r = run<Dppo>(R"({"teacher_tau": 0.5})", b);
    EXPECT_NE(r.error.find("teacher_logprobs"), std::string::npos) << r.error;
}

} // namespace
} // namespace rl::losses::test
