// rlhost launch: starts and supervises the local ranks of a distributed run,
// with torchrun's environment contract (docs/distributed.md, "Launching").
#include "launch.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rlhost {
namespace {

const char *kLaunchUsage =
    "usage: rlhost launch --nproc-per-node N [--nnodes M --node-rank K]\n"
    "                     [--master-addr ADDR] [--master-port PORT] [--log-dir DIR]\n"
    "                     [--grace-seconds S] -- COMMAND [ARGS]\n"
    "       rlhost launch --roles ROLE[:N][,ROLE[:N]...] [--log-dir DIR]\n"
    "                     [--grace-seconds S] -- COMMAND [ARGS]\n"
    "\n"
    "Starts N ranks of `rlhost COMMAND ARGS` on this node (e.g. `-- run examples/grpo.lua\n"
    "--config examples/grpo.yaml`) with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
    "NODE_RANK, MASTER_ADDR and MASTER_PORT set, prefixes their output with [rank R],\n"
    "and stops them all when one fails. One node: the master is 127.0.0.1 on a free\n"
    "port unless given. Several nodes: run it on each with the same --nnodes,\n"
    "--master-addr and --master-port and its own --node-rank. Exit status: 0 when\n"
    "every rank succeeded, else the first failing rank's status (128 + signal when\n"
    "killed); 2 for bad usage.\n"
    "\n"
    "With --roles (the disaggregated mode, docs/disaggregated.md) it starts N processes\n"
    "per role instead (default 1), each with RL_ROLE, RL_ROLE_INDEX and RL_ROLE_COUNT\n"
    "set (and RL_ROLES: every role with its count, RL_LAUNCH_ID: unique per launch)\n"
    "and no rank variables, output prefixed with [ROLE] or [ROLE K], supervised\n"
    "the same way: e.g. --roles trainer,rollout:2.\n";

volatile std::sig_atomic_t g_signals = 0;
volatile std::sig_atomic_t g_last_signal = 0;

void on_signal(int sig) {
    g_signals = g_signals + 1;
    g_last_signal = sig;
}

struct Role {
    std::string name;
    int count = 1;
};

struct Options {
    int nproc = 0;
    std::vector<Role> roles; ///< --roles: one process per role instance, no ranks
    int nnodes = 1;
    int node_rank = 0;
    std::string master_addr;
    int master_port = 0;
    std::string log_dir;
    int grace_seconds = 10;
    std::vector<std::string> command;
};

[[noreturn]] void usage_error(const std::string &msg) {
    throw std::invalid_argument(msg);
}

int int_option(const std::string &name, const std::string &value, int min, int max) {
    char *end = nullptr;
    errno = 0;
    const long v = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || errno != 0 || v < min || v > max)
        usage_error(name + " must be an integer in [" + std::to_string(min) + ", " +
                    std::to_string(max) + "], got '" + value + "'");
    return static_cast<int>(v);
}

