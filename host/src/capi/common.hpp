// Internal helpers of the C API translation units (host/src/capi/*.cpp):
// the exception boundary, the thread-local last error, argument checks and
// result construction. Not installed.
#pragma once

#include "rl/core/error.hpp"
#include "rl/host/runtime.hpp"

#include <new>
#include <string>
#include <utility>
#include <vector>

namespace rl::host::capi {

// The message rl_last_error() returns, one per thread.
inline std::string &last_error() {
    static thread_local std::string message;
    return message;
}

inline rl_status_t set_error(rl_status_t st, const std::string &msg) {
    last_error() = msg;
    return st;
}

inline rl_status_t status_of(rl::core::ErrorKind k) {
    switch (k) {
        case rl::core::ErrorKind::InvalidArgument:
            return RL_ERR_INVALID_ARG;
        case rl::core::ErrorKind::NotFound:
            return RL_ERR_NOT_FOUND;
        case rl::core::ErrorKind::BadState:
            return RL_ERR_BAD_STATE;
        case rl::core::ErrorKind::Io:
            return RL_ERR_IO;
        case rl::core::ErrorKind::Numeric:
            return RL_ERR_NUMERIC;
    }
    return RL_ERR_INTERNAL;
}

// Runs f; maps exceptions to status + last error.
template <class F>
rl_status_t boundary(F &&f) noexcept {
    try {
        return f();
    } catch (const HostError &e) {
        return set_error(e.status, e.message);
    } catch (const rl::core::Error &e) {
        return set_error(status_of(e.kind()), e.what());
    } catch (const std::bad_alloc &) {
        return set_error(RL_ERR_OUT_OF_MEMORY, "out of memory");
    } catch (const std::exception &e) {
        return set_error(RL_ERR_INTERNAL, std::string("internal error: ") + e.what());
    } catch (...) {
        return set_error(RL_ERR_INTERNAL, "internal error of unknown type");
    }
}

inline Instance *inst_of(rl_instance_t *i) {
    return reinterpret_cast<Instance *>(i);
}

inline void require(bool cond, const std::string &msg) {
    if (!cond) throw HostError{RL_ERR_INVALID_ARG, msg};
}

inline Instance &checked(rl_instance_t *i, const char *kind, const char *fn) {
    require(i != nullptr, std::string(fn) + ": instance is NULL");
    Instance &inst = *inst_of(i);
    if (inst.record().kind != kind)
        throw HostError{RL_ERR_INVALID_ARG,
                        std::string(fn) + ": " + inst.who() + " is not a " + kind + " plugin"};
    return inst;
}

// checked(), for a verb whose result goes to *out_result (required).
inline Instance &checked(rl_instance_t *i, const char *kind, const char *fn,
                         rl_result_t **out_result) {
    Instance &inst = checked(i, kind, fn);
    require(out_result != nullptr, std::string(fn) + ": out_result is NULL");
    return inst;
}

inline rl_result_t *new_result(CallSink &&sink) {
    auto *r = new rl_result_t;
    r->sink = std::move(sink);
    return r;
}

inline std::vector<std::string> str_list(const char *const *xs) {
    std::vector<std::string> out;
    for (; xs && *xs; ++xs) out.emplace_back(*xs);
    return out;
}

inline std::string join(const std::vector<std::string> &xs) {
    std::string s;
    for (const auto &x : xs) s += (s.empty() ? "" : ", ") + x;
    return s.empty() ? "(none)" : s;
}

} // namespace rl::host::capi
