/* y = x . W^T for one token (decode) and Q4_K, Q5_K, Q6_K, Q8_0 weights: integer dot
 * products (dp4a) on the CUDA cores, weights loaded straight into registers, no shared
 * memory. cuda_matmul runs it where the H200 measured it ahead of the tensor-core kernel
 * (mmd_preferred: Q4_K at 4 rows per warp); TANDEM_MMD=regs runs it for every single token.
 * Its in-flight weight loads of a lane share one scoreboard in the SASS, so each k-block
 * waits for all of them (NOTES.md, round 2).
 *
 * Why a kernel of its own: with one token the tensor-core kernel (matmul_quant.cu) wastes 7/8
 * of every MMA and is bound by latency and its grid (Nsight Compute on an H200, 5120 ->
 * 17408 Q4_K: 20 warps per SM allowed by its shared-memory ring, 0.64 eligible warps per
 * scheduler, 1.65 waves of CTAs, 27% of the elapsed cycles with idle SMs, DRAM at 38%). Here
 * a warp owns whole rows, the grid holds only resident CTAs whose warps loop over rows (sized
 * so that the last round is nearly full), and each lane keeps DEPTH k-blocks of loads in
 * flight in registers.
 *
 * The arithmetic is that of matmul_quant.cu exactly (its header comment), so a token's result
 * does not depend on which kernel ran it:
 *
 *   A warp is 8 groups of 4 lanes, group g = 4h + q: rows of half h (R each), accumulation
 *   chain q = the k-blocks q, q+4, q+8, ... of those rows in increasing order (the
 *   tensor-core kernel's warp q). Per (row, k-block) the exact integers of matmul_quant.cu
 *   (K-quants: H = sum_j sc_j * dot_hi_j, L = sum_j sc_j * dot_lo_j, M = sum_j m_j * sum32_j
 *   or C = sum_k sc_k * sum16_k) come from per-lane partial sums (dp4a) and a 2-step integer
 *   butterfly in the group (integer sums do not depend on their order); then the same f32
 *   steps with the same _rn intrinsics, e.g. Q4_K/Q5_K
 *     I = fma(256, float(H), float(L)); acc = fma(dx * d, I, acc);
 *     acc = fma(-(dx * dmin), float(M), acc)
 *   and finally y = ((p0 + p1) + p2) + p3 over the chains.
 *
 * Q4_K/Q5_K: lane i of a group takes qs chunk i (32 bytes): the low nibbles are weights
 * 0..31 of sub-block 2i, the high nibbles those of sub-block 2i+1, so one lane covers two
 * whole sub-blocks (their scales, mins and sums). Its activations are 8 x 16 bytes (hi/lo
 * digits of 8 inputs each); matmul.cu lays the 256-input block out for this kernel
 * (mm_decode_unit_pos) so that the k-th load of the 4 lanes of a group is 64 contiguous
 * bytes. Q6_K and Q8_0 mappings are described at their functions. */
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/matmul_internal.h"

namespace {

constexpr int WARPS = 4; /* per CTA; each warp is independent (no barrier, no shared memory) */

/* 16 bytes the kernel reads once: not kept in L1, where the activations live. */
__device__ __forceinline__ uint4 ld_stream(const uint8_t *p)
{
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__device__ __forceinline__ float f16f(uint32_t bits16)
{
    return __half2float(__ushort_as_half((unsigned short)(bits16 & 0xFFFF)));
}

/* Byte k (0..3, may be a run-time value) of w, zero-extended. */
__device__ __forceinline__ int ubyte_at(uint32_t w, int k)
{
    uint32_t r;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(w), "r"(0x4440u | (uint32_t)k));
    return (int)r;
}

/* The sum of the four int8 of a, added to c. */
__device__ __forceinline__ int sum4(uint32_t a, int c)
{
    return __dp4a((int)a, 0x01010101, c);
}

/* Byte k (0..3, run-time) of w, sign-extended. */
__device__ __forceinline__ int sbyte_at(uint32_t w, int k)
{
    const uint32_t s = 8u | (uint32_t)k;
    uint32_t r;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(w), "r"((uint32_t)k | s << 4 | s << 8 | s << 12));
    return (int)r;
}

