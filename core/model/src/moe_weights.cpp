#include "rl/core/text.hpp"
#include "rl/core/moe_weights.hpp"

#include "rl/core/error.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace rl::core {
namespace {

thread_local RoutingWeightsScope *tl_weights = nullptr;

} // namespace

RoutingWeightsScope::RoutingWeightsScope(at::Tensor weights)
    : weights_(std::move(weights)), previous_(tl_weights) {
    tl_weights = this;
}

RoutingWeightsScope::~RoutingWeightsScope() {
    tl_weights = previous_;
}

at::Tensor RoutingWeightsScope::current() {
    return tl_weights != nullptr ? tl_weights->weights_ : at::Tensor();
}

void check_routed_expert_weights(const at::Tensor &weights, const at::Tensor &experts,
                                 const std::string &what) {
    check(weights.defined(), what + " is an undefined tensor");
    check(experts.defined(), what + " (recorded routing weights) needs the routed expert ids "
                                    "they weigh (routed_experts)");
    check(at::isFloatingType(weights.scalar_type()),
          what + " must hold floating-point routing weights, got " +
              std::string(c10::toString(weights.scalar_type())));
    check(weights.sizes().equals(experts.sizes()),
          what + " must have the shape of routed_experts " + shape_text(experts.sizes()) +
              " (tokens, " + "sparse layers, experts per token), got " +
              shape_text(weights.sizes()));
    const at::Tensor w = weights.to(at::kCPU).to(at::kDouble).contiguous();
    const at::Tensor finite = at::isfinite(w);
    if (finite.all().item<bool>()) return;
    const int64_t at = at::nonzero(finite.logical_not().reshape({-1}))[0].item<int64_t>();
    const int64_t L = w.size(1), K = w.size(2);
    check(false, what + " at token " + std::to_string(at / (L * K)) + ", sparse layer " +
                     std::to_string(at / K % L) + ", slot " + std::to_string(at % K) + ": " +
                     std::to_string(w.reshape({-1})[at].item<double>()) +
                     " is not a finite weight");
}

at::Tensor routed_expert_weights_of(const std::vector<at::Tensor> &router_logits, int64_t top_k,
                                    bool norm_topk_prob) {
    check(!router_logits.empty(),
          "routed_expert_weights_of: no router logits (no sparse layer ran)");
    std::vector<at::Tensor> weights;
    for (const at::Tensor &l : router_logits) {
        at::Tensor v = std::get<0>(at::topk(at::softmax(l.detach(), -1, at::kFloat), top_k, -1));
        if (norm_topk_prob) v = v / v.sum(-1, /*keepdim=*/true);
        weights.push_back(v);
    }
    return at::stack(weights, 1).to(at::kCPU).to(at::kFloat).contiguous();
}

} // namespace rl::core
