// bench_dist: training throughput per rank for W = 1 and 2 processes and
// per-rank trainer memory for dp vs fsdp, on this machine (Gloo over
// loopback; NCCL when the model is on CUDA).
//
//   bench_dist [--layers L] [--hidden H] [--seqs S] [--seq-len T] [--steps N] [--device D]
//
// Without RANK in the environment it is the driver: it starts the ranks
// (this same program) for each configuration, and prints one line each plus
// the ratios. A speed or memory target lives here, never in a test.
#include "rl/core/dist.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/tiny.hpp"
#include "rl/core/trainer.hpp"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace {

struct Args {
    int layers = 4, hidden = 256, seqs = 8, seq_len = 128, steps = 6;
    std::string device = "cpu";
};

Args parse(int argc, char **argv) {
    Args a;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i], v = argv[i + 1];
        if (k == "--layers")
            a.layers = std::stoi(v);
        else if (k == "--hidden")
            a.hidden = std::stoi(v);
        else if (k == "--seqs")
            a.seqs = std::stoi(v);
        else if (k == "--seq-len")
            a.seq_len = std::stoi(v);
        else if (k == "--steps")
            a.steps = std::stoi(v);
        else if (k == "--device")
            a.device = v;
        else
            throw std::runtime_error("unknown option " + k);
    }
    return a;
}

// One rank: prints a JSON line {tokens_per_s, state_bytes, max_rss_bytes}.
int rank_main(const Args &a, const std::string &strategy) {
    rl::core::dist::init({}, a.device);
    rl::core::TinyModelSpec spec;
    spec.num_hidden_layers = a.layers;
    spec.hidden_size = a.hidden;
    spec.intermediate_size = a.hidden * 3;
    spec.num_attention_heads = std::max(1, a.hidden / 64);
    spec.num_key_value_heads = std::max(1, a.hidden / 128);
    spec.head_dim = 64;
    rl::core::ModelOptions mo;
    mo.device = at::Device(a.device);
    auto model = std::make_shared<rl::core::CausalLM>(
        rl::core::ModelConfig::parse(rl::core::tiny_config_json(spec)), mo);
    model->init_weights(1);
    auto policy = std::make_shared<rl::core::Policy>(model, nullptr);
    rl::core::TrainerConfig tc;
    tc.parallel = strategy;
    tc.learning_rate = 1e-4;
    tc.packing.micro_batch_tokens = 1024;
    tc.packing.sample_packing_sequence_len = 1024;
    rl::core::Trainer trainer(policy, tc);

    rl::core::LossFunction loss;
    loss.name = "mean logprob";
    loss.signature.required = {"logprobs"};
    loss.signature.differentiable = {"logprobs"};
    loss.compute = [](const rl::core::LossCall &c) {
        rl::core::LossResult r;
        const at::Tensor &lp = c.tensors.at(0).second;
        r.loss = -lp.sum().item<double>() / c.global_tokens;
        if (c.want_grads) r.grads["logprobs"] = at::full_like(lp, -1.0 / c.global_tokens);
        return r;
    };
    rl::core::TrainBatch b;
    const int64_t T = static_cast<int64_t>(a.seqs) * a.seq_len;
    b.input_ids = at::randint(rl::core::kTinyVocabSize, {T}, at::kLong);
    for (int s = 0; s <= a.seqs; ++s) b.cu_seqlens.push_back(static_cast<int64_t>(s) * a.seq_len);

    double seconds = 0;
    for (int step = 0; step < a.steps + 1; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        trainer.forward_backward(b, loss);
        trainer.optim_step();
        if (step > 0) // the first step warms up
            seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    nlohmann::json out = {{"tokens_per_s", static_cast<double>(T) * a.steps / seconds},
                          {"state_bytes", trainer.state_bytes()},
                          {"max_rss_bytes", static_cast<int64_t>(ru.ru_maxrss) * 1024}};
    std::cout << out.dump() << std::endl;
    return 0;
}

std::vector<nlohmann::json> run_ranks(char **argv, int world, const std::string &strategy) {
    const int port = 29700 + (std::rand() % 200);
    std::vector<std::pair<pid_t, int>> kids;
    for (int r = 0; r < world; ++r) {
        int fd[2];
        if (pipe(fd) != 0) throw std::runtime_error("pipe");
        const pid_t pid = fork();
        if (pid == 0) {
            dup2(fd[1], 1);
            close(fd[0]);
            setenv("RL_BENCH_STRATEGY", strategy.c_str(), 1);
            if (world > 1) {
                setenv("RANK", std::to_string(r).c_str(), 1);
                setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
                setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
                setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
                setenv("MASTER_ADDR", "127.0.0.1", 1);
                setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
            }
            execv("/proc/self/exe", argv);
            _exit(127);
        }
        close(fd[1]);
        kids.emplace_back(pid, fd[0]);
    }
    std::vector<nlohmann::json> out;
    for (auto &[pid, fd] : kids) {
        std::string text;
        char buf[4096];
        ssize_t n;
        while ((n = read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
        close(fd);
        int st = 0;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            throw std::runtime_error("a rank failed (W=" + std::to_string(world) + ", " + strategy +
                                     ")");
        out.push_back(nlohmann::json::parse(text.substr(text.rfind('{'))));
    }
    return out;
}

} // namespace

int main(int argc, char **argv) {
    try {
        const Args a = parse(argc, argv);
        if (const char *s = std::getenv("RL_BENCH_STRATEGY")) return rank_main(a, s);
        std::printf("bench_dist: %d layers, hidden %d, %d x %d tokens per rank and step, %s\n",
                    a.layers, a.hidden, a.seqs, a.seq_len, a.device.c_str());
        std::printf("%-6s %-3s %16s %18s %14s\n", "parallel", "W", "tokens/s per rank",
                    "state MiB per rank", "max RSS MiB");
        std::map<std::string, double> tps, mem;
        for (const auto &[world, strategy] :
             std::vector<std::pair<int, std::string>>{{1, "dp"}, {2, "dp"}, {2, "fsdp"}}) {
            const auto ranks = run_ranks(argv, world, strategy);
            double t = 0, m = 0, rss = 0;
            for (const auto &r : ranks) {
                t += r["tokens_per_s"].get<double>() / static_cast<double>(ranks.size());
                m = std::max(m, r["state_bytes"].get<double>());
                rss = std::max(rss, r["max_rss_bytes"].get<double>());
            }
            const std::string key = strategy + std::to_string(world);
            tps[key] = t;
            mem[key] = m;
            std::printf("%-8s %-3d %16.0f %18.1f %14.1f\n",
                        world == 1 ? "single" : strategy.c_str(), world, t, m / 1048576.0,
                        rss / 1048576.0);
        }
        std::printf("ratios: per-rank tokens/s W=2 dp / W=1 %.2f, fsdp / W=1 %.2f; "
                    "per-rank state fsdp / dp %.2f\n",
                    tps["dp2"] / tps["dp1"], tps["fsdp2"] / tps["dp1"], mem["fsdp2"] / mem["dp2"]);
        return 0;
    } catch (const std::exception &e) {
        std::cerr << "bench_dist: " << e.what() << "\n";
        return 1;
    }
}
