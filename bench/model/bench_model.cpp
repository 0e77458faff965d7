// Forward+backward throughput of the model core on the tiny preset and a
// ~30M-parameter config, printed beside the sgemm peak measured in the same
// run (so the fraction of peak is meaningful on any machine), and the
// KV-cache decode rate the rollout engine sees.
//
//   bench_model [--benchmark_filter=...]   (RL_NUM_THREADS sets the threads)
#include "rl/core/model.hpp"
#include "rl/core/threads.hpp"
#include "rl/core/tiny.hpp"

#include <ATen/ATen.h>
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
