/* The CUDA twins of the norms, elementwise ops, softmax, argmax/top-k, RoPE, conv1d and the
 * delta rule against their CPU ops (the oracle) on random data and odd shapes, and the
 * determinism the speculative loop relies on: a token gets bit-identical results alone and
 * inside a block. Attention and the sampler have their own drivers beside this one
 * (test_gpu_ops_attention.c, test_gpu_ops_sample.c), the matrix multiply too.
 * Outputs are poisoned with NaN before each GPU call, so an element a kernel never writes
 * fails the comparison. Tolerances are argued where they are used; exact results (argmax,
 * top-k, add/mul/scale, state copies) are compared bit for bit. Skips (77) without CUDA or a
 * device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cuda_mem.h"
#include "kernels/ops.h"
#include "tests/support/gpu_check.h"

#define SKIP_EXIT 77

#ifndef TANDEM_HAVE_CUDA

GPU_CHECK_SKIP_MAIN

#else

GPU_CHECK_SANITIZER_OPTIONS

/* ---- norms and elementwise ------------------------------------------------------------ */

/* The CPU sums squares in f64; the GPU sums f32 products per thread (<= 20 terms for 5120
 * wide rows) and meets in f64: the sum is within ~1e-6 relative, the scale 1/sqrt within
 * half that, and two f32 products add 1.2e-7. 2e-6 relative is the bound. */
static void test_norms_match_cpu(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {{1, 1, 1}, {3, 7, 9}, {5, 128, 128}, {4, 5120, 5123}};
    rng_seed(1);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t rows = shapes[s][0], dim = shapes[s][1], stride = shapes[s][2];
        const int64_t n = rows * stride;
        float *x = rng_floats(n, 3), *w = rng_floats(dim, 2);
        float *ref = malloc((size_t)n * sizeof *ref);
        float *dx = dput(x, (size_t)n * 4), *dw = dput(w, (size_t)dim * 4);
        for (int kind = 0; kind < 3; kind++) {
            /* the gaps between rows must stay as they were: start from x's bytes */
            float *dout = dput(x, (size_t)n * 4);
            memcpy(ref, x, (size_t)n * sizeof *ref);
            if (kind == 0) {
                cpu_rmsnorm(ref, x, w, rows, dim, stride, 1e-6f);
                GPU_OK(cuda_rmsnorm(dout, dx, dw, rows, dim, stride, 1e-6f, gpu_st));
            } else if (kind == 1) {
                cpu_rmsnorm(ref, x, NULL, rows, dim, stride, 1e-5f);
                GPU_OK(cuda_rmsnorm(dout, dout, NULL, rows, dim, stride, 1e-5f, gpu_st)); /* in place */
            } else {
                cpu_l2norm(ref, x, rows, dim, stride, 1e-6f);
                GPU_OK(cuda_l2norm(dout, dx, rows, dim, stride, 1e-6f, gpu_st));
            }
            float *got = dget(dout, (size_t)n * 4);
            assert_true(check_close(kind == 2 ? "l2norm" : "rmsnorm", got, ref, n, 2e-6f, 1e-30f));
            free(got);
            cuda_mem_free(dout);
        }
        cuda_mem_free(dx);
        cuda_mem_free(dw);
        free(x);
        free(w);
        free(ref);
    }
}

/* add, mul and scale are one IEEE operation: bit-identical. The activations differ by the
 * exp/log1p implementations (CUDA's expf within 2 ulp, glibc's within 1): 1e-6 relative. */
static void test_elementwise_match_cpu(void **state)
{
    (void)state;
    static const int64_t sizes[] = {1, 1000, (1 << 20) + 3}; /* the last needs grid-stride */
    rng_seed(2);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int64_t n = sizes[s];
        const size_t bytes = (size_t)n * 4;
        float *a = rng_floats(n, 20), *b = rng_floats(n, 3);
        static const float special[] = {0.0f, -0.0f, 88.0f, -88.0f, 1e-30f, INFINITY, -INFINITY};
        for (size_t i = 0; i < sizeof special / sizeof special[0] && (int64_t)i < n; i++)
            a[i] = special[i];
        float *ref = malloc(bytes), *da = dput(a, bytes), *db = dput(b, bytes);
        for (int op = 0; op < 7; op++) {
            float *dout = dpoison(bytes);
            const char *name = "";
            switch (op) {
            case 0: name = "add"; cpu_add(ref, a, b, n); GPU_OK(cuda_add(dout, da, db, n, gpu_st)); break;
            case 1: name = "mul"; cpu_mul(ref, a, b, n); GPU_OK(cuda_mul(dout, da, db, n, gpu_st)); break;
            case 2: name = "scale"; cpu_scale(ref, a, -0.37f, n);
                GPU_OK(cuda_scale(dout, da, -0.37f, n, gpu_st)); break;
            case 3: name = "silu"; cpu_silu(ref, a, n); GPU_OK(cuda_silu(dout, da, n, gpu_st)); break;
            case 4: name = "sigmoid"; cpu_sigmoid(ref, a, n);
                GPU_OK(cuda_sigmoid(dout, da, n, gpu_st)); break;
            case 5: name = "softplus"; cpu_softplus(ref, a, n);
                GPU_OK(cuda_softplus(dout, da, n, gpu_st)); break;
            default: name = "swiglu"; cpu_swiglu(ref, a, b, n);
                GPU_OK(cuda_swiglu(dout, da, db, n, gpu_st)); break;
            }
            float *got = dget(dout, bytes);
            if (op < 3)
                assert_true(check_same_bits(name, got, ref, bytes));
            else
                assert_true(check_close(name, got, ref, n, 1e-6f, 1e-37f));
            free(got);
            cuda_mem_free(dout);
        }
        /* out may alias an input */
        GPU_OK(cuda_add(da, da, db, n, gpu_st));
        cpu_add(ref, a, b, n);
        float *got = dget(da, bytes);
        assert_true(check_same_bits("add in place", got, ref, bytes));
        free(got);
        cuda_mem_free(da);
        cuda_mem_free(db);
        free(a);
        free(b);
        free(ref);
    }
}

