// host/serve/server.hpp: `rlhost serve`, the rollout engine as an HTTP
// inference server. One Policy, one continuous-batching Scheduler
// (rl/core/scheduler.hpp) and the HTTP layer (http.hpp); the routes are the
// OpenAI-compatible ones (routes_openai.cpp), SGLang's native generation and
// control ones with vLLM's equivalents (routes_sglang.cpp). docs/serving.md
// lists what each accepts, ignores and refuses.
//
// Other files add routes through router() before start(); their handlers use
// the helpers of api.hpp (strict JSON parsing, errors naming the field) and
// scheduler() / policy().
#pragma once

#include "http.hpp"

#include "rl/core/policy.hpp"
#include "rl/core/scheduler.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace rl::serve {

struct ServerConfig {
    std::string host = "127.0.0.1"; ///< loopback unless told otherwise
    int port = 30000;               ///< 0: any free port (Server::port() tells which)
    /// When set, every route but GET /health needs "Authorization: Bearer <api_key>".
    std::string api_key;
    /// The model name of /v1/models and of responses; empty: the model
    /// folder's name (model_path's last component), else "model".
    std::string served_model_name;
    std::string model_path; ///< reported by /get_model_info
    /// Largest max_tokens / max_new_tokens a request may ask for.
    int64_t max_tokens_limit = 4096;
    /// "qwen3": chat replies return the text of a <think> block as
    /// message.reasoning_content (streamed: delta.reasoning_content), vLLM's
    /// --reasoning-parser qwen3; "" (default): reasoning stays in the content.
    std::string reasoning_parser;
    size_t max_body_bytes = size_t{8} << 20;
    int max_connections = 256;
    /// A request (all its samples) not finished by then ends as aborted.
    double request_timeout_s = 600;
    /// Keep-alive idle time and the time to receive one request.
    double idle_timeout_s = 60;
    core::SchedulerConfig scheduler;

    /// JSON object with the keys above (scheduler keys flat: max_running,
    /// max_queued, max_context, kv_cache_fraction); all optional. Unknown keys
    /// and wrong types are errors (rl::core::Error) naming the key.
    static ServerConfig from_json(const std::string &json_text);
};

class Server {
public:
    /// Creates the scheduler and registers the built-in routes; serves from start().
    Server(std::shared_ptr<core::Policy> policy, ServerConfig config);
    /// stop()
    ~Server();
    Server(const Server &) = delete;
    Server &operator=(const Server &) = delete;

    /// Binds and starts accepting. Throws (naming host:port) when it cannot bind.
    void start();
    /// The bound port, after start().
    int port() const;
    /// "http://host:port" after start().
    std::string url() const;
    /// Stops accepting, cancels what is in flight, closes connections. Idempotent.
    void stop();
    /// Blocks until stop() has finished (on another thread, or a signal handler's).
    void wait();

    Router &router() { return router_; }
    core::Scheduler &scheduler() { return *scheduler_; }
    core::Policy &policy() const { return *policy_; }
    const std::shared_ptr<core::Policy> &policy_ptr() const { return policy_; }
    const ServerConfig &config() const { return config_; }
    /// The model name requests must use (or omit).
    const std::string &model_name() const { return model_name_; }

    /// The weight version reported in responses (SGLang's weight_version): the
    /// label set last, else the scheduler's version number.
    std::string weight_version() const;
    void set_weight_version(const std::string &label);

    // ---- LoRA adapters (SGLang's /load_lora_adapter, /unload_lora_adapter)
    /// Loads the PEFT folder `path` (adapter_config.json +
    /// adapter_model.safetensors) as the adapter `name` over the served model;
    /// requests select it by that name (lora_path, or model in the OpenAI
    /// routes). Throws core::Error naming what is wrong with the folder, or the
    /// name when an adapter of that name is loaded already.
    void load_adapter(const std::string &name, const std::string &path);
    /// Unloads the adapter `name` (requests running with it finish with it).
    /// Throws core::Error (NotFound) naming the loaded ones when there is none.
    void unload_adapter(const std::string &name);
    /// The loaded adapters: name -> the folder it was loaded from.
    std::map<std::string, std::string> adapters() const;

    // ---- requests in flight (the routes register each HTTP request's samples)

    /// Registers scheduler request ids under `rid`; returns a ticket for forget().
    uint64_t track(const std::string &rid, const std::vector<uint64_t> &ids);
    void forget(uint64_t ticket);
    /// Cancels every request in flight / those of `rid`. Returns how many HTTP
    /// requests were hit.
    int abort_all();
    int abort(const std::string &rid);
    /// A fresh request id ("<prefix>-<32 hex digits>").
    std::string new_request_id(const std::string &prefix);

private:
    struct Impl;
    std::shared_ptr<core::Policy> policy_;
    ServerConfig config_;
    std::string model_name_;
    Router router_;
    std::unique_ptr<core::Scheduler> scheduler_;
    std::unique_ptr<HttpServer> http_;
    std::unique_ptr<Impl> impl_;
};

/// Registers the OpenAI-compatible routes (routes_openai.cpp).
void add_openai_routes(Server &server);
/// Registers SGLang's /generate and control routes, vLLM's equivalents
/// (routes_sglang.cpp).
void add_sglang_routes(Server &server);

} // namespace rl::serve
