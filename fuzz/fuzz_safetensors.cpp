// Fuzz target: the safetensors header (8-byte little-endian length, JSON
// header, tensor bytes) as SafetensorsFile reads it from a mapped file.
#include "fuzz_target.hpp"

#include "rl/core/error.hpp"
#include "rl/core/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    try {
        const rl::core::SafetensorsHeader h = rl::core::parse_safetensors(data, size, "fuzz");
        // What the loaders do with an accepted header: sizes, element counts,
        // dtype names, and the bytes of every tensor (inside the input).
        size_t sum = 0;
        for (const auto &t : h.tensors) {
            sum += t.nbytes() + static_cast<size_t>(t.numel()) + rl::core::dtype_size(t.dtype);
            sum += std::string(rl::core::dtype_name(t.dtype)).size() + t.name.size();
            // The first and last byte of its data: inside the input (ASan
            // reports a read past libFuzzer's exactly-sized buffer).
            if (t.nbytes() > 0) {
                const uint8_t *bytes = data + h.data_start + t.begin;
                sum += bytes[0] + bytes[t.nbytes() - 1];
            }
        }
        for (const auto &[key, value] : h.metadata) sum += key.size() + value.size();
        volatile size_t sink = sum;
        (void)sink;
    } catch (const rl::core::Error &) {
    }
    return 0;
}
