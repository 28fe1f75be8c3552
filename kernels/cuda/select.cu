/* Argmax and top-k per row (twins of cpu_argmax and cpu_topk), and greedy acceptance of a
 * verified block on the device. One block per row: a vocabulary row (248320 logits, 1 MB)
 * is streamed by 1024 threads; the results are exact, so no order question arises. */
#include "kernels/cuda/select.cuh"

#define SEL_THREADS 1024

__global__ void __launch_bounds__(SEL_THREADS)
argmax_kernel(int32_t *idx, const float *x, int64_t n)
{
    __shared__ float sh_v[33];
    __shared__ int64_t sh_i[33];
    int64_t best = sel_argmax_block(x + (int64_t)blockIdx.x * n, n, sh_v, sh_i);
    if (threadIdx.x == 0)
        idx[blockIdx.x] = (int32_t)best;
}

extern "C" td_err cuda_argmax(int32_t *idx, const float *x, int64_t n_rows, int64_t n,
                              ops_stream st)
{
    TD_ASSERT(idx != NULL && x != NULL && n >= 1 && n <= INT32_MAX && n_rows >= 0);
    if (n_rows > INT32_MAX)
        return err_set(TD_ENOTSUP, "argmax over %lld rows", (long long)n_rows);
    if (n_rows == 0)
        return TD_OK;
    argmax_kernel<<<(unsigned)n_rows, SEL_THREADS, 0, st>>>(idx, x, n);
    CUDA_TRY_LAUNCH();
    return TD_OK;
}

__global__ void __launch_bounds__(SEL_THREADS)
topk_kernel(int32_t *idx, float *val, const float *x, int64_t n, int k)
{
    __shared__ sel_smem sm;
    __shared__ uint64_t keys[TOPK_MAX];
    const float *xr = x + (int64_t)blockIdx.x * n;
    sel_topk_block(xr, n, k, &sm, keys);
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
