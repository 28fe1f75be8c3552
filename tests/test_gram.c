/* The grammar matcher (common/gram.h): GBNF grammars and regular expressions cut texts at the
 * exact byte no sentence can follow, whole sentences recognised, UTF-8 split across feeds and
 * its first bytes refused where no character they begin fits, compile errors with their
 * messages; regular expressions against PCRE2 on every string of a small alphabet (whole
 * match, and viable prefix as PCRE2's hard partial match says); Lark grammars as vLLM's
 * guided_grammar takes them, and which of the two notations a grammar text is. */
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

#include "common/gram.h"

static gm_grammar *gbnf(const char *text)
{
    gm_grammar *g = NULL;
    if (gm_compile_gbnf(text, strlen(text), &g) != TD_OK)
        fail_msg("compile: %s", err_msg());
    return g;
}

static gm_grammar *lark(const char *text)
{
    gm_grammar *g = NULL;
    if (gm_compile_lark(text, strlen(text), &g) != TD_OK)
        fail_msg("compile: %s", err_msg());
    return g;
}

static void regex_ok(const char *re)
{
    gm_grammar *g = NULL;
    if (gm_compile_regex(re, strlen(re), &g) != TD_OK)
        fail_msg("compile /%s/: %s", re, err_msg());
    gm_free(g);
}

static gm_grammar *regex(const char *re)
{
    gm_grammar *g = NULL;
    if (gm_compile_regex(re, strlen(re), &g) != TD_OK)
        fail_msg("compile /%s/: %s", re, err_msg());
    return g;
}

/* How many bytes of text[0..n) the matcher takes one by one (n when all), and whether all of
 * it is a whole sentence. */
static size_t taken_n(const gm_grammar *g, const char *text, size_t n, bool *done)
{
    uint8_t *st = malloc(gm_state_size(g));
    assert_non_null(st);
    gm_state_init(g, st);
    size_t i = 0;
    while (i < n && gm_feed(g, st, (const uint8_t *)text + i, 1))
        i++;
    if (done)
        *done = i == n && gm_done(g, st);
    free(st);
    return i;
}

static size_t taken(const gm_grammar *g, const char *text, bool *done)
{
    return taken_n(g, text, strlen(text), done);
}

static void whole(const gm_grammar *g, const char *text)
{
    bool done;
    const size_t n = taken(g, text, &done);
    if (n != strlen(text) || !done)
        fail_msg("\"%s\": %zu of %zu bytes taken, whole %d", text, n, strlen(text), done);
}

static void cut_at(const gm_grammar *g, const char *text, size_t at)
{
    bool done;
    const size_t n = taken(g, text, &done);
    if (n != at)
        fail_msg("\"%s\": refused at byte %zu, want %zu", text, n, at);
}

static void refused(td_err (*compile)(const char *, size_t, gm_grammar **), const char *text,
                    td_err code, const char *msg)
{
    gm_grammar *g = NULL;
    const td_err e = compile(text, strlen(text), &g);
    if (e != code || strcmp(err_msg(), msg) != 0)
        fail_msg("\"%s\": %s \"%s\", want %s \"%s\"", text, err_name(e), err_msg(),
                 err_name(code), msg);
    assert_null(g);
}

static void test_gbnf_arithmetic_is_cut_where_no_expression_follows(void **ctx)
{
    (void)ctx;
    gm_grammar *g = gbnf("# expressions\n"
                         "root ::= expr\n"
                         "expr ::= term ((\"+\" | \"-\") term)*   # sums\n"
                         "term ::= num | \"(\" ws expr ws \")\"\n"
                         "num  ::= [0-9]+\n"
                         "ws   ::= [ \\t]*\n");
    whole(g, "1");
    whole(g, "12+(3-4)");
    whole(g, "((7))");
    whole(g, "( 1+2\t)-30");
    cut_at(g, "1+)", 2);
    cut_at(g, "(1))", 3);
    cut_at(g, "1 +2", 1);
    cut_at(g, "a", 0);
    bool done;
    assert_int_equal(taken(g, "12+(3", &done), 5);
    assert_false(done);
    assert_int_equal(taken(g, "", &done), 0);
    assert_false(done);
    gm_free(g);
}

static void test_gbnf_alternatives_span_lines_after_a_bar_and_inside_groups(void **ctx)
{
    (void)ctx;
    gm_grammar *g = gbnf("root ::= \"yes\" |\n"
                         "   \"no\" | (\n"
                         "  \"may\"\n"
                         "  \"be\" )\n"
                         "\n"
                         "unused ::= \"x\"");
    whole(g, "yes");
    whole(g, "no");
    whole(g, "maybe");
    cut_at(g, "mayo", 3);
    cut_at(g, "yess", 3);
    gm_free(g);
}

static void test_gbnf_repetition_bounds_are_exact(void **ctx)
{
    (void)ctx;
    gm_grammar *g = gbnf("root ::= \"a\"{2,4} \"b\"? [xy]{3} ([0-9] \"-\"){0,2} \"!\"{1,}");
    whole(g, "aaxyx!");
    whole(g, "aaaabyyy1-2-!!!");
    cut_at(g, "ab", 1);
    cut_at(g, "aaaaa", 4);
    cut_at(g, "aaxy!", 4);
    cut_at(g, "aaxxx1-2-3", 9);
    bool done;
    assert_int_equal(taken(g, "aaxxx", &done), 5);
    assert_false(done);
    gm_free(g);
    g = gbnf("root ::= \"ab\"+ | \"c\"{3}");
    whole(g, "ababab");
    whole(g, "ccc");
    cut_at(g, "aba", 3);
    cut_at(g, "abb", 2);
    cut_at(g, "cccc", 3);
    gm_free(g);
}

/* Code points split across feeds: a first byte passes when some allowed character starts
 * with it; U+20AC's E2 does not start any of [α-ω], CE B1 is α. */
