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
        : norm_by_std_(p.boolean("norm_by_std", true)), norm_(StdNorm::read(p, 1e-6, true)) {}

    void compute(Call &call, const AdvantageBatch &b) override {
        group_relative(call, b,
                       [&](const auto &members, const auto &r, const auto &, auto &seq_adv) {
                           size_t best = 0;
                           for (size_t k = 1; k < r.size(); ++k)
                               if (r[k] > r[best]) best = k;
                           double second = -std::numeric_limits<double>::infinity();
                           for (size_t k = 0; k < r.size(); ++k)
                               if (k != best) second = std::max(second, r[k]);
                           double a = r[best] - second;
                           if (norm_by_std_) a /= norm_.divisor(r);
                           seq_adv[static_cast<size_t>(members[best])] = a;
                       });
    }

private:
    bool norm_by_std_;
    StdNorm norm_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<GrpoPassK>(
    "org.rl.advantage.grpo_passk", "grpo_passk", "1.0.0",
    "pass@k: the best sample of each group gets (best - second best) / (group std + eps), the "
    "others 0"))
