/* The target forward pass against golden outputs of Hugging Face transformers (tiny random
 * qwen3 and qwen35 models, tests/data/golden, made by scripts/make_golden.py): logits and the
 * residual stream after every layer, a two-chunk run with the cached state after the first
 * chunk, and exact rollback after a partial accept. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/support/ops_golden.h"

#include "verifyd/target.h"

static const char *const golden_models[] = {
    "qwen35-tiny-f32", "qwen35-tiny-bf16", "qwen35-tiny-q8_0", "qwen3-tiny-f32",
    "qwen3-tied-q4_k", "qwen3-tied-q5_k",  "qwen3-tied-q6_k",  "qwen3-tied-q4_k_m",
};

typedef struct golden {
    tgt_model *m;
    gguf_file *g;
    int32_t tokens[64];
    int64_t n_tok;
    int64_t n_prefix;
} golden;

static void model_open(golden *gd, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "tests/data/models/%s.gguf", name);
    if (tgt_load(&gd->m, path) != TD_OK)
        fail_msg("%s: %s", path, err_msg());
    snprintf(path, sizeof path, "tests/data/golden/%s.gguf", name);
    gd->g = golden_open_path(path);
    const gguf_tensor *t = gguf_find_tensor(gd->g, "tokens");
    assert_non_null(t);
    gd->n_tok = t->ne[0];
    assert_true(gd->n_tok <= 64);
    memcpy(gd->tokens, t->data, (size_t)gd->n_tok * sizeof(int32_t));
    uint32_t p;
    assert_int_equal(gguf_get_u32(gd->g, "golden.n_prefix", &p), TD_OK);
    gd->n_prefix = p;
}

static void model_close(golden *gd)
{
    tgt_free(gd->m);
    gguf_close(gd->g);
}

static const float *model_golden(const golden *gd, const char *name, int64_t n)
{
    return golden_tensor(gd->g, name, TD_F32, n);
}

/* max |got - want| <= tol * (max(want) - min(want)), the bound for f32 weights. */
static void expect_close(const char *what, const float *got, const float *want, int64_t n,
                         double tol)
{
    int64_t at;
    double r = golden_range_error(got, want, n, &at);
    if (!(r <= tol))
        fail_msg("%s: error %.3g of the range at %lld (got %.6g, want %.6g) exceeds %.3g", what,
                 r, (long long)at, got[at], want[at], tol);
}

/* The prompts of these tests prefill token by token and with the chunked DeltaNet recurrence
 * (chunks of 4 from position 0: several per prompt, one cut short at its end). */
static const int64_t delta_chunks[] = {0, 4};
#define N_RUNS (sizeof golden_models / sizeof *golden_models * 2)

/* Run r: model r / 2, chunk delta_chunks[r % 2]. */
static void model_open_run(golden *gd, size_t r)
{
    model_open(gd, golden_models[r / 2]);
    assert_int_equal(tgt_set_delta_chunk(gd->m, delta_chunks[r % 2]), TD_OK);
}

static void test_target_logits_and_hidden_match_transformers(void **ctx)
{
    (void)ctx;
    for (size_t r = 0; r < N_RUNS; r++) {
        const size_t k = r / 2;
        golden gd;
        model_open_run(&gd, r);
        const tgt_hparams *hp = &gd.m->hp;
        int64_t T = gd.n_tok, V = hp->n_vocab, D = hp->n_embd, L = hp->n_layer;
        int32_t taps[64];
        for (int64_t i = 0; i < L; i++)
            taps[i] = (int32_t)i;
        float *logits = malloc((size_t)(T * V) * sizeof(float));
        float *hid = malloc((size_t)(T * L * D) * sizeof(float));
        float *one = malloc((size_t)(T * D) * sizeof(float));
        tgt_state st;
        assert_int_equal(tgt_state_init(&st, gd.m, T), TD_OK);
        tgt_out out = {.logits = logits, .taps = taps, .n_taps = L, .tap_out = hid};
        assert_int_equal(tgt_forward(gd.m, &st, gd.tokens, T, false, &out), TD_OK);
        char what[128];
        snprintf(what, sizeof what, "%s logits", golden_models[k]);
        expect_close(what, logits, model_golden(&gd, "logits", T * V), T * V, 1e-4);
        for (int64_t l = 0; l < L; l++) {
            for (int64_t t = 0; t < T; t++)
                memcpy(one + t * D, hid + (t * L + l) * D, (size_t)D * sizeof(float));
            char name[64];
            snprintf(name, sizeof name, "hidden.%lld", (long long)l);
            snprintf(what, sizeof what, "%s %s", golden_models[k], name);
            expect_close(what, one, model_golden(&gd, name, T * D), T * D, 1e-4);
        }
        tgt_state_free(&st);
        free(logits);
        free(hid);
        free(one);
        model_close(&gd);
    }
}