/* Both sides use f32 expf; the CPU sums in f64, the GPU in f32 per thread over n/512 terms
 * then f64: the sum (and so every output) is within (n/512 + 8) * 2^-24 relative. */
static void test_softmax_matches_cpu(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{1, 1}, {3, 33}, {2, 248320}};
    rng_seed(3);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t rows = shapes[s][0], n = shapes[s][1];
        const size_t bytes = (size_t)(rows * n) * 4;
        float *x = rng_floats(rows * n, 12), *ref = malloc(bytes);
        float *dx = dput(x, bytes), *dout = dpoison(bytes);
        cpu_softmax(ref, x, rows, n);
        GPU_OK(cuda_softmax(dout, dx, rows, n, gpu_st));
        float *got = dget(dout, bytes);
        assert_true(check_close("softmax", got, ref, rows * n, (float)(n / 512 + 8) * 0x1p-24f, 1e-38f));
        free(got);
        GPU_OK(cuda_softmax(dx, dx, rows, n, gpu_st)); /* in place */
        got = dget(dx, bytes);
        assert_true(check_close("softmax in place", got, ref, rows * n, (float)(n / 512 + 8) * 0x1p-24f,
                     1e-38f));
        free(got);
        cuda_mem_free(dx);
        cuda_mem_free(dout);
        free(x);
        free(ref);
    }
}

/* ---- argmax, top-k ---------------------------------------------------------------------- */

/* A row of kind: 0 random, 1 few distinct values (ties everywhere), 2 random with NaNs (one
 * at index 0), 3 all NaN, 4 all -inf, 5 -0/+0 only. */
static void fill_row(float *x, int64_t n, int kind)
{
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case 0: x[i] = rng_f() * 10; break;
        case 1: x[i] = (float)(rng_u64() % 4); break;
        case 2: x[i] = i == 0 || rng_u64() % 7 == 0 ? NAN : rng_f(); break;
        case 3: x[i] = NAN; break;
        case 4: x[i] = -INFINITY; break;
        default: x[i] = rng_u64() & 1 ? 0.0f : -0.0f; break;
        }
    }
}

/* cuda_argmax of rows rows of x [rows][n] (dx: a device copy) equals cpu_argmax row by row;
 * row r is of kind r % 6. */
static void check_argmax(const float *x, const float *dx, int64_t rows, int64_t n)
{
    int32_t *didx = dpoison((size_t)rows * 4);
    GPU_OK(cuda_argmax(didx, dx, rows, n, gpu_st));
    int32_t *am = dget(didx, (size_t)rows * 4);
    for (int64_t r = 0; r < rows; r++)
        if (am[r] != cpu_argmax(x + r * n, n))
            fail_msg("argmax n %lld row %lld (kind %d) of %lld: %d, CPU %lld", (long long)n,
                     (long long)r, (int)(r % 6), (long long)rows, am[r],
                     (long long)cpu_argmax(x + r * n, n));
    free(am);
    cuda_mem_free(didx);
}

static void test_argmax_and_topk_match_cpu_exactly(void **state)
{
    (void)state;
    static const int64_t ns[] = {1, 5, 1000, 65537, 248320}; /* 65537: 4 slices, odd rows */
    static const int64_t ks[] = {1, 7, 64, 1024};
    rng_seed(4);
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        const int64_t n = ns[a], rows = 6; /* one row of each kind */
        float *x = malloc((size_t)(rows * n) * sizeof *x);
        for (int r = 0; r < rows; r++)
            fill_row(x + r * n, n, r);
        float *dx = dput(x, (size_t)(rows * n) * 4);
        check_argmax(x, dx, rows, n);

        for (size_t b = 0; b <= sizeof ks / sizeof ks[0]; b++) {
            const int64_t k = b < sizeof ks / sizeof ks[0] ? ks[b] : n; /* also k = n */
            if (k > n || k > 1024)
                continue;
            int32_t *ref_i = malloc((size_t)(rows * k) * 4);
            float *ref_v = malloc((size_t)(rows * k) * 4);
            for (int r = 0; r < rows; r++)
                cpu_topk(ref_i + r * k, ref_v + r * k, x + r * n, n, k);
            int32_t *di = dpoison((size_t)(rows * k) * 4);
            float *dv = dpoison((size_t)(rows * k) * 4);
            GPU_OK(cuda_topk(di, dv, dx, rows, n, k, gpu_st));
            int32_t *gi = dget(di, (size_t)(rows * k) * 4);
            float *gv = dget(dv, (size_t)(rows * k) * 4);
            char what[64];
            snprintf(what, sizeof what, "topk ids n %lld k %lld", (long long)n, (long long)k);
            assert_true(check_same_bits(what, gi, ref_i, (size_t)(rows * k) * 4));
            snprintf(what, sizeof what, "topk values n %lld k %lld", (long long)n, (long long)k);
            assert_true(check_same_bits(what, gv, ref_v, (size_t)(rows * k) * 4));
            GPU_OK(cuda_topk(di, NULL, dx, rows, n, k, gpu_st)); /* values are optional */
            free(gi);
            gi = dget(di, (size_t)(rows * k) * 4);
            assert_true(check_same_bits("topk ids without values", gi, ref_i, (size_t)(rows * k) * 4));
            free(gi);
            free(gv);
            free(ref_i);
            free(ref_v);
            cuda_mem_free(di);
            cuda_mem_free(dv);
        }
        cuda_mem_free(dx);
        free(x);
    }
    /* more rows than one split launch takes (RS_ROWS_MAX = 16384): argmax in two launches */
    const int64_t rows = 16390, n = 7;
    float *x = malloc((size_t)(rows * n) * sizeof *x);
    for (int64_t r = 0; r < rows; r++)
        fill_row(x + r * n, n, (int)(r % 6));
    float *dx = dput(x, (size_t)(rows * n) * 4);
    check_argmax(x, dx, rows, n);
    free(x);
    cuda_mem_free(dx);
}

