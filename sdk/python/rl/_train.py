"""Models, trainers, engines, the rollout buffer and the typed RL step
(abi/rl/train.h and abi/rl/step.h) over the C API.

Ownership: every object owns one C handle and releases it in close() (also on
`with` exit and when collected). A model outlives what it made: closing a model
closes its trainers and engines first, as the C API requires. Tensors come back
as Python lists.
"""

import ctypes as C
import json

from . import _capi as A
from ._runtime import Result, _Tensor, _as_tensor, _call

_lib = A.load_library


def _text(obj):
    return json.dumps(obj).encode()


def _made(fn, *args):
    """The handle fn(*args, &handle) makes (rl.Error when it fails)."""
    h = C.c_void_p()
    A.check(fn(*args, C.byref(h)))
    return h


class _Handle:
    _destroy = None

    def __init__(self, handle):
        self._h = handle
        self._children = []

    def close(self):
        for child in self._children:
            child.close()
        self._children = []
        if self._h:
            getattr(_lib(), self._destroy)(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _handle(self):
        if not self._h:
            raise A.Error("RL_ERR_BAD_STATE", f"{type(self).__name__} is closed")
        return self._h


def platform_info():
    """The tensor platform: {"torch_version", "cuda_built", "cuda_devices", "summary"}."""
    return json.loads(_lib().rl_platform_info().decode())


def init_model(preset, directory, seed=0):
    """Write a built-in model (preset "tiny") into directory."""
    A.check(_lib().rl_model_init_preset(preset.encode(), directory.encode(), seed))


def config_declare(config, keys):
    """The configuration with a script's own keys checked and defaulted (rl_config_declare).
    keys: [{"key": "ppo.epochs", "type": "integer", "default": 2, "doc": ..., "min": 1}, ...]."""
    res = _call(_lib().rl_config_declare, _text(config), _text(keys))
    return json.loads(res.texts["config"])


def seed(base, *parts):
    """A seed in [0, 2^53) derived from a base seed and integers or strings; the same
    value as the Lua module's rl.seed(base, ...) (splitmix64 over 64-bit words)."""
    mask = (1 << 64) - 1

    def mix(x):
        x = (x + 0x9E3779B97F4A7C15) & mask
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)

    h = mix(int(base) & mask)
    for p in parts:
        if isinstance(p, str):
            for b in p.encode():
                h = mix(h ^ b)
        else:
            h = mix(h ^ (int(p) & mask))
    return h & ((1 << 53) - 1)