template <bool Q5> struct kq {
    static constexpr int BYTES = Q5 ? 176 : 144; /* one super-block */
    static constexpr int QS = Q5 ? 48 : 16;      /* offset of qs[128] */
};

/* Words a lane loads per row and k-block. */
template <int T> __host__ __device__ constexpr int load_regs()
{
    return T == TD_Q6_K ? 32 : T == TD_Q5_K ? 20 : 12; /* Q8_0: 12 */
}

/* k-blocks in flight per chain: about 48 registers of loads per lane, 2..4 k-blocks. */
template <int T, int R> __host__ __device__ constexpr int depth()
{
    return 48 / (R * load_regs<T>()) < 2 ? 2 : 48 / (R * load_regs<T>()) > 4 ? 4
                                               : 48 / (R * load_regs<T>());
}

/* One k-block of the group's R rows as this lane loads it. */
template <bool Q5, int R> struct kbuf {
    uint4 hd[R];    /* bytes 0..15: d, dmin, 12 scale bytes (the same 16 for the group) */
    uint4 qs[R][2]; /* qs bytes 32i .. 32i+31 */
    uint4 qh[R][2]; /* Q5_K: qh[0..31] (unused for Q4_K) */
};

template <bool Q5, int R>
__device__ __forceinline__ void kbuf_load(kbuf<Q5, R> &b, const uint8_t *const (&row)[R],
                                          int kb, int i)
{
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint8_t *blk = row[r] + (size_t)kb * kq<Q5>::BYTES;
        b.hd[r] = ld_stream(blk);
        b.qs[r][0] = ld_stream(blk + kq<Q5>::QS + 32 * i);
        b.qs[r][1] = ld_stream(blk + kq<Q5>::QS + 32 * i + 16);
        if constexpr (Q5) {
            b.qh[r][0] = ld_stream(blk + 16);
            b.qh[r][1] = ld_stream(blk + 32);
        }
    }
}

/* The group of 4 lanes (mask gm) sums v exactly; every lane of the group ends with the sum. */
__device__ __forceinline__ int group_sum(int v, unsigned gm)
{
    v += __shfl_xor_sync(gm, v, 1);
    v += __shfl_xor_sync(gm, v, 2);
    return v;
}

__device__ __forceinline__ uint32_t word_of(const uint4 (&v)[2], int m)
{
    const uint4 a = v[m >> 2];
    return (m & 3) == 0 ? a.x : (m & 3) == 1 ? a.y : (m & 3) == 2 ? a.z : a.w;
}

