"""The unmodified openai client (from PyPI, in the test venv) against `rlhost serve` on
the tiny model: completions and chat completions with logprobs, streamed and not; the
logprobs equal the trainer's logprobs of the same tokens (the rl Python SDK scores them
in this process from the same model folder). Tools: a tiny model with a Hermes-style
template, taught (supervised, here) to call a tool and then to answer from its result,
runs the client's tool loop, streams its call, and writes it under tool_choice
"required" and named. Reasoning: --reasoning-parser qwen3 returns reasoning_content."""

import json
import os
import shutil
import sys
import unittest

try:
    import openai
except ImportError:
    print("the openai package is not installed in this venv (no PyPI?): skipped")
    sys.exit(77)

import rl
from rlhost_server import RlhostServer

TOL = 1e-5


class OpenAIClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = RlhostServer("serve", "--api-key", "test-key")
        cls.url = cls.server.url
        cls.dir = cls.server.dir
        cls.client = openai.OpenAI(base_url=cls.url + "/v1", api_key="test-key", max_retries=0,
                                   timeout=120)
        cls.model = rl.Model(cls.dir)
        cls.trainer = cls.model.trainer()

    @classmethod
    def tearDownClass(cls):
        cls.trainer.close()
        cls.model.close()
        cls.server.stop()

    def trainer_logprobs(self, prompt, completion):
        ids = list(prompt) + list(completion)
        lp = self.trainer.forward({"input_ids": ids, "cu_seqlens": [0, len(ids)]}).tensors["logprobs"]
        return [lp[len(prompt) + i] for i in range(len(completion))]

    def test_completion_logprobs_equal_the_trainers(self):
        r = self.client.completions.create(
            model="tiny", prompt="Reverse: abc\n", max_tokens=10, temperature=1.0, logprobs=2,
            seed=5, extra_body={"return_token_ids": True, "ignore_eos": True})
        choice = r.choices[0]
        tokens = choice.token_ids
        self.assertEqual(len(tokens), 10)
        self.assertEqual(choice.finish_reason, "length")
        self.assertEqual(choice.prompt_token_ids, self.model.encode("Reverse: abc\n"))
        want = self.trainer_logprobs(choice.prompt_token_ids, tokens)
        got = choice.logprobs.token_logprobs
        self.assertEqual(len(got), len(want))
        for a, b in zip(got, want):
            self.assertAlmostEqual(a, b, delta=TOL)
        # Alternatives whose text collides (bytes that decode to U+FFFD) share a key.
        self.assertTrue(all(len(t) >= 1 for t in choice.logprobs.top_logprobs))
        self.assertEqual(r.usage.completion_tokens, 10)

    def test_chat_logprobs_equal_the_trainers(self):
        messages = [{"role": "user", "content": "Reverse: ab"}]
        r = self.client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=8, logprobs=True, top_logprobs=2, seed=9,
            extra_body={"return_token_ids": True, "ignore_eos": True})
        choice = r.choices[0]
        prompt = r.prompt_token_ids
        self.assertEqual(prompt, self.model.encode_chat(messages)[0])
        want = self.trainer_logprobs(prompt, choice.token_ids)
        content = choice.logprobs.content
        self.assertEqual(len(content), len(want))
        for entry, b in zip(content, want):
            self.assertAlmostEqual(entry.logprob, b, delta=TOL)
            self.assertEqual(len(entry.top_logprobs), 2)
        self.assertEqual(choice.message.role, "assistant")

    def test_streamed_completion_equals_the_non_streamed_one(self):
        args = dict(model="tiny", prompt="Reverse: hey\n", max_tokens=12, seed=3, logprobs=1)
        whole = self.client.completions.create(**args).choices[0]
        text, lps, finish = "", [], None
        for chunk in self.client.completions.create(stream=True, **args):
            c = chunk.choices[0]
            text += c.text
            if c.logprobs is not None:
                lps += c.logprobs.token_logprobs
            finish = c.finish_reason or finish
        self.assertEqual(text, whole.text)
        self.assertEqual(finish, whole.finish_reason)
        self.assertEqual(len(lps), len(whole.logprobs.token_logprobs))
        for a, b in zip(lps, whole.logprobs.token_logprobs):
            self.assertAlmostEqual(a, b, delta=1e-6)

    def test_streamed_chat_with_logprobs_and_usage(self):
        messages = [{"role": "user", "content": "hi"}]
        args = dict(model="tiny", messages=messages, max_tokens=10, seed=4, logprobs=True,
                    top_logprobs=2, extra_body={"return_token_ids": True})
        whole = self.client.chat.completions.create(**args)
        text, lps, usage = "", [], None
        stream = self.client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **args)
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                if c.logprobs is not None and c.logprobs.content:
                    lps += [e.logprob for e in c.logprobs.content]
        self.assertEqual(text, whole.choices[0].message.content)
        want = self.trainer_logprobs(whole.prompt_token_ids, whole.choices[0].token_ids)
        self.assertEqual(len(lps), len(want))
        for a, b in zip(lps, want):
            self.assertAlmostEqual(a, b, delta=TOL)
        self.assertEqual(usage.completion_tokens, whole.usage.completion_tokens)

    def test_models_and_errors(self):
        self.assertEqual([m.id for m in self.client.models.list().data], ["tiny"])
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model="tiny", prompt="a", max_tokens=10 ** 9)
        self.assertIn("max_tokens", str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model="tiny", prompt="a", extra_body={"bogus": 1})
        self.assertIn("bogus", str(e.exception))
        bad_key = openai.OpenAI(base_url=self.url + "/v1", api_key="wrong", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            bad_key.models.list()
        # Still serving.
        self.assertEqual(len(self.client.completions.create(
            model="tiny", prompt="a", max_tokens=2).choices), 1)


HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"]}}}]
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]
# What the model is taught to write: a call (keys in this order), then, given the
# tool's result, an answer.
CALL = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
CALL_TEXT = "<tool_call>\n" + json.dumps(CALL) + "\n</tool_call>"
RESULT = '{"temp": 21}'
ANSWER = "It is 21 degrees in Paris."


