/* y = bf16(x) . W^T for Q6_K weights and 1..16 tokens on the tensor cores: the x_bf16
 * products of the drafter whose LM head is the target's Q6_K output (15 or 7 block positions
 * per draft step). cpu_matmul with x_bf16 is its twin.
 *
 * Why: the exact path rounds x to two int8 digits per input and scales every sub-block sum
 * by its integer scale (kernels/cuda/NOTES.md, the window kernel): at 16 tokens that is ~1080
 * instructions per 16-row k-block of Q6_K and the LM head runs at ~40% of the copy rate. With
 * x in bf16 a weight's 6-bit value q - 32 is an exact bf16 and one MMA multiplies it with 8
 * tokens: per step (16 weights of one scale) the two rows' values come out of three words by
 * a few byte operations (matmul_q6x.h), the MMA sums the 16 exact products in f32, and one
 * fma per output applies the scale d * sc (exact in f32: 11 x 8 bits).
 *
 * Layout: one CTA of Q6X_WARPS warps per SM; the CTA first writes every token's row of x as
 * bf16 (round to nearest even, as ops_f32_to_bf16) into shared memory, tokens n_tok..n_pad-1
 * as zeros, then each warp takes whole 16-row tiles (tile = CTA * warps + warp, then strided
 * by the grid) and walks all their k-blocks itself, so no sum crosses warps. Lane (g, t) reads
 * its words of rows g and g + 8 straight from global memory, the next k-block's while it
 * multiplies this one's; a k-block starts 2 bytes past a word boundary when its offset is
 * (210 bytes per block), where each word is joined from two aligned ones.
 *
 * Order per (row, token), the same for every n_tok: k-blocks in increasing order, within one
 * the 16 steps by half h, quarter p, class c; each step's MMA starts from zero and is added to
 * the running sum by one fma with the scale. An MMA output depends only on its own row and
 * column, so which n-tile a token sits in never changes it. */
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul_internal.h"
#include "kernels/cuda/matmul_q6x.h"

