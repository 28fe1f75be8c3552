/* y = x . W^T for 2..64 tokens on sm_90: the tensor-core kernel of matmul_quant.cu with its
 * weight staging done by bulk copies (cp.async.bulk, one per row window of a k-block, issued
 * by one lane) completing on one mbarrier per ring stage, instead of 16-byte cp.async copies
 * by every lane waited for in order. TANDEM_MMQ=bulk selects it (not the default yet).
 *
 * Everything else is matmul_quant.cu's: the tiles (CTA = KSPLIT warps over 16*MT rows),
 * warp w's k-blocks w, w+4, ... in order, the staged layout (row i's window at slot + i *
 * STRIDE, from the 16-byte boundary at or below its block), the fragment code of
 * matmul_quant_blocks.cuh (kblock_kq, kblock_q6k, kblock_q80) and the reduction over the
 * warps, so every (row, token) is bit-identical to mmq_launch's (tested). Rows past the
 * tile's last are not copied (their results are never stored). A window that would run past
 * the matrix (Q6_K/Q8_0, the matrix's last k-blocks) stops at its last 16-byte boundary and
 * the block's bytes after it are 16-bit loads, stored before the stage's arrival. */
#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MMB_SM90 1 /* device code exists for sm_90 only; the sm_86 kernel is an empty stub */
#else
#define MMB_SM90 0
#endif

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/matmul_bulk_copy.cuh"
#include "kernels/cuda/matmul_internal.h"
#include "kernels/cuda/matmul_quant_blocks.cuh"

namespace {

/* Ring depth per warp, as matmul_quant.cu's (the same shared memory, so the same CTAs per
 * SM), plus one mbarrier per stage. */
template <int MT> __host__ __device__ constexpr int stages()
{
    return MT == 1 ? 4 : 3;
}

template <int T, int MT> __host__ __device__ constexpr int ring_bytes()
{
    return KSPLIT * stages<MT>() * MROWS * MT * qt<T>::STRIDE;
}

template <int T, int MT, int NT> __host__ __device__ constexpr int red_bytes()
{
    return KSPLIT * MROWS * MT * NTOK * NT * (int)sizeof(float);
}

template <int T, int MT, int NT> __host__ __device__ constexpr int smem_bytes()
{
    return ring_bytes<T, MT>() + red_bytes<T, MT, NT>() + 8 * KSPLIT * stages<MT>();
}

#if MMB_SM90

/* One item (k-block kb of a tile's rows 0..n_rows-1, row i's block at kbase + i *
 * row_bytes) into slot, by one thread: row i's window of SEG bytes from the 16-byte boundary
 * at or below its block (mmq_piece_rel), one bulk copy each. Windows past wend (the matrix's
 * end; only its last k-blocks, `tail`) stop at its last 16-byte boundary and the block's
 * bytes after it are copied with 16-bit loads. Each copy's bytes are announced before it,
 * the stage's one arrival comes last (and releases the 16-bit stores). */
template <int T, int ROWS>
__device__ __forceinline__ void item_issue(uint8_t *slot, uint64_t *bar, const uint8_t *kbase,
                                           const uint8_t *wend, uint32_t row_bytes,
                                           int n_rows, int kb_bytes, bool tail,
                                           uint64_t policy)
{
    using Q = qt<T>;
    const uint32_t kb_lo = (uint32_t)(uintptr_t)kbase;
    for (int i = 0; i < n_rows; i++) {
        const uint8_t *src = kbase + mmq_piece_rel(kb_lo, row_bytes, i, 0, Q::ALIGNED);
        uint8_t *dst = slot + i * Q::STRIDE;
        uint32_t bytes = Q::SEG;
        if (!Q::ALIGNED && tail && src + Q::SEG > wend) {
            const uint8_t *lim = wend - ((uintptr_t)wend & 15); /* the matrix is 16-aligned */
            const uint8_t *end = kbase + (size_t)i * row_bytes + kb_bytes; /* <= wend */
            bytes = (uint32_t)(lim - src);
            for (const uint8_t *p = lim; p < end; p += 2) /* even offsets and sizes */
                *(uint16_t *)(dst + (p - src)) = *(const uint16_t *)p;
        }
        if (bytes) {
            bar_expect_tx(bar, bytes);
            bulk_copy(dst, src, bytes, bar, policy);
        }
    }
    bar_arrive(bar);
}

#endif /* MMB_SM90 */

/* grid: as mmq_kernel (resident CTAs looping over the 16*MT-row tiles for 1 n-tile, one CTA
 * per tile otherwise); block: KSPLIT warps; dynamic shared memory smem_bytes(). */
template <int T, int MT, int NT>
__global__ void __launch_bounds__(KSPLIT * 32)
    mmqb_kernel(float *y, const uint8_t *w, uint32_t row_bytes, int64_t rows, int64_t cols,
                mm_xquant xq)
{
    /* the next matmul's rounding kernel may launch now: it waits for this grid to finish
     * before it touches anything (see matmul.cu) */
    mm_launch_dependents();
#if MMB_SM90
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
    uint64_t *bars = (uint64_t *)(smem + ring_bytes<T, MT>() + red_bytes<T, MT, NT>());
    uint64_t *wbar = bars + warp * S;
    if (threadIdx.x == 0) {
        for (int i = 0; i < KSPLIT * S; i++)
            bar_init(&bars[i], 1);
        bar_init_fence();
    }
    __syncthreads();
    unsigned valid = 0; /* bit nt: this lane's token 8nt+g exists */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        valid |= (unsigned)(nt * NTOK + l.g < xq.n_tok) << nt;

    const int n_blk32 = (int)(cols / 32); /* Q8_0 blocks per row */
    auto kb_bytes = [&](int kb) { return mmq_kb_bytes(T == TD_Q8_0, Q::KB_BYTES, n_blk32, kb); };
    const uint8_t *wend = w + (size_t)rows * row_bytes; /* one past the matrix */
    const uint64_t policy = evict_first_policy();
    /* producer: the next item is step ps of tile pt, k-block kb = warp + KSPLIT * ps at pk;
     * per tile its rows and whether its windows may pass the matrix's end (mmq's p_tail) */
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
    auto issue_next = [&](int slot_i) { /* into ring slot slot_i */
        if (pt < n_tiles && ps < nk) {
            const int kb = warp + KSPLIT * ps;
            if (elect_one())
                item_issue<T, ROWS>(ring + slot_i * STAGE_BYTES, &wbar[slot_i], pk, wend,
                                    row_bytes, p_rows, kb_bytes(kb), p_tail && kb == nkb - 1,
                                    policy);
        }
        pk += KSPLIT * Q::KB_BYTES;
        if (++ps >= nk) {
            ps = 0;
            pt += gridDim.x;
            p_tile();
        }
    };

#pragma unroll
    for (int s = 0; s < S - 1; s++)
        issue_next(s);
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
            bar_wait(&wbar[ci % S], (uint32_t)(ci / S) & 1);
            const uint8_t *slot = ring + (ci % S) * STAGE_BYTES;
            const int kb = warp + KSPLIT * i;
            const uint8_t *kbase = wrow + (size_t)kb * Q::KB_BYTES;
            const xview x = xview_at(xq, cols, (int64_t)kb * Q::KB_W, valid, l);
            kblock_any<T, MT, NT>(acc, slot, kbase, row_bytes,
                                  T == TD_Q8_0 ? kb_bytes(kb) / 34 : 0, x, l);
            __syncwarp(); /* every lane is done with the slot before it is refilled */
        }

