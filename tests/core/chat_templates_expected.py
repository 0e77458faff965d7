#!/usr/bin/env python3
"""Expected renderings of real chat templates, for core_chat_template_compare_test.

Fetches the llama-cpp-python source package from PyPI (its
vendor/llama.cpp/models/templates/*.jinja are the chat templates models ship:
Qwen2.5, Qwen3, QwQ, Qwen3.5, Llama-3.1/3.2/3.3, ...), renders each on a set
of conversations with jinja2 configured as transformers' apply_chat_template
configures it, and writes OUT_DIR/cases.json:

  {"templates": {name: path}, "cases": [{"template", "case", "messages",
   "tools", "variables", "add_generation_prompt", "expected" | "error"}],
   "tool_calls": [{"template", "case", "family", "text", "calls"}],
   "now": unix seconds strftime_now uses}

tool_calls: the assistant turns with tool calls that the Qwen2.5 / Qwen3
and Llama-3.1 / 3.2 / 3.3 templates render (what such a model generates) and
the calls rendered into them, for the parse_tool_calls round trip.

When PyPI cannot be reached it writes {"skip": reason} instead.

Usage: chat_templates_expected.py OUT_DIR
"""
import datetime
import glob
import json
import os
import subprocess
import sys
import tarfile
import venv

from pypi_download import pip_download

NOW = 1721995200  # 2024-07-26 12:00:00 UTC
# Pinned so the set of templates (and the families the test requires) is fixed.
PACKAGE = "llama-cpp-python==0.3.36"
BOS, EOS = "<|bos|>", "<|eos|>"


def ensure_jinja(out_dir):
    """jinja2 from this Python (Debian's python3-jinja2), else from a venv in
    OUT_DIR (made with pip; re-executes this script there). Returns the reason
    when neither can be had."""
    try:
        import jinja2  # noqa: F401
        return None
    except ImportError:
        pass
    env_dir = os.path.join(out_dir, "venv")
    py = os.path.join(env_dir, "bin", "python")
    if os.path.realpath(sys.executable) == os.path.realpath(py):
        return "jinja2 is not importable in the test venv " + env_dir
    try:
        if not os.path.exists(py):
            venv.create(env_dir, with_pip=True, system_site_packages=True)
        if subprocess.call([py, "-c", "import jinja2"], stderr=subprocess.DEVNULL) != 0:
            subprocess.check_call([py, "-m", "pip", "install", "--quiet",
                                   "--disable-pip-version-check", "jinja2"])
    except (OSError, subprocess.CalledProcessError) as e:
        return "cannot install jinja2 from PyPI into %s: %s" % (env_dir, e)
    os.execv(py, [py] + sys.argv)


def fetch_templates(out_dir):
    """Extracted *.jinja files, or (None, reason) when PyPI is unreachable."""
    tdir = os.path.join(out_dir, "templates")
    if glob.glob(os.path.join(tdir, "*.jinja")):
        return tdir, None
    dl = os.path.join(out_dir, "sdist")
    os.makedirs(dl, exist_ok=True)
    if not glob.glob(os.path.join(dl, "llama_cpp_python-*.tar.gz")):
        err = pip_download(PACKAGE, dl, binary=False)
        if err:
            return None, err
    sdist = sorted(glob.glob(os.path.join(dl, "llama_cpp_python-*.tar.gz")))[-1]
    os.makedirs(tdir, exist_ok=True)
    with tarfile.open(sdist) as tar:
        for m in tar.getmembers():
            if "/vendor/llama.cpp/models/templates/" in m.name and m.name.endswith(".jinja"):
                data = tar.extractfile(m).read()
                with open(os.path.join(tdir, os.path.basename(m.name)), "wb") as f:
                    f.write(data)
    return tdir, None


