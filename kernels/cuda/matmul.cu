/* cuda_matmul, cuda_matmul_multi and cuda_swiglu_matmul: pick the kernel for each weight
 * type and feed it chunks of up to 64 tokens.
 *
 * Quantised weights (matmul_quant.cu, matmul_decode.cu) take 16-bit integer activations:
 * this file rounds each token's inputs per 256 values (mm_xquant) into a per-stream scratch
 * buffer, then launches the matmul kernel; matrices of a group that read the same x share
 * one rounding per layout, and those of one type whose kernel takes sets (mm_set: the sm_90
 * bulk-copy and window kernels, F32) share one launch. The sm_90 single-token kernel
 * (matmul_bulk.cu) rounds rows of up to 6144 inputs itself with the same code
 * (matmul_round.cuh), one launch instead of two. The rounding kernel can apply the FFN gate
 * first (cuda_swiglu_matmul). F32 weights (matmul_float.cu) and F16/BF16 weights
 * (matmul_float_mma.cu) take x as it is. A quantised weight with x_bf16 reads x rounded to
 * bf16 by one more launch into a second per-stream scratch (F16/BF16 weights round it in
 * their activation split; F32 weights read the same rounded copy), except Q6_K at 1-16
 * tokens, whose kernel of its own rounds x as it stages it (matmul_q6x.cu). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul_internal.h"
#include "kernels/cuda/matmul_round.cuh"
#include "kernels/cuda/ops_dev.cuh"
#include "kernels/cuda/stream_buf.cuh"

namespace {

/* --- activation rounding ------------------------------------------------------------------ */

/* Where the rounding kernel puts the digits: the plain layout, the single-token kernel's
 * (mm_decode_unit_pos) or the warpgroup kernel's (mm_wg_pos). */
enum { PLACE_PLAIN, PLACE_DECODE, PLACE_WG };

/* One warp per (token, 256-input block), lane l holding inputs 8l..8l+7, rounded by
 * mm_round_block (matmul_round.cuh): the hi/lo digits interleaved per UNIT (8 or 4 inputs)
 * and placed by PLACE,
 * the sums of q per 32 and per 16 inputs as digits (layout in mm_xquant) and d. Tokens
 * n_tok..n_pad-1 are written as zeros. Nothing here looks at another token, so a token's
 * rounding never depends on the batch. GLU (cuda_swiglu_matmul): x is the gate, the inputs
 * are dev_swiglu(x, up), stored back into x (xw, the same memory) as cuda_swiglu would. */
