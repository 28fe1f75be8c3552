/* Fuzz target: the JSON constraint on a hostile schema and text. The input is the schema, a NUL
 * byte, then the text; without a NUL the whole input is a text for json_object mode (NULL
 * schema). An input of odd length compiles the schema compact (no whitespace). A schema either
 * fails to compile with a message or gives a matcher that, fed one byte at a time into copies
 * (as the server walks its token trie), keeps these invariants:
 *   - the live part of a state never outgrows jc_state_size;
 *   - where jc_free_string holds, a plain string chunk is accepted and changes no byte;
 *   - feeding the whole text at once gives the same verdict as byte by byte;
 *   - a text that is all accepted and done parses with jansson;
 *   - compact, the accepted bytes hold no whitespace outside strings.
 * Invariants are TD_ASSERTs, so a broken one is a crash the fuzzer reports. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Whether text[0..n) has a JSON whitespace byte outside its strings. */
static bool ws_outside_strings(const uint8_t *text, size_t n)
{
    bool inside = false, escaped = false;
    for (size_t i = 0; i < n; i++) {
        const uint8_t c = text[i];
        if (inside) {
            inside = escaped || c != '"';
            escaped = !escaped && c == '\\';
        } else if (c == '"') {
            inside = true;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            return true;
        }
    }
    return false;
}

static void fuzz_match(const jc_schema *s, bool compact, const uint8_t *text, size_t n)
{
    static const char chunk[] = "plain caf\xc3\xa9 \xf0\x9f\x98\x80 {}[]:,";
    size_t cap = jc_state_size(s);
    uint8_t *st = malloc(cap), *next = malloc(cap), *probe = malloc(cap);
    TD_ASSERT(st && next && probe);
    jc_state_init(s, st);
    size_t i = 0;
    for (; i < n; i++) {
        jc_state_copy(s, next, st);
        if (!jc_feed(s, next, text + i, 1))
            break;
        TD_ASSERT(jc_state_used(next) <= cap);
        memcpy(st, next, jc_state_used(next));
        (void)jc_done(s, st);
        if (jc_free_string(s, st)) {
            jc_state_copy(s, probe, st);
            TD_ASSERT(jc_feed(s, probe, (const uint8_t *)chunk, sizeof chunk - 1));
            TD_ASSERT(jc_state_used(probe) == jc_state_used(st));
            TD_ASSERT(memcmp(probe, st, jc_state_used(st)) == 0);
        }
    }
    bool all = i == n;
    TD_ASSERT(!compact || !ws_outside_strings(text, i));
    if (all && jc_done(s, st)) {
        json_t *v = json_loadb((const char *)text, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        TD_ASSERT(v != NULL);
        json_decref(v);
    }
    jc_state_init(s, probe);
    TD_ASSERT(jc_feed(s, probe, text, n) == all);
    free(st);
    free(next);
    free(probe);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    const char *schema = nul ? (const char *)data : NULL;
    size_t schema_len = nul ? (size_t)(nul - data) : 0;
    const uint8_t *text = nul ? nul + 1 : data;
    size_t n = nul ? size - schema_len - 1 : size;
    jc_schema *s = NULL;
    const bool compact = size & 1;
    if (jc_compile_ws(schema, schema_len, compact, &s) != TD_OK) {
        TD_ASSERT(s == NULL && err_msg()[0] != '\0');
        return 0;
    }
    fuzz_match(s, compact, text, n);
    jc_schema_free(s);
    return 0;
}
