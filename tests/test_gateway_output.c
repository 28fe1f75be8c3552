/* The gateway's output pipeline on the tiny test model's tokenizer: token ids -> content,
 * reasoning and tool-call pieces, step by step as a stream sees them. Multi-byte characters
 * never split, special tokens show only when asked for, stop strings cut the text and say how many tokens
 * counted, and the same tokens give the same text however they are grouped into steps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer.h"
#include "gateway/output.h"

#define MODEL "tests/data/models/qwen35-tiny-f32.gguf"

static tokenizer *tok;

static int setup(void **state)
{
    (void)state;
    return tok_open(&tok, MODEL) == TD_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tok_free(tok);
    return 0;
}

static void encode(const char *text, tok_ids *ids)
{
    memset(ids, 0, sizeof *ids);
    assert_int_equal(tok_encode(tok, text, strlen(text), 0, ids), TD_OK);
}

/* Appends "C(..)", "R(..)" or "T(name|args#index)" for the pieces and clears them. */
static void take(gw_output *o, char *log, size_t cap)
{
    size_t n = strlen(log);
    for (size_t i = 0; i < o->n_pieces; i++) {
        const out_piece *p = &o->pieces[i];
        if (p->kind == OUT_TOOL_CALL)
            n += (size_t)snprintf(log + n, cap - n, "T(%s|%s#%u)", p->call.name,
                                  p->call.arguments, p->call_index);
        else
            n += (size_t)snprintf(log + n, cap - n, "%c(%.*s)", p->kind == OUT_CONTENT ? 'C' : 'R',
                                  (int)p->len, p->text);
    }
    output_clear(o);
}

static void multibyte_character_waits_for_its_last_token(void **state)
{
    (void)state;
    output_opts opts = {0};
    gw_output o;
    assert_int_equal(output_init(&o, tok, &opts), TD_OK);
    /* "é" is tokens 127 (C3) and 102 (A9); the emoji is four one-byte tokens. */
    const int32_t steps[][4] = {{127}, {102}, {172, 253}, {246}, {222}};
    const size_t lens[] = {1, 1, 2, 1, 1};
    char log[256] = "";
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(output_push(&o, steps[i], lens[i], NULL), TD_OK);
        size_t before = strlen(log);
        take(&o, log, sizeof log);
        snprintf(log + strlen(log), sizeof log - strlen(log), "%s|", strlen(log) == before ? "-" : "");
    }
    assert_int_equal(output_finish(&o), TD_OK);
    take(&o, log, sizeof log);
    assert_string_equal(log, "-|C(\xc3\xa9)|-|-|C(\xf0\x9f\x98\x80)|");
    output_free(&o);
}

static void special_tokens_print_nothing(void **state)
{
    (void)state;
    output_opts opts = {0};
    gw_output o;
    assert_int_equal(output_init(&o, tok, &opts), TD_OK);
    const int32_t ids[] = {505, 64, 506, 504}; /* <|im_start|> a <|im_end|> <|endoftext|> */
    assert_int_equal(output_push(&o, ids, 4, NULL), TD_OK);
    assert_int_equal(output_finish(&o), TD_OK);
    char log[64] = "";
    take(&o, log, sizeof log);
    assert_string_equal(log, "C(a)");
    output_free(&o);
    /* skip_special_tokens false: they print their text */
    opts.keep_special = true;
    assert_int_equal(output_init(&o, tok, &opts), TD_OK);
    assert_int_equal(output_push(&o, ids, 4, NULL), TD_OK);
    assert_int_equal(output_finish(&o), TD_OK);
    log[0] = '\0';
    take(&o, log, sizeof log);
    assert_string_equal(log, "C(<|im_start|>a<|im_end|><|endoftext|>)");
    output_free(&o);
}

