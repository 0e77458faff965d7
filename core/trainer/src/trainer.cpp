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
constexpr const char *kCheckpointFormat = "rl-trainer-checkpoint/1";
constexpr const char *kMasterFile = "master_weights.safetensors";
constexpr const char *kRoutedExperts = "routed_experts"; // R3 routing replay, [T, L_moe, K]
constexpr const char *kAdapterFolder = "adapter";        // a LoRA trainer's checkpoint: PEFT folder

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

// Loads every tensor of a saved model folder (single file or sharded).
std::map<std::string, at::Tensor> load_model_tensors(const fs::path &dir) {
    std::map<std::string, at::Tensor> out;
    const fs::path single = dir / "model.safetensors";
    const fs::path index = dir / "model.safetensors.index.json";
    if (fs::exists(index)) {
        const SafetensorsIndex idx = read_safetensors_index(index.string());
        std::set<std::string> files;
        for (const auto &kv : idx.weight_map) files.insert(kv.second);
        for (const auto &f : files)
            for (auto &kv : load_safetensors((dir / f).string())) out.insert(std::move(kv));
    } else {
        out = load_safetensors(single.string());
    }
    return out;
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
            key + " is not supported with LoRA adapters (LoRA on a mixture-of-experts model "
                  "trains the attention; set it to 1)");
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

// -- checkpoints ----------------------------------------------------------------

void Trainer::collect_state(std::vector<std::pair<std::string, at::Tensor>> &opt,
                            std::vector<std::pair<std::string, at::Tensor>> &masters) {
    at::NoGradGuard no_grad;
    auto add_moments = [&](const std::string &name, const at::Tensor &exp_avg,
                           const at::Tensor &exp_avg_sq, int64_t step) {
        opt.emplace_back("exp_avg." + name, exp_avg.to(at::kCPU));
        opt.emplace_back("exp_avg_sq." + name, exp_avg_sq.to(at::kCPU));
        opt.emplace_back("step." + name, at::full({1}, step, at::kLong));
    };
    if (!fsdp_) {
        std::map<const void *, size_t> index_of; // expert parallelism: owned experts
        for (size_t i = 0; i < params_.size(); ++i) {
            const std::string &name = params_[i].first;
            if (ep_ && ep_->is_expert(params_[i].second)) {
                index_of[params_[i].second.unsafeGetTensorImpl()] = i;
                continue;
            }
            if (masters_[i].defined()) masters.emplace_back(name, masters_[i].to(at::kCPU));
            auto it = optimizer_->state().find(state_key_of(optimized(i)));
            if (it == optimizer_->state().end()) continue;
            auto &st = static_cast<torch::optim::AdamWParamState &>(*it->second);
            add_moments(name, st.exp_avg(), st.exp_avg_sq(), st.step());
        }
        if (!ep_) return;
        // Expert parallelism: every expert's state, gathered from its ranks.
        const bool low_precision =
            policy_->model().dtype() != at::kFloat && policy_->model().dtype() != at::kDouble;
        const auto states = ep_->gather_state(
            [&](const at::Tensor &weight) {
                ExpertParallel::State st;
                const size_t i = index_of.at(weight.unsafeGetTensorImpl());
                if (masters_[i].defined()) st.master = masters_[i];
                auto it = optimizer_->state().find(state_key_of(optimized(i)));
                if (it == optimizer_->state().end()) return st;
                auto &adam = static_cast<torch::optim::AdamWParamState &>(*it->second);
                st.exp_avg = adam.exp_avg();
                st.exp_avg_sq = adam.exp_avg_sq();
                st.step = adam.step();
                return st;
            },
            low_precision);
        for (const auto &[name, st] : states) {
            if (low_precision) masters.emplace_back(name, st.master);
            if (st.step >= 0) add_moments(name, st.exp_avg, st.exp_avg_sq, st.step);
        }
        return;
    }
    // fsdp: every rank's shards gathered into whole tensors (a collective).
    auto &units = fsdp_->units();
    std::vector<at::Tensor> m, ea, eas;
    std::vector<int64_t> steps;
    for (auto &u : units) {
        m.push_back(u.master);
        auto it = optimizer_->state().find(state_key_of(u.master));
        if (it == optimizer_->state().end()) {
            ea.push_back(at::zeros_like(u.master));
            eas.push_back(at::zeros_like(u.master));
            steps.push_back(-1);
            continue;
        }
        auto &st = static_cast<torch::optim::AdamWParamState &>(*it->second);
        ea.push_back(st.exp_avg());
        eas.push_back(st.exp_avg_sq());
        steps.push_back(st.step());
    }
    const std::vector<at::Tensor> full_m = fsdp_->gather_full(m);
    const std::vector<at::Tensor> full_ea = fsdp_->gather_full(ea);
    const std::vector<at::Tensor> full_eas = fsdp_->gather_full(eas);
    const bool low_precision = policy_->model().dtype() != at::kFloat;
    for (size_t ui = 0; ui < units.size(); ++ui)
        for (size_t i : units[ui].params) {
            const std::string &name = params_[i].first;
            if (low_precision) masters.emplace_back(name, full_m[i].to(at::kCPU));
            if (steps[ui] >= 0) add_moments(name, full_ea[i], full_eas[i], steps[ui]);
        }
    fsdp_->materialize(); // the model folder is written from the whole weights
}

