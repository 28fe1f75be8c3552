/* Attention over a K/V cache (twin of kernels/cpu/attention.c): decode, verify blocks,
 * prefill chunks, GQA, f32/f16 cache, causal/bidirectional/tree masks, sliding windows and
 * the sigmoid output gate, in one kernel whose arithmetic per query is fixed.
 *
 * Reduction order (what makes greedy speculative decoding equal plain decoding): keys are cut
 * into splits of ATT_SPLIT at fixed offsets 0, 128, 256, ... For one query head and one
 * split: the scores are full dot products summed over d in order; the split's max is exact;
 * p = exp(score - max); the split's sum of p is a fixed warp tree; each output value sums
 * p * v over the split's keys in key order. Splits then fold into a running (max, sum,
 * values) in split order (att_fold; the tensor-core kernel of f16 caches in chunks of
 * splits under TANDEM_ATT_CHUNKS, see there). A key the query cannot see adds nothing (not
 * even a zero), a split it cannot see is skipped, so a query's result depends only on its own
 * visible keys: bit-identical alone, in a 16-token verify block or in a prefill chunk, and
 * whatever n_kv the caller passes beyond its last visible key.
 *
 * Work layout (does not change the arithmetic): a block takes one kv head, up to ATT_ROWS
 * (query, head) rows of that kv head (GQA: the group's heads share each K/V tile), and
 * either one split, writing a partial that a combine kernel folds (decode and verify: few
 * rows, so splits give the parallelism, flash-decoding style), or every split in order,
 * folding in registers (prefill: rows give the parallelism, no scratch).
 *
 * Which kernel runs a call depends only on head_dim, the cache type and layout and the
 * device, so every call of a model takes the same one: an f16 cache of head_dim 128 or 256
 * (the 27B target's) the tensor-core kernel ath_kernel, which keeps the split structure and
 * the fold but sums the dot products and values on the tensor cores in another fixed order;
 * bidirectional blocks over an f32 cache (the DFlash drafter's) atm_kernel; the rest the
 * staged kernel ats_kernel, or the generic att_kernel. */
#include <cuda_fp16.h>
#include <string.h>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_dev.cuh"
#include "kernels/cuda/stream_buf.cuh"

#define ATT_SPLIT 128   /* keys per split: the unit of the fixed order */
#define ATT_KT 16       /* keys per shared-memory tile */
#define ATT_ROWS 16     /* (query, head) rows per block */
#define ATT_MAX_DIM 256 /* largest head_dim */
#define ATT_THREADS 128
#define ATT_NE (ATT_ROWS * ATT_MAX_DIM / ATT_THREADS) /* output values per thread */
#define ATT_SCRATCH_MAX ((size_t)256 << 20) /* above this many bytes of partials: fold in blocks */
#define ATT_COMBINE_D 64       /* head values per combine block (one per folding thread) */
#define ATT_COMBINE_T 256      /* threads per combine block (all copy, ATT_COMBINE_D fold) */
#define ATT_COMBINE_ROUND 512  /* splits the combine stages in shared memory at once, at most */
/* combine blocks an SM holds at once (the registers kept to that): a 1K verify's 1536 blocks
 * in two waves of an H100 instead of three; sm_86..89 run 1536 threads an SM, sm_90 2048 */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 860 && __CUDA_ARCH__ < 900
#define ATT_COMBINE_PER_SM 6
#else
#define ATT_COMBINE_PER_SM 8
#endif

