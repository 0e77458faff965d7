// Hugging Face model folders: config.json + model.safetensors (or shards with
// model.safetensors.index.json) + tokenizer files.
#pragma once

#include "rl/core/model.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rl::core {

struct LoadOptions {
    at::ScalarType dtype = at::kFloat; ///< parameter dtype (converted from the file's)
    at::Device device = at::kCPU;
    /// Adopt the mapped file pages as parameters where dtype, device and
    /// alignment allow (no copy; training writes go to private pages).
    bool zero_copy = true;
};

/// Loads a model folder. Errors name the folder, file and tensor: missing or
/// unexpected tensors, shape mismatches, corrupt or truncated files, index
/// entries that point to the wrong shard.
std::shared_ptr<CausalLM> load_pretrained(const std::string &dir, const LoadOptions &options = {});

struct SaveOptions {
    /// On-disk dtype; default (Undefined): the model's dtype.
    at::ScalarType dtype = at::ScalarType::Undefined;
    /// Shards above this size are split as transformers does
    /// (model-00001-of-0000N.safetensors + model.safetensors.index.json).
    uint64_t max_shard_bytes = 5'000'000'000ull;
    /// When non-empty: the (HF name, tensor) list written instead of the
    /// model's named_weights() (a merged LoRA export, lora.hpp).
    std::vector<std::pair<std::string, at::Tensor>> weights;
};

/// Writes config.json, the weights and the carried tokenizer files into `dir`
/// (created if needed). Every file is written atomically; weight files of an
/// earlier save with a different sharding are removed.
void save_pretrained(const CausalLM &model, const std::string &dir,
                     const SaveOptions &options = {});

/// The tokenizer / generation files carried from load to save.
const std::vector<std::string> &aux_file_names();

/// "float32", "bfloat16", "float16", "float64" (transformers' torch_dtype names).
std::string dtype_string(at::ScalarType t);

} // namespace rl::core
