// abi/rl/training_server.h (ABI 0.5): the Tinker-compatible training server
// (host/serve/training_server.hpp) over a loaded model, with the runtime's
// loss plugins available by name.
#include "handle_verbs.hpp"

#include <rl/training_server.h>
#include "../bridge/loss_node.hpp"

#include "serve/training_server.hpp"

struct rl_training_server {
    std::shared_ptr<rl::core::Policy> policy;
    std::unique_ptr<rl::serve::TrainingServer> impl;
};

extern "C" {

RL_API rl_status_t rl_training_server_start(rl_runtime_t *runtime, rl_model_t *model,
                                            const char *options_json,
                                            rl_training_server_t **out_server) {
    return start_server<rl_training_server, rl::serve::TrainingServerConfig>(
        "rl_training_server_start", model, options_json, out_server,
        [&](rl_training_server &s, const rl::serve::TrainingServerConfig &config) {
            s.policy = model->policy;
            s.impl = std::make_unique<rl::serve::TrainingServer>(
                model->policy, config, rl::host::bridge::loss_factory(runtime));
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
