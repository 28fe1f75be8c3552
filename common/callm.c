/* The tool-call matcher (callm.h): a fixed-size state per position of the XML grammar, with
 * a jsonc state for the value being written, or one jsonc state for the JSON form. */
#include "common/callm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonc.h"

typedef enum cm_kind {
    CM_FREE = 0, /* any text */
    CM_STRING,   /* the raw text is a JSON string under sc */
    CM_JSON,     /* the text is JSON under sc, no whitespace around it */
} cm_kind;

typedef struct cm_name {
    char *s;
    size_t len;
} cm_name;

typedef struct cm_param {
    cm_name name;
    cm_kind kind;
    jc_schema *sc; /* CM_STRING, CM_JSON */
} cm_param;

typedef struct cm_fn {
    cm_name name;
    cm_param *par;     /* [n_par] sorted by name */
    uint32_t n_par;
    bool any;          /* no properties declared: any names, free values */
    uint64_t required; /* bits of par */
    cm_name end;       /* tags: the structure's end (name: its begin) */
    jc_schema *tag_sc; /* tags: its schema */
} cm_fn;

struct cm_grammar {
    jc_schema *doc;  /* the JSON form's schema; NULL for the XML form */
    bool choice;     /* a choice: fn[].name are the strings */
    bool tags;       /* structural tags: fn[] are the structures, trig the triggers */
    cm_name *trig;   /* [n_trig] */
    uint32_t n_trig;
    bool tag_plain;  /* every trigger opens with a byte plain free text has not (cm_free_text) */
    bool tag_least;  /* at least one structure before the text may end */
    bool tag_stop;   /* nothing after the first structure */
    cm_fn *fn;       /* [n_fn] sorted by name */
    uint32_t n_fn;
    size_t jc_size;  /* the largest jsonc state */
};

/* Where the text is. */
enum {
    CM_PRE = 0, /* before "<function=" */
    CM_LIT,     /* inside the literal lit, k bytes matched */
    CM_FNAME,   /* the function's name, len bytes so far */
    CM_SEP,     /* between tags: a parameter or "</function>" next */
    CM_TAG,     /* after that tag's '<' */
    CM_PNAME,   /* a parameter's name */
    CM_VSTART,  /* after "<parameter=NAME>": a newline here is not the value's */
    CM_VAL,     /* the value; k bytes of "</parameter>" held (after a held newline, nl) */
    CM_POST,    /* after "</function>": whitespace only */
    CM_DOC,     /* the JSON form */
    CM_CHOICE,  /* a choice: len bytes of the strings [lo, hi) so far */
    CM_TFREE,   /* tags: free text whose last len bytes begin trigger fn */
    CM_TBEGIN,  /* tags: len bytes of the begins [lo, hi) so far */
    CM_TDOC,    /* tags: structure fn's JSON */
    CM_TEND,    /* tags: len bytes of its end so far */
    CM_TSTOP,   /* tags: after the first structure, with tag_stop: nothing more */
};

enum { LIT_FN, LIT_PAR, LIT_FEND };
static const char *const cm_lit[] = {"<function=", "<parameter=", "</function>"};
static const char CM_PEND[] = "</parameter>";
#define CM_PAR_ANY 0xffffu

typedef struct cm_head {
    uint8_t at, ws;  /* position; whitespace bytes in the current run */
    uint8_t lit, k;  /* CM_LIT: the literal and bytes matched; CM_VAL: "</parameter>" bytes held */
    uint8_t nl, fed; /* CM_VAL: a newline held; a byte went to the JSON value */
    uint16_t lo, hi; /* the names with the bytes so far */
    uint16_t fn, par;
    uint32_t len;    /* bytes of the name so far */
    uint64_t seen;   /* parameters written */
} cm_head;

_Static_assert(sizeof(cm_head) % 8 == 0, "the jsonc state after the head stays aligned");

#define CM_JC(st) ((uint8_t *)(st) + sizeof(cm_head))

