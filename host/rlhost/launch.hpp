// rlhost launch: the local ranks of a distributed run (docs/distributed.md).
#pragma once

#include <string>
#include <vector>

namespace rlhost {

/// `args`: what follows `launch`; `host_args`: rlhost's own options given
/// before it (--log-level, --plugin-path), passed on to every rank.
int cmd_launch(const std::vector<std::string> &args, const std::vector<std::string> &host_args);

} // namespace rlhost
