/* The sampler on the device (twins of cpu_sample_probs and cpu_sample_draw): the filtered
 * distribution p and a reproducible draw from it, without the logits leaving the GPU.
 *
 * cuda_sample_probs picks one of five paths by the settings; each gives the CPU's kept set
 * (up to rounding at a top-p boundary) and p within float rounding of the CPU's:
 * - greedy (temperature 0): one-hot argmax;
 * - top_k <= TOPK_MAX: radix-select the k candidates of each slice of the row, rank their
 *   union (select.cuh), then one thread walks them in the CPU's order and precision (f64,
 *   k small);
 * - top_p alone: the same walk over the row's best TOPK_MAX entries against the whole row's
 *   mass; where the kept set reaches further (a flat distribution), the row is cut by a
 *   select on the mass (value bins per slice, then the chosen bin's entries ranked in
 *   shared memory, or smp_mass_cut's radix select on their keys; integer masses, so the cut
 *   does not depend on the order of the sums; no sort, no wait of the host);
 * - a top_k above TOPK_MAX: a stable radix sort of the whole row (CUB) gives the CPU's walk
 *   order, then one block scans the sorted mass in f64 in a fixed order;
 * - otherwise (temperature, min_p): no order needed, the slices' sums in slice order.
 * Every pass but the sorted path's splits a row between blocks (select.cuh: split passes).
 * Per-token work in the cut, the sort and the dense path runs in f32 (f64 is slow on consumer
 * GPUs), sums meet in f64 in a fixed tree: p is deterministic and within ~1e-6 relative of
 * the CPU's.
 *
 * cuda_sample_draw uses the CPU's Philox number and cumulative rule with f64 sums of
 * 128-entry chunks, so it returns the CPU's token unless u * sum(p) lies within f64
 * rounding (~1e-16 relative) of a boundary between two tokens. */
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/select.cuh"

#define SAMPLE_THREADS 1024
#define SORT_ROWS 4 /* rows per radix sort of the sorted path (24 bytes of scratch per entry) */

/* exp((l - max) / temperature) as cpu's cand_e, in f32: 1 for the max itself (also +inf),
 * 0 for NaN. */
__device__ __forceinline__ float smp_e(float l, float mx, float inv_t)
{
    if (l == mx)
        return 1.0f;
    if (isnan(l))
        return 0.0f;
    return expf((l - mx) * inv_t);
}

__device__ __forceinline__ bool smp_bad_max(float mx)
{
    return isnan(mx) || mx == -INFINITY;
}

/* Inclusive prefix sum of v over the block, in a fixed order (Hillis-Steele); sh has
 * blockDim.x elements. Every thread must call it. */
__device__ double smp_block_scan(double v, double *sh)
{
    __syncthreads();
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned off = 1; off < blockDim.x; off <<= 1) {
        double add = threadIdx.x >= off ? sh[threadIdx.x - off] : 0.0;
        __syncthreads();
        v += add;
        sh[threadIdx.x] = v;
        __syncthreads();
    }
    return v;
}

/* Smallest v over the block (exact in any order; no NaN), none where a lane has no value;
 * sh: 33 elements. Every thread must call it. */
template <typename T> __device__ T smp_block_min(T v, T *sh, T none)
{
    for (int off = 16; off > 0; off >>= 1) {
        const T o = __shfl_xor_sync(DEV_FULL_MASK, v, off);
        v = o < v ? o : v;
    }
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : none;
        for (int off = 16; off > 0; off >>= 1) {
            const T o = __shfl_xor_sync(DEV_FULL_MASK, v, off);
            v = o < v ? o : v;
        }
        if (lane == 0)
            sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}

/* --- greedy and dense paths (split between blocks: select.cuh) ------------------------- */

/* After rs_argmax_launch put each row's best entry in best[]: block b, slice b % S of row
 * b / S. Temperature 0 (greedy) or a row with no finite logit: the slice of the one-hot row
 * or of zeros. Otherwise the slice's kept mass (every token, or with min_p those with e >=
 * min_p; the best has e = 1) in part[b], and the row's last block sums the slices in order
 * into kept[row]. */
__global__ void __launch_bounds__(RS_THREADS)
smp_dense_sum_kernel(float *p, const float *logits, int64_t n, int S, float inv_t, float min_p,
                     int greedy, const rs_best *best, double *part, double *kept,
                     unsigned *count)
{
    __shared__ double sh_d[33];
    const int64_t r = blockIdx.x / S;
    int64_t lo, hi;
    rs_slice(n, S, (int)(blockIdx.x % S), &lo, &hi);
    const rs_best b = best[r];
    const float *lr = logits + r * n + lo;
    float *pr = p + r * n + lo;
    if (smp_bad_max(b.v) || greedy) { /* the same for every block of the row */
        const bool bad = smp_bad_max(b.v);
        for (int64_t i = threadIdx.x; i < hi - lo; i += RS_THREADS)
            pr[i] = !bad && lo + i == b.i ? 1.0f : 0.0f;
        return;
    }
    float acc = 0;
    sel_for_each(lr, hi - lo, [&](int64_t i, float l) {
        const float e = smp_e(l, b.v, inv_t);
        if (e >= min_p || lo + i == b.i)
            acc += e;
    });
    double k;
    if (rs_row_sum(dev_block_sum((double)acc, sh_d), part, count, S, &k))
        kept[r] = k;
}

/* The kept entries' e / kept[row], the rest 0, over slice b % S of row b / S. */
__global__ void __launch_bounds__(RS_THREADS)
smp_dense_write_kernel(float *p, const float *logits, int64_t n, int S, float inv_t, float min_p,
                       int greedy, const rs_best *best, const double *kept)
{
    const int64_t r = blockIdx.x / S;
    int64_t lo, hi;
    rs_slice(n, S, (int)(blockIdx.x % S), &lo, &hi);
    const rs_best b = best[r];
    if (smp_bad_max(b.v) || greedy)
        return;
    const double k = kept[r];
    float *pr = p + r * n + lo;
    sel_for_each(logits + r * n + lo, hi - lo, [&](int64_t i, float l) {
        const float e = smp_e(l, b.v, inv_t);
        pr[i] = e >= min_p || lo + i == b.i ? (float)((double)e / k) : 0.0f;
    });
}

/* temperature 0: one-hot argmax; else the dense path (no order needed: the kept mass is
 * summed per slice and the slices in order). A row with no finite logit gives zeros. Three
 * launches of RS_SLICES(n) blocks per row. */
static td_err smp_dense_rows(float *p, const float *logits, int64_t rows, int64_t n, float inv_t,
                             float min_p, bool greedy, cudaStream_t st)
{
    const int S = rs_slices(n);
    for (int64_t r0 = 0; r0 < rows; r0 += RS_ROWS_MAX) {
        const int64_t m = rows - r0 < RS_ROWS_MAX ? rows - r0 : RS_ROWS_MAX;
        const size_t nb = (size_t)(m * S);
        unsigned *count = NULL;
        void *buf = NULL;
        TD_TRY(rs_scratch(st, (nb + (size_t)m) * (sizeof(rs_best) + sizeof(double)), &count,
                          &buf));
        rs_best *apart = (rs_best *)buf, *best = apart + nb;
        double *dpart = (double *)(best + m), *kept = dpart + nb;
        const float *lr = logits + r0 * n;
        float *pr = p + r0 * n;
        TD_TRY(rs_argmax_launch(best, NULL, lr, m, n, apart, count, st));
        smp_dense_sum_kernel<<<(unsigned)nb, RS_THREADS, 0, st>>>(pr, lr, n, S, inv_t, min_p,
                                                                  greedy, best, dpart, kept,
                                                                  count);
        CUDA_TRY_LAUNCH();
        if (!greedy) {
            smp_dense_write_kernel<<<(unsigned)nb, RS_THREADS, 0, st>>>(pr, lr, n, S, inv_t,
                                                                        min_p, greedy, best,
                                                                        kept);
            CUDA_TRY_LAUNCH();
        }
    }
    return TD_OK;
}

/* --- nucleus cut by mass ---------------------------------------------------------------- */

/* Shared memory of smp_mass_cut. */
typedef struct smp_cut_smem {
    unsigned long long mass[256]; /* integer mass of the bucket's entries per digit (the sum
                                     of the warps' own tables, SMP_CUT_WMASS) */
    unsigned cnt[256];            /* entries per digit */
    unsigned long long need;      /* mass still to take from the bucket */
    uint64_t prefix, mask;        /* the bucket: entries of value bin `bin` whose keys have
                                     (key & mask) == prefix */
    unsigned ncand;
    int bin, done;
} smp_cut_smem;

