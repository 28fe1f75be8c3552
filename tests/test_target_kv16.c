/* The target with an f16 attention KV cache (what the GPU keeps) on the CPU, where the
 * rounding is all there is to see: logits against the transformers golden files within the
 * bound measured for it, a block of tokens bit-identical to running them one at a time, and
 * the cache really holding halves (half the bytes of f32). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/support/ops_golden.h"
#include "verifyd/target.h"

static const char *const models[] = {"qwen35-tiny-f32", "qwen3-tiny-f32", "qwen3-tied-q4_k_m"};

static tgt_model *load_kv16(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "tests/data/models/%s.gguf", name);
    tgt_model *m = NULL;
    if (tgt_load(&m, path) != TD_OK)
        fail_msg("%s: %s", path, err_msg());
    assert_int_equal(m->kv_type, TD_F32); /* the CPU's default */
    m->kv_type = TD_F16;
    return m;
}

/* Keys and values rounded to f16 (2^-11 relative) move the tiny models' logits by the
 * amounts printed; 1e-3 of the range bounds them all (the f32 cache: 1e-4 for float weights,
 * test_target_golden). */
static void test_kv16_logits_match_transformers(void **ctx)
{
    (void)ctx;
    for (size_t k = 0; k < sizeof models / sizeof *models; k++) {
        tgt_model *m = load_kv16(models[k]);
        char path[256];
        snprintf(path, sizeof path, "tests/data/golden/%s.gguf", models[k]);
        gguf_file *g = golden_open_path(path);
        int64_t T = golden_count(g, "tokens"), V = m->hp.n_vocab;
        const int32_t *tokens = golden_tensor(g, "tokens", TD_I32, T);
        float *logits = malloc((size_t)(T * V) * sizeof(float));
        tgt_state st;
        assert_int_equal(tgt_state_init(&st, m, T), TD_OK);
        assert_int_equal(st.kv_type, TD_F16);
        tgt_out out = {.logits = logits};
        assert_int_equal(tgt_forward(m, &st, tokens, T, false, &out), TD_OK);
        int64_t at;
        double r = golden_range_error(logits, golden_tensor(g, "logits", TD_F32, T * V), T * V, &at);
        printf("%s with an f16 KV cache: %.3g of the logit range\n", models[k], r);
        if (!(r <= 1e-3))
            fail_msg("%s: error %.3g of the range at %lld", models[k], r, (long long)at);
        /* position 0's key of layer 0 is stored as f16: its halves equal the f32 key rounded */
        const uint16_t *k0 = st.k[0];
        int nonzero = 0;
        for (int64_t i = 0; i < m->hp.n_head_kv * m->hp.head_dim; i++)
            nonzero += k0[i] != 0;
        assert_true(nonzero > 0);
        free(logits);
        tgt_state_free(&st);
        gguf_close(g);
        tgt_free(m);
    }
}

/* A 16-token block and the same tokens one at a time give the same bits with the f16 cache
 * (each key is rounded once, when stored, whoever reads it later). */
static void test_kv16_block_equals_one_at_a_time(void **ctx)
{
    (void)ctx;
    tgt_model *m = load_kv16("qwen35-tiny-f32");
    int64_t V = m->hp.n_vocab, n = 16;
    int32_t toks[24];
    for (int i = 0; i < 24; i++)
        toks[i] = (int32_t)((i * 37 + 11) % V);
    tgt_state a, b;
    assert_int_equal(tgt_state_init(&a, m, 64), TD_OK);
    assert_int_equal(tgt_state_init(&b, m, 64), TD_OK);
    float *la = malloc((size_t)(n * V) * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    assert_int_equal(tgt_forward(m, &a, toks, 8, false, NULL), TD_OK);
    assert_int_equal(tgt_forward(m, &b, toks, 8, false, NULL), TD_OK);
    tgt_out oa = {.logits = la};
    assert_int_equal(tgt_forward(m, &a, toks + 8, n, true, &oa), TD_OK);
    for (int64_t t = 0; t < n; t++) {
        tgt_out ob = {.logits = lb};
        assert_int_equal(tgt_forward(m, &b, toks + 8 + t, 1, false, &ob), TD_OK);
        if (memcmp(lb, la + t * V, (size_t)V * sizeof(float)))
            fail_msg("token %lld of a block differs from running it alone", (long long)t);
    }
    /* the caches hold the same halves */
    size_t bytes = (size_t)(24 * m->hp.n_head_kv * m->hp.head_dim) * 2;
    assert_memory_equal(a.k[0], b.k[0], bytes);
    assert_memory_equal(a.v[0], b.v[0], bytes);
    free(la);
    free(lb);
    tgt_state_free(&a);
    tgt_state_free(&b);
    tgt_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv16_logits_match_transformers),
        cmocka_unit_test(test_kv16_block_equals_one_at_a_time),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
