// The contract every loss plugin keeps, checked on every loss plugin of the
// build (discovered from the plugin targets, see CMakeLists.txt): a new loss is
// covered by adding its folder. Parameters (unknown names, every
// loss_agg_mode and its normalizer), the signature, refusals of missing,
// undeclared, non-finite and mis-sized inputs, empty and fully masked batches,
// float32 inputs.
#include "loss_cases.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace rl::losses::test {
namespace {

using ::testing::HasSubstr;

class EveryLoss : public ::testing::TestWithParam<std::string> {
protected:
    // Runs f(Tag<L>{}) for the loss under test.
    template <class F>
    void with(F &&f) {
        with_loss(GetParam(), f);
    }
};

template <class L>
T::LossRun run(const std::string &params, const Batch &b) {
    return run_once<L>(params, b.inputs());
}

// The standard random batch restricted to what `params` makes the loss accept.
template <class L>
Batch batch_for(const std::string &params, uint64_t seed = 21) {
    T::Host host;
    T::Instance<L> inst(host, params);
    EXPECT_TRUE(inst.ok()) << inst.error();
    return random_batch(seed).only(accepted_inputs(inst));
}

TEST_P(EveryLoss, RefusesUnknownParametersNamingThem) {
    with([&](auto tag) {
        T::Host host;
        T::Instance<typename decltype(tag)::type> inst(host, R"({"no_such_param": 1})");
        EXPECT_EQ(inst.status(), RL_ERR_INVALID_ARG);
        EXPECT_THAT(inst.error(), HasSubstr("unknown parameter 'no_such_param'"));
        EXPECT_THAT(inst.error(), HasSubstr("loss_agg_mode"));
    });
}

TEST_P(EveryLoss, AcceptsEveryAggregationModeAndChecksItsNormalizer) {
    with([&](auto tag) {
        using L = typename decltype(tag)::type;
        for (const auto &mode : rl::sdk::loss::Aggregation::names()) {
            const std::string params =
                mode == "seq-mean-token-sum-norm"
                    ? R"({"loss_agg_mode": "seq-mean-token-sum-norm", "max_seq_len": 16})"
                    : R"({"loss_agg_mode": ")" + mode + R"("})";
            const auto r = run<L>(params, batch_for<L>(params));
            EXPECT_EQ(r.status, RL_OK) << mode << ": " << r.error;
            EXPECT_TRUE(std::isfinite(r.loss)) << mode;
        }
        T::Host host;
        T::Instance<L> bad(host, R"({"loss_agg_mode": "mean"})");
        EXPECT_THAT(bad.error(), HasSubstr("'loss_agg_mode'"));
        EXPECT_THAT(bad.error(), HasSubstr("token-mean, seq-mean-token-sum"));
        T::Instance<L> no_len(host, R"({"loss_agg_mode": "seq-mean-token-sum-norm"})");
        EXPECT_THAT(no_len.error(), HasSubstr("needs parameter 'max_seq_len'"));
        T::Instance<L> stray_len(host, R"({"max_seq_len": 512})");
        EXPECT_THAT(stray_len.error(), HasSubstr("'max_seq_len' only applies"));
    });
}

TEST_P(EveryLoss, SignatureIsConsistent) {
    with([&](auto tag) {
        T::Host host;
        T::Instance<typename decltype(tag)::type> inst(host, "{}");
        ASSERT_TRUE(inst.ok()) << inst.error();
        const auto s = T::loss_signature(inst);
        EXPECT_FALSE(s.required.empty());
        EXPECT_FALSE(s.differentiable.empty());
        const auto accepted = accepted_inputs(inst);
        EXPECT_EQ(std::set<std::string>(accepted.begin(), accepted.end()).size(), accepted.size())
            << "an input is declared twice";
        EXPECT_NE(std::find(s.optional.begin(), s.optional.end(), "loss_mask"), s.optional.end());
        for (const auto &d : s.differentiable)
            EXPECT_NE(std::find(accepted.begin(), accepted.end(), d), accepted.end()) << d;
    });
}

TEST_P(EveryLoss, RefusesMissingAndUndeclaredInputsNamingThem) {
    with([&](auto tag) {
        using L = typename decltype(tag)::type;
        T::Host host;
        T::Instance<L> inst(host, "{}");
        ASSERT_TRUE(inst.ok()) << inst.error();
        const Batch b = batch_for<L>("{}");
        for (const auto &name : T::loss_signature(inst).required) {
            Batch missing = b;
            if (name == "labels")
                missing.has_labels = false;
            else
                missing.f.erase(name);
            const auto r = T::run_loss(inst, missing.inputs());
            EXPECT_EQ(r.status, RL_ERR_INVALID_ARG) << name;
            EXPECT_THAT(r.error, HasSubstr("missing input '" + name + "'"));
        }
        Batch extra = b;
        extra.f["no_such_input"] = std::vector<double>(static_cast<size_t>(b.n()), 0.0);
        const auto r = T::run_loss(inst, extra.inputs());
        EXPECT_EQ(r.status, RL_ERR_INVALID_ARG);
        EXPECT_THAT(r.error, HasSubstr("unexpected input 'no_such_input'"));
    });
}

TEST_P(EveryLoss, RefusesNonFiniteAndMisSizedInputs) {
    with([&](auto tag) {
        using L = typename decltype(tag)::type;
        const Batch b = batch_for<L>("{}");
        for (const auto &kv : b.f) {
            if (kv.first == "loss_mask") continue;
            Batch nan = b;
            nan.f[kv.first][2] = std::numeric_limits<double>::quiet_NaN();
            auto r = run<L>("{}", nan);
            EXPECT_EQ(r.status, RL_ERR_NUMERIC) << kv.first;
            EXPECT_THAT(r.error, HasSubstr(kv.first));
            Batch shorter = b;
            shorter.f[kv.first].pop_back();
            r = run<L>("{}", shorter);
            EXPECT_EQ(r.status, RL_ERR_INVALID_ARG) << kv.first;
            EXPECT_THAT(r.error, HasSubstr(kv.first));
        }
    });
}

TEST_P(EveryLoss, EmptyAndFullyMaskedBatchesGiveZero) {
    with([&](auto tag) {
        using L = typename decltype(tag)::type;
        const Batch b = batch_for<L>("{}");
        Batch empty = b;
        empty.cu = {0};
        for (auto &kv : empty.f) kv.second.clear();
        empty.labels.clear();
        auto r = run<L>("{}", empty);
        ASSERT_EQ(r.status, RL_OK) << r.error;
        EXPECT_EQ(r.loss, 0.0);

        Batch masked = b;
        masked.f["loss_mask"].assign(static_cast<size_t>(b.n()), 0.0);
        r = run<L>("{}", masked);
        ASSERT_EQ(r.status, RL_OK) << r.error;
        EXPECT_EQ(r.loss, 0.0);
        for (const auto &g : r.grads)
            for (double x : g.second) EXPECT_EQ(x, 0.0) << g.first;
    });
}

TEST_P(EveryLoss, Float32InputsGiveTheFloat64Result) {
    with([&](auto tag) {
        using L = typename decltype(tag)::type;
        Batch b = batch_for<L>("{}");
        // Round the inputs to float so both runs see the same numbers.
        for (auto &kv : b.f)
            for (double &x : kv.second) x = double(float(x));
        T::LossInputs f32;
        for (const auto &kv : b.f)
            f32.f32(kv.first, std::vector<float>(kv.second.begin(), kv.second.end()));
        if (b.has_labels) f32.i64("labels", b.labels);
        f32.cu_seqlens(b.cu);
        T::Host host;
        T::Instance<L> inst(host, "{}");
        ASSERT_TRUE(inst.ok()) << inst.error();
        const auto r32 = T::run_loss(inst, f32);
        const auto r64 = T::run_loss(inst, b.inputs());
        ASSERT_EQ(r32.status, RL_OK) << r32.error;
        ASSERT_EQ(r64.status, RL_OK) << r64.error;
        EXPECT_EQ(r32.loss, r64.loss);
    });
}

// ---- metric reductions (ABI 0.6) -----------------------------------------------------

// Sequences [a, b) of `b`, with the whole batch's normalizers.
Batch seq_slice(const Batch &b, int64_t a, int64_t e, double tokens, double seqs) {
    Batch out = b;
    out.cu = {0};
    for (int64_t s = a; s < e; ++s) out.cu.push_back(out.cu.back() + b.cu[s + 1] - b.cu[s]);
    for (auto &kv : out.f)
        kv.second.assign(b.f.at(kv.first).begin() + b.cu[a], b.f.at(kv.first).begin() + b.cu[e]);
    out.labels.assign(b.labels.begin() + b.cu[a], b.labels.begin() + b.cu[e]);
    out.global_tokens = tokens;
    out.global_seqs = seqs;
    return out;
}

// What a host makes of one metric's values over calls, by its declared reduction
// (docs/abi.md, "Metrics and their reductions").
double reduce(const std::vector<std::pair<double, std::pair<rl_metric_reduction_t, double>>> &vs) {
    double wv = 0, w = 0, plain = 0, lo = INFINITY, hi = -INFINITY;
    for (const auto &v : vs) {
        wv += v.second.second * v.first;
        w += v.second.second;
        plain += v.first;
        if (v.second.second > 0) {
            lo = std::min(lo, v.first);
            hi = std::max(hi, v.first);
        }
    }
    switch (vs.front().second.first) {
        case RL_METRIC_SUM:
            return plain;
        case RL_METRIC_MIN:
            return w > 0 ? lo : plain / double(vs.size());
        case RL_METRIC_MAX:
            return w > 0 ? hi : plain / double(vs.size());
        default:
            return w > 0 ? wv / w : plain / double(vs.size());
    }
}

// Every metric but perplexity (exp of a mean) declares its reduction, and the
// declared reductions combine three calls over parts of a batch into the value
// of one call over all of it (Clip-Cov / KL-Cov select tokens by statistics of
// the whole call, so their parts differ by design).
TEST_P(EveryLoss, MetricsDeclareReductionsThatCombineCallsIntoTheWholeBatch) {
    with([&](auto tag) {
        using L = typename decltype(tag)::type;
        const std::string params =
            GetParam() == "policy_loss" ? R"({"compute_kl_stats": true})" : "{}";
        Batch b = GetParam() == "decoupled_ppo" ? decoupled_batch(21) : random_batch(21);
        {
            T::Host host;
            T::Instance<L> inst(host, params);
            ASSERT_TRUE(inst.ok()) << inst.error();
            b = b.only(accepted_inputs(inst));
            // dppo / ipo components carry no global counts of their own (refused
            // with global_tokens): the rl component alone.
            b.f.erase("ce_weights");
            b.f.erase("ref_kl_weights");
        }
        const auto whole = run_once<L>(params, b.inputs());
        ASSERT_EQ(whole.status, RL_OK) << whole.error;
        ASSERT_FALSE(whole.metrics.empty());
        for (const auto &m : whole.metrics) {
            if (m.first == "perplexity") continue;
            ASSERT_TRUE(whole.reductions.count(m.first)) << m.first << " has no reduction";
            const auto red = whole.reductions.at(m.first).first;
            const std::string &n = m.first;
            auto ends = [&](const char *suffix) {
                const std::string x(suffix);
                return n.size() >= x.size() && n.compare(n.size() - x.size(), x.size(), x) == 0;
            };
            if (ends("_min")) {
                EXPECT_EQ(red, RL_METRIC_MIN) << n;
            } else if (ends("_max")) {
                EXPECT_EQ(red, RL_METRIC_MAX) << n;
            } else if (ends("tokens") || ends("candidates") || ends("_loss")) {
                EXPECT_EQ(red, RL_METRIC_SUM) << n;
            } else if (ends("frac") || ends("_mean")) {
                EXPECT_TRUE(red == RL_METRIC_TOKEN_MEAN || red == RL_METRIC_SEQ_MEAN) << n;
            }
        }

        if (GetParam() == "clip_cov" || GetParam() == "kl_cov") return;
        int64_t tokens = 0, seqs = 0;
        for (int64_t s = 0; s < b.n_seqs(); ++s) {
            int64_t k = 0;
            for (int64_t t = b.cu[s]; t < b.cu[s + 1]; ++t) k += b["loss_mask"][t] != 0;
            tokens += k;
            seqs += k > 0;
        }
        std::map<std::string,
                 std::vector<std::pair<double, std::pair<rl_metric_reduction_t, double>>>>
            parts;
        for (auto [a, e] : {std::pair<int64_t, int64_t>{0, 2}, {2, 5}, {5, b.n_seqs()}}) {
            const auto r =
                run_once<L>(params, seq_slice(b, a, e, double(tokens), double(seqs)).inputs());
            ASSERT_EQ(r.status, RL_OK) << r.error;
            for (const auto &m : r.metrics)
                if (r.reductions.count(m.first))
                    parts[m.first].push_back({m.second, r.reductions.at(m.first)});
        }
        for (const auto &m : whole.metrics) {
            if (!whole.reductions.count(m.first)) continue;
            ASSERT_EQ(parts[m.first].size(), 3u) << m.first;
            EXPECT_NEAR(reduce(parts[m.first]), m.second, 1e-9 * (1 + std::fabs(m.second)))
                << m.first;
        }
    });
}

// An SDK plugin on a host of ABI 0.5 (no emit_metric_reduced slot) emits the
// same metrics through emit_metric.
TEST_P(EveryLoss, AHostWithoutTheReducedMetricSlotGetsPlainMetrics) {
    with([&](auto tag) {
        using L = typename decltype(tag)::type;
        const Batch b = batch_for<L>("{}");
        const auto now = run<L>("{}", b);
        ASSERT_EQ(now.status, RL_OK) << now.error;
        T::Host old(static_cast<uint32_t>(RL_SIZE_THROUGH(rl_host_api_t, emit_text)));
        T::Instance<L> inst(old, "{}");
        ASSERT_TRUE(inst.ok()) << inst.error();
        const auto r = T::run_loss(inst, b.inputs());
        ASSERT_EQ(r.status, RL_OK) << r.error;
        EXPECT_TRUE(r.reductions.empty());
        EXPECT_EQ(r.loss, now.loss);
        EXPECT_EQ(r.metrics, now.metrics);
    });
}

INSTANTIATE_TEST_SUITE_P(Losses, EveryLoss, ::testing::ValuesIn(loss_names()),
                         [](const auto &info) { return info.param; });

} // namespace
} // namespace rl::losses::test
