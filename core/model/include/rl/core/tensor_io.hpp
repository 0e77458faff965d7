// at::Tensor <-> safetensors: zero-copy views of mapped files, and writing
// named tensors in the Hugging Face layout.
#pragma once

#include "rl/core/safetensors.hpp"

#include <ATen/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace rl::core {

/// Torch scalar type of a safetensors dtype; throws Error naming `what` when
/// this libtorch has no such type.
at::ScalarType to_scalar_type(DType d, const std::string &what);
/// safetensors dtype of a torch scalar type; throws Error naming `what` when
/// safetensors has none.
DType to_dtype(at::ScalarType t, const std::string &what);

/// The tensor as stored in the file. Zero-copy (the tensor keeps the mapping
/// alive; writes go to private copy-on-write pages, never to the file) when
/// the data is aligned for its element type, else a copy.
at::Tensor tensor_from_file(const std::shared_ptr<SafetensorsFile> &file, const TensorInfo &info);

/// Throws Error (Numeric) naming `what` when a floating-point tensor holds a
/// NaN or an infinity (the first one's flat index is named). Weight swaps call
/// it before anything is replaced: a checksum only proves the bytes arrived as
/// sent, not that the sender's values are usable.
void require_finite(const at::Tensor &t, const std::string &what);

/// Every tensor of a file, by name.
std::map<std::string, at::Tensor> load_safetensors(const std::string &path);

/// Writes named tensors (any device, any layout; copied to contiguous CPU
/// memory as needed) atomically with the given metadata.
void save_safetensors(const std::string &path,
                      const std::vector<std::pair<std::string, at::Tensor>> &tensors,
                      const std::map<std::string, std::string> &metadata = {{"format", "pt"}});

} // namespace rl::core
