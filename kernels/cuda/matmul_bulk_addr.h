/* The copy and shared-memory arithmetic of the bulk-copy single-token matmul
 * (matmul_bulk.cu), in one place that both the kernel and a host test compile
 * (tests/test_cuda_matmul_addresses.c checks that every bulk copy, tail load and
 * shared-memory read lands inside its allocation). Plain C: no CUDA headers; under nvcc the
 * functions are __host__ __device__.
 *
 * Work is cut into units of MMB_UROWS consecutive rows; a warp takes a unit whole and walks
 * its k-blocks in stages of KC (a multiple of the 4 accumulation chains q = k-block mod 4).
 * A stage holds, per row of the unit, one contiguous run of the row's bytes: the k-blocks
 * k0 .. k0 + KC - 1 that exist. A bulk copy needs a 16-byte aligned source, destination and
 * size, so the copy is the 16-byte window around the run (start rounded down, end rounded
 * up); Q4_K (144-byte) and Q5_K (176-byte) runs are that window exactly when the matrix is
 * 16-byte aligned, Q6_K (210) and Q8_0 (4 x 34) runs start `mis` bytes into it. The window
 * of the matrix's last run may end up to 14 bytes past the matrix: there the bulk copy stops
 * at the last 16-byte boundary and the `tail` bytes after it are read with 16-bit loads. */
#ifndef TANDEM_KERNELS_CUDA_MATMUL_BULK_ADDR_H
#define TANDEM_KERNELS_CUDA_MATMUL_BULK_ADDR_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define MMB_HD static __host__ __device__ __forceinline__
#else
#define MMB_HD static inline
#endif

#define MMB_WARPS 8 /* warps per CTA, each with its own ring of stages */
#define MMB_WIDE_WARPS 16 /* Q4_K rows rounded in the kernel (<= MMB_FUSE_COLS inputs) */
#define MMB_Q6_K_WIDE_WARPS 12 /* Q6_K rows rounded in the kernel */
/* Rows of at most this many inputs are rounded by the bulk-copy kernel itself (8 or 16 warps
 * per CTA, about 3 or 2 blocks of 256 inputs each, about as long as reading them rounded);
 * longer ones by the rounding kernel, whose many CTAs split the work. */
#define MMB_FUSE_COLS 6144
#define MMB_UROWS 8 /* rows per unit: lane = 4 * row + chain */
#define MMB_HDR 512 /* shared bytes before the activations: barriers, stage owners, counter */

/* Per type: KB bytes of one k-block in a row (Q8_0: 4 blocks of 34); KC k-blocks per stage
 * and row (a multiple of the 4 chains: a copy and a barrier wait serve KC / 4 k-blocks of
 * each lane); SLOT shared bytes per row and stage (>= the largest window; for Q4_K/Q5_K 16 *
 * (4 mod 8), so the 8 rows x 4 chains of a warp's 16-byte loads meet 8 different bank groups
 * per quarter warp); STAGES per warp ring. */
#define MMB_Q4_K_KB 144
#define MMB_Q4_K_KC 8
#define MMB_Q4_K_SLOT 1216 /* 1152-byte run + 64 */
#define MMB_Q4_K_STAGES 2
#define MMB_Q4_K_WIDE_KC 4 /* the wide CTA: twice the warps, half the k-blocks per stage */
#define MMB_Q4_K_WIDE_SLOT 576 /* 576-byte run: 16 x 36, 36 = 4 mod 8 */
#define MMB_Q4_K_WIDE_STAGES 2
#define MMB_Q5_K_KB 176
#define MMB_Q5_K_KC 8
#define MMB_Q5_K_SLOT 1472 /* 1408-byte run + 64 */
#define MMB_Q5_K_STAGES 2
#define MMB_Q6_K_KB 210
#define MMB_Q6_K_KC 4
#define MMB_Q6_K_SLOT 864 /* 840-byte run + up to 14 before + rounding: <= 864 */
#define MMB_Q6_K_STAGES 3
#define MMB_Q6_K_WIDE_STAGES 2 /* 12 warps x 2 stages: the buffers of 8 x 3 */
#define MMB_Q8_0_KB 136
#define MMB_Q8_0_KC 8
#define MMB_Q8_0_SLOT 1104 /* 1088-byte run + up to 14 before + rounding: <= 1104 */
#define MMB_Q8_0_STAGES 2

