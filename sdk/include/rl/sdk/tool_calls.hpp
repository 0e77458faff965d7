// rl/sdk/tool_calls.hpp: tool calls as models write them (header-only, C++17,
// the standard library and nlohmann/json only). parse_tool_calls turns the
// text a model generated back into calls for its chat template's family:
//
//   "hermes"       Qwen2.5 / Qwen3 / QwQ and other Hermes-style templates:
//                  zero or more <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
//                  blocks; the content is the text before the first block,
//                  trimmed (as vLLM's and SGLang's hermes parsers keep it).
//   "llama3_json"  Llama-3.1 / 3.2 / 3.3 JSON tool calls: the reply is a JSON
//                  object {"name": ..., "parameters": {...}} ("arguments" too),
//                  optionally after <|python_tag|>, several separated by ';'.
//                  A reply that starts with neither is content.
//
// Nothing here throws on what a model wrote: a malformed call (bad JSON, an
// unclosed block, no name) becomes one line in Parsed::errors, "could not
// parse tool call N: <reason>", fit to be shown to the model as an
// observation. detect_family picks the family from a chat template's source;
// check_call checks a call against OpenAI function schemas.
#pragma once

#include "text.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace rl::sdk::tools {

// Objects keep their keys in the order written: arguments sent back to the
// model render as it wrote them (transformers' tojson keeps dict order).
using json = nlohmann::ordered_json;

struct ToolCall {
    std::string name;
    json arguments = json::object(); ///< always an object
    std::string arguments_text;      ///< `arguments` as compact JSON text (OpenAI's wire form)
};

struct Parsed {
    std::string content;             ///< the text that is not a tool call
    std::vector<ToolCall> calls;     ///< in the order written
    std::vector<std::string> errors; ///< one line per call that could not be read
};

