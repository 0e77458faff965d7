"""The Python torch of the build, for tests that put Python torch on the other
side of ours (tests/serve/test_torch_groups.py, test_vllm_transfer.py): run
with the Python whose torch the build uses; without torch, or with another
version than RL_TEST_TORCH_VERSION, the test exits 77 (skipped)."""

import os
import sys


def require():
    """torch, or exit 77 saying why."""
    try:
        import torch
        import torch.distributed  # noqa: F401  (both tests need it)
    except ImportError as e:  # pragma: no cover - depends on the machine
        print(f"SKIPPED: no torch in {sys.executable}: {e}")
        sys.exit(77)
    want = os.environ.get("RL_TEST_TORCH_VERSION", "")
    if want and torch.__version__.split("+")[0] != want:
        print(f"SKIPPED: {sys.executable} has torch {torch.__version__}, the build uses {want}")
        sys.exit(77)
    return torch
