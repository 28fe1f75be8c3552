/* How each quantised layout becomes int8 MMA fragments (matmul_quant.cu's kernel includes
 * this once): the tile constants, the per-type staging layout, the MMA and shared-memory
 * helpers, this lane's view of the rounded activations, and one function per type that
 * consumes one staged k-block (kblock_kq for Q4_K/Q5_K, kblock_q6k, kblock_q80). The
 * fragment conventions and the order of the f32 operations are in matmul_quant.cu's header
 * comment. */
#ifndef TANDEM_KERNELS_CUDA_MATMUL_QUANT_BLOCKS_CUH
#define TANDEM_KERNELS_CUDA_MATMUL_QUANT_BLOCKS_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/matmul_internal.h"
#include "kernels/cuda/matmul_quant_addr.h"

namespace {

constexpr int KSPLIT = MMQ_KSPLIT; /* warps per CTA, each owning every 4th k-block */
constexpr int MROWS = MMQ_MROWS;   /* weight rows per MMA */
constexpr int NTOK = MMQ_NTOK;     /* tokens per MMA */

/* Per-type layout of one k-block as staged. SEG: bytes staged per row (the block, plus room
 * to start at the 16-byte boundary below it when rows are not 16-byte aligned); STRIDE:
 * bytes between staged rows (>= SEG, chosen so the 8 rows one load touches spread over the
 * shared-memory banks). Q4_K and Q5_K rows and blocks are multiples of 16 bytes, so with
 * 16-byte aligned data every k-block starts its staged row and fields are read with aligned
 * loads; Q6_K (210) and Q8_0 (34) blocks sit at any even offset (so 224 and 160 bytes
 * from the boundary below cover them) and are read through srow. */
template <int T> struct qt;
template <> struct qt<TD_Q4_K> {
    static constexpr int KB_W = MMQ_Q4_K_KB_W, KB_BYTES = MMQ_Q4_K_KB_BYTES,
                         SEG = MMQ_Q4_K_SEG, STRIDE = MMQ_Q4_K_STRIDE;
    static constexpr bool ALIGNED = true;
};
template <> struct qt<TD_Q5_K> {
    static constexpr int KB_W = MMQ_Q5_K_KB_W, KB_BYTES = MMQ_Q5_K_KB_BYTES,
                         SEG = MMQ_Q5_K_SEG, STRIDE = MMQ_Q5_K_STRIDE;
    static constexpr bool ALIGNED = true;
};
template <> struct qt<TD_Q6_K> {
    static constexpr int KB_W = MMQ_Q6_K_KB_W, KB_BYTES = MMQ_Q6_K_KB_BYTES,
                         SEG = MMQ_Q6_K_SEG, STRIDE = MMQ_Q6_K_STRIDE;
    static constexpr bool ALIGNED = false;
};
template <> struct qt<TD_Q8_0> {
    static constexpr int KB_W = MMQ_Q8_0_KB_W, KB_BYTES = MMQ_Q8_0_KB_BYTES,
                         SEG = MMQ_Q8_0_SEG, STRIDE = MMQ_Q8_0_STRIDE;
    static constexpr bool ALIGNED = false;
};

/* Offset of row i's block inside its staged row (Q6_K, Q8_0). */
__device__ __forceinline__ int stage_delta(const uint8_t *kbase, uint32_t row_bytes, int i)
{
    return mmq_row_misalign((uint32_t)(uintptr_t)kbase, row_bytes, i, false);
}

/* --- small device helpers ---------------------------------------------------------------- */

__device__ __forceinline__ void mma_k32(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

__device__ __forceinline__ void mma_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0)
{
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%7,%7,%7};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

__device__ __forceinline__ float f16f(uint32_t bits16)
{
    return __half2float(__ushort_as_half((unsigned short)(bits16 & 0xFFFF)));
}

/* Byte k of w, zero- or sign-extended: one prmt (a selector nibble with its top bit set
 * replicates the sign of the byte it picks). */
__device__ __forceinline__ int ubyte(uint32_t w, int k)
{
    uint32_t r;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(w), "r"(0x4440u | k));
    return (int)r;
}
__device__ __forceinline__ int sbyte(uint32_t w, int k)
{
    const uint32_t s = 8u | k;
    uint32_t r;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(w), "r"(k | s << 4 | s << 8 | s << 12));
    return (int)r;
}

