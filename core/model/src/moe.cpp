#include "rl/core/moe.hpp"

#include "decode_linear.hpp"
#include "rl/core/error.hpp"
#include "rl/core/lora.hpp"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>

#include <string>
#include <utility>
#include <vector>

namespace rl::core {
namespace {

thread_local RouterLogitsRecorder *tl_recorder = nullptr;
thread_local RoutingReplayScope *tl_replay = nullptr;

at::Tensor as_float(const at::Tensor &t) {
    return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat);
}

at::Tensor linear(const Linear &l, const at::Tensor &x, bool decoding) {
    return decoding ? decode_linear(x, l.weight, l.bias) : l.forward(x);
}

// down(silu(gate x) * up x) of one expert (`expert`: its id, or the shared
// expert), with the adapter's update on the projections it targets.
at::Tensor swiglu_mlp(const MLP &m, const at::Tensor &x, bool decoding,
                      const ExpertLora *lora = nullptr,
                      int64_t expert = LoraAdapter::kSharedExpert) {
    auto proj = [&](const Linear &l, const at::Tensor &v, LoraTarget t) {
        at::Tensor y = linear(l, v, decoding);
        return lora != nullptr && lora->adapter != nullptr
                   ? lora->adapter->apply_expert(v, y, lora->layer, expert, t, lora->dropout_seed)
                   : y;
    };
    at::Tensor g = proj(*m.gate_proj, x, LoraTarget::Gate), u = proj(*m.up_proj, x, LoraTarget::Up);
    return proj(*m.down_proj, at::silu(g) * u, LoraTarget::Down);
}

// The router logits of every layer: [T, E] tensors with the same T.
int64_t check_router_logits(const std::vector<at::Tensor> &logits, const at::Tensor &mask,
                            const char *what) {
    check(!logits.empty(),
          std::string(what) + ": no router logits (the model has no sparse layer)");
    const int64_t T = logits[0].dim() == 2 ? logits[0].size(0) : -1;
    for (size_t l = 0; l < logits.size(); ++l)
        check(logits[l].dim() == 2 && logits[l].size(0) == T &&
                  logits[l].size(1) == logits[0].size(1),
              std::string(what) + ": router logits of layer " + std::to_string(l) + " must be [" +
                  std::to_string(T) + ", experts] like the first layer's");
    if (mask.defined())
        check(mask.dim() == 1 && mask.size(0) == T,
              std::string(what) + ": mask must be [" + std::to_string(T) + "], one per token");
    return T;
}

// The exchange of a block, carried by the autograd graph of its rows.
struct ExchangeHolder : torch::CustomClassHolder {
    std::shared_ptr<ExpertExchange> exchange;
    std::vector<int64_t> in_rows, out_rows;
};

// All-to-all of rows whose backward sends the gradients back the same way.
struct ExchangeRowsFn : public torch::autograd::Function<ExchangeRowsFn> {
    static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &rows,
                              c10::intrusive_ptr<ExchangeHolder> holder) {
        at::Tensor out = holder->exchange->all_to_all(rows, holder->in_rows, holder->out_rows);
        ctx->saved_data["exchange"] = c10::IValue::make_capsule(std::move(holder));
        return out;
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                   torch::autograd::variable_list grads) {
        auto holder = c10::static_intrusive_pointer_cast<ExchangeHolder>(
            ctx->saved_data["exchange"].toCapsule());
        return {
            holder->exchange->all_to_all(grads[0].contiguous(), holder->out_rows, holder->in_rows),
            at::Tensor()};
    }
};

at::Tensor exchange_rows(const std::shared_ptr<ExpertExchange> &ex, const at::Tensor &rows,
                         std::vector<int64_t> in_rows, std::vector<int64_t> out_rows) {
    auto holder = c10::make_intrusive<ExchangeHolder>();
    holder->exchange = ex;
    holder->in_rows = std::move(in_rows);
    holder->out_rows = std::move(out_rows);
    return ExchangeRowsFn::apply(rows, std::move(holder));
}

