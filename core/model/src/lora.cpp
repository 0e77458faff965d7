#include "rl/core/lora.hpp"

#include "lora_peft.hpp"

#include "rl/core/atomic_file.hpp"
#include "rl/core/error.hpp"
#include "rl/core/model.hpp"
#include "rl/core/pretrained.hpp"
#include "rl/core/tensor_io.hpp"
#include "rl/core/json.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/StringUtil.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

namespace rl::core {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char *kConfigFile = "adapter_config.json";
constexpr const char *kWeightsFile = "adapter_model.safetensors";

constexpr LoraTarget kAll[kLoraTargets] = {LoraTarget::Q,   LoraTarget::K,    LoraTarget::V,
                                           LoraTarget::O,   LoraTarget::Gate, LoraTarget::Up,
                                           LoraTarget::Down};

[[noreturn]] void invalid(const std::string &msg) {
    throw Error(ErrorKind::InvalidArgument, msg);
}

std::optional<LoraTarget> parse_target(const std::string &name) {
    for (LoraTarget t : kAll)
        if (name == lora_target_name(t)) return t;
    return std::nullopt;
}

std::string valid_targets() {
    std::string s;
    for (LoraTarget t : kAll) s += std::string(s.empty() ? "" : ", ") + lora_target_name(t);
    return s + ", all-linear";
}

// Canonical order, deduplicated; "all-linear" stays alone.
std::vector<std::string> normalize_targets(const std::vector<std::string> &names,
                                           const std::string &what) {
    if (names.empty()) invalid(what + " is empty; valid: " + valid_targets());
    std::set<size_t> seen;
    for (const auto &n : names) {
        if (n == "all-linear") {
            if (names.size() != 1) invalid(what + ": 'all-linear' must stand alone");
            return {"all-linear"};
        }
        auto t = parse_target(n);
        if (!t) invalid(what + ": unknown module '" + n + "'; valid: " + valid_targets());
        seen.insert(static_cast<size_t>(*t));
    }
    std::vector<std::string> out;
    for (size_t i : seen) out.push_back(lora_target_name(kAll[i]));
    if (out.size() == kLoraTargets) return {"all-linear"};
    return out;
}

// (in, out) of a module of `c`; `mlp_width` is the intermediate size of the
// MLP the module belongs to (dense, expert or shared expert).
std::pair<int64_t, int64_t> module_shape(const ModelConfig &c, LoraTarget t, int64_t mlp_width) {
    switch (t) {
        case LoraTarget::Q:
            return {c.hidden_size, c.q_size()};
        case LoraTarget::K:
        case LoraTarget::V:
            return {c.hidden_size, c.kv_size()};
        case LoraTarget::O:
            return {c.q_size(), c.hidden_size};
        case LoraTarget::Gate:
        case LoraTarget::Up:
            return {c.hidden_size, mlp_width};
        case LoraTarget::Down:
            return {mlp_width, c.hidden_size};
    }
    return {0, 0};
}

constexpr LoraTarget kMlp[3] = {LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down};

size_t mlp_index(LoraTarget t) {
    return static_cast<size_t>(t) - static_cast<size_t>(LoraTarget::Gate);
}

bool is_mlp(LoraTarget t) {
    return t == LoraTarget::Gate || t == LoraTarget::Up || t == LoraTarget::Down;
}

uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

thread_local std::shared_ptr<const LoraAdapter> tl_adapter;
thread_local bool tl_training = false;

// Writes a folder through a temporary sibling and swaps it in.
template <typename Fill>
void write_folder(const std::string &dir, const char *what, Fill fill) {
    const fs::path target = fs::path(dir).lexically_normal();
    std::error_code ec;
    if (fs::exists(target, ec) && !fs::is_directory(target, ec))
        invalid(std::string(what) + ": '" + target.string() + "' exists and is not a folder");
    if (!target.parent_path().empty()) fs::create_directories(target.parent_path(), ec);
    const fs::path tmp = target.string() + ".tmp-" + std::to_string(::getpid());
    const fs::path old = target.string() + ".old-" + std::to_string(::getpid());
    fs::remove_all(tmp, ec);
    fs::remove_all(old, ec);
    try {
        fs::create_directories(tmp);
        fill(tmp.string());
        fsync_directory(tmp.string());
        if (fs::exists(target)) fs::rename(target, old);
        fs::rename(tmp, target);
        fs::remove_all(old, ec);
        if (!target.parent_path().empty()) fsync_directory(target.parent_path().string());
    } catch (const std::filesystem::filesystem_error &e) {
        fs::remove_all(tmp, ec);
        throw Error(ErrorKind::Io,
                    std::string(what) + ": cannot write '" + target.string() + "': " + e.what());
    } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
    }
}

} // namespace

