// rl/core/json.hpp: the one way JSON text from outside (HTTP bodies, model
// files, C API arguments, plugin results) becomes an nlohmann::json.
//
// nlohmann's parser itself is iterative, but copying, comparing and dumping a
// document recurse once per level, so a body of 100,000 nested arrays parses
// and then overflows the stack on first use. These readers refuse documents
// nested deeper than kMaxJsonDepth before parsing, and turn every parser
// exception (syntax, a number out of range such as 1e400) into an Error that
// names the text.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace rl::core {

/// The deepest nesting of arrays and objects accepted in any JSON text. Real
/// documents stay far below it (tokenizer.json: ~6, a tool's JSON schema:
/// ~10); each level costs a few hundred bytes of stack in nlohmann's
/// recursive copy, dump and compare.
inline constexpr std::size_t kMaxJsonDepth = 128;

/// The nesting depth of the arrays and objects of `text` (strings skipped),
/// counting at most `limit + 1`; `*where` (if given) receives the byte offset
/// where `limit` was first exceeded. Malformed text is the parser's business.
std::size_t json_nesting_depth(std::string_view text, std::size_t limit,
                               std::size_t *where = nullptr);

/// Parses `text`. Throws Error (InvalidArgument) naming `what` when the text
/// is not JSON (with the parser's line and column), holds a number out of
/// range, or nests deeper than kMaxJsonDepth.
nlohmann::json parse_json(std::string_view text, const std::string &what);

/// Like parse_json, but returns false and fills `*error` (if given) with the
/// message instead of throwing.
bool try_parse_json(std::string_view text, nlohmann::json &out, const std::string &what,
                    std::string *error = nullptr);

/// nlohmann's json::parse(text, nullptr, false) under the same limits: a
/// value that is_discarded() for text that is not JSON, nests too deeply or
/// holds a number out of range.
nlohmann::json parse_json_or_discarded(std::string_view text);

/// The path ("a.b[2]", after `root`) of the first array or object in `j`
/// nested more than `limit` levels deep, or "" when there is none. Iterative,
/// so a value of any depth (built in code, or parsed with a larger limit) can
/// be measured without overflowing the stack.
std::string json_too_deep(const nlohmann::json &j, const std::string &root, std::size_t limit);

/// Throws Error naming `what` when `text` nests deeper than kMaxJsonDepth (for
/// callers that parse with their own nlohmann type, e.g. ordered_json).
void check_json_depth(std::string_view text, const std::string &what);

} // namespace rl::core