namespace {

constexpr int WARPS = 16; /* warps per CTA, one 16-row tile each at a time */

/* Lane t's words of one row's k-block: q6x_ql0/ql1/qh of each (h, p), the 16 scales, d. */
struct q6x_words {
    uint32_t ql0[2][2], ql1[2][2], qh[2][2], sc[4];
    float d;
};

__device__ __forceinline__ uint32_t ldw(const uint8_t *p)
{
    uint32_t v;
    asm("ld.global.nc.L1::no_allocate.b32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

/* The words of the block at bp (2-byte aligned; MIS: 2 bytes past a word boundary, each word
 * joined from the two aligned words around it). Nothing past the block is read, and at most
 * the 2 bytes before it, which belong to the matrix: its start is 16-byte aligned, so a block
 * 2 bytes past a word boundary is never its first (tests/test_cuda_matmul_addresses.c). */
template <bool MIS> __device__ __forceinline__ q6x_words load_at(const uint8_t *bp, int t)
{
    const uint8_t *a = MIS ? bp - 2 : bp;
    auto word = [&](int o) -> uint32_t {
        if constexpr (MIS)
            return __funnelshift_r(ldw(a + o), ldw(a + o + 4), 16);
        else
            return ldw(a + o);
    };
    q6x_words w;
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int p = 0; p < 2; p++) {
            w.ql0[h][p] = word(q6x_ql0(h, p, t));
            w.ql1[h][p] = word(q6x_ql1(h, p, t));
            w.qh[h][p] = word(q6x_qh(h, p, t));
        }
#pragma unroll
    for (int i = 0; i < 4; i++)
        w.sc[i] = word(Q6X_SCALES + 4 * i);
    w.d = __half2float(__ushort_as_half(__ldg((const unsigned short *)(bp + Q6X_D))));
    return w;
}

__device__ __forceinline__ q6x_words load_block(const uint8_t *bp, int t)
{
    if (((uintptr_t)bp & 3) == 0)
        return load_at<false>(bp, t);
    return load_at<true>(bp, t);
}

/* Bytes 2e, 2e + 1 (values 0..63) of q as the bf16 pair (byte - 32): 0x43XX is the bf16
 * 128 + XX for XX < 128, and 128 + q - 160 is exact. */
__device__ __forceinline__ uint32_t pair_minus32(uint32_t q, int e)
{
    const uint32_t v = __byte_perm(q, 0x43u, e == 0 ? 0x4140 : 0x4342);
    __nv_bfloat162 b;
    memcpy(&b, &v, sizeof b);
    b = __hsub2(b, __floats2bfloat162_rn(160.0f, 160.0f));
    uint32_t r;
    memcpy(&r, &b, sizeof r);
    return r;
}

/* The scale of class c, half h, quarter p: d * sc, exact in f32. */
__device__ __forceinline__ float scale_of(const q6x_words &w, int j)
{
    return w.d * (float)(int8_t)(w.sc[j >> 2] >> (8 * (j & 3)));
}

/* acc += one k-block of rows g (A) and g + 8 (B) against tokens g + 8 nt; xg: token g's bf16
 * row at the k-block's first input, stride elements between tokens. */
template <int NT>
__device__ __forceinline__ void kblock(float (&acc)[NT][4], const q6x_words &A,
                                       const q6x_words &B, const uint16_t *xg, int stride, int t)
{
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int p = 0; p < 2; p++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const uint32_t qa = q6x_class_bytes(A.ql0[h][p], A.ql1[h][p], A.qh[h][p], c);
                const uint32_t qb = q6x_class_bytes(B.ql0[h][p], B.ql1[h][p], B.qh[h][p], c);
                /* a0a1: row g, slots 2t, 2t+1 (bytes 0, 1); a2a3: row g + 8; a4..a7: slots
                 * 2t+8, 2t+9 (bytes 2, 3) */
                const uint32_t a[4] = {pair_minus32(qa, 0), pair_minus32(qb, 0),
                                       pair_minus32(qa, 1), pair_minus32(qb, 1)};
                const int j = q6x_scale(h, p, c);
                const float sa = scale_of(A, j), sb = scale_of(B, j);
                const int col = q6x_input(h, p, c, t, 0);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const uint2 bx = *(const uint2 *)(xg + (size_t)nt * 8 * stride + col);
                    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mm_mma_bf16(d, a, bx.x, bx.y);
                    acc[nt][0] = fmaf(d[0], sa, acc[nt][0]);
                    acc[nt][1] = fmaf(d[1], sa, acc[nt][1]);
                    acc[nt][2] = fmaf(d[2], sb, acc[nt][2]);
                    acc[nt][3] = fmaf(d[3], sb, acc[nt][3]);
                }
            }
}