class Model(_Handle):
    """One Hugging Face model folder: weights, config, tokenizer."""

    _destroy = "rl_model_destroy"

    def __init__(self, path, options=None, _handle=None):
        h = _handle
        if h is None:
            h = _made(_lib().rl_model_load, path.encode(), _text(options or {}))
        super().__init__(h)

    def info(self):
        return json.loads(_call(_lib().rl_model_info, self._handle()).texts["info"])

    def save(self, directory):
        A.check(_lib().rl_model_save(self._handle(), directory.encode()))

    # LoRA adapters (docs/lora.md)
    def create_adapter(self, name, lora=None):
        """A fresh LoRA adapter `name` over this model (identity at init). lora: {"rank",
        "alpha", "dropout", "target_modules", "use_rslora", "seed"} (PEFT's r, lora_alpha,
        lora_dropout accepted)."""
        A.check(_lib().rl_adapter_create(self._handle(), name.encode(), _text(lora or {})))

    def load_adapter(self, name, directory):
        """Loads a PEFT LoRA folder as adapter `name` (replacing one of that name)."""
        A.check(_lib().rl_adapter_load(self._handle(), name.encode(), directory.encode()))

    def save_adapter(self, name, directory):
        """Saves adapter `name` as a PEFT LoRA folder."""
        A.check(_lib().rl_adapter_save(self._handle(), name.encode(), directory.encode()))

    def export_merged(self, name, directory):
        """Saves this model with adapter `name` merged in, as an HF folder."""
        A.check(_lib().rl_adapter_export_merged(self._handle(), name.encode(),
                                                directory.encode()))

    def remove_adapter(self, name):
        A.check(_lib().rl_adapter_remove(self._handle(), name.encode()))

    def adapters(self):
        """The names of this model's adapters."""
        return json.loads(_call(_lib().rl_adapter_info, self._handle(), None).texts["adapters"])

    def adapter_info(self, name):
        return json.loads(_call(_lib().rl_adapter_info, self._handle(), name.encode())
                          .texts["info"])

    # tokenizer
    def encode(self, text, add_special=False, plain_text=False):
        """Token ids of text. plain_text: special-token text in it ("<|im_end|>")
        is encoded as text, never as a control token (for user-written text)."""
        b = text.encode()
        flags = (A.RL_ENCODE_ADD_SPECIAL if add_special else 0) | \
            (A.RL_ENCODE_PLAIN_TEXT if plain_text else 0)
        return _call(_lib().rl_tokenizer_encode, self._handle(), A.StringView(b, len(b)),
                     flags).tensors["ids"]

    def decode(self, ids, skip_special_tokens=False):
        arr = (C.c_int64 * max(len(ids), 1))(*ids)
        return _call(_lib().rl_tokenizer_decode_v2, self._handle(), arr, len(ids),
                     A.RL_DECODE_SKIP_SPECIAL if skip_special_tokens else 0).texts["text"]

    def encode_chat(self, messages, template=None, add_generation_prompt=True, plain_text=True):
        """(ids, prompt): the conversation rendered by the chat template and encoded;
        plain_text keeps special-token text inside the contents plain."""
        res = _call(_lib().rl_tokenizer_encode_chat, self._handle(), _text(messages),
                    template.encode() if template else None, 1 if add_generation_prompt else 0,
                    A.RL_ENCODE_PLAIN_TEXT if plain_text else 0)
        return res.tensors["ids"], res.texts["prompt"]

    def apply_chat_template(self, messages, template=None, add_generation_prompt=True,
                            tools=None, chat_template_kwargs=None):
        """The conversation rendered by the model's own chat template (template None or
        "model"), as transformers' apply_chat_template renders it, or by a built-in
        format ("chatml", "llama3")."""
        opts = {"template": template or "model", "add_generation_prompt": add_generation_prompt}
        if tools is not None:
            opts["tools"] = tools
        if chat_template_kwargs is not None:
            opts["chat_template_kwargs"] = chat_template_kwargs
        return _call(_lib().rl_tokenizer_render_chat, self._handle(), _text(messages),
                     _text(opts)).texts["prompt"]

    def sft_batch(self, tasks, eos_token_id=None, chat_template="none",
                  chat_template_kwargs=None):
        """The supervised batch on the tasks' reference answers (a TrainBatch)."""
        opts = {"chat_template": chat_template}
        if chat_template_kwargs is not None:
            opts["chat_template_kwargs"] = chat_template_kwargs
        if eos_token_id is not None:
            opts["eos_token_id"] = eos_token_id
        h = _made(_lib().rl_train_batch_supervised, self._handle(), _text(tasks), _text(opts))
        return TrainBatch(h)

    # weight sync over a transport (docs/transports.md)
    def send_weights(self, transport, version, options=None):
        """Sends these weights as policy `version`; transport None: only gather (fsdp)."""
        return _call(_lib().rl_weights_send, self._handle(),
                     transport._h if transport is not None else None, version,
                     _text(options or {}))

    def recv_weights(self, transport, timeout_ms=-1, options=None):
        """Swaps in the next newer weight set; None when none came within timeout_ms."""
        out = C.c_void_p()
        status = _lib().rl_weights_recv(self._handle(), transport._h, timeout_ms,
                                        _text(options or {}), C.byref(out))
        if status == A.RL_ERR_TIMEOUT:
            return None
        A.check(status)
        return Result(out)

    def trainer(self, config=None):
        t = Trainer(self, config)
        self._children.append(t)
        return t

    def engine(self, config=None):
        e = Engine(self, config)
        self._children.append(e)
        return e


def load_tokenizer(directory):
    """A tokenizer without a model (rl_tokenizer_load): a Model whose tokenizer methods
    (encode, decode, encode_chat, apply_chat_template, sft_batch, info) work and whose
    trainer() / engine() / save() are refused."""
    h = _made(_lib().rl_tokenizer_load, directory.encode())
    return Model(None, _handle=h)


