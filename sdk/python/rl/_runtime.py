"""Runtime, instances and results over the C API."""

import contextlib
import ctypes as C
import json
import threading

from . import _capi as A

_DTYPES = {
    "float64": (A.DTYPE_FLOAT, 64, C.c_double),
    "float32": (A.DTYPE_FLOAT, 32, C.c_float),
    "int64": (A.DTYPE_INT, 64, C.c_int64),
    "int32": (A.DTYPE_INT, 32, C.c_int32),
    "uint8": (A.DTYPE_UINT, 8, C.c_uint8),
}


class _Tensor:
    """An owned, contiguous 1-d buffer plus the view the C side borrows."""

    def __init__(self, values, dtype):
        code, bits, ctype = _DTYPES[dtype]
        values = list(values)
        self.buf = (ctype * max(len(values), 1))(*values)
        self.shape = (C.c_int64 * 1)(len(values))
        self.view = A.TensorView()
        self.view.data = C.cast(self.buf, C.c_void_p) if values else None
        self.view.device = A.Device(A.DEVICE_CPU, 0)
        self.view.ndim = 1
        self.view.dtype = A.DType(code, bits, 1)
        self.view.shape = self.shape
        self.view.strides = None
        self.view.byte_offset = 0


def _as_tensor(name, values):
    if hasattr(values, "dtype") and hasattr(values, "tolist"):  # numpy arrays
        kind = str(values.dtype)
        dtype = kind if kind in _DTYPES else ("int64" if values.dtype.kind in "iub" else "float64")
        return _Tensor(values.reshape(-1).tolist(), dtype)
    values = list(values)
    is_int = all(isinstance(v, int) and not isinstance(v, bool) for v in values) and name in (
        "labels", "input_ids", "token_ids", "group_ids", "cu_seqlens")
    return _Tensor(values, "int64" if is_int else "float64")


def _read_view(view):
    n = 1
    for d in range(view.ndim):
        n *= view.shape[d]
    code, bits = view.dtype.code, view.dtype.bits
    for _, (c, b, ctype) in _DTYPES.items():
        if (c, b) == (code, bits):
            if n == 0:
                return []
            return list(C.cast(view.data, C.POINTER(ctype))[:n])
    raise A.Error("RL_ERR_UNSUPPORTED", f"tensor dtype code {code} bits {bits}")


class Result:
    """Everything one call produced: scalars, metrics, texts and tensors (as lists)."""

    def __init__(self, handle):
        lib = A.load_library()
        try:
            sv = A.StringView()
            A.check(lib.rl_result_json(handle, C.byref(sv)))
            desc = json.loads(C.string_at(sv.data, sv.length).decode())
            self.scalars = desc["scalars"]
            self.metrics = desc["metrics"]
            self.texts = desc["texts"]
            self.tensors = {}
            for name in desc["tensors"]:
                view = A.TensorView()
                A.check(lib.rl_result_tensor(handle, name.encode(), C.byref(view)))
                self.tensors[name] = _read_view(view)
        finally:
            lib.rl_result_destroy(handle)

    def __repr__(self):
        return f"Result(scalars={self.scalars}, metrics={self.metrics}, texts={list(self.texts)}, tensors={list(self.tensors)})"


def _call(fn, *args):
    out = C.c_void_p()
    A.check(fn(*args, C.byref(out)))
    return Result(out)


