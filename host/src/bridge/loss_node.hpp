// The bridge between the trainer and loss plugins: a loss plugin instance as
// the trainer's loss function. Inputs cross as views of the trainer's own
// tensors and gradients are written into tensors the bridge owns, so nothing
// is copied on either side; each gradient is tied to its input by position,
// never by a name convention. Internal to librl.
#pragma once

#include "rl/core/trainer.hpp"
#include "rl/host/runtime.hpp"

#include <functional>
#include <string>

namespace rl::host::bridge {

// A trainer loss function that calls `loss` (a loss plugin instance, which
// must outlive the returned function).
rl::core::LossFunction loss_node(Instance &loss);

// The loss plugins of `runtime` by name, as trainer loss functions: each call
// creates one plugin instance with `params_json` as its parameters, destroyed
// with the returned function. Throws rl::core::Error (NotFound when no plugin
// has that name, InvalidArgument when the plugin refuses its parameters).
// `runtime` NULL: an empty function.
using LossFactory =
    std::function<rl::core::LossFunction(const std::string &name, const std::string &params_json)>;
LossFactory loss_factory(rl_runtime_t *runtime);

// A borrowed ABI view of a contiguous CPU tensor (no copy). `t` must outlive
// the view.
rl_tensor_view_t view_of(const at::Tensor &t);

} // namespace rl::host::bridge
