// One call into a loss plugin, shared by rl_loss_compute (capi.cpp) and the
// trainer's loss callback (capi_train.cpp). Internal to librl.
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
// are errors naming them), allocates zeroed gradient buffers for the
// differentiable inputs present when want_grads (float32 / float64 only),
// calls compute() and refuses a non-finite loss. The sink holds scalar
// "loss", tensors "grad.<input>" and whatever the plugin emitted.
CallSink compute_loss(Instance &inst, const rl_loss_inputs_t &inputs, bool want_grads);

} // namespace rl::host
