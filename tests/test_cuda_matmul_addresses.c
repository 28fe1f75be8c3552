/* Every global and shared address the quantised CUDA matmul (kernels/cuda/matmul_quant.cu)
 * touches, computed on the host for every launch configuration the dispatcher can pick, lies
 * inside its allocation. No GPU needed: the weight staging uses the kernel's own arithmetic
 * (kernels/cuda/matmul_quant_addr.h, compiled here as C); the activation loads, y writes and
 * shared-memory layout are replicated from matmul_quant.cu / matmul_quant_blocks.cuh
 * (xview_at, load_b16/load_b8/load_sums/load_dx, the reduction) in plain C.
 *
 * Configurations: Q4_K, Q5_K, Q6_K, Q8_0; tiles MT = 1 and 2 (n_pad 16 takes either,
 * depending on the device's SM count, so both are checked); n_tok 1..70 (64-token chunks,
 * n_pad 8/16/32/64, the decode variant at n_tok 1); the shapes of tests/test_gpu_ops_matmul.c,
 * the tiny qwen35 model's and the 27B target's.
 *
 * The bulk-copy single-token kernel (matmul_bulk.cu) likewise: every row run of every stage
 * through the kernel's own mmb_copy_of / mmb_run_bytes (kernels/cuda/matmul_bulk_addr.h),
 * the tail loads, the slot each lane reads, its rounding's reads of x and stores into the
 * activation layout, and the CTA's shared memory.
 *
 * Sets of matrices launched together (mm_set, matmul_bulk_addr.h): the numbering of their
 * units (mm_set_number, mm_set_member) gives every row of every member to exactly one unit
 * of that member, and the CTAs' even shares of the units cover each exactly once.
 *
 * The window and wide kernels' tile copies: a tensor box of a tile's rows (Q4_K, Q5_K) or
 * two boxes of its pairs of rows (Q6_K) put the bytes each row's copy puts, where the
 * kernel reads that row.
 *
 * The warpgroup kernel's activation layout (mm_wg_pos): each digit once, where the MMA's
 * shared-memory descriptor reads it for the k slot its weight fragment gives the input.
 *
 * The Q6_K x bf16 kernel (matmul_q6x.cu): the lanes' words, classes, inputs and scales of
 * kernels/cuda/matmul_q6x.h rebuild every weight of random blocks as cpu_dequantize_row gives
 * it, each input of a block exactly once, and a block 2 bytes past a word boundary read as
 * the kernel joins its words reads nothing past it and at most the 2 bytes before it. */
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/dtype.h"
#include "kernels/cuda/matmul_bulk_addr.h"
#include "kernels/cuda/matmul_q6x.h"
#include "kernels/cuda/matmul_quant_addr.h"
#include "kernels/ops.h"

#define MM_CHUNK 64      /* tokens per launch (matmul_internal.h) */
#define MM_XBLOCK 256    /* inputs per activation scale */
#define MM_XSUM_BYTES 96 /* integer sums per (x block, token) */

/* One type's staging constants, as qt<T> has them. */
typedef struct qgeom {
    td_dtype type;
    int kb_w, kb_bytes, seg, stride; /* weights, bytes per k-block; staged bytes, row pitch */
    int blk_w, blk_bytes;            /* the type's block: weights, bytes */
    bool aligned;                    /* blocks are whole 16-byte pieces */
} qgeom;

static const qgeom geoms[] = {
    {TD_Q4_K, MMQ_Q4_K_KB_W, MMQ_Q4_K_KB_BYTES, MMQ_Q4_K_SEG, MMQ_Q4_K_STRIDE, 256, 144, true},
    {TD_Q5_K, MMQ_Q5_K_KB_W, MMQ_Q5_K_KB_BYTES, MMQ_Q5_K_SEG, MMQ_Q5_K_STRIDE, 256, 176, true},
    {TD_Q6_K, MMQ_Q6_K_KB_W, MMQ_Q6_K_KB_BYTES, MMQ_Q6_K_SEG, MMQ_Q6_K_STRIDE, 256, 210, false},
    {TD_Q8_0, MMQ_Q8_0_KB_W, MMQ_Q8_0_KB_BYTES, MMQ_Q8_0_SEG, MMQ_Q8_0_STRIDE, 32, 34, false},
};

/* The piece offset rule under test (mmq_piece_rel, or a broken one to show the check bites). */
typedef int32_t (*piece_rel_fn)(uint32_t kb_lo, uint32_t row_bytes, int i, int p, bool aligned);

static int32_t rel_kernel(uint32_t kb_lo, uint32_t row_bytes, int i, int p, bool aligned)
{
    return mmq_piece_rel(kb_lo, row_bytes, i, p, aligned);
}

/* The earlier unsigned form: (off - a + 16p) in uint32, zero-extended onto the pointer. */
static int32_t rel_unsigned(uint32_t kb_lo, uint32_t row_bytes, int i, int p, bool aligned)
{
    const uint32_t off = (uint32_t)i * row_bytes;
    const uint32_t a = aligned ? 0 : (kb_lo + off) & 15u;
    return (int32_t)(off - a + 16u * (uint32_t)p); /* callers add it as uint32 */
}

static char g_why[256]; /* the first violation found */

static bool violation(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_why, sizeof g_why, fmt, ap);
    va_end(ap);
    return false;
}

/* [off, off + n) inside [0, size) */
static bool inside(int64_t off, int64_t n, int64_t size)
{
    return off >= 0 && n >= 0 && off + n <= size;
}

/* Shared memory of one CTA, as smem_bytes<T, MT, NT>(). */
static int64_t smem_bytes(const qgeom *q, int mt, int nt)
{
    const int stages = mt == 1 ? 4 : 3;
    const int64_t ring = (int64_t)MMQ_KSPLIT * stages * MMQ_MROWS * mt * q->stride;
    const int64_t red = (int64_t)MMQ_KSPLIT * MMQ_MROWS * mt * MMQ_NTOK * nt * 4;
    return ring > red ? ring : red;
}

/* Every weight copy of a launch with tile MT: the source pieces the kernel's issue() queues
 * (stage_issue / stage_issue_exact) lie in the matrix (rows * row_bytes bytes from a 16-byte
 * aligned base), full pieces are 16-byte aligned, and each row's block lies within its
 * staged window (and the window within the row pitch). */
