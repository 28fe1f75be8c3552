/* The Jinja interpreter and chat_render: exact outputs for filters, tests, loops, whitespace
 * control, slicing, namespaces, macros, tojson and Python repr (expected strings produced by
 * jinja2 configured as transformers configures it); the three real Qwen chat templates against
 * golden prompts written by transformers (scripts/chat_template_golden.py); compile errors that
 * name the line and what was expected; hostile templates that stop at a limit instead of
 * hanging, crashing or exhausting memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/chat.h"
#include "common/jinja.h"
#include "common/jinja_int.h"

#define CHAT_DATA "tests/data/chat/"

static json_t *json_of(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_ALLOW_NUL, &je);
    if (!j)
        fail_msg("bad test JSON: %s", je.text);
    return j;
}

/* Renders tmpl with vars (JSON text or NULL); returns the code, the output in *out. */
static td_err render_lim(const char *tmpl, const char *vars, const jinja_limits *lim, char **out)
{
    jinja_tmpl *t;
    *out = NULL;
    td_err e = jinja_compile(&t, tmpl, strlen(tmpl));
    if (e != TD_OK)
        return e;
    json_t *v = vars ? json_of(vars) : NULL;
    size_t n;
    e = jinja_render(t, v, lim, out, &n, NULL);
    json_decref(v);
    jinja_free(t);
    return e;
}

static void expect(const char *tmpl, const char *vars, const char *want)
{
    char *out;
    td_err e = render_lim(tmpl, vars, NULL, &out);
    if (e != TD_OK)
        fail_msg("template %s\nfailed: %s", tmpl, err_msg());
    if (strcmp(out, want) != 0)
        fail_msg("template %s\nwant [%s]\ngot  [%s]", tmpl, want, out);
    free(out);
}

static void expect_err(const char *tmpl, const char *vars, td_err code, const char *msg)
{
    char *out;
    td_err e = render_lim(tmpl, vars, NULL, &out);
    if (e == TD_OK)
        fail_msg("template %s\nrendered [%s], expected an error", tmpl, out);
    if (e != code || strcmp(err_msg(), msg) != 0)
        fail_msg("template %s\nwant %s \"%s\"\ngot  %s \"%s\"", tmpl, err_name(code), msg, err_name(e), err_msg());
}

#define VARS "{\"d\":{\"b\":1,\"a\":[1,2.5,null,true],\"é\":\"ü\\n\"},\"s\":\"añb😀c\",\"xs\":[1,2,3],\"n\":null,\"f\":1.5}"

static void test_tojson_is_json_dumps_with_transformers_arguments(void **state)
{
    (void)state;
    expect("{{ d|tojson }}|{{ s|tojson }}|{{ [1.0, 0.1, 1e16, 1e-05, -0.0, 5e-324]|tojson }}|{{ d|tojson(indent=2) }}", VARS,
           "{\"b\": 1, \"a\": [1, 2.5, null, true], \"é\": \"ü\\n\"}|\"añb😀c\"|[1.0, 0.1, 1e+16, 1e-05, -0.0, 5e-324]|"
           "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"é\": \"ü\\n\"\n}");
    /* control characters as \u00XX, U+2028 and DEL raw (ensure_ascii=False), quotes and backslash */
    expect("{{ s|tojson }}", "{\"s\":\"\\u0001\\u001f\\u007f\\u2028\\\"\\\\\\b\\f\\r\\t\"}",
           "\"\\u0001\\u001f\x7f\u2028\\\"\\\\\\b\\f\\r\\t\"");
    expect("{{ d|tojson(sort_keys=true, separators=[',', ':']) }}|{{ 'é😀'|tojson(ensure_ascii=true) }}", VARS,
           "{\"a\":[1,2.5,null,true],\"b\":1,\"é\":\"ü\\n\"}|\"\\u00e9\\ud83d\\ude00\"");
    expect_err("{{ u|tojson }}", NULL, TD_EINVAL, "Object of type Undefined is not JSON serializable");
}

