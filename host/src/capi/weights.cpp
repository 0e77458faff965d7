// abi/rl/train.h: weight sync over a transport plugin, the state machine of
// docs/transports.md.
//
// Sender: gather the weights (fsdp), send one message {"kind": "rl.weights",
// "version": V, "step": V} with every parameter as a tensor (the transport
// adds a CRC-32C per tensor), retrying a send that times out.
//
// Receiver: wait for a weight message; refuse a malformed or corrupted one
// (the transport checks every checksum before it hands anything over) and keep
// waiting, up to `retries` refusals; skip versions not newer than the one in
// use (handshake); check that the names, shapes and count match the model;
// stage every tensor in the model's dtype and device; then swap all
// parameters at once and adopt the version. Any failure before the swap
// leaves the model as it was (the previous version keeps serving); a failure
// during the swap restores the previous tensors.
#include "train_common.hpp"
#include "rl/core/json.hpp"
#include "rl/core/tensor_io.hpp"
#include "rl/core/weight_set.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <map>
#include <optional>
#include <thread>

namespace {

using namespace rl::host::capi;
using rl::host::CallSink;
using rl::host::HostError;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char *kKind = "rl.weights";

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct WeightOptions {
    int64_t retries = 2;               // recv: refused messages tolerated before giving up
    std::string dtype = "native";      // send only: or float32, bfloat16
    std::optional<int64_t> newer_than; // recv only: the handshake's floor (default: in use)
};

// The options_json of rl_weights_send (retries, dtype) or, with `send` false,
// of rl_weights_recv (retries, newer_than).
WeightOptions weight_options(const char *text, const std::string &fn, bool send) {
    const json j = parse_json(text, fn + ": options_json");
    WeightOptions o;
    if (j.is_null()) return o;
    if (!j.is_object())
        throw HostError{RL_ERR_INVALID_ARG, fn + ": options_json must be an object"};
    for (const auto &[k, v] : j.items()) {
        if (k == "retries" && v.is_number_integer() && v.get<int64_t>() >= 0)
            o.retries = v.get<int64_t>();
        else if (send && k == "dtype" && v.is_string() &&
                 (v == "native" || v == "float32" || v == "bfloat16"))
            o.dtype = v.get<std::string>();
        else if (!send && k == "newer_than" && v.is_number_integer() && v.get<int64_t>() >= -1)
            o.newer_than = v.get<int64_t>();
        else
            throw HostError{RL_ERR_INVALID_ARG,
                            fn + ": options_json key '" + k +
                                "' is unknown or has a bad value (retries: integer >= 0" +
                                (send ? ", dtype: native | float32 | bfloat16)"
                                      : ", newer_than: integer >= -1)")};
    }
    return o;
}

// A view of a contiguous CPU tensor, borrowed while `t` lives.
rl_tensor_view_t view_of(const at::Tensor &t) {
    rl_tensor_view_t v{};
    v.data = t.numel() > 0 ? t.data_ptr() : nullptr;
    v.device = {RL_DEVICE_CPU, 0};
    v.ndim = static_cast<int32_t>(t.dim());
    v.dtype = dtype_of(t.scalar_type());
    v.shape = const_cast<int64_t *>(t.sizes().data());
    v.strides = nullptr;
    return v;
}

// "version 3", or what a model that never received weights serves.
std::string in_use(const rl_model_t *m) {
    return m->synced_version < 0 ? std::string("the weights it was loaded with")
                                 : "version " + std::to_string(m->synced_version);
}

} // namespace

