// Forward+backward throughput of the model core on the tiny preset and a
// ~30M-parameter config, printed beside the sgemm peak measured in the same
// run (so the fraction of peak is meaningful on any machine), and the
// KV-cache decode rate the rollout engine sees, and the decoding products on
// their own: the row kernel (decode_linear.hpp) against the BLAS product.
//
//   bench_model [--benchmark_filter=...]   (RL_NUM_THREADS sets the threads)
#include "rl/core/model.hpp"
#include "rl/core/threads.hpp"
#include "rl/core/tiny.hpp"

#include "decode_linear.hpp" // core/model/src

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>

namespace {

using namespace rl::core;

double g_sgemm_peak = 0; // GFLOP/s, best sgemm seen so far in this run

void BM_Sgemm(benchmark::State &state) {
    ensure_threads();
    const int64_t n = state.range(0);
    at::Tensor a = at::randn({n, n}), b = at::randn({n, n}), c = at::empty({n, n});
    for (int i = 0; i < 3; ++i) at::mm_out(c, a, b);
    for (auto _ : state) {
        at::mm_out(c, a, b);
        benchmark::DoNotOptimize(c.data_ptr());
    }
    const double flops = 2.0 * n * n * n;
    state.counters["GFLOP/s"] =
        benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Measured once before the benchmarks so each model row can print it beside
// its own rate.
void measure_sgemm_peak() {
    ensure_threads();
    for (int64_t n : {512, 1024, 2048}) {
        at::Tensor a = at::randn({n, n}), b = at::randn({n, n}), c = at::empty({n, n});
        for (int i = 0; i < 2; ++i) at::mm_out(c, a, b);
        const int reps = n <= 512 ? 40 : n <= 1024 ? 10 : 3;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) at::mm_out(c, a, b);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        g_sgemm_peak = std::max(g_sgemm_peak, 2.0 * n * n * n * reps / s * 1e-9);
    }
}

ModelConfig config_30m() {
    return ModelConfig::parse(R"({
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": 8192, "hidden_size": 512,
        "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 64, "rope_theta": 10000.0,
        "tie_word_embeddings": true})",
                              "30M config");
}

std::shared_ptr<CausalLM> make(bool big) {
    auto m = std::make_shared<CausalLM>(big ? config_30m()
                                            : ModelConfig::parse(tiny_config_json(), "tiny"));
    m->init_weights(1);
    return m;
}

PackedBatch batch(int64_t seqs, int64_t len, int64_t vocab) {
    std::mt19937 rng(1);
    std::vector<std::vector<int64_t>> s(static_cast<size_t>(seqs));
    for (auto &x : s)
        for (int64_t i = 0; i < len; ++i) x.push_back(static_cast<int64_t>(rng() % vocab));
    return PackedBatch::from_sequences(s);
}

// args: model (0 tiny, 1 30M), sequences, tokens per sequence
void BM_ForwardBackward(benchmark::State &state) {
    auto m = make(state.range(0) == 1);
    const PackedBatch b = batch(state.range(1), state.range(2), m->config().vocab_size);
    const at::Tensor labels = at::roll(b.input_ids, -1);
    const double tokens = static_cast<double>(b.num_tokens());
    auto step = [&] {
        for (auto &p : m->parameters())
            if (p.grad().defined()) p.grad().zero_();
        TokenLogprobs lp = m->token_logprobs(b, labels, {});
        lp.logprobs.mean().backward();
    };
    step(); // warm-up
    for (auto _ : state) step();
    const double params = static_cast<double>(m->num_parameters());
    state.counters["params_M"] = params * 1e-6;
    state.counters["tokens/s"] =
        benchmark::Counter(tokens, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["GFLOP/s"] = benchmark::Counter(6.0 * params * tokens * 1e-9,
                                                   benchmark::Counter::kIsIterationInvariantRate);
    state.counters["sgemm_peak_GFLOP/s"] = g_sgemm_peak;
}

// args: slots, prompt length, generated tokens per slot (tiny model)
void BM_PrefillDecode(benchmark::State &state) {
    auto m = make(false);
    const int64_t slots = state.range(0), prompt = state.range(1), gen = state.range(2);
    std::vector<int64_t> ids(static_cast<size_t>(slots));
    for (int64_t i = 0; i < slots; ++i) ids[static_cast<size_t>(i)] = i;
    std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(slots),
                                              std::vector<int64_t>(prompt, 65));
    KVCache cache = m->make_cache(slots, prompt + gen);
    for (auto _ : state) {
        at::Tensor logits = m->prefill(cache, ids, prompts);
        for (int64_t t = 0; t < gen; ++t) {
            at::Tensor next = logits.argmax(-1);
            logits = m->decode(cache, ids, next);
        }
        benchmark::DoNotOptimize(logits.data_ptr());
    }
    state.counters["gen_tokens/s"] = benchmark::Counter(
        static_cast<double>(slots * gen), benchmark::Counter::kIsIterationInvariantRate);
}

