#include "tinker_wire.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace rl::serve::tinker {

namespace {

[[noreturn]] void bad(const std::string &field, const std::string &message) {
    throw ApiError(400, message, field);
}

// ---- JSON ---------------------------------------------------------------------------------

std::vector<int64_t> int_list(const json &j, const std::string &name) {
    if (!j.is_array()) bad(name, name + " must be a list of integers");
    std::vector<int64_t> out;
    out.reserve(j.size());
    for (size_t i = 0; i < j.size(); ++i) {
        const json &v = j[i];
        if (v.is_number_integer())
            out.push_back(v.get<int64_t>());
        else if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
                 std::abs(v.get<double>()) < 9.0e15)
            out.push_back(static_cast<int64_t>(v.get<double>()));
        else
            bad(name, name + "[" + std::to_string(i) + "] must be an integer, not " + v.dump());
    }
    return out;
}

std::vector<double> float_list(const json &j, const std::string &name) {
    if (!j.is_array()) bad(name, name + " must be a list of numbers");
    std::vector<double> out;
    out.reserve(j.size());
    for (size_t i = 0; i < j.size(); ++i) {
        if (!j[i].is_number())
            bad(name, name + "[" + std::to_string(i) + "] must be a number, not " + j[i].dump());
        out.push_back(j[i].get<double>());
    }
    return out;
}

// The number of values a shape holds; a negative dimension, or a product past
// kMaxTensorValues (which also keeps the product from overflowing), is refused.
int64_t product(const std::vector<int64_t> &shape, const std::string &name) {
    int64_t n = 1;
    for (int64_t d : shape) {
        if (d < 0) bad(name + ".shape", name + ".shape has a negative dimension");
        if (d != 0 && n > kMaxTensorValues / d)
            bad(name + ".shape", name + ".shape " + json(shape).dump() + " holds more than " +
                                     std::to_string(kMaxTensorValues) + " values");
        n *= d;
    }
    return n;
}

// Scatters CSR values into a dense row-major [rows, cols] tensor.
void densify(Tensor &t, const std::vector<int64_t> &crow, const std::vector<int64_t> &col,
             const std::string &name) {
    if (t.shape.size() != 2) bad(name, name + ": a sparse CSR tensor needs a 2-D shape");
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const size_t n = static_cast<size_t>(product(t.shape, name));
    if (static_cast<int64_t>(crow.size()) != rows + 1)
        bad(name, name + ".sparse_crow_indices must hold rows + 1 = " + std::to_string(rows + 1) +
                      " values, not " + std::to_string(crow.size()));
    const size_t nnz = t.numel();
    if (col.size() != nnz || crow.front() != 0 || crow.back() != static_cast<int64_t>(nnz))
        bad(name, name + ": the CSR indices do not match the " + std::to_string(nnz) + " values");
    // Every row's range must lie inside the values before any is read.
    for (int64_t r = 0; r < rows; ++r)
        if (crow[r] > crow[r + 1] || crow[r + 1] > static_cast<int64_t>(nnz))
            bad(name, name + ".sparse_crow_indices[" + std::to_string(r + 1) + "] = " +
                          std::to_string(crow[r + 1]) + " must lie in [" + std::to_string(crow[r]) +
                          ", " + std::to_string(nnz) + "] (non-decreasing, within the values)");
    Tensor d;
    d.is_int = t.is_int;
    d.shape = t.shape;
    if (t.is_int)
        d.ints.assign(n, 0);
    else
        d.floats.assign(n, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = crow[r]; k < crow[r + 1]; ++k) {
            if (col[k] < 0 || col[k] >= cols)
                bad(name, name + ".sparse_col_indices[" + std::to_string(k) +
                              "] = " + std::to_string(col[k]) + " is outside [0, " +
                              std::to_string(cols) + ")");
            const size_t at = static_cast<size_t>(r * cols + col[k]);
            if (t.is_int)
                d.ints[at] = t.ints[k];
            else
                d.floats[at] = t.floats[k];
        }
    }
    t = std::move(d);
}

} // namespace

