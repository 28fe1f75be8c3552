/* GGUF reader: parses and validates a whole file up front, so that everything a caller can
 * reach afterwards (values, array elements, tensor data) lies inside the image.
 *
 * Memory: one arena per file holds the kv array, the tensor array, the items of string and
 * nested arrays, and two hash tables (keys, tensor names). Every count read from the file is
 * checked against the bytes that remain before the arena is asked for anything, because each
 * element takes at least a known number of bytes in the file (a u8 takes 1, a string 8, a
 * nested array 12, a key/value 13, a tensor info 32). */
#include "common/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/gguf_internal.h"
#include "common/hash.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "GGUF values are read in host order");

/* Smallest encodings, in bytes, of the things a count can ask for. */
enum {
    GGUF_HEADER_BYTES = 24,   /* magic, version, n_tensors, n_kv */
    GGUF_MIN_KV_BYTES = 13,   /* key length 8, value type 4, a u8 value 1 */
    GGUF_MIN_TI_BYTES = 32,   /* name length 8, n_dims 4, one ne 8, type 4, offset 8 */
    GGUF_MIN_STR_BYTES = 8,   /* length */
    GGUF_MIN_ARR_BYTES = 12,  /* element type 4, count 8 */
};

/* --- arena ------------------------------------------------------------------------------ */

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t cap;       /* bytes of data[] */
    size_t used;      /* bytes handed out */
    max_align_t data[];
} arena_chunk;

/* Chunks start small (most files are a few keys) and double up to 1 MiB; a single larger
 * request (a vocab's items) gets a chunk of its own size. */
#define ARENA_FIRST_BYTES ((size_t)4 << 10)
#define ARENA_CHUNK_BYTES ((size_t)1 << 20)

static void *arena_alloc(gguf_arena *a, uint64_t n, uint64_t size)
{
    if (size && n > (SIZE_MAX - 64) / size)
        return NULL;
    size_t bytes = (size_t)(n * size);
    bytes = (bytes + sizeof(max_align_t) - 1) & ~(sizeof(max_align_t) - 1);
    arena_chunk *c = a->chunks;
    if (!c || c->cap - c->used < bytes) {
        size_t cap = c ? (c->cap < ARENA_CHUNK_BYTES ? 2 * c->cap : ARENA_CHUNK_BYTES) : ARENA_FIRST_BYTES;
        if (cap < bytes)
            cap = bytes;
        c = malloc(sizeof(arena_chunk) + cap);
        if (!c)
            return NULL;
        c->cap = cap;
        c->used = 0;
        /* A chunk sized for one big array goes behind the current one, which keeps its room. */
        if (a->chunks && cap == bytes && bytes > a->chunks->cap) {
            c->next = a->chunks->next;
            a->chunks->next = c;
        } else {
            c->next = a->chunks;
            a->chunks = c;
        }
    }
    void *p = (uint8_t *)c->data + c->used;
    c->used += bytes;
    memset(p, 0, bytes);
    return p;
}

