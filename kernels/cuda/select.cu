/* Argmax and top-k per row (twins of cpu_argmax and cpu_topk), log probabilities with the
 * best tokens of a row (cpu_logprob_rows), sparse additions to rows of logits
 * (cpu_logit_add), and greedy acceptance of a verified block on the device. Argmax and the log probabilities split each row between blocks (select.cuh: split
 * passes); top-k runs one block per row: a vocabulary row (248320 logits, 1 MB) streamed by
 * 1024 threads. Selections are exact, so no order question arises; the log probabilities'
 * sum has one order per row length. */
#include "kernels/cuda/select.cuh"
#include "kernels/cuda/stream_buf.cuh"

#define SEL_THREADS 1024

/* --- split passes (select.cuh) -------------------------------------------------------- */

static stream_bufs g_rows = STREAM_BUFS_INIT("split row passes");

td_err rs_scratch(cudaStream_t st, size_t bytes, unsigned **count, void **part)
{
    const size_t head = RS_ROWS_MAX * sizeof(unsigned);
    bytes = head + (bytes > RS_SCRATCH_MIN ? bytes : RS_SCRATCH_MIN);
    void *buf = NULL;
    stream_buf *slot = NULL;
    TD_TRY(stream_buf_get(&g_rows, st, bytes, false, &buf, &slot));
    if (!buf) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        CUDA_TRY(cudaStreamIsCapturing(st, &cs));
        if (cs != cudaStreamCaptureStatusNone)
            return err_set(TD_ENOTSUP, "split row passes: %zu bytes of scratch, more than "
                                       "the stream had before its recording began",
                           bytes);
        TD_TRY(stream_buf_get(&g_rows, st, bytes, true, &buf, &slot));
    }
    if (slot->mark != slot->cap) { /* new or grown: the counters start at zero */
        CUDA_TRY(cudaMemsetAsync(buf, 0, slot->cap, st));
        slot->mark = slot->cap;
    }
    *count = (unsigned *)buf;
    *part = (char *)buf + head;
    return TD_OK;
}

/* Block b: slice b % S of row b / S. The row's last block combines the slices in order. */
__global__ void __launch_bounds__(RS_THREADS)
rs_argmax_kernel(rs_best *best, int32_t *idx, const float *x, int64_t n, int S, rs_best *part,
                 unsigned *count)
{
    __shared__ float sh_v[33];
    __shared__ int64_t sh_i[33];
    const int64_t r = blockIdx.x / S;
    const int s = (int)(blockIdx.x % S);
    int64_t lo, hi;
    rs_slice(n, S, s, &lo, &hi);
    const float *xr = x + r * n;
    const int64_t b = sel_argmax_block(xr + lo, hi - lo, sh_v, sh_i);
    if (threadIdx.x == 0)
        part[blockIdx.x] = b == INT64_MAX ? rs_best{NAN, INT64_MAX} : rs_best{xr[lo + b], lo + b};
    if (!rs_last(&count[r], S) || threadIdx.x != 0)
        return;
    rs_best w = {NAN, INT64_MAX};
    for (int j = 0; j < S; j++) {
        const rs_best o = {__ldcg(&part[r * S + j].v), __ldcg(&part[r * S + j].i)};
        if (sel_better(o.v, o.i, w.v, w.i))
            w = o;
    }
    if (best)
        best[r] = w;
    if (idx)
        idx[r] = (int32_t)w.i;
}

td_err rs_argmax_launch(rs_best *best, int32_t *idx, const float *x, int64_t rows, int64_t n,
                        rs_best *part, unsigned *count, cudaStream_t st)
{
    TD_ASSERT(rows >= 1 && rows <= RS_ROWS_MAX && n >= 1 && n <= INT32_MAX);
    const int S = rs_slices(n);
    rs_argmax_kernel<<<(unsigned)(rows * S), RS_THREADS, 0, st>>>(best, idx, x, n, S, part,
                                                                   count);
    CUDA_TRY_LAUNCH();
    return TD_OK;
}