template <int UNIT, int PLACE, bool GLU>
__global__ void xquant_kernel(int8_t *xq, float *xd, int8_t *xsum, const float *x,
                              const float *up, float *xw, int64_t cols, int n_tok, int n_pad)
{
    mm_launch_dependents(); /* the matmul may start streaming its weights */
    /* Launched as a programmatic dependent of the kernel before it (often the previous
     * matmul, which lets it launch early): wait for it before reading x, and before writing
     * the scratch that a previous matmul on this stream may still be reading. */
    mm_wait_dependencies();
    const int lane = threadIdx.x & 31;
    const int64_t nb = (cols + MM_XBLOCK - 1) / MM_XBLOCK;
    const int64_t total = (int64_t)n_pad * nb;
    const int64_t step = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t i = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5); i < total;
         i += step) {
        const int tok = (int)(i / nb);
        const int64_t jb = i % nb;
        const int64_t at = jb * MM_XBLOCK + 8 * lane; /* first input of this lane */
        const bool mine = tok < n_tok && at < cols;   /* cols is a multiple of 32 */
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[e] = mine ? x[(size_t)tok * cols + at + e] : 0.0f;
        if (GLU && mine) {
#pragma unroll
            for (int e = 0; e < 8; e++) {
                v[e] = dev_swiglu(v[e], up[(size_t)tok * cols + at + e]);
                xw[(size_t)tok * cols + at + e] = v[e];
            }
        }
        const mm_round r = mm_round_block<UNIT>(v);
        if (at < cols) { /* the lane's 8 inputs are 16 bytes in both interleaves */
            if (PLACE == PLACE_DECODE) /* mm_decode_unit_pos */
                *(uint4 *)(xq + ((size_t)tok * cols + jb * MM_XBLOCK) * 2 +
                           16 * mm_decode_unit_pos(lane, UNIT)) = r.q;
            else if (PLACE == PLACE_WG) { /* mm_wg_pos (UNIT 8: hi[8] then lo[8]) */
                int8_t *blk = xq + (size_t)jb * MM_XBLOCK * 2 * n_pad;
                const uint32_t v[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
#pragma unroll
                for (int k = 0; k < 4; k++)
                    *(uint32_t *)(blk + mm_wg_pos(lane, k & 1, k >> 1, tok, n_pad)) = v[k];
            } else
                *(uint4 *)(xq + ((size_t)tok * cols + at) * 2) = r.q;
        }
        int8_t *out = xsum + ((size_t)jb * n_pad + tok) * MM_XSUM_BYTES;
        int8_t dg[3];
        if ((lane & 3) == 0) {
            const int j = lane / 4; /* sums of 32: digit i of j at 16*(j/4) + 4i + j%4 */
            digits3(r.s32, dg);
#pragma unroll
            for (int k = 0; k < 3; k++)
                out[16 * (j / 4) + 4 * k + j % 4] = dg[k];
        }
        if ((lane & 1) == 0) {
            const int k16 = lane / 2; /* sums of 16: at 32 + 16*(k/4) + 4i + k%4 */
            digits3(r.s16, dg);
#pragma unroll
            for (int k = 0; k < 3; k++)
                out[32 + 16 * (k16 / 4) + 4 * k + k16 % 4] = dg[k];
        }
        if (lane == 0)
            xd[jb * n_pad + tok] = r.d;
    }
}

/* Launches the rounding kernel; with pdl (sm_90, and the kernel before it on st is a
 * quantised matmul, which lets its dependents launch at once) as a programmatic dependent:
 * the rounding and then the next matmul's CTAs are ready when the last CTAs of that matmul
 * finish, and the next matmul's first weight copies overlap its tail. Both wait
 * (griddepcontrol.wait) before touching anything the earlier kernel uses. */
template <int UNIT, int PLACE, bool GLU>
td_err xquant_launch(unsigned grid, bool pdl, int8_t *xq, float *xd, int8_t *xsum,
                     const float *x, const float *up, int64_t cols, int n_tok, int n_pad,
                     cudaStream_t st)
{
    /* with GLU, x is cuda_swiglu_matmul's gate, writable memory the kernel stores into */
    const cudaError_t e =
        launch_ex(xquant_kernel<UNIT, PLACE, GLU>, grid, 256, 0, pdl, st, xq, xd, xsum, x, up,
                  GLU ? (float *)x : NULL, cols, n_tok, n_pad);
    cuda_launch_note(1);
    if (e != cudaSuccess)
        return err_set(TD_ECUDA, "cuda_matmul: activation rounding launch: %s",
                       cudaGetErrorString(e));
    return TD_OK;
}

/* Tokens of a chunk as laid out for the MMA: a multiple of 8, and one of the four widths the
 * quantised kernel is built for. */
int pad_tokens(int n)
{
    return n <= 8 ? 8 : n <= 16 ? 16 : n <= 32 ? 32 : 64;
}

/* --- scratch ------------------------------------------------------------------------------ */

/* The rounded activations, one buffer per (device, stream) (stream_buf.cuh). A slot's mark
 * is mm_mark: cuda_launches right after this stream's last quantised matmul kernel launch;
 * still equal at the next rounding means no counted kernel was launched in between (on any
 * stream), so the kernel before that rounding is this matmul kernel, which lets its
 * dependents launch early. */
stream_bufs g_scratch = STREAM_BUFS_INIT("cuda_matmul: activation scratch");

size_t align16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* The chunk layout of mm_xquant in one buffer: xq (2 bytes per input), then xd, then xsum,
 * each 16-byte aligned. */
struct xq_layout {
    size_t xd, xsum, bytes; /* offsets and total size */
};

