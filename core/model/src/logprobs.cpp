#include "logprobs.hpp"

#include "fused_ops.hpp"
#include "rl/core/error.hpp"
#include "rl/core/torch_compat.hpp"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>

namespace rl::core {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor as_float(const at::Tensor &t) {
    return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat);
}

// A low-precision model on CUDA multiplies hidden states and the output
// embedding in their own dtype on the tensor cores, with float32 accumulation
// and float32 logits (compat::mm_float); everything else multiplies a float32
// copy of the weight. Everything after the product is float32 either way.
bool tensor_core_logits(const at::Tensor &hidden, const at::Tensor &weight) {
    const auto t = hidden.scalar_type();
    return hidden.is_cuda() && (t == at::kBFloat16 || t == at::kHalf) && weight.scalar_type() == t;
}

// The weight as the chunk products read it: itself (tensor-core path) or a
// float32 copy made once per pass.
at::Tensor product_weight(const at::Tensor &hidden, const at::Tensor &weight) {
    return tensor_core_logits(hidden, weight) ? weight : as_float(weight);
}

// Logits of one chunk: (h W^T) / temperature in fp32.
at::Tensor chunk_logits(const at::Tensor &h, const at::Tensor &w, double inv_temp) {
    at::Tensor z = compat::mm_float(h, w.t());
    if (inv_temp != 1.0) z.mul_(inv_temp);
    return z;
}

// Memory for the d logits of one group of chunks in the backward (see there).
constexpr int64_t kGroupBytes = int64_t{512} << 20;