static void arena_free(gguf_arena *a)
{
    if (!a)
        return;
    arena_chunk *c = a->chunks;
    while (c) {
        arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    free(a);
}

/* --- hash tables ------------------------------------------------------------------------ */

uint64_t gguf_hash(const void *p, uint64_t len)
{
    return td_hash(TD_HASH_SEED, p, (size_t)len);
}

/* Room for n entries at most half full. */
static td_err table_init(gguf_arena *a, gguf_table *t, uint64_t n)
{
    uint64_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    t->slots = arena_alloc(a, cap, sizeof(uint64_t));
    if (!t->slots)
        return err_set(TD_ENOMEM, "out of memory for a lookup table of %llu entries",
                       (unsigned long long)n);
    t->mask = cap - 1;
    return TD_OK;
}

/* Inserts entry idx under (name, len) unless an equal name is there: then returns false and
 * *other is that entry. */
static bool table_insert(gguf_table *t, const char *name, uint64_t len, uint64_t idx,
                         const char *(*name_of)(const void *ctx, uint64_t i, uint64_t *len),
                         const void *ctx, uint64_t *other)
{
    for (uint64_t s = gguf_hash(name, len) & t->mask;; s = (s + 1) & t->mask) {
        if (!t->slots[s]) {
            t->slots[s] = idx + 1;
            return true;
        }
        uint64_t olen;
        const char *o = name_of(ctx, t->slots[s] - 1, &olen);
        if (olen == len && memcmp(o, name, len) == 0) {
            *other = t->slots[s] - 1;
            return false;
        }
    }
}

const char *gguf_kv_name(const void *ctx, uint64_t i, uint64_t *len)
{
    const gguf_file *g = ctx;
    *len = g->kv[i].key.len;
    return g->kv[i].key.ptr;
}

const char *gguf_tensor_name(const void *ctx, uint64_t i, uint64_t *len)
{
    const gguf_file *g = ctx;
    *len = strlen(g->tensors[i].name);
    return g->tensors[i].name;
}

/* --- cursor ----------------------------------------------------------------------------- */

typedef struct cursor {
    const uint8_t *base;  /* the image */
    uint64_t size;        /* bytes */
    uint64_t pos;         /* bytes from base */
    gguf_arena *arena;
} cursor;

static uint64_t cur_left(const cursor *c)
{
    return c->size - c->pos;
}

static td_err cur_need(const cursor *c, uint64_t n, const char *what)
{
    if (n > cur_left(c))
        return err_set(TD_EFORMAT, "truncated: %s at byte offset %llu needs %llu bytes, the file has %llu",
                       what, (unsigned long long)c->pos, (unsigned long long)n,
                       (unsigned long long)cur_left(c));
    return TD_OK;
}

static td_err cur_u32(cursor *c, uint32_t *v, const char *what)
{
    TD_TRY(cur_need(c, 4, what));
    memcpy(v, c->base + c->pos, 4);
    c->pos += 4;
    return TD_OK;
}

static td_err cur_u64(cursor *c, uint64_t *v, const char *what)
{
    TD_TRY(cur_need(c, 8, what));
    memcpy(v, c->base + c->pos, 8);
    c->pos += 8;
    return TD_OK;
}

static td_err cur_str(cursor *c, gguf_str *s, const char *what)
{
    uint64_t at = c->pos;
    TD_TRY(cur_u64(c, &s->len, what));
    if (s->len > cur_left(c))
        return err_set(TD_EFORMAT, "%s: string length %llu at byte offset %llu runs past the end of the file (%llu bytes left)",
                       what, (unsigned long long)s->len, (unsigned long long)at,
                       (unsigned long long)cur_left(c));
    s->ptr = (const char *)c->base + c->pos;
    c->pos += s->len;
    return TD_OK;
}

/* --- values ----------------------------------------------------------------------------- */

uint32_t gguf_type_size(gguf_type t)
{
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

void gguf_scalar_load(gguf_type t, const uint8_t *p, gguf_value *v)
{
    v->type = t;
    switch (t) {
    case GGUF_TYPE_UINT8: { uint8_t x; memcpy(&x, p, 1); v->u64 = x; break; }
    case GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, p, 2); v->u64 = x; break; }
    case GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, p, 4); v->u64 = x; break; }
    case GGUF_TYPE_UINT64: memcpy(&v->u64, p, 8); break;
    case GGUF_TYPE_INT8: { int8_t x; memcpy(&x, p, 1); v->i64 = x; break; }
    case GGUF_TYPE_INT16: { int16_t x; memcpy(&x, p, 2); v->i64 = x; break; }
    case GGUF_TYPE_INT32: { int32_t x; memcpy(&x, p, 4); v->i64 = x; break; }
    case GGUF_TYPE_INT64: memcpy(&v->i64, p, 8); break;
    case GGUF_TYPE_FLOAT32: { float x; memcpy(&x, p, 4); v->f64 = x; break; }
    case GGUF_TYPE_FLOAT64: memcpy(&v->f64, p, 8); break;
    case GGUF_TYPE_BOOL: v->b = p[0] != 0; break;
    default: TD_ASSERT(!"not a scalar type");
    }
}

