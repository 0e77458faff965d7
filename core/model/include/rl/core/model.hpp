// Decoder-only transformer of the Llama / Qwen2 / Qwen3 families as a plain
// libtorch module tree. Parameter names are the Hugging Face ones
// ("model.layers.0.self_attn.q_proj.weight"), so named_parameters() is the
// checkpoint layout, and the optimizer, LoRA and weight sync iterate it.
//
// Inputs are packed: one flat token sequence [T] with cu_seqlens [B+1]
// (sequence b is tokens cu_seqlens[b] .. cu_seqlens[b+1]-1) and position ids;
// attention never crosses a sequence boundary.
#pragma once

#include "rl/core/config.hpp"
#include "rl/core/kv_cache.hpp"

#include <ATen/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rl::core {

/// Packed sequences. All tensors 1-D int64 (cu_seqlens may be int32).
struct PackedBatch {
    at::Tensor input_ids;    ///< [T]
    at::Tensor cu_seqlens;   ///< [B+1], 0 = first, T = last, non-decreasing
    at::Tensor position_ids; ///< [T]; undefined: 0, 1, ... within each sequence

    /// Packs token lists (positions 0..len-1 each).
    static PackedBatch from_sequences(const std::vector<std::vector<int64_t>> &seqs);
    int64_t num_tokens() const { return input_ids.defined() ? input_ids.size(0) : 0; }
};

struct LogprobOptions {
    /// Tokens per slice of the [tokens x vocab] projection; bounds the fp32
    /// memory of the log-softmax to chunk_tokens x vocab.
    int64_t chunk_tokens = 512;
    bool entropy = false;
    /// Also log Z_t = logsumexp of the raw (untempered) logits of each token,
    /// differentiable (z-loss; docs/losses.md).
    bool logsumexp = false;
    /// Logits are divided by this before the softmax (the sampling temperature).
    double temperature = 1.0;
    /// Labels equal to this get logprob 0 and no gradient.
    int64_t ignore_index = -100;
    /// Also return the final-norm hidden states (for a value head).
    bool keep_hidden = false;
};

struct TokenLogprobs {
    at::Tensor logprobs;  ///< [T] fp32, log p(label_t | tokens <= t)
    at::Tensor entropy;   ///< [T] fp32 when asked, else undefined
    at::Tensor logsumexp; ///< [T] fp32 log Z of the raw logits when asked, else undefined
    at::Tensor hidden;    ///< [T, hidden] when keep_hidden, else undefined
};

struct ModelOptions {
    at::ScalarType dtype = at::kFloat;
    at::Device device = at::kCPU;
};

// -- building blocks --------------------------------------------------------

class Linear : public torch::nn::Module {
public:
    Linear(int64_t in, int64_t out, bool bias, const ModelOptions &o);
    at::Tensor forward(const at::Tensor &x) const;
    at::Tensor weight;
    at::Tensor bias; ///< undefined without bias
};

class RMSNorm : public torch::nn::Module {
public:
    RMSNorm(int64_t dim, double eps, const ModelOptions &o);
    /// Scales by used_weight().
    at::Tensor forward(const at::Tensor &x) const;
    /// The weight a forward on this thread uses: the NormWeightsScope's
    /// replacement for this module when one is open and holds one, else
    /// `weight`.
    const at::Tensor &used_weight() const;
    at::Tensor weight;
    double eps;
};

/// Replacement weights for some RMSNorm modules, by module (same shape, dtype
/// and device as the module's weight).
using NormWeights = std::unordered_map<const RMSNorm *, at::Tensor>;

/// While a scope lives, every forward on the calling thread (training
/// forwards, token_logprobs, extend / prefill / decode) scales by the scope's
/// weights instead of the modules' own; the parameters are not touched, so
/// another thread (the trainer) keeps reading the clean ones. The rollout
/// engine opens one for its QeRL noise (engine.hpp). `weights` (not owned)
/// must outlive the scope; null or empty: the modules' own weights. Scopes
/// nest (the inner one wins until it ends).
class NormWeightsScope {
public:
    explicit NormWeightsScope(const NormWeights *weights);
    ~NormWeightsScope();
    NormWeightsScope(const NormWeightsScope &) = delete;
    NormWeightsScope &operator=(const NormWeightsScope &) = delete;
    /// The scope's weights on this thread, or null.
    static const NormWeights *current();

private:
    const NormWeights *previous_;
};

class Attention : public torch::nn::Module {
public:
    Attention(const ModelConfig &c, const ModelOptions &o);
    std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
    std::shared_ptr<RMSNorm> q_norm, k_norm; ///< Qwen3 only
};

class MLP : public torch::nn::Module {
public:
    /// SwiGLU of width `intermediate_size` (0: c.intermediate_size).
    MLP(const ModelConfig &c, const ModelOptions &o, int64_t intermediate_size = 0);
    at::Tensor forward(const at::Tensor &x) const;
    std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
};

class SparseMoeBlock; // moe.hpp

class DecoderLayer : public torch::nn::Module {
public:
    DecoderLayer(const ModelConfig &c, const ModelOptions &o, int64_t index);
    std::shared_ptr<Attention> self_attn;
    std::shared_ptr<MLP> mlp; ///< null on a sparse layer
    std::shared_ptr<SparseMoeBlock>
        moe; ///< "mlp" of a sparse layer (config.is_moe_layer), else null
    std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
};

class Embedding : public torch::nn::Module {
public:
    Embedding(int64_t num, int64_t dim, const ModelOptions &o);
    at::Tensor weight;
};

class DecoderModel : public torch::nn::Module {
public:
    DecoderModel(const ModelConfig &c, const ModelOptions &o);
    std::shared_ptr<Embedding> embed_tokens;
    torch::nn::ModuleList layers_list;
    std::vector<std::shared_ptr<DecoderLayer>> layers;
    std::shared_ptr<RMSNorm> norm;
};