/* Prefix chunk then the rest: the cached K/V, recurrent and conv state after the prefix and
 * the logits of the second chunk equal the reference's. */
static void test_target_two_chunks_match_cached_state(void **ctx)
{
    (void)ctx;
    for (size_t r = 0; r < N_RUNS; r++) {
        const size_t k = r / 2;
        golden gd;
        model_open_run(&gd, r);
        const tgt_hparams *hp = &gd.m->hp;
        int64_t T = gd.n_tok, P = gd.n_prefix, V = hp->n_vocab;
        tgt_state st;
        assert_int_equal(tgt_state_init(&st, gd.m, T), TD_OK);
        assert_int_equal(tgt_forward(gd.m, &st, gd.tokens, P, false, NULL), TD_OK);
        char name[96], what[160];
        int64_t ia = 0, id = 0, hd = hp->head_dim, nkv = hp->n_head_kv;
        float *kv = malloc((size_t)(P * nkv * hd) * sizeof(float));
        for (int64_t l = 0; l < hp->n_layer; l++) {
            if (gd.m->layers[l].kind == TGT_LAYER_ATTN) {
                for (int which = 0; which < 2; which++) {
                    const float *c = which ? st.v[ia] : st.k[ia];
                    /* ours: [pos][kv head][d]; golden: [kv head][pos][d] */
                    for (int64_t h = 0; h < nkv; h++)
                        for (int64_t p = 0; p < P; p++)
                            memcpy(kv + (h * P + p) * hd, c + (p * nkv + h) * hd,
                                   (size_t)hd * sizeof(float));
                    snprintf(name, sizeof name, "prefix.blk.%lld.%s", (long long)l, which ? "v" : "k");
                    snprintf(what, sizeof what, "%s %s", golden_models[k], name);
                    expect_close(what, kv, model_golden(&gd, name, P * nkv * hd), P * nkv * hd, 1e-4);
                }
                ia++;
            } else {
                int64_t ns = hp->n_v_head * hp->d_k * hp->d_v, nc = (hp->conv_k - 1) * hp->conv_ch;
                snprintf(name, sizeof name, "prefix.blk.%lld.ssm_state", (long long)l);
                snprintf(what, sizeof what, "%s %s", golden_models[k], name);
                expect_close(what, st.ssm[id], model_golden(&gd, name, ns), ns, 1e-4);
                snprintf(name, sizeof name, "prefix.blk.%lld.conv_state", (long long)l);
                snprintf(what, sizeof what, "%s %s", golden_models[k], name);
                expect_close(what, st.conv[id], model_golden(&gd, name, nc), nc, 1e-4);
                id++;
            }
        }
        float *logits = malloc((size_t)((T - P) * V) * sizeof(float));
        tgt_out out = {.logits = logits};
        assert_int_equal(tgt_forward(gd.m, &st, gd.tokens + P, T - P, false, &out), TD_OK);
        snprintf(what, sizeof what, "%s cont.logits", golden_models[k]);
        expect_close(what, logits, model_golden(&gd, "cont.logits", (T - P) * V), (T - P) * V, 1e-4);
        free(logits);
        free(kv);
        tgt_state_free(&st);
        model_close(&gd);
    }
}

static void expect_states_equal(const tgt_model *m, const tgt_state *a, const tgt_state *b)
{
    const tgt_hparams *hp = &m->hp;
    assert_int_equal(a->n_past, b->n_past);
    size_t kv = (size_t)(a->n_past * hp->n_head_kv * hp->head_dim) * sizeof(float);
    for (int64_t i = 0; i < a->n_attn; i++) {
        assert_memory_equal(a->k[i], b->k[i], kv);
        assert_memory_equal(a->v[i], b->v[i], kv);
    }
    size_t ns = (size_t)(hp->n_v_head * hp->d_k * hp->d_v) * sizeof(float);
    size_t nc = (size_t)((hp->conv_k - 1) * hp->conv_ch) * sizeof(float);
    for (int64_t i = 0; i < a->n_delta; i++) {
        assert_memory_equal(a->ssm[i], b->ssm[i], ns);
        assert_memory_equal(a->conv[i], b->conv[i], nc);
    }
}

/* Running P tokens, then a block of n with a record, then keeping k of them, gives exactly
 * (bit for bit) the state of running P + k tokens; the next forward agrees too. */
