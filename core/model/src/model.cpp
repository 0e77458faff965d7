#include "rl/core/model.hpp"

#include "attention.hpp"
#include "decode_linear.hpp"
#include "fused_ops.hpp"
#include "logprobs.hpp"
#include "rope.hpp"
#include "rl/core/error.hpp"
#include "rl/core/lora.hpp"
#include "rl/core/moe.hpp"
#include "rl/core/moe_weights.hpp"
#include "rl/core/threads.hpp"
#include "rl/core/torch_compat.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>
#include <torch/nn/modules/container/modulelist.h>

#include <functional>

#include <cmath>
#include <optional>
#include <set>
#include <tuple>

namespace rl::core {
namespace {

at::TensorOptions param_options(const ModelOptions &o) {
    return at::TensorOptions().dtype(o.dtype).device(o.device);
}

bool ends_with(const std::string &s, const std::string &suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<int64_t> to_host_vector(const at::Tensor &t) {
    at::Tensor c = t.to(at::kCPU).to(at::kLong).contiguous();
    const int64_t *p = c.data_ptr<int64_t>();
    return std::vector<int64_t>(p, p + c.numel());
}

at::Tensor long_tensor(const std::vector<int64_t> &v, at::Device device) {
    at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
    std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
    return t.to(device);
}

at::Tensor as_float(const at::Tensor &t) {
    return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat);
}

// silu(gate) * up: one fused kernel each way on CUDA (fused_ops.hpp).
at::Tensor swiglu(const at::Tensor &gate, const at::Tensor &up) {
    if (fused::applies(gate) && gate.scalar_type() == up.scalar_type())
        return fused::swiglu(gate, up);
    return at::silu(gate) * up;
}

// Float32 logits of a few decoding rows h [M, hidden] against the output
// embedding w [vocab, hidden]. On CUDA a low-precision model multiplies in
// its dtype with float32 accumulation and output (compat::mm_float). On the CPU a float32 model
// takes the row kernel (decode_linear.hpp). Otherwise (no AVX2, RL_DECODE_GEMM=blas) a large
// vocabulary goes through the BLAS product in column blocks written in place: the block of w that
// the product packs stays in cache, where one product over the whole vocabulary streams it twice.
at::Tensor decode_logits(const at::Tensor &h, const at::Tensor &w) {
    constexpr int64_t kBlock = 1024;
    const int64_t vocab = w.size(0);
    if (!h.is_cpu()) return compat::mm_float(h, w.t());
    if (decode_linear_applies(h, w)) return decode_linear(h, w, at::Tensor());
    if (h.size(0) > 64 || vocab <= 2 * kBlock) return at::matmul(as_float(h), as_float(w).t());
    const at::Tensor hf = as_float(h);
    at::Tensor out = at::empty({h.size(0), vocab}, hf.options());
    for (int64_t c = 0; c < vocab; c += kBlock) {
        const int64_t n = std::min(kBlock, vocab - c);
        at::Tensor block = out.narrow(1, c, n);
        at::mm_out(block, hf, as_float(w.narrow(0, c, n)).t());
    }
    return out;
}

// Activation checkpointing of one decoder layer: the forward runs without
// recording a graph and keeps only the layer's input; the backward runs the
// layer again with autograd on and back-propagates through that fresh graph
// (its parameter gradients accumulate as usual).
struct LayerClosure : torch::CustomClassHolder {
    std::function<at::Tensor(const at::Tensor &)> fn;
    WeightHooks *hooks = nullptr; // around the recomputation and its backward
    size_t layer = 0;
};

struct CheckpointedLayerFn : public torch::autograd::Function<CheckpointedLayerFn> {
    static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &h,
                              c10::intrusive_ptr<LayerClosure> closure) {
        at::Tensor out;
        {
            at::NoGradGuard no_grad;
            out = closure->fn(h);
        }
        ctx->save_for_backward({h});
        ctx->saved_data["layer"] = c10::IValue::make_capsule(std::move(closure));
        return out;
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                   torch::autograd::variable_list grads) {
        at::Tensor h = ctx->get_saved_variables()[0].detach().requires_grad_(true);
        auto closure =
            c10::static_intrusive_pointer_cast<LayerClosure>(ctx->saved_data["layer"].toCapsule());
        if (closure->hooks != nullptr) closure->hooks->before_layer(closure->layer, true);
        at::Tensor out;
        {
            at::AutoGradMode grad_on(true);
            out = closure->fn(h);
        }
        torch::autograd::backward({out}, {grads[0]});
        if (closure->hooks != nullptr) closure->hooks->after_layer(closure->layer, true);
        return {h.grad(), at::Tensor()};
    }
};

at::Tensor checkpointed_layer(const at::Tensor &h, std::function<at::Tensor(const at::Tensor &)> fn,
                              WeightHooks *hooks, size_t layer) {
    auto closure = c10::make_intrusive<LayerClosure>();
    closure->fn = std::move(fn);
    closure->hooks = hooks;
    closure->layer = layer;
    return CheckpointedLayerFn::apply(h, std::move(closure));
}

} // namespace

