/* Picking the largest entries of a row inside one block: argmax and top-k with the CPU's
 * ranking (kernels/cpu/act.c: larger value first, lower index first on ties, NaN last, -0 and
 * +0 equal). Shared by select.cu (argmax, top-k, greedy acceptance) and sample.cu (the
 * top-k of the sampler). Include only from .cu files. */
#ifndef TANDEM_KERNELS_CUDA_SELECT_CUH
#define TANDEM_KERNELS_CUDA_SELECT_CUH

#include "kernels/cuda/ops_dev.cuh"

#define TOPK_MAX 1024 /* largest k one block selects (candidates live in shared memory) */

#define SEL_UNROLL 4 /* 16-byte loads in flight per thread in sel_for_each */

/* Calls f(i, x[i], true) once for every i < n, and f(i, 0, false) where a thread has no entry
 * at that step, so that every thread of the block makes the same number of calls (warp-wide
 * operations inside f are safe). Each thread sees a fixed set of entries in a fixed order
 * (its sums are reproducible): four consecutive entries per 16-byte load, SEL_UNROLL loads
 * issued before the first is used, the entries before x's first 16-byte boundary and after
 * its last one (at most 3 each) by threads 0..2. One block streaming a row is bound by the
 * bytes it has in flight: 4-byte loads, four per thread, held a 1024-thread block to ~15
 * GB/s. x is 4-byte aligned; blockDim.x >= 4. */
