/* y = x . W^T for one token (decode) and Q4_K, Q5_K, Q6_K, Q8_0 weights: integer dot
 * products (dp4a) on the CUDA cores, weights streamed by cp.async through a per-warp ring in
 * shared memory (no barriers: a lane reads only what it copied).
 *
 * Why a kernel of its own: with one token the tensor-core kernel (matmul_quant.cu) wastes 7/8
 * of every MMA and is bound by latency and its grid (Nsight Compute on an H200, 5120 ->
 * 17408 Q4_K: 20 warps per SM allowed by its shared-memory ring, 0.64 eligible warps per
 * scheduler, 1.65 waves of CTAs, 27% of the elapsed cycles with idle SMs, DRAM at 38%). Here
 * a warp owns whole rows, the grid holds only resident CTAs whose warps loop over rows (sized
 * so that the last round is nearly full), and each warp keeps STAGES k-blocks in flight in
 * one stream over all of its rows.
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

/* Weights travel global -> shared memory by cp.async (16 bytes, L1 bypassed) into a per-warp
 * ring of STAGES k-blocks; the group counter (cp.async.wait_group, an in-order count) lets a
 * lane wait for exactly the oldest k-block while the younger ones stay in flight. Loads into
 * registers cannot do that: ptxas gave all of a lane's in-flight weight loads one scoreboard,
 * so waiting for the oldest waited for all of them and every k-block paid a full memory
 * latency. A lane copies exactly the bytes it later reads, so no barrier is needed. */