/* ---- RoPE -------------------------------------------------------------------------------- */

/* Angles are f64 on both sides and rounded to f32, products are unfused on both: equal
 * unless a cos/sin lands on a rounding boundary, then 1 ulp of the inputs (|x| <= 1). */
static void test_rope_matches_cpu(void **state)
{
    (void)state;
    /* qwen35's query layout (256 query + 256 gate values per head, 64 rotated dims) and a
     * full-width qwen3 head */
    static const struct { int64_t n_tok, n_head, head_stride, n_rot; float theta; } cs[] = {
        {5, 3, 512, 64, 1e7f}, {4, 8, 128, 128, 1e6f}, {1, 1, 16, 16, 10000.0f}};
    rng_seed(5);
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int64_t tok_stride = cs[c].n_head * cs[c].head_stride + 3;
        const int64_t n = cs[c].n_tok * tok_stride;
        float *x = rng_floats(n, 1), *ref = malloc((size_t)n * 4);
        memcpy(ref, x, (size_t)n * 4);
        int32_t pos[5] = {0, 7, 4095, 1000000, INT32_MAX};
        cpu_rope_neox(ref, cs[c].n_tok, cs[c].n_head, tok_stride, cs[c].head_stride,
                      cs[c].n_rot, pos, cs[c].theta);
        float *dx = dput(x, (size_t)n * 4);
        int32_t *dpos = dput(pos, sizeof pos);
        GPU_OK(cuda_rope_neox(dx, cs[c].n_tok, cs[c].n_head, tok_stride, cs[c].head_stride,
                          cs[c].n_rot, dpos, cs[c].theta, gpu_st));
        float *got = dget(dx, (size_t)n * 4);
        assert_true(check_close("rope", got, ref, n, 0, 2.5e-7f));
        free(got);
        cuda_mem_free(dx);
        cuda_mem_free(dpos);
        free(x);
        free(ref);
    }
}

/* ---- conv1d and delta rule ----------------------------------------------------------------- */

/* Same order and unfused roundings as the CPU: equal up to a CPU build that fuses (1e-6). */
static void test_conv1d_matches_cpu_and_is_token_invariant(void **state)
{
    (void)state;
    static const int64_t cs[][3] = {{77, 4, 5}, {10240, 4, 1}, {130, 1, 3}, {33, 16, 20}};
    rng_seed(6);
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int64_t n_ch = cs[c][0], k = cs[c][1], n_tok = cs[c][2];
        const int64_t x_stride = n_ch + 5, sn = (k - 1) * n_ch;
        float *x = rng_floats(n_tok * x_stride, 2), *w = rng_floats(n_ch * k, 1);
        float *st0 = rng_floats(sn, 2);
        float *ref = malloc((size_t)(n_tok * n_ch) * 4), *rst = malloc((size_t)(sn + 1) * 4);
        float *rall = malloc((size_t)(n_tok * sn + 1) * 4);
        memcpy(rst, st0, (size_t)sn * 4);
        cpu_conv1d_causal(ref, rst, rall, x, x_stride, w, n_tok, n_ch, k);
        float *dx = dput(x, (size_t)(n_tok * x_stride) * 4), *dw = dput(w, (size_t)(n_ch * k) * 4);
        float *dst = dput(st0, (size_t)sn * 4), *dout = dpoison((size_t)(n_tok * n_ch) * 4);
        float *dall = dpoison((size_t)(n_tok * sn) * 4);
        GPU_OK(cuda_conv1d_causal(dout, k > 1 ? dst : NULL, dall, dx, x_stride, dw, n_tok, n_ch, k,
                              gpu_st));
        float *got = dget(dout, (size_t)(n_tok * n_ch) * 4);
        float *gst = dget(dst, (size_t)sn * 4), *gall = dget(dall, (size_t)(n_tok * sn) * 4);
        assert_true(check_close("conv out", got, ref, n_tok * n_ch, 1e-6f, 1e-6f));
        assert_true(check_same_bits("conv state", gst, rst, (size_t)sn * 4));     /* copies of inputs */
        assert_true(check_same_bits("conv state_all", gall, rall, (size_t)(n_tok * sn) * 4));

        /* token by token: the same bits as all at once */
        GPU_OK(cuda_mem_upload(dst, st0, (size_t)sn * 4, gpu_st));
        float *dout1 = dpoison((size_t)(n_tok * n_ch) * 4);
        for (int64_t t = 0; t < n_tok; t++)
            GPU_OK(cuda_conv1d_causal(dout1 + t * n_ch, k > 1 ? dst : NULL, NULL, dx + t * x_stride,
                                  x_stride, dw, 1, n_ch, k, gpu_st));
        float *got1 = dget(dout1, (size_t)(n_tok * n_ch) * 4);
        assert_true(check_same_bits("conv token by token", got1, got, (size_t)(n_tok * n_ch) * 4));
        free(got1);
        free(gst);
        gst = dget(dst, (size_t)sn * 4);
        assert_true(check_same_bits("conv state token by token", gst, rst, (size_t)sn * 4));
        cuda_mem_free(dout1);
        free(got);
        free(gst);
        free(gall);
        cuda_mem_free(dx);
        cuda_mem_free(dw);
        cuda_mem_free(dst);
        cuda_mem_free(dout);
        cuda_mem_free(dall);
        free(x);
        free(w);
        free(st0);
        free(ref);
        free(rst);
        free(rall);
    }
}

