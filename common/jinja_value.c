/* Storage of the Jinja interpreter: the arena, UTF-8 helpers, strings, lists, dicts, output
 * buffers, and the conversion of JSON input into values. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/jinja_int.h"

/* ---- arena ------------------------------------------------------------------------------ */

struct jarena_chunk {
    jarena_chunk *next;
    size_t cap;  /* bytes of data */
    size_t used; /* bytes of data handed out */
    _Alignas(16) unsigned char data[];
};

#define JARENA_CHUNK 65536

void *jarena_alloc(jarena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    if (n > a->limit || a->used > a->limit - n)
        return NULL;
    jarena_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > JARENA_CHUNK / 4 ? n : JARENA_CHUNK;
        c = malloc(sizeof *c + cap);
        if (!c)
            return NULL;
        c->cap = cap;
        c->used = 0;
        if (cap == n && a->head) {
            /* a big block gets its own chunk behind the current one, which keeps filling */
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

void jarena_free(jarena *a)
{
    jarena_chunk *c = a->head;
    while (c) {
        jarena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- failure and accounting -------------------------------------------------------------- */

void jev_fail(jev *ev, td_err code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    err_set(code, "%s", msg);
    ev->code = code;
    longjmp(ev->jb, 1);
}

void jev_fail_undef(jev *ev, jv u)
{
    TD_ASSERT(u.kind == JV_UNDEF);
    if (u.s.n == 0)
        jev_fail(ev, TD_EINVAL, "value is undefined");
    jev_fail(ev, TD_EINVAL, "%.*s", (int)u.s.n, u.s.p);
}

void *jev_alloc(jev *ev, size_t n)
{
    void *p = jarena_alloc(&ev->arena, n);
    if (!p)
        jev_fail(ev, TD_ERANGE, "template rendering needs more than %zu bytes of memory",
                 ev->lim.max_memory);
    return p;
}

void jev_charge(jev *ev, size_t n)
{
    ev->steps += 1 + n / 256;
    if (ev->steps > ev->lim.max_steps)
        jev_fail(ev, TD_ERANGE, "template rendering takes more than %llu steps",
                 (unsigned long long)ev->lim.max_steps);
}

/* ---- UTF-8 ----------------------------------------------------------------------------- */

uint32_t utf8_decode(const char *p, size_t n, size_t i, size_t *next)
{
    const unsigned char *s = (const unsigned char *)p;
    unsigned char c = s[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + len > n)
        len = 1;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (size_t k = 1; k < len; k++) {
        if ((s[i + k] & 0xC0) != 0x80) { /* malformed: take one byte */
            *next = i + 1;
            return c;
        }
        cp = (cp << 6) | (s[i + k] & 0x3Fu);
    }
    *next = i + len;
    return cp;
}

size_t utf8_next(const char *p, size_t n, size_t i)
{
    size_t next;
    utf8_decode(p, n, i, &next);
    return next;
}

size_t utf8_len(const char *p, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)p[i] & 0xC0) != 0x80;
    return k;
}

size_t utf8_offset(const char *p, size_t n, size_t k)
{
    size_t i = 0;
    while (k > 0 && i < n) {
        i = utf8_next(p, n, i);
        k--;
    }
    return i;
}

size_t jinja_utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

bool py_isspace(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* ---- values ------------------------------------------------------------------------------- */

jv jv_str(const char *cstr)
{
    return jv_strn(cstr, strlen(cstr));
}

jv jv_undef(jev *ev, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof msg)
        n = sizeof msg - 1;
    jv v = jv_str_copy(ev, msg, (size_t)n);
    v.kind = JV_UNDEF;
    return v;
}

jv jv_str_copy(jev *ev, const char *p, size_t n)
{
    char *s = jev_alloc(ev, n + 1);
    if (n)
        memcpy(s, p, n);
    return jv_strn(s, n);
}

jv jv_list_new(jev *ev, size_t cap)
{
    jv v = {.kind = JV_LIST};
    v.l = jev_alloc(ev, sizeof *v.l);
    if (cap) {
        v.l->v = jev_alloc(ev, cap * sizeof(jv));
        v.l->cap = cap;
    }
    return v;
}

void jv_list_push(jev *ev, jv list, jv item)
{
    jlist *l = list.l;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *nv = jev_alloc(ev, cap * sizeof *nv);
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = item;
}

jv jv_dict_new(jev *ev)
{
    jv v = {.kind = JV_DICT};
    v.d = jev_alloc(ev, sizeof *v.d);
    return v;
}

static uint64_t hash_bytes(const char *p, size_t n)
{
    return td_hash(TD_HASH_SEED, p, n);
}

#define JDICT_LINEAR 8 /* entries searched linearly before a hash index is built */

jv *jdict_get(const jdict *d, const char *k, size_t kn)
{
    if (!d->index) {
        for (size_t i = 0; i < d->n; i++)
            if (d->e[i].kn == kn && !memcmp(d->e[i].k, k, kn))
                return &d->e[i].v;
        return NULL;
    }
    size_t mask = d->index_cap - 1;
    for (size_t s = hash_bytes(k, kn) & mask;; s = (s + 1) & mask) {
        uint32_t e = d->index[s];
        if (!e)
            return NULL;
        jdict_ent *x = &d->e[e - 1];
        if (x->kn == kn && !memcmp(x->k, k, kn))
            return &x->v;
    }
}

static void jdict_reindex(jev *ev, jdict *d)
{
    size_t cap = 16;
    while (cap < d->n * 2 + 2)
        cap *= 2;
    d->index = jev_alloc(ev, cap * sizeof *d->index);
    d->index_cap = cap;
    for (size_t i = 0; i < d->n; i++) {
        size_t s = hash_bytes(d->e[i].k, d->e[i].kn) & (cap - 1);
        while (d->index[s])
            s = (s + 1) & (cap - 1);
        d->index[s] = (uint32_t)(i + 1);
    }
}

void jdict_set(jev *ev, jdict *d, const char *k, size_t kn, jv v)
{
    jv *old = jdict_get(d, k, kn);
    if (old) {
        *old = v;
        return;
    }
    if (d->n >= UINT32_MAX - 1)
        jev_fail(ev, TD_ERANGE, "dict too large");
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jdict_ent *ne = jev_alloc(ev, cap * sizeof *ne);
        if (d->n)
            memcpy(ne, d->e, d->n * sizeof *ne);
        d->e = ne;
        d->cap = cap;
    }
    d->e[d->n].k = k;
    d->e[d->n].kn = kn;
    d->e[d->n].v = v;
    d->n++;
    if (d->index && d->n * 2 + 2 > d->index_cap) {
        jdict_reindex(ev, d);
    } else if (d->index) {
        size_t mask = d->index_cap - 1;
        size_t s = hash_bytes(k, kn) & mask;
        while (d->index[s])
            s = (s + 1) & mask;
        d->index[s] = (uint32_t)d->n;
    } else if (d->n > JDICT_LINEAR) {
        jdict_reindex(ev, d);
    }
}

jv jv_from_json(jev *ev, const json_t *j, uint32_t depth)
{
    if (depth > ev->lim.max_depth)
        jev_fail(ev, TD_ERANGE, "input nested more than %u levels deep", ev->lim.max_depth);
    jev_charge(ev, 0);
    switch (json_typeof(j)) {
    case JSON_NULL: return jv_none();
    case JSON_TRUE: return jv_bool(true);
    case JSON_FALSE: return jv_bool(false);
    case JSON_INTEGER: return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_STRING: return jv_strn(json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        jv l = jv_list_new(ev, n);
        for (size_t i = 0; i < n; i++)
            l.l->v[i] = jv_from_json(ev, json_array_get(j, i), depth + 1);
        l.l->n = n;
        return l;
    }
    case JSON_OBJECT: {
        jv d = jv_dict_new(ev);
        const char *k;
        json_t *x;
        void *it = json_object_iter((json_t *)j);
        while (it) {
            k = json_object_iter_key(it);
            x = json_object_iter_value(it);
            jdict_set(ev, d.d, k, json_object_iter_key_len(it), jv_from_json(ev, x, depth + 1));
            it = json_object_iter_next((json_t *)j, it);
        }
        return d;
    }
    }
    return jv_none();
}

/* ---- buffers ------------------------------------------------------------------------------ */

void jbuf_put(jev *ev, jbuf *b, const char *p, size_t n)
{
    if (n == 0)
        return;
    if (b == &ev->main_out && b->n + n > ev->lim.max_output)
        jev_fail(ev, TD_ERANGE, "template output exceeds %zu bytes", ev->lim.max_output);
    if (b->cap - b->n < n + 1) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n + 1) {
            if (cap > SIZE_MAX / 4)
                jev_fail(ev, TD_ERANGE, "string too large");
            cap *= 2;
        }
        char *np = jev_alloc(ev, cap);
        if (b->n)
            memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

void jbuf_putc(jev *ev, jbuf *b, char c)
{
    jbuf_put(ev, b, &c, 1);
}

jv jbuf_str(jbuf *b)
{
    return jv_strn(b->p ? b->p : "", b->n);
}
