/* The JSON constraint (common/jsonc.h): for each schema, whole documents that must be accepted
 * and done, prefixes that must stay viable but not done, and texts rejected at an exact byte
 * (written as the accepted part and the rest, whose first byte is the rejected one). Then
 * compile errors with their messages, jc_free_string and its "state unchanged" promise, and
 * random documents from hand-written generators (every prefix viable, the whole done, jansson
 * agrees), with random byte mutations that must never crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonc.h"
#include "tests/support/jsonc_check.h"

static void any_value_follows_the_json_grammar(void **state)
{
    (void)state;
    static const jc_case cases[] = {
        DONE("1"), DONE("-0.5e+3"), DONE("\"x\""), DONE("true"), DONE("false"), DONE("null"),
        DONE("[1,{\"a\":[]},\"b\"]"), DONE("  {\"a\" : 1 ,\"b\":[ ] }  "), DONE("[]"), DONE("{}"),
        DONE("0"), DONE("-0"), DONE("0.0e-0"), DONE("1E+2"), DONE("12 "),
        VIABLE("[1,"), VIABLE("{\"a\""), VIABLE("tr"), VIABLE("-"), VIABLE("1."), VIABLE("1e"),
        VIABLE("1e+"), VIABLE(" "), VIABLE(""), VIABLE("[[[[]]]"),
        REJECT("0", "1"), REJECT("1.", "e"), REJECT("-", "a"), REJECT("tru", " e"),
        REJECT("[1,", "]"), REJECT("{\"a\" ", "1}"), REJECT("{", ",}"), REJECT("[1 ", "2]"),
        REJECT("nul", "1"), REJECT("1 ", "2"), REJECT("", "}"), REJECT("\"\"", "x"),
        REJECT("{\"a\":1,", "}"), REJECT("", "+1"), REJECT("", ".5"), REJECT("[", ":"),
        REJECT("{", "a"), REJECT("{\"a\"", ",1}"), REJECT("[1]", "]"), REJECT("", "'a'"),
        REJECT("", "NaN"), REJECT("-", "Infinity"), REJECT("[", "\x0c]"),
    };
    check_cases("{}", cases, N_OF(cases));
    check_cases("true", cases, N_OF(cases));
}

static void whitespace_runs_are_limited_to_64_bytes(void **state)
{
    (void)state;
    char ws64[65], nl60[61], a[128], b[128], c[128], d[128], e[128], f[200], g[128], sp[131];
    memset(ws64, ' ', 64);
    ws64[64] = 0;
    memset(nl60, '\n', 60);
    nl60[60] = 0;
    snprintf(a, sizeof a, "%s1", ws64);
    snprintf(b, sizeof b, "[\t%.63s1]", ws64);
    snprintf(c, sizeof c, "1%s", ws64);
    snprintf(d, sizeof d, "{\"a\":%s", ws64);
    snprintf(e, sizeof e, "[1,%s2]", ws64);
    snprintf(g, sizeof g, "[ 1 ,%s\n\r\t ", nl60); /* 64 mixed whitespace bytes */
    memset(sp, ' ', 130);
    sp[130] = 0;
    snprintf(f, sizeof f, "\"%s\"", sp); /* inside a string: content, not whitespace */
    const jc_case cases[] = {
        DONE(a), DONE(b), DONE(c), VIABLE(d), DONE(e), DONE(f),
        REJECT(ws64, " 1"), REJECT(c, "\r"), REJECT(d, " 1}"), REJECT(g, "\n2]"),
    };
    check_cases("{}", cases, N_OF(cases));
}

static void compact_documents_have_no_whitespace_anywhere(void **state)
{
    (void)state;
    static const jc_case cases[] = {
        DONE("{\"a\":[1,{}],\"b\":\"x y\"}"), DONE("{}"), VIABLE("{\"a\":"),
        REJECT("", " {}"), REJECT("{", " }"), REJECT("{\"a\"", " :1}"), REJECT("{\"a\":", "\n1}"),
        REJECT("{\"a\":[1,", " 2]}"), REJECT("{}", " "), REJECT("{}", "\n"),
    };
    check_cases_compact(NULL, cases, N_OF(cases));
    static const jc_case typed[] = {
        DONE("{\"n\":12}"), REJECT("{\"n\":12", " }"), REJECT("", "\t{"),
    };
    check_cases_compact("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}}}",
                        typed, N_OF(typed));
}

static void numbers_end_where_they_cannot_continue_and_are_at_most_64_bytes(void **state)
{
    (void)state;
    char n64[65], arr[80], n63[64];
    memset(n64, '7', 64);
    memcpy(n64, "0.", 2);
    n64[64] = 0;
    memcpy(n63, n64, 63);
    n63[63] = 0;
    snprintf(arr, sizeof arr, "[%s]", n64);
    const jc_case cases[] = {
        DONE(n64), DONE(arr), DONE(n63), VIABLE("[1e"), REJECT(n64, "7"), DONE("[1,2.5]"),
        DONE("{\"a\":-1e5}"), DONE("[0 ,1]"), REJECT("[0", "1]"), REJECT("[1.5", ".]"), REJECT("[1e5", "e]"),
        REJECT("[-", "]"), REJECT("[1e", ",2]"), REJECT("[1.", "]"),
    };
    check_cases("{}", cases, N_OF(cases));
}

/* The server parses its output with jansson, which refuses integers beyond int64 and reals that
 * overflow a double: such numbers cannot end (a long integer may still become a real). */
static void numbers_end_only_where_jansson_can_read_them(void **state)
{
    (void)state;
    static const jc_case number[] = {
        DONE("9223372036854775807"), DONE("-9223372036854775808"), VIABLE("9223372036854775808"),
        DONE("9223372036854775808.0"), DONE("12345678901234567890e2"), DONE("1e307"),
        DONE("9.9e306"), DONE("1e-400"), DONE("-1E+0307"), REJECT("1e30", "8"),
        REJECT("10e30", "7"), REJECT("[12345678901234567890", "]"),
        REJECT("-9223372036854775809", " "),
    };
    check_cases("{}", number, N_OF(number));
    static const jc_case integer[] = {
        DONE("9223372036854775807"), DONE("-9223372036854775808"), DONE("999999999999999999"),
        REJECT("922337203685477580", "8"), REJECT("-922337203685477580", "9"),
        REJECT("999999999999999999", "9"),
    };
    check_cases("{\"type\":\"integer\"}", integer, N_OF(integer));
}

static void integer_type_accepts_only_the_integer_grammar(void **state)
{
    (void)state;
    static const jc_case cases[] = {
        DONE("0"), DONE("-12"), DONE("12 "), VIABLE("-"), REJECT("1", ".5"), REJECT("1", "e3"),
        REJECT("0", "1"), REJECT("", "\"1\""), REJECT("", "true"),
    };
    check_cases("{\"type\":\"integer\"}", cases, N_OF(cases));
    static const jc_case number[] = {DONE("1.5"), DONE("1e3"), DONE("-0"), REJECT("", "null")};
    check_cases("{\"type\":\"number\"}", number, N_OF(number));
}

static void string_escapes_and_surrogate_pairs(void **state)
{
    (void)state;
    static const jc_case cases[] = {
        DONE("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\uABCD\\uabcd\""),
        DONE("\"\\ud83d\\ude00\""), DONE("\"\\uD83D\\uDE00x\""), VIABLE("\"\\ud83d"),
        VIABLE("\"\\ud83d\\u"), REJECT("\"\\", "x\""), REJECT("\"\\u12", "g4\""),
        REJECT("\"a", "\tb\""), REJECT("\"", "\x01\""), REJECT("\"\\ud83d", "x"),
        REJECT("\"\\ud83d\\u", "0041"), REJECT("\"\\ud83d\\ud", "0"),
        REJECT("\"\\ud83d\\", "n"), REJECT("\"\\ud", "e0\""), REJECT("\"\\uD", "Cff\""),
        DONE("\"\\udbff\\udfff\""), REJECT("\"\\udbff\\ud", "bff\""),
        REJECT("\"\\ud83d", "\""), DONE("\"\x7f\""),
    };
    check_cases("{\"type\":\"string\"}", cases, N_OF(cases));
}

