/* Log probabilities in the gateway's responses: the exact JSON of chat and completions
 * logprobs for tokens of the tiny test model, shortest float formatting, -9999 for a zero
 * probability, bytes of partial characters and character offsets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/logprobs.h"
#include "gateway/render.h"

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

static void values_print_as_the_shortest_float(void **state)
{
    (void)state;
    json_t *a = json_pack("[f,f,f,f,f]", lp_value(-0.1f), lp_value(-1.0f / 3.0f),
                          lp_value(-INFINITY), lp_value(NAN), lp_value(-1e-7f));
    char *s = render_dump(a);
    assert_string_equal(s, "[-0.1,-0.33333334,-9999.0,-9999.0,-1e-7]");
    free(s);
    json_decref(a);
}

static void chat_logprobs_with_alternatives(void **state)
{
    (void)state;
    /* 493 = " pattern", 64 = "a", 127 = the lead byte C3 of "é" (a partial character). */
    lp_token t[2] = {
        {.id = 493, .logprob = -0.25f, .n_top = 2, .top = {{493, -0.25f}, {64, -2.5f}}},
        {.id = 127, .logprob = -INFINITY, .n_top = 0},
    };
    json_t *content = json_array();
    assert_int_equal(lp_append_chat(content, tok, t, 2), TD_OK);
    json_t *obj = lp_chat_object(content);
    char *s = render_dump(obj);
    assert_string_equal(s, "{\"content\":[{\"token\":\" pattern\",\"logprob\":-0.25,\"bytes\":"
                           "[32,112,97,116,116,101,114,110],\"top_logprobs\":[{\"token\":"
                           "\" pattern\",\"logprob\":-0.25,\"bytes\":[32,112,97,116,116,101,114,"
                           "110]},{\"token\":\"a\",\"logprob\":-2.5,\"bytes\":[97]}]},"
                           "{\"token\":\"\xef\xbf\xbd\",\"logprob\":-9999.0,\"bytes\":[195],"
                           "\"top_logprobs\":[]}],\"refusal\":null}");
    free(s);
    json_decref(obj);
}

static void special_token_shows_its_text(void **state)
{
    (void)state;
    lp_token t = {.id = 506, .logprob = -0.5f};
    json_t *content = json_array();
    assert_int_equal(lp_append_chat(content, tok, &t, 1), TD_OK);
    char *s = render_dump(content);
    assert_string_equal(s, "[{\"token\":\"<|im_end|>\",\"logprob\":-0.5,\"bytes\":[60,124,105,"
                           "109,95,101,110,100,124,62],\"top_logprobs\":[]}]");
    free(s);
    json_decref(content);
}

static void completion_logprobs_with_character_offsets(void **state)
{
    (void)state;
    json_t *obj = lp_completion_object();
    lp_token a[2] = {
        {.id = 493, .logprob = -1.5f, .n_top = 1, .top = {{493, -1.5f}}},
        {.id = 64, .logprob = -0.125f, .n_top = 2, .top = {{64, -0.125f}, {493, -3.0f}}},
    };
    size_t offset = 3; /* characters already sent */
    assert_int_equal(lp_append_completion(obj, tok, a, 2, &offset), TD_OK);
    /* A second step continues the offsets: " pattern" + "a" = 9 characters. */
    lp_token b = {.id = 64, .logprob = 0.0f};
    assert_int_equal(lp_append_completion(obj, tok, &b, 1, &offset), TD_OK);
    assert_int_equal(offset, 13);
    char *s = render_dump(obj);
    assert_string_equal(s, "{\"tokens\":[\" pattern\",\"a\",\"a\"],\"token_logprobs\":[-1.5,"
                           "-0.125,0.0],\"top_logprobs\":[{\" pattern\":-1.5},{\"a\":-0.125,"
                           "\" pattern\":-3.0},{}],\"text_offset\":[3,11,12]}");
    free(s);
    json_decref(obj);
}

/* An echoed prompt: its first token has no log probability (null, null alternatives), the
 * next ones do, and the offsets run on into the completion. */
static void echoed_prompt_opens_with_a_null_entry(void **state)
{
    (void)state;
    json_t *obj = lp_completion_object();
    lp_token p[2] = {
        {.id = 64, .none = true, .logprob = -7.0f, .n_top = 1, .top = {{64, -7.0f}}},
        {.id = 493, .logprob = -2.25f, .n_top = 1, .top = {{64, -0.5f}}},
    };
    size_t offset = 0;
    assert_int_equal(lp_append_completion(obj, tok, p, 2, &offset), TD_OK);
    assert_int_equal(offset, 9);
    char *s = render_dump(obj);
    assert_string_equal(s, "{\"tokens\":[\"a\",\" pattern\"],\"token_logprobs\":[null,-2.25],"
                           "\"top_logprobs\":[null,{\"a\":-0.5}],\"text_offset\":[0,1]}");
    free(s);
    json_decref(obj);
}

static void token_outside_the_vocabulary_is_an_error(void **state)
{
    (void)state;
    lp_token t = {.id = 512, .logprob = -1.0f};
    json_t *content = json_array();
    assert_int_not_equal(lp_append_chat(content, tok, &t, 1), TD_OK);
    json_decref(content);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(values_print_as_the_shortest_float),
        cmocka_unit_test(chat_logprobs_with_alternatives),
        cmocka_unit_test(special_token_shows_its_text),
        cmocka_unit_test(completion_logprobs_with_character_offsets),
        cmocka_unit_test(echoed_prompt_opens_with_a_null_entry),
        cmocka_unit_test(token_outside_the_vocabulary_is_an_error),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
