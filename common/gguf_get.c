/* GGUF lookups and typed access: hashed key and tensor lookup, getters that convert between
 * integer widths only when the value fits, and bounds-checked array element access. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "common/gguf.h"
#include "common/gguf_internal.h"

static const char *const gguf_type_names[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_UINT8] = "UINT8",     [GGUF_TYPE_INT8] = "INT8",       [GGUF_TYPE_UINT16] = "UINT16",
    [GGUF_TYPE_INT16] = "INT16",     [GGUF_TYPE_UINT32] = "UINT32",   [GGUF_TYPE_INT32] = "INT32",
    [GGUF_TYPE_FLOAT32] = "FLOAT32", [GGUF_TYPE_BOOL] = "BOOL",       [GGUF_TYPE_STRING] = "STRING",
    [GGUF_TYPE_ARRAY] = "ARRAY",     [GGUF_TYPE_UINT64] = "UINT64",   [GGUF_TYPE_INT64] = "INT64",
    [GGUF_TYPE_FLOAT64] = "FLOAT64",
};

const char *gguf_type_name(gguf_type t)
{
    if ((unsigned)t >= GGUF_TYPE_COUNT)
        return "?";
    return gguf_type_names[t];
}

bool gguf_str_eq(gguf_str s, const char *c)
{
    TD_ASSERT(c);
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

/* Entry index of name in t, or UINT64_MAX. */
static uint64_t table_find(const gguf_table *t, const char *name, uint64_t len,
                           const char *(*name_of)(const void *ctx, uint64_t i, uint64_t *len),
                           const void *ctx)
{
    for (uint64_t s = gguf_hash(name, len) & t->mask; t->slots[s]; s = (s + 1) & t->mask) {
        uint64_t olen;
        const char *o = name_of(ctx, t->slots[s] - 1, &olen);
        if (olen == len && memcmp(o, name, len) == 0)
            return t->slots[s] - 1;
    }
    return UINT64_MAX;
}

const gguf_value *gguf_get(const gguf_file *g, const char *key)
{
    TD_ASSERT(g && key);
    uint64_t i = table_find(&g->arena->keys, key, strlen(key), gguf_kv_name, g);
    return i == UINT64_MAX ? NULL : &g->kv[i].value;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name)
{
    TD_ASSERT(g && name);
    uint64_t i = table_find(&g->arena->tensors, name, strlen(name), gguf_tensor_name, g);
    return i == UINT64_MAX ? NULL : &g->tensors[i];
}

/* --- conversions (what: "key 'x'" or "element 3" for messages) ---------------------------- */

static bool type_is_unsigned(gguf_type t)
{
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64;
}

static bool type_is_signed(gguf_type t)
{
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}

static td_err value_u64(const gguf_value *v, uint64_t max, const char *what, uint64_t *out)
{
    if (type_is_unsigned(v->type) && v->u64 <= max) {
        *out = v->u64;
        return TD_OK;
    }
    if (type_is_signed(v->type) && v->i64 >= 0 && (uint64_t)v->i64 <= max) {
        *out = (uint64_t)v->i64;
        return TD_OK;
    }
    if (type_is_unsigned(v->type))
        return err_set(TD_EFORMAT, "%s = %llu does not fit in %llu", what, (unsigned long long)v->u64,
                       (unsigned long long)max);
    if (type_is_signed(v->type))
        return err_set(TD_EFORMAT, "%s = %lld does not fit in 0..%llu", what, (long long)v->i64,
                       (unsigned long long)max);
    return err_set(TD_EFORMAT, "%s is %s, expected an unsigned integer", what, gguf_type_name(v->type));
}

static td_err value_i64(const gguf_value *v, const char *what, int64_t *out)
{
    if (type_is_signed(v->type)) {
        *out = v->i64;
        return TD_OK;
    }
    if (type_is_unsigned(v->type) && v->u64 <= INT64_MAX) {
        *out = (int64_t)v->u64;
        return TD_OK;
    }
    if (type_is_unsigned(v->type))
        return err_set(TD_EFORMAT, "%s = %llu does not fit in int64", what, (unsigned long long)v->u64);
    return err_set(TD_EFORMAT, "%s is %s, expected an integer", what, gguf_type_name(v->type));
}

static td_err value_f64(const gguf_value *v, const char *what, double *out)
{
    if (v->type == GGUF_TYPE_FLOAT32 || v->type == GGUF_TYPE_FLOAT64)
        *out = v->f64;
    else if (type_is_unsigned(v->type))
        *out = (double)v->u64;
    else if (type_is_signed(v->type))
        *out = (double)v->i64;
    else
        return err_set(TD_EFORMAT, "%s is %s, expected a number", what, gguf_type_name(v->type));
    return TD_OK;
}

/* --- typed getters ---------------------------------------------------------------------- */

static td_err get_value(const gguf_file *g, const char *key, const gguf_value **v, char *what, size_t cap)
{
    *v = gguf_get(g, key);
    if (!*v)
        return err_set(TD_ENOENT, "key '%s' not found", key);
    snprintf(what, cap, "key '%s'", key);
    return TD_OK;
}