static void raw_utf8_must_be_valid(void **state)
{
    (void)state;
    static const jc_case cases[] = {
        DONE("\"caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf \xed\x9f\xbf\""),
        VIABLE("\"\xf0\x9f\x98"), REJECT("\"", "\xc0\x80\""), REJECT("\"", "\xc1\xbf\""),
        REJECT("\"\xe0", "\x80\x80\""), REJECT("\"\xed", "\xa0\x80\""),
        REJECT("\"\xf0", "\x80\x80\x80\""), REJECT("\"\xf4", "\x90\x80\x80\""),
        REJECT("\"", "\xf5\x80\""), REJECT("\"", "\x80\""), REJECT("\"\xc3", "\""),
        REJECT("\"\xe4\xb8", "x\""), REJECT("\"", "\xff\""),
    };
    check_cases("{\"type\":\"string\"}", cases, N_OF(cases));
}

static void a_character_may_be_split_across_feeds(void **state)
{
    (void)state;
    jc_schema *s = compile_ok("{\"type\":\"string\",\"maxLength\":2}");
    uint8_t *st = malloc(jc_state_size(s));
    assert_non_null(st);
    static const char *const pieces[][4] = {
        {"\"caf", NULL}, /* too long: rejected below */
        {"\"\xf0", "\x9f\x98", "\x80\xc3", "\xa9\""},
        {"\"\xf0\x9f", "\x98\x80", "\xe4\xb8", "\xad\""},
    };
    jc_state_init(s, st);
    assert_false(jc_feed(s, st, (const uint8_t *)pieces[0][0], 4));
    for (size_t k = 1; k < 3; k++) {
        jc_state_init(s, st);
        for (size_t i = 0; i < 4; i++) {
            assert_true(jc_feed(s, st, (const uint8_t *)pieces[k][i], strlen(pieces[k][i])));
            assert_int_equal(jc_done(s, st), i == 3);
        }
    }
    jc_state_init(s, st); /* a split character still counts once toward maxLength */
    assert_true(jc_feed(s, st, (const uint8_t *)"\"\xc3", 2));
    assert_true(jc_feed(s, st, (const uint8_t *)"\xa9\xc3", 2));
    assert_false(jc_feed(s, st, (const uint8_t *)"\xa9x", 2));
    free(st);
    jc_schema_free(s);
}

static void enum_and_const_match_their_compact_serialisation(void **state)
{
    (void)state;
    static const jc_case cases[] = {
        DONE("\"red\""), DONE("1"), DONE("12"), DONE("null"), DONE("{\"a\":[1,2]}"),
        DONE("0.1"), DONE("\"a\\\"b\""), DONE("\"\xc3\xa9\""), DONE(" 12 "), DONE("1.0"),
        VIABLE("\"gr"), VIABLE("{\"a\":["), REJECT("{\"a\":", " ["), REJECT("1", "3"),
        REJECT("\"", "blue\""), REJECT("\"red\"", "x"), REJECT("", "true"),
        REJECT("\"", "\\u00e9\""), REJECT("0.1", "0"), REJECT("1", "e0"),
    };
    check_cases("{\"enum\":[\"red\",\"green\",1,12,null,{\"a\":[1,2]},0.1,\"a\\\"b\",\"\\u00e9\",1.0]}",
                cases, N_OF(cases));
    static const jc_case cnst[] = {
        DONE("{\"k\":\"v\",\"n\":[true]}"), REJECT("{", " \"k\""), REJECT("{\"k\":\"v\"", "}"),
    };
    check_cases("{\"const\":{\"k\":\"v\",\"n\":[true]}}", cnst, N_OF(cnst));
}

static void enum_values_outside_the_rest_of_the_schema_are_dropped(void **state)
{
    (void)state;
    static const jc_case cases[] = {
        DONE("\"a\""), REJECT("\"a", "bc\""), REJECT("", "1"), REJECT("\"", "xyz\""),
    };
    check_cases("{\"type\":\"string\",\"maxLength\":2,\"enum\":[\"a\",\"abc\",1,\"xyz\"]}", cases,
                N_OF(cases));
    static const jc_case with_const[] = {DONE("2"), REJECT("", "1")};
    check_cases("{\"enum\":[1,2,3],\"const\":2}", with_const, N_OF(with_const));
}

static const char person_strict[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";

static void properties_come_in_any_order_once_and_all_required_before_the_brace(void **state)
{
    (void)state;
    static const jc_case cases[] = {
        DONE("{\"name\":\"bo\",\"age\":3}"), DONE("{ \"age\" : 3 , \"name\" : \"bo\" }"),
        VIABLE("{\"age\":3"), VIABLE("{\"na"), REJECT("{\"age\":3", "}"), REJECT("{", "}"),
        REJECT("{\"age\":1,\"", "age\":2}"), REJECT("{\"n", "ope\":1}"), REJECT("{\"age\":3", ".5}"),
        REJECT("{\"age\":1,\"name\":\"x\"", ",\"a\":1}"), REJECT("{\"name", "s\":1}"),
        REJECT("{\"age\":3,\"name\":", "3}"),
    };
    check_cases(person_strict, cases, N_OF(cases));
}

static void required_names_need_not_be_declared(void **state)
{
    (void)state;
    static const jc_case cases[] = {
        DONE("{\"x\":1}"), DONE("{\"y\":true,\"x\":\"s\"}"), REJECT("{", "}"),
        REJECT("{\"x\":1,\"x", "\":2}"),
    };
    check_cases("{\"type\":\"object\",\"required\":[\"x\"]}", cases, N_OF(cases));
    static const jc_case typed[] = {DONE("{\"x\":1}"), REJECT("{\"x\":", "\"s\"}")};
    check_cases("{\"required\":[\"x\"],\"additionalProperties\":{\"type\":\"integer\"}}", typed,
                N_OF(typed));
}

static void additional_properties_false_true_or_a_schema(void **state)
{
    (void)state;
    static const jc_case closed[] = {
        DONE("{\"a\":1}"), DONE("{}"), REJECT("{\"", "b\":1}"), REJECT("{\"a\":1", ",\"a\""),
    };
    check_cases("{\"properties\":{\"a\":{}},\"additionalProperties\":false}", closed,
                N_OF(closed));
    static const jc_case open[] = {
        DONE("{\"a\":1,\"b\":[null],\"\":{}}"), DONE("{\"b\":1,\"b\":2}"),
        REJECT("{\"a\":", "\"s\"}"),
    };
    check_cases("{\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":true}",
                open, N_OF(open));
    static const jc_case typed[] = {
        DONE("{\"a\":\"s\",\"x\":1}"), REJECT("{\"x\":", "\"s\"}"), REJECT("{\"a\":", "1}"),
    };
    check_cases("{\"properties\":{\"a\":{\"type\":\"string\"}},"
                "\"additionalProperties\":{\"type\":\"integer\"}}",
                typed, N_OF(typed));
    static const jc_case none[] = {DONE("{}"), REJECT("{", "\"a\":1}")};
    check_cases("{\"properties\":{\"a\":false},\"additionalProperties\":false}", none,
                N_OF(none));
}

static void a_key_that_begins_a_declared_name_stays_ambiguous_until_its_quote(void **state)
{
    (void)state;
    static const char schema[] = "{\"properties\":{\"ab\":{\"type\":\"integer\"},\"abd\":{\"type\":"
                                 "\"null\"},\"b\":false},\"additionalProperties\":{\"type\":\"string\"}}";
    static const jc_case cases[] = {
        DONE("{\"a\":\"x\"}"), DONE("{\"ab\":1}"), DONE("{\"abd\":null}"), DONE("{\"abc\":\"x\"}"),
        DONE("{\"\\u0061b\":1}"), REJECT("{\"ab\":", "\"x\"}"), REJECT("{\"a\":", "1}"),
        REJECT("{\"b", "\":1}"), REJECT("{\"ab\":1,\"a\\u0062", "\":2}"),
    };
    check_cases(schema, cases, N_OF(cases));
    jc_schema *s = compile_ok(schema);
    uint8_t *st = malloc(jc_state_size(s));
    assert_non_null(st);
    jc_state_init(s, st);
    assert_true(jc_feed(s, st, (const uint8_t *)"{\"a", 3));
    assert_false(jc_free_string(s, st)); /* "a" may still become "ab" */
    assert_true(jc_feed(s, st, (const uint8_t *)"bx", 2));
    assert_true(jc_free_string(s, st)); /* "abx..." can only be an undeclared key */
    free(st);
    jc_schema_free(s);
}

