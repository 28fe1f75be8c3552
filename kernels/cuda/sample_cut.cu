/* Top-p's cut by mass (top_p alone, a row whose kept set reaches past its best TOPK_MAX
 * entries): the kept set is the shortest prefix of cpu_topk's order whose mass reaches top_p
 * of the row's, found without sorting the row. Integer masses make every sum exact, so the
 * cut does not depend on the order of the additions (smp_mass_cut has the argument). The
 * rows are split between blocks (select.cuh: split passes); one block per row runs
 * smp_mass_cut only where near-equal logits leave thousands of entries in one sub-bin. */
#include "kernels/cuda/sample.cuh"

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

size_t smp_cut_bytes(int64_t rows, int S)
{
    const size_t nb = (size_t)rows * (size_t)S, mr = (size_t)rows;
    return nb * 256 * (sizeof(unsigned long long) + sizeof(unsigned)) + mr * TOPK_MAX * 16 +
           nb * sizeof(double) + mr * sizeof(smp_cutrow);
}

td_err smp_cut_rows(float *p, const float *logits, int64_t rows, int64_t n, int S, float inv_t,
                    double top_p, double min_p, const smp_row *info, void *scratch,
                    unsigned *count, cudaStream_t st)
{
    int dev = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    TD_TRY(smem_optin<smp_bins_kernel<false>>(dev, SMP_CUT_WMASS));
    TD_TRY(smem_optin<smp_bins_kernel<true>>(dev, SMP_CUT_WMASS));
    TD_TRY(smem_optin<smp_radix_cut_kernel>(dev, SMP_CUT_WMASS));
    const size_t nb = (size_t)rows * (size_t)S, mr = (size_t)rows;
    /* the blocks' bin tables, the rows' gathered candidates, the blocks' kept masses, the
     * rows' records, the blocks' bin counts */
    unsigned long long *tmass = (unsigned long long *)scratch;
    uint64_t *ckeys = (uint64_t *)(tmass + nb * 256);
    unsigned long long *cmass = (unsigned long long *)(ckeys + mr * TOPK_MAX);
    double *part = (double *)(cmass + mr * TOPK_MAX);
    smp_cutrow *crow = (smp_cutrow *)(part + nb);
    unsigned *tcnt = (unsigned *)(crow + mr);
    smp_bins_kernel<false><<<(unsigned)nb, SAMPLE_THREADS, SMP_CUT_WMASS, st>>>(
        logits, n, S, inv_t, top_p, info, tmass, tcnt, crow, count);
    CUDA_TRY_LAUNCH();
    smp_bins_kernel<true><<<(unsigned)nb, SAMPLE_THREADS, SMP_CUT_WMASS, st>>>(
        logits, n, S, inv_t, top_p, info, tmass, tcnt, crow, count);
    CUDA_TRY_LAUNCH();
    smp_gather_kernel<<<(unsigned)nb, SAMPLE_THREADS, 0, st>>>(logits, n, S, inv_t, info, crow,
                                                               ckeys, cmass, count);
    CUDA_TRY_LAUNCH();
    smp_radix_cut_kernel<<<(unsigned)mr, SAMPLE_THREADS, SMP_CUT_WMASS, st>>>(
        logits, n, inv_t, top_p, info, crow);
    CUDA_TRY_LAUNCH();
    smp_cut_pass_kernel<false><<<(unsigned)nb, SAMPLE_THREADS, 0, st>>>(
        p, logits, n, S, inv_t, min_p, info, crow, part, count);
    CUDA_TRY_LAUNCH();
    smp_cut_pass_kernel<true><<<(unsigned)nb, SAMPLE_THREADS, 0, st>>>(
        p, logits, n, S, inv_t, min_p, info, crow, part, count);
    CUDA_TRY_LAUNCH();
    return TD_OK;
}
