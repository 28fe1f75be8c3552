/* y = x . W^T for quantised W.
 *
 * Each weight row is dequantised one 256-wide tile at a time into a stack buffer and dotted
 * with all (up to 64) input rows before the next tile, so a batch reads the weights once and
 * needs no scratch memory. Tile dots accumulate in f32 (vectorised through omp simd), tile
 * sums in f64: within a few ulp-of-sum of the f64 reference at any width. Rows are split
 * across OpenMP threads. */
#include <string.h>

#include "kernels/ops.h"

#define MM_TILE 256   /* columns per tile: one K-quant super-block, 8 Q8_0 blocks */
#define MM_BATCH 64   /* input rows that share one pass over the weights */

static float dot_f32(const float *a, const float *b, int64_t n)
{
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* One pass over the weights for n_tok <= MM_BATCH input rows. */
static void matmul_batch(float *y, const float *x, const ops_weight *w, int64_t n_tok,
                         int64_t y_stride)
{
    const dtype_info *info = dtype_get(w->type);
    const int64_t rows = w->rows, cols = w->cols;
    /* Small products are not worth waking the thread team. */
    const int parallel = rows * cols * n_tok >= (1 << 16);

#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        double acc[MM_BATCH];
        float tile[MM_TILE];
        for (int64_t t = 0; t < n_tok; t++)
            acc[t] = 0;
        for (int64_t c0 = 0; c0 < cols; c0 += MM_TILE) {
            int64_t n = cols - c0 < MM_TILE ? cols - c0 : MM_TILE;
            const float *wt;
            if (w->type == TD_F32) {
                wt = (const float *)row + c0;
            } else {
                const uint8_t *src = row + (size_t)(c0 / info->block) * info->bytes;
                td_err e = cpu_dequantize_row(w->type, src, tile, n);
                TD_ASSERT(e == TD_OK); /* ops_weight_init checked type and cols */
                wt = tile;
            }
            for (int64_t t = 0; t < n_tok; t++)
                acc[t] += dot_f32(wt, x + t * cols + c0, n);
        }
        for (int64_t t = 0; t < n_tok; t++)
            y[t * y_stride + r] = (float)acc[t];
    }
}

void cpu_matmul(float *y, const float *x, const ops_weight *w, int64_t n_tok)
{
    TD_ASSERT(y != NULL && x != NULL && w != NULL && w->data != NULL);
    TD_ASSERT(n_tok >= 1 && w->rows >= 1 && w->cols >= 1);
    TD_ASSERT(ops_type_supported(w->type));
    const dtype_info *info = dtype_get(w->type);
    /* a tile must start on a block boundary */
    TD_ASSERT(w->cols % info->block == 0 && MM_TILE % info->block == 0);
    for (int64_t t0 = 0; t0 < n_tok; t0 += MM_BATCH) {
        int64_t nt = n_tok - t0 < MM_BATCH ? n_tok - t0 : MM_BATCH;
        matmul_batch(y + t0 * w->rows, x + t0 * w->cols, w, nt, w->rows);
    }
}