static bool check_weights(const qgeom *q, int64_t rows, int64_t cols, int mt, piece_rel_fn rel,
                          bool rel_is_unsigned)
{
    const int ROWS = MMQ_MROWS * mt;
    const int64_t row_bytes = cols / q->blk_w * q->blk_bytes;
    const int64_t total = rows * row_bytes;
    const int nkb = (int)((cols + q->kb_w - 1) / q->kb_w);
    const int n_blk32 = (int)(cols / 32);
    if (q->seg > q->stride)
        return violation("%s: window %d past the row pitch %d", dtype_name(q->type), q->seg,
                    q->stride);
    if (16 > total) /* skipped rows name the matrix base */
        return violation("matrix of %lld bytes", (long long)total);
    for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
        const int n_rows = rows - r0 < ROWS ? (int)(rows - r0) : ROWS;
        for (int warp = 0; warp < MMQ_KSPLIT; warp++) {
            const int nk = mmq_warp_kblocks(nkb, warp);
            for (int s = 0; s < nk; s++) {
                const int kb = warp + MMQ_KSPLIT * s;
                if (kb >= nkb)
                    return violation("warp %d's k-block %d of %d", warp, kb, nkb);
                const int kbb = mmq_kb_bytes(q->type == TD_Q8_0, q->kb_bytes, n_blk32, kb);
                const int64_t kbase = r0 * row_bytes + (int64_t)kb * q->kb_bytes;
                const uint32_t kb_lo = (uint32_t)kbase; /* base is 16-byte aligned */
                const bool exact = mmq_stage_exact(q->aligned, r0, ROWS, rows, kb, nkb);
                for (int i = 0; i < n_rows; i++) {
                    const int a = mmq_row_misalign(kb_lo, (uint32_t)row_bytes, i, q->aligned);
                    if (a + kbb > q->seg)
                        return violation("row %lld k-block %d: block at %d + %d bytes past the "
                                    "window", (long long)(r0 + i), kb, a, kbb);
                }
                for (int lane = 0; lane < 32; lane++) {
                    const int p = lane & 15, i0 = lane >> 4;
                    if (p >= q->seg / 16)
                        continue;
                    for (int k = 0; k < ROWS / 2; k++) {
                        const int i = i0 + 2 * k;
                        int32_t r = rel(kb_lo, (uint32_t)row_bytes, i, p, exact ? false : q->aligned);
                        const int64_t src =
                            kbase + (rel_is_unsigned ? (int64_t)(uint32_t)r : (int64_t)r);
                        int64_t at = src, n = 16;
                        if (exact) {
                            n = i < n_rows ? mmq_piece_exact_bytes(kb_lo, (uint32_t)row_bytes,
                                                                   i, p, kbb)
                                           : 0;
                            if (n == 0)
                                at = 0; /* reads nothing, names the base */
                        } else if (i >= n_rows) {
                            at = 0; /* skipped: the base, nothing read */
                        }
                        if (!inside(at, n == 0 ? 16 : n, total))
                            return violation("%s %lld x %lld MT %d: CTA row %lld warp %d k-block %d "
                                        "lane %d row %d: bytes %lld..+%lld outside %lld",
                                        dtype_name(q->type), (long long)rows, (long long)cols,
                                        mt, (long long)r0, warp, kb, lane, i, (long long)at,
                                        (long long)n, (long long)total);
                        if (n == 16 && (at & 15) != 0)
                            return violation("misaligned 16-byte copy at %lld", (long long)at);
                    }
                }
            }
        }
    }
    return true;
}

/* The highest shared-memory byte (exclusive) one staged row's unpacking reads, from the row's
 * start, for block misalignment a (matmul_quant_blocks.cuh: aligned 4-byte words through
 * srow, which also reads the word after the last one it uses). */
static int staged_read_end(const qgeom *q, int a)
{
    switch (q->type) {
    case TD_Q4_K:
        return 144; /* header 16 + qs 128 */
    case TD_Q5_K:
        return 176; /* header 16, qh at 16 + 8t (t <= 3), qs at 48 */
    case TD_Q6_K: {
        int end = a + 210; /* d at 208 */
        const int sc = ((a + 192) & ~3) + 4 * 5;              /* scale words 0..3, +1 */
        const int ql = ((a + 4 * 3) & ~3) + 4 * (32 + 8 + 4 + 2); /* words up to 44, +1 */
        end = end > sc ? end : sc;
        return end > ql ? end : ql;
    }
    default: /* Q8_0: block b <= 3 at a + 34b, q words 0, 1 (+1) from 2 + 8t, t <= 3 */
        return ((a + 34 * 3 + 2 + 8 * 3) & ~3) + 4 * 3;
    }
}

/* Activation reads of a launch (n_tok tokens laid out as n_pad, NT n-tiles): every xq, xsum
 * and xd load of every lane lies in its region of the chunk's scratch layout and, for xq and
 * xsum, in its own token's part; y writes stay in [n_tok][rows]; shared memory in the CTA's. */
static bool check_activations(const qgeom *q, int64_t rows, int64_t cols, int n_tok, int n_pad,
                              int mt, int nt_count)
{
    const int64_t nb = (cols + MM_XBLOCK - 1) / MM_XBLOCK;
    const int64_t xq_size = (int64_t)n_pad * 2 * cols, xd_n = nb * n_pad;
    const int64_t xsum_size = nb * n_pad * MM_XSUM_BYTES;
    const int nkb = (int)((cols + q->kb_w - 1) / q->kb_w);
    const int n_blk32 = (int)(cols / 32);
    if (MMQ_NTOK * nt_count > n_pad)
        return violation("%d n-tiles for %d padded tokens", nt_count, n_pad);
    for (int kb = 0; kb < nkb; kb++) {
        const int64_t k0 = (int64_t)kb * q->kb_w, jb = k0 / MM_XBLOCK;
        const int n_blk = mmq_kb_bytes(q->type == TD_Q8_0, q->kb_bytes, n_blk32, kb) / 34;
        for (int lane = 0; lane < 32; lane++) {
            const int g = lane >> 2, t = lane & 3;
            for (int nt = 0; nt < nt_count; nt++) {
                const int tok = MMQ_NTOK * nt + g;
                /* load_dx: tokens 8nt + 2t, 2t + 1, always loaded */
                const int64_t d = jb * n_pad + 2 * t + MMQ_NTOK * nt;
                if (!inside(d, 2, xd_n) || (d & 1))
                    return violation("xd %lld of %lld", (long long)d, (long long)xd_n);
                if (tok >= n_tok) /* not valid: no load */
                    continue;
                const int64_t qrow = (int64_t)tok * 2 * cols; /* xview_at + nt * q_tile */
                int64_t ins[32], len = 0, n_in = 0;
                if (q->type == TD_Q4_K || q->type == TD_Q5_K) {
                    for (int j = 0; j < 8; j++)
                        ins[n_in++] = 32 * j + 8 * t;
                    len = 16;
                } else if (q->type == TD_Q6_K) {
                    for (int n = 0; n < 2; n++)
                        for (int qq = 0; qq < 4; qq++)
                            for (int gh = 0; gh < 2; gh++)
                                ins[n_in++] = 128 * n + 32 * qq + 16 * gh + 4 * t;
                    len = 8;
                } else {
                    for (int b = 0; b < n_blk; b++)
                        ins[n_in++] = 32 * b + 8 * t;
                    len = 16;
                }
                for (int k = 0; k < n_in; k++) {
                    const int64_t at = qrow + 2 * (k0 + ins[k]);
                    if (!inside(at, len, xq_size) || !inside(at - qrow, len, 2 * cols) ||
                        at % len)
                        return violation("%s cols %lld token %d k-block %d lane %d: xq bytes "
                                    "%lld..+%lld of token row %lld",
                                    dtype_name(q->type), (long long)cols, tok, kb, lane,
                                    (long long)at, (long long)len, (long long)qrow);
                }
                /* load_sums: K-quant mins (t < 2) at 16t, Q6_K's 16-sums at 32 + 16t */
                int off = -1;
                if (q->type == TD_Q6_K)
                    off = 32 + 16 * t;
                else if (q->type != TD_Q8_0 && t < 2)
                    off = 16 * t;
                if (off >= 0) {
                    const int64_t own = (jb * n_pad + tok) * MM_XSUM_BYTES;
                    if (!inside(own + off, 16, xsum_size) || off + 16 > MM_XSUM_BYTES)
                        return violation("xsum %lld + %d", (long long)own, off);
                }
            }
        }
    }
    /* y: idx < n_rows * n_tok over each CTA's rows */
    const int ROWS = MMQ_MROWS * mt;
    const int64_t last_r0 = (rows - 1) / ROWS * ROWS;
    const int n_last = (int)(rows - last_r0);
    const int64_t y_last = (int64_t)(n_tok - 1) * rows + last_r0 + (n_last - 1);
    if (!inside(y_last, 1, (int64_t)n_tok * rows))
        return violation("y %lld", (long long)y_last);
    /* shared memory: the ring, the reduction, the staged reads */
    const int stages = mt == 1 ? 4 : 3;
    const int64_t smem = smem_bytes(q, mt, nt_count);
    if ((int64_t)MMQ_KSPLIT * stages * ROWS * q->stride > smem ||
        (int64_t)MMQ_KSPLIT * ROWS * MMQ_NTOK * nt_count * 4 > smem || smem > 99 * 1024)
        return violation("shared memory %lld", (long long)smem);
    for (int a = 0; a < 16; a += q->aligned ? 16 : 2)
        if (staged_read_end(q, a) > q->stride)
            return violation("%s staged reads to %d of %d", dtype_name(q->type),
                        staged_read_end(q, a), q->stride);
    return true;
}

