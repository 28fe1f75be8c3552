/* The block picker of --draft-auto (verifyd/blockpick.h): its estimates by hand, then steps of
 * simulated machines (a step of B tokens costs base + per_token * B, plus the proposal where
 * B > 1; the drafter gets its first `run` drafts accepted), where it must settle on the B with
 * the most tokens per second and follow a change of acceptance. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "verifyd/blockpick.h"

#define assert_near(a, b, eps) assert_near_at((a), (b), (eps), __FILE__, __LINE__)

static void assert_near_at(double a, double b, double eps, const char *file, int line)
{
    if (!(fabs(a - b) <= eps))
        fail_msg("%s:%d: %.17g is not %.17g (within %g)", file, line, a, b, eps);
}

/* Two steps of B tokens: the warm-up and one that counts. */
static void record_twice(blockpick *p, int64_t B, int64_t n, double seconds)
{
    bp_record(p, B, n, seconds);
    bp_record(p, B, n, seconds);
}

static void test_whole_block_first_then_the_cheapest_guess(void **state)
{
    (void)state;
    blockpick p;
    bp_init(&p, 16);
    assert_int_equal(bp_pick(&p), 16);
    assert_true(bp_cost(&p, 16) == 0.0);
    /* the first step of a size warms up and is not counted */
    bp_record(&p, 16, 5, 0.010);
    assert_true(bp_cost(&p, 16) == 0.0);
    assert_int_equal(bp_pick(&p), 16);
    bp_record(&p, 16, 5, 0.012);
    assert_true(bp_cost(&p, 16) == 0.012);
    /* below the smallest measured size: proportional to B */
    assert_true(bp_cost(&p, 1) == 0.012 / 16);
    assert_true(bp_cost(&p, 8) == 0.012 * 8 / 16);
    assert_int_equal(bp_pick(&p), 1);
    record_twice(&p, 1, 1, 0.004);
    assert_true(bp_cost(&p, 1) == 0.004);
    /* between measured sizes: the line through them; the mean moves by BP_COST_NEW */
    assert_near(bp_cost(&p, 6), 0.004 + (0.012 - 0.004) * 5 / 15, 1e-15);
    bp_record(&p, 16, 5, 0.022);
    assert_near(bp_cost(&p, 16), 0.8 * 0.012 + 0.2 * 0.022, 1e-15);
}

static void test_above_the_largest_measured_size_costs_as_much(void **state)
{
    (void)state;
    blockpick p;
    bp_init(&p, 16);
    record_twice(&p, 4, 4, 0.003);
    assert_true(bp_cost(&p, 9) == 0.003);
    assert_true(bp_cost(&p, 2) == 0.003 * 2 / 4);
}

static void test_tokens_from_the_decayed_counts(void **state)
{
    (void)state;
    blockpick p;
    bp_init(&p, 16);
    /* no counts: every draft at 1/2 */
    assert_near(bp_tokens(&p, 1), 1.0, 0);
    assert_near(bp_tokens(&p, 3), 1.0 + 0.5 + 0.25, 1e-15);
    /* drafts 1 and 2 accepted, 3 refused, 4.. never offered */
    bp_record(&p, 8, 3, 0.01);
    double h1 = (1 + 2 * 0.5) / 3, h2 = (1 + 2 * h1) / 3, h3 = (0 + 2 * h2) / 3, h4 = h3;
    assert_near(bp_tokens(&p, 5), 1 + h1 + h1 * h2 + h1 * h2 * h3 + h1 * h2 * h3 * h4,
                        1e-14);
    /* a second step of 2 tokens (draft 1 refused): the first step's counts weigh 0.97 */
    bp_record(&p, 2, 1, 0.01);
    h1 = (0.97 + 2 * 0.5) / (0.97 + 1 + 2);
    h2 = (0.97 + 2 * h1) / (0.97 + 2);
    assert_near(bp_tokens(&p, 3), 1 + h1 + h1 * h2, 1e-14);
    /* a plain step makes them weigh 0.995 */
    bp_record(&p, 1, 1, 0.01);
    h1 = (0.995 * 0.97 + 2 * 0.5) / (0.995 * (0.97 + 1) + 2);
    h2 = (0.995 * 0.97 + 2 * h1) / (0.995 * 0.97 + 2);
    assert_near(bp_tokens(&p, 3), 1 + h1 + h1 * h2, 1e-14);
}

typedef struct machine {
    double base, per_token, draft; /* seconds */
    int64_t run;                   /* drafts accepted per step (then one refused) */
} machine;

