"""Python bindings of the rl runtime over its C ABI (ctypes; no compile step).

    import rl
    rt = rl.Runtime(plugin_path="build/plugins")
    loss = rt.create("loss", "policy_loss", {"eps_clip": 0.2})
    out = loss.compute({"logprobs": lp, "old_logprobs": old, "advantages": adv}, cu_seqlens=[0, 3, 5])
    out.scalars["loss"], out.metrics, out.tensors["grad.logprobs"]

librl is found through RL_LIBRARY (a path), else next to this package in a build
tree (../../../build/lib), else by the dynamic loader ("librl.so.0.1").
"""

from ._capi import Error, load_library
from ._runtime import Instance, Result, Runtime, config_load, config_schema

__all__ = ["Error", "Instance", "Result", "Runtime", "config_load", "config_schema", "load_library"]
