"""ctypes declarations of abi/rl/runtime.h, train.h, step.h, dist.h and disagg.h. Layouts are pinned by
tests/abi (C) and tests/python (these declarations against the same sizes)."""

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


def _sized(*fields):
    """The fields of a struct that opens with struct_size and a reserved word."""
    return [("struct_size", C.c_uint32), ("reserved0", C.c_uint32)] + list(fields)


class RuntimeDesc(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32),
        ("flags", C.c_uint32),
        ("next_in_chain", C.c_void_p),
        ("plugin_path", C.c_char_p),
        ("log_level", C.c_char_p),
    ]


class LossInputs(C.Structure):
    _fields_ = _sized(
        ("tensors", TensorList),
        ("cu_seqlens", TensorView),
        ("global_tokens", C.c_double),
        ("global_seqs", C.c_double),
    )


class AdvantageInputs(C.Structure):
    _fields_ = _sized(
        ("rewards", TensorView),
        ("group_ids", TensorView),
        ("cu_seqlens", TensorView),
        ("tensors", TensorList),
    )


class RolloutView(C.Structure):
    _fields_ = _sized(
        ("token_ids", TensorView),
        ("logprobs", TensorView),
        ("vocab_size", C.c_int64),
    )


class Batch(C.Structure):
    _fields_ = _sized(
        ("input_ids", TensorView),
        ("cu_seqlens", TensorView),
        ("tensors", TensorList),
        # ABI 0.3
        ("flags", C.c_uint32),
        ("reserved1", C.c_uint32),
        ("sampling_temperature", C.c_double),
    )


RL_BATCH_HAS_SAMPLING_TEMPERATURE = 1
RL_ENCODE_ADD_SPECIAL = 1
RL_ENCODE_PLAIN_TEXT = 2
RL_DECODE_SKIP_SPECIAL = 1


