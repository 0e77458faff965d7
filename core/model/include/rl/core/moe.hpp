// Sparse mixture-of-experts blocks of Qwen2-MoE and Qwen3-MoE (docs/model.md):
// a router (top-k of a softmax over the experts), SwiGLU experts, and for
// Qwen2-MoE a shared expert with a sigmoid gate. Parameters carry the names
// the Hugging Face checkpoints store: mlp.gate.weight,
// mlp.experts.E.{gate,up,down}_proj.weight, mlp.shared_expert.*,
// mlp.shared_expert_gate.weight. Also the router losses of transformers
// (load-balancing auxiliary loss, router z-loss).
#pragma once

#include "rl/core/config.hpp"
#include "rl/core/model.hpp"

#include <ATen/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rl::core {

class LoraAdapter;

/// A LoRA adapter on the experts of one sparse block (lora.hpp): each expert
/// (and the shared expert) computes W x + s B A x on its gate_proj, up_proj
/// and down_proj where the adapter has a pair.
struct ExpertLora {
    const LoraAdapter *adapter = nullptr;
    size_t layer = 0;                     ///< the block's decoder layer
    std::optional<uint64_t> dropout_seed; ///< set in a training forward with dropout
};

/// The routing of a batch of tokens through one sparse block.
struct MoeRouting {
    at::Tensor logits;  ///< [T, E] router logits (float32 when config.router_fp32)
    at::Tensor weights; ///< [T, K] the chosen experts' weights (renormalized when norm_topk_prob)
    at::Tensor experts; ///< [T, K] int64 expert ids, by decreasing probability
};

/// Expert parallelism (docs/distributed.md): the experts of every sparse
/// block split over shards() ranks, rank shard() holding experts
/// [shard() * E / shards(), (shard() + 1) * E / shards()). While active(), a
/// training or scoring forward (not decoding) sends each token's rows to the
/// ranks that hold its experts and gets their outputs back, differentiably
/// (the backward runs the inverse exchanges). Every rank of the exchange runs
/// the same sparse layers in the same order.
class ExpertExchange {
public:
    virtual ~ExpertExchange() = default;
    virtual int64_t shards() const = 0;
    virtual int64_t shard() const = 0;
    virtual bool active() const = 0;
    /// Rows of `in` to every rank (in_rows[r] rows to rank r, in rank order);
    /// returns the rows every rank sent here (out_rows[r] from rank r, in
    /// rank order). A collective of the ranks that share the experts.
    virtual at::Tensor all_to_all(const at::Tensor &in, const std::vector<int64_t> &in_rows,
                                  const std::vector<int64_t> &out_rows) = 0;
};

class SparseMoeBlock : public torch::nn::Module {
public:
    SparseMoeBlock(const ModelConfig &c, const ModelOptions &o);

    /// Router logits, softmax (float32), top-k and renormalization of x [T, hidden].
    MoeRouting route(const at::Tensor &x) const;
    /// The block's output for x [T, hidden] under `routing`: the experts'
    /// outputs weighted and summed per token, plus the gated shared expert.
    /// `decoding`: a few rows of a decoding step (the row kernel where it applies).
    /// `lora`: the adapter on the experts, when one is selected.
    at::Tensor mix(const at::Tensor &x, const MoeRouting &routing, bool decoding = false,
                   const ExpertLora *lora = nullptr) const;
    /// Routing replay (R3): the router's logits and softmax of x [T, hidden]
    /// as in route, but token t goes to the experts `experts`[t] ([T, K]
    /// integer ids, a row of -1: the token routes itself), weighted by the
    /// softmax probabilities at those ids (renormalized over the k when
    /// norm_topk_prob), as Megatron's router replay (verl R3) weighs them.
    MoeRouting replay(const at::Tensor &x, const at::Tensor &experts) const;
    /// route (or replay when `replay_experts` [T, K] is defined) + mix; the
    /// routing goes to `routing_out` when given, and its logits to the
    /// RouterLogitsRecorder of this thread when one is active.
    at::Tensor forward(const at::Tensor &x, bool decoding = false,
                       MoeRouting *routing_out = nullptr,
                       const at::Tensor &replay_experts = at::Tensor(),
                       const ExpertLora *lora = nullptr) const;

    std::shared_ptr<Linear> gate; ///< router, weight [E, hidden], no bias
    torch::nn::ModuleList experts_list;
    std::vector<std::shared_ptr<MLP>> experts;
    /// Expert parallelism: set by an expert-parallel trainer (null: every
    /// expert runs here). Only the experts of this rank's shard then train.
    std::shared_ptr<ExpertExchange> exchange;
    std::shared_ptr<MLP> shared_expert;         ///< Qwen2-MoE, else null
    std::shared_ptr<Linear> shared_expert_gate; ///< Qwen2-MoE [1, hidden], else null
    int64_t num_experts = 0, top_k = 0;
    int64_t moe_index = 0; ///< the block's position among the model's sparse layers
    bool norm_topk_prob = false, router_fp32 = true;

private:
    /// mix over an active exchange: the (token, slot) rows sorted by expert
    /// (`order`, `counts` per expert) go to the experts' ranks and back.
    at::Tensor mix_exchanged(const at::Tensor &xs, const at::Tensor &counts) const;
};

