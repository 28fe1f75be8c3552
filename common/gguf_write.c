/* GGUF writer: keeps deep copies of every value and tensor, then serialises a v3 file through
 * one emitter shared by the file and memory outputs, so both give the same bytes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"

typedef struct wkv {
    char *key;        /* NUL-terminated copy */
    gguf_value value; /* owns its strings, raw bytes and items */
} wkv;

typedef struct wtensor {
    char name[GGUF_MAX_NAME + 1];
    uint32_t n_dims;            /* 1..GGUF_MAX_DIMS */
    int64_t ne[GGUF_MAX_DIMS];  /* elements per dim, ne[0] fastest; unused = 1 */
    td_dtype type;
    uint64_t size;              /* bytes */
    void *data;                 /* [size] copy */
} wtensor;

struct gguf_writer {
    wkv *kv;            /* [n_kv] in first-set order */
    size_t n_kv, cap_kv;
    wtensor *t;         /* [n_t] in add order */
    size_t n_t, cap_t;
    td_err err;         /* first failure of a set_* call, reported when writing */
    char err_text[256]; /* its message */
};

gguf_writer *gguf_writer_new(void)
{
    return calloc(1, sizeof(gguf_writer));
}

static void value_free(gguf_value *v)
{
    if (v->type == GGUF_TYPE_STRING) {
        free((char *)v->str.ptr);
    } else if (v->type == GGUF_TYPE_ARRAY) {
        free((uint8_t *)v->arr.raw);
        if (v->arr.items)
            for (uint64_t i = 0; i < v->arr.n; i++)
                value_free(&v->arr.items[i]);
        free(v->arr.items);
    }
    memset(v, 0, sizeof *v);
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        value_free(&w->kv[i].value);
    }
    for (size_t i = 0; i < w->n_t; i++)
        free(w->t[i].data);
    free(w->kv);
    free(w->t);
    free(w);
}

/* Remembers the first failure; the caller drops the value. */
static void writer_fail(gguf_writer *w, td_err e, const char *key, const char *why)
{
    if (w->err)
        return;
    w->err = e;
    snprintf(w->err_text, sizeof w->err_text, "key '%.100s': %s", key, why);
}

/* --- deep copy with validation ---------------------------------------------------------- */

static bool scalar_fits(const gguf_value *v)
{
    switch (v->type) {
    case GGUF_TYPE_UINT8: return v->u64 <= UINT8_MAX;
    case GGUF_TYPE_UINT16: return v->u64 <= UINT16_MAX;
    case GGUF_TYPE_UINT32: return v->u64 <= UINT32_MAX;
    case GGUF_TYPE_INT8: return v->i64 >= INT8_MIN && v->i64 <= INT8_MAX;
    case GGUF_TYPE_INT16: return v->i64 >= INT16_MIN && v->i64 <= INT16_MAX;
    case GGUF_TYPE_INT32: return v->i64 >= INT32_MIN && v->i64 <= INT32_MAX;
    default: return true;
    }
}