const char *lora_target_name(LoraTarget t) {
    switch (t) {
        case LoraTarget::Q:
            return "q_proj";
        case LoraTarget::K:
            return "k_proj";
        case LoraTarget::V:
            return "v_proj";
        case LoraTarget::O:
            return "o_proj";
        case LoraTarget::Gate:
            return "gate_proj";
        case LoraTarget::Up:
            return "up_proj";
        case LoraTarget::Down:
            return "down_proj";
    }
    return "?";
}

const char *lora_target_parent(LoraTarget t) {
    return t == LoraTarget::Gate || t == LoraTarget::Up || t == LoraTarget::Down ? "mlp"
                                                                                 : "self_attn";
}

// -- config -------------------------------------------------------------------

double LoraConfig::scale() const {
    return use_rslora ? alpha / std::sqrt(static_cast<double>(rank))
                      : alpha / static_cast<double>(rank);
}

bool LoraConfig::targets(LoraTarget t) const {
    for (const auto &n : target_modules)
        if (n == "all-linear" || n == lora_target_name(t)) return true;
    return false;
}

void LoraConfig::validate() const {
    if (rank < 1 || rank > kMaxLoraRank)
        invalid("lora.rank must be an integer in [1, " + std::to_string(kMaxLoraRank) + "], got " +
                std::to_string(rank));
    if (!(alpha > 0) || !std::isfinite(alpha))
        invalid("lora.alpha must be a finite number > 0, got " + json(alpha).dump());
    if (!(dropout >= 0 && dropout < 1))
        invalid("lora.dropout must be in [0, 1), got " + json(dropout).dump());
    normalize_targets(target_modules, "lora.target_modules");
}

LoraConfig LoraConfig::from_json(const std::string &text) {
    LoraConfig c;
    if (text.empty()) return c;
    const json j = parse_json(text, "lora config");
    if (j.is_null()) return c;
    if (!j.is_object()) invalid("lora config must be a JSON object");
    auto key = [](const std::string &k) { return "lora." + k; };
    for (const auto &kv : j.items()) {
        const std::string &k = kv.key();
        const json &v = kv.value();
        if (k == "rank" || k == "r") {
            if (!v.is_number_integer()) invalid(key(k) + " must be an integer, got " + v.dump());
            c.rank = v.get<int64_t>();
        } else if (k == "alpha" || k == "lora_alpha") {
            if (!v.is_number()) invalid(key(k) + " must be a number, got " + v.dump());
            c.alpha = v.get<double>();
        } else if (k == "dropout" || k == "lora_dropout") {
            if (!v.is_number()) invalid(key(k) + " must be a number, got " + v.dump());
            c.dropout = v.get<double>();
        } else if (k == "use_rslora") {
            if (!v.is_boolean()) invalid(key(k) + " must be true or false, got " + v.dump());
            c.use_rslora = v.get<bool>();
        } else if (k == "target_modules") {
            std::vector<std::string> names;
            if (v.is_string()) {
                names.push_back(v.get<std::string>());
            } else if (v.is_array()) {
                for (size_t i = 0; i < v.size(); ++i) {
                    if (!v[i].is_string())
                        invalid(key(k) + "[" + std::to_string(i) + "] must be a string, got " +
                                v[i].dump());
                    names.push_back(v[i].get<std::string>());
                }
            } else {
                invalid(key(k) + " must be a module name or a list of them, got " + v.dump());
            }
            c.target_modules = normalize_targets(names, key(k));
        } else if (k == "seed") {
            if (!v.is_number_integer() || v.get<int64_t>() < 0)
                invalid(key(k) + " must be an integer >= 0, got " + v.dump());
            c.seed = v.get<uint64_t>();
        } else if (k == "base_model_name_or_path") {
            if (!v.is_string() && !v.is_null()) invalid(key(k) + " must be a string");
            c.base_model_name_or_path = v.is_string() ? v.get<std::string>() : "";
        } else {
            invalid("lora config: unknown key '" + k +
                    "'; valid: rank (r), alpha (lora_alpha), dropout (lora_dropout), "
                    "target_modules, use_rslora, seed, base_model_name_or_path");
        }
    }
    c.validate();
    return c;
}