std::string Trainer::save_checkpoint(const std::string &dir, const std::string &state_json) {
    require(!config_.forward_only, ErrorKind::BadState,
            "save_checkpoint: a forward-only trainer (trainer.forward_only) has no training state "
            "to save; save the model instead");
    json state = json::object();
    if (!state_json.empty()) {
        state = rl::core::parse_json_or_discarded(state_json);
        if (state.is_discarded() || !(state.is_object() || state.is_null()))
            invalid("checkpoint state must be a JSON object");
        if (state.is_null()) state = json::object();
    }
    if (writes_sharded_checkpoints()) return save_sharded_checkpoint(dir, state.dump());
    std::vector<std::pair<std::string, at::Tensor>> opt, masters;
    collect_state(opt, masters);
    if (!group_) return write_checkpoint(dir, state.dump(), opt, masters);
    // Distributed: rank 0 writes (the replicas are equal; fsdp gathered the
    // shards above), every rank learns the outcome.
    std::string outcome;
    if (group_->rank() == 0) {
        try {
            outcome = "ok\n" + write_checkpoint(dir, state.dump(), opt, masters);
        } catch (const std::exception &e) {
            outcome = std::string("error\n") + e.what();
        }
    }
    outcome = group_->broadcast_bytes(outcome, 0);
    const size_t nl = outcome.find('\n');
    if (outcome.compare(0, nl, "ok") != 0)
        throw Error(ErrorKind::Io, "checkpoint (written by rank 0): " + outcome.substr(nl + 1));
    return outcome.substr(nl + 1);
}

std::string Trainer::write_checkpoint(const std::string &dir, const std::string &state,
                                      std::vector<std::pair<std::string, at::Tensor>> &opt,
                                      std::vector<std::pair<std::string, at::Tensor>> &masters) {
    const std::string tmp = begin_checkpoint(dir, step_);
    try {
        const fs::path root(tmp);
        if (adapter_)
            save_adapter(*adapter_, (root / kAdapterFolder).string()); // the adapter alone
        else
            save_pretrained(policy_->model(), (root / "model").string());
        // The critic's head, beside the weights it belongs with.
        if (const auto &head = policy_->value_head())
            head->save((root / (adapter_ ? kAdapterFolder : "model") / kValueHeadFile).string());
        // Optimizer moments, by parameter name.
        save_safetensors((root / "optimizer.safetensors").string(), opt,
                         {{"format", "pt"}, {"optimizer", "adamw"}});
        // The float32 masters of a low-precision model: the model folder holds
        // the rounded weights, a resumed run continues from these.
        if (!masters.empty())
            save_safetensors((root / kMasterFile).string(), masters, {{"format", "pt"}});
        write_run_state(tmp, state, "consolidated", static_cast<int64_t>(opt.size() / 3));
        return commit_checkpoint(tmp, dir, step_);
    } catch (...) {
        abandon_checkpoint(tmp);
        throw;
    }
}

