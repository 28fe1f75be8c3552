/* y = x . W^T for 2..16 tokens (n_pad 8, 16) of Q4_K and Q5_K on Hopper's warpgroup MMAs:
 * the warpgroup kernel. Built for sm_90a only (`wgmma` exists in no other code), by a CMake
 * target of its own; wgq_supported says whether the device runs it.
 *
 * The arithmetic is matmul_quant.cu's, so every (row, token) is bit-identical to mmq_launch,
 * the window kernel and the single-token kernels: chain k of a (row, token) takes k-blocks
 * k, k + 4, ... in order, per k-block I = fma(256, H, L), acc = fma(-(dx dmin), M,
 * fma(dx d, I, acc)), and y = ((p0 + p1) + p2) + p3. What differs is how the exact integers
 * H = sum_j sc_j (q_j . hi) and L = sum_j sc_j (q_j . lo) are made. Each 6-bit sub-block
 * scale is split, sc = 8 sh + sl with sh, sl in 0..7, and goes into the weights: sh q and
 * sl q are at most 105 (Q5_K: 217; u8 operands, four packed weights times sh is one
 * multiply with no carry between bytes), and H = 8 sum_j (sh_j q_j) . hi + sum_j (sl_j q_j)
 * . hi, the two sums chained through the accumulators of `wgmma.mma_async.m64nNk32.s32.u8.s8`
 * (N = 2 n_pad) over the eight sub-blocks: no integer scale products per MMA (the window
 * kernel's largest share of instructions), and the MMAs run asynchronously beside the
 * unpacking, the mins term and the f32 steps. A = the scaled weights from registers, B =
 * 2 n_pad columns from shared memory: the hi digits of the tokens, then their lo digits,
 * laid out by the rounding kernel in the core-matrix order a descriptor reads (mm_wg_pos in
 * matmul_bulk_addr.h).
 *
 * How: a CTA is one warpgroup (128 threads) and one chain of a 64-row tile; the four chains
 * of a tile are the four CTAs of a cluster, whose partials meet through distributed shared
 * memory at the end of the tile (each CTA sums and stores a quarter of the rows). Clusters
 * stay resident and walk tiles q, q + clusters, ... (of up to four matrices that read the
 * same activations, an mm_set, numbered member after member), so a CTA's k-blocks of all its
 * tiles form one stream through its ring of S stages. A stage holds one k-block: the 64 rows'
 * super-blocks (one 2-D tensor copy; rows past the matrix arrive as zeros), the tokens'
 * digits (512 n_pad bytes), their sums of 32 inputs (the mins term's B) and their scales,
 * four copies issued by one thread against one mbarrier. MMA row g of warp w reads tile row
 * 16 w + 2 (g & 3) + (g >> 2) (and 8 more), so the 8-byte weight loads of a quarter warp
 * meet distinct banks in the dense 144- or 176-byte rows of the copy. */
#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cooperative_groups.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul_internal.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGQ_DEVICE 1 /* the pass that has wgmma */
#define MMB_SM90 1
#else
#define WGQ_DEVICE 0
#define MMB_SM90 0
#endif

#include "kernels/cuda/matmul_bulk_copy.cuh"
#include "kernels/cuda/matmul_quant_blocks.cuh"

