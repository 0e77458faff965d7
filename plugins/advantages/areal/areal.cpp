// plugins/advantages/areal: AReaL's PPO advantage pipeline (areal/trainer/ppo
// actor compute_advantages), with verl's KL-penalised token rewards and its
// fixed / adaptive KL controller. See docs/advantages.md.
//
// Per sequence s with reward r_s, over its completion tokens c_1..c_k only:
//   r'_s  = clip((r_s + reward_bias) * reward_scaling, -reward_clip, reward_clip)
//           then, with reward_norm, AReaL's Normalization over the batch's rewards
//           (one value per sequence, every sequence counted)
//           (0 with mask_no_eos_with_zero when the sequence is truncated)
//   u_t   = token_rewards[t] - beta * k(old_logprobs_t, ref_logprobs_t) + (t == c_k ? r'_s : 0)
//   delta = u_t + gamma * V_next - V_t,  A_t = delta + gamma * lambda * A_next
//           (V = 0 without values; V after c_k = 0, or for a truncated sequence the
//            value of its last token, which must follow c_k: the bootstrap)
//   R_t   = A_t + V_t                                   ("returns")
// then A is normalized over completion tokens by AReaL's NormConfig (mean and std
// levels batch / group / none, leave-one-out mean, unbiased std, eps).
// beta is kl_coef, or with kl_target verl's adaptive controller, updated after
// every call from the batch's KL.
#include <rl/sdk/advantage.hpp>

#include <optional>

namespace {

using namespace rl::sdk::advantage;

enum class Level { None, Batch, Group };

Level read_level(rl::sdk::Params &p, const char *key) {
    if (p.is_null(key)) return Level::None;
    const std::string v = p.choice(key, "batch", {"batch", "group", "none"});
    return v == "batch" ? Level::Batch : v == "group" ? Level::Group : Level::None;
}

class Areal : public rl::sdk::Advantage {
public:
    explicit Areal(rl::sdk::Params &p) {
        p.alias("discount", "gamma", "AReaL");
        p.alias("gae_lambda", "lambda", "AReaL");
        p.alias("kl_ctl", "kl_coef", "AReaL");
        bias_ = p.number("reward_bias", 0.0);
        scaling_ = p.number("reward_scaling", 1.0);
        clip_ = p.number("reward_clip", 20.0, 0.0);
        mask_no_eos_ = p.boolean("mask_no_eos_with_zero", false);
        gamma_ = p.number("gamma", 1.0, 0.0, 1.0);
        lambda_ = p.number("lambda", 1.0, 0.0, 1.0);
        beta_ = p.number("kl_coef", 0.0, 0.0);
        target_ = p.optional_number("kl_target");
        horizon_ = p.number("kl_horizon", 10000.0);
        const std::string k = p.choice("kl_estimator", "k1", {"k1", "k2", "k3"});
        kl_ = k == "k1" ? 1 : k == "k2" ? 2 : 3;
        if (target_ && *target_ <= 0)
            invalid(p.owner() +
                    ": parameter 'kl_target' must be > 0 (or null for a fixed kl_coef)");
        if (target_ && horizon_ <= 0) invalid(p.owner() + ": parameter 'kl_horizon' must be > 0");
        if (!target_ && p.has("kl_horizon"))
            invalid(p.owner() + ": parameter 'kl_horizon' only applies with 'kl_target'");
        norm_ = read_norm(p, "adv_norm");
        reward_norm_ = read_norm(p, "reward_norm");
    }

