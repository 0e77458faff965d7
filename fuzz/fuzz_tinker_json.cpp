// Fuzz target: the JSON wire of the Tinker training API: a request body as
// the server reads it (json_body), then forward_backward_from_json (the
// body of /api/v1/forward_backward, or of /api/v1/forward when it holds
// "forward_input"): model inputs, TensorData (dense and sparse CSR), xorl's
// dialect, loss_fn_config.
#include "fuzz_target.hpp"
#include "tinker_request.hpp"

#include "serve/tinker_wire.hpp"

#include "rl/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rl::serve::Request req;
    req.method = "POST";
    req.body = fuzz_text(data, size);
    try {
        const rl::serve::json body = rl::serve::json_body(req);
        const bool forward_only = body.contains("forward_input");
        req.path = forward_only ? "/api/v1/forward" : "/api/v1/forward_backward";
        const auto fb = rl::serve::tinker::forward_backward_from_json(body, forward_only);
        use_request(fb);
    } catch (const rl::serve::ApiError &) {
    } catch (const rl::core::Error &) {
    }
    return 0;
}