std::vector<int64_t> to_vector(const at::Tensor &t) {
    const at::Tensor c = t.to(at::kCPU).to(at::kLong).contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

} // namespace

// -- the block ----------------------------------------------------------------

SparseMoeBlock::SparseMoeBlock(const ModelConfig &c, const ModelOptions &o)
    : num_experts(c.num_experts), top_k(c.num_experts_per_tok), norm_topk_prob(c.norm_topk_prob),
      router_fp32(c.router_fp32) {
    check(c.num_experts > 0 && c.num_experts_per_tok >= 1 &&
              c.num_experts_per_tok <= c.num_experts && c.moe_intermediate_size > 0,
          "a sparse MoE block needs num_experts > 0, 1 <= num_experts_per_tok <= num_experts "
          "and moe_intermediate_size > 0");
    gate =
        register_module("gate", std::make_shared<Linear>(c.hidden_size, c.num_experts, false, o));
    experts_list = register_module("experts", torch::nn::ModuleList());
    for (int64_t e = 0; e < c.num_experts; ++e) {
        auto expert = std::make_shared<MLP>(c, o, c.moe_intermediate_size);
        experts_list->push_back(expert);
        experts.push_back(expert);
    }
    if (c.shared_expert_intermediate_size > 0) {
        shared_expert = register_module(
            "shared_expert", std::make_shared<MLP>(c, o, c.shared_expert_intermediate_size));
        shared_expert_gate = register_module("shared_expert_gate",
                                             std::make_shared<Linear>(c.hidden_size, 1, false, o));
    }
}

MoeRouting SparseMoeBlock::route(const at::Tensor &x) const {
    return replay(x, at::Tensor());
}

MoeRouting SparseMoeBlock::replay(const at::Tensor &x, const at::Tensor &experts) const {
    MoeRouting r;
    r.logits =
        router_fp32 ? at::linear(as_float(x), as_float(gate->weight)) : at::linear(x, gate->weight);
    const at::Tensor probs = at::softmax(r.logits, -1, at::kFloat);
    auto [values, ids] = at::topk(probs, top_k, -1);
    if (experts.defined()) {
        const int64_t T = x.size(0);
        check(experts.dim() == 2 && experts.size(0) == T && experts.size(1) == top_k &&
                  at::isIntegralType(experts.scalar_type(), /*includeBool=*/false),
              "moe: replayed experts must be integer ids [" + std::to_string(T) + ", " +
                  std::to_string(top_k) + "]");
        const at::Tensor want = experts.to(ids.device()).to(at::kLong);
        check(T == 0 ||
                  (want.max().item<int64_t>() < num_experts && want.min().item<int64_t>() >= -1),
              "moe: replayed expert ids must be in [0, " + std::to_string(num_experts) +
                  ") or -1 (route yourself)");
        // A row of -1 keeps the router's own choice.
        const at::Tensor own = want.select(1, 0).lt(0).unsqueeze(1);
        ids = at::where(own, ids, want);
        values = probs.gather(1, ids);
    }
    if (norm_topk_prob) values = values / values.sum(-1, /*keepdim=*/true);
    r.weights = values;
    r.experts = ids;
    return r;
}

