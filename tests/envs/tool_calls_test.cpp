// rl/sdk/tool_calls.hpp: tool calls read back from generated text (hermes and
// llama3_json families), never an exception on malformed text, the family of
// a chat template, and calls checked against OpenAI function schemas.
#include "rl/sdk/tool_calls.hpp"

#include <gtest/gtest.h>

#include <string>

namespace {

using json = nlohmann::ordered_json;
using rl::sdk::tools::check_call;
using rl::sdk::tools::detect_family;
using rl::sdk::tools::parse_tool_calls;
using rl::sdk::tools::ToolCall;

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
   "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
      "lat": {"type": "number"}, "tags": {"type": "array"}, "opts": {"type": "object"},
      "note": {"type": ["string", "null"]}},
    "required": ["city"]}}},
  {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
   "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"],
   "additionalProperties": false}}}
])");

TEST(ToolCallsHermes, SeveralCallsInOrderWithTheContentBeforeThem) {
    const std::string text = "Let me look that up.\n<tool_call>\n{\"name\": \"get_weather\", "
                             "\"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n"
                             "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": "
                             "2.5}}\n</tool_call>";
    const auto p = parse_tool_calls(text, "hermes");
    EXPECT_TRUE(p.errors.empty());
    EXPECT_EQ(p.content, "Let me look that up.");
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(p.calls[0].arguments, json({{"city", "Paris"}, {"days", 2}}));
    EXPECT_EQ(json::parse(p.calls[0].arguments_text), p.calls[0].arguments);
    EXPECT_EQ(p.calls[1].name, "add");
    EXPECT_EQ(p.calls[1].arguments, json({{"a", 1}, {"b", 2.5}}));
}

TEST(ToolCallsHermes, ArgumentsKeepTheOrderTheModelWroteThem) {
    const auto p = parse_tool_calls(
        "<tool_call>{\"name\": \"add\", \"arguments\": {\"b\": 1, \"a\": 2}}</tool_call>",
        "hermes");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].arguments_text, "{\"b\":1,\"a\":2}");
}

// Text without a call (a Hermes block, a Llama 3 JSON object), empty or not,
// is no call, no error and all content (trimmed), in every family.
TEST(ToolCalls, TextWithoutCallsIsAllContentInEveryFamily) {
    struct Case {
        const char *family, *text, *content;
    };
    for (const Case &c : {Case{"hermes", "  The answer is 4.\n", "The answer is 4."},
                          Case{"llama3_json", "Paris is sunny {today}.", "Paris is sunny {today}."},
                          Case{"hermes", "", ""}, Case{"llama3_json", "", ""}}) {
        const auto p = parse_tool_calls(c.text, c.family);
        EXPECT_TRUE(p.calls.empty()) << c.family << ": " << c.text;
        EXPECT_TRUE(p.errors.empty()) << c.family << ": " << c.text;
        EXPECT_EQ(p.content, c.content) << c.family;
    }
}

TEST(ToolCallsHermes, MalformedJsonIsAnErrorNamingTheCallAndTheOthersStillParse) {
    const std::string text = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1,}}\n"
                             "</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": "
                             "{\"a\": 1, \"b\": 2}}\n</tool_call>";
    const auto p = parse_tool_calls(text, "hermes");
    ASSERT_EQ(p.errors.size(), 1u);
    EXPECT_EQ(p.errors[0].rfind("could not parse tool call 1: invalid JSON", 0), 0u) << p.errors[0];
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].arguments, json({{"a", 1}, {"b", 2}}));
}

TEST(ToolCallsHermes, AnUnclosedBlockIsAnError) {
    const auto p = parse_tool_calls(
        "ok\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}", "hermes");
    EXPECT_TRUE(p.calls.empty());
    ASSERT_EQ(p.errors.size(), 1u);
    EXPECT_EQ(p.errors[0],
              "could not parse tool call 1: the <tool_call> block is not closed by </tool_call>");
    EXPECT_EQ(p.content, "ok");
    // An unclosed block followed by a good one: the good one is call 2.
    const auto q = parse_tool_calls("<tool_call>{\"name\": \"a\"<tool_call>{\"name\": \"b\"}"
                                    "</tool_call>",
                                    "hermes");
    ASSERT_EQ(q.errors.size(), 1u);
    EXPECT_EQ(q.errors[0].rfind("could not parse tool call 1: ", 0), 0u);
    ASSERT_EQ(q.calls.size(), 1u);
    EXPECT_EQ(q.calls[0].name, "b");
    EXPECT_EQ(q.calls[0].arguments, json::object());
}

TEST(ToolCallsHermes, AMissingOrEmptyNameIsAnError) {
    const auto p = parse_tool_calls("<tool_call>{\"arguments\": {}}</tool_call>"
                                    "<tool_call>{\"name\": \"\"}</tool_call>"
                                    "<tool_call>[1, 2]</tool_call><tool_call>\n</tool_call>",
                                    "hermes");
    EXPECT_TRUE(p.calls.empty());
    ASSERT_EQ(p.errors.size(), 4u);
    EXPECT_EQ(p.errors[0], "could not parse tool call 1: the object has no \"name\"");
    EXPECT_EQ(p.errors[1], "could not parse tool call 2: \"name\" must be a non-empty string");
    EXPECT_EQ(p.errors[2], "could not parse tool call 3: expected a JSON object, got array");
    EXPECT_EQ(p.errors[3], "could not parse tool call 4: the <tool_call> block is empty");
}

