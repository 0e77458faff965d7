"""Python bindings of the rl runtime over its C ABI (ctypes; no compile step).

    import rl
    rt = rl.Runtime(plugin_path="build/plugins")
    loss = rt.create("loss", "policy_loss", {"eps_clip": 0.2})
    out = loss.compute({"logprobs": lp, "old_logprobs": old, "advantages": adv}, cu_seqlens=[0, 3, 5])
    out.scalars["loss"], out.metrics, out.tensors["grad.logprobs"]

Models, trainers, engines, the buffer and the typed RL step (train.h, step.h):

    model = rl.Model("models/tiny", {"threads": 1})
    trainer, engine = model.trainer({"learning_rate": 1e-3}), model.engine()
    rollouts = engine.rollouts(tasks, sampling={"n": 8, "seed": 1})
    rollouts.score(env); buffer.push_rollouts(rollouts)
    batch = buffer.pop_train_batch(8); batch.compute_advantages(adv)
    trainer.forward_backward(batch, loss); trainer.optim_step(); engine.sync_weights(buffer)

librl is found through RL_LIBRARY (a path), else next to this package in a build
tree (../../../build/lib), else by the dynamic loader ("librl.so.0.1").
"""

from . import disagg, dist
from ._capi import Error, load_library
from ._runtime import Instance, Result, Runtime, config_load, config_schema, versions
from ._train import (Buffer, Engine, InferenceClient, Model, Rollouts, Trainer, TrainBatch,
                     config_declare, init_model, load_tokenizer, platform_info, seed)

__all__ = ["Buffer", "Engine", "Error", "InferenceClient", "Instance", "Model", "Result", "Rollouts", "Runtime",
           "TrainBatch", "Trainer", "config_declare", "config_load", "config_schema", "init_model",
           "disagg", "dist", "load_library", "load_tokenizer", "platform_info", "seed", "versions"]
