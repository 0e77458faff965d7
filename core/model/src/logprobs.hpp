// Per-token log-probabilities (and entropy) of labels under the output
// projection, in chunks of tokens: the forward never holds more than
// chunk x vocab fp32 logits, and the backward recomputes them chunk by chunk
// instead of saving them.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <utility>

namespace rl::core {

/// hidden [T, Hd], weight [V, Hd], labels [T] int64. Returns (logprobs [T],
/// entropy [T] or undefined), fp32, differentiable w.r.t. hidden and weight.
std::pair<at::Tensor, at::Tensor>
chunked_logprobs(const at::Tensor &hidden, const at::Tensor &weight, const at::Tensor &labels,
                 int64_t chunk, double temperature, bool entropy, int64_t ignore_index);

} // namespace rl::core