xq_layout xq_layout_of(int64_t cols, int n_pad)
{
    const size_t nb = (size_t)((cols + MM_XBLOCK - 1) / MM_XBLOCK);
    xq_layout o;
    o.xd = align16((size_t)n_pad * 2 * (size_t)cols);
    o.xsum = o.xd + align16(nb * n_pad * sizeof(float));
    o.bytes = o.xsum + nb * n_pad * MM_XSUM_BYTES;
    return o;
}

/* Which kernel runs single tokens (TANDEM_MMD, read once): by default the faster one as
 * measured on an H200, i.e. the sm_90 bulk-copy kernel (matmul_bulk.cu) wherever
 * mmb_supported (40-93% of the copy rate against 27-68% for the others, NOTES.md round 3),
 * else (sm_86, or a row too long for its shared memory) the rule of mmd_preferred; "regs"
 * always the single-token kernel (matmul_decode.cu), "mma" always the tensor-core kernel
 * (plain layout), "bulk" the bulk-copy kernel wherever mmb_supported (the default there).
 * All give the same bits; the switch keeps them measurable, and testable, on one build. */
enum { MMD_AUTO = 1, MMD_REGS, MMD_MMA, MMD_BULK };
int g_mmd_choice;

int mmd_choice(void)
{
    int c = __atomic_load_n(&g_mmd_choice, __ATOMIC_RELAXED);
    if (c == 0) {
        const char *e = getenv("TANDEM_MMD");
        c = e && strcmp(e, "regs") == 0   ? MMD_REGS
            : e && strcmp(e, "mma") == 0  ? MMD_MMA
            : e && strcmp(e, "bulk") == 0 ? MMD_BULK
                                          : MMD_AUTO;
        __atomic_store_n(&g_mmd_choice, c, __ATOMIC_RELAXED);
    }
    return c;
}

/* Which kernel chunks of 2-64 tokens take where mmqb_supported (sm_90, Q4_K, Q5_K, Q6_K):
 * by default the window kernel (matmul_bulk_mma.cu) at 2-16 tokens (one n-tile up to 8), the
 * wide kernel (the same file) at 17-64, except that 9-16 tokens of Q4_K rows of at least
 * WGQ_LONG_COLS inputs take the warpgroup kernel (sm90a/matmul_wgmma.cu) where wgq_supported:
 * it is faster there and slower on the shorter rows (measured on an H100, NOTES.md).
 * TANDEM_MMQ=window never takes the warpgroup kernel, =wg takes it for all Q4_K and Q5_K at
 * 2-16 tokens, =bulk9 the tensor-core kernel (matmul_quant.cu) at 2-8 tokens (the rule
 * before), =mmq the tensor-core kernel for all. Read once; the same bits either way. */
enum { MMQB_AUTO = 1, MMQB_WINDOW, MMQB_FROM9, MMQB_WG, MMQB_NEVER };
int g_mmq_bulk; /* 0: not read yet */
enum { WGQ_LONG_COLS = 16384 };

static int mmqb_choice(void)
{
    int c = __atomic_load_n(&g_mmq_bulk, __ATOMIC_RELAXED);
    if (c == 0) {
        const char *e = getenv("TANDEM_MMQ");
        c = !e ? MMQB_AUTO
            : strcmp(e, "mmq") == 0    ? MMQB_NEVER
            : strcmp(e, "bulk9") == 0  ? MMQB_FROM9
            : strcmp(e, "wg") == 0     ? MMQB_WG
            : strcmp(e, "window") == 0 ? MMQB_WINDOW
                                       : MMQB_AUTO;
        __atomic_store_n(&g_mmq_bulk, c, __ATOMIC_RELAXED);
    }
    return c;
}

/* Whether a chunk of nc tokens on w runs on the window or wide kernel. */
static bool mmqb_chosen(const ops_weight *w, int nc)
{
    const int c = mmqb_choice();
    return nc >= (c == MMQB_FROM9 ? 9 : 2) && c != MMQB_NEVER &&
           mmqb_supported(w, pad_tokens(nc));
}