std::string LoraConfig::to_json() const {
    return json{{"rank", rank},
                {"alpha", alpha},
                {"dropout", dropout},
                {"use_rslora", use_rslora},
                {"target_modules", target_modules},
                {"seed", seed},
                {"base_model_name_or_path", base_model_name_or_path}}
        .dump();
}

// -- adapter ------------------------------------------------------------------

LoraAdapter::LoraAdapter(const CausalLM &model, std::string name, LoraConfig config)
    : name_(std::move(name)), config_(std::move(config)) {
    config_.validate();
    config_.target_modules = normalize_targets(config_.target_modules, "lora.target_modules");
    scale_ = config_.scale();
    const ModelConfig &mc = model.config();
    // transformers >= 5 stores each expert's gate and up projections fused
    // (experts.gate_up_proj); PEFT (0.21) converts a per-expert adapter onto
    // it only when both are targeted, and refuses one without the other.
    if (mc.has_moe() && config_.targets(LoraTarget::Gate) != config_.targets(LoraTarget::Up))
        invalid(std::string("lora.target_modules: ") +
                (config_.targets(LoraTarget::Gate) ? "gate_proj without up_proj"
                                                   : "up_proj without gate_proj") +
                " on " + architecture_name(mc.architecture) +
                ": transformers >= 5 fuses each expert's gate and up projections (gate_up_proj) "
                "and PEFT cannot load an adapter on one of them; target both");
    const auto opts = at::TensorOptions().dtype(model.dtype()).device(model.device());
    auto gen = at::make_generator<at::CPUGeneratorImpl>(config_.seed);
    at::NoGradGuard no_grad;
    auto draw = [&](LoraTarget t, int64_t mlp_width) {
        const auto [in, out] = module_shape(mc, t, mlp_width);
        // PEFT: kaiming_uniform_(A, a=sqrt(5)): bound = 1 / sqrt(fan_in),
        // drawn in float32 on the CPU so values do not depend on dtype or device.
        const double bound = 1.0 / std::sqrt(static_cast<double>(in));
        at::Tensor a = at::empty({config_.rank, in}, at::kFloat);
        a.uniform_(-bound, bound, gen);
        auto p = std::make_unique<Pair>();
        p->A = a.to(opts).set_requires_grad(true);
        p->B = at::zeros({out, config_.rank}, opts).set_requires_grad(true);
        return p;
    };
    const auto L = static_cast<size_t>(mc.num_hidden_layers);
    pairs_.resize(L);
    expert_pairs_.resize(L);
    num_experts_ = mc.num_experts;
    // Layer by layer, the attention first, then the MLP (a sparse layer's
    // experts in order, then its shared expert): the order of the draws.
    for (size_t l = 0; l < L; ++l) {
        for (LoraTarget t : kAll)
            if (!is_mlp(t) && config_.targets(t)) pairs_[l][static_cast<size_t>(t)] = draw(t, 0);
        if (!mc.is_moe_layer(static_cast<int64_t>(l))) {
            // The dense layers of an MoE model (mlp_only_layers,
            // decoder_sparse_step) keep their MLP: PEFT (0.21) over
            // transformers >= 5 moves the MLP names to the fused experts and
            // adapts no dense MLP, so a pair here would not load there.
            if (!mc.has_moe())
                for (LoraTarget t : kMlp)
                    if (config_.targets(t))
                        pairs_[l][static_cast<size_t>(t)] = draw(t, mc.intermediate_size);
            continue;
        }
        const bool shared = mc.shared_expert_intermediate_size > 0;
        expert_pairs_[l].resize(static_cast<size_t>(mc.num_experts + (shared ? 1 : 0)));
        for (size_t e = 0; e < expert_pairs_[l].size(); ++e) {
            const bool is_shared = static_cast<int64_t>(e) == mc.num_experts;
            for (LoraTarget t : kMlp)
                if (config_.targets(t))
                    expert_pairs_[l][e][mlp_index(t)] =
                        draw(t, is_shared ? mc.shared_expert_intermediate_size
                                          : mc.moe_intermediate_size);
        }
    }
}