Tensor tensor_from_json(const json &j, const std::string &name) {
    Tensor t;
    if (j.is_array()) { // xorl: a bare list
        bool all_int = true;
        for (const auto &v : j) all_int = all_int && v.is_number_integer();
        t.is_int = all_int && !j.empty();
        if (t.is_int)
            t.ints = int_list(j, name);
        else
            t.floats = float_list(j, name);
        t.shape = {static_cast<int64_t>(t.numel())};
        return t;
    }
    if (!j.is_object()) bad(name, name + " must be a TensorData object {data, dtype, shape}");
    const auto data = j.find("data");
    if (data == j.end() || data->is_null()) bad(name + ".data", name + ".data is required");
    std::string dtype = "float32";
    if (auto d = j.find("dtype"); d != j.end() && !d->is_null()) {
        if (!d->is_string()) bad(name + ".dtype", name + ".dtype must be a string");
        dtype = d->get<std::string>();
    }
    if (dtype == "int64" || dtype == "int32") {
        t.is_int = true;
        t.ints = int_list(*data, name + ".data");
    } else if (dtype == "float32" || dtype == "float64" || dtype == "bfloat16") {
        t.floats = float_list(*data, name + ".data");
    } else {
        bad(name + ".dtype", name + ".dtype '" + dtype + "' is not one of int64, float32");
    }
    if (auto s = j.find("shape"); s != j.end() && !s->is_null()) {
        t.shape = int_list(*s, name + ".shape");
        product(t.shape, name);
    }
    auto crow = j.find("sparse_crow_indices");
    if (crow != j.end() && !crow->is_null()) {
        auto col = j.find("sparse_col_indices");
        if (col == j.end() || col->is_null())
            bad(name + ".sparse_col_indices",
                name + ".sparse_col_indices is required with sparse_crow_indices");
        densify(t, int_list(*crow, name + ".sparse_crow_indices"),
                int_list(*col, name + ".sparse_col_indices"), name);
        return t;
    }
    if (t.shape.empty()) t.shape = {static_cast<int64_t>(t.numel())};
    if (product(t.shape, name) != static_cast<int64_t>(t.numel()))
        bad(name + ".shape", name + ".shape " + json(t.shape).dump() + " holds " +
                                 std::to_string(product(t.shape, name)) + " values but data has " +
                                 std::to_string(t.numel()));
    return t;
}

std::vector<int64_t> model_input_from_json(const json &j, const std::string &name, bool *xorl) {
    if (xorl) *xorl = false;
    if (!j.is_object()) bad(name, name + " must be an object with 'chunks'");
    if (auto ids = j.find("input_ids"); ids != j.end() && !ids->is_null()) {
        if (xorl) *xorl = true;
        if (ids->is_object()) {
            const Tensor t = tensor_from_json(*ids, name + ".input_ids");
            if (!t.is_int) bad(name + ".input_ids", name + ".input_ids must hold integers");
            return t.ints;
        }
        return int_list(*ids, name + ".input_ids");
    }
    auto chunks = j.find("chunks");
    if (chunks == j.end() || !chunks->is_array())
        bad(name + ".chunks", name + ".chunks must be a list of chunks");
    std::vector<int64_t> tokens;
    for (size_t i = 0; i < chunks->size(); ++i) {
        const json &c = (*chunks)[i];
        const std::string cn = name + ".chunks[" + std::to_string(i) + "]";
        if (!c.is_object()) bad(cn, cn + " must be an object");
        std::string type = "encoded_text";
        if (auto t = c.find("type"); t != c.end() && t->is_string()) type = t->get<std::string>();
        if (type != "encoded_text")
            bad(cn + ".type", cn + " is a '" + type +
                                  "' chunk; this server trains text models only (encoded_text)");
        auto toks = c.find("tokens");
        if (toks == c.end()) bad(cn + ".tokens", cn + ".tokens is required");
        const auto part = int_list(*toks, cn + ".tokens");
        tokens.insert(tokens.end(), part.begin(), part.end());
    }
    return tokens;
}

