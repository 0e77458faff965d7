#include "row_gemm.hpp"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RL_ROW_GEMM_X86 1
#else
#define RL_ROW_GEMM_X86 0
#endif

namespace rl::core::row_gemm {

#if RL_ROW_GEMM_X86
namespace {

// Only the functions that carry this attribute use AVX2 / FMA instructions;
// available() checks the CPU before any of them runs. (The rest of the library
// is built for the baseline x86-64.)
#define RL_AVX2 __attribute__((target("avx2,fma")))

// The four 8-lane sums of a0..a3 as one 4-lane vector. Every output goes
// through the same tree ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)), whichever tile
// computed it, so a product does not depend on how the N range was split.
RL_AVX2 inline __m128 sum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// MR rows of A against NR rows of W: MR x NR accumulators of 8 lanes over k.
// 3 x 4 uses twelve accumulators, three A vectors and one W vector: the 16
// vector registers, enough independent sums to keep both FMA units busy.
template <int MR, int NR>
RL_AVX2 void tile(const float *A, int64_t lda, const float *W, int64_t ldw, float *C, int64_t ldc,
                  int64_t K, __m256i tail) {
    __m256 acc[MR][NR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
    const int64_t body = K & ~int64_t{7};
    for (int64_t k = 0; k < body; k += 8) {
        __m256 a[MR];
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) a[i] = _mm256_loadu_ps(A + i * lda + k);
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) {
            const __m256 w = _mm256_loadu_ps(W + j * ldw + k);
#pragma GCC unroll 4
            for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(a[i], w, acc[i][j]);
        }
    }
    if (body < K) {
        // The last K % 8 columns: masked loads read nothing past the row.
        __m256 a[MR];
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) a[i] = _mm256_maskload_ps(A + i * lda + body, tail);
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) {
            const __m256 w = _mm256_maskload_ps(W + j * ldw + body, tail);
#pragma GCC unroll 4
            for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(a[i], w, acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
        __m256 r[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) r[j] = acc[i][j];
        const __m128 s = sum4(r[0], r[1], r[2], r[3]);
        if constexpr (NR == 4) {
            _mm_storeu_ps(C + i * ldc, s);
        } else {
            alignas(16) float out[4];
            _mm_store_ps(out, s);
            for (int j = 0; j < NR; ++j) C[i * ldc + j] = out[j];
        }
    }
}

// Columns [0, count) of W (rows of W) for MR rows of A: tiles of four W rows,
// then the rest.
template <int MR>
RL_AVX2 void row_block(const float *A, int64_t lda, const float *W, int64_t ldw, float *C,
                       int64_t ldc, int64_t K, int64_t count, __m256i tail) {
    int64_t n = 0;
    for (; n + 4 <= count; n += 4) tile<MR, 4>(A, lda, W + n * ldw, ldw, C + n, ldc, K, tail);
    switch (count - n) {
        case 3:
            tile<MR, 3>(A, lda, W + n * ldw, ldw, C + n, ldc, K, tail);
            break;
        case 2:
            tile<MR, 2>(A, lda, W + n * ldw, ldw, C + n, ldc, K, tail);
            break;
        case 1:
            tile<MR, 1>(A, lda, W + n * ldw, ldw, C + n, ldc, K, tail);
            break;
        default:
            break;
    }
}

// Rows are taken three at a time; four left over go as two pairs, so that no
// group but a lone row has fewer than two.
int group_rows(int64_t left) {
    if (left == 4) return 2;
    return left >= 3 ? 3 : static_cast<int>(left);
}

// Columns per block: the W rows a block reads (at most kBlockBytes) stay in
// the first-level caches while every group of A rows passes over them, so W
// is read from memory once per call. The block's outputs go to a small
// contiguous buffer first: rows of C lie a whole output row apart, and for a
// wide C (the vocabulary) those addresses share cache sets, so writing a few
// floats into each in turn would evict them from one another.
constexpr int64_t kBlockBytes = 24 * 1024;
constexpr int64_t kMaxBlock = 64;

RL_AVX2 void multiply_avx2(const float *A, int64_t lda, const float *W, int64_t ldw, float *C,
                           int64_t ldc, int64_t M, int64_t K, int64_t n_begin, int64_t n_end) {
    alignas(32) int32_t lanes[8];
    for (int l = 0; l < 8; ++l) lanes[l] = l < (K & 7) ? -1 : 0;
    const __m256i tail = _mm256_load_si256(reinterpret_cast<const __m256i *>(lanes));
    const int64_t row_bytes = K * static_cast<int64_t>(sizeof(float));
    int64_t block = (kBlockBytes / row_bytes) & ~int64_t{3};
    block = block < 4 ? 4 : block > kMaxBlock ? kMaxBlock : block;
    alignas(64) float out[kMaxRows * kMaxBlock];
    for (int64_t n0 = n_begin; n0 < n_end; n0 += block) {
        const int64_t n1 = n0 + block < n_end ? n0 + block : n_end;
        const float *w = W + n0 * ldw;
        for (int64_t m = 0; m < M;) {
            const int r = group_rows(M - m);
            const float *a = A + m * lda;
            float *o = out + m * block;
            if (r == 3)
                row_block<3>(a, lda, w, ldw, o, block, K, n1 - n0, tail);
            else if (r == 2)
                row_block<2>(a, lda, w, ldw, o, block, K, n1 - n0, tail);
            else
                row_block<1>(a, lda, w, ldw, o, block, K, n1 - n0, tail);
            m += r;
        }
        for (int64_t m = 0; m < M; ++m)
            std::memcpy(C + m * ldc + n0, out + m * block, sizeof(float) * (n1 - n0));
    }
}

// -- AVX-512 ------------------------------------------------------------------
// The same blocking with 16-lane accumulators and tiles of 4 x 4 (sixteen
// accumulators, four A vectors, one W vector of the 32 registers). Each
// output's 16 lanes are folded to 8 (lane l plus lane l + 8) and then go
// through the AVX2 path's tree, so here too the sum of an output does not
// depend on the tile or the thread that computed it (it differs from the AVX2
// path's in the last bits: the k order within the lanes is another).
#define RL_AVX512 __attribute__((target("avx512f,avx2,fma")))

RL_AVX512 inline __m256 fold(__m512 a) {
    // Through memory: once per output, and GCC 12's extract / shuffle
    // intrinsics trip its own -Wmaybe-uninitialized.
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, a);
    return _mm256_add_ps(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8));
}

