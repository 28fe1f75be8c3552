/* cuda_matmul and cuda_matmul_multi: pick the kernel for each weight type and feed it chunks
 * of up to 64 tokens.
 *
 * Quantised weights (matmul_quant.cu, matmul_decode.cu) take 16-bit integer activations:
 * this file rounds each token's inputs per 256 values (mm_xquant) into a per-stream scratch
 * buffer, then launches the matmul kernel; matrices of a group that read the same x share
 * one rounding per layout. The sm_90 single-token kernel (matmul_bulk.cu) rounds rows of up
 * to 6144 inputs itself with the same code (matmul_round.cuh), one launch instead of two. F32 weights
 * (matmul_float.cu) and F16/BF16 weights (matmul_float_mma.cu) take x as it is. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/matmul_internal.h"
#include "kernels/cuda/matmul_round.cuh"

namespace {

/* --- activation rounding ------------------------------------------------------------------ */

/* One warp per (token, 256-input block), lane l holding inputs 8l..8l+7, rounded by
 * mm_round_block (matmul_round.cuh): the hi/lo digits interleaved per UNIT (8 or 4 inputs),
 * the sums of q per 32 and per 16 inputs as digits (layout in mm_xquant) and d. Tokens
 * n_tok..n_pad-1 are written as zeros. Nothing here looks at another token, so a token's
 * rounding never depends on the batch. */
template <int UNIT, bool DECODE>
__global__ void xquant_kernel(int8_t *xq, float *xd, int8_t *xsum, const float *x,
                              int64_t cols, int n_tok, int n_pad)
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
        const mm_round r = mm_round_block<UNIT>(v);
        if (at < cols) { /* the lane's 8 inputs are 16 bytes in both interleaves */
            if (DECODE) /* the single-token kernel's placement (mm_decode_unit_pos) */
                *(uint4 *)(xq + ((size_t)tok * cols + jb * MM_XBLOCK) * 2 +
                           16 * mm_decode_unit_pos(lane, UNIT)) = r.q;
            else
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

/* Set when a launch with programmatic dependent launch was refused. */
int g_pdl_refused;

/* Launches the rounding kernel; with pdl (sm_90, and the kernel before it on st is a
 * quantised matmul, which lets its dependents launch at once) as a programmatic dependent:
 * the rounding and then the next matmul's CTAs are ready when the last CTAs of that matmul
 * finish, and the next matmul's first weight copies overlap its tail. Both wait
 * (griddepcontrol.wait) before touching anything the earlier kernel uses. */
template <int UNIT, bool DECODE>
td_err xquant_launch(unsigned grid, bool pdl, int8_t *xq, float *xd, int8_t *xsum,
                     const float *x, int64_t cols, int n_tok, int n_pad, cudaStream_t st)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(256);
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl && !__atomic_load_n(&g_pdl_refused, __ATOMIC_RELAXED) ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, xquant_kernel<UNIT, DECODE>, xq, xd, xsum, x, cols,
                                       n_tok, n_pad);
    if (e != cudaSuccess && cfg.numAttrs) {
        (void)cudaGetLastError(); /* plain launches from now on */
        __atomic_store_n(&g_pdl_refused, 1, __ATOMIC_RELAXED);
        cfg.numAttrs = 0;
        e = cudaLaunchKernelEx(&cfg, xquant_kernel<UNIT, DECODE>, xq, xd, xsum, x, cols, n_tok,
                               n_pad);
    }
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

/* One buffer per (device, stream), grown on demand and kept for the process: work on one
 * stream is ordered, so a rounding never overwrites it while a matmul still reads it (the
 * argument for programmatic launches is at matmul_quant_group), and streams running side by
 * side never share one. Growing frees the old buffer (cudaFree waits for the device),
 * so warm up before capturing a CUDA graph. */
#define MM_SCRATCH_SLOTS 64

