/* Helpers of the JSON constraint's tests (test_jsonc, test_jsonc_ranges): schemas compiled
 * or the test fails, texts fed one byte at a time into copies of the state (as verifyd walks
 * its token trie), and tables of cases, each a text accepted to the byte, then done or not,
 * or rejected at an exact byte. */
#ifndef TANDEM_TESTS_SUPPORT_JSONC_CHECK_H
#define TANDEM_TESTS_SUPPORT_JSONC_CHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "common/jsonc.h"

typedef struct jc_case {
    const char *ok;  /* fed byte by byte, every byte accepted */
    const char *bad; /* NULL, or what follows ok: its first byte is rejected */
    bool done;       /* without bad: jc_done after ok */
} jc_case;

#define DONE(t) {t, NULL, true}
#define VIABLE(t) {t, NULL, false}
#define REJECT(ok, bad) {ok, bad, false}
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* schema compiled (NULL: json_object mode), or the running test fails with the message. */
jc_schema *compile_ok(const char *schema);

/* Feeds text[0..len) one byte at a time, each into a copy of the last state; returns how many
 * bytes were accepted and leaves the last good state in st. */
size_t feed_bytes(const jc_schema *s, void *st, const char *text, size_t len);

/* Each case under schema: byte by byte and all at once. */
void check_cases(const char *schema, const jc_case *cases, size_t n);
/* The same with the schema compiled compact (no whitespace anywhere). */
void check_cases_compact(const char *schema, const jc_case *cases, size_t n);

#endif