/* Words of a staged block that starts at any byte offset in shared memory: word k (bytes
 * 4k..4k+3 from the start) is a funnel shift of two aligned loads. The shared window is
 * aligned, so the generic address has the offset's low bits; stepping back with pointer
 * arithmetic keeps the compiler on shared-memory loads. The word after the last one read
 * must be inside the allocation, which the row padding guarantees. */
struct srow {
    const uint32_t *w; /* aligned word at or below the start */
    unsigned sh;       /* 8 * (start & 3) */
};

__device__ __forceinline__ srow srow_at(const uint8_t *p)
{
    const unsigned mis = (unsigned)(uintptr_t)p & 3;
    return {(const uint32_t *)(p - mis), mis * 8};
}

__device__ __forceinline__ uint32_t srow_word(srow r, int k)
{
    return __funnelshift_r(r.w[k], r.w[k + 1], r.sh);
}

/* Lane = 4g + t. */
struct lane_pos {
    int g, t;
};

/* This lane's view of the activations of one k-block: token 8nt+g of n-tile nt. */
struct xview {
    const int8_t *q;   /* xq of token g from the k-block's first input */
    const int8_t *s;   /* xsum of token g for the x block holding the k-block */
    const float *d;    /* xd of token 2t for that x block */
    size_t q_tile;     /* bytes between n-tiles in q: 8 tokens of 2 * cols */
    unsigned valid;    /* bit nt: token 8nt+g exists */
};

__device__ __forceinline__ xview xview_at(const mm_xquant &xq, int64_t cols, int64_t k0,
                                          unsigned valid, lane_pos l)
{
    const size_t jb = (size_t)(k0 / MM_XBLOCK);
    return {xq.xq + (size_t)l.g * 2 * cols + 2 * k0,
            xq.xsum + (jb * xq.n_pad + l.g) * MM_XSUM_BYTES, xq.xd + jb * xq.n_pad + 2 * l.t,
            (size_t)NTOK * 2 * cols, valid};
}

/* B fragments of a k32 MMA pair from the digits of the 8 inputs at offset `in` (a multiple
 * of 8, from the k-block's start) of token 8nt+g: {hi reg0, hi reg1, lo reg0, lo reg1}.
 * With in = 32j + 8t these are k slots 4t..4t+3 then 16+4t..16+4t+3 of sub-block j. Absent
 * tokens give zeros without a load. */
__device__ __forceinline__ uint4 load_b16(const xview &v, int nt, int in)
{
    if (!((v.valid >> nt) & 1))
        return make_uint4(0, 0, 0, 0);
    return __ldg((const uint4 *)(v.q + nt * v.q_tile + 2 * in));
}

/* B fragments of a k16 MMA pair from the 4 inputs at `in` (a multiple of 4): {hi, lo}. */
__device__ __forceinline__ uint2 load_b8(const xview &v, int nt, int in)
{
    if (!((v.valid >> nt) & 1))
        return make_uint2(0, 0);
    return __ldg((const uint2 *)(v.q + nt * v.q_tile + 2 * in));
}

/* 16 bytes at off of token 8nt+g's sums: the digit words s0, s1, s2 (zeros if absent). */
__device__ __forceinline__ uint4 load_sums(const xview &v, int nt, int off)
{
    if (!((v.valid >> nt) & 1))
        return make_uint4(0, 0, 0, 0);
    return __ldg((const uint4 *)(v.s + nt * NTOK * MM_XSUM_BYTES + off));
}

/* Scales of tokens 8nt+2t and 8nt+2t+1 (0 for padding tokens). */
__device__ __forceinline__ float2 load_dx(const xview &v, int nt)
{
    return __ldg((const float2 *)(v.d + nt * NTOK));
}

/* The same view of activations staged in shared memory (matmul_bulk_mma.cu copies a window
 * of k-blocks there): plain loads instead of __ldg, the same layout within a token's row,
 * token rows q_tile / 8 bytes apart. */
struct xview_s {
    const int8_t *q, *s;
    const float *d;
    size_t q_tile;
    unsigned valid;
};

__device__ __forceinline__ uint4 load_b16(const xview_s &v, int nt, int in)
{
    if (!((v.valid >> nt) & 1))
        return make_uint4(0, 0, 0, 0);
    return *(const uint4 *)(v.q + nt * v.q_tile + 2 * in);
}

