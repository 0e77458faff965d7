// Distributed training on this machine: two processes over Gloo (the workers
// are tests/dist/worker.cpp), compared with one process on the same global
// batch; resume across world sizes; faults and launch errors.
#include "rl/core/safetensors.hpp"
#include "rl/core/tensor_io.hpp"

#include "free_port.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct Exit {
    int status = -1; ///< exit code, or 128 + signal
    std::string err;
};

class Ranks {
public:
    explicit Ranks(const std::string &name) : dir_(fs::temp_directory_path() / name) {
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    ~Ranks() { fs::remove_all(dir_); }
    fs::path path(const std::string &f) const { return dir_ / f; }

    /// Starts one process per entry of `envs` (extra variables per rank) with
    /// `args`; waits at most `limit` for all of them.
    std::vector<Exit> run(const std::vector<std::string> &args,
                          const std::vector<std::map<std::string, std::string>> &envs,
                          std::chrono::seconds limit = std::chrono::seconds(240)) {
        std::vector<pid_t> pids;
        for (size_t r = 0; r < envs.size(); ++r) {
            const std::string err = (dir_ / ("rank" + std::to_string(r) + ".err")).string();
            pid_t pid = ::fork();
            if (pid == 0) {
                for (const auto &kv : envs[r]) ::setenv(kv.first.c_str(), kv.second.c_str(), 1);
                ::setenv("OMP_NUM_THREADS", "1", 1);
                FILE *f = std::freopen(err.c_str(), "w", stderr);
                (void)f;
                std::vector<char *> argv;
                std::string exe = RL_DIST_WORKER;
                argv.push_back(exe.data());
                std::vector<std::string> copy = args;
                for (auto &a : copy) argv.push_back(a.data());
                argv.push_back(nullptr);
                ::execv(exe.c_str(), argv.data());
                _exit(127);
            }
            pids.push_back(pid);
        }
        std::vector<Exit> out(pids.size());
        const auto deadline = std::chrono::steady_clock::now() + limit;
        size_t left = pids.size();
        while (left > 0) {
            for (size_t r = 0; r < pids.size(); ++r) {
                if (pids[r] == 0) continue;
                int st = 0;
                if (::waitpid(pids[r], &st, WNOHANG) == pids[r]) {
                    out[r].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                    pids[r] = 0;
                    --left;
                }
            }
            if (left > 0 && std::chrono::steady_clock::now() > deadline) {
                for (pid_t p : pids)
                    if (p != 0) ::kill(p, SIGKILL);
                ADD_FAILURE() << "ranks still running after " << limit.count() << " s";
                for (pid_t p : pids)
                    if (p != 0) ::waitpid(p, nullptr, 0);
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        for (size_t r = 0; r < out.size(); ++r) {
            std::ifstream f(dir_ / ("rank" + std::to_string(r) + ".err"));
            std::stringstream ss;
            ss << f.rdbuf();
            out[r].err = ss.str();
        }
        return out;
    }

    /// The torchrun variables of `world` ranks on this machine.
    static std::vector<std::map<std::string, std::string>> world(int world, int port = 0) {
        if (port == 0) port = rltest::free_tcp_port();
        std::vector<std::map<std::string, std::string>> envs;
        for (int r = 0; r < world; ++r)
            envs.push_back({{"RANK", std::to_string(r)},
                            {"WORLD_SIZE", std::to_string(world)},
                            {"LOCAL_RANK", std::to_string(r)},
                            {"LOCAL_WORLD_SIZE", std::to_string(world)},
                            {"MASTER_ADDR", "127.0.0.1"},
                            {"MASTER_PORT", std::to_string(port)}});
        return envs;
    }

private:
    fs::path dir_;
};

void expect_all_ok(const std::vector<Exit> &exits) {
    for (size_t r = 0; r < exits.size(); ++r)
        EXPECT_EQ(exits[r].status, 0) << "rank " << r << ":\n" << exits[r].err;
}

double max_abs_diff(const fs::path &a, const fs::path &b) {
    auto ta = rl::core::load_safetensors(a.string());
    auto tb = rl::core::load_safetensors(b.string());
    EXPECT_EQ(ta.size(), tb.size());
    double worst = 0;
    for (auto &kv : ta) {
        auto it = tb.find(kv.first);
        if (it == tb.end()) {
            ADD_FAILURE() << "missing " << kv.first;
            continue;
        }
        worst = std::max(worst, (kv.second - it->second).abs().max().item<double>());
    }
    return worst;
}

const std::vector<std::map<std::string, std::string>> kOneProcess = {{}};

// "name value" lines the worker writes beside its weights.
std::map<std::string, double> read_metrics(const std::string &path) {
    std::map<std::string, double> out;
    std::ifstream in(path);
    std::string name;
    double v = 0;
    while (in >> name >> v) out[name] = v;
    return out;
}

// Every metric of the one-process run (m1) in the other (m2), equal to 1e-5
// relative.
void expect_same_metrics(const std::map<std::string, double> &m1,
                         const std::map<std::string, double> &m2) {
    for (const auto &kv : m1) {
        ASSERT_TRUE(m2.count(kv.first)) << kv.first;
        EXPECT_NEAR(m2.at(kv.first), kv.second, 1e-5 * (1 + std::abs(kv.second))) << kv.first;
    }
}

// The weights `trained` differ from those of a run of `strategy` for 0 steps
// (written to zero.safetensors, whose path it returns): a comparison with the
// trained weights is not of two initial states.
std::string expect_moved_from_the_start(Ranks &ranks, const std::string &strategy,
                                        const std::string &trained) {
    const std::string zero = ranks.path("zero.safetensors");
    expect_all_ok(ranks.run({"train", strategy, "0", zero}, kOneProcess));
    EXPECT_GT(max_abs_diff(zero, trained), 1e-3);
    return zero;
}

// The weights (to 1e-5) and the loss_sum metric of run `b` equal run `a`'s.
void expect_same_weights_and_loss(const std::string &a, const std::string &b) {
    EXPECT_LE(max_abs_diff(a, b), 1e-5) << b;
    const auto ma = read_metrics(a + ".metrics"), mb = read_metrics(b + ".metrics");
    EXPECT_NEAR(mb.at("loss_sum"), ma.at("loss_sum"), 1e-5 * (1 + std::abs(ma.at("loss_sum"))))
        << b;
}

// Three steps of `strategy` on 2 ranks end with the weights and loss_sum of
// three steps of `single` in one process; the one-process weights' path.
std::string expect_two_ranks_as_one_process(Ranks &ranks, const std::string &single,
                                            const std::string &strategy) {
    const std::string one = ranks.path("one.safetensors"), two = ranks.path("two.safetensors");
    expect_all_ok(ranks.run({"train", single, "3", one}, kOneProcess));
    expect_all_ok(ranks.run({"train", strategy, "3", two}, Ranks::world(2)));
    expect_same_weights_and_loss(one, two);
    return one;
}

// Five training steps of strategy `one` in one process, and the same five
// interrupted after step 3 and resumed at another world size: `many` on 2
// ranks saves the checkpoint folder ck1 and one process resumes from it; one
// process saves ck2 and `many` on 2 ranks resumes from it. Both end where the
// uninterrupted run ends.
void expect_resumes_across_world_sizes(Ranks &ranks, const std::string &one,
                                       const std::string &many) {
    const std::string ck1 = ranks.path("ck1").string(), ck2 = ranks.path("ck2").string();
    const std::string full = ranks.path("full.safetensors");
    expect_all_ok(ranks.run({"train", one, "5", full}, kOneProcess));

    const std::string a = ranks.path("a.safetensors"), a2 = ranks.path("a2.safetensors");
    expect_all_ok(ranks.run({"train", many, "3", a, "--save", ck1}, Ranks::world(2)));
    expect_all_ok(ranks.run({"train", one, "5", a2, "--resume", ck1}, kOneProcess));
    EXPECT_LE(max_abs_diff(full, a2), 1e-5) << many << " on 2 ranks, then " << one;

    const std::string b = ranks.path("b.safetensors"), b2 = ranks.path("b2.safetensors");
    expect_all_ok(ranks.run({"train", one, "3", b, "--save", ck2}, kOneProcess));
    expect_all_ok(ranks.run({"train", many, "5", b2, "--resume", ck2}, Ranks::world(2)));
    EXPECT_LE(max_abs_diff(full, b2), 1e-5) << one << ", then " << many << " on 2 ranks";
}

TEST(DistCollectives, EveryOperationAgreesAcrossTwoRanks) {
    Ranks ranks("rl_dist_collectives");
    expect_all_ok(ranks.run({"collectives"}, Ranks::world(2)));
}

class DistParity : public ::testing::TestWithParam<std::string> {};

TEST_P(DistParity, FiveStepsOnTwoRanksEqualOneProcessWithUnevenMicroBatches) {
    Ranks ranks("rl_dist_parity_" + GetParam());
    const std::string one = ranks.path("one.safetensors"), two = ranks.path("two.safetensors");
    expect_all_ok(ranks.run({"train", "dp", "5", one}, kOneProcess));
    expect_all_ok(ranks.run({"train", GetParam(), "5", two}, Ranks::world(2)));
    const double d = max_abs_diff(one, two);
    EXPECT_LE(d, 1e-5);
    // The loss's metrics of the last call, one of each reduction (min, max,
    // token mean, sum), reduced over micro-batches and ranks, equal the
    // single process's.
    const auto m1 = read_metrics(one + ".metrics"), m2 = read_metrics(two + ".metrics");
    ASSERT_EQ(m1.size(), 5u);
    EXPECT_EQ(m2.at("masked_tokens"), m2.at("global_tokens")); // summed over ranks
    EXPECT_LE(m2.at("lp_min"), m2.at("lp_token_mean"));
    EXPECT_LE(m2.at("lp_token_mean"), m2.at("lp_max"));
    expect_same_metrics(m1, m2);
    // The run changed the weights (the comparison is not of two initial states).
    expect_moved_from_the_start(ranks, "dp", one);
}

INSTANTIATE_TEST_SUITE_P(Strategies, DistParity, ::testing::Values("dp", "fsdp", "dp-overlap"),
                         [](const auto &info) {
                             std::string n = info.param;
                             std::replace(n.begin(), n.end(), '-', '_');
                             return n;
                         });

TEST(DistOverlap, RanksWithDifferentNumbersOfCallsPerStepAreToldNotSummed) {
    Ranks ranks("rl_dist_overlap_mismatch");
    const auto exits = ranks.run({"mismatched-calls"}, Ranks::world(2), std::chrono::seconds(120));
    ASSERT_EQ(exits.size(), 2u);
    for (size_t r = 0; r < exits.size(); ++r) {
        EXPECT_NE(exits[r].status, 0) << "rank " << r;
        EXPECT_NE(exits[r].err.find("different numbers of forward_backward calls"),
                  std::string::npos)
            << "rank " << r << ":\n"
            << exits[r].err;
    }
}

TEST(DistResume, TwoRanksToOneAndOneToTwoEqualAnUninterruptedRun) {
    Ranks ranks("rl_dist_resume");
    // fsdp's sharded state is gathered into the checkpoint; resuming on 2
    // ranks, each takes its shards.
    expect_resumes_across_world_sizes(ranks, "dp", "fsdp");
}

TEST(DistCheckpoints, FsdpRanksWriteTheirOwnShardsAndResumeAtAnyWorldSize) {
    Ranks ranks("rl_dist_sharded");
    const std::string full = ranks.path("full.safetensors");
    expect_all_ok(ranks.run({"train", "dp", "5", full}, kOneProcess));

    // fsdp on 2 ranks writes the sharded layout: one file per rank, a
    // manifest, no gathered model folder.
    const std::string ck = ranks.path("ck").string();
    expect_all_ok(ranks.run({"train", "fsdp", "3", ranks.path("a.safetensors"), "--save", ck},
                            Ranks::world(2)));
    const fs::path step = fs::path(ck) / "step_3";
    EXPECT_TRUE(fs::exists(step / "shards" / "manifest.json"));
    EXPECT_TRUE(fs::exists(step / "shards" / "rank_0.safetensors"));
    EXPECT_TRUE(fs::exists(step / "shards" / "rank_1.safetensors"));
    EXPECT_FALSE(fs::exists(step / "model"));
    EXPECT_FALSE(fs::exists(step / "optimizer.safetensors"));
    // Each rank's file holds about half of the state.
    const auto r0 = fs::file_size(step / "shards" / "rank_0.safetensors");
    const auto r1 = fs::file_size(step / "shards" / "rank_1.safetensors");
    EXPECT_LT(r0 > r1 ? r0 - r1 : r1 - r0, r0 / 10);

    // Same world size, and one process (dp), both continue exactly.
    const std::string s2 = ranks.path("s2.safetensors"), s1 = ranks.path("s1.safetensors");
    expect_all_ok(ranks.run({"train", "fsdp", "5", s2, "--resume", ck}, Ranks::world(2)));
    EXPECT_LE(max_abs_diff(full, s2), 1e-5);
    expect_all_ok(ranks.run({"train", "dp", "5", s1, "--resume", ck}, kOneProcess));
    EXPECT_LE(max_abs_diff(full, s1), 1e-5);

    // A missing rank file is named; nothing is loaded.
    fs::remove(step / "shards" / "rank_1.safetensors");
    const auto exits =
        ranks.run({"train", "dp", "5", ranks.path("x.safetensors"), "--resume", ck}, kOneProcess);
    ASSERT_EQ(exits.size(), 1u);
    EXPECT_NE(exits[0].status, 0);
    EXPECT_NE(exits[0].err.find("rank_1.safetensors': missing"), std::string::npos) << exits[0].err;
}

// -- expert parallelism (trainer.expert_parallel) ----------------------------------

TEST(DistExpertParallel, FiveStepsWithTheExpertsSplitOverTwoRanksEqualOneProcess) {
    Ranks ranks("rl_dist_ep_parity");
    const std::string one = ranks.path("one.safetensors"), two = ranks.path("two.safetensors");
    const auto single = ranks.run({"train", "moe-dp", "5", one}, kOneProcess);
    expect_all_ok(single);
    const auto split = ranks.run({"train", "moe-ep", "5", two}, Ranks::world(2));
    expect_all_ok(split);
    EXPECT_LE(max_abs_diff(one, two), 1e-5);
    // Each rank holds the training state (gradients, AdamW moments) of half
    // of the experts.
    auto state_bytes = [](const std::string &err) {
        const size_t at = err.find("state bytes ");
        return at == std::string::npos ? -1.0 : std::stod(err.substr(at + 12));
    };
    const double whole = state_bytes(single[0].err);
    for (const auto &rank : split) {
        EXPECT_GT(state_bytes(rank.err), 0.5 * whole) << rank.err;
        EXPECT_LT(state_bytes(rank.err), 0.8 * whole) << rank.err;
    }
    // The loss (with the load-balancing and z losses of the pooled routing)
    // and the loss's metrics equal the single process's.
    const auto m1 = read_metrics(one + ".metrics"), m2 = read_metrics(two + ".metrics");
    ASSERT_TRUE(m1.count("loss_sum"));
    expect_same_metrics(m1, m2);
    // The run changed the weights, experts included.
    const std::string zero = expect_moved_from_the_start(ranks, "moe-dp", one);
    auto w0 = rl::core::load_safetensors(zero), w1 = rl::core::load_safetensors(one);
    for (const char *e : {"model.layers.0.mlp.experts.0.up_proj.weight",
                          "model.layers.1.mlp.experts.3.down_proj.weight"})
        EXPECT_GT((w0.at(e) - w1.at(e)).abs().max().item<double>(), 1e-4) << e;
}

TEST(DistExpertParallel, AReplayedRoutingTrainsAsInOneProcess) {
    Ranks ranks("rl_dist_ep_r3");
    const std::string one = expect_two_ranks_as_one_process(ranks, "moe-dp-r3", "moe-ep-r3");
    // The replay matters: the routing's own choices train other weights.
    const std::string own = ranks.path("own.safetensors");
    expect_all_ok(ranks.run({"train", "moe-dp", "3", own}, kOneProcess));
    EXPECT_GT(max_abs_diff(own, one), 1e-4);
}

TEST(DistExpertParallel, RecomputedLayersAndUnevenMicroBatchesEqualOneProcess) {
    Ranks ranks("rl_dist_ep_ckpt");
    // Rank 1 has fewer micro-batches than rank 0: it joins the exchanges of
    // rank 0's extra ones with empty turns.
    expect_two_ranks_as_one_process(ranks, "moe-dp-ckpt", "moe-ep-ckpt");
}

TEST(DistExpertParallel, ExpertGroupsCombinedWithDataParallelEqualOneProcess) {
    Ranks ranks("rl_dist_ep_dp");
    const std::string one = ranks.path("one.safetensors");
    expect_all_ok(ranks.run({"train", "moe-dp", "3", one}, kOneProcess));
    // 4 ranks: two expert groups of 2 (each expert's gradient summed over
    // the 2 ranks that hold it), then every rank one expert of its own.
    for (const std::string strategy : {"moe-ep", "moe-ep4"}) {
        const std::string four = ranks.path(strategy + ".safetensors");
        expect_all_ok(ranks.run({"train", strategy, "3", four}, Ranks::world(4)));
        expect_same_weights_and_loss(one, four);
    }
}

TEST(DistExpertParallel, CheckpointsResumeFromTwoRanksOnOneProcessAndBack) {
    Ranks ranks("rl_dist_ep_resume");
    // Expert parallel gathers the experts and their AdamW state into the
    // checkpoint.
    expect_resumes_across_world_sizes(ranks, "moe-dp", "moe-ep");
    const std::string ck1 = ranks.path("ck1").string(), ck2 = ranks.path("ck2").string();

    // Both checkpoints hold the same tensors: the HF model folder and the
    // optimizer state of every expert, as one process writes them.
    for (const char *file : {"model/model.safetensors", "optimizer.safetensors"}) {
        const auto t1 = rl::core::load_safetensors((fs::path(ck1) / "step_3" / file).string());
        const auto t2 = rl::core::load_safetensors((fs::path(ck2) / "step_3" / file).string());
        ASSERT_EQ(t1.size(), t2.size()) << file;
        for (const auto &kv : t2) {
            ASSERT_TRUE(t1.count(kv.first)) << file << ": " << kv.first;
            EXPECT_TRUE(t1.at(kv.first).sizes().equals(kv.second.sizes())) << kv.first;
        }
    }
}

TEST(DistExpertParallel, UnsupportedSettingsAreRefusedNamingTheKey) {
    Ranks ranks("rl_dist_ep_refused");
    auto refused = [&](const std::string &what, const std::string &message, int world) {
        const auto exits =
            ranks.run({"ep-refused", what}, world == 1 ? kOneProcess : Ranks::world(world));
        for (size_t r = 0; r < exits.size(); ++r) {
            EXPECT_EQ(exits[r].status, 3) << what << ", rank " << r << ":\n" << exits[r].err;
            EXPECT_NE(exits[r].err.find(message), std::string::npos)
                << what << ", rank " << r << ":\n"
                << exits[r].err;
        }
    };
    // Checked before the world size: one process says it as well.
    refused("dense", "trainer.expert_parallel (2) needs a mixture-of-experts model", 1);
    refused("experts", "trainer.expert_parallel (3) must divide num_experts (4)", 1);
    refused("fsdp", "trainer.expert_parallel (2) is not supported with trainer.parallel fsdp", 1);
    refused("overlap",
            "trainer.expert_parallel (2) is not supported with trainer.overlap_grad_reduce", 1);
    refused("lora", "trainer.expert_parallel (2) is not supported with LoRA adapters", 1);
    refused("forward-only", "trainer.expert_parallel (2) applies to a trainer that trains", 1);
    refused("moe", "trainer.expert_parallel (2) must divide the world size (1 process)", 1);
    refused("world", "trainer.expert_parallel (4) must divide the world size (2 ranks)", 2);
}

TEST(DistFaults, ARankThatDiesIsNamedByTheOthersWithinTheTimeout) {
    Ranks ranks("rl_dist_die");
    const auto t0 = std::chrono::steady_clock::now();
    const auto exits = ranks.run({"die-before-collective"}, Ranks::world(2));
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(exits[1].status, 7);
    EXPECT_NE(exits[0].status, 0);
    EXPECT_NE(exits[0].err.find("rank 1"), std::string::npos) << exits[0].err;
    EXPECT_LT(secs, 40.0); // dist.timeout is 20 s in the worker
}

TEST(DistErrors, AMasterPortInUseIsNamed) {
    Ranks ranks("rl_dist_port");
    // Hold a listening socket on the port.
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    ASSERT_EQ(::listen(s, 4), 0);
    socklen_t len = sizeof a;
    ::getsockname(s, reinterpret_cast<sockaddr *>(&a), &len);
    auto envs = Ranks::world(2, ntohs(a.sin_port));
    envs.resize(1);
    const auto exits = ranks.run({"rendezvous", "3000"}, envs);
    ::close(s);
    EXPECT_EQ(exits[0].status, 1);
    EXPECT_NE(exits[0].err.find("MASTER_PORT"), std::string::npos) << exits[0].err;
}

TEST(DistErrors, AnUnreachableMasterIsNamedAfterTheTimeout) {
    Ranks ranks("rl_dist_unreachable");
    auto envs = Ranks::world(2);
    std::vector<std::map<std::string, std::string>> only_rank1 = {envs[1]};
    const auto exits = ranks.run({"rendezvous", "2000"}, only_rank1);
    EXPECT_EQ(exits[0].status, 1);
    EXPECT_NE(exits[0].err.find("cannot reach the rendezvous master at 127.0.0.1:"),
              std::string::npos)
        << exits[0].err;
}

TEST(DistErrors, RanksThatDisagreeOnTheWorldSizeAreTold) {
    Ranks ranks("rl_dist_world");
    auto envs = Ranks::world(2);
    envs[1]["WORLD_SIZE"] = "3";
    const auto exits = ranks.run({"rendezvous", "5000"}, envs);
    EXPECT_NE(exits[1].status, 0);
    EXPECT_NE(exits[1].err.find("WORLD_SIZE differs between ranks: rank 0 has 2, rank 1 has 3"),
              std::string::npos)
        << exits[1].err;
    EXPECT_NE(exits[0].status, 0); // rank 0 does not wait forever either
}

TEST(DistErrors, ARankOutsideTheWorldIsRefused) {
    Ranks ranks("rl_dist_rank");
    auto envs = Ranks::world(2);
    envs[0]["RANK"] = "2";
    envs.resize(1);
    const auto exits = ranks.run({"rendezvous", "2000"}, envs);
    EXPECT_EQ(exits[0].status, 1);
    EXPECT_NE(exits[0].err.find("RANK=2 is not below WORLD_SIZE=2"), std::string::npos)
        << exits[0].err;
}

} // namespace
