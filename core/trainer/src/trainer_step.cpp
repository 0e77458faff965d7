// Forward / backward: the micro-batch loop (Trainer::run), classify, MoE router statistics.
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
        std::optional<RoutingWeightsScope> replay_weights;
        if (P.routed.defined())
            replay.emplace(P.routed.narrow(0, mb.range.token_begin, mb.range.tokens()));
        if (P.routed_weights.defined())
            replay_weights.emplace(
                P.routed_weights.narrow(0, mb.range.token_begin, mb.range.tokens()));
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
        std::optional<RoutingWeightsScope> replay_weights;
        if (P.routed_weights.defined()) replay_weights.emplace(P.routed_weights.narrow(0, a, n));
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
