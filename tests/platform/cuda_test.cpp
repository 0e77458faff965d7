// The platform on a GPU (ctest label `cuda`): trainer steps on CUDA against
// the CPU, engine logprobs against the trainer's on CUDA, and sleep / wake
// freeing and restoring device memory. Every test skips, saying why, where no
// CUDA device is usable.
#include "platform_util.hpp"

#include "rl/core/device.hpp"

#include "attention.hpp" // core/model/src: the model's own attention and logprob passes
#include "fused_ops.hpp"
#include "logprobs.hpp"
#include "rope.hpp"

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

// The fused kernels (fused_ops.hpp) against the eager libtorch path they
// replace, both against a float64 computation on the same values: each
// fused result is as close to float64 as the eager one (to a factor), and
// the two agree with each other. Sizes include ones that are not a multiple
// of the kernels' 8-element packs.
class FusedKernels : public Cuda {
protected:
    void SetUp() override {
        Cuda::SetUp();
        if (IsSkipped()) return;
        if (!fused::compiled()) GTEST_SKIP() << "this build has no fused CUDA kernels";
    }
    void TearDown() override { fused::set_enabled(true); }
    // f run with the fused kernels on, then off.
    template <typename F>
    static auto both(F f) {
        fused::set_enabled(true);
        auto on = f();
        fused::set_enabled(false);
        auto off = f();
        fused::set_enabled(true);
        return std::make_pair(on, off);
    }
    static at::Tensor f64(const at::Tensor &t) { return t.to(at::kDouble).cpu(); }
};

TEST_F(FusedKernels, SwigluAndItsGradientsEqualTheEagerPath) {
    for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
        for (const int64_t n : {int64_t{8} * 1000, int64_t{997}}) {
            SCOPED_TRACE(std::string(c10::toString(dtype)) + " n=" + std::to_string(n));
            at::manual_seed(n);
            const auto opts = at::TensorOptions().dtype(dtype).device(gpu);
            const at::Tensor g0 = 3 * at::randn({2, n}, opts), u0 = at::randn({2, n}, opts);
            const at::Tensor dy = at::randn({2, n}, opts);
            EXPECT_TRUE(fused::applies(g0));
            auto run = [&] {
                at::Tensor g = g0.clone().requires_grad_(true), u = u0.clone().requires_grad_(true);
                at::Tensor y = fused::applies(g) ? fused::swiglu(g, u) : at::silu(g) * u;
                y.backward(dy);
                return std::vector<at::Tensor>{f64(y), f64(g.grad()), f64(u.grad())};
            };
            const auto [on, off] = both(run);
            // float64 reference on the same (rounded) inputs.
            at::Tensor g = f64(g0).requires_grad_(true), u = f64(u0).requires_grad_(true);
            at::Tensor y = at::silu(g) * u;
            y.backward(f64(dy));
            const std::vector<at::Tensor> ref{y, g.grad(), u.grad()};
            const double tol = dtype == at::kFloat ? 1e-6 : 1e-2;
            for (size_t i = 0; i < ref.size(); ++i) {
                SCOPED_TRACE("output " + std::to_string(i));
                const double e_on = relative_difference(on[i], ref[i]);
                const double e_off = relative_difference(off[i], ref[i]);
                EXPECT_LT(e_on, tol);
                EXPECT_LE(e_on, 1.5 * e_off + 1e-7);
                EXPECT_LT(relative_difference(on[i], off[i]), tol);
            }
        }
    }
}

