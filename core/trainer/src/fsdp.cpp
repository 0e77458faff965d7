#include "fsdp.hpp"

#include "rl/core/error.hpp"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cstdlib>

namespace rl::core {
namespace {

// "model.layers.<i>.<rest>" -> i; anything else -> -1 (the root unit).
int64_t layer_of(const std::string &name) {
    const std::string prefix = "model.layers.";
    if (name.rfind(prefix, 0) != 0) return -1;
    const size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos) return -1;
    return std::strtoll(name.substr(prefix.size(), dot - prefix.size()).c_str(), nullptr, 10);
}

at::Tensor empty_like_param(const at::Tensor &p) {
    return at::empty({0}, at::TensorOptions().dtype(p.scalar_type()).device(p.device()));
}

} // namespace

Fsdp::Fsdp(CausalLM &model, const std::vector<std::pair<std::string, at::Tensor>> &params,
           std::shared_ptr<dist::Group> group)
    : model_(model), group_(std::move(group)) {
    at::NoGradGuard no_grad;
    const int64_t W = group_->size();
    const size_t layers = static_cast<size_t>(model.config().num_hidden_layers);
    units_.resize(layers + 1);
    for (size_t i = 0; i < params.size(); ++i) {
        const at::Tensor &p = params[i].second;
        params_.push_back(p);
        shapes_.push_back(p.sizes().vec());
        const int64_t layer = layer_of(params[i].first);
        Unit &u = layer >= 0 && static_cast<size_t>(layer) < layers
                      ? units_[static_cast<size_t>(layer)]
                      : units_.back();
        u.params.push_back(i);
        u.offset.push_back(u.numel);
        u.numel += p.numel();
    }
    for (Unit &u : units_) {
        u.shard = (u.numel + W - 1) / W;
        at::Tensor flat =
            at::zeros({u.shard * W}, at::TensorOptions().dtype(at::kFloat).device(model.device()));
        for (size_t k = 0; k < u.params.size(); ++k) {
            at::Tensor p = params_[u.params[k]];
            group_->broadcast(p, 0); // every rank starts from rank 0's weights
            flat.narrow(0, u.offset[k], p.numel()).copy_(p.reshape({-1}));
        }
        u.master = flat.narrow(0, group_->rank() * u.shard, u.shard).clone();
    }
    model_.set_weight_hooks(this);
}

Fsdp::~Fsdp() {
    model_.set_weight_hooks(nullptr);
    // Leave the model whole for whoever still uses it (best effort: the
    // other ranks may be gone).
    try {
        materialize();
    } catch (const std::exception &) {
    }
}

int64_t Fsdp::numel_of(size_t i) const {
    int64_t n = 1;
    for (int64_t d : shapes_[i]) n *= d;
    return n;
}

void Fsdp::gather(Unit &u) {
    if (u.gathered) return;
    at::NoGradGuard no_grad;
    at::Tensor full = at::empty({u.shard * group_->size()}, u.master.options());
    group_->all_gather(full, u.master);
    for (size_t k = 0; k < u.params.size(); ++k) {
        const size_t i = u.params[k];
        at::Tensor p = params_[i];
        at::Tensor v = full.narrow(0, u.offset[k], numel_of(i)).view(shapes_[i]);
        p.set_data(v.scalar_type() == p.scalar_type() ? v : v.to(p.scalar_type()));
    }
    u.gathered = true;
}

void Fsdp::release(Unit &u) {
    if (!u.gathered) return;
    for (size_t i : u.params) params_[i].set_data(empty_like_param(params_[i]));
    u.gathered = false;
}

void Fsdp::reduce_grads(Unit &u) {
    at::NoGradGuard no_grad;
    at::Tensor flat = at::zeros({u.shard * group_->size()}, u.master.options());
    for (size_t k = 0; k < u.params.size(); ++k) {
        at::Tensor p = params_[u.params[k]];
        const at::Tensor &g = p.grad();
        if (g.defined()) flat.narrow(0, u.offset[k], g.numel()).copy_(g.reshape({-1}));
        p.mutable_grad() = at::Tensor();
    }
    at::Tensor out = at::empty({u.shard}, u.master.options());
    group_->reduce_scatter_sum(out, flat);
    u.grad = u.grad.defined() ? u.grad.add_(out) : out;
}

void Fsdp::before_layer(size_t layer, bool) {
    if (!materialized_) gather(units_.at(layer));
}

void Fsdp::after_layer(size_t layer, bool backward) {
    if (materialized_) return;
    Unit &u = units_.at(layer);
    if (backward) reduce_grads(u);
    release(u);
}

void Fsdp::materialize() {
    if (materialized_) return;
    for (Unit &u : units_) gather(u);
    materialized_ = true;
}

void Fsdp::begin_pass(bool backward) {
    if (backward && materialized_) {
        for (Unit &u : units_) release(u);
        materialized_ = false;
    }
}

void Fsdp::begin_micro_batch() {
    if (!materialized_) gather(root());
}

void Fsdp::end_micro_batch(bool backward) {
    if (materialized_) return;
    if (backward) reduce_grads(root());
    release(root());
}

void Fsdp::invalidate() {
    for (Unit &u : units_) release(u);
    materialized_ = false;
}

std::vector<at::Tensor> Fsdp::gather_full(const std::vector<at::Tensor> &per_unit) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> out(params_.size());
    for (size_t ui = 0; ui < units_.size(); ++ui) {
        const Unit &u = units_[ui];
        at::Tensor full = at::empty({u.shard * group_->size()}, u.master.options());
        group_->all_gather(full, per_unit[ui].contiguous());
        for (size_t k = 0; k < u.params.size(); ++k) {
            const size_t i = u.params[k];
            out[i] = full.narrow(0, u.offset[k], numel_of(i)).view(shapes_[i]).clone();
        }
    }
    return out;
}

at::Tensor Fsdp::shard_of(size_t ui, const std::vector<at::Tensor> &full_by_param) const {
    const Unit &u = units_[ui];
    at::Tensor flat = at::zeros({u.shard * group_->size()}, u.master.options());
    for (size_t k = 0; k < u.params.size(); ++k) {
        const at::Tensor &f = full_by_param[u.params[k]];
        flat.narrow(0, u.offset[k], f.numel()).copy_(f.reshape({-1}));
    }
    return flat.narrow(0, group_->rank() * u.shard, u.shard).clone();
}

int64_t Fsdp::shard_bytes() const {
    int64_t n = 0;
    for (const Unit &u : units_) n += u.shard * 4 * (u.grad.defined() ? 2 : 1);
    return n;
}

} // namespace rl::core
