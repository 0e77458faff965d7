#include "training_server.hpp"

#include <rl_api.h>
#include <rl/training_server.h>

#include "server_args.hpp"

#include <nlohmann/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

namespace rlhost {

namespace {

const char *kUsage =
    "usage: rlhost training-server --model DIR [options]\n"
    "\n"
    "Trains the model over HTTP with the Tinker training API (and xorl's endpoint\n"
    "names): sessions, futures, create_model, forward_backward, optim_step, save and\n"
    "load, sampling (docs/training-server.md). Stops on SIGINT / SIGTERM.\n"
    "\n"
    "  --model DIR               Hugging Face model folder (required): the base model\n"
    "  --host H                  address to bind (default 127.0.0.1: this machine only)\n"
    "  --port P                  TCP port (default 8000; 0: any free port)\n"
    "  --api-key K               require 'X-API-Key: K' or 'Authorization: Bearer K'\n"
    "                            (also RL_TRAINING_SERVER_API_KEY)\n"
    "  --checkpoint-dir D        where checkpoints go (default: a new folder under the\n"
    "                            system's temporary directory, printed at start)\n"
    "  --base-model NAME         the name clients pass as base_model (default: the\n"
    "                            folder's name)\n"
    "  --device D                cpu (default), cuda, cuda:N or auto\n"
    "  --dtype T                 float32 (default) or bfloat16\n"
    "  --threads N               CPU threads (default: all cores)\n"
    "  --workers N               models / samplers running at once (default 2)\n"
    "  --max-queued N            calls waiting over all sessions; more get 429 (default 256)\n"
    "  --max-models N            live training models (default 16)\n"
    "  --lora MODE               request (default): a create_model with lora_config makes\n"
    "                            a LoRA adapter (Tinker); off: every model trains its full\n"
    "                            weights, lora_config is ignored (xorl's enable_lora false)\n"
    "  --session-timeout S       a session without a heartbeat for S seconds expires\n"
    "                            (default 300)\n"
    "  --max-body-bytes N        largest request body (default 64 MiB)\n";

} // namespace

int cmd_training_server(const std::vector<std::string> &args, const std::string &plugin_path,
                        const std::string &log_level) {
    const std::vector<rlhost::ServerFlag> flags = {{"--checkpoint-dir", "checkpoint_dir", 's'},
                                                   {"--base-model", "base_model", 's'},
                                                   {"--workers", "workers", 'i'},
                                                   {"--max-queued", "max_queued", 'i'},
                                                   {"--max-models", "max_models", 'i'},
                                                   {"--lora", "lora", 's'},
                                                   {"--session-timeout", "session_timeout_s", 'f'},
                                                   {"--max-body-bytes", "max_body_bytes", 'i'}};
    rlhost::ServerArgs parsed =
        rlhost::parse_server_args(args, flags, "RL_TRAINING_SERVER_API_KEY");
    if (auto rc = help_or_error(parsed, "training-server", kUsage)) return *rc;
    nlohmann::json &options = parsed.options;
    if (!options.contains("checkpoint_dir")) {
        std::error_code ec;
        std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
        if (ec) tmp = "/tmp";
        options["checkpoint_dir"] =
            (tmp / ("rlhost-training-server-" + std::to_string(::getpid()))).string();
    }

    const sigset_t stop_signals = block_stop_signals();

    rl_runtime_desc_t desc = RL_RUNTIME_DESC_INIT;
    desc.plugin_path = plugin_path.empty() ? nullptr : plugin_path.c_str();
    desc.log_level = log_level.c_str();
    rl_runtime_t *runtime = nullptr;
    if (rl_runtime_create(&desc, &runtime) != RL_OK) {
        std::cerr << "rlhost training-server: cannot create the runtime: " << rl_last_error()
                  << "\n";
        return 1;
    }
    rl_model_t *model = load_server_model(parsed, "training-server");
    if (!model) {
        rl_runtime_destroy(runtime);
        return 1;
    }
    rl_training_server_t *server = nullptr;
    if (rl_training_server_start(runtime, model, options.dump().c_str(), &server) != RL_OK) {
        std::cerr << "rlhost training-server: " << rl_last_error() << "\n";
        rl_model_destroy(model);
        rl_runtime_destroy(runtime);
        return 1;
    }
    serve_until_stopped(
        "training-server", options, rl_training_server_port(server),
        " (checkpoints in " + options["checkpoint_dir"].get<std::string>() + ")", stop_signals,
        [server] { rl_training_server_stop(server); },
        [server] { rl_training_server_wait(server); });
    rl_training_server_destroy(server);
    rl_model_destroy(model);
    rl_runtime_destroy(runtime);
    return 0;
}

} // namespace rlhost