at::Tensor SparseMoeBlock::mix(const at::Tensor &x, const MoeRouting &routing, bool decoding,
                               const ExpertLora *lora) const {
    const int64_t T = x.size(0);
    check(routing.experts.dim() == 2 && routing.experts.size(0) == T &&
              routing.weights.sizes().equals(routing.experts.sizes()),
          "moe: routing must give [" + std::to_string(T) + ", k] expert ids and weights");
    const int64_t K = routing.experts.size(1);
    // The (token, slot) pairs sorted by expert: expert e owns a contiguous run.
    const at::Tensor flat = routing.experts.reshape({-1}).to(at::kLong);
    // Expert parallelism: every rank takes part in the exchanges, with or
    // without tokens of its own.
    const bool exchanged = exchange && exchange->active() && !decoding;
    if (exchanged && lora != nullptr && lora->adapter != nullptr)
        for (int64_t e = 0; e < num_experts; ++e)
            for (LoraTarget t : {LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down})
                check(lora->adapter->find_expert(lora->layer, e, t) == nullptr,
                      "moe: LoRA adapter '" + lora->adapter->name() +
                          "' on the experts cannot run over expert parallelism "
                          "(trainer.expert_parallel)");
    if (T == 0 && !exchanged) return at::zeros_like(x);
    check(T == 0 || flat.min().item<int64_t>() >= 0, "moe: routing names a negative expert id");
    const at::Tensor counts = at::bincount(flat, {}, num_experts).to(at::kCPU);
    if (counts.size(0) != num_experts) // (the message reads the ids: only then)
        check(false, "moe: routing names expert " + std::to_string(flat.max().item<int64_t>()) +
                         " but the block has " + std::to_string(num_experts) + " experts");
    const at::Tensor order = at::argsort(flat, /*stable=*/true);
    // Each (token, slot) row in expert order: the rows of expert e are one
    // contiguous run, so each expert multiplies a slice; one gather in, and
    // one scatter back to (token, slot) order summed over the k slots (a
    // per-expert index_add into [T, hidden] cost ~10x the products on the CPU).
    const at::Tensor xs = x.index_select(0, at::floor_divide(order, K));
    // Weights in the activations' dtype, as transformers multiplies them.
    const at::Tensor slot_weight =
        routing.weights.reshape({-1}).index_select(0, order).to(x.scalar_type()).unsqueeze(1);
    at::Tensor y;
    if (exchanged) {
        y = mix_exchanged(xs, counts) * slot_weight;
    } else {
        const int64_t *n = counts.data_ptr<int64_t>();
        std::vector<at::Tensor> ys;
        int64_t begin = 0;
        for (int64_t e = 0; e < num_experts; ++e) {
            if (n[e] == 0) continue;
            ys.push_back(swiglu_mlp(*experts[static_cast<size_t>(e)], xs.narrow(0, begin, n[e]),
                                    decoding, lora, e));
            begin += n[e];
        }
        y = (ys.size() == 1 ? ys[0] : at::cat(ys)) * slot_weight;
    }
    at::Tensor out = at::zeros({T * K, x.size(1)}, x.options())
                         .index_copy(0, order, y)
                         .view({T, K, x.size(1)})
                         .sum(1);
    if (shared_expert) {
        const at::Tensor g = at::sigmoid(linear(*shared_expert_gate, x, decoding));
        out = out + g * swiglu_mlp(*shared_expert, x, decoding, lora, LoraAdapter::kSharedExpert);
    }
    return out;
}

