/* Sampled speculative acceptance on the CPU (cpu_accept_sampled, the backend's
 * accept_sampled): crafted blocks whose decision is certain whatever the random numbers
 * (full accept, a rejection at each position, a zero residual falling back to p, q(d) == 0
 * rejecting, a draft outside the vocabulary), and random blocks against the rule written out
 * inline here as verifyd ran it before it moved into the backend. */
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

#define V 8
#define ROLES 4 /* counters per position, as draftd's dfl_rng_ctr */

static const ops_sampler plain = {.temperature = 1, .top_p = 1, .seed = 99};

/* The counters of a block whose first token sits at position L (dfl_rng_ctr's layout). */
static ops_accept_rng rng_at(int64_t L)
{
    return (ops_accept_rng){.accept = (uint64_t)L * ROLES + 1, .target = (uint64_t)L * ROLES,
                            .step = ROLES};
}

/* A row of logits whose distribution is one-hot at tok (every other logit -inf). */
static void one_hot_logits(float *row, int tok)
{
    for (int j = 0; j < V; j++)
        row[j] = j == tok ? 1.0f : -INFINITY;
}

static void one_hot(float *row, int tok)
{
    for (int j = 0; j < V; j++)
        row[j] = j == tok ? 1.0f : 0.0f;
}

static void run(const float *logits, const float *q, const int32_t *draft, int64_t n,
                const ops_sampler *s, int32_t res[2])
{
    float p[16 * V];
    const ops_backend *be = ops_backend_cpu();
    ops_accept_rng rng = rng_at(40);
    assert_int_equal(be->accept_sampled(be, res, p, logits, q, draft, n, V, s, &rng), TD_OK);
}

/* Every draft certain to pass (q == p, so u * q < p for any u < 1): a = n - 1 and next is
 * the last row's only token. */
static void test_accept_sampled_full_accept_draws_bonus_from_last_row(void **state)
{
    (void)state;
    enum { N = 6 };
    float logits[N * V], q[(N - 1) * V];
    int32_t draft[N - 1], res[2];
    for (int i = 0; i < N; i++)
        one_hot_logits(logits + i * V, (3 * i + 1) % V);
    for (int i = 1; i < N; i++) {
        draft[i - 1] = (3 * (i - 1) + 1) % V;
        one_hot(q + (i - 1) * V, draft[i - 1]);
    }
    run(logits, q, draft, N, &plain, res);
    assert_int_equal(res[0], N - 1);
    assert_int_equal(res[1], (3 * (N - 1) + 1) % V);
}

/* Drafts before k are certain to pass; draft k has p(d) = 0: a = k - 1 and next comes from
 * the residual, here one-hot at the target's token. */
static void test_accept_sampled_rejects_at_each_position_and_draws_residual(void **state)
{
    (void)state;
    enum { N = 9 };
    for (int k = 1; k < N; k++) {
        float logits[N * V], q[(N - 1) * V];
        int32_t draft[N - 1], res[2];
        for (int i = 0; i < N; i++)
            one_hot_logits(logits + i * V, (i + 2) % V);
        for (int i = 1; i < N; i++) {
            draft[i - 1] = i == k ? (i + 4) % V : (i + 1) % V; /* row i-1's token: i+1 */
            one_hot(q + (i - 1) * V, draft[i - 1]);
        }
        run(logits, q, draft, N, &plain, res);
        assert_int_equal(res[0], k - 1);
        assert_int_equal(res[1], (k + 1) % V);
    }
}

/* q = 2p: the draft passes only when u < 1/2, and the residual max(p - 2p, 0) is all zero,
 * so after a rejection next comes from p itself. A seed whose test number is >= 1/2. */
