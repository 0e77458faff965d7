// Key/value cache for incremental decoding. A cache holds `slots` independent
// sequences; each slot has its own length. The rollout engine prefills prompts
// into slots, copies a prompt slot to n sample slots, then decodes one token
// per active slot per step (CausalLM::extend).
#pragma once

#include "rl/core/config.hpp"

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

namespace rl::core {

class CausalLM;

class KVCache {
public:
    KVCache() = default;
    /// Allocates keys and values for every layer: [slots, kv_heads, capacity, head_dim].
    KVCache(const ModelConfig &config, int64_t slots, int64_t capacity,
            at::ScalarType dtype = at::kFloat, at::Device device = at::kCPU);

    int64_t num_slots() const { return slots_; }
    int64_t capacity() const { return capacity_; }
    int64_t num_layers() const { return layers_; }
    /// Tokens currently cached in `slot`.
    int64_t length(int64_t slot) const;
    const std::vector<int64_t> &lengths() const { return lengths_; }
    /// Bytes held by keys and values (0 when released).
    int64_t bytes() const;
    /// Bytes a cache of this shape holds.
    static int64_t bytes_for(const ModelConfig &config, int64_t slots, int64_t capacity,
                             at::ScalarType dtype);
    bool allocated() const { return !keys_.empty(); }

    /// Empties one slot / all slots (memory is kept).
    void clear(int64_t slot);
    void clear_all();
    /// Keeps the first `length` tokens of a slot.
    void truncate(int64_t slot, int64_t length);
    /// Copies the cached tokens of `src` into `dst` (n samples of one prompt).
    void copy_slot(int64_t src, int64_t dst);
    /// Grows the capacity to at least `capacity`, keeping the contents.
    void reserve(int64_t capacity);
    /// Frees the memory (engine sleep); lengths are reset. allocate() restores it.
    void release();
    void allocate();

    /// Per-layer storage, [slots, kv_heads, capacity, head_dim]. For the model.
    at::Tensor &keys(int64_t layer) { return keys_.at(static_cast<size_t>(layer)); }
    at::Tensor &values(int64_t layer) { return values_.at(static_cast<size_t>(layer)); }

private:
    friend class CausalLM;
    void check_slot(int64_t slot, const char *what) const;
    void set_length(int64_t slot, int64_t length) { lengths_[static_cast<size_t>(slot)] = length; }

    int64_t layers_ = 0;
    int64_t slots_ = 0;
    int64_t capacity_ = 0;
    int64_t kv_heads_ = 0;
    int64_t head_dim_ = 0;
    at::ScalarType dtype_ = at::kFloat;
    at::Device device_ = at::kCPU;
    std::vector<at::Tensor> keys_;
    std::vector<at::Tensor> values_;
    std::vector<int64_t> lengths_;
};

} // namespace rl::core