const LoraAdapter::Pair *LoraAdapter::find(size_t layer, LoraTarget t) const {
    if (layer >= pairs_.size()) return nullptr;
    return pairs_[layer][static_cast<size_t>(t)].get();
}

const LoraAdapter::Pair *LoraAdapter::find_expert(size_t layer, int64_t expert,
                                                  LoraTarget t) const {
    if (layer >= expert_pairs_.size() || !is_mlp(t)) return nullptr;
    const auto &slots = expert_pairs_[layer];
    const int64_t slot = expert == kSharedExpert ? num_experts_ : expert;
    if (slot < 0 || slot >= static_cast<int64_t>(slots.size())) return nullptr;
    return slots[static_cast<size_t>(slot)][mlp_index(t)].get();
}

std::vector<LoraAdapter::Module> LoraAdapter::modules() const {
    std::vector<Module> out;
    for (size_t l = 0; l < pairs_.size(); ++l) {
        const std::string layer = "model.layers." + std::to_string(l) + ".";
        for (LoraTarget t : kAll)
            if (const Pair *p = find(l, t))
                out.push_back({layer + lora_target_parent(t) + "." + lora_target_name(t), l,
                               kNoExpert, t, p});
        const auto &slots = expert_pairs_[l];
        for (size_t e = 0; e < slots.size(); ++e) {
            const bool shared = static_cast<int64_t>(e) == num_experts_;
            const std::string parent = shared ? layer + "mlp.shared_expert."
                                              : layer + "mlp.experts." + std::to_string(e) + ".";
            for (LoraTarget t : kMlp)
                if (const Pair *p = slots[e][mlp_index(t)].get())
                    out.push_back({parent + lora_target_name(t), l,
                                   shared ? kSharedExpert : static_cast<int64_t>(e), t, p});
        }
    }
    return out;
}

std::vector<std::pair<std::string, at::Tensor>> LoraAdapter::named_parameters() const {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const Module &m : modules()) {
        const std::string base = "base_model.model." + m.path;
        out.emplace_back(base + ".lora_A.weight", m.pair->A);
        out.emplace_back(base + ".lora_B.weight", m.pair->B);
    }
    return out;
}

int64_t LoraAdapter::num_parameters() const {
    int64_t n = 0;
    for (const auto &kv : named_parameters()) n += kv.second.numel();
    return n;
}

at::Tensor LoraAdapter::delta(size_t layer, LoraTarget t) const {
    const Pair *p = find(layer, t);
    check(p != nullptr, "adapter '" + name_ + "' has no " + lora_target_name(t) + " on layer " +
                            std::to_string(layer));
    at::NoGradGuard no_grad;
    return at::matmul(p->B.to(at::kFloat), p->A.to(at::kFloat)) * scale_;
}

at::Tensor LoraAdapter::delta(const Module &m) const {
    check(m.pair != nullptr, "adapter '" + name_ + "' has no pair on " + m.path);
    at::NoGradGuard no_grad;
    return at::matmul(m.pair->B.to(at::kFloat), m.pair->A.to(at::kFloat)) * scale_;
}

at::Tensor LoraAdapter::apply_pair(const Pair &p, const at::Tensor &x, const at::Tensor &base,
                                   std::optional<uint64_t> mask_seed) const {
    at::Tensor xin = x;
    if (mask_seed && config_.dropout > 0) {
        // The same (seed, module) gives the same mask: a layer recomputed in
        // the backward (activation checkpointing) drops what its forward did.
        auto gen = at::make_generator<at::CPUGeneratorImpl>(*mask_seed);
        const double keep = 1.0 - config_.dropout;
        at::Tensor mask = at::empty(x.sizes(), at::kFloat);
        mask.bernoulli_(keep, gen);
        xin = x * (mask / keep).to(x.options());
    }
    return base + at::linear(at::linear(xin, p.A), p.B) * scale_;
}