static void escaped_keys_are_compared_by_their_decoded_bytes(void **state)
{
    (void)state;
    static const jc_case cases[] = {
        DONE("{\"q\\\"t\":1}"), DONE("{\"\\u00e9\\ud83d\\ude00\":2}"),
        DONE("{\"\xc3\xa9\xf0\x9f\x98\x80\":2}"), REJECT("{\"q", "t\":1}"),
        REJECT("{\"\xc3\xa9\xf0\x9f\x98\x80\":2,\"\\u00", "e9\\ud83d\\ude00\":2}"),
        /* an escape must be able to write the next character of an unseen name */
        REJECT("{\"\\u00e9\\ud83d\\ude00\":2,\"\\u00", "e9\":1}"),
        REJECT("{\"\\u0071\\\"\\u0074\":1,\"\\u00", "71\":1}"),
        DONE("{\"\\u0071\\\"\\u0074\":1}"), REJECT("{\"\\u0071\\\"t", "\\u0074\":1}"),
        REJECT("{\"\\u", "d83d\\ude00\":2}"), REJECT("{\"\\u00e9\\ud83d\\ude0", "1\":2}"),
    };
    check_cases("{\"properties\":{\"q\\\"t\":{},\"\\u00e9\\ud83d\\ude00\":{}},"
                "\"additionalProperties\":false}",
                cases, N_OF(cases));
}

static void items_prefix_items_and_item_counts(void **state)
{
    (void)state;
    static const jc_case tuple[] = {
        DONE("[\"a\",1]"), DONE("[\"a\"]"), DONE("[]"), REJECT("[\"a\",1", ",2]"),
        REJECT("[", "1]"), REJECT("[\"a\",", "\"b\"]"),
    };
    check_cases("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
                "\"items\":false}",
                tuple, N_OF(tuple));
    check_cases("{\"type\":\"array\",\"items\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
                "\"additionalItems\":false}",
                tuple, N_OF(tuple));
    static const jc_case counted[] = {
        DONE("[1,2]"), DONE("[1,2,3]"), VIABLE("[1"), REJECT("[1", "]"), REJECT("[1,2,3", ",4]"),
        REJECT("[", "]"), REJECT("[1,", "\"x\"]"),
    };
    check_cases("{\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}", counted,
                N_OF(counted));
    static const jc_case rest[] = {DONE("[1,\"a\",\"b\"]"), REJECT("[1,\"a\",", "2]")};
    check_cases("{\"prefixItems\":[{\"type\":\"integer\"}],\"items\":{\"type\":\"string\"}}", rest,
                N_OF(rest));
    static const jc_case empty[] = {DONE("[]"), REJECT("[", "1]"), REJECT("[", "[]]")};
    check_cases("{\"type\":\"array\",\"items\":false}", empty, N_OF(empty));
}

static void string_length_counts_code_points(void **state)
{
    (void)state;
    static const jc_case cases[] = {
        DONE("\"ab\""), DONE("\"abc\""), DONE("\"\\n\\u00e9\\ud83d\\ude00\""),
        DONE("\"\xc3\xa9\xf0\x9f\x98\x80\""), REJECT("\"a", "\""), REJECT("\"abc", "d"),
        REJECT("\"ab\\n", "\\n"), REJECT("\"\xf0\x9f\x98\x80\xc3\xa9\xe4\xb8\xad", "\xc3\xa9"),
    };
    check_cases("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", cases, N_OF(cases));
    static const jc_case other[] = {DONE("5"), DONE("[]")}; /* minLength applies to strings only */
    check_cases("{\"type\":[\"integer\",\"array\"],\"minLength\":3}", other, N_OF(other));
}

static void type_arrays_and_boolean_schemas(void **state)
{
    (void)state;
    static const jc_case cases[] = {DONE("null"), DONE("\"x\""), REJECT("", "1"), REJECT("", "{")};
    check_cases("{\"type\":[\"string\",\"null\"]}", cases, N_OF(cases));
    static const jc_case props[] = {
        DONE("{\"a\":[1]}"), DONE("{\"c\":2}"), REJECT("{\"b", "\":1}"),
    };
    check_cases("{\"properties\":{\"a\":true,\"b\":false}}", props, N_OF(props));
}

static void any_of_objects_that_differ_only_after_some_keys(void **state)
{
    (void)state;
    static const char schema[] =
        "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"integer\"},\"x\":{\"type\":"
        "\"integer\"}},\"required\":[\"k\",\"x\"],\"additionalProperties\":false},{\"type\":\"object\","
        "\"properties\":{\"k\":{\"type\":\"integer\"},\"y\":{\"type\":\"string\"}},\"required\":[\"k\","
        "\"y\"],\"additionalProperties\":false},{\"type\":\"integer\"}]}";
    static const jc_case cases[] = {
        DONE("{\"k\":1,\"x\":2}"), DONE("{\"y\":\"s\",\"k\":1}"), DONE("7"), VIABLE("{\"k\":1,"),
        REJECT("{\"k\":1,\"", "z\":1}"), REJECT("{\"k\":1,\"x\":", "\"s\"}"),
        REJECT("{\"k\":1", "}"), REJECT("{\"x\":1,\"", "y\""), REJECT("", "\"s\""),
    };
    check_cases(schema, cases, N_OF(cases));
    static const jc_case one_of[] = {DONE("1"), DONE("1.5")}; /* "exactly one" is not enforced */
    check_cases("{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", one_of, N_OF(one_of));
}

static void type_beside_any_of_restricts_every_branch(void **state)
{
    (void)state;
    static const jc_case cases[] = {
        DONE("{\"a\":1}"), REJECT("", "\"s\""), REJECT("", "1"), REJECT("{", "}"),
    };
    check_cases("{\"type\":\"object\",\"anyOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}},"
                "\"required\":[\"a\"]},{\"type\":\"string\"},{\"enum\":[1,{\"a\":1}]}]}",
                cases, N_OF(cases));
    static const jc_case ref[] = {DONE("3"), REJECT("", "\"s\"")};
    check_cases("{\"$defs\":{\"n\":{\"type\":[\"integer\",\"string\"]}},\"type\":\"integer\","
                "\"$ref\":\"#/$defs/n\"}",
                ref, N_OF(ref));
}

/* {"kids":[{"kids":[ ... ]}]} with `levels` objects. */
static void nested_tree(char *out, size_t cap, int levels)
{
    size_t n = 0;
    for (int i = 0; i < levels - 1; i++)
        n += (size_t)snprintf(out + n, cap - n, "{\"kids\":[");
    n += (size_t)snprintf(out + n, cap - n, "{}");
    for (int i = 0; i < levels - 1; i++)
        n += (size_t)snprintf(out + n, cap - n, "]}");
}

static void recursive_ref_nests_up_to_the_depth_limit(void **state)
{
    (void)state;
    char deep[65], too_deep[33];
    memset(deep, '[', 32);
    memset(deep + 32, ']', 32);
    deep[64] = 0;
    memcpy(too_deep, deep, 32);
    too_deep[32] = 0;
    const jc_case cases[] = {DONE(deep), REJECT(too_deep, "["), REJECT("[[", "1]]")};
    check_cases("{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}", cases, N_OF(cases));

    static char tree16[400], tree17[400], tree17_ok[400];
    nested_tree(tree16, sizeof tree16, 16); /* 31 containers open at the deepest */
    nested_tree(tree17, sizeof tree17, 17); /* the 33rd container is the last '{' */
    size_t cut = strstr(tree17, "{}") - tree17;
    memcpy(tree17_ok, tree17, cut);
    tree17_ok[cut] = 0;
    const jc_case tree[] = {
        DONE(tree16), DONE("{\"kids\":[{},{\"kids\":[]},{}],\"name\":\"r\"}"),
        REJECT(tree17_ok, tree17 + cut), REJECT("{\"kids\":[", "1]}"),
    };
    check_cases("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"kids\":{\"type\":\"array\","
                "\"items\":{\"$ref\":\"#/$defs/node\"}},\"name\":{\"type\":\"string\"}},"
                "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
                tree, N_OF(tree));
}