static void test_gbnf_utf8_is_matched_by_code_point(void **ctx)
{
    (void)ctx;
    gm_grammar *g = gbnf("root ::= [α-ω]+ \"!\" [^a-z]");
    whole(g, "αβω!€");
    whole(g, "λ!A");
    cut_at(g, "α€", 2);
    cut_at(g, "αA", 2);
    cut_at(g, "λ!b", 3);
    cut_at(g, "\xce\xb1\xce", 3);   /* a viable first byte, then the text ends */
    cut_at(g, "\xce\xb1\xce\x41", 3); /* not a continuation byte */
    cut_at(g, "\xc0\x80", 0);       /* overlong */
    cut_at(g, "\xce\xb1!\xed\xa0\x80", 4); /* a surrogate */
    bool done;
    assert_int_equal(taken(g, "α!\xe2\x82", &done), 5);
    assert_false(done);
    gm_free(g);
    g = gbnf("root ::= \"\\u00e9\\x41\\U0001F600\" . [\\]\\-\\\\]");
    whole(g, "éA😀z]");
    whole(g, "éA😀\n-");
    whole(g, "éA😀😀\\");
    cut_at(g, "éA😀zz", 8);
    gm_free(g);
}

/* Right recursion and repetition keep the stacks short; nesting deepens them until a state
 * no longer holds them, where the next character is refused. */
static void test_gbnf_nesting_is_bounded_by_the_state(void **ctx)
{
    (void)ctx;
    gm_grammar *g = gbnf("root ::= \"(\" root \")\" | \"x\"\n");
    char text[2 * 300 + 8];
    for (int depth = 1; depth <= 300; depth++) {
        size_t n = 0;
        for (int i = 0; i < depth; i++)
            text[n++] = '(';
        text[n++] = 'x';
        for (int i = 0; i < depth; i++)
            text[n++] = ')';
        bool done;
        const size_t got = taken_n(g, text, n, &done);
        if (depth < GM_DEPTH_MAX) {
            if (got != n || !done)
                fail_msg("depth %d: %zu of %zu bytes", depth, got, n);
        } else {
            assert_int_equal(got, GM_DEPTH_MAX - 1);
        }
    }
    gm_free(g);
    g = gbnf("root ::= [a-z]* \".\"");
    char long_text[5001];
    memset(long_text, 'q', 5000);
    long_text[4999] = '.';
    long_text[5000] = 0;
    whole(g, long_text);
    gm_free(g);
}

/* Ambiguity: "a"* "a"* has as many parses as split points, but the stacks are distinct
 * only by position, so the state stays small. */
static void test_gbnf_ambiguous_grammars_keep_distinct_parses_once(void **ctx)
{
    (void)ctx;
    gm_grammar *g = gbnf("root ::= x* x* \"b\"\nx ::= \"a\" | \"aa\"\n");
    char text[3002];
    memset(text, 'a', 3000);
    text[3000] = 'b';
    text[3001] = 0;
    whole(g, text);
    gm_free(g);
}

#define TEN "abcdefghij"
#define SEVENTY TEN TEN TEN TEN TEN TEN TEN

/* Nullable rules in a row: 2^40 ways to the same stacks, each stack expanded once, so a
 * character costs what its distinct stacks cost; a start with more parses than a state holds
 * is refused when compiled. */
