// tests/advantages: every advantage estimator against hand-computed values,
// through the C ABI of the built plugin libraries.
#include "dl_plugin_host.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace {

using rltest::Instance;
using rltest::Outputs;
using Tensors = std::map<std::string, std::vector<double>>;

constexpr double kTol = 1e-12;

std::unique_ptr<Instance> make(const std::string &name, const std::string &params = "{}") {
    return std::make_unique<Instance>(rltest::load("advantage-" + name), params);
}

void expect_near_all(const std::vector<double> &got, const std::vector<double> &want,
                     double tol = kTol) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "token " << i;
}

const std::vector<double> &adv(const Outputs &o) {
    static const std::vector<double> none;
    auto it = o.tensors.find("advantages");
    return it == o.tensors.end() ? none : it->second;
}

// ---- shared contract ---------------------------------------------------------------

TEST(AdvantageContract, EveryEstimatorEmitsFloat64PerTokenAdvantages) {
    const std::vector<std::pair<std::string, Tensors>> cases = {
        {"grpo", {}},
        {"rloo", {}},
        {"reinforce_pp", {}},
        {"gae", {{"values", {0.1, 0.2, 0.3, 0.4, 0.5}}}},
        {"group_norm", {{"advantages", {1, 2, 3, 4, 5}}}},
        {"gpg", {}},
        {"grpo_passk", {}},
        {"remax", {{"reward_baselines", {0.5, 0.5, 0.2, 0.2, 0.2}}}},
        {"areal", {}},
    };
    for (const auto &c : cases) {
        auto inst = make(c.first);
        Outputs o = inst->advantage({1.0, 0.0}, {0, 0}, {0, 2, 5}, c.second);
        ASSERT_TRUE(o.ok()) << c.first << ": " << o.error;
        ASSERT_EQ(adv(o).size(), 5u) << c.first;
        EXPECT_EQ(o.dtypes["advantages"].code, RL_DTYPE_FLOAT) << c.first;
        EXPECT_EQ(o.dtypes["advantages"].bits, 64) << c.first;
    }
}

TEST(AdvantageContract, UnusedPerTokenInputIsRefusedByName) {
    auto inst = make("grpo");
    Outputs o = inst->advantage({1.0, 0.0}, {0, 0}, {0, 1, 2}, {{"values", {0.0, 0.0}}});
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("'values'"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("loss_mask"), std::string::npos) << o.error;
}

// The host prefixes every plugin failure with "advantage '<name>': " (see
// test_advantages_runtime); a plugin that adds it too makes it appear twice.
TEST(AdvantageContract, InputErrorsDoNotRepeatTheHostsPrefix) {
    const std::vector<std::pair<std::string, Tensors>> cases = {
        {"gae", {}},                                // missing 'values'
        {"group_norm", {}},                         // missing 'advantages'
        {"grpo", {{"values", {0.0, 0.0}}}},         // unused input
        {"rloo", {{"values", {0.0, 0.0}}}},         // unused input
        {"reinforce_pp", {{"values", {0.0, 0.0}}}}, // unused input
        {"gpg", {{"values", {0.0, 0.0}}}},          // unused input
        {"grpo_passk", {{"values", {0.0, 0.0}}}},   // unused input
    };
    for (const auto &c : cases) {
        auto inst = make(c.first);
        Outputs o = inst->advantage({1.0, 0.0}, {0, 0}, {0, 1, 2}, c.second);
        EXPECT_EQ(o.status, RL_ERR_INVALID_ARG) << c.first;
        EXPECT_EQ(o.error.find("advantage '"), std::string::npos) << c.first << ": " << o.error;
        EXPECT_NE(o.error.find("input '"), std::string::npos) << c.first << ": " << o.error;
    }
    auto gn = make("group_norm", R"({"source": "rewards"})");
    Outputs o = gn->advantage({1.0, 0.0}, {0, 0}, {0, 1, 2}, {{"advantages", {1.0, 2.0}}});
    EXPECT_EQ(o.error, "input 'advantages' is not used by this estimator with source: rewards; it "
                       "accepts: loss_mask");
}

// Estimator `name` on one group of two sequences (rewards 1 and 0) with
// `cu_seqlens` and `loss_mask` must refuse them: the error message.
std::string refused(const std::string &name, std::vector<int64_t> cu_seqlens,
                    std::vector<double> loss_mask) {
    Outputs o = make(name)->advantage({1.0, 0.0}, {0, 0}, std::move(cu_seqlens),
                                      {{"loss_mask", std::move(loss_mask)}});
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    return o.error;
}

TEST(AdvantageContract, NonBinaryLossMaskIsRefusedWithTheToken) {
    const std::string err = refused("rloo", {0, 1, 2}, {1.0, 0.5});
    EXPECT_NE(err.find("token 1"), std::string::npos) << err;
}

TEST(AdvantageContract, NanRewardIsANumericError) {
    auto inst = make("grpo");
    Outputs o = inst->advantage({1.0, std::nan("")}, {0, 0}, {0, 1, 2});
    EXPECT_EQ(o.status, RL_ERR_NUMERIC);
}

TEST(AdvantageContract, CuSeqlensThatDisagreeWithTokenCountAreRefused) {
    const std::string err = refused("grpo", {0, 1, 3}, {1, 1});
    EXPECT_NE(err.find("cu_seqlens"), std::string::npos) << err;
}

TEST(AdvantageContract, UnknownParameterIsRefusedAndValidOnesListed) {
    const std::string err = rltest::refusal("advantage-grpo", R"({"norm_by_sd": true})");
    EXPECT_NE(err.find("norm_by_sd"), std::string::npos) << err;
    EXPECT_NE(err.find("norm_by_std"), std::string::npos) << err;
}

// ---- grpo -----------------------------------------------------------------------------