/* Dynamic shared memory of a block that may cut by mass: a table of masses per digit for
 * each warp. A 64-bit shared-memory atomic is a compare-and-swap loop, which 32 warps adding
 * to a few digits turn into a queue; a warp's own table needs no atomic at all. */
#define SMP_CUT_WMASS ((SAMPLE_THREADS / 32) * 256 * sizeof(unsigned long long))
static_assert((SAMPLE_THREADS / 32) * 256 * sizeof(unsigned short) <= 2 * TOPK_MAX * 8,
              "the warps' counts fit the candidates' shared memory");
static_assert((SAMPLE_THREADS / 32) * 256 <= sizeof(((sel_smem *)0)->cand),
              "the warps' owner bytes fit the selection's candidates");

/* wc[d] + c, saturating at 65535 (which still answers "none", "one" and "at most TOPK_MAX"
 * right once the warps' counts are added) */
__device__ __forceinline__ unsigned short smp_count_add(unsigned short w, unsigned c)
{
    const unsigned t = w + c;
    return (unsigned short)(t < 65535u ? t : 65535u);
}

/* Adds every lane's mass fx (< 2^46) to digit d (none: d < 0) of the warp's tables: wm the
 * masses, wc the counts; wo: the warp's 256 bytes of scratch. Shared-memory atomics queue
 * 32 warps on the few entries a pass fills (a 64-bit one is a compare-and-swap loop), and
 * __match_any_sync is slow, so: every lane writes its id to its digit's scratch byte, the
 * lane whose id stays adds its own mass; the rest (digits shared within the warp) go by
 * digit, their masses summed (two 23-bit halves, __reduce_add_sync) and added by one lane.
 * Every lane of the warp must call it. */
__device__ __forceinline__ void smp_hist_add(unsigned long long *wm, unsigned short *wc,
                                             unsigned char *wo, int d, unsigned long long fx)
{
    bool pend = d >= 0;
    if (!__ballot_sync(DEV_FULL_MASK, pend))
        return; /* most steps of a pass past the first: no entry of the bucket */
    const unsigned lane = threadIdx.x & 31;
    if (pend)
        wo[d] = (unsigned char)lane;
    __syncwarp();
    if (pend && wo[d] == lane) {
        wm[d] += fx;
        wc[d] = smp_count_add(wc[d], 1);
        pend = false;
    }
    __syncwarp();
    unsigned rem = __ballot_sync(DEV_FULL_MASK, pend);
    while (rem) {
        const int src = __ffs(rem) - 1;
        const int dl = __shfl_sync(DEV_FULL_MASK, d, src);
        const bool mine = pend && d == dl;
        const unsigned grp = __ballot_sync(DEV_FULL_MASK, mine);
        if (mine) {
            const unsigned lo = __reduce_add_sync(grp, (unsigned)(fx & 0x7fffffu));
            const unsigned hi = __reduce_add_sync(grp, (unsigned)(fx >> 23));
            if ((int)lane == src) {
                wm[dl] += ((unsigned long long)hi << 23) + lo;
                wc[dl] = smp_count_add(wc[dl], (unsigned)__popc(grp));
            }
        }
        rem &= ~grp;
        __syncwarp();
    }
}

/* Value bin (0..255) of a logit over [lo, mx] at 256 / (mx - lo) = inv_w per unit: never
 * smaller for a larger logit (a float subtraction, a product by a positive constant and a
 * truncation are monotonic), 0 for NaN, -inf and lo itself, so a bin is a range of sel_key. */
__device__ __forceinline__ int smp_bin(float l, float lo, float inv_w)
{
    if (!(l > lo))
        return 0;
    const float x = (l - lo) * inv_w;
    return x < 255.0f ? (int)x : 255;
}

/* The cut's integer mass of one entry is e * smp_cut_scale(n) truncated: n * 2^s < 2^62 and
 * s <= 45, so e * scale < 2^46 and the row's sum fits 62 bits. */
__device__ __forceinline__ float smp_cut_scale(int64_t n)
{
    const int lg = 64 - __clzll((unsigned long long)n);
    return ldexpf(1.0f, 62 - lg < 45 ? 62 - lg : 45);
}

/* smp_bin's inv_w for logits in [lo, mx]: one bin for a row of equal logits. */
__device__ __forceinline__ float smp_cut_inv_w(float mx, float lo)
{
    const float w = 256.0f / (mx - lo);
    return w < 3.0e38f ? w : 0.0f;
}

/* The largest digit d with cnt[d] > 0 and above + mass[d] >= need, above = the mass of the
 * larger digits (the lowest non-empty digit and above = 0 if none: a guard); *need becomes
 * need - above. */
__device__ __forceinline__ int smp_pick_digit(const unsigned long long *mass, const unsigned *cnt,
                                              unsigned long long *need)
{
    unsigned long long above = 0;
    int d = 255, low = -1;
    for (; d >= 0; d--) {
        if (!cnt[d])
            continue;
        low = d;
        if (above + mass[d] >= *need)
            break;
        above += mass[d];
    }
    if (d < 0)
        d = low, above = 0;
    *need -= above;
    return d;
}

/* The key where the running mass of c candidates (keys ck, masses cf; c <= TOPK_MAX, keys
 * distinct), taken in key order from the largest, first reaches need (the last key if it
 * never does): ranked into rk, rm (the rank of a key is the number of larger ones), walked
 * by thread 0, returned to every thread. out: a shared word. Every thread must call it. */
__device__ uint64_t smp_rank_walk(const uint64_t *ck, const unsigned long long *cf, int c,
                                  unsigned long long need, uint64_t *rk, unsigned long long *rm,
                                  uint64_t *out)
{
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
        const uint64_t kj = ck[j];
        int r = 0;
        for (int m = 0; m < c; m++)
            r += ck[m] > kj;
        rk[r] = kj;
        rm[r] = cf[j];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long cum = 0;
        int j = 0;
        for (; j < c - 1; j++) {
            cum += rm[j];
            if (cum >= need)
                break;
        }
        *out = rk[j];
    }
    __syncthreads();
    return *out;
}

/* The top-p cut of a row without sorting it: the kept set is every entry whose sel_key is
 * >= the returned key, i.e. the shortest prefix of cpu_topk's order whose mass reaches
 * top_p of the row's. Masses are integers, e (<= 1, f32 as the sorted path computes it)
 * scaled by 2^s and truncated, with n * 2^s < 2^62 and s <= 45: every sum is exact, so the
 * cut does not depend on the order in which the block adds them; it differs from the CPU's
 * f64 walk only where the mass before an entry lies within ~n 2^-s + f32 rounding of top_p
 * of the total. lo: the row's smallest finite logit (or mx).
 * A select on the mass: the first pass puts the entries in 256 bins of value between lo
 * and mx and takes the bin where the running mass (from the top) reaches top_p of the
 * total; a bin of at most TOPK_MAX entries is gathered into shared memory (ck, cf: keys
 * and masses, TOPK_MAX each), ranked and walked; a larger one (near-equal logits) is
 * narrowed by a radix select on its distinct 64-bit keys, 8 bits per pass from the top,
 * until one key is left. ck and cf (2 * TOPK_MAX * 8 bytes) also hold the warps' counts
 * during the passes (32 x 256 x 2 bytes); owner: 32 x 256 bytes. Every thread must call it. */
