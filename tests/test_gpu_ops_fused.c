/* The fused CUDA ops (kernels/cuda/fused.cu, deltanet_in.cu, conv1d_silu, swiglu_matmul)
 * against their CPU twins or the launches they replace, on random data and odd shapes, each
 * row or token bit-identical alone and inside a block (what greedy speculative decoding on
 * the GPU relies on), the delta rule's strided g/beta and state-before output
 * against its dense form bit for bit, the 2D device copy, the f16 store of the KV cache and
 * attention reading its key count from the device. Outputs start as NaN, so an
 * element never written fails. Skipped (77) without CUDA or a device. */
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

#ifndef TANDEM_HAVE_CUDA

int main(void)
{
    printf("skipped: this build has no CUDA\n");
    return 77;
}

#else

GPU_CHECK_SANITIZER_OPTIONS

/* As test_gpu_ops' norms: f32 partial sums meeting in f64 against the CPU's f64 sum, 2e-6
 * relative; the add is one IEEE operation, bit-identical. */
static void test_add_rmsnorm_matches_cpu_and_rows_are_independent(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{1, 1},    {3, 7},    {16, 5120}, {2, 300},
                                        {2, 1025}, {2, 4097}, {2, 5121},  {2, 9000}};
    rng_seed(21);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int64_t rows = shapes[s][0], dim = shapes[s][1], n = rows * dim;
        const size_t bytes = (size_t)n * 4;
        float *x = rng_floats(n, 4), *h = rng_floats(n, 2), *w = rng_floats(dim, 1.5f);
        float *rx = malloc(bytes), *rh = malloc(bytes);
        memcpy(rx, x, bytes);
        memcpy(rh, h, bytes);
        cpu_add_rmsnorm(rx, rh, rh, w, rows, dim, 1e-6f);
        float *dx = dput(x, bytes), *dh = dput(h, bytes), *dw = dput(w, (size_t)dim * 4);
        GPU_OK(cuda_add_rmsnorm(dx, dh, dh, dw, rows, dim, 1e-6f, gpu_st)); /* out = h */
        float *gx = dget(dx, bytes), *gh = dget(dh, bytes);
        assert_true(check_same_bits("add_rmsnorm x", gx, rx, bytes));
        assert_true(check_close("add_rmsnorm out", gh, rh, n, 2e-6f, 1e-30f));
        /* the last row alone, into a separate output: the same bits, of x too */
        float *dx1 = dput(x + (rows - 1) * dim, (size_t)dim * 4);
        float *dh1 = dput(h + (rows - 1) * dim, (size_t)dim * 4);
        float *dout = dpoison((size_t)dim * 4);
        GPU_OK(cuda_add_rmsnorm(dx1, dh1, dout, dw, 1, dim, 1e-6f, gpu_st));
        float *g1 = dget(dout, (size_t)dim * 4), *gx1 = dget(dx1, (size_t)dim * 4);
        assert_true(check_same_bits("add_rmsnorm row alone", g1, gh + (rows - 1) * dim,
                                    (size_t)dim * 4));
        assert_true(check_same_bits("add_rmsnorm row alone x", gx1, gx + (rows - 1) * dim,
                                    (size_t)dim * 4));
        free(g1), free(gx1), free(gx), free(gh), free(x), free(h), free(w), free(rx), free(rh);
        cuda_mem_free(dx), cuda_mem_free(dh), cuda_mem_free(dw), cuda_mem_free(dx1);
        cuda_mem_free(dh1), cuda_mem_free(dout);
    }
}

/* Norm 2e-6 (above) and CUDA's expf in the sigmoid 1e-6 (test_gpu_ops): 4e-6 relative. */
static void test_rmsnorm_silu_matches_cpu(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{1, 1}, {48, 128}, {17, 200}};
    rng_seed(22);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int64_t rows = shapes[s][0], dim = shapes[s][1], n = rows * dim;
        const size_t bytes = (size_t)n * 4;
        float *x = rng_floats(n, 3), *z = rng_floats(n, 12), *w = rng_floats(dim, 2);
        float *ref = malloc(bytes);
        cpu_rmsnorm_silu(ref, x, w, z, rows, dim, 1e-6f);
        float *dx = dput(x, bytes), *dz = dput(z, bytes), *dw = dput(w, (size_t)dim * 4);
        float *dout = dpoison(bytes);
        GPU_OK(cuda_rmsnorm_silu(dout, dx, dw, dz, rows, dim, 1e-6f, gpu_st));
        float *got = dget(dout, bytes);
        assert_true(check_close("rmsnorm_silu", got, ref, n, 4e-6f, 1e-30f));
        GPU_OK(cuda_rmsnorm_silu(dx, dx, dw, dz, rows, dim, 1e-6f, gpu_st)); /* in place */
        float *got2 = dget(dx, bytes);
        assert_true(check_same_bits("rmsnorm_silu in place", got2, got, bytes));
        free(got), free(got2), free(x), free(z), free(w), free(ref);
        cuda_mem_free(dx), cuda_mem_free(dz), cuda_mem_free(dw), cuda_mem_free(dout);
    }
}

/* L2 norm 2e-6 (as the norms) then the q scale, one more rounding: 3e-6 relative; g through
 * log1pf/expf and beta through expf: 2e-6 (test_gpu_ops' activations, two of them for g). */