ForwardBackwardRequest forward_backward_from_json(const json &body, bool forward_only) {
    ForwardBackwardRequest r;
    r.forward_only = forward_only;
    Fields f(body);
    if (auto v = f.string("model_id"))
        r.model_id = *v;
    else if (auto s = f.string("session_id"))
        r.model_id = *s; // xorl maps session_id to model_id
    r.seq_id = f.integer("seq_id", 0, std::numeric_limits<int64_t>::max());
    const char *key = forward_only ? "forward_input" : "forward_backward_input";
    const json *in = f.get(key);
    if (!in || !in->is_object()) bad(key, std::string(key) + " is required (an object)");
    Fields fi(*in, std::string(key) + ".");
    r.loss_fn = fi.string("loss_fn").value_or("cross_entropy");
    const json *cfg = fi.get("loss_fn_config");
    if (!cfg) cfg = fi.get("loss_fn_params");
    if (cfg) {
        if (!cfg->is_object())
            bad(std::string(key) + ".loss_fn_config", "loss_fn_config must be an object");
        r.loss_fn_config = *cfg;
    }
    const json *data = fi.get("data");
    if (!data || !data->is_array())
        bad(std::string(key) + ".data", std::string(key) + ".data must be a list of Datum");
    for (size_t i = 0; i < data->size(); ++i) {
        const json &d = (*data)[i];
        const std::string dn = std::string(key) + ".data[" + std::to_string(i) + "]";
        if (!d.is_object()) bad(dn, dn + " must be a Datum object");
        Datum datum;
        auto mi = d.find("model_input");
        if (mi == d.end()) bad(dn + ".model_input", dn + ".model_input is required");
        datum.tokens = model_input_from_json(*mi, dn + ".model_input", &datum.xorl_input_ids);
        if (auto li = d.find("loss_fn_inputs"); li != d.end() && !li->is_null()) {
            if (!li->is_object())
                bad(dn + ".loss_fn_inputs", dn + ".loss_fn_inputs must be an object");
            for (const auto &item : li->items())
                datum.inputs.emplace_back(
                    item.key(),
                    tensor_from_json(item.value(), dn + ".loss_fn_inputs." + item.key()));
        }
        r.data.push_back(std::move(datum));
    }
    return r;
}

// ---- protobuf -----------------------------------------------------------------------------

namespace {

enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5 };

class Reader {
public:
    Reader(std::string_view s, std::string what)
        : p_(reinterpret_cast<const uint8_t *>(s.data())), end_(p_ + s.size()),
          what_(std::move(what)) {}
    bool done() const { return p_ >= end_; }
    uint64_t varint() {
        uint64_t v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (p_ >= end_) fail("truncated varint");
            const uint8_t b = *p_++;
            v |= static_cast<uint64_t>(b & 0x7f) << shift;
            if (!(b & 0x80)) return v;
        }
        fail("varint longer than 10 bytes");
    }
    void tag(uint32_t &field, uint32_t &wire) {
        const uint64_t t = varint();
        field = static_cast<uint32_t>(t >> 3);
        wire = static_cast<uint32_t>(t & 7);
    }
    std::string_view bytes() {
        const uint64_t n = varint();
        if (n > static_cast<uint64_t>(end_ - p_))
            fail("a length-delimited field runs past the end");
        std::string_view s(reinterpret_cast<const char *>(p_), static_cast<size_t>(n));
        p_ += n;
        return s;
    }
    double f64() {
        double d;
        std::memcpy(&d, fixed(8, "fixed64"), 8);
        return d;
    }
    void skip(uint32_t wire) {
        switch (wire) {
            case kVarint:
                varint();
                return;
            case kFixed64:
                fixed(8, "fixed64");
                return;
            case kLen:
                bytes();
                return;
            case kFixed32:
                fixed(4, "fixed32");
                return;
            default:
                fail("unknown wire type " + std::to_string(wire));
        }
    }
    /// The next `n` bytes (a fixed-size field, `what`), stepped over.
    const uint8_t *fixed(int64_t n, const char *what) {
        if (end_ - p_ < n) fail(std::string("truncated ") + what);
        const uint8_t *at = p_;
        p_ += n;
        return at;
    }
    /// A map entry: its key (field 1, a string), returned, and its value
    /// (field 2 of wire type `wire`), read by read(*this); other fields skipped.
    template <class Read>
    std::string map_entry(uint32_t wire, Read read) {
        std::string key;
        while (!done()) {
            uint32_t f, w;
            tag(f, w);
            if (f == 1 && w == kLen)
                key = std::string(bytes());
            else if (f == 2 && w == wire)
                read(*this);
            else
                skip(w);
        }
        return key;
    }
    void expect(uint32_t wire, uint32_t want, const char *field) const {
        if (wire != want)
            fail(std::string("field ") + field + " has wire type " + std::to_string(wire) +
                 ", expected " + std::to_string(want));
    }
    [[noreturn]] void fail(const std::string &m) const {
        throw ApiError(400, "the protobuf body is malformed (" + what_ + "): " + m);
    }

