// Per-token log-probabilities (and entropy) of labels under the output
// projection, in chunks of tokens: the forward never holds more than
// chunk x vocab fp32 logits, and the backward recomputes them chunk by chunk
// instead of saving them.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>

namespace rl::core {

struct ChunkedLogprobs {
    at::Tensor logprobs;  ///< [T]
    at::Tensor entropy;   ///< [T] when asked, else undefined
    at::Tensor logsumexp; ///< [T] log Z of the raw logits when asked, else undefined
};

/// hidden [T, Hd], weight [V, Hd], labels [T] int64. logprobs and entropy are
/// of the logits divided by `temperature`; logsumexp of the raw logits. fp32,
/// differentiable w.r.t. hidden and weight.
ChunkedLogprobs chunked_logprobs(const at::Tensor &hidden, const at::Tensor &weight,
                                 const at::Tensor &labels, int64_t chunk, double temperature,
                                 bool entropy, int64_t ignore_index, bool logsumexp = false);

} // namespace rl::core