/* depth: arrays already open around src. Returns a reason on failure, NULL on success. */
static const char *value_copy(gguf_value *dst, const gguf_value *src, int depth)
{
    memset(dst, 0, sizeof *dst);
    if ((unsigned)src->type >= GGUF_TYPE_COUNT)
        return "unknown value type";
    if (!scalar_fits(src))
        return "value does not fit its type";
    dst->type = src->type;
    if (src->type == GGUF_TYPE_STRING) {
        char *p = malloc(src->str.len ? src->str.len : 1);
        if (!p)
            return "out of memory";
        if (src->str.len)
            memcpy(p, src->str.ptr, src->str.len);
        dst->str = (gguf_str){p, src->str.len};
        return NULL;
    }
    if (src->type != GGUF_TYPE_ARRAY) {
        *dst = *src;
        return NULL;
    }
    if (depth >= GGUF_MAX_NESTING)
        return "arrays nested too deep";
    if ((unsigned)src->arr.elem >= GGUF_TYPE_COUNT)
        return "unknown array element type";
    dst->arr.elem = src->arr.elem;
    uint64_t n = src->arr.n;
    uint32_t size = gguf_type_size(src->arr.elem);
    if (size) {
        if (n > SIZE_MAX / size)
            return "array too large";
        if (n && !src->arr.raw)
            return "array without elements";
        uint8_t *raw = malloc(n ? n * size : 1);
        if (!raw)
            return "out of memory";
        if (n)
            memcpy(raw, src->arr.raw, n * size);
        dst->arr.raw = raw;
        dst->arr.n = n;
        if (src->arr.elem == GGUF_TYPE_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (raw[i] > 1)
                    return "bool element is neither 0 nor 1";
        return NULL;
    }
    if (n && !src->arr.items)
        return "array without elements";
    if (n > SIZE_MAX / sizeof(gguf_value))
        return "array too large";
    dst->arr.items = calloc(n ? n : 1, sizeof(gguf_value));
    if (!dst->arr.items)
        return "out of memory";
    for (uint64_t i = 0; i < n; i++) {
        dst->arr.n = i + 1; /* so value_free releases what was copied so far */
        if (src->arr.items[i].type != src->arr.elem)
            return "array element of the wrong type";
        const char *why = value_copy(&dst->arr.items[i], &src->arr.items[i], depth + 1);
        if (why)
            return why;
    }
    dst->arr.n = n;
    return NULL;
}

void gguf_writer_set_value(gguf_writer *w, const char *key, const gguf_value *v)
{
    TD_ASSERT(w && key && v);
    if (!*key) {
        writer_fail(w, TD_EINVAL, key, "empty key");
        return;
    }
    gguf_value copy;
    const char *why = value_copy(&copy, v, 0);
    if (why) {
        value_free(&copy);
        writer_fail(w, strcmp(why, "out of memory") ? TD_EINVAL : TD_ENOMEM, key, why);
        return;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (!strcmp(w->kv[i].key, key)) {
            value_free(&w->kv[i].value);
            w->kv[i].value = copy;
            return;
        }
    }
    char *k = strdup(key);
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
        wkv *kv = k ? realloc(w->kv, cap * sizeof *kv) : NULL;
        if (kv) {
            w->kv = kv;
            w->cap_kv = cap;
        }
    }
    if (!k || w->n_kv == w->cap_kv) {
        free(k);
        value_free(&copy);
        writer_fail(w, TD_ENOMEM, key, "out of memory");
        return;
    }
    w->kv[w->n_kv++] = (wkv){k, copy};
}

void gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v)
{
    gguf_value x = {.type = GGUF_TYPE_UINT32, .u64 = v};
    gguf_writer_set_value(w, key, &x);
}

void gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v)
{
    gguf_value x = {.type = GGUF_TYPE_INT32, .i64 = v};
    gguf_writer_set_value(w, key, &x);
}

void gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v)
{
    gguf_value x = {.type = GGUF_TYPE_UINT64, .u64 = v};
    gguf_writer_set_value(w, key, &x);
}

void gguf_writer_set_f32(gguf_writer *w, const char *key, float v)
{
    gguf_value x = {.type = GGUF_TYPE_FLOAT32, .f64 = v};
    gguf_writer_set_value(w, key, &x);
}

void gguf_writer_set_bool(gguf_writer *w, const char *key, bool v)
{
    gguf_value x = {.type = GGUF_TYPE_BOOL, .b = v};
    gguf_writer_set_value(w, key, &x);
}

void gguf_writer_set_str(gguf_writer *w, const char *key, const char *v)
{
    TD_ASSERT(v);
    gguf_value x = {.type = GGUF_TYPE_STRING, .str = {v, strlen(v)}};
    gguf_writer_set_value(w, key, &x);
}

void gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_type elem, const void *data, uint64_t n)
{
    TD_ASSERT(gguf_type_size(elem) && (data || n == 0));
    gguf_value x = {.type = GGUF_TYPE_ARRAY, .arr = {.elem = elem, .n = n, .raw = data}};
    gguf_writer_set_value(w, key, &x);
}

void gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
    TD_ASSERT(v || n == 0);
    gguf_value *items = calloc(n ? n : 1, sizeof *items);
    if (!items) {
        writer_fail(w, TD_ENOMEM, key, "out of memory");
        return;
    }
    for (uint64_t i = 0; i < n; i++) {
        TD_ASSERT(v[i]);
        items[i] = (gguf_value){.type = GGUF_TYPE_STRING, .str = {v[i], strlen(v[i])}};
    }
    gguf_value x = {.type = GGUF_TYPE_ARRAY, .arr = {.elem = GGUF_TYPE_STRING, .n = n, .items = items}};
    gguf_writer_set_value(w, key, &x);
    free(items);
}

