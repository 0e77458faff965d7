// plugins/advantages/grpo_passk: pass@k advantages (arXiv 2503.19595; verl
// "grpo_passk"). See docs/advantages.md.
//
// Only the best sample of each group is credited, with its margin over the
// runner-up:
//   A_best = (r_max - r_second) / (std_g + eps)   (norm_by_std: true)
//   A_best =  r_max - r_second                    (norm_by_std: false)
// and A = 0 for every other member. The best sample is the first member (in
// batch order) with the largest reward, so ties are deterministic; a tie at the
// top gives margin 0. Groups of one and all-equal groups get A = 0 exactly.
// A is broadcast to the completion tokens of each sequence.
#include <rl/sdk/advantage.hpp>

namespace {

using namespace rl::sdk::advantage;

class GrpoPassK : public rl::sdk::Advantage {
public:
    explicit GrpoPassK(rl::sdk::Params &p)
        : norm_by_std_(p.boolean("norm_by_std", true)), eps_(p.number("eps", 1e-6, 0.0)),
          unbiased_(p.boolean("std_unbiased", true)) {}

    void compute(Call &call, const AdvantageBatch &b) override {
        check_inputs(b, {"loss_mask"});
        const std::vector<uint8_t> mask = read_mask(b);
        const std::vector<double> rewards = b.rewards.to_vector();
        const auto groups = group_members(b.group_ids);

        std::vector<double> seq_adv(rewards.size(), 0.0);
        size_t singleton = 0, zero_std = 0;
        for (const auto &members : groups) {
            std::vector<double> r;
            for (int64_t i : members) r.push_back(rewards[static_cast<size_t>(i)]);
            if (r.size() == 1) {
                ++singleton;
                continue;
            }
            if (all_equal(r)) {
                ++zero_std;
                continue;
            }
            size_t best = 0;
            for (size_t k = 1; k < r.size(); ++k)
                if (r[k] > r[best]) best = k;
            double second = -std::numeric_limits<double>::infinity();
            for (size_t k = 0; k < r.size(); ++k)
                if (k != best) second = std::max(second, r[k]);
            double a = r[best] - second;
            if (norm_by_std_) a /= std_of(r, unbiased_) + eps_;
            seq_adv[static_cast<size_t>(members[best])] = a;
        }

        const std::vector<double> adv = broadcast(seq_adv, b.cu_seqlens, mask);
        call.tensor("advantages", adv);
        emit_reward_summary(call, rewards, groups.size(), singleton, zero_std);
        emit_summary(call, rl::sdk::metrics::kAdv, adv, mask);
    }

private:
    bool norm_by_std_;
    double eps_;
    bool unbiased_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<GrpoPassK>(
    "org.rl.advantage.grpo_passk", "grpo_passk", "1.0.0",
    "pass@k: the best sample of each group gets (best - second best) / (group std + eps), the "
    "others 0"))
