/* How the bulk-copy single-token kernel (matmul_bulk.cu, which includes this once) turns one
 * staged (row, k-block) into the exact integers of matmul_quant.cu, one lane per k-block:
 * the per-type geometry, the activation staging, and one function per layout (item_kq for
 * Q4_K/Q5_K, item_q6k, item_q80). Device code for sm_90 only (the caller's MMB_SM90 guard).
 *
 * Activations in shared memory (matmul_bulk_addr.h): per k-block the 16-byte units of the
 * token's hi/lo digits, unit u = inputs 8u .. 8u+7 of the k-block in the type's interleave
 * (mm_xquant): unit 8 {hi[0..3], hi[4..7], lo[0..3], lo[4..7]}, unit 4 (Q6_K) {hi[0..3],
 * lo[0..3], hi[4..7], lo[4..7]}; then MMB_XAUX_AT: the digits s0, s1, s2 of the sums the
 * type needs, and dx. Weights 4m .. 4m+3 of a 32-input run meet one word of hi and one of lo
 * digits, so a k-block costs 128 dp4a whatever the type. */
#ifndef TANDEM_KERNELS_CUDA_MATMUL_BULK_BLOCKS_CUH
#define TANDEM_KERNELS_CUDA_MATMUL_BULK_BLOCKS_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/matmul_bulk_addr.h"
#include "kernels/cuda/matmul_internal.h"
#include "kernels/cuda/matmul_round.cuh"

namespace {

/* Per type (matmul_bulk_addr.h): bytes of a k-block in a row, k-blocks per stage, shared
 * bytes per row and stage, ring depth, activation bytes per k-block in shared memory, whether
 * runs are whole 16-byte pieces, inputs per k-block. */
template <int T> struct bq;
template <> struct bq<TD_Q4_K> {
    static constexpr int KB = MMB_Q4_K_KB, KC = MMB_Q4_K_KC, SLOT = MMB_Q4_K_SLOT,
                         STAGES = MMB_Q4_K_STAGES, XKB = MMB_XKB_K, KB_W = 256;
    static constexpr bool ALIGNED = true;
};
template <> struct bq<TD_Q5_K> {
    static constexpr int KB = MMB_Q5_K_KB, KC = MMB_Q5_K_KC, SLOT = MMB_Q5_K_SLOT,
                         STAGES = MMB_Q5_K_STAGES, XKB = MMB_XKB_K, KB_W = 256;
    static constexpr bool ALIGNED = true;
};
template <> struct bq<TD_Q6_K> {
    static constexpr int KB = MMB_Q6_K_KB, KC = MMB_Q6_K_KC, SLOT = MMB_Q6_K_SLOT,
                         STAGES = MMB_Q6_K_STAGES, XKB = MMB_XKB_K, KB_W = 256;
    static constexpr bool ALIGNED = false;
};
template <> struct bq<TD_Q8_0> {
    static constexpr int KB = MMB_Q8_0_KB, KC = MMB_Q8_0_KC, SLOT = MMB_Q8_0_SLOT,
                         STAGES = MMB_Q8_0_STAGES, XKB = MMB_XKB_Q8, KB_W = 128;
    static constexpr bool ALIGNED = false;
};

/* The rings of a CTA of W warps: bq<T>'s, or for Q4_K at MMB_WIDE_WARPS warps half the
 * k-blocks per stage (one per chain), so twice the warps fit the same shared memory, and for
 * Q6_K at MMB_Q6_K_WIDE_WARPS two stages per warp instead of three (as many buffers). */
template <int T, int W> struct bring : bq<T> {};
template <> struct bring<TD_Q4_K, MMB_WIDE_WARPS> : bq<TD_Q4_K> {
    static constexpr int KC = MMB_Q4_K_WIDE_KC, SLOT = MMB_Q4_K_WIDE_SLOT,
                         STAGES = MMB_Q4_K_WIDE_STAGES;
};
template <> struct bring<TD_Q6_K, MMB_Q6_K_WIDE_WARPS> : bq<TD_Q6_K> {
    static constexpr int STAGES = MMB_Q6_K_WIDE_STAGES;
};

#if MMB_SM90

__device__ __forceinline__ float f16f(uint32_t bits16)
{
    return __half2float(__ushort_as_half((unsigned short)(bits16 & 0xFFFF)));
}

/* Byte k (0..3, a constant) of w, zero- or sign-extended. */
__device__ __forceinline__ int ubyte(uint32_t w, int k)
{
    return (int)((w >> (8 * k)) & 0xFFu);
}
__device__ __forceinline__ int sbyte(uint32_t w, int k)
{
    const uint32_t s = 8u | (uint32_t)k; /* a selector nibble with bit 3 replicates the sign */
    uint32_t r;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(w), "r"((uint32_t)k | s << 4 | s << 8 | s << 12));
    return (int)r;
}