private:
    const uint8_t *p_;
    const uint8_t *end_;
    std::string what_;
};

template <typename T>
std::vector<T> packed(std::string_view b, const std::string &name) {
    if (b.size() % sizeof(T) != 0)
        bad(name, name + " holds " + std::to_string(b.size()) + " bytes, not a multiple of " +
                      std::to_string(sizeof(T)));
    std::vector<T> out(b.size() / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), b.data(), b.size());
    return out;
}

enum DType { kUnspecified = 0, kFloat32 = 1, kInt64 = 2, kInt32 = 3, kBFloat16 = 4 };

void fill(Tensor &t, int dtype, std::string_view raw, const std::string &name) {
    switch (dtype) {
        case kInt64:
            t.is_int = true;
            t.ints = packed<int64_t>(raw, name);
            return;
        case kInt32: {
            t.is_int = true;
            for (int32_t v : packed<int32_t>(raw, name)) t.ints.push_back(v);
            return;
        }
        case kFloat32:
        case kUnspecified:
            for (float v : packed<float>(raw, name)) t.floats.push_back(v);
            return;
        case kBFloat16:
            for (uint16_t v : packed<uint16_t>(raw, name)) {
                const uint32_t bits = static_cast<uint32_t>(v) << 16;
                float f;
                std::memcpy(&f, &bits, 4);
                t.floats.push_back(f);
            }
            return;
        default:
            bad(name + ".dtype", name + ".dtype " + std::to_string(dtype) + " is not known");
    }
}

Tensor tensor_from_proto(std::string_view b, const std::string &name) {
    Reader r(b, name);
    std::string_view dense, values, crow, col;
    bool sparse = false;
    int dtype = 0;
    std::vector<int64_t> shape;
    while (!r.done()) {
        uint32_t f, w;
        r.tag(f, w);
        if (f == 1) {
            r.expect(w, kLen, "Tensor.dense");
            dense = r.bytes();
        } else if (f == 2) {
            r.expect(w, kLen, "Tensor.sparse_csr");
            sparse = true;
            Reader s(r.bytes(), name + ".sparse_csr");
            while (!s.done()) {
                uint32_t sf, sw;
                s.tag(sf, sw);
                if (sf >= 1 && sf <= 3 && sw == kLen)
                    (sf == 1 ? values : sf == 2 ? crow : col) = s.bytes();
                else
                    s.skip(sw);
            }
        } else if (f == 3) {
            r.expect(w, kVarint, "Tensor.dtype");
            dtype = static_cast<int>(r.varint());
        } else if (f == 4) {
            if (w == kLen) { // packed
                Reader p(r.bytes(), name + ".shape");
                while (!p.done()) shape.push_back(static_cast<int64_t>(p.varint()));
            } else {
                r.expect(w, kVarint, "Tensor.shape");
                shape.push_back(static_cast<int64_t>(r.varint()));
            }
        } else {
            r.skip(w);
        }
    }
    Tensor t;
    fill(t, dtype, sparse ? values : dense, name);
    t.shape = shape;
    if (sparse) {
        densify(t, packed<int64_t>(crow, name + ".crow_indices"),
                packed<int64_t>(col, name + ".col_indices"), name);
        return t;
    }
    if (t.shape.empty()) t.shape = {static_cast<int64_t>(t.numel())};
    if (product(t.shape, name) != static_cast<int64_t>(t.numel()))
        bad(name + ".shape", name + ".shape holds " + std::to_string(product(t.shape, name)) +
                                 " values but the tensor has " + std::to_string(t.numel()));
    return t;
}

