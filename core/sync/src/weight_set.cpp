#include "rl/core/text.hpp"
#include "rl/core/weight_set.hpp"

#include "rl/core/tensor_io.hpp"

#include <ATen/core/grad_mode.h>

#include <map>
#include <set>

namespace rl::core {

StagedWeights StagedWeights::stage(const CausalLM &model,
                                   std::vector<std::pair<std::string, at::Tensor>> received,
                                   bool complete) {
    std::map<std::string, at::Tensor> params;
    for (auto &[name, p] : model.named_weights()) params[name] = p;
    std::set<std::string> seen;
    for (const auto &[name, t] : received) {
        auto it = params.find(name);
        if (it == params.end())
            throw Error("tensor '" + name +
                        "' is not a weight of the model (is the sender training another model?)");
        if (!seen.insert(name).second) throw Error("tensor '" + name + "' is given twice");
        if (!it->second.sizes().equals(t.sizes()))
            throw Error("tensor '" + name + "' has shape " + shape_text(t.sizes()) +
                        ", the model's is " + shape_text(it->second.sizes()));
        if (!at::isFloatingType(t.scalar_type()))
            throw Error("tensor '" + name + "' has dtype " + c10::toString(t.scalar_type()) +
                        "; weights are floating point");
    }
    if (complete)
        for (const auto &[name, p] : params)
            if (!seen.count(name)) throw Error("the weights lack tensor '" + name + "'");

    StagedWeights out;
    out.staged_.reserve(received.size());
    at::NoGradGuard no_grad;
    for (auto &[name, t] : received) {
        const at::Tensor &p = params.at(name);
        out.bytes_ += static_cast<uint64_t>(t.nbytes());
        out.staged_.emplace_back(
            p, t.to(p.options(), /*non_blocking=*/false, /*copy=*/true).contiguous());
        t = at::Tensor(); // the received copy is no longer needed
        require_finite(out.staged_.back().second, "tensor '" + name + "'");
    }
    return out;
}

void StagedWeights::swap_into(Policy &policy, int64_t version) {
    at::NoGradGuard no_grad;
    for (auto &[p, v] : staged_) p.copy_(v);
    staged_.clear();
    policy.set_version(version);
}

} // namespace rl::core
