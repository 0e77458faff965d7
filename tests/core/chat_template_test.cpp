// Built-in chat formats (ChatML, Llama-3) and the Jinja engine that renders models'
// own chat templates.
#include "rl/core/chat_template.hpp"
#include "rl/core/error.hpp"
#include "test_util.hpp"

#include <random>

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

TEST(ChatTemplate, BuiltInFormatsRefuseUnknownNamesAndRoles) {
    EXPECT_EQ(parse_chat_format("qwen"), ChatFormat::ChatML);
    EXPECT_EQ(parse_chat_format("llama3"), ChatFormat::Llama3);
    EXPECT_NE(error_of([] { parse_chat_format("mistral"); }).find("'mistral'"), std::string::npos);
    EXPECT_NE(error_of([] {
                  apply_chat_template(ChatFormat::ChatML, {{"user", "a"}, {"tool", "b"}});
              }).find("messages[1].role 'tool'"),
              std::string::npos);
}

// ---- the Jinja engine (expected values are jinja2's with transformers' settings)

const char *kContext = R"({
  "x": 1, "d": {"b": 2, "a": 1}, "s": "Hello!",
  "obj": {"name": "f", "args": {"x": [1, 2.5, null, true]}, "u": "ü"},
  "msgs": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"},
           {"role": "user", "content": "u2"}]})";

std::string
render(const std::string &tmpl, const std::string &vars = kContext,
       const std::string &messages =
           R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])") {
    ChatTemplateOptions o;
    o.variables_json = vars;
    o.now = 1721995200; // 2024-07-26 12:00 UTC
    return ChatTemplate(tmpl, "t").render(messages, o);
}

TEST(Jinja, WhitespaceControlFollowsTrimBlocksAndLstripBlocks) {
    EXPECT_EQ(render("A\n  {% if true %}\n  x\n  {% endif %}\nB {{- ' c ' -}} D\n{# note #}\nE"
                     "{%- if true -%}  F  {%- endif %}\n"),
              "A\n  x\nB c D\nEF");
    // lstrip_blocks does not apply to {{ }}; one trailing newline is dropped.
    EXPECT_EQ(render("a\n    {{ 'v' }}\n  {% if true %}b{% endif %}\n"), "a\n    v\nb");
    EXPECT_EQ(render("x\n"), "x");
    EXPECT_EQ(render("x\n\n"), "x\n");
    EXPECT_EQ(render("  {%+ if true %}k{% endif +%}\nz"), "  k\nz");
}

TEST(Jinja, LoopsExposeLoopVariablesFiltersElseAndControls) {
    EXPECT_EQ(render("{% for m in messages %}{{ loop.index0 }}/{{ loop.index }}/{{ loop.length }}"
                     "{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %}:{{ m.role }};"
                     "{% endfor %}"),
              "0/1/2F:user;1/2/2L:assistant;");
    EXPECT_EQ(
        render("{% for k, v in d | items %}{{ k }}={{ v }},{% endfor %}|{% for k in d %}{{ k }}"
               "{% endfor %}|{% for x in [1,2,3,4,5] if x is odd %}{% if x == 5 %}{% break %}"
               "{% endif %}{{ x }}{% endfor %}|{% for x in [] %}no{% else %}empty{% endfor %}|"
               "{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}"
               "{% endfor %}"),
        "b=2,a=1,|ba|13|empty|13");
    EXPECT_EQ(
        render("{% for m in messages[::-1] %}{{ m.role[0] }}{{ loop.revindex0 }}{% endfor %}"),
        "a1u0");
}

TEST(Jinja, SetInALoopStaysInTheLoopButNamespacesCarryOut) {
    EXPECT_EQ(render("{% set x = 1 %}{% set ns = namespace(n=0) %}{% for i in range(3) %}"
                     "{% set x = x + i %}{% set ns.n = ns.n + i %}{% endfor %}{{ x }},{{ ns.n }}"),
              "1,3");
    EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}"
                     "{{ greet('A') }} {{ greet('B', punct='?') }}{% set block %}inner {{ 1 + 1 }}"
                     "{% endset %}|{{ block }}"),
              "Hello A! Hello B?|inner 2");
}

