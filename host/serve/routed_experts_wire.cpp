#include "routed_experts_wire.hpp"

#include "fields.hpp"

#include "rl/core/text.hpp"

#include <cmath>
#include <cstring>

namespace rl::serve {

namespace {

// Base64 text to bytes; refuses (naming `field`) anything but the alphabet
// and trailing padding.
std::vector<uint8_t> base64_decode(const std::string &s, const std::string &field) {
    auto bytes = core::base64_decode(s);
    if (!bytes) refuse(field, field + " is not valid base64");
    return std::move(*bytes);
}

// Little-endian 32-bit values of decoded bytes (int32 or float32: `what`
// names them in errors).
template <class V>
std::vector<V> le32_values(const std::vector<uint8_t> &bytes, const std::string &field,
                           const char *what) {
    static_assert(sizeof(V) == 4);
    if (bytes.size() % 4 != 0)
        refuse(field, field + " decodes to " + std::to_string(bytes.size()) +
                          " bytes, not a whole number of " + what + " values");
    std::vector<V> v(bytes.size() / 4);
    for (size_t i = 0; i < v.size(); ++i) {
        const uint32_t u = static_cast<uint32_t>(bytes[4 * i]) |
                           static_cast<uint32_t>(bytes[4 * i + 1]) << 8 |
                           static_cast<uint32_t>(bytes[4 * i + 2]) << 16 |
                           static_cast<uint32_t>(bytes[4 * i + 3]) << 24;
        std::memcpy(&v[i], &u, 4);
    }
    return v;
}

// The little-endian bytes of 32-bit values, base64.
template <class V>
std::string base64_le32(const V *values, size_t n) {
    static_assert(sizeof(V) == 4);
    std::vector<uint8_t> bytes(4 * n);
    for (size_t i = 0; i < n; ++i) {
        uint32_t u = 0;
        std::memcpy(&u, &values[i], 4);
        for (int b = 0; b < 4; ++b) bytes[4 * i + static_cast<size_t>(b)] = (u >> (8 * b)) & 0xFF;
    }
    return core::base64_encode(bytes.data(), bytes.size());
}

// Expert ids and routing weights: what an item holds, how one value is read
// from a nested list, the dtype of its base64 form.
struct IdValues {
    using Value = int32_t;
    static constexpr const char *dtype = "int32";
    static constexpr const char *noun = "expert ids";
    static bool read(const json &j, int32_t *out) {
        if (!j.is_number_integer() || j.get<int64_t>() < -1 || j.get<int64_t>() > INT32_MAX)
            return false;
        *out = static_cast<int32_t>(j.get<int64_t>());
        return true;
    }
};
struct WeightValues {
    using Value = float;
    static constexpr const char *dtype = "float32";
    static constexpr const char *noun = "routing weights";
    static bool read(const json &j, float *out) {
        if (!j.is_number()) return false;
        *out = static_cast<float>(j.get<double>());
        return true;
    }
};

// A nested list [rows][layers][k] of values, flattened; its shape in *shape.
template <class Kind>
std::vector<typename Kind::Value> nested_values(const json &j, const std::string &field,
                                                std::vector<int64_t> *shape) {
    std::vector<typename Kind::Value> v;
    shape->assign({static_cast<int64_t>(j.size()), -1, -1});
    for (size_t t = 0; t < j.size(); ++t) {
        const json &row = j[t];
        const std::string at = field + "[" + std::to_string(t) + "]";
        if (!row.is_array()) refuse(field, at + " must be a list of sparse layers");
        if ((*shape)[1] < 0) (*shape)[1] = static_cast<int64_t>(row.size());
        if (static_cast<int64_t>(row.size()) != (*shape)[1])
            refuse(field, at + " has " + std::to_string(row.size()) + " layers, " + field + "[0] " +
                              std::to_string((*shape)[1]));
        for (size_t l = 0; l < row.size(); ++l) {
            const json &ids = row[l];
            const std::string al = at + "[" + std::to_string(l) + "]";
            if (!ids.is_array()) refuse(field, al + " must be a list of " + Kind::noun);
            if ((*shape)[2] < 0) (*shape)[2] = static_cast<int64_t>(ids.size());
            if (static_cast<int64_t>(ids.size()) != (*shape)[2])
                refuse(field, al + " has " + std::to_string(ids.size()) + " " + Kind::noun + ", " +
                                  field + "[0][0] " + std::to_string((*shape)[2]));
            for (const json &id : ids) {
                typename Kind::Value x{};
                if (!Kind::read(id, &x))
                    refuse(field, al + " holds " + id.dump() + ", not one of the " + Kind::noun);
                v.push_back(x);
            }
        }
    }
    return v;
}

// One datum's item (nested list, {data, shape, dtype} or bare base64) of
// `tokens` (or tokens - 1) rows of layers x k values, flattened, the missing
// last row filled with `fill`.
template <class Kind>
std::vector<typename Kind::Value> parse_item(const json &item, int64_t tokens, int64_t layers,
                                             int64_t k, const std::string &field,
                                             typename Kind::Value fill, int64_t *rows) {
    using Value = typename Kind::Value;
    const std::string what = std::string(Kind::dtype) + " " + Kind::noun;
    std::vector<Value> v;
    std::vector<int64_t> shape;
    if (item.is_array()) {
        v = nested_values<Kind>(item, field, &shape);
    } else if (item.is_object()) {
        if (!item.contains("data") || !item["data"].is_string())
            refuse(field, field + " must carry 'data', a base64 string of " + what);
        for (const auto &kv : item.items())
            if (kv.key() != "data" && kv.key() != "shape" && kv.key() != "dtype")
                refuse(field,
                       field + " has an unknown key '" + kv.key() + "'; valid: data, shape, dtype");
        if (item.contains("dtype") && item["dtype"] != Kind::dtype)
            refuse(field,
                   field + ".dtype must be \"" + Kind::dtype + "\", got " + item["dtype"].dump());
        v = le32_values<Value>(base64_decode(item["data"].get<std::string>(), field + ".data"),
                               field + ".data", Kind::dtype);
        if (item.contains("shape")) {
            const json &s = item["shape"];
            bool ok = s.is_array() && s.size() == 3;
            for (size_t i = 0; ok && i < 3; ++i) ok = s[i].is_number_integer() && s[i] >= 0;
            if (!ok) refuse(field, field + ".shape must be [tokens, layers, k]");
            shape = s.get<std::vector<int64_t>>();
            if (static_cast<int64_t>(v.size()) != shape[0] * shape[1] * shape[2])
                refuse(field, field + ".data holds " + std::to_string(v.size()) + " values, its " +
                                  "shape " + core::shape_text(shape) + " " +
                                  std::to_string(shape[0] * shape[1] * shape[2]));
        }
    } else if (item.is_string()) {
        v = le32_values<Value>(base64_decode(item.get<std::string>(), field), field, Kind::dtype);
    } else {
        refuse(field, field +
                          " must be a nested list [tokens][layers][k], an object "
                          "{data, shape} or a base64 string of " +
                          what);
    }
    const int64_t row = layers * k;
    if (shape.empty()) { // a bare base64 string: the model's layers and k
        if (row <= 0 || static_cast<int64_t>(v.size()) % row != 0)
            refuse(field, field + " holds " + std::to_string(v.size()) +
                              " values, not a whole number of tokens of " + std::to_string(layers) +
                              " layers x " + std::to_string(k) + " experts");
        shape = {static_cast<int64_t>(v.size()) / row, layers, k};
    }
    if (v.empty() && shape[0] == 0) shape = {0, layers, k};
    if ((shape[0] != tokens && shape[0] != tokens - 1) || shape[1] != layers || shape[2] != k)
        refuse(field, field + " must be [" + std::to_string(tokens) + ", " +
                          std::to_string(layers) + ", " + std::to_string(k) + "] (tokens, " +
                          "sparse layers, experts per token; or " + std::to_string(tokens - 1) +
                          " tokens, the last one never forwarded), got " + core::shape_text(shape));
    if (rows != nullptr) *rows = shape[0];
    v.resize(static_cast<size_t>(tokens * row), fill);
    return v;
}

// The request's value of `key`: in the input object (xorl's
// ForwardBackwardInput) or at the top level; null when absent or null.
const json *request_field(const json &body, const std::string &input_key, const char *key,
                          std::string *field) {
    const json *in =
        body.contains(input_key) && body[input_key].is_object() ? &body[input_key] : nullptr;
    if (in && in->contains(key) && !(*in)[key].is_null()) {
        *field = input_key + "." + key;
        return &(*in)[key];
    }
    if (body.contains(key) && !body[key].is_null()) {
        *field = key;
        return &body[key];
    }
    return nullptr;
}

// One item per datum, or a 400 naming `field`.
void check_per_datum(const json &items, const std::string &field, const char *noun, size_t datums) {
    if (!items.is_array() || items.size() != datums)
        refuse(field, field + " must be a list with one " + noun + " per datum (" +
                          std::to_string(datums) + "), got " +
                          (items.is_array() ? std::to_string(items.size()) + " items"
                                            : std::string(items.type_name())));
}

} // namespace

void put_routed_experts(json &meta, const std::vector<int32_t> &ids, int64_t tokens, int64_t layers,
                        int64_t k) {
    const int64_t rows = std::max<int64_t>(tokens - 1, 0);
    const size_t n = static_cast<size_t>(rows * layers * k);
    meta["routed_experts"] = base64_le32(ids.data(), std::min(n, ids.size()));
    meta["routed_expert_meta"] = {{"shape", {rows, layers, k}}, {"dtype", "int32"}};
}

void put_expert_logits(json &meta, const std::vector<float> &weights, int64_t tokens,
                       int64_t layers, int64_t k) {
    const int64_t rows = std::max<int64_t>(tokens - 1, 0);
    const size_t n = static_cast<size_t>(rows * layers * k);
    meta["expert_logits"] = base64_le32(weights.data(), std::min(n, weights.size()));
    meta["expert_logits_meta"] = {{"shape", {rows, layers, k}}, {"dtype", "float32"}};
}

std::vector<int32_t> parse_routed_experts(const json &item, int64_t tokens, int64_t layers,
                                          int64_t k, const std::string &field) {
    return parse_item<IdValues>(item, tokens, layers, k, field, -1, nullptr);
}

std::vector<float> parse_expert_logits(const json &item, int64_t tokens, int64_t layers, int64_t k,
                                       const std::string &field, int64_t *rows) {
    std::vector<float> v = parse_item<WeightValues>(item, tokens, layers, k, field, 0.0f, rows);
    for (size_t j = 0; j < v.size(); ++j)
        if (!std::isfinite(v[j])) {
            const int64_t x = static_cast<int64_t>(j);
            refuse(field, field + " at token " + std::to_string(x / (layers * k)) +
                              ", sparse layer " + std::to_string(x / k % layers) + ", slot " +
                              std::to_string(x % k) + ": " + std::to_string(v[j]) +
                              " is not a finite routing weight");
        }
    return v;
}

std::vector<int32_t> request_routed_experts(const json &body, const std::string &input_key,
                                            const std::vector<int64_t> &cu, int64_t layers,
                                            int64_t k, std::vector<int64_t> *rows) {
    std::string field;
    const json *re = request_field(body, input_key, "routed_experts", &field);
    if (!re) return {};
    if (layers <= 0)
        refuse(field, field + " replays a mixture-of-experts routing but the model has no sparse "
                              "MoE layer");
    const size_t datums = cu.empty() ? 0 : cu.size() - 1;
    check_per_datum(*re, field, "routing", datums);
    std::vector<int32_t> out;
    out.reserve(static_cast<size_t>(cu.back() * layers * k));
    if (rows != nullptr) rows->assign(datums, -1);
    for (size_t i = 0; i < datums; ++i) {
        const int64_t tokens = cu[i + 1] - cu[i];
        const json &item = (*re)[i];
        if (item.is_null()) {
            out.insert(out.end(), static_cast<size_t>(tokens * layers * k), -1);
            continue;
        }
        const std::vector<int32_t> v =
            parse_item<IdValues>(item, tokens, layers, k, field + "[" + std::to_string(i) + "]", -1,
                                 rows != nullptr ? &(*rows)[i] : nullptr);
        out.insert(out.end(), v.begin(), v.end());
    }
    return out;
}

std::vector<float> request_routed_expert_logits(const json &body, const std::string &input_key,
                                                const std::vector<int64_t> &cu, int64_t layers,
                                                int64_t k, const std::vector<int64_t> &rows) {
    std::string field;
    const json *rw = request_field(body, input_key, "routed_expert_logits", &field);
    if (!rw) return {};
    if (layers <= 0)
        refuse(field, field + " weighs a mixture-of-experts routing but the model has no sparse "
                              "MoE layer");
    const size_t datums = cu.empty() ? 0 : cu.size() - 1;
    if (rows.empty())
        refuse(field, field + " (recorded routing weights) needs routed_experts, the expert ids "
                              "they weigh");
    check_per_datum(*rw, field, "routing-weight array", datums);
    std::vector<float> out;
    out.reserve(static_cast<size_t>(cu.back() * layers * k));
    for (size_t i = 0; i < datums; ++i) {
        const int64_t tokens = cu[i + 1] - cu[i];
        const json &item = (*rw)[i];
        const std::string at = field + "[" + std::to_string(i) + "]";
        if (item.is_null() != (rows[i] < 0))
            refuse(at, at +
                           (item.is_null() ? " is null but routed_experts["
                                           : " is given but routed_experts[") +
                           std::to_string(i) + (item.is_null() ? "] is not" : "] is null") +
                           ": send a datum's ids and weights together");
        if (item.is_null()) {
            out.insert(out.end(), static_cast<size_t>(tokens * layers * k), 0.0f);
            continue;
        }
        int64_t n = 0;
        const std::vector<float> v = parse_expert_logits(item, tokens, layers, k, at, &n);
        if (n != rows[i])
            refuse(at, at + " has " + std::to_string(n) + " tokens but routed_experts[" +
                           std::to_string(i) + "] " + std::to_string(rows[i]) +
                           "; the weights must have the shape of the ids they weigh");
        out.insert(out.end(), v.begin(), v.end());
    }
    return out;
}

} // namespace rl::serve
