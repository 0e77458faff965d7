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
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int64_t kIgnore = -100;
constexpr const char *kRoutedExperts = "routed_experts"; // R3 routing replay, [T, L_moe, K]

[[noreturn]] void invalid(const std::string &msg) {
    throw Error(ErrorKind::InvalidArgument, msg);
}

std::string list_names(const std::vector<std::string> &names) {
    if (names.empty()) return "(none)";
    std::string s;
    for (const auto &n : names) s += (s.empty() ? "" : ", ") + n;
    return s;
}

at::Tensor long_tensor(const std::vector<int64_t> &v) {
    at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
    std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
    return t;
}

bool is_float(at::ScalarType t) {
    return at::isFloatingType(t);
}
bool is_integral_or_bool(at::ScalarType t) {
    return at::isIntegralType(t, /*includeBool=*/true);
}

// Mixture of experts: the load-balancing loss weight for this model (0: none).
double moe_aux_coef(const TrainerConfig &t, const ModelConfig &m) {
    if (!m.has_moe()) return 0.0;
    return t.moe_aux_loss_coef.value_or(m.output_router_logits ? m.router_aux_loss_coef : 0.0);
}

// The router statistics of one trainer call, pooled over its micro-batches
// (no gradient): the metrics moe/aux_loss (transformers' load-balancing loss
// over all the call's tokens), moe/z_loss and the expert loads per layer.
class MoeStats {
public:
    explicit MoeStats(const ModelConfig &c) : config_(c) {
        for (int64_t i = 0; i < c.num_hidden_layers; ++i)
            if (c.is_moe_layer(i)) layers_.push_back(i);
    }

    void add(const std::vector<at::Tensor> &router_logits) {
        at::NoGradGuard no_grad;
        const int64_t E = config_.num_experts, K = config_.num_experts_per_tok;
        require(router_logits.size() == layers_.size(), ErrorKind::BadState,
                "trainer: " + std::to_string(router_logits.size()) +
                    " router outputs recorded for " + std::to_string(layers_.size()) +
                    " sparse layers");
        if (!assigned_.defined()) {
            assigned_ = at::zeros({static_cast<int64_t>(layers_.size()), E}, at::kDouble);
            probs_ = at::zeros({E}, at::kDouble);
        }
        for (size_t l = 0; l < router_logits.size(); ++l) {
            const at::Tensor logits = router_logits[l].detach().to(at::kCPU).to(at::kDouble);
            const at::Tensor p = at::softmax(logits, -1);
            const at::Tensor chosen = std::get<1>(at::topk(p, K, -1)).reshape({-1});
            assigned_[static_cast<int64_t>(l)].index_add_(0, chosen,
                                                          at::ones({chosen.size(0)}, at::kDouble));
            probs_ += p.sum(0);
            z_ += at::logsumexp(logits, {-1}).pow(2).sum().item<double>();
        }
        tokens_ += router_logits.empty() ? 0 : router_logits[0].size(0);
    }

    void report(std::map<std::string, double> &metrics) const {
        if (!assigned_.defined() || tokens_ == 0) return;
        const double E = static_cast<double>(config_.num_experts);
        const double rows = static_cast<double>(tokens_) * static_cast<double>(layers_.size());
        metrics["moe/aux_loss"] =
            E * (assigned_.sum(0) / rows * (probs_ / rows)).sum().item<double>();
        metrics["moe/z_loss"] = z_ / rows;
        // Load of an expert relative to a uniform spread (1: its share is 1/E).
        const at::Tensor ratio =
            assigned_ / (static_cast<double>(tokens_ * config_.num_experts_per_tok)) * E;
        double hi = 0, lo = 1e300;
        for (size_t l = 0; l < layers_.size(); ++l) {
            const double mx = ratio[static_cast<int64_t>(l)].max().item<double>();
            const double mn = ratio[static_cast<int64_t>(l)].min().item<double>();
            const std::string layer = "/layer_" + std::to_string(layers_[l]);
            metrics["moe/max_load_ratio" + layer] = mx;
            metrics["moe/min_load_ratio" + layer] = mn;
            hi = std::max(hi, mx);
            lo = std::min(lo, mn);
        }
        metrics["moe/max_load_ratio"] = hi;
        metrics["moe/min_load_ratio"] = lo;
    }

private:
    const ModelConfig &config_;
    std::vector<int64_t> layers_;
    at::Tensor assigned_, probs_;
    double z_ = 0;
    int64_t tokens_ = 0;
};

} // namespace

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

