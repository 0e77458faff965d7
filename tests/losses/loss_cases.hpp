// tests/losses/loss_cases.hpp: parameter sets that, together, switch on every
// option of every loss, and the batches they run on.
#pragma once

#include "loss_test_util.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace rl::losses::test {

struct Case {
    std::string loss;
    std::string params;
    std::vector<double> seq_ratio_targets; // for gspo: geometric-mean ratio per sequence
};

inline const std::vector<Case> &cases() {
    static const std::vector<Case> c = {
        {"causallm_loss", "{}", {}},
        {"causallm_loss", R"({"ignore_index": -100})", {}},
        {"causallm_loss", R"({"z_loss": 0.01})", {}},
        {"per_token_ce", R"({"z_loss": 0.1})", {}},
        {"ipo",
         R"({"ipo_mask_low": 0.05, "ipo_mask_high": 0.3, "ratio_clip": 2, "teacher_tau": 0.3,
             "kl_tau": 0.01})",
         {}},
        {"dppo", R"({"ratio_clip": 1.5, "teacher_tau": 0.2})", {}},
        {"policy_loss", R"({"z_loss": 0.001, "kl_coef": 0.1, "entropy_coef": 0.01})", {}},
        {"policy_loss",
         R"({"rejection_sampling": {"upper": 4, "lower": 0.25}, "use_tis": true})",
         {}},
        {"cispo", R"({"rejection_sampling": {"metric": "kl_k3", "upper": 1.5}})", {}},
        {"sapo", R"({"rejection_sampling": {"action": "clamp", "upper": 1.5, "lower": 0.7}})", {}},
        {"per_token_ce", "{}", {}},
        {"policy_loss", "{}", {}},
        {"policy_loss", R"({"eps_clip": 0.2, "eps_clip_high": 0.28, "eps_clip_c": 3})", {}},
        {"policy_loss", R"({"icepop_beta": 5, "use_tis": true, "compute_kl_stats": true})", {}},
        {"policy_loss",
         R"({"eps_clip_c": 3, "icepop_beta": 3, "use_tis": true, "tis_clip_low": 0.5,
             "tis_clip_high": 1.5, "kl_coef": 0.3, "kl_type": "k1", "entropy_coef": 0.05})",
         {}},
        {"policy_loss", R"({"kl_coef": 0.2, "kl_type": "k2", "compute_kl_stats": true})", {}},
        {"policy_loss", R"({"kl_coef": 0.2, "kl_type": "low_var_kl", "entropy_coef": 0.01})", {}},
        {"policy_loss", R"({"kl_coef": 0.2, "kl_type": "abs"})", {}},
        {"policy_loss", R"({"kl_coef": 0.3, "kl_type": "k1+", "use_tis": true})", {}},
        {"policy_loss", R"({"kl_coef": 0.3, "kl_type": "k3+", "eps_clip_c": 3})", {}},
        {"policy_loss", R"({"kl_coef": 0.3, "kl_type": "low_var_kl+"})", {}},
        {"importance_sampling", "{}", {}},
        {"importance_sampling",
         R"({"compute_kl_stats": true, "kl_coef": 0.2, "kl_type": "k2", "entropy_coef": 0.1})",
         {}},
        {"importance_sampling", R"({"kl_coef": 0.5, "kl_type": "k3+"})", {}},
        {"grpo", "{}", {}},
        {"grpo", R"({"ratio_type": "sequence"})", {}},
        {"grpo",
         R"({"teacher_tau": 0.5, "kl_tau": 0.2, "adv_tau": 0.7, "geo_mask_low": 0.6,
             "geo_mask_high": 1.6})",
         {}},
        {"grpo",
         R"({"ratio_type": "sequence", "sequence_clip_high": 2, "kl_coef": 0.1, "kl_type": "k3",
             "entropy_coef": 0.01, "token_mask_low": 0.3, "token_mask_high": 3,
             "sequence_mask_low": 0.1, "sequence_mask_high": 5})",
         {}},
        {"decoupled_ppo", "{}", {}},
        {"decoupled_ppo",
         R"({"c_clip": 3, "behav_imp_weight_cap": 2, "eps_clip_higher": 0.28, "kl_coef": 0.1,
             "entropy_coef": 0.02})",
         {}},
        {"decoupled_ppo",
         R"({"rejection_sampling": {"level": "token", "action": "mask", "upper": 2, "lower": 0.5}})",
         {}},
        {"decoupled_ppo",
         R"({"rejection_sampling": {"level": "sequence", "metric": "kl_k3", "agg": "max",
             "upper": 0.8}, "c_clip": 3})",
         {}},
        {"decoupled_ppo",
         R"({"rejection_sampling": {"level": "sequence", "action": "clamp", "agg": "sum",
             "upper": 1.5, "lower": 0.7}, "importance_sampling_level": "sequence",
             "eps_clip": 0.6, "eps_clip_higher": 3})",
         {}},
        {"decoupled_ppo",
         R"({"behav_imp_weight_mode": "token_truncate", "behav_imp_weight_cap": 1.5,
             "importance_sampling_level": "sequence", "c_clip": 3, "kl_coef": 0.1,
             "eps_clip": 0.6, "eps_clip_higher": 3})",
         {}},
        {"decoupled_ppo",
         R"({"behave_imp_weight_mode": "sequence_mask", "behave_imp_weight_cap": 1.3})",
         {}},
        {"decoupled_ppo", R"({"behav_imp_weight_mode": "disabled"})", {}},
        {"cispo", "{}", {}},
        {"cispo",
         R"({"clip_low": 0.5, "clip_high": 2, "kl_coef": 0.1, "compute_kl_stats": true})",
         {}},
        {"gspo", "{}", {0.9, 1.0001, 0.9999, 1.01}},
        {"gspo", R"({"eps_clip": 0.2, "eps_clip_high": 0.28})", {0.5, 0.95, 1.05, 1.6}},
        {"gspo", R"({"eps_clip": 0.2, "kl_coef": 0.05, "entropy_coef": 0.03})", {0.7, 1.1, 1.3}},
        {"value_loss", "{}", {}},
        {"value_loss", R"({"vf_clip": 0.2})", {}},
        {"value_loss", R"({"vf_clip": 0.2, "vf_coef": 0.5})", {}},
        {"value_loss", R"({"huber_delta": 0.5})", {}},
        {"value_loss", R"({"vf_clip": 0.2, "huber_delta": 0.3, "vf_coef": 0.5})", {}},
        {"sapo", "{}", {}},
        {"sapo", R"({"importance_sampling_level": "sequence"})", {}},
        {"sapo",
         R"({"importance_sampling_level": "sequence", "tau_pos": 3, "tau_neg": 0.5,
             "kl_coef": 0.1, "kl_type": "k3+", "entropy_coef": 0.01})",
         {}},
        {"sapo",
         R"({"tau_pos": 2, "tau_neg": 0.5, "kl_coef": 0.1, "kl_type": "k3+",
             "entropy_coef": 0.01})",
         {}},
        {"gmpo", "{}", {}},
        {"gmpo",
         R"({"eps_clip": 0.3, "eps_clip_high": 0.7, "kl_coef": 0.1, "kl_type": "abs"})",
         {}},
        {"gmpo", R"({"eps_clip": 0.05, "eps_clip_high": 0.05, "entropy_coef": 0.02})", {}},
        {"clip_cov", "{}", {}},
        {"clip_cov", R"({"clip_cov_ratio": 0.2, "clip_cov_lb": 0.05, "clip_cov_ub": 1.5})", {}},
        {"clip_cov",
         R"({"selection": "top", "clip_cov_ratio": 0.3, "clip_cov_lb": -1, "clip_cov_ub": 2,
             "eps_clip_high": 0.28, "kl_coef": 0.2, "kl_type": "low_var_kl+"})",
         {}},
        {"clip_cov", R"({"clip_cov_ratio": 0.15, "clip_cov_lb": -10, "seed": 7})", {}},
        {"dppo", "{}", {}},
        {"dppo",
         R"({"dppo_mask_low": 0.1, "dppo_mask_high": 0.3, "adv_tau": 0.5, "kl_tau": 0.05,
             "ref_kl_mask_low": 0.1, "ref_kl_tau": 0.02, "kl_coef": 0.1, "entropy_coef": 0.01})",
         {}},
        {"ipo", "{}", {}},
        {"ipo", R"({"ipo_threshold": 0.2, "kl_tau": 0.1, "kl_coef": 0.2, "kl_type": "k1+"})", {}},
        {"kl_cov", "{}", {}},
        {"kl_cov",
         R"({"kl_cov_ratio": 0.2, "ppo_kl_coef": 1.0, "kl_coef": 0.1, "kl_type": "k1+"})",
         {}},
    };
    return c;
}

