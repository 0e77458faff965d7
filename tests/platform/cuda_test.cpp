// The platform on a GPU (ctest label `cuda`): trainer steps on CUDA against
// the CPU, engine logprobs against the trainer's on CUDA, and sleep / wake
// freeing and restoring device memory. Every test skips, saying why, where no
// CUDA device is usable.
#include "platform_util.hpp"

#include "rl/core/device.hpp"

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
    const auto cpu = train(tiny_policy(dir, at::kFloat), &lc);
    const auto cuda = train(tiny_policy(dir, at::kBFloat16, gpu), &lg);
    for (size_t i = 0; i < lc.size(); ++i) EXPECT_NEAR(lg[i], lc[i], 0.05) << "step " << i;
    EXPECT_LT(max_difference(cuda, cpu), 3e-3);
}

TEST_F(Cuda, EngineLogprobsEqualTheTrainersForTheSampledTokens) {
    TempDir dir;
    auto policy = tiny_policy(dir, at::kFloat, gpu);
    Trainer trainer(policy, config());
    Engine engine(policy);
    SamplingParams sp;
    sp.n = 4;
    sp.max_tokens = 16;
    sp.seed = 9;
    const std::vector<std::vector<int64_t>> prompts{{104, 105, 10}, {97, 98, 99, 100, 10}};
    const Generation g = engine.generate(prompts, sp);
    std::vector<int64_t> start;
    const TrainBatch b = generation_batch(prompts, g, start);
    const at::Tensor lp = trainer.forward(b, nullptr).tensors.at("logprobs");
    for (int64_t s = 0; s < g.samples(); ++s)
        for (int64_t k = g.cu_seqlens[s]; k < g.cu_seqlens[s + 1]; ++k)
            EXPECT_NEAR(lp[start[static_cast<size_t>(s)] + k - g.cu_seqlens[s]].item<double>(),
                        g.logprobs[k], 2e-4)
                << "sample " << s << " token " << k - g.cu_seqlens[s];
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

} // namespace
} // namespace rl::core::test
