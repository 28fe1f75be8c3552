/* RoPE, norms, softmax, activations, argmax and top-k. RoPE, norms and softmax against numpy
 * float64 (golden file); activations against the double-precision formulas from libm,
 * including the extremes where a naive formula overflows. */
#include <float.h>
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

static void rope_case(const char *name)
{
    char key[64];
#define K(s) (snprintf(key, sizeof key, "rope.%s.%s", name, s), key)
    const int64_t n_head = golden_u32(G, K("n_head"));
    const int64_t D = golden_u32(G, K("head_dim"));
    const int64_t n_rot = golden_u32(G, K("n_rot"));
    const float theta = golden_f32(G, K("theta"));
    const int64_t n_tok = golden_count(G, K("pos"));
    const int32_t *pos = golden_tensor(G, K("pos"), TD_I32, n_tok);
    /* per head D values to rotate then D gate values that must pass untouched */
    const float *x0 = golden_tensor(G, K("x"), TD_F32, n_tok * n_head * 2 * D);
    const float *ref = golden_tensor(G, K("ref"), TD_F32, n_tok * n_head * D);
    float *x = malloc((size_t)(n_tok * n_head * 2 * D) * sizeof *x);
    memcpy(x, x0, (size_t)(n_tok * n_head * 2 * D) * sizeof *x);
    cpu_rope_neox(x, n_tok, n_head, n_head * 2 * D, 2 * D, n_rot, pos, theta);
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t h = 0; h < n_head; h++)
            for (int64_t d = 0; d < 2 * D; d++) {
                int64_t i = (t * n_head + h) * 2 * D + d;
                if (d >= D) {
                    assert_true(x[i] == x0[i]);
                    continue;
                }
                float want = ref[(t * n_head + h) * D + d];
                if (fabsf(x[i] - want) > 2e-6f * (1 + fabsf(want)))
                    fail_msg("rope %s t=%lld h=%lld d=%lld: %.9g want %.9g", name,
                             (long long)t, (long long)h, (long long)d, x[i], want);
            }
    free(x);
#undef K
}

static void test_rope_partial_rotary_qwen35_layout(void **s)
{
    (void)s;
    rope_case("partial");
}

static void test_rope_full_rotary(void **s)
{
    (void)s;
    rope_case("full");
}

static void test_rmsnorm_and_l2norm_match_numpy(void **s)
{
    (void)s;
    enum { R = 5, N = 40 };
    const float *x = golden_tensor(G, "norm.x", TD_F32, R * N);
    const float *w = golden_tensor(G, "norm.w", TD_F32, N);
    const float eps = golden_f32(G, "norm.eps");
    const float *rms_ref = golden_tensor(G, "norm.rms_ref", TD_F32, R * N);
    const float *l2_ref = golden_tensor(G, "norm.l2_ref", TD_F32, R * N);
    float out[R * N];
    cpu_rmsnorm(out, x, w, R, N, N, eps);
    assert_true(golden_max_abs_diff(out, rms_ref, R * N) < 2e-6);
    cpu_l2norm(out, x, R, N, N, eps);
    assert_true(golden_max_abs_diff(out, l2_ref, R * N) < 2e-7);
}

static void test_rmsnorm_strided_in_place_without_weight(void **s)
{
    (void)s;
    /* rows of 3 at stride 5 (the other 2 values, like a gate, stay put):
     * [3, 4, 0] has rms sqrt(25/3) -> [3, 4, 0] / 2.88675... */
    float x[10] = {3, 4, 0, 9, 9, -6, 8, 0, 9, 9};
    cpu_rmsnorm(x, x, NULL, 2, 3, 5, 0);
    const double r = sqrt(25.0 / 3.0), r2 = sqrt(100.0 / 3.0);
    assert_true(fabs(x[0] - 3 / r) < 1e-6 && fabs(x[1] - 4 / r) < 1e-6 && x[2] == 0);
    assert_true(fabs(x[5] + 6 / r2) < 1e-6 && fabs(x[6] - 8 / r2) < 1e-6 && x[7] == 0);
    assert_true(x[3] == 9 && x[4] == 9 && x[8] == 9 && x[9] == 9);
    /* l2: [3, 4] -> [0.6, 0.8] */
    float y[2] = {3, 4};
    cpu_l2norm(y, y, 1, 2, 2, 0);
    assert_true(fabsf(y[0] - 0.6f) < 1e-7f && fabsf(y[1] - 0.8f) < 1e-7f);
}