__device__ uint64_t smp_mass_cut(const float *logits, int64_t n, float mx, float lo, float inv_t,
                                 double top_p, smp_cut_smem *sm, unsigned long long *wmass,
                                 uint64_t *ck, unsigned long long *cf, unsigned char *owner)
{
    unsigned char *wo = owner + (threadIdx.x >> 5) * 256;
    const int nw = (int)(blockDim.x >> 5);
    unsigned long long *wm = wmass + (threadIdx.x >> 5) * 256;
    unsigned short *wcount = (unsigned short *)ck; /* the warps' counts, before the gather */
    unsigned short *wc = wcount + (threadIdx.x >> 5) * 256;
    const float scale = smp_cut_scale(n), inv_w = smp_cut_inv_w(mx, lo);
    __syncthreads(); /* sm may still be read by a previous call */
    if (threadIdx.x == 0) {
        sm->prefix = 0;
        sm->mask = 0;
        sm->done = 0;
        sm->ncand = 0;
        sm->bin = 0;
    }
    /* pass -1: value bins; then passes over the key bits of the chosen bin */
    for (int shift = 64;; shift -= 8) {
        for (int j = threadIdx.x; j < nw * 256; j += blockDim.x)
            wmass[j] = 0, wcount[j] = 0;
        __syncthreads();
        const uint64_t prefix = sm->prefix, mask = sm->mask;
        const int bin = sm->bin;
        sel_for_each_all(logits, n, [&](int64_t i, float l, bool in) {
            int d = -1;
            unsigned long long fx = 0;
            if (in) {
                const int b = smp_bin(l, lo, inv_w);
                if (shift == 64) {
                    d = b;
                } else {
                    const uint64_t key = sel_key(l, (uint32_t)i);
                    if (b == bin && (key & mask) == prefix)
                        d = (int)(key >> shift) & 255;
                }
                if (d >= 0)
                    fx = __float2ull_rz(smp_e(l, mx, inv_t) * scale);
            }
            smp_hist_add(wm, wc, wo, d, fx);
        });
        __syncthreads();
        for (int d = threadIdx.x; d < 256; d += blockDim.x) {
            unsigned long long m = 0;
            unsigned c = 0;
            for (int w2 = 0; w2 < nw; w2++)
                m += wmass[w2 * 256 + d], c += wcount[w2 * 256 + d];
            sm->mass[d] = m;
            sm->cnt[d] = c;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            if (shift == 64) {
                unsigned long long total = 0;
                for (int d = 0; d < 256; d++)
                    total += sm->mass[d];
                /* mass >= top_p * total for an integer mass: >= its ceiling */
                const double want = ceil(top_p * (double)total);
                sm->need = want < (double)total ? (unsigned long long)want : total;
            }
            unsigned long long need = sm->need;
            const int d = smp_pick_digit(sm->mass, sm->cnt, &need);
            sm->need = need;
            if (shift == 64) {
                sm->bin = d;
                sm->done = sm->cnt[d] <= TOPK_MAX ? 2 : 0; /* 2: gather the bin */
            } else {
                sm->prefix |= (uint64_t)d << shift;
                sm->mask |= (uint64_t)255 << shift;
                sm->done = sm->cnt[d] <= 1 || shift == 0; /* keys are distinct */
            }
        }
        __syncthreads();
        if (sm->done)
            break;
    }
    if (sm->done == 1)
        return sm->prefix; /* the bucket's one key is >= it, every key below the bucket < it */

    /* the bin's entries into shared memory, ranked by key (distinct: the rank of a key is
     * the number of larger ones), then walked in that order by one thread */
    const int bin = sm->bin;
    sel_for_each(logits, n, [&](int64_t i, float l) {
        if (smp_bin(l, lo, inv_w) == bin) {
            const unsigned pos = atomicAdd(&sm->ncand, 1u);
            ck[pos] = sel_key(l, (uint32_t)i);
            cf[pos] = __float2ull_rz(smp_e(l, mx, inv_t) * scale);
        }
    });
    __syncthreads();
    return smp_rank_walk(ck, cf, (int)sm->ncand, sm->need, (uint64_t *)wmass, wmass + TOPK_MAX,
                         &sm->prefix);
}

/* --- small top-k and nucleus paths (split between blocks: select.cuh) ------------------ */

/* A row of the nucleus path (top_p alone): its mass, and whether smp_cut_kernel cuts it. */
typedef struct smp_row {
    double whole; /* the row's mass */
    float mx, lo; /* its best and smallest finite logits */
    int64_t best; /* the best entry */
    int cut;      /* 1: cut by mass */
} smp_row;

/* top_p alone, before the selection: block b sums the mass of slice b % S of row b / S (its
 * best entry in rbest) and finds its smallest finite logit; the row's last block puts the
 * row's mass (the slices' sums in order), smallest logit and best entry in info[row], and
 * marks the row to be cut by mass when top_p of its mass exceeds k: every e is at most 1, so
 * a walk over the k best cannot reach it (a flat row skips the selection). */
__global__ void __launch_bounds__(SAMPLE_THREADS)
smp_mass_kernel(const float *logits, int64_t n, int S, int k, float inv_t, double top_p,
                const rs_best *rbest, double *mpart, float *lpart, smp_row *info,
                unsigned *count)
{
    __shared__ double sh_d[33];
    __shared__ float sh_v[33];
    const int64_t r = blockIdx.x / S;
    int64_t lo, hi;
    rs_slice(n, S, (int)(blockIdx.x % S), &lo, &hi);
    const rs_best b0 = rbest[r];
    if (smp_bad_max(b0.v)) { /* the same for every block of the row: p is zeros */
        if (blockIdx.x % S == 0 && threadIdx.x == 0)
            info[r] = smp_row{0.0, b0.v, 0.0f, b0.i, 0};
        return;
    }
    float part = 0, low = b0.v;
    sel_for_each(logits + r * n + lo, hi - lo, [&](int64_t, float l) {
        part += smp_e(l, b0.v, inv_t);
        low = isfinite(l) && l < low ? l : low;
    });
    const double m = dev_block_sum((double)part, sh_d);
    const float lw = smp_block_min(low, sh_v, INFINITY);
    if (threadIdx.x == 0) {
        mpart[blockIdx.x] = m;
        lpart[blockIdx.x] = lw;
    }
    if (!rs_last(&count[r], S) || threadIdx.x != 0)
        return;
    double whole = 0;
    float lowest = INFINITY;
    for (int j = 0; j < S; j++) {
        whole += __ldcg(&mpart[r * S + j]);
        const float l = __ldcg(&lpart[r * S + j]);
        lowest = l < lowest ? l : lowest;
    }
    info[r] = smp_row{whole, b0.v, lowest, b0.i, top_p * whole > (double)k ? 1 : 0};
}

/* Block b: slice b % S of row b / S of p and logits [rows][n]. Each block zeroes its slice
 * of p and selects the slice's k best keys (the row's k best are among the S slices' k
 * best) into cand. The row's last block ranks the S * k keys in their union (keys are
 * distinct: a key's rank is the number of larger ones, counted by a binary search of every
 * other slice's list, held in dynamic shared memory) and walks the row's k best as the CPU
 * walks them. NUCLEUS false: the total is the candidates' mass. NUCLEUS (top_p alone, k =
 * TOPK_MAX or n, after smp_mass_kernel): a row info marks to be cut returns at once; else
 * the total is the row's mass in info; the kept set is a prefix of the CPU's order, so when
 * the candidates reach top_p of the total it lies among them and the walk is the CPU's;
 * else (a flat row) info asks smp_cut_kernel to cut the row by mass. */
template <bool NUCLEUS>
__global__ void __launch_bounds__(SAMPLE_THREADS)
smp_topk_kernel(float *p, const float *logits, int64_t n, int S, int k, double inv_t,
                double top_p, double min_p, uint64_t *cand, smp_row *info, unsigned *count)
{
    extern __shared__ uint64_t smp_lists[]; /* the last block: the S slices' keys */
    __shared__ sel_smem sm;
    __shared__ uint64_t keys[TOPK_MAX];
    __shared__ double e[TOPK_MAX];
    __shared__ double kept_sum;
    __shared__ int keep;
    const int64_t r = blockIdx.x / S;
    if (NUCLEUS && info[r].cut) /* the same for every block of the row */
        return;
    int64_t lo, hi;
    rs_slice(n, S, (int)(blockIdx.x % S), &lo, &hi);
    const float *lr = logits + r * n;
    float *pr = p + r * n;
    for (int64_t i = lo + threadIdx.x; i < hi; i += SAMPLE_THREADS)
        pr[i] = 0;
    sel_topk_block(lr + lo, hi - lo, k, &sm, keys, (uint32_t)lo);
    for (int j = threadIdx.x; j < k; j += SAMPLE_THREADS)
        cand[(size_t)blockIdx.x * (size_t)k + (size_t)j] = keys[j];
    if (!rs_last(&count[r], S))
        return;

    const int nk = S * k;
    for (int j = threadIdx.x; j < nk; j += SAMPLE_THREADS)
        smp_lists[j] = __ldcg(&cand[(size_t)r * (size_t)nk + (size_t)j]);
    __syncthreads();
    rs_merge_top(smp_lists, S, k, keys);
    const double whole = NUCLEUS ? info[r].whole : 0.0;
    const uint32_t best = sel_key_index(keys[0]);
    const float mx = lr[best];
    const bool bad = smp_bad_max(mx);
    if (!bad)
        for (int j = threadIdx.x; j < k; j += SAMPLE_THREADS) {
            const float l = lr[sel_key_index(keys[j])];
            e[j] = l == mx ? 1.0 : isnan(l) ? 0.0 : exp(((double)l - mx) * inv_t);
        }
    __syncthreads();
    if (threadIdx.x == 0 && !bad) {
        /* the CPU's walk, in its order and precision: top-k order, top-p prefix, min_p */
        double total = whole;
        if (!NUCLEUS)
            for (int j = 0; j < k; j++)
                total += e[j];
        int m = NUCLEUS ? -1 : k;
        if (top_p < 1) {
            double cum = 0;
            for (int j = 0; j < k; j++) {
                cum += e[j];
                if (cum >= top_p * total) {
                    m = j + 1;
                    break;
                }
            }
        }
        /* min_p keeps a subset of the prefix: mark dropped entries with e = -1 */
        double kept = 0;
        for (int j = 0; j < m; j++) {
            if (min_p > 0 && !(e[j] >= min_p) && sel_key_index(keys[j]) != best)
                e[j] = -1;
            else
                kept += e[j];
        }
        keep = m;
        kept_sum = kept;
    }
    __syncthreads();
    if (NUCLEUS && !bad && keep < 0) { /* the walk fell short of top_p of the whole row */
        if (threadIdx.x == 0)
            info[r].cut = 1;
        return;
    }
    if (bad) /* p is zeros */
        return;
    for (int j = threadIdx.x; j < keep; j += SAMPLE_THREADS)
        if (e[j] >= 0)
            pr[sel_key_index(keys[j])] = (float)(e[j] / kept_sum);
}

