/* The CPU backend's matmul_multi (the twin of cuda_matmul_multi): every member's output is
 * bit for bit cpu_matmul of its own weight, written where that member says, for mixed groups
 * (Q4_K + Q4_K + Q6_K as attn_q/k/v of a Q4_K_M file; Q5_K, Q8_0, BF16, F16, F32 members) at
 * n_tok 1, 5, 16, 33 and 70 (past one 64-token pass); outputs are poisoned with NaN first,
 * so a member left unwritten or written to another's buffer fails. Through the profiler a
 * group is one call of its own row. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/backend.h"
#include "kernels/backend_prof.h"

#define MAX_TOK 70
#define MAX_MEM 7

static double uniform01(unsigned *st)
{
    *st = *st * 1103515245u + 12345u;
    return ((*st >> 8) + 0.5) / (double)(1u << 24);
}

static void fill(float *x, int64_t n, unsigned seed, double mag)
{
    unsigned st = seed;
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)((2 * uniform01(&st) - 1) * mag);
}

typedef struct member {
    td_dtype type;
    int64_t rows;
} member;

typedef struct group {
    int64_t cols;
    int n;
    member m[MAX_MEM];
} group;

static const group groups[] = {
    {512, 3, {{TD_Q4_K, 48}, {TD_Q4_K, 16}, {TD_Q6_K, 16}}},
    {768, 4, {{TD_Q4_K, 33}, {TD_Q6_K, 17}, {TD_BF16, 9}, {TD_F32, 5}}},
    {512, 7,
     {{TD_BF16, 16}, {TD_Q6_K, 31}, {TD_F16, 8}, {TD_Q4_K, 64}, {TD_Q8_0, 19}, {TD_Q5_K, 48},
      {TD_F32, 7}}},
    {256, 1, {{TD_Q8_0, 3}}},
};

static const int64_t n_toks[] = {1, 5, 16, 33, MAX_TOK};

typedef struct group_run {
    ops_weight w[MAX_MEM];
    ops_mm_out out[MAX_MEM]; /* [MAX_TOK][rows] each */
    float *want[MAX_MEM];    /* cpu_matmul of each member alone */
} group_run;

static void run_init(group_run *g, const group *gr, unsigned seed)
{
    for (int i = 0; i < gr->n; i++) {
        const int64_t rows = gr->m[i].rows, cols = gr->cols;
        uint64_t rb = 0;
        assert_int_equal(dtype_bytes(gr->m[i].type, (uint64_t)cols, &rb), TD_OK);
        uint8_t *q = malloc((size_t)(rb * (uint64_t)rows));
        float *f = malloc((size_t)cols * sizeof(float));
        assert_non_null(q);
        assert_non_null(f);
        for (int64_t r = 0; r < rows; r++) {
            fill(f, cols, seed + 97u * (unsigned)i + (unsigned)r, 1.0);
            assert_int_equal(cpu_quantize_row(gr->m[i].type, f, q + r * rb, cols), TD_OK);
        }
        free(f);
        assert_int_equal(ops_weight_init(&g->w[i], gr->m[i].type, rows, cols, q), TD_OK);
        g->out[i].y = malloc((size_t)(MAX_TOK * rows) * sizeof(float));
        g->out[i].w = &g->w[i];
        g->want[i] = malloc((size_t)(MAX_TOK * rows) * sizeof(float));
        assert_non_null(g->out[i].y);
        assert_non_null(g->want[i]);
    }
}

static void run_free(group_run *g, const group *gr)
{
    for (int i = 0; i < gr->n; i++) {
        free((void *)g->w[i].data);
        free(g->out[i].y);
        free(g->want[i]);
    }
}

static void poison(const group_run *g, const group *gr)
{
    for (int i = 0; i < gr->n; i++)
        memset(g->out[i].y, 0xFF, (size_t)(MAX_TOK * gr->m[i].rows) * sizeof(float));
}

static void expect_members(const group_run *g, const group *gr, int64_t n, size_t k)
{
    for (int i = 0; i < gr->n; i++) {
        const size_t bytes = (size_t)(n * gr->m[i].rows) * sizeof(float);
        if (memcmp(g->out[i].y, g->want[i], bytes)) {
            for (size_t e = 0; e < bytes / sizeof(float); e++)
                if (memcmp(&g->out[i].y[e], &g->want[i][e], sizeof(float)))
                    fail_msg("group %zu n_tok %lld member %d (%s): element %zu is %.9g, "
                             "cpu_matmul %.9g", k, (long long)n, i,
                             dtype_name(gr->m[i].type), e, g->out[i].y[e], g->want[i][e]);
        }
    }
}

static void test_matmul_multi_cpu_equals_each_matmul_bit_for_bit(void **state)
{
    (void)state;
    const ops_backend *be = ops_backend_cpu();
    for (size_t k = 0; k < sizeof groups / sizeof *groups; k++) {
        const group *gr = &groups[k];
        group_run g;
        run_init(&g, gr, 1000u * (unsigned)k + 1u);
        float *x = malloc((size_t)(MAX_TOK * gr->cols) * sizeof(float));
        assert_non_null(x);
        fill(x, MAX_TOK * gr->cols, 77u + (unsigned)k, 2.0);
        for (size_t j = 0; j < sizeof n_toks / sizeof *n_toks; j++) {
            const int64_t n = n_toks[j];
            for (int i = 0; i < gr->n; i++)
                cpu_matmul(g.want[i], x, &g.w[i], n);
            poison(&g, gr);
            assert_int_equal(be->matmul_multi(be, x, g.out, gr->n, n), TD_OK);
            expect_members(&g, gr, n, k);
            /* a quantised output is finite and not all zero: the comparison saw real data */
            assert_true(isfinite(g.out[0].y[0]) && g.out[0].y[0] != 0.0f);
        }
        free(x);
        run_free(&g, gr);
    }
}

static void test_matmul_multi_is_one_profiled_call(void **state)
{
    (void)state;
    ops_backend *be;
    assert_int_equal(ops_prof_wrap(&be, ops_backend_cpu()), TD_OK);
    const group *gr = &groups[0];
    group_run g;
    run_init(&g, gr, 5u);
    float *x = malloc((size_t)(MAX_TOK * gr->cols) * sizeof(float));
    assert_non_null(x);
    fill(x, MAX_TOK * gr->cols, 3u, 1.0);
    for (int i = 0; i < gr->n; i++)
        cpu_matmul(g.want[i], x, &g.w[i], 5);
    poison(&g, gr);
    assert_int_equal(be->matmul_multi(be, x, g.out, gr->n, 5), TD_OK);
    expect_members(&g, gr, 5, 0);
    assert_int_equal(be->matmul_multi(be, x, g.out, 2, 5), TD_OK);
    ops_prof_table t;
    assert_int_equal(ops_prof_snapshot(be, &t), TD_OK);
    assert_int_equal(t.n_rows, 1);
    assert_string_equal(t.rows[0].op, "matmul_multi");
    assert_int_equal(t.rows[0].calls, 2);
    assert_int_equal(t.rows[0].launches, 0); /* no kernels on the CPU */
    free(x);
    run_free(&g, gr);
    ops_prof_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_multi_cpu_equals_each_matmul_bit_for_bit),
        cmocka_unit_test(test_matmul_multi_is_one_profiled_call),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
