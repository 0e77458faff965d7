#include "rl/core/chat_template.hpp"

#include "rl/core/error.hpp"
#include "unicode.hpp"

namespace rl::core {

ChatFormat parse_chat_format(const std::string &name) {
    if (name == "chatml" || name == "qwen") return ChatFormat::ChatML;
    if (name == "llama3" || name == "llama-3") return ChatFormat::Llama3;
    throw Error("unknown chat format '" + name + "' (supported: chatml, llama3)");
}

const char *chat_format_name(ChatFormat f) {
    return f == ChatFormat::ChatML ? "chatml" : "llama3";
}

std::optional<ChatFormat> detect_chat_format(const std::string &t) {
    if (t.find("<|im_start|>") != std::string::npos) return ChatFormat::ChatML;
    if (t.find("<|start_header_id|>") != std::string::npos) return ChatFormat::Llama3;
    return std::nullopt;
}

std::string apply_chat_template(ChatFormat format, const std::vector<ChatMessage> &messages,
                                const ChatTemplateOptions &options) {
    for (size_t i = 0; i < messages.size(); ++i) {
        const std::string &r = messages[i].role;
        if (r != "system" && r != "user" && r != "assistant")
            throw Error("chat template: messages[" + std::to_string(i) + "].role '" + r +
                        "' is not supported (system, user, assistant)");
    }
    std::string out;
    if (format == ChatFormat::ChatML) {
        auto turn = [&](const std::string &role, const std::string &content) {
            out += "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
        };
        if (!options.default_system.empty() && (messages.empty() || messages[0].role != "system"))
            turn("system", options.default_system);
        for (const auto &m : messages) turn(m.role, m.content);
        if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
        return out;
    }
    // Llama-3: BOS once, then header + stripped content + <|eot_id|> per turn.
    if (!messages.empty()) out += options.bos_token;
    for (const auto &m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" +
               unicode::strip(m.content) + "<|eot_id|>";
    if (options.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
}

} // namespace rl::core
