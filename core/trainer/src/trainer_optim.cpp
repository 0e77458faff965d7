// The trainer's optimizer step (docs/trainer.md): gradient reduction over
// ranks (dp buckets, expert groups), clipping, the non-finite guard, AdamW
// and the fsdp step.
#include "rl/core/trainer.hpp"

#include "expert_parallel.hpp"
#include "fsdp.hpp"
#include "fused_adamw.hpp"
#include "grad_reducer.hpp"
#include "metric_reducer.hpp"
#include "optimizer_state.hpp"

#include "rl/core/atomic_file.hpp"
#include "rl/core/dist.hpp"
#include "rl/core/checkpoint.hpp"
#include "rl/core/moe.hpp"
#include "rl/core/pretrained.hpp"
#include "rl/core/safetensors.hpp"
#include "rl/core/tensor_io.hpp"
#include "rl/core/json.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/StringUtil.h>
#include <sstream>
#include <type_traits>
#include <torch/autograd.h>
#include <torch/optim/adamw.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <mutex>
#include <set>

namespace rl::core {

// -- optimizer ----------------------------------------------------------------

void Trainer::zero_grad() {
    for (auto &kv : params_) kv.second.mutable_grad() = at::Tensor();
    if (fsdp_)
        for (auto &u : fsdp_->units()) {
            u.grad = at::Tensor();
            u.master.mutable_grad() = at::Tensor();
        }
    for (auto &m : masters_)
        if (m.defined()) m.mutable_grad() = at::Tensor();
    if (reducer_) reducer_->reset();
    pending_backwards_ = 0;
}

OptimResult Trainer::optim_step(const OptimOverrides &ov) {
    require(!config_.forward_only, ErrorKind::BadState,
            "optim_step: this trainer is forward-only (trainer.forward_only)");
    require(pending_backwards_ > 0, ErrorKind::BadState,
            "optim_step: no gradients were accumulated since the last step (call "
            "forward_backward first)");
    if (fsdp_) return fsdp_step(ov);
    at::NoGradGuard no_grad;
    // dp: the gradients summed over ranks (each rank's loss was normalized by
    // the global counts, so the sum is the gradient of the global batch).
    std::vector<at::Tensor> reduced;
    if (group_) reduced = reducer_ ? reducer_->take() : all_reduce_gradients();
    // Gradients as the optimizer sees them (float32 on the masters), and
    // their global norm with one device-to-host read.
    std::vector<at::Tensor> grads, expert_grads;
    for (size_t i = 0; i < params_.size(); ++i) {
        // dp: the reduced float32 sum goes straight to the optimized tensor.
        const at::Tensor g = group_ ? reduced[i] : params_[i].second.grad();
        if (!g.defined()) continue;
        if (masters_[i].defined())
            masters_[i].mutable_grad() = g.to(at::kFloat);
        else if (group_)
            params_[i].second.mutable_grad() = g.to(params_[i].second.scalar_type());
        (ep_ && ep_->is_expert(params_[i].second) ? expert_grads : grads)
            .push_back(optimized(i).grad());
    }
    double squares = sum_of_squares(grads);
    if (ep_) {
        // Each rank of an expert group holds other experts' gradients.
        at::Tensor sq = at::full({1}, sum_of_squares(expert_grads), at::kDouble);
        ep_->experts_group().all_reduce_sum(sq);
        squares += sq.item<double>();
        grads.insert(grads.end(), expert_grads.begin(), expert_grads.end());
    }
    const double norm = std::sqrt(squares);
    refuse_non_finite(norm);
    const double clip = ov.gradient_clip.value_or(config_.gradient_clip);
    if (clip > 0 && norm > clip) {
        const double scale = clip / (norm + 1e-6);
        for (auto &g : grads) g.mul_(scale);
    }
    const double lr = apply_optimizer_options(ov);
    if (!fused_adamw_step(*optimizer_)) optimizer_->step();
    for (size_t i = 0; i < params_.size(); ++i)
        if (masters_[i].defined()) params_[i].second.copy_(masters_[i]);
    zero_grad();
    if (ep_) ep_->refresh_experts(); // every rank's copy of the other ranks' experts
    // The step counts this one; the weights get a new version.
    return OptimResult{norm, lr, ++step_,
                       adapter_ ? adapter_->bump_version() : policy_->bump_version()};
}

// A gradient norm that is NaN or infinite skips the step and clears the gradients.
void Trainer::refuse_non_finite(double norm) {
    if (std::isfinite(norm)) return;
    zero_grad();
    throw Error(ErrorKind::Numeric, std::string("optim_step: the gradient norm is ") +
                                        (std::isnan(norm) ? "NaN" : "infinite") +
                                        "; the step was skipped and the gradients were cleared");
}

// Sets this step's rate (scheduled, or the override) and AdamW settings.
double Trainer::apply_optimizer_options(const OptimOverrides &ov) {
    const double lr =
        ov.learning_rate.value_or(scheduled_learning_rate(config_, config_.learning_rate, step_));
    for (auto &group : optimizer_->param_groups()) {
        auto &o = static_cast<torch::optim::AdamWOptions &>(group.options());
        o.lr(lr);
        o.betas(
            std::make_tuple(ov.beta1.value_or(config_.beta1), ov.beta2.value_or(config_.beta2)));
        o.eps(ov.eps.value_or(config_.eps));
        o.weight_decay(ov.weight_decay.value_or(config_.weight_decay));
    }
    return lr;
}

std::vector<at::Tensor> Trainer::all_reduce_gradients() {
    std::vector<at::Tensor> out(params_.size());
    std::vector<size_t> replicated, experts;
    for (size_t i = 0; i < params_.size(); ++i)
        (ep_ && ep_->is_expert(params_[i].second) ? experts : replicated).push_back(i);
    reduce_gradients(replicated, group_.get(), out);
    // Expert parallelism: an expert's gradient is summed over the ranks that
    // hold its shard (none besides this one when expert_parallel = W).
    if (!experts.empty()) reduce_gradients(experts, ep_->replicas(), out);
    return out;
}

void Trainer::reduce_gradients(const std::vector<size_t> &which, dist::Group *group,
                               std::vector<at::Tensor> &out) {
    at::NoGradGuard no_grad;
    if (group == nullptr) {
        for (size_t i : which) {
            const at::Tensor &g = params_[i].second.grad();
            if (g.defined()) out[i] = g.to(at::kFloat);
        }
        return;
    }
    const size_t n = which.size();
    if (n == 0) return;
    at::Tensor present = at::zeros({static_cast<int64_t>(n)}, at::kFloat);
    for (size_t k = 0; k < n; ++k)
        if (params_[which[k]].second.grad().defined()) present[static_cast<int64_t>(k)] = 1.0f;
    group->all_reduce_sum(present);
    // Buckets of about bucket_mb megabytes of float32, in parameter order.
    const int64_t cap =
        std::max<int64_t>(1, static_cast<int64_t>(config_.bucket_mb * 1024.0 * 1024.0 / 4.0));
    struct Slot {
        size_t bucket;
        int64_t offset;
    };
    std::vector<Slot> slots(n);
    std::vector<int64_t> sizes;
    for (size_t k = 0; k < n; ++k) {
        const int64_t numel = params_[which[k]].second.numel();
        if (sizes.empty() || (sizes.back() > 0 && sizes.back() + numel > cap)) sizes.push_back(0);
        slots[k] = {sizes.size() - 1, sizes.back()};
        sizes.back() += numel;
    }
    const at::TensorOptions fp32 =
        at::TensorOptions().dtype(at::kFloat).device(policy_->model().device());
    std::vector<at::Tensor> buckets;
    for (int64_t k : sizes) buckets.push_back(at::zeros({k}, fp32));
    for (size_t k = 0; k < n; ++k) {
        const at::Tensor &g = params_[which[k]].second.grad();
        if (g.defined())
            buckets[slots[k].bucket].narrow(0, slots[k].offset, g.numel()).copy_(g.reshape({-1}));
    }
    group->all_reduce_sum(buckets);
    for (size_t k = 0; k < n; ++k) {
        if (present[static_cast<int64_t>(k)].item<float>() == 0.0f) continue;
        const at::Tensor &p = params_[which[k]].second;
        out[which[k]] =
            buckets[slots[k].bucket].narrow(0, slots[k].offset, p.numel()).view(p.sizes());
    }
}

OptimResult Trainer::fsdp_step(const OptimOverrides &ov) {
    at::NoGradGuard no_grad;
    auto &units = fsdp_->units();
    // The global norm: squares of every rank's gradient shards, summed.
    at::Tensor sq =
        at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(policy_->model().device()));
    for (auto &u : units)
        if (u.grad.defined()) sq += u.grad.to(at::kDouble).pow(2).sum();
    group_->all_reduce_sum(sq);
    const double norm = std::sqrt(sq.item<double>());
    refuse_non_finite(norm);
    const double clip = ov.gradient_clip.value_or(config_.gradient_clip);
    const double scale = clip > 0 && norm > clip ? clip / (norm + 1e-6) : 1.0;
    for (auto &u : units)
        if (u.grad.defined()) u.master.mutable_grad() = scale == 1.0 ? u.grad : u.grad * scale;
    const double lr = apply_optimizer_options(ov);
    if (!fused_adamw_step(*optimizer_)) optimizer_->step();
    zero_grad();
    fsdp_->invalidate(); // full weights are gathered again when next needed
    // The step counts this one; the weights get a new version.
    return OptimResult{norm, lr, ++step_,
                       adapter_ ? adapter_->bump_version() : policy_->bump_version()};
}

} // namespace rl::core