static void test_gbnf_many_ways_to_one_parse_cost_one(void **ctx)
{
    (void)ctx;
    static char text[16384] = "root ::= ";
    for (int i = 0; i < 40; i++)
        strcat(text, "n ");
    strcat(text, "\"z\"\nn ::= \"\" | \"\" | \"a\"?\n");
    gm_grammar *g = gbnf(text);
    whole(g, "z");
    whole(g, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaz");
    cut_at(g, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 40);
    gm_free(g);
    strcpy(text, "root ::= \"x0\"");
    for (int i = 1; i < 1100; i++)
        snprintf(text + strlen(text), sizeof text - strlen(text), " | \"x%d\"", i);
    refused(gm_compile_gbnf, text, TD_ENOTSUP,
            "the grammar's start has more parses than a state of 4096 bytes holds");
}

/* JSON written as a GBNF grammar the way llama.cpp's grammars are (empty alternatives,
 * escaped class bounds, bounded whitespace): documents pass whole, broken ones are cut at
 * their first wrong byte. */
static void test_gbnf_json_grammar_takes_json(void **ctx)
{
    (void)ctx;
    gm_grammar *g = gbnf(
        "root   ::= object\n"
        "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
        "object ::=\n"
        "  \"{\" ws (\n"
        "            string \":\" ws value\n"
        "    (\",\" ws string \":\" ws value)*\n"
        "  )? \"}\" ws\n"
        "array  ::=\n"
        "  \"[\" ws (\n"
        "            value\n"
        "    (\",\" ws value)*\n"
        "  )? \"]\" ws\n"
        "string ::=\n"
        "  \"\\\"\" (\n"
        "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
        "    \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
        "  )* \"\\\"\" ws\n"
        "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] "
        "[1-9]{0,15})? ws\n"
        "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n");
    whole(g, "{}");
    whole(g, "{\"a\": [1, -2.5e+3, true, null, {\"b\": \"x\\u00e9\\n\"}], \"c\": \"\"}");
    whole(g, "{\"k\":\n  \"v\"}\n");
    cut_at(g, "{\"a\": tru}", 9);
    cut_at(g, "{\"a\": 01}", 7);
    cut_at(g, "{\"a\": \"\x01\"}", 7);
    cut_at(g, "{\"a\" 1}", 5);
    cut_at(g, "[1]", 0);
    gm_free(g);
}

static void test_gbnf_errors_name_the_place(void **ctx)
{
    (void)ctx;
    refused(gm_compile_gbnf, "root ::= foo", TD_EINVAL,
            "grammar: the rule 'foo' is used but not defined");
    refused(gm_compile_gbnf, "a ::= \"x\"\na ::= \"y\"\nroot ::= a", TD_EINVAL,
            "grammar, line 2, column 1: the rule is defined twice");
    refused(gm_compile_gbnf, "start ::= \"x\"", TD_EINVAL, "grammar: no rule 'root'");
    refused(gm_compile_gbnf, "root ::= root \"a\" | \"a\"", TD_EINVAL,
            "grammar: left recursion through the rule 'root' (it can reach itself before any "
            "character; so does an open repetition of what can be empty)");
    refused(gm_compile_gbnf, "root ::= (\"a\"?)*", TD_EINVAL,
            "grammar: left recursion through a group or repetition in 'root' (it can reach "
            "itself before any character; so does an open repetition of what can be empty)");
    refused(gm_compile_gbnf, "root ::= e\ne ::= s e \"x\" | \"y\"\ns ::= \"\"", TD_EINVAL,
            "grammar: left recursion through the rule 'e' (it can reach itself before any "
            "character; so does an open repetition of what can be empty)");
    refused(gm_compile_gbnf, "root ::= \"a\n\nx", TD_EINVAL,
            "grammar, line 3, column 2: a literal is not closed");
    refused(gm_compile_gbnf, "root ::= ( \"a\" ", TD_EINVAL,
            "grammar, line 1, column 16: expected ')'");
    refused(gm_compile_gbnf, "root ::= \"a\" )", TD_EINVAL,
            "grammar, line 1, column 14: unbalanced ')'");
    refused(gm_compile_gbnf, "root ::= * \"a\"", TD_EINVAL,
            "grammar, line 1, column 10: a quantifier with nothing before it to repeat");
    refused(gm_compile_gbnf, "root ::= [z-a]", TD_EINVAL,
            "grammar, line 1, column 14: a character range goes backwards");
    refused(gm_compile_gbnf, "root ::= \"\\q\"", TD_EINVAL,
            "grammar, line 1, column 11: unknown escape");
    refused(gm_compile_gbnf, "root ::= \"a\" b ::= \"c\"", TD_EINVAL,
            "grammar, line 1, column 14: a rule begins before the line of the one before "
            "ends");
    refused(gm_compile_gbnf, "root = \"a\"", TD_EINVAL,
            "grammar, line 1, column 6: expected '::='");
    refused(gm_compile_gbnf, "root ::= \"a\"{1001}", TD_ENOTSUP,
            "a repetition bound above 1000");
    refused(gm_compile_gbnf, "root ::= <think> \"a\"", TD_ENOTSUP,
            "grammar: token references (<...>) are not supported");
    refused(gm_compile_gbnf, "root ::= \"\xff\"", TD_EINVAL,
            "grammar, line 1, column 11: the text is not UTF-8");
    refused(gm_compile_gbnf, "root ::= (\"a\"{1000}){1000} \"" SEVENTY "\"{1000}", TD_ENOTSUP,
            "the grammar needs more than 65000 elements (quantifiers are written out)");
}

static void test_lark_arithmetic_ignores_spaces_between_items(void **ctx)
{
    (void)ctx;
    gm_grammar *g = lark("// sums of products\n"
                         "?start: sum\n"
                         "?sum: product ((\"+\" | \"-\") product)*\n"
                         "?product: atom ((\"*\" | \"/\") atom)*\n"
                         "?atom: NUMBER -> number\n"
                         "     | \"-\" atom -> neg\n"
                         "     | \"(\" sum \")\"\n"
                         "%import common.NUMBER\n"
                         "%import common.WS_INLINE\n"
                         "%ignore WS_INLINE\n");
    whole(g, "1+2");
    whole(g, " 1 + 2 * ( 3.5 - -4 ) ");
    whole(g, "2e10/\t.5");
    whole(g, "1.");
    cut_at(g, "1 + + 2", 4);
    cut_at(g, "1 2", 2);  /* spaces stand between items, never inside a terminal */
    cut_at(g, "1e+x", 3);
    bool done;
    assert_int_equal(taken(g, "1 +", &done), 3);
    assert_false(done);
    gm_free(g);
}

static void test_lark_strings_ranges_and_bounded_repetitions(void **ctx)
{
    (void)ctx;
    gm_grammar *g = lark("start: greeting ~ 2..3 \"!\"\n"
                         "greeting: \"hi\"i | 'yo' | \"a\"..\"c\" DIGIT~2\n"
                         "DIGIT: /[0-9]/\n");
    whole(g, "hiHI!");
    whole(g, "hIyob42!");
    whole(g, "yoyoyo!");
    cut_at(g, "hi!", 2);
    cut_at(g, "hihihihi", 6);
    cut_at(g, "d00", 0);
    cut_at(g, "a4x", 2);
    gm_free(g);
    g = lark("start: \"\\u00e9t\\u00e9\"i \"\\\\\"");
    whole(g, "\xc3\x89T\xc3\xa9\\"); /* ÉTé\ */
    gm_free(g);
}

static void test_lark_definitions_go_on_after_a_bar_and_start_defaults_to_the_first(void **ctx)
{
    (void)ctx;
    gm_grammar *g = lark("answer: \"yes\"   // agree\n"
                         "\n"
                         "     | \"no\"\n"
                         "     | maybe\n"
                         "!maybe.2: \"may\" [\"be\"] -> perhaps\n");
    whole(g, "yes");
    whole(g, "no");
    whole(g, "may");
    whole(g, "maybe");
    cut_at(g, "mayo", 3);
    gm_free(g);
    /* start wins over the first definition */
    g = lark("a: \"a\"\nstart: a \"b\"\n");
    whole(g, "ab");
    cut_at(g, "a", 1);
    gm_free(g);
}

static void test_lark_ignored_items_stand_between_repetitions_and_around_the_text(void **ctx)
{
    (void)ctx;
    gm_grammar *g = lark("start: item+ (\",\" item)~0..1\n"
                         "item: WORD | \"<\" INT \">\"\n"
                         "%import common (WORD, INT, WS)\n"
                         "%ignore WS\n"
                         "%ignore /#[^\\n]*\\n/\n");
    whole(g, "ab");
    whole(g, " ab cd\n\tef , gh ");
    whole(g, "ab # note\n< 12 >");
    cut_at(g, "ab , cd , ef", 8);
    cut_at(g, "ab 1", 3);
    gm_free(g);
    g = lark("start: \"a\"*\n%ignore \" \"\n"); /* the empty text too */
    whole(g, "");
    whole(g, "  a a  a ");
    gm_free(g);
}

static void test_lark_regex_terminals_and_common_library(void **ctx)
{
    (void)ctx;
    gm_grammar *g = lark("start: /[a-z]+/ \"=\" /\\d{1,3}/ /a\\/b|[\\]\\/]/\n");
    whole(g, "x=12a/b");
    whole(g, "x=1]");
    cut_at(g, "x=1234", 5);
    gm_free(g);
    g = lark("start: ESCAPED_STRING\n%import common.ESCAPED_STRING\n");
    whole(g, "\"a\\\"b\"");
    whole(g, "\"\"");
    cut_at(g, "\"a\"b", 3);
    cut_at(g, "\"a\nb\"", 2);
    gm_free(g);
    g = lark("start: C_COMMENT | SIGNED_NUMBER | CNAME\n"
             "%import common (C_COMMENT, SIGNED_NUMBER,\n    CNAME)\n");
    whole(g, "/* a ** b */");
    whole(g, "/***/");
    cut_at(g, "/* a */ b */", 7);
    whole(g, "-1.5e-3");
    whole(g, "_x9");
    cut_at(g, "9x", 1);
    gm_free(g);
    g = lark("start: N (\",\" N)*\n%import common.INT -> N\n");
    whole(g, "1,22,333");
    cut_at(g, "1,,", 2);
    gm_free(g);
}

static void test_lark_regex_flags_fold_case_and_let_dot_match_newlines(void **ctx)
{
    (void)ctx;
    gm_grammar *g = lark("start: /[a-c]x+/i /k/i \"!\"\n");
    whole(g, "BxXk!");
    whole(g, "axxK!");
    whole(g, "cx\xe2\x84\xaa!"); /* the Kelvin sign is a k, as in Python */
    cut_at(g, "dx", 0);
    cut_at(g, "ax!", 2);
    gm_free(g);
    g = lark("start: /[^a]s/iu \"|\" /i/i\n");
    whole(g, "b\xc5\xbf|\xc4\xb1"); /* long s, dotless i */
    cut_at(g, "A", 0);
    gm_free(g);
    g = lark("start: /a.b/sm /a.b/\n");
    whole(g, "a\nbaxb");
    cut_at(g, "a\nba\n", 4);
    gm_free(g);
    g = lark("start: /[a ]+ \\  b* | c{2}/x\n"); /* verbose: white space means nothing */
    whole(g, "a a ");
    whole(g, "a bb");
    whole(g, "cc");
    cut_at(g, "a c", 2);
    cut_at(g, "b", 0);
    gm_free(g);
}

static void test_lark_templates_take_their_arguments_where_their_parameters_stand(void **ctx)
{
    (void)ctx;
    gm_grammar *g = lark("start: _separated{item, \",\"}\n"
                         "_separated{x, sep}: x (sep x)*\n"
                         "item: /[a-z]+/\n");
    whole(g, "a,bc,d");
    whole(g, "abc");
    cut_at(g, "a,,b", 2);
    gm_free(g);
    /* one template with a rule and a terminal, nested through a rule that uses it */
    g = lark("start: list{pair}\n"
             "list{x}: \"[\" [x (\",\" x)*] \"]\"\n"
             "pair: list{NUMBER} | NUMBER\n"
             "%import common.NUMBER\n");
    whole(g, "[[1,2.5],3,[]]");
    whole(g, "[]");
    cut_at(g, "[[1,[", 4);
    gm_free(g);
    /* a template that uses itself: one instance per argument, so finitely many */
    g = lark("start: nest{\"a\"} nest{\"a\"i} nest{\"b\"}\n"
             "nest{x}: x | \"(\" nest{x} \")\"\n");
    whole(g, "((a))A(b)");
    cut_at(g, "(()", 2);
    gm_free(g);
    /* defined below its use, with ignored spaces between the items of its body */
    g = lark("start: pair{\"k\", INT} (\";\" pair{/[a-z]/, INT})*\n"
             "pair{a, b}: a \"=\" b\n"
             "%import common (INT, WS)\n"
             "%ignore WS\n");
    whole(g, " k = 12 ; x=3 ");
    cut_at(g, "k = x", 4);
    gm_free(g);
}

static void test_lark_override_and_extend_change_a_definition_above_them(void **ctx)
{
    (void)ctx;
    gm_grammar *g = lark("start: NUMBER (\",\" NUMBER)*\n"
                         "%import common.NUMBER\n"
                         "%extend NUMBER: \"inf\" | \"nan\"\n");
    whole(g, "1.5,inf,nan,2");
    cut_at(g, "1,in,", 4);
    gm_free(g);
    g = lark("start: item+\nitem: \"a\"\n%override item: \"b\" | \"c\"\n");
    whole(g, "bcb");
    cut_at(g, "a", 0);
    gm_free(g);
}

static void test_lark_vllm_sql_example(void **ctx)
{
    (void)ctx;
    gm_grammar *g = lark("?start: select_statement\n"
                         "?select_statement: \"SELECT \" column_list \" FROM \" table_name\n"
                         "?column_list: column_name (\",\" column_name)*\n"
                         "?table_name: identifier\n"
                         "?column_name: identifier\n"
                         "?identifier: /[a-zA-Z_][a-zA-Z0-9_]*/\n");
    whole(g, "SELECT a,b_2 FROM t");
    cut_at(g, "SELECT a b", 9);
    cut_at(g, "select", 0);
    gm_free(g);
}

static void test_lark_errors_name_the_place(void **ctx)
{
    (void)ctx;
    refused(gm_compile_lark, "start: a", TD_EINVAL, "grammar: 'a' is used but not defined");
    refused(gm_compile_lark, "start: \"x\"\nstart: \"y\"", TD_EINVAL,
            "grammar, line 2, column 1: the name is defined twice");
    refused(gm_compile_lark, "X: y\ny: \"a\"", TD_EINVAL,
            "grammar, line 1, column 4: a terminal can only use strings, regular expressions "
            "and terminals, not a rule");
    refused(gm_compile_lark, "start: \"a\" b: \"c\"", TD_EINVAL,
            "grammar, line 1, column 12: a definition begins before the line of the one "
            "before ends");
    refused(gm_compile_lark, "start: (\"a\"", TD_EINVAL,
            "grammar, line 1, column 12: expected ')'");
    refused(gm_compile_lark, "start: \"abc\n", TD_EINVAL,
            "grammar, line 1, column 12: a string is not closed on its line");
    refused(gm_compile_lark, "start: \"a\"..\"cd\"", TD_EINVAL,
            "grammar, line 1, column 15: a range's ends are strings of one character each");
    refused(gm_compile_lark, "start: \"a\" ~ 3..2", TD_EINVAL,
            "grammar, line 1, column 18: a repetition's maximum is below its minimum");
    refused(gm_compile_lark, "start: \"a\" ]", TD_EINVAL,
            "grammar, line 1, column 12: unbalanced bracket");
    refused(gm_compile_lark, "start: /a(/", TD_EINVAL,
            "grammar, line 1, column 11: missing ')'");
    refused(gm_compile_lark, "start = \"a\"", TD_EINVAL,
            "grammar, line 1, column 7: expected ':'");
    refused(gm_compile_lark, "%import common.FOO", TD_EINVAL,
            "grammar, line 1, column 16: Lark's common library has no such terminal");
    refused(gm_compile_lark, "start: start \"a\" | \"b\"", TD_EINVAL,
            "grammar: left recursion through the rule 'start' (it can reach itself before "
            "any character; so does an open repetition of what can be empty)");
    refused(gm_compile_lark, "// nothing", TD_EINVAL, "grammar: no rule");
    refused(gm_compile_lark, "start: /a/l", TD_ENOTSUP,
            "grammar: the regular expression flag l is not supported (i, m, s, u and x are)");
    refused(gm_compile_lark, "start: /a/iq", TD_EINVAL,
            "grammar, line 1, column 12: a regular expression's flags are among i, m, s, l, "
            "u, x");
    refused(gm_compile_lark, "%import foo.BAR\nstart: \"a\"", TD_ENOTSUP,
            "grammar: only Lark's `common` library can be imported");
    refused(gm_compile_lark, "%declare X\nstart: \"a\"", TD_ENOTSUP,
            "grammar: the directive %declare is not supported (%import common, %ignore, "
            "%override and %extend are)");
    refused(gm_compile_lark, "%extend x: \"a\"\nx: \"b\"", TD_EINVAL,
            "grammar, line 1, column 9: %extend needs a definition above it");
    char long_name[160] = "start: ";
    memset(long_name + 7, 'a', 101);
    refused(gm_compile_lark, long_name, TD_EINVAL,
            "grammar, line 1, column 109: a name of more than 100 bytes");
    refused(gm_compile_lark, "start: t{\"a\"}", TD_EINVAL,
            "grammar, line 1, column 8: no template of this name is defined");
    refused(gm_compile_lark, "start: t{\"a\", \"b\"}\nt{x}: x", TD_EINVAL,
            "grammar, line 1, column 8: the template is used with another number of "
            "arguments than it has parameters");
    refused(gm_compile_lark, "t{x}: x\nt{y}: y\nstart: t{\"a\"}", TD_EINVAL,
            "grammar, line 2, column 1: the template is defined twice");
    refused(gm_compile_lark, "A: t{\"a\"}\nt{x}: x", TD_EINVAL,
            "grammar, line 1, column 4: a terminal can only use strings, regular expressions "
            "and terminals, not a rule");
    refused(gm_compile_lark, "t{}: \"a\"", TD_EINVAL,
            "grammar, line 1, column 3: expected a parameter's name");
    refused(gm_compile_lark, "start: t{}\nt{x}: x", TD_EINVAL,
            "grammar, line 1, column 10: a template's argument is empty");
    refused(gm_compile_lark, "t{x}: x (\nstart: t{\"a\"}", TD_EINVAL,
            "grammar, line 2, column 1: a definition begins before the line of the one "
            "before ends");
    refused(gm_compile_lark, "start: t{\"a\"}\nt{x}: x | t{(x x)}", TD_ENOTSUP,
            "grammar: templates used with more than 256 different arguments");
    char many[257 * 16] = "start: \"a\"\n", *at = many + strlen(many);
    for (int i = 0; i < 257; i++)
        at += sprintf(at, "t%d{x}: x\n", i);
    refused(gm_compile_lark, many, TD_ENOTSUP, "grammar: more than 256 templates");
}

static void test_grammar_text_is_gbnf_or_lark_by_its_rules(void **ctx)
{
    (void)ctx;
    gm_grammar *g = NULL;
    const char *gbnf_text = "# x\n  root ::= \"a\" b\nb ::= \"c\"";
    assert_int_equal(gm_compile_grammar(gbnf_text, strlen(gbnf_text), &g), TD_OK);
    whole(g, "ac");
    gm_free(g);
    const char *lark_text = "start: \"a\" | \"::=\"";
    assert_int_equal(gm_compile_grammar(lark_text, strlen(lark_text), &g), TD_OK);
    whole(g, "::=");
    gm_free(g);
    refused(gm_compile_grammar, "root = \"a\"", TD_EINVAL,
            "grammar, line 1, column 6: expected ':'");
    refused(gm_compile_grammar, "root ::= \"a\" )", TD_EINVAL,
            "grammar, line 1, column 14: unbalanced ')'");
}

static void test_regex_matches_whole_texts(void **ctx)
{
    (void)ctx;
    gm_grammar *g = regex("^\\d{3}-\\d{4}$");
    whole(g, "555-1234");
    cut_at(g, "55-1234", 2);
    cut_at(g, "555-12345", 8);
    gm_free(g);
    g = regex("(?:cat|dog)s?|(?P<b>bird)");
    whole(g, "cat");
    whole(g, "dogs");
    whole(g, "bird");
    cut_at(g, "cats!", 4);
    cut_at(g, "cow", 1);
    gm_free(g);
    g = regex("[^\\n]*\\n.+");
    whole(g, "any thing\nmore");
    cut_at(g, "a\n\n", 2);
    gm_free(g);
    g = regex("[\\w.-]+@[^\\W_]+\\.(com|org)");
    whole(g, "first.last-x@example.org");
    cut_at(g, "a@b_c.com", 3);
    gm_free(g);
    g = regex("(?i)k[^\\x80-\\uffff]");
    whole(g, "\xe2\x84\xaa" "A"); /* Kelvin sign: its case class holds k, as in Python */
    gm_free(g);
    g = regex("(?ai)k");
    whole(g, "K");
    cut_at(g, "\xe2\x84\xaa", 0); /* ASCII: no */
    gm_free(g);
    g = regex("a{2,}?b{,2}[]x]\\D\\S\\s");
    whole(g, "aaab]-x\t");
    whole(g, "aax%x\n");
    cut_at(g, "aabbbx", 4);
    cut_at(g, "aax1", 3);
    gm_free(g);
}

static void test_regex_refusals_say_what(void **ctx)
{
    (void)ctx;
    char deep[256];
    memset(deep, '(', 101);
    memset(deep + 101, ')', 101);
    deep[202] = 0;
    refused(gm_compile_regex, deep, TD_ENOTSUP, "groups nested deeper than 100");
    deep[0] = ' ', deep[201] = ' '; /* 100 deep */
    regex_ok(deep + 1);
    refused(gm_compile_regex, "(a)\\1", TD_ENOTSUP,
            "regular expression, at byte 3: \\1 is not supported");
    refused(gm_compile_regex, "a(?=b)", TD_ENOTSUP,
            "regular expression, at byte 2: lookaround and other (? groups are not supported");
    refused(gm_compile_regex, "(?mL)^a", TD_ENOTSUP,
            "regular expression, at byte 3: the inline flag L is not supported (a, i, m, s, u "
            "and x are)");
    refused(gm_compile_regex, "a(?i)b", TD_EINVAL,
            "regular expression, at byte 4: global flags not at the start of the expression");
    refused(gm_compile_regex, "(?-i)b", TD_EINVAL,
            "regular expression, at byte 4: flags can be turned off only for a group (?-i:...)");
    refused(gm_compile_regex, "(?iq:b)", TD_EINVAL,
            "regular expression, at byte 3: unknown inline flag");
    refused(gm_compile_regex, "(?i", TD_EINVAL,
            "regular expression, at byte 3: missing ')' or ':' after inline flags");
    refused(gm_compile_pattern, "(?i)a", TD_EINVAL,
            "regular expression, at byte 1: a JSON Schema pattern (ECMA-262) has no inline "
            "flags");
    refused(gm_compile_regex, "a**", TD_EINVAL, "regular expression, at byte 2: multiple repeat");
    refused(gm_compile_regex, "*a", TD_EINVAL, "regular expression, at byte 0: nothing to repeat");
    refused(gm_compile_regex, "(ab", TD_EINVAL, "regular expression, at byte 3: missing ')'");
    refused(gm_compile_regex, "ab)", TD_EINVAL, "regular expression, at byte 2: unbalanced ')'");
    refused(gm_compile_regex, "a^b", TD_ENOTSUP,
            "regular expression, at byte 1: '^' is only supported at the start");
    refused(gm_compile_regex, "a++", TD_ENOTSUP,
            "regular expression: possessive quantifiers are not supported");
    refused(gm_compile_regex, "[b-a]", TD_EINVAL,
            "regular expression, at byte 4: a character range goes backwards");
    refused(gm_compile_regex, "(a*)*", TD_EINVAL,
            "regular expression: left recursion through a group or repetition in 'root' (it "
            "can reach itself before any character; so does an open repetition of what can be "
            "empty)");
}

/* Word v (base 5) of len characters over "ab1-\n" into s. */
static void alpha_word(char *s, long v, int len)
{
    static const char alpha[] = "ab1-\n";
    for (int i = 0; i < len; i++, v /= 5)
        s[i] = alpha[v % 5];
}

/* Whether some word of extra characters after s[0, len) makes PCRE2 find a match. */
static bool pcre2_extends(const pcre2_code *re, pcre2_match_data *md, char *s, int len, int extra)
{
    long m = 1;
    for (int i = 0; i < extra; i++)
        m *= 5;
    for (long w = 0; w < m; w++) {
        alpha_word(s + len, w, extra);
        if (pcre2_match(re, (PCRE2_SPTR)s, (PCRE2_SIZE)(len + extra), 0, 0, md, NULL) >= 0)
            return true;
    }
    return false;
}

/* Every string of up to 6 characters over "ab1-\n" against PCRE2: the whole text matches iff
 * PCRE2 matches it whole, and each prefix is taken iff PCRE2's hard partial match finds it
 * viable (a partial match, or a whole one). */
static void test_regex_agrees_with_pcre2_on_every_short_string(void **ctx)
{
    (void)ctx;
    static const char *const res[] = {
        "a*b", "(ab|a)*1", "[ab]{2,3}-?", "a?b?1*", "(a|b)+\\d", ".*-", "[^a]+a",
        "(?:a-|b1){1,2}\\n?", "\\w\\W?", "a{0,2}(b|1-)*", "(a(b(1)?)?)?-", "",
        "(?i)A+[B-Z]?", "(?s)a.-|.\\n", "(?x) a b* # c", "(?i:A)B|b(?i:B1)", "(?is)(?-i:A)|a.",
        "(?i)^(a|(?-i:B))*", "(?x: a | b ) 1 (?-x: -)?", "(?m)^a|b1$",
    };
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    assert_non_null(md);
    for (size_t k = 0; k < sizeof res / sizeof res[0]; k++) {
        gm_grammar *g = regex(res[k]);
        int errc;
        PCRE2_SIZE erroff;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)res[k], PCRE2_ZERO_TERMINATED, PCRE2_UTF,
                                       &errc, &erroff, NULL);
        assert_non_null(re);
        char s[8];
        long checked = 0;
        for (int len = 0; len <= 6; len++) {
            long count = 1;
            for (int i = 0; i < len; i++)
                count *= 5;
            for (long v = 0; v < count; v++) {
                alpha_word(s, v, len);
                s[len] = 0;
                const int full = pcre2_match(re, (PCRE2_SPTR)s, (PCRE2_SIZE)len, 0,
                                             PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, NULL);
                /* hard partial matching: the subject's end reached by a match attempt that
                 * needs more; none is reported for an empty subject */
                const int part = pcre2_match(re, (PCRE2_SPTR)s, (PCRE2_SIZE)len, 0,
                                             PCRE2_ANCHORED | PCRE2_PARTIAL_HARD, md, NULL);
                const bool viable = len == 0 || full >= 0 || part == PCRE2_ERROR_PARTIAL;
                bool done;
                const size_t n = taken_n(g, s, (size_t)len, &done);
                if ((n == (size_t)len) != viable || (n == (size_t)len && done != (full >= 0)))
                    fail_msg("/%s/ on \"%s\": %zu bytes taken, whole %d; PCRE2: viable %d, "
                             "whole %d", res[k], s, n, done, viable, full >= 0);
                checked++;
            }
        }
        assert_int_equal(checked, 19531);
        pcre2_code_free(re);
        gm_free(g);
    }
    pcre2_match_data_free(md);
}

