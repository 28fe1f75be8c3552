/* The sampler on the device against the CPU's (kernels/cpu/sample.c): every path of
 * cuda_sample_probs (greedy, small top-k with top-p and min_p, top-p alone within a row's
 * best 1024 entries and past them, the sorted path for a large top-k, the dense path), ties,
 * NaN and -inf logits, a row with no finite logit;
 * cuda_sample_draw returning the CPU's token for the same p, seed and step; a drafter's block
 * of rows drawn at once (cuda_sample_rows against cpu_sample_rows); log probabilities
 * (cuda_logprob_rows against cpu_logprob_rows); sparse additions to rows of logits
 * (cuda_logit_add against cpu_logit_add), token masks (cuda_logit_mask); and greedy acceptance of a verified block on the
 * device. Skips (77) without CUDA or a device. */
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
#define HEAD 12      /* HEAD kind: tokens well above the rest */

typedef enum logit_kind {
    LOGITS_RANDOM, /* uniform in [-8, 8) */
    LOGITS_HEAD,   /* uniform in [-6, 0) with HEAD tokens at 10, 9, ... 10-HEAD+1 */
    LOGITS_TIES,   /* steps of 0.25 in [-6, 0]: every value shared by many tokens */
    LOGITS_NAN,    /* random, every 7th NaN, every 11th -inf */
    LOGITS_WIDE,   /* WIDE tokens (every 49th id) at 0.3 - 0.3 * j / WIDE, the rest at -20 */
} logit_kind;

#define WIDE 5000 /* LOGITS_WIDE: more nearly equal tokens than one block's top-k holds */

static int32_t head_ids[HEAD]; /* where LOGITS_HEAD put its head, best first */

static float *make_logits(int64_t n, logit_kind kind)
{
    float *x = rng_floats(n, 1.0f);
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case LOGITS_RANDOM: x[i] *= 8; break;
        case LOGITS_HEAD: x[i] = 3 * x[i] - 3; break;
        case LOGITS_TIES: x[i] = roundf((3 * x[i] - 3) * 4) / 4; break;
        case LOGITS_NAN: x[i] = i % 7 == 3 ? NAN : i % 11 == 5 ? -INFINITY : 8 * x[i]; break;
        case LOGITS_WIDE:
            x[i] = i % 49 == 0 && i / 49 < WIDE ? 0.3f - 0.3f * (float)(i / 49) / WIDE : -20;
            break;
        }
    }
    if (kind == LOGITS_HEAD)
        for (int j = 0; j < HEAD; j++) {
            int32_t id;
            bool taken;
            do { /* distinct ids */
                id = (int32_t)(rng_u64() % (uint64_t)n);
                taken = false;
                for (int m = 0; m < j; m++)
                    taken |= head_ids[m] == id;
            } while (taken);
            head_ids[j] = id;
            x[id] = 10.0f - (float)j;
        }
    return x;
}

/* n rows of V logits, row i of the kind kind_of(i) */
static float *make_block(int n, int64_t V, logit_kind (*kind_of)(int))
{
    float *x = malloc((size_t)(n * V) * 4);
    for (int i = 0; i < n; i++) {
        float *row = make_logits(V, kind_of(i));
        memcpy(x + (size_t)i * V, row, (size_t)V * 4);
        free(row);
    }
    return x;
}

static logit_kind random_head_ties(int i)
{
    return i % 3 == 0 ? LOGITS_RANDOM : i % 3 == 1 ? LOGITS_HEAD : LOGITS_TIES;
}

/* Fails unless the GPU's distribution got [n] keeps the tokens the CPU's ref keeps, with
 * values within rtol; returns how many tokens are kept. */
static int64_t expect_same_dist(const char *what, const float *got, const float *ref, int64_t n,
                                float rtol)
{
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) {
        if ((got[i] > 0) != (ref[i] > 0))
            fail_msg("%s: token %lld kept %s on the GPU (p %.9g), %s on the CPU (p %.9g)", what,
                     (long long)i, got[i] > 0 ? "yes" : "no", got[i], ref[i] > 0 ? "yes" : "no",
                     ref[i]);
        kept += got[i] > 0;
    }
    assert_true(check_close(what, got, ref, n, rtol, 1e-30f));
    return kept;
}

/* p of the CPU and of the GPU for the same logits and settings: the kept sets are equal
 * and the values within rtol. */
static void check_probs(const char *what, const float *logits, int64_t n, const ops_sampler *s,
                        float rtol)
{
    float *ref = malloc((size_t)n * 4);
    GPU_OK(cpu_sample_probs(ref, logits, n, s));
    float *dl = dput(logits, (size_t)n * 4), *dp = dpoison((size_t)n * 4);
    GPU_OK(cuda_sample_probs(dp, dl, n, s, gpu_st));
    float *got = dget(dp, (size_t)n * 4);
    expect_same_dist(what, got, ref, n, rtol);
    free(got);
    free(ref);
    cuda_mem_free(dl);
    cuda_mem_free(dp);
}

