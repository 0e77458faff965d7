// rl/core/trainer.hpp: the trainer. Packs a batch into bins, runs micro-batches
// through the model's packed forward to get per-token logprobs (and entropy),
// hands them to a loss callback, and back-propagates the gradients the loss
// returns into the parameters (the trainer owns autograd; the loss never sees
// a graph). optim_step applies AdamW with global-norm clipping and a schedule.
//
// Alignment (as abi/rl/train.h documents for rl_batch_t): position t of every
// per-token tensor describes token t as predicted from the tokens before it in
// its sequence. logprobs[t] = log p(labels[t] | input_ids[start .. t-1]); the
// first token of each sequence has no prediction: its logprob and entropy are
// 0 and the trainer forces its loss_mask to 0 (and its label to -100).
#pragma once

#include "rl/core/packing.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/trainer_config.hpp"

#include <ATen/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch::optim {
class AdamW;
}

namespace rl::core {

namespace dist {
class Group;
}
class ExpertParallel;
class Fsdp;
class GradReducer;

/// A batch as the caller gives it. Tensors are 1-D CPU tensors.
struct TrainBatch {
    at::Tensor input_ids;                      ///< int64 [T]
    std::vector<int64_t> cu_seqlens;           ///< [n_seqs + 1]
    std::map<std::string, at::Tensor> tensors; ///< per-token [T] (float, int, bool)
    /// Normalizers of the whole optimizer step when it is split over several
    /// forward_backward calls (gradient accumulation): loss tokens and
    /// sequences with loss tokens over all calls. 0: this call's own counts.
    /// In a distributed run these count every rank's batch; 0 sums the
    /// ranks' own counts (a collective: every rank calls in step).
    double global_tokens = 0;
    double global_seqs = 0;
    /// The temperature the batch's completions were sampled at (0: greedy);
    /// the trainer scores them at it (logprob_temperature_for). Unset: unknown.
    std::optional<double> sampling_temperature;
};

/// Which inputs a loss reads (names as in abi/rl/kinds/loss.h).
struct LossSignature {
    std::vector<std::string> required, optional, differentiable;
    bool accepts(const std::string &name) const;
    bool needs(const std::string &name) const;
    bool differentiates(const std::string &name) const;
};

/// One loss evaluation over one micro-batch.
struct LossCall {
    /// Per-token [n] contiguous CPU tensors: float64, except "labels" (int64).
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    at::Tensor cu_seqlens; ///< int64 [n_seqs + 1], from 0 to n
    double global_tokens = 0;
    double global_seqs = 0;
    bool want_grads = false;
};

/// How a loss metric combines over micro-batches and ranks (the values of
/// abi/rl/host.h rl_metric_reduction_t; docs/abi.md).
enum class MetricReduce : int32_t {
    Default = 0,
    TokenMean = 1,
    SeqMean = 2,
    Sum = 3,
    Min = 4,
    Max = 5
};
struct MetricSpec {
    MetricReduce reduce = MetricReduce::Default; ///< Default: weighted by the call's loss tokens
    double weight = 0; ///< elements the value covers (tokens, sequences); 0: none
};

struct LossResult {
    double loss = 0;
    /// d loss / d input per differentiable input (same shape; any float dtype).
    std::map<std::string, at::Tensor> grads;
    std::map<std::string, double> metrics;
    /// Declared reductions; a metric without one is Default.
    std::map<std::string, MetricSpec> reductions;
    /// Extra outputs (per-token [n] or per-sequence), concatenated over micro-batches.
    std::map<std::string, at::Tensor> tensors;
};

/// A loss plugged into the trainer: its signature and how to evaluate it.
struct LossFunction {
    std::string name; ///< for error messages ("loss 'policy_loss'")
    LossSignature signature;
    std::function<LossResult(const LossCall &)> compute;
};

struct StepResult {
    double loss = 0;         ///< sum over micro-batches (each normalized globally)
    int64_t tokens = 0;      ///< tokens in the batch
    int64_t loss_tokens = 0; ///< tokens the loss counts (mask 1, label valid)
    int64_t seqs = 0;
    int64_t bins = 0;
    int64_t micro_batches = 0;
    std::map<std::string, double> metrics; ///< over micro-batches and ranks, by reduction
    /// forward: "logprobs", "entropy"; + loss extras; a reward model's
    /// forward: "scores" (float32 [seqs, num_labels]) only.
    std::map<std::string, at::Tensor> tensors;
    double logprob_temperature = 1;    ///< the temperature logprobs and entropy were computed at
    std::vector<std::string> warnings; ///< for the caller's log (each kind given once per trainer)
};

struct OptimResult {
    double grad_norm = 0; ///< before clipping
    double learning_rate = 0;
    int64_t step = 0; ///< optimizer steps taken so far (this one included)
    int64_t policy_version = 0;
};

struct CheckpointInfo {
    std::string path;
    int64_t step = 0;
    std::string state_json; ///< the caller's state ("{}" when none was saved)
};

class Trainer {
public:
    Trainer(std::shared_ptr<Policy> policy, TrainerConfig config);
    /// A LoRA trainer (docs/lora.md): only `adapter`'s parameters train; the
    /// base model's parameters are frozen (requires_grad off) and never
    /// change. Its forwards run with the adapter (dropout in forward_backward
    /// only); its optimizer state and checkpoints hold the adapter alone
    /// (checkpoint folder "adapter/" in PEFT layout instead of "model/");
    /// optim_step bumps the adapter's version, not the policy's. Several LoRA
    /// trainers over one policy (one per adapter) train independently.
    /// Not available with trainer.parallel fsdp over several ranks.
    Trainer(std::shared_ptr<Policy> policy, TrainerConfig config,
            std::shared_ptr<LoraAdapter> adapter);
    ~Trainer();
    Trainer(const Trainer &) = delete;
    Trainer &operator=(const Trainer &) = delete;