__device__ __forceinline__ void cp16(uint32_t dst, const uint8_t *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

/* The first n (< 16) bytes at src, zeros after them: the matrix's last piece. Plain byte
 * loads and shared stores, as a 16-byte cp.async with a short source size was seen to read
 * past the allocation on an H200 (matmul_quant.cu, stage_issue_exact). Rare: out of line. */
__device__ __noinline__ void cp_tail(uint32_t dst, const uint8_t *src, int n)
{
    for (int j = 0; j < 16; j++) {
        const uint32_t v = j < n ? src[j] : 0u;
        asm volatile("st.shared.u8 [%0], %1;" ::"r"(dst + j), "r"(v) : "memory");
    }
}

/* 16 bytes at src of which only those below end exist. */
__device__ __forceinline__ void cp16_upto(uint32_t dst, const uint8_t *src, const uint8_t *end)
{
    if (src + 16 <= end)
        cp16(dst, src);
    else
        cp_tail(dst, src, (int)(end - src));
}

__device__ __forceinline__ void cp_commit(void)
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

/* Until at most N of this lane's committed groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_wait(void)
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
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

/* Bytes of one k-block: a super-block, or Q8_0's 4 blocks. */
template <int T> __host__ __device__ constexpr int kb_bytes()
{
    return T == TD_Q6_K ? 210 : T == TD_Q5_K ? 176 : T == TD_Q8_0 ? 136 : 144;
}

/* A warp's item (unit, step s) is, per row, the 4 k-blocks 4s..4s+3 (one per chain):
 * 4 kb_bytes contiguous bytes, staged as the 16-byte pieces under them (Q6_K/Q8_0 rows
 * start at any even offset: up to 14 bytes more). Pieces per row window: */
template <int T> __host__ __device__ constexpr int win_pieces()
{
    return (4 * kb_bytes<T>() + 14 + 15) / 16; /* 36, 44, 54, 35 */
}

/* Bytes of one ring slot: the windows of the unit's 2R rows. */
template <int T, int R> __host__ __device__ constexpr int slot_bytes()
{
    return 2 * R * win_pieces<T>() * 16;
}

/* Items in the ring per warp: about 9 KB of it (Little's law at 4.3 TB/s asks ~50 KB in
 * flight per SM; 16-24 warps x 3-6 items x 1.1-2.3 KB is 2-4x that), 3..6. */
template <int T, int R> __host__ __device__ constexpr int stages()
{
    return 9216 / slot_bytes<T, R>() < 3 ? 3 : 9216 / slot_bytes<T, R>() > 6
                                                   ? 6
                                                   : 9216 / slot_bytes<T, R>();
}

/* Bytes of ring per warp. */
template <int T, int R> __host__ __device__ constexpr int ring_bytes()
{
    return stages<T, R>() * slot_bytes<T, R>();
}

/* One k-block of the group's R rows as this lane loads it. */
template <bool Q5, int R> struct kbuf {
    uint4 hd[R];    /* bytes 0..15: d, dmin, 12 scale bytes (the same 16 for the group) */
    uint4 qs[R][2]; /* qs bytes 32i .. 32i+31 */
    uint4 qh[R][2]; /* Q5_K: qh[0..31] (unused for Q4_K) */
};

/* Copies item (rows r0 .. r0 + nr - 1, step s) into the slot at shared address sa: row rr's
 * window at rr * win_pieces * 16, the 16-byte pieces from the boundary at or below the
 * row's k-block 4s up to the end of its last k-block (of at most 4; Q8_0: blocks 16s.. of
 * at most 16; n_units k-blocks or Q8_0 blocks per row). Piece p of the slot goes to lane
 * p % 32: every warp-wide copy reads consecutive 16-byte pieces, at most two runs. A piece
 * reaching past the matrix (its last row's window, rows at odd offsets) is copied up to the
 * end. Rows past nr are not copied (their readers read row nr - 1). */
template <int T, int R>
__device__ __forceinline__ void win_issue(uint32_t sa, const uint8_t *prow0, const uint8_t *wend,
                                          uint32_t row_bytes, int nr, int s, int n_units,
                                          int lane)
{
    constexpr int WP = win_pieces<T>(), N = 2 * R * WP;
    constexpr int PER = T == TD_Q8_0 ? 16 : 4, UB = T == TD_Q8_0 ? 34 : kb_bytes<T>();
    constexpr bool ODD = T == TD_Q6_K || T == TD_Q8_0; /* rows at any even offset */
    const int left = n_units - PER * s;
    const int len = (left < PER ? left : PER) * UB; /* bytes of the window's k-blocks */
    const uint32_t s_off = (uint32_t)s * (4 * kb_bytes<T>());
    const uint32_t lo = (uint32_t)(uintptr_t)prow0;
#pragma unroll
    for (int k = 0; k < (N + 31) / 32; k++) {
        const int p = lane + 32 * k;
        const int rr = p / WP, j = p - rr * WP;
        /* offsets within the unit stay below 2^28 (row_bytes < 2^26): 32-bit arithmetic */
        const uint32_t off = (uint32_t)rr * row_bytes + s_off; /* the window's first byte */
        const int a0 = ODD ? (int)((lo + off) & 15u) : 0;
        if (p < N && rr < nr && 16 * j < a0 + len) {
            const uint8_t *src = prow0 + (off - (uint32_t)a0 + 16u * (uint32_t)j);
            if (ODD)
                cp16_upto(sa + 16 * p, src, wend);
            else
                cp16(sa + 16 * p, src); /* 16-byte aligned rows end on piece boundaries */
        }
    }
}

/* Where block bytes start in the window of a row: o = a0 + offset of the block in the
 * item's k-blocks (a0 = the row's k-block 4s start & 15). The pieces a lane reads are the
 * aligned ones under o + off, at (o & ~15) + off in the window (off 16-aligned). */
template <bool Q5, int R>
__device__ __forceinline__ void kbuf_read(kbuf<Q5, R> &b, const uint8_t *const (&win)[R], int q,
                                          int i)
{
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint8_t *blk = win[r] + q * kq<Q5>::BYTES; /* rows are 16-byte aligned */
        b.hd[r] = *(const uint4 *)blk;
        b.qs[r][0] = *(const uint4 *)(blk + kq<Q5>::QS + 32 * i);
        b.qs[r][1] = *(const uint4 *)(blk + kq<Q5>::QS + 32 * i + 16);
        if constexpr (Q5) {
            b.qh[r][0] = *(const uint4 *)(blk + 16);
            b.qh[r][1] = *(const uint4 *)(blk + 32);
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

/* The activations a lane needs for one k-block, loaded (from L1) before the wait for its
 * weights so that their latency overlaps it. */
struct xbuf {
    uint4 v[8];  /* 8 x 16 bytes of hi/lo digits (which ones: the type's loader) */
    uint4 s;     /* Q4_K/Q5_K: the sums of 32 inputs of its sub-blocks, as digits */
    float d;     /* the x block's scale (token 0) */
};

/* Q4_K/Q5_K: v[4 half + k] = inputs 8k.. of sub-block 2i + half (placed layout, see
 * mm_decode_unit_pos); s = sum32 digits of sub-blocks 2i, 2i+1 (mm_xquant: s0, s1, s2 of j
 * at 16 (j / 4) + 4 digit + j % 4): cheaper than summing the lane's 64 digits. */
__device__ __forceinline__ void xbuf_load_kq(xbuf &x, const int8_t *xq, const float *xd,
                                             const int8_t *xs, int n_pad, int kb, int i)
{
    const int8_t *xb = xq + (size_t)kb * 2 * MM_XBLOCK + 16 * i;
#pragma unroll
    for (int m = 0; m < 8; m++)
        x.v[m] = __ldg((const uint4 *)(xb + 64 * m));
    x.s = __ldg((const uint4 *)(xs + (size_t)kb * n_pad * MM_XSUM_BYTES + 16 * (i >> 1)));
    x.d = __ldg(xd + (size_t)kb * n_pad);
}

/* Q6_K: v[2 qq + e] = inputs 128n + 32qq + 16gh + 8e.. of the lane (i = 2n + gh), each
 * {hi[0..3], lo[0..3], hi[4..7], lo[4..7]} (4-input interleave, placed layout). */
__device__ __forceinline__ void xbuf_load_q6(xbuf &x, const int8_t *xq, const float *xd,
                                             int n_pad, int kb, int i)
{
    const int8_t *xb = xq + (size_t)kb * 2 * MM_XBLOCK + 16 * i;
#pragma unroll
    for (int m = 0; m < 8; m++)
        x.v[m] = __ldg((const uint4 *)(xb + 64 * m));
    x.d = __ldg(xd + (size_t)kb * n_pad);
}

/* Q8_0: v[0..3] = inputs 32 blk_i .. +31 of the lane's block blk_i = 4 kb + i, plain
 * layout: 4 x {hi[0..3], hi[4..7], lo[0..3], lo[4..7]}; zeros past the row's last block.
 * d: 2 k-blocks per x block. */
__device__ __forceinline__ void xbuf_load_q8(xbuf &x, const int8_t *xq, const float *xd,
                                             int n_pad, int kb, int i, int nblk)
{
    const int blk_i = 4 * kb + i;
    const int8_t *xb = xq + (size_t)blk_i * 64;
#pragma unroll
    for (int k = 0; k < 4; k++)
        x.v[k] = blk_i < nblk ? __ldg((const uint4 *)(xb + 16 * k)) : make_uint4(0, 0, 0, 0);
    x.d = __ldg(xd + (size_t)(kb >> 1) * n_pad);
}

/* Adds k-block kb of R rows to acc (every lane of the group updates the same values). */
template <bool Q5, int R>
__device__ __forceinline__ void kbuf_use(float (&acc)[R], const kbuf<Q5, R> &b, const xbuf &xv,
                                         int i, unsigned gm)
{
    const uint4 sv = xv.s;
    int dh[2][R], dl[2][R], sum[2];
#pragma unroll
    for (int half = 0; half < 2; half++) { /* sub-block 2i + half: nibble `half` of qs */
        const int jb = 2 * (i & 1) + half; /* j % 4 */
        sum[half] = 65536 * sbyte_at(sv.z, jb) + 256 * sbyte_at(sv.y, jb) + sbyte_at(sv.x, jb);
        /* units k = 0..3 (inputs 8k..8k+7 of the sub-block), each {hi[0..3], hi[4..7],
         * lo[0..3], lo[4..7]} */
        const uint4 *x = xv.v + 4 * half;
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
    const float dx = xv.d;
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

/* win[r]: row r's window; o[r]: where the lane's block starts in it (a0 + 210 q). */
template <int R>
__device__ __forceinline__ void kbuf6_read(kbuf6<R> &b, const uint8_t *const (&win)[R],
                                           const int (&o)[R], int i)
{
    const int n = i >> 1, gh = i & 1;
    const int off[3] = {64 * n + 16 * gh, 64 * n + 32 + 16 * gh, 128 + 32 * n + 16 * gh};
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint8_t *pa = win[r] + (o[r] & ~15); /* the piece under the block's start */
#pragma unroll
        for (int j = 0; j < 3; j++) {
            b.run[r][j][0] = *(const uint4 *)(pa + off[j]);
            b.run[r][j][1] = *(const uint4 *)(pa + off[j] + 16);
        }
        b.sd[r][0] = *(const uint4 *)(pa + 192);
        b.sd[r][1] = *(const uint4 *)(pa + 208);
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
                                          const uint8_t *const (&row)[R], const xbuf &xv,
                                          int kb, int i, unsigned gm)
{
    const int n = i >> 1, gh = i & 1;
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
        const uint4 x0 = xv.v[2 * qq], x1 = xv.v[2 * qq + 1];
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
            const uint32_t sw = qq < 2 ? (n ? scw[r][2] : scw[r][0]) /* no local array */
                                       : (n ? scw[r][3] : scw[r][1]);
            const int sc = sbyte_at(sw, 2 * (qq & 1) + gh);
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
    const float dx = xv.d;
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

/* win[r]: row r's window; o[r]: where the lane's block 4q + i starts in it (a0 + 34 (4q +
 * i)); nothing is read for a block past the row's end (zeros). */
template <int R>
__device__ __forceinline__ void kbuf8_read(kbuf8<R> &b, const uint8_t *const (&win)[R],
                                           const int (&o)[R], bool exists)
{
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint8_t *pa = win[r] + (o[r] & ~15);
        b.p[r][0] = exists ? *(const uint4 *)pa : make_uint4(0, 0, 0, 0);
        b.p[r][1] = exists ? *(const uint4 *)(pa + 16) : make_uint4(0, 0, 0, 0);
        b.p[r][2] = exists ? *(const uint4 *)(pa + 32) : make_uint4(0, 0, 0, 0);
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
                                          const uint8_t *const (&row)[R], const xbuf &xv,
                                          int kb, int i, int nblk, unsigned gm)
{
    const int blk_i = 4 * kb + i;
    const int n_in = nblk - 4 * kb < 4 ? nblk - 4 * kb : 4; /* blocks in this k-block */
    const uint4 *x = xv.v;
    const float dx = xv.d;
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

/* The R rows of row half h of the unit starting at r0 (nr of its 2R rows real): missing rows
 * read the last real one, and are not stored. */
template <int R>
__device__ __forceinline__ void unit_rows(const uint8_t *(&row)[R], const uint8_t *w,
                                          uint32_t row_bytes, int64_t r0, int nr, int h)
{
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int k = h * R + r;
        row[r] = w + (size_t)(r0 + (k < nr ? k : nr - 1)) * row_bytes;
    }
}

/* grid: resident CTAs only (launch picks how many); block: WARPS warps, each with its own
 * ring of ring_bytes<T, R>() of dynamic shared memory. Warp u of the grid takes the 2R-row
 * units u, u + n_warps, ..., described at the top. Its items (unit, step s: k-block q + 4s
 * for chain q) form one stream over all of its units, and the ring runs STAGES items ahead
 * of the arithmetic across unit boundaries, so the pipeline fills once per warp, not once
 * per unit. The warp copies each item as contiguous runs (win_issue) and every lane reads
 * its pieces from them, so a copy is waited for by all lanes (cp.async.wait_group, then
 * __syncwarp) and a slot is refilled only after all lanes have read it. Every lane walks
 * the same items (loop control is uniform over the warp); a chain whose k-block q + 4s does
 * not exist skips it. A lane's activations for an item are loaded before the wait for its
 * weights. */
template <int T, int R>
__global__ void __launch_bounds__(WARPS * 32)
    mmd_kernel(float *y, const uint8_t *w, uint32_t row_bytes, int64_t rows, int nblk,
               const int8_t *xq, const float *xd, const int8_t *xs, int n_pad)
{
    constexpr bool Q5 = T == TD_Q5_K;
    constexpr int D = stages<T, R>();
    constexpr int SLOT = slot_bytes<T, R>();
    constexpr int WIN = win_pieces<T>() * 16; /* bytes per row window */
    constexpr int KBB = kb_bytes<T>();
    extern __shared__ uint4 mmd_ring[];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const uint8_t *ring = (const uint8_t *)mmd_ring + (size_t)wid * D * SLOT;
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
    const int g = lane >> 2, i = lane & 3;
    const int q = g & 3, h = g >> 2; /* chain, row half */
    const unsigned gm = 0xFu << (4 * g);
    const uint8_t *wend = w + (size_t)rows * row_bytes; /* one past the matrix */
    const int64_t units = (rows + 2 * R - 1) / (2 * R);
    const int64_t n_warps = (int64_t)gridDim.x * WARPS;
    const int64_t u0 = (int64_t)blockIdx.x * WARPS + wid;
    const int nkb = T == TD_Q8_0 ? (nblk + 3) / 4 : nblk; /* k-blocks per row */
    const int S = (nkb + 3) / 4;                           /* steps per unit */
    const int n_units = T == TD_Q8_0 ? nblk : nkb;         /* what win_issue counts */
    const int64_t total = u0 < units ? ((units - 1 - u0) / n_warps + 1) * S : 0;

    /* producer: the next item to copy, (unit pu: first row at prow0, pnr rows real; step
     * ps) */
    int64_t pu = u0;
    int ps = 0, pnr = 0;
    const uint8_t *prow0 = w;
    auto p_unit = [&]() {
        if (pu < units) {
            const int64_t pr0 = pu * 2 * R;
            pnr = rows - pr0 < 2 * R ? (int)(rows - pr0) : 2 * R;
            prow0 = w + (size_t)pr0 * row_bytes;
        }
    };
    p_unit();
    auto issue = [&](int slot) { /* copies item (pu, ps) into slot, one commit group */
        if (pu < units)
            win_issue<T, R>(ring_s + (uint32_t)(slot * SLOT), prow0, wend, row_bytes, pnr, ps,
                            n_units, lane);
        cp_commit(); /* empty groups too: group t is always item t */
        if (++ps == S) {
            ps = 0;
            pu += n_warps;
            p_unit();
        }
    };
    /* the next matmul's rounding kernel may launch now: it waits for this grid to finish
     * before it touches anything (see matmul.cu) */
    mm_launch_dependents();
#pragma unroll
    for (int u = 0; u < D; u++)
        issue(u);
    mm_wait_dependencies(); /* xq and xd come from the kernel before this one */

    /* consumer: unit cu (rows r0.., nr real), step cs */
    int64_t cu = u0;
    int cs = 0;
    int64_t r0 = cu * 2 * R;
    int nr = rows - r0 < 2 * R ? (int)(rows - r0) : 2 * R;
    const uint8_t *row[R];
    unit_rows<R>(row, w, row_bytes, r0, nr, h);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    for (int64_t t0 = 0; t0 < total; t0 += D) {
#pragma unroll
        for (int u = 0; u < D; u++) {
            if (t0 + u >= total)
                break;
            const int kb = q + 4 * cs; /* this chain's k-block of the item */
            xbuf xv;
            if (kb < nkb) {
                if constexpr (T == TD_Q6_K)
                    xbuf_load_q6(xv, xq, xd, n_pad, kb, i);
                else if constexpr (T == TD_Q8_0)
                    xbuf_load_q8(xv, xq, xd, n_pad, kb, i, nblk);
                else
                    xbuf_load_kq(xv, xq, xd, xs, n_pad, kb, i);
            }
            cp_wait<D - 1>(); /* item t0 + u (group t0 + u) has landed, this lane's copies */
            __syncwarp();     /* ... and every lane's */
            if (kb < nkb) {
                /* row r of this half: the window of unit row h R + r (the last real one
                 * for missing rows), its block start o */
                const uint8_t *win[R];
                int o[R];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const int k = h * R + r;
                    win[r] = ring + u * SLOT + (k < nr ? k : nr - 1) * WIN;
                    const int a0 = (int)(((uintptr_t)row[r] + (size_t)cs * 4 * KBB) & 15);
                    o[r] = a0 + (T == TD_Q8_0 ? 34 * (4 * q + i) : KBB * q);
                }
                typename kbuf_of<T, R>::type b;
                if constexpr (T == TD_Q6_K) {
                    kbuf6_read<R>(b, win, o, i);
                    kbuf6_use(acc, b, row, xv, kb, i, gm);
                } else if constexpr (T == TD_Q8_0) {
                    kbuf8_read<R>(b, win, o, 4 * kb + i < nblk);
                    kbuf8_use(acc, b, row, xv, kb, i, nblk, gm);
                } else {
                    kbuf_read<Q5, R>(b, win, q, i);
                    kbuf_use(acc, b, xv, i, gm);
                }
            }
            __syncwarp(); /* every lane has read the slot */
            issue(u);     /* item t0 + u + D into it */
            if (++cs == S) {
                /* y = ((p0 + p1) + p2) + p3, p_q = chain q's sum, in lane 16h (chain q at
                 * lane 16h + 4q; a chain without k-blocks adds +0, as a warp without
                 * k-blocks does in the tensor-core kernel) */
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const float p1 = __shfl_down_sync(0xffffffffu, acc[r], 4);
                    const float p2 = __shfl_down_sync(0xffffffffu, acc[r], 8);
                    const float p3 = __shfl_down_sync(0xffffffffu, acc[r], 12);
                    const int k = h * R + r;
                    if ((lane & 15) == 0 && k < nr)
                        y[r0 + k] = __fadd_rn(__fadd_rn(__fadd_rn(acc[r], p1), p2), p3);
                    acc[r] = 0.0f;
                }
                cs = 0;
                cu += n_warps;
                r0 = cu * 2 * R;
                nr = rows - r0 < 2 * R ? (int)(rows - r0) : 2 * R;
                if (cu < units)
                    unit_rows<R>(row, w, row_bytes, r0, nr, h);
            }
        }
    }
    cp_wait<0>(); /* nothing of this warp's may still be landing when it exits */
}

/* A grid: its CTAs, and the share of its warp slots that the last round of units fills. */
struct grid_plan {
    int64_t ctas;
    double eff;
};

/* CTAs for the grid: per SM at most what fits (occ), and among occ/2..occ (fewer would leave
 * too few bytes in flight) the count whose last round of units is fullest (a 5120-row
 * matrix in 2-row units at 6 resident CTAs of 4 warps on 132 SMs would run one round of
 * 2560 units on 3168 warps, 81% busy; at 5 CTAs 97%); within 2% of the fullest, the most
 * CTAs. Never more CTAs than the units need; a matrix that cannot fill occ/2 CTAs per SM
 * is rated against that many. */
grid_plan grid_for(int64_t units, int n_sm, int occ)
{
    double eff[65] = {0};
    double top = 0.0;
    for (int c = (occ + 1) / 2; c <= occ && c <= 64; c++) {
        const int64_t slots = (int64_t)n_sm * c * WARPS;
        const int64_t rounds = (units + slots - 1) / slots;
        eff[c] = (double)units / (double)(rounds * slots);
        top = eff[c] > top ? eff[c] : top;
    }
    int best = (occ + 1) / 2;
    for (int c = best; c <= occ && c <= 64; c++)
        if (eff[c] >= top - 0.02)
            best = c;
    const int64_t need = (units + WARPS - 1) / WARPS; /* never more CTAs than units need */
    const int64_t ctas = (int64_t)n_sm * best;
    if (ctas <= need)
        return {ctas, eff[best]};
    /* one short round: busy against the fewest warps that would keep enough in flight */
    return {need, (double)units / (double)((int64_t)n_sm * ((occ + 1) / 2) * WARPS)};
}

int g_pdl_refused; /* set when a launch with programmatic dependent launch was refused */

/* Resident CTAs per SM of mmd_kernel<T, R> on the current device (asked once per device). */
template <int T, int R> td_err occupancy(int *out)
{
    static int occ_of[64]; /* per device ordinal (0: not asked yet) */
    constexpr size_t smem = (size_t)WARPS * ring_bytes<T, R>();
    static_assert(smem <= 48 * 1024, "the ring must fit the default shared-memory limit");
    int ordinal = 0;
    CUDA_TRY(cudaGetDevice(&ordinal));
    int occ = __atomic_load_n(&occ_of[ordinal & 63], __ATOMIC_RELAXED);
    if (occ == 0) {
        /* shared memory for as many CTAs as the registers allow, the rest stays L1 (the
         * activations live there: 34 KB of digits for a 17408-column row) */
        cudaFuncAttributes fa;
        int smem_sm = 0;
        CUDA_TRY(cudaFuncGetAttributes(&fa, mmd_kernel<T, R>));
        CUDA_TRY(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                                        ordinal));
        const int warp_regs = (fa.numRegs * 32 + 255) / 256 * 256;
        const int by_regs = 65536 / (warp_regs * WARPS);
        const int carve = smem_sm > 0 ? (int)((100LL * by_regs * (smem + 1024) + smem_sm - 1) /
                                              smem_sm)
                                      : 100;
        CUDA_TRY(cudaFuncSetAttribute(mmd_kernel<T, R>,
                                      cudaFuncAttributePreferredSharedMemoryCarveout,
                                      carve < 100 ? carve : 100));
        CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, mmd_kernel<T, R>,
                                                               WARPS * 32, smem));
        occ = occ < 1 ? 1 : occ;
        __atomic_store_n(&occ_of[ordinal & 63], occ, __ATOMIC_RELAXED);
    }
    *out = occ;
    return TD_OK;
}

template <int T, int R> td_err plan_for(const ops_weight *w, const mm_device *dev, grid_plan *p)
{
    int occ = 0;
    TD_TRY((occupancy<T, R>(&occ)));
    *p = grid_for((w->rows + 2 * R - 1) / (2 * R), dev->n_sm, occ);
    return TD_OK;
}

template <int T, int R>
td_err launch(float *y, const mm_xquant *xq, const ops_weight *w, const grid_plan &plan,
              const mm_device *dev, cudaStream_t st)
{
    /* blocks per row: super-blocks, or Q8_0's blocks of 32 */
    const int64_t nblk = w->cols / (T == TD_Q8_0 ? 32 : MM_XBLOCK);
    if (w->row_bytes > ((size_t)1 << 26) || nblk > 0x7fffffff || plan.ctas > 0x7fffffff)
        return err_set(TD_ENOTSUP, "cuda_matmul: a %lld x %lld matrix is too large",
                       (long long)w->rows, (long long)w->cols);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)plan.ctas);
    cfg.blockDim = dim3(WARPS * 32);
    cfg.dynamicSmemBytes = (size_t)WARPS * ring_bytes<T, R>();
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = dev->pdl && !__atomic_load_n(&g_pdl_refused, __ATOMIC_RELAXED) ? 1 : 0;
    const uint8_t *wd = (const uint8_t *)w->data;
    cudaError_t e = cudaLaunchKernelEx(&cfg, mmd_kernel<T, R>, y, wd, (uint32_t)w->row_bytes,
                                       w->rows, (int)nblk, xq->xq, xq->xd, xq->xsum, xq->n_pad);
    if (e != cudaSuccess && cfg.numAttrs) {
        (void)cudaGetLastError(); /* plain launches from now on */
        __atomic_store_n(&g_pdl_refused, 1, __ATOMIC_RELAXED);
        cfg.numAttrs = 0;
        e = cudaLaunchKernelEx(&cfg, mmd_kernel<T, R>, y, wd, (uint32_t)w->row_bytes,
                               w->rows, (int)nblk, xq->xq, xq->xd, xq->xsum, xq->n_pad);
    }
    if (e != cudaSuccess)
        return err_set(TD_ECUDA, "cuda_matmul: %s decode kernel launch (%lld rows): %s",
                       dtype_name(w->type), (long long)w->rows, cudaGetErrorString(e));
    return TD_OK;
}

/* Q4_K: four rows per warp (each activation load serves two rows: 0.20 instead of 0.27
 * SASS instructions per weight byte) unless two rows per warp fill the last round of units
 * better by 10 points or more. Q5_K, Q6_K, Q8_0: two (their rings would take twice the
 * shared memory). */
template <int T>
td_err launch_rows(float *y, const mm_xquant *xq, const ops_weight *w, const mm_device *dev,
                   cudaStream_t st)
{
    grid_plan p1;
    TD_TRY((plan_for<T, 1>(w, dev, &p1)));
    if constexpr (T == TD_Q4_K) {
        grid_plan p2;
        TD_TRY((plan_for<T, 2>(w, dev, &p2)));
        if (p2.eff >= p1.eff - 0.10)
            return launch<T, 2>(y, xq, w, p2, dev, st);
    }
    return launch<T, 1>(y, xq, w, p1, dev, st);
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