class _BatchArg:
    """An rl_batch_t for a TrainBatch (borrowed views) or a dict of lists (copies)."""

    def __init__(self, batch):
        self.struct = A.Batch()
        self.struct.struct_size = C.sizeof(A.Batch)
        if isinstance(batch, TrainBatch):
            A.check(_lib().rl_train_batch_view(batch._handle(), C.byref(self.struct)))
            self._owner = batch
            return
        if "input_ids" not in batch or "cu_seqlens" not in batch:
            raise A.Error("RL_ERR_INVALID_ARG", "batch needs 'input_ids' and 'cu_seqlens'")
        self._ids = _Tensor(batch["input_ids"], "int64")
        self._cu = _Tensor(batch["cu_seqlens"], "int64")
        self._rest = [(k, _as_tensor(k, v)) for k, v in batch.items()
                      if k not in ("input_ids", "cu_seqlens", "sampling_temperature")]
        self._args = (A.TensorArg * max(len(self._rest), 1))(
            *[A.TensorArg(k.encode(), t.view) for k, t in self._rest])
        self.struct.input_ids = self._ids.view
        self.struct.cu_seqlens = self._cu.view
        self.struct.tensors = A.TensorList(self._args, len(self._rest))
        if batch.get("sampling_temperature") is not None:
            self.struct.flags = A.RL_BATCH_HAS_SAMPLING_TEMPERATURE
            self.struct.sampling_temperature = float(batch["sampling_temperature"])


class _OfModel(_Handle):
    """A handle made from a model and a JSON config (rl_<kind>_create); it holds the model,
    which outlives it."""

    _create = None

    def __init__(self, model, config=None):
        h = _made(getattr(_lib(), self._create), model._handle(), _text(config or {}))
        super().__init__(h)
        self._model = model


class Trainer(_OfModel):
    """Optimizer state over a model's parameters (forward, forward_backward, optim_step)."""

    _create, _destroy = "rl_trainer_create", "rl_trainer_destroy"

    def forward_backward(self, batch, loss):
        b = _BatchArg(batch)
        return _call(_lib().rl_trainer_forward_backward, self._handle(), C.byref(b.struct),
                     loss._h)

    def forward(self, batch, loss=None):
        b = _BatchArg(batch)
        return _call(_lib().rl_trainer_forward, self._handle(), C.byref(b.struct),
                     loss._h if loss else None)

    def optim_step(self, params=None):
        return _call(_lib().rl_trainer_optim_step, self._handle(),
                     _text(params) if params else None)

    def save_checkpoint(self, directory, state=None):
        return _call(_lib().rl_trainer_save_checkpoint, self._handle(), directory.encode(),
                     _text(state) if state is not None else None)

    def load_checkpoint(self, directory):
        """The restored checkpoint's Result, or None when there is none."""
        out = C.c_void_p()
        st = _lib().rl_trainer_load_checkpoint(self._handle(), directory.encode(), C.byref(out))
        if st == A.RL_ERR_NOT_FOUND:
            return None
        A.check(st)
        return Result(out)


