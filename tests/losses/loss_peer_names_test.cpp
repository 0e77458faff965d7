// Other frameworks' parameter names (docs/losses.md, "Parameter names of other
// frameworks"): accepted where they mean the same thing, giving exactly the
// loss of our own names; refused with a migration message where they do not.
#include "loss_test_util.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace rl::losses::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Ratios in every band of the clip tests (below 1 - eps, inside, above
// 1 + eps, above the dual-clip constant), with both advantage signs;
// decoupled_ppo's proximal policy sits between the two.
T::LossInputs inputs(bool prox) {
    const std::vector<double> lp = {-1.0, -1.2, -0.7, -2.0, -1.5, -0.9, -1.1, -0.6};
    const std::vector<double> r = {5.0, 1.25, 0.75, 1.05, 0.5, 3.5, 1.22, 0.72};
    const std::vector<double> A = {-1.0, 1.0, -1.0, 0.5, 1.0, -2.0, 1.0, -0.5};
    std::vector<double> old(lp.size()), ref(lp.size()), ent(lp.size()), px(lp.size());
    for (size_t i = 0; i < lp.size(); ++i) {
        old[i] = lp[i] - std::log(r[i]);
        px[i] = lp[i] - 0.9 * std::log(r[i]);
        ref[i] = lp[i] + 0.1 * double(i % 3) - 0.1;
        ent[i] = 0.5 + 0.1 * double(i);
    }
    T::LossInputs in;
    in.f64("logprobs", lp)
        .f64("old_logprobs", old)
        .f64("advantages", A)
        .f64("ref_logprobs", ref)
        .f64("entropy", ent)
        .cu_seqlens({0, 3, 8});
    if (prox) in.f64("prox_logprobs", px);
    return in;
}

T::LossRun run(const std::string &loss, const std::string &params) {
    T::LossRun out;
    with_loss(loss, [&](auto tag) {
        T::Host host;
        T::Instance<typename decltype(tag)::type> inst(host, params);
        if (!inst.ok()) {
            out.status = inst.status();
            out.error = inst.error();
            return;
        }
        out = T::run_loss(inst, inputs(loss == "decoupled_ppo"));
    });
    return out;
}

// The peer spelling gives the same loss and gradients as ours, and differs
// from the defaults (so a name that were silently dropped would be caught).
void expect_same_as(const std::string &loss, const std::string &peer, const std::string &ours) {
    SCOPED_TRACE(loss + " " + peer + " vs " + ours);
    const auto a = run(loss, peer), b = run(loss, ours), d = run(loss, "{}");
    ASSERT_EQ(a.status, RL_OK) << a.error;
    ASSERT_EQ(b.status, RL_OK) << b.error;
    ASSERT_EQ(d.status, RL_OK) << d.error;
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grads, b.grads);
    EXPECT_NE(a.loss, d.loss) << "the parameters do not change the loss: a weak test";
}

void expect_refused(const std::string &loss, const std::string &params,
                    const std::vector<std::string> &words) {
    SCOPED_TRACE(loss + " " + params);
    const auto r = run(loss, params);
    EXPECT_EQ(r.status, RL_ERR_INVALID_ARG);
    for (const auto &w : words) EXPECT_THAT(r.error, HasSubstr(w));
}

TEST(PeerNames, VerlClipRatiosAreThePpoClipBounds) {
    expect_same_as("policy_loss", R"({"clip_ratio_low": 0.3, "clip_ratio_high": 0.28,
                                      "clip_ratio_c": 3})",
                   R"({"eps_clip": 0.3, "eps_clip_high": 0.28, "eps_clip_c": 3})");
    // verl's symmetric clip_ratio sets both bounds.
    expect_same_as("policy_loss", R"({"clip_ratio": 0.1})",
                   R"({"eps_clip": 0.1, "eps_clip_high": 0.1})");
    expect_same_as("gspo", R"({"clip_ratio_low": 0.01, "clip_ratio_high": 0.02})",
                   R"({"eps_clip": 0.01, "eps_clip_high": 0.02})");
    expect_same_as("gmpo", R"({"clip_ratio_low": 0.1, "clip_ratio_high": 0.2})",
                   R"({"eps_clip": 0.1, "eps_clip_high": 0.2})");
    expect_same_as("clip_cov", R"({"clip_ratio_low": 0.1, "clip_ratio_high": 0.3})",
                   R"({"eps_clip": 0.1, "eps_clip_high": 0.3})");
}

