// Load on `rlhost serve` next to the same load in process: C concurrent
// clients each sending R completion requests one after the other over
// loopback HTTP (/v1/completions), then the same C x R requests submitted
// straight to the continuous-batching scheduler, then as batched
// Engine::generate calls of C prompts. Prints errors, p50 / p99 latency,
// tokens/s and the ratios. Not a test: numbers only.
//
// Usage: bench_serve [--model DIR] [--clients 64] [--requests 20] [--max-tokens 32]
//        (no --model: the built-in tiny model in a temporary folder)
#include "../../host/serve/http.hpp"
#include "../../host/serve/server.hpp"

#include "rl/core/engine.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/scheduler.hpp"
#include "rl/core/tiny.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Load {
    int clients = 64, requests = 20, max_tokens = 32;
};

struct Tally {
    std::mutex mu;
    std::vector<double> latency_s;
    int64_t tokens = 0, errors = 0;
    std::string first_error;
    void add(double s, int64_t t) {
        std::lock_guard<std::mutex> lk(mu);
        latency_s.push_back(s);
        tokens += t;
    }
    void fail(const std::string &e) {
        std::lock_guard<std::mutex> lk(mu);
        if (errors++ == 0) first_error = e;
    }
};

double seconds(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const auto i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
}

double report(const char *what, Tally &t, double wall) {
    const double tps = static_cast<double>(t.tokens) / wall;
    std::printf("%-34s %5zu ok %4lld errors  p50 %7.1f ms  p99 %7.1f ms  %9.1f tokens/s\n", what,
                t.latency_s.size(), static_cast<long long>(t.errors),
                1e3 * percentile(t.latency_s, 0.50), 1e3 * percentile(t.latency_s, 0.99), tps);
    if (t.errors > 0) std::printf("  first error: %s\n", t.first_error.c_str());
    return tps;
}

std::string prompt_text(int client, int request) {
    return "Request " + std::to_string(client) + "." + std::to_string(request) +
           ": tell me a story about the number " + std::to_string(client * 31 + request);
}

// load.clients threads, each making load.requests requests with
// request(client, index, tally); the report's tokens per second.
template <class F>
double run_clients(const Load &load, const char *what, F request) {
    Tally t;
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < load.clients; ++c)
        threads.emplace_back([&, c] {
            for (int r = 0; r < load.requests; ++r) request(c, r, t);
        });
    for (auto &th : threads) th.join();
    return report(what, t, seconds(t0));
}

} // namespace

int main(int argc, char **argv) {
    Load load;
    std::string model;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "bench_serve: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--model")
            model = next();
        else if (a == "--clients")
            load.clients = std::stoi(next());
        else if (a == "--requests")
            load.requests = std::stoi(next());
        else if (a == "--max-tokens")
            load.max_tokens = std::stoi(next());
        else {
            std::fprintf(stderr, "usage: bench_serve [--model DIR] [--clients N] [--requests N] "
                                 "[--max-tokens N]\n");
            return 2;
        }
    }
    std::filesystem::path tmp;
    if (model.empty()) {
        tmp = std::filesystem::temp_directory_path() /
              ("rl-bench-serve-" + std::to_string(::getpid()));
        rl::core::write_tiny_model(tmp.string(), 7);
        model = tmp.string();
    }
    auto policy = rl::core::Policy::load(model);
    std::printf("bench_serve: %d clients x %d requests, max_tokens %d, model %s, %u cores\n",
                load.clients, load.requests, load.max_tokens, model.c_str(),
                std::thread::hardware_concurrency());

    // 1. Over HTTP.
    double http_tps = 0;
    {
        rl::serve::ServerConfig cfg;
        cfg.port = 0;
        cfg.scheduler.max_running = load.clients;
        rl::serve::Server server(policy, cfg);
        server.start();
        http_tps = run_clients(load, "rlhost serve (HTTP, loopback)", [&](int c, int r, Tally &t) {
            const json body = {{"prompt", prompt_text(c, r)},
                               {"max_tokens", load.max_tokens},
                               {"temperature", 1.0},
                               {"seed", c * 1000 + r}};
            const auto s0 = Clock::now();
            try {
                const auto resp = rl::serve::http_request(server.url(), "POST", "/v1/completions",
                                                          body.dump(), {}, 600);
                if (resp.status != 200) {
                    t.fail("HTTP " + std::to_string(resp.status) + ": " + resp.body.substr(0, 200));
                    return;
                }
                const json j = json::parse(resp.body);
                t.add(seconds(s0), j.at("usage").at("completion_tokens").get<int64_t>());
            } catch (const std::exception &e) {
                t.fail(e.what());
            }
        });
        server.stop();
    }

    // 2. The same requests straight to the scheduler.
    double sched_tps = 0;
    {
        rl::core::SchedulerConfig sc;
        sc.max_running = load.clients;
        rl::core::Scheduler scheduler(policy, sc);
        const auto &tok = policy->require_tokenizer("bench_serve");
        sched_tps = run_clients(load, "scheduler (in process)", [&](int c, int r, Tally &t) {
            rl::core::ServeRequest req;
            for (int32_t id : tok.encode(prompt_text(c, r))) req.prompt.push_back(id);
            req.params.max_tokens = load.max_tokens;
            req.params.seed = static_cast<uint64_t>(c * 1000 + r);
            std::promise<rl::core::RequestResult> done;
            auto fut = done.get_future();
            req.on_done = [&done](rl::core::RequestResult res) { done.set_value(std::move(res)); };
            const auto s0 = Clock::now();
            try {
                scheduler.submit(std::move(req));
                const auto res = fut.get();
                if (res.end == rl::core::RequestEnd::Error)
                    t.fail(res.error);
                else
                    t.add(seconds(s0), static_cast<int64_t>(res.tokens.size()));
            } catch (const std::exception &e) {
                t.fail(e.what());
            }
        });
    }

    // 3. Batched engine calls: C prompts per call, R calls.
    double engine_tps = 0;
    {
        rl::core::Engine engine(policy);
        const auto &tok = policy->require_tokenizer("bench_serve");
        Tally t;
        const auto t0 = Clock::now();
        for (int r = 0; r < load.requests; ++r) {
            std::vector<std::vector<int64_t>> prompts;
            for (int c = 0; c < load.clients; ++c) {
                std::vector<int64_t> p;
                for (int32_t id : tok.encode(prompt_text(c, r))) p.push_back(id);
                prompts.push_back(std::move(p));
            }
            rl::core::SamplingParams sp;
            sp.max_tokens = load.max_tokens;
            sp.seed = static_cast<uint64_t>(r);
            const auto s0 = Clock::now();
            const auto g = engine.generate(prompts, sp);
            const double s = seconds(s0);
            for (int64_t i = 0; i < g.samples(); ++i)
                t.add(s, g.cu_seqlens[static_cast<size_t>(i) + 1] -
                             g.cu_seqlens[static_cast<size_t>(i)]);
        }
        engine_tps = report("Engine::generate (batches of C)", t, seconds(t0));
    }
    std::printf("ratio tokens/s: HTTP / scheduler %.2f, HTTP / engine batches %.2f\n",
                sched_tps > 0 ? http_tps / sched_tps : 0.0,
                engine_tps > 0 ? http_tps / engine_tps : 0.0);
    if (!tmp.empty()) std::filesystem::remove_all(tmp);
    return 0;
}