static td_err check_bools(const uint8_t *p, uint64_t n, uint64_t at)
{
    for (uint64_t i = 0; i < n; i++)
        if (p[i] > 1)
            return err_set(TD_EFORMAT, "bool byte %u at byte offset %llu is neither 0 nor 1", p[i],
                           (unsigned long long)(at + i));
    return TD_OK;
}

static td_err parse_value(cursor *c, gguf_type type, int depth, gguf_value *v);

static td_err parse_array(cursor *c, int depth, gguf_value *v)
{
    uint64_t at = c->pos;
    if (depth >= GGUF_MAX_NESTING)
        return err_set(TD_EFORMAT, "array at byte offset %llu is nested deeper than %d levels",
                       (unsigned long long)at, GGUF_MAX_NESTING);
    uint32_t elem;
    TD_TRY(cur_u32(c, &elem, "array element type"));
    if (elem >= GGUF_TYPE_COUNT)
        return err_set(TD_EFORMAT, "array at byte offset %llu: unknown element type %u",
                       (unsigned long long)at, elem);
    uint64_t n;
    TD_TRY(cur_u64(c, &n, "array length"));
    v->arr.elem = (gguf_type)elem;
    v->arr.n = n;
    uint32_t size = gguf_type_size(v->arr.elem);
    uint64_t min = size ? size : elem == GGUF_TYPE_STRING ? GGUF_MIN_STR_BYTES : GGUF_MIN_ARR_BYTES;
    if (n > cur_left(c) / min)
        return err_set(TD_EFORMAT, "array of %llu %s at byte offset %llu runs past the end of the file (%llu bytes left)",
                       (unsigned long long)n, gguf_type_name(v->arr.elem), (unsigned long long)at,
                       (unsigned long long)cur_left(c));
    if (size) {
        v->arr.raw = c->base + c->pos;
        if (elem == GGUF_TYPE_BOOL)
            TD_TRY(check_bools(v->arr.raw, n, c->pos));
        c->pos += n * size;
        return TD_OK;
    }
    v->arr.items = arena_alloc(c->arena, n, sizeof(gguf_value));
    if (!v->arr.items && n)
        return err_set(TD_ENOMEM, "out of memory for an array of %llu %s", (unsigned long long)n,
                       gguf_type_name(v->arr.elem));
    for (uint64_t i = 0; i < n; i++) {
        td_err e = parse_value(c, v->arr.elem, depth + 1, &v->arr.items[i]);
        /* The index in the outermost array; deeper levels are located by the byte offset. */
        if (e)
            return depth == 0 ? err_wrap(e, "element %llu", (unsigned long long)i) : e;
    }
    return TD_OK;
}

/* depth: arrays already open around this value. */
static td_err parse_value(cursor *c, gguf_type type, int depth, gguf_value *v)
{
    v->type = type;
    if (type == GGUF_TYPE_STRING)
        return cur_str(c, &v->str, "string");
    if (type == GGUF_TYPE_ARRAY)
        return parse_array(c, depth, v);
    uint32_t size = gguf_type_size(type);
    TD_ASSERT(size);
    TD_TRY(cur_need(c, size, gguf_type_name(type)));
    if (type == GGUF_TYPE_BOOL)
        TD_TRY(check_bools(c->base + c->pos, 1, c->pos));
    gguf_scalar_load(type, c->base + c->pos, v);
    c->pos += size;
    return TD_OK;
}