template <int MR, int NR>
RL_AVX512 void tile512(const float *A, int64_t lda, const float *W, int64_t ldw, float *C,
                       int64_t ldc, int64_t K, __mmask16 tail) {
    __m512 acc[MR][NR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
    const int64_t body = K & ~int64_t{15};
    for (int64_t k = 0; k < body; k += 16) {
        __m512 a[MR];
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) a[i] = _mm512_loadu_ps(A + i * lda + k);
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) {
            const __m512 w = _mm512_loadu_ps(W + j * ldw + k);
#pragma GCC unroll 4
            for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_fmadd_ps(a[i], w, acc[i][j]);
        }
    }
    if (body < K) {
        // The last K % 16 columns: masked loads read nothing past the row.
        __m512 a[MR];
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) a[i] = _mm512_maskz_loadu_ps(tail, A + i * lda + body);
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) {
            const __m512 w = _mm512_maskz_loadu_ps(tail, W + j * ldw + body);
#pragma GCC unroll 4
            for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_fmadd_ps(a[i], w, acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
        __m256 r[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) r[j] = fold(acc[i][j]);
        const __m128 s = sum4(r[0], r[1], r[2], r[3]);
        if constexpr (NR == 4) {
            _mm_storeu_ps(C + i * ldc, s);
        } else {
            alignas(16) float out[4];
            _mm_store_ps(out, s);
            for (int j = 0; j < NR; ++j) C[i * ldc + j] = out[j];
        }
    }
}

