#include "rl/core/config.hpp"

#include "json_object.hpp"
#include "rl/core/atomic_file.hpp"
#include "rl/core/error.hpp"
#include "rl/core/names.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

namespace rl::core {
namespace {

using Json = nlohmann::json;

// The architectures read, by their transformers class name and model_type.
struct ArchitectureRow {
    Architecture value;
    const char *name;
    const char *model_type;
};
constexpr ArchitectureRow kArchitectures[] = {
    {Architecture::Llama, "LlamaForCausalLM", "llama"},
    {Architecture::Qwen2, "Qwen2ForCausalLM", "qwen2"},
    {Architecture::Qwen3, "Qwen3ForCausalLM", "qwen3"},
    {Architecture::Qwen2Moe, "Qwen2MoeForCausalLM", "qwen2_moe"},
    {Architecture::Qwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe"}};

class Reader {
public:
    Reader(const Json &j, std::string source) : j_(j), source_(std::move(source)) {}

    [[noreturn]] void fail(const std::string &key, const std::string &msg) const {
        throw Error(source_ + ": '" + key + "' " + msg);
    }

    const Json *find(const std::string &key) const {
        auto it = j_.find(key);
        if (it == j_.end() || it->is_null()) return nullptr;
        return &*it;
    }

    int64_t integer(const std::string &key, std::optional<int64_t> def, int64_t min_value) const {
        const Json *v = find(key);
        if (v == nullptr) {
            if (!def) fail(key, "is required");
            return *def;
        }
        if (!v->is_number_integer()) fail(key, "must be an integer, got " + v->dump());
        const int64_t x = v->get<int64_t>();
        if (x < min_value)
            fail(key, "must be >= " + std::to_string(min_value) + ", got " + v->dump());
        return x;
    }

    double number(const std::string &key, double def) const {
        const Json *v = find(key);
        if (v == nullptr) return def;
        if (!v->is_number()) fail(key, "must be a number, got " + v->dump());
        const double x = v->get<double>();
        if (!std::isfinite(x)) fail(key, "must be finite");
        return x;
    }

    bool boolean(const std::string &key, bool def) const {
        const Json *v = find(key);
        if (v == nullptr) return def;
        if (!v->is_boolean()) fail(key, "must be true or false, got " + v->dump());
        return v->get<bool>();
    }

    std::string string(const std::string &key, const std::string &def) const {
        const Json *v = find(key);
        if (v == nullptr) return def;
        if (!v->is_string()) fail(key, "must be a string, got " + v->dump());
        return v->get<std::string>();
    }

    const std::string &source() const { return source_; }

private:
    const Json &j_;
    std::string source_;
};

void parse_rope(const Json &root, const Reader &r, ModelConfig *c) {
    // transformers 5 moved rope_theta and the scaling into "rope_parameters".
    const Json *params = r.find("rope_parameters");
    const Json *scaling = r.find("rope_scaling");
    std::string prefix = "rope_scaling";
    if (params != nullptr) {
        if (!params->is_object()) r.fail("rope_parameters", "must be an object");
        scaling = params;
        prefix = "rope_parameters";
        Reader pr(*params, r.source());
        c->rope_theta = pr.number("rope_theta", r.number("rope_theta", 10000.0));
    } else {
        c->rope_theta = r.number("rope_theta", 10000.0);
    }
    (void)root;
    if (!(c->rope_theta > 0)) r.fail("rope_theta", "must be positive");
    if (scaling == nullptr) return;
    if (!scaling->is_object()) r.fail(prefix, "must be an object or null");
    Reader s(*scaling, r.source() + ": " + prefix);
    std::string type = s.string("rope_type", "");
    if (type.empty()) type = s.string("type", "default");
    if (type == "default") return;
    if (type == "linear") {
        c->rope_scaling = RopeScaling::Linear;
        c->rope_factor = s.number("factor", 0.0);
        if (!(c->rope_factor >= 1.0)) s.fail("factor", "must be >= 1 for linear RoPE scaling");
        return;
    }
    if (type == "llama3") {
        c->rope_scaling = RopeScaling::Llama3;
        c->rope_factor = s.number("factor", 0.0);
        c->rope_low_freq_factor = s.number("low_freq_factor", 0.0);
        c->rope_high_freq_factor = s.number("high_freq_factor", 0.0);
        c->rope_original_max_position_embeddings =
            s.integer("original_max_position_embeddings", std::nullopt, 1);
        if (!(c->rope_factor >= 1.0)) s.fail("factor", "must be >= 1 for llama3 RoPE scaling");
        if (!(c->rope_low_freq_factor > 0)) s.fail("low_freq_factor", "must be positive");
        if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
            s.fail("high_freq_factor", "must be greater than low_freq_factor");
        return;
    }
    throw Error(r.source() + ": '" + prefix + ".rope_type' = '" + type +
                "' is not supported (supported: default, linear, llama3)");
}

void parse_token_ids(const Reader &r, ModelConfig *c) {
    if (r.find("bos_token_id") != nullptr) c->bos_token_id = r.integer("bos_token_id", 0, 0);
    if (r.find("pad_token_id") != nullptr) {
        c->pad_token_id = r.integer("pad_token_id", 0, 0);
        if (*c->pad_token_id >= c->vocab_size)
            r.fail("pad_token_id", "(" + std::to_string(*c->pad_token_id) +
                                       ") must be below vocab_size (" +
                                       std::to_string(c->vocab_size) + ")");
    }
    if (const Json *e = r.find("eos_token_id")) {
        if (e->is_array()) {
            for (const auto &x : *e) {
                if (!x.is_number_integer() || x.get<int64_t>() < 0)
                    r.fail("eos_token_id", "must hold non-negative integers, got " + e->dump());
                c->eos_token_ids.push_back(x.get<int64_t>());
            }
        } else {
            c->eos_token_ids.push_back(r.integer("eos_token_id", 0, 0));
        }
    }
}

// The sparse blocks of Qwen2-MoE and Qwen3-MoE (transformers' Qwen2MoeConfig /
// Qwen3MoeConfig; the defaults are theirs where a key may be absent).
void parse_moe(const Reader &r, ModelConfig *c) {
    // transformers 5 writes Qwen3-MoE's expert count as num_local_experts;
    // the hub checkpoints say num_experts.
    const Json *ne = r.find("num_experts");
    const Json *nl = r.find("num_local_experts");
    if (ne != nullptr && nl != nullptr && *ne != *nl)
        r.fail("num_local_experts",
               "(" + nl->dump() + ") differs from num_experts (" + ne->dump() + ")");
    c->num_experts = ne == nullptr && nl != nullptr
                         ? r.integer("num_local_experts", std::nullopt, 0)
                         : r.integer("num_experts", std::nullopt, 0);
    c->decoder_sparse_step = r.integer("decoder_sparse_step", int64_t{1}, 1);
    if (const Json *m = r.find("mlp_only_layers")) {
        if (!m->is_array()) r.fail("mlp_only_layers", "must be a list of layer indices");
        for (const auto &x : *m) {
            if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
                x.get<int64_t>() >= c->num_hidden_layers)
                r.fail("mlp_only_layers", "holds " + x.dump() + ": layer indices must be in [0, " +
                                              std::to_string(c->num_hidden_layers) + ")");
            c->mlp_only_layers.push_back(x.get<int64_t>());
        }
    }
    c->router_aux_loss_coef = r.number("router_aux_loss_coef", 0.001);
    if (c->router_aux_loss_coef < 0) r.fail("router_aux_loss_coef", "must be >= 0");
    c->output_router_logits = r.boolean("output_router_logits", false);
    if (c->num_experts == 0) return; // every layer dense, as in transformers
    c->num_experts_per_tok = r.integer("num_experts_per_tok", std::nullopt, 1);
    if (c->num_experts_per_tok > c->num_experts)
        r.fail("num_experts_per_tok", "(" + std::to_string(c->num_experts_per_tok) +
                                          ") must not exceed num_experts (" +
                                          std::to_string(c->num_experts) + ")");
    c->moe_intermediate_size = r.integer("moe_intermediate_size", std::nullopt, 1);
    c->norm_topk_prob = r.boolean("norm_topk_prob", false);
    if (c->architecture == Architecture::Qwen2Moe)
        c->shared_expert_intermediate_size =
            r.integer("shared_expert_intermediate_size", std::nullopt, 1);
}

} // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
    if (num_experts <= 0 || (layer + 1) % decoder_sparse_step != 0) return false;
    for (int64_t l : mlp_only_layers)
        if (l == layer) return false;
    return true;
}

bool ModelConfig::has_moe() const {
    for (int64_t i = 0; i < num_hidden_layers; ++i)
        if (is_moe_layer(i)) return true;
    return false;
}

const char *architecture_name(Architecture a) {
    return name_in(kArchitectures, a);
}

ModelConfig ModelConfig::parse(const std::string &json_text, const std::string &source) {
    const Json j = parse_json_object(json_text, source);
    Reader r(j, source);
    ModelConfig c;
    c.json = json_text;

    // Architecture: from "architectures", else from "model_type".
    std::string arch_name;
    if (const Json *a = r.find("architectures")) {
        if (!a->is_array() || a->size() != 1 || !(*a)[0].is_string())
            r.fail("architectures", "must be a list with one class name, got " + a->dump());
        arch_name = (*a)[0].get<std::string>();
    }
    const std::string given_name = arch_name;
    const std::string model_type = r.string("model_type", "");
    // A reward model: the trunk of a causal LM with a sequence-classification head.
    const std::string kClassifier = "ForSequenceClassification";
    if (arch_name.size() > kClassifier.size() &&
        arch_name.compare(arch_name.size() - kClassifier.size(), kClassifier.size(), kClassifier) ==
            0) {
        c.head = Head::SequenceClassification;
        arch_name = arch_name.substr(0, arch_name.size() - kClassifier.size()) + "ForCausalLM";
    }
    if (arch_name.empty()) {
        for (const auto &a : kArchitectures)
            if (model_type == a.model_type) arch_name = a.name;
        if (arch_name.empty())
            throw Error(source + ": neither 'architectures' nor a supported 'model_type' "
                                 "(llama, qwen2, qwen3, qwen2_moe, qwen3_moe) is given");
    }
    const ArchitectureRow *arch = row_named(kArchitectures, arch_name);
    if (arch == nullptr)
        throw Error(source + ": 'architectures' = '" + given_name +
                    "' is not supported (supported: " + names_in(kArchitectures) +
                    ", and their ...ForSequenceClassification reward models)");
    c.architecture = arch->value;
    const std::string expected_type = arch->model_type;
    if (!model_type.empty() && model_type != expected_type)
        r.fail("model_type", "is '" + model_type + "' but architectures says " + given_name +
                                 " (model_type '" + expected_type + "')");
    c.model_type = expected_type;

    if (r.find("quantization_config") != nullptr)
        r.fail("quantization_config", "is present: quantized checkpoints are not supported");

    c.vocab_size = r.integer("vocab_size", std::nullopt, 1);
    c.hidden_size = r.integer("hidden_size", std::nullopt, 1);
    c.intermediate_size = r.integer("intermediate_size", std::nullopt, 1);
    c.num_hidden_layers = r.integer("num_hidden_layers", std::nullopt, 1);
    c.num_attention_heads = r.integer("num_attention_heads", std::nullopt, 1);
    c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads, 1);
    if (c.num_attention_heads % c.num_key_value_heads != 0)
        r.fail("num_key_value_heads", "(" + std::to_string(c.num_key_value_heads) +
                                          ") must divide num_attention_heads (" +
                                          std::to_string(c.num_attention_heads) + ")");
    // Qwen3Config defaults head_dim to 128; Llama, Qwen2 and the MoE configs derive it.
    const int64_t derived_head_dim = c.hidden_size / c.num_attention_heads;
    const int64_t default_head_dim =
        c.architecture == Architecture::Qwen3 ? int64_t{128} : derived_head_dim;
    c.head_dim = r.integer("head_dim", default_head_dim, 2);
    if (c.head_dim % 2 != 0) r.fail("head_dim", "must be even for rotary embeddings");
    if (r.find("head_dim") == nullptr && c.architecture != Architecture::Qwen3 &&
        derived_head_dim * c.num_attention_heads != c.hidden_size)
        r.fail("hidden_size", "must be divisible by num_attention_heads when head_dim is absent");
    c.max_position_embeddings = r.integer("max_position_embeddings", int64_t{32768}, 1);
    c.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
    if (!(c.rms_norm_eps > 0)) r.fail("rms_norm_eps", "must be positive");

