// rl/core/train_error.hpp: errors of the trainer, the engine and checkpoints.
// A model-core Error with a kind, which the C API maps to a status code.
#pragma once

#include "rl/core/error.hpp"

#include <string>

namespace rl::core {

enum class ErrorKind { InvalidArgument, NotFound, BadState, Io, Numeric };

class TrainError : public Error {
public:
    TrainError(ErrorKind kind, const std::string &what) : Error(what), kind_(kind) {}
    ErrorKind kind() const { return kind_; }

private:
    ErrorKind kind_;
};

/// Throws TrainError(kind, message) when cond is false.
inline void require(bool cond, ErrorKind kind, const std::string &message) {
    if (!cond) throw TrainError(kind, message);
}

} // namespace rl::core
