// plugins/envs/command/subprocess.hpp: a child process spoken to one line at
// a time over pipes, with a deadline per exchange. POSIX (Linux) only.
//
// Guarantees (tested in tests/envs):
//   * the child runs in its own process group; kill() sends SIGKILL to the
//     whole group and reaps the child, so a verifier that forks helpers (a
//     shell running `sleep`) leaves neither zombies nor orphans behind;
//   * our pipe ends are O_CLOEXEC and the child closes every inherited
//     descriptor above 2 before exec, so no descriptor leaks either way;
//   * writes never raise SIGPIPE in the host: SIGPIPE is blocked on the
//     calling thread for the write and a pending one is consumed afterwards;
//   * between fork and exec the child calls only async-signal-safe functions
//     (everything is prepared before fork), so it is safe in a threaded host.
#pragma once

#include <rl/sdk/sdk.hpp>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

namespace rl::envs {

using Clock = std::chrono::steady_clock;

inline std::string errno_text(int e) {
    char buf[256];
    // GNU strerror_r returns the message (maybe not in buf).
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
    return strerror_r(e, buf, sizeof buf);
#else
    if (strerror_r(e, buf, sizeof buf) != 0) return "errno " + std::to_string(e);
    return buf;
#endif
}

// Blocks SIGPIPE on this thread for its lifetime; a SIGPIPE raised meanwhile
// by our own write is consumed before the old mask comes back.
class SigpipeGuard {
public:
    SigpipeGuard() {
        sigemptyset(&set_);
        sigaddset(&set_, SIGPIPE);
        sigset_t pending;
        sigemptyset(&pending);
        sigpending(&pending);
        was_pending_ = sigismember(&pending, SIGPIPE) == 1;
        pthread_sigmask(SIG_BLOCK, &set_, &old_);
    }
    ~SigpipeGuard() {
        if (!was_pending_) {
            sigset_t pending;
            sigemptyset(&pending);
            sigpending(&pending);
            if (sigismember(&pending, SIGPIPE) == 1) {
                const timespec zero{0, 0};
                while (sigtimedwait(&set_, nullptr, &zero) < 0 && errno == EINTR) {
                }
            }
        }
        pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    }
    SigpipeGuard(const SigpipeGuard &) = delete;
    SigpipeGuard &operator=(const SigpipeGuard &) = delete;

private:
    sigset_t set_{}, old_{};
    bool was_pending_ = false;
};

// How a child ended, in words.
inline std::string describe_status(int status) {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) {
        const int sig = WTERMSIG(status);
        const char *name = sig == SIGKILL   ? " (SIGKILL)"
                           : sig == SIGSEGV ? " (SIGSEGV)"
                           : sig == SIGABRT ? " (SIGABRT)"
                           : sig == SIGTERM ? " (SIGTERM)"
                           : sig == SIGPIPE ? " (SIGPIPE)"
                                            : "";
        return "was killed by signal " + std::to_string(sig) + name;
    }
    return "ended (status " + std::to_string(status) + ")";
}

// Resolves argv[0] the way execvp would, before fork: a name with a '/' is
// taken as is (relative to `cwd` when given), anything else is searched in
// `path_env`. Returns "" when nothing executable is found.
inline std::string resolve_executable(const std::string &name, const std::string &cwd,
                                      const std::string &path_env) {
    auto executable = [](const std::string &p) {
        struct stat st {};
        return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
    };
    if (name.find('/') != std::string::npos) {
        const std::string p = (name[0] != '/' && !cwd.empty()) ? cwd + "/" + name : name;
        return executable(p) ? name : "";
    }
    size_t start = 0;
    while (start <= path_env.size()) {
        size_t end = path_env.find(':', start);
        if (end == std::string::npos) end = path_env.size();
        std::string dir = path_env.substr(start, end - start);
        if (dir.empty()) dir = ".";
        std::string p = dir + "/" + name;
        if (p[0] != '/' && !cwd.empty()) p = cwd + "/" + p;
        if (executable(p)) return p;
        start = end + 1;
    }
    return "";
}