namespace {

constexpr int WG_ROWS = 64; /* rows of a tile: the MMA's M */
constexpr int WG_S = 3;     /* stages */
static_assert(KSPLIT == 4, "a cluster is the four chains of a tile");

/* Per type (Q4_K, Q5_K) and n-tiles of 8 tokens (NT = 1, 2: n_pad 8, 16): bytes of a
 * super-block and where its qs start; a stage is the 64 rows' super-blocks (dense, as the
 * tensor copy writes them), the digits (8 slices of 64 n_pad bytes), sums and scales; then
 * two reduction buffers and the stages' barriers. */
template <int T, int NT> struct wg_cfg {
    static constexpr bool Q5 = T == TD_Q5_K;
    static constexpr int KB = Q5 ? 176 : 144, QS = Q5 ? 48 : 16;
    static constexpr int TOKS = 8 * NT, W = WG_ROWS * KB, B = MM_XBLOCK * 2 * TOKS;
    static constexpr int SUMS = TOKS * MM_XSUM_BYTES, DX = TOKS * (int)sizeof(float);
    static constexpr uint32_t TX = W + B + SUMS + DX; /* bytes a stage receives */
    static constexpr int STAGE = ((int)TX + 127) / 128 * 128;
    static constexpr int RED = WG_ROWS * TOKS * (int)sizeof(float); /* a reduction buffer */
    /* a reduction buffer: 64 rows' partials (the cluster barrier's), or the four chains' of
     * 16 rows (the asynchronous reduction's: wg_send) */
    static constexpr int RED_OFF = WG_S * STAGE, BAR_OFF = RED_OFF + 2 * RED;
    /* barriers: the stages', then (asynchronous reduction) the partials' of each parity and
     * the acknowledgements [warp][parity] */
    static constexpr int SMEM = BAR_OFF + (WG_S + 2 + 2 * KSPLIT) * 8;
    static_assert(W % 128 == 0, "the digits start 128-byte aligned");
    static_assert(QS + 128 == KB, "the 128 bytes of qs end the super-block");
    static_assert(DX % 16 == 0, "bulk copies move multiples of 16 bytes");
};

/* The tensor copies of the set's members: one 2-D map each (bytes x rows). */
struct wg_maps {
    CUtensorMap m[MM_SET_MAX];
};

#if WGQ_DEVICE
namespace cg = cooperative_groups;

/* A shared-memory matrix descriptor without swizzling: start, the K direction's stride
 * (leading byte offset) and the N direction's (stride byte offset) between core matrices
 * of 8 columns x 16 bytes. */
__device__ __forceinline__ uint64_t wg_desc(const void *smem)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((a >> 4) & 0x3FFF) | ((uint64_t)(128 >> 4) << 16) |
           ((uint64_t)(256 >> 4) << 32);
}

/* d (+)= A . B over k32 with 16 NT columns (the hi digits of 8 NT tokens, then their lo
 * digits): A = u8 from registers (this thread's four words), B = s8 by descriptor;
 * accumulate = 0 overwrites d. */
template <int NT>
__device__ __forceinline__ void wg_mma(int (&d)[8 * NT], const uint32_t (&a)[4], uint64_t desc,
                                       int accumulate)
{
    if constexpr (NT == 2)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k32.s32.u8.s8 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                     "{%16, %17, %18, %19}, %20, p;\n}\n"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]),
                       "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]),
                       "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc),
                       "r"(accumulate));
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k32.s32.u8.s8 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p;\n}\n"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]),
                       "+r"(d[6]), "+r"(d[7])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc),
                       "r"(accumulate));
}

/* Keeps the compiler from moving reads of d above the wait for the MMAs that write it. */
template <int N> __device__ __forceinline__ void wg_fence_regs(int (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+r"(d[i])::"memory");
}

/* The shared::cluster address of p (this CTA's shared memory) in the CTA of rank r. */
__device__ __forceinline__ uint32_t cluster_addr(const void *p, int r)
{
    uint32_t a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_addr(p)), "r"(r));
    return a;
}

/* Stores v at the shared::cluster address a, its 8 bytes completing on the barrier at the
 * shared::cluster address bar (in the same CTA as a). */
__device__ __forceinline__ void st_async2(uint32_t a, float2 v, uint32_t bar)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, "
                 "[%3];" ::"r"(a), "f"(v.x), "f"(v.y), "r"(bar)
                 : "memory");
}

/* One arrival on the barrier at the shared::cluster address bar, releasing this thread's
 * earlier accesses to the cluster. */
__device__ __forceinline__ void arrive_remote(uint32_t bar)
{
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(bar)
                 : "memory");
}

/* Waits for the phase of the given parity of a barrier other CTAs of the cluster complete
 * (acquiring what they released); bounded as bar_wait is. */
__device__ __forceinline__ void bar_wait_cluster(uint64_t *bar, uint32_t parity)
{
    for (uint32_t n = 0;; n++) {
        uint32_t done;
        asm volatile("{\n .reg .pred p;\n"
                     " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(smem_addr(bar)), "r"(parity)
                     : "memory");
        if (done)
            return;
        if (n >= (1u << 24))
            __trap();
        if (n >= 64)
            __nanosleep(128);
    }
}

/* A k-block's header words of this thread's rows R0, R1 (tile rows of MMA rows g, g + 8):
 * d and dmin (f16), the 6-bit scales and mins (kblock_kq's unpacking), the scales split
 * into sh and sl (one byte per sub-block: word 0 sub-blocks 0..3, word 1 4..7). */
struct wg_head {
    float d[2], dmin[2];
    uint32_t mn[2][2], sh[2][2], sl[2][2]; /* [row][word] */
};

