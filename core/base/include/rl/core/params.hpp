// rl/core/params.hpp: declared parameters and the one reader that checks them.
//
// A ParamSpec declares one setting: its key, type, default, allowed choices or
// numeric range, and a one-line meaning. The run configuration's schema
// (host), the trainer's, engine's and buffer's settings (core) and
// docs/configuration.md all come from these declarations, so a default or a
// range is written once. Torch-free.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace rl::core {

enum class ParamType { String, Integer, Number, Boolean, StringList, Object, ObjectList };

/// "a string", "an integer", ... (for messages).
const char *param_type_name(ParamType t);

/// A numeric interval; unset ends are unbounded.
struct Range {
    std::optional<double> lo, hi;
    bool lo_open = false, hi_open = false;

    static Range at_least(double lo) { return {lo, std::nullopt, false, false}; }
    static Range above(double lo) { return {lo, std::nullopt, true, false}; }
    static Range closed(double lo, double hi) { return {lo, hi, false, false}; }
    static Range half_open(double lo, double hi) { return {lo, hi, false, true}; }
    static Range left_open(double lo, double hi) { return {lo, hi, true, false}; }

    bool bounded() const { return lo || hi; }
    bool contains(double x) const;
    /// ">= 0", "> 0", "in [0, 1)", "" when unbounded.
    std::string describe() const;
};

struct ParamSpec {
    std::string key; ///< dotted path relative to the reader's section
    ParamType type = ParamType::String;
    nlohmann::json fallback;          ///< the default (null: unset, only when nullable)
    std::string doc;                  ///< one line
    std::vector<std::string> choices; ///< allowed strings; "cuda:N" allows cuda:0, cuda:1, ...
    Range range;                      ///< for integers and numbers
    bool nullable = false;            ///< null is accepted (and means "unset")
    /// False for settings a script passes itself (e.g. the trainer's
    /// total_steps): not part of the run configuration's schema.
    bool in_run_config = true;
};

/// A declaration (the fields that most declarations set).
ParamSpec param(std::string key, ParamType type, nlohmann::json fallback, std::string doc,
                Range range = {});
/// A string declaration with a fixed set of choices.
ParamSpec choice_param(std::string key, std::string fallback, std::vector<std::string> choices,
                       std::string doc);

/// Whether `value` is one of the spec's choices ("cuda:N" patterns included).
bool choice_allowed(const ParamSpec &spec, const std::string &value);

/// Checks `value` against the spec: type, choices, range, null. Returns the
/// value normalized (integral numbers of Number keys stay numbers; integers
/// given as 3.0 become 3). Throws Error(InvalidArgument) whose message is
/// "key '<name>' must be ..."; `name` is the key as the user wrote it.
nlohmann::json check_param(const ParamSpec &spec, const nlohmann::json &value,
                           const std::string &name);

/// Reads a JSON object (null: empty) against `specs`: unknown keys are errors
/// listing the valid ones, each value is checked, missing keys get their
/// defaults. Messages name keys as "<section>.<key>" and start with `what`
/// ("trainer config"). Returns an object holding every key.
nlohmann::json read_params(const nlohmann::json &object, const std::vector<ParamSpec> &specs,
                           const std::string &section, const std::string &what);

/// Parses JSON text (empty: {}) and read_params() it.
nlohmann::json read_params_text(const std::string &text, const std::vector<ParamSpec> &specs,
                                const std::string &section, const std::string &what);

// The declarations of the core's settings, one list per section. Keys are
// relative to the section ("learning_rate" of "trainer").
const std::vector<ParamSpec> &trainer_params();
const std::vector<ParamSpec> &engine_params();
const std::vector<ParamSpec> &buffer_params();
/// The "dist" section: process-group settings of a distributed run.
const std::vector<ParamSpec> &dist_params();

} // namespace rl::core