/* The GPU fuses the d_k-term sums the CPU rounds term by term: per token ~d_k * 2^-24
 * relative of |S| |k| ~ 1, compounding over n_tok tokens (|decay| <= 1, beta <= 1 keep the
 * recurrence contractive): 2e-5 absolute for 9 tokens of d_k 128. */
static void test_delta_rule_matches_cpu_and_is_token_invariant(void **state)
{
    (void)state;
    static const int64_t cs[][5] = {{2, 6, 128, 128, 9}, {1, 3, 16, 40, 4}, {16, 48, 128, 128, 1},
                                   {1, 2, 128, 64, 2},  {1, 2, 128, 64, 3}, {1, 3, 16, 40, 5}};
    rng_seed(7);
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        ops_delta d = {0};
        d.n_k_head = cs[c][0], d.n_v_head = cs[c][1], d.d_k = cs[c][2], d.d_v = cs[c][3];
        d.n_tok = cs[c][4];
        const int64_t T = d.n_tok, nk = d.n_k_head * d.d_k, nv = d.n_v_head * d.d_v;
        const int64_t ns = d.n_v_head * d.d_k * d.d_v;
        d.q_tok_stride = d.k_tok_stride = nk + 1;
        d.v_tok_stride = nv + 2;
        float *q = rng_floats(T * (nk + 1), 1), *k = rng_floats(T * (nk + 1), 1);
        float *v = rng_floats(T * (nv + 2), 1), *g = rng_floats(T * d.n_v_head, 1);
        float *beta = rng_floats(T * d.n_v_head, 1), *s0 = rng_floats(ns, 0.5f);
        /* as the model feeds it: q, k unit length (q also scaled), g <= 0, beta in (0, 1) */
        cpu_l2norm(q, q, T * d.n_k_head, d.d_k, d.d_k, 1e-6f);
        cpu_l2norm(k, k, T * d.n_k_head, d.d_k, d.d_k, 1e-6f);
        for (int64_t t = 0; t < T; t++) {
            /* l2norm rows are d_k apart; the token stride has one extra value */
            memmove(q + t * (nk + 1), q + t * nk, (size_t)nk * 4);
            memmove(k + t * (nk + 1), k + t * nk, (size_t)nk * 4);
        }
        for (int64_t i = 0; i < T * d.n_v_head; i++) {
            g[i] = -fabsf(g[i]) * 0.3f;
            beta[i] = 0.5f + 0.5f * beta[i];
        }
        for (int64_t t = T - 1; t >= 0; t--) /* re-normalise after the moves */
            cpu_l2norm(q + t * (nk + 1), q + t * (nk + 1), d.n_k_head, d.d_k, d.d_k, 1e-6f),
            cpu_l2norm(k + t * (nk + 1), k + t * (nk + 1), d.n_k_head, d.d_k, d.d_k, 1e-6f);
        cpu_scale(q, q, 1.0f / sqrtf((float)d.d_k), T * (nk + 1));

        ops_delta r = d;
        float *rstate = malloc((size_t)ns * 4), *rout = malloc((size_t)(T * nv) * 4);
        float *rall = malloc((size_t)(T * ns) * 4);
        memcpy(rstate, s0, (size_t)ns * 4);
        r.q = q, r.k = k, r.v = v, r.g = g, r.beta = beta;
        r.state = rstate, r.state_all = rall, r.out = rout;
        cpu_delta_rule(&r);

        ops_delta gd = d;
        gd.q = dput(q, (size_t)(T * (nk + 1)) * 4);
        gd.k = dput(k, (size_t)(T * (nk + 1)) * 4);
        gd.v = dput(v, (size_t)(T * (nv + 2)) * 4);
        gd.g = dput(g, (size_t)(T * d.n_v_head) * 4);
        gd.beta = dput(beta, (size_t)(T * d.n_v_head) * 4);
        gd.state = dput(s0, (size_t)ns * 4);
        gd.state_all = dpoison((size_t)(T * ns) * 4);
        gd.out = dpoison((size_t)(T * nv) * 4);
        GPU_OK(cuda_delta_rule(&gd, gpu_st));
        float *gout = dget(gd.out, (size_t)(T * nv) * 4), *gst = dget(gd.state, (size_t)ns * 4);
        float *gall = dget(gd.state_all, (size_t)(T * ns) * 4);
        const float tol = 2e-6f * (float)(d.d_k / 16 + 1) * (float)T;
        assert_true(check_close("delta out", gout, rout, T * nv, 1e-5f, tol));
        assert_true(check_close("delta state", gst, rstate, ns, 1e-5f, tol));
        assert_true(check_close("delta state_all", gall, rall, T * ns, 1e-5f, tol));

        /* token by token: the same bits as all at once */
        ops_delta one = gd;
        float *dout1 = dpoison((size_t)(T * nv) * 4);
        GPU_OK(cuda_mem_upload(gd.state, s0, (size_t)ns * 4, gpu_st));
        one.n_tok = 1;
        one.state_all = NULL;
        for (int64_t t = 0; t < T; t++) {
            one.q = gd.q + t * d.q_tok_stride, one.k = gd.k + t * d.k_tok_stride;
            one.v = gd.v + t * d.v_tok_stride;
            one.g = gd.g + t * d.n_v_head, one.beta = gd.beta + t * d.n_v_head;
            one.out = dout1 + t * nv;
            GPU_OK(cuda_delta_rule(&one, gpu_st));
        }
        float *gout1 = dget(dout1, (size_t)(T * nv) * 4), *gst1 = dget(gd.state, (size_t)ns * 4);
        assert_true(check_same_bits("delta out token by token", gout1, gout, (size_t)(T * nv) * 4));
        assert_true(check_same_bits("delta state token by token", gst1, gst, (size_t)ns * 4));
        free(gout1);
        free(gst1);
        cuda_mem_free(dout1);
        cuda_mem_free((void *)gd.q);
        cuda_mem_free((void *)gd.k);
        cuda_mem_free((void *)gd.v);
        cuda_mem_free((void *)gd.g);
        cuda_mem_free((void *)gd.beta);
        cuda_mem_free(gd.state);
        cuda_mem_free(gd.state_all);
        cuda_mem_free(gd.out);
        free(gout);
        free(gst);
        free(gall);
        free(q), free(k), free(v), free(g), free(beta), free(s0);
        free(rstate), free(rout), free(rall);
    }
}

