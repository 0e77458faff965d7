// One rank of the distributed tests (tests/dist/dist_test.cpp starts several
// with the torchrun variables set). Usage:
//   dist_worker collectives
//   dist_worker train STRATEGY STEPS OUT.safetensors [--save DIR] [--resume DIR]
//     (STRATEGY dp, fsdp, dp-overlap on the tiny model; moe-dp, moe-ep on a
//     tiny Qwen3-MoE with the router losses, moe-ep = trainer.expert_parallel 2,
//     moe-ep4 = 4; a suffix -r3 replays a routing given with the batch, -ckpt
//     recomputes the layers in the backward with uneven micro-batch counts)
//   dist_worker ep-refused CASE
//   dist_worker die-before-collective
//   dist_worker mismatched-calls
// Exit status 0 on success; on failure the error goes to stderr.
#include "rl/core/dist.hpp"
#include "rl/core/error.hpp"
#include "rl/core/lora.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/safetensors.hpp"
#include "rl/core/tensor_io.hpp"
#include "rl/core/trainer.hpp"

#include "dist_batch.hpp"

#include <ATen/ATen.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <iostream>
#include <string>
#include <unistd.h>

namespace {

using rl::core::dist::Group;

void expect(bool cond, const std::string &what) {
    if (!cond) throw std::runtime_error("check failed: " + what);
}

int collectives() {
    auto g = rl::core::dist::init({});
    expect(g != nullptr, "a group for WORLD_SIZE > 1");
    const int r = g->rank(), W = g->size();
    at::Tensor t = at::full({3}, static_cast<double>(r + 1), at::kDouble);
    g->all_reduce_sum(t);
    expect(t[0].item<double>() == W * (W + 1) / 2.0, "all_reduce_sum");
    at::Tensor m = at::full({1}, static_cast<int64_t>(r * 10), at::kLong);
    g->all_reduce_max(m);
    expect(m.item<int64_t>() == (W - 1) * 10, "all_reduce_max");
    at::Tensor in = at::full({2}, static_cast<float>(r), at::kFloat);
    at::Tensor all = at::empty({2 * W}, at::kFloat);
    g->all_gather(all, in);
    for (int k = 0; k < W; ++k) expect(all[2 * k].item<float>() == k, "all_gather order");
    at::Tensor big = at::arange(2 * W, at::kFloat); // every rank: 0 .. 2W-1
    at::Tensor part = at::empty({2}, at::kFloat);
    g->reduce_scatter_sum(part, big);
    expect(part[0].item<float>() == static_cast<float>(W * 2 * r), "reduce_scatter slice");
    at::Tensor b = at::full({1}, static_cast<float>(r == 1 ? 42 : 0), at::kFloat);
    g->broadcast(b, 1);
    expect(b.item<float>() == 42, "broadcast from rank 1");
    expect(g->broadcast_bytes(r == 0 ? "hello" : "", 0) == "hello", "broadcast_bytes");
    const auto texts = g->all_gather_bytes(std::string(static_cast<size_t>(r) + 1, 'x'));
    for (int k = 0; k < W; ++k)
        expect(texts[static_cast<size_t>(k)].size() == static_cast<size_t>(k) + 1,
               "all_gather_bytes");
    // all_to_all: rank r sends k + 1 rows of value 100 r + k to rank k.
    std::vector<int64_t> in_rows, out_rows;
    std::vector<at::Tensor> parts;
    for (int k = 0; k < W; ++k) {
        in_rows.push_back(k + 1);
        out_rows.push_back(r + 1);
        parts.push_back(at::full({k + 1, 2}, static_cast<float>(100 * r + k), at::kFloat));
    }
    at::Tensor recv = at::empty({W * (r + 1), 2}, at::kFloat);
    g->all_to_all(recv, at::cat(parts), out_rows, in_rows);
    for (int k = 0; k < W; ++k)
        expect(recv[k * (r + 1)][1].item<float>() == static_cast<float>(100 * k + r),
               "all_to_all rows by source rank");
    // A subgroup of the ranks in reverse order: its own ranks and sums.
    std::vector<int> reversed;
    for (int k = W - 1; k >= 0; --k) reversed.push_back(k);
    auto sub = g->subgroup(reversed, "test/reversed");
    expect(sub->rank() == W - 1 - r && sub->size() == W, "subgroup rank");
    at::Tensor one = at::full({1}, static_cast<double>(sub->rank()), at::kDouble);
    sub->all_reduce_sum(one);
    expect(one.item<double>() == W * (W - 1) / 2.0, "subgroup all_reduce_sum");
    g->barrier();
    std::cout << "collectives ok on rank " << r << "\n";
    return 0;
}

int train(int argc, char **argv) {
    if (argc < 5) throw std::runtime_error("train STRATEGY STEPS OUT [--save DIR] [--resume DIR]");
    const std::string strategy = argv[2];
    const int steps = std::atoi(argv[3]);
    const std::string out = argv[4];
    std::string save, resume;
    for (int i = 5; i + 1 < argc; i += 2) {
        if (std::string(argv[i]) == "--save") save = argv[i + 1];
        if (std::string(argv[i]) == "--resume") resume = argv[i + 1];
    }
    rl::core::dist::Options o;
    o.timeout = std::chrono::seconds(60);
    auto g = rl::core::dist::init(o);
    const int rank = g ? g->rank() : 0, world = g ? g->size() : 1;

    const bool moe = strategy.rfind("moe-", 0) == 0;
    auto suffix = [&](const std::string &s) {
        return moe && strategy.size() > s.size() &&
               strategy.compare(strategy.size() - s.size(), s.size(), s) == 0;
    };
    const bool r3 = suffix("-r3"), ckpt = suffix("-ckpt");
    const std::string base = strategy.substr(0, strategy.size() - (r3 ? 3 : ckpt ? 5 : 0));
    auto policy = moe ? rl_dist_test::tiny_moe_policy() : rl_dist_test::tiny_policy();
    rl::core::TrainerConfig tc = rl_dist_test::trainer_config();
    if (moe) {
        // One micro-batch per call and rank: the router losses of a call are
        // then those of all its tokens (pooled over the expert group).
        tc.packing.sample_packing_sequence_len = 256;
        tc.packing.micro_batch_tokens = 256;
        tc.moe_aux_loss_coef = 0.05;
        tc.moe_z_loss_coef = 0.01;
        if (ckpt) {
            // Layers recomputed in the backward (no router losses then), and
            // small micro-batches: the ranks run different numbers of them.
            tc.activation_checkpointing = true;
            tc.packing.sample_packing_sequence_len = 32;
            tc.packing.micro_batch_tokens = 32;
            tc.moe_aux_loss_coef = 0.0;
            tc.moe_z_loss_coef = 0.0;
        }
        if (base == "moe-ep") tc.expert_parallel = 2;
        if (base == "moe-ep4") tc.expert_parallel = 4;
    }
    // "dp-overlap": dp with the gradient buckets summed during the backward.
    tc.parallel = moe ? "dp" : strategy == "dp-overlap" ? "dp" : strategy;
    tc.overlap_grad_reduce = strategy == "dp-overlap";
    if (tc.overlap_grad_reduce) tc.bucket_mb = 0.05; // many buckets: most go out mid-backward
    rl::core::Trainer trainer(policy, tc);
    expect(trainer.world_size() == world, "trainer sees the world size");
    int start = 0;
    if (!resume.empty()) start = static_cast<int>(trainer.load_checkpoint(resume).step);
    const rl::core::LossFunction loss = rl_dist_test::weighted_logprob_loss();
    std::map<std::string, double> last_metrics; // the last call's, reduced over ranks
    double loss_sum = 0;                        // every call's loss (this rank's part)
    for (int step = start; step < steps; ++step) {
        // Gradient accumulation over two calls, each this rank's share of a
        // global half-batch (uneven shares: different micro-batch counts).
        for (int half = 0; half < 2; ++half) {
            rl::core::TrainBatch b = rl_dist_test::rank_batch(step, half, rank, world);
            if (b.input_ids.numel() == 0) continue;
            if (r3) b.tensors["routed_experts"] = rl_dist_test::routed_experts_of(b.input_ids);
            b.global_tokens = rl_dist_test::global_loss_tokens(step, half);
            const rl::core::StepResult r = trainer.forward_backward(b, loss);
            loss_sum += r.loss;
            if (step + 1 == steps && half == 1) last_metrics = r.metrics;
        }
        trainer.optim_step();
    }
    if (!save.empty()) trainer.save_checkpoint(save, "{}");
    std::cerr << "rank " << rank << " state bytes " << trainer.state_bytes() << "\n";
    // The losses of all calls, summed over ranks (each rank's part is
    // normalized by the global batch).
    at::Tensor losses = at::full({1}, loss_sum, at::kDouble);
    if (g) g->all_reduce_sum(losses);
    // Whole float32 weights (fsdp gathers them for the engine anyway).
    policy->model().materialize_weights();
    if (rank == 0) {
        std::vector<std::pair<std::string, at::Tensor>> w;
        for (auto &kv : policy->model().named_weights())
            w.emplace_back(kv.first, kv.second.detach().to(at::kFloat).contiguous());
        rl::core::save_safetensors(out, w, {});
        std::ofstream m(out + ".metrics");
        m.precision(17);
        for (const auto &kv : last_metrics)
            if (!moe || kv.first.rfind("moe/", 0) != 0) // MoE router statistics: per rank
                m << kv.first << " " << kv.second << "\n";
        if (moe) m << "loss_sum " << losses.item<double>() << "\n";
        if (steps > 0) // what the Sum metric must add up to: the whole call's loss tokens
            m << "global_tokens " << rl_dist_test::global_loss_tokens(steps - 1, 1) << "\n";
    }
    if (g) g->barrier();
    return 0;
}

// dp with overlap_grad_reduce where rank 0 makes one more forward_backward
// call per step than rank 1: both must fail naming the mismatch.
int mismatched_calls() {
    rl::core::dist::Options o;
    o.timeout = std::chrono::seconds(30);
    auto g = rl::core::dist::init(o);
    auto policy = rl_dist_test::tiny_policy();
    rl::core::TrainerConfig tc = rl_dist_test::trainer_config();
    tc.overlap_grad_reduce = true;
    rl::core::Trainer trainer(policy, tc);
    const rl::core::LossFunction loss = rl_dist_test::weighted_logprob_loss();
    for (int step = 0; step < 2; ++step) {
        for (int call = 0; call < (g->rank() == 0 ? 2 : 1); ++call)
            trainer.forward_backward(rl_dist_test::rank_batch(step, call, g->rank(), 2), loss);
        trainer.optim_step();
    }
    return 0;
}

// trainer.expert_parallel refused: CASE names what is wrong.
int ep_refused(const std::string &what) {
    rl::core::dist::Options o;
    o.timeout = std::chrono::seconds(30);
    auto g = rl::core::dist::init(o);
    auto policy = what == "dense" ? rl_dist_test::tiny_policy() : rl_dist_test::tiny_moe_policy();
    rl::core::TrainerConfig tc = rl_dist_test::trainer_config();
    tc.expert_parallel = 2;
    if (what == "fsdp") tc.parallel = "fsdp";
    if (what == "experts") tc.expert_parallel = 3; // 4 experts
    if (what == "world") tc.expert_parallel = 4;   // 4 experts, 2 ranks
    if (what == "overlap") tc.overlap_grad_reduce = true;
    if (what == "forward-only") tc.forward_only = true;
    try {
        std::shared_ptr<rl::core::LoraAdapter> adapter;
        if (what == "lora") {
            rl::core::LoraConfig lc;
            lc.target_modules = {"q_proj", "v_proj"}; // LoRA on MoE models: attention only
            adapter = policy->create_adapter("a", lc);
        }
        rl::core::Trainer trainer(policy, tc, adapter);
    } catch (const rl::core::Error &e) {
        std::cerr << "refused: " << e.what() << "\n";
        return 3;
    }
    return 0;
}

} // namespace

int main(int argc, char **argv) {
    try {
        const std::string mode = argc > 1 ? argv[1] : "";
        if (mode == "collectives") return collectives();
        if (mode == "train") return train(argc, argv);
        if (mode == "mismatched-calls") return mismatched_calls();
        if (mode == "ep-refused") return ep_refused(argc > 2 ? argv[2] : "");
        if (mode == "die-before-collective") {
            rl::core::dist::Options o;
            o.timeout = std::chrono::seconds(20);
            auto g = rl::core::dist::init(o);
            if (g->rank() == 1) _exit(7); // gone without a word
            at::Tensor t = at::ones({4}, at::kFloat);
            g->all_reduce_sum(t);
            return 0;
        }
        if (mode == "rendezvous") { // only joins (error tests)
            rl::core::dist::Options o;
            o.timeout = std::chrono::milliseconds(std::atoi(argc > 2 ? argv[2] : "5000"));
            rl::core::dist::init(o);
            return 0;
        }
        std::cerr << "unknown mode '" << mode << "'\n";
        return 2;
    } catch (const std::exception &e) {
        std::cerr << "worker error: " << e.what() << "\n";
        return 1;
    }
}
