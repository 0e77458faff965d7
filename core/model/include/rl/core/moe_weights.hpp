// Recorded routing weights (R3 with weights; xorl's routed_expert_logits,
// xorl-sglang's expert_logits): the top-k weights an engine mixed each
// token's experts with, recorded next to the expert ids and replayed by the
// trainer in place of the current router's. docs/model.md "Routing replay".
#pragma once

#include "rl/core/config.hpp"

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace rl::core {

/// While alive, a training or scoring forward (no KV cache) that replays a
/// routing (RoutingReplayScope, moe.hpp) on the constructing thread mixes the
/// replayed experts' outputs with `weights`: float [T, L_moe, K], the same
/// shape as the replayed ids, token t's weight of its k-th replayed expert in
/// each sparse layer. The weights are taken as recorded (not renormalized)
/// and are constants: no gradient reaches the router through them (its
/// logits still feed the router losses). A row whose ids are -1 (route
/// yourself) ignores its weights. A checkpointed layer recomputes with the
/// weights of its forward. Nested scopes: the innermost applies.
class RoutingWeightsScope {
public:
    explicit RoutingWeightsScope(at::Tensor weights);
    ~RoutingWeightsScope();
    RoutingWeightsScope(const RoutingWeightsScope &) = delete;
    RoutingWeightsScope &operator=(const RoutingWeightsScope &) = delete;

    /// The weights of the scope active on this thread; undefined when none.
    static at::Tensor current();

private:
    at::Tensor weights_;
    RoutingWeightsScope *previous_;
};

/// Checks recorded weights against the replayed ids `experts` (checked
/// already, check_routed_experts): a floating-point tensor of the same shape
/// [T, L_moe, K], every value finite. Errors name `what`, and for a value the
/// token, sparse layer and slot.
void check_routed_expert_weights(const at::Tensor &weights, const at::Tensor &experts,
                                 const std::string &what);

/// The weights a routing mixed its experts with, from the router logits of
/// every sparse layer ([T, E] each, as RouterLogitsRecorder collects them):
/// float32 [T, L_moe, K] on the CPU, the top-k softmax probabilities in
/// routed_experts_of's order, renormalized over the k when `norm_topk_prob`
/// (SparseMoeBlock::route's weights).
at::Tensor routed_expert_weights_of(const std::vector<at::Tensor> &router_logits, int64_t top_k,
                                    bool norm_topk_prob);

} // namespace rl::core