/* Adds k-block kb of R rows to acc (every lane of the group updates the same values). */
template <bool Q5, int R>
__device__ __forceinline__ void kbuf_use(float (&acc)[R], const kbuf<Q5, R> &b,
                                         const int8_t *xq, const float *xd, const int8_t *xs,
                                         int n_pad, int kb, int i, unsigned gm)
{
    const int8_t *xb = xq + (size_t)kb * 2 * MM_XBLOCK + 16 * i;
    /* sum32 of sub-blocks 2i, 2i+1 from the rounding kernel's digits (mm_xquant: s0, s1, s2
     * of j at 16 (j / 4) + 4 digit + j % 4): cheaper than summing the lane's 64 digits */
    const uint4 sv =
        __ldg((const uint4 *)(xs + (size_t)kb * n_pad * MM_XSUM_BYTES + 16 * (i >> 1)));
    int dh[2][R], dl[2][R], sum[2];
#pragma unroll
    for (int half = 0; half < 2; half++) { /* sub-block 2i + half: nibble `half` of qs */
        const int jb = 2 * (i & 1) + half; /* j % 4 */
        sum[half] = 65536 * sbyte_at(sv.z, jb) + 256 * sbyte_at(sv.y, jb) + sbyte_at(sv.x, jb);
        /* units k = 0..3 (inputs 8k..8k+7 of the sub-block), each {hi[0..3], hi[4..7],
         * lo[0..3], lo[4..7]} */
        uint4 x[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            x[k] = __ldg((const uint4 *)(xb + 64 * (4 * half + k)));
#pragma unroll
        for (int r = 0; r < R; r++) {
            int h = 0, l = 0;
#pragma unroll
            for (int m = 0; m < 8; m++) { /* weights 4m..4m+3 of the sub-block */
                uint32_t q = (word_of(b.qs[r], m) >> (4 * half)) & 0x0F0F0F0Fu;
                if constexpr (Q5) /* fifth bit of weight l of sub-block j: bit j of qh[l] */
                    q |= ((word_of(b.qh[r], m) >> (2 * i + half)) & 0x01010101u) << 4;
                const uint4 u = x[m >> 1];
                h = __dp4a((int)q, (int)((m & 1) ? u.y : u.x), h);
                l = __dp4a((int)q, (int)((m & 1) ? u.w : u.z), l);
            }
            dh[half][r] = h;
            dl[half][r] = l;
        }
    }
    const float dx = __ldg(xd + (size_t)kb * n_pad); /* token 0 */
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint4 hd = b.hd[r];
        /* scales and mins of sub-blocks j = 2i, 2i+1 (see kblock_kq): bytes j & 3 of the
         * low (j < 4) or high (j >= 4) words */
        const uint32_t scw = i < 2 ? hd.y & 0x3F3F3F3Fu
                                   : (hd.w & 0x0F0F0F0Fu) | ((hd.y >> 2) & 0x30303030u);
        const uint32_t mw = i < 2 ? hd.z & 0x3F3F3F3Fu
                                  : ((hd.w >> 4) & 0x0F0F0F0Fu) | ((hd.z >> 2) & 0x30303030u);
        const int sa = ubyte_at(scw, (2 * i) & 3), sb = ubyte_at(scw, (2 * i + 1) & 3);
        const int ma = ubyte_at(mw, (2 * i) & 3), mb = ubyte_at(mw, (2 * i + 1) & 3);
        const int H = group_sum(sa * dh[0][r] + sb * dh[1][r], gm);
        const int L = group_sum(sa * dl[0][r] + sb * dl[1][r], gm);
        const int M = group_sum(ma * sum[0] + mb * sum[1], gm);
        const float I = __fmaf_rn(256.0f, __int2float_rn(H), __int2float_rn(L));
        float a = acc[r];
        a = __fmaf_rn(__fmul_rn(dx, f16f(hd.x)), I, a);
        a = __fmaf_rn(-__fmul_rn(dx, f16f(hd.x >> 16)), __int2float_rn(M), a);
        acc[r] = a;
    }
}

/* --- Q6_K: 210-byte blocks at any even offset ------------------------------------------ */

/* Lane i of a group: half n = i / 2 of the super-block, weights l = 16 gh .. 16 gh + 15
 * (gh = i % 2) of each quarter qq: runs ql[64n + 16gh ..] (quarters 0, 2), ql[64n + 32 +
 * 16gh ..] (1, 3), qh[32n + 16gh ..] (2 bits per quarter), 16 bytes each, and scales
 * sc[8n + 2qq + gh] (the 16-input group k of kblock_q6k). A run starts a = block & 15 bytes
 * past a 16-byte boundary, so it is two aligned loads and a shift; so are the scales and d
 * (bytes 192..209). */
template <int R> struct kbuf6 {
    uint4 run[R][3][2]; /* the two aligned pieces under each run */
    uint4 sd[R][2];     /* the two aligned pieces under bytes 192..209 */
};

/* 16 bytes at p (16-byte aligned) of which only those below end exist: the last piece of
 * the matrix, read as 16-bit words (p and end are even) so nothing past end is touched. */
__device__ __noinline__ uint4 ld_tail(const uint8_t *p, const uint8_t *end)
{
    uint32_t v[4];
    for (int k = 0; k < 4; k++) {
        const uint32_t lo = p + 4 * k < end ? *(const uint16_t *)(p + 4 * k) : 0u;
        const uint32_t hi = p + 4 * k + 2 < end ? *(const uint16_t *)(p + 4 * k + 2) : 0u;
        v[k] = lo | hi << 16;
    }
    return make_uint4(v[0], v[1], v[2], v[3]);
}

