// A set of named weights on its way into a model: checked against the model's
// parameters and staged in their dtype and device, then swapped in at once.
// The one swap routine of docs/transports.md and docs/serving.md: the C API's
// rl_weights_recv and the inference server's weight routes both use it.
#pragma once

#include "rl/core/policy.hpp"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rl::core {

class StagedWeights {
public:
    /// Checks `received` against `model`'s weights: every name is a weight of
    /// the model and appears once, every shape matches, every dtype is floating
    /// point; with `complete`, every weight of the model is present. Then
    /// converts each tensor to its parameter's dtype and device and refuses
    /// NaN or infinite values there (a finite float32 can overflow a float16).
    /// Throws Error naming the tensor (ErrorKind::Numeric for non-finite
    /// values, InvalidArgument otherwise); the model is not touched.
    static StagedWeights stage(const CausalLM &model,
                               std::vector<std::pair<std::string, at::Tensor>> received,
                               bool complete);

    /// Copies every staged value into its parameter (in place: whoever holds
    /// the parameter tensors, the engine included, sees the new values) and
    /// sets `policy`'s version. Staged values have the parameters' shape,
    /// dtype and device, so the copies cannot fail part way. The caller keeps
    /// readers out while it runs (the serving scheduler's exclusive section;
    /// the control thread for the C API).
    void swap_into(Policy &policy, int64_t version);

    size_t size() const { return staged_.size(); }
    /// Bytes of the tensors as received (before the dtype conversion).
    uint64_t bytes() const { return bytes_; }

private:
    std::vector<std::pair<at::Tensor, at::Tensor>> staged_; // (parameter, new value)
    uint64_t bytes_ = 0;
};

} // namespace rl::core