/* Activations in shared memory, per k-block: the 16-byte units of hi/lo digits (inputs 8u ..
 * 8u + 7 in the interleave the type's kernel reads), then what the type needs besides (the
 * scale dx and the digits of the sums, MMB_XAUX bytes at MMB_XAUX_AT). A K-quant k-block
 * (256 inputs) has 32 units, units 16..31 after the aux area and a 64-byte gap: with a
 * stride of 592 (= 80 mod 128) the 4 chains reading the same unit of k-blocks k0..k0+3 hit 4
 * different bank groups. Q8_0 (128 inputs, 16 units): 272 bytes (= 16 mod 128). */
#define MMB_XKB_K 592
#define MMB_XKB_Q8 272
#define MMB_XAUX_AT 256

MMB_HD int mmb_xunit(bool q8_0, int u)
{
    return 16 * u + (!q8_0 && u >= 16 ? 64 : 0);
}

/* Rows [unit * MMB_UROWS, +nr) of a matrix of `rows`. */
MMB_HD int mmb_unit_rows(int64_t unit, int64_t rows)
{
    const int64_t left = rows - unit * MMB_UROWS;
    return left < MMB_UROWS ? (int)left : MMB_UROWS;
}

/* One row's part of a stage. */
typedef struct mmb_copy {
    int64_t src;   /* byte offset in the matrix of the window's start (16-byte aligned) */
    uint32_t bulk; /* bytes of the bulk copy from src: a multiple of 16, possibly 0 */
    uint32_t tail; /* bytes after those up to the matrix end, 16-bit loads (0..14) */
    uint32_t mis;  /* bytes from the window's start to the run's (0..14, even) */
    uint32_t run;  /* bytes of the run: the k-blocks of the stage that exist */
} mmb_copy;

/* Bytes of the run of k-blocks k0 .. k0 + kc - 1 (those before the row's end): the same in
 * every row. */
MMB_HD uint32_t mmb_run_bytes(int64_t row_bytes, int kb_bytes, int kc, int k0)
{
    const int64_t left = row_bytes - (int64_t)k0 * kb_bytes;
    return (uint32_t)(left < (int64_t)kc * kb_bytes ? left : (int64_t)kc * kb_bytes);
}

/* The window of a run of `run` bytes starting `start` bytes into a matrix of `total` bytes
 * (even, as every row_bytes is). */
MMB_HD mmb_copy mmb_copy_at(int64_t start, uint32_t run, int64_t total)
{
    const int64_t we = (start + run + 15) & ~(int64_t)15;
    mmb_copy c;
    c.src = start & ~(int64_t)15;
    c.mis = (uint32_t)(start - c.src);
    c.run = run;
    if (we <= total) {
        c.bulk = (uint32_t)(we - c.src);
        c.tail = 0;
    } else { /* the matrix's last run: stop the copy at its last 16-byte boundary */
        const int64_t lim = total & ~(int64_t)15;
        c.bulk = (uint32_t)(lim - c.src);
        c.tail = (uint32_t)(total - lim);
    }
    return c;
}

/* Bulk bytes of the window of a run that is not the matrix's last (so never past it): what
 * mmb_copy_at gives with tail = 0, for the rows the kernel copies without the check. */
MMB_HD uint32_t mmb_window_bytes(int64_t start, uint32_t run)
{
    return (uint32_t)(((start + run + 15) & ~(int64_t)15) - (start & ~(int64_t)15));
}

