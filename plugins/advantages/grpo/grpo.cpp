// plugins/advantages/grpo: group-relative advantages (GRPO; Dr.GRPO with
// norm_by_std: false). See docs/advantages.md.
//
//   A_i = (r_i - b_g) / (std_g + eps)   (norm_by_std: true)
//   A_i =  r_i - b_g                    (norm_by_std: false, Dr.GRPO)
//
// b_g is the group's mean reward, or its mean weighted by completion length
// (length_weighted_mean). std_g is the sample (std_unbiased, default) or
// population standard deviation of the group's rewards. Groups of one and
// groups whose rewards are all equal get A = 0 exactly. A_i is broadcast to
// the completion tokens of sequence i.
#include <rl/sdk/advantage.hpp>

namespace {

using namespace rl::sdk::advantage;

class Grpo : public rl::sdk::Advantage {
public:
    explicit Grpo(rl::sdk::Params &p)
        : norm_by_std_(p.boolean("norm_by_std", true)), eps_(p.number("eps", 1e-6, 0.0)),
          unbiased_(p.boolean("std_unbiased", true)),
          length_weighted_(p.boolean("length_weighted_mean", false)) {}

    void compute(Call &call, const AdvantageBatch &b) override {
        group_relative(
            call, b, [&](const auto &members, const auto &r, const auto &w, auto &seq_adv) {
                const double base = length_weighted_ ? weighted_mean(r, w) : mean_of(r);
                const double scale = norm_by_std_ ? 1.0 / (std_of(r, unbiased_) + eps_) : 1.0;
                for (size_t k = 0; k < members.size(); ++k)
                    seq_adv[static_cast<size_t>(members[k])] = (r[k] - base) * scale;
            });
    }

private:
    bool norm_by_std_;
    double eps_;
    bool unbiased_;
    bool length_weighted_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<Grpo>(
    "org.rl.advantage.grpo", "grpo", "1.0.0",
    "GRPO group-relative advantages: (r - group mean) / (group std + eps); Dr.GRPO with "
    "norm_by_std: false"))