td_err gguf_get_u32(const gguf_file *g, const char *key, uint32_t *out)
{
    const gguf_value *v;
    char what[320];
    TD_TRY(get_value(g, key, &v, what, sizeof what));
    uint64_t x = 0;
    TD_TRY(value_u64(v, UINT32_MAX, what, &x));
    *out = (uint32_t)x;
    return TD_OK;
}

td_err gguf_get_u64(const gguf_file *g, const char *key, uint64_t *out)
{
    const gguf_value *v;
    char what[320];
    TD_TRY(get_value(g, key, &v, what, sizeof what));
    return value_u64(v, UINT64_MAX, what, out);
}

td_err gguf_get_i64(const gguf_file *g, const char *key, int64_t *out)
{
    const gguf_value *v;
    char what[320];
    TD_TRY(get_value(g, key, &v, what, sizeof what));
    return value_i64(v, what, out);
}

td_err gguf_get_f32(const gguf_file *g, const char *key, float *out)
{
    const gguf_value *v;
    char what[320];
    TD_TRY(get_value(g, key, &v, what, sizeof what));
    double d = 0;
    TD_TRY(value_f64(v, what, &d));
    if (isfinite(d) && fabs(d) > FLT_MAX)
        return err_set(TD_EFORMAT, "%s = %g is out of float32 range", what, d);
    *out = (float)d;
    return TD_OK;
}

td_err gguf_get_bool(const gguf_file *g, const char *key, bool *out)
{
    const gguf_value *v;
    char what[320];
    TD_TRY(get_value(g, key, &v, what, sizeof what));
    if (v->type != GGUF_TYPE_BOOL)
        return err_set(TD_EFORMAT, "%s is %s, expected BOOL", what, gguf_type_name(v->type));
    *out = v->b;
    return TD_OK;
}

td_err gguf_get_str(const gguf_file *g, const char *key, gguf_str *out)
{
    const gguf_value *v;
    char what[320];
    TD_TRY(get_value(g, key, &v, what, sizeof what));
    if (v->type != GGUF_TYPE_STRING)
        return err_set(TD_EFORMAT, "%s is %s, expected STRING", what, gguf_type_name(v->type));
    *out = v->str;
    return TD_OK;
}

td_err gguf_get_arr(const gguf_file *g, const char *key, const gguf_value **out)
{
    const gguf_value *v;
    char what[320];
    TD_TRY(get_value(g, key, &v, what, sizeof what));
    if (v->type != GGUF_TYPE_ARRAY)
        return err_set(TD_EFORMAT, "%s is %s, expected ARRAY", what, gguf_type_name(v->type));
    *out = v;
    return TD_OK;
}

/* --- array elements --------------------------------------------------------------------- */

/* Element i of a numeric or bool array decoded into *v. */
static td_err arr_elem(const gguf_value *arr, uint64_t i, gguf_value *v)
{
    TD_ASSERT(arr);
    if (arr->type != GGUF_TYPE_ARRAY)
        return err_set(TD_EINVAL, "value is %s, not an array", gguf_type_name(arr->type));
    if (i >= arr->arr.n)
        return err_set(TD_ERANGE, "index %llu is past the end of an array of %llu",
                       (unsigned long long)i, (unsigned long long)arr->arr.n);
    uint32_t size = gguf_type_size(arr->arr.elem);
    if (!size)
        return err_set(TD_EFORMAT, "array of %s has no numeric elements", gguf_type_name(arr->arr.elem));
    gguf_scalar_load(arr->arr.elem, arr->arr.raw + i * size, v);
    return TD_OK;
}

td_err gguf_arr_get(const gguf_value *arr, uint64_t i, gguf_value *out)
{
    TD_ASSERT(arr && out);
    if (arr->type == GGUF_TYPE_ARRAY && i < arr->arr.n && !gguf_type_size(arr->arr.elem)) {
        *out = arr->arr.items[i];
        return TD_OK;
    }
    return arr_elem(arr, i, out);
}

td_err gguf_arr_i64(const gguf_value *arr, uint64_t i, int64_t *out)
{
    gguf_value v;
    TD_TRY(arr_elem(arr, i, &v));
    if (v.type == GGUF_TYPE_BOOL) {
        *out = v.b;
        return TD_OK;
    }
    char what[48];
    snprintf(what, sizeof what, "element %llu", (unsigned long long)i);
    return value_i64(&v, what, out);
}

td_err gguf_arr_f64(const gguf_value *arr, uint64_t i, double *out)
{
    gguf_value v;
    TD_TRY(arr_elem(arr, i, &v));
    char what[48];
    snprintf(what, sizeof what, "element %llu", (unsigned long long)i);
    return value_f64(&v, what, out);
}

td_err gguf_arr_str(const gguf_value *arr, uint64_t i, gguf_str *out)
{
    TD_ASSERT(arr);
    if (arr->type != GGUF_TYPE_ARRAY)
        return err_set(TD_EINVAL, "value is %s, not an array", gguf_type_name(arr->type));
    if (arr->arr.elem != GGUF_TYPE_STRING)
        return err_set(TD_EFORMAT, "array of %s, expected STRING elements", gguf_type_name(arr->arr.elem));
    if (i >= arr->arr.n)
        return err_set(TD_ERANGE, "index %llu is past the end of an array of %llu",
                       (unsigned long long)i, (unsigned long long)arr->arr.n);
    *out = arr->arr.items[i].str;
    return TD_OK;
}
