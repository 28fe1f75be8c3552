/* The fused CPU ops give bit for bit what the chains of ops they replace give (so fusing the
 * target's forward pass changes no CPU result), on odd shapes; and the delta rule reads g and
 * beta with a token stride, hands out the state before the block exactly and starts from
 * another array as if it had been copied in. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/backend.h"
#include "kernels/ops.h"

static uint64_t rng = 88172645463325252ull;

/* uniform in [-scale, scale) */
static float *rnd(int64_t n, float scale)
{
    float *r = malloc((size_t)(n > 0 ? n : 1) * sizeof *r);
    for (int64_t i = 0; i < n; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        r[i] = ((float)(rng >> 40) / 16777216.0f * 2.0f - 1.0f) * scale;
    }
    return r;
}

static float *dup(const float *x, int64_t n)
{
    float *r = malloc((size_t)n * sizeof *r);
    memcpy(r, x, (size_t)n * sizeof *r);
    return r;
}

static void test_add_rmsnorm_equals_add_then_rmsnorm(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{1, 1}, {3, 7}, {5, 5120}, {16, 96}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t rows = shapes[s][0], dim = shapes[s][1], n = rows * dim;
        float *x = rnd(n, 4), *h = rnd(n, 2), *w = rnd(dim, 1.5f);
        float *xa = dup(x, n), *ha = dup(h, n), *xb = dup(x, n), *hb = dup(h, n);
        float *out = malloc((size_t)n * sizeof *out);
        cpu_add(xa, xa, ha, n);
        cpu_rmsnorm(ha, xa, w, rows, dim, dim, 1e-6f);          /* the chain, out = h */
        cpu_add_rmsnorm(xb, hb, hb, w, rows, dim, 1e-6f);        /* fused, out = h */
        assert_memory_equal(xa, xb, (size_t)n * sizeof(float));
        assert_memory_equal(ha, hb, (size_t)n * sizeof(float));
        memcpy(xb, x, (size_t)n * sizeof *xb);
        cpu_add_rmsnorm(xb, h, out, NULL, rows, dim, 1e-5f);     /* separate out, no weight */
        memcpy(xa, x, (size_t)n * sizeof *xa);
        cpu_add(xa, xa, h, n);
        cpu_rmsnorm(ha, xa, NULL, rows, dim, dim, 1e-5f);
        assert_memory_equal(out, ha, (size_t)n * sizeof(float));
        free(x), free(h), free(w), free(xa), free(ha), free(xb), free(hb), free(out);
    }
}

static void test_rmsnorm_silu_equals_rmsnorm_silu_mul(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{1, 1}, {48, 128}, {7, 33}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t rows = shapes[s][0], dim = shapes[s][1], n = rows * dim;
        float *x = rnd(n, 3), *z = rnd(n, 12), *w = rnd(dim, 2);
        z[0] = 90.0f; /* sigmoid saturates */
        float *xa = dup(x, n), *za = dup(z, n), *xb = dup(x, n);
        cpu_rmsnorm(xa, xa, w, rows, dim, dim, 1e-6f);
        cpu_silu(za, za, n);
        cpu_mul(xa, xa, za, n);
        cpu_rmsnorm_silu(xb, xb, w, z, rows, dim, 1e-6f); /* in place; z only read */
        assert_memory_equal(xa, xb, (size_t)n * sizeof(float));
        float *zc = dup(z, n);
        assert_memory_equal(z, zc, (size_t)n * sizeof(float));
        free(x), free(z), free(w), free(xa), free(za), free(xb), free(zc);
    }
}

/* The chain tgt_delta_inputs ran before: sigmoid over the block, then per token add,
 * softplus, mul, l2norm, scale. */
static void delta_chain(float *g, float *beta, float *qkv, const float *dt, const float *a,
                        int64_t n_tok, int64_t nv, int64_t nk, int64_t dk, int64_t ch)
{
    cpu_sigmoid(beta, beta, n_tok * nv);
    for (int64_t t = 0; t < n_tok; t++) {
        float *gt = g + t * nv, *row = qkv + t * ch;
        cpu_add(gt, gt, dt, nv);
        cpu_softplus(gt, gt, nv);
        cpu_mul(gt, gt, a, nv);
        cpu_l2norm(row, row, 2 * nk, dk, dk, 1e-6f);
        cpu_scale(row, row, 1.0f / sqrtf((float)dk), nk * dk);
    }
}

