// Batch preparation: Trainer::prepare checks a TrainBatch and lays out labels, masks, inputs.
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
#include "rl/core/moe_weights.hpp"
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
// R3's recorded routing weights of those experts, float [T, L_moe, K].
constexpr const char *kRoutedWeights = "routed_expert_weights";

// A model input, not a loss input.
bool is_routing(const std::string &name) {
    return name == kRoutedExperts || name == kRoutedWeights;
}

[[noreturn]] void invalid(const std::string &msg) {
    throw Error(ErrorKind::InvalidArgument, msg);
}

std::string list_names(const std::vector<std::string> &names) {
    if (names.empty()) return "(none)";
    std::string s;
    for (const auto &n : names) s += (s.empty() ? "" : ", ") + n;
    return s;
}

bool is_float(at::ScalarType t) {
    return at::isFloatingType(t);
}
bool is_integral_or_bool(at::ScalarType t) {
    return at::isIntegralType(t, /*includeBool=*/true);
}

} // namespace

// -- batch preparation ----------------------------------------------------------

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
    if (auto it = batch.tensors.find(kRoutedWeights); it != batch.tensors.end()) {
        if (!P.routed.defined())
            invalid("batch tensor 'routed_expert_weights' weighs replayed experts but the batch "
                    "has no 'routed_experts'");
        check_routed_expert_weights(it->second, P.routed, "batch tensor 'routed_expert_weights'");
        P.routed_weights = it->second.to(at::kCPU).to(at::kFloat).contiguous();
    }

    // Per-token tensors: shape and dtype checks, reserved names.
    for (const auto &kv : batch.tensors) {
        const std::string &name = kv.first;
        const at::Tensor &t = kv.second;
        if (is_routing(name)) continue;
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
        if (!is_routing(kv.first) && !sig.accepts(kv.first))
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
        if (kv.first == "labels" || kv.first == "loss_mask" || is_routing(kv.first)) continue;
        P.inputs.emplace_back(kv.first, kv.second.to(at::kCPU).to(at::kDouble).contiguous());
    }
    return P;
}

} // namespace rl::core
