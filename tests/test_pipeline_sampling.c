/* Sampling through the real processes: with the same seed, verifyd + draftd draw exactly the
 * tokens of the in-process speculative loop (whose output keeps the target's distribution,
 * test_spec_lossless), step for step; and over many seeds the second token's distribution
 * matches the target's own p(t2 | prompt, t1) (chi-square). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/chi_square.h"
#include "tests/support/model_fixture.h"
#include "tests/support/pipeline.h"
#include "verifyd/spec.h"

#define N_CTX 256
#define WAIT_MS 120000

static pipeline pl;
static tgt_model *tm;
static dfl_model *dm;
static uint64_t next_seq = 1;

static int setup(void **ctx)
{
    (void)ctx;
    int rc = pl_setup(&pl);
    if (rc != 0)
        return rc == 77 ? (exit(77), -1) : -1;
    char model[PL_PATH_MAX], draft[PL_PATH_MAX];
    mf_drafter rnd = {8, 2, false, PL_REPEAT_TOKEN, false};
    if (pl_write_pair(&pl, 2.0f, &rnd, 4242, "random", model, draft, &tm) != TD_OK ||
        dfl_load(&dm, draft, (uint32_t)tm->hp.n_layer, &tm->tok_embd, &tm->output) != TD_OK)
        return -1;
    const char *kvd_args[] = {"--slots", "16", NULL};
    const char *vd_args[] = {"--model", model, "--draft", draft, "--ctx", "256",
                             "--draft-timeout-ms", "30000", NULL};
    const char *dd_args[] = {"--model", model, "--draft", draft, NULL};
    return pl_start_all(&pl, kvd_args, vd_args, dd_args) == TD_OK ? 0 : -1;
}

static int teardown(void **ctx)
{
    (void)ctx;
    dfl_free(dm);
    tgt_free(tm);
    return pl_teardown(&pl) == 0 ? 0 : -1;
}

static msg_sampler to_msg(const ops_sampler *s)
{
    return (msg_sampler){.temperature = s->temperature, .top_k = (uint32_t)s->top_k,
                         .top_p = s->top_p, .min_p = s->min_p, .seed = s->seed};
}

static uint64_t start(const uint32_t *p, uint32_t n, uint32_t max_tokens, const ops_sampler *s)
{
    msg_gen_start g = {.seq_id = next_seq++, .prompt = p, .n_prompt = n,
                       .max_tokens = max_tokens, .sampler = to_msg(s), .ignore_eos = true};
    if (pl_gen(&pl, &g) != TD_OK) {
        pl_dump_logs(&pl);
        fail_msg("gen_start: %s", err_msg());
    }
    return g.seq_id;
}

static pl_result *wait_done(uint64_t id)
{
    pl_result *r = pl_wait(&pl, id, WAIT_MS);
    if (!r) {
        pl_dump_logs(&pl);
        fail_msg("sequence %llu did not finish", (unsigned long long)id);
    }
    return r;
}

static void test_sampled_tokens_equal_the_in_process_loop_for_each_seed(void **ctx)
{
    (void)ctx;
    enum { GEN = 60, SEEDS = 8 };
    uint32_t p[6] = {3, 279, 17, 279, 99, 5};
    int32_t ip[6] = {3, 279, 17, 279, 99, 5};
    uint64_t ids[SEEDS];
    ops_sampler smp[SEEDS];
    for (int k = 0; k < SEEDS; k++) {
        smp[k] = (ops_sampler){.temperature = 0.8f, .top_k = k % 2 ? 40 : 0,
                               .top_p = k % 3 ? 0.95f : 1.0f, .min_p = k == 5 ? 0.05f : 0.0f,
                               .seed = 1000 + (uint64_t)k};
        ids[k] = start(p, 6, GEN, &smp[k]);
    }
    int64_t accepted = 0;
    for (int k = 0; k < SEEDS; k++) {
        int32_t want[GEN];
        const spec_cfg cfg = {.dm = dm, .n_ctx = N_CTX, .ring = N_CTX, .block = 1,
                              .sampler = smp[k]};
        spec_stats st;
        if (mf_generate(tm, &cfg, ip, 6, GEN, want, &st) != TD_OK)
            fail_msg("seed %d: in-process loop: %s", k, err_msg());
        pl_result *r = wait_done(ids[k]);
        assert_int_equal(r->n_tokens, GEN);
        if (memcmp(r->tokens, want, sizeof want) != 0)
            fail_msg("seed %d: the pipeline drew other tokens than the in-process loop", k);
        assert_int_equal(r->usage.steps, st.steps);
        accepted += st.accepted;
    }
    assert_true(accepted > 0); /* some draws were accepted drafts, not only resamples */
}

