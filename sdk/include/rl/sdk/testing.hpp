// rl/sdk/testing.hpp: an in-process host for unit tests of plugin classes,
// without librl. It implements rl_host_api_t, records what a call emits
// (metrics, 0-d / 1-d tensors as doubles, texts, the failure message) and
// drives a plugin class through the same C tables and exception boundary the
// real host uses, so parameter refusals and input checks behave as in
// production.
//
//   rl::sdk::testing::Host host;
//   rl::sdk::testing::Instance<MyLoss> loss(host, R"({"scale": 2})");
//   ASSERT_TRUE(loss.ok()) << loss.error();
//   rl::sdk::testing::LossInputs in;
//   in.f64("logprobs", {-1.0, -2.0}).cu_seqlens({0, 2});
//   rl::sdk::testing::LossRun run = rl::sdk::testing::run_loss(loss, in);
//   EXPECT_EQ(run.status, RL_OK) << run.error;
//   EXPECT_DOUBLE_EQ(run.grads.at("logprobs")[0], ...);
//   EXPECT_DOUBLE_EQ(run.metric("my_metric"), ...);
//
// Single-threaded: one call at a time per Host.
#pragma once

#include "plugin.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace rl::sdk::testing {

// What one call produced.
struct Output {
    rl_status_t status = RL_OK;
    std::string error; // the message given to host->fail ("" when none)
    std::map<std::string, double> metrics;
    // Reduction and weight of the metrics emitted with emit_metric_reduced.
    std::map<std::string, std::pair<rl_metric_reduction_t, double>> reductions;
    std::map<std::string, std::vector<double>> tensors;
    std::map<std::string, std::string> texts;

    bool has_metric(const std::string &name) const { return metrics.count(name) != 0; }
    // The metric's value; throws std::out_of_range naming it when absent.
    double metric(const std::string &name) const {
        auto it = metrics.find(name);
        if (it == metrics.end()) throw std::out_of_range("no metric '" + name + "' was emitted");
        return it->second;
    }
};

class Host {
public:
    // table_size: the rl_host_api_t size the host reports; an older host's
    // (e.g. RL_SIZE_THROUGH(rl_host_api_t, emit_text), ABI 0.5) has no
    // emit_metric_reduced.
    explicit Host(uint32_t table_size = sizeof(rl_host_api_t)) {
        api_.struct_size = table_size;
        api_.abi_version = RL_ABI_VERSION;
        api_.host_data = this;
        api_.name = "rl-sdk-testing";
        api_.version = "0";
        api_.get_extension = [](const rl_host_api_t *, const char *) -> const void * {
            return nullptr;
        };
        api_.log = [](const rl_host_api_t *h, rl_log_level_t level, const char *msg) {
            self(h).logs_.push_back(std::to_string(level) + ": " + (msg ? msg : ""));
        };
        api_.fail = [](const rl_call_ctx_t *ctx, rl_status_t status, const char *msg) {
            Host &h = self(ctx->host);
            h.out_.status = status;
            h.out_.error = msg ? msg : "";
            return status;
        };
        api_.mem_alloc = [](const rl_host_api_t *, size_t size, size_t align) -> void * {
            if (align == 0) align = 16;
            if (align < sizeof(void *)) align = sizeof(void *);
            if ((align & (align - 1)) != 0) return nullptr;
            if (size > std::numeric_limits<size_t>::max() - (align - 1)) return nullptr;
            const size_t rounded = ((size ? size : 1) + align - 1) / align * align;
            return std::aligned_alloc(align, rounded);
        };
        api_.mem_free = [](const rl_host_api_t *, void *p) { std::free(p); };
        api_.emit_metric = [](const rl_call_ctx_t *ctx, const char *name, double v) -> rl_status_t {
            Host *h = active(ctx);
            if (!h) return RL_ERR_BAD_STATE;
            if (!name || !h->out_.metrics.emplace(name, v).second) return RL_ERR_INVALID_ARG;
            return RL_OK;
        };
        if (RL_HAS_FIELD(&api_, rl_host_api_t, emit_metric_reduced))
            api_.emit_metric_reduced = [](const rl_call_ctx_t *ctx, const char *name, double v,
                                          rl_metric_reduction_t red, double weight) -> rl_status_t {
                Host *h = active(ctx);
                if (!h) return RL_ERR_BAD_STATE;
                if (red < RL_METRIC_DEFAULT || red > RL_METRIC_MAX || !(weight >= 0) ||
                    weight == std::numeric_limits<double>::infinity())
                    return RL_ERR_INVALID_ARG;
                if (!name || !h->out_.metrics.emplace(name, v).second) return RL_ERR_INVALID_ARG;
                h->out_.reductions[name] = {red, weight};
                return RL_OK;
            };
        api_.emit_tensor = [](const rl_call_ctx_t *ctx, const char *name,
                              const rl_tensor_view_t *view) -> rl_status_t {
            Host *h = active(ctx);
            if (!h) return RL_ERR_BAD_STATE;
            if (!name || !view || h->out_.tensors.count(name)) return RL_ERR_INVALID_ARG;
            try {
                h->out_.tensors[name] = TensorRef(name, *view).to_vector();
            } catch (const Error &e) {
                return e.status();
            }
            return RL_OK;
        };
        api_.emit_text = [](const rl_call_ctx_t *ctx, const char *name,
                            rl_string_view_t text) -> rl_status_t {
            Host *h = active(ctx);
            if (!h) return RL_ERR_BAD_STATE;
            if (!name || h->out_.texts.count(name)) return RL_ERR_INVALID_ARG;
            h->out_.texts[name] = std::string(text.data ? text.data : "", text.length);
            return RL_OK;
        };
        ctx_.struct_size = sizeof(rl_call_ctx_t);
        ctx_.host = &api_;
    }
    Host(const Host &) = delete;
    Host &operator=(const Host &) = delete;