static void test_delta_prep_equals_the_per_token_chain(void **state)
{
    (void)state;
    static const int64_t shapes[][4] = {{1, 6, 2, 8}, {16, 48, 16, 128}, {5, 9, 3, 7}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t n_tok = shapes[s][0], nv = shapes[s][1], nk = shapes[s][2], dk = shapes[s][3];
        int64_t ch = 2 * nk * dk + nv * 5 + 3; /* v after q and k, odd width */
        float *qkv = rnd(n_tok * ch, 2), *alpha = rnd(n_tok * nv, 6), *beta = rnd(n_tok * nv, 6);
        float *dt = rnd(nv, 1), *a = rnd(nv, 1);
        alpha[0] = 40.0f, alpha[1] = -40.0f; /* softplus at both ends */
        float *qa = dup(qkv, n_tok * ch), *ga = dup(alpha, n_tok * nv), *ba = dup(beta, n_tok * nv);
        delta_chain(ga, ba, qa, dt, a, n_tok, nv, nk, dk, ch);
        float *gb = rnd(n_tok * 2 * nv, 1), *qb = dup(qkv, n_tok * ch);
        cpu_delta_prep(gb, qb, alpha, beta, dt, a, n_tok, nv, nk, dk, ch, 1e-6f);
        assert_memory_equal(qa, qb, (size_t)(n_tok * ch) * sizeof(float));
        for (int64_t t = 0; t < n_tok; t++) {
            assert_memory_equal(gb + t * 2 * nv, ga + t * nv, (size_t)nv * sizeof(float));
            assert_memory_equal(gb + t * 2 * nv + nv, ba + t * nv, (size_t)nv * sizeof(float));
        }
        free(qkv), free(alpha), free(beta), free(dt), free(a), free(qa), free(ga), free(ba);
        free(gb), free(qb);
    }
}

/* cpu_deltanet_in is its chain: two matmuls, conv1d_silu, delta_prep; the window before it
 * kept where asked. */
static void test_deltanet_in_equals_its_chain(void **state)
{
    (void)state;
    enum { T = 3, NV = 4, NK = 2, DK = 8, DV = 6, COLS = 24, K = 4 };
    const int64_t ch = 2 * NK * DK + NV * DV, sn = (K - 1) * ch;
    float *h = rnd(T * COLS, 1), *wa = rnd(NV * COLS, 1), *wb = rnd(NV * COLS, 1);
    float *raw = rnd(T * ch, 2), *cw = rnd(ch * K, 1), *st = rnd(sn, 2), *dt = rnd(NV, 1);
    float *a = rnd(NV, 1), *st2 = dup(st, sn);
    ops_weight owa, owb;
    assert_int_equal(ops_weight_init(&owa, TD_F32, NV, COLS, wa), TD_OK);
    assert_int_equal(ops_weight_init(&owb, TD_F32, NV, COLS, wb), TD_OK);
    float al[T * NV], be[T * NV], qkv[T * ch], gb[T * 2 * NV], prev[(K - 1) * ch];
    ops_dn_in p = {.n_tok = T, .h = h, .w_alpha = &owa, .w_beta = &owb, .alpha = al,
                   .beta = be, .raw = raw, .raw_stride = ch, .conv_w = cw, .conv_state = st,
                   .conv_prev = prev,
                   .n_ch = ch, .conv_k = K, .qkv = qkv, .gb = gb, .dt_bias = dt, .ssm_a = a,
                   .n_v_head = NV, .n_k_head = NK, .d_k = DK, .eps = 1e-6f};
    cpu_deltanet_in(&p);
    assert_memory_equal(prev, st2, sizeof prev); /* the window before the block */
    float al2[T * NV], be2[T * NV], qkv2[T * ch], gb2[T * 2 * NV];
    cpu_matmul(al2, h, &owa, T);
    cpu_matmul(be2, h, &owb, T);
    cpu_conv1d_silu(qkv2, st2, NULL, raw, ch, cw, T, ch, K);
    cpu_delta_prep(gb2, qkv2, al2, be2, dt, a, T, NV, NK, DK, ch, 1e-6f);
    assert_memory_equal(qkv, qkv2, sizeof qkv);
    assert_memory_equal(gb, gb2, sizeof gb);
    assert_memory_equal(st, st2, (size_t)sn * sizeof(float));
    /* k came out unit length, v did not */
    float ss = 0;
    for (int i = 0; i < DK; i++)
        ss += qkv[NK * DK + i] * qkv[NK * DK + i];
    assert_true(fabsf(ss - 1.0f) < 1e-5f && fabsf(qkv[2 * NK * DK]) > 0);
    free(h), free(wa), free(wb), free(raw), free(cw), free(st), free(dt), free(a), free(st2);
}

