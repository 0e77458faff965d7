// bench_train_decode: one model shape, measured the way bench/compare/compare.py
// measures transformers on the same shape. Prints one JSON object:
//   train: optimizer steps (forward, loss, backward, AdamW) over `seqs`
//          sequences of `seq_len` random tokens -> tokens/s;
//   decode: the rollout engine generating `new_tokens` tokens for `batch`
//          prompts of `prompt_len` tokens (no early stop) -> new tokens/s.
// Usage: bench_train_decode '{"hidden": 1024, "layers": 28, ...}'
#include "rl/core/device.hpp"
#include "rl/core/engine.hpp"
#include "rl/core/model.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/threads.hpp"
#include "rl/core/trainer.hpp"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#ifdef RL_TORCH_HAS_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

using nlohmann::json;
using namespace rl::core;

namespace {

void synchronize(const at::Device &d) {
#ifdef RL_TORCH_HAS_CUDA
    if (d.is_cuda()) c10::cuda::device_synchronize();
#else
    (void)d;
#endif
}

// CPU time of the whole process (every thread), for comparisons on a loaded
// machine where wall time mostly measures the other processes.
double process_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Op profile ("profile": true): self time of every ATen operator (its time
// less that of the operators it calls), summed by name over the measured
// repetitions, from RecordFunction callbacks on this process's threads.
struct OpClock {
    std::chrono::steady_clock::time_point start;
    double children = 0;
};
thread_local std::vector<OpClock> op_stack;
std::mutex op_mu;
std::map<std::string, std::pair<double, int64_t>> op_self; // name -> (seconds, calls)
bool op_recording = false;

std::unique_ptr<at::ObserverContext> op_start(const at::RecordFunction &) {
    op_stack.push_back({std::chrono::steady_clock::now(), 0});
    return nullptr;
}

void op_end(const at::RecordFunction &fn, at::ObserverContext *) {
    if (op_stack.empty()) return;
    const OpClock c = op_stack.back();
    op_stack.pop_back();
    const double total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - c.start).count();
    if (!op_stack.empty()) op_stack.back().children += total;
    if (!op_recording) return;
    std::lock_guard<std::mutex> lk(op_mu);
    auto &e = op_self[fn.name()];
    e.first += total - c.children;
    e.second += 1;
}

// The operators by self time, largest first, with the phase's wall time.
json op_report(double wall) {
    std::vector<std::pair<std::string, std::pair<double, int64_t>>> v(op_self.begin(),
                                                                      op_self.end());
    std::sort(v.begin(), v.end(),
              [](const auto &a, const auto &b) { return a.second.first > b.second.first; });
    json ops = json::array();
    double in_ops = 0;
    for (const auto &[name, e] : v) in_ops += e.first;
    for (size_t i = 0; i < v.size() && i < 25; ++i)
        ops.push_back({{"op", v[i].first},
                       {"ms", 1e3 * v[i].second.first},
                       {"calls", v[i].second.second},
                       {"share", v[i].second.first / wall}});
    op_self.clear();
    return {{"wall_ms", 1e3 * wall}, {"ops_ms", 1e3 * in_ops}, {"top", ops}};
}

// Matrix products of one training step on the CPU: the time and FLOPs of
// every mm / addmm / bmm / baddbmm (2 M K N each, from the input shapes),
// and the largest one, whose plain sgemm the report measures beside them.
struct MatmulShape {
    int64_t m = 0, k = 0, n = 0;
    double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(k) * n; }
};
struct MatmulClock {
    std::chrono::steady_clock::time_point start;
    double flops = 0;
};
thread_local std::vector<MatmulClock> mm_stack;
std::mutex mm_mu;
double mm_seconds = 0, mm_flops = 0;
MatmulShape mm_largest;

bool is_matmul(const char *name) {
    static const std::set<std::string> names{"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm",
                                             "aten::baddbmm"};
    return names.count(name) != 0;
}

