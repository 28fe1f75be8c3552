/* Grammar matcher (common/gram.h): a set of parse stacks, advanced one code point at a time.
 *
 * A stack holds positions in the flat element array, the top last: the top is the character
 * set the text must match next, the ones below are where each rule that was entered goes on
 * when it ends (a rule referenced last in its alternative pushes nothing: its caller's own
 * continuation is already below, so repetitions written as right recursion keep a stack of
 * constant depth). A stack that has run out is the sentence ended. The state is every
 * distinct stack the text so far can be parsed into, expanded until each top is a set. */
#include <stdlib.h>
#include <string.h>

#include "common/gram_int.h"
#include "common/hash.h"

#define GM_EXPAND_MAX 256 /* nested expansions of one stack (rule entries and exits) */


/* The state: this header, then n_stacks stacks of (depth, positions [depth] bottom first),
 * all 16-bit; bytes [0, used) are the state. need > 0 inside a UTF-8 character: the bits so
 * far in cp, the bytes still to come in need, the character's length in len. */
typedef struct gm_hdr {
    uint32_t used;
    uint16_t n_stacks;
    uint8_t need, len;
    uint32_t cp;
} gm_hdr;

/* --- building the stacks ------------------------------------------------------------------- */

#define GM_VISIT_BYTES 65536   /* and their bytes */

/* A state being written, and the stacks its expansion has met: a stack is expanded once
 * however many ways lead to it (nullable rules can make their number exponential). */
typedef struct gm_out {
    uint8_t *buf;  /* [GM_STATE_BYTES] the state */
    size_t used;
    uint16_t n;
    bool full;     /* a stack did not fit, or the expansion met too many: not whole */
    uint64_t *seen_hash;   /* [GM_VISIT_MAX] */
    uint32_t *seen_off;    /* [GM_VISIT_MAX] in seen_bytes: depth, then positions */
    int32_t *seen_slot;    /* [2 * GM_VISIT_MAX] open addressing; a slot is taken when its */
    uint32_t *seen_stamp;  /* [2 * GM_VISIT_MAX] stamp is this expansion's */
    uint32_t stamp;
    uint16_t *seen_bytes;  /* [GM_VISIT_BYTES / 2] */
    uint32_t n_seen, seen_used;
} gm_out;

/* Scratch of one expansion (gm_step, gm_finish): on the heap, it is large. */
struct gm_scratch {
    uint64_t hash[GM_VISIT_MAX];
    uint32_t off[GM_VISIT_MAX];
    int32_t slot[2 * GM_VISIT_MAX];
    uint32_t stamp[2 * GM_VISIT_MAX];
    uint32_t last;  /* the last expansion's stamp */
    uint64_t steps; /* stacks expanded, ever (what building an automaton may spend) */
    uint16_t bytes[GM_VISIT_BYTES / 2];
    uint8_t buf[GM_STATE_BYTES];
};

static void gm_out_start(gm_out *o, gm_scratch *x, uint8_t *buf)
{
    if (++x->last == 0) { /* stamps wrapped: no slot may look taken */
        memset(x->stamp, 0, sizeof x->stamp);
        x->last = 1;
    }
    *o = (gm_out){.buf = buf, .used = sizeof(gm_hdr), .seen_hash = x->hash, .seen_off = x->off,
                  .seen_slot = x->slot, .seen_stamp = x->stamp, .stamp = x->last,
                  .seen_bytes = x->bytes};
}

/* False when stk [d] was met before in this expansion (or no more can be told apart: then
 * the expansion is not whole); else remembers it. */
