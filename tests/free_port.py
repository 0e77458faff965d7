"""A loopback TCP port reserved for this test process (the Python half of
tests/plugin_host/free_port.hpp, same locks, same reasons).

"Bind port 0, read it, close" races under `ctest -j`: the kernel hands the same
ephemeral port to the next connection or bind(0) of any process. So the port
comes from below the kernel's ephemeral range, and it is reserved among tests
by an flock on /tmp/rltest-ports/<port>, held until this process exits.
"""

import fcntl
import os
import socket
import time

_HELD = []  # the lock files' descriptors, open until the process exits
LOCK_DIR = "/tmp/rltest-ports"


def _reserved_range():
    lo, hi = 32768, 60999
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
    except OSError:
        pass
    return (10000, lo - 1) if lo - 1 >= 12000 else (hi + 1, 65535)


def _bindable(port, host):
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_port(host="127.0.0.1"):
    first, last = _reserved_range()
    os.makedirs(LOCK_DIR, exist_ok=True)
    try:
        os.chmod(LOCK_DIR, 0o777)
    except OSError:
        pass
    span = last - first + 1
    seed = os.getpid() * 7919 + time.monotonic_ns()
    for i in range(span):
        port = first + (seed + i) % span
        fd = os.open(os.path.join(LOCK_DIR, str(port)), os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        if _bindable(port, host):
            _HELD.append(fd)
            return port
        os.close(fd)
    raise RuntimeError(f"free_port: no free port in {first}-{last}")
