#include "loss_call.hpp"

#include "../capi/common.hpp"

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

std::vector<uint64_t> check_loss_inputs(Instance &inst, const LossSignatureLists &sig,
                                        const rl_loss_inputs_t &inputs) {
    std::set<std::string> accepted(sig.required.begin(), sig.required.end());
    accepted.insert(sig.optional.begin(), sig.optional.end());
    const std::set<std::string> differentiable(sig.differentiable.begin(),
                                               sig.differentiable.end());
    std::set<std::string> present;
    std::vector<uint64_t> with_grad;
    for (uint64_t i = 0; i < inputs.tensors.count; ++i) {
        const rl_tensor_arg_t &a = inputs.tensors.items[i];
        require(a.name != nullptr,
                inst.who() + ": input tensor " + std::to_string(i) + " has no name");
        if (!accepted.count(a.name))
            throw HostError{RL_ERR_INVALID_ARG,
                            inst.who() + ": unexpected input '" + a.name + "'; accepted: " +
                                join(std::vector<std::string>(accepted.begin(), accepted.end()))};
        if (!present.insert(a.name).second)
            throw HostError{RL_ERR_INVALID_ARG,
                            inst.who() + ": input '" + std::string(a.name) + "' given twice"};
        if (!differentiable.count(a.name)) continue;
        if (a.view.dtype.code != RL_DTYPE_FLOAT ||
            (a.view.dtype.bits != 32 && a.view.dtype.bits != 64))
            throw HostError{RL_ERR_INVALID_ARG, inst.who() + ": differentiable input '" + a.name +
                                                    "' must be float32 or float64"};
        with_grad.push_back(i);
    }
    for (const auto &r : sig.required)
        if (!present.count(r))
            throw HostError{RL_ERR_INVALID_ARG, inst.who() + ": missing required input '" + r +
                                                    "'; required: " + join(sig.required) +
                                                    "; optional: " + join(sig.optional)};
    return with_grad;
}

LossOutcome call_loss(Instance &inst, const rl_loss_inputs_t &inputs,
                      const std::vector<rl_tensor_arg_t> &grads) {
    auto *iface = static_cast<const rl_loss_iface_t *>(inst.iface());
    rl_loss_outputs_t out{};
    out.struct_size = sizeof(out);
    out.grads = rl_tensor_list_t{grads.empty() ? nullptr : grads.data(), grads.size()};
    LossOutcome r;
    r.emitted = inst.call([&](const rl_call_ctx_t *ctx) {
        return iface->compute(inst.plugin(), ctx, &inputs, &out);
    });
    if (!std::isfinite(out.loss))
        throw HostError{RL_ERR_NUMERIC, inst.who() + ": the loss is " +
                                            (std::isnan(out.loss) ? "NaN" : "infinite")};
    r.loss = out.loss;
    return r;
}

CallSink compute_loss(Instance &inst, const rl_loss_inputs_t &inputs, bool want_grads) {
    const std::vector<uint64_t> with_grad = check_loss_inputs(inst, loss_signature(inst), inputs);
    std::vector<OwnedTensor> store;
    std::vector<rl_tensor_arg_t> grads;
    if (want_grads) {
        store.reserve(with_grad.size());
        for (uint64_t i : with_grad) {
            const rl_tensor_view_t &v = inputs.tensors.items[i].view;
            store.push_back(
                OwnedTensor::zeros(v.dtype, std::vector<int64_t>(v.shape, v.shape + v.ndim)));
            grads.push_back({inputs.tensors.items[i].name, store.back().view()});
        }
    }
    LossOutcome r = call_loss(inst, inputs, grads);
    r.emitted.scalars["loss"] = r.loss;
    for (size_t k = 0; k < store.size(); ++k)
        r.emitted.tensors["grad." + std::string(grads[k].name)] = std::move(store[k]);
    return std::move(r.emitted);
}

} // namespace rl::host