template <int MR>
RL_AVX512 void row_block512(const float *A, int64_t lda, const float *W, int64_t ldw, float *C,
                            int64_t ldc, int64_t K, int64_t count, __mmask16 tail) {
    int64_t n = 0;
    for (; n + 4 <= count; n += 4) tile512<MR, 4>(A, lda, W + n * ldw, ldw, C + n, ldc, K, tail);
    switch (count - n) {
        case 3:
            tile512<MR, 3>(A, lda, W + n * ldw, ldw, C + n, ldc, K, tail);
            break;
        case 2:
            tile512<MR, 2>(A, lda, W + n * ldw, ldw, C + n, ldc, K, tail);
            break;
        case 1:
            tile512<MR, 1>(A, lda, W + n * ldw, ldw, C + n, ldc, K, tail);
            break;
        default:
            break;
    }
}

RL_AVX512 void multiply_avx512(const float *A, int64_t lda, const float *W, int64_t ldw, float *C,
                               int64_t ldc, int64_t M, int64_t K, int64_t n_begin, int64_t n_end) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (K & 15)) - 1u);
    const int64_t row_bytes = K * static_cast<int64_t>(sizeof(float));
    int64_t block = (kBlockBytes / row_bytes) & ~int64_t{3};
    block = block < 4 ? 4 : block > kMaxBlock ? kMaxBlock : block;
    alignas(64) float out[kMaxRows * kMaxBlock];
    for (int64_t n0 = n_begin; n0 < n_end; n0 += block) {
        const int64_t n1 = n0 + block < n_end ? n0 + block : n_end;
        const float *w = W + n0 * ldw;
        for (int64_t m = 0; m < M;) {
            const int64_t r = M - m >= 4 ? 4 : M - m;
            const float *a = A + m * lda;
            float *o = out + m * block;
            switch (r) {
                case 4:
                    row_block512<4>(a, lda, w, ldw, o, block, K, n1 - n0, tail);
                    break;
                case 3:
                    row_block512<3>(a, lda, w, ldw, o, block, K, n1 - n0, tail);
                    break;
                case 2:
                    row_block512<2>(a, lda, w, ldw, o, block, K, n1 - n0, tail);
                    break;
                default:
                    row_block512<1>(a, lda, w, ldw, o, block, K, n1 - n0, tail);
                    break;
            }
            m += r;
        }
        for (int64_t m = 0; m < M; ++m)
            std::memcpy(C + m * ldc + n0, out + m * block, sizeof(float) * (n1 - n0));
    }
}

} // namespace

bool available(Isa isa) {
    static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    static const bool avx512 = avx2 && __builtin_cpu_supports("avx512f");
    return isa == Isa::Avx512 ? avx512 : avx2;
}

Isa preferred() {
    static const Isa isa = [] {
        const char *v = std::getenv("RL_DECODE_GEMM");
        const bool avx2_asked = v != nullptr && std::strcmp(v, "avx2") == 0;
        return available(Isa::Avx512) && !avx2_asked ? Isa::Avx512 : Isa::Avx2;
    }();
    return isa;
}

void multiply(Isa isa, const float *A, int64_t lda, const float *W, int64_t ldw, float *C,
              int64_t ldc, int64_t M, int64_t K, int64_t n_begin, int64_t n_end) {
    if (K <= 0) {
        for (int64_t m = 0; m < M; ++m)
            std::memset(C + m * ldc + n_begin, 0, sizeof(float) * (n_end - n_begin));
        return;
    }
    if (isa == Isa::Avx512)
        multiply_avx512(A, lda, W, ldw, C, ldc, M, K, n_begin, n_end);
    else
        multiply_avx2(A, lda, W, ldw, C, ldc, M, K, n_begin, n_end);
}

#else

bool available(Isa) {
    return false;
}

Isa preferred() {
    return Isa::Avx2;
}

void multiply(Isa, const float *, int64_t, const float *, int64_t, float *, int64_t, int64_t,
              int64_t, int64_t, int64_t) {}

#endif

} // namespace rl::core::row_gemm
