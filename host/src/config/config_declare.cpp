// Run configuration: a script's own key declarations (parse_declarations, declare_config) and
// the schema as JSON and Markdown.
#include "config_internal.hpp"
#include "rl/core/error.hpp"
#include "rl/core/json.hpp"
#include "rl/core/names.hpp"
#include "rl/host/config.hpp"
#include "rl/host/runtime.hpp"

#include <functional>
#include <set>
#include <sstream>

namespace rl::host {

using namespace config_detail;

namespace {

// The "type" names of a declaration.
constexpr rl::core::Named<ConfigType> kTypeWords[] = {
    {ConfigType::String, "string"},      {ConfigType::Integer, "integer"},
    {ConfigType::Number, "number"},      {ConfigType::Boolean, "boolean"},
    {ConfigType::StringList, "strings"}, {ConfigType::Object, "mapping"},
    {ConfigType::ObjectList, "mappings"}};

ConfigType type_named(const std::string &name, const std::string &where) {
    if (auto t = rl::core::value_in(kTypeWords, name)) return *t;
    bad(where, "type '" + name + "' is unknown; valid: " + rl::core::names_in(kTypeWords));
}

const char *type_word(ConfigType t) {
    return rl::core::name_in(kTypeWords, t);
}

std::string shown_default(const ConfigKey &k) {
    if (k.fallback.is_null()) return "null";
    if (k.fallback.is_string())
        return k.fallback.get<std::string>().empty() ? "''" : k.fallback.get<std::string>();
    return k.fallback.dump();
}

} // namespace

std::vector<ConfigKey> parse_declarations(const json &list) {
    const std::string what = "config declarations";
    if (!list.is_array()) bad(what, "must be a JSON array of {key, type, default, doc, ...}");
    const std::string deep = rl::core::json_too_deep(list, "", kMaxConfigDepth);
    if (!deep.empty())
        bad(what, "'" + deep + "' is nested deeper than " + std::to_string(kMaxConfigDepth) +
                      " levels (the limit)");
    std::vector<ConfigKey> out;
    for (size_t i = 0; i < list.size(); ++i) {
        const json &d = list[i];
        const std::string where = what + " item " + std::to_string(i + 1);
        if (!d.is_object() || !d.contains("key") || !d["key"].is_string() || !d.contains("type") ||
            !d["type"].is_string())
            bad(where, "needs string fields 'key' and 'type'");
        ConfigKey k;
        k.key = d["key"].get<std::string>();
        if (k.key.find('.') == std::string::npos || k.key.front() == '.' || k.key.back() == '.')
            bad(where, "key '" + k.key + "' must be a dotted path under a section ('ppo.epochs')");
        const std::string head = k.key.substr(0, k.key.find('.'));
        if (find_key(config_schema(), head) || is_section(config_schema(), head))
            bad(where, "key '" + k.key + "' is in the host's section '" + head +
                           "'; a script declares keys of its own sections");
        if (parts_of(k.key) > kMaxConfigDepth)
            bad(where, "key '" + printable(k.key) + "' has more than " +
                           std::to_string(kMaxConfigDepth) + " parts (the nesting limit)");
        k.type = type_named(d["type"].get<std::string>(), where);
        // An optional field of type `is` (named `type` in messages), or `def`.
        auto field = [&](const char *name, auto def, bool (json::*is)() const, const char *type) {
            if (!d.contains(name) || d[name].is_null()) return def;
            if (!(d[name].*is)())
                bad(where,
                    std::string("'") + name + "' must be " + type + ", got " + d[name].type_name());
            return d[name].get<decltype(def)>();
        };
        k.doc = field("doc", std::string(), &json::is_string, "a string");
        k.nullable = field("nullable", false, &json::is_boolean, "true or false");
        if (d.contains("choices")) {
            if (!d["choices"].is_array()) bad(where, "'choices' must be a list of strings");
            for (const auto &c : d["choices"]) {
                if (!c.is_string()) bad(where, "'choices' must be a list of strings");
                k.choices.push_back(c.get<std::string>());
            }
        }
        for (const char *f : {"min", "max"})
            if (d.contains(f) && !d[f].is_number())
                bad(where, std::string("'") + f + "' must be a number");
        if (d.contains("min")) k.range.lo = d["min"].get<double>();
        if (d.contains("max")) k.range.hi = d["max"].get<double>();
        k.range.lo_open = field("min_open", false, &json::is_boolean, "true or false");
        k.range.hi_open = field("max_open", false, &json::is_boolean, "true or false");
        const json fallback = d.contains("default") ? d["default"] : json();
        try {
            k.fallback = rl::core::check_param(k, fallback, k.key);
        } catch (const rl::core::Error &e) {
            bad(where, std::string("default: ") + e.what());
        }
        for (const auto &prev : out)
            if (prev.key == k.key) bad(where, "key '" + k.key + "' is declared twice");
        out.push_back(std::move(k));
    }
    return out;
}

json declare_config(const json &config, const std::vector<ConfigKey> &declared) {
    // Before the copy below, which recurses as deep as the value is nested.
    const std::string deep = rl::core::json_too_deep(config, "", kMaxConfigDepth);
    if (!deep.empty())
        bad("configuration", "key '" + deep + "' is nested deeper than " +
                                 std::to_string(kMaxConfigDepth) + " levels (the limit)");
    json out = config;
    std::set<std::string> sections;
    for (const auto &k : declared) sections.insert(k.key.substr(0, k.key.find('.')));
    // Undeclared top-level names: anything the host schema does not know.
    std::vector<std::string> extra;
    for (const auto &kv : config.items())
        if (!find_key(config_schema(), kv.key()) && !is_section(config_schema(), kv.key()))
            extra.push_back(kv.key());
    for (const auto &name : extra) {
        if (!sections.count(name)) {
            std::vector<std::string> valid = children(config_schema(), "");
            valid.insert(valid.end(), sections.begin(), sections.end());
            bad("configuration", "unknown key '" + name + "'; valid keys at the top level: " +
                                     join(valid) + " (a script declares keys of its own)");
        }
    }
    // Each declared key: the given value checked, or its default.
    for (const auto &k : declared) {
        const json *given = &config;
        std::stringstream ss(k.key);
        std::string part;
        while (given && std::getline(ss, part, '.'))
            given = given->is_object() && given->contains(part) ? &(*given)[part] : nullptr;
        json value = k.fallback;
        if (given) {
            try {
                value = rl::core::check_param(k, *given, k.key);
            } catch (const rl::core::Error &e) {
                bad("configuration", e.what());
            }
        }
        set_path(out, k.key, value);
    }
    // Given keys under the declared sections that no declaration covers.
    std::function<void(const json &, const std::string &)> walk = [&](const json &node,
                                                                      const std::string &path) {
        if (find_key(declared, path)) return;
        if (!node.is_object() || !is_section(declared, path)) {
            const size_t dot = path.rfind('.');
            const std::string prefix = dot == std::string::npos ? "" : path.substr(0, dot);
            bad("configuration", "unknown key '" + path + "'; valid keys under '" + prefix +
                                     "': " + join(children(declared, prefix)));
        }
        for (const auto &kv : node.items()) walk(kv.value(), path + "." + kv.key());
    };
    for (const auto &name : sections)
        if (config.contains(name)) walk(config[name], name);
    return out;
}

json schema_json(const std::vector<ConfigKey> &keys) {
    json a = json::array();
    for (const auto &k : keys) {
        json item = {
            {"key", k.key}, {"type", type_word(k.type)}, {"default", k.fallback}, {"doc", k.doc}};
        if (!k.choices.empty()) item["choices"] = k.choices;
        if (k.range.lo) item["min"] = *k.range.lo;
        if (k.range.hi) item["max"] = *k.range.hi;
        if (k.range.lo_open) item["min_open"] = true;
        if (k.range.hi_open) item["max_open"] = true;
        if (k.nullable) item["nullable"] = true;
        a.push_back(std::move(item));
    }
    return a;
}

std::string schema_markdown(const std::vector<ConfigKey> &keys) {
    std::string out;
    std::string section = "\x01";
    for (const auto &k : keys) {
        const size_t dot = k.key.find('.');
        const std::string sec = dot == std::string::npos ? "" : k.key.substr(0, dot);
        if (sec != section) {
            section = sec;
            out += "\n### " + (sec.empty() ? std::string("(top level)") : sec) + "\n\n";
            out += "| key | type | default | meaning |\n|---|---|---|---|\n";
        }
        std::string meaning = k.doc;
        if (!k.choices.empty()) {
            std::string c;
            for (const auto &x : k.choices) c += (c.empty() ? "" : ", ") + x;
            meaning += " One of: " + c + ".";
        }
        if (k.range.bounded()) meaning += " Must be " + k.range.describe() + ".";
        if (k.nullable) meaning += " May be null.";
        out += "| `" + k.key + "` | " + config_type_name(k.type) + " | `" + shown_default(k) +
               "` | " + meaning + " |\n";
    }
    return out;
}

} // namespace rl::host
