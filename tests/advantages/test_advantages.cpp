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

} // namespace
