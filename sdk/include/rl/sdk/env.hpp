// rl/sdk/env.hpp: the environment toolkit (header-only, C++17, ABI + SDK
// only): text helpers, the LCS similarity over code points, answer extraction
// and number comparison, tasks, JSONL task files. The seeded RNG and UTF-8
// decoding live in rl/sdk/utf8_rng.hpp (included; Rng and utf8:: are visible
// here).
#pragma once

#include "sdk.hpp"
#include "text.hpp"
#include "utf8_rng.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rl::sdk::env {

using json = rl::sdk::json;
using rl::sdk::invalid;

using rl::sdk::Rng;
namespace utf8 = rl::sdk::utf8;

// ---- JSON -------------------------------------------------------------------

// JSON text of `j`; bytes that are not UTF-8 (a byte-level model can emit
// any) are replaced by U+FFFD instead of throwing.
inline std::string dump(const json &j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// ---- text -------------------------------------------------------------------

using rl::sdk::text::is_space;
using rl::sdk::text::trim;

inline std::string_view first_line(std::string_view s) {
    const size_t nl = s.find('\n');
    return nl == std::string_view::npos ? s : s.substr(0, nl);
}

// Length of the longest common subsequence of a and b (O(|a| |b|) time,
// O(min) memory).
inline size_t lcs_length(const std::vector<uint32_t> &a, const std::vector<uint32_t> &b) {
    const std::vector<uint32_t> &row = a.size() < b.size() ? a : b;
    const std::vector<uint32_t> &col = a.size() < b.size() ? b : a;
    std::vector<size_t> prev(row.size() + 1, 0), cur(row.size() + 1, 0);
    for (uint32_t c : col) {
        for (size_t j = 1; j <= row.size(); ++j)
            cur[j] = c == row[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
        std::swap(prev, cur);
    }
    return prev[row.size()];
}

// 2 LCS(a, b) / (|a| + |b|) in [0, 1]; 1 when both are empty.
inline double lcs_ratio(const std::vector<uint32_t> &a, const std::vector<uint32_t> &b) {
    if (a.empty() && b.empty()) return 1.0;
    return 2.0 * static_cast<double>(lcs_length(a, b)) / static_cast<double>(a.size() + b.size());
}

// Replaces the one occurrence of `field` ("{text}") in `format`.
inline std::string fill(const std::string &format, const std::string &field,
                        const std::string &value) {
    const size_t at = format.find(field);
    return format.substr(0, at) + value + format.substr(at + field.size());
}

// Refuses a prompt format without exactly one `field`.
inline void check_format(const std::string &owner, const std::string &param,
                         const std::string &format, const std::string &field) {
    const size_t at = format.find(field);
    if (at == std::string::npos || format.find(field, at + 1) != std::string::npos)
        invalid(owner + ": parameter '" + param + "' must contain " + field +
                " exactly once, got '" + format + "'");
}

// ---- numbers in text ------------------------------------------------------
//
// A number token is: an optional '-' (a sign only when the previous character
// is not a letter, digit or '.'), digits with optional ',' thousands groups
// ("1,234,567"), and an optional fraction ".digits". Commas are removed in the
// returned token.

inline bool is_digit(char c) {
    return c >= '0' && c <= '9';
}
inline bool is_alnum(char c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

inline std::vector<std::string> find_numbers(std::string_view s) {
    std::vector<std::string> out;
    const size_t n = s.size();
    size_t i = 0;
    while (i < n) {
        const bool sign = s[i] == '-' && i + 1 < n && is_digit(s[i + 1]) &&
                          (i == 0 || (!is_alnum(s[i - 1]) && s[i - 1] != '.'));
        if (!sign && !is_digit(s[i])) {
            ++i;
            continue;
        }
        if (!sign && i > 0 && is_alnum(s[i - 1])) {
            // Digits glued to a word ("x2", "H2O") are part of the word.
            while (i < n && is_alnum(s[i])) ++i;
            continue;
        }
        std::string tok;
        if (sign) tok += s[i++];
        size_t run = 0;
        while (i < n && is_digit(s[i])) {
            tok += s[i++];
            ++run;
        }
        // Thousands groups ",ddd" (not followed by a digit) after 1-3 digits.
        while (run <= 3 && i + 3 < n && s[i] == ',' && is_digit(s[i + 1]) && is_digit(s[i + 2]) &&
               is_digit(s[i + 3]) && (i + 4 == n || !is_digit(s[i + 4]))) {
            tok.append(s.substr(i + 1, 3));
            i += 4;
        }
        if (i + 1 < n && s[i] == '.' && is_digit(s[i + 1])) {
            tok += s[i++];
            while (i < n && is_digit(s[i])) tok += s[i++];
        }
        out.push_back(tok);
    }
    return out;
}

// A whole string that is one number token (after trimming), normalized, or
// nullopt.
inline std::optional<std::string> as_number(std::string_view s) {
    s = trim(s);
    if (s.empty()) return std::nullopt;
    if (s.front() == '+') s.remove_prefix(1);
    const std::vector<std::string> nums = find_numbers(s);
    if (nums.size() != 1) return std::nullopt;
    // The token must cover the whole string (commas removed).
    std::string plain;
    for (char c : s)
        if (c != ',') plain += c;
    if (plain != nums[0]) return std::nullopt;
    return nums[0];
}

// Canonical form of a number token: no leading zeros, no trailing fraction
// zeros, no "-0". Exact for any length.
inline std::string canonical_number(const std::string &tok) {
    bool neg = !tok.empty() && tok[0] == '-';
    std::string body = neg ? tok.substr(1) : tok;
    std::string ip = body, fp;
    const size_t dot = body.find('.');
    if (dot != std::string::npos) {
        ip = body.substr(0, dot);
        fp = body.substr(dot + 1);
    }
    size_t nz = ip.find_first_not_of('0');
    ip = nz == std::string::npos ? "0" : ip.substr(nz);
    while (!fp.empty() && fp.back() == '0') fp.pop_back();
    std::string out = ip + (fp.empty() ? "" : "." + fp);
    if (out == "0") neg = false;
    return (neg ? "-" : "") + out;
}

// Two number tokens are equal when their canonical forms are, or (when
// tolerance > 0) when |a - b| <= tolerance * max(1, |b|).
inline bool numbers_equal(const std::string &a, const std::string &b, double tolerance) {
    if (canonical_number(a) == canonical_number(b)) return true;
    if (tolerance <= 0.0) return false;
    const double x = std::strtod(a.c_str(), nullptr), y = std::strtod(b.c_str(), nullptr);
    if (!std::isfinite(x) || !std::isfinite(y)) return false;
    return std::fabs(x - y) <= tolerance * std::max(1.0, std::fabs(y));
}

// Content of the last \boxed{...} (braces balanced), or nullopt when there is
// none or it is not closed.
inline std::optional<std::string> last_boxed(std::string_view s) {
    static constexpr std::string_view kTag = "\\boxed{";
    const size_t at = s.rfind(kTag);
    if (at == std::string_view::npos) return std::nullopt;
    size_t depth = 1;
    for (size_t i = at + kTag.size(); i < s.size(); ++i) {
        if (s[i] == '{') {
            ++depth;
        } else if (s[i] == '}' && --depth == 0) {
            return std::string(s.substr(at + kTag.size(), i - at - kTag.size()));
        }
    }
    return std::nullopt;
}

// ---- tasks ------------------------------------------------------------------

inline json make_task(std::string prompt, json answer, json metadata) {
    json t = json::object();
    t["prompt"] = std::move(prompt);
    t["answer"] = std::move(answer);
    t["metadata"] = metadata.is_object() ? std::move(metadata) : json::object();
    return t;
}

// task["answer"] as a string; numbers are accepted and printed as JSON would.
inline std::string task_answer(const json &task, const std::string &env) {
    if (!task.is_object()) invalid("env '" + env + "': task must be a JSON object");
    auto it = task.find("answer");
    if (it == task.end() || it->is_null())
        invalid("env '" + env + "': task has no reference 'answer' to score against");
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number()) return it->dump();
    invalid("env '" + env + "': task 'answer' must be a string or a number, got " + dump(*it));
}

// ---- multi-turn steps (kinds/env.h) --------------------------------------------
//
// A multi-turn env overrides multi_turn() (true) and step(call, task, state,
// completion), which returns one of these. `state` is null on the first turn.

/// The episode goes on: `observation` is shown to the model (as a `role`
/// message: "user", or "tool" for tool results), `reward` is this turn's.
inline json step_continue(std::string observation, double reward = 0, json state = nullptr,
                          const std::string &role = "user") {
    return json{{"done", false},
                {"reward", reward},
                {"observation", std::move(observation)},
                {"role", role},
                {"state", std::move(state)}};
}

/// The episode is over; `reward` is the last turn's.
inline json step_done(double reward, json state = nullptr) {
    return json{{"done", true}, {"reward", reward}, {"state", std::move(state)}};
}

// ---- JSONL task files ---------------------------------------------------------

struct Row {
    std::string prompt;
    json answer; // string, number or null
    json metadata;
    size_t line = 0;
};

// Reads {prompt_key: str, answer_key: str|number|null, "metadata": object}
// lines; blank lines are skipped. Errors name the file and the line.
inline std::vector<Row> load_jsonl(const std::string &path, const std::string &prompt_key,
                                   const std::string &answer_key, bool answer_required,
                                   const std::string &owner) {
    std::ifstream in(path, std::ios::binary);
    if (!in)
        rl::sdk::fail(errno == ENOENT ? RL_ERR_NOT_FOUND : RL_ERR_IO,
                      owner + ": cannot open '" + path + "': " + std::strerror(errno));
    std::vector<Row> rows;
    std::string text;
    size_t line_no = 0;
    while (std::getline(in, text)) {
        ++line_no;
        if (!text.empty() && text.back() == '\r') text.pop_back();
        if (trim(text).empty()) continue;
        const std::string where = owner + ": " + path + ":" + std::to_string(line_no) + ": ";
        json j;
        try {
            j = json::parse(text);
        } catch (const json::parse_error &e) {
            invalid(where + "not valid JSON (" + e.what() + ")");
        }
        if (!j.is_object()) invalid(where + "expected a JSON object, got " + dump(j));
        auto p = j.find(prompt_key);
        if (p == j.end()) invalid(where + "missing '" + prompt_key + "'");
        if (!p->is_string()) invalid(where + "'" + prompt_key + "' must be a string");
        Row r;
        r.prompt = p->get<std::string>();
        r.line = line_no;
        auto a = j.find(answer_key);
        if (a != j.end() && !a->is_null()) {
            if (!a->is_string() && !a->is_number())
                invalid(where + "'" + answer_key + "' must be a string or a number, got " +
                        dump(*a));
            r.answer = *a;
        } else if (answer_required) {
            invalid(where + "missing '" + answer_key + "'");
        }
        auto m = j.find("metadata");
        if (m != j.end() && !m->is_null()) {
            if (!m->is_object()) invalid(where + "'metadata' must be a JSON object");
            r.metadata = *m;
        } else {
            r.metadata = json::object();
        }
        rows.push_back(std::move(r));
    }
    if (in.bad()) rl::sdk::fail(RL_ERR_IO, owner + ": error reading '" + path + "'");
    if (rows.empty()) invalid(owner + ": '" + path + "' holds no tasks");
    return rows;
}

// Row index of task i: epoch e = i / N visits every row once in an order
// shuffled by stream (seed, e); unshuffled, row i % N.
inline std::vector<size_t> pick_rows(size_t n_rows, uint64_t n, uint64_t seed, bool shuffle) {
    std::vector<size_t> out;
    out.reserve(static_cast<size_t>(n));
    std::vector<size_t> perm;
    uint64_t epoch = UINT64_MAX;
    for (uint64_t i = 0; i < n; ++i) {
        const uint64_t e = i / n_rows;
        const size_t pos = static_cast<size_t>(i % n_rows);
        if (!shuffle) {
            out.push_back(pos);
            continue;
        }
        if (e != epoch) {
            epoch = e;
            perm.resize(n_rows);
            for (size_t k = 0; k < n_rows; ++k) perm[k] = k;
            Rng rng(seed, e);
            for (size_t k = n_rows; k > 1; --k)
                std::swap(perm[k - 1],
                          perm[static_cast<size_t>(rng.uniform(0, static_cast<int64_t>(k) - 1))]);
        }
        out.push_back(perm[pos]);
    }
    return out;
}

} // namespace rl::sdk::env