static bool gm_out_first(gm_out *o, const uint16_t *stk, int d)
{
    const uint64_t h = td_hash(TD_HASH_SEED ^ (uint64_t)d, stk, (size_t)d * sizeof *stk);
    uint32_t i = (uint32_t)h & (2 * GM_VISIT_MAX - 1);
    for (; o->seen_stamp[i] == o->stamp; i = (i + 1) & (2 * GM_VISIT_MAX - 1)) {
        const int32_t k = o->seen_slot[i];
        const uint16_t *s = o->seen_bytes + o->seen_off[k];
        if (o->seen_hash[k] == h && s[0] == d && memcmp(s + 1, stk, (size_t)d * 2) == 0)
            return false;
    }
    if (o->n_seen == GM_VISIT_MAX || o->seen_used + (uint32_t)d + 1 > GM_VISIT_BYTES / 2) {
        o->full = true;
        return false;
    }
    const uint32_t k = o->n_seen++;
    o->seen_hash[k] = h;
    o->seen_off[k] = o->seen_used;
    o->seen_bytes[o->seen_used] = (uint16_t)d;
    memcpy(o->seen_bytes + o->seen_used + 1, stk, (size_t)d * 2);
    o->seen_used += (uint32_t)d + 1;
    o->seen_slot[i] = (int32_t)k;
    o->seen_stamp[i] = o->stamp;
    return true;
}

static void gm_out_add(gm_out *o, const uint16_t *stk, int d)
{
    const size_t bytes = (size_t)(d + 1) * sizeof(uint16_t);
    if (o->used + bytes > GM_STATE_BYTES || o->n == UINT16_MAX) {
        o->full = true;
        return;
    }
    const uint16_t dd = (uint16_t)d;
    memcpy(o->buf + o->used, &dd, sizeof dd);
    memcpy(o->buf + o->used + sizeof dd, stk, (size_t)d * sizeof *stk);
    o->used += bytes;
    o->n++;
}

static bool gm_seq_end(const gm_grammar *g, uint32_t pos)
{
    return g->el[pos].kind == GM_END || g->el[pos].kind == GM_ALT;
}

/* The stacks stk [d] becomes once every rule at its top is entered (each alternative) and
 * every ended one left, into o. */
static void gm_expand(const gm_grammar *g, gm_out *o, const uint16_t *stk, int d, int level)
{
    g->scratch->steps++;
    if (o->full || !gm_out_first(o, stk, d))
        return; /* a stack met before gives what it gave then */
    if (level > GM_EXPAND_MAX) {
        o->full = true;
        return;
    }
    if (d == 0) {
        gm_out_add(o, stk, 0);
        return;
    }
    const uint32_t pos = stk[d - 1];
    const gm_el *e = &g->el[pos];
    if (e->kind == GM_CHAR || e->kind == GM_CHAR_NOT) {
        gm_out_add(o, stk, d);
        return;
    }
    uint16_t next[GM_DEPTH_MAX];
    memcpy(next, stk, (size_t)(d - 1) * sizeof *next);
    if (gm_seq_end(g, pos)) { /* the rule on top ended: its caller goes on */
        gm_expand(g, o, next, d - 1, level + 1);
        return;
    }
    int base = d - 1;
    if (!gm_seq_end(g, pos + 1))
        next[base++] = (uint16_t)(pos + 1);
    if (base >= GM_DEPTH_MAX) {
        o->full = true;
        return;
    }
    for (uint32_t a = g->start[e->lo];; a++) {
        next[base] = (uint16_t)a;
        gm_expand(g, o, next, base + 1, level + 1);
        while (!gm_seq_end(g, a))
            a++;
        if (g->el[a].kind == GM_END)
            break;
    }
}

static void gm_out_close(gm_out *o, uint8_t need, uint8_t len, uint32_t cp)
{
    const gm_hdr h = {(uint32_t)o->used, o->n, need, len, cp};
    memcpy(o->buf, &h, sizeof h);
}

/* --- character sets ------------------------------------------------------------------------ */

/* The position after the set at pos. */
static uint32_t gm_set_next(const gm_grammar *g, uint32_t pos)
{
    pos++;
    while (g->el[pos].kind == GM_CHAR_ALT)
        pos++;
    return pos;
}

/* Whether the set at pos holds a code point of [lo, hi]. Ranges are sorted and merged, so a
 * negated set misses all of [lo, hi] only when one of its ranges covers it. */