// rng.safetensors, trainer.json and state.json of a checkpoint folder.
void Trainer::write_run_state(const std::string &folder, const std::string &state,
                              const std::string &layout, int64_t optimizer_params) const {
    const fs::path root(folder);
    at::Tensor gen_state;
    {
        at::Generator g = at::detail::getDefaultCPUGenerator();
        std::lock_guard<std::mutex> lock(g.mutex());
        gen_state = g.get_state();
    }
    save_safetensors((root / "rng.safetensors").string(), {{"torch_cpu_generator", gen_state}},
                     {{"format", "pt"}});
    json meta = {{"format", kCheckpointFormat},
                 {"layout", layout},
                 {"step", step_},
                 {"policy_version", policy_->version()},
                 {"sampling_state", policy_->sampling_state()},
                 {"optimizer_params", optimizer_params},
                 {"config", json::parse(config_.to_json())},
                 {"world_size", world_size()},
                 {"strategy", strategy()},
                 {"expert_parallel", ep_ ? ep_->shards() : 1}};
    if (adapter_) {
        meta["adapter"] = adapter_->name();
        meta["adapter_version"] = adapter_->version();
    }
    atomic_write_file((root / "trainer.json").string(), meta.dump(2) + "\n");
    atomic_write_file((root / "state.json").string(), state + "\n");
}

// fsdp: this rank's shards of the whole tensors of a checkpoint (written by
// any world size and strategy).
void Trainer::load_sharded(const std::map<std::string, at::Tensor> &weights,
                           const std::map<std::string, at::Tensor> &opt) {
    at::NoGradGuard no_grad;
    zero_grad();
    optimizer_->state().clear();
    auto &units = fsdp_->units();
    auto by_param = [&](const std::string &prefix) {
        std::vector<at::Tensor> v(params_.size());
        for (size_t i = 0; i < params_.size(); ++i) {
            auto it = (prefix.empty() ? weights : opt).find(prefix + params_[i].first);
            if (it != (prefix.empty() ? weights : opt).end()) v[i] = it->second.to(at::kFloat);
        }
        return v;
    };
    const std::vector<at::Tensor> w = by_param(""), ea = by_param("exp_avg."),
                                  eas = by_param("exp_avg_sq.");
    for (size_t ui = 0; ui < units.size(); ++ui) {
        auto &u = units[ui];
        u.master.copy_(fsdp_->shard_of(ui, w));
        bool has_state = !u.params.empty();
        for (size_t i : u.params) has_state = has_state && ea[i].defined();
        if (!has_state) continue;
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(opt.at("step." + params_[u.params[0]].first).to(at::kLong).item<int64_t>());
        st->exp_avg(fsdp_->shard_of(ui, ea));
        st->exp_avg_sq(fsdp_->shard_of(ui, eas));
        optimizer_->state()[state_key_of(u.master)] = std::move(st);
    }
    fsdp_->invalidate();
}