static void test_delta_prep_matches_cpu_and_tokens_are_independent(void **state)
{
    (void)state;
    static const int64_t cs[][4] = {{1, 48, 16, 128}, {16, 48, 16, 128}, {5, 9, 3, 7}};
    rng_seed(23);
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) {
        const int64_t T = cs[c][0], nv = cs[c][1], nk = cs[c][2], dk = cs[c][3];
        const int64_t ch = 2 * nk * dk + nv * 3 + 1;
        float *qkv = rng_floats(T * ch, 2), *al = rng_floats(T * nv, 6), *be = rng_floats(T * nv, 6);
        float *dt = rng_floats(nv, 1), *a = rng_floats(nv, 1);
        float *rq = malloc((size_t)(T * ch) * 4), *rgb = malloc((size_t)(T * 2 * nv) * 4);
        memcpy(rq, qkv, (size_t)(T * ch) * 4);
        cpu_delta_prep(rgb, rq, al, be, dt, a, T, nv, nk, dk, ch, 1e-6f);
        float *dq = dput(qkv, (size_t)(T * ch) * 4), *dal = dput(al, (size_t)(T * nv) * 4);
        float *dbe = dput(be, (size_t)(T * nv) * 4), *ddt = dput(dt, (size_t)nv * 4);
        float *da = dput(a, (size_t)nv * 4), *dgb = dpoison((size_t)(T * 2 * nv) * 4);
        GPU_OK(cuda_delta_prep(dgb, dq, dal, dbe, ddt, da, T, nv, nk, dk, ch, 1e-6f, gpu_st));
        float *gq = dget(dq, (size_t)(T * ch) * 4), *ggb = dget(dgb, (size_t)(T * 2 * nv) * 4);
        assert_true(check_close("delta_prep qkv", gq, rq, T * ch, 3e-6f, 1e-30f));
        assert_true(check_close("delta_prep g, beta", ggb, rgb, T * 2 * nv, 2e-6f, 1e-30f));
        /* the last token alone: the same bits */
        float *dq1 = dput(qkv + (T - 1) * ch, (size_t)ch * 4);
        float *dal1 = dput(al + (T - 1) * nv, (size_t)nv * 4), *dbe1 = dput(be + (T - 1) * nv, (size_t)nv * 4);
        float *dgb1 = dpoison((size_t)(2 * nv) * 4);
        GPU_OK(cuda_delta_prep(dgb1, dq1, dal1, dbe1, ddt, da, 1, nv, nk, dk, ch, 1e-6f, gpu_st));
        float *gq1 = dget(dq1, (size_t)ch * 4), *ggb1 = dget(dgb1, (size_t)(2 * nv) * 4);
        assert_true(check_same_bits("delta_prep token alone", gq1, gq + (T - 1) * ch, (size_t)ch * 4));
        assert_true(check_same_bits("delta_prep gates alone", ggb1, ggb + (T - 1) * 2 * nv,
                                    (size_t)(2 * nv) * 4));
        free(qkv), free(al), free(be), free(dt), free(a), free(rq), free(rgb), free(gq), free(ggb);
        free(gq1), free(ggb1);
        cuda_mem_free(dq), cuda_mem_free(dal), cuda_mem_free(dbe), cuda_mem_free(ddt);
        cuda_mem_free(da), cuda_mem_free(dgb), cuda_mem_free(dq1), cuda_mem_free(dal1);
        cuda_mem_free(dbe1), cuda_mem_free(dgb1);
    }
}

/* cuda_deltanet_in: the bits of the three launches it replaces (F32 matmul of alpha and beta,
 * conv1d_silu, delta_prep), and of itself run token by token (the window carried through
 * the state), the window before the block kept where asked; cpu_deltanet_in within delta_prep's tolerance. Shapes: the 27B's (one token, a
 * verify block, a prefill chunk), a small one with an odd token count and a channel count
 * that leaves the last value block part empty, and two that take the three launches
 * (d_k 200; 3 taps). */
