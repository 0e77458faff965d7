// The trainer side of the inference sync layer: drives any server that speaks
// SGLang's weight-update protocol (protocols.md D.2 / D.3) -- `rlhost serve`,
// SGLang -- or prime-rl's vLLM routes (E.4), so a training loop can swap one
// for another without changing.
//
// One sync is the state machine of docs/serving.md:
//   handshake (the server's weight_version: skip a version it already has)
//   -> pause -> update (a folder on disk, or broadcasts over a weight-update
//   group) -> the server checks and swaps (CRC-32C per tensor when the server
//   is ours) -> continue -> the server reports the new version.
// A failed update is reported with the server's message; the server keeps
// the weights it had and is resumed.
#pragma once

#include "rl/core/policy.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

namespace rl::serve {

struct ClientOptions {
    std::string url;     ///< "http://host:port"
    std::string api_key; ///< sent as Authorization: Bearer when not empty
    double timeout_s = 600;
    /// "sglang" (rlhost serve, SGLang) or "vllm" (vLLM 0.33's RL routes and
    /// prime-rl's vLLM server: /pause, /update_weights {weight_dir} or vLLM's
    /// NCCL weight transfer engine, /resume).
    std::string protocol = "sglang";
    /// JSON object of these keys; unknown keys are errors naming the key.
    static ClientOptions from_json(const nlohmann::json &j);
};

struct SyncOptions {
    std::string mode = "disk"; ///< "disk" or "distributed"
    /// disk: the folder the trainer writes step_<version>/ into and the server
    /// reads (a shared filesystem). Kept: the newest `keep` steps.
    std::string dir;
    int64_t keep = 2;
    /// distributed: the trainer hosts the group's store here (rank 0).
    std::string master_address = "127.0.0.1";
    int master_port = 0; ///< 0: a free port
    std::string group_name = "weight_update_group";
    std::string backend = "auto";       ///< auto (nccl on CUDA, else gloo), gloo, nccl
    int64_t bucket_bytes = 256ll << 20; ///< tensors per /update_weights_from_distributed
    bool flattened = false;             ///< one uint8 broadcast per bucket
    /// Send CRC-32C per tensor: "auto" (when the server is rlhost serve),
    /// true or false (SGLang refuses unknown fields).
    std::string checksums = "auto";
    std::string dtype = "native"; ///< native, float32, bfloat16
    /// protocol vllm, mode distributed: how the NCCL unique id reaches the
    /// server. "store": vLLM's StatelessProcessGroup (a TCPStore the trainer
    /// hosts at master_address:master_port); "unique_id": base64 in the
    /// request (init_info.nccl_unique_id_b64), no store.
    std::string rendezvous = "store";
    /// Update even when the server reports this version already (a server
    /// started from other weights than the trainer's).
    bool force = false;
    static SyncOptions from_json(const nlohmann::json &j);
};

struct SyncOutcome {
    bool skipped = false; ///< the server already had this version
    int64_t version = 0;
    int64_t tensors = 0;
    uint64_t bytes = 0;
    double seconds = 0;
    std::string server_version; ///< weight_version the server reports after
};

/// init_info of vLLM's /init_weight_transfer_engine as this client sends it
/// (vLLM 0.33.0's NCCL engine): the trainer is rank 0 and the server's
/// `workers` ranks follow it; with `unique_id` (rendezvous "unique_id") the id
/// goes as standard base64 in nccl_unique_id_b64 instead of master_address and
/// master_port.
nlohmann::json vllm_init_info(const SyncOptions &options, int workers, int master_port,
                              const std::array<uint8_t, 128> *unique_id);

class InferenceClient {
public:
    explicit InferenceClient(ClientOptions options);
    const ClientOptions &options() const { return options_; }

    /// One JSON call; the parsed body (null for an empty one, a string for
    /// plain text). A non-2xx answer throws naming the endpoint, the status
    /// and the server's message.
    nlohmann::json call(const std::string &method, const std::string &path,
                        const nlohmann::json &body = nullptr, double timeout_s = -1) const;

    /// The server's weight_version ("" when it reports none).
    std::string weight_version() const;
    void pause() const;
    void resume() const;

    /// Brings the server to `policy`'s weights, labelled `version`.
    SyncOutcome sync(const core::Policy &policy, int64_t version, const SyncOptions &options) const;

private:
    SyncOutcome sync_disk(const core::Policy &policy, int64_t version,
                          const SyncOptions &options) const;
    SyncOutcome sync_distributed(const core::Policy &policy, int64_t version,
                                 const SyncOptions &options) const;
    SyncOutcome sync_vllm_nccl(const core::Policy &policy, int64_t version,
                               const SyncOptions &options) const;
    ClientOptions options_;
};

} // namespace rl::serve