template <int R>
__device__ __forceinline__ void kbuf6_load(kbuf6<R> &b, const uint8_t *const (&row)[R], int kb,
                                           int i, const uint8_t *wend)
{
    const int n = i >> 1, gh = i & 1;
    const int off[3] = {64 * n + 16 * gh, 64 * n + 32 + 16 * gh, 128 + 32 * n + 16 * gh};
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint8_t *blk = row[r] + (size_t)kb * 210;
        const uint8_t *base = blk - ((uintptr_t)blk & 15); /* >= the matrix start */
#pragma unroll
        for (int j = 0; j < 3; j++) { /* both pieces end at or before blk + 208 */
            b.run[r][j][0] = ld_stream(base + off[j]);
            b.run[r][j][1] = ld_stream(base + off[j] + 16);
        }
        b.sd[r][0] = ld_stream(base + 192);
        /* base + 208 <= blk + 208 holds d; the piece may run 14 bytes past the block, past
         * the matrix only for its last block */
        b.sd[r][1] = base + 224 <= wend ? ld_stream(base + 208) : ld_tail(base + 208, wend);
    }
}

/* Words 0..N-1 of the bytes a (even, 0..14) past the start of the 32 bytes {p0, p1}. */
template <int N>
__device__ __forceinline__ void shift_words(uint32_t (&out)[N], uint4 p0, uint4 p1, int a)
{
    const uint32_t c[9] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w, 0u};
    uint32_t t[8], u[7];
#pragma unroll
    for (int j = 0; j < 7; j++) /* by 8 bytes */
        t[j] = (a & 8) ? c[j + 2] : c[j];
    t[7] = (a & 8) ? 0u : c[7];
#pragma unroll
    for (int j = 0; j < 7; j++) /* by 4 */
        u[j] = (a & 4) ? t[j + 1] : t[j];
#pragma unroll
    for (int k = 0; k < N; k++) /* by 2 (or 0) */
        out[k] = __funnelshift_r(u[k], u[k + 1], 8 * (a & 2));
}

/* Adds k-block kb of R rows to acc: per row H, L over the lane's 4 groups of 16 with their
 * scales, C = sum sc_k * sum16_k; I = fma(-32, float(C), fma(256, float(H), float(L)));
 * acc = fma(dx * d, I, acc) (kblock_q6k's sequence). */
template <int R>
__device__ __forceinline__ void kbuf6_use(float (&acc)[R], const kbuf6<R> &b,
                                          const uint8_t *const (&row)[R], const int8_t *xq,
                                          const float *xd, int n_pad, int kb, int i,
                                          unsigned gm)
{
    const int n = i >> 1, gh = i & 1;
    const int8_t *xb = xq + (size_t)kb * 2 * MM_XBLOCK + 16 * i;
    uint32_t ql0[R][4], ql1[R][4], qh[R][4], scw[R][4];
    float dw[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int a = (int)(((uintptr_t)row[r] + (size_t)kb * 210) & 15);
        shift_words(ql0[r], b.run[r][0][0], b.run[r][0][1], a);
        shift_words(ql1[r], b.run[r][1][0], b.run[r][1][1], a);
        shift_words(qh[r], b.run[r][2][0], b.run[r][2][1], a);
        uint32_t sd[5];
        shift_words(sd, b.sd[r][0], b.sd[r][1], a);
#pragma unroll
        for (int k = 0; k < 4; k++)
            scw[r][k] = sd[k];
        dw[r] = f16f(sd[4]);
    }
    int H[R], L[R], C[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        H[r] = L[r] = C[r] = 0;
#pragma unroll
    for (int qq = 0; qq < 4; qq++) {
        /* inputs 128n + 32qq + 16gh + 8e .. +7 (e = 0, 1): {hi[0..3], lo[0..3], hi[4..7],
         * lo[4..7]} (4-input interleave) */
        const uint4 x0 = __ldg((const uint4 *)(xb + 64 * (2 * qq))),
                    x1 = __ldg((const uint4 *)(xb + 64 * (2 * qq + 1)));
        const uint32_t xh[4] = {x0.x, x0.z, x1.x, x1.z}, xl[4] = {x0.y, x0.w, x1.y, x1.w};
        int sh = 0, sl = 0;
#pragma unroll
        for (int m = 0; m < 4; m++) {
            sh = sum4(xh[m], sh);
            sl = sum4(xl[m], sl);
        }
        const int s16 = 256 * sh + sl; /* sum of q over the group of 16 */
#pragma unroll
        for (int r = 0; r < R; r++) {
            /* scale index k = 8n + 2qq + gh: word 2n + qq / 2, byte 2 (qq % 2) + gh */
            const int sc = sbyte_at(qq < 2 ? scw[r][2 * n] : scw[r][2 * n + 1],
                                    2 * (qq & 1) + gh);
            int dh = 0, dl = 0;
#pragma unroll
            for (int m = 0; m < 4; m++) { /* weights 4m..4m+3 of the lane's 16 */
                const uint32_t lw = (qq & 1) ? ql1[r][m] : ql0[r][m];
                const uint32_t nib = qq < 2 ? lw & 0x0F0F0F0Fu : (lw >> 4) & 0x0F0F0F0Fu;
                const uint32_t hb = ((qh[r][m] >> (2 * qq)) & 0x03030303u) << 4;
                const uint32_t q = nib | hb; /* 0..63 */
                dh = __dp4a((int)q, (int)xh[m], dh);
                dl = __dp4a((int)q, (int)xl[m], dl);
            }
            H[r] += sc * dh;
            L[r] += sc * dl;
            C[r] += sc * s16;
        }
    }
    const float dx = __ldg(xd + (size_t)kb * n_pad); /* token 0 */
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int h = group_sum(H[r], gm), l = group_sum(L[r], gm), c = group_sum(C[r], gm);
        const float I = __fmaf_rn(-32.0f, __int2float_rn(c),
                                  __fmaf_rn(256.0f, __int2float_rn(h), __int2float_rn(l)));
        acc[r] = __fmaf_rn(__fmul_rn(dx, dw[r]), I, acc[r]);
    }
}

