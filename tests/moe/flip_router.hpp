// A router change that flips the top-k choice of a few tokens while keeping
// the weights of every replayed routing exact (norm_topk_prob): the routing
// replay (R3) tests' weight change (moe_test, moe_rollouts_test).
#pragma once

#include "rl/core/model.hpp"
#include "rl/core/moe.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

namespace rl::core::test {

// Moves the last layer's router of `m` so that expert e enters the top-k of a
// few tokens of the routing `recorded` [T, L_moe, K] (router logits `logits`
// [T, L_moe, E]) while the logits of the tokens that already route to e stay
// put: row e gains alpha * v^T W (v in the null space of those tokens'
// logits), which changes the logit of e at token t by alpha * (logits_t . v).
// With norm_topk_prob the other tokens' weights at their recorded experts stay
// exact. False when no such move exists.
inline bool flip_some_in_the_last_layer(CausalLM &m, const at::Tensor &recorded,
                                        const at::Tensor &logits,
                                        const at::Tensor &targets = at::Tensor()) {
    const int64_t K = m.config().num_experts_per_tok, E = m.config().num_experts;
    const int64_t last = recorded.size(1) - 1;
    const at::Tensor used = recorded.select(1, last); // [T, K]
    const at::Tensor lg = logits.select(1, last);     // [T, E]
    const at::Tensor counts = at::bincount(used.reshape({-1}), {}, E);
    const int64_t e = counts.argmin().item<int64_t>();
    const at::Tensor uses_e = used.eq(e).any(1);
    if (uses_e.sum().item<int64_t>() >= E - 1) return false;
    at::Tensor v;
    if (uses_e.any().item<bool>()) {
        const at::Tensor vh = std::get<2>(at::linalg_svd(lg.index({uses_e}), true));
        v = vh[E - 1]; // orthogonal to the rows of those tokens
    } else {
        v = at::randn({E}, at::kDouble);
    }
    const at::Tensor shift = at::mv(lg, v); // logit change of e per unit alpha
    // The alpha at which each other token's logit of e reaches its k-th best.
    const at::Tensor kth = std::get<0>(at::topk(lg, K, -1)).select(1, K - 1);
    at::Tensor need = (kth - lg.select(1, e)) / shift;
    need = at::where(uses_e.logical_not() & need.gt(0), need,
                     at::full_like(need, std::numeric_limits<double>::infinity()));
    // alpha past the first target token's (all tokens when no targets), short
    // of the next token's: a few tokens flip, most keep their routing.
    const at::Tensor first =
        (targets.defined() ? at::where(targets, need, at::full_like(need, INFINITY)) : need).min();
    if (!std::isfinite(first.item<double>())) return false;
    const at::Tensor later = at::where(need.gt(first), need, at::full_like(need, INFINITY)).min();
    const double alpha = std::isfinite(later.item<double>())
                             ? 0.5 * (first.item<double>() + later.item<double>())
                             : 1.5 * first.item<double>();
    {
        at::NoGradGuard g;
        at::Tensor w = m.model->layers[static_cast<size_t>(m.config().num_hidden_layers - 1)]
                           ->moe->gate->weight;
        w[e].add_((alpha * at::mv(w.to(at::kDouble).t(), v)).to(w.scalar_type()));
    }

    return true;
}

} // namespace rl::core::test
