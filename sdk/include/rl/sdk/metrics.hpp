// rl/sdk/metrics.hpp: the standard metric vocabulary. Plugins that report the
// same quantity use the same name, so scripts, dashboards and rl.loss_stats
// read them without knowing the plugin; a plugin's own quantities keep their
// own names (documented with the plugin). Values are per call; the trainer
// averages them over micro-batches weighted by loss tokens.
#pragma once

namespace rl::sdk::metric {

// ---- losses -----------------------------------------------------------------
inline constexpr const char *kPgLoss = "pg_loss";           // the policy-gradient term
inline constexpr const char *kPgClipFrac = "pg_clipfrac";   // loss tokens whose ratio was clipped
inline constexpr const char *kValidTokens = "valid_tokens"; // loss tokens of the call
inline constexpr const char *kRatioMean = "ratio_mean";     // pi/pi_old over loss tokens
inline constexpr const char *kRatioMin = "ratio_min";
inline constexpr const char *kRatioMax = "ratio_max";
inline constexpr const char *kSeqRatioMean = "seq_ratio_mean"; // per-sequence ratios
inline constexpr const char *kSeqRatioMin = "seq_ratio_min";
inline constexpr const char *kSeqRatioMax = "seq_ratio_max";
inline constexpr const char *kKlSampleTrain = "kl_sample_train_k3"; // k3(old || new)
inline constexpr const char *kEntropySample = "entropy_sample";     // mean -old_logprob
inline constexpr const char *kRefKl = "ref_kl";                     // the kl_coef term's KL
inline constexpr const char *kEntropy = "entropy";                  // the entropy_coef term's H
inline constexpr const char *kMasked = "masked";                    // loss tokens masked out

// ---- advantages -------------------------------------------------------------
inline constexpr const char *kRewardMean = "reward_mean";
inline constexpr const char *kRewardStd = "reward_std";
inline constexpr const char *kGroups = "groups";
inline constexpr const char *kGroupsSingleton = "groups_singleton"; // one sequence only
inline constexpr const char *kGroupsZeroStd = "groups_zero_std";    // all rewards equal

} // namespace rl::sdk::metric