/* {"anyOf":[{"type":"string","maxLength":100}, ..., n branches]}: distinct schemas, all alive
 * inside a short string. */
static char *string_branches(int n)
{
    char *s = malloc(64 + (size_t)n * 48);
    assert_non_null(s);
    size_t k = (size_t)sprintf(s, "{\"anyOf\":[");
    for (int i = 0; i < n; i++)
        k += (size_t)sprintf(s + k, "%s{\"type\":\"string\",\"maxLength\":%d}", i ? "," : "",
                             100 + i);
    sprintf(s + k, "]}");
    return s;
}

static void more_than_32_live_alternatives_reject_the_byte(void **state)
{
    (void)state;
    char *s32 = string_branches(32), *s33 = string_branches(33);
    static const jc_case fits[] = {DONE("\"abc\"")};
    check_cases(s32, fits, N_OF(fits));
    static const jc_case over[] = {REJECT("", "\"abc\""), REJECT(" ", "\"")};
    check_cases(s33, over, N_OF(over));
    free(s32);
    free(s33);
}

static void identical_alternatives_merge_so_long_arrays_of_unions_stay_alive(void **state)
{
    (void)state;
    char text[1200];
    size_t n = (size_t)sprintf(text, "[");
    for (int i = 0; i < 300; i++)
        n += (size_t)sprintf(text + n, "%s%d", i ? "," : "", i);
    sprintf(text + n, "]");
    const jc_case cases[] = {DONE(text), DONE("[1.5,\"x\",2]")};
    check_cases("{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"number\"},"
                "{\"type\":\"string\"}]}}",
                cases, N_OF(cases));
}

/* Feeds prefix, checks jc_free_string, and when it holds, that a plain chunk leaves the state's
 * bytes as they were and is accepted. */
static void check_free(const char *schema, const char *prefix, bool expect)
{
    jc_schema *s = compile_ok(schema);
    size_t size = jc_state_size(s);
    uint8_t *st = malloc(size), *after = malloc(size);
    assert_non_null(st);
    assert_non_null(after);
    jc_state_init(s, st);
    assert_true(jc_feed(s, st, (const uint8_t *)prefix, strlen(prefix)));
    if (jc_free_string(s, st) != expect)
        fail_msg("schema %s, after %s: jc_free_string %d, expected %d", schema, prefix, !expect,
                 expect);
    if (expect) {
        static const char chunk[] =
            " plain text, caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80 / \x7f ~{}[]:";
        jc_state_copy(s, after, st);
        assert_true(jc_feed(s, after, (const uint8_t *)chunk, sizeof chunk - 1));
        assert_int_equal(jc_state_used(after), jc_state_used(st));
        assert_memory_equal(after, st, jc_state_used(st));
    }
    free(st);
    free(after);
    jc_schema_free(s);
}

static void free_string_holds_only_inside_unconstrained_string_content(void **state)
{
    (void)state;
    check_free("{}", "\"", true);
    check_free("{}", "[\"ab", true);
    check_free("{}", "{\"key", true);
    check_free("{\"type\":\"string\"}", "\"x\\n\\u00e9\\ud83d\\ude00", true);
    check_free(person_strict, "{\"name\":\"bo", true);
    check_free("{\"properties\":{\"ab\":{}}}", "{\"ax", true);
    check_free("{\"anyOf\":[{\"type\":\"string\"},"
               "{\"type\":\"array\",\"items\":{\"type\":\"string\"}}]}",
               "\"a", true);
    check_free("{}", "", false);
    check_free("{}", "[", false);
    check_free("{}", "\"\\", false);
    check_free("{}", "\"\\u00", false);
    check_free("{}", "\"\\ud83d", false);
    check_free("{}", "\"\xc3", false);
    check_free("{}", "\"\"", false);
    check_free("{\"properties\":{\"ab\":{}}}", "{\"a", false);
    check_free(person_strict, "{\"na", false);
    check_free("{\"enum\":[\"abc\",\"abd\"]}", "\"ab", false);
    check_free("{\"type\":\"string\",\"maxLength\":9}", "\"a", false);
    check_free("{\"type\":\"string\",\"minLength\":1}", "\"", false);
    check_free("{\"anyOf\":[{\"type\":\"string\"},{\"enum\":[\"abc\"]}]}", "\"a", false);
}

static void state_copies_carry_everything_and_shallow_states_are_small(void **state)
{
    (void)state;
    jc_schema *s = compile_ok(person_strict);
    assert_int_equal(jc_state_size(s), 412); /* no union: one alternative, 32 frames */
    uint8_t *st = malloc(jc_state_size(s));
    assert_non_null(st);
    jc_state_init(s, st);
    assert_int_equal(jc_state_used(st), 28);
    assert_true(jc_feed(s, st, (const uint8_t *)"{\"name\":\"x", 10));
    assert_int_equal(jc_state_used(st), 40); /* header 8, alternative 20, one object 12 */
    free(st);
    jc_schema_free(s);
}

typedef struct err_case {
    const char *schema;
    td_err code;
    const char *msg;
} err_case;

static void compile_errors_name_the_pointer_and_keyword(void **state)
{
    (void)state;
    static const err_case cases[] = {
        {"{\"type\":\"strin\"}", TD_EINVAL, "schema #/type: unknown type 'strin'"},
        {"{\"properties\":{\"a\":{\"type\":\"strin\"}}}", TD_EINVAL,
         "schema #/properties/a/type: unknown type 'strin'"},
        {"{\"properties\":{\"a/b~\":{\"type\":[\"null\",1]}}}", TD_EINVAL,
         "schema #/properties/a~1b~0/type/1: must be a type name"},
        {"{\"type\":[]}", TD_EINVAL, "schema #/type: empty list of types"},
        {"{\"required\":\"a\"}", TD_EINVAL, "schema #/required: must be an array of strings"},
        {"{\"required\":[\"a\",1]}", TD_EINVAL, "schema #/required/1: must be a string"},
        {"{\"minItems\":-1}", TD_EINVAL, "schema #/minItems: must be a non-negative integer"},
        {"{\"items\":{\"maxLength\":1.5}}", TD_EINVAL,
         "schema #/items/maxLength: must be a non-negative integer"},
        {"{\"enum\":[]}", TD_EINVAL, "schema #/enum: must be a non-empty array"},
        {"{\"properties\":[]}", TD_EINVAL, "schema #/properties: must be an object"},
        {"{\"properties\":{\"a\":3}}", TD_EINVAL,
         "schema #/properties/a: must be an object or a boolean"},
        {"{\"anyOf\":[]}", TD_EINVAL, "schema #/anyOf: must be a non-empty array of schemas"},
        {"{\"anyOf\":[{},\"x\"]}", TD_EINVAL, "schema #/anyOf/1: must be an object or a boolean"},
        {"{\"$ref\":\"#/$defs/nope\"}", TD_EINVAL, "schema #/$ref: no definition '#/$defs/nope'"},
        {"{\"$ref\":\"#/properties/a\"}", TD_ENOTSUP,
         "schema #/$ref: only '#', '#/$defs/<name>' and '#/definitions/<name>' are supported, not "
         "'#/properties/a'"},
        {"{\"$ref\":\"#\"}", TD_EINVAL,
         "schema #: a $ref / anyOf cycle that never reaches a value"},
        {"{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/b\"}]},\"b\":{\"$ref\":\"#/$defs/a\"}},"
         "\"$ref\":\"#/$defs/a\"}",
         TD_EINVAL, "schema #/$defs/a: a $ref / anyOf cycle that never reaches a value"},
        {"{\"$defs\":{\"a\":{\"type\":\"nope\"}}}", TD_EINVAL,
         "schema #/$defs/a/type: unknown type 'nope'"},
        {"{\"patternProperties\":{}}", TD_ENOTSUP,
         "schema #/patternProperties: keyword 'patternProperties' is not enforced"},
        {"{\"pattern\":5}", TD_EINVAL, "schema #/pattern: must be a string"},
        {"{\"properties\":{\"a\":{\"pattern\":\"a(?=b)\"}}}", TD_ENOTSUP,
         "schema #/properties/a/pattern: regular expression, at byte 2: lookaround and other (? "
         "groups are not supported"},
        {"{\"pattern\":\"(?i)a\"}", TD_EINVAL,
         "schema #/pattern: regular expression, at byte 1: a JSON Schema pattern (ECMA-262) has no "
         "inline flags"},
        {"{\"pattern\":\"[b-a]\"}", TD_EINVAL,
         "schema #/pattern: regular expression, at byte 4: a character range goes backwards"},
        {"{\"items\":{\"minimum\":[0]}}", TD_EINVAL, "schema #/items/minimum: must be a number"},
        {"{\"type\":\"number\",\"minimum\":1,\"exclusiveMaximum\":1}", TD_EINVAL,
         "schema #: no JSON document satisfies it"},
        {"{\"type\":\"integer\",\"maximum\":\"3\"}", TD_EINVAL, "schema #/maximum: must be a number"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", TD_EINVAL,
         "schema #: no JSON document satisfies it"},
        {"{\"anyOf\":[{\"type\":\"integer\"}],\"minimum\":1}", TD_ENOTSUP,
         "schema #: 'minimum' beside 'anyOf' is not supported"},
        {"{\"uniqueItems\":true}", TD_ENOTSUP,
         "schema #/uniqueItems: keyword 'uniqueItems' is not enforced"},
        {"{\"not\":{}}", TD_ENOTSUP, "schema #/not: keyword 'not' is not enforced"},
        {"{\"allOf\":[{},{}]}", TD_ENOTSUP, "schema #/allOf: 2 subschemas (only one is supported)"},
        {"{\"anyOf\":[{}],\"$ref\":\"#\"}", TD_ENOTSUP,
         "schema #: 'anyOf' together with '$ref' is not supported"},
        {"{\"anyOf\":[{}],\"properties\":{}}", TD_ENOTSUP,
         "schema #: 'properties' beside 'anyOf' is not supported"},
        {"false", TD_EINVAL, "schema #: no JSON document satisfies it"},
        {"{\"type\":\"object\",\"required\":[\"a\"],\"properties\":{\"a\":false}}", TD_EINVAL,
         "schema #: no JSON document satisfies it"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", TD_EINVAL,
         "schema #: no JSON document satisfies it"},
        {"{\"type\":\"array\",\"minItems\":1,\"items\":{\"$ref\":\"#\"}}", TD_EINVAL,
         "schema #: no JSON document satisfies it"},
        {"3", TD_EINVAL, "schema #: must be an object or a boolean"},
        {"{\"type\":", TD_EINVAL, NULL},
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        jc_schema *s = (jc_schema *)&s;
        td_err e = jc_compile(cases[i].schema, strlen(cases[i].schema), &s);
        if (e != cases[i].code || (cases[i].msg && strcmp(err_msg(), cases[i].msg) != 0))
            fail_msg("schema %s: got %s \"%s\", expected %s \"%s\"", cases[i].schema, err_name(e),
                     err_msg(), err_name(cases[i].code), cases[i].msg ? cases[i].msg : "");
        assert_null(s);
    }
    jc_schema *s;
    assert_int_equal(jc_compile("{\"type\":", 8, &s), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "schema: invalid JSON at line 1"));
}

