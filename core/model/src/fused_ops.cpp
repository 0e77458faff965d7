#include "fused_ops.hpp"

#include "rl/core/error.hpp"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#ifdef RL_FUSED_CUDA
#include "fused_kernels.hpp"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace rl::core::fused {
namespace {

// -1: not read yet; 0 off; 1 on.
std::atomic<int> g_enabled{-1};

} // namespace

bool compiled() {
#ifdef RL_FUSED_CUDA
    return true;
#else
    return false;
#endif
}

bool enabled() {
    int v = g_enabled.load(std::memory_order_relaxed);
    if (v < 0) {
        const char *env = std::getenv("RL_FUSED_KERNELS");
        v = env != nullptr && std::strcmp(env, "0") == 0 ? 0 : 1;
        g_enabled.store(v, std::memory_order_relaxed);
    }
    return v == 1;
}

void set_enabled(bool on) {
    g_enabled.store(on ? 1 : 0, std::memory_order_relaxed);
}

bool applies(const at::Tensor &x) {
    if (!compiled() || !x.defined() || !x.is_cuda() || !enabled()) return false;
    const auto t = x.scalar_type();
    return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

#ifdef RL_FUSED_CUDA
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

cuda::DType dtype_of(const at::Tensor &t, const char *what) {
    switch (t.scalar_type()) {
        case at::kFloat:
            return cuda::DType::Float32;
        case at::kHalf:
            return cuda::DType::Float16;
        case at::kBFloat16:
            return cuda::DType::BFloat16;
        default:
            throw Error(std::string("fused kernels: ") + what + " has dtype " +
                        std::string(c10::toString(t.scalar_type())) +
                        "; float32, float16 or bfloat16 expected");
    }
}

void check_cuda(const at::Tensor &t, const char *what) {
    check(t.defined() && t.is_cuda(),
          std::string("fused kernels: ") + what + " must be a CUDA tensor");
}

void check_launch(int code, const char *kernel) {
    if (code != 0)
        throw Error(std::string("fused kernels: launching ") + kernel +
                    " failed: " + cuda::error_string(code));
}

void *stream_of(const at::Tensor &t) {
    return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

const float *ptr_or_null(const at::Tensor &t) {
    return t.defined() ? t.data_ptr<float>() : nullptr;
}

struct SwigluFn : public torch::autograd::Function<SwigluFn> {
    static at::Tensor forward(AutogradContext *ctx, const at::Tensor &gate_in,
                              const at::Tensor &up_in) {
        check(gate_in.sizes() == up_in.sizes() && gate_in.scalar_type() == up_in.scalar_type(),
              "fused swiglu: gate and up must have the same shape and dtype");
        const c10::cuda::CUDAGuard guard(gate_in.device());
        at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
        at::Tensor out = at::empty_like(gate);
        check_launch(cuda::swiglu_forward(dtype_of(gate, "gate"), gate.data_ptr(), up.data_ptr(),
                                          out.data_ptr(), gate.numel(), stream_of(gate)),
                     "swiglu_forward");
        ctx->save_for_backward({gate, up});
        return out;
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        const auto saved = ctx->get_saved_variables();
        const at::Tensor &gate = saved[0], &up = saved[1];
        const c10::cuda::CUDAGuard guard(gate.device());
        at::Tensor dy = grads[0].to(gate.scalar_type()).contiguous();
        at::Tensor dgate = at::empty_like(gate), dup = at::empty_like(up);
        check_launch(cuda::swiglu_backward(dtype_of(gate, "gate"), dy.data_ptr(), gate.data_ptr(),
                                           up.data_ptr(), dgate.data_ptr(), dup.data_ptr(),
                                           gate.numel(), stream_of(gate)),
                     "swiglu_backward");
        return {dgate, dup};
    }
};

// dq, dk (backward) or the rotated q, k (forward) into new tensors.
variable_list run_rope(const at::Tensor &q, const at::Tensor &k, const at::Tensor &cos,
                       const at::Tensor &sin, bool backward) {
    at::Tensor yq = at::empty_like(q), yk = at::empty_like(k);
    check_launch(cuda::rope(dtype_of(q, "q"), q.data_ptr(), yq.data_ptr(), q.size(1), k.data_ptr(),
                            yk.data_ptr(), k.size(1), cos.data_ptr(), sin.data_ptr(), q.size(0),
                            q.size(2), backward, stream_of(q)),
                 backward ? "rope backward" : "rope");
    return {yq, yk};
}

struct RopeFn : public torch::autograd::Function<RopeFn> {
    static variable_list forward(AutogradContext *ctx, const at::Tensor &q, const at::Tensor &k,
                                 const at::Tensor &cos, const at::Tensor &sin) {
        const c10::cuda::CUDAGuard guard(q.device());
        at::Tensor c = cos.to(q.scalar_type()).contiguous();
        at::Tensor s = sin.to(q.scalar_type()).contiguous();
        ctx->save_for_backward({c, s});
        return run_rope(q.contiguous(), k.contiguous(), c, s, false);
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        const auto saved = ctx->get_saved_variables();
        const c10::cuda::CUDAGuard guard(saved[0].device());
        const auto t = saved[0].scalar_type();
        variable_list d = run_rope(grads[0].to(t).contiguous(), grads[1].to(t).contiguous(),
                                   saved[0], saved[1], true);
        return {d[0], d[1], at::Tensor(), at::Tensor()};
    }
};

struct NormRopeFn : public torch::autograd::Function<NormRopeFn> {
    static cuda::NormRopeArgs args(const at::Tensor &q, const at::Tensor &k, const at::Tensor &wq,
                                   const at::Tensor &wk, const at::Tensor &cos,
                                   const at::Tensor &sin, double eps) {
        cuda::NormRopeArgs a;
        a.q = q.data_ptr();
        a.k = k.data_ptr();
        a.q_weight = wq.data_ptr();
        a.k_weight = wk.data_ptr();
        a.q_heads = q.size(1);
        a.k_heads = k.size(1);
        a.tokens = q.size(0);
        a.dim = q.size(2);
        a.cos = cos.data_ptr();
        a.sin = sin.data_ptr();
        a.eps = static_cast<float>(eps);
        a.blocks = cuda::norm_rope_blocks(a.tokens * (a.q_heads + a.k_heads));
        return a;
    }

    static variable_list forward(AutogradContext *ctx, const at::Tensor &q_in,
                                 const at::Tensor &k_in, const at::Tensor &wq_in,
                                 const at::Tensor &wk_in, const at::Tensor &cos,
                                 const at::Tensor &sin, double eps) {
        const c10::cuda::CUDAGuard guard(q_in.device());
        const auto t = q_in.scalar_type();
        at::Tensor q = q_in.contiguous(), k = k_in.contiguous();
        at::Tensor wq = wq_in.contiguous(), wk = wk_in.contiguous();
        at::Tensor c = cos.to(t).contiguous(), s = sin.to(t).contiguous();
        at::Tensor yq = at::empty_like(q), yk = at::empty_like(k);
        cuda::NormRopeArgs a = args(q, k, wq, wk, c, s, eps);
        a.q_out = yq.data_ptr();
        a.k_out = yk.data_ptr();
        check_launch(cuda::norm_rope(dtype_of(q, "q"), a, stream_of(q)), "norm_rope");
        ctx->save_for_backward({q, k, wq, wk, c, s});
        ctx->saved_data["eps"] = eps;
        return {yq, yk};
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        const auto saved = ctx->get_saved_variables();
        const at::Tensor &q = saved[0], &k = saved[1], &wq = saved[2], &wk = saved[3];
        const c10::cuda::CUDAGuard guard(q.device());
        const auto t = q.scalar_type();
        at::Tensor dyq = grads[0].to(t).contiguous(), dyk = grads[1].to(t).contiguous();
        at::Tensor dq = at::empty_like(q), dk = at::empty_like(k);
        cuda::NormRopeArgs a =
            args(q, k, wq, wk, saved[4], saved[5], ctx->saved_data["eps"].toDouble());
        at::Tensor partial = at::empty({a.blocks, 2, a.dim}, q.options().dtype(at::kFloat));
        a.q_out = dq.data_ptr();
        a.k_out = dk.data_ptr();
        a.q_dy = dyq.data_ptr();
        a.k_dy = dyk.data_ptr();
        a.dw_partial = partial.data_ptr<float>();
        check_launch(cuda::norm_rope(dtype_of(q, "q"), a, stream_of(q)), "norm_rope backward");
        at::Tensor dw = partial.sum(0);
        return {dq,
                dk,
                dw[0].to(wq.scalar_type()),
                dw[1].to(wk.scalar_type()),
                at::Tensor(),
                at::Tensor(),
                at::Tensor()};
    }
};

void check_rows(const at::Tensor &t, int64_t n, const char *what) {
    if (!t.defined()) return;
    check_cuda(t, what);
    check(t.scalar_type() == at::kFloat && t.dim() == 1 && t.size(0) == n && t.is_contiguous(),
          std::string("fused logits: ") + what + " must be contiguous float32 [" +
              std::to_string(n) + "]");
}

void check_logits(const at::Tensor &z, const at::Tensor &labels) {
    check_cuda(z, "logits");
    check(z.scalar_type() == at::kFloat && z.dim() == 2 && z.is_contiguous(),
          "fused logits: logits must be contiguous float32 [tokens, vocab]");
    check_cuda(labels, "labels");
    check(labels.scalar_type() == at::kLong && labels.dim() == 1 && labels.size(0) == z.size(0) &&
              labels.is_contiguous(),
          "fused logits: labels must be contiguous int64 [tokens]");
}

} // namespace

at::Tensor swiglu(const at::Tensor &gate, const at::Tensor &up) {
    check_cuda(gate, "gate");
    check_cuda(up, "up");
    return SwigluFn::apply(gate, up);
}

std::pair<at::Tensor, at::Tensor> rope(const at::Tensor &q, const at::Tensor &k,
                                       const at::Tensor &cos, const at::Tensor &sin) {
    check_cuda(q, "q");
    check_cuda(k, "k");
    check(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2) &&
              q.size(2) % 2 == 0 && q.scalar_type() == k.scalar_type(),
          "fused rope: q and k must be [tokens, heads, head_dim] of one dtype with the same "
          "tokens and an even head_dim");
    check(cos.dim() == 2 && cos.size(0) == q.size(0) && cos.size(1) == q.size(2) &&
              sin.sizes() == cos.sizes(),
          "fused rope: cos and sin must be full-width tables [tokens, head_dim]");
    variable_list out = RopeFn::apply(q, k, cos, sin);
    return {out[0], out[1]};
}

