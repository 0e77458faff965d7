// rl/core/lora.hpp: LoRA adapters over a frozen CausalLM (docs/lora.md).
//
// An adapter adds to each targeted linear layer W (out x in) of every decoder
// layer a low-rank update: y = W x + b + s * B (A (dropout(x))), with A
// [r, in], B [out, r] and s = alpha / r (alpha / sqrt(r) with rsLoRA). A
// fresh adapter has A drawn Kaiming-uniform as PEFT does (bound 1/sqrt(in))
// and B zero, so it is the identity. Adapters are not part of the model's
// module tree: the model's named_weights() and saves are the base's alone,
// and several adapters can sit over one base model at once (Policy keeps them
// by name). A forward uses an adapter when an AdapterScope names it on the
// calling thread; the trainer and the engine open that scope themselves.
//
// Files follow PEFT's layout: adapter_config.json (peft_type "LORA", r,
// lora_alpha, lora_dropout, target_modules, use_rslora,
// base_model_name_or_path, ...) and adapter_model.safetensors with tensors
// "base_model.model.model.layers.<N>.self_attn.q_proj.lora_A.weight" ([r, in])
// and "....lora_B.weight" ([out, r]).
//
// On a mixture-of-experts model the MLP names target every expert of a sparse
// layer ("...layers.<N>.mlp.experts.<E>.gate_proj...") and Qwen2-MoE's shared
// expert ("...layers.<N>.mlp.shared_expert.gate_proj..."), as PEFT names the
// per-expert nn.Linear modules of transformers 4; the router (mlp.gate), the
// shared expert's gate and the MLP of the model's dense layers are not adapted
// (PEFT over transformers 5 adapts none of them either).
#pragma once

#include <ATen/Tensor.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rl::core {

class CausalLM;

/// The linear layers of a decoder layer an adapter may target, by their PEFT
/// (Hugging Face) names.
enum class LoraTarget : uint8_t { Q, K, V, O, Gate, Up, Down };
constexpr size_t kLoraTargets = 7;
/// "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj".
const char *lora_target_name(LoraTarget t);
/// The parent module in the HF name: "self_attn" or "mlp".
const char *lora_target_parent(LoraTarget t);

/// The largest adapter rank accepted (a rank past it is refused naming the
/// key): PEFT and Tinker use 8-256; rank 65536 on a 1B model would allocate
/// gigabytes per adapter from one request field.
inline constexpr int64_t kMaxLoraRank = 1024;

struct LoraConfig {
    int64_t rank = 8;   ///< 1 <= r <= kMaxLoraRank
    double alpha = 16;  ///< lora_alpha > 0
    double dropout = 0; ///< on the adapter's input while training, in [0, 1)
    bool use_rslora = false;
    /// Module names among the seven above; "all-linear" (alone) means all of
    /// them. Kept sorted in the canonical order above, deduplicated.
    std::vector<std::string> target_modules = {"all-linear"};
    uint64_t seed = 0; ///< draws A's initial values
    /// Written to adapter_config.json (the base model's folder or hub id).
    std::string base_model_name_or_path;

    /// s = alpha / r, or alpha / sqrt(r) with use_rslora.
    double scale() const;
    /// Whether the adapter has a pair on this module.
    bool targets(LoraTarget t) const;

    /// JSON object; every key optional: "rank" (or PEFT's "r"), "alpha" (or
    /// "lora_alpha"), "dropout" (or "lora_dropout"), "target_modules" (a
    /// string or a list of strings), "use_rslora", "seed",
    /// "base_model_name_or_path". Unknown keys and bad values are errors
    /// naming the key ("lora.<key>").
    static LoraConfig from_json(const std::string &json_text);
    /// Our keys (rank, alpha, dropout, use_rslora, target_modules, seed, base_model_name_or_path).
    std::string to_json() const;
    /// Throws Error(InvalidArgument) naming the first bad field.
    void validate() const;
};

/// One adapter: the (A, B) pairs of the targeted modules of every layer, in
/// the base model's dtype and on its device.
class LoraAdapter {
public:
    /// A fresh adapter for `model` (A Kaiming-uniform from config.seed, B 0).
    LoraAdapter(const CausalLM &model, std::string name, LoraConfig config);

    const std::string &name() const { return name_; }
    const LoraConfig &config() const { return config_; }
    double scale() const { return scale_; }
    int64_t num_layers() const { return static_cast<int64_t>(pairs_.size()); }

    struct Pair {
        at::Tensor A; ///< [r, in]
        at::Tensor B; ///< [out, r]
    };
    /// The pair on `layer`'s module, or null when the adapter does not target it.
    /// On a sparse layer the MLP modules are per expert: find_expert.
    const Pair *find(size_t layer, LoraTarget t) const;

    /// The MLP of a sparse layer a pair sits on: expert e (0 <= e <
    /// num_experts) or kSharedExpert (Qwen2-MoE's shared expert); kNoExpert
    /// for the modules of find().
    static constexpr int64_t kSharedExpert = -1;
    static constexpr int64_t kNoExpert = -2;
    /// The pair on expert `expert`'s gate_proj / up_proj / down_proj of the
    /// sparse layer `layer`, or null.
    const Pair *find_expert(size_t layer, int64_t expert, LoraTarget t) const;

    /// Every pair with its place: the PEFT module path (without the
    /// "base_model.model." prefix and the ".lora_A.weight" suffix), layer by
    /// layer, attention first, then the MLP (expert by expert, then the shared
    /// expert), modules in the canonical order.
    struct Module {
        std::string path; ///< "model.layers.<N>.mlp.experts.<E>.gate_proj"
        size_t layer = 0;
        int64_t expert = kNoExpert;
        LoraTarget target = LoraTarget::Q;
        const Pair *pair = nullptr;
    };
    std::vector<Module> modules() const;

