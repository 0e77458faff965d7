// Multi-turn episodes (Engine::generate_episodes) side by side with
// single-turn generation of the same total sequence length, on the same model
// and in the same process: turns of sampled tokens with fixed observations
// between them, continued from the KV cache, against one decode of as many
// tokens. Prints both rates and their ratio (sequence tokens per second:
// sampled plus observation tokens; stop tokens off, so every sample runs to
// its length).
//
//   bench_episodes [--benchmark_filter=...]   (RL_NUM_THREADS sets the threads)
#include "rl/core/engine.hpp"
#include "rl/core/threads.hpp"
#include "rl/core/tiny.hpp"

#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>

namespace {

using namespace rl::core;

ModelConfig config_30m() {
    return ModelConfig::parse(R"({
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": 8192, "hidden_size": 512,
        "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 64, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": true})",
                              "30M config");
}

std::shared_ptr<Policy> make_policy(bool big) {
    auto m = std::make_shared<CausalLM>(big ? config_30m()
                                            : ModelConfig::parse(tiny_config_json(), "tiny"));
    m->init_weights(1);
    return std::make_shared<Policy>(m, nullptr);
}

double seconds_of(const std::function<void()> &f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// args: model (0 tiny, 1 30M), turns, samples, total tokens per sequence
void BM_EpisodesVsSingleTurn(benchmark::State &state) {
    ensure_threads();
    auto policy = make_policy(state.range(0) == 1);
    const int64_t turns = state.range(1), samples = state.range(2), total = state.range(3);
    const int64_t obs_len = 8;
    const int64_t per_turn = (total - (turns - 1) * obs_len) / turns;
    const int64_t length = per_turn * turns + (turns - 1) * obs_len; // what both sequences hold
    const std::vector<std::vector<int64_t>> prompts{std::vector<int64_t>(16, 65)};
    const std::vector<int64_t> observation(static_cast<size_t>(obs_len), 66);
    Engine engine(policy);
    SamplingParams single;
    single.n = samples;
    single.max_tokens = length;
    single.seed = 1;
    single.stop_token_ids = std::vector<int64_t>{}; // run every sample to its length
    SamplingParams turn = single;
    turn.max_tokens = per_turn;
    EpisodeOptions opt;
    opt.max_turns = turns;
    const auto on_turn = [&](const TurnEnd &) { return TurnReply{false, observation, {}}; };
    const auto run_single = [&] { benchmark::DoNotOptimize(engine.generate(prompts, single)); };
    const auto run_multi = [&] {
        benchmark::DoNotOptimize(engine.generate_episodes(prompts, turn, opt, on_turn));
    };
    run_single(); // warm-up
    run_multi();
    double t_single = 0, t_multi = 0;
    for (auto _ : state) {
        t_single += seconds_of(run_single);
        t_multi += seconds_of(run_multi);
    }
    const double tokens = static_cast<double>(samples * length) * state.iterations();
    state.counters["single_tok/s"] = tokens / t_single;
    state.counters["multi_tok/s"] = tokens / t_multi;
    state.counters["multi/single"] = t_single / t_multi;
    state.counters["seq_len"] = static_cast<double>(length);
}

BENCHMARK(BM_EpisodesVsSingleTurn)
    ->ArgNames({"big", "turns", "samples", "len"})
    ->Args({0, 4, 16, 128})
    ->Args({0, 8, 16, 128})
    ->Args({1, 4, 8, 256})
    ->Args({1, 8, 8, 256})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

} // namespace

BENCHMARK_MAIN();