__device__ __forceinline__ wg_head wg_head_of(const uint8_t *w0, const uint8_t *w1)
{
    const uint4 hd[2] = {*(const uint4 *)w0, *(const uint4 *)w1};
    wg_head o;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        o.d[h] = f16f(hd[h].x);
        o.dmin[h] = f16f(hd[h].x >> 16);
        const uint32_t sc_lo = hd[h].y & 0x3F3F3F3Fu;
        const uint32_t sc_hi = (hd[h].w & 0x0F0F0F0Fu) | ((hd[h].y >> 2) & 0x30303030u);
        o.sh[h][0] = (sc_lo >> 3) & 0x07070707u, o.sl[h][0] = sc_lo & 0x07070707u;
        o.sh[h][1] = (sc_hi >> 3) & 0x07070707u, o.sl[h][1] = sc_hi & 0x07070707u;
        o.mn[h][0] = hd[h].z & 0x3F3F3F3Fu;
        o.mn[h][1] = ((hd[h].w >> 4) & 0x0F0F0F0Fu) | ((hd[h].z >> 2) & 0x30303030u);
    }
    return o;
}

/* A registers of both digit chains for sub-blocks 4 half .. 4 half + 3 (qs runs 2 half,
 * 2 half + 1): regs {row R0 k 4t.., row R1 k 4t.., row R0 k 16+4t.., row R1 k 16+4t..}; k
 * slot 4t + e is weight 8t + e of the sub-block, 16 + 4t + e weight 8t + 4 + e (mm_wg_pos
 * places the digits the same way). Q5_K's fifth bit joins the nibble as in kblock_kq: q <=
 * 31, 7 q <= 217. */
template <int T>
__device__ __forceinline__ void wg_unpack(uint32_t (&ah)[4][4], uint32_t (&al)[4][4],
                                          const uint8_t *w0, const uint8_t *w1,
                                          const wg_head &hd, int half, int t)
{
    using C = wg_cfg<T, 1>; /* (the weights' layout only) */
    const uint2 qh0 = C::Q5 ? *(const uint2 *)(w0 + 16 + 8 * t) : make_uint2(0, 0);
    const uint2 qh1 = C::Q5 ? *(const uint2 *)(w1 + 16 + 8 * t) : make_uint2(0, 0);
#pragma unroll
    for (int cc = 0; cc < 2; cc++) {
        const int c = 2 * half + cc;
        const uint2 q0 = *(const uint2 *)(w0 + C::QS + 32 * c + 8 * t);
        const uint2 q1 = *(const uint2 *)(w1 + C::QS + 32 * c + 8 * t);
#pragma unroll
        for (int nib = 0; nib < 2; nib++) {
            const int jj = 2 * cc + nib, j = 4 * half + jj;
            uint32_t a[4] = {(q0.x >> 4 * nib) & 0x0F0F0F0Fu, (q1.x >> 4 * nib) & 0x0F0F0F0Fu,
                             (q0.y >> 4 * nib) & 0x0F0F0F0Fu, (q1.y >> 4 * nib) & 0x0F0F0F0Fu};
            if (C::Q5) { /* bit j of each qh byte */
                a[0] |= ((qh0.x >> j) & 0x01010101u) << 4;
                a[1] |= ((qh1.x >> j) & 0x01010101u) << 4;
                a[2] |= ((qh0.y >> j) & 0x01010101u) << 4;
                a[3] |= ((qh1.y >> j) & 0x01010101u) << 4;
            }
            const uint32_t sh[2] = {(uint32_t)ubyte(hd.sh[0][half], jj),
                                    (uint32_t)ubyte(hd.sh[1][half], jj)};
            const uint32_t sl[2] = {(uint32_t)ubyte(hd.sl[0][half], jj),
                                    (uint32_t)ubyte(hd.sl[1][half], jj)};
#pragma unroll
            for (int k = 0; k < 4; k++) { /* bytes <= 31 times <= 7: no carry */
                ah[jj][k] = a[k] * sh[k & 1];
                al[jj][k] = a[k] * sl[k & 1];
            }
        }
    }
}

/* The 8 MMAs of sub-blocks 4 half .. 4 half + 3 into dh, dl (half 0 starts them), one
 * group; the registers were written before the fence. A slice of B is 64 n_pad bytes. */
