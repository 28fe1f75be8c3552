#include "common/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Names in messages are clipped so a hostile 1 MB name cannot push out the problem. */
#define ST_NAME_FMT "\"%.120s\""

typedef struct st_dtype_info {
    const char *name; /* the file's spelling */
    uint32_t bits;    /* per element */
    int td;           /* the td_dtype used for compute, or -1 */
} st_dtype_info;

static const st_dtype_info st_dtypes[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {"BOOL", 8, -1},
    [ST_U8] = {"U8", 8, -1},
    [ST_I8] = {"I8", 8, -1},
    [ST_I16] = {"I16", 16, -1},
    [ST_U16] = {"U16", 16, -1},
    [ST_I32] = {"I32", 32, -1},
    [ST_U32] = {"U32", 32, -1},
    [ST_I64] = {"I64", 64, -1},
    [ST_U64] = {"U64", 64, -1},
    [ST_F16] = {"F16", 16, TD_F16},
    [ST_BF16] = {"BF16", 16, TD_BF16},
    [ST_F32] = {"F32", 32, TD_F32},
    [ST_F64] = {"F64", 64, -1},
    [ST_C64] = {"C64", 64, -1},
    [ST_F8_E4M3] = {"F8_E4M3", 8, -1},
    [ST_F8_E5M2] = {"F8_E5M2", 8, -1},
    [ST_F8_E8M0] = {"F8_E8M0", 8, -1},
    [ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8, -1},
    [ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8, -1},
    [ST_F6_E2M3] = {"F6_E2M3", 6, -1},
    [ST_F6_E3M2] = {"F6_E3M2", 6, -1},
    [ST_F4] = {"F4", 4, -1},
};

const char *st_dtype_name(st_dtype d)
{
    if ((int)d < 0 || d >= ST_DTYPE_COUNT)
        return "?";
    return st_dtypes[d].name;
}

td_err st_dtype_parse(const char *s, st_dtype *out)
{
    for (int d = 0; d < ST_DTYPE_COUNT; d++)
        if (!strcmp(s, st_dtypes[d].name)) {
            *out = (st_dtype)d;
            return TD_OK;
        }
    return err_set(TD_ENOTSUP, "unknown safetensors dtype \"%.40s\"", s);
}

td_err st_dtype_bytes(st_dtype d, uint64_t n, uint64_t *bytes)
{
    TD_ASSERT((int)d >= 0 && d < ST_DTYPE_COUNT);
    uint64_t bits = st_dtypes[d].bits;
    if (n > UINT64_MAX / bits)
        return err_set(TD_ERANGE, "%llu elements of %s: size overflows", (unsigned long long)n,
                       st_dtypes[d].name);
    if ((n * bits) % 8)
        return err_set(TD_EFORMAT, "%llu elements of %s are not a whole number of bytes",
                       (unsigned long long)n, st_dtypes[d].name);
    *bytes = n * bits / 8;
    return TD_OK;
}

td_err st_tensor_type(const st_tensor *t, td_dtype *out)
{
    if (!t->supported)
        return err_set(TD_ENOTSUP, "tensor " ST_NAME_FMT ": dtype %s is not supported for compute "
                       "(BF16, F16 or F32 are)", t->name, st_dtype_name(t->dtype));
    *out = (td_dtype)st_dtypes[t->dtype].td;
    return TD_OK;
}

/* --- reader ------------------------------------------------------------------------ */

