// Command-line options shared by `rlhost serve` and `rlhost training-server`.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace rlhost {

/// "--flag VALUE" -> options[key]; kind: 's' string, 'i' integer, 'f' number.
struct ServerFlag {
    const char *flag, *key;
    char kind;
};

struct ServerArgs {
    std::string model_dir;                             ///< --model
    nlohmann::json load = nlohmann::json::object();    ///< --device, --dtype, --threads
    nlohmann::json options = nlohmann::json::object(); ///< the command's own flags
    std::string error;                                 ///< set when the arguments are wrong
    bool help = false;                                 ///< --help or -h
};

/// Reads --model, --device, --dtype, --threads and `flags`; --model is
/// required. An api_key not given takes the environment variable `key_env`.
ServerArgs parse_server_args(const std::vector<std::string> &args,
                             const std::vector<ServerFlag> &flags, const char *key_env);

} // namespace rlhost