/* Whether a chunk of nc tokens on w runs on the warpgroup kernel. */
static bool wgq_chosen(const ops_weight *w, int nc)
{
    const int c = mmqb_choice(), n_pad = pad_tokens(nc);
    const bool auto_ok = c == MMQB_AUTO && n_pad == 16 && w->type == TD_Q4_K &&
                         w->cols >= WGQ_LONG_COLS;
    return nc >= 2 && (c == MMQB_WG || auto_ok) && wgq_supported(w, n_pad);
}

/* What one chunk of a quantised matmul runs: the kernel, and the layout of the rounded
 * activations that kernel reads. */
struct mm_plan {
    bool decode;   /* the single-token kernel (matmul_decode.cu), else the tensor cores */
    bool bulk;     /* the bulk-copy single-token kernel (matmul_bulk.cu; plain layout) */
    bool fused;    /* ... which rounds x itself (mmb_fused): no rounding launch */
    bool mmq_bulk; /* 2-64 tokens: the window or wide kernel (matmul_bulk_mma.cu) */
    bool wg;       /* the warpgroup kernel (sm90a/matmul_wgmma.cu; mm_wg_pos layout) */
    int unit;      /* hi/lo digit interleave of the rounded inputs (mmq_unit): 8, Q6_K 4 */
    bool placed;   /* inputs placed for the single-token kernel (mm_decode_unit_pos) */
};

/* The kernel for w on a chunk of nc tokens. */
mm_plan plan_of(const ops_weight *w, int nc, const mm_device *dev)
{
    const int choice = mmd_choice();
    const bool bulk = nc == 1 && (choice == MMD_BULK || choice == MMD_AUTO) && mmb_supported(w);
    const bool decode = !bulk && nc == 1 && mmd_supported(w->type) && choice != MMD_MMA &&
                        (choice == MMD_REGS || mmd_preferred(w, dev));
    const bool wg = wgq_chosen(w, nc);
    const bool mmq_bulk = !wg && mmqb_chosen(w, nc);
    return mm_plan{decode, bulk, bulk && mmb_fused(w), mmq_bulk, wg, mmq_unit(w->type),
                   decode && mmd_placed(w->type)};
}

/* Whether two plans read the same rounded activations, so that one rounding serves both. */
bool plan_shares_rounding(const mm_plan &a, const mm_plan &b)
{
    return a.unit == b.unit && a.placed == b.placed && a.wg == b.wg && !a.fused && !b.fused;
}

/* Whether members of weights wa and wb (of one group, so of one width) with plans a and b
 * run in one launch: both on the bulk-copy kernel (rounding x themselves or not) or both on
 * the window kernel, with one type. */
bool plan_joins(const mm_plan &a, const ops_weight *wa, const mm_plan &b, const ops_weight *wb)
{
    return (a.bulk || a.mmq_bulk || a.wg) && a.bulk == b.bulk && a.mmq_bulk == b.mmq_bulk &&
           a.wg == b.wg && a.fused == b.fused && wa->type == wb->type;
}

/* The rounding launch for the layout p's kernel reads, with or without the gate. */
template <bool GLU>
td_err round_glu(const mm_plan &p, unsigned grid, bool pdl, int8_t *xq, float *xd,
                 int8_t *xsum, const float *xc, const float *up, int64_t cols, int nc,
                 int n_pad, cudaStream_t st)
{
    if (p.unit == 4 && p.placed)
        return xquant_launch<4, PLACE_DECODE, GLU>(grid, pdl, xq, xd, xsum, xc, up, cols, nc,
                                                   n_pad, st);
    if (p.unit == 4)
        return xquant_launch<4, PLACE_PLAIN, GLU>(grid, pdl, xq, xd, xsum, xc, up, cols, nc,
                                                  n_pad, st);
    if (p.placed)
        return xquant_launch<8, PLACE_DECODE, GLU>(grid, pdl, xq, xd, xsum, xc, up, cols, nc,
                                                   n_pad, st);
    if (p.wg)
        return xquant_launch<8, PLACE_WG, GLU>(grid, pdl, xq, xd, xsum, xc, up, cols, nc, n_pad,
                                               st);
    return xquant_launch<8, PLACE_PLAIN, GLU>(grid, pdl, xq, xd, xsum, xc, up, cols, nc, n_pad,
                                              st);
}