/* The (MT, NT) tiles launch_type picks for n_pad, both choices where n_sm decides. */
static int tiles_for(int n_pad, int mt[2], int nt[2])
{
    switch (n_pad) {
    case 8:
        mt[0] = 1, nt[0] = 1;
        return 1;
    case 16:
        mt[0] = 1, nt[0] = 2, mt[1] = 2, nt[1] = 2;
        return 2;
    case 32:
        mt[0] = 1, nt[0] = 4;
        return 1;
    default:
        mt[0] = 1, nt[0] = 8;
        return 1;
    }
}

static int pad_tokens(int n)
{
    return n <= 8 ? 8 : n <= 16 ? 16 : n <= 32 ? 32 : 64;
}

/* rows x cols, cols -> rows as a layer maps them */
typedef struct shape {
    int64_t rows, cols;
} shape;

static const shape kq_shapes[] = {
    /* tests/test_gpu_ops_matmul.c */
    {1, 256}, {37, 256}, {19, 768}, {67, 5376}, {300, 512}, {33000, 256},
    /* the 27B target: 5120->17408, 17408->5120, 5120->10240, 5120->12288, 6144->5120,
     * 5120->248320 (LM head), 5120->48 */
    {17408, 5120}, {5120, 17408}, {10240, 5120}, {12288, 5120}, {5120, 6144},
    {248320, 5120}, {48, 5120},
};

static const shape q8_shapes[] = {
    {1, 32}, {37, 32}, {19, 96}, {67, 5408}, {300, 160}, {33000, 64},
    /* the tiny qwen35 Q8_0 model: rows 6..512 of 32, 64 or 96 columns */
    {6, 32}, {16, 32}, {32, 32}, {96, 32}, {160, 32}, {128, 32}, {512, 32}, {32, 64},
    {32, 96}, {64, 32},
    {17408, 5120}, {5120, 17408}, {10240, 5120}, {12288, 5120}, {5120, 6144},
    {248320, 5120}, {48, 5120},
};

static void check_type(const qgeom *q)
{
    const bool q8 = q->type == TD_Q8_0;
    const shape *shapes = q8 ? q8_shapes : kq_shapes;
    const size_t n_shapes = q8 ? sizeof q8_shapes / sizeof *q8_shapes
                               : sizeof kq_shapes / sizeof *kq_shapes;
    for (size_t s = 0; s < n_shapes; s++) {
        const int64_t rows = shapes[s].rows, cols = shapes[s].cols;
        for (int mt = 1; mt <= 2; mt++)
            if (!check_weights(q, rows, cols, mt, rel_kernel, false))
                fail_msg("%s", g_why);
        /* n_tok 1..70: chunks of 64, then 1..6 (each chunk is its own launch) */
        for (int n = 1; n <= 70; n++)
            for (int t0 = 0; t0 < n; t0 += MM_CHUNK) {
                const int nc = n - t0 < MM_CHUNK ? n - t0 : MM_CHUNK;
                const int n_pad = pad_tokens(nc);
                int mt[2], nt[2];
                const int k = tiles_for(n_pad, mt, nt);
                for (int c = 0; c < k; c++)
                    if (!check_activations(q, rows, cols, nc, n_pad, mt[c], nt[c]))
                        fail_msg("%s (n_tok %d)", g_why, n);
            }
    }
}

static void test_q4_k_addresses_stay_inside_their_allocations(void **state)
{
    (void)state;
    check_type(&geoms[0]);
}

static void test_q5_k_addresses_stay_inside_their_allocations(void **state)
{
    (void)state;
    check_type(&geoms[1]);
}

static void test_q6_k_addresses_stay_inside_their_allocations(void **state)
{
    (void)state;
    check_type(&geoms[2]);
}

static void test_q8_0_addresses_stay_inside_their_allocations(void **state)
{
    (void)state;
    check_type(&geoms[3]);
}

/* The check sees the fault seen on an H200: with the earlier unsigned offset, warp 1's first
 * Q6_K piece (k-block 1 starts 210 bytes in, 2 past a 16-byte boundary) lands 2^32 - 2 bytes
 * past kbase; so does Q8_0's with 5 or more blocks per row (k-block 1 at 136 = 8 mod 16). */
static void test_unsigned_staging_offset_is_caught(void **state)
{
    (void)state;
    assert_false(check_weights(&geoms[2], 37, 768, 1, rel_unsigned, true));
    assert_non_null(strstr(g_why, "warp 1 k-block 1 lane 0 row 0: bytes 4294967504"));
    assert_false(check_weights(&geoms[3], 19, 160, 1, rel_unsigned, true));
    /* aligned types never subtract, so the same rule is harmless there */
    assert_true(check_weights(&geoms[0], 37, 768, 1, rel_unsigned, true));
}

/* ---- the bulk-copy single-token kernel (matmul_bulk.cu) ------------------------------- */

/* One bulk geometry, as bring<T, W> has it. */
typedef struct bgeom {
    td_dtype type;
    int kb, kc, slot, stages, xkb; /* k-block bytes, per stage, slot, ring depth, x bytes */
    int blk_w, blk_bytes;          /* the type's block */
    int warps;                     /* of the CTA */
    int64_t max_cols;              /* the widest row this CTA runs (0: any) */
} bgeom;