static void test_deltanet_in_is_the_three_launches(void **state)
{
    (void)state;
    /* n_tok, nv, nk, dk, dv, cols, taps */
    static const int64_t cs[][7] = {{1, 48, 16, 128, 128, 5120, 4},  {16, 48, 16, 128, 128, 5120, 4},
                                    {64, 48, 16, 128, 128, 5120, 4}, {11, 6, 2, 16, 20, 72, 4},
                                    {3, 4, 2, 200, 8, 40, 4},        {5, 4, 2, 16, 8, 40, 3}};
    rng_seed(29);
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) {
        const int64_t T = cs[c][0], nv = cs[c][1], nk = cs[c][2], dk = cs[c][3], dv = cs[c][4];
        const int64_t cols = cs[c][5], K = cs[c][6], ch = 2 * nk * dk + nv * dv, rs = ch + 3;
        const int64_t sn = (K - 1) * ch;
        float *h = rng_floats(T * cols, 1), *wa = rng_floats(nv * cols, 0.05f);
        float *wb = rng_floats(nv * cols, 0.05f), *raw = rng_floats(T * rs, 2);
        float *cw = rng_floats(ch * K, 1), *st0 = rng_floats(sn, 2), *dt = rng_floats(nv, 1);
        float *sa = rng_floats(nv, 1);
        ops_weight hwa, hwb;
        assert_int_equal(ops_weight_init(&hwa, TD_F32, nv, cols, wa), TD_OK);
        assert_int_equal(ops_weight_init(&hwb, TD_F32, nv, cols, wb), TD_OK);
        float *ral = malloc((size_t)(T * nv) * 4), *rbe = malloc((size_t)(T * nv) * 4);
        float *rq = malloc((size_t)(T * ch) * 4), *rgb = malloc((size_t)(T * 2 * nv) * 4);
        float *rst = malloc((size_t)sn * 4);
        memcpy(rst, st0, (size_t)sn * 4);
        ops_dn_in r = {.n_tok = T, .h = h, .w_alpha = &hwa, .w_beta = &hwb, .alpha = ral,
                       .beta = rbe, .raw = raw, .raw_stride = rs, .conv_w = cw, .conv_state = rst,
                       .n_ch = ch, .conv_k = K, .qkv = rq, .gb = rgb, .dt_bias = dt, .ssm_a = sa,
                       .n_v_head = nv, .n_k_head = nk, .d_k = dk, .eps = 1e-6f};
        cpu_deltanet_in(&r);

        ops_weight gwa, gwb;
        assert_int_equal(ops_weight_init(&gwa, TD_F32, nv, cols, dput(wa, (size_t)(nv * cols) * 4)), TD_OK);
        assert_int_equal(ops_weight_init(&gwb, TD_F32, nv, cols, dput(wb, (size_t)(nv * cols) * 4)), TD_OK);
        ops_dn_in g = r;
        g.h = dput(h, (size_t)(T * cols) * 4), g.w_alpha = &gwa, g.w_beta = &gwb;
        g.alpha = dpoison((size_t)(T * nv) * 4), g.beta = dpoison((size_t)(T * nv) * 4);
        g.raw = dput(raw, (size_t)(T * rs) * 4), g.conv_w = dput(cw, (size_t)(ch * K) * 4);
        g.conv_state = dput(st0, (size_t)sn * 4), g.qkv = dpoison((size_t)(T * ch) * 4);
        g.gb = dpoison((size_t)(T * 2 * nv) * 4), g.dt_bias = dput(dt, (size_t)nv * 4);
        g.ssm_a = dput(sa, (size_t)nv * 4), g.conv_prev = dpoison((size_t)sn * 4);
        GPU_OK(cuda_deltanet_in(&g, gpu_st));
        float *gprev = dget(g.conv_prev, (size_t)sn * 4);
        assert_true(check_same_bits("deltanet_in conv window before", gprev, st0, (size_t)sn * 4));
        float *gq = dget(g.qkv, (size_t)(T * ch) * 4), *ggb = dget(g.gb, (size_t)(T * 2 * nv) * 4);
        float *gst = dget(g.conv_state, (size_t)sn * 4);

        /* the three launches */
        float *st2 = dput(st0, (size_t)sn * 4), *q2 = dpoison((size_t)(T * ch) * 4);
        float *gb2 = dpoison((size_t)(T * 2 * nv) * 4);
        const ops_mm_out ab[] = {{g.alpha, &gwa}, {g.beta, &gwb}};
        GPU_OK(cuda_matmul_multi(g.h, ab, 2, T, gpu_st));
        GPU_OK(cuda_conv1d_silu(q2, st2, NULL, g.raw, rs, g.conv_w, T, ch, K, gpu_st));
        GPU_OK(cuda_delta_prep(gb2, q2, g.alpha, g.beta, g.dt_bias, g.ssm_a, T, nv, nk, dk, ch,
                               1e-6f, gpu_st));
        float *gq2 = dget(q2, (size_t)(T * ch) * 4), *ggb2 = dget(gb2, (size_t)(T * 2 * nv) * 4);
        float *gst2 = dget(st2, (size_t)sn * 4);
        assert_true(check_same_bits("deltanet_in qkv", gq, gq2, (size_t)(T * ch) * 4));
        assert_true(check_same_bits("deltanet_in g, beta", ggb, ggb2, (size_t)(T * 2 * nv) * 4));
        assert_true(check_same_bits("deltanet_in conv state", gst, gst2, (size_t)sn * 4));
        assert_true(check_same_bits("deltanet_in conv state vs cpu", gst, rst, (size_t)sn * 4));
        /* conv 1e-6 then delta_prep's 3e-6; the F32 sums of 5120 products: 2e-5 of the row */
        assert_true(check_close("deltanet_in qkv vs cpu", gq, rq, T * ch, 4e-6f, 1e-30f));
        assert_true(check_close("deltanet_in gates vs cpu", ggb, rgb, T * 2 * nv, 2e-5f, 1e-6f));

        /* token by token: the same bits */
        ops_dn_in one = g;
        GPU_OK(cuda_mem_upload(g.conv_state, st0, (size_t)sn * 4, gpu_st));
        float *q1 = dpoison((size_t)(T * ch) * 4), *gb1 = dpoison((size_t)(T * 2 * nv) * 4);
        one.n_tok = 1, one.conv_prev = NULL;
        for (int64_t t = 0; t < T; t++) {
            one.h = g.h + t * cols, one.raw = g.raw + t * rs;
            one.qkv = q1 + t * ch, one.gb = gb1 + t * 2 * nv;
            GPU_OK(cuda_deltanet_in(&one, gpu_st));
        }
        float *gq1 = dget(q1, (size_t)(T * ch) * 4), *ggb1 = dget(gb1, (size_t)(T * 2 * nv) * 4);
        float *gst1 = dget(g.conv_state, (size_t)sn * 4);
        assert_true(check_same_bits("deltanet_in qkv token by token", gq1, gq, (size_t)(T * ch) * 4));
        assert_true(check_same_bits("deltanet_in gates token by token", ggb1, ggb,
                                    (size_t)(T * 2 * nv) * 4));
        assert_true(check_same_bits("deltanet_in state token by token", gst1, gst, (size_t)sn * 4));

        free(gq), free(ggb), free(gst), free(gq2), free(ggb2), free(gst2), free(gq1), free(ggb1);
        free(gst1), free(gprev);
        cuda_mem_free(g.conv_prev), cuda_mem_free((void *)g.h), cuda_mem_free((void *)gwa.data), cuda_mem_free((void *)gwb.data);
        cuda_mem_free(g.alpha), cuda_mem_free(g.beta), cuda_mem_free((void *)g.raw);
        cuda_mem_free((void *)g.conv_w), cuda_mem_free(g.conv_state), cuda_mem_free(g.qkv);
        cuda_mem_free(g.gb), cuda_mem_free((void *)g.dt_bias), cuda_mem_free((void *)g.ssm_a);
        cuda_mem_free(st2), cuda_mem_free(q2), cuda_mem_free(gb2), cuda_mem_free(q1);
        cuda_mem_free(gb1);
        free(h), free(wa), free(wb), free(raw), free(cw), free(st0), free(dt), free(sa);
        free(ral), free(rbe), free(rq), free(rgb), free(rst);
    }
}

/* g/beta interleaved per token with a stride, and the state before the block handed out:
 * the same bits as the dense layout on the GPU. */