Options parse(const std::vector<std::string> &args) {
    Options o;
    bool have_nproc = false;
    size_t i = 0;
    for (; i < args.size(); ++i) {
        const std::string &a = args[i];
        if (a == "--") {
            ++i;
            break;
        }
        auto value = [&]() -> std::string {
            if (i + 1 >= args.size()) usage_error(a + " needs a value");
            return args[++i];
        };
        if (a == "--nproc-per-node") {
            o.nproc = int_option(a, value(), 1, 1024);
            have_nproc = true;
        } else if (a == "--nnodes") {
            o.nnodes = int_option(a, value(), 1, 65536);
        } else if (a == "--node-rank") {
            o.node_rank = int_option(a, value(), 0, 65535);
        } else if (a == "--master-addr") {
            o.master_addr = value();
        } else if (a == "--master-port") {
            o.master_port = int_option(a, value(), 1, 65535);
        } else if (a == "--log-dir") {
            o.log_dir = value();
        } else if (a == "--roles") {
            const std::string list = value();
            size_t start = 0;
            while (start <= list.size()) {
                const size_t comma = std::min(list.find(',', start), list.size());
                const std::string item = list.substr(start, comma - start);
                const size_t colon = item.find(':');
                Role r;
                r.name = item.substr(0, colon);
                if (colon != std::string::npos)
                    r.count = int_option("--roles count of '" + r.name + "'",
                                         item.substr(colon + 1), 1, 64);
                bool ok = !r.name.empty();
                for (char c : r.name)
                    ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_');
                if (!ok)
                    usage_error("--roles: '" + item +
                                "' is not ROLE or ROLE:N (ROLE: lower-case letters, digits, _)");
                for (const Role &seen : o.roles)
                    if (seen.name == r.name) usage_error("--roles: '" + r.name + "' given twice");
                o.roles.push_back(r);
                start = comma + 1;
            }
        } else if (a == "--grace-seconds") {
            o.grace_seconds = int_option(a, value(), 0, 3600);
        } else {
            usage_error("unknown option '" + a + "' (the command goes after --)");
        }
    }
    o.command.assign(args.begin() + static_cast<long>(i), args.end());
    if (!o.roles.empty()) {
        if (have_nproc || o.nnodes != 1 || !o.master_addr.empty() || o.master_port != 0)
            usage_error("--roles starts single-process roles: it does not combine with "
                        "--nproc-per-node, --nnodes or --master-*");
        o.nproc = 0;
        for (const Role &r : o.roles) o.nproc += r.count;
        have_nproc = true;
    }
    if (!have_nproc) usage_error("--nproc-per-node (or --roles) is required");
    if (o.node_rank >= o.nnodes)
        usage_error("--node-rank " + std::to_string(o.node_rank) + " is not below --nnodes " +
                    std::to_string(o.nnodes));
    if (o.command.empty()) usage_error("no command: give it after -- (e.g. -- run script.lua)");
    if (o.nnodes > 1 && o.master_addr.empty())
        usage_error("--master-addr is required with --nnodes > 1 (the address of node 0)");
    return o;
}

bool bindable_port(int port) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) return false;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = ::bind(s, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
    ::close(s);
    return ok;
}

// A TCP port for the ranks' store that was free a moment ago. It comes from
// below the kernel's ephemeral range (ip_local_port_range): a port from
// bind(0) is handed by the kernel to the next outgoing connection of any
// process on the machine, so it is often taken again before rank 0 binds it.
int free_port() {
    int lo = 32768, hi = 60999;
    std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
    const int first = lo - 1 >= 12000 ? 10000 : hi + 1, last = lo - 1 >= 12000 ? lo - 1 : 65535;
    const int span = last - first + 1;
    const auto seed =
        static_cast<unsigned>(::getpid()) * 7919u +
        static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count());
    for (int i = 0; span > 0 && i < 256; ++i) {
        const int port = first + static_cast<int>((seed + 104729u * static_cast<unsigned>(i)) %
                                                  static_cast<unsigned>(span));
        if (bindable_port(port)) return port;
    }
    return 29500;
}

// One rank's output stream: complete lines go out with the prefix.
struct Stream {
    int fd = -1;
    bool is_err = false;
    std::string partial;
};

struct Rank {
    int rank = 0;
    std::string label; ///< "rank 3", "trainer", "rollout 1"
    std::string role;  ///< --roles: the role's name
    int role_index = 0;
    int role_count = 0;
    pid_t pid = -1;
    Stream out, err;
    std::unique_ptr<std::ofstream> log;
    bool done = false;
    int status = 0; ///< exit code, or 128 + signal
    bool signaled = false;
};

void emit(Rank &r, bool is_err, const std::string &line) {
    const std::string text = "[" + r.label + "] " + line + "\n";
    std::fputs(text.c_str(), is_err ? stderr : stdout);
    std::fflush(is_err ? stderr : stdout);
    if (r.log) {
        *r.log << line << "\n";
        r.log->flush();
    }
}

// Reads what is available; returns false at end of stream.
bool pump(Rank &r, Stream &s) {
    char buf[8192];
    const ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) {
        if (!s.partial.empty()) emit(r, s.is_err, s.partial);
        s.partial.clear();
        ::close(s.fd);
        s.fd = -1;
        return false;
    }
    s.partial.append(buf, static_cast<size_t>(n));
    size_t start = 0, nl;
    while ((nl = s.partial.find('\n', start)) != std::string::npos) {
        emit(r, s.is_err, s.partial.substr(start, nl - start));
        start = nl + 1;
    }
    s.partial.erase(0, start);
    return true;
}

