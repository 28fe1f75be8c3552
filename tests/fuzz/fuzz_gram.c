/* Fuzz target: the grammar matcher on a hostile grammar and text. The first byte picks GBNF
 * (even) or a regular expression (odd); then the grammar, a NUL byte, and the text (without a
 * NUL, the text is empty). A grammar either fails to compile with a message or gives a
 * matcher that, fed one byte at a time into copies (as the server walks its token trie),
 * keeps these invariants:
 *   - the live part of a state never outgrows gm_state_size;
 *   - a copy goes on like the state it was copied from;
 *   - feeding the whole text at once gives the same verdict (and the same state) as byte by
 *     byte.
 * Invariants are TD_ASSERTs, so a broken one is a crash the fuzzer reports. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const bool regex = data[0] & 1;
    data++, size--;
    const uint8_t *nul = memchr(data, 0, size);
    const size_t len = nul ? (size_t)(nul - data) : size;
    const uint8_t *text = nul ? nul + 1 : data + size;
    const size_t n = nul ? size - len - 1 : 0;
    gm_grammar *g = NULL;
    const td_err e = regex ? gm_compile_regex((const char *)data, len, &g)
                           : gm_compile_gbnf((const char *)data, len, &g);
    if (e != TD_OK) {
        TD_ASSERT(g == NULL && err_msg()[0] != '\0');
        return 0;
    }
    fuzz_match(g, text, n);
    gm_free(g);
    return 0;
}
