// ChatML and Llama-3 chat formats.
#include "rl/core/chat_template.hpp"
#include "rl/core/error.hpp"
#include "test_util.hpp"

namespace rl::core {
namespace {

using test::error_of;

TEST(ChatTemplate, ChatMLRendersTurnsAndTheGenerationPrompt) {
    const std::vector<ChatMessage> msgs = {{"system", "You are helpful."},
                                           {"user", "Hi"},
                                           {"assistant", "Hello!"},
                                           {"user", "Reverse 'abc'"}};
    EXPECT_EQ(apply_chat_template(ChatFormat::ChatML, msgs),
              "<|im_start|>system\nYou are helpful.<|im_end|>\n"
              "<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\nHello!<|im_end|>\n"
              "<|im_start|>user\nReverse 'abc'<|im_end|>\n"
              "<|im_start|>assistant\n");
    ChatTemplateOptions o;
    o.add_generation_prompt = false;
    EXPECT_EQ(apply_chat_template(ChatFormat::ChatML, {{"user", "x"}}, o),
              "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplate, ChatMLDefaultSystemOnlyWhenThereIsNone) {
    ChatTemplateOptions o;
    o.default_system = "You are Qwen.";
    EXPECT_EQ(apply_chat_template(ChatFormat::ChatML, {{"user", "x"}}, o),
              "<|im_start|>system\nYou are "
              "Qwen.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_EQ(
        apply_chat_template(ChatFormat::ChatML, {{"system", "S"}, {"user", "x"}}, o),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, Llama3RendersHeadersAndStripsContent) {
    const std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "  Hi there \n"}};
    EXPECT_EQ(apply_chat_template(ChatFormat::Llama3, msgs),
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, DetectsFormatsAndRefusesUnknownOnes) {
    EXPECT_EQ(detect_chat_format("{{ '<|im_start|>' + message['role'] }}"), ChatFormat::ChatML);
    EXPECT_EQ(
        detect_chat_format("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}"),
        ChatFormat::Llama3);
    EXPECT_FALSE(detect_chat_format("[INST] {{ m }} [/INST]").has_value());
    EXPECT_EQ(parse_chat_format("qwen"), ChatFormat::ChatML);
    EXPECT_EQ(parse_chat_format("llama3"), ChatFormat::Llama3);
    EXPECT_NE(error_of([] { parse_chat_format("mistral"); }).find("'mistral'"), std::string::npos);
    EXPECT_NE(error_of([] {
                  apply_chat_template(ChatFormat::ChatML, {{"user", "a"}, {"tool", "b"}});
              }).find("messages[1].role 'tool'"),
              std::string::npos);
}

} // namespace
} // namespace rl::core