/* Row `row`'s run of k-blocks k0 .. k0 + kc - 1 in a matrix of `rows` rows of row_bytes,
 * k-blocks of kb_bytes. The kernel walks the rows of a stage with start += row_bytes. */
MMB_HD mmb_copy mmb_copy_of(int64_t row_bytes, int64_t rows, int kb_bytes, int kc, int64_t row,
                            int k0)
{
    return mmb_copy_at(row * row_bytes + (int64_t)k0 * kb_bytes,
                       mmb_run_bytes(row_bytes, kb_bytes, kc, k0), rows * row_bytes);
}

/* Q6_K rows by pairs (the window and wide kernels' tile copies, where row_bytes is a multiple
 * of 8 so that two rows are a 16-byte multiple): the byte, in the tensor row of rows 2j and
 * 2j + 1, where row 2j + odd's box starts for the run from k-block k0: the run's first byte
 * rounded down to 16, which is where mmb_copy_of's window starts (the matrix 16-byte
 * aligned). */
MMB_HD int64_t mmb_pair_x(int64_t row_bytes, int kb_bytes, int k0, int odd)
{
    return ((odd ? row_bytes : 0) + (int64_t)k0 * kb_bytes) & ~(int64_t)15;
}

/* Q4_K and Q5_K (row_bytes and kb_bytes multiples of 16, the matrix 16-byte aligned): every
 * run is its window (mis = tail = 0), mmb_run_bytes long from row * row_bytes + k0 * kb_bytes,
 * so the kernel copies runs without the window arithmetic. */

/* The window kernel (matmul_bulk_mma.cu, 9-16 tokens) stages each row's runs of MMQB_WIN
 * k-blocks with the same rule (mmb_copy_of with kc = MMQB_WIN) into rows PITCH bytes apart:
 * 32 or 96 mod 128 for the 8-byte loads of Q4_K/Q5_K, 16-byte steps mod 128 for Q6_K's 4-byte
 * ones, and room for the largest window (Q6_K: 840-byte run + up to 14 before + rounding). */
#define MMQB_WIN 4
#define MMQB_Q4_K_PITCH 608
#define MMQB_Q5_K_PITCH 736
#define MMQB_Q6_K_PITCH 880

/* The wide kernel (the same file, 17-64 tokens) stages runs of MMQW_KS k-blocks per row by the
 * same rule, rows MMQW_*_PITCH(MMQW_KS) bytes apart (the same residues mod 128, room for the
 * largest window: Q6_K 2 x 210 bytes + up to 14 before, rounded, and the word after it). */
#define MMQW_KS 2
#define MMQW_Q4_K_PITCH(ks) ((ks) == 1 ? 160 : 352)
#define MMQW_Q5_K_PITCH(ks) ((ks) == 1 ? 224 : 352)
#define MMQW_Q6_K_PITCH(ks) ((ks) == 1 ? 240 : 496)

/* The warpgroup layout (Q4_K at n_pad 16 on wgq_launch): per 256-input block, 8 slices of
 * 32 inputs, each the B operand of a k32 warpgroup MMA with 2 * n_pad columns (the tokens'
 * hi digits, then their lo digits) as the descriptor reads it without swizzling: core
 * matrices of 8 columns x 16 bytes (one column's 16 k slots), the two k halves 128 bytes
 * apart, groups of 8 columns 256 apart. K slot 4t + e of the first half is input 8t + e of
 * the slice, of the second half input 8t + 4 + e (the weight fragments' order, which lets a
 * lane's 8 bytes of a qs run serve both halves). The byte offset within the block's
 * 512 * n_pad bytes of the 4 digits dig (0 hi, 1 lo) of inputs 8u + 4h .. 8u + 4h + 3 of
 * token tok: */
MMB_HD int mm_wg_pos(int u, int h, int dig, int tok, int n_pad)
{
    const int n = dig * n_pad + tok; /* the column */
    return (u >> 2) * 64 * n_pad + (n >> 3) * 256 + h * 128 + (n & 7) * 16 + 4 * (u & 3);
}