static const float *order_of; /* the logits order_cmp ranks */

/* cpu_topk's order: larger logit first, lower id first on ties (no NaN here) */
static int order_cmp(const void *a, const void *b)
{
    const int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    const float x = order_of[i], y = order_of[j];
    return x > y ? -1 : x < y ? 1 : (i > j) - (i < j);
}

/* A top_p whose cut keeps the first m + 1 entries of cpu_topk's order of logits[n] at
 * temperature t: the mass of the first m (the CPU's p) and half of the next, so the cut
 * lies half a token's mass away from any boundary. */
static float mid_of_order(const float *logits, int64_t n, float t, int64_t m)
{
    float *p = malloc((size_t)n * 4);
    int64_t *ids = malloc((size_t)n * sizeof *ids);
    GPU_OK(cpu_sample_probs(p, logits, n, &(ops_sampler){.temperature = t, .top_p = 1}));
    for (int64_t i = 0; i < n; i++)
        ids[i] = i;
    order_of = logits;
    qsort(ids, (size_t)n, sizeof *ids, order_cmp);
    double cum = 0;
    for (int64_t j = 0; j < m; j++)
        cum += p[ids[j]];
    const float mid = (float)(cum + p[ids[m]] / 2);
    free(ids);
    free(p);
    return mid;
}

/* The top-k path walks k candidates in f64 in the CPU's order: p within 2 ulp. The dense
 * and sorted paths compute exp in f32 from an f32 (logit - max) / temperature: |z| <= 30
 * here, so e is within 30 * 2^-24 + 2 ulp, and the f32-then-f64 sums add ~1e-6: 1e-5. */
#define RTOL_TOPK 2.4e-7f
#define RTOL_F32 1e-5f