std::unique_ptr<at::ObserverContext> mm_start(const at::RecordFunction &fn) {
    if (!is_matmul(fn.name())) return nullptr;
    const auto inputs = fn.inputs();
    // mm(a, b); addmm(self, a, b); bmm(a, b); baddbmm(self, a, b).
    const size_t first = std::string(fn.name()).find("add") != std::string::npos ? 1 : 0;
    MatmulShape s;
    double batch = 1;
    if (inputs.size() >= first + 2 && inputs[first].isTensor() && inputs[first + 1].isTensor()) {
        const at::Tensor &a = inputs[first].toTensor(), &b = inputs[first + 1].toTensor();
        if (a.dim() == 3) batch = static_cast<double>(a.size(0));
        s = {a.size(a.dim() - 2), a.size(a.dim() - 1), b.size(b.dim() - 1)};
    }
    mm_stack.push_back({std::chrono::steady_clock::now(), batch * s.flops()});
    std::lock_guard<std::mutex> lk(mm_mu);
    if (batch == 1 && s.flops() > mm_largest.flops()) mm_largest = s;
    return nullptr;
}

void mm_end(const at::RecordFunction &fn, at::ObserverContext *) {
    if (!is_matmul(fn.name()) || mm_stack.empty()) return;
    const MatmulClock c = mm_stack.back();
    mm_stack.pop_back();
    const double dt =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - c.start).count();
    std::lock_guard<std::mutex> lk(mm_mu);
    // A product inside another (addmm calling mm) is counted once, outermost.
    if (!mm_stack.empty()) return;
    mm_seconds += dt;
    mm_flops += c.flops;
}

// GFLOP/s of a plain float32 at::mm of shape s (contiguous operands), the
// median of a few after one warm-up.
double sgemm_rate(const MatmulShape &s) {
    const at::Tensor a = at::randn({s.m, s.k}), b = at::randn({s.k, s.n});
    std::vector<double> rates;
    for (int i = 0; i < 6; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        at::Tensor c = at::mm(a, b);
        const double dt = seconds_since(t0);
        if (i > 0) rates.push_back(s.flops() / dt * 1e-9);
    }
    std::sort(rates.begin(), rates.end());
    return rates[rates.size() / 2];
}

// GPU profile ("profile": true on CUDA): time of every CUDA kernel, summed by
// kernel name over the measured repetitions, from libtorch's Kineto profiler
// (the CPU-side RecordFunction clocks above only see launches there).
namespace kprof = torch::autograd::profiler;
namespace pimpl = torch::profiler::impl;

void gpu_profile_start() {
    const std::set<pimpl::ActivityType> acts{pimpl::ActivityType::CPU, pimpl::ActivityType::CUDA};
    const pimpl::ProfilerConfig cfg(pimpl::ProfilerState::KINETO);
    kprof::prepareProfiler(cfg, acts);
    kprof::enableProfiler(cfg, acts);
}

json gpu_profile_stop(double wall) {
    std::unique_ptr<kprof::ProfilerResult> r = kprof::disableProfiler();
    std::map<std::string, std::pair<double, int64_t>> by_kernel;
    double busy = 0;
    for (const auto &e : r->events()) {
        if (e.deviceType() != c10::DeviceType::CUDA) continue;
        std::string name = e.name();
        if (name.rfind("void ", 0) == 0) name = name.substr(5);
        if (name.size() > 140) name = name.substr(0, 140);
        const double sec = 1e-9 * static_cast<double>(e.durationNs());
        busy += sec;
        auto &k = by_kernel[name];
        k.first += sec;
        k.second += 1;
    }
    std::vector<std::pair<std::string, std::pair<double, int64_t>>> v(by_kernel.begin(),
                                                                      by_kernel.end());
    std::sort(v.begin(), v.end(),
              [](const auto &a, const auto &b) { return a.second.first > b.second.first; });
    json top = json::array();
    for (size_t i = 0; i < v.size() && i < 25; ++i)
        top.push_back({{"kernel", v[i].first},
                       {"ms", 1e3 * v[i].second.first},
                       {"calls", v[i].second.second}});
    return {{"wall_ms", 1e3 * wall}, {"gpu_busy_ms", 1e3 * busy}, {"top", top}};
}

LossFunction mean_nll() {
    LossFunction f;
    f.name = "loss 'nll'";
    f.signature.required = {"logprobs"};
    f.signature.differentiable = {"logprobs"};
    f.compute = [](const LossCall &call) {
        LossResult r;
        const at::Tensor &lp = call.tensors.at(0).second;
        r.loss = -lp.sum().item<double>() / call.global_tokens;
        r.grads["logprobs"] = at::full_like(lp, -1.0 / call.global_tokens);
        return r;
    };
    return f;
}

} // namespace

