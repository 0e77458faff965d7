// The declarations of the core's settings. Each setting is declared here once:
// the trainer, engine and buffer read their JSON through these lists, and the
// host's run-configuration schema (and so docs/configuration.md) embeds them
// as the "trainer", "engine" and "buffer" sections.
#include "rl/core/params.hpp"

namespace rl::core {
namespace {

using T = ParamType;
using nlohmann::json;

ParamSpec spec(std::string key, T type, json fallback, std::string doc, Range range = {}) {
    ParamSpec s;
    s.key = std::move(key);
    s.type = type;
    s.fallback = std::move(fallback);
    s.doc = std::move(doc);
    s.range = range;
    return s;
}

ParamSpec nullable(ParamSpec s) {
    s.nullable = true;
    return s;
}

ParamSpec script_only(ParamSpec s) {
    s.in_run_config = false;
    return s;
}

ParamSpec choice(std::string key, std::string fallback, std::vector<std::string> choices,
                 std::string doc) {
    ParamSpec s = spec(std::move(key), T::String, std::move(fallback), std::move(doc));
    s.choices = std::move(choices);
    return s;
}

} // namespace

const std::vector<ParamSpec> &trainer_params() {
    static const std::vector<ParamSpec> specs = {
        spec("learning_rate", T::Number, 1e-5, "AdamW peak learning rate.", Range::at_least(0)),
        spec("beta1", T::Number, 0.9, "AdamW beta1.", Range::half_open(0, 1)),
        spec("beta2", T::Number, 0.999, "AdamW beta2.", Range::half_open(0, 1)),
        spec("eps", T::Number, 1e-8, "AdamW epsilon.", Range::at_least(0)),
        spec("weight_decay", T::Number, 0.0, "AdamW decoupled weight decay.", Range::at_least(0)),
        spec("gradient_clip", T::Number, 1.0, "Global gradient-norm clip (0: no clipping).",
             Range::at_least(0)),
        choice("lr_schedule", "constant", {"constant", "linear_warmup", "cosine"},
               "Learning-rate schedule."),
        spec("warmup_steps", T::Integer, 0, "Linear warm-up steps.", Range::at_least(0)),
        spec("min_lr_ratio", T::Number, 0.0, "Cosine schedule floor, as a fraction of the peak.",
             Range::closed(0, 1)),
        spec("enable_packing", T::Boolean, true,
             "Pack sequences into bins (else one sequence "
             "per row)."),
        spec("sample_packing_sequence_len", T::Integer, 2048, "Tokens per packing bin.",
             Range::at_least(1)),
        spec("micro_batch_tokens", T::Integer, 8192,
             "Token budget of one forward/backward micro-batch.", Range::at_least(1)),
        spec("logprob_chunk_tokens", T::Integer, 512,
             "Tokens per slice of the output projection when computing logprobs (bounds the "
             "memory of the vocabulary-sized logits).",
             Range::at_least(1)),
        spec("activation_checkpointing", T::Boolean, false,
             "Keep only each decoder layer's input during the forward and recompute the layer "
             "in the backward (less activation memory, about a third more compute)."),
        script_only(spec("total_steps", T::Integer, 0,
                         "Optimizer steps of the run (the cosine schedule's length).",
                         Range::at_least(0))),
        script_only(nullable(spec("seed", T::Integer, nullptr,
                                  "Seeds torch's generator and the engine's sampling stream.",
                                  Range::at_least(0)))),
    };
    return specs;
}

const std::vector<ParamSpec> &engine_params() {
    static const std::vector<ParamSpec> specs = {
        spec("max_batch_sequences", T::Integer, 0,
             "Samples the rollout engine decodes together (0: all of a call, within the KV "
             "budget).",
             Range::at_least(0)),
        spec("kv_cache_fraction", T::Number, 0.3,
             "KV-cache budget as a fraction of the device's memory (GPU memory on CUDA, RAM on "
             "the CPU); larger calls run in waves that fit.",
             Range::left_open(0, 1)),
    };
    return specs;
}

const std::vector<ParamSpec> &buffer_params() {
    static const std::vector<ParamSpec> specs = {
        script_only(spec("group_size", T::Integer, 0,
                         "Rollouts per group that push() waits for (0: groups arrive whole or "
                         "announce their size). Scripts pass rollout.n.",
                         Range::at_least(0))),
        nullable(spec("easy_threshold", T::Number, nullptr,
                      "Drop groups whose mean reward is at least this (too easy: nothing to "
                      "learn); null: no such rule.")),
        nullable(spec("hard_threshold", T::Number, nullptr,
                      "Drop groups whose mean reward is at most this (too hard: nothing to "
                      "learn); null: no such rule.")),
        spec("drop_zero_variance", T::Boolean, true,
             "Drop groups of two or more rollouts whose rewards are all equal (no relative "
             "signal)."),
        spec("reward_tolerance", T::Number, 0.0,
             "Rewards closer than this count as equal for drop_zero_variance.", Range::at_least(0)),
        spec("min_group_size", T::Integer, 1,
             "Drop groups left with fewer rollouts (after stale ones are dropped).",
             Range::at_least(0)),
        nullable(spec("max_off_policy_steps", T::Integer, 8,
                      "Drop rollouts generated more than this many policy versions ago "
                      "(null: never).",
                      Range::at_least(0))),
        script_only(spec("drop_log_capacity", T::Integer, 1024,
                         "Drop records kept for take_drop_log() (oldest are discarded).",
                         Range::at_least(0))),
    };
    return specs;
}

} // namespace rl::core
