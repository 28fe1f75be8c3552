/* Elementwise activations, softmax, argmax and top-k. */
#include <math.h>
#include <stdlib.h>

#include "kernels/ops.h"

void cpu_add(float *out, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void cpu_mul(float *out, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] * b[i];
}

void cpu_scale(float *out, const float *x, float s, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = x[i] * s;
}

/* 1 / (1 + e^-x) without overflow: e^-|x| is at most 1. */
static float sigmoidf(float x)
{
    float e = expf(-fabsf(x));
    return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

void cpu_sigmoid(float *out, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = sigmoidf(x[i]);
}

void cpu_silu(float *out, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = x[i] * sigmoidf(x[i]);
}

void cpu_swiglu(float *out, const float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}

void cpu_softplus(float *out, const float *x, int64_t n)
{
    /* max(x, 0) + log1p(e^-|x|): exact form that neither overflows nor loses small values */
    for (int64_t i = 0; i < n; i++)
        out[i] = fmaxf(x[i], 0.0f) + log1pf(expf(-fabsf(x[i])));
}

void cpu_softcap(float *out, const float *x, float cap, int64_t n)
{
    TD_ASSERT(cap > 0.0f);
    for (int64_t i = 0; i < n; i++)
        out[i] = cap * tanhf(x[i] / cap);
}

void cpu_softmax(float *out, const float *x, int64_t n_rows, int64_t n)
{
    TD_ASSERT(n >= 1);
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        float mx = -INFINITY;
        for (int64_t i = 0; i < n; i++)
            mx = fmaxf(mx, xr[i]);
        double sum = 0;
        for (int64_t i = 0; i < n; i++) {
            o[i] = expf(xr[i] - mx);
            sum += o[i];
        }
        float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < n; i++)
            o[i] *= inv;
    }
}

int64_t cpu_argmax(const float *x, int64_t n)
{
    TD_ASSERT(n >= 1);
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best] || (isnan(x[best]) && !isnan(x[i])))
            best = i;
    return best;
}

/* a ranks above b: larger value, or equal value and lower index; NaN ranks last. */
static int ranks_above(float va, int64_t ia, float vb, int64_t ib)
{
    if (isnan(vb))
        return !isnan(va) || ia < ib;
    if (isnan(va))
        return 0;
    return va > vb || (va == vb && ia < ib);
}

/* Sift down in a min-heap (by rank) of k entries: the root is the weakest kept entry. */
static void heap_down(int32_t *idx, const float *x, int64_t k, int64_t i)
{
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < k && ranks_above(x[idx[m]], idx[m], x[idx[l]], idx[l]))
            m = l;
        if (r < k && ranks_above(x[idx[m]], idx[m], x[idx[r]], idx[r]))
            m = r;
        if (m == i)
            return;
        int32_t t = idx[i];
        idx[i] = idx[m];
        idx[m] = t;
        i = m;
    }
}

void cpu_topk(int32_t *idx, float *val, const float *x, int64_t n, int64_t k)
{
    TD_ASSERT(idx != NULL && x != NULL && k >= 1 && k <= n && n <= INT32_MAX);
    for (int64_t i = 0; i < k; i++)
        idx[i] = (int32_t)i;
    for (int64_t i = k / 2 - 1; i >= 0; i--)
        heap_down(idx, x, k, i);
    for (int64_t i = k; i < n; i++) {
        if (ranks_above(x[i], i, x[idx[0]], idx[0])) {
            idx[0] = (int32_t)i;
            heap_down(idx, x, k, 0);
        }
    }
    /* heap sort: pop the weakest to the back */
    for (int64_t end = k - 1; end > 0; end--) {
        int32_t t = idx[0];
        idx[0] = idx[end];
        idx[end] = t;
        heap_down(idx, x, end, 0);
    }
    if (val)
        for (int64_t i = 0; i < k; i++)
            val[i] = x[idx[i]];
}