class Runtime:
    """The host: loads plugins and creates instances of them."""

    def __init__(self, plugin_path=None, default_plugins=True, log_level="warn"):
        lib = self._lib = A.load_library()
        desc = A.RuntimeDesc(C.sizeof(A.RuntimeDesc), 0 if default_plugins else A.RL_RUNTIME_NO_DEFAULT_PLUGINS,
                             None, plugin_path.encode() if plugin_path else None, log_level.encode())
        self._h = C.c_void_p()
        A.check(lib.rl_runtime_create(C.byref(desc), C.byref(self._h)))
        self._instances = []
        # Calls into librl run with the GIL released, so another thread could
        # destroy what they use: the calls of instances and rl.disagg ends (some
        # wait on peers) register here, and closing refuses while one runs.
        self._running = []  # (what, owner)
        self._running_lock = threading.Lock()

    @contextlib.contextmanager
    def _blocking(self, what, owner=None):
        """Marks a call that uses this runtime from start to end."""
        entry = (what, owner)
        with self._running_lock:
            if not self._h:
                raise A.Error("RL_ERR_BAD_STATE", f"{what}: its rl.Runtime is closed")
            self._running.append(entry)
        try:
            yield
        finally:
            with self._running_lock:
                self._running.remove(entry)

    def _refuse_while_running(self, closing, owner=None):
        """Raises naming the calls running on this runtime (of `owner` only, when
        given); with _running_lock held."""
        busy = sorted({w for w, o in self._running if owner is None or o is owner})
        if busy:
            raise A.Error("RL_ERR_BAD_STATE",
                          f"{closing}: {', '.join(busy)} is still running in another thread; "
                          "close after it returns")

    def _close_owned(self, closing, owner, destroy):
        """Closes an object made on this runtime (destroy()), unless a call of it runs."""
        with self._running_lock:
            self._refuse_while_running(closing, owner=owner)
            destroy()

    def close(self):
        with self._running_lock:
            if not self._h:
                return
            self._refuse_while_running("rl.Runtime.close")
            h, self._h = self._h, None
        for inst in self._instances:
            inst.close()
        self._lib.rl_runtime_destroy(h)

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def load_plugin(self, path):
        A.check(self._lib.rl_runtime_load_plugin(self._h, path.encode()))

    def plugins(self):
        """{"plugins": [...], "refused": [{"path", "reason"}]}"""
        return json.loads(_call(self._lib.rl_runtime_list_plugins, self._h).texts["plugins"])

    def create(self, kind, name, params=None):
        h = C.c_void_p()
        A.check(self._lib.rl_instance_create(self._h, kind.encode(), name.encode(),
                                             json.dumps(params or {}).encode(), C.byref(h)))
        inst = Instance(self, h, kind, name)
        self._instances.append(inst)
        return inst


