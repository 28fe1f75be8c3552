/* Golden data accessors for the ops tests (see ops_golden.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/ops_golden.h"

static void die(const char *what, const char *name)
{
    fprintf(stderr, "golden file %s %s (regenerate it with its scripts/ generator)\n", what,
            name);
    abort();
}

gguf_file *golden_open_path(const char *path)
{
    gguf_file *g = NULL;
    if (gguf_open(&g, path) != TD_OK) {
        fprintf(stderr, "cannot open %s: %s\n", path, err_msg());
        abort();
    }
    return g;
}

gguf_file *golden_open(void)
{
    return golden_open_path(OPS_GOLDEN_PATH);
}

static const gguf_tensor *find(const gguf_file *g, const char *name)
{
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t)
        die("has no tensor", name);
    return t;
}

int64_t golden_count(const gguf_file *g, const char *name)
{
    const gguf_tensor *t = find(g, name);
    int64_t n = 1;
    for (uint32_t i = 0; i < t->n_dims; i++)
        n *= t->ne[i];
    return n;
}

const void *golden_tensor(const gguf_file *g, const char *name, td_dtype type, int64_t n)
{
    const gguf_tensor *t = find(g, name);
    if (t->type != type)
        die("unexpected type of tensor", name);
    if (golden_count(g, name) != n)
        die("unexpected element count of tensor", name);
    return t->data;
}

uint32_t golden_u32(const gguf_file *g, const char *key)
{
    uint32_t v;
    if (gguf_get_u32(g, key, &v) != TD_OK)
        die("has no u32", key);
    return v;
}

int64_t golden_i64(const gguf_file *g, const char *key)
{
    int64_t v;
    if (gguf_get_i64(g, key, &v) != TD_OK)
        die("has no integer", key);
    return v;
}

float golden_f32(const gguf_file *g, const char *key)
{
    float v;
    if (gguf_get_f32(g, key, &v) != TD_OK)
        die("has no float", key);
    return v;
}

int golden_str_is(const gguf_file *g, const char *key, const char *s)
{
    gguf_str v;
    if (gguf_get_str(g, key, &v) != TD_OK)
        die("has no string", key);
    return gguf_str_eq(v, s);
}

double golden_max_abs_diff(const float *a, const float *b, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(d))
            return INFINITY;
        if (d > m)
            m = d;
    }
    return m;
}

double golden_range_error(const float *got, const float *want, int64_t n, int64_t *at)
{
    double lo = INFINITY, hi = -INFINITY, worst = 0;
    *at = 0;
    for (int64_t i = 0; i < n; i++) {
        lo = fmin(lo, want[i]);
        hi = fmax(hi, want[i]);
    }
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= worst)) { /* NaN counts as the worst */
            worst = d;
            *at = i;
        }
    }
    return hi > lo ? worst / (hi - lo) : worst;
}