typedef struct mm_scratch {
    int dev;          /* device ordinal */
    cudaStream_t st;  /* stream the buffer serves */
    void *buf;        /* device memory */
    size_t cap;       /* bytes */
    bool used;
    /* cuda_launches right after this stream's last quantised matmul kernel launch: still
     * equal at the next rounding means no counted kernel was launched in between (on any
     * stream), so the kernel before that rounding is this matmul kernel, which lets its
     * dependents launch early */
    unsigned long long mm_mark;
} mm_scratch;

mm_scratch g_scratch[MM_SCRATCH_SLOTS];
pthread_mutex_t g_scratch_lock = PTHREAD_MUTEX_INITIALIZER;

td_err scratch_get(cudaStream_t st, size_t need, void **out, mm_scratch **slot)
{
    int dev = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    pthread_mutex_lock(&g_scratch_lock);
    mm_scratch *s = NULL;
    for (int i = 0; i < MM_SCRATCH_SLOTS && !s; i++)
        if (g_scratch[i].used && g_scratch[i].dev == dev && g_scratch[i].st == st)
            s = &g_scratch[i];
    for (int i = 0; i < MM_SCRATCH_SLOTS && !s; i++)
        if (!g_scratch[i].used) {
            s = &g_scratch[i];
            *s = mm_scratch{dev, st, NULL, 0, true, ~0ull};
        }
    if (!s) {
        pthread_mutex_unlock(&g_scratch_lock);
        return err_set(TD_ENOMEM, "cuda_matmul: scratch for more than %d streams",
                       MM_SCRATCH_SLOTS);
    }
    if (s->cap < need) {
        const size_t cap = (need + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
        if (s->buf)
            cudaFree(s->buf); /* an error here would be a fault of earlier work; the
                               * allocation below reports what matters */
        s->buf = NULL;
        s->cap = 0;
        cudaError_t e = cudaMalloc(&s->buf, cap);
        if (e != cudaSuccess) {
            s->buf = NULL;
            pthread_mutex_unlock(&g_scratch_lock);
            return err_set(TD_ENOMEM, "cuda_matmul: %zu bytes of activation scratch: %s", cap,
                           cudaGetErrorString(e));
        }
        s->cap = cap;
    }
    *out = s->buf;
    *slot = s;
    pthread_mutex_unlock(&g_scratch_lock);
    return TD_OK;
}

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

/* Which kernel chunks of 9-16 tokens take where mmqb_supported (sm_90): the window kernel
 * (matmul_bulk_mma.cu) for Q4_K and Q6_K, the tensor-core kernel (matmul_quant.cu) for the
 * rest (measured, see matmul_bulk_mma.cu); TANDEM_MMQ=bulk takes the window kernel wherever
 * it exists, =mmq never. Read once; the same bits either way. */
enum { MMQB_AUTO = 1, MMQB_ALWAYS, MMQB_NEVER };
int g_mmq_bulk; /* 0: not read yet */

static int mmqb_choice(void)
{
    int c = __atomic_load_n(&g_mmq_bulk, __ATOMIC_RELAXED);
    if (c == 0) {
        const char *e = getenv("TANDEM_MMQ");
        c = e && strcmp(e, "bulk") == 0  ? MMQB_ALWAYS
            : e && strcmp(e, "mmq") == 0 ? MMQB_NEVER
                                         : MMQB_AUTO;
        __atomic_store_n(&g_mmq_bulk, c, __ATOMIC_RELAXED);
    }
    return c;
}

/* Whether a chunk of nc tokens on w runs on the window kernel. */
static bool mmqb_chosen(const ops_weight *w, int nc)
{
    if (nc < 2 || !mmqb_supported(w, pad_tokens(nc)))
        return false;
    const int c = mmqb_choice();
    return c == MMQB_ALWAYS || (c == MMQB_AUTO && (w->type == TD_Q4_K || w->type == TD_Q6_K));
}

/* What one chunk of a quantised matmul runs: the kernel, and the layout of the rounded
 * activations that kernel reads. */
struct mm_plan {
    bool decode;   /* the single-token kernel (matmul_decode.cu), else the tensor cores */
    bool bulk;     /* the bulk-copy single-token kernel (matmul_bulk.cu; plain layout) */
    bool fused;    /* ... which rounds x itself (mmb_fused): no rounding launch */
    bool mmq_bulk; /* 9-16 tokens: the window kernel (matmul_bulk_mma.cu) */
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
    const bool mmq_bulk = mmqb_chosen(w, nc);
    return mm_plan{decode, bulk, bulk && mmb_fused(w), mmq_bulk, mmq_unit(w->type),
                   decode && mmd_placed(w->type)};
}

/* Whether two plans read the same rounded activations, so that one rounding serves both. */
bool plan_shares_rounding(const mm_plan &a, const mm_plan &b)
{
    return a.unit == b.unit && a.placed == b.placed && !a.fused && !b.fused;
}

/* Rounds the chunk xc[q.n_tok][cols] into q's buffers in the layout p's kernel reads. */
td_err round_launch(const mm_plan &p, int8_t *xq, float *xd, int8_t *xsum, const float *xc,
                    int64_t cols, int nc, int n_pad, bool pdl, cudaStream_t st)
{
    const int64_t warps = (int64_t)n_pad * ((cols + MM_XBLOCK - 1) / MM_XBLOCK);
    const int64_t blocks = (warps + 7) / 8;
    const unsigned grid = (unsigned)(blocks < 4096 ? blocks : 4096);
    if (p.unit == 4 && p.placed)
        return xquant_launch<4, true>(grid, pdl, xq, xd, xsum, xc, cols, nc, n_pad, st);
    if (p.unit == 4)
        return xquant_launch<4, false>(grid, pdl, xq, xd, xsum, xc, cols, nc, n_pad, st);
    if (p.placed)
        return xquant_launch<8, true>(grid, pdl, xq, xd, xsum, xc, cols, nc, n_pad, st);
    return xquant_launch<8, false>(grid, pdl, xq, xd, xsum, xc, cols, nc, n_pad, st);
}

/* The matmul kernel p picked, over one rounded chunk; counted as one launch. */
td_err kernel_launch(float *yc, const mm_xquant *q, const ops_weight *w, const mm_plan &p,
                     const mm_device *dev, cudaStream_t st)
{
    TD_TRY(p.bulk       ? mmb_launch(yc, NULL, q, w, dev, st)
           : p.decode   ? mmd_launch(yc, q, w, dev, st)
           : p.mmq_bulk ? mmqb_launch(yc, q, w, dev, st)
                        : mmq_launch(yc, q, w, dev, st));
    cuda_launch_note(1);
    return TD_OK;
}

/* The quantised members qi[nq] of a group over x[n_tok][cols]: per chunk, one rounding per
 * layout the members' kernels read, each followed by the kernels of every member that reads
 * it, and the bulk-copy kernels that round x themselves (mmb_fused, after waiting for the
 * kernel before them) without one (in group order otherwise; no result depends on the
 * order).
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
td_err matmul_quant_group(const float *x, const ops_mm_out *mm, const int *qi, int nq,
                          int64_t n_tok, cudaStream_t st)
{
    int ordinal = 0, major = 0;
    mm_device dev = {0, false};
    CUDA_TRY(cudaGetDevice(&ordinal));
    CUDA_TRY(cudaDeviceGetAttribute(&dev.n_sm, cudaDevAttrMultiProcessorCount, ordinal));
    CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal));
    dev.pdl = major >= 9;
    const int64_t cols = mm[qi[0]].w->cols;
    const int pad_max = pad_tokens((int)(n_tok < MM_CHUNK ? n_tok : MM_CHUNK));
    void *buf = NULL;
    mm_scratch *slot = NULL;
    TD_TRY(scratch_get(st, xq_layout_of(cols, pad_max).bytes, &buf, &slot));
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
        for (int i = 0; i < nq; i++)
            plan[i] = plan_of(mm[qi[i]].w, nc, &dev);
        for (int i = 0; i < nq; i++) {
            if (done[i])
                continue;
            if (plan[i].fused) { /* rounds x itself: reads neither the scratch nor a rounding */
                const ops_weight *w = mm[qi[i]].w;
                TD_TRY(mmb_launch(mm[qi[i]].y + (size_t)t0 * w->rows, x + (size_t)t0 * cols,
                                  NULL, w, &dev, st));
                cuda_launch_note(1);
                done[i] = true;
                slot->mm_mark = __atomic_load_n(&cuda_launches, __ATOMIC_RELAXED);
                continue;
            }
            /* only right after this stream's previous quantised matmul kernel (mm_mark) */
            const bool pdl_x =
                dev.pdl && __atomic_load_n(&cuda_launches, __ATOMIC_RELAXED) == slot->mm_mark;
            TD_TRY(round_launch(plan[i], xq, xd, xsum, x + (size_t)t0 * cols, cols, nc, n_pad,
                                pdl_x, st));
            for (int j = i; j < nq; j++) {
                if (done[j] || !plan_shares_rounding(plan[i], plan[j]))
                    continue;
                const ops_weight *w = mm[qi[j]].w;
                TD_TRY(kernel_launch(mm[qi[j]].y + (size_t)t0 * w->rows, &q, w, plan[j], &dev,
                                     st));
                done[j] = true;
            }
            slot->mm_mark = __atomic_load_n(&cuda_launches, __ATOMIC_RELAXED);
        }
    }
    return TD_OK;
}

