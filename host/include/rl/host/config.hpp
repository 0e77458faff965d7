// rl/host/config.hpp: run configuration from YAML, checked against one schema.
// Errors name the file, the dotted key and the line (or the --set override).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace rl::host {

enum class ConfigType { String, Integer, Number, Boolean, StringList, Object, ObjectList };

struct ConfigKey {
    const char *path; // dotted: "trainer.learning_rate"
    ConfigType type;
    const char *fallback; // default, as YAML text
    const char *choices;  // for strings: "a|b|c", or nullptr
    const char *doc;      // one line, for docs and `rlhost config --schema`
};

// Every key the runtime knows, in documentation order.
const std::vector<ConfigKey> &config_schema();

// Load `path` ("" = defaults only), apply "a.b=value" overrides, check, fill
// defaults. Throws rl::host::HostError (RL_ERR_INVALID_ARG / RL_ERR_IO).
nlohmann::json load_config(const std::string &path, const std::vector<std::string> &overrides);

const char *config_type_name(ConfigType t);

} // namespace rl::host
