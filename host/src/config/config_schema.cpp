// The configuration schema: every key a run config may hold. The host's own
// keys are declared here; the trainer, engine and buffer sections come from
// the core's declarations (rl/core/params.hpp), so each setting is declared
// once. docs/configuration.md is generated from this list
// (`rlhost config --markdown`; a test checks that it is current).
#include "rl/host/config.hpp"

namespace rl::host {
namespace {

using T = ConfigType;
using nlohmann::json;
using rl::core::Range;

using rl::core::choice_param;
using rl::core::param;

void add_section(std::vector<ConfigKey> &keys, const std::string &section,
                 const std::vector<rl::core::ParamSpec> &specs) {
    for (const auto &s : specs) {
        if (!s.in_run_config) continue;
        ConfigKey k = s;
        k.key = section + "." + s.key;
        keys.push_back(std::move(k));
    }
}

std::vector<ConfigKey> build() {
    std::vector<ConfigKey> keys = {
        choice_param("log_level", "info", {"trace", "debug", "info", "warn", "error", "off"},
                     "Log verbosity."),
        param("plugins.path", T::StringList, json::array(),
              "Extra plugin files or folders, searched before RL_PLUGIN_PATH."),

        param("run.name", T::String, "run", "Run name; the run folder is run.dir/run.name."),
        param("run.dir", T::String, "runs", "Parent folder of run folders."),
        param("run.seed", T::Integer, 0, "Seed of every random choice in the run.",
              Range::at_least(0)),
        param("run.steps", T::Integer, 20, "RL steps (optimizer steps) to run.",
              Range::at_least(0)),
        param("run.resume", T::Boolean, false,
              "Continue from the last complete checkpoint in the run folder."),
        param("run.checkpoint_every", T::Integer, 10,
              "Steps between checkpoints (0: only at the end).", Range::at_least(0)),
        choice_param("run.progress", "auto", {"auto", "bar", "lines"},
                     "Progress display: a bar on a terminal, plain lines otherwise."),
        param("run.tensorboard", T::Boolean, true,
              "Write TensorBoard event files to the run folder's tensorboard/ (every step's "
              "numeric metrics as scalars <phase>/<key>, the same steps as metrics.jsonl)."),
        param("run.samples_every", T::Integer, 10,
              "Every N steps, the trained sequences (task, completion, reward, advantage) go to "
              "the run folder's samples.jsonl (0: never).",
              Range::at_least(0)),
        param("run.overwrite", T::Boolean, false,
              "Without run.resume, replace the checkpoints an earlier run left in the run folder "
              "(else that is an error)."),

        param("model.path", T::String, "",
              "Hugging Face model folder; empty: the built-in tiny model (created if absent)."),
        choice_param("model.preset", "tiny", {"tiny", "tiny-moe"},
                     "Built-in model created when model.path is empty."),
        param("model.init_dir", T::String, "models/tiny",
              "Where the built-in model is created when model.path is empty."),
        param("model.threads", T::Integer, 0, "CPU threads for tensor math (0: all cores).",
              Range::at_least(0)),
        choice_param(
            "model.device", "auto", {"auto", "cpu", "cuda", "cuda:N"},
            "Where trainer and engine run: auto (the first GPU when CUDA is usable, else the "
            "CPU), cpu, cuda or cuda:N."),
        choice_param(
            "model.dtype", "float32", {"float32", "bfloat16"},
            "Weights and activations; bfloat16 keeps float32 master weights and AdamW state "
            "in the trainer."),
        param("model.value_head", T::Boolean, false,
              "Give the policy a scalar value head on its trunk (the PPO critic): the trainer "
              "computes 'values' with the logprobs and trains the head through the loss; saved "
              "as value_head.safetensors in model folders and checkpoints."),

        choice_param("tokenizer.chat_template", "none", {"none", "model", "chatml", "llama3"},
                     "Chat template applied to prompts: none (the prompt as it is), model (the "
                     "model's own Jinja chat_template), or a built-in format (chatml, llama3)."),
    };
    add_section(keys, "trainer", rl::core::trainer_params());
    add_section(keys, "engine", rl::core::engine_params());
    // LoRA (docs/lora.md): the examples train adapter "default" when rank > 0.
    const std::vector<ConfigKey> lora = {
        param("lora.rank", T::Integer, 0,
              "LoRA rank; 0: train the full weights. > 0: train a LoRA adapter (named "
              "\"default\") over the frozen model and sample with it (docs/lora.md).",
              Range::at_least(0)),
        param("lora.alpha", T::Number, 16.0, "LoRA alpha; the update is scaled by alpha / rank.",
              Range::above(0)),
        param("lora.dropout", T::Number, 0.0, "Dropout on the adapter's input while training.",
              Range::half_open(0, 1)),
        param("lora.target_modules", T::StringList, json::array({"all-linear"}),
              "Modules the adapter targets: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
              "down_proj, or all-linear."),
        param("lora.use_rslora", T::Boolean, false, "Scale by alpha / sqrt(rank) (rsLoRA)."),
    };
    keys.insert(keys.end(), lora.begin(), lora.end());
    const std::vector<ConfigKey> rest = {
        param("rollout.prompts_per_step", T::Integer, 8, "Prompts sampled per RL step.",
              Range::at_least(1)),
        param("rollout.n", T::Integer, 8, "Samples per prompt (the GRPO group size).",
              Range::at_least(1)),
        param("rollout.temperature", T::Number, 1.0,
              "Sampling temperature (0: greedy). Rollouts record it and the trainer computes "
              "logprobs and entropy at it (trainer.logprob_temperature).",
              Range::at_least(0)),
        param("rollout.top_p", T::Number, 1.0, "Nucleus sampling mass (1: off).",
              Range::left_open(0, 1)),
        param("rollout.top_k", T::Integer, 0, "Top-k sampling (0: off).", Range::at_least(0)),
        param("rollout.max_tokens", T::Integer, 32, "Completion length limit.", Range::at_least(1)),
        param("rollout.stop", T::StringList, json::array(), "Stop strings."),
        param("moe.routing_replay", T::Boolean, false,
              "Routing replay (R3) for a mixture-of-experts model: rollouts record the experts "
              "every sparse layer routed each token to and the trainer replays them (see "
              "docs/model.md); refused on a dense model."),
        param("moe.routing_replay_weights", T::Boolean, false,
              "With moe.routing_replay: rollouts also record the weights the sampler mixed the "
              "experts with, and the trainer mixes the replayed experts with exactly those "
              "(constants: the policy gradient no longer reaches the router; docs/moe.md)."),

        param("env.name", T::String, "reverse_text", "Environment plugin."),
        param("env.params", T::Object, json::object(),
              "Environment parameters (see docs/envs.md)."),
        param("loss.name", T::String, "policy_loss", "Loss plugin."),
        param("loss.params", T::Object, json::object(), "Loss parameters (see docs/losses.md)."),
        param("advantage.name", T::String, "grpo", "Advantage plugin."),
        param("advantage.params", T::Object, json::object(),
              "Advantage parameters (see docs/advantages.md)."),
        param("filters", T::ObjectList, json::array(),
              "Rollout filters: a list of {name, params, enforce} (see docs/filters.md)."),
    };
    keys.insert(keys.end(), rest.begin(), rest.end());
    add_section(keys, "buffer", rl::core::buffer_params());
    add_section(keys, "dist", rl::core::dist_params());
    keys.push_back(param("buffer.min_rollouts", T::Integer, 1,
                         "Rollouts of kept groups needed for a training step; with fewer, the "
                         "examples generate again and train once enough have gathered.",
                         Range::at_least(1)));
    // The disaggregated mode (docs/disaggregated.md), named as Surogate's keys.
    const std::vector<ConfigKey> disaggregated = {
        choice_param("role", "auto", {"auto", "trainer", "orchestrator", "rollout"},
                     "Disaggregated mode: this process's role; auto: from RL_ROLE (set by "
                     "rlhost launch --roles)."),
        param("orchestrator", T::Boolean, false,
              "Disaggregated mode: rollouts pass through an orchestrator process (buffer, "
              "difficulty filter, advantages, batches) on their way to the trainer, when the "
              "roles are started by hand (rlhost launch --roles with an orchestrator sets it)."),
        param("rollout_workers", T::Integer, 1,
              "Disaggregated mode: rollout workers, when the roles are started by hand "
              "(rlhost launch --roles sets it).",
              Range::at_least(1)),
        param("max_async_level", T::Integer, 1,
              "Disaggregated mode: steps the rollouts may run ahead of the weights they hold (0: "
              "on-policy, no overlap).",
              Range::at_least(0)),
        choice_param("rollout_transport.type", "filesystem", {"filesystem", "zmq"},
                     "Transport plugin carrying training batches to the trainer."),
        param("rollout_transport.dir", T::String, "",
              "filesystem: the shared folder (empty: <run folder>/transport/<launch id>)."),
        param("rollout_transport.host", T::String, "127.0.0.1",
              "zmq: the trainer's address (and the orchestrator's, when there is one)."),
        param("rollout_transport.port", T::Integer, 5557,
              "zmq: the port the trainer binds (with an orchestrator: port + 1 is the "
              "orchestrator's, port + 2 + K worker K's).",
              Range::closed(1, 65535)),
        param("rollout_transport.hwm", T::Integer, 4,
              "zmq: batches queued before a worker's send waits.", Range::at_least(1)),
        param("rollout_transport.timeout", T::Number, 600,
              "Seconds the trainer waits for a batch before it fails.", Range::at_least(0)),
        choice_param("weight_broadcast.type", "filesystem", {"filesystem", "zmq", "nccl"},
                     "Transport plugin carrying weights to the rollout workers (nccl: one "
                     "broadcast to every worker over a collective group; Gloo for CPU models, "
                     "NCCL for CUDA ones)."),
        param("weight_broadcast.dir", T::String, "",
              "filesystem: the shared folder (empty: as rollout_transport.dir)."),
        param("weight_broadcast.host", T::String, "127.0.0.1",
              "zmq: the address of worker 0 (worker K listens on port + K); nccl: the "
              "trainer's address."),
        param("weight_broadcast.port", T::Integer, 5558,
              "zmq: the port worker 0 binds (worker K: port + K); nccl: the port of the "
              "trainer's rendezvous store.",
              Range::closed(1, 65535)),
        param("weight_broadcast.timeout", T::Number, 600,
              "Seconds a worker waits for weights before it fails.", Range::at_least(0)),
    };
    keys.insert(keys.end(), disaggregated.begin(), disaggregated.end());
    // Rollouts from an inference server (docs/serving.md).
    const std::vector<ConfigKey> server = {
        param("inference_server.url", T::String, "",
              "Rollouts from this inference server (rlhost serve or SGLang, http://host:port) "
              "instead of the co-located engine (rl.rollout_engine); empty: co-located."),
        choice_param("inference_server.sync", "distributed", {"distributed", "disk"},
                     "How the trainer's weights reach the server after each step."),
        param("inference_server.dir", T::String, "",
              "sync disk: a folder both can read (empty: <run folder>/broadcasts)."),
        param("inference_server.api_key", T::String, "", "Sent as Authorization: Bearer."),
        param("inference_server.timeout", T::Number, 600, "Seconds one call may take.",
              Range::above(0)),
    };
    keys.insert(keys.end(), server.begin(), server.end());
    return keys;
}

} // namespace

const std::vector<ConfigKey> &config_schema() {
    static const std::vector<ConfigKey> keys = build();
    return keys;
}

const char *config_type_name(ConfigType t) {
    return rl::core::param_type_name(t);
}

} // namespace rl::host
