#include "rl/core/kv_cache.hpp"

#include "rl/core/error.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace rl::core {

KVCache::KVCache(const ModelConfig &config, int64_t slots, int64_t capacity, at::ScalarType dtype,
                 at::Device device)
    : layers_(config.num_hidden_layers), slots_(slots), capacity_(capacity),
      kv_heads_(config.num_key_value_heads), head_dim_(config.head_dim), dtype_(dtype),
      device_(device) {
    check(slots > 0, "KV cache: slots must be positive, got " + std::to_string(slots));
    check(capacity > 0, "KV cache: capacity must be positive, got " + std::to_string(capacity));
    allocate();
}

void KVCache::allocate() {
    if (allocated() || layers_ == 0) return;
    // Zero-filled: masked key positions get probability 0, and 0 * value must
    // stay 0, which uninitialized memory (NaN) would break.
    const auto opts = at::TensorOptions().dtype(dtype_).device(device_);
    for (int64_t l = 0; l < layers_; ++l) {
        keys_.push_back(at::zeros({slots_, kv_heads_, capacity_, head_dim_}, opts));
        values_.push_back(at::zeros({slots_, kv_heads_, capacity_, head_dim_}, opts));
    }
    lengths_.assign(static_cast<size_t>(slots_), 0);
}

void KVCache::release() {
    keys_.clear();
    values_.clear();
    lengths_.assign(static_cast<size_t>(slots_), 0);
}

int64_t KVCache::bytes() const {
    int64_t b = 0;
    for (const auto &t : keys_) b += t.numel() * t.element_size();
    for (const auto &t : values_) b += t.numel() * t.element_size();
    return b;
}

int64_t KVCache::bytes_for(const ModelConfig &c, int64_t slots, int64_t capacity,
                           at::ScalarType dtype) {
    return 2 * c.num_hidden_layers * slots * c.num_key_value_heads * capacity * c.head_dim *
           static_cast<int64_t>(c10::elementSize(dtype));
}

void KVCache::check_slot(int64_t slot, const char *what) const {
    check(slot >= 0 && slot < slots_, std::string("KV cache ") + what + ": slot " +
                                          std::to_string(slot) + " is outside [0, " +
                                          std::to_string(slots_) + ")");
}

int64_t KVCache::length(int64_t slot) const {
    check_slot(slot, "length");
    return lengths_.empty() ? 0 : lengths_[static_cast<size_t>(slot)];
}

void KVCache::clear(int64_t slot) {
    check_slot(slot, "clear");
    if (!lengths_.empty()) lengths_[static_cast<size_t>(slot)] = 0;
}

void KVCache::clear_all() {
    std::fill(lengths_.begin(), lengths_.end(), 0);
}

void KVCache::truncate(int64_t slot, int64_t length) {
    check_slot(slot, "truncate");
    check(length >= 0 && length <= this->length(slot),
          "KV cache truncate: length " + std::to_string(length) + " is outside [0, " +
              std::to_string(this->length(slot)) + "] for slot " + std::to_string(slot));
    lengths_[static_cast<size_t>(slot)] = length;
}

void KVCache::copy_slot(int64_t src, int64_t dst) {
    check_slot(src, "copy_slot source");
    check_slot(dst, "copy_slot destination");
    check(allocated(), "KV cache copy_slot: the cache is released");
    if (src == dst) return;
    const int64_t n = lengths_[static_cast<size_t>(src)];
    at::NoGradGuard no_grad;
    for (int64_t l = 0; l < layers_; ++l) {
        keys_[l][dst].narrow(1, 0, n).copy_(keys_[l][src].narrow(1, 0, n));
        values_[l][dst].narrow(1, 0, n).copy_(values_[l][src].narrow(1, 0, n));
    }
    lengths_[static_cast<size_t>(dst)] = n;
}

void KVCache::reserve(int64_t capacity) {
    if (capacity <= capacity_) return;
    check(allocated(), "KV cache reserve: the cache is released");
    at::NoGradGuard no_grad;
    const auto opts = at::TensorOptions().dtype(dtype_).device(device_);
    int64_t used = 0;
    for (int64_t len : lengths_) used = std::max(used, len);
    for (int64_t l = 0; l < layers_; ++l) {
        at::Tensor k = at::zeros({slots_, kv_heads_, capacity, head_dim_}, opts);
        at::Tensor v = at::zeros({slots_, kv_heads_, capacity, head_dim_}, opts);
        k.narrow(2, 0, used).copy_(keys_[l].narrow(2, 0, used));
        v.narrow(2, 0, used).copy_(values_[l].narrow(2, 0, used));
        keys_[l] = k;
        values_[l] = v;
    }
    capacity_ = capacity;
}

} // namespace rl::core
