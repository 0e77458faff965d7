#include "rl/core/tensor_io.hpp"

#include "rl/core/error.hpp"
#include "rl/core/torch_compat.hpp"

#include <ATen/ATen.h>

#include <cstring>

namespace rl::core {

namespace {

// The safetensors dtypes with a tensor type in every libtorch, both ways.
struct DTypeRow {
    DType dtype;
    at::ScalarType torch;
};
constexpr DTypeRow kDTypeRows[] = {{DType::BOOL, at::kBool},  {DType::U8, at::kByte},
                                   {DType::I8, at::kChar},    {DType::I16, at::kShort},
                                   {DType::F16, at::kHalf},   {DType::BF16, at::kBFloat16},
                                   {DType::I32, at::kInt},    {DType::F32, at::kFloat},
                                   {DType::F64, at::kDouble}, {DType::I64, at::kLong}};

// U16, U32 and U64 have one only in newer libtorch (compat::wide_unsigned_type).
constexpr DType kWideUnsigned[] = {DType::U16, DType::U32, DType::U64};

} // namespace

at::ScalarType to_scalar_type(DType d, const std::string &what) {
    for (const auto &row : kDTypeRows)
        if (row.dtype == d) return row.torch;
    for (DType u : kWideUnsigned) {
        if (u != d) continue;
        if (auto t = compat::wide_unsigned_type(static_cast<int>(dtype_size(d) * 8))) return *t;
    }
    throw Error(what + ": dtype " + dtype_name(d) + " has no tensor type in this libtorch");
}

DType to_dtype(at::ScalarType t, const std::string &what) {
    for (const auto &row : kDTypeRows)
        if (row.torch == t) return row.dtype;
    for (DType u : kWideUnsigned) {
        auto w = compat::wide_unsigned_type(static_cast<int>(dtype_size(u) * 8));
        if (w && *w == t) return u;
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

void require_finite(const at::Tensor &t, const std::string &what) {
    if (!at::isFloatingType(t.scalar_type()) || t.numel() == 0) return;
    const at::Tensor bad = at::logical_not(at::isfinite(t)).reshape(-1);
    if (!bad.any().item<bool>()) return;
    const int64_t first = bad.nonzero()[0][0].item<int64_t>();
    const int64_t count = bad.sum().item<int64_t>();
    throw Error(ErrorKind::Numeric, what + " holds " + std::to_string(count) +
                                        " NaN or infinite value(s) (the first at flat index " +
                                        std::to_string(first) + ")");
}

} // namespace rl::core
