// One call into a loss plugin, shared by rl_loss_compute (capi/plugins.cpp) and the
// trainer's loss node (bridge/loss_node.cpp). Internal to librl.
#pragma once

#include "rl/host/runtime.hpp"

#include <string>
#include <vector>

namespace rl::host {

struct LossSignatureLists {
    std::vector<std::string> required, optional, differentiable;
};

// The plugin's signature (copied out of its lists).
LossSignatureLists loss_signature(Instance &inst);

// Checks the input names against the signature (unexpected and missing names
// are errors naming them) and returns the indices, in `inputs.tensors`, of the
// differentiable inputs present (each float32 / float64, else an error): the
// inputs that get a gradient buffer when gradients are wanted.
std::vector<uint64_t> check_loss_inputs(Instance &inst, const LossSignatureLists &sig,
                                        const rl_loss_inputs_t &inputs);

// What a loss call produced besides the gradients (which it wrote into the
// caller's buffers): the loss value and what the plugin emitted.
struct LossOutcome {
    double loss = 0;
    CallSink emitted;
};

// Calls compute() with the caller's zeroed gradient buffers (`grads`, named
// after their inputs; empty for a forward-only call) and refuses a non-finite
// loss.
LossOutcome call_loss(Instance &inst, const rl_loss_inputs_t &inputs,
                      const std::vector<rl_tensor_arg_t> &grads);

// rl_loss_compute: the checks, host-owned gradient buffers when want_grads,
// the call. The sink holds scalar "loss", tensors "grad.<input>" (the public
// result names of rl_loss_compute) and whatever the plugin emitted.
CallSink compute_loss(Instance &inst, const rl_loss_inputs_t &inputs, bool want_grads);

} // namespace rl::host
