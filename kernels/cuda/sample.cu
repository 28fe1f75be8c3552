/* The sampler on the device (twin of cpu_sample_probs): the filtered distribution p without
 * the logits leaving the GPU; the draw from it and sampled acceptance are in sample_draw.cu,
 * top-p's cut by mass in sample_cut.cu.
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
 * the CPU's. */
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/sample.cuh"

#define SORT_ROWS 4 /* rows per radix sort of the sorted path (24 bytes of scratch per entry) */

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

/* --- small top-k and nucleus paths (split between blocks: select.cuh) ------------------ */

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
    if (nucleus)
        TD_TRY(smem_optin<smp_topk_kernel<true>>(dev, SMP_LISTS));
    else
        TD_TRY(smem_optin<smp_topk_kernel<false>>(dev, SMP_LISTS));
    for (int64_t r0 = 0; r0 < rows; r0 += RS_ROWS_WIDE) {
        const int64_t m = rows - r0 < RS_ROWS_WIDE ? rows - r0 : RS_ROWS_WIDE;
        const size_t nb = (size_t)(m * S), mr = (size_t)m;
        /* scratch: argmax partials and rows, candidate lists, masses per block, the rows'
         * records, the smallest logits per block, then the cut's */
        const size_t bytes = (nb + mr) * sizeof(rs_best) + nb * (size_t)k * sizeof(uint64_t) +
                             nb * (sizeof(double) + sizeof(float)) + mr * sizeof(smp_row) + 16 +
                             smp_cut_bytes(m, S);
        unsigned *count = NULL;
        void *buf = NULL;
        TD_TRY(rs_scratch(st, bytes, &count, &buf));
        rs_best *apart = (rs_best *)buf, *best = apart + nb;
        uint64_t *cand = (uint64_t *)(best + m);
        double *mpart = (double *)(cand + nb * (size_t)k);
        smp_row *info = (smp_row *)(mpart + nb);
        float *lpart = (float *)(info + m);
        void *cut = (void *)(((uintptr_t)(lpart + nb) + 15) & ~(uintptr_t)15);
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
        TD_TRY(smp_cut_rows(pr, lr, m, n, S, inv_tf, top_p, min_p, info, cut, count, st));
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
td_err smp_probs_rows(float *p, const float *logits, int64_t rows, int64_t n_vocab,
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