static double step_cost(const machine *m, int64_t B)
{
    return m->base + m->per_token * (double)B + (B > 1 ? m->draft : 0);
}

/* The most tokens per second a fixed B gets on m. */
static double best_rate(const machine *m, int64_t most)
{
    double best = 0;
    for (int64_t B = 1; B <= most; B++) {
        const int64_t acc = m->run < B - 1 ? m->run : B - 1;
        const double r = (double)(acc + 1) / step_cost(m, B);
        best = r > best ? r : best;
    }
    return best;
}

typedef struct outcome {
    double rate;     /* tokens per second of the last `tail` steps */
    double drafting; /* share of their time in drafting steps */
} outcome;

/* n steps of p on m. */
static outcome simulate(blockpick *p, const machine *m, int n, int tail)
{
    double tokens = 0, total = 0, drafting = 0;
    for (int i = 0; i < n; i++) {
        const int64_t B = bp_pick(p);
        assert_true(B >= 1 && B <= p->most);
        const int64_t acc = m->run < B - 1 ? m->run : B - 1;
        const double c = step_cost(m, B);
        bp_record(p, B, acc + 1, c);
        if (i >= n - tail) {
            tokens += (double)(acc + 1);
            total += c;
            drafting += B > 1 ? c : 0;
        }
    }
    return (outcome){tokens / total, drafting / total};
}

/* A GPU: a 16-token verify costs about twice one token, the proposal a third of a step. */
static void test_long_runs_on_a_gpu_take_the_whole_block(void **state)
{
    (void)state;
    const machine gpu = {.base = 6.2e-3, .per_token = 0.45e-3, .draft = 2.3e-3, .run = 15};
    blockpick p;
    bp_init(&p, 16);
    const outcome o = simulate(&p, &gpu, 300, 100);
    assert_int_equal(bp_pick(&p), 16);
    assert_near(o.rate, best_rate(&gpu, 16), 1e-9);
}

/* Five drafts accepted per step: blocks of 6 commit them all, longer ones no more at a higher
 * cost. The picker settles on 6, trying 7 now and then (draft 6's refusals fade). */
static void test_short_runs_take_the_block_that_ends_with_them(void **state)
{
    (void)state;
    const machine gpu = {.base = 6.2e-3, .per_token = 0.45e-3, .draft = 2.3e-3, .run = 5};
    blockpick p;
    bp_init(&p, 16);
    int at6 = 0;
    simulate(&p, &gpu, 300, 1);
    for (int i = 0; i < 100; i++) {
        const int64_t B = bp_pick(&p);
        assert_true(B == 6 || B == 7);
        at6 += B == 6;
        bp_record(&p, B, 6, step_cost(&gpu, B));
    }
    assert_true(at6 >= 75);
    const outcome o = simulate(&p, &gpu, 100, 100);
    assert_true(o.rate > 0.98 * best_rate(&gpu, 16));
}

/* A CPU where drafting never pays: plain steps, the whole block now and then to look again
 * (about BP_EXPLORE of the time); then the text turns predictable and drafting takes over. */
static void test_plain_where_drafting_does_not_pay_until_it_does(void **state)
{
    (void)state;
    machine cpu = {.base = 2e-3, .per_token = 1e-3, .draft = 5e-3, .run = 1};
    blockpick p;
    bp_init(&p, 16);
    outcome o = simulate(&p, &cpu, 3000, 2000);
    assert_int_equal(bp_pick(&p), 1);
    assert_true(o.drafting > 0.02 && o.drafting < 2 * BP_EXPLORE);
    assert_true(o.rate > (1 - 2 * BP_EXPLORE) * best_rate(&cpu, 16));
    cpu.run = 15;
    simulate(&p, &cpu, 300, 1);
    o = simulate(&p, &cpu, 100, 100);
    assert_int_equal(bp_pick(&p), 16);
    assert_near(o.rate, best_rate(&cpu, 16), 1e-9);
}

/* Each draft accepted with probability q whatever came before (a seeded generator): over the
 * steps after the first 500 the picker gets within 2% of the best fixed block's tokens per
 * second, and well above whole blocks' where q is moderate. */
