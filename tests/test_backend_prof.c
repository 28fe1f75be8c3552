/* The profiling wrapper over the CPU backend: ops give exactly the plain backend's results,
 * every call is counted under its op, pausing and resetting work, per-step figures divide by
 * the marked steps, and TANDEM_PROFILE is read as documented. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/backend_prof.h"

static const ops_prof_row *find_row(const ops_prof_table *t, const char *op)
{
    for (int i = 0; i < t->n_rows; i++)
        if (!strcmp(t->rows[i].op, op))
            return &t->rows[i];
    return NULL;
}

static void test_prof_counts_each_call_and_keeps_results(void **state)
{
    (void)state;
    const ops_backend *cpu = ops_backend_cpu();
    ops_backend *be;
    assert_int_equal(ops_prof_wrap(&be, cpu), TD_OK);
    assert_true(ops_prof_active(be));
    assert_false(ops_prof_active(cpu));
    assert_ptr_equal(ops_prof_inner(be), cpu);
    assert_int_equal(be->kind, OPS_BACKEND_CPU);
    char where[32];
    ops_backend_describe(be, where, sizeof where); /* the profiler is where its inner is */
    assert_string_equal(where, "cpu");

    enum { N = 64, ROWS = 8 };
    float a[N], b[N], got[N], want[N], w[ROWS * N], y[2 * ROWS], yw[2 * ROWS];
    for (int i = 0; i < N; i++) {
        a[i] = 0.25f * (float)i - 3.0f;
        b[i] = 1.0f / (float)(i + 1);
    }
    for (int i = 0; i < ROWS * N; i++)
        w[i] = (float)((i * 7) % 13) - 6.0f;
    ops_weight wt;
    assert_int_equal(ops_weight_init(&wt, TD_F32, ROWS, N, w), TD_OK);

    for (int k = 0; k < 3; k++)
        assert_int_equal(be->add(be, got, a, b, N), TD_OK);
    cpu_add(want, a, b, N);
    assert_memory_equal(got, want, sizeof got);
    assert_int_equal(be->matmul(be, y, a, &wt, 1), TD_OK);
    ops_prof_step(be);
    float x2[2 * N];
    memcpy(x2, a, sizeof a);
    memcpy(x2 + N, b, sizeof b);
    assert_int_equal(be->matmul(be, y, x2, &wt, 2), TD_OK);
    cpu_matmul(yw, x2, &wt, 2);
    assert_memory_equal(y, yw, sizeof y);
    ops_prof_step(be);

    /* paused: passes through uncounted */
    ops_prof_enable(be, false);
    assert_int_equal(be->silu(be, got, a, N), TD_OK);
    cpu_silu(want, a, N);
    assert_memory_equal(got, want, sizeof got);
    ops_prof_step(be);
    ops_prof_enable(be, true);

    ops_prof_table t;
    assert_int_equal(ops_prof_snapshot(be, &t), TD_OK);
    assert_int_equal(t.n_rows, 2);
    assert_false(t.device_timed);
    assert_int_equal(t.steps, 2);
    assert_int_equal(t.lost, 0);
    const ops_prof_row *add = find_row(&t, "add"), *mm = find_row(&t, "matmul");
    assert_non_null(add);
    assert_non_null(mm);
    assert_null(find_row(&t, "silu"));
    assert_int_equal(add->calls, 3);
    assert_int_equal(mm->calls, 2);
    assert_int_equal(add->launches, 0); /* no kernels on the CPU */
    assert_true(add->dev_us >= 0 && add->dev_us == add->host_us);
    /* rows come by decreasing time */
    assert_true(t.rows[0].dev_us >= t.rows[1].dev_us);

    /* the table prints per step: 1.5 add calls per step of the 2 marked */
    char buf[4096] = "";
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    assert_non_null(f);
    ops_prof_print(f, "phase x", &t, 1.0);
    fclose(f);
    assert_non_null(strstr(buf, "phase x: per step, host clock (CPU backend)"));
    assert_non_null(strstr(buf, "(2 steps)"));
    const char *line = strstr(buf, "\n  add ");
    assert_non_null(line);
    double calls = 0, launches = -1;
    assert_int_equal(sscanf(line + 6, "%lf %lf", &calls, &launches), 2);
    assert_true(calls == 1.5 && launches == 0.0);
    assert_non_null(strstr(buf, "\n  total "));
    assert_non_null(strstr(buf, "wall 1.000 ms per step"));

    ops_prof_reset(be);
    assert_int_equal(ops_prof_snapshot(be, &t), TD_OK);
    assert_int_equal(t.n_rows, 0);
    assert_int_equal(t.steps, 0);
    ops_prof_free(be);
}

