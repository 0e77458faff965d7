// The configuration schema: every key a run config may hold. docs/configuration.md
// documents the same keys (a test checks that they agree).
#include "rl/host/config.hpp"

namespace rl::host {

const std::vector<ConfigKey> &config_schema() {
    using T = ConfigType;
    static const std::vector<ConfigKey> keys = {
        {"log_level", T::String, "info", "trace|debug|info|warn|error|off", "Log verbosity."},
        {"plugins.path", T::StringList, "[]", nullptr,
         "Extra plugin files or folders, searched before RL_PLUGIN_PATH."},

        {"run.name", T::String, "run", nullptr, "Run name; the run folder is run.dir/run.name."},
        {"run.dir", T::String, "runs", nullptr, "Parent folder of run folders."},
        {"run.seed", T::Integer, "0", nullptr, "Seed of every random choice in the run."},
        {"run.steps", T::Integer, "20", nullptr, "RL steps (optimizer steps) to run."},
        {"run.resume", T::Boolean, "false", nullptr,
         "Continue from the last complete checkpoint in the run folder."},
        {"run.checkpoint_every", T::Integer, "10", nullptr,
         "Steps between checkpoints (0: only at the end)."},
        {"run.progress", T::String, "auto", "auto|bar|lines",
         "Progress display: a bar on a terminal, plain lines otherwise."},
        {"run.overwrite", T::Boolean, "false", nullptr,
         "Without run.resume, replace the checkpoints an earlier run left in the run folder "
         "(else that is an error)."},

        {"model.path", T::String, "''", nullptr,
         "Hugging Face model folder; empty: the built-in tiny model (created if absent)."},
        {"model.preset", T::String, "tiny", "tiny",
         "Built-in model created when model.path is empty."},
        {"model.init_dir", T::String, "models/tiny", nullptr,
         "Where the built-in model is created when model.path is empty."},
        {"model.threads", T::Integer, "0", nullptr, "CPU threads for tensor math (0: all cores)."},
        {"model.device", T::String, "auto", "auto|cpu|cuda|cuda:N",
         "Where trainer and engine run: auto (the first GPU when CUDA is usable, else the CPU), "
         "cpu, cuda or cuda:N."},
        {"model.dtype", T::String, "float32", "float32|bfloat16",
         "Weights and activations; bfloat16 keeps float32 master weights and AdamW state in the "
         "trainer."},

        {"tokenizer.chat_template", T::String, "none", "none|chatml|llama3",
         "Chat template applied to prompts."},

        {"trainer.learning_rate", T::Number, "1e-5", nullptr, "AdamW peak learning rate."},
        {"trainer.beta1", T::Number, "0.9", nullptr, "AdamW beta1."},
        {"trainer.beta2", T::Number, "0.999", nullptr, "AdamW beta2."},
        {"trainer.eps", T::Number, "1e-8", nullptr, "AdamW epsilon."},
        {"trainer.weight_decay", T::Number, "0.0", nullptr, "AdamW decoupled weight decay."},
        {"trainer.gradient_clip", T::Number, "1.0", nullptr,
         "Global gradient-norm clip (0: no clipping)."},
        {"trainer.lr_schedule", T::String, "constant", "constant|linear_warmup|cosine",
         "Learning-rate schedule."},
        {"trainer.warmup_steps", T::Integer, "0", nullptr, "Linear warm-up steps."},
        {"trainer.min_lr_ratio", T::Number, "0.0", nullptr,
         "Cosine schedule floor, as a fraction of the peak."},
        {"trainer.enable_packing", T::Boolean, "true", nullptr,
         "Pack sequences into bins (else one sequence per row)."},
        {"trainer.sample_packing_sequence_len", T::Integer, "2048", nullptr,
         "Tokens per packing bin."},
        {"trainer.micro_batch_tokens", T::Integer, "8192", nullptr,
         "Token budget of one forward/backward micro-batch."},
        {"trainer.activation_checkpointing", T::Boolean, "false", nullptr,
         "Keep only each decoder layer's input during the forward and recompute the layer in the "
         "backward (less activation memory, about a third more compute)."},

        {"engine.max_batch_sequences", T::Integer, "0", nullptr,
         "Samples the rollout engine decodes together (0: all of a call, within the KV budget)."},
        {"engine.kv_cache_fraction", T::Number, "0.3", nullptr,
         "KV-cache budget as a fraction of the device's memory (GPU memory on CUDA, RAM on the "
         "CPU); larger calls run in waves that fit."},

        {"rollout.prompts_per_step", T::Integer, "8", nullptr, "Prompts sampled per RL step."},
        {"rollout.n", T::Integer, "8", nullptr, "Samples per prompt (the GRPO group size)."},
        {"rollout.temperature", T::Number, "1.0", nullptr, "Sampling temperature."},
        {"rollout.top_p", T::Number, "1.0", nullptr, "Nucleus sampling mass (1: off)."},
        {"rollout.top_k", T::Integer, "0", nullptr, "Top-k sampling (0: off)."},
        {"rollout.max_tokens", T::Integer, "32", nullptr, "Completion length limit."},
        {"rollout.stop", T::StringList, "[]", nullptr, "Stop strings."},

        {"sft.steps", T::Integer, "0", nullptr,
         "Supervised warm-up steps on the env's reference answers before RL."},
        {"sft.batch_size", T::Integer, "32", nullptr, "Examples per warm-up step."},
        {"sft.learning_rate", T::Number, "1e-3", nullptr, "Warm-up learning rate."},

        {"ppo.epochs", T::Integer, "2", nullptr,
         "Passes over each step's rollouts in examples/ppo.lua (one optimizer step per "
         "minibatch per pass)."},
        {"ppo.minibatches", T::Integer, "1", nullptr,
         "Minibatches per pass in examples/ppo.lua (whole groups each)."},

        {"distill.teacher_path", T::String, "''", nullptr,
         "Teacher model folder for examples/distill.lua (e.g. runs/sft/model, written by "
         "examples/sft.lua)."},

        {"env.name", T::String, "reverse_text", nullptr, "Environment plugin."},
        {"env.params", T::Object, "{}", nullptr, "Environment parameters (see docs/envs.md)."},
        {"loss.name", T::String, "policy_loss", nullptr, "Loss plugin."},
        {"loss.params", T::Object, "{}", nullptr, "Loss parameters (see docs/losses.md)."},
        {"advantage.name", T::String, "grpo", nullptr, "Advantage plugin."},
        {"advantage.params", T::Object, "{}", nullptr,
         "Advantage parameters (see docs/advantages.md)."},
        {"filters", T::ObjectList, "[]", nullptr,
         "Rollout filters: a list of {name, params, enforce} (see docs/filters.md)."},

        {"buffer.easy_threshold", T::Number, "1.0", nullptr,
         "Drop groups whose mean reward is at least this (too easy: nothing to learn)."},
        {"buffer.hard_threshold", T::Number, "0.0", nullptr,
         "Drop groups whose mean reward is at most this (too hard: nothing to learn)."},
        {"buffer.max_off_policy_steps", T::Integer, "0", nullptr,
         "Drop rollouts generated more than this many policy versions ago."},
        {"buffer.min_rollouts", T::Integer, "1", nullptr,
         "Rollouts of kept groups needed for a training step; with fewer, the examples "
         "generate again and train once enough have gathered."},
    };
    return keys;
}

const char *config_type_name(ConfigType t) {
    switch (t) {
        case ConfigType::String:
            return "a string";
        case ConfigType::Integer:
            return "an integer";
        case ConfigType::Number:
            return "a number";
        case ConfigType::Boolean:
            return "true or false";
        case ConfigType::StringList:
            return "a list of strings";
        case ConfigType::Object:
            return "a mapping";
        case ConfigType::ObjectList:
            return "a list of mappings";
    }
    return "?";
}

} // namespace rl::host