static void test_sample_probs_match_cpu_on_every_path(void **state)
{
    (void)state;
    rng_seed(21);
    float *head = make_logits(VOCAB, LOGITS_HEAD);
    float *rnd = make_logits(VOCAB, LOGITS_RANDOM);
    float *ties = make_logits(5000, LOGITS_TIES);
    float *nans = make_logits(VOCAB, LOGITS_NAN);

    check_probs("greedy", rnd, VOCAB, &(ops_sampler){.temperature = 0, .top_p = 1}, 0);
    check_probs("greedy with NaN", nans, VOCAB, &(ops_sampler){.temperature = 0, .top_p = 1}, 0);
    check_probs("temperature", head, VOCAB, &(ops_sampler){.temperature = 0.7f, .top_p = 1},
                RTOL_F32);
    check_probs("top_k 20", rnd, VOCAB, &(ops_sampler){.temperature = 1, .top_k = 20, .top_p = 1},
                RTOL_TOPK);
    check_probs("top_k 40 top_p 0.9", rnd, VOCAB,
                &(ops_sampler){.temperature = 0.8f, .top_k = 40, .top_p = 0.9f}, RTOL_TOPK);
    check_probs("top_k 1024", rnd, VOCAB,
                &(ops_sampler){.temperature = 2, .top_k = 1024, .top_p = 0.5f}, RTOL_TOPK);
    check_probs("top_k 20 through ties", ties, 5000,
                &(ops_sampler){.temperature = 1, .top_k = 20, .top_p = 1}, RTOL_TOPK);
    check_probs("top_k 20 with NaN and -inf", nans, VOCAB,
                &(ops_sampler){.temperature = 1, .top_k = 20, .top_p = 1}, RTOL_TOPK);
    /* larger k: the sorted path; ties are cut by id as in cpu_topk */
    check_probs("top_k 1500 through ties", ties, 5000,
                &(ops_sampler){.temperature = 1, .top_k = 1500, .top_p = 1}, RTOL_F32);
    /* rows split between blocks (select.cuh): each slice's best merged by rank. Ties across
     * all 6 slices (the lowest ids win, all in the first), the best 1024 all in the last
     * slice, and a top-p walk of 500 tokens through ties */
    {
        const int64_t n = 100003;
        float *wt = make_logits(n, LOGITS_TIES);
        check_probs("top_k 20 through ties across slices", wt, n,
                    &(ops_sampler){.temperature = 1, .top_k = 20, .top_p = 1}, RTOL_TOPK);
        check_probs("top_k 1024 through ties across slices", wt, n,
                    &(ops_sampler){.temperature = 1, .top_k = 1024, .top_p = 1}, RTOL_TOPK);
        const float tp = mid_of_order(wt, n, 1.0f, 499);
        check_probs("top_p walk of 500 through ties across slices", wt, n,
                    &(ops_sampler){.temperature = 1, .top_p = tp}, RTOL_TOPK);
        for (int64_t i = 0; i < n; i++)
            wt[i] = i >= n - 2000 ? wt[i] + 6.5f : wt[i] - 4.0f;
        check_probs("top_k 1024 all in the last slice", wt, n,
                    &(ops_sampler){.temperature = 0.5f, .top_k = 1024, .top_p = 1}, RTOL_TOPK);
        free(wt);
    }

    /* top_p and min_p keep head tokens 0, 1, 2: the cut lies half a token's mass away from
     * any boundary, far from rounding questions (values from the CPU's own distribution) */
    float *p = malloc((size_t)VOCAB * 4);
    GPU_OK(cpu_sample_probs(p, head, VOCAB, &(ops_sampler){.temperature = 1, .top_p = 1}));
    const float mid = (p[head_ids[0]] + p[head_ids[1]] + p[head_ids[2]] / 2);
    check_probs("top_p (within the best 1024)", head, VOCAB,
                &(ops_sampler){.temperature = 1, .top_p = mid}, RTOL_TOPK);
    /* the same settings on a flat row: the kept set (1700 of WIDE tokens, the cut half a
     * token's mass inside the 1701st) reaches past the best 1024, so the row is cut by mass */
    float *wide = make_logits(VOCAB, LOGITS_WIDE);
    GPU_OK(cpu_sample_probs(p, wide, VOCAB, &(ops_sampler){.temperature = 1, .top_p = 1}));
    double cum = 0;
    for (int64_t j = 0; j < 1700; j++)
        cum += p[j * 49];
    const float mid_w = (float)(cum + p[1700 * 49] / 2);
    check_probs("top_p past the best 1024 (cut by mass)", wide, VOCAB,
                &(ops_sampler){.temperature = 1, .top_p = mid_w}, RTOL_F32);
    /* kept set of 1031: top_p of the mass is below 1024 of the best's, so the walk over the
     * best 1024 runs and falls short before the cut by mass */
    cum = 0;
    for (int64_t j = 0; j < 1030; j++)
        cum += p[j * 49];
    const float mid_w2 = (float)(cum + p[1030 * 49] / 2);
    check_probs("top_p just past the best 1024 (walked, then cut by mass)", wide, VOCAB,
                &(ops_sampler){.temperature = 1, .top_p = mid_w2}, RTOL_F32);
    check_probs("top_p past the best 1024, min_p (cut by mass)", wide, VOCAB,
                &(ops_sampler){.temperature = 1, .top_p = mid_w, .min_p = 0.95f}, RTOL_F32);
    free(wide);
    /* a cut inside a run of equal logits past the best 1024: the run keeps its lowest ids
     * (cpu_topk's order), here 3001 of the ~5000 tokens at the top value */
    float *flat = make_logits(VOCAB, LOGITS_TIES);
    check_probs("top_p inside a run of ties (cut by mass)", flat, VOCAB,
                &(ops_sampler){.temperature = 1, .top_p = mid_of_order(flat, VOCAB, 1, 3000)},
                RTOL_F32);
    /* a flat row (uniform logits), 1501 kept */
    check_probs("top_p of a flat row (cut by mass)", rnd, VOCAB,
                &(ops_sampler){.temperature = 1.5f, .top_p = mid_of_order(rnd, VOCAB, 1.5f, 1500)},
                RTOL_F32);
    free(flat);
    /* near-normal logits (sums of four uniforms), 150001 kept: the value bin of the cut holds
     * thousands of entries (checked here with the kernel's binning), so the cut goes on in
     * that bin's 256 sub-bins */
    float *bell = malloc((size_t)VOCAB * 4);
    float blo = INFINITY, bhi = -INFINITY;
    for (int64_t i = 0; i < VOCAB; i++) {
        bell[i] = 0.5f * (rng_f() + rng_f() + rng_f() + rng_f());
        blo = fminf(blo, bell[i]);
        bhi = fmaxf(bhi, bell[i]);
    }
    const float binv = 256.0f / (bhi - blo);
    int64_t *bord = malloc((size_t)VOCAB * sizeof *bord);
    for (int64_t i = 0; i < VOCAB; i++)
        bord[i] = i;
    order_of = bell;
    qsort(bord, (size_t)VOCAB, sizeof *bord, order_cmp);
    const int cut_bin = (int)fminf((bell[bord[150000]] - blo) * binv, 255.0f);
    int64_t in_bin = 0;
    for (int64_t i = 0; i < VOCAB; i++)
        in_bin += bell[i] > blo && (int)fminf((bell[i] - blo) * binv, 255.0f) == cut_bin;
    assert_true(in_bin > 1024);
    check_probs("top_p of near-normal logits (sub-bins)", bell, VOCAB,
                &(ops_sampler){.temperature = 1, .top_p = mid_of_order(bell, VOCAB, 1, 150000)},
                RTOL_F32);
    free(bord);
    free(bell);
    const float mp = 0.5f * (expf(-2) + expf(-3)); /* between e^-2 and e^-3 of the max */
    check_probs("min_p (dense)", head, VOCAB,
                &(ops_sampler){.temperature = 1, .top_p = 1, .min_p = mp}, RTOL_F32);
    check_probs("top_k 20 min_p", head, VOCAB,
                &(ops_sampler){.temperature = 1, .top_k = 20, .top_p = 1, .min_p = mp},
                RTOL_TOPK);
    GPU_OK(cpu_sample_probs(p, head, VOCAB,
                            &(ops_sampler){.temperature = 1, .top_k = 2000, .top_p = 1}));
    const float mid_k = (p[head_ids[0]] + p[head_ids[1]] + p[head_ids[2]] / 2);
    check_probs("top_k 2000 top_p (sorted)", head, VOCAB,
                &(ops_sampler){.temperature = 1, .top_k = 2000, .top_p = mid_k}, RTOL_F32);
    for (int64_t i = 0; i < VOCAB; i++) /* NaN and -inf in the tail: never kept */
        if (head[i] < 0 && i % 5 == 0)
            head[i] = i % 2 ? NAN : -INFINITY;
    check_probs("top_p over NaN and -inf", head, VOCAB,
                &(ops_sampler){.temperature = 1, .top_p = mid}, RTOL_TOPK);

    float one = 3.0f;
    check_probs("one token", &one, 1, &(ops_sampler){.temperature = 1, .top_k = 5, .top_p = 0.5f},
                0);
    free(p);
    free(head);
    free(rnd);
    free(ties);
    free(nans);
}

