/* y = x . W^T for the quantised weights (Q8_0, Q4_K, Q5_K, Q6_K) on int8 tensor cores.
 *
 * One idea: weights stream once through a per-warp cp.async ring in shared memory (16-byte
 * copies of the GGUF bytes as they are), are unpacked in registers into int8 MMA fragments,
 * and meet 16-bit integer activations (matmul.cu rounds each token per 256 inputs, see
 * mm_xquant) as two int8 digits, hi and lo, in mma.sync. Integer dot products are exact,
 * and so are their integer combinations with the weights' integer sub-scales, so a K-quant
 * super-block costs one f32 scaling per (row, token) instead of one per sub-block, and
 * floating-point rounding happens in a fixed order:
 *
 *   CTA = 4 warps over 16*MT rows. Warp w owns k-blocks w, w+4, w+8, ... (a k-block is one
 *   256-weight super-block, or 4 Q8_0 blocks) and walks them in increasing order. Per (row,
 *   token) and k-block, with dx the token's scale of those inputs, dot_hi / dot_lo the exact
 *   int8 dots with the two digits and H, L, M, C exact integers:
 *     Q4_K, Q5_K: H = sum_j sc_j * dot_hi_j, L = sum_j sc_j * dot_lo_j (8 sub-blocks j),
 *                 M = sum_j m_j * sum32_j;  I = fma(256, float(H), float(L))
 *                 acc = fma(-(dx * dmin), float(M), fma(dx * d, I, acc))
 *     Q6_K:       H, L over the 16 groups k with sc_k, C = sum_k sc_k * sum16_k;
 *                 I = fma(-32, float(C), fma(256, float(H), float(L)))
 *                 acc = fma(dx * d, I, acc)
 *     Q8_0:       per block i = 0..3: acc = fma(dx * d_i, float(256 * dot_hi + dot_lo), acc)
 *   all with explicit _rn intrinsics (no contraction left to the compiler); then
 *   y = ((p0 + p1) + p2) + p3 over the warps.
 *
 * Nothing in that order depends on n_tok, the token's slot in the MMA or the row tile, so a
 * token's result is bit-identical whether it is computed alone or in a batch of 64 (the
 * variants for different n_tok differ only in how many MMAs share a weight fragment).
 *
 * MMA fragments (PTX ISA, mma.m16n8k32 / m16n8k16, .s8): lane = 4g + t; A reg0 = row g,
 * k 4t..4t+3; reg1 = row g+8, same k; reg2/reg3 = rows g/g+8, k 16+4t..16+4t+3 (k32 only);
 * B reg0 = token g, k 4t..4t+3, reg1 = k 16+4t.. (k32); D = {(g,2t), (g,2t+1), (g+8,2t),
 * (g+8,2t+1)}. Which weight sits in which k slot is ours to choose as long as A and B agree;
 * each type's mapping (matmul_quant_blocks.cuh) makes the B fragments one aligned load of
 * mm_xquant's layout. */
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/matmul_internal.h"
#include "kernels/cuda/matmul_quant_blocks.cuh"