extern "C" td_err cuda_argmax(int32_t *idx, const float *x, int64_t n_rows, int64_t n,
                              ops_stream st)
{
    TD_ASSERT(idx != NULL && x != NULL && n >= 1 && n <= INT32_MAX && n_rows >= 0);
    const cudaStream_t cs = (cudaStream_t)st;
    for (int64_t r0 = 0; r0 < n_rows; r0 += RS_ROWS_MAX) {
        const int64_t rows = n_rows - r0 < RS_ROWS_MAX ? n_rows - r0 : RS_ROWS_MAX;
        unsigned *count = NULL;
        void *part = NULL;
        TD_TRY(rs_scratch(cs, (size_t)(rows * rs_slices(n)) * sizeof(rs_best), &count, &part));
        TD_TRY(rs_argmax_launch(NULL, idx + r0, x + r0 * n, rows, n, (rs_best *)part, count,
                                cs));
    }
    return TD_OK;
}

__global__ void __launch_bounds__(SEL_THREADS)
topk_kernel(int32_t *idx, float *val, const float *x, int64_t n, int k)
{
    __shared__ sel_smem sm;
    __shared__ uint64_t keys[TOPK_MAX];
    const float *xr = x + (int64_t)blockIdx.x * n;
    sel_topk_block(xr, n, k, &sm, keys, 0);
    for (int j = threadIdx.x; j < k; j += SEL_THREADS) {
        uint32_t i = sel_key_index(keys[j]);
        idx[(int64_t)blockIdx.x * k + j] = (int32_t)i;
        if (val)
            val[(int64_t)blockIdx.x * k + j] = xr[i];
    }
}

extern "C" td_err cuda_topk(int32_t *idx, float *val, const float *x, int64_t n_rows, int64_t n,
                            int64_t k, ops_stream st)
{
    TD_ASSERT(idx != NULL && x != NULL && n_rows >= 0 && k >= 1 && k <= n && n <= INT32_MAX);
    if (k > TOPK_MAX)
        return err_set(TD_ENOTSUP, "top-k with k = %lld: the GPU selects at most %d",
                       (long long)k, TOPK_MAX);
    if (n_rows > INT32_MAX)
        return err_set(TD_ENOTSUP, "top-k over %lld rows", (long long)n_rows);
    if (n_rows == 0)
        return TD_OK;
    topk_kernel<<<(unsigned)n_rows, SEL_THREADS, 0, st>>>(idx, val, x, n, (int)k);
    CUDA_TRY_LAUNCH();
    return TD_OK;
}

/* Block b: slice b % S of row b / S of logits [rows][n] (its best entry in best[]): the
 * slice's sum of exp(l - max) (f32 terms, the block's f64 tree) into part, how many of its
 * logits are >= the token's into ge, and its n_top best keys into cand; the row's last block
 * adds the slices' sums in order, merges their lists and writes the row's record with token
 * tok[row]. */