class Instance:
    """A configured plugin instance; the methods of its kind."""

    def __init__(self, runtime, handle, kind, name):
        self._lib, self._h, self.kind, self.name = runtime._lib, handle, kind, name
        self._runtime = runtime

    @contextlib.contextmanager
    def _busy(self, method):
        """One call of this instance (the GIL is released in it): refused once the
        instance is closed; neither it nor its runtime closes until the call returns."""
        with self._runtime._blocking(f"{self.kind} '{self.name}'.{method}", owner=self):
            if not self._h:
                raise A.Error("RL_ERR_BAD_STATE", f"{self.kind} '{self.name}' is closed")
            yield

    def close(self):
        self._runtime._close_owned(f"{self.kind} '{self.name}'.close", self, self._destroy)

    def _destroy(self):
        if self._h:
            self._lib.rl_instance_destroy(self._h)
            self._h = None

    # loss
    def signature(self):
        with self._busy("signature"):
            return json.loads(_call(self._lib.rl_loss_signature, self._h).texts["signature"])

    def compute(self, inputs, cu_seqlens, want_grads=True, global_tokens=0.0, global_seqs=0.0):
        keep = [(k, _as_tensor(k, v)) for k, v in inputs.items()]
        args = (A.TensorArg * max(len(keep), 1))(*[A.TensorArg(k.encode(), t.view) for k, t in keep])
        cu = _Tensor(cu_seqlens, "int64")
        li = A.LossInputs(C.sizeof(A.LossInputs), 0, A.TensorList(args, len(keep)), cu.view,
                          global_tokens, global_seqs)
        with self._busy("compute"):
            return _call(self._lib.rl_loss_compute, self._h, C.byref(li), 1 if want_grads else 0)

    # advantage
    def advantages(self, rewards, group_ids, cu_seqlens, tensors=None):
        keep = [(k, _as_tensor(k, v)) for k, v in (tensors or {}).items()]
        args = (A.TensorArg * max(len(keep), 1))(*[A.TensorArg(k.encode(), t.view) for k, t in keep])
        r, g, cu = _Tensor(rewards, "float64"), _Tensor(group_ids, "int64"), _Tensor(cu_seqlens, "int64")
        ai = A.AdvantageInputs(C.sizeof(A.AdvantageInputs), 0, r.view, g.view, cu.view,
                               A.TensorList(args, len(keep)))
        with self._busy("advantages"):
            return _call(self._lib.rl_advantage_compute, self._h, C.byref(ai))

    # filter
    def check(self, token_ids, logprobs, vocab_size):
        t, lp = _Tensor(token_ids, "int64"), _Tensor(logprobs, "float64")
        ro = A.RolloutView(C.sizeof(A.RolloutView), 0, t.view, lp.view, vocab_size)
        with self._busy("check"):
            return _call(self._lib.rl_filter_check, self._h, C.byref(ro))

    # env
    def sample(self, n, seed=0):
        if n < 0 or seed < 0:  # the C parameters are unsigned: -1 would be 2**64 - 1
            raise A.Error("RL_ERR_INVALID_ARG",
                          f"env.sample: n and seed must be >= 0 (n {n}, seed {seed})")
        with self._busy("sample"):
            return json.loads(_call(self._lib.rl_env_sample, self._h, n, seed).texts["tasks"])

    def score(self, task, completion):
        t = json.dumps(task).encode() if not isinstance(task, (str, bytes)) else (
            task.encode() if isinstance(task, str) else task)
        c = completion.encode()
        with self._busy("score"):
            return _call(self._lib.rl_env_score, self._h, A.StringView(t, len(t)),
                         A.StringView(c, len(c)))

    def multi_turn(self):
        """True for an env with a step() (multi-turn episodes)."""
        with self._busy("multi_turn"):
            return _call(self._lib.rl_instance_params, self._h).scalars.get("multi_turn", 0) != 0

    def step(self, task, state, completion):
        """One step of a multi-turn episode: scalars done / reward, texts observation / role /
        state (JSON text for the next step; pass "null" on the first turn)."""
        t = json.dumps(task).encode() if not isinstance(task, (str, bytes)) else (
            task.encode() if isinstance(task, str) else task)
        s = state.encode() if isinstance(state, str) else state
        c = completion.encode()
        with self._busy("step"):
            return _call(self._lib.rl_env_step, self._h, A.StringView(t, len(t)),
                         A.StringView(s, len(s)), A.StringView(c, len(c)))


    # transport
    def send(self, header=None, tensors=None):
        """Sends one message: a JSON-able dict header and 1-d tensors by name."""
        h = json.dumps(header if header is not None else {}).encode()
        keep = [(k, _as_tensor(k, v)) for k, v in (tensors or {}).items()]
        args = (A.TensorArg * max(len(keep), 1))(*[A.TensorArg(k.encode(), t.view) for k, t in keep])
        lst = A.TensorList(args, len(keep))
        with self._busy("send"):
            A.check(self._lib.rl_transport_send(self._h, A.StringView(h, len(h)), C.byref(lst)))

    def recv(self, timeout_ms=-1):
        """The next message as (header dict, {name: list}), or None after timeout_ms."""
        out = C.c_void_p()
        with self._busy("recv"):
            status = self._lib.rl_transport_recv(self._h, timeout_ms, C.byref(out))
        if status == A.RL_ERR_TIMEOUT:
            return None
        A.check(status)
        res = Result(out)
        return json.loads(res.texts["header"]), res.tensors


def config_load(path=None, overrides=()):
    """The resolved run configuration (dict); errors name file, key and line."""
    lib = A.load_library()
    arr = (C.c_char_p * max(len(overrides), 1))(*[o.encode() for o in overrides])
    res = _call(lib.rl_config_load, path.encode() if path else None, arr, len(overrides))
    return json.loads(res.texts["config"])


def versions():
    """librl's version and the versions of its two contracts (docs/abi.md):
    {"librl": "0.1.0", "plugin_abi": "0.10.0", "api": "0.12.0"}."""
    lib = A.load_library()

    def text(v):
        return "%d.%d.%d" % (v >> 22 & 0x3FF, v >> 12 & 0x3FF, v & 0xFFF)

    return {"librl": lib.rl_get_version().decode(), "plugin_abi": text(lib.rl_get_abi_version()),
            "api": text(lib.rl_get_api_version())}


def config_schema():
    lib = A.load_library()
    return json.loads(_call(lib.rl_config_schema).texts["schema"])