// -- PackedBatch ------------------------------------------------------------

PackedBatch PackedBatch::from_sequences(const std::vector<std::vector<int64_t>> &seqs) {
    std::vector<int64_t> ids, cu(1, 0), pos;
    for (const auto &s : seqs) {
        for (size_t i = 0; i < s.size(); ++i) {
            ids.push_back(s[i]);
            pos.push_back(static_cast<int64_t>(i));
        }
        cu.push_back(static_cast<int64_t>(ids.size()));
    }
    PackedBatch b;
    b.input_ids = long_tensor(ids, at::kCPU);
    b.cu_seqlens = long_tensor(cu, at::kCPU);
    b.position_ids = long_tensor(pos, at::kCPU);
    return b;
}

// -- building blocks --------------------------------------------------------

Linear::Linear(int64_t in, int64_t out, bool with_bias, const ModelOptions &o) {
    weight = register_parameter("weight", at::empty({out, in}, param_options(o)));
    if (with_bias) bias = register_parameter("bias", at::empty({out}, param_options(o)));
}

at::Tensor Linear::forward(const at::Tensor &x) const {
    return at::linear(x, weight, bias);
}

RMSNorm::RMSNorm(int64_t dim, double eps_, const ModelOptions &o) : eps(eps_) {
    weight = register_parameter("weight", at::empty({dim}, param_options(o)));
}

namespace {
thread_local const NormWeights *tl_norm_weights = nullptr;
} // namespace

NormWeightsScope::NormWeightsScope(const NormWeights *weights) : previous_(tl_norm_weights) {
    tl_norm_weights = weights;
}

NormWeightsScope::~NormWeightsScope() {
    tl_norm_weights = previous_;
}

const NormWeights *NormWeightsScope::current() {
    return tl_norm_weights;
}

const at::Tensor &RMSNorm::used_weight() const {
    if (tl_norm_weights != nullptr && !tl_norm_weights->empty()) {
        const auto it = tl_norm_weights->find(this);
        if (it != tl_norm_weights->end()) return it->second;
    }
    return weight;
}

at::Tensor RMSNorm::forward(const at::Tensor &x) const {
    const at::Tensor &w = used_weight();
    // On CUDA, libtorch's fused kernel (one launch forward, fused backward;
    // statistics in fp32, one rounding of x * rstd * weight to the dtype).
    // The unfused form below is ~8 kernels forward and ~10 backward, which
    // dominated a bfloat16 training step and decoding on the GPU.
    if (x.is_cuda()) return at::rms_norm(x, {w.size(0)}, w, eps);
    // As transformers: normalize in fp32, cast back, then scale.
    at::Tensor xf = as_float(x);
    at::Tensor var = xf.pow(2).mean(-1, /*keepdim=*/true);
    at::Tensor y = xf * at::rsqrt(var + eps);
    return w * y.to(x.scalar_type());
}