class Engine(_OfModel):
    """The co-located rollout engine (reads the trainer's parameters in place)."""

    _create, _destroy = "rl_engine_create", "rl_engine_destroy"

    def generate(self, prompts, params=None):
        ids = [t for p in prompts for t in p]
        cu = [0]
        for p in prompts:
            cu.append(cu[-1] + len(p))
        ti, tc = _Tensor(ids, "int64"), _Tensor(cu, "int64")
        return _call(_lib().rl_engine_generate, self._handle(), C.byref(ti.view),
                     C.byref(tc.view), _text(params or {}))

    def rollouts(self, tasks, chat_template="none", group_offset=0, sampling=None,
                 parse_special_tokens=False, chat_template_kwargs=None):
        """Generate: encode the tasks' prompts (as plain text unless parse_special_tokens),
        sample sampling["n"] completions each. The rollouts record the sampling temperature
        and the trainer scores their batches at it."""
        opts = {"chat_template": chat_template, "group_offset": group_offset,
                "sampling": sampling or {}, "parse_special_tokens": parse_special_tokens}
        if chat_template_kwargs is not None:
            opts["chat_template_kwargs"] = chat_template_kwargs
        h = _made(_lib().rl_rollouts_generate, self._handle(), _text(tasks), _text(opts))
        return Rollouts(h)

    def episodes(self, env, tasks, chat_template="none", group_offset=0, sampling=None,
                 max_turns=8, max_context=0, parse_special_tokens=False,
                 chat_template_kwargs=None, turn_rewards="episode"):
        """Multi-turn episodes: sampling["n"] per task, each answered turn by turn by `env`
        (a multi-turn env instance) until it says done, max_turns or max_context. Scored:
        reward = the sum of the turns' rewards; observation tokens are never trained.
        turn_rewards="tokens": their batches also carry each turn's reward on its last
        token (token_rewards, for estimators that read them)."""
        opts = {"chat_template": chat_template, "group_offset": group_offset,
                "sampling": sampling or {}, "parse_special_tokens": parse_special_tokens,
                "max_turns": max_turns, "max_context": max_context,
                "turn_rewards": turn_rewards}
        if chat_template_kwargs is not None:
            opts["chat_template_kwargs"] = chat_template_kwargs
        h = _made(_lib().rl_rollouts_generate_episodes, self._handle(), env._h, _text(tasks),
                  _text(opts))
        return Rollouts(h)

    def sync_weights(self, buffer=None):
        """Adopt the trainer's weights; the buffer (if given) learns the new version."""
        res = _call(_lib().rl_sync_weights, self._handle(), buffer._handle() if buffer else None)
        return int(res.scalars["policy_version"])

    def sleep(self):
        A.check(_lib().rl_engine_sleep(self._handle()))

    def wake_up(self):
        A.check(_lib().rl_engine_wake_up(self._handle()))


class Buffer(_Handle):
    """The rollout buffer: difficulty filter, staleness, complete groups out."""

    _destroy = "rl_buffer_destroy"

    def __init__(self, config=None):
        h = _made(_lib().rl_buffer_create, _text(config or {}))
        super().__init__(h)

    def set_policy_version(self, version):
        A.check(_lib().rl_buffer_set_policy_version(self._handle(), version))

    def push(self, rollout, tensors):
        keep = [(k, _as_tensor(k, v)) for k, v in tensors.items()]
        args = (A.TensorArg * max(len(keep), 1))(*[A.TensorArg(k.encode(), t.view) for k, t in keep])
        lst = A.TensorList(args, len(keep))
        A.check(_lib().rl_buffer_push(self._handle(), _text(rollout), C.byref(lst)))

    def push_rollouts(self, rollouts):
        res = _call(_lib().rl_buffer_push_rollouts, self._handle(), rollouts._handle())
        return int(res.scalars["pushed"])

    def close_group(self, group_id):
        found = C.c_uint32()
        A.check(_lib().rl_buffer_close_group(self._handle(), group_id, C.byref(found)))
        return bool(found.value)

    @staticmethod
    def _counts(fn, min_rollouts, timeout_ms):
        # The C parameters are unsigned: -1 would be 2**64 - 1 (never enough
        # rollouts; a wait without end).
        if min_rollouts < 0 or timeout_ms < 0:
            raise A.Error("RL_ERR_INVALID_ARG", f"Buffer.{fn}: min_rollouts and timeout_ms must be "
                          f">= 0 (min_rollouts {min_rollouts}, timeout_ms {timeout_ms})")

    def pop_batch(self, min_rollouts, timeout_ms=0):
        self._counts("pop_batch", min_rollouts, timeout_ms)
        return _call(_lib().rl_buffer_pop_batch, self._handle(), min_rollouts, timeout_ms)

    def pop_train_batch(self, min_rollouts, timeout_ms=0):
        """Every ready group as a TrainBatch once min_rollouts are ready, else None."""
        self._counts("pop_train_batch", min_rollouts, timeout_ms)
        h = _made(_lib().rl_buffer_pop_train_batch, self._handle(), min_rollouts, timeout_ms)
        return TrainBatch(h) if h.value else None

    def stats(self, take=False):
        return _call(_lib().rl_buffer_stats, self._handle(), 1 if take else 0)