/* JSON Schema's reading of a pattern (a search; '^' and '$' hold a top-level alternative to
 * an end) as an automaton, against PCRE2's unanchored search on every string of up to 5
 * characters over "ab1-\n": a string is accepted iff PCRE2 finds a match in it, and the
 * automaton's distance to acceptance is the fewest characters PCRE2 needs appended (up to 3
 * checked; more or none where PCRE2 finds none within 3). Automata past their limits
 * (states, transitions, parse steps) are refused with the limit named. */
static void test_pattern_automaton_agrees_with_pcre2_search(void **ctx)
{
    (void)ctx;
    static const char *const res[] = {
        "ab", "^a", "b$", "^a|b$", "a.b", "(a|1)-\\d", "^[ab]+$", "1{2}", "[^a]b", "",
        "^(ab|b1)*-$", "a{3}", "^a(b|1-)?$", "^(a|b1)-?\\d?$",
    };
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    assert_non_null(md);
    for (size_t k = 0; k < sizeof res / sizeof res[0]; k++) {
        gm_grammar *g = NULL;
        if (gm_compile_pattern(res[k], strlen(res[k]), &g) != TD_OK)
            fail_msg("compile /%s/: %s", res[k], err_msg());
        gm_dfa *d = NULL;
        if (gm_dfa_build(g, &d) != TD_OK)
            fail_msg("automaton of /%s/: %s", res[k], err_msg());
        int errc;
        PCRE2_SIZE erroff;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)res[k], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &errc, &erroff, NULL);
        assert_non_null(re);
        char s[16];
        for (int len = 0; len <= 5; len++) {
            long count = 1;
            for (int i = 0; i < len; i++)
                count *= 5;
            for (long v = 0; v < count; v++) {
                alpha_word(s, v, len);
                uint16_t st = 0;
                for (int i = 0; i < len; i++)
                    st = gm_dfa_step(d, st, (uint8_t)s[i]);
                int need = -1; /* fewest characters to append for a match, up to 3 */
                for (int extra = 0; extra <= 3 && need < 0; extra++)
                    if (pcre2_extends(re, md, s, len, extra))
                        need = extra;
                const int dist = st == GM_DFA_DEAD ? -1 : d->dmin[st];
                if (need >= 0 ? dist != need : (dist >= 0 && dist <= 3))
                    fail_msg("/%s/ on \"%.*s\": automaton distance %d, PCRE2 needs %d", res[k],
                             len, s, dist, need);
                if (len > 3 || st == GM_DFA_DEAD)
                    continue;
                int most = -1; /* the most characters appended with a match, up to 4 */
                for (int extra = 4; extra >= 0 && most < 0; extra--)
                    if (pcre2_extends(re, md, s, len, extra))
                        most = extra;
                /* a bounded state's longest way is exact; an unbounded one has matches 3 or 4
                 * characters on (every loop here has a period of at most 2) */
                const uint16_t far = d->dmax[st];
                if (far == GM_DFA_FAR ? most < 3 : far != most)
                    fail_msg("/%s/ on \"%.*s\": automaton's longest way %d, PCRE2's %d", res[k],
                             len, s, far == GM_DFA_FAR ? -1 : (int)far, most);
            }
        }
        pcre2_code_free(re);
        gm_dfa_free(d);
        gm_free(g);
    }
    pcre2_match_data_free(md);
    gm_grammar *g = regex("x{1000}y{1000}z{1000}w{1000}v{1000}"); /* a state per position */
    gm_dfa *d = NULL;
    assert_int_equal(gm_dfa_build(g, &d), TD_ENOTSUP);
    assert_string_equal(err_msg(), "the pattern needs more than 4096 automaton states");
    assert_null(d);
    gm_free(g);
    /* 45 separate characters: 91 classes, a state per position: too many transitions */
    static const char sparse[] = "^[acegikmoqsuwyACEGIKMOQSUWY02468!#%&(*,.:<>@]{1000}$";
    assert_int_equal(gm_compile_pattern(sparse, strlen(sparse), &g), TD_OK);
    assert_int_equal(gm_dfa_build(g, &d), TD_ENOTSUP);
    assert_non_null(strstr(err_msg(), "the pattern needs more than 65536 automaton transitions"));
    assert_null(d);
    gm_free(g);
    /* 20 unanchored alternatives with counted digits: overlapping partial matches make many
     * states, each stepped over every alternative: too many parse steps */
    char many[512] = "";
    for (int i = 0; i < 20; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%s%c\\d{%d}\\s",
                 i ? "|" : "", 'a' + i, i % 7 + 1);
    assert_int_equal(gm_compile_pattern(many, strlen(many), &g), TD_OK);
    assert_int_equal(gm_dfa_build(g, &d), TD_ENOTSUP);
    assert_non_null(strstr(err_msg(), "the pattern's automaton takes more than 1048576 parse "
                                      "steps to build"));
    assert_null(d);
    gm_free(g);
}

