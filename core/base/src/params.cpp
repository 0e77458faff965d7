#include "rl/core/params.hpp"

#include "rl/core/error.hpp"
#include "rl/core/names.hpp"
#include "rl/core/json.hpp"

#include <cmath>
#include <functional>
#include <sstream>

namespace rl::core {
namespace {

using nlohmann::json;

std::string num(double x) {
    std::ostringstream s;
    s << x;
    return s.str();
}

std::string joined(const std::vector<std::string> &xs, const char *sep = ", ") {
    std::string s;
    for (const auto &x : xs) s += (s.empty() ? "" : sep) + x;
    return s;
}

constexpr Named<ParamType> kParamTypeNames[] = {{ParamType::String, "a string"},
                                                {ParamType::Integer, "an integer"},
                                                {ParamType::Number, "a number"},
                                                {ParamType::Boolean, "true or false"},
                                                {ParamType::StringList, "a list of strings"},
                                                {ParamType::Object, "a mapping"},
                                                {ParamType::ObjectList, "a list of mappings"}};

} // namespace

const char *param_type_name(ParamType t) {
    return name_in(kParamTypeNames, t);
}

bool Range::contains(double x) const {
    if (std::isnan(x)) return false;
    if (lo && (lo_open ? !(x > *lo) : !(x >= *lo))) return false;
    if (hi && (hi_open ? !(x < *hi) : !(x <= *hi))) return false;
    return true;
}

std::string Range::describe() const {
    if (lo && hi)
        return std::string("in ") + (lo_open ? "(" : "[") + num(*lo) + ", " + num(*hi) +
               (hi_open ? ")" : "]");
    if (lo) return std::string(lo_open ? "> " : ">= ") + num(*lo);
    if (hi) return std::string(hi_open ? "< " : "<= ") + num(*hi);
    return "";
}

ParamSpec param(std::string key, ParamType type, json fallback, std::string doc, Range range) {
    ParamSpec s;
    s.key = std::move(key);
    s.type = type;
    s.fallback = std::move(fallback);
    s.doc = std::move(doc);
    s.range = range;
    return s;
}

ParamSpec choice_param(std::string key, std::string fallback, std::vector<std::string> choices,
                       std::string doc) {
    ParamSpec s = param(std::move(key), ParamType::String, std::move(fallback), std::move(doc));
    s.choices = std::move(choices);
    return s;
}

bool choice_allowed(const ParamSpec &spec, const std::string &s) {
    for (const auto &c : spec.choices) {
        if (c == s) return true;
        // "cuda:N": the prefix up to ':' and 1-4 decimal digits.
        if (c.size() < 2 || c.compare(c.size() - 2, 2, ":N") != 0) continue;
        const size_t n = c.size() - 1;
        if (s.size() <= n || s.size() > n + 4 || s.compare(0, n, c, 0, n) != 0) continue;
        bool digits = true;
        for (size_t i = n; i < s.size(); ++i) digits = digits && s[i] >= '0' && s[i] <= '9';
        if (digits) return true;
    }
    return false;
}

json check_param(const ParamSpec &spec, const json &v, const std::string &name) {
    auto bad = [&](const std::string &what) {
        throw Error(ErrorKind::InvalidArgument, "key '" + name + "' " + what);
    };
    const std::string expect =
        std::string("must be ") + param_type_name(spec.type) + (spec.nullable ? " or null" : "");
    if (v.is_null()) {
        if (spec.nullable) return v;
        if (spec.type == ParamType::Object) return json::object();
        bad(expect + ", got null");
    }
    auto in_range = [&](double x) {
        if (!spec.range.contains(x)) bad("must be " + spec.range.describe() + ", got " + v.dump());
    };
    switch (spec.type) {
        case ParamType::String: {
            if (!v.is_string()) bad(expect + ", got " + v.dump());
            const std::string s = v.get<std::string>();
            if (!spec.choices.empty() && !choice_allowed(spec, s))
                bad("must be one of " + joined(spec.choices, ",") + "; got '" + s + "'");
            return v;
        }
        case ParamType::Integer: {
            int64_t i = 0;
            if (v.is_number_integer()) {
                i = v.get<int64_t>();
            } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
                       v.get<double>() == std::floor(v.get<double>()) &&
                       std::fabs(v.get<double>()) < 9e15) {
                i = static_cast<int64_t>(v.get<double>());
            } else {
                bad(expect + ", got " + v.dump());
            }
            in_range(static_cast<double>(i));
            return json(i);
        }
        case ParamType::Number: {
            if (!v.is_number()) bad(expect + ", got " + v.dump());
            const double x = v.get<double>();
            if (!std::isfinite(x)) bad("must be finite, got " + v.dump());
            in_range(x);
            return v;
        }
        case ParamType::Boolean:
            if (!v.is_boolean()) bad(expect + ", got " + v.dump());
            return v;
        case ParamType::Object:
            if (!v.is_object()) bad(expect + ", got " + v.dump());
            return v;
        case ParamType::StringList:
        case ParamType::ObjectList: {
            if (!v.is_array()) bad(expect + ", got " + v.dump());
            const bool of_objects = spec.type == ParamType::ObjectList;
            for (const auto &x : v)
                if (of_objects ? !x.is_object() : !x.is_string())
                    bad(expect + "; an item is " + x.dump());
            return v;
        }
    }
    return v;
}

json read_params(const json &object, const std::vector<ParamSpec> &specs,
                 const std::string &section, const std::string &what) {
    const std::string prefix = section.empty() ? "" : section + ".";
    if (!object.is_null() && !object.is_object())
        throw Error(ErrorKind::InvalidArgument,
                    what + ": must be a JSON object, got " + std::string(object.type_name()));
    json out = json::object();
    for (const auto &s : specs) out[s.key] = s.fallback;
    if (object.is_null()) return out;
    // A dotted key ("noise_scheduler.enabled") may be given flat or as a
    // nested object ({"noise_scheduler": {"enabled": true}}).
    std::function<void(const json &, const std::string &)> read = [&](const json &node,
                                                                      const std::string &path) {
        for (const auto &kv : node.items()) {
            const std::string key = path + kv.key();
            const ParamSpec *spec = nullptr;
            bool group = false;
            for (const auto &s : specs) {
                if (s.key == key) spec = &s;
                if (s.key.compare(0, key.size() + 1, key + ".") == 0) group = true;
            }
            if (!spec && group) {
                if (!kv.value().is_object())
                    throw Error(ErrorKind::InvalidArgument,
                                what + ": key '" + prefix + key + "' must be an object (of its " +
                                    key + ".* settings), got " + kv.value().type_name());
                read(kv.value(), key + ".");
                continue;
            }
            if (!spec) {
                std::vector<std::string> keys;
                for (const auto &s : specs) keys.push_back(s.key);
                throw Error(ErrorKind::InvalidArgument,
                            what + ": unknown key '" + prefix + key + "'; valid: " + joined(keys));
            }
            try {
                out[spec->key] = check_param(*spec, kv.value(), prefix + spec->key);
            } catch (const Error &e) {
                throw Error(e.kind(), what + ": " + e.what());
            }
        }
    };
    read(object, "");
    return out;
}

json read_params_text(const std::string &text, const std::vector<ParamSpec> &specs,
                      const std::string &section, const std::string &what) {
    if (text.empty()) return read_params(json(), specs, section, what);
    const json j = rl::core::parse_json_or_discarded(text);
    if (j.is_discarded()) throw Error(ErrorKind::InvalidArgument, what + ": not valid JSON");
    return read_params(j, specs, section, what);
}

} // namespace rl::core