TEST(Jinja, FiltersBehaveAsInJinja2) {
    EXPECT_EQ(render("{{ '  a b  ' | trim }}|{{ [1,2,3] | length }}|{{ 'AbC' | lower }}"
                     "{{ 'abc' | upper }}|{{ 'a-b-c' | replace('-', '+') }}|"
                     "{{ undefined_thing | default('dflt') }}|{{ '' | default('empty', true) }}|"
                     "{{ [1,2,3] | join(', ') }}|{{ [1,2,3] | first }}{{ [1,2,3] | last }}|"
                     "{{ 42 | string }}|{{ msgs | selectattr('role', 'equalto', 'user') | "
                     "map(attribute='content') | join(',') }}|{{ msgs | rejectattr('role', "
                     "'equalto', 'user') | list | length }}|{{ d | dictsort }}"),
              "a b|3|abcABC|a+b+c|dflt|empty|1, 2, 3|13|42|u1,u2|1|[('a', 1), ('b', 2)]");
}

TEST(Jinja, SafeStringsEscapeWhatIsAddedToThemAsMarkupDoes) {
    // meetkai-functionary-medium-v3.1 relies on this: "..."|safe + tojson.
    EXPECT_EQ(render("{{ 'a<'|safe + obj.name + '\"x\"' }}|{{ 'a' ~ ('<'|safe) ~ '>' }}"),
              "a<f&#34;x&#34;|a<>");
}

TEST(Jinja, TojsonMatchesPythonJsonDumps) {
    EXPECT_EQ(render("{{ obj | tojson }}\n{{ obj | tojson(indent=2) }}\n{{ 'é\"\\n' | tojson }}|"
                     "{{ [] | tojson(indent=4) }}|{{ 1.5 | tojson }}{{ none | tojson }}"
                     "{{ true | tojson }}"),
              "{\"name\": \"f\", \"args\": {\"x\": [1, 2.5, null, true]}, \"u\": \"ü\"}\n{\n  "
              "\"name\": \"f\",\n  \"args\": {\n    \"x\": [\n      1,\n      2.5,\n      null,\n"
              "      true\n    ]\n  },\n  \"u\": \"ü\"\n}\n\"é\\\"\\n\"|[]|1.5nulltrue");
}

TEST(Jinja, TestsOperatorsAndStringMethodsFollowPython) {
    EXPECT_EQ(render("{{ x is defined }}{{ nope is defined }}{{ none is none }}{{ 'a' is string }}"
                     "{{ d is mapping }}{{ [1] is iterable }}{{ 'a' is sequence }}{{ 1 is string }}"
                     "{{ d is not mapping }}{{ 3 is number }}{{ false is false }}"),
              "TrueFalseTrueTrueTrueTrueTrueFalseFalseTrueTrue");
    EXPECT_EQ(render("{{ s.startswith('He') }}{{ s.endswith('!') }}|{{ '  x  '.strip() }}|"
                     "{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}|{{ s.split(' ') }}|"
                     "{{ 'a,b,,c'.split(',')[-1] }}|{{ s[::-1] }}|{{ s[1:4] }}|{{ s[-1] }}|"
                     "{{ 'ell' in s }}{{ 'z' not in s }}|{{ 'a' ~ 1 ~ none }}|"
                     "{{ 1 < 2 and not (2 > 3) or false }}|{{ 'yes' if s else 'no' }}|"
                     "{{ 7 // 2 }},{{ -7 // 2 }},{{ 7 % 3 }},{{ 7 / 2 }},{{ 2 ** 10 }}|"
                     "{{ 'ü🙂x' | length }}|{{ 'Hi {}, {name}!'.format('A', name='B') }}|"
                     "{{ [1, 'a', none, true, 1.0] }}|{{ d }}"),
              "TrueTrue|x|axx|xxa|['Hello!']|c|!olleH|ell|!|TrueTrue|a1None|True|yes|"
              "3,-4,1,3.5,1024|3|Hi A, B!|[1, 'a', None, True, 1.0]|{'b': 2, 'a': 1}");
}

TEST(Jinja, StrftimeNowUsesTheInjectedTime) {
    EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d') }}"),
              "26 Jul 2024|2024-07-26");
}

