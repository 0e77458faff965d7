// The value head's gradient: the trainer turns a loss's d loss / d values
// into gradients of the head and of the shared trunk, and they equal central
// finite differences of the loss the trainer reports.
#include "rl/core/policy.hpp"
#include "rl/core/pretrained.hpp"
#include "rl/core/tiny.hpp"
#include "rl/core/trainer.hpp"
#include "test_util.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
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

// L = 1/2 sum_t (v_t - R_t)^2 with R = +1 on even sequences, -0.5 on odd ones.
LossFunction squared_error_to(const std::vector<int64_t> &cu) {
    LossFunction f;
    f.name = "test squared error";
    f.signature = {{"values"}, {}, {"values"}};
    f.compute = [cu](const LossCall &call) {
        at::Tensor v = call.tensors.at(0).second;
        at::Tensor target = at::zeros_like(v);
        for (size_t s = 0; s + 1 < cu.size(); ++s)
            target.narrow(0, cu[s] + 1, cu[s + 1] - cu[s] - 1).fill_(s % 2 == 0 ? 1.0 : -0.5);
        LossResult r;
        r.loss = 0.5 * (v - target).pow(2).sum().item<double>();
        if (call.want_grads) r.grads["values"] = v - target;
        return r;
    };
    return f;
}

TEST(ValueHeadTraining, LossFallsAndCheckpointsRestoreTheHead) {
    test::TempDir dir;
    write_tiny_model(dir / "model", 3);
    LoadOptions lo;
    lo.value_head = true;
    lo.value_head_seed = 1;
    TrainerConfig cfg;
    cfg.learning_rate = 3e-3;
    auto policy = Policy::load(dir / "model", lo);
    Trainer trainer(policy, cfg);
    const TrainBatch batch = batch_of(policy->model().config().vocab_size);
    const LossFunction loss = squared_error_to(batch.cu_seqlens);
    std::vector<double> losses;
    for (int i = 0; i < 15; ++i) {
        losses.push_back(trainer.forward_backward(batch, loss).loss);
        trainer.optim_step();
    }
    EXPECT_LT(losses.back(), 0.5 * losses.front())
        << "first " << losses.front() << ", last " << losses.back();
    const at::Tensor values = trainer.forward(batch, nullptr).tensors.at("values");
    ASSERT_EQ(values.size(0), batch.input_ids.size(0));
    for (size_t s = 0; s + 1 < batch.cu_seqlens.size(); ++s)
        EXPECT_EQ(values[batch.cu_seqlens[s]].item<float>(), 0.0f);

    const std::string ckpt = trainer.save_checkpoint(dir / "ckpt", "{}");
    EXPECT_TRUE(std::filesystem::exists(ckpt + "/model/" + kValueHeadFile));
    save_pretrained(policy->model(), dir / "saved");
    policy->value_head()->save(dir / "saved/value_head.safetensors");

    // Another head (other seed) restored from the checkpoint: same values,
    // and the next step matches the original's (optimizer state restored).
    lo.value_head_seed = 2;
    auto policy2 = Policy::load(dir / "model", lo);
    Trainer trainer2(policy2, cfg);
    EXPECT_FALSE(trainer2.forward(batch, nullptr).tensors.at("values").equal(values));
    trainer2.load_checkpoint(dir / "ckpt");
    EXPECT_TRUE(trainer2.forward(batch, nullptr).tensors.at("values").equal(values));
    for (Trainer *t : {&trainer, &trainer2}) {
        t->forward_backward(batch, loss);
        t->optim_step();
    }
    EXPECT_TRUE(trainer2.forward(batch, nullptr)
                    .tensors.at("values")
                    .equal(trainer.forward(batch, nullptr).tensors.at("values")));

    // A saved folder loads with its head; without the option it has none.
    auto policy3 = Policy::load(dir / "saved", lo);
    Trainer trainer3(policy3, cfg);
    EXPECT_TRUE(trainer3.forward(batch, nullptr).tensors.at("values").equal(values));
    EXPECT_EQ(Policy::load(dir / "saved")->value_head(), nullptr);

    // A checkpoint without a head cannot restore one.
    auto plain = Policy::load(dir / "model");
    Trainer plain_trainer(plain, cfg);
    const std::string plain_ckpt = plain_trainer.save_checkpoint(dir / "plain", "{}");
    try {
        trainer3.load_checkpoint(dir / "plain");
        ADD_FAILURE() << "a checkpoint without value_head.safetensors was accepted";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("value_head.safetensors"), std::string::npos)
            << e.what();
    }
}

} // namespace
} // namespace rl::core
