// host/serve/chat_tools.hpp: tools in OpenAI chat completions, as vLLM and
// SGLang serve them (docs/serving.md, "Tools"): the request's `tools` and
// `tool_choice` read and checked, assistant `tool_calls` in the request's
// messages put into the form chat templates read (arguments as objects), and
// a generated reply turned into OpenAI's message with `tool_calls`, read back
// by rl/sdk/tool_calls.hpp for the family of the model's chat template.
// Torch-free: tested without a model.
#pragma once

#include "fields.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace rl::serve {

using nlohmann::json;
/// Messages and tools keep their keys in the order the client wrote them, as
/// transformers renders them (tojson keeps dict order).
using ojson = nlohmann::ordered_json;

/// What a chat request asks of tools.
struct ChatTools {
    ojson tools;        ///< the request's tools (a non-empty array), or null: none
    std::string choice; ///< "none" or "auto"
    std::string family; ///< the template's tool-call family ("" without tools)
    /// Replies are read back into tool calls (tools given, choice "auto").
    bool parse() const { return !tools.is_null() && choice == "auto"; }
};

/// Reads `tools` (from `body`, the request in its order), `tool_choice` and
/// `parallel_tool_calls` of a chat request
/// for a model whose chat template source is `chat_template`. Refuses (400,
/// naming the field) malformed tools, tool_choice "required" or a named
/// function (they need constrained decoding), tool_choice without tools, and
/// tools with tool_choice "auto" when the template has no known tool-call
/// family.
ChatTools read_chat_tools(const Fields &f, const ojson &body, const std::string &chat_template);

/// Checks the tool fields of message `index` (assistant `tool_calls`, a tool
/// message's `tool_call_id`) and returns it as templates read it: each
/// function's `arguments` given as a JSON string (OpenAI's wire form) parsed
/// into the object. Refusals name the field ("messages[2].tool_calls[0].
/// function.arguments").
ojson template_message(const ojson &message, size_t index);

/// The reply's message and finish reason for generated `text`. With
/// tools.parse(): the calls read back from the text become message.tool_calls
/// ({"id": "call_<unique>", "type": "function", "function": {"name",
/// "arguments": JSON text}}), message.content is the rest (null when empty)
/// and the finish reason "tool_calls". Text that holds a malformed call is
/// returned whole as content, without tool_calls (as vLLM does). `finish` is
/// the sample's own finish reason.
json reply_message(const std::string &text, const ChatTools &tools, std::string &finish);

} // namespace rl::serve
