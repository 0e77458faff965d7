// rl/sdk/plugin.hpp: write a plugin as a C++ class; the SDK provides the C
// tables, the exception boundary and the one exported symbol.
//
//   class MyLoss : public rl::sdk::Loss {
//   public:
//       explicit MyLoss(rl::sdk::Params &p) : scale_(p.number("scale", 1.0)) { p.finish(); }
//       rl::sdk::LossSignature signature() const override {
//           return {{"logprobs", "advantages"}, {"loss_mask"}, {"logprobs"}};
//       }
//       double compute(rl::sdk::Call &call, const rl::sdk::LossBatch &b,
//                      rl::sdk::Grads &g) override { ... }
//   };
//   RL_PLUGIN_DEFINE(rl::sdk::plugin<MyLoss>("org.example.loss.my", "my_loss", "1.0.0", "..."))
//
// Every exception thrown from plugin code becomes a status and a message at
// the boundary; nothing unwinds into the host.
#pragma once

#include <rl_plugin.h>

#include "error.hpp"
#include "params.hpp"
#include "tensor.hpp"

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace rl::sdk {

// ---- the boundary --------------------------------------------------------

inline rl_status_t report(const rl_call_ctx_t *ctx, rl_status_t status, const std::string &msg) {
    if (ctx && ctx->host && ctx->host->fail) return ctx->host->fail(ctx, status, msg.c_str());
    return status;
}

// Runs f(); maps any exception to a status and reports its message.
template <class F>
rl_status_t guard(const rl_call_ctx_t *ctx, F &&f) noexcept {
    try {
        f();
        return RL_OK;
    } catch (const Error &e) {
        return report(ctx, e.status(), e.what());
    } catch (const std::bad_alloc &) {
        return report(ctx, RL_ERR_OUT_OF_MEMORY, "out of memory");
    } catch (const std::exception &e) {
        return report(ctx, RL_ERR_INTERNAL, std::string("unexpected exception: ") + e.what());
    } catch (...) {
        return report(ctx, RL_ERR_INTERNAL, "unexpected exception of unknown type");
    }
}

// ---- per-call helpers ----------------------------------------------------

// The context of one call: emit outputs, check for abort, log.
class Call {
public:
    explicit Call(const rl_call_ctx_t *ctx) : ctx_(ctx) {}
    const rl_call_ctx_t *ctx() const { return ctx_; }
    const rl_host_api_t *host() const { return ctx_ ? ctx_->host : nullptr; }

    void metric(const std::string &name, double value) const {
        check(host()->emit_metric(ctx_, name.c_str(), value), "metric", name);
    }
    // A metric with its reduction over micro-batches and ranks (abi/rl/host.h
    // rl_metric_reduction_t; weight: the tokens, sequences or elements the
    // value covers). A host older than ABI 0.6 has no emit_metric_reduced:
    // the metric then goes through emit_metric (the host's default reduction).
    void metric(const std::string &name, double value, rl_metric_reduction_t reduction,
                double weight) const {
        const rl_host_api_t *h = host();
        if (reduction != RL_METRIC_DEFAULT && RL_HAS_FIELD(h, rl_host_api_t, emit_metric_reduced) &&
            h->emit_metric_reduced)
            check(h->emit_metric_reduced(ctx_, name.c_str(), value, reduction, weight), "metric",
                  name);
        else
            metric(name, value);
    }
    void tensor(const std::string &name, const std::vector<double> &xs) const {
        int64_t shape = 0;
        rl_tensor_view_t v = make_view(xs, &shape);
        check(host()->emit_tensor(ctx_, name.c_str(), &v), "tensor", name);
    }
    void tensor(const std::string &name, const rl_tensor_view_t &v) const {
        check(host()->emit_tensor(ctx_, name.c_str(), &v), "tensor", name);
    }
    void text(const std::string &name, std::string_view s) const {
        check(host()->emit_text(ctx_, name.c_str(), rl_string_view_t{s.data(), s.size()}), "text",
              name);
    }
    bool aborted() const { return ctx_ && ctx_->abort_flag && *ctx_->abort_flag != 0; }
    // A host extension table (RL_EXT_HOST_*), or nullptr when the host has none
    // or its table is older than `min_size` (RL_SIZE_THROUGH of the last member
    // the plugin uses).
    template <class Ext>
    const Ext *host_extension(const char *id, size_t min_size = sizeof(Ext)) const {
        const rl_host_api_t *h = host();
        if (!h || !RL_HAS_FIELD(h, rl_host_api_t, get_extension) || !h->get_extension)
            return nullptr;
        auto *ext = static_cast<const Ext *>(h->get_extension(h, id));
        return ext && ext->struct_size >= min_size ? ext : nullptr;
    }
    void log(rl_log_level_t level, const std::string &msg) const {
        if (host() && host()->log) host()->log(host(), level, msg.c_str());
    }

private:
    static void check(rl_status_t s, const char *what, const std::string &name) {
        if (s != RL_OK)
            fail(s,
                 std::string("host refused ") + what + " '" + name + "' (" + status_name(s) + ")");
    }
    const rl_call_ctx_t *ctx_;
};

// Named tensors of a call.
class Inputs {
public:
    Inputs() = default;
    explicit Inputs(const rl_tensor_list_t &list) {
        for (uint64_t i = 0; i < list.count; ++i) {
            const rl_tensor_arg_t &a = list.items[i];
            if (!a.name) invalid("input tensor " + std::to_string(i) + " has no name");
            if (map_.count(a.name)) invalid(std::string("input '") + a.name + "' given twice");
            map_.emplace(a.name, TensorRef(a.name, a.view));
        }
    }
    bool has(const std::string &name) const { return map_.count(name) != 0; }
    const TensorRef *find(const std::string &name) const {
        auto it = map_.find(name);
        return it == map_.end() ? nullptr : &it->second;
    }
    const TensorRef &get(const std::string &name) const {
        auto it = map_.find(name);
        if (it == map_.end()) invalid("missing input '" + name + "'; present: " + list());
        return it->second;
    }
    std::string list() const {
        std::vector<std::string> names;
        for (const auto &kv : map_) names.push_back(kv.first);
        return names.empty() ? "(none)" : Params::join(names);
    }
    const std::map<std::string, TensorRef> &all() const { return map_; }

private:
    std::map<std::string, TensorRef> map_;
};

// Reads int64 offsets [n_seqs + 1] and checks them against n_tokens.
inline std::vector<int64_t> read_cu_seqlens(const rl_tensor_view_t &v, int64_t n_tokens) {
    TensorRef t("cu_seqlens", v);
    if (t.is_float()) invalid("cu_seqlens must be an integer tensor");
    if (t.size() < 1) invalid("cu_seqlens must have at least one entry");
    std::vector<int64_t> cu(static_cast<size_t>(t.size()));
    for (int64_t i = 0; i < t.size(); ++i) cu[static_cast<size_t>(i)] = t.as_int(i);
    if (cu.front() != 0) invalid("cu_seqlens[0] must be 0, got " + std::to_string(cu.front()));
    for (size_t i = 1; i < cu.size(); ++i)
        if (cu[i] < cu[i - 1])
            invalid("cu_seqlens must be non-decreasing (entry " + std::to_string(i) + ")");
    if (n_tokens >= 0 && cu.back() != n_tokens)
        invalid("cu_seqlens ends at " + std::to_string(cu.back()) + " but the inputs have " +
                std::to_string(n_tokens) + " tokens");
    return cu;
}

// Every per-token input must have exactly cu_seqlens.back() entries; the
// error names the input that does not.
inline void check_token_counts(const Inputs &inputs, int64_t n_tokens) {
    for (const auto &kv : inputs.all())
        if (kv.second.size() != n_tokens)
            invalid("input '" + kv.first + "' has " + std::to_string(kv.second.size()) +
                    " tokens, but cu_seqlens covers " + std::to_string(n_tokens));
}

// ---- kinds -----------------------------------------------------------------

struct LossSignature {
    std::vector<std::string> required;
    std::vector<std::string> optional;
    std::vector<std::string> differentiable;
};

struct LossBatch {
    Inputs inputs;
    std::vector<int64_t> cu_seqlens; // [n_seqs + 1]
    int64_t n_tokens = 0;
    double global_tokens = 0; // 0: this call's own count
    double global_seqs = 0;
    int64_t n_seqs() const { return static_cast<int64_t>(cu_seqlens.size()) - 1; }
};

// Gradient buffers handed out by the host, by input name.
class Grads {
public:
    bool wants(const std::string &name) const { return map_.count(name) != 0; }
    const TensorOut *find(const std::string &name) const {
        auto it = map_.find(name);
        return it == map_.end() ? nullptr : &it->second;
    }
    bool empty() const { return map_.empty(); }
    void add(const std::string &name, const rl_tensor_view_t &v) {
        map_.emplace(name, TensorOut(name, v));
    }

private:
    std::map<std::string, TensorOut> map_;
};

class Loss {
public:
    static constexpr const char *kind = RL_KIND_LOSS;
    virtual ~Loss() = default;
    virtual LossSignature signature() const = 0;
    // Return the loss; write d loss / d input into each buffer `grads` holds.
    virtual double compute(Call &call, const LossBatch &batch, Grads &grads) = 0;
};

struct AdvantageBatch {
    TensorRef rewards;              // [n_seqs]
    std::vector<int64_t> group_ids; // [n_seqs]
    std::vector<int64_t> cu_seqlens;
    Inputs tensors; // optional per-token tensors
    int64_t n_seqs() const { return static_cast<int64_t>(group_ids.size()); }
    int64_t n_tokens() const { return cu_seqlens.back(); }
};

class Advantage {
public:
    static constexpr const char *kind = RL_KIND_ADVANTAGE;
    virtual ~Advantage() = default;
    // Emit "advantages" (and "returns") through call.tensor().
    virtual void compute(Call &call, const AdvantageBatch &batch) = 0;
};

struct Rollout {
    TensorRef token_ids;
    TensorRef logprobs;
    int64_t vocab_size = 0;
};
struct Verdict {
    bool flagged = false;
    std::string reason; // short tag, < RL_FILTER_REASON_SIZE bytes
};

class Filter {
public:
    static constexpr const char *kind = RL_KIND_FILTER;
    virtual ~Filter() = default;
    virtual Verdict check(Call &call, const Rollout &rollout) = 0;
};

class Env {
public:
    static constexpr const char *kind = RL_KIND_ENV;
    virtual ~Env() = default;
    // A JSON array of n tasks {"prompt", "answer", "metadata"}; deterministic in seed.
    virtual json sample(Call &call, uint64_t n, uint64_t seed) = 0;
    virtual double score(Call &call, const json &task, std::string_view completion) = 0;
    // Multi-turn envs override both.
    virtual bool multi_turn() const { return false; }
    virtual json step(Call &, const json &, const json &, std::string_view) {
        fail(RL_ERR_UNSUPPORTED, "this env is single-turn");
    }
};

struct Message {
    std::string_view header;
    Inputs tensors;
};

class Transport {
public:
    static constexpr const char *kind = RL_KIND_TRANSPORT;
    virtual ~Transport() = default;
    virtual void send(Call &call, const rl_message_view_t &message) = 0;
    // Emit text "header" and the tensors; return false on timeout.
    virtual bool recv(Call &call, int64_t timeout_ms) = 0;
    virtual bool collective() const { return false; }
    virtual void broadcast(Call &, const rl_tensor_list_t &, int32_t) {
        fail(RL_ERR_UNSUPPORTED, "this transport is not collective");
    }
};

// ---- glue: C tables over the classes --------------------------------------

namespace detail {

inline std::string_view view_of(rl_string_view_t s) {
    return s.data ? std::string_view(s.data, static_cast<size_t>(s.length)) : std::string_view();
}

// One instance: the C struct the host sees, and the object behind it.
template <class T>
struct Instance {
    rl_plugin_t plugin{};
    std::unique_ptr<T> impl;
    json given_params; // what create() was given, for get_params()
    // Signature strings kept alive for get_signature().
    std::vector<std::string> sig_store[3];
    std::vector<const char *> sig_ptrs[3];
};

template <class T>
T &self(const rl_plugin_t *p) {
    return *static_cast<Instance<T> *>(p->plugin_data)->impl;
}

template <class T, class Kind>
struct Iface;

template <class T>
struct Iface<T, Loss> {
    static constexpr const char *id = RL_IFACE_LOSS;
    static rl_status_t RL_ABI get_signature(const rl_plugin_t *p, rl_loss_signature_t *out) {
        return guard(nullptr, [&] {
            auto *inst = static_cast<Instance<T> *>(p->plugin_data);
            if (inst->sig_ptrs[0].empty()) {
                LossSignature s = inst->impl->signature();
                std::vector<std::string> *lists[3] = {&s.required, &s.optional, &s.differentiable};
                for (int k = 0; k < 3; ++k) {
                    inst->sig_store[k] = *lists[k];
                    for (auto &str : inst->sig_store[k]) inst->sig_ptrs[k].push_back(str.c_str());
                    inst->sig_ptrs[k].push_back(nullptr);
                }
            }
            out->required = inst->sig_ptrs[0].data();
            out->optional = inst->sig_ptrs[1].data();
            out->differentiable = inst->sig_ptrs[2].data();
        });
    }
    static rl_status_t RL_ABI compute(const rl_plugin_t *p, const rl_call_ctx_t *ctx,
                                      const rl_loss_inputs_t *in, rl_loss_outputs_t *out) {
        return guard(ctx, [&] {
            LossBatch b;
            b.inputs = Inputs(in->tensors);
            b.cu_seqlens = read_cu_seqlens(in->cu_seqlens, -1);
            b.n_tokens = b.cu_seqlens.back();
            check_token_counts(b.inputs, b.n_tokens);
            b.global_tokens = in->global_tokens;
            b.global_seqs = in->global_seqs;
            for (const auto &kv : b.inputs.all()) kv.second.check_finite();
            Grads g;
            for (uint64_t i = 0; i < out->grads.count; ++i)
                g.add(out->grads.items[i].name, out->grads.items[i].view);
            Call call(ctx);
            out->loss = self<T>(p).compute(call, b, g);
        });
    }
    static const void *table() {
        static const rl_loss_iface_t t = {sizeof(rl_loss_iface_t), 0, &get_signature, &compute};
        return &t;
    }
};

template <class T>
struct Iface<T, Advantage> {
    static constexpr const char *id = RL_IFACE_ADVANTAGE;
    static rl_status_t RL_ABI compute(const rl_plugin_t *p, const rl_call_ctx_t *ctx,
                                      const rl_advantage_inputs_t *in) {
        return guard(ctx, [&] {
            AdvantageBatch b;
            b.rewards = TensorRef("rewards", in->rewards);
            b.rewards.check_finite();
            TensorRef gid("group_ids", in->group_ids);
            if (gid.size() != b.rewards.size())
                invalid("group_ids has " + std::to_string(gid.size()) + " entries, rewards has " +
                        std::to_string(b.rewards.size()));
            for (int64_t i = 0; i < gid.size(); ++i) b.group_ids.push_back(gid.as_int(i));
            b.tensors = Inputs(in->tensors);
            b.cu_seqlens = read_cu_seqlens(in->cu_seqlens, -1);
            check_token_counts(b.tensors, b.cu_seqlens.back());
            for (const auto &kv : b.tensors.all()) kv.second.check_finite();
            if (static_cast<int64_t>(b.cu_seqlens.size()) != b.n_seqs() + 1)
                invalid("cu_seqlens has " + std::to_string(b.cu_seqlens.size()) +
                        " entries, expected n_seqs + 1 = " + std::to_string(b.n_seqs() + 1));
            Call call(ctx);
            self<T>(p).compute(call, b);
        });
    }
    static const void *table() {
        static const rl_advantage_iface_t t = {sizeof(rl_advantage_iface_t), 0, &compute};
        return &t;
    }
};

template <class T>
struct Iface<T, Filter> {
    static constexpr const char *id = RL_IFACE_FILTER;
    static rl_status_t RL_ABI check(const rl_plugin_t *p, const rl_call_ctx_t *ctx,
                                    const rl_rollout_view_t *in, rl_filter_verdict_t *out) {
        return guard(ctx, [&] {
            Rollout r;
            r.token_ids = TensorRef("token_ids", in->token_ids);
            r.logprobs = TensorRef("logprobs", in->logprobs);
            r.vocab_size = in->vocab_size;
            if (r.token_ids.size() != r.logprobs.size())
                invalid("token_ids has " + std::to_string(r.token_ids.size()) +
                        " entries, logprobs has " + std::to_string(r.logprobs.size()));
            if (r.vocab_size <= 0) invalid("vocab_size must be positive");
            Call call(ctx);
            Verdict v = self<T>(p).check(call, r);
            out->flagged = v.flagged ? 1u : 0u;
            std::memset(out->reason, 0, sizeof(out->reason));
            std::strncpy(out->reason, v.reason.c_str(), sizeof(out->reason) - 1);
        });
    }
    static const void *table() {
        static const rl_filter_iface_t t = {sizeof(rl_filter_iface_t), 0, &check};
        return &t;
    }
};

template <class T>
struct Iface<T, Env> {
    static constexpr const char *id = RL_IFACE_ENV;
    static rl_status_t RL_ABI sample(const rl_plugin_t *p, const rl_call_ctx_t *ctx, uint64_t n,
                                     uint64_t seed) {
        return guard(ctx, [&] {
            Call call(ctx);
            json tasks = self<T>(p).sample(call, n, seed);
            if (!tasks.is_array()) fail(RL_ERR_INTERNAL, "sample() did not return an array");
            call.text("tasks", tasks.dump());
        });
    }
    static rl_status_t RL_ABI score(const rl_plugin_t *p, const rl_call_ctx_t *ctx,
                                    rl_string_view_t task, rl_string_view_t completion,
                                    double *out_reward) {
        return guard(ctx, [&] {
            json t;
            std::string_view tv = view_of(task);
            try {
                t = json::parse(tv.begin(), tv.end());
            } catch (const json::parse_error &e) {
                invalid(std::string("task is not valid JSON: ") + e.what());
            }
            Call call(ctx);
            *out_reward = self<T>(p).score(call, t, view_of(completion));
        });
    }
    static rl_status_t RL_ABI step(const rl_plugin_t *p, const rl_call_ctx_t *ctx,
                                   rl_string_view_t task, rl_string_view_t state,
                                   rl_string_view_t completion) {
        return guard(ctx, [&] {
            json t, s;
            try {
                std::string_view tv = view_of(task), sv = view_of(state);
                t = json::parse(tv.begin(), tv.end());
                s = sv.empty() ? json() : json::parse(sv.begin(), sv.end());
            } catch (const json::parse_error &e) {
                invalid(std::string("task or state is not valid JSON: ") + e.what());
            }
            Call call(ctx);
            const json r = self<T>(p).step(call, t, s, view_of(completion));
            // JSON has no NaN: dumped, a non-finite reward would read as null (0).
            if (r.is_object() && r.contains("reward") && r["reward"].is_number_float() &&
                !std::isfinite(r["reward"].get<double>()))
                invalid("step() returned a non-finite reward");
            call.text("state", r.dump());
        });
    }
    static const void *table(const T &obj) {
        static const rl_env_iface_t single = {sizeof(rl_env_iface_t), 0, &sample, &score, nullptr};
        static const rl_env_iface_t multi = {sizeof(rl_env_iface_t), 0, &sample, &score, &step};
        return obj.multi_turn() ? &multi : &single;
    }
};

template <class T>
struct Iface<T, Transport> {
    static constexpr const char *id = RL_IFACE_TRANSPORT;
    static rl_status_t RL_ABI send(const rl_plugin_t *p, const rl_call_ctx_t *ctx,
                                   const rl_message_view_t *m) {
        return guard(ctx, [&] {
            Call call(ctx);
            self<T>(p).send(call, *m);
        });
    }
    static rl_status_t RL_ABI recv(const rl_plugin_t *p, const rl_call_ctx_t *ctx,
                                   int64_t timeout_ms) {
        bool got = false;
        rl_status_t s = guard(ctx, [&] {
            Call call(ctx);
            got = self<T>(p).recv(call, timeout_ms);
        });
        if (s == RL_OK && !got) return report(ctx, RL_ERR_TIMEOUT, "no message within timeout");
        return s;
    }
    static rl_status_t RL_ABI broadcast(const rl_plugin_t *p, const rl_call_ctx_t *ctx,
                                        const rl_tensor_list_t *tensors, int32_t root) {
        return guard(ctx, [&] {
            Call call(ctx);
            self<T>(p).broadcast(call, *tensors, root);
        });
    }
    static const void *table(const T &obj) {
        static const rl_transport_iface_t p2p = {sizeof(rl_transport_iface_t), 0, &send, &recv,
                                                 nullptr};
        static const rl_transport_iface_t coll = {sizeof(rl_transport_iface_t), 0, &send, &recv,
                                                  &broadcast};
        return obj.collective() ? &coll : &p2p;
    }
};

template <class T>
using KindOf = std::conditional_t<
    std::is_base_of_v<Loss, T>, Loss,
    std::conditional_t<
        std::is_base_of_v<Advantage, T>, Advantage,
        std::conditional_t<std::is_base_of_v<Filter, T>, Filter,
                           std::conditional_t<std::is_base_of_v<Env, T>, Env, Transport>>>>;

template <class T>
const void *table_for(const T &obj) {
    using I = Iface<T, KindOf<T>>;
    if constexpr (std::is_same_v<KindOf<T>, Env> || std::is_same_v<KindOf<T>, Transport>)
        return I::table(obj);
    else
        return I::table();
}

template <class T>
void RL_ABI destroy(const rl_plugin_t *p) {
    delete static_cast<Instance<T> *>(p->plugin_data);
}

// A plugin class may report its effective parameters (defaults filled in) by
// defining `json params() const`; otherwise get_params() reports the
// parameters it was created with.
template <class T, class = void>
struct HasParams : std::false_type {};
template <class T>
struct HasParams<T, std::void_t<decltype(std::declval<const T &>().params())>> : std::true_type {};

template <class T>
rl_status_t RL_ABI get_params(const rl_plugin_t *p, const rl_call_ctx_t *ctx) {
    return guard(ctx, [&] {
        auto *inst = static_cast<Instance<T> *>(p->plugin_data);
        json j;
        if constexpr (HasParams<T>::value)
            j = inst->impl->params();
        else
            j = inst->given_params;
        if (!j.is_object()) fail(RL_ERR_INTERNAL, "params() must return a JSON object");
        Call(ctx).text("params", j.dump());
    });
}

template <class T>
const void *RL_ABI get_interface(const rl_plugin_t *p, const char *id) {
    using I = Iface<T, KindOf<T>>;
    if (!id || std::strcmp(id, I::id) != 0) return nullptr;
    return table_for(self<T>(p));
}

} // namespace detail

// One plugin of a library: its descriptor and how to create it.
struct Registration {
    rl_plugin_desc_t desc;
    rl_status_t (*create)(const rl_plugin_desc_t *desc, const rl_call_ctx_t *ctx,
                          rl_string_view_t params, const rl_plugin_t **out);
};

template <class T>
rl_status_t create_instance(const rl_plugin_desc_t *desc, const rl_call_ctx_t *ctx,
                            rl_string_view_t params, const rl_plugin_t **out) {
    static_assert(std::is_base_of_v<Loss, T> || std::is_base_of_v<Advantage, T> ||
                      std::is_base_of_v<Filter, T> || std::is_base_of_v<Env, T> ||
                      std::is_base_of_v<Transport, T>,
                  "a plugin class derives from Loss, Advantage, Filter, Env or Transport");
    return guard(ctx, [&] {
        Params p(detail::view_of(params), std::string(desc->kind) + " '" + desc->name + "'");
        auto inst = std::make_unique<detail::Instance<T>>();
        inst->impl = std::make_unique<T>(p);
        p.finish();
        const std::string_view given = detail::view_of(params);
        inst->given_params = given.empty() ? json::object() : json::parse(given);
        if (inst->given_params.is_null()) inst->given_params = json::object();
        inst->plugin.struct_size = sizeof(rl_plugin_t); // the 0.2 layout: get_params is set
        inst->plugin.desc = desc;
        inst->plugin.plugin_data = inst.get();
        inst->plugin.destroy = &detail::destroy<T>;
        inst->plugin.get_interface = &detail::get_interface<T>;
        inst->plugin.get_params = &detail::get_params<T>;
        *out = &inst.release()->plugin;
    });
}

// rl::sdk::plugin<T>(id, name, version, description): one entry of
// RL_PLUGIN_DEFINE. T is constructed from a Params& and derives from one kind.
template <class T>
Registration plugin(const char *id, const char *name, const char *version, const char *description,
                    const char *const *features = nullptr) {
    Registration r{};
    r.desc.struct_size = sizeof(rl_plugin_desc_t);
    r.desc.abi_version = RL_ABI_VERSION;
    r.desc.id = id;
    r.desc.kind = T::kind;
    r.desc.name = name;
    r.desc.version = version;
    r.desc.description = description;
    r.desc.features = features;
    r.create = &create_instance<T>;
    return r;
}

namespace detail {

struct Library {
    const Registration *regs = nullptr;
    uint32_t count = 0;
    const rl_host_api_t *host = nullptr;
};
inline Library &library() {
    static Library lib;
    return lib;
}

inline uint32_t RL_ABI factory_count(const rl_plugin_factory_t *) {
    return library().count;
}
inline const rl_plugin_desc_t *RL_ABI factory_get_desc(const rl_plugin_factory_t *, uint32_t i) {
    return i < library().count ? &library().regs[i].desc : nullptr;
}
inline rl_status_t RL_ABI factory_create(const rl_plugin_factory_t *, const rl_call_ctx_t *ctx,
                                         const char *plugin_id, const rl_plugin_create_desc_t *cd,
                                         const rl_plugin_t **out) {
    if (!plugin_id || !out)
        return report(ctx, RL_ERR_INVALID_ARG, "create: plugin_id and out_plugin are required");
    for (uint32_t i = 0; i < library().count; ++i) {
        const Registration &r = library().regs[i];
        if (std::strcmp(r.desc.id, plugin_id) == 0) {
            rl_string_view_t params = cd ? cd->params : rl_string_view_t{"{}", 2};
            return r.create(&r.desc, ctx, params, out);
        }
    }
    return report(ctx, RL_ERR_NOT_FOUND, std::string("no plugin with id '") + plugin_id + "'");
}
inline const rl_plugin_factory_t *factory() {
    static const rl_plugin_factory_t f = {sizeof(rl_plugin_factory_t), 0, &factory_count,
                                          &factory_get_desc, &factory_create};
    return &f;
}

inline rl_status_t RL_ABI entry_init(const rl_host_api_t *host, const char *) {
    // Host structs are read by struct_size: the 0.1 table is the least we use;
    // any slot added after 0.1 is read behind RL_HAS_FIELD (see host_extension).
    if (!host || host->struct_size < RL_SIZE_THROUGH(rl_host_api_t, emit_text) ||
        !RL_ABI_COMPATIBLE(host->abi_version, RL_ABI_VERSION))
        return RL_ERR_INCOMPATIBLE;
    library().host = host;
    return RL_OK;
}
inline void RL_ABI entry_deinit(void) {
    library().host = nullptr;
}
inline const void *RL_ABI entry_get_factory(const char *id) {
    return (id && std::strcmp(id, RL_FACTORY_PLUGIN) == 0) ? factory() : nullptr;
}

inline const rl_plugin_entry_t *entry(const Registration *regs, uint32_t count) {
    library().regs = regs;
    library().count = count;
    static const rl_plugin_entry_t e = {sizeof(rl_plugin_entry_t), RL_ABI_VERSION, &entry_init,
                                        &entry_deinit, &entry_get_factory};
    return &e;
}

} // namespace detail
} // namespace rl::sdk

// Defines the library's one exported symbol over a list of rl::sdk::plugin<T>(...).
#define RL_PLUGIN_DEFINE(...)                                                                      \
    static const ::rl::sdk::Registration rl_sdk_registrations_[] = {__VA_ARGS__};                  \
    extern "C" RL_EXPORT const rl_plugin_entry_t *RL_ABI rl_plugin_entry(void) {                   \
        return ::rl::sdk::detail::entry(rl_sdk_registrations_,                                     \
                                        static_cast<uint32_t>(sizeof(rl_sdk_registrations_) /      \
                                                              sizeof(rl_sdk_registrations_[0])));  \
    }