/* Random inputs of a recurrence of T tokens, rows dense: q, k [T][nk * dk] (~0.1), v, z
 * [T][nv * dv], g <= 0 and beta in (0.5, 1) [T][nv], a starting state [nv][dk][dv]. */
typedef struct delta_rand {
    float *q, *k, *v, *g, *b, *z, *s0;
} delta_rand;

static delta_rand delta_rand_make(int64_t T, int64_t nk, int64_t nv, int64_t dk, int64_t dv)
{
    const int64_t qs = nk * dk, vs = nv * dv;
    delta_rand x = {rng_floats(T * qs, 0.1f), rng_floats(T * qs, 0.1f), rng_floats(T * vs, 1),
                    rng_floats(T * nv, 1),    rng_floats(T * nv, 1),    rng_floats(T * vs, 2),
                    rng_floats(nv * dk * dv, 0.5f)};
    for (int64_t i = 0; i < T * nv; i++)
        x.g[i] = -fabsf(x.g[i]) * 0.3f, x.b[i] = 0.5f + 0.5f * x.b[i];
    return x;
}

static void delta_rand_free(delta_rand *x)
{
    free(x->q), free(x->k), free(x->v), free(x->g), free(x->b), free(x->z), free(x->s0);
}

/* d with x's q, k, v, g and beta uploaded to the device (T = d->n_tok). */
static ops_delta delta_rand_put(const ops_delta *d, const delta_rand *x)
{
    const int64_t T = d->n_tok, qs = d->q_tok_stride, vs = d->v_tok_stride, nv = d->n_v_head;
    ops_delta gd = *d;
    gd.q = dput(x->q, (size_t)(T * qs) * 4), gd.k = dput(x->k, (size_t)(T * qs) * 4);
    gd.v = dput(x->v, (size_t)(T * vs) * 4), gd.g = dput(x->g, (size_t)(T * nv) * 4);
    gd.beta = dput(x->b, (size_t)(T * nv) * 4);
    return gd;
}

static void delta_put_free(const ops_delta *gd)
{
    cuda_mem_free((void *)gd->q), cuda_mem_free((void *)gd->k), cuda_mem_free((void *)gd->v);
    cuda_mem_free((void *)gd->g), cuda_mem_free((void *)gd->beta);
}

/* The delta rule with its gated norm (ops_delta.norm_z): the bits of cuda_delta_rule then
 * cuda_rmsnorm_silu, whether one launch runs both (one token, a head that fits a block: d_k
 * 128 and a generic d_k, with and without a weight) or not (several tokens, d_v 200), and
 * cpu_delta_rule's result within the plain rule's tolerance. */