/* A pattern (JSON Schema's) reads '.' and \s as ECMA-262 does: '.' is no line terminator
 * (\n, \r, U+2028, U+2029), \s is its WhiteSpace and LineTerminator set (NBSP, U+3000,
 * U+FEFF, U+2028 but not NEL U+0085), \S and [^\s] their complement; a regular expression
 * (guided_regex) keeps '.' = not \n and the ASCII \s. */
static void test_pattern_reads_dot_and_space_as_ecma(void **ctx)
{
    (void)ctx;
    gm_grammar *g = NULL;
    static const char dot[] = "^a.b$", sp[] = "^\\s+$", nsp[] = "^[^\\s]\\S$";
    assert_int_equal(gm_compile_pattern(dot, strlen(dot), &g), TD_OK);
    whole(g, "a\tb");
    whole(g, "a\xc2\x85" "b"); /* NEL is not a line terminator in ECMA-262 */
    cut_at(g, "a\rb", 1);
    cut_at(g, "a\nb", 1);
    cut_at(g, "a\xe2\x80\xa8" "b", 3); /* U+2028: its last byte */
    whole(g, "a\xe2\x80\xa7" "b");       /* U+2027 */
    gm_free(g);
    assert_int_equal(gm_compile_pattern(sp, strlen(sp), &g), TD_OK);
    whole(g, " \t\n\r\v\f");
    whole(g, "\xc2\xa0\xe3\x80\x80\xef\xbb\xbf\xe2\x80\xa9\xe2\x80\x8a\xe1\x9a\x80");
    cut_at(g, " \xc2\x85", 2);             /* NEL: its second byte */
    cut_at(g, " \xe2\x80\x8b", 3);         /* U+200B (zero width space) is not */
    gm_free(g);
    assert_int_equal(gm_compile_pattern(nsp, strlen(nsp), &g), TD_OK);
    whole(g, "x\xc2\x85");
    cut_at(g, "\xc2\xa0x", 1);
    cut_at(g, "x\xe3\x80\x80", 3);
    gm_free(g);
    g = regex("a.b");
    whole(g, "a\rb");
    whole(g, "a\xe2\x80\xa8" "b");
    gm_free(g);
    g = regex("\\s");
    cut_at(g, "\xc2\xa0", 0); /* no character of two bytes is an ASCII space */
    gm_free(g);
}

