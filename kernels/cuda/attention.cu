/* Attention over a K/V cache (twin of kernels/cpu/attention.c): decode, verify blocks,
 * prefill chunks, GQA, f32/f16 cache, causal/bidirectional/tree masks, sliding windows and
 * the sigmoid output gate, in one kernel whose arithmetic per query is fixed.
 *
 * Reduction order (what makes greedy speculative decoding equal plain decoding): keys are cut
 * into splits of ATT_SPLIT at fixed offsets 0, 128, 256, ... For one query head and one
 * split: the scores are full dot products summed over d in order; the split's max is exact;
 * p = exp(score - max); the split's sum of p is a fixed warp tree; each output value sums
 * p * v over the split's keys in key order. Splits then fold into a running (max, sum,
 * values) in split order (att_fold). A key the query cannot see adds nothing (not even a
 * zero), a split it cannot see is skipped, so a query's result depends only on its own
 * visible keys: bit-identical alone, in a 16-token verify block or in a prefill chunk, and
 * whatever n_kv the caller passes beyond its last visible key.
 *
 * Work layout (does not change the arithmetic): a block takes one kv head, up to ATT_ROWS
 * (query, head) rows of that kv head (GQA: the group's heads share each K/V tile), and
 * either one split, writing a partial that a combine kernel folds (decode and verify: few
 * rows, so splits give the parallelism, flash-decoding style), or every split in order,
 * folding in registers (prefill: rows give the parallelism, no scratch). */
#include <cuda_fp16.h>

#include "kernels/cuda/ops_dev.cuh"

#define ATT_SPLIT 128   /* keys per split: the unit of the fixed order */
#define ATT_KT 16       /* keys per shared-memory tile */
#define ATT_ROWS 16     /* (query, head) rows per block */
#define ATT_MAX_DIM 256 /* largest head_dim */
#define ATT_THREADS 128
#define ATT_NE (ATT_ROWS * ATT_MAX_DIM / ATT_THREADS) /* output values per thread */
#define ATT_SCRATCH_MAX ((size_t)256 << 20) /* above this many bytes of partials: fold in blocks */
#define ATT_COMBINE_BATCH 8 /* partials the combine kernel loads at once */

typedef struct att_args {
    ops_attn a;       /* the caller's description, device pointers */
    int64_t group;    /* query heads per kv head */
    int64_t n_rows;   /* (query, head) rows per kv head: n_q * group */
    int64_t n_split;  /* ceil(n_kv / ATT_SPLIT) */
    float *part;      /* NULL: fold in the block; else [n_split][n_q][n_head][head_dim + 2]
                       * partials: values, then max and sum */
} att_args;

/* The keys this call uses: n_kv, or fewer when the count is read from the device. */
__device__ __forceinline__ int64_t att_n_kv(const ops_attn &a)
{
    if (!a.n_kv_dev)
        return a.n_kv;
    const int64_t n = *a.n_kv_dev;
    return n < a.n_kv ? (n > 0 ? n : 0) : a.n_kv;
}

/* Splits holding those keys (the launch may have more: they are empty). */
__device__ __forceinline__ int64_t att_n_split(const att_args &p, int64_t n_kv)
{
    const int64_t n = (n_kv + ATT_SPLIT - 1) / ATT_SPLIT;
    return n < p.n_split ? n : p.n_split;
}

/* Whether query t at position qp sees key i (cpu_attention's key_visible). */
__device__ __forceinline__ bool att_visible(const ops_attn &a, int64_t t, int32_t qp, int64_t i)
{
    const int64_t d = (int64_t)qp - __ldg(a.k_pos + i);
    if (a.mask == OPS_MASK_BIDIRECTIONAL)
        return a.window <= 0 || llabs(d) < a.window;
    if (a.mask == OPS_MASK_TREE) {
        const int64_t first = a.n_kv - a.n_tree;
        if (i >= first) {
            const int64_t j = i - first, words = (a.n_tree + 63) / 64;
            if (!((a.tree_bits[t * words + j / 64] >> (j % 64)) & 1))
                return false;
            return a.window <= 0 || d < a.window;
        }
    }
    return d >= 0 && (a.window <= 0 || d < a.window);
}

/* K, V, q, positions and the gate are only read while the kernel runs: they load through the
 * read-only path (ld.global.nc). The tile loops around these loads are unrolled by 8, so a
 * thread has eight loads in flight where it waited a full round trip per element before
 * storing it to shared memory (the H200 profile: 167 us per decode layer at 1K). */