static int cm_name_cmp(const cm_name *a, const cm_name *b)
{
    int c = memcmp(a->s, b->s, a->len < b->len ? a->len : b->len);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

static bool cm_ws(uint8_t b)
{
    return b == ' ' || b == '\t' || b == '\n' || b == '\r';
}

/* --- matching ----------------------------------------------------------------------------- */

/* The parameter of the value being written, or NULL for free text. */
static const cm_param *cm_cur(const cm_grammar *g, const cm_head *h)
{
    if (h->par == CM_PAR_ANY)
        return NULL;
    const cm_param *p = &g->fn[h->fn].par[h->par];
    return p->kind == CM_FREE ? NULL : p;
}

size_t cm_state_size(const cm_grammar *g)
{
    return sizeof(cm_head) + ((g->jc_size + 7) & ~(size_t)7);
}

void cm_state_init(const cm_grammar *g, void *st)
{
    cm_head *h = st;
    memset(h, 0, sizeof *h);
    if (g->tags) {
        h->at = CM_TFREE;
    } else if (g->choice) {
        h->at = CM_CHOICE;
        h->hi = (uint16_t)g->n_fn;
    } else if (g->doc) {
        h->at = CM_DOC;
        jc_state_init(g->doc, CM_JC(st));
    }
}

void cm_state_copy(const cm_grammar *g, void *dst, const void *src)
{
    const cm_head *h = src;
    memcpy(dst, src, sizeof *h);
    if (h->at == CM_DOC) {
        jc_state_copy(g->doc, CM_JC(dst), CM_JC(src));
    } else if (h->at == CM_TDOC) {
        jc_state_copy(g->fn[h->fn].tag_sc, CM_JC(dst), CM_JC(src));
    } else if (h->at == CM_VAL) {
        const cm_param *p = cm_cur(g, h);
        if (p)
            jc_state_copy(p->sc, CM_JC(dst), CM_JC(src));
    }
}

/* One byte of the value's text into its jsonc state. */
static bool cm_put(const cm_param *p, cm_head *h, uint8_t *jst, uint8_t b)
{
    if (!p)
        return true;
    if (p->kind == CM_JSON) {
        if (cm_ws(b) && (!h->fed || jc_done(p->sc, jst)))
            return false; /* the text is the value alone */
        h->fed = 1;
        return jc_feed(p->sc, jst, &b, 1);
    }
    /* CM_STRING: the byte as it sits inside a JSON string */
    char esc[8];
    size_t n = 1;
    esc[0] = (char)b;
    if (b == '"' || b == '\\') {
        esc[0] = '\\';
        esc[1] = (char)b;
        n = 2;
    } else if (b < 0x20) {
        n = (size_t)snprintf(esc, sizeof esc, "\\u%04x", b);
    }
    return jc_feed(p->sc, jst, (const uint8_t *)esc, n);
}

/* Whether the value may end here; with end, it does (jst is then the closed value's). */
static bool cm_close(const cm_param *p, const cm_head *h, uint8_t *jst)
{
    if (!p)
        return true;
    if (p->kind == CM_JSON)
        return h->fed && jc_done(p->sc, jst);
    static const uint8_t quote = '"';
    return jc_feed(p->sc, jst, &quote, 1) && jc_done(p->sc, jst);
}

/* Whether the value could still end here or go on with held bytes as its text: what a held
 * newline or "</parameter>" prefix needs to be viable. */
static bool cm_hold_ok(const cm_grammar *g, const cm_head *h, const uint8_t *jst)
{
    const cm_param *p = cm_cur(g, h);
    if (!p)
        return true;
    /* on the stack when it fits (a schema without forks: ~400 bytes); this runs for every '<'
     * and newline of a trie walk */
    _Alignas(8) uint8_t small[1024];
    const size_t sz = jc_state_size(p->sc);
    uint8_t *a = sz <= sizeof small ? small : malloc(sz);
    if (!a)
        return false;
    cm_head c = *h;
    jc_state_copy(p->sc, a, jst);
    bool ok = cm_close(p, &c, a);
    if (!ok) {
        jc_state_copy(p->sc, a, jst);
        ok = !h->nl || cm_put(p, &c, a, '\n');
        for (uint8_t i = 0; ok && i < h->k; i++)
            ok = cm_put(p, &c, a, (uint8_t)CM_PEND[i]);
    }
    if (a != small)
        free(a);
    return ok;
}

/* Name i of the functions (at CM_FNAME) or of the function's parameters. */
static const cm_name *cm_name_at(const cm_grammar *g, const cm_head *h, uint32_t i)
{
    return h->at == CM_PNAME ? &g->fn[h->fn].par[i].name : &g->fn[i].name;
}

/* Narrows [lo, hi) to the names that go on with b: false when none does (or, for a
 * parameter, none not written yet). */
static bool cm_narrow(const cm_grammar *g, cm_head *h, uint8_t b)
{
    uint32_t lo = h->hi, hi = h->hi;
    bool open = h->at != CM_PNAME;
    for (uint32_t i = h->lo; i < h->hi; i++) {
        const cm_name *n = cm_name_at(g, h, i);
        if (n->len > h->len && (uint8_t)n->s[h->len] == b) {
            if (lo == h->hi)
                lo = i;
            hi = i + 1;
            open = open || !(h->seen >> i & 1);
        }
    }
    if (lo == hi || !open)
        return false;
    h->lo = (uint16_t)lo;
    h->hi = (uint16_t)hi;
    h->len++;
    return true;
}

/* A name byte: narrows [lo, hi) to the names that go on with b (a parameter must be one not
 * written yet), or takes the whole name at '>'. */
static bool cm_name_byte(const cm_grammar *g, cm_head *h, uint8_t b)
{
    const bool fn = h->at == CM_FNAME;
    const cm_fn *f = &g->fn[h->fn];
    if (!fn && f->any) { /* any parameter name */
        if (b == '>') {
            if (h->len == 0)
                return false;
            h->at = CM_VSTART;
            h->par = CM_PAR_ANY;
            h->len = 0;
            return true;
        }
        return b != '<' && b != '\n' && b != '\r' && ++h->len <= CM_NAME_MAX;
    }
    if (b == '>') {
        if (h->lo >= h->hi || cm_name_at(g, h, h->lo)->len != h->len)
            return false;
        if (fn) {
            h->fn = h->lo;
            h->at = CM_SEP;
            h->seen = 0;
        } else {
            if (h->seen >> h->lo & 1)
                return false;
            h->par = h->lo;
            h->seen |= 1ull << h->lo;
            h->at = CM_VSTART;
        }
        h->ws = 0;
        h->lo = h->hi = 0;
        h->len = 0;
        return true;
    }
    return cm_narrow(g, h, b);
}

/* The value begins: its jsonc state (a string's opening quote fed). */
static void cm_value_begin(const cm_grammar *g, cm_head *h, uint8_t *jst)
{
    h->at = CM_VAL;
    h->k = h->nl = h->fed = 0;
    const cm_param *p = cm_cur(g, h);
    if (!p)
        return;
    jc_state_init(p->sc, jst);
    if (p->kind == CM_STRING) {
        static const uint8_t quote = '"';
        jc_feed(p->sc, jst, &quote, 1); /* checked when compiled */
    }
}

static bool cm_val_byte(const cm_grammar *g, cm_head *h, uint8_t *jst, uint8_t b)
{
    const cm_param *p = cm_cur(g, h);
    if (h->k > 0) {
        if (b == (uint8_t)CM_PEND[h->k]) {
            if (CM_PEND[++h->k])
                return cm_hold_ok(g, h, jst);
            if (!cm_close(p, h, jst)) /* "</parameter>": the value ends, a held newline dropped */
                return false;
            h->at = CM_SEP;
            h->ws = h->k = h->nl = h->fed = 0;
            h->par = 0;
            return true;
        }
        const uint8_t k = h->k; /* not the end: the held bytes were text */
        h->k = 0;
        if (h->nl) {
            h->nl = 0;
            if (!cm_put(p, h, jst, '\n'))
                return false;
        }
        for (uint8_t i = 0; i < k; i++)
            if (!cm_put(p, h, jst, (uint8_t)CM_PEND[i]))
                return false;
    }
    if (b == '<') { /* '<' occurs once in "</parameter>": a new match can only start here */
        h->k = 1;
        return cm_hold_ok(g, h, jst);
    }
    if (b == '\n') {
        if (h->nl && !cm_put(p, h, jst, '\n'))
            return false;
        h->nl = 1;
        return cm_hold_ok(g, h, jst);
    }
    if (h->nl) {
        h->nl = 0;
        if (!cm_put(p, h, jst, '\n'))
            return false;
    }
    return cm_put(p, h, jst, b);
}

/* tags, free text: the longest end of the text (the len bytes of trigger fn that end it, and
 * b) that begins a trigger; a whole one begins its structures. */
static void cm_tag_free(const cm_grammar *g, cm_head *h, uint8_t *jst, uint8_t b)
{
    char text[CM_NAME_MAX + 1];
    size_t n = h->len;
    if (n)
        memcpy(text, g->trig[h->fn].s, n);
    text[n++] = (char)b;
    h->fn = 0;
    h->len = 0;
    for (size_t k = 0; k < n && !h->len; k++) /* the longest end first */
        for (uint32_t t = 0; t < g->n_trig; t++)
            if (n - k <= g->trig[t].len && memcmp(g->trig[t].s, text + k, n - k) == 0) {
                h->fn = (uint16_t)t;
                h->len = (uint32_t)(n - k);
                break;
            }
    if (h->len == 0 || h->len < g->trig[h->fn].len)
        return;
    /* a trigger is whole: the structures whose begins it opens (a range: begins sorted) */
    const cm_name *tr = &g->trig[h->fn];
    uint32_t lo = 0;
    while (lo < g->n_fn && cm_name_cmp(&g->fn[lo].name, tr) < 0)
        lo++;
    uint32_t hi = lo;
    while (hi < g->n_fn && g->fn[hi].name.len >= tr->len &&
           memcmp(g->fn[hi].name.s, tr->s, tr->len) == 0)
        hi++;
    h->at = CM_TBEGIN;
    h->lo = (uint16_t)lo;
    h->hi = (uint16_t)hi;
    if (g->fn[lo].name.len == h->len) { /* the begin is the trigger itself */
        h->at = CM_TDOC;
        h->fn = (uint16_t)lo;
        jc_state_init(g->fn[lo].tag_sc, jst);
    }
}

static bool cm_tag_byte(const cm_grammar *g, cm_head *h, uint8_t *jst, uint8_t b)
{
    switch (h->at) {
    case CM_TFREE:
        cm_tag_free(g, h, jst, b);
        return true;
    case CM_TBEGIN:
        if (!cm_narrow(g, h, b))
            return false;
        if (g->fn[h->lo].name.len == h->len) { /* no begin is another's beginning */
            h->at = CM_TDOC;
            h->fn = h->lo;
            jc_state_init(g->fn[h->fn].tag_sc, jst);
        }
        return true;
    case CM_TDOC: {
        const cm_fn *f = &g->fn[h->fn];
        /* the end once the JSON is whole (before more whitespace of it) */
        if ((uint8_t)f->end.s[0] == b && jc_done(f->tag_sc, jst)) {
            h->at = CM_TEND;
            h->len = 0;
            return cm_tag_byte(g, h, jst, b);
        }
        return jc_feed(f->tag_sc, jst, &b, 1);
    }
    case CM_TEND: {
        const cm_name *end = &g->fn[h->fn].end;
        if ((uint8_t)end->s[h->len] != b)
            return false;
        if (++h->len == end->len) { /* free again: the state as it was at the start */
            memset(h, 0, sizeof *h);
            h->at = g->tag_stop ? CM_TSTOP : CM_TFREE;
            h->seen = g->tag_least; /* a structure was written (only it tells) */
        }
        return true;
    }
    default:
        return false;
    }
}

static bool cm_byte(const cm_grammar *g, cm_head *h, uint8_t *jst, uint8_t b)
{
    switch (h->at) {
    case CM_TFREE:
    case CM_TBEGIN:
    case CM_TDOC:
    case CM_TEND:
        return cm_tag_byte(g, h, jst, b);
    case CM_TSTOP:
        return false;
    case CM_DOC:
        return jc_feed(g->doc, jst, &b, 1);
    case CM_CHOICE:
        return cm_narrow(g, h, b);
    case CM_PRE:
    case CM_SEP:
    case CM_POST:
        if (cm_ws(b))
            return ++h->ws <= CM_WS_MAX;
        if (h->at == CM_POST || b != '<')
            return false;
        h->ws = 0;
        if (h->at == CM_PRE) {
            h->at = CM_LIT;
            h->lit = LIT_FN;
            h->k = 1;
        } else {
            h->at = CM_TAG;
        }
        return true;
    case CM_TAG: {
        const cm_fn *f = &g->fn[h->fn];
        const uint64_t all = f->n_par >= 64 ? ~0ull : (1ull << f->n_par) - 1;
        if (b == 'p' && (f->any || (h->seen & all) != all)) {
            h->at = CM_LIT;
            h->lit = LIT_PAR;
            h->k = 2;
            return true;
        }
        if (b == '/' && (f->required & ~h->seen) == 0) {
            h->at = CM_LIT;
            h->lit = LIT_FEND;
            h->k = 2;
            return true;
        }
        return false;
    }
    case CM_LIT: {
        const char *s = cm_lit[h->lit];
        if ((uint8_t)s[h->k] != b)
            return false;
        if (s[++h->k])
            return true;
        h->k = 0;
        h->len = 0;
        if (h->lit == LIT_FN) {
            h->at = CM_FNAME;
            h->lo = 0;
            h->hi = (uint16_t)g->n_fn;
        } else if (h->lit == LIT_PAR) {
            h->at = CM_PNAME;
            h->lo = 0;
            h->hi = (uint16_t)g->fn[h->fn].n_par;
        } else {
            h->at = CM_POST;
            h->ws = 0;
        }
        h->lit = 0;
        return true;
    }
    case CM_FNAME:
    case CM_PNAME:
        return cm_name_byte(g, h, b);
    case CM_VSTART:
        cm_value_begin(g, h, jst);
        return b == '\n' || cm_val_byte(g, h, jst, b);
    case CM_VAL:
        return cm_val_byte(g, h, jst, b);
    default:
        return false;
    }
}

bool cm_feed(const cm_grammar *g, void *st, const uint8_t *bytes, size_t n)
{
    cm_head *h = st;
    for (size_t i = 0; i < n; i++)
        if (!cm_byte(g, h, CM_JC(st), bytes[i]))
            return false;
    return true;
}

bool cm_free_text(const cm_grammar *g, const void *st)
{
    const cm_head *h = st;
    if (h->at == CM_TFREE)
        return h->len == 0 && g->tag_plain;
    if (h->at != CM_VAL || h->k || h->nl)
        return false;
    const cm_param *p = cm_cur(g, h);
    return !p || (p->kind == CM_STRING && jc_free_string(p->sc, CM_JC(st)));
}

bool cm_done(const cm_grammar *g, const void *st)
{
    const cm_head *h = st;
    if (h->at == CM_TFREE || h->at == CM_TSTOP)
        return h->at == CM_TSTOP || !g->tag_least || h->seen;
    if (h->at == CM_CHOICE) /* the exact string sorts first of those it begins */
        return h->lo < h->hi && g->fn[h->lo].name.len == h->len;
    return h->at == CM_POST || (h->at == CM_DOC && jc_done(g->doc, CM_JC(st)));
}

/* --- compiling ------------------------------------------------------------------------------ */

static int cm_fn_cmp(const void *a, const void *b)
{
    return cm_name_cmp(&((const cm_fn *)a)->name, &((const cm_fn *)b)->name);
}

static int cm_param_cmp(const void *a, const void *b)
{
    return cm_name_cmp(&((const cm_param *)a)->name, &((const cm_param *)b)->name);
}

static td_err cm_name_of(const json_t *v, const char *what, cm_name *out)
{
    if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > CM_NAME_MAX)
        return err_set(TD_EINVAL, "tool call: %s must be a string of 1..%d bytes", what,
                       CM_NAME_MAX);
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    for (size_t i = 0; i < n; i++)
        if (s[i] == '<' || s[i] == '>' || s[i] == '\n' || s[i] == '\r' || s[i] == 0)
            return err_set(TD_ENOTSUP, "tool call: %s '%s' has a character ('<', '>', a line "
                           "break or NUL) that cannot stand in a tag", what, s);
    if (!(out->s = malloc(n + 1)))
        return err_set(TD_ENOMEM, "tool call: out of memory");
    memcpy(out->s, s, n + 1);
    out->len = n;
    return TD_OK;
}

