// Expert parallelism for the trainer (trainer.expert_parallel = N,
// docs/distributed.md): the experts of every sparse MoE block are split over
// N ranks. The W ranks form W / N expert groups of N consecutive ranks
// (ranks g*N .. g*N + N - 1); rank r holds shard r % N of the experts, i.e.
// experts [s * E/N, (s + 1) * E/N) of every sparse layer. Within an expert
// group the tokens' rows travel to the experts' ranks and back by
// all-to-all (SparseMoeBlock's ExpertExchange). Ranks holding the same
// shard in different expert groups ("replicas", ranks s, s + N, ...) sum
// their experts' gradients; with N = W there are none.
//
// Only the experts of this rank's shard train here (gradients, masters,
// AdamW moments); every rank keeps all expert weights for the rollout
// engine, refreshed after each optimizer step from the experts' ranks.
#pragma once

#include "rl/core/dist.hpp"
#include "rl/core/model.hpp"
#include "rl/core/moe.hpp"

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rl::core {

class ExpertParallel {
public:
    /// Installs the exchange on every sparse block of `model`; `world` is the
    /// whole group (W ranks), `shards` = N divides W and num_experts.
    ExpertParallel(CausalLM &model, std::shared_ptr<dist::Group> world, int64_t shards);
    ~ExpertParallel();
    ExpertParallel(const ExpertParallel &) = delete;
    ExpertParallel &operator=(const ExpertParallel &) = delete;

    int64_t shards() const { return shards_; }
    int64_t shard() const { return shard_; }
    /// The ranks of this rank's expert group (the all-to-all).
    dist::Group &experts_group() { return *experts_group_; }
    /// The ranks holding this rank's shard (null when N = W).
    dist::Group *replicas() { return replicas_.get(); }

    /// Whether `p` is an expert weight, and whether this rank's shard holds
    /// it (true for a weight that is not an expert's: replicated).
    bool is_expert(const at::Tensor &p) const;
    bool owns(const at::Tensor &p) const;

    /// While alive, the sparse blocks exchange their rows (training and
    /// scoring passes of the trainer).
    class Active {
    public:
        explicit Active(ExpertParallel *ep);
        ~Active();
        Active(const Active &) = delete;
        Active &operator=(const Active &) = delete;

    private:
        ExpertParallel *ep_;
    };

    /// Every rank's experts get the weights their shard's ranks hold (after
    /// an optimizer step): an all-gather within the expert group.
    void refresh_experts();

    /// The optimizer state of one expert weight (step -1: none yet).
    struct State {
        at::Tensor exp_avg, exp_avg_sq, master; ///< float32, the weight's shape
        int64_t step = -1;
    };
    /// The state of every expert weight of the model, by name, gathered from
    /// the shards (`mine` gives it for a weight this rank owns; masters only
    /// `with_master`). A collective of the expert group, block by block.
    std::vector<std::pair<std::string, State>>
    gather_state(const std::function<State(const at::Tensor &weight)> &mine, bool with_master);

private:
    class Exchange;
    struct Weight {
        std::string name;
        at::Tensor tensor;
        int64_t shard;
        int64_t block; ///< sparse block (its weights are contiguous here)
    };
    CausalLM &model_;
    std::shared_ptr<dist::Group> world_, experts_group_, replicas_;
    int64_t shards_ = 1, shard_ = 0;
    std::shared_ptr<Exchange> exchange_;
    /// Expert weights in checkpoint order (block by block).
    std::vector<Weight> weights_;
    /// [begin, end) of each block's weights in weights_.
    std::vector<std::pair<size_t, size_t>> blocks_;
    std::unordered_map<const void *, int64_t> shard_by_weight_; ///< by TensorImpl
};

} // namespace rl::core
