// Fuzz target: the tool-call parser a model's generated text goes through
// (sdk/include/rl/sdk/tool_calls.hpp), in both families, then every parsed call
// checked against a fixed set of function schemas, and the input as a chat
// template's source for detect_family. Nothing here may throw: a malformed
// call is an error line, never an exception.
#include "fuzz_target.hpp"

#include <rl/sdk/tool_calls.hpp>

namespace {

namespace tools = rl::sdk::tools;

const tools::json &schemas() {
    static const tools::json s = tools::json::parse(R"([
        {"type": "function", "function": {"name": "calculator", "parameters": {
            "type": "object", "properties": {"expression": {"type": "string"}},
            "required": ["expression"]}}},
        {"name": "search", "parameters": {"type": "object", "additionalProperties": false,
            "properties": {"q": {"type": ["string", "null"]}, "n": {"type": "integer"},
                           "x": {"type": "number"}, "f": {"type": "boolean"},
                           "l": {"type": "array"}, "o": {"type": "object"}}}}
    ])");
    return s;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const std::string text = fuzz_text(data, size);
    for (const std::string &family : tools::families()) {
        const tools::Parsed p = tools::parse_tool_calls(text, family);
        for (const tools::ToolCall &c : p.calls) {
            if (!c.arguments.is_object()) __builtin_trap(); // documented: always an object
            (void)tools::check_call(c, schemas());
        }
    }
    (void)tools::detect_family(text);
    return 0;
}