static void test_delta_rule_with_norm_is_the_rule_then_the_norm(void **state)
{
    (void)state;
    static const int64_t cs[][6] = {{2, 6, 128, 128, 9, 1}, {1, 3, 16, 40, 1, 0},
                                    {16, 48, 128, 128, 1, 1}, {1, 2, 16, 200, 1, 1},
                                    {2, 4, 128, 96, 1, 0}, {1, 3, 16, 40, 4, 1}};
    rng_seed(8);
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int64_t nk = cs[c][0], nv = cs[c][1], dk = cs[c][2], dv = cs[c][3], T = cs[c][4];
        const int64_t qs = nk * dk, vs = nv * dv, ns = nv * dk * dv;
        delta_rand x = delta_rand_make(T, nk, nv, dk, dv);
        float *z = x.z, *s0 = x.s0, *w = rng_floats(dv, 1);
        ops_delta d = {.n_tok = T, .n_k_head = nk, .n_v_head = nv, .d_k = dk, .d_v = dv,
                       .q_tok_stride = qs, .k_tok_stride = qs, .v_tok_stride = vs,
                       .norm_eps = 1e-6f};
        ops_delta r = d;
        float *rst = malloc((size_t)ns * 4), *rout = malloc((size_t)(T * vs) * 4);
        memcpy(rst, s0, (size_t)ns * 4);
        r.q = x.q, r.k = x.k, r.v = x.v, r.g = x.g, r.beta = x.b, r.state = rst, r.out = rout;
        r.norm_z = z, r.norm_w = cs[c][5] ? w : NULL;
        cpu_delta_rule(&r);

        ops_delta gd = delta_rand_put(&d, &x);
        float *dz = dput(z, (size_t)(T * vs) * 4), *dw = dput(w, (size_t)dv * 4);
        float *st2 = dput(s0, (size_t)ns * 4), *out2 = dpoison((size_t)(T * vs) * 4);
        gd.state = dput(s0, (size_t)ns * 4), gd.out = dpoison((size_t)(T * vs) * 4);
        gd.norm_z = dz, gd.norm_w = cs[c][5] ? dw : NULL;
        GPU_OK(cuda_delta_rule(&gd, gpu_st));
        ops_delta two = gd; /* the rule, then the norm */
        two.norm_z = NULL, two.state = st2, two.out = out2;
        GPU_OK(cuda_delta_rule(&two, gpu_st));
        GPU_OK(cuda_rmsnorm_silu(out2, out2, gd.norm_w, dz, T * nv, dv, 1e-6f, gpu_st));
        float *gout = dget(gd.out, (size_t)(T * vs) * 4), *gout2 = dget(out2, (size_t)(T * vs) * 4);
        float *gst = dget(gd.state, (size_t)ns * 4), *gst2 = dget(st2, (size_t)ns * 4);
        assert_true(check_same_bits("delta+norm out", gout, gout2, (size_t)(T * vs) * 4));
        assert_true(check_same_bits("delta+norm state", gst, gst2, (size_t)ns * 4));
        const float tol = 2e-6f * (float)(dk / 16 + 1) * (float)T;
        assert_true(check_close("delta+norm state vs cpu", gst, rst, ns, 1e-5f, tol));
        /* the norm scales by ~1/rms of the row: the rule's error grows by that much */
        assert_true(check_close("delta+norm out vs cpu", gout, rout, T * vs, 1e-4f, 1e-4f));
        free(gout), free(gout2), free(gst), free(gst2);
        delta_put_free(&gd), cuda_mem_free(dz);
        cuda_mem_free(dw), cuda_mem_free(st2), cuda_mem_free(out2), cuda_mem_free(gd.state);
        cuda_mem_free(gd.out);
        delta_rand_free(&x), free(w), free(rst), free(rout);
    }
}

/* The chunked form (ops_delta.chunk) against cpu_delta_rule's: chunks cut by the alignment
 * (pos0 on the device), d_k not a multiple of 4 and short of 128, heads wider than a block's
 * columns, the gated norm, the 27B shape; a run cut at a chunk end gives the bits of the run
 * whole (the two parts told their positions), and every case is within rounding of the
 * token-by-token form. Columns: n_k_head, n_v_head, d_k, d_v, tokens, chunk, pos0, norm,
 * state_in. */
