/* Causal depthwise conv1d with carried state (twin of kernels/cpu/conv.c). One thread per
 * channel walks the tokens in order with the window of the last k-1 raw inputs in
 * registers: channels are independent and contiguous in memory, so every load and store of
 * a warp is coalesced, and a token's result is the same sum whether it comes alone or in a
 * prefill chunk. Products and sums are rounded one by one (no fused multiply-add), in the
 * CPU's order. */
#include "kernels/cuda/ops_dev.cuh"

#define CONV_THREADS 128
#define CONV_MAX_K 16 /* window kept in registers */

__global__ void __launch_bounds__(CONV_THREADS)
conv_kernel(float *out, float *state, float *state_all, const float *x, int64_t x_stride,
            const float *w, int64_t n_tok, int64_t n_ch, int k)
{
    const int64_t c = (int64_t)blockIdx.x * CONV_THREADS + threadIdx.x;
    if (c >= n_ch)
        return;
    float wc[CONV_MAX_K], win[CONV_MAX_K - 1]; /* win[j]: input at time t-(k-1)+j */
#pragma unroll
    for (int i = 0; i < CONV_MAX_K; i++)
        wc[i] = i < k ? w[c * k + i] : 0.0f;
#pragma unroll
    for (int j = 0; j < CONV_MAX_K - 1; j++)
        win[j] = j < k - 1 ? state[j * n_ch + c] : 0.0f;
    for (int64_t t = 0; t < n_tok; t++) {
        const float xt = x[t * x_stride + c];
        float s = 0;
#pragma unroll
        for (int i = 0; i < CONV_MAX_K - 1; i++)
            if (i < k - 1)
                s = __fadd_rn(s, __fmul_rn(wc[i], win[i]));
        /* tap k-1 is the current input */
#pragma unroll
        for (int i = 0; i < CONV_MAX_K; i++)
            if (i == k - 1)
                s = __fadd_rn(s, __fmul_rn(wc[i], xt));
        out[t * n_ch + c] = s;
        /* slide: the oldest input leaves, x_t enters last */
#pragma unroll
        for (int j = 0; j < CONV_MAX_K - 1; j++) {
            if (j < k - 2)
                win[j] = win[j + 1];
            else if (j == k - 2)
                win[j] = xt;
        }
        if (state_all) {
            float *sa = state_all + t * (int64_t)(k - 1) * n_ch;
#pragma unroll
            for (int j = 0; j < CONV_MAX_K - 1; j++)
                if (j < k - 1)
                    sa[j * n_ch + c] = win[j];
        }
    }
#pragma unroll
    for (int j = 0; j < CONV_MAX_K - 1; j++)
        if (j < k - 1)
            state[j * n_ch + c] = win[j];
}

extern "C" td_err cuda_conv1d_causal(float *out, float *state, float *state_all, const float *x,
                                     int64_t x_stride, const float *w, int64_t n_tok,
                                     int64_t n_ch, int64_t k, ops_stream st)
{
    TD_ASSERT(out != NULL && x != NULL && w != NULL && k >= 1 && n_ch >= 1 && n_tok >= 0);
    TD_ASSERT(x_stride >= n_ch && (k == 1 || state != NULL));
    if (k > CONV_MAX_K)
        return err_set(TD_ENOTSUP, "conv1d kernel width %lld: the GPU handles up to %d",
                       (long long)k, CONV_MAX_K);
    if (n_ch / CONV_THREADS >= INT32_MAX)
        return err_set(TD_ENOTSUP, "conv1d over %lld channels", (long long)n_ch);
    if (n_tok == 0)
        return TD_OK;
    conv_kernel<<<cuda_blocks(n_ch, CONV_THREADS), CONV_THREADS, 0, st>>>(
        out, state, state_all, x, x_stride, w, n_tok, n_ch, (int)k);
    CUDA_TRY_LAUNCH();
    return TD_OK;
}
