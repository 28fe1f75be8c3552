/* Element type conversions of whole arrays. */
#include "kernels/ops.h"

void cpu_to_f16(uint16_t *out, const float *x, int64_t n)
{
    TD_ASSERT(n >= 0 && (n == 0 || (out != NULL && x != NULL)));
    for (int64_t i = 0; i < n; i++)
        out[i] = ops_f32_to_f16(x[i]);
}
