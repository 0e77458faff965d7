#include "rl/core/error.hpp"

#include <cerrno>
#include <cstring>

namespace rl::core {

void throw_errno(const std::string &what) {
    const int err = errno;
    throw Error(ErrorKind::Io, what + ": " + std::strerror(err));
}

} // namespace rl::core