static void test_softmax_matches_numpy_with_large_logits(void **s)
{
    (void)s;
    enum { R = 4, N = 33 };
    const float *x = golden_tensor(G, "softmax.x", TD_F32, R * N);
    const float *ref = golden_tensor(G, "softmax.ref", TD_F32, R * N);
    float out[R * N];
    cpu_softmax(out, x, R, N);
    for (int i = 0; i < R * N; i++)
        assert_true(fabsf(out[i] - ref[i]) <= 1e-7f + 1e-6f * ref[i]);
}

static void test_activations_match_double_formulas(void **s)
{
    (void)s;
    const float x[] = {-100, -30, -5, -1, -1e-3f, 0, 1e-3f, 0.5f, 1, 3, 20, 88, 100};
    enum { N = sizeof x / sizeof x[0] };
    float sig[N], silu[N], sp[N], sw[N], up[N];
    for (int i = 0; i < N; i++)
        up[i] = 0.5f * (float)i - 2;
    cpu_sigmoid(sig, x, N);
    cpu_silu(silu, x, N);
    cpu_softplus(sp, x, N);
    cpu_swiglu(sw, x, up, N);
    /* relative error bounds; below FLT_MIN (subnormal results) an absolute FLT_MIN */
    for (int i = 0; i < N; i++) {
        double xd = x[i];
        double sg = 1.0 / (1.0 + exp(-xd));
        double spd = xd > 30 ? xd + log1p(exp(-xd)) : log1p(exp(xd));
        assert_true(isfinite(sig[i]) && isfinite(sp[i]));
        assert_true(fabs(sig[i] - sg) <= 1e-7 * sg + FLT_MIN);
        if (!(fabs(silu[i] - xd * sg) <= 2e-7 * fabs(xd * sg) + FLT_MIN))
            fail_msg("silu(%g) = %.9g, want %.9g", xd, silu[i], xd * sg);
        assert_true(fabs(sp[i] - spd) <= 2e-7 * spd + FLT_MIN);
        assert_true(fabs(sw[i] - xd * sg * up[i]) <= 3e-7 * fabs(xd * sg * up[i]) + FLT_MIN);
    }
    /* softplus(-100) is e^-100 ~ 3.7e-44 (a subnormal float), not 0 and not log(1) noise */
    assert_true(sp[0] > 0 && sp[0] < 1e-43f);
    float a[3] = {1, 2, 3}, b[3] = {4, -5, 0.5f}, o[3];
    cpu_add(o, a, b, 3);
    assert_true(o[0] == 5 && o[1] == -3 && o[2] == 3.5f);
    cpu_mul(o, a, b, 3);
    assert_true(o[0] == 4 && o[1] == -10 && o[2] == 1.5f);
    cpu_scale(o, a, -2, 3);
    assert_true(o[0] == -2 && o[1] == -4 && o[2] == -6);
}

static void test_argmax_first_of_ties_and_never_nan(void **s)
{
    (void)s;
    const float a[] = {1, 5, 3, 5, -1};
    assert_int_equal(cpu_argmax(a, 5), 1);
    const float b[] = {NAN, -INFINITY, -3, NAN, -2};
    assert_int_equal(cpu_argmax(b, 5), 4);
    const float c[] = {-INFINITY};
    assert_int_equal(cpu_argmax(c, 1), 0);
}

static void test_topk_sorted_with_lower_index_first_on_ties(void **s)
{
    (void)s;
    const float x[] = {0.1f, 0.9f, 0.3f, 0.9f, NAN, 0.5f, 0.3f, -1, 0.3f};
    int32_t idx[9];
    float val[9];
    cpu_topk(idx, val, x, 9, 5);
    const int32_t want[5] = {1, 3, 5, 2, 6};
    for (int i = 0; i < 5; i++)
        assert_int_equal(idx[i], want[i]);
    assert_true(val[0] == 0.9f && val[2] == 0.5f && val[4] == 0.3f);
    cpu_topk(idx, NULL, x, 9, 9); /* all: NaN last */
    const int32_t all[9] = {1, 3, 5, 2, 6, 8, 0, 7, 4};
    for (int i = 0; i < 9; i++)
        assert_int_equal(idx[i], all[i]);
    cpu_topk(idx, val, x, 9, 1);
    assert_int_equal(idx[0], 1);
}

int main(void)
{
    G = golden_open();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_partial_rotary_qwen35_layout),
        cmocka_unit_test(test_rope_full_rotary),
        cmocka_unit_test(test_rmsnorm_and_l2norm_match_numpy),
        cmocka_unit_test(test_rmsnorm_strided_in_place_without_weight),
        cmocka_unit_test(test_softmax_matches_numpy_with_large_logits),
        cmocka_unit_test(test_activations_match_double_formulas),
        cmocka_unit_test(test_argmax_first_of_ties_and_never_nan),
        cmocka_unit_test(test_topk_sorted_with_lower_index_first_on_ties),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gguf_close(G);
    return rc;
}
