// config.json parsing for the supported architectures, and refusals.
#include "rl/core/config.hpp"
#include "rl/core/json.hpp"
#include "rl/core/error.hpp"
#include "test_util.hpp"

#include <nlohmann/json.hpp>

namespace rl::core {
namespace {

using Json = nlohmann::json;
using test::error_of;

Json qwen3() {
    return Json{{"architectures", {"Qwen3ForCausalLM"}},
                {"model_type", "qwen3"},
                {"vocab_size", 151936},
                {"hidden_size", 1024},
                {"intermediate_size", 3072},
                {"num_hidden_layers", 28},
                {"num_attention_heads", 16},
                {"num_key_value_heads", 8},
                {"head_dim", 128},
                {"max_position_embeddings", 40960},
                {"rms_norm_eps", 1e-6},
                {"rope_theta", 1000000},
                {"rope_scaling", nullptr},
                {"attention_bias", false},
                {"tie_word_embeddings", true},
                {"hidden_act", "silu"},
                {"eos_token_id", 151645},
                {"torch_dtype", "bfloat16"}};
}

ModelConfig parse(const Json &j) {
    return ModelConfig::parse(j.dump(), "cfg.json");
}

TEST(Config, ParsesQwen3WithQkNormGqaAndTiedEmbeddings) {
    ModelConfig c = parse(qwen3());
    EXPECT_EQ(c.architecture, Architecture::Qwen3);
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.q_size(), 2048); // head_dim * heads differs from hidden_size
    EXPECT_EQ(c.num_key_value_groups(), 2);
    EXPECT_TRUE(c.qk_norm);
    EXPECT_FALSE(c.qkv_bias);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
    EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151645});
    EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(Config, Qwen3HeadDimDefaultsTo128AsTransformersDoes) {
    Json j = qwen3();
    j.erase("head_dim");
    EXPECT_EQ(parse(j).head_dim, 128);
}

TEST(Config, Qwen2AlwaysHasQkvBiasButNoOutputBias) {
    Json j = qwen3();
    j["architectures"] = {"Qwen2ForCausalLM"};
    j["model_type"] = "qwen2";
    j.erase("head_dim");
    ModelConfig c = parse(j);
    EXPECT_TRUE(c.qkv_bias);
    EXPECT_FALSE(c.o_bias);
    EXPECT_FALSE(c.qk_norm);
    EXPECT_EQ(c.head_dim, 64);
}

TEST(Config, LlamaReadsBiasesAndLlama3RopeScaling) {
    Json j = qwen3();
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j.erase("head_dim");
    j["attention_bias"] = true;
    j["mlp_bias"] = true;
    j["eos_token_id"] = {128001, 128009};
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
    ModelConfig c = parse(j);
    EXPECT_EQ(c.architecture, Architecture::Llama);
    EXPECT_TRUE(c.qkv_bias && c.o_bias && c.mlp_bias);
    EXPECT_EQ(c.rope_scaling, RopeScaling::Llama3);
    EXPECT_EQ(c.rope_original_max_position_embeddings, 8192);
    EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128009}));
}

TEST(Config, LegacyTypeKeySelectsLinearScaling) {
    Json j = qwen3();
    j["rope_scaling"] = {{"type", "linear"}, {"factor", 4}};
    ModelConfig c = parse(j);
    EXPECT_EQ(c.rope_scaling, RopeScaling::Linear);
    EXPECT_DOUBLE_EQ(c.rope_factor, 4.0);
}

TEST(Config, ArchitectureFromModelTypeWhenArchitecturesIsAbsent) {
    Json j = qwen3();
    j.erase("architectures");
    EXPECT_EQ(parse(j).architecture, Architecture::Qwen3);
}