bool norm_rope_applies(const at::Tensor &q, const at::Tensor &w) {
    return applies(q) && q.dim() == 3 && cuda::norm_rope_supports(q.size(2)) && w.defined() &&
           w.scalar_type() == q.scalar_type() && w.dim() == 1 && w.size(0) == q.size(2);
}

std::pair<at::Tensor, at::Tensor> qk_norm_rope(const at::Tensor &q, const at::Tensor &k,
                                               const at::Tensor &wq, const at::Tensor &wk,
                                               double eps, const at::Tensor &cos,
                                               const at::Tensor &sin) {
    check_cuda(q, "q");
    check_cuda(k, "k");
    check(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2) &&
              q.scalar_type() == k.scalar_type() && cuda::norm_rope_supports(q.size(2)),
          "fused norm + rope: q and k must be [tokens, heads, head_dim] of one dtype with the "
          "same tokens and a head_dim of 64, 128, 256 or 512");
    check(wq.dim() == 1 && wq.size(0) == q.size(2) && wk.sizes() == wq.sizes() &&
              wq.scalar_type() == q.scalar_type() && wk.scalar_type() == q.scalar_type(),
          "fused norm + rope: the norm weights must be [head_dim] in q's dtype");
    check(cos.dim() == 2 && cos.size(0) == q.size(0) && cos.size(1) == q.size(2) &&
              sin.sizes() == cos.sizes(),
          "fused norm + rope: cos and sin must be full-width tables [tokens, head_dim]");
    variable_list out = NormRopeFn::apply(q, k, wq, wk, cos, sin, eps);
    return {out[0], out[1]};
}

