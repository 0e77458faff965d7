#include "rl/core/chat_template.hpp"

#include "jinja.hpp"
#include "rl/core/error.hpp"
#include "rl/core/json.hpp"
#include "unicode.hpp"

#include <nlohmann/json.hpp>

namespace rl::core {
namespace {

using Json = nlohmann::ordered_json;

Json parse_json_arg(const std::string &text, const std::string &what) {
    check_json_depth(text, what);
    try {
        return Json::parse(text);
    } catch (const Json::exception &e) {
        throw Error(what + " is not valid JSON: " + e.what());
    }
}

} // namespace

ChatFormat parse_chat_format(const std::string &name) {
    if (name == "chatml" || name == "qwen") return ChatFormat::ChatML;
    if (name == "llama3" || name == "llama-3") return ChatFormat::Llama3;
    throw Error("unknown chat format '" + name + "' (built-in: chatml, llama3)");
}

const char *chat_format_name(ChatFormat f) {
    return f == ChatFormat::ChatML ? "chatml" : "llama3";
}

std::string apply_chat_template(ChatFormat format, const std::vector<ChatMessage> &messages,
                                const ChatTemplateOptions &options) {
    for (size_t i = 0; i < messages.size(); ++i) {
        const std::string &r = messages[i].role;
        if (r != "system" && r != "user" && r != "assistant")
            throw Error("chat template: messages[" + std::to_string(i) + "].role '" + r +
                        "' is not supported by the built-in " + chat_format_name(format) +
                        " format (system, user, assistant)");
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

std::string chat_messages_json(const std::vector<ChatMessage> &messages) {
    Json j = Json::array();
    for (const auto &m : messages) j.push_back(Json{{"role", m.role}, {"content", m.content}});
    try {
        return j.dump();
    } catch (const Json::exception &e) {
        throw Error(std::string("chat template: a message is not valid UTF-8: ") + e.what());
    }
}

ChatTemplate::ChatTemplate(const std::string &source, const std::string &where)
    : source_(source), where_(where), impl_(std::make_shared<jinja::Template>(source, where)) {}

ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const std::string &messages_json,
                                 const ChatTemplateOptions &options,
                                 const std::string &special_tokens_json) const {
    Json messages = parse_json_arg(messages_json, where_ + ": messages");
    if (!messages.is_array()) throw Error(where_ + ": messages must be a JSON array");
    Json tools = nullptr;
    if (!options.tools_json.empty()) {
        tools = parse_json_arg(options.tools_json, where_ + ": tools");
        if (!tools.is_array() && !tools.is_null())
            throw Error(where_ + ": tools must be a JSON array of tool schemas");
    }
    std::vector<Json> extras;
    size_t keys = 4;
    for (const std::string *extra : {&special_tokens_json, &options.variables_json}) {
        if (extra->empty()) continue;
        extras.push_back(parse_json_arg(*extra, where_ + ": template variables"));
        if (!extras.back().is_object())
            throw Error(where_ + ": template variables must be a JSON object");
        keys += extras.back().size();
    }
    // The variables transformers' apply_chat_template passes, in its order.
    // Every value is moved in, and the object's room reserved first: an
    // ordered_json object is a vector, and growing it copies its values, which
    // nlohmann does recursively (a deeply nested message would overflow the
    // stack).
    Json ctx = Json::object();
    ctx.get_ref<Json::object_t &>().reserve(keys);
    ctx["messages"] = std::move(messages);
    ctx["tools"] = std::move(tools);
    ctx["documents"] = nullptr;
    ctx["add_generation_prompt"] = options.add_generation_prompt;
    for (Json &vars : extras)
        for (auto it = vars.begin(); it != vars.end(); ++it) ctx[it.key()] = std::move(it.value());
    jinja::RenderOptions ro;
    ro.now = options.now;
    return impl_->render(ctx, ro);
}

std::string ChatTemplate::render(const std::vector<ChatMessage> &messages,
                                 const ChatTemplateOptions &options,
                                 const std::string &special_tokens_json) const {
    return render(chat_messages_json(messages), options, special_tokens_json);
}

} // namespace rl::core
