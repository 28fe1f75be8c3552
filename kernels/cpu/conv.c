/* Causal depthwise conv1d with a carried window of raw inputs (Gated DeltaNet's short
 * convolution). Channels are independent, so they are split across threads. */
#include "kernels/ops.h"

/* Raw input at time tau of channel c: tau < 0 reaches back into the carried state. */
static float conv_in(const float *state, const float *x, int64_t x_stride, int64_t n_ch,
                     int64_t k, int64_t tau, int64_t c)
{
    return tau < 0 ? state[(k - 1 + tau) * n_ch + c] : x[tau * x_stride + c];
}

void cpu_conv1d_causal(float *out, float *state, float *state_all, const float *x,
                       int64_t x_stride, const float *w, int64_t n_tok, int64_t n_ch,
                       int64_t k)
{
    TD_ASSERT(out != NULL && x != NULL && w != NULL && k >= 1 && n_ch >= 1 && n_tok >= 0);
    TD_ASSERT(x_stride >= n_ch && (k == 1 || state != NULL));
#pragma omp parallel for schedule(static) if (n_tok * n_ch * k >= (1 << 16))
    for (int64_t c = 0; c < n_ch; c++) {
        const float *wc = w + c * k;
        for (int64_t t = 0; t < n_tok; t++) {
            float s = 0;
            for (int64_t i = 0; i < k; i++)
                s += wc[i] * conv_in(state, x, x_stride, n_ch, k, t - k + 1 + i, c);
            out[t * n_ch + c] = s;
            if (state_all) {
                float *st = state_all + t * (k - 1) * n_ch;
                for (int64_t j = 0; j < k - 1; j++)
                    st[j * n_ch + c] = conv_in(state, x, x_stride, n_ch, k, t - (k - 2) + j, c);
            }
        }
        /* Slot j of the new window holds time n_tok-(k-1)+j; when that is still in the old
         * window it sits at slot n_tok+j > j, so the ascending in-place copy is safe. */
        for (int64_t j = 0; j < k - 1; j++)
            state[j * n_ch + c] = conv_in(state, x, x_stride, n_ch, k, n_tok - (k - 1) + j, c);
    }
}