__device__ __forceinline__ float att_load(const ops_attn &a, const void *base, int64_t off)
{
    if (a.kv_type == TD_F16)
        return __half2float(__ushort_as_half(__ldg((const unsigned short *)base + off)));
    return __ldg((const float *)base + off);
}

/* Folds a split (max ms, sum ls) into the running (M, L) and gives the factors for the
 * running values (fa) and the split's values (fb): values = values*fa + split*fb. False for
 * a split with no visible key: it changes nothing. The one definition of the fold order. */
__device__ __forceinline__ bool att_fold(float &M, float &L, float ms, float ls, float &fa,
                                         float &fb)
{
    if (ms == -INFINITY)
        return false;
    const float Mn = fmaxf(M, ms);
    fa = M == -INFINITY ? 0.0f : expf(M - Mn);
    fb = expf(ms - Mn);
    L = fmaf(ls, fb, __fmul_rn(L, fa));
    M = Mn;
    return true;
}

__device__ __forceinline__ float att_apply(float A, float acc, float fa, float fb)
{
    return fmaf(acc, fb, __fmul_rn(A, fa));
}

/* out value from the folded values and sum, with the output gate. */
__device__ __forceinline__ void att_write(const ops_attn &a, int64_t t, int64_t h, int64_t d,
                                          float A, float L)
{
    float o = L > 0 ? A / L : 0.0f;
    if (a.gate)
        o = __fmul_rn(o, dev_sigmoid(__ldg(a.gate + t * a.gate_tok_stride + h * a.gate_head_stride + d)));
    a.out[(t * a.n_head + h) * a.head_dim + d] = o;
}

/* grid: x = row tile, y = kv head, z = split (one split per block when p.part != NULL).
 * HD: head_dim known at compile time (0: read from p), so the element index arithmetic
 * (e / D, e % D on every load and output value) is shifts instead of 64-bit divisions; the
 * floating-point arithmetic is the same for every HD. */