/* signed bytes . signed bytes + c */
__device__ __forceinline__ int dp4a_ss(uint32_t a, uint32_t b, int c)
{
    return __dp4a((int)a, (int)b, c);
}

/* unsigned bytes of a . signed bytes of b + c */
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c)
{
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ uint4 lds16(const uint8_t *p)
{
    return *(const uint4 *)p;
}

/* The words of a block at any even shared-memory offset: word k (bytes 4k .. 4k+3 from p) is
 * a funnel shift of two aligned words (the second may be the word after the block; the slot
 * leaves room for it). */
struct srow {
    const uint32_t *w; /* aligned word at or below p */
    uint32_t sh;       /* 8 * (p & 3) */
};

__device__ __forceinline__ srow srow_at(const uint8_t *p)
{
    const uint32_t mis = (uint32_t)(uintptr_t)p & 3;
    return {(const uint32_t *)(p - mis), 8 * mis};
}

__device__ __forceinline__ uint32_t srow_word(srow r, int k)
{
    return __funnelshift_r(r.w[k], r.w[k + 1], r.sh);
}

/* --- activations into shared memory ------------------------------------------------------- */

/* Rounds token 0's inputs x[cols] into the k-block layout (mm_round_block, the rounding
 * kernel's code, so the same digits, sums and d), with each k-block's aux bytes: Q4_K/Q5_K
 * the digits of the 32-input sums j = 0..3 with dx in the fourth word, then j = 4..7; Q6_K
 * the four 16-byte groups of the 16-input sums (k = 4u .. 4u+3), dx in the first one's
 * fourth word; Q8_0 dx alone (two k-blocks per 256-input block). Warp w takes blocks w,
 * w + warps, ...: all its loads of up to 3 blocks are issued before it rounds them, about one
 * latency for rows up to MMB_FUSE_COLS inputs at 8 warps. */
template <int T>
__device__ __forceinline__ void round_x(uint8_t *xsm, const float *x, int64_t cols, int nkb)
{
    constexpr int XKB = bq<T>::XKB, UNIT = T == TD_Q6_K ? 4 : 8, BATCH = 3;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int nb = (int)((cols + MM_XBLOCK - 1) / MM_XBLOCK);
    for (int b0 = warp; b0 < nb; b0 += BATCH * nw) {
        float v[BATCH][8];
#pragma unroll
        for (int j = 0; j < BATCH; j++) {
            const int64_t at = (int64_t)(b0 + j * nw) * MM_XBLOCK + 8 * lane;
            const bool mine = b0 + j * nw < nb && at < cols; /* cols: a multiple of 32 */
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[j][e] = mine ? x[at + e] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < BATCH; j++) {
            const int jb = b0 + j * nw;
            if (jb >= nb) /* the same for the whole warp */
                break;
            const mm_round r = mm_round_block<UNIT>(v[j]);
            int8_t dg[3];
            if constexpr (T == TD_Q8_0) { /* k-blocks 2 jb (lanes 0..15), 2 jb + 1 */
                const int kb = 2 * jb + lane / 16;
                if ((int64_t)jb * MM_XBLOCK + 8 * lane < cols)
                    *(uint4 *)(xsm + kb * XKB + mmb_xunit(true, lane % 16)) = r.q;
                if (lane == 0 || (lane == 16 && kb < nkb))
                    *(float *)(xsm + kb * XKB + MMB_XAUX_AT) = r.d;
                continue;
            }
            uint8_t *xk = xsm + jb * XKB;
            *(uint4 *)(xk + mmb_xunit(false, lane)) = r.q;
            if (T != TD_Q6_K && (lane & 3) == 0) { /* sums of 32: digit i of j at 16(j/4)+4i+j%4 */
                const int js = lane / 4;
                digits3(r.s32, dg);
#pragma unroll
                for (int i = 0; i < 3; i++)
                    xk[MMB_XAUX_AT + 16 * (js / 4) + 4 * i + js % 4] = (uint8_t)dg[i];
            }
            if (T == TD_Q6_K && (lane & 1) == 0) { /* sums of 16: at 16(k/4) + 4i + k%4 */
                const int k16 = lane / 2;
                digits3(r.s16, dg);
#pragma unroll
                for (int i = 0; i < 3; i++)
                    xk[MMB_XAUX_AT + 16 * (k16 / 4) + 4 * i + k16 % 4] = (uint8_t)dg[i];
            }
            if (lane == 0)
                *(float *)(xk + MMB_XAUX_AT + 12) = r.d;
        }
    }
    (void)nkb;
}

/* The aux words of k-block kb (token 0) as stage_x stores them. */
template <int T>
__device__ __forceinline__ void aux_load(uint4 (&v)[4], const float *xd, const int8_t *xs,
                                         int kb, int n_pad)
{
    if constexpr (T == TD_Q8_0) {
        v[0] = make_uint4(__float_as_uint(__ldg(xd + (size_t)(kb >> 1) * n_pad)), 0, 0, 0);
        return;
    }
    const int8_t *s = xs + (size_t)kb * n_pad * MM_XSUM_BYTES;
    constexpr int AT = T == TD_Q6_K ? 32 : 0, N = T == TD_Q6_K ? 4 : 2;
#pragma unroll
    for (int u = 0; u < N; u++)
        v[u] = __ldg((const uint4 *)(s + AT + 16 * u));
    v[0].w = __float_as_uint(__ldg(xd + (size_t)kb * n_pad));
#pragma unroll
    for (int u = 1; u < N; u++)
        v[u].w = 0u;
}

template <int T> __device__ __forceinline__ void aux_store(uint8_t *xk, const uint4 (&v)[4])
{
    constexpr int N = T == TD_Q8_0 ? 1 : T == TD_Q6_K ? 4 : 2;
#pragma unroll
    for (int u = 0; u < N; u++)
        *(uint4 *)(xk + MMB_XAUX_AT + 16 * u) = v[u];
}

/* Token 0's rounded inputs from the rounding kernel's scratch (the plain layout of the
 * type's interleave) into the k-block layout, with each k-block's aux words (as round_x
 * makes them). Every thread's loads are issued before its stores (a batch of up to 9 units
 * and one k-block's aux words), so the staging costs about one latency for rows up to 18432
 * inputs at 256 threads. */
template <int T>
__device__ __forceinline__ void stage_x(uint8_t *xsm, const int8_t *xq, const float *xd,
                                        const int8_t *xs, int64_t cols, int nkb, int n_pad)
{
    constexpr int XKB = bq<T>::XKB, UPK = bq<T>::KB_W / 8; /* units per k-block */
    constexpr int BATCH = 9;
    const int nu = (int)(cols / 8), step = (int)blockDim.x;
    uint4 a[4];
    const int kb0 = (int)threadIdx.x;
    if (kb0 < nkb)
        aux_load<T>(a, xd, xs, kb0, n_pad);
    for (int i0 = threadIdx.x; i0 < nu; i0 += BATCH * step) {
        uint4 v[BATCH];
#pragma unroll
        for (int j = 0; j < BATCH; j++)
            if (i0 + j * step < nu)
                v[j] = __ldg((const uint4 *)(xq + 16 * (size_t)(i0 + j * step)));
#pragma unroll
        for (int j = 0; j < BATCH; j++) {
            const int i = i0 + j * step;
            if (i < nu)
                *(uint4 *)(xsm + (i / UPK) * XKB + mmb_xunit(T == TD_Q8_0, i % UPK)) = v[j];
        }
    }
    if (kb0 < nkb)
        aux_store<T>(xsm + kb0 * XKB, a);
    for (int kb = kb0 + step; kb < nkb; kb += step) { /* rows past 65536 inputs */
        aux_load<T>(a, xd, xs, kb, n_pad);
        aux_store<T>(xsm + kb * XKB, a);
    }
}

/* --- one (row, k-block) per lane ---------------------------------------------------------- */

/* Q4_K / Q5_K super-block at blk (16-byte aligned) against its k-block's activations xk. qs
 * chunk c (32 bytes) holds sub-block 2c in its low nibbles and 2c+1 in its high ones; word m
 * of a chunk (weights 4m .. 4m+3 of both) meets unit 4j + m/2 of sub-block j, hi digits in
 * word (m & 1), lo in 2 + (m & 1). Q4_K's high nibbles stay in place (16 x the weight, an
 * unsigned byte): those sums are divided by 16 once, exactly (every term is a multiple of
 * 16). Then H, L, M and the f32 steps of kblock_kq. */
template <bool Q5>
__device__ __forceinline__ void item_kq(float &acc, const uint8_t *blk, const uint8_t *xk)
{
    constexpr int QS = Q5 ? 48 : 16; /* offset of qs[128] */
    const uint4 hd = lds16(blk);     /* d, dmin, 12 scale bytes */
    uint32_t qh[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if constexpr (Q5) { /* fifth bit of weight l of sub-block j: bit j of qh[l] */
        const uint4 a = lds16(blk + 16), b = lds16(blk + 32);
        qh[0] = a.x, qh[1] = a.y, qh[2] = a.z, qh[3] = a.w;
        qh[4] = b.x, qh[5] = b.y, qh[6] = b.z, qh[7] = b.w;
    }
    /* six-bit scales of sub-blocks 0..3 and 4..7 (kblock_kq's unpacking) */
    const uint32_t sc_lo = hd.y & 0x3F3F3F3Fu;
    const uint32_t sc_hi = (hd.w & 0x0F0F0F0Fu) | ((hd.y >> 2) & 0x30303030u);
    int he = 0, le = 0, ho = 0, lo = 0; /* sum sc_j dot_j over even / odd sub-blocks */
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const uint4 w0 = lds16(blk + QS + 32 * c), w1 = lds16(blk + QS + 32 * c + 16);
        const uint32_t wq[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        int dhe = 0, dle = 0, dho = 0, dlo = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint4 xe = lds16(xk + mmb_xunit(false, 8 * c + k));     /* sub-block 2c */
            const uint4 xo = lds16(xk + mmb_xunit(false, 8 * c + 4 + k)); /* 2c + 1 */
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int m = 2 * k + e;
                const uint32_t wv = wq[m];
                if constexpr (Q5) {
                    const uint32_t qe =
                        (wv & 0x0F0F0F0Fu) | (((qh[m] >> (2 * c)) & 0x01010101u) << 4);
                    const uint32_t qo = ((wv >> 4) & 0x0F0F0F0Fu) |
                                        (((qh[m] >> (2 * c + 1)) & 0x01010101u) << 4);
                    dhe = dp4a_ss(qe, e ? xe.y : xe.x, dhe);
                    dle = dp4a_ss(qe, e ? xe.w : xe.z, dle);
                    dho = dp4a_ss(qo, e ? xo.y : xo.x, dho);
                    dlo = dp4a_ss(qo, e ? xo.w : xo.z, dlo);
                } else {
                    const uint32_t qe = wv & 0x0F0F0F0Fu, qo16 = wv & 0xF0F0F0F0u;
                    dhe = dp4a_ss(qe, e ? xe.y : xe.x, dhe);
                    dle = dp4a_ss(qe, e ? xe.w : xe.z, dle);
                    dho = dp4a_us(qo16, e ? xo.y : xo.x, dho);
                    dlo = dp4a_us(qo16, e ? xo.w : xo.z, dlo);
                }
            }
        }
        const uint32_t scw = c < 2 ? sc_lo : sc_hi;
        const int se = ubyte(scw, (2 * c) & 3), so = ubyte(scw, (2 * c + 1) & 3);
        he += se * dhe;
        le += se * dle;
        ho += so * dho;
        lo += so * dlo;
    }
    const int H = Q5 ? he + ho : he + (ho >> 4);
    const int L = Q5 ? le + lo : le + (lo >> 4);
    /* M = sum_j m_j sum32_j with the sums as digits s0 + 256 s1 + 65536 s2 */
    const uint32_t m_lo = hd.z & 0x3F3F3F3Fu;
    const uint32_t m_hi = ((hd.w >> 4) & 0x0F0F0F0Fu) | ((hd.z >> 2) & 0x30303030u);
    const uint4 a0 = lds16(xk + MMB_XAUX_AT), a1 = lds16(xk + MMB_XAUX_AT + 16);
    const int t0 = dp4a_us(m_hi, a1.x, dp4a_us(m_lo, a0.x, 0));
    const int t1 = dp4a_us(m_hi, a1.y, dp4a_us(m_lo, a0.y, 0));
    const int t2 = dp4a_us(m_hi, a1.z, dp4a_us(m_lo, a0.z, 0));
    const int M = t0 + 256 * t1 + 65536 * t2;
    const float dx = __uint_as_float(a0.w);
    const float I = __fmaf_rn(256.0f, __int2float_rn(H), __int2float_rn(L));
    acc = __fmaf_rn(__fmul_rn(dx, f16f(hd.x)), I, acc);
    acc = __fmaf_rn(-__fmul_rn(dx, f16f(hd.x >> 16)), __int2float_rn(M), acc);
}