Datum datum_from_proto(std::string_view b, const std::string &name) {
    Reader r(b, name);
    Datum d;
    size_t chunk = 0;
    while (!r.done()) {
        uint32_t f, w;
        r.tag(f, w);
        if (f == 1 && w == kLen) { // Chunk
            const std::string cn = name + ".model_input[" + std::to_string(chunk++) + "]";
            Reader c(r.bytes(), cn);
            while (!c.done()) {
                uint32_t cf, cw;
                c.tag(cf, cw);
                if (cf == 1 && cw == kLen) {
                    Reader e(c.bytes(), cn + ".encoded_text");
                    while (!e.done()) {
                        uint32_t ef, ew;
                        e.tag(ef, ew);
                        if (ef == 1 && ew == kLen) {
                            for (int32_t v : packed<int32_t>(e.bytes(), cn + ".tokens"))
                                d.tokens.push_back(v);
                        } else {
                            e.skip(ew);
                        }
                    }
                } else if (cf == 2 || cf == 3) {
                    bad(cn, cn + " is an " + std::string(cf == 2 ? "image" : "audio (dmel)") +
                                " chunk; this server trains text models only (encoded_text)");
                } else {
                    c.skip(cw);
                }
            }
        } else if (f == 2 && w == kLen) { // map<string, Tensor> entry
            Reader e(r.bytes(), name + ".loss_fn_inputs");
            std::string_view value;
            const std::string key = e.map_entry(kLen, [&](Reader &x) { value = x.bytes(); });
            d.inputs.emplace_back(key, tensor_from_proto(value, name + ".loss_fn_inputs." + key));
        } else {
            r.skip(w);
        }
    }
    return d;
}

} // namespace

ForwardBackwardRequest forward_backward_from_proto(std::string_view bytes) {
    ForwardBackwardRequest out;
    Reader r(bytes, "ForwardBackwardRequest");
    json v2 = json::object();
    while (!r.done()) {
        uint32_t f, w;
        r.tag(f, w);
        switch (f) {
            case 1:
                r.expect(w, kLen, "model_id");
                out.model_id = std::string(r.bytes());
                break;
            case 2:
                r.expect(w, kVarint, "seq_id");
                out.seq_id = static_cast<int64_t>(static_cast<int32_t>(r.varint()));
                break;
            case 3:
                r.expect(w, kLen, "data");
                out.data.push_back(
                    datum_from_proto(r.bytes(), "data[" + std::to_string(out.data.size()) + "]"));
                break;
            case 4:
                r.expect(w, kLen, "loss_fn");
                out.loss_fn = std::string(r.bytes());
                break;
            case 5: { // map<string, double>
                r.expect(w, kLen, "loss_fn_config");
                Reader e(r.bytes(), "loss_fn_config");
                double value = 0;
                const std::string key = e.map_entry(kFixed64, [&](Reader &x) { value = x.f64(); });
                out.loss_fn_config[key] = value;
                break;
            }
            case 6:
                r.expect(w, kVarint, "forward_only");
                out.forward_only = r.varint() != 0;
                break;
            case 7: { // map<string, LossConfigValue{number | text}>
                r.expect(w, kLen, "loss_fn_config_v2");
                Reader e(r.bytes(), "loss_fn_config_v2");
                json value;
                const std::string key = e.map_entry(kLen, [&](Reader &x) {
                    Reader v(x.bytes(), "LossConfigValue");
                    while (!v.done()) {
                        uint32_t vf, vw;
                        v.tag(vf, vw);
                        if (vf == 1 && vw == kFixed64)
                            value = v.f64();
                        else if (vf == 2 && vw == kLen)
                            value = std::string(v.bytes());
                        else
                            v.skip(vw);
                    }
                });
                v2[key] = value;
                break;
            }
            default:
                r.skip(w);
        }
    }
    // The SDK writes numbers to both maps; v2 alone carries strings.
    for (const auto &item : v2.items()) out.loss_fn_config[item.key()] = item.value();
    if (out.loss_fn.empty()) out.loss_fn = "cross_entropy";
    return out;
}