static const bgeom bgeoms[] = {
    {TD_Q4_K, MMB_Q4_K_KB, MMB_Q4_K_KC, MMB_Q4_K_SLOT, MMB_Q4_K_STAGES, MMB_XKB_K, 256, 144,
     MMB_WARPS, 0},
    {TD_Q4_K, MMB_Q4_K_KB, MMB_Q4_K_WIDE_KC, MMB_Q4_K_WIDE_SLOT, MMB_Q4_K_WIDE_STAGES,
     MMB_XKB_K, 256, 144, MMB_WIDE_WARPS, MMB_FUSE_COLS},
    {TD_Q5_K, MMB_Q5_K_KB, MMB_Q5_K_KC, MMB_Q5_K_SLOT, MMB_Q5_K_STAGES, MMB_XKB_K, 256, 176,
     MMB_WARPS, 0},
    {TD_Q6_K, MMB_Q6_K_KB, MMB_Q6_K_KC, MMB_Q6_K_SLOT, MMB_Q6_K_STAGES, MMB_XKB_K, 256, 210,
     MMB_WARPS, 0},
    {TD_Q6_K, MMB_Q6_K_KB, MMB_Q6_K_KC, MMB_Q6_K_SLOT, MMB_Q6_K_WIDE_STAGES, MMB_XKB_K, 256,
     210, MMB_Q6_K_WIDE_WARPS, MMB_FUSE_COLS},
    {TD_Q8_0, MMB_Q8_0_KB, MMB_Q8_0_KC, MMB_Q8_0_SLOT, MMB_Q8_0_STAGES, MMB_XKB_Q8, 32, 34,
     MMB_WARPS, 0},
};

/* The copy rule under test (mmb_copy_of, or a broken one to show the check bites). */
typedef mmb_copy (*copy_fn)(int64_t row_bytes, int64_t rows, int kb_bytes, int kc, int64_t row,
                            int k0);

static mmb_copy copy_kernel(int64_t row_bytes, int64_t rows, int kb_bytes, int kc, int64_t row,
                            int k0)
{
    return mmb_copy_of(row_bytes, rows, kb_bytes, kc, row, k0);
}

/* The window rounded up at both ends and copied whole: past the matrix for its last run when
 * the matrix does not end on 16 bytes. */
static mmb_copy copy_unclipped(int64_t row_bytes, int64_t rows, int kb_bytes, int kc,
                               int64_t row, int k0)
{
    mmb_copy c = mmb_copy_of(row_bytes, rows, kb_bytes, kc, row, k0);
    c.bulk = (uint32_t)(((c.src + c.mis + c.run + 15) & ~(int64_t)15) - c.src);
    c.tail = 0;
    return c;
}

/* The shared-memory bytes (from the slot's start, exclusive end) that lane chain q reads of
 * its e-th k-block kb of a stage whose run starts mis bytes into the slot: Q4_K/Q5_K the
 * block with 16-byte loads; Q6_K aligned words 0..53 from the word at or below the block
 * (srow: word 52 holds d and the funnel shift reads one more); Q8_0 per block d and words
 * 0..8 from the word at or below q. 0 when the k-block does not exist. */
static int64_t bulk_read_end(const bgeom *g, int mis, int at, int n_blk32, int kb)
{
    const int64_t blk = mis + at;
    switch (g->type) {
    case TD_Q4_K:
    case TD_Q5_K:
        return blk + g->kb;
    case TD_Q6_K:
        return (blk & ~(int64_t)3) + 4 * 54;
    default: {
        const int left = n_blk32 - 4 * kb, n_in = left < 4 ? left : 4;
        const int64_t p = blk + 34 * (n_in - 1);
        return ((p + 2) & ~(int64_t)3) + 4 * 9;
    }
    }
}

/* Every copy of every stage of every unit: 16-byte aligned source, size and (slot) target,
 * bulk bytes and tail inside the matrix, the run (the stage's k-blocks of the row) inside the
 * window the slot receives, each lane's shared reads inside the slot and its k-block inside
 * the run; Q4_K/Q5_K runs are their own windows, mmb_run_bytes long; every row but the last
 * has no tail and the window mmb_window_bytes gives (what the kernel copies for them). */
static bool check_bulk_copies(const bgeom *g, int64_t rows, int64_t cols, copy_fn copy)
{
    const int64_t row_bytes = cols / g->blk_w * g->blk_bytes;
    const int64_t total = rows * row_bytes;
    const int n_blk32 = (int)(cols / 32);
    const int nkb = g->type == TD_Q8_0 ? (n_blk32 + 3) / 4 : (int)(cols / 256);
    const bool aligned = g->type == TD_Q4_K || g->type == TD_Q5_K;
    if (g->slot % 16 || (g->kc % 4 && 4 % g->kc)) /* whole turns of the chains, or parts */
        return violation("%s: slot %d, %d k-blocks per stage", dtype_name(g->type), g->slot,
                         g->kc);
    for (int64_t row = 0; row < rows; row++)
        for (int k0 = 0; k0 < nkb; k0 += g->kc) {
            const mmb_copy c = copy(row_bytes, rows, g->kb, g->kc, row, k0);
            const int64_t start = row * row_bytes + (int64_t)k0 * g->kb;
            if (c.src % 16 || c.bulk % 16 || c.tail >= 16 || c.src + c.mis != start)
                return violation("%s row %lld k0 %d: window %lld+%u, tail %u, mis %u",
                                 dtype_name(g->type), (long long)row, k0, (long long)c.src,
                                 c.bulk, c.tail, c.mis);
            if (!inside(c.src, c.bulk + c.tail, total))
                return violation("%s %lld x %lld row %lld k0 %d: bytes %lld..+%u outside %lld",
                                 dtype_name(g->type), (long long)rows, (long long)cols,
                                 (long long)row, k0, (long long)c.src, c.bulk + c.tail,
                                 (long long)total);
            if (c.tail && (c.src + c.bulk) % 2)
                return violation("odd tail at %lld", (long long)(c.src + c.bulk));
            if (c.mis + c.run > c.bulk + c.tail || c.bulk + c.tail > (uint32_t)g->slot)
                return violation("%s row %lld k0 %d: run %u+%u, window %u+%u, slot %d",
                                 dtype_name(g->type), (long long)row, k0, c.mis, c.run, c.bulk,
                                 c.tail, g->slot);
            if (aligned && (c.mis || c.tail ||
                            c.bulk != mmb_run_bytes(row_bytes, g->kb, g->kc, k0)))
                return violation("%s: aligned run of %u bytes", dtype_name(g->type), c.bulk);
            /* the kernel copies rows before the matrix's last without the tail check */
            if (row < rows - 1 && (c.tail || c.bulk != mmb_window_bytes(start, c.run)))
                return violation("%s row %lld k0 %d: unchecked window of %u bytes, %u tail",
                                 dtype_name(g->type), (long long)row, k0,
                                 mmb_window_bytes(start, c.run), c.tail);
            for (int j = 0; j < g->kc; j++) { /* lane chain j % 4, its (j / 4)-th k-block */
                const int kb = k0 + j;
                if (kb >= nkb)
                    break;
                const int kbb = g->type == TD_Q8_0
                                    ? (n_blk32 - 4 * kb < 4 ? n_blk32 - 4 * kb : 4) * 34
                                    : g->kb;
                if ((int64_t)j * g->kb + kbb > (int64_t)c.run)
                    return violation("%s k-block %d past its run", dtype_name(g->type), kb);
                const int64_t end = bulk_read_end(g, (int)c.mis, j * g->kb, n_blk32, kb);
                if (end > g->slot)
                    return violation("%s row %lld k-block %d: shared reads to %lld of %d",
                                     dtype_name(g->type), (long long)row, kb, (long long)end,
                                     g->slot);
            }
        }
    return true;
}