TEST(Grpo, NormalizesByUnbiasedGroupStdWithUnequalGroupSizes) {
    // Group 0: [1, 0, 0, 1]: mean 0.5, sample std sqrt(1/3) -> +-sqrt(3)/2.
    // Group 1: [2, 4, 9]: mean 5, sample var (9 + 1 + 16) / 2 = 13.
    auto inst = make("grpo", R"({"eps": 0})");
    Outputs o =
        inst->advantage({1, 0, 0, 1, 2, 4, 9}, {0, 0, 0, 0, 1, 1, 1}, {0, 1, 2, 3, 4, 5, 6, 7});
    ASSERT_TRUE(o.ok()) << o.error;
    const double h = std::sqrt(3.0) / 2.0, s13 = std::sqrt(13.0);
    expect_near_all(adv(o), {h, -h, -h, h, -3 / s13, -1 / s13, 4 / s13});
    EXPECT_EQ(o.metrics["groups"], 2);
    EXPECT_NEAR(o.metrics["reward_mean"], 17.0 / 7.0, kTol);
}

TEST(Grpo, EpsIsAddedToTheStd) {
    auto inst = make("grpo", R"({"eps": 0.5})");
    Outputs o = inst->advantage({1, 0}, {0, 0}, {0, 1, 2});
    ASSERT_TRUE(o.ok()) << o.error;
    const double sd = std::sqrt(0.5); // sample std of [1, 0]
    expect_near_all(adv(o), {0.5 / (sd + 0.5), -0.5 / (sd + 0.5)});
}

TEST(Grpo, PopulationStdWhenNotUnbiased) {
    auto inst = make("grpo", R"({"eps": 0, "std_unbiased": false})");
    Outputs o = inst->advantage({1, 0, 0, 1}, {3, 3, 3, 3}, {0, 1, 2, 3, 4});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {1, -1, -1, 1});
}

TEST(Grpo, DrGrpoWithoutStdIsRewardMinusGroupMean) {
    auto inst = make("grpo", R"({"norm_by_std": false})");
    Outputs o =
        inst->advantage({1, 0, 0, 1, 2, 4, 9}, {0, 0, 0, 0, 1, 1, 1}, {0, 1, 2, 3, 4, 5, 6, 7});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {0.5, -0.5, -0.5, 0.5, -3, -1, 4});
}

TEST(Grpo, SingletonAndAllEqualGroupsGetExactlyZero) {
    auto inst = make("grpo");
    // group 7: one sample; group 8: equal rewards 0.3 (std 0); group 9: signal.
    Outputs o =
        inst->advantage({0.9, 0.3, 0.3, 0.3, 1, 0}, {7, 8, 8, 8, 9, 9}, {0, 1, 2, 3, 4, 5, 6});
    ASSERT_TRUE(o.ok()) << o.error;
    for (int t = 0; t < 4; ++t) EXPECT_EQ(adv(o)[t], 0.0) << t;
    EXPECT_GT(adv(o)[4], 0.0);
    EXPECT_LT(adv(o)[5], 0.0);
    EXPECT_EQ(o.metrics["groups_singleton"], 1);
    EXPECT_EQ(o.metrics["groups_zero_std"], 1);
}

TEST(Grpo, BroadcastsToCompletionTokensOnly) {
    // Two sequences of 3 tokens: prompt, prompt, completion / prompt, completion x2.
    auto inst = make("grpo", R"({"norm_by_std": false})");
    Outputs o = inst->advantage({1, 0}, {0, 0}, {0, 3, 6}, {{"loss_mask", {0, 0, 1, 0, 1, 1}}});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {0, 0, 0.5, 0, -0.5, -0.5});
    EXPECT_NEAR(o.metrics["adv_mean"], (0.5 - 1.0) / 3.0, kTol);
}

TEST(Grpo, GroupsNeedNotBeContiguous) {
    auto inst = make("grpo", R"({"norm_by_std": false})");
    Outputs o = inst->advantage({1, 10, 0, 20}, {5, 6, 5, 6}, {0, 1, 2, 3, 4});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {0.5, -5, -0.5, 5});
}

TEST(Grpo, LengthWeightedMeanWeightsByCompletionTokens) {
    // Rewards [1, 0] with 3 and 1 completion tokens: baseline (3*1 + 1*0) / 4.
    auto inst = make("grpo", R"({"norm_by_std": false, "length_weighted_mean": true})");
    Outputs o = inst->advantage({1, 0}, {0, 0}, {0, 4, 6}, {{"loss_mask", {0, 1, 1, 1, 0, 1}}});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {0, 0.25, 0.25, 0.25, 0, -0.75});
}

// ---- rloo -----------------------------------------------------------------------------

TEST(Rloo, SubtractsTheMeanOfTheOtherSamples) {
    auto inst = make("rloo");
    Outputs o = inst->advantage({1, 0, 0, 1, 2, 4, 9, 5}, {0, 0, 0, 0, 1, 1, 1, 2},
                                {0, 1, 2, 3, 4, 5, 6, 7, 8});
    ASSERT_TRUE(o.ok()) << o.error;
    // Group 0: 1 - 1/3, 0 - 2/3. Group 1: 2 - 6.5, 4 - 5.5, 9 - 3. Group 2: singleton.
    expect_near_all(adv(o), {2.0 / 3, -2.0 / 3, -2.0 / 3, 2.0 / 3, -4.5, -1.5, 6, 0});
    EXPECT_EQ(o.metrics["groups_singleton"], 1);
}

TEST(Rloo, AllEqualGroupIsExactlyZeroAndMaskedTokensToo) {
    auto inst = make("rloo");
    Outputs o = inst->advantage({0.7, 0.7, 1, 0}, {0, 0, 1, 1}, {0, 2, 4, 6, 8},
                                {{"loss_mask", {0, 1, 0, 1, 1, 1, 0, 1}}});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {0, 0, 0, 0, 1, 1, 0, -1});
    EXPECT_EQ(adv(o)[1], 0.0);
    EXPECT_EQ(o.metrics["groups_zero_std"], 1);
}