extern "C" {

RL_API rl_status_t rl_weights_send(rl_model_t *model, rl_instance_t *transport, int64_t version,
                                   const char *options_json, rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_weights_send";
        require(model != nullptr, fn_msg(fn, "model is NULL"));
        require(version >= 0, fn_msg(fn, "version must be >= 0, got " + std::to_string(version)));
        const WeightOptions opt = weight_options(options_json, "rl_weights_send", true);
        if (out_result) *out_result = nullptr;
        const auto t0 = Clock::now();
        auto &lm = policy_of(model, fn).model();
        lm.materialize_weights(); // collective under fsdp: every rank calls
        CallSink sink;
        if (transport == nullptr) { // a rank that only helps gather
            if (out_result) *out_result = new_result(std::move(sink));
            return RL_OK;
        }
        // Contiguous CPU tensors in the wire dtype, kept alive for the send.
        std::vector<std::string> names;
        std::vector<at::Tensor> tensors;
        uint64_t bytes = 0;
        for (const auto &[name, p] : lm.named_weights()) {
            at::Tensor t = p.detach();
            if (opt.dtype == "float32") t = t.to(at::kFloat);
            if (opt.dtype == "bfloat16") t = t.to(at::kBFloat16);
            t = t.to(at::kCPU).contiguous();
            bytes += static_cast<uint64_t>(t.numel()) * t.element_size();
            names.push_back(name);
            tensors.push_back(std::move(t));
        }
        std::vector<rl_tensor_arg_t> args(tensors.size());
        for (size_t i = 0; i < tensors.size(); ++i) {
            args[i].name = names[i].c_str();
            args[i].view = view_of(tensors[i]);
        }
        const rl_tensor_list_t list{args.data(), args.size()};
        const std::string header =
            json{{"kind", kKind},
                 {"version", version},
                 {"step", version},
                 {"model", {{"parameters", lm.num_parameters()}, {"tensors", tensors.size()}}}}
                .dump();
        rl_status_t st = RL_OK;
        int64_t attempts = 0;
        for (;;) {
            ++attempts;
            st =
                rl_transport_send(transport, rl_string_view_t{header.data(), header.size()}, &list);
            if (st == RL_OK) break;
            const bool transient = st == RL_ERR_TIMEOUT || st == RL_ERR_IO;
            if (!transient || attempts > opt.retries)
                throw HostError{st,
                                fn_msg(fn, "sending weights version " + std::to_string(version) +
                                               " failed after " + std::to_string(attempts) +
                                               " attempt(s): " + last_error())};
            std::this_thread::sleep_for(std::chrono::milliseconds(100 << (attempts - 1)));
        }
        sink.metrics["sync/bytes"] = static_cast<double>(bytes);
        sink.metrics["sync/seconds"] = seconds_since(t0);
        sink.metrics["sync/version"] = static_cast<double>(version);
        sink.metrics["sync/attempts"] = static_cast<double>(attempts);
        sink.scalars["version"] = static_cast<double>(version);
        if (out_result) *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_weights_recv(rl_model_t *model, rl_instance_t *transport, int64_t timeout_ms,
                                   const char *options_json, rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_weights_recv";
        require(model && transport && out_result,
                fn_msg(fn, "model, transport and out_result are required"));
        *out_result = nullptr;
        const WeightOptions opt = weight_options(options_json, "rl_weights_recv", false);
        rl::core::Policy &policy = policy_of(model, fn);
        auto &lm = policy.model();
        if (lm.weight_hooks() != nullptr)
            throw HostError{RL_ERR_BAD_STATE,
                            fn_msg(fn, "the model is sharded (trainer.parallel fsdp); weights "
                                       "are received by an unsharded inference model")};
        const auto t0 = Clock::now();
        const auto deadline = t0 + std::chrono::milliseconds(timeout_ms);
        int64_t refused = 0, stale = 0;
        std::string last_refusal;
        for (;;) {
            int64_t left = -1;
            if (timeout_ms >= 0)
                left = std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                deadline - Clock::now())
                                                .count());
            rl_result_t *raw = nullptr;
            const rl_status_t st = rl_transport_recv(transport, left, &raw);
            if (st == RL_ERR_TIMEOUT)
                throw HostError{RL_ERR_TIMEOUT,
                                fn_msg(fn, "no new weights within " + std::to_string(timeout_ms) +
                                               " ms (in use: " + in_use(model) + ")" +
                                               (last_refusal.empty()
                                                    ? std::string()
                                                    : "; last refused message: " + last_refusal))};
            if (st != RL_OK) {
                // Malformed or corrupted: nothing was handed over; the model is
                // untouched. Wait for the next one, a few times.
                last_refusal = last_error();
                if (st != RL_ERR_INVALID_ARG || ++refused > opt.retries)
                    throw HostError{st, fn_msg(fn, "weights refused; the model keeps " +
                                                       in_use(model) + ": " + last_refusal)};
                continue;
            }
            std::unique_ptr<rl_result_t, decltype(&rl_result_destroy)> msg(raw, &rl_result_destroy);
            const CallSink &in = msg->sink;
            const json header = rl::core::parse_json_or_discarded(in.texts.at("header"));
            if (!header.is_object() || header.value("kind", "") != kKind ||
                !header.contains("version") || !header["version"].is_number_integer())
                throw HostError{RL_ERR_INVALID_ARG,
                                fn_msg(fn, "the transport delivered a message that is not a "
                                           "weight set (header kind must be 'rl.weights' with an "
                                           "integer 'version'): " +
                                               in.texts.at("header").substr(0, 200))};
            const int64_t version = header["version"].get<int64_t>();
            // Handshake: only versions newer than the one in use (or than
            // newer_than: a trainer that restarted from a checkpoint
            // broadcasts an older version, which a worker must take).
            if (version <= opt.newer_than.value_or(model->synced_version)) {
                ++stale;
                continue;
            }
            // Every parameter present with its shape, nothing else.
            const auto weights = lm.named_weights();
            if (in.tensors.size() != weights.size()) {
                std::string extra;
                std::map<std::string, bool> known;
                for (const auto &w : weights) known[w.first] = true;
                for (const auto &[name, t] : in.tensors)
                    if (!known.count(name)) {
                        extra = name;
                        break;
                    }
                throw HostError{
                    RL_ERR_INVALID_ARG,
                    fn_msg(fn, "weights version " + std::to_string(version) + " have " +
                                   std::to_string(in.tensors.size()) + " tensors, the model has " +
                                   std::to_string(weights.size()) +
                                   (extra.empty() ? std::string()
                                                  : " (unknown tensor '" + extra + "')") +
                                   "; is the sender training another model?")};
            }
            // Views of the message's bytes; staging copies them into the
            // model's dtype and device, checked, before anything is replaced.
            std::vector<std::pair<std::string, at::Tensor>> received;
            received.reserve(in.tensors.size());
            for (const auto &[name, o] : in.tensors)
                received.emplace_back(
                    name, at::from_blob(const_cast<uint8_t *>(o.bytes.data()), o.shape,
                                        at::TensorOptions().dtype(scalar_type_of(
                                            o.dtype, fn_msg(fn, "tensor '" + name + "'")))));
            rl::core::StagedWeights staged = [&] {
                try {
                    return rl::core::StagedWeights::stage(lm, std::move(received), true);
                } catch (const rl::core::Error &e) {
                    throw HostError{e.kind() == rl::core::ErrorKind::Numeric ? RL_ERR_NUMERIC
                                                                             : RL_ERR_INVALID_ARG,
                                    fn_msg(fn, "weights version " + std::to_string(version) +
                                                   " refused, the model keeps " + in_use(model) +
                                                   ": " + e.what())};
                }
            }();
            const uint64_t bytes = staged.bytes();
            staged.swap_into(policy, version);
            model->synced_version = version;
            CallSink sink;
            sink.metrics["sync/bytes"] = static_cast<double>(bytes);
            sink.metrics["sync/seconds"] = seconds_since(t0);
            sink.metrics["sync/version"] = static_cast<double>(version);
            sink.metrics["sync/refused"] = static_cast<double>(refused);
            sink.metrics["sync/stale"] = static_cast<double>(stale);
            sink.scalars["version"] = static_cast<double>(version);
            *out_result = new_result(std::move(sink));
            return RL_OK;
        }
    });
}

} // extern "C"
