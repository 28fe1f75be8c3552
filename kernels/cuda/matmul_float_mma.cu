/* y = x . W^T for F16 and BF16 weights on the tensor cores: exact products, f32 sums.
 *
 * Why tensor cores: 16 or 32 tokens on f32 FMAs cost 16-32 FMAs per 2-byte weight, 6-15x the
 * time of streaming the weights (the DFlash drafter's 16-position step is all BF16 matmuls).
 * Why not round the activations to bf16: float models are held to ~1e-4 of the logit range
 * against transformers. So each f32 activation is split exactly into three bf16 pieces,
 * x = h + m + l (h = x with its low 16 bits cleared, m likewise of x - h, l = the rest: 8 + 8
 * + 8 significant bits, exact for every normal f32), and each weight fragment meets the three
 * pieces in three mma.sync m16n8k16 bf16 MMAs with f32 accumulation. A bf16 x bf16 product is
 * exact in f32, so only the accumulation rounds. F16 weights are split the same way into two
 * bf16 pieces (11 significant bits = 8 + 3, and every f16 is in bf16's exponent range): six
 * MMAs. At <= 32 tokens the weights' DRAM read still dominates the MMAs.
 *
 * Fragments: weights are the MMA's A (16 rows), tokens its B (8 per n-tile, zero-padded).
 * Lane (g = lane/4, t = lane%4) loads 16 bytes (8 weights) of rows g and g+8 at columns
 * c + 8t of each 32-column chunk c, so a warp-wide load reads 64 contiguous bytes of 8 rows.
 * Which k slot a column occupies is free as long as A and B agree: the chunk's first MMA
 * takes columns 8t..8t+3 (k slots 2t, 2t+1, 2t+8, 2t+9), the second 8t+4..8t+7, so the A
 * registers are the loaded words as they are, and the B registers are pairs of the same
 * lane's 8 activations of token g. The activations are split once per call (split_kernel)
 * into a per-stream scratch laid out so that those pairs, per piece, are one 16-byte load:
 * the split used to be redone by every warp for every n-tile and k-block (176 of ~650
 * instructions per k-block at 16 tokens).
 *
 * Reduction order per (row, token), the same for every n_tok (batch invariance): the columns
 * are cut into k-blocks of 128; CTA = 4 warps over one 16-row tile, warp w owns k-blocks w,
 * w+4, ... in increasing order. Per k-block a zeroed accumulator takes, for chunks 0..3, the
 * first MMA then the second, each as pieces h, m, l (F16: weight hi then lo for each piece);
 * the k-block's sum is then added in f32 (`__fadd_rn`) to the warp's total, so no tensor-core
 * chain is longer than 24 (F16: 48) MMAs; finally y = ((p0 + p1) + p2) + p3 over the warps.
 * An output element of an MMA depends only on its own row, column and accumulator, so the
 * n-tiles a launch has, and which n-tile or column a token occupies, never change it; one
 * token runs the same arithmetic (7 of 8 columns wasted, still bandwidth-bound): every
 * variant calls kblock_mma, and only how the weights reach the registers differs (mmh_kernel).
 *
 * Special values: a NaN activation gives NaN outputs for its token; an infinite one gives
 * NaN too (inf - inf in the split), where the CPU may give an infinity. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul_internal.h"
#include "kernels/cuda/stream_buf.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MMB_SM90 1
#else
#define MMB_SM90 0
#endif
#include "kernels/cuda/matmul_bulk_copy.cuh"

namespace {

constexpr int WARPS = 4;      /* warps per CTA, splitting the tile's k-blocks */
constexpr int TILE = 16;      /* weight rows per CTA: the MMA's M */
constexpr int KBLOCK = 128;   /* columns per k-block: one tensor-core chain */
constexpr int CHUNKS = KBLOCK / 32;
constexpr int MAX_NT = 4;     /* n-tiles (8 tokens each) per CTA */
constexpr int STAGES = 3;     /* k-blocks in a warp's weight ring: 2 in flight while 1 is used */
constexpr int RING = STAGES * CHUNKS * 2 * 32; /* uint4 per warp: [stage][chunk][row][lane] */
/* Pieces of each activation: XP_EXACT (h, m, l: x exactly) or XP_BF16 (x rounded to bf16,
 * the weight's x_bf16). */
constexpr int XP_EXACT = 3, XP_BF16 = 1;
/* uint4 of split activations per (n-tile, chunk) */
template <int XP> __host__ __device__ constexpr int xs_chunk()
{
    return XP * 32;
}

/* The high halves of a and b as one bf16 pair (a in the low half). */
__device__ __forceinline__ uint32_t pack_hi(uint32_t a, uint32_t b)
{
    return __byte_perm(a, b, 0x7632);
}

__device__ __forceinline__ float clear_lo(float v)
{
    return __uint_as_float(__float_as_uint(v) & 0xffff0000u);
}

/* x0, x1 -> bf16 pairs h, m, l with x = h + m + l exactly: h is x truncated to 8
 * significant bits, so x - h has at most 16 and is exact in f32; m truncates that to 8 and
 * the rest l has at most 8, so its f32 bits are exactly a bf16 (for |x| >= 2^-110). */