static void test_delta_rule_strided_gates_and_state_before(void **state)
{
    (void)state;
    const int64_t T = 6, nk = 2, nv = 6, dk = 128, dv = 128, ch = 2 * nk * dk + nv * dv;
    const int64_t ns = nv * dk * dv;
    rng_seed(24);
    float *qkv = rng_floats(T * ch, 0.08f), *g = rng_floats(T * nv, 0.5f), *b = rng_floats(T * nv, 0.5f);
    for (int64_t i = 0; i < T * nv; i++)
        g[i] = -fabsf(g[i]), b[i] = fabsf(b[i]);
    float *gb = malloc((size_t)(T * 2 * nv) * 4);
    for (int64_t t = 0; t < T; t++) {
        memcpy(gb + t * 2 * nv, g + t * nv, (size_t)nv * 4);
        memcpy(gb + t * 2 * nv + nv, b + t * nv, (size_t)nv * 4);
    }
    float *s0 = rng_floats(ns, 0.5f);
    float *dq = dput(qkv, (size_t)(T * ch) * 4);
    ops_delta d = {.n_tok = T, .n_k_head = nk, .n_v_head = nv, .d_k = dk, .d_v = dv, .q = dq,
                   .k = dq + nk * dk, .v = dq + 2 * nk * dk, .q_tok_stride = ch,
                   .k_tok_stride = ch, .v_tok_stride = ch};
    d.g = dput(g, (size_t)(T * nv) * 4);
    d.beta = dput(b, (size_t)(T * nv) * 4);
    d.state = dput(s0, (size_t)ns * 4);
    d.out = dpoison((size_t)(T * nv * dv) * 4);
    GPU_OK(cuda_delta_rule(&d, gpu_st));
    ops_delta e = d;
    float *dgb = dput(gb, (size_t)(T * 2 * nv) * 4);
    e.g = dgb, e.beta = dgb + nv, e.gb_tok_stride = 2 * nv;
    e.state = dput(s0, (size_t)ns * 4);
    e.state_prev = dpoison((size_t)ns * 4);
    e.out = dpoison((size_t)(T * nv * dv) * 4);
    GPU_OK(cuda_delta_rule(&e, gpu_st));
    float *o1 = dget(d.out, (size_t)(T * nv * dv) * 4), *o2 = dget(e.out, (size_t)(T * nv * dv) * 4);
    float *s1 = dget(d.state, (size_t)ns * 4), *s2 = dget(e.state, (size_t)ns * 4);
    float *sp = dget(e.state_prev, (size_t)ns * 4);
    assert_true(check_same_bits("strided out", o2, o1, (size_t)(T * nv * dv) * 4));
    assert_true(check_same_bits("strided state", s2, s1, (size_t)ns * 4));
    assert_true(check_same_bits("state before", sp, s0, (size_t)ns * 4));
    /* from state_in into a state of other values: as if it had been copied in */
    ops_delta f = e;
    float *junk = rng_floats(ns, 3.0f);
    f.state = dput(junk, (size_t)ns * 4);
    f.state_in = e.state_prev; /* holds s0 */
    f.state_prev = NULL;
    f.out = dpoison((size_t)(T * nv * dv) * 4);
    GPU_OK(cuda_delta_rule(&f, gpu_st));
    float *o3 = dget(f.out, (size_t)(T * nv * dv) * 4), *s3 = dget(f.state, (size_t)ns * 4);
    assert_true(check_same_bits("from state_in: out", o3, o1, (size_t)(T * nv * dv) * 4));
    assert_true(check_same_bits("from state_in: state", s3, s1, (size_t)ns * 4));
    free(junk), free(o3), free(s3);
    cuda_mem_free(f.state), cuda_mem_free(f.out);
    free(qkv), free(g), free(b), free(gb), free(s0), free(o1), free(o2), free(s1), free(s2), free(sp);
    cuda_mem_free(dq), cuda_mem_free((void *)d.g), cuda_mem_free((void *)d.beta);
    cuda_mem_free(d.state), cuda_mem_free(d.out), cuda_mem_free(dgb), cuda_mem_free(e.state);
    cuda_mem_free(e.state_prev), cuda_mem_free(e.out);
}

/* rows of width bytes between pitches, as the taps are copied: exact, the gaps untouched */
/* One launch for the convolution and its silu: the bits of cuda_conv1d_causal then cuda_silu
 * (output, carried state, state after every token), and the CPU's chain within 1e-6. */
static void test_conv1d_silu_equals_conv_then_silu(void **state)
{
    (void)state;
    static const int64_t cs[][3] = {{10240, 4, 1}, {77, 4, 16}, {130, 1, 3}};
    rng_seed(31);
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int64_t n_ch = cs[c][0], k = cs[c][1], n_tok = cs[c][2];
        const int64_t stride = n_ch + 5, sn = (k - 1) * n_ch, n = n_tok * n_ch;
        const size_t sb = (size_t)(sn ? sn : 1) * 4, ab = (size_t)(n_tok * sn + 1) * 4;
        float *x = rng_floats(n_tok * stride, 2), *w = rng_floats(n_ch * k, 1);
        float *st0 = rng_floats(sn ? sn : 1, 2);
        float *ref = malloc((size_t)n * 4), *rst = malloc(sb), *rall = malloc(ab);
        memcpy(rst, st0, sb);
        cpu_conv1d_silu(ref, rst, rall, x, stride, w, n_tok, n_ch, k);
        float *dx = dput(x, (size_t)(n_tok * stride) * 4), *dw = dput(w, (size_t)(n_ch * k) * 4);
        float *sa = dput(st0, sb), *sb2 = dput(st0, sb);
        float *oa = dpoison((size_t)n * 4), *ob = dpoison((size_t)n * 4);
        float *aa = dpoison(ab), *ba = dpoison(ab);
        GPU_OK(cuda_conv1d_causal(oa, k > 1 ? sa : NULL, aa, dx, stride, dw, n_tok, n_ch, k,
                                  gpu_st));
        GPU_OK(cuda_silu(oa, oa, n, gpu_st));
        GPU_OK(cuda_conv1d_silu(ob, k > 1 ? sb2 : NULL, ba, dx, stride, dw, n_tok, n_ch, k,
                                gpu_st));
        float *ga = dget(oa, (size_t)n * 4), *gb = dget(ob, (size_t)n * 4);
        float *gsa = dget(sa, sb), *gsb = dget(sb2, sb);
        float *gaa = dget(aa, (size_t)(n_tok * sn) * 4 + 4), *gba = dget(ba, (size_t)(n_tok * sn) * 4 + 4);
        assert_true(check_same_bits("conv1d_silu out", gb, ga, (size_t)n * 4));
        assert_true(check_same_bits("conv1d_silu state", gsb, gsa, sb));
        assert_true(check_same_bits("conv1d_silu state_all", gba, gaa, (size_t)(n_tok * sn) * 4));
        assert_true(check_close("conv1d_silu vs cpu", gb, ref, n, 1e-6f, 1e-6f));
        free(x), free(w), free(st0), free(ref), free(rst), free(rall);
        free(ga), free(gb), free(gsa), free(gsb), free(gaa), free(gba);
        cuda_mem_free(dx), cuda_mem_free(dw), cuda_mem_free(sa), cuda_mem_free(sb2);
        cuda_mem_free(oa), cuda_mem_free(ob), cuda_mem_free(aa), cuda_mem_free(ba);
    }
}

/* The gate applied inside the activation rounding (quantised weights) or by cuda_swiglu
 * (float weights): y and the stored gate are the bits of cuda_swiglu then cuda_matmul, for
 * one token (6144 inputs: the pair's single-token kernel rounds x itself), a verify block,
 * 33 and 70 tokens (two chunks); the gate is the CPU's within expf's error. */