TEST(Jinja, UnsupportedSyntaxIsAnErrorNamingTheConstructAndLine) {
    auto err = [](const std::string &tmpl) { return error_of([&] { render(tmpl); }); };
    EXPECT_NE(
        err("a\nb\n{% include 'x.jinja' %}").find("t line 3: unsupported tag '{% include %}'"),
        std::string::npos);
    EXPECT_NE(err("{{ x }}\n{{ x | wordwrap(3) }}").find("t line 2: unsupported filter 'wordwrap'"),
              std::string::npos);
    EXPECT_NE(err("\n{% if x is divisibleby3 %}{% endif %}")
                  .find("t line 2: unsupported test 'divisibleby3'"),
              std::string::npos);
    EXPECT_NE(err("{% for x in y recursive %}{% endfor %}").find("recursive"), std::string::npos);
    EXPECT_NE(err("\n\n{% if x %}\nopen").find("t line 3: '{% if %}' is never closed"),
              std::string::npos);
    EXPECT_NE(err("{% endfor %}").find("unexpected '{% endfor %}'"), std::string::npos);
    EXPECT_NE(err("{{ 'a' %s }}").find("t line 1"), std::string::npos);
    EXPECT_NE(err("\n{{ s.zfill(3) }}").find("t line 2: unsupported string method 'zfill'"),
              std::string::npos);
    EXPECT_NE(err("{% break %}").find("outside of a loop"), std::string::npos);
}

TEST(Jinja, RenderErrorsNameTheLine) {
    auto err = [](const std::string &tmpl) { return error_of([&] { render(tmpl); }); };
    EXPECT_NE(err("ok\n{{ raise_exception('Roles must alternate') }}")
                  .find("t line 2: raise_exception: Roles must alternate"),
              std::string::npos);
    EXPECT_NE(err("\n\n{{ nope.attr }}").find("t line 3: 'nope' is undefined"), std::string::npos);
    EXPECT_NE(
        err("{% set l = [1] %}\n{{ l.append(2) }}").find("t line 2: list.append() is not allowed"),
        std::string::npos);
    EXPECT_NE(err("{{ 1 + 'a' }}").find("unsupported operand type(s) for +: 'int' and 'str'"),
              std::string::npos);
    EXPECT_NE(err("{{ undefined_fn(1) }}").find("'undefined_fn' is undefined"), std::string::npos);
}

TEST(Jinja, TheModelTemplateSeesMessagesToolsAndSpecialTokens) {
    const ChatTemplate t(
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}"
        "{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}"
        "{% endif %}]{% endfor %}{% if tools %}{{ tools | length }} tools{% endif %}"
        "{% if add_generation_prompt %}>{% endif %}{{ enable_thinking }}");
    ChatTemplateOptions o;
    o.tools_json = R"([{"type": "function", "function": {"name": "f"}}])";
    o.variables_json = R"({"enable_thinking": false})";
    EXPECT_EQ(t.render(R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
                          "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}])",
                       o, R"({"bos_token": "<s>"})"),
              "<s>[user:q][assistant:{\"a\": 1}]1 tools>False");
    o.add_generation_prompt = false;
    EXPECT_EQ(t.render({{"user", "q"}}, o), "[user:q]1 toolsFalse");
}

// ---- hostile templates: each limit is an error naming the line, never a crash or a hang

std::string repeat(const std::string &s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
}

// `err` renders and expects an rl::core::Error whose message holds `what`.
void expect_error(const std::string &tmpl, const std::string &what) {
    const std::string e = error_of([&] { render(tmpl); });
    EXPECT_NE(e.find(what), std::string::npos) << "got: " << e.substr(0, 300);
}