def transformers_env():
    """jinja2 set up as transformers' chat template renderer does."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class AssistantTracker(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW, datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "Forecast days", "default": 1},
            },
            "required": ["city"],
        },
    },
}]

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
U1 = {"role": "user", "content": "Reverse the word 'hello'."}
A1 = {"role": "assistant", "content": "olleh"}
U2 = {"role": "user", "content": "  Now  «ünïcode» 🙂 and \"quotes\"\n\tplease. "}
A_THINK = {"role": "assistant",
           "content": "<think>\nThe user wants it reversed.\n</think>\n\nolleh"}
TOOL_CALL = {"role": "assistant", "content": "",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather",
                                          "arguments": {"city": "Paris", "days": 2}}}]}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
               "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"}
A_FINAL = {"role": "assistant", "content": "It is 21.5 degrees and clear in Paris."}
U_WEATHER = {"role": "user", "content": "What is the weather in Paris?"}

# Calls as models write them, for the tool-call round trip: the assistant turn
# the template renders is what the model would generate; parse_tool_calls must
# give these calls back (tool_calls_case below).
TOOLS2 = TOOLS + [{"type": "function", "function": {
    "name": "convert", "description": "Convert an amount.",
    "parameters": {"type": "object", "properties": {
        "amount": {"type": "number"}, "to": {"type": "string"},
        "options": {"type": "object"}, "tags": {"type": "array"}},
        "required": ["amount", "to"]}}}]
CALL_UNICODE = {"id": "call_2", "type": "function",
                "function": {"name": "get_weather",
                             "arguments": {"city": "Zürich «東京» 🙂", "unit": "celsius"}}}
CALL_NESTED = {"id": "call_3", "type": "function",
               "function": {"name": "convert",
                            "arguments": {"to": "EUR", "amount": 12.5,
                                          "options": {"round": True, "note": None},
                                          "tags": ["a", "b \"q\""]}}}
CALL_STRING_ARGS = {"id": "call_4", "type": "function",
                    "function": {"name": "get_weather",
                                 "arguments": "{\"city\": \"Oslo\", \"days\": 3}"}}
A_TWO_CALLS = {"role": "assistant", "content": "Let me check both.",
               "tool_calls": [CALL_UNICODE, CALL_NESTED]}
A_UNICODE = {"role": "assistant", "content": "", "tool_calls": [CALL_UNICODE]}
# Content "" where OpenAI clients send null: rlhost serve hands templates "" (Qwen3
# tests `content is string`).
A_NESTED = {"role": "assistant", "content": "", "tool_calls": [CALL_NESTED]}
A_STRING_ARGS = {"role": "assistant", "content": "", "tool_calls": [CALL_STRING_ARGS]}
# (case, conversation ending with the assistant's calls, the templates it fits)
TOOL_CALL_CASES = [
    ("call_one", [U_WEATHER, TOOL_CALL], None),
    ("call_unicode", [SYSTEM, U_WEATHER, A_UNICODE], None),
    ("call_nested", [U_WEATHER, A_NESTED], None),
    ("calls_two_with_content", [U_WEATHER, A_TWO_CALLS], "hermes"),
    ("call_arguments_as_text", [U_WEATHER, A_STRING_ARGS], "Qwen-Qwen3-0.6B"),
]
# Templates whose tool-call round trip must hold, and their family (not QwQ:
# its generation prompt opens <think>, which its rendered history drops).
TOOL_CALL_TEMPLATES = {
    "Qwen-Qwen2.5-7B-Instruct": "hermes",
    "Qwen-Qwen3-0.6B": "hermes",
    "meta-llama-Llama-3.1-8B-Instruct": "llama3_json",
    "meta-llama-Llama-3.2-3B-Instruct": "llama3_json",
    "meta-llama-Llama-3.3-70B-Instruct": "llama3_json",
}
END_OF_TURN = {"hermes": "<|im_end|>", "llama3_json": "<|eot_id|>"}


def tool_calls_case(tmpl, name, family, case, messages):
    """The assistant turn the template renders for the last message (the text
    after the generation prompt of the conversation before it, up to the
    end-of-turn token) and the calls in it, or None when the template does not
    render this conversation."""
    render = lambda msgs, gen: tmpl.render(
        messages=json.loads(json.dumps(msgs)), tools=TOOLS2, documents=None,
        add_generation_prompt=gen, bos_token=BOS, eos_token=EOS)
    prefix, full = render(messages[:-1], True), render(messages, False)
    if not full.startswith(prefix):
        raise RuntimeError("%s / %s: the generation prompt is not a prefix" % (name, case))
    turn = full[len(prefix):]
    end = turn.find(END_OF_TURN[family])
    if end < 0:
        raise RuntimeError("%s / %s: no end of turn in %r" % (name, case, turn))
    calls = []
    for c in messages[-1]["tool_calls"]:
        args = c["function"]["arguments"]
        calls.append({"name": c["function"]["name"],
                      "arguments": json.loads(args) if isinstance(args, str) else args})
    return {"template": name, "case": case, "family": family, "text": turn[:end],
            "calls": calls}


CASES = [
    ("single", [U1], None, {}),
    ("system", [SYSTEM, U1], None, {}),
    ("multi", [U1, A1, U2], None, {}),
    ("multi_system", [SYSTEM, U1, A1, U2], None, {}),
    ("ends_with_assistant", [SYSTEM, U1, A1], None, {}),
    ("thinking_history", [U1, A_THINK, U2], None, {}),
    ("no_thinking", [U1], None, {"enable_thinking": False}),
    ("tools", [U_WEATHER], TOOLS, {}),
    ("tools_system", [SYSTEM, U_WEATHER], TOOLS, {}),
    ("tool_round_trip", [U_WEATHER, TOOL_CALL, TOOL_RESULT], TOOLS, {}),
    ("tool_round_trip_final", [SYSTEM, U_WEATHER, TOOL_CALL, TOOL_RESULT, A_FINAL], TOOLS, {}),
    ("tool_calls_two", [U_WEATHER, A_TWO_CALLS, TOOL_RESULT], TOOLS2, {}),
    ("tool_calls_nested", [SYSTEM, U_WEATHER, A_NESTED, TOOL_RESULT, A_FINAL], TOOLS2, {}),
    ("tool_call_unicode", [U_WEATHER, A_UNICODE], TOOLS2, {}),
]


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    out_path = os.path.join(out_dir, "cases.json")
    reason = ensure_jinja(out_dir)
    tdir = None
    if reason is None:
        tdir, reason = fetch_templates(out_dir)
    if tdir is None:
        print("SKIP: " + reason)
        with open(out_path, "w") as f:
            json.dump({"skip": reason}, f)
        return 0
    env = transformers_env()
    templates, cases, tool_calls = {}, [], []
    for path in sorted(glob.glob(os.path.join(tdir, "*.jinja"))):
        name = os.path.basename(path)[:-len(".jinja")]
        templates[name] = path
        with open(path, encoding="utf-8") as f:
            source = f.read()
        try:
            tmpl = env.from_string(source)
        except Exception as e:  # jinja2 itself refuses it
            cases.append({"template": name, "case": "parse", "error": "%s: %s" % (type(e).__name__, e)})
            continue
        for case, messages, tools, variables in CASES:
            for gen in (True, False):
                entry = {"template": name, "case": case, "messages": messages, "tools": tools,
                         "variables": variables, "add_generation_prompt": gen}
                try:
                    entry["expected"] = tmpl.render(
                        messages=json.loads(json.dumps(messages)), tools=tools, documents=None,
                        add_generation_prompt=gen, bos_token=BOS, eos_token=EOS, **variables)
                except Exception as e:
                    entry["error"] = "%s: %s" % (type(e).__name__, e)
                cases.append(entry)
        family = TOOL_CALL_TEMPLATES.get(name)
        for case, messages, only in TOOL_CALL_CASES if family else []:
            if only is not None and only not in (family, name):
                continue
            tool_calls.append(tool_calls_case(tmpl, name, family, case, messages))
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"templates": templates, "cases": cases, "tool_calls": tool_calls, "now": NOW,
                   "special_tokens": {"bos_token": BOS, "eos_token": EOS}}, f, ensure_ascii=False)
    print("%d templates, %d cases -> %s" % (len(templates), len(cases), out_path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