TEST(Config, UnsupportedValuesAreRefusedNamingTheKey) {
    struct Case {
        const char *key;
        Json value;
        const char *expect;
    };
    const std::vector<Case> cases = {
        {"architectures", {"MistralForCausalLM"}, "'architectures' = 'MistralForCausalLM'"},
        {"model_type", "llama", "'model_type'"},
        {"rope_scaling",
         {{"rope_type", "yarn"}, {"factor", 4}},
         "'rope_scaling.rope_type' = 'yarn'"},
        {"rope_scaling", {{"rope_type", "linear"}, {"factor", 0.5}}, "'factor'"},
        {"rope_scaling",
         {{"rope_type", "llama3"}, {"factor", 8}},
         "'original_max_position_embeddings' is required"},
        {"rope_scaling",
         {{"rope_type", "llama3"},
          {"factor", 8},
          {"low_freq_factor", 4},
          {"high_freq_factor", 1},
          {"original_max_position_embeddings", 8192}},
         "'high_freq_factor' must be greater"},
        {"hidden_act", "gelu", "'hidden_act'"},
        {"use_sliding_window", true, "'use_sliding_window'"},
        {"quantization_config", {{"quant_method", "gptq"}}, "'quantization_config'"},
        {"num_key_value_heads", 3, "'num_key_value_heads'"},
        {"head_dim", 7, "'head_dim'"},
        {"hidden_size", "1024", "'hidden_size' must be an integer"},
        {"vocab_size", 0, "'vocab_size' must be >= 1"},
        {"rms_norm_eps", -1, "'rms_norm_eps'"},
        {"attention_dropout", 0.1, "'attention_dropout'"},
        {"partial_rotary_factor", 0.5, "'partial_rotary_factor'"},
        {"layer_types", {"full_attention", "sliding_attention"}, "'layer_types'"},
        {"tie_word_embeddings", "yes", "'tie_word_embeddings'"},
        {"eos_token_id", {1, -2}, "'eos_token_id'"},
    };
    for (const auto &c : cases) {
        Json j = qwen3();
        j[c.key] = c.value;
        const std::string msg = error_of([&] { parse(j); });
        EXPECT_NE(msg.find(c.expect), std::string::npos) << c.key << ": " << msg;
        EXPECT_NE(msg.find("cfg.json"), std::string::npos) << msg;
    }
}

TEST(Config, MissingRequiredKeysAndBadJsonAreErrors) {
    Json j = qwen3();
    j.erase("hidden_size");
    EXPECT_NE(error_of([&] { parse(j); }).find("'hidden_size' is required"), std::string::npos);
    EXPECT_NE(error_of([] { ModelConfig::parse("{", "x.json"); }).find("x.json: not valid JSON"),
              std::string::npos);
    EXPECT_NE(error_of([] { ModelConfig::parse("[]", "x.json"); }).find("not a JSON object"),
              std::string::npos);
    EXPECT_NE(error_of([] {
                  ModelConfig::load("/nonexistent/config.json");
              }).find("/nonexistent/config.json"),
              std::string::npos);
}

// A config.json nested 100,000 deep parses (nlohmann's parser is iterative) but
// copying or printing it would overflow the stack: refused before parsing.
TEST(Config, DeeplyNestedJsonAndNumbersOutOfRangeAreRefusedNamingTheFile) {
    const std::string deep =
        R"({"architectures": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
    EXPECT_NE(error_of([&] {
                  ModelConfig::parse(deep, "deep/config.json");
              }).find("deep/config.json: JSON nested deeper than 128 levels (at byte 145)"),
              std::string::npos)
        << error_of([&] { ModelConfig::parse(deep, "deep/config.json"); });
    // Brackets inside strings do not count.
    EXPECT_EQ(rl::core::json_nesting_depth(R"({"a": "[[[[\"[[", "b": [[1]]})", 128), 3u);
    EXPECT_NE(error_of([] {
                  ModelConfig::parse(R"({"rms_norm_eps": 1e400})", "big.json");
              }).find("big.json: a number is out of range"),
              std::string::npos);
}

TEST(Config, ToJsonKeepsUnknownKeysAndSetsTheDtype) {
    Json j = qwen3();
    j["my_custom_key"] = {1, 2, 3};
    ModelConfig c = parse(j);
    Json out = Json::parse(c.to_json("float32"));
    EXPECT_EQ(out["my_custom_key"], j["my_custom_key"]);
    EXPECT_EQ(out["torch_dtype"], "float32");
    ModelConfig again = ModelConfig::parse(out.dump(), "again");
    EXPECT_EQ(again.hidden_size, c.hidden_size);
}

} // namespace
} // namespace rl::core