    const rl_host_api_t *api() const { return &api_; }
    // Starts a call: clears the record and returns the context to pass.
    const rl_call_ctx_t *begin() {
        out_ = Output{};
        in_call_ = true;
        return &ctx_;
    }
    // Ends the call and returns its record, with `status` as the call's result.
    Output end(rl_status_t status) {
        in_call_ = false;
        out_.status = status;
        return out_;
    }
    // Messages plugins logged through host->log, as "<level>: <message>".
    const std::vector<std::string> &logs() const { return logs_; }

private:
    static Host &self(const rl_host_api_t *h) { return *static_cast<Host *>(h->host_data); }
    static Host *active(const rl_call_ctx_t *ctx) {
        if (!ctx || !ctx->host) return nullptr;
        Host &h = self(ctx->host);
        return (ctx == &h.ctx_ && h.in_call_) ? &h : nullptr;
    }

    rl_host_api_t api_{};
    rl_call_ctx_t ctx_{};
    Output out_;
    bool in_call_ = false;
    std::vector<std::string> logs_;
};

// One instance of plugin class T, created through the SDK's factory path
// (Params, finish(), the exception boundary). Creation never throws: check
// ok() and error().
template <class T>
class Instance {
public:
    Instance(Host &host, std::string_view params_json = "{}", const char *name = "under_test")
        : host_(host), name_(name) {
        reg_ = ::rl::sdk::plugin<T>("org.rl.testing", name_.c_str(), "0.0.0", "under test");
        const rl_call_ctx_t *ctx = host.begin();
        rl_status_t s = reg_.create(
            &reg_.desc, ctx, rl_string_view_t{params_json.data(), params_json.size()}, &plugin_);
        created_ = host.end(s);
        if (s != RL_OK) plugin_ = nullptr;
    }
    ~Instance() {
        if (plugin_) plugin_->destroy(plugin_);
    }
    Instance(const Instance &) = delete;
    Instance &operator=(const Instance &) = delete;

    bool ok() const { return plugin_ != nullptr; }
    rl_status_t status() const { return created_.status; }
    const std::string &error() const { return created_.error; }
    Host &host() const { return host_; }
    const rl_plugin_t *plugin() const { return plugin_; }
    // The C++ object behind the instance (for calling its methods directly).
    T &object() const { return *static_cast<detail::Instance<T> *>(plugin_->plugin_data)->impl; }
    // The kind's C interface table, as the host sees it.
    template <class Table>
    const Table *iface(const char *id) const {
        return static_cast<const Table *>(plugin_->get_interface(plugin_, id));
    }

private:
    Host &host_;
    std::string name_;
    Registration reg_{};
    const rl_plugin_t *plugin_ = nullptr;
    Output created_;
};

// Owned named 1-d tensors plus cu_seqlens, viewed as rl_loss_inputs_t.
class LossInputs {
public:
    LossInputs &f64(const std::string &name, const std::vector<double> &xs) {
        return add(name, kFloat64, xs.data(), xs.size(), sizeof(double));
    }
    LossInputs &f32(const std::string &name, const std::vector<float> &xs) {
        return add(name, kFloat32, xs.data(), xs.size(), sizeof(float));
    }
    LossInputs &i64(const std::string &name, const std::vector<int64_t> &xs) {
        return add(name, kInt64, xs.data(), xs.size(), sizeof(int64_t));
    }
    LossInputs &boolean(const std::string &name, const std::vector<uint8_t> &xs) {
        return add(name, rl_dtype_t{RL_DTYPE_BOOL, 8, 1}, xs.data(), xs.size(), 1);
    }
    LossInputs &cu_seqlens(const std::vector<int64_t> &cu) {
        cu_ = cu;
        return *this;
    }
    LossInputs &global(double tokens, double seqs) {
        global_tokens_ = tokens;
        global_seqs_ = seqs;
        return *this;
    }
    // Removes a tensor by name (to test missing inputs).
    LossInputs &drop(const std::string &name) {
        items_.erase(std::remove_if(items_.begin(), items_.end(),
                                    [&](const Item &it) { return it.name == name; }),
                     items_.end());
        return *this;
    }

