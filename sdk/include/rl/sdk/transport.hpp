// rl/sdk/transport.hpp: the wire format every transport plugin shares
// (docs/transports.md), so a message means the same over any of them.
//
// A message is a JSON header object plus named tensors. On the wire the
// header gains a reserved key "tensors": one entry per tensor, in order,
//   {"name", "dtype" ("float32", "bfloat16", "int64", ...), "shape", "nbytes", "crc32c"}
// followed by the tensors' bytes (C-contiguous, little-endian, CPU). The
// receiver checks every field and every checksum before it hands anything
// over: a malformed header or a corrupted tensor is an error naming it, never
// a wrong number.
#pragma once

#include <rl_plugin.h>

#include "error.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace rl::sdk::transport {

using json = nlohmann::json;

// ---- CRC-32C (Castagnoli), slicing-by-8 -------------------------------------

namespace detail {
struct Crc32cTables {
    uint32_t t[8][256];
    Crc32cTables() {
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
            t[0][i] = c;
        }
        for (uint32_t i = 0; i < 256; ++i)
            for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
};
inline const Crc32cTables &crc_tables() {
    static const Crc32cTables tables;
    return tables;
}
} // namespace detail

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RL_SDK_CRC32C_HW 1
namespace detail {
// The SSE 4.2 CRC32 instruction computes CRC-32C, 8 bytes at a time.
__attribute__((target("sse4.2"))) inline uint32_t crc32c_sse42(const uint8_t *p, size_t n,
                                                               uint32_t crc) {
    uint64_t c = ~crc;
    while (n >= 8) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = static_cast<uint32_t>(c);
    while (n-- > 0) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}
inline bool have_sse42() {
    static const bool yes = __builtin_cpu_supports("sse4.2");
    return yes;
}
} // namespace detail
#endif