/* Keys that assert nothing about a value. */
static bool cm_annotation(const char *k)
{
    static const char *const words[] = {
        "title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
        "writeOnly", "format", "$id", "$schema", "$anchor", "nullable", "contentEncoding",
        "contentMediaType",
    };
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strcmp(k, words[i]) == 0)
            return true;
    return false;
}

const char *cm_value_type(const json_t *schema)
{
    const json_t *t = json_object_get(schema, "type");
    if (json_is_string(t))
        return json_string_value(t);
    size_t i;
    const json_t *x;
    json_array_foreach(t, i, x) {
        if (json_is_string(x) && strcmp(json_string_value(x), "null") != 0)
            return json_string_value(x);
    }
    return NULL;
}

/* Compiles schema (with the parameters' $defs / definitions beside it, for $ref). */
static td_err cm_jc(const json_t *schema, const json_t *params, jc_schema **out)
{
    json_t *s = json_is_object(schema) ? json_copy((json_t *)schema) : json_incref((json_t *)schema);
    if (!s)
        return err_set(TD_ENOMEM, "tool call: out of memory");
    static const char *const defs[] = {"$defs", "definitions"};
    for (int i = 0; i < 2 && json_is_object(s); i++) {
        json_t *d = json_object_get(params, defs[i]);
        if (d && !json_object_get(s, defs[i]))
            json_object_set(s, defs[i], d);
    }
    char *text = json_dumps(s, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(s);
    if (!text)
        return err_set(TD_ENOMEM, "tool call: out of memory");
    td_err e = jc_compile(text, strlen(text), out);
    free(text);
    return e;
}

static td_err cm_param_of(cm_param *p, const char *fname, const json_t *schema,
                          const json_t *params, size_t *jc_size)
{
    if (!json_is_object(schema) && !json_is_true(schema))
        return err_set(TD_EINVAL, "tool call: function '%s' parameter '%s': a schema must be an "
                       "object or true", fname, p->name.s);
    const char *type = cm_value_type(schema);
    bool says = false;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)schema, k, v) says = says || !cm_annotation(k);
    p->kind = type && strcmp(type, "string") == 0 ? CM_STRING : type || says ? CM_JSON : CM_FREE;
    if (p->kind == CM_FREE)
        return TD_OK;
    td_err e = cm_jc(schema, params, &p->sc);
    if (e != TD_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", err_msg());
        return err_set(e, "tool call: function '%s' parameter '%s': %s", fname, p->name.s, why);
    }
    if (jc_state_size(p->sc) > *jc_size)
        *jc_size = jc_state_size(p->sc);
    if (p->kind == CM_STRING) { /* a string must be possible: the value is written as one */
        uint8_t *st = malloc(jc_state_size(p->sc));
        static const uint8_t quote = '"';
        bool ok = st && (jc_state_init(p->sc, st), jc_feed(p->sc, st, &quote, 1));
        free(st);
        if (!ok)
            return err_set(TD_ENOTSUP, "tool call: function '%s' parameter '%s': its type is "
                           "string but its schema admits no string", fname, p->name.s);
    }
    return TD_OK;
}

