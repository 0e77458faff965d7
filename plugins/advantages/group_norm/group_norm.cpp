// plugins/advantages/group_norm: AReaL's masked normalization of given
// per-token advantages, within each group (grouped: true) or over the whole
// batch (grouped: false). See docs/advantages.md.
//
// For each group g (or the batch), over the completion tokens T_g of its
// sequences (loss_mask = 1):
//   A_t = (x_t - mean(x over T_g)) / (std(x over T_g) + eps)
// std is the population std (std_unbiased: false, AReaL's default) or the
// sample std. x is the input "advantages" (source: "advantages") or each
// sequence's reward broadcast to its completion tokens (source: "rewards").
// A T_g whose values are all equal gives exactly 0.
#include <rl/sdk/advantage.hpp>

namespace {

using namespace rl::sdk::advantage;

class GroupNorm : public rl::sdk::Advantage {
public:
    explicit GroupNorm(rl::sdk::Params &p)
        : grouped_(p.boolean("grouped", true)), norm_(StdNorm::read(p, 1e-5, false)),
          from_rewards_(p.choice("source", "advantages", {"advantages", "rewards"}) == "rewards") {}

    void compute(Call &call, const AdvantageBatch &b) override {
        if (from_rewards_)
            check_inputs(b, {"loss_mask"}, {}, "with source: rewards");
        else
            check_inputs(b, {"loss_mask", "advantages"}, {"advantages"});
        const std::vector<uint8_t> mask = read_mask(b);
        const std::vector<double> x = from_rewards_
                                          ? broadcast(b.rewards.to_vector(), b.cu_seqlens, mask)
                                          : read_tokens(b, "advantages");

        std::vector<std::vector<int64_t>> sets;
        if (grouped_) {
            sets = group_members(b.group_ids);
        } else {
            sets.emplace_back();
            for (int64_t s = 0; s < b.n_seqs(); ++s) sets.back().push_back(s);
        }

        std::vector<double> adv(x.size(), 0.0);
        size_t constant_sets = 0;
        for (const auto &members : sets) {
            std::vector<int64_t> tokens;
            std::vector<double> vals;
            for (int64_t s : members)
                for (int64_t t : masked_positions(b.cu_seqlens, mask, static_cast<size_t>(s))) {
                    tokens.push_back(t);
                    vals.push_back(x[static_cast<size_t>(t)]);
                }
            if (!vals.empty() && all_equal(vals)) ++constant_sets;
            const std::vector<double> norm = normalize(vals, norm_.eps, norm_.unbiased);
            for (size_t k = 0; k < tokens.size(); ++k)
                adv[static_cast<size_t>(tokens[k])] = norm[k];
        }

        call.tensor("advantages", adv);
        call.metric(rl::sdk::metrics::kGroups, static_cast<double>(sets.size()));
        call.metric(rl::sdk::metrics::kGroupsZeroStd, static_cast<double>(constant_sets));
        emit_summary(call, rl::sdk::metrics::kAdv, adv, mask);
    }

private:
    bool grouped_;
    StdNorm norm_;
    bool from_rewards_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<GroupNorm>(
    "org.rl.advantage.group_norm", "group_norm", "1.0.0",
    "AReaL grouped masked normalization of given advantages (global when grouped: false)"))