at::Tensor SparseMoeBlock::mix_exchanged(const at::Tensor &xs, const at::Tensor &counts) const {
    const int64_t S = exchange->shards(), me = exchange->shard();
    check(S >= 1 && num_experts % S == 0 && me >= 0 && me < S,
          "moe: expert parallelism over " + std::to_string(S) + " ranks needs num_experts (" +
              std::to_string(num_experts) + ") divisible by it");
    const int64_t local = num_experts / S;
    // Rows to each rank (its experts are a contiguous run of the sorted rows),
    // and what each rank sends here for each of this rank's experts.
    const std::vector<int64_t> send = to_vector(counts.view({S, local}).sum(1));
    const std::vector<int64_t> ones(static_cast<size_t>(S), local);
    const std::vector<int64_t> got = to_vector(exchange->all_to_all(
        counts.to(xs.device()).contiguous(), ones, ones)); // [S * local]: from rank s, expert j
    std::vector<int64_t> recv(static_cast<size_t>(S), 0);
    for (int64_t s = 0; s < S; ++s)
        for (int64_t j = 0; j < local; ++j)
            recv[static_cast<size_t>(s)] += got[static_cast<size_t>(s * local + j)];
    const at::Tensor rows = exchange_rows(exchange, xs, send, recv);
    // The received rows come by source rank, each by expert; each expert
    // takes its rows of every source, in source order.
    std::vector<int64_t> start(static_cast<size_t>(S * local));
    int64_t at_row = 0;
    for (int64_t s = 0; s < S; ++s)
        for (int64_t j = 0; j < local; ++j) {
            start[static_cast<size_t>(s * local + j)] = at_row;
            at_row += got[static_cast<size_t>(s * local + j)];
        }
    std::vector<int64_t> perm;
    perm.reserve(static_cast<size_t>(at_row));
    std::vector<at::Tensor> ys;
    for (int64_t j = 0; j < local; ++j) {
        const size_t first = perm.size();
        for (int64_t s = 0; s < S; ++s) {
            const size_t k = static_cast<size_t>(s * local + j);
            for (int64_t r = 0; r < got[k]; ++r) perm.push_back(start[k] + r);
        }
        const auto n = static_cast<int64_t>(perm.size() - first);
        if (n == 0) continue;
        const at::Tensor idx =
            at::tensor(
                std::vector<int64_t>(perm.begin() + static_cast<std::ptrdiff_t>(first), perm.end()),
                at::kLong)
                .to(rows.device());
        ys.push_back(swiglu_mlp(*experts[static_cast<size_t>(me * local + j)],
                                rows.index_select(0, idx), false));
    }
    // Back in received order (no rows here: the received rows themselves, so
    // that the return exchange is part of the graph on every rank).
    at::Tensor back = rows;
    if (!ys.empty())
        back = at::zeros_like(rows).index_copy(0, at::tensor(perm, at::kLong).to(rows.device()),
                                               ys.size() == 1 ? ys[0] : at::cat(ys));
    return exchange_rows(exchange, back, recv, send);
}

at::Tensor SparseMoeBlock::forward(const at::Tensor &x, bool decoding, MoeRouting *routing_out,
                                   const at::Tensor &replay_experts, const ExpertLora *lora) const {
    MoeRouting r = replay(x, replay_experts);
    if (RouterLogitsRecorder *rec = RouterLogitsRecorder::current()) rec->add(r.logits);
    at::Tensor out = mix(x, r, decoding, lora);
    if (routing_out != nullptr) *routing_out = std::move(r);
    return out;
}

// -- recorder -----------------------------------------------------------------

RouterLogitsRecorder::RouterLogitsRecorder() : previous_(tl_recorder) {
    tl_recorder = this;
}

RouterLogitsRecorder::~RouterLogitsRecorder() {
    tl_recorder = previous_;
}

RouterLogitsRecorder *RouterLogitsRecorder::current() {
    return tl_recorder;
}

// -- routing replay -------------------------------------------------------------

RoutingReplayScope::RoutingReplayScope(at::Tensor experts)
    : experts_(std::move(experts)), previous_(tl_replay) {
    tl_replay = this;
}

RoutingReplayScope::~RoutingReplayScope() {
    tl_replay = previous_;
}

at::Tensor RoutingReplayScope::current() {
    return tl_replay != nullptr ? tl_replay->experts_ : at::Tensor();
}

at::Tensor routed_experts_of(const std::vector<at::Tensor> &router_logits, int64_t top_k) {
    check(!router_logits.empty(), "routed_experts_of: no router logits (no sparse layer ran)");
    std::vector<at::Tensor> ids;
    for (const at::Tensor &l : router_logits)
        ids.push_back(std::get<1>(at::topk(at::softmax(l, -1, at::kFloat), top_k, -1)));
    return at::stack(ids, 1).to(at::kCPU).to(at::kLong).contiguous();
}

