// Fuzz target: the protobuf wire of the Tinker training API
// (tinker_public.ForwardBackwardRequest, hand-decoded by
// forward_backward_from_proto: varints, length-delimited fields, packed
// arrays, maps, dense and sparse CSR tensors in four dtypes).
#include "fuzz_target.hpp"

#include "serve/tinker_wire.hpp"

#include "rl/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    try {
        const auto fb = rl::serve::tinker::forward_backward_from_proto(
            std::string_view(reinterpret_cast<const char *>(data), size));
        double sum = 0;
        for (const auto &d : fb.data) {
            sum += static_cast<double>(d.tokens.size());
            for (const auto &[name, t] : d.inputs)
                for (size_t i = 0; i < t.numel(); ++i) sum += t.at(i);
        }
        volatile double sink = sum;
        (void)sink;
        // Map keys and text values come from the bytes as they are (any
        // UTF-8, or none): the server's dump replaces what is invalid.
        (void)rl::serve::dump(fb.loss_fn_config);
    } catch (const rl::serve::ApiError &) {
    } catch (const rl::core::Error &) {
    }
    return 0;
}