    const std::string act = r.string("hidden_act", "silu");
    if (act != "silu") r.fail("hidden_act", "is '" + act + "': only 'silu' is supported");
    if (r.number("attention_dropout", 0.0) != 0.0)
        r.fail("attention_dropout", "must be 0: attention dropout is not supported");
    const double partial = r.number("partial_rotary_factor", 1.0);
    if (partial != 1.0) r.fail("partial_rotary_factor", "must be 1: partial RoPE is not supported");
    if (r.boolean("use_sliding_window", false))
        r.fail("use_sliding_window", "is true: sliding-window attention is not supported");
    if (const Json *lt = r.find("layer_types")) {
        if (!lt->is_array()) r.fail("layer_types", "must be a list");
        for (size_t i = 0; i < lt->size(); ++i) {
            if (!(*lt)[i].is_string() || (*lt)[i].get<std::string>() != "full_attention")
                r.fail("layer_types", "[" + std::to_string(i) + "] = " + (*lt)[i].dump() +
                                          ": only 'full_attention' layers are supported");
        }
    }

    parse_rope(j, r, &c);
    c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);

    switch (c.architecture) {
        case Architecture::Llama:
            c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
            c.mlp_bias = r.boolean("mlp_bias", false);
            break;
        case Architecture::Qwen2:
            c.qkv_bias = true;
            c.o_bias = false;
            break;
        case Architecture::Qwen3:
        case Architecture::Qwen3Moe:
            c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
            c.qk_norm = true;
            break;
        case Architecture::Qwen2Moe:
            c.qkv_bias = r.boolean("qkv_bias", true);
            c.o_bias = false;
            break;
    }
    if (c.architecture == Architecture::Qwen2Moe || c.architecture == Architecture::Qwen3Moe)
        parse_moe(r, &c);
    parse_token_ids(r, &c);
    if (c.is_classifier()) {
        // transformers writes id2label (and label2id); num_labels where given.
        int64_t labels = 2;
        if (const Json *m = r.find("id2label")) {
            if (!m->is_object() || m->empty())
                r.fail("id2label", "must be a non-empty object, got " + m->dump());
            labels = static_cast<int64_t>(m->size());
        }
        c.num_labels = r.integer("num_labels", labels, 1);
    }
    c.torch_dtype = r.string("torch_dtype", r.string("dtype", ""));
    return c;
}