void logit_stats(const at::Tensor &z, const at::Tensor &labels, int64_t ignore_index,
                 double inv_temp, const at::Tensor &lse, const at::Tensor &logprob,
                 const at::Tensor &entropy, const at::Tensor &lse_raw) {
    check_logits(z, labels);
    const int64_t n = z.size(0);
    check(lse.defined() && logprob.defined(), "fused logits: lse and logprob are required");
    check_rows(lse, n, "lse");
    check_rows(logprob, n, "logprob");
    check_rows(entropy, n, "entropy");
    check_rows(lse_raw, n, "lse_raw");
    const c10::cuda::CUDAGuard guard(z.device());
    cuda::LogitStatsArgs a;
    a.z = z.data_ptr<float>();
    a.rows = n;
    a.vocab = z.size(1);
    a.labels = labels.data_ptr<int64_t>();
    a.ignore_index = ignore_index;
    a.inv_temp = static_cast<float>(inv_temp);
    a.lse = lse.data_ptr<float>();
    a.logprob = logprob.data_ptr<float>();
    a.entropy = entropy.defined() ? entropy.data_ptr<float>() : nullptr;
    a.lse_raw = lse_raw.defined() ? lse_raw.data_ptr<float>() : nullptr;
    check_launch(cuda::logit_stats(a, stream_of(z)), "logit_stats");
}