static void test_target_keep_after_block_equals_running_fewer_tokens(void **ctx)
{
    (void)ctx;
    golden gd;
    model_open(&gd, "qwen35-tiny-f32");
    const tgt_model *m = gd.m;
    int64_t P = 5, n = 9, V = m->hp.n_vocab;
    float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    for (int64_t keep = 0; keep <= n; keep++) {
        tgt_state a, b;
        assert_int_equal(tgt_state_init(&a, m, 32), TD_OK);
        assert_int_equal(tgt_state_init(&b, m, 32), TD_OK);
        assert_int_equal(tgt_forward(m, &a, gd.tokens, P, false, NULL), TD_OK);
        assert_int_equal(tgt_forward(m, &a, gd.tokens + P, n, true, NULL), TD_OK);
        assert_int_equal(tgt_state_keep(m, &a, keep), TD_OK);
        assert_int_equal(tgt_forward(m, &b, gd.tokens, P + keep, false, NULL), TD_OK);
        expect_states_equal(m, &a, &b);
        /* the next token sees the same state */
        tgt_out oa = {.logits = la}, ob = {.logits = lb};
        assert_int_equal(tgt_forward(m, &a, gd.tokens + 20, 1, false, &oa), TD_OK);
        assert_int_equal(tgt_forward(m, &b, gd.tokens + 20, 1, false, &ob), TD_OK);
        assert_memory_equal(la, lb, (size_t)V * sizeof(float));
        tgt_state_free(&a);
        tgt_state_free(&b);
    }
    free(la);
    free(lb);
    model_close(&gd);
}

/* A reset after a recorded block (every layer's recurrent and conv state moved) gives a
 * fresh state's arrays and then a fresh state's logits. */
static void test_target_reset_equals_fresh_state(void **ctx)
{
    (void)ctx;
    golden gd;
    model_open(&gd, "qwen35-tiny-f32");
    const tgt_model *m = gd.m;
    assert_true(m->n_delta_layers >= 2);
    const int64_t V = m->hp.n_vocab;
    const size_t lbytes = (size_t)(4 * V) * sizeof(float); /* logits of 4 tokens */
    float *la = malloc(lbytes), *lb = malloc(lbytes);
    tgt_state a, b;
    assert_int_equal(tgt_state_init(&a, m, 32), TD_OK);
    assert_int_equal(tgt_state_init(&b, m, 32), TD_OK);
    assert_int_equal(tgt_forward(m, &a, gd.tokens, 6, true, NULL), TD_OK);
    assert_int_equal(tgt_state_reset(m, &a), TD_OK);
    expect_states_equal(m, &a, &b);
    tgt_out oa = {.logits = la}, ob = {.logits = lb};
    assert_int_equal(tgt_forward(m, &a, gd.tokens + 3, 4, false, &oa), TD_OK);
    assert_int_equal(tgt_forward(m, &b, gd.tokens + 3, 4, false, &ob), TD_OK);
    assert_memory_equal(la, lb, lbytes);
    tgt_state_free(&a);
    tgt_state_free(&b);
    free(la);
    free(lb);
    model_close(&gd);
}

/* With the chunked recurrence, a prompt cut where a chunk ends (the second part knowing its
 * position) gives the bits of the prompt whole: state and logits; token by token that holds
 * for any cut, so the chunked form keeps it at chunk ends. An out-of-range chunk, or one
 * larger than the backend holds, is refused. */
