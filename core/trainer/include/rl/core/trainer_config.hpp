// rl/core/trainer_config.hpp: the trainer's settings (the "trainer" section of
// a run configuration), learning-rate schedules and per-step overrides.
// Torch-free; JSON in, errors naming the key.
#pragma once

#include "rl/core/packing.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace rl::core {

enum class LrSchedule { Constant, LinearWarmup, Cosine };

/// "constant", "linear_warmup", "cosine".
const char *lr_schedule_name(LrSchedule s);

struct TrainerConfig {
    // AdamW
    double learning_rate = 1e-5;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;
    double gradient_clip = 1.0; ///< global-norm clip; 0: none
    // schedule
    LrSchedule lr_schedule = LrSchedule::Constant;
    int64_t warmup_steps = 0;
    double min_lr_ratio = 0.0;
    int64_t total_steps = 0; ///< needed by cosine
    // packing
    PackingConfig packing;
    /// Tokens per slice of the output projection when computing logprobs.
    int64_t logprob_chunk_tokens = 512;
    /// Recompute each decoder layer in the backward instead of keeping its
    /// activations (only the layer inputs stay in memory).
    bool activation_checkpointing = false;
    /// Forward passes only (a frozen reference): no optimizer, no masters, the
    /// weights' requires_grad and the model's settings untouched;
    /// forward_backward and optim_step are refused.
    bool forward_only = false;
    /// Over the ranks of a distributed run: "dp" (replicas) or "fsdp" (sharded).
    std::string parallel = "dp";
    /// dp: megabytes of float32 gradients per all-reduce bucket.
    double bucket_mb = 25.0;
    /// dp: sum gradient buckets over ranks during the backward of each
    /// forward_backward call's last micro-batch (every rank must make the
    /// same number of forward_backward calls between optimizer steps).
    bool overlap_grad_reduce = false;
    /// Mixture-of-experts models: the experts of every sparse layer split
    /// over this many ranks (all-to-all of the tokens' rows); divides the
    /// world size and num_experts. 1: every rank runs every expert.
    int64_t expert_parallel = 1;
    /// "auto" (sharded under fsdp on W > 1 ranks, else consolidated),
    /// "consolidated" (one whole copy, written by rank 0) or "sharded".
    std::string checkpoint_format = "auto";
    /// Seeds torch's default generator and the engine's sampling stream.
    std::optional<uint64_t> seed;
    /// Logits are divided by this before the log-softmax of the trainer's
    /// logprobs and entropy (verl / xorl). Unset: the batch's sampling
    /// temperature when it carries one, else 1 (logprob_temperature_for).
    std::optional<double> logprob_temperature;
    /// Mixture of experts: weight of the load-balancing loss (unset: the
    /// model's router_aux_loss_coef when output_router_logits, else 0) and of
    /// the router z-loss.
    std::optional<double> moe_aux_loss_coef;
    double moe_z_loss_coef = 0.0;

    /// Parses a JSON object; unknown keys and wrong types are errors naming
    /// the key ("trainer.<key>"). Validates.
    static TrainerConfig from_json(const std::string &json_text);
    /// Throws Error naming the first bad field.
    void validate() const;
    std::string to_json() const;
};

/// Learning rate of optimizer step `step` (0-based: the step about to be
/// taken), for the peak `lr`:
///   warm-up (linear_warmup, cosine): lr * (step + 1) / warmup_steps while step < warmup_steps;
///   constant / linear_warmup after it: lr;
///   cosine after it: lr * (r + (1 - r) * (1 + cos(pi * p)) / 2), r = min_lr_ratio,
///     p = (step - warmup_steps) / (total_steps - warmup_steps), clamped to [0, 1].
double scheduled_learning_rate(const TrainerConfig &config, double lr, int64_t step);

/// The temperature the trainer scores a batch at (docs/trainer.md,
/// "Temperature"): the batch's sampling temperature when it carries one,
/// else config.logprob_temperature, else 1. A batch sampled at T > 0 and an
/// explicit logprob_temperature that differs is an InvalidArgument error naming
/// both. A greedy batch (sampling temperature 0) has no tempered distribution:
/// it is scored at logprob_temperature (or 1) and *greedy is set so the caller
/// can warn.
double logprob_temperature_for(const TrainerConfig &config, std::optional<double> sampling,
                               bool *greedy = nullptr);

/// Per-call overrides of optim_step.
struct OptimOverrides {
    std::optional<double> learning_rate; ///< replaces the scheduled rate for this step
    std::optional<double> beta1, beta2, eps, weight_decay, gradient_clip;
    /// JSON object (empty text or "null": none); unknown keys are errors.
    static OptimOverrides from_json(const std::string &json_text);
};

} // namespace rl::core
