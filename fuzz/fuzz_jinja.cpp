// Fuzz target: a Jinja chat template (rl::core::ChatTemplate: the lexer,
// parser and interpreter of jinja.cpp) rendered with a fixed small
// conversation (system, user, assistant with a tool call and reasoning, tool
// result), one tool, the special tokens and extra variables a model's
// tokenizer_config.json passes, and a fixed time for strftime_now().
#include "fuzz_target.hpp"

#include "rl/core/chat_template.hpp"
#include "rl/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const std::string messages = R"([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Reverse 'abc', then call f."},
        {"role": "assistant", "content": "<think>easy</think>\n\ncba",
         "reasoning_content": "easy",
         "tool_calls": [{"type": "function", "id": "c1",
                         "function": {"name": "f", "arguments": {"x": [1, 2.5, null, true]}}}]},
        {"role": "tool", "content": "{\"ok\": true}", "tool_call_id": "c1"},
        {"role": "user", "content": "ünïcödé \ud83d\ude00"}])";
    static const std::string special_tokens =
        R"({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})";
    rl::core::ChatTemplateOptions options;
    options.tools_json =
        R"([{"type": "function", "function": {"name": "f", "description": "d",
             "parameters": {"type": "object", "properties": {"x": {"type": "array"}}}}}])";
    options.variables_json = R"({"enable_thinking": false})";
    options.now = 1721995200; // 2024-07-26 12:00 UTC
    try {
        const rl::core::ChatTemplate t(fuzz_text(data, size), "fuzz template");
        (void)t.render(messages, options, special_tokens);
        options.add_generation_prompt = false;
        (void)t.render(messages, options, special_tokens);
    } catch (const rl::core::Error &) {
    }
    return 0;
}
