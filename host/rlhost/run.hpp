// rlhost run: runs a Lua script (scripting/, module `rl`) with a resolved run
// configuration.
#pragma once

#include <string>
#include <vector>

namespace rlhost {

// args: everything after "run". plugin_path: --plugin-path entries (':'-joined);
// log_level: --log-level, "" when not given (the configuration's log_level
// then applies). Returns the process exit status: 0, 1 (the script failed),
// 2 (bad usage or configuration), 130 (stopped by Ctrl-C).
int cmd_run(const std::vector<std::string> &args, const std::string &plugin_path,
            const std::string &log_level);

} // namespace rlhost