TEST_F(FusedKernels, RopeOfQueriesAndKeysAndTheirGradientsEqualTheEagerPath) {
    ModelConfig c;
    c.rope_theta = 1e6;
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
        for (const int64_t dim : {int64_t{128}, int64_t{20}}) { // packs of 8 and single lanes
            SCOPED_TRACE(std::string(c10::toString(dtype)) + " head_dim=" + std::to_string(dim));
            const int64_t T = 301, heads = 6, kv_heads = 2;
            at::manual_seed(7 + dim);
            const auto opts = at::TensorOptions().dtype(dtype).device(gpu);
            const at::Tensor pos =
                at::randint(4000, {T}, at::TensorOptions().dtype(at::kLong).device(gpu));
            ModelConfig cd = c;
            cd.head_dim = dim;
            const auto [cos, sin] = RotaryEmbedding(cd).cos_sin(pos, dtype);
            ASSERT_EQ(cos.size(-1), dim) << "CUDA tables are full width";
            // A strided query (every other head of a wider tensor).
            const at::Tensor q0 = at::randn({T, 2 * heads, dim}, opts).narrow(1, 0, heads);
            const at::Tensor k0 = at::randn({T, kv_heads, dim}, opts);
            const at::Tensor dq = at::randn({T, heads, dim}, opts);
            const at::Tensor dk = at::randn({T, kv_heads, dim}, opts);
            auto run = [&] {
                at::Tensor q = q0.detach().requires_grad_(true);
                at::Tensor k = k0.detach().requires_grad_(true);
                auto [yq, yk] = RotaryEmbedding::apply(q, k, cos, sin);
                ((yq * dq).sum() + (yk * dk).sum()).backward();
                return std::vector<at::Tensor>{f64(yq), f64(yk), f64(q.grad()), f64(k.grad())};
            };
            const auto [on, off] = both(run);
            at::Tensor q = f64(q0).requires_grad_(true), k = f64(k0).requires_grad_(true);
            at::Tensor yq = RotaryEmbedding::apply(q, f64(cos), f64(sin));
            at::Tensor yk = RotaryEmbedding::apply(k, f64(cos), f64(sin));
            ((yq * f64(dq)).sum() + (yk * f64(dk)).sum()).backward();
            const std::vector<at::Tensor> ref{yq, yk, q.grad(), k.grad()};
            const double tol = dtype == at::kFloat ? 1e-6 : 1e-2;
            for (size_t i = 0; i < ref.size(); ++i) {
                SCOPED_TRACE("output " + std::to_string(i));
                const double e_on = relative_difference(on[i], ref[i]);
                EXPECT_LT(e_on, tol);
                EXPECT_LE(e_on, 1.5 * relative_difference(off[i], ref[i]) + 1e-7);
                EXPECT_LT(relative_difference(on[i], off[i]), tol);
            }
        }
    }
}

// Qwen3's per-head RMSNorm of q and k then RoPE, in one kernel each way,
// against at::rms_norm then the rotation, and float64: outputs and the
// gradients of q, k and both norm weights.
TEST_F(FusedKernels, QkNormThenRopeAndItsGradientsEqualTheEagerPath) {
    ModelConfig c;
    c.rope_theta = 1e6;
    const double eps = 1e-6;
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
        for (const int64_t dim : {int64_t{128}, int64_t{64}}) {
            SCOPED_TRACE(std::string(c10::toString(dtype)) + " head_dim=" + std::to_string(dim));
            const int64_t T = 517, heads = 16, kv_heads = 8;
            at::manual_seed(11 + dim);
            const auto opts = at::TensorOptions().dtype(dtype).device(gpu);
            c.head_dim = dim;
            const at::Tensor pos =
                at::randint(4000, {T}, at::TensorOptions().dtype(at::kLong).device(gpu));
            const auto [cos, sin] = RotaryEmbedding(c).cos_sin(pos, dtype);
            const at::Tensor q0 = 2 * at::randn({T, heads, dim}, opts);
            const at::Tensor k0 = at::randn({T, kv_heads, dim}, opts);
            const at::Tensor wq0 = 1 + 0.3 * at::randn({dim}, opts);
            const at::Tensor wk0 = 1 + 0.3 * at::randn({dim}, opts);
            const at::Tensor dq = at::randn({T, heads, dim}, opts);
            const at::Tensor dk = at::randn({T, kv_heads, dim}, opts);
            ASSERT_TRUE(fused::norm_rope_applies(q0, wq0));
            auto run = [&] {
                at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
                at::Tensor wq = wq0.clone().requires_grad_(true);
                at::Tensor wk = wk0.clone().requires_grad_(true);
                at::Tensor yq, yk;
                if (fused::enabled()) {
                    std::tie(yq, yk) = fused::qk_norm_rope(q, k, wq, wk, eps, cos, sin);
                } else {
                    std::tie(yq, yk) = RotaryEmbedding::apply(
                        at::rms_norm(q, {dim}, wq, eps), at::rms_norm(k, {dim}, wk, eps), cos, sin);
                }
                ((yq * dq).sum() + (yk * dk).sum()).backward();
                return std::vector<at::Tensor>{f64(yq),       f64(yk),        f64(q.grad()),
                                               f64(k.grad()), f64(wq.grad()), f64(wk.grad())};
            };
            const auto [on, off] = both(run);
            auto norm64 = [&](const at::Tensor &x, const at::Tensor &w) {
                return x * at::rsqrt(x.pow(2).mean(-1, true) + eps) * w;
            };
            at::Tensor q = f64(q0).requires_grad_(true), k = f64(k0).requires_grad_(true);
            at::Tensor wq = f64(wq0).requires_grad_(true), wk = f64(wk0).requires_grad_(true);
            at::Tensor yq = RotaryEmbedding::apply(norm64(q, wq), f64(cos), f64(sin));
            at::Tensor yk = RotaryEmbedding::apply(norm64(k, wk), f64(cos), f64(sin));
            ((yq * f64(dq)).sum() + (yk * f64(dk)).sum()).backward();
            const std::vector<at::Tensor> ref{yq, yk, q.grad(), k.grad(), wq.grad(), wk.grad()};
            const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
            for (size_t i = 0; i < ref.size(); ++i) {
                SCOPED_TRACE("output " + std::to_string(i));
                const double e_on = relative_difference(on[i], ref[i]);
                EXPECT_LT(e_on, tol);
                EXPECT_LE(e_on, 1.5 * relative_difference(off[i], ref[i]) + 1e-6);
                EXPECT_LT(relative_difference(on[i], off[i]), tol);
            }
        }
    }
}

