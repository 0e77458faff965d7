// Fused CUDA kernels of the model core (fused_kernels.hpp says what each
// computes). Plain CUDA C++: no libtorch header, so nvcc compiles this file in
// seconds; fused_ops.cpp hands it raw pointers and the current stream.
#include "../fused_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace rl::core::cuda {
namespace {

// -- element types -----------------------------------------------------------

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) {
    return v;
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
    return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

// Round to nearest even, as libtorch's casts do.
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
    return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
    return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

// Eight elements of T moved as 16 B (or two 16 B moves for float).
template <typename T>
struct alignas(16) Pack {
    static constexpr int kCount = 8;
    T v[kCount];
};

template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T *p) {
    Pack<T> out;
    if constexpr (sizeof(T) == 2) {
        *reinterpret_cast<uint4 *>(&out) = *reinterpret_cast<const uint4 *>(p);
    } else {
        reinterpret_cast<uint4 *>(&out)[0] = reinterpret_cast<const uint4 *>(p)[0];
        reinterpret_cast<uint4 *>(&out)[1] = reinterpret_cast<const uint4 *>(p)[1];
    }
    return out;
}

template <typename T>
__device__ __forceinline__ void store_pack(T *p, const Pack<T> &v) {
    if constexpr (sizeof(T) == 2) {
        *reinterpret_cast<uint4 *>(p) = *reinterpret_cast<const uint4 *>(&v);
    } else {
        reinterpret_cast<uint4 *>(p)[0] = reinterpret_cast<const uint4 *>(&v)[0];
        reinterpret_cast<uint4 *>(p)[1] = reinterpret_cast<const uint4 *>(&v)[1];
    }
}

bool aligned16(const void *p) {
    return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

constexpr int kThreads = 256;

// Enough blocks of kThreads to cover `work` items, at most a few waves.
unsigned grid_for(int64_t work) {
    const int64_t blocks = (work + kThreads - 1) / kThreads;
    return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

// -- SwiGLU -------------------------------------------------------------------

__device__ __forceinline__ float sigmoid(float a) {
    return 1.0f / (1.0f + expf(-a));
}

template <typename T>
__global__ void swiglu_forward_kernel(const T *gate, const T *up, T *out, int64_t n, bool packed) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (packed) {
        constexpr int K = Pack<T>::kCount;
        for (int64_t i = first; i < n / K; i += stride) {
            const Pack<T> g = load_pack(gate + i * K), u = load_pack(up + i * K);
            Pack<T> o;
#pragma unroll
            for (int j = 0; j < K; ++j) {
                const float a = to_float(g.v[j]);
                o.v[j] = from_float<T>(a * sigmoid(a) * to_float(u.v[j]));
            }
            store_pack(out + i * K, o);
        }
        return;
    }
    for (int64_t i = first; i < n; i += stride) {
        const float a = to_float(gate[i]);
        out[i] = from_float<T>(a * sigmoid(a) * to_float(up[i]));
    }
}

// d gate = dy u s (1 + a (1 - s)), d up = dy a s, with s = sigmoid(a).
template <typename T>
__global__ void swiglu_backward_kernel(const T *dy, const T *gate, const T *up, T *dgate, T *dup,
                                       int64_t n, bool packed) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (packed) {
        constexpr int K = Pack<T>::kCount;
        for (int64_t i = first; i < n / K; i += stride) {
            const Pack<T> d = load_pack(dy + i * K), g = load_pack(gate + i * K),
                          u = load_pack(up + i * K);
            Pack<T> dg, du;
#pragma unroll
            for (int j = 0; j < K; ++j) {
                const float a = to_float(g.v[j]), b = to_float(u.v[j]), e = to_float(d.v[j]);
                const float s = sigmoid(a);
                du.v[j] = from_float<T>(e * a * s);
                dg.v[j] = from_float<T>(e * b * s * (1.0f + a * (1.0f - s)));
            }
            store_pack(dgate + i * K, dg);
            store_pack(dup + i * K, du);
        }
        return;
    }
    for (int64_t i = first; i < n; i += stride) {
        const float a = to_float(gate[i]), b = to_float(up[i]), e = to_float(dy[i]);
        const float s = sigmoid(a);
        dup[i] = from_float<T>(e * a * s);
        dgate[i] = from_float<T>(e * b * s * (1.0f + a * (1.0f - s)));
    }
}