TEST(Rloo, LengthWeightedLeaveOneOutBaseline) {
    // Rewards [1, 0, 0] with lengths [1, 2, 3]:
    //   i=0: others (0 w2, 0 w3) -> 0        => 1
    //   i=1: others (1 w1, 0 w3) -> 1/4      => -1/4
    //   i=2: others (1 w1, 0 w2) -> 1/3      => -1/3
    auto inst = make("rloo", R"({"length_weighted_mean": true})");
    Outputs o = inst->advantage({1, 0, 0}, {0, 0, 0}, {0, 1, 3, 6});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {1, -0.25, -0.25, -1.0 / 3, -1.0 / 3, -1.0 / 3});
}

// ---- reinforce_pp ---------------------------------------------------------------------

// reinforce_pp with `params` on two sequences: [prompt, completion] with
// reward 1 and three completion tokens with reward 0.5, with token rewards.
Outputs reinforce_pp_on_token_rewards(const char *params) {
    auto inst = make("reinforce_pp", params);
    return inst->advantage(
        {1, 0.5}, {0, 1}, {0, 2, 5},
        {{"loss_mask", {0, 1, 1, 1, 1}}, {"token_rewards", {5, -0.1, -0.2, 0.1, -0.3}}});
}

TEST(ReinforcePP, DiscountedReturnsOverCompletionTokensWithTokenRewards) {
    // seq 0: tokens [p, c] reward 1; seq 1: tokens [c, c, c] reward 0.5; gamma 0.5.
    // seq 0: G(c) = -0.1 + 1 = 0.9 (the prompt's token reward 5 is ignored).
    // seq 1: u = [-0.2, 0.1, -0.3 + 0.5]; G = [-0.2 + 0.5 * 0.2, 0.1 + 0.5 * 0.2, 0.2].
    Outputs o = reinforce_pp_on_token_rewards(R"({"gamma": 0.5, "whiten": false})");
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(o.tensors["returns"], {0, 0.9, -0.1, 0.2, 0.2});
    expect_near_all(adv(o), {0, 0.9, -0.1, 0.2, 0.2});
}

TEST(ReinforcePP, WhitensOverTheBatchsCompletionTokens) {
    // Same returns as above; masked values [0.9, -0.1, 0.2, 0.2]: mean 0.3,
    // population var 0.54 / 4.
    Outputs o = reinforce_pp_on_token_rewards(R"({"gamma": 0.5, "eps": 0})");
    ASSERT_TRUE(o.ok()) << o.error;
    const double sd = std::sqrt(0.135);
    expect_near_all(adv(o), {0, 0.6 / sd, -0.4 / sd, -0.1 / sd, -0.1 / sd});
    expect_near_all(o.tensors["returns"], {0, 0.9, -0.1, 0.2, 0.2});
}

TEST(ReinforcePP, GroupBaselineSubtractsGroupMeanAndSingletonsGetZero) {
    auto inst = make("reinforce_pp", R"({"group_baseline": true, "whiten": false})");
    Outputs o = inst->advantage({1, 0, 0.5}, {0, 0, 1}, {0, 1, 2, 3});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {0.5, -0.5, 0});
}

TEST(ReinforcePP, ConstantReturnsWhitenToExactlyZero) {
    auto inst = make("reinforce_pp");
    Outputs o = inst->advantage({1, 1}, {0, 1}, {0, 1, 2});
    ASSERT_TRUE(o.ok()) << o.error;
    EXPECT_EQ(adv(o)[0], 0.0);
    EXPECT_EQ(adv(o)[1], 0.0);
}

TEST(ReinforcePP, LengthWeightingWithoutGroupBaselineIsRefused) {
    const std::string err =
        rltest::refusal("advantage-reinforce_pp", R"({"length_weighted_mean": true})");
    EXPECT_NE(err.find("group_baseline"), std::string::npos) << err;
}

// ---- gae ------------------------------------------------------------------------------

TEST(Gae, MatchesHandComputedRecursion) {
    // seq 0: [prompt, c0, c1, c2], values [7 (ignored), 0.5, 0.2, 0.1], reward 1,
    // gamma 0.9, lambda 0.8:
    //   c2: delta = 1 - 0.1 = 0.9;               A = 0.9;                 R = 1.0
    //   c1: delta = 0.9 * 0.1 - 0.2 = -0.11;     A = -0.11 + 0.72 * 0.9;  R = A + 0.2
    //   c0: delta = 0.9 * 0.2 - 0.5 = -0.32;     A = -0.32 + 0.72 * A1;   R = A + 0.5
    // seq 1: one token, value 0.25, reward 0: A = -0.25, R = 0.
    auto inst = make("gae", R"({"gamma": 0.9, "lambda": 0.8})");
    Outputs o =
        inst->advantage({1, 0}, {0, 1}, {0, 4, 5},
                        {{"loss_mask", {0, 1, 1, 1, 1}}, {"values", {7, 0.5, 0.2, 0.1, 0.25}}});
    ASSERT_TRUE(o.ok()) << o.error;
    const double a1 = -0.11 + 0.72 * 0.9, a0 = -0.32 + 0.72 * a1;
    expect_near_all(adv(o), {0, a0, a1, 0.9, -0.25});
    expect_near_all(o.tensors["returns"], {0, a0 + 0.5, a1 + 0.2, 1.0, 0.0});
}

TEST(Gae, WithGammaAndLambdaOneAdvantageIsReturnMinusValue) {
    auto inst = make("gae", R"({"gamma": 1, "lambda": 1})");
    Outputs o = inst->advantage({2}, {0}, {0, 3},
                                {{"values", {0.5, 1.0, 1.5}}, {"token_rewards", {0.1, 0.2, 0.3}}});
    ASSERT_TRUE(o.ok()) << o.error;
    // Returns-to-go: [2.6, 2.5, 2.3].
    expect_near_all(adv(o), {2.1, 1.5, 0.8});
    expect_near_all(o.tensors["returns"], {2.6, 2.5, 2.3});
}

