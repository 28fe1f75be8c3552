#include "common/dtype.h"

static const dtype_info dtype_table[TD_DTYPE_LIMIT] = {
    [TD_F32] = {"F32", 1, 4},           [TD_F16] = {"F16", 1, 2},
    [TD_Q4_0] = {"Q4_0", 32, 18},       [TD_Q4_1] = {"Q4_1", 32, 20},
    [TD_Q5_0] = {"Q5_0", 32, 22},       [TD_Q5_1] = {"Q5_1", 32, 24},
    [TD_Q8_0] = {"Q8_0", 32, 34},       [TD_Q8_1] = {"Q8_1", 32, 36},
    [TD_Q2_K] = {"Q2_K", 256, 84},      [TD_Q3_K] = {"Q3_K", 256, 110},
    [TD_Q4_K] = {"Q4_K", 256, 144},     [TD_Q5_K] = {"Q5_K", 256, 176},
    [TD_Q6_K] = {"Q6_K", 256, 210},     [TD_Q8_K] = {"Q8_K", 256, 292},
    [TD_IQ2_XXS] = {"IQ2_XXS", 256, 66}, [TD_IQ2_XS] = {"IQ2_XS", 256, 74},
    [TD_IQ3_XXS] = {"IQ3_XXS", 256, 98}, [TD_IQ1_S] = {"IQ1_S", 256, 50},
    [TD_IQ4_NL] = {"IQ4_NL", 32, 18},   [TD_IQ3_S] = {"IQ3_S", 256, 110},
    [TD_IQ2_S] = {"IQ2_S", 256, 82},    [TD_IQ4_XS] = {"IQ4_XS", 256, 136},
    [TD_I8] = {"I8", 1, 1},             [TD_I16] = {"I16", 1, 2},
    [TD_I32] = {"I32", 1, 4},           [TD_I64] = {"I64", 1, 8},
    [TD_F64] = {"F64", 1, 8},           [TD_IQ1_M] = {"IQ1_M", 256, 56},
    [TD_BF16] = {"BF16", 1, 2},         [TD_TQ1_0] = {"TQ1_0", 256, 54},
    [TD_TQ2_0] = {"TQ2_0", 256, 66},    [TD_MXFP4] = {"MXFP4", 32, 17},
};

const dtype_info *dtype_get(uint32_t id)
{
    if (id >= TD_DTYPE_LIMIT || !dtype_table[id].name)
        return NULL;
    return &dtype_table[id];
}

const char *dtype_name(uint32_t id)
{
    const dtype_info *d = dtype_get(id);
    return d ? d->name : "?";
}

td_err dtype_bytes(uint32_t id, uint64_t n, uint64_t *bytes)
{
    const dtype_info *d = dtype_get(id);
    if (!d)
        return err_set(TD_ENOTSUP, "unknown tensor type %u", id);
    if (n % d->block)
        return err_set(TD_EFORMAT, "%llu elements of %s: not a multiple of its block of %u",
                       (unsigned long long)n, d->name, d->block);
    uint64_t blocks = n / d->block;
    if (blocks > UINT64_MAX / d->bytes)
        return err_set(TD_ERANGE, "%llu elements of %s: size overflows", (unsigned long long)n, d->name);
    *bytes = blocks * d->bytes;
    return TD_OK;
}