// -- batch preparation ----------------------------------------------------------

struct Trainer::Prepared {
    int64_t T = 0;
    std::vector<int64_t> cu;
    PackingPlan plan;
    at::Tensor ids;          // int64 [T]
    at::Tensor model_labels; // int64 [T]: label of the next token in the sequence, else -100
    at::Tensor not_first;    // float32 [T]: 0 at each sequence's first token
    at::Tensor counted;      // float64 [T]: 1 where the loss counts the token
    at::Tensor routed;       // int64 [T, L_moe, K]: routing to replay (R3), else undefined
    // Loss inputs over the whole batch (float64, labels int64), sliced per micro-batch.
    std::vector<std::pair<std::string, at::Tensor>> inputs;
    bool want_logprobs = false, want_entropy = false;
    bool want_lse = false;    // "logsumexp" (z-loss)
    bool want_values = false; // from the value head
    int64_t loss_tokens = 0, loss_seqs = 0;
    double global_tokens = 0, global_seqs = 0;

    /// The model's input of one micro-batch: its tokens and their sequences'
    /// boundaries, relative to the micro-batch.
    PackedBatch input_of(const MicroBatch &mb) const {
        const int64_t a = mb.range.token_begin;
        std::vector<int64_t> cu_local;
        for (int64_t s = mb.range.first_seq; s <= mb.range.end_seq; ++s)
            cu_local.push_back(cu[static_cast<size_t>(s)] - a);
        PackedBatch pb;
        pb.input_ids = ids.narrow(0, a, mb.range.tokens());
        pb.cu_seqlens = long_tensor(cu_local);
        return pb;
    }
};

