/* Quant layouts and element conversions: dequantisation of random blocks bit-identical to
 * gguf-py, f16/bf16 conversions bit-identical to numpy/gguf-py, the quantisers' round-trip
 * error within each type's bound, and clear errors for bad types, sizes and row ids. */
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

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void dequant_matches_gguf_py(td_dtype type, const char *name)
{
    char raw_name[64], out_name[64];
    snprintf(raw_name, sizeof raw_name, "deq.%s.raw", name);
    snprintf(out_name, sizeof out_name, "deq.%s.out", name);
    int64_t n = golden_count(G, out_name);
    const void *raw = golden_tensor(G, raw_name, type, n);
    const float *want = golden_tensor(G, out_name, TD_F32, n);
    float *got = malloc((size_t)n * sizeof *got);
    assert_int_equal(cpu_dequantize_row(type, raw, got, n), TD_OK);
    for (int64_t i = 0; i < n; i++) {
        if (bits_of(got[i]) != bits_of(want[i]))
            fail_msg("%s element %lld: got %.9g want %.9g", name, (long long)i, got[i], want[i]);
    }
    free(got);
}

static void test_dequant_q8_0_matches_gguf_py(void **s)
{
    (void)s;
    dequant_matches_gguf_py(TD_Q8_0, "Q8_0");
}

static void test_dequant_q4_k_matches_gguf_py(void **s)
{
    (void)s;
    dequant_matches_gguf_py(TD_Q4_K, "Q4_K");
}

static void test_dequant_q5_k_matches_gguf_py(void **s)
{
    (void)s;
    dequant_matches_gguf_py(TD_Q5_K, "Q5_K");
}

static void test_dequant_q6_k_matches_gguf_py(void **s)
{
    (void)s;
    dequant_matches_gguf_py(TD_Q6_K, "Q6_K");
}

static void test_f16_to_f32_matches_numpy_for_every_class(void **s)
{
    (void)s;
    int64_t n = golden_count(G, "cvt.f16_bits");
    const uint16_t *h = golden_tensor(G, "cvt.f16_bits", TD_F16, n);
    const float *want = golden_tensor(G, "cvt.f16_to_f32", TD_F32, n);
    float *row = malloc((size_t)n * sizeof *row);
    assert_int_equal(cpu_dequantize_row(TD_F16, h, row, n), TD_OK);
    for (int64_t i = 0; i < n; i++) {
        if (isnan(want[i])) {
            /* NaN stays NaN with its sign; the payload may come back quieted (F16C does) */
            assert_true(isnan(ops_f16_to_f32(h[i])) && isnan(row[i]));
            assert_int_equal(bits_of(row[i]) >> 31, bits_of(want[i]) >> 31);
            continue;
        }
        assert_int_equal(bits_of(ops_f16_to_f32(h[i])), bits_of(want[i]));
        assert_int_equal(bits_of(row[i]), bits_of(want[i]));
    }
    free(row);
}

static void test_f32_to_f16_rounds_like_numpy(void **s)
{
    (void)s;
    int64_t n = golden_count(G, "cvt.f32");
    const float *x = golden_tensor(G, "cvt.f32", TD_F32, n);
    const uint16_t *want = golden_tensor(G, "cvt.f32_to_f16", TD_F16, n);
    uint16_t *row = malloc((size_t)n * sizeof *row);
    assert_int_equal(cpu_quantize_row(TD_F16, x, row, n), TD_OK);
    for (int64_t i = 0; i < n; i++) {
        if (ops_f32_to_f16(x[i]) != want[i] || row[i] != want[i])
            fail_msg("f32 %.9g (0x%08x): got 0x%04x want 0x%04x", x[i], bits_of(x[i]),
                     ops_f32_to_f16(x[i]), want[i]);
    }
    /* NaN stays NaN */
    uint16_t nan = ops_f32_to_f16(NAN);
    assert_true((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff) != 0);
    free(row);
}