template <typename T>
cudaError_t launch_swiglu_forward(const void *gate, const void *up, void *out, int64_t n,
                                  cudaStream_t stream) {
    const bool packed = aligned16(gate) && aligned16(up) && aligned16(out) && n % 8 == 0;
    swiglu_forward_kernel<T><<<grid_for(packed ? n / 8 : n), kThreads, 0, stream>>>(
        static_cast<const T *>(gate), static_cast<const T *>(up), static_cast<T *>(out), n, packed);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launch_swiglu_backward(const void *dy, const void *gate, const void *up, void *dgate,
                                   void *dup, int64_t n, cudaStream_t stream) {
    const bool packed = aligned16(dy) && aligned16(gate) && aligned16(up) && aligned16(dgate) &&
                        aligned16(dup) && n % 8 == 0;
    swiglu_backward_kernel<T><<<grid_for(packed ? n / 8 : n), kThreads, 0, stream>>>(
        static_cast<const T *>(dy), static_cast<const T *>(gate), static_cast<const T *>(up),
        static_cast<T *>(dgate), static_cast<T *>(dup), n, packed);
    return cudaGetLastError();
}

// -- RoPE ---------------------------------------------------------------------

// x [tokens, heads, dim], tables [tokens, dim]. Each work item takes V
// consecutive dims d of the first half of one head and their partners d + h
// (h = dim / 2), a at d and b at d + h:
//   forward:  y_a = a cos_d + b sin_d,      y_b = b cos_(d+h) + a sin_(d+h)
//   backward: dx_a = a cos_d + b sin_(d+h), dx_b = b cos_(d+h) + a sin_d
// (with the full-width tables, sin = [-s | s], this is the rotation and its
// transpose). The items of the second tensor (k) follow those of the first.
template <typename T, int V>
struct Lanes {
    T v[V];
};

template <typename T, int V>
__device__ __forceinline__ Lanes<T, V> load_lanes(const T *p) {
    Lanes<T, V> out;
    if constexpr (V == Pack<T>::kCount) {
        const Pack<T> pk = load_pack(p);
#pragma unroll
        for (int i = 0; i < V; ++i) out.v[i] = pk.v[i];
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) out.v[i] = p[i];
    }
    return out;
}

template <typename T, int V>
__device__ __forceinline__ void store_lanes(T *p, const Lanes<T, V> &v) {
    if constexpr (V == Pack<T>::kCount) {
        Pack<T> pk;
#pragma unroll
        for (int i = 0; i < V; ++i) pk.v[i] = v.v[i];
        store_pack(p, pk);
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) p[i] = v.v[i];
    }
}

struct RopeTensor {
    const void *x;
    void *y;
    int64_t heads;
};

template <typename T, int V, typename Index>
__global__ void rope_kernel(RopeTensor first, RopeTensor second, Index first_items, Index all_items,
                            const T *cos, const T *sin, int dim, bool backward) {
    const Index per_row = static_cast<Index>(dim / 2 / V);
    const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
    for (Index item = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; item < all_items;
         item += stride) {
        const bool in_first = item < first_items;
        const RopeTensor &t = in_first ? first : second;
        const Index local = in_first ? item : item - first_items;
        const Index row = local / per_row;
        const int d = static_cast<int>(local - row * per_row) * V;
        const Index token = row / static_cast<Index>(t.heads);
        const int h = dim / 2;
        const T *x = static_cast<const T *>(t.x) + static_cast<int64_t>(row) * dim;
        T *y = static_cast<T *>(t.y) + static_cast<int64_t>(row) * dim;
        const T *c = cos + static_cast<int64_t>(token) * dim;
        const T *sn = sin + static_cast<int64_t>(token) * dim;
        const Lanes<T, V> a = load_lanes<T, V>(x + d), b = load_lanes<T, V>(x + d + h);
        const Lanes<T, V> ca = load_lanes<T, V>(c + d), cb = load_lanes<T, V>(c + d + h);
        const Lanes<T, V> s0 = load_lanes<T, V>(sn + d), s1 = load_lanes<T, V>(sn + d + h);
        Lanes<T, V> ya, yb;
#pragma unroll
        for (int i = 0; i < V; ++i) {
            const float fa = to_float(a.v[i]), fb = to_float(b.v[i]);
            const float sa = to_float(backward ? s1.v[i] : s0.v[i]);
            const float sb = to_float(backward ? s0.v[i] : s1.v[i]);
            ya.v[i] = from_float<T>(fa * to_float(ca.v[i]) + fb * sa);
            yb.v[i] = from_float<T>(fb * to_float(cb.v[i]) + fa * sb);
        }
        store_lanes<T, V>(y + d, ya);
        store_lanes<T, V>(y + d + h, yb);
    }
}