namespace {

class Writer {
public:
    void varint(uint64_t v) {
        while (v >= 0x80) {
            out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
            v >>= 7;
        }
        out_.push_back(static_cast<char>(v));
    }
    void tag(uint32_t field, uint32_t wire) { varint((static_cast<uint64_t>(field) << 3) | wire); }
    void bytes(uint32_t field, std::string_view b) {
        tag(field, kLen);
        varint(b.size());
        out_.append(b.data(), b.size());
    }
    void uint(uint32_t field, uint64_t v) {
        tag(field, kVarint);
        varint(v);
    }
    void f64(uint32_t field, double d) {
        tag(field, kFixed64);
        char b[8];
        std::memcpy(b, &d, 8);
        out_.append(b, 8);
    }
    const std::string &str() const { return out_; }

private:
    std::string out_;
};

template <typename T>
std::string raw(const std::vector<T> &v) {
    return std::string(reinterpret_cast<const char *>(v.data()), v.size() * sizeof(T));
}

json tensor_json(const std::vector<float> &v) {
    json data = json::array();
    for (float x : v) data.push_back(std::isfinite(x) ? static_cast<double>(x) : 0.0);
    return {{"data", data}, {"dtype", "float32"}, {"shape", {v.size()}}};
}

} // namespace

json to_json(const ForwardBackwardOutput &out) {
    json outputs = json::array();
    for (const auto &d : out.outputs) {
        json o = json::object();
        for (const auto &f : d) o[f.first] = tensor_json(f.second);
        outputs.push_back(o);
    }
    json metrics = json::object();
    for (const auto &m : out.metrics) metrics[m.first] = std::isfinite(m.second) ? m.second : 0.0;
    return {{"loss_fn_output_type", out.loss_fn_output_type},
            {"loss_fn_outputs", outputs},
            {"metrics", metrics}};
}

std::string to_proto(const ForwardBackwardOutput &out) {
    Writer w;
    w.bytes(1, out.loss_fn_output_type);
    // One ArrayRecord: per field, every datum's values back to back with byte offsets.
    Writer record;
    record.bytes(1, out.loss_fn_output_type);
    if (!out.outputs.empty()) {
        for (const auto &field : out.outputs.front()) {
            const std::string &name = field.first;
            std::vector<float> data;
            std::vector<int64_t> offsets{0};
            for (const auto &d : out.outputs) {
                for (const auto &f : d)
                    if (f.first == name) data.insert(data.end(), f.second.begin(), f.second.end());
                offsets.push_back(static_cast<int64_t>(data.size() * sizeof(float)));
            }
            Writer bt;
            bt.bytes(1, raw(data));
            bt.bytes(2, raw(offsets));
            bt.uint(3, kFloat32);
            Writer entry;
            entry.bytes(1, name);
            entry.bytes(2, bt.str());
            record.bytes(2, entry.str());
        }
    }
    record.uint(3, out.outputs.size());
    w.bytes(2, record.str());
    for (const auto &m : out.metrics) {
        Writer entry;
        entry.bytes(1, m.first);
        entry.f64(2, std::isfinite(m.second) ? m.second : 0.0);
        w.bytes(3, entry.str());
    }
    return w.str();
}

json to_json(const SampleOutput &out) {
    json seqs = json::array();
    for (const auto &s : out.sequences) {
        json lp = json::array();
        for (float x : s.logprobs)
            lp.push_back(std::isfinite(x) ? static_cast<double>(x) : -9999.0);
        seqs.push_back({{"stop_reason", s.stopped_by_length ? "length" : "stop"},
                        {"tokens", s.tokens},
                        {"logprobs", lp}});
    }
    json prompt = nullptr;
    if (out.prompt_logprobs) {
        prompt = json::array();
        for (double x : *out.prompt_logprobs)
            prompt.push_back(std::isfinite(x) ? json(x) : json(nullptr));
    }
    return {{"type", "sample"},
            {"sequences", seqs},
            {"prompt_logprobs", prompt},
            {"topk_prompt_logprobs", nullptr}};
}

std::string to_proto(const SampleOutput &out) {
    Writer w;
    for (const auto &s : out.sequences) {
        Writer seq;
        seq.uint(1, s.stopped_by_length ? 1 : 0);
        std::vector<int32_t> toks(s.tokens.begin(), s.tokens.end());
        seq.bytes(2, raw(toks));
        seq.bytes(3, raw(s.logprobs));
        w.bytes(1, seq.str());
    }
    if (out.prompt_logprobs) {
        std::vector<float> lp;
        for (double x : *out.prompt_logprobs)
            lp.push_back(std::isfinite(x) ? static_cast<float>(x)
                                          : std::numeric_limits<float>::quiet_NaN());
        w.bytes(2, raw(lp));
    }
    return w.str();
}

} // namespace rl::serve::tinker