static td_err parse_kv(cursor *c, gguf_file *g, gguf_table *keys, uint64_t i)
{
    gguf_kv *kv = &g->kv[i];
    uint64_t at = c->pos;
    TD_TRY(cur_str(c, &kv->key, "key"));
    if (kv->key.len == 0)
        return err_set(TD_EFORMAT, "empty key at byte offset %llu", (unsigned long long)at);
    int klen = kv->key.len > 200 ? 200 : (int)kv->key.len; /* for messages */
    uint64_t other;
    if (!table_insert(keys, kv->key.ptr, kv->key.len, i, gguf_kv_name, g, &other))
        return err_set(TD_EFORMAT, "duplicate key '%.*s' (entries %llu and %llu, the second at byte offset %llu)",
                       klen, kv->key.ptr, (unsigned long long)other, (unsigned long long)i,
                       (unsigned long long)at);
    uint64_t type_at = c->pos;
    uint32_t type;
    td_err e = cur_u32(c, &type, "value type");
    if (!e && type >= GGUF_TYPE_COUNT)
        e = err_set(TD_EFORMAT, "unknown value type %u at byte offset %llu", type,
                    (unsigned long long)type_at);
    if (!e)
        e = parse_value(c, (gguf_type)type, 0, &kv->value);
    if (e)
        return err_wrap(e, "key '%.*s'", klen, kv->key.ptr);
    return TD_OK;
}

/* --- tensors ---------------------------------------------------------------------------- */

static td_err parse_tensor_info(cursor *c, gguf_file *g, uint64_t i)
{
    gguf_tensor *t = &g->tensors[i];
    uint64_t at = c->pos;
    gguf_str name;
    TD_TRY(cur_str(c, &name, "tensor name"));
    if (name.len == 0 || name.len > GGUF_MAX_NAME || memchr(name.ptr, 0, name.len))
        return err_set(TD_EFORMAT, "tensor %llu at byte offset %llu: name of %llu bytes is empty, longer than %d or holds a NUL byte",
                       (unsigned long long)i, (unsigned long long)at, (unsigned long long)name.len,
                       GGUF_MAX_NAME);
    memcpy(t->name, name.ptr, name.len);
    t->name[name.len] = '\0';

    td_err e = cur_u32(c, &t->n_dims, "n_dims");
    if (!e && (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS))
        e = err_set(TD_EFORMAT, "n_dims %u is outside 1..%d", t->n_dims, GGUF_MAX_DIMS);
    uint64_t n_elem = 1;
    for (uint32_t d = 0; !e && d < GGUF_MAX_DIMS; d++) {
        uint64_t ne = 1;
        if (d < t->n_dims)
            e = cur_u64(c, &ne, "dimension");
        if (!e && (ne < 1 || ne > INT64_MAX))
            e = err_set(TD_EFORMAT, "dimension %u is %llu; must be 1..2^63-1", d, (unsigned long long)ne);
        if (!e && (__builtin_mul_overflow(n_elem, ne, &n_elem) || n_elem > INT64_MAX))
            e = err_set(TD_EFORMAT, "element count overflows at dimension %u", d);
        t->ne[d] = (int64_t)ne;
    }
    uint32_t type = 0;
    if (!e)
        e = cur_u32(c, &type, "tensor type");
    const dtype_info *dt = e ? NULL : dtype_get(type);
    if (!e && !dt)
        e = err_set(TD_ENOTSUP, "unknown tensor type id %u", type);
    if (!e && (uint64_t)t->ne[0] % dt->block)
        e = err_set(TD_EFORMAT, "row length ne[0] = %lld is not a multiple of the %s block size %u",
                    (long long)t->ne[0], dt->name, dt->block);
    if (!e && dtype_bytes(type, n_elem, &t->size))
        e = err_set(TD_EFORMAT, "%llu elements of %s: byte size overflows", (unsigned long long)n_elem, dt->name);
    if (!e)
        e = cur_u64(c, &t->offset, "tensor offset");
    if (e)
        return err_wrap(e, "tensor '%s' (info at byte offset %llu)", t->name, (unsigned long long)at);
    t->type = (td_dtype)type;
    return TD_OK;
}

typedef struct tensor_span {
    uint64_t start; /* bytes from the data section */
    uint64_t index; /* into g->tensors */
} tensor_span;

static int span_cmp(const void *a, const void *b)
{
    const tensor_span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start ? 1 : (x->index > y->index) - (x->index < y->index);
}