    struct Item {
        std::string name;
        rl_dtype_t dtype;
        std::vector<unsigned char> bytes;
        int64_t size;
    };
    const std::vector<Item> &items() const { return items_; }
    int64_t n_tokens() const { return cu_.empty() ? 0 : cu_.back(); }

    // Views valid while *this is alive and unchanged.
    rl_loss_inputs_t view() const {
        args_.clear();
        shapes_.assign(items_.size() + 1, 0);
        for (size_t i = 0; i < items_.size(); ++i) {
            shapes_[i] = items_[i].size;
            rl_tensor_arg_t a{};
            a.name = items_[i].name.c_str();
            a.view = make(const_cast<unsigned char *>(items_[i].bytes.data()), items_[i].dtype,
                          &shapes_[i]);
            args_.push_back(a);
        }
        shapes_.back() = static_cast<int64_t>(cu_.size());
        rl_loss_inputs_t in{};
        in.struct_size = sizeof(in);
        in.tensors = rl_tensor_list_t{args_.empty() ? nullptr : args_.data(), args_.size()};
        in.cu_seqlens = make(const_cast<int64_t *>(cu_.data()), kInt64, &shapes_.back());
        in.global_tokens = global_tokens_;
        in.global_seqs = global_seqs_;
        return in;
    }

private:
    LossInputs &add(const std::string &name, rl_dtype_t dt, const void *p, size_t n, size_t elem) {
        drop(name);
        Item it{name, dt, std::vector<unsigned char>(n * elem), static_cast<int64_t>(n)};
        if (n) std::memcpy(it.bytes.data(), p, n * elem);
        items_.push_back(std::move(it));
        return *this;
    }
    static rl_tensor_view_t make(void *data, rl_dtype_t dt, int64_t *shape) {
        rl_tensor_view_t v{};
        v.data = *shape ? data : nullptr;
        v.device = rl_device_t{RL_DEVICE_CPU, 0};
        v.ndim = 1;
        v.dtype = dt;
        v.shape = shape;
        return v;
    }

    std::vector<Item> items_;
    std::vector<int64_t> cu_;
    double global_tokens_ = 0, global_seqs_ = 0;
    mutable std::vector<rl_tensor_arg_t> args_;
    mutable std::vector<int64_t> shapes_;
};

// What one loss evaluation returned.
struct LossRun : Output {
    double loss = 0;
    std::map<std::string, std::vector<double>> grads; // by input name
};

// The signature as the host reads it.
template <class T>
LossSignature loss_signature(const Instance<T> &inst) {
    auto *iface = inst.template iface<rl_loss_iface_t>(RL_IFACE_LOSS);
    rl_loss_signature_t sig{};
    sig.struct_size = sizeof(sig);
    LossSignature out;
    if (!iface || iface->get_signature(inst.plugin(), &sig) != RL_OK) return out;
    auto list = [](const char *const *xs) {
        std::vector<std::string> v;
        for (; xs && *xs; ++xs) v.emplace_back(*xs);
        return v;
    };
    out.required = list(sig.required);
    out.optional = list(sig.optional);
    out.differentiable = list(sig.differentiable);
    return out;
}

// Runs rl_loss_iface_t::compute as a host would: one zero-filled float64
// gradient buffer per differentiable input present (none when !want_grads).
template <class T>
LossRun run_loss(const Instance<T> &inst, const LossInputs &in, bool want_grads = true) {
    LossRun run;
    if (!inst.ok()) {
        run.status = RL_ERR_BAD_STATE;
        run.error = "instance was not created: " + inst.error();
        return run;
    }
    const LossSignature sig = loss_signature(inst);
    std::vector<std::string> names;
    std::vector<std::vector<double>> bufs;
    if (want_grads)
        for (const auto &item : in.items())
            for (const auto &d : sig.differentiable)
                if (d == item.name) {
                    names.push_back(item.name);
                    bufs.emplace_back(static_cast<size_t>(item.size), 0.0);
                }
    std::vector<int64_t> shapes(bufs.size());
    std::vector<rl_tensor_arg_t> args(bufs.size());
    for (size_t i = 0; i < bufs.size(); ++i) {
        shapes[i] = static_cast<int64_t>(bufs[i].size());
        args[i].name = names[i].c_str();
        args[i].view = make_view(bufs[i], &shapes[i]);
    }
    rl_loss_outputs_t out{};
    out.struct_size = sizeof(out);
    out.grads = rl_tensor_list_t{args.empty() ? nullptr : args.data(), args.size()};
    const rl_loss_inputs_t view = in.view();
    auto *iface = inst.template iface<rl_loss_iface_t>(RL_IFACE_LOSS);
    const rl_call_ctx_t *ctx = inst.host().begin();
    const rl_status_t s = iface->compute(inst.plugin(), ctx, &view, &out);
    static_cast<Output &>(run) = inst.host().end(s);
    run.loss = out.loss;
    if (s == RL_OK)
        for (size_t i = 0; i < bufs.size(); ++i) run.grads[names[i]] = bufs[i];
    return run;
}

} // namespace rl::sdk::testing
