/* Gated DeltaNet's recurrent pieces against numpy float64 loops: the causal conv1d with a
 * carried window and the gated delta rule, plus the properties rollback relies on (running
 * in two chunks equals running at once; the state saved after token k equals the state after
 * running the first k tokens alone). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/ops.h"
#include "tests/support/ops_golden.h"

static gguf_file *G;

static void assert_close(const float *got, const float *want, int64_t n, float tol,
                         const char *what)
{
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - want[i]) <= tol * (1 + fabsf(want[i]))))
            fail_msg("%s[%lld] = %.9g, want %.9g", what, (long long)i, got[i], want[i]);
}

/* --- conv1d ---------------------------------------------------------------------------- */

enum { C_TOK = 9, C_CH = 6, C_K = 4 };

static void test_conv1d_matches_numpy_with_state_after_every_token(void **s)
{
    (void)s;
    const float *x = golden_tensor(G, "conv.x", TD_F32, C_TOK * C_CH);
    const float *w = golden_tensor(G, "conv.w", TD_F32, C_CH * C_K);
    const float *st0 = golden_tensor(G, "conv.state", TD_F32, (C_K - 1) * C_CH);
    const float *ref = golden_tensor(G, "conv.ref", TD_F32, C_TOK * C_CH);
    const float *ref_states =
        golden_tensor(G, "conv.ref_states", TD_F32, C_TOK * (C_K - 1) * C_CH);
    float state[(C_K - 1) * C_CH], all[C_TOK * (C_K - 1) * C_CH], out[C_TOK * C_CH];
    memcpy(state, st0, sizeof state);
    cpu_conv1d_causal(out, state, all, x, C_CH, w, C_TOK, C_CH, C_K);
    assert_close(out, ref, C_TOK * C_CH, 1e-6f, "conv out");
    assert_close(all, ref_states, C_TOK * (C_K - 1) * C_CH, 0, "conv state_all");
    /* the final state is the raw last k-1 inputs, bit for bit */
    assert_memory_equal(state, x + (C_TOK - (C_K - 1)) * C_CH, sizeof state);
}

static void test_conv1d_in_chunks_equals_at_once(void **s)
{
    (void)s;
    const float *x = golden_tensor(G, "conv.x", TD_F32, C_TOK * C_CH);
    const float *w = golden_tensor(G, "conv.w", TD_F32, C_CH * C_K);
    const float *st0 = golden_tensor(G, "conv.state", TD_F32, (C_K - 1) * C_CH);
    float once_state[(C_K - 1) * C_CH], once[C_TOK * C_CH];
    memcpy(once_state, st0, sizeof once_state);
    cpu_conv1d_causal(once, once_state, NULL, x, C_CH, w, C_TOK, C_CH, C_K);
    /* splits shorter than the window (1, 2) reuse part of the old state */
    const int splits[] = {1, 2, 3, 5, 8};
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++) {
        int a = splits[i];
        float state[(C_K - 1) * C_CH], out[C_TOK * C_CH];
        memcpy(state, st0, sizeof state);
        cpu_conv1d_causal(out, state, NULL, x, C_CH, w, a, C_CH, C_K);
        cpu_conv1d_causal(out + a * C_CH, state, NULL, x + a * C_CH, C_CH, w, C_TOK - a,
                          C_CH, C_K);
        assert_memory_equal(out, once, sizeof once);
        assert_memory_equal(state, once_state, sizeof state);
    }
}

static void test_conv1d_reads_strided_input(void **s)
{
    (void)s;
    /* the conv input is a slice of a wider row (x_stride > n_ch) */
    const float *x = golden_tensor(G, "conv.x", TD_F32, C_TOK * C_CH);
    const float *w = golden_tensor(G, "conv.w", TD_F32, C_CH * C_K);
    const float *st0 = golden_tensor(G, "conv.state", TD_F32, (C_K - 1) * C_CH);
    const float *ref = golden_tensor(G, "conv.ref", TD_F32, C_TOK * C_CH);
    enum { STRIDE = C_CH + 5 };
    float wide[C_TOK * STRIDE], state[(C_K - 1) * C_CH], out[C_TOK * C_CH];
    for (int t = 0; t < C_TOK; t++)
        for (int c = 0; c < STRIDE; c++)
            wide[t * STRIDE + c] = c < C_CH ? x[t * C_CH + c] : 1e9f;
    memcpy(state, st0, sizeof state);
    cpu_conv1d_causal(out, state, NULL, wide, STRIDE, w, C_TOK, C_CH, C_K);
    assert_close(out, ref, C_TOK * C_CH, 1e-6f, "strided conv out");
}

/* --- delta rule ------------------------------------------------------------------------ */