static void test_accept_sampled_zero_residual_falls_back_to_p(void **state)
{
    (void)state;
    ops_sampler s = plain;
    ops_accept_rng rng = rng_at(40);
    while (ops_rand_uniform(s.seed, rng.accept + rng.step) < 0.5)
        s.seed++;
    float logits[2 * V], q[V];
    for (int j = 0; j < V; j++) /* p: 1/2 at tokens 2 and 6 */
        logits[j] = j == 2 || j == 6 ? 0.0f : -INFINITY;
    one_hot_logits(logits + V, 0);
    for (int j = 0; j < V; j++)
        q[j] = j == 2 || j == 6 ? 1.0f : 0.0f;
    int32_t draft[1] = {6}, res[2];
    run(logits, q, draft, 2, &s, res);
    assert_int_equal(res[0], 0);
    float p[V];
    assert_int_equal(cpu_sample_probs(p, logits, V, &s), TD_OK);
    assert_true(p[2] == 0.5f && p[6] == 0.5f);
    const int32_t want = cpu_sample_draw(p, V, s.seed, rng.target + rng.step);
    assert_true(want == 2 || want == 6);
    assert_int_equal(res[1], want);
    /* with a seed whose number is below 1/2 the same draft passes */
    s.seed = plain.seed;
    while (ops_rand_uniform(s.seed, rng.accept + rng.step) >= 0.5)
        s.seed++;
    run(logits, q, draft, 2, &s, res);
    assert_int_equal(res[0], 1);
    assert_int_equal(res[1], 0);
}

/* q(d) == 0 rejects even a draft the target is sure of; the residual p - q is then p at d,
 * so next is d itself. A draft outside the vocabulary is rejected the same way. */
static void test_accept_sampled_rejects_draft_with_zero_q_or_outside_vocabulary(void **state)
{
    (void)state;
    float logits[2 * V], q[V];
    one_hot_logits(logits, 5);
    one_hot_logits(logits + V, 1);
    one_hot(q, 3);
    int32_t draft[1] = {5}, res[2];
    run(logits, q, draft, 2, &plain, res);
    assert_int_equal(res[0], 0);
    assert_int_equal(res[1], 5);
    static const int32_t bad[] = {-1, V, INT32_MAX};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        one_hot(q, 5);
        draft[0] = bad[b];
        run(logits, q, draft, 2, &plain, res);
        assert_int_equal(res[0], 0);
        assert_int_equal(res[1], 5); /* residual p - q is all zero: a draw from p */
    }
}

/* A block of one token is a plain draw at the counter of position L + 1; a row the walk
 * reaches without a finite logit is TD_EINVAL. */
static void test_accept_sampled_single_token_and_bad_logits(void **state)
{
    (void)state;
    float logits[2 * V], p[2 * V];
    for (int j = 0; j < V; j++)
        logits[j] = (float)j * 0.25f;
    int32_t res[2];
    run(logits, NULL, NULL, 1, &plain, res);
    float want_p[V];
    assert_int_equal(cpu_sample_probs(want_p, logits, V, &plain), TD_OK);
    ops_accept_rng rng = rng_at(40);
    assert_int_equal(res[0], 0);
    assert_int_equal(res[1], cpu_sample_draw(want_p, V, plain.seed, rng.target + rng.step));
    for (int j = 0; j < 2 * V; j++)
        logits[j] = NAN;
    float q[V];
    one_hot(q, 0);
    int32_t draft[1] = {0};
    assert_int_equal(cpu_accept_sampled(res, p, logits, q, draft, 2, V, &plain, &rng),
                     TD_EINVAL);
}

/* --- random blocks against the inline rule ------------------------------------------------ */

static uint64_t rng_state;
static double rnd(void) /* uniform in [0, 1) */
{
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * 0x1p-53;
}

/* The rule as verifyd's loop wrote it inline, with counters dfl_rng_ctr(L + i, role). */
static void reference(const float *logits, const int32_t *block, int64_t B, int64_t n_vocab,
                      int64_t L, const float *qs, const ops_sampler *smp, int32_t *next,
                      int64_t *acc)
{
    float *p = malloc((size_t)n_vocab * sizeof *p);
    uint64_t seed = smp->seed;
    for (int64_t i = 1; i < B; i++) {
        assert_int_equal(cpu_sample_probs(p, logits + (i - 1) * n_vocab, n_vocab, smp), TD_OK);
        const float *q = qs + (i - 1) * n_vocab;
        int32_t d = block[i];
        double u = ops_rand_uniform(seed, (uint64_t)(L + i) * ROLES + 1);
        if (q[d] > 0.0f && u * (double)q[d] < (double)p[d])
            continue;
        double sum = 0;
        for (int64_t j = 0; j < n_vocab; j++) {
            float r = p[j] - q[j];
            p[j] = r > 0 ? r : 0;
            sum += p[j];
        }
        if (sum <= 0)
            assert_int_equal(cpu_sample_probs(p, logits + (i - 1) * n_vocab, n_vocab, smp),
                             TD_OK);
        *next = cpu_sample_draw(p, n_vocab, seed, (uint64_t)(L + i) * ROLES);
        *acc = i - 1;
        free(p);
        return;
    }
    assert_int_equal(cpu_sample_probs(p, logits + (B - 1) * n_vocab, n_vocab, smp), TD_OK);
    *next = cpu_sample_draw(p, n_vocab, seed, (uint64_t)(L + B) * ROLES);
    *acc = B - 1;
    free(p);
}