// Logprobs, entropy and log Z with a temperature and ignored labels, and the
// gradients of all three, through the fused statistics and d-logits kernels
// against the eager chunk passes: bfloat16 (tensor cores) and float32 models,
// a vocabulary that packs by 8 and one that does not, a last partial chunk.
TEST_F(FusedKernels, ChunkedLogprobsAndGradientsEqualTheEagerPath) {
    for (const auto dtype : {at::kBFloat16, at::kFloat}) {
        for (const int64_t vocab : {int64_t{5000}, int64_t{4999}}) {
            SCOPED_TRACE(std::string(c10::toString(dtype)) + " vocab=" + std::to_string(vocab));
            const int64_t T = 300, hidden = 128;
            at::manual_seed(vocab);
            const auto opts = at::TensorOptions().dtype(dtype).device(gpu);
            const at::Tensor h0 = at::randn({T, hidden}, opts);
            const at::Tensor w0 = 0.2 * at::randn({vocab, hidden}, opts);
            at::Tensor labels = at::randint(vocab, {T}, at::TensorOptions().dtype(at::kLong));
            labels.narrow(0, 10, 5).fill_(-100);
            labels = labels.to(gpu);
            const auto fopts = at::TensorOptions().dtype(at::kFloat).device(gpu);
            const at::Tensor g_lp = at::randn({T}, fopts), g_ent = at::randn({T}, fopts),
                             g_lse = at::randn({T}, fopts);
            auto run = [&] {
                at::Tensor h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
                ChunkedLogprobs r = chunked_logprobs(h, w, labels, 128, 0.7, true, -100, true);
                ((r.logprobs * g_lp).sum() + (r.entropy * g_ent).sum() +
                 (r.logsumexp * g_lse).sum())
                    .backward();
                return std::vector<at::Tensor>{f64(r.logprobs), f64(r.entropy), f64(r.logsumexp),
                                               f64(h.grad()), f64(w.grad())};
            };
            const auto [on, off] = both(run);
            EXPECT_EQ(on[0][12].item<double>(), 0.0) << "an ignored label's logprob is 0";
            for (size_t i = 0; i < 3; ++i) {
                SCOPED_TRACE("statistic " + std::to_string(i));
                EXPECT_LT((on[i] - off[i]).abs().max().item<double>(), 2e-4);
            }
            const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
            EXPECT_LT(relative_difference(on[3], off[3]), tol) << "d hidden";
            EXPECT_LT(relative_difference(on[4], off[4]), tol) << "d weight";
        }
    }
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
