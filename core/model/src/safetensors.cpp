#include "rl/core/text.hpp"
#include "rl/core/safetensors.hpp"

#include "json_object.hpp"
#include "rl/core/atomic_file.hpp"
#include "rl/core/error.hpp"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

namespace rl::core {
namespace {

using json = nlohmann::json;

// The reference implementation refuses headers above 100 MB.
constexpr uint64_t kMaxHeaderSize = 100'000'000;

struct DTypeInfo {
    DType dtype;
    const char *name;
    size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::BOOL, "BOOL", 1}, {DType::U8, "U8", 1},   {DType::I8, "I8", 1},
    {DType::I16, "I16", 2},   {DType::U16, "U16", 2}, {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::I32, "I32", 4}, {DType::U32, "U32", 4},
    {DType::F32, "F32", 4},   {DType::F64, "F64", 8}, {DType::I64, "I64", 8},
    {DType::U64, "U64", 8},
};

// Order of the reference implementation's Dtype enum (the writer sorts by it,
// widest first): BOOL, U8, I8, F8_*, I16, U16, F16, BF16, I32, U32, F32, F64,
// I64, U64. Our DType enum lists the supported ones in the same order.
int dtype_rank(DType d) {
    return static_cast<int>(d);
}

// numel * elem_size with overflow detection; false on overflow.
bool byte_size(const std::vector<int64_t> &shape, size_t elem, uint64_t *out) {
    uint64_t n = elem;
    for (int64_t d : shape) {
        if (d < 0) return false;
        if (d != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d))
            return false;
        n *= static_cast<uint64_t>(d);
    }
    *out = n;
    return true;
}

// Detects duplicate keys at the top level (nlohmann silently keeps the last).
json parse_header_json(const char *begin, size_t len, const std::string &what) {
    std::set<std::string> seen;
    std::string duplicate;
    json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json &parsed) {
        if (depth == 1 && event == json::parse_event_t::key && duplicate.empty()) {
            const std::string key = parsed.get<std::string>();
            if (!seen.insert(key).second) duplicate = key;
        }
        return true;
    };
    json j;
    try {
        j = json::parse(begin, begin + len, cb);
    } catch (const json::exception &e) {
        throw Error(what + ": corrupt safetensors header: " + e.what());
    }
    if (!duplicate.empty())
        throw Error(what + ": corrupt safetensors header: tensor '" + duplicate + "' listed twice");
    return j;
}

} // namespace

const char *dtype_name(DType d) {
    for (const auto &i : kDTypes)
        if (i.dtype == d) return i.name;
    return "?";
}

size_t dtype_size(DType d) {
    for (const auto &i : kDTypes)
        if (i.dtype == d) return i.size;
    return 0;
}

bool parse_dtype(const std::string &s, DType *out) {
    for (const auto &i : kDTypes) {
        if (s == i.name) {
            *out = i.dtype;
            return true;
        }
    }
    return false;
}

int64_t TensorInfo::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

