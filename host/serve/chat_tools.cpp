#include "chat_tools.hpp"

#include "rl/sdk/tool_calls.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>

namespace rl::serve {

namespace {

// "call_" and 24 hex digits, unique within the process and unlikely to repeat
// across processes (a random base and a counter).
std::string new_call_id() {
    static const uint64_t base = [] {
        std::random_device rd;
        return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    }();
    static std::atomic<uint64_t> counter{0};
    const uint64_t n = counter.fetch_add(1);
    std::mt19937_64 mix(base ^ (n * 0x9E3779B97F4A7C15ull));
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016llx%08llx", static_cast<unsigned long long>(mix()),
                  static_cast<unsigned long long>(n & 0xffffffffull));
    return "call_" + std::string(buf);
}

void check_tools(const ojson &tools) {
    for (size_t i = 0; i < tools.size(); ++i) {
        const std::string at = "tools[" + std::to_string(i) + "]";
        const ojson &t = tools[i];
        if (!t.is_object()) refuse(at, at + " must be an object {\"type\": \"function\", ...}");
        if (t.value("type", ojson()) != "function")
            refuse(at + ".type", at + ".type must be \"function\" (the only tool type served)");
        auto fn = t.find("function");
        if (fn == t.end() || !fn->is_object())
            refuse(at + ".function", at + ".function must be an object {\"name\", ...}");
        auto name = fn->find("name");
        if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
            refuse(at + ".function.name", at + ".function.name must be a non-empty string");
        if (auto p = fn->find("parameters"); p != fn->end() && !p->is_object() && !p->is_null())
            refuse(at + ".function.parameters",
                   at + ".function.parameters must be an object (a JSON Schema)");
    }
}

} // namespace

ChatTools read_chat_tools(const Fields &f, const ojson &body, const std::string &chat_template) {
    ChatTools out;
    if (f.get("tools")) {
        const ojson &t = body["tools"];
        if (!t.is_array()) refuse("tools", "tools must be a list of function tools");
        check_tools(t);
        if (!t.empty()) out.tools = t;
    }
    f.boolean("parallel_tool_calls"); // every call the model writes is returned
    out.choice = out.tools.is_null() ? "none" : "auto";
    if (const json *c = f.get("tool_choice")) {
        if (c->is_object())
            refuse("tool_choice", "tool_choice naming a function is not supported (it needs "
                                  "constrained decoding); use \"auto\" or \"none\"");
        if (!c->is_string())
            refuse("tool_choice", "tool_choice must be \"none\", \"auto\" or \"required\"");
        const std::string v = c->get<std::string>();
        if (v == "required")
            refuse("tool_choice", "tool_choice \"required\" is not supported (it needs "
                                  "constrained decoding); use \"auto\" or \"none\"");
        if (v != "none" && v != "auto")
            refuse("tool_choice",
                   "tool_choice must be \"none\", \"auto\" or \"required\", not '" + v + "'");
        if (v == "auto" && out.tools.is_null())
            refuse("tool_choice", "tool_choice \"auto\" needs a non-empty tools list");
        out.choice = v;
    }
    if (!out.tools.is_null()) {
        out.family = sdk::tools::detect_family(chat_template);
        if (out.family.empty() && out.choice == "auto")
            refuse("tools", "tools need a chat template with a known tool-call format, and this "
                            "model's template writes neither Hermes <tool_call> blocks nor "
                            "Llama-3 JSON calls, so calls could not be read back from its "
                            "replies (tool_choice \"none\" only renders the tools)");
    }
    return out;
}

ojson template_message(const ojson &message, size_t index) {
    const std::string at = "messages[" + std::to_string(index) + "]";
    ojson out = message;
    if (auto id = message.find("tool_call_id"); id != message.end() && !id->is_string())
        refuse(at + ".tool_call_id", at + ".tool_call_id must be a string");
    auto calls = message.find("tool_calls");
    if (calls == message.end() || calls->is_null()) return out;
    if (message.value("role", "") != "assistant")
        refuse(at + ".tool_calls", at + ".tool_calls is only for assistant messages");
    if (!calls->is_array()) refuse(at + ".tool_calls", at + ".tool_calls must be a list");
    // OpenAI clients send content null beside tool calls; templates read a
    // string (Qwen3's tests `content is string`).
    if (out.value("content", ojson()).is_null()) out["content"] = "";
    for (size_t k = 0; k < calls->size(); ++k) {
        const std::string ck = at + ".tool_calls[" + std::to_string(k) + "]";
        const ojson &call = (*calls)[k];
        if (!call.is_object()) refuse(ck, ck + " must be an object");
        if (auto t = call.find("type"); t != call.end() && !t->is_null() && *t != "function")
            refuse(ck + ".type", ck + ".type must be \"function\"");
        auto fn = call.find("function");
        if (fn == call.end() || !fn->is_object())
            refuse(ck + ".function", ck + ".function must be an object {\"name\", \"arguments\"}");
        auto name = fn->find("name");
        if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
            refuse(ck + ".function.name", ck + ".function.name must be a non-empty string");
        ojson &args = out["tool_calls"][k]["function"]["arguments"];
        if (args.is_null()) {
            args = ojson::object();
        } else if (args.is_string()) {
            const std::string text = args.get<std::string>();
            ojson parsed = ojson::parse(text, nullptr, false);
            if (parsed.is_discarded() || !parsed.is_object())
                refuse(ck + ".function.arguments",
                       ck +
                           ".function.arguments must be a JSON object (as text or as an "
                           "object); got " +
                           dump(json(text.substr(0, 80))));
            args = std::move(parsed);
        } else if (!args.is_object()) {
            refuse(ck + ".function.arguments",
                   ck + ".function.arguments must be a JSON object (as text or as an object)");
        }
    }
    return out;
}

json reply_message(const std::string &text, const ChatTools &tools, std::string &finish) {
    json msg = {{"role", "assistant"}, {"content", text}};
    if (!tools.parse()) return msg;
    const sdk::tools::Parsed p = sdk::tools::parse_tool_calls(text, tools.family);
    if (!p.errors.empty() || p.calls.empty()) return msg;
    json calls = json::array();
    for (const auto &c : p.calls)
        calls.push_back({{"id", new_call_id()},
                         {"type", "function"},
                         {"function", {{"name", c.name}, {"arguments", c.arguments_text}}}});
    msg["content"] = p.content.empty() ? json() : json(p.content);
    msg["tool_calls"] = std::move(calls);
    finish = "tool_calls";
    return msg;
}

} // namespace rl::serve
