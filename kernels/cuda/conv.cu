/* Causal depthwise conv1d with carried state (twin of kernels/cpu/conv.c). Every output
 * (token, channel) is its own sum of k products over the raw inputs it sees (from the
 * carried state before token 0), rounded one by one (no fused multiply-add) in the CPU's
 * order, so a token's result is the same whether it comes alone or in a block. A block owns
 * 32 channels for all tokens: its CONV_TLANES warps take every CONV_TLANES-th token (a
 * 16-token verify keeps four warps busy per channel group where one thread per channel
 * walked the tokens in turn), and only after all of them have read the old state does the
 * block write the new one. Each warp's loads and stores are 32 consecutive channels. */
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_dev.cuh"

#define CONV_CH 32      /* channels per block (one per lane) */
#define CONV_TLANES 4   /* warps per block, each over every 4th token */
#define CONV_MAX_K 16

/* raw input of channel c at time tau (tau < 0: the carried state) */
__device__ __forceinline__ float conv_in(const float *state, const float *x, int64_t x_stride,
                                         int64_t n_ch, int k, int64_t tau, int64_t c)
{
    return tau < 0 ? state[(k - 1 + tau) * n_ch + c] : x[tau * x_stride + c];
}

template <bool SILU>
__global__ void __launch_bounds__(CONV_CH *CONV_TLANES)
conv_kernel(bool early, float *out, float *state, float *state_all, const float *x,
            int64_t x_stride, const float *w, int64_t n_tok, int64_t n_ch, int k)
{
    pdl_enter(early);
    const int64_t c = (int64_t)blockIdx.x * CONV_CH + threadIdx.x % CONV_CH;
    const int lane_t = threadIdx.x / CONV_CH;
    const bool live = c < n_ch;
    float wc[CONV_MAX_K];
#pragma unroll
    for (int i = 0; i < CONV_MAX_K; i++)
        wc[i] = live && i < k ? w[c * k + i] : 0.0f;
    for (int64_t t = lane_t; live && t < n_tok; t += CONV_TLANES) {
        float s = 0;
#pragma unroll
        for (int i = 0; i < CONV_MAX_K; i++)
            if (i < k)
                s = __fadd_rn(s, __fmul_rn(wc[i], conv_in(state, x, x_stride, n_ch, k,
                                                          t - k + 1 + i, c)));
        out[t * n_ch + c] = SILU ? dev_silu(s) : s; /* cpu_conv1d_silu: then cpu_silu */
        if (state_all) {
            float *sa = state_all + t * (int64_t)(k - 1) * n_ch;
            for (int j = 0; j < k - 1; j++)
                sa[j * n_ch + c] = conv_in(state, x, x_stride, n_ch, k, t - (k - 2) + j, c);
        }
    }
    __syncthreads(); /* every read of the old state is done */
    if (!live || lane_t != 0)
        return;
    /* slot j of the new window holds time n_tok-(k-1)+j: read all, then write */
    float win[CONV_MAX_K - 1];
#pragma unroll
    for (int j = 0; j < CONV_MAX_K - 1; j++)
        if (j < k - 1)
            win[j] = conv_in(state, x, x_stride, n_ch, k, n_tok - (k - 1) + j, c);
#pragma unroll
    for (int j = 0; j < CONV_MAX_K - 1; j++)
        if (j < k - 1)
            state[j * n_ch + c] = win[j];
}

template <bool SILU>
static td_err conv_launch(float *out, float *state, float *state_all, const float *x,
                          int64_t x_stride, const float *w, int64_t n_tok, int64_t n_ch,
                          int64_t k, ops_stream st)
{
    TD_ASSERT(out != NULL && x != NULL && w != NULL && k >= 1 && n_ch >= 1 && n_tok >= 0);
    TD_ASSERT(x_stride >= n_ch && (k == 1 || state != NULL));
    if (k > CONV_MAX_K)
        return err_set(TD_ENOTSUP, "conv1d kernel width %lld: the GPU handles up to %d",
                       (long long)k, CONV_MAX_K);
    if (n_ch / CONV_CH >= INT32_MAX)
        return err_set(TD_ENOTSUP, "conv1d over %lld channels", (long long)n_ch);
    if (n_tok == 0)
        return TD_OK;
    return pdl_launch<conv_kernel<SILU>>(SILU ? "conv1d_silu" : "conv1d",
                                         dim3(cuda_blocks(n_ch, CONV_CH)),
                                         dim3(CONV_CH * CONV_TLANES), 0, st, out, state,
                                         state_all, x, x_stride, w, n_tok, n_ch, (int)k);
}

extern "C" td_err cuda_conv1d_causal(float *out, float *state, float *state_all, const float *x,
                                     int64_t x_stride, const float *w, int64_t n_tok,
                                     int64_t n_ch, int64_t k, ops_stream st)
{
    return conv_launch<false>(out, state, state_all, x, x_stride, w, n_tok, n_ch, k, st);
}

extern "C" td_err cuda_conv1d_silu(float *out, float *state, float *state_all, const float *x,
                                   int64_t x_stride, const float *w, int64_t n_tok,
                                   int64_t n_ch, int64_t k, ops_stream st)
{
    return conv_launch<true>(out, state, state_all, x, x_stride, w, n_tok, n_ch, k, st);
}
