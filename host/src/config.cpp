// Run configuration: YAML -> checked JSON with defaults filled in.
#include "rl/host/config.hpp"
#include "rl/host/runtime.hpp"

#include <yaml-cpp/yaml.h>

#include <fstream>
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

const ConfigKey *find_key(const std::string &path) {
    for (const auto &k : config_schema())
        if (path == k.path) return &k;
    return nullptr;
}

// Names directly under `prefix` ("" for the top level).
std::vector<std::string> children(const std::string &prefix) {
    std::vector<std::string> out;
    std::set<std::string> seen;
    for (const auto &k : config_schema()) {
        std::string p = k.path;
        if (!prefix.empty()) {
            if (p.compare(0, prefix.size() + 1, prefix + ".") != 0) continue;
            p = p.substr(prefix.size() + 1);
        }
        std::string head = p.substr(0, p.find('.'));
        if (seen.insert(head).second) out.push_back(head);
    }
    return out;
}

bool is_section(const std::string &path) {
    return !find_key(path) && !children(path).empty();
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

// A choice "cuda:N" matches "cuda:" followed by decimal digits.
bool choice_matches(const std::string &choice, const std::string &s) {
    if (choice == s) return true;
    if (choice.size() < 2 || choice.compare(choice.size() - 2, 2, ":N") != 0) return false;
    const size_t n = choice.size() - 1; // keeps the ':'
    if (s.size() <= n || s.size() > n + 4 || s.compare(0, n, choice, 0, n) != 0) return false;
    for (size_t i = n; i < s.size(); ++i)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

std::string shown(const YAML::Node &n) {
    if (n.IsScalar()) return "'" + n.Scalar() + "'";
    if (n.IsSequence()) return "a list";
    if (n.IsMap()) return "a mapping";
    return "nothing";
}

json convert(const ConfigKey &k, const YAML::Node &v, const std::string &where) {
    const std::string expect =
        std::string("key '") + k.path + "' must be " + config_type_name(k.type);
    switch (k.type) {
        case ConfigType::String: {
            if (!v.IsScalar()) bad(where, expect + ", got " + shown(v));
            std::string s = v.Scalar();
            if (k.choices) {
                std::string all = k.choices;
                std::stringstream ss(all);
                std::string c;
                bool ok = false;
                while (std::getline(ss, c, '|')) ok = ok || choice_matches(c, s);
                if (!ok) {
                    std::string list = all;
                    for (auto &ch : list)
                        if (ch == '|') ch = ',';
                    bad(where, std::string("key '") + k.path + "' must be one of " + list +
                                   "; got '" + s + "'");
                }
            }
            return s;
        }
        case ConfigType::Integer: {
            long long i;
            if (!v.IsScalar() || !YAML::convert<long long>::decode(v, i))
                bad(where, expect + ", got " + shown(v));
            return i;
        }
        case ConfigType::Number: {
            double d;
            if (!v.IsScalar() || !YAML::convert<double>::decode(v, d))
                bad(where, expect + ", got " + shown(v));
            return d;
        }
        case ConfigType::Boolean: {
            bool b;
            if (!v.IsScalar() || !YAML::convert<bool>::decode(v, b))
                bad(where, expect + ", got " + shown(v));
            return b;
        }
        case ConfigType::StringList: {
            if (!v.IsSequence()) bad(where, expect + ", got " + shown(v));
            json a = json::array();
            for (const auto &x : v) {
                if (!x.IsScalar()) bad(at(where.substr(0, where.find(':')), x), expect);
                a.push_back(x.Scalar());
            }
            return a;
        }
        case ConfigType::Object:
            if (!v.IsMap() && !v.IsNull()) bad(where, expect + ", got " + shown(v));
            return v.IsNull() ? json::object() : to_json(v);
        case ConfigType::ObjectList: {
            if (!v.IsSequence()) bad(where, expect + ", got " + shown(v));
            json a = json::array();
            for (const auto &item : v) {
                if (!item.IsMap()) bad(where, expect + "; an item is " + shown(item));
                json o = json::object();
                for (const auto &kv : item) {
                    const std::string name = kv.first.Scalar();
                    if (name == "name") {
                        if (!kv.second.IsScalar())
                            bad(where, std::string(k.path) + ": 'name' must be a string");
                        o["name"] = kv.second.Scalar();
                    } else if (name == "params") {
                        if (!kv.second.IsMap() && !kv.second.IsNull())
                            bad(where, std::string(k.path) + ": 'params' must be a mapping");
                        o["params"] = kv.second.IsNull() ? json::object() : to_json(kv.second);
                    } else if (name == "enforce") {
                        bool b;
                        if (!YAML::convert<bool>::decode(kv.second, b))
                            bad(where, std::string(k.path) + ": 'enforce' must be true or false");
                        o["enforce"] = b;
                    } else {
                        bad(where, std::string("unknown key '") + name + "' in an item of '" +
                                       k.path + "'; valid keys: name, params, enforce");
                    }
                }
                if (!o.contains("name"))
                    bad(where, std::string("an item of '") + k.path + "' has no 'name'");
                if (!o.contains("params")) o["params"] = json::object();
                if (!o.contains("enforce")) o["enforce"] = false;
                a.push_back(o);
            }
            return a;
        }
    }
    return nullptr;
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

void apply_map(json &cfg, const YAML::Node &map, const std::string &prefix,
               const std::string &origin) {
    for (const auto &kv : map) {
        const YAML::Node &knode = kv.first;
        if (!knode.IsScalar()) bad(at(origin, knode), "keys must be plain names");
        const std::string full = prefix.empty() ? knode.Scalar() : prefix + "." + knode.Scalar();
        if (const ConfigKey *k = find_key(full)) {
            set_path(cfg, full, convert(*k, kv.second, at(origin, kv.second)));
        } else if (is_section(full)) {
            if (kv.second.IsNull()) continue;
            if (!kv.second.IsMap())
                bad(at(origin, kv.second),
                    "key '" + full + "' must be a mapping, got " + shown(kv.second));
            apply_map(cfg, kv.second, full, origin);
        } else {
            bad(at(origin, knode), "unknown key '" + full + "'; valid keys" +
                                       (prefix.empty() ? std::string(" at the top level")
                                                       : " under '" + prefix + "'") +
                                       ": " + join(children(prefix)));
        }
    }
}

json defaults() {
    json cfg = json::object();
    for (const auto &k : config_schema())
        set_path(cfg, k.path, convert(k, YAML::Load(k.fallback), std::string("schema ") + k.path));
    return cfg;
}

void apply_override(json &cfg, const std::string &item) {
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
    if (const ConfigKey *k = find_key(key)) {
        set_path(cfg, key, convert(*k, value, origin));
        return;
    }
    // Inside a free-form mapping: env.params.min_len=3.
    for (const auto &k : config_schema()) {
        const std::string p = k.path;
        if (k.type == ConfigType::Object && key.compare(0, p.size() + 1, p + ".") == 0) {
            set_path(cfg, key, to_json(value));
            return;
        }
    }
    std::string prefix = key.substr(0, key.rfind('.') == std::string::npos ? 0 : key.rfind('.'));
    bad(origin, "unknown key '" + key + "'; valid keys" +
                    (prefix.empty() || !is_section(prefix)
                         ? std::string(" at the top level: ") + join(children(""))
                         : " under '" + prefix + "': " + join(children(prefix))));
}

} // namespace

nlohmann::json load_config(const std::string &path, const std::vector<std::string> &overrides) {
    json cfg = defaults();
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
            apply_map(cfg, root, "", path);
        }
    }
    for (const auto &o : overrides) apply_override(cfg, o);
    return cfg;
}

} // namespace rl::host
