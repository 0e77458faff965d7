#include "decode_linear.hpp"

#include "row_gemm.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace rl::core {
namespace {

bool row_kernel_enabled() {
    static const bool on = [] {
        const char *v = std::getenv("RL_DECODE_GEMM");
        return row_gemm::available() && (v == nullptr || std::strcmp(v, "blas") != 0);
    }();
    return on;
}

// Below this many multiply-adds a call runs on the calling thread alone: waking
// a helper costs more than it saves.
constexpr int64_t kParallelMacs = int64_t{1} << 20;

// Runs body(chunk) for every chunk in [0, chunks) on the calling thread and up
// to helpers threads of libtorch's inter-op pool (at::launch). Chunks are
// claimed from a shared counter, so the caller never waits for a helper to
// start: a helper that starts late finds nothing left and returns. The caller
// returns once every claimed chunk is done; a helper touches body only after
// a successful claim, which can only happen before the caller's last claim.
void run_chunks(int64_t chunks, int helpers, const std::function<void(int64_t)> &body) {
    if (helpers <= 0) {
        for (int64_t c = 0; c < chunks; ++c) body(c);
        return;
    }
    struct Shared {
        std::atomic<int64_t> next{0};
        std::atomic<int> active{0};
        const std::function<void(int64_t)> *body = nullptr;
        int64_t chunks = 0;
    };
    auto shared = std::make_shared<Shared>();
    shared->body = &body;
    shared->chunks = chunks;
    for (int h = 0; h < helpers; ++h) {
        at::launch([shared] {
            shared->active.fetch_add(1);
            for (int64_t c; (c = shared->next.fetch_add(1)) < shared->chunks;) (*shared->body)(c);
            shared->active.fetch_sub(1);
        });
    }
    for (int64_t c; (c = shared->next.fetch_add(1)) < chunks;) body(c);
    while (shared->active.load() != 0) std::this_thread::yield();
}

} // namespace

bool decode_linear_applies(const at::Tensor &x, const at::Tensor &weight) {
    if (!row_kernel_enabled()) return false;
    if (!x.defined() || !weight.defined() || !x.is_cpu() || !weight.is_cpu()) return false;
    if (x.scalar_type() != at::kFloat || weight.scalar_type() != at::kFloat) return false;
    if (weight.dim() != 2 || x.dim() < 1 || x.size(-1) != weight.size(1)) return false;
    if (weight.size(1) > 1 && weight.stride(1) != 1) return false;
    if (at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad())) return false;
    const int64_t K = weight.size(1);
    const int64_t rows = K > 0 ? x.numel() / K : 0;
    return rows >= 1 && rows <= row_gemm::kMaxRows;
}

at::Tensor decode_linear(const at::Tensor &x, const at::Tensor &weight, const at::Tensor &bias) {
    return decode_linear(x, weight, bias, row_gemm::preferred());
}

at::Tensor decode_linear(const at::Tensor &x, const at::Tensor &weight, const at::Tensor &bias,
                         row_gemm::Isa isa) {
    if (!decode_linear_applies(x, weight) || !row_gemm::available(isa))
        return at::linear(x, weight, bias);
    const int64_t K = weight.size(1), N = weight.size(0);
    const at::Tensor a = x.reshape({-1, K}).contiguous();
    const int64_t M = a.size(0);
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = N;
    at::Tensor y = at::empty({M, N}, a.options());
    const float *A = a.data_ptr<float>();
    const float *W = weight.data_ptr<float>();
    float *C = y.data_ptr<float>();
    const int64_t ldw = weight.stride(0);
    // Chunks of the N outputs, a multiple of four columns (the kernel's tile)
    // each, a few per thread so that a late helper still gets a share.
    const int threads = at::get_num_threads();
    const int64_t macs = M * N * K;
    int helpers = macs >= kParallelMacs ? threads - 1 : 0;
    const int64_t chunks_wanted = helpers > 0 ? 4 * threads : 1;
    const int64_t chunk = std::max<int64_t>(4, ((N + chunks_wanted - 1) / chunks_wanted + 3) & ~3);
    const int64_t chunks = (N + chunk - 1) / chunk;
    if (chunks < 2) helpers = 0;
    run_chunks(chunks, helpers, [&](int64_t c) {
        const int64_t n0 = c * chunk;
        row_gemm::multiply(isa, A, K, W, ldw, C, N, M, K, n0, std::min(N, n0 + chunk));
    });
    if (bias.defined()) y.add_(bias);
    return y.view(shape);
}

} // namespace rl::core