typedef struct att_args {
    ops_attn a;       /* the caller's description, device pointers */
    int64_t group;    /* query heads per kv head */
    int64_t n_rows;   /* (query, head) rows per kv head: n_q * group */
    int64_t n_split;  /* ceil(n_kv / ATT_SPLIT) */
    float *part;      /* NULL: fold in the block; else [n_split][n_q][n_head][head_dim + 2]
                       * partials (one per split, or per chunk: att_chunked): values, then
                       * max and sum */
    int round;        /* the combine kernel's splits per round (its shared memory holds them) */
    int chunk;        /* splits per chunk of the fold order (1: splits fold one by one) */
    int64_t chunk_from; /* partials per chunk once there are this many chunks (else per split) */
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

/* Chunks of p.chunk splits holding n_split splits. */
__device__ __forceinline__ int64_t att_n_chunk(const att_args &p, int64_t n_split)
{
    return (n_split + p.chunk - 1) / p.chunk;
}

/* Whether a call over n_split splits hands the combine one partial per chunk (folded in the
 * block) rather than one per split. Decided on the device, from the keys in use, by the
 * attention kernel and the combine alike; the bits are the same either way. */
__device__ __forceinline__ bool att_chunked(const att_args &p, int64_t n_split)
{
    return p.chunk > 1 && att_n_chunk(p, n_split) >= p.chunk_from;
}

/* Whether query t at position qp sees key i at position kp (cpu_attention's key_visible). */
__device__ __forceinline__ bool att_visible_at(const ops_attn &a, int64_t t, int32_t qp,
                                               int64_t i, int32_t kp)
{
    const int64_t d = (int64_t)qp - kp;
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

/* The same, the key's position read from a.k_pos. */
__device__ __forceinline__ bool att_visible(const ops_attn &a, int64_t t, int32_t qp, int64_t i)
{
    return att_visible_at(a, t, qp, i, __ldg(a.k_pos + i));
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

/* A running value (or sum) A with a split's acc folded in: A*fa + acc*fb. */
__device__ __forceinline__ float att_apply(float A, float acc, float fa, float fb)
{
    return fmaf(acc, fb, __fmul_rn(A, fa));
}

/* The factors that fold a split of max ms into the running max M: fa for the running values,
 * fb for the split's; M becomes the new max. False for a split with no visible key: it
 * changes nothing. */
__device__ __forceinline__ bool att_factors(float &M, float ms, float &fa, float &fb)
{
    if (ms == -INFINITY)
        return false;
    const float Mn = fmaxf(M, ms);
    fa = M == -INFINITY ? 0.0f : expf(M - Mn);
    fb = expf(ms - Mn);
    M = Mn;
    return true;
}

/* Folds a split (max ms, sum ls) into the running (M, L) and gives the factors for the
 * running values (fa) and the split's values (fb): values = values*fa + split*fb. False for
 * a split with no visible key: it changes nothing. With att_factors and att_apply, the one
 * definition of the fold order (the combine kernel computes the same factors apart). */
__device__ __forceinline__ bool att_fold(float &M, float &L, float ms, float ls, float &fa,
                                         float &fb)
{
    if (!att_factors(M, ms, fa, fb))
        return false;
    L = att_apply(L, ls, fa, fb);
    return true;
}

/* One row of a split (a warp): its exact max, p = exp(score - max) of key c handed to
 * put(c, p) (an invisible key's -inf gives 0), and the sum of p in a fixed tree; lane 0
 * stores max and sum. The one definition of a split's softmax. */
template <typename Put>
__device__ __forceinline__ void att_row_softmax_put(const float *row, int nk, int lane,
                                                    float *m_out, float *l_out, Put put)
{
    float m = -INFINITY;
    for (int c = lane; c < nk; c += 32)
        m = fmaxf(m, row[c]);
    m = dev_warp_max(m);
    float l = 0;
    for (int c = lane; c < nk; c += 32) {
        const float x = row[c];
        const float pv = x == -INFINITY ? 0.0f : expf(x - m);
        put(c, pv);
        l += pv;
    }
    l = dev_warp_sum(l);
    if (lane == 0) {
        *m_out = m;
        *l_out = l;
    }
}

/* The same with p of key c stored at p_out[c * p_stride] (in place of the scores with row,
 * 1). */
__device__ __forceinline__ void att_row_softmax(const float *row, int nk, int lane, float *m_out,
                                                float *l_out, float *p_out, int p_stride)
{
    att_row_softmax_put(row, nk, lane, m_out, l_out,
                        [=](int c, float pv) { p_out[c * p_stride] = pv; });
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
template <int HD>
__global__ void __launch_bounds__(ATT_THREADS) att_kernel(bool early, att_args p)
{
    pdl_enter(early);
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

        for (int r = warp; r < nr; r += ATT_THREADS / 32)
            att_row_softmax(sc[r], nk, lane, row_m + r, row_l + r, sc[r], 1);
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

/* ---------------------------------------------------------------------------------------
 * Staged kernel (head_dim 64, 128 or 256; 16-byte aligned cache rows): a split's keys and
 * values are copied whole into shared memory with cp.async (every thread issues 16-byte
 * copies, so a block has its whole split in flight at once: the generic kernel above waited
 * one memory round trip per 16-key tile and took ~160 us per 1K-key decode layer on an
 * H200). The fixed order per query (ATT_SPLIT splits, att_fold) is the generic kernel's; a
 * score is the sum over the first half of d in order plus the sum over the second half; a
 * split's value sums p * v over each 32-key chunk in key order, then adds the four chunk
 * sums in chunk order (four warps share a split's keys).
 * Which kernel runs depends only on head_dim, the cache type and layout and the device, so
 * a model's decode steps, verify blocks and prefill chunks all take the same one.
 * ------------------------------------------------------------------------------------- */

#define ATS_THREADS 256 /* 2 threads per key of a split (one per half of d) */

template <int HD, typename KT> struct ats_geo {
    static constexpr int EB = (int)sizeof(KT);  /* bytes per cache element */
    static constexpr int CH = HD * EB / 16;     /* 16-byte pieces per key row */
    static constexpr int ROWB = HD * EB + 16;   /* bytes per staged key row: +16 spreads the
                                                 * banks of the score phase (lane = key) */
    static constexpr int EL = HD / 32;          /* values per lane in the value phase */
};

/* f32 values per key in the value phase's copy of p: the block's rows, padded so that a
 * row group's values are 16-byte aligned and a softmax warp's stores spread the banks */
template <int ROWS> __host__ __device__ constexpr int ats_pt() { return ROWS + 4; }

/* Dynamic shared memory: qs [ROWS][HD] f32 query rows, sc [ROWS][ATT_SPLIT] f32
 * (second-half dot products, then scores), pt [ATT_SPLIT][ats_pt] p by key, kb
 * [ATT_SPLIT][ROWB] keys, vb values (kb itself when the layout has no room for both: keys
 * are dead once scored). */
template <int HD, int ROWS> __host__ __device__ constexpr size_t ats_fixed_bytes()
{
    return (size_t)ROWS * HD * 4 + (size_t)ROWS * ATT_SPLIT * 4 +
           (size_t)ATT_SPLIT * ats_pt<ROWS>() * 4;
}
template <int HD, typename KT> __host__ __device__ constexpr size_t ats_kv_bytes()
{
    return (size_t)ATT_SPLIT * ats_geo<HD, KT>::ROWB;
}

__device__ __forceinline__ void ats_cp16(void *dst, const void *src)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void ats_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void ats_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Copies keys k0 .. k0+nk-1 of kv head g of cache base into buf (one commit group);
 * WHOLE: a whole split's copies unrolled (immediate offsets; registers the staged kernel has
 * not to spare). */
template <int HD, typename KT, bool WHOLE = false>
__device__ __forceinline__ void ats_stage(unsigned char *buf, const ops_attn &a, const void *base,
                                          int64_t g, int64_t k0, int nk)
{
    typedef ats_geo<HD, KT> G;
    static_assert(ATS_THREADS % G::CH == 0, "a thread copies the same piece of every row it copies");
    /* thread t copies piece t % CH of keys t / CH, t / CH + KS, ...: one address step each */
    constexpr int KS = ATS_THREADS / G::CH;
    const int c = threadIdx.x % G::CH;
    int kk = threadIdx.x / G::CH;
    const int64_t step = (int64_t)KS * a.kv_tok_stride * G::EB;
    const unsigned char *src = (const unsigned char *)base +
                               ((k0 + kk) * a.kv_tok_stride + g * a.kv_head_stride) * G::EB + c * 16;
    unsigned char *dst = buf + kk * G::ROWB + c * 16;
    static_assert(ATT_SPLIT % KS == 0, "a whole split: the same copies in every thread");
    if (WHOLE && nk == ATT_SPLIT) {
#pragma unroll
        for (int i = 0; i < ATT_SPLIT / KS; i++)
            ats_cp16(dst + i * KS * G::ROWB, src + i * step);
    } else {
        for (; kk < nk; kk += KS, src += step, dst += KS * G::ROWB)
            ats_cp16(dst, src);
    }
    ats_commit();
}

/* N (1, 2, 4 or 8) consecutive cache values at row (aligned to their size) as f32, read as
 * one or two vector loads */
template <typename KT, int N> __device__ __forceinline__ void ats_get(float *out, const unsigned char *row)
{
    if constexpr (sizeof(KT) == 2 && N == 1) {
        out[0] = __half2float(*(const __half *)row);
    } else if constexpr (sizeof(KT) == 2) {
        uint32_t w[N / 2];
        if constexpr (N == 8) {
            const uint4 u = *(const uint4 *)row;
            w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
        } else if constexpr (N == 4) {
            const uint2 u = *(const uint2 *)row;
            w[0] = u.x, w[1] = u.y;
        } else {
            w[0] = *(const uint32_t *)row;
        }
#pragma unroll
        for (int i = 0; i < N / 2; i++) {
            __half2 h;
            memcpy(&h, &w[i], 4);
            const float2 f = __half22float2(h);
            out[2 * i] = f.x, out[2 * i + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < N / 4; i++) {
            const float4 v = ((const float4 *)row)[i];
            out[4 * i] = v.x, out[4 * i + 1] = v.y, out[4 * i + 2] = v.z, out[4 * i + 3] = v.w;
        }
        if constexpr (N == 1) {
            out[0] = *(const float *)row;
        } else if constexpr (N % 4 != 0) {
            const float2 v = *(const float2 *)(row + (N / 4) * 16);
            out[N - 2] = v.x, out[N - 1] = v.y;
        }
    }
}

/* grid: x = row tile, y = kv head, z = first split (FOLD false: strided by gridDim.z, one
 * partial per split into p.part; FOLD true: every split in order, folded in registers).
 * Two blocks per SM: registers capped at 128 (uncapped the kernel took 200, one block per
 * SM, and a 5000-key decode ran 1.2 waves: 39 us); the split variant has no fold registers. */
template <int HD, typename KT, bool FOLD, int ROWS>
__global__ void __launch_bounds__(ATS_THREADS, 2) ats_kernel(bool early, att_args p, int kv_sep)
{
    pdl_enter(early);
    typedef ats_geo<HD, KT> G;
    static_assert(ats_kv_bytes<HD, KT>() >= (size_t)4 * ROWS * HD * 4,
                  "the key buffer holds the four chunk sums of the value phase");
    static_assert(ATT_SPLIT == 128 && (ROWS == 2 || ROWS == 4 || ROWS == 8 || ROWS == 16) &&
                      ROWS <= ATT_ROWS,
                  "the value phase is 4 key chunks x (2 row groups, or 2 halves of d)");
    const ops_attn &a = p.a;
    extern __shared__ __align__(16) unsigned char ats_smem[];
    float (*qs)[HD] = (float (*)[HD])ats_smem;
    float (*sc)[ATT_SPLIT] = (float (*)[ATT_SPLIT])(ats_smem + (size_t)ROWS * HD * 4);
    constexpr int PT = ats_pt<ROWS>();
    float *pt = (float *)(ats_smem + (size_t)ROWS * HD * 4 + (size_t)ROWS * ATT_SPLIT * 4);
    unsigned char *kb = ats_smem + ats_fixed_bytes<HD, ROWS>();
    unsigned char *vb = kv_sep ? kb + ats_kv_bytes<HD, KT>() : kb;
    __shared__ uint32_t vis[ATT_SPLIT];                /* bit r: row r sees the key */
    __shared__ float row_m[ATT_ROWS], row_l[ATT_ROWS]; /* the split's max and sum */
    __shared__ float run_m[ATT_ROWS], run_l[ATT_ROWS]; /* folded so far (in-block folding) */
    __shared__ float fac_a[ATT_ROWS], fac_b[ATT_ROWS];
    __shared__ int row_ok[ATT_ROWS];
    __shared__ int64_t row_t[ATT_ROWS], row_h[ATT_ROWS];
    __shared__ int32_t row_qp[ATT_ROWS];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t g = blockIdx.y, n_kv = att_n_kv(a);
    const int64_t r0 = (int64_t)blockIdx.x * ROWS;
    const int nr = (int)(p.n_rows - r0 < ROWS ? p.n_rows - r0 : ROWS);
    const int64_t n_split = att_n_split(p, n_kv);

    if (tid < ATT_ROWS) {
        const int64_t rf = r0 + (tid < nr ? tid : 0);
        row_t[tid] = rf / p.group;
        row_h[tid] = g * p.group + rf % p.group;
        row_qp[tid] = a.q_pos[row_t[tid]];
        run_m[tid] = -INFINITY;
        run_l[tid] = 0;
    }
    bool q_in = false; /* qs holds the query rows (loaded once the first copies are out) */

    /* value phase ownership: rows warp and warp + 8, values lane*EL .. lane*EL + EL-1 */
    const int vr0 = warp, vr1 = warp + 8, d0 = lane * G::EL;
    constexpr int AN = FOLD ? G::EL : 1; /* folded values (in-block folding only) */
    float A0[AN], A1[AN];
#pragma unroll
    for (int j = 0; j < AN; j++)
        A0[j] = A1[j] = 0;

    const int64_t s_lo = FOLD ? 0 : blockIdx.z, s_step = FOLD ? 1 : gridDim.z;
    for (int64_t s = s_lo; s < n_split; s += s_step) {
        const int64_t k0 = s * ATT_SPLIT;
        const int nk = (int)(n_kv - k0 < ATT_SPLIT ? n_kv - k0 : ATT_SPLIT);

        /* which rows see which keys; a split no row sees is not loaded */
        __syncthreads(); /* the previous split's buffers and vis are free */
        uint32_t seen = 0;
        if (tid < ATT_SPLIT) {
            uint32_t m = 0;
            if (tid < nk)
                for (int r = 0; r < nr; r++)
                    m |= (uint32_t)att_visible(a, row_t[r], row_qp[r], k0 + tid) << r;
            vis[tid] = m;
            seen = m;
        }
        if (!__syncthreads_or(seen != 0)) {
            if (!FOLD && tid < nr) {
                float *pr = p.part + ((s * a.n_q + row_t[tid]) * a.n_head + row_h[tid]) * (HD + 2);
                pr[HD] = -INFINITY;
                pr[HD + 1] = 0;
            }
            continue;
        }
        ats_stage<HD, KT>(kb, a, a.k, g, k0, nk);
        if (kv_sep)
            ats_stage<HD, KT>(vb, a, a.v, g, k0, nk);
        if (!q_in) {
            /* all loads of a thread issued before any is stored: one round trip */
            constexpr int QN = (ROWS * HD + ATS_THREADS - 1) / ATS_THREADS;
            float qv[QN];
#pragma unroll
            for (int u = 0; u < QN; u++) {
                const int e = tid + u * ATS_THREADS, r = e / HD, d = e % HD;
                qv[u] = r < nr ? __ldg(a.q + row_t[r] * a.q_tok_stride +
                                       row_h[r] * a.q_head_stride + d)
                               : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < QN; u++) {
                const int e = tid + u * ATS_THREADS;
                if (ROWS * HD % ATS_THREADS == 0 || e < ROWS * HD)
                    qs[e / HD][e % HD] = qv[u];
            }
            q_in = true;
        }
        if (kv_sep)
            ats_wait<1>();
        else
            ats_wait<0>();
        __syncthreads(); /* the keys (and on the first split the query rows) are in */

        /* scores: thread (row group rg, half hh, keys kt + j * NKT) sums q . k over its half
         * of d in order, for RT rows and KP keys (ROWS 16: 2 keys x 8 rows, each query
         * value loaded serves two keys; else 1 key x ROWS); a warp has one row group and
         * half, its lanes consecutive keys */
        {
            constexpr int KP = ROWS == 16 ? 2 : 1;     /* keys per thread */
            constexpr int RT = ROWS / KP;              /* rows per thread */
            constexpr int NKT = ATT_SPLIT / KP;        /* threads per (row group, half) */
            constexpr int PE = 16 / G::EB;             /* values per 16-byte piece */
            static_assert(2 * NKT * (ROWS / RT) == ATS_THREADS, "one thread per share");
            const int kt = tid % NKT, hh = (tid / NKT) & 1, rb = tid / (2 * NKT) * RT;
            uint32_t m[KP];
            bool live = false;
#pragma unroll
            for (int j = 0; j < KP; j++) {
                const int kk = kt + j * NKT;
                m[j] = kk < nk ? vis[kk] >> rb & ((1u << RT) - 1) : 0; /* this thread's rows */
                live |= m[j] != 0;
            }
            float dot[RT][KP];
#pragma unroll
            for (int r = 0; r < RT; r++)
#pragma unroll
                for (int j = 0; j < KP; j++)
                    dot[r][j] = 0;
            if (live) {
                const unsigned char *krow = kb + kt * G::ROWB + hh * (HD / 2) * G::EB;
                const float *qrow = &qs[rb][hh * (HD / 2)]; /* row rb + r at qrow + r * HD */
#pragma unroll 2
                for (int c = 0; c < HD / 2; c += PE) {
                    float kv[KP][PE];
#pragma unroll
                    for (int j = 0; j < KP; j++)
                        ats_get<KT, PE>(kv[j], krow + j * NKT * G::ROWB + c * G::EB);
#pragma unroll
                    for (int r = 0; r < RT; r++) {
                        if (rb + r < nr) {
                            float qv[PE]; /* the row's PE query values: 16-byte loads */
#pragma unroll
                            for (int i = 0; i < PE; i += 4) {
                                const float4 q4 = *(const float4 *)(qrow + r * HD + c + i);
                                qv[i] = q4.x, qv[i + 1] = q4.y, qv[i + 2] = q4.z, qv[i + 3] = q4.w;
                            }
#pragma unroll
                            for (int j = 0; j < KP; j++) {
                                float d = dot[r][j];
#pragma unroll
                                for (int i = 0; i < PE; i++)
                                    d = fmaf(qv[i], kv[j][i], d);
                                dot[r][j] = d;
                            }
                        }
                    }
                }
            }
            if (hh == 1)
#pragma unroll
                for (int r = 0; r < RT; r++)
                    if (rb + r < nr)
#pragma unroll
                        for (int j = 0; j < KP; j++)
                            sc[rb + r][kt + j * NKT] = dot[r][j];
            __syncthreads();
            if (hh == 0)
#pragma unroll
                for (int r = 0; r < RT; r++)
                    if (rb + r < nr)
#pragma unroll
                        for (int j = 0; j < KP; j++) {
                            float *x = &sc[rb + r][kt + j * NKT];
                            *x = (m[j] >> r) & 1 ? __fmul_rn(a.scale, dot[r][j] + *x) : -INFINITY;
                        }
        }
        __syncthreads();
        if (!kv_sep)
            ats_stage<HD, KT>(vb, a, a.v, g, k0, nk); /* into the keys' buffer */

        for (int r = warp; r < nr; r += ATS_THREADS / 32)
            att_row_softmax(sc[r], nk, lane, row_m + r, row_l + r, pt + r, PT);
        ats_wait<0>();
        __syncthreads(); /* p, the split's max and sum and the values are in */

        /* values: warp (kc, sub) sums p * v over keys kc*32 .. kc*32+31 in order, for rows
         * sub*8 .. sub*8+7 and all of d (ROWS 16), or for rows 0..ROWS-1 and half sub of d
         * (ROWS 2, 4, 8); then each (row, d) adds the four chunk sums in chunk order. Either
         * way a value is the same sum: the work split does not change it. */
        {
            constexpr int RV = ROWS < 8 ? ROWS : 8;              /* rows per warp */
            constexpr int DL = ROWS == 16 ? G::EL : G::EL / 2; /* values of d per lane */
            const int kc = warp & 3, sub = warp >> 2;
            const int rb = ROWS == 16 ? sub * 8 : 0;
            const int dv = ROWS == 16 ? d0 : sub * (HD / 2) + lane * DL;
            const bool on = rb < nr;
            float c[RV][DL];
#pragma unroll
            for (int i = 0; i < RV; i++)
#pragma unroll
                for (int j = 0; j < DL; j++)
                    c[i][j] = 0;
            const int ke = nk < kc * 32 + 32 ? nk : kc * 32 + 32;
            if (on) {
                /* lane l finds which of the warp's rows have p != 0 for key kc*32 + l: some
                 * (the key adds something) and all (no row needs the zero test) */
                bool any = false, all = true;
                if (kc * 32 + lane < nk)
#pragma unroll
                    for (int i = 0; i < RV; i++) {
                        const bool nz = rb + i < nr && pt[(kc * 32 + lane) * PT + rb + i] != 0.0f;
                        any |= nz;
                        all &= rb + i >= nr || nz;
                    }
                const uint32_t any_m = __ballot_sync(0xffffffffu, any);
                const uint32_t all_m = __ballot_sync(0xffffffffu, all);
                for (int kk = kc * 32; kk < ke; kk++) {
                    const uint32_t bit = 1u << (kk - kc * 32);
                    if (!(any_m & bit)) /* an invisible key adds nothing */
                        continue;
                    float pr[RV]; /* rows past nr: never stored, never used */
                    const float *pk = pt + kk * PT + rb;
                    if constexpr (RV % 4 == 0) {
#pragma unroll
                        for (int i = 0; i < RV; i += 4) {
                            const float4 p4 = *(const float4 *)(pk + i);
                            pr[i] = p4.x, pr[i + 1] = p4.y, pr[i + 2] = p4.z, pr[i + 3] = p4.w;
                        }
                    } else {
                        const float2 p2 = *(const float2 *)pk;
                        pr[0] = p2.x, pr[1] = p2.y;
                    }
                    float v[DL];
                    ats_get<KT, DL>(v, vb + kk * G::ROWB + dv * G::EB);
                    if (all_m & bit) { /* every row of the warp sees the key */
#pragma unroll
                        for (int i = 0; i < RV; i++)
#pragma unroll
                            for (int j = 0; j < DL; j++)
                                c[i][j] = fmaf(pr[i], v[j], c[i][j]);
                    } else {
#pragma unroll
                        for (int i = 0; i < RV; i++)
#pragma unroll
                            for (int j = 0; j < DL; j++)
                                c[i][j] = pr[i] != 0.0f ? fmaf(pr[i], v[j], c[i][j]) : c[i][j];
                    }
                }
            }
            __syncthreads(); /* keys and values are dead: the chunk sums go there */
            float *cs = (float *)kb; /* [4][ROWS][HD] */
            if (on)
#pragma unroll
                for (int i = 0; i < RV; i++)
                    if (rb + i < nr)
#pragma unroll
                        for (int j = 0; j < DL; j++)
                            cs[((size_t)kc * ROWS + rb + i) * HD + dv + j] = c[i][j];
            __syncthreads();
        }
        float c0[G::EL], c1[G::EL];
        {
            const float *cs = (const float *)kb;
#pragma unroll
            for (int j = 0; j < G::EL; j++) {
                const size_t q = (size_t)ROWS * HD;
                c0[j] = c1[j] = 0;
                if (vr0 < nr) {
                    const float *x = cs + (size_t)vr0 * HD + d0 + j;
                    c0[j] = ((x[0] + x[q]) + x[2 * q]) + x[3 * q];
                }
                if (vr1 < nr) {
                    const float *x = cs + (size_t)vr1 * HD + d0 + j;
                    c1[j] = ((x[0] + x[q]) + x[2 * q]) + x[3 * q];
                }
            }
        }

        if constexpr (!FOLD) {
            /* hand the split's partial to the combine kernel */
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const int r = u ? vr1 : vr0;
                if (r >= nr)
                    continue;
                float *pr = p.part + ((s * a.n_q + row_t[r]) * a.n_head + row_h[r]) * (HD + 2);
#pragma unroll
                for (int j = 0; j < G::EL; j++)
                    pr[d0 + j] = u ? c1[j] : c0[j];
                if (lane == 0) {
                    pr[HD] = row_m[r];
                    pr[HD + 1] = row_l[r];
                }
            }
            continue;
        }

        /* fold this split into the running values */
        if constexpr (!FOLD)
            continue;
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
        for (int j = 0; j < AN; j++) {
            if (vr0 < nr && row_ok[vr0])
                A0[j] = att_apply(A0[j], c0[j], fac_a[vr0], fac_b[vr0]);
            if (vr1 < nr && row_ok[vr1])
                A1[j] = att_apply(A1[j], c1[j], fac_a[vr1], fac_b[vr1]);
        }
    }

    if constexpr (!FOLD)
        return;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < AN; j++) {
        if (vr0 < nr)
            att_write(a, row_t[vr0], row_h[vr0], d0 + j, A0[j], run_l[vr0]);
        if (vr1 < nr)
            att_write(a, row_t[vr1], row_h[vr1], d0 + j, A1[j], run_l[vr1]);
    }
}

/* ---------------------------------------------------------------------------------------
 * Tensor-core kernel for f16 caches (ath_kernel; head_dim 128 or 256): every attention call
 * of a target with an f16 cache (decode, verify blocks, trees, prefill chunks). The staged
 * kernel's scalar dot products and value sums (~36K warp instructions per kv head and split
 * at decode, 33% of the DRAM rate at 32K keys) become m16n8k16 f16 products with f32
 * accumulation. Keys sit in M (16 per tile), the (query, head) rows in N (8 per tile), so a
 * decode's 6 rows per kv head waste 2 of 8 columns. K and V are f16 already, exact
 * operands; the other side is split into two f16 words: a query row q scaled by 2^-e (e
 * from the row's largest |q|, so the row's values lie below 2^15) as hi = f16(q') and lo =
 * f16(q' - hi); p scaled by 2^14 likewise. A score is (K.hi + K.lo) 2^e (two accumulator
 * chains, added), a value (V.hi + V.lo) 2^-14: within ~2^-21 of the f32 products, and
 * every output element of a product reads one key (or d) row and one query row, so a
 * query's result does not depend on the other rows of its call, or on which column of a
 * tile it takes: decode, verify, trees and prefill chunks agree bit for bit (the GPU test
 * checks it). A block takes one kv head, 8 or 16 rows and every z-th split of 128 keys from
 * its own (its query rows split once; per split its keys, then its values in the same
 * buffer; the grid about four waves where the splits allow); the split's softmax is
 * att_row_softmax. Under TANDEM_ATT_CHUNKS=split|auto|on (off by default, see
 * kernels/cuda/NOTES.md; the splits then fold one by one) the fold order has two levels: the
 * splits of a chunk of ATH_CHUNK fold from nothing, then the chunks in order. Under auto,
 * where every block along the keys has a chunk to walk (long contexts: a 16-query verify over
 * 32K keys), the blocks walk every z-th chunk instead, fold its splits themselves (att_fold's
 * operations on the values a partial would hold) and hand over one partial per chunk, a
 * quarter of the partials' bytes; elsewhere (decode, short blocks) a partial per split, and
 * the combine kernel folds both levels (split: always so; on: a partial per chunk always).
 * ------------------------------------------------------------------------------------- */

#define ATH_WARPS 8
#define ATH_THREADS (32 * ATH_WARPS)
#define ATH_SS (ATT_SPLIT + 4) /* floats per score row */
#define ATH_PS (ATT_SPLIT + 8) /* halves per row of p (rows 4 banks apart) */
#define ATH_PUP 0x1p14f        /* p is scaled by 2^14 before its split */
#define ATH_PDOWN 0x1p-14f     /* and the values back */
#define ATH_WAVES 4            /* waves of blocks a call's splits are walked in (ath_run) */
#define ATH_CHUNK 4            /* splits per chunk of the fold order */

template <int HD, int ROWS> struct ath_geo {
    static constexpr int QS = HD + 8;                              /* halves per query row */
    static constexpr int KROW = ats_geo<HD, __half>::ROWB;         /* bytes per key row */
    static constexpr size_t KV = (size_t)ATT_SPLIT * KROW;
    static constexpr size_t Q = (size_t)2 * ROWS * QS * 2;         /* hi and lo rows */
    static constexpr size_t S = (size_t)ROWS * ATH_SS * 4;
    static constexpr size_t P = (size_t)2 * ROWS * ATH_PS * 2;
    static constexpr size_t FIXED = Q + S + P;
};

__device__ __forceinline__ void ath_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The A fragment of a 16 x 16 f16 tile from shared memory: rows at row (this lane's row
 * address); trans: the tile is the transpose of what the rows hold. */
template <bool TRANS> __device__ __forceinline__ void ath_ldm(uint32_t (&a)[4], const void *row)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(row);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                     : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                     : "r"(s));
}

/* This lane's row address for ath_ldm of the B fragments of n tile 0 at k 0 from rows of
 * hi and lo words (stride halves apart): matrices 0, 1 the hi words of k 0..7 and 8..15
 * (b0, b1 of the hi product), 2, 3 the lo words'. */
__device__ __forceinline__ const __half *ath_brow(const __half *hi, const __half *lo, int stride,
                                                  int lane)
{
    return (lane >> 4 ? lo : hi) + (lane & 7) * stride + ((lane >> 3) & 1) * 8;
}

/* x as two f16 words hi + lo (hi = x rounded to f16, lo = the rest rounded) */
__device__ __forceinline__ void ath_split(float x, __half &hi, __half &lo)
{
    hi = __float2half_rn(x);
    lo = __float2half_rn(x - __half2float(hi));
}

/* 2^e for a query row whose largest |q| has the bits big: the row is split as q 2^-e, whose
 * values then lie below 2^15 (e = 0 for a row of zeros, inf or NaN; e within +-100, so both
 * 2^e and 2^-e are normal floats and multiplying by them is exact). */
__device__ __forceinline__ float ath_pow2(unsigned big)
{
    const float x = __uint_as_float(big);
    int e = x > 0.0f && isfinite(x) ? ilogbf(x) - 14 : 0;
    e = e < -100 ? -100 : e > 100 ? 100 : e;
    return __int_as_float((127 + e) << 23);
}

/* grid: x = tile of ROWS rows, y = kv head, z: the block takes splits (or chunks, see
 * att_chunked) z, z + gridDim.z, ... of the keys in use (its query rows split once for all
 * of them). Scores: warp w takes keys 16w .. 16w + 15 of every row; values: warp w takes d
 * tiles w, w + ATH_WARPS, ... (16 values each) of every row. */
template <int HD, int ROWS, bool FOLDS>
__global__ void __launch_bounds__(ATH_THREADS) ath_kernel(bool early, att_args p)
{
    pdl_enter(early);
    typedef ath_geo<HD, ROWS> G;
    constexpr int NT = ROWS / 8, DT = HD / 16 / ATH_WARPS, QS = G::QS;
    static_assert(ATT_SPLIT == 16 * ATH_WARPS && HD % (16 * ATH_WARPS) == 0 && ROWS % 8 == 0 &&
                      ROWS <= ATH_THREADS,
                  "a 16-key tile per warp; whole d tiles per warp; a thread per row");
    const ops_attn &a = p.a;
    extern __shared__ __align__(16) unsigned char ath_smem[];
    __half *qh = (__half *)ath_smem, *ql = qh + ROWS * QS;
    float *ss = (float *)(ath_smem + G::Q);
    __half *ph = (__half *)(ath_smem + G::Q + G::S), *pl = ph + ROWS * ATH_PS;
    unsigned char *kb = ath_smem + G::FIXED; /* keys, then values */
    __shared__ float row_m[ROWS], row_l[ROWS];
    __shared__ int64_t row_t[ROWS], row_h[ROWS];
    __shared__ int32_t row_qp[ROWS];
    __shared__ float row_up[ROWS];   /* 2^e of the row's split */
    __shared__ int64_t row_po[ROWS]; /* the row's partial in a split's */
    __shared__ int32_t kpos[ATT_SPLIT]; /* the split's key positions */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gi = lane >> 2, ti = lane & 3;
    const int64_t g = blockIdx.y, n_kv = att_n_kv(a), n_split = att_n_split(p, n_kv);
    const int64_t r0 = (int64_t)blockIdx.x * ROWS;
    /* the units the blocks walk: chunks (their splits folded here, one partial each) or
     * splits (one partial each); only the FOLDS instantiation can fold */
    const bool chunked = FOLDS && att_chunked(p, n_split);
    const int64_t n_unit = chunked ? att_n_chunk(p, n_split) : n_split;
    int64_t u = blockIdx.z;
    if (u >= n_unit)
        return; /* past the keys in use: the combine reads no partial of it */
    auto unit_end = [&](int64_t first) {
        return chunked ? (first + p.chunk < n_split ? first + p.chunk : n_split) : first + 1;
    };
    int64_t s = chunked ? u * p.chunk : u, s_end = unit_end(s);
    const int nr = (int)(p.n_rows - r0 < ROWS ? p.n_rows - r0 : ROWS);
    /* the keys in use of split sp */
    auto split_keys = [&](int64_t sp) {
        const int64_t k = sp * ATT_SPLIT;
        return (int)(n_kv - k < ATT_SPLIT ? n_kv - k : ATT_SPLIT);
    };
    ats_stage<HD, __half, true>(kb, a, a.k, g, s * ATT_SPLIT, split_keys(s));
    if (tid < ROWS) {
        /* rows of a call number below 2^31 (cuda_attention checks n_q * n_head) */
        const unsigned rf = (unsigned)(r0 + (tid < nr ? tid : 0)), grp = (unsigned)p.group;
        const unsigned t = rf / grp;
        row_t[tid] = t;
        row_h[tid] = g * grp + (rf - t * grp);
        row_qp[tid] = a.q_pos[t];
        row_po[tid] = ((int64_t)t * a.n_head + row_h[tid]) * (HD + 2);
    }
    __syncthreads();
    /* the query rows: warp w splits rows w, w + ATH_WARPS, ... (all its loads out first; lane
     * l holds d = l + 32 j), each by 2^-e from its largest |q| (a warp max) */
    constexpr int RW = ROWS / ATH_WARPS, QL = HD / 32;
    static_assert(ROWS % ATH_WARPS == 0, "whole rows per warp");
    float qv[RW][QL];
#pragma unroll
    for (int i = 0; i < RW; i++) {
        const int r = warp + ATH_WARPS * i;
        const float *qr = a.q + row_t[r] * a.q_tok_stride + row_h[r] * a.q_head_stride + lane;
#pragma unroll
        for (int j = 0; j < QL; j++)
            qv[i][j] = r < nr ? __ldg(qr + 32 * j) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < RW; i++) {
        const int r = warp + ATH_WARPS * i;
        unsigned big = 0;
#pragma unroll
        for (int j = 0; j < QL; j++)
            big = max(big, __float_as_uint(fabsf(qv[i][j])));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            big = max(big, __shfl_xor_sync(DEV_FULL_MASK, big, o));
        const float up = ath_pow2(big), down = 1.0f / up;
        if (lane == 0)
            row_up[r] = up;
#pragma unroll
        for (int j = 0; j < QL; j++)
            ath_split(qv[i][j] * down, qh[r * QS + lane + 32 * j], ql[r * QS + lane + 32 * j]);
    }
    const bool causal = a.mask == OPS_MASK_CAUSAL && a.window <= 0; /* att_visible_at's */
    /* a chunk's fold so far (att_fold from nothing, split by split): the values of this
     * thread's fragment elements, the max of each of its fragment rows, and the max and sum
     * of row tid */
    float fold_v[DT][NT][4] = {}, fold_m[NT][2], row_fm = -INFINITY, row_fl = 0;
#pragma unroll
    for (int n = 0; n < NT; n++)
        fold_m[n][0] = fold_m[n][1] = -INFINITY;
    for (;;) {
        const int64_t k0 = s * ATT_SPLIT;
        const int nk = split_keys(s);
        const int kend = (nk + 15) & ~15; /* the value products run over whole 16-key steps */
        if (tid < ATT_SPLIT) /* past the keys: a position no causal row sees */
            kpos[tid] = tid < nk ? __ldg(a.k_pos + k0 + tid) : INT32_MAX;
        ats_wait<0>();
        __syncthreads(); /* the split query rows, the key positions and the keys are in */

        /* scores: keys 16w .. 16w + 15 (M) x every row tile (N), over d */
        float sh[NT][4] = {}, sl[NT][4] = {};
        if (16 * warp < nk) {
            const unsigned char *krow =
                kb + (16 * warp + (lane & 15)) * G::KROW + (lane >> 4) * 16;
            const __half *qrow = ath_brow(qh, ql, QS, lane);
#pragma unroll 4
            for (int kk = 0; kk < HD; kk += 16) {
                uint32_t af[4];
                ath_ldm<false>(af, krow + kk * 2);
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    uint32_t bf[4];
                    ath_ldm<false>(bf, qrow + 8 * n * QS + kk);
                    ath_mma(sh[n], af, bf[0], bf[1]);
                    ath_mma(sl[n], af, bf[2], bf[3]);
                }
            }
            /* element e of n tile n: row 8n + 2ti + (e & 1), key 16w + gi + 8 (e >> 1); a
             * causal row's score is stored unguarded: past nr or past nk (the position
             * INT32_MAX) nothing reads it */
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = 16 * warp + gi + (e >> 1) * 8, r = 8 * n + 2 * ti + (e & 1);
                    const float x = __fmul_rn(a.scale, (sh[n][e] + sl[n][e]) * row_up[r]);
                    if (causal)
                        ss[r * ATH_SS + key] = kpos[key] <= row_qp[r] ? x : -INFINITY;
                    else if (r < nr && key < nk)
                        ss[r * ATH_SS + key] =
                            att_visible_at(a, row_t[r], row_qp[r], k0 + key, kpos[key]) ? x
                                                                                     : -INFINITY;
                }
        }
        __syncthreads(); /* every warp is done with the keys */
        ats_stage<HD, __half, true>(kb, a, a.v, g, k0, nk);
        for (int r = warp; r < nr; r += ATH_WARPS) {
            __half *rh = ph + r * ATH_PS, *rl = pl + r * ATH_PS;
            att_row_softmax_put(ss + r * ATH_SS, nk, lane, &row_m[r], &row_l[r],
                                [=](int c, float pv) { ath_split(pv * ATH_PUP, rh[c], rl[c]); });
            for (int c = nk + lane; c < kend; c += 32)
                ath_split(0.0f, rh[c], rl[c]);
        }
        ats_wait<0>();
        /* p is 0 past the keys: the values there must be finite */
        for (int e = nk * (HD / 8) + tid; e < kend * (HD / 8); e += ATH_THREADS)
            *(uint4 *)(kb + (e / (HD / 8)) * G::KROW + (e % (HD / 8)) * 16) =
                make_uint4(0, 0, 0, 0);
        __syncthreads(); /* p and the values are in */

        /* values: d tiles w + ATH_WARPS j (M) x every row tile (N), over the keys */
        float oh[DT][NT][4] = {}, ol[DT][NT][4] = {};
        const unsigned char *vrow = kb + ((lane & 7) + ((lane >> 4) & 1) * 8) * G::KROW +
                                    ((lane >> 3) & 1) * 16;
        const __half *prow = ath_brow(ph, pl, ATH_PS, lane);
        for (int kk = 0; kk < kend; kk += 16) {
            uint32_t bf[NT][4];
#pragma unroll
            for (int n = 0; n < NT; n++)
                ath_ldm<false>(bf[n], prow + 8 * n * ATH_PS + kk);
#pragma unroll
            for (int j = 0; j < DT; j++) {
                uint32_t af[4];
                ath_ldm<true>(af, vrow + kk * G::KROW + (warp + ATH_WARPS * j) * 32);
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    ath_mma(oh[j][n], af, bf[n][0], bf[n][1]);
                    ath_mma(ol[j][n], af, bf[n][2], bf[n][3]);
                }
            }
        }

        /* unit v's partial (a split's, or a chunk's): values value(j, n, e), then max and
         * sum. Element e = 2h + i of d tile w + ATH_WARPS j and n tile n: row 8n + 2ti + i,
         * value 16w + gi + 16 ATH_WARPS j + 8h (one address per row, the rest immediate
         * offsets). A chunk's splits fold first, with the combine kernel's operations on the
         * values it would have read. */
        auto put = [&](int64_t v, auto value, auto row_max, auto row_sum) {
            float *part = p.part + v * a.n_q * a.n_head * (HD + 2);
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int r = 8 * n + 2 * ti + i;
                    if (r >= nr)
                        continue;
                    float *pr = part + row_po[r] + 16 * warp + gi;
#pragma unroll
                    for (int j = 0; j < DT; j++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            pr[16 * ATH_WARPS * j + 8 * h] = value(j, n, 2 * h + i);
                }
            if (tid < nr) { /* ROWS <= ATH_THREADS */
                float *pr = part + row_po[tid];
                pr[HD] = row_max();
                pr[HD + 1] = row_sum();
            }
        };
        auto split_value = [&](int j, int n, int e) {
            return (oh[j][n][e] + ol[j][n][e]) * ATH_PDOWN;
        };
        if constexpr (!FOLDS) {
            put(s, split_value, [&] { return row_m[tid]; }, [&] { return row_l[tid]; });
            s += gridDim.z;
            if (s >= n_split)
                break;
        } else {
            if (chunked) { /* the split into the chunk's fold (att_fold's operations) */
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        float fa = 0.0f, fb = 0.0f;
                        if (!att_factors(fold_m[n][i], row_m[8 * n + 2 * ti + i], fa, fb))
                            continue;
#pragma unroll
                        for (int j = 0; j < DT; j++)
#pragma unroll
                            for (int h = 0; h < 2; h++)
                                fold_v[j][n][2 * h + i] = att_apply(
                                    fold_v[j][n][2 * h + i], split_value(j, n, 2 * h + i), fa, fb);
                    }
                if (tid < nr) {
                    float fa = 0.0f, fb = 0.0f;
                    att_fold(row_fm, row_fl, row_m[tid], row_l[tid], fa, fb);
                }
            }
            const bool last = s + 1 == s_end;
            if (!chunked)
                put(u, split_value, [&] { return row_m[tid]; }, [&] { return row_l[tid]; });
            else if (last) {
                put(
                    u, [&](int j, int n, int e) { return fold_v[j][n][e]; },
                    [&] { return row_fm; }, [&] { return row_fl; });
#pragma unroll
                for (int n = 0; n < NT; n++) { /* the next chunk folds from nothing */
                    fold_m[n][0] = fold_m[n][1] = -INFINITY;
#pragma unroll
                    for (int j = 0; j < DT; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            fold_v[j][n][e] = 0.0f;
                }
                row_fm = -INFINITY;
                row_fl = 0.0f;
            }
            if (last) {
                u += gridDim.z;
                if (u >= n_unit)
                    break;
                s = chunked ? u * p.chunk : u;
                s_end = unit_end(s);
            } else {
                s++;
            }
        }
        __syncthreads(); /* every warp is done with this split's values, p, maxima and sums */
        ats_stage<HD, __half, true>(kb, a, a.k, g, s * ATT_SPLIT, split_keys(s));
    }
}