bool is_float_type(td_dtype t)
{
    return t == TD_F32 || t == TD_F16 || t == TD_BF16;
}

/* F32/F16/BF16 weights meet x as it is, 64 tokens per launch. */
td_err matmul_float(float *y, const float *x, const ops_weight *w, int64_t n_tok,
                    cudaStream_t st)
{
    for (int64_t t0 = 0; t0 < n_tok; t0 += MM_CHUNK) {
        const int nc = (int)(n_tok - t0 < MM_CHUNK ? n_tok - t0 : MM_CHUNK);
        float *yc = y + (size_t)t0 * w->rows;
        const float *xc = x + (size_t)t0 * w->cols;
        TD_TRY(w->type == TD_F32 ? mmf_launch(yc, xc, w, nc, st)
                                 : mmh_launch(yc, xc, w, nc, st));
    }
    return TD_OK;
}

/* Whether bytes at a and b overlap. */
bool spans_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes)
{
    const uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return pa < pb + b_bytes && pb < pa + a_bytes;
}

} /* namespace */

td_err cuda_matmul_multi(const float *x, const ops_mm_out *mm, int n, int64_t n_tok,
                         ops_stream st)
{
    TD_ASSERT(x != NULL && mm != NULL && n >= 1 && n <= OPS_MM_GROUP_MAX && n_tok >= 1);
    const int64_t cols = mm[0].w ? mm[0].w->cols : 0;
    int qi[OPS_MM_GROUP_MAX], nq = 0;
    for (int i = 0; i < n; i++) {
        const ops_weight *w = mm[i].w;
        TD_ASSERT(mm[i].y != NULL && w != NULL && w->data != NULL);
        TD_ASSERT(w->rows >= 1 && w->cols >= 1 && w->cols == cols);
        if (!ops_type_supported(w->type))
            return err_set(TD_ENOTSUP, "cuda_matmul: type %s (%d) is not supported",
                           dtype_name(w->type), (int)w->type);
        TD_ASSERT(w->cols % dtype_get(w->type)->block == 0); /* ops_weight_init checked */
        if (is_float_type(w->type))
            continue;
        if (((uintptr_t)w->data & 15) != 0)
            return err_set(TD_EINVAL, "cuda_matmul: %s weight data at %p is not 16-byte aligned",
                           dtype_name(w->type), w->data);
        qi[nq++] = i;
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
        TD_TRY(matmul_quant_group(x, mm, qi, nq, n_tok, cs));
    for (int i = 0; i < n; i++)
        if (is_float_type(mm[i].w->type))
            TD_TRY(matmul_float(mm[i].y, x, mm[i].w, n_tok, cs));
    return TD_OK;
}

td_err cuda_matmul(float *y, const float *x, const ops_weight *w, int64_t n_tok,
                   ops_stream st)
{
    TD_ASSERT(y != NULL && w != NULL);
    const ops_mm_out one = {y, w};
    return cuda_matmul_multi(x, &one, 1, n_tok, st);
}
