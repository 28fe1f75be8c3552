/* The sampler: Philox4x32-10 against Random123's known answers; filtered distributions and
 * exact token ids for fixed seeds against an independent numpy/Python reference (golden
 * file); top-k / top-p / min-p keep exactly the expected sets; 20k draws follow p
 * (chi-square); a block's rows drawn at once (cpu_sample_rows) with their own counters; bad
 * settings are errors; log probabilities with the best tokens of each row (cpu_logprob_rows);
 * sparse additions to rows of logits (cpu_logit_add); token masks (cpu_logit_mask). */
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

static void test_philox_matches_random123_known_answers(void **s)
{
    (void)s;
    static const uint32_t kat[3][10] = {
        /* ctr[4], key[2], out[4] from Random123's kat_vectors */
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        ops_philox4x32(kat[i], kat[i] + 4, out);
        for (int j = 0; j < 4; j++)
            assert_int_equal(out[j], kat[i][6 + j]);
    }
    /* seed 0, counter 0 is the all-zero block: the top 53 bits of 0x6627e8d5e169c58d */
    double want = (double)(0x6627e8d5e169c58dull >> 11) * 0x1p-53;
    assert_true(ops_rand_uniform(0, 0) == want);
    double u = ops_rand_uniform(0xDEADBEEFull, 1ull << 40);
    assert_true(u >= 0 && u < 1);
}

static void golden_case(const char *name)
{
    char key[64];
#define K(x) (snprintf(key, sizeof key, "sample.%s.%s", name, x), key)
    const int64_t V = golden_count(G, "sample.logits");
    const float *logits = golden_tensor(G, "sample.logits", TD_F32, V);
    ops_sampler sp = {0};
    sp.temperature = golden_f32(G, K("temperature"));
    sp.top_k = (int32_t)golden_i64(G, K("top_k"));
    sp.top_p = golden_f32(G, K("top_p"));
    sp.min_p = golden_f32(G, K("min_p"));
    assert_int_equal(gguf_get_u64(G, K("seed"), &sp.seed), TD_OK);
    const float *want = golden_tensor(G, K("p"), TD_F32, V);
    const int64_t n_steps = golden_count(G, K("steps"));
    const int64_t *steps = golden_tensor(G, K("steps"), TD_I64, n_steps);
    const int32_t *tokens = golden_tensor(G, K("tokens"), TD_I32, n_steps);

    float *p = malloc((size_t)V * sizeof *p);
    assert_int_equal(cpu_sample_probs(p, logits, V, &sp), TD_OK);
    for (int64_t i = 0; i < V; i++) {
        if ((p[i] > 0) != (want[i] > 0))
            fail_msg("%s: token %lld kept %d, reference kept %d", name, (long long)i,
                     p[i] > 0, want[i] > 0);
        if (fabsf(p[i] - want[i]) > 1e-6f * want[i] + 1e-12f)
            fail_msg("%s: p[%lld] = %.9g, reference %.9g", name, (long long)i, p[i], want[i]);
    }
    for (int64_t j = 0; j < n_steps; j++) {
        int32_t tok = cpu_sample_draw(p, V, sp.seed, (uint64_t)steps[j]);
        if (tok != tokens[j])
            fail_msg("%s: step %lld drew %d, reference %d", name, (long long)steps[j], tok,
                     tokens[j]);
    }
    free(p);
#undef K
}

static void test_sample_plain_softmax_and_draws(void **s)
{
    (void)s;
    golden_case("plain");
}

static void test_sample_temperature(void **s)
{
    (void)s;
    golden_case("temp");
}

static void test_sample_top_k(void **s)
{
    (void)s;
    golden_case("topk");
}

static void test_sample_top_p(void **s)
{
    (void)s;
    golden_case("topp");
}

static void test_sample_min_p(void **s)
{
    (void)s;
    golden_case("minp");
}

static void test_sample_all_filters_together(void **s)
{
    (void)s;
    golden_case("all");
}

static void test_sample_greedy_is_one_hot_argmax(void **s)
{
    (void)s;
    golden_case("greedy");
}

/* Logits log(p) for p = 0.4, 0.3, 0.15, 0.1, 0.05 (ids permuted). */
static const int32_t PERM[5] = {3, 0, 4, 1, 2}; /* PERM[r] = id of the r-th most likely */
static void ladder(float *logits)
{
    const double p[5] = {0.4, 0.3, 0.15, 0.1, 0.05};
    for (int r = 0; r < 5; r++)
        logits[PERM[r]] = (float)log(p[r]);
}

