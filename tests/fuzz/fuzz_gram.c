/* Fuzz target: the grammar matcher on a hostile grammar and text. The first byte picks GBNF
 * (0 mod 4), a regular expression (1), a JSON Schema pattern with its automaton (2) or a Lark
 * grammar (3); then the grammar, a NUL byte, and the text (without a NUL, the text is empty).
 * A grammar either fails to compile with a message or gives a
 * matcher that, fed one byte at a time into copies (as the server walks its token trie),
 * keeps these invariants:
 *   - the live part of a state never outgrows gm_state_size;
 *   - a copy goes on like the state it was copied from;
 *   - feeding the whole text at once gives the same verdict (and the same state) as byte by
 *     byte;
 *   - a pattern's automaton, stepped over the text's code points, accepts exactly when the
 *     matcher takes the whole text and is done.
 * Invariants are TD_ASSERTs, so a broken one is a crash the fuzzer reports. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/gram.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_match(const gm_grammar *g, const uint8_t *text, size_t n)
{
    const size_t cap = gm_state_size(g);
    uint8_t *st = malloc(cap), *next = malloc(cap), *whole = malloc(cap);
    TD_ASSERT(st && next && whole);
    gm_state_init(g, st);
    size_t i = 0;
    for (; i < n; i++) {
        memset(next, 0xa5, cap);
        gm_state_copy(g, next, st);
        if (!gm_feed(g, next, text + i, 1))
            break;
        TD_ASSERT(gm_state_used(next) >= 12 && gm_state_used(next) <= cap);
        memcpy(st, next, gm_state_used(next));
        (void)gm_done(g, st);
    }
    const bool all = i == n;
    gm_state_init(g, whole);
    TD_ASSERT(gm_feed(g, whole, text, n) == all);
    if (all) {
        const size_t u = gm_state_used(st);
        TD_ASSERT(gm_state_used(whole) == u && memcmp(whole, st, u) == 0);
        TD_ASSERT(gm_done(g, whole) == gm_done(g, st));
    }
    free(st);
    free(next);
    free(whole);
}

/* The automaton against the matcher on text (when it is UTF-8). */
static void fuzz_dfa(const gm_grammar *g, const uint8_t *text, size_t n)
{
    gm_dfa *d = NULL;
    if (gm_dfa_build(g, &d) != TD_OK) {
        TD_ASSERT(d == NULL && err_msg()[0] != '\0');
        return;
    }
    /* the shortest and longest ways to an end agree with every transition: a state's
     * longest is one more than its successors' longest (or unbounded with any of them), its
     * shortest one more than their shortest (0 when it ends) */
    for (uint32_t a = 0; a < d->n_states; a++) {
        uint32_t lo = GM_DFA_FAR, hi = 0;
        bool far = false;
        for (uint32_t k = 0; k < d->n_classes; k++) {
            const uint16_t b = d->next[(size_t)a * d->n_classes + k];
            if (b == GM_DFA_DEAD)
                continue;
            TD_ASSERT(d->dmin[b] != GM_DFA_FAR);
            lo = d->dmin[b] + 1u < lo ? d->dmin[b] + 1u : lo;
            far = far || d->dmax[b] == GM_DFA_FAR;
            hi = !far && d->dmax[b] + 1u > hi ? d->dmax[b] + 1u : hi;
        }
        if (d->dmin[a] == GM_DFA_FAR)
            continue; /* only unreachable states cannot end: no way leads to them */
        TD_ASSERT(d->dmin[a] == (gm_dfa_accepts(d, a) ? 0 : lo));
        TD_ASSERT(d->dmax[a] == (far ? GM_DFA_FAR : hi));
    }
    uint16_t s = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        const utf8proc_ssize_t k = utf8proc_iterate(text + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0)
            goto out; /* not UTF-8: nothing to compare */
        s = gm_dfa_step(d, s, (uint32_t)cp);
        i += (size_t)k;
    }
    {
        uint8_t *st = malloc(gm_state_size(g));
        TD_ASSERT(st);
        gm_state_init(g, st);
        const bool whole = gm_feed(g, st, text, n) && gm_done(g, st);
        TD_ASSERT(whole == (s != GM_DFA_DEAD && gm_dfa_accepts(d, s)));
        free(st);
    }
out:
    gm_dfa_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const int kind = data[0] % 4;
    data++, size--;
    const uint8_t *nul = memchr(data, 0, size);
    const size_t len = nul ? (size_t)(nul - data) : size;
    const uint8_t *text = nul ? nul + 1 : data + size;
    const size_t n = nul ? size - len - 1 : 0;
    gm_grammar *g = NULL;
    const char *t = (const char *)data;
    const td_err e = kind == 0   ? gm_compile_gbnf(t, len, &g)
                     : kind == 1 ? gm_compile_regex(t, len, &g)
                     : kind == 2 ? gm_compile_pattern(t, len, &g)
                                 : gm_compile_lark(t, len, &g);
    if (e != TD_OK) {
        TD_ASSERT(g == NULL && err_msg()[0] != '\0');
        return 0;
    }
    fuzz_match(g, text, n);
    if (kind == 2)
        fuzz_dfa(g, text, n);
    gm_free(g);
    return 0;
}
