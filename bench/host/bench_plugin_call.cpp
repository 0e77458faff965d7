// Cost of one loss evaluation through the C ABI (librl -> plugin) as a function
// of the number of tokens: the per-call overhead the trainer pays per micro-batch.
#include <rl_api.h>

#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

namespace {

// A contiguous 1-D view of CPU memory.
rl_tensor_view_t view(void *data, int64_t *shape, rl_dtype_t dtype) {
    return {data, {RL_DEVICE_CPU, 0}, 1, dtype, shape, nullptr, 0};
}

void BM_PolicyLossThroughAbi(benchmark::State &state) {
    rl_runtime_desc_t desc = RL_RUNTIME_DESC_INIT;
    desc.flags = RL_RUNTIME_NO_DEFAULT_PLUGINS;
    desc.plugin_path = RL_BENCH_PLUGIN_DIR;
    desc.log_level = "off";
    rl_runtime_t *rt = nullptr;
    rl_instance_t *loss = nullptr;
    if (rl_runtime_create(&desc, &rt) != RL_OK ||
        rl_instance_create(rt, "loss", "policy_loss", "{}", &loss) != RL_OK) {
        state.SkipWithError(rl_last_error());
        rl_runtime_destroy(rt);
        return;
    }
    int64_t n = state.range(0);
    const int64_t seq = 64;
    std::mt19937_64 rng(1);
    std::normal_distribution<float> nd(0.f, 0.1f);
    std::vector<float> lp(n), old(n), adv(n), mask(n, 1.f);
    for (int64_t i = 0; i < n; ++i) {
        old[i] = -1.f + nd(rng);
        lp[i] = old[i] + nd(rng);
        adv[i] = nd(rng) * 10.f;
    }
    std::vector<int64_t> cu;
    for (int64_t s = 0; s <= n; s += seq) cu.push_back(s);
    if (cu.back() != n) cu.push_back(n);
    int64_t cu_len = static_cast<int64_t>(cu.size());
    const rl_dtype_t f32{RL_DTYPE_FLOAT, 32, 1}, i64{RL_DTYPE_INT, 64, 1};
    rl_tensor_arg_t args[] = {{"logprobs", view(lp.data(), &n, f32)},
                              {"old_logprobs", view(old.data(), &n, f32)},
                              {"advantages", view(adv.data(), &n, f32)},
                              {"loss_mask", view(mask.data(), &n, f32)}};
    rl_loss_inputs_t in{};
    in.struct_size = sizeof(in);
    in.tensors = {args, 4};
    in.cu_seqlens = view(cu.data(), &cu_len, i64);
    for (auto _ : state) {
        rl_result_t *r = nullptr;
        if (rl_loss_compute(loss, &in, 1, &r) != RL_OK) {
            state.SkipWithError(rl_last_error());
            break;
        }
        rl_result_destroy(r);
    }
    state.SetItemsProcessed(state.iterations() * n);
    rl_instance_destroy(loss);
    rl_runtime_destroy(rt);
}
BENCHMARK(BM_PolicyLossThroughAbi)
    ->RangeMultiplier(8)
    ->Range(64, 1 << 18)
    ->Unit(benchmark::kMicrosecond);

} // namespace

BENCHMARK_MAIN();
