// rl/host/config.hpp: run configuration from YAML, checked against one schema.
// Errors name the file, the dotted key and the line (or the --set override).
#pragma once

#include "rl/core/params.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace rl::host {

using ConfigType = rl::core::ParamType;
// One key of the run configuration; `key` is the dotted path
// ("trainer.learning_rate").
using ConfigKey = rl::core::ParamSpec;

// Every key the runtime knows, in documentation order: the host's own keys
// and the core's declarations (trainer_params(), engine_params(),
// buffer_params()) as the "trainer", "engine" and "buffer" sections.
const std::vector<ConfigKey> &config_schema();

struct LoadedConfig {
    nlohmann::json config; // every schema key (defaults filled) + undeclared sections
    // Top-level sections the schema does not know ("ppo" of examples/ppo.lua),
    // kept as written: the script declares and checks them (rl_config_declare).
    std::vector<std::string> undeclared;
};

// Load `path` ("" = defaults only), apply "a.b=value" overrides, check, fill
// defaults. Throws rl::host::HostError (RL_ERR_INVALID_ARG / RL_ERR_IO).
LoadedConfig load_config(const std::string &path, const std::vector<std::string> &overrides);

// Checks the undeclared sections of a loaded configuration against a script's
// declarations (`declared`: keys with full dotted paths), fills their
// defaults, and returns the configuration. Keys of undeclared sections that no
// declaration covers are errors listing the valid ones.
nlohmann::json declare_config(const nlohmann::json &config, const std::vector<ConfigKey> &declared);

// A declaration list from JSON: [{"key", "type" ("string", "integer",
// "number", "boolean", "strings", "mapping", "mappings"), "default", "doc",
// "choices", "min", "max", "min_open", "max_open", "nullable"}].
std::vector<ConfigKey> parse_declarations(const nlohmann::json &list);

const char *config_type_name(ConfigType t);

// The schema as JSON (rl_config_schema) and as the Markdown tables of
// docs/configuration.md (`rlhost config --markdown`).
nlohmann::json schema_json(const std::vector<ConfigKey> &keys);
std::string schema_markdown(const std::vector<ConfigKey> &keys);

} // namespace rl::host