template <int HD> __global__ void __launch_bounds__(ATT_THREADS) att_kernel(att_args p)
{
    const ops_attn &a = p.a;
    __shared__ float qs[ATT_ROWS][ATT_MAX_DIM];     /* this block's query rows */
    __shared__ float kv[ATT_KT][ATT_MAX_DIM + 1];   /* a K or V tile; +1 spreads the banks */
    __shared__ float sc[ATT_ROWS][ATT_SPLIT];       /* scores, then p, of the current split */
    __shared__ float row_m[ATT_ROWS], row_l[ATT_ROWS]; /* the split's max and sum */
    __shared__ float run_m[ATT_ROWS], run_l[ATT_ROWS]; /* folded so far (in-block folding) */
    __shared__ float fac_a[ATT_ROWS], fac_b[ATT_ROWS];
    __shared__ int row_ok[ATT_ROWS];                /* 0 when the split changes nothing */
    __shared__ int64_t row_t[ATT_ROWS], row_h[ATT_ROWS];
    __shared__ int32_t row_qp[ATT_ROWS];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t D = HD > 0 ? (int64_t)HD : a.head_dim, g = blockIdx.y;
    const int64_t n_kv = att_n_kv(a);
    const int64_t r0 = (int64_t)blockIdx.x * ATT_ROWS;
    const int nr = (int)(p.n_rows - r0 < ATT_ROWS ? p.n_rows - r0 : ATT_ROWS);

    if (tid < ATT_ROWS) {
        const int64_t rf = r0 + (tid < nr ? tid : 0);
        row_t[tid] = rf / p.group;
        row_h[tid] = g * p.group + rf % p.group;
        row_qp[tid] = a.q_pos[row_t[tid]];
        run_m[tid] = -INFINITY;
        run_l[tid] = 0;
    }
    __syncthreads();
    if (p.part) {
        /* A split no row can see (the keys past the queries when a recorded step scans the
         * whole cache) hands the combine an empty partial at once: it folds nothing. */
        const int64_t k0 = (int64_t)blockIdx.z * ATT_SPLIT;
        const int nk = (int)(n_kv - k0 < ATT_SPLIT ? n_kv - k0 : ATT_SPLIT);
        int seen = 0;
        for (int e = tid; e < nr * nk && !seen; e += ATT_THREADS)
            seen = att_visible(a, row_t[e / nk], row_qp[e / nk], k0 + e % nk);
        if (!__syncthreads_or(seen)) {
            if (tid < nr) {
                float *pr = p.part + (((int64_t)blockIdx.z * a.n_q + row_t[tid]) * a.n_head +
                                      row_h[tid]) * (D + 2);
                pr[D] = -INFINITY;
                pr[D + 1] = 0;
            }
            return;
        }
    }
#pragma unroll 8
    for (int64_t e = tid; e < (int64_t)nr * D; e += ATT_THREADS) {
        const int r = (int)(e / D);
        const int64_t d = e % D;
        qs[r][d] = __ldg(a.q + row_t[r] * a.q_tok_stride + row_h[r] * a.q_head_stride + d);
    }

    float A[ATT_NE]; /* folded values of element tid + j*ATT_THREADS = (row, d) */
#pragma unroll
    for (int j = 0; j < ATT_NE; j++)
        A[j] = 0;

    const int64_t s_lo = p.part ? blockIdx.z : 0;
    const int64_t s_hi = p.part ? blockIdx.z + 1 : att_n_split(p, n_kv);
    for (int64_t s = s_lo; s < s_hi; s++) {
        const int64_t k0 = s * ATT_SPLIT;
        const int nk = (int)(n_kv - k0 < ATT_SPLIT ? n_kv - k0 : ATT_SPLIT);

        /* scores: one thread per (row, key) dot product, summed over d in order. A tile no
         * row can see is not loaded (causal prefill, sliding windows): same arithmetic. */
        for (int t0 = 0; t0 < nk; t0 += ATT_KT) {
            const int tk = nk - t0 < ATT_KT ? nk - t0 : ATT_KT;
            int seen = 0;
            for (int e = tid; e < ATT_ROWS * ATT_KT; e += ATT_THREADS) {
                const int r = e / ATT_KT, kk = e % ATT_KT;
                const bool vis = r < nr && kk < tk &&
                                 att_visible(a, row_t[r], row_qp[r], k0 + t0 + kk);
                sc[r][t0 + kk] = vis ? 0.0f : -INFINITY;
                seen |= vis;
            }
            /* also the barrier: kv is free; on the first tile: qs is loaded */
            if (!__syncthreads_or(seen))
                continue;
#pragma unroll 8
            for (int64_t e = tid; e < (int64_t)tk * D; e += ATT_THREADS) {
                const int kk = (int)(e / D);
                const int64_t d = e % D;
                kv[kk][d] = att_load(a, a.k, (k0 + t0 + kk) * a.kv_tok_stride +
                                                 g * a.kv_head_stride + d);
            }
            __syncthreads();
            for (int e = tid; e < ATT_ROWS * ATT_KT; e += ATT_THREADS) {
                const int r = e / ATT_KT, kk = e % ATT_KT;
                if (r >= nr || kk >= tk || sc[r][t0 + kk] == -INFINITY)
                    continue;
                float dot = 0;
                for (int64_t d = 0; d < D; d++)
                    dot = fmaf(qs[r][d], kv[kk][d], dot);
                sc[r][t0 + kk] = __fmul_rn(a.scale, dot);
            }
        }
        __syncthreads();

        /* per row (a warp each): exact max, p = exp(score - max), sum of p in a fixed tree */
        for (int r = warp; r < nr; r += ATT_THREADS / 32) {
            float m = -INFINITY;
            for (int c = lane; c < nk; c += 32)
                m = fmaxf(m, sc[r][c]);
            m = dev_warp_max(m);
            float l = 0;
            for (int c = lane; c < nk; c += 32) {
                const float x = sc[r][c];
                const float pv = x == -INFINITY ? 0.0f : expf(x - m);
                sc[r][c] = pv;
                l += pv;
            }
            l = dev_warp_sum(l);
            if (lane == 0) {
                row_m[r] = m;
                row_l[r] = l;
            }
        }
        __syncthreads();

        /* the split's values: each (row, d) sums p * v over the keys in order; a tile whose
         * p are all zero adds nothing and is not loaded */
        float acc[ATT_NE];
#pragma unroll
        for (int j = 0; j < ATT_NE; j++)
            acc[j] = 0;
        for (int t0 = 0; t0 < nk; t0 += ATT_KT) {
            const int tk = nk - t0 < ATT_KT ? nk - t0 : ATT_KT;
            int live = 0;
            for (int e = tid; e < ATT_ROWS * ATT_KT; e += ATT_THREADS) {
                const int r = e / ATT_KT, kk = e % ATT_KT;
                live |= r < nr && kk < tk && sc[r][t0 + kk] != 0.0f;
            }
            if (!__syncthreads_or(live)) /* also the barrier: kv is free */
                continue;
#pragma unroll 8
            for (int64_t e = tid; e < (int64_t)tk * D; e += ATT_THREADS) {
                const int kk = (int)(e / D);
                const int64_t d = e % D;
                kv[kk][d] = att_load(a, a.v, (k0 + t0 + kk) * a.kv_tok_stride +
                                                 g * a.kv_head_stride + d);
            }
            __syncthreads();
#pragma unroll
            for (int j = 0; j < ATT_NE; j++) {
                const int64_t e = tid + j * ATT_THREADS;
                if (e >= (int64_t)nr * D)
                    break;
                const int r = (int)(e / D);
                const int64_t d = e % D;
                float v = acc[j];
                for (int kk = 0; kk < tk; kk++) {
                    const float pv = sc[r][t0 + kk];
                    if (pv != 0.0f) /* an invisible key adds nothing, even beside a NaN */
                        v = fmaf(pv, kv[kk][d], v);
                }
                acc[j] = v;
            }
        }

        if (p.part) {
            /* one split per block: hand the partial to the combine kernel */
#pragma unroll
            for (int j = 0; j < ATT_NE; j++) {
                const int64_t e = tid + j * ATT_THREADS;
                if (e >= (int64_t)nr * D)
                    break;
                const int r = (int)(e / D);
                const int64_t d = e % D;
                float *pr = p.part + ((s * a.n_q + row_t[r]) * a.n_head + row_h[r]) * (D + 2);
                pr[d] = acc[j];
            }
            if (tid < nr) {
                float *pr = p.part + ((s * a.n_q + row_t[tid]) * a.n_head + row_h[tid]) * (D + 2);
                pr[D] = row_m[tid];
                pr[D + 1] = row_l[tid];
            }
            continue;
        }

        /* fold this split into the running values */
        if (tid < nr) {
            float M = run_m[tid], L = run_l[tid], fa = 1, fb = 0;
            row_ok[tid] = att_fold(M, L, row_m[tid], row_l[tid], fa, fb);
            run_m[tid] = M;
            run_l[tid] = L;
            fac_a[tid] = fa;
            fac_b[tid] = fb;
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < ATT_NE; j++) {
            const int64_t e = tid + j * ATT_THREADS;
            if (e >= (int64_t)nr * D)
                break;
            const int r = (int)(e / D);
            if (row_ok[r])
                A[j] = att_apply(A[j], acc[j], fac_a[r], fac_b[r]);
        }
    }

    if (p.part)
        return;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < ATT_NE; j++) {
        const int64_t e = tid + j * ATT_THREADS;
        if (e >= (int64_t)nr * D)
            break;
        const int r = (int)(e / D);
        att_write(a, row_t[r], row_h[r], e % D, A[j], run_l[r]);
    }
}