Trainer::Prepared Trainer::prepare(const TrainBatch &batch, const LossFunction *loss,
                                   bool backward) const {
    Prepared P;
    const int64_t vocab = policy_->model().config().vocab_size;
    const at::Tensor &in = batch.input_ids;
    if (!in.defined() || in.dim() != 1) invalid("batch input_ids must be a 1-D tensor");
    if (in.scalar_type() != at::kLong && in.scalar_type() != at::kInt)
        invalid("batch input_ids must be int64, got " +
                std::string(c10::toString(in.scalar_type())));
    P.ids = in.to(at::kCPU).to(at::kLong).contiguous();
    P.T = P.ids.size(0);
    if (P.T == 0) invalid("batch input_ids is empty");
    {
        const int64_t *p = P.ids.data_ptr<int64_t>();
        for (int64_t t = 0; t < P.T; ++t)
            if (p[t] < 0 || p[t] >= vocab)
                invalid("batch input_ids[" + std::to_string(t) + "] = " + std::to_string(p[t]) +
                        " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
    P.cu = batch.cu_seqlens;
    if (!P.cu.empty() && P.cu.back() != P.T)
        invalid("batch cu_seqlens ends at " + std::to_string(P.cu.back()) + " but input_ids has " +
                std::to_string(P.T) + " tokens");
    P.plan = plan_packing(P.cu, config_.packing);
    const int64_t S = static_cast<int64_t>(P.cu.size()) - 1;

    // Routing replay (R3): the experts every sparse layer routes each token
    // to, [T, L_moe, K]; a model input, not a loss input.
    if (auto it = batch.tensors.find(kRoutedExperts); it != batch.tensors.end()) {
        if (!policy_->model().config().has_moe())
            invalid("batch tensor 'routed_experts' replays a mixture-of-experts routing but the "
                    "model has no sparse MoE layer");
        check_routed_experts(it->second, P.T, policy_->model().config(),
                             "batch tensor 'routed_experts'");
        P.routed = it->second.to(at::kCPU).to(at::kLong).contiguous();
    }

    // Per-token tensors: shape and dtype checks, reserved names.
    for (const auto &kv : batch.tensors) {
        const std::string &name = kv.first;
        const at::Tensor &t = kv.second;
        if (name == kRoutedExperts) continue;
        if (name.empty()) invalid("batch has a tensor with an empty name");
        if (name == "logprobs" || name == "entropy" || name == "logsumexp")
            invalid("batch tensor '" + name +
                    "' is computed by the trainer; pass earlier logprobs as 'old_logprobs', "
                    "'ref_logprobs', 'rollout_logprobs', ...");
        if (!t.defined() || t.dim() != 1 || t.size(0) != P.T)
            invalid("batch tensor '" + name + "' must be [" + std::to_string(P.T) +
                    "] (one value per token), got " +
                    (t.defined() ? std::to_string(t.dim()) + "-D with " +
                                       std::to_string(t.numel()) + " elements"
                                 : std::string("an undefined tensor")));
        if (!is_float(t.scalar_type()) && !is_integral_or_bool(t.scalar_type()))
            invalid("batch tensor '" + name + "' has unsupported dtype " +
                    std::string(c10::toString(t.scalar_type())));
    }

    // The first token of every sequence.
    std::vector<uint8_t> first(static_cast<size_t>(P.T), 0);
    for (int64_t s = 0; s < S; ++s) first[static_cast<size_t>(P.cu[s])] = 1;
    P.not_first = at::ones({P.T}, at::kFloat);
    for (int64_t s = 0; s < S; ++s) P.not_first.data_ptr<float>()[P.cu[s]] = 0.0f;

    // Labels (aligned: labels[t] is the token scored at t), first tokens ignored.
    at::Tensor labels;
    if (auto it = batch.tensors.find("labels"); it != batch.tensors.end()) {
        if (!at::isIntegralType(it->second.scalar_type(), /*includeBool=*/false))
            invalid("batch tensor 'labels' must be int64 (-100 = ignored), got " +
                    std::string(c10::toString(it->second.scalar_type())));
        labels = it->second.to(at::kCPU).to(at::kLong).contiguous().clone();
        const int64_t *p = labels.data_ptr<int64_t>();
        for (int64_t t = 0; t < P.T; ++t)
            if (p[t] != kIgnore && (p[t] < 0 || p[t] >= vocab))
                invalid("batch labels[" + std::to_string(t) + "] = " + std::to_string(p[t]) +
                        " is outside the vocabulary [0, " + std::to_string(vocab) +
                        ") and is not -100 (ignored)");
    } else {
        labels = P.ids.clone();
    }
    {
        int64_t *p = labels.data_ptr<int64_t>();
        for (int64_t t = 0; t < P.T; ++t)
            if (first[static_cast<size_t>(t)]) p[t] = kIgnore;
    }
    // For the model: position j predicts labels[j + 1] when j + 1 is in the same sequence.
    P.model_labels = at::full({P.T}, kIgnore, at::kLong);
    {
        int64_t *m = P.model_labels.data_ptr<int64_t>();
        const int64_t *l = labels.data_ptr<int64_t>();
        for (int64_t t = 1; t < P.T; ++t)
            if (!first[static_cast<size_t>(t)]) m[t - 1] = l[t];
    }

    const bool head = policy_->value_head() != nullptr;
    if (loss == nullptr) {
        P.want_logprobs = true;
        P.want_entropy = true;
        P.want_values = head;
        return P;
    }

    // Inputs the loss reads; refuse what it cannot take or misses.
    const LossSignature &sig = loss->signature;
    for (const auto &kv : batch.tensors)
        if (kv.first != kRoutedExperts && !sig.accepts(kv.first))
            invalid(loss->name + " does not read batch tensor '" + kv.first +
                    "'; it reads: " + list_names([&] {
                        std::vector<std::string> a = sig.required;
                        a.insert(a.end(), sig.optional.begin(), sig.optional.end());
                        return a;
                    }()));
    // With a value head, "values" is the head's output (differentiable); a
    // batch's own values are the rollout's, passed as old_values.
    P.want_values = head && sig.accepts("values");
    if (P.want_values && batch.tensors.count("values"))
        invalid("batch tensor 'values' is computed by the model's value head (model.value_head); "
                "pass the values the rollout was scored with as 'old_values'");
    for (const auto &r : sig.required) {
        const bool provided = r == "logprobs" || r == "entropy" || r == "logsumexp" ||
                              r == "labels" || r == "loss_mask" || batch.tensors.count(r) ||
                              (r == "values" && P.want_values);
        if (!provided) {
            std::vector<std::string> have;
            for (const auto &kv : batch.tensors) have.push_back(kv.first);
            invalid(loss->name + " requires input '" + r +
                    "', which the batch does not have; batch tensors: " + list_names(have));
        }
    }
    P.want_logprobs = sig.accepts("logprobs");
    P.want_entropy = sig.accepts("entropy") || !backward;
    P.want_lse = sig.accepts("logsumexp");

    at::Tensor mask;
    if (sig.accepts("loss_mask")) {
        auto it = batch.tensors.find("loss_mask");
        mask = it != batch.tensors.end()
                   ? it->second.to(at::kCPU).to(at::kDouble).contiguous().clone()
                   : at::ones({P.T}, at::kDouble);
        double *m = mask.data_ptr<double>();
        for (int64_t t = 0; t < P.T; ++t)
            if (first[static_cast<size_t>(t)]) m[t] = 0.0;
    }
    // What the loss counts as a loss token: mask 1 (when it reads the mask)
    // and a valid label (when it reads labels).
    P.counted = mask.defined() ? mask.clone() : at::ones({P.T}, at::kDouble);
    if (sig.accepts("labels")) P.counted.mul_(labels.ne(kIgnore).to(at::kDouble));
    P.counted = (P.counted != 0).to(at::kDouble);
    {
        const double *c = P.counted.data_ptr<double>();
        for (int64_t s = 0; s < S; ++s) {
            int64_t k = 0;
            for (int64_t t = P.cu[s]; t < P.cu[s + 1]; ++t) k += c[t] != 0;
            P.loss_tokens += k;
            P.loss_seqs += k > 0;
        }
    }
    auto global = [&](double given, int64_t local, const char *name, const char *what) {
        if (!std::isfinite(given) || given < 0)
            invalid(std::string("batch ") + name + " must be a finite number >= 0, got " +
                    json(given).dump());
        if (given > 0 && given < static_cast<double>(local))
            invalid(std::string("batch ") + name + " (" + json(given).dump() +
                    ") is smaller than the " + what + " of this call (" + std::to_string(local) +
                    "); it must count the whole optimizer step");
        return given > 0 ? given : static_cast<double>(local);
    };
    P.global_tokens = global(batch.global_tokens, P.loss_tokens, "global_tokens", "loss tokens");
    P.global_seqs =
        global(batch.global_seqs, P.loss_seqs, "global_seqs", "sequences with loss tokens");
    if (group_ && (batch.global_tokens == 0 || batch.global_seqs == 0)) {
        // The whole step's normalizers: every rank's counts summed.
        at::Tensor sums = at::tensor(
            {static_cast<double>(P.loss_tokens), static_cast<double>(P.loss_seqs)}, at::kDouble);
        group_->all_reduce_sum(sums);
        if (batch.global_tokens == 0) P.global_tokens = sums[0].item<double>();
        if (batch.global_seqs == 0) P.global_seqs = sums[1].item<double>();
    }

    if (sig.accepts("labels")) P.inputs.emplace_back("labels", labels);
    if (mask.defined()) P.inputs.emplace_back("loss_mask", mask);
    for (const auto &kv : batch.tensors) {
        if (kv.first == "labels" || kv.first == "loss_mask" || kv.first == kRoutedExperts) continue;
        P.inputs.emplace_back(kv.first, kv.second.to(at::kCPU).to(at::kDouble).contiguous());
    }
    return P;
}

// -- forward / backward ----------------------------------------------------------

StepResult Trainer::forward_backward(const TrainBatch &batch, const LossFunction &loss) {
    require(!config_.forward_only, ErrorKind::BadState,
            "forward_backward: this trainer is forward-only (trainer.forward_only); it scores "
            "batches with trainer:forward and never trains");
    return run(batch, &loss, /*backward=*/true);
}

StepResult Trainer::forward(const TrainBatch &batch, const LossFunction *loss) {
    return run(batch, loss, /*backward=*/false);
}

// A reward model's forward: each sequence's score-head output, micro-batch
// by micro-batch as the logprobs would be (whole sequences per micro-batch).
StepResult Trainer::classify(const TrainBatch &batch) {
    Prepared P = prepare(batch, nullptr, /*backward=*/false);
    at::NoGradGuard no_grad;
    AdapterScope adapter_scope(adapter_, false);
    StepResult R;
    R.tokens = P.T;
    R.seqs = static_cast<int64_t>(P.cu.size()) - 1;
    R.bins = static_cast<int64_t>(P.plan.bins.size());
    R.micro_batches = static_cast<int64_t>(P.plan.micro_batches.size());
    std::vector<at::Tensor> scores;
    for (const MicroBatch &mb : P.plan.micro_batches) {
        std::optional<RoutingReplayScope> replay;
        if (P.routed.defined())
            replay.emplace(P.routed.narrow(0, mb.range.token_begin, mb.range.tokens()));
        scores.push_back(policy_->model().sequence_scores(P.input_of(mb)).to(at::kCPU));
    }
    R.tensors["scores"] =
        scores.empty() ? at::zeros({0, policy_->model().config().num_labels}) : at::cat(scores);
    return R;
}

// An empty turn of an fsdp rank that has fewer micro-batches than another:
// one token through every layer (and back with a zero gradient) so that this
// rank joins each all-gather and reduce-scatter.
void Trainer::idle_micro_batch(bool backward) {
    std::optional<at::NoGradGuard> no_grad;
    if (!backward) no_grad.emplace();
    if (fsdp_) fsdp_->begin_micro_batch();
    PackedBatch pb;
    pb.input_ids = at::zeros({1}, at::kLong);
    pb.cu_seqlens = long_tensor({0, 1});
    LogprobOptions lopts;
    lopts.chunk_tokens = config_.logprob_chunk_tokens;
    TokenLogprobs tl = policy_->model().token_logprobs(pb, at::zeros({1}, at::kLong), lopts);
    // Expert parallelism with router losses: the pooled routing statistics
    // of the round, to which this turn adds nothing.
    if (ep_ && backward && router_losses_weighted()) {
        at::Tensor none = at::zeros({policy_->model().config().num_experts + 1}, at::kDouble);
        group_->all_reduce_sum(none);
    }
    if (backward) torch::autograd::backward({tl.logprobs}, {at::zeros_like(tl.logprobs)});
    if (fsdp_) fsdp_->end_micro_batch(backward);
}

bool Trainer::router_losses_weighted() const {
    const ModelConfig &mc = policy_->model().config();
    return moe_aux_coef(config_, mc) > 0 || (mc.has_moe() && config_.moe_z_loss_coef > 0);
}

StepResult Trainer::run(const TrainBatch &batch, const LossFunction *loss, bool backward) {
    require(!backward || loss != nullptr, ErrorKind::InvalidArgument,
            "forward_backward needs a loss");
    CausalLM &model = policy_->model();
    if (model.config().is_classifier()) {
        require(loss == nullptr, ErrorKind::InvalidArgument,
                "forward: the model is a " + model.config().class_name() +
                    " (a reward model); it gives sequence scores, which no loss reads: call "
                    "forward without a loss");
        return classify(batch);
    }
    Prepared P = prepare(batch, loss, backward);
    // The forwards run with this trainer's adapter (none: the base model);
    // adapter dropout only when back-propagating.
    AdapterScope adapter_scope(adapter_, backward && adapter_ != nullptr);

    StepResult R;
    R.tokens = P.T;
    R.seqs = static_cast<int64_t>(P.cu.size()) - 1;
    R.bins = static_cast<int64_t>(P.plan.bins.size());
    R.micro_batches = static_cast<int64_t>(P.plan.micro_batches.size());
    R.loss_tokens = loss ? P.loss_tokens : 0;

    std::optional<at::NoGradGuard> no_grad;
    if (!backward) no_grad.emplace();

    std::vector<at::Tensor> out_lp, out_ent;
    MetricReducer metrics;
    std::map<std::string, std::vector<at::Tensor>> extras;
    LogprobOptions lopts;
    lopts.chunk_tokens = config_.logprob_chunk_tokens;
    lopts.entropy = P.want_entropy;
    lopts.logsumexp = P.want_lse;
    lopts.keep_hidden = P.want_values;
    std::vector<at::Tensor> out_val;
    // Mixture of experts: router statistics always, router losses when weighted.
    const ModelConfig &mc = model.config();
    const bool moe = mc.has_moe();
    const double aux_coef = backward ? moe_aux_coef(config_, mc) : 0.0;
    const double z_coef = backward && moe ? config_.moe_z_loss_coef : 0.0;
    const double ranks = group_ ? static_cast<double>(group_->size()) : 1.0;
    MoeStats moe_stats(mc);
    bool greedy = false;
    lopts.temperature = logprob_temperature_for(config_, batch.sampling_temperature, &greedy);
    R.logprob_temperature = lopts.temperature;
    if (greedy && !warned_greedy_) {
        warned_greedy_ = true;
        R.warnings.push_back(
            "the batch was sampled greedily (temperature 0): its sampling logprobs are 0 and no "
            "tempered distribution matches them; the trainer scores it at temperature " +
            json(lopts.temperature).dump() + " (trainer.logprob_temperature, else 1)");
    }

    // fsdp, expert parallelism: every rank runs as many micro-batches as the
    // rank with the most (the per-layer collectives must pair up); the extra
    // ones are empty.
    int64_t rounds = static_cast<int64_t>(P.plan.micro_batches.size());
    ExpertParallel::Active exchanging(ep_.get());
    // Expert parallelism: the router losses of each round are those of all
    // ranks' tokens of the round pooled, weighted by the round's share of
    // the call's tokens over all ranks (their parts add up over the ranks).
    const bool ep_router_losses = ep_ && (aux_coef > 0 || z_coef > 0);
    double ep_tokens = 0;
    if (ep_router_losses) {
        at::Tensor t = at::full({1}, static_cast<double>(P.T), at::kDouble);
        group_->all_reduce_sum(t);
        ep_tokens = t.item<double>();
    }
    if (fsdp_ || ep_) {
        if (fsdp_) fsdp_->begin_pass(backward);
        at::Tensor most = at::full({1}, rounds, at::kLong);
        group_->all_reduce_max(most);
        for (int64_t k = rounds; k < most.item<int64_t>(); ++k) idle_micro_batch(backward);
    }

    // dp with overlap: the last micro-batch's backward issues the gradient
    // buckets as they fill; a failed call leaves the hooks inert.
    struct Disarm {
        GradReducer *r;
        ~Disarm() {
            if (r) r->disarm();
        }
    } disarm{backward ? reducer_.get() : nullptr};
    for (const MicroBatch &mb : P.plan.micro_batches) {
        if (fsdp_) fsdp_->begin_micro_batch();
        if (disarm.r && &mb == &P.plan.micro_batches.back()) reducer_->arm(step_);
        const int64_t a = mb.range.token_begin, n = mb.range.tokens();
        const PackedBatch pb = P.input_of(mb);
        std::optional<RouterLogitsRecorder> recorder;
        if (moe) recorder.emplace();
        std::optional<RoutingReplayScope> replay;
        if (P.routed.defined()) replay.emplace(P.routed.narrow(0, a, n));
        TokenLogprobs tl = model.token_logprobs(pb, P.model_labels.narrow(0, a, n), lopts);
        // The router losses of this micro-batch, weighted by its share of the
        // call's tokens (and of the ranks', whose gradients dp sums).
        at::Tensor moe_loss;
        if (recorder) {
            const std::vector<at::Tensor> router_logits = recorder->logits();
            recorder.reset();
            moe_stats.add(router_logits);
            if (ep_router_losses) {
                at::Tensor pooled =
                    router_assignment_counts(router_logits, mc.num_experts, mc.num_experts_per_tok);
                group_->all_reduce_sum(pooled);
                const double rows = pooled[mc.num_experts].item<double>();
                at::Tensor term = at::zeros({}, router_logits[0].options());
                if (aux_coef > 0)
                    term =
                        term + aux_coef * load_balancing_loss_part(router_logits, mc.num_experts,
                                                                   mc.num_experts_per_tok, pooled);
                if (z_coef > 0) term = term + z_coef * router_z_loss_part(router_logits, rows);
                const double round_tokens = rows / static_cast<double>(router_logits.size());
                moe_loss = term * (round_tokens / ep_tokens);
            } else if (aux_coef > 0 || z_coef > 0) {
                at::Tensor term = at::zeros({}, router_logits[0].options());
                if (aux_coef > 0)
                    term = term + aux_coef * load_balancing_loss(router_logits, mc.num_experts,
                                                                 mc.num_experts_per_tok);
                if (z_coef > 0) term = term + z_coef * router_z_loss(router_logits);
                moe_loss = term * (static_cast<double>(n) / (static_cast<double>(P.T) * ranks));
            }
        }
        // Shift to the batch alignment: position t holds the prediction of token t.
        const at::Tensor zero = at::zeros({1}, tl.logprobs.options());
        at::Tensor lp = at::cat({zero, tl.logprobs.narrow(0, 0, n - 1)});
        at::Tensor ent;
        if (P.want_entropy)
            ent = at::cat({zero, tl.entropy.narrow(0, 0, n - 1)}) *
                  P.not_first.narrow(0, a, n).to(lp.device());
        at::Tensor lse;
        if (P.want_lse)
            lse = at::cat({zero, tl.logsumexp.narrow(0, 0, n - 1)}) *
                  P.not_first.narrow(0, a, n).to(lp.device());
        // Values, aligned as the logprobs: V at t is the head at t - 1, the
        // state token t is drawn from; 0 at each sequence's first token.
        at::Tensor vals;
        if (P.want_values)
            vals = at::cat({zero, policy_->value_head()->forward(tl.hidden).narrow(0, 0, n - 1)}) *
                   P.not_first.narrow(0, a, n).to(lp.device());
        if (!backward) {
            out_lp.push_back(lp);
            out_ent.push_back(ent);
            if (P.want_values) out_val.push_back(vals);
        }
        if (loss == nullptr) {
            if (fsdp_) fsdp_->end_micro_batch(backward);
            continue;
        }

        LossCall call;
        // Loss plugins read host memory in float64.
        auto to_host = [](const at::Tensor &t) {
            return t.detach().to(at::kCPU).to(at::kDouble).contiguous();
        };
        if (P.want_logprobs) call.tensors.emplace_back("logprobs", to_host(lp));
        if (loss->signature.accepts("entropy")) call.tensors.emplace_back("entropy", to_host(ent));
        if (P.want_lse) call.tensors.emplace_back("logsumexp", to_host(lse));
        if (P.want_values) call.tensors.emplace_back("values", to_host(vals));
        for (const auto &kv : P.inputs)
            call.tensors.emplace_back(kv.first, kv.second.narrow(0, a, n).contiguous());
        call.cu_seqlens = pb.cu_seqlens;
        call.global_tokens = P.global_tokens;
        call.global_seqs = P.global_seqs;
        call.want_grads = backward;
        LossResult res = loss->compute(call);
        if (!std::isfinite(res.loss))
            throw Error(ErrorKind::Numeric, loss->name + ": the loss is not finite");
        R.loss += res.loss;
        if (moe_loss.defined()) R.loss += moe_loss.item<double>();

        const double w = P.counted.narrow(0, a, n).sum().item<double>();
        for (const auto &m : res.metrics) {
            auto spec = res.reductions.find(m.first);
            metrics.add(loss->name, m.first, m.second,
                        spec == res.reductions.end() ? MetricSpec{} : spec->second, w);
        }
        for (auto &t : res.tensors) extras[t.first].push_back(t.second);

        if (backward) {
            std::vector<at::Tensor> outs, grads;
            auto take = [&](const char *name, const at::Tensor &out) {
                auto it = res.grads.find(name);
                if (it == res.grads.end() || !out.defined()) return;
                const at::Tensor &g = it->second;
                if (!g.defined() || g.numel() != n)
                    throw Error(ErrorKind::InvalidArgument,
                                loss->name + ": gradient for '" + name + "' has " +
                                    std::to_string(g.defined() ? g.numel() : 0) +
                                    " values, expected " + std::to_string(n));
                at::Tensor gf = g.to(at::kFloat).reshape({n});
                if (!at::isfinite(gf).all().item<bool>())
                    throw Error(ErrorKind::Numeric,
                                loss->name + ": gradient for '" + name + "' is not finite");
                // An all-zero gradient (e.g. entropy read for metrics only) adds
                // nothing: skip its backward pass.
                if (!gf.ne(0).any().item<bool>()) return;
                outs.push_back(out);
                grads.push_back(gf.to(out.device()));
            };
            take("logprobs", lp);
            take("entropy", ent);
            take("logsumexp", lse);
            take("values", vals);
            if (moe_loss.defined()) {
                outs.push_back(moe_loss);
                grads.push_back(at::ones_like(moe_loss));
            }
            // Expert parallelism: the backward of every layer's exchanges runs
            // on every rank of the expert group, with or without a gradient.
            if (ep_ && (outs.empty() || !outs[0].is_same(lp))) {
                outs.push_back(lp);
                grads.push_back(at::zeros_like(lp));
            }
            if (outs.empty() && fsdp_) { // the layers' collectives run regardless
                outs.push_back(lp);
                grads.push_back(at::zeros_like(lp));
            }
            if (!outs.empty()) torch::autograd::backward(outs, grads);
        }
        if (fsdp_) fsdp_->end_micro_batch(backward);
    }
    if (disarm.r) {
        reducer_->finish_call(step_);
        disarm.r = nullptr;
    }
    if (backward) ++pending_backwards_;

    if (!backward) {
        R.tensors["logprobs"] = at::cat(out_lp).to(at::kCPU).to(at::kFloat).contiguous();
        R.tensors["entropy"] = at::cat(out_ent).to(at::kCPU).to(at::kFloat).contiguous();
        if (!out_val.empty())
            R.tensors["values"] = at::cat(out_val).to(at::kCPU).to(at::kFloat).contiguous();
    }
    // Over ranks too (every rank has a loss or none: the call is a collective).
    if (loss && group_ && group_->size() > 1 && !metrics.all_reduce(*group_) &&
        !warned_metric_ranks_) {
        warned_metric_ranks_ = true;
        R.warnings.push_back(loss->name +
                             ": the ranks emitted different metrics; each reports its own");
    }
    R.metrics = metrics.values();
    moe_stats.report(R.metrics);
    for (auto &e : extras) {
        if (static_cast<int64_t>(e.second.size()) != R.micro_batches)
            throw Error(ErrorKind::InvalidArgument, loss->name + ": emitted tensor '" + e.first +
                                                        "' in " + std::to_string(e.second.size()) +
                                                        " of " + std::to_string(R.micro_batches) +
                                                        " micro-batches");
        std::string name = e.first;
        if (!backward && (name == "logprobs" || name == "entropy" ||
                          (name == "values" && R.tensors.count("values"))))
            name = "loss." + name;
        R.tensors[name] = e.second.size() == 1 ? e.second[0] : at::cat(e.second);
    }
    return R;
}

} // namespace rl::core