namespace {

/* Ring depth: 3 k-blocks in flight per warp at MT = 1; the 32-row tile keeps the shared
 * memory of a CTA under the 99 KiB an sm_86 block may have. */
template <int MT> __host__ __device__ constexpr int stages()
{
    return MT == 1 ? 4 : 3;
}

/* The rings, then the reduction area (its own: the rings already hold the next tile's
 * k-blocks when a tile is reduced). */
template <int T, int MT> __host__ __device__ constexpr int ring_bytes()
{
    return KSPLIT * stages<MT>() * MROWS * MT * qt<T>::STRIDE;
}

template <int T, int MT, int NT> __host__ __device__ constexpr int smem_bytes()
{
    return ring_bytes<T, MT>() + KSPLIT * MROWS * MT * NTOK * NT * (int)sizeof(float);
}

/* --- staging ---------------------------------------------------------------------------- */

__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
    /* copies src_bytes (0..16) and zero-fills the rest of the 16 */
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

/* 16 bytes, or 16 zeros without reading src when skip (the cheaper ignore-src form). */
__device__ __forceinline__ void cp_async16_or_zero(void *dst, const void *src, bool skip)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n"
                 " cp.async.cg.shared.global [%0], [%1], 16, p;\n}\n" ::"r"(d),
                 "l"(src), "r"((int)skip)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Queues the copy of one k-block of rows 0..ROWS-1 (row i's block at kbase + i*row_bytes)
 * into slot: row i at slot + i*STRIDE, starting from the 16-byte boundary at or below the
 * block, so the block begins at offset (address & 15) of its staged row. Lane = 16 * i0 + p
 * copies piece p of rows i0, i0+2, ...: consecutive lanes read consecutive 16 bytes of a
 * row. Rows at or past n_rows are zero-filled and never read; their (ignored) source is the
 * matrix base w, a valid address, not an address computed for a row that does not exist.
 * Q4_K/Q5_K blocks are exactly the pieces. Q6_K/Q8_0 windows run up to SEG - 2 bytes past
 * the block: whole pieces are copied (the bytes past the block belong to the next block or
 * row and are never used), except where that could read past the matrix
 * (stage_issue_exact, chosen by mmq_stage_exact). The offsets (mmq_piece_rel) are signed:
 * row 0's window starts up to 14 bytes before kbase. */
template <int T, int ROWS>
__device__ __forceinline__ void stage_issue(uint8_t *slot, const uint8_t *w,
                                            const uint8_t *kbase, uint32_t row_bytes,
                                            int n_rows, int lane)
{
    using Q = qt<T>;
    const int p = lane & 15, i0 = lane >> 4;
    if (p >= Q::SEG / 16)
        return;
    const uint32_t kb_lo = (uint32_t)(uintptr_t)kbase;
#pragma unroll
    for (int k = 0; k < ROWS / 2; k++) {
        const int i = i0 + 2 * k;
        const bool skip = i >= n_rows;
        const uint8_t *src = kbase + mmq_piece_rel(kb_lo, row_bytes, i, p, Q::ALIGNED);
        cp_async16_or_zero(slot + i * Q::STRIDE + 16 * p, skip ? w : src, skip);
    }
}

/* stage_issue for the last k-block of the matrix's last rows (Q6_K, Q8_0): each piece copies
 * only the block's bytes and zero-fills the rest. Rare, so kept out of the main loop. */
template <int T, int ROWS>
__device__ __noinline__ void stage_issue_exact(uint8_t *slot, const uint8_t *w,
                                               const uint8_t *kbase, uint32_t row_bytes,
                                               int n_rows, int kb_bytes, int lane)
{
    using Q = qt<T>;
    const int p = lane & 15, i0 = lane >> 4;
    if (p >= Q::SEG / 16)
        return;
    const uint32_t kb_lo = (uint32_t)(uintptr_t)kbase;
    for (int k = 0; k < ROWS / 2; k++) {
        const int i = i0 + 2 * k;
        const int n = i < n_rows ? mmq_piece_exact_bytes(kb_lo, row_bytes, i, p, kb_bytes) : 0;
        uint8_t *dst = slot + i * Q::STRIDE + 16 * p;
        const uint8_t *src = kbase + mmq_piece_rel(kb_lo, row_bytes, i, p, false);
        if (n == 16 || n == 0) {
            cp_async16(dst, n > 0 ? src : w, n); /* n = 0 reads nothing */
            continue;
        }
        /* The matrix's last bytes: a 16-byte cp.async here would touch memory past the end
         * of the allocation (seen as an out-of-bounds read on an H200), so copy the n bytes
         * one by one and zero the rest; the stage's wait and barrier cover these stores. */
        for (int j = 0; j < 16; j++)
            dst[j] = j < n ? src[j] : 0;
    }
}

/* --- the kernel --------------------------------------------------------------------------- */

/* grid: resident CTAs only (launch sizes it), each looping over the 16*MT-row tiles
 * blockIdx.x, + gridDim.x, ...; block: KSPLIT warps; dynamic shared memory smem_bytes().
 * A warp's k-blocks of all its CTA's tiles form one stream through its ring, so the ring
 * fills once per CTA rather than once per tile (a 5120-column Q4_K tile gives a warp only
 * 5 k-blocks); the tile's reduction over the warps meets at two barriers. */
template <int T, int MT, int NT>
__global__ void __launch_bounds__(KSPLIT * 32)
    mmq_kernel(float *y, const uint8_t *w, uint32_t row_bytes, int64_t rows, int64_t cols,
               mm_xquant xq)
{
    using Q = qt<T>;
    constexpr int ROWS = MROWS * MT;
    constexpr int S = stages<MT>();
    constexpr int STAGE_BYTES = ROWS * Q::STRIDE;
    extern __shared__ __align__(16) uint8_t smem[];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const lane_pos l = {lane >> 2, lane & 3};
    const int64_t n_tiles = (rows + ROWS - 1) / ROWS;
    const int nkb = (int)((cols + Q::KB_W - 1) / Q::KB_W);
    const int nk = mmq_warp_kblocks(nkb, warp); /* my k-blocks per tile */
    uint8_t *ring = smem + warp * S * STAGE_BYTES;
    unsigned valid = 0; /* bit nt: this lane's token 8nt+g exists */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        valid |= (unsigned)(nt * NTOK + l.g < xq.n_tok) << nt;

    const int n_blk32 = (int)(cols / 32); /* Q8_0 blocks per row */
    /* the last k-block of a Q8_0 row may hold fewer than 4 blocks */
    auto kb_bytes = [&](int kb) { return mmq_kb_bytes(T == TD_Q8_0, Q::KB_BYTES, n_blk32, kb); };
    /* Every weight address stays inside the matrix: an item is issued only for a tile that
     * exists and s < nk, so kb < nkb and kbase lies in row r0 (< rows); rows past n_rows read
     * nothing and name w; a window that could run past the matrix's last byte (within
     * MMQ_TAIL_ROWS rows of the end, last k-block) takes the exact path. Per tile this is
     * the addressing of a CTA at r0, which tests/test_cuda_matmul_addresses.c checks for
     * every piece of every configuration the dispatcher picks. */
    /* producer: the next item to copy is step ps of tile pt, k-block kb = warp + KSPLIT * ps
     * at pk; per tile its rows (p_rows) and whether the exact path may be needed (p_tail) */
    int64_t pt = blockIdx.x;
    int ps = 0, p_rows = 0;
    bool p_tail = false;
    const uint8_t *pk = w;
    auto p_tile = [&]() {
        if (pt < n_tiles) {
            const int64_t r0 = pt * ROWS;
            p_rows = rows - r0 < ROWS ? (int)(rows - r0) : ROWS;
            p_tail = mmq_stage_exact(Q::ALIGNED, r0, ROWS, rows, nkb - 1, nkb);
            pk = w + (size_t)r0 * row_bytes + (size_t)warp * Q::KB_BYTES;
        }
    };
    p_tile();
    auto issue_next = [&](int slot_i) { /* into ring slot slot_i; no commit */
        if (pt < n_tiles && ps < nk) {
            const int kb = warp + KSPLIT * ps;
            uint8_t *slot = ring + slot_i * STAGE_BYTES;
            if (p_tail && kb == nkb - 1)
                stage_issue_exact<T, ROWS>(slot, w, pk, row_bytes, p_rows, kb_bytes(kb), lane);
            else
                stage_issue<T, ROWS>(slot, w, pk, row_bytes, p_rows, lane);
        }
        pk += KSPLIT * Q::KB_BYTES;
        if (++ps >= nk) {
            ps = 0;
            pt += gridDim.x;
            p_tile();
        }
    };

    /* the next matmul's rounding kernel may launch now: it waits for this grid to finish
     * before it touches anything (see matmul.cu) */
    mm_launch_dependents();
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        issue_next(s);
        cp_async_commit(); /* empty groups keep the count uniform */
    }
    /* the weights are on their way; xq comes from the kernel before this one */
    mm_wait_dependencies();
    float *red = (float *)(smem + ring_bytes<T, MT>()); /* [KSPLIT][ROWS][NTOK * NT] */
    int ci = 0; /* items consumed so far: the next one is in slot ci % S */
    for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
        const int64_t r0 = tile * ROWS;
        const int n_rows = rows - r0 < ROWS ? (int)(rows - r0) : ROWS;
        const uint8_t *wrow = w + (size_t)r0 * row_bytes;
        float acc[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[mt][nt][i] = 0.0f;
        for (int i = 0; i < nk; i++, ci++) {
            issue_next((ci + S - 1) % S); /* the slot consumed last, released below */
            cp_async_commit();
            cp_async_wait<S - 1>(); /* item ci has landed (for this lane's copies) */
            __syncwarp();           /* ... and for every lane's */
            const uint8_t *slot = ring + (ci % S) * STAGE_BYTES;
            const int kb = warp + KSPLIT * i;
            const uint8_t *kbase = wrow + (size_t)kb * Q::KB_BYTES;
            const xview x = xview_at(xq, cols, (int64_t)kb * Q::KB_W, valid, l);
            kblock_any<T, MT, NT>(acc, slot, kbase, row_bytes,
                                  T == TD_Q8_0 ? kb_bytes(kb) / 34 : 0, x, l);
            __syncwarp(); /* every lane is done with the slot before it is refilled */
        }

        /* y = ((p0 + p1) + p2) + p3 over the warps, through shared memory */
        tile_reduce<MT, NT>(y, red, acc, warp, l, 0, n_rows, xq.n_tok, rows, r0);
    }
    cp_async_wait<0>();
}



/* Launches one instantiation; the shared-memory opt-in above 48 KiB is set once per device. */
template <int T, int MT, int NT>
td_err launch(float *y, const mm_xquant *xq, const ops_weight *w, const mm_device *dev,
              cudaStream_t st)
{
    constexpr int smem = smem_bytes<T, MT, NT>();
    static_assert(smem <= 99 * 1024, "a CTA must fit the shared memory of an sm_86 block");
    static int occ_of[64]; /* resident CTAs per SM, per device ordinal (0: not set up yet) */
    int ordinal = 0;
    CUDA_TRY(cudaGetDevice(&ordinal));
    int occ = __atomic_load_n(&occ_of[ordinal & 63], __ATOMIC_RELAXED);
    if (occ == 0) {
        if (smem > 48 * 1024)
            CUDA_TRY(cudaFuncSetAttribute(mmq_kernel<T, MT, NT>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        /* as much shared memory as the SM has: more CTAs, more weight bytes in flight (L1
         * only serves the activations, a few KiB per token; a larger L1 measured the same
         * at 16 tokens on the H200) */
        CUDA_TRY(cudaFuncSetAttribute(mmq_kernel<T, MT, NT>,
                                      cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared));
        CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, mmq_kernel<T, MT, NT>,
                                                               KSPLIT * 32, smem));
        occ = occ < 1 ? 1 : occ;
        __atomic_store_n(&occ_of[ordinal & 63], occ, __ATOMIC_RELAXED);
    }
    const int64_t rows_per_cta = (int64_t)MROWS * MT;
    const int64_t n_tiles = (w->rows + rows_per_cta - 1) / rows_per_cta;
    /* 1..8 tokens: resident CTAs looping over tiles (H200, one token: 27-67% of the copy
     * rate, ahead of the single-token kernel for most shapes). 9+ tokens: one CTA per tile,
     * the schedule measured before (the looping grid fell to 1 CTA per SM where the
     * registers allow 2: 16 tokens 63 us instead of 47 on 5120 -> 17408 Q4_K). */
    const int64_t grid = NT == 1 ? mmq_tiles_grid(n_tiles, dev->n_sm, occ) : n_tiles;
    return mmq_launch_grid(mmq_kernel<T, MT, NT>, grid, KSPLIT * 32, smem, y, xq, w, dev, st,
                           "kernel");
}

/* Picks the tile: one 16-row MMA tile per warp, except Q8_0 at 9-16 tokens on matrices that
 * give every SM several CTAs of two tiles: a warp's two row tiles share each activation
 * fragment. (On the H200, 5120 -> 17408 at 16 tokens: Q4_K 47.9 us with two tiles, 42.7 with
 * one (177 registers against 103: 2 CTAs per SM against 4), Q6_K 84.6 and 70.6, Q8_0 76.0
 * and 95.1.) */
template <int T>
td_err launch_type(float *y, const mm_xquant *xq, const ops_weight *w, const mm_device *dev,
                   cudaStream_t st)
{
    const bool two = T == TD_Q8_0 && w->rows >= (int64_t)2 * MROWS * 4 * dev->n_sm;
    switch (xq->n_pad) {
    case 8: /* 2..8 tokens (one token goes to matmul_decode.cu, but would work here too) */
        return launch<T, 1, 1>(y, xq, w, dev, st);
    case 16:
        return two ? launch<T, 2, 2>(y, xq, w, dev, st) : launch<T, 1, 2>(y, xq, w, dev, st);
    case 32:
        return launch<T, 1, 4>(y, xq, w, dev, st);
    default:
        TD_ASSERT(xq->n_pad == 64);
        return launch<T, 1, 8>(y, xq, w, dev, st);
    }
}

} /* namespace */

