"""The structure vLLM's pynccl_wrapper pickles as the NCCL unique id: a ctypes
Structure of 128 bytes (NCCL's ncclUniqueId), at vLLM's module path."""

import ctypes


class ncclUniqueId(ctypes.Structure):  # noqa: N801  (vLLM's class name)
    _fields_ = [("internal", ctypes.c_byte * 128)]