/* The activations and the CTA's shared memory: the in-kernel rounding's (round_x) x reads
 * inside the token's row, every store (a lane's 16 digit bytes, the sum digits, dx) inside
 * its k-block's XKB bytes and the stored k-block inside the row; stage_x's scratch reads
 * inside the chunk layout; the units and the aux words the lanes read apart; the whole
 * layout within the 227 KiB an sm_90 block may opt into for the 27B shapes. */
static bool check_bulk_activations(const bgeom *g, int64_t cols)
{
    const bool q8 = g->type == TD_Q8_0;
    const int upk = q8 ? 16 : 32, aux = q8 ? 16 : g->type == TD_Q6_K ? 64 : 32;
    const int n_blk32 = (int)(cols / 32);
    const int nkb = q8 ? (n_blk32 + 3) / 4 : (int)(cols / 256);
    const int64_t nb = (cols + MM_XBLOCK - 1) / MM_XBLOCK;
    for (int u = 0; u < upk; u++) {
        const int at = mmb_xunit(q8, u);
        if (at % 16 || at + 16 > g->xkb || (at < MMB_XAUX_AT + aux && at + 16 > MMB_XAUX_AT))
            return violation("%s unit %d at %d", dtype_name(g->type), u, at);
    }
    if (MMB_XAUX_AT + aux > g->xkb)
        return violation("aux past the k-block");
    const int64_t smem = mmb_smem_bytes(nkb, g->xkb, g->slot, g->stages, g->warps);
    if (cols <= 17408 && (g->max_cols == 0 || cols <= g->max_cols) && smem > 227 * 1024)
        return violation("%s %lld cols, %d warps: %lld shared bytes", dtype_name(g->type),
                         (long long)cols, g->warps, (long long)smem);
    if (MMB_HDR < g->warps * g->stages * (8 + 4) + 4) /* barriers, stage owners, counter */
        return violation("%s, %d warps: header of %d bytes", dtype_name(g->type), g->warps,
                         MMB_HDR);
    for (int64_t jb = 0; jb < nb; jb++)
        for (int lane = 0; lane < 32; lane++) {
            const int64_t at = jb * MM_XBLOCK + 8 * lane;
            if (at < cols && !inside(at, 8, cols))
                return violation("x %lld..+8 of %lld", (long long)at, (long long)cols);
            /* the lane's digits: K-quants k-block jb, unit lane; Q8_0 k-block 2 jb + lane /
             * 16, unit lane % 16, only where its inputs exist */
            const int64_t kb = q8 ? 2 * jb + lane / 16 : jb;
            const int unit = q8 ? lane % 16 : lane;
            if (at < cols && (kb >= nkb || mmb_xunit(q8, unit) + 16 > g->xkb))
                return violation("%s digits of block %lld lane %d: k-block %lld of %d",
                                 dtype_name(g->type), (long long)jb, lane, (long long)kb, nkb);
            /* the sum digits (K-quants: bytes 16 (j/4) + 4i + j%4 of the aux words, j < 8 or
             * k < 16) and dx (aux + 12; Q8_0 aux + 0 of k-blocks 2 jb and 2 jb + 1) */
            int last = -1;
            if (g->type == TD_Q6_K && lane % 2 == 0)
                last = 16 * (lane / 2 / 4) + 4 * 2 + (lane / 2) % 4;
            else if (!q8 && g->type != TD_Q6_K && lane % 4 == 0)
                last = 16 * (lane / 4 / 4) + 4 * 2 + (lane / 4) % 4;
            if (last >= aux || (!q8 && 12 + 4 > aux))
                return violation("%s sum digit at aux + %d", dtype_name(g->type), last);
            if (q8 && lane == 16 && kb < nkb && MMB_XAUX_AT + 4 > g->xkb)
                return violation("dx");
        }
    /* stage_x (rows past MMB_FUSE_COLS): xq of token 0 (16 bytes per unit), the xd and
     * xsum of token 0 at n_pad 8, each k-block's in the chunk's scratch */
    const int n_pad = 8;
    if ((int64_t)(cols / 8) * 16 > 2 * cols)
        return violation("xq");
    for (int kb = 0; kb < nkb; kb++) {
        const int64_t jb = q8 ? kb / 2 : kb;
        if (!inside(jb * n_pad, 1, nb * n_pad))
            return violation("xd of k-block %d", kb);
        if (!q8 && !inside(jb * n_pad * MM_XSUM_BYTES + (g->type == TD_Q6_K ? 32 : 0),
                           g->type == TD_Q6_K ? 64 : 32, nb * n_pad * MM_XSUM_BYTES))
            return violation("xsum of k-block %d", kb);
    }
    return true;
}

static void check_bulk_type(const bgeom *g)
{
    const bool q8 = g->type == TD_Q8_0;
    const shape *shapes = q8 ? q8_shapes : kq_shapes;
    const size_t n_shapes = q8 ? sizeof q8_shapes / sizeof *q8_shapes
                               : sizeof kq_shapes / sizeof *kq_shapes;
    for (size_t s = 0; s < n_shapes; s++) {
        if (!check_bulk_copies(g, shapes[s].rows, shapes[s].cols, copy_kernel))
            fail_msg("%s", g_why);
        if (!check_bulk_activations(g, shapes[s].cols))
            fail_msg("%s", g_why);
    }
    /* the shapes of tests/test_gpu_ops_matmul.c's bulk test not listed above */
    static const shape extra[] = {{3, 256}, {7001, 1280}, {10240, 5120}, {5120, 6144}};
    static const shape extra_q8[] = {{3, 32}, {37, 96}, {7001, 1056}, {300, 5408}};
    for (size_t s = 0; s < 4; s++) {
        const shape *e = q8 ? &extra_q8[s] : &extra[s];
        if (!check_bulk_copies(g, e->rows, e->cols, copy_kernel) ||
            !check_bulk_activations(g, e->cols))
            fail_msg("%s", g_why);
    }
}

static void test_bulk_copies_and_reads_stay_inside_their_allocations(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof bgeoms / sizeof *bgeoms; k++)
        check_bulk_type(&bgeoms[k]);
}

/* The check sees a window copied whole past the matrix: a Q6_K matrix of 37 rows x 768
 * (630-byte rows, 23310 bytes = 14 mod 16) has its last run (row 36, bytes 22680..23309)
 * end 14 bytes past the last 16-byte boundary, so the rounded-up window 22672..23311 reads
 * 2 bytes past the matrix; Q8_0 37 x 96 (102-byte rows, 3774 = 14 mod 16) likewise. Q4_K
 * runs never round. */
static void test_bulk_unclipped_window_is_caught(void **state)
{
    (void)state;
    assert_false(check_bulk_copies(&bgeoms[3], 37, 768, copy_unclipped));
    assert_non_null(strstr(g_why, "row 36 k0 0: bytes 22672..+640 outside 23310"));
    assert_false(check_bulk_copies(&bgeoms[5], 37, 96, copy_unclipped));
    assert_true(check_bulk_copies(&bgeoms[0], 37, 768, copy_unclipped));
}