__device__ __forceinline__ uint2 load_b8(const xview_s &v, int nt, int in)
{
    if (!((v.valid >> nt) & 1))
        return make_uint2(0, 0);
    return *(const uint2 *)(v.q + nt * v.q_tile + 2 * in);
}

__device__ __forceinline__ uint4 load_sums(const xview_s &v, int nt, int off)
{
    if (!((v.valid >> nt) & 1))
        return make_uint4(0, 0, 0, 0);
    return *(const uint4 *)(v.s + nt * NTOK * MM_XSUM_BYTES + off);
}

__device__ __forceinline__ float2 load_dx(const xview_s &v, int nt)
{
    return *(const float2 *)(v.d + nt * NTOK);
}

/* The three digit MMAs of a sum term: A (rows g, g+8) against s0, s1, s2, recombined
 * exactly as D0 + 256 D1 + 65536 D2 (every operand fits, see MM_XSUM_BYTES). */
__device__ __forceinline__ void mma_digits(int (&out)[4], uint32_t a0, uint32_t a1, uint4 s)
{
    int d0[4], d1[4], d2[4];
    mma_k16(d0, a0, a1, s.x);
    mma_k16(d1, a0, a1, s.y);
    mma_k16(d2, a0, a1, s.z);
#pragma unroll
    for (int i = 0; i < 4; i++)
        out[i] = d0[i] + 256 * d1[i] + 65536 * d2[i];
}

/* n-tiles handled per pass over a k-block's weight fragments: the integer partial sums of
 * two n-tiles fit the registers beside everything else; more tokens take more passes. */
template <int NT> __host__ __device__ constexpr int pass_tiles()
{
    return NT < 2 ? NT : 2;
}

/* --- one k-block per type ----------------------------------------------------------------- */

/* Q4_K / Q5_K (Q5 = true): 144 / 176-byte super-blocks, staged 16-byte aligned. Lane (g, t)
 * takes bytes 8t..8t+7 of each 32-byte qs chunk c of rows g and g+8: the low nibbles are
 * weights 64c + 8t..8t+7 (sub-block 2c), the high nibbles the same l of sub-block 2c+1, so
 * k slots 4t..4t+3 / 16+4t..16+4t+3 hold l = 8t..8t+3 / 8t+4..8t+7 of a sub-block: x bytes
 * 8t..8t+7 of that sub-block. The mins enter through three k16 MMAs per k-block
 * (mma_digits): A = the 8 six-bit mins of a row in k slots 0..7 (lanes t = 0, 1), B = the
 * digits of the token's 32-input sums (mm_xquant). */