/* No finite logit: the CPU refuses; the GPU cannot say so without waiting, so p is zeros
 * on every path and a draw from it is -1. */
static void test_sample_without_finite_logit_gives_zeros_and_no_token(void **state)
{
    (void)state;
    const int64_t n = 40003; /* two slices of a split row (select.cuh) */
    float *x = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++)
        x[i] = i % 2 ? -INFINITY : NAN;
    const ops_sampler ss[] = {{.temperature = 0, .top_p = 1},
                              {.temperature = 1, .top_p = 1},
                              {.temperature = 1, .top_k = 10, .top_p = 1},
                              {.temperature = 1, .top_p = 0.9f}};
    float *ref = malloc((size_t)n * 4);
    float *dl = dput(x, (size_t)n * 4), *dp = dpoison((size_t)n * 4);
    int32_t *dt = dpoison(4);
    for (size_t c = 0; c < sizeof ss / sizeof ss[0]; c++) {
        assert_int_equal(cpu_sample_probs(ref, x, n, &ss[c]), TD_EINVAL);
        GPU_OK(cuda_mem_fill(dp, 0xFF, (size_t)n * 4, gpu_st));
        GPU_OK(cuda_sample_probs(dp, dl, n, &ss[c], gpu_st));
        float *got = dget(dp, (size_t)n * 4);
        for (int64_t i = 0; i < n; i++)
            if (got[i] != 0.0f)
                fail_msg("settings %zu: p[%lld] = %g", c, (long long)i, got[i]);
        GPU_OK(cuda_sample_draw(dt, dp, n, 1, 2, gpu_st));
        int32_t *tok = dget(dt, 4);
        assert_int_equal(*tok, -1);
        free(tok);
        free(got);
    }
    free(x);
    free(ref);
    cuda_mem_free(dl);
    cuda_mem_free(dp);
    cuda_mem_free(dt);
}

/* The same p uploaded: the GPU's token equals the CPU's for every (seed, step). */
static void check_draws(const char *what, const float *p, int64_t n, int draws)
{
    float *dp = dput(p, (size_t)n * 4);
    int32_t *dt = dpoison(4);
    for (int i = 0; i < draws; i++) {
        const uint64_t seed = rng_u64(), step = (uint64_t)i * 977 + (i % 3 == 0 ? 1ull << 40 : 0);
        GPU_OK(cuda_sample_draw(dt, dp, n, seed, step, gpu_st));
        int32_t *tok = dget(dt, 4);
        const int32_t want = cpu_sample_draw(p, n, seed, step);
        if (*tok != want)
            fail_msg("%s: draw %d (seed %llu step %llu): GPU %d, CPU %d", what, i,
                     (unsigned long long)seed, (unsigned long long)step, *tok, want);
        free(tok);
    }
    cuda_mem_free(dp);
    cuda_mem_free(dt);
}

