// tests/plugin_host/free_port.hpp: a loopback TCP port that was free a moment
// ago, for tests that bind servers (ZeroMQ transports, launchers).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace rltest {

inline int free_tcp_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = 0;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) ::close(fd);
    return port;
}

} // namespace rltest
