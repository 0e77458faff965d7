// host/src/disagg: the three-role protocol of abi/rl/disagg.h. This header:
// its messages (a JSON header with the protocol version + named tensors), the
// channels of the three roles over the transport plugins, and the settings
// every role reads. Internal to librl.
#pragma once

#include <rl/disagg.h>

#include "capi/common.hpp"
#include "rl/host/runtime.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rl::host::disagg {

using json = nlohmann::json;
// The host's names and the C API's boundary, as host/src/capi uses them.
using capi::boundary;
using capi::new_result;
using capi::require;
using rl::host::HostError;
using rl::host::OwnedTensor;

// One message: its header and its tensors by name.
struct Msg {
    json header;
    std::map<std::string, OwnedTensor> tensors;
};

// The settings of config_json (abi/rl/disagg.h).
struct Settings {
    std::string transport; // "zmq" | "filesystem"
    std::string dir, host, timeout_name, state_dir;
    int64_t port = 0, hwm = 64, workers = 1, steps = 0, checkpoint_every = 0;
    int64_t max_async_level = 1, min_rollouts = 1;
    double timeout = 120;
    bool resume = false;

    // Parses and checks config_json; errors name `fn` and the key.
    static Settings parse(const char *config_json, const char *fn);
    int64_t timeout_ms() const { return static_cast<int64_t>(timeout * 1000); }
    // "rollout_transport.timeout (3s)"
    std::string timeout_text() const;
    // The last checkpoint surely saved at `version` (0: none before the end).
    int64_t checkpoint_floor(int64_t version) const;
};

struct InstanceDeleter {
    void operator()(rl_instance_t *i) const { rl_instance_destroy(i); }
};
using Transport = std::unique_ptr<rl_instance_t, InstanceDeleter>;

// A transport instance of `runtime` (plugin `name`, parameters `params`).
Transport open_transport(rl_runtime_t *runtime, const std::string &name, const json &params);

// The channels of the three roles (zmq ports from `port` = P; filesystem
// channels of the shared folder):
//   orchestrator -> trainer    batches   zmq: the trainer binds P      fs: batches
//   workers, trainer -> orch.  rollouts, acknowledgements  zmq: the orchestrator binds P + 1
//                                                           fs: to_orch_w<K>, to_orch_trainer
//   orchestrator -> worker K   credits   zmq: worker K binds P + 2 + K fs: credits_<K>
Transport to_trainer(rl_runtime_t *rt, const Settings &s, bool reading);
Transport to_orchestrator(rl_runtime_t *rt, const Settings &s, const std::string &who,
                          bool reading);
Transport to_worker(rl_runtime_t *rt, const Settings &s, int64_t k, bool reading);
// Removes the folders `names` of `dir` (absent ones are fine).
void clear(const std::string &dir, const std::vector<std::string> &names);

// Sends `m` with "protocol" set in its header; errors name `what`.
void send(rl_instance_t *t, const Msg &m, const std::string &what);
// Receives one message within timeout_ms (0: poll). A message of another
// protocol version is refused naming both versions and its sender; `who` names
// the receiving side in errors.
std::optional<Msg> recv(rl_instance_t *t, int64_t timeout_ms, const std::string &who);

// Monotonic seconds.
double clock_s();
void sleep_s(double seconds);
// Prints one line on stdout and flushes it.
void say(const std::string &line);
// printf-style formatting into a std::string.
std::string fmt(const char *format, ...) __attribute__((format(printf, 1, 2)));

} // namespace rl::host::disagg

// The C handles of abi/rl/disagg.h (disagg.cpp).
struct rl_disagg_worker;
struct rl_disagg_trainer;