static td_err cm_fn_xml(cm_fn *f, const json_t *params, size_t *jc_size)
{
    const json_t *props = json_object_get(params, "properties");
    if (props && !json_is_object(props))
        return err_set(TD_EINVAL, "tool call: function '%s': properties must be an object",
                       f->name.s);
    f->any = props == NULL;
    if (f->any)
        return TD_OK;
    if (json_object_size(props) > CM_PARAMS_MAX)
        return err_set(TD_ENOTSUP, "tool call: function '%s' has %zu parameters, at most %d are "
                       "supported", f->name.s, json_object_size(props), CM_PARAMS_MAX);
    f->par = calloc(json_object_size(props) + 1, sizeof *f->par);
    if (!f->par)
        return err_set(TD_ENOMEM, "tool call: out of memory");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)props, k, v) {
        cm_param *p = &f->par[f->n_par++];
        json_t *key = json_string(k);
        td_err e = key ? cm_name_of(key, "a parameter name", &p->name)
                       : err_set(TD_ENOMEM, "tool call: out of memory");
        json_decref(key);
        TD_TRY(e);
        TD_TRY(cm_param_of(p, f->name.s, v, params, jc_size));
    }
    qsort(f->par, f->n_par, sizeof *f->par, cm_param_cmp);
    const json_t *req = json_object_get(params, "required");
    size_t i;
    json_array_foreach(req, i, v) {
        uint32_t j = 0;
        while (j < f->n_par && !(json_is_string(v) && f->par[j].name.len == json_string_length(v) &&
                                 memcmp(f->par[j].name.s, json_string_value(v),
                                        f->par[j].name.len) == 0))
            j++;
        if (j == f->n_par)
            return err_set(TD_ENOTSUP, "tool call: function '%s' requires a parameter its "
                           "properties do not declare", f->name.s);
        f->required |= 1ull << j;
    }
    return TD_OK;
}

