/* Tool calls and reasoning in model output: the Qwen3 JSON form and the Qwen3.5 / Qwen3-Coder
 * XML form of <tool_call> blocks become exact OpenAI arguments JSON; <think> blocks split off as
 * reasoning whether the prompt or the output opened them; both splits work on text that
 * arrives in arbitrary pieces and give the same result as on the whole text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/reasoning.h"
#include "gateway/toolcall.h"

/* --- tool_parse ------------------------------------------------------------------------------ */

static void json_form_keeps_the_model_arguments_text(void **state)
{
    (void)state;
    const char *body = "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
                       "\"days\": 0.1, \"tags\": [\"a\", {\"b\": \"}\"}]}}\n";
    tool_call c;
    assert_int_equal(tool_parse(body, strlen(body), NULL, &c), TD_OK);
    assert_string_equal(c.name, "get_weather");
    assert_string_equal(c.arguments,
                        "{\"city\": \"Paris\", \"days\": 0.1, \"tags\": [\"a\", {\"b\": \"}\"}]}");
    tool_call_free(&c);
}

static void json_form_with_string_arguments_or_none(void **state)
{
    (void)state;
    const char *body = "{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}";
    tool_call c;
    assert_int_equal(tool_parse(body, strlen(body), NULL, &c), TD_OK);
    assert_string_equal(c.arguments, "{\"x\": 1}");
    tool_call_free(&c);
    const char *bare = "{\"name\": \"now\"}";
    assert_int_equal(tool_parse(bare, strlen(bare), NULL, &c), TD_OK);
    assert_string_equal(c.name, "now");
    assert_string_equal(c.arguments, "{}");
    tool_call_free(&c);
    /* arguments null or an empty string: none, "{}" (a call never has empty arguments) */
    const char *empty[] = {"{\"name\": \"now\", \"arguments\": \"\"}",
                           "{\"name\": \"now\", \"arguments\": null}"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tool_parse(empty[i], strlen(empty[i]), NULL, &c), TD_OK);
        assert_string_equal(c.arguments, "{}");
        tool_call_free(&c);
    }
}

