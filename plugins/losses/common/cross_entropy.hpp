// plugins/losses/common/cross_entropy.hpp: next-token cross-entropy over label
// tokens, shared by causallm_loss and per_token_ce.
#pragma once

#include "loss_common.hpp"

namespace rl::losses {

class CrossEntropy : public LossPlugin {
public:
    CrossEntropy(Params &p, bool per_token_outputs) : per_token_(per_token_outputs) {
        ignore_index_ = p.integer("ignore_index", -100);
        agg_ = Aggregation::read(p);
    }

    LossSignature signature() const override {
        return {{"logprobs", "labels"}, {"loss_mask"}, {"logprobs"}};
    }

    // l_t = -logprobs_t on tokens with a label (labels != ignore_index) and loss_mask 1.
    Result evaluate(const Data &d, const Data &) const override {
        Result r;
        const auto w = agg_.weights(d);
        const auto &lp = d.at("logprobs");
        auto &g = r.g("logprobs", d.n);
        Stat nll;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            r.loss += -w[t] * lp[t];
            g[t] = -w[t];
            nll.add(-lp[t]);
        }
        r.metric("valid_tokens", double(d.loss_tokens));
        r.metric("perplexity", std::exp(nll.mean()));
        if (per_token_) {
            std::vector<double> out_lp(static_cast<size_t>(d.n), 0.0), out_loss(out_lp);
            for (int64_t t = 0; t < d.n; ++t) {
                if (d.mask[t] == 0) continue;
                out_lp[t] = lp[t];
                out_loss[t] = -lp[t];
            }
            r.tensors.emplace_back("logprobs", std::move(out_lp));
            r.tensors.emplace_back("elementwise_loss", std::move(out_loss));
        }
        return r;
    }

protected:
    ReadOptions read_options() const override { return {true, ignore_index_}; }

private:
    bool per_token_;
    int64_t ignore_index_ = -100;
    Aggregation agg_;
};

} // namespace rl::losses
