// rl/sdk/tensor.hpp: read and write borrowed rl_tensor_view_t of any numeric
// dtype as double, with strides. Per-token vectors are small next to the
// model, so plugins compute in double on the CPU.
#pragma once

#include <rl_plugin.h>

#include "error.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace rl::sdk {

inline std::string dtype_name(rl_dtype_t d) {
    const char *base = "?";
    switch (d.code) {
        case RL_DTYPE_INT:
            base = "int";
            break;
        case RL_DTYPE_UINT:
            base = "uint";
            break;
        case RL_DTYPE_FLOAT:
            base = "float";
            break;
        case RL_DTYPE_BFLOAT:
            base = "bfloat";
            break;
        case RL_DTYPE_BOOL:
            return "bool";
        default:
            break;
    }
    return std::string(base) + std::to_string(d.bits);
}

inline constexpr rl_dtype_t kFloat64{RL_DTYPE_FLOAT, 64, 1};
inline constexpr rl_dtype_t kFloat32{RL_DTYPE_FLOAT, 32, 1};
inline constexpr rl_dtype_t kInt64{RL_DTYPE_INT, 64, 1};

// A read-only, CPU view of a 0-d or 1-d tensor, element access as double.
class TensorRef {
public:
    TensorRef() = default;
    TensorRef(std::string name, const rl_tensor_view_t &view) : name_(std::move(name)), v_(view) {
        if (v_.device.type != RL_DEVICE_CPU && v_.device.type != RL_DEVICE_CUDA_HOST)
            fail(RL_ERR_UNSUPPORTED, "tensor '" + name_ + "' is not in CPU memory");
        if (v_.ndim > 1)
            invalid("tensor '" + name_ + "' must be 0-d or 1-d, got " + std::to_string(v_.ndim) +
                    " dimensions");
        if (v_.dtype.lanes != 1) invalid("tensor '" + name_ + "' has vector lanes");
        const bool ok =
            (v_.dtype.code == RL_DTYPE_FLOAT && (v_.dtype.bits == 32 || v_.dtype.bits == 64)) ||
            (v_.dtype.code == RL_DTYPE_INT && (v_.dtype.bits == 8 || v_.dtype.bits == 16 ||
                                               v_.dtype.bits == 32 || v_.dtype.bits == 64)) ||
            (v_.dtype.code == RL_DTYPE_UINT && v_.dtype.bits == 8) ||
            (v_.dtype.code == RL_DTYPE_BOOL && v_.dtype.bits == 8);
        if (!ok)
            fail(RL_ERR_UNSUPPORTED,
                 "tensor '" + name_ + "' has unsupported dtype " + dtype_name(v_.dtype));
        size_ = v_.ndim == 0 ? 1 : v_.shape[0];
        stride_ = (v_.ndim == 1 && v_.strides) ? v_.strides[0] : 1;
        if (size_ > 0 && v_.data == nullptr) invalid("tensor '" + name_ + "' has no data");
    }

    bool valid() const { return !name_.empty(); }
    const std::string &name() const { return name_; }
    int64_t size() const { return size_; }
    const rl_tensor_view_t &view() const { return v_; }
    bool is_float() const { return v_.dtype.code == RL_DTYPE_FLOAT; }

    double operator[](int64_t i) const {
        const char *base = static_cast<const char *>(v_.data) + v_.byte_offset;
        const int64_t k = i * stride_;
        switch (v_.dtype.code) {
            case RL_DTYPE_FLOAT:
                return v_.dtype.bits == 64 ? reinterpret_cast<const double *>(base)[k]
                                           : reinterpret_cast<const float *>(base)[k];
            case RL_DTYPE_INT:
                switch (v_.dtype.bits) {
                    case 8:
                        return reinterpret_cast<const int8_t *>(base)[k];
                    case 16:
                        return reinterpret_cast<const int16_t *>(base)[k];
                    case 32:
                        return reinterpret_cast<const int32_t *>(base)[k];
                    default:
                        return static_cast<double>(reinterpret_cast<const int64_t *>(base)[k]);
                }
            default:
                return reinterpret_cast<const uint8_t *>(base)[k];
        }
    }
    int64_t as_int(int64_t i) const {
        if (v_.dtype.code == RL_DTYPE_INT && v_.dtype.bits == 64) {
            const char *base = static_cast<const char *>(v_.data) + v_.byte_offset;
            return reinterpret_cast<const int64_t *>(base)[i * stride_];
        }
        return static_cast<int64_t>((*this)[i]);
    }
    std::vector<double> to_vector() const {
        std::vector<double> out(static_cast<size_t>(size_));
        for (int64_t i = 0; i < size_; ++i) out[static_cast<size_t>(i)] = (*this)[i];
        return out;
    }
    // Throws RL_ERR_NUMERIC naming the tensor and the first bad index.
    void check_finite() const {
        if (!is_float()) return;
        for (int64_t i = 0; i < size_; ++i) {
            const double x = (*this)[i];
            if (!std::isfinite(x))
                fail(RL_ERR_NUMERIC, "input '" + name_ + "' has " +
                                         (std::isnan(x) ? std::string("NaN") : std::string("Inf")) +
                                         " at token " + std::to_string(i));
        }
    }

private:
    std::string name_;
    rl_tensor_view_t v_{};
    int64_t size_ = 0;
    int64_t stride_ = 1;
};

// A writable 1-d float32/float64 CPU buffer the host handed out (loss grads).
class TensorOut {
public:
    TensorOut() = default;
    TensorOut(std::string name, const rl_tensor_view_t &view) : name_(std::move(name)), v_(view) {
        if (v_.dtype.code != RL_DTYPE_FLOAT || (v_.dtype.bits != 32 && v_.dtype.bits != 64))
            fail(RL_ERR_INTERNAL, "output '" + name_ + "' is not float32/float64");
        size_ = v_.ndim == 0 ? 1 : v_.shape[0];
        stride_ = (v_.ndim == 1 && v_.strides) ? v_.strides[0] : 1;
    }
    bool valid() const { return !name_.empty(); }
    int64_t size() const { return size_; }
    void set(int64_t i, double x) const {
        char *base = static_cast<char *>(v_.data) + v_.byte_offset;
        if (v_.dtype.bits == 64)
            reinterpret_cast<double *>(base)[i * stride_] = x;
        else
            reinterpret_cast<float *>(base)[i * stride_] = static_cast<float>(x);
    }
    void assign(const std::vector<double> &xs) const {
        for (int64_t i = 0; i < size_ && i < static_cast<int64_t>(xs.size()); ++i)
            set(i, xs[static_cast<size_t>(i)]);
    }

private:
    std::string name_;
    rl_tensor_view_t v_{};
    int64_t size_ = 0;
    int64_t stride_ = 1;
};

// A view over a std::vector<double>, for emitting results.
inline rl_tensor_view_t make_view(const std::vector<double> &xs, int64_t *shape_storage) {
    rl_tensor_view_t v{};
    *shape_storage = static_cast<int64_t>(xs.size());
    v.data = xs.empty() ? nullptr : const_cast<double *>(xs.data());
    v.device = rl_device_t{RL_DEVICE_CPU, 0};
    v.ndim = 1;
    v.dtype = kFloat64;
    v.shape = shape_storage;
    v.strides = nullptr;
    v.byte_offset = 0;
    return v;
}

} // namespace rl::sdk
