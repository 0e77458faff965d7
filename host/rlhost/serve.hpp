// rlhost serve: the rollout engine as an HTTP inference server
// (docs/serving.md), through librl's rl_server_* API.
#pragma once

#include <string>
#include <vector>

namespace rlhost {

// args: everything after "serve". Returns the process exit status: 0 after
// SIGINT / SIGTERM, 1 when the model cannot be loaded or the port bound, 2 for
// bad usage.
int cmd_serve(const std::vector<std::string> &args);

} // namespace rlhost