static void stop_string_counts_tokens_up_to_its_end(void **state)
{
    (void)state;
    const char *stops[] = {"END"};
    const size_t lens[] = {3};
    output_opts opts = {.stops = stops, .stop_lens = lens, .n_stops = 1};
    gw_output o;
    assert_int_equal(output_init(&o, tok, &opts), TD_OK);
    tok_ids ids;
    encode("hello END world", &ids); /* hello = 3 tokens, " " + E N D ... */
    size_t used = 0;
    assert_int_equal(output_push(&o, ids.ids, ids.n, &used), TD_OK);
    assert_true(o.stopped);
    /* Every token up to the D of END counts; " world" does not. */
    tok_ids head;
    encode("hello END", &head);
    assert_int_equal(used, head.n);
    assert_int_equal(output_finish(&o), TD_OK);
    char log[64] = "";
    take(&o, log, sizeof log);
    assert_string_equal(log, "C(hello )");
    tok_ids_free(&ids);
    tok_ids_free(&head);
    output_free(&o);
}

/* Runs text's tokens through a pipeline in steps of `step` tokens; returns the joined log of
 * everything (pieces merged by kind in order). */
static void run_text(const char *text, const output_opts *opts, size_t step, char *log, size_t cap)
{
    gw_output o;
    assert_int_equal(output_init(&o, tok, opts), TD_OK);
    tok_ids ids;
    encode(text, &ids);
    log[0] = 0;
    for (size_t i = 0; i < ids.n; i += step) {
        assert_int_equal(output_push(&o, ids.ids + i, i + step <= ids.n ? step : ids.n - i, NULL),
                         TD_OK);
        take(&o, log, cap);
    }
    assert_int_equal(output_finish(&o), TD_OK);
    take(&o, log, cap);
    tok_ids_free(&ids);
    output_free(&o);
}

/* Joins consecutive pieces of a kind: "C(a)C(b)" -> "C(ab)". */
static void merge(const char *log, char *out)
{
    char last = 0;
    size_t n = 0;
    for (const char *p = log; *p;) {
        char kind = p[0];
        const char *end = strchr(p, ')'); /* pieces in these tests hold no ')' */
        if (kind == last && kind != 'T') {
            n--; /* drop the ')' */
            memcpy(out + n, p + 2, (size_t)(end - p - 2));
            n += (size_t)(end - p - 2);
        } else {
            memcpy(out + n, p, (size_t)(end - p));
            n += (size_t)(end - p);
        }
        out[n++] = ')';
        last = kind;
        p = end + 1;
    }
    out[n] = 0;
}

static void reasoning_content_and_tool_call_from_tokens(void **state)
{
    (void)state;
    json_t *tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                               "\"parameters\": {\"properties\": {\"x\": {\"type\": "
                               "\"string\"}}}}}]",
                               0, NULL);
    output_opts opts = {.reasoning = true, .in_think = true, .tools = tools};
    const char *text = "plan\n</think>\n\nok\n\n<tool_call>\n<function=f>\n<parameter=x>\n1\n"
                       "</parameter>\n</function>\n</tool_call>";
    const char *want = "R(plan)C(ok)T(f|{\"x\": \"1\"}#0)";
    for (size_t step = 1; step <= 16; step++) {
        char log[1024], merged[1024];
        run_text(text, &opts, step, log, sizeof log);
        merge(log, merged);
        assert_string_equal(merged, want);
    }
    json_decref(tools);
}

static void without_tools_a_tool_call_block_is_plain_content(void **state)
{
    (void)state;
    output_opts opts = {.reasoning = true};
    char log[512], merged[512];
    run_text("<tool_call>\n{\"name\": \"f\"}\n</tool_call>", &opts, 3, log, sizeof log);
    merge(log, merged);
    assert_string_equal(merged, "C(<tool_call>\n{\"name\": \"f\"}\n</tool_call>)");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(multibyte_character_waits_for_its_last_token),
        cmocka_unit_test(special_tokens_print_nothing),
        cmocka_unit_test(stop_string_counts_tokens_up_to_its_end),
        cmocka_unit_test(reasoning_content_and_tool_call_from_tokens),
        cmocka_unit_test(without_tools_a_tool_call_block_is_plain_content),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
