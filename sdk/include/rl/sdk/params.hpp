// rl/sdk/params.hpp: typed access to a plugin's JSON parameters, with errors
// that name the plugin and the parameter, and list the valid ones.
//
//   Params p(json_text, "loss 'policy_loss'");
//   eps_ = p.number("eps_clip", 0.2, 0.0, 1.0);
//   p.finish();   // refuses any key that was never asked for
//
// Other frameworks' names for a parameter (verl's "clip_ratio_low" for
// "eps_clip") are accepted with alias() before the parameter is read; a peer
// name whose meaning differs here is refused with a migration message
// (refuse()). Errors about an aliased value name both spellings.
#pragma once

#include "error.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace rl::sdk {

using json = nlohmann::json;

class Params {
public:
    Params(std::string_view text, std::string owner) : owner_(std::move(owner)) {
        if (text.empty()) text = "{}";
        try {
            j_ = json::parse(text.begin(), text.end());
        } catch (const json::parse_error &e) {
            invalid(owner_ + ": parameters are not valid JSON: " + e.what());
        }
        if (j_.is_null()) j_ = json::object();
        if (!j_.is_object()) invalid(owner_ + ": parameters must be a JSON object");
    }

    const std::string &owner() const { return owner_; }
    // The key is present with a non-null value.
    bool has(const std::string &key) {
        known_.insert(key);
        return j_.contains(key) && !j_[key].is_null();
    }
    // The key is present and explicitly null (a way to switch a default off).
    bool is_null(const std::string &key) {
        known_.insert(key);
        return j_.contains(key) && j_[key].is_null();
    }

    double number(const std::string &key, double def,
                  double lo = -std::numeric_limits<double>::infinity(),
                  double hi = std::numeric_limits<double>::infinity()) {
        auto v = optional_number(key, lo, hi);
        return v ? *v : def;
    }
    // A number, or nullopt when absent or JSON null ("off").
    std::optional<double> optional_number(const std::string &key,
                                          double lo = -std::numeric_limits<double>::infinity(),
                                          double hi = std::numeric_limits<double>::infinity()) {
        known_.insert(key);
        if (!j_.contains(key) || j_[key].is_null()) return std::nullopt;
        const json &v = j_[key];
        if (!v.is_number())
            invalid(owner_ + ": parameter " + label(key) + " must be a number, got " + v.dump());
        const double x = v.get<double>();
        if (!std::isfinite(x) || x < lo || x > hi)
            invalid(owner_ + ": parameter " + label(key) + " must be in [" + fmt(lo) + ", " +
                    fmt(hi) + "], got " + v.dump());
        return x;
    }
    int64_t integer(const std::string &key, int64_t def,
                    int64_t lo = std::numeric_limits<int64_t>::min(),
                    int64_t hi = std::numeric_limits<int64_t>::max()) {
        known_.insert(key);
        if (!j_.contains(key) || j_[key].is_null()) return def;
        const json &v = j_[key];
        if (!v.is_number_integer() &&
            !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))
            invalid(owner_ + ": parameter " + label(key) + " must be an integer, got " + v.dump());
        const int64_t x = v.get<int64_t>();
        if (x < lo || x > hi)
            invalid(owner_ + ": parameter " + label(key) + " must be in [" + std::to_string(lo) +
                    ", " + std::to_string(hi) + "], got " + v.dump());
        return x;
    }
    bool boolean(const std::string &key, bool def) {
        known_.insert(key);
        if (!j_.contains(key) || j_[key].is_null()) return def;
        const json &v = j_[key];
        if (!v.is_boolean())
            invalid(owner_ + ": parameter " + label(key) + " must be true or false, got " +
                    v.dump());
        return v.get<bool>();
    }
    std::string string(const std::string &key, const std::string &def) {
        known_.insert(key);
        if (!j_.contains(key) || j_[key].is_null()) return def;
        const json &v = j_[key];
        if (!v.is_string())
            invalid(owner_ + ": parameter " + label(key) + " must be a string, got " + v.dump());
        return v.get<std::string>();
    }
    // One of `allowed`; the error lists them.
    std::string choice(const std::string &key, const std::string &def,
                       const std::vector<std::string> &allowed) {
        std::string s = string(key, def);
        for (const auto &a : allowed)
            if (a == s) return s;
        invalid(owner_ + ": parameter " + label(key) + " must be one of " + join(allowed) +
                ", got '" + s + "'");
    }
    // The raw JSON value (null when absent), for structured parameters.
    json raw(const std::string &key) {
        known_.insert(key);
        return j_.contains(key) ? j_[key] : json();
    }
    // Declare a key as valid without reading it (handled elsewhere).
    void allow(const std::string &key) { known_.insert(key); }

    // Accept `peer_key`, `peer`'s name for parameter `key`: its value is read
    // as `key`'s. Giving both is an error naming both. `also` are keys the
    // peer name sets too when they are absent (TRL's "epsilon" is both clip
    // bounds unless "epsilon_high" is given). Call before reading `key`.
    void alias(const std::string &peer_key, const std::string &key, const std::string &peer,
               const std::vector<std::string> &also = {}) {
        aliases_.insert(peer_key);
        if (!j_.contains(peer_key)) return;
        if (j_.contains(key))
            invalid(owner_ + ": parameters '" + peer_key + "' (" + peer + "'s name for '" + key +
                    "') and " + label(key) + " are both given; keep one");
        const json v = j_[peer_key];
        j_.erase(peer_key);
        j_[key] = v;
        given_as_[key] = "'" + peer_key + "' (" + peer + ")";
        for (const auto &k : also)
            if (!j_.contains(k)) {
                j_[k] = v;
                given_as_[k] = "'" + peer_key + "' (" + peer + ")";
            }
    }
    // Refuse `peer_key` (a peer framework's parameter whose meaning differs
    // here) with a message that says what to use instead.
    void refuse(const std::string &peer_key, const std::string &instead) const {
        if (j_.contains(peer_key))
            invalid(owner_ + ": parameter '" + peer_key + "' is not supported here: " + instead);
    }

    // Refuse keys that no accessor asked for.
    void finish() const {
        for (auto it = j_.begin(); it != j_.end(); ++it) {
            if (!known_.count(it.key()) && !aliases_.count(it.key())) {
                std::vector<std::string> valid(known_.begin(), known_.end());
                invalid(owner_ + ": unknown parameter '" + it.key() + "'; valid parameters: " +
                        (valid.empty() ? std::string("(none)") : join(valid)));
            }
        }
    }

    static std::string join(const std::vector<std::string> &xs) {
        std::string out;
        for (size_t i = 0; i < xs.size(); ++i) out += (i ? ", " : "") + xs[i];
        return out;
    }

    // 'key', or 'key' (given as 'peer_key' (peer)) when it came through alias().
    std::string label(const std::string &key) const {
        auto it = given_as_.find(key);
        return "'" + key + "'" + (it == given_as_.end() ? "" : " (given as " + it->second + ")");
    }

private:
    static std::string fmt(double x) {
        if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
        std::ostringstream s;
        s << x;
        return s.str();
    }

    json j_;
    std::string owner_;
    std::set<std::string> known_;
    std::set<std::string> aliases_;               // peer names accepted by alias()
    std::map<std::string, std::string> given_as_; // key -> "'peer_key' (peer)"
};

} // namespace rl::sdk
