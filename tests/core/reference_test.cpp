// Logits of the reference checkpoints in tests/core/data, written by
// tests/core/make_reference.py from the transformers equations in float64.
#include "rl/core/model.hpp"
#include "rl/core/pretrained.hpp"
#include "rl/core/tensor_io.hpp"
#include "test_util.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace rl::core {
namespace {

class ReferenceLogits : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceLogits, MatchTheIndependentImplementation) {
    const std::string name = GetParam();
    auto model = load_pretrained(test::source_path("tests/core/data/" + name));
    auto expected =
        load_safetensors(test::source_path("tests/core/data/" + name + "_expected.safetensors"));
    PackedBatch batch;
    batch.input_ids = expected.at("input_ids");
    batch.cu_seqlens = expected.at("cu_seqlens");
    batch.position_ids = expected.at("position_ids");
    at::NoGradGuard no_grad;
    at::Tensor logits = model->logits(batch);
    const at::Tensor &ref = expected.at("logits");
    ASSERT_EQ(logits.sizes(), ref.sizes());
    const float scale = ref.abs().max().item<float>();
    EXPECT_GT(scale, 1.0f); // logits far from uniform: the comparison means something
    EXPECT_LT((logits - ref).abs().max().item<float>(), 2e-4f * scale) << name;
    // Incremental decoding reaches the same numbers.
    KVCache cache = model->make_cache(1, 8);
    const int64_t n = expected.at("cu_seqlens")[1].item<int64_t>();
    std::vector<int64_t> first;
    for (int64_t i = 0; i < n; ++i) first.push_back(batch.input_ids[i].item<int64_t>());
    at::Tensor l = model->prefill(cache, {0}, {{first[0]}});
    for (int64_t i = 1; i < n; ++i)
        l = model->decode(cache, {0}, at::tensor({first[i]}, at::kLong));
    EXPECT_LT((l[0] - ref[n - 1]).abs().max().item<float>(), 2e-4f * scale) << name;
}

INSTANTIATE_TEST_SUITE_P(Architectures, ReferenceLogits,
                         ::testing::Values("llama", "qwen2", "qwen3"));

} // namespace
} // namespace rl::core
