/* y = x . W^T for 2..16 tokens (n_pad 8, 16) of Q4_K, Q5_K, Q6_K on sm_90: the window kernel;
 * 17..64 tokens (n_pad 32, 64): the wide kernel further down.
 * The arithmetic is matmul_quant.cu's (the fragment code of matmul_quant_blocks.cuh, chain
 * k of a (row, token) = k-blocks k, k + 4, ... in order, y = ((p0 + p1) + p2) + p3), so
 * every (row, token) is bit-identical to mmq_launch and to the single-token kernels
 * (tested); what differs is where the operands come from and who waits for them.
 *
 * Why: at 16 tokens the tensor-core kernel of matmul_quant.cu reads each token's activations
 * from L2 once per 16-row tile (3.6 bytes of activations per weight byte) with __ldg right
 * before the MMA that needs them. Nsight Compute on the H200 (5120 -> 17408 Q4_K, 16
 * tokens) showed 23% of the issue slots used, 2 warps per scheduler, 6.4 cycles between
 * issues, 46% of them waiting on L1TEX.
 *
 * How: one CTA per SM owns an even share of the 16-row tiles (of up to four matrices of one
 * type and width that read the same activations, an mm_set) and takes TT of them at a time
 * (a round); warp tau * 4 + c works on tile tau of the round, chain c. The k-blocks go by in
 * steps of four (a window: k-blocks 4s..4s+3, one per chain). Two rings in shared memory:
 * weight stages hold every tile's rows for one step (each row's four k-blocks are one
 * contiguous run, one bulk copy), activation stages the window's hi/lo digits of every
 * token (one run per token), its 256-input sums and scales (one run each), copied once and
 * read by all TT tiles. Every warp issues a share of each stage's copies (cp.async.bulk)
 * and arrives on the stage's full barrier announcing their bytes; it waits for the stage,
 * runs kblock_any on its k-block from shared memory, arrives on the stage's empty barrier
 * and then refills the stages of the item before (whose empty barriers have then most
 * likely completed) with the items WS and XS after it. At the end of a round the four
 * chains of each tile meet in shared memory (red_put / red_sum).
 *
 * Weights copied per step: TT x 16 runs of 576 (Q4_K), 704 (Q5_K) or 840 (Q6_K) bytes; Q6_K
 * runs start at any even offset, so their copies are the 16-byte window around the run (the
 * kernel reads it `(run & 15)` bytes in, as kblock_q6k does for staged rows), and only the
 * matrix's last run can have a window past the matrix: there the copy stops at the last
 * 16-byte boundary and the bytes after it are 16-bit loads, stored before the arrival. Rows
 * and tiles past the matrix are not copied (their results are never stored); tokens past
 * n_tok are not copied either (their fragments are zeros, as in mmq). Q4_K and Q5_K rows
 * are 16-byte multiples, so a tile's 16 runs are one 2-D tensor copy instead (tile_weights:
 * lane 0 of the tile's first warp copies 16 rows x the stage's row pitch, the run and the
 * few bytes after it, zeros past a row or the matrix, and is the tile's one arrival on the
 * stage's full barrier); row by row a warp's four copies go out one lane at a time (the copy
 * takes its operands in uniform registers). H100, against row by row: 16-token products
 * 3-11% faster, 64-token ones 3-16%, verify 16 -4%, a 1K prompt -3.5% (kernels/cuda/NOTES.md).
 * The tokens' digits of a step as one 3-D tensor copy as well measured slower than row by
 * row at 4 and 16 tokens and was dropped (NOTES.md). Q6_K rows of 210 * cols / 256 bytes are
 * no tensor rows, but two of them are where cols is a multiple of 1024 (every 27B Q6_K
 * matrix): with an even number of rows, a tile's step is two boxes of 8 pairs of rows (each
 * row's 16-byte window as the row copy takes it; the even rows to the stage's rows 0-7, the
 * odd ones to 8-15, which kblock_q6k<PAIRS> reads as fragment rows g and g + 8 of rows 2g and
 * 2g + 1, and the reduction stores accordingly); other Q6_K matrices go row by row.
 *
 * Measured on the H200 (bench_matmul_cuda, 16 tokens, microseconds, this kernel / mmq):
 * Q4_K 36.1 / 42.7 (5120 -> 17408), 38.8 / 45.3 (17408 -> 5120), 23.9 / 27.2 (5120 ->
 * 10240), 15.7 / 18.3 (6144 -> 5120); Q6_K 58.4 / 70.6, 68.2 / 77.3, 36.0 / 46.2, LM head
 * 688 / 884; Q5_K 51.8 / 48.0, 61.7 / 51.5, 23.7 / 20.4 (6144 -> 5120), so Q5_K stayed on
 * mmq until later changes (a share of 3 tiles in one round, the per-step bookkeeping cut)
 * made it 45.4 / 47.4, 47.1 / 53.6, 17.8 / 21.0 (kernels/cuda/NOTES.md). A first version
 * with one producer warp issuing every copy (elect loops of ~10 instructions per copy, 66
 * copies per step) took ~4 us per step: 60 us on the first shape. Two activation stages instead of three: Q4_K 43.1 us there. 32 tokens
 * (one tile per round, the activations of 32 tokens filling the shared memory) measured
 * 6.6x a token's time against mmq's 4.6x, so n_pad 32 takes the wide kernel instead. */
#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MMB_SM90 1 /* device code exists for sm_90 only; the sm_86 kernel is an empty stub */
#else
#define MMB_SM90 0
#endif

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/matmul_bulk_addr.h"
#include "kernels/cuda/matmul_bulk_copy.cuh"
#include "kernels/cuda/matmul_internal.h"
#include "kernels/cuda/matmul_quant_blocks.cuh"

/* The members' tensor maps a launch passes (tile_weights; zeros where rows are copied one by
 * one). */
struct mmqb_maps {
    CUtensorMap m[MM_SET_MAX];
};

/* When a warp refills stages (mmq_refill below). */
enum { MMQ_REFILL_LATE, MMQ_REFILL_EARLY2, MMQ_REFILL_EARLY };

typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                              const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                              const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* The driver's tensor-map encoder, looked up once (NULL where the driver has none). */
static encode_fn encoder(void)
{
    static encode_fn fn;
    static int asked;
    if (!__atomic_load_n(&asked, __ATOMIC_ACQUIRE)) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult r = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                             cudaEnableDefault, &r) != cudaSuccess ||
            r != cudaDriverEntryPointSuccess)
            p = NULL;
        (void)cudaGetLastError();
        __atomic_store_n(&fn, (encode_fn)p, __ATOMIC_RELAXED);
        __atomic_store_n(&asked, 1, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&fn, __ATOMIC_RELAXED);
}

