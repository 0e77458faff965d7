#include "routed_experts_wire.hpp"

#include "fields.hpp"

#include "rl/core/text.hpp"

#include <cstring>

namespace rl::serve {

namespace {

std::string shape_text(const std::vector<int64_t> &shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

// Base64 text to bytes; refuses (naming `field`) anything but the alphabet
// and trailing padding.
std::vector<uint8_t> base64_decode(const std::string &s, const std::string &field) {
    auto bytes = core::base64_decode(s);
    if (!bytes) refuse(field, field + " is not valid base64");
    return std::move(*bytes);
}

// Little-endian int32 values of decoded bytes.
std::vector<int32_t> int32_values(const std::vector<uint8_t> &bytes, const std::string &field) {
    if (bytes.size() % 4 != 0)
        refuse(field, field + " decodes to " + std::to_string(bytes.size()) +
                          " bytes, not a whole number of int32 values");
    std::vector<int32_t> v(bytes.size() / 4);
    for (size_t i = 0; i < v.size(); ++i) {
        const uint32_t u = static_cast<uint32_t>(bytes[4 * i]) |
                           static_cast<uint32_t>(bytes[4 * i + 1]) << 8 |
                           static_cast<uint32_t>(bytes[4 * i + 2]) << 16 |
                           static_cast<uint32_t>(bytes[4 * i + 3]) << 24;
        std::memcpy(&v[i], &u, 4);
    }
    return v;
}

// A nested list [rows][layers][k] of integers, flattened; its shape in *shape.
std::vector<int32_t> nested_values(const json &j, const std::string &field,
                                   std::vector<int64_t> *shape) {
    std::vector<int32_t> v;
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
            if (!ids.is_array()) refuse(field, al + " must be a list of expert ids");
            if ((*shape)[2] < 0) (*shape)[2] = static_cast<int64_t>(ids.size());
            if (static_cast<int64_t>(ids.size()) != (*shape)[2])
                refuse(field, al + " has " + std::to_string(ids.size()) + " expert ids, " + field +
                                  "[0][0] " + std::to_string((*shape)[2]));
            for (const json &id : ids) {
                if (!id.is_number_integer() || id.get<int64_t>() < -1 ||
                    id.get<int64_t>() > INT32_MAX)
                    refuse(field, al + " holds " + id.dump() + ", not an expert id");
                v.push_back(static_cast<int32_t>(id.get<int64_t>()));
            }
        }
    }
    return v;
}

} // namespace

void put_routed_experts(json &meta, const std::vector<int32_t> &ids, int64_t tokens, int64_t layers,
                        int64_t k) {
    const int64_t rows = std::max<int64_t>(tokens - 1, 0);
    const size_t n = static_cast<size_t>(rows * layers * k);
    std::vector<uint8_t> bytes(4 * std::min(n, ids.size()));
    for (size_t i = 0; i < bytes.size() / 4; ++i) {
        uint32_t u = 0;
        std::memcpy(&u, &ids[i], 4);
        for (int b = 0; b < 4; ++b) bytes[4 * i + static_cast<size_t>(b)] = (u >> (8 * b)) & 0xFF;
    }
    meta["routed_experts"] = core::base64_encode(bytes.data(), bytes.size());
    meta["routed_expert_meta"] = {{"shape", {rows, layers, k}}, {"dtype", "int32"}};
}

