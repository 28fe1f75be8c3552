/* Speculative decoding is lossless: greedy output with a DFlash drafter equals plain greedy
 * decoding for many prompts, lengths, block sizes and drafter shapes (full and sliding
 * layers), including drafters that get long runs accepted; sampled output keeps the
 * target's distribution (chi-square test). Drafters are written here as real checkpoints
 * (config.json + bf16 model.safetensors) for the tiny qwen35 test model. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/support/chi_square.h"
#include "tests/support/model_fixture.h"
#include "tests/support/tmp_dir.h"
#include "verifyd/spec.h"

#define MODEL_PATH "tests/data/models/qwen35-tiny-f32.gguf"

static uint64_t rng_state;

static float rng_uniform(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / (float)0x1000000;
}

static char tmpdir[64];

/* Generates n tokens after prompt, verifying at most draft_max drafts per step (0: the
 * drafter's whole block), each step's block picked by measured cost and acceptance when
 * draft_auto; returns the stats. */
static spec_stats generate_max(const tgt_model *tm, const dfl_model *dm, const int32_t *prompt,
                               int64_t n_prompt, int64_t n, const ops_sampler *smp,
                               int64_t draft_max, bool draft_auto, int32_t *out)
{
    const spec_cfg cfg = {.dm = dm, .n_ctx = 256, .block = 1, .draft_max = draft_max,
                          .draft_auto = draft_auto, .sampler = *smp};
    spec_stats st;
    if (mf_generate(tm, &cfg, prompt, n_prompt, n, out, &st) != TD_OK)
        fail_msg("generate: %s", err_msg());
    return st;
}

static spec_stats generate(const tgt_model *tm, const dfl_model *dm, const int32_t *prompt,
                           int64_t n_prompt, int64_t n, const ops_sampler *smp, int32_t *out)
{
    return generate_max(tm, dm, prompt, n_prompt, n, smp, 0, false, out);
}

static int setup_dir(void **ctx)
{
    (void)ctx;
    return tmp_dir_make(tmpdir, sizeof tmpdir, "tandem-spec") ? 0 : -1;
}

static int remove_dir(void **ctx)
{
    (void)ctx;
    return tmp_dir_remove(tmpdir) ? 0 : -1;
}

static void test_spec_greedy_equals_plain_for_many_prompts_and_blocks(void **ctx)
{
    (void)ctx;
    tgt_model *tm;
    assert_int_equal(tgt_load(&tm, MODEL_PATH), TD_OK);
    const mf_drafter shapes[] = {
        {2, 1, false, 7, false}, {4, 2, false, 11, true}, {8, 1, false, 3, false},
        {16, 2, false, 5, true}, {16, 3, false, 500, false},
    };
    ops_sampler greedy = {0};
    int64_t n = 48, total_acc = 0, runs = 0;
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        char name[32];
        snprintf(name, sizeof name, "d%zu", k);
        dfl_model *dm = mf_drafter_in(tmpdir, name, tm, &shapes[k], 1000 + k);
        for (int p = 0; p < 6; p++) {
            int32_t prompt[32], a[64], b[64];
            int64_t np = 2 + (p * 5) % 19;
            rng_state = 77 + (uint64_t)p;
            for (int64_t i = 0; i < np; i++)
                prompt[i] = (int32_t)(rng_uniform() * (float)tm->hp.n_vocab);
            generate(tm, NULL, prompt, np, n, &greedy, a);
            spec_stats st = generate(tm, dm, prompt, np, n, &greedy, b);
            for (int64_t i = 0; i < n; i++)
                if (a[i] != b[i])
                    fail_msg("drafter %zu prompt %d: token %lld differs (plain %d, speculative %d)",
                             k, p, (long long)i, a[i], b[i]);
            total_acc += st.accepted;
            runs++;
        }
        dfl_free(dm);
    }
    assert_true(runs == 30);
    (void)total_acc;
    tgt_free(tm);
}

/* A drafter whose layers add nothing proposes the same token t in every slot (the LM head of
 * its mask embedding). Against targets that repeat t more or less readily, steps accept
 * nothing, part of the block, or all of it; the output always equals plain decoding. Capped
 * at 3 drafts per step (spec_cfg.draft_max, verifyd --draft-max) the same: no step commits
 * more than 4 tokens, and some commit all 4. With --draft-auto's picked blocks, also capped
 * at 5, the same output. */