template <bool Q5, int MT, int NT, int STRIDE, class XV>
__device__ __forceinline__ void kblock_kq(float (&acc)[MT][NT][4], const uint8_t *slot,
                                          const XV &x, lane_pos l)
{
    constexpr int QS = Q5 ? 48 : 16; /* offset of qs[128] in the block */
    /* header of rows g (h = 0) and g+8 (h = 1): d, dmin, 8 six-bit scales and mins */
    float d[MT][2], dmin[MT][2];
    uint32_t sc_lo[MT][2], sc_hi[MT][2], m_lo[MT][2], m_hi[MT][2];
    uint2 qh[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint8_t *row = slot + (mt * MROWS + l.g + 8 * h) * STRIDE;
            const uint4 hd = *(const uint4 *)row;
            d[mt][h] = f16f(hd.x);
            dmin[mt][h] = f16f(hd.x >> 16);
            /* scale bytes s[0..3] = hd.y, s[4..7] = hd.z, s[8..11] = hd.w. Sub-block j < 4:
             * sc = s[j] & 63, m = s[j+4] & 63; j >= 4: sc = s[j+4] & 15 | (s[j-4] >> 6) << 4,
             * m = s[j+4] >> 4 | (s[j] >> 6) << 4. One byte per j: */
            sc_lo[mt][h] = hd.y & 0x3F3F3F3Fu;
            m_lo[mt][h] = hd.z & 0x3F3F3F3Fu;
            sc_hi[mt][h] = (hd.w & 0x0F0F0F0Fu) | ((hd.y >> 2) & 0x30303030u);
            m_hi[mt][h] = ((hd.w >> 4) & 0x0F0F0F0Fu) | ((hd.z >> 2) & 0x30303030u);
            qh[mt][h] = Q5 ? *(const uint2 *)(row + 16 + 8 * l.t) : make_uint2(0, 0);
        }
    constexpr int NP = pass_tiles<NT>();
#pragma unroll
    for (int p0 = 0; p0 < NT; p0 += NP) {
        int ih[MT][NP][4], il[MT][NP][4]; /* H and L of the header comment */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int ii = 0; ii < NP; ii++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    ih[mt][ii][i] = il[mt][ii][i] = 0;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            uint32_t lo[MT][4], hi[MT][4]; /* A fragments of sub-blocks 2c and 2c+1 */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint8_t *row = slot + (mt * MROWS + l.g + 8 * h) * STRIDE;
                    const uint2 q = *(const uint2 *)(row + QS + 32 * c + 8 * l.t);
                    /* reg h = k 4t.. of row g+8h; reg 2+h = k 16+4t.. */
                    lo[mt][h] = q.x & 0x0F0F0F0Fu;
                    lo[mt][2 + h] = q.y & 0x0F0F0F0Fu;
                    hi[mt][h] = (q.x >> 4) & 0x0F0F0F0Fu;
                    hi[mt][2 + h] = (q.y >> 4) & 0x0F0F0F0Fu;
                    if (Q5) { /* fifth bit: bit 2c (low) / 2c+1 (high) of qh[l] */
                        lo[mt][h] |= ((qh[mt][h].x >> (2 * c)) & 0x01010101u) << 4;
                        lo[mt][2 + h] |= ((qh[mt][h].y >> (2 * c)) & 0x01010101u) << 4;
                        hi[mt][h] |= ((qh[mt][h].x >> (2 * c + 1)) & 0x01010101u) << 4;
                        hi[mt][2 + h] |= ((qh[mt][h].y >> (2 * c + 1)) & 0x01010101u) << 4;
                    }
                }
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int j = 2 * c + half; /* sub-block in the super-block */
                int sc[MT][2];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        sc[mt][h] = ubyte(j < 4 ? sc_lo[mt][h] : sc_hi[mt][h], j & 3);
#pragma unroll
                for (int ii = 0; ii < NP; ii++) {
                    const uint4 b = load_b16(x, p0 + ii, 32 * j + 8 * l.t);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        uint32_t a[4];
#pragma unroll
                        for (int r = 0; r < 4; r++)
                            a[r] = half ? hi[mt][r] : lo[mt][r];
                        int dh[4], dl[4];
                        mma_k32(dh, a[0], a[1], a[2], a[3], b.x, b.y);
                        mma_k32(dl, a[0], a[1], a[2], a[3], b.z, b.w);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            ih[mt][ii][i] += sc[mt][i >> 1] * dh[i];
                            il[mt][ii][i] += sc[mt][i >> 1] * dl[i];
                        }
                    }
                }
            }
        }
        /* mins: A = the row's 8 mins in k slots 0..7 (lanes t = 0, 1), B = the sums */
#pragma unroll
        for (int ii = 0; ii < NP; ii++) {
            const int nt = p0 + ii;
            const uint4 bs = l.t < 2 ? load_sums(x, nt, 16 * l.t) : make_uint4(0, 0, 0, 0);
            const float2 dx = load_dx(x, nt);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const uint32_t a0 = l.t == 0 ? m_lo[mt][0] : l.t == 1 ? m_hi[mt][0] : 0u;
                const uint32_t a1 = l.t == 0 ? m_lo[mt][1] : l.t == 1 ? m_hi[mt][1] : 0u;
                int msum[4];
                mma_digits(msum, a0, a1, bs);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int h = i >> 1;                    /* row g or g+8 */
                    const float dxt = (i & 1) ? dx.y : dx.x; /* token 2t or 2t+1 */
                    const float I = __fmaf_rn(256.0f, __int2float_rn(ih[mt][ii][i]),
                                              __int2float_rn(il[mt][ii][i]));
                    float a = acc[mt][nt][i];
                    a = __fmaf_rn(__fmul_rn(dxt, d[mt][h]), I, a);
                    a = __fmaf_rn(-__fmul_rn(dxt, dmin[mt][h]), __int2float_rn(msum[i]), a);
                    acc[mt][nt][i] = a;
                }
            }
        }
    }
}