/* Folds the partials of one (query, head) row in split order: block x = t * n_head + h,
 * thread d. Every thread folds the same (max, sum) the in-block path would. */
__global__ void __launch_bounds__(ATT_MAX_DIM) att_combine_kernel(att_args p)
{
    const ops_attn &a = p.a;
    const int64_t D = a.head_dim, row = blockIdx.x, d = threadIdx.x;
    const int64_t t = row / a.n_head, h = row % a.n_head;
    if (d >= D)
        return;
    float M = -INFINITY, L = 0, A = 0;
    const int64_t n_split = att_n_split(p, att_n_kv(a));
    /* ATT_COMBINE_BATCH partials loaded before any is folded: the fold order is the same,
     * but the loads overlap (one round trip per split made a 32K decode's 257 splits cost
     * ~70 us per layer) */
    for (int64_t s0 = 0; s0 < n_split; s0 += ATT_COMBINE_BATCH) {
        float pm[ATT_COMBINE_BATCH], pl[ATT_COMBINE_BATCH], pv[ATT_COMBINE_BATCH];
#pragma unroll
        for (int u = 0; u < ATT_COMBINE_BATCH; u++) {
            const float *pr = p.part + ((s0 + u) * a.n_q * a.n_head + row) * (D + 2);
            const bool in = s0 + u < n_split;
            pm[u] = in ? pr[D] : -INFINITY;
            pl[u] = in ? pr[D + 1] : 0.0f;
            pv[u] = in ? pr[d] : 0.0f; /* read even when unused below: never folded then */
        }
#pragma unroll
        for (int u = 0; u < ATT_COMBINE_BATCH; u++) {
            float fa, fb;
            if (att_fold(M, L, pm[u], pl[u], fa, fb))
                A = att_apply(A, pv[u], fa, fb);
        }
    }
    att_write(a, t, h, d, A, L);
}