static void test_swiglu_matmul_equals_swiglu_then_matmul(void **state)
{
    (void)state;
    static const struct {
        td_dtype type;
        int64_t rows, cols;
    } ws[] = {{TD_Q4_K, 40, 17408}, {TD_Q4_K, 33, 6144}, {TD_Q6_K, 17, 768},
              {TD_Q5_K, 24, 512},   {TD_Q8_0, 9, 1024},  {TD_BF16, 12, 512},
              {TD_F32, 5, 256}};
    static const int64_t toks[] = {1, 16, 33, 70};
    rng_seed(32);
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) {
        const int64_t rows = ws[i].rows, cols = ws[i].cols;
        uint64_t rb = 0;
        assert_int_equal(dtype_bytes(ws[i].type, (uint64_t)cols, &rb), TD_OK);
        float *wf = rng_floats(rows * cols, 1);
        uint8_t *q = malloc((size_t)(rows * (int64_t)rb));
        for (int64_t r = 0; r < rows; r++)
            assert_int_equal(cpu_quantize_row(ws[i].type, wf + r * cols, q + r * rb, cols),
                             TD_OK);
        ops_weight w;
        assert_int_equal(ops_weight_init(&w, ws[i].type, rows, cols, q), TD_OK);
        w.data = dput(q, (size_t)(rows * (int64_t)rb));
        for (size_t j = 0; j < sizeof toks / sizeof *toks; j++) {
            const int64_t n = toks[j], nx = n * cols, ny = n * rows;
            float *g = rng_floats(nx, 4), *u = rng_floats(nx, 2);
            float *ref = malloc((size_t)nx * 4);
            cpu_swiglu(ref, g, u, nx);
            float *ga = dput(g, (size_t)nx * 4), *gb = dput(g, (size_t)nx * 4);
            float *du = dput(u, (size_t)nx * 4);
            float *ya = dpoison((size_t)ny * 4), *yb = dpoison((size_t)ny * 4);
            GPU_OK(cuda_swiglu(ga, ga, du, nx, gpu_st));
            GPU_OK(cuda_matmul(ya, ga, &w, n, gpu_st));
            GPU_OK(cuda_swiglu_matmul(yb, gb, du, &w, n, gpu_st));
            float *hga = dget(ga, (size_t)nx * 4), *hgb = dget(gb, (size_t)nx * 4);
            float *hya = dget(ya, (size_t)ny * 4), *hyb = dget(yb, (size_t)ny * 4);
            char what[96];
            snprintf(what, sizeof what, "swiglu_matmul %s %lldx%lld n_tok %lld",
                     dtype_name(ws[i].type), (long long)rows, (long long)cols, (long long)n);
            assert_true(check_same_bits(what, hgb, hga, (size_t)nx * 4));
            assert_true(check_same_bits(what, hyb, hya, (size_t)ny * 4));
            assert_true(check_close(what, hgb, ref, nx, 1e-6f, 1e-6f));
            free(g), free(u), free(ref), free(hga), free(hgb), free(hya), free(hyb);
            cuda_mem_free(ga), cuda_mem_free(gb), cuda_mem_free(du);
            cuda_mem_free(ya), cuda_mem_free(yb);
        }
        cuda_mem_free((void *)w.data);
        free(wf), free(q);
    }
}

/* A weight cuda_matmul refuses (a type it does not take, quantised data off 16-byte
 * alignment): the same error from cuda_swiglu_matmul, before the gate is touched. */
static void test_swiglu_matmul_refuses_before_touching_the_gate(void **state)
{
    (void)state;
    const int64_t cols = 512, rows = 4;
    float *g = rng_floats(cols, 2), *u = rng_floats(cols, 2);
    float *dg = dput(g, (size_t)cols * 4), *du = dput(u, (size_t)cols * 4);
    float *dy = dpoison((size_t)rows * 4);
    uint8_t *raw = dpoison((size_t)rows * 2 * 144 + 64);
    ops_weight bad;
    assert_int_equal(ops_weight_init(&bad, TD_Q4_K, rows, cols, raw + 8), TD_OK);
    assert_int_equal(cuda_swiglu_matmul(dy, dg, du, &bad, 1, gpu_st), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "aligned"));
    ops_weight q40 = {.type = TD_Q4_0, .rows = rows, .cols = cols, .row_bytes = 288,
                      .data = raw};
    assert_int_equal(cuda_swiglu_matmul(dy, dg, du, &q40, 1, gpu_st), TD_ENOTSUP);
    float *back = dget(dg, (size_t)cols * 4);
    assert_true(check_same_bits("gate after refusals", back, g, (size_t)cols * 4));
    free(g), free(u), free(back);
    cuda_mem_free(dg), cuda_mem_free(du), cuda_mem_free(dy), cuda_mem_free(raw);
}

/* q/k head norms and RoPE in one launch: q and k bit for bit two cuda_rmsnorm and two
 * cuda_rope_neox launches, for gated q heads (the query half of 2 x head_dim normed, the
 * gate untouched), plain heads, partial rotation, positions far apart, 1 and 16 tokens, k
 * heads alone (no q: the drafter's context keys); and the CPU's chain within 1e-5. */