template <typename T, int V, typename Index>
void launch_rope_as(RopeTensor q, RopeTensor k, const void *cos, const void *sin, int64_t tokens,
                    int64_t dim, bool backward, cudaStream_t stream) {
    const int64_t per_row = dim / 2 / V;
    const int64_t first = tokens * q.heads * per_row;
    const int64_t all = first + (k.x != nullptr ? tokens * k.heads * per_row : 0);
    rope_kernel<T, V, Index><<<grid_for(all), kThreads, 0, stream>>>(
        q, k, static_cast<Index>(first), static_cast<Index>(all), static_cast<const T *>(cos),
        static_cast<const T *>(sin), static_cast<int>(dim), backward);
}

template <typename T>
cudaError_t launch_rope(RopeTensor q, RopeTensor k, const void *cos, const void *sin,
                        int64_t tokens, int64_t dim, bool backward, cudaStream_t stream) {
    constexpr int K = Pack<T>::kCount;
    const bool packed = (dim / 2) % K == 0 && aligned16(q.x) && aligned16(q.y) && aligned16(cos) &&
                        aligned16(sin) && (k.x == nullptr || (aligned16(k.x) && aligned16(k.y)));
    const int64_t elements = tokens * (q.heads + (k.x != nullptr ? k.heads : 0)) * dim;
    const bool narrow = elements < (int64_t{1} << 31);
    if (packed && narrow)
        launch_rope_as<T, K, uint32_t>(q, k, cos, sin, tokens, dim, backward, stream);
    else if (packed)
        launch_rope_as<T, K, int64_t>(q, k, cos, sin, tokens, dim, backward, stream);
    else if (narrow)
        launch_rope_as<T, 1, uint32_t>(q, k, cos, sin, tokens, dim, backward, stream);
    else
        launch_rope_as<T, 1, int64_t>(q, k, cos, sin, tokens, dim, backward, stream);
    return cudaGetLastError();
}

// -- RMSNorm of each head, then RoPE (Qwen3's q_norm / k_norm) ---------------

// One warp per row of dim values (a head of one token). Lane l holds P values
// of the first half from l * P on (a) and their partners in the second half
// (b). The normalized value is rounded to T before the rotation, as the
// unfused norm then rotation do.
struct NormRopeTensor {
    const void *x;
    void *y; // forward: output; backward: d x
    const void *w;
    const void *dy; // backward only
    int64_t heads;
};

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

template <typename T>
__device__ __forceinline__ float round_to(float v) {
    return to_float(from_float<T>(v));
}

constexpr int kNormRopeWarps = kThreads / 32;

