/* cpu_matmul against a float64 reference on the dequantised weights (dequantisation itself
 * is pinned to gguf-py by test_ops_quant), for every supported type, at odd multiples of the
 * block size and at batch sizes 1, 3, 16, 64 and 70 (past one 64-token pass). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/ops.h"

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

/* Checks y = x . W^T for a rows x cols weight of type against sum_k x[t][k] * deq(W)[r][k]
 * in f64. The tolerance is relative to sum |x * w| (the scale of the rounding errors). */
static void check_matmul(td_dtype type, int64_t rows, int64_t cols, int64_t n_tok)
{
    float *wf = malloc((size_t)(rows * cols) * sizeof *wf);
    float *wd = malloc((size_t)(rows * cols) * sizeof *wd);
    float *x = malloc((size_t)(n_tok * cols) * sizeof *x);
    float *y = malloc((size_t)(n_tok * rows) * sizeof *y);
    uint64_t row_bytes;
    assert_int_equal(dtype_bytes(type, (uint64_t)cols, &row_bytes), TD_OK);
    uint8_t *q = malloc((size_t)(row_bytes * rows));
    fill(wf, rows * cols, 11u + (unsigned)type, 1.0);
    fill(x, n_tok * cols, 23u + (unsigned)n_tok, 2.0);
    for (int64_t r = 0; r < rows; r++) {
        assert_int_equal(cpu_quantize_row(type, wf + r * cols, q + r * row_bytes, cols), TD_OK);
        assert_int_equal(cpu_dequantize_row(type, q + r * row_bytes, wd + r * cols, cols), TD_OK);
    }
    ops_weight w;
    assert_int_equal(ops_weight_init(&w, type, rows, cols, q), TD_OK);
    cpu_matmul(y, x, &w, n_tok);
    for (int64_t t = 0; t < n_tok; t++) {
        for (int64_t r = 0; r < rows; r++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < cols; k++) {
                ref += (double)x[t * cols + k] * (double)wd[r * cols + k];
                mag += fabs((double)x[t * cols + k] * (double)wd[r * cols + k]);
            }
            double err = fabs((double)y[t * rows + r] - ref);
            if (err > 2e-6 * mag + 1e-30)
                fail_msg("%s %lldx%lld T=%lld: y[%lld][%lld] = %.9g, f64 %.9g (err %.3g, mag %.3g)",
                         dtype_name(type), (long long)rows, (long long)cols, (long long)n_tok,
                         (long long)t, (long long)r, y[t * rows + r], ref, err, mag);
        }
    }
    free(wf);
    free(wd);
    free(x);
    free(y);
    free(q);
}

static void check_all_batches(td_dtype type, int64_t rows, int64_t cols)
{
    const int64_t batches[] = {1, 3, 16, 64, 70};
    for (size_t i = 0; i < sizeof batches / sizeof batches[0]; i++)
        check_matmul(type, rows, cols, batches[i]);
}

static void test_matmul_f32_matches_f64_reference(void **s)
{
    (void)s;
    check_all_batches(TD_F32, 37, 301); /* cols past one tile, not a tile multiple */
}

static void test_matmul_f16_matches_f64_reference(void **s)
{
    (void)s;
    check_all_batches(TD_F16, 37, 301);
}

static void test_matmul_bf16_matches_f64_reference(void **s)
{
    (void)s;
    check_all_batches(TD_BF16, 29, 259);
}

static void test_matmul_q8_0_matches_f64_reference(void **s)
{
    (void)s;
    check_all_batches(TD_Q8_0, 37, 32 * 13); /* 416: one full tile and a partial one */
}

static void test_matmul_q4_k_matches_f64_reference(void **s)
{
    (void)s;
    check_all_batches(TD_Q4_K, 37, 256 * 3);
}

static void test_matmul_q5_k_matches_f64_reference(void **s)
{
    (void)s;
    check_all_batches(TD_Q5_K, 33, 256 * 3);
}

static void test_matmul_q6_k_matches_f64_reference(void **s)
{
    (void)s;
    check_all_batches(TD_Q6_K, 35, 256 * 5);
}

static void test_matmul_large_rows_split_across_threads(void **s)
{
    (void)s;
    /* big enough to take the OpenMP path, wide enough (17 tiles) to sum many tiles */
    check_matmul(TD_Q4_K, 301, 256 * 17, 5);
}

static void test_matmul_exact_small_integers(void **s)
{
    (void)s;
    /* Hand-checked: W = [[1,2,3],[-1,0,4]] (F32), x = [[1,1,1],[2,0,-1]] ->
     * y = [[6,3],[-1,-6]]. */
    const float wv[6] = {1, 2, 3, -1, 0, 4};
    const float x[6] = {1, 1, 1, 2, 0, -1};
    float y[4];
    ops_weight w;
    assert_int_equal(ops_weight_init(&w, TD_F32, 2, 3, wv), TD_OK);
    cpu_matmul(y, x, &w, 2);
    assert_true(y[0] == 6 && y[1] == 3 && y[2] == -1 && y[3] == -6);
}

/* x_bf16: the product reads x rounded to bf16, nearest even. Hand-checked on one F32 weight
 * of 1: 1 + 2^-10 reads as 1, 1 + 3 * 2^-8 (halfway between bf16 neighbours 1 + 2^-7 and
 * 1 + 2^-6) as the even one, 1 + 2^-6. Then for every type and batch sizes up to past one
 * batch: the bits of cpu_matmul on x rounded by ops_f32_to_bf16, and not those of x itself. */
