// Bodies the C calls on engine and server handles share.
#pragma once

#include "train_common.hpp"

#include <memory>
#include <stdexcept>
#include <string>

namespace rl::host::capi {

// A call that only acts on a handle (wait, stop, sleep, wake_up): the handle,
// named `name` in the error, must not be NULL; then op(*handle).
template <class H, class Op>
rl_status_t on_handle(const char *fn, const char *name, H *handle, Op &&op) {
    return train_boundary([&] {
        require(handle != nullptr, fn_msg(fn, std::string(name) + " is NULL"));
        op(*handle);
        return RL_OK;
    });
}

// The body of rl_server_start and rl_training_server_start: a new handle H
// over `model` whose server make(handle, config) builds from `options_json`
// (Config::from_json; NULL reads as ""), started; one that cannot listen is
// RL_ERR_IO. `fn` names the call in errors.
template <class H, class Config, class Make>
rl_status_t start_server(const char *fn, rl_model_t *model, const char *options_json, H **out,
                         Make &&make) {
    return train_boundary([&] {
        require(model && out, fn_msg(fn, "model and out_server are required"));
        policy_of(model, fn);
        const Config config = Config::from_json(options_json ? options_json : "");
        auto h = std::make_unique<H>();
        make(*h, config);
        try {
            h->impl->start();
        } catch (const std::runtime_error &e) {
            throw HostError{RL_ERR_IO, fn_msg(fn, e.what())};
        }
        *out = h.release();
        return RL_OK;
    });
}

} // namespace rl::host::capi