static void test_qk_norm_rope_equals_norms_then_ropes(void **state)
{
    (void)state;
    static const struct {
        int64_t n_head, n_kv, hd, q_head, n_rot;
    } cs[] = {{24, 4, 256, 512, 64},
              {4, 2, 64, 64, 64},
              {3, 1, 96, 192, 32},
              {0, 8, 128, 128, 128}};
    static const int64_t toks[] = {1, 16};
    rng_seed(34);
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++)
        for (size_t j = 0; j < sizeof toks / sizeof *toks; j++) {
            const int64_t n = toks[j], hd = cs[c].hd, nh = cs[c].n_head, nkv = cs[c].n_kv;
            const int64_t nq = n * nh * cs[c].q_head, nk = n * nkv * hd;
            const int64_t qa_n = nq ? nq : 1; /* buffers of at least one value */
            float *q = rng_floats(qa_n, 3), *k = rng_floats(nk, 3);
            float *qn = rng_floats(hd, 1.5f), *kn = rng_floats(hd, 1.5f);
            int32_t pos[16];
            for (int64_t t = 0; t < n; t++)
                pos[t] = (int32_t)(t * 977 + 5 + 40000 * (int32_t)c);
            float *qa = dput(q, (size_t)qa_n * 4), *ka = dput(k, (size_t)nk * 4);
            float *qb = dput(q, (size_t)qa_n * 4), *kb = dput(k, (size_t)nk * 4);
            float *dqn = dput(qn, (size_t)hd * 4), *dkn = dput(kn, (size_t)hd * 4);
            int32_t *dpos = dput(pos, (size_t)n * 4);
            if (nh)
                GPU_OK(cuda_rmsnorm(qa, qa, dqn, n * nh, hd, cs[c].q_head, 1e-6f, gpu_st));
            GPU_OK(cuda_rmsnorm(ka, ka, dkn, n * nkv, hd, hd, 1e-6f, gpu_st));
            if (nh)
                GPU_OK(cuda_rope_neox(qa, n, nh, nh * cs[c].q_head, cs[c].q_head, cs[c].n_rot,
                                      dpos, 1e7f, gpu_st));
            GPU_OK(cuda_rope_neox(ka, n, nkv, nkv * hd, hd, cs[c].n_rot, dpos, 1e7f, gpu_st));
            GPU_OK(cuda_qk_norm_rope(nh ? qb : NULL, kb, dqn, dkn, n, nh, nkv, hd, cs[c].q_head,
                                     cs[c].n_rot, dpos, 1e7f, 1e-6f, NULL, gpu_st));
            float *gqa = dget(qa, (size_t)qa_n * 4), *gqb = dget(qb, (size_t)qa_n * 4);
            float *gka = dget(ka, (size_t)nk * 4), *gkb = dget(kb, (size_t)nk * 4);
            assert_true(check_same_bits("qk_norm_rope q", gqb, gqa, (size_t)nq * 4));
            assert_true(check_same_bits("qk_norm_rope k", gkb, gka, (size_t)nk * 4));
            cpu_qk_norm_rope(nh ? q : NULL, k, qn, kn, n, nh, nkv, hd, cs[c].q_head, cs[c].n_rot,
                             pos, 1e7f, 1e-6f);
            assert_true(check_close("qk_norm_rope q vs cpu", gqb, q, nq, 1e-5f, 1e-5f));
            assert_true(check_close("qk_norm_rope k vs cpu", gkb, k, nk, 1e-5f, 1e-5f));
            free(q), free(k), free(qn), free(kn), free(gqa), free(gqb), free(gka), free(gkb);
            cuda_mem_free(qa), cuda_mem_free(ka), cuda_mem_free(qb), cuda_mem_free(kb);
            cuda_mem_free(dqn), cuda_mem_free(dkn), cuda_mem_free(dpos);
        }
}

/* qk_norm_rope with a cache destination: q, k and both caches (f32 and f16, rows given on
 * the device, scattered, the rows not named untouched) bit for bit cuda_qk_norm_rope then
 * cuda_kv_store, at 1 and 16 tokens. */
static void test_qk_norm_rope_stores_kv(void **state)
{
    (void)state;
    enum { CAP = 40 };
    static const struct {
        int64_t n_head, n_kv, hd, q_head, n_rot;
    } cs[] = {{24, 4, 256, 512, 64}, {3, 1, 96, 192, 32}};
    static const int64_t toks[] = {1, 16};
    static const td_dtype types[] = {TD_F32, TD_F16};
    rng_seed(35);
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++)
        for (size_t j = 0; j < sizeof toks / sizeof *toks; j++)
            for (size_t y = 0; y < 2; y++) {
                const int64_t n = toks[j], hd = cs[c].hd, nh = cs[c].n_head, nkv = cs[c].n_kv;
                const int64_t nq = n * nh * cs[c].q_head, nk = n * nkv * hd, row = nkv * hd;
                const size_t cache = (size_t)CAP * (size_t)row * ops_kv_elem_bytes(types[y]);
                float *q = rng_floats(nq, 3), *k = rng_floats(nk, 3), *v = rng_floats(nk, 3);
                float *qn = rng_floats(hd, 1.5f), *kn = rng_floats(hd, 1.5f);
                int32_t pos[16], rows[16];
                for (int64_t t = 0; t < n; t++) {
                    pos[t] = (int32_t)(t * 977 + 5);
                    rows[t] = (int32_t)((t * 7 + 3) % CAP);
                }
                float *qa = dput(q, (size_t)nq * 4), *ka = dput(k, (size_t)nk * 4);
                float *qb = dput(q, (size_t)nq * 4), *kb = dput(k, (size_t)nk * 4);
                float *dv = dput(v, (size_t)nk * 4);
                float *dqn = dput(qn, (size_t)hd * 4), *dkn = dput(kn, (size_t)hd * 4);
                int32_t *dpos = dput(pos, (size_t)n * 4), *drows = dput(rows, (size_t)n * 4);
                void *kca = dpoison(cache), *vca = dpoison(cache);
                void *kcb = dpoison(cache), *vcb = dpoison(cache);
                GPU_OK(cuda_qk_norm_rope(qa, ka, dqn, dkn, n, nh, nkv, hd, cs[c].q_head,
                                         cs[c].n_rot, dpos, 1e7f, 1e-6f, NULL, gpu_st));
                GPU_OK(cuda_kv_store(kca, vca, types[y], ka, dv, drows, n, row, gpu_st));
                const ops_kv_dst kv = {.k_cache = kcb, .v_cache = vcb, .type = types[y],
                                       .v = dv, .rows = drows, .row = row};
                GPU_OK(cuda_qk_norm_rope(qb, kb, dqn, dkn, n, nh, nkv, hd, cs[c].q_head,
                                         cs[c].n_rot, dpos, 1e7f, 1e-6f, &kv, gpu_st));
                float *gqa = dget(qa, (size_t)nq * 4), *gqb = dget(qb, (size_t)nq * 4);
                float *gka = dget(ka, (size_t)nk * 4), *gkb = dget(kb, (size_t)nk * 4);
                uint8_t *gkca = dget(kca, cache), *gvca = dget(vca, cache);
                uint8_t *gkcb = dget(kcb, cache), *gvcb = dget(vcb, cache);
                assert_true(check_same_bits("qk_norm_rope+store q", gqb, gqa, (size_t)nq * 4));
                assert_true(check_same_bits("qk_norm_rope+store k", gkb, gka, (size_t)nk * 4));
                assert_memory_equal(gkcb, gkca, cache);
                assert_memory_equal(gvcb, gvca, cache);
                free(q), free(k), free(v), free(qn), free(kn);
                free(gqa), free(gqb), free(gka), free(gkb), free(gkca), free(gvca), free(gkcb),
                    free(gvcb);
                cuda_mem_free(qa), cuda_mem_free(ka), cuda_mem_free(qb), cuda_mem_free(kb);
                cuda_mem_free(dv), cuda_mem_free(dqn), cuda_mem_free(dkn), cuda_mem_free(dpos);
                cuda_mem_free(drows), cuda_mem_free(kca), cuda_mem_free(vca), cuda_mem_free(kcb);
                cuda_mem_free(vcb);
            }
}