TEST(Gae, WhitenedAdvantagesHaveZeroMeanUnitStdAndReturnsStayRaw) {
    auto inst = make("gae", R"({"gamma": 1, "lambda": 1, "whiten": true, "eps": 0})");
    Outputs o = inst->advantage({2}, {0}, {0, 3},
                                {{"values", {0.5, 1.0, 1.5}}, {"token_rewards", {0.1, 0.2, 0.3}}});
    ASSERT_TRUE(o.ok()) << o.error;
    double m = 0, v = 0;
    for (double x : adv(o)) m += x / 3;
    for (double x : adv(o)) v += (x - m) * (x - m) / 3;
    EXPECT_NEAR(m, 0.0, 1e-12);
    EXPECT_NEAR(v, 1.0, 1e-12);
    expect_near_all(o.tensors["returns"], {2.6, 2.5, 2.3});
}

TEST(Gae, MissingValuesAreNamed) {
    auto inst = make("gae");
    Outputs o = inst->advantage({1}, {0}, {0, 2});
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("'values'"), std::string::npos) << o.error;
}

// ---- group_norm -------------------------------------------------------------------------

TEST(GroupNorm, NormalizesGivenAdvantagesWithinEachGroupUnderTheMask) {
    // g0: s0 [1, 2], s1 [3] -> tokens [1, 2, 3]: mean 2, population std sqrt(2/3).
    // g1: s2 [10, 10] -> constant -> 0.   g2: s3 [prompt 100, 4] -> one token -> 0.
    auto inst = make("group_norm", R"({"eps": 0})");
    Outputs o = inst->advantage(
        {0, 0, 0, 0}, {0, 0, 1, 2}, {0, 2, 3, 5, 7},
        {{"advantages", {1, 2, 3, 10, 10, 100, 4}}, {"loss_mask", {1, 1, 1, 1, 1, 0, 1}}});
    ASSERT_TRUE(o.ok()) << o.error;
    const double sd = std::sqrt(2.0 / 3.0);
    expect_near_all(adv(o), {-1 / sd, 0, 1 / sd, 0, 0, 0, 0});
    EXPECT_EQ(o.metrics["groups_zero_std"], 2);
}

TEST(GroupNorm, GlobalMaskedNormalizationWhenNotGrouped) {
    // Masked tokens [1, 2, 3, 10, 10, 4]: mean 5, population var 80 / 6.
    auto inst = make("group_norm", R"({"eps": 0, "grouped": false})");
    Outputs o = inst->advantage(
        {0, 0, 0, 0}, {0, 0, 1, 2}, {0, 2, 3, 5, 7},
        {{"advantages", {1, 2, 3, 10, 10, 100, 4}}, {"loss_mask", {1, 1, 1, 1, 1, 0, 1}}});
    ASSERT_TRUE(o.ok()) << o.error;
    const double sd = std::sqrt(80.0 / 6.0);
    expect_near_all(adv(o), {-4 / sd, -3 / sd, -2 / sd, 5 / sd, 5 / sd, 0, -1 / sd});
}

TEST(GroupNorm, UnbiasedStdOption) {
    auto inst = make("group_norm", R"({"eps": 0, "std_unbiased": true})");
    Outputs o = inst->advantage({0, 0}, {0, 0}, {0, 1, 2}, {{"advantages", {1, 3}}});
    ASSERT_TRUE(o.ok()) << o.error;
    const double sd = std::sqrt(2.0);
    expect_near_all(adv(o), {-1 / sd, 1 / sd});
}

TEST(GroupNorm, RewardsAsSourceBroadcastThenNormalize) {
    auto inst = make("group_norm", R"({"eps": 0, "source": "rewards"})");
    Outputs o = inst->advantage({1, 0, 0, 1}, {0, 0, 0, 0}, {0, 1, 2, 3, 4});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {1, -1, -1, 1});
}

TEST(GroupNorm, MissingAdvantagesAreNamed) {
    auto inst = make("group_norm");
    Outputs o = inst->advantage({1, 0}, {0, 0}, {0, 1, 2});
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("'advantages'"), std::string::npos) << o.error;
}

// ---- gpg ------------------------------------------------------------------------------

// Groups: 0 = [1, 0, 0, 1] (mean 0.5), 1 = [2, 4, 9] (mean 5), 2 = [5] (singleton),
// 3 = [3, 3] (all equal). B = 10 sequences, M = 3 without signal.
const std::vector<double> kGpgRewards = {1, 0, 0, 1, 2, 4, 9, 5, 3, 3};
const std::vector<int64_t> kGpgGroups = {0, 0, 0, 0, 1, 1, 1, 2, 3, 3};
const std::vector<int64_t> kGpgCu = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};

std::vector<double> gpg_want(double alpha, double f_norm) {
    std::vector<double> a = {0.5, -0.5, -0.5, 0.5, -3, -1, 4, 0, 0, 0};
    for (double &x : a) x *= alpha / f_norm;
    return a;
}

TEST(Gpg, AlphaRescalesToTheSequencesWithASignal) {
    auto inst = make("gpg");
    Outputs o = inst->advantage(kGpgRewards, kGpgGroups, kGpgCu);
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), gpg_want(10.0 / 7.0, 1.0)); // B / (B - M)
    EXPECT_NEAR(o.metrics["alpha"], 10.0 / 7.0, kTol);
    EXPECT_EQ(o.metrics["groups_singleton"], 1);
    EXPECT_EQ(o.metrics["groups_zero_std"], 1);
}

TEST(Gpg, VerlsNonZeroRewardAlphaFixedAlphaAndFNorm) {
    // 8 of the 10 rewards are non-zero: alpha = 10 / 8.
    auto verl = make("gpg", R"({"alpha": "nonzero_rewards", "f_norm": 2})");
    Outputs o = verl->advantage(kGpgRewards, kGpgGroups, kGpgCu);
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), gpg_want(10.0 / 8.0, 2.0));
    auto one = make("gpg", R"({"alpha": "one"})");
    o = one->advantage(kGpgRewards, kGpgGroups, kGpgCu);
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), gpg_want(1.0, 1.0));
    EXPECT_EQ(o.metrics["alpha"], 1.0);
}

TEST(Gpg, NoSignalAnywhereGivesZeroAndAlphaOne) {
    auto inst = make("gpg");
    Outputs o =
        inst->advantage({1, 1, 0}, {0, 0, 1}, {0, 2, 3, 5}, {{"loss_mask", {0, 1, 1, 1, 1}}});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {0, 0, 0, 0, 0});
    EXPECT_EQ(o.metrics["alpha"], 1.0);
}