static bool gm_set_meets(const gm_grammar *g, uint32_t pos, uint32_t lo, uint32_t hi)
{
    const bool neg = g->el[pos].kind == GM_CHAR_NOT;
    for (const gm_el *e = &g->el[pos];; e++) {
        if (neg ? e->lo <= lo && hi <= e->hi : e->lo <= hi && lo <= e->hi)
            return !neg;
        if (e[1].kind != GM_CHAR_ALT)
            return neg;
    }
}

/* --- compiling ----------------------------------------------------------------------------- */

/* The rules that rule r can enter before any character (nullable[s]: rule s can match no
 * text), into to [] from *n on. */
static void gm_left_edges(const gm_grammar *g, const bool *nullable, int32_t r, int32_t *to,
                          uint32_t *n)
{
    for (uint32_t p = g->start[r];; p++) {
        bool go = true; /* still at the alternative's left edge */
        for (; !gm_seq_end(g, p); p++) {
            const gm_el *e = &g->el[p];
            if (!go || e->kind == GM_CHAR_ALT)
                continue;
            go = e->kind == GM_REF && nullable[e->lo];
            if (e->kind == GM_REF)
                to[(*n)++] = (int32_t)e->lo;
        }
        if (g->el[p].kind == GM_END)
            break;
    }
}

/* Left recursion: a rule that reaches itself before any character, into *at (-1: none).
 * Rules that reach no such cycle are peeled off as the graph's sinks; from what is left, a
 * walk along its edges ends up on a cycle. No recursion: grammars may chain thousands of
 * rules. */
static td_err gm_left_cycle(const gm_grammar *g, const bool *nullable, int32_t *at)
{
    const size_t R = (size_t)g->n_rules, E = (size_t)g->n_el + 1;
    uint32_t *first = calloc(R + 1, sizeof *first); /* out-edges of r: to [first[r], first[r+1]) */
    uint32_t *in_first = calloc(R + 1, sizeof *in_first); /* in-edges of r: from [...] */
    uint32_t *out = calloc(R, sizeof *out);   /* out-edges not yet peeled */
    uint32_t *fill = calloc(R, sizeof *fill);
    int32_t *to = malloc(E * sizeof *to), *from = malloc(E * sizeof *from);
    int32_t *queue = malloc(R * sizeof *queue);
    *at = -1;
    if (!first || !in_first || !out || !fill || !to || !from || !queue) {
        free(first), free(in_first), free(out), free(fill), free(to), free(from), free(queue);
        return err_set(TD_ENOMEM, "out of memory for a grammar");
    }
    uint32_t n = 0;
    for (size_t r = 0; r < R; r++) {
        first[r] = n;
        gm_left_edges(g, nullable, (int32_t)r, to, &n);
        out[r] = n - first[r];
    }
    first[R] = n;
    for (uint32_t k = 0; k < n; k++)
        in_first[to[k] + 1]++;
    for (size_t r = 0; r < R; r++)
        in_first[r + 1] += in_first[r];
    for (size_t r = 0; r < R; r++)
        for (uint32_t k = first[r]; k < first[r + 1]; k++)
            from[in_first[to[k]] + fill[to[k]]++] = (int32_t)r;
    size_t head = 0, tail = 0;
    for (size_t r = 0; r < R; r++)
        if (out[r] == 0)
            queue[tail++] = (int32_t)r;
    while (head < tail) {
        const int32_t s = queue[head++];
        for (uint32_t k = in_first[s]; k < in_first[s + 1]; k++)
            if (--out[from[k]] == 0)
                queue[tail++] = from[k];
    }
    for (size_t r = 0; r < R && *at < 0; r++) {
        if (out[r] == 0)
            continue;
        int32_t x = (int32_t)r; /* each step stays among the unpeeled; R steps reach a cycle */
        for (size_t step = 0; step < R; step++) {
            uint32_t k = first[x];
            while (out[to[k]] == 0)
                k++;
            x = to[k];
        }
        *at = x;
    }
    free(first), free(in_first), free(out), free(fill), free(to), free(from), free(queue);
    return TD_OK;
}

void gm_free(gm_grammar *g)
{
    if (!g)
        return;
    free(g->el);
    free(g->start);
    free(g->scratch);
    free(g);
}

