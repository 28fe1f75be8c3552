/* Fused chains (twins of kernels/cpu/fused.c): one launch where a layer used several.
 * Norms keep norm.cu's order: f32 partial sums of squares per thread over a strided slice,
 * f64 across the block in a fixed tree; one block per row (per head for the DeltaNet
 * inputs), so a row's result never depends on the other rows of the call. */
#include <cuda_fp16.h>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_dev.cuh"

#define FUSED_ROW_THREADS 1024 /* a residual row (5120 wide on the 27B): at decode this one
                                * block is the whole launch, so it takes all the threads a
                                * block can have (256 measured 15.7 us per call on an H200) */
#define FUSED_HEAD_THREADS 128 /* a head of 128 values */
#define FUSED_MAX_DK 1024
#define FUSED_MAX_HD 1024 /* qk_norm_rope: a head in shared memory */

/* x += h; out = rmsnorm(x) * w; block = one row of dim. A thread's values stay in registers
 * between the two passes (up to FUSED_ROW_VALS each, dim <= 8192; wider rows read x back),
 * and its loads of x and h are issued before its first store: x, h and out may alias as far
 * as the compiler knows, so a load after a store would wait a full round trip each (15.7 us
 * per call on the H200 with 256 threads and loads behind stores). w is read while the block
 * sums (w cannot alias x: it is a weight), not after: a load behind the sum adds a round trip
 * to every norm (with all three sets of loads up front the kernel spills at its 32
 * registers). PF (one row: a decode step's norms): before its wait the kernel asks for w into
 * L2, a warp per line, so that load finds it there (with several rows every block would ask;
 * and the kernel of several rows stays as it was: a 16-token verify measured slower with the
 * early reads compiled in, H100). */
#define FUSED_ROW_VALS 8

template <bool PF>
__global__ void __launch_bounds__(FUSED_ROW_THREADS)
add_rmsnorm_kernel(bool early, float *x, const float *h, float *out, const float *w, int64_t dim,
                   float eps)
{
    if constexpr (PF)
        for (int64_t i = threadIdx.x; w && (threadIdx.x & 31) == 0 && i < dim;
             i += FUSED_ROW_THREADS)
            dev_prefetch_l2(w + i);
    pdl_enter(early);
    __shared__ double sh[33];
    float *xr = x + (int64_t)blockIdx.x * dim;
    const float *hr = h + (int64_t)blockIdx.x * dim;
    float *o = out + (int64_t)blockIdx.x * dim;
    const bool cached = dim <= (int64_t)FUSED_ROW_THREADS * FUSED_ROW_VALS;
    float v[FUSED_ROW_VALS], wv[FUSED_ROW_VALS];
    float part = 0;
    if (cached) {
        float a[FUSED_ROW_VALS], b[FUSED_ROW_VALS];
#pragma unroll
        for (int j = 0; j < FUSED_ROW_VALS; j++) {
            const int64_t i = threadIdx.x + (int64_t)j * FUSED_ROW_THREADS;
            a[j] = i < dim ? xr[i] : 0.0f;
            b[j] = i < dim ? hr[i] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < FUSED_ROW_VALS; j++) {
            const int64_t i = threadIdx.x + (int64_t)j * FUSED_ROW_THREADS;
            v[j] = __fadd_rn(a[j], b[j]);
            if (i < dim) {
                xr[i] = v[j];
                part = fmaf(v[j], v[j], part);
            }
        }
#pragma unroll
        for (int j = 0; j < FUSED_ROW_VALS; j++) { /* in flight during the block's sum */
            const int64_t i = threadIdx.x + (int64_t)j * FUSED_ROW_THREADS;
            wv[j] = w && i < dim ? w[i] : 1.0f;
        }
    } else {
        for (int64_t i = threadIdx.x; i < dim; i += FUSED_ROW_THREADS) {
            const float t = __fadd_rn(xr[i], hr[i]);
            xr[i] = t;
            part = fmaf(t, t, part);
        }
    }
    const float inv = dev_rms_inv(dev_block_sum((double)part, sh), dim, eps);
    if (cached) {
#pragma unroll
        for (int j = 0; j < FUSED_ROW_VALS; j++) {
            const int64_t i = threadIdx.x + (int64_t)j * FUSED_ROW_THREADS;
            if (i < dim)
                o[i] = w ? __fmul_rn(__fmul_rn(v[j], inv), wv[j]) : __fmul_rn(v[j], inv);
        }
        return;
    }
    /* each thread reads back only the values it wrote, and writes out[i] (which may be h)
     * only after reading h[i] */
    for (int64_t i = threadIdx.x; i < dim; i += FUSED_ROW_THREADS)
        o[i] = w ? __fmul_rn(__fmul_rn(xr[i], inv), w[i]) : __fmul_rn(xr[i], inv);
}