static void compile_limits_are_refused_with_enotsup(void **state)
{
    (void)state;
    char *big = malloc(200000);
    assert_non_null(big);
    size_t n = (size_t)sprintf(big, "{\"properties\":{");
    for (int i = 0; i < 65; i++)
        n += (size_t)sprintf(big + n, "%s\"p%d\":{}", i ? "," : "", i);
    sprintf(big + n, "}}");
    jc_schema *s;
    assert_int_equal(jc_compile(big, strlen(big), &s), TD_ENOTSUP);
    assert_string_equal(err_msg(), "schema #/properties: more than 64 properties");

    n = (size_t)sprintf(big, "{\"anyOf\":[");
    for (int i = 0; i < 129; i++)
        n += (size_t)sprintf(big + n, "%s{}", i ? "," : "");
    sprintf(big + n, "]}");
    assert_int_equal(jc_compile(big, strlen(big), &s), TD_ENOTSUP);
    assert_string_equal(err_msg(), "schema #/anyOf: more than 128 subschemas");

    n = (size_t)sprintf(big, "{\"anyOf\":[");
    for (int i = 0; i < 100; i++) {
        n += (size_t)sprintf(big + n, "%s{\"anyOf\":[", i ? "," : "");
        for (int k = 0; k < 50; k++)
            n += (size_t)sprintf(big + n, "%s{}", k ? "," : "");
        n += (size_t)sprintf(big + n, "]}");
    }
    sprintf(big + n, "]}");
    assert_int_equal(jc_compile(big, strlen(big), &s), TD_ENOTSUP);
    assert_string_equal(err_msg(), "schema: more than 4096 subschemas");
    free(big);
}

/* d0 = anyOf[d1, d1], d1 = anyOf[d2, d2], ...: 2^40 paths through 41 definitions. */
static char *diamond(const char *root_extra)
{
    char *s = malloc(8192);
    assert_non_null(s);
    size_t n = (size_t)sprintf(s, "{%s\"$defs\":{", root_extra);
    for (int i = 0; i < 40; i++)
        n += (size_t)sprintf(s + n, "\"d%d\":{\"anyOf\":[{\"$ref\":\"#/$defs/d%d\"},"
                             "{\"$ref\":\"#/$defs/d%d\"}]},", i, i + 1, i + 1);
    sprintf(s + n, "\"d40\":{\"type\":\"integer\"}},\"anyOf\":[{\"$ref\":\"#/$defs/d0\"}]}");
    return s;
}

static void shared_sub_unions_compile_without_walking_every_path(void **state)
{
    (void)state;
    char *plain = diamond(""), *with_enum = diamond("\"enum\":[\"x\",1],");
    static const jc_case cases[] = {DONE("7"), REJECT("", "\"x\"")};
    check_cases(plain, cases, N_OF(cases));
    jc_schema *s;
    assert_int_equal(jc_compile(with_enum, strlen(with_enum), &s), TD_ENOTSUP);
    assert_string_equal(err_msg(), "schema: checking enum / const values against their schema "
                                   "takes more than 16777216 steps");
    free(plain);
    free(with_enum);
}

static void annotations_and_unknown_keywords_are_ignored(void **state)
{
    (void)state;
    static const jc_case cases[] = {DONE("\"x\""), REJECT("", "1")};
    check_cases("{\"title\":\"x\",\"description\":\"y\",\"default\":1,\"examples\":[2],"
                "\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"$id\":\"x\","
                "\"$comment\":\"c\",\"format\":\"date\",\"deprecated\":true,\"readOnly\":true,"
                "\"writeOnly\":false,\"contentEncoding\":\"base64\",\"contentMediaType\":\"text/plain\","
                "\"x-foo\":{\"pattern\":\"p\"},\"strict\":true,\"type\":\"string\"}",
                cases, N_OF(cases));
    static const jc_case ref[] = {DONE("1"), REJECT("", "\"s\"")};
    check_cases("{\"definitions\":{\"a/b~c\":{\"type\":\"integer\"}},"
                "\"$ref\":\"#/definitions/a~1b~0c\"}",
                ref, N_OF(ref));
    check_cases("{\"allOf\":[{\"$ref\":\"#/$defs/i\"}],\"$defs\":{\"i\":{\"type\":\"integer\"}},"
                "\"description\":\"d\"}",
                ref, N_OF(ref));
}

/* pattern (a search, as JSON Schema reads it): a string is cut at the first character after
 * which it can no longer hold a match, and may end only holding one; escapes and raw UTF-8 are
 * matched as the characters they decode to (a \u escape's or a lead byte's first part already
 * needs a character the pattern takes); with maxLength, a character that leaves no room for
 * the rest of a match is refused; enum values that do not match are dropped; other types are
 * not touched. */
