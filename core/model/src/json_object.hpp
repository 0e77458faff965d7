// The JSON object of a model file's text (config.json, tokenizer.json,
// tokenizer_config.json, model.safetensors.index.json).
#pragma once

#include "rl/core/error.hpp"
#include "rl/core/json.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace rl::core {

/// Parses `text` from `source` (named in errors): text that is not JSON, or
/// JSON whose top level is not an object, is an error.
inline nlohmann::json parse_json_object(const std::string &text, const std::string &source) {
    const nlohmann::json j = parse_json(text, source);
    if (!j.is_object()) throw Error(source + ": top level is not a JSON object");
    return j;
}

} // namespace rl::core