td_err gm_finish(td_err e, gm_build *b, int32_t root, const char *what, gm_grammar **out)
{
    *out = NULL;
    if (e != TD_OK) {
        gb_free(b);
        return e;
    }
    gm_grammar *g = calloc(1, sizeof *g);
    bool *nullable = calloc((size_t)b->n_rules, sizeof *nullable);
    if (g) {
        g->el = malloc((b->total ? b->total : 1) * sizeof *g->el);
        g->start = malloc((size_t)b->n_rules * sizeof *g->start);
    }
    if (!g || !nullable || !g->el || !g->start) {
        free(nullable);
        gm_free(g);
        gb_free(b);
        return err_set(TD_ENOMEM, "out of memory for a grammar");
    }
    TD_ASSERT(b->total <= GM_ELEMENTS_MAX);
    for (int32_t r = 0; r < b->n_rules; r++) {
        TD_ASSERT(b->body[r].n > 0 && b->body[r].el[b->body[r].n - 1].kind == GM_END);
        g->start[r] = g->n_el;
        memcpy(g->el + g->n_el, b->body[r].el, b->body[r].n * sizeof *g->el);
        g->n_el += (uint32_t)b->body[r].n;
    }
    g->n_rules = b->n_rules;
    for (bool changed = true; changed;) { /* which rules can match no text */
        changed = false;
        for (int32_t r = 0; r < g->n_rules; r++) {
            if (nullable[r])
                continue;
            bool empty = true;
            for (uint32_t p = g->start[r];; p++) {
                const gm_el *e = &g->el[p];
                if (gm_seq_end(g, p)) {
                    if (empty) {
                        nullable[r] = changed = true;
                        break;
                    }
                    if (e->kind == GM_END)
                        break;
                    empty = true;
                    continue;
                }
                empty = empty && e->kind == GM_REF && nullable[e->lo];
            }
        }
    }
    int32_t at;
    td_err err = gm_left_cycle(g, nullable, &at);
    if (err == TD_OK && at >= 0) {
        const char *name = b->name[b->owner[at]];
        err = err_set(TD_EINVAL, "%s: left recursion through %s'%s' (it can reach itself "
                      "before any character; so does an open repetition of what can be "
                      "empty)", what, b->name[at] ? "the rule " : "a group or repetition in ",
                      name ? name : "root");
    }
    free(nullable);
    gm_scratch *x = err == TD_OK ? calloc(1, sizeof *x) : NULL;
    if (err == TD_OK && !x)
        err = err_set(TD_ENOMEM, "out of memory for a grammar");
    g->scratch = x;
    if (err == TD_OK) {
        gm_out o;
        gm_out_start(&o, x, g->init);
        for (uint32_t a = g->start[root];; a++) { /* every alternative of root */
            uint16_t top = (uint16_t)a;
            gm_expand(g, &o, &top, 1, 0);
            while (!gm_seq_end(g, a))
                a++;
            if (g->el[a].kind == GM_END)
                break;
        }
        gm_out_close(&o, 0, 0, 0);
        if (o.full)
            err = err_set(TD_ENOTSUP, "the grammar's start has more parses than a state of "
                          "%d bytes holds", GM_STATE_BYTES);
    }
    gb_free(b);
    if (err != TD_OK) {
        gm_free(g);
        return err;
    }
    *out = g;
    return TD_OK;
}

/* --- matching ------------------------------------------------------------------------------ */

size_t gm_state_size(const gm_grammar *g)
{
    (void)g;
    return GM_STATE_BYTES;
}

static gm_hdr gm_head(const void *st)
{
    gm_hdr h;
    memcpy(&h, st, sizeof h);
    return h;
}

void gm_state_init(const gm_grammar *g, void *st)
{
    memcpy(st, g->init, gm_head(g->init).used);
}

uint64_t gm_steps(const gm_grammar *g)
{
    return g->scratch->steps;
}

size_t gm_state_used(const void *st)
{
    return gm_head(st).used;
}

