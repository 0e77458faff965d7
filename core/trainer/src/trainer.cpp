// The trainer: LossSignature, construction (parallelism, masters), accessors, optimizer setup.
#include "rl/core/trainer.hpp"

#include "expert_parallel.hpp"
#include "fsdp.hpp"
#include "fused_adamw.hpp"
#include "grad_reducer.hpp"
#include "metric_reducer.hpp"
#include "optimizer_state.hpp"
#include "trainer_internal.hpp"

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
namespace fs = std::filesystem;
using nlohmann::json;

// -- signature --------------------------------------------------------------

bool LossSignature::accepts(const std::string &n) const {
    return needs(n) || std::find(optional.begin(), optional.end(), n) != optional.end();
}
bool LossSignature::needs(const std::string &n) const {
    return std::find(required.begin(), required.end(), n) != required.end();
}
bool LossSignature::differentiates(const std::string &n) const {
    return std::find(differentiable.begin(), differentiable.end(), n) != differentiable.end();
}

// -- construction -------------------------------------------------------------

Trainer::Trainer(std::shared_ptr<Policy> policy, TrainerConfig config)
    : Trainer(std::move(policy), std::move(config), nullptr) {}

Trainer::Trainer(std::shared_ptr<Policy> policy, TrainerConfig config,
                 std::shared_ptr<LoraAdapter> adapter)
    : policy_(std::move(policy)), config_(std::move(config)), adapter_(std::move(adapter)) {
    require(policy_ != nullptr, ErrorKind::InvalidArgument, "trainer: policy is null");
    config_.validate();
    const ModelConfig &mc = policy_->model().config();
    require(!mc.is_classifier() || config_.forward_only, ErrorKind::InvalidArgument,
            "trainer: the model is a " + mc.class_name() +
                " (a reward model); it scores sequences with a forward-only trainer "
                "(trainer.forward_only = true) and is not trained here");
    require(!config_.forward_only || config_.expert_parallel == 1, ErrorKind::InvalidArgument,
            "trainer.expert_parallel (" + std::to_string(config_.expert_parallel) +
                ") applies to a trainer that trains; a forward-only trainer "
                "(trainer.forward_only) scores with every expert on every rank (set it to 1)");
    if (config_.forward_only) {
        // A frozen scorer over the model as it is (with `adapter`, if one is
        // given): nothing to train, so nothing of the model is changed.
        group_ = dist::current(policy_->model().device().str());
        if (group_ && group_->size() <= 1) group_.reset();
        return;
    }
    if (adapter_) {
        // LoRA: the adapter's A and B are the parameters; the base is frozen.
        require(adapter_->num_layers() == policy_->model().config().num_hidden_layers,
                ErrorKind::InvalidArgument,
                "trainer: adapter '" + adapter_->name() + "' was made for another model");
        for (auto &kv : policy_->model().named_weights()) kv.second.set_requires_grad(false);
        params_ = adapter_->named_parameters();
    } else {
        params_ = policy_->model().named_weights();
    }
    group_ = dist::current(policy_->model().device().str());
    if (group_ && group_->size() <= 1) group_.reset();
    require(!(adapter_ && group_ && config_.parallel == "fsdp"), ErrorKind::InvalidArgument,
            "trainer: LoRA adapters are not supported with trainer.parallel = \"fsdp\" (use "
            "\"dp\")");
    // The critic's head trains with the policy (after the model's weights,
    // so the model's parameter order is unchanged).
    if (const auto &head = policy_->value_head()) {
        require(!(group_ && config_.parallel == "fsdp"), ErrorKind::InvalidArgument,
                "trainer: model.value_head is not supported with trainer.parallel fsdp (use dp)");
        for (auto &kv : head->named_weights()) params_.push_back(kv);
    }
    setup_expert_parallel();
    for (auto &kv : params_) kv.second.set_requires_grad(true);
    if (moe_aux_coef(config_, policy_->model().config()) > 0 ||
        (policy_->model().config().has_moe() && config_.moe_z_loss_coef > 0)) {
        // A recomputed layer's router logits are recorded without autograd.
        require(!config_.activation_checkpointing, ErrorKind::InvalidArgument,
                "trainer: the router losses (trainer.moe_aux_loss_coef / moe_z_loss_coef, or the "
                "model's router_aux_loss_coef with output_router_logits) need "
                "trainer.activation_checkpointing off; set the coefficients to 0 to use it");
        require(!(group_ && config_.parallel == "fsdp"), ErrorKind::InvalidArgument,
                "trainer: the router losses (trainer.moe_aux_loss_coef / moe_z_loss_coef) are not "
                "supported with trainer.parallel fsdp; use dp or set the coefficients to 0");
    }
    if (group_ && config_.parallel == "fsdp") {
        // The shards are the optimizer's float32 masters (no masters_).
        masters_.assign(params_.size(), at::Tensor());
        fsdp_ = std::make_unique<Fsdp>(policy_->model(), params_, group_);
    } else if (group_) {
        // Replicas start from rank 0's weights.
        at::NoGradGuard no_grad;
        if (ep_) {
            // The same order on every rank (each rank's params_ holds its own experts).
            for (auto &kv : policy_->model().named_weights()) group_->broadcast(kv.second, 0);
            if (const auto &head = policy_->value_head())
                for (auto &kv : head->named_weights()) group_->broadcast(kv.second, 0);
        } else {
            for (auto &kv : params_) group_->broadcast(kv.second, 0);
        }
        if (config_.overlap_grad_reduce) {
            std::vector<at::Tensor> ps;
            for (auto &kv : params_) ps.push_back(kv.second);
            reducer_ = std::make_unique<GradReducer>(std::move(ps), group_, config_.bucket_mb);
        }
    }
    // Low-precision parameters train through float32 master copies: the
    // optimizer (and its state) works on the masters, each step writes them
    // back rounded to the model's dtype.
    if (!fsdp_) {
        at::NoGradGuard no_grad;
        for (auto &kv : params_) {
            const at::ScalarType t = kv.second.scalar_type();
            masters_.push_back(t == at::kFloat || t == at::kDouble
                                   ? at::Tensor()
                                   : kv.second.detach().to(at::kFloat).clone());
        }
    }
    policy_->model().set_activation_checkpointing(config_.activation_checkpointing);
    rebuild_optimizer();
    if (config_.seed) {
        at::Generator gen = at::detail::getDefaultCPUGenerator();
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_current_seed(*config_.seed);
        policy_->set_sampling_state(*config_.seed);
    }
}