void check_routed_experts(const at::Tensor &experts, int64_t T, const ModelConfig &c,
                          const std::string &what) {
    std::vector<int64_t> sparse; // decoder layer of each sparse layer
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
        if (c.is_moe_layer(i)) sparse.push_back(i);
    const int64_t L = static_cast<int64_t>(sparse.size()), K = c.num_experts_per_tok;
    check(L > 0, what + ": the model has no sparse MoE layer to replay a routing in");
    const std::string shape = "[" + std::to_string(T) + ", " + std::to_string(L) + ", " +
                              std::to_string(K) + "] (tokens, sparse layers, experts per token)";
    check(experts.defined(), what + " is an undefined tensor; it must be " + shape);
    check(at::isIntegralType(experts.scalar_type(), /*includeBool=*/false),
          what + " must hold integer expert ids, got " +
              std::string(c10::toString(experts.scalar_type())));
    std::string got;
    for (int64_t d = 0; d < experts.dim(); ++d)
        got += (d ? ", " : "") + std::to_string(experts.size(d));
    check(experts.dim() == 3 && experts.size(0) == T && experts.size(1) == L &&
              experts.size(2) == K,
          what + " must be " + shape + ", got [" + got + "]");
    const at::Tensor ids = experts.to(at::kCPU).to(at::kLong).contiguous();
    const int64_t *p = ids.data_ptr<int64_t>();
    for (int64_t t = 0; t < T; ++t)
        for (int64_t l = 0; l < L; ++l) {
            const int64_t *row = p + (t * L + l) * K;
            const auto where = [&] {
                return what + " at token " + std::to_string(t) + ", sparse layer " +
                       std::to_string(l) + " (decoder layer " +
                       std::to_string(sparse[static_cast<size_t>(l)]) + ")";
            };
            if (row[0] == -1) {
                for (int64_t k = 1; k < K; ++k)
                    check(row[k] == -1, where() +
                                            ": a row that starts with -1 (route yourself) "
                                            "must be all -1, got " +
                                            std::to_string(row[k]) + " at slot " +
                                            std::to_string(k));
                continue;
            }
            for (int64_t k = 0; k < K; ++k) {
                check(row[k] >= 0 && row[k] < c.num_experts,
                      where() + ": expert id " + std::to_string(row[k]) + " is outside [0, " +
                          std::to_string(c.num_experts) + ")");
                for (int64_t j = 0; j < k; ++j)
                    check(row[j] != row[k],
                          where() + ": expert " + std::to_string(row[k]) + " is named twice");
            }
        }
}

// -- router losses ------------------------------------------------------------

at::Tensor load_balancing_loss(const std::vector<at::Tensor> &router_logits, int64_t num_experts,
                               int64_t top_k, const at::Tensor &mask) {
    check_router_logits(router_logits, mask, "load_balancing_loss");
    const int64_t E = router_logits[0].size(1);
    check(num_experts == E, "load_balancing_loss: num_experts is " + std::to_string(num_experts) +
                                " but the router logits have " + std::to_string(E) + " columns");
    check(top_k >= 1 && top_k <= E, "load_balancing_loss: top_k must be in [1, " +
                                        std::to_string(E) + "], got " + std::to_string(top_k));
    const at::Device dev = router_logits[0].device();
    const at::Tensor m = mask.defined() ? as_float(mask.to(dev)) : at::Tensor();
    at::Tensor assigned = at::zeros({E}, at::TensorOptions().dtype(at::kFloat).device(dev));
    at::Tensor prob_sum = assigned.clone();
    at::Tensor rows = at::zeros({}, assigned.options());
    for (const at::Tensor &layer : router_logits) {
        const at::Tensor probs = at::softmax(as_float(layer), -1);
        const at::Tensor chosen = std::get<1>(at::topk(probs.detach(), top_k, -1)); // [T, K]
        at::Tensor one_hot =
            at::zeros({layer.size(0), E}, assigned.options())
                .scatter_add_(1, chosen, at::ones(chosen.sizes(), assigned.options()));
        if (m.defined()) {
            assigned = assigned + (one_hot * m.unsqueeze(1)).sum(0);
            prob_sum = prob_sum + (probs * m.unsqueeze(1)).sum(0);
            rows = rows + m.sum();
        } else {
            assigned = assigned + one_hot.sum(0);
            prob_sum = prob_sum + probs.sum(0);
            rows = rows + static_cast<double>(layer.size(0));
        }
    }
    return (assigned / rows * (prob_sum / rows)).sum() * static_cast<double>(E);
}

