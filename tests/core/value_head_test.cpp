// The value head's gradient: the trainer turns a loss's d loss / d values
// into gradients of the head and of the shared trunk, and they equal central
// finite differences of the loss the trainer reports.
#include "rl/core/policy.hpp"
#include "rl/core/tiny.hpp"
#include "rl/core/trainer.hpp"
#include "test_util.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace rl::core {
namespace {

// L = sum_t c_t v_t + 1/2 sum_t v_t^2 over all positions, d L / d v_t = c_t + v_t.
LossFunction quadratic_value_loss() {
    LossFunction f;
    f.name = "test quadratic value loss";
    f.signature = {{"values"}, {}, {"values"}};
    f.compute = [](const LossCall &call) {
        at::Tensor v;
        for (const auto &kv : call.tensors)
            if (kv.first == "values") v = kv.second;
        const int64_t n = v.size(0);
        at::Tensor c = at::arange(n, at::kDouble).mul(0.37).sin();
        LossResult r;
        r.loss = (c * v).sum().item<double>() + 0.5 * (v * v).sum().item<double>();
        if (call.want_grads) r.grads["values"] = c + v;
        return r;
    };
    return f;
}

TrainBatch batch_of(int64_t vocab) {
    std::mt19937 rng(5);
    std::uniform_int_distribution<int64_t> tok(0, vocab - 1);
    std::vector<int64_t> ids;
    TrainBatch b;
    b.cu_seqlens = {0};
    for (int64_t len : {7, 5, 9}) {
        for (int64_t t = 0; t < len; ++t) ids.push_back(tok(rng));
        b.cu_seqlens.push_back(static_cast<int64_t>(ids.size()));
    }
    b.input_ids = at::tensor(ids, at::kLong);
    return b;
}

TEST(ValueHeadGradient, ReachesTheHeadAndTheTrunkAsFiniteDifferences) {
    test::TempDir dir;
    write_tiny_model(dir.path(), 3);
    LoadOptions lo;
    lo.value_head = true;
    lo.value_head_seed = 4;
    auto policy = Policy::load(dir.path(), lo);
    ASSERT_NE(policy->value_head(), nullptr);
    ValueHead &head = *policy->value_head();
    {
        // Larger head weights than the init, so the trunk's gradient is large
        // enough for a float32 finite difference.
        at::NoGradGuard g;
        head.weight.mul_(25.0);
        head.bias.fill_(0.3);
    }
    Trainer trainer(policy, TrainerConfig{});
    const LossFunction loss = quadratic_value_loss();
    const TrainBatch batch = batch_of(policy->model().config().vocab_size);

    trainer.zero_grad();
    trainer.forward_backward(batch, loss);
    const at::Tensor gw = head.weight.grad().clone(), gb = head.bias.grad().clone();
    ASSERT_TRUE(gw.defined() && gb.defined());
    at::Tensor trunk;
    for (auto &kv : policy->model().named_weights())
        if (kv.first == "model.norm.weight") trunk = kv.second;
    ASSERT_TRUE(trunk.defined());
    ASSERT_TRUE(trunk.grad().defined()) << "the value gradient did not reach the trunk";
    const at::Tensor gt = trunk.grad().clone();

    auto loss_at = [&](const at::Tensor &p, int64_t i, double delta) {
        at::NoGradGuard g;
        const float old = p.view({-1})[i].item<float>();
        p.view({-1})[i].fill_(old + delta);
        const double l = trainer.forward(batch, &loss).loss;
        p.view({-1})[i].fill_(old);
        return l;
    };
    const double eps = 1e-2;
    auto check = [&](const at::Tensor &p, const at::Tensor &grad, int64_t i, const char *what) {
        const double fd = (loss_at(p, i, eps) - loss_at(p, i, -eps)) / (2 * eps);
        const double an = grad.view({-1})[i].item<double>();
        EXPECT_NEAR(an, fd, 2e-2 * std::max(1.0, std::fabs(fd))) << what << "[" << i << "]";
    };
    check(head.bias, gb, 0, "value_head.bias");
    for (int64_t i : {0, 100, 255}) check(head.weight, gw, i, "value_head.weight");
    EXPECT_GT(gt.abs().sum().item<double>(), 0.0);
    for (int64_t i : {3, 200}) check(trunk, gt, i, "model.norm.weight");
}

} // namespace
} // namespace rl::core
