/* The weight-staging address arithmetic of the quantised matmul (matmul_quant.cu), in one
 * place that both the kernel and a host test compile (tests/test_cuda_matmul_addresses.c
 * walks every launch configuration the dispatcher can pick and checks that each address
 * lands inside its allocation). Plain C: no CUDA headers; under nvcc the functions are
 * __host__ __device__.
 *
 * Offsets that can be negative are signed: the staging window of a row whose k-block starts
 * a bytes (0..14) past a 16-byte boundary begins a bytes before it, which for the CTA's first
 * row is before the k-block pointer the offsets are taken from. (An unsigned 32-bit offset
 * there wrapped to ~4 GiB past the weights.) */
#ifndef TANDEM_KERNELS_CUDA_MATMUL_QUANT_ADDR_H
#define TANDEM_KERNELS_CUDA_MATMUL_QUANT_ADDR_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define MMQ_HD static __host__ __device__ __forceinline__
#else
#define MMQ_HD static inline
#endif

#define MMQ_KSPLIT 4  /* warps per CTA, each owning every 4th k-block */
#define MMQ_MROWS 16  /* weight rows per MMA */
#define MMQ_NTOK 8    /* tokens per MMA */

/* Per type, one k-block as staged: KB_W weights per row, KB_BYTES bytes per row in the
 * matrix, SEG bytes staged per row (16-byte pieces from the boundary at or below the block),
 * STRIDE bytes between staged rows in shared memory. See matmul_quant_blocks.cuh. */
#define MMQ_Q4_K_KB_W 256
#define MMQ_Q4_K_KB_BYTES 144
#define MMQ_Q4_K_SEG 144
#define MMQ_Q4_K_STRIDE 160
#define MMQ_Q5_K_KB_W 256
#define MMQ_Q5_K_KB_BYTES 176
#define MMQ_Q5_K_SEG 176
#define MMQ_Q5_K_STRIDE 224
#define MMQ_Q6_K_KB_W 256
#define MMQ_Q6_K_KB_BYTES 210
#define MMQ_Q6_K_SEG 224
#define MMQ_Q6_K_STRIDE 240
#define MMQ_Q8_0_KB_W 128 /* 4 blocks of 32 */
#define MMQ_Q8_0_KB_BYTES 136
#define MMQ_Q8_0_SEG 160
#define MMQ_Q8_0_STRIDE 176

/* Rows past the CTA's last one whose bytes the windows of an unaligned type's last k-block
 * may reach without the exact path: the window runs at most SEG - (block bytes) past the
 * block, i.e. 160 - 34 = 126 bytes for a one-block Q8_0 k-block (4 rows of >= 34 bytes) and
 * 14 for Q6_K; inside a row it reaches at most SEG - KB_BYTES (24) into the next k-block,
 * which has >= 34 bytes. */
#define MMQ_TAIL_ROWS 4

/* k-blocks warp `warp` owns out of nkb: warp, warp + KSPLIT, ... */
MMQ_HD int mmq_warp_kblocks(int nkb, int warp)
{
    return warp < nkb ? (nkb - warp + MMQ_KSPLIT - 1) / MMQ_KSPLIT : 0;
}

/* Bytes of k-block kb in a row: KB_BYTES, except a Q8_0 row's last k-block, which holds the
 * n_blk32 - 4 kb (1..4) blocks that are left. */
MMQ_HD int mmq_kb_bytes(bool q8_0, int kb_bytes_full, int n_blk32, int kb)
{
    if (!q8_0)
        return kb_bytes_full;
    const int left = n_blk32 - 4 * kb;
    return (left < 4 ? left : 4) * 34;
}

/* Where staged row i's block sits past the 16-byte boundary below it (0 for aligned types;
 * the matrix base is 16-byte aligned, so the low bits of kbase's address decide). */
MMQ_HD int mmq_row_misalign(uint32_t kb_lo, uint32_t row_bytes, int i, bool aligned)
{
    return aligned ? 0 : (int)((kb_lo + (uint32_t)i * row_bytes) & 15u);
}

/* Bytes from kbase (the CTA's first row at k-block kb) to piece p (16 bytes) of staged row
 * i's window. -14 <= result < ROWS * row_bytes + SEG <= 2^31 (launch checks row_bytes <=
 * 2^26, ROWS <= 32). */
MMQ_HD int32_t mmq_piece_rel(uint32_t kb_lo, uint32_t row_bytes, int i, int p, bool aligned)
{
    return (int32_t)((uint32_t)i * row_bytes) - mmq_row_misalign(kb_lo, row_bytes, i, aligned) +
           16 * p;
}

/* Bytes of piece p the exact path copies: only those of the block (kb_bytes from its start,
 * a bytes into the window), 0..16. */
MMQ_HD int mmq_piece_exact_bytes(uint32_t kb_lo, uint32_t row_bytes, int i, int p, int kb_bytes)
{
    const int n = kb_bytes + mmq_row_misalign(kb_lo, row_bytes, i, false) - 16 * p;
    return n < 0 ? 0 : n > 16 ? 16 : n;
}

/* Whether the CTA at row r0 (rows_cta rows) stages k-block kb with the exact path: an
 * unaligned type's last k-block within MMQ_TAIL_ROWS rows of the matrix's end. */
MMQ_HD bool mmq_stage_exact(bool aligned, int64_t r0, int rows_cta, int64_t rows, int kb,
                            int nkb)
{
    return !aligned && r0 + rows_cta + MMQ_TAIL_ROWS > rows && kb == nkb - 1;
}

/* CTAs for n_tiles tiles with occ resident per SM: all tiles at once if they fit, else
 * resident CTAs only, between occ/2 and occ per SM, the count whose last round of tiles is
 * fullest (within 2%: the most CTAs). Host code of the tensor-core kernels' launches. */
static inline int64_t mmq_tiles_grid(int64_t n_tiles, int n_sm, int occ)
{
    if (n_tiles <= (int64_t)n_sm * occ)
        return n_tiles;
    double eff[65] = {0}, top = 0.0;
    for (int c = (occ + 1) / 2; c <= occ && c <= 64; c++) {
        const int64_t slots = (int64_t)n_sm * c;
        const int64_t rounds = (n_tiles + slots - 1) / slots;
        eff[c] = (double)n_tiles / (double)(rounds * slots);
        top = eff[c] > top ? eff[c] : top;
    }
    int best = (occ + 1) / 2;
    for (int c = best; c <= occ && c <= 64; c++)
        if (eff[c] >= top - 0.02)
            best = c;
    return (int64_t)n_sm * best;
}

#endif