/* The window kernel (matmul_bulk_mma.cu) copies runs of MMQB_WIN k-blocks per row by the same
 * rule into rows MMQB_*_PITCH bytes apart; chain c reads k-block c of the run (as lane chain
 * j of check_bulk_copies). The wide kernel (the same file, 17-64 tokens) copies runs of
 * MMQW_KS k-blocks (1 or 2: both are checked) into rows MMQW_*_PITCH apart. Their
 * activations are whole 256-input blocks of the rounding scratch, not checked here. */
static const bgeom wgeoms[] = {
    {TD_Q4_K, MMB_Q4_K_KB, MMQB_WIN, MMQB_Q4_K_PITCH, 0, 0, 256, 144, 0, 0},
    {TD_Q5_K, MMB_Q5_K_KB, MMQB_WIN, MMQB_Q5_K_PITCH, 0, 0, 256, 176, 0, 0},
    {TD_Q6_K, MMB_Q6_K_KB, MMQB_WIN, MMQB_Q6_K_PITCH, 0, 0, 256, 210, 0, 0},
    {TD_Q4_K, MMB_Q4_K_KB, 1, MMQW_Q4_K_PITCH(1), 0, 0, 256, 144, 0, 0},
    {TD_Q5_K, MMB_Q5_K_KB, 1, MMQW_Q5_K_PITCH(1), 0, 0, 256, 176, 0, 0},
    {TD_Q6_K, MMB_Q6_K_KB, 1, MMQW_Q6_K_PITCH(1), 0, 0, 256, 210, 0, 0},
    {TD_Q4_K, MMB_Q4_K_KB, 2, MMQW_Q4_K_PITCH(2), 0, 0, 256, 144, 0, 0},
    {TD_Q5_K, MMB_Q5_K_KB, 2, MMQW_Q5_K_PITCH(2), 0, 0, 256, 176, 0, 0},
    {TD_Q6_K, MMB_Q6_K_KB, 2, MMQW_Q6_K_PITCH(2), 0, 0, 256, 210, 0, 0},
};

static void test_window_copies_and_reads_stay_inside_their_allocations(void **state)
{
    (void)state;
    static const shape extra[] = {{3, 256}, {7001, 1280}, {10240, 5120}, {5120, 6144},
                                  {37, 768}, {33000, 5120}, {248320, 5120}, {9, 768}};
    assert_int_equal(MMQW_KS, wgeoms[6].kc); /* the step size built is among them */
    for (size_t k = 0; k < sizeof wgeoms / sizeof *wgeoms; k++) {
        for (size_t s = 0; s < sizeof kq_shapes / sizeof *kq_shapes; s++)
            if (!check_bulk_copies(&wgeoms[k], kq_shapes[s].rows, kq_shapes[s].cols,
                                   copy_kernel))
                fail_msg("%s", g_why);
        for (size_t s = 0; s < sizeof extra / sizeof *extra; s++)
            if (!check_bulk_copies(&wgeoms[k], extra[s].rows, extra[s].cols, copy_kernel))
                fail_msg("%s", g_why);
        /* the check bites here too: Q6_K 37 x 768 copied whole past the matrix */
        if (wgeoms[k].type == TD_Q6_K)
            assert_false(check_bulk_copies(&wgeoms[k], 37, 768, copy_unclipped));
    }
}

/* The window and wide kernels' tile copies put at every byte the kernel reads the byte the
 * row copies put there. Q4_K and Q5_K: a 2-D tensor box of 16 rows x `slot` bytes (8-byte
 * elements from byte k0 * kb of each row, rows `slot` bytes apart in the stage, zeros past a
 * row's end), where each row's copy is its run, unshifted (mis = 0, no tail), from row *
 * row_bytes + k0 * kb. Q6_K with row_bytes a multiple of 8 and an even number of rows: the
 * matrix as a tensor of rows of 2 * row_bytes bytes (a 16-byte multiple), rows 2j and 2j + 1
 * in tensor row j; a box of 8 tensor rows from mmb_pair_x(.., 0) lands a tile's even rows in
 * the stage's rows 0-7, one from mmb_pair_x(.., 1) its odd rows in rows 8-15, each starting
 * where the row copy's window starts, so the kernel finds the run mis bytes in as before.
 * Either way the run fits the box row and lies inside the tensor row (no zeros in it); and
 * what the tensor copy needs: 16-byte strides, box rows of at most 256 elements and 16-byte
 * multiples, 8 of them 128-byte aligned in the stage. (That the stage's Q6_K rows are the
 * fragment rows kblock_q6k<PAIRS> reads for them, fragment g + 8h for row 2g + h, is left to
 * the GPU tests: a row read from the wrong stage row changes its result.) */
static void test_tile_copies_place_the_row_copies_bytes(void **state)
{
    (void)state;
    static const shape extra[] = {{3, 256},   {7001, 1280}, {5120, 6144}, {9, 768},
                                  {38, 1024}, {2, 2048},    {7002, 3072}};
    int checked[2] = {0, 0}; /* Q4_K/Q5_K, Q6_K */
    for (size_t k = 0; k < sizeof wgeoms / sizeof *wgeoms; k++) {
        const bgeom *g = &wgeoms[k];
        const bool q6 = g->type == TD_Q6_K;
        assert_int_equal(g->slot % 16, 0);
        assert_true(g->slot / 8 <= 256);
        assert_int_equal(8 * g->slot % 128, 0);
        const size_t n_kq = sizeof kq_shapes / sizeof *kq_shapes;
        for (size_t n = 0; n < n_kq + sizeof extra / sizeof *extra; n++) {
            const shape *sh = n < n_kq ? &kq_shapes[n] : &extra[n - n_kq];
            const int64_t row_bytes = sh->cols / g->blk_w * g->blk_bytes;
            if (q6 && (row_bytes % 8 != 0 || sh->rows % 2 != 0))
                continue; /* Q6_K rows copied one by one */
            const int per = q6 ? 2 : 1; /* rows per tensor row */
            assert_int_equal(per * row_bytes % 16, 0);
            const int nkb = (int)(sh->cols / 256);
            const int64_t some[] = {0, 1, 2, 7, 14, 15, 16, 17, sh->rows / 2, sh->rows - 2,
                                    sh->rows - 1};
            for (int k0 = 0; k0 < nkb; k0 += g->kc)
                for (size_t i = 0; i < sizeof some / sizeof *some; i++) {
                    const int64_t r = some[i] < 0 ? 0 : some[i] < sh->rows ? some[i]
                                                                            : sh->rows - 1;
                    const mmb_copy c = mmb_copy_of(row_bytes, sh->rows, g->kb, g->kc, r, k0);
                    /* the box row's first byte in its tensor row */
                    const int64_t x = q6 ? mmb_pair_x(row_bytes, g->kb, k0, (int)(r & 1))
                                         : (int64_t)k0 * g->kb;
                    const int64_t start = r / per * per * row_bytes + x;
                    if (start % 16 != 0 || start != c.src || c.mis + c.run > (uint32_t)g->slot ||
                        x + c.mis + c.run > per * row_bytes ||
                        (!q6 && (c.mis != 0 || c.tail != 0 || c.bulk != c.run)))
                        fail_msg("%s kc %d, %lld x %lld, row %lld, k-block %d: the box row "
                                 "(from byte %lld) is not the row copy's window (src %lld, "
                                 "mis %u, run %u, %u bytes + %u)", dtype_name(g->type), g->kc,
                                 (long long)sh->rows, (long long)sh->cols, (long long)r, k0,
                                 (long long)start, (long long)c.src, c.mis, c.run, c.bulk,
                                 c.tail);
                    checked[q6]++;
                }
        }
    }
    assert_true(checked[0] > 1000 && checked[1] > 1000);
}

