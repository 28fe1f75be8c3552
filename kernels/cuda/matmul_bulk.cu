/* y = x . W^T for one token (decode) on sm_90: weights stream into shared memory by bulk
 * copies (cp.async.bulk, the copy engine of Hopper) that complete on per-stage mbarriers, and
 * each lane turns one whole (row, k-block) into the exact integers of matmul_quant.cu with
 * dp4a. It runs every single token of a type it covers (Q4_K, Q5_K, Q6_K, Q8_0) on sm_90
 * unless TANDEM_MMD picks another kernel: on an H200 it reached 40-93% of the copy rate where
 * the register and tensor-core kernels reached 20-68% (NOTES.md, round 3).
 *
 * Why: the register kernel (matmul_decode.cu) keeps its loads in flight on one scoreboard,
 * so every k-block waits a full memory latency, and the cp.async rings spent many
 * instructions per byte and waited in order (NOTES.md, round 2). A bulk copy is one
 * instruction per row run of ~850-1400 bytes, its completion is counted in bytes on the
 * stage's barrier, and a warp waits only on the stage it is about to read.
 *
 * Layout: one CTA per SM (the rings fill most of its shared memory), MMB_WARPS warps (rows
 * rounded in the kernel: Q4_K MMB_WIDE_WARPS with stages half as deep, Q6_K MMB_Q6_K_WIDE_WARPS
 * with 2 stages instead of 3), each with its own ring of STAGES stages, over the rows of up to
 * four matrices of one type and width that read the same token (an mm_set: one ramp-up and one
 * tail for all of them). A warp takes units of MMB_UROWS = 8 consecutive rows of one matrix
 * (handed out by a counter in shared memory among the CTA's contiguous share of the units, so
 * the SM's warps finish together; a CTA with fewer units than warps gives warp w unit w and the
 * idle warps' ring buffers to the busy ones, so matrices of few rows per SM still have every
 * buffer in flight) and walks a unit's k-blocks KC per stage (8; Q6_K 4): lane 4r + q owns row
 * r and accumulation chain q, i.e. k-blocks k0 + q, k0 + q + 4, ... of every stage, and decodes
 * each alone (no butterfly: that is what keeps the count near 0.07-0.11 instructions per weight
 * byte). One elected lane issues the stage's 8 row copies; the stage's barrier expects that
 * lane's one arrival, made after (Q4_K/Q5_K: with) the announcement of every copy's bytes, so
 * no phase can complete before its last copy lands. The activations of the token (2 bytes per
 * input, digits hi/lo) are copied once per CTA into shared memory, with the scale and sum
 * digits each k-block needs beside them; every lane of a warp reads the same unit of 4 k-blocks
 * at a time (broadcast, 4 bank groups).
 *
 * Arithmetic (matmul_quant.cu's header comment, exactly): per (row, k-block) the integers H,
 * L, M (Q4_K/Q5_K) or C (Q6_K) or per Q8_0 block 256 dot_hi + dot_lo, then the same f32 steps
 * with the same _rn intrinsics in the same order along chain q (k-blocks q, q+4, ... in
 * increasing order), and y = ((p0 + p1) + p2) + p3 over the chains. So a token's result is
 * bit-identical to the tensor-core kernel's and the dp4a kernel's (tested).
 *
 * Hang safety: every wait on a barrier gives up after ~2^24 sleeps (seconds) and traps, so a
 * wrong byte count becomes a launch error instead of a hung GPU. */
#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MMB_SM90 1 /* device code exists for sm_90 only; the sm_86 kernel is an empty stub */
#else
#define MMB_SM90 0
#endif

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul_bulk_addr.h"
#include "kernels/cuda/matmul_bulk_blocks.cuh"
#include "kernels/cuda/matmul_bulk_copy.cuh"
#include "kernels/cuda/matmul_internal.h"