std::string describe(const Rank &r) {
    if (r.signaled) {
        const int sig = r.status - 128;
        const char *name = ::strsignal(sig);
        return "killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
    }
    return "exited with status " + std::to_string(r.status);
}

pid_t spawn(const Options &o, const Rank &r, const std::string &exe, const std::string &launch_id,
            const std::vector<std::string> &prefix_args, int out_w, int err_w, int out_r,
            int err_r) {
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid != 0) return pid;
    // The child: dies with the launcher.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) _exit(143);
    ::dup2(out_w, 1);
    ::dup2(err_w, 2);
    ::close(out_w);
    ::close(err_w);
    ::close(out_r);
    ::close(err_r);
    if (!r.role.empty()) {
        // A role is a process of its own, not a rank of a process group.
        for (const char *v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                              "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"})
            ::unsetenv(v);
        ::setenv("RL_ROLE", r.role.c_str(), 1);
        ::setenv("RL_ROLE_INDEX", std::to_string(r.role_index).c_str(), 1);
        ::setenv("RL_ROLE_COUNT", std::to_string(r.role_count).c_str(), 1);
        std::string all;
        for (const Role &role : o.roles)
            all += (all.empty() ? "" : ",") + role.name + ":" + std::to_string(role.count);
        ::setenv("RL_ROLES", all.c_str(), 1);
        ::setenv("RL_LAUNCH_ID", launch_id.c_str(), 1);
    } else {
        const int world = o.nnodes * o.nproc;
        const int local = r.rank - o.node_rank * o.nproc;
        ::setenv("RANK", std::to_string(r.rank).c_str(), 1);
        ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
        ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
        ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
        ::setenv("NODE_RANK", std::to_string(o.node_rank).c_str(), 1);
        ::setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
        ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
        ::setenv("MASTER_PORT", std::to_string(o.master_port).c_str(), 1);
    }
    std::vector<std::string> args{exe};
    args.insert(args.end(), prefix_args.begin(), prefix_args.end());
    args.insert(args.end(), o.command.begin(), o.command.end());
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(exe.c_str(), argv.data());
    std::fprintf(stderr, "rlhost launch: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
    _exit(127);
}

void signal_all(std::vector<Rank> &ranks, int sig) {
    for (auto &r : ranks)
        if (!r.done && r.pid > 0) ::kill(r.pid, sig);
}

} // namespace