template <int NT>
__device__ __forceinline__ void wg_issue(int (&dh)[8 * NT], int (&dl)[8 * NT],
                                         const uint32_t (&ah)[4][4], const uint32_t (&al)[4][4],
                                         const uint8_t *B, int half)
{
    /* slice j's descriptor: the start field (address >> 4) moves by 512 NT / 16 per slice,
     * and stays below 2^14 (shared addresses < 256 KB) */
    const uint64_t desc0 = wg_desc(B + 4 * half * 64 * 8 * NT);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int jj = 0; jj < 4; jj++) {
        const int j = 4 * half + jj;
        const uint64_t desc = desc0 + (uint64_t)(jj * 32 * NT);
        wg_mma<NT>(dh, ah[jj], desc, j > 0);
        wg_mma<NT>(dl, al[jj], desc, j > 0);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N> __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* The mins term of a k-block, M = sum_j m_j sum32_j of rows R0, R1 and tokens 8 nt + 2t +
 * (e & 1) (an m16n8 C fragment per n-tile): A = the row's 8 mins in k slots 0..7 (lanes
 * t = 0, 1), B = the digits of token 8 nt + g's 32-input sums (mm_xquant). */
template <int NT>
__device__ __forceinline__ void wg_mins(int (&msum)[NT][4], const uint8_t *sums,
                                        const wg_head &hd, int g, int t)
{
    const uint32_t m0 = t == 0 ? hd.mn[0][0] : t == 1 ? hd.mn[0][1] : 0u;
    const uint32_t m1 = t == 0 ? hd.mn[1][0] : t == 1 ? hd.mn[1][1] : 0u;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const uint4 bs = t < 2 ? *(const uint4 *)(sums + (8 * nt + g) * MM_XSUM_BYTES + 16 * t)
                               : make_uint4(0, 0, 0, 0);
        mma_digits(msum[nt], m0, m1, bs);
    }
}

/* The f32 steps of a k-block (kblock_kq's, in its order) into acc[n-tile][e] (e as an m16n8
 * C fragment: row R0 / R1 by e >> 1, token 8 nt + 2t + (e & 1)), from the finished MMAs:
 * n8 tile i of the 16 NT columns at regs 4i..4i+3, tiles 0 .. NT - 1 the hi digits of the
 * tokens, tiles NT .. 2 NT - 1 their lo digits; H = 8 D_sh + D_sl, L likewise. */
template <int NT>
__device__ __forceinline__ void wg_f32(float (&acc)[NT][4], const int (&dh)[8 * NT],
                                       const int (&dl)[8 * NT], const int (&msum)[NT][4],
                                       const float2 (&dx)[NT], const float (&d)[2],
                                       const float (&dmin)[2])
{
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = 4 * nt + e, h = e >> 1;
            const int H = 8 * dh[i] + dl[i], L = 8 * dh[i + 4 * NT] + dl[i + 4 * NT];
            const float dxt = (e & 1) ? dx[nt].y : dx[nt].x;
            const float I = __fmaf_rn(256.0f, __int2float_rn(H), __int2float_rn(L));
            float a = acc[nt][e];
            a = __fmaf_rn(__fmul_rn(dxt, d[h]), I, a);
            a = __fmaf_rn(-__fmul_rn(dxt, dmin[h]), __int2float_rn(msum[nt][e]), a);
            acc[nt][e] = a;
        }
}

/* The asynchronous reduction of a tile (ASYNC): warp w of every CTA holds the partials of
 * the tile's rows 16w .. 16w + 15 for its chain (local row lr0 and lr0 + 8 of this thread,
 * tokens 8 nt + 2t, + 1) and sends them to rank w, which sums them a tile later. red holds
 * [parity][sender rank][16 rows][tokens] in every CTA; rank w's buffers of a parity fill on
 * its barrier rfull[parity] (the other three senders' bytes, st.async) and are handed back
 * through ack[w][parity] of each sender, which waits for it before it sends again into that
 * parity (two tiles later). */
template <int NT>
__device__ __forceinline__ void wg_send(const float (&acc)[NT][4], uint8_t *red, uint64_t *rfull,
                                        uint64_t *ack, int tt, int c, int w, int lr0, int t)
{
    constexpr int TOKS = 8 * NT, PART = 16 * TOKS * (int)sizeof(float);
    const int p = tt & 1;
    if (w != c && tt >= 2) /* rank w has summed this parity's tile two tiles back */
        bar_wait_cluster(&ack[2 * w + p], (uint32_t)((tt >> 1) - 1) & 1);
    float *slot = (float *)(red + (p * KSPLIT + c) * PART); /* the same offset in rank w */
    const uint32_t rbar = w != c ? cluster_addr(&rfull[p], w) : 0u;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int off = (lr0 + 8 * h) * TOKS + 8 * nt + 2 * t;
            const float2 v = make_float2(acc[nt][2 * h], acc[nt][2 * h + 1]);
            if (w == c)
                *(float2 *)(slot + off) = v;
            else
                st_async2(cluster_addr(slot + off, w), v, rbar);
        }
}

