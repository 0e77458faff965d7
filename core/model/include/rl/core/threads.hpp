// Intra-op thread count for libtorch on the CPU.
#pragma once

namespace rl::core {

/// The thread count the model core uses: RL_NUM_THREADS if set, else
/// OMP_NUM_THREADS if set, else the number of CPU cores available to the process.
int default_num_threads();

/// Sets libtorch's intra-op thread count for the calling thread (OpenMP keeps
/// the count per thread). n <= 0 means default_num_threads().
void set_num_threads(int n);

/// Applies the configured count to the calling thread once. Called by every
/// model entry point, so threads created later (a rollout thread) get it too.
void ensure_threads();

} // namespace rl::core