td_err mmq_launch_grid(mmq_kernel_fn k, int64_t grid, int threads, int smem, float *y,
                       const mm_xquant *xq, const ops_weight *w, const mm_device *dev,
                       cudaStream_t st, const char *what)
{
    if (grid > 0x7fffffff || w->row_bytes > ((size_t)1 << 26)) /* 32-bit row offsets */
        return err_set(TD_ENOTSUP, "cuda_matmul: a %lld x %lld matrix is too large",
                       (long long)w->rows, (long long)w->cols);
    const cudaError_t e = launch_ex(k, grid, threads, smem, dev->pdl, st, y,
                                    (const uint8_t *)w->data, (uint32_t)w->row_bytes, w->rows,
                                    w->cols, *xq);
    if (e != cudaSuccess)
        return err_set(TD_ECUDA, "cuda_matmul: %s %s launch (%lld rows): %s",
                       dtype_name(w->type), what, (long long)w->rows, cudaGetErrorString(e));
    return TD_OK;
}

int mmq_unit(td_dtype type)
{
    return type == TD_Q6_K ? 4 : 8;
}

td_err mmq_launch(float *y, const mm_xquant *xq, const ops_weight *w, const mm_device *dev,
                  cudaStream_t st)
{
    TD_ASSERT(xq->n_tok >= 1 && xq->n_tok <= xq->n_pad && xq->n_pad <= MM_CHUNK);
    TD_ASSERT(((uintptr_t)w->data & 15) == 0);
    switch (w->type) {
    case TD_Q8_0:
        return launch_type<TD_Q8_0>(y, xq, w, dev, st);
    case TD_Q4_K:
        return launch_type<TD_Q4_K>(y, xq, w, dev, st);
    case TD_Q5_K:
        return launch_type<TD_Q5_K>(y, xq, w, dev, st);
    case TD_Q6_K:
        return launch_type<TD_Q6_K>(y, xq, w, dev, st);
    default:
        TD_ASSERT(!"mmq_launch: not a quantised type");
    }
    return TD_OK;
}
