// plugins/advantages/rloo: REINFORCE leave-one-out. See docs/advantages.md.
//
//   A_i = r_i - b_{-i},   b_{-i} = mean of the other rewards of i's group
//
// With length_weighted_mean the baseline is the completion-length-weighted mean
// of the other members (the plain leave-one-out mean when their lengths are
// all 0). Groups of one and all-equal groups get A = 0 exactly. A_i is
// broadcast to the completion tokens of sequence i.
#include <rl/sdk/advantage.hpp>

namespace {

using namespace rl::sdk::advantage;

class Rloo : public rl::sdk::Advantage {
public:
    explicit Rloo(rl::sdk::Params &p)
        : length_weighted_(p.boolean("length_weighted_mean", false)) {}

    void compute(Call &call, const AdvantageBatch &b) override {
        group_relative(call, b,
                       [&](const auto &members, const auto &r, const auto &w, auto &seq_adv) {
                           const size_t n = members.size();
                           double sum_r = 0.0, sum_w = 0.0, sum_wr = 0.0;
                           for (size_t k = 0; k < n; ++k) {
                               sum_r += r[k];
                               sum_w += w[k];
                               sum_wr += w[k] * r[k];
                           }
                           for (size_t k = 0; k < n; ++k) {
                               double base = (sum_r - r[k]) / static_cast<double>(n - 1);
                               if (length_weighted_ && sum_w - w[k] > 0.0)
                                   base = (sum_wr - w[k] * r[k]) / (sum_w - w[k]);
                               seq_adv[static_cast<size_t>(members[k])] = r[k] - base;
                           }
                       });
    }

private:
    bool length_weighted_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<Rloo>("org.rl.advantage.rloo", "rloo", "1.0.0",
                                       "RLOO: reward minus the mean of the other rewards of "
                                       "its group"))