SafetensorsHeader parse_safetensors(const uint8_t *data, size_t size, const std::string &what) {
    if (size < 8)
        throw Error(what + ": not a safetensors file: " + std::to_string(size) +
                    " bytes, too short for the 8-byte header length");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
    if (n > kMaxHeaderSize)
        throw Error(what + ": corrupt safetensors header: header length " + std::to_string(n) +
                    " exceeds the 100 MB limit");
    if (n > size - 8)
        throw Error(what + ": truncated safetensors file: header length " + std::to_string(n) +
                    " but only " + std::to_string(size - 8) + " bytes follow");
    if (n < 2 || data[8] != '{')
        throw Error(what + ": corrupt safetensors header: it does not start with '{'");

    const json j = parse_header_json(reinterpret_cast<const char *>(data + 8), n, what);
    if (!j.is_object())
        throw Error(what + ": corrupt safetensors header: top level is not a JSON object");

    SafetensorsHeader h;
    h.data_start = 8 + n;
    const uint64_t data_size = size - h.data_start;
    for (auto it = j.begin(); it != j.end(); ++it) {
        const std::string &name = it.key();
        const json &v = it.value();
        if (name == "__metadata__") {
            if (!v.is_object())
                throw Error(what + ": corrupt safetensors header: __metadata__ is not an object");
            for (auto m = v.begin(); m != v.end(); ++m) {
                if (!m.value().is_string())
                    throw Error(what + ": corrupt safetensors header: __metadata__['" + m.key() +
                                "'] is not a string");
                h.metadata[m.key()] = m.value().get<std::string>();
            }
            continue;
        }
        const std::string where = what + ": tensor '" + name + "'";
        if (name.empty()) throw Error(what + ": corrupt safetensors header: empty tensor name");
        if (!v.is_object()) throw Error(where + ": header entry is not an object");
        TensorInfo t;
        t.name = name;
        auto dt = v.find("dtype");
        if (dt == v.end() || !dt->is_string()) throw Error(where + ": missing string 'dtype'");
        if (!parse_dtype(dt->get<std::string>(), &t.dtype))
            throw Error(where + ": unsupported dtype '" + dt->get<std::string>() + "'");
        auto sh = v.find("shape");
        if (sh == v.end() || !sh->is_array()) throw Error(where + ": missing array 'shape'");
        for (const auto &d : *sh) {
            if (!d.is_number_unsigned() ||
                d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                throw Error(where + ": shape entries must be non-negative integers");
            t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
        }
        auto off = v.find("data_offsets");
        if (off == v.end() || !off->is_array() || off->size() != 2 ||
            !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
            throw Error(where + ": 'data_offsets' must be two non-negative integers");
        t.begin = (*off)[0].get<uint64_t>();
        t.end = (*off)[1].get<uint64_t>();
        if (t.end < t.begin)
            throw Error(where + ": data_offsets [" + std::to_string(t.begin) + ", " +
                        std::to_string(t.end) + "] end before they begin");
        uint64_t expect = 0;
        if (!byte_size(t.shape, dtype_size(t.dtype), &expect))
            throw Error(where + ": shape " + shape_text(t.shape) + " overflows");
        if (expect != t.nbytes())
            throw Error(where + ": shape " + shape_text(t.shape) + " of " + dtype_name(t.dtype) +
                        " needs " + std::to_string(expect) + " bytes but data_offsets span " +
                        std::to_string(t.nbytes()));
        if (t.end > data_size)
            throw Error(where + ": truncated file: data ends at byte " +
                        std::to_string(h.data_start + t.end) + " but the file has " +
                        std::to_string(size) + " bytes");
        h.tensors.push_back(std::move(t));
    }
    std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo &a, const TensorInfo &b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t pos = 0;
    for (const auto &t : h.tensors) {
        if (t.begin != pos)
            throw Error(what + ": tensor '" + t.name + "': data_offsets start at " +
                        std::to_string(t.begin) +
                        (t.begin < pos ? " inside" : " after a gap after") +
                        " the previous tensor's data (expected " + std::to_string(pos) + ")");
        pos = t.end;
    }
    if (pos != data_size)
        throw Error(what + ": corrupt safetensors file: tensors cover " + std::to_string(pos) +
                    " data bytes but the file holds " + std::to_string(data_size));
    return h;
}

// ---------------------------------------------------------------------------

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string &path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_errno("cannot open safetensors file '" + path + "'");
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        ::close(fd);
        throw_errno("cannot stat '" + path + "'");
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        throw Error("'" + path + "' is not a regular file");
    }
    std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
    f->path_ = path;
    f->size_ = static_cast<size_t>(st.st_size);
    if (f->size_ > 0) {
        void *m = ::mmap(nullptr, f->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            ::close(fd);
            throw_errno("cannot mmap '" + path + "'");
        }
        f->map_ = static_cast<uint8_t *>(m);
    }
    ::close(fd);
    f->header_ = parse_safetensors(f->map_, f->size_, path);
    for (size_t i = 0; i < f->header_.tensors.size(); ++i)
        f->index_[f->header_.tensors[i].name] = i;
    return f;
}

SafetensorsFile::~SafetensorsFile() {
    if (map_ != nullptr) ::munmap(map_, size_);
}