std::string ModelConfig::class_name() const {
    std::string name = architecture_name(architecture);
    if (is_classifier())
        name = name.substr(0, name.size() - std::string("ForCausalLM").size()) +
               "ForSequenceClassification";
    return name;
}

ModelConfig ModelConfig::load(const std::string &path) {
    return parse(read_file(path), path);
}

std::string ModelConfig::to_json(const std::string &dtype) const {
    Json j;
    if (!this->json.empty()) {
        j = Json::parse(this->json);
    } else {
        j["architectures"] = Json::array({class_name()});
        j["model_type"] = model_type;
        j["vocab_size"] = vocab_size;
        j["hidden_size"] = hidden_size;
        j["intermediate_size"] = intermediate_size;
        j["num_hidden_layers"] = num_hidden_layers;
        j["num_attention_heads"] = num_attention_heads;
        j["num_key_value_heads"] = num_key_value_heads;
        j["head_dim"] = head_dim;
        j["max_position_embeddings"] = max_position_embeddings;
        j["rms_norm_eps"] = rms_norm_eps;
        j["rope_theta"] = rope_theta;
        j["hidden_act"] = "silu";
        j["tie_word_embeddings"] = tie_word_embeddings;
        if (architecture == Architecture::Qwen2Moe)
            j["qkv_bias"] = qkv_bias;
        else if (architecture != Architecture::Qwen2)
            j["attention_bias"] = qkv_bias;
        if (architecture == Architecture::Qwen2Moe || architecture == Architecture::Qwen3Moe) {
            j["num_experts"] = num_experts;
            j["num_experts_per_tok"] = num_experts_per_tok;
            j["moe_intermediate_size"] = moe_intermediate_size;
            j["norm_topk_prob"] = norm_topk_prob;
            j["decoder_sparse_step"] = decoder_sparse_step;
            j["mlp_only_layers"] = mlp_only_layers;
            j["router_aux_loss_coef"] = router_aux_loss_coef;
            j["output_router_logits"] = output_router_logits;
            if (architecture == Architecture::Qwen2Moe)
                j["shared_expert_intermediate_size"] = shared_expert_intermediate_size;
        }
        if (architecture == Architecture::Llama) j["mlp_bias"] = mlp_bias;
        switch (rope_scaling) {
            case RopeScaling::None:
                j["rope_scaling"] = nullptr;
                break;
            case RopeScaling::Linear:
                j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rope_factor}};
                break;
            case RopeScaling::Llama3:
                j["rope_scaling"] = {
                    {"rope_type", "llama3"},
                    {"factor", rope_factor},
                    {"low_freq_factor", rope_low_freq_factor},
                    {"high_freq_factor", rope_high_freq_factor},
                    {"original_max_position_embeddings", rope_original_max_position_embeddings}};
                break;
        }
        if (bos_token_id) j["bos_token_id"] = *bos_token_id;
        if (eos_token_ids.size() == 1)
            j["eos_token_id"] = eos_token_ids[0];
        else if (!eos_token_ids.empty())
            j["eos_token_id"] = eos_token_ids;
        if (pad_token_id) j["pad_token_id"] = *pad_token_id;
        if (is_classifier()) {
            Json labels = Json::object();
            for (int64_t i = 0; i < num_labels; ++i)
                labels[std::to_string(i)] = "LABEL_" + std::to_string(i);
            j["id2label"] = labels;
        }
        if (!torch_dtype.empty()) j["torch_dtype"] = torch_dtype;
    }
    if (!dtype.empty()) {
        if (j.contains("dtype") && !j.contains("torch_dtype"))
            j["dtype"] = dtype;
        else
            j["torch_dtype"] = dtype;
    }
    return j.dump(2) + "\n";
}

} // namespace rl::core