/* The window and wide kernels' tiles per round: the 27B shapes' counts as measured, and for
 * any count every CTA's share fits its rounds (the kernels loop over ceil(share / tt) rounds
 * and take tile t_begin + round * tt + tau, which must stay below t_end or be skipped). */
static void test_tiles_per_round(void **state)
{
    (void)state;
    int64_t grid = 0;
    assert_int_equal(mmqb_tiles_per_round(1088, 132, 4, &grid), 3); /* ffn_gate */
    assert_int_equal(grid, 132);
    assert_int_equal(mmqb_tiles_per_round(320, 132, 4, &grid), 3); /* 5120 rows: one round */
    assert_int_equal(mmqb_tiles_per_round(1088, 132, 3, &grid), 3);
    assert_int_equal(mmqb_tiles_per_round(5, 132, 4, &grid), 1);
    assert_int_equal(grid, 5);
    assert_int_equal(mmqb_tiles_per_round(15520, 132, 2, &grid), 2); /* LM head: 59 rounds */
    for (int64_t n_tiles = 1; n_tiles <= 3000; n_tiles += n_tiles < 300 ? 1 : 37)
        for (int ttmax = 1; ttmax <= 4; ttmax++) {
            const int64_t n_sms[] = {132, 114, 82, 7};
            for (size_t k = 0; k < sizeof n_sms / sizeof *n_sms; k++) {
                const int tt = mmqb_tiles_per_round(n_tiles, n_sms[k], ttmax, &grid);
                assert_true(tt >= 1 && tt <= ttmax && grid >= 1 && grid <= n_sms[k]);
                const int64_t q = (n_tiles + grid - 1) / grid;
                for (int64_t b = 0; b < grid; b++) {
                    const int64_t share = n_tiles * (b + 1) / grid - n_tiles * b / grid;
                    assert_true(share >= 1 && share <= q);
                }
                /* no more rounds than needed at ttmax */
                assert_int_equal((q + tt - 1) / tt, (q + ttmax - 1) / ttmax);
            }
        }
}

/* The window and wide kernels place each issued item by counting (mmqb_cursor_next) where
 * they divided before: item n must be step n % nsteps of round n / nsteps, for step counts of
 * one k-block row (1) to the LM head's and past them. */
static void test_ring_cursor_counts_as_the_division(void **state)
{
    (void)state;
    const int nsteps_list[] = {1, 2, 3, 5, 10, 20, 34, 68, 157};
    for (size_t k = 0; k < sizeof nsteps_list / sizeof *nsteps_list; k++) {
        const int nsteps = nsteps_list[k];
        mmqb_cursor c = {0, 0, 0, -1, 0};
        for (int n = 0; n < 5000; n++) {
            if (c.n != n || c.round != n / nsteps || c.s != n % nsteps)
                fail_msg("%d steps: item %d at (%d, round %d, step %d)", nsteps, n, c.n,
                         c.round, c.s);
            mmqb_cursor_next(&c, nsteps);
        }
        assert_int_equal(c.m_round, -1); /* the member lookup is the kernel's, not counting's */
    }
}

/* Sets of the 27B model's groups and odd ones, in the units of the four kernels that take
 * sets (8 rows, 16-row tiles, 4 rows, 64-row tiles), shared among CTAs as the kernels share
 * them. */
static void test_set_units_cover_every_row_once(void **state)
{
    (void)state;
    static const struct {
        int n;
        int64_t rows[MM_SET_MAX];
    } sets[] = {{2, {17408, 17408}}, {2, {10240, 6144}}, {3, {12288, 1024, 1024}},
                {2, {48, 48}},       {4, {40, 9, 1, 300}}, {1, {1}},
                {4, {7, 8, 9, 16}},  {4, {248320, 5, 17, 33}}};
    static const int64_t unit_rows[] = {MMB_UROWS, 16, 4, 64};
    static const int64_t n_sms[] = {132, 114, 7, 1};
    for (size_t k = 0; k < sizeof sets / sizeof *sets; k++)
        for (size_t ur = 0; ur < sizeof unit_rows / sizeof *unit_rows; ur++) {
            mm_set s;
            memset(&s, 0, sizeof s);
            s.n = sets[k].n;
            int64_t want = 0, total_rows = 0;
            for (int m = 0; m < s.n; m++) {
                s.rows[m] = sets[k].rows[m];
                want += (s.rows[m] + unit_rows[ur] - 1) / unit_rows[ur];
                total_rows += s.rows[m];
            }
            mm_set_number(&s, unit_rows[ur]);
            const int64_t units = s.first[s.n];
            assert_int_equal(units, want);
            for (int i = s.n; i <= MM_SET_MAX; i++)
                assert_int_equal(s.first[i], units);
            /* each unit: one member, rows of it that no other unit has */
            uint8_t *seen = calloc((size_t)total_rows, 1);
            assert_non_null(seen);
            int64_t base[MM_SET_MAX] = {0};
            for (int m = 1; m < s.n; m++)
                base[m] = base[m - 1] + s.rows[m - 1];
            for (int64_t u = 0; u < units; u++) {
                const int m = mm_set_member(&s, u);
                assert_true(m >= 0 && m < s.n);
                assert_true(s.first[m] <= u && u < s.first[m + 1]);
                const int64_t r0 = (u - s.first[m]) * unit_rows[ur];
                const int64_t r1 = r0 + unit_rows[ur] < s.rows[m] ? r0 + unit_rows[ur] : s.rows[m];
                assert_true(r0 < r1);
                for (int64_t r = r0; r < r1; r++)
                    seen[base[m] + r]++;
            }
            for (int64_t r = 0; r < total_rows; r++)
                if (seen[r] != 1)
                    fail_msg("set %zu, units of %lld rows: row %lld of the set in %d units", k,
                             (long long)unit_rows[ur], (long long)r, seen[r]);
            free(seen);
            /* CTA b of grid owns [units * b / grid, units * (b + 1) / grid): all, once */
            for (size_t g = 0; g < sizeof n_sms / sizeof *n_sms; g++) {
                const int64_t grid = units < n_sms[g] ? units : n_sms[g];
                int64_t next = 0;
                for (int64_t b = 0; b < grid; b++) {
                    const int64_t u0 = units * b / grid, u1 = units * (b + 1) / grid;
                    assert_int_equal(u0, next);
                    assert_true(u1 > u0);
                    next = u1;
                }
                assert_int_equal(next, units);
            }
        }
}

/* Little-endian 32-bit word at p (any alignment). */
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The kernel's word at offset o of a block at bp: read directly when bp is word aligned, else
 * joined from the aligned words at bp - 2 + o and bp + 2 + o (funnel shift by 16), which must
 * lie in [bp - 2, bp + 210): the block and the 2 bytes before it, which belong to the matrix
 * (its start is 16-byte aligned, so a block 2 bytes past a word boundary is never first). */
