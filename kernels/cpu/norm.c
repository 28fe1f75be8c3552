/* Row norms. Sums of squares accumulate in f64: a row of 5120 values then loses nothing
 * before the one rounding to f32, so the CUDA kernels are judged against an exact norm. */
#include <math.h>

#include "kernels/ops.h"

void cpu_rmsnorm(float *out, const float *x, const float *w, int64_t n_rows, int64_t dim,
                 int64_t stride, float eps)
{
    TD_ASSERT(out != NULL && x != NULL && n_rows >= 0 && dim >= 1 && stride >= dim);
#pragma omp parallel for schedule(static) if (n_rows * dim >= (1 << 16))
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * stride;
        float *o = out + r * stride;
        double ss = 0;
        for (int64_t i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
        if (w) {
            for (int64_t i = 0; i < dim; i++)
                o[i] = xr[i] * inv * w[i];
        } else {
            for (int64_t i = 0; i < dim; i++)
                o[i] = xr[i] * inv;
        }
    }
}

void cpu_l2norm(float *out, const float *x, int64_t n_rows, int64_t dim, int64_t stride,
                float eps)
{
    TD_ASSERT(out != NULL && x != NULL && n_rows >= 0 && dim >= 1 && stride >= dim);
#pragma omp parallel for schedule(static) if (n_rows * dim >= (1 << 16))
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * stride;
        float *o = out + r * stride;
        double ss = 0;
        for (int64_t i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss + (double)eps));
        for (int64_t i = 0; i < dim; i++)
            o[i] = xr[i] * inv;
    }
}