/* --- Q8_0: 34-byte blocks at any even offset -------------------------------------------- */

/* A k-block is 4 blocks (128 inputs; the last one of a row may hold fewer): lane i of a group
 * takes block i whole, so its dot products need no butterfly; the group then walks the 4
 * blocks' terms in order (kblock_q80's sequence) with them gathered by shuffles. The block is
 * the three aligned pieces under it (up to 14 bytes past it: the matrix's last block reads
 * its last piece up to the end), d and q[32] shifted out of them. */
template <int R> struct kbuf8 {
    uint4 p[R][3];
};

template <int R>
__device__ __forceinline__ void kbuf8_load(kbuf8<R> &b, const uint8_t *const (&row)[R], int kb,
                                           int i, int nblk, const uint8_t *wend)
{
    const int blk_i = 4 * kb + i;
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (blk_i >= nblk) { /* past the row's last block: nothing to read */
            b.p[r][0] = b.p[r][1] = b.p[r][2] = make_uint4(0, 0, 0, 0);
            continue;
        }
        const uint8_t *blk = row[r] + (size_t)blk_i * 34;
        const uint8_t *base = blk - ((uintptr_t)blk & 15);
        b.p[r][0] = ld_stream(base);
        b.p[r][1] = ld_stream(base + 16);
        b.p[r][2] = base + 48 <= wend ? ld_stream(base + 32) : ld_tail(base + 32, wend);
    }
}

/* Words 0..7 of the bytes s (2..16, even) past the start of the 48 bytes p. */
__device__ __forceinline__ void shift_q8(uint32_t (&out)[8], const uint4 (&p)[3], int s)
{
    const uint32_t c[12] = {p[0].x, p[0].y, p[0].z, p[0].w, p[1].x, p[1].y,
                            p[1].z, p[1].w, p[2].x, p[2].y, p[2].z, p[2].w};
    uint32_t t[12], u[10], v[9];
#pragma unroll
    for (int j = 0; j < 12; j++) /* by 16 bytes */
        t[j] = (s & 16) ? (j + 4 < 12 ? c[j + 4] : 0u) : c[j];
#pragma unroll
    for (int j = 0; j < 10; j++) /* by 8 */
        u[j] = (s & 8) ? t[j + 2] : t[j];
#pragma unroll
    for (int j = 0; j < 9; j++) /* by 4 */
        v[j] = (s & 4) ? u[j + 1] : u[j];
#pragma unroll
    for (int k = 0; k < 8; k++) /* by 2 (or 0) */
        out[k] = __funnelshift_r(v[k], v[k + 1], 8 * (s & 2));
}