/* out = rmsnorm(x) * w * silu(z); block = one row of dim. Rows of up to FUSED_HEAD_THREADS *
 * FUSED_HEAD_VALS values are read once, x, z and w together before the block's sum (the gate
 * silu(z) is made meanwhile); longer rows read them again after it. */
#define FUSED_HEAD_VALS 4

__global__ void __launch_bounds__(FUSED_HEAD_THREADS)
rmsnorm_silu_kernel(bool early, float *out, const float *x, const float *w, const float *z,
                    int64_t dim, float eps)
{
    pdl_enter(early);
    __shared__ double sh[33];
    const float *xr = x + (int64_t)blockIdx.x * dim, *zr = z + (int64_t)blockIdx.x * dim;
    float *o = out + (int64_t)blockIdx.x * dim;
    float part = 0;
    if (dim <= (int64_t)FUSED_HEAD_THREADS * FUSED_HEAD_VALS) {
        float xv[FUSED_HEAD_VALS], zv[FUSED_HEAD_VALS], wv[FUSED_HEAD_VALS];
#pragma unroll
        for (int j = 0; j < FUSED_HEAD_VALS; j++) {
            const int64_t i = threadIdx.x + (int64_t)j * FUSED_HEAD_THREADS;
            xv[j] = i < dim ? xr[i] : 0.0f;
            zv[j] = i < dim ? zr[i] : 0.0f;
            wv[j] = w && i < dim ? w[i] : 1.0f;
        }
#pragma unroll
        for (int j = 0; j < FUSED_HEAD_VALS; j++) {
            const int64_t i = threadIdx.x + (int64_t)j * FUSED_HEAD_THREADS;
            if (i < dim)
                part = fmaf(xv[j], xv[j], part);
            zv[j] = dev_gate(zv[j]);
        }
        /* every x read before out is written */
        const float inv = dev_rms_inv(dev_block_sum((double)part, sh), dim, eps);
#pragma unroll
        for (int j = 0; j < FUSED_HEAD_VALS; j++) {
            const int64_t i = threadIdx.x + (int64_t)j * FUSED_HEAD_THREADS;
            if (i < dim)
                o[i] = dev_rmsnorm_silu_one(xv[j], inv, w, wv[j], zv[j]);
        }
        return;
    }
    for (int64_t i = threadIdx.x; i < dim; i += FUSED_HEAD_THREADS)
        part = fmaf(xr[i], xr[i], part);
    /* every x read before out is written */
    const float inv = dev_rms_inv(dev_block_sum((double)part, sh), dim, eps);
    for (int64_t i = threadIdx.x; i < dim; i += FUSED_HEAD_THREADS)
        o[i] = dev_rmsnorm_silu_one(xr[i], inv, w, w ? w[i] : 1.0f,
                                dev_gate(zr[i]));
}

/* One value of a K/V cache row: f32, or rounded to f16 as kv_store_kernel does. */
__device__ __forceinline__ void fused_cache_put(void *cache, bool f16, int64_t at, float x)
{
    if (f16)
        ((uint16_t *)cache)[at] = __half_as_ushort(__float2half_rn(x));
    else
        ((float *)cache)[at] = x;
}