static void test_f32_to_bf16_rounds_like_gguf_py(void **s)
{
    (void)s;
    int64_t n = golden_count(G, "cvt.f32");
    const float *x = golden_tensor(G, "cvt.f32", TD_F32, n);
    const uint16_t *want = golden_tensor(G, "cvt.f32_to_bf16", TD_BF16, n);
    uint16_t *row = malloc((size_t)n * sizeof *row);
    float *back = malloc((size_t)n * sizeof *back);
    assert_int_equal(cpu_quantize_row(TD_BF16, x, row, n), TD_OK);
    assert_int_equal(cpu_dequantize_row(TD_BF16, row, back, n), TD_OK);
    for (int64_t i = 0; i < n; i++) {
        assert_int_equal(row[i], want[i]);
        assert_int_equal(bits_of(back[i]), (uint32_t)want[i] << 16);
    }
    free(row);
    free(back);
}

/* Random values with a spread of magnitudes per block (some blocks all positive, some with
 * outliers), so scales, mins and sub-block ranges all vary. */
static void fill_test_values(float *x, int64_t n, unsigned seed)
{
    srand(seed);
    for (int64_t i = 0; i < n; i++) {
        double u = (rand() + 0.5) / ((double)RAND_MAX + 1.0);
        double v = (rand() + 0.5) / ((double)RAND_MAX + 1.0);
        double g = sqrt(-2 * log(u)) * cos(2 * M_PI * v); /* normal(0, 1) */
        int64_t blk = i / 256;
        double mag = (blk % 3 == 0) ? 0.02 : (blk % 3 == 1) ? 1.0 : 30.0;
        x[i] = (float)(g * mag + (blk % 4 == 3 ? 3 * mag : 0));
        if (i % 97 == 5)
            x[i] *= 8; /* outlier */
    }
}

/* Max |x - dequant(quant(x))| per block must stay under bound(block) for the type: a
 * quantiser that clips or mis-packs a single value fails. */
static void roundtrip_within_bound(td_dtype type, int64_t n)
{
    float *x = malloc((size_t)n * sizeof *x);
    float *y = malloc((size_t)n * sizeof *y);
    uint64_t bytes;
    assert_int_equal(dtype_bytes(type, (uint64_t)n, &bytes), TD_OK);
    void *q = malloc(bytes);
    fill_test_values(x, n, 1234u + (unsigned)type);
    assert_int_equal(cpu_quantize_row(type, x, q, n), TD_OK);
    assert_int_equal(cpu_dequantize_row(type, q, y, n), TD_OK);
    const int64_t blk = 256;
    for (int64_t b = 0; b < n / blk; b++) {
        float amax = 0, mn = 0, mx = 0;
        for (int64_t i = b * blk; i < (b + 1) * blk; i++) {
            amax = fmaxf(amax, fabsf(x[i]));
            mn = fminf(mn, x[i]);
            mx = fmaxf(mx, x[i]);
        }
        double bound;
        switch (type) {
        case TD_F16: bound = amax * 0x1p-11 + 0x1p-25; break;  /* half an ulp */
        case TD_BF16: bound = amax * 0x1p-8; break;
        case TD_Q8_0: bound = amax / 127.0 * 0.5 * 1.01; break; /* half a step of the block */
        /* half a step, the step being range/levels, plus the scale's own rounding */
        case TD_Q6_K: bound = amax / 31.0 * 0.5 * 1.02 + amax / 31.0 / 127.0; break;
        case TD_Q5_K: bound = (mx - mn) / 31.0 * 0.5 * 1.05 + (mx - mn) / 31.0 / 63.0 + 1e-6; break;
        case TD_Q4_K: bound = (mx - mn) / 15.0 * 0.5 * 1.05 + (mx - mn) / 15.0 / 63.0 + 1e-6; break;
        default: bound = 0; break;
        }
        for (int64_t i = b * blk; i < (b + 1) * blk; i++) {
            double err = fabs((double)x[i] - (double)y[i]);
            if (!(err <= bound))
                fail_msg("%s block %lld value %lld: x %.7g back %.7g err %.3g > bound %.3g",
                         dtype_name(type), (long long)b, (long long)i, x[i], y[i], err, bound);
        }
    }
    free(x);
    free(y);
    free(q);
}

static void test_quantise_roundtrip_error_bounds(void **s)
{
    (void)s;
    const td_dtype types[] = {TD_F16, TD_BF16, TD_Q8_0, TD_Q4_K, TD_Q5_K, TD_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        roundtrip_within_bound(types[i], 256 * 12);
}

static void test_quantise_zero_block_is_exact_zero(void **s)
{
    (void)s;
    const td_dtype types[] = {TD_Q8_0, TD_Q4_K, TD_Q5_K, TD_Q6_K};
    float x[256] = {0}, y[256];
    uint8_t q[8 * 34]; /* the largest: 256 values of Q8_0 */
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        assert_int_equal(cpu_quantize_row(types[i], x, q, 256), TD_OK);
        assert_int_equal(cpu_dequantize_row(types[i], q, y, 256), TD_OK);
        for (int j = 0; j < 256; j++)
            assert_true(y[j] == 0.0f);
    }
}

