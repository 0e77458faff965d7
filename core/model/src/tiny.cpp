#include "rl/core/tiny.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "rl/core/config.hpp"
#include "rl/core/error.hpp"
#include "rl/core/model.hpp"
#include "rl/core/pretrained.hpp"
#include "unicode.hpp"

#include <nlohmann/json.hpp>

namespace rl::core {
namespace {

using Json = nlohmann::ordered_json;

const char *const kSpecials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

// ChatML, as a Jinja template for tools that render it.
constexpr const char *kChatTemplate =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

Json added_token(int32_t id, const char *content) {
    return Json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
}

// GPT-2's byte -> character map (same table as the tokenizer's).
std::string byte_char(int b) {
    int next = 0;
    for (int x = 0; x < 256; ++x) {
        const bool keep = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE);
        const uint32_t cp = keep ? static_cast<uint32_t>(x) : static_cast<uint32_t>(256 + next++);
        if (x == b) return unicode::encode(cp);
    }
    return {};
}

} // namespace

TinyModelSpec tiny_moe_spec() {
    TinyModelSpec s;
    s.num_experts = 8;
    return s;
}

TinyModelSpec tiny_preset_spec(const std::string &preset) {
    if (preset == "tiny") return TinyModelSpec{};
    if (preset == "tiny-moe") return tiny_moe_spec();
    if (preset == "tiny-reward") { // a reward model's shape, random weights
        TinyModelSpec s;
        s.num_labels = 1;
        return s;
    }
    throw Error("unknown model preset '" + preset + "'; valid: tiny, tiny-moe, tiny-reward");
}