namespace detail {

using rl::sdk::text::is_space;
using rl::sdk::text::trim;

inline std::string dump(const json &j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Text for a message: at most `limit` bytes of `s`, as JSON string text.
inline std::string quote(std::string_view s, size_t limit = 60) {
    const bool cut = s.size() > limit;
    std::string q = dump(json(std::string(s.substr(0, cut ? limit : s.size()))));
    return cut ? q + "..." : q;
}

// The parser's reason without nlohmann's "[json.exception.parse_error.101] " tag.
inline std::string reason_of(const json::exception &e) {
    std::string what = e.what();
    const size_t close = what.find("] ");
    if (what.rfind("[json.exception.", 0) == 0 && close != std::string::npos)
        what = what.substr(close + 2);
    return what;
}

inline std::string call_error(size_t number, const std::string &reason) {
    return "could not parse tool call " + std::to_string(number) + ": " + reason;
}

// One call from its JSON object: `args_keys` are the keys that may hold the
// arguments, in order of preference. Returns the reason on failure ("" = ok).
inline std::string read_call(const json &j, std::initializer_list<const char *> args_keys,
                             ToolCall &out) {
    if (!j.is_object()) return "expected a JSON object, got " + std::string(j.type_name());
    auto name = j.find("name");
    if (name == j.end()) return "the object has no \"name\"";
    if (!name->is_string() || name->get<std::string>().empty())
        return "\"name\" must be a non-empty string";
    out.name = name->get<std::string>();
    const char *key = nullptr;
    for (const char *k : args_keys)
        if (j.contains(k)) {
            key = k;
            break;
        }
    json args = key ? j.at(key) : json::object();
    if (args.is_null()) args = json::object();
    if (args.is_string()) { // some models write the arguments as a JSON string
        const std::string text = args.get<std::string>();
        json inner = json::parse(text, nullptr, false);
        if (inner.is_discarded())
            return "\"" + std::string(key) + "\" of '" + out.name +
                   "' is a string that is not JSON: " + quote(text);
        args = std::move(inner);
    }
    if (!args.is_object())
        return "\"" + std::string(key) + "\" of '" + out.name + "' must be an object, got " +
               args.type_name();
    out.arguments = std::move(args);
    out.arguments_text = dump(out.arguments);
    return "";
}

// Parses one JSON value starting at text[pos] (after spaces); sets `end` to
// the byte after it. Returns the reason on failure ("" = ok).
inline std::string parse_json_at(std::string_view text, size_t pos, json &out, size_t &end) {
    while (pos < text.size() && is_space(text[pos])) ++pos;
    if (pos >= text.size()) return "no JSON object (the text ends)";
    // Find the end of the value: braces and brackets balanced outside strings.
    int depth = 0;
    bool in_string = false, escaped = false;
    size_t i = pos;
    for (; i < text.size(); ++i) {
        const char ch = text[i];
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (ch == '\\')
                escaped = true;
            else if (ch == '"')
                in_string = false;
            continue;
        }
        if (ch == '"')
            in_string = true;
        else if (ch == '{' || ch == '[')
            ++depth;
        else if (ch == '}' || ch == ']') {
            if (--depth <= 0) {
                ++i;
                break;
            }
        } else if (depth == 0 && (ch == ';' || is_space(ch)))
            break; // a bare scalar ends here
    }
    if (depth > 0) return "the JSON object is not closed (the text ends inside it)";
    try {
        out = json::parse(std::string(text.substr(pos, i - pos)));
    } catch (const json::exception &e) {
        return "invalid JSON (" + reason_of(e) + ") in " + quote(text.substr(pos, i - pos));
    }
    end = i;
    return "";
}

inline void parse_hermes(std::string_view text, Parsed &out) {
    static constexpr std::string_view open = "<tool_call>", close = "</tool_call>";
    size_t at = text.find(open);
    out.content =
        std::string(trim(text.substr(0, at == std::string_view::npos ? text.size() : at)));
    size_t number = 0;
    while (at != std::string_view::npos) {
        ++number;
        const size_t body = at + open.size();
        const size_t end = text.find(close, body);
        const size_t next_open = text.find(open, body);
        if (end == std::string_view::npos ||
            (next_open != std::string_view::npos && next_open < end)) {
            out.errors.push_back(
                call_error(number, "the <tool_call> block is not closed by </tool_call>"));
            if (next_open == std::string_view::npos) break;
            at = next_open;
            continue;
        }
        const std::string_view inside = trim(text.substr(body, end - body));
        ToolCall call;
        std::string reason;
        if (inside.empty()) {
            reason = "the <tool_call> block is empty";
        } else {
            json j;
            try {
                j = json::parse(std::string(inside));
                reason = read_call(j, {"arguments", "parameters"}, call);
            } catch (const json::exception &e) {
                reason = "invalid JSON (" + reason_of(e) + ") in " + quote(inside);
            }
        }
        if (reason.empty())
            out.calls.push_back(std::move(call));
        else
            out.errors.push_back(call_error(number, reason));
        at = text.find(open, end + close.size());
    }
}

inline void parse_llama3_json(std::string_view text, Parsed &out) {
    static constexpr std::string_view tag = "<|python_tag|>";
    std::string_view rest = trim(text);
    const bool tagged = rest.rfind(tag, 0) == 0;
    if (tagged) rest = trim(rest.substr(tag.size()));
    if (!tagged && (rest.empty() || rest.front() != '{')) {
        out.content = std::string(text);
        return;
    }
    size_t pos = 0, number = 0;
    while (true) {
        ++number;
        json j;
        size_t end = 0;
        std::string reason = parse_json_at(rest, pos, j, end);
        ToolCall call;
        if (reason.empty()) reason = read_call(j, {"parameters", "arguments"}, call);
        if (!reason.empty()) {
            out.errors.push_back(call_error(number, reason));
            return; // where the next call starts is unknown
        }
        out.calls.push_back(std::move(call));
        while (end < rest.size() && is_space(rest[end])) ++end;
        if (end >= rest.size()) return;
        if (rest[end] != ';') {
            out.errors.push_back(call_error(number + 1, "expected ';' between calls, got " +
                                                            quote(rest.substr(end), 30)));
            return;
        }
        pos = end + 1;
        while (pos < rest.size() && is_space(rest[pos])) ++pos;
        if (pos >= rest.size()) return; // a trailing ';'
    }
}

} // namespace detail

/// The families parse_tool_calls knows.
inline const std::vector<std::string> &families() {
    static const std::vector<std::string> f = {"hermes", "llama3_json"};
    return f;
}

/// The calls in `text` a model of template family `family` generated. An
/// unknown family is one error and the whole text as content.
inline Parsed parse_tool_calls(std::string_view text, std::string_view family) {
    Parsed out;
    if (family == "hermes") {
        detail::parse_hermes(text, out);
    } else if (family == "llama3_json") {
        detail::parse_llama3_json(text, out);
    } else {
        out.content = std::string(text);
        out.errors.push_back("unknown tool-call family '" + std::string(family) +
                             "' (known: hermes, llama3_json)");
    }
    return out;
}

