#include "tests/support/jsonc_check.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static jc_schema *compile_ok_ws(const char *schema, bool compact)
{
    jc_schema *s = NULL;
    td_err e = jc_compile_ws(schema, schema ? strlen(schema) : 0, compact, &s);
    if (e != TD_OK)
        fail_msg("compiling %s: %s", schema, err_msg());
    return s;
}

jc_schema *compile_ok(const char *schema)
{
    return compile_ok_ws(schema, false);
}

size_t feed_bytes(const jc_schema *s, void *st, const char *text, size_t len)
{
    size_t size = jc_state_size(s);
    uint8_t *next = malloc(size);
    assert_non_null(next);
    size_t i = 0;
    for (; i < len; i++) {
        memset(next, 0xA5, size); /* the copy must carry everything the state needs */
        jc_state_copy(s, next, st);
        assert_true(jc_state_used(next) <= size);
        if (!jc_feed(s, next, (const uint8_t *)text + i, 1))
            break;
        memcpy(st, next, size);
    }
    free(next);
    return i;
}

static void check_cases_ws(const char *schema, bool compact, const jc_case *cases, size_t n)
{
    jc_schema *s = compile_ok_ws(schema, compact);
    size_t size = jc_state_size(s);
    uint8_t *st = malloc(size), *whole = malloc(size);
    assert_non_null(st);
    assert_non_null(whole);
    for (size_t i = 0; i < n; i++) {
        const jc_case *c = &cases[i];
        char text[4096];
        snprintf(text, sizeof text, "%s%s", c->ok, c->bad ? c->bad : "");
        size_t len = strlen(text), ok = strlen(c->ok);
        jc_state_init(s, st);
        size_t got = feed_bytes(s, st, text, len);
        size_t want = c->bad ? ok : len;
        if (got != want)
            fail_msg("schema %s, text %s: %zu bytes accepted, expected %zu", schema ? schema : "NULL",
                     text, got, want);
        if (!c->bad && jc_done(s, st) != c->done)
            fail_msg("schema %s, text %s: done %d, expected %d", schema ? schema : "NULL", text,
                     !c->done, c->done);
        jc_state_init(s, whole); /* all at once: same verdict */
        assert_int_equal(jc_feed(s, whole, (const uint8_t *)text, len), c->bad == NULL);
    }
    free(st);
    free(whole);
    jc_schema_free(s);
}

void check_cases(const char *schema, const jc_case *cases, size_t n)
{
    check_cases_ws(schema, false, cases, n);
}

void check_cases_compact(const char *schema, const jc_case *cases, size_t n)
{
    check_cases_ws(schema, true, cases, n);
}