template <typename F> __device__ __forceinline__ void sel_for_each_all(const float *x, int64_t n, F f)
{
    const int64_t t = threadIdx.x, step = blockDim.x;
    int64_t head = (int64_t)((16 - ((uintptr_t)x & 15)) & 15) >> 2;
    head = head < n ? head : n;
    f(t, t < head ? x[t] : 0.0f, t < head);
    const float4 *x4 = (const float4 *)(x + head);
    const int64_t n4 = (n - head) >> 2;
    for (int64_t j0 = 0; j0 < n4; j0 += SEL_UNROLL * step) {
        float4 v[SEL_UNROLL];
#pragma unroll
        for (int u = 0; u < SEL_UNROLL; u++) {
            const int64_t j = j0 + u * step + t;
            v[u] = j < n4 ? x4[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < SEL_UNROLL; u++) {
            const int64_t j = j0 + u * step + t, i = head + 4 * j;
            const bool in = j < n4;
            f(i, v[u].x, in);
            f(i + 1, v[u].y, in);
            f(i + 2, v[u].z, in);
            f(i + 3, v[u].w, in);
        }
    }
    const int64_t i = head + 4 * n4 + t;
    f(i, i < n ? x[i] : 0.0f, i < n);
}

/* Calls f(i, x[i]) once for every i < n (sel_for_each_all's entries and order). */
template <typename F> __device__ __forceinline__ void sel_for_each(const float *x, int64_t n, F f)
{
    sel_for_each_all(x, n, [&](int64_t i, float v, bool in) {
        if (in)
            f(i, v);
    });
}

/* (va, ia) ranks above (vb, ib) in cpu_argmax's order. */
__device__ __forceinline__ bool sel_better(float va, int64_t ia, float vb, int64_t ib)
{
    if (isnan(vb))
        return !isnan(va) || ia < ib;
    if (isnan(va))
        return false;
    return va > vb || (va == vb && ia < ib);
}

/* Index of the best entry of x[n] (cpu_argmax), returned to every thread of the block.
 * sh_v, sh_i: 33 elements of shared memory each. Exact: the winner does not depend on the
 * order of comparisons, since sel_better is a total order. */
__device__ __forceinline__ int64_t sel_argmax_block(const float *x, int64_t n, float *sh_v,
                                                    int64_t *sh_i)
{
    float bv = NAN;
    int64_t bi = INT64_MAX; /* loses to every real entry */
    sel_for_each(x, n, [&](int64_t i, float v) {
        if (sel_better(v, i, bv, bi))
            bv = v, bi = i;
    });
    for (int off = 16; off > 0; off >>= 1) {
        float ov = __shfl_xor_sync(DEV_FULL_MASK, bv, off);
        int64_t oi = __shfl_xor_sync(DEV_FULL_MASK, bi, off);
        if (sel_better(ov, oi, bv, bi))
            bv = ov, bi = oi;
    }
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads(); /* the arrays may still be read by a previous call */
    if (lane == 0)
        sh_v[w] = bv, sh_i[w] = bi;
    __syncthreads();
    if (w == 0) {
        bv = lane < nw ? sh_v[lane] : NAN;
        bi = lane < nw ? sh_i[lane] : INT64_MAX;
        for (int off = 16; off > 0; off >>= 1) {
            float ov = __shfl_xor_sync(DEV_FULL_MASK, bv, off);
            int64_t oi = __shfl_xor_sync(DEV_FULL_MASK, bi, off);
            if (sel_better(ov, oi, bv, bi))
                bv = ov, bi = oi;
        }
        if (lane == 0)
            sh_i[32] = bi;
    }
    __syncthreads();
    return sh_i[32];
}

/* A 64-bit key per entry that orders entries as sel_better does, all keys distinct: the
 * value's bits made monotonic (NaN lowest, -0 as +0) above the complemented index (a lower
 * index gives a larger key). */
__device__ __forceinline__ uint64_t sel_key(float v, uint32_t i)
{
    uint32_t u;
    if (isnan(v)) {
        u = 0;
    } else {
        uint32_t b = v == 0.0f ? 0u : __float_as_uint(v);
        u = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    }
    return ((uint64_t)u << 32) | (uint32_t)~i;
}

__device__ __forceinline__ uint32_t sel_key_index(uint64_t key)
{
    return ~(uint32_t)key;
}

typedef struct sel_smem {
    unsigned hist[256];      /* keys per digit value in this pass */
    uint64_t cand[TOPK_MAX]; /* the selected keys, unordered */
    uint64_t prefix;         /* the digits decided so far */
    uint64_t mask;           /* the bits prefix decides */
    uint64_t thresh;         /* the selection is every key >= thresh */
    int need;                /* keys still to take from the prefix's bucket */
    int done;
    unsigned cnt;            /* keys gathered into cand */
} sel_smem;

/* The k largest keys of x[n] (cpu_topk's order), largest first, into out[k] (shared or
 * global memory, not sm); x[i] is entry base + i of its row (the keys hold that index).
 * 1 <= k <= min(n, TOPK_MAX), base + n <= INT32_MAX. Every thread of the block must call it.
 *
 * Radix select on the distinct keys, 8 bits per pass from the top: count the keys of the
 * current bucket per digit, keep the digit where the k-th largest falls, stop once the whole
 * bucket is taken (after 4 passes unless values tie). The counts use shared-memory integer
 * atomics: counts, and so the selected set, do not depend on their order; the set is then
 * sorted by rank, so the result is exact and deterministic. */
__device__ __forceinline__ void sel_topk_block(const float *x, int64_t n, int k, sel_smem *sm,
                                               uint64_t *out, uint32_t base)
{
    __syncthreads(); /* sm may still be read by a previous call */
    if (threadIdx.x == 0) {
        sm->prefix = 0;
        sm->mask = 0;
        sm->need = k;
        sm->done = 0;
        sm->cnt = 0;
    }
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += blockDim.x)
            sm->hist[d] = 0;
        __syncthreads();
        const uint64_t prefix = sm->prefix, mask = sm->mask;
        sel_for_each(x, n, [&](int64_t i, float v) {
            const uint64_t key = sel_key(v, base + (uint32_t)i);
            if ((key & mask) == prefix)
                atomicAdd(&sm->hist[(key >> shift) & 255], 1u);
        });
        __syncthreads();
        if (threadIdx.x == 0) {
            /* the digit d with above < need <= above + hist[d], above = keys of larger digits */
            unsigned above = 0, need = (unsigned)sm->need;
            int d = 255;
            for (; d > 0; d--) {
                if (above + sm->hist[d] >= need)
                    break;
                above += sm->hist[d];
            }
            need -= above;
            sm->prefix |= (uint64_t)d << shift;
            sm->mask |= (uint64_t)255 << shift;
            sm->need = (int)need;
            /* keys are distinct, so the last pass always ends here */
            if (sm->hist[d] == need || shift == 0) {
                sm->done = 1;
                sm->thresh = sm->prefix;
            }
        }
        __syncthreads();
        if (sm->done)
            break;
    }
    const uint64_t thresh = sm->thresh;
    sel_for_each(x, n, [&](int64_t i, float v) {
        const uint64_t key = sel_key(v, base + (uint32_t)i);
        if (key >= thresh) {
            unsigned pos = atomicAdd(&sm->cnt, 1u);
            if (pos < TOPK_MAX)
                sm->cand[pos] = key;
        }
    });
    __syncthreads();
    /* distinct keys: each one's rank is the number of larger ones */
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        const uint64_t kj = sm->cand[j];
        int r = 0;
        for (int m = 0; m < k; m++)
            r += sm->cand[m] > kj;
        out[r] = kj;
    }
    __syncthreads();
}

/* --- passes over a row split between blocks ---------------------------------------------- */

/* One block streams a row at ~20 GB/s (bound by the loads it has in flight), so a pass over
 * the rows of a block of drafts on one block per row used 15 of an H200's 132 SMs. A split
 * pass gives each row RS_SLICES(n) blocks, each over a contiguous slice; the last block of
 * a row to finish (rs_last) combines the slices' partials in slice order. The number of
 * slices depends on the row length only, so a row's sums have one order whatever else is in
 * the launch. Slices are whole RS_CHUNK-entry chunks (the draw's unit), the last one
 * shorter. */
