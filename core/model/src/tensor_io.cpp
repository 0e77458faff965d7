#include "rl/core/tensor_io.hpp"

#include "rl/core/error.hpp"
#include "rl/core/torch_compat.hpp"

#include <ATen/ATen.h>

#include <cstring>

namespace rl::core {

at::ScalarType to_scalar_type(DType d, const std::string &what) {
    switch (d) {
        case DType::BOOL:
            return at::kBool;
        case DType::U8:
            return at::kByte;
        case DType::I8:
            return at::kChar;
        case DType::I16:
            return at::kShort;
        case DType::F16:
            return at::kHalf;
        case DType::BF16:
            return at::kBFloat16;
        case DType::I32:
            return at::kInt;
        case DType::F32:
            return at::kFloat;
        case DType::F64:
            return at::kDouble;
        case DType::I64:
            return at::kLong;
        case DType::U16:
        case DType::U32:
        case DType::U64: {
            const int bits = static_cast<int>(dtype_size(d) * 8);
            if (auto t = compat::wide_unsigned_type(bits)) return *t;
            break;
        }
    }
    throw Error(what + ": dtype " + dtype_name(d) + " has no tensor type in this libtorch");
}

DType to_dtype(at::ScalarType t, const std::string &what) {
    switch (t) {
        case at::kBool:
            return DType::BOOL;
        case at::kByte:
            return DType::U8;
        case at::kChar:
            return DType::I8;
        case at::kShort:
            return DType::I16;
        case at::kHalf:
            return DType::F16;
        case at::kBFloat16:
            return DType::BF16;
        case at::kInt:
            return DType::I32;
        case at::kFloat:
            return DType::F32;
        case at::kDouble:
            return DType::F64;
        case at::kLong:
            return DType::I64;
        default:
            break;
    }
    for (int bits : {16, 32, 64}) {
        auto u = compat::wide_unsigned_type(bits);
        if (u && *u == t) return bits == 16 ? DType::U16 : bits == 32 ? DType::U32 : DType::U64;
    }
    throw Error(what + ": tensor type " + std::string(c10::toString(t)) +
                " cannot be stored in safetensors");
}

at::Tensor tensor_from_file(const std::shared_ptr<SafetensorsFile> &file, const TensorInfo &info) {
    const std::string what = file->path() + ": tensor '" + info.name + "'";
    const at::ScalarType st = to_scalar_type(info.dtype, what);
    const auto opts = at::TensorOptions().dtype(st).device(at::kCPU);
    uint8_t *ptr = file->data(info);
    const size_t elem = dtype_size(info.dtype);
    if (info.nbytes() == 0) return at::empty(info.shape, opts);
    if (reinterpret_cast<uintptr_t>(ptr) % elem == 0) {
        std::shared_ptr<SafetensorsFile> keep = file;
        return at::from_blob(
            ptr, info.shape, [keep](void *) mutable { keep.reset(); }, opts);
    }
    at::Tensor t = at::empty(info.shape, opts);
    std::memcpy(t.data_ptr(), ptr, info.nbytes());
    return t;
}

std::map<std::string, at::Tensor> load_safetensors(const std::string &path) {
    auto f = SafetensorsFile::open(path);
    std::map<std::string, at::Tensor> out;
    for (const auto &t : f->tensors()) out[t.name] = tensor_from_file(f, t);
    return out;
}

void save_safetensors(const std::string &path,
                      const std::vector<std::pair<std::string, at::Tensor>> &tensors,
                      const std::map<std::string, std::string> &metadata) {
    std::vector<at::Tensor> keep;
    std::vector<TensorBytes> bytes;
    keep.reserve(tensors.size());
    bytes.reserve(tensors.size());
    for (const auto &[name, t] : tensors) {
        const std::string what = path + ": tensor '" + name + "'";
        check(t.defined(), what + " is undefined");
        at::Tensor c = t.detach().to(at::kCPU).contiguous();
        TensorBytes b;
        b.name = name;
        b.dtype = to_dtype(c.scalar_type(), what);
        b.shape.assign(c.sizes().begin(), c.sizes().end());
        b.data = c.data_ptr();
        b.nbytes = c.numel() * c.element_size();
        keep.push_back(std::move(c));
        bytes.push_back(std::move(b));
    }
    write_safetensors(path, std::move(bytes), metadata);
}

} // namespace rl::core