// args: big (0: tiny, 1: the 30M config), rows, kernel (0: at::linear, 1:
// decode_linear's AVX2 path, 2: its AVX-512 path). One decoding step's products: q, k, v, o, gate,
// up and down of every layer, then the logits, each weight its own tensor (a model's weights do not
// fit in the caches, as in a real step).
void BM_DecodeProducts(benchmark::State &state) {
    ensure_threads();
    at::NoGradGuard no_grad;
    const bool big = state.range(0) != 0, rows_kernel = state.range(2) != 0;
    const row_gemm::Isa isa = state.range(2) == 2 ? row_gemm::Isa::Avx512 : row_gemm::Isa::Avx2;
    if (rows_kernel && !row_gemm::available(isa)) {
        state.SkipWithError("this CPU lacks the kernel's path");
        return;
    }
    const int64_t rows = state.range(1);
    const int64_t hidden = big ? 512 : 256, mlp = 3 * hidden, layers = big ? 8 : 4;
    const int64_t vocab = big ? 8192 : 259, kv = hidden / 2;
    std::vector<at::Tensor> weights;
    for (int64_t l = 0; l < layers; ++l)
        for (auto [out, in] : {std::pair{hidden, hidden},
                               {kv, hidden},
                               {kv, hidden},
                               {hidden, hidden},
                               {mlp, hidden},
                               {mlp, hidden},
                               {hidden, mlp}})
            weights.push_back(at::randn({out, in}) * 0.02);
    weights.push_back(at::randn({vocab, hidden}) * 0.02);
    const at::Tensor xh = at::randn({rows, hidden}), xm = at::randn({rows, mlp});
    double flops = 0;
    for (const auto &w : weights) flops += 2.0 * static_cast<double>(rows * w.numel());
    for (auto _ : state) {
        for (const auto &w : weights) {
            const at::Tensor &x = w.size(1) == hidden ? xh : xm;
            at::Tensor y = rows_kernel ? decode_linear(x, w, at::Tensor(), isa) : at::linear(x, w);
            benchmark::DoNotOptimize(y.data_ptr());
        }
    }
    state.counters["GFLOP/s"] =
        benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_Sgemm)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ForwardBackward)
    ->Args({0, 64, 40})
    ->Args({0, 16, 256})
    ->Args({1, 16, 128})
    ->ArgNames({"big", "seqs", "len"})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0)
    ->UseRealTime();
BENCHMARK(BM_PrefillDecode)
    ->Args({64, 16, 32})
    ->ArgNames({"slots", "prompt", "gen"})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0)
    ->UseRealTime();
BENCHMARK(BM_DecodeProducts)
    ->ArgsProduct({{0, 1}, {16, 64}, {0, 1, 2}})
    ->ArgNames({"big", "rows", "row_kernel"})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0)
    ->UseRealTime();

} // namespace

int main(int argc, char **argv) {
    benchmark::Initialize(&argc, argv);
    rl::core::set_num_threads(0);
    measure_sgemm_peak();
    benchmark::AddCustomContext("threads", std::to_string(at::get_num_threads()));
    benchmark::AddCustomContext("sgemm_peak_GFLOP/s", std::to_string(g_sgemm_peak));
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
