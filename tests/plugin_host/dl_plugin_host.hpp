// tests/plugin_host/dl_plugin_host.hpp: a small in-process host for tests
// that drive built plugin libraries through the C ABI only: dlopen the .so,
// call rl_plugin_entry -> init -> factory -> create -> get_interface, and
// capture what a call emits (metrics, tensors, texts, the failure message).
// Header-only; link the test with ${CMAKE_DL_LIBS}.
#pragma once

#include <rl_api.h>

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace rltest {

// What one call emitted.
struct Outputs {
    rl_status_t status = RL_OK;
    std::string error; // message given to host->fail
    std::map<std::string, double> metrics;
    std::map<std::string, std::vector<double>> tensors;
    std::map<std::string, rl_dtype_t> dtypes;
    std::map<std::string, std::string> texts;
    bool ok() const { return status == RL_OK; }
};

namespace detail {

inline Outputs *sink(const rl_call_ctx_t *ctx) {
    return ctx ? static_cast<Outputs *>(ctx->host_data) : nullptr;
}

inline double element(const rl_tensor_view_t &v, int64_t i) {
    const char *base = static_cast<const char *>(v.data) + v.byte_offset;
    const int64_t k = i * ((v.ndim == 1 && v.strides) ? v.strides[0] : 1);
    if (v.dtype.code == RL_DTYPE_FLOAT && v.dtype.bits == 64)
        return reinterpret_cast<const double *>(base)[k];
    if (v.dtype.code == RL_DTYPE_FLOAT && v.dtype.bits == 32)
        return reinterpret_cast<const float *>(base)[k];
    if (v.dtype.code == RL_DTYPE_INT && v.dtype.bits == 64)
        return static_cast<double>(reinterpret_cast<const int64_t *>(base)[k]);
    throw std::runtime_error("test host: unsupported emitted dtype");
}

inline void RL_ABI log_fn(const rl_host_api_t *, rl_log_level_t, const char *) {}

inline rl_status_t RL_ABI fail_fn(const rl_call_ctx_t *ctx, rl_status_t status, const char *msg) {
    if (Outputs *o = sink(ctx)) o->error = msg ? msg : "";
    return status;
}

inline void *RL_ABI alloc_fn(const rl_host_api_t *, size_t size, size_t) {
    return std::malloc(size);
}
inline void RL_ABI free_fn(const rl_host_api_t *, void *p) {
    std::free(p);
}

inline rl_status_t RL_ABI metric_fn(const rl_call_ctx_t *ctx, const char *name, double value) {
    Outputs *o = sink(ctx);
    if (!o) return RL_ERR_BAD_STATE;
    if (!o->metrics.emplace(name, value).second) return RL_ERR_INVALID_ARG;
    return RL_OK;
}

inline rl_status_t RL_ABI tensor_fn(const rl_call_ctx_t *ctx, const char *name,
                                    const rl_tensor_view_t *v) {
    Outputs *o = sink(ctx);
    if (!o) return RL_ERR_BAD_STATE;
    if (o->tensors.count(name)) return RL_ERR_INVALID_ARG;
    const int64_t n = v->ndim == 0 ? 1 : v->shape[0];
    std::vector<double> xs(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) xs[static_cast<size_t>(i)] = element(*v, i);
    o->tensors[name] = std::move(xs);
    o->dtypes[name] = v->dtype;
    return RL_OK;
}

inline rl_status_t RL_ABI text_fn(const rl_call_ctx_t *ctx, const char *name,
                                  rl_string_view_t text) {
    Outputs *o = sink(ctx);
    if (!o) return RL_ERR_BAD_STATE;
    if (o->texts.count(name)) return RL_ERR_INVALID_ARG;
    o->texts[name] = std::string(text.data ? text.data : "", static_cast<size_t>(text.length));
    return RL_OK;
}

// Shortest text that reads back as exactly `x` (for JSON parameters).
inline std::string format_double(double x) {
    char buf[64];
    for (int prec = 1; prec <= 17; ++prec) {
        std::snprintf(buf, sizeof buf, "%.*g", prec, x);
        if (std::strtod(buf, nullptr) == x) break;
    }
    return buf;
}

inline const void *RL_ABI ext_fn(const rl_host_api_t *, const char *) {
    return nullptr;
}

inline const rl_host_api_t *host_api() {
    static const rl_host_api_t api = [] {
        rl_host_api_t a{};
        a.struct_size = sizeof(rl_host_api_t);
        a.abi_version = RL_ABI_VERSION;
        a.name = "rltest";
        a.version = "0";
        a.get_extension = &ext_fn;
        a.log = &log_fn;
        a.fail = &fail_fn;
        a.mem_alloc = &alloc_fn;
        a.mem_free = &free_fn;
        a.emit_metric = &metric_fn;
        a.emit_tensor = &tensor_fn;
        a.emit_text = &text_fn;
        return a;
    }();
    return &api;
}

inline rl_call_ctx_t make_ctx(Outputs *o, const volatile int32_t *abort_flag = nullptr) {
    rl_call_ctx_t c{};
    c.struct_size = sizeof(rl_call_ctx_t);
    c.host = host_api();
    c.abort_flag = abort_flag;
    c.host_data = o;
    return c;
}

} // namespace detail

// A 1-d CPU tensor that owns its data, viewable as rl_tensor_view_t.
template <class T>
struct Owned {
    std::vector<T> data;
    int64_t shape = 0;
    rl_tensor_view_t view() {
        rl_tensor_view_t v{};
        shape = static_cast<int64_t>(data.size());
        v.data = data.empty() ? nullptr : data.data();
        v.device = rl_device_t{RL_DEVICE_CPU, 0};
        v.ndim = 1;
        if constexpr (std::is_same_v<T, double>)
            v.dtype = rl_dtype_t{RL_DTYPE_FLOAT, 64, 1};
        else if constexpr (std::is_same_v<T, float>)
            v.dtype = rl_dtype_t{RL_DTYPE_FLOAT, 32, 1};
        else
            v.dtype = rl_dtype_t{RL_DTYPE_INT, 64, 1};
        v.shape = &shape;
        return v;
    }
};

// One plugin library, loaded for the life of the object.
class Library {
public:
    explicit Library(const std::string &path) : path_(path) {
        handle_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle_) throw std::runtime_error("dlopen " + path + ": " + ::dlerror());
        auto fn = reinterpret_cast<rl_plugin_entry_fn>(::dlsym(handle_, RL_PLUGIN_ENTRY_SYMBOL));
        if (!fn) throw std::runtime_error(path + " has no " RL_PLUGIN_ENTRY_SYMBOL);
        entry_ = fn();
        if (entry_->init(detail::host_api(), path.c_str()) != RL_OK)
            throw std::runtime_error(path + ": init failed");
        factory_ = static_cast<const rl_plugin_factory_t *>(entry_->get_factory(RL_FACTORY_PLUGIN));
        if (!factory_) throw std::runtime_error(path + ": no plugin factory");
    }
    ~Library() {
        entry_->deinit();
        ::dlclose(handle_);
    }
    Library(const Library &) = delete;
    Library &operator=(const Library &) = delete;

    const rl_plugin_factory_t *factory() const { return factory_; }
    const rl_plugin_desc_t *desc(uint32_t i) const { return factory_->get_desc(factory_, i); }
    uint32_t count() const { return factory_->count(factory_); }

private:
    std::string path_;
    void *handle_ = nullptr;
    const rl_plugin_entry_t *entry_ = nullptr;
    const rl_plugin_factory_t *factory_ = nullptr;
};