/* The cut by mass of the rows info marks (top_p alone, flat rows), split between blocks
 * like the rest: the value-bin pass of smp_mass_cut per slice (its integer masses make the
 * slices' tables add up exactly, in any order); when the chosen bin holds more than
 * TOPK_MAX entries (a row of near-normal logits puts thousands in its middle bins) a second
 * pass cuts that bin's value range into 256 (smp_bin2); then the entries of the chosen
 * (sub-)bin are gathered from every slice (positions by a global atomic: the order is
 * undone by the ranking) and one block ranks and walks them. A sub-bin still too large
 * (near-equal logits) is narrowed by one block running smp_mass_cut over the row. Then the
 * kept mass and p per slice. */
typedef struct smp_cutrow {
    unsigned long long need; /* mass still to take from the (sub-)bin */
    uint64_t thresh;         /* the kept set: keys >= thresh */
    double kept;             /* its mass */
    unsigned ncand;          /* the (sub-)bin's entries gathered so far */
    int bin, bin1;           /* the chosen bin and sub-bin */
    int stage;               /* SMP_GATHER, SMP_SUBBIN, SMP_GATHER2 or SMP_RADIX */
} smp_cutrow;

enum {
    SMP_GATHER,  /* gather the bin */
    SMP_SUBBIN,  /* the bin is too large: its sub-bins */
    SMP_GATHER2, /* gather the sub-bin */
    SMP_RADIX,   /* the sub-bin is too large: smp_radix_cut_kernel */
};

/* The sub-bin (0..255) of a logit of value bin d0 (smp_bin(l, lo, inv_w) == d0): the bin's
 * range cut into 256, never smaller for a larger logit, as smp_bin. */
__device__ __forceinline__ int smp_bin2(float l, float lo, float inv_w, int d0)
{
    if (!(l > lo))
        return 0;
    const float x = ((l - lo) * inv_w - (float)d0) * 256.0f;
    return x <= 0.0f ? 0 : x < 255.0f ? (int)x : 255;
}

/* Block b: slice b % S of row b / S. SUB false: the value bins of the slice; SUB (rows whose
 * bin was too large): the sub-bins of the chosen bin's entries. Per-warp tables summed into
 * the block's tmass / tcnt [blocks][256]; the row's last block sums the slices' tables and
 * picks the (sub-)bin where the mass from the top reaches top_p of the row's integer mass
 * (smp_mass_cut's pass -1, then one more level). */
template <bool SUB>
__global__ void __launch_bounds__(SAMPLE_THREADS)
smp_bins_kernel(const float *logits, int64_t n, int S, float inv_t, double top_p,
                const smp_row *info, unsigned long long *tmass, unsigned *tcnt,
                smp_cutrow *crow, unsigned *count)
{
    extern __shared__ unsigned long long smp_wmass[]; /* SMP_CUT_WMASS bytes */
    __shared__ unsigned short wcount[(SAMPLE_THREADS / 32) * 256];
    __shared__ unsigned char owner[(SAMPLE_THREADS / 32) * 256];
    __shared__ unsigned long long mass[256];
    __shared__ unsigned cnt[256];
    const int64_t r = blockIdx.x / S;
    const smp_row ri = info[r];
    if (!ri.cut || (SUB && crow[r].stage != SMP_SUBBIN)) /* the same for the row's blocks */
        return;
    int64_t lo, hi;
    rs_slice(n, S, (int)(blockIdx.x % S), &lo, &hi);
    const float scale = smp_cut_scale(n), inv_w = smp_cut_inv_w(ri.mx, ri.lo);
    const float mx = ri.mx, low = ri.lo;
    const int bin = SUB ? crow[r].bin : 0;
    const int nw = SAMPLE_THREADS / 32;
    unsigned long long *wm = smp_wmass + (threadIdx.x >> 5) * 256;
    unsigned short *wc = wcount + (threadIdx.x >> 5) * 256;
    unsigned char *wo = owner + (threadIdx.x >> 5) * 256;
    for (int j = threadIdx.x; j < nw * 256; j += SAMPLE_THREADS)
        smp_wmass[j] = 0, wcount[j] = 0;
    __syncthreads();
    sel_for_each_all(logits + r * n + lo, hi - lo, [&](int64_t, float l, bool in) {
        int d = -1;
        unsigned long long fx = 0;
        if (in) {
            d = smp_bin(l, low, inv_w);
            if (SUB)
                d = d == bin ? smp_bin2(l, low, inv_w, bin) : -1;
            if (d >= 0)
                fx = __float2ull_rz(smp_e(l, mx, inv_t) * scale);
        }
        smp_hist_add(wm, wc, wo, d, fx);
    });
    __syncthreads();
    for (int d = threadIdx.x; d < 256; d += SAMPLE_THREADS) {
        unsigned long long m = 0;
        unsigned c = 0;
        for (int w2 = 0; w2 < nw; w2++)
            m += smp_wmass[w2 * 256 + d], c += wcount[w2 * 256 + d];
        tmass[(size_t)blockIdx.x * 256 + d] = m;
        tcnt[(size_t)blockIdx.x * 256 + d] = c;
    }
    if (!rs_last(&count[r], S))
        return;
    for (int d = threadIdx.x; d < 256; d += SAMPLE_THREADS) {
        unsigned long long m = 0;
        unsigned c = 0;
        for (int j = 0; j < S; j++) {
            m += __ldcg(&tmass[(size_t)(r * S + j) * 256 + d]);
            c += __ldcg(&tcnt[(size_t)(r * S + j) * 256 + d]);
        }
        mass[d] = m;
        cnt[d] = c;
    }
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    if (SUB) {
        unsigned long long need = crow[r].need;
        const int d = smp_pick_digit(mass, cnt, &need);
        crow[r].need = need;
        crow[r].bin1 = d;
        crow[r].stage = cnt[d] <= TOPK_MAX ? SMP_GATHER2 : SMP_RADIX;
        return;
    }
    unsigned long long total = 0;
#pragma unroll 1
    for (int d = 0; d < 256; d++)
        total += mass[d];
    /* mass >= top_p * total for an integer mass: >= its ceiling */
    const double want = ceil(top_p * (double)total);
    unsigned long long need = want < (double)total ? (unsigned long long)want : total;
    const int d = smp_pick_digit(mass, cnt, &need);
    crow[r] = smp_cutrow{need, 0, 0.0, 0u, d, 0, cnt[d] <= TOPK_MAX ? SMP_GATHER : SMP_SUBBIN};
}