static void test_values_print_as_python_str_and_repr(void **state)
{
    (void)state;
    expect("{{ d }}|{{ [s, 'it\\'s', \"say \\\"hi\\\"\", none, true, 2.5] }}|{{ (1,) }}|{{ d|string }}|{{ 1e22 }}|{{ 7 / 2 }}", VARS,
           "{'b': 1, 'a': [1, 2.5, None, True], 'é': 'ü\\n'}|['añb😀c', \"it's\", 'say \"hi\"', None, True, 2.5]|(1,)|"
           "{'b': 1, 'a': [1, 2.5, None, True], 'é': 'ü\\n'}|1e+22|3.5");
    expect("{{ ['\\x00\\x7f\\x85\\xa0\\u200b', '\\\\'] }}|{{ n }}|{{ u }}|{{ f }}", VARS,
           "['\\x00\\x7f\\x85\\xa0\\u200b', '\\\\']|None||1.5");
}

static void test_float_repr_is_pythons(void **state)
{
    (void)state;
    static const struct {
        double v;
        const char *want;
    } cases[] = {
        {0.1, "0.1"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"}, {1e-5, "1e-05"},
        {0.0001, "0.0001"}, {5e-324, "5e-324"}, {1.7976931348623157e308, "1.7976931348623157e+308"},
        {2.0, "2.0"}, {123456789.123456789, "123456789.12345679"}, {9007199254740993.0, "9007199254740992.0"},
        {1.0 / 3, "0.3333333333333333"}, {-1.5e-7, "-1.5e-07"}, {1.5e-323, "1.5e-323"}, {1e23, "1e+23"},
        {8.41e21, "8.41e+21"}, {2.5e-5, "2.5e-05"}, {-0.0, "-0.0"}, {0.0, "0.0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[32];
        py_float_repr(cases[i].v, buf);
        assert_string_equal(buf, cases[i].want);
    }
}

static void test_strings_slice_and_measure_by_code_point(void **state)
{
    (void)state;
    expect("{{ s[::-1] }}|{{ s[1:4] }}|{{ s[-2:] }}|{{ s[::2] }}|{{ s|length }}|{{ xs[::-1] }}|{{ xs[5:] }}", VARS,
           "c😀bña|ñb😀|😀c|abc|5|[3, 2, 1]|[]");
    expect("{{ '  a b  '|trim }}|{{ 'x\\n'.rstrip('\\n') }}|{{ 'a</think>b'.split('</think>')[-1] }}|{{ 'ab'.startswith('a') }}|"
           "{{ s.upper() }}|{{ 'a-b'.replace('-', '+') }}", VARS,
           "a b|x|b|True|AÑB😀C|a+b");
    expect("{{ '\\u3000\\xa0 x \\n'|trim }}|{{ 'a  b\\tc'.split() }}|{{ 'a,b,c'.rsplit(',', 1) }}", NULL,
           "x|['a', 'b', 'c']|['a,b', 'c']");
}

static void test_tests_follow_jinja2(void **state)
{
    (void)state;
    expect("{{ u is defined }}{{ u is undefined }}{{ n is none }}{{ s is string }}{{ d is mapping }}{{ xs is sequence }}"
           "{{ s is iterable }}{{ f is number }}{{ true is integer }}{{ false is false }}{{ 0 is false }}", VARS,
           "FalseTrueTrueTrueTrueTrueTrueTrueFalseTrueFalse");
    expect("{{ u is sequence }}{{ u is iterable }}{{ d is sequence }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 2 is in xs }}", VARS,
           "TrueTrueTrueTrueTrueTrue");
}

static void test_loops_expose_loop_and_honour_filters_else_break_continue(void **state)
{
    (void)state;
    expect("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
           "{{ loop.previtem is defined }}{{ loop.nextitem }};{% endfor %}", VARS,
           "10TrueFalse3False2;21FalseFalse3True3;32FalseTrue3True;");
    expect("{% for x in xs if x != 2 %}{{ x }}/{{ loop.length }} {% else %}none{% endfor %}{% for x in [] %}{% else %}empty{% endfor %}"
           "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}", VARS,
           "1/2 3/2 empty1");
    expect("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}{{ d.get('zz', 'dflt') }}{{ xs|join('+') }}{{ u|default('D') }}"
           "{{ xs|first }}{{ xs|last }}{{ 'a' ~ 1 ~ none }}", VARS,
           "b=1;a=[1, 2.5, None, True];é=ü\n;dflt1+2+3D13a1None");
}

static void test_namespace_carries_state_out_of_loops_and_set_does_not(void **state)
{
    (void)state;
    expect("{% set ns = namespace(total=0) %}{% set plain = 0 %}{% for x in xs %}{% set ns.total = ns.total + x %}"
           "{% set plain = plain + x %}{% endfor %}{{ ns.total }}/{{ plain }}", VARS, "6/0");
}

static void test_macros_bind_defaults_keywords_and_see_their_definition_scope(void **state)
{
    (void)state;
    expect("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} "
           "{{ greet(punct='.', name='C') }}|{{ greet()|trim }}", NULL, "Hi A! Hi B? Hi C.|Hi !");
    expect("{% macro f() %}{{ y }}{{ x }}{% endmacro %}{% set y = 3 %}{% for x in [1] %}{{ f() }}{% endfor %}", NULL, "3");
    expect_err("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}", NULL, TD_EINVAL, "macro 'f' takes not more than 1 argument(s)");
}

static void test_operators_have_python_semantics(void **state)
{
    (void)state;
    expect("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 8 }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ 1 == 1.0 }} {{ 'b' in 'abc' }} "
           "{{ 3 not in xs }} {{ 1 < 2 < 2 }}", VARS, "3 -4 2 256 abab [1, 2] True True False False");
    expect_err("{{ 'a' + 1 }}", NULL, TD_EINVAL, "can only concatenate str (not \"int\") to str");
    expect_err("{{ 1 + 'a' }}", NULL, TD_EINVAL, "unsupported operand type(s) for +: 'int' and 'str'");
    expect_err("{{ 1 // 0 }}", NULL, TD_EINVAL, "integer division or modulo by zero");
}

static void test_whitespace_control_matches_trim_and_lstrip_blocks(void **state)
{
    (void)state;
    expect("<ul>\n  {% for x in xs %}\n    <li>{{ x }}</li>\n  {% endfor %}\n</ul>", "{\"xs\":[1,2]}",
           "<ul>\n    <li>1</li>\n    <li>2</li>\n</ul>");
    expect("a {%- if true %} b {% endif -%} c\n  {%+ if true %}kept{% endif %}\n{# note #}\nd", NULL, "a b c\n  keptd");
    expect("{% raw %}{{ x }}{% endraw %}|{{ '\\u00e9\\x41\\101' }}|{{ \"a\" 'b' }}\n", NULL, "{{ x }}|éAA|ab");
    expect("x\r\n  {% if true %}\r\ny\r\n  {% endif %}\r\n", NULL, "x\ny\n"); /* \r\n reads as \n */
}

static void test_errors_carry_jinja2_messages(void **state)
{
    (void)state;
    expect_err("{{ raise_exception('No user query found in messages.') }}", NULL, TD_EINVAL,
               "No user query found in messages.");
    expect_err("{{ m.content + 'x' }}", "{\"m\":{\"role\":\"user\"}}", TD_EINVAL, "'dict object' has no attribute 'content'");
    expect_err("{{ xs[7].role }}", VARS, TD_EINVAL, "list object has no element 7");
    expect_err("{{ nope.x }}", NULL, TD_EINVAL, "'nope' is undefined");
    expect_err("{% for k, v in s|items %}{% endfor %}", VARS, TD_EINVAL, "Can only get item pairs from a mapping.");
    expect_err("{{ xs.append(4) }}", VARS, TD_EINVAL, "access to attribute 'append' of 'list' object is unsafe.");
    expect_err("{% set x = 1 %}{% set x.y = 2 %}", NULL, TD_EINVAL, "cannot assign attribute on non-namespace object");
}

static void expect_compile_err(const char *tmpl, td_err code, const char *msg)
{
    jinja_tmpl *t = (jinja_tmpl *)1;
    td_err e = jinja_compile(&t, tmpl, strlen(tmpl));
    assert_null(t);
    if (e != code || strcmp(err_msg(), msg) != 0)
        fail_msg("template %s\nwant %s \"%s\"\ngot  %s \"%s\"", tmpl, err_name(code), msg, err_name(e), err_msg());
}

static void test_compile_errors_name_the_line_and_what_was_expected(void **state)
{
    (void)state;
    expect_compile_err("a\n{% if x %}\nb", TD_EFORMAT, "template line 3: unexpected end of template, expected 'elif' to close the 'if' block");
    expect_compile_err("{{ x", TD_EFORMAT, "template line 1: unexpected end of template inside the tag opened on line 1, expected '}}'");
    expect_compile_err("\n\n{{ x + }}", TD_EFORMAT, "template line 3: unexpected end of print statement");
    expect_compile_err("{% for x in xs %}{% endif %}", TD_EFORMAT,
                       "template line 1: unexpected 'endif', expected 'endfor' to close the 'for' block");
    expect_compile_err("{% endfor %}", TD_EFORMAT, "template line 1: unexpected 'endfor' with no block to close");
    expect_compile_err("{% frobnicate %}", TD_EFORMAT, "template line 1: unknown tag 'frobnicate'");
    expect_compile_err("{% extends 'base' %}", TD_ENOTSUP, "template line 1: the 'extends' tag is not supported");
    expect_compile_err("{{ x|nosuchfilter }}", TD_ENOTSUP, "template line 1: no filter named 'nosuchfilter'");
    expect_compile_err("{{ x is nosuchtest }}", TD_ENOTSUP, "template line 1: no test named 'nosuchtest'");
    expect_compile_err("{% for x in xs recursive %}{% endfor %}", TD_ENOTSUP, "template line 1: recursive for loops are not supported");
    expect_compile_err("{{ 'abc }}", TD_EFORMAT, "template line 1: unterminated string");
    expect_compile_err("{# open", TD_EFORMAT, "template line 1: missing end of comment tag");
    expect_compile_err("{{ (1 ] }}", TD_EFORMAT, "template line 1: unexpected ']', expected ')'");
    expect_compile_err("{% break %}", TD_EFORMAT, "template line 1: 'break' outside of a for loop");
    expect_compile_err("ok \xff", TD_EFORMAT, "template: invalid UTF-8 at byte 3");
    expect_compile_err("{{ 99999999999999999999 }}", TD_ENOTSUP, "template line 1: integer literal too large");
}

/* Builds "{{ " + n x open + "1" + n x close + " }}". */
static char *nested(size_t n, const char *open, const char *close, const char *mid)
{
    size_t lo = strlen(open), lc = strlen(close), lm = strlen(mid);
    char *s = malloc(n * (lo + lc) + lm + 1);
    char *p = s;
    for (size_t i = 0; i < n; i++, p += lo)
        memcpy(p, open, lo);
    memcpy(p, mid, lm);
    p += lm;
    for (size_t i = 0; i < n; i++, p += lc)
        memcpy(p, close, lc);
    *p = '\0';
    return s;
}

static void test_hostile_templates_stop_at_a_limit(void **state)
{
    (void)state;
    jinja_limits lim;
    jinja_limits_default(&lim);
    lim.max_steps = 2000000;
    lim.max_memory = (size_t)64 << 20;
    lim.max_output = (size_t)1 << 20;
    char *out = NULL;
    jinja_tmpl *t;
    clock_t t0 = clock();

    /* 100000 x 100000 iterations */
    assert_int_equal(render_lim("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL, &lim, &out),
                     TD_ERANGE);
    /* unbounded recursion, and exponential recursion */
    assert_int_equal(render_lim("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL, &lim, &out), TD_ERANGE);
    assert_int_equal(render_lim("{% macro f(n) %}{{ f(n + 1) }}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &lim, &out), TD_ERANGE);
    /* a string doubling 100 times, and a huge repeat */
    assert_int_equal(render_lim("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                                NULL, &lim, &out), TD_ERANGE);
    assert_int_equal(render_lim("{{ 'x' * 10000000000 }}", NULL, &lim, &out), TD_ERANGE);
    /* output past max_output */
    assert_int_equal(render_lim("{% for i in range(1000) %}{{ 'y' * 10000 }}{% endfor %}", NULL, &lim, &out), TD_ERANGE);
    assert_string_equal(err_msg(), "template output exceeds 1048576 bytes");
    /* a list nested 100000 deep, then printed */
    assert_int_equal(render_lim("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}",
                                NULL, &lim, &out), TD_ERANGE);
    assert_int_equal(render_lim("{{ range(100001)|length }}", NULL, &lim, &out), TD_ERANGE);
    assert_string_equal(err_msg(), "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    assert_null(out);

    /* 100000 nested parentheses, ifs and list brackets: a compile error, not a stack overflow */
    char *deep = nested(100000, "(", ")", "1");
    char *tmpl = malloc(strlen(deep) + 8);
    sprintf(tmpl, "{{ %s }}", deep);
    assert_int_equal(jinja_compile(&t, tmpl, strlen(tmpl)), TD_ERANGE);
    free(deep);
    free(tmpl);
    deep = nested(100000, "{% if 1 %}", "{% endif %}", "x");
    assert_int_equal(jinja_compile(&t, deep, strlen(deep)), TD_ERANGE);
    free(deep);
    deep = nested(100000, "[", "]", "");
    tmpl = malloc(strlen(deep) + 8);
    sprintf(tmpl, "{{ %s }}", deep);
    assert_int_equal(jinja_compile(&t, tmpl, strlen(tmpl)), TD_ERANGE);
    free(deep);
    free(tmpl);
    /* input nested deeper than max_depth */
    deep = nested(1000, "[", "]", ""); /* jansson itself stops at 2048 */
    json_error_t je;
    json_t *v = json_pack("{s:o}", "x", json_loads(deep, 0, &je));
    assert_non_null(v);
    free(deep);
    assert_int_equal(jinja_compile(&t, "{{ x }}", 7), TD_OK);
    assert_int_equal(jinja_render(t, v, &lim, &out, NULL, NULL), TD_ERANGE);
    jinja_free(t);
    json_decref(v);

    /* all of the above within seconds */
    assert_true((double)(clock() - t0) / CLOCKS_PER_SEC < 30.0);
}

/* ---- chat_render ---------------------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

static void test_real_templates_render_transformers_golden_prompts(void **state)
{
    (void)state;
    static const char *const templates[] = {"Qwen-Qwen3-0.6B", "Qwen3-Coder", "Qwen3.5-4B"};
    size_t len;
    char *cases_text = read_file(CHAT_DATA "cases.json", &len);
    if (!cases_text)
        fail_msg("cannot open " CHAT_DATA "cases.json (tests run from the repository root)");
    json_t *cases = json_of(cases_text);
    free(cases_text);
    int compared = 0, rendered = 0;
    for (size_t ti = 0; ti < sizeof templates / sizeof templates[0]; ti++) {
        char path[256];
        snprintf(path, sizeof path, CHAT_DATA "%s.jinja", templates[ti]);
        char *text = read_file(path, &len);
        assert_non_null(text);
        chat_template *ct;
        assert_int_equal(chat_template_init(&ct, text, len), TD_OK);
        const char *name;
        json_t *c;
        json_object_foreach(cases, name, c) {
            json_t *think = json_object_get(c, "enable_thinking"), *agp = json_object_get(c, "add_generation_prompt");
            chat_opts o = {
                .tools = json_object_get(c, "tools"),
                .add_generation_prompt = agp ? json_is_true(agp) : true,
                .enable_thinking = !think ? CHAT_THINK_UNSET : json_is_true(think) ? CHAT_THINK_ON : CHAT_THINK_OFF,
                .kwargs = json_object_get(c, "kwargs"),
                .eos_token = "<|im_end|>",
            };
            char *out;
            size_t out_len;
            td_err e = chat_template_render(ct, json_object_get(c, "messages"), &o, &out, &out_len);
            snprintf(path, sizeof path, CHAT_DATA "golden/%s.%s.txt", templates[ti], name);
            size_t want_len;
            char *want = read_file(path, &want_len);
            if (want) {
                if (e != TD_OK)
                    fail_msg("%s / %s: %s", templates[ti], name, err_msg());
                if (out_len != want_len || memcmp(out, want, want_len) != 0)
                    fail_msg("%s / %s differs from %s:\n[%s]", templates[ti], name, path, out);
                rendered++;
                free(out);
            } else {
                snprintf(path, sizeof path, CHAT_DATA "golden/%s.%s.err", templates[ti], name);
                want = read_file(path, &want_len);
                if (!want)
                    fail_msg("no golden file for %s / %s", templates[ti], name);
                if (e == TD_OK)
                    fail_msg("%s / %s rendered, transformers failed with: %s", templates[ti], name, want);
                assert_string_equal(err_msg(), want);
            }
            free(want);
            compared++;
        }
        chat_template_free(ct);
        free(text);
    }
    json_decref(cases);
    assert_int_equal(compared, 33);
    assert_true(rendered >= 28);
}

static void test_chat_render_passes_transformers_variables(void **state)
{
    (void)state;
    const char *tmpl =
        "{% for m in messages %}{{ m|tojson }};{% endfor %}|{{ tools }}|{{ documents }}|{{ add_generation_prompt }}|"
        "{{ bos_token }}|{{ eos_token }}|{{ enable_thinking is defined }}{{ enable_thinking }}|{{ extra }}";
    json_t *msgs = json_of("[{\"role\":\"user\",\"content\":\"q\",\"name\":null},"
                           "{\"role\":\"assistant\",\"content\":\"a\",\"reasoning\":\"r\",\"thinking\":null}]");
    json_t *kw = json_of("{\"extra\":[1],\"eos_token\":\"<eos2>\"}");
    chat_opts o = {.add_generation_prompt = true, .eos_token = "<eos>", .bos_token = "<s>", .kwargs = kw};
    char *out;
    size_t n;
    assert_int_equal(chat_render(tmpl, strlen(tmpl), msgs, &o, &out, &n), TD_OK);
    assert_string_equal(out, "{\"role\": \"user\", \"content\": \"q\"};"
                             "{\"thinking\": \"r\", \"role\": \"assistant\", \"content\": \"a\", \"reasoning\": \"r\", "
                             "\"reasoning_content\": \"r\"};|None|None|True|<s>|<eos2>|False|[1]");
    free(out);
    o.enable_thinking = CHAT_THINK_OFF;
    o.kwargs = NULL;
    o.add_generation_prompt = false;
    assert_int_equal(chat_render(tmpl, strlen(tmpl), msgs, &o, &out, &n), TD_OK);
    assert_non_null(strstr(out, "|False|<s>|<eos>|TrueFalse|"));
    free(out);
    json_t *empty = json_array();
    assert_int_equal(chat_render(tmpl, strlen(tmpl), empty, &o, &out, &n), TD_EINVAL);
    assert_string_equal(err_msg(), "Cannot apply chat template to an empty conversation. Provide at least one message.");
    json_t *bad = json_of("{\"messages\":[]}");
    o.kwargs = bad;
    assert_int_equal(chat_render(tmpl, strlen(tmpl), msgs, &o, &out, &n), TD_EINVAL);
    assert_string_equal(err_msg(), "template keyword variable 'messages' is set by the chat itself");
    json_decref(bad);
    json_t *tools = json_of("[{\"type\":\"function\"}, \"not a schema\"]");
    o.kwargs = NULL;
    o.tools = tools;
    assert_int_equal(chat_render(tmpl, strlen(tmpl), msgs, &o, &out, &n), TD_EINVAL);
    assert_string_equal(err_msg(), "tool 1: tools should be JSON schemas (objects)");
    json_decref(tools);
    json_decref(empty);
    json_decref(kw);
    json_decref(msgs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tojson_is_json_dumps_with_transformers_arguments),
        cmocka_unit_test(test_values_print_as_python_str_and_repr),
        cmocka_unit_test(test_float_repr_is_pythons),
        cmocka_unit_test(test_strings_slice_and_measure_by_code_point),
        cmocka_unit_test(test_tests_follow_jinja2),
        cmocka_unit_test(test_loops_expose_loop_and_honour_filters_else_break_continue),
        cmocka_unit_test(test_namespace_carries_state_out_of_loops_and_set_does_not),
        cmocka_unit_test(test_macros_bind_defaults_keywords_and_see_their_definition_scope),
        cmocka_unit_test(test_operators_have_python_semantics),
        cmocka_unit_test(test_whitespace_control_matches_trim_and_lstrip_blocks),
        cmocka_unit_test(test_errors_carry_jinja2_messages),
        cmocka_unit_test(test_compile_errors_name_the_line_and_what_was_expected),
        cmocka_unit_test(test_hostile_templates_stop_at_a_limit),
        cmocka_unit_test(test_real_templates_render_transformers_golden_prompts),
        cmocka_unit_test(test_chat_render_passes_transformers_variables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