static void test_spec_partial_and_full_accepts_stay_lossless(void **ctx)
{
    (void)ctx;
    const int32_t x = 279;
    const float scales[] = {1.5f, 2.0f, 3.0f, 5.0f, 20.0f};
    int64_t hist[9] = {0}, capped[9] = {0}, n = 60;
    ops_sampler greedy = {0};
    for (size_t k = 0; k < sizeof scales / sizeof *scales; k++) {
        char path[160];
        snprintf(path, sizeof path, "%s/scaled%zu.gguf", tmpdir, k);
        if (mf_target_write_scaled(path, MODEL_PATH, x, scales[k]) != TD_OK)
            fail_msg("%s: %s", path, err_msg());
        tgt_model *tm;
        if (tgt_load(&tm, path) != TD_OK)
            fail_msg("%s: %s", path, err_msg());
        mf_drafter ds = {8, 1, true, (uint32_t)x, false};
        char name[32];
        snprintf(name, sizeof name, "silent%zu", k);
        dfl_model *dm = mf_drafter_in(tmpdir, name, tm, &ds, 9);
        for (int p = 0; p < 3; p++) {
            int32_t prompt[4] = {10 + p, 20, x, 40 + p}, plain[64], spec[64];
            generate(tm, NULL, prompt, 4, n, &greedy, plain);
            spec_stats st = generate(tm, dm, prompt, 4, n, &greedy, spec);
            for (int64_t i = 0; i < n; i++)
                if (plain[i] != spec[i])
                    fail_msg("scale %g prompt %d: token %lld differs (plain %d, speculative %d)",
                             scales[k], p, (long long)i, plain[i], spec[i]);
            for (int a = 1; a <= 8; a++)
                hist[a] += st.accept_hist[a];
            st = generate_max(tm, dm, prompt, 4, n, &greedy, 3, false, spec);
            for (int64_t i = 0; i < n; i++)
                if (plain[i] != spec[i])
                    fail_msg("scale %g prompt %d, 3 drafts a step: token %lld differs (plain %d, "
                             "speculative %d)",
                             scales[k], p, (long long)i, plain[i], spec[i]);
            assert_int_equal(st.drafted, 3 * st.steps);
            for (int a = 1; a <= 8; a++)
                capped[a] += st.accept_hist[a];
            /* blocks picked step by step (their sizes follow timing, the output must not) */
            st = generate_max(tm, dm, prompt, 4, n, &greedy, p == 2 ? 5 : 0, true, spec);
            for (int64_t i = 0; i < n; i++)
                if (plain[i] != spec[i])
                    fail_msg("scale %g prompt %d, picked blocks: token %lld differs (plain %d, "
                             "speculative %d)",
                             scales[k], p, (long long)i, plain[i], spec[i]);
            if (p == 2)
                assert_true(st.accept_hist[7] == 0 && st.accept_hist[8] == 0);
        }
        dfl_free(dm);
        tgt_free(tm);
    }
    int64_t partial = 0;
    for (int a = 2; a <= 7; a++)
        partial += hist[a];
    if (!(hist[1] > 0 && partial > 0 && hist[8] > 0))
        fail_msg("accept lengths not all exercised: 1:%lld 2..7:%lld 8:%lld", (long long)hist[1],
                 (long long)partial, (long long)hist[8]);
    assert_true(capped[1] > 0 && capped[4] > 0);
    for (int a = 5; a <= 8; a++)
        assert_int_equal(capped[a], 0);
}

/* Sampling at temperature 0.7 with top-k 12: the token after the first one, over many seeds,
 * follows the target's own distribution p(t2 | prompt, t1) whether or not a drafter is used
 * (chi-square, p > 1e-4 for both, on the most frequent t1). */
static void test_spec_sampling_keeps_target_distribution(void **ctx)
{
    (void)ctx;
    tgt_model *tm;
    assert_int_equal(tgt_load(&tm, MODEL_PATH), TD_OK);
    int64_t V = tm->hp.n_vocab;
    mf_drafter ds = {4, 1, false, 5, false};
    dfl_model *dm = mf_drafter_in(tmpdir, "sampling", tm, &ds, 4242);
    int32_t prompt[3] = {100, 200, 300};
    const int runs = 2000;
    int *t1 = calloc((size_t)runs, sizeof *t1), *t2 = calloc((size_t)runs, sizeof *t2);
    int *c1 = calloc((size_t)V, sizeof *c1);
    for (int with = 0; with < 2; with++) {
        memset(c1, 0, (size_t)V * sizeof *c1);
        for (int r = 0; r < runs; r++) {
            ops_sampler smp = {.temperature = 0.7f, .top_k = 12, .top_p = 1.0f, .seed = (uint64_t)r * 7919 + 1};
            int32_t out[2];
            generate(tm, with ? dm : NULL, prompt, 3, 2, &smp, out);
            t1[r] = out[0];
            t2[r] = out[1];
            c1[out[0]]++;
        }
        int32_t best = 0;
        for (int64_t i = 0; i < V; i++)
            if (c1[i] > c1[best])
                best = (int32_t)i;
        /* the target's p(t2 | prompt, best) under the same sampler settings */
        tgt_state st;
        assert_int_equal(tgt_state_init(&st, tm, 8), TD_OK);
        int32_t ctx4[4] = {100, 200, 300, best};
        float *lg = malloc((size_t)V * sizeof(float));
        double *p = malloc((size_t)V * sizeof(double));
        float *pf = malloc((size_t)V * sizeof(float));
        tgt_out o = {.logits = lg, .last_only = true};
        assert_int_equal(tgt_forward(tm, &st, ctx4, 4, false, &o), TD_OK);
        ops_sampler smp = {.temperature = 0.7f, .top_k = 12, .top_p = 1.0f};
        assert_int_equal(cpu_sample_probs(pf, lg, V, &smp), TD_OK);
        for (int64_t i = 0; i < V; i++)
            p[i] = pf[i];
        int *c2 = calloc((size_t)V, sizeof *c2), total = 0;
        for (int r = 0; r < runs; r++)
            if (t1[r] == best) {
                c2[t2[r]]++;
                total++;
            }
        assert_true(total >= 200);
        double pv = chi_square_p(c2, p, V, total);
        if (!(pv > 1e-4))
            fail_msg("%s drafter: p-value %.3g for the second token's distribution", with ? "with" : "without", pv);
        free(c2);
        free(lg);
        free(p);
        free(pf);
        tgt_state_free(&st);
    }
    free(t1);
    free(t2);
    free(c1);
    dfl_free(dm);
    tgt_free(tm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_greedy_equals_plain_for_many_prompts_and_blocks),
        cmocka_unit_test(test_spec_partial_and_full_accepts_stay_lossless),
        cmocka_unit_test(test_spec_sampling_keeps_target_distribution),
    };
    return cmocka_run_group_tests(tests, setup_dir, remove_dir);
}