TEST(Jinja, FiltersMethodsTestsAndFunctionsRefuseMissingOrExtraArguments) {
    expect_error("\n{{ 'a'|replace('a') }}", "t line 2: replace() missing required argument 'new'");
    expect_error("{{ 'a'|replace }}", "replace() missing required argument 'old'");
    expect_error("{{ 'a'.replace('a') }}", "replace() missing required argument 'new'");
    expect_error("{{ 'a'|replace('a', 'b', 'c') }}", "replace: count must be an integer");
    expect_error("{{ 'a'|safe(1) }}", "safe() takes at most 0 arguments (1 given)");
    expect_error("{{ 'a'|upper(1) }}", "upper() takes at most 0 arguments");
    expect_error("{{ [1]|first(1) }}", "first() takes at most 0 arguments");
    expect_error("{{ 'a'|int(0, 16) }}", "int() takes at most 1 argument (2 given)");
    expect_error("{{ [1]|map(1, attribute='a') }}", "map: a filter name and attribute=");
    expect_error("{{ [1]|select('odd', x=1) }}", "select: unexpected keyword argument 'x'");
    expect_error("{{ 1 is eq }}", "test 'eq' takes 1 argument (0 given)");
    expect_error("{{ 1 is eq(1, 2) }}", "test 'eq' takes 1 argument (2 given)");
    expect_error("{{ 1 is defined(1) }}", "test 'defined' takes no argument (1 given)");
    expect_error("{{ [1, 2]|select('divisibleby')|list }}", "test 'divisibleby' takes 1 argument");
    expect_error("{{ 'a'.startswith() }}", "startswith() missing required argument 'prefix'");
    expect_error("{{ 'a'.find() }}", "find() missing required argument 'sub'");
    expect_error("{{ ','.join() }}", "join() missing required argument 'iterable'");
    expect_error("{{ 'a'.title(1) }}", "title() takes at most 0 arguments");
    expect_error("{{ 'a'.isdigit(1) }}", "isdigit() takes at most 0 arguments");
    expect_error("{{ d.get() }}", "get() missing required argument 'key'");
    expect_error("{{ [1].index() }}", "index() missing required argument 'x'");
    expect_error("{{ [1].count(1, 2) }}", "count() takes at most 1 argument (2 given)");
    expect_error("{{ 'a'.split(',', maxsplit='x') }}", "split() maxsplit must be an integer");
    expect_error("{{ 'a'.replace('a', 'b', old='c') }}", "got multiple values for argument 'old'");
    expect_error("{{ raise_exception() }}", "raise_exception() missing required argument");
    expect_error("{{ strftime_now() }}", "strftime_now() missing required argument 'format'");
    // Valid calls are unchanged.
    EXPECT_EQ(render("{{ 'aaa'|replace('a', 'b', 2) }}|{{ 'aaa'.replace('a', 'b', 1) }}|"
                     "{{ [1, 2, 3]|select('divisibleby', 3)|list }}|{{ 'a' is eq('a') }}|"
                     "{{ [{'n': 1}, {'n': 2}]|sum(attribute='n', start=10) }}"),
              "bba|baa|[3]|True|13");
}

TEST(Jinja, LongChainsAndDeepNestingAreRefusedAtLoad) {
    const int n = 50000; // parsed in a loop, but each link nests the tree one deeper
    const std::string chains[] = {
        "{{ 1" + repeat(" + 1", n) + " }}",
        "{{ s" + repeat("|trim", n) + " }}",
        "{{ d" + repeat(".b", n) + " }}",
        "{{ d" + repeat("['b']", n) + " }}",
        "{{ s" + repeat("[0]", n) + " }}",
        "{{ range" + repeat("()", n) + " }}",
        "{{ 'a'" + repeat(" ~ 'a'", n) + " }}",
        "{{ 1" + repeat(" and 1", n) + " }}",
        "{{ 1" + repeat(" or 1", n) + " }}",
        "{% filter trim" + repeat("|trim", n) + " %}x{% endfilter %}",
    };
    for (const auto &t : chains) {
        const std::string e = error_of([&] { ChatTemplate(t, "t"); });
        EXPECT_NE(e.find("t line 1: unsupported: an expression nested deeper than 256 levels"),
                  std::string::npos)
            << t.substr(0, 40) << ": " << e.substr(0, 200);
    }
    for (const std::string &t :
         {"{{ " + repeat("(", n) + "1" + repeat(")", n) + " }}",
          "{{ " + repeat("[", n) + repeat("]", n) + " }}", "{{ " + repeat("not ", n) + "1 }}",
          "{{ " + repeat("1 if x else ", n) + "1 }}", "{{ " + repeat("-", n) + "1 }}"})
        EXPECT_NE(error_of([&] {
                      ChatTemplate(t, "t");
                  }).find("t line 1: unsupported: nesting deeper than 200 levels"),
                  std::string::npos)
            << t.substr(0, 40);
    // Chains of a realistic length render as before.
    EXPECT_EQ(render("{{ 1" + repeat(" + 1", 200) + " }}|{{ ' a '" + repeat("|trim", 100) + " }}|" +
                     "{{ " + repeat("(", 20) + "2" + repeat(")", 20) + " }}"),
              "201|a|2");
}