void logit_grad(const at::Tensor &z, const at::Tensor &labels, const at::Tensor &lse,
                const at::Tensor &g_logprob, const at::Tensor &g_entropy, const at::Tensor &entropy,
                const at::Tensor &g_lse_raw, const at::Tensor &lse_raw, double inv_temp,
                const at::Tensor &dz) {
    check_logits(z, labels);
    const int64_t n = z.size(0);
    check_rows(lse, n, "lse");
    check_rows(g_logprob, n, "g_logprob");
    check_rows(g_entropy, n, "g_entropy");
    check_rows(g_lse_raw, n, "g_lse_raw");
    check(!g_entropy.defined() || entropy.defined(), "fused logits: g_entropy needs entropy");
    check(!g_lse_raw.defined() || lse_raw.defined(), "fused logits: g_lse_raw needs lse_raw");
    check_rows(entropy, n, "entropy");
    check_rows(lse_raw, n, "lse_raw");
    check_cuda(dz, "dz");
    check(dz.dim() == 2 && dz.size(0) == n && dz.size(1) == z.size(1) && dz.stride(1) == 1,
          "fused logits: dz must be [tokens, vocab] with contiguous rows");
    const c10::cuda::CUDAGuard guard(z.device());
    cuda::LogitGradArgs a;
    a.z = z.data_ptr<float>();
    a.rows = n;
    a.vocab = z.size(1);
    a.labels = labels.data_ptr<int64_t>();
    a.lse = lse.data_ptr<float>();
    a.g_logprob = ptr_or_null(g_logprob);
    a.g_entropy = ptr_or_null(g_entropy);
    a.entropy = ptr_or_null(entropy);
    a.g_lse_raw = ptr_or_null(g_lse_raw);
    a.lse_raw = ptr_or_null(lse_raw);
    a.inv_temp = static_cast<float>(inv_temp);
    a.dz = dz.data_ptr();
    a.dz_stride = dz.stride(0);
    check_launch(cuda::logit_grad(dtype_of(dz, "dz"), a, stream_of(z)), "logit_grad");
}

#else

namespace {
[[noreturn]] void not_compiled() {
    throw Error("fused kernels: this build has no CUDA kernels (nvcc was not found when it was "
                "configured)");
}
} // namespace

at::Tensor swiglu(const at::Tensor &, const at::Tensor &) {
    not_compiled();
}
std::pair<at::Tensor, at::Tensor> rope(const at::Tensor &, const at::Tensor &, const at::Tensor &,
                                       const at::Tensor &) {
    not_compiled();
}
bool norm_rope_applies(const at::Tensor &, const at::Tensor &) {
    return false;
}
std::pair<at::Tensor, at::Tensor> qk_norm_rope(const at::Tensor &, const at::Tensor &,
                                               const at::Tensor &, const at::Tensor &, double,
                                               const at::Tensor &, const at::Tensor &) {
    not_compiled();
}
void logit_stats(const at::Tensor &, const at::Tensor &, int64_t, double, const at::Tensor &,
                 const at::Tensor &, const at::Tensor &, const at::Tensor &) {
    not_compiled();
}
void logit_grad(const at::Tensor &, const at::Tensor &, const at::Tensor &, const at::Tensor &,
                const at::Tensor &, const at::Tensor &, const at::Tensor &, const at::Tensor &,
                double, const at::Tensor &) {
    not_compiled();
}

#endif

} // namespace rl::core::fused
