#include "loss_node.hpp"

#include "../capi/train_common.hpp"
#include "loss_call.hpp"

#include <ATen/ATen.h>

#include <memory>
#include <mutex>

namespace rl::host::bridge {

namespace core = rl::core;

static_assert(static_cast<int32_t>(core::MetricReduce::TokenMean) == RL_METRIC_TOKEN_MEAN &&
                  static_cast<int32_t>(core::MetricReduce::SeqMean) == RL_METRIC_SEQ_MEAN &&
                  static_cast<int32_t>(core::MetricReduce::Sum) == RL_METRIC_SUM &&
                  static_cast<int32_t>(core::MetricReduce::Min) == RL_METRIC_MIN &&
                  static_cast<int32_t>(core::MetricReduce::Max) == RL_METRIC_MAX,
              "core::MetricReduce mirrors rl_metric_reduction_t");

rl_tensor_view_t view_of(const at::Tensor &t) {
    if (!t.device().is_cpu() || !t.is_contiguous())
        throw HostError{RL_ERR_INTERNAL, "loss bridge: inputs must be contiguous CPU tensors"};
    rl_tensor_view_t v{};
    v.data = t.numel() == 0 ? nullptr : t.data_ptr();
    v.device = {RL_DEVICE_CPU, 0};
    v.ndim = static_cast<int32_t>(t.dim());
    v.dtype = capi::dtype_of(t.scalar_type());
    // ATen keeps sizes as int64 in the tensor's own storage: borrowed as is.
    v.shape = const_cast<int64_t *>(t.sizes().data());
    v.strides = nullptr;
    v.byte_offset = 0;
    return v;
}

core::LossFunction loss_node(Instance &inst) {
    const LossSignatureLists sig = loss_signature(inst);
    core::LossFunction f;
    f.name = inst.who();
    f.signature = {sig.required, sig.optional, sig.differentiable};
    f.compute = [&inst, sig](const core::LossCall &call) {
        std::vector<rl_tensor_arg_t> args;
        args.reserve(call.tensors.size());
        for (const auto &kv : call.tensors) args.push_back({kv.first.c_str(), view_of(kv.second)});
        rl_loss_inputs_t in{};
        in.struct_size = sizeof(in);
        in.tensors = rl_tensor_list_t{args.empty() ? nullptr : args.data(), args.size()};
        in.cu_seqlens = view_of(call.cu_seqlens);
        in.global_tokens = call.global_tokens;
        in.global_seqs = call.global_seqs;
        const std::vector<uint64_t> with_grad = check_loss_inputs(inst, sig, in);

        // One zeroed gradient per differentiable input present, same dtype and shape.
        std::vector<at::Tensor> grads;
        std::vector<rl_tensor_arg_t> grad_args;
        if (call.want_grads) {
            grads.reserve(with_grad.size());
            for (uint64_t i : with_grad) {
                grads.push_back(at::zeros_like(call.tensors[i].second));
                grad_args.push_back({args[i].name, view_of(grads.back())});
            }
        }
        LossOutcome out = call_loss(inst, in, grad_args);

        core::LossResult r;
        r.loss = out.loss;
        for (size_t k = 0; k < grads.size(); ++k)
            r.grads[call.tensors[with_grad[k]].first] = std::move(grads[k]);
        for (auto &kv : out.emitted.tensors)
            r.tensors[kv.first] = capi::tensor_from_owned(kv.second, inst.who());
        r.metrics.insert(out.emitted.metrics.begin(), out.emitted.metrics.end());
        for (const auto &kv : out.emitted.reductions)
            r.reductions[kv.first] = core::MetricSpec{
                static_cast<core::MetricReduce>(kv.second.reduction), kv.second.weight};
        return r;
    };
    return f;
}

LossFactory loss_factory(rl_runtime_t *runtime) {
    if (runtime == nullptr) return {};
    // One runtime serves every caller; its registry is entered one call at a time.
    auto mu = std::make_shared<std::mutex>();
    return [runtime, mu](const std::string &name, const std::string &params) {
        rl_instance_t *inst = nullptr;
        {
            std::lock_guard<std::mutex> lock(*mu);
            const rl_status_t st =
                rl_instance_create(runtime, RL_KIND_LOSS, name.c_str(), params.c_str(), &inst);
            if (st != RL_OK)
                throw core::Error(st == RL_ERR_NOT_FOUND ? core::ErrorKind::NotFound
                                                         : core::ErrorKind::InvalidArgument,
                                  rl_last_error());
        }
        std::shared_ptr<rl_instance_t> owner(inst, [mu](rl_instance_t *i) {
            std::lock_guard<std::mutex> lock(*mu);
            rl_instance_destroy(i);
        });
        core::LossFunction f = loss_node(capi::checked(inst, RL_KIND_LOSS, "loss plugin"));
        auto compute = f.compute;
        f.compute = [owner, compute](const core::LossCall &call) { return compute(call); };
        return f;
    };
}

} // namespace rl::host::bridge
