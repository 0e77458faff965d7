// Fuzz target: mixture-of-experts routings (R3) on the training server's wire
// (serve/routed_experts_wire.hpp): a forward_backward body as the server reads
// it (json_body), its "routed_experts" packed over fixed datum lengths for an
// MoE shape and for a dense model (request_routed_experts), every item of it
// read alone (parse_routed_experts: nested lists, {data, shape, dtype} with
// base64 data, bare base64), its "routed_expert_logits" against them
// (request_routed_expert_logits: the same forms in float32), and the
// meta_info encodings of what it decoded.
#include "fuzz_target.hpp"
#include "serve_request.hpp"

#include "serve/fields.hpp"
#include "serve/routed_experts_wire.hpp"

#include "rl/core/error.hpp"

#include <vector>

namespace {

// Two datums of 5 and 4 tokens; 2 sparse layers, top-2 (and a dense model).
const std::vector<int64_t> kCu = {0, 5, 9};
constexpr int64_t kLayers = 2, kK = 2;

template <class F>
void refused_or_done(F &&f) {
    try {
        f();
    } catch (const rl::serve::ApiError &) {
    } catch (const rl::core::Error &) {
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const rl::serve::Request req = post_request("/api/v1/forward_backward", data, size);
    refused_or_done([&] {
        const rl::serve::json body = rl::serve::json_body(req);
        refused_or_done([&] {
            std::vector<int64_t> rows;
            const std::vector<int32_t> ids = rl::serve::request_routed_experts(
                body, "forward_backward_input", kCu, kLayers, kK, &rows);
            rl::serve::json meta;
            if (!ids.empty()) rl::serve::put_routed_experts(meta, ids, kCu.back(), kLayers, kK);
            const std::vector<float> weights = rl::serve::request_routed_expert_logits(
                body, "forward_backward_input", kCu, kLayers, kK, rows);
            if (!weights.empty())
                rl::serve::put_expert_logits(meta, weights, kCu.back(), kLayers, kK);
        });
        refused_or_done(
            [&] { rl::serve::request_routed_experts(body, "forward_backward_input", kCu, 0, 0); });
        const rl::serve::json *items = nullptr;
        if (body.is_object()) {
            auto in = body.find("forward_backward_input");
            if (in != body.end() && in->is_object() && in->contains("routed_experts"))
                items = &(*in)["routed_experts"];
            else if (body.contains("routed_experts"))
                items = &body["routed_experts"];
        }
        if (items && items->is_array())
            for (size_t i = 0; i < items->size() && i < 8; ++i)
                refused_or_done([&] {
                    rl::serve::parse_routed_experts((*items)[i], 5, kLayers, kK,
                                                    "routed_experts[" + std::to_string(i) + "]");
                });
    });
    return 0;
}
