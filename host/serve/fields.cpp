#include "fields.hpp"

#include "rl/core/error.hpp"
#include "rl/core/json.hpp"
#include "rl/core/names.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace rl::serve {

void refuse(const std::string &param, const std::string &message) {
    throw ApiError(400, message, param);
}

std::string dump(const json &j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json json_body(const Request &req, bool allow_empty) {
    const bool blank = std::all_of(req.body.begin(), req.body.end(), [](char c) {
        return std::isspace(static_cast<unsigned char>(c));
    });
    if (blank) {
        if (allow_empty) return json::object();
        throw ApiError(400, "the request body is empty; a JSON object is expected");
    }
    json j;
    std::string error;
    if (!core::try_parse_json(req.body, j, "the request body", &error)) throw ApiError(400, error);
    if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
    return j;
}

// ---- Fields -------------------------------------------------------------------------------

namespace {

const char *type_name(const json &v) {
    using T = json::value_t;
    static constexpr core::Named<T> names[] = {
        {T::null, "null"},        {T::boolean, "a boolean"},
        {T::string, "a string"},  {T::array, "a list"},
        {T::object, "an object"}, {T::number_float, "a number with a fraction"}};
    return core::name_in(names, v.type(), "an integer");
}

std::string num(double v) {
    return json(v).dump();
}

} // namespace

Fields::Fields(const json &object, std::string prefix) : o_(object), prefix_(std::move(prefix)) {
    // A nested value read as fields ("adam_params", "sampling_params", ...) that is
    // not an object was read as an empty one: the call ran on defaults.
    if (!o_.is_object()) {
        std::string name = prefix_; // "adam_params." names adam_params
        if (!name.empty() && name.back() == '.') name.pop_back();
        refuse(name, (name.empty() ? std::string("the request body") : name) +
                         " must be a JSON object, not " + o_.type_name());
    }
}

void Fields::only(const std::vector<std::string_view> &known) const {
    for (const auto &item : o_.items()) {
        if (std::find(known.begin(), known.end(), item.key()) == known.end())
            refuse(prefix_ + item.key(), "unknown field '" + prefix_ + item.key() + "'");
    }
}

void read_options(const std::string &text, const std::string &what,
                  const std::function<void(const Fields &)> &read) {
    if (text.empty()) return;
    const json j = core::parse_json(text, what);
    if (j.is_null()) return;
    if (!j.is_object()) throw core::Error(what + ": a JSON object is expected");
    try {
        read(Fields(j, what + ": "));
    } catch (const ApiError &e) {
        throw core::Error(e.what());
    }
}

std::vector<std::string_view> http_options_and(std::initializer_list<std::string_view> own) {
    std::vector<std::string_view> known = {"host",          "port",           "api_key",
                                           "model_path",    "max_body_bytes", "max_connections",
                                           "idle_timeout_s"};
    known.insert(known.end(), own);
    return known;
}

const json *Fields::get(const char *key) const {
    auto it = o_.find(key);
    if (it == o_.end() || it->is_null()) return nullptr;
    return &*it;
}

std::optional<int64_t> Fields::integer(const char *key, int64_t min, int64_t max) const {
    const json *v = get(key);
    if (!v) return std::nullopt;
    int64_t x = 0;
    if (v->is_number_unsigned()) {
        const uint64_t u = v->get<uint64_t>();
        if (u > static_cast<uint64_t>(max))
            refuse(name(key),
                   name(key) + " = " + v->dump() + " is above the maximum " + std::to_string(max));
        x = static_cast<int64_t>(u);
    } else if (v->is_number_integer()) {
        x = v->get<int64_t>();
    } else {
        refuse(name(key), name(key) + " must be an integer, not " + type_name(*v));
    }
    if (x < min || x > max)
        refuse(name(key), name(key) + " = " + std::to_string(x) + " is outside [" +
                              std::to_string(min) + ", " + std::to_string(max) + "]");
    return x;
}

std::optional<double> Fields::number(const char *key, double min, double max) const {
    const json *v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) refuse(name(key), name(key) + " must be a number, not " + type_name(*v));
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < min || x > max)
        refuse(name(key),
               name(key) + " = " + v->dump() + " is outside [" + num(min) + ", " + num(max) + "]");
    return x;
}

std::optional<bool> Fields::boolean(const char *key) const {
    const json *v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean())
        refuse(name(key), name(key) + " must be true or false, not " + type_name(*v));
    return v->get<bool>();
}

std::optional<std::string> Fields::string(const char *key) const {
    const json *v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) refuse(name(key), name(key) + " must be a string, not " + type_name(*v));
    return v->get<std::string>();
}

std::optional<std::vector<std::string>> Fields::strings(const char *key, size_t max_items) const {
    const json *v = get(key);
    if (!v) return std::nullopt;
    std::vector<std::string> out;
    if (v->is_string()) {
        out.push_back(v->get<std::string>());
    } else if (v->is_array()) {
        for (size_t i = 0; i < v->size(); ++i) {
            if (!(*v)[i].is_string())
                refuse(name(key), name(key) + "[" + std::to_string(i) + "] must be a string, not " +
                                      type_name((*v)[i]));
            out.push_back((*v)[i].get<std::string>());
        }
    } else {
        refuse(name(key),
               name(key) + " must be a string or a list of strings, not " + type_name(*v));
    }
    if (out.size() > max_items)
        refuse(name(key), name(key) + " has " + std::to_string(out.size()) + " entries; at most " +
                              std::to_string(max_items) + " are accepted");
    for (size_t i = 0; i < out.size(); ++i)
        if (out[i].empty())
            refuse(name(key), name(key) + (v->is_array() ? "[" + std::to_string(i) + "]" : "") +
                                  " is an empty string");
    return out;
}

std::optional<std::vector<int64_t>> Fields::integers(const char *key, int64_t min,
                                                     int64_t max) const {
    const json *v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_array())
        refuse(name(key), name(key) + " must be a list of integers, not " + type_name(*v));
    std::vector<int64_t> out;
    for (size_t i = 0; i < v->size(); ++i) {
        const json &e = (*v)[i];
        const std::string at = name(key) + "[" + std::to_string(i) + "]";
        if (!e.is_number_integer())
            refuse(name(key), at + " must be an integer, not " + type_name(e));
        const bool big = e.is_number_unsigned() && e.get<uint64_t>() > static_cast<uint64_t>(max);
        const int64_t x = big ? max : e.get<int64_t>();
        if (big || x < min || x > max)
            refuse(name(key), at + " = " + e.dump() + " is outside [" + std::to_string(min) + ", " +
                                  std::to_string(max) + "]");
        out.push_back(x);
    }
    return out;
}

void Fields::neutral(const char *key, double value) const {
    const json *v = get(key);
    if (!v) return;
    if (!v->is_number()) refuse(name(key), name(key) + " must be a number, not " + type_name(*v));
    if (v->get<double>() != value)
        refuse(name(key), name(key) + " = " + v->dump() + " is not supported (only " + num(value) +
                              " is accepted)");
}

void Fields::must_be_false(const char *key, const std::string &why) const {
    if (boolean(key).value_or(false))
        refuse(name(key), name(key) + " = true is not supported: " + why);
}

} // namespace rl::serve