template <int R>
__device__ __forceinline__ void kbuf8_use(float (&acc)[R], const kbuf8<R> &b,
                                          const uint8_t *const (&row)[R], const int8_t *xq,
                                          const float *xd, int n_pad, int kb, int i, int nblk,
                                          unsigned gm)
{
    const int blk_i = 4 * kb + i;
    const int n_in = nblk - 4 * kb < 4 ? nblk - 4 * kb : 4; /* blocks in this k-block */
    /* inputs 32 blk_i .. +31, plain layout: 4 x {hi[0..3], hi[4..7], lo[0..3], lo[4..7]} */
    const int8_t *xb = xq + (size_t)blk_i * 64;
    uint4 x[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        x[k] = blk_i < nblk ? __ldg((const uint4 *)(xb + 16 * k)) : make_uint4(0, 0, 0, 0);
    const float dx = __ldg(xd + (size_t)(kb >> 1) * n_pad); /* 2 k-blocks per x block */
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int a = (int)(((uintptr_t)row[r] + (size_t)blk_i * 34) & 15);
        uint32_t q[8];
        shift_q8(q, b.p[r], a + 2);
        /* d: the 16 bits at byte a, i.e. word a / 4 of the first piece, half (a / 2) % 2 */
        const uint32_t dword = a < 8 ? (a < 4 ? b.p[r][0].x : b.p[r][0].y)
                                     : (a < 12 ? b.p[r][0].z : b.p[r][0].w);
        const float dw = f16f(dword >> (8 * (a & 2)));
        int dh = 0, dl = 0;
#pragma unroll
        for (int m = 0; m < 8; m++) {
            const uint4 u = x[m >> 1];
            dh = __dp4a((int)q[m], (int)((m & 1) ? u.y : u.x), dh);
            dl = __dp4a((int)q[m], (int)((m & 1) ? u.w : u.z), dl);
        }
        const int v = 256 * dh + dl;
        float s = acc[r];
#pragma unroll
        for (int j = 0; j < 4; j++) { /* block j of the k-block, in order */
            const float dj = __shfl_sync(gm, dw, j, 4);
            const int vj = __shfl_sync(gm, v, j, 4);
            if (j < n_in)
                s = __fmaf_rn(__fmul_rn(dx, dj), __int2float_rn(vj), s);
        }
        acc[r] = s;
    }
}

/* The registers of one k-block for type T. */
template <int T, int R> struct kbuf_of {
    using type = kbuf<T == TD_Q5_K, R>;
};
template <int R> struct kbuf_of<TD_Q6_K, R> {
    using type = kbuf6<R>;
};
template <int R> struct kbuf_of<TD_Q8_0, R> {
    using type = kbuf8<R>;
};