/* Q6_K super-block at blk (any even offset): ql[128], qh[64], int8 scales[16], f16 d. Half n,
 * position p = 0..31 of quarter qq is weight 128n + 32qq + p: low (qq = 0, 1) or high
 * (2, 3) nibble of ql[64n + 32 (qq & 1) + p], bits 2qq of qh[32n + p], scale 8n + 2qq + p/16
 * (kblock_q6k's mapping). Unit-4 activations: inputs 4m .. of a quarter are unit
 * 16n + 4qq + m/2, hi in word 2 (m & 1), lo in 2 (m & 1) + 1. C = sum_k sc_k sum16_k by dp4a
 * of the scales with the digits of the 16-input sums. Then kblock_q6k's f32 steps. */
__device__ __forceinline__ void item_q6k(float &acc, const uint8_t *blk, const uint8_t *xk)
{
    const srow sr = srow_at(blk);
    uint32_t scw[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        scw[k] = srow_word(sr, 48 + k);
    const float d = f16f(srow_word(sr, 52));
    int H = 0, L = 0;
#pragma unroll
    for (int n = 0; n < 2; n++) {
        int dh[8] = {0, 0, 0, 0, 0, 0, 0, 0}, dl[8] = {0, 0, 0, 0, 0, 0, 0, 0}; /* [2qq + p/16] */
#pragma unroll
        for (int m = 0; m < 8; m++) {
            const uint32_t qa = srow_word(sr, 16 * n + m), qb = srow_word(sr, 16 * n + 8 + m);
            const uint32_t hb = srow_word(sr, 32 + 8 * n + m);
            const uint32_t q[4] = {(qa & 0x0F0F0F0Fu) | ((hb << 4) & 0x30303030u),
                                   (qb & 0x0F0F0F0Fu) | ((hb << 2) & 0x30303030u),
                                   ((qa >> 4) & 0x0F0F0F0Fu) | (hb & 0x30303030u),
                                   ((qb >> 4) & 0x0F0F0F0Fu) | ((hb >> 2) & 0x30303030u)};
#pragma unroll
            for (int qq = 0; qq < 4; qq++) {
                const uint4 x = lds16(xk + mmb_xunit(false, 16 * n + 4 * qq + m / 2));
                const int g = 2 * qq + m / 4;
                dh[g] = dp4a_us(q[qq], (m & 1) ? x.z : x.x, dh[g]);
                dl[g] = dp4a_us(q[qq], (m & 1) ? x.w : x.y, dl[g]);
            }
        }
#pragma unroll
        for (int g = 0; g < 8; g++) { /* scale k = 8n + g */
            const int sc = sbyte(scw[2 * n + g / 4], g % 4);
            H += sc * dh[g];
            L += sc * dl[g];
        }
    }
    int c0 = 0, c1 = 0, c2 = 0;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const uint4 s = lds16(xk + MMB_XAUX_AT + 16 * u);
        c0 = dp4a_ss(scw[u], s.x, c0);
        c1 = dp4a_ss(scw[u], s.y, c1);
        c2 = dp4a_ss(scw[u], s.z, c2);
    }
    const int C = c0 + 256 * c1 + 65536 * c2;
    const float dx = __uint_as_float(lds16(xk + MMB_XAUX_AT).w);
    const float I = __fmaf_rn(-32.0f, __int2float_rn(C),
                              __fmaf_rn(256.0f, __int2float_rn(H), __int2float_rn(L)));
    acc = __fmaf_rn(__fmul_rn(dx, d), I, acc);
}