/* y[n_tok][rows] = bf16(x[n_tok][cols]) . W^T; NT n-tiles of 8 tokens (n_tok <= 8 NT). */
template <int NT>
__global__ void __launch_bounds__(WARPS * 32, 1)
    q6x_kernel(bool early, float *y, const uint8_t *w, int64_t rows, int cols, size_t row_bytes,
               const float *x, int n_tok)
{
    extern __shared__ __align__(16) uint8_t q6x_smem[];
    uint16_t *xs = (uint16_t *)q6x_smem;
    const int stride = cols + Q6X_PAD;
    pdl_enter(early);
    for (int tok = 0; tok < NT * 8; tok++)
        for (int c2 = 2 * (int)threadIdx.x; c2 < cols; c2 += 2 * WARPS * 32) {
            const float v0 = tok < n_tok ? x[(size_t)tok * cols + c2] : 0.0f;
            const float v1 = tok < n_tok ? x[(size_t)tok * cols + c2 + 1] : 0.0f;
            const __nv_bfloat162 b = __floats2bfloat162_rn(v0, v1);
            memcpy(xs + (size_t)tok * stride + c2, &b, sizeof b);
        }
    __syncthreads();

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t n_tiles = (rows + 15) / 16;
    const int nkb = cols / 256;
    const uint16_t *xg = xs + (size_t)g * stride;
    for (int64_t tile = (int64_t)blockIdx.x * WARPS + warp; tile < n_tiles;
         tile += (int64_t)gridDim.x * WARPS) {
        const int64_t r0 = tile * 16;
        /* rows past the matrix read its last row; their outputs are not stored */
        const int64_t ra = r0 + g < rows ? r0 + g : rows - 1;
        const int64_t rb = r0 + g + 8 < rows ? r0 + g + 8 : rows - 1;
        const uint8_t *pa = w + (size_t)ra * row_bytes, *pb = w + (size_t)rb * row_bytes;
        float acc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[nt][e] = 0.0f;
        /* the next k-block's words load while this one multiplies */
        q6x_words A = load_block(pa, t), B = load_block(pb, t);
#pragma unroll 1
        for (int kb = 0; kb < nkb; kb++) {
            q6x_words An = A, Bn = B;
            if (kb + 1 < nkb) {
                const size_t off = (size_t)(kb + 1) * Q6X_BLOCK_BYTES;
                An = load_block(pa + off, t);
                Bn = load_block(pb + off, t);
            }
            kblock<NT>(acc, A, B, xg + kb * 256, stride, t);
            A = An;
            B = Bn;
        }
        /* c0, c1: row g, tokens 2t, 2t + 1 of the n-tile; c2, c3: row g + 8 */
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int tok = 8 * nt + 2 * t + (e & 1);
                const int64_t row = r0 + g + 8 * (e >> 1);
                if (tok < n_tok && row < rows)
                    y[(size_t)tok * rows + row] = acc[nt][e];
            }
    }
}

template <int NT>
td_err launch(float *y, const float *x, const ops_weight *w, int n_tok, int dev, cudaStream_t st)
{
    int sms = 0;
    TD_TRY(sm_count(dev, &sms));
    TD_TRY(smem_optin<q6x_kernel<NT>>(dev, (size_t)smem_optin_bytes(dev)));
    const int64_t n_tiles = (w->rows + 15) / 16;
    const int64_t want = (n_tiles + WARPS - 1) / WARPS;
    const unsigned grid = (unsigned)(want < sms ? want : sms);
    return pdl_launch<q6x_kernel<NT>>("Q6_K x bf16 matmul", dim3(grid), dim3(WARPS * 32),
                                      q6x_smem_bytes(w->cols, NT * 8), st, y,
                                      (const uint8_t *)w->data, w->rows, (int)w->cols,
                                      w->row_bytes, x, n_tok);
}

} /* namespace */

bool q6x_takes(const ops_weight *w, int64_t n_tok)
{
    if (w->type != TD_Q6_K || !w->x_bf16 || n_tok < 1 || n_tok > Q6X_MAX_TOK ||
        w->cols > (1 << 20))
        return false;
    const char *e = getenv("TANDEM_Q6X"); /* off by default: kernels/cuda/NOTES.md */
    if (!e || strcmp(e, "on") != 0)
        return false;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return code_arch(dev) >= 800 &&
           q6x_smem_bytes(w->cols, Q6X_MAX_TOK) <= (size_t)smem_optin_bytes(dev);
}

td_err q6x_launch(float *y, const float *x, const ops_weight *w, int n_tok, cudaStream_t st)
{
    TD_ASSERT(w->type == TD_Q6_K && n_tok >= 1 && n_tok <= Q6X_MAX_TOK); /* q6x_takes said so */
    int dev = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    /* 8 tokens or fewer take the 16-token kernel too: the MMAs are not what it waits for, and
     * nvcc 13.0 spills 476 bytes of one n-tile's kernel at 128 registers (none of two) */
    return launch<2>(y, x, w, n_tok, dev, st);
}