/* The JSON form: the union over the functions of {"name": const, "arguments": parameters},
 * the parameters' $defs and definitions gathered at the root. */
static td_err cm_doc(cm_grammar *g, const json_t *tools)
{
    json_t *any = json_array(), *root = json_object(), *defs[2] = {json_object(), json_object()};
    static const char *const dn[] = {"$defs", "definitions"};
    td_err e = any && root && defs[0] && defs[1] ? TD_OK
                                                 : err_set(TD_ENOMEM, "tool call: out of memory");
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        if (e != TD_OK)
            break;
        json_t *params = json_object_get(t, "parameters");
        json_t *p = params ? json_copy(params) : json_true();
        for (int d = 0; p && d < 2 && json_is_object(p); d++) {
            const char *k;
            json_t *v;
            json_object_foreach(json_object_get(p, dn[d]), k, v) {
                json_t *had = json_object_get(defs[d], k);
                if (had && !json_equal(had, v))
                    e = err_set(TD_ENOTSUP, "tool call: two functions define '%s' differently "
                                "in %s", k, dn[d]);
                json_object_set(defs[d], k, v);
            }
            json_object_del(p, dn[d]);
        }
        json_t *branch = json_pack("{s:s,s:{s:{s:O},s:o},s:[s,s],s:b}", "type", "object",
                                   "properties", "name", "const", json_object_get(t, "name"),
                                   "arguments", p, "required", "name", "arguments",
                                   "additionalProperties", 0);
        if (!branch || json_array_append_new(any, branch) != 0)
            e = e != TD_OK ? e : err_set(TD_ENOMEM, "tool call: out of memory");
    }
    char *text = NULL;
    if (e == TD_OK) {
        json_object_set(root, "anyOf", any);
        for (int d = 0; d < 2; d++)
            if (json_object_size(defs[d]))
                json_object_set(root, dn[d], defs[d]);
        if (!(text = json_dumps(root, JSON_COMPACT)))
            e = err_set(TD_ENOMEM, "tool call: out of memory");
    }
    json_decref(any);
    json_decref(root);
    json_decref(defs[0]);
    json_decref(defs[1]);
    if (e == TD_OK) {
        e = jc_compile(text, strlen(text), &g->doc);
        if (e != TD_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", err_msg());
            e = err_set(e, "tool call: %s", why);
        }
    }
    free(text);
    if (e == TD_OK)
        g->jc_size = jc_state_size(g->doc);
    return e;
}

