/* Row norms (twins of kernels/cpu/norm.c). One block per row: a row (up to a 5120-wide
 * hidden state) is one block's work, and the sum of squares has the same fixed order for a
 * row whatever the number of rows. Per-thread partial sums run in f32 over a strided slice
 * and meet in f64 through a fixed tree, so the sum is near exact like the CPU's f64 sum
 * without f64 work per element (slow on consumer GPUs). */
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_dev.cuh"

#define NORM_THREADS DEV_NORM_THREADS

#define NORM_VALS 20 /* values per thread a row keeps in registers (5120 wide rows) */

/* 1 / the norm of a row of dim whose sum of squares is ss */
__device__ __forceinline__ float norm_inv(double ss, int64_t dim, float eps, int mode)
{
    return mode == 0 ? (float)(1.0 / sqrt(ss / (double)dim + (double)eps))
                     : (float)(1.0 / sqrt(ss + (double)eps));
}

/* mode 0: RMS norm (mean of squares), 1: L2 norm (sum of squares) */
__global__ void __launch_bounds__(NORM_THREADS)
norm_kernel(bool early, float *out, const float *x, const float *w, int64_t dim, int64_t stride,
            float eps, int mode)
{
    pdl_enter(early);
    __shared__ double sh[33];
    const float *xr = x + (int64_t)blockIdx.x * stride;
    float *o = out + (int64_t)blockIdx.x * stride;
    float part = 0;
    if (dim <= (int64_t)NORM_THREADS * NORM_VALS) {
        /* the row and the weights read once, before the block's sum */
        float xv[NORM_VALS], wv[NORM_VALS];
#pragma unroll
        for (int u = 0; u < NORM_VALS; u++) {
            const int64_t i = threadIdx.x + (int64_t)u * NORM_THREADS;
            xv[u] = i < dim ? xr[i] : 0.0f;
            wv[u] = w && i < dim ? w[i] : 1.0f;
        }
#pragma unroll
        for (int u = 0; u < NORM_VALS; u++)
            if (threadIdx.x + (int64_t)u * NORM_THREADS < dim)
                part = fmaf(xv[u], xv[u], part);
        const float inv = norm_inv(dev_block_sum((double)part, sh), dim, eps, mode);
#pragma unroll
        for (int u = 0; u < NORM_VALS; u++) {
            const int64_t i = threadIdx.x + (int64_t)u * NORM_THREADS;
            if (i < dim)
                o[i] = w ? xv[u] * inv * wv[u] : xv[u] * inv;
        }
        return;
    }
    for (int64_t i = threadIdx.x; i < dim; i += NORM_THREADS)
        part = fmaf(xr[i], xr[i], part);
    /* every x is read before any write */
    const float inv = norm_inv(dev_block_sum((double)part, sh), dim, eps, mode);
    for (int64_t i = threadIdx.x; i < dim; i += NORM_THREADS)
        o[i] = w ? xr[i] * inv * w[i] : xr[i] * inv;
}

static td_err norm_launch(float *out, const float *x, const float *w, int64_t n_rows,
                          int64_t dim, int64_t stride, float eps, int mode, ops_stream st)
{
    TD_ASSERT(out != NULL && x != NULL && n_rows >= 0 && dim >= 1 && stride >= dim);
    if (n_rows > INT32_MAX)
        return err_set(TD_ENOTSUP, "norm over %lld rows", (long long)n_rows);
    if (n_rows == 0)
        return TD_OK;
    return pdl_launch<norm_kernel>("norm", dim3((unsigned)n_rows), dim3(NORM_THREADS), 0, st, out,
                                   x, w, dim, stride, eps, mode);
}

extern "C" td_err cuda_rmsnorm(float *out, const float *x, const float *w, int64_t n_rows,
                               int64_t dim, int64_t stride, float eps, ops_stream st)
{
    return norm_launch(out, x, w, n_rows, dim, stride, eps, 0, st);
}

extern "C" td_err cuda_l2norm(float *out, const float *x, int64_t n_rows, int64_t dim,
                              int64_t stride, float eps, ops_stream st)
{
    return norm_launch(out, x, NULL, n_rows, dim, stride, eps, 1, st);
}
