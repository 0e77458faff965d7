// plugins/advantages/gpg: Group Policy Gradient advantages (Chu et al. 2025,
// arXiv 2504.02546; verl "gpg"). See docs/advantages.md.
//
//   A_i = alpha * (r_i - mean of i's group) / f_norm
//
// alpha rescales the batch gradient to the sequences that carry a signal:
//   alpha "valid" (the paper's B / (B - M)): B sequences in the batch, M of them
//     in groups of one or all-equal groups (no signal); 1 when B = M;
//   alpha "nonzero_rewards" (verl's code): B / max(number of non-zero rewards, 1);
//   alpha "one": 1.
// Groups of one and all-equal groups get A = 0 exactly. A_i is broadcast to
// the completion tokens of sequence i.
#include <rl/sdk/advantage.hpp>

namespace {

using namespace rl::sdk::advantage;

class Gpg : public rl::sdk::Advantage {
public:
    explicit Gpg(rl::sdk::Params &p)
        : alpha_(p.choice("alpha", "valid", {"valid", "nonzero_rewards", "one"})),
          f_norm_(p.number("f_norm", 1.0, 0.0)) {
        if (f_norm_ <= 0.0)
            invalid(p.owner() + ": parameter 'f_norm' must be > 0, got " + std::to_string(f_norm_));
    }

    void compute(Call &call, const AdvantageBatch &b) override {
        check_inputs(b, {"loss_mask"});
        const std::vector<uint8_t> mask = read_mask(b);
        const std::vector<double> rewards = b.rewards.to_vector();
        const auto groups = group_members(b.group_ids);

        std::vector<double> seq_adv(rewards.size(), 0.0);
        size_t singleton = 0, zero_std = 0, no_signal = 0;
        for (const auto &members : groups) {
            std::vector<double> r;
            for (int64_t i : members) r.push_back(rewards[static_cast<size_t>(i)]);
            if (r.size() == 1 || all_equal(r)) {
                ++(r.size() == 1 ? singleton : zero_std);
                no_signal += r.size();
                continue;
            }
            const double base = mean_of(r);
            for (size_t k = 0; k < members.size(); ++k)
                seq_adv[static_cast<size_t>(members[k])] = r[k] - base;
        }

        const double n = static_cast<double>(rewards.size());
        double alpha = 1.0;
        if (alpha_ == "valid") {
            if (no_signal < rewards.size()) alpha = n / (n - static_cast<double>(no_signal));
        } else if (alpha_ == "nonzero_rewards") {
            double nonzero = 0.0;
            for (double x : rewards) nonzero += x != 0.0;
            alpha = n / std::max(nonzero, 1.0);
        }
        for (double &a : seq_adv) a = alpha * a / f_norm_;

        const std::vector<double> adv = broadcast(seq_adv, b.cu_seqlens, mask);
        call.tensor("advantages", adv);
        emit_reward_summary(call, rewards, groups.size(), singleton, zero_std);
        call.metric(rl::sdk::metrics::kAlpha, alpha);
        emit_summary(call, rl::sdk::metrics::kAdv, adv, mask);
    }

private:
    std::string alpha_;
    double f_norm_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<Gpg>(
    "org.rl.advantage.gpg", "gpg", "1.0.0",
    "GPG: alpha * (r - group mean) / f_norm, alpha rescaling to the sequences with a signal"))