template <typename T, int P>
__global__ void norm_rope_kernel(NormRopeTensor first, NormRopeTensor second, int64_t first_rows,
                                 int64_t all_rows, const T *cos, const T *sin, int dim, float eps,
                                 float *dw_partial) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int h = dim / 2;
    const bool backward = dw_partial != nullptr;
    float dw_a[2][P] = {}, dw_b[2][P] = {}; // per tensor (q, k), backward only
    const int64_t warps = static_cast<int64_t>(gridDim.x) * kNormRopeWarps;
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * kNormRopeWarps + warp; r < all_rows;
         r += warps) {
        const int which = r < first_rows ? 0 : 1;
        // Field by field: selecting a whole parameter struct by reference
        // puts both in local memory.
        const int64_t heads = which == 0 ? first.heads : second.heads;
        const int64_t row = which == 0 ? r : r - first_rows;
        const int64_t token = row / heads;
        const int d = lane * P;
        const T *x = static_cast<const T *>(which == 0 ? first.x : second.x) + row * dim;
        const T *w = static_cast<const T *>(which == 0 ? first.w : second.w);
        const T *c = cos + token * dim;
        const T *sn = sin + token * dim;
        float a[P], b[P], ss = 0.0f;
#pragma unroll
        for (int i = 0; i < P; ++i) {
            a[i] = to_float(x[d + i]);
            b[i] = to_float(x[d + h + i]);
            ss += a[i] * a[i] + b[i] * b[i];
        }
        const float rstd = rsqrtf(warp_sum(ss) / static_cast<float>(dim) + eps);
        T *y = static_cast<T *>(which == 0 ? first.y : second.y) + row * dim;
        if (!backward) {
#pragma unroll
            for (int i = 0; i < P; ++i) {
                const float na = round_to<T>(a[i] * rstd * to_float(w[d + i]));
                const float nb = round_to<T>(b[i] * rstd * to_float(w[d + h + i]));
                y[d + i] = from_float<T>(na * to_float(c[d + i]) + nb * to_float(sn[d + i]));
                y[d + h + i] =
                    from_float<T>(nb * to_float(c[d + h + i]) + na * to_float(sn[d + h + i]));
            }
            continue;
        }
        // d normalized = RoPE transpose of dy (rounded to T as the unfused
        // rotation's backward is), then the RMSNorm backward.
        const T *dy = static_cast<const T *>(which == 0 ? first.dy : second.dy) + row * dim;
        float ga[P], gb[P], dot = 0.0f;
#pragma unroll
        for (int i = 0; i < P; ++i) {
            const float ya = to_float(dy[d + i]), yb = to_float(dy[d + h + i]);
            ga[i] = round_to<T>(ya * to_float(c[d + i]) + yb * to_float(sn[d + h + i]));
            gb[i] = round_to<T>(yb * to_float(c[d + h + i]) + ya * to_float(sn[d + i]));
            dot += ga[i] * to_float(w[d + i]) * a[i] * rstd +
                   gb[i] * to_float(w[d + h + i]) * b[i] * rstd;
        }
        const float mean = warp_sum(dot) / static_cast<float>(dim);
#pragma unroll
        for (int i = 0; i < P; ++i) {
            const float xa = a[i] * rstd, xb = b[i] * rstd;
            y[d + i] = from_float<T>(rstd * (ga[i] * to_float(w[d + i]) - xa * mean));
            y[d + h + i] = from_float<T>(rstd * (gb[i] * to_float(w[d + h + i]) - xb * mean));
            // Static indices keep the sums in registers.
            if (which == 0) {
                dw_a[0][i] += ga[i] * xa;
                dw_b[0][i] += gb[i] * xb;
            } else {
                dw_a[1][i] += ga[i] * xa;
                dw_b[1][i] += gb[i] * xb;
            }
        }
    }
    if (!backward) return;
    // d weight: the block's warps summed in shared memory, one row of
    // partial sums per block (summed over blocks by the caller).
    __shared__ float part[kNormRopeWarps][2][512];
#pragma unroll
    for (int which = 0; which < 2; ++which) {
#pragma unroll
        for (int i = 0; i < P; ++i) {
            part[warp][which][lane * P + i] = dw_a[which][i];
            part[warp][which][h + lane * P + i] = dw_b[which][i];
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < 2 * dim; j += blockDim.x) {
        const int which = j / dim, e = j % dim;
        float sum = 0.0f;
        for (int v = 0; v < kNormRopeWarps; ++v) sum += part[v][which][e];
        dw_partial[(static_cast<int64_t>(blockIdx.x) * 2 + which) * dim + e] = sum;
    }
}

