// rl/core/device.hpp: where the model lives and in which precision. Parses the
// user's `model.device` / `model.dtype` strings, says whether CUDA is usable,
// and frees or measures device memory (the engine's sleep / wake).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace rl::core {

/// "auto" (the first CUDA device when one is usable, else the CPU), "cpu",
/// "cuda" (the current CUDA device) or "cuda:N". Throws Error naming `what`
/// (e.g. "model.device") when the text is none of these, or names a CUDA
/// device this process cannot use (and why: no CUDA in this libtorch, no
/// driver / GPU, N out of range).
at::Device resolve_device(const std::string &spec, const std::string &what = "device");

/// "float32" | "bfloat16" (and "float16", "float64" for tests and export).
/// Throws Error naming `what` otherwise.
at::ScalarType parse_dtype(const std::string &name, const std::string &what = "dtype");

/// Whether this libtorch was built with CUDA, and how many devices it sees.
bool torch_has_cuda();
int cuda_device_count();

/// Compute capability of a CUDA device as major * 10 + minor (90 for an
/// H100); 0 for the CPU.
int cuda_capability(const at::Device &device);

/// "2.15.0+cu132" style version of the linked libtorch.
std::string torch_version();

/// One line for `rlhost --version`: libtorch version, CUDA usable or not and why.
std::string torch_summary();

/// Gives the memory the caching allocator holds but no tensor uses back to the
/// driver (CUDA); no-op on the CPU.
void release_cached_memory(const at::Device &device);

struct DeviceMemory {
    int64_t free_bytes = 0;      ///< driver's free memory on the device (cudaMemGetInfo)
    int64_t total_bytes = 0;     ///< driver's total memory on the device
    int64_t allocated_bytes = 0; ///< bytes in live tensors (libtorch's allocator)
    int64_t reserved_bytes = 0;  ///< bytes the allocator holds (live + cached)
};
/// Memory of a CUDA device; all zero on the CPU.
DeviceMemory device_memory(const at::Device &device);

} // namespace rl::core
