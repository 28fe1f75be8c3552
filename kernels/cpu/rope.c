/* NeoX rotary embedding with partial rotary. Angles are computed in f64 (pos up to 2^31
 * times a frequency would lose all fraction bits in f32), then applied in f32. */
#include <math.h>

#include "kernels/ops.h"

void cpu_rope_neox(float *x, int64_t n_tok, int64_t n_head, int64_t tok_stride,
                   int64_t head_stride, int64_t n_rot, const int32_t *pos, float theta)
{
    TD_ASSERT(x != NULL && pos != NULL && n_rot >= 2 && n_rot % 2 == 0 && theta > 0);
    TD_ASSERT(head_stride >= n_rot || n_head == 1);
    const int64_t half = n_rot / 2;
#pragma omp parallel for schedule(static) if (n_tok * n_head * n_rot >= (1 << 16))
    for (int64_t t = 0; t < n_tok; t++) {
        for (int64_t j = 0; j < half; j++) {
            double freq = pow((double)theta, -2.0 * (double)j / (double)n_rot);
            double ang = (double)pos[t] * freq;
            float c = (float)cos(ang), s = (float)sin(ang);
            for (int64_t h = 0; h < n_head; h++) {
                float *v = x + t * tok_stride + h * head_stride;
                float a = v[j], b = v[j + half];
                v[j] = a * c - b * s;
                v[j + half] = a * s + b * c;
            }
        }
    }
}