const TensorInfo *SafetensorsFile::find(const std::string &name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

const TensorInfo &SafetensorsFile::at(const std::string &name) const {
    const TensorInfo *t = find(name);
    if (t == nullptr) throw Error(path_ + ": no tensor named '" + name + "'");
    return *t;
}

uint8_t *SafetensorsFile::data(const TensorInfo &t) const {
    return map_ + header_.data_start + t.begin;
}

// ---------------------------------------------------------------------------

std::string safetensors_header(std::vector<TensorBytes> *tensors,
                               const std::map<std::string, std::string> &metadata) {
    std::set<std::string> names;
    for (const auto &t : *tensors) {
        check(!t.name.empty(), "safetensors: empty tensor name");
        check(t.name != "__metadata__", "safetensors: '__metadata__' is not a tensor name");
        check(names.insert(t.name).second, "safetensors: tensor '" + t.name + "' given twice");
        uint64_t expect = 0;
        check(dtype_size(t.dtype) > 0, "safetensors: tensor '" + t.name + "': bad dtype");
        check(byte_size(t.shape, dtype_size(t.dtype), &expect),
              "safetensors: tensor '" + t.name + "': shape " + shape_text(t.shape) + " invalid");
        check(expect == t.nbytes, "safetensors: tensor '" + t.name + "': shape " +
                                      shape_text(t.shape) + " of " + dtype_name(t.dtype) +
                                      " needs " + std::to_string(expect) + " bytes, given " +
                                      std::to_string(t.nbytes));
        check(t.nbytes == 0 || t.data != nullptr, "safetensors: tensor '" + t.name + "': no data");
    }
    std::stable_sort(tensors->begin(), tensors->end(),
                     [](const TensorBytes &a, const TensorBytes &b) {
                         if (a.dtype != b.dtype) return dtype_rank(a.dtype) > dtype_rank(b.dtype);
                         return a.name < b.name;
                     });
    // Built by hand to fix the key order: __metadata__ first, then data order.
    std::string h = "{";
    bool first = true;
    if (!metadata.empty()) {
        h += "\"__metadata__\":" + json(metadata).dump();
        first = false;
    }
    uint64_t offset = 0;
    for (const auto &t : *tensors) {
        if (!first) h += ",";
        first = false;
        json shape = json::array();
        for (int64_t d : t.shape) shape.push_back(d);
        h += json(t.name).dump() + ":{\"dtype\":\"" + dtype_name(t.dtype) +
             "\",\"shape\":" + shape.dump() + ",\"data_offsets\":[" + std::to_string(offset) + "," +
             std::to_string(offset + t.nbytes) + "]}";
        offset += t.nbytes;
    }
    h += "}";
    h.append((8 - h.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    uint64_t n = h.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return out + h;
}

void write_safetensors(const std::string &path, std::vector<TensorBytes> tensors,
                       const std::map<std::string, std::string> &metadata) {
    const std::string header = safetensors_header(&tensors, metadata);
    AtomicFileWriter w(path);
    w.write(header);
    for (const auto &t : tensors) w.write(t.data, t.nbytes);
    w.commit();
}

// ---------------------------------------------------------------------------

SafetensorsIndex read_safetensors_index(const std::string &path) {
    const json j = parse_json_object(read_file(path), path);
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) throw Error(path + ": missing object 'weight_map'");
    SafetensorsIndex idx;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
        if (!it.value().is_string())
            throw Error(path + ": weight_map['" + it.key() + "'] is not a file name");
        const std::string file = it.value().get<std::string>();
        if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
            throw Error(path + ": weight_map['" + it.key() + "'] = '" + file +
                        "' is not a file name in the model folder");
        idx.weight_map[it.key()] = file;
    }
    auto md = j.find("metadata");
    if (md != j.end() && md->is_object()) {
        for (auto it = md->begin(); it != md->end(); ++it)
            idx.metadata[it.key()] =
                it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
    }
    return idx;
}

std::string safetensors_index_json(const SafetensorsIndex &index, uint64_t total_size) {
    json j;
    j["metadata"] = json::object();
    j["metadata"]["total_size"] = total_size;
    j["weight_map"] = json::object();
    for (const auto &[name, file] : index.weight_map) j["weight_map"][name] = file;
    return j.dump(2, ' ', /*ensure_ascii=*/true) + "\n";
}

} // namespace rl::core
