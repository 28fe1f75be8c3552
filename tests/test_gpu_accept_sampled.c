/* Sampled speculative acceptance on the device (cuda_accept_sampled, the CUDA backend's
 * accept_sampled) against the CPU twin (cpu_accept_sampled): random blocks with drafts drawn
 * from a drafter's own q, for vocabularies of 1000 and 248320 (qwen35), blocks of 2, 8 and
 * 16, several seeds and the sampler's settings (temperature only, top_k, top_p, min_p);
 * crafted blocks whose result is certain; a single-token block; a row without a finite
 * logit giving next = -1. Skips (77) without CUDA or a device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/ops.h"
#include "tests/support/gpu_check.h"

#define SKIP_EXIT 77

#ifndef TANDEM_HAVE_CUDA

GPU_CHECK_SKIP_MAIN

#else

GPU_CHECK_SANITIZER_OPTIONS

#define VOCAB 248320 /* qwen35 */
#define BMAX 40 /* blocks of up to 40 tokens: the walk's lanes go past one warp */
#define ROLES 4 /* counters per position, as draftd's dfl_rng_ctr */

static ops_accept_rng rng_at(int64_t L)
{
    return (ops_accept_rng){.accept = (uint64_t)L * ROLES + 1, .target = (uint64_t)L * ROLES,
                            .step = ROLES};
}

/* {a, next} of the device for the host block, after poisoning its outputs. */
static void gpu_accept(int32_t res[2], const float *logits, const float *q, const int32_t *draft,
                       int64_t n, int64_t V, const ops_sampler *s, const ops_accept_rng *rng)
{
    float *dl = dput(logits, (size_t)(n * V) * 4), *dp = dpoison((size_t)(n * V) * 4);
    float *dq = n > 1 ? dput(q, (size_t)((n - 1) * V) * 4) : NULL;
    int32_t *dd = n > 1 ? dput(draft, (size_t)(n - 1) * 4) : NULL, *dr = dpoison(8);
    GPU_OK(cuda_accept_sampled(dr, dp, dl, dq, dd, n, V, s, rng, gpu_st));
    int32_t *got = dget(dr, 8);
    res[0] = got[0];
    res[1] = got[1];
    free(got);
    cuda_mem_free(dl);
    cuda_mem_free(dp);
    cuda_mem_free(dq);
    cuda_mem_free(dd);
    cuda_mem_free(dr);
}

/* Random target rows; the drafter's rows are the target's plus noise, its drafts drawn from
 * its own q as draftd draws them, so rejections land at varied positions. */
static void check_random(const char *what, int64_t V, int64_t B, const ops_sampler *s,
                         float noise, int64_t L, int hist[BMAX + 1])
{
    float *logits = malloc((size_t)(B * V) * 4), *q = malloc((size_t)(B * V) * 4);
    float *p = malloc((size_t)(B * V) * 4), *dl = malloc((size_t)V * 4);
    int32_t draft[BMAX];
    for (int64_t i = 0; i < B; i++) {
        float *lg = logits + i * V;
        for (int64_t j = 0; j < V; j++) {
            lg[j] = 4 * rng_f();
            dl[j] = lg[j] + noise * rng_f();
        }
        if (i == B - 1)
            break;
        GPU_OK(cpu_sample_probs(q + i * V, dl, V, s));
        draft[i] = cpu_sample_draw(q + i * V, V, s->seed, (uint64_t)(L + i + 1) * ROLES + 2);
    }
    const ops_accept_rng rng = rng_at(L);
    int32_t want[2], got[2];
    GPU_OK(cpu_accept_sampled(want, p, logits, q, draft, B, V, s, &rng));
    gpu_accept(got, logits, q, draft, B, V, s, &rng);
    if (got[0] != want[0] || got[1] != want[1])
        fail_msg("%s (V %lld, B %lld, seed %llu): GPU {%d, %d}, CPU {%d, %d}", what,
                 (long long)V, (long long)B, (unsigned long long)s->seed, got[0], got[1],
                 want[0], want[1]);
    hist[want[0]]++;
    free(logits);
    free(q);
    free(p);
    free(dl);
}

