#include "serve.hpp"

#include <rl_api.h>

#include "server_args.hpp"

#include <nlohmann/json.hpp>

#include <signal.h>

#include <cstdio>
#include <iostream>
#include <string>

namespace rlhost {

namespace {

const char *kServeUsage =
    "usage: rlhost serve --model DIR [options]\n"
    "\n"
    "Serves the model over HTTP: OpenAI-compatible (/v1/completions, /v1/chat/completions,\n"
    "/v1/models) and SGLang-native (/generate, /health, /get_model_info, ...) routes on a\n"
    "continuous-batching engine (docs/serving.md). Stops on SIGINT / SIGTERM.\n"
    "\n"
    "  --model DIR               Hugging Face model folder (required)\n"
    "  --host H                  address to bind (default 127.0.0.1: this machine only)\n"
    "  --port P                  TCP port (default 30000; 0: any free port)\n"
    "  --api-key K               require 'Authorization: Bearer K' (also RL_SERVE_API_KEY)\n"
    "  --device D                cpu (default), cuda, cuda:N or auto\n"
    "  --dtype T                 float32 (default) or bfloat16\n"
    "  --threads N               CPU threads (default: all cores)\n"
    "  --max-running N           requests decoded together (default 32)\n"
    "  --max-queued N            requests waiting beyond those; more get 503 (default 256)\n"
    "  --max-context N           prompt + completion tokens of one request (default: the\n"
    "                            model's, at most 4096)\n"
    "  --kv-cache-fraction F     KV-cache budget, fraction of device memory (default 0.3)\n"
    "  --max-tokens-limit N      largest max_tokens a request may ask for (default 4096)\n"
    "  --max-connections N       open connections; more get 503 (default 256)\n"
    "  --request-timeout S       a request not finished in S seconds is aborted (default 600)\n"
    "  --served-model-name S     the model's name in the API (default: the folder's name)\n"
    "  --reasoning-parser P      qwen3: chat replies give <think> text as reasoning_content\n"
    "                            (default: none, it stays in the content)\n"
    "\n"
    "QeRL exploration noise (docs/moe.md; engine.noise_scheduler of a run), applied to every\n"
    "weight version the server receives:\n"
    "  --noise-total-steps N     the run's optimizer steps (run.steps); turns the noise on\n"
    "  --noise-sigma-start F     sigma of the first noisy stage (default 5e-2)\n"
    "  --noise-sigma-end F       sigma of the last stage (default 5e-4)\n"
    "  --noise-num-stages N      stages, the first noise-free (default 10)\n"
    "  --noise-first-step N      warm-up steps before the schedule (sft.steps; default 0)\n"
    "  --noise-seed N            seeds the noise (run.seed; default 0)\n";

} // namespace

int cmd_serve(const std::vector<std::string> &args) {
    const std::vector<rlhost::ServerFlag> flags = {
        {"--max-running", "max_running", 'i'},
        {"--max-queued", "max_queued", 'i'},
        {"--max-context", "max_context", 'i'},
        {"--kv-cache-fraction", "kv_cache_fraction", 'f'},
        {"--max-tokens-limit", "max_tokens_limit", 'i'},
        {"--max-connections", "max_connections", 'i'},
        {"--request-timeout", "request_timeout_s", 'f'},
        {"--served-model-name", "served_model_name", 's'},
        {"--reasoning-parser", "reasoning_parser", 's'},
        {"--noise-total-steps", "noise_total_steps", 'i'},
        {"--noise-sigma-start", "noise_sigma_start", 'f'},
        {"--noise-sigma-end", "noise_sigma_end", 'f'},
        {"--noise-num-stages", "noise_num_stages", 'i'},
        {"--noise-first-step", "noise_first_step", 'i'},
        {"--noise-seed", "noise_seed", 'i'}};
    const rlhost::ServerArgs parsed = rlhost::parse_server_args(args, flags, "RL_SERVE_API_KEY");
    if (auto rc = help_or_error(parsed, "serve", kServeUsage)) return *rc;
    const nlohmann::json &options = parsed.options;

    // SIGINT / SIGTERM go to a thread that waits for them (blocked everywhere
    // else, including the server's threads, which inherit the mask).
    const sigset_t stop_signals = block_stop_signals();

    rl_model_t *model = load_server_model(parsed, "serve");
    if (!model) return 1;
    rl_server_t *server = nullptr;
    if (rl_server_start(model, options.dump().c_str(), &server) != RL_OK) {
        std::cerr << "rlhost serve: " << rl_last_error() << "\n";
        rl_model_destroy(model);
        return 1;
    }
    serve_until_stopped(
        "serve", options, rl_server_port(server), "", stop_signals,
        [server] { rl_server_stop(server); }, [server] { rl_server_wait(server); });
    rl_server_destroy(server);
    rl_model_destroy(model);
    return 0;
}

} // namespace rlhost