/* Block b: the entries of the chosen bin in slice b % S of row b / S into the row's TOPK_MAX
 * keys and masses (ckeys, cmass); the row's last block ranks and walks them into the row's
 * threshold. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
smp_gather_kernel(const float *logits, int64_t n, int S, float inv_t, const smp_row *info,
                  smp_cutrow *crow, uint64_t *ckeys, unsigned long long *cmass,
                  unsigned *count)
{
    __shared__ uint64_t ck[TOPK_MAX], rk[TOPK_MAX];
    __shared__ unsigned long long cf[TOPK_MAX], rm[TOPK_MAX];
    __shared__ uint64_t out;
    const int64_t r = blockIdx.x / S;
    const smp_row ri = info[r];
    const int stage = crow[r].stage;
    if (!ri.cut || (stage != SMP_GATHER && stage != SMP_GATHER2)) /* the same for the row */
        return;
    int64_t lo, hi;
    rs_slice(n, S, (int)(blockIdx.x % S), &lo, &hi);
    const float scale = smp_cut_scale(n), inv_w = smp_cut_inv_w(ri.mx, ri.lo);
    const int bin = crow[r].bin, bin1 = stage == SMP_GATHER2 ? crow[r].bin1 : -1;
    uint64_t *keys = ckeys + (size_t)r * TOPK_MAX;
    unsigned long long *masses = cmass + (size_t)r * TOPK_MAX;
    sel_for_each(logits + r * n + lo, hi - lo, [&](int64_t i, float l) {
        if (smp_bin(l, ri.lo, inv_w) == bin &&
            (bin1 < 0 || smp_bin2(l, ri.lo, inv_w, bin) == bin1)) {
            const unsigned pos = atomicAdd(&crow[r].ncand, 1u);
            keys[pos] = sel_key(l, (uint32_t)(lo + i));
            masses[pos] = __float2ull_rz(smp_e(l, ri.mx, inv_t) * scale);
        }
    });
    if (!rs_last(&count[r], S))
        return;
    const int c = (int)__ldcg(&crow[r].ncand);
    for (int j = threadIdx.x; j < c; j += SAMPLE_THREADS)
        ck[j] = __ldcg(&keys[j]), cf[j] = __ldcg(&masses[j]);
    __syncthreads();
    const uint64_t t = smp_rank_walk(ck, cf, c, crow[r].need, rk, rm, &out);
    if (threadIdx.x == 0)
        crow[r].thresh = t;
}

/* Block b: row b, when its sub-bin was too large to gather: smp_mass_cut over the row. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
smp_radix_cut_kernel(const float *logits, int64_t n, float inv_t, double top_p,
                     const smp_row *info, smp_cutrow *crow)
{
    extern __shared__ unsigned long long smp_wmass[]; /* SMP_CUT_WMASS bytes */
    __shared__ sel_smem sm;
    __shared__ smp_cut_smem cut;
    __shared__ uint64_t ke[2 * TOPK_MAX]; /* the cut's counts and candidates */
    const smp_row ri = info[blockIdx.x];
    if (!ri.cut || crow[blockIdx.x].stage != SMP_RADIX)
        return;
    const uint64_t t = smp_mass_cut(logits + (size_t)blockIdx.x * (size_t)n, n, ri.mx, ri.lo,
                                    inv_t, top_p, &cut, smp_wmass, ke,
                                    (unsigned long long *)(ke + TOPK_MAX),
                                    (unsigned char *)sm.cand);
    if (threadIdx.x == 0)
        crow[blockIdx.x].thresh = t;
}

/* An entry a cut row keeps: key at or above the threshold and, with min_p, e >= min_p or
 * the best. */
__device__ __forceinline__ bool smp_cut_keeps(float l, int64_t i, float e, uint64_t thresh,
                                              double min_p, int64_t best)
{
    return sel_key(l, (uint32_t)i) >= thresh && ((double)e >= min_p || i == best);
}

/* Block b: slice b % S of a cut row b / S. WRITE false: its kept mass (f32 per thread, the
 * block's f64 tree), the row's last block adding the slices in order; WRITE: its p, kept
 * entries e / kept and the rest 0. */
template <bool WRITE>
__global__ void __launch_bounds__(SAMPLE_THREADS)
smp_cut_pass_kernel(float *p, const float *logits, int64_t n, int S, float inv_t, double min_p,
                    const smp_row *info, smp_cutrow *crow, double *part, unsigned *count)
{
    __shared__ double sh_d[33];
    const int64_t r = blockIdx.x / S;
    const smp_row ri = info[r];
    if (!ri.cut)
        return;
    int64_t lo, hi;
    rs_slice(n, S, (int)(blockIdx.x % S), &lo, &hi);
    const uint64_t thresh = crow[r].thresh;
    const double kept = WRITE ? crow[r].kept : 1.0;
    float *pr = p + r * n + lo;
    float acc = 0;
    sel_for_each(logits + r * n + lo, hi - lo, [&](int64_t i, float l) {
        const float e = smp_e(l, ri.mx, inv_t);
        const bool in = smp_cut_keeps(l, lo + i, e, thresh, min_p, ri.best);
        if (WRITE)
            pr[i] = in ? (float)((double)e / kept) : 0.0f;
        else if (in)
            acc += e;
    });
    double k;
    if (!WRITE && rs_row_sum(dev_block_sum((double)acc, sh_d), part, count, S, &k))
        crow[r].kept = k;
}

#define SMP_LISTS ((size_t)RS_SLICES_MAX * TOPK_MAX * sizeof(uint64_t))

/* The small top-k path (k = top_k <= TOPK_MAX) or, nucleus, top_p alone (k = the best
 * TOPK_MAX): rows rows of logits [rows][n] into p, RS_ROWS_WIDE rows per launch. No wait
 * of the host. */
static td_err smp_topk_rows(float *p, const float *logits, int64_t rows, int64_t n, int k,
                            bool nucleus, const ops_sampler *s, cudaStream_t st)
{
    const int S = rs_slices(n);
    const double inv_t = 1.0 / (double)s->temperature;
    const float inv_tf = (float)inv_t;
    int dev = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    if (nucleus) {
        TD_TRY(smem_optin<smp_topk_kernel<true>>(dev, SMP_LISTS));
        TD_TRY(smem_optin<smp_bins_kernel<false>>(dev, SMP_CUT_WMASS));
        TD_TRY(smem_optin<smp_bins_kernel<true>>(dev, SMP_CUT_WMASS));
        TD_TRY(smem_optin<smp_radix_cut_kernel>(dev, SMP_CUT_WMASS));
    } else {
        TD_TRY(smem_optin<smp_topk_kernel<false>>(dev, SMP_LISTS));
    }
    for (int64_t r0 = 0; r0 < rows; r0 += RS_ROWS_WIDE) {
        const int64_t m = rows - r0 < RS_ROWS_WIDE ? rows - r0 : RS_ROWS_WIDE;
        const size_t nb = (size_t)(m * S), mr = (size_t)m;
        /* scratch: argmax partials and rows, candidate lists, mass and bin tables per block,
         * the cut's candidates per row, the rows' records, the smallest logits */
        const size_t bytes = (nb + mr) * sizeof(rs_best) + nb * (size_t)k * sizeof(uint64_t) +
                             nb * sizeof(double) + nb * 256 * (sizeof(unsigned long long) + 4) +
                             mr * TOPK_MAX * 16 + mr * (sizeof(smp_row) + sizeof(smp_cutrow)) +
                             nb * sizeof(float);
        unsigned *count = NULL;
        void *buf = NULL;
        TD_TRY(rs_scratch(st, bytes, &count, &buf));
        rs_best *apart = (rs_best *)buf, *best = apart + nb;
        uint64_t *cand = (uint64_t *)(best + m);
        double *mpart = (double *)(cand + nb * (size_t)k);
        unsigned long long *tmass = (unsigned long long *)(mpart + nb);
        uint64_t *ckeys = (uint64_t *)(tmass + nb * 256);
        unsigned long long *cmass = (unsigned long long *)(ckeys + mr * TOPK_MAX);
        smp_row *info = (smp_row *)(cmass + mr * TOPK_MAX);
        smp_cutrow *crow = (smp_cutrow *)(info + m);
        unsigned *tcnt = (unsigned *)(crow + m);
        float *lpart = (float *)(tcnt + nb * 256);
        const float *lr = logits + r0 * n;
        float *pr = p + r0 * n;
        const size_t lists = (size_t)S * (size_t)k * sizeof(uint64_t);
        const double top_p = (double)s->top_p, min_p = (double)s->min_p;
        if (!nucleus) {
            smp_topk_kernel<false><<<(unsigned)nb, SAMPLE_THREADS, lists, st>>>(
                pr, lr, n, S, k, inv_t, top_p, min_p, cand, NULL, count);
            CUDA_TRY_LAUNCH();
            continue;
        }
        TD_TRY(rs_argmax_launch(best, NULL, lr, m, n, apart, count, st));
        smp_mass_kernel<<<(unsigned)nb, SAMPLE_THREADS, 0, st>>>(lr, n, S, k, inv_tf, top_p, best,
                                                                 mpart, lpart, info, count);
        CUDA_TRY_LAUNCH();
        smp_topk_kernel<true><<<(unsigned)nb, SAMPLE_THREADS, lists, st>>>(
            pr, lr, n, S, k, inv_t, top_p, min_p, cand, info, count);
        CUDA_TRY_LAUNCH();
        smp_bins_kernel<false><<<(unsigned)nb, SAMPLE_THREADS, SMP_CUT_WMASS, st>>>(
            lr, n, S, inv_tf, top_p, info, tmass, tcnt, crow, count);
        CUDA_TRY_LAUNCH();
        smp_bins_kernel<true><<<(unsigned)nb, SAMPLE_THREADS, SMP_CUT_WMASS, st>>>(
            lr, n, S, inv_tf, top_p, info, tmass, tcnt, crow, count);
        CUDA_TRY_LAUNCH();
        smp_gather_kernel<<<(unsigned)nb, SAMPLE_THREADS, 0, st>>>(lr, n, S, inv_tf, info, crow,
                                                                   ckeys, cmass, count);
        CUDA_TRY_LAUNCH();
        smp_radix_cut_kernel<<<(unsigned)m, SAMPLE_THREADS, SMP_CUT_WMASS, st>>>(
            lr, n, inv_tf, top_p, info, crow);
        CUDA_TRY_LAUNCH();
        smp_cut_pass_kernel<false><<<(unsigned)nb, SAMPLE_THREADS, 0, st>>>(
            pr, lr, n, S, inv_tf, min_p, info, crow, mpart, count);
        CUDA_TRY_LAUNCH();
        smp_cut_pass_kernel<true><<<(unsigned)nb, SAMPLE_THREADS, 0, st>>>(
            pr, lr, n, S, inv_tf, min_p, info, crow, mpart, count);
        CUDA_TRY_LAUNCH();
    }
    return TD_OK;
}