/* Rank c's warp c: y = ((p0 + p1) + p2) + p3 for rows 16c .. 16c + 15 of the CTA's u-th tile
 * (tile of the set) from the four partials of its buffers, once the other three have
 * landed; then hands the buffers back to the senders. */
template <int NT>
__device__ __forceinline__ void wg_reduce(const mm_set &set, int n_tok, int64_t tile, int u,
                                          uint8_t *red, uint64_t *rfull, uint64_t *ack, int c,
                                          int lr0, int t, int lane)
{
    constexpr int TOKS = 8 * NT, PART = 16 * TOKS * (int)sizeof(float);
    const int p = u & 1;
    if (lane == 0)
        bar_arrive_tx(&rfull[p], (KSPLIT - 1) * PART);
    bar_wait_cluster(&rfull[p], (uint32_t)(u >> 1) & 1);
    const float *slots = (const float *)(red + p * KSPLIT * PART);
    const int m = mm_set_member(&set, tile);
    const int64_t rows = set.rows[m], r0 = (tile - set.first[m]) * WG_ROWS + 16 * c;
    float *y = set.y[m];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int lr = lr0 + 8 * h, off = lr * TOKS + 8 * nt + 2 * t, tk = 8 * nt + 2 * t;
            float2 v = *(const float2 *)(slots + off);
#pragma unroll
            for (int k = 1; k < KSPLIT; k++) {
                const float2 o = *(const float2 *)(slots + k * (PART / 4) + off);
                v.x = __fadd_rn(v.x, o.x);
                v.y = __fadd_rn(v.y, o.y);
            }
            if (r0 + lr < rows) {
                if (tk < n_tok)
                    y[(size_t)tk * rows + r0 + lr] = v.x;
                if (tk + 1 < n_tok)
                    y[(size_t)(tk + 1) * rows + r0 + lr] = v.y;
            }
        }
    __syncwarp();
    if (lane < KSPLIT && lane != c)
        arrive_remote(cluster_addr(&ack[2 * c + p], lane));
}

/* Copies of item p of this CTA (tile q + (p / nk) nq of the set, k-block c + 4 (p % nk))
 * into stage p % S: the weights, with the announcement of all the stage's bytes (called
 * before the kernel ahead of this one is done: weights only), or the activations. */
template <int T, int NT> struct wg_producer {
    using C = wg_cfg<T, NT>;
    const wg_maps &maps;
    const mm_set &set;
    const mm_xquant &xq;
    uint8_t *smem;
    uint64_t *full;
    int64_t q, nq;
    int c, nk;
    uint64_t once, shared; /* L2 policies: weights read once, activations by every SM */

    __device__ __forceinline__ void weights(int p) const
    {
        const int st = p % WG_S;
        const int64_t tile = q + (int64_t)(p / nk) * nq;
        const int m = mm_set_member(&set, tile);
        const int kb = c + KSPLIT * (p % nk);
        bar_arrive_tx(&full[st], C::TX);
        tensor_copy_2d(smem + st * C::STAGE, &maps.m[m], kb * C::KB,
                       (int)((tile - set.first[m]) * WG_ROWS), &full[st], once);
    }
    __device__ __forceinline__ void acts(int p) const
    {
        const int st = p % WG_S;
        const int kb = c + KSPLIT * (p % nk);
        uint8_t *b = smem + st * C::STAGE + C::W;
        bulk_copy(b, xq.xq + (size_t)kb * C::B, C::B, &full[st], shared);
        bulk_copy(b + C::B, xq.xsum + (size_t)kb * C::SUMS, C::SUMS, &full[st], shared);
        bulk_copy(b + C::B + C::SUMS, xq.xd + (size_t)kb * C::TOKS, C::DX, &full[st], shared);
    }
};
#endif

/* grid: KSPLIT x the resident clusters (or the tiles, if fewer), clusters of KSPLIT CTAs
 * (rank = chain); block: 128 threads (one warpgroup); dynamic shared memory wg_cfg::SMEM: S
 * stages, two reduction buffers (a tile's partials are read by the cluster while the next
 * tile's k-blocks go by), the stages' barriers. The set's tiles are numbered in units of 64
 * rows; cols is a multiple of 256; xq has n_pad 8 NT in the warpgroup layout. ASYNC: the
 * tiles' partials go to the summing rank by wg_send / wg_reduce instead of meeting at a
 * cluster barrier. */