static void test_matmul_x_bf16_reads_rounded_inputs(void **s)
{
    (void)s;
    const float one = 1.0f, xs[2] = {1.0f + 0x1p-10f, 1.0f + 3 * 0x1p-8f};
    float y[2];
    ops_weight w;
    assert_int_equal(ops_weight_init(&w, TD_F32, 1, 1, &one), TD_OK);
    assert_false(w.x_bf16);
    w.x_bf16 = true;
    cpu_matmul(y, xs, &w, 2);
    assert_true(y[0] == 1.0f && y[1] == 1.0f + 0x1p-6f);

    static const td_dtype types[] = {TD_F32, TD_F16, TD_BF16, TD_Q8_0, TD_Q4_K, TD_Q6_K};
    static const int64_t batches[] = {1, 16, 70};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        const td_dtype type = types[i];
        const int64_t rows = 21, cols = 256 * 3;
        uint64_t row_bytes;
        assert_int_equal(dtype_bytes(type, (uint64_t)cols, &row_bytes), TD_OK);
        float *wf = malloc((size_t)(rows * cols) * sizeof *wf);
        uint8_t *q = malloc((size_t)(row_bytes * rows));
        fill(wf, rows * cols, 5u + (unsigned)type, 1.0);
        for (int64_t r = 0; r < rows; r++)
            assert_int_equal(cpu_quantize_row(type, wf + r * cols, q + r * row_bytes, cols),
                             TD_OK);
        assert_int_equal(ops_weight_init(&w, type, rows, cols, q), TD_OK);
        for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
            const int64_t n = batches[b];
            float *x = malloc((size_t)(n * cols) * sizeof *x);
            float *xr = malloc((size_t)(n * cols) * sizeof *xr);
            float *got = malloc((size_t)(n * rows) * sizeof *got);
            float *want = malloc((size_t)(n * rows) * sizeof *want);
            float *exact = malloc((size_t)(n * rows) * sizeof *exact);
            fill(x, n * cols, 29u + (unsigned)n, 2.0);
            for (int64_t k = 0; k < n * cols; k++)
                xr[k] = ops_bf16_to_f32(ops_f32_to_bf16(x[k]));
            w.x_bf16 = false;
            cpu_matmul(want, xr, &w, n);
            cpu_matmul(exact, x, &w, n);
            w.x_bf16 = true;
            cpu_matmul(got, x, &w, n);
            assert_memory_equal(got, want, (size_t)(n * rows) * sizeof *got);
            assert_memory_not_equal(got, exact, (size_t)(n * rows) * sizeof *got);
            free(x);
            free(xr);
            free(got);
            free(want);
            free(exact);
        }
        free(wf);
        free(q);
    }
}

/* A GPU's feature ring keeps the target's tap features as bf16 (cpu_to_bf16, nearest even,
 * NaN kept NaN), and the drafter reads them back exactly (cpu_from_bf16): a product with
 * x_bf16, as every drafter product on a GPU, then gives the bits it gives on the f32
 * features. */
static void test_bf16_storage_is_lossless_for_x_bf16_products(void **s)
{
    (void)s;
    static const uint32_t in[] = {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x80000000u,
                                  0x7f800000u, 0x7fc00001u, 0x477fe000u, 0x7f7fffffu};
    static const uint16_t want16[] = {0x3f80, 0x3f82, 0x3f81, 0x8000,
                                      0x7f80, 0x7fc0, 0x4780, 0x7f80};
    float f[8], back[8];
    uint16_t h[8];
    memcpy(f, in, sizeof f);
    cpu_to_bf16(h, f, 8);
    assert_memory_equal(h, want16, sizeof h);
    cpu_from_bf16(back, h, 8);
    for (int i = 0; i < 8; i++) {
        uint32_t b;
        memcpy(&b, &back[i], 4);
        assert_int_equal(b, (uint32_t)want16[i] << 16);
    }
    const int64_t rows = 37, cols = 512, n = 9;
    float *w32 = malloc((size_t)(rows * cols) * sizeof *w32);
    float *x = malloc((size_t)(n * cols) * sizeof *x);
    float *xr = malloc((size_t)(n * cols) * sizeof *xr);
    uint16_t *x16 = malloc((size_t)(n * cols) * sizeof *x16);
    float *y = malloc((size_t)(n * rows) * sizeof *y);
    float *yr = malloc((size_t)(n * rows) * sizeof *yr);
    fill(w32, rows * cols, 41u, 1.0);
    fill(x, n * cols, 43u, 30.0);
    ops_weight w;
    assert_int_equal(ops_weight_init(&w, TD_F32, rows, cols, w32), TD_OK);
    w.x_bf16 = true;
    cpu_to_bf16(x16, x, n * cols);
    cpu_from_bf16(xr, x16, n * cols);
    cpu_matmul(y, x, &w, n);
    cpu_matmul(yr, xr, &w, n);
    assert_memory_equal(y, yr, (size_t)(n * rows) * sizeof *y);
    assert_memory_not_equal(x, xr, (size_t)(n * cols) * sizeof *x);
    free(w32), free(x), free(xr), free(x16), free(y), free(yr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_exact_small_integers),
        cmocka_unit_test(test_bf16_storage_is_lossless_for_x_bf16_products),
        cmocka_unit_test(test_matmul_f32_matches_f64_reference),
        cmocka_unit_test(test_matmul_f16_matches_f64_reference),
        cmocka_unit_test(test_matmul_bf16_matches_f64_reference),
        cmocka_unit_test(test_matmul_q8_0_matches_f64_reference),
        cmocka_unit_test(test_matmul_q4_k_matches_f64_reference),
        cmocka_unit_test(test_matmul_q5_k_matches_f64_reference),
        cmocka_unit_test(test_matmul_q6_k_matches_f64_reference),
        cmocka_unit_test(test_matmul_large_rows_split_across_threads),
        cmocka_unit_test(test_matmul_x_bf16_reads_rounded_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
