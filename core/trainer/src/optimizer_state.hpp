// The key under which torch's AdamW keeps a parameter's state.
#pragma once

#include <ATen/Tensor.h>
#include <torch/optim/adamw.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace rl::core {

// The optimizer keys its per-parameter state by the parameter's TensorImpl:
// the pointer itself from libtorch 2.6 on, its printed form before.
using OptimizerStateKey =
    std::decay_t<decltype(std::declval<torch::optim::AdamW &>().state())>::key_type;

template <typename Key = OptimizerStateKey>
Key state_key_of(const at::Tensor &p) {
    if constexpr (std::is_same_v<Key, std::string>) {
        std::ostringstream s;
        s << p.unsafeGetTensorImpl();
        return s.str();
    } else {
        return p.unsafeGetTensorImpl();
    }
}

} // namespace rl::core