at::Tensor LoraAdapter::apply(const at::Tensor &x, const at::Tensor &base, size_t layer,
                              LoraTarget t, std::optional<uint64_t> dropout_seed) const {
    const Pair *p = find(layer, t);
    if (p == nullptr) return base;
    std::optional<uint64_t> mask_seed;
    if (dropout_seed)
        mask_seed =
            mix(mix(*dropout_seed ^ static_cast<uint64_t>(layer)) ^ static_cast<uint64_t>(t));
    return apply_pair(*p, x, base, mask_seed);
}

at::Tensor LoraAdapter::apply_expert(const at::Tensor &x, const at::Tensor &base, size_t layer,
                                     int64_t expert, LoraTarget t,
                                     std::optional<uint64_t> dropout_seed) const {
    const Pair *p = find_expert(layer, expert, t);
    if (p == nullptr) return base;
    std::optional<uint64_t> mask_seed;
    if (dropout_seed)
        mask_seed =
            mix(mix(mix(*dropout_seed ^ static_cast<uint64_t>(layer)) ^ static_cast<uint64_t>(t)) ^
                static_cast<uint64_t>(expert + 3));
    return apply_pair(*p, x, base, mask_seed);
}

uint64_t LoraAdapter::next_dropout_seed() const {
    return mix(config_.seed ^ mix(++dropout_forwards_));
}

void LoraAdapter::assign(const std::map<std::string, at::Tensor> &tensors,
                         const std::string &source) {
    const auto params = named_parameters();
    std::set<std::string> known;
    for (const auto &kv : params) {
        known.insert(kv.first);
        auto it = tensors.find(kv.first);
        if (it == tensors.end())
            invalid(source + ": tensor '" + kv.first + "' is missing (adapter '" + name_ +
                    "' targets " + c10::Join(", ", config_.target_modules) + " with rank " +
                    std::to_string(config_.rank) + ")");
        if (!it->second.sizes().equals(kv.second.sizes()))
            invalid(source + ": tensor '" + kv.first + "' has shape " +
                    c10::str(it->second.sizes()) + ", expected " + c10::str(kv.second.sizes()));
    }
    for (const auto &kv : tensors)
        if (!known.count(kv.first))
            invalid(source + ": tensor '" + kv.first +
                    "' is not a LoRA weight of this adapter's modules" +
                    (kv.first.find(".mlp.experts.lora_") != std::string::npos ||
                             kv.first.find(".mlp.experts.base_layer.") != std::string::npos
                         ? " (a LoRA pair on fused expert parameters, as PEFT writes over "
                           "transformers >= 5, that the config's target_parameters does not "
                           "name)"
                         : ""));
    at::NoGradGuard no_grad;
    for (const auto &kv : params) kv.second.copy_(tensors.at(kv.first));
}

// -- scope --------------------------------------------------------------------

AdapterScope::AdapterScope(std::shared_ptr<const LoraAdapter> adapter, bool training)
    : prev_(std::move(tl_adapter)), prev_training_(tl_training) {
    tl_adapter = std::move(adapter);
    tl_training = training;
}

AdapterScope::~AdapterScope() {
    tl_adapter = std::move(prev_);
    tl_training = prev_training_;
}

const LoraAdapter *AdapterScope::current() {
    return tl_adapter.get();
}
std::shared_ptr<const LoraAdapter> AdapterScope::current_shared() {
    return tl_adapter;
}
bool AdapterScope::training() {
    return tl_training;
}

// -- files --------------------------------------------------------------------

void save_adapter(const LoraAdapter &adapter, const std::string &dir) {
    const LoraConfig &c = adapter.config();
    json targets = c.target_modules;
    if (c.target_modules.size() == 1 && c.target_modules[0] == "all-linear") {
        // PEFT resolves "all-linear" at load time (and excludes the output
        // layer): write the explicit list so every version reads it alike.
        targets = json::array();
        for (LoraTarget t : kAll) targets.push_back(lora_target_name(t));
    }
    const json cfg = {{"peft_type", "LORA"},
                      {"task_type", "CAUSAL_LM"},
                      {"r", c.rank},
                      {"lora_alpha", c.alpha},
                      {"lora_dropout", c.dropout},
                      {"target_modules", targets},
                      {"use_rslora", c.use_rslora},
                      {"use_dora", false},
                      {"bias", "none"},
                      {"fan_in_fan_out", false},
                      {"init_lora_weights", true},
                      {"inference_mode", true},
                      {"modules_to_save", nullptr},
                      {"layers_to_transform", nullptr},
                      {"rank_pattern", json::object()},
                      {"alpha_pattern", json::object()},
                      {"base_model_name_or_path", c.base_model_name_or_path},
                      {"revision", nullptr}};
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto &kv : adapter.named_parameters())
        tensors.emplace_back(kv.first, kv.second.detach().to(at::kCPU).contiguous());
    write_folder(dir, "save_adapter", [&](const std::string &tmp) {
        atomic_write_file((fs::path(tmp) / kConfigFile).string(), cfg.dump(2) + "\n");
        save_safetensors((fs::path(tmp) / kWeightsFile).string(), tensors, {{"format", "pt"}});
    });
}