static void test_unsupported_type_and_partial_block_are_errors(void **s)
{
    (void)s;
    float x[64] = {0};
    uint8_t q[256] = {0};
    assert_int_equal(cpu_dequantize_row(TD_Q4_0, q, x, 32), TD_ENOTSUP);
    assert_true(strstr(err_msg(), "Q4_0") != NULL);
    assert_int_equal(cpu_quantize_row(TD_Q3_K, x, q, 256), TD_ENOTSUP);
    assert_int_equal(cpu_dequantize_row(TD_Q8_0, q, x, 48), TD_EINVAL);
    assert_true(strstr(err_msg(), "48") != NULL);
    assert_int_equal(cpu_quantize_row(TD_Q6_K, x, q, 64), TD_EINVAL);

    ops_weight w;
    assert_int_equal(ops_weight_init(&w, TD_Q4_K, 4, 512, q), TD_OK);
    assert_int_equal(w.row_bytes, 2 * 144);
    assert_int_equal(ops_weight_init(&w, TD_Q8_0, 3, 96, q), TD_OK);
    assert_int_equal(w.row_bytes, 3 * 34);
    assert_int_equal(ops_weight_init(&w, TD_Q4_K, 4, 100, q), TD_EINVAL);
    assert_int_equal(ops_weight_init(&w, TD_IQ2_XS, 4, 256, q), TD_ENOTSUP);
    assert_int_equal(ops_weight_init(&w, TD_F32, 0, 8, q), TD_EINVAL);
    assert_int_equal(ops_weight_init(&w, TD_F32, INT64_MAX / 2, 8, q), TD_EINVAL);
}

static void test_get_rows_returns_dequantised_rows_and_rejects_bad_ids(void **s)
{
    (void)s;
    enum { ROWS = 5, COLS = 512 };
    float x[ROWS * COLS], want[COLS], got[3 * COLS];
    uint8_t q[ROWS * 2 * 176];
    fill_test_values(x, ROWS * COLS, 77);
    ops_weight w;
    assert_int_equal(ops_weight_init(&w, TD_Q5_K, ROWS, COLS, q), TD_OK);
    for (int r = 0; r < ROWS; r++)
        assert_int_equal(cpu_quantize_row(TD_Q5_K, x + r * COLS, q + r * w.row_bytes, COLS), TD_OK);
    const int32_t ids[3] = {4, 0, 4};
    assert_int_equal(cpu_get_rows(got, &w, ids, 3), TD_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cpu_dequantize_row(TD_Q5_K, q + ids[i] * w.row_bytes, want, COLS), TD_OK);
        assert_memory_equal(got + i * COLS, want, sizeof want);
    }
    const int32_t bad[2] = {1, 5};
    assert_int_equal(cpu_get_rows(got, &w, bad, 2), TD_ERANGE);
    assert_true(strstr(err_msg(), "5") != NULL);
    const int32_t neg[1] = {-1};
    assert_int_equal(cpu_get_rows(got, &w, neg, 1), TD_ERANGE);
}

int main(void)
{
    G = golden_open();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_q8_0_matches_gguf_py),
        cmocka_unit_test(test_dequant_q4_k_matches_gguf_py),
        cmocka_unit_test(test_dequant_q5_k_matches_gguf_py),
        cmocka_unit_test(test_dequant_q6_k_matches_gguf_py),
        cmocka_unit_test(test_f16_to_f32_matches_numpy_for_every_class),
        cmocka_unit_test(test_f32_to_f16_rounds_like_numpy),
        cmocka_unit_test(test_f32_to_bf16_rounds_like_gguf_py),
        cmocka_unit_test(test_quantise_roundtrip_error_bounds),
        cmocka_unit_test(test_quantise_zero_block_is_exact_zero),
        cmocka_unit_test(test_unsupported_type_and_partial_block_are_errors),
        cmocka_unit_test(test_get_rows_returns_dequantised_rows_and_rejects_bad_ids),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gguf_close(G);
    return rc;
}
