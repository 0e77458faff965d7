// The platform on any machine (CPU): device and dtype choice, bfloat16
// training through float32 masters, activation checkpointing, the engine's KV
// budget and the batched sampler that the GPU path uses.
#include "platform_util.hpp"

#include "rl/core/device.hpp"
#include "rl/core/tensor_io.hpp"
#include "rl/core/sampling.hpp"

#include <unistd.h>

namespace rl::core::test {
namespace {

TrainerConfig trainer_config(double lr) {
    TrainerConfig c;
    c.learning_rate = lr;
    c.gradient_clip = 0;
    c.seed = 3;
    return c;
}

TEST(Device, CpuAndAutoResolveToTheCpuWithoutAGpu) {
    EXPECT_EQ(resolve_device("cpu"), at::Device(at::kCPU));
    if (cuda_device_count() == 0) {
        EXPECT_EQ(resolve_device("auto"), at::Device(at::kCPU));
    } else {
        EXPECT_EQ(resolve_device("auto"), at::Device(at::kCUDA, 0));
    }
}

TEST(Device, UnknownDevicesAndDtypesAreRefusedNamingTheKeyAndTheChoices) {
    const std::string e1 = error_of([] { resolve_device("gpu", "model.device"); });
    EXPECT_NE(e1.find("model.device: 'gpu' is not a device"), std::string::npos) << e1;
    EXPECT_NE(e1.find("auto, cpu, cuda or cuda:N"), std::string::npos) << e1;
    EXPECT_NE(error_of([] { resolve_device("cuda:x"); }).find("'cuda:x' is not a device"),
              std::string::npos);
    const std::string e2 = error_of([] { parse_dtype("fp8", "model.dtype"); });
    EXPECT_NE(e2.find("model.dtype: 'fp8' is not a dtype"), std::string::npos) << e2;
    EXPECT_EQ(parse_dtype("bfloat16"), at::kBFloat16);
}

TEST(Device, CudaWithoutAUsableGpuIsRefusedWithTheReason) {
    if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is usable here";
    const std::string e = error_of([] { resolve_device("cuda", "model.device"); });
    EXPECT_NE(e.find("model.device: 'cuda' asks for CUDA"), std::string::npos) << e;
    EXPECT_TRUE(e.find("no CUDA device is usable") != std::string::npos ||
                e.find("has no CUDA") != std::string::npos)
        << e;
}

TEST(Device, VersionSummaryNamesTheTorchVersionAndCuda) {
    const std::string s = torch_summary();
    EXPECT_EQ(s.rfind("libtorch 2.", 0), 0u) << s;
    EXPECT_NE(s.find("CUDA"), std::string::npos) << s;
}

TEST(MixedPrecision, Bfloat16ModelKeepsItsDtypeAndTracksTheFloat32Run) {
    TempDir dir;
    auto p32 = tiny_policy(dir, at::kFloat);
    auto p16 = tiny_policy(dir, at::kBFloat16);
    const auto initial = parameters_of(*p32);
    Trainer t32(p32, trainer_config(1e-3)), t16(p16, trainer_config(1e-3));
    for (int step = 0; step < 3; ++step) {
        const TrainBatch b = random_batch(4, 24, 100 + step);
        const StepResult r32 = t32.forward_backward(b, nll_loss());
        const StepResult r16 = t16.forward_backward(b, nll_loss());
        EXPECT_NEAR(r16.loss, r32.loss, 0.05) << "step " << step;
        t32.optim_step();
        t16.optim_step();
    }
    for (const auto &kv : p16->model().named_weights())
        ASSERT_EQ(kv.second.scalar_type(), at::kBFloat16) << kv.first;
    const auto after32 = parameters_of(*p32), after16 = parameters_of(*p16);
    // The two runs take the same direction: the updates (after - initial)
    // of all parameters together point the same way (cosine similarity).
    // Elementwise they may not: Adam moves a weight whose gradient is about
    // zero by +-lr either way.
    double dot = 0, n16 = 0, n32 = 0;
    for (const auto &[name, w32] : after32) {
        const at::Tensor d32 = w32 - initial.at(name), d16 = after16.at(name) - initial.at(name);
        dot += (d32 * d16).sum().item<double>();
        n32 += d32.pow(2).sum().item<double>();
        n16 += d16.pow(2).sum().item<double>();
    }
    EXPECT_GT(max_difference(after32, initial), 2e-3);
    const double cosine = dot / std::sqrt(n16 * n32);
    EXPECT_GT(cosine, 0.9) << "norms: float32 " << std::sqrt(n32) << ", bfloat16 "
                           << std::sqrt(n16);
}

TEST(MixedPrecision, CheckpointHoldsFloat32MastersAndAdamStateAndResumesExactly) {
    TempDir dir;
    auto policy = tiny_policy(dir, at::kBFloat16);
    Trainer trainer(policy, trainer_config(1e-4));
    for (int step = 0; step < 2; ++step) {
        trainer.forward_backward(random_batch(3, 20, step), nll_loss());
        trainer.optim_step();
    }
    const std::string ckpt = trainer.save_checkpoint(dir / "ckpt", "{}");
    const auto masters = load_safetensors(ckpt + "/master_weights.safetensors");
    const auto optimizer = load_safetensors(ckpt + "/optimizer.safetensors");
    const auto weights = policy->model().named_weights();
    ASSERT_EQ(masters.size(), weights.size());
    double hidden = 0; // what the masters hold below bfloat16's resolution
    for (const auto &[name, w] : weights) {
        const at::Tensor &m = masters.at(name);
        ASSERT_EQ(m.scalar_type(), at::kFloat) << name;
        ASSERT_EQ(optimizer.at("exp_avg." + name).scalar_type(), at::kFloat) << name;
        ASSERT_EQ(optimizer.at("exp_avg_sq." + name).scalar_type(), at::kFloat) << name;
        // The weights are the masters rounded to bfloat16.
        ASSERT_TRUE(at::equal(m.to(at::kBFloat16), w.detach().to(at::kCPU))) << name;
        hidden = std::max(hidden, (m - w.detach().to(at::kFloat)).abs().max().item<double>());
    }
    EXPECT_GT(hidden, 0.0);

    // A fresh bfloat16 trainer resumed from the checkpoint takes the same next step.
    TempDir dir2;
    auto resumed_policy = tiny_policy(dir2, at::kBFloat16);
    Trainer resumed(resumed_policy, trainer_config(1e-4));
    resumed.load_checkpoint(dir / "ckpt");
    const TrainBatch next = random_batch(3, 20, 99);
    trainer.forward_backward(next, nll_loss());
    trainer.optim_step();
    resumed.forward_backward(next, nll_loss());
    resumed.optim_step();
    EXPECT_EQ(max_difference(parameters_of(*policy), parameters_of(*resumed_policy)), 0.0);
}

TEST(MixedPrecision, Bfloat16LogprobsAreFloat32AndCloseToTheFloat32Model) {
    TempDir dir;
    auto p32 = tiny_policy(dir, at::kFloat);
    auto p16 = tiny_policy(dir, at::kBFloat16);
    Trainer t32(p32, trainer_config(0)), t16(p16, trainer_config(0));
    const TrainBatch b = random_batch(3, 30, 5);
    const at::Tensor lp32 = t32.forward(b, nullptr).tensors.at("logprobs");
    const at::Tensor lp16 = t16.forward(b, nullptr).tensors.at("logprobs");
    EXPECT_EQ(lp16.scalar_type(), at::kFloat);
    EXPECT_LT((lp16 - lp32).abs().max().item<double>(), 0.05);
}

TEST(ActivationCheckpointing, GivesTheSameLossGradientsAndStepAsTheFullGraph) {
    TempDir dir;
    auto plain = tiny_policy(dir, at::kFloat);
    auto recomputed = tiny_policy(dir, at::kFloat);
    TrainerConfig with = trainer_config(1e-3);
    with.activation_checkpointing = true;
    Trainer a(plain, trainer_config(1e-3)), b(recomputed, with);
    ASSERT_TRUE(recomputed->model().activation_checkpointing());
    for (int step = 0; step < 2; ++step) {
        const TrainBatch batch = random_batch(5, 28, 40 + step);
        const StepResult ra = a.forward_backward(batch, nll_loss());
        const StepResult rb = b.forward_backward(batch, nll_loss());
        EXPECT_DOUBLE_EQ(ra.loss, rb.loss);
        const OptimResult oa = a.optim_step(), ob = b.optim_step();
        EXPECT_NEAR(oa.grad_norm, ob.grad_norm, 1e-6 * oa.grad_norm);
    }
    EXPECT_LT(max_difference(parameters_of(*plain), parameters_of(*recomputed)), 1e-6);
}

class EngineBudget : public ::testing::Test {
protected:
    static double physical_memory() {
        return static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
               static_cast<double>(::sysconf(_SC_PAGE_SIZE));
    }
    std::vector<std::vector<int64_t>> prompts{{104, 105, 10}, {97, 98, 99, 10}};
};

TEST_F(EngineBudget, CallsLargerThanTheBudgetRunInWavesWithTheSameSamples) {
    TempDir dir;
    auto policy = tiny_policy(dir, at::kFloat);
    SamplingParams sp;
    sp.n = 8;
    sp.max_tokens = 12;
    sp.seed = 11;
    Engine unbounded(policy);
    const Generation ref = unbounded.generate(prompts, sp);
    // A budget of three samples at this call's capacity (longest prompt + max_tokens).
    const int64_t per_sample = KVCache::bytes_for(policy->model().config(), 1, 4 + 12, at::kFloat);
    EngineConfig ec;
    ec.kv_cache_fraction = 3.5 * static_cast<double>(per_sample) / physical_memory();
    Engine bounded(policy, ec);
    const Generation g = bounded.generate(prompts, sp);
    EXPECT_EQ(g.token_ids, ref.token_ids);
    EXPECT_EQ(g.cu_seqlens, ref.cu_seqlens);
    EXPECT_LE(bounded.cache_bytes(), bounded.kv_budget_bytes());
    EXPECT_GT(unbounded.cache_bytes(), bounded.kv_budget_bytes());
}

TEST_F(EngineBudget, OneSampleLargerThanTheBudgetIsRefusedNamingTheKey) {
    TempDir dir;
    auto policy = tiny_policy(dir, at::kFloat);
    EngineConfig ec;
    ec.kv_cache_fraction = 1e-12;
    Engine engine(policy, ec);
    SamplingParams sp;
    sp.max_tokens = 64;
    const std::string e = error_of([&] { engine.generate(prompts, sp); });
    EXPECT_NE(e.find("engine.kv_cache_fraction"), std::string::npos) << e;
    EXPECT_NE(e.find("68 tokens"), std::string::npos) << e;
    EXPECT_NE(error_of([] {
                  EngineConfig::from_json(R"({"kv_cache_fraction": 1.5})");
              }).find("'engine.kv_cache_fraction' must be in (0, 1]"),
              std::string::npos);
}

TEST_F(EngineBudget, SleepReleasesTheCacheAndWakeUpGeneratesTheSameSamples) {
    TempDir dir;
    auto policy = tiny_policy(dir, at::kFloat);
    Engine engine(policy);
    SamplingParams sp;
    sp.n = 4;
    sp.seed = 2;
    const Generation before = engine.generate(prompts, sp);
    EXPECT_GT(engine.cache_bytes(), 0);
    engine.sleep();
    EXPECT_EQ(engine.cache_bytes(), 0);
    engine.wake_up();
    EXPECT_EQ(engine.generate(prompts, sp).token_ids, before.token_ids);
}

TEST(Sampling, BatchedDrawPicksTheSameTokensAsTheHostLoop) {
    at::manual_seed(5);
    at::Tensor logits = at::randn({64, 300}) * 3;
    // Rows with a truncated support, as top-k / top-p leave them.
    logits.narrow(0, 0, 16).narrow(1, 0, 250).fill_(-std::numeric_limits<float>::infinity());
    const at::Tensor lp = at::log_softmax(logits, 1);
    std::vector<double> u;
    for (int64_t r = 0; r < 64; ++r)
        u.push_back(r == 0 ? 0.0 : r == 1 ? 1.0 - 1e-12 : (r * 0.61803) - std::floor(r * 0.61803));
    const auto host = draw_tokens(lp, u);
    const auto batched = draw_tokens_batched(lp, u);
    ASSERT_EQ(host.size(), batched.size());
    for (size_t r = 0; r < host.size(); ++r) {
        EXPECT_EQ(host[r].first, batched[r].first) << "row " << r;
        EXPECT_FLOAT_EQ(host[r].second, batched[r].second) << "row " << r;
    }
}

TEST(Sampling, Bfloat16EngineLogprobsMatchTheTrainersRecomputation) {
    TempDir dir;
    auto policy = tiny_policy(dir, at::kBFloat16);
    Trainer trainer(policy, trainer_config(0));
    Engine engine(policy);
    SamplingParams sp;
    sp.n = 3;
    sp.max_tokens = 10;
    sp.seed = 4;
    const std::vector<std::vector<int64_t>> prompts{{104, 105, 10}, {97, 98, 10}};
    const Generation g = engine.generate(prompts, sp);
    std::vector<int64_t> completion_start;
    const TrainBatch b = generation_batch(prompts, g, completion_start);
    const at::Tensor lp = trainer.forward(b, nullptr).tensors.at("logprobs");
    double worst = 0;
    for (int64_t s = 0; s < g.samples(); ++s)
        for (int64_t k = g.cu_seqlens[s]; k < g.cu_seqlens[s + 1]; ++k) {
            const int64_t t = completion_start[static_cast<size_t>(s)] + (k - g.cu_seqlens[s]);
            worst = std::max(worst, std::fabs(lp[t].item<double>() - g.logprobs[k]));
        }
    // Cached decoding and the packed forward round differently in bfloat16.
    EXPECT_LT(worst, 0.1);
}

} // namespace
} // namespace rl::core::test
