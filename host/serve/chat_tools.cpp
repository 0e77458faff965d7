#include "chat_tools.hpp"

#include "rl/sdk/tool_calls.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string_view>

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
        if (c->is_object()) {
            if (c->value("type", json()) != "function")
                refuse("tool_choice.type", "tool_choice.type must be \"function\"");
            auto fn = c->find("function");
            if (fn == c->end() || !fn->is_object())
                refuse("tool_choice.function",
                       "tool_choice.function must be an object {\"name\": ...}");
            auto name = fn->find("name");
            if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
                refuse("tool_choice.function.name",
                       "tool_choice.function.name must be a non-empty string");
            if (out.tools.is_null())
                refuse("tool_choice", "tool_choice naming a function needs a non-empty tools list");
            out.function = name->get<std::string>();
            std::string known;
            bool found = false;
            for (const ojson &t : out.tools) {
                const std::string n = t["function"]["name"].get<std::string>();
                found = found || n == out.function;
                known += (known.empty() ? "" : ", ") + n;
            }
            if (!found)
                refuse("tool_choice", "tool_choice names the function '" + out.function +
                                          "', which is not among the tools (" + known + ")");
            out.choice = "function";
        } else {
            if (!c->is_string())
                refuse("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" "
                                      "or {\"type\": \"function\", \"function\": {\"name\"}}");
            const std::string v = c->get<std::string>();
            if (v != "none" && v != "auto" && v != "required")
                refuse("tool_choice",
                       "tool_choice must be \"none\", \"auto\" or \"required\", not '" + v + "'");
            if (v != "none" && out.tools.is_null())
                refuse("tool_choice", "tool_choice \"" + v + "\" needs a non-empty tools list");
            out.choice = v;
        }
    }
    if (!out.tools.is_null()) {
        out.family = sdk::tools::detect_family(chat_template);
        if (out.family.empty() && out.choice != "none")
            refuse(out.choice == "auto" ? "tools" : "tool_choice",
                   "tools need a chat template with a known tool-call format, and this "
                   "model's template writes neither Hermes <tool_call> blocks nor "
                   "Llama-3 JSON calls, so calls could not be read back from its "
                   "replies (tool_choice \"none\" only renders the tools)");
    }
    return out;
}