// A created instance of the library's first plugin.
class Instance {
public:
    // Throws std::runtime_error with the plugin's message when create fails;
    // use try_create to inspect the failure.
    Instance(std::shared_ptr<Library> lib, const std::string &params) : lib_(std::move(lib)) {
        Outputs o = try_create(params);
        if (!o.ok())
            throw std::runtime_error(std::string("create failed (") + std::to_string(o.status) +
                                     "): " + o.error);
    }
    ~Instance() {
        if (plugin_) plugin_->destroy(plugin_);
    }
    Instance(const Instance &) = delete;
    Instance &operator=(const Instance &) = delete;

    // Create with `params`; the result's status/error tell how it went.
    static Outputs create_status(const std::shared_ptr<Library> &lib, const std::string &params) {
        Outputs o;
        rl_call_ctx_t ctx = detail::make_ctx(&o);
        rl_plugin_create_desc_t cd = RL_PLUGIN_CREATE_DESC_INIT;
        cd.params = rl_string_view_t{params.data(), params.size()};
        const rl_plugin_t *p = nullptr;
        o.status = lib->factory()->create(lib->factory(), &ctx, lib->desc(0)->id, &cd, &p);
        if (p) p->destroy(p);
        return o;
    }

    const rl_plugin_t *plugin() const { return plugin_; }
    template <class Iface>
    const Iface *iface(const char *id) const {
        return static_cast<const Iface *>(plugin_->get_interface(plugin_, id));
    }