RL_OK = 0
RL_ERR_NOT_FOUND = 6
RL_ERR_TIMEOUT = 12
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
        "rl_get_api_version": (C.c_uint32, []),
        "rl_get_version": (C.c_char_p, []),
        "rl_runtime_create": (S, [P(RuntimeDesc), P(H)]),
        "rl_runtime_destroy": (None, [H]),
        "rl_runtime_load_plugin": (S, [H, C.c_char_p]),
        "rl_runtime_list_plugins": (S, [H, P(H)]),
        "rl_instance_create": (S, [H, C.c_char_p, C.c_char_p, C.c_char_p, P(H)]),
        "rl_instance_destroy": (None, [H]),
        "rl_instance_params": (S, [H, P(H)]),
        "rl_loss_compute": (S, [H, P(LossInputs), C.c_uint32, P(H)]),
        "rl_loss_signature": (S, [H, P(H)]),
        "rl_advantage_compute": (S, [H, P(AdvantageInputs), P(H)]),
        "rl_filter_check": (S, [H, P(RolloutView), P(H)]),
        "rl_env_sample": (S, [H, C.c_uint64, C.c_uint64, P(H)]),
        "rl_env_score": (S, [H, StringView, StringView, P(H)]),
        "rl_env_step": (S, [H, StringView, StringView, StringView, P(H)]),
        "rl_transport_send": (S, [H, StringView, P(TensorList)]),
        "rl_transport_recv": (S, [H, C.c_int64, P(H)]),
        "rl_config_load": (S, [C.c_char_p, P(C.c_char_p), C.c_uint64, P(H)]),
        "rl_config_schema": (S, [P(H)]),
        "rl_config_declare": (S, [C.c_char_p, C.c_char_p, P(H)]),
        # train.h
        "rl_platform_info": (C.c_char_p, []),
        "rl_model_init_preset": (S, [C.c_char_p, C.c_char_p, C.c_uint64]),
        "rl_model_load": (S, [C.c_char_p, C.c_char_p, P(H)]),
        "rl_model_destroy": (None, [H]),
        "rl_model_info": (S, [H, P(H)]),
        "rl_model_save": (S, [H, C.c_char_p]),
        "rl_adapter_create": (S, [H, C.c_char_p, C.c_char_p]),
        "rl_adapter_load": (S, [H, C.c_char_p, C.c_char_p]),
        "rl_adapter_save": (S, [H, C.c_char_p, C.c_char_p]),
        "rl_adapter_export_merged": (S, [H, C.c_char_p, C.c_char_p]),
        "rl_adapter_remove": (S, [H, C.c_char_p]),
        "rl_adapter_info": (S, [H, C.c_char_p, P(H)]),
        "rl_tokenizer_encode": (S, [H, StringView, C.c_uint32, P(H)]),
        "rl_tokenizer_decode": (S, [H, P(C.c_int64), C.c_uint64, P(H)]),
        "rl_tokenizer_decode_v2": (S, [H, P(C.c_int64), C.c_uint64, C.c_uint32, P(H)]),
        "rl_tokenizer_encode_chat": (S, [H, C.c_char_p, C.c_char_p, C.c_uint32, C.c_uint32,
                                         P(H)]),
        "rl_tokenizer_load": (S, [C.c_char_p, P(H)]),
        "rl_tokenizer_apply_chat_template": (S, [H, C.c_char_p, C.c_char_p, C.c_uint32, P(H)]),
        "rl_tokenizer_render_chat": (S, [H, C.c_char_p, C.c_char_p, P(H)]),
        "rl_trainer_create": (S, [H, C.c_char_p, P(H)]),
        "rl_trainer_destroy": (None, [H]),
        "rl_trainer_forward_backward": (S, [H, P(Batch), H, P(H)]),
        "rl_trainer_forward": (S, [H, P(Batch), H, P(H)]),
        "rl_trainer_optim_step": (S, [H, C.c_char_p, P(H)]),
        "rl_trainer_save_checkpoint": (S, [H, C.c_char_p, C.c_char_p, P(H)]),
        "rl_trainer_load_checkpoint": (S, [H, C.c_char_p, P(H)]),
        "rl_engine_create": (S, [H, C.c_char_p, P(H)]),
        "rl_engine_destroy": (None, [H]),
        "rl_engine_generate": (S, [H, P(TensorView), P(TensorView), C.c_char_p, P(H)]),
        "rl_engine_sync_weights": (S, [H, P(H)]),
        "rl_weights_send": (S, [H, H, C.c_int64, C.c_char_p, P(H)]),
        "rl_weights_recv": (S, [H, H, C.c_int64, C.c_char_p, P(H)]),
        "rl_engine_sleep": (S, [H]),
        "rl_engine_wake_up": (S, [H]),
        "rl_buffer_create": (S, [C.c_char_p, P(H)]),
        "rl_buffer_destroy": (None, [H]),
        "rl_buffer_set_policy_version": (S, [H, C.c_int64]),
        "rl_buffer_push": (S, [H, C.c_char_p, P(TensorList)]),
        "rl_buffer_close_group": (S, [H, C.c_int64, P(C.c_uint32)]),
        "rl_buffer_pop_batch": (S, [H, C.c_uint64, C.c_uint64, P(H)]),
        "rl_buffer_stats": (S, [H, C.c_uint32, P(H)]),
        # step.h
        "rl_rollouts_generate": (S, [H, C.c_char_p, C.c_char_p, P(H)]),
        "rl_rollouts_generate_episodes": (S, [H, H, C.c_char_p, C.c_char_p, P(H)]),
        "rl_rollouts_destroy": (None, [H]),
        "rl_rollouts_score": (S, [H, H]),
        "rl_rollouts_set_rewards": (S, [H, C.POINTER(C.c_double), C.c_uint64]),
        "rl_rollouts_filter": (S, [H, P(H), C.c_uint64, P(H)]),
        "rl_rollouts_info": (S, [H, P(H)]),
        "rl_rollouts_to_batch": (S, [H, P(H)]),
        "rl_buffer_push_rollouts": (S, [H, H, P(H)]),
        "rl_buffer_pop_train_batch": (S, [H, C.c_uint64, C.c_uint64, P(H)]),
        "rl_train_batch_destroy": (None, [H]),
        "rl_train_batch_supervised": (S, [H, C.c_char_p, C.c_char_p, P(H)]),
        "rl_train_batch_compute_advantages": (S, [H, H, P(H)]),
        "rl_train_batch_set_tensor": (S, [H, C.c_char_p, P(TensorView)]),
        "rl_train_batch_split": (S, [H, C.c_uint64, P(H), P(C.c_uint64)]),
        "rl_train_batch_view": (S, [H, P(Batch)]),
        "rl_train_batch_info": (S, [H, P(H)]),
        "rl_sync_weights": (S, [H, H, P(H)]),
        # dist.h
        "rl_dist_init": (S, [C.c_char_p, C.c_char_p, P(H)]),
        "rl_inference_client_create": (S, [C.c_char_p, P(H)]),
        "rl_inference_client_destroy": (None, [H]),
        "rl_inference_client_call": (S, [H, C.c_char_p, C.c_char_p, C.c_char_p, P(H)]),
        "rl_inference_client_sync": (S, [H, H, C.c_int64, C.c_char_p, P(H)]),
        "rl_inference_client_rollouts": (S, [H, H, C.c_char_p, C.c_char_p, P(H)]),
        "rl_dist_info": (S, [P(H)]),
        "rl_dist_barrier": (S, []),
        "rl_dist_broadcast": (S, [StringView, C.c_int32, P(H)]),
        "rl_dist_all_gather": (S, [StringView, P(H)]),
        # disagg.h
        "rl_disagg_protocol_version": (C.c_uint32, []),
        "rl_disagg_worker_create": (S, [H, C.c_char_p, C.c_int64, P(H)]),
        "rl_disagg_worker_destroy": (None, [H]),
        "rl_disagg_worker_hello": (S, [H]),
        "rl_disagg_worker_credit": (S, [H, P(H)]),
        "rl_disagg_worker_send": (S, [H, H, C.c_int64]),
        "rl_disagg_orchestrator_run": (S, [H, C.c_char_p, H, H, P(H)]),
        "rl_disagg_trainer_create": (S, [H, C.c_char_p, P(H)]),
        "rl_disagg_trainer_destroy": (None, [H]),
        "rl_disagg_trainer_hello": (S, [H, C.c_int64]),
        "rl_disagg_trainer_next": (S, [H, C.c_int64, P(H)]),
        "rl_disagg_trainer_ack": (S, [H, C.c_int64]),
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
