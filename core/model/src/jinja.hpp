// A small Jinja2-compatible template engine for chat templates (internal to
// rl_core). It renders what Hugging Face chat templates use, with the settings
// transformers renders them with (trim_blocks, lstrip_blocks, no trailing
// newline kept, loop controls, an immutable sandbox, transformers' tojson,
// raise_exception and strftime_now): {{ }}, {% if / elif / else %},
// {% for %} (loop.*, else, filter, unpacking, break / continue), {% set %}
// (names, tuples, namespace attributes, blocks), {% macro %}, {% filter %},
// {% generation %}, the filters, tests, string / dict methods and operators
// listed in docs/model.md. Anything else is an error naming the construct and
// the template line, at parse time where it can be known then.
//
// Templates come with models and render inside the server: nesting, size and
// work are bounded (the limits at the top of jinja.cpp, listed in
// docs/model.md), and passing one is an error naming the line, never a stack
// overflow, a hang or an out-of-range read.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace rl::core::jinja {

struct RenderOptions {
    /// Time strftime_now() formats, in seconds since the epoch, as UTC. Unset:
    /// the current local time (what transformers does).
    std::optional<int64_t> now;
};

class Template {
public:
    /// Parses `source`. Throws rl::core::Error "<where> line N: ..." on a
    /// syntax error or an unsupported construct.
    Template(const std::string &source, const std::string &where);
    ~Template();
    Template(const Template &) = delete;
    Template &operator=(const Template &) = delete;

    /// Renders with `context` (a JSON object: the template's variables).
    /// Throws rl::core::Error "<where> line N: ..." on a render error
    /// (raise_exception() included).
    std::string render(const nlohmann::ordered_json &context, const RenderOptions &options) const;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

} // namespace rl::core::jinja
