"""The disaggregated mode's three-role protocol: rollout workers -> orchestrator ->
trainer (abi/rl/disagg.h; docs/disaggregated.md). The same protocol as the Lua roles
of examples/grpo_disaggregated.lua, so any role can run from Python against the others.

    import rl, rl.disagg as dg
    rt = rl.Runtime()
    config = {"transport": "zmq", "host": "127.0.0.1", "port": 5555, "dir": "runs/x/transport",
              "workers": 1, "steps": 30, "checkpoint_every": 10, "max_async_level": 1,
              "min_rollouts": 64}
    # the orchestrator role: runs until the trainer is done; its counters
    stats = dg.orchestrate(rt, config, rl.Buffer({"group_size": 8}), rt.create("advantage", "grpo"))
    # a rollout worker
    w = dg.Worker(rt, config, 0); w.hello()
    credit = w.credit()                      # {"seq", "min_version", "done", ...}
    w.send(rollouts, policy_version)         # rl.Rollouts, scored
    # the trainer
    t = dg.TrainerEnd(rt, config); t.hello(version)
    header, tensors = t.next(version)        # header["kind"]: "rl.batch" or "rl.weights_wanted"
    t.ack(version + 1)

A peer silent past config["timeout"] raises rl.Error naming it; a message of another
protocol version raises naming both versions."""

import ctypes as C
import json

from . import _capi as A
from ._runtime import _call
from ._train import _Handle

PROTOCOL_VERSION = 1  # RL_DISAGG_PROTOCOL_VERSION of abi/rl/disagg.h


def _lib():
    return A.load_library()


def _text(config):
    return json.dumps(config).encode()


def protocol_version():
    """The protocol version librl speaks."""
    return int(_lib().rl_disagg_protocol_version())


def orchestrate(runtime, config, buffer, advantage):
    """Runs the orchestrator until the trainer is done: its counters (chunks, batches,
    duplicates, lost_chunks, worker_restarts, trainer_restarts, resent,
    orchestrator_restarts) as ints."""
    with runtime._blocking("rl.disagg.orchestrate", owner=advantage):  # it uses advantage
        res = _call(_lib().rl_disagg_orchestrator_run, runtime._h, _text(config),
                    buffer._handle(), advantage._h)
    return {k: int(v) for k, v in res.scalars.items()}


class _End(_Handle):
    """An end of the protocol on a runtime: closed with it (first), and neither can
    be closed while a call of the end runs in another thread."""

    def __init__(self, runtime, handle):
        super().__init__(handle)
        self._runtime = runtime  # outlives this end
        runtime._instances.append(self)

    def _blocking(self, method):
        return self._runtime._blocking(f"rl.disagg.{type(self).__name__}.{method}", owner=self)

    def close(self):
        self._runtime._close_owned(f"rl.disagg.{type(self).__name__}.close", self,
                                   super().close)


class Worker(_End):
    """The end of rollout worker `index`."""

    _destroy = "rl_disagg_worker_destroy"

    def __init__(self, runtime, config, index):
        h = C.c_void_p()
        with runtime._blocking("rl.disagg.Worker"):
            A.check(_lib().rl_disagg_worker_create(runtime._h, _text(config), index,
                                                   C.byref(h)))
        super().__init__(runtime, h)

    def hello(self):
        with self._blocking("hello"):
            A.check(_lib().rl_disagg_worker_hello(self._handle()))

    def credit(self):
        """Waits for a credit: {"seq", "min_version", "done", "trainer_restarted",
        "trainer_version", "worker_run"}."""
        with self._blocking("credit"):
            res = _call(_lib().rl_disagg_worker_credit, self._handle())
        out = {k: int(v) for k, v in res.scalars.items()}
        out["done"], out["trainer_restarted"] = bool(out["done"]), bool(out["trainer_restarted"])
        out["worker_run"] = res.texts["worker_run"]
        return out

    def send(self, rollouts, policy_version):
        """Sends the chunk of the last credit: rollouts (rl.Rollouts, scored)."""
        with self._blocking("send"):
            A.check(_lib().rl_disagg_worker_send(self._handle(), rollouts._handle(),
                                                 policy_version))


class TrainerEnd(_End):
    """The trainer's end: batches in step order, acknowledgements."""

    _destroy = "rl_disagg_trainer_destroy"

    def __init__(self, runtime, config):
        h = C.c_void_p()
        with runtime._blocking("rl.disagg.TrainerEnd"):
            A.check(_lib().rl_disagg_trainer_create(runtime._h, _text(config), C.byref(h)))
        super().__init__(runtime, h)

    def hello(self, version):
        with self._blocking("hello"):
            A.check(_lib().rl_disagg_trainer_hello(self._handle(), version))

    def next(self, version):
        """(header, tensors): the batch of step `version` (tensors: the trainer's input as
        lists, for rl.Trainer.forward_backward), or a worker's request for the weights
        in use (header["kind"] == "rl.weights_wanted", header["worker"])."""
        with self._blocking("next"):
            res = _call(_lib().rl_disagg_trainer_next, self._handle(), version)
        return json.loads(res.texts["header"]), res.tensors

    def ack(self, version):
        with self._blocking("ack"):
            A.check(_lib().rl_disagg_trainer_ack(self._handle(), version))


__all__ = ["PROTOCOL_VERSION", "TrainerEnd", "Worker", "orchestrate", "protocol_version"]