enum { D_T = 7, D_NK = 2, D_NV = 4, D_DK = 8, D_DV = 6 };
#define D_S (D_NV * D_DK * D_DV)

static ops_delta delta_golden(float *state, float *state_all, float *out)
{
    ops_delta d = {0};
    d.n_tok = D_T;
    d.n_k_head = D_NK;
    d.n_v_head = D_NV;
    d.d_k = D_DK;
    d.d_v = D_DV;
    d.q = golden_tensor(G, "delta.q", TD_F32, D_T * D_NK * D_DK);
    d.k = golden_tensor(G, "delta.k", TD_F32, D_T * D_NK * D_DK);
    d.v = golden_tensor(G, "delta.v", TD_F32, D_T * D_NV * D_DV);
    d.q_tok_stride = D_NK * D_DK;
    d.k_tok_stride = D_NK * D_DK;
    d.v_tok_stride = D_NV * D_DV;
    d.g = golden_tensor(G, "delta.g", TD_F32, D_T * D_NV);
    d.beta = golden_tensor(G, "delta.beta", TD_F32, D_T * D_NV);
    memcpy(state, golden_tensor(G, "delta.state", TD_F32, D_S), D_S * sizeof(float));
    d.state = state;
    d.state_all = state_all;
    d.out = out;
    return d;
}

static void test_delta_rule_matches_numpy_f64_loop(void **s)
{
    (void)s;
    float state[D_S], all[D_T * D_S], out[D_T * D_NV * D_DV];
    ops_delta d = delta_golden(state, all, out);
    cpu_delta_rule(&d);
    assert_close(out, golden_tensor(G, "delta.ref", TD_F32, D_T * D_NV * D_DV),
                 D_T * D_NV * D_DV, 2e-6f, "delta out");
    const float *ref_states = golden_tensor(G, "delta.ref_states", TD_F32, D_T * D_S);
    assert_close(all, ref_states, D_T * D_S, 2e-6f, "delta state_all");
    assert_memory_equal(state, all + (D_T - 1) * D_S, sizeof state);
}

/* With norm_z the output is then normed in place: exactly cpu_rmsnorm_silu of the plain
 * output (and a norm that changed nothing would fail: the rows are not unit-RMS). */
static void test_delta_rule_with_norm_is_the_rule_then_rmsnorm_silu(void **s)
{
    (void)s;
    float state[D_S], out[D_T * D_NV * D_DV], st2[D_S], out2[D_T * D_NV * D_DV];
    float z[D_T * D_NV * D_DV], w[D_DV];
    for (int i = 0; i < D_T * D_NV * D_DV; i++)
        z[i] = 0.37f * (float)(i % 11) - 1.5f;
    for (int i = 0; i < D_DV; i++)
        w[i] = 0.5f + 0.25f * (float)i;
    ops_delta d = delta_golden(state, NULL, out);
    cpu_delta_rule(&d);
    cpu_rmsnorm_silu(out, out, w, z, D_T * D_NV, D_DV, 1e-6f);
    ops_delta n = delta_golden(st2, NULL, out2);
    n.norm_w = w, n.norm_z = z, n.norm_eps = 1e-6f;
    cpu_delta_rule(&n);
    assert_memory_equal(out2, out, sizeof out);
    assert_memory_equal(st2, state, sizeof state);
    const float *plain = golden_tensor(G, "delta.ref", TD_F32, D_T * D_NV * D_DV);
    assert_true(fabsf(out2[0] - plain[0]) > 1e-3f);
}

static void test_delta_rule_saved_state_equals_running_k_tokens_alone(void **s)
{
    (void)s;
    float state[D_S], all[D_T * D_S], out[D_T * D_NV * D_DV];
    ops_delta d = delta_golden(state, all, out);
    cpu_delta_rule(&d);
    for (int k = 1; k <= D_T; k++) {
        float st_k[D_S], out_k[D_T * D_NV * D_DV];
        ops_delta dk = delta_golden(st_k, NULL, out_k);
        dk.n_tok = k;
        cpu_delta_rule(&dk);
        assert_memory_equal(st_k, all + (k - 1) * D_S, sizeof st_k);
        assert_memory_equal(out_k, out, (size_t)k * D_NV * D_DV * sizeof(float));
        /* and continuing from that state gives the rest of the run */
        if (k < D_T) {
            float out_rest[D_T * D_NV * D_DV];
            ops_delta dr = delta_golden(st_k + 0, NULL, out_rest);
            memcpy(st_k, all + (k - 1) * D_S, sizeof st_k);
            dr.state = st_k;
            dr.n_tok = D_T - k;
            dr.q += k * D_NK * D_DK;
            dr.k += k * D_NK * D_DK;
            dr.v += k * D_NV * D_DV;
            dr.g += k * D_NV;
            dr.beta += k * D_NV;
            cpu_delta_rule(&dr);
            assert_memory_equal(out_rest, out + k * D_NV * D_DV,
                                (size_t)(D_T - k) * D_NV * D_DV * sizeof(float));
            assert_memory_equal(st_k, state, sizeof st_k);
        }
    }
}

