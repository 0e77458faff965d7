#include "server_args.hpp"

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace rlhost {

ServerArgs parse_server_args(const std::vector<std::string> &args,
                             const std::vector<ServerFlag> &flags, const char *key_env) {
    // Every server's own flags, then the command's.
    std::vector<ServerFlag> all = {
        {"--host", "host", 's'}, {"--port", "port", 'i'}, {"--api-key", "api_key", 's'}};
    all.insert(all.end(), flags.begin(), flags.end());
    ServerArgs out;
    auto fail = [&](const std::string &why) {
        out.error = why;
        return out;
    };
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string &a = args[i];
        if (a == "--help" || a == "-h") {
            out.help = true;
            return out;
        }
        if (i + 1 >= args.size()) return fail(a + " needs a value");
        const std::string v = args[++i];
        if (a == "--model") {
            out.model_dir = v;
            continue;
        }
        if (a == "--device" || a == "--dtype") {
            out.load[a.substr(2)] = v;
            continue;
        }
        if (a == "--threads") {
            try {
                out.load["threads"] = std::stoi(v);
            } catch (const std::exception &) {
                return fail("--threads needs an integer, not '" + v + "'");
            }
            continue;
        }
        bool known = false;
        for (const ServerFlag &f : all) {
            if (a != f.flag) continue;
            known = true;
            try {
                size_t used = 0;
                if (f.kind == 's') {
                    out.options[f.key] = v;
                    used = v.size();
                } else if (f.kind == 'i') {
                    out.options[f.key] = std::stoll(v, &used);
                } else {
                    out.options[f.key] = std::stod(v, &used);
                }
                if (used != v.size()) throw std::invalid_argument(v);
            } catch (const std::exception &) {
                return fail(a + " needs a number, not '" + v + "'");
            }
        }
        if (!known) return fail("unknown option '" + a + "'");
    }
    if (out.model_dir.empty()) return fail("--model DIR is required");
    if (!out.options.contains("api_key"))
        if (const char *k = std::getenv(key_env); k && *k) out.options["api_key"] = k;
    out.options["model_path"] = out.model_dir;
    return out;
}

std::optional<int> help_or_error(const ServerArgs &a, const char *command, const char *usage) {
    if (a.help) {
        std::fputs(usage, stdout);
        return 0;
    }
    if (a.error.empty()) return std::nullopt;
    std::cerr << "rlhost " << command << ": " << a.error << "\n\n" << usage;
    return 2;
}

rl_model_t *load_server_model(const ServerArgs &a, const char *command) {
    rl_model_t *model = nullptr;
    if (rl_model_load(a.model_dir.c_str(), a.load.dump().c_str(), &model) == RL_OK) return model;
    std::cerr << "rlhost " << command << ": cannot load the model: " << rl_last_error() << "\n";
    return nullptr;
}

sigset_t block_stop_signals() {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    return signals;
}

void serve_until_stopped(const char *command, const nlohmann::json &options, int port,
                         const std::string &suffix, const sigset_t &signals,
                         const std::function<void()> &stop, const std::function<void()> &wait) {
    const std::string host = options.value("host", std::string("127.0.0.1"));
    const bool v6 = host.find(':') != std::string::npos;
    std::printf("rlhost %s: listening on http://%s:%d%s\n", command,
                (v6 ? "[" + host + "]" : host).c_str(), port, suffix.c_str());
    std::fflush(stdout);
    // A request can be stuck where nothing interrupts it (a weight update group
    // waiting for a master that never answers, up to its timeout): once asked
    // to stop, the process ends after kStopGraceSeconds whether or not every
    // request did.
    std::mutex mu;
    std::condition_variable cv;
    bool signalled = false, finished = false;
    std::thread watchdog([&] {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return signalled || finished; });
        if (cv.wait_for(lock, std::chrono::seconds(kStopGraceSeconds), [&] { return finished; }))
            return;
        std::fprintf(stderr,
                     "rlhost %s: requests still running %d s after the stop signal (e.g. a "
                     "weight update group waiting for its master); exiting without them\n",
                     command, kStopGraceSeconds);
        std::fflush(stderr);
        std::_Exit(1);
    });
    std::thread waiter([&] {
        int sig = 0;
        sigwait(&signals, &sig);
        std::fprintf(stderr, "rlhost %s: %s, stopping\n", command,
                     sig == SIGINT ? "SIGINT" : "SIGTERM");
        {
            std::lock_guard<std::mutex> lock(mu);
            signalled = true;
        }
        cv.notify_all();
        stop();
    });
    wait();
    {
        std::lock_guard<std::mutex> lock(mu);
        finished = true;
    }
    cv.notify_all();
    watchdog.join();
    // The waiter is still in sigwait when the server stopped for another reason.
    if (waiter.joinable()) {
        pthread_kill(waiter.native_handle(), SIGTERM);
        waiter.join();
    }
}

} // namespace rlhost