namespace {

constexpr int WIN = MMQB_WIN; /* k-blocks per step: one per chain */
static_assert(MMQB_WIN == KSPLIT, "a step holds one k-block per chain");
constexpr int XS = 3; /* stages of the activation ring */
constexpr int SMEM_MAX = 227 * 1024;

/* Bytes between staged rows (matmul_bulk_addr.h). */
template <int T> __host__ __device__ constexpr int run_pitch()
{
    return T == TD_Q4_K ? MMQB_Q4_K_PITCH : T == TD_Q5_K ? MMQB_Q5_K_PITCH : MMQB_Q6_K_PITCH;
}

/* Bytes between tokens' digit runs (WIN * 256 inputs * 2 bytes, padded): 64 mod 128 for the
 * 16-byte loads of Q4_K/Q5_K (two tokens per quarter-warp), 32 mod 128 for Q6_K's 8-byte ones
 * (four tokens per half-warp). */
template <int T> __host__ __device__ constexpr int tok_pitch()
{
    return WIN * MM_XBLOCK * 2 + (T == TD_Q6_K ? 32 : 64);
}

/* Shared memory: WS weight stages of [TT tiles x 16 rows][run_pitch], XS activation stages
 * of [tokens][tok_pitch] digits, [WIN][tokens][MM_XSUM_BYTES] sums and [WIN][tokens]
 * scales, the reduction area [TT][KSPLIT][16][tokens], then the barriers: full and empty
 * per weight stage, full and empty per activation stage. WS: as many weight stages as fit,
 * at most 4. */
template <int T, int NT, int TT> struct layout {
    enum : int {
        TOKS = NTOK * NT,
        W_STAGE = TT * MROWS * run_pitch<T>(),
        S_OFF = TOKS * tok_pitch<T>(), /* within an activation stage */
        D_OFF = S_OFF + WIN * TOKS * MM_XSUM_BYTES,
        X_STAGE = D_OFF + WIN * TOKS * (int)sizeof(float),
        RED = TT * KSPLIT * MROWS * TOKS * (int)sizeof(float),
        WS_FIT = (SMEM_MAX - XS * X_STAGE - RED - 2 * (4 + XS) * 8) / W_STAGE,
        WS = WS_FIT < 4 ? WS_FIT : 4,
        X_OFF = WS * W_STAGE,
        RED_OFF = X_OFF + XS * X_STAGE,
        BAR_OFF = RED_OFF + RED,
        SMEM = BAR_OFF + 2 * (WS + XS) * 8,
    };
};

#if MMB_SM90
/* A warp's one arrival on a stage's full barrier, after its lanes have issued their copies
 * (bytes: this lane's) and made their stores, announcing all their bytes at once. Copies
 * that land before it drive the barrier's byte count below zero, which is allowed; the
 * phase cannot complete before every warp's arrival. */
__device__ __forceinline__ void arrive_all(uint64_t *bar, uint32_t bytes, int lane)
{
    const uint32_t total = __reduce_add_sync(0xffffffffu, bytes);
    __syncwarp(); /* orders the lanes' stores before lane 0's release */
    if (lane == 0)
        bar_arrive_tx(bar, total);
}

/* A CTA's share of a launch over a set's 16-row tiles (both kernels): tiles [t_begin, t_end)
 * in rounds of TT, each round in steps of kc k-blocks; items = (round, step) pairs. */
struct cta_share {
    int64_t t_begin, t_end;
    int nkb, nsteps, rounds, items;
};

/* Weight item c: the round's tile tau, whether the CTA has it, its member, step and stage;
 * c moves to the next item. */
struct witem {
    int64_t tile;
    bool in;
    int m, s, stage;
};
template <int WS>
__device__ __forceinline__ witem next_witem(mmqb_cursor &c, const mm_set &set,
                                            const cta_share &sh, int tt, int tau)
{
    witem w;
    w.tile = sh.t_begin + (int64_t)c.round * tt + tau;
    w.in = w.tile < sh.t_end;
    if (c.round != c.m_round) {
        c.m_round = c.round;
        c.m = mm_set_member(&set, w.in ? w.tile : sh.t_begin);
    }
    w.m = c.m;
    w.s = c.s;
    w.stage = c.n % WS;
    mmqb_cursor_next(&c, sh.nsteps);
    return w;
}

/* A warp's share of weight item c (both kernels) into stage c.n % WS of `stages` (W_STAGE
 * bytes apart): lane k < n copies row i = i0 + k of the round's tile tau (nothing where the
 * tile is past the CTA's or the row past the matrix), the run of KC k-blocks from k-block
 * KC * c.s, to row tau * 16 + i of the stage (rows PITCH apart); then the warp's one arrival
 * on the stage's full barrier; c moves to the next item. */
template <int T, int KC, int PITCH, int WS, int W_STAGE>
__device__ __forceinline__ void warp_weights(mmqb_cursor &c, uint8_t *stages, const mm_set &set,
                                             const cta_share &sh, int tt, int tau, int i0,
                                             int n, uint32_t row_bytes, uint64_t *full,
                                             uint64_t policy, int lane)
{
    const witem it = next_witem<WS>(c, set, sh, tt, tau);
    const int64_t tile = it.tile;
    const bool in = it.in;
    const int m = it.m, s = it.s;
    uint8_t *stage = stages + it.stage * W_STAGE;
    full += it.stage;
    const int i = i0 + lane; /* row of the tile */
    const int64_t r = (tile - set.first[m]) * MROWS + i, rows = set.rows[m];
    const uint8_t *w = set.w[m];
    uint32_t bytes = 0;
    if (lane < n && in && r < rows) {
        /* the 16-byte window around the run (tests/test_cuda_matmul_addresses.c walks every
         * one); the matrix's last may end with 16-bit loads */
        const mmb_copy cp = mmb_copy_of(row_bytes, rows, qt<T>::KB_BYTES, KC, r, KC * s);
        uint8_t *dst = stage + (tau * MROWS + i) * PITCH;
        for (uint32_t p = cp.bulk; p < cp.bulk + cp.tail; p += 2)
            *(uint16_t *)(dst + p) = *(const uint16_t *)(w + cp.src + p);
        bytes = cp.bulk;
        if (bytes)
            bulk_copy(dst, w + cp.src, bytes, full, policy);
    }
    arrive_all(full, bytes, lane);
}

/* Weight item c as tensor copies of whole tiles: lane 0 of the tile's first warp copies the
 * tile's rows of the step to its rows of the stage (PITCH bytes apart) and is the tile's one
 * arrival on the stage's full barrier; c moves to the next item. Q4_K and Q5_K (rows
 * 16-byte multiples, mm_rows_map with one row per tensor row): the box of 16 rows x PITCH
 * bytes from byte KC * s * KB_BYTES of the tile's first row, the run and the PITCH - run
 * bytes after it (zeros past a row's end or the matrix). Q6_K (row_bytes a multiple of 8, an
 * even number of rows; mm_rows_map with two rows per tensor row, 16-byte strides): the
 * 16-byte window around each run as the row copies take it, two boxes of 8 pairs: the even
 * rows' windows (from the run's first byte rounded down to 16) to the stage's rows 0-7, the
 * odd rows' (row_bytes further) to rows 8-15, the fragment rows kblock_q6k<PAIRS> reads
 * them as. */
template <int T, int KC, int PITCH, int WS, int W_STAGE>
__device__ __forceinline__ void tile_weights(mmqb_cursor &c, uint8_t *stages, const mm_set &set,
                                             const cta_share &sh, int tt, int tau,
                                             const CUtensorMap *maps, uint32_t row_bytes,
                                             uint64_t *full, uint64_t policy, int lane)
{
    static_assert(MROWS / 2 * PITCH % 128 == 0 && W_STAGE % 128 == 0,
                  "a tensor copy's destination is 128-byte aligned");
    static_assert(PITCH % 16 == 0 && PITCH / 8 <= 256, "a box row of 8-byte elements");
    const witem it = next_witem<WS>(c, set, sh, tt, tau);
    uint8_t *dst = stages + it.stage * W_STAGE + tau * MROWS * PITCH;
    full += it.stage;
    if (lane == 0) {
        if (it.in) {
            const CUtensorMap *map = &maps[it.m];
            const int row0 = (int)((it.tile - set.first[it.m]) * MROWS);
            bar_arrive_tx(full, MROWS * PITCH);
            if constexpr (T == TD_Q6_K) {
                const int k0 = KC * it.s;
                tensor_copy_2d(dst, map, (int)mmb_pair_x(row_bytes, qt<T>::KB_BYTES, k0, 0) / 8,
                               row0 / 2, full, policy);
                tensor_copy_2d(dst + MROWS / 2 * PITCH, map,
                               (int)mmb_pair_x(row_bytes, qt<T>::KB_BYTES, k0, 1) / 8, row0 / 2,
                               full, policy);
            } else {
                static_assert(KC * qt<T>::KB_BYTES % 16 == 0, "runs start 16-byte aligned");
                tensor_copy_2d(dst, map, KC * it.s * qt<T>::KB_BYTES / 8, row0, full, policy);
            }
        } else {
            bar_arrive(full);
        }
    }
}

/* A warp's share of activation item c (both kernels) into stage c.n % XS of `stages`
 * (X_STAGE bytes apart): copy j (one per lane) of the step's n_tok + 2 runs of KC k-blocks
 * from k-block KC * c.s: token j's digits (tokens TP bytes apart), then the TOKS tokens' sums
 * at S_OFF, then their scales at D_OFF; then the warp's one arrival on the stage's full
 * barrier; c moves to the next item. */
template <int KC, int TP, int TOKS, int S_OFF, int D_OFF, int XS, int X_STAGE>
__device__ __forceinline__ void warp_acts(mmqb_cursor &c, uint8_t *stages, const mm_xquant &xq,
                                          int64_t cols, const cta_share &sh, int j,
                                          uint64_t *full, uint64_t policy, int lane)
{
    const int s = c.s, nkb = sh.nkb, stage_i = c.n % XS;
    uint8_t *st = stages + stage_i * X_STAGE;
    full += stage_i;
    mmqb_cursor_next(&c, sh.nsteps);
    const int nw = nkb - KC * s < KC ? nkb - KC * s : KC;
    uint32_t bytes = 0;
    if (j < xq.n_tok + 2) {
        const uint8_t *src;
        uint8_t *dst;
        if (j < xq.n_tok) { /* token j's digits of the step */
            src = (const uint8_t *)xq.xq + (size_t)j * 2 * cols + (size_t)s * KC * MM_XBLOCK * 2;
            dst = st + j * TP;
            bytes = (uint32_t)nw * MM_XBLOCK * 2;
        } else if (j == xq.n_tok) { /* the sums of the step's x blocks */
            src = (const uint8_t *)xq.xsum + (size_t)s * KC * TOKS * MM_XSUM_BYTES;
            dst = st + S_OFF;
            bytes = (uint32_t)nw * TOKS * MM_XSUM_BYTES;
        } else { /* their scales */
            src = (const uint8_t *)(xq.xd + (size_t)s * KC * TOKS);
            dst = st + D_OFF;
            bytes = (uint32_t)nw * TOKS * (uint32_t)sizeof(float);
        }
        bulk_copy(dst, src, bytes, full, policy);
    }
    arrive_all(full, bytes, lane);
}

/* The full and empty barriers of ws weight and xs activation stages, contiguous at bars
 * (weights full, weights empty, activations full, activations empty), each phase completed by
 * `count` warps' arrivals, a weight stage's full barrier by `wcount`; every thread of the CTA
 * returns once they are set up. */
__device__ __forceinline__ void rings_init(uint64_t *bars, int ws, int xs, unsigned count,
                                           unsigned wcount)
{
    if (threadIdx.x == 0) {
        for (int i = 0; i < 2 * (ws + xs); i++)
            bar_init(&bars[i], i < ws ? wcount : count);
        bar_init_fence();
    }
    __syncthreads();
}

__device__ __forceinline__ cta_share cta_share_of(const mm_set &set, int64_t cols, int kb_w,
                                                  int kc, int tt)
{
    cta_share c;
    const int64_t n_tiles = set.first[set.n];
    c.nkb = (int)(cols / kb_w);
    c.nsteps = (c.nkb + kc - 1) / kc;
    c.t_begin = n_tiles * blockIdx.x / gridDim.x;
    c.t_end = n_tiles * (blockIdx.x + 1) / gridDim.x;
    c.rounds = (int)((c.t_end - c.t_begin + tt - 1) / tt);
    c.items = c.rounds * c.nsteps;
    return c;
}

/* A warp's view of its CTA's two rings (both kernels): WS weight stages of L::W_STAGE bytes
 * at smem and XS activation stages of L::X_STAGE bytes at smem + L::X_OFF, their full and
 * empty barriers at smem + L::BAR_OFF, the warp's cursors and its share of every item's
 * copies (weight rows i0 .. i0 + n - 1 of its tile tau, activation copy j of each lane).
 * Item it sits in weight stage it % WS and activation stage it % XS. */
template <int T, int KC, int PITCH, int TP, int WS, int XS, bool TILE, class L> struct rings {
    static constexpr unsigned SPIN = 1024; /* polls of a barrier before sleeping between them */
    uint8_t *smem;                             /* the CTA's dynamic shared memory */
    uint64_t *wfull, *wempty, *xfull, *xempty; /* [WS], [WS], [XS], [XS] stage barriers */
    const mm_set &set;                         /* the matrices */
    const mm_xquant &xq;                       /* the rounded activations */
    const cta_share &sh;                       /* the CTA's tiles, rounds and steps */
    int64_t cols;                              /* inputs per row */
    uint32_t row_bytes;                        /* bytes per weight row */
    int tt, tau, i0, n, j, lane; /* tiles per round; this warp's tile, rows, copy, lane */
    uint64_t once, shared; /* L2 policies: weights read once, activations by every SM */
    mmqb_cursor wc, xc;    /* the next weight and activation items this warp issues */
    bool early = false;    /* refill at an item's start (wait) instead of its end (done) */
    const CUtensorMap *maps = nullptr; /* the members' rows (TILE: tile_weights) */
    bool wissue = true;                /* this warp issues weight items */

    __device__ __forceinline__ rings(uint8_t *smem_, const mm_set &set_, const mm_xquant &xq_,
                                     const cta_share &sh_, int64_t cols_, uint32_t row_bytes_,
                                     int tt_, int tau_, int i0_, int n_, int j_, int lane_)
        : smem(smem_), wfull((uint64_t *)(smem_ + L::BAR_OFF)), wempty(wfull + WS),
          xfull(wempty + WS), xempty(xfull + XS), set(set_), xq(xq_), sh(sh_), cols(cols_),
          row_bytes(row_bytes_), tt(tt_), tau(tau_), i0(i0_), n(n_), j(j_), lane(lane_),
          once(evict_first_policy()), shared(evict_last_policy()), wc{0, 0, 0, -1, 0},
          xc{0, 0, 0, -1, 0}
    {
    }
    /* Sets up the CTA's ring barriers, each phase completed by `warps` arrivals (a weight
     * stage's full barrier by `wwarps`: the warps that issue weight items); every thread of
     * the CTA calls it, and returns once they are set up. */
    static __device__ __forceinline__ void init(uint8_t *smem_, unsigned warps, unsigned wwarps)
    {
        rings_init((uint64_t *)(smem_ + L::BAR_OFF), WS, XS, warps, wwarps);
    }
    __device__ __forceinline__ void weights()
    {
        if constexpr (TILE)
            tile_weights<T, KC, PITCH, WS, L::W_STAGE>(wc, smem, set, sh, tt, tau, maps,
                                                       row_bytes, wfull, once, lane);
        else
            warp_weights<T, KC, PITCH, WS, L::W_STAGE>(wc, smem, set, sh, tt, tau, i0, n,
                                                       row_bytes, wfull, once, lane);
    }
    __device__ __forceinline__ void acts()
    {
        warp_acts<KC, TP, L::TOKS, L::S_OFF, L::D_OFF, XS, L::X_STAGE>(
            xc, smem + L::X_OFF, xq, cols, sh, j, xfull, shared, lane);
    }
    /* The first WS weight items (they do not depend on the kernel before this one), then,
     * once that kernel is done, the first XS activation items. */
    __device__ __forceinline__ void fill()
    {
        while (wissue && wc.n < sh.items && wc.n < WS)
            weights();
        mm_wait_dependencies(); /* xq comes from the kernel before this one */
        while (xc.n < sh.items && xc.n < XS)
            acts();
    }
    /* Returns once both stages of item it have landed (early: then refills those of the
     * item before). */
    __device__ __forceinline__ void wait(int it)
    {
        bar_wait<SPIN>(&wfull[it % WS], (uint32_t)(it / WS) & 1);
        bar_wait<SPIN>(&xfull[it % XS], (uint32_t)(it / XS) & 1);
        if (early)
            refill(it - 1);
    }
    /* Refills the stages of item prev, once every warp is done with them, with the items WS
     * and XS after it (the cursors' next). */
    __device__ __forceinline__ void refill(int prev)
    {
        if (wissue && prev >= 0 && wc.n < sh.items) {
            bar_wait<SPIN>(&wempty[prev % WS], (uint32_t)(prev / WS) & 1);
            weights();
        }
        if (prev >= 0 && xc.n < sh.items) {
            bar_wait<SPIN>(&xempty[prev % XS], (uint32_t)(prev / XS) & 1);
            acts();
        }
    }
    __device__ __forceinline__ const uint8_t *wstage(int it) const
    {
        return smem + (it % WS) * L::W_STAGE;
    }
    __device__ __forceinline__ const uint8_t *xstage(int it) const
    {
        return smem + L::X_OFF + (it % XS) * L::X_STAGE;
    }
    /* After item it: the warp is done with both its stages; then (unless early) it refills
     * the stages of the item before (every warp is most likely done with it by now). */
    __device__ __forceinline__ void done(int it)
    {
        __syncwarp(); /* every lane is done with both stages */
        if (lane == 0) {
            bar_arrive(&wempty[it % WS]);
            bar_arrive(&xempty[it % XS]);
        }
        if (!early)
            refill(it - 1);
    }
};
#endif

template <int TT> constexpr int threads_of()
{
    return KSPLIT * TT * 32;
}

/* grid: the 16-row tiles of the set's members numbered one member after the other (a tile
 * never spans two members); CTA b owns tiles [n_tiles * b / grid, n_tiles * (b + 1) / grid),
 * TT per round (a round may span members); block: threads_of() (warp tau * 4 + c: tile tau
 * of the round, chain c); dynamic shared memory layout::SMEM. cols is a multiple of 256
 * (K-quants). TILE: weights by tensor copies of whole tiles (tile_weights; maps), else row by
 * row (Q6_K rows that cannot be paired). */
template <int T, int NT, int TT, bool TILE>
__global__ void __launch_bounds__(threads_of<TT>(), 1)
    mmqb_kernel(mm_set set, uint32_t row_bytes, int64_t cols, mm_xquant xq, int refill,
                const __grid_constant__ mmqb_maps maps)
{
    /* the next matmul's rounding kernel may launch now: it waits for this grid to finish
     * before it touches anything (see matmul.cu) */
    mm_launch_dependents();
#if MMB_SM90
    using Q = qt<T>;
    using L = layout<T, NT, TT>;
    constexpr int CONS = KSPLIT * TT; /* warps */
    constexpr int PITCH = run_pitch<T>();
    constexpr int WS = L::WS;
    static_assert(WS >= 2, "two weight stages at least");
    using R = rings<T, WIN, PITCH, tok_pitch<T>(), WS, XS, TILE, L>;
    constexpr bool PAIRS = TILE && T == TD_Q6_K; /* fragment rows of paired rows */
    extern __shared__ __align__(128) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    R::init(smem, CONS, TILE ? TT : CONS);

    const cta_share sh = cta_share_of(set, cols, Q::KB_W, WIN, TT);
    const int64_t t_begin = sh.t_begin, t_end = sh.t_end;
    const int nkb = sh.nkb, nsteps = sh.nsteps, rounds = sh.rounds;
    const int tau = warp / KSPLIT, c = warp % KSPLIT;

    /* Copies: every warp issues a share of each item (lanes 0..3: rows 4c..4c+3 of tile
     * tau; lane k: copy warp + CONS * k of the activations' n_tok + 2) and arrives once on the
     * stage's full barrier announcing its bytes, so a stage is full when all CONS shares have
     * landed. A single producer warp issuing them all (elect loops of ~10 instructions per
     * copy, 66 copies per stage) held each stage ~4 us on the H200. */
    R r(smem, set, xq, sh, cols, row_bytes, TT, tau, c * (MROWS / KSPLIT), MROWS / KSPLIT,
        warp + CONS * lane, lane);
    r.early = refill == MMQ_REFILL_EARLY || (refill == MMQ_REFILL_EARLY2 && WS == 2);
    if (TILE) {
        r.maps = maps.m;
        r.wissue = c == 0;
    }
    r.fill();

    const lane_pos l = {lane >> 2, lane & 3};
    unsigned valid = 0; /* bit nt: this lane's token 8nt+g exists */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        valid |= (unsigned)(nt * NTOK + l.g < xq.n_tok) << nt;
    float *red = (float *)(smem + L::RED_OFF);
    int it = 0;
    for (int round = 0; round < rounds; round++) {
        const int64_t tile = t_begin + (int64_t)round * TT + tau;
        const bool have = tile < t_end;
        const int m = mm_set_member(&set, have ? tile : 0);
        const uint8_t *wrow =
            set.w[m] + (size_t)(have ? tile - set.first[m] : 0) * MROWS * row_bytes;
        float acc[1][NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[0][nt][i] = 0.0f;
        for (int s = 0; s < nsteps; s++, it++) {
            r.wait(it);
            if (have && WIN * s + c < nkb) {
                /* row i's run at (tau * 16 + i) * PITCH of the weight stage, (run & 15)
                 * bytes in for Q6_K: kbase (row 0's run) gives kblock_any that offset */
                const uint8_t *slot = r.wstage(it) + tau * MROWS * PITCH + c * Q::KB_BYTES;
                const uint8_t *kbase = wrow + (size_t)s * WIN * Q::KB_BYTES;
                const uint8_t *st = r.xstage(it);
                const xview_s x = {
                    (const int8_t *)(st + l.g * tok_pitch<T>() + c * MM_XBLOCK * 2),
                    (const int8_t *)(st + L::S_OFF + (c * L::TOKS + l.g) * MM_XSUM_BYTES),
                    (const float *)(st + L::D_OFF) + c * L::TOKS + 2 * l.t,
                    (size_t)NTOK * tok_pitch<T>(), valid};
                kblock_any<T, 1, NT, PITCH, PAIRS>(acc, slot, kbase, row_bytes, 0, x, l);
            }
            r.done(it);
        }
        /* y = ((p0 + p1) + p2) + p3: the tile's four warps meet at named barrier 1 + tau
         * (not the whole CTA) */
        const int64_t r0 = have ? (tile - set.first[m]) * MROWS : 0, rows = set.rows[m];
        const int n_rows = !have ? 0 : rows - r0 < MROWS ? (int)(rows - r0) : MROWS;
        tile_reduce<1, NT, PAIRS>(set.y[m], red + tau * KSPLIT * MROWS * L::TOKS, acc, c, l, 1 + tau,
                           n_rows, xq.n_tok, rows, r0);
    }
#else
    (void)set, (void)row_bytes, (void)cols, (void)xq, (void)refill, (void)maps;
#endif
}

/* --- 17-64 tokens: the wide kernel ---------------------------------------------------------
 *
 * Why: at 32 and 64 tokens the tensor-core kernel (matmul_quant.cu) reads every token's
 * activations from L2 once per 16-row tile, 7-14 bytes of activations per weight byte; a
 * 64-token prefill chunk of the 27B spent 49.5 of its 58.6 ms in matrix products on the
 * H200 (tandem bench --profile), ~70 T int8 MACs/s.
 *
 * How: the window kernel's rings, with the warps cut the other way. One CTA per SM owns an
 * even share of the set's 16-row tiles and works on TT at a time; warp tau * G + q takes
 * tile tau of the round and tokens 16q..16q+15 (G = n_pad / 16 token groups), and runs all
 * four chains itself, one accumulator per chain: k-block kb goes to chain kb % 4 in
 * increasing kb, so every (row, token) sees mmq's chain sequence, and the lane adds
 * ((p0 + p1) + p2) + p3 in its registers (no reduction through shared memory). A step is
 * KS consecutive k-blocks: weight stages hold every tile's rows of the step (one run per
 * row), activation stages every token's digits of the step (one run per token), their sums
 * and scales, copied once and read by the TT tiles; each weight fragment serves the G warps
 * of its tile from shared memory. */
constexpr int WKS = MMQW_KS; /* k-blocks per step */
static_assert(KSPLIT % MMQW_KS == 0, "a step's k-blocks fall in distinct chains");

template <int T> __host__ __device__ constexpr int wide_pitch()
{
    return T == TD_Q4_K   ? MMQW_Q4_K_PITCH(WKS)
           : T == TD_Q5_K ? MMQW_Q5_K_PITCH(WKS)
                          : MMQW_Q6_K_PITCH(WKS);
}

/* Bytes between tokens' digit runs: the window kernel's residues mod 128. */
template <int T> __host__ __device__ constexpr int wide_tok_pitch()
{
    return WKS * MM_XBLOCK * 2 + (T == TD_Q6_K ? 32 : 64);
}

/* Shared memory: WS weight stages [TT tiles x 16 rows][wide_pitch], XS activation stages
 * [tokens][wide_tok_pitch] digits, [WKS][tokens][MM_XSUM_BYTES] sums, [WKS][tokens] scales,
 * then full and empty barriers per stage. XS = 3 where 3 weight stages still fit, else 2;
 * WS as many as fit, at most 4. */
template <int T, int G, int TT> struct wlayout {
    enum : int {
        TOKS = 2 * NTOK * G,
        W_STAGE = TT * MROWS * wide_pitch<T>(),
        S_OFF = TOKS * wide_tok_pitch<T>(),
        D_OFF = S_OFF + WKS * TOKS * MM_XSUM_BYTES,
        X_STAGE = D_OFF + WKS * TOKS * (int)sizeof(float),
        XS = SMEM_MAX - 3 * X_STAGE - 2 * (4 + 3) * 8 >= 3 * W_STAGE ? 3 : 2,
        WS_FIT = (SMEM_MAX - XS * X_STAGE - 2 * (4 + XS) * 8) / W_STAGE,
        WS = WS_FIT < 4 ? WS_FIT : 4,
        X_OFF = WS * W_STAGE,
        BAR_OFF = X_OFF + XS * X_STAGE,
        SMEM = BAR_OFF + 2 * (WS + XS) * 8,
    };
};

template <int G, int TT> constexpr int wide_threads()
{
    return G * TT * 32;
}

/* grid, tiles and rounds as mmqb_kernel's; block: wide_threads() (warp tau * G + q: tile tau
 * of the round, tokens 16q..16q+15); dynamic shared memory wlayout::SMEM. cols is a multiple
 * of 256 (K-quants). TILE as mmqb_kernel's. */
template <int T, int G, int TT, bool TILE>
__global__ void __launch_bounds__(wide_threads<G, TT>(), 1)
    mmqw_kernel(mm_set set, uint32_t row_bytes, int64_t cols, mm_xquant xq, int refill,
                const __grid_constant__ mmqb_maps maps)
{
    mm_launch_dependents(); /* as mmqb_kernel */
#if MMB_SM90
    using Q = qt<T>;
    using L = wlayout<T, G, TT>;
    constexpr int NW = G * TT; /* warps */
    constexpr int PITCH = wide_pitch<T>();
    constexpr int TP = wide_tok_pitch<T>();
    constexpr int WS = L::WS, XS = L::XS;
    static_assert(WS >= 2, "two weight stages at least");
    constexpr int SPG = KSPLIT / WKS; /* steps per turn of the four chains */
    using R = rings<T, WKS, PITCH, TP, WS, XS, TILE, L>;
    constexpr bool PAIRS = TILE && T == TD_Q6_K; /* fragment rows of paired rows */
    extern __shared__ __align__(128) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    R::init(smem, NW, TILE ? TT : NW);

    const cta_share sh = cta_share_of(set, cols, Q::KB_W, WKS, TT);
    const int64_t t_begin = sh.t_begin, t_end = sh.t_end;
    const int nkb = sh.nkb, nsteps = sh.nsteps, rounds = sh.rounds;
    const int tau = warp / G, q = warp % G;

    /* Copies: warp (tau, q) issues rows q * 16 / G .. of tile tau (one lane each) and the
     * activation runs warp + NW * lane (n_tok digit runs, the sums, the scales), then
     * arrives once on the stage's full barrier announcing its bytes. */
    R r(smem, set, xq, sh, cols, row_bytes, TT, tau, q * (MROWS / G), MROWS / G,
        warp + NW * lane, lane);
    r.early = refill == MMQ_REFILL_EARLY || (refill == MMQ_REFILL_EARLY2 && WS == 2);
    if (TILE) {
        r.maps = maps.m;
        r.wissue = q == 0;
    }
    r.fill();

    const lane_pos l = {lane >> 2, lane & 3};
    const int tok0 = 2 * NTOK * q; /* this warp's first token */
    unsigned valid = 0; /* bit nt: this lane's token tok0 + 8nt + g exists */
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
        valid |= (unsigned)(tok0 + nt * NTOK + l.g < xq.n_tok) << nt;
    int it = 0;
    for (int round = 0; round < rounds; round++) {
        const int64_t tile = t_begin + (int64_t)round * TT + tau;
        /* uniform in the warp: every lane takes part in the MMAs (a lane whose tokens are
         * all absent multiplies zeros) */
        const bool have = tile < t_end && tok0 < xq.n_tok;
        const int m = mm_set_member(&set, tile < t_end ? tile : t_begin);
        const int64_t tr0 = (tile < t_end ? tile - set.first[m] : 0) * MROWS;
        const uint8_t *wrow = set.w[m] + (size_t)tr0 * row_bytes;
        float acc[KSPLIT][1][2][4]; /* chain c's partial sums */
#pragma unroll
        for (int c = 0; c < KSPLIT; c++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[c][0][nt][i] = 0.0f;
        for (int s0 = 0; s0 < nsteps; s0 += SPG) {
#pragma unroll
            for (int u = 0; u < SPG; u++) {
                const int s = s0 + u;
                if (s >= nsteps)
                    break;
                r.wait(it);
                const uint8_t *wst = r.wstage(it) + tau * MROWS * PITCH;
                const uint8_t *st = r.xstage(it);
                const uint8_t *kbase = wrow + (size_t)s * WKS * Q::KB_BYTES;
#pragma unroll
                for (int j = 0; j < WKS; j++) {
                    /* k-block WKS * s + j = chain u * WKS + j of this turn */
                    if (have && WKS * s + j < nkb) {
                        const xview_s x = {
                            (const int8_t *)(st + (tok0 + l.g) * TP + j * MM_XBLOCK * 2),
                            (const int8_t *)(st + L::S_OFF +
                                             (j * L::TOKS + tok0 + l.g) * MM_XSUM_BYTES),
                            (const float *)(st + L::D_OFF) + j * L::TOKS + tok0 + 2 * l.t,
                            (size_t)NTOK * TP, valid};
                        kblock_any<T, 1, 2, PITCH, PAIRS>(acc[u * WKS + j],
                                                          wst + j * Q::KB_BYTES, kbase,
                                                          row_bytes, 0, x, l);
                    }
                }
                r.done(it);
                it++;
            }
        }
        /* y = ((p0 + p1) + p2) + p3: fragment rows g, g + 8 of the tile (PAIRS: its rows 2g,
         * 2g + 1), tokens 8nt + 2t, + 1 */
        if (have) {
            const int64_t rows = set.rows[m];
            float *y = set.y[m];
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int64_t r = tr0 + (PAIRS ? 2 * l.g + (i >> 1) : l.g + 8 * (i >> 1));
                    const int tk = tok0 + nt * NTOK + 2 * l.t + (i & 1);
                    const float v = __fadd_rn(__fadd_rn(__fadd_rn(acc[0][0][nt][i],
                                                                  acc[1][0][nt][i]),
                                                        acc[2][0][nt][i]),
                                              acc[3][0][nt][i]);
                    if (r < rows && tk < xq.n_tok)
                        y[(size_t)tk * rows + r] = v;
                }
        }
    }
#else
    (void)set, (void)row_bytes, (void)cols, (void)xq, (void)refill, (void)maps;
#endif
}

/* When a warp refills the stages of the item before: at the end of its current item (late),
 * or at its start, right after that item's stages landed (early), which issues the copies
 * one item sooner. With two weight stages (Q5_K and Q6_K taking 3 tiles in one round) a late
 * refill issues the copies of the next item just before waiting for them, so every step
 * waits a memory latency; with three or more, early refills gain nothing and wait for the
 * slowest warp sooner. Hence the default EARLY2, early only on two weight stages (H100,
 * bench_matmul_cuda at 16 tokens: Q6_K 17408 -> 5120 63.9 -> 54.4 us, Q5_K 50.7 -> 41.8,
 * Q4_K unchanged; kernels/cuda/NOTES.md). TANDEM_MMQ_REFILL=late|early|early2; read once.
 * Only when copies are issued changes, never a result. */
static int mmq_refill()
{
    static int mode = -1;
    int m = __atomic_load_n(&mode, __ATOMIC_RELAXED);
    if (m < 0) {
        const char *e = getenv("TANDEM_MMQ_REFILL");
        m = !e                       ? MMQ_REFILL_EARLY2
            : strcmp(e, "early") == 0 ? MMQ_REFILL_EARLY
            : strcmp(e, "late") == 0  ? MMQ_REFILL_LATE
                                      : MMQ_REFILL_EARLY2;
        __atomic_store_n(&mode, m, __ATOMIC_RELAXED);
    }
    return m;
}

/* The two kernels as launch_rounds sees them: P is NT (window) or G (wide); SHARE3: a CTA's
 * share of 3 tiles may be one round of 3 on 2 weight stages (launch_rounds); PAIRS: Q6_K rows
 * go by pairs where they can (q6k_pairs). Not the wide kernel's 32 tokens: there pairs were
 * slower than rows on an H100 (bench_matmul_cuda, Q6_K, us per token count's call: the LM
 * head 1125 by rows against 1211 by pairs, 5120 -> 17408 114 against 119), where at 16
 * tokens they gained 2-8% (the LM head 653 -> 600) and at 64 0-4% (kernels/cuda/NOTES.md). */
template <int T, int NT, int TT> struct window_kernel {
    template <bool TILE> static auto fn() { return mmqb_kernel<T, NT, TT, TILE>; }
    enum : int { SMEM = layout<T, NT, TT>::SMEM, WS = layout<T, NT, TT>::WS,
                 THREADS = threads_of<TT>(), SHARE3 = 1, PITCH = run_pitch<T>(), PAIRS = 1 };
    static const char *name() { return "window"; }
};
template <int T, int G, int TT> struct wide_kernel {
    template <bool TILE> static auto fn() { return mmqw_kernel<T, G, TT, TILE>; }
    enum : int { SMEM = wlayout<T, G, TT>::SMEM, WS = wlayout<T, G, TT>::WS,
                 THREADS = wide_threads<G, TT>(), SHARE3 = 0, PITCH = wide_pitch<T>(),
                 PAIRS = G == 4 };
    static const char *name() { return "wide"; }
};

/* Whether Q6_K members' rows can go by tensor copies of pairs (tile_weights): 16-byte strides
 * of two rows (row_bytes a multiple of 8: cols a multiple of 1024) and no row left unpaired. */
static bool q6k_pairs(const ops_mm_out *mm, int n)
{
    if (!mm_rows_map_ok() || mm[0].w->row_bytes % 8 != 0)
        return false;
    for (int i = 0; i < n; i++)
        if (mm[i].w->rows % 2 != 0)
            return false;
    return true;
}

/* One launch of kernel K: weights by tensor copies of whole tiles (the members' maps: Q4_K,
 * Q5_K, Q6_K where K::PAIRS and q6k_pairs) or else row by row; the shared-memory opt-in is
 * set once per device. */
template <class K, int T>
td_err launch_k(const ops_mm_out *mm, const mm_set &set, const mm_xquant *xq,
                const mm_device *dev, int64_t grid, cudaStream_t st)
{
    const ops_weight *w = mm[0].w;
    static_assert(K::SMEM <= SMEM_MAX, "a CTA must fit an sm_90 SM's shared memory");
    constexpr bool Q6 = T == TD_Q6_K, BY_TILE = !Q6 || K::PAIRS; /* the forms built */
    typedef void (*kernel_fn)(mm_set, uint32_t, int64_t, mm_xquant, int, mmqb_maps);
    kernel_fn f_tile = nullptr, f_rows = nullptr;
    if constexpr (BY_TILE)
        f_tile = K::template fn<true>();
    if constexpr (Q6)
        f_rows = K::template fn<false>();
    const bool tile = BY_TILE && (!Q6 || q6k_pairs(mm, set.n));
    const kernel_fn fn = tile ? f_tile : f_rows;
    static bool set_up[64]; /* per device ordinal */
    int ordinal = 0;
    CUDA_TRY(cudaGetDevice(&ordinal));
    if (!__atomic_load_n(&set_up[ordinal & 63], __ATOMIC_RELAXED)) {
        for (kernel_fn f : {f_tile, f_rows})
            if (f)
                CUDA_TRY(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              (int)K::SMEM));
        __atomic_store_n(&set_up[ordinal & 63], true, __ATOMIC_RELAXED);
    }
    mmqb_maps maps;
    memset(&maps, 0, sizeof maps);
    for (int i = 0; tile && i < set.n; i++)
        TD_TRY(mm_rows_map(&maps.m[i], mm[i].w, 8, Q6 ? 2 : 1, K::PITCH / 8,
                           Q6 ? MROWS / 2 : MROWS));
    const cudaError_t e = launch_ex(fn, grid, (int)K::THREADS, (int)K::SMEM, dev->pdl, st, set,
                                    (uint32_t)w->row_bytes, w->cols, *xq, mmq_refill(), maps);
    if (e != cudaSuccess)
        return err_set(TD_ECUDA, "cuda_matmul: %s %s kernel launch (%d members, %lld "
                       "tiles): %s", dtype_name(w->type), K::name(), set.n,
                       (long long)set.first[set.n], cudaGetErrorString(e));
    return TD_OK;
}

/* Tiles per round (mmqb_tiles_per_round) of at most TTMAX, the most that leaves room for 3
 * weight stages; but where that is 2 and a CTA's share is 3 tiles, the window kernel takes
 * them in one round of 3 on the 2 weight stages that leave room for (Q6_K, Q5_K). Q6_K at
 * 16 tokens on the H200 (bench_matmul_cuda, us): 17408 -> 5120 (320 tiles, 3 per CTA) 67.8
 * -> 62.2, 6144 -> 5120 26.7 -> 23.3; with rounds of 3 wherever they make fewer rounds,
 * 5120 -> 12288 (6 per CTA) went 37.9 -> 39.2 and the LM head (118) 659 -> 674: over
 * several rounds the third weight stage's lookahead is worth more than a round less. */
template <template <int, int, int> class K, int T, int P>
td_err launch_rounds(const ops_mm_out *mm, int n, const mm_xquant *xq, const mm_device *dev,
                     cudaStream_t st)
{
    constexpr int TTMAX = K<T, P, 4>::WS >= 3   ? 4
                          : K<T, P, 3>::WS >= 3 ? 3
                          : K<T, P, 2>::WS >= 3 ? 2
                                                : 1;
    constexpr bool SHARE3 = TTMAX == 2 && K<T, P, 3>::SHARE3 && K<T, P, 3>::WS >= 2;
    const mm_set set = mm_set_of(mm, n, MROWS);
    const ops_weight *w = mm[0].w;
    int64_t grid = 0;
    int tt = mmqb_tiles_per_round(set.first[n], dev->n_sm, TTMAX, &grid);
    if (SHARE3 && (set.first[n] + grid - 1) / grid == 3)
        tt = 3;
    if (grid > 0x7fffffff || w->row_bytes > ((size_t)1 << 26)) /* 32-bit row offsets */
        return err_set(TD_ENOTSUP, "cuda_matmul: a %lld x %lld matrix is too large",
                       (long long)w->rows, (long long)w->cols);
    if (tt <= 1)
        return launch_k<K<T, P, 1>, T>(mm, set, xq, dev, grid, st);
    if constexpr (TTMAX >= 2) {
        if (tt == 2)
            return launch_k<K<T, P, 2>, T>(mm, set, xq, dev, grid, st);
    }
    if constexpr (TTMAX >= 3 || SHARE3) {
        if (tt == 3)
            return launch_k<K<T, P, 3>, T>(mm, set, xq, dev, grid, st);
    }
    if constexpr (TTMAX >= 4)
        return launch_k<K<T, P, 4>, T>(mm, set, xq, dev, grid, st);
    return err_set(TD_EINVAL, "cuda_matmul: no %s kernel for %d tiles per round",
                   K<T, P, 1>::name(), tt);
}

template <int T>
td_err launch_type(const ops_mm_out *mm, int n, const mm_xquant *xq, const mm_device *dev,
                   cudaStream_t st)
{
    switch (xq->n_pad) {
    case 8: /* one n-tile: half the MMAs and scale products of 16 tokens, the same unpacking */
        return launch_rounds<window_kernel, T, 1>(mm, n, xq, dev, st);
    case 16:
        return launch_rounds<window_kernel, T, 2>(mm, n, xq, dev, st);
    case 32:
        return launch_rounds<wide_kernel, T, 2>(mm, n, xq, dev, st);
    default:
        TD_ASSERT(xq->n_pad == 64);
        return launch_rounds<wide_kernel, T, 4>(mm, n, xq, dev, st);
    }
}

} /* namespace */