CheckpointInfo Trainer::load_checkpoint(const std::string &dir) {
    require(!config_.forward_only, ErrorKind::BadState,
            "load_checkpoint: a forward-only trainer (trainer.forward_only) has no training "
            "state to load");
    if (fsdp_) fsdp_->materialize(); // the checks below compare whole shapes
    const auto latest = latest_checkpoint(dir);
    require(latest.has_value(), ErrorKind::NotFound,
            "no complete checkpoint (step_<N>/ with a '" + std::string(kCheckpointMarker) +
                "' marker) under '" + dir + "'");
    const fs::path root(latest->path);
    auto bad_file = [&](const std::string &file, const std::string &msg) -> Error {
        return Error(ErrorKind::InvalidArgument,
                     "checkpoint '" + (root / file).string() + "': " + msg);
    };

    const json meta =
        rl::core::parse_json_or_discarded(read_file((root / "trainer.json").string()));
    if (meta.is_discarded() || !meta.is_object() || !meta.contains("format") ||
        meta["format"] != kCheckpointFormat)
        throw bad_file("trainer.json", std::string("not a ") + kCheckpointFormat + " file");
    for (const char *key : {"step", "policy_version", "sampling_state"})
        if (!meta.contains(key) || !meta[key].is_number_unsigned())
            throw bad_file("trainer.json",
                           std::string("'") + key + "' is missing or not an integer >= 0");
    const std::string state_text = read_file((root / "state.json").string());
    const json state = rl::core::parse_json_or_discarded(state_text);
    if (state.is_discarded()) throw bad_file("state.json", "not valid JSON");

    const std::string layout = meta.value("layout", "consolidated");
    if (layout != "consolidated" && layout != "sharded")
        throw bad_file("trainer.json", "unknown layout '" + layout + "'");

    // Read and check everything before changing anything.
    const bool has_adapter = fs::exists(root / kAdapterFolder);
    if (adapter_ && !has_adapter)
        throw bad_file(kAdapterFolder, "is missing: the checkpoint holds full weights, this "
                                       "trainer trains LoRA adapter '" +
                                           adapter_->name() + "'");
    if (!adapter_ && has_adapter)
        throw bad_file("model", "is missing: the checkpoint holds a LoRA adapter, this trainer "
                                "trains the full weights");
    if (adapter_) {
        const LoraConfig saved = read_adapter_config((root / kAdapterFolder).string());
        const LoraConfig &mine = adapter_->config();
        if (saved.rank != mine.rank || saved.scale() != mine.scale() ||
            saved.target_modules != mine.target_modules)
            throw bad_file(std::string(kAdapterFolder) + "/adapter_config.json",
                           "the saved adapter (rank " + std::to_string(saved.rank) + ", scale " +
                               json(saved.scale()).dump() +
                               ") differs from this trainer's adapter (rank " +
                               std::to_string(mine.rank) + ", scale " + json(mine.scale()).dump() +
                               ") or its target modules");
        if (meta.contains("adapter_version") && !meta["adapter_version"].is_number_unsigned())
            throw bad_file("trainer.json", "'adapter_version' is not an integer >= 0");
    }
    // A sharded checkpoint's whole tensors are rebuilt from every rank's shards.
    std::map<std::string, at::Tensor> weights, opt;
    if (layout == "sharded") {
        read_sharded_checkpoint(root.string(), weights, opt);
    } else {
        weights =
            adapter_
                ? load_safetensors((root / kAdapterFolder / "adapter_model.safetensors").string())
                : load_model_tensors(root / "model");
        opt = load_safetensors((root / "optimizer.safetensors").string());
    }
    if (const auto &head = policy_->value_head()) {
        const std::string rel =
            std::string(adapter_ ? kAdapterFolder : "model") + "/" + kValueHeadFile;
        if (!fs::exists(root / rel))
            throw bad_file(rel, "is missing: the checkpoint was written by a model without a "
                                "value head (model.value_head)");
        for (auto &kv : head->read((root / rel).string())) weights.insert(std::move(kv));
    }
    std::map<std::string, at::Tensor> rng = load_safetensors((root / "rng.safetensors").string());
    // Float32 masters, when the checkpoint was written by a low-precision
    // model: they replace the rounded model weights as the source.
    if (fs::exists(root / kMasterFile)) {
        std::map<std::string, at::Tensor> masters = load_safetensors((root / kMasterFile).string());
        for (auto &kv : masters) {
            auto it = weights.find(kv.first);
            if (it == weights.end())
                throw bad_file(kMasterFile, "tensor '" + kv.first + "' is not a model weight");
            if (!it->second.sizes().equals(kv.second.sizes()))
                throw bad_file(kMasterFile, "tensor '" + kv.first + "' has shape " +
                                                c10::str(kv.second.sizes()) + ", the model has " +
                                                c10::str(it->second.sizes()));
            it->second = std::move(kv.second);
        }
    }
    // Expert parallelism: the other ranks' experts are read too (the model
    // keeps their weights).
    std::vector<std::pair<std::string, at::Tensor>> expected = params_;
    expected.insert(expected.end(), ep_foreign_.begin(), ep_foreign_.end());
    for (const auto &kv : expected) {
        auto it = weights.find(kv.first);
        if (it == weights.end())
            throw bad_file(adapter_ ? kAdapterFolder : "model",
                           "tensor '" + kv.first + "' is missing");
        if (!it->second.sizes().equals(kv.second.sizes()))
            throw bad_file(adapter_ ? kAdapterFolder : "model",
                           "tensor '" + kv.first + "' has shape " + c10::str(it->second.sizes()) +
                               ", the model has " + c10::str(kv.second.sizes()));
    }
    if (weights.size() != expected.size())
        throw bad_file(adapter_ ? kAdapterFolder : "model",
                       std::to_string(weights.size()) + " tensors, the " +
                           (adapter_ ? "adapter" : "model") + " has " +
                           std::to_string(expected.size()));
    size_t opt_params = 0;
    for (const auto &kv : expected) {
        auto a = opt.find("exp_avg." + kv.first), b = opt.find("exp_avg_sq." + kv.first),
             s = opt.find("step." + kv.first);
        const int present = (a != opt.end()) + (b != opt.end()) + (s != opt.end());
        if (present == 0) continue;
        if (present != 3)
            throw bad_file("optimizer.safetensors", "incomplete state for '" + kv.first + "'");
        if (!a->second.sizes().equals(kv.second.sizes()) ||
            !b->second.sizes().equals(kv.second.sizes()) || s->second.numel() != 1)
            throw bad_file("optimizer.safetensors", "state of '" + kv.first + "' has wrong shapes");
        ++opt_params;
    }
    if (opt_params * 3 != opt.size())
        throw bad_file("optimizer.safetensors", "holds tensors of parameters the model lacks");
    auto gen = rng.find("torch_cpu_generator");
    if (gen == rng.end())
        throw bad_file("rng.safetensors", "tensor 'torch_cpu_generator' is missing");

    // Apply: parameters in place (the engine reads the same tensors).
    if (fsdp_) {
        load_sharded(weights, opt);
    } else {
        at::NoGradGuard no_grad;
        for (size_t i = 0; i < params_.size(); ++i) {
            const at::Tensor &w = weights.at(params_[i].first);
            if (masters_[i].defined()) masters_[i].copy_(w);
            params_[i].second.copy_(w);
        }
        for (auto &kv : ep_foreign_) kv.second.copy_(weights.at(kv.first));
    }
    if (!fsdp_) {
        zero_grad();
        optimizer_->state().clear();
    }
    for (size_t i = 0; i < params_.size() && !fsdp_; ++i) {
        const std::string &name = params_[i].first;
        auto a = opt.find("exp_avg." + name);
        if (a == opt.end()) continue;
        const at::Tensor &p = optimized(i);
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(opt.at("step." + name).to(at::kLong).item<int64_t>());
        st->exp_avg(a->second.to(p.options()).clone());
        st->exp_avg_sq(opt.at("exp_avg_sq." + name).to(p.options()).clone());
        optimizer_->state()[state_key_of(p)] = std::move(st);
    }
    {
        at::Generator g = at::detail::getDefaultCPUGenerator();
        std::lock_guard<std::mutex> lock(g.mutex());
        g.set_state(gen->second.clone());
    }
    step_ = meta["step"].get<int64_t>();
    if (adapter_) // the policy's version belongs to the base (shared with other adapters)
        adapter_->set_version(meta.value("adapter_version", step_));
    else
        policy_->set_version(meta["policy_version"].get<int64_t>());
    policy_->set_sampling_state(meta["sampling_state"].get<uint64_t>());

    CheckpointInfo info;
    info.path = latest->path;
    info.step = step_;
    info.state_json = state.dump();
    return info;
}

} // namespace rl::core