/* The same with the q side as a second layer's keys (n_head == n_kv, q_head == hd,
 * kv.qk_cache set): both layers' keys and values bit for bit two k-only calls, each followed
 * by cuda_kv_store, at 1 and 16 tokens, f32 and f16 caches. */
static void test_qk_norm_rope_stores_two_layers(void **state)
{
    (void)state;
    enum { CAP = 40 };
    const int64_t nkv = 8, hd = 128, n_rot = 128, row = nkv * hd;
    static const int64_t toks[] = {1, 16};
    static const td_dtype types[] = {TD_F32, TD_F16};
    rng_seed(36);
    for (size_t j = 0; j < sizeof toks / sizeof *toks; j++)
        for (size_t y = 0; y < 2; y++) {
            const int64_t n = toks[j], nk = n * row;
            const size_t cache = (size_t)CAP * (size_t)row * ops_kv_elem_bytes(types[y]);
            float *ka = rng_floats(nk, 3), *kb = rng_floats(nk, 3), *va = rng_floats(nk, 3),
                  *vb = rng_floats(nk, 3), *na = rng_floats(hd, 1.5f), *nb = rng_floats(hd, 1.5f);
            int32_t pos[16], rows[16];
            for (int64_t t = 0; t < n; t++) {
                pos[t] = (int32_t)(t * 613 + 2);
                rows[t] = (int32_t)((t * 11 + 5) % CAP);
            }
            float *dka = dput(ka, (size_t)nk * 4), *dkb = dput(kb, (size_t)nk * 4);
            float *eka = dput(ka, (size_t)nk * 4), *ekb = dput(kb, (size_t)nk * 4);
            float *dva = dput(va, (size_t)nk * 4), *dvb = dput(vb, (size_t)nk * 4);
            float *dna = dput(na, (size_t)hd * 4), *dnb = dput(nb, (size_t)hd * 4);
            int32_t *dpos = dput(pos, (size_t)n * 4), *drows = dput(rows, (size_t)n * 4);
            void *c[8];
            for (int i = 0; i < 8; i++)
                c[i] = dpoison(cache);
            GPU_OK(cuda_qk_norm_rope(NULL, dka, NULL, dna, n, 0, nkv, hd, hd, n_rot, dpos, 1e6f,
                                     1e-6f, NULL, gpu_st));
            GPU_OK(cuda_kv_store(c[0], c[1], types[y], dka, dva, drows, n, row, gpu_st));
            GPU_OK(cuda_qk_norm_rope(NULL, dkb, NULL, dnb, n, 0, nkv, hd, hd, n_rot, dpos, 1e6f,
                                     1e-6f, NULL, gpu_st));
            GPU_OK(cuda_kv_store(c[2], c[3], types[y], dkb, dvb, drows, n, row, gpu_st));
            const ops_kv_dst kv = {.k_cache = c[6], .v_cache = c[7], .type = types[y],
                                   .v = dvb, .rows = drows, .row = row, .qk_cache = c[4],
                                   .qv_cache = c[5], .qv = dva};
            GPU_OK(cuda_qk_norm_rope(eka, ekb, dna, dnb, n, nkv, nkv, hd, hd, n_rot, dpos, 1e6f,
                                     1e-6f, &kv, gpu_st));
            float *g[4] = {dget(dka, (size_t)nk * 4), dget(eka, (size_t)nk * 4),
                           dget(dkb, (size_t)nk * 4), dget(ekb, (size_t)nk * 4)};
            assert_true(check_same_bits("paired keys a", g[1], g[0], (size_t)nk * 4));
            assert_true(check_same_bits("paired keys b", g[3], g[2], (size_t)nk * 4));
            for (int i = 0; i < 4; i++) {
                uint8_t *want = dget(c[i], cache), *got = dget(c[4 + i], cache);
                assert_memory_equal(got, want, cache);
                free(want), free(got);
            }
            for (int i = 0; i < 4; i++)
                free(g[i]);
            for (int i = 0; i < 8; i++)
                cuda_mem_free(c[i]);
            free(ka), free(kb), free(va), free(vb), free(na), free(nb);
            cuda_mem_free(dka), cuda_mem_free(dkb), cuda_mem_free(eka), cuda_mem_free(ekb);
            cuda_mem_free(dva), cuda_mem_free(dvb), cuda_mem_free(dna), cuda_mem_free(dnb);
            cuda_mem_free(dpos), cuda_mem_free(drows);
        }
}

static void test_copy2d_moves_rows_between_pitches(void **state)
{
    (void)state;
    enum { ROWS = 7, W = 20, SP = 24, DP = 60 };
    uint8_t src[ROWS * SP], want[ROWS * DP];
    for (int i = 0; i < ROWS * SP; i++)
        src[i] = (uint8_t)(i * 7 + 3);
    memset(want, 0xFF, sizeof want);
    for (int r = 0; r < ROWS; r++)
        memcpy(want + r * DP, src + r * SP, W);
    void *ds = dput(src, sizeof src), *dd = dpoison(sizeof want);
    GPU_OK(cuda_mem_copy2d(dd, DP, ds, SP, W, ROWS, gpu_st));
    uint8_t *got = dget(dd, sizeof want);
    assert_memory_equal(got, want, sizeof want);
    free(got);
    cuda_mem_free(ds);
    cuda_mem_free(dd);
}

/* f32 -> f16 as the KV cache is stored: round to nearest even, bit-identical to the CPU,
 * including subnormal halves, overflow to infinity and signed zeros */
static void test_to_f16_matches_cpu_bits(void **state)
{
    (void)state;
    const int64_t n = (1 << 20) + 5; /* past one grid-stride round */
    rng_seed(25);
    float *x = rng_floats(n, 70000.0f);
    static const float special[] = {0.0f, -0.0f, 65504.0f, 65520.0f, 1e-7f, -6.1e-5f, 3.0e-8f,
                                    INFINITY, -INFINITY, 1.0f + 0x1p-11f, 1.0f + 0x1p-10f + 0x1p-11f};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        x[i] = special[i];
    for (int64_t i = 16; i < 4096; i++)
        x[i] *= 1e-9f; /* small magnitudes: subnormal halves */
    uint16_t *ref = malloc((size_t)n * 2);
    cpu_to_f16(ref, x, n);
    float *dx = dput(x, (size_t)n * 4);
    uint16_t *dout = dpoison((size_t)n * 2);
    GPU_OK(cuda_to_f16(dout, dx, n, gpu_st));
    uint16_t *got = dget(dout, (size_t)n * 2);
    assert_true(check_same_bits("to_f16", got, ref, (size_t)n * 2));
    free(x), free(ref), free(got);
    cuda_mem_free(dx), cuda_mem_free(dout);
}

