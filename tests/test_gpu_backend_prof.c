/* The profiler over the CUDA backend: device times from events, kernel launches counted per
 * op (the quantised matmul: activation rounding + main kernel per 64-token chunk; one token
 * on sm_90 one kernel, which rounds x itself), results bit-identical to the plain backend's.
 * Skipped (77) without a CUDA device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/backend_prof.h"
#include "kernels/cuda_mem.h"
#include "tests/support/gpu_check.h"

static ops_backend *gpu;

static const ops_prof_row *find_row(const ops_prof_table *t, const char *op)
{
    for (int i = 0; i < t->n_rows; i++)
        if (!strcmp(t->rows[i].op, op))
            return &t->rows[i];
    return NULL;
}

static void *up(const ops_backend *be, const void *h, size_t bytes)
{
    void *d = NULL;
    assert_int_equal(ops_backend_upload(be, &d, h, bytes), TD_OK);
    return d;
}

static void test_gpu_prof_times_counts_and_keeps_results(void **state)
{
    (void)state;
    enum { COLS = 512, ROWS = 96, NT = 65 };
    float *x = malloc(sizeof(float) * COLS * NT), *w = malloc(sizeof(float) * COLS * ROWS);
    for (int i = 0; i < COLS * NT; i++)
        x[i] = sinf(0.37f * (float)i);
    for (int i = 0; i < COLS * ROWS; i++)
        w[i] = cosf(0.11f * (float)i) * 0.05f;
    uint64_t rb = 0;
    assert_int_equal(dtype_bytes(TD_Q4_K, COLS, &rb), TD_OK);
    size_t row_bytes = (size_t)rb;
    uint8_t *wq = malloc(row_bytes * ROWS);
    for (int r = 0; r < ROWS; r++)
        assert_int_equal(cpu_quantize_row(TD_Q4_K, w + r * COLS, wq + r * row_bytes, COLS), TD_OK);

    ops_backend *be;
    assert_int_equal(ops_prof_wrap(&be, gpu), TD_OK);
    float *dx = up(gpu, x, sizeof(float) * COLS * NT);
    void *dw = up(gpu, wq, row_bytes * ROWS);
    ops_weight wt;
    assert_int_equal(ops_weight_init(&wt, TD_Q4_K, ROWS, COLS, dw), TD_OK);
    float *ya = NULL, *yb = NULL;
    assert_int_equal(gpu->alloc(gpu, (void **)&ya, sizeof(float) * ROWS * NT), TD_OK);
    assert_int_equal(gpu->alloc(gpu, (void **)&yb, sizeof(float) * ROWS * NT), TD_OK);

    /* warm-up outside the profile (scratch growth) */
    assert_int_equal(gpu->matmul(gpu, yb, dx, &wt, NT), TD_OK);
    assert_int_equal(gpu->sync(gpu), TD_OK);
    ops_prof_reset(be);
    assert_int_equal(be->matmul(be, ya, dx, &wt, 1), TD_OK);   /* one chunk */
    assert_int_equal(be->matmul(be, ya, dx, &wt, NT), TD_OK);  /* two chunks */
    for (int k = 0; k < 3; k++)
        assert_int_equal(be->add(be, dx, dx, dx, COLS), TD_OK);
    ops_prof_step(be);
    assert_int_equal(be->sync(be), TD_OK);

    ops_prof_table t;
    assert_int_equal(ops_prof_snapshot(be, &t), TD_OK);
    assert_true(t.device_timed);
    assert_int_equal(t.lost, 0);
    const ops_prof_row *mm = find_row(&t, "matmul"), *add = find_row(&t, "add");
    assert_non_null(mm);
    assert_non_null(add);
    assert_int_equal(mm->calls, 2);
    /* 1 token: the single-token path; 65 tokens: a 64-token chunk (rounding and kernel),
     * then a 1-token chunk on the single-token path */
    assert_int_equal(mm->launches, 2 * gpu_check_one_token_launches() + 2);
    assert_int_equal(add->calls, 3);
    assert_int_equal(add->launches, 3);
    assert_true(mm->dev_us > 0 && add->dev_us > 0);

    /* the same matmul through the plain table: the same bits */
    assert_int_equal(gpu->matmul(gpu, yb, dx, &wt, NT), TD_OK);
    assert_int_equal(be->matmul(be, ya, dx, &wt, NT), TD_OK);
    float *a = malloc(sizeof(float) * ROWS * NT), *b = malloc(sizeof(float) * ROWS * NT);
    assert_int_equal(be->to_host(be, a, ya, sizeof(float) * ROWS * NT), TD_OK);
    assert_int_equal(gpu->to_host(gpu, b, yb, sizeof(float) * ROWS * NT), TD_OK);
    assert_memory_equal(a, b, sizeof(float) * ROWS * NT);

    gpu->release(gpu, dx);
    gpu->release(gpu, dw);
    gpu->release(gpu, ya);
    gpu->release(gpu, yb);
    ops_prof_free(be);
    free(a);
    free(b);
    free(x);
    free(w);
    free(wq);
}

int main(void)
{
    unsetenv("TANDEM_PROFILE"); /* the plain table, wrapped by the test itself */
    if (!cuda_available() || ops_backend_cuda_init(&gpu, 0) != TD_OK) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_prof_times_counts_and_keeps_results),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ops_backend_cuda_free(gpu);
    return rc;
}
