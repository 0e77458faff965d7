// The one weight swap (core/sync): what it refuses leaves every parameter as
// it was; what it accepts lands in place, in the model's dtype, all at once.
#include "rl/core/policy.hpp"
#include "rl/core/pretrained.hpp"
#include "rl/core/tiny.hpp"
#include "rl/core/weight_set.hpp"
#include "test_util.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace rl::core {
namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

// Every weight of the model plus `delta`, in float32 (what a sender sends).
Named shifted(const CausalLM &m, double delta) {
    Named out;
    for (const auto &[name, p] : m.named_weights())
        out.emplace_back(name, p.detach().to(at::kFloat) + delta);
    return out;
}

// The tiny model written under `dir` and loaded in bfloat16 (a dtype the
// senders' float32 is cast to on the swap).
std::shared_ptr<Policy> bf16_tiny_policy(const std::string &dir) {
    write_tiny_model(dir, 3);
    LoadOptions lo;
    lo.dtype = at::kBFloat16;
    return Policy::load(dir, lo);
}

std::map<std::string, at::Tensor> snapshot(const CausalLM &m) {
    std::map<std::string, at::Tensor> out;
    for (const auto &[name, p] : m.named_weights()) out[name] = p.detach().clone();
    return out;
}

void expect_unchanged(const CausalLM &m, const std::map<std::string, at::Tensor> &before) {
    for (const auto &[name, p] : m.named_weights())
        EXPECT_TRUE(at::equal(p, before.at(name))) << name << " changed after a refusal";
}

std::string refusal(const std::function<void()> &f, ErrorKind want = ErrorKind::InvalidArgument) {
    try {
        f();
    } catch (const Error &e) {
        EXPECT_EQ(e.kind(), want) << e.what();
        return e.what();
    }
    ADD_FAILURE() << "no error";
    return {};
}

TEST(WeightSet, ASwapLandsInPlaceInTheModelsDtypeAndSetsTheVersion) {
    test::TempDir dir;
    auto policy = bf16_tiny_policy(dir.path());
    const CausalLM &m = policy->model();
    std::map<std::string, const void *> storage;
    for (const auto &[name, p] : m.named_weights()) storage[name] = p.data_ptr();

    const Named next = shifted(m, 0.5);
    StagedWeights staged = StagedWeights::stage(m, next, /*complete=*/true);
    EXPECT_EQ(staged.size(), next.size());
    uint64_t sent = 0;
    for (const auto &kv : next) sent += static_cast<uint64_t>(kv.second.nbytes());
    EXPECT_EQ(staged.bytes(), sent);
    staged.swap_into(*policy, 7);

    EXPECT_EQ(policy->version(), 7);
    for (size_t i = 0; i < next.size(); ++i) {
        const auto &[name, want] = next[i];
        const at::Tensor p = m.named_weights()[i].second;
        ASSERT_EQ(m.named_weights()[i].first, name);
        EXPECT_EQ(p.scalar_type(), at::kBFloat16) << name;
        EXPECT_TRUE(at::equal(p, want.to(at::kBFloat16))) << name;
        // In place: whoever holds the parameter (the engine) sees the values.
        EXPECT_EQ(p.data_ptr(), storage.at(name)) << name;
    }
}

TEST(WeightSet, RefusalsNameTheTensorAndLeaveTheModelAsItWas) {
    test::TempDir dir;
    auto policy = bf16_tiny_policy(dir.path());
    const CausalLM &m = policy->model();
    const auto before = snapshot(m);
    const Named good = shifted(m, 0.25);
    const std::string first = good.front().first;

    Named unknown = good;
    unknown.emplace_back("model.layers.99.mlp.up_proj.weight", at::zeros({2, 2}));
    EXPECT_NE(refusal([&] {
                  StagedWeights::stage(m, unknown, true);
              }).find("tensor 'model.layers.99.mlp.up_proj.weight' is not a weight of the model"),
              std::string::npos);

    Named twice = good;
    twice.push_back(good.front());
    EXPECT_NE(refusal([&] {
                  StagedWeights::stage(m, twice, true);
              }).find("tensor '" + first + "' is given twice"),
              std::string::npos);

    Named wrong_shape = good;
    wrong_shape.front().second = at::zeros({3, 5});
    EXPECT_NE(refusal([&] {
                  StagedWeights::stage(m, wrong_shape, true);
              }).find("tensor '" + first + "' has shape [3, 5], the model's is ["),
              std::string::npos);

    Named ints = good;
    ints.front().second = ints.front().second.to(at::kLong);
    EXPECT_NE(refusal([&] {
                  StagedWeights::stage(m, ints, true);
              }).find("tensor '" + first + "' has dtype"),
              std::string::npos);

    Named missing(good.begin() + 1, good.end());
    EXPECT_NE(refusal([&] {
                  StagedWeights::stage(m, missing, true);
              }).find("the weights lack tensor '" + first + "'"),
              std::string::npos);
    // Not complete: a subset is a valid update.
    EXPECT_EQ(StagedWeights::stage(m, missing, false).size(), missing.size());

    // FLT_MAX is finite in float32 and infinite once rounded to bfloat16: the
    // check runs in the model's dtype, after everything else passed.
    Named overflow = good;
    overflow.back().second = overflow.back().second.clone();
    overflow.back().second.view({-1})[0] = FLT_MAX;
    EXPECT_NE(refusal([&] { StagedWeights::stage(m, overflow, true); }, ErrorKind::Numeric)
                  .find("tensor '" + overflow.back().first + "' holds 1 NaN or infinite value(s)"),
              std::string::npos);

    expect_unchanged(m, before);
    EXPECT_EQ(policy->version(), 0);
}

} // namespace
} // namespace rl::core