static void pattern_holds_in_strings(void **state)
{
    (void)state;
    static const jc_case anchored[] = {
        DONE("\"AB-12\""), DONE("\"\\u0041Z-99\""), VIABLE("\"AB-1"),
        REJECT("\"A", "b"), REJECT("\"AB-", "x"), REJECT("\"AB-12", "3"), REJECT("\"AB-1", "\""),
        REJECT("\"\\u00", "6"), /* \u006x is lowercase: no character the pattern takes */
        REJECT("\"", "\xc3"), /* no character of two bytes either */
        DONE("7"), /* not a string: the pattern says nothing */
    };
    check_cases("{\"type\":[\"string\",\"integer\"],\"pattern\":\"^[A-Z]{2}-\\\\d{2}$\"}", anchored,
                N_OF(anchored));
    static const jc_case search[] = {
        DONE("\"xx cat yy\""), DONE("\"cat\""), VIABLE("\"ca"), VIABLE("\"dog\\n"),
        REJECT("\"ca", "\""), DONE("\"\\u00e9t\\u00e9 cat\""),
    };
    check_cases("{\"type\":\"string\",\"pattern\":\"cat\"}", search, N_OF(search));
    static const jc_case unicode[] = {
        DONE("\"\xc3\xa9\xf0\x9f\x98\x80\""), DONE("\"\\u00e9\\ud83d\\ude00\""),
        REJECT("\"", "a"), REJECT("\"\xc3\xa9", "\xc3\xa8"), REJECT("\"\\u00e9\\ud83d\\ud", "c"),
        REJECT("\"\\u00e9\\ud83d\\ude0", "1"), REJECT("\"\xc3\xa9\xf0\x9f\x98", "\x81"),
    };
    check_cases("{\"type\":\"string\",\"pattern\":\"^\xc3\xa9\xf0\x9f\x98\x80$\"}", unicode,
                N_OF(unicode));
    static const jc_case cyrillic[] = { /* lead bytes D0-D1 carry a fifth payload bit */
        DONE("\"\xd0\xb4\xd1\x8f\""), DONE("\"\\u0434\""), REJECT("\"", "\xd2"),
        REJECT("\"\xd0\xb4\xd0", "\xaf"), /* U+042F, a capital */
    };
    check_cases("{\"type\":\"string\",\"pattern\":\"^[\xd0\xb0-\xd1\x8f]+$\"}", cyrillic,
                N_OF(cyrillic));
    static const jc_case bounded[] = {
        DONE("\"abc1\""), DONE("\"abcde1\""), REJECT("\"abcde", "f"), REJECT("\"abcde1", "2"),
    };
    check_cases("{\"type\":\"string\",\"maxLength\":6,\"pattern\":\"^[a-z]+\\\\d$\"}", bounded,
                N_OF(bounded));
    static const jc_case least[] = { /* minLength 3: a match must still reach 3 characters */
        DONE("\"aab\""), DONE("\"aaa\""), DONE("\"aaaab\""), DONE("\"aa\\u00e9\""),
        DONE("\"aa\xc3\xa9\""), VIABLE("\"aa"), VIABLE("\"a\\u006"),
        REJECT("\"a", "b"),     /* "ab" matches but cannot grow */
        REJECT("\"aa", "\""),   /* too short */
        REJECT("\"a", "\xc3"),  /* the only two-byte character it could begin ends the match */
        REJECT("\"a\\u00", "e"), /* likewise \u00e9 */
    };
    check_cases("{\"type\":\"string\",\"minLength\":3,\"pattern\":\"^a+(b|\xc3\xa9)?$\"}",
                least, N_OF(least));
    static const jc_case none[] = {REJECT("", "\"")};
    check_cases("{\"type\":[\"string\",\"null\"],\"maxLength\":2,\"pattern\":\"^abc\"}", none,
                N_OF(none));
    check_cases("{\"type\":[\"string\",\"null\"],\"minLength\":5,\"pattern\":\"^[a-z]{2}$\"}",
                none, N_OF(none));
    static const jc_case lits[] = {DONE("{\"c\":\"Rome\"}"), REJECT("{\"c\":\"", "P")};
    check_cases("{\"type\":\"object\",\"properties\":{\"c\":{\"enum\":[\"Paris\",\"Rome\"],"
                "\"pattern\":\"^R\"}}}",
                lits, N_OF(lits));
    /* a free string it is not: the plain-chunk shortcut stays off */
    jc_schema *sc = compile_ok("{\"type\":\"string\",\"pattern\":\"x\"}");
    uint8_t *st = malloc(jc_state_size(sc));
    jc_state_init(sc, st);
    assert_true(jc_feed(sc, st, (const uint8_t *)"\"ab", 3));
    assert_false(jc_free_string(sc, st));
    free(st);
    jc_schema_free(sc);
}

static void null_schema_is_any_json_object(void **state)
{
    (void)state;
    static const jc_case cases[] = {
        DONE("{}"), DONE(" {\"a\":[1,{\"b\":null}],\"a\":\"x\"} "), VIABLE("  {"),
        REJECT("", "["), REJECT("", "1"), REJECT("", "\"x\""), REJECT("{}", "{}"),
    };
    check_cases(NULL, cases, N_OF(cases));
}

static const char pydantic[] =
    "{\"$defs\":{\"Address\":{\"properties\":{\"street\":{\"title\":\"Street\",\"type\":\"string\"},"
    "\"zip\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}],\"default\":null,\"title\":\"Zip\"}},"
    "\"required\":[\"street\"],\"title\":\"Address\",\"type\":\"object\"},\"Color\":{\"enum\":[\"red\","
    "\"green\"],\"title\":\"Color\",\"type\":\"string\"}},\"properties\":{\"name\":{\"description\":"
    "\"Full name\",\"title\":\"Name\",\"type\":\"string\"},\"age\":{\"title\":\"Age\",\"type\":"
    "\"integer\"},\"address\":{\"anyOf\":[{\"$ref\":\"#/$defs/Address\"},{\"type\":\"null\"}],"
    "\"default\":null},\"color\":{\"$ref\":\"#/$defs/Color\",\"default\":\"red\"},\"tags\":{\"items\":"
    "{\"type\":\"string\"},\"title\":\"Tags\",\"type\":\"array\"}},\"required\":[\"name\",\"age\"],"
    "\"title\":\"Person\",\"type\":\"object\"}";

static void pydantic_schema_with_defs_refs_and_optional_fields(void **state)
{
    (void)state;
    static const jc_case cases[] = {
        DONE("{\"name\":\"A\",\"age\":3}"),
        DONE("{\"age\":3,\"name\":\"A\",\"address\":null,\"color\":\"green\",\"tags\":[\"x\"]}"),
        DONE("{\"name\":\"A\",\"age\":3,\"address\":{\"street\":\"s\",\"zip\":null,\"extra\":1}}"),
        DONE("{\"name\":\"A\",\"age\":3,\"address\":{\"zip\":\"1\",\"street\":\"s\"}}"),
        REJECT("{\"name\":\"A\",\"age\":3,\"color\":\"", "blue\"}"),
        REJECT("{\"name\":\"A\",\"age\":3,\"address\":", "1}"),
        REJECT("{\"name\":\"A\",\"age\":3,\"address\":{\"zip\":null", "}"),
        REJECT("{\"name\":\"A\"", "}"), REJECT("{\"name\":\"A\",\"age\":", "\"3\"}"),
        REJECT("{\"name\":\"A\",\"age\":3,\"tags\":[", "1]}"),
    };
    check_cases(pydantic, cases, N_OF(cases));
}

static const char openai_strict[] =
    "{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\",\"description\":\"City\"},"
    "\"unit\":{\"type\":[\"string\",\"null\"],\"enum\":[\"celsius\",\"fahrenheit\",null]},\"days\":{"
    "\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"day\":{\"type\":\"integer\"},"
    "\"note\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}},\"required\":[\"day\",\"note\"],"
    "\"additionalProperties\":false}}},\"required\":[\"location\",\"unit\",\"days\"],"
    "\"additionalProperties\":false}";

static void openai_strict_mode_schema(void **state)
{
    (void)state;
    static const jc_case cases[] = {
        DONE("{\"location\":\"Paris\",\"unit\":\"celsius\",\"days\":[{\"day\":1,\"note\":null},"
             "{\"note\":\"rain\",\"day\":2}]}"),
        DONE("{\"days\":[],\"unit\":null,\"location\":\"\"}"),
        REJECT("{\"location\":\"Paris\",\"unit\":\"", "kelvin\""),
        REJECT("{\"location\":\"Paris\",\"unit\":null,\"days\":[{\"day\":1", "}]"),
        REJECT("{\"location\":\"Paris\",\"unit\":null,\"days\":[{\"day\":1,\"note\":null",
               ",\"x\""),
        REJECT("{\"location\":\"Paris\",\"unit\":null", "}"),
        REJECT("{\"", "city\":1}"),
    };
    check_cases(openai_strict, cases, N_OF(cases));
}

