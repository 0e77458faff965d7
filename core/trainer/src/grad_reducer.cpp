#include "grad_reducer.hpp"

#include "rl/core/dist.hpp"
#include "rl/core/error.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <string>

namespace rl::core {
namespace {

// Runs after a parameter's gradient was accumulated in a backward.
struct ReadyHook final : torch::autograd::PostAccumulateGradHook {
    ReadyHook(GradReducer *r, size_t i) : reducer(r), index(i) {}
    void operator()(const torch::autograd::Variable &) override { reducer->ready(index); }
    GradReducer *reducer;
    size_t index;
};

// Slots after the gradients: one presence flag per parameter, then the tags.
constexpr int64_t kTags = 2;

} // namespace

GradReducer::GradReducer(std::vector<at::Tensor> params, std::shared_ptr<dist::Group> group,
                         double bucket_mb)
    : params_(std::move(params)), group_(std::move(group)) {
    const int64_t cap =
        std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1024.0 * 1024.0 / 4.0));
    bucket_of_.resize(params_.size());
    for (size_t k = params_.size(); k-- > 0;) { // reverse: the backward's order
        const int64_t n = params_[k].numel();
        if (buckets_.empty() ||
            (buckets_.back().grad_numel > 0 && buckets_.back().grad_numel + n > cap))
            buckets_.emplace_back();
        Bucket &b = buckets_.back();
        b.params.push_back(k);
        b.offset.push_back(b.grad_numel);
        b.grad_numel += n;
        bucket_of_[k] = buckets_.size() - 1;
    }
    for (size_t k = 0; k < params_.size(); ++k)
        torch::autograd::impl::set_post_acc_grad_hooks(params_[k],
                                                       std::make_unique<ReadyHook>(this, k));
}

GradReducer::~GradReducer() {
    for (auto &p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

void GradReducer::arm(int64_t step) {
    armed_ = true;
    next_ = 0;
    tag_step_ = step;
    for (auto &b : buckets_) {
        b.waiting = b.params.size();
        b.flat = at::Tensor();
    }
}

void GradReducer::disarm() {
    armed_ = false;
    try {
        group_->finish_issued("all_reduce (gradient buckets, abandoned call)");
    } catch (...) {
        // The group reports the failure to its next user.
    }
    for (auto &b : buckets_) b.flat = at::Tensor();
}

void GradReducer::ready(size_t param) {
    if (!armed_) return;
    Bucket &b = buckets_[bucket_of_[param]];
    if (b.waiting > 0) --b.waiting;
    // Strictly in bucket order, whatever order the buckets fill in.
    while (next_ < buckets_.size() && buckets_[next_].waiting == 0) issue(next_++);
}

void GradReducer::issue(size_t bi) {
    at::NoGradGuard no_grad;
    Bucket &b = buckets_[bi];
    const int64_t np = static_cast<int64_t>(b.params.size());
    const at::Device device = params_[b.params[0]].device();
    b.flat = at::zeros({b.grad_numel + np + kTags},
                       at::TensorOptions().dtype(at::kFloat).device(device));
    for (int64_t j = 0; j < np; ++j) {
        const at::Tensor &g = params_[b.params[static_cast<size_t>(j)]].grad();
        if (!g.defined()) continue;
        b.flat.narrow(0, b.offset[static_cast<size_t>(j)], g.numel()).copy_(g.reshape({-1}));
        b.flat[b.grad_numel + j] = 1.0f;
    }
    b.flat[b.grad_numel + np] = static_cast<float>(tag_step_ % (1 << 20));
    b.flat[b.grad_numel + np + 1] = static_cast<float>(calls_ + 1);
    group_->issue_all_reduce_sum(b.flat);
}

void GradReducer::finish_call(int64_t step) {
    at::NoGradGuard no_grad;
    if (!armed_) arm(step);
    while (next_ < buckets_.size()) issue(next_++);
    armed_ = false;
    group_->finish_issued("all_reduce (gradient buckets)");
    const float W = static_cast<float>(group_->size());
    for (size_t bi = 0; bi < buckets_.size(); ++bi) {
        Bucket &b = buckets_[bi];
        const int64_t np = static_cast<int64_t>(b.params.size());
        const float step_tag = b.flat[b.grad_numel + np].item<float>();
        const float call_tag = b.flat[b.grad_numel + np + 1].item<float>();
        const float mine_step = static_cast<float>(tag_step_ % (1 << 20));
        const float mine_call = static_cast<float>(calls_ + 1);
        if (step_tag != W * mine_step || call_tag != W * mine_call)
            throw Error(ErrorKind::BadState,
                        "trainer.overlap_grad_reduce: the ranks made different numbers of "
                        "forward_backward calls between optimizer steps (this rank: call " +
                            std::to_string(calls_ + 1) + " of step " + std::to_string(tag_step_) +
                            "); every rank must make the same number, or set "
                            "trainer.overlap_grad_reduce: false");
        if (totals_.size() < buckets_.size()) totals_.resize(buckets_.size());
        if (totals_[bi].defined())
            totals_[bi].add_(b.flat);
        else
            totals_[bi] = b.flat;
        b.flat = at::Tensor();
    }
    for (auto &p : params_) p.mutable_grad() = at::Tensor();
    ++calls_;
}

std::vector<at::Tensor> GradReducer::take() {
    std::vector<at::Tensor> out(params_.size());
    for (size_t bi = 0; bi < buckets_.size() && bi < totals_.size(); ++bi) {
        const Bucket &b = buckets_[bi];
        const at::Tensor &t = totals_[bi];
        if (!t.defined()) continue;
        const at::Tensor present =
            t.narrow(0, b.grad_numel, static_cast<int64_t>(b.params.size())).to(at::kCPU);
        for (size_t j = 0; j < b.params.size(); ++j) {
            if (present[static_cast<int64_t>(j)].item<float>() == 0.0f) continue;
            const at::Tensor &p = params_[b.params[j]];
            out[b.params[j]] = t.narrow(0, b.offset[j], p.numel()).view(p.sizes());
        }
    }
    reset();
    return out;
}

void GradReducer::reset() {
    totals_.clear();
    calls_ = 0;
}

} // namespace rl::core