    /// (PEFT name, tensor) of every A and B, layer by layer, modules in the
    /// canonical order, A before B. These are the trainable parameters.
    std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;
    int64_t num_parameters() const;

    /// s * B A for one module ([out, in], float32): what merging adds to W.
    at::Tensor delta(size_t layer, LoraTarget t) const;
    /// The same for a pair of modules() (any expert).
    at::Tensor delta(const Module &m) const;

    /// y = base + s * B(A(dropout(x))) for one module; `base` is W x + b.
    /// Dropout only when `dropout_seed` is set (training), with a mask drawn
    /// from (dropout_seed, layer, t) so a recomputed layer sees the same one.
    at::Tensor apply(const at::Tensor &x, const at::Tensor &base, size_t layer, LoraTarget t,
                     std::optional<uint64_t> dropout_seed) const;
    /// The same for expert `expert` (or kSharedExpert) of the sparse layer
    /// `layer`: `x` holds the rows routed to it. The dropout mask comes from
    /// (dropout_seed, layer, expert, t).
    at::Tensor apply_expert(const at::Tensor &x, const at::Tensor &base, size_t layer,
                            int64_t expert, LoraTarget t,
                            std::optional<uint64_t> dropout_seed) const;

    /// The dropout seed of the next training forward: a stream from
    /// config.seed, so a run's masks repeat with its seed.
    uint64_t next_dropout_seed() const;

    /// Optimizer steps applied to this adapter (the trainer bumps it; a load
    /// restores it). Generations sampled with the adapter carry it.
    int64_t version() const { return version_.load(); }
    void set_version(int64_t v) { version_.store(v); }
    int64_t bump_version() { return ++version_; }

    /// Copies `tensors` (PEFT names, as named_parameters()) into the adapter
    /// in place. Every parameter must be present with its shape; unknown names
    /// are errors naming `source` and the tensor.
    void assign(const std::map<std::string, at::Tensor> &tensors, const std::string &source);

private:
    /// base + s B A (dropout(x)), the mask drawn from `mask_seed` when set.
    at::Tensor apply_pair(const Pair &p, const at::Tensor &x, const at::Tensor &base,
                          std::optional<uint64_t> mask_seed) const;

    std::string name_;
    LoraConfig config_;
    double scale_ = 1;
    std::vector<std::array<std::unique_ptr<Pair>, kLoraTargets>> pairs_; ///< [layer][target]
    /// Sparse layers: [layer][expert, then the shared expert][gate, up, down];
    /// empty for a dense layer.
    std::vector<std::vector<std::array<std::unique_ptr<Pair>, 3>>> expert_pairs_;
    int64_t num_experts_ = 0;
    std::atomic<int64_t> version_{0};
    mutable std::atomic<uint64_t> dropout_forwards_{0};
};

/// Selects the adapter that the model's forwards (hidden_states, logits,
/// token_logprobs, extend/prefill/decode) use on this thread while the scope
/// lives; null selects the base model. Scopes nest (the inner one wins until
/// it ends). `training` turns on the adapter's dropout (each forward draws a
/// fresh mask seed); forwards without grad mode never apply dropout.
class AdapterScope {
public:
    explicit AdapterScope(std::shared_ptr<const LoraAdapter> adapter, bool training = false);
    ~AdapterScope();
    AdapterScope(const AdapterScope &) = delete;
    AdapterScope &operator=(const AdapterScope &) = delete;

    /// The adapter selected on this thread (null: none).
    static const LoraAdapter *current();
    static std::shared_ptr<const LoraAdapter> current_shared();
    static bool training();

private:
    std::shared_ptr<const LoraAdapter> prev_;
    bool prev_training_ = false;
};

// -- files ------------------------------------------------------------------

/// Writes `dir` (created if needed, replaced atomically when it exists):
/// adapter_config.json and adapter_model.safetensors in PEFT's layout.
void save_adapter(const LoraAdapter &adapter, const std::string &dir);

/// Reads a PEFT LoRA folder into a new adapter named `name` over `model`:
/// per-module keys, or on an MoE model PEFT's fused-expert layout
/// (target_parameters mlp.experts.gate_up_proj / down_proj, turned into exact
/// per-expert pairs; docs/lora.md). Refuses (naming the file and key or
/// tensor) anything but a plain LoRA of the decoder's linear layers: another
/// peft_type, DoRA, bias != "none", modules_to_save, layers_to_transform,
/// rank/alpha patterns that give a module another rank or scale (but PEFT's
/// fused gate_up_proj at twice the rank), other target_parameters, tensors of
/// unknown modules or wrong shapes.
std::shared_ptr<LoraAdapter> load_adapter(const CausalLM &model, const std::string &dir,
                                          const std::string &name);

/// Reads the LoRA config of a PEFT folder (adapter_config.json) alone (the
/// targets target_parameters implies included; rank/alpha patterns refused,
/// as only load_adapter can check them against a model).
LoraConfig read_adapter_config(const std::string &dir);

/// The base weights with the adapter merged in (W + s B A for every targeted
/// module, computed in float32, stored in the model's dtype), by HF name in
/// checkpoint order; untargeted weights are the base tensors themselves.
std::vector<std::pair<std::string, at::Tensor>> merged_weights(const CausalLM &model,
                                                               const LoraAdapter &adapter);

/// Writes an HF model folder (as save_pretrained, atomically) whose weights
/// are merged_weights(model, adapter): it loads with load_pretrained /
/// rl_model_load and gives the logits of base + adapter. The base model is
/// not changed.
void save_merged(const CausalLM &model, const LoraAdapter &adapter, const std::string &dir);

} // namespace rl::core