    void compute(Call &call, const AdvantageBatch &b) override {
        std::vector<std::string> required;
        if (beta_ > 0 || target_) required = {"old_logprobs", "ref_logprobs"};
        if (mask_no_eos_) required.push_back("truncated");
        check_inputs(
            b,
            {"loss_mask", "token_rewards", "values", "old_logprobs", "ref_logprobs", "truncated"},
            required);
        const std::vector<uint8_t> mask = read_mask(b);
        const std::vector<double> rewards = b.rewards.to_vector();
        const std::vector<double> token_rewards = read_tokens(b, "token_rewards");
        const std::vector<double> values = read_tokens(b, "values");
        const bool has_values = b.tensors.has("values");
        const std::vector<double> truncated = read_tokens(b, "truncated");
        const std::vector<double> old = read_tokens(b, "old_logprobs");
        const std::vector<double> ref = read_tokens(b, "ref_logprobs");
        const bool has_kl = b.tensors.has("old_logprobs") && b.tensors.has("ref_logprobs");
        const size_t n = static_cast<size_t>(b.n_tokens());

        // KL per completion token; the batch KL is the mean over sequences of their
        // token means (verl's apply_kl_penalty).
        std::vector<double> kl(n, 0.0);
        std::vector<double> seq_kl;
        const double beta = beta_;
        std::vector<double> adv(n, 0.0), returns(n, 0.0), shaped(rewards.size(), 0.0);
        int64_t masked_no_eos = 0;
        std::vector<double> scored(rewards.size());
        for (size_t s = 0; s < rewards.size(); ++s)
            scored[s] = std::clamp((rewards[s] + bias_) * scaling_, -clip_, clip_);
        if (reward_norm_) normalize_rewards(scored, b);
        for (size_t s = 0; s < rewards.size(); ++s) {
            const std::vector<int64_t> pos = masked_positions(b.cu_seqlens, mask, s);
            double r = scored[s];
            bool trunc = false;
            if (b.tensors.has("truncated")) {
                const int64_t first = b.cu_seqlens[s], last = b.cu_seqlens[s + 1];
                for (int64_t t = first; t < last; ++t) {
                    const double x = truncated[static_cast<size_t>(t)];
                    if ((x != 0 && x != 1) || x != truncated[static_cast<size_t>(first)])
                        invalid("input 'truncated' must hold one 0/1 value per sequence on all "
                                "its tokens; sequence " +
                                std::to_string(s) + " has " + std::to_string(x) + " at token " +
                                std::to_string(t));
                }
                trunc = last > first && truncated[static_cast<size_t>(first)] != 0;
            }
            if (mask_no_eos_ && trunc) {
                r = 0.0;
                ++masked_no_eos;
            }
            shaped[s] = r;
            if (pos.empty()) continue;
            double next_value = 0.0;
            if (trunc && has_values) {
                const int64_t last = b.cu_seqlens[s + 1] - 1;
                if (last == pos.back())
                    invalid("input 'truncated': sequence " + std::to_string(s) +
                            " is truncated but ends with a completion token; its last token "
                            "must carry the bootstrap value (the state after the last action) "
                            "with loss_mask 0");
                next_value = values[static_cast<size_t>(last)];
            }
            double sum_kl = 0;
            for (int64_t t : pos) {
                if (!has_kl) break;
                const double d = old[static_cast<size_t>(t)] - ref[static_cast<size_t>(t)];
                const double k = kl_ == 1 ? d : kl_ == 2 ? 0.5 * d * d : std::exp(-d) - 1.0 + d;
                kl[static_cast<size_t>(t)] = k;
                sum_kl += k;
            }
            if (has_kl) seq_kl.push_back(sum_kl / double(pos.size()));
            double next_adv = 0.0;
            for (size_t j = pos.size(); j-- > 0;) {
                const size_t t = static_cast<size_t>(pos[j]);
                const double u = token_rewards[t] - beta * kl[t] + (j + 1 == pos.size() ? r : 0.0);
                const double delta = u + gamma_ * next_value - values[t];
                next_adv = delta + gamma_ * lambda_ * next_adv;
                adv[t] = next_adv;
                returns[t] = next_adv + values[t];
                next_value = values[t];
            }
        }
        if (norm_) normalize_tokens(adv, mask, b);

        call.tensor("advantages", adv);
        call.tensor("returns", returns);
        call.metric(rl::sdk::metrics::kRewardMean, mean_of(rewards));
        call.metric("shaped_reward_mean", mean_of(shaped));
        if (mask_no_eos_) call.metric("no_eos_masked", double(masked_no_eos));
        if (has_kl) {
            const double current = mean_of(seq_kl);
            call.metric("kl_coef", beta);
            call.metric(rl::sdk::metrics::kKl, current);
            if (target_) { // verl's AdaptiveKLController.update(current_kl, n_steps = batch)
                const double err = std::clamp(current / *target_ - 1.0, -0.2, 0.2);
                beta_ *= 1.0 + err * double(rewards.size()) / horizon_;
            }
        }
        emit_summary(call, rl::sdk::metrics::kAdv, adv, mask);
        emit_summary(call, rl::sdk::metrics::kReturns, returns, mask);
    }

private:
    struct Norm {
        Level mean = Level::Batch, std = Level::Batch;
        bool leave1out = false, unbiased = true;
        double eps = 1e-5;
    };

    // AReaL's NormConfig object (adv_norm, reward_norm); null or absent: none.
    static std::optional<Norm> read_norm(rl::sdk::Params &p, const char *key) {
        const rl::sdk::json norm = p.raw(key);
        if (norm.is_null()) return std::nullopt;
        const std::string name = std::string("parameter '") + key + "'";
        if (!norm.is_object())
            invalid(p.owner() + ": " + name +
                    " must be an object {mean_level, std_level, mean_leave1out, std_unbiased, "
                    "eps} (or null for none), got " +
                    norm.dump());
        rl::sdk::Params q(norm.dump(), p.owner() + ": " + name);
        Norm n;
        n.mean = read_level(q, "mean_level");
        n.std = read_level(q, "std_level");
        n.leave1out = q.boolean("mean_leave1out", false);
        n.unbiased = q.boolean("std_unbiased", true);
        n.eps = q.number("eps", 1e-5, 0.0);
        q.finish();
        if (n.leave1out && n.mean == Level::None)
            invalid(q.owner() + ": 'mean_leave1out' needs a mean_level");
        return n;
    }