// -- the model --------------------------------------------------------------

class RotaryEmbedding;

/// Lets a sharded trainer (fsdp) hold a decoder layer's weights only while the
/// layer runs. The model calls before_layer / after_layer around each layer's
/// forward (backward = false) and around its recomputation and backward when
/// layers are checkpointed (backward = true), and materialize() before any
/// use of the full weights outside of the layer loop (decoding, saving).
class WeightHooks {
public:
    virtual ~WeightHooks() = default;
    virtual void before_layer(size_t layer, bool backward) = 0;
    virtual void after_layer(size_t layer, bool backward) = 0;
    virtual void materialize() = 0;
};

class CausalLM : public torch::nn::Module {
public:
    /// Allocates (uninitialized) parameters; see init_weights / load_pretrained.
    explicit CausalLM(ModelConfig config, ModelOptions options = {});
    ~CausalLM() override;

    const ModelConfig &config() const { return config_; }
    at::ScalarType dtype() const { return options_.dtype; }
    at::Device device() const { return options_.device; }

    /// Seeded initialization as transformers does it: normal(0, std) for linear
    /// and embedding weights, zeros for biases, ones for norm weights.
    void init_weights(uint64_t seed, double std = 0.02);

    /// Final-norm hidden states [T, hidden].
    at::Tensor hidden_states(const PackedBatch &batch);
    /// Full logits [T, vocab] in fp32 (tests and small inputs; the training
    /// path is token_logprobs).
    at::Tensor logits(const PackedBatch &batch);
    /// log p(labels[t]) for every token (labels [T] int64, usually the next
    /// token), computed in chunks, differentiable w.r.t. the parameters.
    TokenLogprobs token_logprobs(const PackedBatch &batch, const at::Tensor &labels,
                                 const LogprobOptions &options = {});
    /// The output projection ([vocab, hidden]): lm_head.weight, or the
    /// embedding when tie_word_embeddings. A sequence classifier has none
    /// (an error that says so).
    const at::Tensor &lm_head_weight() const;
    /// A sequence classifier (config().is_classifier(): a reward model):
    /// float32 scores [sequences, num_labels], each sequence's `score` head
    /// output at its last token that is not pad_token_id (its first token when
    /// all are; its last token when the config has no pad_token_id), the
    /// token transformers' ...ForSequenceClassification pools.
    at::Tensor sequence_scores(const PackedBatch &batch);

    // -- incremental decoding (no autograd) --------------------------------

    /// A cache sized for this model, in its dtype and on its device.
    KVCache make_cache(int64_t slots, int64_t capacity) const;
    /// Appends tokens to cache slots and runs them. `tokens` is packed: the
    /// chunk for slots[i] is tokens[cu[i] .. cu[i+1]) with cu = cumsum(counts).
    /// A chunk continues its slot at position cache.length(slot). Returns fp32
    /// logits of each chunk's last token [slots.size(), vocab] (every chunk
    /// must be non-empty), or of every appended token [T, vocab] when
    /// all_logits. The capacity grows as needed.
    at::Tensor extend(KVCache &cache, const std::vector<int64_t> &slots, const at::Tensor &tokens,
                      const std::vector<int64_t> &counts, bool all_logits = false);
    /// Prefill: clears the slots, then extends them with the prompts.
    at::Tensor prefill(KVCache &cache, const std::vector<int64_t> &slots,
                       const std::vector<std::vector<int64_t>> &prompts);
    /// One token per slot: tokens [slots.size()] int64.
    at::Tensor decode(KVCache &cache, const std::vector<int64_t> &slots, const at::Tensor &tokens);

    // -- parameters --------------------------------------------------------

    /// Recompute each decoder layer in the backward instead of keeping its
    /// activations (training only; decoding and no-grad forwards ignore it).
    void set_activation_checkpointing(bool on) { checkpoint_layers_ = on; }
    bool activation_checkpointing() const { return checkpoint_layers_; }

    /// Installs hooks (not owned; null removes them). Layers are then always
    /// checkpointed in grad mode: released weights cannot serve a backward.
    void set_weight_hooks(WeightHooks *hooks) { hooks_ = hooks; }
    WeightHooks *weight_hooks() const { return hooks_; }
    /// Makes every weight present (a no-op without hooks).
    void materialize_weights() const {
        if (hooks_ != nullptr) hooks_->materialize();
    }

    /// (HF name, parameter) in checkpoint order.
    std::vector<std::pair<std::string, at::Tensor>> named_weights() const;
    int64_t num_parameters() const;

    /// Non-weight files of the Hugging Face folder (tokenizer.json,
    /// tokenizer_config.json, ...) carried from load to save, by file name.
    std::map<std::string, std::string> &aux_files() { return aux_files_; }
    const std::map<std::string, std::string> &aux_files() const { return aux_files_; }

    std::shared_ptr<DecoderModel> model;
    std::shared_ptr<Linear> lm_head; ///< null when tied or a classifier
    std::shared_ptr<Linear> score;   ///< the classifier's head; null for a causal LM

private:
    at::Tensor run_layers(const at::Tensor &input_ids, const at::Tensor &position_ids,
                          const std::vector<int64_t> &cu, KVCache *cache,
                          const std::vector<int64_t> *slots, const std::vector<int64_t> *starts);
    void check_tokens(const at::Tensor &ids, const char *what) const;

    ModelConfig config_;
    ModelOptions options_;
    std::unique_ptr<RotaryEmbedding> rope_;
    std::map<std::string, std::string> aux_files_;
    bool checkpoint_layers_ = false;
    WeightHooks *hooks_ = nullptr;
};

} // namespace rl::core