Attention::Attention(const ModelConfig &c, const ModelOptions &o) {
    q_proj = register_module("q_proj",
                             std::make_shared<Linear>(c.hidden_size, c.q_size(), c.qkv_bias, o));
    k_proj = register_module("k_proj",
                             std::make_shared<Linear>(c.hidden_size, c.kv_size(), c.qkv_bias, o));
    v_proj = register_module("v_proj",
                             std::make_shared<Linear>(c.hidden_size, c.kv_size(), c.qkv_bias, o));
    o_proj =
        register_module("o_proj", std::make_shared<Linear>(c.q_size(), c.hidden_size, c.o_bias, o));
    if (c.qk_norm) {
        q_norm =
            register_module("q_norm", std::make_shared<RMSNorm>(c.head_dim, c.rms_norm_eps, o));
        k_norm =
            register_module("k_norm", std::make_shared<RMSNorm>(c.head_dim, c.rms_norm_eps, o));
    }
}

MLP::MLP(const ModelConfig &c, const ModelOptions &o, int64_t intermediate_size) {
    const int64_t n = intermediate_size > 0 ? intermediate_size : c.intermediate_size;
    gate_proj =
        register_module("gate_proj", std::make_shared<Linear>(c.hidden_size, n, c.mlp_bias, o));
    up_proj = register_module("up_proj", std::make_shared<Linear>(c.hidden_size, n, c.mlp_bias, o));
    down_proj =
        register_module("down_proj", std::make_shared<Linear>(n, c.hidden_size, c.mlp_bias, o));
}

at::Tensor MLP::forward(const at::Tensor &x) const {
    return down_proj->forward(swiglu(gate_proj->forward(x), up_proj->forward(x)));
}

DecoderLayer::DecoderLayer(const ModelConfig &c, const ModelOptions &o, int64_t index) {
    self_attn = register_module("self_attn", std::make_shared<Attention>(c, o));
    if (c.is_moe_layer(index)) {
        moe = register_module("mlp", std::make_shared<SparseMoeBlock>(c, o));
        for (int64_t j = 0; j < index; ++j) moe->moe_index += c.is_moe_layer(j) ? 1 : 0;
    } else
        mlp = register_module("mlp", std::make_shared<MLP>(c, o));
    input_layernorm = register_module("input_layernorm",
                                      std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, o));
    post_attention_layernorm = register_module(
        "post_attention_layernorm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, o));
}

Embedding::Embedding(int64_t num, int64_t dim, const ModelOptions &o) {
    weight = register_parameter("weight", at::empty({num, dim}, param_options(o)));
}

DecoderModel::DecoderModel(const ModelConfig &c, const ModelOptions &o) {
    embed_tokens = register_module("embed_tokens",
                                   std::make_shared<Embedding>(c.vocab_size, c.hidden_size, o));
    layers_list = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        auto layer = std::make_shared<DecoderLayer>(c, o, i);
        layers_list->push_back(layer);
        layers.push_back(layer);
    }
    norm = register_module("norm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, o));
}

// -- CausalLM ---------------------------------------------------------------

CausalLM::CausalLM(ModelConfig config, ModelOptions options)
    : config_(std::move(config)), options_(options) {
    check(options_.dtype == at::kFloat || options_.dtype == at::kBFloat16 ||
              options_.dtype == at::kHalf || options_.dtype == at::kDouble,
          "model dtype must be float32, bfloat16, float16 or float64");
    rope_ = std::make_unique<RotaryEmbedding>(config_);
    model = register_module("model", std::make_shared<DecoderModel>(config_, options_));
    if (config_.is_classifier()) {
        check(config_.num_labels >= 1, "a sequence classifier needs num_labels >= 1");
        score =
            register_module("score", std::make_shared<Linear>(config_.hidden_size,
                                                              config_.num_labels, false, options_));
    } else if (!config_.tie_word_embeddings) {
        lm_head = register_module(
            "lm_head",
            std::make_shared<Linear>(config_.hidden_size, config_.vocab_size, false, options_));
    }
}

