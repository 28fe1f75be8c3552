/* What the matmul .cu files share: the launchers behind cuda_matmul (kernels/cuda/matmul.cu
 * dispatches; matmul_quant.cu and matmul_float.cu hold one kernel idea each). Include only
 * from .cu files, after cuda_common.h. */
#ifndef TANDEM_KERNELS_CUDA_MATMUL_INTERNAL_H
#define TANDEM_KERNELS_CUDA_MATMUL_INTERNAL_H

#include "kernels/cuda/cuda_common.h"

/* Tokens per launch: one pass over the weights serves this many tokens; cuda_matmul loops
 * over larger n_tok. */
#define MM_CHUNK 64

/* Inputs per activation scale: one K-quant super-block, so a super-block's integer dot
 * products are summed exactly and scaled once. */
#define MM_XBLOCK 256

/* Bytes of integer sums kept per (x block, token), see mm_xquant. */
#define MM_XSUM_BYTES 48

/* Activations of one chunk rounded to int8 for the tensor-core kernels. Per token and
 * x block b (inputs 256b.. 256b+255, the last block possibly shorter): d = max|x| / 127 and
 * q = rint(x * (1/d)) clamped to +-127, so x ~= d * q. Tokens n_tok..n_pad-1 are zeros.
 *
 * xsum holds, per (block, token), the sums the K-quant offsets need, split as
 * s = 64 * hi + lo (lo in 0..63) so both halves are int8 MMA operands:
 *   bytes  0..15: sums of 32 inputs (j = 0..7, for the Q4_K/Q5_K mins), ordered
 *                 lo[0..3], hi[0..3], lo[4..7], hi[4..7];
 *   bytes 16..47: sums of 16 inputs (k = 0..15, for Q6_K's -32 offset), ordered
 *                 lo[4u..4u+3], hi[4u..4u+3] for u = 0..3.
 * That order makes lane t's 8 bytes at 8t (resp. 16 + 8t) the lo and hi B fragments of a
 * k16 MMA over the sums. */
typedef struct mm_xquant {
    const int8_t *xq;   /* [n_pad][cols] */
    const float *xd;    /* [ceil(cols / 256)][n_pad] scale d of each x block */
    const int8_t *xsum; /* [ceil(cols / 256)][n_pad][MM_XSUM_BYTES] */
    int n_tok;          /* real tokens, 1..MM_CHUNK */
    int n_pad;          /* tokens in the layout: 8, 16, 32 or 64 */
} mm_xquant;

/* y[n_tok][w->rows] = xq . W^T for Q8_0, Q4_K, Q5_K, Q6_K (matmul_quant.cu). w->data is
 * 16-byte aligned (cuda_matmul checks). n_sm: the device's multiprocessor count (picks the
 * row tile; results do not depend on it). */
td_err mmq_launch(float *y, const mm_xquant *xq, const ops_weight *w, int n_sm,
                  cudaStream_t st);

/* y[n_tok][w->rows] = x[n_tok][w->cols] . W^T for F32, F16, BF16 (matmul_float.cu),
 * 1 <= n_tok <= MM_CHUNK. */
td_err mmf_launch(float *y, const float *x, const ops_weight *w, int n_tok, cudaStream_t st);

#endif
