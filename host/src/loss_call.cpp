#include "loss_call.hpp"

#include "capi_common.hpp"

#include <algorithm>
#include <cmath>
#include <set>

namespace rl::host {

using capi::join;
using capi::require;
using capi::str_list;

LossSignatureLists loss_signature(Instance &inst) {
    auto *iface = static_cast<const rl_loss_iface_t *>(inst.iface());
    rl_loss_signature_t sig{};
    sig.struct_size = sizeof(sig);
    inst.call([&](const rl_call_ctx_t *) { return iface->get_signature(inst.plugin(), &sig); });
    return {str_list(sig.required), str_list(sig.optional), str_list(sig.differentiable)};
}

CallSink compute_loss(Instance &inst, const rl_loss_inputs_t &inputs, bool want_grads) {
    auto *iface = static_cast<const rl_loss_iface_t *>(inst.iface());
    const LossSignatureLists sig = loss_signature(inst);
    std::set<std::string> accepted(sig.required.begin(), sig.required.end());
    accepted.insert(sig.optional.begin(), sig.optional.end());
    std::set<std::string> present;
    for (uint64_t i = 0; i < inputs.tensors.count; ++i) {
        const rl_tensor_arg_t &a = inputs.tensors.items[i];
        require(a.name != nullptr,
                inst.who() + ": input tensor " + std::to_string(i) + " has no name");
        if (!accepted.count(a.name))
            throw HostError{RL_ERR_INVALID_ARG,
                            inst.who() + ": unexpected input '" + a.name + "'; accepted: " +
                                join(std::vector<std::string>(accepted.begin(), accepted.end()))};
        present.insert(a.name);
    }
    for (const auto &r : sig.required)
        if (!present.count(r))
            throw HostError{RL_ERR_INVALID_ARG, inst.who() + ": missing required input '" + r +
                                                    "'; required: " + join(sig.required) +
                                                    "; optional: " + join(sig.optional)};
    // Gradient buffers for the differentiable inputs that are present.
    std::vector<OwnedTensor> grad_store;
    std::vector<rl_tensor_arg_t> grad_args;
    std::vector<std::string> grad_names;
    if (want_grads) {
        for (uint64_t i = 0; i < inputs.tensors.count; ++i) {
            const rl_tensor_arg_t &a = inputs.tensors.items[i];
            if (std::find(sig.differentiable.begin(), sig.differentiable.end(), a.name) ==
                sig.differentiable.end())
                continue;
            if (a.view.dtype.code != RL_DTYPE_FLOAT ||
                (a.view.dtype.bits != 32 && a.view.dtype.bits != 64))
                throw HostError{RL_ERR_INVALID_ARG, inst.who() + ": differentiable input '" +
                                                        a.name + "' must be float32 or float64"};
            grad_store.push_back(OwnedTensor::zeros(
                a.view.dtype, std::vector<int64_t>(a.view.shape, a.view.shape + a.view.ndim)));
            grad_names.emplace_back(a.name);
        }
        for (size_t i = 0; i < grad_store.size(); ++i)
            grad_args.push_back({grad_names[i].c_str(), grad_store[i].view()});
    }
    rl_loss_outputs_t out{};
    out.struct_size = sizeof(out);
    out.grads = rl_tensor_list_t{grad_args.empty() ? nullptr : grad_args.data(), grad_args.size()};
    CallSink sink = inst.call([&](const rl_call_ctx_t *ctx) {
        return iface->compute(inst.plugin(), ctx, &inputs, &out);
    });
    if (!std::isfinite(out.loss))
        throw HostError{RL_ERR_NUMERIC, inst.who() + ": the loss is " +
                                            (std::isnan(out.loss) ? "NaN" : "infinite")};
    sink.scalars["loss"] = out.loss;
    for (size_t i = 0; i < grad_store.size(); ++i)
        sink.tensors["grad." + grad_names[i]] = std::move(grad_store[i]);
    return sink;
}

} // namespace rl::host
