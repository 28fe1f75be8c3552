/* The target's forward passes as CUDA graphs (verifyd/target_graph.c): a replay gives the
 * same bits as running the ops one by one, for decode steps, a recorded 16-token verify with
 * taps, the rollback after it and decoding after that; a pass is recorded the second time it
 * comes (the first runs op by op), one recording serves every decode step of a sequence, and
 * a new state gets its own. Skipped (77) without a CUDA device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/backend.h"
#include "kernels/cuda_mem.h"
#include "verifyd/target.h"
#include "verifyd/target_int.h"

static ops_backend *gpu;

static float *dev_floats(int64_t n)
{
    float *p = NULL;
    assert_int_equal(gpu->alloc(gpu, (void **)&p, (size_t)n * sizeof(float)), TD_OK);
    assert_int_equal(gpu->zero(gpu, p, (size_t)n * sizeof(float)), TD_OK);
    return p;
}

/* n floats at a and b (device) are the same bits */
static void expect_same(const char *what, const float *a, const float *b, int64_t n)
{
    float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    assert_int_equal(gpu->to_host(gpu, x, a, (size_t)n * sizeof(float)), TD_OK);
    assert_int_equal(gpu->to_host(gpu, y, b, (size_t)n * sizeof(float)), TD_OK);
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&x[i], &y[i], sizeof(float)))
            fail_msg("%s: element %lld differs: graph %.9g, direct %.9g", what, (long long)i,
                     x[i], y[i]);
    free(x);
    free(y);
}

/* One forward on each state: a as a graph replay, b op by op; their outputs compared. */
static void step_both(tgt_model *m, tgt_state *a, tgt_state *b, const int32_t *toks, int64_t n,
                      bool record, tgt_out *oa, tgt_out *ob, const char *what)
{
    m->use_graphs = true;
    if (tgt_forward(m, a, toks, n, record, oa) != TD_OK)
        fail_msg("%s (graph): %s", what, err_msg());
    m->use_graphs = false;
    if (tgt_forward(m, b, toks, n, record, ob) != TD_OK)
        fail_msg("%s (direct): %s", what, err_msg());
    int64_t rows = oa->last_only ? 1 : n;
    expect_same(what, oa->logits, ob->logits, rows * m->hp.n_vocab);
    if (oa->n_taps)
        expect_same(what, oa->tap_out, ob->tap_out, n * oa->n_taps * m->hp.n_embd);
}

static void test_graph_replay_equals_direct_run(void **ctx)
{
    (void)ctx;
    static const char *const names[] = {"qwen35-tiny-f32", "qwen3-tied-q4_k_m"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        char path[256];
        snprintf(path, sizeof path, "tests/data/models/%s.gguf", names[k]);
        tgt_model *m = NULL;
        if (tgt_load_on(&m, path, gpu) != TD_OK)
            fail_msg("%s: %s", path, err_msg());
        assert_true(m->use_graphs); /* on by default on the GPU */
        int64_t V = m->hp.n_vocab, D = m->hp.n_embd;
        int32_t toks[40], taps[2] = {0, (int32_t)m->hp.n_layer - 1};
        for (int i = 0; i < 40; i++)
            toks[i] = (int32_t)((i * 53 + 7) % V);
        tgt_state a, b;
        assert_int_equal(tgt_state_init(&a, m, 64), TD_OK);
        assert_int_equal(tgt_state_init(&b, m, 64), TD_OK);
        float *la = dev_floats(16 * V), *lb = dev_floats(16 * V);
        float *ta = dev_floats(16 * 2 * D), *tb = dev_floats(16 * 2 * D);
        tgt_out last_a = {.logits = la, .last_only = true}, last_b = {.logits = lb, .last_only = true};
        tgt_graph_counts c;

        /* a pass is recorded the second time it comes: the prefill (once) runs op by op,
         * the first decode step too, the second is recorded and the rest replay it */
        step_both(m, &a, &b, toks, 8, false, &last_a, &last_b, "prefill of 8");
        tgt_graph_stats(m, &c);
        assert_int_equal(c.recorded, 0);
        assert_int_equal(c.direct, 1);
        for (int i = 0; i < 5; i++)
            step_both(m, &a, &b, toks + 8 + i, 1, false, &last_a, &last_b, "decode step");
        tgt_graph_stats(m, &c);
        const uint64_t work_gen = tgt_work_gen(m);
        assert_int_equal(c.direct, 2);
        assert_int_equal(c.recorded, 1); /* one recording for the last four decode steps */
        assert_int_equal(c.replayed, 4);

        /* two verify blocks with taps and a rollback after each: the second one recorded */
        tgt_out va = {.logits = la, .taps = taps, .n_taps = 2, .tap_out = ta};
        tgt_out vb = {.logits = lb, .taps = taps, .n_taps = 2, .tap_out = tb};
        for (int r = 0; r < 2; r++) {
            step_both(m, &a, &b, toks + 13 + 5 * r, 16, true, &va, &vb,
                      r ? "verify of 16 with taps (recorded)" : "verify of 16 with taps");
            assert_int_equal(tgt_state_keep(m, &a, 5), TD_OK);
            assert_int_equal(tgt_state_keep(m, &b, 5), TD_OK);
        }
        tgt_graph_stats(m, &c);
        assert_int_equal(c.direct, 3);
        assert_int_equal(c.recorded, 2);
        assert_int_equal(c.replayed, 5);
        /* the first recorded forward made the state's rollback record (new arrays: a new
         * state gen), so the decode passes after it are new ones: op by op, recorded, then
         * replayed; the scratch, made for 64 tokens at load, did not move */
        assert_true(tgt_work_gen(m) == work_gen);
        for (int i = 0; i < 5; i++)
            step_both(m, &a, &b, toks + 30 + i, 1, false, &last_a, &last_b,
                      "decode step after a rollback");
        tgt_graph_stats(m, &c);
        assert_int_equal(c.direct, 4);
        assert_int_equal(c.recorded, 3);
        assert_int_equal(c.replayed, 9);

        /* a new state (new arrays) gets a recording of its own and the same bits */
        tgt_state c1, d1;
        assert_int_equal(tgt_state_init(&c1, m, 64), TD_OK);
        assert_int_equal(tgt_state_init(&d1, m, 64), TD_OK);
        for (int r = 0; r < 2; r++) {
            m->use_graphs = true;
            assert_int_equal(tgt_forward(m, &c1, toks + 8 * r, 8, false, &last_a), TD_OK);
            m->use_graphs = false;
            assert_int_equal(tgt_forward(m, &d1, toks + 8 * r, 8, false, &last_b), TD_OK);
            expect_same("a new state", la, lb, V);
        }
        tgt_graph_stats(m, &c);
        assert_int_equal(c.direct, 5);
        assert_int_equal(c.recorded, 4);
        assert_int_equal(c.replayed, 10);

        gpu->release(gpu, la);
        gpu->release(gpu, lb);
        gpu->release(gpu, ta);
        gpu->release(gpu, tb);
        tgt_state_free(&a);
        tgt_state_free(&b);
        tgt_state_free(&c1);
        tgt_state_free(&d1);
        tgt_free(m);
    }
}

int main(void)
{
    unsetenv("TANDEM_GRAPHS");
    unsetenv("TANDEM_PROFILE"); /* a profiler has no graphs */
    if (!cuda_available() || ops_backend_cuda_init(&gpu, 0) != TD_OK) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graph_replay_equals_direct_run),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ops_backend_cuda_free(gpu);
    return rc;
}