struct ChunkedLogprobFn : public torch::autograd::Function<ChunkedLogprobFn> {
    static variable_list forward(AutogradContext *ctx, const at::Tensor &hidden,
                                 const at::Tensor &weight, const at::Tensor &labels, int64_t chunk,
                                 double inv_temp, bool want_entropy, int64_t ignore_index,
                                 bool want_lse) {
        const int64_t T = hidden.size(0);
        const at::Tensor w = product_weight(hidden, weight);
        at::Tensor valid = labels != ignore_index;
        at::Tensor safe_labels = at::where(valid, labels, at::zeros_like(labels));
        auto fopts = hidden.options().dtype(at::kFloat);
        at::Tensor lp = at::empty({T}, fopts);
        at::Tensor lse = at::empty({T}, fopts);
        // Unwanted outputs stay zero-filled (an autograd function returns
        // defined tensors); the caller drops them.
        at::Tensor ent = want_entropy ? at::empty({T}, fopts) : at::zeros({T}, fopts);
        at::Tensor lse_raw = want_lse ? at::empty({T}, fopts) : at::zeros({T}, fopts);
        for (int64_t s = 0; s < T; s += chunk) {
            const int64_t n = std::min(chunk, T - s);
            at::Tensor z = chunk_logits(hidden.narrow(0, s, n), w, inv_temp);
            if (fused::applies(z)) {
                // One read of the chunk's logits for every statistic.
                fused::logit_stats(z, safe_labels.narrow(0, s, n), ignore_index, inv_temp,
                                   lse.narrow(0, s, n), lp.narrow(0, s, n),
                                   want_entropy ? ent.narrow(0, s, n) : at::Tensor(),
                                   want_lse ? lse_raw.narrow(0, s, n) : at::Tensor());
                continue;
            }
            at::Tensor l = at::logsumexp(z, -1);
            lse.narrow(0, s, n).copy_(l);
            at::Tensor picked = z.gather(1, safe_labels.narrow(0, s, n).unsqueeze(1)).squeeze(1);
            lp.narrow(0, s, n).copy_(picked - l);
            if (want_entropy) {
                // H = lse - sum_j p_j z_j
                at::Tensor p = at::exp(z - l.unsqueeze(1));
                ent.narrow(0, s, n).copy_(l - (p * z).sum(-1));
            }
            // log Z of the raw logits z / inv_temp (the same chunk, no new matmul).
            if (want_lse)
                lse_raw.narrow(0, s, n).copy_(inv_temp == 1.0 ? l
                                                              : at::logsumexp(z / inv_temp, -1));
        }
        lp.masked_fill_(valid.logical_not(), 0.0);
        ctx->save_for_backward({hidden, weight, safe_labels, valid, lse,
                                want_entropy ? ent : at::Tensor(),
                                want_lse ? lse_raw : at::Tensor()});
        ctx->saved_data["chunk"] = chunk;
        ctx->saved_data["inv_temp"] = inv_temp;
        ctx->saved_data["entropy"] = want_entropy;
        ctx->saved_data["lse"] = want_lse;
        ctx->set_materialize_grads(false);
        return {lp, ent, lse_raw};
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        const auto saved = ctx->get_saved_variables();
        const at::Tensor &hidden = saved[0], &weight = saved[1], &labels = saved[2];
        const at::Tensor &valid = saved[3], &lse = saved[4], &ent = saved[5], &lse_raw = saved[6];
        const int64_t chunk = ctx->saved_data["chunk"].toInt();
        const double inv_temp = ctx->saved_data["inv_temp"].toDouble();
        const bool want_entropy = ctx->saved_data["entropy"].toBool();
        const bool want_lse = ctx->saved_data["lse"].toBool();
        at::Tensor g_lp = grads[0];
        at::Tensor g_ent = want_entropy && grads.size() > 1 ? grads[1] : at::Tensor();
        at::Tensor g_lse = want_lse && grads.size() > 2 ? grads[2] : at::Tensor();
        const bool need_h = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
        const int64_t T = hidden.size(0);
        const at::Tensor w = product_weight(hidden, weight);
        // The tensor-core path multiplies d logits in the model's dtype too.
        const bool low = w.scalar_type() != at::kFloat;
        at::Tensor grad_h = need_h ? at::empty_like(hidden) : at::Tensor();
        at::Tensor grad_w =
            need_w ? at::zeros(w.sizes(), w.options().dtype(at::kFloat)) : at::Tensor();
        if (g_lp.defined()) g_lp = (g_lp.to(at::kFloat) * valid.to(at::kFloat)).contiguous();
        if (g_ent.defined()) g_ent = g_ent.to(at::kFloat).contiguous();
        if (g_lse.defined()) g_lse = g_lse.to(at::kFloat).contiguous();
        // Tensor-core path: d W = sum over tokens of dz^T h, one product per
        // group of chunks (up to kGroupBytes of d logits) rather than one
        // per chunk, so the float32 [vocab, hidden] sum is added to a few
        // times instead of T / chunk times.
        at::Tensor group;
        int64_t group_start = 0;
        if (low && need_w) {
            const int64_t rows = std::max<int64_t>(
                1, kGroupBytes / (weight.size(0) * static_cast<int64_t>(w.element_size())) / chunk);
            if (rows > 1)
                group = at::empty({std::min(rows * chunk, T), weight.size(0)}, w.options());
        }
        // grad_h and grad_w from the d logits dz of tokens [s, s + n).
        auto accumulate = [&](const at::Tensor &dz, const at::Tensor &h, int64_t s, int64_t n) {
            if (low) {
                if (need_h) grad_h.narrow(0, s, n).copy_(compat::mm_float(dz, w));
                if (need_w && !group.defined()) grad_w.add_(compat::mm_float(dz.t(), h));
                if (group.defined() && (s + n - group_start == group.size(0) || s + n == T)) {
                    const int64_t k = s + n - group_start;
                    grad_w.add_(compat::mm_float(group.narrow(0, 0, k).t(),
                                                 hidden.narrow(0, group_start, k)));
                    group_start = s + n;
                }
            } else {
                if (need_h) grad_h.narrow(0, s, n).copy_(at::matmul(dz, w));
                if (need_w) grad_w.addmm_(dz.t(), as_float(h));
            }
        };
        for (int64_t s = 0; s < T; s += chunk) {
            const int64_t n = std::min(chunk, T - s);
            at::Tensor h = hidden.narrow(0, s, n);
            at::Tensor z = chunk_logits(h, w, inv_temp);
            if (fused::applies(z)) {
                // d logits in one pass over the chunk's logits, written in
                // the dtype of the products that read them.
                at::Tensor dzl = low && group.defined() ? group.narrow(0, s - group_start, n)
                                                        : at::empty(z.sizes(), w.options());
                auto rows = [&](const at::Tensor &t) {
                    return t.defined() ? t.narrow(0, s, n) : at::Tensor();
                };
                fused::logit_grad(z, labels.narrow(0, s, n), lse.narrow(0, s, n), rows(g_lp),
                                  rows(g_ent), g_ent.defined() ? rows(ent) : at::Tensor(),
                                  rows(g_lse), g_lse.defined() ? rows(lse_raw) : at::Tensor(),
                                  inv_temp, dzl);
                z = at::Tensor();
                accumulate(dzl, h, s, n);
                continue;
            }
            at::Tensor logp = z - lse.narrow(0, s, n).unsqueeze(1);
            at::Tensor p = at::exp(logp);
            // d lp_t / d z = onehot(label) - p
            at::Tensor dz;
            if (g_lp.defined()) {
                at::Tensor g = g_lp.narrow(0, s, n);
                dz = p * (-g).unsqueeze(1);
                dz.scatter_add_(1, labels.narrow(0, s, n).unsqueeze(1), g.unsqueeze(1));
            } else {
                dz = at::zeros_like(z);
            }
            // d H_t / d z_j = -p_j (log p_j + H_t)
            if (g_ent.defined()) {
                at::Tensor g = g_ent.narrow(0, s, n).to(at::kFloat).unsqueeze(1);
                dz = dz - g * p * (logp + ent.narrow(0, s, n).unsqueeze(1));
            }
            if (inv_temp != 1.0) dz.mul_(inv_temp); // d / d raw logits
            // d log Z_t / d raw logit_j = softmax(raw logits)_j
            if (g_lse.defined()) {
                at::Tensor g = g_lse.narrow(0, s, n).to(at::kFloat).unsqueeze(1);
                at::Tensor p_raw =
                    inv_temp == 1.0 ? p
                                    : at::exp(z / inv_temp - lse_raw.narrow(0, s, n).unsqueeze(1));
                dz = dz + g * p_raw;
            }
            // d logits in the model's dtype, written into the group buffer.
            if (low)
                dz = group.defined() ? group.narrow(0, s - group_start, n).copy_(dz)
                                     : dz.to(w.scalar_type());
            accumulate(dz, h, s, n);
        }
        if (need_w && grad_w.scalar_type() != weight.scalar_type())
            grad_w = grad_w.to(weight.scalar_type());
        return {grad_h,       grad_w,       at::Tensor(), at::Tensor(),
                at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
};

} // namespace

ChunkedLogprobs chunked_logprobs(const at::Tensor &hidden, const at::Tensor &weight,
                                 const at::Tensor &labels, int64_t chunk, double temperature,
                                 bool entropy, int64_t ignore_index, bool logsumexp) {
    check(hidden.dim() == 2, "logprobs: hidden states must be [tokens, hidden]");
    check(labels.dim() == 1 && labels.size(0) == hidden.size(0),
          "logprobs: labels must be [tokens] = [" + std::to_string(hidden.size(0)) + "], got " +
              std::to_string(labels.dim()) + "-D with " + std::to_string(labels.numel()) +
              " elements");
    check(labels.scalar_type() == at::kLong, "logprobs: labels must be int64");
    check(chunk > 0, "logprobs: chunk_tokens must be positive, got " + std::to_string(chunk));
    check(temperature > 0, "logprobs: temperature must be positive");
    const int64_t vocab = weight.size(0);
    if (labels.numel() > 0) {
        at::Tensor bad =
            (labels != ignore_index).logical_and(labels.lt(0).logical_or(labels.ge(vocab)));
        if (bad.any().item<bool>()) {
            const int64_t i = bad.nonzero()[0][0].item<int64_t>();
            throw Error("logprobs: labels[" + std::to_string(i) +
                        "] = " + std::to_string(labels[i].item<int64_t>()) +
                        " is outside the vocabulary [0, " + std::to_string(vocab) +
                        ") and is not ignore_index (" + std::to_string(ignore_index) + ")");
        }
    }
    variable_list out = ChunkedLogprobFn::apply(hidden, weight, labels, chunk, 1.0 / temperature,
                                                entropy, ignore_index, logsumexp);
    return {out[0], entropy ? out[1] : at::Tensor(), logsumexp ? out[2] : at::Tensor()};
}

} // namespace rl::core
