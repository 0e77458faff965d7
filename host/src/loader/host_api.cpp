// The rl_host_api_t table: services a plugin reaches through its host pointer.
#include "rl/host/runtime.hpp"

#include "untrusted.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

namespace rl::host {

// The rl.host.collective/1 table (host/src/capi/collective.cpp, over libtorch).
const void *collective_extension();

namespace {

thread_local std::string g_last_plugin_log;

CallSink *sink_of(const rl_call_ctx_t *ctx) {
    return ctx ? static_cast<CallSink *>(ctx->host_data) : nullptr;
}

uint32_t RL_ABI ext_is_control_thread(const rl_host_api_t *host) {
    auto *rt = host ? static_cast<const Runtime *>(host->host_data) : nullptr;
    return rt && rt->on_control_thread() ? 1u : 0u;
}

const rl_host_thread_check_t k_thread_check = {sizeof(rl_host_thread_check_t), 0,
                                               &ext_is_control_thread};

// Every extension this host provides (documented in abi/rl/host.h).
struct Extension {
    const char *id;
    const void *table;
};
const Extension k_extensions[] = {
    {RL_EXT_HOST_THREAD_CHECK, &k_thread_check},
    {RL_EXT_HOST_COLLECTIVE, nullptr}, // collective_extension()
};

const void *RL_ABI api_get_extension(const rl_host_api_t *, const char *id) {
    if (!id) return nullptr;
    for (const Extension &e : k_extensions)
        if (std::strcmp(e.id, id) == 0) return e.table ? e.table : collective_extension();
    return nullptr;
}

void RL_ABI api_log(const rl_host_api_t *, rl_log_level_t level, const char *msg) {
    if (!msg) return;
    // RL_LOG_TRACE .. RL_LOG_WARN; RL_LOG_ERROR and unknown levels are errors,
    // kept as the last plugin error.
    static constexpr spdlog::level::level_enum below_error[] = {
        spdlog::level::trace, spdlog::level::debug, spdlog::level::info, spdlog::level::warn};
    // The text is the plugin's: escaped (invalid UTF-8, terminal control
    // sequences) and cut at kMaxPluginMessageBytes before it is logged or kept.
    if (level >= RL_LOG_TRACE && level < RL_LOG_ERROR) {
        if (spdlog::should_log(below_error[level]))
            spdlog::log(below_error[level], "[plugin] {}", plugin_message(msg));
    } else {
        g_last_plugin_log = plugin_message(msg);
        spdlog::error("[plugin] {}", g_last_plugin_log);
    }
}

rl_status_t RL_ABI api_fail(const rl_call_ctx_t *ctx, rl_status_t status, const char *msg) {
    if (CallSink *s = sink_of(ctx)) {
        s->failed = true;
        s->fail_status = status;
        s->fail_message = msg ? plugin_message(msg) : ""; // escaped and cut, as for log()
    }
    return status == RL_OK ? RL_ERR_UNKNOWN : status;
}

// Any power of two: below the pointer size the block is aligned further (an
// address aligned to 8 is aligned to 1, 2 and 4), as aligned_alloc needs. A
// size that cannot be rounded up to the alignment gets NULL, never a block
// smaller than asked.
void *RL_ABI api_mem_alloc(const rl_host_api_t *, size_t size, size_t align) {
    if (align == 0) align = 16;
    if ((align & (align - 1)) != 0) return nullptr;
    if (align < sizeof(void *)) align = sizeof(void *);
    if (size > std::numeric_limits<size_t>::max() - (align - 1)) return nullptr;
    const size_t rounded = (size + align - 1) / align * align;
    return std::aligned_alloc(align, rounded == 0 ? align : rounded);
}

void RL_ABI api_mem_free(const rl_host_api_t *, void *ptr) {
    std::free(ptr);
}

bool name_ok(const char *name) {
    return name && *name;
}

rl_status_t RL_ABI api_emit_metric(const rl_call_ctx_t *ctx, const char *name, double value) {
    CallSink *s = sink_of(ctx);
    if (!s) return RL_ERR_BAD_STATE;
    if (!name_ok(name)) return RL_ERR_INVALID_ARG;
    if (!s->metrics.emplace(name, value).second) return RL_ERR_INVALID_ARG;
    return RL_OK;
}

rl_status_t RL_ABI api_emit_metric_reduced(const rl_call_ctx_t *ctx, const char *name, double value,
                                           rl_metric_reduction_t reduction, double weight) {
    CallSink *s = sink_of(ctx);
    if (!s) return RL_ERR_BAD_STATE;
    if (reduction < RL_METRIC_DEFAULT || reduction > RL_METRIC_MAX) return RL_ERR_INVALID_ARG;
    if (!std::isfinite(weight) || weight < 0) return RL_ERR_INVALID_ARG;
    const rl_status_t st = api_emit_metric(ctx, name, value);
    if (st == RL_OK) s->reductions[name] = MetricReduction{reduction, weight};
    return st;
}

rl_status_t RL_ABI api_emit_tensor(const rl_call_ctx_t *ctx, const char *name,
                                   const rl_tensor_view_t *view) {
    CallSink *s = sink_of(ctx);
    if (!s) return RL_ERR_BAD_STATE;
    if (!name_ok(name) || !view) return RL_ERR_INVALID_ARG;
    if (s->tensors.count(name)) return RL_ERR_INVALID_ARG;
    try {
        s->tensors.emplace(name, OwnedTensor::copy_of(*view));
    } catch (const HostError &e) {
        return e.status;
    } catch (const std::bad_alloc &) {
        return RL_ERR_OUT_OF_MEMORY;
    }
    return RL_OK;
}

rl_status_t RL_ABI api_emit_text(const rl_call_ctx_t *ctx, const char *name,
                                 rl_string_view_t text) {
    CallSink *s = sink_of(ctx);
    if (!s) return RL_ERR_BAD_STATE;
    if (!name_ok(name) || (!text.data && text.length)) return RL_ERR_INVALID_ARG;
    if (s->texts.count(name)) return RL_ERR_INVALID_ARG;
    try {
        s->texts.emplace(name,
                         std::string(text.data ? text.data : "", static_cast<size_t>(text.length)));
    } catch (const std::bad_alloc &) {
        return RL_ERR_OUT_OF_MEMORY;
    }
    return RL_OK;
}

} // namespace

void fill_host_api(rl_host_api_t *api, Runtime *rt) {
    std::memset(api, 0, sizeof(*api));
    api->struct_size = sizeof(rl_host_api_t);
    api->abi_version = RL_ABI_VERSION;
    api->host_data = rt;
    api->name = "rl-runtime";
    api->version = rl_get_version();
    api->get_extension = &api_get_extension;
    api->log = &api_log;
    api->fail = &api_fail;
    api->mem_alloc = &api_mem_alloc;
    api->mem_free = &api_mem_free;
    api->emit_metric = &api_emit_metric;
    api->emit_tensor = &api_emit_tensor;
    api->emit_text = &api_emit_text;
    api->emit_metric_reduced = &api_emit_metric_reduced;
}

rl_call_ctx_t make_call_ctx(const rl_host_api_t *api, CallSink *sink) {
    rl_call_ctx_t ctx{};
    ctx.struct_size = sizeof(rl_call_ctx_t);
    ctx.host = api;
    ctx.host_data = sink;
    return ctx;
}

std::string take_last_plugin_log() {
    std::string s;
    s.swap(g_last_plugin_log);
    return s;
}

void log_warning(const std::string &message) {
    spdlog::warn("{}", message);
}

} // namespace rl::host
