// Internal to librl: what step.cpp and step_batch.cpp share (dtypes, calling a plugin's C API).
#pragma once

#include "train_common.hpp"

#include <utility>

namespace rl::host::capi {

inline constexpr rl_dtype_t kF32{RL_DTYPE_FLOAT, 32, 1}, kF64{RL_DTYPE_FLOAT, 64, 1},
    kI64{RL_DTYPE_INT, 64, 1}, kU8{RL_DTYPE_UINT, 8, 1};

// Runs a C API call that fills an rl_result_t and returns its sink.
template <class F>
CallSink call_sink(F &&f) {
    rl_result_t *res = nullptr;
    const rl_status_t st = f(&res);
    if (st != RL_OK) throw HostError{st, rl_last_error()};
    CallSink sink = std::move(res->sink);
    rl_result_destroy(res);
    return sink;
}

} // namespace rl::host::capi