static uint32_t q6x_word(const uint8_t *bp, int o, bool mis)
{
    if (!mis)
        return rd32(bp + o);
    assert_true(o - 2 >= -2 && o + 2 + 4 <= Q6X_BLOCK_BYTES);
    return rd32(bp - 2 + o) >> 16 | rd32(bp + 2 + o) << 16;
}

static void test_q6x_lanes_rebuild_every_weight(void **state)
{
    (void)state;
    enum { NB = 8 };
    float src[NB * 256], deq[NB * 256];
    uint32_t x = 12345u;
    for (int i = 0; i < NB * 256; i++) {
        x = x * 1103515245u + 12345u;
        src[i] = (float)((int)(x >> 8 & 0xffff) - 32768) / 4096.0f;
    }
    /* the blocks 2 bytes past a word boundary, as every odd k-block of a row is */
    uint8_t buf[NB * Q6X_BLOCK_BYTES + 4];
    uint8_t *q = buf + 2;
    assert_int_equal(cpu_quantize_row(TD_Q6_K, src, q, NB * 256), TD_OK);
    assert_int_equal(cpu_dequantize_row(TD_Q6_K, q, deq, NB * 256), TD_OK);
    for (int b = 0; b < NB; b++) {
        const uint8_t *bp = q + b * Q6X_BLOCK_BYTES;
        const bool mis = ((uintptr_t)bp & 3) != 0;
        int seen[256] = {0};
        const uint16_t dh = (uint16_t)(bp[Q6X_D] | bp[Q6X_D + 1] << 8);
        const float d = ops_f16_to_f32(dh);
        for (int t = 0; t < 4; t++)
            for (int h = 0; h < 2; h++)
                for (int p = 0; p < 2; p++) {
                    const uint32_t ql0 = q6x_word(bp, q6x_ql0(h, p, t), mis);
                    const uint32_t ql1 = q6x_word(bp, q6x_ql1(h, p, t), mis);
                    const uint32_t qh = q6x_word(bp, q6x_qh(h, p, t), mis);
                    for (int c = 0; c < 4; c++) {
                        const uint32_t v = q6x_class_bytes(ql0, ql1, qh, c);
                        const int j = q6x_scale(h, p, c);
                        const uint32_t scw = q6x_word(bp, Q6X_SCALES + 4 * (j >> 2), mis);
                        const float s = d * (float)(int8_t)(scw >> (8 * (j & 3)));
                        for (int i = 0; i < 4; i++) {
                            const int in = q6x_input(h, p, c, t, i);
                            assert_true(in >= 0 && in < 256);
                            seen[in]++;
                            const int qv = (int)(v >> (8 * i) & 0xff);
                            assert_true(qv < 64);
                            const float got = s * (float)(qv - 32);
                            if (got != deq[b * 256 + in])
                                fail_msg("block %d input %d (h %d p %d c %d t %d i %d): %g, "
                                         "cpu_dequantize_row %g",
                                         b, in, h, p, c, t, i, (double)got,
                                         (double)deq[b * 256 + in]);
                        }
                    }
                }
        for (int i = 0; i < 256; i++)
            assert_int_equal(seen[i], 1);
    }
    /* and the same words straight from word-aligned blocks */
    uint8_t *qa = buf + 4 - ((uintptr_t)(buf + 4) & 3);
    memmove(qa, q, (size_t)NB * Q6X_BLOCK_BYTES);
    for (int o = 0; o + 4 <= Q6X_D; o += 4)
        assert_int_equal(q6x_word(qa, o, false), rd32(qa + o));
    assert_int_equal(q6x_smem_bytes(5120, 16), (size_t)16 * (5120 + Q6X_PAD) * 2);
    /* the kernel's bf16 of a 6-bit value: 0x43 above the byte is 128 + q, exactly */
    for (int v = 0; v < 64; v++)
        assert_true(ops_bf16_to_f32((uint16_t)(0x4300 | v)) == (float)(128 + v));
}

/* The warpgroup layout (mm_wg_pos): every digit of a 256-input block of n_pad tokens lands
 * in the block's 512 * n_pad bytes exactly once, and where the warpgroup MMA's descriptor
 * reads it (core matrices of 8 columns x 16 bytes, the k halves 128 bytes apart, groups of
 * 8 columns 256 apart, a 32-input slice 64 * n_pad bytes) for the k slot that the weight
 * fragments give that input: slot 4t + e of the first half is input 8t + e of the slice,
 * of the second half input 8t + 4 + e. */
static void test_warpgroup_layout_is_what_the_descriptor_reads(void **state)
{
    (void)state;
    static const int pads[] = {8, 16, 32, 64};
    for (size_t k = 0; k < sizeof pads / sizeof *pads; k++) {
        const int np = pads[k], bytes = 512 * np;
        uint8_t *seen = calloc((size_t)bytes, 1);
        assert_non_null(seen);
        for (int in = 0; in < 256; in++)
            for (int dig = 0; dig < 2; dig++)
                for (int tok = 0; tok < np; tok++) {
                    const int u = in / 8, h = in % 8 / 4, e = in % 4;
                    const int at = mm_wg_pos(u, h, dig, tok, np) + e;
                    assert_true(at >= 0 && at < bytes);
                    seen[at]++;
                    const int w = in % 32; /* the weight's place in its sub-block */
                    const int slot = (w % 8 < 4 ? 0 : 12) + 4 * (w / 8) + w % 8;
                    const int n = dig * np + tok;
                    const int read = in / 32 * 64 * np + n / 8 * 256 + slot / 16 * 128 +
                                     n % 8 * 16 + slot % 16;
                    if (at != read)
                        fail_msg("n_pad %d input %d digit %d token %d: at %d, read at %d", np,
                                 in, dig, tok, at, read);
                }
        for (int i = 0; i < bytes; i++)
            if (seen[i] != 1)
                fail_msg("n_pad %d: byte %d of the block written %d times", np, i, seen[i]);
        free(seen);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_cursor_counts_as_the_division),
        cmocka_unit_test(test_q6x_lanes_rebuild_every_weight),
        cmocka_unit_test(test_q4_k_addresses_stay_inside_their_allocations),
        cmocka_unit_test(test_q5_k_addresses_stay_inside_their_allocations),
        cmocka_unit_test(test_q6_k_addresses_stay_inside_their_allocations),
        cmocka_unit_test(test_q8_0_addresses_stay_inside_their_allocations),
        cmocka_unit_test(test_unsigned_staging_offset_is_caught),
        cmocka_unit_test(test_bulk_copies_and_reads_stay_inside_their_allocations),
        cmocka_unit_test(test_bulk_unclipped_window_is_caught),
        cmocka_unit_test(test_window_copies_and_reads_stay_inside_their_allocations),
        cmocka_unit_test(test_tile_copies_place_the_row_copies_bytes),
        cmocka_unit_test(test_set_units_cover_every_row_once),
        cmocka_unit_test(test_warpgroup_layout_is_what_the_descriptor_reads),
        cmocka_unit_test(test_tiles_per_round),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