template <typename T, int P>
void launch_norm_rope_as(const NormRopeArgs &a, cudaStream_t stream) {
    const NormRopeTensor q{a.q, a.q_out, a.q_weight, a.q_dy, a.q_heads};
    const NormRopeTensor k{a.k, a.k_out, a.k_weight, a.k_dy, a.k_heads};
    const int64_t first = a.tokens * a.q_heads, all = first + a.tokens * a.k_heads;
    norm_rope_kernel<T, P><<<static_cast<unsigned>(a.blocks), kThreads, 0, stream>>>(
        q, k, first, all, static_cast<const T *>(a.cos), static_cast<const T *>(a.sin),
        static_cast<int>(a.dim), a.eps, a.dw_partial);
}

template <typename T>
cudaError_t launch_norm_rope(const NormRopeArgs &a, cudaStream_t stream) {
    switch (a.dim / 64) {
        case 1:
            launch_norm_rope_as<T, 1>(a, stream);
            break;
        case 2:
            launch_norm_rope_as<T, 2>(a, stream);
            break;
        case 4:
            launch_norm_rope_as<T, 4>(a, stream);
            break;
        case 8:
            launch_norm_rope_as<T, 8>(a, stream);
            break;
        default:
            return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

// -- log-softmax statistics over the vocabulary --------------------------------

// Running log-sum-exp of a stream of values: m the largest seen, s = sum
// exp(z - m) and t = sum exp(z - m) z (for the entropy). -inf adds nothing.
struct Lse {
    float m = -INFINITY, s = 0.0f, t = 0.0f;

    __device__ __forceinline__ void add(float z) {
        if (z == -INFINITY) return;
        if (z > m) {
            const float r = expf(m - z); // 0 for the first value
            s = s * r + 1.0f;
            t = t * r + z;
            m = z;
        } else {
            const float e = expf(z - m);
            s += e;
            t += e * z;
        }
    }

    __device__ __forceinline__ void merge(const Lse &o) {
        if (o.m == -INFINITY) return;
        if (m == -INFINITY) {
            *this = o;
            return;
        }
        const float mm = fmaxf(m, o.m);
        const float a = expf(m - mm), b = expf(o.m - mm);
        s = s * a + o.s * b;
        t = t * a + o.t * b;
        m = mm;
    }
};

__device__ __forceinline__ Lse shuffle_down(const Lse &v, int offset) {
    Lse o;
    o.m = __shfl_down_sync(0xffffffffu, v.m, offset);
    o.s = __shfl_down_sync(0xffffffffu, v.s, offset);
    o.t = __shfl_down_sync(0xffffffffu, v.t, offset);
    return o;
}

// The merge of every thread's value of the block, valid in thread 0.
__device__ Lse block_merge(Lse v) {
    __shared__ Lse partial[kThreads / 32];
    for (int offset = 16; offset > 0; offset /= 2) v.merge(shuffle_down(v, offset));
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < kThreads / 32 ? partial[lane] : Lse{};
        for (int offset = 16; offset > 0; offset /= 2) v.merge(shuffle_down(v, offset));
    }
    __syncthreads(); // partial is reused by the next call
    return v;
}

// One block per row of z [rows, vocab] (float32, already divided by the
// temperature): one read of the row.
__global__ void logit_stats_kernel(const float *z, int64_t vocab, const int64_t *labels,
                                   int64_t ignore_index, float inv_temp, float *lse, float *logprob,
                                   float *entropy, float *lse_raw, bool packed) {
    const int64_t row = blockIdx.x;
    const float *zr = z + row * vocab;
    const bool raw = lse_raw != nullptr && inv_temp != 1.0f;
    const float temp = 1.0f / inv_temp;
    Lse a, b; // b: of the raw logits z / inv_temp
    if (packed) {
        const float4 *z4 = reinterpret_cast<const float4 *>(zr);
        for (int64_t j = threadIdx.x; j < vocab / 4; j += blockDim.x) {
            const float4 v = z4[j];
            a.add(v.x);
            a.add(v.y);
            a.add(v.z);
            a.add(v.w);
            if (raw) {
                b.add(v.x * temp);
                b.add(v.y * temp);
                b.add(v.z * temp);
                b.add(v.w * temp);
            }
        }
    } else {
        for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
            a.add(zr[j]);
            if (raw) b.add(zr[j] * temp);
        }
    }
    a = block_merge(a);
    if (raw) b = block_merge(b);
    if (threadIdx.x != 0) return;
    const float l = a.m + logf(a.s);
    lse[row] = l;
    const int64_t label = labels[row];
    logprob[row] = label == ignore_index ? 0.0f : zr[label] - l;
    if (entropy != nullptr) entropy[row] = l - a.t / a.s; // lse - sum p z
    if (lse_raw != nullptr) lse_raw[row] = raw ? b.m + logf(b.s) : l;
}