std::vector<int32_t> parse_routed_experts(const json &item, int64_t tokens, int64_t layers,
                                          int64_t k, const std::string &field) {
    std::vector<int32_t> v;
    std::vector<int64_t> shape;
    if (item.is_array()) {
        v = nested_values(item, field, &shape);
    } else if (item.is_object()) {
        if (!item.contains("data") || !item["data"].is_string())
            refuse(field, field + " must carry 'data', a base64 string of int32 expert ids");
        for (const auto &kv : item.items())
            if (kv.key() != "data" && kv.key() != "shape" && kv.key() != "dtype")
                refuse(field,
                       field + " has an unknown key '" + kv.key() + "'; valid: data, shape, dtype");
        if (item.contains("dtype") && item["dtype"] != "int32")
            refuse(field, field + ".dtype must be \"int32\", got " + item["dtype"].dump());
        v = int32_values(base64_decode(item["data"].get<std::string>(), field + ".data"),
                         field + ".data");
        if (item.contains("shape")) {
            const json &s = item["shape"];
            bool ok = s.is_array() && s.size() == 3;
            for (size_t i = 0; ok && i < 3; ++i) ok = s[i].is_number_integer() && s[i] >= 0;
            if (!ok) refuse(field, field + ".shape must be [tokens, layers, k]");
            shape = s.get<std::vector<int64_t>>();
            if (static_cast<int64_t>(v.size()) != shape[0] * shape[1] * shape[2])
                refuse(field, field + ".data holds " + std::to_string(v.size()) +
                                  " ids, its shape " + shape_text(shape) + " " +
                                  std::to_string(shape[0] * shape[1] * shape[2]));
        }
    } else if (item.is_string()) {
        v = int32_values(base64_decode(item.get<std::string>(), field), field);
    } else {
        refuse(field, field + " must be a nested list [tokens][layers][k], an object "
                              "{data, shape} or a base64 string of int32 ids");
    }
    const int64_t row = layers * k;
    if (shape.empty()) { // a bare base64 string: the model's layers and k
        if (row <= 0 || static_cast<int64_t>(v.size()) % row != 0)
            refuse(field, field + " holds " + std::to_string(v.size()) +
                              " ids, not a whole number of tokens of " + std::to_string(layers) +
                              " layers x " + std::to_string(k) + " experts");
        shape = {static_cast<int64_t>(v.size()) / row, layers, k};
    }
    if (v.empty() && shape[0] == 0) shape = {0, layers, k};
    if ((shape[0] != tokens && shape[0] != tokens - 1) || shape[1] != layers || shape[2] != k)
        refuse(field, field + " must be [" + std::to_string(tokens) + ", " +
                          std::to_string(layers) + ", " + std::to_string(k) + "] (tokens, " +
                          "sparse layers, experts per token; or " + std::to_string(tokens - 1) +
                          " tokens, the last one never forwarded), got " + shape_text(shape));
    v.resize(static_cast<size_t>(tokens * row), -1);
    return v;
}

std::vector<int32_t> request_routed_experts(const json &body, const std::string &input_key,
                                            const std::vector<int64_t> &cu, int64_t layers,
                                            int64_t k) {
    const json *in =
        body.contains(input_key) && body[input_key].is_object() ? &body[input_key] : nullptr;
    auto find = [&](const char *key, std::string *field) -> const json * {
        if (in && in->contains(key) && !(*in)[key].is_null()) {
            *field = input_key + "." + key;
            return &(*in)[key];
        }
        if (body.contains(key) && !body[key].is_null()) {
            *field = key;
            return &body[key];
        }
        return nullptr;
    };
    std::string field;
    if (find("routed_expert_logits", &field))
        refuse(field, field + ": recorded routing weights are not supported; the replay weights "
                              "each token by the current router's probabilities at the replayed "
                              "experts (send routed_experts only)");
    const json *re = find("routed_experts", &field);
    if (!re) return {};
    if (layers <= 0)
        refuse(field, field + " replays a mixture-of-experts routing but the model has no sparse "
                              "MoE layer");
    const size_t datums = cu.empty() ? 0 : cu.size() - 1;
    if (!re->is_array() || re->size() != datums)
        refuse(field, field + " must be a list with one routing per datum (" +
                          std::to_string(datums) + "), got " +
                          (re->is_array() ? std::to_string(re->size()) + " items"
                                          : std::string(re->type_name())));
    std::vector<int32_t> out;
    out.reserve(static_cast<size_t>(cu.back() * layers * k));
    for (size_t i = 0; i < datums; ++i) {
        const int64_t tokens = cu[i + 1] - cu[i];
        const json &item = (*re)[i];
        if (item.is_null()) {
            out.insert(out.end(), static_cast<size_t>(tokens * layers * k), -1);
            continue;
        }
        const std::vector<int32_t> v =
            parse_routed_experts(item, tokens, layers, k, field + "[" + std::to_string(i) + "]");
        out.insert(out.end(), v.begin(), v.end());
    }
    return out;
}

} // namespace rl::serve