void gm_state_copy(const gm_grammar *g, void *dst, const void *src)
{
    (void)g;
    memcpy(dst, src, gm_head(src).used);
}

/* Whether a stack's top holds a code point of [lo, hi]. */
static bool gm_any_meets(const gm_grammar *g, const uint8_t *st, uint32_t lo, uint32_t hi)
{
    const gm_hdr h = gm_head(st);
    size_t at = sizeof h;
    for (uint16_t i = 0; i < h.n_stacks; i++) {
        uint16_t d, top;
        memcpy(&d, st + at, sizeof d);
        if (d > 0) {
            memcpy(&top, st + at + (size_t)d * sizeof top, sizeof top);
            if (gm_set_meets(g, top, lo, hi))
                return true;
        }
        at += (size_t)(d + 1) * sizeof(uint16_t);
    }
    return false;
}

/* The stacks after code point c, in place; false when none takes it. */
static bool gm_step(const gm_grammar *g, uint8_t *st, uint32_t c)
{
    gm_scratch *x = g->scratch;
    gm_out o;
    gm_out_start(&o, x, x->buf);
    const gm_hdr h = gm_head(st);
    size_t at = sizeof h;
    uint16_t stk[GM_DEPTH_MAX];
    for (uint16_t i = 0; i < h.n_stacks && !o.full; i++) {
        uint16_t d;
        memcpy(&d, st + at, sizeof d);
        if (d > 0) {
            memcpy(stk, st + at + sizeof d, (size_t)d * sizeof *stk);
            if (gm_set_meets(g, stk[d - 1], c, c)) {
                stk[d - 1] = (uint16_t)gm_set_next(g, stk[d - 1]);
                gm_expand(g, &o, stk, d, 0);
            }
        }
        at += (size_t)(d + 1) * sizeof(uint16_t);
    }
    if (o.full || o.n == 0)
        return false;
    gm_out_close(&o, 0, 0, 0);
    memcpy(st, x->buf, o.used);
    return true;
}

bool gm_feed(const gm_grammar *g, void *state, const uint8_t *bytes, size_t n)
{
    uint8_t *st = state;
    for (size_t i = 0; i < n; i++) {
        gm_hdr h = gm_head(st);
        const uint8_t c = bytes[i];
        if (h.need == 0) {
            if (c < 0x80) {
                if (!gm_step(g, st, c))
                    return false;
                continue;
            }
            if (c >= 0xc2 && c <= 0xdf)
                h.len = 2;
            else if (c >= 0xe0 && c <= 0xef)
                h.len = 3;
            else if (c >= 0xf0 && c <= 0xf4)
                h.len = 4;
            else
                return false;
            h.need = (uint8_t)(h.len - 1);
            h.cp = c & (0x3fu >> (h.len - 1));
        } else {
            if ((c & 0xc0) != 0x80)
                return false;
            h.cp = h.cp << 6 | (c & 0x3fu);
            h.need--;
        }
        /* the code points the bytes so far can begin: shortest forms, no surrogates */
        static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
        const unsigned rest = 6u * h.need;
        uint32_t lo = h.cp << rest, hi = lo | ((1u << rest) - 1);
        lo = lo < least[h.len] ? least[h.len] : lo;
        hi = hi > GM_CP_MAX ? GM_CP_MAX : hi;
        if (lo > hi || (lo >= 0xd800 && hi <= 0xdfff))
            return false;
        if (h.need == 0) {
            if (!gm_step(g, st, h.cp))
                return false;
            continue;
        }
        if (!gm_any_meets(g, st, lo, hi))
            return false;
        memcpy(st, &h, sizeof h);
    }
    return true;
}

bool gm_done(const gm_grammar *g, const void *state)
{
    (void)g;
    const uint8_t *st = state;
    const gm_hdr h = gm_head(st);
    if (h.need)
        return false;
    size_t at = sizeof h;
    for (uint16_t i = 0; i < h.n_stacks; i++) {
        uint16_t d;
        memcpy(&d, st + at, sizeof d);
        if (d == 0)
            return true;
        at += (size_t)(d + 1) * sizeof(uint16_t);
    }
    return false;
}
