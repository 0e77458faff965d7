// The weight-update routes of `rlhost serve` (docs/serving.md).
#pragma once

#include "http.hpp"

namespace rl::serve {

class Server;
class WeightUpdater;

/// Registers /update_weights_from_disk, /init_weights_update_group,
/// /destroy_weights_update_group, /update_weights_from_distributed,
/// /update_weights_from_tensor, /update_weight_version, prime-rl's
/// /update_weights {weight_dir} and vLLM's NCCL weight transfer engine
/// (/init_weight_transfer_engine, /start_weight_update, /update_weights
/// {update_info}, /finish_weight_update, /shutdown_weight_transfer_engine) on
/// the server's router; a successful update labels the server's weight_version.
/// `updater` must outlive the server.
void add_weight_routes(Server &server, WeightUpdater &updater);

} // namespace rl::serve