std::string ChatTools::forced_prefix() const {
    if (!forced()) return "";
    const bool hermes = family == "hermes";
    std::string p = hermes ? "<tool_call>\n{\"name\": " : "{\"name\": ";
    if (choice == "required") return p + "\"";
    return p + dump(json(function)) + (hermes ? ", \"arguments\": " : ", \"parameters\": ");
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
    if (tools.forced()) {
        std::string problem;
        if (!p.errors.empty())
            problem = p.errors.front();
        else if (p.calls.empty())
            problem = "it holds no tool call";
        else if (tools.choice == "function")
            for (const auto &c : p.calls)
                if (c.name != tools.function && problem.empty())
                    problem = "it calls '" + c.name + "'";
        if (!problem.empty()) {
            if (finish == "length") return msg; // cut by max_tokens: the text, finish "length"
            const std::string want = tools.choice == "required"
                                         ? std::string("tool_choice \"required\"")
                                         : "tool_choice naming '" + tools.function + "'";
            throw ApiError(422,
                           "the model's reply does not meet " + want + ": " + problem +
                               " (the reply: " + dump(json(text.substr(0, 200))) +
                               (text.size() > 200 ? "..." : "") + ")",
                           "tool_choice");
        }
    } else if (!p.errors.empty() || p.calls.empty()) {
        return msg;
    }
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

namespace {

constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";

bool space(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

// The length of the longest suffix of `s` that is a proper start of `word`.
size_t partial_suffix(const std::string &s, std::string_view word) {
    for (size_t n = std::min(s.size(), word.size() - 1); n > 0; --n)
        if (s.compare(s.size() - n, n, word.substr(0, n)) == 0) return n;
    return 0;
}

json content_delta(const std::string &text) {
    return {{"content", text}};
}

} // namespace

ToolCallStream::ToolCallStream(const ChatTools &tools) : tools_(tools) {
    if (tools.forced()) {
        hold_all_ = true;
        whole_ = tools.forced_prefix();
    }
}

void ToolCallStream::send_call(const std::string &name, const std::string &arguments,
                               std::vector<json> &out) {
    const size_t index = calls_++;
    out.push_back(
        {{"tool_calls", json::array({{{"index", index},
                                      {"id", new_call_id()},
                                      {"type", "function"},
                                      {"function", {{"name", name}, {"arguments", ""}}}}})}});
    out.push_back({{"tool_calls",
                    json::array({{{"index", index}, {"function", {{"arguments", arguments}}}}})}});
}

std::vector<json> ToolCallStream::feed(const std::string &text) {
    std::vector<json> out;
    if (!tools_.parse()) {
        if (!text.empty()) out.push_back(content_delta(text));
        return out;
    }
    if (hold_all_) {
        whole_ += text;
        return out;
    }
    held_ += text;
    if (tools_.family != "hermes") { // llama3_json: the first character decides
        if (decided_) {
            if (!held_.empty()) out.push_back(content_delta(held_));
            held_.clear();
            return out;
        }
        size_t k = 0;
        while (k < held_.size() && space(held_[k])) ++k;
        if (k == held_.size()) return out;
        static constexpr std::string_view tag = "<|python_tag|>";
        const std::string rest = held_.substr(k);
        if (rest.size() < tag.size() && tag.substr(0, rest.size()) == rest)
            return out; // maybe the tag: wait
        decided_ = true;
        if (rest.front() == '{' || rest.rfind(tag, 0) == 0) {
            hold_all_ = true;
            whole_ = std::move(held_);
            held_.clear();
            return out;
        }
        out.push_back(content_delta(held_));
        held_.clear();
        return out;
    }
    while (true) {
        if (in_call_) {
            const size_t q = held_.find(kClose);
            if (q == std::string::npos) return out;
            const std::string block = std::string(kOpen) + held_.substr(0, q) + std::string(kClose);
            held_.erase(0, q + kClose.size());
            in_call_ = false;
            const sdk::tools::Parsed p = sdk::tools::parse_tool_calls(block, "hermes");
            if (p.errors.empty() && p.calls.size() == 1)
                send_call(p.calls[0].name, p.calls[0].arguments_text, out);
            else
                out.push_back(content_delta(block));
            continue;
        }
        const size_t p = held_.find(kOpen);
        if (p != std::string::npos) {
            if (!seen_call_) {
                size_t e = p;
                while (e > 0 && space(held_[e - 1])) --e;
                if (e > 0) out.push_back(content_delta(held_.substr(0, e)));
            }
            held_.erase(0, p + kOpen.size());
            in_call_ = seen_call_ = true;
            continue;
        }
        // No opening yet: keep what may start one (and the spaces before it).
        size_t keep = partial_suffix(held_, kOpen);
        if (seen_call_) {
            held_.erase(0, held_.size() - keep);
            return out;
        }
        size_t e = held_.size() - keep;
        while (e > 0 && space(held_[e - 1])) --e;
        if (e > 0) {
            out.push_back(content_delta(held_.substr(0, e)));
            held_.erase(0, e);
        }
        return out;
    }
}

std::vector<json> ToolCallStream::finish(std::string &finish) {
    std::vector<json> out;
    if (hold_all_) {
        json msg = reply_message(whole_, tools_, finish);
        if (msg["content"].is_string() && !msg["content"].get<std::string>().empty())
            out.push_back(content_delta(msg["content"].get<std::string>()));
        if (msg.contains("tool_calls"))
            for (const json &c : msg["tool_calls"])
                send_call(c["function"]["name"].get<std::string>(),
                          c["function"]["arguments"].get<std::string>(), out);
    } else if (in_call_) { // a block the reply left open: content, verbatim
        out.push_back(content_delta(std::string(kOpen) + held_));
    } else if (!seen_call_ && !held_.empty()) {
        out.push_back(content_delta(held_));
    }
    held_.clear();
    if (calls_ > 0) finish = "tool_calls";
    return out;
}

namespace {

constexpr std::string_view kThink = "<think>", kThinkEnd = "</think>";

bool starts_think(const std::string &s, size_t k) {
    return s.compare(k, kThink.size(), kThink) == 0;
}

size_t first_non_space(const std::string &s) {
    size_t k = 0;
    while (k < s.size() && space(s[k])) ++k;
    return k;
}

std::string trim_newlines(std::string s, bool front, bool back) {
    if (back)
        while (!s.empty() && s.back() == '\n') s.pop_back();
    size_t k = 0;
    if (front)
        while (k < s.size() && s[k] == '\n') ++k;
    return s.substr(k);
}

} // namespace

Reasoning split_reasoning(const std::string &text, bool opened) {
    Reasoning r;
    std::string rest = text;
    if (!opened) {
        const size_t k = first_non_space(text);
        if (!starts_think(text, k)) {
            r.content = text;
            return r;
        }
        rest = text.substr(k + kThink.size());
    }
    r.found = true;
    const size_t e = rest.find(kThinkEnd);
    r.reasoning = trim_newlines(rest.substr(0, e), true, true);
    if (e != std::string::npos)
        r.content = trim_newlines(rest.substr(e + kThinkEnd.size()), true, false);
    return r;
}

bool opens_thinking(const std::string &tail) {
    const size_t open = tail.rfind(kThink);
    return open != std::string::npos && tail.find(kThinkEnd, open) == std::string::npos &&
           first_non_space(tail.substr(open + kThink.size())) == tail.size() - open - kThink.size();
}

ReasoningStream::ReasoningStream(bool opened)
    : state_(opened ? State::Reasoning : State::Deciding) {}

std::pair<std::string, std::string> ReasoningStream::feed(const std::string &text) {
    std::pair<std::string, std::string> out;
    held_ += text;
    while (true) {
        switch (state_) {
            case State::Deciding: {
                const size_t k = first_non_space(held_);
                if (k == held_.size()) return out;
                const std::string rest = held_.substr(k);
                if (rest.size() < kThink.size() && kThink.substr(0, rest.size()) == rest)
                    return out; // maybe <think>: wait
                if (starts_think(held_, k)) {
                    held_.erase(0, k + kThink.size());
                    state_ = State::Reasoning;
                    continue;
                }
                state_ = State::Plain;
                continue;
            }
            case State::Reasoning: {
                if (!started_) held_ = trim_newlines(held_, true, false);
                const size_t e = held_.find(kThinkEnd);
                if (e != std::string::npos) {
                    out.first += trim_newlines(held_.substr(0, e), false, true);
                    held_.erase(0, e + kThinkEnd.size());
                    state_ = State::After;
                    started_ = false;
                    continue;
                }
                size_t end = held_.size() - partial_suffix(held_, kThinkEnd);
                while (end > 0 && held_[end - 1] == '\n') --end;
                out.first += held_.substr(0, end);
                started_ = started_ || end > 0;
                held_.erase(0, end);
                return out;
            }
            case State::After:
                if (!started_) held_ = trim_newlines(held_, true, false);
                started_ = started_ || !held_.empty();
                out.second += held_;
                held_.clear();
                return out;
            case State::Plain:
                out.second += held_;
                held_.clear();
                return out;
        }
    }
}

std::pair<std::string, std::string> ReasoningStream::finish() {
    std::pair<std::string, std::string> out;
    if (state_ == State::Deciding)
        out.second = held_;
    else if (state_ == State::Reasoning)
        out.first = trim_newlines(held_, !started_, true);
    held_.clear();
    return out;
}

} // namespace rl::serve
