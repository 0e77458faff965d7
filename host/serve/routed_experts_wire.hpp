// Mixture-of-experts routings (R3) on the wire, as xorl-sglang and xorl send
// them: /generate's meta_info "routed_experts" (base64 of little-endian int32
// [prompt + completion - 1, L_moe, K], the last token never being forwarded)
// with "routed_expert_meta" {"shape", "dtype"}; the training server's
// forward_backward "routed_experts" (one item per datum: a nested list
// [T, L, K], {"data": base64, "shape": [...]} or a bare base64 string).
// docs/serving.md and docs/model.md "Mixture of experts".
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace rl::serve {

/// The meta_info fields of a sample's routing: `ids` is the scheduler's
/// [prompt + completion, layers, k] (RequestResult::routed_experts); the
/// reply carries its first prompt + completion - 1 rows (what SGLang returns:
/// every token the server forwarded). Sets meta["routed_experts"] and
/// meta["routed_expert_meta"].
void put_routed_experts(nlohmann::json &meta, const std::vector<int32_t> &ids, int64_t tokens,
                        int64_t layers, int64_t k);

/// One datum's routing from a forward_backward request (`field`, e.g.
/// "routed_experts[2]", names it in errors): `tokens` rows of `layers` x `k`
/// expert ids, flattened; a routing of tokens - 1 rows (SGLang's: the last
/// token never forwarded) gets a -1 row ("route yourself") appended. Throws
/// ApiError 400 naming `field` on anything else.
std::vector<int32_t> parse_routed_experts(const nlohmann::json &item, int64_t tokens,
                                          int64_t layers, int64_t k, const std::string &field);

/// The routings (R3) of a forward_backward request `body` whose input object
/// is `input_key` ("forward_backward_input"): its "routed_experts" (in the
/// input object, as xorl's ForwardBackwardInput carries it, or at the top
/// level), one item per datum (parse_routed_experts), packed over the datums'
/// sequences (`cu`, the batch's cu_seqlens) as the trainer's routed_experts
/// [T, layers, k] flattened; a null item: that datum routes itself (-1).
/// Empty when the request carries none. Refused (400, naming the field):
/// a count other than one per datum, a dense model (layers == 0), and
/// "routed_expert_logits" (the replay weights each token by the current
/// router's probabilities at the replayed experts, docs/model.md).
std::vector<int32_t> request_routed_experts(const nlohmann::json &body,
                                            const std::string &input_key,
                                            const std::vector<int64_t> &cu, int64_t layers,
                                            int64_t k);

} // namespace rl::serve