static uint64_t st_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* A JSON integer >= 0 (jansson stores integers as long long; reals are refused). */
static bool st_json_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static td_err st_parse_tensor(st_tensor *t, const char *name, json_t *v, uint64_t data_size)
{
    t->name = name;
    if (!json_is_object(v))
        return err_set(TD_EFORMAT, "tensor " ST_NAME_FMT ": entry is not a JSON object", name);

    json_t *dt = json_object_get(v, "dtype");
    if (!dt)
        return err_set(TD_EFORMAT, "tensor " ST_NAME_FMT ": no dtype", name);
    if (!json_is_string(dt))
        return err_set(TD_EFORMAT, "tensor " ST_NAME_FMT ": dtype is not a string", name);
    if (st_dtype_parse(json_string_value(dt), &t->dtype) != TD_OK)
        return err_set(TD_ENOTSUP, "tensor " ST_NAME_FMT ": unknown dtype \"%.40s\"", name,
                       json_string_value(dt));
    t->supported = st_dtypes[t->dtype].td >= 0;

    json_t *shape = json_object_get(v, "shape");
    if (!shape)
        return err_set(TD_EFORMAT, "tensor " ST_NAME_FMT ": no shape", name);
    if (!json_is_array(shape))
        return err_set(TD_EFORMAT, "tensor " ST_NAME_FMT ": shape is not an array", name);
    size_t rank = json_array_size(shape);
    if (rank > ST_MAX_DIMS)
        return err_set(TD_ERANGE, "tensor " ST_NAME_FMT ": rank %zu exceeds the limit of %d", name,
                       rank, ST_MAX_DIMS);
    t->n_dims = (uint32_t)rank;
    t->n_elements = 1;
    for (size_t i = 0; i < rank; i++) {
        uint64_t d;
        if (!st_json_u64(json_array_get(shape, i), &d))
            return err_set(TD_EFORMAT, "tensor " ST_NAME_FMT ": shape[%zu] is not a non-negative "
                           "integer", name, i);
        t->shape[i] = d;
        if (d && t->n_elements > UINT64_MAX / d)
            return err_set(TD_ERANGE, "tensor " ST_NAME_FMT ": element count overflows", name);
        t->n_elements *= d;
    }
    uint64_t need;
    td_err e = st_dtype_bytes(t->dtype, t->n_elements, &need);
    if (e != TD_OK)
        return err_wrap(e, "tensor " ST_NAME_FMT, name);

    json_t *offs = json_object_get(v, "data_offsets");
    if (!offs)
        return err_set(TD_EFORMAT, "tensor " ST_NAME_FMT ": no data_offsets", name);
    uint64_t begin, end;
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !st_json_u64(json_array_get(offs, 0), &begin) || !st_json_u64(json_array_get(offs, 1), &end))
        return err_set(TD_EFORMAT, "tensor " ST_NAME_FMT ": data_offsets is not [begin, end] of "
                       "non-negative integers", name);
    if (end < begin)
        return err_set(TD_EFORMAT, "tensor " ST_NAME_FMT ": data_offsets [%llu, %llu] end before "
                       "begin", name, (unsigned long long)begin, (unsigned long long)end);
    if (end > data_size)
        return err_set(TD_EFORMAT, "tensor " ST_NAME_FMT ": data_offsets end %llu is past the end "
                       "of the data section (%llu bytes): truncated file?", name,
                       (unsigned long long)end, (unsigned long long)data_size);
    if (end - begin != need)
        return err_set(TD_EFORMAT, "tensor " ST_NAME_FMT ": %s with %llu elements needs %llu bytes "
                       "but data_offsets [%llu, %llu] span %llu", name, st_dtypes[t->dtype].name,
                       (unsigned long long)t->n_elements, (unsigned long long)need,
                       (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)(end - begin));
    t->offset = begin;
    t->bytes = need;
    return TD_OK;
}

static td_err st_parse_meta(st_file *f, json_t *m)
{
    if (json_is_null(m))
        return TD_OK;
    if (!json_is_object(m))
        return err_set(TD_EFORMAT, "safetensors header: __metadata__ is not an object of strings");
    f->meta = calloc(json_object_size(m) ? json_object_size(m) : 1, sizeof *f->meta);
    if (!f->meta)
        return err_set(TD_ENOMEM, "safetensors header: out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(m, key, v) {
        if (!json_is_string(v))
            return err_set(TD_EFORMAT, "safetensors header: __metadata__ entry " ST_NAME_FMT " is "
                           "not a string", key);
        f->meta[f->n_meta].key = key;
        f->meta[f->n_meta].value = json_string_value(v);
        f->n_meta++;
    }
    return TD_OK;
}

