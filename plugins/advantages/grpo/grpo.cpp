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

#include <optional>

namespace {

using namespace rl::sdk::advantage;

class Grpo : public rl::sdk::Advantage {
public:
    explicit Grpo(rl::sdk::Params &p)
        : norm_by_std_(p.boolean("norm_by_std", true)), norm_(StdNorm::read(p, 1e-6, true)),
          length_weighted_(p.boolean("length_weighted_mean", false)) {
        const rl::sdk::json lp = p.raw("length_penalty");
        if (lp.is_null()) return;
        if (!lp.is_object())
            invalid(p.owner() +
                    ": parameter 'length_penalty' must be an object {num_output_tokens_weight, "
                    "num_input_tokens_weight, num_turns_weight} (or null for off), got " +
                    lp.dump());
        if (norm_by_std_ || length_weighted_)
            invalid(p.owner() +
                    ": parameter 'length_penalty' is prime-rl's shaping of r - group mean: it "
                    "needs 'norm_by_std': false and no 'length_weighted_mean'");
        rl::sdk::Params q(lp.dump(), p.owner() + ": parameter 'length_penalty'");
        LengthPenalty l;
        q.choice("type", "linear", {"linear"}); // prime-rl's only type
        l.output = q.number("num_output_tokens_weight", 0.25, 0.0);
        l.input = q.number("num_input_tokens_weight", 0.1, 0.0);
        l.turns = q.number("num_turns_weight", 0.1, 0.0);
        q.finish();
        penalty_ = l;
    }

    void compute(Call &call, const AdvantageBatch &b) override {
        if (penalty_) return length_penalized(call, b);
        group_relative(call, b,
                       [&](const auto &members, const auto &r, const auto &w, auto &seq_adv) {
                           const double base = length_weighted_ ? weighted_mean(r, w) : mean_of(r);
                           const double scale = norm_by_std_ ? 1.0 / norm_.divisor(r) : 1.0;
                           for (size_t k = 0; k < members.size(); ++k)
                               seq_adv[static_cast<size_t>(members[k])] = (r[k] - base) * scale;
                       });
    }

private:
    // prime-rl's linear length penalty (orchestrator/algo/grpo.py): per group with pass
    // rate p = mean reward and per-group maxima of output tokens (completion tokens),
    // input tokens (the sequence's other tokens) and turns,
    //   r'_i = r_i - p * (w_out out_i / max out + w_in in_i / max in + w_turns turns_i / max turns)
    //   A_i  = r'_i - mean(r')
    // Equal rewards still get advantages (shorter answers are preferred).
    void length_penalized(Call &call, const AdvantageBatch &b) const {
        check_inputs(b, {"loss_mask", "num_turns"}, {}, "with length_penalty");
        const std::vector<uint8_t> mask = read_mask(b);
        const std::vector<double> rewards = b.rewards.to_vector();
        const std::vector<double> out = completion_lengths(b.cu_seqlens, mask);
        const bool has_turns = b.tensors.has("num_turns");
        const std::vector<double> turns_tok = read_tokens(b, "num_turns");
        const size_t S = rewards.size();
        std::vector<double> in(S), turns(S, 1.0);
        for (size_t s = 0; s < S; ++s) {
            const int64_t first = b.cu_seqlens[s], last = b.cu_seqlens[s + 1];
            in[s] = double(last - first) - out[s];
            if (!has_turns || last == first) continue;
            turns[s] = turns_tok[static_cast<size_t>(first)];
            for (int64_t t = first; t < last; ++t)
                if (turns_tok[static_cast<size_t>(t)] != turns[s] || turns[s] < 0)
                    invalid("input 'num_turns' must hold one value >= 0 per sequence on all its "
                            "tokens; sequence " +
                            std::to_string(s) + " has " +
                            std::to_string(turns_tok[static_cast<size_t>(t)]) + " at token " +
                            std::to_string(t));
        }
        const LengthPenalty &l = *penalty_;
        std::vector<double> seq_adv(S, 0.0);
        const auto groups = group_members(b.group_ids);
        size_t singleton = 0, zero_std = 0;
        for (const auto &members : groups) {
            double max_out = 1, max_in = 1, max_turns = 1, pass = 0;
            std::vector<double> r;
            for (int64_t i : members) {
                const size_t k = static_cast<size_t>(i);
                max_out = std::max(max_out, out[k]);
                max_in = std::max(max_in, in[k]);
                max_turns = std::max(max_turns, turns[k]);
                pass += rewards[k];
                r.push_back(rewards[k]);
            }
            singleton += members.size() == 1;
            zero_std += members.size() > 1 && all_equal(r);
            pass /= double(members.size());
            std::vector<double> shaped;
            for (int64_t i : members) {
                const size_t k = static_cast<size_t>(i);
                shaped.push_back(rewards[k] -
                                 pass * (l.output * out[k] / max_out + l.input * in[k] / max_in +
                                         l.turns * turns[k] / max_turns));
            }
            const double m = mean_of(shaped);
            for (size_t j = 0; j < members.size(); ++j)
                seq_adv[static_cast<size_t>(members[j])] =
                    members.size() == 1 ? 0.0 : shaped[j] - m;
        }
        const std::vector<double> adv = broadcast(seq_adv, b.cu_seqlens, mask);
        call.tensor("advantages", adv);
        emit_reward_summary(call, rewards, groups.size(), singleton, zero_std);
        emit_summary(call, rl::sdk::metrics::kAdv, adv, mask);
    }

    struct LengthPenalty {
        double output, input, turns;
    };
    std::optional<LengthPenalty> penalty_;
    bool norm_by_std_;
    StdNorm norm_;
    bool length_weighted_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<Grpo>(
    "org.rl.advantage.grpo", "grpo", "1.0.0",
    "GRPO group-relative advantages: (r - group mean) / (group std + eps); Dr.GRPO with "
    "norm_by_std: false"))