static void test_sample_draw_matches_cpu_token_for_token(void **state)
{
    (void)state;
    rng_seed(22);
    float *logits = make_logits(VOCAB, LOGITS_RANDOM);
    float *p = malloc((size_t)VOCAB * 4);
    GPU_OK(cpu_sample_probs(p, logits, VOCAB, &(ops_sampler){.temperature = 1, .top_p = 1}));
    check_draws("dense vocabulary", p, VOCAB, 100);
    GPU_OK(cpu_sample_probs(p, logits, VOCAB,
                            &(ops_sampler){.temperature = 1, .top_k = 20, .top_p = 1}));
    check_draws("top_k 20", p, VOCAB, 100);
    /* not normalised, zeros in runs, fewer tokens than threads */
    for (int64_t i = 0; i < 1000; i++)
        p[i] = (i / 50) % 3 == 1 ? 0.0f : 3.7f * (float)(rng_u64() % 1000) / 1000.0f;
    check_draws("unnormalised with zero runs", p, 1000, 100);
    for (int64_t i = 0; i < 777; i++)
        p[i] = i == 776 ? 0.25f : 0.0f;
    check_draws("only the last token", p, 777, 10);
    /* rows split between blocks (select.cuh): zero runs across slice and chunk boundaries,
     * a single positive entry in the last and in the first chunk of an odd-length row */
    for (int64_t i = 0; i < 100003; i++)
        p[i] = (i / 7000) % 2 == 1 ? 0.0f : 2.5f * (float)(rng_u64() % 1000) / 1000.0f;
    check_draws("unnormalised with zero runs, 6 slices", p, 100003, 60);
    for (int64_t i = 0; i < 70001; i++)
        p[i] = i == 70000 ? 1e-30f : 0.0f;
    check_draws("only the last token of 70001", p, 70001, 10);
    for (int64_t i = 0; i < 70001; i++)
        p[i] = i == 3 ? 0.5f : 0.0f;
    check_draws("only token 3 of 70001", p, 70001, 10);
    free(p);
    free(logits);
}

/* cuda_sample_rows on 15 rows of the 27B vocabulary (a drafter's block; random, headed and
 * tied logits in turn), and on 70 rows of 40001, under each path of cuda_sample_probs (cuts
 * that rounding cannot move: a top-p cut inside arbitrary logits can, see above): every
 * row's q keeps the CPU's set within the paths' tolerance, every token is the CPU's draw
 * from the GPU's q with counter ctr + i * step, and equals the CPU's own token
 * (cpu_sample_rows) for these seeds. A row without a finite logit gives -1 there and leaves
 * the other rows as they were. */
/* cuda_sample_rows of N rows of V against the CPU under each path (see above). */
static void check_sample_rows(int N, int64_t V)
{
    float *logits = make_block(N, V, random_head_ties);
    const struct {
        ops_sampler s;
        float rtol;
    } cases[] = {
        {{.temperature = 0.8f, .top_p = 1, .seed = 31}, RTOL_F32},                 /* dense */
        {{.temperature = 1.0f, .top_k = 40, .top_p = 0.9f, .seed = 32}, RTOL_TOPK}, /* top-k */
        {{.temperature = 1.2f, .top_k = 1500, .top_p = 1, .seed = 33}, RTOL_F32},  /* sorted */
        {{.temperature = 0.6f, .top_p = 1, .min_p = 0.05f, .seed = 34}, RTOL_F32}, /* min_p */
    };
    const uint64_t ctr = ((uint64_t)1 << 33) + 6, step = 4;
    float *dl = dput(logits, (size_t)(N * V) * 4), *dq = dpoison((size_t)(N * V) * 4);
    int32_t *dt = dpoison((size_t)N * 4);
    float *want_q = malloc((size_t)(N * V) * 4);
    int32_t *want = malloc((size_t)N * sizeof *want);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const ops_sampler *s = &cases[c].s;
        GPU_OK(cuda_sample_rows(dt, dq, dl, N, V, s, ctr, step, gpu_st));
        GPU_OK(cpu_sample_rows(want, want_q, logits, N, V, s, ctr, step));
        int32_t *tok = dget(dt, (size_t)N * 4);
        float *q = dget(dq, (size_t)(N * V) * 4);
        for (int i = 0; i < N; i++) {
            const float *qi = q + (size_t)i * V, *wi = want_q + (size_t)i * V;
            char what[64];
            snprintf(what, sizeof what, "V %lld case %zu row %d", (long long)V, c, i);
            expect_same_dist(what, qi, wi, V, cases[c].rtol);
            const int32_t from_gpu_q = cpu_sample_draw(qi, V, s->seed, ctr + (uint64_t)i * step);
            if (tok[i] != from_gpu_q || tok[i] != want[i])
                fail_msg("%s: GPU token %d, CPU draw from the GPU's q %d, CPU %d", what, tok[i],
                         from_gpu_q, want[i]);
        }
        free(q);
        free(tok);
    }
    /* row 4 without a finite logit */
    for (int64_t j = 0; j < V; j++)
        logits[4 * V + j] = j % 2 ? -INFINITY : NAN;
    cuda_mem_free(dl);
    dl = dput(logits, (size_t)(N * V) * 4);
    GPU_OK(cuda_sample_rows(dt, dq, dl, N, V, &cases[0].s, ctr, step, gpu_st));
    int32_t *tok = dget(dt, (size_t)N * 4);
    assert_int_equal(tok[4], -1);
    for (int i = 0; i < N; i++) {
        if (i == 4)
            continue;
        GPU_OK(cpu_sample_probs(want_q, logits + (size_t)i * V, V, &cases[0].s));
        assert_int_equal(tok[i], cpu_sample_draw(want_q, V, cases[0].s.seed,
                                                 ctr + (uint64_t)i * step));
    }
    free(tok);
    free(want);
    free(want_q);
    free(logits);
    cuda_mem_free(dl);
    cuda_mem_free(dq);
    cuda_mem_free(dt);
}