/* Rounds the chunk xc[q.n_tok][cols] (with upc: dev_swiglu(xc, upc), stored into xc) into
 * q's buffers in the layout p's kernel reads. */
td_err round_launch(const mm_plan &p, int8_t *xq, float *xd, int8_t *xsum, const float *xc,
                    const float *upc, int64_t cols, int nc, int n_pad, bool pdl,
                    cudaStream_t st)
{
    const int64_t warps = (int64_t)n_pad * ((cols + MM_XBLOCK - 1) / MM_XBLOCK);
    const int64_t blocks = (warps + 7) / 8;
    const unsigned grid = (unsigned)(blocks < 4096 ? blocks : 4096);
    return upc ? round_glu<true>(p, grid, pdl, xq, xd, xsum, xc, upc, cols, nc, n_pad, st)
               : round_glu<false>(p, grid, pdl, xq, xd, xsum, xc, NULL, cols, nc, n_pad, st);
}

/* The kernel p picked for the n members set[] of one type, over one chunk (rounded in q, or
 * xc for a kernel that rounds it itself); counted as one launch. Only the bulk-copy and
 * window kernels take several members. */
td_err kernel_launch(const ops_mm_out *set, int n, const float *xc, const mm_xquant *q,
                     const mm_plan &p, const mm_device *dev, cudaStream_t st)
{
    TD_ASSERT(n == 1 || p.bulk || p.mmq_bulk || p.wg);
    TD_TRY(p.bulk       ? mmb_launch(set, n, p.fused ? xc : NULL, p.fused ? NULL : q, dev, st)
           : p.decode   ? mmd_launch(set[0].y, q, set[0].w, dev, st)
           : p.wg       ? wgq_launch(set, n, q, dev, st)
           : p.mmq_bulk ? mmqb_launch(set, n, q, dev, st)
                        : mmq_launch(set[0].y, q, set[0].w, dev, st));
    cuda_launch_note(1);
    return TD_OK;
}

/* Member i of a chunk starting at token t0 and every later member not done yet that joins
 * it (plan_joins), at most MM_SET_MAX, in one launch; marks them done. */
td_err launch_joined(const ops_mm_out *mm, const int *qi, int nq, int i, const mm_plan *plan,
                     bool *done, int64_t t0, const float *xc, const mm_xquant *q,
                     const mm_device *dev, cudaStream_t st)
{
    ops_mm_out set[MM_SET_MAX];
    int n = 0;
    for (int j = i; j < nq && n < MM_SET_MAX; j++) {
        const ops_weight *w = mm[qi[j]].w;
        if (done[j] || (j > i && !plan_joins(plan[i], mm[qi[i]].w, plan[j], w)))
            continue;
        set[n++] = ops_mm_out{mm[qi[j]].y + (size_t)t0 * w->rows, w};
        done[j] = true;
    }
    return kernel_launch(set, n, xc, q, plan[i], dev, st);
}

/* The quantised members qi[nq] of a group over x[n_tok][cols]: per chunk, one rounding per
 * layout the members' kernels read, each followed by the kernels of every member that reads
 * it, and the bulk-copy kernels that round x themselves (mmb_fused, after waiting for the
 * kernel before them) without one (in group order otherwise; no result depends on the
 * order). With up (cuda_swiglu_matmul, one member): x is the gate, every chunk goes through
 * the rounding kernel, which applies the gate and stores it back into x.
 *
 * Why one scratch buffer is enough although the next rounding on this stream may be launched
 * early (a programmatic dependent) and overwrites what several kernels read: completion is
 * transitive along the stream. Every matmul kernel waits for the kernel launched before it
 * to complete (mm_wait_dependencies, in at least one thread of the grid, before it reads the
 * scratch), so it cannot complete before that one has; a kernel launched without the
 * attribute starts only after the one before it has completed. The rounding waits likewise
 * before writing, so when it writes, the kernel just before it has completed, hence every
 * earlier kernel on the stream, including all that read the previous rounding. A kernel
 * added to the dispatch must keep this (any kernel reading the scratch already has to wait
 * before it reads). Between two kernels of a group the wait costs nothing it did not cost
 * before: each was launched early and streams its first weights during its predecessor's
 * tail. */