static void test_conv1d_silu_equals_conv_then_silu(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {{1, 5, 4}, {7, 33, 4}, {16, 96, 3}, {3, 10, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int64_t n_tok = shapes[s][0], n_ch = shapes[s][1], k = shapes[s][2];
        const int64_t stride = n_ch + 3, ns = (k - 1) * n_ch;
        float *x = rnd(n_tok * stride, 3), *w = rnd(n_ch * k, 1), *st = rnd(ns, 2);
        float *sa = dup(st, ns), *sb = dup(st, ns);
        float *oa = malloc((size_t)(n_tok * n_ch) * sizeof(float));
        float *ob = malloc((size_t)(n_tok * n_ch) * sizeof(float));
        float *alla = malloc((size_t)(n_tok * ns + 1) * sizeof(float));
        float *allb = malloc((size_t)(n_tok * ns + 1) * sizeof(float));
        cpu_conv1d_causal(oa, sa, alla, x, stride, w, n_tok, n_ch, k);
        cpu_silu(oa, oa, n_tok * n_ch);
        cpu_conv1d_silu(ob, sb, allb, x, stride, w, n_tok, n_ch, k);
        assert_memory_equal(oa, ob, (size_t)(n_tok * n_ch) * sizeof(float));
        assert_memory_equal(sa, sb, (size_t)ns * sizeof(float));
        assert_memory_equal(alla, allb, (size_t)(n_tok * ns) * sizeof(float));
        /* silu really applied: an output that differs from the plain convolution */
        cpu_conv1d_causal(ob, st, NULL, x, stride, w, n_tok, n_ch, k);
        assert_true(memcmp(oa, ob, (size_t)(n_tok * n_ch) * sizeof(float)) != 0);
        free(x), free(w), free(st), free(sa), free(sb), free(oa), free(ob), free(alla),
            free(allb);
    }
}

/* Gated q heads (norm over the query half), plain k heads, partial rotation: the chain. */
static void test_qk_norm_rope_equals_norms_then_ropes(void **state)
{
    (void)state;
    const int64_t n = 3, nh = 4, nkv = 2, hd = 64, q_head = 128, n_rot = 32;
    const int32_t pos[3] = {0, 7, 123456};
    float *q = rnd(n * nh * q_head, 3), *k = rnd(n * nkv * hd, 3);
    float *qn = rnd(hd, 1.5f), *kn = rnd(hd, 1.5f);
    float *qa = dup(q, n * nh * q_head), *ka = dup(k, n * nkv * hd);
    cpu_rmsnorm(qa, qa, qn, n * nh, hd, q_head, 1e-6f);
    cpu_rmsnorm(ka, ka, kn, n * nkv, hd, hd, 1e-6f);
    cpu_rope_neox(qa, n, nh, nh * q_head, q_head, n_rot, pos, 1e6f);
    cpu_rope_neox(ka, n, nkv, nkv * hd, hd, n_rot, pos, 1e6f);
    cpu_qk_norm_rope(q, k, qn, kn, n, nh, nkv, hd, q_head, n_rot, pos, 1e6f, 1e-6f);
    assert_memory_equal(q, qa, (size_t)(n * nh * q_head) * sizeof(float));
    assert_memory_equal(k, ka, (size_t)(n * nkv * hd) * sizeof(float));
    /* k heads alone (no q): the same k chain */
    float *k2 = rnd(n * nkv * hd, 3), *kb = dup(k2, n * nkv * hd);
    cpu_rmsnorm(kb, kb, kn, n * nkv, hd, hd, 1e-6f);
    cpu_rope_neox(kb, n, nkv, nkv * hd, hd, n_rot, pos, 1e6f);
    cpu_qk_norm_rope(NULL, k2, NULL, kn, n, 0, nkv, hd, hd, n_rot, pos, 1e6f, 1e-6f);
    assert_memory_equal(k2, kb, (size_t)(n * nkv * hd) * sizeof(float));
    free(q), free(k), free(qn), free(kn), free(qa), free(ka), free(k2), free(kb);
}

/* The CPU backend's qk_norm_rope with a cache destination: cpu_qk_norm_rope, then
 * cpu_kv_store of the finished keys (f32 and f16 caches, scattered rows, the rest of the
 * cache untouched). */
static void test_qk_norm_rope_op_stores_kv(void **state)
{
    (void)state;
    const int64_t n = 3, nh = 4, nkv = 2, hd = 64, q_head = 128, n_rot = 32, row = nkv * hd;
    const int32_t pos[3] = {0, 7, 123456}, rows[3] = {5, 0, 3};
    const ops_backend *be = ops_backend_cpu();
    static const td_dtype types[] = {TD_F32, TD_F16};
    for (int y = 0; y < 2; y++) {
        const size_t cache = (size_t)(6 * row) * (types[y] == TD_F16 ? 2 : 4);
        float *q = rnd(n * nh * q_head, 3), *k = rnd(n * nkv * hd, 3), *v = rnd(n * row, 3);
        float *qn = rnd(hd, 1.5f), *kn = rnd(hd, 1.5f);
        float *qa = dup(q, n * nh * q_head), *ka = dup(k, n * nkv * hd);
        unsigned char *kc = malloc(cache), *vc = malloc(cache), *kc2 = malloc(cache),
                      *vc2 = malloc(cache);
        memset(kc, 0xA5, cache), memset(vc, 0xA5, cache);
        memset(kc2, 0xA5, cache), memset(vc2, 0xA5, cache);
        cpu_qk_norm_rope(qa, ka, qn, kn, n, nh, nkv, hd, q_head, n_rot, pos, 1e6f, 1e-6f);
        cpu_kv_store(kc, vc, types[y], ka, v, rows, n, row);
        const ops_kv_dst kv = {.k_cache = kc2, .v_cache = vc2, .type = types[y], .v = v,
                               .rows = rows, .row = row};
        assert_int_equal(be->qk_norm_rope(be, q, k, qn, kn, n, nh, nkv, hd, q_head, n_rot, pos,
                                          1e6f, 1e-6f, &kv),
                         TD_OK);
        assert_memory_equal(q, qa, (size_t)(n * nh * q_head) * sizeof(float));
        assert_memory_equal(k, ka, (size_t)(n * nkv * hd) * sizeof(float));
        assert_memory_equal(kc2, kc, cache);
        assert_memory_equal(vc2, vc, cache);
        /* a row not named keeps its bytes */
        assert_int_equal(kc2[(size_t)row * (types[y] == TD_F16 ? 2 : 4)], 0xA5);
        free(q), free(k), free(v), free(qn), free(kn), free(qa), free(ka);
        free(kc), free(vc), free(kc2), free(vc2);
    }
}

/* The same with the q side as a second layer's keys (n_head == n_head_kv, q_head == head_dim,
 * kv.qk_cache set): both layers' keys and values stored, each as cpu_kv_store would. */
static void test_qk_norm_rope_op_stores_two_layers(void **state)
{
    (void)state;
    const int64_t n = 3, nkv = 2, hd = 64, n_rot = 32, row = nkv * hd;
    const int32_t pos[3] = {4, 9, 70000}, rows[3] = {1, 5, 2};
    const ops_backend *be = ops_backend_cpu();
    static const td_dtype types[] = {TD_F32, TD_F16};
    for (int y = 0; y < 2; y++) {
        const size_t cache = (size_t)(6 * row) * (types[y] == TD_F16 ? 2 : 4);
        float *ka = rnd(n * row, 3), *kb = rnd(n * row, 3), *va = rnd(n * row, 3),
              *vb = rnd(n * row, 3), *na = rnd(hd, 1.5f), *nb = rnd(hd, 1.5f);
        float *ka2 = dup(ka, n * row), *kb2 = dup(kb, n * row);
        unsigned char *c[8];
        for (int i = 0; i < 8; i++) {
            c[i] = malloc(cache);
            memset(c[i], 0xA5, cache);
        }
        cpu_qk_norm_rope(NULL, ka2, NULL, na, n, 0, nkv, hd, hd, n_rot, pos, 1e6f, 1e-6f);
        cpu_qk_norm_rope(NULL, kb2, NULL, nb, n, 0, nkv, hd, hd, n_rot, pos, 1e6f, 1e-6f);
        cpu_kv_store(c[0], c[1], types[y], ka2, va, rows, n, row);
        cpu_kv_store(c[2], c[3], types[y], kb2, vb, rows, n, row);
        const ops_kv_dst kv = {.k_cache = c[6], .v_cache = c[7], .type = types[y], .v = vb,
                               .rows = rows, .row = row, .qk_cache = c[4], .qv_cache = c[5],
                               .qv = va};
        assert_int_equal(be->qk_norm_rope(be, ka, kb, na, nb, n, nkv, nkv, hd, hd, n_rot, pos,
                                          1e6f, 1e-6f, &kv),
                         TD_OK);
        assert_memory_equal(ka, ka2, (size_t)(n * row) * sizeof(float));
        assert_memory_equal(kb, kb2, (size_t)(n * row) * sizeof(float));
        for (int i = 0; i < 4; i++)
            assert_memory_equal(c[4 + i], c[i], cache);
        assert_int_equal(c[4][0], 0xA5); /* row 0 is not named */
        free(ka), free(kb), free(va), free(vb), free(na), free(nb), free(ka2), free(kb2);
        for (int i = 0; i < 8; i++)
            free(c[i]);
    }
}

/* Per type: gate = silu(gate) * up, then y = gate . W^T, bit for bit the pair of ops. */
static void test_swiglu_matmul_equals_swiglu_then_matmul(void **state)
{
    (void)state;
    static const td_dtype types[] = {TD_F32, TD_BF16, TD_Q8_0, TD_Q4_K, TD_Q6_K};
    const int64_t rows = 19, cols = 512;
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        uint64_t rb = 0;
        assert_int_equal(dtype_bytes(types[t], (uint64_t)cols, &rb), TD_OK);
        float *wf = rnd(rows * cols, 1);
        uint8_t *q = malloc((size_t)(rows * (int64_t)rb));
        for (int64_t r = 0; r < rows; r++)
            assert_int_equal(cpu_quantize_row(types[t], wf + r * cols, q + r * rb, cols), TD_OK);
        ops_weight w;
        assert_int_equal(ops_weight_init(&w, types[t], rows, cols, q), TD_OK);
        for (int64_t n_tok = 1; n_tok <= 17; n_tok += 8) {
            float *g = rnd(n_tok * cols, 4), *u = rnd(n_tok * cols, 2);
            float *ga = dup(g, n_tok * cols), *gb = dup(g, n_tok * cols);
            float *ya = malloc((size_t)(n_tok * rows) * sizeof(float));
            float *yb = malloc((size_t)(n_tok * rows) * sizeof(float));
            cpu_swiglu(ga, ga, u, n_tok * cols);
            cpu_matmul(ya, ga, &w, n_tok);
            cpu_swiglu_matmul(yb, gb, u, &w, n_tok);
            assert_memory_equal(ga, gb, (size_t)(n_tok * cols) * sizeof(float));
            assert_memory_equal(ya, yb, (size_t)(n_tok * rows) * sizeof(float));
            free(g), free(u), free(ga), free(gb), free(ya), free(yb);
        }
        free(wf), free(q);
    }
}

