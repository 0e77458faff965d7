// Rollouts from any generator: the engine in process (rl_rollouts_generate) or
// an inference server (rl_inference_client_rollouts). Internal to librl.
#pragma once

#include "train_common.hpp"

#include <functional>
#include <vector>

namespace rl::host::capi {

/// Encodes the tasks' prompts as the options say (chat_template,
/// chat_template_kwargs, parse_special_tokens), samples them with
/// options.sampling through `generate` and returns the rollouts (owned by the
/// caller). Errors name `fn`.
rl_rollouts_t *
generate_rollouts(const core::Tokenizer &tok, int64_t vocab_size, const char *tasks_json,
                  const char *options_json, const char *fn,
                  const std::function<core::Generation(const std::vector<std::vector<int64_t>> &,
                                                       const core::SamplingParams &)> &generate);

} // namespace rl::host::capi