typedef void (*ath_fn)(bool, att_args);

/* One 4-byte cp.async (the combine's values; partial rows are only 8-byte aligned). */
__device__ __forceinline__ void att_cp4(float *dst, const float *src)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(src) : "memory");
}

/* Folds the partials of one (query, head) row in the fold order: block x = t * n_head + h,
 * y = a run of ATT_COMBINE_D head values, each folded by one thread (threads below
 * ATT_COMBINE_D). The same operations in the same order as att_fold and att_apply partial
 * by partial, so the same bits, but not one round trip per batch of partials and one exp
 * chain per partial: per round of up to p.round partials, every value of the round is copied
 * into shared memory at once (cp.async, the copies shared by all ATT_COMBINE_T threads), the
 * running max after each partial (a max is exact in any order: a scan over the threads)
 * gives every partial's factors fa and fb side by side, and each folding thread then runs
 * only the multiply-adds of its value and of the sum. (One thread walking 257 splits of a
 * 32K decode in batches of 32 took ~25 us per layer; 64 threads each issuing the copies of
 * their own value, ~15 us.) CHUNKS (p.chunk > 1): with a partial per split, the splits of
 * each chunk fold first, from nothing, every (chunk, value) by a thread of its own, and the
 * folding threads then fold the chunks: what a block that folded the chunk itself hands over
 * (att_chunked), with the same operations; with a partial per chunk, as without chunks. */