/* --- random documents ------------------------------------------------------------------------ */

typedef struct gen {
    uint64_t rng;
    char *buf;
    size_t len, cap;
} gen;

static uint32_t gen_rand(gen *g, uint32_t n)
{
    g->rng ^= g->rng << 13; /* xorshift64 */
    g->rng ^= g->rng >> 7;
    g->rng ^= g->rng << 17;
    return (uint32_t)(g->rng >> 32) % n;
}

static void gen_put(gen *g, const char *s)
{
    size_t n = strlen(s);
    if (g->len + n + 1 > g->cap) {
        g->cap = (g->len + n + 1) * 2;
        g->buf = realloc(g->buf, g->cap);
        assert_non_null(g->buf);
    }
    memcpy(g->buf + g->len, s, n + 1);
    g->len += n;
}

static void gen_ws(gen *g)
{
    static const char *const ws[] = {"", "", "", " ", "\n", "\t ", "\r\n  "};
    gen_put(g, ws[gen_rand(g, N_OF(ws))]);
}

static void gen_string(gen *g)
{
    static const char *const parts[] = {
        "a", "Z", "0", " ", "~", "/", "\\\"", "\\\\", "\\/", "\\n", "\\t", "\\u00e9", "\\uD83D\\uDE00",
        "caf\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\x7f", "{", "]", ":", ",",
    };
    gen_put(g, "\"");
    for (uint32_t i = gen_rand(g, 8); i > 0; i--)
        gen_put(g, parts[gen_rand(g, N_OF(parts))]);
    gen_put(g, "\"");
}

static void gen_number(gen *g, bool integer)
{
    char num[64];
    int n = 0;
    if (gen_rand(g, 3) == 0)
        num[n++] = '-';
    n += sprintf(num + n, "%u", gen_rand(g, 4) ? gen_rand(g, 100000) : 0);
    if (!integer && gen_rand(g, 2))
        n += sprintf(num + n, ".%u", gen_rand(g, 1000));
    if (!integer && gen_rand(g, 3) == 0)
        n += sprintf(num + n, "%s%u", gen_rand(g, 2) ? "e+" : "E", gen_rand(g, 30));
    gen_put(g, num);
}

static void gen_any(gen *g, int depth)
{
    uint32_t kind = gen_rand(g, depth > 4 ? 5 : 7);
    if (kind == 0)
        gen_put(g, gen_rand(g, 2) ? "true" : "null");
    else if (kind == 1)
        gen_put(g, "false");
    else if (kind == 2 || kind == 3)
        gen_number(g, false);
    else if (kind == 4)
        gen_string(g);
    else {
        bool obj = kind == 6;
        gen_put(g, obj ? "{" : "[");
        for (uint32_t i = 0, n = gen_rand(g, 4); i < n; i++) {
            gen_put(g, i ? "," : "");
            gen_ws(g);
            if (obj) {
                gen_string(g);
                gen_ws(g);
                gen_put(g, ":");
                gen_ws(g);
            }
            gen_any(g, depth + 1);
            gen_ws(g);
        }
        gen_put(g, obj ? "}" : "]");
    }
}

/* Writes the members of an object in a random order; each member i is written by put(g, i). */
static void gen_members(gen *g, bool *present, int n, void (*put)(gen *, int))
{
    int order[8];
    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int k = (int)gen_rand(g, (uint32_t)i + 1), t = order[i];
        order[i] = order[k];
        order[k] = t;
    }
    gen_put(g, "{");
    bool first = true;
    for (int i = 0; i < n; i++) {
        if (!present[order[i]])
            continue;
        gen_put(g, first ? "" : ",");
        gen_ws(g);
        first = false;
        put(g, order[i]);
        gen_ws(g);
    }
    gen_put(g, "}");
}

static void gen_address_member(gen *g, int i)
{
    gen_put(g, i == 0 ? "\"street\":" : i == 1 ? "\"zip\":" : "\"floor\":");
    gen_ws(g);
    if (i == 1 && gen_rand(g, 2))
        gen_put(g, "null");
    else if (i <= 1)
        gen_string(g);
    else
        gen_any(g, 3);
}

static void gen_person_member(gen *g, int i)
{
    static const char *const keys[] = {"\"name\"", "\"age\"", "\"address\"", "\"color\"", "\"tags\""};
    gen_put(g, keys[i]);
    gen_ws(g);
    gen_put(g, ":");
    gen_ws(g);
    if (i == 0) {
        gen_string(g);
    } else if (i == 1) {
        gen_number(g, true);
    } else if (i == 2 && gen_rand(g, 3) == 0) {
        gen_put(g, "null");
    } else if (i == 2) {
        bool present[3] = {true, gen_rand(g, 2), gen_rand(g, 2)};
        gen_members(g, present, 3, gen_address_member);
    } else if (i == 3) {
        gen_put(g, gen_rand(g, 2) ? "\"red\"" : "\"green\"");
    } else {
        gen_put(g, "[");
        for (uint32_t k = 0, n = gen_rand(g, 4); k < n; k++) {
            gen_put(g, k ? "," : "");
            gen_string(g);
        }
        gen_put(g, "]");
    }
}

static void gen_person(gen *g, int depth)
{
    (void)depth;
    bool present[5] = {true, true, gen_rand(g, 2), gen_rand(g, 2), gen_rand(g, 2)};
    gen_members(g, present, 5, gen_person_member);
}

static int gen_tree_depth;

static void gen_tree_member(gen *g, int i)
{
    if (i == 0) {
        gen_put(g, "\"name\":");
        gen_string(g);
        return;
    }
    gen_put(g, "\"kids\":[");
    int depth = gen_tree_depth++;
    for (uint32_t k = 0, n = depth < 8 ? gen_rand(g, 3) : 0; k < n; k++) {
        gen_put(g, k ? "," : "");
        bool present[2] = {gen_rand(g, 2), gen_rand(g, 2)};
        gen_members(g, present, 2, gen_tree_member);
    }
    gen_tree_depth = depth;
    gen_put(g, "]");
}

static void gen_tree(gen *g, int depth)
{
    (void)depth;
    gen_tree_depth = 0;
    bool present[2] = {gen_rand(g, 2), true};
    gen_members(g, present, 2, gen_tree_member);
}

static const char tree_schema[] =
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"kids\":{\"type\":\"array\",\"items\":"
    "{\"$ref\":\"#/$defs/node\"}},\"name\":{\"type\":\"string\"}},\"additionalProperties\":false}},"
    "\"$ref\":\"#/$defs/node\"}";

/* What jansson says of a text the matcher called done: it parses, and for the person schema the
 * required members have their types. */
static void check_with_jansson(const char *text, size_t len, bool person)
{
    json_error_t je;
    json_t *v = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v)
        fail_msg("jansson rejects a done text (%s): %.*s", je.text, (int)len, text);
    if (person) {
        assert_true(json_is_object(v));
        assert_true(json_is_string(json_object_get(v, "name")));
        assert_true(json_is_integer(json_object_get(v, "age")));
    }
    json_decref(v);
}

static void random_documents_are_viable_at_every_byte_and_done_at_the_end(void **state)
{
    (void)state;
    static const struct {
        const char *schema;
        void (*make)(gen *, int);
        bool person;
    } kinds[] = {{"{}", gen_any, false}, {pydantic, gen_person, true}, {tree_schema, gen_tree, false}};
    gen g = {.rng = 0x9E3779B97F4A7C15ull};
    for (size_t k = 0; k < N_OF(kinds); k++) {
        jc_schema *s = compile_ok(kinds[k].schema);
        uint8_t *st = malloc(jc_state_size(s));
        assert_non_null(st);
        for (int doc = 0; doc < 300; doc++) {
            g.len = 0;
            gen_put(&g, "");
            kinds[k].make(&g, 0);
            jc_state_init(s, st);
            for (size_t i = 0; i < g.len; i++) {
                if (!jc_feed(s, st, (const uint8_t *)g.buf + i, 1))
                    fail_msg("schema %zu: byte %zu of %s rejected", k, i, g.buf);
                if (g.buf[0] == '{' && i + 1 < g.len)
                    assert_false(jc_done(s, st));
            }
            if (!jc_done(s, st))
                fail_msg("schema %zu: %s not done", k, g.buf);
            check_with_jansson(g.buf, g.len, kinds[k].person);
        }
        free(st);
        jc_schema_free(s);
    }
    free(g.buf);
}

