// rl/host/runtime.hpp: the plugin host. Loads plugin libraries, negotiates the
// ABI, keeps a registry by kind and name, creates instances and calls them.
// One failing library never takes the host down: it is recorded as refused
// with a precise reason.
#pragma once

#include <rl_api.h>

#include "sink.hpp"

#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace rl::host {

class Library;

struct PluginRecord {
    const rl_plugin_desc_t *desc = nullptr;
    Library *library = nullptr;
    std::string path;
    std::string kind, name, id, version, description;
    std::vector<std::string> features;
};

struct Refusal {
    std::string path;
    std::string reason;
};

// Thrown by the host's own code; the C API turns it into status + message.
struct HostError {
    rl_status_t status;
    std::string message;
};

class Runtime;

// An instance of a plugin, as the embedder sees it.
class Instance {
public:
    Instance(Runtime *rt, const PluginRecord *rec, const rl_plugin_t *plugin, const void *iface,
             bool enforce, std::string create_params);
    ~Instance();
    Instance(const Instance &) = delete;
    Instance &operator=(const Instance &) = delete;

    const PluginRecord &record() const { return *rec_; }
    const void *iface() const { return iface_; }
    const rl_plugin_t *plugin() const { return plugin_; }
    bool enforce() const { return enforce_; }
    // The JSON parameters the host passed to create().
    const std::string &create_params() const { return create_params_; }
    std::string who() const { return rec_->kind + " '" + rec_->name + "'"; }

    // Runs fn(ctx) as one call into the plugin; on a failing status, throws a
    // HostError carrying the plugin's message. Exceptions that escape a plugin
    // are caught here.
    template <class F>
    CallSink call(F &&fn);

    Runtime *runtime() const { return rt_; }

private:
    Runtime *rt_;
    const PluginRecord *rec_;
    const rl_plugin_t *plugin_;
    const void *iface_;
    bool enforce_;
    std::string create_params_;
};

class Runtime {
public:
    explicit Runtime(const rl_runtime_desc_t *desc);
    ~Runtime();
    Runtime(const Runtime &) = delete;
    Runtime &operator=(const Runtime &) = delete;

    // Load a file, or every *.so in a folder. Returns the number of plugins
    // registered; refusals are recorded. `explicit_request`: a single file that
    // fails to load throws (the embedder asked for exactly it).
    size_t load_path(const std::string &path, bool explicit_request);

    const std::vector<PluginRecord> &plugins() const { return plugins_; }
    const std::vector<Refusal> &refused() const { return refused_; }
    const PluginRecord *find(const std::string &kind, const std::string &name) const;
    std::string plugins_json() const;

    std::unique_ptr<Instance> create(const std::string &kind, const std::string &name,
                                     const std::string &params_json);

    const rl_host_api_t *host_api() const { return &host_api_; }
    // The thread that created the runtime: the [control-thread].
    bool on_control_thread() const { return std::this_thread::get_id() == control_thread_; }
    void register_instance(Instance *inst);
    void unregister_instance(Instance *inst);

private:
    Library *load_library(const std::string &path); // throws HostError with the refusal reason
    void refuse(const std::string &path, const std::string &reason);

    rl_host_api_t host_api_{};
    std::thread::id control_thread_ = std::this_thread::get_id();
    std::vector<std::unique_ptr<Library>> libraries_;
    std::vector<PluginRecord> plugins_;
    std::vector<Refusal> refused_;
    std::vector<std::string> loaded_paths_; // canonical
    std::vector<Instance *> instances_;
};

// The host services table shared by every runtime (host_data points to the runtime).
void fill_host_api(rl_host_api_t *api, Runtime *rt);
// Per-call context bound to a sink.
rl_call_ctx_t make_call_ctx(const rl_host_api_t *api, CallSink *sink);
// Last error-level message a plugin logged on this thread (for init failures).
std::string take_last_plugin_log();
// A warning in the host's log (for the libtorch side of librl, which cannot
// use spdlog itself).
void log_warning(const std::string &message);

// The folders searched by default: RL_PLUGIN_PATH entries, then the build's
// and the install's plugin folders found next to librl itself.
std::vector<std::string> default_plugin_paths();

template <class F>
CallSink Instance::call(F &&fn) {
    CallSink sink;
    sink.who = who();
    rl_call_ctx_t ctx = make_call_ctx(rt_->host_api(), &sink);
    rl_status_t st;
    try {
        st = fn(&ctx);
    } catch (...) {
        throw HostError{RL_ERR_INTERNAL,
                        who() + ": an exception escaped the plugin across the C ABI (a plugin "
                                "bug: wrap plugin code with the SDK boundary)"};
    }
    if (st != RL_OK) {
        std::string msg = sink.failed ? sink.fail_message : std::string("no message given");
        throw HostError{st, who() + ": " + msg + " (" + rl_status_name(st) + ")"};
    }
    return sink;
}

} // namespace rl::host
