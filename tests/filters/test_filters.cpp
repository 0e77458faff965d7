// tests/filters: the gibberish and repetition filters on synthetic rollouts
// that must and must not trip them, through the C ABI of the built plugins.
#include "dl_plugin_host.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace {

using rltest::Instance;
using rltest::Outputs;

std::unique_ptr<Instance> make(const std::string &name, const std::string &params = "{}") {
    return std::make_unique<Instance>(rltest::load("filter-" + name), params);
}

struct Checked {
    Outputs out;
    rl_filter_verdict_t verdict;
};

// The check succeeded and flagged the rollout with `reason`, or ("") did not.
::testing::AssertionResult verdict_is(const Checked &c, const std::string &reason) {
    if (!c.out.ok()) return ::testing::AssertionFailure() << "check failed: " << c.out.error;
    const uint32_t want = reason.empty() ? 0u : 1u;
    if (c.verdict.flagged != want || reason != c.verdict.reason)
        return ::testing::AssertionFailure() << "flagged " << c.verdict.flagged << " reason '"
                                             << c.verdict.reason << "', want '" << reason << "'";
    return ::testing::AssertionSuccess();
}

Checked check(const Instance &f, std::vector<int64_t> ids, std::vector<double> lps, int64_t vocab) {
    Checked c{};
    c.out = f.filter(std::move(ids), std::move(lps), vocab, &c.verdict);
    return c;
}

constexpr int64_t kVocab = 151936;                                   // a Qwen-sized vocabulary
const double kCutoff = -std::log(static_cast<double>(kVocab)) - 2.0; // default offset

// ---- gibberish --------------------------------------------------------------------------

TEST(Gibberish, RareHighIdTokenFarBelowUniformTrips) {
    auto f = make("gibberish");
    Checked c =
        check(*f, {10, 120000, 20, 130000}, {-0.1, kCutoff - 0.5, -0.2, kCutoff - 3}, kVocab);
    ASSERT_TRUE(verdict_is(c, "gibberish"));
    EXPECT_EQ(c.out.metrics["gibberish_tokens"], 2);
    EXPECT_EQ(c.out.metrics["gibberish_first_position"], 1);
}

TEST(Gibberish, HighIdTokenAtOrAboveTheCutoffDoesNotTrip) {
    auto f = make("gibberish");
    Checked c = check(*f, {120000, 140000}, {kCutoff + 0.01, kCutoff}, kVocab);
    ASSERT_TRUE(verdict_is(c, ""));
    EXPECT_EQ(c.out.metrics["gibberish_tokens"], 0);
    EXPECT_EQ(c.out.metrics["gibberish_first_position"], -1);
}

TEST(Gibberish, UnlikelyTokenAtOrBelowTheIdThresholdDoesNotTrip) {
    auto f = make("gibberish");
    // The id must be strictly greater than token_id_threshold (100000).
    Checked c = check(*f, {50000, 100000}, {-30.0, -30.0}, kVocab);
    ASSERT_TRUE(c.out.ok()) << c.out.error;
    EXPECT_EQ(c.verdict.flagged, 0u);
}

TEST(Gibberish, ThresholdAndOffsetAreConfigurable) {
    // vocab 1000, offset 0.5: cutoff = -ln(1000) - 0.5 ~ -7.41; threshold 10.
    auto f = make("gibberish", R"({"token_id_threshold": 10, "logprob_offset": 0.5})");
    const double cutoff = -std::log(1000.0) - 0.5;
    EXPECT_EQ(check(*f, {11}, {cutoff - 1e-9}, 1000).verdict.flagged, 1u);
    EXPECT_EQ(check(*f, {10}, {cutoff - 1.0}, 1000).verdict.flagged, 0u);
    EXPECT_EQ(check(*f, {11}, {cutoff + 1e-9}, 1000).verdict.flagged, 0u);
}

TEST(Gibberish, EmptyRolloutIsNotFlagged) {
    auto f = make("gibberish");
    Checked c = check(*f, {}, {}, kVocab);
    ASSERT_TRUE(c.out.ok()) << c.out.error;
    EXPECT_EQ(c.verdict.flagged, 0u);
}

