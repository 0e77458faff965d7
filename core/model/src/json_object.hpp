// The JSON object of a model file's text (config.json, tokenizer.json,
// tokenizer_config.json, model.safetensors.index.json).
#pragma once

#include "rl/core/error.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace rl::core {

/// Parses `text` from `source` (named in errors): text that is not JSON, or
/// JSON whose top level is not an object, is an error.
inline nlohmann::json parse_json_object(const std::string &text, const std::string &source) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception &e) {
        throw Error(source + ": invalid JSON: " + e.what());
    }
    if (!j.is_object()) throw Error(source + ": top level is not a JSON object");
    return j;
}

} // namespace rl::core