/* Q6_K: 210-byte super-blocks at any even offset. Scales cover 16 weights, so each MMA is a
 * k16 over one group: half n, l in 16gh + 4t..4t+3, quarter q (weights 128n + 32q + l, scale
 * index k = 8n + 2q + gh, which is also the group's position / 16). Lane (g, t) reads
 * ql[64n + 16gh + 4t] (q = 0 low, q = 2 high nibbles), ql[64n + 32 + ...] (q = 1, 3) and
 * qh[32n + 16gh + 4t] (2 bits per q). The weights go in as 0..63; the -32 comes back as
 * -32 * sum_k sc_k * sum16_k, three k16 MMAs (mma_digits) with A = the 16 int8 scales of a
 * row (lane t: scales 4t..4t+3, the word at 192 + 4t) and B = the digits of the token's
 * 16-input sums. PAIRS: the tile's fragment rows f < 8 hold its rows 2f, f >= 8 its rows
 * 2(f - 8) + 1 (staged by pairs of rows, tile_weights), so row f's block sits that row's
 * misalignment into its staged row. */
template <int MT, int NT, int STRIDE, bool PAIRS, class XV>
__device__ __forceinline__ void kblock_q6k(float (&acc)[MT][NT][4], const uint8_t *slot,
                                           const uint8_t *kbase, uint32_t row_bytes,
                                           const XV &x, lane_pos l)
{
    srow ql[MT][2]; /* this lane's column (bytes 4t..) of ql/qh */
    float d[MT][2];
    uint32_t scw[MT][2][4]; /* the 16 int8 scales */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = mt * MROWS + l.g + 8 * h;
            const int r = PAIRS ? mt * MROWS + 2 * l.g + h : i; /* the tile's row */
            const uint8_t *row = slot + i * STRIDE + stage_delta(kbase, row_bytes, r);
            d[mt][h] = f16f(*(const uint16_t *)(row + 208)); /* even offset */
            const srow sr = srow_at(row + 192);
#pragma unroll
            for (int k = 0; k < 4; k++)
                scw[mt][h][k] = srow_word(sr, k);
            ql[mt][h] = srow_at(row + 4 * l.t);
        }
    constexpr int NP = pass_tiles<NT>();
#pragma unroll
    for (int p0 = 0; p0 < NT; p0 += NP) {
        int ih[MT][NP][4], il[MT][NP][4]; /* H and L of the header comment */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int ii = 0; ii < NP; ii++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    ih[mt][ii][i] = il[mt][ii][i] = 0;
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int gh = 0; gh < 2; gh++) {
                uint32_t q[4][MT][2]; /* per quarter: rows g, g+8, values 0..63 */
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        /* words at 64n + 16gh, 64n + 32 + 16gh, 128 + 32n + 16gh (+ 4t) */
                        const uint32_t qa = srow_word(ql[mt][h], 16 * n + 4 * gh);
                        const uint32_t qb = srow_word(ql[mt][h], 16 * n + 8 + 4 * gh);
                        const uint32_t hb = srow_word(ql[mt][h], 32 + 8 * n + 4 * gh);
                        q[0][mt][h] = (qa & 0x0F0F0F0Fu) | ((hb << 4) & 0x30303030u);
                        q[1][mt][h] = (qb & 0x0F0F0F0Fu) | ((hb << 2) & 0x30303030u);
                        q[2][mt][h] = ((qa >> 4) & 0x0F0F0F0Fu) | (hb & 0x30303030u);
                        q[3][mt][h] = ((qb >> 4) & 0x0F0F0F0Fu) | ((hb >> 2) & 0x30303030u);
                    }
#pragma unroll
                for (int qq = 0; qq < 4; qq++) {
                    const int k = 8 * n + 2 * qq + gh; /* scale index */
                    int sc[MT][2];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            sc[mt][h] = sbyte(scw[mt][h][k >> 2], k & 3);
#pragma unroll
                    for (int ii = 0; ii < NP; ii++) {
                        const uint2 b =
                            load_b8(x, p0 + ii, 128 * n + 32 * qq + 16 * gh + 4 * l.t);
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            int dh[4], dl[4];
                            mma_k16(dh, q[qq][mt][0], q[qq][mt][1], b.x);
                            mma_k16(dl, q[qq][mt][0], q[qq][mt][1], b.y);
#pragma unroll
                            for (int i = 0; i < 4; i++) {
                                ih[mt][ii][i] += sc[mt][i >> 1] * dh[i];
                                il[mt][ii][i] += sc[mt][i >> 1] * dl[i];
                            }
                        }
                    }
                }
            }
        /* the -32: A = a row's 16 scales (lane t: scales 4t..4t+3), B = the 16-input sums */