namespace {

constexpr int UROWS = MMB_UROWS;

#if MMB_SM90

/* The stage of rows row0 .. row0 + nr - 1 (the first at `unit` = w + row0 * row_bytes),
 * k-blocks k0 .. k0 + KC - 1, into dst (row i at dst + i * SLOT), by one thread. Every row's
 * run has the same length. Q4_K/Q5_K runs are their own windows: one arrival announcing
 * all their bytes, then the copies. Q6_K/Q8_0: each copy's bytes announced before it, the
 * tail of the matrix's last run loaded with 16-bit loads, then the arrival (which releases
 * those stores). Either way the phase cannot complete before its last copy has landed. */
template <int T, int W>
__device__ __forceinline__ void stage_issue(uint8_t *dst, uint64_t *bar, const uint8_t *w,
                                            const uint8_t *unit, int64_t row_bytes,
                                            int64_t rows, int64_t total, int64_t row0, int nr,
                                            int k0, uint64_t policy)
{
    using B = bring<T, W>;
    const uint32_t run = mmb_run_bytes(row_bytes, B::KB, B::KC, k0);
    if constexpr (B::ALIGNED) {
        (void)w, (void)rows, (void)total, (void)row0;
        bar_arrive_tx(bar, run * (uint32_t)nr);
        const uint8_t *src = unit + k0 * B::KB;
        if (nr == UROWS) {
#pragma unroll
            for (int i = 0; i < UROWS; i++) {
                bulk_copy(dst, src, run, bar, policy);
                dst += B::SLOT;
                src += row_bytes;
            }
        } else {
            for (int i = 0; i < nr; i++) {
                bulk_copy(dst, src, run, bar, policy);
                dst += B::SLOT;
                src += row_bytes;
            }
        }
    } else {
        (void)unit;
        /* rows before the matrix's last: windows that never pass the matrix's end; each
         * copy's bytes are announced just before it, the phase's one arrival comes last */
        const bool last = row0 + nr == rows; /* the unit holds the matrix's last row */
        const int n_plain = last ? nr - 1 : nr;
        int64_t start = row0 * row_bytes + (int64_t)k0 * B::KB;
        for (int i = 0; i < n_plain; i++) {
            const uint32_t bytes = mmb_window_bytes(start, run);
            bar_expect_tx(bar, bytes);
            bulk_copy(dst, w + (start & ~(int64_t)15), bytes, bar, policy);
            dst += B::SLOT;
            start += row_bytes;
        }
        if (last) { /* its window stops at the matrix's last 16 bytes, the tail is loaded */
            const mmb_copy c = mmb_copy_at(start, run, total);
            for (uint32_t t = 0; t < c.tail; t += 2)
                *(uint16_t *)(dst + c.bulk + t) = *(const uint16_t *)(w + c.src + c.bulk + t);
            if (c.bulk) {
                bar_expect_tx(bar, c.bulk);
                bulk_copy(dst, w + c.src, c.bulk, bar, policy);
            }
        }
        bar_arrive(bar); /* releases the tail's stores */
    }
}

/* Lane 0 takes the CTA's next unit (CTA-local index), -1 when none is left; the whole warp
 * gets the answer. With no more units than warps, warp w has unit w and no other (its ring
 * is sized for that: see the kernel). */
template <int W> __device__ __forceinline__ int unit_take(int *counter, int n_local, bool first)
{
    if (n_local <= W)
        return first && (int)(threadIdx.x >> 5) < n_local ? (int)(threadIdx.x >> 5) : -1;
    int u = 0;
    if ((threadIdx.x & 31) == 0)
        u = atomicAdd(counter, 1);
    u = __shfl_sync(0xffffffffu, u, 0);
    return u < n_local ? u : -1;
}

#endif /* MMB_SM90 */

/* --- the kernel --------------------------------------------------------------------------- */

/* grid: one CTA per SM (at most one per unit), W warps, mmb_smem_bytes of dynamic
 * shared memory. The units of the set's members are numbered one member after the other
 * (a unit never spans two members); CTA b owns units [units * b / grid, units * (b + 1) /
 * grid) and its warps take them one at a time. nblk: blocks per row (super-blocks, or
 * Q8_0's blocks of 32). FUSED: the token's inputs x are rounded here (round_x), else read
 * rounded from the rounding kernel's xq, xd, xs (stage_x). */
template <int T, bool FUSED, int W>
__global__ void __launch_bounds__(W * 32, 1)
    mmb_kernel(mm_set set, int64_t row_bytes, int64_t cols, int nblk, const float *x,
               const int8_t *xq, const float *xd, const int8_t *xs, int n_pad)
{
    mm_launch_dependents(); /* the next rounding kernel waits for this grid (matmul.cu) */
#if MMB_SM90
    using B = bring<T, W>;
    constexpr int KM = B::KC / 4; /* k-blocks per chain and stage */
    const int nkb = T == TD_Q8_0 ? (nblk + 3) / 4 : nblk;
    extern __shared__ __align__(128) uint8_t smem[];
    constexpr int NS = W * B::STAGES;      /* stage buffers of the CTA */
    uint64_t *bars = (uint64_t *)smem;     /* [NS], one arrival each */
    int *owner = (int *)(bars + NS);       /* [NS] unit in the stage */
    int *counter = owner + NS;             /* units taken in this CTA */
    uint8_t *xsm = smem + MMB_HDR;                  /* [nkb][XKB] activations */
    uint8_t *ring = xsm + (((int64_t)nkb * B::XKB + 127) & ~(int64_t)127);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = lane >> 2, q = lane & 3; /* row of the unit, chain */
    const int64_t units = set.first[set.n];
    const int64_t u0 = units * blockIdx.x / gridDim.x;
    const int n_local = (int)(units * (blockIdx.x + 1) / gridDim.x - u0);
    if (threadIdx.x == 0) {
        for (int i = 0; i < NS; i++)
            bar_init(&bars[i], 1);
        *counter = 0;
        bar_init_fence();
    }
    __syncthreads();

    /* The warp's ring: STAGES buffers, or with fewer units than warps (matrices of few rows
     * per SM) the buffers of the idle warps too, so the CTA still has them all in flight. */
    const int sd = n_local < W ? NS / (n_local > 0 ? n_local : 1) : B::STAGES;
    uint8_t *wring = ring + (size_t)warp * sd * UROWS * B::SLOT; /* [sd][UROWS][SLOT] */
    uint64_t *wbar = bars + warp * sd;
    int *wown = owner + warp * sd;
    const uint64_t policy = evict_first_policy();
    const int nst = (nkb + B::KC - 1) / B::KC; /* stages per unit */
    /* the next stage to issue: unit p_unit (CTA-local, -1: none left) of member p_m, its
     * stage p_st; its rows p_row0 .. + p_nr - 1 of the member start at p_src */
    int p_unit = unit_take<W>(counter, n_local, true), p_st = 0, p_nr = 0, p_m = 0;
    int64_t p_row0 = 0;
    const uint8_t *p_src = set.w[0];
    auto unit_start = [&]() {
        if (p_unit >= 0) {
            p_m = mm_set_member(&set, u0 + p_unit);
            const int64_t lu = u0 + p_unit - set.first[p_m]; /* unit of the member */
            p_row0 = lu * UROWS;
            p_nr = mmb_unit_rows(lu, set.rows[p_m]);
            p_src = set.w[p_m] + p_row0 * row_bytes;
        }
    };
    unit_start();
    int issued = 0;
    auto issue = [&](int s) {
        if (lane == 0)
            wown[s] = p_unit;
        if (elect_one())
            stage_issue<T, W>(wring + s * UROWS * B::SLOT, &wbar[s], set.w[p_m], p_src, row_bytes,
                           set.rows[p_m], set.rows[p_m] * row_bytes, p_row0, p_nr,
                           p_st * B::KC, policy);
        if (++p_st == nst) {
            p_st = 0;
            p_unit = unit_take<W>(counter, n_local, false);
            unit_start();
        }
        issued++;
    };
    /* the weights do not depend on the kernel before this one: fill the ring first */
    for (int s = 0; s < sd && p_unit >= 0; s++)
        issue(s);

    mm_wait_dependencies(); /* x, or xq, xd, xs, come from the kernel before this one */
    if constexpr (FUSED)
        round_x<T>(xsm, x, cols, nkb);
    else
        stage_x<T>(xsm, xq, xd, xs, cols, nkb, n_pad);
    __syncthreads();

    float acc = 0.0f; /* chain q of row r */
    int c_st = 0, s = 0, nr = 0, rr = 0;
    int64_t row0 = 0;
    float *y = set.y[0];
    uint32_t phase = 0;
    for (int c = 0; c < issued; c++) {
        bar_wait(&wbar[s], phase);
        if (c_st == 0) { /* a new unit */
            const int m = mm_set_member(&set, u0 + wown[s]);
            const int64_t lu = u0 + wown[s] - set.first[m];
            row0 = lu * UROWS;
            nr = mmb_unit_rows(lu, set.rows[m]);
            rr = r < nr ? r : nr - 1; /* rows past the matrix read the last real one */
            y = set.y[m];
        }
        const int k0 = c_st * B::KC;
        const uint8_t *slot = wring + (s * UROWS + rr) * B::SLOT;
        if constexpr (!B::ALIGNED) /* where the run starts in its window */
            slot += ((row0 + rr) * row_bytes + (int64_t)k0 * B::KB) & 15;
#pragma unroll
        for (int e = 0; e < KM; e++) { /* chain q's k-blocks of the stage, in order */
            const int kb = k0 + 4 * e + q;
            if (kb < nkb) {
                const uint8_t *blk = slot + (4 * e + q) * B::KB;
                const uint8_t *xk = xsm + kb * B::XKB;
                if constexpr (T == TD_Q6_K)
                    item_q6k(acc, blk, xk);
                else if constexpr (T == TD_Q8_0)
                    item_q80(acc, blk, xk, nblk - 4 * kb < 4 ? nblk - 4 * kb : 4);
                else
                    item_kq<T == TD_Q5_K>(acc, blk, xk);
            }
        }
        if (++c_st == nst) { /* the unit's last stage: y = ((p0 + p1) + p2) + p3 */
            c_st = 0;
            const float p1 = __shfl_down_sync(0xffffffffu, acc, 1);
            const float p2 = __shfl_down_sync(0xffffffffu, acc, 2);
            const float p3 = __shfl_down_sync(0xffffffffu, acc, 3);
            if (q == 0 && r < nr)
                y[row0 + r] = __fadd_rn(__fadd_rn(__fadd_rn(acc, p1), p2), p3);
            acc = 0.0f;
        }
        __syncwarp(); /* every lane is done with stage s before it is refilled */
        if (p_unit >= 0)
            issue(s);
        if (++s == sd) {
            s = 0;
            phase ^= 1;
        }
    }
#else
    (void)set, (void)row_bytes, (void)cols, (void)nblk, (void)x, (void)xq, (void)xd, (void)xs,
        (void)n_pad;
#endif
}

/* --- launch ------------------------------------------------------------------------------- */

/* Blocks per row (super-blocks, or Q8_0's blocks of 32) and k-blocks per row. */
template <int T> int64_t blocks_of(const ops_weight *w)
{
    return w->cols / (T == TD_Q8_0 ? 32 : MM_XBLOCK);
}
template <int T> int64_t kblocks_of(const ops_weight *w)
{
    return T == TD_Q8_0 ? (blocks_of<T>(w) + 3) / 4 : blocks_of<T>(w);
}

/* Warps of the CTA: rows rounded in the kernel take a wider CTA, Q4_K 16 warps (4 k-blocks
 * per stage) and Q6_K 12 (2 stages each), in the same shared memory, so a matrix of ~10 units
 * per SM runs one round of units instead of two; the rest 8 warps. Measured on the H200
 * (bench_matmul_cuda, one token): Q4_K 8 -> 16 warps 5120 -> 10240 14.0 -> 11.7 us, 5120 ->
 * 12288 14.5 -> 12.7, 6144 -> 5120 10.1 -> 9.8, 5120 -> 17408 18.7 either way, but 17408 ->
 * 5120 (rounded by the rounding kernel) 17.9 -> 19.2 us, so rows that long keep 8; Q6_K on
 * 12 warps 5120 -> 10240 at 65% of the copy rate against 51-52% on 8 (NOTES.md, round 3). */
template <int T> constexpr int warps_for(bool fused)
{
    return !fused ? MMB_WARPS
                  : T == TD_Q4_K ? MMB_WIDE_WARPS : T == TD_Q6_K ? MMB_Q6_K_WIDE_WARPS : MMB_WARPS;
}

template <int T, int W> int64_t smem_for(const ops_weight *w)
{
    using B = bring<T, W>;
    return mmb_smem_bytes(kblocks_of<T>(w), B::XKB, B::SLOT, B::STAGES, W);
}

/* The larger of the two CTAs' needs (which one runs depends on who rounds the inputs). */
template <int T> int64_t smem_for(const ops_weight *w)
{
    const int64_t a = smem_for<T, warps_for<T>(true)>(w), b = smem_for<T, warps_for<T>(false)>(w);
    return a > b ? a : b;
}

/* Shared bytes the kernel for w needs, -1 for a type it does not cover. */
int64_t smem_of(const ops_weight *w)
{
    switch (w->type) {
    case TD_Q4_K:
        return smem_for<TD_Q4_K>(w);
    case TD_Q5_K:
        return smem_for<TD_Q5_K>(w);
    case TD_Q6_K:
        return smem_for<TD_Q6_K>(w);
    case TD_Q8_0:
        return smem_for<TD_Q8_0>(w);
    default:
        return -1;
    }
}

template <int T, bool FUSED>
td_err launch(const ops_mm_out *mm, int n, const float *x, const mm_xquant *xq,
              const mm_device *dev, cudaStream_t st)
{
    constexpr int W = warps_for<T>(FUSED);
    const ops_weight *w = mm[0].w;
    const mm_set set = mm_set_of(mm, n, UROWS);
    const int64_t units = set.first[n];
    static int attr_done[64]; /* per device ordinal: the shared-memory opt-in was set */
    int ordinal = 0, arch = 0, optin = 0;
    CUDA_TRY(cudaGetDevice(&ordinal));
    TD_TRY(device_caps(&arch, &optin));
    if (!__atomic_load_n(&attr_done[ordinal & 63], __ATOMIC_RELAXED)) {
        CUDA_TRY(cudaFuncSetAttribute(mmb_kernel<T, FUSED, W>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
        __atomic_store_n(&attr_done[ordinal & 63], 1, __ATOMIC_RELAXED);
    }
    const int64_t grid = units < dev->n_sm ? units : dev->n_sm;
    const cudaError_t e = launch_ex(
        mmb_kernel<T, FUSED, W>, grid, W * 32, (size_t)smem_for<T, W>(w), dev->pdl, st, set,
        (int64_t)w->row_bytes, w->cols, (int)blocks_of<T>(w), x, xq ? xq->xq : NULL,
        xq ? xq->xd : NULL, xq ? xq->xsum : NULL, xq ? xq->n_pad : 0);
    if (e != cudaSuccess)
        return err_set(TD_ECUDA, "cuda_matmul: %s bulk kernel launch (%d members, %lld units): %s",
                       dtype_name(w->type), n, (long long)units, cudaGetErrorString(e));
    return TD_OK;
}

template <int T>
td_err launch_type(const ops_mm_out *mm, int n, const float *x, const mm_xquant *xq,
                   const mm_device *dev, cudaStream_t st)
{
    return x ? launch<T, true>(mm, n, x, NULL, dev, st)
             : launch<T, false>(mm, n, NULL, xq, dev, st);
}

} /* namespace */

td_err device_caps(int *arch, int *optin)
{
    int ordinal = 0;
    CUDA_TRY(cudaGetDevice(&ordinal));
    *arch = code_arch(ordinal);         /* both cached there */
    *optin = smem_optin_bytes(ordinal);
    return TD_OK;
}

bool mmb_supported(const ops_weight *w)
{
    int arch = 0, optin = 0;
    if (device_caps(&arch, &optin) != TD_OK) {
        (void)cudaGetLastError();
        return false;
    }
    const int64_t smem = smem_of(w);
    return arch >= 900 && smem > 0 && smem <= optin && ((uintptr_t)w->data & 15) == 0 &&
           w->row_bytes <= ((size_t)1 << 26);
}

bool mmb_fused(const ops_weight *w)
{
    return w->cols <= MMB_FUSE_COLS;
}

td_err mmb_launch(const ops_mm_out *mm, int n, const float *x, const mm_xquant *xq,
                  const mm_device *dev, cudaStream_t st)
{
    TD_ASSERT(n >= 1 && n <= MM_SET_MAX);
    const ops_weight *w = mm[0].w;
    for (int i = 0; i < n; i++)
        TD_ASSERT(mmb_supported(mm[i].w) && mm[i].w->type == w->type &&
                  mm[i].w->cols == w->cols);
    TD_ASSERT(x ? mmb_fused(w) && !xq : xq != NULL && xq->n_tok == 1);
    switch (w->type) {
    case TD_Q8_0:
        return launch_type<TD_Q8_0>(mm, n, x, xq, dev, st);
    case TD_Q6_K:
        return launch_type<TD_Q6_K>(mm, n, x, xq, dev, st);
    case TD_Q5_K:
        return launch_type<TD_Q5_K>(mm, n, x, xq, dev, st);
    default:
        return launch_type<TD_Q4_K>(mm, n, x, xq, dev, st);
    }
}
