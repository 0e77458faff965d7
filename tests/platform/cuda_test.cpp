// The platform on a GPU (ctest label `cuda`): trainer steps on CUDA against
// the CPU, engine logprobs against the trainer's on CUDA, and sleep / wake
// freeing and restoring device memory. Every test skips, saying why, where no
// CUDA device is usable.
#include "platform_util.hpp"

#include "rl/core/device.hpp"

#include "attention.hpp" // core/model/src: the model's own attention and logprob passes
#include "logprobs.hpp"

#include <algorithm>
#include <cmath>
#include <iostream>

namespace rl::core::test {
namespace {

class Cuda : public ::testing::Test {
protected:
    void SetUp() override {
        if (cuda_device_count() == 0) GTEST_SKIP() << "no usable CUDA device: " << torch_summary();
    }
    static TrainerConfig config() {
        TrainerConfig c;
        c.learning_rate = 1e-3;
        c.seed = 3;
        return c;
    }
    // Three optimizer steps on the same batches; returns the parameters.
    static std::map<std::string, at::Tensor> train(const std::shared_ptr<Policy> &p,
                                                   std::vector<double> *losses) {
        Trainer t(p, config());
        for (int step = 0; step < 3; ++step) {
            losses->push_back(t.forward_backward(random_batch(4, 40, 20 + step), nll_loss()).loss);
            t.optim_step();
        }
        return parameters_of(*p);
    }
    // |engine logprob - trainer logprob| of every token the engine samples
    // from a fresh tiny policy on the GPU in `dtype`.
    std::vector<double> engine_trainer_gaps(at::ScalarType dtype, int64_t n, int64_t max_tokens,
                                            uint64_t seed,
                                            const std::vector<std::vector<int64_t>> &prompts) {
        SamplingParams sp;
        sp.n = n;
        sp.max_tokens = max_tokens;
        sp.seed = seed;
        TempDir dir;
        auto policy = tiny_policy(dir, dtype, gpu);
        Trainer trainer(policy, config());
        Engine engine(policy);
        const Generation g = engine.generate(prompts, sp);
        std::vector<int64_t> start;
        const TrainBatch b = generation_batch(prompts, g, start);
        const at::Tensor lp = trainer.forward(b, nullptr).tensors.at("logprobs");
        std::vector<double> gaps;
        for (int64_t s = 0; s < g.samples(); ++s)
            for (int64_t k = g.cu_seqlens[s]; k < g.cu_seqlens[s + 1]; ++k)
                gaps.push_back(std::fabs(
                    lp[start[static_cast<size_t>(s)] + k - g.cu_seqlens[s]].item<double>() -
                    g.logprobs[k]));
        return gaps;
    }
    static double relative_difference(const at::Tensor &a, const at::Tensor &b) {
        return ((a - b).norm() / b.norm()).item<double>();
    }
    const at::Device gpu{at::kCUDA, 0};
};

TEST_F(Cuda, Float32TrainerStepsMatchTheCpuTightly) {
    TempDir dir;
    std::vector<double> lc, lg;
    const auto cpu = train(tiny_policy(dir, at::kFloat), &lc);
    const auto cuda = train(tiny_policy(dir, at::kFloat, gpu), &lg);
    for (size_t i = 0; i < lc.size(); ++i) EXPECT_NEAR(lg[i], lc[i], 1e-4) << "step " << i;
    EXPECT_LT(max_difference(cuda, cpu), 1e-4);
}

TEST_F(Cuda, Bfloat16TrainerStepsFollowTheCpuFloat32Loosely) {
    TempDir dir;
    std::vector<double> lc, lg;
    const auto start = parameters_of(*tiny_policy(dir, at::kFloat));
    const auto cpu = train(tiny_policy(dir, at::kFloat), &lc);
    const auto cuda = train(tiny_policy(dir, at::kBFloat16, gpu), &lg);
    for (size_t i = 0; i < lc.size(); ++i) EXPECT_NEAR(lg[i], lc[i], 0.05) << "step " << i;
    // AdamW moves every weight by about the learning rate per step whatever
    // the size of its gradient, so a weight whose tiny gradient changes sign
    // in bfloat16 moves the other way (up to 2 x 3 steps x lr apart): compare
    // the whole update, not its worst element.
    double diff = 0, norm = 0;
    for (const auto &[name, c] : cpu) {
        const at::Tensor dc = c - start.at(name), dg = cuda.at(name) - start.at(name);
        diff += (dg - dc).pow(2).sum().item<double>();
        norm += dc.pow(2).sum().item<double>();
    }
    std::cout << "bfloat16 CUDA update vs float32 CPU update: relative difference "
              << std::sqrt(diff / norm) << ", largest weight difference "
              << max_difference(cuda, cpu) << "\n";
    EXPECT_LT(std::sqrt(diff / norm), 0.5);
    EXPECT_LT(max_difference(cuda, cpu), 2 * 3 * 1e-3 + 2e-3);
}

TEST_F(Cuda, EngineLogprobsEqualTheTrainersForTheSampledTokens) {
    const std::vector<double> gaps =
        engine_trainer_gaps(at::kFloat, 4, 16, 9, {{104, 105, 10}, {97, 98, 99, 100, 10}});
    ASSERT_FALSE(gaps.empty());
    for (size_t i = 0; i < gaps.size(); ++i) EXPECT_LT(gaps[i], 2e-4) << "token " << i;
}

TEST_F(Cuda, SleepGivesTheKvMemoryBackAndWakeUpTakesItAgain) {
    TempDir dir;
    auto policy = tiny_policy(dir, at::kBFloat16, gpu);
    Engine engine(policy);
    SamplingParams sp;
    sp.n = 256;
    sp.max_tokens = 512;
    sp.seed = 1;
    engine.generate({{104, 105, 10}, {97, 98, 10}}, sp);
    const int64_t cache = engine.cache_bytes();
    ASSERT_GT(cache, int64_t{256} << 20) << "the test needs a cache of a few hundred MiB";
    const DeviceMemory awake = device_memory(gpu);
    engine.sleep();
    const DeviceMemory asleep = device_memory(gpu);
    EXPECT_EQ(engine.cache_bytes(), 0);
    EXPECT_LE(asleep.reserved_bytes, awake.reserved_bytes - cache);
    EXPECT_GE(asleep.free_bytes, awake.free_bytes + cache * 9 / 10);
    engine.wake_up();
    EXPECT_EQ(engine.cache_bytes(), cache);
    EXPECT_GE(device_memory(gpu).reserved_bytes, asleep.reserved_bytes + cache);
}

// Packed sequences of different lengths (one of a single token) with grouped
// key/value heads: the variable-length flash kernel gives the padded
// attention's output and gradients.
TEST_F(Cuda, VarlenFlashAttentionEqualsPaddedAttentionAndItsGradients) {
    if (!varlen_attention_available(gpu, at::kBFloat16, 64))
        GTEST_SKIP() << "no variable-length flash kernel on this GPU / libtorch";
    const std::vector<int64_t> cu{0, 37, 42, 106, 107, 127, 191};
    const int64_t T = cu.back(), heads = 8, kv_heads = 2, dim = 64;
    at::manual_seed(4);
    const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(gpu);
    const at::Tensor q0 = at::randn({T, heads, dim}, opts),
                     k0 = at::randn({T, kv_heads, dim}, opts);
    const at::Tensor v0 = at::randn({T, kv_heads, dim}, opts),
                     g = at::randn({T, heads * dim}, opts);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    struct Run {
        at::Tensor out, dq, dk, dv;
    };
    auto run = [&](bool varlen) {
        at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
        at::Tensor v = v0.clone().requires_grad_(true);
        const PackedAttentionPlan plan = plan_packed_attention(cu, heads, gpu, varlen);
        EXPECT_EQ(plan.varlen, varlen);
        at::Tensor out = packed_attention(q, k, v, plan, scale);
        (out.to(at::kFloat) * g.to(at::kFloat)).sum().backward();
        return Run{out.to(at::kFloat), q.grad().to(at::kFloat), k.grad().to(at::kFloat),
                   v.grad().to(at::kFloat)};
    };
    const Run flash = run(true), padded = run(false);
    ASSERT_EQ(flash.out.sizes(), padded.out.sizes());
    EXPECT_LT(relative_difference(flash.out, padded.out), 1e-2);
    EXPECT_LT(relative_difference(flash.dq, padded.dq), 2e-2);
    EXPECT_LT(relative_difference(flash.dk, padded.dk), 2e-2);
    EXPECT_LT(relative_difference(flash.dv, padded.dv), 2e-2);
    // The single-token sequence (token 106) sees only itself: its output is
    // its own value row (heads 0-3 read kv head 0, 4-7 kv head 1).
    const at::Tensor row = flash.out[106].view({heads, dim});
    EXPECT_LT((row[0] - v0[106][0].to(at::kFloat)).abs().max().item<double>(), 1e-2);
    EXPECT_LT((row[7] - v0[106][1].to(at::kFloat)).abs().max().item<double>(), 1e-2);
}

// The output projection of a bfloat16 model on the tensor cores (bfloat16
// operands, float32 accumulation and logits): logprobs, entropy and both
// gradients follow a float32 computation on the same (bfloat16) values.
TEST_F(Cuda, Bfloat16LogprobsOnTensorCoresFollowFloat32) {
    const int64_t T = 300, hidden = 128, vocab = 5000;
    at::manual_seed(5);
    const at::Tensor h0 = at::randn({T, hidden}).to(at::kBFloat16);
    const at::Tensor w0 = (0.2 * at::randn({vocab, hidden})).to(at::kBFloat16);
    const at::Tensor labels = at::randint(vocab, {T}, at::kLong);
    const at::Tensor g_lp = at::randn({T}), g_ent = at::randn({T});
    struct Run {
        at::Tensor lp, ent, dh, dw;
    };
    auto run = [&](at::ScalarType dtype, at::Device device) {
        at::Tensor h = h0.to(dtype).to(device).requires_grad_(true);
        at::Tensor w = w0.to(dtype).to(device).requires_grad_(true);
        ChunkedLogprobs r = chunked_logprobs(h, w, labels.to(device), 128, 1.0, true, -100);
        at::Tensor obj =
            (r.logprobs * g_lp.to(device)).sum() + (r.entropy * g_ent.to(device)).sum();
        obj.backward();
        return Run{r.logprobs.cpu(), r.entropy.cpu(), h.grad().to(at::kFloat).cpu(),
                   w.grad().to(at::kFloat).cpu()};
    };
    const Run tc = run(at::kBFloat16, gpu), ref = run(at::kFloat, at::kCPU);
    EXPECT_EQ(tc.lp.scalar_type(), at::kFloat);
    EXPECT_LT((tc.lp - ref.lp).abs().max().item<double>(), 1e-3);
    EXPECT_LT((tc.ent - ref.ent).abs().max().item<double>(), 1e-3);
    EXPECT_LT(relative_difference(tc.dh, ref.dh), 1e-2);
    EXPECT_LT(relative_difference(tc.dw, ref.dw), 1e-2);
}

// A bfloat16 policy on CUDA: the engine's sampling logprobs (KV cache,
// decode kernels) and the trainer's (packed flash attention, chunked
// logprobs) of the same sampled tokens agree to bfloat16 precision.
TEST_F(Cuda, Bfloat16EngineLogprobsFollowTheTrainers) {
    const std::vector<double> gaps =
        engine_trainer_gaps(at::kBFloat16, 8, 24, 11, {{104, 105, 10}, {97, 98, 99, 100, 101, 10}});
    ASSERT_FALSE(gaps.empty());
    double sum = 0, worst = 0;
    for (double d : gaps) {
        sum += d;
        worst = std::max(worst, d);
    }
    const double mean = sum / static_cast<double>(gaps.size());
    std::cout << "bfloat16 engine vs trainer logprobs over " << gaps.size()
              << " tokens: mean |diff| " << mean << ", max " << worst << "\n";
    EXPECT_LT(mean, 0.03);
    EXPECT_LT(worst, 0.25);
}

} // namespace
} // namespace rl::core::test