__global__ void __launch_bounds__(SEL_THREADS)
logprob_kernel(ops_logprob *out, const float *logits, const int32_t *tok, int64_t n, int S,
               int n_top, const rs_best *best, double *part, double *ge, uint64_t *cand,
               unsigned *count)
{
    __shared__ double sh_d[33];
    __shared__ sel_smem sm;
    __shared__ uint64_t keys[OPS_TOP_LOGPROBS_MAX];
    __shared__ uint64_t lists[RS_SLICES_MAX * OPS_TOP_LOGPROBS_MAX];
    const int64_t r = blockIdx.x / S;
    int64_t lo, hi;
    rs_slice(n, S, (int)(blockIdx.x % S), &lo, &hi);
    const float *x = logits + r * n;
    const float mx = best[r].v;
    const int32_t t = tok[r];
    const float at = t >= 0 && t < n ? x[t] : NAN; /* NaN: no entry is >= it */
    float acc = 0;
    unsigned above = 0;
    sel_for_each(x + lo, hi - lo, [&](int64_t, float v) {
        acc += expf(v - mx);
        above += v >= at;
    });
    const double sum = dev_block_sum((double)acc, sh_d);
    if (threadIdx.x == 0)
        part[blockIdx.x] = sum;
    const double cnt = dev_block_sum((double)above, sh_d); /* exact: integers below 2^53 */
    if (threadIdx.x == 0)
        ge[blockIdx.x] = cnt;
    if (n_top > 0) {
        sel_topk_block(x + lo, hi - lo, n_top, &sm, keys, (uint32_t)lo);
        for (int j = threadIdx.x; j < n_top; j += SEL_THREADS)
            cand[(size_t)blockIdx.x * (size_t)n_top + (size_t)j] = keys[j];
    }
    if (!rs_last(&count[r], S))
        return;
    for (int j = threadIdx.x; j < S * n_top; j += SEL_THREADS)
        lists[j] = __ldcg(&cand[(size_t)r * (size_t)(S * n_top) + (size_t)j]);
    __syncthreads();
    rs_merge_top(lists, S, n_top, keys);
    if (threadIdx.x != 0)
        return;
    double total = 0, rank = 0;
    for (int j = 0; j < S; j++) {
        total += __ldcg(&part[r * S + j]);
        rank += __ldcg(&ge[r * S + j]);
    }
    const double lse = (double)mx + log(total);
    ops_logprob o;
    o.logprob = t >= 0 && t < n ? (float)fmin(0.0, (double)x[t] - lse) : -INFINITY;
    o.rank = (int32_t)rank;
    o.n_top = n_top;
    for (int j = 0; j < OPS_TOP_LOGPROBS_MAX; j++) {
        const uint32_t id = j < n_top ? sel_key_index(keys[j]) : 0;
        o.top_id[j] = (int32_t)id;
        o.top_logprob[j] = j < n_top ? (float)fmin(0.0, (double)x[id] - lse) : 0.0f;
    }
    out[r] = o;
}

extern "C" td_err cuda_logprob_rows(ops_logprob *out, const float *logits, const int32_t *tok,
                                    int64_t n, int64_t n_vocab, int n_top, ops_stream st)
{
    TD_ASSERT(out != NULL && logits != NULL && tok != NULL && n >= 0 && n_vocab >= 1);
    TD_ASSERT(n_top >= 0 && n_top <= OPS_TOP_LOGPROBS_MAX && n_vocab <= INT32_MAX);
    const cudaStream_t cs = (cudaStream_t)st;
    const int S = rs_slices(n_vocab), k = n_top < n_vocab ? n_top : (int)n_vocab;
    for (int64_t r0 = 0; r0 < n; r0 += RS_ROWS_WIDE) {
        const int64_t m = n - r0 < RS_ROWS_WIDE ? n - r0 : RS_ROWS_WIDE;
        const size_t nb = (size_t)(m * S);
        unsigned *count = NULL;
        void *buf = NULL;
        TD_TRY(rs_scratch(cs, (nb + (size_t)m) * sizeof(rs_best) +
                                  nb * (2 * sizeof(double) + (size_t)k * sizeof(uint64_t)),
                          &count, &buf));
        rs_best *apart = (rs_best *)buf, *best = apart + nb;
        double *part = (double *)(best + m), *ge = part + nb;
        uint64_t *cand = (uint64_t *)(ge + nb);
        const float *lr = logits + r0 * n_vocab;
        TD_TRY(rs_argmax_launch(best, NULL, lr, m, n_vocab, apart, count, cs));
        logprob_kernel<<<(unsigned)nb, SEL_THREADS, 0, cs>>>(out + r0, lr, tok + r0, n_vocab, S,
                                                              k, best, part, ge, cand, count);
        CUDA_TRY_LAUNCH();
    }
    return TD_OK;
}

/* One thread: the accepted prefix from the row argmaxes. A drafted id outside the
 * vocabulary simply never matches. */
