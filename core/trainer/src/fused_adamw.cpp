#include "fused_adamw.hpp"

#include "optimizer_state.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <memory>
#include <vector>

namespace rl::core {
namespace {

bool fusable(const at::Tensor &t) {
    return t.defined() && t.is_cuda() && t.scalar_type() == at::kFloat;
}

} // namespace

bool fused_adamw_step(torch::optim::AdamW &opt) {
    // Every parameter must qualify before any state changes.
    for (auto &group : opt.param_groups()) {
        const auto &o = static_cast<const torch::optim::AdamWOptions &>(group.options());
        if (o.amsgrad()) return false;
        for (auto &p : group.params())
            if (p.grad().defined() && !(fusable(p) && fusable(p.grad()))) return false;
    }
    at::NoGradGuard no_grad;
    auto &state = opt.state();
    for (auto &group : opt.param_groups()) {
        const auto &o = static_cast<const torch::optim::AdamWOptions &>(group.options());
        std::vector<at::Tensor> ps, gs, ms, vs;
        std::vector<float> steps;
        for (auto &p : group.params()) {
            if (!p.grad().defined()) continue;
            auto it = state.find(state_key_of(p));
            if (it == state.end()) {
                auto st = std::make_unique<torch::optim::AdamWParamState>();
                st->step(0);
                st->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
                st->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
                it = state.emplace(state_key_of(p), std::move(st)).first;
            }
            auto &st = static_cast<torch::optim::AdamWParamState &>(*it->second);
            st.step(st.step() + 1);
            ps.push_back(p);
            gs.push_back(p.grad());
            ms.push_back(st.exp_avg());
            vs.push_back(st.exp_avg_sq());
            steps.push_back(static_cast<float>(st.step()));
        }
        if (ps.empty()) continue;
        // The kernel reads each parameter's (already counted) step from the
        // device: one copy for the group.
        const at::Tensor step_values =
            at::tensor(steps, at::kFloat).to(ps[0].device(), /*non_blocking=*/false);
        const std::vector<at::Tensor> step_list = step_values.unbind(0);
        const auto [beta1, beta2] = o.betas();
        at::_fused_adamw_(ps, gs, ms, vs, /*max_exp_avg_sqs=*/{}, step_list, o.lr(), beta1, beta2,
                          o.weight_decay(), o.eps(), /*amsgrad=*/false, /*maximize=*/false);
    }
    return true;
}

double sum_of_squares(const std::vector<at::Tensor> &ts) {
    if (ts.empty()) return 0.0;
    bool fused = true;
    for (const auto &t : ts) fused = fused && fusable(t);
    at::Tensor sq;
    if (fused) {
        const std::vector<at::Tensor> norms = at::_foreach_norm(ts, 2);
        sq = at::stack(norms).to(at::kDouble).pow(2).sum();
    } else {
        for (const auto &t : ts) {
            at::Tensor s = t.to(at::kDouble).pow(2).sum();
            sq = sq.defined() ? sq + s.to(sq.device()) : s;
        }
    }
    return sq.item<double>();
}

} // namespace rl::core
