/* JSON Schema pattern in the JSON constraint against PCRE2: random strings of ASCII, Cyrillic,
 * accented, CJK and emoji characters, each written raw or as \u escapes (surrogate pairs for
 * the emoji) or as JSON's short escapes, are taken whole by the constraint under
 * {"type": "string", "pattern": P} exactly when PCRE2 finds P in the decoded string (so one
 * PCRE2 matches is never cut early). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/jsonc_check.h"

/* The characters strings are made of: UTF-8, and the code point for \u escapes. */
static const struct {
    const char *utf8;
    uint32_t cp;
} CHARS[] = {
    {"a", 'a'}, {"Z", 'Z'}, {"1", '1'}, {"-", '-'}, {"\xd0\xb4", 0x434}, {"\xd1\x8f", 0x44F},
    {"\xd0\xaf", 0x42F}, {"\xc3\xa9", 0xE9}, {"\xe4\xb8\x80", 0x4E00},
    {"\xf0\x9f\x98\x80", 0x1F600}, {"\n", '\n'}, {"\"", '"'},
};
enum { N_CHARS = sizeof CHARS / sizeof CHARS[0] };

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t next_rand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* Character c as JSON string content into out: raw where JSON allows, else (and at random) an
 * escape. */
static size_t json_char(int c, char *out)
{
    const uint32_t cp = CHARS[c].cp;
    const uint32_t how = next_rand() % 3;
    if (cp == '\n')
        return (size_t)sprintf(out, how ? "\\n" : "\\u000a");
    if (cp == '"')
        return (size_t)sprintf(out, how ? "\\\"" : "\\u0022");
    if (how != 0)
        return (size_t)sprintf(out, "%s", CHARS[c].utf8);
    if (cp >= 0x10000)
        return (size_t)sprintf(out, "\\u%04x\\u%04X", 0xD800 + ((cp - 0x10000) >> 10),
                               0xDC00 + ((cp - 0x10000) & 0x3FF));
    return (size_t)sprintf(out, "\\u%04x", cp);
}

static bool pcre_finds(pcre2_code *re, pcre2_match_data *md, const char *s, size_t n)
{
    return pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, NULL) >= 0;
}

static void test_patterns_agree_with_pcre2_on_random_strings(void **ctx)
{
    (void)ctx;
    static const char *const pats[] = {
        "^[\xd0\xb0-\xd1\x8f]+$", "\xc3\xa9|\xf0\x9f\x98\x80", "^\\w+\\d$", "a.Z",
        "^[^a-z]*$", "[\xe4\xb8\x80-\xe9\xbe\xa5]{2}", "^(a|\xd0\xb4)*-?$", "\\s\"",
        "^.{2,3}$", "1$",
    };
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    assert_non_null(md);
    long agree = 0, matched = 0;
    for (size_t k = 0; k < sizeof pats / sizeof pats[0]; k++) {
        /* the schema's pattern as a JSON string: escape quotes and backslashes */
        char schema[256] = "{\"type\":\"string\",\"pattern\":\"";
        for (const char *p = pats[k]; *p; p++) {
            const size_t at = strlen(schema);
            if (*p == '"' || *p == '\\')
                schema[at] = '\\', schema[at + 1] = *p, schema[at + 2] = 0;
            else
                schema[at] = *p, schema[at + 1] = 0;
        }
        strcat(schema, "\"}");
        jc_schema *s = compile_ok(schema);
        int errc;
        PCRE2_SIZE erroff;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)pats[k], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &errc, &erroff, NULL);
        assert_non_null(re);
        uint8_t *st = malloc(jc_state_size(s));
        assert_non_null(st);
        for (int trial = 0; trial < 400; trial++) {
            char text[128] = "\"", plain[64] = "";
            size_t n = 1, m = 0;
            const int len = (int)(next_rand() % 6);
            for (int i = 0; i < len; i++) {
                const int c = (int)(next_rand() % N_CHARS);
                n += json_char(c, text + n);
                m += (size_t)sprintf(plain + m, "%s", CHARS[c].utf8);
            }
            text[n++] = '"';
            text[n] = 0;
            const bool want = pcre_finds(re, md, plain, m);
            jc_state_init(s, st);
            const size_t took = feed_bytes(s, st, text, n);
            const bool whole = took == n && jc_done(s, st);
            if (whole != want)
                fail_msg("/%s/ on %s: taken %zu of %zu bytes, whole %d; PCRE2 finds %d",
                         pats[k], text, took, n, whole, want);
            agree++;
            matched += want;
        }
        free(st);
        pcre2_code_free(re);
        jc_schema_free(s);
    }
    pcre2_match_data_free(md);
    printf("%ld strings under %zu patterns agree with PCRE2 (%ld of them matches)\n", agree,
           sizeof pats / sizeof pats[0], matched);
    assert_true(matched > 400 && matched < agree - 400);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_patterns_agree_with_pcre2_on_random_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