std::string tiny_config_json(const TinyModelSpec &s) {
    const bool moe = s.num_experts > 0;
    Json j;
    j["architectures"] = Json::array({moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"});
    j["model_type"] = moe ? "qwen3_moe" : "qwen3";
    j["vocab_size"] = kTinyVocabSize;
    j["hidden_size"] = s.hidden_size;
    j["intermediate_size"] = s.intermediate_size;
    j["num_hidden_layers"] = s.num_hidden_layers;
    j["num_attention_heads"] = s.num_attention_heads;
    j["num_key_value_heads"] = s.num_key_value_heads;
    j["head_dim"] = s.head_dim;
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = s.max_position_embeddings;
    j["rms_norm_eps"] = 1e-6;
    j["rope_theta"] = s.rope_theta;
    j["rope_scaling"] = nullptr;
    j["attention_bias"] = false;
    j["attention_dropout"] = 0.0;
    j["tie_word_embeddings"] = true;
    j["use_cache"] = true;
    j["use_sliding_window"] = false;
    j["initializer_range"] = s.init_std;
    j["bos_token_id"] = nullptr;
    j["eos_token_id"] = kTinyImEnd;
    j["torch_dtype"] = "float32";
    if (moe) {
        j["num_experts"] = s.num_experts;
        j["num_experts_per_tok"] = s.num_experts_per_tok;
        j["moe_intermediate_size"] = s.moe_intermediate_size;
        j["norm_topk_prob"] = s.norm_topk_prob;
        j["decoder_sparse_step"] = 1;
        j["mlp_only_layers"] = Json::array();
        j["router_aux_loss_coef"] = 0.001;
        j["output_router_logits"] = false;
    }
    if (s.num_labels > 0) {
        j["architectures"] =
            Json::array({std::string(moe ? "Qwen3Moe" : "Qwen3") + "ForSequenceClassification"});
        Json labels = Json::object();
        for (int64_t i = 0; i < s.num_labels; ++i)
            labels[std::to_string(i)] = "LABEL_" + std::to_string(i);
        j["id2label"] = labels;
        j["pad_token_id"] = kTinyEndOfText;
    }
    return j.dump(2) + "\n";
}

std::string tiny_tokenizer_json() {
    Json vocab = Json::object();
    for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
    Json added = Json::array();
    for (int i = 0; i < 3; ++i) added.push_back(added_token(256 + i, kSpecials[i]));
    const Json byte_level = {{"type", "ByteLevel"},
                             {"add_prefix_space", false},
                             {"trim_offsets", true},
                             {"use_regex", false}};
    const Json j = {{"version", "1.0"},
                    {"truncation", nullptr},
                    {"padding", nullptr},
                    {"added_tokens", added},
                    {"normalizer", nullptr},
                    {"pre_tokenizer", byte_level},
                    {"post_processor", byte_level},
                    {"decoder", byte_level},
                    {"model",
                     {{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", nullptr},
                      {"continuing_subword_prefix", nullptr},
                      {"end_of_word_suffix", nullptr},
                      {"fuse_unk", false},
                      {"byte_fallback", false},
                      {"ignore_merges", false},
                      {"vocab", vocab},
                      {"merges", Json::array()}}}};
    return j.dump(2) + "\n";
}

std::string tiny_tokenizer_config_json() {
    Json decoder = Json::object();
    for (int i = 0; i < 3; ++i) {
        Json t = added_token(256 + i, kSpecials[i]);
        t.erase("id");
        decoder[std::to_string(256 + i)] = t;
    }
    const Json j = {{"add_bos_token", false},
                    {"add_prefix_space", false},
                    {"added_tokens_decoder", decoder},
                    {"additional_special_tokens", Json::array({"<|im_start|>", "<|im_end|>"})},
                    {"bos_token", nullptr},
                    {"chat_template", kChatTemplate},
                    {"clean_up_tokenization_spaces", false},
                    {"eos_token", "<|im_end|>"},
                    {"model_max_length", 2048},
                    {"pad_token", "<|endoftext|>"},
                    {"tokenizer_class", "PreTrainedTokenizerFast"},
                    {"unk_token", nullptr}};
    return j.dump(2) + "\n";
}

void write_tiny_model(const std::string &dir, uint64_t seed, const TinyModelSpec &spec) {
    ModelConfig config = ModelConfig::parse(tiny_config_json(spec), "tiny preset config.json");
    CausalLM model(config);
    model.init_weights(seed, spec.init_std);
    model.aux_files()["tokenizer.json"] = tiny_tokenizer_json();
    model.aux_files()["tokenizer_config.json"] = tiny_tokenizer_config_json();
    model.aux_files()["special_tokens_map.json"] =
        Json{{"additional_special_tokens", Json::array({"<|im_start|>", "<|im_end|>"})},
             {"eos_token", "<|im_end|>"},
             {"pad_token", "<|endoftext|>"}}
            .dump(2) +
        "\n";
    model.aux_files()["generation_config.json"] =
        Json{{"eos_token_id", Json::array({kTinyImEnd, kTinyEndOfText})},
             {"pad_token_id", kTinyEndOfText}}
            .dump(2) +
        "\n";
    // Into a missing or empty folder the model appears whole: written next to
    // it, then renamed into place, so a process that sees config.json sees
    // every file (two processes creating it at once both end with the same
    // model). A folder with files in it is written in place.
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path target = fs::path(dir).lexically_normal();
    if (fs::exists(target, ec) && !fs::is_empty(target, ec)) {
        save_pretrained(model, dir);
        return;
    }
    static std::atomic<int> counter{0};
    const fs::path tmp =
        target.parent_path() / ("." + target.filename().string() + ".tmp-" +
                                std::to_string(::getpid()) + "-" + std::to_string(++counter));
    try {
        save_pretrained(model, tmp.string());
    } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
    }
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
        const int err = errno;
        fs::remove_all(tmp, ec);
        // Another process put a model there first: that one stays.
        if ((err == ENOTEMPTY || err == EEXIST) && fs::exists(target / "config.json", ec)) return;
        throw Error("cannot create the tiny model in '" + dir + "': " + std::strerror(err));
    }
}

} // namespace rl::core
