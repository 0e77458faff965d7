// rl/sdk/metrics.hpp: the standard metric vocabulary of losses and advantage
// estimators. These are the keys the in-tree plugins emit (the host prefixes
// them with the plugin's role, e.g. "loss/pg_loss"); a plugin that reports the
// same quantity should use the same key, so dashboards and scripts work with
// any loss. Header-only, C++17, no dependency.
//
// Conventions: a "*frac" is a fraction of the call's loss tokens in [0, 1];
// "*_mean" / "*_min" / "*_max" are over the call's loss tokens (empty: 0, or 1
// for ratios). docs/losses.md and docs/advantages.md list who emits what.
#pragma once

namespace rl::sdk::metrics {

// ---- every loss ------------------------------------------------------------------
inline constexpr const char *kValidTokens = "valid_tokens"; // loss tokens of the call
inline constexpr const char *kZLoss = "z_loss"; // mean log^2 Z over loss tokens (with z_loss)

// ---- policy-gradient losses ----------------------------------------------------------
inline constexpr const char *kPgLoss = "pg_loss";             // the policy term alone
inline constexpr const char *kPgClipfrac = "pg_clipfrac";     // PPO-clipped tokens
inline constexpr const char *kDualClipfrac = "dual_clipfrac"; // dual-clipped tokens (A < 0)
inline constexpr const char *kClipFraction = "clip_fraction"; // CISPO: clipped weights
inline constexpr const char *kRatioMean = "ratio_mean";       // exp(logprobs - old_logprobs)
inline constexpr const char *kRatioMin = "ratio_min";
inline constexpr const char *kRatioMax = "ratio_max";
inline constexpr const char *kSeqRatioMean = "seq_ratio_mean"; // sequence-level ratios
inline constexpr const char *kSeqRatioMin = "seq_ratio_min";
inline constexpr const char *kSeqRatioMax = "seq_ratio_max";
inline constexpr const char *kKlSampleTrainK3 = "kl_sample_train_k3"; // mean(r - log r - 1)
inline constexpr const char *kEntropySample = "entropy_sample";       // -mean(old_logprobs)
inline constexpr const char *kApproxKl = "approx_kl";
inline constexpr const char *kKl = "kl";
inline constexpr const char *kAbsKl = "abs_kl";
inline constexpr const char *kTokens = "tokens";

// Shared regularizers (kl_coef against ref_logprobs, entropy_coef).
inline constexpr const char *kRefKl = "ref_kl";    // mean KL estimate vs ref_logprobs
inline constexpr const char *kEntropy = "entropy"; // mean entropy input

// Option-specific policy metrics.
inline constexpr const char *kIcepopMaskfrac = "icepop_maskfrac";
inline constexpr const char *kTisMean = "tis_mean";
inline constexpr const char *kTisMin = "tis_min";
inline constexpr const char *kTisMax = "tis_max";
inline constexpr const char *kTisClipfrac = "tis_clipfrac";
inline constexpr const char *kMasked = "masked";
inline constexpr const char *kMaskedSeqs = "masked_seqs";
inline constexpr const char *kTeacherKl = "teacher_kl";
inline constexpr const char *kBehavImpWeight = "behav_imp_weight";
inline constexpr const char *kBehavApproxKl = "behav_approx_kl";
inline constexpr const char *kBehavMaskfrac = "behav_maskfrac";
inline constexpr const char *kGateMean = "gate_mean";
inline constexpr const char *kCovClipfrac = "cov_clipfrac";
inline constexpr const char *kCovCandidates = "cov_candidates";
inline constexpr const char *kKlCovFrac = "kl_cov_frac";

// ---- value and cross-entropy losses ------------------------------------------------------
inline constexpr const char *kValueMean = "value_mean";
inline constexpr const char *kReturnMean = "return_mean";
inline constexpr const char *kValueErrorSqMean = "value_error_sq_mean";
inline constexpr const char *kVfClipfrac = "vf_clipfrac";
inline constexpr const char *kHuberLinearFrac = "huber_linear_frac";
inline constexpr const char *kPerplexity = "perplexity";

// ---- advantage estimators ------------------------------------------------------------------
inline constexpr const char *kRewardMean = "reward_mean";
inline constexpr const char *kRewardStd = "reward_std";
inline constexpr const char *kGroups = "groups";
inline constexpr const char *kGroupsSingleton = "groups_singleton";
inline constexpr const char *kGroupsZeroStd = "groups_zero_std";
inline constexpr const char *kAlpha = "alpha";
// Summary prefixes: <prefix>_mean, _std, _min, _max over completion tokens.
inline constexpr const char *kAdv = "adv";
inline constexpr const char *kReturns = "returns";
inline constexpr const char *kValues = "values";

} // namespace rl::sdk::metrics