/* Checks that exactly the ranks < n_keep are kept, with renormalised probabilities. */
static void assert_keeps_top(const float *p, int n_keep)
{
    const double pr[5] = {0.4, 0.3, 0.15, 0.1, 0.05};
    double mass = 0;
    for (int r = 0; r < n_keep; r++)
        mass += pr[r];
    for (int r = 0; r < 5; r++) {
        double want = r < n_keep ? pr[r] / mass : 0;
        if (fabs(p[PERM[r]] - want) > 1e-6)
            fail_msg("rank %d (id %d): p %.9g, want %.9g (keep %d)", r, PERM[r], p[PERM[r]],
                     want, n_keep);
    }
}

static void test_filters_keep_exactly_the_expected_sets(void **s)
{
    (void)s;
    float logits[5], p[5];
    ladder(logits);
    struct {
        int32_t top_k;
        float top_p, min_p;
        int keep;
    } cases[] = {
        {0, 1.0f, 0.0f, 5},   {1, 1.0f, 0.0f, 1},   {3, 1.0f, 0.0f, 3},
        {9, 1.0f, 0.0f, 5},   /* top_k above the vocabulary: off */
        {0, 0.65f, 0.0f, 2},  /* 0.4 < 0.65 <= 0.7 */
        {0, 0.71f, 0.0f, 3},  /* 0.7 < 0.71 <= 0.85 */
        {0, 0.0f, 0.0f, 1},   /* top_p 0 still keeps the best */
        {0, 0.99f, 0.0f, 5},  /* 0.95 < 0.99 */
        {0, 1.0f, 0.3f, 3},   /* p >= 0.12 */
        {0, 1.0f, 0.4f, 2},   /* p >= 0.16 */
        {0, 1.0f, 0.9f, 1},
        {3, 0.8f, 0.0f, 2},   /* top-k mass 0.85: 0.8 * 0.85 = 0.68 <= 0.7 */
        {3, 0.9f, 0.0f, 3},   /* 0.9 * 0.85 = 0.765 > 0.7 */
        {4, 0.99f, 0.3f, 3},  /* top_p keeps 4, min_p cuts to 3 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ops_sampler sp = {.temperature = 1, .top_k = cases[i].top_k, .top_p = cases[i].top_p,
                          .min_p = cases[i].min_p, .seed = 1};
        assert_int_equal(cpu_sample_probs(p, logits, 5, &sp), TD_OK);
        assert_keeps_top(p, cases[i].keep);
    }
    /* greedy ignores the filters and ties go to the lower id */
    const float tie[4] = {1, 7, 7, 2};
    ops_sampler g = {.temperature = 0, .top_k = 3, .top_p = 0.5f, .seed = 9};
    assert_int_equal(cpu_sample_probs(p, tie, 4, &g), TD_OK);
    assert_true(p[0] == 0 && p[1] == 1 && p[2] == 0 && p[3] == 0);
    for (uint64_t step = 0; step < 100; step++)
        assert_int_equal(cpu_sample_draw(p, 4, step * 7919, step), 1);
}

static void test_top_p_over_a_long_flat_tail(void **s)
{
    (void)s;
    /* One token at logit 10 and 100000 at 0: the tail (e^-10 each, 4.54 in all) holds most
     * of the mass, so top_p 0.5 must reach deep into it (lower ids first among equals). */
    enum { V = 100001 };
    float *logits = calloc(V, sizeof *logits), *p = malloc(V * sizeof *p);
    logits[0] = 10;
    ops_sampler sp = {.temperature = 1, .top_p = 0.5f, .seed = 5};
    assert_int_equal(cpu_sample_probs(p, logits, V, &sp), TD_OK);
    const double e = exp(-10.0), total = 1 + (V - 1) * e;
    const int64_t n_tail = (int64_t)ceil((0.5 * total - 1) / e); /* 38987 */
    assert_int_equal(n_tail, 38987);
    for (int64_t i = 0; i < V; i++) {
        double want = i == 0 ? 1 / (1 + n_tail * e) : i <= n_tail ? e / (1 + n_tail * e) : 0;
        if (fabs(p[i] - want) > 1e-6 * want)
            fail_msg("p[%lld] = %.9g, want %.9g", (long long)i, p[i], want);
    }
    free(logits);
    free(p);
}

static void test_draws_follow_p_chi_square(void **s)
{
    (void)s;
    enum { V = 10, N = 20000 };
    const float logits[V] = {0.3f, 1.2f, -0.5f, 2.0f, 0.0f, -3.0f, 1.0f, 0.7f, -1.0f, -8.0f};
    ops_sampler sp = {.temperature = 1.3f, .top_k = 8, .top_p = 1, .min_p = 0, .seed = 777};
    float p[V];
    assert_int_equal(cpu_sample_probs(p, logits, V, &sp), TD_OK);
    int count[V] = {0};
    for (uint64_t step = 0; step < N; step++)
        count[cpu_sample_draw(p, V, sp.seed, step)]++;
    /* top_k 8 drops ids 5 and 9 (the two smallest logits): never drawn */
    assert_int_equal(count[5], 0);
    assert_int_equal(count[9], 0);
    double chi2 = 0;
    int bins = 0;
    for (int i = 0; i < V; i++) {
        if (p[i] == 0)
            continue;
        double e = (double)N * p[i];
        assert_true(e >= 5); /* every kept bin is large enough for the test */
        chi2 += (count[i] - e) * (count[i] - e) / e;
        bins++;
    }
    assert_int_equal(bins, 8);
    /* 7 degrees of freedom: P(chi2 > 24.32) = 0.001 */
    if (chi2 > 24.32)
        fail_msg("chi-square %.2f over 8 bins exceeds 24.32", chi2);
    /* same seed and step -> same token; another seed -> another sequence */
    int same = 0;
    for (uint64_t step = 0; step < 200; step++) {
        assert_int_equal(cpu_sample_draw(p, V, 777, step), cpu_sample_draw(p, V, 777, step));
        same += cpu_sample_draw(p, V, 777, step) == cpu_sample_draw(p, V, 778, step);
    }
    assert_true(same < 150);
}

/* cpu_sample_rows: row i's q is cpu_sample_probs of row i and its token the draw with counter
 * ctr + i * step. Rows 0 and 2 have p = {1/4, 3/4} exactly (logits 0 and ln 3), so their tokens
 * follow from u alone; row 1 keeps one token (the other logit is -inf). A row with no finite
 * logit is TD_EINVAL after the rows before it. */
static void test_sample_rows_draw_each_row_with_its_counter(void **s)
{
    (void)s;
    enum { V = 2, N = 3 };
    const float l3 = logf(3.0f);
    const float logits[N * V] = {0.0f, l3, 5.0f, -INFINITY, 0.0f, l3};
    const ops_sampler sp = {.temperature = 1, .top_p = 1, .seed = 4242};
    const uint64_t ctr = 1000, step = 4;
    float q[N * V];
    int32_t tok[N];
    assert_int_equal(cpu_sample_rows(tok, q, logits, N, V, &sp, ctr, step), TD_OK);
    for (int i = 0; i < N; i++) {
        float want[V];
        assert_int_equal(cpu_sample_probs(want, logits + i * V, V, &sp), TD_OK);
        assert_memory_equal(q + i * V, want, sizeof want);
        assert_int_equal(tok[i], cpu_sample_draw(want, V, sp.seed, ctr + (uint64_t)i * step));
    }
    assert_true(fabsf(q[0] - 0.25f) < 1e-7f && fabsf(q[1] - 0.75f) < 1e-7f);
    assert_true(q[2] == 1.0f && q[3] == 0.0f);
    assert_int_equal(tok[0], ops_rand_uniform(sp.seed, ctr) < q[0] ? 0 : 1);
    assert_int_equal(tok[1], 0);
    assert_int_equal(tok[2], ops_rand_uniform(sp.seed, ctr + 2 * step) < q[4] ? 0 : 1);
    /* the counters differ per row: over 64 blocks rows 0 and 2 disagree at least once */
    int differ = 0;
    for (uint64_t c = 0; c < 64 * step; c += step) {
        assert_int_equal(cpu_sample_rows(tok, q, logits, N, V, &sp, c, step), TD_OK);
        differ += tok[0] != tok[2];
    }
    assert_true(differ > 0);
    const float bad[N * V] = {0.0f, l3, NAN, -INFINITY, 0.0f, l3};
    tok[0] = tok[1] = -7;
    assert_int_equal(cpu_sample_rows(tok, q, bad, N, V, &sp, ctr, step), TD_EINVAL);
    assert_int_equal(tok[0], ops_rand_uniform(sp.seed, ctr) < 0.25 ? 0 : 1);
    assert_int_equal(tok[1], -7);
}

static void test_bad_settings_and_logits_are_errors(void **s)
{
    (void)s;
    float logits[3] = {0, 1, 2}, p[3];
    ops_sampler ok = {.temperature = 1, .top_p = 1};
    ops_sampler bad = ok;
    bad.temperature = -0.5f;
    assert_int_equal(cpu_sample_probs(p, logits, 3, &bad), TD_EINVAL);
    assert_true(strstr(err_msg(), "temperature") != NULL);
    bad = ok;
    bad.temperature = NAN;
    assert_int_equal(cpu_sample_probs(p, logits, 3, &bad), TD_EINVAL);
    bad = ok;
    bad.top_p = NAN;
    assert_int_equal(cpu_sample_probs(p, logits, 3, &bad), TD_EINVAL);
    bad = ok;
    bad.min_p = -0.1f;
    assert_int_equal(cpu_sample_probs(p, logits, 3, &bad), TD_EINVAL);
    assert_true(strstr(err_msg(), "min_p") != NULL);
    const float none[3] = {-INFINITY, NAN, -INFINITY};
    assert_int_equal(cpu_sample_probs(p, none, 3, &ok), TD_EINVAL);
    /* NaN logits are never kept */
    const float some_nan[3] = {NAN, 0, NAN};
    assert_int_equal(cpu_sample_probs(p, some_nan, 3, &ok), TD_OK);
    assert_true(p[0] == 0 && p[1] == 1 && p[2] == 0);
    ops_sampler k3 = {.temperature = 1, .top_k = 3, .top_p = 0.9f};
    assert_int_equal(cpu_sample_probs(p, some_nan, 3, &k3), TD_OK);
    assert_true(p[0] == 0 && p[1] == 1 && p[2] == 0);
}

/* Rows with known log-softmax values and ranks: {0, ln 3} (lse ln 4), four equal logits (ties
 * go to the lower id), a token outside the vocabulary, fewer tokens than alternatives asked,
 * NaN logits. */
static void test_logprob_rows_known_values(void **s)
{
    (void)s;
    const float ln3 = (float)log(3.0);
    const float logits[3][4] = {
        {0, ln3, -INFINITY, -INFINITY},
        {2, 2, 2, 2},
        {5, -1, 7, 0},
    };
    const int32_t tok[3] = {1, 3, 4};
    ops_logprob out[3];
    cpu_logprob_rows(out, &logits[0][0], tok, 3, 4, 3);
    const double ln4 = log(4.0);
    assert_float_equal(out[0].logprob, (float)((double)ln3 - ln4), 0);
    assert_int_equal(out[0].n_top, 3);
    assert_int_equal(out[0].top_id[0], 1);
    assert_int_equal(out[0].top_id[1], 0);
    assert_int_equal(out[0].top_id[2], 2);
    assert_float_equal(out[0].top_logprob[1], (float)-ln4, 0);
    assert_true(out[0].top_logprob[2] == -INFINITY);
    assert_float_equal(out[1].logprob, (float)(2.0 - (2.0 + ln4)), 0);
    for (int j = 0; j < 3; j++) {
        assert_int_equal(out[1].top_id[j], j);
        assert_float_equal(out[1].top_logprob[j], (float)-ln4, 0);
    }
    assert_true(out[2].logprob == -INFINITY);
    const double lse = 7 + log(exp(-2.0) + exp(-8.0) + 1 + exp(-7.0));
    /* ranks: the tokens at or above the token's logit (ties all count) */
    assert_int_equal(out[0].rank, 1);
    assert_int_equal(out[1].rank, 4);
    assert_int_equal(out[2].rank, 0);
    assert_float_equal(out[2].top_logprob[0], (float)(7 - lse), 0);
    assert_float_equal(out[2].top_logprob[1], (float)(5 - lse), 0);
    assert_int_equal(out[2].top_id[2], 3);
    /* no alternatives; more asked than the row has */
    cpu_logprob_rows(out, &logits[2][0], &tok[0], 1, 4, 0);
    assert_int_equal(out[0].n_top, 0);
    assert_float_equal(out[0].logprob, (float)(-1 - lse), 0);
    assert_int_equal(out[0].rank, 4); /* -1: below 5, 7 and 0 */
    const float nan_row[4] = {1, NAN, 3, 1}; /* NaN counts nowhere; a NaN token has no rank */
    const int32_t tk[2] = {0, 1};
    cpu_logprob_rows(out, nan_row, &tk[0], 1, 4, 0);
    assert_int_equal(out[0].rank, 3);
    cpu_logprob_rows(out, nan_row, &tk[1], 1, 4, 0);
    assert_int_equal(out[0].rank, 0);
    cpu_logprob_rows(out, &logits[2][0], &tok[0], 1, 2, OPS_TOP_LOGPROBS_MAX);
    assert_int_equal(out[0].n_top, 2);
    assert_int_equal(out[0].top_id[0], 0);
    assert_float_equal(out[0].top_logprob[0], (float)(5 - (5 + log(1 + exp(-6.0)))), 0);
}

static void test_logit_add_adds_each_rows_entries(void **state)
{
    (void)state;
    float x[3][5] = {{0, 1, 2, 3, 4}, {-1, -2, -3, -4, -5}, {0.5f, 0.5f, 0.5f, 0.5f, 0.5f}};
    const int32_t off[4] = {0, 3, 3, 7};
    /* row 0: 4 / 2 - 0.25, 0 (not positive: times 2) + 100, 2 / 0.5; row 2 adds, and divides
     * 0.5 by 4 */
    const ops_logit_add add[7] = {{4, 2.0f, -0.25f}, {0, 2.0f, 100}, {2, 0.5f, 0},
                                  {1, 1, 1.5f}, {3, 1, -100}, {0, 1, 0.125f}, {4, 4.0f, 0}};
    cpu_logit_add(&x[0][0], 3, 5, off, add);
    const float want[3][5] = {{100, 1, 4, 3, 1.75f},
                              {-1, -2, -3, -4, -5},
                              {0.625f, 2.0f, 0.5f, -99.5f, 0.125f}};
    assert_memory_equal(x, want, sizeof want);
    /* no rows, no entries */
    const int32_t none[1] = {0};
    cpu_logit_add(&x[0][0], 0, 5, none, NULL);
    assert_memory_equal(x, want, sizeof want);
}

/* A mask keeps exactly its set bits' logits; bits past the vocabulary are ignored. */
static void test_logit_mask_keeps_the_set_bits(void **state)
{
    (void)state;
    enum { V = 70, W = OPS_MASK_WORDS(V) };
    float x[2 * V];
    for (int i = 0; i < 2 * V; i++)
        x[i] = 0.25f * (float)(i % 11) - 1.0f;
    uint32_t allow[2 * W] = {0x80000001u, 0, 0xffffffe0u | 1u << 5, /* row 1: 33, 69 */
                             0, 1u << 1, 1u << 5};
    cpu_logit_mask(x, 2, V, allow);
    for (int t = 0; t < V; t++) {
        const bool keep0 = t == 0 || t == 31 || t == 69;
        const bool keep1 = t == 33 || t == 69;
        assert_true(keep0 ? x[t] == 0.25f * (float)(t % 11) - 1.0f : x[t] == -INFINITY);
        assert_true(keep1 ? x[V + t] == 0.25f * (float)((V + t) % 11) - 1.0f
                          : x[V + t] == -INFINITY);
    }
}

int main(void)
{
    G = golden_open();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_matches_random123_known_answers),
        cmocka_unit_test(test_sample_plain_softmax_and_draws),
        cmocka_unit_test(test_sample_temperature),
        cmocka_unit_test(test_sample_top_k),
        cmocka_unit_test(test_sample_top_p),
        cmocka_unit_test(test_sample_min_p),
        cmocka_unit_test(test_sample_all_filters_together),
        cmocka_unit_test(test_sample_greedy_is_one_hot_argmax),
        cmocka_unit_test(test_filters_keep_exactly_the_expected_sets),
        cmocka_unit_test(test_top_p_over_a_long_flat_tail),
        cmocka_unit_test(test_draws_follow_p_chi_square),
        cmocka_unit_test(test_sample_rows_draw_each_row_with_its_counter),
        cmocka_unit_test(test_bad_settings_and_logits_are_errors),
        cmocka_unit_test(test_logprob_rows_known_values),
        cmocka_unit_test(test_logit_add_adds_each_rows_entries),
        cmocka_unit_test(test_logit_mask_keeps_the_set_bits),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gguf_close(G);
    return rc;
}
