// The contract around the math: signatures, refusals of bad parameters and bad
// inputs with messages naming what is wrong, numeric failures, and the SDK test
// host itself.
#include "loss_test_util.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace rl::losses::test {
namespace {

using ::testing::HasSubstr;

template <class L>
T::LossRun run(const std::string &params, const T::LossInputs &in) {
    return run_once<L>(params, in);
}

T::LossInputs ppo_inputs() {
    T::LossInputs in;
    in.f64("logprobs", {-1.0, -2.0, -0.5})
        .f64("old_logprobs", {-1.1, -2.0, -0.4})
        .f64("advantages", {1.0, -1.0, 0.5})
        .cu_seqlens({0, 2, 3});
    return in;
}

// ---- parameters ---------------------------------------------------------------------

void expect_refused(const std::string &loss, const std::string &params,
                    const std::vector<std::string> &words) {
    SCOPED_TRACE(loss + " " + params);
    with_loss(loss, [&](auto tag) {
        T::Host host;
        T::Instance<typename decltype(tag)::type> inst(host, params);
        EXPECT_FALSE(inst.ok());
        EXPECT_EQ(inst.status(), RL_ERR_INVALID_ARG);
        for (const auto &w : words) EXPECT_THAT(inst.error(), HasSubstr(w));
    });
}

TEST(Parameters, UnknownNamesAreRefusedListingTheValidOnes) {
    expect_refused("policy_loss", R"({"eps_clp": 0.1})",
                   {"unknown parameter 'eps_clp'", "eps_clip", "eps_clip_high", "eps_clip_c",
                    "icepop_beta", "use_tis", "tis_clip_low", "tis_clip_high", "compute_kl_stats",
                    "loss_agg_mode", "kl_coef", "kl_type", "entropy_coef"});
    expect_refused("grpo", R"({"kl_beta": 1})",
                   {"unknown parameter 'kl_beta'", "adv_tau", "teacher_tau", "kl_tau", "ratio_type",
                    "token_mask_low", "geo_mask_high", "sequence_clip_high"});
    // importance_sampling has no clipping: a PPO parameter is a mistake, not
    // ignored; the message names the loss that has one.
    expect_refused("importance_sampling", R"({"eps_clip": 0.2})",
                   {"parameter 'eps_clip' is not supported here", "'policy_loss'"});
    for (const auto &name : loss_names())
        expect_refused(name, R"({"no_such_param": 1})", {"unknown parameter 'no_such_param'"});
}

TEST(Parameters, OutOfRangeValuesAreRefused) {
    expect_refused("policy_loss", R"({"eps_clip": 1.5})", {"'eps_clip'", "[0, 1]"});
    expect_refused("policy_loss", R"({"eps_clip": 1})", {"'eps_clip'", "< 1"});
    expect_refused("policy_loss", R"({"eps_clip_c": 1})", {"'eps_clip_c'", "> 1"});
    expect_refused("policy_loss", R"({"eps_clip_c": 0.5})", {"'eps_clip_c'"});
    expect_refused("policy_loss", R"({"icepop_beta": 0.5})", {"'icepop_beta'"});
    expect_refused("policy_loss", R"({"tis_clip_low": 3, "tis_clip_high": 2})",
                   {"'tis_clip_high'", "'tis_clip_low'"});
    expect_refused("policy_loss", R"({"kl_coef": -1})", {"'kl_coef'"});
    expect_refused("policy_loss", R"({"kl_type": "k4"})", {"'kl_type'", "k1, k2, k3, low_var_kl"});
    expect_refused("policy_loss", R"({"use_tis": 1})", {"'use_tis'", "true or false"});
    expect_refused("policy_loss", R"({"eps_clip": "0.2"})", {"'eps_clip'", "number"});
    expect_refused("grpo", R"({"ratio_type": "seq"})", {"'ratio_type'", "token, sequence"});
    expect_refused("grpo", R"({"token_mask_low": 2, "token_mask_high": 1})",
                   {"'token_mask_high'", "'token_mask_low'"});
    expect_refused("grpo", R"({"geo_mask_low": 20})", {"'geo_mask_high'", "'geo_mask_low'"});
    expect_refused("grpo", R"({"sequence_clip_high": 0})", {"'sequence_clip_high'"});
    expect_refused("decoupled_ppo", R"({"c_clip": 1})", {"'c_clip'"});
    expect_refused("decoupled_ppo", R"({"behav_imp_weight_cap": 0})", {"'behav_imp_weight_cap'"});
    expect_refused("cispo", R"({"clip_low": 2, "clip_high": 1})", {"'clip_high'", "'clip_low'"});
    expect_refused("value_loss", R"({"vf_clip": -0.1})", {"'vf_clip'"});
    expect_refused("causallm_loss", R"({"ignore_index": 1.5})", {"'ignore_index'", "integer"});
    expect_refused("causallm_loss", "[1, 2]", {"JSON object"});
    expect_refused("causallm_loss", "{not json", {"not valid JSON"});
}

TEST(Parameters, NewLossesAndOptionsRefuseBadValuesNamingTheParameter) {
    expect_refused("sapo", R"({"tau_pos": 0})", {"'tau_pos'", "> 0"});
    expect_refused("sapo", R"({"tau_neg": -1})", {"'tau_neg'"});
    expect_refused("sapo", R"({"tau": 1})", {"unknown parameter 'tau'", "tau_pos", "tau_neg"});
    expect_refused("sapo", R"({"importance_sampling_level": "group"})",
                   {"'importance_sampling_level'", "'group'", "token", "sequence"});
    expect_refused("sapo", R"({"importance_sampling_level": 1})", {"'importance_sampling_level'"});
    expect_refused("gmpo", R"({"eps_clip": -0.1})", {"'eps_clip'"});
    expect_refused("gmpo", R"({"eps_clip_high": "0.4"})", {"'eps_clip_high'", "number"});
    expect_refused("clip_cov", R"({"clip_cov_ratio": 0})", {"'clip_cov_ratio'", "> 0"});
    expect_refused("clip_cov", R"({"clip_cov_ratio": 2})", {"'clip_cov_ratio'", "[0, 1]"});
    expect_refused("clip_cov", R"({"clip_cov_lb": 6})", {"'clip_cov_ub'", "'clip_cov_lb'"});
    expect_refused("clip_cov", R"({"selection": "best"})", {"'selection'", "random, top"});
    expect_refused("clip_cov", R"({"selection": "top", "seed": 1})",
                   {"'seed'", "only applies to selection 'random'"});
    expect_refused("clip_cov", R"({"seed": -1})", {"'seed'"});
    expect_refused("clip_cov", R"({"eps_clip": 1})", {"'eps_clip'", "< 1"});
    expect_refused("kl_cov", R"({"kl_cov_ratio": 0})", {"'kl_cov_ratio'", "> 0"});
    expect_refused("kl_cov", R"({"ppo_kl_coef": -1})", {"'ppo_kl_coef'"});
    expect_refused("kl_cov", R"({"clip_cov_ratio": 0.1})",
                   {"unknown parameter 'clip_cov_ratio'", "kl_cov_ratio", "ppo_kl_coef"});
    expect_refused("value_loss", R"({"huber_delta": 0})", {"'huber_delta'", "> 0"});
    expect_refused("value_loss", R"({"huber_delta": -1})", {"'huber_delta'"});
    expect_refused("policy_loss", R"({"kl_type": "k2+"})",
                   {"'kl_type'", "k1, k2, k3, low_var_kl, abs, k1+, k3+, low_var_kl+"});
    expect_refused("gmpo", R"({"kl_type": "mse"})", {"'kl_type'"});
    expect_refused("decoupled_ppo", R"({"rejection_sampling": 2})",
                   {"'rejection_sampling' must be an object"});
    expect_refused("decoupled_ppo", R"({"rejection_sampling": {"upper": 1}})",
                   {"'rejection_sampling'", "'upper' must be > 1 for metric 'ratio'"});
    expect_refused("decoupled_ppo", R"({"rejection_sampling": {"upper": 3, "lower": 0}})",
                   {"'lower' must be > 0"});
    expect_refused("decoupled_ppo", R"({"rejection_sampling": {"upper": 3, "lower": 4}})",
                   {"'lower' (4) must be <= 'upper' (3)"});
    expect_refused("decoupled_ppo", R"({"rejection_sampling": {"metric": "kl_k2", "upper": 0}})",
                   {"'upper' must be > 0 for metric 'kl_k2'"});
    expect_refused("decoupled_ppo",
                   R"({"rejection_sampling": {"metric": "kl_k3", "action": "clamp"}})",
                   {"action 'clamp' needs metric 'ratio'"});
    expect_refused("decoupled_ppo", R"({"rejection_sampling": {"agg": "max"}})",
                   {"'agg' only applies to level 'sequence'"});
    expect_refused("decoupled_ppo", R"({"rejection_sampling": {"level": "seq"}})",
                   {"'level'", "token, sequence"});
    expect_refused("decoupled_ppo", R"({"rejection_sampling": {"threshold": 2}})",
                   {"'rejection_sampling'", "unknown parameter 'threshold'", "upper"});
    expect_refused("decoupled_ppo",
                   R"({"rejection_sampling": {"upper": 2}, "behav_imp_weight_cap": 2})",
                   {"either 'rejection_sampling' or"});
    expect_refused("decoupled_ppo", R"({"behave_imp_weight_mode": "token_truncate"})",
                   {"'token_truncate' needs 'behav_imp_weight_cap'"});
    expect_refused("decoupled_ppo",
                   R"({"behav_imp_weight_mode": "disabled", "behav_imp_weight_cap": 2})",
                   {"no effect", "'disabled'"});
    expect_refused("decoupled_ppo", R"({"behav_imp_weight_mode": "seq_mask"})",
                   {"'behav_imp_weight_mode'", "sequence_truncate"});
    expect_refused("decoupled_ppo", R"({"importance_sampling_level": "group"})",
                   {"'importance_sampling_level'", "token, sequence"});
    expect_refused("dppo", R"({"dppo_mask_low": -0.1})", {"'dppo_mask_low'"});
    expect_refused("dppo", R"({"dppo_mask_high": "0.2"})", {"'dppo_mask_high'", "number"});
    expect_refused("dppo", R"({"kl_tau": -1})", {"'kl_tau'"});
    expect_refused("dppo", R"({"ipo_threshold": 0.1})",
                   {"unknown parameter 'ipo_threshold'", "dppo_mask_low", "adv_tau"});
    expect_refused("ipo", R"({"ipo_threshold": -0.1})", {"'ipo_threshold'"});
    expect_refused("ipo", R"({"adv_tau": -1})", {"'adv_tau'"});
    expect_refused("ipo", R"({"ref_kl_tau": -1})", {"'ref_kl_tau'"});
    expect_refused("ipo", R"({"dppo_mask_high": 0.2})",
                   {"unknown parameter 'dppo_mask_high'", "ipo_threshold"});
}

TEST(Parameters, AggregationModesAreCheckedWithTheirNormalizer) {
    expect_refused("policy_loss", R"({"loss_agg_mode": "mean"})",
                   {"'loss_agg_mode'", "token-mean, seq-mean-token-sum, seq-mean-token-mean, "
                                       "seq-mean-token-sum-norm, sum"});
    expect_refused("policy_loss", R"({"loss_agg_mode": "seq-mean-token-sum-norm"})",
                   {"needs parameter 'max_seq_len'"});
    expect_refused("policy_loss", R"({"max_seq_len": 512})",
                   {"'max_seq_len' only applies", "seq-mean-token-sum-norm"});
    expect_refused("policy_loss",
                   R"({"loss_agg_mode": "seq-mean-token-sum-norm", "max_seq_len": 0})",
                   {"'max_seq_len'"});
}

TEST(Parameters, NullMeansOff) {
    T::Host host;
    T::Instance<PolicyLoss> inst(host, R"({"eps_clip_c": null, "icepop_beta": null})");
    ASSERT_TRUE(inst.ok()) << inst.error();
    const auto r = T::run_loss(inst, ppo_inputs());
    EXPECT_FALSE(r.has_metric("icepop_maskfrac"));
}

// ---- signatures ------------------------------------------------------------------------

TEST(Signature, DependsOnTheParameters) {
    T::Host host;
    T::Instance<PolicyLoss> plain(host, "{}");
    auto s = T::loss_signature(plain);
    EXPECT_EQ(s.required, (std::vector<std::string>{"logprobs", "old_logprobs", "advantages"}));
    EXPECT_EQ(s.optional, (std::vector<std::string>{"loss_mask", "weights", "rollout_is_weights",
                                                    "ref_logprobs", "entropy"}));
    EXPECT_EQ(s.differentiable, (std::vector<std::string>{"logprobs"}));

    T::Instance<PolicyLoss> full(host, R"({"use_tis": true, "kl_coef": 0.1, "entropy_coef": 0.1})");
    s = T::loss_signature(full);
    EXPECT_EQ(s.required,
              (std::vector<std::string>{"logprobs", "old_logprobs", "advantages",
                                        "rollout_logprobs", "ref_logprobs", "entropy"}));
    EXPECT_EQ(s.differentiable, (std::vector<std::string>{"logprobs", "entropy"}));

    T::Instance<GrpoLoss> teacher(host, R"({"teacher_tau": 1})");
    s = T::loss_signature(teacher);
    EXPECT_NE(std::find(s.required.begin(), s.required.end(), "teacher_logprobs"),
              s.required.end());
    T::Instance<ValueLoss> clipped(host, R"({"vf_clip": 0.2})");
    s = T::loss_signature(clipped);
    EXPECT_EQ(s.required, (std::vector<std::string>{"values", "returns", "old_values"}));
    EXPECT_EQ(s.differentiable, (std::vector<std::string>{"values"}));
    T::Instance<CausalLmLoss> ce(host, "{}");
    EXPECT_EQ(T::loss_signature(ce).required, (std::vector<std::string>{"logprobs", "labels"}));
    T::Instance<DecoupledPpo> dec(host, "{}");
    EXPECT_EQ(
        T::loss_signature(dec).required,
        (std::vector<std::string>{"logprobs", "old_logprobs", "prox_logprobs", "advantages"}));
}

// ---- inputs ----------------------------------------------------------------------------

TEST(Inputs, MissingRequiredInputsAreNamed) {
    auto r = run<PolicyLoss>(R"({"use_tis": true})", ppo_inputs());
    EXPECT_EQ(r.status, RL_ERR_INVALID_ARG);
    EXPECT_THAT(r.error, HasSubstr("missing input 'rollout_logprobs'"));
    EXPECT_THAT(r.error,
                HasSubstr("required: logprobs, old_logprobs, advantages, rollout_logprobs"));

    r = run<PolicyLoss>(R"({"kl_coef": 0.1})", ppo_inputs());
    EXPECT_THAT(r.error, HasSubstr("missing input 'ref_logprobs'"));
    r = run<PolicyLoss>(R"({"entropy_coef": 0.1})", ppo_inputs());
    EXPECT_THAT(r.error, HasSubstr("missing input 'entropy'"));
    r = run<GrpoLoss>(R"({"teacher_tau": 0.5})", ppo_inputs());
    EXPECT_THAT(r.error, HasSubstr("missing input 'teacher_logprobs'"));
    r = run<PolicyLoss>("{}", ppo_inputs().drop("advantages"));
    EXPECT_THAT(r.error, HasSubstr("missing input 'advantages'"));

    T::LossInputs v;
    v.f64("values", {1.0}).f64("returns", {0.0}).cu_seqlens({0, 1});
    r = run<ValueLoss>(R"({"vf_clip": 0.2})", v);
    EXPECT_THAT(r.error, HasSubstr("missing input 'old_values'"));
    T::LossInputs ce;
    ce.f64("logprobs", {-1.0}).cu_seqlens({0, 1});
    r = run<CausalLmLoss>("{}", ce);
    EXPECT_THAT(r.error, HasSubstr("missing input 'labels'"));
}

TEST(Inputs, UndeclaredInputsAreRefused) {
    auto in = ppo_inputs();
    in.f64("rollout_logprobs", {-1, -1, -1}); // use_tis is off
    const auto r = run<PolicyLoss>("{}", in);
    EXPECT_EQ(r.status, RL_ERR_INVALID_ARG);
    EXPECT_THAT(r.error, HasSubstr("unexpected input 'rollout_logprobs'"));
    EXPECT_THAT(r.error, HasSubstr("accepted: "));
}

TEST(Inputs, NanAndInfAreReportedWithTheirToken) {
    auto in = ppo_inputs();
    in.f64("logprobs", {-1.0, -2.0, std::numeric_limits<double>::quiet_NaN()});
    auto r = run<PolicyLoss>("{}", in);
    EXPECT_EQ(r.status, RL_ERR_NUMERIC);
    EXPECT_THAT(r.error, HasSubstr("input 'logprobs' has NaN at token 2"));
    in = ppo_inputs();
    in.f64("advantages", {1.0, std::numeric_limits<double>::infinity(), 1.0});
    r = run<PolicyLoss>("{}", in);
    EXPECT_EQ(r.status, RL_ERR_NUMERIC);
    EXPECT_THAT(r.error, HasSubstr("input 'advantages' has Inf at token 1"));
    // Even an input that is masked out or only feeds a metric.
    in = ppo_inputs();
    in.f64("ref_logprobs", {-1.0, std::numeric_limits<double>::quiet_NaN(), -1.0});
    r = run<PolicyLoss>("{}", in);
    EXPECT_EQ(r.status, RL_ERR_NUMERIC);
    EXPECT_THAT(r.error, HasSubstr("ref_logprobs"));
}

TEST(Inputs, OverflowingResultsAreReportedNotReturned) {
    T::LossInputs in;
    in.f64("logprobs", {-0.1})
        .f64("old_logprobs", {-800.0})
        .f64("advantages", {1.0})
        .cu_seqlens({0, 1});
    const auto r = run<ImportanceSampling>("{}", in);
    EXPECT_EQ(r.status, RL_ERR_NUMERIC);
    EXPECT_THAT(r.error, HasSubstr("the loss is infinite"));
}

TEST(Inputs, BadMaskLabelsAndShapesAreRefused) {
    auto in = ppo_inputs();
    in.f64("loss_mask", {1.0, 0.5, 0.0});
    auto r = run<PolicyLoss>("{}", in);
    EXPECT_EQ(r.status, RL_ERR_INVALID_ARG);
    EXPECT_THAT(r.error, HasSubstr("'loss_mask' must hold 0 or 1, got 0.5 at token 1"));

    T::LossInputs ce;
    ce.f64("logprobs", {-1.0, -2.0}).f64("labels", {1.0, 2.0}).cu_seqlens({0, 2});
    r = run<CausalLmLoss>("{}", ce);
    EXPECT_THAT(r.error, HasSubstr("'labels' must be an integer tensor"));

    in = ppo_inputs();
    in.i64("old_logprobs", {-1, -2, -1});
    r = run<PolicyLoss>("{}", in);
    EXPECT_THAT(r.error, HasSubstr("'old_logprobs' must be float32 or float64, got int64"));

    in = ppo_inputs();
    in.f64("advantages", {1.0, 1.0});
    r = run<PolicyLoss>("{}", in);
    EXPECT_EQ(r.status, RL_ERR_INVALID_ARG);
    EXPECT_THAT(r.error, HasSubstr("input 'advantages' has 2 tokens, but cu_seqlens covers 3"));

    in = ppo_inputs();
    in.cu_seqlens({0, 2, 4});
    r = run<PolicyLoss>("{}", in);
    EXPECT_THAT(r.error, HasSubstr("has 3 tokens, but cu_seqlens covers 4"));
}

TEST(Inputs, GlobalNormalizersAreChecked) {
    auto in = ppo_inputs();
    in.global(2, 0); // 3 loss tokens here
    auto r = run<PolicyLoss>("{}", in);
    EXPECT_EQ(r.status, RL_ERR_INVALID_ARG);
    EXPECT_THAT(r.error,
                HasSubstr("global_tokens (2) is smaller than the loss tokens in this call (3)"));
    in.global(0, 1); // 2 sequences here
    r = run<PolicyLoss>("{}", in);
    EXPECT_THAT(r.error, HasSubstr("global_seqs (1) is smaller"));
    in.global(-1, 0);
    r = run<PolicyLoss>("{}", in);
    EXPECT_THAT(r.error, HasSubstr("global_tokens must be a finite number >= 0"));
}

TEST(Inputs, Float32BoolAndEmptyBatchesWork) {
    T::LossInputs f32;
    f32.f32("logprobs", {-1.0f, -2.0f, -0.5f})
        .f32("old_logprobs", {-1.1f, -2.0f, -0.4f})
        .f32("advantages", {1.0f, -1.0f, 0.5f})
        .boolean("loss_mask", {1, 0, 1})
        .cu_seqlens({0, 2, 3});
    const auto r32 = run<PolicyLoss>("{}", f32);
    ASSERT_EQ(r32.status, RL_OK) << r32.error;
    auto in = ppo_inputs();
    in.f64("loss_mask", {1.0, 0.0, 1.0});
    const auto r64 = run<PolicyLoss>("{}", in);
    EXPECT_NEAR(r32.loss, r64.loss, 1e-6);
    EXPECT_EQ(r32.grads.at("logprobs")[1], 0.0);

    T::LossInputs empty;
    empty.f64("logprobs", {}).f64("old_logprobs", {}).f64("advantages", {}).cu_seqlens({0});
    const auto re = run<PolicyLoss>("{}", empty);
    ASSERT_EQ(re.status, RL_OK) << re.error;
    EXPECT_EQ(re.loss, 0.0);
    EXPECT_EQ(re.metric("valid_tokens"), 0.0);
}

// ---- the SDK test host --------------------------------------------------------------------

struct EmitsTwice : rl::sdk::Loss {
    explicit EmitsTwice(rl::sdk::Params &p) : twice_(p.boolean("twice", false)) {}
    rl::sdk::LossSignature signature() const override { return {{"logprobs"}, {}, {}}; }
    double compute(rl::sdk::Call &call, const rl::sdk::LossBatch &b, rl::sdk::Grads &) override {
        call.metric("m", 1.0);
        if (twice_) call.metric("m", 2.0);
        call.text("note", "hello");
        call.log(RL_LOG_INFO, "computed");
        return double(b.n_tokens);
    }
    bool twice_;
};

TEST(TestingHost, RecordsOutputsAndRefusesDuplicates) {
    T::Host host;
    T::LossInputs in;
    in.f64("logprobs", {-1.0, -2.0}).cu_seqlens({0, 2});
    T::Instance<EmitsTwice> once(host, "{}");
    ASSERT_TRUE(once.ok());
    auto r = T::run_loss(once, in);
    ASSERT_EQ(r.status, RL_OK) << r.error;
    EXPECT_EQ(r.loss, 2.0);
    EXPECT_EQ(r.metric("m"), 1.0);
    EXPECT_EQ(r.texts.at("note"), "hello");
    EXPECT_THAT(host.logs().back(), HasSubstr("computed"));
    EXPECT_THROW(r.metric("absent"), std::out_of_range);

    T::Instance<EmitsTwice> twice(host, R"({"twice": true})");
    r = T::run_loss(twice, in);
    EXPECT_EQ(r.status, RL_ERR_INVALID_ARG);
    EXPECT_THAT(r.error, HasSubstr("host refused metric 'm'"));

    // Emitting outside a call is refused.
    rl_call_ctx_t stray{};
    stray.struct_size = sizeof(stray);
    stray.host = host.api();
    EXPECT_EQ(host.api()->emit_metric(&stray, "x", 1.0), RL_ERR_BAD_STATE);

    void *p = host.api()->mem_alloc(host.api(), 100, 64);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    host.api()->mem_free(host.api(), p);
    host.api()->mem_free(host.api(), nullptr);
    p = host.api()->mem_alloc(host.api(), 3, 2);
    ASSERT_NE(p, nullptr);
    host.api()->mem_free(host.api(), p);
    EXPECT_EQ(host.api()->mem_alloc(host.api(), SIZE_MAX - 2, 64), nullptr);
    EXPECT_EQ(host.api()->mem_alloc(host.api(), 8, 24), nullptr);
}

TEST(TestingHost, ReportsCreationFailures) {
    T::Host host;
    T::Instance<EmitsTwice> bad(host, R"({"twice": "yes"})");
    EXPECT_FALSE(bad.ok());
    EXPECT_EQ(bad.status(), RL_ERR_INVALID_ARG);
    EXPECT_THAT(bad.error(), HasSubstr("'twice' must be true or false"));
    T::LossInputs in;
    in.f64("logprobs", {-1.0}).cu_seqlens({0, 1});
    EXPECT_EQ(T::run_loss(bad, in).status, RL_ERR_BAD_STATE);
}

} // namespace
} // namespace rl::losses::test