TEST(ToolCallsHermes, ArgumentsGivenAsAJsonStringAreParsed) {
    const auto p = parse_tool_calls(
        "<tool_call>\n{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1, \\\"b\\\": 2}\"}\n"
        "</tool_call>",
        "hermes");
    ASSERT_TRUE(p.errors.empty()) << p.errors[0];
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].arguments, json({{"a", 1}, {"b", 2}}));
    EXPECT_EQ(p.calls[0].arguments_text, "{\"a\":1,\"b\":2}");
    // A string that is not JSON, and arguments that are not an object.
    const auto q = parse_tool_calls("<tool_call>{\"name\": \"add\", \"arguments\": \"a=1\"}"
                                    "</tool_call><tool_call>{\"name\": \"add\", \"arguments\": 3}"
                                    "</tool_call>",
                                    "hermes");
    ASSERT_EQ(q.errors.size(), 2u);
    EXPECT_EQ(q.errors[0], "could not parse tool call 1: \"arguments\" of 'add' is a string that "
                           "is not JSON: \"a=1\"");
    EXPECT_EQ(q.errors[1],
              "could not parse tool call 2: \"arguments\" of 'add' must be an object, got number");
}

TEST(ToolCallsHermes, UnicodeSurvivesInNamesArgumentsAndContent) {
    const std::string text =
        "Voilà 🙂\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Zürich «ü» 東京\", \"note\": \"\\u00e9\"}}\n</tool_call>";
    const auto p = parse_tool_calls(text, "hermes");
    ASSERT_TRUE(p.errors.empty());
    EXPECT_EQ(p.content, "Voilà 🙂");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].arguments["city"], "Zürich «ü» 東京");
    EXPECT_EQ(p.calls[0].arguments["note"], "é");
    EXPECT_NE(p.calls[0].arguments_text.find("東京"), std::string::npos);
}

TEST(ToolCallsHermes, InvalidUtf8NeverThrows) {
    const std::string text =
        "\xff\xfe<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": \"\xc3\"}}"
        "</tool_call>";
    const auto p = parse_tool_calls(text, "hermes");
    EXPECT_TRUE(p.calls.empty());
    ASSERT_EQ(p.errors.size(), 1u);
    EXPECT_EQ(p.errors[0].rfind("could not parse tool call 1: invalid JSON", 0), 0u);
}

TEST(ToolCallsLlama3, OneCallWithParametersOrArguments) {
    const auto p = parse_tool_calls(
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "llama3_json");
    ASSERT_TRUE(p.errors.empty());
    EXPECT_EQ(p.content, "");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(p.calls[0].arguments, json({{"city", "Paris"}}));
    const auto q = parse_tool_calls(
        "<|python_tag|>{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}", "llama3_json");
    ASSERT_TRUE(q.errors.empty());
    ASSERT_EQ(q.calls.size(), 1u);
    EXPECT_EQ(q.calls[0].arguments, json({{"a", 1}, {"b", 2}}));
}

TEST(ToolCallsLlama3, SeveralCallsSeparatedBySemicolons) {
    const auto p =
        parse_tool_calls("<|python_tag|>{\"name\": \"a\", \"parameters\": {\"s\": \"x;}{\"}}; "
                         "{\"name\": \"b\", \"parameters\": {}};",
                         "llama3_json");
    ASSERT_TRUE(p.errors.empty()) << p.errors[0];
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[0].arguments["s"], "x;}{");
    EXPECT_EQ(p.calls[1].name, "b");
}

TEST(ToolCallsLlama3, MalformedCallsAreErrors) {
    auto p = parse_tool_calls("{\"name\": \"a\", \"parameters\": {\"x\": 1}", "llama3_json");
    ASSERT_EQ(p.errors.size(), 1u);
    EXPECT_EQ(p.errors[0], "could not parse tool call 1: the JSON object is not closed (the text "
                           "ends inside it)");
    p = parse_tool_calls("{\"parameters\": {}}", "llama3_json");
    ASSERT_EQ(p.errors.size(), 1u);
    EXPECT_EQ(p.errors[0], "could not parse tool call 1: the object has no \"name\"");
    p = parse_tool_calls("{\"name\": \"a\"} and then text", "llama3_json");
    ASSERT_EQ(p.calls.size(), 1u);
    ASSERT_EQ(p.errors.size(), 1u);
    EXPECT_EQ(p.errors[0].rfind("could not parse tool call 2: expected ';' between calls", 0), 0u);
    p = parse_tool_calls("<|python_tag|>brave_search.call(query=\"x\")", "llama3_json");
    ASSERT_EQ(p.errors.size(), 1u);
    EXPECT_EQ(p.errors[0].rfind("could not parse tool call 1: invalid JSON", 0), 0u);
}

