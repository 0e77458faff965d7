// Errors raised by the model core. Every message names the thing that is
// wrong (file, tensor, config key, token, argument).
#pragma once

#include <stdexcept>
#include <string>

namespace rl::core {

/// The one exception type the model core throws for bad input or I/O failure.
class Error : public std::runtime_error {
public:
    explicit Error(const std::string &what) : std::runtime_error(what) {}
};

/// Throws Error(message) when cond is false.
inline void check(bool cond, const std::string &message) {
    if (!cond) throw Error(message);
}

/// "<what>: <strerror(errno)>" for a failed system call.
[[noreturn]] void throw_errno(const std::string &what);

} // namespace rl::core
