// rlhost training-server: the trainer and engine behind the Tinker training
// API (docs/training-server.md), through librl's rl_training_server_* API.
#pragma once

#include <string>
#include <vector>

namespace rlhost {

// args: everything after "training-server". Returns 0 after SIGINT / SIGTERM,
// 1 when the model cannot be loaded or the port bound, 2 for bad usage.
int cmd_training_server(const std::vector<std::string> &args, const std::string &plugin_path,
                        const std::string &log_level);

} // namespace rlhost