/* --- sorted path ----------------------------------------------------------------------- */

/* Keys of rows rows of logits [rows][n]: the upper word of sel_key (larger for a better logit,
 * NaN lowest, -0 as +0) under rows - 1 - r in the bits above, so a stable descending sort of
 * all rows at once leaves each row's entries together, row 0 first, with lower ids first
 * among equal logits: cpu_topk's order per row. ids: the index within the row. */
__global__ void smp_keys_kernel(uint64_t *keys, int32_t *ids, const float *logits, int64_t rows,
                                int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * n)
        return;
    const int64_t r = i / n;
    keys[i] = ((uint64_t)(rows - 1 - r) << 32) | (sel_key(logits[i], 0) >> 32);
    ids[i] = (int32_t)(i - r * n);
}

/* Walks the sorted row: total of the first kc, top-p prefix by a block scan in f64, min_p.
 * Block b: row b of p, logits and ids [grid][n]. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
smp_sorted_kernel(float *p, const float *logits, const int32_t *ids, int64_t n, int64_t kc,
                  float inv_t, double top_p, float min_p)
{
    p += (size_t)blockIdx.x * (size_t)n;
    logits += (size_t)blockIdx.x * (size_t)n;
    ids += (size_t)blockIdx.x * (size_t)n;
    __shared__ double scan[SAMPLE_THREADS];
    __shared__ double sh_d[33];
    __shared__ int64_t sh_i[33];
    const int64_t best = ids[0];
    const float mx = logits[best];
    for (int64_t i = threadIdx.x; i < n; i += SAMPLE_THREADS)
        p[i] = 0;
    if (smp_bad_max(mx))
        return;
    float part = 0;
    for (int64_t j = threadIdx.x; j < kc; j += SAMPLE_THREADS)
        part += smp_e(logits[ids[j]], mx, inv_t);
    const double total = dev_block_sum((double)part, sh_d);

    int64_t keep = kc;
    if (top_p < 1) {
        /* sorted entries in chunks of one per thread: the first with cum >= top_p * total */
        const double target = top_p * total;
        double carry = 0;
        for (int64_t base = 0; base < kc; base += SAMPLE_THREADS) {
            const int64_t j = base + threadIdx.x;
            const double v = j < kc ? (double)smp_e(logits[ids[j]], mx, inv_t) : 0.0;
            const double incl = smp_block_scan(v, scan);
            const double chunk = scan[SAMPLE_THREADS - 1];
            const int64_t hit = smp_block_min(j < kc && carry + incl >= target ? j : INT64_MAX,
                                              sh_i, INT64_MAX);
            if (hit != INT64_MAX) {
                keep = hit + 1;
                break;
            }
            carry += chunk;
        }
    }
    float kpart = 0;
    for (int64_t j = threadIdx.x; j < keep; j += SAMPLE_THREADS) {
        const float ej = smp_e(logits[ids[j]], mx, inv_t);
        if (ej >= min_p || ids[j] == best)
            kpart += ej;
    }
    const double kept = dev_block_sum((double)kpart, sh_d); /* also orders the zeroing first */
    for (int64_t j = threadIdx.x; j < keep; j += SAMPLE_THREADS) {
        const float ej = smp_e(logits[ids[j]], mx, inv_t);
        if (ej >= min_p || ids[j] == best)
            p[ids[j]] = (float)((double)ej / kept);
    }
}

