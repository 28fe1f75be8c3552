/* A regular grammar as an automaton over code points (common/gram.h): the subset
 * construction over the matcher's own states, stepped with one representative code point per
 * class of code points that every character set treats alike. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/gram_int.h"
#include "common/hash.h"

static int gm_u32_cmp(const void *a, const void *b)
{
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}


void gm_dfa_free(gm_dfa *d)
{
    if (!d)
        return;
    free(d->lo);
    free(d->next);
    free(d->dmin);
    free(d->dmax);
    free(d);
}

/* The states met while building: their bytes, and a table to find them. */
typedef struct gm_dfa_states {
    uint8_t *blob;
    size_t used, cap;
    uint32_t *off, *len; /* [GM_DFA_STATES] */
    uint64_t *hash;      /* [GM_DFA_STATES] */
    int32_t *slot;       /* [2 * GM_DFA_STATES] */
    uint32_t n;
} gm_dfa_states;

/* The id of state st, added when new: -1 when there is no room, -2 out of memory. */
static int32_t gm_dfa_intern(gm_dfa_states *t, const uint8_t *st)
{
    const size_t len = gm_state_used(st);
    const uint64_t h = td_hash(TD_HASH_SEED, st, len);
    uint32_t i = (uint32_t)h & (2 * GM_DFA_STATES - 1);
    for (; t->slot[i] >= 0; i = (i + 1) & (2 * GM_DFA_STATES - 1)) {
        const int32_t k = t->slot[i];
        if (t->hash[k] == h && t->len[k] == len && memcmp(t->blob + t->off[k], st, len) == 0)
            return k;
    }
    if (t->n == GM_DFA_STATES)
        return -1;
    if (t->used + len > t->cap) {
        const size_t cap = 2 * (t->cap + len);
        uint8_t *blob = realloc(t->blob, cap);
        if (!blob)
            return -2;
        t->blob = blob;
        t->cap = cap;
    }
    const int32_t k = (int32_t)t->n++;
    memcpy(t->blob + t->used, st, len);
    t->off[k] = (uint32_t)t->used;
    t->len[k] = (uint32_t)len;
    t->hash[k] = h;
    t->used += len;
    t->slot[i] = k;
    return k;
}

/* dmax: the longest way from each state to an accepting one, over the transitions that are
 * left (every state they reach can end). States are settled from the ends backwards, each
 * once all its transitions lead to settled ones (Kahn's order over out-degrees); what is
 * never settled lies on or before a loop: FAR. rfirst / rfrom: the transitions into each
 * state as built before the dead ones were cut (only live states' lists are walked, and
 * those lost nothing); queue: room for every state. */
static td_err dfa_longest(gm_dfa *d, uint32_t n_cut, const uint32_t *rfirst,
                          const uint16_t *rfrom, uint16_t *queue)
{
    const uint32_t n = d->n_states;
    d->dmax = malloc(n * sizeof *d->dmax);
    uint32_t *out = calloc(n, sizeof *out);
    if (!d->dmax || !out) {
        free(out);
        return err_set(TD_ENOMEM, "out of memory for a grammar's automaton");
    }
    uint32_t head = 0, tail = 0;
    for (uint32_t s = 0; s < n; s++) {
        for (uint32_t k = 0; k < n_cut; k++)
            out[s] += d->next[(size_t)s * n_cut + k] != GM_DFA_DEAD;
        d->dmax[s] = GM_DFA_FAR; /* until settled */
        if (out[s] == 0 && d->dmin[s] != GM_DFA_FAR) /* an end with no way on */
            queue[tail++] = (uint16_t)s;
    }
    uint16_t *len = malloc(n * sizeof *len); /* the longest way found so far */
    if (!len) {
        free(out);
        return err_set(TD_ENOMEM, "out of memory for a grammar's automaton");
    }
    for (uint32_t s = 0; s < n; s++)
        len[s] = 0;
    while (head < tail) {
        const uint16_t t = queue[head++];
        d->dmax[t] = len[t];
        for (uint32_t i = rfirst[t]; i < rfirst[t + 1]; i++) {
            const uint16_t p = rfrom[i];
            if (len[p] < len[t] + 1)
                len[p] = (uint16_t)(len[t] + 1);
            if (--out[p] == 0)
                queue[tail++] = p;
        }
    }
    free(len);
    free(out);
    return TD_OK;
}