/* A copy carries the state on: feeding the rest into a copy gives what feeding it whole does. */
static void test_a_copied_state_goes_on_like_the_original(void **ctx)
{
    (void)ctx;
    gm_grammar *g = gbnf("root ::= (\"ab\" | \"a\" \"c\"*)+ \";\"");
    uint8_t *a = malloc(gm_state_size(g)), *b = malloc(gm_state_size(g));
    assert_non_null(a);
    assert_non_null(b);
    gm_state_init(g, a);
    assert_true(gm_feed(g, a, (const uint8_t *)"abacc", 5));
    memset(b, 0xa5, gm_state_size(g));
    gm_state_copy(g, b, a);
    assert_true(gm_feed(g, b, (const uint8_t *)"ab;", 3));
    assert_true(gm_done(g, b));
    assert_false(gm_feed(g, a, (const uint8_t *)"b", 1));
    free(a);
    free(b);
    gm_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gbnf_arithmetic_is_cut_where_no_expression_follows),
        cmocka_unit_test(test_gbnf_alternatives_span_lines_after_a_bar_and_inside_groups),
        cmocka_unit_test(test_gbnf_repetition_bounds_are_exact),
        cmocka_unit_test(test_gbnf_utf8_is_matched_by_code_point),
        cmocka_unit_test(test_gbnf_nesting_is_bounded_by_the_state),
        cmocka_unit_test(test_gbnf_ambiguous_grammars_keep_distinct_parses_once),
        cmocka_unit_test(test_gbnf_many_ways_to_one_parse_cost_one),
        cmocka_unit_test(test_gbnf_json_grammar_takes_json),
        cmocka_unit_test(test_gbnf_errors_name_the_place),
        cmocka_unit_test(test_lark_arithmetic_ignores_spaces_between_items),
        cmocka_unit_test(test_lark_strings_ranges_and_bounded_repetitions),
        cmocka_unit_test(test_lark_definitions_go_on_after_a_bar_and_start_defaults_to_the_first),
        cmocka_unit_test(test_lark_ignored_items_stand_between_repetitions_and_around_the_text),
        cmocka_unit_test(test_lark_regex_terminals_and_common_library),
        cmocka_unit_test(test_lark_regex_flags_fold_case_and_let_dot_match_newlines),
        cmocka_unit_test(test_lark_templates_take_their_arguments_where_their_parameters_stand),
        cmocka_unit_test(test_lark_override_and_extend_change_a_definition_above_them),
        cmocka_unit_test(test_lark_vllm_sql_example),
        cmocka_unit_test(test_lark_errors_name_the_place),
        cmocka_unit_test(test_grammar_text_is_gbnf_or_lark_by_its_rules),
        cmocka_unit_test(test_regex_matches_whole_texts),
        cmocka_unit_test(test_regex_refusals_say_what),
        cmocka_unit_test(test_regex_agrees_with_pcre2_on_every_short_string),
        cmocka_unit_test(test_pattern_automaton_agrees_with_pcre2_search),
        cmocka_unit_test(test_pattern_reads_dot_and_space_as_ecma),
        cmocka_unit_test(test_a_copied_state_goes_on_like_the_original),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