td_err gguf_writer_add_tensor(gguf_writer *w, const char *name, td_dtype type, uint32_t n_dims,
                              const int64_t *ne, const void *data, uint64_t size)
{
    TD_ASSERT(w && name && ne && (data || size == 0));
    size_t len = strlen(name);
    if (len == 0 || len > GGUF_MAX_NAME)
        return err_set(TD_EINVAL, "tensor name '%.64s' must be 1..%d bytes", name, GGUF_MAX_NAME);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return err_set(TD_EINVAL, "tensor '%s': n_dims %u is outside 1..%d", name, n_dims, GGUF_MAX_DIMS);
    const dtype_info *dt = dtype_get(type);
    if (!dt)
        return err_set(TD_EINVAL, "tensor '%s': unknown type id %u", name, (unsigned)type);
    uint64_t n_elem = 1;
    for (uint32_t d = 0; d < n_dims; d++)
        if (ne[d] < 1 || __builtin_mul_overflow(n_elem, (uint64_t)ne[d], &n_elem) || n_elem > INT64_MAX)
            return err_set(TD_EINVAL, "tensor '%s': dimension %u is %lld or the element count overflows",
                           name, d, (long long)ne[d]);
    if (ne[0] % dt->block)
        return err_set(TD_EINVAL, "tensor '%s': row length %lld is not a multiple of the %s block size %u",
                       name, (long long)ne[0], dt->name, dt->block);
    uint64_t want;
    if (dtype_bytes(type, n_elem, &want) != TD_OK || want != size)
        return err_set(TD_EINVAL, "tensor '%s': %llu bytes given, %llu %s elements take %llu", name,
                       (unsigned long long)size, (unsigned long long)n_elem, dt->name,
                       (unsigned long long)want);
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return err_set(TD_EINVAL, "duplicate tensor name '%s'", name);
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 16;
        wtensor *t = realloc(w->t, cap * sizeof *t);
        if (!t)
            return err_set(TD_ENOMEM, "out of memory adding tensor '%s'", name);
        w->t = t;
        w->cap_t = cap;
    }
    void *copy = malloc(size ? size : 1);
    if (!copy)
        return err_set(TD_ENOMEM, "out of memory copying %llu bytes of tensor '%s'",
                       (unsigned long long)size, name);
    memcpy(copy, data, size);
    wtensor *t = &w->t[w->n_t++];
    memset(t, 0, sizeof *t);
    memcpy(t->name, name, len + 1);
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    t->type = type;
    t->size = size;
    t->data = copy;
    return TD_OK;
}

/* --- serialisation ---------------------------------------------------------------------- */

/* Bytes go to a FILE or into a growing buffer; the first failure sticks. */
typedef struct sink {
    FILE *f;        /* or NULL: buffer */
    uint8_t *buf;   /* [cap] */
    uint64_t cap;   /* bytes */
    uint64_t pos;   /* bytes written so far */
    td_err err;
} sink;

static void sink_put(sink *s, const void *p, uint64_t n)
{
    if (s->err || n == 0)
        return;
    if (s->f) {
        if (fwrite(p, 1, n, s->f) != n)
            s->err = err_set(TD_EIO, "write failed at byte offset %llu: %s", (unsigned long long)s->pos,
                             strerror(errno));
    } else {
        if (n > s->cap - s->pos) {
            uint64_t cap = s->cap ? s->cap : 4096;
            while (cap - s->pos < n)
                cap *= 2;
            uint8_t *b = realloc(s->buf, cap);
            if (!b) {
                s->err = err_set(TD_ENOMEM, "out of memory for a %llu-byte GGUF image", (unsigned long long)cap);
                return;
            }
            s->buf = b;
            s->cap = cap;
        }
        memcpy(s->buf + s->pos, p, n);
    }
    s->pos += n;
}

static void sink_u32(sink *s, uint32_t v) { sink_put(s, &v, 4); }
static void sink_u64(sink *s, uint64_t v) { sink_put(s, &v, 8); }

static void sink_str(sink *s, gguf_str str)
{
    sink_u64(s, str.len);
    sink_put(s, str.ptr, str.len);
}

