/* abi/rl/types.h: strings, struct chaining and the struct_size rule. */
#ifndef RL_TYPES_H
#define RL_TYPES_H

#include <stddef.h>
#include <stdint.h>

/* A string with an explicit length; not NUL-terminated unless said so. Borrowed
 * unless the member that holds it says otherwise. */
typedef struct rl_string_view {
    const char *data; /* [borrowed] may be NULL only when length is 0 */
    uint64_t length;  /* in bytes, UTF-8 */
} rl_string_view_t;

/* Optional extension data for descriptors (webgpu.h nextInChain). Readers skip
 * a stype they do not know. */
typedef struct rl_chain {
    const struct rl_chain *next; /* [borrowed] NULL ends the chain */
    uint32_t stype;              /* RL_STYPE_*; 0x10000 and up are vendor blocks */
    uint32_t struct_size;        /* sizeof the whole extension struct */
} rl_chain_t;

/* Every struct that may grow starts with `uint32_t struct_size` and grows only at
 * its end. A reader checks that a struct from the other side is new enough to
 * hold `field` before reading it. */
#define RL_HAS_FIELD(ptr, type, field) ((ptr)->struct_size >= RL_SIZE_THROUGH(type, field))

/* The size of `type` up to and including `field`: the struct_size of a layout
 * whose last member is `field`. A struct's minimum accepted size is
 * RL_SIZE_THROUGH(type, <last member of its first published layout>). */
#define RL_SIZE_THROUGH(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

#endif /* RL_TYPES_H */
