// abi/rl/serve.h: the inference server (host/serve) over a loaded model.
#include "handle_verbs.hpp"

#include "serve/server.hpp"

struct rl_server {
    std::unique_ptr<rl::serve::Server> impl;
};

extern "C" {

RL_API rl_status_t rl_server_start(rl_model_t *model, const char *options_json,
                                   rl_server_t **out_server) {
    return start_server<rl_server, rl::serve::ServerConfig>(
        "rl_server_start", model, options_json, out_server,
        [&](rl_server &s, const rl::serve::ServerConfig &config) {
            s.impl = std::make_unique<rl::serve::Server>(model->policy, config);
        });
}

RL_API int32_t rl_server_port(const rl_server_t *server) {
    return server && server->impl ? server->impl->port() : 0;
}

RL_API rl_status_t rl_server_wait(rl_server_t *server) {
    return on_handle("rl_server_wait", "server", server, [](rl_server &s) { s.impl->wait(); });
}

RL_API rl_status_t rl_server_stop(rl_server_t *server) {
    return on_handle("rl_server_stop", "server", server, [](rl_server &s) { s.impl->stop(); });
}

RL_API void rl_server_destroy(rl_server_t *server) {
    delete server;
}

} // extern "C"
