// tests/plugin_host/free_port.hpp: a loopback TCP port reserved for this test
// process, for tests whose servers bind a port chosen in advance (ZeroMQ
// transports, launchers, rendezvous stores).
//
// "Bind port 0, read it, close" races: the kernel hands the same ephemeral
// port to the next outgoing connection or bind(0) of any process, and under
// `ctest -j` another test takes it before our server binds it ("Address
// already in use"). So the port comes from below the kernel's ephemeral range
// (ip_local_port_range), which the kernel never hands out by itself, and it is
// reserved among tests by an flock on /tmp/rltest-ports/<port>, held until
// this process exits. tests/free_port.py takes the same locks, so C++ and
// Python tests never share a port.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

namespace rltest {

namespace detail {

inline bool bindable(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
}

// The first and last port that the kernel does not hand out by itself.
inline void reserved_range(int &first, int &last) {
    int lo = 32768, hi = 60999;
    std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
    if (lo - 1 >= 12000) {
        first = 10000, last = lo - 1;
    } else {
        first = hi + 1, last = 65535;
    }
}

} // namespace detail

inline int free_tcp_port() {
    int first = 0, last = 0;
    detail::reserved_range(first, last);
    const std::string dir = "/tmp/rltest-ports";
    ::mkdir(dir.c_str(), 0777);
    ::chmod(dir.c_str(), 0777);
    const int span = last - first + 1;
    const auto seed =
        static_cast<unsigned>(::getpid()) * 7919u +
        static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count());
    for (int i = 0; span > 0 && i < span; ++i) {
        const int port = first + static_cast<int>((seed + static_cast<unsigned>(i)) %
                                                  static_cast<unsigned>(span));
        const std::string lock = dir + "/" + std::to_string(port);
        const int fd = ::open(lock.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
        if (fd < 0) continue;
        // Held (never closed) until this process exits; a second call in this
        // process gets a new open file description, so it cannot take it again.
        if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
            ::close(fd);
            continue;
        }
        if (detail::bindable(port)) return port;
        ::close(fd);
    }
    std::fprintf(stderr, "free_tcp_port: no free port in %d-%d\n", first, last);
    return 0;
}

} // namespace rltest
