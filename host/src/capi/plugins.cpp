// The embedder API (abi/rl/runtime.h): a C boundary over rl::host. No
// exception crosses it; failures set the thread-local last error.
#include "common.hpp"
#include "../bridge/loss_call.hpp"
#include "rl/host/config.hpp"
#include "rl/host/runtime.hpp"
#include "rl/sdk/error.hpp"
#include "rl/core/json.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <set>

using rl::host::CallSink;
using rl::host::HostError;
using rl::host::Instance;
using rl::host::OwnedTensor;
using rl::host::Runtime;

struct rl_runtime {
    std::unique_ptr<Runtime> impl;
};

namespace {

using namespace rl::host::capi;

void spdlog_level(const char *level) {
    if (!level) return;
    auto l = spdlog::level::from_str(level);
    if (l == spdlog::level::off && std::strcmp(level, "off") != 0)
        throw HostError{RL_ERR_INVALID_ARG,
                        std::string("log level '") + level +
                            "' is unknown; valid: trace, debug, info, warn, error, off"};
    spdlog::set_level(l);
}

} // namespace

extern "C" {

RL_API const char *rl_status_name(rl_status_t status) {
    return rl::sdk::status_name(status);
}

RL_API const char *rl_last_error(void) {
    return last_error().c_str();
}
RL_API uint32_t rl_get_abi_version(void) {
    return RL_PLUGIN_ABI_VERSION;
}
RL_API uint32_t rl_get_api_version(void) {
    return RL_API_VERSION;
}
RL_API const char *rl_get_version(void) {
    return RL_VERSION_STRING;
}

RL_API rl_status_t rl_runtime_create(const rl_runtime_desc_t *desc, rl_runtime_t **out_runtime) {
    return boundary([&] {
        require(out_runtime != nullptr, "rl_runtime_create: out_runtime is NULL");
        if (desc)
            require(desc->struct_size >= offsetof(rl_runtime_desc_t, log_level) + sizeof(void *),
                    "rl_runtime_create: desc->struct_size is too small (use RL_RUNTIME_DESC_INIT)");
        static bool logger_ready = [] {
            // Logs go to stderr: stdout belongs to the program (rlhost's
            // --json listings, an embedder's own output).
            spdlog::set_default_logger(std::make_shared<spdlog::logger>(
                "rl", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
            spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
            if (const char *env = std::getenv("RL_LOG_LEVEL")) spdlog_level(env);
            return true;
        }();
        (void)logger_ready;
        if (desc && desc->log_level) spdlog_level(desc->log_level);
        auto rt = std::make_unique<rl_runtime>();
        rt->impl = std::make_unique<Runtime>(desc);
        *out_runtime = rt.release();
        return RL_OK;
    });
}

RL_API void rl_runtime_destroy(rl_runtime_t *runtime) {
    delete runtime;
}

RL_API rl_status_t rl_runtime_load_plugin(rl_runtime_t *runtime, const char *path) {
    return boundary([&] {
        require(runtime && path, "rl_runtime_load_plugin: runtime and path are required");
        runtime->impl->load_path(path, true);
        return RL_OK;
    });
}

RL_API rl_status_t rl_runtime_list_plugins(rl_runtime_t *runtime, rl_result_t **out_result) {
    return boundary([&] {
        require(runtime && out_result,
                "rl_runtime_list_plugins: runtime and out_result are required");
        CallSink sink;
        sink.texts["plugins"] = runtime->impl->plugins_json();
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_instance_create(rl_runtime_t *runtime, const char *kind, const char *name,
                                      const char *params_json, rl_instance_t **out_instance) {
    return boundary([&] {
        require(runtime && kind && name && out_instance,
                "rl_instance_create: runtime, kind, name and out_instance are required");
        auto inst = runtime->impl->create(kind, name, params_json ? params_json : "{}");
        *out_instance = reinterpret_cast<rl_instance_t *>(inst.release());
        return RL_OK;
    });
}

RL_API void rl_instance_destroy(rl_instance_t *instance) {
    delete inst_of(instance);
}

RL_API rl_status_t rl_instance_params(rl_instance_t *instance, rl_result_t **out_result) {
    return boundary([&] {
        require(instance && out_result, "rl_instance_params: instance and out_result are required");
        Instance &inst = *inst_of(instance);
        const rl_plugin_t *p = inst.plugin();
        CallSink sink;
        if (RL_HAS_FIELD(p, rl_plugin_t, get_params) && p->get_params) { // ABI 0.2 slot
            sink = inst.call([&](const rl_call_ctx_t *ctx) { return p->get_params(p, ctx); });
            auto it = sink.texts.find("params");
            const nlohmann::json j = it == sink.texts.end()
                                         ? nlohmann::json()
                                         : rl::core::parse_json_or_discarded(it->second);
            if (!j.is_object())
                throw HostError{RL_ERR_INTERNAL,
                                inst.record().path + ": " + inst.who() +
                                    ": get_params() must emit text 'params' holding a JSON object"};
            sink.scalars["from_plugin"] = 1.0;
        } else { // a 0.1 plugin, or one without the slot: what create() was given
            sink.who = inst.who();
            sink.texts["params"] = inst.create_params();
            sink.scalars["from_plugin"] = 0.0;
        }
        if (inst.record().kind == RL_KIND_ENV) {
            const auto *iface = static_cast<const rl_env_iface_t *>(inst.iface());
            sink.scalars["multi_turn"] = iface->step != nullptr ? 1.0 : 0.0;
        }
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_loss_signature(rl_instance_t *instance, rl_result_t **out_result) {
    return boundary([&] {
        Instance &inst = checked(instance, RL_KIND_LOSS, "rl_loss_signature", out_result);
        const rl::host::LossSignatureLists sig = rl::host::loss_signature(inst);
        nlohmann::json j = {{"required", sig.required},
                            {"optional", sig.optional},
                            {"differentiable", sig.differentiable}};
        CallSink sink;
        sink.who = inst.who();
        // The input names are the plugin's bytes (invalid UTF-8 becomes U+FFFD).
        sink.texts["signature"] = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_loss_compute(rl_instance_t *instance, const rl_loss_inputs_t *inputs,
                                   uint32_t want_grads, rl_result_t **out_result) {
    return boundary([&] {
        Instance &inst = checked(instance, RL_KIND_LOSS, "rl_loss_compute");
        require(inputs && out_result, "rl_loss_compute: inputs and out_result are required");
        require(inputs->struct_size >= sizeof(rl_loss_inputs_t),
                "rl_loss_compute: inputs->struct_size is too small");
        *out_result = new_result(rl::host::compute_loss(inst, *inputs, want_grads != 0));
        return RL_OK;
    });
}

RL_API rl_status_t rl_advantage_compute(rl_instance_t *instance,
                                        const rl_advantage_inputs_t *inputs,
                                        rl_result_t **out_result) {
    return boundary([&] {
        Instance &inst = checked(instance, RL_KIND_ADVANTAGE, "rl_advantage_compute");
        require(inputs && out_result, "rl_advantage_compute: inputs and out_result are required");
        auto *iface = static_cast<const rl_advantage_iface_t *>(inst.iface());
        CallSink sink = inst.call(
            [&](const rl_call_ctx_t *ctx) { return iface->compute(inst.plugin(), ctx, inputs); });
        if (!sink.tensors.count("advantages"))
            throw HostError{RL_ERR_INTERNAL, inst.who() + ": emitted no 'advantages' tensor"};
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_filter_check(rl_instance_t *instance, const rl_rollout_view_t *rollout,
                                   rl_result_t **out_result) {
    return boundary([&] {
        Instance &inst = checked(instance, RL_KIND_FILTER, "rl_filter_check");
        require(rollout && out_result, "rl_filter_check: rollout and out_result are required");
        auto *iface = static_cast<const rl_filter_iface_t *>(inst.iface());
        rl_filter_verdict_t v{};
        v.struct_size = sizeof(v);
        CallSink sink = inst.call([&](const rl_call_ctx_t *ctx) {
            return iface->check(inst.plugin(), ctx, rollout, &v);
        });
        v.reason[sizeof(v.reason) - 1] = '\0';
        sink.scalars["flagged"] = v.flagged ? 1.0 : 0.0;
        sink.scalars["enforce"] = inst.enforce() ? 1.0 : 0.0;
        sink.texts["reason"] = v.reason;
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_transport_send(rl_instance_t *instance, rl_string_view_t header,
                                     const rl_tensor_list_t *tensors) {
    return boundary([&] {
        Instance &inst = checked(instance, RL_KIND_TRANSPORT, "rl_transport_send");
        require(header.data != nullptr || header.length == 0, "rl_transport_send: header is NULL");
        auto *iface = static_cast<const rl_transport_iface_t *>(inst.iface());
        rl_message_view_t m{};
        m.struct_size = sizeof m;
        m.header = header;
        if (tensors != nullptr) m.tensors = *tensors;
        inst.call([&](const rl_call_ctx_t *ctx) { return iface->send(inst.plugin(), ctx, &m); });
        return RL_OK;
    });
}

RL_API rl_status_t rl_transport_recv(rl_instance_t *instance, int64_t timeout_ms,
                                     rl_result_t **out_result) {
    return boundary([&] {
        Instance &inst = checked(instance, RL_KIND_TRANSPORT, "rl_transport_recv", out_result);
        *out_result = nullptr;
        auto *iface = static_cast<const rl_transport_iface_t *>(inst.iface());
        CallSink sink = inst.call(
            [&](const rl_call_ctx_t *ctx) { return iface->recv(inst.plugin(), ctx, timeout_ms); });
        if (sink.texts.find("header") == sink.texts.end())
            throw HostError{RL_ERR_INTERNAL, inst.who() + ": recv() emitted no 'header' text"};
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_env_sample(rl_instance_t *instance, uint64_t n, uint64_t seed,
                                 rl_result_t **out_result) {
    return boundary([&] {
        Instance &inst = checked(instance, RL_KIND_ENV, "rl_env_sample", out_result);
        // A count past this is a caller's bug (a negative number through an unsigned
        // parameter): the env would build tasks until the process ran out of memory.
        constexpr uint64_t kMaxTasks = uint64_t{1} << 20;
        if (n > kMaxTasks)
            throw HostError{RL_ERR_INVALID_ARG, "rl_env_sample: n " + std::to_string(n) +
                                                    " is more than " + std::to_string(kMaxTasks) +
                                                    " tasks in one call (a negative count?)"};
        auto *iface = static_cast<const rl_env_iface_t *>(inst.iface());
        CallSink sink = inst.call(
            [&](const rl_call_ctx_t *ctx) { return iface->sample(inst.plugin(), ctx, n, seed); });
        auto it = sink.texts.find("tasks");
        if (it == sink.texts.end())
            throw HostError{RL_ERR_INTERNAL, inst.who() + ": sample() emitted no 'tasks' text"};
        nlohmann::json tasks = rl::core::parse_json_or_discarded(it->second);
        if (tasks.is_discarded() || !tasks.is_array() || tasks.size() != n)
            throw HostError{RL_ERR_INTERNAL, inst.who() + ": sample() must emit a JSON array of " +
                                                 std::to_string(n) + " tasks"};
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_env_score(rl_instance_t *instance, rl_string_view_t task,
                                rl_string_view_t completion, rl_result_t **out_result) {
    return boundary([&] {
        Instance &inst = checked(instance, RL_KIND_ENV, "rl_env_score", out_result);
        auto *iface = static_cast<const rl_env_iface_t *>(inst.iface());
        double reward = 0;
        CallSink sink = inst.call([&](const rl_call_ctx_t *ctx) {
            return iface->score(inst.plugin(), ctx, task, completion, &reward);
        });
        if (!std::isfinite(reward))
            throw HostError{RL_ERR_NUMERIC, inst.who() + ": score() returned a non-finite reward"};
        sink.scalars["reward"] = reward;
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_env_step(rl_instance_t *instance, rl_string_view_t task,
                               rl_string_view_t state, rl_string_view_t completion,
                               rl_result_t **out_result) {
    return boundary([&] {
        Instance &inst = checked(instance, RL_KIND_ENV, "rl_env_step", out_result);
        auto *iface = static_cast<const rl_env_iface_t *>(inst.iface());
        if (iface->step == nullptr)
            throw HostError{RL_ERR_UNSUPPORTED,
                            inst.who() + ": this env is single-turn (its step() is NULL)"};
        CallSink sink = inst.call([&](const rl_call_ctx_t *ctx) {
            return iface->step(inst.plugin(), ctx, task, state, completion);
        });
        const auto bad = [&](const std::string &why) {
            return HostError{RL_ERR_INTERNAL, inst.who() + ": step() " + why};
        };
        auto it = sink.texts.find("state");
        if (it == sink.texts.end()) throw bad("emitted no 'state' text");
        const nlohmann::json r = rl::core::parse_json_or_discarded(it->second);
        if (r.is_discarded() || !r.is_object())
            throw bad("must emit a JSON object as 'state', got: " + it->second.substr(0, 200));
        if (!r.contains("done") || !r["done"].is_boolean())
            throw bad("result has no boolean 'done'");
        const bool done = r["done"].get<bool>();
        double reward = 0;
        if (r.contains("reward") && !r["reward"].is_null()) {
            if (!r["reward"].is_number()) throw bad("result 'reward' is not a number");
            reward = r["reward"].get<double>();
            if (!std::isfinite(reward)) throw bad("returned a non-finite reward");
        }
        // "observation" (ABI 0.9); "prompt" is its older name.
        const char *obs_key = r.contains("observation") ? "observation" : "prompt";
        std::string observation;
        if (r.contains(obs_key) && !r[obs_key].is_null()) {
            if (!r[obs_key].is_string())
                throw bad(std::string("result '") + obs_key + "' is not a string");
            observation = r[obs_key].get<std::string>();
        } else if (!done) {
            throw bad("result is not done but has no string 'observation'");
        }
        std::string role = "user";
        if (r.contains("role") && !r["role"].is_null()) {
            if (!r["role"].is_string() ||
                (r["role"].get<std::string>() != "user" && r["role"].get<std::string>() != "tool"))
                throw bad("result 'role' must be \"user\" or \"tool\"");
            role = r["role"].get<std::string>();
        }
        sink.texts["state"] = r.contains("state") ? r["state"].dump() : std::string("null");
        sink.texts["observation"] = observation;
        sink.texts["role"] = role;
        sink.scalars["done"] = done ? 1.0 : 0.0;
        sink.scalars["reward"] = reward;
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API void rl_result_destroy(rl_result_t *result) {
    delete result;
}

RL_API rl_status_t rl_result_json(const rl_result_t *result, rl_string_view_t *out_json) {
    return boundary([&] {
        require(result && out_json, "rl_result_json: result and out_json are required");
        auto *r = const_cast<rl_result_t *>(result);
        std::call_once(r->json_once, [r] { r->json_cache = r->sink.to_json(); });
        *out_json = rl_string_view_t{r->json_cache.data(), r->json_cache.size()};
        return RL_OK;
    });
}

#define RL_RESULT_LOOKUP(map_, what)                                                               \
    require(result &&name &&out,                                                                   \
            std::string("rl_result_") + what + ": result, name and out are required");             \
    auto it = result->sink.map_.find(name);                                                        \
    if (it == result->sink.map_.end())                                                             \
        return set_error(RL_ERR_NOT_FOUND,                                                         \
                         std::string("result has no ") + what + " '" + name + "'");

RL_API rl_status_t rl_result_scalar(const rl_result_t *result, const char *name, double *out) {
    return boundary([&]() -> rl_status_t {
        RL_RESULT_LOOKUP(scalars, "scalar")
        *out = it->second;
        return RL_OK;
    });
}

RL_API rl_status_t rl_result_metric(const rl_result_t *result, const char *name, double *out) {
    return boundary([&]() -> rl_status_t {
        RL_RESULT_LOOKUP(metrics, "metric")
        *out = it->second;
        return RL_OK;
    });
}

RL_API rl_status_t rl_result_text(const rl_result_t *result, const char *name,
                                  rl_string_view_t *out) {
    return boundary([&]() -> rl_status_t {
        RL_RESULT_LOOKUP(texts, "text")
        *out = rl_string_view_t{it->second.data(), it->second.size()};
        return RL_OK;
    });
}

RL_API rl_status_t rl_result_tensor(const rl_result_t *result, const char *name,
                                    rl_tensor_view_t *out) {
    return boundary([&]() -> rl_status_t {
        RL_RESULT_LOOKUP(tensors, "tensor")
        *out = it->second.view();
        return RL_OK;
    });
}

} // extern "C"