static void sink_pad(sink *s, uint32_t alignment)
{
    static const uint8_t zeros[256];
    uint64_t pad = (alignment - s->pos % alignment) % alignment;
    while (pad) {
        uint64_t n = pad < sizeof zeros ? pad : sizeof zeros;
        sink_put(s, zeros, n);
        pad -= n;
    }
}

static void sink_value(sink *s, const gguf_value *v)
{
    switch (v->type) {
    case GGUF_TYPE_STRING:
        sink_str(s, v->str);
        return;
    case GGUF_TYPE_ARRAY: {
        sink_u32(s, v->arr.elem);
        sink_u64(s, v->arr.n);
        uint32_t size = gguf_type_size(v->arr.elem);
        if (size) {
            sink_put(s, v->arr.raw, v->arr.n * size);
            return;
        }
        /* Strings and nested arrays (each with its own element type and count). */
        for (uint64_t i = 0; i < v->arr.n; i++)
            sink_value(s, &v->arr.items[i]);
        return;
    }
    case GGUF_TYPE_FLOAT32: {
        float f = (float)v->f64;
        sink_put(s, &f, 4);
        return;
    }
    case GGUF_TYPE_FLOAT64:
        sink_put(s, &v->f64, 8);
        return;
    case GGUF_TYPE_BOOL: {
        uint8_t b = v->b;
        sink_put(s, &b, 1);
        return;
    }
    default: {
        /* Integers: the low bytes of the 64-bit value, little-endian. */
        uint64_t x = v->u64;
        sink_put(s, &x, gguf_type_size(v->type));
        return;
    }
    }
}

static td_err writer_alignment(const gguf_writer *w, uint32_t *alignment)
{
    *alignment = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, "general.alignment"))
            continue;
        const gguf_value *v = &w->kv[i].value;
        if (v->type != GGUF_TYPE_UINT32 || v->u64 == 0 || (v->u64 & (v->u64 - 1)) ||
            v->u64 > GGUF_MAX_ALIGNMENT)
            return err_set(TD_EINVAL, "general.alignment must be a UINT32 power of two, at most "
                           "%u", GGUF_MAX_ALIGNMENT);
        *alignment = (uint32_t)v->u64;
    }
    return TD_OK;
}

static td_err writer_emit(gguf_writer *w, sink *s)
{
    TD_ASSERT(w);
    if (w->err)
        return err_set(w->err, "%s", w->err_text);
    uint32_t alignment;
    TD_TRY(writer_alignment(w, &alignment));
    sink_put(s, "GGUF", 4);
    sink_u32(s, 3);
    sink_u64(s, w->n_t);
    sink_u64(s, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        sink_str(s, (gguf_str){w->kv[i].key, strlen(w->kv[i].key)});
        sink_u32(s, w->kv[i].value.type);
        sink_value(s, &w->kv[i].value);
    }
    uint64_t offset = 0; /* from the data section */
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        sink_str(s, (gguf_str){t->name, strlen(t->name)});
        sink_u32(s, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            sink_u64(s, (uint64_t)t->ne[d]);
        sink_u32(s, t->type);
        sink_u64(s, offset);
        offset += t->size + (alignment - t->size % alignment) % alignment;
    }
    sink_pad(s, alignment);
    for (size_t i = 0; i < w->n_t; i++) {
        sink_put(s, w->t[i].data, w->t[i].size);
        sink_pad(s, alignment);
    }
    return s->err;
}

td_err gguf_writer_write_mem(gguf_writer *w, uint8_t **out, uint64_t *size)
{
    TD_ASSERT(out && size);
    sink s = {0};
    td_err e = writer_emit(w, &s);
    if (e) {
        free(s.buf);
        return e;
    }
    *out = s.buf ? s.buf : malloc(1);
    *size = s.pos;
    return *out ? TD_OK : err_set(TD_ENOMEM, "out of memory");
}

td_err gguf_writer_write(gguf_writer *w, const char *path)
{
    TD_ASSERT(path);
    FILE *f = fopen(path, "wb");
    if (!f)
        return err_set(errno == ENOENT ? TD_ENOENT : TD_EIO, "%s: %s", path, strerror(errno));
    sink s = {.f = f};
    td_err e = writer_emit(w, &s);
    if (fclose(f) != 0 && !e)
        e = err_set(TD_EIO, "%s: %s", path, strerror(errno));
    if (e) {
        remove(path);
        return err_wrap(e, "%s", path);
    }
    return TD_OK;
}