#define RS_THREADS 1024
#define RS_CHUNK 128           /* entries per chunk: a warp's four entries per lane */
#define RS_SLICE_MIN 16384     /* entries per slice at least: a shorter row is one slice */
#define RS_SLICES_MAX 8        /* 16 rows of 8 slices fill an H200's 132 SMs once */
#define RS_ROWS_MAX 16384      /* rows per launch: the counters at the buffer's start */
#define RS_ROWS_WIDE 64        /* rows per launch of a pass whose scratch grows with the row
                                  length (the draw's chunk sums, candidate lists): <= 7 MB */

__host__ __device__ __forceinline__ int rs_slices(int64_t n)
{
    const int64_t s = n / RS_SLICE_MIN;
    return s < 1 ? 1 : s > RS_SLICES_MAX ? RS_SLICES_MAX : (int)s;
}

/* Slice s of S of a row of n entries: [*lo, *hi), possibly empty. */
__host__ __device__ __forceinline__ void rs_slice(int64_t n, int S, int s, int64_t *lo,
                                                  int64_t *hi)
{
    const int64_t chunks = (n + RS_CHUNK - 1) / RS_CHUNK, per = (chunks + S - 1) / S;
    const int64_t a = (int64_t)s * per * RS_CHUNK, b = a + per * RS_CHUNK;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

/* True in the last of a row's S blocks to get here (every thread of every block of the row
 * must call it once); *count is the row's counter, zero before the first block arrives and
 * zero again when the last one returns. What any thread of the row's blocks wrote before the
 * call is visible to the last block after it (read it with __ldcg: L1 is not coherent). */
__device__ __forceinline__ bool rs_last(unsigned *count, int S)
{
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(count, 1u) == (unsigned)S - 1;
        if (last)
            *count = 0;
    }
    __syncthreads();
    if (last)
        __threadfence();
    return last;
}

/* The row's total of one f64 per block (v: the same in every thread of the block), the
 * slices' values added in slice order: true in thread 0 of the row's last block, with the
 * total in *total; part: a slot per block. Every thread must call it. */
__device__ __forceinline__ bool rs_row_sum(double v, double *part, unsigned *count, int S,
                                           double *total)
{
    const int64_t r = blockIdx.x / S;
    if (threadIdx.x == 0)
        part[blockIdx.x] = v;
    if (!rs_last(&count[r], S) || threadIdx.x != 0)
        return false;
    double t = 0;
    for (int j = 0; j < S; j++)
        t += __ldcg(&part[r * S + j]);
    *total = t;
    return true;
}

/* A slice's best entry (cpu_argmax's order); i = INT64_MAX for an empty slice. */
typedef struct rs_best {
    float v;
    int64_t i;
} rs_best;

/* The keys of a list sorted largest first (k of them) that are larger than key. */
__device__ __forceinline__ int rs_count_above(const uint64_t *list, int k, uint64_t key)
{
    int a = 0, b = k;
    while (a < b) {
        const int m = (a + b) >> 1;
        if (list[m] > key)
            a = m + 1;
        else
            b = m;
    }
    return a;
}

/* The k largest of S lists of k distinct keys each, every list sorted largest first (lists:
 * S * k keys, in shared memory), largest first into out[k]: a key's rank in the union is
 * its place in its own list plus the keys above it in every other list (binary searches).
 * Every thread of the block must call it. */
__device__ __forceinline__ void rs_merge_top(const uint64_t *lists, int S, int k, uint64_t *out)
{
    for (int j = threadIdx.x; j < S * k; j += blockDim.x) {
        const int own = j / k;
        const uint64_t key = lists[j];
        int rank = j - own * k;
        for (int o = 0; o < S && rank < k; o++)
            if (o != own)
                rank += rs_count_above(lists + o * k, k, key);
        if (rank < k)
            out[rank] = key;
    }
    __syncthreads();
}

/* The buffer of the split passes on st: the counters of RS_ROWS_MAX rows (*count), then at
 * least bytes of room for partials (*part, 16-byte aligned). One per stream, zero when made,
 * at least RS_SCRATCH_MIN; grows on demand, so not for a stream being captured. Kernels that
 * use the counters must not overlap on the stream (plain launches, not programmatic ones):
 * each leaves them at zero for the next. */
#define RS_SCRATCH_MIN ((size_t)8 << 20) /* the sampler's largest use at 64 rows: ~7 MB */
td_err rs_scratch(cudaStream_t st, size_t bytes, unsigned **count, void **part);

/* Launches the split argmax of rows (<= RS_ROWS_MAX) rows of x [rows][n]: the best entry of
 * each row (cpu_argmax) into best[rows] and, when idx is not NULL, its index into idx[rows].
 * part: room for rows * rs_slices(n) entries; count: the rows' counters (rs_scratch). */
td_err rs_argmax_launch(rs_best *best, int32_t *idx, const float *x, int64_t rows, int64_t n,
                        rs_best *part, unsigned *count, cudaStream_t st);

#endif