static size_t smp_align(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

/* The sorted path for rows rows of logits [rows][n]: one radix sort of every row's keys
 * (smp_keys_kernel), then a block per row walks its sorted entries. */
static td_err smp_sorted(float *p, const float *logits, int64_t rows, int64_t n, int64_t kc,
                         float inv_t, double top_p, float min_p, cudaStream_t st)
{
    const int64_t items = rows * n;
    if (items > INT32_MAX)
        return err_set(TD_ENOTSUP, "sampler over %lld rows of %lld tokens: more than one sort "
                       "takes", (long long)rows, (long long)n);
    int end_bit = 32; /* the key bits that differ: the logit word and the row number */
    while (end_bit < 64 && (uint64_t)(rows - 1) >> (end_bit - 32))
        end_bit++;
    const size_t karr = smp_align((size_t)items * 8), iarr = smp_align((size_t)items * 4);
    size_t temp = 0;
    CUDA_TRY(cub::DeviceRadixSort::SortPairsDescending(
        NULL, temp, (const uint64_t *)NULL, (uint64_t *)NULL, (const int32_t *)NULL,
        (int32_t *)NULL, (int)items, 0, end_bit, st));
    char *ws = NULL;
    TD_TRY(dev_scratch_alloc((void **)&ws, 2 * karr + 2 * iarr + smp_align(temp), st,
                             "sampler sort"));
    uint64_t *keys_in = (uint64_t *)ws, *keys_out = (uint64_t *)(ws + karr);
    int32_t *ids_in = (int32_t *)(ws + 2 * karr), *ids_out = (int32_t *)(ws + 2 * karr + iarr);
    smp_keys_kernel<<<cuda_blocks(items, 256), 256, 0, st>>>(keys_in, ids_in, logits, rows, n);
    cuda_launch_note(1);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cub::DeviceRadixSort::SortPairsDescending(ws + 2 * karr + 2 * iarr, temp, keys_in,
                                                      keys_out, ids_in, ids_out, (int)items, 0,
                                                      end_bit, st);
    if (e == cudaSuccess) {
        smp_sorted_kernel<<<(unsigned)rows, SAMPLE_THREADS, 0, st>>>(p, logits, ids_out, n, kc,
                                                                     inv_t, top_p, min_p);
        cuda_launch_note(1); /* the radix sort's own launches are not counted */
        e = cudaGetLastError();
    }
    dev_scratch_free(ws, st);
    if (e != cudaSuccess)
        return err_set(TD_ECUDA, "sampler over %lld tokens: %s", (long long)n,
                       cudaGetErrorString(e));
    return TD_OK;
}

/* The sorted path for rows rows, kc candidates each, in sorts of up to SORT_ROWS rows (the
 * sort's scratch is 24 bytes per entry). */
static td_err smp_sorted_rows(float *p, const float *logits, int64_t rows, int64_t n_vocab,
                              int64_t kc, const ops_sampler *s, cudaStream_t st)
{
    for (int64_t r = 0; r < rows; r += SORT_ROWS)
        TD_TRY(smp_sorted(p + r * n_vocab, logits + r * n_vocab,
                          rows - r < SORT_ROWS ? rows - r : SORT_ROWS, n_vocab, kc,
                          (float)(1.0 / (double)s->temperature), (double)s->top_p, s->min_p,
                          st));
    return TD_OK;
}

/* cuda_sample_probs of rows rows of logits [rows][n_vocab] into p: the dense and small top-k
 * paths in one launch (a block per row, rows side by side), top-p alone in one launch too,
 * a large top-k in sorts of up to SORT_ROWS rows. */
static td_err smp_probs_rows(float *p, const float *logits, int64_t rows, int64_t n_vocab,
                             const ops_sampler *s, ops_stream st)
{
    TD_ASSERT(p != NULL && logits != NULL && s != NULL && n_vocab >= 1 && n_vocab <= INT32_MAX);
    TD_ASSERT(rows >= 1 && rows <= INT32_MAX);
    if (!(s->temperature >= 0) || isinf(s->temperature))
        return err_set(TD_EINVAL, "temperature %g: must be finite and >= 0", s->temperature);
    if (!(s->top_p >= 0))
        return err_set(TD_EINVAL, "top_p %g: must be >= 0", s->top_p);
    if (!(s->min_p >= 0))
        return err_set(TD_EINVAL, "min_p %g: must be >= 0", s->min_p);

    const bool use_k = s->top_k > 0 && s->top_k < n_vocab;
    const bool use_p = s->top_p < 1;
    if (s->temperature == 0 || (!use_k && !use_p)) {
        const bool greedy = s->temperature == 0;
        const float inv_t = greedy ? 0.0f : (float)(1.0 / (double)s->temperature);
        return smp_dense_rows(p, logits, rows, n_vocab, inv_t, s->min_p, greedy, st);
    }
    if (use_k && s->top_k <= TOPK_MAX)
        return smp_topk_rows(p, logits, rows, n_vocab, s->top_k, false, s, st);
    if (!use_k) /* the best TOPK_MAX walked, or a cut by mass */
        return smp_topk_rows(p, logits, rows, n_vocab,
                             n_vocab < TOPK_MAX ? (int)n_vocab : TOPK_MAX, true, s, st);
    return smp_sorted_rows(p, logits, rows, n_vocab, s->top_k, s, st);
}

extern "C" td_err cuda_sample_probs(float *p, const float *logits, int64_t n_vocab,
                                    const ops_sampler *s, ops_stream st)
{
    return smp_probs_rows(p, logits, 1, n_vocab, s, st);
}

/* --- draw ------------------------------------------------------------------------------ */

/* Entry i of the distribution a draw walks: p[i], or with q the residual max(p[i] - q[i], 0)
 * as the CPU computes it (an f32 difference; NaN gives 0). */
__device__ __forceinline__ float smp_entry(const float *p, const float *q, int64_t i)
{
    if (!q)
        return p[i];
    const float r = p[i] - q[i];
    return r > 0 ? r : 0.0f;
}

/* The draw is split between blocks too: a row is cut into RS_CHUNK-entry chunks, each
 * summed by a warp in f64 (lane l the positive entries 4l..4l+3 in order, then an inclusive
 * scan over the lanes in a fixed order: the chunk's sum is lane 31's), the row's blocks
 * store the sums of their slices' chunks, and the row's last block finds the chunk where the
 * running sum first passes u * total and walks it as the CPU does. */

/* Inclusive scan over the lanes of chunk c's lane sums (*own: this lane's). Every lane of
 * the warp must call it. */
__device__ double smp_chunk_scan(const float *p, const float *q, int64_t n, int64_t c,
                                 double *own)
{
    const int lane = threadIdx.x & 31;
    const int64_t i0 = c * RS_CHUNK + 4 * lane;
    double v = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float e = i0 + j < n ? smp_entry(p, q, i0 + j) : 0.0f;
        if (e > 0)
            v += e;
    }
    *own = v;
    double inc = v;
    for (int off = 1; off < 32; off <<= 1) {
        const double o = __shfl_up_sync(DEV_FULL_MASK, inc, off);
        if (lane >= off)
            inc += o;
    }
    return inc;
}

/* The sums of the chunks of slice [lo, hi) (whole chunks but the row's last) into csum. */
__device__ void smp_chunk_sums(const float *p, const float *q, int64_t n, int64_t lo, int64_t hi,
                               double *csum)
{
    const int64_t c0 = lo / RS_CHUNK, c1 = (hi + RS_CHUNK - 1) / RS_CHUNK;
    const int warps = blockDim.x >> 5, w = threadIdx.x >> 5;
    for (int64_t c = c0 + w; c < c1; c += warps) {
        double own;
        const double inc = smp_chunk_scan(p, q, n, c, &own);
        if ((threadIdx.x & 31) == 31)
            csum[c] = inc;
    }
}

/* The last positive entry of chunk c, or -1, to every lane of the warp. */
__device__ int64_t smp_chunk_last(const float *p, const float *q, int64_t n, int64_t c)
{
    const int lane = threadIdx.x & 31;
    int64_t last = -1;
    for (int j = 0; j < 4; j++) {
        const int64_t i = c * RS_CHUNK + 4 * lane + j;
        if (i < n && smp_entry(p, q, i) > 0)
            last = i;
    }
    const unsigned has = __ballot_sync(DEV_FULL_MASK, last >= 0);
    return has ? __shfl_sync(DEV_FULL_MASK, last, 31 - __clz(has)) : -1;
}

/* cpu_sample_draw over the entries smp_entry(p, q, .) of a row of n, whose chunk sums are in
 * csum (written by other blocks: read through L2), by the whole block: thread t sums a
 * contiguous run of chunks in order, a block scan places the runs, the thread whose run
 * passes u * total finds the chunk, and warp 0 walks it: the lane whose scan passes the
 * target walks its entries. Every thread gets the token (-1: no positive entry). Every
 * thread must call it. */
__device__ int32_t smp_draw_chunks(const float *p, const float *q, int64_t n,
                                   const double *csum, double u)
{
    __shared__ double scan[RS_THREADS];
    __shared__ int64_t sh_i[33];
    __shared__ int64_t sh_c;
    __shared__ double sh_start;
    __shared__ int32_t sh_tok;
    const int64_t nc = (n + RS_CHUNK - 1) / RS_CHUNK, per = (nc + RS_THREADS - 1) / RS_THREADS;
    const int64_t c0 = (int64_t)threadIdx.x * per, c1 = c0 + per < nc ? c0 + per : nc;
    double part = 0;
    int64_t lastc = -1; /* last chunk of the run with a positive entry */
    for (int64_t c = c0; c < c1; c++) {
        const double v = __ldcg(&csum[c]);
        part += v;
        if (v > 0)
            lastc = c;
    }
    const double incl = smp_block_scan(part, scan);
    const double total = scan[RS_THREADS - 1];
    const int64_t last_all = -smp_block_min(-lastc, sh_i, INT64_MAX);
    if (last_all < 0)
        return -1;
    const double target = u * total;
    const int64_t first = smp_block_min(incl > target ? (int64_t)threadIdx.x : INT64_MAX, sh_i,
                                        INT64_MAX);
    if (threadIdx.x == 0) {
        sh_c = last_all; /* rounding leaves the target on top: the last positive entry */
        sh_start = -1;
    }
    __syncthreads();
    if ((int64_t)threadIdx.x == first) {
        double cum = threadIdx.x > 0 ? scan[threadIdx.x - 1] : 0.0;
        int64_t c = c0;
        for (; c < c1; c++) {
            const double v = __ldcg(&csum[c]);
            if (v > 0 && cum + v > target)
                break;
            cum += v;
        }
        sh_c = c < c1 ? c : lastc; /* rounding: the target sits at the run's very end */
        sh_start = c < c1 ? cum : -1;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        const int64_t c = sh_c;
        const double start = sh_start;
        int64_t tok = -1;
        if (start >= 0) {
            double own;
            const double inc = smp_chunk_scan(p, q, n, c, &own);
            double ex = __shfl_up_sync(DEV_FULL_MASK, inc, 1);
            const int lane = threadIdx.x;
            if (lane == 0)
                ex = 0;
            const unsigned pass = __ballot_sync(DEV_FULL_MASK, start + inc > target);
            int64_t mine = -1;
            if (pass && lane == __ffs(pass) - 1) {
                double cum = start + ex;
                for (int j = 0; j < 4 && mine < 0; j++) {
                    const int64_t i = c * RS_CHUNK + 4 * lane + j;
                    const float v = i < n ? smp_entry(p, q, i) : 0.0f;
                    if (!(v > 0))
                        continue;
                    cum += v;
                    if (cum > target)
                        mine = i;
                }
                if (mine < 0) /* rounding: the lane's last positive entry */
                    for (int j = 3; j >= 0 && mine < 0; j--) {
                        const int64_t i = c * RS_CHUNK + 4 * lane + j;
                        if (i < n && smp_entry(p, q, i) > 0)
                            mine = i;
                    }
            }
            if (pass)
                tok = __shfl_sync(DEV_FULL_MASK, mine, __ffs(pass) - 1);
        }
        if (tok < 0)
            tok = smp_chunk_last(p, q, n, c);
        if (threadIdx.x == 0)
            sh_tok = (int32_t)tok;
    }
    __syncthreads();
    return sh_tok;
}

