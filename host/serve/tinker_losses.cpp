#include "tinker_losses.hpp"

#include "api.hpp"

#include <ATen/ATen.h>

#include <cmath>

namespace rl::serve::tinker {

namespace {

using nlohmann::json;

const at::Tensor &input(const core::LossCall &call, const char *name) {
    for (const auto &kv : call.tensors)
        if (kv.first == name) return kv.second;
    throw core::Error(std::string("tinker loss: input '") + name + "' is missing");
}

at::Tensor optional_input(const core::LossCall &call, const char *name) {
    for (const auto &kv : call.tensors)
        if (kv.first == name) return kv.second;
    return {};
}

double config_number(const json &config, const std::string &loss, const char *key, double dflt,
                     double min, double max) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) return dflt;
    const std::string field = std::string("loss_fn_config.") + key;
    if (!it->is_number()) throw ApiError(400, field + " must be a number for " + loss, field);
    const double v = it->get<double>();
    if (!std::isfinite(v) || v < min || v > max)
        throw ApiError(400,
                       field + " = " + it->dump() + " is outside [" + json(min).dump() + ", " +
                           json(max).dump() + "] for " + loss,
                       field);
    return v;
}

void only_keys(const json &config, const std::string &loss,
               std::initializer_list<const char *> keys) {
    for (const auto &item : config.items()) {
        bool known = false;
        std::string list;
        for (const char *k : keys) {
            known = known || item.key() == k;
            list += (list.empty() ? "" : ", ") + std::string(k);
        }
        if (!known)
            throw ApiError(400,
                           "loss_fn_config." + item.key() + " is not a parameter of " + loss +
                               (list.empty() ? " (it takes none)" : " (it takes " + list + ")"),
                           "loss_fn_config." + item.key());
    }
}

core::LossResult finish(const at::Tensor &lp, const at::Tensor &elementwise, const at::Tensor &grad,
                        bool want_grads) {
    core::LossResult r;
    r.loss = elementwise.sum().item<double>();
    if (want_grads) r.grads["logprobs"] = grad;
    r.tensors["logprobs"] = lp.to(at::kFloat);
    r.tensors["elementwise_loss"] = elementwise.to(at::kFloat);
    return r;
}

at::Tensor weights_of(const core::LossCall &call, const at::Tensor &like) {
    at::Tensor w = optional_input(call, "weights");
    return w.defined() ? w : at::ones_like(like);
}

} // namespace

const std::vector<std::string> &builtin_loss_names() {
    static const std::vector<std::string> names{"cross_entropy", "importance_sampling", "ppo",
                                                "cispo"};
    return names;
}

BuiltinInputs builtin_inputs(const std::string &name) {
    if (name == "cross_entropy") return {{"target_tokens"}, {"weights"}};
    return {{"target_tokens", "logprobs", "advantages"}, {"weights"}};
}

std::optional<core::LossFunction> builtin_loss(const std::string &name, const json &config) {
    core::LossFunction f;
    f.name = "loss '" + name + "'";
    if (name == "cross_entropy") {
        only_keys(config, name, {});
        f.signature.required = {"logprobs", "weights"};
        f.signature.differentiable = {"logprobs"};
        f.compute = [](const core::LossCall &call) {
            const at::Tensor lp = input(call, "logprobs");
            const at::Tensor w = input(call, "weights");
            return finish(lp, -lp * w, -w, call.want_grads);
        };
        return f;
    }
    if (name != "importance_sampling" && name != "ppo" && name != "cispo") return std::nullopt;
    f.signature.required = {"logprobs", "sampling_logprobs", "advantages"};
    f.signature.optional = {"weights"};
    f.signature.differentiable = {"logprobs"};
    if (name == "importance_sampling") {
        only_keys(config, name, {});
        // -sum(exp(lp - lp_sampler) * A)
        f.compute = [](const core::LossCall &call) {
            const at::Tensor lp = input(call, "logprobs");
            const at::Tensor a = input(call, "advantages") * weights_of(call, lp);
            const at::Tensor ratio = at::exp(lp - input(call, "sampling_logprobs"));
            core::LossResult r = finish(lp, -ratio * a, -ratio * a, call.want_grads);
            r.metrics["ratio_mean"] = ratio.mean().item<double>();
            return r;
        };
        return f;
    }
    if (name == "ppo") {
        only_keys(config, name, {"clip_low_threshold", "clip_high_threshold"});
        const double lo = config_number(config, name, "clip_low_threshold", 0.8, 0, 1e9);
        const double hi = config_number(config, name, "clip_high_threshold", 1.2, 0, 1e9);
        if (lo > hi)
            throw ApiError(400,
                           "loss_fn_config.clip_low_threshold must not exceed clip_high_threshold",
                           "loss_fn_config.clip_low_threshold");
        // -sum(min(r A, clip(r, lo, hi) A)); the clipped branch has no gradient.
        f.compute = [lo, hi](const core::LossCall &call) {
            const at::Tensor lp = input(call, "logprobs");
            const at::Tensor a = input(call, "advantages") * weights_of(call, lp);
            const at::Tensor ratio = at::exp(lp - input(call, "sampling_logprobs"));
            const at::Tensor plain = ratio * a;
            const at::Tensor clipped = at::clamp(ratio, lo, hi) * a;
            const at::Tensor use_plain = plain <= clipped;
            const at::Tensor obj = at::where(use_plain, plain, clipped);
            const at::Tensor grad = at::where(use_plain, -plain, at::zeros_like(plain));
            core::LossResult r = finish(lp, -obj, grad, call.want_grads);
            r.metrics["clip_fraction"] = (plain != clipped).to(at::kDouble).mean().item<double>();
            return r;
        };
        return f;
    }
    // cispo: -sum(sg(clip(r, lo, hi)) A lp)
    only_keys(config, name, {"clip_low_threshold", "clip_high_threshold"});
    const double lo = config_number(config, name, "clip_low_threshold", 0.0, 0, 1e9);
    const double hi = config_number(config, name, "clip_high_threshold", 4.0, 0, 1e9);
    if (lo > hi)
        throw ApiError(400, "loss_fn_config.clip_low_threshold must not exceed clip_high_threshold",
                       "loss_fn_config.clip_low_threshold");
    f.compute = [lo, hi](const core::LossCall &call) {
        const at::Tensor lp = input(call, "logprobs");
        const at::Tensor a = input(call, "advantages") * weights_of(call, lp);
        const at::Tensor coef =
            at::clamp(at::exp(lp - input(call, "sampling_logprobs")), lo, hi) * a;
        return finish(lp, -coef * lp, -coef, call.want_grads);
    };
    return f;
}

} // namespace rl::serve::tinker
