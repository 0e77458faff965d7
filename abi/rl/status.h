/* abi/rl/status.h: status codes. Every call across the ABI returns one. */
#ifndef RL_STATUS_H
#define RL_STATUS_H

#include <stdint.h>
#include "macros.h"

RL_EXTERN_C_BEGIN

/* Storage type of every status; the constants below are its values. RL_OK is 0;
 * every failure is positive. Values are never reused. */
typedef int32_t rl_status_t;
enum {
    RL_OK = 0,
    RL_ERR_UNKNOWN = 1,       /* a failure with no better code */
    RL_ERR_INVALID_ARG = 2,   /* a bad argument, parameter or input tensor */
    RL_ERR_OUT_OF_MEMORY = 3, /* an allocation failed */
    RL_ERR_UNSUPPORTED = 4,   /* dtype, device or feature not supported here */
    RL_ERR_INCOMPATIBLE = 5,  /* ABI or version negotiation failed */
    RL_ERR_NOT_FOUND = 6,     /* no such plugin, interface, file or key */
    RL_ERR_BAD_STATE = 7,     /* wrong lifecycle state or wrong thread */
    RL_ERR_DEVICE = 8,        /* CUDA or driver error */
    RL_ERR_IO = 9,            /* file system, pipe, socket */
    RL_ERR_ABORTED = 10,      /* the host asked the call to stop */
    RL_ERR_INTERNAL = 11,     /* an exception caught at the boundary: a bug */
    RL_ERR_TIMEOUT = 12,      /* a deadline passed */
    RL_ERR_NUMERIC = 13       /* NaN or Inf in an input or a result */
    /* 0x10000..0x1FFFF: reserved for per-kind codes. */
};

RL_EXTERN_C_END

#endif /* RL_STATUS_H */