/* A plain backend has no profile: the calls do nothing and the snapshot is empty. */
static void test_prof_calls_on_a_plain_backend_do_nothing(void **state)
{
    (void)state;
    const ops_backend *cpu = ops_backend_cpu();
    ops_prof_enable(cpu, true);
    ops_prof_reset(cpu);
    ops_prof_step(cpu);
    ops_prof_table t;
    t.n_rows = 7;
    assert_int_equal(ops_prof_snapshot(cpu, &t), TD_OK);
    assert_int_equal(t.n_rows, 0);
    assert_ptr_equal(ops_prof_inner(cpu), cpu);
    assert_null(cpu->prof);
}

/* Skipped ops return at once and leave their outputs alone; others still run; bad lists are
 * refused and leave the list in force. */
static void test_prof_skip_ops(void **state)
{
    (void)state;
    ops_backend *be;
    assert_int_equal(ops_prof_wrap(&be, ops_backend_cpu()), TD_OK);
    enum { N = 8 };
    float a[N], b[N], got[N], want[N];
    for (int i = 0; i < N; i++) {
        a[i] = (float)i - 2.5f;
        b[i] = 0.5f * (float)i;
    }
    assert_int_equal(ops_prof_skip(be, "silu,add"), TD_OK);
    for (int i = 0; i < N; i++)
        got[i] = 42.0f;
    assert_int_equal(be->add(be, got, a, b, N), TD_OK);
    assert_int_equal(be->silu(be, got, a, N), TD_OK);
    for (int i = 0; i < N; i++)
        assert_true(got[i] == 42.0f);
    assert_int_equal(be->mul(be, got, a, b, N), TD_OK);
    cpu_mul(want, a, b, N);
    assert_memory_equal(got, want, sizeof got);

    assert_int_equal(ops_prof_skip(be, "add,sigmoidx"), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "'sigmoidx'"));
    assert_int_equal(ops_prof_skip(be, "copy"), TD_EINVAL);
    assert_int_equal(ops_prof_skip(be, "mul,,add"), TD_EINVAL); /* empty items name nothing */
    assert_non_null(strstr(err_msg(), "no op named ''"));
    assert_int_equal(ops_prof_skip(be, "mul,"), TD_EINVAL);
    assert_int_equal(be->silu(be, got, a, N), TD_OK); /* silu is still skipped */
    assert_memory_equal(got, want, sizeof got);

    assert_int_equal(ops_prof_skip(be, ""), TD_OK);
    assert_int_equal(be->add(be, got, a, b, N), TD_OK);
    cpu_add(want, a, b, N);
    assert_memory_equal(got, want, sizeof got);
    ops_prof_free(be);
}

static void test_prof_environment_switch(void **state)
{
    (void)state;
    unsetenv("TANDEM_PROFILE");
    assert_false(ops_prof_wanted());
    setenv("TANDEM_PROFILE", "", 1);
    assert_false(ops_prof_wanted());
    setenv("TANDEM_PROFILE", "0", 1);
    assert_false(ops_prof_wanted());
    setenv("TANDEM_PROFILE", "1", 1);
    assert_true(ops_prof_wanted());
    setenv("TANDEM_PROFILE", "yes", 1);
    assert_true(ops_prof_wanted());
    unsetenv("TANDEM_PROFILE");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prof_counts_each_call_and_keeps_results),
        cmocka_unit_test(test_prof_calls_on_a_plain_backend_do_nothing),
        cmocka_unit_test(test_prof_skip_ops),
        cmocka_unit_test(test_prof_environment_switch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
