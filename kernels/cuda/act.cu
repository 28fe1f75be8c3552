/* Elementwise activations and row softmax (twins of kernels/cpu/act.c). Elementwise ops
 * touch each value once with the CPU's formula: a grid-stride loop, exact for add, mul and
 * scale, within CUDA's expf/log1pf error for the rest. Softmax is one block per row so a
 * row's sum has one fixed order. */
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_dev.cuh"

#define ACT_THREADS 256
#define ACT_MAX_BLOCKS 4096 /* grid-stride beyond this: enough to fill any GPU */
#define SOFTMAX_THREADS 512

typedef enum act_kind {
    ACT_ADD,
    ACT_MUL,
    ACT_SCALE,
    ACT_SILU,
    ACT_SIGMOID,
    ACT_SOFTPLUS,
    ACT_SWIGLU,
    ACT_SOFTCAP,
} act_kind;

__global__ void __launch_bounds__(ACT_THREADS)
act_kernel(bool early, float *out, const float *a, const float *b, float s, int64_t n,
           act_kind kind)
{
    pdl_enter(early);
    const int64_t step = (int64_t)gridDim.x * ACT_THREADS;
    for (int64_t i = (int64_t)blockIdx.x * ACT_THREADS + threadIdx.x; i < n; i += step) {
        float x = a[i], r;
        switch (kind) {
        case ACT_ADD:
            r = x + b[i];
            break;
        case ACT_MUL:
            r = x * b[i];
            break;
        case ACT_SCALE:
            r = x * s;
            break;
        case ACT_SILU:
            r = dev_silu(x);
            break;
        case ACT_SIGMOID:
            r = dev_sigmoid(x);
            break;
        case ACT_SOFTPLUS:
            r = fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
            break;
        case ACT_SOFTCAP: /* s = cap */
            r = s * tanhf(x / s);
            break;
        default: /* ACT_SWIGLU: a = gate, b = up */
            r = dev_swiglu(x, b[i]);
            break;
        }
        out[i] = r;
    }
}

static td_err act_launch(float *out, const float *a, const float *b, float s, int64_t n,
                         act_kind kind, ops_stream st)
{
    TD_ASSERT(n >= 0);
    if (n == 0)
        return TD_OK;
    TD_ASSERT(out != NULL && a != NULL);
    long long blocks = ((long long)n + ACT_THREADS - 1) / ACT_THREADS;
    if (blocks > ACT_MAX_BLOCKS)
        blocks = ACT_MAX_BLOCKS;
    return pdl_launch<act_kernel>("activation", dim3((unsigned)blocks), dim3(ACT_THREADS), 0, st,
                                  out, a, b, s, n, kind);
}

extern "C" td_err cuda_add(float *out, const float *a, const float *b, int64_t n, ops_stream st)
{
    TD_ASSERT(n == 0 || b != NULL);
    return act_launch(out, a, b, 0, n, ACT_ADD, st);
}

extern "C" td_err cuda_mul(float *out, const float *a, const float *b, int64_t n, ops_stream st)
{
    TD_ASSERT(n == 0 || b != NULL);
    return act_launch(out, a, b, 0, n, ACT_MUL, st);
}

extern "C" td_err cuda_scale(float *out, const float *x, float s, int64_t n, ops_stream st)
{
    return act_launch(out, x, NULL, s, n, ACT_SCALE, st);
}

extern "C" td_err cuda_silu(float *out, const float *x, int64_t n, ops_stream st)
{
    return act_launch(out, x, NULL, 0, n, ACT_SILU, st);
}

extern "C" td_err cuda_sigmoid(float *out, const float *x, int64_t n, ops_stream st)
{
    return act_launch(out, x, NULL, 0, n, ACT_SIGMOID, st);
}

extern "C" td_err cuda_softplus(float *out, const float *x, int64_t n, ops_stream st)
{
    return act_launch(out, x, NULL, 0, n, ACT_SOFTPLUS, st);
}

extern "C" td_err cuda_softcap(float *out, const float *x, float cap, int64_t n, ops_stream st)
{
    TD_ASSERT(cap > 0.0f);
    return act_launch(out, x, NULL, cap, n, ACT_SOFTCAP, st);
}

extern "C" td_err cuda_swiglu(float *out, const float *gate, const float *up, int64_t n,
                              ops_stream st)
{
    TD_ASSERT(n == 0 || up != NULL);
    return act_launch(out, gate, up, 0, n, ACT_SWIGLU, st);
}

/* out = exp(x - max) / sum: the max is exact in any order; the sum is f32 per thread over a
 * strided slice, then f64 across threads in a fixed tree (the CPU sums in f64). */
__global__ void __launch_bounds__(SOFTMAX_THREADS)
softmax_kernel(bool early, float *out, const float *x, int64_t n)
{
    pdl_enter(early);
    __shared__ float shm[33];
    __shared__ double shs[33];
    const float *xr = x + (int64_t)blockIdx.x * n;
    float *o = out + (int64_t)blockIdx.x * n;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += SOFTMAX_THREADS)
        mx = fmaxf(mx, xr[i]);
    mx = dev_block_max(mx, shm); /* every x is read before the first write below */
    float part = 0;
    for (int64_t i = threadIdx.x; i < n; i += SOFTMAX_THREADS) {
        float e = expf(xr[i] - mx);
        o[i] = e;
        part += e;
    }
    double sum = dev_block_sum((double)part, shs);
    float inv = (float)(1.0 / sum);
    for (int64_t i = threadIdx.x; i < n; i += SOFTMAX_THREADS)
        o[i] *= inv;
}

extern "C" td_err cuda_softmax(float *out, const float *x, int64_t n_rows, int64_t n,
                               ops_stream st)
{
    TD_ASSERT(out != NULL && x != NULL && n >= 1 && n_rows >= 0);
    if (n_rows > INT32_MAX)
        return err_set(TD_ENOTSUP, "softmax over %lld rows", (long long)n_rows);
    if (n_rows == 0)
        return TD_OK;
    return pdl_launch<softmax_kernel>("softmax", dim3((unsigned)n_rows), dim3(SOFTMAX_THREADS), 0,
                                      st, out, x, n);
}