static void json_form_without_a_name_is_refused(void **state)
{
    (void)state;
    tool_call c;
    const char *bad[] = {"{\"arguments\": {}}", "{\"name\": 3}", "{\"name\": \"f\"", "[1]",
                         "call f()"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(tool_parse(bad[i], strlen(bad[i]), NULL, &c), TD_EFORMAT);
}

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"book\", \"parameters\": {"
    "\"type\": \"object\", \"properties\": {"
    "\"city\": {\"type\": \"string\"}, \"nights\": {\"type\": \"integer\"},"
    "\"price\": {\"type\": \"number\"}, \"pets\": {\"type\": \"boolean\"},"
    "\"rooms\": {\"type\": \"array\"}, \"extra\": {\"type\": \"object\"},"
    "\"code\": {\"type\": [\"string\", \"null\"]}}}}}]";

static void xml_form_values_take_the_schema_types(void **state)
{
    (void)state;
    json_t *tools = json_loads(TOOLS, 0, NULL);
    assert_non_null(tools);
    const char *body = "\n<function=book>\n"
                       "<parameter=city>\nNew \"York\"\n</parameter>\n"
                       "<parameter=nights>\n3\n</parameter>\n"
                       "<parameter=price>\n99.5\n</parameter>\n"
                       "<parameter=pets>\nTrue\n</parameter>\n"
                       "<parameter=rooms>\n[1, 2]\n</parameter>\n"
                       "<parameter=extra>\n{\"view\": \"sea\"}\n</parameter>\n"
                       "<parameter=code>\n007\n</parameter>\n"
                       "<parameter=note>\nline1\nline2\n</parameter>\n"
                       "<parameter=count>\n12\n</parameter>\n"
                       "</function>\n";
    tool_call c;
    assert_int_equal(tool_parse(body, strlen(body), tools, &c), TD_OK);
    assert_string_equal(c.name, "book");
    /* Unknown parameters: JSON when it parses (12), a string otherwise. */
    assert_string_equal(c.arguments,
                        "{\"city\": \"New \\\"York\\\"\", \"nights\": 3, \"price\": 99.5, "
                        "\"pets\": true, \"rooms\": [1, 2], \"extra\": {\"view\": \"sea\"}, "
                        "\"code\": \"007\", \"note\": \"line1\\nline2\", \"count\": 12}");
    tool_call_free(&c);
    json_decref(tools);
}

static void xml_form_value_that_does_not_fit_its_type_stays_a_string(void **state)
{
    (void)state;
    json_t *tools = json_loads(TOOLS, 0, NULL);
    const char *body = "<function=book>\n<parameter=nights>\nthree\n</parameter>\n"
                       "<parameter=pets>\nmaybe\n</parameter>\n<parameter=rooms>\nnull\n"
                       "</parameter>\n<parameter=code>\nnull\n</parameter>\n<parameter=pets>"
                       "\nnull\n</parameter>\n</function>";
    tool_call c;
    assert_int_equal(tool_parse(body, strlen(body), tools, &c), TD_OK);
    /* null is null for a type other than string */
    assert_string_equal(c.arguments, "{\"nights\": \"three\", \"pets\": \"maybe\", "
                                     "\"rooms\": null, \"code\": \"null\", \"pets\": null}");
    tool_call_free(&c);
    json_decref(tools);
}

static void xml_form_without_closing_tags_ends_values_at_the_next_tag(void **state)
{
    (void)state;
    const char *body = "<function=f>\n<parameter=a>\nx\n<parameter=b>\ny\n</function>";
    tool_call c;
    assert_int_equal(tool_parse(body, strlen(body), NULL, &c), TD_OK);
    assert_string_equal(c.arguments, "{\"a\": \"x\", \"b\": \"y\"}");
    tool_call_free(&c);
}

static void xml_form_escapes_control_characters_as_python_does(void **state)
{
    (void)state;
    const char *body = "<function=f><parameter=s>tab\there\x01\\</parameter></function>";
    tool_call c;
    assert_int_equal(tool_parse(body, strlen(body), NULL, &c), TD_OK);
    assert_string_equal(c.arguments, "{\"s\": \"tab\\there\\u0001\\\\\"}");
    tool_call_free(&c);
}

/* --- tool_split ------------------------------------------------------------------------------ */

typedef struct sink {
    char log[1 << 17]; /* "C(text)" for content, "T(name|args)" for calls; with stream_args
                     * "O(name)" for a begun call, "A(text)" for its arguments, and a call's
                     * "T(name|args|streamed)" */
    size_t n;
    bool streaming;
} sink;

static td_err sink_tool(void *ctx, tool_emit_kind kind, const char *text, size_t len,
                        const tool_call *call)
{
    sink *s = ctx;
    char *at = s->log + s->n;
    const size_t cap = sizeof s->log - s->n;
    switch (kind) {
    case TOOL_EMIT_CALL:
        if (s->streaming)
            s->n += (size_t)snprintf(at, cap, "T(%s|%s|%zu)", call->name, call->arguments,
                                     call->streamed);
        else
            s->n += (size_t)snprintf(at, cap, "T(%s|%s)", call->name, call->arguments);
        break;
    case TOOL_EMIT_OPEN: s->n += (size_t)snprintf(at, cap, "O(%s)", call->name); break;
    case TOOL_EMIT_ARGS: s->n += (size_t)snprintf(at, cap, "A(%.*s)", (int)len, text); break;
    case TOOL_EMIT_TEXT: s->n += (size_t)snprintf(at, cap, "C(%.*s)", (int)len, text); break;
    }
    assert_true(s->n < sizeof s->log);
    return TD_OK;
}

/* Runs text through a tool split in pieces of `step` bytes (0: one piece), with closed_only
 * when matched. */
static void split_tools_as(const char *text, size_t step, bool matched, sink *s)
{
    memset(s, 0, sizeof *s);
    tool_split t;
    tool_split_init(&t, NULL, sink_tool, s);
    t.closed_only = matched;
    size_t n = strlen(text);
    if (step == 0)
        step = n;
    for (size_t i = 0; i < n; i += step)
        assert_int_equal(tool_split_push(&t, text + i, i + step <= n ? step : n - i), TD_OK);
    assert_int_equal(tool_split_flush(&t), TD_OK);
    tool_split_free(&t);
}

static void split_tools(const char *text, size_t step, sink *s)
{
    split_tools_as(text, step, false, s);
}

static void tool_split_content_then_two_calls(void **state)
{
    (void)state;
    const char *text = "Let me check.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n"
                       "</tool_call>\n<tool_call>\n<function=b>\n<parameter=x>\n1\n</parameter>\n"
                       "</function>\n</tool_call>\n";
    sink whole;
    split_tools(text, 0, &whole);
    assert_string_equal(whole.log, "C(Let me check.)T(a|{})T(b|{\"x\": 1})");
    /* Byte by byte the pieces differ in size, never in what they say: a space waits until
     * the next character shows it is not the whitespace before a block. */
    sink bytes;
    split_tools(text, 1, &bytes);
    assert_string_equal(bytes.log,
                        "C(L)C(e)C(t)C( m)C(e)C( c)C(h)C(e)C(c)C(k)C(.)T(a|{})"
                        "T(b|{\"x\": 1})");
}

static void tool_split_without_calls_passes_text_and_its_whitespace(void **state)
{
    (void)state;
    sink s;
    split_tools("a <tool b\n", 0, &s);
    assert_string_equal(s.log, "C(a <tool b)C(\n)");
    split_tools("x <tool_c", 3, &s);
    assert_string_equal(s.log, "C(x)C( <tool_c)");
}

static void tool_split_bad_block_comes_back_as_text(void **state)
{
    (void)state;
    sink s;
    split_tools("<tool_call>not a call</tool_call> after", 0, &s);
    assert_string_equal(s.log, "C(<tool_call>)C(not a call)C(</tool_call>)C(after)");
}

static void tool_split_unterminated_block_is_parsed_at_the_end(void **state)
{
    (void)state;
    sink s;
    split_tools("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"k\": true}}\n", 4, &s);
    assert_string_equal(s.log, "T(f|{\"k\": true})");
    /* calls matched as generated: one the output ends inside was cut off, and is text */
    split_tools_as("<tool_call>\n<function=f>\n<parameter=k>\nPar</tool_call>\n<tool_call>\n"
                   "<function=g>\n<parameter=k>\nPar",
                   5, true, &s);
    assert_string_equal(s.log, "T(f|{\"k\": \"Par\"})C(<tool_call>)"
                               "C(\n<function=g>\n<parameter=k>\nPar)");
}

/* --- reasoning ------------------------------------------------------------------------------- */

static td_err sink_think(void *ctx, bool reasoning, const char *text, size_t len)
{
    sink *s = ctx;
    s->n += (size_t)snprintf(s->log + s->n, sizeof s->log - s->n, "%c(%.*s)",
                             reasoning ? 'R' : 'C', (int)len, text);
    return TD_OK;
}

static void split_think(const char *text, bool in_think, size_t step, sink *s)
{
    memset(s, 0, sizeof *s);
    think_split t;
    think_init(&t, in_think, sink_think, s);
    size_t n = strlen(text);
    if (step == 0)
        step = n;
    for (size_t i = 0; i < n; i += step)
        assert_int_equal(think_push(&t, text + i, i + step <= n ? step : n - i), TD_OK);
    assert_int_equal(think_flush(&t), TD_OK);
    think_free(&t);
}

static void reasoning_opened_by_the_output(void **state)
{
    (void)state;
    sink s;
    split_think("<think>\nstep 1\nstep 2\n</think>\n\nThe answer.", false, 0, &s);
    assert_string_equal(s.log, "R(step 1\nstep 2)C(The answer.)");
    split_think("<think>\nstep 1\nstep 2\n</think>\n\nThe answer.", false, 5, &s);
    /* Pieces "<thin" "k>\nst" "ep 1\n" "step " "2\n</t" "hink>" "\n\nThe" " answ" "er.". */
    assert_string_equal(s.log, "R(st)R(ep 1)R(\nstep )R(2)C(The)C( answ)C(er.)");
}

static void reasoning_opened_by_the_prompt(void **state)
{
    (void)state;
    sink s;
    split_think("Let me think.\n</think>\n\nYes.", true, 0, &s);
    assert_string_equal(s.log, "R(Let me think.)C(Yes.)");
    split_think("\n\nhmm\n\n\nok", true, 1, &s);
    assert_string_equal(s.log, "R(h)R(m)R(m)R(\n\n\no)R(k)");
}

static void reasoning_cut_by_the_length_limit_stays_reasoning(void **state)
{
    (void)state;
    sink s;
    split_think("<think>\nstill thinking\n</thi", false, 0, &s);
    assert_string_equal(s.log, "R(still thinking)R(\n</thi)");
}

static void output_without_think_is_all_content(void **state)
{
    (void)state;
    sink s;
    split_think("  <thin", false, 0, &s);
    assert_string_equal(s.log, "C(  <thin)");
    split_think("Hello <think> is a tag", false, 3, &s);
    assert_string_equal(s.log, "C(Hel)C(lo )C(<th)C(ink)C(> i)C(s a)C( ta)C(g)");
    split_think("\n<think>x</think>y", false, 1, &s);
    assert_string_equal(s.log, "R(x)C(y)");
}

static void prompt_open_think_detection(void **state)
{
    (void)state;
    const char *open = "<|im_start|>assistant\n<think>\n";
    const char *closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    const char *history = "<think>\nold\n</think>\n<|im_start|>assistant\n";
    assert_true(think_prompt_open(open, strlen(open)));
    assert_false(think_prompt_open(closed, strlen(closed)));
    assert_false(think_prompt_open(history, strlen(history)));
    assert_false(think_prompt_open("", 0));
    const char *user = "<|im_start|>user\nWhat does <think> do?<|im_end|>\n<|im_start|>assistant\n";
    assert_false(think_prompt_open(user, strlen(user)));
    assert_true(think_prompt_open("x<think>", 8)); /* no ChatML turns: the whole prompt */
}

/* Runs pieces (NULL-ended) through a tool split with the TOOLS schemas and stream_args. */
static void stream_pieces(const char *const *pieces, sink *s)
{
    memset(s, 0, sizeof *s);
    s->streaming = true;
    json_t *tools = json_loads(TOOLS, 0, NULL);
    tool_split t;
    tool_split_init(&t, tools, sink_tool, s);
    t.stream_args = true;
    for (size_t i = 0; pieces[i]; i++)
        assert_int_equal(tool_split_push(&t, pieces[i], strlen(pieces[i])), TD_OK);
    assert_int_equal(tool_split_flush(&t), TD_OK);
    tool_split_free(&t);
    json_decref(tools);
}

/* stream_args: a call begins once its name is complete; a string parameter streams as it is
 * written, another type when it is finished; the whole call says how much came before. */
static void xml_calls_stream_their_arguments(void **state)
{
    (void)state;
    sink s;
    const char *const pieces[] = {"Sure.\n<tool_call>\n<function=bo", "ok>\n<parameter=city>\nPa",
                                  "ris", " \n", "</param", "eter>\n<parameter=nights>\n3",
                                  "\n</parameter>\n</function>\n</tool_call>", NULL};
    stream_pieces(pieces, &s);
    assert_string_equal(s.log, "C(Sure.)O(book)A({\"city\": \"Pa)A(ris)A( \", \"nights\": )"
                               "T(book|{\"city\": \"Paris \", \"nights\": 3}|29)");
    /* a character split across pieces waits for its last byte; an escape comes whole */
    const char *const utf8[] = {"<tool_call><function=book><parameter=city>\n\xc3", "\xa9\"",
                                "\n</parameter></function></tool_call>", NULL};
    stream_pieces(utf8, &s);
    assert_string_equal(s.log, "O(book)A({\"city\": \")A(\xc3\xa9\\\")T(book|{\"city\": "
                               "\"\xc3\xa9\\\"\"}|14)");
    /* the JSON form: the arguments object's own text as it comes, to its closing brace */
    const char *const json[] = {"<tool_call>\n{\"name\": \"book\", ", "\"arguments\": {\"ci",
                                "ty\": \"Rome\"}", "}\n</tool_call>", NULL};
    stream_pieces(json, &s);
    assert_string_equal(s.log, "O(book)A({\"ci)A(ty\": \"Rome\"})T(book|{\"city\": \"Rome\"}|16)");
    /* ... unless the keys come in another order: then whole */
    const char *const late[] = {"<tool_call>{\"arguments\": {\"a\": 1}, ", "\"name\": \"book\"}",
                                "</tool_call>", NULL};
    stream_pieces(late, &s);
    assert_string_equal(s.log, "T(book|{\"a\": 1}|0)");
    /* "arguments" twice, the last a string: the call cannot end what was sent, it is text */
    const char *const twice[] = {"<tool_call>{\"name\": \"book\", \"arguments\": {\"a\": 1}",
                                 ", \"arguments\": \"{}\"}</tool_call>", NULL};
    stream_pieces(twice, &s);
    assert_string_equal(s.log, "O(book)A({\"a\": 1})C(<tool_call>)C({\"name\": \"book\", "
                               "\"arguments\": {\"a\": 1}, \"arguments\": \"{}\"})C(</tool_call>)");
    /* a begun call whose block does not parse ends as its text */
    const char *const bad[] = {"<tool_call>\n<function=book>\n", "oops</tool_call>", NULL};
    stream_pieces(bad, &s);
    assert_string_equal(s.log, "O(book)A({)C(<tool_call>)C(\n<function=book>\noops)"
                               "C(</tool_call>)");
}

/* Whatever the pieces, the arguments streamed are the beginning of the call's, and the call is
 * the one the block gives whole. */
static void streamed_arguments_are_always_the_calls_beginning(void **state)
{
    (void)state;
    static const char *const texts[] = {
        "<tool_call>\n<function=book>\n<parameter=city>\nNew <York> \"x\"\\ \xe2\x82\xac\n"
        "</parameter>\n<parameter=nights>\n2\n</parameter>\n<parameter=extra>\n{\"a\": [1]}\n"
        "</parameter>\n<parameter=code>\nnull\n</parameter>\n</function>\n</tool_call>",
        /* a forgotten </parameter>: the value ends at the next tag */
        "<tool_call><function=book><parameter=city>\nRome\n<parameter=nights>\n4\n</parameter>"
        "</function></tool_call>",
        /* a later </parameter> takes the tag into the value */
        "<tool_call><function=book><parameter=city>\na<parameter=x>b\n</parameter>\n</function>"
        "</tool_call>",
        /* the output ends inside the block: trailing whitespace goes with the trim */
        "<tool_call>\n<function=book>\n<parameter=city>\nOslo  \n\n",
        "<tool_call>\n<function=book>\n<parameter=city>\n\n\nx\n\n</parameter>\n</function>"
        "</tool_call>",
        "<tool_call><function=other><parameter=q>\nabc\n</parameter></function></tool_call>",
        "<tool_call>\n{\"name\": \"book\", \"arguments\": {\"city\": \"a\\\"}{[\\u00e9\", "
        "\"rooms\": [1, {\"b\": []}], \"x\": null}}\n</tool_call>",
        "<tool_call>{\"name\":\"b\\u00e9\",\"parameters\":{\"q\":\"\xe2\x82\xac\"}} </tool_call>",
    };
    /* and a long value, most of it passed on the fast way (only its new end looked at) */
    static char long_text[8192];
    size_t at = (size_t)snprintf(long_text, sizeof long_text, "%s",
                                 "<tool_call>\n<function=book>\n<parameter=city>\n");
    for (int i = 0; i < 200; i++)
        at += (size_t)snprintf(long_text + at, sizeof long_text - at, "a<b \"q\"\\ \xc3\xa9\n%d ",
                               i);
    snprintf(long_text + at, sizeof long_text - at, "%s",
             "\n</parameter>\n<parameter=code>\nx\n</parameter>\n</function>\n</tool_call>");
    const char *all[sizeof texts / sizeof texts[0] + 1];
    memcpy(all, texts, sizeof texts);
    all[sizeof texts / sizeof texts[0]] = long_text;
    json_t *tools = json_loads(TOOLS, 0, NULL);
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        const char *text = all[k];
        const size_t n = strlen(text);
        sink whole;
        memset(&whole, 0, sizeof whole);
        tool_split t;
        tool_split_init(&t, tools, sink_tool, &whole);
        assert_int_equal(tool_split_push(&t, text, n), TD_OK);
        assert_int_equal(tool_split_flush(&t), TD_OK);
        tool_split_free(&t);
        for (size_t step = 1; step <= 7; step++) {
            sink s;
            memset(&s, 0, sizeof s);
            s.streaming = true;
            tool_split_init(&t, tools, sink_tool, &s);
            t.stream_args = true;
            for (size_t i = 0; i < n; i += step)
                assert_int_equal(tool_split_push(&t, text + i, i + step <= n ? step : n - i),
                                 TD_OK);
            assert_int_equal(tool_split_flush(&t), TD_OK);
            tool_split_free(&t);
            /* the A(...) pieces joined, and the call with its streamed count */
            static char args[16384], call[16384];
            args[0] = 0;
            size_t at = 0;
            for (const char *a = strstr(s.log, "A("); a; a = strstr(a + 2, ")A(")) {
                const char *b = a[0] == 'A' ? a + 2 : a + 3;
                const char *e = strstr(b, ")A(");
                const char *t2 = strstr(b, ")T(");
                if (!e || (t2 && t2 < e))
                    e = t2;
                assert_non_null(e);
                memcpy(args + at, b, (size_t)(e - b));
                at += (size_t)(e - b);
                args[at] = 0;
                a = e - 2;
            }
            const char *tc = strstr(s.log, "T(");
            assert_non_null(tc);
            const char *bar = strrchr(tc, '|');
            size_t streamed = strtoul(bar + 1, NULL, 10);
            snprintf(call, sizeof call, "%.*s)", (int)(bar - tc), tc);
            assert_string_equal(call, whole.log);
            assert_int_equal(streamed, at);
            const char *full = strchr(tc, '|') + 1;
            assert_memory_equal(full, args, at);
            if (step == 1)
                assert_true(at > 1); /* something streamed before the end */
        }
    }
    json_decref(tools);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_form_keeps_the_model_arguments_text),
        cmocka_unit_test(json_form_with_string_arguments_or_none),
        cmocka_unit_test(json_form_without_a_name_is_refused),
        cmocka_unit_test(xml_form_values_take_the_schema_types),
        cmocka_unit_test(xml_form_value_that_does_not_fit_its_type_stays_a_string),
        cmocka_unit_test(xml_form_without_closing_tags_ends_values_at_the_next_tag),
        cmocka_unit_test(xml_form_escapes_control_characters_as_python_does),
        cmocka_unit_test(tool_split_content_then_two_calls),
        cmocka_unit_test(tool_split_without_calls_passes_text_and_its_whitespace),
        cmocka_unit_test(tool_split_bad_block_comes_back_as_text),
        cmocka_unit_test(tool_split_unterminated_block_is_parsed_at_the_end),
        cmocka_unit_test(reasoning_opened_by_the_output),
        cmocka_unit_test(reasoning_opened_by_the_prompt),
        cmocka_unit_test(reasoning_cut_by_the_length_limit_stays_reasoning),
        cmocka_unit_test(output_without_think_is_all_content),
        cmocka_unit_test(prompt_open_think_detection),
        cmocka_unit_test(xml_calls_stream_their_arguments),
        cmocka_unit_test(streamed_arguments_are_always_the_calls_beginning),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