/* Rows r0 .. r0 + 2R - 1 (nr of them real) into y, as described at the top. */
template <int T, int R>
__device__ __forceinline__ void mmd_rows(float *y, const uint8_t *w, const uint8_t *wend,
                                         uint32_t row_bytes, int64_t r0, int nr, int nblk,
                                         const int8_t *xq, const float *xd, const int8_t *xs,
                                         int n_pad, int lane)
{
    constexpr bool Q5 = T == TD_Q5_K;
    constexpr int D = depth<T, R>();
    const int g = lane >> 2, i = lane & 3;
    const int q = g & 3, h = g >> 2; /* chain, row half */
    const unsigned gm = 0xFu << (4 * g);
    const uint8_t *row[R];
#pragma unroll
    for (int r = 0; r < R; r++) { /* missing rows read the last real one, and are not stored */
        const int k = h * R + r;
        row[r] = w + (size_t)(r0 + (k < nr ? k : nr - 1)) * row_bytes;
    }
    const int nkb = T == TD_Q8_0 ? (nblk + 3) / 4 : nblk; /* k-blocks per row */
    const int nk = nkb > q ? (nkb - q + 3) / 4 : 0;        /* this chain's */

    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    typename kbuf_of<T, R>::type buf[D];
    auto load = [&](int u, int kb) {
        if constexpr (T == TD_Q6_K)
            kbuf6_load(buf[u], row, kb, i, wend);
        else if constexpr (T == TD_Q8_0)
            kbuf8_load(buf[u], row, kb, i, nblk, wend);
        else
            kbuf_load<Q5, R>(buf[u], row, kb, i);
    };
#pragma unroll
    for (int s = 0; s < D; s++)
        if (s < nk)
            load(s, q + 4 * s);
    mm_wait_dependencies(); /* xq and xd come from the kernel before this one */
    for (int s0 = 0; s0 < nk; s0 += D) {
#pragma unroll
        for (int u = 0; u < D; u++) {
            const int s = s0 + u;
            if (s < nk) {
                if constexpr (T == TD_Q6_K)
                    kbuf6_use(acc, buf[u], row, xq, xd, n_pad, q + 4 * s, i, gm);
                else if constexpr (T == TD_Q8_0)
                    kbuf8_use(acc, buf[u], row, xq, xd, n_pad, q + 4 * s, i, nblk, gm);
                else
                    kbuf_use(acc, buf[u], xq, xd, xs, n_pad, q + 4 * s, i, gm);
                if (s + D < nk)
                    load(u, q + 4 * (s + D));
            }
        }
    }
    /* y = ((p0 + p1) + p2) + p3, p_q = chain q's sum, in lane 16h (chain q at lane 16h + 4q;
     * a chain without k-blocks adds +0, as a warp without k-blocks does in the tensor-core
     * kernel) */
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float p1 = __shfl_down_sync(0xffffffffu, acc[r], 4);
        const float p2 = __shfl_down_sync(0xffffffffu, acc[r], 8);
        const float p3 = __shfl_down_sync(0xffffffffu, acc[r], 12);
        const int k = h * R + r;
        if ((lane & 15) == 0 && k < nr)
            y[r0 + k] = __fadd_rn(__fadd_rn(__fadd_rn(acc[r], p1), p2), p3);
    }
}

/* grid: resident CTAs only (launch picks how many); block: WARPS warps. Warp u of the grid
 * takes the 2R-row units u, u + n_warps, ...: a unit never waits for a CTA slot, and launch
 * sizes the grid so that the units split evenly over the warps. */
template <int T, int R>
__global__ void __launch_bounds__(WARPS * 32)
    mmd_kernel(float *y, const uint8_t *w, uint32_t row_bytes, int64_t rows, int nblk,
               const int8_t *xq, const float *xd, const int8_t *xs, int n_pad)
{
    mm_launch_dependents(); /* the next rounding kernel waits for this grid (matmul.cu) */
    const int lane = threadIdx.x & 31;
    const int64_t n_warps = (int64_t)gridDim.x * WARPS;
    const uint8_t *wend = w + (size_t)rows * row_bytes; /* one past the matrix */
    for (int64_t u = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5); u * 2 * R < rows;
         u += n_warps) {
        const int64_t r0 = u * 2 * R;
        const int nr = rows - r0 < 2 * R ? (int)(rows - r0) : 2 * R;
        mmd_rows<T, R>(y, w, wend, row_bytes, r0, nr, nblk, xq, xd, xs, n_pad, lane);
    }
}

/* CTAs for the grid: per SM at most what fits (occ), and among 3/4 occ..occ (fewer would
 * leave too few bytes in flight) the count whose last round of rows is fullest (a 5120-row
 * matrix at 6 resident CTAs of 4 warps on 132 SMs would run 2 rounds with the second 62%
 * full; at 5 it runs 2 nearly full ones), the larger count on ties. */
int64_t grid_for(int64_t units, int n_sm, int occ)
{
    int64_t best = 0;
    double best_eff = -1.0;
    for (int c = (3 * occ + 3) / 4; c <= occ; c++) {
        const int64_t slots = (int64_t)n_sm * c * WARPS;
        const int64_t rounds = (units + slots - 1) / slots;
        const double eff = (double)units / (double)(rounds * slots);
        if (eff >= best_eff - 1e-9) {
            best_eff = eff;
            best = (int64_t)n_sm * c;
        }
    }
    const int64_t need = (units + WARPS - 1) / WARPS; /* never more CTAs than rows need */
    return best < need ? best : need;
}