// d loss / d z of one row (see fused_kernels.hpp), written in T.
template <typename T>
__global__ void logit_grad_kernel(const float *z, int64_t vocab, const int64_t *labels,
                                  const float *lse, const float *g_logprob, const float *g_entropy,
                                  const float *entropy, const float *g_lse_raw,
                                  const float *lse_raw, float inv_temp, T *dz, int64_t dz_stride,
                                  bool packed) {
    const int64_t row = blockIdx.x;
    const float *zr = z + row * vocab;
    T *out = dz + row * dz_stride;
    const int64_t label = labels[row];
    const float l = lse[row];
    const float gl = g_logprob != nullptr ? g_logprob[row] : 0.0f;
    const float ge = g_entropy != nullptr ? g_entropy[row] : 0.0f;
    const float h = g_entropy != nullptr ? entropy[row] : 0.0f;
    const float gs = g_lse_raw != nullptr ? g_lse_raw[row] : 0.0f;
    const float lr = g_lse_raw != nullptr ? lse_raw[row] : 0.0f;
    const float temp = 1.0f / inv_temp;
    auto grad = [&](float zj, int64_t j) {
        const float logp = zj - l;
        const float p = expf(logp);
        float d = g_logprob != nullptr ? -gl * p + (j == label ? gl : 0.0f) : 0.0f;
        if (g_entropy != nullptr) d -= ge * p * (logp + h);
        if (inv_temp != 1.0f) d *= inv_temp;
        if (g_lse_raw != nullptr) d += gs * (inv_temp == 1.0f ? p : expf(zj * temp - lr));
        return d;
    };
    if (packed) {
        constexpr int K = Pack<T>::kCount;
        const float4 *z4 = reinterpret_cast<const float4 *>(zr);
        for (int64_t j = threadIdx.x; j < vocab / K; j += blockDim.x) {
            Pack<T> o;
#pragma unroll
            for (int q = 0; q < K / 4; ++q) {
                const float4 v = z4[j * (K / 4) + q];
                const int64_t c = j * K + q * 4;
                o.v[q * 4 + 0] = from_float<T>(grad(v.x, c + 0));
                o.v[q * 4 + 1] = from_float<T>(grad(v.y, c + 1));
                o.v[q * 4 + 2] = from_float<T>(grad(v.z, c + 2));
                o.v[q * 4 + 3] = from_float<T>(grad(v.w, c + 3));
            }
            store_pack(out + j * K, o);
        }
        return;
    }
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
        out[j] = from_float<T>(grad(zr[j], j));
}

template <typename T>
cudaError_t launch_logit_grad(const LogitGradArgs &a, cudaStream_t stream) {
    const bool packed =
        aligned16(a.z) && aligned16(a.dz) && a.vocab % 8 == 0 && a.dz_stride % 8 == 0;
    logit_grad_kernel<T><<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(
        a.z, a.vocab, a.labels, a.lse, a.g_logprob, a.g_entropy, a.entropy, a.g_lse_raw, a.lse_raw,
        a.inv_temp, static_cast<T *>(a.dz), a.dz_stride, packed);
    return cudaGetLastError();
}

} // namespace

int swiglu_forward(DType t, const void *gate, const void *up, void *out, int64_t n, void *stream) {
    if (n == 0) return 0;
    auto s = static_cast<cudaStream_t>(stream);
    switch (t) {
        case DType::Float32:
            return launch_swiglu_forward<float>(gate, up, out, n, s);
        case DType::Float16:
            return launch_swiglu_forward<__half>(gate, up, out, n, s);
        case DType::BFloat16:
            return launch_swiglu_forward<__nv_bfloat16>(gate, up, out, n, s);
    }
    return static_cast<int>(cudaErrorInvalidValue);
}

