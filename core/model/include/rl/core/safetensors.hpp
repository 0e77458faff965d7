// Hugging Face safetensors: reader (mmap), writer (the layout the reference
// Rust implementation produces) and sharded index. Torch-free; see
// tensor_io.hpp for the conversion to and from at::Tensor.
//
// File layout: u64 little-endian N, N bytes of JSON header (padded with spaces
// to a multiple of 8), then the data buffer. The header maps each tensor name
// to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
// data buffer) plus an optional "__metadata__" string map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace rl::core {

enum class DType : int32_t { BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };

/// "F32", "BF16", ... as written in safetensors headers.
const char *dtype_name(DType d);
/// Bytes per element.
size_t dtype_size(DType d);
/// Parses a header dtype string; false when unknown.
bool parse_dtype(const std::string &s, DType *out);

struct TensorInfo {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    uint64_t begin = 0; ///< byte offset in the data buffer
    uint64_t end = 0;   ///< one past the last byte
    uint64_t nbytes() const { return end - begin; }
    int64_t numel() const;
};

/// A parsed header. `tensors` is in data-offset order.
struct SafetensorsHeader {
    std::vector<TensorInfo> tensors;
    std::map<std::string, std::string> metadata;
    uint64_t data_start = 0; ///< 8 + header length
};

/// Validates and parses the header of a safetensors image of `size` bytes.
/// Checks everything the reference implementation checks: header length, JSON,
/// duplicate names, dtypes, shapes, offsets that tile the data buffer exactly.
/// `what` names the source (a path) in error messages.
SafetensorsHeader parse_safetensors(const uint8_t *data, size_t size, const std::string &what);

/// A memory-mapped safetensors file (MAP_PRIVATE, writable copy-on-write pages:
/// views may be adopted as trainable parameters without touching the file).
class SafetensorsFile {
public:
    static std::shared_ptr<SafetensorsFile> open(const std::string &path);
    ~SafetensorsFile();
    SafetensorsFile(const SafetensorsFile &) = delete;
    SafetensorsFile &operator=(const SafetensorsFile &) = delete;

    const std::string &path() const { return path_; }
    const std::vector<TensorInfo> &tensors() const { return header_.tensors; }
    const std::map<std::string, std::string> &metadata() const { return header_.metadata; }
    /// nullptr when absent.
    const TensorInfo *find(const std::string &name) const;
    /// Throws Error naming the file and tensor when absent.
    const TensorInfo &at(const std::string &name) const;
    /// Start of the tensor's bytes inside the mapping.
    uint8_t *data(const TensorInfo &t) const;

private:
    SafetensorsFile() = default;
    std::string path_;
    uint8_t *map_ = nullptr;
    size_t size_ = 0;
    SafetensorsHeader header_;
    std::map<std::string, size_t> index_;
};

/// One tensor to write: borrowed bytes, little-endian, row-major contiguous.
struct TensorBytes {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    const void *data = nullptr;
    size_t nbytes = 0;
};

/// The header bytes (length prefix included) the reference implementation
/// writes for these tensors, and the order their data follows in. Tensors are
/// sorted by dtype (widest first) then name; the JSON is compact and padded
/// with spaces to a multiple of 8 bytes.
std::string safetensors_header(std::vector<TensorBytes> *tensors,
                               const std::map<std::string, std::string> &metadata);

/// Writes a safetensors file atomically (temp file + fsync + rename).
/// Validates names (non-empty, unique), sizes against shapes and dtypes.
void write_safetensors(const std::string &path, std::vector<TensorBytes> tensors,
                       const std::map<std::string, std::string> &metadata = {{"format", "pt"}});

/// `model.safetensors.index.json`: tensor name -> shard file name.
struct SafetensorsIndex {
    std::map<std::string, std::string> weight_map;
    std::map<std::string, std::string> metadata; ///< "total_size" kept as its decimal text
};

/// Parses an index file; errors name the file and the offending entry.
SafetensorsIndex read_safetensors_index(const std::string &path);
/// The index JSON text as transformers writes it (2-space indent, sorted names).
std::string safetensors_index_json(const SafetensorsIndex &index, uint64_t total_size);

} // namespace rl::core