/* Offsets aligned, data inside the image, no two tensors sharing a byte. */
static td_err place_tensors(gguf_file *g)
{
    tensor_span *spans = g->n_tensors ? malloc(g->n_tensors * sizeof *spans) : NULL;
    if (g->n_tensors && !spans)
        return err_set(TD_ENOMEM, "out of memory checking %llu tensors", (unsigned long long)g->n_tensors);
    td_err e = TD_OK;
    for (uint64_t i = 0; !e && i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        uint64_t start, end;
        if (t->offset % g->alignment)
            e = err_set(TD_EFORMAT, "tensor '%s': offset %llu is not a multiple of the alignment %u",
                        t->name, (unsigned long long)t->offset, g->alignment);
        else if (__builtin_add_overflow(g->data_offset, t->offset, &start) ||
                 __builtin_add_overflow(start, t->size, &end) || end > g->size)
            e = err_set(TD_EFORMAT, "tensor '%s': %llu bytes at data offset %llu (file offset %llu) run past the end of the file (%llu bytes)",
                        t->name, (unsigned long long)t->size, (unsigned long long)t->offset,
                        (unsigned long long)(g->data_offset + t->offset), (unsigned long long)g->size);
        else
            t->data = g->base + start;
        spans[i] = (tensor_span){t->offset, i};
    }
    if (!e && g->n_tensors > 1) {
        qsort(spans, g->n_tensors, sizeof *spans, span_cmp);
        for (uint64_t k = 1; !e && k < g->n_tensors; k++) {
            const gguf_tensor *a = &g->tensors[spans[k - 1].index], *b = &g->tensors[spans[k].index];
            if (a->offset + a->size > b->offset)
                e = err_set(TD_EFORMAT, "tensors '%s' and '%s' overlap: '%s' covers data bytes [%llu, %llu), '%s' starts at %llu",
                            a->name, b->name, a->name, (unsigned long long)a->offset,
                            (unsigned long long)(a->offset + a->size), b->name, (unsigned long long)b->offset);
        }
    }
    free(spans);
    return e;
}

/* --- header and whole file -------------------------------------------------------------- */

static td_err parse_header(cursor *c, gguf_file *g)
{
    TD_TRY(cur_need(c, 4, "magic"));
    if (memcmp(c->base, "GGUF", 4) != 0)
        return err_set(TD_EFORMAT, "not a GGUF file: the first 4 bytes are not 'GGUF'");
    c->pos = 4;
    TD_TRY(cur_u32(c, &g->version, "version"));
    uint32_t swapped = __builtin_bswap32(g->version);
    if ((g->version & 0xffff) == 0 && swapped >= 1 && swapped <= 3)
        return err_set(TD_ENOTSUP, "big-endian GGUF file (version %u): only little-endian files are supported", swapped);
    if (g->version == 1)
        return err_set(TD_ENOTSUP, "GGUF version 1 (32-bit counts) is not supported: convert the model again");
    if (g->version != 2 && g->version != 3)
        return err_set(TD_ENOTSUP, "unsupported GGUF version %u (2 and 3 are supported)", g->version);
    TD_TRY(cur_u64(c, &g->n_tensors, "n_tensors"));
    TD_TRY(cur_u64(c, &g->n_kv, "n_kv"));
    if (g->n_kv > cur_left(c) / GGUF_MIN_KV_BYTES)
        return err_set(TD_EFORMAT, "n_kv = %llu key/value pairs cannot fit in the %llu bytes after the header",
                       (unsigned long long)g->n_kv, (unsigned long long)cur_left(c));
    if (g->n_tensors > (cur_left(c) - g->n_kv * GGUF_MIN_KV_BYTES) / GGUF_MIN_TI_BYTES)
        return err_set(TD_EFORMAT, "n_tensors = %llu tensor infos cannot fit in the %llu bytes after the header",
                       (unsigned long long)g->n_tensors, (unsigned long long)cur_left(c));
    return TD_OK;
}

static td_err read_alignment(gguf_file *g)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!gguf_get(g, "general.alignment"))
        return TD_OK;
    uint32_t a;
    TD_TRY(gguf_get_u32(g, "general.alignment", &a));
    if (a == 0 || (a & (a - 1)))
        return err_set(TD_EFORMAT, "general.alignment = %u is not a power of two", a);
    if (a > GGUF_MAX_ALIGNMENT)
        return err_set(TD_EFORMAT, "general.alignment = %u is more than %u", a,
                       GGUF_MAX_ALIGNMENT);
    g->alignment = a;
    return TD_OK;
}

