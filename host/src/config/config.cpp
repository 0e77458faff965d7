// Run configuration: YAML -> checked JSON with defaults filled in.
#include "config_internal.hpp"
#include "rl/host/config.hpp"
#include "rl/core/error.hpp"
#include "rl/core/json.hpp"
#include "rl/core/names.hpp"
#include "rl/host/runtime.hpp"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <sstream>
#include <type_traits>

namespace rl::host {

using namespace config_detail;

namespace {

std::string at(const std::string &origin, const YAML::Node &node) {
    const YAML::Mark m = node.Mark();
    if (m.line < 0) return origin;
    return origin + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

std::string shown(const YAML::Node &n) {
    if (n.IsScalar()) return "'" + printable(n.Scalar()) + "'";
    if (n.IsSequence()) return "a list";
    if (n.IsMap()) return "a mapping";
    return "nothing";
}

// A scalar that is a whole number as yaml-cpp reads one (decimal, 0x hex,
// 0 octal) but too large for 64 bits.
bool integer_overflows(const std::string &s) {
    if (s.empty() || s.find_first_not_of("+-0123456789abcdefABCDEFxX") != std::string::npos)
        return false;
    char *end = nullptr;
    errno = 0;
    (void)std::strtoll(s.c_str(), &end, 0);
    return end == s.c_str() + s.size() && errno == ERANGE;
}

// A scalar written as a number whose magnitude no double holds ("1e400").
bool double_overflows(const std::string &s) {
    if (s.empty() || s.find_first_not_of("+-.0123456789eE") != std::string::npos) return false;
    char *end = nullptr;
    errno = 0;
    const double d = std::strtod(s.c_str(), &end);
    return end == s.c_str() + s.size() && errno == ERANGE && std::isinf(d);
}

// One YAML source (the file, or a --set value) as the conversion walks it.
// Each node goes through enter(), which counts it against kMaxConfigNodes,
// bounds the nesting by kMaxConfigDepth and refuses a list or mapping that
// contains itself. Errors name the source, the line and column, and the key.
class Walk {
public:
    // `origin`: the file path, or "--set ITEM" (is_file false).
    Walk(std::string origin, bool is_file) : origin_(std::move(origin)), is_file_(is_file) {}

    // Where `m` is in the source.
    std::string at(const YAML::Mark &m) const {
        if (m.line < 0) return origin_;
        const std::string lc = std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
        return is_file_ ? origin_ + ":" + lc : origin_ + " (at " + lc + " of the value)";
    }

    [[noreturn]] void fail(const YAML::Mark &m, const std::string &what) const { bad(at(m), what); }

    // Leaves the node entered on destruction.
    class Scope {
    public:
        explicit Scope(Walk *w) : w_(w) {}
        Scope(Scope &&o) noexcept : w_(o.w_) { o.w_ = nullptr; }
        Scope(const Scope &) = delete;
        Scope &operator=(const Scope &) = delete;
        Scope &operator=(Scope &&) = delete;
        ~Scope() {
            if (w_) w_->open_.pop_back();
        }

    private:
        Walk *w_;
    };

    // Enters `n`, found at key `path` (`depth` parts) written at `site`.
    [[nodiscard]] Scope enter(const YAML::Node &n, const std::string &path, size_t depth,
                              const YAML::Mark &site) {
        if (++nodes_ > kMaxConfigNodes)
            fail(site, "key '" + path + "': the YAML expands to more than " +
                           std::to_string(kMaxConfigNodes) +
                           " values through its aliases (the limit)");
        if (depth > kMaxConfigDepth)
            fail(site, "key '" + path + "' is nested deeper than " +
                           std::to_string(kMaxConfigDepth) + " levels (the limit)");
        if (!n.IsMap() && !n.IsSequence()) return Scope(nullptr);
        for (const auto &o : open_) {
            if (o.is(n)) {
                const YAML::Mark m = n.Mark();
                // A list item has no key to point at, and an alias has the
                // mark of its anchor: point at the list holding it instead.
                const bool item = site.line == m.line && site.column == m.column;
                fail(item ? open_.back().Mark() : site,
                     "key '" + path + "' is an alias of the " + (n.IsMap() ? "mapping" : "list") +
                         " at line " + std::to_string(m.line + 1) + ", column " +
                         std::to_string(m.column + 1) +
                         ", which contains it: an alias inside its own anchor (or a '<<' "
                         "merge that leads back to it) makes an endless value");
            }
        }
        open_.push_back(n);
        return Scope(this);
    }

    // The name of mapping key `k` under `prefix`: a plain UTF-8 scalar.
    std::string key(const YAML::Node &k, const std::string &prefix) const {
        const std::string where = prefix.empty() ? "the top level" : "'" + prefix + "'";
        if (!k.IsScalar())
            fail(k.Mark(), "keys must be plain names; a key under " + where + " is " + shown(k));
        const size_t b = bad_utf8_at(k.Scalar());
        if (b != std::string::npos)
            fail(k.Mark(), "a key under " + where + " is not valid UTF-8 (byte " +
                               std::to_string(b) + " of '" + printable(k.Scalar()) + "')");
        return prefix.empty() ? k.Scalar() : prefix + "." + k.Scalar();
    }

    // Mapping `map` (at `path`, already entered) with YAML merge keys applied:
    // `<<: *base` (or a list of mappings) adds every key of the merged
    // mapping(s) that `map` does not set itself, the first source winning
    // over later ones, merges inside the sources applied too. A merge that
    // leads back to a mapping being read is refused by enter().
    YAML::Node merged(const YAML::Node &map, const std::string &path, size_t depth) {
        bool has_merge = false;
        for (const auto &kv : map)
            if (is_merge_key(kv.first)) has_merge = true;
        if (!has_merge) return map;
        YAML::Node out(YAML::NodeType::Map);
        std::set<std::string> seen;
        for (const auto &kv : map) // the mapping's own keys win
            if (!is_merge_key(kv.first) && seen.insert(kv.first.Scalar()).second)
                out.force_insert(kv.first, kv.second);
        auto take = [&](const YAML::Node &src, const std::string &src_path, size_t d) {
            for (const auto &e : merged(src, src_path, d))
                if (seen.insert(e.first.Scalar()).second) out.force_insert(e.first, e.second);
        };
        for (const auto &kv : map) {
            if (!is_merge_key(kv.first)) continue;
            const std::string where = (path.empty() ? std::string() : path + ".") + "<<";
            const std::string expect =
                "key '" + where + "' (a YAML merge) must be a mapping or a list of mappings";
            if (kv.second.IsMap()) {
                const Scope scope = enter(kv.second, where, depth + 1, kv.first.Mark());
                take(kv.second, where, depth + 1);
            } else if (kv.second.IsSequence()) {
                const Scope scope = enter(kv.second, where, depth + 1, kv.first.Mark());
                size_t i = 0;
                for (const auto &item : kv.second) {
                    const std::string at_item = where + "[" + std::to_string(i++) + "]";
                    const Scope item_scope = enter(item, at_item, depth + 2, item.Mark());
                    if (!item.IsMap())
                        fail(kv.first.Mark(), expect + "; an item is " + shown(item));
                    take(item, at_item, depth + 2);
                }
            } else {
                fail(kv.first.Mark(), expect + ", got " + shown(kv.second));
            }
        }
        return out;
    }

    static bool is_merge_key(const YAML::Node &k) {
        return k.IsScalar() && k.Scalar() == "<<" && k.Tag() != "!";
    }

    // The text of scalar `n` (at `path`), checked to be UTF-8.
    std::string text(const YAML::Node &n, const std::string &path, const YAML::Mark &site) const {
        const size_t b = bad_utf8_at(n.Scalar());
        if (b != std::string::npos)
            fail(site, "key '" + path + "' is not valid UTF-8 (byte " + std::to_string(b) + " of " +
                           shown(n) + ")");
        return n.Scalar();
    }

    // A YAML value of free-form data (plugin params, a script's section) as
    // JSON; `n` is at `path` (`depth` parts), written at `site`.
    json to_json(const YAML::Node &n, const std::string &path, size_t depth,
                 const YAML::Mark &site) {
        const Scope scope = enter(n, path, depth, site);
        switch (n.Type()) {
            case YAML::NodeType::Null:
            case YAML::NodeType::Undefined:
                return nullptr;
            case YAML::NodeType::Sequence: {
                json a = json::array();
                size_t i = 0;
                for (const auto &x : n) {
                    a.push_back(
                        to_json(x, path + "[" + std::to_string(i++) + "]", depth + 1, x.Mark()));
                }
                return a;
            }
            case YAML::NodeType::Map: {
                json o = json::object();
                for (const auto &kv : merged(n, path, depth)) {
                    const std::string full = key(kv.first, path);
                    o[kv.first.Scalar()] = to_json(kv.second, full, depth + 1, kv.first.Mark());
                }
                return o;
            }
            case YAML::NodeType::Scalar:
                break;
        }
        const std::string &s = n.Scalar();
        if (n.Tag() == "!") return text(n, path, site); // quoted: always a string
        long long i;
        double d;
        bool b;
        if (YAML::convert<long long>::decode(n, i)) return i;
        if (integer_overflows(s))
            fail(site, "key '" + path + "' is the integer " + shown(n) +
                           ", outside the 64-bit range; quote it to pass it as a string");
        if (YAML::convert<double>::decode(n, d)) {
            if (!std::isfinite(d))
                fail(site, "key '" + path + "' is " + shown(n) +
                               ": JSON has no infinity or NaN; quote it to pass it as a string");
            return d;
        }
        if (double_overflows(s))
            fail(site, "key '" + path + "' is the number " + shown(n) +
                           ", outside the range of a double; quote it to pass it as a string");
        if (YAML::convert<bool>::decode(n, b)) return b;
        if (s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
        return text(n, path, site);
    }

private:
    std::string origin_;
    bool is_file_;
    size_t nodes_ = 0;
    std::vector<YAML::Node> open_; // the lists and mappings being converted
};

// The `filters` list: items {name, params, enforce}.
json filter_list(Walk &w, const ConfigKey &k, const YAML::Node &v, const std::string &where,
                 const std::string &expect) {
    if (!v.IsSequence()) bad(where, expect + ", got " + shown(v));
    const size_t depth = parts_of(k.key);
    json a = json::array();
    size_t i = 0;
    for (const auto &item : v) {
        const std::string path = std::string(k.key) + "[" + std::to_string(i++) + "]";
        const Walk::Scope scope = w.enter(item, path, depth + 1, item.Mark());
        if (!item.IsMap()) bad(where, expect + "; an item is " + shown(item));
        json o = json::object();
        for (const auto &kv : item) {
            const std::string full = w.key(kv.first, path);
            const std::string name = kv.first.Scalar();
            const YAML::Mark site = kv.first.Mark();
            if (name == "name") {
                const Walk::Scope s = w.enter(kv.second, full, depth + 2, site);
                if (!kv.second.IsScalar())
                    bad(where, std::string(k.key) + ": 'name' must be a string");
                o["name"] = w.text(kv.second, full, site);
            } else if (name == "params") {
                if (!kv.second.IsMap() && !kv.second.IsNull())
                    bad(where, std::string(k.key) + ": 'params' must be a mapping");
                o["params"] = kv.second.IsNull() ? json::object()
                                                 : w.to_json(kv.second, full, depth + 2, site);
            } else if (name == "enforce") {
                const Walk::Scope s = w.enter(kv.second, full, depth + 2, site);
                bool b;
                if (!YAML::convert<bool>::decode(kv.second, b))
                    bad(where, std::string(k.key) + ": 'enforce' must be true or false");
                o["enforce"] = b;
            } else {
                bad(where, std::string("unknown key '") + printable(name) + "' in an item of '" +
                               k.key + "'; valid keys: name, params, enforce");
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

// A scalar YAML value read as T; anything else fails with `expect` (and says
// when the value is a number out of T's range).
template <class T>
T scalar_as(const YAML::Node &v, const std::string &where, const std::string &expect) {
    T x{};
    if (v.IsScalar() && YAML::convert<T>::decode(v, x)) return x;
    std::string why;
    if (v.IsScalar() && std::is_same_v<T, long long> && integer_overflows(v.Scalar()))
        why = ", outside the 64-bit range";
    if (v.IsScalar() && std::is_floating_point_v<T> && double_overflows(v.Scalar()))
        why = ", outside the range of a double";
    bad(where, expect + ", got " + shown(v) + why);
}

// The YAML value of key `k` as JSON of the key's type, then checked against its
// declaration (choices, range); errors name `where` (file:line:column or the
// --set override) and the key.
json convert(Walk &w, const ConfigKey &k, const YAML::Node &v, const std::string &where,
             const YAML::Mark &site) {
    const std::string expect = std::string("key '") + k.key + "' must be " +
                               config_type_name(k.type) + (k.nullable ? " or null" : "");
    const size_t depth = parts_of(k.key);
    json value;
    if (k.nullable && (v.IsNull() || (v.IsScalar() && v.Tag() != "!" &&
                                      (v.Scalar() == "~" || v.Scalar() == "null")))) {
        value = nullptr;
    } else {
        switch (k.type) {
            case ConfigType::String: {
                const Walk::Scope scope = w.enter(v, k.key, depth, site);
                if (!v.IsScalar()) bad(where, expect + ", got " + shown(v));
                value = w.text(v, k.key, v.Mark());
                break;
            }
            case ConfigType::Integer:
                value = scalar_as<long long>(v, where, expect);
                break;
            case ConfigType::Number: {
                const double d = scalar_as<double>(v, where, expect);
                if (!std::isfinite(d))
                    bad(where, std::string("key '") + k.key + "' must be a finite number, got " +
                                   shown(v));
                value = d;
                break;
            }
            case ConfigType::Boolean:
                value = scalar_as<bool>(v, where, expect);
                break;
            case ConfigType::StringList: {
                const Walk::Scope scope = w.enter(v, k.key, depth, site);
                if (!v.IsSequence()) bad(where, expect + ", got " + shown(v));
                value = json::array();
                size_t i = 0;
                for (const auto &x : v) {
                    const std::string path = std::string(k.key) + "[" + std::to_string(i++) + "]";
                    const Walk::Scope s = w.enter(x, path, depth + 1, x.Mark());
                    if (!x.IsScalar())
                        w.fail(x.Mark(), expect + "; item " + path + " is " + shown(x));
                    value.push_back(w.text(x, path, x.Mark()));
                }
                break;
            }
            case ConfigType::Object:
                if (!v.IsMap() && !v.IsNull()) bad(where, expect + ", got " + shown(v));
                value = v.IsNull() ? json::object() : w.to_json(v, k.key, depth, site);
                break;
            case ConfigType::ObjectList:
                value = filter_list(w, k, v, where, expect);
                break;
        }
    }
    try {
        return rl::core::check_param(k, value, k.key);
    } catch (const rl::core::Error &e) {
        bad(where, e.what());
    }
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
        return "unknown key '" + printable(full) + "'; valid keys" +
               (prefix.empty() ? std::string(" at the top level") : " under '" + prefix + "'") +
               ": " + join(children(keys, prefix));
    }

    // The mapping `map` at key `prefix` (`depth` parts) of the file.
    void apply_map(Walk &w, const YAML::Node &map, const std::string &prefix, size_t depth,
                   const YAML::Mark &site) {
        const Walk::Scope scope = w.enter(map, prefix, depth, site);
        for (const auto &kv : w.merged(map, prefix, depth)) {
            const YAML::Node &knode = kv.first;
            const std::string full = w.key(knode, prefix);
            const std::string where = w.at(kv.second.Mark());
            if (const ConfigKey *k = find_key(keys, full)) {
                set_path(cfg, full, convert(w, *k, kv.second, where, knode.Mark()));
            } else if (is_section(keys, full)) {
                if (kv.second.IsNull()) continue;
                if (!kv.second.IsMap())
                    bad(where, "key '" + full + "' must be a mapping, got " + shown(kv.second));
                apply_map(w, kv.second, full, depth + 1, knode.Mark());
            } else if (prefix.empty() && kv.second.IsMap()) {
                // A section of the script's own ("ppo:"): checked when the
                // script declares it.
                json &slot = cfg[full];
                if (!slot.is_object()) slot = json::object();
                const json given = w.to_json(kv.second, full, depth + 1, knode.Mark());
                for (const auto &item : given.items()) slot[item.key()] = item.value();
                keep_undeclared(full);
            } else {
                bad(w.at(knode.Mark()), unknown(full, prefix));
            }
        }
    }

    void apply_override(const std::string &item) {
        const size_t bad_byte = bad_utf8_at(item);
        if (bad_byte != std::string::npos)
            bad("--set " + printable(item),
                "is not valid UTF-8 (byte " + std::to_string(bad_byte) + ")");
        const std::string origin = "--set " + printable(item);
        const size_t eq = item.find('=');
        if (eq == std::string::npos || eq == 0) bad(origin, "expected key=value");
        const std::string key = item.substr(0, eq);
        const size_t parts = parts_of(key);
        if (parts > kMaxConfigDepth)
            bad(origin, "the key has " + std::to_string(parts) + " parts; at most " +
                            std::to_string(kMaxConfigDepth) + " (the nesting limit)");
        YAML::Node value;
        try {
            value = YAML::Load(item.substr(eq + 1));
        } catch (const YAML::DeepRecursion &) {
            bad(origin, "the value is nested too deeply for the YAML parser (at most " +
                            std::to_string(kMaxConfigDepth) + " levels are allowed)");
        } catch (const YAML::Exception &e) {
            bad(origin, "the value is not valid YAML: " + e.msg);
        }
        Walk w(origin, false);
        if (const ConfigKey *k = find_key(keys, key)) {
            set_path(cfg, key, convert(w, *k, value, origin, value.Mark()));
            return;
        }
        // Inside a free-form mapping: env.params.min_len=3.
        for (const auto &k : keys) {
            const std::string p = k.key;
            if (k.type == ConfigType::Object && key.compare(0, p.size() + 1, p + ".") == 0) {
                set_path(cfg, key, w.to_json(value, key, parts, value.Mark()));
                return;
            }
        }
        const std::string head = key.substr(0, key.find('.'));
        if (key.find('.') != std::string::npos && !find_key(keys, head) &&
            !is_section(keys, head)) {
            set_path(cfg, key, w.to_json(value, key, parts, value.Mark())); // the script's own
            keep_undeclared(head);
            return;
        }
        const size_t dot = key.rfind('.');
        const std::string prefix = dot == std::string::npos ? "" : key.substr(0, dot);
        bad(origin, unknown(key, is_section(keys, prefix) ? prefix : ""));
    }
};

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
        } catch (const YAML::DeepRecursion &e) {
            bad(path + ":" + std::to_string(e.mark.line + 1) + ":" +
                    std::to_string(e.mark.column + 1),
                "malformed YAML: nested too deeply for the YAML parser (at most " +
                    std::to_string(kMaxConfigDepth) + " levels are allowed)");
        } catch (const YAML::ParserException &e) {
            bad(path + ":" + std::to_string(e.mark.line + 1) + ":" +
                    std::to_string(e.mark.column + 1),
                "malformed YAML: " + e.msg);
        } catch (const YAML::Exception &e) {
            bad(path, std::string("malformed YAML: ") + e.what());
        }
        if (root.IsDefined() && !root.IsNull()) {
            if (!root.IsMap()) bad(at(path, root), "the top level must be a mapping of keys");
            Walk w(path, true);
            l.apply_map(w, root, "", 0, root.Mark());
        }
    }
    for (const auto &o : overrides) l.apply_override(o);
    return {std::move(l.cfg), std::move(l.undeclared)};
}

} // namespace rl::host
