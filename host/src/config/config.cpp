// Run configuration: YAML -> checked JSON with defaults filled in.
#include "rl/host/config.hpp"
#include "rl/core/error.hpp"
#include "rl/core/names.hpp"
#include "rl/host/runtime.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

namespace rl::host {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string &where, const std::string &what) {
    throw HostError{RL_ERR_INVALID_ARG, where + ": " + what};
}

std::string at(const std::string &origin, const YAML::Node &node) {
    const YAML::Mark m = node.Mark();
    if (m.line < 0) return origin;
    return origin + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

using Keys = std::vector<ConfigKey>;

const ConfigKey *find_key(const Keys &keys, const std::string &path) {
    for (const auto &k : keys)
        if (path == k.key) return &k;
    return nullptr;
}

// Names directly under `prefix` ("" for the top level).
std::vector<std::string> children(const Keys &keys, const std::string &prefix) {
    std::vector<std::string> out;
    std::set<std::string> seen;
    for (const auto &k : keys) {
        std::string p = k.key;
        if (!prefix.empty()) {
            if (p.compare(0, prefix.size() + 1, prefix + ".") != 0) continue;
            p = p.substr(prefix.size() + 1);
        }
        std::string head = p.substr(0, p.find('.'));
        if (seen.insert(head).second) out.push_back(head);
    }
    return out;
}

bool is_section(const Keys &keys, const std::string &path) {
    return !find_key(keys, path) && !children(keys, path).empty();
}

std::string join(const std::vector<std::string> &xs) {
    std::string s;
    for (const auto &x : xs) s += (s.empty() ? "" : ", ") + x;
    return s;
}

// A YAML value of free-form data (plugin params) as JSON.
json to_json(const YAML::Node &n) {
    switch (n.Type()) {
        case YAML::NodeType::Null:
        case YAML::NodeType::Undefined:
            return nullptr;
        case YAML::NodeType::Sequence: {
            json a = json::array();
            for (const auto &x : n) a.push_back(to_json(x));
            return a;
        }
        case YAML::NodeType::Map: {
            json o = json::object();
            for (const auto &kv : n) o[kv.first.as<std::string>()] = to_json(kv.second);
            return o;
        }
        case YAML::NodeType::Scalar:
            break;
    }
    const std::string s = n.Scalar();
    if (n.Tag() == "!") return s; // quoted: always a string
    long long i;
    double d;
    bool b;
    if (YAML::convert<long long>::decode(n, i)) return i;
    if (YAML::convert<double>::decode(n, d)) return d;
    if (YAML::convert<bool>::decode(n, b)) return b;
    if (s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
    return s;
}

std::string shown(const YAML::Node &n) {
    if (n.IsScalar()) return "'" + n.Scalar() + "'";
    if (n.IsSequence()) return "a list";
    if (n.IsMap()) return "a mapping";
    return "nothing";
}

// The `filters` list: items {name, params, enforce}.
json filter_list(const ConfigKey &k, const YAML::Node &v, const std::string &where,
                 const std::string &expect) {
    if (!v.IsSequence()) bad(where, expect + ", got " + shown(v));
    json a = json::array();
    for (const auto &item : v) {
        if (!item.IsMap()) bad(where, expect + "; an item is " + shown(item));
        json o = json::object();
        for (const auto &kv : item) {
            const std::string name = kv.first.Scalar();
            if (name == "name") {
                if (!kv.second.IsScalar())
                    bad(where, std::string(k.key) + ": 'name' must be a string");
                o["name"] = kv.second.Scalar();
            } else if (name == "params") {
                if (!kv.second.IsMap() && !kv.second.IsNull())
                    bad(where, std::string(k.key) + ": 'params' must be a mapping");
                o["params"] = kv.second.IsNull() ? json::object() : to_json(kv.second);
            } else if (name == "enforce") {
                bool b;
                if (!YAML::convert<bool>::decode(kv.second, b))
                    bad(where, std::string(k.key) + ": 'enforce' must be true or false");
                o["enforce"] = b;
            } else {
                bad(where, std::string("unknown key '") + name + "' in an item of '" + k.key +
                               "'; valid keys: name, params, enforce");
            }
        }
        if (!o.contains("name"))
            bad(where, std::string("an item of '") + k.key + "' has no 'name'");
        if (!o.contains("params")) o["params"] = json::object();
        if (!o.contains("enforce")) o["enforce"] = false;
        a.push_back(o);
    }
    return a;
}

// A scalar YAML value read as T; anything else fails with `expect`.
template <class T>
T scalar_as(const YAML::Node &v, const std::string &where, const std::string &expect) {
    T x{};
    if (!v.IsScalar() || !YAML::convert<T>::decode(v, x)) bad(where, expect + ", got " + shown(v));
    return x;
}

// The YAML value of key `k` as JSON of the key's type, then checked against its
// declaration (choices, range); errors name `where` (file:line:column or the
// --set override) and the key.
json convert(const ConfigKey &k, const YAML::Node &v, const std::string &where) {
    const std::string expect = std::string("key '") + k.key + "' must be " +
                               config_type_name(k.type) + (k.nullable ? " or null" : "");
    json value;
    if (k.nullable && (v.IsNull() || (v.IsScalar() && v.Tag() != "!" &&
                                      (v.Scalar() == "~" || v.Scalar() == "null")))) {
        value = nullptr;
    } else {
        switch (k.type) {
            case ConfigType::String:
                if (!v.IsScalar()) bad(where, expect + ", got " + shown(v));
                value = v.Scalar();
                break;
            case ConfigType::Integer:
                value = scalar_as<long long>(v, where, expect);
                break;
            case ConfigType::Number:
                value = scalar_as<double>(v, where, expect);
                break;
            case ConfigType::Boolean:
                value = scalar_as<bool>(v, where, expect);
                break;
            case ConfigType::StringList: {
                if (!v.IsSequence()) bad(where, expect + ", got " + shown(v));
                value = json::array();
                for (const auto &x : v) {
                    if (!x.IsScalar()) bad(at(where.substr(0, where.find(':')), x), expect);
                    value.push_back(x.Scalar());
                }
                break;
            }
            case ConfigType::Object:
                if (!v.IsMap() && !v.IsNull()) bad(where, expect + ", got " + shown(v));
                value = v.IsNull() ? json::object() : to_json(v);
                break;
            case ConfigType::ObjectList:
                value = filter_list(k, v, where, expect);
                break;
        }
    }
    try {
        return rl::core::check_param(k, value, k.key);
    } catch (const rl::core::Error &e) {
        bad(where, e.what());
    }
}

void set_path(json &cfg, const std::string &path, json value) {
    json *cur = &cfg;
    std::stringstream ss(path);
    std::string part;
    std::vector<std::string> parts;
    while (std::getline(ss, part, '.')) parts.push_back(part);
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
        json &next = (*cur)[parts[i]];
        if (!next.is_object()) next = json::object();
        cur = &next;
    }
    (*cur)[parts.back()] = std::move(value);
}

// Where a loaded configuration's keys come from: the schema, plus what the
// file and the overrides hold under top-level names the schema does not know
// (kept for the script to declare).
struct Loader {
    const Keys &keys;
    json cfg = json::object();
    std::vector<std::string> undeclared;

    void keep_undeclared(const std::string &head) {
        if (std::find(undeclared.begin(), undeclared.end(), head) == undeclared.end())
            undeclared.push_back(head);
    }

    std::string unknown(const std::string &full, const std::string &prefix) const {
        return "unknown key '" + full + "'; valid keys" +
               (prefix.empty() ? std::string(" at the top level") : " under '" + prefix + "'") +
               ": " + join(children(keys, prefix));
    }

    void apply_map(const YAML::Node &map, const std::string &prefix, const std::string &origin) {
        for (const auto &kv : map) {
            const YAML::Node &knode = kv.first;
            if (!knode.IsScalar()) bad(at(origin, knode), "keys must be plain names");
            const std::string full =
                prefix.empty() ? knode.Scalar() : prefix + "." + knode.Scalar();
            if (const ConfigKey *k = find_key(keys, full)) {
                set_path(cfg, full, convert(*k, kv.second, at(origin, kv.second)));
            } else if (is_section(keys, full)) {
                if (kv.second.IsNull()) continue;
                if (!kv.second.IsMap())
                    bad(at(origin, kv.second),
                        "key '" + full + "' must be a mapping, got " + shown(kv.second));
                apply_map(kv.second, full, origin);
            } else if (prefix.empty() && kv.second.IsMap()) {
                // A section of the script's own ("ppo:"): checked when the
                // script declares it.
                json &slot = cfg[full];
                if (!slot.is_object()) slot = json::object();
                const json given = to_json(kv.second);
                for (const auto &item : given.items()) slot[item.key()] = item.value();
                keep_undeclared(full);
            } else {
                bad(at(origin, knode), unknown(full, prefix));
            }
        }
    }

    void apply_override(const std::string &item) {
        const std::string origin = "--set " + item;
        const size_t eq = item.find('=');
        if (eq == std::string::npos || eq == 0) bad(origin, "expected key=value");
        const std::string key = item.substr(0, eq);
        YAML::Node value;
        try {
            value = YAML::Load(item.substr(eq + 1));
        } catch (const YAML::Exception &e) {
            bad(origin, "the value is not valid YAML: " + e.msg);
        }
        if (const ConfigKey *k = find_key(keys, key)) {
            set_path(cfg, key, convert(*k, value, origin));
            return;
        }
        // Inside a free-form mapping: env.params.min_len=3.
        for (const auto &k : keys) {
            const std::string p = k.key;
            if (k.type == ConfigType::Object && key.compare(0, p.size() + 1, p + ".") == 0) {
                set_path(cfg, key, to_json(value));
                return;
            }
        }
        const std::string head = key.substr(0, key.find('.'));
        if (key.find('.') != std::string::npos && !find_key(keys, head) &&
            !is_section(keys, head)) {
            set_path(cfg, key, to_json(value)); // the script's own section
            keep_undeclared(head);
            return;
        }
        const size_t dot = key.rfind('.');
        const std::string prefix = dot == std::string::npos ? "" : key.substr(0, dot);
        bad(origin, unknown(key, is_section(keys, prefix) ? prefix : ""));
    }
};

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

LoadedConfig load_config(const std::string &path, const std::vector<std::string> &overrides) {
    Loader l{config_schema(), json::object(), {}};
    for (const auto &k : l.keys) set_path(l.cfg, k.key, k.fallback);
    if (!path.empty()) {
        std::ifstream in(path);
        if (!in) throw HostError{RL_ERR_IO, "config file '" + path + "' cannot be read"};
        YAML::Node root;
        try {
            root = YAML::Load(in);
        } catch (const YAML::ParserException &e) {
            bad(path + ":" + std::to_string(e.mark.line + 1) + ":" +
                    std::to_string(e.mark.column + 1),
                "malformed YAML: " + e.msg);
        } catch (const YAML::Exception &e) {
            bad(path, std::string("malformed YAML: ") + e.what());
        }
        if (root.IsDefined() && !root.IsNull()) {
            if (!root.IsMap()) bad(at(path, root), "the top level must be a mapping of keys");
            l.apply_map(root, "", path);
        }
    }
    for (const auto &o : overrides) l.apply_override(o);
    return {std::move(l.cfg), std::move(l.undeclared)};
}

std::vector<ConfigKey> parse_declarations(const json &list) {
    const std::string what = "config declarations";
    if (!list.is_array()) bad(what, "must be a JSON array of {key, type, default, doc, ...}");
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
        k.type = type_named(d["type"].get<std::string>(), where);
        k.doc = d.value("doc", std::string());
        k.nullable = d.value("nullable", false);
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
        k.range.lo_open = d.value("min_open", false);
        k.range.hi_open = d.value("max_open", false);
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