void cm_free(cm_grammar *g)
{
    if (!g)
        return;
    for (uint32_t i = 0; i < g->n_fn; i++) {
        cm_fn *f = &g->fn[i];
        for (uint32_t j = 0; j < f->n_par; j++) {
            free(f->par[j].name.s);
            jc_schema_free(f->par[j].sc);
        }
        free(f->par);
        free(f->name.s);
        free(f->end.s);
        jc_schema_free(f->tag_sc);
    }
    free(g->fn);
    for (uint32_t i = 0; i < g->n_trig; i++)
        free(g->trig[i].s);
    free(g->trig);
    jc_schema_free(g->doc);
    free(g);
}

/* A choice's strings as g's names, sorted, each once. */
static td_err cm_choices(cm_grammar *g, const json_t *choices)
{
    const size_t n = json_array_size(choices);
    if (!json_is_array(choices) || n == 0)
        return err_set(TD_EINVAL, "choice: choices must be a non-empty array of strings");
    if (n > CM_CHOICES_MAX)
        return err_set(TD_ENOTSUP, "choice: %zu strings, at most %d are supported", n,
                       CM_CHOICES_MAX);
    if (!(g->fn = calloc(n, sizeof *g->fn)))
        return err_set(TD_ENOMEM, "choice: out of memory");
    g->choice = true;
    for (size_t i = 0; i < n; i++) {
        const json_t *c = json_array_get(choices, i);
        const size_t m = json_string_length(c);
        if (!json_is_string(c) || m == 0 || m > CM_NAME_MAX)
            return err_set(TD_EINVAL, "choice: choices[%zu] must be a string of 1..%d bytes", i,
                           CM_NAME_MAX);
        cm_name *nm = &g->fn[g->n_fn++].name;
        if (!(nm->s = malloc(m + 1)))
            return err_set(TD_ENOMEM, "choice: out of memory");
        memcpy(nm->s, json_string_value(c), m + 1);
        nm->len = m;
    }
    qsort(g->fn, g->n_fn, sizeof *g->fn, cm_fn_cmp);
    uint32_t k = 1; /* repeats are one */
    for (uint32_t i = 1; i < g->n_fn; i++) {
        if (cm_name_cmp(&g->fn[k - 1].name, &g->fn[i].name) == 0)
            free(g->fn[i].name.s);
        else
            g->fn[k++] = g->fn[i];
    }
    g->n_fn = k;
    return TD_OK;
}