/* Several recurrences in one call (a rollback's replay): each as alone; without outputs
 * the state is the same. */
static void test_delta_rule_many_equals_each_alone_and_out_is_optional(void **s)
{
    (void)s;
    float state[D_S], out[D_T * D_NV * D_DV];
    ops_delta d = delta_golden(state, NULL, out);
    cpu_delta_rule(&d);
    float st[3][D_S], o1[D_T * D_NV * D_DV];
    ops_delta many[3] = {delta_golden(st[0], NULL, NULL), delta_golden(st[1], NULL, o1),
                         delta_golden(st[2], NULL, NULL)};
    many[2].n_tok = 2; /* another length */
    cpu_delta_rule_many(many, 3);
    assert_memory_equal(st[0], state, sizeof state);
    assert_memory_equal(st[1], state, sizeof state);
    assert_memory_equal(o1, out, sizeof out);
    float st2[D_S], out2[D_T * D_NV * D_DV];
    ops_delta two = delta_golden(st2, NULL, out2);
    two.n_tok = 2;
    cpu_delta_rule(&two);
    assert_memory_equal(st[2], st2, sizeof st2);
    assert_memory_not_equal(st[2], state, sizeof state);
}

static void test_delta_rule_one_token_by_hand(void **s)
{
    (void)s;
    /* d_k = d_v = 1, S = 2, g = log(0.5), beta = 0.5, k = 1, v = 3, q = 2:
     * S = 1; kv = 1; S += 1 * 0.5 * (3 - 1) = 2; o = 2 * 2 = 4. */
    float S = 2, o = 0;
    const float q = 2, k = 1, v = 3, g = logf(0.5f), beta = 0.5f;
    ops_delta d = {.n_tok = 1, .n_k_head = 1, .n_v_head = 1, .d_k = 1, .d_v = 1, .q = &q,
                   .k = &k, .v = &v, .q_tok_stride = 1, .k_tok_stride = 1, .v_tok_stride = 1,
                   .g = &g, .beta = &beta, .state = &S, .out = &o};
    cpu_delta_rule(&d);
    assert_true(fabsf(S - 2.0f) < 1e-6f && fabsf(o - 4.0f) < 1e-6f);
}

/* --- the chunked form ---------------------------------------------------------------- */

/* Every chunk length and alignment gives the numpy loop's outputs and final state. */
static void test_delta_rule_chunked_matches_numpy_f64_loop(void **s)
{
    (void)s;
    const float *ref = golden_tensor(G, "delta.ref", TD_F32, D_T * D_NV * D_DV);
    const float *ref_states = golden_tensor(G, "delta.ref_states", TD_F32, D_T * D_S);
    const int64_t chunks[] = {1, 2, 3, 7, OPS_DELTA_CHUNK_MAX};
    const int32_t starts[] = {0, 1, 5, 64};
    for (int c = 0; c < 5; c++)
        for (int p = 0; p < 4; p++) {
            float state[D_S], out[D_T * D_NV * D_DV];
            ops_delta d = delta_golden(state, NULL, out);
            d.chunk = chunks[c];
            d.pos0 = &starts[p];
            cpu_delta_rule(&d);
            assert_close(out, ref, D_T * D_NV * D_DV, 1e-5f, "chunked delta out");
            assert_close(state, ref_states + (D_T - 1) * D_S, D_S, 1e-5f, "chunked delta state");
        }
}

/* A run cut where a chunk ends, the second part told its position, gives the bits of the run
 * whole (what a prompt resumed at a chunk end relies on); state_prev and the gated norm as
 * with the token-by-token form. */