td_err matmul_quant_group(const float *x, const float *up, const ops_mm_out *mm, const int *qi,
                          int nq, int64_t n_tok, cudaStream_t st)
{
    TD_ASSERT(!up || nq == 1); /* a second rounding would read the gated x */
    int ordinal = 0;
    mm_device dev = {0, false};
    CUDA_TRY(cudaGetDevice(&ordinal));
    TD_TRY(sm_count(ordinal, &dev.n_sm));
    dev.pdl = code_arch(ordinal) >= 900;
    const int64_t cols = mm[qi[0]].w->cols;
    const int pad_max = pad_tokens((int)(n_tok < MM_CHUNK ? n_tok : MM_CHUNK));
    void *buf = NULL;
    stream_buf *slot = NULL;
    TD_TRY(stream_buf_get(&g_scratch, st, xq_layout_of(cols, pad_max).bytes, true, &buf, &slot));
    for (int64_t t0 = 0; t0 < n_tok; t0 += MM_CHUNK) {
        const int nc = (int)(n_tok - t0 < MM_CHUNK ? n_tok - t0 : MM_CHUNK);
        const int n_pad = pad_tokens(nc);
        const xq_layout o = xq_layout_of(cols, n_pad);
        int8_t *xq = (int8_t *)buf;
        float *xd = (float *)((uint8_t *)buf + o.xd);
        int8_t *xsum = (int8_t *)buf + o.xsum;
        const mm_xquant q = {xq, xd, xsum, nc, n_pad};
        mm_plan plan[OPS_MM_GROUP_MAX];
        bool done[OPS_MM_GROUP_MAX] = {};
        for (int i = 0; i < nq; i++) {
            plan[i] = plan_of(mm[qi[i]].w, nc, &dev);
            plan[i].fused = plan[i].fused && !up; /* the gate goes through the rounding */
        }
        const float *xc = x + (size_t)t0 * cols, *upc = up ? up + (size_t)t0 * cols : NULL;
        for (int i = 0; i < nq; i++) {
            if (done[i])
                continue;
            if (plan[i].fused) { /* rounds x itself: reads neither the scratch nor a rounding */
                TD_TRY(launch_joined(mm, qi, nq, i, plan, done, t0, xc, &q, &dev, st));
                slot->mark = __atomic_load_n(&cuda_launches, __ATOMIC_RELAXED);
                continue;
            }
            /* a programmatic dependent of the kernel before it, whichever it is: every
             * kernel launched so waits for its predecessor (launch.cuh), so completion stays
             * transitive; TANDEM_ROUND_PDL=off only right after this stream's previous
             * quantised matmul kernel (mm_mark) */
            const bool pdl_x =
                dev.pdl && (pdl_round_after_any() ||
                            __atomic_load_n(&cuda_launches, __ATOMIC_RELAXED) == slot->mark);
            TD_TRY(round_launch(plan[i], xq, xd, xsum, xc, upc, cols, nc, n_pad, pdl_x, st));
            for (int j = i; j < nq; j++)
                if (!done[j] && plan_shares_rounding(plan[i], plan[j]))
                    TD_TRY(launch_joined(mm, qi, nq, j, plan, done, t0, xc, &q, &dev, st));
            slot->mark = __atomic_load_n(&cuda_launches, __ATOMIC_RELAXED);
        }
    }
    return TD_OK;
}

bool is_float_type(td_dtype t)
{
    return t == TD_F32 || t == TD_F16 || t == TD_BF16;
}

/* out = x rounded to bf16 (nearest even, as ops_f32_to_bf16), kept as f32. */
__global__ void __launch_bounds__(256) bf16_round_kernel(bool early, float *out, const float *x,
                                                         int64_t n)
{
    pdl_enter(early);
    const int64_t step = (int64_t)gridDim.x * 256;
    for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < n; i += step)
        out[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
}

/* The bf16-rounded activations of x_bf16 weights other than F16/BF16, one buffer per
 * stream. */
stream_bufs g_xr = STREAM_BUFS_INIT("matmul: bf16-rounded activations");

