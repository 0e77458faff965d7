// Chat formats: ChatML (Qwen) and Llama-3. Rendered in C++ (no Jinja); the
// output equals what the models' own Jinja templates produce for plain
// text messages.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace rl::core {

enum class ChatFormat { ChatML, Llama3 };

struct ChatMessage {
    std::string role; ///< "system", "user" or "assistant"
    std::string content;
};

struct ChatTemplateOptions {
    /// Append the assistant header so the model writes the reply.
    bool add_generation_prompt = true;
    /// ChatML: a system message put first when the conversation has none
    /// (empty: none, as Qwen3 does).
    std::string default_system;
    /// Llama-3: the BOS text put first.
    std::string bos_token = "<|begin_of_text|>";
};

/// "chatml" (or "qwen") and "llama3"; throws Error for anything else.
ChatFormat parse_chat_format(const std::string &name);
const char *chat_format_name(ChatFormat f);

/// Recognizes a Jinja chat template by the markers it writes.
std::optional<ChatFormat> detect_chat_format(const std::string &jinja_template);

/// Renders messages. Throws Error naming the message index for an empty or
/// unsupported role.
std::string apply_chat_template(ChatFormat format, const std::vector<ChatMessage> &messages,
                                const ChatTemplateOptions &options = {});

} // namespace rl::core