TEST(Gibberish, TokenOutsideTheVocabularyIsRefusedWithItsPosition) {
    auto f = make("gibberish");
    Checked c = check(*f, {1, kVocab}, {-1, -1}, kVocab);
    EXPECT_EQ(c.out.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(c.out.error.find("position 1"), std::string::npos) << c.out.error;
}

TEST(Gibberish, NanLogprobIsANumericError) {
    auto f = make("gibberish");
    Checked c = check(*f, {1, 2}, {-1, std::nan("")}, kVocab);
    EXPECT_EQ(c.out.status, RL_ERR_NUMERIC);
    EXPECT_NE(c.out.error.find("position 1"), std::string::npos) << c.out.error;
}

TEST(Gibberish, PositiveLogprobIsRefused) {
    auto f = make("gibberish");
    Checked c = check(*f, {1}, {0.7}, kVocab);
    EXPECT_EQ(c.out.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(c.out.error.find("logprobs"), std::string::npos) << c.out.error;
}

TEST(Gibberish, LengthMismatchIsRefused) {
    auto f = make("gibberish");
    Checked c = check(*f, {1, 2, 3}, {-1, -1}, kVocab);
    EXPECT_EQ(c.out.status, RL_ERR_INVALID_ARG);
}

// Parameters the filters refuse, each error naming the key.
TEST(FilterParams, BadValuesAreRefusedNamingTheKey) {
    struct Case {
        const char *filter, *params, *key;
    };
    const Case cases[] = {// The host strips `enforce` before create; a filter that saw it would
                          // be misconfigured, so the plugin refuses it.
                          {"filter-gibberish", R"({"enforce": true})", "enforce"},
                          {"filter-gibberish", R"({"logprob_offset": -1})", "logprob_offset"},
                          {"filter-repetition", R"({"prob_threshold": 1.0})", "prob_threshold"},
                          {"filter-repetition", R"({"window": 0})", "window"}};
    for (const Case &c : cases) {
        const std::string err = rltest::refusal(c.filter, c.params);
        EXPECT_NE(err.find(c.key), std::string::npos) << c.params << ": " << err;
    }
}

// ---- repetition ---------------------------------------------------------------------------

TEST(Repetition, RunOfWindowNearCertainTokensTrips) {
    auto f = make("repetition", R"({"window": 3, "prob_threshold": 0.9})");
    const double hi = std::log(0.95), lo = std::log(0.5);
    Checked c = check(*f, {1, 2, 3, 4, 5}, {lo, hi, hi, hi, lo}, 100);
    ASSERT_TRUE(verdict_is(c, "repetition"));
    EXPECT_EQ(c.out.metrics["repetition_longest_run"], 3);
    EXPECT_EQ(c.out.metrics["repetition_high_prob_tokens"], 3);
}

TEST(Repetition, InterruptedRunsDoNotAddUp) {
    auto f = make("repetition", R"({"window": 3, "prob_threshold": 0.9})");
    const double hi = std::log(0.95), lo = std::log(0.5);
    Checked c = check(*f, {1, 2, 3, 4, 5, 6}, {hi, hi, lo, hi, hi, lo}, 100);
    ASSERT_TRUE(c.out.ok()) << c.out.error;
    EXPECT_EQ(c.verdict.flagged, 0u);
    EXPECT_EQ(c.out.metrics["repetition_longest_run"], 2);
    EXPECT_EQ(c.out.metrics["repetition_high_prob_tokens"], 4);
}

TEST(Repetition, ProbabilityEqualToThresholdIsNotNearCertain) {
    // Strict inequality: p must exceed prob_threshold.
    const double lp = -0.1;
    const std::string params =
        R"({"window": 2, "prob_threshold": )" + rltest::detail::format_double(std::exp(lp)) + "}";
    auto f = make("repetition", params);
    EXPECT_EQ(check(*f, {1, 2, 3}, {lp, lp, lp}, 10).verdict.flagged, 0u);
    EXPECT_EQ(check(*f, {1, 2, 3}, {lp + 1e-9, lp + 1e-9, lp}, 10).verdict.flagged, 1u);
}

TEST(Repetition, DefaultWindowIs3000) {
    auto f = make("repetition");
    const double hi = std::log(0.999);
    std::vector<int64_t> ids(3000, 7);
    std::vector<double> lps(3000, hi);
    lps[0] = std::log(0.5); // run of 2999
    EXPECT_EQ(check(*f, ids, lps, 10).verdict.flagged, 0u);
    lps[0] = hi; // run of 3000
    EXPECT_EQ(check(*f, ids, lps, 10).verdict.flagged, 1u);
}

TEST(Repetition, InfLogprobIsANumericError) {
    auto f = make("repetition");
    Checked c = check(*f, {1}, {-INFINITY}, 10);
    EXPECT_EQ(c.out.status, RL_ERR_NUMERIC);
}

} // namespace