bool mm_rows_map_ok(void)
{
    return encoder() != NULL;
}

td_err mm_rows_map(CUtensorMap *map, const ops_weight *w, int elem, int per, unsigned box_x,
                   unsigned box_y)
{
    const uint64_t pitch = (uint64_t)per * w->row_bytes; /* bytes per tensor row */
    TD_ASSERT((elem == 1 || elem == 8) && per >= 1 && pitch % 16 == 0 && w->rows % per == 0);
    const encode_fn enc = encoder();
    if (!enc)
        return err_set(TD_ENOTSUP, "cuda_matmul: the driver encodes no tensor maps");
    const cuuint64_t dim[2] = {(cuuint64_t)(pitch / elem), (cuuint64_t)(w->rows / per)};
    const cuuint64_t stride[1] = {(cuuint64_t)pitch};
    const cuuint32_t box[2] = {box_x, box_y}, estride[2] = {1, 1};
    const CUresult r =
        enc(map, elem == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT64, 2,
            (void *)w->data, dim, stride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return err_set(TD_ECUDA, "cuda_matmul: the tensor map of a %lld x %lld %s matrix was "
                       "refused (driver error %d)", (long long)w->rows, (long long)w->cols,
                       dtype_name(w->type), (int)r);
    return TD_OK;
}

bool mmqb_supported(const ops_weight *w, int n_pad)
{
    int arch = 0, optin = 0;
    if (device_caps(&arch, &optin) != TD_OK) {
        (void)cudaGetLastError();
        return false;
    }
    /* the layouts fill up to SMEM_MAX (an H100/H200 block's opt-in); a device that offers a
     * block less (sm_120: 99 KiB) keeps the tensor-core kernel */
    return arch >= 900 && optin >= SMEM_MAX && ((uintptr_t)w->data & 15) == 0 &&
           (n_pad == 8 || n_pad == 16 || n_pad == 32 || n_pad == 64) &&
           w->cols % MM_XBLOCK == 0 &&
           (w->type == TD_Q6_K || /* rows one by one where they cannot be paired */
            ((w->type == TD_Q4_K || w->type == TD_Q5_K) && mm_rows_map_ok()));
}

td_err mmqb_launch(const ops_mm_out *mm, int n, const mm_xquant *xq, const mm_device *dev,
                   cudaStream_t st)
{
    TD_ASSERT(xq->n_tok >= 1 && xq->n_tok <= xq->n_pad);
    TD_ASSERT(n >= 1 && n <= MM_SET_MAX);
    const ops_weight *w = mm[0].w;
    for (int i = 0; i < n; i++)
        TD_ASSERT(mmqb_supported(mm[i].w, xq->n_pad) && mm[i].w->type == w->type &&
                  mm[i].w->cols == w->cols);
    switch (w->type) {
    case TD_Q5_K:
        return launch_type<TD_Q5_K>(mm, n, xq, dev, st);
    case TD_Q6_K:
        return launch_type<TD_Q6_K>(mm, n, xq, dev, st);
    default:
        return launch_type<TD_Q4_K>(mm, n, xq, dev, st);
    }
}
