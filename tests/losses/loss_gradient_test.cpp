// Every loss, every option set, every aggregation mode, on random packed
// batches (padding, unequal lengths, both advantage signs, ratios in and out of
// every band): the returned gradient equals central finite differences in
// double precision, and the loss value and metrics equal the direct formulas.
#include "loss_cases.hpp"
#include "loss_reference.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace rl::losses::test {
namespace {

constexpr double kStep = 1e-6;

// Central differences of evaluate(live, sg) in `live` only: detached quantities
// stay at their unperturbed values, as a stop-gradient implementation treats them.
template <class L>
void check_gradients(const Case &c, const AggVariant &agg, uint64_t seed) {
    const std::string params = merge(c.params, agg.json);
    SCOPED_TRACE(c.loss + " " + params + " seed " + std::to_string(seed));
    T::Host host;
    T::Instance<L> inst(host, params);
    ASSERT_TRUE(inst.ok()) << inst.error();
    Batch b = case_batch(c, seed).only(accepted_inputs(inst));
    b.global_tokens = agg.global_tokens;
    b.global_seqs = agg.global_seqs;
    // dppo / ipo refuse their ce / ref_kl components with global normalizers
    // (the call carries the rl component's counts only).
    if (agg.global_tokens > 0)
        for (const char *name : {"ce_weights", "ref_kl_weights"}) b.f.erase(name);

    // The C++ path (SDK boundary, host-provided gradient buffers).
    const T::LossRun run = T::run_loss(inst, b.inputs());
    ASSERT_EQ(run.status, RL_OK) << run.error;

    const L &loss = inst.object();
    const Data d = prepare(loss, b);
    const Result base = loss.evaluate(d, d);
    EXPECT_EQ(run.loss, base.loss);

    const auto sig = T::loss_signature(inst);
    ASSERT_FALSE(sig.differentiable.empty());
    for (const auto &name : sig.differentiable) {
        if (!d.has(name)) continue;
        ASSERT_TRUE(run.grads.count(name)) << "no gradient buffer for " << name;
        const auto &g = run.grads.at(name);
        int nonzero = 0;
        for (int64_t t = 0; t < d.n; ++t) {
            Data plus = d, minus = d;
            plus.x[name][t] += kStep;
            minus.x[name][t] -= kStep;
            const double fd =
                (loss.evaluate(plus, d).loss - loss.evaluate(minus, d).loss) / (2 * kStep);
            EXPECT_NEAR(g[t], fd, 1e-7 + 1e-6 * std::fabs(fd)) << name << " token " << t;
            if (d.mask[t] == 0) {
                EXPECT_EQ(g[t], 0.0) << name << " masked token " << t;
            }
            nonzero += std::fabs(g[t]) > 1e-12;
        }
        EXPECT_GT(nonzero, 0) << "all gradients of " << name << " are zero";
    }

    // Loss and metrics against the formulas, where the loss has a reference.
    // The references leave rollout_is_weights out (PolicyGradient.RolloutIsWeights*
    // check it): compare a run without them.
    Batch b_ref = b;
    b_ref.f.erase("rollout_is_weights");
    const std::optional<RefResult> ref = reference(c.loss, b_ref, params);
    if (!ref) return;
    const T::LossRun run_ref = T::run_loss(inst, b_ref.inputs());
    ASSERT_EQ(run_ref.status, RL_OK) << run_ref.error;
    const RefResult &want = *ref;
    EXPECT_NEAR(run_ref.loss, want.loss, 1e-12 * (1 + std::fabs(want.loss)));
    for (const auto &m : want.metrics) {
        ASSERT_TRUE(run_ref.has_metric(m.first)) << "metric " << m.first << " missing";
        EXPECT_NEAR(run_ref.metric(m.first), m.second, 1e-12 * (1 + std::fabs(m.second)))
            << m.first;
    }
    for (const auto &m : run_ref.metrics)
        EXPECT_TRUE(want.metrics.count(m.first)) << "unexpected metric " << m.first;
}

// Every loss plugin of the build (discovered, see CMakeLists.txt): its cases
// in loss_cases.hpp, or its defaults when it has none, in every aggregation mode.
class GradientsMatchFiniteDifferences : public ::testing::TestWithParam<std::string> {};

TEST_P(GradientsMatchFiniteDifferences, InEveryAggregationMode) {
    const std::string &name = GetParam();
    std::vector<Case> mine;
    for (const auto &c : cases())
        if (c.loss == name) mine.push_back(c);
    if (mine.empty()) mine.push_back({name, "{}", {}});
    for (const auto &c : mine)
        for (const auto &agg : agg_variants())
            for (uint64_t seed : {11u, 12u})
                with_loss(c.loss, [&](auto tag) {
                    check_gradients<typename decltype(tag)::type>(c, agg, seed);
                });
}

INSTANTIATE_TEST_SUITE_P(Losses, GradientsMatchFiniteDifferences, ::testing::ValuesIn(loss_names()),
                         [](const auto &info) { return info.param; });

// Every case names a loss plugin of the build.
TEST(LossCases, NameBuiltLosses) {
    for (const auto &c : cases())
        EXPECT_NE(std::find(loss_names().begin(), loss_names().end(), c.loss), loss_names().end())
            << c.loss;
}

// The random batches put tokens (and sequences) on both sides of every clip and
// mask band the gradient tests rely on: each fraction below is strictly
// between 0 and 1 for both seeds.
TEST(LossCases, RandomBatchesCoverEveryBand) {
    struct Band {
        std::string loss, params, metric;
        std::vector<double> targets;
    };
    const std::vector<Band> bands = {
        {"policy_loss", "{}", "pg_clipfrac", {}},
        {"policy_loss", R"({"eps_clip_c": 3, "loss_agg_mode": "sum"})", "pg_clipfrac", {}},
        {"policy_loss", R"({"icepop_beta": 5})", "icepop_maskfrac", {}},
        {"policy_loss", R"({"use_tis": true})", "tis_clipfrac", {}},
        {"grpo", "{}", "masked", {}},
        {"grpo", R"({"geo_mask_low": 0.6, "geo_mask_high": 1.6})", "masked_seqs", {}},
        {"grpo", R"({"sequence_mask_low": 0.1, "sequence_mask_high": 5})", "masked_seqs", {}},
        {"decoupled_ppo", R"({"c_clip": 3})", "pg_clipfrac", {}},
        {"decoupled_ppo", R"({"c_clip": 3})", "dual_clipfrac", {}},
        {"decoupled_ppo", R"({"behav_imp_weight_cap": 2})", "behav_maskfrac", {}},
        {"cispo", R"({"clip_low": 0.5, "clip_high": 2})", "clip_fraction", {}},
        {"gspo", "{}", "pg_clipfrac", {0.9, 1.0001, 0.9999, 1.01}},
        {"gspo",
         R"({"eps_clip": 0.2, "eps_clip_high": 0.28})",
         "pg_clipfrac",
         {0.5, 0.95, 1.05, 1.6}},
        {"value_loss", R"({"vf_clip": 0.2})", "vf_clipfrac", {}},
        {"value_loss", R"({"huber_delta": 0.5})", "huber_linear_frac", {}},
        {"gmpo", "{}", "pg_clipfrac", {}},
        {"gmpo", R"({"eps_clip": 0.05, "eps_clip_high": 0.05})", "pg_clipfrac", {}},
        {"clip_cov", "{}", "pg_clipfrac", {}},
        {"clip_cov",
         R"({"clip_cov_ratio": 0.2, "clip_cov_lb": 0.05, "clip_cov_ub": 1.5})",
         "cov_clipfrac",
         {}},
        {"clip_cov",
         R"({"selection": "top", "clip_cov_ratio": 0.3, "clip_cov_lb": -1,
                         "clip_cov_ub": 2})",
         "cov_clipfrac",
         {}},
        {"kl_cov", R"({"kl_cov_ratio": 0.2})", "kl_cov_frac", {}},
        {"dppo", "{}", "is_masked_low", {}},
        {"dppo", "{}", "is_masked_high", {}},
        {"dppo", "{}", "ref_kl_is_masked", {}},
        {"ipo", "{}", "is_masked", {}},
    };
    for (const auto &band : bands)
        for (uint64_t seed : {11u, 12u}) {
            SCOPED_TRACE(band.loss + " " + band.params + " " + band.metric);
            with_loss(band.loss, [&](auto tag) {
                T::Host host;
                T::Instance<typename decltype(tag)::type> inst(host, band.params);
                ASSERT_TRUE(inst.ok()) << inst.error();
                const Batch b = case_batch({band.loss, band.params, band.targets}, seed)
                                    .only(accepted_inputs(inst));
                const auto r = T::run_loss(inst, b.inputs());
                ASSERT_EQ(r.status, RL_OK) << r.error;
                EXPECT_GT(r.metric(band.metric), 0.0);
                EXPECT_LT(r.metric(band.metric), 1.0);
            });
        }
}