static void test_sample_rows_match_cpu_row_for_row(void **state)
{
    (void)state;
    rng_seed(23);
    check_sample_rows(15, VOCAB);
    /* more rows than one launch of the split passes takes (RS_ROWS_WIDE), 2 slices each */
    check_sample_rows(70, 40001);
}

/* top_p alone over a block whose rows take both of its paths: headed rows keep a set inside
 * their best 1024 entries, flat rows (LOGITS_WIDE) are sorted, alone (rows 1, 5) and in a run
 * longer than one sort takes (rows 9..14). The cut (0.35) lies inside head token 1 (p 0.29 ->
 * 0.40) and inside the ~1750th of the flat rows' tokens (~2e-4 each), away from rounding. */
static logit_kind head_or_wide(int i)
{
    return i % 4 == 1 || i >= 9 ? LOGITS_WIDE : LOGITS_HEAD;
}

static void test_sample_rows_top_p_alone_takes_both_paths(void **state)
{
    (void)state;
    enum { N = 15 };
    rng_seed(24);
    const int64_t V = VOCAB;
    float *logits = make_block(N, V, head_or_wide);
    const ops_sampler s = {.temperature = 1, .top_p = 0.35f, .seed = 35};
    const uint64_t ctr = 12, step = 4;
    float *dl = dput(logits, (size_t)(N * V) * 4), *dq = dpoison((size_t)(N * V) * 4);
    int32_t *dt = dpoison(N * 4);
    float *want_q = malloc((size_t)(N * V) * 4);
    int32_t want[N];
    GPU_OK(cuda_sample_rows(dt, dq, dl, N, V, &s, ctr, step, gpu_st));
    GPU_OK(cpu_sample_rows(want, want_q, logits, N, V, &s, ctr, step));
    int32_t *tok = dget(dt, N * 4);
    float *q = dget(dq, (size_t)(N * V) * 4);
    for (int i = 0; i < N; i++) {
        const float *qi = q + (size_t)i * V, *wi = want_q + (size_t)i * V;
        char what[64];
        snprintf(what, sizeof what, "row %d", i);
        const bool wide = i % 4 == 1 || i >= 9;
        const int64_t kept = expect_same_dist(what, qi, wi, V, wide ? RTOL_F32 : RTOL_TOPK);
        if (wide ? kept <= 1024 : kept != 2)
            fail_msg("%s: %lld tokens kept", what, (long long)kept);
        /* the CPU's draw from the GPU's q; from its own q on the headed rows (within 2 ulp) */
        const int32_t from_gpu_q = cpu_sample_draw(qi, V, s.seed, ctr + (uint64_t)i * step);
        if (tok[i] != from_gpu_q || (!wide && tok[i] != want[i]))
            fail_msg("%s: GPU token %d, CPU draw from the GPU's q %d, CPU %d", what, tok[i],
                     from_gpu_q, want[i]);
    }
    free(q);
    free(tok);
    free(want_q);
    free(logits);
    cuda_mem_free(dl);
    cuda_mem_free(dq);
    cuda_mem_free(dt);
}

/* cuda_logprob_rows against cpu_logprob_rows on 16 rows of the 27B vocabulary (random,
 * headed, tied logits; a token outside the vocabulary in row 5): the same ranks and best
 * tokens in the same order, log probabilities within 1e-5 (f32 exponentials, f64 sums); and with no
 * alternatives asked, and over a short row. */