/* Random walks, each byte drawn among those the state accepts: a state that accepted its text
 * always accepts some next byte or is done (no viable prefix without a completion), short of
 * the nesting limit. */
static void random_walks_never_reach_a_dead_end(void **state)
{
    (void)state;
    static const char keys[] = "{\"properties\":{\"q\\\"t\":{\"enum\":[\"ab\",\"abc\",12,1.5,null]},"
                               "\"r\":{\"type\":\"integer\",\"minimum\":-40,\"maximum\":1234},"
                               "\"rr\":{\"type\":\"number\",\"minimum\":0.1,\"exclusiveMaximum\":7.25},"
                               "\"\\u00e9\\ud83d\\ude00\":{\"type\":\"integer\"},\"qz\":{\"maxLength\":2}},"
                               "\"required\":[\"qz\"],\"additionalProperties\":false}";
    static const char *const schemas[] = {"{}", pydantic, tree_schema, openai_strict, keys, NULL};
    gen g = {.rng = 0x9E3779B97F4A7C15ull};
    for (size_t k = 0; k < N_OF(schemas); k++) {
        jc_schema *s = compile_ok(schemas[k]);
        const size_t size = jc_state_size(s);
        uint8_t *st = malloc(size), *tmp = malloc(size);
        assert_non_null(st);
        assert_non_null(tmp);
        for (int walk = 0; walk < 300; walk++) {
            char text[256];
            int n = 0, open = 0;
            jc_state_init(s, st);
            for (; n < 200; n++) {
                uint8_t ok[256];
                int n_ok = 0;
                for (int b = 0; b < 256; b++) {
                    jc_state_copy(s, tmp, st);
                    const uint8_t byte = (uint8_t)b;
                    if (jc_feed(s, tmp, &byte, 1))
                        ok[n_ok++] = byte;
                }
                if (n_ok == 0) {
                    if (!jc_done(s, st) && open < JC_DEPTH_MAX)
                        fail_msg("schema %zu: nothing continues \"%.*s\"", k, n, text);
                    break;
                }
                if (jc_done(s, st) && gen_rand(&g, 8) == 0)
                    break;
                /* half the draws among the bytes that steer the grammar, so that escapes,
                 * surrogates, keys and numbers are walked into, not just string content */
                uint8_t steer[256];
                int n_steer = 0;
                for (int i = 0; i < n_ok; i++)
                    if (ok[i] < 0x80 && strchr("{}[]\",:\\udDcCbB0123456789eE.-+tfnqzr", ok[i]))
                        steer[n_steer++] = ok[i];
                const uint8_t b = n_steer && gen_rand(&g, 2) ? steer[gen_rand(&g, (uint32_t)n_steer)]
                                                             : ok[gen_rand(&g, (uint32_t)n_ok)];
                open += b == '{' || b == '[';
                text[n] = (char)b;
                assert_true(jc_feed(s, st, &b, 1));
            }
        }
        free(st);
        free(tmp);
        jc_schema_free(s);
    }
}

static void random_mutations_never_crash_and_done_texts_parse(void **state)
{
    (void)state;
    static const char bytes[] = " {}[]\",:0123456789-.eE\\u\xc3\xa9\x80\xff\x01tfnaz";
    static const char *const schemas[] = {"{}", pydantic, tree_schema, openai_strict, NULL};
    gen g = {.rng = 0xD1B54A32D192ED03ull};
    char text[4096];
    int done_count = 0;
    for (size_t k = 0; k < N_OF(schemas); k++) {
        jc_schema *s = compile_ok(schemas[k]);
        uint8_t *st = malloc(jc_state_size(s));
        assert_non_null(st);
        for (int doc = 0; doc < 200; doc++) {
            g.len = 0;
            gen_put(&g, "");
            (k == 1 ? gen_person : k == 2 ? gen_tree : gen_any)(&g, 0);
            for (int m = 0; m < 20; m++) {
                size_t len = g.len < sizeof text - 8 ? g.len : sizeof text - 8;
                memcpy(text, g.buf, len);
                for (uint32_t edits = 1 + gen_rand(&g, 3); edits > 0 && len > 0; edits--) {
                    size_t at = gen_rand(&g, (uint32_t)len);
                    char b = bytes[gen_rand(&g, sizeof bytes - 1)];
                    uint32_t op = gen_rand(&g, 3);
                    if (op == 0) {
                        text[at] = b;
                    } else if (op == 1) {
                        memmove(text + at + 1, text + at, len - at);
                        text[at] = b;
                        len++;
                    } else {
                        memmove(text + at, text + at + 1, len - at - 1);
                        len--;
                    }
                }
                jc_state_init(s, st);
                bool all = true;
                for (size_t i = 0; i < len && all; i++)
                    all = jc_feed(s, st, (const uint8_t *)text + i, 1);
                if (all)
                    (void)jc_free_string(s, st);
                if (all && jc_done(s, st)) {
                    check_with_jansson(text, len, k == 1);
                    done_count++;
                }
            }
        }
        free(st);
        jc_schema_free(s);
    }
    assert_true(done_count > 100); /* some mutations stay valid: the jansson check ran */
    free(g.buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(any_value_follows_the_json_grammar),
        cmocka_unit_test(whitespace_runs_are_limited_to_64_bytes),
        cmocka_unit_test(compact_documents_have_no_whitespace_anywhere),
        cmocka_unit_test(numbers_end_where_they_cannot_continue_and_are_at_most_64_bytes),
        cmocka_unit_test(numbers_end_only_where_jansson_can_read_them),
        cmocka_unit_test(integer_type_accepts_only_the_integer_grammar),
        cmocka_unit_test(string_escapes_and_surrogate_pairs),
        cmocka_unit_test(raw_utf8_must_be_valid),
        cmocka_unit_test(a_character_may_be_split_across_feeds),
        cmocka_unit_test(enum_and_const_match_their_compact_serialisation),
        cmocka_unit_test(enum_values_outside_the_rest_of_the_schema_are_dropped),
        cmocka_unit_test(properties_come_in_any_order_once_and_all_required_before_the_brace),
        cmocka_unit_test(required_names_need_not_be_declared),
        cmocka_unit_test(additional_properties_false_true_or_a_schema),
        cmocka_unit_test(a_key_that_begins_a_declared_name_stays_ambiguous_until_its_quote),
        cmocka_unit_test(escaped_keys_are_compared_by_their_decoded_bytes),
        cmocka_unit_test(items_prefix_items_and_item_counts),
        cmocka_unit_test(string_length_counts_code_points),
        cmocka_unit_test(type_arrays_and_boolean_schemas),
        cmocka_unit_test(any_of_objects_that_differ_only_after_some_keys),
        cmocka_unit_test(type_beside_any_of_restricts_every_branch),
        cmocka_unit_test(recursive_ref_nests_up_to_the_depth_limit),
        cmocka_unit_test(more_than_32_live_alternatives_reject_the_byte),
        cmocka_unit_test(identical_alternatives_merge_so_long_arrays_of_unions_stay_alive),
        cmocka_unit_test(free_string_holds_only_inside_unconstrained_string_content),
        cmocka_unit_test(state_copies_carry_everything_and_shallow_states_are_small),
        cmocka_unit_test(compile_errors_name_the_pointer_and_keyword),
        cmocka_unit_test(compile_limits_are_refused_with_enotsup),
        cmocka_unit_test(shared_sub_unions_compile_without_walking_every_path),
        cmocka_unit_test(annotations_and_unknown_keywords_are_ignored),
        cmocka_unit_test(pattern_holds_in_strings),
        cmocka_unit_test(null_schema_is_any_json_object),
        cmocka_unit_test(pydantic_schema_with_defs_refs_and_optional_fields),
        cmocka_unit_test(openai_strict_mode_schema),
        cmocka_unit_test(random_documents_are_viable_at_every_byte_and_done_at_the_end),
        cmocka_unit_test(random_walks_never_reach_a_dead_end),
        cmocka_unit_test(random_mutations_never_crash_and_done_texts_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
