// Fuzz target: the protobuf wire of the Tinker training API
// (tinker_public.ForwardBackwardRequest, hand-decoded by
// forward_backward_from_proto: varints, length-delimited fields, packed
// arrays, maps, dense and sparse CSR tensors in four dtypes).
#include "fuzz_target.hpp"
#include "tinker_request.hpp"

#include "serve/tinker_wire.hpp"

#include "rl/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    try {
        const auto fb = rl::serve::tinker::forward_backward_from_proto(
            std::string_view(reinterpret_cast<const char *>(data), size));
        use_request(fb);
    } catch (const rl::serve::ApiError &) {
    } catch (const rl::core::Error &) {
    }
    return 0;
}