template <int T, int R>
td_err launch(float *y, const mm_xquant *xq, const ops_weight *w, const mm_device *dev,
              cudaStream_t st)
{
    /* blocks per row: super-blocks, or Q8_0's blocks of 32 */
    const int64_t nblk = w->cols / (T == TD_Q8_0 ? 32 : MM_XBLOCK);
    if (w->row_bytes > ((size_t)1 << 26) || nblk > 0x7fffffff)
        return err_set(TD_ENOTSUP, "cuda_matmul: a %lld x %lld matrix is too large",
                       (long long)w->rows, (long long)w->cols);
    static int occ_of[64]; /* resident CTAs per SM, per device ordinal (0: not asked yet) */
    int ordinal = 0;
    CUDA_TRY(cudaGetDevice(&ordinal));
    int occ = __atomic_load_n(&occ_of[ordinal & 63], __ATOMIC_RELAXED);
    if (occ == 0) {
        CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, mmd_kernel<T, R>,
                                                               WARPS * 32, 0));
        occ = occ < 1 ? 1 : occ;
        __atomic_store_n(&occ_of[ordinal & 63], occ, __ATOMIC_RELAXED);
    }
    const int64_t grid = grid_for((w->rows + 2 * R - 1) / (2 * R), dev->n_sm, occ);
    const cudaError_t e = launch_ex(mmd_kernel<T, R>, grid, WARPS * 32, 0, dev->pdl, st, y,
                                    (const uint8_t *)w->data, (uint32_t)w->row_bytes, w->rows,
                                    (int)nblk, xq->xq, xq->xd, xq->xsum, xq->n_pad);
    if (e != cudaSuccess)
        return err_set(TD_ECUDA, "cuda_matmul: %s decode kernel launch (%lld rows): %s",
                       dtype_name(w->type), (long long)w->rows, cudaGetErrorString(e));
    return TD_OK;
}

/* Four rows per warp (each activation load serves two) for Q4_K where that still leaves
 * ~24 warps per SM; two otherwise (5120-row matrices: 19 units per SM), and for Q5_K and
 * Q6_K (their loads make the wider variant heavy in registers). */
template <int T>
td_err launch_rows(float *y, const mm_xquant *xq, const ops_weight *w, const mm_device *dev,
                   cudaStream_t st)
{
    if constexpr (T == TD_Q4_K)
        if (w->rows >= (int64_t)4 * 24 * dev->n_sm)
            return launch<T, 2>(y, xq, w, dev, st);
    return launch<T, 1>(y, xq, w, dev, st);
}

} /* namespace */

bool mmd_supported(td_dtype type)
{
    return type == TD_Q4_K || type == TD_Q5_K || type == TD_Q6_K || type == TD_Q8_0;
}

bool mmd_placed(td_dtype type)
{
    return type != TD_Q8_0; /* Q8_0 lanes read 64 contiguous bytes of the plain layout */
}

bool mmd_preferred(const ops_weight *w, const mm_device *dev)
{
    /* H200, fraction of the copy rate at one token, this kernel / tensor cores: Q4_K 5120 ->
     * 17408 (4 rows per warp) 49.9% / 36.0%; at 2 rows per warp (5120..12288 rows) 20-31% /
     * 27-41%; Q5_K, Q6_K, Q8_0 mostly behind (Q6_K LM head 53.9% / 67.2%) */
    return w->type == TD_Q4_K && w->rows >= (int64_t)4 * 24 * dev->n_sm;
}

td_err mmd_launch(float *y, const mm_xquant *xq, const ops_weight *w, const mm_device *dev,
                  cudaStream_t st)
{
    TD_ASSERT(xq->n_tok == 1 && mmd_supported(w->type));
    TD_ASSERT(((uintptr_t)w->data & 15) == 0);
    TD_ASSERT(w->type == TD_Q8_0 || w->cols % MM_XBLOCK == 0);
    if (w->type == TD_Q8_0)
        return launch_rows<TD_Q8_0>(y, xq, w, dev, st);
    if (w->type == TD_Q6_K)
        return launch_rows<TD_Q6_K>(y, xq, w, dev, st);
    if (w->type == TD_Q5_K)
        return launch_rows<TD_Q5_K>(y, xq, w, dev, st);
    return launch_rows<TD_Q4_K>(y, xq, w, dev, st);
}