static void test_random_acceptance_gets_the_best_fixed_block(void **state)
{
    (void)state;
    const machine gpu = {.base = 6.2e-3, .per_token = 0.45e-3, .draft = 2.3e-3};
    const double qs[] = {0.5, 0.7, 0.8, 0.9, 0.95};
    for (size_t i = 0; i < sizeof qs / sizeof *qs; i++) {
        const double q = qs[i];
        double best = 0, whole = 0;
        for (int64_t B = 1; B <= 16; B++) {
            double expect = 1, run = 1;
            for (int64_t k = 1; k < B; k++)
                expect += run *= q;
            const double r = expect / step_cost(&gpu, B);
            best = r > best ? r : best;
            whole = r;
        }
        blockpick p;
        bp_init(&p, 16);
        uint64_t rng = 42;
        double tokens = 0, total = 0;
        for (int n = 0; n < 2500; n++) {
            const int64_t B = bp_pick(&p);
            int64_t acc = 0;
            for (;;) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                if (acc == B - 1 || (double)(rng >> 11) * 0x1p-53 >= q)
                    break;
                acc++;
            }
            bp_record(&p, B, acc + 1, step_cost(&gpu, B));
            if (n >= 500) {
                tokens += (double)(acc + 1);
                total += step_cost(&gpu, B);
            }
        }
        if (tokens / total < 0.98 * best)
            fail_msg("q %g: %.1f tokens/s against %.1f with the best fixed block", q,
                     tokens / total, best);
        if (q <= 0.8)
            assert_true(tokens / total > 1.1 * whole);
    }
}

/* Plain steps of 1 ms, whole blocks of 10 ms that get nothing accepted: the next whole block
 * comes once 5% of the plain time since the last one covers its extra 9 ms, i.e. after 180 ms,
 * but only a sixth as long per drafting step seen while fewer than six were (2 seen: 60 ms). */
static void test_few_drafting_steps_seen_look_again_sooner(void **state)
{
    (void)state;
    blockpick p;
    bp_init(&p, 16);
    record_twice(&p, 16, 1, 0.010);
    int gaps[6];
    for (int g = 0; g < 6; g++) {
        int plain = 0;
        while (bp_pick(&p) == 1 && plain < 1000) {
            bp_record(&p, 1, 1, 0.001);
            plain++;
        }
        assert_int_equal(bp_pick(&p), 16);
        bp_record(&p, 16, 1, 0.010);
        gaps[g] = plain;
    }
    const int want[6] = {60, 90, 120, 150, 180, 180}; /* 180 ms x (2..6 seen) / 6 */
    for (int g = 0; g < 6; g++)
        if (gaps[g] < want[g] - 1 || gaps[g] > want[g] + 1)
            fail_msg("look %d came after %d plain steps, not %d", g, gaps[g], want[g]);
}

/* A step reported with no time (it recorded a CUDA graph): its acceptance counts, its cost
 * does not. */
static void test_a_step_without_time_counts_its_drafts_only(void **state)
{
    (void)state;
    blockpick p;
    bp_init(&p, 16);
    record_twice(&p, 16, 16, 0.012);
    const double tokens = bp_tokens(&p, 16);
    bp_record(&p, 16, 16, 0);
    assert_true(bp_cost(&p, 16) == 0.012);
    const double more = bp_tokens(&p, 16);
    assert_true(more > tokens); /* one more step with every draft accepted */
    bp_record(&p, 8, 2, 0);
    bp_record(&p, 8, 2, 0);
    assert_true(bp_cost(&p, 8) == 0.012 * 8 / 16); /* still the guess from 16 */
    assert_true(bp_tokens(&p, 16) < more); /* draft 2 refused twice */
}

static void test_one_token_blocks_stay_plain(void **state)
{
    (void)state;
    blockpick p;
    bp_init(&p, 1);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(bp_pick(&p), 1);
        bp_record(&p, 1, 1, 1e-3);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_block_first_then_the_cheapest_guess),
        cmocka_unit_test(test_above_the_largest_measured_size_costs_as_much),
        cmocka_unit_test(test_tokens_from_the_decayed_counts),
        cmocka_unit_test(test_long_runs_on_a_gpu_take_the_whole_block),
        cmocka_unit_test(test_short_runs_take_the_block_that_ends_with_them),
        cmocka_unit_test(test_plain_where_drafting_does_not_pay_until_it_does),
        cmocka_unit_test(test_random_acceptance_gets_the_best_fixed_block),
        cmocka_unit_test(test_few_drafting_steps_seen_look_again_sooner),
        cmocka_unit_test(test_a_step_without_time_counts_its_drafts_only),
        cmocka_unit_test(test_one_token_blocks_stay_plain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