CausalLM::~CausalLM() = default;

const at::Tensor &CausalLM::lm_head_weight() const {
    if (score)
        throw Error(config_.class_name() +
                    " is a sequence classifier (a reward model): it has no language-model head, "
                    "so it neither generates nor gives token logprobs; it scores whole sequences");
    return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

void CausalLM::init_weights(uint64_t seed, double std) {
    at::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    for (auto &[name, p] : named_weights()) {
        if (ends_with(name, "norm.weight")) {
            p.fill_(1.0);
        } else if (ends_with(name, ".bias")) {
            p.zero_();
        } else {
            // Drawn in fp32 on the CPU so the values do not depend on dtype or device.
            at::Tensor t = at::empty(p.sizes(), at::kFloat);
            t.normal_(0.0, std, gen);
            p.copy_(t);
        }
    }
}

std::vector<std::pair<std::string, at::Tensor>> CausalLM::named_weights() const {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto &item : named_parameters(/*recurse=*/true))
        out.emplace_back(item.key(), item.value());
    return out;
}

int64_t CausalLM::num_parameters() const {
    int64_t n = 0;
    for (const auto &p : parameters()) n += p.numel();
    return n;
}

void CausalLM::check_tokens(const at::Tensor &ids, const char *what) const {
    if (ids.numel() == 0) return;
    const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    if (lo >= 0 && hi < config_.vocab_size) return;
    at::Tensor bad = ids.lt(0).logical_or(ids.ge(config_.vocab_size)).nonzero();
    const int64_t i = bad[0][0].item<int64_t>();
    throw Error(std::string(what) + "[" + std::to_string(i) +
                "] = " + std::to_string(ids[i].item<int64_t>()) +
                " is outside the vocabulary [0, " + std::to_string(config_.vocab_size) + ")");
}