static void test_target_chunked_prefill_cut_at_chunk_end_equals_whole(void **ctx)
{
    (void)ctx;
    golden gd;
    model_open(&gd, "qwen35-tiny-f32");
    const tgt_model *m = gd.m;
    assert_int_equal(tgt_set_delta_chunk(gd.m, OPS_DELTA_CHUNK_MAX + 1), TD_EINVAL);
    assert_int_equal(tgt_set_delta_chunk(gd.m, -1), TD_EINVAL);
    /* a backend that holds smaller chunks (a GPU's shared memory) refuses larger ones */
    ops_backend small = *gd.m->be;
    small.delta_chunk_max = 8;
    const ops_backend *be = gd.m->be;
    gd.m->be = &small;
    assert_int_equal(tgt_set_delta_chunk(gd.m, 9), TD_ENOTSUP);
    assert_int_equal(tgt_set_delta_chunk(gd.m, 8), TD_OK);
    gd.m->be = be;
    assert_int_equal(tgt_set_delta_chunk(gd.m, 4), TD_OK);
    const int64_t T = gd.n_tok, V = m->hp.n_vocab, cut = 8;
    assert_true(T > cut + 4);
    float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    tgt_state a, b;
    assert_int_equal(tgt_state_init(&a, m, T), TD_OK);
    assert_int_equal(tgt_state_init(&b, m, T), TD_OK);
    tgt_out oa = {.logits = la, .last_only = true}, ob = {.logits = lb, .last_only = true};
    assert_int_equal(tgt_forward(m, &a, gd.tokens, T, false, &oa), TD_OK);
    assert_int_equal(tgt_forward(m, &b, gd.tokens, cut, false, NULL), TD_OK);
    assert_int_equal(tgt_forward(m, &b, gd.tokens + cut, T - cut, false, &ob), TD_OK);
    expect_states_equal(m, &a, &b);
    assert_memory_equal(la, lb, (size_t)V * sizeof(float));
    /* and the chunked form did run: token by token the state's bits differ */
    tgt_state c;
    assert_int_equal(tgt_set_delta_chunk(gd.m, 0), TD_OK);
    assert_int_equal(tgt_state_init(&c, m, T), TD_OK);
    assert_int_equal(tgt_forward(m, &c, gd.tokens, T, false, NULL), TD_OK);
    size_t ns = (size_t)(m->hp.n_v_head * m->hp.d_k * m->hp.d_v) * sizeof(float);
    assert_memory_not_equal(a.ssm[0], c.ssm[0], ns);
    tgt_state_free(&a), tgt_state_free(&b), tgt_state_free(&c);
    free(la), free(lb);
    model_close(&gd);
}

static void test_target_rejects_bad_tokens_and_full_context(void **ctx)
{
    (void)ctx;
    golden gd;
    model_open(&gd, "qwen3-tiny-f32");
    tgt_state st;
    assert_int_equal(tgt_state_init(&st, gd.m, 4), TD_OK);
    int32_t bad[2] = {1, (int32_t)gd.m->hp.n_vocab};
    assert_int_equal(tgt_forward(gd.m, &st, bad, 2, false, NULL), TD_ERANGE);
    assert_non_null(strstr(err_msg(), "token"));
    assert_int_equal(st.n_past, 0);
    assert_int_equal(tgt_forward(gd.m, &st, gd.tokens, 5, false, NULL), TD_ERANGE);
    assert_non_null(strstr(err_msg(), "context full"));
    assert_int_equal(tgt_forward(gd.m, &st, gd.tokens, 4, false, NULL), TD_OK);
    assert_int_equal(st.n_past, 4);
    tgt_state_free(&st);
    model_close(&gd);
}

/* A model file with a tensor of the wrong shape is refused with the tensor's name. */
static void test_target_load_names_missing_or_misshaped_tensor(void **ctx)
{
    (void)ctx;
    gguf_file *g;
    assert_int_equal(gguf_open(&g, "tests/data/models/qwen3-tiny-f32.gguf"), TD_OK);
    gguf_writer *w = gguf_writer_new();
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        if (kv->value.type == GGUF_TYPE_STRING) {
            char *s = strndup(kv->value.str.ptr, kv->value.str.len);
            gguf_writer_set_str(w, key, s);
            free(s);
        } else if (kv->value.type == GGUF_TYPE_UINT32) {
            gguf_writer_set_u32(w, key, (uint32_t)kv->value.u64);
        } else if (kv->value.type == GGUF_TYPE_FLOAT32) {
            gguf_writer_set_f32(w, key, (float)kv->value.f64);
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (!strcmp(t->name, "blk.1.attn_k.weight")) {
            int64_t ne[2] = {t->ne[0], t->ne[1] / 2}; /* half the rows */
            assert_int_equal(gguf_writer_add_tensor(w, t->name, t->type, 2, ne, t->data, t->size / 2), TD_OK);
            continue;
        }
        assert_int_equal(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->size), TD_OK);
    }
    char path[] = "/tmp/tandem-target-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(gguf_writer_write(w, path), TD_OK);
    gguf_writer_free(w);
    gguf_close(g);
    tgt_model *m = NULL;
    assert_int_equal(tgt_load(&m, path), TD_EFORMAT);
    assert_null(m);
    assert_non_null(strstr(err_msg(), "blk.1.attn_k.weight"));
    assert_non_null(strstr(err_msg(), "shape"));
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_target_logits_and_hidden_match_transformers),
        cmocka_unit_test(test_target_two_chunks_match_cached_state),
        cmocka_unit_test(test_target_keep_after_block_equals_running_fewer_tokens),
        cmocka_unit_test(test_target_reset_equals_fresh_state),
        cmocka_unit_test(test_target_chunked_prefill_cut_at_chunk_end_equals_whole),
        cmocka_unit_test(test_target_rejects_bad_tokens_and_full_context),
        cmocka_unit_test(test_target_load_names_missing_or_misshaped_tensor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