class Rollouts(_Handle):
    """One step's rollouts (abi/rl/step.h): score, filter, info, to_batch."""

    _destroy = "rl_rollouts_destroy"

    def score(self, env):
        A.check(_lib().rl_rollouts_score(self._handle(), env._h))

    def set_rewards(self, rewards):
        """One finite reward per rollout (a reward model's, a judge's, shaped ones)."""
        values = [float(r) for r in rewards]
        arr = (C.c_double * max(len(values), 1))(*values)
        A.check(_lib().rl_rollouts_set_rewards(self._handle(), arr, len(values)))

    def filter(self, filters):
        arr = (C.c_void_p * max(len(filters), 1))(*[f._h for f in filters])
        return _call(_lib().rl_rollouts_filter, self._handle(), arr, len(filters))

    def info(self):
        return _call(_lib().rl_rollouts_info, self._handle())

    def routed_experts(self):
        """Routing replay (R3): per rollout, the experts every sparse layer routed
        each of its prompt + completion tokens to, a nested list [T][L][K] (-1
        rows: never read); None when the rollouts were sampled without
        sampling.return_routed_experts."""
        return self._per_rollout("routed_experts")

    def routed_expert_weights(self):
        """The weights the sampler mixed those experts with, in the layout of
        routed_experts() (floats; 0 in -1 rows); None when the rollouts were
        sampled without sampling.return_expert_logits."""
        return self._per_rollout("routed_expert_weights")

    def _per_rollout(self, name):
        r = self.info()
        if name not in r.tensors:
            return None
        values, cu = r.tensors[name], r.tensors["routed_cu_seqlens"]
        L, K = int(r.scalars["routed_layers"]), int(r.scalars["routed_k"])
        return [[[values[(t * L + l) * K:(t * L + l + 1) * K] for l in range(L)]
                 for t in range(cu[i], cu[i + 1])] for i in range(len(cu) - 1)]

    def to_batch(self):
        h = _made(_lib().rl_rollouts_to_batch, self._handle())
        return TrainBatch(h)


class TrainBatch(_Handle):
    """A training batch: packed sequences, loss mask, old logprobs, advantages."""

    _destroy = "rl_train_batch_destroy"

    def compute_advantages(self, advantage):
        return _call(_lib().rl_train_batch_compute_advantages, self._handle(), advantage._h)

    def set(self, name, values):
        t = _Tensor(values, "float32")
        A.check(_lib().rl_train_batch_set_tensor(self._handle(), name.encode(), C.byref(t.view)))

    def split(self, k):
        parts = (C.c_void_p * k)()
        n = C.c_uint64()
        A.check(_lib().rl_train_batch_split(self._handle(), k, parts, C.byref(n)))
        return [TrainBatch(C.c_void_p(parts[i])) for i in range(n.value)]

    def info(self):
        return _call(_lib().rl_train_batch_info, self._handle())


class InferenceClient(_Handle):
    """A client of an inference server speaking SGLang's protocol (`rlhost serve`,
    SGLang) or prime-rl's vLLM routes: JSON calls and weight syncs
    (abi/rl/inference.h, docs/serving.md)."""

    _destroy = "rl_inference_client_destroy"

    def __init__(self, url, **options):
        h = _made(_lib().rl_inference_client_create, _text(dict(options, url=url)))
        super().__init__(h)

    def call(self, method, path, body=None):
        """The decoded reply (dict / list / str / None); a non-2xx reply raises rl.Error."""
        out = C.c_void_p()
        A.check(_lib().rl_inference_client_call(self._handle(), method.encode(), path.encode(),
                                                None if body is None else _text(body),
                                                C.byref(out)))
        text = Result(out).texts.get("body", "")
        if not text or text == "null":
            return None
        try:
            return json.loads(text)
        except ValueError:
            return text

    def generate(self, request):
        """POST /generate (SGLang's request and reply)."""
        return self.call("POST", "/generate", request)

    def rollouts(self, model, tasks, options=None):
        """Rollouts sampled by the server (options as Engine.rollouts'); `model` (a Model or
        a tokenizer) encodes the prompts."""
        h = _made(_lib().rl_inference_client_rollouts, self._handle(), model._handle(),
                  _text(tasks), _text(options or {}))
        return Rollouts(h)

    def sync(self, model, version, options=None):
        """Brings the server to `model`'s weights as `version` (skipped when it has them)."""
        return _call(_lib().rl_inference_client_sync, self._handle(), model._handle(), version,
                     _text(options or {}))
