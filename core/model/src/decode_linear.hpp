#pragma once
// x W^T (+ b) for the few rows of a decoding step (row_gemm.hpp says why).
#include "row_gemm.hpp"

#include <ATen/core/Tensor.h>

namespace rl::core {

/// Whether decode_linear runs the row kernel for these operands: a float32
/// CPU x of at most row_gemm::kMaxRows rows, a float32 CPU weight whose rows
/// are contiguous, no gradient to record, an AVX2 + FMA CPU, and
/// RL_DECODE_GEMM not set to "blas". The kernel's AVX-512 path runs where the
/// CPU has AVX-512F, unless RL_DECODE_GEMM=avx2 (row_gemm::preferred).
bool decode_linear_applies(const at::Tensor &x, const at::Tensor &weight);

/// y = x W^T + b for x [..., K] and W [N, K]: the row kernel when
/// decode_linear_applies, at::linear otherwise. The row kernel splits the N
/// outputs across at::get_num_threads() threads; each output is the same sum
/// whatever the split (the result does not depend on the thread count).
at::Tensor decode_linear(const at::Tensor &x, const at::Tensor &weight, const at::Tensor &bias);

/// The same through one path of the kernel (at::linear where this CPU lacks
/// it): for benchmarks and tests that compare the paths.
at::Tensor decode_linear(const at::Tensor &x, const at::Tensor &weight, const at::Tensor &bias,
                         row_gemm::Isa isa);

} // namespace rl::core