static int st_cmp_offset(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int st_cmp_name(const void *a, const void *b)
{
    const st_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

static td_err st_parse(st_file *f)
{
    if (f->size < 8)
        return err_set(TD_EFORMAT, "safetensors: file is %llu bytes, shorter than the 8-byte header "
                       "length", (unsigned long long)f->size);
    uint64_t n = st_le64(f->base);
    if (n > ST_MAX_HEADER)
        return err_set(TD_ERANGE, "safetensors: header length %llu exceeds the limit of %llu bytes",
                       (unsigned long long)n, ST_MAX_HEADER);
    if (n > f->size - 8)
        return err_set(TD_EFORMAT, "safetensors: header length %llu runs past the end of the file "
                       "(%llu bytes follow the length): truncated file?", (unsigned long long)n,
                       (unsigned long long)(f->size - 8));
    f->header_size = n;
    uint64_t data_size = f->size - 8 - n;

    json_error_t je;
    json_t *root = json_loadb((const char *)f->base + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return err_set(TD_EFORMAT, "safetensors header: invalid JSON at line %d column %d: %s",
                       je.line, je.column, je.text);
    f->json = root;
    if (!json_is_object(root))
        return err_set(TD_EFORMAT, "safetensors header: not a JSON object");

    size_t cap = json_object_size(root);
    f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
    f->by_name = calloc(cap ? cap : 1, sizeof *f->by_name);
    if (!f->tensors || !f->by_name)
        return err_set(TD_ENOMEM, "safetensors header: out of memory for %zu tensors", cap);

    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            TD_TRY(st_parse_meta(f, v));
            continue;
        }
        TD_TRY(st_parse_tensor(&f->tensors[f->n_tensors], key, v, data_size));
        f->n_tensors++;
    }

    /* Offsets must not overlap; empty tensors occupy nothing and may sit anywhere. */
    qsort(f->tensors, f->n_tensors, sizeof *f->tensors, st_cmp_offset);
    const st_tensor *prev = NULL;
    for (size_t i = 0; i < f->n_tensors; i++) {
        st_tensor *t = &f->tensors[i];
        if (!t->bytes)
            continue;
        if (prev && t->offset < prev->offset + prev->bytes)
            return err_set(TD_EFORMAT, "tensor " ST_NAME_FMT " [%llu, %llu) overlaps tensor "
                           ST_NAME_FMT " [%llu, %llu)", t->name, (unsigned long long)t->offset,
                           (unsigned long long)(t->offset + t->bytes), prev->name,
                           (unsigned long long)prev->offset,
                           (unsigned long long)(prev->offset + prev->bytes));
        prev = t;
    }
    for (size_t i = 0; i < f->n_tensors; i++) {
        f->tensors[i].data = f->base + 8 + n + f->tensors[i].offset;
        f->by_name[i] = &f->tensors[i];
    }
    qsort(f->by_name, f->n_tensors, sizeof *f->by_name, st_cmp_name);
    return TD_OK;
}

td_err st_open_memory(st_file **out, const void *data, size_t size)
{
    *out = NULL;
    st_file *f = calloc(1, sizeof *f);
    if (!f)
        return err_set(TD_ENOMEM, "safetensors: out of memory");
    f->base = data;
    f->size = size;
    td_err e = st_parse(f);
    if (e != TD_OK) {
        st_close(f);
        return e;
    }
    *out = f;
    return TD_OK;
}

td_err st_open(st_file **out, const char *path)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return err_set(TD_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int en = errno;
        close(fd);
        return err_set(TD_EIO, "%s: cannot stat: %s", path, strerror(en));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return err_set(TD_EIO, "%s: not a regular file", path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return err_set(TD_EFORMAT, "%s: file is %lld bytes, shorter than the 8-byte header length",
                       path, (long long)sb.st_size);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int en = errno;
    close(fd);
    if (map == MAP_FAILED)
        return err_set(TD_EIO, "%s: cannot mmap: %s", path, strerror(en));

    st_file *f = calloc(1, sizeof *f);
    if (!f) {
        munmap(map, (size_t)sb.st_size);
        return err_set(TD_ENOMEM, "%s: out of memory", path);
    }
    f->map = map;
    f->base = map;
    f->size = (uint64_t)sb.st_size;
    td_err e = st_parse(f);
    if (e != TD_OK) {
        st_close(f);
        return err_wrap(e, "%s", path);
    }
    *out = f;
    return TD_OK;
}

void st_close(st_file *f)
{
    if (!f)
        return;
    if (f->map)
        munmap(f->map, (size_t)f->size);
    json_decref(f->json);
    free(f->tensors);
    free(f->by_name);
    free(f->meta);
    free(f);
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    size_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->by_name[mid]->name);
        if (!c)
            return f->by_name[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *st_meta_get(const st_file *f, const char *key)
{
    for (size_t i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[i].key, key))
            return f->meta[i].value;
    return NULL;
}

/* --- writer ------------------------------------------------------------------------ */

typedef struct st_plan {
    char *header;     /* JSON padded with spaces to a multiple of 8 bytes */
    size_t header_len;/* bytes, padded */
    size_t *order;    /* [n] entry indices in data order */
    uint64_t data_size; /* bytes */
} st_plan;

static void st_plan_free(st_plan *p)
{
    free(p->header);
    free(p->order);
}

static int st_entry_bits(const st_entry *e)
{
    return (int)st_dtypes[e->dtype].bits;
}

static td_err st_plan_build(st_plan *p, const st_entry *entries, size_t n, const st_meta *meta,
                            size_t n_meta)
{
    memset(p, 0, sizeof *p);
    p->order = malloc((n ? n : 1) * sizeof *p->order);
    json_t *root = json_object();
    if (!p->order || !root) {
        json_decref(root);
        return err_set(TD_ENOMEM, "safetensors writer: out of memory");
    }
    td_err e = TD_OK;

    /* Stable order by element size, largest first: keeps every tensor naturally aligned. */
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        while (j > 0 && st_entry_bits(&entries[p->order[j - 1]]) < st_entry_bits(&entries[i])) {
            p->order[j] = p->order[j - 1];
            j--;
        }
        p->order[j] = i;
    }

    if (n_meta) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m)) {
            e = err_set(TD_ENOMEM, "safetensors writer: out of memory");
            goto done;
        }
        for (size_t i = 0; i < n_meta; i++) {
            json_t *s = json_string(meta[i].value);
            if (!s || json_object_get(m, meta[i].key) || json_object_set_new(m, meta[i].key, s)) {
                json_decref(s);
                e = err_set(TD_EINVAL, "safetensors writer: metadata " ST_NAME_FMT " is duplicate "
                            "or not UTF-8", meta[i].key);
                goto done;
            }
        }
    }

    uint64_t off = 0;
    for (size_t k = 0; k < n; k++) {
        const st_entry *en = &entries[p->order[k]];
        TD_ASSERT((int)en->dtype >= 0 && en->dtype < ST_DTYPE_COUNT);
        if (en->n_dims > ST_MAX_DIMS) {
            e = err_set(TD_EINVAL, "safetensors writer: tensor " ST_NAME_FMT ": rank %u exceeds %d",
                        en->name, en->n_dims, ST_MAX_DIMS);
            goto done;
        }
        if (!strcmp(en->name, "__metadata__") || json_object_get(root, en->name)) {
            e = err_set(TD_EINVAL, "safetensors writer: tensor name " ST_NAME_FMT " is reserved or "
                        "duplicate", en->name);
            goto done;
        }
        uint64_t elems = 1, need;
        json_t *shape = json_array();
        json_t *obj = json_object();
        json_t *offs = json_array();
        if (!shape || !obj || !offs) {
            json_decref(shape);
            json_decref(obj);
            json_decref(offs);
            e = err_set(TD_ENOMEM, "safetensors writer: out of memory");
            goto done;
        }
        /* obj owns shape and offs from here on. */
        json_object_set_new(obj, "dtype", json_string(st_dtypes[en->dtype].name));
        json_object_set_new(obj, "shape", shape);
        json_object_set_new(obj, "data_offsets", offs);
        bool overflow = false;
        for (uint32_t d = 0; d < en->n_dims; d++) {
            if (en->shape[d] > (uint64_t)INT64_MAX ||
                (en->shape[d] && elems > UINT64_MAX / en->shape[d]))
                overflow = true;
            else
                elems *= en->shape[d];
            json_array_append_new(shape, json_integer((json_int_t)en->shape[d]));
        }
        if (overflow || st_dtype_bytes(en->dtype, elems, &need) != TD_OK || need != en->bytes ||
            en->bytes > (uint64_t)INT64_MAX - off) {
            json_decref(obj);
            e = err_set(TD_EINVAL, "safetensors writer: tensor " ST_NAME_FMT ": %llu bytes do not "
                        "match its %s shape", en->name, (unsigned long long)en->bytes,
                        st_dtypes[en->dtype].name);
            goto done;
        }
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + en->bytes)));
        off += en->bytes;
        if (json_object_set_new(root, en->name, obj)) {
            e = err_set(TD_EINVAL, "safetensors writer: tensor name " ST_NAME_FMT " is not UTF-8",
                        en->name);
            goto done;
        }
    }
    p->data_size = off;

    char *js = json_dumps(root, JSON_COMPACT);
    if (!js) {
        e = err_set(TD_ENOMEM, "safetensors writer: cannot serialise the header");
        goto done;
    }
    size_t len = strlen(js);
    size_t padded = (len + 7) / 8 * 8;
    p->header = malloc(padded ? padded : 1);
    if (!p->header) {
        free(js);
        e = err_set(TD_ENOMEM, "safetensors writer: out of memory");
        goto done;
    }
    memcpy(p->header, js, len);
    memset(p->header + len, ' ', padded - len);
    p->header_len = padded;
    free(js);