template <bool CHUNKS>
__global__ void __launch_bounds__(ATT_COMBINE_T, ATT_COMBINE_PER_SM)
    att_combine_kernel(bool early, att_args p)
{
    pdl_enter(early);
    extern __shared__ float csm[];
    __shared__ float wmax[ATT_COMBINE_T / 32];
    const ops_attn &a = p.a;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t D = a.head_dim, row = blockIdx.x;
    const int64_t d0 = (int64_t)blockIdx.y * ATT_COMBINE_D, d = d0 + tid;
    const int nd = (int)(D - d0 < ATT_COMBINE_D ? D - d0 : ATT_COMBINE_D); /* values here */
    const int64_t t = row / a.n_head, h = row % a.n_head;
    const int64_t n_split = att_n_split(p, att_n_kv(a));
    /* C partials per chunk of the fold (1: they fold one by one); rounds hold whole chunks */
    const bool chunked = CHUNKS && att_chunked(p, n_split);
    const int C = CHUNKS && !chunked ? p.chunk : 1;
    const int64_t n_part = chunked ? att_n_chunk(p, n_split) : n_split;
    const int R = (int)(p.n_split < p.round ? p.n_split : p.round);
    float *sv = csm;                              /* [R][ATT_COMBINE_D] the values */
    float *sfa = sv + (size_t)R * ATT_COMBINE_D; /* [R] att_fold's fa */
    float *sfb = sfa + R;                         /* [R] fb; -1: a partial that folds nothing */
    float *sl = sfb + R;                          /* [R] the partials' sums */
    float *sca = sl + R, *scb = sca + R, *scl = scb + R; /* [R / C] a chunk's fa, fb, sum */
    const int64_t stride = a.n_q * a.n_head * (D + 2); /* one partial to the next */
    const float *base = p.part + row * (D + 2);
    float M = -INFINITY, L = 0, A = 0;
    for (int64_t s0 = 0; s0 < n_part; s0 += R) {
        const int nr = (int)(n_part - s0 < R ? n_part - s0 : R);
        __syncthreads(); /* the previous round is folded: its arrays are free */
        for (int e = tid; e < nr * ATT_COMBINE_D; e += ATT_COMBINE_T) {
            const int i = e / ATT_COMBINE_D, c = e % ATT_COMBINE_D;
            if (c < nd)
                att_cp4(sv + e, base + (s0 + i) * stride + d0 + c);
        }
        ats_commit();
        /* thread tid takes partials i0 .. i1 - 1 of the round (whole chunks): their max and
         * sum, the max of all partials before them (a scan of the threads' maxima), then
         * their factors */
        int per = (nr + ATT_COMBINE_T - 1) / ATT_COMBINE_T;
        if (C > 1)
            per = (per + C - 1) / C * C;
        const int i0 = tid * per < nr ? tid * per : nr, i1 = i0 + per < nr ? i0 + per : nr;
        float mine = -INFINITY;
        for (int i = i0; i < i1; i++) {
            const float *pr = base + (s0 + i) * stride;
            sfa[i] = pr[D]; /* the partial's max, until its factor replaces it */
            sl[i] = pr[D + 1];
            mine = fmaxf(mine, sfa[i]);
        }
        float incl = mine; /* max over threads 0 .. tid */
        for (int o = 1; o < 32; o <<= 1) {
            const float u = __shfl_up_sync(DEV_FULL_MASK, incl, o);
            if (lane >= o)
                incl = fmaxf(incl, u);
        }
        if (lane == 31)
            wmax[warp] = incl;
        __syncthreads();
        float before = __shfl_up_sync(DEV_FULL_MASK, incl, 1); /* over threads 0 .. tid-1 */
        if (lane == 0)
            before = -INFINITY;
        for (int w = 0; w < warp; w++)
            before = fmaxf(before, wmax[w]);
        float Mi = fmaxf(M, before); /* att_fold's M before partial i0 */
        if (C == 1) {
            for (int i = i0; i < i1; i++) {
                float fa = 0.0f, fb = -1.0f; /* -1: nothing to fold, M unchanged */
                att_factors(Mi, sfa[i], fa, fb);
                sfa[i] = fa;
                sfb[i] = fb;
            }
        } else {
            for (int c0 = i0; c0 < i1; c0 += C) {
                const int c1 = c0 + C < i1 ? c0 + C : i1;
                float Mc = -INFINITY; /* a chunk folds from nothing */
                for (int i = c0; i < c1; i++) {
                    float fa = 0.0f, fb = -1.0f;
                    att_factors(Mc, sfa[i], fa, fb);
                    sfa[i] = fa;
                    sfb[i] = fb;
                }
                float fa = 0.0f, fb = -1.0f;
                att_factors(Mi, Mc, fa, fb);
                sca[c0 / C] = fa;
                scb[c0 / C] = fb;
            }
        }
        for (int w = 0; w < ATT_COMBINE_T / 32; w++)
            M = fmaxf(M, wmax[w]); /* after the round */
        ats_wait<0>();
        __syncthreads();
        /* partials i0 .. i1 - 1 of the round into value v (column col) and, with sum, the
         * sum l */
        auto fold = [&](float &l, float &v, int i0, int i1, int col, bool sum) {
            for (int i = i0; i < i1; i++) {
                const float fb = sfb[i];
                if (fb == -1.0f)
                    continue;
                const float fa = sfa[i];
                if (sum)
                    l = att_apply(l, sl[i], fa, fb);
                v = att_apply(v, sv[(size_t)i * ATT_COMBINE_D + col], fa, fb);
            }
        };
        if (C == 1) {
            if (tid < nd)
                fold(L, A, 0, nr, tid, true);
            continue;
        }
        /* each (chunk, value) of the round folds its splits into the chunk's first slot (and
         * with value 0 the sums) */
        const int nch = (nr + C - 1) / C;
        for (int e = tid; e < nch * ATT_COMBINE_D; e += ATT_COMBINE_T) {
            const int c0 = e / ATT_COMBINE_D * C, col = e % ATT_COMBINE_D;
            if (col >= nd)
                continue;
            float Lc = 0, Ac = 0;
            fold(Lc, Ac, c0, c0 + C < nr ? c0 + C : nr, col, col == 0);
            sv[(size_t)c0 * ATT_COMBINE_D + col] = Ac;
            if (col == 0)
                scl[c0 / C] = Lc;
        }
        __syncthreads();
        if (tid < nd)
            for (int c = 0; c < nch; c++) {
                const float fb = scb[c];
                if (fb == -1.0f)
                    continue;
                const float fa = sca[c];
                L = att_apply(L, scl[c], fa, fb);
                A = att_apply(A, sv[(size_t)c * C * ATT_COMBINE_D + tid], fa, fb);
            }
    }
    if (tid < nd)
        att_write(a, t, h, d, A, L);
}