def history(call_arguments):
    """The conversation after the call, as the template reads it."""
    return QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_x", "type": "function",
             "function": {"name": "get_weather", "arguments": call_arguments}}]},
        {"role": "tool", "tool_call_id": "call_x", "content": RESULT}]


def teach_tool_calls(model_dir):
    """Gives the tiny model a Hermes-style template and overfits it (supervised, on
    this process's trainer) to write CALL_TEXT after QUESTION and ANSWER after the
    tool's result, so that the server's replies are known text."""
    shutil.copy(os.path.join(HERE, "hermes_tiny.jinja"),
                os.path.join(model_dir, "chat_template.jinja"))
    rt = rl.Runtime(plugin_path=os.environ["RL_PLUGIN_PATH"], default_plugins=False)
    model = rl.Model(model_dir)
    try:
        tasks = [
            {"prompt": model.apply_chat_template(QUESTION, tools=TOOLS), "answer": CALL_TEXT},
            {"prompt": model.apply_chat_template(history(CALL["arguments"]), tools=TOOLS),
             "answer": ANSWER},
        ]
        im_end = model.encode("<|im_end|>")
        assert len(im_end) == 1, im_end
        # Prompts encoded as the server encodes rendered chats (the template's
        # <|im_start|> / <|im_end|> are control tokens); the loss on answer + <|im_end|>.
        ids, mask, cu = [], [], [0]
        for task in tasks:
            prompt = model.encode(task["prompt"])
            answer = model.encode(task["answer"], plain_text=True) + im_end
            ids += prompt + answer
            mask += [0.0] * len(prompt) + [1.0] * len(answer)
            cu.append(len(ids))
        batch = {"input_ids": ids, "cu_seqlens": cu, "loss_mask": mask}
        ce = rt.create("loss", "causallm_loss")
        with model.trainer({"learning_rate": 1e-2, "seed": 1}) as trainer:
            for step in range(600):
                loss = trainer.forward_backward(batch, ce).scalars["loss"]
                if loss < 2e-3:
                    break
                trainer.optim_step()
        assert loss < 2e-3, "the tiny model did not learn the tool call: loss %g" % loss
        model.save(model_dir)
    finally:
        model.close()
        rt.close()


class ToolCallsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = RlhostServer("serve", "--api-key", "test-key", prepare=teach_tool_calls)
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="test-key",
                                   max_retries=0, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_the_tool_loop(self):
        messages = list(QUESTION)
        r = self.client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS,
                                                temperature=0, max_tokens=100)
        choice = r.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls")
        self.assertIsNone(choice.message.content)
        calls = choice.message.tool_calls
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0].type, "function")
        self.assertTrue(calls[0].id.startswith("call_"))
        self.assertEqual(calls[0].function.name, "get_weather")
        self.assertEqual(json.loads(calls[0].function.arguments), CALL["arguments"])
        # The client's loop: the assistant message as returned, then the tool's result.
        messages.append(choice.message)
        messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": RESULT})
        r2 = self.client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS,
                                                 temperature=0, max_tokens=100,
                                                 extra_body={"return_token_ids": True})
        self.assertEqual(r2.choices[0].finish_reason, "stop")
        self.assertEqual(r2.choices[0].message.content, ANSWER)
        self.assertFalse(r2.choices[0].message.tool_calls)
        # The arguments came back as JSON text and rendered as the object the model wrote.
        model = rl.load_tokenizer(self.server.dir)
        want = model.encode(model.apply_chat_template(history(CALL["arguments"]), tools=TOOLS))
        self.assertEqual(r2.prompt_token_ids, want)
        model.close()

    def test_tool_choice_none_returns_the_text(self):
        r = self.client.chat.completions.create(model="tiny", messages=QUESTION, tools=TOOLS,
                                                tool_choice="none", temperature=0,
                                                max_tokens=100)
        self.assertEqual(r.choices[0].message.content, CALL_TEXT)
        self.assertFalse(r.choices[0].message.tool_calls)
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_streamed_tool_call_name_first_then_arguments(self):
        """stream=True with tools, two choices and usage: each choice streams the call
        (id, type and name first, then the arguments) and finishes with tool_calls."""
        stream = self.client.chat.completions.create(
            model="tiny", messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=100, n=2,
            stream=True, stream_options={"include_usage": True})
        calls, finish, content, usage = {}, {}, {}, None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                content[c.index] = content.get(c.index, "") + (c.delta.content or "")
                for tc in c.delta.tool_calls or []:
                    got = calls.setdefault(c.index, [])
                    if tc.index == len(got):
                        # A call starts with its id, type and name, and no arguments yet.
                        self.assertTrue(tc.id.startswith("call_"), tc)
                        self.assertEqual(tc.type, "function")
                        self.assertEqual(tc.function.name, "get_weather")
                        self.assertFalse(tc.function.arguments)
                        got.append("")
                    else:
                        self.assertIsNone(tc.function.name)
                        got[tc.index] += tc.function.arguments
                if c.finish_reason:
                    finish[c.index] = c.finish_reason
        for i in (0, 1):
            self.assertEqual(finish[i], "tool_calls")
            self.assertEqual(content[i], "")  # the call's text is not sent as content
            self.assertEqual(len(calls[i]), 1)
            self.assertEqual(json.loads(calls[i][0]), CALL["arguments"])
        whole = self.client.chat.completions.create(model="tiny", messages=QUESTION,
                                                    tools=TOOLS, temperature=0, max_tokens=100)
        self.assertEqual(usage.completion_tokens, 2 * whole.usage.completion_tokens)

    def test_the_stream_helper_puts_the_call_together(self):
        helper = getattr(self.client.chat.completions, "stream", None)
        if helper is None:  # older clients: under beta
            helper = self.client.beta.chat.completions.stream
        with helper(model="tiny", messages=QUESTION, tools=TOOLS, temperature=0,
                    max_tokens=100) as stream:
            done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
            final = stream.get_final_completion()
        self.assertEqual(len(done), 1)
        self.assertEqual(done[0].name, "get_weather")
        self.assertEqual(json.loads(done[0].arguments), CALL["arguments"])
        choice = final.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls")
        self.assertEqual(choice.message.tool_calls[0].function.name, "get_weather")
        self.assertEqual(json.loads(choice.message.tool_calls[0].function.arguments),
                         CALL["arguments"])

    def test_tool_choice_required_and_named_return_the_call(self):
        named = {"type": "function", "function": {"name": "get_weather"}}
        for choice in ("required", named):
            for stream in (False, True):
                args = dict(model="tiny", messages=QUESTION, tools=TOOLS, tool_choice=choice,
                            temperature=0, max_tokens=100)
                if stream:
                    with self.client.chat.completions.stream(**args) as s:
                        r = s.get_final_completion()
                else:
                    r = self.client.chat.completions.create(**args)
                c = r.choices[0]
                self.assertEqual(c.finish_reason, "tool_calls", (choice, stream))
                self.assertFalse(c.message.content)
                self.assertEqual(len(c.message.tool_calls), 1)
                self.assertEqual(c.message.tool_calls[0].function.name, "get_weather")
                self.assertEqual(json.loads(c.message.tool_calls[0].function.arguments),
                                 CALL["arguments"])

    def test_a_forced_call_the_model_does_not_finish(self):
        named = {"type": "function", "function": {"name": "get_weather"}}
        prefix = '<tool_call>\n{"name": "get_weather", "arguments": '
        # Cut by max_tokens: the text so far (the forced opening first), finish length.
        r = self.client.chat.completions.create(model="tiny", messages=QUESTION, tools=TOOLS,
                                                tool_choice=named, temperature=0, max_tokens=2)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertTrue(r.choices[0].message.content.startswith(prefix),
                        r.choices[0].message.content)
        self.assertFalse(r.choices[0].message.tool_calls)
        # Ended (here by a stop string) before the call is whole: 422 naming tool_choice.
        with self.assertRaises(openai.UnprocessableEntityError) as e:
            self.client.chat.completions.create(model="tiny", messages=QUESTION, tools=TOOLS,
                                                tool_choice=named, temperature=0,
                                                max_tokens=100, stop=['"'])
        self.assertEqual(e.exception.body.get("param"), "tool_choice", str(e.exception))
        self.assertIn("not closed", str(e.exception))
        # Streamed: an error event, which the client raises.
        with self.assertRaises(openai.APIError) as e:
            for _ in self.client.chat.completions.create(
                    model="tiny", messages=QUESTION, tools=TOOLS, tool_choice=named,
                    temperature=0, max_tokens=100, stop=['"'], stream=True):
                pass
        self.assertIn("tool_choice", str(e.exception))

    def test_refusals_name_the_field(self):
        for extra, field in ((dict(tool_choice={"type": "function",
                                                "function": {"name": "get_time"}}), "tool_choice"),
                             (dict(tool_choice={"type": "function", "function": {}}),
                              "tool_choice.function.name")):
            with self.assertRaises(openai.BadRequestError) as e:
                self.client.chat.completions.create(model="tiny", messages=QUESTION,
                                                    tools=TOOLS, max_tokens=4, **extra)
            self.assertEqual(e.exception.body.get("param"), field, str(e.exception))