int cmd_launch(const std::vector<std::string> &args, const std::vector<std::string> &host_args) {
    for (const auto &a : args)
        if (a == "--help" || a == "-h") {
            std::fputs(kLaunchUsage, stdout);
            return 0;
        } else if (a == "--")
            break;
    Options o;
    try {
        o = parse(args);
    } catch (const std::invalid_argument &e) {
        std::cerr << "rlhost launch: " << e.what() << "\n" << kLaunchUsage;
        return 2;
    }
    if (o.master_addr.empty()) o.master_addr = "127.0.0.1";
    if (o.master_port == 0 && o.roles.empty()) o.master_port = o.nnodes == 1 ? free_port() : 29500;

    char exe_buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", exe_buf, sizeof exe_buf - 1);
    if (n <= 0) {
        std::cerr << "rlhost launch: cannot find the rlhost executable (/proc/self/exe)\n";
        return 1;
    }
    const std::string exe(exe_buf, static_cast<size_t>(n));

    struct sigaction sa {};
    sa.sa_handler = on_signal;
    ::sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);

    // Names this launch's shared state (e.g. a transport folder), so that no
    // role reads what an earlier launch left behind.
    const std::string launch_id =
        std::to_string(::getpid()) + "-" +
        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count());
    std::vector<Rank> ranks(static_cast<size_t>(o.nproc));
    for (int k = 0; k < o.nproc; ++k) {
        Rank &r = ranks[static_cast<size_t>(k)];
        r.rank = o.node_rank * o.nproc + k;
        r.label = "rank " + std::to_string(r.rank);
        int before = 0;
        for (const Role &role : o.roles) {
            if (k < before + role.count) {
                r.role = role.name;
                r.role_index = k - before;
                r.role_count = role.count;
                r.label =
                    role.count == 1 ? role.name : role.name + " " + std::to_string(r.role_index);
                break;
            }
            before += role.count;
        }
        int out[2], err[2];
        if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
            std::cerr << "rlhost launch: pipe: " << std::strerror(errno) << "\n";
            signal_all(ranks, SIGKILL);
            return 1;
        }
        if (!o.log_dir.empty()) {
            ::mkdir(o.log_dir.c_str(), 0755);
            std::string file = "rank_" + std::to_string(r.rank);
            if (!r.role.empty()) file = r.role + "_" + std::to_string(r.role_index);
            r.log = std::make_unique<std::ofstream>(o.log_dir + "/" + file + ".log");
        }
        r.pid = spawn(o, r, exe, launch_id, host_args, out[1], err[1], out[0], err[0]);
        ::close(out[1]);
        ::close(err[1]);
        r.out = {out[0], false, {}};
        r.err = {err[0], true, {}};
    }
    if (o.roles.empty())
        std::fprintf(stderr, "rlhost launch: %d rank(s) on node %d of %d, master %s:%d\n", o.nproc,
                     o.node_rank, o.nnodes, o.master_addr.c_str(), o.master_port);
    else
        std::fprintf(stderr, "rlhost launch: %d process(es) in %zu role(s)\n", o.nproc,
                     o.roles.size());

    std::optional<size_t> first_failure;
    int forwarded = 0;
    bool kill_pending = false; // SIGKILL the rest at kill_at
    auto kill_at = std::chrono::steady_clock::now();
    size_t running = ranks.size();
    while (running > 0) {
        // Signals to the launcher go to the ranks: the first as it came, a
        // second one kills them.
        if (g_signals > forwarded) {
            forwarded = g_signals;
            signal_all(ranks, forwarded >= 2 ? SIGKILL : static_cast<int>(g_last_signal));
        }
        std::vector<pollfd> fds;
        std::vector<std::pair<size_t, Stream *>> owners;
        for (size_t k = 0; k < ranks.size(); ++k)
            for (Stream *s : {&ranks[k].out, &ranks[k].err})
                if (s->fd >= 0) {
                    fds.push_back({s->fd, POLLIN, 0});
                    owners.emplace_back(k, s);
                }
        if (!fds.empty()) {
            const int ready = ::poll(fds.data(), fds.size(), 100);
            for (size_t f = 0; ready > 0 && f < fds.size(); ++f)
                if (fds[f].revents & (POLLIN | POLLHUP | POLLERR))
                    pump(ranks[owners[f].first], *owners[f].second);
        } else {
            ::usleep(50 * 1000);
        }
        // Reap; a rank's exit counts once its output is drained.
        for (size_t k = 0; k < ranks.size(); ++k) {
            Rank &r = ranks[k];
            if (r.done) continue;
            int st = 0;
            const pid_t got = ::waitpid(r.pid, &st, WNOHANG);
            if (got != r.pid) continue;
            while (r.out.fd >= 0 && pump(r, r.out)) {
            }
            while (r.err.fd >= 0 && pump(r, r.err)) {
            }
            r.done = true;
            --running;
            r.signaled = WIFSIGNALED(st);
            r.status = r.signaled ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
            if (r.status != 0 && !first_failure) {
                first_failure = k;
                std::fprintf(stderr, "rlhost launch: %s %s; stopping the others\n", r.label.c_str(),
                             describe(r).c_str());
                signal_all(ranks, SIGTERM);
                kill_pending = true;
                kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(o.grace_seconds);
            }
        }
        if (kill_pending && running > 0 && std::chrono::steady_clock::now() >= kill_at) {
            signal_all(ranks, SIGKILL);
            kill_pending = false;
        }
    }
    if (first_failure) return ranks[*first_failure].status;
    if (g_signals > 0) return 130;
    return 0;
}

} // namespace rlhost
