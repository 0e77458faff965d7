// Shared by the translation units of the training C API (abi/rl/train.h):
// the handles, the exception boundary over core/ and libtorch errors, and
// tensor conversion between ABI views and ATen tensors. Internal to librl.
#pragma once

#include "common.hpp"
#include "rl/host/runtime.hpp"

#include "rl/core/buffer.hpp"
#include "rl/core/engine.hpp"
#include "rl/core/error.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/trainer.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

// A model (rl_model_load: `policy`), or a tokenizer alone (rl_tokenizer_load:
// `tokenizer`, no policy). Calls that need weights refuse the latter.
struct rl_model {
    std::shared_ptr<rl::core::Policy> policy;
    std::shared_ptr<const rl::core::Tokenizer> tokenizer;
    int64_t synced_version = -1; ///< the weight set received last (rl_weights_recv)
};
struct rl_trainer {
    std::shared_ptr<rl::core::Policy> policy;
    std::unique_ptr<rl::core::Trainer> impl;
};
struct rl_engine {
    std::shared_ptr<rl::core::Policy> policy;
    std::unique_ptr<rl::core::Engine> impl;
};
struct rl_buffer {
    std::unique_ptr<rl::core::RolloutBuffer> impl;
};

namespace rl::host::capi {

// boundary() plus the error types of core/ and libtorch.
template <class F>
rl_status_t train_boundary(F &&f) noexcept {
    return boundary([&]() -> rl_status_t {
        try {
            return f();
        } catch (const rl::core::Error &e) {
            throw HostError{status_of(e.kind()), e.what()};
        } catch (const c10::Error &e) {
            throw HostError{RL_ERR_INTERNAL,
                            std::string("libtorch: ") + e.what_without_backtrace()};
        } catch (const std::invalid_argument &e) {
            throw HostError{RL_ERR_INVALID_ARG, e.what()};
        }
    });
}

// "<fn>: <msg>".
std::string fn_msg(const char *fn, const std::string &msg);

// The options argument of a verb: a JSON object (NULL: none).
nlohmann::json options_arg(const char *options_json, const char *fn);
// Refuses option `key` of a verb's options as unknown or of the wrong type,
// listing the `valid` ones.
[[noreturn]] void bad_option(const char *fn, const std::string &key, const char *valid);

// The model's policy; a tokenizer handle (rl_tokenizer_load) is refused with
// RL_ERR_BAD_STATE naming `fn`.
rl::core::Policy &policy_of(const rl_model_t *model, const char *fn);
// The tokenizer of a model or tokenizer handle; refused naming `fn` when the
// model folder had none.
const rl::core::Tokenizer &tokenizer_of(const rl_model_t *model, const char *fn);

// The body of rl_engine_create and rl_trainer_create: a new handle H over
// `model`'s policy whose core object is built from `config_json`
// (Config::from_json; NULL reads as ""); `fn` and `out_name` name the call
// and its out argument in errors.
template <class Config, class H>
rl_status_t create_over_policy(rl_model_t *model, const char *config_json, H **out, const char *fn,
                               const char *out_name) {
    return train_boundary([&] {
        require(model && out, std::string(fn) + ": model and " + out_name + " are required");
        policy_of(model, fn);
        auto h = std::make_unique<H>();
        h->policy = model->policy;
        using Impl = typename decltype(h->impl)::element_type;
        h->impl = std::make_unique<Impl>(model->policy,
                                         Config::from_json(config_json ? config_json : ""));
        *out = h.release();
        return RL_OK;
    });
}

// Text -> ids where the text is `prefix + content + suffix` of a rendered chat
// template and only the template's own special tokens count: special-token
// text inside the contents is plain text (docs/model.md, "Special tokens in
// user text"). Renders `messages` once with placeholders to find each content
// span and refuses a template that alters the contents.
std::vector<int32_t> encode_chat_plain(
    const rl::core::Tokenizer &tok, const std::vector<rl::core::ChatMessage> &messages,
    const std::function<std::string(const std::vector<rl::core::ChatMessage> &)> &render,
    std::string *rendered, const char *fn);

// A JSON argument (null when text is NULL); errors name `what`.
nlohmann::json parse_json(const char *text, const std::string &what);

// ---- tensors ----------------------------------------------------------------

at::ScalarType scalar_type_of(rl_dtype_t d, const std::string &what);
rl_dtype_t dtype_of(at::ScalarType t);
at::Tensor tensor_from_owned(const OwnedTensor &o, const std::string &what);
// A copy of a borrowed view; errors name `what`.
at::Tensor tensor_from_view(const rl_tensor_view_t &v, const std::string &what);
OwnedTensor owned_from_tensor(const at::Tensor &t);
// A 1-D integer view as int64 values.
std::vector<int64_t> int_vector(const rl_tensor_view_t &v, const std::string &what);

template <class T>
OwnedTensor owned_from_vector(const std::vector<T> &v, rl_dtype_t dtype) {
    OwnedTensor o;
    o.dtype = dtype;
    o.shape = {static_cast<int64_t>(v.size())};
    o.bytes.resize(v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(o.bytes.data(), v.data(), o.bytes.size());
    return o;
}

} // namespace rl::host::capi

// The names every translation unit of the training C API uses (internal
// header: these never reach an installed one).
using namespace rl::host::capi;
using nlohmann::json;
using rl::host::CallSink;
using rl::host::HostError;
using rl::host::Instance;
using rl::host::OwnedTensor;
namespace core = rl::core;