__device__ __forceinline__ void split_x(float x0, float x1, uint32_t &h, uint32_t &m,
                                        uint32_t &l)
{
    const float r0 = __fsub_rn(x0, clear_lo(x0)), r1 = __fsub_rn(x1, clear_lo(x1));
    const float l0 = __fsub_rn(r0, clear_lo(r0)), l1 = __fsub_rn(r1, clear_lo(r1));
    h = pack_hi(__float_as_uint(x0), __float_as_uint(x1));
    m = pack_hi(__float_as_uint(r0), __float_as_uint(r1));
    l = pack_hi(__float_as_uint(l0), __float_as_uint(l1));
}

/* Two f16 weights -> bf16 pairs hi, lo with w = hi + lo exactly (11 = 8 + 3 bits). */
__device__ __forceinline__ void split_f16(uint32_t w, uint32_t &hi, uint32_t &lo)
{
    const float f0 = __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
    const float f1 = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
    const float l0 = __fsub_rn(f0, clear_lo(f0)), l1 = __fsub_rn(f1, clear_lo(f1));
    hi = pack_hi(__float_as_uint(f0), __float_as_uint(f1));
    lo = pack_hi(__float_as_uint(l0), __float_as_uint(l1));
}

/* 16 bytes global -> shared, L1 bypassed; src_bytes = 0 reads nothing and writes zeros. */
__device__ __forceinline__ void cp_async16(uint4 *dst, const void *src, int src_bytes)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* All but the newest N groups of this thread's copies have landed and are visible to it. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Weights row[col..col+7] into registers (zeros past cols or for a missing row), read once:
 * not kept in L1, which holds the activations. Aligned rows, cols % 8 == 0. */
__device__ __forceinline__ uint4 load_w_vec(const uint8_t *row, int col, int cols)
{
    if (row == nullptr || col >= cols)
        return make_uint4(0, 0, 0, 0);
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(row + 2 * (size_t)col));
    return v;
}

/* Weights row[col..col+7] by scalar loads (zeros past cols or for a missing row): the path
 * for rows that are not 16-byte aligned or cols % 8 != 0. */
__device__ __forceinline__ uint4 load_w_scalar(const uint8_t *row, int col, int cols)
{
    uint16_t h[8];
#pragma unroll
    for (int e = 0; e < 8; e++)
        h[e] = row != nullptr && col + e < cols
                   ? __ldg((const unsigned short *)row + col + e)
                   : (uint16_t)0;
    uint4 v;
    memcpy(&v, h, sizeof v);
    return v;
}

/* The pieces of one chunk for one n-tile: xp[0..XP) = h, m, l of this lane's 8 activations
 * (pairs of columns 8t + 2e, 8t + 2e + 1 in .x .. .w), from the split layout (mmh_split);
 * XP_BF16: xp[0] = the activations rounded to bf16. */
template <int XP> __device__ __forceinline__ void load_xs(uint4 (&xp)[XP], const uint4 *at)
{
#pragma unroll
    for (int p = 0; p < XP; p++)
        xp[p] = __ldg(at + p * 32);
}

/* The A fragments of one chunk from rows g and g+8 (w[0], w[1]): a[q][p] for the chunk's
 * MMA q (columns 8t + 4q..) and weight piece p (BF16: the weights; F16: hi, lo). */
template <int T> struct wfrag {
    static constexpr int P = T == TD_F16 ? 2 : 1;
    uint32_t a[2][P][4];
};

template <int T> __device__ __forceinline__ wfrag<T> make_frag(const uint4 (&w)[2])
{
    wfrag<T> f;
    const uint32_t g0[4] = {w[0].x, w[0].y, w[0].z, w[0].w};
    const uint32_t g8[4] = {w[1].x, w[1].y, w[1].z, w[1].w};
#pragma unroll
    for (int q = 0; q < 2; q++) {
        /* a0a1: row g, k slots 2t, 2t+1; a2a3: row g+8, same; a4a5 / a6a7: slots 2t+8.. */
        const uint32_t raw[4] = {g0[2 * q], g8[2 * q], g0[2 * q + 1], g8[2 * q + 1]};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (T == TD_F16)
                split_f16(raw[i], f.a[q][0][i], f.a[q][1][i]);
            else
                f.a[q][0][i] = raw[i];
        }
    }
    return f;
}

/* One chunk: blk[nt] += the chunk's two MMAs, each as pieces h, m, l (XP_BF16: the one
 * rounded piece) of token g's 8 activations xp[nt] (F16: weight hi then lo per piece), for
 * the live n-tiles. */