/// The tool-call family of a chat template from its source: "hermes" when it
/// writes <tool_call> blocks, "llama3_json" when it mentions <|python_tag|>
/// or Llama's {"name": ..., "parameters": ...} convention, else "".
inline std::string detect_family(const std::string &chat_template_source) {
    const std::string &s = chat_template_source;
    if (s.find("<tool_call>") != std::string::npos) return "hermes";
    if (s.find("<|python_tag|>") != std::string::npos) return "llama3_json";
    if (s.find("\"parameters\": ") != std::string::npos &&
        s.find("<|eot_id|>") != std::string::npos)
        return "llama3_json";
    return "";
}

namespace detail {

inline bool has_type(const json &value, const std::string &type) {
    if (type == "string") return value.is_string();
    if (type == "number") return value.is_number();
    if (type == "integer") {
        if (value.is_number_integer()) return true;
        if (!value.is_number_float()) return false;
        // Integral, whatever its size (a cast to an integer type would be
        // undefined past its range: 2.2e119).
        const double d = value.get<double>();
        return std::isfinite(d) && std::trunc(d) == d;
    }
    if (type == "boolean") return value.is_boolean();
    if (type == "array") return value.is_array();
    if (type == "object") return value.is_object();
    if (type == "null") return value.is_null();
    return true; // a type this check does not know: not its business
}

inline const char *json_kind(const json &v) {
    if (v.is_number_integer()) return "integer";
    if (v.is_number()) return "number";
    if (v.is_boolean()) return "boolean";
    return v.type_name(); // string, array, object, null
}

} // namespace detail

/// What is wrong with `call` against `tools` (OpenAI's tools array:
/// [{"type": "function", "function": {"name", "parameters"}}], bare
/// {"name", "parameters"} entries too): an unknown tool, a missing required
/// argument, an argument of the wrong JSON type, an argument not declared
/// where additionalProperties is false. One line per problem; empty: fine.
inline std::vector<std::string> check_call(const ToolCall &call, const json &tools) {
    std::vector<std::string> problems;
    const json *fn = nullptr;
    std::string known;
    if (tools.is_array())
        for (const json &t : tools) {
            const json *f = &t;
            if (t.is_object() && t.contains("function") && t["function"].is_object())
                f = &t["function"];
            if (!f->is_object() || !f->contains("name") || !(*f)["name"].is_string()) continue;
            const std::string name = (*f)["name"].get<std::string>();
            known += (known.empty() ? "" : ", ") + name;
            if (name == call.name && !fn) fn = f;
        }
    if (!fn) {
        problems.push_back("unknown tool '" + call.name +
                           "' (known: " + (known.empty() ? std::string("none") : known) + ")");
        return problems;
    }
    const std::string tool = "tool '" + call.name + "': ";
    if (!call.arguments.is_object()) {
        problems.push_back(tool + "the arguments must be an object, got " +
                           call.arguments.type_name());
        return problems;
    }
    auto params = fn->find("parameters");
    if (params == fn->end() || !params->is_object()) return problems;
    const json empty = json::object();
    const json &props = params->contains("properties") && (*params)["properties"].is_object()
                            ? (*params)["properties"]
                            : empty;
    if (auto req = params->find("required"); req != params->end() && req->is_array())
        for (const json &r : *req)
            if (r.is_string() && !call.arguments.contains(r.get<std::string>()))
                problems.push_back(tool + "missing required argument '" + r.get<std::string>() +
                                   "'");
    const bool closed = params->value("additionalProperties", json(true)) == json(false);
    for (auto it = call.arguments.begin(); it != call.arguments.end(); ++it) {
        auto p = props.find(it.key());
        if (p == props.end()) {
            if (closed)
                problems.push_back(tool + "unexpected argument '" + it.key() +
                                   "' (not among its parameters)");
            continue;
        }
        if (!p->is_object() || !p->contains("type")) continue;
        const json &type = (*p)["type"];
        std::vector<std::string> types;
        if (type.is_string()) types.push_back(type.get<std::string>());
        if (type.is_array())
            for (const json &t : type)
                if (t.is_string()) types.push_back(t.get<std::string>());
        if (types.empty()) continue;
        bool ok = false;
        for (const auto &t : types) ok = ok || detail::has_type(it.value(), t);
        if (!ok) {
            std::string want;
            for (size_t i = 0; i < types.size(); ++i)
                want += (i ? (i + 1 == types.size() ? " or " : ", ") : "") + types[i];
            problems.push_back(
                tool + "argument '" + it.key() + "' must be " +
                (want == "integer" || want == "array" || want == "object" ? "an " : "a ") + want +
                ", got " + detail::json_kind(it.value()));
        }
    }
    return problems;
}

} // namespace rl::sdk::tools