__global__ void accept_kernel(int32_t *result, const int32_t *argmax, const int32_t *draft,
                              int64_t n)
{
    int64_t a = 0;
    while (a < n - 1 && draft[a] == argmax[a])
        a++;
    result[0] = (int32_t)a;
    result[1] = argmax[a];
}

/* Block i adds row i's entries (a token at most once per row: no two threads add to one
 * logit). */
__global__ void logit_add_kernel(float *logits, int64_t n_vocab, const int32_t *off,
                                 const ops_logit_add *add)
{
    float *row = logits + (int64_t)blockIdx.x * n_vocab;
    for (int32_t j = off[blockIdx.x] + (int32_t)threadIdx.x; j < off[blockIdx.x + 1];
         j += (int32_t)blockDim.x) {
        const ops_logit_add e = add[j];
        if (e.tok < 0 || e.tok >= n_vocab)
            continue;
        float l = row[e.tok];
        if (e.rep != 1.0f)
            l = l > 0 ? __fdiv_rn(l, e.rep) : __fmul_rn(l, e.rep);
        row[e.tok] = __fadd_rn(l, e.delta);
    }
}

extern "C" td_err cuda_logit_add(float *logits, int64_t n, int64_t n_vocab, const int32_t *off,
                                 const ops_logit_add *add, ops_stream st)
{
    TD_ASSERT(n >= 0 && n <= INT32_MAX && n_vocab >= 1 && off != NULL);
    if (n == 0)
        return TD_OK;
    TD_ASSERT(logits != NULL && add != NULL);
    logit_add_kernel<<<(unsigned)n, 128, 0, st>>>(logits, n_vocab, off, add);
    CUDA_TRY_LAUNCH();
    return TD_OK;
}

/* Grid-stride over a row's words: thread j owns 32 tokens, so each logit has one writer. */
__global__ void logit_mask_kernel(float *logits, int64_t n_vocab, const uint32_t *allow)
{
    const int64_t W = OPS_MASK_WORDS(n_vocab);
    float *row = logits + (int64_t)blockIdx.y * n_vocab;
    const uint32_t *bits = allow + (int64_t)blockIdx.y * W;
    for (int64_t w = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; w < W;
         w += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t m = bits[w];
        if (m == 0xffffffffu)
            continue;
        const int64_t t0 = w * 32, t1 = t0 + 32 < n_vocab ? t0 + 32 : n_vocab;
        for (int64_t t = t0; t < t1; t++)
            if (!(m >> (t - t0) & 1u))
                row[t] = -INFINITY;
    }
}

extern "C" td_err cuda_logit_mask(float *logits, int64_t n, int64_t n_vocab, const uint32_t *allow,
                                  ops_stream st)
{
    TD_ASSERT(n >= 0 && n <= 65535 && n_vocab >= 1);
    if (n == 0)
        return TD_OK;
    TD_ASSERT(logits != NULL && allow != NULL);
    const int64_t W = OPS_MASK_WORDS(n_vocab);
    const unsigned bx = (unsigned)((W + 255) / 256 < 32 ? (W + 255) / 256 : 32);
    logit_mask_kernel<<<dim3(bx, (unsigned)n), 256, 0, st>>>(logits, n_vocab, allow);
    CUDA_TRY_LAUNCH();
    return TD_OK;
}

extern "C" td_err cuda_accept_greedy(int32_t *argmax, int32_t *result, const float *logits,
                                     const int32_t *draft, int64_t n, int64_t n_vocab,
                                     ops_stream st)
{
    TD_ASSERT(argmax != NULL && result != NULL && logits != NULL && n >= 1);
    TD_ASSERT(n == 1 || draft != NULL);
    TD_TRY(cuda_argmax(argmax, logits, n, n_vocab, st));
    accept_kernel<<<1, 1, 0, st>>>(result, argmax, draft, n);
    CUDA_TRY_LAUNCH();
    return TD_OK;
}