/* Matrices of one type and width that read the same activations, launched together
 * (matmul.cu's cuda_matmul_multi): one kernel, one ramp-up and one tail for all of them, and
 * the activations staged (or rounded) once per CTA. A kernel cuts each member into units
 * (its row groups: 8 rows for the single-token bulk kernel, 16-row tiles for the window
 * kernel, 4 rows for F32) and numbers them member after member, so no unit spans two
 * members and every (row, token) is computed as it is alone. */
#define MM_SET_MAX 4

typedef struct mm_set {
    int n;                         /* members, 1..MM_SET_MAX */
    float *y[MM_SET_MAX];          /* member m's output [n_tok][rows[m]] */
    const uint8_t *w[MM_SET_MAX];  /* its weights (every row row_bytes long) */
    int64_t rows[MM_SET_MAX];
    int64_t first[MM_SET_MAX + 1]; /* its units are first[m] .. first[m + 1] - 1; first[n] and
                                    * past it: all units */
} mm_set;

/* Numbers the units of s's n members (rows[] set) in units of unit_rows rows. */
MMB_HD void mm_set_number(mm_set *s, int64_t unit_rows)
{
    s->first[0] = 0;
    for (int i = 0; i < MM_SET_MAX; i++)
        s->first[i + 1] = s->first[i] + (i < s->n ? (s->rows[i] + unit_rows - 1) / unit_rows : 0);
}

/* The member that unit u (< first[n]) belongs to. */
MMB_HD int mm_set_member(const mm_set *s, int64_t u)
{
    int m = 0;
    for (int i = 1; i < MM_SET_MAX; i++)
        m += i < s->n && u >= s->first[i];
    return m;
}

/* How the window and wide kernels (matmul_bulk_mma.cu) spread n_tiles 16-row tiles: *grid
 * CTAs (one per SM, or per tile if fewer), CTA b owning tiles [n_tiles * b / grid, n_tiles *
 * (b + 1) / grid) (at most q of them), done in rounds of the returned tt tiles at a time
 * (at most ttmax), the fewest rounds, as even as they go: 1088 tiles on 132 SMs with ttmax 3
 * or 4 give 3 rounds of 3. A CTA's rounds, ceil(share / tt), never exceed ceil(q / tt). */
MMB_HD int mmqb_tiles_per_round(int64_t n_tiles, int64_t n_sm, int ttmax, int64_t *grid)
{
    *grid = n_tiles < n_sm ? n_tiles : n_sm;
    const int64_t q = (n_tiles + *grid - 1) / *grid;
    const int64_t rounds = (q + ttmax - 1) / ttmax;
    return (int)((q + rounds - 1) / rounds);
}

/* The next item a warp of the window or wide kernel issues into one of its rings: its
 * number n, round and step s (item n is step n % nsteps of round n / nsteps). Items are
 * issued in order, so mmqb_cursor_next keeps round and step by counting, without a division
 * per step; m is the set member of the round m_round's tile (-1: none looked up yet). */
typedef struct mmqb_cursor {
    int n, round, s;
    int m_round, m;
} mmqb_cursor;

MMB_HD void mmqb_cursor_next(mmqb_cursor *c, int nsteps)
{
    c->n++;
    if (++c->s == nsteps) {
        c->s = 0;
        c->round++;
    }
}

/* Shared bytes of one CTA of `warps` warps for nkb k-blocks per row: header, activations
 * (128-byte aligned), rings. */
MMB_HD int64_t mmb_smem_bytes(int64_t nkb, int xkb, int slot, int stages, int warps)
{
    const int64_t xs = (nkb * xkb + 127) & ~(int64_t)127;
    return MMB_HDR + xs + (int64_t)warps * stages * MMB_UROWS * slot;
}

#endif