struct ProcessSpec {
    std::string executable;        // resolved path (resolve_executable)
    std::vector<std::string> argv; // argv[0] as the user wrote it
    std::vector<std::string> env;  // "KEY=VALUE" entries of the child's environment
    std::string cwd;               // "" = the host's
    bool discard_stderr = false;   // else the child inherits the host's stderr
};

// One child process. Not thread-safe: the owner serializes calls.
class Subprocess {
public:
    explicit Subprocess(ProcessSpec spec) : spec_(std::move(spec)) {}
    ~Subprocess() { stop(0.5); }
    Subprocess(const Subprocess &) = delete;
    Subprocess &operator=(const Subprocess &) = delete;

    bool running() const { return pid_ > 0; }
    pid_t pid() const { return pid_; }

    // Starts the child; throws rl::sdk::Error (RL_ERR_IO) when fork, the
    // working directory or exec fails.
    void start() {
        if (running()) return;
        int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1}, status_pipe[2] = {-1, -1};
        int devnull = -1;
        auto close_all = [&] {
            for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1], status_pipe[0],
                           status_pipe[1], devnull})
                if (fd >= 0) ::close(fd);
        };
        if (::pipe2(in_pipe, O_CLOEXEC) != 0 || ::pipe2(out_pipe, O_CLOEXEC) != 0 ||
            ::pipe2(status_pipe, O_CLOEXEC) != 0) {
            const int e = errno;
            close_all();
            rl::sdk::fail(RL_ERR_IO, "cannot create pipes for " + name() + ": " + errno_text(e));
        }
        if (spec_.discard_stderr) devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);

        // Everything the child needs, prepared before fork.
        std::vector<char *> argv, envp;
        for (auto &a : spec_.argv) argv.push_back(const_cast<char *>(a.c_str()));
        argv.push_back(nullptr);
        for (auto &e : spec_.env) envp.push_back(const_cast<char *>(e.c_str()));
        envp.push_back(nullptr);
        const char *cwd = spec_.cwd.empty() ? nullptr : spec_.cwd.c_str();
        const char *exe = spec_.executable.c_str();
        long max_fd = ::sysconf(_SC_OPEN_MAX);
        if (max_fd < 0 || max_fd > 65536) max_fd = 65536;

        const pid_t pid = ::fork();
        if (pid < 0) {
            const int e = errno;
            close_all();
            rl::sdk::fail(RL_ERR_IO, "cannot fork " + name() + ": " + errno_text(e));
        }
        if (pid == 0)
            child(in_pipe[0], out_pipe[1], status_pipe[1], devnull, cwd, exe, argv.data(),
                  envp.data(), static_cast<int>(max_fd));

        // Parent.
        ::close(in_pipe[0]);
        ::close(out_pipe[1]);
        ::close(status_pipe[1]);
        if (devnull >= 0) ::close(devnull);
        // Closed at exec (CLOEXEC): EOF means exec succeeded.
        int report[2] = {0, 0};
        size_t got = 0;
        while (got < sizeof report) {
            const ssize_t r =
                ::read(status_pipe[0], reinterpret_cast<char *>(report) + got, sizeof report - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += static_cast<size_t>(r);
        }
        ::close(status_pipe[0]);
        if (got > 0) {
            ::close(in_pipe[1]);
            ::close(out_pipe[0]);
            reap_blocking(pid);
            rl::sdk::fail(RL_ERR_IO,
                          name() + ": " +
                              (report[0] == 1 ? "cannot change to directory '" + spec_.cwd + "'"
                                              : "cannot execute '" + spec_.executable + "'") +
                              ": " + errno_text(report[1]));
        }
        pid_ = pid;
        in_fd_ = in_pipe[1];
        out_fd_ = out_pipe[0];
        ::fcntl(in_fd_, F_SETFL, ::fcntl(in_fd_, F_GETFL) | O_NONBLOCK);
        ::fcntl(out_fd_, F_SETFL, ::fcntl(out_fd_, F_GETFL) | O_NONBLOCK);
        buffer_.clear();
    }

    // If the child has exited on its own, kills what is left of its process
    // group (helpers it started), reaps it, closes our ends and returns how
    // it ended; "" while it runs (or when there is none).
    std::string poll_exit() {
        if (!running()) return "";
        siginfo_t info{};
        for (;;) {
            // WNOWAIT: the zombie keeps its pid (our group id) reserved until
            // the group is killed.
            const int r =
                ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT);
            if (r == 0 && info.si_pid == 0) return "";
            if (r == 0) break;
            if (errno == EINTR) continue;
            pid_ = -1; // ECHILD: someone else reaped it (a host ignoring SIGCHLD)
            close_fds();
            return "ended (already reaped)";
        }
        ::kill(-pid_, SIGKILL);
        const std::string how = reap_blocking(pid_);
        pid_ = -1;
        close_fds();
        return how;
    }

    // Kills the process group and reaps the child. Returns how it ended.
    std::string kill() {
        if (!running()) return "";
        ::kill(-pid_, SIGKILL);
        ::kill(pid_, SIGKILL);
        const std::string how = reap_blocking(pid_);
        pid_ = -1;
        close_fds();
        return how;
    }

    // Closes the child's stdin (a well-behaved child exits on EOF), waits up
    // to `grace_s`, then kills the group.
    void stop(double grace_s) {
        if (!running()) return;
        if (in_fd_ >= 0) {
            ::close(in_fd_);
            in_fd_ = -1;
        }
        const auto until = Clock::now() + std::chrono::duration<double>(grace_s);
        while (Clock::now() < until) {
            if (!poll_exit().empty()) return;
            struct timespec ts {
                0, 5 * 1000 * 1000
            };
            ::nanosleep(&ts, nullptr);
        }
        kill();
    }

    // Writes `line` (which ends in '\n') and reads one line back, before
    // `deadline`. Throws rl::sdk::Error: RL_ERR_TIMEOUT when the deadline
    // passes, RL_ERR_ABORTED when *abort becomes non-zero, RL_ERR_IO when the
    // child closes a pipe or exits, or prints more than max_line bytes without
    // a newline. On any throw the child is still running or already reaped;
    // the caller decides (kill() it).
    std::string exchange(const std::string &line, Clock::time_point deadline,
                         const volatile int32_t *abort, size_t max_line) {
        write_all(line, deadline, abort);
        for (;;) {
            const size_t nl = buffer_.find('\n');
            if (nl != std::string::npos) {
                std::string out = buffer_.substr(0, nl);
                buffer_.erase(0, nl + 1);
                if (!out.empty() && out.back() == '\r') out.pop_back();
                return out;
            }
            if (buffer_.size() > max_line)
                rl::sdk::fail(RL_ERR_IO, name() + " printed more than " + std::to_string(max_line) +
                                             " bytes without a newline");
            wait_fd(out_fd_, POLLIN, deadline, abort, "answer");
            char chunk[65536];
            const ssize_t r = ::read(out_fd_, chunk, sizeof chunk);
            if (r > 0) {
                buffer_.append(chunk, static_cast<size_t>(r));
            } else if (r == 0) {
                rl::sdk::fail(RL_ERR_IO,
                              name() + " " + ended_after_pipe_closed() + " before answering");
            } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
                rl::sdk::fail(RL_ERR_IO, "reading from " + name() + ": " + errno_text(errno));
            }
        }
    }

    std::string name() const {
        std::string s = "verifier '";
        for (size_t i = 0; i < spec_.argv.size(); ++i) s += (i ? " " : "") + spec_.argv[i];
        return s + "'";
    }