done:
    json_decref(root);
    if (e != TD_OK)
        st_plan_free(p);
    return e;
}

static void st_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

td_err st_serialize(const st_entry *entries, size_t n, const st_meta *meta, size_t n_meta,
                    uint8_t **out, size_t *size)
{
    *out = NULL;
    *size = 0;
    st_plan p;
    TD_TRY(st_plan_build(&p, entries, n, meta, n_meta));
    if (p.data_size > SIZE_MAX - 8 - p.header_len) {
        st_plan_free(&p);
        return err_set(TD_ENOMEM, "safetensors writer: image too large for memory");
    }
    size_t total = 8 + p.header_len + (size_t)p.data_size;
    uint8_t *buf = malloc(total);
    if (!buf) {
        st_plan_free(&p);
        return err_set(TD_ENOMEM, "safetensors writer: out of memory for %zu bytes", total);
    }
    st_put_le64(buf, p.header_len);
    memcpy(buf + 8, p.header, p.header_len);
    uint8_t *dst = buf + 8 + p.header_len;
    for (size_t k = 0; k < n; k++) {
        const st_entry *en = &entries[p.order[k]];
        if (en->bytes)
            memcpy(dst, en->data, (size_t)en->bytes);
        dst += en->bytes;
    }
    st_plan_free(&p);
    *out = buf;
    *size = total;
    return TD_OK;
}

td_err st_write(const char *path, const st_entry *entries, size_t n, const st_meta *meta,
                size_t n_meta)
{
    st_plan p;
    TD_TRY(st_plan_build(&p, entries, n, meta, n_meta));
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        st_plan_free(&p);
        return err_set(TD_EIO, "%s: cannot create: %s", path, strerror(errno));
    }
    uint8_t len[8];
    st_put_le64(len, p.header_len);
    bool ok = fwrite(len, 1, 8, fp) == 8 && fwrite(p.header, 1, p.header_len, fp) == p.header_len;
    for (size_t k = 0; ok && k < n; k++) {
        const st_entry *en = &entries[p.order[k]];
        ok = !en->bytes || fwrite(en->data, 1, (size_t)en->bytes, fp) == en->bytes;
    }
    int en = errno;
    if (fclose(fp) != 0 && ok) {
        ok = false;
        en = errno;
    }
    st_plan_free(&p);
    if (!ok) {
        unlink(path);
        return err_set(TD_EIO, "%s: write failed: %s", path, strerror(en));
    }
    return TD_OK;
}