/* Shared memory of the combine kernel for rounds of R partials: values, fa, fb, sums, and
 * with chunks of splits a chunk's fa, fb and sum. */
static size_t att_combine_bytes(int64_t R, int chunk)
{
    return (size_t)R * (ATT_COMBINE_D + (chunk > 1 ? 6 : 3)) * sizeof(float);
}

/* The combine kernel over p's partials: its shared memory holds a round of splits, up to
 * ATT_COMBINE_ROUND where the device has the room (an sm_86 block's 99 KB hold 374; with
 * chunks of splits 356, whole chunks). The round changes no bit: split i's factors come from
 * the max over all splits before it. */
static td_err att_combine_launch(att_args p, cudaStream_t st)
{
    int dev = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    const size_t room = (size_t)smem_optin_bytes(dev), per = att_combine_bytes(1, p.chunk);
    int64_t most = room > 1024 + per ? (int64_t)((room - 1024) / per) : 1; /* 1 KB: wmax */
    if (most > ATT_COMBINE_ROUND)
        most = ATT_COMBINE_ROUND;
    if (most < p.chunk)
        return err_set(TD_ENOTSUP, "attention combine: %lld splits per round, chunks of %d",
                       (long long)most, p.chunk);
    most -= most % p.chunk; /* whole chunks per round */
    p.round = (int)most;
    const int64_t R = p.n_split < most ? p.n_split : most;
    const size_t smem = att_combine_bytes(R, p.chunk);
    const dim3 grid((unsigned)(p.a.n_q * p.a.n_head),
                    (unsigned)((p.a.head_dim + ATT_COMBINE_D - 1) / ATT_COMBINE_D));
    if (p.chunk > 1) {
        if (smem > 48 * 1024)
            TD_TRY(smem_optin<att_combine_kernel<true>>(dev, att_combine_bytes(most, p.chunk)));
        return pdl_launch<att_combine_kernel<true>>("attention combine", grid,
                                                    dim3(ATT_COMBINE_T), smem, st, p);
    }
    if (smem > 48 * 1024)
        TD_TRY(smem_optin<att_combine_kernel<false>>(dev, att_combine_bytes(most, 1)));
    return pdl_launch<att_combine_kernel<false>>("attention combine", grid, dim3(ATT_COMBINE_T),
                                                 smem, st, p);
}

/* ---------------------------------------------------------------------------------------
 * Tensor-core kernel (f32 cache, head_dim 64 or 128, bidirectional mask: the DFlash
 * drafter's block over its context, where 16 queries x a GQA group share every key). A
 * block takes one kv head, 16, 32 or 64 (query, head) rows and one split of ATT_SPLIT keys,
 * and hands its partial to the combine kernel. Scores (q . k over d) and values (p . v over
 * the split's keys) are m16n8k8 TF32 tensor-core products with each f32 operand x split
 * into hi = tf32(x) and lo = x - hi (atm_split): a product is hi*hi + (lo*hi + hi*lo),
 * within about 2^-21 of the f32 product (lo*lo and lo's bits below TF32 are dropped), summed
 * by the tensor core over 8 terms at a time. The split's softmax is att_row_softmax, the fold
 * the combine kernel's. A row's result depends only on its own query and visible keys (a
 * product's output element reads one row of each operand), so a query still gives the same
 * bits alone or in any block; the kernel is chosen by the mask kind, cache type and head_dim
 * alone (and TANDEM_ATT_MMA=0, read on every call, turns it off to measure and to test the
 * staged kernel on these calls). The scalar staged kernel took ~36 us for the 27B drafter's
 * block over 1K keys (H200): each 16-row block re-read its split from L2 and ran ~38K warp
 * instructions; this one takes ~25 us (kernels/cuda/NOTES.md).
 * ------------------------------------------------------------------------------------- */

#define ATM_WARPS 8
#define ATM_THREADS (32 * ATM_WARPS)
#define ATM_KW (ATT_SPLIT / ATM_WARPS) /* keys a warp scores */
#define ATM_SS (ATT_SPLIT + 4)       /* floats per score row (rows start 4 banks apart) */

/* Shared memory: the A operands (query rows, then p), split into hi and lo words, each in
 * fragment order (atm_aidx: a lane's four words of a tile side by side, one 16-byte load);
 * key rows HD + 4 floats apart (a B fragment's (g, t) reads bank 4g + t), value rows HD + 8
 * (bank 8t + g). The scores (f32, rows ATM_SS apart) take the key buffer once the keys are
 * scored. */
template <int HD> struct atm_geo {
    static constexpr int KS = HD + 4;
    static constexpr int VS = HD + 8;
    static constexpr int AW = HD > ATT_SPLIT ? HD : ATT_SPLIT; /* words per row of the A region */
};

/* Dynamic shared memory: [2][ROWS * AW] words (hi, lo), [ATT_SPLIT][KS] keys (then
 * [ROWS][ATM_SS] scores), [ATT_SPLIT][VS] values. */
template <int HD, int MT> __host__ __device__ constexpr size_t atm_kbuf_floats()
{
    typedef atm_geo<HD> G;
    return (size_t)ATT_SPLIT * G::KS > (size_t)16 * MT * ATM_SS ? (size_t)ATT_SPLIT * G::KS
                                                                 : (size_t)16 * MT * ATM_SS;
}
template <int HD, int MT> __host__ __device__ constexpr size_t atm_smem_bytes()
{
    typedef atm_geo<HD> G;
    return (size_t)16 * MT * G::AW * 8 +
           (atm_kbuf_floats<HD, MT>() + (size_t)ATT_SPLIT * G::VS) * 4;
}

/* x (finite) as a TF32 pair: hi = x rounded to the nearest TF32 (ties away from zero: the
 * magnitude's bits plus half a TF32 unit, cut), lo = x - hi (exact in f32), of which the
 * tensor core reads the TF32 bits. Two integer operations where cvt.rna.tf32.f32 takes a
 * dozen on sm_90. */