TEST(Gpg, BadParametersAreNamed) {
    Outputs o = Instance::create_status(rltest::load("advantage-gpg"), R"({"f_norm": 0})");
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("'f_norm'"), std::string::npos) << o.error;
    o = Instance::create_status(rltest::load("advantage-gpg"), R"({"alpha": 2})");
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("'alpha'"), std::string::npos) << o.error;
    o = Instance::create_status(rltest::load("advantage-gpg"), R"({"alpha": "paper"})");
    EXPECT_NE(o.error.find("valid, nonzero_rewards, one"), std::string::npos) << o.error;
    o = Instance::create_status(rltest::load("advantage-gpg"), R"({"norm_by_std": true})");
    EXPECT_NE(o.error.find("unknown parameter 'norm_by_std'"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("f_norm"), std::string::npos) << o.error;
}

// ---- grpo_passk -------------------------------------------------------------------------

TEST(GrpoPassK, OnlyTheBestSampleGetsItsMarginOverTheRunnerUp) {
    // Group 0: [0.2, 1, 0.5]: best 1, runner-up 0.5, sample std 0.4041... ; group 1:
    // [2, 4, 9]: best 9, runner-up 4, sample std sqrt(13). eps 0.
    auto inst = make("grpo_passk", R"({"eps": 0})");
    Outputs o = inst->advantage({0.2, 1, 0.5, 2, 4, 9}, {0, 0, 0, 1, 1, 1}, {0, 1, 2, 3, 4, 5, 6});
    ASSERT_TRUE(o.ok()) << o.error;
    const double m0 = (0.2 + 1 + 0.5) / 3;
    const double sd0 =
        std::sqrt(((0.2 - m0) * (0.2 - m0) + (1 - m0) * (1 - m0) + (0.5 - m0) * (0.5 - m0)) / 2);
    expect_near_all(adv(o), {0, 0.5 / sd0, 0, 0, 0, 5 / std::sqrt(13.0)});
    auto raw = make("grpo_passk", R"({"norm_by_std": false})");
    o = raw->advantage({0.2, 1, 0.5, 2, 4, 9}, {0, 0, 0, 1, 1, 1}, {0, 1, 2, 3, 4, 5, 6});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {0, 0.5, 0, 0, 0, 5});
}

TEST(GrpoPassK, TiesSingletonsAndAllEqualGroupsGiveZero) {
    // Group 0: a tie at the top (margin 0); group 1: singleton; group 2: all equal.
    // Sequence 1 has a prompt token (masked).
    auto inst = make("grpo_passk", R"({"norm_by_std": false})");
    Outputs o = inst->advantage({1, 0, 1, 0.7, 0.3, 0.3}, {0, 0, 0, 1, 2, 2}, {0, 1, 3, 4, 5, 6, 7},
                                {{"loss_mask", {1, 0, 1, 1, 1, 1, 1}}});
    ASSERT_TRUE(o.ok()) << o.error;
    for (double a : adv(o)) EXPECT_EQ(a, 0.0);
    EXPECT_EQ(o.metrics["groups_singleton"], 1);
    EXPECT_EQ(o.metrics["groups_zero_std"], 1);
    // Without the tie the first best member is credited on its completion tokens only.
    o = inst->advantage({0, 1, 0.5}, {0, 0, 0}, {0, 1, 3, 4}, {{"loss_mask", {1, 0, 1, 1}}});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {0, 0, 0.5, 0});
}

TEST(GrpoPassK, BadParametersAreNamed) {
    Outputs o = Instance::create_status(rltest::load("advantage-grpo_passk"), R"({"eps": -1})");
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("'eps'"), std::string::npos) << o.error;
    o = Instance::create_status(rltest::load("advantage-grpo_passk"), R"({"norm_by_std": 1})");
    EXPECT_NE(o.error.find("'norm_by_std'"), std::string::npos) << o.error;
    o = Instance::create_status(rltest::load("advantage-grpo_passk"), R"({"k": 4})");
    EXPECT_NE(o.error.find("unknown parameter 'k'"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("std_unbiased"), std::string::npos) << o.error;
}

// ---- remax ---------------------------------------------------------------------------

TEST(Remax, ReturnToGoMinusTheSequencesExternalBaseline) {
    // Sequence 0: prompt token 0 (masked, its baseline value is ignored), completion token 1:
    // G = 1, A = 1 - 0.4. Sequence 1: tokens 2..4 with token rewards {0.1, 0, 0.2} and the
    // reward 0 at the end: G = {0.3, 0.2, 0.2}, A = G - 0.7.
    auto inst = make("remax");
    Outputs o = inst->advantage({1.0, 0.0}, {0, 0}, {0, 2, 5},
                                {{"loss_mask", {0, 1, 1, 1, 1}},
                                 {"reward_baselines", {9, 0.4, 0.7, 0.7, 0.7}},
                                 {"token_rewards", {0, 0, 0.1, 0, 0.2}}});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {0, 0.6, -0.4, -0.5, -0.5});
    expect_near_all(o.tensors["returns"], {0, 1, 0.3, 0.2, 0.2});
    EXPECT_NEAR(o.metrics["baseline_mean"], 0.55, kTol);
    // Without token rewards every completion token carries r - b.
    o = inst->advantage({1.0, 0.0}, {0, 1}, {0, 2, 5},
                        {{"reward_baselines", {0.25, 0.25, 0.5, 0.5, 0.5}}});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {0.75, 0.75, -0.5, -0.5, -0.5});
}

TEST(Remax, BaselinesMustBeGivenAndConstantWithinASequence) {
    auto inst = make("remax");
    Outputs o = inst->advantage({1.0, 0.0}, {0, 0}, {0, 2, 5}, {});
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("missing per-token input 'reward_baselines'"), std::string::npos)
        << o.error;
    o = inst->advantage({1.0, 0.0}, {0, 0}, {0, 2, 5},
                        {{"reward_baselines", {0.5, 0.5, 0.2, 0.3, 0.2}}});
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("sequence 1"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("token 3"), std::string::npos) << o.error;
    o = Instance::create_status(rltest::load("advantage-remax"), R"({"whiten": true})");
    EXPECT_NE(o.error.find("unknown parameter 'whiten'"), std::string::npos) << o.error;
}