static void test_delta_rule_strided_gates_and_state_before(void **state)
{
    (void)state;
    const int64_t n_tok = 5, nk = 2, nv = 4, dk = 8, dv = 16, ch = 2 * nk * dk + nv * dv;
    float *qkv = rnd(n_tok * ch, 0.3f), *g = rnd(n_tok * nv, 0.5f), *b = rnd(n_tok * nv, 0.5f);
    for (int64_t i = 0; i < n_tok * nv; i++) {
        g[i] = -fabsf(g[i]);
        b[i] = fabsf(b[i]);
    }
    float *gb = malloc((size_t)(n_tok * 2 * nv) * sizeof *gb);
    for (int64_t t = 0; t < n_tok; t++) {
        memcpy(gb + t * 2 * nv, g + t * nv, (size_t)nv * sizeof *gb);
        memcpy(gb + t * 2 * nv + nv, b + t * nv, (size_t)nv * sizeof *gb);
    }
    int64_t ns = nv * dk * dv;
    float *s0 = rnd(ns, 1), *sa = dup(s0, ns), *sb = dup(s0, ns), *prev = rnd(ns, 1);
    float *oa = malloc((size_t)(n_tok * nv * dv) * sizeof *oa), *ob = malloc((size_t)(n_tok * nv * dv) * sizeof *ob);
    ops_delta d = {.n_tok = n_tok, .n_k_head = nk, .n_v_head = nv, .d_k = dk, .d_v = dv,
                   .q = qkv, .k = qkv + nk * dk, .v = qkv + 2 * nk * dk, .q_tok_stride = ch,
                   .k_tok_stride = ch, .v_tok_stride = ch, .g = g, .beta = b, .state = sa,
                   .out = oa};
    cpu_delta_rule(&d);
    d.g = gb, d.beta = gb + nv, d.gb_tok_stride = 2 * nv, d.state = sb, d.state_prev = prev;
    d.out = ob;
    cpu_delta_rule(&d);
    assert_memory_equal(oa, ob, (size_t)(n_tok * nv * dv) * sizeof(float));
    assert_memory_equal(sa, sb, (size_t)ns * sizeof(float));
    assert_memory_equal(prev, s0, (size_t)ns * sizeof(float));
    /* starting from state_in (a rollback point) into a state of other values: as if copied */
    float *sc = rnd(ns, 1), *oc = malloc((size_t)(n_tok * nv * dv) * sizeof *oc);
    d.state = sc, d.state_in = s0, d.state_prev = NULL, d.out = oc;
    cpu_delta_rule(&d);
    assert_memory_equal(oc, oa, (size_t)(n_tok * nv * dv) * sizeof(float));
    assert_memory_equal(sc, sa, (size_t)ns * sizeof(float));
    free(sc), free(oc);
    free(qkv), free(g), free(b), free(gb), free(s0), free(sa), free(sb), free(prev), free(oa), free(ob);
}