template <int T, int NT, int XP>
__device__ __forceinline__ void chunk_mma(float (&blk)[NT][4], const wfrag<T> &f,
                                          const uint4 (&xp)[NT][XP], int nt_live)
{
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        if (nt >= nt_live)
            break;
#pragma unroll
        for (int q = 0; q < 2; q++) {
#pragma unroll
            for (int x = 0; x < XP; x++) {
                /* pairs of columns 8t + 4q + 2e, + 1 (e = 0, 1) */
                const uint32_t b0 = q == 0 ? xp[nt][x].x : xp[nt][x].z;
                const uint32_t b1 = q == 0 ? xp[nt][x].y : xp[nt][x].w;
#pragma unroll
                for (int p = 0; p < wfrag<T>::P; p++)
                    mm_mma_bf16(blk[nt], f.a[q][p], b0, b1);
            }
        }
    }
}

/* xp = the pieces of chunks j0 .. j0 + J - 1 of k-block kb, for the live n-tiles. xs points at
 * this lane's pieces of chunk 0 of the CTA's first n-tile (mmh_split layout: chunk stride
 * xs_chunk<XP>(), n-tile stride xs_tile uint4). */
template <int J, int NT, int XP>
__device__ __forceinline__ void load_chunks(uint4 (&xp)[J][NT][XP], const uint4 *xs,
                                            size_t xs_tile, int kb, int j0, int nt_live)
{
#pragma unroll
    for (int jj = 0; jj < J; jj++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            if (nt < nt_live)
                load_xs(xp[jj][nt], xs + nt * xs_tile + (size_t)(kb * CHUNKS + j0 + jj) *
                                                            xs_chunk<XP>());
}

/* A k-block's accumulator, zeroed; added to the warp's total in f32 once the k-block is done. */
template <int NT> __device__ __forceinline__ void blk_zero(float (&blk)[NT][4])
{
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            blk[nt][e] = 0.0f;
}
template <int NT>
__device__ __forceinline__ void blk_fold(float (&tot)[NT][4], const float (&blk)[NT][4])
{
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            tot[nt][e] = __fadd_rn(tot[nt][e], blk[nt][e]);
}

/* tot[nt] += one k-block (weights wv of chunks 0..3, k-block kb): a zeroed accumulator takes
 * the chunks in order, then one f32 add (xs as in load_chunks). The pieces of JG chunks are
 * loaded before the first of them is used, so their latencies overlap. */
template <int T, int NT, int JG, int XP>
__device__ __forceinline__ void kblock_mma(float (&tot)[NT][4], const uint4 (&wv)[CHUNKS][2],
                                           const uint4 *xs, size_t xs_tile, int kb,
                                           int nt_live)
{
    float blk[NT][4];
    blk_zero(blk);
#pragma unroll
    for (int jg = 0; jg < CHUNKS; jg += JG) {
        uint4 xp[JG][NT][XP];
        load_chunks(xp, xs, xs_tile, kb, jg, nt_live);
#pragma unroll
        for (int jj = 0; jj < JG; jj++)
            chunk_mma<T, NT, XP>(blk, make_frag<T>(wv[jg + jj]), xp[jj], nt_live);
    }
    blk_fold(tot, blk);
}

/* kblock_mma<T, 2, 2> with the activation loads moved ahead (W_AHEAD): xa holds chunks 0 and 1
 * of k-block kb (loaded while the k-block before multiplied its chunks 2 and 3); chunks 2 and 3
 * load while 0 and 1 multiply, and then, when `more`, xa takes chunks 0 and 1 of k-block
 * kb + WARPS. The MMAs and adds are kblock_mma's, in its order. */
template <int T, int XP>
__device__ __forceinline__ void kblock_mma_ahead(float (&tot)[2][4], const uint4 (&wv)[CHUNKS][2],
                                                 uint4 (&xa)[2][2][XP], const uint4 *xs,
                                                 size_t xs_tile, int kb, bool more, int nt_live)
{
    float blk[2][4];
    blk_zero(blk);
    uint4 xb[2][2][XP];
    load_chunks(xb, xs, xs_tile, kb, 2, nt_live);
#pragma unroll
    for (int jj = 0; jj < 2; jj++)
        chunk_mma<T, 2, XP>(blk, make_frag<T>(wv[jj]), xa[jj], nt_live);
    if (more)
        load_chunks(xa, xs, xs_tile, kb + WARPS, 0, nt_live);
#pragma unroll
    for (int jj = 0; jj < 2; jj++)
        chunk_mma<T, 2, XP>(blk, make_frag<T>(wv[2 + jj]), xb[jj], nt_live);
    blk_fold(tot, blk);
}

/* --- sm_90 bulk copies into per-warp rings (9-16 tokens) ---------------------------------- */

constexpr int BSTAGES = 3;                     /* k-blocks in a warp's bulk ring */
constexpr int BROW = KBLOCK * 2;               /* bytes of one row's k-block */
constexpr int BPAIR = 2 * BROW + 64;           /* bytes of rows 2i, 2i + 1 in a stage */
constexpr int BSTAGE = TILE / 2 * BPAIR;       /* bytes of one stage: 16 rows, 4608 */
constexpr int BHDR = 128;                      /* bytes of barriers before the rings */
constexpr int BSMEM = BHDR + WARPS * BSTAGES * BSTAGE; /* dynamic shared bytes per CTA */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* Where row r of a stage starts: rows 2i and 2i + 1 sit 320 bytes apart (64 modulo 128), so
 * the 8 lanes of one shared-load phase (rows g = 2i, 2i + 1, 64 bytes each) hit distinct
 * banks; 256-byte slots would put both rows on the same 16 banks (two-way conflict). */
__device__ __forceinline__ int brow_off(int r)
{
    return (r >> 1) * BPAIR + (r & 1) * (BROW + 64);
}

/* barriers, waits and bulk copies: kernels/cuda/matmul_bulk_copy.cuh */
#endif

/* --- the matmul kernel ---------------------------------------------------------------------- */

/* How a CTA's weights arrive: scalar loads (misaligned rows or cols % 8 != 0), 16-byte
 * register loads one k-block ahead (W_AHEAD, 9-16 tokens: the activations too, half a k-block
 * ahead), a per-warp cp.async ring, or (sm_90) a per-warp ring fed by bulk copies. */
enum wpath { W_SCALAR, W_REGS, W_RING, W_BULK, W_AHEAD };

/* CTAs per SM the registers must allow: with rings 4, as many as the 48 KB cp.async rings
 * (55 KB bulk rings) fit on an H100/H200; otherwise no limit (the register path was measured
 * so). */
template <int P> constexpr int min_ctas()
{
    return P == W_RING || P == W_BULK ? 4 : 1;
}

/* grid: (row tiles x token groups of NT * 8), token group fastest so the CTAs sharing a
 * tile's weights run together; the tiles are the set's members' 16-row tiles numbered one
 * member after the other (mm_set: a tile never spans two members, so every (row, token) is
 * computed as in a launch of its member alone); block: WARPS warps, warp kw on k-blocks kw,
 * kw + WARPS, ...
 * xs: the activations split by split_kernel (layout at mmh_split_bytes), nch chunks per
 * n-tile. W_RING: each lane copies its own 16-byte pieces of a k-block into its warp's ring
 * (cp.async, one group per k-block) and reads back only what it copied, so no barrier is
 * needed; STAGES - 1 k-blocks stay in flight while one is used. W_BULK (sm_90): lane 0 copies
 * a whole k-block of the tile's rows (one 256-byte bulk copy per row) into the warp's ring,
 * completing on that stage's mbarrier, BSTAGES k-blocks ahead; the matrix's partial last
 * k-block (cols % 128 != 0) comes by register loads, so no stage ever holds stale columns.
 * W_REGS: the next k-block's weights load into registers while this one is multiplied. Which
 * path a launch takes never changes a result: the arithmetic is kblock_mma's either way.
 * Dynamic shared memory: the rings (W_RING: WARPS * RING uint4; W_BULK: BSMEM bytes) reused
 * for the warp partials at the end, else the partials. */
template <int T, int NT, int P, int XP>
__global__ void __launch_bounds__(WARPS * 32, (min_ctas<P>()))
    mmh_kernel(bool early, mm_set set, size_t row_bytes, int cols, const uint4 *xs, int nch,
               int n_tok, int n_groups)
{
    pdl_enter(early);
    extern __shared__ uint4 smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t tile = (int64_t)(blockIdx.x / n_groups);
    const int mem = mm_set_member(&set, tile);
    float *y = set.y[mem];
    const uint8_t *w = set.w[mem];
    const int64_t rows = set.rows[mem], r0 = (tile - set.first[mem]) * TILE;
    const int tok0 = (int)(blockIdx.x % n_groups) * NT * 8;
    const int nkb = (cols + KBLOCK - 1) / KBLOCK;
    const int n_mine = nkb > warp ? (nkb - warp + WARPS - 1) / WARPS : 0; /* my k-blocks */
    const uint8_t *wrow[2] = {r0 + g < rows ? w + (size_t)(r0 + g) * row_bytes : nullptr,
                              r0 + g + 8 < rows ? w + (size_t)(r0 + g + 8) * row_bytes
                                                : nullptr};
    /* this lane's pieces of chunk 0 of the CTA's first n-tile */
    const size_t xs_tile = (size_t)nch * xs_chunk<XP>();
    const uint4 *xl = xs + (size_t)(tok0 / 8) * xs_tile + lane;
    int nt_live = 0; /* n-tiles holding a real token (warp-uniform) */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        nt_live += tok0 + 8 * nt < n_tok;
    float tot[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            tot[nt][e] = 0.0f;

    if constexpr (P == W_RING) {
        uint4 *ring = smem + warp * RING + lane;
        /* the i-th of my k-blocks into ring stage i % STAGES (nothing past the last) */
        auto issue = [&](int i) {
            if (i < n_mine) {
                const int kb = warp + WARPS * i;
#pragma unroll
                for (int j = 0; j < CHUNKS; j++)
#pragma unroll
                    for (int rr = 0; rr < 2; rr++) {
                        const int col = kb * KBLOCK + 32 * j + 8 * t;
                        const bool ok = wrow[rr] != nullptr && col < cols;
                        cp_async16(ring + (((i % STAGES) * CHUNKS + j) * 2 + rr) * 32,
                                   ok ? wrow[rr] + 2 * (size_t)col : w, ok ? 16 : 0);
                    }
            }
            cp_async_commit(); /* empty groups keep the count uniform */
        };
#pragma unroll
        for (int i = 0; i < STAGES - 1; i++)
            issue(i);
        for (int i = 0; i < n_mine; i++) {
            issue(i + STAGES - 1);
            cp_async_wait<STAGES - 1>(); /* k-block i has landed (this lane's copies) */
            uint4 cur[CHUNKS][2];
#pragma unroll
            for (int j = 0; j < CHUNKS; j++)
#pragma unroll
                for (int rr = 0; rr < 2; rr++)
                    cur[j][rr] = ring[(((i % STAGES) * CHUNKS + j) * 2 + rr) * 32];
            kblock_mma<T, NT, NT == 1 ? CHUNKS : 2, XP>(tot, cur, xl, xs_tile,
                                                        warp + WARPS * i, nt_live);
        }
        cp_async_wait<0>(); /* only empty groups remain; nothing may land after the barrier */
    } else if constexpr (P == W_BULK) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        uint64_t *bar = (uint64_t *)smem + warp * BSTAGES; /* [BSTAGES] this warp's */
        uint8_t *ring = (uint8_t *)smem + BHDR + warp * BSTAGES * BSTAGE;
        const int nfull = cols / KBLOCK;                  /* k-blocks of 128 columns */
        const int n_ring = nfull > warp ? (nfull - warp + WARPS - 1) / WARPS : 0;
        const int nr = rows - r0 < TILE ? (int)(rows - r0) : TILE; /* rows copied */
        const uint64_t policy = evict_first_policy();
        if (lane == 0) {
            for (int s = 0; s < BSTAGES; s++)
                bar_init(&bar[s], 1);
            bar_init_fence();
        }
        __syncwarp();
        /* the i-th of my full k-blocks into stage i % BSTAGES: lane 0 announces the bytes
         * (the phase's one arrival), then lane r < nr copies row r, so the lanes compute
         * their addresses side by side and the copies issue back to back. Rows past the
         * matrix are not copied (their outputs are never written, and an MMA row depends on
         * its A row only). */
        const uint8_t *my_row = w + (size_t)(r0 + (lane < nr ? lane : 0)) * row_bytes;
        const int my_off = brow_off(lane & (TILE - 1));
        auto issue = [&](int i) {
            if (i < n_ring) {
                const int s = i % BSTAGES;
                if (lane == 0)
                    bar_arrive_tx(&bar[s], (uint32_t)(nr * BROW));
                __syncwarp(); /* the bytes are announced before any copy can complete */
                if (lane < nr)
                    bulk_copy(ring + s * BSTAGE + my_off,
                              my_row + (size_t)(warp + WARPS * i) * BROW, BROW, &bar[s],
                              policy);
            }
        };
#pragma unroll
        for (int i = 0; i < BSTAGES; i++)
            issue(i);
        for (int i = 0; i < n_mine; i++) {
            const int kb = warp + WARPS * i;
            uint4 cur[CHUNKS][2];
            if (i < n_ring) {
                const int s = i % BSTAGES;
                bar_wait(&bar[s], (uint32_t)(i / BSTAGES) & 1);
                const uint8_t *st = ring + s * BSTAGE + 16 * t;
#pragma unroll
                for (int j = 0; j < CHUNKS; j++)
#pragma unroll
                    for (int rr = 0; rr < 2; rr++)
                        cur[j][rr] = *(const uint4 *)(st + brow_off(g + 8 * rr) + 64 * j);
                __syncwarp(); /* every lane holds its words before the stage is refilled */
                issue(i + BSTAGES);
            } else { /* the partial last k-block */
#pragma unroll
                for (int j = 0; j < CHUNKS; j++)
#pragma unroll
                    for (int rr = 0; rr < 2; rr++)
                        cur[j][rr] = load_w_vec(wrow[rr], kb * KBLOCK + 32 * j + 8 * t, cols);
            }
            kblock_mma<T, NT, 1, XP>(tot, cur, xl, xs_tile, kb, nt_live);
        }
#else
        __trap(); /* the host launches W_BULK on sm_90+ only */
#endif
    } else if constexpr (P == W_REGS || P == W_AHEAD) {
        uint4 cur[CHUNKS][2];
#pragma unroll
        for (int j = 0; j < CHUNKS; j++)
#pragma unroll
            for (int rr = 0; rr < 2; rr++)
                cur[j][rr] = load_w_vec(wrow[rr], warp * KBLOCK + 32 * j + 8 * t, cols);
        uint4 xa[2][NT][XP]; /* W_AHEAD: chunks 0 and 1 of the next k-block */
        if constexpr (P == W_AHEAD) {
            static_assert(NT == 2, "W_AHEAD serves 9-16 tokens");
            if (warp < nkb)
                load_chunks(xa, xl, xs_tile, warp, 0, nt_live);
        }
        for (int kb = warp; kb < nkb; kb += WARPS) {
            uint4 nxt[CHUNKS][2];
#pragma unroll
            for (int j = 0; j < CHUNKS; j++)
#pragma unroll
                for (int rr = 0; rr < 2; rr++)
                    nxt[j][rr] =
                        load_w_vec(wrow[rr], (kb + WARPS) * KBLOCK + 32 * j + 8 * t, cols);
            /* 9-16 tokens: two chunks' activations loaded together (5120x17408 BF16 at 16
             * tokens 79.3 -> 75.0 us on an H200), or ahead; 17-64 tokens have no registers to
             * spare */
            if constexpr (P == W_AHEAD)
                kblock_mma_ahead<T, XP>(tot, cur, xa, xl, xs_tile, kb, kb + WARPS < nkb,
                                        nt_live);
            else
                kblock_mma<T, NT, NT == 2 ? 2 : 1, XP>(tot, cur, xl, xs_tile, kb, nt_live);
#pragma unroll
            for (int j = 0; j < CHUNKS; j++)
#pragma unroll
                for (int rr = 0; rr < 2; rr++)
                    cur[j][rr] = nxt[j][rr];
        }
    } else {
        for (int kb = warp; kb < nkb; kb += WARPS) {
            uint4 cur[CHUNKS][2];
#pragma unroll
            for (int j = 0; j < CHUNKS; j++)
#pragma unroll
                for (int rr = 0; rr < 2; rr++)
                    cur[j][rr] = load_w_scalar(wrow[rr], kb * KBLOCK + 32 * j + 8 * t, cols);
            kblock_mma<T, NT, 1, XP>(tot, cur, xl, xs_tile, kb, nt_live);
        }
    }

    /* The warp partials [warp][token][row] (in the rings' memory once every warp is done
     * with its ring; W_BULK: after the barriers). c0, c1: row g, tokens 2t, 2t+1 of the
     * n-tile; c2, c3: row g + 8. */
    __syncthreads();
    float *red = (float *)((uint8_t *)smem + (P == W_BULK ? BHDR : 0));
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            red[(warp * NT * 8 + 8 * nt + 2 * t + (e & 1)) * TILE + g + 8 * (e >> 1)] =
                tot[nt][e];
    __syncthreads();
    for (int i = threadIdx.x; i < NT * 8 * TILE; i += WARPS * 32) {
        const int tt = i / TILE, r = i % TILE;
        if (r0 + r < rows && tok0 + tt < n_tok) {
            float v = red[tt * TILE + r];
#pragma unroll
            for (int k = 1; k < WARPS; k++)
                v = __fadd_rn(v, red[(k * NT * 8 + tt) * TILE + r]);
            y[(size_t)(tok0 + tt) * rows + r0 + r] = v;
        }
    }
}

/* --- the activation split -------------------------------------------------------------------- */

/* Bytes of the split activations of n_tok tokens of cols inputs: per n-tile of 8 tokens and
 * 32-column chunk c (nch = 4 * ceil(cols / 128) chunks, the k-blocks' whole width), three
 * pieces p = h, m, l (XP_BF16: one, x rounded) of 32 uint4, one per lane (g, t): the pairs of
 * columns 32c + 8t + 2e, + 1 (e = 0..3) of token 8 * tile + g. So lane (g, t)'s B registers
 * of an MMA piece are one 16-byte load, a warp's load is 512 contiguous bytes, and tokens
 * n_tok.. and columns cols.. are zeros. Sized for three pieces. */
size_t mmh_split_bytes(int64_t n_tok, int64_t cols)
{
    const size_t nch = (size_t)(cols + KBLOCK - 1) / KBLOCK * CHUNKS;
    return (size_t)((n_tok + 7) / 8) * nch * xs_chunk<XP_EXACT>() * sizeof(uint4);
}

/* One thread per (n-tile, chunk, lane): x's 8 inputs of that lane, split by split_x (the
 * arithmetic the matmul kernel did in registers before, so the same words), or XP_BF16
 * rounded to bf16 (nearest even, as ops_f32_to_bf16). VEC: x 16-byte aligned and
 * cols % 8 == 0. */
template <bool VEC, int XP>
__global__ void __launch_bounds__(256)
    split_kernel(bool early, uint4 *xs, const float *x, int cols, int n_tok, int nch,
                 int64_t n_items)
{
    pdl_enter(early);
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_items)
        return;
    const int lane = (int)(i & 31), g = lane >> 2, t = lane & 3;
    const int64_t tc = i >> 5; /* n-tile * nch + chunk */
    const int tok = (int)(tc / nch) * 8 + g, col = (int)(tc % nch) * 32 + 8 * t;
    float v[8];
    if (tok >= n_tok || col >= cols) {
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[e] = 0.0f;
    } else if constexpr (VEC) {
        const float *xt = x + (size_t)tok * cols + col;
        const float4 a = __ldg((const float4 *)xt), b = __ldg((const float4 *)xt + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        const float *xt = x + (size_t)tok * cols;
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[e] = col + e < cols ? __ldg(xt + col + e) : 0.0f;
    }
    uint4 *out = xs + tc * xs_chunk<XP>() + lane;
    if constexpr (XP == XP_BF16) {
        uint32_t r[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
            memcpy(&r[e], &b, sizeof r[e]);
        }
        out[0] = make_uint4(r[0], r[1], r[2], r[3]);
    } else {
        uint32_t h[4], m[4], l[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            split_x(v[2 * e], v[2 * e + 1], h[e], m[e], l[e]);
        out[0] = make_uint4(h[0], h[1], h[2], h[3]);
        out[32] = make_uint4(m[0], m[1], m[2], m[3]);
        out[64] = make_uint4(l[0], l[1], l[2], l[3]);
    }
}

/* The split activations, one buffer per (device, stream) (stream_buf.cuh). */
stream_bufs g_xs = STREAM_BUFS_INIT("F16/BF16 matmul: split activations");

/* xs = the split of x[n_tok][cols] into XP pieces (layout at mmh_split_bytes), one launch. */
template <int XP>
td_err split_launch(uint4 *xs, const float *x, int cols, int n_tok, cudaStream_t st)
{
    const int nch = (cols + KBLOCK - 1) / KBLOCK * CHUNKS;
    const int64_t n_items = (int64_t)((n_tok + 7) / 8) * nch * 32;
    const unsigned grid = (unsigned)((n_items + 255) / 256);
    if (((uintptr_t)x & 15) == 0 && cols % 8 == 0)
        return pdl_launch<split_kernel<true, XP>>("F16/BF16 activation split", dim3(grid),
                                                  dim3(256), 0, st, xs, x, cols, n_tok, nch,
                                                  n_items);
    return pdl_launch<split_kernel<false, XP>>("F16/BF16 activation split", dim3(grid),
                                               dim3(256), 0, st, xs, x, cols, n_tok, nch,
                                               n_items);
}

/* --- launches -------------------------------------------------------------------------------- */

/* One launch over the set's members (one type, width and row length; w: the first). */
template <int T, int NT, int P, int XP>
td_err launch(const mm_set &set, const uint4 *xs, const ops_weight *w, int n_tok, int dev,
              cudaStream_t st)
{
    const int n_groups = (n_tok + NT * 8 - 1) / (NT * 8);
    const int64_t n_cta = set.first[set.n] * n_groups;
    if (n_cta > 0x7fffffff)
        return err_set(TD_ENOTSUP, "matmul of %lld row tiles needs more CTAs than a grid holds",
                       (long long)set.first[set.n]);
    const int nch = (int)((w->cols + KBLOCK - 1) / KBLOCK * CHUNKS);
    /* 48 KB for the cp.async rings (the most a launch gets without opting in), BSMEM for the
     * bulk rings, else the partials */
    const size_t ring = (size_t)WARPS * RING * sizeof(uint4);
    const size_t red = (size_t)WARPS * NT * 8 * TILE * sizeof(float);
    if constexpr (P == W_BULK) {
        const td_err e = smem_optin<mmh_kernel<T, NT, P, XP>>(dev, BSMEM);
        if (e != TD_OK)
            return e;
    }
    (void)dev;
    return pdl_launch<mmh_kernel<T, NT, P, XP>>(
        "F16/BF16 matmul", dim3((unsigned)n_cta), dim3(WARPS * 32),
        P == W_RING ? ring : P == W_BULK ? (size_t)BSMEM : red, st, set, w->row_bytes,
        (int)w->cols, xs, nch, n_tok, n_groups);
}

/* How 9-16 tokens of aligned weights arrive: with TANDEM_MMH=bulk (sm_90+) the bulk rings,
 * with =ahead or =regs that path (read at each call, so a test can compare the paths; all
 * give the same bits); by default W_AHEAD for a grid of at least AHEAD_CTAS CTAs per SM,
 * else W_REGS. W_AHEAD needs 202 registers (F16 208), so 2 CTAs per SM against W_REGS' 3:
 * it wins where the grid is large enough for that not to cost a wave. H200, BF16 at 16
 * tokens: 5120 -> 10240 50.0 -> 45.3 us, 5120 -> 12288 52.1 -> 46.7, 5120 -> 17408 75.0 ->
 * 72.5 (640, 768, 1088 CTAs), but 17408 -> 5120 80.4 -> 88.7 and 6144 -> 5120 31.0 -> 35.5
 * (320 CTAs). The bulk rings are not the default: the 27B draft step took 4.04 ms with them
 * against 3.51 ms with register loads. */
constexpr int AHEAD_CTAS = 4;

wpath mid_path(int dev, int64_t n_cta)
{
    int sms = 0;
    if (sm_count(dev, &sms) != TD_OK) {
        err_clear();
        return W_REGS;
    }
    const char *e = getenv("TANDEM_MMH");
    if (e && strcmp(e, "bulk") == 0 && code_arch(dev) >= 900)
        return W_BULK;
    if (e && strcmp(e, "ahead") == 0)
        return W_AHEAD;
    if (e && strcmp(e, "regs") == 0)
        return W_REGS;
    return n_cta >= (int64_t)AHEAD_CTAS * sms ? W_AHEAD : W_REGS;
}

/* Aligned weights: up to 8 tokens through the cp.async ring (H200, BF16 at one token: 59-79%
 * of the copy rate, register loads 56-69%); 9-16 as mid_path says, and from 17 with register
 * loads, whose CTAs leave L1 to the activations (16 tokens: 1.9-2.1x one token, with the
 * cp.async rings' 192 KB of shared memory per SM 2.1-2.7x; 32 tokens 3.2-3.5x against
 * 4.3-6.0x). */
template <int T, int XP>
td_err launch_type(const mm_set &set, const uint4 *xs, const ops_weight *w, int n_tok,
                   bool vec, int dev, cudaStream_t st)
{
    if (!vec) {
        if (n_tok <= 8)
            return launch<T, 1, W_SCALAR, XP>(set, xs, w, n_tok, dev, st);
        if (n_tok <= 16)
            return launch<T, 2, W_SCALAR, XP>(set, xs, w, n_tok, dev, st);
        return launch<T, MAX_NT, W_SCALAR, XP>(set, xs, w, n_tok, dev, st);
    }
    if (n_tok <= 8)
        return launch<T, 1, W_RING, XP>(set, xs, w, n_tok, dev, st);
    if (n_tok <= 16)
        switch (mid_path(dev, set.first[set.n])) {
        case W_BULK:
            return launch<T, 2, W_BULK, XP>(set, xs, w, n_tok, dev, st);
        case W_AHEAD:
            return launch<T, 2, W_AHEAD, XP>(set, xs, w, n_tok, dev, st);
        default:
            return launch<T, 2, W_REGS, XP>(set, xs, w, n_tok, dev, st);
        }
    return launch<T, MAX_NT, W_REGS, XP>(set, xs, w, n_tok, dev, st);
}

template <int XP>
td_err launch_xp(const mm_set &set, const uint4 *xs, const ops_weight *w, int n_tok, bool vec,
                 int dev, cudaStream_t st)
{
    return w->type == TD_F16 ? launch_type<TD_F16, XP>(set, xs, w, n_tok, vec, dev, st)
                             : launch_type<TD_BF16, XP>(set, xs, w, n_tok, vec, dev, st);
}

} /* namespace */

td_err mmh_launch(const ops_mm_out *mm, int n, const float *x, int n_tok, cudaStream_t st)
{
    TD_ASSERT(n_tok >= 1 && n_tok <= MM_CHUNK && n >= 1);
    const int64_t cols = mm[0].w->cols;
    if (cols > INT32_MAX - 2 * KBLOCK * WARPS)
        return err_set(TD_ENOTSUP, "matmul of %lld columns: more than the kernel indexes",
                       (long long)cols);
    for (int i = 0; i < n; i++)
        TD_ASSERT((mm[i].w->type == TD_F16 || mm[i].w->type == TD_BF16) &&
                  mm[i].w->cols == cols);
    int dev = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    uint4 *xs = nullptr;
    TD_TRY(stream_buf_get(&g_xs, st, mmh_split_bytes(n_tok, cols), true, (void **)&xs, NULL));
    /* members of one type, row length, load path and activation rounding run in one launch,
     * up to MM_SET_MAX at a time, in order (x's alignment no longer matters: the kernel reads
     * the split pieces); one split serves every member of its rounding (reusing the scratch
     * is safe: the split waits for the kernel before it, see split_kernel's pdl_enter) */
    auto vec_of = [](const ops_weight *w) {
        return ((uintptr_t)w->data & 15) == 0 && (w->row_bytes & 15) == 0 && w->cols % 8 == 0;
    };
    TD_ASSERT(n <= OPS_MM_GROUP_MAX);
    for (int r = 0; r < 2; r++) {
        const bool x_bf16 = r == 1;
        bool done[OPS_MM_GROUP_MAX] = {}, any = false;
        for (int i = 0; i < n; i++) {
            done[i] = mm[i].w->x_bf16 != x_bf16;
            any = any || !done[i];
        }
        if (!any)
            continue;
        TD_TRY(x_bf16 ? split_launch<XP_BF16>(xs, x, (int)cols, n_tok, st)
                      : split_launch<XP_EXACT>(xs, x, (int)cols, n_tok, st));
        for (int i = 0; i < n; i++) {
            if (done[i])
                continue;
            const ops_weight *w = mm[i].w;
            const bool vec = vec_of(w);
            ops_mm_out set_mm[MM_SET_MAX];
            int k = 0;
            for (int j = i; j < n && k < MM_SET_MAX; j++) {
                const ops_weight *o = mm[j].w;
                if (!done[j] && o->type == w->type && o->row_bytes == w->row_bytes &&
                    vec_of(o) == vec) {
                    set_mm[k++] = mm[j];
                    done[j] = true;
                }
            }
            const mm_set set = mm_set_of(set_mm, k, TILE);
            TD_TRY(x_bf16 ? launch_xp<XP_BF16>(set, xs, w, n_tok, vec, dev, st)
                          : launch_xp<XP_EXACT>(set, xs, w, n_tok, vec, dev, st));
        }
    }
    return TD_OK;
}
