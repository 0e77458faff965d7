// Command-line options and the run loop shared by `rlhost serve` and
// `rlhost training-server`.
#pragma once

#include <rl_api.h>

#include <nlohmann/json.hpp>

#include <signal.h>

#include <functional>
#include <optional>
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

/// Reads --model, --device, --dtype, --threads, --host, --port, --api-key
/// and `flags`; --model is required. An api_key not given takes the environment variable `key_env`.
ServerArgs parse_server_args(const std::vector<std::string> &args,
                             const std::vector<ServerFlag> &flags, const char *key_env);

/// Where the command ends before it starts: --help prints `usage` to stdout
/// (0); wrong arguments print "rlhost <command>: <error>" and `usage` to
/// stderr (2). Empty: the arguments are good.
std::optional<int> help_or_error(const ServerArgs &a, const char *command, const char *usage);

/// The --model folder loaded with --device, --dtype and --threads; null (after
/// printing "rlhost <command>: cannot load the model: <why>") when it cannot be.
rl_model_t *load_server_model(const ServerArgs &a, const char *command);

/// SIGINT and SIGTERM blocked in this thread and in the threads it starts
/// later (a server's threads inherit the mask); the set for serve_until_stopped.
sigset_t block_stop_signals();

/// How long a server asked to stop waits for its requests before the process
/// exits anyway (status 1; docs/serving.md).
inline constexpr int kStopGraceSeconds = 10;

/// Prints "rlhost <command>: listening on http://<host>:<port><suffix>" (host
/// from options["host"]), then runs wait() until the server ends; SIGINT or
/// SIGTERM (in `signals`) calls stop() first, and ends the process
/// kStopGraceSeconds later if stop() has not returned by then.
void serve_until_stopped(const char *command, const nlohmann::json &options, int port,
                         const std::string &suffix, const sigset_t &signals,
                         const std::function<void()> &stop, const std::function<void()> &wait);

} // namespace rlhost