static void test_delta_rule_chunked_cut_at_chunk_ends_equals_whole(void **s)
{
    (void)s;
    const int32_t p0 = 1; /* chunks of 3 end after positions 2, 5, 8: tokens 0-1, 2-4, 5-6 */
    float state[D_S], out[D_T * D_NV * D_DV], prev[D_S];
    ops_delta d = delta_golden(state, NULL, out);
    d.chunk = 3, d.pos0 = &p0, d.state_prev = prev;
    cpu_delta_rule(&d);
    assert_memory_equal(prev, golden_tensor(G, "delta.state", TD_F32, D_S), sizeof prev);
    const int cuts[] = {2, 5};
    for (int c = 0; c < 2; c++) {
        const int k = cuts[c];
        const int32_t p1 = p0 + k;
        float st[D_S], o[D_T * D_NV * D_DV];
        ops_delta a = delta_golden(st, NULL, o);
        a.chunk = 3, a.pos0 = &p0, a.n_tok = k;
        cpu_delta_rule(&a);
        ops_delta b = a;
        b.pos0 = &p1, b.n_tok = D_T - k, b.out = o + k * D_NV * D_DV;
        b.q += k * D_NK * D_DK, b.k += k * D_NK * D_DK, b.v += k * D_NV * D_DV;
        b.g += k * D_NV, b.beta += k * D_NV;
        cpu_delta_rule(&b);
        assert_memory_equal(o, out, sizeof out);
        assert_memory_equal(st, state, sizeof state);
    }
}

/* Longer runs with the model's chunk of 64 (cut by the alignment into 24 + 64 + 62 tokens)
 * and wider heads: within rounding of the token-by-token form, outputs normed alike. */
static void test_delta_rule_chunked_long_run_matches_token_by_token(void **s)
{
    (void)s;
    enum { T = 150, NK = 2, NV = 4, DK = 32, DV = 24 };
    static float q[T * NK * DK], k[T * NK * DK], v[T * NV * DV], gb[T * 2 * NV], z[T * NV * DV];
    static float st0[NV * DK * DV], st1[NV * DK * DV], o0[T * NV * DV], o1[T * NV * DV];
    uint32_t x = 12345;
    for (int i = 0; i < T * NK * DK; i++) {
        x = x * 1664525u + 1013904223u;
        q[i] = ((float)(x >> 8) / 16777216.0f - 0.5f) * 0.35f;
        x = x * 1664525u + 1013904223u;
        k[i] = ((float)(x >> 8) / 16777216.0f - 0.5f) * 0.35f; /* |k| near 1 */
    }
    for (int i = 0; i < T * NV * DV; i++) {
        x = x * 1664525u + 1013904223u;
        v[i] = (float)(x >> 8) / 16777216.0f * 2.0f - 1.0f;
        z[i] = 0.25f * (float)(i % 9) - 1.0f;
    }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NV; h++) {
            gb[t * 2 * NV + h] = -0.02f - 0.3f * (float)((t * 7 + h) % 5) / 5.0f;
            gb[t * 2 * NV + NV + h] = 0.1f + 0.8f * (float)((t * 3 + h) % 7) / 7.0f;
        }
    for (int i = 0; i < NV * DK * DV; i++)
        st0[i] = st1[i] = 0.01f * (float)(i % 17) - 0.08f;
    const int32_t p0 = 40;
    ops_delta d = {.n_tok = T, .n_k_head = NK, .n_v_head = NV, .d_k = DK, .d_v = DV, .q = q,
                   .k = k, .v = v, .q_tok_stride = NK * DK, .k_tok_stride = NK * DK,
                   .v_tok_stride = NV * DV, .g = gb, .beta = gb + NV, .gb_tok_stride = 2 * NV,
                   .state = st0, .out = o0, .norm_z = z, .norm_eps = 1e-6f};
    cpu_delta_rule(&d);
    ops_delta c = d;
    c.state = st1, c.out = o1, c.chunk = OPS_DELTA_CHUNK_MAX, c.pos0 = &p0;
    cpu_delta_rule(&c);
    assert_close(o1, o0, T * NV * DV, 1e-4f, "chunked long out");
    assert_close(st1, st0, NV * DK * DV, 1e-4f, "chunked long state");
    assert_memory_not_equal(st1, st0, sizeof st0); /* the chunked form did run */
}

int main(void)
{
    G = golden_open();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv1d_matches_numpy_with_state_after_every_token),
        cmocka_unit_test(test_conv1d_in_chunks_equals_at_once),
        cmocka_unit_test(test_conv1d_reads_strided_input),
        cmocka_unit_test(test_delta_rule_matches_numpy_f64_loop),
        cmocka_unit_test(test_delta_rule_with_norm_is_the_rule_then_rmsnorm_silu),
        cmocka_unit_test(test_delta_rule_saved_state_equals_running_k_tokens_alone),
        cmocka_unit_test(test_delta_rule_many_equals_each_alone_and_out_is_optional),
        cmocka_unit_test(test_delta_rule_one_token_by_hand),
        cmocka_unit_test(test_delta_rule_chunked_matches_numpy_f64_loop),
        cmocka_unit_test(test_delta_rule_chunked_cut_at_chunk_ends_equals_whole),
        cmocka_unit_test(test_delta_rule_chunked_long_run_matches_token_by_token),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gguf_close(G);
    return rc;
}
