// The weight-update routes of `rlhost serve` (docs/serving.md).
#pragma once

#include "http.hpp"

namespace rl::serve {

class Server;
class WeightUpdater;

/// Registers /update_weights_from_disk, /init_weights_update_group,
/// /destroy_weights_update_group, /update_weights_from_distributed,
/// /update_weights_from_tensor, /update_weight_version, prime-rl's
/// /update_weights and refusals for vLLM's NCCL transfer routes on the
/// server's router; a successful update labels the server's weight_version.
/// `updater` must outlive the server.
void add_weight_routes(Server &server, WeightUpdater &updater);

} // namespace rl::serve