static td_err parse_file(gguf_file *g)
{
    cursor c = {.base = g->base, .size = g->size, .arena = g->arena};
    TD_TRY(parse_header(&c, g));

    g->kv = arena_alloc(g->arena, g->n_kv, sizeof(gguf_kv));
    if (!g->kv && g->n_kv)
        return err_set(TD_ENOMEM, "out of memory for %llu keys", (unsigned long long)g->n_kv);
    TD_TRY(table_init(g->arena, &g->arena->keys, g->n_kv));
    for (uint64_t i = 0; i < g->n_kv; i++)
        TD_TRY(parse_kv(&c, g, &g->arena->keys, i));
    TD_TRY(read_alignment(g));

    if (g->n_tensors > cur_left(&c) / GGUF_MIN_TI_BYTES)
        return err_set(TD_EFORMAT, "n_tensors = %llu tensor infos cannot fit in the %llu bytes after the metadata (byte offset %llu)",
                       (unsigned long long)g->n_tensors, (unsigned long long)cur_left(&c),
                       (unsigned long long)c.pos);
    g->tensors = arena_alloc(g->arena, g->n_tensors, sizeof(gguf_tensor));
    if (!g->tensors && g->n_tensors)
        return err_set(TD_ENOMEM, "out of memory for %llu tensors", (unsigned long long)g->n_tensors);
    gguf_table *names = &g->arena->tensors;
    TD_TRY(table_init(g->arena, names, g->n_tensors));
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        TD_TRY(parse_tensor_info(&c, g, i));
        uint64_t other;
        const char *name = g->tensors[i].name;
        if (!table_insert(names, name, strlen(name), i, gguf_tensor_name, g, &other))
            return err_set(TD_EFORMAT, "duplicate tensor name '%s' (tensors %llu and %llu)", name,
                           (unsigned long long)other, (unsigned long long)i);
    }
    /* The data section starts at the next multiple of the alignment; without tensors a file
     * may end before it. */
    uint64_t pad = (g->alignment - c.pos % g->alignment) % g->alignment;
    g->data_offset = c.pos + pad;
    return place_tensors(g);
}

static td_err open_image(gguf_file **out, const void *data, size_t size, void *map)
{
    static const uint8_t empty[1];
    gguf_file *g = calloc(1, sizeof *g);
    gguf_arena *a = calloc(1, sizeof *a);
    if (!g || !a) {
        free(g);
        free(a);
        return err_set(TD_ENOMEM, "out of memory opening a GGUF image");
    }
    g->base = data ? data : empty;
    g->size = size;
    g->map = map;
    g->arena = a;
    td_err e = parse_file(g);
    if (e) {
        g->map = NULL; /* the caller unmaps */
        gguf_close(g);
        return e;
    }
    *out = g;
    return TD_OK;
}

td_err gguf_open_memory(gguf_file **out, const void *data, size_t size)
{
    TD_ASSERT(out && (data || size == 0));
    *out = NULL;
    return open_image(out, data, size, NULL);
}

td_err gguf_open(gguf_file **out, const char *path)
{
    TD_ASSERT(out && path);
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return err_set(errno == ENOENT ? TD_ENOENT : TD_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        td_err e = err_set(TD_EIO, "%s: %s", path, strerror(errno));
        close(fd);
        return e;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(TD_EINVAL, "%s: not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    if (size) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            td_err e = err_set(TD_EIO, "%s: mmap of %zu bytes: %s", path, size, strerror(errno));
            close(fd);
            return e;
        }
    }
    close(fd);
    td_err e = open_image(out, map, size, map);
    if (e) {
        if (map)
            munmap(map, size);
        return err_wrap(e, "%s", path);
    }
    return TD_OK;
}

void gguf_close(gguf_file *g)
{
    if (!g)
        return;
    if (g->map)
        munmap(g->map, g->size);
    arena_free(g->arena);
    free(g);
}
