/* cpu_attention against numpy float64 references (scripts/golden/make_op_golden.py): causal
 * with a context, f16 cache, a context longer than one key chunk, bidirectional, sliding
 * window (causal and bidirectional), GQA, a qwen35-style interleaved query/gate with the
 * sigmoid output gate, and a tree ancestor mask. */
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

static void run_case(const char *name)
{
    char key[96];
#define K(s) (snprintf(key, sizeof key, "attn.%s.%s", name, s), key)
    const int64_t n_head = golden_u32(G, K("n_head"));
    const int64_t n_head_kv = golden_u32(G, K("n_head_kv"));
    const int64_t D = golden_u32(G, K("head_dim"));
    const int64_t n_q = golden_count(G, K("q_pos"));
    const int64_t n_kv = golden_count(G, K("k_pos"));
    const int gated = (int)golden_u32(G, K("gated"));
    const td_dtype kv_type = gguf_find_tensor(G, K("k"))->type;

    ops_attn a = {0};
    a.n_q = n_q;
    a.n_head = n_head;
    a.n_head_kv = n_head_kv;
    a.head_dim = D;
    a.scale = 1.0f / sqrtf((float)D);
    /* per head D query values then D gate values, like qwen35's attn_q output */
    a.q = golden_tensor(G, K("qg"), TD_F32, n_q * n_head * 2 * D);
    a.q_tok_stride = n_head * 2 * D;
    a.q_head_stride = 2 * D;
    a.q_pos = golden_tensor(G, K("q_pos"), TD_I32, n_q);
    a.kv_type = kv_type;
    a.k = golden_tensor(G, K("k"), kv_type, n_kv * n_head_kv * D);
    a.v = golden_tensor(G, K("v"), kv_type, n_kv * n_head_kv * D);
    a.kv_tok_stride = n_head_kv * D;
    a.kv_head_stride = D;
    a.k_pos = golden_tensor(G, K("k_pos"), TD_I32, n_kv);
    a.n_kv = n_kv;
    a.window = (int32_t)golden_u32(G, K("window"));
    uint64_t *bits = NULL;
    if (golden_str_is(G, K("mask"), "causal")) {
        a.mask = OPS_MASK_CAUSAL;
    } else if (golden_str_is(G, K("mask"), "bidir")) {
        a.mask = OPS_MASK_BIDIRECTIONAL;
    } else {
        assert_true(golden_str_is(G, K("mask"), "tree"));
        a.mask = OPS_MASK_TREE;
        a.n_tree = n_q;
        const int32_t *tree = golden_tensor(G, K("tree"), TD_I32, n_q * n_q);
        const int64_t words = (a.n_tree + 63) / 64;
        bits = calloc((size_t)(n_q * words), sizeof *bits);
        for (int64_t t = 0; t < n_q; t++)
            for (int64_t j = 0; j < n_q; j++)
                if (tree[t * n_q + j])
                    bits[t * words + j / 64] |= 1ull << (j % 64);
        a.tree_bits = bits;
    }
    if (gated) {
        a.gate = a.q + D;
        a.gate_tok_stride = a.q_tok_stride;
        a.gate_head_stride = a.q_head_stride;
    }
    const float *ref = golden_tensor(G, K("ref"), TD_F32, n_q * n_head * D);
    float *out = malloc((size_t)(n_q * n_head * D) * sizeof *out);
    a.out = out;
    cpu_attention(&a);
    for (int64_t i = 0; i < n_q * n_head * D; i++)
        if (fabsf(out[i] - ref[i]) > 2e-6f + 2e-6f * fabsf(ref[i]))
            fail_msg("attn %s: out[%lld] = %.9g, ref %.9g", name, (long long)i, out[i], ref[i]);
    free(out);
    free(bits);
#undef K
}

static void test_attention_causal_gqa_over_context(void **s)
{
    (void)s;
    run_case("causal");
}

static void test_attention_causal_f16_cache(void **s)
{
    (void)s;
    run_case("causal_f16");
}

static void test_attention_context_longer_than_one_chunk(void **s)
{
    (void)s;
    run_case("long");
}

static void test_attention_bidirectional(void **s)
{
    (void)s;
    run_case("bidir");
}

static void test_attention_sliding_window_causal(void **s)
{
    (void)s;
    run_case("swa");
}

static void test_attention_sliding_window_bidirectional(void **s)
{
    (void)s;
    run_case("swa_bidir");
}

static void test_attention_output_gate_interleaved_with_query(void **s)
{
    (void)s;
    run_case("gated");
}

static void test_attention_tree_sees_only_ancestors(void **s)
{
    (void)s;
    run_case("tree");
}

/* One query, two keys: the single visible key's value comes back exactly; a query that
 * sees no key (before every key, causal) gets zeros, not NaN. */
static void test_attention_single_key_and_no_visible_key(void **s)
{
    (void)s;
    const float q[2] = {1, 0};
    const float k[4] = {0.5f, 0.5f, 3.0f, -1.0f};
    const float v[4] = {7, -2, 100, 100};
    const int32_t kp[2] = {4, 5};
    int32_t qp[1] = {4};
    float out[2] = {-1, -1};
    ops_attn a = {.n_q = 1, .n_head = 1, .n_head_kv = 1, .head_dim = 2, .scale = 1,
                  .q = q, .q_tok_stride = 2, .q_head_stride = 2, .q_pos = qp,
                  .kv_type = TD_F32, .k = k, .v = v, .kv_tok_stride = 2, .kv_head_stride = 2,
                  .k_pos = kp, .n_kv = 2, .mask = OPS_MASK_CAUSAL, .out = out};
    cpu_attention(&a);
    assert_true(out[0] == 7.0f && out[1] == -2.0f);
    qp[0] = 3;
    cpu_attention(&a);
    assert_true(out[0] == 0.0f && out[1] == 0.0f);
    a.n_kv = 0;
    cpu_attention(&a);
    assert_true(out[0] == 0.0f && out[1] == 0.0f);
}

int main(void)
{
    G = golden_open();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_causal_gqa_over_context),
        cmocka_unit_test(test_attention_causal_f16_cache),
        cmocka_unit_test(test_attention_context_longer_than_one_chunk),
        cmocka_unit_test(test_attention_bidirectional),
        cmocka_unit_test(test_attention_sliding_window_causal),
        cmocka_unit_test(test_attention_sliding_window_bidirectional),
        cmocka_unit_test(test_attention_output_gate_interleaved_with_query),
        cmocka_unit_test(test_attention_tree_sees_only_ancestors),
        cmocka_unit_test(test_attention_single_key_and_no_visible_key),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gguf_close(G);
    return rc;
}
