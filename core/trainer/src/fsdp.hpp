// Fully sharded parameters (ZeRO-3) for the trainer's fsdp strategy.
//
// The model's weights are grouped into units: one per decoder layer, plus the
// root unit (embedding, final norm, output projection). Each unit's weights,
// flattened in float32 and padded to a multiple of W, are split into W equal
// shards; rank r keeps shard r as the float32 master that AdamW updates (its
// moments are therefore sharded too) and a float32 gradient shard.
//
// A unit's full weights exist only while it runs: gathered (all-gather of the
// shards, cast to the model's dtype) before the layer's forward and again
// before its recomputation in the backward (layers are always checkpointed),
// released after; after the layer's backward its gradients are summed over
// ranks and scattered (reduce-scatter) into the gradient shards. The root unit
// stays gathered for one micro-batch. Between optimizer steps the engine and
// checkpoints ask for the whole model (materialize): every unit is gathered
// until the next training pass.
//
// Every collective runs in the same order on every rank, so the trainer runs
// the same number of micro-batches on every rank (padding with empty ones).
#pragma once

#include "rl/core/dist.hpp"
#include "rl/core/model.hpp"

#include <ATen/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace rl::core {

class Fsdp : public WeightHooks {
public:
    struct Unit {
        std::vector<size_t> params;  ///< indices into the trainer's parameter list
        std::vector<int64_t> offset; ///< of each parameter in the flat unit
        int64_t numel = 0;           ///< real elements
        int64_t shard = 0;           ///< elements per rank (padded)
        at::Tensor master;           ///< float32 [shard]: the optimizer's tensor
        at::Tensor grad;             ///< float32 [shard], undefined until a backward
        bool gathered = true;
    };

    /// Takes the full weights (equal on every rank after a broadcast from
    /// rank 0) and keeps this rank's shards; the weights stay materialized.
    Fsdp(CausalLM &model, const std::vector<std::pair<std::string, at::Tensor>> &params,
         std::shared_ptr<dist::Group> group);
    ~Fsdp() override;

    void before_layer(size_t layer, bool backward) override;
    void after_layer(size_t layer, bool backward) override;
    void materialize() override;

    /// Starts a training pass (releases everything) or a scoring pass (keeps
    /// materialized weights when they are).
    void begin_pass(bool backward);
    void begin_micro_batch();
    void end_micro_batch(bool backward);
    /// After an optimizer step: the full weights are stale.
    void invalidate();

    std::vector<Unit> &units() { return units_; }
    const dist::Group &group() const { return *group_; }
    /// Full float32 tensor of parameter `index` built from every rank's shard
    /// of `per_unit(u)` (masters, or optimizer moments): collective.
    std::vector<at::Tensor> gather_full(const std::vector<at::Tensor> &per_unit);
    /// This rank's shard of unit u from full per-parameter tensors.
    at::Tensor shard_of(size_t u, const std::vector<at::Tensor> &full_by_param) const;
    /// The whole shape of parameter `index` (its tensor is empty while released).
    const std::vector<int64_t> &shape_of(size_t index) const { return shapes_[index]; }
    /// Bytes this rank holds for masters and gradient shards.
    int64_t shard_bytes() const;

private:
    void gather(Unit &u);
    void release(Unit &u);
    void reduce_grads(Unit &u);
    Unit &root() { return units_.back(); }
    int64_t numel_of(size_t i) const;

    CausalLM &model_;
    std::vector<at::Tensor> params_; ///< the model's parameter variables
    std::vector<std::vector<int64_t>> shapes_;
    std::shared_ptr<dist::Group> group_;
    std::vector<Unit> units_; ///< layers 0..L-1, then the root
    bool materialized_ = true;
    bool in_backward_pass_ = false;
};

} // namespace rl::core
