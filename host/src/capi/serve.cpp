// abi/rl/serve.h: the inference server (host/serve) over a loaded model.
#include "train_common.hpp"

#include "serve/server.hpp"

#include <stdexcept>

struct rl_server {
    std::unique_ptr<rl::serve::Server> impl;
};

extern "C" {

RL_API rl_status_t rl_server_start(rl_model_t *model, const char *options_json,
                                   rl_server_t **out_server) {
    return train_boundary([&] {
        const char *fn = "rl_server_start";
        require(model && out_server, fn_msg(fn, "model and out_server are required"));
        policy_of(model, fn);
        const rl::serve::ServerConfig config =
            rl::serve::ServerConfig::from_json(options_json ? options_json : "");
        auto s = std::make_unique<rl_server>();
        s->impl = std::make_unique<rl::serve::Server>(model->policy, config);
        try {
            s->impl->start();
        } catch (const std::runtime_error &e) {
            throw HostError{RL_ERR_IO, fn_msg(fn, e.what())};
        }
        *out_server = s.release();
        return RL_OK;
    });
}

RL_API int32_t rl_server_port(const rl_server_t *server) {
    return server && server->impl ? server->impl->port() : 0;
}

RL_API rl_status_t rl_server_wait(rl_server_t *server) {
    return train_boundary([&] {
        require(server != nullptr, "rl_server_wait: server is NULL");
        server->impl->wait();
        return RL_OK;
    });
}

RL_API rl_status_t rl_server_stop(rl_server_t *server) {
    return train_boundary([&] {
        require(server != nullptr, "rl_server_stop: server is NULL");
        server->impl->stop();
        return RL_OK;
    });
}

RL_API void rl_server_destroy(rl_server_t *server) {
    delete server;
}

} // extern "C"
