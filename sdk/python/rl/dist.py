"""The ranks of a distributed run (abi/rl/dist.h; docs/distributed.md).

    import rl.dist
    rl.dist.init({"timeout": 60})      # optional: the trainer joins on creation
    rl.dist.rank(), rl.dist.world_size(), rl.dist.is_main()
    rl.dist.barrier()
    rl.dist.broadcast(value, root=0)   # JSON-serializable values
    rl.dist.all_gather(value)          # [value of rank 0, value of rank 1, ...]

Every call but rank / world_size / local_rank / is_main is a collective."""

import json

from . import _capi as A
from ._runtime import _call

_info = None


def init(config=None, device=None):
    """Joins the group of the environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) with the
    "dist" settings {"timeout": seconds, "backend": "auto" | "gloo" | "nccl"}."""
    global _info
    res = _call(A.load_library().rl_dist_init,
                json.dumps(config).encode() if config is not None else None,
                device.encode() if device else None)
    _info = res.scalars
    return dict(_info)


def _get():
    global _info
    if _info is None:
        _info = _call(A.load_library().rl_dist_info).scalars
    return _info


def rank():
    return int(_get()["rank"])


def world_size():
    return int(_get()["world_size"])


def local_rank():
    return int(_get()["local_rank"])


def is_main():
    return rank() == 0


def barrier():
    A.check(A.load_library().rl_dist_barrier())


def _view(text):
    data = text.encode()
    return A.StringView(data, len(data))


def broadcast(value, root=0):
    text = json.dumps(value) if rank() == root else ""
    res = _call(A.load_library().rl_dist_broadcast, _view(text), root)
    return json.loads(res.texts["value"])


def all_gather(value):
    res = _call(A.load_library().rl_dist_all_gather, _view(json.dumps(value)))
    return [json.loads(res.texts[str(r)]) for r in range(int(res.scalars["world_size"]))]