    const TrainerConfig &config() const { return config_; }
    Policy &policy() const { return *policy_; }
    int64_t step() const { return step_; }
    /// The adapter a LoRA trainer trains; null for full-weight training.
    const std::shared_ptr<LoraAdapter> &adapter() const { return adapter_; }
    /// The version optim_step reports: the adapter's (LoRA) or the policy's.
    int64_t version() const;
    /// forward_backward calls since the last optimizer step.
    int64_t pending_backwards() const { return pending_backwards_; }

    /// Distributed run (docs/distributed.md): this process's rank and the
    /// number of ranks (0 and 1 for a single process), and the strategy in
    /// use ("single", "dp" or "fsdp"). With W > 1 every call below that
    /// touches the model is a collective: all ranks make it in the same order.
    int rank() const;
    int world_size() const;
    std::string strategy() const;
    /// Bytes of training state this rank holds: the weights the optimizer
    /// updates (float32 masters or the parameters), their AdamW moments and
    /// their gradients (fsdp: this rank's shards only).
    int64_t state_bytes() const;

    /// Forward + backward through `loss`; gradients accumulate in the
    /// parameters until optim_step.
    StepResult forward_backward(const TrainBatch &batch, const LossFunction &loss);
    /// Forward only: tensors "logprobs" and "entropy" (float32 [T]); with a
    /// loss (may be null) also its value, metrics and extra tensors (an extra
    /// named "logprobs" or "entropy" comes back as "loss.logprobs" / "loss.entropy").
    /// A reward model (a sequence classifier; no loss): tensor "scores" only.
    StepResult forward(const TrainBatch &batch, const LossFunction *loss);

    /// Clip, AdamW step at the scheduled rate (or the override), zero the
    /// gradients, bump the policy version. Refuses when no forward_backward
    /// ran since the last step, and when the gradient norm is not finite (the
    /// gradients are then cleared and the parameters left untouched).
    /// Parameters without a gradient (all-zero loss gradients) are not updated.
    OptimResult optim_step(const OptimOverrides &overrides = {});
    /// Drops accumulated gradients.
    void zero_grad();