/* Block b = (token b / nb, head b % nb), nb = n_head + n_kv (+ n_kv with store, + n_head
 * more with a q-side store): a q head (head < n_head) or a k head, normed in norm.cu's order
 * with its formula (DEV_NORM_THREADS threads), then rotated with rope.cu's angles and
 * roundings: the bits of cuda_rmsnorm then cuda_rope_neox on it. With store, a k head also
 * goes to kv's cache row, and the next n_kv blocks of a token copy its value heads there:
 * the bits of kv_store_kernel after it; with kv.qk_cache the q heads and kv.qv likewise. */
__global__ void __launch_bounds__(DEV_NORM_THREADS)
qk_norm_rope_kernel(bool early, float *q, float *k, const float *q_norm, const float *k_norm,
                    int64_t n_head, int64_t n_kv, int64_t hd, int64_t q_head, int64_t n_rot,
                    const int32_t *pos, float theta, float eps, bool store, ops_kv_dst kv)
{
    pdl_enter(early);
    __shared__ double sh[33];
    __shared__ float v[FUSED_MAX_HD];
    const bool qstore = store && kv.qk_cache != nullptr;
    const int64_t nb = n_head + (store ? 2 : 1) * n_kv + (qstore ? n_head : 0);
    const int64_t t = blockIdx.x / nb, h = blockIdx.x % nb;
    const bool f16 = kv.type == TD_F16;
    if (h >= n_head + n_kv) { /* a value head (k side, then q side): to the cache as it is */
        const bool qside = h >= n_head + 2 * n_kv;
        const int64_t hv = h - n_head - (qside ? 2 : 1) * n_kv;
        const int64_t at = (int64_t)kv.rows[t] * kv.row + hv * hd;
        const float *src = (qside ? kv.qv : kv.v) + t * kv.row + hv * hd;
        void *dst = qside ? kv.qv_cache : kv.v_cache;
        for (int64_t i = threadIdx.x; i < hd; i += DEV_NORM_THREADS)
            fused_cache_put(dst, f16, at + i, src[i]);
        return;
    }
    const bool is_q = h < n_head;
    float *x = is_q ? q + (t * n_head + h) * q_head : k + (t * n_kv + h - n_head) * hd;
    const float *w = is_q ? q_norm : k_norm;
    /* a thread's values, its weights, the position and its angles are all in hand before the
     * block's sum, so no load or cos/sin waits behind it */
    constexpr int NV = FUSED_MAX_HD / DEV_NORM_THREADS;
    const int64_t half = n_rot / 2;
    const double pt = (double)pos[t];
    /* a stored head's place in its cache, read with the rest before the block's sum */
    const bool put = is_q ? qstore : store;
    void *cache = is_q ? kv.qk_cache : kv.k_cache;
    const int64_t kat = put ? (int64_t)kv.rows[t] * kv.row + (is_q ? h : h - n_head) * hd : 0;
    float xv[NV], wv[NV], cv[NV], sv[NV];
#pragma unroll
    for (int u = 0; u < NV; u++) {
        const int64_t i = threadIdx.x + (int64_t)u * DEV_NORM_THREADS;
        xv[u] = i < hd ? x[i] : 0.0f;
        wv[u] = w && i < hd ? w[i] : 1.0f;
    }
    float part = 0;
#pragma unroll
    for (int u = 0; u < NV; u++) {
        const int64_t i = threadIdx.x + (int64_t)u * DEV_NORM_THREADS;
        if (i < hd)
            part = fmaf(xv[u], xv[u], part);
        cv[u] = 1.0f, sv[u] = 0.0f;
        if (i < 2 * half) {
            const int64_t j = i < half ? i : i - half;
            const double freq = pow((double)theta, -2.0 * (double)j / (double)n_rot);
            const double ang = pt * freq;
            cv[u] = (float)cos(ang), sv[u] = (float)sin(ang);
        }
    }
    const float inv = dev_rms_inv(dev_block_sum((double)part, sh), hd, eps);
#pragma unroll
    for (int u = 0; u < NV; u++) {
        const int64_t i = threadIdx.x + (int64_t)u * DEV_NORM_THREADS;
        if (i < hd)
            v[i] = w ? xv[u] * inv * wv[u] : xv[u] * inv;
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < NV; u++) {
        const int64_t i = threadIdx.x + (int64_t)u * DEV_NORM_THREADS;
        if (i >= hd)
            break;
        float r = v[i];
        if (i < 2 * half) {
            const int64_t j = i < half ? i : i - half;
            const float c = cv[u], s = sv[u], a = v[j], b = v[j + half];
            r = i < half ? __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s))
                         : __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
        }
        x[i] = r;
        if (put)
            fused_cache_put(cache, f16, kat + i, r);
    }
}