        /* y = ((p0 + p1) + p2) + p3 over the warps, through shared memory */
        tile_reduce<MT, NT>(y, red, acc, warp, l, n_rows, xq.n_tok, rows, r0);
    }
#else
    (void)y, (void)w, (void)row_bytes, (void)rows, (void)cols, (void)xq;
#endif
}



template <int T, int MT, int NT>
td_err launch(float *y, const mm_xquant *xq, const ops_weight *w, const mm_device *dev,
              cudaStream_t st)
{
    constexpr int smem = smem_bytes<T, MT, NT>();
    static int occ_of[64]; /* resident CTAs per SM, per device ordinal (0: not set up yet) */
    int ordinal = 0;
    CUDA_TRY(cudaGetDevice(&ordinal));
    int occ = __atomic_load_n(&occ_of[ordinal & 63], __ATOMIC_RELAXED);
    if (occ == 0) {
        if (smem > 48 * 1024)
            CUDA_TRY(cudaFuncSetAttribute(mmqb_kernel<T, MT, NT>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_TRY(cudaFuncSetAttribute(mmqb_kernel<T, MT, NT>,
                                      cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared));
        CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, mmqb_kernel<T, MT, NT>,
                                                               KSPLIT * 32, smem));
        occ = occ < 1 ? 1 : occ;
        __atomic_store_n(&occ_of[ordinal & 63], occ, __ATOMIC_RELAXED);
    }
    const int64_t n_tiles = (w->rows + (int64_t)MROWS * MT - 1) / ((int64_t)MROWS * MT);
    const int64_t grid = NT == 1 ? mmq_tiles_grid(n_tiles, dev->n_sm, occ) : n_tiles;
    return mmq_launch_grid(mmqb_kernel<T, MT, NT>, grid, smem, y, xq, w, dev, st,
                           "bulk tensor-core kernel");
}

/* The tile as matmul_quant.cu's launch_type picks it (results never depend on it). */
template <int T>
td_err launch_type(float *y, const mm_xquant *xq, const ops_weight *w, const mm_device *dev,
                   cudaStream_t st)
{
    const bool two = w->rows >= (int64_t)2 * MROWS * 4 * dev->n_sm;
    switch (xq->n_pad) {
    case 8:
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

bool mmqb_supported(const ops_weight *w)
{
    int ordinal = 0, major = 0;
    if (cudaGetDevice(&ordinal) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return major >= 9 && ((uintptr_t)w->data & 15) == 0 &&
           (w->type == TD_Q4_K || w->type == TD_Q5_K || w->type == TD_Q6_K ||
            w->type == TD_Q8_0);
}

td_err mmqb_launch(float *y, const mm_xquant *xq, const ops_weight *w, const mm_device *dev,
                   cudaStream_t st)
{
    TD_ASSERT(xq->n_tok >= 1 && xq->n_tok <= xq->n_pad && xq->n_pad <= MM_CHUNK);
    TD_ASSERT(mmqb_supported(w));
    switch (w->type) {
    case TD_Q8_0:
        return launch_type<TD_Q8_0>(y, xq, w, dev, st);
    case TD_Q5_K:
        return launch_type<TD_Q5_K>(y, xq, w, dev, st);
    case TD_Q6_K:
        return launch_type<TD_Q6_K>(y, xq, w, dev, st);
    default:
        return launch_type<TD_Q4_K>(y, xq, w, dev, st);
    }
}
