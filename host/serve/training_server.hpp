// host/serve/training_server.hpp: `rlhost training-server`, the trainer and
// the rollout engine behind the Tinker training API (protocols.md part A),
// with xorl's endpoint names and fields as aliases (part B). docs/training-server.md
// describes the routes, futures, sessions, limits and errors.
//
// Shape: clients open a session (create_session, kept alive by heartbeats),
// create training models in it (create_model: a full-weight copy of the base
// model with its own optimizer, or a LoRA adapter over the shared base when
// the build has LoRA) and sampling sessions (from the base, a sampler
// checkpoint or a snapshot of a training model). Every mutating call is queued
// and answered at once with a request id; retrieve_future long-polls for its
// result. Calls of one model run one at a time in seq_id order; different
// models run on `workers` threads. The HTTP layer (http.hpp) and the request
// helpers (api.hpp) are the inference server's.
#pragma once

#include "http.hpp"

#include "rl/core/policy.hpp"
#include "rl/core/trainer.hpp"
#include "rl/core/trainer_config.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace rl::serve {

struct TrainingServerConfig {
    std::string host = "127.0.0.1"; ///< loopback unless told otherwise
    int port = 8000;                ///< 0: any free port
    /// When set, every route but the health checks needs "X-API-Key: <key>"
    /// (the Tinker SDK's header) or "Authorization: Bearer <key>" (xorl-client).
    std::string api_key;
    std::string model_path; ///< the base model's folder (get_info's tokenizer_id)
    /// The name clients pass as base_model; empty: the folder's name. The
    /// folder path is accepted as well.
    std::string base_model;
    /// Where checkpoints go: <dir>/<model_id>/weights/<name>/ and
    /// <dir>/<model_id>/sampler_weights/<name>/. Required.
    std::string checkpoint_dir;
    size_t max_body_bytes = size_t{64} << 20;
    int max_connections = 256;
    double idle_timeout_s = 60;
    /// A session without a heartbeat or call for this long expires: its
    /// models and samplers are released, later calls naming them get 410.
    double session_timeout_s = 300;
    /// retrieve_future holds a poll this long before answering try_again
    /// (well under the SDK's 45 s read timeout).
    double poll_timeout_s = 20;
    /// Finished futures are kept this long.
    double future_ttl_s = 3600;
    /// Calls queued (not yet running) over all sessions; more get 429.
    int64_t max_queued = 256;
    int workers = 2;         ///< models / samplers running at the same time
    int64_t max_models = 16; ///< live training models
    /// "request": a create_model with lora_config makes a LoRA adapter over
    /// the shared base (Tinker); "off": every model trains its full weights
    /// and lora_config is ignored (xorl's server with enable_lora false).
    std::string lora = "request";
    int64_t max_sample_tokens = 4096; ///< largest max_tokens of a sample call
    /// A call whose seq_id is ahead of the next expected one waits this long
    /// for the missing calls before it runs anyway.
    double seq_gap_wait_s = 2;
    double kv_cache_fraction = 0.1; ///< per sampler's engine
    /// Trainer settings of every model (the optimizer's hyper-parameters come
    /// with each optim_step; these are the rest: packing, chunking, seed).
    core::TrainerConfig trainer;

    /// JSON object with the keys above ("trainer": an object as
    /// TrainerConfig::from_json reads); unknown keys and wrong types are
    /// rl::core::Error naming the key.
    static TrainingServerConfig from_json(const std::string &json_text);
};

/// Tinker's AdamParams defaults (learning rate 1e-4, betas 0.9 / 0.95, eps
/// 1e-12, no weight decay, no clipping): what optim_step fills in for the
/// fields a client leaves out.
core::OptimOverrides tinker_adam_defaults();

/// Makes the loss plugin `name` with parameters `params_json`; throws
/// rl::core::Error (NotFound when no plugin has that name).
using LossFactory =
    std::function<core::LossFunction(const std::string &name, const std::string &params_json)>;

class TrainingServer {
public:
    /// `base` is the model every session starts from (never modified).
    /// `plugins` resolves loss names that are not Tinker built-ins (may be empty).
    TrainingServer(std::shared_ptr<core::Policy> base, TrainingServerConfig config,
                   LossFactory plugins = {});
    ~TrainingServer();
    TrainingServer(const TrainingServer &) = delete;
    TrainingServer &operator=(const TrainingServer &) = delete;

    /// Binds and starts accepting. Throws (naming host:port) when it cannot bind.
    void start();
    int port() const;
    std::string url() const; ///< "http://host:port"
    /// Stops accepting, fails queued calls, waits for running ones. Idempotent.
    void stop();
    void wait();

    const TrainingServerConfig &config() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

} // namespace rl::serve
