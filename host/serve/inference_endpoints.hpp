// The inference servers a training server pushes its weights to, as xorl's
// training server keeps them (xorl-client: add_inference_endpoint,
// list_inference_endpoints, remove_inference_endpoint,
// sync_inference_weights). Each endpoint is a server that speaks SGLang's
// weight-update protocol (`rlhost serve`, SGLang); a sync forms a
// weight-update group with each in turn and broadcasts the model's weights
// (InferenceClient::sync, mode "distributed"). Thread-safe.
#pragma once

#include "rl/core/policy.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace rl::serve {

class InferenceEndpoints {
public:
    /// The training server's own host, used as the group's master address
    /// when a sync request gives none (0.0.0.0 / :: become 127.0.0.1).
    explicit InferenceEndpoints(std::string own_host);

    /// POST /add_inference_endpoint {host, port, world_size, ...}: probes the
    /// server (/get_model_info) and registers it (replacing one at the same
    /// host:port). AddInferenceEndpointResponse as JSON; a server that does
    /// not answer is {success: false, message naming it}. Malformed fields:
    /// ApiError 400 naming the field.
    nlohmann::json add(const nlohmann::json &body);
    /// GET /list_inference_endpoints: probes every endpoint, drops those that
    /// do not answer (as xorl does), lists the rest.
    nlohmann::json list();
    /// POST /remove_inference_endpoint {host, port}.
    nlohmann::json remove(const nlohmann::json &body);
    bool empty() const;

    /// The settings of a POST /sync_inference_weights body (the same keys as
    /// add_inference_endpoint's sync part): master_address, master_port,
    /// group_name, buffer_size_mb, plus this server's model_id.
    struct SyncRequest {
        std::string master_address, group_name = "weight_sync_group", model_id;
        int master_port = 0; ///< 0: a free port for each endpoint's group
        int64_t buffer_bytes = int64_t{1024} << 20;
        static SyncRequest from_json(const nlohmann::json &body);
    };
    /// Brings every endpoint to `policy`'s weights, labelled `version`, one
    /// after the other; SyncWeightsResponse as JSON (per endpoint: success
    /// and the server's message; success overall when every one succeeded).
    nlohmann::json sync(const core::Policy &policy, int64_t version, const SyncRequest &request);

    /// Loads the PEFT folder `path` as the LoRA adapter `name` on every
    /// endpoint (SGLang's POST /load_lora_adapter), as xorl's
    /// create_sampling_session does; an adapter of that name an endpoint has
    /// already is unloaded first, so each serves the folder named now. ""
    /// when every endpoint loaded it, else what failed ("url: message; ...").
    std::string load_adapter(const std::string &name, const std::string &path);

private:
    struct Endpoint {
        std::string host;
        int port = 0;
        int64_t world_size = 1;
        nlohmann::json server_info;
        nlohmann::json to_json() const;
    };
    std::vector<Endpoint> snapshot() const;

    std::string own_host_;
    mutable std::mutex mu_;
    std::vector<Endpoint> endpoints_;
};

} // namespace rl::serve