TEST(Jinja, DeeplyNestedValuesFailToPrintCompareOrSerialiseAndAreFreedWithoutRecursion) {
    auto nested = [](int depth) {
        return "{% set ns = namespace(x=[]) %}{% for i in range(" + std::to_string(depth) +
               ") %}{% set ns.x = [ns.x] %}{% endfor %}\n";
    };
    const std::string build = nested(2000);
    expect_error(build + "{{ ns.x }}", "t line 2: printing a value: lists / dicts nested deeper "
                                       "than 512 levels");
    expect_error(build + "{{ ns.x|string }}", "t line 2: printing a value");
    expect_error(build + "{{ ns.x|tojson }}", "t line 2: tojson: lists / dicts nested deeper");
    expect_error(build + "{{ ns.x == [ns.x] }}", "t line 2: comparing values: lists / dicts");
    expect_error(build + "{{ [ns.x] < [[ns.x]] }}", "t line 2: comparing values");
    expect_error(build + "{{ ns.x in [[ns.x]] }}", "t line 2: comparing values");
    // Built and dropped, never printed: freed without recursion (a namespace
    // can also chain them).
    EXPECT_EQ(render(nested(100000) + "{{ ns.x|length }}"), "1");
    EXPECT_EQ(render("{% set ns = namespace(x=none) %}{% for i in range(100000) %}"
                     "{% set ns = namespace(x=ns) %}{% endfor %}done"),
              "done");
    // A value from the context too deep to walk: refused when its JSON is read.
    std::string deep = repeat("[", 10000) + repeat("]", 10000);
    ChatTemplateOptions o;
    EXPECT_NE(error_of([&] {
                  ChatTemplate("{{ messages }}", "t").render("[{\"content\": " + deep + "}]", o);
              }).find("t: messages: JSON nested deeper than 128 levels"),
              std::string::npos);
    o.variables_json = "{\"v\": " + deep + "}";
    o.tools_json = "[" + deep + "]";
    EXPECT_NE(error_of([&] {
                  ChatTemplate("{{ v }}", "t").render("[]", o);
              }).find("JSON nested deeper than 128 levels"),
              std::string::npos);
    // Namespace cycles render (and are freed at the end: LeakSanitizer checks).
    EXPECT_EQ(render("{% set ns = namespace(x=1) %}{% set ns.x = [ns] %}{{ ns.x }}"),
              "[<Namespace>]");
    EXPECT_EQ(render("{% set ns = namespace(x=[]) %}{% for i in range(100) %}{% set ns.x = "
                     "[ns.x] %}{% endfor %}{{ (ns.x|tojson)|length }}"),
              "202");
}