__device__ __forceinline__ void atm_split(float x, uint32_t &hi, uint32_t &lo)
{
    hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi));
}

__device__ __forceinline__ void atm_mma(float (&c)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[2])
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* For every pair (m, j): the products of a[m] and b[j] from the split operands, hi*hi into
 * c[m][j] and the small terms lo*hi + hi*lo into d[m][j] (added to c at the end: two chains
 * per tile, neither waiting on the other); each round runs all pairs, so consecutive
 * products are independent (an in-order warp waits out a product's latency only when the
 * next one needs its result). */
template <int M, int N>
__device__ __forceinline__ void atm_mma3(float (&c)[M][N][4], float (&d)[M][N][4],
                                         const uint32_t (&ah)[M][4], const uint32_t (&al)[M][4],
                                         const uint32_t (&bh)[N][2], const uint32_t (&bl)[N][2])
{
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int j = 0; j < N; j++)
            atm_mma(d[m][j], al[m], bh[j]);
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int j = 0; j < N; j++)
            atm_mma(c[m][j], ah[m], bh[j]);
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int j = 0; j < N; j++)
            atm_mma(d[m][j], ah[m], bl[j]);
}

/* c += d, tile by tile. */
template <int M, int N>
__device__ __forceinline__ void atm_add(float (&c)[M][N][4], const float (&d)[M][N][4])
{
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int j = 0; j < N; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                c[m][j][e] += d[m][j][e];
}

/* Where element (r, c) of an A operand W columns wide sits in fragment order: tile (r / 16,
 * c / 8), then lane (g, t) = ((r % 8), (c % 4)), then its slot in the lane's A fragment
 * (16 x 8, row-major: rows g and g + 8 at columns t and t + 4, in that order). */
__device__ __forceinline__ int atm_aidx(int r, int c, int W)
{
    const int rr = r & 15, cc = c & 7;
    return ((((r >> 4) * (W / 8) + (c >> 3)) * 32 + (rr & 7) * 4 + (cc & 3)) << 2) + (rr >> 3) +
           ((cc >> 2) << 1);
}

/* Stores x at element (r, c) of the split A operand (hi words at h, lo at l). */
__device__ __forceinline__ void atm_aput(uint32_t *h, uint32_t *l, int r, int c, int W, float x)
{
    const int i = atm_aidx(r, c, W);
    atm_split(x, h[i], l[i]);
}

/* The A fragment of tile (m, k-step kk / 8) of a split A operand W columns wide. */
__device__ __forceinline__ void atm_frag_a(const uint32_t *h, const uint32_t *l, int m, int kk,
                                           int W, int lane, uint32_t (&hi)[4], uint32_t (&lo)[4])
{
    const int i = ((m * (W / 8) + kk / 8) * 32 + lane) * 4;
    const uint4 u = *(const uint4 *)(h + i), v = *(const uint4 *)(l + i);
    hi[0] = u.x, hi[1] = u.y, hi[2] = u.z, hi[3] = u.w;
    lo[0] = v.x, lo[1] = v.y, lo[2] = v.z, lo[3] = v.w;
}

/* The B fragment (8 x 8, k by n: lane (g, t) holds k = t and t + 4 at n = g) of the tile
 * whose (k, n) element is x[k * sk + n * sn]. */
__device__ __forceinline__ void atm_frag_b(const float *x, int sk, int sn, int g, int t,
                                           uint32_t (&hi)[2], uint32_t (&lo)[2])
{
    atm_split(x[t * sk + g * sn], hi[0], lo[0]);
    atm_split(x[(t + 4) * sk + g * sn], hi[1], lo[1]);
}

/* One k-step (8 columns from kk) of the products c (hi*hi) and d (lo*hi + hi*lo) for M row
 * tiles of a split A operand W columns wide and N B tiles: tile j's (k, n) element is
 * b[j * bstep + k * sk + n * sn]. */
template <int M, int N>
__device__ __forceinline__ void atm_step(float (&c)[M][N][4], float (&d)[M][N][4],
                                         const uint32_t *ah, const uint32_t *al, int W, int kk,
                                         const float *b, int bstep, int sk, int sn, int lane)
{
    uint32_t fh[M][4], fl[M][4], bh[N][2], bl[N][2];
#pragma unroll
    for (int j = 0; j < N; j++)
        atm_frag_b(b + j * bstep, sk, sn, lane >> 2, lane & 3, bh[j], bl[j]);
#pragma unroll
    for (int m = 0; m < M; m++)
        atm_frag_a(ah, al, m, kk, W, lane, fh[m], fl[m]);
    atm_mma3(c, d, fh, fl, bh, bl);
}

/* grid: x = tile of 16 * MT rows, y = kv head, z = split. Warp w scores keys ATM_KW w ..
 * ATM_KW (w + 1) - 1 of every row and sums the values of d tiles w, w + ATM_WARPS, ... (8
 * values each) of every row. The A operands, which every warp reads, are split once into
 * shared memory; each warp splits the B operands it alone reads. */
template <int HD, int MT>
__global__ void __launch_bounds__(ATM_THREADS) atm_kernel(bool early, att_args p)
{
    pdl_enter(early);
    typedef atm_geo<HD> G;
    constexpr int ROWS = 16 * MT, CH = HD / 4, NJ = ATM_KW / 8, ND = HD / 8 / ATM_WARPS;
    static_assert(ATM_KW % 8 == 0 && HD % (8 * ATM_WARPS) == 0,
                  "whole key tiles per warp, the same number of d tiles per warp");
    const ops_attn &a = p.a;
    extern __shared__ __align__(16) float atm_smem[];
    uint32_t *ah = (uint32_t *)atm_smem;         /* A operand hi words: query rows, then p */
    uint32_t *al = ah + (size_t)ROWS * G::AW;     /* lo words */
    float *ks = atm_smem + (size_t)ROWS * G::AW * 2; /* keys, then scores (ATM_SS apart) */
    float *vs = ks + atm_kbuf_floats<HD, MT>();
    __shared__ float row_m[ROWS], row_l[ROWS];
    __shared__ int64_t row_t[ROWS], row_h[ROWS];
    __shared__ int32_t row_qp[ROWS];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gi = lane >> 2, ti = lane & 3;
    const int64_t g = blockIdx.y, s = blockIdx.z, n_kv = att_n_kv(a);
    const int64_t r0 = (int64_t)blockIdx.x * ROWS, k0 = s * ATT_SPLIT;
    const int nr = (int)(p.n_rows - r0 < ROWS ? p.n_rows - r0 : ROWS);
    const int nk = (int)(n_kv - k0 < ATT_SPLIT ? (n_kv > k0 ? n_kv - k0 : 0) : ATT_SPLIT);

    /* keys (one copy group), values (another), meanwhile the query rows as pairs */
    const float *kbase = (const float *)a.k + (k0 * a.kv_tok_stride + g * a.kv_head_stride);
    const float *vbase = (const float *)a.v + (k0 * a.kv_tok_stride + g * a.kv_head_stride);
    for (int e = tid; e < nk * CH; e += ATM_THREADS)
        ats_cp16(ks + (e / CH) * G::KS + (e % CH) * 4,
                 kbase + (e / CH) * a.kv_tok_stride + (e % CH) * 4);
    ats_commit();
    const int kend = (nk + 7) & ~7; /* the value products run over whole 8-key steps */
    for (int e = tid; e < nk * CH; e += ATM_THREADS)
        ats_cp16(vs + (e / CH) * G::VS + (e % CH) * 4,
                 vbase + (e / CH) * a.kv_tok_stride + (e % CH) * 4);
    ats_commit();
    /* p is 0 past the keys: the values there must be finite */
    for (int e = nk * CH + tid; e < kend * CH; e += ATM_THREADS)
        *(float4 *)(vs + (e / CH) * G::VS + (e % CH) * 4) = make_float4(0, 0, 0, 0);
    for (int r = tid; r < ROWS; r += ATM_THREADS) {
        const int64_t rf = r0 + (r < nr ? r : 0);
        row_t[r] = rf / p.group;
        row_h[r] = g * p.group + rf % p.group;
        row_qp[r] = a.q_pos[row_t[r]];
    }
    __syncthreads();
    constexpr int QN = (ROWS * CH + ATM_THREADS - 1) / ATM_THREADS; /* a thread's query pieces */
    float4 qv[QN];
#pragma unroll
    for (int u = 0; u < QN; u++) { /* every load out before any is split */
        const int e = tid + u * ATM_THREADS, r = e / CH, c = e % CH;
        qv[u] = make_float4(0, 0, 0, 0);
        if (r < nr && e < ROWS * CH)
            qv[u] = __ldg((const float4 *)(a.q + row_t[r] * a.q_tok_stride +
                                           row_h[r] * a.q_head_stride) + c);
    }
#pragma unroll
    for (int u = 0; u < QN; u++) {
        const int e = tid + u * ATM_THREADS, r = e / CH, c = e % CH;
        if (e >= ROWS * CH)
            break;
        atm_aput(ah, al, r, 4 * c, HD, qv[u].x);
        atm_aput(ah, al, r, 4 * c + 1, HD, qv[u].y);
        atm_aput(ah, al, r, 4 * c + 2, HD, qv[u].z);
        atm_aput(ah, al, r, 4 * c + 3, HD, qv[u].w);
    }
    ats_wait<1>();
    __syncthreads(); /* the query pairs and keys are in */

    /* scores of keys ATM_KW w .. ATM_KW (w + 1) - 1: MT x NJ tiles */
    float sc[MT][NJ][4] = {}, sd[MT][NJ][4] = {};
    if (ATM_KW * warp < nk) {
#pragma unroll
        for (int kk = 0; kk < HD; kk += 8)
            atm_step(sc, sd, ah, al, HD, kk, ks + ATM_KW * warp * G::KS + kk, 8 * G::KS, 1,
                     G::KS, lane);
        atm_add(sc, sd);
    }
    __syncthreads(); /* every warp is done with the keys: the buffer takes the scores */
    float *ss = ks;
    const bool every = a.window <= 0; /* bidirectional: no window, every key in the cache */
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = 16 * m + gi + (e >> 1) * 8;
                const int c = ATM_KW * warp + 8 * j + 2 * ti + (e & 1);
                bool vis = r < nr && c < nk;
                if (vis && !every)
                    vis = llabs((int64_t)row_qp[r] - __ldg(a.k_pos + k0 + c)) < a.window;
                ss[r * ATM_SS + c] = vis ? __fmul_rn(a.scale, sc[m][j][e]) : -INFINITY;
            }
    __syncthreads();
    for (int r = warp; r < ROWS; r += ATM_WARPS) {
        float *row = ss + r * ATM_SS;
        att_row_softmax(row, ATT_SPLIT, lane, &row_m[r], &row_l[r], row, 1);
        __syncwarp();
        for (int c = lane; c < ATT_SPLIT; c += 32)
            atm_aput(ah, al, r, c, ATT_SPLIT, row[c]);
    }
    ats_wait<0>();
    __syncthreads(); /* p and the values are in */

    /* values of d tiles w, w + ATM_WARPS, ...: MT x ND tiles over the split's keys */
    float o[MT][ND][4] = {}, od[MT][ND][4] = {};
#pragma unroll
    for (int kk = 0; kk < ATT_SPLIT; kk += 8) {
        if (kk >= kend)
            break;
        atm_step(o, od, ah, al, ATT_SPLIT, kk, vs + kk * G::VS + 8 * warp, 8 * ATM_WARPS, G::VS,
                 1, lane);
    }
    atm_add(o, od);

    /* the split's partial: values, then max and sum */
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = 16 * m + gi + 8 * hf;
            if (r >= nr)
                continue;
            float *pr = p.part + ((s * a.n_q + row_t[r]) * a.n_head + row_h[r]) * (HD + 2);
#pragma unroll
            for (int j = 0; j < ND; j++)
                *(float2 *)(pr + 8 * (warp + ATM_WARPS * j) + 2 * ti) =
                    make_float2(o[m][j][2 * hf], o[m][j][2 * hf + 1]);
        }
    for (int r = tid; r < nr; r += ATM_THREADS) {
        float *pr = p.part + ((s * a.n_q + row_t[r]) * a.n_head + row_h[r]) * (HD + 2);
        pr[HD] = row_m[r];
        pr[HD + 1] = row_l[r];
    }
}