td_err gm_dfa_build(const gm_grammar *g, gm_dfa **out)
{
    *out = NULL;
    gm_dfa *d = calloc(1, sizeof *d);
    uint32_t *cut = malloc((2 * (size_t)g->n_el + 2) * sizeof *cut);
    gm_dfa_states t = {0};
    t.off = malloc(GM_DFA_STATES * sizeof *t.off);
    t.len = malloc(GM_DFA_STATES * sizeof *t.len);
    t.hash = malloc(GM_DFA_STATES * sizeof *t.hash);
    t.slot = malloc(2 * GM_DFA_STATES * sizeof *t.slot);
    uint8_t *st = malloc(GM_STATE_BYTES);
    td_err e = d && cut && t.off && t.len && t.hash && t.slot && st
                   ? TD_OK
                   : err_set(TD_ENOMEM, "out of memory for a grammar's automaton");
    uint32_t n_cut = 0;
    if (e == TD_OK) { /* classes: code points between the sets' range ends behave alike */
        memset(t.slot, 0xff, 2 * GM_DFA_STATES * sizeof *t.slot);
        cut[n_cut++] = 0;
        for (uint32_t i = 0; i < g->n_el; i++) {
            const gm_el *el = &g->el[i];
            if (el->kind != GM_CHAR && el->kind != GM_CHAR_NOT && el->kind != GM_CHAR_ALT)
                continue;
            cut[n_cut++] = el->lo;
            if (el->hi < GM_CP_MAX)
                cut[n_cut++] = el->hi + 1;
        }
        qsort(cut, n_cut, sizeof *cut, gm_u32_cmp);
        uint32_t m = 0;
        for (uint32_t i = 0; i < n_cut; i++)
            if (m == 0 || cut[i] != cut[m - 1])
                cut[m++] = cut[i];
        n_cut = m;
        d->n_classes = n_cut;
        d->lo = malloc(((size_t)n_cut + 1) * sizeof *d->lo);
        if (!d->lo)
            e = err_set(TD_ENOMEM, "out of memory for a grammar's automaton");
        else {
            memcpy(d->lo, cut, n_cut * sizeof *cut);
            d->lo[n_cut] = GM_CP_MAX + 1;
        }
    }
    uint16_t *next = NULL;
    size_t cap_next = 0;
    const uint64_t steps0 = gm_steps(g);
    if (e == TD_OK && gm_dfa_intern(&t, g->init) != 0)
        e = err_set(TD_ENOMEM, "out of memory for a grammar's automaton");
    for (uint32_t s = 0; e == TD_OK && s < t.n; s++) { /* breadth first: ids in order met */
        if (gm_steps(g) - steps0 > GM_DFA_STEPS) {
            e = err_set(TD_ENOTSUP, "the pattern's automaton takes more than %u parse steps to "
                        "build (%u states met)", GM_DFA_STEPS, t.n);
            break;
        }
        if ((size_t)t.n * n_cut > GM_DFA_TRANSITIONS) {
            e = err_set(TD_ENOTSUP, "the pattern needs more than %u automaton transitions (%u "
                        "states met of %u character classes)", GM_DFA_TRANSITIONS, t.n, n_cut);
            break;
        }
        if ((size_t)(s + 1) * n_cut > cap_next) {
            cap_next = 2 * ((size_t)(s + 1) * n_cut);
            uint16_t *nx = realloc(next, cap_next * sizeof *nx);
            if (!nx) {
                e = err_set(TD_ENOMEM, "out of memory for a grammar's automaton");
                break;
            }
            next = nx;
        }
        for (uint32_t k = 0; k < n_cut && e == TD_OK; k++) {
            uint32_t rep = d->lo[k]; /* surrogates are no characters: the class's first other */
            if (rep >= 0xd800 && rep <= 0xdfff)
                rep = 0xe000;
            uint16_t to = GM_DFA_DEAD;
            if (rep < d->lo[k + 1]) {
                uint8_t bytes[4];
                const size_t nb = (size_t)utf8proc_encode_char((utf8proc_int32_t)rep, bytes);
                memcpy(st, t.blob + t.off[s], t.len[s]);
                if (gm_feed(g, st, bytes, nb)) {
                    const int32_t id = gm_dfa_intern(&t, st);
                    if (id == -1)
                        e = err_set(TD_ENOTSUP, "the pattern needs more than %d automaton "
                                    "states", GM_DFA_STATES);
                    else if (id < 0)
                        e = err_set(TD_ENOMEM, "out of memory for a grammar's automaton");
                    to = (uint16_t)id;
                }
            }
            next[(size_t)s * n_cut + k] = to;
        }
    }
    if (e == TD_OK) { /* dmin: breadth first backwards from the accepting states */
        d->n_states = t.n;
        d->next = next;
        next = NULL;
        d->dmin = malloc(t.n * sizeof *d->dmin);
        uint32_t *rfirst = calloc((size_t)t.n + 1, sizeof *rfirst);
        uint32_t *rfill = calloc(t.n, sizeof *rfill);
        const size_t n_edges = (size_t)t.n * n_cut;
        uint16_t *rfrom = malloc((n_edges ? n_edges : 1) * sizeof *rfrom);
        uint16_t *queue = malloc(t.n * sizeof *queue);
        if (!d->dmin || !rfirst || !rfill || !rfrom || !queue) {
            e = err_set(TD_ENOMEM, "out of memory for a grammar's automaton");
        } else {
            for (size_t i = 0; i < n_edges; i++)
                if (d->next[i] != GM_DFA_DEAD)
                    rfirst[d->next[i] + 1]++;
            for (uint32_t s = 0; s < t.n; s++)
                rfirst[s + 1] += rfirst[s];
            for (size_t i = 0; i < n_edges; i++)
                if (d->next[i] != GM_DFA_DEAD) {
                    const uint16_t to = d->next[i];
                    rfrom[rfirst[to] + rfill[to]++] = (uint16_t)(i / n_cut);
                }
            uint32_t head = 0, tail = 0;
            for (uint32_t s = 0; s < t.n; s++) {
                d->dmin[s] = gm_done(g, t.blob + t.off[s]) ? 0 : GM_DFA_FAR;
                if (d->dmin[s] == 0)
                    queue[tail++] = (uint16_t)s;
            }
            while (head < tail) {
                const uint16_t s = queue[head++];
                for (uint32_t i = rfirst[s]; i < rfirst[s + 1]; i++)
                    if (d->dmin[rfrom[i]] == GM_DFA_FAR) {
                        d->dmin[rfrom[i]] = (uint16_t)(d->dmin[s] + 1);
                        queue[tail++] = rfrom[i];
                    }
            }
            for (size_t i = 0; i < n_edges; i++) /* states that cannot end are no way on */
                if (d->next[i] != GM_DFA_DEAD && d->dmin[d->next[i]] == GM_DFA_FAR)
                    d->next[i] = GM_DFA_DEAD;
            e = dfa_longest(d, n_cut, rfirst, rfrom, queue);
        }
        free(rfirst);
        free(rfill);
        free(rfrom);
        free(queue);
    }
    free(next);
    free(cut);
    free(st);
    free(t.blob);
    free(t.off);
    free(t.len);
    free(t.hash);
    free(t.slot);
    if (e != TD_OK) {
        gm_dfa_free(d);
        return e;
    }
    *out = d;
    return TD_OK;
}