/* The target's distribution of the token after ctx[n] under s, into pd [n_vocab]. */
static void target_probs(const int32_t *ctx, int64_t n, const ops_sampler *s, double *pd)
{
    const int64_t V = tm->hp.n_vocab;
    tgt_state st;
    assert_int_equal(tgt_state_init(&st, tm, 8), TD_OK);
    float *lg = malloc((size_t)V * sizeof(float)), *pf = malloc((size_t)V * sizeof(float));
    tgt_out o = {.logits = lg, .last_only = true};
    assert_int_equal(tgt_forward(tm, &st, ctx, n, false, &o), TD_OK);
    assert_int_equal(cpu_sample_probs(pf, lg, V, s), TD_OK);
    for (int64_t i = 0; i < V; i++)
        pd[i] = pf[i];
    tgt_state_free(&st);
    free(lg), free(pf);
}

/* 640 seeded runs of two tokens at temperature 0.7, top_k 12 (with the prediction {first
 * token's mode, the second's mode} when predicted): the second token, where the first is the
 * mode, follows the target's distribution. With the prediction that second token is a draft
 * the target accepts with its probability (one-hot proposal) or replaces from the rest. */
static void second_token_follows_the_target(bool predicted)
{
    enum { RUNS = 640, BATCH = 32 };
    const int64_t V = tm->hp.n_vocab;
    uint32_t p[3] = {100, 200, 300};
    const ops_sampler smp = {.temperature = 0.7f, .top_k = 12, .top_p = 1.0f};
    double *p1 = malloc((size_t)V * sizeof(double)), *p2 = malloc((size_t)V * sizeof(double));
    int32_t ctx4[4] = {100, 200, 300, 0};
    target_probs(ctx4, 3, &smp, p1);
    for (int64_t i = 0; i < V; i++)
        ctx4[3] = p1[i] > p1[ctx4[3]] ? (int32_t)i : ctx4[3];
    const int32_t best = ctx4[3];
    target_probs(ctx4, 4, &smp, p2);
    uint32_t pred[2] = {(uint32_t)best, 0};
    for (int64_t i = 0; i < V; i++)
        pred[1] = p2[i] > p2[pred[1]] ? (uint32_t)i : pred[1];
    int *c2 = calloc((size_t)V, sizeof *c2);
    int total = 0, taken = 0;
    for (int at = 0; at < RUNS; at += BATCH) {
        uint64_t ids[BATCH];
        for (int r = 0; r < BATCH; r++) {
            ops_sampler s = smp;
            s.seed = (uint64_t)(at + r) * 7919 + 1;
            msg_gen_start g = {.seq_id = next_seq++, .prompt = p, .n_prompt = 3, .max_tokens = 2,
                               .sampler = to_msg(&s), .ignore_eos = true,
                               .predict = predicted ? pred : NULL, .n_predict = predicted ? 2 : 0};
            if (pl_gen(&pl, &g) != TD_OK)
                fail_msg("gen_start: %s", err_msg());
            ids[r] = g.seq_id;
        }
        for (int r = 0; r < BATCH; r++) {
            pl_result *res = wait_done(ids[r]);
            assert_int_equal(res->n_tokens, 2);
            if (res->usage.predicted_tokens) { /* the draft was the second token */
                assert_int_equal(res->tokens[0], best);
                assert_int_equal(res->tokens[1], pred[1]);
                taken++;
            }
            if (res->tokens[0] == best) {
                c2[res->tokens[1]]++;
                total++;
            }
        }
    }
    assert_true(total >= 100);
    assert_true(predicted ? taken > 0 && taken < total : taken == 0);
    double pv = chi_square_p(c2, p2, V, total);
    if (!(pv > 1e-4))
        fail_msg("p-value %.3g for the second token over %d runs", pv, total);
    free(p1), free(p2), free(c2);
}

static void test_the_second_token_follows_the_targets_distribution(void **ctx)
{
    (void)ctx;
    second_token_follows_the_target(false);
}

static void test_a_predicted_second_token_keeps_the_targets_distribution(void **ctx)
{
    (void)ctx;
    second_token_follows_the_target(true);
}

int main(void)
{
    /* One thread per process: three daemons and this test share CI's two cores. */
    omp_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sampled_tokens_equal_the_in_process_loop_for_each_seed),
        cmocka_unit_test(test_the_second_token_follows_the_targets_distribution),
        cmocka_unit_test(test_a_predicted_second_token_keeps_the_targets_distribution),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
