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

/// The meta_info fields of a sample's recorded routing weights, as
/// xorl-sglang's --enable-return-expert-logits returns them: `weights` is
/// the scheduler's float32 [prompt + completion, layers, k]
/// (RequestResult::routed_expert_weights); the first prompt + completion - 1
/// rows go out as meta["expert_logits"] (base64 of little-endian float32) with
/// meta["expert_logits_meta"] {"shape", "dtype": "float32"}.
void put_expert_logits(nlohmann::json &meta, const std::vector<float> &weights, int64_t tokens,
                       int64_t layers, int64_t k);

/// One sample's recorded routing weights in the forms parse_routed_experts
/// takes (float32 values, e.g. /generate's meta_info "expert_logits" with the
/// shape of "expert_logits_meta"): `tokens` rows of `layers` x `k`, the
/// missing last row 0. `rows`, when given, gets the item's own row count
/// (tokens or tokens - 1). Throws ApiError 400 naming `field` (and for a value
/// that is not finite its token, layer and slot).
std::vector<float> parse_expert_logits(const nlohmann::json &item, int64_t tokens, int64_t layers,
                                       int64_t k, const std::string &field,
                                       int64_t *rows = nullptr);

/// The routings (R3) of a forward_backward request `body` whose input object
/// is `input_key` ("forward_backward_input"): its "routed_experts" (in the
/// input object, as xorl's ForwardBackwardInput carries it, or at the top
/// level), one item per datum (parse_routed_experts), packed over the datums'
/// sequences (`cu`, the batch's cu_seqlens) as the trainer's routed_experts
/// [T, layers, k] flattened; a null item: that datum routes itself (-1).
/// Empty when the request carries none. `rows`, when given, gets each
/// datum's item's token rows (tokens or tokens - 1; -1 for a null item).
/// Refused (400, naming the field): a count other than one per datum, a
/// dense model (layers == 0).
std::vector<int32_t> request_routed_experts(const nlohmann::json &body,
                                            const std::string &input_key,
                                            const std::vector<int64_t> &cu, int64_t layers,
                                            int64_t k, std::vector<int64_t> *rows = nullptr);

/// The recorded routing weights of the same request: xorl's
/// "routed_expert_logits" (float32 top-k weights, not logits), one item per
/// datum in the forms routed_experts takes (a nested list of numbers,
/// {"data": base64 float32, "shape", "dtype": "float32"}, bare base64),
/// packed like request_routed_experts (the trainer's routed_expert_weights,
/// flattened; rows with no weight 0). `rows`: request_routed_experts's rows.
/// Empty when the request carries none. Refused (400, naming the field and
/// datum): weights without routed_experts, a count other than one per datum,
/// an item null where the ids are not (or the reverse), a shape other than
/// that datum's ids, a dtype other than float32, bad base64, a value that is
/// not finite (naming token, layer and slot).
std::vector<float> request_routed_expert_logits(const nlohmann::json &body,
                                                const std::string &input_key,
                                                const std::vector<int64_t> &cu, int64_t layers,
                                                int64_t k, const std::vector<int64_t> &rows);

} // namespace rl::serve