#pragma unroll
        for (int ii = 0; ii < NP; ii++) {
            const int nt = p0 + ii;
            const uint4 bs = load_sums(x, nt, 32 + 16 * l.t);
            const float2 dx = load_dx(x, nt);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                uint32_t a0 = scw[mt][0][0], a1 = scw[mt][1][0];
#pragma unroll
                for (int k = 1; k < 4; k++)
                    if (l.t == k)
                        a0 = scw[mt][0][k], a1 = scw[mt][1][k];
                int csum[4];
                mma_digits(csum, a0, a1, bs);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int h = i >> 1;
                    const float dxt = (i & 1) ? dx.y : dx.x;
                    const float I = __fmaf_rn(-32.0f, __int2float_rn(csum[i]),
                                              __fmaf_rn(256.0f, __int2float_rn(ih[mt][ii][i]),
                                                        __int2float_rn(il[mt][ii][i])));
                    acc[mt][nt][i] = __fmaf_rn(__fmul_rn(dxt, d[mt][h]), I, acc[mt][nt][i]);
                }
            }
        }
    }
}

/* Q8_0: a k-block is up to 4 blocks of 34 bytes (f16 d, int8 q[32]) at any even offset (the
 * last k-block of a row may hold fewer). Lane (g, t) takes q[8t..8t+7] of rows g and g+8.
 * Two k-blocks share one x block (256 inputs). */
template <int MT, int NT, int STRIDE, class XV>
__device__ __forceinline__ void kblock_q80(float (&acc)[MT][NT][4], const uint8_t *slot,
                                           const uint8_t *kbase, uint32_t row_bytes, int n_blk,
                                           const XV &x, lane_pos l)
{
    const uint8_t *row[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = mt * MROWS + l.g + 8 * h;
            row[mt][h] = slot + i * STRIDE + stage_delta(kbase, row_bytes, i);
        }
    constexpr int NP = pass_tiles<NT>();
#pragma unroll
    for (int p0 = 0; p0 < NT; p0 += NP) {
        float2 dx[NP];
#pragma unroll
        for (int ii = 0; ii < NP; ii++)
            dx[ii] = load_dx(x, p0 + ii);
#pragma unroll
        for (int b = 0; b < 4; b++) {
            if (b >= n_blk)
                break;
            uint32_t a[MT][4];
            float dw[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint8_t *blk = row[mt][h] + 34 * b;
                    dw[mt][h] = f16f(*(const uint16_t *)blk); /* even offset */
                    const srow q = srow_at(blk + 2 + 8 * l.t);
                    a[mt][h] = srow_word(q, 0);
                    a[mt][2 + h] = srow_word(q, 1);
                }
#pragma unroll
            for (int ii = 0; ii < NP; ii++) {
                const int nt = p0 + ii;
                const uint4 bx = load_b16(x, nt, 32 * b + 8 * l.t);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    int dh[4], dl[4];
                    mma_k32(dh, a[mt][0], a[mt][1], a[mt][2], a[mt][3], bx.x, bx.y);
                    mma_k32(dl, a[mt][0], a[mt][1], a[mt][2], a[mt][3], bx.z, bx.w);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float dxt = (i & 1) ? dx[ii].y : dx[ii].x;
                        acc[mt][nt][i] = __fmaf_rn(__fmul_rn(dxt, dw[mt][i >> 1]),
                                                   __int2float_rn(256 * dh[i] + dl[i]),
                                                   acc[mt][nt][i]);
                    }
                }
            }
        }
    }
}

