// Run configuration: YAML -> checked JSON with defaults filled in.
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

// Limits on what one YAML source (the file, or one --set value) may expand
// to. yaml-cpp gives each alias the very node of its anchor, so a few hundred
// bytes can stand for billions of values (aliases of aliases: "billion
// laughs"), and an alias inside its own anchor (`a: &x {b: *x}`, or a merge
// key `<<: *x` that points back) for an infinite tree. The conversion to JSON
// walks the tree as written out: it refuses a node that is one of its own
// ancestors and counts what it visits.
//
// Nodes (scalars, lists, mappings; a node reached through N aliases counts N
// times) one source may expand to: run configurations hold hundreds. At a
// million, refusing an alias bomb of a few hundred bytes took over a second
// (9 s under the sanitizers, found by fuzz_yaml_config); 100,000 takes a
// tenth of that.
constexpr size_t kMaxConfigNodes = 100'000;
// Nesting depth: the most parts of a key path (`env.params.a` has 3; a list
// item counts as a part), in a file and in a --set key plus its value.
constexpr size_t kMaxConfigDepth = 128;
// Characters of a user's value quoted in a message before it is cut.
constexpr size_t kMaxShownChars = 80;

// Length of the well-formed UTF-8 sequence at s[i] (RFC 3629: no overlong
// forms, no surrogates, nothing past U+10FFFF), 0 if there is none.
size_t utf8_seq(const std::string &s, size_t i) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = b(i);
    if (c < 0x80) return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF; // the range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if (i + n > s.size() || b(i + 1) < lo || b(i + 1) > hi) return 0;
    for (size_t k = 2; k < n; ++k)
        if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
    return n;
}

// The byte offset of the first ill-formed UTF-8 in `s`, or npos.
size_t bad_utf8_at(const std::string &s) {
    for (size_t i = 0; i < s.size();) {
        const size_t n = utf8_seq(s, i);
        if (n == 0) return i;
        i += n;
    }
    return std::string::npos;
}

// `s` for a message: control characters and ill-formed UTF-8 as \xHH, cut
// after kMaxShownChars characters.
std::string printable(const std::string &s) {
    std::string out;
    size_t chars = 0;
    for (size_t i = 0; i < s.size(); ++chars) {
        if (chars == kMaxShownChars) return out + "...";
        const size_t n = utf8_seq(s, i);
        const auto c = static_cast<unsigned char>(s[i]);
        if (n == 0 || c < 0x20 || c == 0x7F) {
            static const char *hex = "0123456789ABCDEF";
            out += std::string("\\x") + hex[c >> 4] + hex[c & 15];
            ++i;
        } else {
            out.append(s, i, n);
            i += n;
        }
    }
    return out;
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

size_t parts_of(const std::string &key) {
    return static_cast<size_t>(std::count(key.begin(), key.end(), '.')) + 1;
}

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
