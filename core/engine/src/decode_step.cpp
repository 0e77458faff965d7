// The one decoding step of core/engine (decode_step.hpp).
#include "decode_step.hpp"

#include "routing.hpp"

#include "rl/core/error.hpp"
#include "rl/core/moe.hpp"
#include "rl/core/moe_weights.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace rl::core::detail {

std::vector<Sequence> start_samples(const std::vector<std::vector<int64_t>> &prompts,
                                    const SamplingParams &params,
                                    const std::vector<int64_t> &stop_ids, uint64_t seed,
                                    int64_t first_sample, int64_t end_sample, int64_t context_limit,
                                    const std::shared_ptr<const Tokenizer> &tokenizer,
                                    const ModelConfig &config) {
    std::vector<Sequence> seqs(static_cast<size_t>(end_sample - first_sample));
    for (int64_t s = first_sample; s < end_sample; ++s) {
        Sequence &q = seqs[static_cast<size_t>(s - first_sample)];
        q.params = &params;
        q.stop_ids = &stop_ids;
        q.seed = seed;
        q.prompt = s / params.n;
        q.sample = s % params.n;
        q.prompt_len = static_cast<int64_t>(prompts[static_cast<size_t>(q.prompt)].size());
        q.context_limit = context_limit;
        if (params.return_routed_experts) {
            q.routed_width = sparse_layers(config) * config.num_experts_per_tok;
            q.record_weights = params.return_expert_logits;
        }
        q.text.emplace(tokenizer, params.stop);
    }
    return seqs;
}

std::vector<Draw> draw_next(const at::Tensor &logits, const std::vector<Sequence *> &seqs) {
    check(logits.dim() == 2 && logits.size(0) == static_cast<int64_t>(seqs.size()),
          "draw_next: one row of logits per sequence");
    // Rows sharing temperature / top-k / top-p are sampled together.
    std::map<std::tuple<double, int64_t, double>, std::vector<size_t>> groups;
    for (size_t i = 0; i < seqs.size(); ++i) {
        const SamplingParams &p = *seqs[i]->params;
        groups[{p.temperature, p.top_k, p.top_p}].push_back(i);
    }
    std::vector<Draw> out(seqs.size());
    for (const auto &[key, rows] : groups) {
        at::Tensor rows_logits = logits; // one group: every row, in order
        if (rows.size() != seqs.size()) {
            at::Tensor sel = at::empty({static_cast<int64_t>(rows.size())}, at::kLong);
            std::copy(rows.begin(), rows.end(), sel.data_ptr<int64_t>());
            rows_logits = logits.index_select(0, sel.to(logits.device()));
        }
        const at::Tensor lp = sampling_logprobs(rows_logits, *seqs[rows.front()]->params);
        std::vector<double> u;
        u.reserve(rows.size());
        for (size_t row : rows) {
            const Sequence &s = *seqs[row];
            u.push_back(sampling_uniform(s.seed, s.prompt, s.sample, s.drawn));
        }
        const auto picks = draw_tokens(lp, u);
        int64_t want_top = 0;
        for (size_t row : rows) want_top = std::max(want_top, seqs[row]->top_logprobs);
        at::Tensor top_v, top_i;
        if (want_top > 0) {
            auto [v, i] = lp.topk(std::min(want_top, lp.size(1)), 1);
            top_v = v.to(at::kCPU).to(at::kFloat).contiguous();
            top_i = i.to(at::kCPU).contiguous();
        }
        for (size_t k = 0; k < rows.size(); ++k) {
            Draw &d = out[rows[k]];
            d.token = picks[k].first;
            d.logprob = picks[k].second;
            const int64_t want = seqs[rows[k]]->top_logprobs;
            for (int64_t j = 0; j < want && top_v.defined() && j < top_v.size(1); ++j) {
                const float v = top_v[static_cast<int64_t>(k)][j].item<float>();
                if (!std::isfinite(v)) break;
                d.top.emplace_back(top_i[static_cast<int64_t>(k)][j].item<int64_t>(), v);
            }
        }
    }
    return out;
}