static void test_delta_rule_chunked_matches_cpu(void **state)
{
    (void)state;
    static const int64_t cs[][9] = {{2, 6, 128, 128, 150, 64, 40, 0, 0},
                                    {16, 48, 128, 128, 64, 64, 128, 1, 0},
                                    {1, 3, 98, 72, 37, 7, 3, 0, 1},
                                    {1, 2, 16, 40, 5, 64, 62, 1, 0},
                                    {2, 4, 64, 64, 33, 32, 0, 0, 0}};
    /* every supported GPU holds chunks of 32 (sm_86: 99 KB per block); sm_90 all 64 */
    const int64_t most = cuda_delta_chunk_max(0);
    assert_true(most >= 32 && most <= OPS_DELTA_CHUNK_MAX);
    rng_seed(9);
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int64_t nk = cs[c][0], nv = cs[c][1], dk = cs[c][2], dv = cs[c][3], T = cs[c][4];
        const int64_t qs = nk * dk, vs = nv * dv, ns = nv * dk * dv;
        const int64_t C = cs[c][5] < most ? cs[c][5] : most;
        const int32_t p0 = (int32_t)cs[c][6];
        delta_rand x = delta_rand_make(T, nk, nv, dk, dv);
        float *z = x.z, *s0 = x.s0;
        ops_delta d = {.n_tok = T, .n_k_head = nk, .n_v_head = nv, .d_k = dk, .d_v = dv,
                       .q_tok_stride = qs, .k_tok_stride = qs, .v_tok_stride = vs,
                       .norm_eps = 1e-6f, .chunk = C};
        ops_delta r = d, r1 = d;
        float *rst = malloc((size_t)ns * 4), *rout = malloc((size_t)(T * vs) * 4);
        float *rst1 = malloc((size_t)ns * 4), *rout1 = malloc((size_t)(T * vs) * 4);
        memcpy(rst, s0, (size_t)ns * 4);
        memcpy(rst1, s0, (size_t)ns * 4);
        r.q = x.q, r.k = x.k, r.v = x.v, r.g = x.g, r.beta = x.b, r.state = rst, r.out = rout;
        r.norm_z = cs[c][7] ? z : NULL, r.pos0 = &p0;
        cpu_delta_rule(&r);
        r1 = r, r1.chunk = 0, r1.state = rst1, r1.out = rout1; /* token by token */
        cpu_delta_rule(&r1);

        ops_delta gd = delta_rand_put(&d, &x);
        float *dz = dput(z, (size_t)(T * vs) * 4), *din = dput(s0, (size_t)ns * 4);
        gd.state = cs[c][8] ? dpoison((size_t)ns * 4) : dput(s0, (size_t)ns * 4);
        gd.state_in = cs[c][8] ? din : NULL;
        gd.state_prev = dpoison((size_t)ns * 4), gd.out = dpoison((size_t)(T * vs) * 4);
        gd.norm_z = cs[c][7] ? dz : NULL, gd.pos0 = dput(&p0, 4);
        if (dk == OPS_DELTA_CHUNK_DK && most < OPS_DELTA_CHUNK_MAX) { /* one past what fits */
            ops_delta big = gd;
            big.chunk = most + 1;
            assert_int_equal(cuda_delta_rule(&big, gpu_st), TD_ENOTSUP);
        }
        GPU_OK(cuda_delta_rule(&gd, gpu_st));
        float *gout = dget(gd.out, (size_t)(T * vs) * 4), *gst = dget(gd.state, (size_t)ns * 4);
        float *gprev = dget(gd.state_prev, (size_t)ns * 4);
        assert_true(check_same_bits("chunked state_prev", gprev, s0, (size_t)ns * 4));
        /* on the CPU the two forms differ by <= 3e-7 here (outputs up to ~0.7) */
        assert_true(check_close("chunked out vs cpu", gout, rout, T * vs, 2e-5f, 5e-6f));
        assert_true(check_close("chunked state vs cpu", gst, rst, ns, 2e-5f, 5e-6f));
        assert_true(check_close("chunked out vs token by token", gout, rout1, T * vs, 1e-4f, 2e-5f));
        assert_true(check_close("chunked state vs token by token", gst, rst1, ns, 1e-4f, 2e-5f));

        /* cut at the first chunk end: the same bits */
        const int64_t cut = C - p0 % C;
        if (cut < T) {
            const int32_t p1 = (int32_t)(p0 + cut);
            ops_delta a = gd, b2 = gd;
            a.state_prev = NULL, a.n_tok = cut, a.out = dpoison((size_t)(T * vs) * 4);
            a.state = cs[c][8] ? dpoison((size_t)ns * 4) : dput(s0, (size_t)ns * 4);
            GPU_OK(cuda_delta_rule(&a, gpu_st));
            b2.state_prev = NULL, b2.state_in = NULL, b2.state = a.state, b2.n_tok = T - cut;
            b2.q += cut * qs, b2.k += cut * qs, b2.v += cut * vs, b2.g += cut * nv;
            b2.beta += cut * nv, b2.out = a.out + cut * vs, b2.pos0 = dput(&p1, 4);
            b2.norm_z = gd.norm_z ? gd.norm_z + cut * vs : NULL;
            GPU_OK(cuda_delta_rule(&b2, gpu_st));
            float *cout = dget(a.out, (size_t)(T * vs) * 4), *cst = dget(a.state, (size_t)ns * 4);
            assert_true(check_same_bits("chunked out cut", cout, gout, (size_t)(T * vs) * 4));
            assert_true(check_same_bits("chunked state cut", cst, gst, (size_t)ns * 4));
            free(cout), free(cst);
            cuda_mem_free(a.out), cuda_mem_free(a.state), cuda_mem_free((void *)b2.pos0);
        }
        free(gout), free(gst), free(gprev);
        delta_put_free(&gd), cuda_mem_free(dz);
        cuda_mem_free(din), cuda_mem_free(gd.state), cuda_mem_free(gd.state_prev);
        cuda_mem_free(gd.out), cuda_mem_free((void *)gd.pos0);
        delta_rand_free(&x), free(rst), free(rout), free(rst1), free(rout1);
    }
}

/* cuda_delta_rule_many (the rollback's replay of every layer): each recurrence gets the bits
 * it gets alone. 70 recurrences: 67 of one shape (four launches of 16, then one of 3), one
 * of another shape between them (its own launch), two more of the first; each reads its own
 * tokens and starting state; outputs are wanted only from the odd shape. */
