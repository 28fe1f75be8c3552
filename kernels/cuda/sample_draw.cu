/* The draw (twin of cpu_sample_draw) and sampled speculative acceptance (twin of
 * cpu_accept_sampled) on the device: the CPU's Philox numbers and cumulative rule over f64
 * sums of 128-entry chunks, each row split between blocks (select.cuh: split passes), so the
 * token is the CPU's unless u * sum(p) lies within f64 rounding (~1e-16 relative) of a
 * boundary between two tokens. Only token ids (and the acceptance's count) reach the host. */
#include "kernels/cuda/sample.cuh"

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

/* Inclusive scan of v over the lanes of the warp, in a fixed order. */
__device__ __forceinline__ double smp_lane_scan(double v)
{
    const int lane = threadIdx.x & 31;
    for (int off = 1; off < 32; off <<= 1) {
        const double o = __shfl_up_sync(DEV_FULL_MASK, v, off);
        if (lane >= off)
            v += o;
    }
    return v;
}

/* A lane's four entries of chunk c of p (and of q where q is given); zeros past n. */
struct smp_lane4 {
    float p[4], q[4];
};

__device__ __forceinline__ smp_lane4 smp_lane_load(const float *p, const float *q, int64_t n,
                                                   int64_t c)
{
    const int64_t i0 = c * RS_CHUNK + 4 * (threadIdx.x & 31);
    smp_lane4 e;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        e.p[j] = i0 + j < n ? p[i0 + j] : 0.0f;
        e.q[j] = q && i0 + j < n ? q[i0 + j] : 0.0f;
    }
    return e;
}

/* The lane's sum in f64 of its positive entries in order: of p, or with residual of
 * smp_entry's max(p - q, 0). The one definition the chunk sums and the draw's walk share, so
 * the walk meets the sums it was sent to. */
__device__ __forceinline__ double smp_lane_sum(const smp_lane4 &e, bool residual)
{
    double v = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float x = residual ? e.p[j] - e.q[j] : e.p[j];
        if (x > 0)
            v += x;
    }
    return v;
}

/* Inclusive scan over the lanes of chunk c's lane sums (*own: this lane's). Every lane of
 * the warp must call it. */
__device__ double smp_chunk_scan(const float *p, const float *q, int64_t n, int64_t c,
                                 double *own)
{
    const double v = smp_lane_sum(smp_lane_load(p, q, n, c), q != NULL);
    *own = v;
    return smp_lane_scan(v);
}

/* Chunk c's sums from its loaded entries: of p into psum[c] and, with q, of the residual
 * into rsum[c]. */
__device__ __forceinline__ void smp_lane_store(const smp_lane4 &e, bool with_q, int64_t c,
                                               double *psum, double *rsum)
{
    const double a = smp_lane_scan(smp_lane_sum(e, false));
    const double b = with_q ? smp_lane_scan(smp_lane_sum(e, true)) : 0.0;
    if ((threadIdx.x & 31) == 31) {
        psum[c] = a;
        if (with_q)
            rsum[c] = b;
    }
}

/* The sums of the chunks of slice [lo, hi) (whole chunks but the row's last) of p into psum
 * and, with q, of the residual max(p - q, 0) into rsum: one read of p and q, two chunks per
 * warp in flight. */
__device__ void smp_chunk_sums(const float *p, const float *q, int64_t n, int64_t lo, int64_t hi,
                               double *psum, double *rsum)
{
    const int64_t c0 = lo / RS_CHUNK, c1 = (hi + RS_CHUNK - 1) / RS_CHUNK;
    const int warps = blockDim.x >> 5, w = threadIdx.x >> 5;
    for (int64_t c = c0 + w; c < c1; c += 2 * warps) {
        const int64_t c2 = c + warps;
        const smp_lane4 e1 = smp_lane_load(p, q, n, c);
        const smp_lane4 e2 = smp_lane_load(p, q, c2 < c1 ? n : 0, c2);
        smp_lane_store(e1, q != NULL, c, psum, rsum);
        if (c2 < c1)
            smp_lane_store(e2, q != NULL, c2, psum, rsum);
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
    smp_chunk_sums(pr, NULL, n, lo, hi, csum + r * nc, NULL);
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
 * row to draw from, both in one read of the row: the rejected row's residual max(p - q, 0)
 * (as the CPU's f32 difference) and its p, or the last row's p after a full accept. The
 * last block draws from the residual or, when it has no positive entry (the CPU's sum <= 0:
 * a sum of non-negative floats in f64 is positive exactly when one of them is), from p.
 * Only {a, next} cross. csum: two rows of chunk sums. */
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
    smp_chunk_sums(pr, qr, n_vocab, lo, hi, csum, csum + nc);
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