static void test_accept_sampled_equals_inline_rule_on_random_blocks(void **state)
{
    (void)state;
    enum { NV = 1000, BMAX = 16 };
    static const ops_sampler smps[] = {
        {.temperature = 0.8f, .top_p = 1, .seed = 1},
        {.temperature = 1.0f, .top_k = 40, .top_p = 1, .seed = 2},
        {.temperature = 1.2f, .top_p = 0.9f, .seed = 3},
        {.temperature = 0.6f, .top_p = 1, .min_p = 0.05f, .seed = 4},
        {.temperature = 1.0f, .top_k = 50, .top_p = 0.8f, .min_p = 0.02f, .seed = 5},
    };
    float *logits = malloc(sizeof(float) * BMAX * NV), *q = malloc(sizeof(float) * BMAX * NV);
    float *p = malloc(sizeof(float) * BMAX * NV), *dl = malloc(sizeof(float) * NV);
    int hist[BMAX + 1] = {0};
    rng_state = 0x9e3779b97f4a7c15ull;
    for (size_t c = 0; c < sizeof smps / sizeof smps[0]; c++)
        for (int trial = 0; trial < 40; trial++) {
            const int64_t B = 2 + trial % (BMAX - 1), L = 7 + trial * 13;
            const float noise = trial % 4 == 0 ? 0.0f : 0.3f * (float)(trial % 4);
            int32_t block[BMAX];
            block[0] = 17;
            for (int64_t i = 0; i < B; i++) {
                float *lg = logits + i * NV;
                for (int64_t j = 0; j < NV; j++) {
                    lg[j] = (float)(8 * rnd() - 4);
                    dl[j] = lg[j] + noise * (float)(2 * rnd() - 1);
                }
                if (i == B - 1)
                    break;
                /* drafts as the drafter draws them, from its own q */
                assert_int_equal(cpu_sample_probs(q + i * NV, dl, NV, &smps[c]), TD_OK);
                block[i + 1] = cpu_sample_draw(q + i * NV, NV, smps[c].seed,
                                               (uint64_t)(L + i + 1) * ROLES + 2);
            }
            int32_t want, res[2];
            int64_t acc;
            reference(logits, block, B, NV, L, q, &smps[c], &want, &acc);
            ops_accept_rng rng = rng_at(L);
            assert_int_equal(cpu_accept_sampled(res, p, logits, q, block + 1, B, NV, &smps[c],
                                                &rng),
                             TD_OK);
            if (res[0] != acc || res[1] != want)
                fail_msg("settings %zu trial %d: {%d, %d}, inline rule {%lld, %d}", c, trial,
                         res[0], res[1], (long long)acc, want);
            hist[acc]++;
        }
    /* the trials reached rejections early and late and full accepts */
    int early = hist[0], mid = 0, full = 0;
    for (int a = 1; a <= BMAX; a++)
        mid += a > 0 && a < 8 ? hist[a] : 0;
    for (int a = 8; a <= BMAX; a++)
        full += hist[a];
    assert_true(early > 0 && mid > 0 && full > 0);
    free(logits);
    free(q);
    free(p);
    free(dl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accept_sampled_full_accept_draws_bonus_from_last_row),
        cmocka_unit_test(test_accept_sampled_rejects_at_each_position_and_draws_residual),
        cmocka_unit_test(test_accept_sampled_zero_residual_falls_back_to_p),
        cmocka_unit_test(test_accept_sampled_rejects_draft_with_zero_q_or_outside_vocabulary),
        cmocka_unit_test(test_accept_sampled_single_token_and_bad_logits),
        cmocka_unit_test(test_accept_sampled_equals_inline_rule_on_random_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