static void test_delta_rule_many_equals_one_at_a_time(void **state)
{
    (void)state;
    enum { N = 70, ODD = 67, NK = 2, NV = 6, DK = 128, DV = 128, T = 5, T_ODD = 3 };
    const int64_t qs = NK * DK + 3, vs = NV * DV + 1, ns = NV * DK * DV, tok = T + N;
    rng_seed(9);
    float *q = rng_floats(tok * qs, 0.1f), *k = rng_floats(tok * qs, 0.1f);
    float *v = rng_floats(tok * vs, 1), *g = rng_floats(tok * 2 * NV, 1);
    for (int64_t t = 0; t < tok; t++)
        for (int64_t h = 0; h < NV; h++) { /* g <= 0, beta in (0, 1): [t][2][NV] */
            g[t * 2 * NV + h] = -fabsf(g[t * 2 * NV + h]) * 0.3f;
            g[t * 2 * NV + NV + h] = 0.5f + 0.5f * g[t * 2 * NV + NV + h];
        }
    float *s0 = rng_floats(N * ns, 0.5f);
    float *dq = dput(q, (size_t)(tok * qs) * 4), *dk = dput(k, (size_t)(tok * qs) * 4);
    float *dv = dput(v, (size_t)(tok * vs) * 4), *dg = dput(g, (size_t)(tok * 2 * NV) * 4);
    float *ds0 = dput(s0, (size_t)(N * ns) * 4);
    float *alone = dpoison((size_t)(N * ns) * 4), *many = dpoison((size_t)(N * ns) * 4);
    float *out1 = dpoison((size_t)(T_ODD * NV * DV) * 4), *outm = dpoison((size_t)(T_ODD * NV * DV) * 4);
    ops_delta d[N];
    for (int i = 0; i < N; i++) {
        d[i] = (ops_delta){.n_tok = i == ODD ? T_ODD : T, .n_k_head = NK, .n_v_head = NV,
                           .d_k = DK, .d_v = DV, .q = dq + i * qs, .k = dk + i * qs + 1,
                           .v = dv + i * vs, .q_tok_stride = qs, .k_tok_stride = qs,
                           .v_tok_stride = vs, .g = dg + i * 2 * NV, .beta = dg + i * 2 * NV + NV,
                           .gb_tok_stride = 2 * NV, .state = alone + i * ns,
                           .state_in = ds0 + i * ns, .out = i == ODD ? out1 : NULL};
        GPU_OK(cuda_delta_rule(&d[i], gpu_st));
        d[i].state = many + i * ns;
        if (i == ODD)
            d[i].out = outm;
    }
    GPU_OK(cuda_delta_rule_many(d, N, gpu_st));
    float *ga = dget(alone, (size_t)(N * ns) * 4), *gm = dget(many, (size_t)(N * ns) * 4);
    float *go1 = dget(out1, (size_t)(T_ODD * NV * DV) * 4), *gom = dget(outm, (size_t)(T_ODD * NV * DV) * 4);
    assert_true(check_same_bits("delta many states", gm, ga, (size_t)(N * ns) * 4));
    assert_true(check_same_bits("delta many output", gom, go1, (size_t)(T_ODD * NV * DV) * 4));
    /* the states moved: a launch that did nothing would leave the poison in both */
    for (int i = 0; i < N; i++)
        assert_true(isfinite(gm[i * ns]) && gm[i * ns] != s0[i * ns]);
    free(ga), free(gm), free(go1), free(gom);
    cuda_mem_free(dq), cuda_mem_free(dk), cuda_mem_free(dv), cuda_mem_free(dg);
    cuda_mem_free(ds0), cuda_mem_free(alone), cuda_mem_free(many);
    cuda_mem_free(out1), cuda_mem_free(outm);
    free(q), free(k), free(v), free(g), free(s0);
}

/* ---- unsupported shapes and memory errors ---------------------------------------------- */

static void test_unsupported_shapes_and_oom_are_errors(void **state)
{
    (void)state;
    void *p = NULL;
    assert_int_equal(cuda_mem_alloc(&p, (size_t)1 << 60), TD_ENOMEM);
    assert_null(p);
    assert_true(strstr(err_msg(), "no room") != NULL);

    float *dx = dpoison(4096 * 4);
    int32_t *di = dpoison(2048 * 4);
    assert_int_equal(cuda_topk(di, NULL, dx, 1, 4096, 1025, gpu_st), TD_ENOTSUP);
    assert_int_equal(cuda_conv1d_causal(dx, dx + 1024, NULL, dx + 2048, 1, dx + 3072, 1, 1, 17,
                                        gpu_st),
                     TD_ENOTSUP);
    ops_attn a = {0};
    a.n_q = 1, a.n_head = 1, a.n_head_kv = 1, a.head_dim = 512, a.kv_type = TD_F32;
    a.q = a.out = dx, a.k = a.v = dx, a.q_pos = a.k_pos = di, a.n_kv = 1;
    assert_int_equal(cuda_attention(&a, gpu_st), TD_ENOTSUP);
    ops_delta d = {0};
    d.n_tok = 1, d.n_k_head = d.n_v_head = 1, d.d_k = 256, d.d_v = 4;
    d.q = d.k = d.v = d.g = d.beta = dx, d.state = d.out = dx;
    assert_int_equal(cuda_delta_rule(&d, gpu_st), TD_ENOTSUP);
    ops_sampler bad = {.temperature = -1, .top_p = 1};
    assert_int_equal(cuda_sample_probs(dx, dx, 16, &bad, gpu_st), TD_EINVAL);
    bad.temperature = 1, bad.top_p = NAN;
    assert_int_equal(cuda_sample_probs(dx, dx, 16, &bad, gpu_st), TD_EINVAL);

    /* the failed allocation left nothing behind: the next op and its check succeed */
    float one[4] = {1, 2, 3, 4}, want[4] = {2, 4, 6, 8};
    float *d1 = dput(one, sizeof one);
    GPU_OK(cuda_add(d1, d1, d1, 4, gpu_st));
    float *got = dget(d1, sizeof one);
    assert_true(check_same_bits("add after errors", got, want, sizeof want));
    free(got);
    cuda_mem_free(d1);
    cuda_mem_free(dx);
    cuda_mem_free(di);
}

int main(void)
{
    if (!gpu_check_init())
        return SKIP_EXIT;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_norms_match_cpu),
        cmocka_unit_test(test_elementwise_match_cpu),
        cmocka_unit_test(test_softmax_matches_cpu),
        cmocka_unit_test(test_argmax_and_topk_match_cpu_exactly),
        cmocka_unit_test(test_rope_matches_cpu),
        cmocka_unit_test(test_conv1d_matches_cpu_and_is_token_invariant),
        cmocka_unit_test(test_delta_rule_matches_cpu_and_is_token_invariant),
        cmocka_unit_test(test_delta_rule_with_norm_is_the_rule_then_the_norm),
        cmocka_unit_test(test_delta_rule_many_equals_one_at_a_time),
        cmocka_unit_test(test_delta_rule_chunked_matches_cpu),
        cmocka_unit_test(test_unsupported_shapes_and_oom_are_errors),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_check_free();
    return rc;
}

#endif /* TANDEM_HAVE_CUDA */