std::optional<End> accept(Sequence &seq, const Draw &draw) {
    const int64_t token = draw.token;
    seq.tokens.push_back(token);
    seq.logprobs.push_back(draw.logprob);
    ++seq.drawn;
    const std::vector<int64_t> &stop_ids = *seq.stop_ids;
    if (std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end())
        return End{FinishReason::Stop, seq.text->finish()};
    if (seq.text->push(token)) return End{FinishReason::Stop, seq.text->cut()};
    const auto turn = static_cast<int64_t>(seq.tokens.size() - seq.turn_start);
    const int64_t used = seq.prompt_len + static_cast<int64_t>(seq.tokens.size());
    if (turn >= seq.params->max_tokens || (seq.context_limit > 0 && used >= seq.context_limit))
        return End{FinishReason::Length, seq.text->finish()};
    return std::nullopt;
}

std::vector<std::optional<End>> step(const at::Tensor &logits,
                                     const std::vector<Sequence *> &seqs) {
    const std::vector<Draw> draws = draw_next(logits, seqs);
    std::vector<std::optional<End>> ends;
    ends.reserve(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) ends.push_back(accept(*seqs[i], draws[i]));
    return ends;
}

ForwardRouting::ForwardRouting(const std::vector<at::Tensor> &router_logits,
                               const ModelConfig &config, bool weights) {
    const int64_t k = config.num_experts_per_tok;
    ids_ = routed_experts_of(router_logits, k);
    rows_ = ids_.size(0);
    width_ = ids_.size(1) * ids_.size(2);
    if (weights) weights_ = routed_expert_weights_of(router_logits, k, config.norm_topk_prob);
}

void ForwardRouting::append(Sequence &seq, int64_t from, int64_t n) const {
    if (seq.routed_width == 0) return;
    check(seq.routed_width == width_ && from >= 0 && n >= 0 && from + n <= rows_,
          "routing: rows [" + std::to_string(from) + ", " + std::to_string(from + n) +
              ") of a forward of " + std::to_string(rows_) + " rows of " + std::to_string(width_) +
              " ids asked for a sequence of rows of " + std::to_string(seq.routed_width));
    const int64_t *p = ids_.data_ptr<int64_t>();
    seq.routed.insert(seq.routed.end(), p + from * width_, p + (from + n) * width_);
    if (!seq.record_weights) return;
    check(weights_.defined(), "routing: the expert weights of this forward were not kept");
    const float *q = weights_.data_ptr<float>();
    seq.routed_weights.insert(seq.routed_weights.end(), q + from * width_, q + (from + n) * width_);
}

void ForwardRouting::append_in_order(const std::vector<Sequence *> &seqs,
                                     const std::vector<int64_t> *counts,
                                     const std::vector<uint8_t> *restart) const {
    int64_t at_row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
        Sequence &seq = *seqs[i];
        const int64_t n = counts != nullptr ? (*counts)[i] : 1;
        if (restart != nullptr && (*restart)[i] != 0) {
            seq.routed.clear();
            seq.routed_weights.clear();
        }
        append(seq, at_row, n);
        at_row += n;
    }
    check(at_row == rows_, "routing: a forward's routing (" + std::to_string(rows_) +
                               " rows) does not cover its tokens (" + std::to_string(at_row) + ")");
}

void pad_unread_routing(Sequence &seq) {
    if (seq.routed_width == 0) return;
    const size_t want = static_cast<size_t>(seq.prompt_len) + seq.tokens.size();
    seq.routed.resize(want * static_cast<size_t>(seq.routed_width), -1);
    if (seq.record_weights)
        seq.routed_weights.resize(want * static_cast<size_t>(seq.routed_width), 0.0f);
}

at::Tensor long_tensor(const std::vector<int64_t> &ids) {
    at::Tensor t = at::empty({static_cast<int64_t>(ids.size())}, at::kLong);
    std::copy(ids.begin(), ids.end(), t.data_ptr<int64_t>());
    return t;
}

} // namespace rl::core::detail