/* grid (n_tok, 2*n_k_head + 1): blocks y < 2*n_k_head normalise one q or k head of token x;
 * the last block of each token makes its g and beta */
__global__ void __launch_bounds__(FUSED_HEAD_THREADS)
delta_prep_kernel(bool early, float *gb, float *qkv, const float *alpha, const float *beta,
                  const float *dt_bias, const float *ssm_a, int64_t nv, int64_t nk, int64_t dk,
                  int64_t qkv_stride, float eps, float q_scale)
{
    pdl_enter(early);
    __shared__ double sh[33];
    const int64_t t = blockIdx.x, head = blockIdx.y;
    if (head == 2 * nk) {
        float *g = gb + t * 2 * nv, *b = g + nv;
        for (int64_t i = threadIdx.x; i < nv; i += FUSED_HEAD_THREADS) {
            b[i] = dev_sigmoid(beta[t * nv + i]);
            g[i] = __fmul_rn(dev_softplus(__fadd_rn(alpha[t * nv + i], dt_bias[i])), ssm_a[i]);
        }
        return;
    }
    float *x = qkv + t * qkv_stride + head * dk;
    float part = 0;
    for (int64_t i = threadIdx.x; i < dk; i += FUSED_HEAD_THREADS)
        part = fmaf(x[i], x[i], part);
    const float inv = dev_l2_inv(dev_block_sum((double)part, sh), eps);
    const bool is_q = head < nk;
    for (int64_t i = threadIdx.x; i < dk; i += FUSED_HEAD_THREADS) {
        const float v = __fmul_rn(x[i], inv);
        x[i] = is_q ? __fmul_rn(v, q_scale) : v;
    }
}

extern "C" td_err cuda_add_rmsnorm(float *x, const float *h, float *out, const float *w,
                                   int64_t n_rows, int64_t dim, float eps, ops_stream st)
{
    TD_ASSERT(x != NULL && h != NULL && out != NULL && out != x && n_rows >= 0 && dim >= 1);
    if (n_rows > INT32_MAX)
        return err_set(TD_ENOTSUP, "add_rmsnorm over %lld rows", (long long)n_rows);
    if (n_rows == 0)
        return TD_OK;
    if (n_rows == 1 && pdl_early_reads())
        return pdl_launch<add_rmsnorm_kernel<true>>("add_rmsnorm", dim3(1), dim3(FUSED_ROW_THREADS),
                                                    0, st, x, h, out, w, dim, eps);
    return pdl_launch<add_rmsnorm_kernel<false>>("add_rmsnorm", dim3((unsigned)n_rows),
                                                 dim3(FUSED_ROW_THREADS), 0, st, x, h, out, w, dim,
                                                 eps);
}

extern "C" td_err cuda_rmsnorm_silu(float *out, const float *x, const float *w, const float *z,
                                    int64_t n_rows, int64_t dim, float eps, ops_stream st)
{
    TD_ASSERT(out != NULL && x != NULL && z != NULL && n_rows >= 0 && dim >= 1);
    if (n_rows > INT32_MAX)
        return err_set(TD_ENOTSUP, "rmsnorm_silu over %lld rows", (long long)n_rows);
    if (n_rows == 0)
        return TD_OK;
    return pdl_launch<rmsnorm_silu_kernel>("rmsnorm_silu", dim3((unsigned)n_rows),
                                           dim3(FUSED_HEAD_THREADS), 0, st, out, x, w, z, dim, eps);
}

