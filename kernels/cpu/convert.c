/* Element type conversions of whole arrays. */
#include <string.h>

#include "kernels/ops.h"

void cpu_to_f16(uint16_t *out, const float *x, int64_t n)
{
    TD_ASSERT(n >= 0 && (n == 0 || (out != NULL && x != NULL)));
    for (int64_t i = 0; i < n; i++)
        out[i] = ops_f32_to_f16(x[i]);
}

void cpu_to_bf16(uint16_t *out, const float *x, int64_t n)
{
    TD_ASSERT(n >= 0 && (n == 0 || (out != NULL && x != NULL)));
    for (int64_t i = 0; i < n; i++)
        out[i] = ops_f32_to_bf16(x[i]);
}

void cpu_from_bf16(float *out, const uint16_t *x, int64_t n)
{
    TD_ASSERT(n >= 0 && (n == 0 || (out != NULL && x != NULL)));
    for (int64_t i = 0; i < n; i++)
        out[i] = ops_bf16_to_f32(x[i]);
}

void cpu_kv_store(void *k_cache, void *v_cache, td_dtype type, const float *k, const float *v,
                  const int32_t *rows, int64_t n_tok, int64_t row)
{
    TD_ASSERT(type == TD_F32 || type == TD_F16);
    TD_ASSERT(n_tok >= 0 && row >= 1 && (n_tok == 0 || (k && v && rows && k_cache && v_cache)));
    for (int64_t t = 0; t < n_tok; t++) {
        TD_ASSERT(rows[t] >= 0);
        const float *kt = k + t * row, *vt = v + t * row;
        if (type == TD_F16) {
            cpu_to_f16((uint16_t *)k_cache + (int64_t)rows[t] * row, kt, row);
            cpu_to_f16((uint16_t *)v_cache + (int64_t)rows[t] * row, vt, row);
        } else {
            memcpy((float *)k_cache + (int64_t)rows[t] * row, kt, (size_t)row * sizeof(float));
            memcpy((float *)v_cache + (int64_t)rows[t] * row, vt, (size_t)row * sizeof(float));
        }
    }
}