template <int T, int NT, bool ASYNC>
__global__ void __cluster_dims__(KSPLIT, 1, 1) __launch_bounds__(128, 3)
    wgq_kernel(const __grid_constant__ wg_maps maps, mm_set set, int64_t cols, mm_xquant xq)
{
    /* the next matmul's rounding kernel may launch now: it waits for this grid to finish
     * before it touches anything (see matmul.cu) */
    mm_launch_dependents();
#if WGQ_DEVICE
    using C = wg_cfg<T, NT>;
    extern __shared__ __align__(128) uint8_t smem[];
    cg::cluster_group cl = cg::this_cluster();
    const int c = (int)cl.block_rank(); /* the chain */
    const int64_t q = blockIdx.x / KSPLIT, nq = gridDim.x / KSPLIT;
    const int64_t n_tiles = set.first[set.n];
    const int nkb = (int)(cols / MM_XBLOCK);
    const int nk = mmq_warp_kblocks(nkb, c);
    const int my_tiles = n_tiles > q ? (int)((n_tiles - q + nq - 1) / nq) : 0;
    const int items = my_tiles * nk;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int R0 = 16 * warp + 2 * (g & 3) + (g >> 2), R1 = R0 + 8;
    uint64_t *full = (uint64_t *)(smem + C::BAR_OFF);
    uint64_t *rfull = full + WG_S, *ack = rfull + 2; /* ack[warp * 2 + parity] */
    if (tid == 0) {
        for (int s = 0; s < WG_S + (ASYNC ? 2 + 2 * KSPLIT : 0); s++)
            bar_init(&full[s], 1);
        bar_init_fence();
    }
    if (ASYNC)
        cl.sync(); /* every CTA's barriers are set up before any other CTA uses them */
    else
        __syncthreads();
    const wg_producer<T, NT> pr = {maps, set, xq, smem, full, q, nq, c, nk,
                                   tid == 0 ? evict_first_policy() : 0,
                                   tid == 0 ? evict_last_policy() : 0};
    const int first = items < WG_S ? items : WG_S;
    if (tid == 0)
        for (int p = 0; p < first; p++)
            pr.weights(p);
    mm_wait_dependencies(); /* xq comes from the kernel before this one */
    if (tid == 0)
        for (int p = 0; p < first; p++)
            pr.acts(p);

    /* The k-blocks are pipelined: while the MMAs of one half of k-block it run, the warp
     * unpacks the other half, and while the second half's run, the first half of k-block
     * it + 1 (its stage waited for) and the mins term of it. Two sets of A registers, one
     * accumulator set, the f32 steps after the stage is handed back. */
    int dh[8 * NT], dl[8 * NT];
    uint32_t ah[2][4][4], al[2][4][4];
    wg_head hd;
    auto rows_of = [&](int i, const uint8_t *&w0, const uint8_t *&w1) {
        const uint8_t *st = smem + (i % WG_S) * C::STAGE;
        w0 = st + R0 * C::KB, w1 = st + R1 * C::KB;
        return st;
    };
    if (items > 0) {
        const uint8_t *w0, *w1;
        rows_of(0, w0, w1);
        bar_wait<1024>(&full[0], 0);
        hd = wg_head_of(w0, w1);
        wg_unpack<T>(ah[0], al[0], w0, w1, hd, 0, t);
    }
    int it = 0;
    for (int tt = 0; tt < my_tiles; tt++) {
        const int64_t tile = q + (int64_t)tt * nq;
        float acc[NT][4] = {};
        for (int s = 0; s < nk; s++, it++) {
            const uint8_t *w0, *w1;
            const uint8_t *st = rows_of(it, w0, w1);
            const uint8_t *B = st + C::W, *sums = B + C::B;
            const float *dxs = (const float *)(sums + C::SUMS);
            wg_issue<NT>(dh, dl, ah[0], al[0], B, 0);
            wg_unpack<T>(ah[1], al[1], w0, w1, hd, 1, t);
            wg_issue<NT>(dh, dl, ah[1], al[1], B, 1);
            int msum[NT][4];
            wg_mins<NT>(msum, sums, hd, g, t);
            float2 dx[NT];
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                dx[nt] = *(const float2 *)(dxs + 8 * nt + 2 * t);
            const float d[2] = {hd.d[0], hd.d[1]}, dmin[2] = {hd.dmin[0], hd.dmin[1]};
            if (it + 1 < items) { /* the next k-block's first half meanwhile */
                const uint8_t *n0, *n1;
                rows_of(it + 1, n0, n1);
                bar_wait<1024>(&full[(it + 1) % WG_S], (uint32_t)((it + 1) / WG_S) & 1);
                hd = wg_head_of(n0, n1);
                wg_wait<1>(); /* the first half's MMAs are done with ah[0], al[0] */
                wg_unpack<T>(ah[0], al[0], n0, n1, hd, 0, t);
            }
            wg_wait<0>();
            wg_fence_regs(dh), wg_fence_regs(dl);
            __syncthreads(); /* every warp is done with the stage */
            if (tid == 0 && it + WG_S < items) {
                pr.weights(it + WG_S);
                pr.acts(it + WG_S);
            }
            wg_f32<NT>(acc, dh, dl, msum, dx, d, dmin);
        }
        if constexpr (ASYNC) {
            wg_send<NT>(acc, smem + C::RED_OFF, rfull, ack, tt, c, warp, R0 - 16 * warp, t);
            if (tt > 0 && warp == c)
                wg_reduce<NT>(set, xq.n_tok, q + (int64_t)(tt - 1) * nq, tt - 1,
                              smem + C::RED_OFF, rfull, ack, c, R0 - 16 * warp, t, lane);
            continue;
        }
        /* (ASYNC false) y = ((p0 + p1) + p2) + p3 over the cluster's chains: each CTA puts
         * its partials in its buffer of this tile's parity, and after the cluster barrier
         * rank c sums rows 16c .. 16c + 15 from all four. A buffer is written again two
         * tiles later, after the next tile's barrier, which every CTA reaches only when done
         * reading. */
        float *red = (float *)(smem + C::RED_OFF + (tt & 1) * C::RED);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                red[((e >> 1) ? R1 : R0) * C::TOKS + 8 * nt + 2 * t + (e & 1)] = acc[nt][e];
        cl.sync();
        const int m = mm_set_member(&set, tile);
        const int64_t rows = set.rows[m], r0 = (tile - set.first[m]) * WG_ROWS;
        const int rl = 16 * c + (tid & 15);
        const float *part[KSPLIT];
#pragma unroll
        for (int k = 0; k < KSPLIT; k++)
            part[k] = cl.map_shared_rank(red, k);
        if (r0 + rl < rows)
#pragma unroll
            for (int h = 0; h < NT; h++) {
                const int tk = (tid >> 4) + 8 * h;
                float v = part[0][rl * C::TOKS + tk];
#pragma unroll
                for (int k = 1; k < KSPLIT; k++)
                    v = __fadd_rn(v, part[k][rl * C::TOKS + tk]);
                if (tk < xq.n_tok)
                    set.y[m][(size_t)tk * rows + r0 + rl] = v;
            }
    }
    if (ASYNC && my_tiles > 0 && warp == c)
        wg_reduce<NT>(set, xq.n_tok, q + (int64_t)(my_tiles - 1) * nq, my_tiles - 1,
                      smem + C::RED_OFF, rfull, ack, c, R0 - 16 * warp, t, lane);
    cl.sync(); /* no CTA leaves while another may still read its buffers */
#else
    (void)maps, (void)set, (void)cols, (void)xq;
#endif
}