/* f32 -> bf16 -> f32 as a GPU's feature ring stores the tap features: nearest even and NaN
 * quieting bit-identical to the CPU, and the way back exact */
static void test_bf16_both_ways_match_cpu_bits(void **state)
{
    (void)state;
    const int64_t n = (1 << 20) + 7; /* past one grid-stride round */
    rng_seed(26);
    float *x = rng_floats(n, 3.0e5f);
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                       0x7fc00001u, 0xffa12345u, 0x3f808000u, 0x3f818000u,
                                       0x7f7fffffu, 0x00000001u, 0x807fffffu, 0x3f7fffffu};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        memcpy(&x[i], &special[i], 4);
    uint16_t *ref = malloc((size_t)n * 2);
    float *back = malloc((size_t)n * 4);
    cpu_to_bf16(ref, x, n);
    cpu_from_bf16(back, ref, n);
    assert_int_equal(ref[6], 0x3f80); /* a tie goes to the even neighbour */
    assert_int_equal(ref[7], 0x3f82);
    float *dx = dput(x, (size_t)n * 4);
    uint16_t *d16 = dpoison((size_t)n * 2);
    float *dback = dpoison((size_t)n * 4);
    GPU_OK(cuda_to_bf16(d16, dx, n, gpu_st));
    GPU_OK(cuda_from_bf16(dback, d16, n, gpu_st));
    uint16_t *got = dget(d16, (size_t)n * 2);
    float *got_back = dget(dback, (size_t)n * 4);
    assert_true(check_same_bits("to_bf16", got, ref, (size_t)n * 2));
    assert_true(check_same_bits("from_bf16", got_back, back, (size_t)n * 4));
    free(x), free(ref), free(back), free(got), free(got_back);
    cuda_mem_free(dx), cuda_mem_free(d16), cuda_mem_free(dback);
}

/* Attention launched for a whole cache with the key count read from the device gives the
 * bits of a call sized for exactly those keys: decode and a verify block, with the splits
 * handed to the combine kernel (5000 keys) and folded in the block (a long prefill-like
 * block), f16 cache. */
static void test_attention_device_key_count_equals_exact_call(void **state)
{
    (void)state;
    const int64_t n_head = 24, n_kv_head = 4, D = 256, cap = 5000;
    static const int64_t cases[][2] = {{1, 1000}, {1, 4999}, {16, 1024}, {300, 700}};
    rng_seed(26);
    const int64_t kvw = n_kv_head * D;
    float *kf = rng_floats(cap * kvw, 1), *vf = rng_floats(cap * kvw, 1);
    uint16_t *kh = malloc((size_t)(cap * kvw) * 2), *vh = malloc((size_t)(cap * kvw) * 2);
    cpu_to_f16(kh, kf, cap * kvw);
    cpu_to_f16(vh, vf, cap * kvw);
    int32_t *pos = malloc((size_t)cap * sizeof *pos);
    for (int64_t i = 0; i < cap; i++)
        pos[i] = (int32_t)i;
    void *dk = dput(kh, (size_t)(cap * kvw) * 2), *dv = dput(vh, (size_t)(cap * kvw) * 2);
    int32_t *dpos = dput(pos, (size_t)cap * 4);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const int64_t n_q = cases[c][0], n_kv = cases[c][1];
        float *q = rng_floats(n_q * n_head * 2 * D, 1);
        float *dq = dput(q, (size_t)(n_q * n_head * 2 * D) * 4);
        int32_t count = (int32_t)n_kv;
        int32_t *dcount = dput(&count, 4);
        ops_attn a = {
            .n_q = n_q, .n_head = n_head, .n_head_kv = n_kv_head, .head_dim = D,
            .scale = 0.0625f, .q = dq, .q_tok_stride = n_head * 2 * D, .q_head_stride = 2 * D,
            .q_pos = dpos + (n_kv - n_q), .kv_type = TD_F16, .k = dk, .v = dv,
            .kv_tok_stride = kvw, .kv_head_stride = D, .k_pos = dpos, .n_kv = n_kv,
            .mask = OPS_MASK_CAUSAL, .gate = dq + D, .gate_tok_stride = n_head * 2 * D,
            .gate_head_stride = 2 * D,
        };
        const size_t ob = (size_t)(n_q * n_head * D) * 4;
        a.out = dpoison(ob);
        GPU_OK(cuda_attention(&a, gpu_st));
        float *exact = dget(a.out, ob);
        cuda_mem_free(a.out);
        a.n_kv = cap;
        a.n_kv_dev = dcount;
        a.out = dpoison(ob);
        GPU_OK(cuda_attention(&a, gpu_st));
        float *counted = dget(a.out, ob);
        assert_true(check_same_bits("attention with a device key count", counted, exact, ob));
        free(exact), free(counted), free(q);
        cuda_mem_free(a.out), cuda_mem_free(dq), cuda_mem_free(dcount);
    }
    free(kf), free(vf), free(kh), free(vh), free(pos);
    cuda_mem_free(dk), cuda_mem_free(dv), cuda_mem_free(dpos);
}

int main(void)
{
    if (!gpu_check_init())
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_rmsnorm_matches_cpu_and_rows_are_independent),
        cmocka_unit_test(test_rmsnorm_silu_matches_cpu),
        cmocka_unit_test(test_delta_prep_matches_cpu_and_tokens_are_independent),
        cmocka_unit_test(test_deltanet_in_is_the_three_launches),
        cmocka_unit_test(test_delta_rule_strided_gates_and_state_before),
        cmocka_unit_test(test_conv1d_silu_equals_conv_then_silu),
        cmocka_unit_test(test_swiglu_matmul_equals_swiglu_then_matmul),
        cmocka_unit_test(test_swiglu_matmul_refuses_before_touching_the_gate),
        cmocka_unit_test(test_qk_norm_rope_equals_norms_then_ropes),
        cmocka_unit_test(test_qk_norm_rope_stores_kv),
        cmocka_unit_test(test_qk_norm_rope_stores_two_layers),
        cmocka_unit_test(test_copy2d_moves_rows_between_pitches),
        cmocka_unit_test(test_to_f16_matches_cpu_bits),
        cmocka_unit_test(test_bf16_both_ways_match_cpu_bits),
        cmocka_unit_test(test_attention_device_key_count_equals_exact_call),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_check_free();
    return rc;
}

#endif