/// While alive, every sparse block that runs on the constructing thread
/// appends its router logits [T, E] (differentiable unless the layer was
/// run without autograd, e.g. under activation checkpointing) in layer order.
/// Nested recorders: the innermost records.
class RouterLogitsRecorder {
public:
    RouterLogitsRecorder();
    ~RouterLogitsRecorder();
    RouterLogitsRecorder(const RouterLogitsRecorder &) = delete;
    RouterLogitsRecorder &operator=(const RouterLogitsRecorder &) = delete;

    const std::vector<at::Tensor> &logits() const { return logits_; }
    void add(const at::Tensor &logits) { logits_.push_back(logits); }
    /// The recorder active on this thread, or null.
    static RouterLogitsRecorder *current();

private:
    std::vector<at::Tensor> logits_;
    RouterLogitsRecorder *previous_;
};

/// While alive, every training or scoring forward (no KV cache) run on the
/// constructing thread replays `experts`: int64 [T, L_moe, K], for each of
/// the forward's T packed tokens the K expert ids every sparse layer (in
/// layer order, L_moe of them) routes it to; a token whose K ids of a layer
/// are all -1 routes itself in that layer. A checkpointed layer recomputes
/// with the replay of its forward. Nested scopes: the innermost applies.
class RoutingReplayScope {
public:
    explicit RoutingReplayScope(at::Tensor experts);
    ~RoutingReplayScope();
    RoutingReplayScope(const RoutingReplayScope &) = delete;
    RoutingReplayScope &operator=(const RoutingReplayScope &) = delete;

    /// The replayed ids of the scope active on this thread; undefined when none.
    static at::Tensor current();

private:
    at::Tensor experts_;
    RoutingReplayScope *previous_;
};

/// The experts a routing chose from the router logits of every sparse layer
/// (as RouterLogitsRecorder collects them, [T, E] each): int64 [T, L_moe, K]
/// on the CPU, the top-k of each layer's softmax as SparseMoeBlock::route
/// picks them.
at::Tensor routed_experts_of(const std::vector<at::Tensor> &router_logits, int64_t top_k);

/// Checks a routing to replay for a model: `experts` must be an integer
/// tensor [T, L_moe, K] (T tokens, L_moe = the model's sparse layers, K =
/// num_experts_per_tok), every id in [0, num_experts) or a whole row of -1.
/// Errors name `what`, the token, the sparse layer and its decoder layer.
void check_routed_experts(const at::Tensor &experts, int64_t T, const ModelConfig &c,
                          const std::string &what);

/// transformers' load_balancing_loss_func (Switch Transformer eq. 4-6) over
/// the router logits of every sparse layer ([T, E] each, the same T rows):
/// E * sum_e f_e * P_e with f_e the share of top-k assignments to expert e
/// and P_e its mean router probability, both pooled over layers and tokens.
/// `mask` [T] (1 counts a token, 0 drops it; undefined: all count) is
/// transformers' attention_mask. A float32 scalar, differentiable through P.
at::Tensor load_balancing_loss(const std::vector<at::Tensor> &router_logits, int64_t num_experts,
                               int64_t top_k, const at::Tensor &mask = at::Tensor());

/// Router z-loss (ST-MoE; transformers' router_z_loss_func): the mean over
/// layers and counted tokens of logsumexp(router logits)^2. float32 scalar.
at::Tensor router_z_loss(const std::vector<at::Tensor> &router_logits,
                         const at::Tensor &mask = at::Tensor());

/// The router statistics of several processes' tokens pooled (expert
/// parallelism): `counts` (from router_assignment_counts, summed over the
/// ranks) holds, per expert, its top-k assignments over every layer and rank,
/// then the rows (tokens x layers) of every rank. Returns this rank's part of
/// transformers' load-balancing loss of the pooled tokens: E * sum_e f_e *
/// P_e(local) with f_e the pooled share of assignments and P_e(local) this
/// rank's router probabilities summed over its rows, divided by the pooled
/// rows; the parts of all ranks add up to the loss of all tokens pooled in one
/// process, and so do their gradients. float32 scalar.
at::Tensor load_balancing_loss_part(const std::vector<at::Tensor> &router_logits,
                                    int64_t num_experts, int64_t top_k,
                                    const at::Tensor &pooled_counts);
/// This rank's part of the router z-loss of the pooled tokens: the sum over
/// its layers and rows of logsumexp^2, divided by the pooled rows.
at::Tensor router_z_loss_part(const std::vector<at::Tensor> &router_logits, double pooled_rows);
/// float64 [E + 1] on the CPU: the top-k assignments of each expert over the
/// layers of `router_logits`, then the rows (tokens x layers).
at::Tensor router_assignment_counts(const std::vector<at::Tensor> &router_logits,
                                    int64_t num_experts, int64_t top_k);

} // namespace rl::core