LoraConfig read_adapter_config(const std::string &dir) {
    const peft::AdapterFile f = peft::read_adapter_file(dir);
    // Per-module ranks and alphas are checked against a model (load_adapter).
    for (const auto *p : {&f.rank_pattern, &f.alpha_pattern})
        if (!p->empty())
            invalid("'" + f.path +
                    "': " + (p == &f.rank_pattern ? "rank_pattern" : "alpha_pattern") +
                    " is set; per-module ranks and alphas are read only with the model "
                    "(load_adapter)");
    return f.config;
}

std::shared_ptr<LoraAdapter> load_adapter(const CausalLM &model, const std::string &dir,
                                          const std::string &name) {
    const peft::AdapterFile file = peft::read_adapter_file(dir);
    const std::string wpath = (fs::path(dir) / kWeightsFile).string();
    if (!fs::exists(wpath))
        throw Error(ErrorKind::NotFound, "LoRA adapter '" + dir + "' has no " + kWeightsFile);
    std::map<std::string, at::Tensor> tensors = load_safetensors(wpath);
    // PEFT may keep the adapter name in the keys ("...lora_A.default.weight").
    std::map<std::string, at::Tensor> named;
    for (auto &kv : tensors) {
        std::string k = kv.first;
        for (const char *ab : {".lora_A.", ".lora_B."}) {
            const size_t at = k.find(ab);
            if (at == std::string::npos) continue;
            const size_t rest = at + std::string(ab).size();
            if (k.compare(rest, std::string::npos, "weight") != 0) {
                const size_t dot = k.find('.', rest);
                if (dot != std::string::npos &&
                    k.compare(dot + 1, std::string::npos, "weight") == 0)
                    k = k.substr(0, rest) + "weight";
            }
        }
        named[k] = kv.second;
    }
    auto adapter = std::make_shared<LoraAdapter>(model, name, file.config);
    // PEFT's fused-expert layout (target_parameters) becomes per-expert pairs.
    peft::convert_to_per_expert(model, file, *adapter, named, "'" + wpath + "'");
    adapter->assign(named, "'" + wpath + "'");
    return adapter;
}

std::vector<std::pair<std::string, at::Tensor>> merged_weights(const CausalLM &model,
                                                               const LoraAdapter &adapter) {
    check(adapter.num_layers() == model.config().num_hidden_layers,
          "adapter '" + adapter.name() + "' has " + std::to_string(adapter.num_layers()) +
              " layers, the model " + std::to_string(model.config().num_hidden_layers));
    model.materialize_weights();
    at::NoGradGuard no_grad;
    // HF weight name -> the adapter's module on it.
    std::map<std::string, LoraAdapter::Module> targeted;
    for (auto &m : adapter.modules()) targeted.emplace(m.path + ".weight", m);
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto &[name, w] : model.named_weights()) {
        at::Tensor t = w.detach();
        auto it = targeted.find(name);
        if (it != targeted.end())
            t = (t.to(at::kFloat) + adapter.delta(it->second).to(t.device())).to(w.scalar_type());
        out.emplace_back(name, t);
    }
    return out;
}

void save_merged(const CausalLM &model, const LoraAdapter &adapter, const std::string &dir) {
    SaveOptions o;
    o.weights = merged_weights(model, adapter);
    write_folder(dir, "save_merged",
                 [&](const std::string &tmp) { save_pretrained(model, tmp, o); });
}

} // namespace rl::core