/* --- host side ------------------------------------------------------------------------------ */

/* Resident clusters of wgq_kernel<T, NT, ASYNC> on the current device, 0 where it cannot
 * run there (no sm_90a device, too little shared memory): asked once per device. */
template <int T, int NT, bool ASYNC> int clusters_here(void)
{
    constexpr int smem = wg_cfg<T, NT>::SMEM;
    static int clusters[64]; /* per device ordinal: + 1 (0: not asked yet) */
    int ordinal = 0;
    if (cudaGetDevice(&ordinal) != cudaSuccess || ordinal < 0 || ordinal >= 64) {
        (void)cudaGetLastError();
        return 0;
    }
    int v = __atomic_load_n(&clusters[ordinal], __ATOMIC_RELAXED);
    if (v == 0) {
        int n = 0;
        cudaFuncAttributes fa;
        const auto k = wgq_kernel<T, NT, ASYNC>;
        if (mm_rows_map_ok() && cudaFuncGetAttributes(&fa, k) == cudaSuccess &&
            smem_optin_bytes(ordinal) >= smem &&
            cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) ==
                cudaSuccess &&
            cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared) == cudaSuccess) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(KSPLIT);
            cfg.blockDim = dim3(128);
            cfg.dynamicSmemBytes = smem;
            if (cudaOccupancyMaxActiveClusters(&n, k, &cfg) != cudaSuccess)
                n = 0;
        }
        (void)cudaGetLastError();
        v = n + 1;
        __atomic_store_n(&clusters[ordinal], v, __ATOMIC_RELAXED);
    }
    return v - 1;
}