// The batch a case runs on (only the inputs the loss accepts are passed).
inline Batch case_batch(const Case &c, uint64_t seed) {
    GenOptions opt;
    opt.seq_ratio_targets = c.seq_ratio_targets;
    return c.loss == "decoupled_ppo" ? decoupled_batch(seed, opt) : random_batch(seed, opt);
}

// The aggregation variants every case runs with.
struct AggVariant {
    std::string json; // merged into the case's params
    double global_tokens = 0, global_seqs = 0;
};
inline const std::vector<AggVariant> &agg_variants() {
    static const std::vector<AggVariant> v = {
        {R"({"loss_agg_mode": "token-mean"})"},
        {R"({"loss_agg_mode": "seq-mean-token-sum"})"},
        {R"({"loss_agg_mode": "seq-mean-token-mean"})"},
        {R"({"loss_agg_mode": "seq-mean-token-sum-norm", "max_seq_len": 16})"},
        {R"({"loss_agg_mode": "sum"})"},
        {"{}", 100, 12}, // the loss's default mode with global normalizers
    };
    return v;
}

inline std::string merge(const std::string &a, const std::string &b) {
    auto j = nlohmann::json::parse(a);
    j.update(nlohmann::json::parse(b));
    return j.dump();
}

} // namespace rl::losses::test