/// CRC-32C of `n` bytes in software (continuing `crc`, 0 to start).
inline uint32_t crc32c_portable(const void *data, size_t n, uint32_t crc = 0) {
    const auto &T = detail::crc_tables().t;
    const auto *p = static_cast<const uint8_t *>(data);
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo, hi;
        std::memcpy(&lo, p, 4);
        std::memcpy(&hi, p + 4, 4);
        lo ^= crc;
        crc = T[7][lo & 0xFF] ^ T[6][(lo >> 8) & 0xFF] ^ T[5][(lo >> 16) & 0xFF] ^ T[4][lo >> 24] ^
              T[3][hi & 0xFF] ^ T[2][(hi >> 8) & 0xFF] ^ T[1][(hi >> 16) & 0xFF] ^ T[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n-- > 0) crc = (crc >> 8) ^ T[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

/// CRC-32C of `n` bytes (continuing `crc`, 0 to start): the CPU's instruction
/// when it has one, else crc32c_portable; the same value either way.
inline uint32_t crc32c(const void *data, size_t n, uint32_t crc = 0) {
#ifdef RL_SDK_CRC32C_HW
    if (detail::have_sse42())
        return detail::crc32c_sse42(static_cast<const uint8_t *>(data), n, crc);
#endif
    return crc32c_portable(data, n, crc);
}

// ---- dtypes --------------------------------------------------------------------

namespace detail {

// The wire names of the tensor dtypes, both ways.
struct WireDtype {
    const char *name;
    rl_dtype_t d;
};
inline constexpr WireDtype kWireDtypes[] = {
    {"float16", {RL_DTYPE_FLOAT, 16, 1}}, {"float32", {RL_DTYPE_FLOAT, 32, 1}},
    {"float64", {RL_DTYPE_FLOAT, 64, 1}}, {"bfloat16", {RL_DTYPE_BFLOAT, 16, 1}},
    {"int8", {RL_DTYPE_INT, 8, 1}},       {"int16", {RL_DTYPE_INT, 16, 1}},
    {"int32", {RL_DTYPE_INT, 32, 1}},     {"int64", {RL_DTYPE_INT, 64, 1}},
    {"uint8", {RL_DTYPE_UINT, 8, 1}},     {"bool", {RL_DTYPE_BOOL, 8, 1}}};

} // namespace detail

/// "float32", "bfloat16", "int64", ...; "" for a dtype without a wire name.
inline std::string dtype_name(rl_dtype_t d) {
    for (const auto &e : detail::kWireDtypes)
        if (e.d.code == d.code && e.d.bits == d.bits && e.d.lanes == d.lanes) return e.name;
    return "";
}

inline bool dtype_from_name(const std::string &s, rl_dtype_t *out) {
    for (const auto &e : detail::kWireDtypes)
        if (s == e.name) {
            *out = e.d;
            return true;
        }
    return false;
}

// ---- sending ---------------------------------------------------------------------

/// One tensor of an outgoing message: where its bytes are.
struct OutTensor {
    std::string name;
    const uint8_t *data = nullptr;
    uint64_t nbytes = 0;
};

/// The wire header of `message` (the caller's header plus "tensors") and the
/// tensors' byte ranges. Refuses a header that is not a JSON object or uses
/// the reserved key, and tensors that are not contiguous CPU tensors.
inline std::string encode_header(const rl_message_view_t &message, std::vector<OutTensor> *out) {
    const std::string_view text(message.header.data ? message.header.data : "",
                                static_cast<size_t>(message.header.length));
    json h = text.empty() ? json::object() : json::parse(text, nullptr, false);
    if (h.is_discarded() || !h.is_object())
        fail(RL_ERR_INVALID_ARG, "message header must be a JSON object");
    if (h.contains("tensors"))
        fail(RL_ERR_INVALID_ARG, "message header key 'tensors' is reserved for the transport");
    json metas = json::array();
    for (uint64_t i = 0; i < message.tensors.count; ++i) {
        const rl_tensor_arg_t &a = message.tensors.items[i];
        const std::string name = a.name ? a.name : "";
        if (name.empty())
            fail(RL_ERR_INVALID_ARG, "message tensor " + std::to_string(i) + " has no name");
        const rl_tensor_view_t &v = a.view;
        if (v.device.type != RL_DEVICE_CPU)
            fail(RL_ERR_INVALID_ARG, "message tensor '" + name + "' is not in CPU memory");
        const std::string dt = dtype_name(v.dtype);
        if (dt.empty())
            fail(RL_ERR_INVALID_ARG, "message tensor '" + name + "' has an unsupported dtype");
        int64_t numel = 1;
        json shape = json::array();
        for (int32_t d = 0; d < v.ndim; ++d) {
            numel *= v.shape[d];
            shape.push_back(v.shape[d]);
        }
        if (v.strides != nullptr) {
            int64_t expect = 1;
            for (int32_t d = v.ndim - 1; d >= 0; --d) {
                if (v.shape[d] != 1 && v.strides[d] != expect)
                    fail(RL_ERR_INVALID_ARG, "message tensor '" + name + "' is not contiguous");
                expect *= v.shape[d];
            }
        }
        OutTensor o;
        o.name = name;
        o.nbytes = static_cast<uint64_t>(numel) * (v.dtype.bits / 8u);
        o.data = static_cast<const uint8_t *>(v.data) + v.byte_offset;
        metas.push_back({{"name", name},
                         {"dtype", dt},
                         {"shape", shape},
                         {"nbytes", o.nbytes},
                         {"crc32c", crc32c(o.data, o.nbytes)}});
        out->push_back(std::move(o));
    }
    h["tensors"] = std::move(metas);
    return h.dump();
}

// ---- receiving -----------------------------------------------------------------------

/// One tensor announced by a received header.
struct InTensor {
    std::string name;
    rl_dtype_t dtype{};
    std::vector<int64_t> shape;
    uint64_t nbytes = 0;
    uint32_t crc = 0;
};

/// Parses a received wire header: the caller's header (without "tensors")
/// and the announced tensors. `where` names the message in errors.
inline std::string decode_header(std::string_view text, std::vector<InTensor> *out,
                                 const std::string &where) {
    auto bad = [&](const std::string &msg) {
        fail(RL_ERR_INVALID_ARG, where + ": malformed header: " + msg);
    };
    json h = json::parse(text, nullptr, false);
    if (h.is_discarded() || !h.is_object()) bad("not a JSON object");
    if (!h.contains("tensors") || !h["tensors"].is_array()) bad("no 'tensors' array");
    for (const auto &m : h["tensors"]) {
        if (!m.is_object()) bad("a 'tensors' entry is not an object");
        InTensor t;
        if (!m.contains("name") || !m["name"].is_string()) bad("a tensor without a 'name'");
        t.name = m["name"].get<std::string>();
        const std::string who = "tensor '" + t.name + "'";
        if (!m.contains("dtype") || !m["dtype"].is_string() ||
            !dtype_from_name(m["dtype"].get<std::string>(), &t.dtype))
            bad(who + " has no valid 'dtype'");
        if (!m.contains("shape") || !m["shape"].is_array()) bad(who + " has no 'shape'");
        uint64_t numel = 1;
        for (const auto &d : m["shape"]) {
            if (!d.is_number_integer() || d.get<int64_t>() < 0) bad(who + " has a bad dimension");
            t.shape.push_back(d.get<int64_t>());
            numel *= static_cast<uint64_t>(d.get<int64_t>());
        }
        if (!m.contains("nbytes") || !m["nbytes"].is_number_unsigned() ||
            m["nbytes"].get<uint64_t>() != numel * (t.dtype.bits / 8u))
            bad(who + ": 'nbytes' does not match its shape and dtype");
        t.nbytes = m["nbytes"].get<uint64_t>();
        if (!m.contains("crc32c") || !m["crc32c"].is_number_unsigned())
            bad(who + " has no 'crc32c'");
        t.crc = m["crc32c"].get<uint32_t>();
        out->push_back(std::move(t));
    }
    h.erase("tensors");
    return h.dump();
}

/// Checks a tensor's bytes against its announced checksum.
inline void verify(const InTensor &t, const uint8_t *data, const std::string &where) {
    if (crc32c(data, t.nbytes) != t.crc)
        fail(RL_ERR_INVALID_ARG, where + ": checksum mismatch in tensor '" + t.name +
                                     "' (corrupted in transit or on disk); the message is refused");
}

/// A view of received bytes as the announced tensor (valid while `data` is).
inline rl_tensor_view_t view_of(const InTensor &t, const uint8_t *data) {
    rl_tensor_view_t v{};
    v.data = const_cast<uint8_t *>(data);
    v.device = {RL_DEVICE_CPU, 0};
    v.ndim = static_cast<int32_t>(t.shape.size());
    v.dtype = t.dtype;
    v.shape = const_cast<int64_t *>(t.shape.data());
    v.strides = nullptr;
    v.byte_offset = 0;
    return v;
}

} // namespace rl::sdk::transport