at::Tensor router_z_loss(const std::vector<at::Tensor> &router_logits, const at::Tensor &mask) {
    check_router_logits(router_logits, mask, "router_z_loss");
    const at::Device dev = router_logits[0].device();
    const at::Tensor m = mask.defined() ? as_float(mask.to(dev)) : at::Tensor();
    at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(dev));
    at::Tensor rows = total.clone();
    for (const at::Tensor &layer : router_logits) {
        const at::Tensor z2 = at::logsumexp(as_float(layer), {-1}).pow(2);
        total = total + (m.defined() ? (z2 * m).sum() : z2.sum());
        rows = rows + (m.defined()
                           ? m.sum()
                           : at::scalar_tensor(static_cast<double>(z2.size(0)), total.options()));
    }
    return total / rows;
}

at::Tensor router_assignment_counts(const std::vector<at::Tensor> &router_logits,
                                    int64_t num_experts, int64_t top_k) {
    check_router_logits(router_logits, at::Tensor(), "router_assignment_counts");
    at::NoGradGuard no_grad;
    at::Tensor counts = at::zeros({num_experts + 1}, at::kDouble);
    for (const at::Tensor &layer : router_logits) {
        check(layer.size(1) == num_experts,
              "router_assignment_counts: the router logits have " + std::to_string(layer.size(1)) +
                  " columns, the model " + std::to_string(num_experts) + " experts");
        const at::Tensor chosen =
            std::get<1>(at::topk(at::softmax(as_float(layer), -1), top_k, -1)).reshape({-1});
        counts.narrow(0, 0, num_experts)
            .index_add_(0, chosen.to(at::kCPU), at::ones({chosen.size(0)}, at::kDouble));
        counts[num_experts] += static_cast<double>(layer.size(0));
    }
    return counts;
}

at::Tensor load_balancing_loss_part(const std::vector<at::Tensor> &router_logits,
                                    int64_t num_experts, int64_t top_k,
                                    const at::Tensor &pooled_counts) {
    check_router_logits(router_logits, at::Tensor(), "load_balancing_loss_part");
    check(pooled_counts.dim() == 1 && pooled_counts.size(0) == num_experts + 1,
          "load_balancing_loss_part: the pooled counts must be [num_experts + 1]");
    check(top_k >= 1 && top_k <= num_experts,
          "load_balancing_loss_part: top_k must be in [1, " + std::to_string(num_experts) + "]");
    const at::Device dev = router_logits[0].device();
    const double rows = pooled_counts[num_experts].item<double>();
    if (rows <= 0) return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(dev));
    const at::Tensor share =
        (pooled_counts.narrow(0, 0, num_experts) / rows).to(at::kFloat).to(dev);
    at::Tensor prob_sum =
        at::zeros({num_experts}, at::TensorOptions().dtype(at::kFloat).device(dev));
    for (const at::Tensor &layer : router_logits)
        prob_sum = prob_sum + at::softmax(as_float(layer), -1).sum(0);
    return (share * (prob_sum / rows)).sum() * static_cast<double>(num_experts);
}

at::Tensor router_z_loss_part(const std::vector<at::Tensor> &router_logits, double pooled_rows) {
    check_router_logits(router_logits, at::Tensor(), "router_z_loss_part");
    at::Tensor total =
        at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(router_logits[0].device()));
    if (pooled_rows <= 0) return total;
    for (const at::Tensor &layer : router_logits)
        total = total + at::logsumexp(as_float(layer), {-1}).pow(2).sum();
    return total / pooled_rows;
}

} // namespace rl::core
