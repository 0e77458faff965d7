// The declarations of the core's settings. Each setting is declared here once:
// the trainer, engine and buffer read their JSON through these lists, and the
// host's run-configuration schema (and so docs/configuration.md) embeds them
// as the "trainer", "engine" and "buffer" sections.
#include "rl/core/params.hpp"

namespace rl::core {
namespace {

using T = ParamType;
using nlohmann::json;

ParamSpec nullable(ParamSpec s) {
    s.nullable = true;
    return s;
}

ParamSpec script_only(ParamSpec s) {
    s.in_run_config = false;
    return s;
}

} // namespace

const std::vector<ParamSpec> &trainer_params() {
    static const std::vector<ParamSpec> specs = {
        param("learning_rate", T::Number, 1e-5, "AdamW peak learning rate.", Range::at_least(0)),
        param("beta1", T::Number, 0.9, "AdamW beta1.", Range::half_open(0, 1)),
        param("beta2", T::Number, 0.999, "AdamW beta2.", Range::half_open(0, 1)),
        param("eps", T::Number, 1e-8, "AdamW epsilon.", Range::at_least(0)),
        param("weight_decay", T::Number, 0.0, "AdamW decoupled weight decay.", Range::at_least(0)),
        param("gradient_clip", T::Number, 1.0, "Global gradient-norm clip (0: no clipping).",
              Range::at_least(0)),
        choice_param("lr_schedule", "constant", {"constant", "linear_warmup", "cosine"},
                     "Learning-rate schedule."),
        param("warmup_steps", T::Integer, 0, "Linear warm-up steps.", Range::at_least(0)),
        param("min_lr_ratio", T::Number, 0.0, "Cosine schedule floor, as a fraction of the peak.",
              Range::closed(0, 1)),
        param("enable_packing", T::Boolean, true,
              "Pack sequences into bins (else one sequence "
              "per row)."),
        param("sample_packing_sequence_len", T::Integer, 2048, "Tokens per packing bin.",
              Range::at_least(1)),
        param("micro_batch_tokens", T::Integer, 8192,
              "Token budget of one forward/backward micro-batch.", Range::at_least(1)),
        param("logprob_chunk_tokens", T::Integer, 512,
              "Tokens per slice of the output projection when computing logprobs (bounds the "
              "memory of the vocabulary-sized logits).",
              Range::at_least(1)),
        param("forward_only", T::Boolean, false,
              "A trainer for forward passes only (a frozen reference model's logprobs): no "
              "optimizer, the model's weights left as they are (a LoRA policy's base stays "
              "frozen); forward_backward and optim_step are refused."),
        param("activation_checkpointing", T::Boolean, false,
              "Keep only each decoder layer's input during the forward and recompute the layer "
              "in the backward (less activation memory, about a third more compute)."),
        choice_param("parallel", "dp", {"dp", "fsdp"},
                     "Strategy over the ranks of a distributed run (one process: ignored). dp: a "
                     "full replica per rank, gradients all-reduced in buckets; fsdp: parameters, "
                     "gradients and AdamW state sharded over the ranks (docs/distributed.md)."),
        param("bucket_mb", T::Number, 25.0,
              "dp: megabytes of float32 gradients per all-reduce bucket.", Range::at_least(0.001)),
        param("overlap_grad_reduce", T::Boolean, false,
              "dp: sum the gradient buckets over ranks while the backward of each "
              "forward_backward call's last micro-batch still runs, instead of all at the "
              "optimizer step. Every rank must then make the same number of forward_backward "
              "calls between optimizer steps (a mismatch is an error naming it)."),
        param("expert_parallel", T::Integer, 1,
              "Mixture-of-experts models: split the experts of every sparse layer over this "
              "many ranks (expert parallelism): each rank holds and trains num_experts / N "
              "experts, tokens reach their experts by all-to-all; combines with dp (expert "
              "gradients are summed over the ranks that hold the same experts). Must divide the "
              "world size and num_experts; not with fsdp or LoRA (docs/distributed.md).",
              Range::at_least(1)),
        choice_param("checkpoint_format", "auto", {"auto", "consolidated", "sharded"},
                     "Checkpoint layout. consolidated: one whole copy (model/ folder, optimizer "
                     "state), written by rank 0; sharded: every rank writes its own fsdp shards "
                     "plus a manifest, nothing is gathered (fsdp on several ranks only; otherwise "
                     "consolidated is written); auto: sharded under fsdp, else consolidated. Both "
                     "resume at any world size (docs/distributed.md)."),
        nullable(param(
            "logprob_temperature", T::Number, nullptr,
            "Temperature of the trainer's logprobs and entropy: logits / T before the log-softmax "
            "(verl, xorl). null: the sampling temperature the batch carries (rollouts record "
            "rollout.temperature), else 1. A value that differs from the batch's sampling "
            "temperature is an error. Top-k / top-p truncation is not applied: the trainer scores "
            "the untruncated tempered distribution (docs/trainer.md).",
            Range::above(0))),
        nullable(param("moe_aux_loss_coef", T::Number, nullptr,
                       "Mixture-of-experts models: weight of the load-balancing auxiliary loss "
                       "(transformers' load_balancing_loss_func, per micro-batch) added to the "
                       "loss. null: the model's router_aux_loss_coef when its config.json sets "
                       "output_router_logits, else 0 (as transformers trains). Reported as the "
                       "metric moe/aux_loss whatever the weight (docs/model.md).",
                       Range::at_least(0))),
        param("moe_z_loss_coef", T::Number, 0.0,
              "Mixture-of-experts models: weight of the router z-loss (mean squared logsumexp of "
              "the router logits) added to the loss; reported as moe/z_loss.",
              Range::at_least(0)),
        script_only(param("total_steps", T::Integer, 0,
                          "Optimizer steps of the run (the cosine schedule's length).",
                          Range::at_least(0))),
        script_only(nullable(param("seed", T::Integer, nullptr,
                                   "Seeds torch's generator and the engine's sampling stream.",
                                   Range::at_least(0)))),
    };
    return specs;
}

const std::vector<ParamSpec> &dist_params() {
    static const std::vector<ParamSpec> specs = {
        param("timeout", T::Number, 300.0,
              "Seconds a rank waits for the others (rendezvous, every collective) before the run "
              "fails naming the rank at fault.",
              Range::at_least(0.001)),
        choice_param("backend", "auto", {"auto", "gloo", "nccl"},
                     "Collective backend: auto picks NCCL for a CUDA model, Gloo otherwise."),
    };
    return specs;
}

const std::vector<ParamSpec> &engine_params() {
    static const std::vector<ParamSpec> specs = {
        param("max_batch_sequences", T::Integer, 0,
              "Samples the rollout engine decodes together (0: all of a call, within the KV "
              "budget).",
              Range::at_least(0)),
        param("kv_cache_fraction", T::Number, 0.3,
              "KV-cache budget as a fraction of the device's memory (GPU memory on CUDA, RAM on "
              "the CPU); larger calls run in waves that fit.",
              Range::left_open(0, 1)),
        script_only(param("adapter", T::String, "",
                          "The LoRA adapter generate samples with when a call names none (its "
                          "name on the model; empty: the base model). Scripts set it from the "
                          "lora section.")),
        param("noise_scheduler.enabled", T::Boolean, false,
              "QeRL exploration noise (Surogate's noise_scheduler): sample with Gaussian noise "
              "N(0, sigma^2) on the RMSNorm weights (each layer's input_layernorm and "
              "post_attention_layernorm, the final norm); the trainer keeps the clean weights. "
              "sigma decays geometrically over num_stages stages of the run, the first "
              "noise-free (docs/moe.md)."),
        param("noise_scheduler.sigma_start", T::Number, 5e-2,
              "QeRL noise: sigma of the first noisy stage.", Range::above(0)),
        param("noise_scheduler.sigma_end", T::Number, 5e-4, "QeRL noise: sigma of the last stage.",
              Range::above(0)),
        param("noise_scheduler.num_stages", T::Integer, 10,
              "QeRL noise: stages of equal length over the run's steps, the first noise-free.",
              Range::at_least(2)),
        script_only(param("total_steps", T::Integer, 0,
                          "Optimizer steps of the run (the noise schedule's length). Scripts "
                          "pass run.steps.",
                          Range::at_least(0))),
        script_only(param("first_step", T::Integer, 0,
                          "The policy version at which the noise schedule's step 0 falls: "
                          "optimizer steps taken before the RL loop (a supervised warm-up) do not "
                          "count. Scripts pass sft.steps.",
                          Range::at_least(0))),
        script_only(nullable(param("seed", T::Integer, nullptr,
                                   "Seeds the QeRL noise (scripts pass run.seed; null: 0).",
                                   Range::at_least(0)))),
    };
    return specs;
}

const std::vector<ParamSpec> &buffer_params() {
    static const std::vector<ParamSpec> specs = {
        script_only(param("group_size", T::Integer, 0,
                          "Rollouts per group that push() waits for (0: groups arrive whole or "
                          "announce their size). Scripts pass rollout.n.",
                          Range::at_least(0))),
        nullable(param("easy_threshold", T::Number, nullptr,
                       "Drop groups whose mean reward is at least this (too easy: nothing to "
                       "learn); null: no such rule.")),
        nullable(param("hard_threshold", T::Number, nullptr,
                       "Drop groups whose mean reward is at most this (too hard: nothing to "
                       "learn); null: no such rule.")),
        param("drop_zero_variance", T::Boolean, true,
              "Drop groups of two or more rollouts whose rewards are all equal (no relative "
              "signal)."),
        param("reward_tolerance", T::Number, 0.0,
              "Rewards closer than this count as equal for drop_zero_variance.",
              Range::at_least(0)),
        param("min_group_size", T::Integer, 1,
              "Drop groups left with fewer rollouts (after stale ones are dropped).",
              Range::at_least(0)),
        nullable(param("max_off_policy_steps", T::Integer, 8,
                       "Drop rollouts generated more than this many policy versions ago "
                       "(null: never).",
                       Range::at_least(0))),
        script_only(param("drop_log_capacity", T::Integer, 1024,
                          "Drop records kept for take_drop_log() (oldest are discarded).",
                          Range::at_least(0))),
    };
    return specs;
}

} // namespace rl::core
