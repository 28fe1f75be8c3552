/* Tensor element types. Values are the GGUF/ggml type ids, so a GGUF tensor's type field
 * converts directly; this file is the one place that knows each type's block size. */
#ifndef TANDEM_COMMON_DTYPE_H
#define TANDEM_COMMON_DTYPE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

typedef enum td_dtype {
    TD_F32 = 0,
    TD_F16 = 1,
    TD_Q4_0 = 2,
    TD_Q4_1 = 3,
    TD_Q5_0 = 6,
    TD_Q5_1 = 7,
    TD_Q8_0 = 8,
    TD_Q8_1 = 9,
    TD_Q2_K = 10,
    TD_Q3_K = 11,
    TD_Q4_K = 12,
    TD_Q5_K = 13,
    TD_Q6_K = 14,
    TD_Q8_K = 15,
    TD_IQ2_XXS = 16,
    TD_IQ2_XS = 17,
    TD_IQ3_XXS = 18,
    TD_IQ1_S = 19,
    TD_IQ4_NL = 20,
    TD_IQ3_S = 21,
    TD_IQ2_S = 22,
    TD_IQ4_XS = 23,
    TD_I8 = 24,
    TD_I16 = 25,
    TD_I32 = 26,
    TD_I64 = 27,
    TD_F64 = 28,
    TD_IQ1_M = 29,
    TD_BF16 = 30,
    TD_TQ1_0 = 34,
    TD_TQ2_0 = 35,
    TD_MXFP4 = 39,
    TD_DTYPE_LIMIT = 40 /* ids are below this */
} td_dtype;

typedef struct dtype_info {
    const char *name;   /* "Q4_K" */
    uint32_t block;     /* weights per block (1 for plain types) */
    uint32_t bytes;     /* bytes per block */
} dtype_info;

/* The layout of type id, or NULL when the id is not a known type. */
const dtype_info *dtype_get(uint32_t id);

/* Name of a type, "?" when unknown. */
const char *dtype_name(uint32_t id);

/* Bytes of n elements of type id. Errors: unknown type, n not a multiple of the block
 * size, or overflow. */
td_err dtype_bytes(uint32_t id, uint64_t n, uint64_t *bytes);

#endif
