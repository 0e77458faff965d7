// PEFT's adapter_config.json and its fused-expert layout (lora_peft.hpp).
#include "lora_peft.hpp"

#include "rl/core/text.hpp"
#include "rl/core/atomic_file.hpp"
#include "rl/core/error.hpp"
#include "rl/core/json.hpp"
#include "rl/core/model.hpp"
#include "unicode.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <utility>

namespace rl::core::peft {
namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

namespace {

constexpr const char *kConfigFile = "adapter_config.json";
constexpr const char *kGateUp = "gate_up_proj";
constexpr const char *kDown = "down_proj";

[[noreturn]] void invalid(const std::string &msg) {
    throw Error(ErrorKind::InvalidArgument, msg);
}

bool ends_with(const std::string &s, const std::string &tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string last_name(const std::string &dotted) {
    const size_t dot = dotted.rfind('.');
    return dot == std::string::npos ? dotted : dotted.substr(dot + 1);
}

bool is_mlp_name(const std::string &n) {
    return n == "gate_proj" || n == "up_proj" || n == "down_proj";
}

// The fused parameter of transformers >= 5 that holds our per-expert weight
// `name` ("model.layers.1.mlp.experts.3.up_proj.weight" ->
// "model.layers.1.mlp.experts.gate_up_proj"), or `name` itself.
std::string fused_name(const std::string &name) {
    static const std::string kExperts = ".mlp.experts.";
    const size_t at = name.find(kExperts);
    if (at == std::string::npos) return name;
    const std::string rest = name.substr(at + kExperts.size()); // "3.up_proj.weight"
    const size_t dot = rest.find('.');
    if (dot == std::string::npos || rest.find_first_not_of("0123456789") != dot) return name;
    const std::string proj = rest.substr(dot + 1);
    const std::string head = name.substr(0, at + kExperts.size());
    if (proj == "gate_proj.weight" || proj == "up_proj.weight") return head + kGateUp;
    if (proj == "down_proj.weight") return head + kDown;
    return name;
}

std::string layer_path(int64_t layer) {
    return "model.layers." + std::to_string(layer) + ".";
}

// PEFT's pattern lookup (peft.utils.other.get_pattern_key): the first key of
// `patterns` (file order) with re.match(r"(.*\.)?(KEY)$", module_key), here
// with PCRE2 (Python's syntax, match limits against runaway patterns).
class Patterns {
public:
    Patterns(const ordered_json &obj, const char *what, const std::string &path) {
        for (const auto &kv : obj.items()) {
            try {
                compiled_.push_back(
                    {kv.key(), std::make_unique<unicode::Regex>("^(.*\\.)?(" + kv.key() + ")$"),
                     kv.value()});
            } catch (const Error &e) {
                invalid("'" + path + "': " + what + " key \"" + kv.key() + "\": " + e.what());
            }
        }
    }
    struct Hit {
        std::string key;
        ordered_json value;
    };
    std::optional<Hit> find(const std::string &module_key, const std::string &path) const {
        for (const auto &c : compiled_) {
            std::vector<std::pair<size_t, size_t>> m;
            try {
                m = c.re->find_all(module_key);
            } catch (const Error &e) {
                invalid("'" + path + "': pattern key \"" + c.key + "\" on " + module_key + ": " +
                        e.what());
            }
            if (!m.empty() && m[0].first == 0) return Hit{c.key, c.value};
        }
        return std::nullopt;
    }

private:
    struct Compiled {
        std::string key;
        std::unique_ptr<unicode::Regex> re;
        ordered_json value;
    };
    std::vector<Compiled> compiled_;
};

} // namespace

AdapterFile read_adapter_file(const std::string &dir) {
    AdapterFile out;
    out.path = (fs::path(dir) / kConfigFile).string();
    const std::string &path = out.path;
    if (!fs::exists(path))
        throw Error(ErrorKind::NotFound, "LoRA adapter '" + dir + "' has no " + kConfigFile);
    const std::string text = read_file(path);
    const json j = parse_json_or_discarded(text);
    auto bad = [&](const std::string &msg) -> Error {
        return Error(ErrorKind::InvalidArgument, "'" + path + "': " + msg);
    };
    if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
    if (j.value("peft_type", std::string()) != "LORA")
        throw bad("peft_type is " + (j.contains("peft_type") ? j["peft_type"].dump() : "missing") +
                  "; only LORA adapters are supported");
    if (j.value("use_dora", false)) throw bad("use_dora is true; DoRA is not supported");
    if (j.contains("bias") && j["bias"] != "none")
        throw bad("bias is " + j["bias"].dump() + "; only \"none\" is supported");
    if (j.value("fan_in_fan_out", false)) throw bad("fan_in_fan_out is true; not supported");
    for (const char *k : {"modules_to_save", "layers_to_transform", "layers_pattern"})
        if (j.contains(k) && !j[k].is_null() && !(j[k].is_array() && j[k].empty()))
            throw bad(std::string(k) + " is set; not supported");

    // target_parameters (PEFT >= 0.17): LoRA on whole nn.Parameters; here the
    // fused 3-D expert parameters of transformers >= 5 (lora_peft.hpp).
    if (j.contains("target_parameters") && !j["target_parameters"].is_null()) {
        const json &tp = j["target_parameters"];
        if (!tp.is_array())
            throw bad("target_parameters must be a list of parameter names, got " + tp.dump());
        for (size_t i = 0; i < tp.size(); ++i) {
            const std::string at = "target_parameters[" + std::to_string(i) + "]";
            if (!tp[i].is_string()) throw bad(at + " must be a string, got " + tp[i].dump());
            const std::string name = tp[i].get<std::string>();
            const std::string last = last_name(name);
            if (last != kGateUp && last != kDown)
                throw bad(at + " is \"" + name + "\": LoRA on the parameter '" + last +
                          "' is not supported; target_parameters may name the fused expert "
                          "parameters of transformers >= 5 (mlp.experts.gate_up_proj, "
                          "mlp.experts.down_proj)");
            out.target_parameters.push_back(name);
        }
    }
    if (j.contains("target_modules") && j["target_modules"].is_string())
        out.target_modules.push_back(j["target_modules"].get<std::string>());
    else if (j.contains("target_modules") && j["target_modules"].is_array())
        for (const auto &v : j["target_modules"])
            if (v.is_string()) out.target_modules.push_back(v.get<std::string>());

    // The patterns, in the file's order (PEFT takes the first match).
    const ordered_json oj = ordered_json::parse(text, nullptr, false);
    for (const char *k : {"rank_pattern", "alpha_pattern"}) {
        if (!oj.contains(k) || oj[k].is_null()) continue;
        const ordered_json &p = oj[k];
        if (!p.is_object()) throw bad(std::string(k) + " must be an object, got " + p.dump());
        for (const auto &kv : p.items()) {
            const bool rank = std::string(k) == "rank_pattern";
            if (rank ? !kv.value().is_number_integer() : !kv.value().is_number())
                throw bad(std::string(k) + "[\"" + kv.key() + "\"] must be " +
                          (rank ? "an integer" : "a number") + ", got " + kv.value().dump());
        }
        (std::string(k) == "rank_pattern" ? out.rank_pattern : out.alpha_pattern) = p;
    }

    json ours = json::object();
    for (const char *k : {"r", "lora_alpha", "lora_dropout", "target_modules", "use_rslora",
                          "base_model_name_or_path"})
        if (j.contains(k) && !j[k].is_null()) ours[k] = j[k];
    if (!ours.contains("r")) throw bad("r is missing");
    if (!out.target_parameters.empty()) {
        // Our targets: the modules target_modules names and those the fused
        // parameters hold (gate_up_proj: gate_proj and up_proj).
        json names = json::array();
        if (ours.contains("target_modules")) {
            if (ours["target_modules"].is_array())
                names = ours["target_modules"];
            else
                names.push_back(ours["target_modules"]);
        }
        for (const auto &p : out.target_parameters) {
            if (last_name(p) == kGateUp) {
                names.push_back("gate_proj");
                names.push_back("up_proj");
            } else {
                names.push_back("down_proj");
            }
        }
        ours["target_modules"] = names;
    }
    try {
        out.config = LoraConfig::from_json(ours.dump());
    } catch (const Error &e) {
        throw bad(e.what());
    }
    return out;
}

void convert_to_per_expert(const CausalLM &model, const AdapterFile &file,
                           const LoraAdapter &adapter, std::map<std::string, at::Tensor> &tensors,
                           const std::string &source) {
    const ModelConfig &mc = model.config();
    const LoraConfig &c = adapter.config();
    const bool fused = !file.target_parameters.empty();
    const std::string cfg = "'" + file.path + "': ";
    const auto L = mc.num_hidden_layers;

    // Which fused parameters target_parameters reaches, matched as PEFT does
    // (the name, or a dotted suffix of it) against transformers 5's names.
    std::set<std::pair<int64_t, std::string>> targeted; // (layer, gate_up_proj | down_proj)
    if (fused) {
        if (!mc.has_moe())
            invalid(cfg + "target_parameters is " + json(file.target_parameters).dump() + " but " +
                    architecture_name(mc.architecture) + " has no experts");
        std::set<std::string> names;
        for (const auto &kv : model.named_weights()) names.insert(fused_name(kv.first));
        for (size_t i = 0; i < file.target_parameters.size(); ++i) {
            const std::string &t = file.target_parameters[i];
            bool any = false;
            for (int64_t l = 0; l < L; ++l) {
                if (!mc.is_moe_layer(l)) continue;
                for (const char *p : {kGateUp, kDown}) {
                    const std::string name = layer_path(l) + "mlp.experts." + p;
                    if (names.count(name) && (name == t || ends_with(name, "." + t))) {
                        targeted.insert({l, p});
                        any = true;
                    }
                }
            }
            if (!any)
                invalid(cfg + "target_parameters[" + std::to_string(i) + "] \"" + t +
                        "\" matches no parameter of the model (its fused experts are "
                        "model.layers.<N>.mlp.experts.gate_up_proj and down_proj of the sparse "
                        "layers)");
        }
        // The MLP names of target_modules beside target_parameters: on
        // Qwen2-MoE they name the shared expert (nn.Linear in transformers 5),
        // which our gate_proj / up_proj / down_proj adapt with the experts.
        std::set<std::string> listed;
        for (const auto &n : file.target_modules)
            if (is_mlp_name(n)) listed.insert(n);
        const bool shared = mc.shared_expert_intermediate_size > 0;
        if (!shared && !listed.empty())
            invalid(cfg + "target_modules names " + *listed.begin() +
                    " beside target_parameters: " + architecture_name(mc.architecture) +
                    " has no MLP module for it but the experts, which PEFT (0.21) over "
                    "transformers >= 5 then adapts twice (its per-expert conversion at twice "
                    "the rank, and target_parameters); save the experts in one layout");
        if (shared) {
            for (const char *n : {"gate_proj", "up_proj", "down_proj"}) {
                const bool by_modules = listed.count(n) > 0;
                const std::string param = std::string(n) == "down_proj" ? kDown : kGateUp;
                const bool by_params =
                    std::any_of(targeted.begin(), targeted.end(),
                                [&](const auto &x) { return x.second == param; });
                if (by_modules != by_params)
                    invalid(cfg + "target_modules " + (by_modules ? "names " : "does not name ") +
                            n + " (the shared expert's mlp.shared_expert." + n + ") but " +
                            "target_parameters " + (by_params ? "adapts" : "does not adapt") +
                            " the routed experts' " + param +
                            ": an adapter here adapts the shared and the routed experts' " + n +
                            " alike");
            }
        }
        // Every sparse layer alike: an adapter here has no per-layer targets.
        for (int64_t l = 0; l < L; ++l) {
            if (!mc.is_moe_layer(l)) continue;
            for (const char *p : {kGateUp, kDown}) {
                const bool want =
                    c.targets(std::string(p) == kDown ? LoraTarget::Down : LoraTarget::Gate);
                if (want && !targeted.count({l, p}))
                    invalid(cfg + "target_parameters " + json(file.target_parameters).dump() +
                            " adapt " + p + " of some sparse layers but not " + layer_path(l) +
                            "mlp.experts." + p +
                            "; an adapter here adapts every sparse layer alike");
            }
        }
    }

    // rank_pattern / alpha_pattern: each module's rank and alpha as PEFT
    // resolves them; ours has one rank and one scale for all of them.
    std::map<std::string, int64_t> fused_rank; // fused parameter key -> per-expert rank
    {
        const Patterns ranks(file.rank_pattern, "rank_pattern", file.path);
        const Patterns alphas(file.alpha_pattern, "alpha_pattern", file.path);
        std::vector<std::string> keys;
        for (const auto &m : adapter.modules())
            if (!(fused && m.expert >= 0)) keys.push_back(m.path);
        for (const auto &[l, p] : targeted) keys.push_back(layer_path(l) + "mlp.experts." + p);
        for (const auto &key : keys) {
            const auto rh = ranks.find(key, file.path);
            const auto ah = alphas.find(key, file.path);
            const int64_t r = rh ? rh->value.get<int64_t>() : c.rank;
            const double alpha = ah ? ah->value.get<double>() : c.alpha;
            const bool gate_up = fused && ends_with(key, std::string(".") + kGateUp);
            auto which = [&] {
                std::string s;
                if (rh) s += "rank_pattern[\"" + rh->key + "\"] = " + std::to_string(r);
                if (ah)
                    s += std::string(s.empty() ? "" : " and ") + "alpha_pattern[\"" + ah->key +
                         "\"] = " + json(alpha).dump();
                return s;
            };
            if (r == c.rank && alpha == c.alpha) {
                fused_rank[key] = r;
                continue;
            }
            if (gate_up && !c.use_rslora && r == 2 * c.rank && alpha == 2 * c.alpha) {
                // PEFT's fused form of per-expert gate_proj / up_proj pairs
                // (its transformers-5 conversion): the scale is alpha / r.
                fused_rank[key] = r;
                continue;
            }
            invalid(cfg + which() + " for " + key + " (r = " + std::to_string(c.rank) +
                    ", lora_alpha = " + json(c.alpha).dump() + "): " +
                    (gate_up ? "the fused gate_up_proj loads into separate gate_proj / up_proj "
                               "pairs only at rank r with lora_alpha, or at rank 2 r with "
                               "2 lora_alpha (PEFT's fused form of per-expert pairs)"
                             : "an adapter here has one rank and one scale for every module"));
        }
    }
    if (!fused) return;

    // The fused pairs into per-expert ones.
    at::NoGradGuard no_grad;
    const int64_t E = mc.num_experts, H = mc.hidden_size, I = mc.moe_intermediate_size;
    const int64_t r = c.rank;
    auto take = [&](const std::string &key, const std::string &what) {
        auto it = tensors.find(key);
        if (it == tensors.end())
            invalid(source + ": tensor '" + key + "' is missing (PEFT keeps the LoRA pair of " +
                    what + " there)");
        at::Tensor t = it->second;
        tensors.erase(it);
        return t;
    };
    for (int64_t l = 0; l < L; ++l) {
        const bool dn = targeted.count({l, kDown}) > 0;
        for (const char *p : {kGateUp, kDown}) {
            if (!targeted.count({l, p})) continue;
            const bool is_gu = std::string(p) == kGateUp;
            const std::string param = layer_path(l) + "mlp.experts." + p;
            // The first registered parameter's wrapper is the second's base layer.
            const std::string prefix = "base_model.model." + layer_path(l) + "mlp.experts." +
                                       (is_gu && dn ? "base_layer." : "");
            const int64_t R = fused_rank.at(param);
            const int64_t in = is_gu ? H : I, out = is_gu ? 2 * I : H;
            const at::Tensor A = take(prefix + "lora_A.weight", param);
            const at::Tensor B = take(prefix + "lora_B.weight", param);
            const std::string layout = " (" + param + ": " + std::to_string(E) +
                                       " experts of rank " + std::to_string(R) + ")";
            if (!A.sizes().equals({R * E, in}))
                invalid(source + ": tensor '" + prefix + "lora_A.weight' has shape " +
                        shape_text(A.sizes()) + ", expected [" + std::to_string(R * E) + ", " +
                        std::to_string(in) + "]" + layout);
            if (!B.sizes().equals({out, R * E}))
                invalid(source + ": tensor '" + prefix + "lora_B.weight' has shape " +
                        shape_text(B.sizes()) + ", expected [" + std::to_string(out) + ", " +
                        std::to_string(R * E) + "]" + layout);
            const at::Tensor As = A.reshape({E, R, in});                     // expert-major rows
            const at::Tensor Bs = B.reshape({out, R, E}).permute({2, 0, 1}); // rank-major columns
            if (R != r) {
                // Rank 2 r: gate rows on the first r directions, up rows on
                // the last r, nothing across.
                const at::Tensor cross = Bs.narrow(1, 0, I).narrow(2, r, r).abs().amax({1, 2}) +
                                         Bs.narrow(1, I, I).narrow(2, 0, r).abs().amax({1, 2});
                const at::Tensor bad = cross.ne(0).nonzero();
                if (bad.size(0) > 0)
                    invalid(source + ": tensor '" + prefix + "lora_B.weight'" + layout +
                            " is not block-diagonal for expert " +
                            std::to_string(bad[0][0].item<int64_t>()) +
                            ": its gate and up rows share rank directions, which separate "
                            "gate_proj / up_proj pairs of rank " +
                            std::to_string(r) + " cannot hold");
            }
            for (int64_t e = 0; e < E; ++e) {
                const std::string to =
                    "base_model.model." + layer_path(l) + "mlp.experts." + std::to_string(e) + ".";
                const at::Tensor Ae = As[e], Be = Bs[e]; // [R, in], [out, R]
                auto put = [&](const char *proj, const at::Tensor &a, const at::Tensor &b) {
                    tensors[to + proj + ".lora_A.weight"] = a.contiguous().clone();
                    tensors[to + proj + ".lora_B.weight"] = b.contiguous().clone();
                };
                if (!is_gu) {
                    put("down_proj", Ae, Be);
                } else if (R == r) {
                    put("gate_proj", Ae, Be.narrow(0, 0, I));
                    put("up_proj", Ae, Be.narrow(0, I, I));
                } else {
                    put("gate_proj", Ae.narrow(0, 0, r), Be.narrow(0, 0, I).narrow(1, 0, r));
                    put("up_proj", Ae.narrow(0, r, r), Be.narrow(0, I, I).narrow(1, r, r));
                }
            }
        }
    }
}

} // namespace rl::core::peft
