/* abi/rl/tensor.h: tensors cross the ABI as borrowed views laid out
 * field-for-field as DLPack's DLTensor, so they convert to and from at::Tensor
 * and Python's __dlpack__ without a copy. tests/abi asserts the equivalence. */
#ifndef RL_TENSOR_H
#define RL_TENSOR_H

#include <stdint.h>

/* DLPack DLDataType: a small value, not an enum ordinal of one framework.
 * float32 is {RL_DTYPE_FLOAT, 32, 1}; int64 is {RL_DTYPE_INT, 64, 1}. */
typedef struct rl_dtype {
    uint8_t code;   /* RL_DTYPE_* (DLPack's DLDataTypeCode values) */
    uint8_t bits;   /* 8, 16, 32, 64 */
    uint16_t lanes; /* 1 for every tensor in this ABI */
} rl_dtype_t;
enum {
    RL_DTYPE_INT = 0,
    RL_DTYPE_UINT = 1,
    RL_DTYPE_FLOAT = 2,
    RL_DTYPE_BFLOAT = 4,
    RL_DTYPE_COMPLEX = 5,
    RL_DTYPE_BOOL = 6
};

/* DLPack DLDevice. */
typedef struct rl_device {
    int32_t type;  /* RL_DEVICE_* (DLPack's DLDeviceType values) */
    int32_t index; /* device ordinal; 0 for the CPU */
} rl_device_t;
enum { RL_DEVICE_CPU = 1, RL_DEVICE_CUDA = 2, RL_DEVICE_CUDA_HOST = 3 };

/* DLPack DLTensor. A borrowed view: valid only until the call it is passed to
 * returns (a view a call hands back says how long it lives). A callee that
 * needs the data later copies it. [borrowed: data, shape, strides] */
typedef struct rl_tensor_view {
    void *data;           /* NULL only when the tensor has no elements */
    rl_device_t device;   /* where `data` lives */
    int32_t ndim;         /* number of dimensions; 0 for a scalar */
    rl_dtype_t dtype;     /* element type */
    int64_t *shape;       /* ndim entries */
    int64_t *strides;     /* ndim entries, in elements; NULL means contiguous row-major */
    uint64_t byte_offset; /* added to data before indexing */
} rl_tensor_view_t;

/* A named tensor: how per-token inputs ("logprobs", "advantages", ...) cross. */
typedef struct rl_tensor_arg {
    const char *name;      /* [borrowed] NUL-terminated */
    rl_tensor_view_t view; /* borrowed */
} rl_tensor_arg_t;

/* A borrowed array of named tensors. Names are unique within one list.
 * [borrowed: items] */
typedef struct rl_tensor_list {
    const rl_tensor_arg_t *items; /* `count` entries; NULL when count is 0 */
    uint64_t count;
} rl_tensor_list_t;

#endif /* RL_TENSOR_H */
