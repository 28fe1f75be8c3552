/* NeoX RoPE in place (twin of kernels/cpu/rope.c). One thread per (token, rotated pair):
 * it computes the angle once, in f64 as the CPU does (pos up to 2^31 times a frequency needs
 * the fraction bits), and applies it to that pair in every head. */
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_dev.cuh"

#define ROPE_THREADS 128

__global__ void __launch_bounds__(ROPE_THREADS)
rope_kernel(bool early, float *x, int64_t n_tok, int64_t n_head, int64_t tok_stride,
            int64_t head_stride, int64_t n_rot, const int32_t *pos, float theta)
{
    pdl_enter(early); /* before the return below: every thread waits */
    const int64_t half = n_rot / 2;
    const int64_t id = (int64_t)blockIdx.x * ROPE_THREADS + threadIdx.x;
    if (id >= n_tok * half)
        return;
    const int64_t t = id / half, j = id % half;
    double freq = pow((double)theta, -2.0 * (double)j / (double)n_rot);
    double ang = (double)pos[t] * freq;
    float c = (float)cos(ang), s = (float)sin(ang);
    for (int64_t h = 0; h < n_head; h++) {
        float *v = x + t * tok_stride + h * head_stride;
        float a = v[j], b = v[j + half];
        /* no fused multiply-add: the same roundings as the CPU */
        v[j] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        v[j + half] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    }
}

extern "C" td_err cuda_rope_neox(float *x, int64_t n_tok, int64_t n_head, int64_t tok_stride,
                                 int64_t head_stride, int64_t n_rot, const int32_t *pos,
                                 float theta, ops_stream st)
{
    TD_ASSERT(x != NULL && pos != NULL && n_rot >= 2 && n_rot % 2 == 0 && theta > 0);
    TD_ASSERT(head_stride >= n_rot || n_head == 1);
    TD_ASSERT(n_tok >= 0 && n_head >= 0);
    const long long n = (long long)n_tok * (n_rot / 2);
    if (n == 0 || n_head == 0)
        return TD_OK;
    if (n / ROPE_THREADS >= INT32_MAX)
        return err_set(TD_ENOTSUP, "RoPE over %lld tokens", (long long)n_tok);
    return pdl_launch<rope_kernel>("rope", dim3(cuda_blocks(n, ROPE_THREADS)), dim3(ROPE_THREADS),
                                   0, st, x, n_tok, n_head, tok_stride, head_stride, n_rot, pos,
                                   theta);
}