/* Q8_0 k-block at blk (any even offset): n_in (1..4) blocks of f16 d and int8 q[32]; block b
 * meets units 4b .. 4b+3 (unit-8 interleave). kblock_q80's steps, blocks in order. */
__device__ __forceinline__ void item_q80(float &acc, const uint8_t *blk, const uint8_t *xk,
                                         int n_in)
{
    const float dx = __uint_as_float(lds16(xk + MMB_XAUX_AT).x);
#pragma unroll
    for (int b = 0; b < 4; b++) {
        if (b >= n_in)
            break;
        const uint8_t *p = blk + 34 * b;
        const float d = f16f(*(const uint16_t *)p); /* even offset */
        const srow sr = srow_at(p + 2);
        int dh = 0, dl = 0;
#pragma unroll
        for (int m = 0; m < 8; m++) {
            const uint32_t q = srow_word(sr, m);
            const uint4 x = lds16(xk + mmb_xunit(true, 4 * b + m / 2));
            dh = dp4a_ss(q, (m & 1) ? x.y : x.x, dh);
            dl = dp4a_ss(q, (m & 1) ? x.w : x.z, dl);
        }
        acc = __fmaf_rn(__fmul_rn(dx, d), __int2float_rn(256 * dh + dl), acc);
    }
}

#endif /* MMB_SM90 */

} /* namespace */

#endif