TEST(Jinja, HugeRepetitionPowersAndRangesFailFastInsteadOfHanging) {
    EXPECT_EQ(render("{{ 1 ** 9223372036854775807 }}|{{ (-1) ** 9223372036854775807 }}|"
                     "{{ 2 ** 62 }}|{{ (-2) ** 63 }}|{{ 2 ** -2 }}|{{ '' * 9223372036854775807 }}|"
                     "{{ [] * 9223372036854775807 }}|{{ 'ab' * 2 }}|{{ [1] * 2 }}|{{ 'a' * -3 }}"),
              "1|-1|4611686018427387904|-9223372036854775808|0.25||[]|abab|[1, 1]|");
    expect_error("\n{{ 2 ** 63 }}", "t line 2: unsupported: integer overflow beyond 64 bits");
    expect_error("{{ 3 ** 9223372036854775807 }}", "integer overflow beyond 64 bits");
    expect_error("{{ 0 ** -1 }}", "0.0 cannot be raised to a negative power");
    expect_error("{{ 10.0 ** 400 }}", "** overflows a float");
    expect_error("{{ (-8) ** 0.5 }}", "a negative number raised to a fractional power");
    expect_error("{{ 'ab' * 10**12 }}", "repetition: the result would be longer than 64 MiB");
    expect_error("{{ 'ab' * 9223372036854775807 }}", "longer than 64 MiB");
    expect_error("{{ [1] * 9223372036854775807 }}",
                 "repetition: the result would be longer than 1000000 items");
    expect_error("{{ range(9223372036854775807) }}", "range(): more than 1000000 items");
    expect_error("{{ range(-9223372036854775807 - 1, 9223372036854775807) }}",
                 "range(): more than 1000000 items");
    expect_error("{{ [1] * 600000 + [1] * 600000 }}", "+: the list would have more than 1000000");
    // Bounds near the 64-bit edges step without overflowing.
    EXPECT_EQ(
        render("{{ range(9223372036854775800, 9223372036854775807, 5)|list }}|"
               "{{ range(-9223372036854775807, 9223372036854775807, 9223372036854775807)"
               "|list }}|{{ range(5, -9223372036854775807 - 1, -9223372036854775807)|list }}"),
        "[9223372036854775800, 9223372036854775805]|[-9223372036854775807, 0]|[5, "
        "-9223372036854775802]");
    // Slicing with huge steps gives one item, as in Python.
    EXPECT_EQ(
        render("{{ [1, 2, 3][::9223372036854775807] }}{{ [1, 2, 3][::-9223372036854775807 - 1] }}"
               "{{ 'abc'[1::-9223372036854775807] }}{{ 'abc'[-9223372036854775807:2] }}"),
        "[1][3]bab");
}

TEST(Jinja, IntegerEdgeCasesFollowPythonOrFail) {
    expect_error("{{ 1 % 0 }}", "integer division or modulo by zero");
    expect_error("{{ 1 // 0 }}", "integer division or modulo by zero");
    expect_error("{{ 1.5 % 0.0 }}", "modulo by zero");
    expect_error("{{ (-9223372036854775807 - 1) // -1 }}", "integer overflow beyond 64 bits");
    expect_error("{{ (-9223372036854775807 - 1) % -1 }}", "integer overflow beyond 64 bits");
    expect_error("{{ -(-9223372036854775807 - 1) }}", "integer overflow beyond 64 bits");
    expect_error("{{ (-9223372036854775807 - 1)|abs }}", "integer overflow beyond 64 bits");
    expect_error("{{ 9223372036854775807 + 1 }}", "integer overflow beyond 64 bits");
    expect_error("\n{{ 99999999999999999999 }}",
                 "t line 2: unsupported: integer literal 99999999999999999999 does not fit");
    expect_error("{{ '99999999999999999999'|int }}", "does not fit in 64 bits");
    expect_error("{{ 1e30|int }}", "does not fit in 64 bits");
    // INT64_MIN % -1 traps in C++; Python says it divides.
    EXPECT_EQ(render("{{ (-9223372036854775807 - 1) is divisibleby(-1) }}|{{ 'nan'|int(7) }}|"
                     "{{ 'inf'|int }}|{{ '-12'|int }}|{{ '2.9'|int }}|{{ 9223372036854775807 }}"),
              "True|7|0|-12|2|9223372036854775807");
}

TEST(Jinja, RecursionThroughMacrosIsBounded) {
    expect_error("{% macro f(n) %}{{ f(n) }}{% endmacro %}\n{{ f(1) }}",
                 "t line 1: macro 'f': calls nested deeper than 100");
    // Each call deep in an expression: the evaluation depth (or the stack a
    // sanitizer build uses) runs out before the macro depth.
    expect_error("{% macro f(n) %}{% if n > 0 %}{{ (f(n - 1) ~ 'x')" + repeat("|trim", 240) +
                     " }}{% endif %}{% endmacro %}{{ f(99)|length }}",
                 "the template recurses too deep");
    expect_error("{% macro f(n) %}{% if n > 0 %}" + repeat("{% if true %}", 190) +
                     "{{ f(n - 1) }}" + repeat("{% endif %}", 190) +
                     "{% endif %}{% endmacro %}{{ f(99) }}",
                 "the template recurses too deep");
    expect_error("{% set ns = namespace(x=[]) %}{% for i in range(1200) %}{% set ns.x = [ns.x] %}"
                 "{% endfor %}{{ ns.x|map(" +
                     repeat("'map', ", 1200) + "'list')|list }}",
                 "the template recurses too deep");
    // Moderate recursion renders.
    EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
                     "{{ f(30)|length }}"),
              "51");
}