TEST(PeerNames, TrlEpsilonSetsBothBoundsUnlessEpsilonHighIsGiven) {
    expect_same_as("policy_loss", R"({"epsilon": 0.1})",
                   R"({"eps_clip": 0.1, "eps_clip_high": 0.1})");
    expect_same_as("policy_loss", R"({"epsilon": 0.1, "epsilon_high": 0.28})",
                   R"({"eps_clip": 0.1, "eps_clip_high": 0.28})");
}

TEST(PeerNames, OpenRlhfAndArealNamesMapToTheSameBounds) {
    expect_same_as("policy_loss", R"({"clip_eps_low": 0.1, "clip_eps_high": 0.3, "dual_clip": 2})",
                   R"({"eps_clip": 0.1, "eps_clip_high": 0.3, "eps_clip_c": 2})");
    expect_same_as("policy_loss", R"({"eps_clip_higher": 0.3, "c_clip": 2})",
                   R"({"eps_clip_high": 0.3, "eps_clip_c": 2})");
    // decoupled_ppo keeps AReaL's names; xorl's and verl's reach them.
    expect_same_as("decoupled_ppo", R"({"eps_clip_high": 0.3, "eps_clip_c": 2})",
                   R"({"eps_clip_higher": 0.3, "c_clip": 2})");
    expect_same_as("decoupled_ppo", R"({"clip_ratio_low": 0.1, "clip_ratio_c": 2})",
                   R"({"eps_clip": 0.1, "c_clip": 2})");
}

TEST(PeerNames, KlAndEntropyCoefficientsOfVerlAndTrl) {
    expect_same_as("policy_loss", R"({"kl_loss_coef": 0.5, "kl_loss_type": "k1"})",
                   R"({"kl_coef": 0.5, "kl_type": "k1"})");
    expect_same_as("importance_sampling", R"({"beta": 0.25})", R"({"kl_coef": 0.25})");
    expect_same_as("cispo", R"({"entropy_coeff": 0.1})", R"({"entropy_coef": 0.1})");
}

TEST(PeerNames, BothSpellingsOfOneParameterAreRefusedNamingBoth) {
    expect_refused("policy_loss", R"({"clip_ratio_low": 0.1, "eps_clip": 0.2})",
                   {"'clip_ratio_low'", "verl", "'eps_clip'", "keep one"});
    expect_refused("policy_loss", R"({"clip_ratio_low": 0.1, "clip_eps_low": 0.2})",
                   {"'clip_eps_low'", "'eps_clip'", "given as 'clip_ratio_low'"});
    expect_refused("policy_loss", R"({"beta": 0.1, "kl_coef": 0.2})",
                   {"'beta'", "'kl_coef'", "keep one"});
}

TEST(PeerNames, BadValuesNameTheSpellingTheUserWrote) {
    expect_refused("policy_loss", R"({"clip_ratio_low": 1.5})",
                   {"'eps_clip' (given as 'clip_ratio_low' (verl))"});
    expect_refused("policy_loss", R"({"epsilon": "0.2"})", {"given as 'epsilon' (TRL)", "number"});
}

TEST(PeerNames, UnknownParameterListsOurNamesNotThePeers) {
    const auto r = run("policy_loss", R"({"eps_clp": 0.1})");
    ASSERT_EQ(r.status, RL_ERR_INVALID_ARG);
    EXPECT_THAT(r.error, HasSubstr("eps_clip_high"));
    EXPECT_THAT(r.error, Not(HasSubstr("clip_ratio_low")));
}

TEST(PeerNames, ImportanceSamplingRefusesClipParametersNamingPolicyLoss) {
    // The xorl server example passes eps_clip to importance_sampling, which
    // has no clip (in xorl either): the message says what to use.
    for (const char *p :
         {R"({"eps_clip": 0.2})", R"({"clip_ratio_high": 0.28})", R"({"epsilon": 0.2})"})
        expect_refused("importance_sampling", p,
                       {"not supported here", "unclipped", "'policy_loss'", "drop the parameter"});
}

TEST(PeerNames, CispoRefusesEpsilonBoundsNamingItsAbsoluteBounds) {
    expect_refused("cispo", R"({"clip_ratio_high": 0.28})",
                   {"'clip_ratio_high'", "'clip_high' = 1 + clip_ratio_high"});
    expect_refused("cispo", R"({"epsilon": 0.2})", {"'epsilon'", "'clip_low' = 1 - epsilon"});
}

} // namespace
} // namespace rl::losses::test