int main(int argc, char **argv) {
    try {
        const json a = json::parse(argc > 1 ? argv[1] : "{}");
        auto get = [&](const char *k, auto fallback) { return a.value(k, fallback); };
        ModelConfig c;
        c.model_type = "qwen3";
        c.architecture = Architecture::Qwen3;
        c.hidden_size = get("hidden", int64_t{256});
        c.num_hidden_layers = get("layers", int64_t{4});
        c.num_attention_heads = get("heads", int64_t{4});
        c.num_key_value_heads = get("kv_heads", int64_t{2});
        c.head_dim = get("head_dim", int64_t{64});
        c.intermediate_size = get("mlp", int64_t{768});
        c.vocab_size = get("vocab", int64_t{259});
        c.max_position_embeddings = 32768;
        c.rope_theta = 1e6;
        c.tie_word_embeddings = true;
        c.qk_norm = true;
        // A Qwen3-MoE shape: every layer sparse (docs/model.md).
        if (get("experts", int64_t{0}) > 0) {
            c.model_type = "qwen3_moe";
            c.architecture = Architecture::Qwen3Moe;
            c.num_experts = get("experts", int64_t{0});
            c.num_experts_per_tok = get("top_k", int64_t{2});
            c.moe_intermediate_size = get("moe_mlp", int64_t{192});
            c.norm_topk_prob = true;
        }
        const at::Device device = resolve_device(get("device", std::string("cpu")), "device");
        const at::ScalarType dtype = parse_dtype(get("dtype", std::string("float32")), "dtype");
        set_num_threads(static_cast<int>(get("threads", int64_t{0})));
        const bool profile = get("profile", false);
        if (profile)
            at::addGlobalCallback(at::RecordFunctionCallback(&op_start, &op_end)
                                      .needsInputs(false)
                                      .scopes({at::RecordScope::FUNCTION}));

        auto model = std::make_shared<CausalLM>(c, ModelOptions{dtype, device});
        model->init_weights(1);
        auto policy = std::make_shared<Policy>(model, nullptr);
        json out = {{"params", model->num_parameters()},
                    {"device", device.str()},
                    {"torch", torch_version()}};

        const int64_t seqs = get("seqs", int64_t{16}), len = get("seq_len", int64_t{128});
        const int64_t steps = get("steps", int64_t{3}), warmup = get("warmup", int64_t{1});
        if (steps > 0) {
            TrainerConfig tc;
            tc.learning_rate = 1e-5;
            tc.packing.micro_batch_tokens = get("micro_batch_tokens", int64_t{16384});
            tc.packing.sample_packing_sequence_len = std::max<int64_t>(len, 2048);
            tc.activation_checkpointing = get("activation_checkpointing", false);
            Trainer trainer(policy, tc);
            std::mt19937_64 rng(5);
            TrainBatch b;
            std::vector<int64_t> ids(static_cast<size_t>(seqs * len));
            for (auto &t : ids)
                t = static_cast<int64_t>(rng() % static_cast<uint64_t>(c.vocab_size));
            b.input_ids = at::tensor(ids, at::kLong);
            for (int64_t s = 0; s <= seqs; ++s) b.cu_seqlens.push_back(s * len);
            const LossFunction loss = mean_nll();
            double t = 0, t_fb = 0, cpu = 0;
            for (int64_t i = 0; i < warmup + steps; ++i) {
                synchronize(device);
                op_recording = profile && i >= warmup && !device.is_cuda();
                if (profile && device.is_cuda() && i == warmup) gpu_profile_start();
                const auto t0 = std::chrono::steady_clock::now();
                const double c0 = process_cpu_seconds();
                trainer.forward_backward(b, loss);
                synchronize(device);
                const double fb = seconds_since(t0);
                trainer.optim_step();
                synchronize(device);
                if (i >= warmup) {
                    t += seconds_since(t0);
                    t_fb += fb;
                    cpu += process_cpu_seconds() - c0;
                }
                op_recording = false;
            }
            if (!device.is_cuda() && !profile) {
                // One more step with the matrix products clocked (their time and
                // FLOPs), then a plain sgemm of the largest of them.
                auto handle = at::addGlobalCallback(at::RecordFunctionCallback(&mm_start, &mm_end)
                                                        .needsInputs(true)
                                                        .scopes({at::RecordScope::FUNCTION}));
                const auto t0 = std::chrono::steady_clock::now();
                trainer.forward_backward(b, loss);
                trainer.optim_step();
                const double step = seconds_since(t0);
                at::removeCallback(handle);
                if (mm_seconds > 0) {
                    out["train_matmul_share"] = mm_seconds / step;
                    out["train_matmul_gflops"] = mm_flops / mm_seconds * 1e-9;
                    out["train_matmul_gflop"] = mm_flops * 1e-9;
                    out["train_matmul_largest"] = {mm_largest.m, mm_largest.k, mm_largest.n};
                    out["train_sgemm_largest_gflops"] = sgemm_rate(mm_largest);
                }
            }
            out["train_cpu_s"] = cpu / static_cast<double>(steps);
            if (profile && device.is_cuda()) out["train_gpu_profile"] = gpu_profile_stop(t);
            if (profile && !device.is_cuda()) out["train_profile"] = op_report(t);
            out["train_step_s"] = t / static_cast<double>(steps);
            // Where the step goes: forward + backward, then the optimizer.
            out["train_forward_backward_s"] = t_fb / static_cast<double>(steps);
            out["train_optim_s"] = (t - t_fb) / static_cast<double>(steps);
            out["train_tokens_per_s"] = static_cast<double>(seqs * len * steps) / t;
        }

        const int64_t batch = get("batch", int64_t{16}), prompt = get("prompt_len", int64_t{16});
        const int64_t new_tokens = get("new_tokens", int64_t{32});
        if (new_tokens > 0) {
            // The co-located engine reads the trainer's weights in place:
            // on CUDA, what it holds beyond its KV cache is measured.
            const DeviceMemory before = device_memory(device);
            Engine engine(policy);
            SamplingParams sp;
            sp.max_tokens = new_tokens;
            sp.stop_token_ids =
                std::vector<int64_t>{}; // no early stop: every sample runs to max_tokens
            sp.seed = 3;
            std::mt19937_64 rng(6);
            std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(batch));
            for (auto &p : prompts)
                for (int64_t i = 0; i < prompt; ++i)
                    p.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(c.vocab_size)));
            double t = 0, cpu = 0;
            const int64_t reps = get("decode_reps", int64_t{2});
            for (int64_t i = 0; i <= reps; ++i) {
                synchronize(device);
                op_recording = profile && i > 0 && !device.is_cuda();
                if (profile && device.is_cuda() && i == 1) gpu_profile_start();
                const auto t0 = std::chrono::steady_clock::now();
                const double c0 = process_cpu_seconds();
                const Generation g = engine.generate(prompts, sp);
                synchronize(device);
                if (i > 0) {
                    t += seconds_since(t0);
                    cpu += process_cpu_seconds() - c0;
                }
                op_recording = false;
                // FNV-1a of the sampled tokens: a change that must keep the
                // samples of a seed can be checked against the figure before it.
                uint64_t h = 1469598103934665603ULL;
                for (int64_t tok : g.token_ids)
                    h = (h ^ static_cast<uint64_t>(tok)) * 1099511628211ULL;
                out["decode_tokens_fnv"] = std::to_string(h);
            }
            if (device.is_cuda()) {
                int64_t weight_bytes = 0;
                for (const auto &p : model->parameters())
                    weight_bytes += p.numel() * p.element_size();
                out["weight_bytes"] = weight_bytes;
                out["engine_cache_bytes"] = engine.cache_bytes();
                out["engine_other_bytes"] = device_memory(device).allocated_bytes -
                                            before.allocated_bytes - engine.cache_bytes();
            }
            if (profile && device.is_cuda()) out["decode_gpu_profile"] = gpu_profile_stop(t);
            if (profile && !device.is_cuda()) out["decode_profile"] = op_report(t);
            out["decode_s"] = t / static_cast<double>(reps);
            out["decode_cpu_s"] = cpu / static_cast<double>(reps);
            out["decode_tokens_per_s"] = static_cast<double>(batch * new_tokens * reps) / t;
        }
        std::cout << out.dump() << std::endl;
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "bench_train_decode: %s\n", e.what());
        return 1;
    }
}
