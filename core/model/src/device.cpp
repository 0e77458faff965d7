#include "rl/core/device.hpp"

#include "rl/core/error.hpp"

#include <torch/cuda.h>
#include <torch/version.h>

#ifdef RL_TORCH_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <cstdlib>
#include <map>
#include <mutex>

namespace rl::core {

bool torch_has_cuda() {
#ifdef RL_TORCH_HAS_CUDA
    return true;
#else
    return false;
#endif
}

int cuda_device_count() {
    if (!torch_has_cuda()) return 0;
    return static_cast<int>(torch::cuda::device_count());
}

int cuda_capability(const at::Device &device) {
#ifdef RL_TORCH_HAS_CUDA
    if (!device.is_cuda()) return 0;
    // Asked once per device: the attention plan reads it on every forward.
    static std::mutex mu;
    static std::map<int, int> known;
    const int index = device.has_index() ? device.index() : c10::cuda::current_device();
    std::lock_guard<std::mutex> lock(mu);
    auto it = known.find(index);
    if (it != known.end()) return it->second;
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index) != cudaSuccess)
        major = minor = 0;
    return known[index] = major * 10 + minor;
#else
    (void)device;
    return 0;
#endif
}

std::string torch_version() {
    return TORCH_VERSION;
}

std::string torch_summary() {
    std::string s = "libtorch " + torch_version();
    if (!torch_has_cuda()) return s + ", CPU only (this libtorch has no CUDA)";
    const int n = cuda_device_count();
    if (n == 0) return s + ", CUDA not usable (no GPU or driver found)";
    return s + ", CUDA usable (" + std::to_string(n) + (n == 1 ? " device)" : " devices)");
}

// In a distributed run each local rank takes its own GPU: "auto" and "cuda"
// mean cuda:LOCAL_RANK (torchrun's convention).
int local_rank_gpu() {
    const char *v = std::getenv("LOCAL_RANK");
    if (v == nullptr || std::getenv("WORLD_SIZE") == nullptr) return 0;
    const long n = std::strtol(v, nullptr, 10);
    return n > 0 ? static_cast<int>(n) : 0;
}

at::Device resolve_device(const std::string &spec, const std::string &what) {
    if (spec == "cpu") return at::Device(at::kCPU);
    if (spec == "auto")
        return cuda_device_count() > 0
                   ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank_gpu() %
                                                                         cuda_device_count()))
                   : at::kCPU;
    int index = -1;
    if (spec == "cuda") {
        index = local_rank_gpu();
    } else if (spec.rfind("cuda:", 0) == 0 && spec.size() > 5 && spec.size() < 9) {
        char *end = nullptr;
        const long n = std::strtol(spec.c_str() + 5, &end, 10);
        if (*end == '\0' && n >= 0) index = static_cast<int>(n);
    }
    if (index < 0)
        throw Error(what + ": '" + spec + "' is not a device; use auto, cpu, cuda or cuda:N");
    if (!torch_has_cuda())
        throw Error(what + ": '" + spec + "' asks for CUDA, but this build's " + torch_version() +
                    " has no CUDA; use cpu (or build against a CUDA libtorch)");
    const int count = cuda_device_count();
    if (count == 0)
        throw Error(what + ": '" + spec + "' asks for CUDA, but no CUDA device is usable here (" +
                    torch_version() + " sees no GPU or driver); use cpu or auto");
    if (index >= count)
        throw Error(what + ": '" + spec + "' is out of range: " + std::to_string(count) +
                    " CUDA device" + (count == 1 ? "" : "s") +
                    " (cuda:0 .. cuda:" + std::to_string(count - 1) + ")");
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

at::ScalarType parse_dtype(const std::string &name, const std::string &what) {
    if (name == "float32") return at::kFloat;
    if (name == "bfloat16") return at::kBFloat16;
    if (name == "float16") return at::kHalf;
    if (name == "float64") return at::kDouble;
    throw Error(what + ": '" + name + "' is not a dtype; use float32 or bfloat16");
}

void release_cached_memory(const at::Device &device) {
#ifdef RL_TORCH_HAS_CUDA
    if (device.is_cuda()) {
        c10::cuda::CUDAGuard guard(device);
        c10::cuda::device_synchronize();
        c10::cuda::CUDACachingAllocator::emptyCache();
    }
#else
    (void)device;
#endif
}

DeviceMemory device_memory(const at::Device &device) {
    DeviceMemory m;
#ifdef RL_TORCH_HAS_CUDA
    if (!device.is_cuda()) return m;
    c10::cuda::CUDAGuard guard(device);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
        m.free_bytes = static_cast<int64_t>(free_b);
        m.total_bytes = static_cast<int64_t>(total_b);
    }
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const size_t all = 0; // StatType::AGGREGATE in every libtorch 2.x
    m.allocated_bytes = stats.allocated_bytes[all].current;
    m.reserved_bytes = stats.reserved_bytes[all].current;
#else
    (void)device;
#endif
    return m;
}

} // namespace rl::core
