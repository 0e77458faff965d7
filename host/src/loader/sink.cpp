#include "rl/host/sink.hpp"

#include "rl/host/runtime.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>

namespace rl::host {

size_t dtype_size(rl_dtype_t d) {
    return static_cast<size_t>((d.bits + 7) / 8) * d.lanes;
}

std::string dtype_string(rl_dtype_t d) {
    switch (d.code) {
        case RL_DTYPE_INT:
            return "int" + std::to_string(d.bits);
        case RL_DTYPE_UINT:
            return "uint" + std::to_string(d.bits);
        case RL_DTYPE_FLOAT:
            return "float" + std::to_string(d.bits);
        case RL_DTYPE_BFLOAT:
            return "bfloat" + std::to_string(d.bits);
        case RL_DTYPE_BOOL:
            return "bool";
        case RL_DTYPE_COMPLEX:
            return "complex" + std::to_string(d.bits);
        default:
            return "code" + std::to_string(d.code) + "_" + std::to_string(d.bits);
    }
}

int64_t OwnedTensor::numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
}

rl_tensor_view_t OwnedTensor::view() const {
    rl_tensor_view_t v{};
    v.data = bytes.empty() ? nullptr : const_cast<uint8_t *>(bytes.data());
    v.device = rl_device_t{RL_DEVICE_CPU, 0};
    v.ndim = static_cast<int32_t>(shape.size());
    v.dtype = dtype;
    v.shape = shape.empty() ? nullptr : const_cast<int64_t *>(shape.data());
    v.strides = nullptr;
    v.byte_offset = 0;
    return v;
}

OwnedTensor OwnedTensor::zeros(rl_dtype_t dtype, const std::vector<int64_t> &shape) {
    OwnedTensor t;
    t.dtype = dtype;
    t.shape = shape;
    t.bytes.assign(static_cast<size_t>(t.numel()) * dtype_size(dtype), 0);
    return t;
}

OwnedTensor OwnedTensor::copy_of(const rl_tensor_view_t &v) {
    if (v.device.type != RL_DEVICE_CPU && v.device.type != RL_DEVICE_CUDA_HOST)
        throw HostError{RL_ERR_UNSUPPORTED, "tensor is not in CPU memory"};
    if (v.ndim < 0 || v.ndim > 8)
        throw HostError{RL_ERR_INVALID_ARG, "tensor has " + std::to_string(v.ndim) + " dimensions"};
    if (v.ndim > 0 && !v.shape) throw HostError{RL_ERR_INVALID_ARG, "tensor has no shape"};
    if (v.dtype.lanes != 1 || v.dtype.bits == 0 || v.dtype.bits % 8 != 0)
        throw HostError{RL_ERR_UNSUPPORTED, "tensor dtype " + dtype_string(v.dtype)};
    OwnedTensor t;
    t.dtype = v.dtype;
    t.shape.assign(v.shape, v.shape + v.ndim);
    for (int64_t s : t.shape)
        if (s < 0) throw HostError{RL_ERR_INVALID_ARG, "tensor has a negative dimension"};
    const size_t es = dtype_size(v.dtype);
    const int64_t n = t.numel();
    t.bytes.resize(static_cast<size_t>(n) * es);
    if (n == 0) return t;
    if (!v.data) throw HostError{RL_ERR_INVALID_ARG, "tensor has elements but no data"};
    const uint8_t *base = static_cast<const uint8_t *>(v.data) + v.byte_offset;
    if (!v.strides) {
        std::memcpy(t.bytes.data(), base, t.bytes.size());
        return t;
    }
    // Strided copy, element by element in row-major order of the output.
    std::vector<int64_t> idx(static_cast<size_t>(v.ndim), 0);
    for (int64_t k = 0; k < n; ++k) {
        int64_t off = 0;
        for (int32_t d = 0; d < v.ndim; ++d) off += idx[static_cast<size_t>(d)] * v.strides[d];
        std::memcpy(t.bytes.data() + static_cast<size_t>(k) * es,
                    base + off * static_cast<int64_t>(es), es);
        for (int32_t d = v.ndim - 1; d >= 0; --d) {
            if (++idx[static_cast<size_t>(d)] < t.shape[static_cast<size_t>(d)]) break;
            idx[static_cast<size_t>(d)] = 0;
        }
    }
    return t;
}

static nlohmann::json number_json(double x) {
    if (std::isnan(x)) return "NaN";
    if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
    return x;
}

std::string CallSink::to_json() const {
    nlohmann::json j;
    j["scalars"] = nlohmann::json::object();
    j["metrics"] = nlohmann::json::object();
    j["texts"] = nlohmann::json::object();
    j["tensors"] = nlohmann::json::object();
    for (const auto &kv : scalars) j["scalars"][kv.first] = number_json(kv.second);
    for (const auto &kv : metrics) j["metrics"][kv.first] = number_json(kv.second);
    for (const auto &kv : texts) j["texts"][kv.first] = kv.second;
    for (const auto &kv : tensors)
        j["tensors"][kv.first] = {{"dtype", dtype_string(kv.second.dtype)},
                                  {"shape", kv.second.shape}};
    // Names and texts are a plugin's bytes: invalid UTF-8 becomes U+FFFD
    // rather than a type_error 316 from dump().
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

} // namespace rl::host