// Splitting a batch over two calls with the global normalizers set gives the
// full batch's loss and gradient, in every aggregation mode.
TEST(GradientAccumulation, MicroBatchesAddUpToTheFullBatch) {
    for (const auto &agg : agg_variants()) {
        if (agg.global_tokens > 0) continue;
        const std::string params = merge(R"({"eps_clip_c": 3, "kl_coef": 0.1})", agg.json);
        SCOPED_TRACE(params);
        T::Host host;
        T::Instance<PolicyLoss> inst(host, params);
        ASSERT_TRUE(inst.ok()) << inst.error();
        const Batch full = random_batch(5).only(accepted_inputs(inst));
        const T::LossRun whole = T::run_loss(inst, full.inputs());
        ASSERT_EQ(whole.status, RL_OK) << whole.error;

        // Count what the full batch normalizes by.
        const Data d = prepare(inst.object(), full);
        const int64_t split_seq = 3;
        double loss = 0;
        std::vector<double> grad;
        for (int part = 0; part < 2; ++part) {
            const int64_t s0 = part == 0 ? 0 : split_seq,
                          s1 = part == 0 ? split_seq : full.n_seqs();
            Batch b;
            const int64_t t0 = full.cu[s0], t1 = full.cu[s1];
            for (int64_t s = s0; s <= s1; ++s) b.cu.push_back(full.cu[s] - t0);
            for (const auto &kv : full.f)
                b.f[kv.first] = std::vector<double>(kv.second.begin() + t0, kv.second.begin() + t1);
            b.global_tokens = double(d.loss_tokens);
            b.global_seqs = double(d.loss_seqs);
            const T::LossRun r = T::run_loss(inst, b.inputs());
            ASSERT_EQ(r.status, RL_OK) << r.error;
            loss += r.loss;
            const auto &g = r.grads.at("logprobs");
            grad.insert(grad.end(), g.begin(), g.end());
        }
        EXPECT_NEAR(loss, whole.loss, 1e-12 * (1 + std::fabs(whole.loss)));
        const auto &g = whole.grads.at("logprobs");
        ASSERT_EQ(grad.size(), g.size());
        for (size_t t = 0; t < g.size(); ++t) EXPECT_NEAR(grad[t], g[t], 1e-14) << t;
    }
}

} // namespace
} // namespace rl::losses::test
