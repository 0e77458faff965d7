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

// A template that uses most of the engine, mutated at random (bytes dropped,
// inserted, duplicated, truncated): every variant renders or fails with
// rl::core::Error; nothing else escapes and nothing hangs.
TEST(Jinja, MutatedTemplatesRenderOrFailWithAnError) {
    const std::string base =
        "{%- set ns = namespace(last=-1, sys='') %}\n"
        "{%- macro fmt(m, sep=': ') -%}{{ m.role | upper }}{{ sep }}{{ m.content | trim }}"
        "{%- endmacro %}\n"
        "{%- for m in messages[::-1] if m.role != 'tool' %}\n"
        "  {%- if ns.last < 0 and m.role == 'user' %}{% set ns.last = loop.revindex0 %}{% endif "
        "%}\n"
        "{%- endfor %}\n"
        "{{- bos_token if bos_token is defined else '' }}\n"
        "{%- for m in messages %}\n"
        "    {%- if m.content is string and '</think>' in m.content %}"
        "{{ m.content.split('</think>')[-1].lstrip('\\n') }}\n"
        "    {%- elif m.tool_calls %}{{ m.tool_calls | map(attribute='function') | list | "
        "tojson(indent=2) }}\n"
        "    {%- else %}{{ fmt(m) ~ (loop.index0 == ns.last) ~ (m | length) }}{% endif %}\n"
        "    {%- if not loop.last %}{{ '\\n' }}{% else %}{% break %}{% endif %}\n"
        "{%- endfor %}\n"
        "{#- tools #}{% if tools %}{% for t in tools %}{{ t.function.name ~ '/' ~ loop.length }}"
        "{% endfor %}{% endif %}\n"
        "{%- if add_generation_prompt %}{{ '<|assistant|>' + ('x' * 3)[1:] }}{% endif %}\n"
        "{{ {'a': [1, 2.5, none, true], 'b': 'é'} | dictsort | list }}{{ 7 // 2 }}{{ -7 % 3 }}\n";
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
