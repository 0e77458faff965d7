#include "rl/core/json.hpp"

#include "rl/core/error.hpp"

#include <iterator>
#include <vector>

namespace rl::core {

std::size_t json_nesting_depth(std::string_view text, std::size_t limit, std::size_t *where) {
    std::size_t depth = 0, deepest = 0;
    bool in_string = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\')
                ++i; // the escaped character cannot end the string
            else if (c == '"')
                in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > deepest) deepest = depth;
            if (depth > limit) {
                if (where) *where = i;
                return depth;
            }
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return deepest;
}

std::string json_too_deep(const nlohmann::json &j, const std::string &root, std::size_t limit) {
    using json = nlohmann::json;
    struct Frame {
        const json *node;
        json::const_iterator it;
        std::size_t index;
    };
    if (!j.is_structured()) return "";
    std::vector<Frame> stack{{&j, j.cbegin(), 0}};
    while (!stack.empty()) {
        Frame &f = stack.back();
        if (f.it == f.node->cend()) {
            stack.pop_back();
            continue;
        }
        const json &child = *f.it;
        ++f.it;
        ++f.index;
        if (!child.is_structured()) continue;
        if (stack.size() + 1 > limit) {
            std::string path = root;
            for (const Frame &g : stack) {
                if (g.node->is_object())
                    path += (path.empty() ? "" : ".") + std::prev(g.it).key();
                else
                    path += "[" + std::to_string(g.index - 1) + "]";
            }
            return path;
        }
        stack.push_back({&child, child.cbegin(), 0});
    }
    return "";
}

namespace {

// "[json.exception.parse_error.101] parse error at line 1, column 7: ..." ->
// "parse error at line 1, column 7: ..."
std::string parser_message(const nlohmann::json::exception &e) {
    const std::string what = e.what();
    const std::size_t close = what.find("] ");
    return close == std::string::npos ? what : what.substr(close + 2);
}

std::string too_deep(const std::string &what, std::size_t where) {
    return what + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
           " levels (at byte " + std::to_string(where) + ")";
}

} // namespace

bool try_parse_json(std::string_view text, nlohmann::json &out, const std::string &what,
                    std::string *error) {
    std::size_t where = 0;
    if (json_nesting_depth(text, kMaxJsonDepth, &where) > kMaxJsonDepth) {
        if (error) *error = too_deep(what, where);
        return false;
    }
    try {
        out = nlohmann::json::parse(text.begin(), text.end());
        return true;
    } catch (const nlohmann::json::out_of_range &e) {
        // nlohmann reports a number that overflows a double (1e400) this way.
        if (error) *error = what + ": a number is out of range: " + parser_message(e);
    } catch (const nlohmann::json::exception &e) {
        if (error) *error = what + ": not valid JSON: " + parser_message(e);
    }
    return false;
}

nlohmann::json parse_json_or_discarded(std::string_view text) {
    nlohmann::json j;
    if (!try_parse_json(text, j, "")) return nlohmann::json(nlohmann::json::value_t::discarded);
    return j;
}

void check_json_depth(std::string_view text, const std::string &what) {
    std::size_t where = 0;
    if (json_nesting_depth(text, kMaxJsonDepth, &where) > kMaxJsonDepth)
        throw Error(too_deep(what, where));
}

nlohmann::json parse_json(std::string_view text, const std::string &what) {
    nlohmann::json j;
    std::string error;
    if (!try_parse_json(text, j, what, &error)) throw Error(error);
    return j;
}

} // namespace rl::core
