// abi/rl/training_server.h (ABI 0.5): the Tinker-compatible training server
// (host/serve/training_server.hpp) over a loaded model, with the runtime's
// loss plugins available by name.
#include "handle_verbs.hpp"

#include <rl/training_server.h>
#include "../bridge/loss_node.hpp"

#include "serve/training_server.hpp"

#include <mutex>

struct rl_training_server {
    std::shared_ptr<rl::core::Policy> policy;
    std::unique_ptr<rl::serve::TrainingServer> impl;
};

namespace {

// Loss plugins by name: one instance per call (its parameters are the call's
// loss_fn_config), destroyed with the loss function.
rl::serve::LossFactory plugin_losses(rl_runtime_t *runtime) {
    if (runtime == nullptr) return {};
    auto mu = std::make_shared<std::mutex>();
    return [runtime, mu](const std::string &name, const std::string &params) {
        rl_instance_t *inst = nullptr;
        {
            std::lock_guard<std::mutex> lock(*mu);
            const rl_status_t st =
                rl_instance_create(runtime, RL_KIND_LOSS, name.c_str(), params.c_str(), &inst);
            if (st != RL_OK)
                throw rl::core::Error(st == RL_ERR_NOT_FOUND ? rl::core::ErrorKind::NotFound
                                                             : rl::core::ErrorKind::InvalidArgument,
                                      rl_last_error());
        }
        std::shared_ptr<rl_instance_t> owner(inst, [mu](rl_instance_t *i) {
            std::lock_guard<std::mutex> lock(*mu);
            rl_instance_destroy(i);
        });
        rl::core::LossFunction f =
            rl::host::bridge::loss_node(checked(inst, RL_KIND_LOSS, "rl_training_server_start"));
        auto compute = f.compute;
        f.compute = [owner, compute](const rl::core::LossCall &call) { return compute(call); };
        return f;
    };
}

} // namespace

extern "C" {

RL_API rl_status_t rl_training_server_start(rl_runtime_t *runtime, rl_model_t *model,
                                            const char *options_json,
                                            rl_training_server_t **out_server) {
    return start_server<rl_training_server, rl::serve::TrainingServerConfig>(
        "rl_training_server_start", model, options_json, out_server,
        [&](rl_training_server &s, const rl::serve::TrainingServerConfig &config) {
            s.policy = model->policy;
            s.impl = std::make_unique<rl::serve::TrainingServer>(model->policy, config,
                                                                 plugin_losses(runtime));
        });
}

RL_API int32_t rl_training_server_port(const rl_training_server_t *server) {
    return server && server->impl ? server->impl->port() : 0;
}

RL_API rl_status_t rl_training_server_wait(rl_training_server_t *server) {
    return on_handle("rl_training_server_wait", "server", server,
                     [](rl_training_server &s) { s.impl->wait(); });
}

RL_API rl_status_t rl_training_server_stop(rl_training_server_t *server) {
    return on_handle("rl_training_server_stop", "server", server,
                     [](rl_training_server &s) { s.impl->stop(); });
}

RL_API void rl_training_server_destroy(rl_training_server_t *server) {
    delete server;
}

} // extern "C"