/* One staged k-block of a tile through the type's MMAs (n_blk: the k-block's Q8_0 blocks).
 * The one dispatch of the tensor-core kernels, whichever way their weights and activations
 * were staged: staged rows STRIDE bytes apart (the type's qt<T>::STRIDE unless given), row
 * i's block at slot + i * STRIDE (Q6_K/Q8_0: plus the misalignment of kbase + i * row_bytes),
 * activations through x (xview: global memory, xview_s: shared); PAIRS: Q6_K rows staged by
 * pairs (kblock_q6k). */
template <int T, int MT, int NT, int STRIDE = qt<T>::STRIDE, bool PAIRS = false, class XV>
__device__ __forceinline__ void kblock_any(float (&acc)[MT][NT][4], const uint8_t *slot,
                                           const uint8_t *kbase, uint32_t row_bytes, int n_blk,
                                           const XV &x, lane_pos l)
{
    if constexpr (T == TD_Q4_K || T == TD_Q5_K)
        kblock_kq<T == TD_Q5_K, MT, NT, STRIDE>(acc, slot, x, l);
    else if constexpr (T == TD_Q6_K)
        kblock_q6k<MT, NT, STRIDE, PAIRS>(acc, slot, kbase, row_bytes, x, l);
    else
        kblock_q80<MT, NT, STRIDE>(acc, slot, kbase, row_bytes, n_blk, x, l);
}

/* The reduction over the KSPLIT warps of a tile, in two halves so that kernels with other
 * barriers share it: red_put stores warp k's partials acc at red [KSPLIT][MROWS * MT][NTOK *
 * NT] (k = 0..KSPLIT-1), red_sum gives ((p0 + p1) + p2) + p3 for (row rl, token tk). */
template <int MT, int NT>
__device__ __forceinline__ void red_put(float *red, const float (&acc)[MT][NT][4], int k,
                                        lane_pos l)
{
    constexpr int ROWS = MROWS * MT, TOKS = NTOK * NT;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            float *p = red + (k * ROWS + mt * MROWS + l.g) * TOKS + nt * NTOK + 2 * l.t;
            p[0] = acc[mt][nt][0];
            p[1] = acc[mt][nt][1];
            p[8 * TOKS] = acc[mt][nt][2];
            p[8 * TOKS + 1] = acc[mt][nt][3];
        }
}

template <int MT, int NT>
__device__ __forceinline__ float red_sum(const float *red, int rl, int tk)
{
    constexpr int ROWS = MROWS * MT, TOKS = NTOK * NT;
    float v = red[rl * TOKS + tk];
#pragma unroll
    for (int k = 1; k < KSPLIT; k++)
        v = __fadd_rn(v, red[(k * ROWS + rl) * TOKS + tk]);
    return v;
}

/* Waits for the KSPLIT warps of barrier `group` (0: a CTA of exactly those warps). */
__device__ __forceinline__ void group_sync(int group)
{
    asm volatile("bar.sync %0, %1;" ::"r"(group), "n"(KSPLIT * 32) : "memory");
}

/* A tile's result: y = ((p0 + p1) + p2) + p3 over the KSPLIT warps' partials acc, met in red;
 * rows n_rows (0: none) of the tile at row r0 of y [n_tok][rows]. Called by every thread of
 * the tile's KSPLIT warps (chain k = warp), which meet at named barrier `group`; red is free
 * again when it returns. PAIRS (MT 1): fragment row f holds the tile's row 2f (f < 8) or
 * 2(f - 8) + 1 (kblock_q6k). */
template <int MT, int NT, bool PAIRS = false>
__device__ __forceinline__ void tile_reduce(float *y, float *red, const float (&acc)[MT][NT][4],
                                            int k, lane_pos l, int group, int n_rows,
                                            int n_tok, int64_t rows, int64_t r0)
{
    constexpr int ROWS = MROWS * MT;
    red_put<MT, NT>(red, acc, k, l);
    group_sync(group);
    for (int idx = k * 32 + (int)(threadIdx.x & 31); idx < ROWS * n_tok; idx += KSPLIT * 32) {
        const int rl = idx % ROWS, tk = idx / ROWS;
        static_assert(!PAIRS || MT == 1, "pairs of rows in one 16-row tile");
        if (rl < n_rows)
            y[(size_t)tk * rows + r0 + rl] =
                red_sum<MT, NT>(red, PAIRS ? (rl >> 1) + 8 * (rl & 1) : rl, tk);
    }
    group_sync(group); /* the next tile writes red again */
}

} /* namespace */

#endif