at::Tensor CausalLM::run_layers(const at::Tensor &input_ids, const at::Tensor &position_ids,
                                const std::vector<int64_t> &cu, KVCache *cache,
                                const std::vector<int64_t> *slots,
                                const std::vector<int64_t> *starts) {
    ensure_threads();
    const ModelConfig &c = config_;
    const int64_t T = input_ids.size(0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    const int64_t padding_idx = c.pad_token_id.value_or(-1);

    at::Tensor h = at::embedding(model->embed_tokens->weight, input_ids, padding_idx);
    auto [cos, sin] = rope_->cos_sin(position_ids, options_.dtype);

    PackedAttentionPlan packed;
    CachedAttentionPlan cached;
    if (cache != nullptr) {
        std::vector<int64_t> counts;
        for (size_t i = 0; i + 1 < cu.size(); ++i) counts.push_back(cu[i + 1] - cu[i]);
        cached = plan_cached_attention(*slots, *starts, counts, c.num_key_value_heads,
                                       cache->capacity(), options_.dtype, options_.device);
    } else {
        packed = plan_packed_attention(
            cu, c.num_attention_heads, options_.device,
            varlen_attention_available(options_.device, options_.dtype, c.head_dim));
    }

    // The LoRA adapter selected on this thread (lora.hpp), held by the
    // closure so a checkpointed layer recomputes with it; dropout masks come
    // from one seed per forward so the recomputation drops the same inputs.
    std::shared_ptr<const LoraAdapter> adapter = AdapterScope::current_shared();
    std::optional<uint64_t> dropout_seed;
    if (adapter && AdapterScope::training() && adapter->config().dropout > 0 &&
        at::GradMode::is_enabled())
        dropout_seed = adapter->next_dropout_seed();

    // Routing replay (R3, moe.hpp) of a training or scoring forward: [T,
    // L_moe, K] expert ids, held by the closure for a recomputation.
    at::Tensor replay = cache == nullptr ? RoutingReplayScope::current() : at::Tensor();
    if (replay.defined()) {
        check_routed_experts(replay, T, config_, "routed_experts");
        replay = replay.to(options_.device).to(at::kLong);
    }
    // Recorded routing weights (moe_weights.hpp) of the replayed experts:
    // float32 [T, L_moe, K] constants, held by the closure likewise.
    at::Tensor replay_weights = cache == nullptr ? RoutingWeightsScope::current() : at::Tensor();
    if (replay_weights.defined()) {
        check(replay.defined(), "routed_expert_weights: recorded routing weights need the routed "
                                "experts they weigh (routed_experts)");
        check_routed_expert_weights(replay_weights, replay, "routed_expert_weights");
        replay_weights = replay_weights.detach().to(options_.device).to(at::kFloat);
    }

    // One decoder layer: h -> h'. The closure holds what every layer shares
    // (rotary tables, attention plan), so a checkpointed layer can run again
    // in the backward.
    auto layer_fn = [this, T, scale, cos = cos, sin = sin, packed = std::move(packed),
                     cached = std::move(cached), cache, adapter, dropout_seed, replay,
                     replay_weights](size_t i, const at::Tensor &hin) {
        const ModelConfig &c = config_;
        const DecoderLayer &layer = *model->layers[i];
        const Attention &attn = *layer.self_attn;
        // W x + b, plus the adapter's update on the modules it targets.
        // Decoding (a KV cache) multiplies a few rows: decode_linear.hpp.
        auto proj = [&](const Linear &l, const at::Tensor &x, LoraTarget t) {
            at::Tensor y = cache != nullptr ? decode_linear(x, l.weight, l.bias) : l.forward(x);
            return adapter ? adapter->apply(x, y, i, t, dropout_seed) : y;
        };
        at::Tensor x = layer.input_layernorm->forward(hin);
        at::Tensor q =
            proj(*attn.q_proj, x, LoraTarget::Q).view({T, c.num_attention_heads, c.head_dim});
        at::Tensor k =
            proj(*attn.k_proj, x, LoraTarget::K).view({T, c.num_key_value_heads, c.head_dim});
        at::Tensor v =
            proj(*attn.v_proj, x, LoraTarget::V).view({T, c.num_key_value_heads, c.head_dim});
        if (c.qk_norm && cos.size(-1) == c.head_dim &&
            fused::norm_rope_applies(q, attn.q_norm->used_weight())) {
            // Norm and rotation of q and k in one kernel (fused_ops.hpp).
            std::tie(q, k) =
                fused::qk_norm_rope(q, k, attn.q_norm->used_weight(), attn.k_norm->used_weight(),
                                    attn.q_norm->eps, cos, sin);
        } else {
            if (c.qk_norm) {
                q = attn.q_norm->forward(q);
                k = attn.k_norm->forward(k);
            }
            std::tie(q, k) = RotaryEmbedding::apply(q, k, cos, sin);
        }
        at::Tensor a = cache != nullptr
                           ? cached_attention(q, k, v, cache->keys(static_cast<int64_t>(i)),
                                              cache->values(static_cast<int64_t>(i)), cached, scale)
                           : packed_attention(q, k, v, packed, scale);
        at::Tensor hout = hin + proj(*attn.o_proj, a, LoraTarget::O);
        at::Tensor y = layer.post_attention_layernorm->forward(hout);
        if (layer.moe) {
            const ExpertLora lora{adapter.get(), i, dropout_seed};
            if (replay_weights.defined()) {
                // The replayed experts mixed with the recorded weights (as
                // given, no gradient to the router through them); a row of
                // -1 keeps the router's own choice and weights.
                const at::Tensor ids = replay.select(1, layer.moe->moe_index);
                MoeRouting r = layer.moe->replay(y, ids);
                if (RouterLogitsRecorder *rec = RouterLogitsRecorder::current()) rec->add(r.logits);
                r.weights = at::where(ids.select(1, 0).lt(0).unsqueeze(1), r.weights,
                                      replay_weights.select(1, layer.moe->moe_index));
                return hout + layer.moe->mix(y, r, /*decoding=*/false, adapter ? &lora : nullptr);
            }
            return hout + layer.moe->forward(y, /*decoding=*/cache != nullptr, nullptr,
                                             replay.defined()
                                                 ? replay.select(1, layer.moe->moe_index)
                                                 : at::Tensor(),
                                             adapter ? &lora : nullptr);
        }
        if (!adapter && cache == nullptr) return hout + layer.mlp->forward(y);
        const MLP &mlp = *layer.mlp;
        at::Tensor g = swiglu(proj(*mlp.gate_proj, y, LoraTarget::Gate),
                              proj(*mlp.up_proj, y, LoraTarget::Up));
        return hout + proj(*mlp.down_proj, g, LoraTarget::Down);
    };
    // Hooks (a sharded trainer) run around every layer of a training or
    // scoring pass; decoding asks for all weights up front (extend).
    WeightHooks *hooks = cache == nullptr ? hooks_ : nullptr;
    const bool recompute =
        (checkpoint_layers_ || hooks != nullptr) && cache == nullptr && at::GradMode::is_enabled();
    if (recompute) {
        // With a frozen base (LoRA) the embeddings need no gradient; the
        // layers' input must still carry one for the recomputation to run.
        if (adapter && !h.requires_grad()) h = h.detach().requires_grad_(true);
        auto shared = std::make_shared<std::function<at::Tensor(size_t, const at::Tensor &)>>(
            std::move(layer_fn));
        for (size_t i = 0; i < model->layers.size(); ++i) {
            if (hooks != nullptr) hooks->before_layer(i, false);
            h = checkpointed_layer(
                h, [shared, i](const at::Tensor &x) { return (*shared)(i, x); }, hooks, i);
            if (hooks != nullptr) hooks->after_layer(i, false);
        }
    } else {
        for (size_t i = 0; i < model->layers.size(); ++i) {
            if (hooks != nullptr) hooks->before_layer(i, false);
            h = layer_fn(i, h);
            if (hooks != nullptr) hooks->after_layer(i, false);
        }
    }
    return model->norm->forward(h);
}

at::Tensor CausalLM::hidden_states(const PackedBatch &batch) {
    check(batch.input_ids.defined() && batch.input_ids.dim() == 1,
          "forward: input_ids must be a 1-D tensor of token ids");
    check(batch.input_ids.scalar_type() == at::kLong || batch.input_ids.scalar_type() == at::kInt,
          "forward: input_ids must be int64 or int32");
    at::Tensor ids = batch.input_ids.to(options_.device).to(at::kLong);
    const int64_t T = ids.size(0);
    check_tokens(ids, "forward: input_ids");

    std::vector<int64_t> cu;
    if (batch.cu_seqlens.defined()) {
        check(batch.cu_seqlens.dim() == 1 && batch.cu_seqlens.size(0) >= 1,
              "forward: cu_seqlens must be a 1-D tensor [sequences + 1]");
        check(batch.cu_seqlens.scalar_type() == at::kLong ||
                  batch.cu_seqlens.scalar_type() == at::kInt,
              "forward: cu_seqlens must be int64 or int32");
        cu = to_host_vector(batch.cu_seqlens);
        check(cu.front() == 0,
              "forward: cu_seqlens[0] must be 0, got " + std::to_string(cu.front()));
        for (size_t i = 1; i < cu.size(); ++i)
            check(cu[i] >= cu[i - 1], "forward: cu_seqlens must not decrease (cu_seqlens[" +
                                          std::to_string(i) + "] = " + std::to_string(cu[i]) +
                                          " < " + std::to_string(cu[i - 1]) + ")");
        check(cu.back() == T, "forward: cu_seqlens ends at " + std::to_string(cu.back()) +
                                  " but input_ids has " + std::to_string(T) + " tokens");
    } else {
        cu = {0, T};
    }

    at::Tensor pos;
    if (batch.position_ids.defined()) {
        check(batch.position_ids.dim() == 1 && batch.position_ids.size(0) == T,
              "forward: position_ids must be [" + std::to_string(T) + "] like input_ids");
        check(batch.position_ids.scalar_type() == at::kLong ||
                  batch.position_ids.scalar_type() == at::kInt,
              "forward: position_ids must be int64 or int32");
        pos = batch.position_ids.to(options_.device).to(at::kLong);
        if (T > 0)
            check(pos.min().item<int64_t>() >= 0, "forward: position_ids must be non-negative");
    } else {
        std::vector<int64_t> p(static_cast<size_t>(T));
        for (size_t s = 0; s + 1 < cu.size(); ++s)
            for (int64_t t = cu[s]; t < cu[s + 1]; ++t) p[t] = t - cu[s];
        pos = long_tensor(p, options_.device);
    }
    return run_layers(ids, pos, cu, nullptr, nullptr, nullptr);
}

at::Tensor CausalLM::logits(const PackedBatch &batch) {
    at::Tensor h = hidden_states(batch);
    return compat::mm_float(h, lm_head_weight().t());
}

at::Tensor CausalLM::sequence_scores(const PackedBatch &batch) {
    if (!score)
        throw Error(
            config_.class_name() +
            " is a causal language model: sequence scores need a ...ForSequenceClassification "
            "model (a reward model with a score head)");
    at::Tensor h = hidden_states(batch);
    const int64_t T = h.size(0);
    const std::vector<int64_t> cu =
        batch.cu_seqlens.defined() ? to_host_vector(batch.cu_seqlens) : std::vector<int64_t>{0, T};
    const at::Tensor ids = batch.input_ids.to(at::kCPU).to(at::kLong).contiguous();
    const int64_t *id = ids.data_ptr<int64_t>();
    std::vector<int64_t> rows;
    for (size_t s = 0; s + 1 < cu.size(); ++s) {
        check(cu[s + 1] > cu[s], "sequence scores: sequence " + std::to_string(s) + " is empty");
        // transformers: the rightmost token that is not the pad token (argmax
        // over index * not_pad, so the first token when every token is pad).
        int64_t row = cu[s + 1] - 1;
        if (config_.pad_token_id) {
            row = cu[s];
            for (int64_t t = cu[s + 1] - 1; t > cu[s]; --t)
                if (id[t] != *config_.pad_token_id) {
                    row = t;
                    break;
                }
        }
        rows.push_back(row);
    }
    const at::Tensor index =
        at::tensor(rows, at::TensorOptions().dtype(at::kLong)).to(options_.device);
    return score->forward(h.index_select(0, index)).to(at::kFloat);
}

TokenLogprobs CausalLM::token_logprobs(const PackedBatch &batch, const at::Tensor &labels,
                                       const LogprobOptions &options) {
    check(labels.defined(), "logprobs: labels are undefined");
    at::Tensor h = hidden_states(batch);
    ChunkedLogprobs out = chunked_logprobs(
        h, lm_head_weight(), labels.to(options_.device).to(at::kLong), options.chunk_tokens,
        options.temperature, options.entropy, options.ignore_index, options.logsumexp);
    return {out.logprobs, out.entropy, out.logsumexp, options.keep_hidden ? h : at::Tensor()};
}

// -- incremental decoding ---------------------------------------------------

KVCache CausalLM::make_cache(int64_t slots, int64_t capacity) const {
    return KVCache(config_, slots, capacity, options_.dtype, options_.device);
}

at::Tensor CausalLM::extend(KVCache &cache, const std::vector<int64_t> &slots,
                            const at::Tensor &tokens, const std::vector<int64_t> &counts,
                            bool all_logits) {
    materialize_weights();
    at::NoGradGuard no_grad;
    check(cache.allocated(), "extend: the KV cache is released (call allocate())");
    check(cache.num_layers() == config_.num_hidden_layers &&
              cache.kv_heads_ == config_.num_key_value_heads && cache.head_dim_ == config_.head_dim,
          "extend: the KV cache was made for a different model shape");
    check(cache.dtype_ == options_.dtype, "extend: the KV cache dtype differs from the model's");
    check(slots.size() == counts.size(), "extend: " + std::to_string(slots.size()) + " slots but " +
                                             std::to_string(counts.size()) + " chunk lengths");
    check(!slots.empty(), "extend: no slots given");
    check(tokens.defined() && tokens.dim() == 1, "extend: tokens must be a 1-D tensor");
    check(tokens.scalar_type() == at::kLong || tokens.scalar_type() == at::kInt,
          "extend: tokens must be int64 or int32");
    std::set<int64_t> seen;
    std::vector<int64_t> starts, cu(1, 0);
    int64_t needed = 0;
    for (size_t i = 0; i < slots.size(); ++i) {
        cache.check_slot(slots[i], "extend");
        check(seen.insert(slots[i]).second,
              "extend: slot " + std::to_string(slots[i]) + " given twice");
        check(counts[i] > 0, "extend: chunk " + std::to_string(i) + " (slot " +
                                 std::to_string(slots[i]) + ") is empty");
        starts.push_back(cache.length(slots[i]));
        cu.push_back(cu.back() + counts[i]);
        needed = std::max(needed, starts.back() + counts[i]);
    }
    check(tokens.size(0) == cu.back(), "extend: chunk lengths add up to " +
                                           std::to_string(cu.back()) + " but tokens has " +
                                           std::to_string(tokens.size(0)));
    at::Tensor ids = tokens.to(options_.device).to(at::kLong);
    check_tokens(ids, "extend: tokens");
    if (needed > cache.capacity()) cache.reserve(std::max(needed, 2 * cache.capacity()));

    std::vector<int64_t> pos;
    pos.reserve(static_cast<size_t>(cu.back()));
    for (size_t i = 0; i < slots.size(); ++i)
        for (int64_t j = 0; j < counts[i]; ++j) pos.push_back(starts[i] + j);
    at::Tensor h = run_layers(ids, long_tensor(pos, options_.device), cu, &cache, &slots, &starts);
    for (size_t i = 0; i < slots.size(); ++i) cache.set_length(slots[i], starts[i] + counts[i]);
    if (!all_logits) {
        std::vector<int64_t> last;
        for (size_t i = 1; i < cu.size(); ++i) last.push_back(cu[i] - 1);
        h = h.index_select(0, long_tensor(last, options_.device));
    }
    return decode_logits(h, lm_head_weight());
}

at::Tensor CausalLM::prefill(KVCache &cache, const std::vector<int64_t> &slots,
                             const std::vector<std::vector<int64_t>> &prompts) {
    check(slots.size() == prompts.size(), "prefill: " + std::to_string(slots.size()) +
                                              " slots but " + std::to_string(prompts.size()) +
                                              " prompts");
    std::vector<int64_t> flat, counts;
    for (size_t i = 0; i < prompts.size(); ++i) {
        check(!prompts[i].empty(), "prefill: prompt " + std::to_string(i) + " is empty");
        flat.insert(flat.end(), prompts[i].begin(), prompts[i].end());
        counts.push_back(static_cast<int64_t>(prompts[i].size()));
    }
    for (int64_t s : slots) cache.clear(s);
    return extend(cache, slots, long_tensor(flat, at::kCPU), counts);
}

at::Tensor CausalLM::decode(KVCache &cache, const std::vector<int64_t> &slots,
                            const at::Tensor &tokens) {
    check(tokens.defined() && tokens.dim() == 1 &&
              tokens.size(0) == static_cast<int64_t>(slots.size()),
          "decode: tokens must be [" + std::to_string(slots.size()) + "], one per slot");
    return extend(cache, slots, tokens, std::vector<int64_t>(slots.size(), 1));
}

} // namespace rl::core