// ---- whitening std ------------------------------------------------------------------------

TEST(ReinforcePP, WhiteningWithTheUnbiasedStd) {
    // Returns {1, 0}: mean 0.5, population std 0.5, sample std sqrt(0.5).
    auto pop = make("reinforce_pp", R"({"eps": 0})");
    Outputs o = pop->advantage({1.0, 0.0}, {0, 1}, {0, 1, 2}, {});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {1, -1});
    auto unb = make("reinforce_pp", R"({"eps": 0, "std_unbiased": true})");
    o = unb->advantage({1.0, 0.0}, {0, 1}, {0, 1, 2}, {});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {std::sqrt(0.5), -std::sqrt(0.5)});
}

TEST(Gae, WhiteningWithTheUnbiasedStdAndRefusedWithoutWhitening) {
    auto inst = make("gae", R"({"gamma": 1, "lambda": 1, "whiten": true, "eps": 0,
                                "std_unbiased": true})");
    Outputs o = inst->advantage({1.0, 0.0}, {0, 1}, {0, 1, 2}, {{"values", {0, 0}}});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {std::sqrt(0.5), -std::sqrt(0.5)});
    o = Instance::create_status(rltest::load("advantage-gae"), R"({"std_unbiased": true})");
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("'std_unbiased' only applies with 'whiten': true"), std::string::npos)
        << o.error;
}

// ---- areal ---------------------------------------------------------------------------

TEST(Areal, RewardBiasScaleAndClip) {
    // (r + 1) * 2 = {4, -4}, clipped to [-3, 3]; one completion token each, no values.
    auto inst = make("areal", R"({"reward_bias": 1, "reward_scaling": 2, "reward_clip": 3})");
    Outputs o = inst->advantage({1, -3}, {0, 1}, {0, 1, 2}, {});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {3, -3});
    expect_near_all(o.tensors["returns"], {3, -3});
    EXPECT_NEAR(o.metrics["shaped_reward_mean"], 0, kTol);
}

TEST(Areal, KlPenalisedTokenRewardsWithAFixedAndAnAdaptiveCoefficient) {
    // k1 = old - ref = {0.5, 0, -0.5}; u = {-0.05, 0, 0.05 + 1}; return to go.
    const Tensors kl_in = {{"old_logprobs", {-1, -1, -1}}, {"ref_logprobs", {-1.5, -1, -0.5}}};
    auto fixed = make("areal", R"({"kl_ctl": 0.1})");
    Outputs o = fixed->advantage({1}, {0}, {0, 3}, kl_in);
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {1.0, 1.05, 1.05});
    EXPECT_NEAR(o.metrics["kl"], 0.0, kTol);
    // k2 = {0.125, 0, 0.125}: batch KL 1/12 > target 0.05, error clipped to 0.2: the
    // coefficient grows by 1 + 0.2 * 1 sequence / horizon 10 after each call.
    auto adaptive = make(
        "areal", R"({"kl_coef": 0.1, "kl_estimator": "k2", "kl_target": 0.05, "kl_horizon": 10})");
    o = adaptive->advantage({1}, {0}, {0, 3}, kl_in);
    ASSERT_TRUE(o.ok()) << o.error;
    EXPECT_NEAR(o.metrics["kl_coef"], 0.1, kTol);
    EXPECT_NEAR(o.metrics["kl"], 0.25 / 3, kTol);
    expect_near_all(adv(o), {1 - 0.1 * 0.25, 1 - 0.1 * 0.125, 1 - 0.1 * 0.125});
    o = adaptive->advantage({1}, {0}, {0, 3}, kl_in);
    ASSERT_TRUE(o.ok()) << o.error;
    EXPECT_NEAR(o.metrics["kl_coef"], 0.1 * 1.02, kTol);
    // Below the target the coefficient shrinks: k2 of {0.1, 0, 0} is 0.005 / 3 per token.
    o = adaptive->advantage({1}, {0}, {0, 3},
                            {{"old_logprobs", {-1, -1, -1}}, {"ref_logprobs", {-1.1, -1, -1}}});
    ASSERT_TRUE(o.ok()) << o.error;
    o = adaptive->advantage({1}, {0}, {0, 3}, kl_in);
    EXPECT_NEAR(o.metrics["kl_coef"], 0.1 * 1.02 * 1.02 * 0.98, kTol);
}

TEST(Areal, TruncatedSequencesBootstrapFromTheirLastValueOrLoseTheirReward) {
    // Completion tokens 0, 1; token 2 (loss_mask 0) carries the state after the last action.
    Tensors in = {{"loss_mask", {1, 1, 0}}, {"values", {0.5, 0.2, 0.8}}, {"truncated", {1, 1, 1}}};
    auto inst = make("areal");
    Outputs o = inst->advantage({1}, {0}, {0, 3}, in);
    ASSERT_TRUE(o.ok()) << o.error;
    // delta_1 = 1 + 0.8 - 0.2 = 1.6; delta_0 = 0.2 - 0.5; A_0 = -0.3 + 1.6.
    expect_near_all(adv(o), {1.3, 1.6, 0});
    expect_near_all(o.tensors["returns"], {1.8, 1.8, 0});
    auto no_eos = make("areal", R"({"mask_no_eos_with_zero": true})");
    o = no_eos->advantage({1}, {0}, {0, 3}, in);
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {0.3, 0.6, 0});
    EXPECT_EQ(o.metrics["no_eos_masked"], 1);
    in["truncated"] = {0, 0, 0}; // ended with EOS: no bootstrap, reward kept
    o = no_eos->advantage({1}, {0}, {0, 3}, in);
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {0.5, 0.8, 0});
    // A truncated sequence must end with the bootstrap token; 'truncated' is per sequence.
    o = inst->advantage({1}, {0}, {0, 2}, {{"values", {0.5, 0.2}}, {"truncated", {1, 1}}});
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("bootstrap"), std::string::npos) << o.error;
    o = inst->advantage({1}, {0}, {0, 2}, {{"truncated", {1, 0}}});
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("one 0/1 value per sequence"), std::string::npos) << o.error;
    o = no_eos->advantage({1}, {0}, {0, 2}, {});
    EXPECT_NE(o.error.find("missing per-token input 'truncated'"), std::string::npos) << o.error;
}

