"""ctypes declarations of abi/rl/runtime.h. Layouts are pinned by tests/abi."""

import ctypes as C
import os

# ---- abi/rl/types.h, tensor.h --------------------------------------------------


class StringView(C.Structure):
    _fields_ = [("data", C.c_char_p), ("length", C.c_uint64)]


class DType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class Device(C.Structure):
    _fields_ = [("type", C.c_int32), ("index", C.c_int32)]


class TensorView(C.Structure):
    _fields_ = [
        ("data", C.c_void_p),
        ("device", Device),
        ("ndim", C.c_int32),
        ("dtype", DType),
        ("shape", C.POINTER(C.c_int64)),
        ("strides", C.POINTER(C.c_int64)),
        ("byte_offset", C.c_uint64),
    ]


class TensorArg(C.Structure):
    _fields_ = [("name", C.c_char_p), ("view", TensorView)]


class TensorList(C.Structure):
    _fields_ = [("items", C.POINTER(TensorArg)), ("count", C.c_uint64)]


class RuntimeDesc(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32),
        ("flags", C.c_uint32),
        ("next_in_chain", C.c_void_p),
        ("plugin_path", C.c_char_p),
        ("log_level", C.c_char_p),
    ]


class LossInputs(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32),
        ("reserved0", C.c_uint32),
        ("tensors", TensorList),
        ("cu_seqlens", TensorView),
        ("global_tokens", C.c_double),
        ("global_seqs", C.c_double),
    ]


class AdvantageInputs(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32),
        ("reserved0", C.c_uint32),
        ("rewards", TensorView),
        ("group_ids", TensorView),
        ("cu_seqlens", TensorView),
        ("tensors", TensorList),
    ]


class RolloutView(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32),
        ("reserved0", C.c_uint32),
        ("token_ids", TensorView),
        ("logprobs", TensorView),
        ("vocab_size", C.c_int64),
    ]


RL_OK = 0
RL_RUNTIME_NO_DEFAULT_PLUGINS = 1
DTYPE_INT, DTYPE_UINT, DTYPE_FLOAT, DTYPE_BOOL = 0, 1, 2, 6
DEVICE_CPU = 1


class Error(RuntimeError):
    """A failing rl_* call: .status is the rl_status_t name, str() the runtime's message."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


_lib = None


def _candidates():
    env = os.environ.get("RL_LIBRARY")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", "..", ".."))
    yield os.path.join(root, "build", "lib", "librl.so")
    yield "librl.so.0.1"


def load_library():
    """The loaded librl (ctypes.CDLL), declaring the signatures once."""
    global _lib
    if _lib is not None:
        return _lib
    errors = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            errors.append(f"{path}: not found")
            continue
        try:
            lib = C.CDLL(path)
            break
        except OSError as e:
            errors.append(f"{path}: {e}")
    else:
        raise OSError("cannot load librl; set RL_LIBRARY. Tried: " + "; ".join(errors))
    P, S, H = C.POINTER, C.c_int32, C.c_void_p
    sigs = {
        "rl_status_name": (C.c_char_p, [S]),
        "rl_last_error": (C.c_char_p, []),
        "rl_get_abi_version": (C.c_uint32, []),
        "rl_get_version": (C.c_char_p, []),
        "rl_runtime_create": (S, [P(RuntimeDesc), P(H)]),
        "rl_runtime_destroy": (None, [H]),
        "rl_runtime_load_plugin": (S, [H, C.c_char_p]),
        "rl_runtime_list_plugins": (S, [H, P(H)]),
        "rl_instance_create": (S, [H, C.c_char_p, C.c_char_p, C.c_char_p, P(H)]),
        "rl_instance_destroy": (None, [H]),
        "rl_loss_compute": (S, [H, P(LossInputs), C.c_uint32, P(H)]),
        "rl_loss_signature": (S, [H, P(H)]),
        "rl_advantage_compute": (S, [H, P(AdvantageInputs), P(H)]),
        "rl_filter_check": (S, [H, P(RolloutView), P(H)]),
        "rl_env_sample": (S, [H, C.c_uint64, C.c_uint64, P(H)]),
        "rl_env_score": (S, [H, StringView, StringView, P(H)]),
        "rl_config_load": (S, [C.c_char_p, P(C.c_char_p), C.c_uint64, P(H)]),
        "rl_config_schema": (S, [P(H)]),
        "rl_result_destroy": (None, [H]),
        "rl_result_json": (S, [H, P(StringView)]),
        "rl_result_scalar": (S, [H, C.c_char_p, P(C.c_double)]),
        "rl_result_metric": (S, [H, C.c_char_p, P(C.c_double)]),
        "rl_result_text": (S, [H, C.c_char_p, P(StringView)]),
        "rl_result_tensor": (S, [H, C.c_char_p, P(TensorView)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    _lib = lib
    return lib


def check(status):
    """Raise Error with rl_last_error() when status is not RL_OK."""
    if status != RL_OK:
        lib = load_library()
        raise Error(lib.rl_status_name(status).decode(), lib.rl_last_error().decode("utf-8", "replace"))