static void test_accept_sampled_matches_cpu_on_random_blocks(void **state)
{
    (void)state;
    rng_seed(31);
    static const ops_sampler smps[] = {
        {.temperature = 0.8f, .top_p = 1},                 /* dense path */
        {.temperature = 1.0f, .top_k = 40, .top_p = 1},    /* small top-k path */
        {.temperature = 1.2f, .top_p = 0.9f},              /* sorted path */
        {.temperature = 0.6f, .top_p = 1, .min_p = 0.05f}, /* dense path with min_p */
        {.temperature = 1.0f, .top_k = 50, .top_p = 0.8f, .min_p = 0.02f},
    };
    static const int64_t blocks[] = {2, 8, 16};
    static const float noises[] = {0.0f, 0.3f, 1.0f};
    int hist[BMAX + 1] = {0};
    for (size_t c = 0; c < sizeof smps / sizeof smps[0]; c++)
        for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++)
            for (int k = 0; k < 6; k++) {
                ops_sampler s = smps[c];
                s.seed = 1000 * c + 10 * b + (uint64_t)k;
                char what[64];
                snprintf(what, sizeof what, "settings %zu trial %d", c, k);
                check_random(what, 1000, blocks[b], &s, noises[k % 3], 5 + 11 * k, hist);
            }
    /* 40 tokens: drafts past the first 32 (the walk tests 32 at a time), near-copies of the
     * target so that some blocks get there; an odd vocabulary split between two blocks */
    for (int k = 0; k < 8; k++) {
        ops_sampler s = smps[0];
        s.seed = 500 + (uint64_t)k;
        check_random("40 tokens", 1000, 40, &s, 0.02f, 7 + k, hist);
        check_random("odd vocabulary of 2 slices", 40001, 40, &s, 0.02f * k, 9 + k, hist);
    }
    /* the qwen35 vocabulary once per path */
    for (size_t c = 0; c < 3; c++) {
        ops_sampler s = smps[c];
        s.seed = 77 + c;
        check_random("qwen35 vocabulary", VOCAB, 16, &s, 0.3f, 200, hist);
    }
    int early = hist[0], later = 0;
    for (int a = 1; a <= BMAX; a++)
        later += hist[a];
    int deep = 0; /* accepted past the walk's first 32 drafts */
    for (int a = 33; a <= BMAX; a++)
        deep += hist[a];
    assert_true(early > 0 && later > 0 && hist[15] + hist[7] > 0 && deep > 0);
}

/* Drafts certain to pass (q one-hot where p is), then one with p(d) = 0: a = k - 1 and next
 * is the target's token; with no rejection next is the last row's token. */
static void test_accept_sampled_crafted_blocks_give_certain_result(void **state)
{
    (void)state;
    enum { V = 3000, N = 8 };
    const ops_sampler s = {.temperature = 1, .top_p = 1, .seed = 5};
    float *logits = malloc((size_t)(N * V) * 4), *q = calloc((size_t)((N - 1) * V), 4);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < V; j++)
            logits[i * V + j] = j == 100 * i + 7 ? 2.0f : -INFINITY;
    for (int k = 1; k <= N; k++) {
        int32_t draft[N - 1], res[2];
        memset(q, 0, (size_t)((N - 1) * V) * 4);
        for (int i = 1; i < N; i++) {
            draft[i - 1] = i == k ? 100 * (i - 1) + 8 : 100 * (i - 1) + 7;
            q[(i - 1) * V + draft[i - 1]] = 1.0f;
        }
        const ops_accept_rng rng = rng_at(3);
        gpu_accept(res, logits, q, draft, N, V, &s, &rng);
        assert_int_equal(res[0], k - 1);
        assert_int_equal(res[1], 100 * (k - 1) + 7);
    }
    free(logits);
    free(q);
}

/* One token: the draw at position L + 1 (the CPU's token for the same row); no finite logit
 * in a row the walk reaches: next = -1. */
static void test_accept_sampled_single_token_and_row_without_finite_logit(void **state)
{
    (void)state;
    rng_seed(32);
    enum { V = 5000 };
    const ops_sampler s = {.temperature = 0.9f, .top_k = 30, .top_p = 1, .seed = 8};
    float *logits = rng_floats(2 * V, 4.0f), p[2 * V];
    const ops_accept_rng rng = rng_at(12);
    int32_t want[2], got[2];
    GPU_OK(cpu_accept_sampled(want, p, logits, NULL, NULL, 1, V, &s, &rng));
    gpu_accept(got, logits, NULL, NULL, 1, V, &s, &rng);
    assert_int_equal(got[0], 0);
    assert_int_equal(got[1], want[1]);
    for (int j = 0; j < V; j++)
        logits[j] = j % 2 ? NAN : -INFINITY;
    float *q = calloc(V, 4);
    q[3] = 1;
    int32_t draft[1] = {3};
    gpu_accept(got, logits, q, draft, 2, V, &s, &rng);
    assert_int_equal(got[0], 0);
    assert_int_equal(got[1], -1);
    free(q);
    free(logits);
}

int main(void)
{
    if (!gpu_check_init())
        return SKIP_EXIT;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accept_sampled_matches_cpu_on_random_blocks),
        cmocka_unit_test(test_accept_sampled_crafted_blocks_give_certain_result),
        cmocka_unit_test(test_accept_sampled_single_token_and_row_without_finite_logit),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_check_free();
    return rc;
}

#endif /* TANDEM_HAVE_CUDA */