    // ---- advantage ----
    Outputs advantage(std::vector<double> rewards, std::vector<int64_t> group_ids,
                      std::vector<int64_t> cu_seqlens,
                      const std::map<std::string, std::vector<double>> &tensors = {}) const {
        Owned<double> r{std::move(rewards)};
        Owned<int64_t> g{std::move(group_ids)}, cu{std::move(cu_seqlens)};
        std::vector<Owned<double>> store;
        store.reserve(tensors.size());
        std::vector<rl_tensor_arg_t> args;
        for (const auto &kv : tensors) store.push_back(Owned<double>{kv.second});
        size_t k = 0;
        for (const auto &kv : tensors)
            args.push_back(rl_tensor_arg_t{kv.first.c_str(), store[k++].view()});
        rl_advantage_inputs_t in{};
        in.struct_size = sizeof in;
        in.rewards = r.view();
        in.group_ids = g.view();
        in.cu_seqlens = cu.view();
        in.tensors = rl_tensor_list_t{args.empty() ? nullptr : args.data(), args.size()};
        Outputs o;
        rl_call_ctx_t ctx = detail::make_ctx(&o);
        auto *f = iface<rl_advantage_iface_t>(RL_IFACE_ADVANTAGE);
        o.status = f->compute(plugin_, &ctx, &in);
        return o;
    }

    // ---- filter ----
    Outputs filter(std::vector<int64_t> token_ids, std::vector<double> logprobs, int64_t vocab,
                   rl_filter_verdict_t *verdict) const {
        Owned<int64_t> ids{std::move(token_ids)};
        Owned<double> lp{std::move(logprobs)};
        rl_rollout_view_t r{};
        r.struct_size = sizeof r;
        r.token_ids = ids.view();
        r.logprobs = lp.view();
        r.vocab_size = vocab;
        std::memset(verdict, 0, sizeof *verdict);
        verdict->struct_size = sizeof *verdict;
        Outputs o;
        rl_call_ctx_t ctx = detail::make_ctx(&o);
        auto *f = iface<rl_filter_iface_t>(RL_IFACE_FILTER);
        o.status = f->check(plugin_, &ctx, &r, verdict);
        return o;
    }

    // ---- env ----
    Outputs sample(uint64_t n, uint64_t seed) const {
        Outputs o;
        rl_call_ctx_t ctx = detail::make_ctx(&o);
        auto *f = iface<rl_env_iface_t>(RL_IFACE_ENV);
        o.status = f->sample(plugin_, &ctx, n, seed);
        return o;
    }
    Outputs score(const std::string &task, const std::string &completion, double *reward,
                  const volatile int32_t *abort_flag = nullptr) const {
        Outputs o;
        rl_call_ctx_t ctx = detail::make_ctx(&o, abort_flag);
        auto *f = iface<rl_env_iface_t>(RL_IFACE_ENV);
        *reward = -12345.0;
        o.status = f->score(plugin_, &ctx, rl_string_view_t{task.data(), task.size()},
                            rl_string_view_t{completion.data(), completion.size()}, reward);
        return o;
    }
    // A multi-turn env's step (text "state" holds its result); RL_ERR_UNSUPPORTED
    // when the env has no step().
    Outputs step(const std::string &task, const std::string &state,
                 const std::string &completion) const {
        Outputs o;
        rl_call_ctx_t ctx = detail::make_ctx(&o);
        auto *f = iface<rl_env_iface_t>(RL_IFACE_ENV);
        if (f->step == nullptr) {
            o.status = RL_ERR_UNSUPPORTED;
            return o;
        }
        o.status = f->step(plugin_, &ctx, rl_string_view_t{task.data(), task.size()},
                           rl_string_view_t{state.data(), state.size()},
                           rl_string_view_t{completion.data(), completion.size()});
        return o;
    }

private:
    Outputs try_create(const std::string &params) {
        Outputs o;
        rl_call_ctx_t ctx = detail::make_ctx(&o);
        rl_plugin_create_desc_t cd = RL_PLUGIN_CREATE_DESC_INIT;
        cd.params = rl_string_view_t{params.data(), params.size()};
        o.status = lib_->factory()->create(lib_->factory(), &ctx, lib_->desc(0)->id, &cd, &plugin_);
        return o;
    }

    std::shared_ptr<Library> lib_;
    const rl_plugin_t *plugin_ = nullptr;
};

// The built plugin `<kind>-<name>` (e.g. "advantage-grpo") in the build's
// plugin folder; loaded once per test binary.
inline std::shared_ptr<Library> load(const std::string &target) {
    static std::map<std::string, std::shared_ptr<Library>> cache;
    auto it = cache.find(target);
    if (it != cache.end()) return it->second;
    auto lib = std::make_shared<Library>(std::string(RL_TEST_PLUGIN_DIR) + "/rl-" + target + ".so");
    cache[target] = lib;
    return lib;
}

// Creating plugin `target` with `params` must be refused as an invalid
// argument: the error message.
inline std::string refusal(const std::string &target, const std::string &params) {
    const Outputs o = Instance::create_status(load(target), params);
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG) << target << " " << params;
    return o.error;
}

} // namespace rltest
