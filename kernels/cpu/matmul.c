/* y = x . W^T for quantised W (x rounded to bf16 first where the weight says x_bf16).
 *
 * Weight rows are dequantised four at a time, one 256-wide tile each, into a stack buffer
 * and dotted with all (up to 64) input rows before the next tile, so a batch reads the
 * weights once; the only scratch memory is the batch's rounded inputs under x_bf16. Tile
 * dots accumulate in f32 (vectorised through omp simd), tile sums in f64: within a few
 * ulp-of-sum of the f64 reference at any width. Rows are split across OpenMP threads. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/simd.h"
#include "kernels/ops.h"

#define MM_TILE 256   /* columns per tile: one K-quant super-block, 8 Q8_0 blocks */
#define MM_BATCH 64   /* input rows that share one pass over the weights */
#define MM_ROWS 4     /* weight rows that share each input tile */

/* acc[j][t] += tile[j] . x[t][c0..c0+n) for MM_ROWS weight rows and n_tok inputs: each
 * input slice is loaded once for all the rows (the x tiles of a whole batch stay in L1). */
static inline __attribute__((always_inline)) void tile_dots(double acc[][MM_BATCH], const float *const *tile, int64_t n_rows,
                             const float *x, int64_t cols, int64_t c0, int64_t n, int64_t n_tok)
{
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xt = x + t * cols + c0;
        if (n_rows == MM_ROWS) {
            const float *w0 = tile[0], *w1 = tile[1], *w2 = tile[2], *w3 = tile[3];
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (int64_t i = 0; i < n; i++) {
                s0 += w0[i] * xt[i];
                s1 += w1[i] * xt[i];
                s2 += w2[i] * xt[i];
                s3 += w3[i] * xt[i];
            }
            acc[0][t] += s0, acc[1][t] += s1, acc[2][t] += s2, acc[3][t] += s3;
            continue;
        }
        for (int64_t j = 0; j < n_rows; j++) {
            const float *wj = tile[j];
            float s0 = 0;
#pragma omp simd reduction(+ : s0)
            for (int64_t i = 0; i < n; i++)
                s0 += wj[i] * xt[i];
            acc[j][t] += s0;
        }
    }
}

/* y[t][r0 + j] for n_rows <= MM_ROWS weight rows from r0 and n_tok <= MM_BATCH inputs; x
 * is rounded already (xr_done) or, where the weight asks for bf16 inputs, rounded here per
 * tile. Compiled for AVX2 (8-wide products) and for plain x86-64 (SSE2), see
 * kernels/cpu/simd.h. */
static inline __attribute__((always_inline)) void rows_body(float *y, const float *x,
                                                            const ops_weight *w, int64_t r0,
                                                            int64_t n_rows, int64_t n_tok,
                                                            bool xr_done)
{
    const dtype_info *info = dtype_get(w->type);
    double acc[MM_ROWS][MM_BATCH];
    float buf[MM_ROWS][MM_TILE];
    float xr[MM_BATCH][MM_TILE]; /* x_bf16: the rounded inputs of the tile */
    const float *tile[MM_ROWS];
    for (int64_t j = 0; j < n_rows; j++)
        for (int64_t t = 0; t < n_tok; t++)
            acc[j][t] = 0;
    for (int64_t c0 = 0; c0 < w->cols; c0 += MM_TILE) {
        int64_t n = w->cols - c0 < MM_TILE ? w->cols - c0 : MM_TILE;
        for (int64_t j = 0; j < n_rows; j++) {
            const uint8_t *row = (const uint8_t *)w->data + (size_t)(r0 + j) * w->row_bytes;
            if (w->type == TD_F32) {
                tile[j] = (const float *)row + c0;
                continue;
            }
            const uint8_t *src = row + (size_t)(c0 / info->block) * info->bytes;
            td_err e = cpu_dequantize_row(w->type, src, buf[j], n);
            TD_ASSERT(e == TD_OK); /* ops_weight_init checked type and cols */
            tile[j] = buf[j];
        }
        if (w->x_bf16 && !xr_done) { /* the inputs' tile rounded as the weight asks */
            for (int64_t t = 0; t < n_tok; t++)
                for (int64_t i = 0; i < n; i++)
                    xr[t][i] = ops_bf16_to_f32(ops_f32_to_bf16(x[t * w->cols + c0 + i]));
            tile_dots(acc, tile, n_rows, &xr[0][0], MM_TILE, 0, n, n_tok);
        } else {
            tile_dots(acc, tile, n_rows, x, w->cols, c0, n, n_tok);
        }
    }
    for (int64_t j = 0; j < n_rows; j++)
        for (int64_t t = 0; t < n_tok; t++)
            y[t * w->rows + r0 + j] = (float)acc[j][t];
}

#if defined(__x86_64__)
CPU_AVX2_TARGET static void rows_avx2(float *y, const float *x, const ops_weight *w, int64_t r0,
                                      int64_t n_rows, int64_t n_tok, bool xr_done)
{
    rows_body(y, x, w, r0, n_rows, n_tok, xr_done);
}
#endif

static void rows_plain(float *y, const float *x, const ops_weight *w, int64_t r0,
                       int64_t n_rows, int64_t n_tok, bool xr_done)
{
    rows_body(y, x, w, r0, n_rows, n_tok, xr_done);
}

/* One pass over the weights for n_tok <= MM_BATCH input rows. Inputs the weight wants in
 * bf16 are rounded once for all row blocks where the memory for them is had, else per row
 * block and tile (the same values either way). */
static void matmul_batch(float *y, const float *x, const ops_weight *w, int64_t n_tok)
{
    const int64_t n_blocks = (w->rows + MM_ROWS - 1) / MM_ROWS;
    /* Small products are not worth waking the thread team. */
    const int parallel = w->rows * w->cols * n_tok >= (1 << 16);
    float *xr = NULL;
    if (w->x_bf16 && n_blocks > 1 && (xr = malloc((size_t)(n_tok * w->cols) * sizeof *xr))) {
        for (int64_t i = 0; i < n_tok * w->cols; i++)
            xr[i] = ops_bf16_to_f32(ops_f32_to_bf16(x[i]));
        x = xr;
    }
    const bool xr_done = xr != NULL;
    void (*rows)(float *, const float *, const ops_weight *, int64_t, int64_t, int64_t, bool) =
        rows_plain;
#if defined(__x86_64__)
    if (cpu_has_avx2_fma())
        rows = rows_avx2;
#endif
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t b = 0; b < n_blocks; b++) {
        int64_t r0 = b * MM_ROWS;
        int64_t nr = w->rows - r0 < MM_ROWS ? w->rows - r0 : MM_ROWS;
        rows(y, x, w, r0, nr, n_tok, xr_done);
    }
    free(xr);
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
        matmul_batch(y + t0 * w->rows, x + t0 * w->cols, w, nt);
    }
}