TEST(Areal, NormalizationLevelsLeaveOneOutAndGroupsOfOne) {
    // One completion token per sequence, so the advantages before normalization are the
    // rewards {1, 2, 3, 6}.
    const std::vector<double> r = {1, 2, 3, 6};
    const std::vector<int64_t> cu = {0, 1, 2, 3, 4};
    auto norm = [&](const std::string &cfg, const std::vector<int64_t> &groups) {
        auto inst = make("areal", R"({"adv_norm": )" + cfg + "}");
        Outputs o = inst->advantage(r, groups, cu, {});
        EXPECT_TRUE(o.ok()) << cfg << ": " << o.error;
        return adv(o);
    };
    const std::vector<int64_t> two = {0, 0, 1, 1};
    const double sb = std::sqrt(14.0 / 3); // batch: mean 3, unbiased std
    expect_near_all(norm(R"({"eps": 0})", two), {-2 / sb, -1 / sb, 0, 3 / sb});
    expect_near_all(
        norm(R"({"mean_level": "group", "std_level": "group", "std_unbiased": false, "eps": 0})",
             two),
        {-1, 1, -1, 1});
    expect_near_all(norm(R"({"std_level": null})", two), {-2, -1, 0, 3});
    const double s0 = std::sqrt(50.0 / 3); // std around 0
    expect_near_all(norm(R"({"mean_level": "none", "eps": 0})", two),
                    {1 / s0, 2 / s0, 3 / s0, 6 / s0});
    expect_near_all(norm(R"({"mean_leave1out": true, "std_level": "none"})", two),
                    {-8.0 / 3, -4.0 / 3, 0, 4});
    // Groups {1, 2}, {3}, {6}: the singletons keep mean 0 and std 1; group 0's
    // leave-one-out means {2, 1}, std around them sqrt(2 / 1).
    expect_near_all(norm(R"({"mean_level": "group", "mean_leave1out": true,
                             "std_level": "group", "eps": 0})",
                         {0, 0, 1, 2}),
                    {-1 / std::sqrt(2.0), 1 / std::sqrt(2.0), 3, 6});
}

TEST(Areal, RewardNormNormalizesOneRewardPerSequenceAfterClipAndBeforeNoEosZeroing) {
    // Scaled by 2 and clipped to 4: {2, 4 | 1, 4, 0}. Group {2, 4}: mean 3, unbiased
    // std sqrt 2. Group {1, 4, 0}: mean 5/3, unbiased std sqrt(39) / 3. One value per
    // sequence whatever its length (1, 3 | 2, 1, 0 completion tokens); the last sequence
    // has none and still counts. gamma = lambda = 1, no values: A_t = normalized reward.
    auto inst = make("areal", R"({"reward_scaling": 2, "reward_clip": 4,
        "reward_norm": {"mean_level": "group", "std_level": "group", "eps": 0}})");
    Outputs o = inst->advantage({1, 3, 0.5, 2.5, 0}, {0, 0, 1, 1, 1}, {0, 1, 4, 6, 7, 9},
                                {{"loss_mask", {1, 1, 1, 1, 1, 1, 1, 0, 0}}});
    ASSERT_TRUE(o.ok()) << o.error;
    const double a = 1 / std::sqrt(2.0), b = 1 / std::sqrt(39.0);
    expect_near_all(adv(o), {-a, a, a, a, -2 * b, -2 * b, 7 * b, 0, 0});
    EXPECT_NEAR(o.metrics["shaped_reward_mean"], (-a + a - 2 * b + 7 * b - 5 * b) / 5, kTol);
    // Batch mean 3 of {1, 2, 6} first, then the truncated sequence's reward becomes 0.
    auto no_eos = make("areal", R"({"mask_no_eos_with_zero": true,
        "reward_norm": {"mean_level": "batch", "std_level": null}})");
    o = no_eos->advantage({1, 2, 6}, {0, 0, 0}, {0, 1, 2, 3}, {{"truncated", {0, 0, 1}}});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {-2, -1, 0});
    // Population std, eps added to it.
    auto pop = make("areal", R"({"reward_norm": {"std_unbiased": false, "eps": 0.5}})");
    o = pop->advantage({1, 3}, {0, 1}, {0, 1, 2}, {});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {-1 / 1.5, 1 / 1.5});
    // Groups of one: leave-one-out mean 0 and unbiased std 1 (AReaL's group_size 1 rule).
    auto single = make("areal", R"({"reward_norm": {"mean_level": "group",
        "mean_leave1out": true, "std_level": "group", "eps": 0}})");
    o = single->advantage({2, 3}, {0, 1}, {0, 1, 2}, {});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {2, 3});
    // Leave-one-out over the batch {1, 2, 6}: means {4, 3.5, 1.5}, no std.
    auto loo = make("areal", R"({"reward_norm": {"mean_leave1out": true, "std_level": null}})");
    o = loo->advantage({1, 2, 6}, {0, 0, 0}, {0, 1, 2, 3}, {});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {-3, -1.5, 4.5});
}

TEST(Areal, BadRewardNormIsRefusedNamingIt) {
    auto refused = [](const std::string &params, const std::vector<std::string> &want) {
        Outputs o = Instance::create_status(rltest::load("advantage-areal"), params);
        EXPECT_EQ(o.status, RL_ERR_INVALID_ARG) << params;
        for (const auto &w : want)
            EXPECT_NE(o.error.find(w), std::string::npos) << params << ": " << o.error;
    };
    refused(R"({"reward_norm": "group"})", {"'reward_norm' must be an object"});
    refused(R"({"reward_norm": {"mean_level": "group", "group_size": 4}})",
            {"'reward_norm'", "unknown parameter 'group_size'"});
    refused(R"({"reward_norm": {"mean_level": null, "mean_leave1out": true}})",
            {"'reward_norm'", "'mean_leave1out' needs a mean_level"});
    refused(R"({"reward_norm": {"std_level": "token"}})", {"'reward_norm'", "'std_level'"});
    refused(R"({"reward_norm": {"eps": -1}})", {"'reward_norm'", "'eps'"});
}