/* A string of 1..CM_NAME_MAX bytes (any bytes but NUL) into out. */
static td_err cm_text_of(const json_t *v, const char *what, cm_name *out)
{
    const size_t n = json_string_length(v);
    if (!json_is_string(v) || n == 0 || n > CM_NAME_MAX ||
        strlen(json_string_value(v)) != n)
        return err_set(TD_EINVAL, "structural tag: %s must be a string of 1..%d bytes (no NUL)",
                       what, CM_NAME_MAX);
    if (!(out->s = malloc(n + 1)))
        return err_set(TD_ENOMEM, "structural tag: out of memory");
    memcpy(out->s, json_string_value(v), n + 1);
    out->len = n;
    return TD_OK;
}

static bool cm_contains(const cm_name *a, const cm_name *b)
{
    return b->len <= a->len && memmem(a->s, a->len, b->s, b->len) != NULL;
}

/* Structural tags (vLLM's structural_tag): triggers, and structures of a begin that opens
 * with one of them, a JSON Schema and an end. */
static td_err cm_tags(cm_grammar *g, const json_t *spec)
{
    const json_t *triggers = json_object_get(spec, "triggers");
    const json_t *structures = json_object_get(spec, "structures");
    static const char *const flags[] = {"at_least_one", "stop_after_first"};
    bool *sets[] = {&g->tag_least, &g->tag_stop};
    for (int k = 0; k < 2; k++) {
        const json_t *f = json_object_get(spec, flags[k]);
        if (f && !json_is_boolean(f))
            return err_set(TD_EINVAL, "structural tag: %s must be a boolean", flags[k]);
        *sets[k] = json_is_true(f);
    }
    const size_t nt = json_array_size(triggers), ns = json_array_size(structures);
    if (!json_is_array(triggers) || nt == 0 || nt > CM_TRIGGERS_MAX)
        return err_set(TD_EINVAL, "structural tag: triggers must be an array of 1..%d strings",
                       CM_TRIGGERS_MAX);
    if (!json_is_array(structures) || ns == 0 || ns > CM_FUNCTIONS_MAX)
        return err_set(TD_EINVAL, "structural tag: structures must be an array of 1..%d "
                       "objects", CM_FUNCTIONS_MAX);
    g->tags = true;
    if (!(g->trig = calloc(nt, sizeof *g->trig)) || !(g->fn = calloc(ns, sizeof *g->fn)))
        return err_set(TD_ENOMEM, "structural tag: out of memory");
    g->tag_plain = true;
    for (size_t i = 0; i < nt; i++) {
        char what[48];
        snprintf(what, sizeof what, "triggers[%zu]", i);
        TD_TRY(cm_text_of(json_array_get(triggers, i), what, &g->trig[g->n_trig]));
        const cm_name *t = &g->trig[g->n_trig++];
        const uint8_t first = (uint8_t)t->s[0];
        g->tag_plain = g->tag_plain && (first == '<' || first == '"' || first == '\\' ||
                                        first < 0x20);
        for (uint32_t k = 0; k + 1 < g->n_trig; k++)
            if (cm_contains(&g->trig[k], t) || cm_contains(t, &g->trig[k]))
                return err_set(TD_ENOTSUP, "structural tag: trigger '%s' holds or is held by "
                               "trigger '%s'", t->s, g->trig[k].s);
    }
    for (size_t i = 0; i < ns; i++) {
        const json_t *st = json_array_get(structures, i);
        char what[48];
        cm_fn *f = &g->fn[g->n_fn++];
        snprintf(what, sizeof what, "structures[%zu].begin", i);
        TD_TRY(cm_text_of(json_object_get(st, "begin"), what, &f->name));
        snprintf(what, sizeof what, "structures[%zu].end", i);
        TD_TRY(cm_text_of(json_object_get(st, "end"), what, &f->end));
        uint32_t t = 0;
        while (t < g->n_trig && (g->trig[t].len > f->name.len ||
                                 memcmp(g->trig[t].s, f->name.s, g->trig[t].len) != 0))
            t++;
        if (t == g->n_trig)
            return err_set(TD_EINVAL, "structural tag: structures[%zu].begin '%s' does not "
                           "begin with a trigger", i, f->name.s);
        const json_t *schema = json_object_get(st, "schema");
        if (!json_is_object(schema) && !json_is_boolean(schema))
            return err_set(TD_EINVAL, "structural tag: structures[%zu].schema must be a JSON "
                           "Schema (an object or a boolean)", i);
        td_err e = cm_jc(schema, NULL, &f->tag_sc);
        if (e != TD_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", err_msg());
            return err_set(e, "structural tag: structures[%zu].schema: %s", i, why);
        }
        const size_t sz = jc_state_size(f->tag_sc);
        g->jc_size = sz > g->jc_size ? sz : g->jc_size;
    }
    for (uint32_t t = 0; t < g->n_trig; t++) {
        uint32_t k = 0;
        while (k < g->n_fn && (g->trig[t].len > g->fn[k].name.len ||
                               memcmp(g->trig[t].s, g->fn[k].name.s, g->trig[t].len) != 0))
            k++;
        if (k == g->n_fn)
            return err_set(TD_EINVAL, "structural tag: trigger '%s' begins no structure",
                           g->trig[t].s);
    }
    qsort(g->fn, g->n_fn, sizeof *g->fn, cm_fn_cmp);
    for (uint32_t k = 1; k < g->n_fn; k++) /* sorted: a beginning sorts right before */
        if (g->fn[k - 1].name.len <= g->fn[k].name.len &&
            memcmp(g->fn[k - 1].name.s, g->fn[k].name.s, g->fn[k - 1].name.len) == 0)
            return err_set(TD_ENOTSUP, "structural tag: the begin '%s' is the beginning of the "
                           "begin '%s'", g->fn[k - 1].name.s, g->fn[k].name.s);
    return TD_OK;
}