int swiglu_backward(DType t, const void *dy, const void *gate, const void *up, void *dgate,
                    void *dup, int64_t n, void *stream) {
    if (n == 0) return 0;
    auto s = static_cast<cudaStream_t>(stream);
    switch (t) {
        case DType::Float32:
            return launch_swiglu_backward<float>(dy, gate, up, dgate, dup, n, s);
        case DType::Float16:
            return launch_swiglu_backward<__half>(dy, gate, up, dgate, dup, n, s);
        case DType::BFloat16:
            return launch_swiglu_backward<__nv_bfloat16>(dy, gate, up, dgate, dup, n, s);
    }
    return static_cast<int>(cudaErrorInvalidValue);
}

int rope(DType t, const void *q, void *q_out, int64_t q_heads, const void *k, void *k_out,
         int64_t k_heads, const void *cos, const void *sin, int64_t tokens, int64_t dim,
         bool backward, void *stream) {
    if (tokens * dim == 0 || (q_heads == 0 && (k == nullptr || k_heads == 0))) return 0;
    const RopeTensor first{q, q_out, q_heads};
    const RopeTensor second{k, k_out, k != nullptr ? k_heads : 0};
    auto s = static_cast<cudaStream_t>(stream);
    switch (t) {
        case DType::Float32:
            return launch_rope<float>(first, second, cos, sin, tokens, dim, backward, s);
        case DType::Float16:
            return launch_rope<__half>(first, second, cos, sin, tokens, dim, backward, s);
        case DType::BFloat16:
            return launch_rope<__nv_bfloat16>(first, second, cos, sin, tokens, dim, backward, s);
    }
    return static_cast<int>(cudaErrorInvalidValue);
}

int logit_stats(const LogitStatsArgs &a, void *stream) {
    if (a.rows == 0) return 0;
    const bool packed = aligned16(a.z) && a.vocab % 4 == 0;
    logit_stats_kernel<<<static_cast<unsigned>(a.rows), kThreads, 0,
                         static_cast<cudaStream_t>(stream)>>>(
        a.z, a.vocab, a.labels, a.ignore_index, a.inv_temp, a.lse, a.logprob, a.entropy, a.lse_raw,
        packed);
    return cudaGetLastError();
}

int logit_grad(DType t, const LogitGradArgs &a, void *stream) {
    if (a.rows == 0) return 0;
    auto s = static_cast<cudaStream_t>(stream);
    switch (t) {
        case DType::Float32:
            return launch_logit_grad<float>(a, s);
        case DType::Float16:
            return launch_logit_grad<__half>(a, s);
        case DType::BFloat16:
            return launch_logit_grad<__nv_bfloat16>(a, s);
    }
    return static_cast<int>(cudaErrorInvalidValue);
}

bool norm_rope_supports(int64_t dim) {
    return dim == 64 || dim == 128 || dim == 256 || dim == 512;
}

int64_t norm_rope_blocks(int64_t rows) {
    const int64_t blocks = (rows + kNormRopeWarps - 1) / kNormRopeWarps;
    return blocks < 1 ? 1 : (blocks > 2048 ? 2048 : blocks);
}

int norm_rope(DType t, const NormRopeArgs &a, void *stream) {
    if (!norm_rope_supports(a.dim)) return static_cast<int>(cudaErrorInvalidValue);
    if (a.tokens * (a.q_heads + a.k_heads) == 0) return 0;
    auto s = static_cast<cudaStream_t>(stream);
    switch (t) {
        case DType::Float32:
            return launch_norm_rope<float>(a, s);
        case DType::Float16:
            return launch_norm_rope<__half>(a, s);
        case DType::BFloat16:
            return launch_norm_rope<__nv_bfloat16>(a, s);
    }
    return static_cast<int>(cudaErrorInvalidValue);
}

const char *error_string(int code) {
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}

} // namespace rl::core::cuda