TEST(Areal, BadParametersAndMissingInputsAreNamed) {
    auto refused = [](const std::string &params, const std::string &want) {
        Outputs o = Instance::create_status(rltest::load("advantage-areal"), params);
        EXPECT_EQ(o.status, RL_ERR_INVALID_ARG) << params;
        EXPECT_NE(o.error.find(want), std::string::npos) << params << ": " << o.error;
    };
    refused(R"({"adv_norm": "batch"})", "'adv_norm' must be an object");
    refused(R"({"adv_norm": {"level": "batch"}})", "unknown parameter 'level'");
    refused(R"({"adv_norm": {"mean_level": "none", "mean_leave1out": true}})",
            "'mean_leave1out' needs a mean_level");
    refused(R"({"adv_norm": {"std_level": "token"}})", "'std_level'");
    refused(R"({"kl_target": 0})", "'kl_target' must be > 0");
    refused(R"({"kl_horizon": 5})", "'kl_horizon' only applies with 'kl_target'");
    refused(R"({"kl_estimator": "k4"})", "'kl_estimator'");
    refused(R"({"reward_clip": -1})", "'reward_clip'");
    refused(R"({"gamma": 1.5})", "'gamma'");
    refused(R"({"discount": 0.9, "gamma": 0.9})", "both given");
    auto inst = make("areal", R"({"kl_coef": 0.1})");
    Outputs o = inst->advantage({1}, {0}, {0, 2}, {});
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("missing per-token input 'old_logprobs'"), std::string::npos) << o.error;
}

// ---- grpo length_penalty (prime-rl) -------------------------------------------------------

TEST(Grpo, PrimeRlLengthPenaltyShapesRewardsBeforeTheGroupMean) {
    // One group of three: completion / other tokens (2, 1), (4, 0), (1, 1); rewards
    // {1, 1, 0}, pass rate p = 2/3, maxima 4 and 1, one turn each (the turn term is the same
    // for all and cancels). Default weights 0.25, 0.1, 0.1.
    auto inst = make("grpo", R"({"norm_by_std": false, "length_penalty": {"type": "linear"}})");
    Outputs o = inst->advantage({1, 1, 0}, {0, 0, 0}, {0, 3, 7, 9},
                                {{"loss_mask", {0, 1, 1, 1, 1, 1, 1, 0, 1}}});
    ASSERT_TRUE(o.ok()) << o.error;
    const double p = 2.0 / 3;
    const std::vector<double> shaped = {1 - p * (0.25 * 0.5 + 0.1 + 0.1), 1 - p * (0.25 + 0.1),
                                        -p * (0.25 * 0.25 + 0.1 + 0.1)};
    const double m = (shaped[0] + shaped[1] + shaped[2]) / 3;
    const double a0 = shaped[0] - m, a1 = shaped[1] - m, a2 = shaped[2] - m;
    expect_near_all(adv(o), {0, a0, a0, a1, a1, a1, a1, 0, a2});
    // Equal rewards still prefer the shorter answer: p = 1, penalties {0.5 / 3, 0.5}.
    auto out_only = make("grpo", R"({"norm_by_std": false, "length_penalty":
        {"num_output_tokens_weight": 0.5, "num_input_tokens_weight": 0, "num_turns_weight": 0}})");
    o = out_only->advantage({1, 1}, {0, 0}, {0, 1, 4}, {});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {1.0 / 6, -1.0 / 6, -1.0 / 6, -1.0 / 6});
    // Turns from the per-sequence input num_turns: {1, 2}, weight 0.3: penalties {0.15, 0.3}.
    auto turns = make("grpo", R"({"norm_by_std": false, "length_penalty":
        {"num_output_tokens_weight": 0, "num_input_tokens_weight": 0, "num_turns_weight": 0.3}})");
    o = turns->advantage({1, 1}, {0, 0}, {0, 1, 4}, {{"num_turns", {1, 2, 2, 2}}});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {0.075, -0.075, -0.075, -0.075});
    o = turns->advantage({1, 1}, {0, 0}, {0, 1, 4}, {{"num_turns", {1, 2, 3, 2}}});
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("'num_turns' must hold one value"), std::string::npos) << o.error;
    // A group of one gets 0.
    o = inst->advantage({1}, {0}, {0, 2}, {});
    ASSERT_TRUE(o.ok()) << o.error;
    expect_near_all(adv(o), {0, 0});
}

TEST(Grpo, LengthPenaltyBadParametersAreNamed) {
    auto refused = [](const std::string &params, const std::string &want) {
        Outputs o = Instance::create_status(rltest::load("advantage-grpo"), params);
        EXPECT_EQ(o.status, RL_ERR_INVALID_ARG) << params;
        EXPECT_NE(o.error.find(want), std::string::npos) << params << ": " << o.error;
    };
    refused(R"({"length_penalty": {}})", "needs 'norm_by_std': false");
    refused(R"({"norm_by_std": false, "length_penalty": 0.25})",
            "'length_penalty' must be an object");
    refused(R"({"norm_by_std": false, "length_penalty": {"output_weight": 1}})",
            "unknown parameter 'output_weight'");
    refused(R"({"norm_by_std": false, "length_penalty": {"type": "exponential"}})", "'type'");
    refused(R"({"norm_by_std": false, "length_penalty": {"num_turns_weight": -1}})",
            "'num_turns_weight'");
    auto plain = make("grpo");
    Outputs o = plain->advantage({1, 0}, {0, 0}, {0, 1, 2}, {{"num_turns", {1, 1}}});
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("'num_turns'"), std::string::npos) << o.error;
}

} // namespace