extern "C" td_err cuda_delta_prep(float *gb, float *qkv, const float *alpha, const float *beta,
                                  const float *dt_bias, const float *ssm_a, int64_t n_tok,
                                  int64_t n_v_head, int64_t n_k_head, int64_t d_k,
                                  int64_t qkv_stride, float eps, ops_stream st)
{
    TD_ASSERT(gb != NULL && qkv != NULL && alpha != NULL && beta != NULL);
    TD_ASSERT(dt_bias != NULL && ssm_a != NULL && n_tok >= 0 && n_v_head >= 1);
    TD_ASSERT(n_k_head >= 1 && d_k >= 1 && qkv_stride >= 2 * n_k_head * d_k);
    if (d_k > FUSED_MAX_DK || n_tok > INT32_MAX || 2 * n_k_head + 1 > 65535)
        return err_set(TD_ENOTSUP, "DeltaNet inputs of %lld tokens, %lld heads of %lld",
                       (long long)n_tok, (long long)n_k_head, (long long)d_k);
    if (n_tok == 0)
        return TD_OK;
    const float q_scale = 1.0f / sqrtf((float)d_k);
    dim3 grid((unsigned)n_tok, (unsigned)(2 * n_k_head + 1));
    return pdl_launch<delta_prep_kernel>("delta_prep", grid, dim3(FUSED_HEAD_THREADS), 0, st, gb,
                                         qkv, alpha, beta, dt_bias, ssm_a, n_v_head, n_k_head,
                                         d_k, qkv_stride, eps, q_scale);
}

extern "C" td_err cuda_qk_norm_rope(float *q, float *k, const float *q_norm, const float *k_norm,
                                    int64_t n_tok, int64_t n_head, int64_t n_head_kv,
                                    int64_t head_dim, int64_t q_head, int64_t n_rot,
                                    const int32_t *pos, float theta, float eps,
                                    const ops_kv_dst *kv, ops_stream st)
{
    TD_ASSERT((q != NULL || n_head == 0) && k != NULL && pos != NULL && n_tok >= 0);
    TD_ASSERT(n_head >= 0);
    TD_ASSERT(n_head_kv >= 1 && head_dim >= 1 && q_head >= head_dim && theta > 0);
    TD_ASSERT(n_rot >= 2 && n_rot % 2 == 0 && n_rot <= head_dim);
    TD_ASSERT(kv == NULL || (kv->k_cache && kv->v_cache && kv->v && kv->rows &&
                             (kv->type == TD_F32 || kv->type == TD_F16) &&
                             kv->row == n_head_kv * head_dim));
    TD_ASSERT(kv == NULL || kv->qk_cache == NULL ||
              (kv->qv_cache && kv->qv && n_head == n_head_kv && q_head == head_dim));
    const int64_t heads =
        n_head + (kv ? 2 : 1) * n_head_kv + (kv && kv->qk_cache ? n_head : 0);
    if (head_dim > FUSED_MAX_HD || n_tok * heads > INT32_MAX)
        return err_set(TD_ENOTSUP, "q/k norm and RoPE: %lld tokens of %lld heads of %lld",
                       (long long)n_tok, (long long)heads, (long long)head_dim);
    if (n_tok == 0)
        return TD_OK;
    const ops_kv_dst none = {};
    return pdl_launch<qk_norm_rope_kernel>(
        "qk_norm_rope", dim3((unsigned)(n_tok * heads)), dim3(DEV_NORM_THREADS), 0, st, q, k,
        q_norm, k_norm, n_head, n_head_kv, head_dim, q_head, n_rot, pos, theta, eps, kv != NULL,
        kv ? *kv : none);
}