TEST(Jinja, OutputSizeAndWorkAreBounded) {
    expect_error("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
                 "t line 1: the rendered text is longer than 64 MiB");
    expect_error("{% set b %}{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}{% endset %}",
                 "longer than 64 MiB");
    expect_error("{{ ('a\\n' * 1000000)|indent(1024) }}",
                 "indent: the result is longer than 64 MiB");
    expect_error("{{ ('a' * 1000000)|replace('', 'x' * 100) }}", "replace(): the result is longer");
    expect_error("{{ (['x' * 100] * 1000000)|join('x' * 1000) }}", "join: the result is longer");
    expect_error("{% set ns = namespace(x=[]) %}{% for i in range(500) %}{% set ns.x = [ns.x] %}"
                 "{% endfor %}{{ ([ns.x] * 1000000)|tojson(indent=64) }}",
                 "tojson: the result is longer than 64 MiB");
    expect_error("{{ (['x' * 1000] * 100000)|string }}", "printing a value: the result is longer");
    // Nested loops, and work on large strings, stop with an error.
    const std::string too_much = "the template does too much work (over 20000000 steps";
    expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                 "{% endfor %}",
                 too_much);
    expect_error("{% set a = 'a' * 60000000 %}{% for i in range(1000) %}{% set b = a|trim %}"
                 "{% endfor %}",
                 too_much);
    expect_error("{% set a = 'a' * 33554432 %}{{ ('a' * 16777216 ~ 'b') in a }}", too_much);
    expect_error("{{ ('a ' * 30000000).split()|length }}", too_much);
}

// A template that uses most of the engine, mutated at random (bytes dropped,
// inserted, duplicated, truncated): every variant renders or fails with
// rl::core::Error; nothing else escapes and nothing hangs.
TEST(Jinja, MutatedTemplatesRenderOrFailWithAnError) {
    const std::string base = test::slurp(test::source_path("tests/core/data/jinja_tour.jinja"));
    ASSERT_FALSE(base.empty());
    const std::string msgs = R"([{"role": "system", "content": " S "},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>r</think>\n\nok",
         "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "content": "{}"}, {"role": "user", "content": "again"}])";
    ChatTemplateOptions o;
    o.tools_json = R"([{"function": {"name": "f"}}])";
    o.now = 0;
    ASSERT_NO_THROW(ChatTemplate(base, "fuzz").render(msgs, o, R"({"bos_token": "<s>"})"));
    std::mt19937 rng(1234);
    const std::string alphabet = "{}%#-+()[]'\"|.,=~:*/\n ab0";
    int rendered = 0, refused = 0;
    for (int i = 0; i < 4000; ++i) {
        std::string t = base;
        const unsigned edits = 1 + rng() % 4;
        for (unsigned e = 0; e < edits && !t.empty(); ++e) {
            const size_t pos = rng() % t.size();
            switch (rng() % 4) {
                case 0:
                    t.erase(pos, 1 + rng() % 8);
                    break;
                case 1:
                    t.insert(pos, 1, alphabet[rng() % alphabet.size()]);
                    break;
                case 2:
                    t.insert(pos, t.substr(rng() % t.size(), 1 + rng() % 12));
                    break;
                default:
                    t.resize(pos);
            }
        }
        try {
            ChatTemplate ct(t, "fuzz");
            ct.render(msgs, o, R"({"bos_token": "<s>"})");
            ++rendered;
        } catch (const Error &e) {
            EXPECT_EQ(std::string(e.what()).rfind("fuzz", 0), 0u) << e.what();
            ++refused;
        }
    }
    EXPECT_GT(rendered, 200);
    EXPECT_GT(refused, 200);
}

} // namespace
} // namespace rl::core