TEST(ToolCalls, AnUnknownFamilyIsAnErrorAndTheTextIsContent) {
    const auto p = parse_tool_calls("hi", "mistral");
    EXPECT_EQ(p.content, "hi");
    ASSERT_EQ(p.errors.size(), 1u);
    EXPECT_EQ(p.errors[0], "unknown tool-call family 'mistral' (known: hermes, llama3_json)");
}

TEST(ToolCalls, DetectFamilyFromTheTemplateSource) {
    EXPECT_EQ(detect_family("{{- '<tool_call>\\n{\"name\": \"' }}"), "hermes");
    EXPECT_EQ(detect_family("{{- \"<|python_tag|>\" + tool_call.name }}<|eot_id|>"), "llama3_json");
    EXPECT_EQ(detect_family("{{- '\"parameters\": ' }}{{ '<|eot_id|>' }}"), "llama3_json");
    EXPECT_EQ(detect_family("{% for m in messages %}{{ m.content }}{% endfor %}"), "");
    EXPECT_EQ(detect_family(""), "");
}

ToolCall call(const std::string &name, const json &args) {
    ToolCall c;
    c.name = name;
    c.arguments = args;
    c.arguments_text = args.dump();
    return c;
}

TEST(ToolCallsCheck, AGoodCallHasNoProblems) {
    EXPECT_TRUE(check_call(call("get_weather", {{"city", "Paris"},
                                                {"days", 2},
                                                {"metric", true},
                                                {"lat", 48},
                                                {"tags", json::array()},
                                                {"opts", json::object()},
                                                {"note", nullptr},
                                                {"extra", 1}}),
                           kTools)
                    .empty());
    // 2.0 is an integer in JSON Schema, and so is any integral number past
    // the range of a 64-bit integer (checked without a cast: the fuzz target
    // found that a cast of 2.2e119 was undefined behaviour).
    EXPECT_TRUE(check_call(call("get_weather", {{"city", "x"}, {"days", 2.0}}), kTools).empty());
    EXPECT_TRUE(
        check_call(call("get_weather", {{"city", "x"}, {"days", 2.2e119}}), kTools).empty());
    EXPECT_TRUE(
        check_call(call("get_weather", {{"city", "x"}, {"days", -9.3e18}}), kTools).empty());
}

TEST(ToolCallsCheck, UnknownToolNamesTheKnownOnes) {
    const auto p = check_call(call("get_wether", json::object()), kTools);
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0], "unknown tool 'get_wether' (known: get_weather, add)");
    const auto q = check_call(call("x", json::object()), json::array());
    ASSERT_EQ(q.size(), 1u);
    EXPECT_EQ(q[0], "unknown tool 'x' (known: none)");
}

TEST(ToolCallsCheck, MissingRequiredArgumentsAreNamed) {
    const auto p = check_call(call("add", {{"a", 1}}), kTools);
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0], "tool 'add': missing required argument 'b'");
}

TEST(ToolCallsCheck, WrongTypesAreNamedWithWhatCame) {
    const auto p = check_call(call("get_weather", {{"city", 3},
                                                   {"days", "2"},
                                                   {"metric", "yes"},
                                                   {"lat", "48.1"},
                                                   {"tags", "a,b"},
                                                   {"opts", json::array()},
                                                   {"note", 1.5}}),
                              kTools);
    const std::vector<std::string> want = {
        "tool 'get_weather': argument 'city' must be a string, got integer",
        "tool 'get_weather': argument 'days' must be an integer, got string",
        "tool 'get_weather': argument 'metric' must be a boolean, got string",
        "tool 'get_weather': argument 'lat' must be a number, got string",
        "tool 'get_weather': argument 'tags' must be an array, got string",
        "tool 'get_weather': argument 'opts' must be an object, got array",
        "tool 'get_weather': argument 'note' must be a string or null, got number",
    };
    EXPECT_EQ(p, want);
    EXPECT_EQ(check_call(call("get_weather", {{"city", "x"}, {"days", 2.5}}), kTools),
              std::vector<std::string>{
                  "tool 'get_weather': argument 'days' must be an integer, got number"});
}

TEST(ToolCallsCheck, UndeclaredArgumentsAreRefusedOnlyWhenTheSchemaIsClosed) {
    const auto p = check_call(call("add", {{"a", 1}, {"b", 2}, {"c", 3}}), kTools);
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0], "tool 'add': unexpected argument 'c' (not among its parameters)");
}

TEST(ToolCallsCheck, ParsedCallsCheckEndToEnd) {
    const auto parsed = parse_tool_calls(
        "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": \"1\"}}\n</tool_call>", "hermes");
    ASSERT_EQ(parsed.calls.size(), 1u);
    const auto p = check_call(parsed.calls[0], kTools);
    const std::vector<std::string> want = {"tool 'add': missing required argument 'b'",
                                           "tool 'add': argument 'a' must be a number, got string"};
    EXPECT_EQ(p, want);
}

} // namespace