/* cpu_attention with a key count from memory (the CPU twin of a recorded GPU call) equals
 * the call sized for those keys, bit for bit. */
static void test_attention_key_count_from_memory(void **state)
{
    (void)state;
    const int64_t n_q = 3, n_head = 4, n_kv_head = 2, D = 16, cap = 40, n_kv = 23;
    float *q = rnd(n_q * n_head * D, 1), *k = rnd(cap * n_kv_head * D, 1), *v = rnd(cap * n_kv_head * D, 1);
    int32_t pos[40];
    for (int i = 0; i < 40; i++)
        pos[i] = i;
    float *o1 = malloc((size_t)(n_q * n_head * D) * sizeof *o1), *o2 = malloc((size_t)(n_q * n_head * D) * sizeof *o2);
    ops_attn a = {.n_q = n_q, .n_head = n_head, .n_head_kv = n_kv_head, .head_dim = D,
                  .scale = 0.25f, .q = q, .q_tok_stride = n_head * D, .q_head_stride = D,
                  .q_pos = pos + n_kv - n_q, .kv_type = TD_F32, .k = k, .v = v,
                  .kv_tok_stride = n_kv_head * D, .kv_head_stride = D, .k_pos = pos,
                  .n_kv = n_kv, .mask = OPS_MASK_CAUSAL, .out = o1};
    cpu_attention(&a);
    int32_t count = (int32_t)n_kv;
    a.n_kv = cap, a.n_kv_dev = &count, a.out = o2;
    cpu_attention(&a);
    assert_memory_equal(o1, o2, (size_t)(n_q * n_head * D) * sizeof(float));
    free(q), free(k), free(v), free(o1), free(o2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_rmsnorm_equals_add_then_rmsnorm),
        cmocka_unit_test(test_rmsnorm_silu_equals_rmsnorm_silu_mul),
        cmocka_unit_test(test_delta_prep_equals_the_per_token_chain),
        cmocka_unit_test(test_deltanet_in_equals_its_chain),
        cmocka_unit_test(test_conv1d_silu_equals_conv_then_silu),
        cmocka_unit_test(test_swiglu_matmul_equals_swiglu_then_matmul),
        cmocka_unit_test(test_qk_norm_rope_equals_norms_then_ropes),
        cmocka_unit_test(test_qk_norm_rope_op_stores_kv),
        cmocka_unit_test(test_qk_norm_rope_op_stores_two_layers),
        cmocka_unit_test(test_delta_rule_strided_gates_and_state_before),
        cmocka_unit_test(test_attention_key_count_from_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