THINKING_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content"
    " + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}")


def thinking_template(model_dir):
    """A template whose generation prompt opens <think>, as Qwen3's thinking models'."""
    with open(os.path.join(model_dir, "chat_template.jinja"), "w") as f:
        f.write(THINKING_TEMPLATE)


class ReasoningTest(unittest.TestCase):
    """`rlhost serve --reasoning-parser qwen3`: the untrained model never closes the
    <think> block its prompt opened, so everything it writes is reasoning_content."""

    @classmethod
    def setUpClass(cls):
        cls.server = RlhostServer("serve", "--reasoning-parser", "qwen3",
                                  prepare=thinking_template)
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="x",
                                   max_retries=0, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_reasoning_content_whole_and_streamed(self):
        args = dict(model="tiny", messages=QUESTION, max_tokens=12, seed=3,
                    extra_body={"ignore_eos": True})
        whole = self.client.chat.completions.create(**args).choices[0].message
        self.assertIsNone(whole.content)
        self.assertIsInstance(whole.reasoning_content, str)
        self.assertTrue(whole.reasoning_content)
        reasoning, content = "", ""
        for chunk in self.client.chat.completions.create(stream=True, **args):
            for c in chunk.choices:
                reasoning += getattr(c.delta, "reasoning_content", None) or ""
                content += c.delta.content or ""
        self.assertEqual(reasoning, whole.reasoning_content)
        self.assertEqual(content, "")

if __name__ == "__main__":
    unittest.main()