/* *xr = x[n_tok][cols] rounded to bf16, in g_xr: one launch. */
td_err round_bf16(const float **xr, const float *x, int64_t n_tok, int64_t cols,
                  cudaStream_t st)
{
    const int64_t n = n_tok * cols;
    float *buf = NULL;
    TD_TRY(stream_buf_get(&g_xr, st, (size_t)n * sizeof(float), true, (void **)&buf, NULL));
    const long long blocks = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
    TD_TRY(pdl_launch<bf16_round_kernel>("bf16 rounding", dim3((unsigned)blocks), dim3(256), 0,
                                         st, buf, x, n));
    *xr = buf;
    return TD_OK;
}

/* The float members fi[nf] of a group meet x as it is, 64 tokens per launch: the F16/BF16
 * ones share one activation split and launch a kernel each, F32 up to MM_SET_MAX per
 * launch. */
td_err matmul_float(const ops_mm_out *mm, const int *fi, int nf, const float *x,
                    int64_t n_tok, cudaStream_t st)
{
    const int64_t cols = mm[fi[0]].w->cols;
    for (int64_t t0 = 0; t0 < n_tok; t0 += MM_CHUNK) {
        const int nc = (int)(n_tok - t0 < MM_CHUNK ? n_tok - t0 : MM_CHUNK);
        const float *xc = x + (size_t)t0 * cols;
        ops_mm_out f32[MM_SET_MAX], h16[OPS_MM_GROUP_MAX];
        int n32 = 0, nh = 0;
        for (int i = 0; i < nf; i++) {
            const ops_weight *w = mm[fi[i]].w;
            const ops_mm_out out = {mm[fi[i]].y + (size_t)t0 * w->rows, w};
            if (w->type != TD_F32) {
                h16[nh++] = out;
                continue;
            }
            f32[n32++] = out;
            if (n32 == MM_SET_MAX) {
                TD_TRY(mmf_launch(f32, n32, xc, nc, st));
                n32 = 0;
            }
        }
        if (n32)
            TD_TRY(mmf_launch(f32, n32, xc, nc, st));
        if (nh)
            TD_TRY(mmh_launch(h16, nh, xc, nc, st));
    }
    return TD_OK;
}

/* Whether bytes at a and b overlap. */
bool spans_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes)
{
    const uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return pa < pb + b_bytes && pb < pa + a_bytes;
}

/* What cuda_matmul refuses of a weight: a type it does not take (TD_ENOTSUP), quantised data
 * off 16-byte alignment (TD_EINVAL). */
td_err weight_check(const ops_weight *w)
{
    if (!ops_type_supported(w->type))
        return err_set(TD_ENOTSUP, "cuda_matmul: type %s (%d) is not supported",
                       dtype_name(w->type), (int)w->type);
    TD_ASSERT(w->cols % dtype_get(w->type)->block == 0); /* ops_weight_init checked */
    if (!is_float_type(w->type) && ((uintptr_t)w->data & 15) != 0)
        return err_set(TD_EINVAL, "cuda_matmul: %s weight data at %p is not 16-byte aligned",
                       dtype_name(w->type), w->data);
    return TD_OK;
}

} /* namespace */

mm_set mm_set_of(const ops_mm_out *mm, int n, int64_t unit_rows)
{
    TD_ASSERT(n >= 1 && n <= MM_SET_MAX && unit_rows >= 1);
    mm_set s = {};
    s.n = n;
    for (int i = 0; i < n; i++) {
        s.y[i] = mm[i].y;
        s.w[i] = (const uint8_t *)mm[i].w->data;
        s.rows[i] = mm[i].w->rows;
    }
    mm_set_number(&s, unit_rows);
    return s;
}

