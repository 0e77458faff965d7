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

// Rows are taken three at a time; four left over go as two pairs, so that no
// group but a lone row has fewer than two.
int group_rows(int64_t left) {
    if (left == 4) return 2;
    return left >= 3 ? 3 : static_cast<int>(left);
}

constexpr int64_t kBlockBytes = 24 * 1024; // the W rows of one block, at most
constexpr int64_t kMaxBlock = 64;          // outputs of a block, at most

// The AVX2 path: 8-lane accumulators in tiles of 3 x 4 (twelve accumulators,
// three A vectors and one W vector: the 16 vector registers, enough
// independent sums to keep both FMA units busy).
struct Avx2 {
    using Vec = __m256;
    using Tail = __m256i; // the lanes of the last K % 8 columns
    static constexpr int kLanes = 8;
    static constexpr int kMaxGroup = 3;
    RL_AVX2 static Vec zero() { return _mm256_setzero_ps(); }
    RL_AVX2 static Vec load(const float *p) { return _mm256_loadu_ps(p); }
    RL_AVX2 static Vec load_tail(const float *p, Tail t) { return _mm256_maskload_ps(p, t); }
    RL_AVX2 static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
    RL_AVX2 static __m256 fold(Vec a) { return a; }
    RL_AVX2 static Tail tail(int64_t K) {
        alignas(32) int32_t lanes[8];
        for (int l = 0; l < 8; ++l) lanes[l] = l < (K & 7) ? -1 : 0;
        return _mm256_load_si256(reinterpret_cast<const __m256i *>(lanes));
    }
    static int group(int64_t left) { return group_rows(left); }
};

// The AVX-512 path: the same blocking with 16-lane accumulators and tiles of
// 4 x 4 (sixteen accumulators, four A vectors, one W vector of the 32
// registers). Each output's 16 lanes are folded to 8 (lane l plus lane l + 8)
// and then go through the AVX2 path's tree, so here too the sum of an output
// does not depend on the tile or the thread that computed it (it differs from
// the AVX2 path's in the last bits: the k order within the lanes is another).
#define RL_AVX512 __attribute__((target("avx512f,avx2,fma")))

struct Avx512 {
    using Vec = __m512;
    using Tail = __mmask16; // the lanes of the last K % 16 columns
    static constexpr int kLanes = 16;
    static constexpr int kMaxGroup = 4;
    RL_AVX512 static Vec zero() { return _mm512_setzero_ps(); }
    RL_AVX512 static Vec load(const float *p) { return _mm512_loadu_ps(p); }
    RL_AVX512 static Vec load_tail(const float *p, Tail t) { return _mm512_maskz_loadu_ps(t, p); }
    RL_AVX512 static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
    RL_AVX512 static __m256 fold(Vec a) {
        // Through memory: once per output, and GCC 12's extract / shuffle
        // intrinsics trip its own -Wmaybe-uninitialized.
        alignas(64) float lanes[16];
        _mm512_store_ps(lanes, a);
        return _mm256_add_ps(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8));
    }
    static Tail tail(int64_t K) { return static_cast<__mmask16>((1u << (K & 15)) - 1u); }
    static int group(int64_t left) { return left >= 4 ? 4 : static_cast<int>(left); }
};

namespace avx2 {
using V = Avx2;
#define RL_ROW_GEMM_TARGET RL_AVX2
#include "row_gemm_paths.inc"
#undef RL_ROW_GEMM_TARGET
} // namespace avx2

namespace avx512 {
using V = Avx512;
#define RL_ROW_GEMM_TARGET RL_AVX512
#include "row_gemm_paths.inc"
#undef RL_ROW_GEMM_TARGET
} // namespace avx512

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
        avx512::multiply(A, lda, W, ldw, C, ldc, M, K, n_begin, n_end);
    else
        avx2::multiply(A, lda, W, ldw, C, ldc, M, K, n_begin, n_end);
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
