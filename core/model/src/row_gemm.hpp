#pragma once
// Products of a few rows with a weight matrix, C = A W^T, for decoding on the
// CPU (docs/performance.md, "Decoding products on the CPU").
//
// A decoding step multiplies a handful of rows (one per sequence) by every
// weight matrix of the model. The BLAS behind at::mm packs the weight into its
// own panel layout on every call, which for a few rows costs about as much as
// the product, and the packed copy then streams through the caches again. Here
// each output is a dot product of an A row with a W row read in place: W
// streams from memory once per call, in its own [N, K] layout (no packed copy,
// so the engine keeps reading the trainer's tensors).
//
// Plain float pointers, no libtorch: the caller (model.cpp) checks shapes,
// dtypes and strides and splits the N range across threads.
#include <cstdint>

namespace rl::core::row_gemm {

/// The most rows of A one call takes.
constexpr int64_t kMaxRows = 64;

/// The instruction sets the kernel has a path for: AVX2 + FMA (8 lanes) and
/// AVX-512 (16 lanes). Each path adds every output in one fixed order whatever
/// the split of the outputs; the two orders differ (the last bits of a
/// product do).
enum class Isa { Avx2, Avx512 };

/// Whether this CPU runs that path (x86-64 with AVX2 and FMA; and AVX-512F).
bool available(Isa isa = Isa::Avx2);

/// The path decoding uses: AVX-512 where the CPU has it, unless
/// RL_DECODE_GEMM=avx2 is set; else AVX2. (Read once.)
Isa preferred();

/// C[m][n] = sum_k A[m][k] * W[n][k] for m < M and n in [n_begin, n_end).
/// Rows are contiguous in k; lda, ldw and ldc are the row strides in
/// elements. Needs available(isa) and M <= kMaxRows.
void multiply(Isa isa, const float *A, int64_t lda, const float *W, int64_t ldw, float *C,
              int64_t ldc, int64_t M, int64_t K, int64_t n_begin, int64_t n_end);

} // namespace rl::core::row_gemm