td_err cuda_matmul_multi(const float *x, const ops_mm_out *mm, int n, int64_t n_tok,
                         ops_stream st)
{
    TD_ASSERT(x != NULL && mm != NULL && n >= 1 && n <= OPS_MM_GROUP_MAX && n_tok >= 1);
    const int64_t cols = mm[0].w ? mm[0].w->cols : 0;
    /* quantised members reading x (qi) or x rounded to bf16 (qb), float members reading x
     * (fi: F16/BF16 round in their split when x_bf16) or F32 ones reading it rounded (fb) */
    int qi[OPS_MM_GROUP_MAX], nq = 0, qb[OPS_MM_GROUP_MAX], nqb = 0;
    int fi[OPS_MM_GROUP_MAX], nf = 0, fb[OPS_MM_GROUP_MAX], nfb = 0;
    bool q6x[OPS_MM_GROUP_MAX] = {}; /* on the Q6_K x bf16 kernel */
    for (int i = 0; i < n; i++) {
        const ops_weight *w = mm[i].w;
        TD_ASSERT(mm[i].y != NULL && w != NULL && w->data != NULL);
        TD_ASSERT(w->rows >= 1 && w->cols >= 1 && w->cols == cols);
        TD_TRY(weight_check(w));
        q6x[i] = q6x_takes(w, n_tok);
        if (q6x[i])
            continue;
        if (!is_float_type(w->type))
            *(w->x_bf16 ? &qb[nqb++] : &qi[nq++]) = i;
        else
            *(w->x_bf16 && w->type == TD_F32 ? &fb[nfb++] : &fi[nf++]) = i;
    }
    /* a y inside x, or two ys sharing memory, would make the group differ from separate
     * calls (x is rounded once, before any y is written) */
    for (int i = 0; i < n && n > 1; i++) {
        const size_t yb = (size_t)n_tok * (size_t)mm[i].w->rows * sizeof(float);
        TD_ASSERT(!spans_overlap(mm[i].y, yb, x, (size_t)n_tok * (size_t)cols * sizeof(float)));
        for (int j = i + 1; j < n; j++)
            TD_ASSERT(!spans_overlap(mm[i].y, yb, mm[j].y,
                                     (size_t)n_tok * (size_t)mm[j].w->rows * sizeof(float)));
    }
    cudaStream_t cs = (cudaStream_t)st;
    if (nq)
        TD_TRY(matmul_quant_group(x, NULL, mm, qi, nq, n_tok, cs));
    for (int i = 0; i < n; i++)
        if (q6x[i])
            TD_TRY(q6x_launch(mm[i].y, x, mm[i].w, (int)n_tok, cs));
    if (nqb || nfb) {
        const float *xr = NULL;
        TD_TRY(round_bf16(&xr, x, n_tok, cols, cs));
        if (nqb)
            TD_TRY(matmul_quant_group(xr, NULL, mm, qb, nqb, n_tok, cs));
        if (nfb)
            TD_TRY(matmul_float(mm, fb, nfb, xr, n_tok, cs));
    }
    if (nf)
        TD_TRY(matmul_float(mm, fi, nf, x, n_tok, cs));
    return TD_OK;
}

td_err cuda_matmul(float *y, const float *x, const ops_weight *w, int64_t n_tok,
                   ops_stream st)
{
    TD_ASSERT(y != NULL && w != NULL);
    const ops_mm_out one = {y, w};
    return cuda_matmul_multi(x, &one, 1, n_tok, st);
}

td_err cuda_swiglu_matmul(float *y, float *gate, const float *up, const ops_weight *w,
                          int64_t n_tok, ops_stream st)
{
    TD_ASSERT(y != NULL && gate != NULL && up != NULL && w != NULL && n_tok >= 1);
    const size_t yb = (size_t)n_tok * (size_t)w->rows * sizeof(float);
    const size_t xb = (size_t)n_tok * (size_t)w->cols * sizeof(float);
    TD_ASSERT(!spans_overlap(y, yb, gate, xb) && !spans_overlap(y, yb, up, xb));
    TD_TRY(weight_check(w)); /* cuda_matmul's errors, before the gate is touched */
    if (is_float_type(w->type) || w->x_bf16) { /* no rounding to apply the gate in: the pair */
        TD_TRY(cuda_swiglu(gate, gate, up, n_tok * w->cols, st));
        return cuda_matmul(y, gate, w, n_tok, st);
    }
    TD_ASSERT(w->data != NULL && w->rows >= 1);
    const ops_mm_out one = {y, w};
    const int qi = 0;
    return matmul_quant_group(gate, up, &one, &qi, 1, n_tok, (cudaStream_t)st);
}
