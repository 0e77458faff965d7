// rl/sdk/error.hpp: exceptions inside a plugin, status codes at the boundary.
#pragma once

#include <rl_plugin.h>

#include <stdexcept>
#include <string>

namespace rl::sdk {

// Thrown inside plugin code; the boundary (boundary.hpp) turns it into a status
// plus the message, reported through host->fail.
class Error : public std::runtime_error {
public:
    Error(rl_status_t status, const std::string &message)
        : std::runtime_error(message), status_(status) {}
    rl_status_t status() const noexcept { return status_; }

private:
    rl_status_t status_;
};

[[noreturn]] inline void fail(rl_status_t status, const std::string &message) {
    throw Error(status, message);
}
[[noreturn]] inline void invalid(const std::string &message) {
    throw Error(RL_ERR_INVALID_ARG, message);
}

// Same names as librl's rl_status_name, for plugins (which do not link librl).
inline const char *status_name(rl_status_t status) noexcept {
    switch (status) {
        case RL_OK:
            return "RL_OK";
        case RL_ERR_UNKNOWN:
            return "RL_ERR_UNKNOWN";
        case RL_ERR_INVALID_ARG:
            return "RL_ERR_INVALID_ARG";
        case RL_ERR_OUT_OF_MEMORY:
            return "RL_ERR_OUT_OF_MEMORY";
        case RL_ERR_UNSUPPORTED:
            return "RL_ERR_UNSUPPORTED";
        case RL_ERR_INCOMPATIBLE:
            return "RL_ERR_INCOMPATIBLE";
        case RL_ERR_NOT_FOUND:
            return "RL_ERR_NOT_FOUND";
        case RL_ERR_BAD_STATE:
            return "RL_ERR_BAD_STATE";
        case RL_ERR_DEVICE:
            return "RL_ERR_DEVICE";
        case RL_ERR_IO:
            return "RL_ERR_IO";
        case RL_ERR_ABORTED:
            return "RL_ERR_ABORTED";
        case RL_ERR_INTERNAL:
            return "RL_ERR_INTERNAL";
        case RL_ERR_TIMEOUT:
            return "RL_ERR_TIMEOUT";
        case RL_ERR_NUMERIC:
            return "RL_ERR_NUMERIC";
        default:
            return "RL_ERR_<unlisted>";
    }
}

} // namespace rl::sdk