/* The class of cp: the last k with lo[k] <= cp. */
static uint32_t gm_dfa_class(const gm_dfa *d, uint32_t cp)
{
    uint32_t a = 0, b = d->n_classes; /* lo[a] <= cp < lo[b] */
    while (b - a > 1) {
        const uint32_t m = (a + b) / 2;
        if (d->lo[m] <= cp)
            a = m;
        else
            b = m;
    }
    return a;
}

uint16_t gm_dfa_step(const gm_dfa *d, uint16_t s, uint32_t cp)
{
    if (s == GM_DFA_DEAD || cp > GM_CP_MAX)
        return GM_DFA_DEAD;
    return d->next[(size_t)s * d->n_classes + gm_dfa_class(d, cp)];
}

bool gm_dfa_meets(const gm_dfa *d, uint16_t s, uint32_t lo, uint32_t hi, uint32_t least,
                  uint32_t most)
{
    if (s == GM_DFA_DEAD)
        return false;
    for (uint32_t k = gm_dfa_class(d, lo); k < d->n_classes && d->lo[k] <= hi; k++) {
        const uint16_t to = d->next[(size_t)s * d->n_classes + k];
        if (to != GM_DFA_DEAD && gm_dfa_room(d, to, least, most))
            return true;
    }
    return false;
}