typedef void (*atm_fn)(bool, att_args);

template <int HD, int MT> static atm_fn atm_pick(int dev, size_t *smem, uint64_t **occ)
{
    *smem = atm_smem_bytes<HD, MT>();
    *occ = pdl_occ_cache<atm_kernel<HD, MT>>();
    if (*smem + 4096 > (size_t)smem_optin_bytes(dev)) /* room for the static arrays */
        return NULL;
    if (smem_optin<atm_kernel<HD, MT>>(dev, *smem) != TD_OK)
        return NULL;
    return atm_kernel<HD, MT>;
}

/* The widest row tile (16 * *mt rows) that the call's rows fill and the device's blocks hold.
 * The tile never changes a bit, so where 16 rows fit every call of a head size takes this
 * kernel, whatever its rows: with 99 KB per block (sm_86) head_dim 64 holds only 16 rows, and
 * taking the staged kernel for more rows would give a query other bits alone than in its
 * block. */
template <int HD>
static atm_fn atm_pick_rows(int dev, int64_t n_rows, int *mt, size_t *smem, uint64_t **occ)
{
    atm_fn f = NULL;
    if (n_rows > 32 && (f = atm_pick<HD, 4>(dev, smem, occ)) != NULL) {
        *mt = 4;
        return f;
    }
    if (n_rows > 16 && (f = atm_pick<HD, 2>(dev, smem, occ)) != NULL) {
        *mt = 2;
        return f;
    }
    *mt = 1;
    return atm_pick<HD, 1>(dev, smem, occ);
}

/* Whether the tensor-core kernels may run (TANDEM_ATT_MMA=0, read on every call, turns them
 * off: the staged kernel then takes their calls, to measure and to test). */
static bool att_mma_on(void)
{
    const char *e = getenv("TANDEM_ATT_MMA");
    return !(e && strcmp(e, "0") == 0);
}

/* Whether every cache row of a starts 16-byte aligned (the staged copies' condition). */
static bool att_rows_aligned(const ops_attn *a)
{
    const int64_t eb = (int64_t)ops_kv_elem_bytes(a->kv_type);
    return (uintptr_t)a->k % 16 == 0 && (uintptr_t)a->v % 16 == 0 &&
           a->kv_tok_stride * eb % 16 == 0 && a->kv_head_stride * eb % 16 == 0;
}

/* The tensor-core kernel for a call, or NULL (other masks, caches or head sizes, rows not
 * 16-byte aligned, too little shared memory, TANDEM_ATT_MMA=0); *mt: its rows / 16, *smem
 * its dynamic shared memory, *occ its occupancy cache. */
static atm_fn atm_plan(const ops_attn *a, int dev, int64_t n_rows, int *mt, size_t *smem,
                       uint64_t **occ)
{
    if (!att_mma_on() || a->kv_type != TD_F32 ||
        a->mask != OPS_MASK_BIDIRECTIONAL || a->n_kv_dev || a->n_kv == 0 ||
        (uintptr_t)a->k % 16 != 0 || (uintptr_t)a->v % 16 != 0 || (uintptr_t)a->q % 16 != 0 ||
        a->kv_tok_stride % 4 != 0 || a->kv_head_stride % 4 != 0 || a->q_tok_stride % 4 != 0 ||
        a->q_head_stride % 4 != 0 || dev < 0 || dev >= PDL_MAX_DEV)
        return NULL;
    switch (a->head_dim) {
    case 128:
        return atm_pick_rows<128>(dev, n_rows, mt, smem, occ);
    case 64:
        return atm_pick_rows<64>(dev, n_rows, mt, smem, occ);
    default:
        return NULL;
    }
}

typedef void (*ats_fn)(bool, att_args, int);

/* Which staged kernel runs a call, with how much shared memory, and whether keys and values
 * get buffers of their own (copies overlap the scores) or share one (more blocks per SM).
 * fn NULL: the generic kernel (other head sizes, unaligned rows, too little shared memory). */
typedef struct ats_plan {
    ats_fn fn;
    size_t smem;  /* dynamic shared memory bytes */
    int kv_sep;   /* 1: separate key and value buffers */
    uint64_t *occ; /* fn's occupancy cache (pdl_plan_get) */
} ats_plan;

template <int HD, typename KT, int ROWS>
static td_err ats_plan_of(ats_plan *pl, int dev, int sms, long long blocks, bool fold)
{
    static int opted[64]; /* per device: the dynamic shared memory limit was raised */
    const int optin = smem_optin_bytes(dev), per_sm = smem_sm_bytes(dev);
    if (optin < 2048)
        return TD_OK; /* nothing fits (or the device cannot be asked) */
    const size_t fixed = ats_fixed_bytes<HD, ROWS>(), kv = ats_kv_bytes<HD, KT>();
    /* static shared memory of the kernel, about 1 KB, is left room for */
    const size_t one = fixed + kv, two = fixed + 2 * kv, room = (size_t)optin - 2048;
    if (one > room)
        return TD_OK;
    pl->kv_sep = two <= room && (2 * (two + 2048) <= (size_t)per_sm || blocks < sms);
    pl->smem = pl->kv_sep ? two : one;
    static uint64_t occ[2][2][PDL_MAX_DEV]; /* per variant and layout (shared memory) */
    pl->fn = fold ? ats_kernel<HD, KT, true, ROWS> : ats_kernel<HD, KT, false, ROWS>;
    pl->occ = occ[fold ? 0 : 1][pl->kv_sep];
    if (dev >= 0 && dev < 64 && !opted[dev]) {
        const ats_fn fns[2] = {ats_kernel<HD, KT, true, ROWS>, ats_kernel<HD, KT, false, ROWS>};
        for (int i = 0; i < 2; i++) {
            CUDA_TRY(cudaFuncSetAttribute(fns[i], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          (int)room));
            /* all of the unified L1/shared memory as shared memory: two blocks fit per SM */
            CUDA_TRY(cudaFuncSetAttribute(fns[i], cudaFuncAttributePreferredSharedMemoryCarveout,
                                          100));
        }
        opted[dev] = 1;
    }
    return TD_OK;
}

template <int HD, typename KT>
static td_err ats_plan_rows(ats_plan *pl, int dev, int sms, long long blocks, bool fold, int rows)
{
    switch (rows) {
    case 2:
        return ats_plan_of<HD, KT, 2>(pl, dev, sms, blocks, fold);
    case 4:
        return ats_plan_of<HD, KT, 4>(pl, dev, sms, blocks, fold);
    case 8:
        return ats_plan_of<HD, KT, 8>(pl, dev, sms, blocks, fold);
    default:
        return ats_plan_of<HD, KT, 16>(pl, dev, sms, blocks, fold);
    }
}

/* rows: (query, head) rows per block, 2, 4, 8 or 16 */
static td_err ats_plan_for(ats_plan *pl, const ops_attn *a, int dev, int sms, long long blocks,
                           bool fold, int rows)
{
    pl->fn = NULL;
    pl->occ = NULL;
    pl->smem = 0;
    pl->kv_sep = 0;
    if (!att_rows_aligned(a) || dev >= 64)
        return TD_OK;
    const bool f16 = a->kv_type == TD_F16;
    switch (a->head_dim) {
    case 256:
        return f16 ? ats_plan_rows<256, __half>(pl, dev, sms, blocks, fold, rows)
                   : ats_plan_rows<256, float>(pl, dev, sms, blocks, fold, rows);
    case 128:
        return f16 ? ats_plan_rows<128, __half>(pl, dev, sms, blocks, fold, rows)
                   : ats_plan_rows<128, float>(pl, dev, sms, blocks, fold, rows);
    case 64:
        return f16 ? ats_plan_rows<64, __half>(pl, dev, sms, blocks, fold, rows)
                   : ats_plan_rows<64, float>(pl, dev, sms, blocks, fold, rows);
    default:
        return TD_OK;
    }
}

/* The staged kernel's grid z for row_blocks blocks of rows: one when the block folds all
 * splits itself, else about four blocks per SM, at most one per split. */
static long long ats_z(long long row_blocks, int64_t n_split, bool split, int sms)
{
    long long z = split ? (4LL * sms + row_blocks - 1) / row_blocks : 1;
    if (z > n_split)
        z = n_split;
    return z < 1 ? 1 : z;
}

/* (query, head) rows per block of the staged kernel: 16, or 8 when a kv head has no more;
 * with split partials, halved (down to 2) while the grid would leave SMs without a block
 * (a 1K-key decode of 6 rows per kv head: 4 x 8 blocks of 8 rows, 96 of 2, each a third of
 * the work and the same copies from L2). TANDEM_ATT_ROWS=2|4|8|16 forces a size, to
 * measure and to test (read on every call). The rows of a block never change a result. */
static int ats_rows(int64_t n_rows, int64_t n_head_kv, int64_t n_split, bool split, int sms)
{
    const char *e = getenv("TANDEM_ATT_ROWS");
    const int forced = e ? atoi(e) : 0;
    if (forced == 2 || forced == 4 || forced == 8 || forced == 16)
        return forced;
    int rows = n_rows <= 8 ? 8 : 16;
    while (split && rows > 2) {
        const long long rb = (n_rows + rows - 1) / rows * n_head_kv;
        if (rb * ats_z(rb, n_split, split, sms) >= sms)
            break;
        rows /= 2;
    }
    return rows;
}

/* The split path's partials: up to ATT_PART_KEEP bytes in one buffer per (device, stream)
 * (stream_buf.cuh), so a recorded decode or verify step has no allocation and free nodes
 * around its attention (either would make the launches next to it plain ones); more, or
 * while the stream is captured before its buffer exists, from the stream's pool as one
 * allocation per call. The buffer is made at its full size and never grows: growing frees
 * the old buffer, which a recorded step may still name. */
#define ATT_PART_KEEP ((size_t)16 << 20) /* a 32K-key decode of 24 heads of 256: 6.3 MB */
static stream_bufs g_part = STREAM_BUFS_INIT("attention: split partials");

static td_err att_part_get(float **part, void **pooled, size_t bytes, cudaStream_t st)
{
    *part = NULL;
    *pooled = NULL;
    if (bytes <= ATT_PART_KEEP) {
        TD_TRY(stream_buf_get(&g_part, st, ATT_PART_KEEP, false, (void **)part, NULL));
        if (*part)
            return TD_OK;
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone; /* the first call only */
        CUDA_TRY(cudaStreamIsCapturing(st, &cs));
        if (cs == cudaStreamCaptureStatusNone) {
            TD_TRY(stream_buf_get(&g_part, st, ATT_PART_KEEP, true, (void **)part, NULL));
            return TD_OK;
        }
    }
    TD_TRY(dev_scratch_alloc(pooled, bytes, st, "attention"));
    *part = (float *)*pooled;
    return TD_OK;
}

/* The tensor-core kernel for an f16 cache of head_dim 128 or 256 with 16-byte aligned rows
 * (and TANDEM_ATT_MMA not 0), where the device has the shared memory for 8 rows per block:
 * 8 (query, head) rows per block for a call of at most 8 rows per kv head (decode), else 16
 * (fewer where the shared memory is short; TANDEM_ATT_ROWS=8|16 forces one, as for the
 * staged kernel). Keys and values take one buffer in turn, so that two blocks share an SM
 * (H200, bench_attention_cuda: every case as fast or faster than with a buffer each, e.g.
 * a 32K decode 64 us against 98). The kernel depends only on head_dim, the cache type and
 * layout and the device, so a model's decode, verify and prefill calls all take it. */
/* The fold in chunks of splits (ATH_CHUNK), TANDEM_ATT_CHUNKS: off (the default: splits
 * fold one by one), split (a partial per split, the combine folds both levels), auto (a
 * partial per chunk where every block along the keys has a chunk), on (a partial per chunk
 * always). */
typedef enum att_chunks {
    ATT_CHUNKS_OFF,
    ATT_CHUNKS_SPLIT,
    ATT_CHUNKS_AUTO,
    ATT_CHUNKS_ON
} att_chunks;

static att_chunks att_chunks_mode(void)
{
    const char *e = getenv("TANDEM_ATT_CHUNKS");
    if (!e)
        return ATT_CHUNKS_OFF;
    return !strcmp(e, "split") ? ATT_CHUNKS_SPLIT
           : !strcmp(e, "auto") ? ATT_CHUNKS_AUTO
           : !strcmp(e, "on")   ? ATT_CHUNKS_ON
                                : ATT_CHUNKS_OFF;
}

