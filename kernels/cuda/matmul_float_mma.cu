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
 * lane's 8 activations of token g.
 *
 * Reduction order per (row, token), the same for every n_tok (batch invariance): the columns
 * are cut into k-blocks of 128; CTA = 4 warps over one 16-row tile, warp w owns k-blocks w,
 * w+4, ... in increasing order. Per k-block a zeroed accumulator takes, for chunks 0..3, the
 * first MMA then the second, each as pieces h, m, l (F16: weight hi then lo for each piece);
 * the k-block's sum is then added in f32 (`__fadd_rn`) to the warp's total, so no tensor-core
 * chain is longer than 24 (F16: 48) MMAs; finally y = ((p0 + p1) + p2) + p3 over the warps.
 * An output element of an MMA depends only on its own row, column and accumulator, so the
 * n-tiles a launch has, and which n-tile or column a token occupies, never change it; one
 * token runs the same kernel (7 of 8 columns wasted, still bandwidth-bound).
 *
 * Special values: a NaN activation gives NaN outputs for its token; an infinite one gives
 * NaN too (inf - inf in the split), where the CPU may give an infinity. */
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/matmul_internal.h"

namespace {

constexpr int WARPS = 4;      /* warps per CTA, splitting the tile's k-blocks */
constexpr int TILE = 16;      /* weight rows per CTA: the MMA's M */
constexpr int KBLOCK = 128;   /* columns per k-block: one tensor-core chain */
constexpr int CHUNKS = KBLOCK / 32;
constexpr int MAX_NT = 4;     /* n-tiles (8 tokens each) per CTA */

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

/* c += A . B, m16n8k16, bf16 in, f32 accumulate. */
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 16 weight bytes that are read once: not kept in L1, which holds the activations. */
__device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

/* Weights row[col..col+7] as 8 16-bit values (zeros past cols or for a missing row). VEC:
 * data, row size and cols are multiples of 16 bytes / 8 columns, so a lane's 8 columns are
 * all inside or all outside the row. */
template <bool VEC>
__device__ __forceinline__ uint4 load_w(const uint8_t *row, int col, int cols)
{
    if (row == nullptr || col >= cols)
        return make_uint4(0, 0, 0, 0);
    if constexpr (VEC) {
        return ld_stream(row + 2 * (size_t)col);
    } else {
        uint16_t h[8];
#pragma unroll
        for (int e = 0; e < 8; e++)
            h[e] = col + e < cols ? __ldg((const unsigned short *)row + col + e) : (uint16_t)0;
        uint4 v;
        memcpy(&v, h, sizeof v);
        return v;
    }
}

/* Activations xt[col..col+7] (zeros past cols or for a missing token). */
template <bool VEC>
__device__ __forceinline__ void load_x(float (&v)[8], const float *xt, int col, int cols)
{
    if (xt == nullptr || col >= cols) {
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[e] = 0.0f;
    } else if constexpr (VEC) {
        const float4 a = __ldg((const float4 *)(xt + col));
        const float4 b = __ldg((const float4 *)(xt + col) + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[e] = col + e < cols ? __ldg(xt + col + e) : 0.0f;
    }
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

/* grid: (groups of RT row tiles x token groups of NT * 8), token group fastest so the CTAs
 * sharing weights run together; block: RT x WARPS warps, warp (rt, kw) on row tile rt and
 * k-blocks kw, kw + WARPS, ... The RT warps with the same kw load the same activations at
 * about the same time, so L1 serves all but one of them: RT only divides the activation
 * traffic, it never changes what a warp adds in which order. */
template <int T, int NT, bool VEC, int RT>
__global__ void __launch_bounds__(RT * WARPS * 32)
    mmh_kernel(float *y, const uint8_t *w, size_t row_bytes, int64_t rows, int cols,
               const float *x, int n_tok, int n_groups)
{
    __shared__ float red[RT][WARPS][NT * 8][TILE]; /* warp partials [tile][warp][token][row] */
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % WARPS;
    const int rt = (int)(threadIdx.x >> 5) / WARPS, g = lane >> 2, t = lane & 3;
    const int64_t r0 = ((int64_t)(blockIdx.x / n_groups) * RT + rt) * TILE;
    const int tok0 = (int)(blockIdx.x % n_groups) * NT * 8;
    const int nkb = (cols + KBLOCK - 1) / KBLOCK;
    const uint8_t *wrow[2] = {r0 + g < rows ? w + (size_t)(r0 + g) * row_bytes : nullptr,
                              r0 + g + 8 < rows ? w + (size_t)(r0 + g + 8) * row_bytes
                                                : nullptr};
    const float *xrow[NT]; /* token tok0 + 8 nt + g of this lane's B columns */
    int nt_live = 0;       /* n-tiles holding a real token (warp-uniform) */
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int tok = tok0 + 8 * nt + g;
        xrow[nt] = tok < n_tok ? x + (size_t)tok * cols : nullptr;
        nt_live += tok0 + 8 * nt < n_tok;
    }

    float tot[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            tot[nt][i] = 0.0f;

    /* weights of the next k-block load while this one is multiplied */
    uint4 cur[CHUNKS][2];
#pragma unroll
    for (int j = 0; j < CHUNKS; j++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++)
            cur[j][rr] = load_w<VEC>(wrow[rr], warp * KBLOCK + 32 * j + 8 * t, cols);
    for (int kb = warp; kb < nkb; kb += WARPS) {
        uint4 nxt[CHUNKS][2];
#pragma unroll
        for (int j = 0; j < CHUNKS; j++)
#pragma unroll
            for (int rr = 0; rr < 2; rr++)
                nxt[j][rr] = load_w<VEC>(wrow[rr], (kb + WARPS) * KBLOCK + 32 * j + 8 * t, cols);

        float blk[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                blk[nt][i] = 0.0f;
#pragma unroll
        for (int j = 0; j < CHUNKS; j++) {
            const int col = kb * KBLOCK + 32 * j + 8 * t;
            const wfrag<T> f = make_frag<T>(cur[j]);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                if (nt >= nt_live)
                    break;
                float xv[8];
                load_x<VEC>(xv, xrow[nt], col, cols);
                uint32_t h[4], m[4], l[4]; /* pairs of columns 8t + 2i, 8t + 2i + 1 */
#pragma unroll
                for (int i = 0; i < 4; i++)
                    split_x(xv[2 * i], xv[2 * i + 1], h[i], m[i], l[i]);
#pragma unroll
                for (int q = 0; q < 2; q++) {
#pragma unroll
                    for (int p = 0; p < wfrag<T>::P; p++)
                        mma(blk[nt], f.a[q][p], h[2 * q], h[2 * q + 1]);
#pragma unroll
                    for (int p = 0; p < wfrag<T>::P; p++)
                        mma(blk[nt], f.a[q][p], m[2 * q], m[2 * q + 1]);
#pragma unroll
                    for (int p = 0; p < wfrag<T>::P; p++)
                        mma(blk[nt], f.a[q][p], l[2 * q], l[2 * q + 1]);
                }
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                tot[nt][i] = __fadd_rn(tot[nt][i], blk[nt][i]);
#pragma unroll
        for (int j = 0; j < CHUNKS; j++)
#pragma unroll
            for (int rr = 0; rr < 2; rr++)
                cur[j][rr] = nxt[j][rr];
    }

    /* c0, c1: row g, tokens 2t, 2t+1 of the n-tile; c2, c3: row g + 8 */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            red[rt][warp][8 * nt + 2 * t + (i & 1)][g + 8 * (i >> 1)] = tot[nt][i];
    __syncthreads();
    for (int i = threadIdx.x; i < RT * NT * 8 * TILE; i += RT * WARPS * 32) {
        const int tr = i / (NT * 8 * TILE), tt = i / TILE % (NT * 8), r = i % TILE;
        const int64_t row = ((int64_t)(blockIdx.x / n_groups) * RT + tr) * TILE + r;
        if (row < rows && tok0 + tt < n_tok) {
            float v = red[tr][0][tt][r];
#pragma unroll
            for (int k = 1; k < WARPS; k++)
                v = __fadd_rn(v, red[tr][k][tt][r]);
            y[(size_t)(tok0 + tt) * rows + row] = v;
        }
    }
}

template <int T, int NT, bool VEC, int RT>
td_err launch(float *y, const float *x, const ops_weight *w, int n_tok, cudaStream_t st)
{
    const int n_groups = (n_tok + NT * 8 - 1) / (NT * 8);
    const int64_t tiles = (w->rows + TILE - 1) / TILE;
    const int64_t n_cta = (tiles + RT - 1) / RT * n_groups;
    if (n_cta > 0x7fffffff)
        return err_set(TD_ENOTSUP, "matmul of %lld rows needs more CTAs than a grid holds",
                       (long long)w->rows);
    mmh_kernel<T, NT, VEC, RT><<<(unsigned)n_cta, RT * WARPS * 32, 0, st>>>(
        y, (const uint8_t *)w->data, w->row_bytes, w->rows, (int)w->cols, x, n_tok, n_groups);
    CUDA_TRY_LAUNCH();
    return TD_OK;
}

/* Row tiles per CTA: the most (up to 4) that still give every SM a CTA. The scalar path
 * (misaligned or odd-width weights) keeps one. */
template <int T, int NT, bool VEC>
td_err launch_rt(float *y, const float *x, const ops_weight *w, int n_tok, int n_sm,
                 cudaStream_t st)
{
    const int64_t tiles = (w->rows + TILE - 1) / TILE;
    /* F16 at 32 tokens needs more than the 128 registers a 512-thread CTA leaves */
    if constexpr (VEC && !(T == TD_F16 && NT == MAX_NT)) {
        if (tiles >= 4 * (int64_t)n_sm)
            return launch<T, NT, VEC, 4>(y, x, w, n_tok, st);
    }
    if constexpr (VEC) {
        if (tiles >= 2 * (int64_t)n_sm)
            return launch<T, NT, VEC, 2>(y, x, w, n_tok, st);
    }
    return launch<T, NT, VEC, 1>(y, x, w, n_tok, st);
}

template <int T, bool VEC>
td_err launch_nt(float *y, const float *x, const ops_weight *w, int n_tok, int n_sm,
                 cudaStream_t st)
{
    if (n_tok <= 8)
        return launch_rt<T, 1, VEC>(y, x, w, n_tok, n_sm, st);
    if (n_tok <= 16)
        return launch_rt<T, 2, VEC>(y, x, w, n_tok, n_sm, st);
    return launch_rt<T, MAX_NT, VEC>(y, x, w, n_tok, n_sm, st);
}

template <int T>
td_err launch_type(float *y, const float *x, const ops_weight *w, int n_tok, bool vec,
                   int n_sm, cudaStream_t st)
{
    return vec ? launch_nt<T, true>(y, x, w, n_tok, n_sm, st)
               : launch_nt<T, false>(y, x, w, n_tok, n_sm, st);
}

} /* namespace */

td_err mmh_launch(float *y, const float *x, const ops_weight *w, int n_tok, cudaStream_t st)
{
    TD_ASSERT(n_tok >= 1 && n_tok <= MM_CHUNK);
    if (w->cols > INT32_MAX - 2 * KBLOCK * WARPS)
        return err_set(TD_ENOTSUP, "matmul of %lld columns: more than the kernel indexes",
                       (long long)w->cols);
    const bool vec = ((uintptr_t)w->data & 15) == 0 && (w->row_bytes & 15) == 0 &&
                     ((uintptr_t)x & 15) == 0 && w->cols % 8 == 0;
    int dev = 0, n_sm = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    CUDA_TRY(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    switch (w->type) {
    case TD_F16:
        return launch_type<TD_F16>(y, x, w, n_tok, vec, n_sm, st);
    case TD_BF16:
        return launch_type<TD_BF16>(y, x, w, n_tok, vec, n_sm, st);
    default:
        TD_ASSERT(!"mmh_launch: not F16 or BF16");
    }
    return TD_OK;
}