td_err cm_compile(const char *spec, size_t len, cm_grammar **out)
{
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(spec, len, 0, &je);
    if (!root)
        return err_set(TD_EINVAL, "tool call: the spec is not JSON: %s (line %d, column %d)",
                       je.text, je.line, je.column);
    const json_t *form = json_object_get(root, "form");
    const bool tags = json_is_string(form) && strcmp(json_string_value(form), "tags") == 0;
    if (tags || (json_is_string(form) && strcmp(json_string_value(form), "choice") == 0)) {
        cm_grammar *g = calloc(1, sizeof *g);
        td_err e = !g ? err_set(TD_ENOMEM, "choice: out of memory")
                   : tags ? cm_tags(g, root)
                          : cm_choices(g, json_object_get(root, "choices"));
        json_decref(root);
        if (e != TD_OK) {
            cm_free(g);
            return e;
        }
        *out = g;
        return TD_OK;
    }
    const json_t *tools = json_object_get(root, "tools");
    const bool xml = json_is_string(form) && strcmp(json_string_value(form), "xml") == 0;
    const bool js = json_is_string(form) && strcmp(json_string_value(form), "json") == 0;
    td_err e = TD_OK;
    if (!xml && !js)
        e = err_set(TD_EINVAL, "tool call: form must be \"xml\", \"json\", \"choice\" or "
                    "\"tags\"");
    else if (!json_is_array(tools) || json_array_size(tools) == 0)
        e = err_set(TD_EINVAL, "tool call: tools must be a non-empty array");
    else if (json_array_size(tools) > CM_FUNCTIONS_MAX)
        e = err_set(TD_ENOTSUP, "tool call: %zu functions, at most %d are supported",
                    json_array_size(tools), CM_FUNCTIONS_MAX);
    cm_grammar *g = e == TD_OK ? calloc(1, sizeof *g) : NULL;
    if (e == TD_OK && (!g || !(g->fn = calloc(json_array_size(tools), sizeof *g->fn))))
        e = err_set(TD_ENOMEM, "tool call: out of memory");
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        if (e != TD_OK)
            break;
        const json_t *params = json_object_get(t, "parameters");
        cm_fn *f = &g->fn[g->n_fn++];
        e = cm_name_of(json_object_get(t, "name"), "a function name", &f->name);
        if (e == TD_OK && params && !json_is_object(params))
            e = err_set(TD_EINVAL, "tool call: function '%s': parameters must be an object",
                        f->name.s);
        if (e == TD_OK && xml)
            e = cm_fn_xml(f, params, &g->jc_size);
    }
    if (e == TD_OK) {
        qsort(g->fn, g->n_fn, sizeof *g->fn, cm_fn_cmp);
        for (uint32_t k = 1; e == TD_OK && k < g->n_fn; k++)
            if (cm_name_cmp(&g->fn[k - 1].name, &g->fn[k].name) == 0)
                e = err_set(TD_EINVAL, "tool call: two functions are named '%s'", g->fn[k].name.s);
    }
    if (e == TD_OK && js)
        e = cm_doc(g, tools);
    json_decref(root);
    if (e != TD_OK) {
        cm_free(g);
        return e;
    }
    *out = g;
    return TD_OK;
}