/* Whether tiles meet at a cluster barrier (the default) or are reduced asynchronously
 * (TANDEM_WGQ_RED=async; read once); the same bits. */
bool sync_reduction(void)
{
    static int v; /* 0 not read, 1 async, 2 sync */
    int c = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (c == 0) {
        const char *e = getenv("TANDEM_WGQ_RED");
        c = e && strcmp(e, "async") == 0 ? 1 : 2;
        __atomic_store_n(&v, c, __ATOMIC_RELAXED);
    }
    return c == 2;
}

/* Launches wgq_kernel<T, NT, ASYNC> on the set of the n members (tensor maps encoded). */
template <int T, int NT, bool ASYNC>
td_err launch_type(const ops_mm_out *mm, int n, const mm_xquant *xq, const mm_device *dev,
                   cudaStream_t st)
{
    using C = wg_cfg<T, NT>;
    const ops_weight *w0 = mm[0].w;
    wg_maps maps;
    memset(&maps, 0, sizeof maps);
    for (int i = 0; i < n; i++) {
        const ops_weight *w = mm[i].w;
        TD_ASSERT(wgq_supported(w, xq->n_pad) && w->type == T && w->cols == w0->cols);
        TD_TRY(mm_rows_map(&maps.m[i], w, 1, 1, C::KB, WG_ROWS));
    }
    const mm_set set = mm_set_of(mm, n, WG_ROWS);
    const int64_t n_tiles = set.first[set.n];
    const int64_t clusters = clusters_here<T, NT, ASYNC>();
    const int64_t grid = KSPLIT * (n_tiles < clusters ? n_tiles : clusters);
    const cudaError_t e = launch_ex(wgq_kernel<T, NT, ASYNC>, dim3((unsigned)grid), dim3(128),
                                    C::SMEM, dev->pdl, st, maps, set, w0->cols, *xq);
    if (e != cudaSuccess)
        return err_set(TD_ECUDA, "cuda_matmul: %s warpgroup kernel launch (%d members, %lld "
                       "tiles): %s", dtype_name(w0->type), n, (long long)n_tiles,
                       cudaGetErrorString(e));
    return TD_OK;
}

} /* namespace */

bool wgq_supported(const ops_weight *w, int n_pad)
{
    if ((n_pad != 8 && n_pad != 16) || (w->type != TD_Q4_K && w->type != TD_Q5_K) ||
        ((uintptr_t)w->data & 15) != 0 || w->cols % MM_XBLOCK != 0 ||
        w->row_bytes >= ((size_t)1 << 31) || w->rows >= ((int64_t)1 << 31))
        return false;
    const bool q5 = w->type == TD_Q5_K, one = n_pad == 8;
    return (q5 ? (one ? clusters_here<TD_Q5_K, 1, false>() : clusters_here<TD_Q5_K, 2, false>())
               : (one ? clusters_here<TD_Q4_K, 1, false>() : clusters_here<TD_Q4_K, 2, false>())) >
           0;
}

td_err wgq_launch(const ops_mm_out *mm, int n, const mm_xquant *xq, const mm_device *dev,
                  cudaStream_t st)
{
    TD_ASSERT(n >= 1 && n <= MM_SET_MAX && (xq->n_pad == 8 || xq->n_pad == 16));
    TD_ASSERT(xq->n_tok >= 1 && xq->n_tok <= xq->n_pad);
    const bool q5 = mm[0].w->type == TD_Q5_K;
    if (sync_reduction()) {
        if (xq->n_pad == 8)
            return q5 ? launch_type<TD_Q5_K, 1, false>(mm, n, xq, dev, st)
                      : launch_type<TD_Q4_K, 1, false>(mm, n, xq, dev, st);
        return q5 ? launch_type<TD_Q5_K, 2, false>(mm, n, xq, dev, st)
                  : launch_type<TD_Q4_K, 2, false>(mm, n, xq, dev, st);
    }
    if (xq->n_pad == 8)
        return q5 ? launch_type<TD_Q5_K, 1, true>(mm, n, xq, dev, st)
                  : launch_type<TD_Q4_K, 1, true>(mm, n, xq, dev, st);
    return q5 ? launch_type<TD_Q5_K, 2, true>(mm, n, xq, dev, st)
              : launch_type<TD_Q4_K, 2, true>(mm, n, xq, dev, st);
}