    // A normalization's sets of indices: the whole batch, or one per group, each
    // with the number of sequences it spans.
    struct Sets {
        std::vector<std::vector<size_t>> members;
        std::vector<size_t> seqs;
    };

    // reward_norm: each sequence's reward is one element, every sequence counts
    // (AReaL normalizes the [batch] rewards without a mask).
    void normalize_rewards(std::vector<double> &x, const AdvantageBatch &b) const {
        const size_t n = x.size();
        const auto sets = [&](Level level) {
            Sets out;
            if (level == Level::Batch) {
                out.members.emplace_back();
                for (size_t s = 0; s < n; ++s) out.members.back().push_back(s);
                out.seqs.push_back(n);
                return out;
            }
            for (const auto &members : group_members(b.group_ids)) {
                out.members.emplace_back(members.begin(), members.end());
                out.seqs.push_back(members.size());
            }
            return out;
        };
        normalize(*reward_norm_, x, std::vector<uint8_t>(n, 1), sets);
    }

    // adv_norm over completion tokens.
    void normalize_tokens(std::vector<double> &x, const std::vector<uint8_t> &mask,
                          const AdvantageBatch &b) const {
        const size_t n = x.size();
        // Token sets: the batch, or each group's completion tokens.
        const auto sets = [&](Level level) {
            Sets out;
            if (level == Level::Batch) {
                out.members.emplace_back();
                for (size_t t = 0; t < n; ++t)
                    if (mask[t]) out.members.back().push_back(t);
                out.seqs.push_back(b.cu_seqlens.size() - 1);
                return out;
            }
            for (const auto &members : group_members(b.group_ids)) {
                out.members.emplace_back();
                for (int64_t s : members)
                    for (int64_t t = b.cu_seqlens[s]; t < b.cu_seqlens[s + 1]; ++t)
                        if (mask[static_cast<size_t>(t)]) out.members.back().push_back(size_t(t));
                out.seqs.push_back(members.size());
            }
            return out;
        };
        normalize(*norm_, x, mask, sets);
    }

    // AReaL's Normalization: mean and std per level, the leave-one-out mean (each
    // element's mean excludes itself), std around that mean. A set with one
    // sequence gives mean 0 with leave-one-out and std 1 when unbiased (AReaL's
    // rule for groups of one); a set of <= 1 element likewise. Elements outside
    // `active` become 0.
    template <class SetsOf>
    static void normalize(const Norm &nm, std::vector<double> &x,
                          const std::vector<uint8_t> &active, const SetsOf &sets_of) {
        const size_t n = x.size();
        std::vector<double> mean(n, 0.0), sd(n, 1.0);
        if (nm.mean != Level::None) {
            const Sets sets = sets_of(nm.mean);
            const auto &ss = sets.members;
            const auto &seqs = sets.seqs;
            for (size_t i = 0; i < ss.size(); ++i) {
                const auto &set = ss[i];
                double sum = 0;
                for (size_t t : set) sum += x[t];
                const double m = double(set.size());
                for (size_t t : set) {
                    if (!nm.leave1out)
                        mean[t] = m > 0 ? sum / m : 0.0;
                    else if (m <= 1 || (nm.mean == Level::Group && seqs[i] == 1))
                        mean[t] = 0.0;
                    else
                        mean[t] = (sum - x[t]) / (m - 1);
                }
            }
        }
        double eps = nm.eps;
        if (nm.std != Level::None) {
            const Sets sets = sets_of(nm.std);
            const auto &ss = sets.members;
            const auto &seqs = sets.seqs;
            for (size_t i = 0; i < ss.size(); ++i) {
                const auto &set = ss[i];
                double sq = 0;
                for (size_t t : set) sq += (x[t] - mean[t]) * (x[t] - mean[t]);
                const double m = double(set.size());
                double s = 1.0;
                if (nm.unbiased) {
                    if (m > 1 && !(nm.std == Level::Group && seqs[i] == 1))
                        s = std::sqrt(sq / (m - 1));
                } else if (m > 0) {
                    s = std::sqrt(sq / m);
                }
                for (size_t t : set) sd[t] = s;
            }
        } else {
            eps = 0.0;
        }
        for (size_t t = 0; t < n; ++t) x[t] = active[t] ? (x[t] - mean[t]) / (sd[t] + eps) : 0.0;
    }

    double bias_ = 0, scaling_ = 1, clip_ = 20;
    bool mask_no_eos_ = false;
    double gamma_ = 1, lambda_ = 1;
    double beta_ = 0;
    std::optional<double> target_;
    double horizon_ = 10000;
    int kl_ = 1;
    std::optional<Norm> norm_, reward_norm_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<Areal>(
    "org.rl.advantage.areal", "areal", "1.0.0",
    "AReaL's PPO advantages: reward bias / scale / clip, KL-penalised token rewards with a "
    "fixed or adaptive coefficient, GAE with truncation bootstrap, AReaL's normalization"))