extern "C" td_err cuda_attention(const ops_attn *a, ops_stream st)
{
    TD_ASSERT(a != NULL && a->q != NULL && a->k != NULL && a->v != NULL && a->out != NULL);
    TD_ASSERT(a->q_pos != NULL && (a->n_kv == 0 || a->k_pos != NULL));
    TD_ASSERT(a->n_head >= 1 && a->n_head_kv >= 1 && a->n_head % a->n_head_kv == 0);
    TD_ASSERT(a->head_dim >= 1 && a->n_q >= 0 && a->n_kv >= 0);
    TD_ASSERT(a->kv_type == TD_F32 || a->kv_type == TD_F16);
    TD_ASSERT(a->mask != OPS_MASK_TREE ||
              (a->tree_bits != NULL && a->n_tree >= 0 && a->n_tree <= a->n_kv));
    TD_ASSERT(a->n_kv_dev == NULL || a->mask != OPS_MASK_TREE);
    if (a->head_dim > ATT_MAX_DIM)
        return err_set(TD_ENOTSUP, "attention with head_dim %lld: the GPU handles up to %d",
                       (long long)a->head_dim, ATT_MAX_DIM);
    if (a->n_q == 0)
        return TD_OK;

    att_args p;
    p.a = *a;
    p.group = a->n_head / a->n_head_kv;
    p.n_rows = a->n_q * p.group;
    p.n_split = (a->n_kv + ATT_SPLIT - 1) / ATT_SPLIT;
    p.part = NULL;
    const long long tiles = (p.n_rows + ATT_ROWS - 1) / ATT_ROWS;
    if (tiles > INT32_MAX || a->n_head_kv > 65535 || p.n_split > 65535 ||
        a->n_q * a->n_head > INT32_MAX)
        return err_set(TD_ENOTSUP, "attention of %lld queries x %lld heads over %lld keys",
                       (long long)a->n_q, (long long)a->n_head, (long long)a->n_kv);

    /* One split per block when rows alone leave the GPU idle (decode, verify) and the
     * partials are small; else every block folds all its splits. Same results either way. */
    int dev = 0, sms = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const long long row_blocks = tiles * a->n_head_kv;
    const size_t part_bytes =
        (size_t)p.n_split * (size_t)(a->n_q * a->n_head) * (size_t)(a->head_dim + 2) * sizeof(float);
    const bool split = p.n_split > 1 && row_blocks < 2LL * sms && part_bytes <= ATT_SCRATCH_MAX;
    if (split)
        TD_TRY(dev_scratch_alloc((void **)&p.part, part_bytes, st, "attention"));

    dim3 grid((unsigned)tiles, (unsigned)a->n_head_kv, split ? (unsigned)p.n_split : 1u);
    switch (a->head_dim) {
    case 256:
        att_kernel<256><<<grid, ATT_THREADS, 0, st>>>(p);
        break;
    case 128:
        att_kernel<128><<<grid, ATT_THREADS, 0, st>>>(p);
        break;
    case 64:
        att_kernel<64><<<grid, ATT_THREADS, 0, st>>>(p);
        break;
    default:
        att_kernel<0><<<grid, ATT_THREADS, 0, st>>>(p);
        break;
    }
    cuda_launch_note(1);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && split) {
        unsigned threads = (unsigned)((a->head_dim + 31) / 32 * 32);
        att_combine_kernel<<<(unsigned)(a->n_q * a->n_head), threads, 0, st>>>(p);
        cuda_launch_note(1);
        e = cudaGetLastError();
    }
    dev_scratch_free(p.part, st);
    if (e != cudaSuccess)
        return err_set(TD_ECUDA, "attention launch: %s", cudaGetErrorString(e));
    return TD_OK;
}