typedef struct ath_plan {
    ath_fn fn;
    int rows;
    size_t smem;
    uint64_t *occ;
    int per_sm; /* blocks an SM holds at once */
    att_chunks chunks; /* the fold in chunks of splits fn runs (TANDEM_ATT_CHUNKS) */
} ath_plan;

template <int HD, int ROWS, bool FOLDS> static td_err ath_plan_of(ath_plan *pl, int dev)
{
    static int opted[64], per_sm[64];
    const size_t bytes = ath_geo<HD, ROWS>::FIXED + ath_geo<HD, ROWS>::KV;
    if (bytes + 2048 > (size_t)smem_optin_bytes(dev))
        return TD_OK;
    pl->fn = ath_kernel<HD, ROWS, FOLDS>;
    pl->rows = ROWS;
    pl->smem = bytes;
    static uint64_t occ[PDL_MAX_DEV];
    pl->occ = occ;
    if (!opted[dev]) {
        CUDA_TRY(cudaFuncSetAttribute(pl->fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
        CUDA_TRY(cudaFuncSetAttribute(pl->fn, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
        CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[dev], pl->fn, ATH_THREADS,
                                                               bytes));
        opted[dev] = 1;
    }
    pl->per_sm = per_sm[dev] > 0 ? per_sm[dev] : 1;
    return TD_OK;
}

template <int HD, bool FOLDS>
static td_err ath_plan_rows(ath_plan *pl, int dev, int64_t n_rows_kv)
{
    const char *e = getenv("TANDEM_ATT_ROWS");
    const int forced = e ? atoi(e) : 0;
    if (forced == 16 || (forced != 8 && n_rows_kv > 8)) {
        const td_err err = ath_plan_of<HD, 16, FOLDS>(pl, dev);
        if (err != TD_OK || pl->fn)
            return err;
    }
    return ath_plan_of<HD, 8, FOLDS>(pl, dev);
}

static td_err ath_plan_for(ath_plan *pl, const ops_attn *a, const att_args &p, int dev)
{
    memset(pl, 0, sizeof *pl);
    if (!att_mma_on() || a->kv_type != TD_F16 || dev >= 64 || !att_rows_aligned(a))
        return TD_OK;
    pl->chunks = att_chunks_mode();
    const bool folds = pl->chunks >= ATT_CHUNKS_AUTO;
    switch (a->head_dim) {
    case 256:
        return folds ? ath_plan_rows<256, true>(pl, dev, p.n_rows)
                     : ath_plan_rows<256, false>(pl, dev, p.n_rows);
    case 128:
        return folds ? ath_plan_rows<128, true>(pl, dev, p.n_rows)
                     : ath_plan_rows<128, false>(pl, dev, p.n_rows);
    default:
        return TD_OK;
    }
}

/* The partials' bytes one split call may have (TANDEM_ATT_SCRATCH_MAX, bytes, lowers it:
 * to test the cut below); above it a call runs as several, each for a range of queries. */
static size_t att_scratch_max(void)
{
    const char *e = getenv("TANDEM_ATT_SCRATCH_MAX");
    const long long v = e ? atoll(e) : 0;
    return v > 0 && (size_t)v < ATT_SCRATCH_MAX ? (size_t)v : ATT_SCRATCH_MAX;
}

/* Queries t0 .. t0 + n - 1 of a as a call of their own: their rows of q, the gate, positions,
 * tree bits and outputs (each query's result depends on nothing else). */
static ops_attn att_queries(const ops_attn *a, int64_t t0, int64_t n)
{
    ops_attn s = *a;
    s.n_q = n;
    s.q = a->q + t0 * a->q_tok_stride;
    if (a->gate)
        s.gate = a->gate + t0 * a->gate_tok_stride;
    s.q_pos = a->q_pos + t0;
    if (a->mask == OPS_MASK_TREE)
        s.tree_bits = a->tree_bits + t0 * ((a->n_tree + 63) / 64);
    s.out = a->out + t0 * a->n_head * a->head_dim;
    return s;
}

/* A kernel fn that hands one partial per split to the combine kernel, then the combine:
 * the partials in att_part_get's buffer. */
static td_err att_split_launch(void (*fn)(bool, att_args), dim3 grid, unsigned threads,
                               size_t smem, uint64_t *occ, att_args p, size_t part_bytes,
                               cudaStream_t st)
{
    void *pooled = NULL;
    TD_TRY(att_part_get(&p.part, &pooled, part_bytes, st));
    const pdl_plan pp = pdl_plan_get((const void *)fn, (uint64_t)grid.x * grid.y * grid.z,
                                     threads, smem, occ);
    const cudaError_t e = launch_ex(fn, grid, dim3(threads), smem, pp.pdl, st, pp.early, p);
    cuda_launch_note(1);
    td_err r = e == cudaSuccess ? att_combine_launch(p, st)
                                : err_set(TD_ECUDA, "attention launch: %s", cudaGetErrorString(e));
    dev_scratch_free(pooled, st);
    return r;
}

/* The tensor-core kernel for f16 caches, as several calls over ranges of queries where one
 * call's partials would pass att_scratch_max. A call's grid is about ATH_WAVES waves of
 * blocks where its splits allow (one block per split where they do not): each block walks
 * every z-th split (of the keys in use), so a call launched for a long cache but reading few
 * keys (a recorded step early in a sequence) has no thousands of blocks that return at once
 * (H200, bench_attention_cuda: a 16-query verify of 1K keys launched for a 32K cache took
 * 34.5 us against 23.4 launched for its keys), and a block splits its query rows once for
 * all its splits. Several waves, not one: a grid of one wave leaves SMs idle wherever the
 * row blocks do not divide it (a 64-query chunk's 96 row blocks: 192 of 264 slots), for the
 * whole of every block's walk. TANDEM_ATT_SPLIT_Z=N sets the blocks along the splits (at
 * most one per split), to test the walk. */
static td_err ath_run(const ath_plan &hp, const att_args &p, size_t part_bytes, cudaStream_t st,
                      int sms)
{
    const ops_attn *a = &p.a;
    const size_t per_q = part_bytes / (size_t)a->n_q;
    const size_t cap = att_scratch_max();
    const char *ez = getenv("TANDEM_ATT_SPLIT_Z");
    const long long forced_z = ez ? atoll(ez) : 0;
    const att_chunks chunks = hp.chunks;
    const int64_t step = per_q > 0 && cap / per_q < (size_t)a->n_q
                             ? (int64_t)(cap / per_q > 0 ? cap / per_q : 1)
                             : a->n_q;
    for (int64_t t0 = 0; t0 < a->n_q; t0 += step) {
        const int64_t n = a->n_q - t0 < step ? a->n_q - t0 : step;
        att_args ps = p;
        ps.a = att_queries(a, t0, n);
        ps.n_rows = n * p.group;
        ps.chunk = chunks == ATT_CHUNKS_OFF ? 1 : ATH_CHUNK;
        const int64_t row_blocks = (ps.n_rows + hp.rows - 1) / hp.rows * a->n_head_kv;
        const int64_t waves = ((int64_t)ATH_WAVES * hp.per_sm * sms + row_blocks / 2) / row_blocks;
        const int64_t want = forced_z > 0 ? (int64_t)forced_z : waves < 1 ? 1 : waves;
        const int64_t z = want < p.n_split ? want : p.n_split;
        /* partials per chunk once every block along the keys has a chunk to fold */
        ps.chunk_from = chunks == ATT_CHUNKS_ON     ? 0
                        : chunks == ATT_CHUNKS_AUTO ? z
                                                    : INT64_MAX;
        const dim3 grid((unsigned)((ps.n_rows + hp.rows - 1) / hp.rows), (unsigned)a->n_head_kv,
                        (unsigned)z);
        TD_TRY(att_split_launch(hp.fn, grid, ATH_THREADS, hp.smem, hp.occ, ps, per_q * (size_t)n,
                                st));
    }
    return TD_OK;
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
    p.round = ATT_COMBINE_ROUND; /* att_combine_launch sets the device's */
    p.chunk = 1;                 /* the tensor-core kernel of f16 caches folds in chunks */
    p.chunk_from = INT64_MAX;
    const long long tiles = (p.n_rows + ATT_ROWS - 1) / ATT_ROWS;
    if (tiles > INT32_MAX || a->n_head_kv > 65535 || p.n_split > 65535 ||
        a->n_q * a->n_head > INT32_MAX)
        return err_set(TD_ENOTSUP, "attention of %lld queries x %lld heads over %lld keys",
                       (long long)a->n_q, (long long)a->n_head, (long long)a->n_kv);

    /* One split per block when rows alone leave the GPU idle (decode, verify) and the
     * partials are small; else every block folds all its splits. Same results either way. */
    int dev = 0, sms = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    TD_TRY(sm_count(dev, &sms));
    const long long row_blocks = tiles * a->n_head_kv;
    const size_t part_bytes =
        (size_t)p.n_split * (size_t)(a->n_q * a->n_head) * (size_t)(a->head_dim + 2) * sizeof(float);
    int mt = 0;
    size_t atm_bytes = 0;
    uint64_t *atm_occ = NULL;
    const atm_fn atm = part_bytes <= ATT_SCRATCH_MAX
                           ? atm_plan(a, dev, p.n_rows, &mt, &atm_bytes, &atm_occ)
                           : NULL;
    if (atm) {
        const dim3 grid((unsigned)((p.n_rows + 16 * mt - 1) / (16 * mt)), (unsigned)a->n_head_kv,
                        (unsigned)p.n_split);
        return att_split_launch(atm, grid, ATM_THREADS, atm_bytes, atm_occ, p, part_bytes, st);
    }
    ath_plan hp;
    TD_TRY(ath_plan_for(&hp, a, p, dev));
    if (hp.fn)
        return ath_run(hp, p, part_bytes, st, sms);
    const bool split = p.n_split > 1 && row_blocks < 2LL * sms && part_bytes <= ATT_SCRATCH_MAX;
    /* staged kernel: rows per block, and splits beyond the grid's z taken by its blocks in
     * turn */
    const int rows = ats_rows(p.n_rows, a->n_head_kv, p.n_split, split, sms);
    const long long ats_tiles = (p.n_rows + rows - 1) / rows;
    const long long ats_row_blocks = ats_tiles * a->n_head_kv;
    const long long z = ats_z(ats_row_blocks, p.n_split, split, sms);
    ats_plan plan;
    TD_TRY(ats_plan_for(&plan, a, dev, sms, ats_row_blocks * z, !split, rows));
    void *pooled = NULL;
    if (split)
        TD_TRY(att_part_get(&p.part, &pooled, part_bytes, st));
    td_err r = TD_OK;
    if (plan.fn) {
        const dim3 grid((unsigned)ats_tiles, (unsigned)a->n_head_kv, (unsigned)z);
        const pdl_plan pp = pdl_plan_get((const void *)plan.fn,
                                         (uint64_t)grid.x * grid.y * grid.z, ATS_THREADS,
                                         plan.smem, plan.occ);
        const cudaError_t e = launch_ex(plan.fn, grid, dim3(ATS_THREADS), plan.smem, pp.pdl, st,
                                        pp.early, p, plan.kv_sep);
        cuda_launch_note(1);
        if (e != cudaSuccess)
            r = err_set(TD_ECUDA, "attention launch: %s", cudaGetErrorString(e));
    } else {
        const dim3 grid((unsigned)tiles, (unsigned)a->n_head_kv,
                        split ? (unsigned)p.n_split : 1u);
        const dim3 block(ATT_THREADS);
        switch (a->head_dim) {
        case 256:
            r = pdl_launch<att_kernel<256>>("attention", grid, block, 0, st, p);
            break;
        case 128:
            r = pdl_launch<att_kernel<128>>("attention", grid, block, 0, st, p);
            break;
        case 64:
            r = pdl_launch<att_kernel<64>>("attention", grid, block, 0, st, p);
            break;
        default:
            r = pdl_launch<att_kernel<0>>("attention", grid, block, 0, st, p);
            break;
        }
    }
    if (r == TD_OK && split)
        r = att_combine_launch(p, st);
    dev_scratch_free(pooled, st);
    return r;
}