/* Block b: slice b % S of row b / S of p [rows][n]; the row's last block draws it with
 * counter ctr + row * ctr_step into tok[row]. csum: [rows][chunks]. */
__global__ void __launch_bounds__(RS_THREADS)
smp_draw_split_kernel(int32_t *tok, const float *p, int64_t n, int S, uint64_t seed,
                      uint64_t ctr, uint64_t ctr_step, double *csum, unsigned *count)
{
    const int64_t r = blockIdx.x / S, nc = (n + RS_CHUNK - 1) / RS_CHUNK;
    int64_t lo, hi;
    rs_slice(n, S, (int)(blockIdx.x % S), &lo, &hi);
    const float *pr = p + r * n;
    smp_chunk_sums(pr, NULL, n, lo, hi, csum + r * nc);
    if (!rs_last(&count[r], S))
        return;
    const int32_t t = smp_draw_chunks(pr, NULL, n, csum + r * nc,
                                      dev_rand_uniform(seed, ctr + (uint64_t)r * ctr_step));
    if (threadIdx.x == 0)
        tok[r] = t;
}

/* One draw from each of rows rows of p [rows][n_vocab], row i with counter ctr + i * step. */
static td_err smp_draw_rows(int32_t *tok, const float *p, int64_t rows, int64_t n_vocab,
                            uint64_t seed, uint64_t ctr, uint64_t step, cudaStream_t st)
{
    const int S = rs_slices(n_vocab);
    const int64_t nc = (n_vocab + RS_CHUNK - 1) / RS_CHUNK;
    for (int64_t r0 = 0; r0 < rows; r0 += RS_ROWS_WIDE) {
        const int64_t m = rows - r0 < RS_ROWS_WIDE ? rows - r0 : RS_ROWS_WIDE;
        unsigned *count = NULL;
        void *csum = NULL;
        TD_TRY(rs_scratch(st, (size_t)(m * nc) * sizeof(double), &count, &csum));
        smp_draw_split_kernel<<<(unsigned)(m * S), RS_THREADS, 0, st>>>(
            tok + r0, p + r0 * n_vocab, n_vocab, S, seed, ctr + (uint64_t)r0 * step, step,
            (double *)csum, count);
        CUDA_TRY_LAUNCH();
    }
    return TD_OK;
}

extern "C" td_err cuda_sample_draw(int32_t *tok, const float *p, int64_t n_vocab, uint64_t seed,
                                   uint64_t step, ops_stream st)
{
    TD_ASSERT(tok != NULL && p != NULL && n_vocab >= 1 && n_vocab <= INT32_MAX);
    return smp_draw_rows(tok, p, 1, n_vocab, seed, step, 0, st);
}

extern "C" td_err cuda_sample_rows(int32_t *tok, float *q, const float *logits, int64_t n,
                                   int64_t n_vocab, const ops_sampler *s, uint64_t ctr,
                                   uint64_t ctr_step, ops_stream st)
{
    TD_ASSERT(tok != NULL && q != NULL && logits != NULL && s != NULL && n >= 0);
    TD_ASSERT(n_vocab >= 1 && n_vocab <= INT32_MAX && n <= INT32_MAX);
    if (n == 0)
        return TD_OK;
    TD_TRY(smp_probs_rows(q, logits, n, n_vocab, s, st));
    return smp_draw_rows(tok, q, n, n_vocab, s->seed, ctr, ctr_step, st);
}

/* --- speculative acceptance ------------------------------------------------------------ */

/* cpu_accept_sampled's walk over p [n][n_vocab], then its draw, split between S blocks: each
 * block finds the first rejected draft itself (warp 0, a lane per draft: the CPU's f64 test
 * u * q(d) < p(d) with the same counters), then stores the chunk sums of its slice of the
 * row to draw from: the rejected row's residual max(p - q, 0) (as the CPU's f32 difference)
 * and its p, or the last row's p after a full accept. The last block draws from the residual
 * or, when it has no positive entry (the CPU's sum <= 0: a sum of non-negative floats in f64
 * is positive exactly when one of them is), from p. Only {a, next} cross. csum: two rows of
 * chunk sums. */
__global__ void __launch_bounds__(RS_THREADS)
smp_accept_kernel(int32_t *result, const float *p, const float *q, const int32_t *draft,
                  int64_t n, int64_t n_vocab, int S, uint64_t seed, uint64_t ctr_accept,
                  uint64_t ctr_target, uint64_t ctr_step, double *csum, unsigned *count)
{
    __shared__ int64_t stop; /* first rejected draft index, n when every draft was accepted */
    if (threadIdx.x < 32) {
        int64_t i0 = 1;
        for (; i0 < n; i0 += 32) {
            const int64_t i = i0 + threadIdx.x;
            bool ok = true;
            if (i < n) {
                const float *pi = p + (i - 1) * n_vocab, *qi = q + (i - 1) * n_vocab;
                const int32_t d = draft[i - 1];
                const double u = dev_rand_uniform(seed, ctr_accept + (uint64_t)i * ctr_step);
                ok = d >= 0 && d < n_vocab && qi[d] > 0.0f && u * (double)qi[d] < (double)pi[d];
            }
            const unsigned bad = __ballot_sync(DEV_FULL_MASK, !ok);
            if (bad) {
                i0 += __ffs(bad) - 1;
                break;
            }
        }
        if (threadIdx.x == 0)
            stop = i0 < n ? i0 : n;
    }
    __syncthreads();
    const int64_t i = stop, nc = (n_vocab + RS_CHUNK - 1) / RS_CHUNK;
    const float *pr = p + (i - 1) * n_vocab;
    const float *qr = i < n ? q + (i - 1) * n_vocab : NULL;
    int64_t lo, hi;
    rs_slice(n_vocab, S, (int)blockIdx.x, &lo, &hi);
    smp_chunk_sums(pr, NULL, n_vocab, lo, hi, csum);
    if (qr)
        smp_chunk_sums(pr, qr, n_vocab, lo, hi, csum + nc);
    if (!rs_last(count, S))
        return;
    const double u = dev_rand_uniform(seed, ctr_target + (uint64_t)i * ctr_step);
    int32_t tok = qr ? smp_draw_chunks(pr, qr, n_vocab, csum + nc, u) : -1;
    if (tok < 0)
        tok = smp_draw_chunks(pr, NULL, n_vocab, csum, u);
    if (threadIdx.x == 0) {
        result[0] = (int32_t)(i - 1);
        result[1] = tok;
    }
}

extern "C" td_err cuda_accept_sampled(int32_t *result, float *p, const float *logits,
                                      const float *q, const int32_t *draft, int64_t n,
                                      int64_t n_vocab, const ops_sampler *s,
                                      const ops_accept_rng *rng, ops_stream st)
{
    TD_ASSERT(result != NULL && p != NULL && logits != NULL && s != NULL && rng != NULL);
    TD_ASSERT(n >= 1 && n_vocab >= 1 && n_vocab <= INT32_MAX);
    TD_ASSERT(n == 1 || (q != NULL && draft != NULL));
    /* every row: which ones the walk reads is only known on the device */
    TD_TRY(smp_probs_rows(p, logits, n, n_vocab, s, st));
    const int S = rs_slices(n_vocab);
    unsigned *count = NULL;
    void *csum = NULL;
    TD_TRY(rs_scratch(st, 2 * (size_t)((n_vocab + RS_CHUNK - 1) / RS_CHUNK) * sizeof(double),
                      &count, &csum));
    smp_accept_kernel<<<(unsigned)S, RS_THREADS, 0, st>>>(result, p, q, draft, n, n_vocab, S,
                                                           s->seed, rng->accept, rng->target,
                                                           rng->step, (double *)csum, count);
    CUDA_TRY_LAUNCH();
    return TD_OK;
}