static void check_logprobs(const float *logits, const int32_t *tok, int64_t n, int64_t V,
                           int n_top)
{
    ops_logprob *want = malloc((size_t)n * sizeof *want);
    cpu_logprob_rows(want, logits, tok, n, V, n_top);
    float *dl = dput(logits, (size_t)(n * V) * 4);
    int32_t *dt = dput(tok, (size_t)n * 4);
    ops_logprob *dout = dpoison((size_t)n * sizeof *dout);
    GPU_OK(cuda_logprob_rows(dout, dl, dt, n, V, n_top, gpu_st));
    ops_logprob *got = dget(dout, (size_t)n * sizeof *got);
    for (int64_t i = 0; i < n; i++) {
        const ops_logprob *g = &got[i], *w = &want[i];
        const bool same_inf = isinf(w->logprob) && g->logprob == w->logprob;
        if (!(fabsf(g->logprob - w->logprob) <= 1e-5f || same_inf))
            fail_msg("row %lld (V %lld): log probability %.9g, CPU %.9g", (long long)i,
                     (long long)V, g->logprob, w->logprob);
        if (g->rank != w->rank)
            fail_msg("row %lld (V %lld): rank %d, CPU %d", (long long)i, (long long)V, g->rank,
                     w->rank);
        assert_int_equal(g->n_top, w->n_top);
        for (int j = 0; j < w->n_top; j++) {
            if (g->top_id[j] != w->top_id[j])
                fail_msg("row %lld: alternative %d is %d, CPU %d", (long long)i, j, g->top_id[j],
                         w->top_id[j]);
            if (!(fabsf(g->top_logprob[j] - w->top_logprob[j]) <= 1e-5f))
                fail_msg("row %lld: alternative %d log probability %.9g, CPU %.9g",
                         (long long)i, j, g->top_logprob[j], w->top_logprob[j]);
        }
    }
    free(got);
    free(want);
    cuda_mem_free(dl);
    cuda_mem_free(dt);
    cuda_mem_free(dout);
}

static void test_logprob_rows_match_cpu(void **state)
{
    (void)state;
    enum { N = 16 };
    rng_seed(25);
    const int64_t V = VOCAB;
    float *logits = make_block(N, V, random_head_ties);
    int32_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = i == 5 ? (int32_t)V : (int32_t)(rng_u64() % (uint64_t)V);
    tok[1] = head_ids[0];
    check_logprobs(logits, tok, N, V, OPS_TOP_LOGPROBS_MAX);
    check_logprobs(logits, tok, N, V, 0);
    const int32_t short_tok[3] = {3, 6, 0};
    check_logprobs(logits, short_tok, 3, 7, 5); /* the first 21 logits as 3 rows of 7 */
    free(logits);
    /* more rows than one launch of the split passes takes (RS_ROWS_WIDE), 2 slices each */
    enum { M = 70, W = 40001 };
    float *many = make_block(M, W, random_head_ties);
    int32_t mtok[M];
    for (int i = 0; i < M; i++)
        mtok[i] = (int32_t)(rng_u64() % W);
    check_logprobs(many, mtok, M, W, OPS_TOP_LOGPROBS_MAX);
    free(many);
}

/* Greedy acceptance: a = drafted tokens matching the argmax of the previous row, next =
 * argmax of row a; ties go to the lower id as cpu_argmax. */
static void test_accept_greedy_finds_accepted_prefix_and_next_token(void **state)
{
    (void)state;
    rng_seed(23);
    static const int64_t vocabs[] = {1000, VOCAB};
    for (size_t vi = 0; vi < 2; vi++) {
        const int64_t V = vocabs[vi], B = 16;
        float *x = make_logits(B * V, LOGITS_TIES);
        int32_t am[16];
        for (int64_t r = 0; r < B; r++)
            am[r] = (int32_t)cpu_argmax(x + r * V, V);
        float *dl = dput(x, (size_t)(B * V) * 4);
        int32_t *dam = dpoison((size_t)B * 4), *dres = dpoison(8);
        static const int64_t accepts[] = {0, 1, 7, 15};
        for (size_t c = 0; c < sizeof accepts / sizeof accepts[0]; c++) {
            const int64_t a = accepts[c];
            int32_t draft[15];
            for (int64_t i = 0; i < B - 1; i++)
                draft[i] = i < a ? am[i] : i == a ? (am[i] + 1) % (int32_t)V : am[i];
            int32_t *dd = dput(draft, sizeof draft);
            GPU_OK(cuda_accept_greedy(dam, dres, dl, dd, B, V, gpu_st));
            int32_t *res = dget(dres, 8), *gam = dget(dam, (size_t)B * 4);
            assert_true(check_same_bits("row argmax", gam, am, sizeof am));
            assert_int_equal(res[0], a);
            assert_int_equal(res[1], am[a]);
            free(res);
            free(gam);
            cuda_mem_free(dd);
        }
        /* a drafted id outside the vocabulary never matches */
        int32_t bad[15] = {-1};
        int32_t *dd = dput(bad, sizeof bad);
        GPU_OK(cuda_accept_greedy(dam, dres, dl, dd, B, V, gpu_st));
        int32_t *res = dget(dres, 8);
        assert_int_equal(res[0], 0);
        assert_int_equal(res[1], am[0]);
        free(res);
        /* a block of one token (nothing drafted): the next token only */
        GPU_OK(cuda_accept_greedy(dam, dres, dl, NULL, 1, V, gpu_st));
        res = dget(dres, 8);
        assert_int_equal(res[0], 0);
        assert_int_equal(res[1], am[0]);
        free(res);
        cuda_mem_free(dd);
        cuda_mem_free(dl);
        cuda_mem_free(dam);
        cuda_mem_free(dres);
        free(x);
    }
}