    /// Writes dir/step_<step>/ atomically (see checkpoint.hpp): model/ (an HF
    /// folder), optimizer.safetensors, rng.safetensors, trainer.json (step,
    /// policy version, sampling stream, config), state.json (`state_json`, a
    /// JSON object or empty), and for a bfloat16 model
    /// master_weights.safetensors (the float32 masters). Returns its path.
    /// fsdp over W > 1 ranks writes the sharded layout instead (each rank its
    /// shards under shards/, a manifest, no model/ folder; a collective), unless
    /// trainer.checkpoint_format is "consolidated". Both load at any world size.
    std::string save_checkpoint(const std::string &dir, const std::string &state_json);
    /// Restores the newest complete checkpoint under dir; Error NotFound
    /// when there is none.
    CheckpointInfo load_checkpoint(const std::string &dir);

private:
    struct Prepared;
    Prepared prepare(const TrainBatch &batch, const LossFunction *loss, bool backward) const;
    StepResult run(const TrainBatch &batch, const LossFunction *loss, bool backward);
    StepResult classify(const TrainBatch &batch);
    void idle_micro_batch(bool backward);
    /// Whether a backward adds the router losses (a weight > 0).
    bool router_losses_weighted() const;
    void rebuild_optimizer();
    /// The tensor the optimizer updates for parameter i: its float32 master,
    /// or the parameter itself when it is float32 already.
    const at::Tensor &optimized(size_t i) const;
    /// dp: every parameter's gradient summed over ranks, in float32 buckets
    /// (undefined where no rank has one).
    std::vector<at::Tensor> all_reduce_gradients();
    /// all_reduce_gradients for the parameters `which` over `group` (null:
    /// this rank's gradients alone, in float32) into `out`.
    void reduce_gradients(const std::vector<size_t> &which, dist::Group *group,
                          std::vector<at::Tensor> &out);
    /// Expert parallelism: checks trainer.expert_parallel against the model
    /// and the world, and keeps only this rank's experts in params_.
    void setup_expert_parallel();
    OptimResult fsdp_step(const OptimOverrides &overrides);
    double apply_optimizer_options(const OptimOverrides &overrides);
    void refuse_non_finite(double grad_norm);
    /// The full optimizer state by parameter name (fsdp: gathered; a collective).
    void collect_state(std::vector<std::pair<std::string, at::Tensor>> &optimizer,
                       std::vector<std::pair<std::string, at::Tensor>> &masters);
    void load_sharded(const std::map<std::string, at::Tensor> &weights,
                      const std::map<std::string, at::Tensor> &optimizer);
    std::string write_checkpoint(const std::string &dir, const std::string &state,
                                 std::vector<std::pair<std::string, at::Tensor>> &optimizer,
                                 std::vector<std::pair<std::string, at::Tensor>> &masters);
    void write_run_state(const std::string &folder, const std::string &state,
                         const std::string &layout, int64_t optimizer_params) const;
    /// fsdp over W > 1 ranks, unless trainer.checkpoint_format is consolidated.
    bool writes_sharded_checkpoints() const;
    /// Every rank writes its shards, rank 0 the manifest (checkpoint_sharded.cpp).
    std::string save_sharded_checkpoint(const std::string &dir, const std::string &state);
    /// Whole tensors (weights by name, optimizer state as in
    /// optimizer.safetensors) rebuilt from a sharded checkpoint folder.
    void read_sharded_checkpoint(const std::string &folder,
                                 std::map<std::string, at::Tensor> &weights,
                                 std::map<std::string, at::Tensor> &optimizer) const;

    std::shared_ptr<Policy> policy_;
    TrainerConfig config_;
    std::shared_ptr<LoraAdapter> adapter_; ///< null: full-weight training
    std::unique_ptr<torch::optim::AdamW> optimizer_;
    std::vector<std::pair<std::string, at::Tensor>> params_; ///< (HF name, parameter)
    std::vector<at::Tensor> masters_; ///< float32 copy per low-precision parameter, else undefined
    int64_t step_ = 0;
    int64_t pending_backwards_ = 0;
    bool warned_greedy_ = false;           ///< the greedy-batch warning was given
    bool warned_metric_ranks_ = false;     // ranks emitted different loss metrics
    std::shared_ptr<dist::Group> group_;   ///< null for a single process
    std::unique_ptr<Fsdp> fsdp_;           ///< fsdp over W > 1 ranks
    std::unique_ptr<GradReducer> reducer_; ///< dp with overlap_grad_reduce
    std::unique_ptr<ExpertParallel> ep_;   ///< trainer.expert_parallel > 1
    /// Expert parallelism: the expert weights other ranks train (name, weight).
    std::vector<std::pair<std::string, at::Tensor>> ep_foreign_;
};

} // namespace rl::core
