// rl/core/error.hpp: the one exception type of core/ (model, tokenizer,
// trainer, engine, checkpoints). Every message names the thing that is wrong
// (file, tensor, config key, token, argument); the kind says what went wrong,
// and the C API maps it to a status code.
#pragma once

#include <stdexcept>
#include <string>

namespace rl::core {

enum class ErrorKind { InvalidArgument, NotFound, BadState, Io, Numeric };

class Error : public std::runtime_error {
public:
    explicit Error(const std::string &what) : Error(ErrorKind::InvalidArgument, what) {}
    Error(ErrorKind kind, const std::string &what) : std::runtime_error(what), kind_(kind) {}
    ErrorKind kind() const { return kind_; }

private:
    ErrorKind kind_;
};

/// Throws Error(message) (an invalid argument) when cond is false.
inline void check(bool cond, const std::string &message) {
    if (!cond) throw Error(message);
}

/// Throws Error(kind, message) when cond is false.
inline void require(bool cond, ErrorKind kind, const std::string &message) {
    if (!cond) throw Error(kind, message);
}

/// Throws an Io Error "<what>: <strerror(errno)>" for a failed system call.
[[noreturn]] void throw_errno(const std::string &what);

} // namespace rl::core