/* cuda_logit_add against cpu_logit_add (repetition factors on some entries): rows of a verify
 * block with many entries, some rows empty, at the edges of the vocabulary; the same bits. */
static void test_logit_add_matches_cpu(void **state)
{
    (void)state;
    rng_seed(31);
    const int64_t V = VOCAB, B = 16;
    float *x = make_logits(B * V, LOGITS_RANDOM);
    int32_t off[17];
    const int32_t per_row = 3000;
    ops_logit_add *add = malloc((size_t)(B * per_row) * sizeof *add);
    float *d = rng_floats(B * per_row, 2.0f);
    int32_t m = 0;
    for (int64_t r = 0; r < B; r++) {
        off[r] = m;
        const int32_t k = r % 5 == 2 ? 0 : r == 0 ? per_row : 1 + (int32_t)(r * 97 % per_row);
        for (int32_t j = 0; j < k; j++) /* distinct tokens: j spread over the vocabulary */
            add[m + j] = (ops_logit_add){(int32_t)(((int64_t)j * 82 + r) % V),
                                         j % 3 == 0 ? 1.3f : j % 5 == 1 ? 0.7f : 1.0f, d[m + j]};
        if (k > 1) {
            add[m] = (ops_logit_add){0, 1.0f, d[m]};
            add[m + 1] = (ops_logit_add){(int32_t)V - 1, 1.15f, d[m + 1]};
        }
        m += k;
    }
    off[B] = m;
    float *dl = dput(x, (size_t)(B * V) * 4);
    int32_t *doff = dput(off, sizeof off);
    ops_logit_add *dadd = dput(add, (size_t)m * sizeof *add);
    GPU_OK(cuda_logit_add(dl, B, V, doff, dadd, gpu_st));
    cpu_logit_add(x, B, V, off, add);
    float *got = dget(dl, (size_t)(B * V) * 4);
    assert_true(check_same_bits("logits plus additions", got, x, (size_t)(B * V) * 4));
    free(got);
    cuda_mem_free(dl);
    cuda_mem_free(doff);
    cuda_mem_free(dadd);
    free(add);
    free(d);
    free(x);
}

/* cuda_logit_mask against cpu_logit_mask: rows that allow everything, nothing, one token,
 * the last word's partial bits (a vocabulary not a multiple of 32), and random halves. */
static void test_logit_mask_matches_cpu(void **state)
{
    (void)state;
    rng_seed(37);
    const int64_t V = VOCAB + 7, B = 6, W = OPS_MASK_WORDS(V);
    float *x = make_logits(B * V, LOGITS_RANDOM);
    uint32_t *allow = calloc((size_t)(B * W), sizeof *allow);
    for (int64_t w = 0; w < W; w++) {
        allow[0 * W + w] = 0xffffffffu;
        allow[3 * W + w] = (uint32_t)rng_u64();
        allow[4 * W + w] = w % 3 ? 0xffffffffu : 0x5a5a5a5au;
    }
    allow[2 * W + (V - 1) / 32] = 1u << ((V - 1) % 32);
    allow[5 * W + W - 1] = 0xffffffffu; /* bits past V set: ignored */
    float *dl = dput(x, (size_t)(B * V) * 4);
    uint32_t *da = dput(allow, (size_t)(B * W) * 4);
    GPU_OK(cuda_logit_mask(dl, B, V, da, gpu_st));
    cpu_logit_mask(x, B, V, allow);
    assert_true(x[2 * V + V - 1] != -INFINITY && x[2 * V] == -INFINITY && x[V + 5] == -INFINITY);
    float *got = dget(dl, (size_t)(B * V) * 4);
    assert_true(check_same_bits("masked logits", got, x, (size_t)(B * V) * 4));
    free(got);
    cuda_mem_free(dl);
    cuda_mem_free(da);
    free(allow);
    free(x);
}

int main(void)
{
    if (!gpu_check_init())
        return SKIP_EXIT;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample_probs_match_cpu_on_every_path),
        cmocka_unit_test(test_sample_without_finite_logit_gives_zeros_and_no_token),
        cmocka_unit_test(test_sample_draw_matches_cpu_token_for_token),
        cmocka_unit_test(test_sample_rows_match_cpu_row_for_row),
        cmocka_unit_test(test_sample_rows_top_p_alone_takes_both_paths),
        cmocka_unit_test(test_logprob_rows_match_cpu),
        cmocka_unit_test(test_accept_greedy_finds_accepted_prefix_and_next_token),
        cmocka_unit_test(test_logit_add_matches_cpu),
        cmocka_unit_test(test_logit_mask_matches_cpu),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_check_free();
    return rc;
}

#endif /* TANDEM_HAVE_CUDA */