Trainer::~Trainer() = default;

void Trainer::setup_expert_parallel() {
    const int64_t N = config_.expert_parallel;
    if (N <= 1) return;
    const ModelConfig &mc = policy_->model().config();
    const std::string key = "trainer.expert_parallel (" + std::to_string(N) + ")";
    require(mc.has_moe(), ErrorKind::InvalidArgument,
            key + " needs a mixture-of-experts model; " + mc.class_name() +
                " has no sparse layer (set it to 1)");
    require(mc.num_experts % N == 0, ErrorKind::InvalidArgument,
            key + " must divide num_experts (" + std::to_string(mc.num_experts) + ")");
    require(config_.parallel != "fsdp", ErrorKind::InvalidArgument,
            key + " is not supported with trainer.parallel fsdp (use dp)");
    require(adapter_ == nullptr, ErrorKind::InvalidArgument,
            key + " is not supported with LoRA adapters (the expert adapters would need "
                  "sharding, exchange and consolidation like the experts; set it to 1)");
    require(!config_.overlap_grad_reduce, ErrorKind::InvalidArgument,
            key + " is not supported with trainer.overlap_grad_reduce (set it to false)");
    require(world_size() % N == 0, ErrorKind::InvalidArgument,
            key + " must divide the world size (" + std::to_string(world_size()) +
                (world_size() == 1 ? " process" : " ranks") + ")");
    ep_ = std::make_unique<ExpertParallel>(policy_->model(), group_, N);
    // Only this rank's experts train here; the others' weights stay for the
    // engine and are refreshed from their ranks after each step.
    std::vector<std::pair<std::string, at::Tensor>> kept;
    for (auto &kv : params_) {
        if (ep_->owns(kv.second)) {
            kept.push_back(kv);
        } else {
            kv.second.set_requires_grad(false);
            ep_foreign_.push_back(kv);
        }
    }
    params_ = std::move(kept);
}

int64_t Trainer::version() const {
    return adapter_ ? adapter_->version() : policy_->version();
}

int Trainer::rank() const {
    return group_ ? group_->rank() : 0;
}
int Trainer::world_size() const {
    return group_ ? group_->size() : 1;
}
std::string Trainer::strategy() const {
    return fsdp_ ? "fsdp" : group_ ? "dp" : "single";
}

int64_t Trainer::state_bytes() const {
    int64_t n = 0;
    auto bytes = [](const at::Tensor &t) {
        return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
    };
    std::vector<at::Tensor> opt_params;
    if (fsdp_) {
        for (const auto &u : fsdp_->units()) {
            n += bytes(u.grad);
            opt_params.push_back(u.master);
        }
    } else {
        for (size_t i = 0; i < params_.size(); ++i) {
            n += bytes(params_[i].second) + bytes(params_[i].second.grad());
            if (masters_[i].defined()) n += bytes(masters_[i]) + bytes(masters_[i].grad());
            opt_params.push_back(optimized(i));
        }
    }
    for (const auto &p : opt_params) {
        if (fsdp_) n += bytes(p);
        if (!optimizer_) continue; // forward-only: no optimizer state
        auto it = optimizer_->state().find(state_key_of(p));
        if (it == optimizer_->state().end()) continue;
        auto &st = static_cast<torch::optim::AdamWParamState &>(*it->second);
        n += bytes(st.exp_avg()) + bytes(st.exp_avg_sq());
    }
    return n;
}

const at::Tensor &Trainer::optimized(size_t i) const {
    return masters_[i].defined() ? masters_[i] : params_[i].second;
}

void Trainer::rebuild_optimizer() {
    std::vector<at::Tensor> ps;
    if (fsdp_)
        for (auto &u : fsdp_->units()) ps.push_back(u.master);
    else
        for (size_t i = 0; i < params_.size(); ++i) ps.push_back(optimized(i));
    torch::optim::AdamWOptions o(config_.learning_rate);
    o.betas(std::make_tuple(config_.beta1, config_.beta2));
    o.eps(config_.eps);
    o.weight_decay(config_.weight_decay);
    optimizer_ = std::make_unique<torch::optim::AdamW>(ps, o);
}

} // namespace rl::core