private:
    [[noreturn]] static void child(int in_fd, int out_fd, int status_fd, int err_fd,
                                   const char *cwd, const char *exe, char *const *argv,
                                   char *const *envp, int max_fd) {
        // Async-signal-safe calls only from here on.
        ::setpgid(0, 0);
        sigset_t none;
        sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        ::signal(SIGPIPE, SIG_DFL);
        if (::dup2(in_fd, 0) < 0 || ::dup2(out_fd, 1) < 0 || (err_fd >= 0 && ::dup2(err_fd, 2) < 0))
            report_and_exit(status_fd, 2);
        close_from(3, status_fd, max_fd);
        if (cwd && ::chdir(cwd) != 0) report_and_exit(status_fd, 1);
        ::execve(exe, argv, envp);
        report_and_exit(status_fd, 2);
    }

    // Closes every descriptor >= first except `keep` (close_range when the
    // kernel has it, else one by one).
    static void close_from(int first, int keep, int max_fd) {
#ifdef SYS_close_range
        bool ok = keep <= first || ::syscall(SYS_close_range, first, keep - 1, 0) == 0;
        ok = ok && ::syscall(SYS_close_range, keep + 1, ~0U, 0) == 0;
        if (ok) return;
#endif
        for (int fd = first; fd < max_fd; ++fd)
            if (fd != keep) ::close(fd);
    }

    [[noreturn]] static void report_and_exit(int status_fd, int step) {
        const int report[2] = {step, errno};
        ssize_t r = ::write(status_fd, report, sizeof report);
        (void)r;
        ::_exit(127);
    }

    // Waits for `pid`, retrying on EINTR; tolerates a host that ignores
    // SIGCHLD (the kernel reaps, waitpid says ECHILD).
    static std::string reap_blocking(pid_t pid) {
        int status = 0;
        for (;;) {
            const pid_t r = ::waitpid(pid, &status, 0);
            if (r == pid) return describe_status(status);
            if (r < 0 && errno == EINTR) continue;
            return "ended (already reaped)";
        }
    }

    // After EOF on the child's stdout: give it a moment to exit so the message
    // can say how it ended.
    std::string ended_after_pipe_closed() {
        const auto until = Clock::now() + std::chrono::milliseconds(200);
        while (Clock::now() < until) {
            const std::string how = poll_exit();
            if (!how.empty()) return how;
            struct timespec ts {
                0, 2 * 1000 * 1000
            };
            ::nanosleep(&ts, nullptr);
        }
        return "closed its stdout";
    }

    void write_all(const std::string &line, Clock::time_point deadline,
                   const volatile int32_t *abort) {
        SigpipeGuard guard;
        size_t off = 0;
        while (off < line.size()) {
            const ssize_t w = ::write(in_fd_, line.data() + off, line.size() - off);
            if (w > 0) {
                off += static_cast<size_t>(w);
                continue;
            }
            if (w < 0 && errno == EINTR) continue;
            if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                wait_fd(in_fd_, POLLOUT, deadline, abort, "read its request");
                continue;
            }
            if (w < 0 && errno == EPIPE)
                rl::sdk::fail(RL_ERR_IO,
                              name() + " " + ended_after_pipe_closed() + " (its stdin is closed)");
            rl::sdk::fail(RL_ERR_IO, "writing to " + name() + ": " + errno_text(errno));
        }
    }

    // Polls in short slices so an abort is noticed; throws on deadline/abort.
    void wait_fd(int fd, short events, Clock::time_point deadline, const volatile int32_t *abort,
                 const char *what) {
        for (;;) {
            if (abort && *abort != 0)
                rl::sdk::fail(RL_ERR_ABORTED, "aborted while waiting for " + name());
            const auto left =
                std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
            if (left.count() <= 0)
                rl::sdk::fail(RL_ERR_TIMEOUT, name() + " did not " + what + " in time");
            pollfd p{fd, events, 0};
            const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 50)));
            if (r > 0) return; // readable/writable, or HUP/ERR: the read/write says which
            if (r < 0 && errno != EINTR)
                rl::sdk::fail(RL_ERR_IO, "poll on " + name() + ": " + errno_text(errno));
        }
    }

    void close_fds() {
        if (in_fd_ >= 0) ::close(in_fd_);
        if (out_fd_ >= 0) ::close(out_fd_);
        in_fd_ = out_fd_ = -1;
        buffer_.clear();
    }

    ProcessSpec spec_;
    pid_t pid_ = -1;
    int in_fd_ = -1;  // the child's stdin (we write)
    int out_fd_ = -1; // the child's stdout (we read)
    std::string buffer_;
};

} // namespace rl::envs
