// host/serve/chat_tools.hpp: tools in OpenAI chat completions, as vLLM and
// SGLang serve them (docs/serving.md, "Tools"): the request's `tools` and
// `tool_choice` read and checked, assistant `tool_calls` in the request's
// messages put into the form chat templates read (arguments as objects), and
// a generated reply turned into OpenAI's message with `tool_calls`, read back
// by rl/sdk/tool_calls.hpp for the family of the model's chat template, whole
// (reply_message) or while it streams (ToolCallStream). tool_choice
// "required" and a named function force the family's call opening as the
// start of the assistant turn (forced_prefix) and check the reply holds the
// call. Torch-free: tested without a model.
#pragma once

#include "fields.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

namespace rl::serve {

using nlohmann::json;
/// Messages and tools keep their keys in the order the client wrote them, as
/// transformers renders them (tojson keeps dict order).
using ojson = nlohmann::ordered_json;

/// What a chat request asks of tools.
struct ChatTools {
    ojson tools; ///< the request's tools (a non-empty array), or null: none
    /// "none", "auto", "required", or "function" (tool_choice named a function)
    std::string choice;
    std::string function; ///< the function tool_choice names (choice "function")
    std::string family;   ///< the template's tool-call family ("" without tools)
    /// Replies are read back into tool calls (tools given, choice not "none").
    bool parse() const { return !tools.is_null() && choice != "none"; }
    /// The reply must hold a call (choice "required" or a named function).
    bool forced() const { return choice == "required" || choice == "function"; }
    /// The text the assistant turn starts with when forced(), "" otherwise:
    /// the family's call opening, up to the name ("required") or up to the
    /// arguments (a named function). Hermes: `<tool_call>\n{"name": "` or
    /// `<tool_call>\n{"name": "fn", "arguments": `; llama3_json: `{"name": "`
    /// or `{"name": "fn", "parameters": `.
    std::string forced_prefix() const;
};

/// Reads `tools` (from `body`, the request in its order), `tool_choice` and
/// `parallel_tool_calls` of a chat request for a model whose chat template
/// source is `chat_template`. Refuses (400, naming the field) malformed tools
/// and tool_choice, tool_choice other than "none" without tools, a named
/// function that is not among the tools, and tools with a tool_choice other
/// than "none" when the template has no known tool-call family.
ChatTools read_chat_tools(const Fields &f, const ojson &body, const std::string &chat_template);

/// Checks the tool fields of message `index` (assistant `tool_calls`, a tool
/// message's `tool_call_id`) and returns it as templates read it: each
/// function's `arguments` given as a JSON string (OpenAI's wire form) parsed
/// into the object. Refusals name the field ("messages[2].tool_calls[0].
/// function.arguments").
ojson template_message(const ojson &message, size_t index);

/// The reply's message and finish reason for generated `text` (with
/// forced(): the forced prefix and what the model wrote after it). With
/// tools.parse(): the calls read back from the text become message.tool_calls
/// ({"id": "call_<unique>", "type": "function", "function": {"name",
/// "arguments": JSON text}}), message.content is the rest (null when empty)
/// and the finish reason "tool_calls". With choice "auto", text that holds a
/// malformed call is returned whole as content, without tool_calls (as vLLM
/// does). `finish` is the sample's own finish reason. When forced() and the
/// text holds no readable call (of the named function): a reply cut by
/// max_tokens (`finish` "length") is returned as content with finish reason
/// "length"; any other reply throws ApiError 422 naming tool_choice, with the
/// parser's reason.
json reply_message(const std::string &text, const ChatTools &tools, std::string &finish);

/// Reads the tool calls of one streamed reply as its text arrives, and says
/// what may be sent: `delta` objects of chat.completion.chunk events. Content
/// is passed on while the text cannot be the start of a call; whitespace and
/// a possible start of the family's opening are held back. Hermes: each
/// <tool_call> block is sent when it closes, as two deltas (OpenAI's shape):
/// {"tool_calls": [{"index", "id", "type", "function": {"name", "arguments":
/// ""}}]}, then {"tool_calls": [{"index", "function": {"arguments"}}]}; text
/// between and after blocks is dropped (as reply_message drops it), and a
/// block that cannot be read is sent as content, verbatim. llama3_json: a reply
/// that starts with a call is held to its end and read whole. forced(): the
/// whole reply is held and read by reply_message at the end.
class ToolCallStream {
public:
    explicit ToolCallStream(const ChatTools &tools);
    /// The next piece of generated text; returns the deltas to send now.
    std::vector<json> feed(const std::string &text);
    /// The end of the reply: the deltas still to send, and `finish` (the
    /// sample's own reason) turned into "tool_calls" when calls were sent.
    /// Throws as reply_message does when forced() and the reply holds no call.
    std::vector<json> finish(std::string &finish);

private:
    void send_call(const std::string &name, const std::string &arguments, std::vector<json> &out);
    ChatTools tools_;
    std::string held_;       ///< text received and not sent (nor dropped)
    std::string whole_;      ///< all text (hold-all modes)
    bool hold_all_ = false;  ///< read at the end (forced, llama3_json call)
    bool decided_ = false;   ///< llama3_json: the reply's first character seen
    bool in_call_ = false;   ///< hermes: inside a <tool_call> block
    bool seen_call_ = false; ///< hermes: a block has opened
    size_t calls_ = 0;       ///< calls sent
};

/// Qwen3's reasoning (`--reasoning-parser qwen3`, as vLLM names it): the text
/// of a <think> block apart from the reply's content.
struct Reasoning {
    bool found = false;    ///< the reply thinks (its text opens <think>, or the prompt did)
    std::string reasoning; ///< the block's text, newlines around it trimmed
    std::string content;   ///< the text after </think>, leading newlines trimmed
};

/// Splits `text` at </think>. The reply thinks when `opened` (the prompt ends
/// inside a <think> block its template opened) or its text starts, after
/// whitespace, with <think>; then the text up to </think> (up to the end
/// when there is none, e.g. cut by max_tokens) is reasoning and the rest
/// content. Otherwise all of `text` is content.
Reasoning split_reasoning(const std::string &text, bool opened);

/// Whether the prompt `rendered_tail` (its last characters) ends inside an
/// open <think> block.
bool opens_thinking(const std::string &rendered_tail);

/// split_reasoning while the text streams: feed() and finish() return the
/// (reasoning, content) pieces that may be sent now; their concatenations
/// equal split_reasoning's parts. What may start <think> or </think>, and
/// newlines that may be trimmed, are held back.
class ReasoningStream {
public:
    explicit ReasoningStream(bool opened);
    std::pair<std::string, std::string> feed(const std::string &text);
    std::pair<std::string, std::string> finish();

private:
    enum class State { Deciding, Reasoning, After, Plain };
    State state_;
    std::string held_;
    bool started_ = false; ///< reasoning (state Reasoning) or content (state After) sent
};

} // namespace rl::serve
