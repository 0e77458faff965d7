// Chat templates. A model's own Jinja `chat_template` (tokenizer_config.json or
// chat_template.jinja) is rendered by a small Jinja-compatible engine with
// transformers' settings, so prompts equal transformers' apply_chat_template;
// constructs the engine does not support are errors naming the construct and
// the template line, never a fallback. Two built-in formats (ChatML and
// Llama-3.0, rendered in C++) serve models without a template when asked for
// by name.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rl::core {

namespace jinja {
class Template;
}

/// The built-in formats.
enum class ChatFormat { ChatML, Llama3 };

struct ChatMessage {
    std::string role; ///< "system", "user", "assistant" (templates may take "tool", ...)
    std::string content;
};

struct ChatTemplateOptions {
    /// Append the assistant header so the model writes the reply.
    bool add_generation_prompt = true;
    /// Built-in ChatML: a system message put first when the conversation has
    /// none (empty: none).
    std::string default_system;
    /// Built-in Llama-3: the BOS text put first.
    std::string bos_token = "<|begin_of_text|>";
    /// Jinja: JSON array of tool schemas, the template's `tools` (empty: none).
    std::string tools_json;
    /// Jinja: JSON object of extra template variables, e.g.
    /// {"enable_thinking": false} (empty: none).
    std::string variables_json;
    /// Jinja: the time strftime_now() formats, seconds since the epoch taken
    /// as UTC (unset: the current local time, as transformers does).
    std::optional<int64_t> now;
};

/// "chatml" (or "qwen") and "llama3"; throws Error for anything else.
ChatFormat parse_chat_format(const std::string &name);
const char *chat_format_name(ChatFormat f);

/// Renders messages in a built-in format. Throws Error naming the message
/// index for an empty or unsupported role.
std::string apply_chat_template(ChatFormat format, const std::vector<ChatMessage> &messages,
                                const ChatTemplateOptions &options = {});

/// The JSON array [{"role": ..., "content": ...}, ...] of messages.
std::string chat_messages_json(const std::vector<ChatMessage> &messages);

/// A parsed Jinja chat template.
class ChatTemplate {
public:
    /// Parses `source`; `where` names it in errors. Throws Error
    /// "<where> line N: ..." on a syntax error or unsupported construct.
    explicit ChatTemplate(const std::string &source, const std::string &where = "chat template");
    ~ChatTemplate();

    /// Renders `messages_json` (a JSON array of message objects: role,
    /// content and whatever else the template reads, such as tool_calls or
    /// reasoning_content) with the variables transformers passes: messages,
    /// tools, documents (none), add_generation_prompt, the tokenizer's special
    /// tokens (`special_tokens_json`, a JSON object such as {"bos_token":
    /// "<|begin_of_text|>", "eos_token": ...}) and options.variables_json.
    /// Throws Error "<where> line N: ..." (raise_exception() included).
    std::string render(const std::string &messages_json, const ChatTemplateOptions &options = {},
                       const std::string &special_tokens_json = "") const;
    std::string render(const std::vector<ChatMessage> &messages,
                       const ChatTemplateOptions &options = {},
                       const std::string &special_tokens_json = "") const;
    const std::string &source() const { return source_; }

private:
    std::string source_;
    std::string where_;
    std::shared_ptr<const jinja::Template> impl_;
};

} // namespace rl::core
