/* The gateway's OpenAI extras over real HTTP against a stand-in verifyd
 * (tests/support/gw_harness.h): n choices and best_of, batches of prompts, echo with the
 * prompt's log probabilities, predictions and their usage, continuous usage in streams, the
 * tool spec sent for a required call, and /tokenize of a chat's messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/gw_harness.h"

static const char HI[] = "[{\"role\":\"user\",\"content\":\"hi\"}]";

/* n choices run one after the other, each a generation of its own (seed + i when seeded):
 * whole, the choices with their indexes and the usage summed (the prompt once, cached tokens of
 * the first); streamed, each choice's chunks under its index with its own role and finish
 * chunks, then one usage chunk and one [DONE]. */
static void n_choices_are_generated_one_after_the_other(void **state)
{
    (void)state;
    fake_script s = {.step = 2, .cached = 1};
    gwh_encode("Paris.", &s); /* 4 tokens */
    fake_verifyd_script(gwh_fake, &s);
    const int starts = fake_verifyd_starts(gwh_fake);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":[39,68],\"max_tokens\":3,\"n\":3,\"seed\":11}"
                                 "", &reply,
                                 &body),
                     200);
    gwh_normalize(body);
    char expect[2048];
    snprintf(expect, sizeof expect,
             "{\"id\":\"cmpl-X\",\"object\":\"text_completion\",\"created\":0,\"model\":"
             "\"qwen35-tiny\",\"choices\":[{\"index\":0,\"text\":\"Paris\",\"logprobs\":null,"
             "\"finish_reason\":\"length\"},{\"index\":1,\"text\":\"Paris\",\"logprobs\":null,"
             "\"finish_reason\":\"length\"},{\"index\":2,\"text\":\"Paris\",\"logprobs\":null,"
             "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":"
             "9,\"total_tokens\":11,\"prompt_tokens_details\":{\"cached_tokens\":1},"
             "\"acceptance_length\":1.5}}");
    assert_string_equal(body, expect);
    free(reply);
    assert_int_equal(fake_verifyd_starts(gwh_fake), starts + 3);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_true(m.sampler.seed == 13); /* the third choice: 11 + 2 */

    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL,
                                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":2,"
                                 "\"max_tokens\":3,\"stream\":true,\"stream_options\":"
                                 "{\"include_usage\":true},\"chat_template_kwargs\":"
                                 "{\"enable_thinking\":false}}",
                                 &reply, &body),
                     200);
    gwh_normalize(body);
    const char *head = "data: {\"id\":\"chatcmpl-X\",\"object\":\"chat.completion.chunk\","
                       "\"created\":0,\"model\":\"qwen35-tiny\",\"choices\":[{\"index\":";
    char one[1024];
    snprintf(one, sizeof one,
             "%s%%d,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
             "\"finish_reason\":null}],\"usage\":null}\n\n"
             "%s%%d,\"delta\":{\"content\":\"Par\"},\"logprobs\":null,\"finish_reason\":null}],"
             "\"usage\":null}\n\n"
             "%s%%d,\"delta\":{\"content\":\"is\"},\"logprobs\":null,\"finish_reason\":null}],"
             "\"usage\":null}\n\n"
             "%s%%d,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"length\"}],"
             "\"usage\":null}\n\n",
             head, head, head, head);
    char c0[1024], c1[1024], tail[4096];
    snprintf(c0, sizeof c0, one, 0, 0, 0, 0);
    snprintf(c1, sizeof c1, one, 1, 1, 1, 1);
    snprintf(tail, sizeof tail,
             "%s%sdata: {\"id\":\"chatcmpl-X\",\"object\":\"chat.completion.chunk\",\"created\":0,"
             "\"model\":\"qwen35-tiny\",\"choices\":[],\"usage\":{\"prompt_tokens\":%%d,"
             "\"completion_tokens\":6,\"total_tokens\":%%d,\"prompt_tokens_details\":"
             "{\"cached_tokens\":1},\"acceptance_length\":1.5}}\n\ndata: [DONE]\n\n",
             c0, c1);
    uint32_t want[256];
    const int n_prompt = (int)gwh_prompt(HI, true, want);
    char full[4096];
    snprintf(full, sizeof full, tail, n_prompt, n_prompt + 6);
    assert_string_equal(body, full);
    free(reply);
}

/* best_of: that many candidates, the n of the highest log probability per token returned, best
 * first (the fake lowers a generation's log probabilities less for a larger seed: 11, 12, 13
 * here, so the third candidate ranks first); verifyd is asked for log probabilities even when
 * the client wants none, and they are not shown then. */
static void best_of_returns_the_likeliest_candidates(void **state)
{
    (void)state;
    fake_script s = {.step = 2, .lp_per_seed = 0.5f};
    gwh_encode("Paris.", &s); /* 4 tokens */
    fake_verifyd_script(gwh_fake, &s);
    const int starts = fake_verifyd_starts(gwh_fake);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":[39,68],\"max_tokens\":1,\"n\":2,\"best_of\":3,"
                                 "\"seed\":11,\"logprobs\":0}",
                                 &reply, &body),
                     200);
    assert_int_equal(fake_verifyd_starts(gwh_fake), starts + 3);
    /* token 0's log probability -0.25, lowered by 0.5 (15 - seed): -1.25 (seed 13), -1.75 (12) */
    assert_non_null(strstr(body, "\"choices\":[{\"index\":0,\"text\":\"P\",\"logprobs\":"
                                 "{\"tokens\":[\"P\"],\"token_logprobs\":[-1.25]"));
    assert_non_null(strstr(body, "{\"index\":1,\"text\":\"P\",\"logprobs\":{\"tokens\":"
                                 "[\"P\"],\"token_logprobs\":[-1.75]"));
    assert_null(strstr(body, "\"index\":2"));
    assert_non_null(strstr(body, "\"completion_tokens\":3,")); /* every candidate counts */
    free(reply);
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":[39,68],\"max_tokens\":1,\"best_of\":2,\"seed\":3}",
                                 &reply, &body),
                     200);
    assert_non_null(strstr(body, "\"choices\":[{\"index\":0,\"text\":\"P\",\"logprobs\":null,"));
    free(reply);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_true(m.logprobs && m.top_logprobs == 0 && m.sampler.seed == 4);
}

/* A batch of prompts: each prompt's candidates are generated in turn (seed + i for candidate
 * i of every prompt), best_of ranks within a prompt, the choices are numbered prompt by
 * prompt, and usage sums the prompts (each one's cached tokens counted once). */
static void prompt_batches_number_the_choices_prompt_by_prompt(void **state)
{
    (void)state;
    fake_script s = {.step = 2, .lp_per_seed = 0.5f, .cached = 1};
    gwh_encode("Paris.", &s);
    fake_verifyd_script(gwh_fake, &s);
    const int starts = fake_verifyd_starts(gwh_fake);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":[[39,68],[39]],\"max_tokens\":1,\"best_of\":2,"
                                 "\"seed\":11,\"logprobs\":0}",
                                 &reply, &body),
                     200);
    assert_int_equal(fake_verifyd_starts(gwh_fake), starts + 4);
    /* seed 12 is each prompt's likelier candidate: -0.25 - 0.5 * (15 - 12) */
    assert_non_null(strstr(body, "\"choices\":[{\"index\":0,\"text\":\"P\",\"logprobs\":"
                                 "{\"tokens\":[\"P\"],\"token_logprobs\":[-1.75]"));
    assert_non_null(strstr(body, "{\"index\":1,\"text\":\"P\",\"logprobs\":{\"tokens\":"
                                 "[\"P\"],\"token_logprobs\":[-1.75]"));
    assert_null(strstr(body, "\"index\":2"));
    assert_non_null(strstr(body, "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,"));
    assert_non_null(strstr(body, "\"cached_tokens\":2}"));
    free(reply);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_int_equal(m.n_prompt, 1);
    assert_int_equal(p[0], 39);
    assert_int_equal(m.sampler.seed, 12);

    /* streamed, n = 2: choices 0, 1 of the first prompt, then 2, 3 of the second */
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":[\"Hello\",[39]],\"max_tokens\":1,\"n\":2,"
                                 "\"stream\":true}",
                                 &reply, &body),
                     200);
    gwh_normalize(body);
    const char *head = "data: {\"id\":\"cmpl-X\",\"object\":\"text_completion\",\"created\":0,"
                       "\"model\":\"qwen35-tiny\",\"choices\":[{\"index\":";
    char expect[4096], one[512];
    expect[0] = 0;
    for (int i = 0; i < 4; i++) {
        snprintf(one, sizeof one,
                 "%s%d,\"text\":\"P\",\"logprobs\":null,\"finish_reason\":null}]}\n\n"
                 "%s%d,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"length\"}]}\n\n",
                 head, i, head, i);
        strcat(expect, one);
    }
    strcat(expect, "data: [DONE]\n\n");
    assert_string_equal(body, expect);
    free(reply);
}

/* echo with logprobs: the text opens with the prompt ("a" " pattern" as ids), its tokens open
 * the log probabilities (the first null, the next from verifyd's PROMPT events), and the
 * offsets run on into the completion; verifyd is asked for the prompt's log probabilities. */
static void echo_opens_the_text_and_the_logprobs_with_the_prompt(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64, 493}, .n_tokens = 2};
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":[64,493],\"echo\":true,\"logprobs\":1,\"max_tokens\":"
                                 "1}",
                                 &reply, &body),
                     200);
    assert_non_null(strstr(body, "\"choices\":[{\"index\":0,\"text\":\"a patterna\",\"logprobs\":"
                                 "{\"tokens\":[\"a\",\" pattern\",\"a\"],\"token_logprobs\":[null,"
                                 "-0.5,-0.25],\"top_logprobs\":[null,{\" pattern\":-0.5},{\"a\":"
                                 "-0.25}],\"text_offset\":[0,1,9]},\"finish_reason\":\"length\"}]"
                                 ""));
    assert_non_null(strstr(body, "\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1,"));
    free(reply);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_true(m.prompt_logprobs && m.logprobs && m.top_logprobs == 1 && m.max_tokens == 1);

    /* max_tokens 0: the prompt alone, given as text (kept as the client wrote it) */
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":\"Hello\",\"echo\":true,\"max_tokens\":0}", &reply,
                                 &body),
                     200);
    assert_non_null(strstr(body, "\"choices\":[{\"index\":0,\"text\":\"Hello\",\"logprobs\":null,"
                                 "\"finish_reason\":\"length\"}]"));
    assert_non_null(strstr(body, "\"completion_tokens\":0,"));
    free(reply);
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_true(!m.prompt_logprobs && !m.logprobs && m.max_tokens == 0);
}

/* truncate_prompt_tokens (vLLM's): verifyd gets the prompt's last k tokens, usage counts
 * them, echo gives their text; a chat's rendered prompt likewise; 0 and non-integers are 400,
 * a prompt shorter than k is left whole. */
static void truncate_prompt_tokens_keeps_the_prompts_end(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(gwh_fake, &s);
    uint32_t want[64];
    const size_t n = gwh_tokens("one two three four five", TOK_ENC_ADD_SPECIAL, want, 64);
    assert_true(n > 3);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":\"one two three four five\",\"max_tokens\":1,"
                                 "\"truncate_prompt_tokens\":3,\"echo\":true}",
                                 &reply, &body),
                     200);
    tok_bytes tail = {0}; /* the echo: the kept tokens' text, then the generated "a" */
    assert_int_equal(tok_decode(gwh_g.tok, (const int32_t *)want + n - 3, 3, 0, &tail), TD_OK);
    char echoed[128];
    snprintf(echoed, sizeof echoed, "\"text\":\"%.*sa\"", (int)tail.len, tail.ptr);
    tok_bytes_free(&tail);
    if (!strstr(body, echoed))
        fail_msg("want %s in %s", echoed, body);
    assert_non_null(strstr(body, "\"usage\":{\"prompt_tokens\":3,"));
    free(reply);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_int_equal(m.n_prompt, 3);
    assert_memory_equal(p, want + n - 3, 3 * sizeof *p);

    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":[5,6],\"max_tokens\":1,\"truncate_prompt_tokens\":9}",
                                 &reply, &body),
                     200);
    free(reply);
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_int_equal(m.n_prompt, 2);
    assert_int_equal(p[0], 5);

    const char *msgs = "[{\"role\":\"user\",\"content\":\"Tell me a story about a cat.\"}]";
    uint32_t chat[256];
    const size_t nc = gwh_prompt(msgs, false, chat);
    char req[512];
    snprintf(req, sizeof req, "{\"messages\":%s,\"max_tokens\":1,\"truncate_prompt_tokens\":4}",
             msgs);
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, req, &reply, &body), 200);
    free(reply);
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_int_equal(m.n_prompt, 4);
    assert_memory_equal(p, chat + nc - 4, 4 * sizeof *p);

    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":\"x\",\"truncate_prompt_tokens\":0}", &reply, &body),
                     400);
    assert_string_equal(body, "{\"error\":{\"message\":\"Invalid value for 'truncate_prompt_tokens'"
                              ": expected -1 (the context's size) or a number of tokens from 1, "
                              "but got 0 instead.\",\"type\":\"invalid_request_error\",\"param\":"
                              "\"truncate_prompt_tokens\",\"code\":\"invalid_value\"}}");
    free(reply);
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":\"x\",\"truncate_prompt_tokens\":\"3\"}", &reply,
                                 &body),
                     400);
    assert_non_null(strstr(body, "\"param\":\"truncate_prompt_tokens\",\"code\":\"invalid_type\""));
    free(reply);
}

/* bad_words: verifyd gets each word's tokens (without its leading whitespace), and after one
 * space too where that tokenizes differently; a word of more than 64 tokens is 400. */
static void bad_words_go_to_verifyd_as_token_sequences(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":\"x\",\"max_tokens\":1,\"bad_words\":[\" pattern\","
                                 "\"a\"]}",
                                 &reply, &body),
                     200);
    free(reply);
    uint32_t want[128];
    size_t n = 0;
    const char *const forms[] = {"pattern", " pattern", "a", " a"};
    for (int k = 0; k < 4; k += 2) {
        uint32_t a[32], b[32];
        const size_t na = gwh_tokens(forms[k], 0, a, 32), nb = gwh_tokens(forms[k + 1], 0, b, 32);
        want[n++] = (uint32_t)na;
        memcpy(want + n, a, na * sizeof *a);
        n += na;
        if (na != nb || memcmp(a, b, na * sizeof *a) != 0) {
            want[n++] = (uint32_t)nb;
            memcpy(want + n, b, nb * sizeof *b);
            n += nb;
        }
    }
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_int_equal(m.n_bad, n);
    assert_memory_equal(m.bad, want, n * sizeof *want);

    char req[2048] = "{\"prompt\":\"x\",\"bad_words\":[\"";
    for (int i = 0; i < 65; i++)
        strcat(req, " a"); /* 65 tokens or more */
    strcat(req, "\"]}");
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL, req, &reply, &body), 400);
    assert_non_null(strstr(body, "\"param\":\"bad_words[0]\",\"code\":\"invalid_value\""));
    free(reply);
}

/* Streamed with n = 2: each choice's first chunk is the prompt with its log probabilities;
 * verifyd computes them for the first choice only. */
static void echo_streams_the_prompt_first_in_each_choice(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64, 493}, .n_tokens = 2};
    fake_verifyd_script(gwh_fake, &s);
    const int starts = fake_verifyd_starts(gwh_fake);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":[64,493],\"echo\":true,\"logprobs\":0,\"max_tokens\":"
                                 "1,"
                                 "\"n\":2,\"stream\":true}",
                                 &reply, &body),
                     200);
    assert_int_equal(fake_verifyd_starts(gwh_fake), starts + 2);
    gwh_normalize(body);
    const char *head = "data: {\"id\":\"cmpl-X\",\"object\":\"text_completion\",\"created\":0,"
                       "\"model\":\"qwen35-tiny\",\"choices\":[{\"index\":";
    char expect[4096], one[1024];
    expect[0] = 0;
    for (int i = 0; i < 2; i++) {
        snprintf(one, sizeof one,
                 "%s%d,\"text\":\"a pattern\",\"logprobs\":{\"tokens\":[\"a\",\" pattern\"],"
                 "\"token_logprobs\":[null,-0.5],\"top_logprobs\":[null,{}],\"text_offset\":[0,1]},"
                 "\"finish_reason\":null}]}\n\n"
                 "%s%d,\"text\":\"a\",\"logprobs\":{\"tokens\":[\"a\"],\"token_logprobs\":[-0.25],"
                 "\"top_logprobs\":[{}],\"text_offset\":[9]},\"finish_reason\":null}]}\n\n"
                 "%s%d,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"length\"}]}\n\n",
                 head, i, head, i, head, i);
        strcat(expect, one);
    }
    strcat(expect, "data: [DONE]\n\n");
    assert_string_equal(body, expect);
    free(reply);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_false(m.prompt_logprobs); /* the second choice reused the first's */
}

/* A verifyd whose prompt log probabilities stop short fails the request with a 500 saying so. */
static void echo_with_missing_prompt_logprobs_is_an_error(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64}, .n_tokens = 1, .prompt_lp_drop = 1};
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":[64,493,64],\"echo\":true,\"logprobs\":0}", &reply,
                                 &body),
                     500);
    assert_non_null(strstr(body, "The model server sent the log probabilities of 1 of the "
                                 "prompt's 2 tokens."));
    free(reply);
}

/* vLLM's prompt_logprobs: each choice of a completion carries the prompt's entries (the first
 * null), the token first with its log probability, rank and text, then its alternatives (the
 * fake's first alternative is the token itself, rank 1 there; alone it has rank pos + 1);
 * verifyd is asked for the prompt's log probabilities with that many alternatives, and for
 * the output's only with logprobs; echo keeps its own count of alternatives. */
static void prompt_logprobs_come_with_each_completion_choice(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":[64,493],\"prompt_logprobs\":0,\"max_tokens\":1}",
                                 &reply, &body),
                     200);
    assert_non_null(strstr(body, "\"logprobs\":null,\"finish_reason\":\"stop\","
                                 "\"prompt_logprobs\":[null,{\"493\":{\"logprob\":-0.5,\"rank\":2,"
                                 "\"decoded_token\":\" pattern\"}}]}]"));
    free(reply);
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_true(m.prompt_logprobs && !m.logprobs && m.top_logprobs == 0);

    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":[64,493],\"prompt_logprobs\":1,\"max_tokens\":1,"
                                 "\"n\":2}",
                                 &reply, &body),
                     200);
    const char *want = "\"prompt_logprobs\":[null,{\"493\":{\"logprob\":-0.5,\"rank\":1,"
                       "\"decoded_token\":\" pattern\"}}]}";
    const char *first = strstr(body, want);
    assert_non_null(first);
    assert_non_null(strstr(first + 1, want)); /* the second choice reuses the first's */
    free(reply);
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_true(!m.prompt_logprobs && !m.logprobs && m.top_logprobs == 0);

    /* with echo and logprobs 1: echo shows one alternative, prompt_logprobs two */
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":[64,493],\"prompt_logprobs\":2,\"echo\":true,"
                                 "\"logprobs\":1,\"max_tokens\":1}",
                                 &reply, &body),
                     200);
    assert_non_null(strstr(body, "\"top_logprobs\":[null,{\" pattern\":-0.5},{\"a\":-0.25}]"));
    assert_non_null(strstr(body, "\"prompt_logprobs\":[null,{\"493\":{\"logprob\":-0.5,"
                                 "\"rank\":1,\"decoded_token\":\" pattern\"},\"494\":{\"logprob\":"
                                 "-2.5,\"rank\":2,\"decoded_token\":"));
    free(reply);
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_true(m.prompt_logprobs && m.logprobs && m.top_logprobs == 2);
}

/* A chat's prompt_logprobs go beside the choices, one entry per token of the rendered prompt;
 * asked for with stream, as -1 (the whole vocabulary) or past 20 it is a 400. */
static void chat_prompt_logprobs_and_their_errors(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL,
                                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                                 "\"prompt_logprobs\":0,\"max_tokens\":1}",
                                 &reply, &body),
                     200);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    const char *pl = strstr(body, "}],\"usage\":{");
    assert_non_null(pl);
    pl = strstr(pl, "},\"prompt_logprobs\":[null,{");
    assert_non_null(pl);
    json_t *root = json_loads(body, 0, NULL);
    json_t *list = json_object_get(root, "prompt_logprobs");
    assert_int_equal(json_array_size(list), m.n_prompt);
    char key[16];
    snprintf(key, sizeof key, "%u", p[m.n_prompt - 1]);
    json_t *last = json_object_get(json_array_get(list, m.n_prompt - 1), key);
    assert_int_equal(json_integer_value(json_object_get(last, "rank")), m.n_prompt);
    json_decref(root);
    free(reply);

    static const char *bad[] = {
        "\"prompt_logprobs\":1,\"stream\":true", "\"prompt_logprobs\":-1",
        "\"prompt_logprobs\":21", "\"prompt_logprobs\":\"2\"",
    };
    static const char *why[] = {
        "not available with 'stream'", "-1 (the whole vocabulary) is not served",
        "expected an integer from -1 to 20, but got 21", "prompt_logprobs",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char req[256];
        snprintf(req, sizeof req, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],%s}",
                 bad[i]);
        assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, req, &reply, &body),
                         400);
        if (!strstr(body, why[i]))
            fail_msg("%s: %s", bad[i], body);
        free(reply);
    }
}

/* A chat's echo (vLLM's): when the last message is the assistant's, each choice's content
 * opens with its text (a list's text parts joined by newlines), streamed as the first content
 * chunk; after a user's message it changes nothing. */
static void chat_echo_opens_the_content_with_the_assistants_message(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    static const char *const head =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\","
        "\"content\":";
    static const char *const tail = "}],\"add_generation_prompt\":false,"
                                    "\"continue_final_message\":true,\"echo\":true,"
                                    "\"max_tokens\":1%s}";
    char req[512], fmt[512];
    snprintf(fmt, sizeof fmt, "%s%s%s", head, "\"The answer is\"", tail);
    snprintf(req, sizeof req, fmt, "");
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, req, &reply, &body), 200);
    assert_non_null(strstr(body, "\"message\":{\"role\":\"assistant\",\"content\":"
                                 "\"The answer isa\"}"));
    free(reply);
    snprintf(req, sizeof req, fmt, ",\"stream\":true");
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, req, &reply, &body), 200);
    const char *role = strstr(body, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}");
    assert_non_null(role);
    const char *echo = strstr(body, "\"delta\":{\"content\":\"The answer is\"}");
    assert_non_null(echo);
    assert_true(role < echo && strstr(echo, "\"delta\":{\"content\":\"a\"}") != NULL);
    free(reply);
    snprintf(fmt, sizeof fmt, "%s%s%s", head,
             "[{\"type\":\"text\",\"text\":\"x\"},{\"type\":\"text\",\"text\":\"y\"}]", tail);
    snprintf(req, sizeof req, fmt, "");
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, req, &reply, &body), 200);
    assert_non_null(strstr(body, "\"content\":\"x\\nya\"}"));
    free(reply);
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL,
                                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                                 "\"echo\":true,\"max_tokens\":1}",
                                 &reply, &body),
                     200);
    assert_non_null(strstr(body, "\"content\":\"\",\"reasoning_content\":\"a\"}")); /* no echo */
    free(reply);
}

/* A prediction goes to verifyd as plain-text tokens (its text parts joined); usage tells
 * the tokens taken (as verifyd reports them) and the rest, summed over the choices. */
static void prediction_goes_to_verifyd_and_usage_counts_it(void **state)
{
    (void)state;
    fake_script s = {.step = 2, .predicted = 3};
    gwh_encode("Paris.", &s);
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    assert_int_equal(gwh_request("GET", "/metrics", NULL, NULL, &reply, &body), 200);
    const char *at = strstr(body, "tandem_prediction_tokens_total{outcome=\"accepted\"} ");
    assert_non_null(at);
    const int accepted_before = atoi(strchr(at, '}') + 2);
    free(reply);
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":\"x\",\"n\":2,\"prediction\":{\"type\":\"content\","
                                 "\"content\":[{\"type\":\"text\",\"text\":\"a pat\"},{\"type\":"
                                 "\"text\",\"text\":\"tern<|im_end|>\"}]}}",
                                 &reply, &body),
                     200);
    msg_gen_start m;
    uint32_t p[256], stop[8], want[64];
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    const size_t n = gwh_tokens("a pattern<|im_end|>", TOK_ENC_SPLIT_SPECIAL, want, 64);
    assert_int_equal(m.n_predict, n);
    assert_memory_equal(m.predict, want, n * sizeof *want);
    uint32_t special[64]; /* the end-of-turn text is text, not the end-of-turn token */
    assert_true(gwh_tokens("a pattern<|im_end|>", 0, special, 64) < n && n > 3);
    char details[160];
    snprintf(details, sizeof details, "\"completion_tokens_details\":{"
             "\"accepted_prediction_tokens\":6,\"rejected_prediction_tokens\":%zu}", 2 * (n - 3));
    assert_non_null(strstr(body, details));
    free(reply);
    char line[96]; /* and the counter, the two choices' 3 each */
    assert_int_equal(gwh_request("GET", "/metrics", NULL, NULL, &reply, &body), 200);
    snprintf(line, sizeof line, "\ntandem_prediction_tokens_total{outcome=\"accepted\"} %d\n",
             accepted_before + 6);
    assert_non_null(strstr(body, line));
    free(reply);
    /* without one, no details */
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL, "{\"prompt\":\"x\"}", &reply,
                                 &body),
                     200);
    assert_null(strstr(body, "completion_tokens_details"));
    free(reply);
    static const char *const bad[][2] = {
        {"{\"prompt\":\"x\",\"prediction\":\"text\"}", "Invalid type for 'prediction'"},
        {"{\"prompt\":\"x\",\"prediction\":{\"type\":\"diff\",\"content\":\"\"}}",
         "'prediction.type': supported value is 'content'"},
        {"{\"prompt\":\"x\",\"prediction\":{\"type\":\"content\",\"content\":[{\"text\":\"a\"}]}}",
         "Only text content parts are supported; prediction.content[0] has type '(none)'."},
        {"{\"prompt\":\"x\",\"prediction\":{\"type\":\"content\"}}",
         "Missing required parameter: 'prediction.content'"},
        {"{\"prompt\":\"x\",\"prediction\":{\"type\":\"content\",\"content\":7}}",
         "Invalid type for 'prediction.content'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(gwh_request("POST", "/v1/completions", NULL, bad[i][0], &reply, &body),
                                     400);
        if (!strstr(body, bad[i][1]))
            fail_msg("%s: %s", bad[i][0], body);
        free(reply);
    }
}

/* stream_options.continuous_usage_stats: every choice chunk carries the usage so far (the
 * prompt, the tokens up to that chunk), the finish chunk the whole. */
static void continuous_usage_rides_on_every_chunk(void **state)
{
    (void)state;
    fake_script s = {.step = 1};
    gwh_encode("Paris.", &s); /* 4 tokens */
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":[39,68],\"stream\":true,\"stream_options\":{"
                                 "\"include_usage\":true,\"continuous_usage_stats\":true}}",
                                 &reply, &body),
                     200);
    uint32_t seen[8], n = 0;
    for (char *line = strstr(body, "data: {"); line; line = strstr(line + 1, "data: {")) {
        json_t *j = json_loadb(line + 6, strcspn(line + 6, "\n"), 0, NULL);
        assert_non_null(j);
        const json_t *u = json_object_get(j, "usage");
        assert_true(json_is_object(u));
        assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), 2);
        assert_true(n < 8);
        seen[n++] = (uint32_t)json_integer_value(json_object_get(u, "completion_tokens"));
        json_decref(j);
    }
    /* 4 text chunks, the finish chunk and the usage chunk */
    assert_int_equal(n, 6);
    const uint32_t want[6] = {1, 2, 3, 4, 4, 4};
    assert_memory_equal(seen, want, sizeof want);
    free(reply);
}

/* A required call (named here) goes to verifyd with the tool spec it matches the call
 * against: the model's template teaches the XML form, and only the named function is in it;
 * tools whose schemas cannot be enforced are this request's 400, before verifyd is asked.
 * With tool_choice "auto" every tool is in the spec, or calls stay free. */
static void required_call_sends_the_tool_spec(void **state)
{
    (void)state;
    fake_script s = {.step = 4};
    gwh_encode("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
               "</function>\n</tool_call>",
               &s);
    fake_verifyd_script(gwh_fake, &s);
    const char *req =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"chat_template_kwargs\":"
        "{\"enable_thinking\":false},\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
        "\"get_time\"}},{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"description\":\"d\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":"
        "{\"type\":\"string\"%s}}}}}],\"tool_choice\":{\"type\":\"function\",\"function\":"
        "{\"name\":\"get_weather\"}}}";
    char body_req[1024];
    snprintf(body_req, sizeof body_req, req, "");
    char *reply, *body;
    const int starts = fake_verifyd_starts(gwh_fake);
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, body_req, &reply, &body),
                                 200);
    assert_non_null(strstr(body, "\"finish_reason\":\"tool_calls\""));
    free(reply);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_int_equal(m.format, MSG_FORMAT_TOOL_CALL);
    const char *spec = "{\"form\":\"xml\",\"tools\":[{\"name\":\"get_weather\",\"parameters\":"
                       "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}]}";
    assert_int_equal(m.n_schema, strlen(spec));
    assert_string_equal(m.schema, spec);
    snprintf(body_req, sizeof body_req, req, ",\"multipleOf\":2");
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, body_req, &reply, &body),
                                 400);
    assert_non_null(strstr(body, "\"message\":\"The tools cannot be enforced for a required "
                                 "call: tool call: function 'get_weather' parameter 'city': "));
    assert_non_null(strstr(body, "multipleOf"));
    assert_non_null(strstr(body, "\"param\":\"tools\",\"code\":\"unsupported_value\""));
    free(reply);
    assert_int_equal(fake_verifyd_starts(gwh_fake), starts + 1);

    /* tool_choice "auto": the calls the model opens are matched against every tool; with a
     * schema that cannot be enforced they are left free instead (no error) */
    const char *auto_req =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"tools\":[{\"type\":"
        "\"function\",\"function\":{\"name\":\"get_time\"}},{\"type\":\"function\",\"function\":"
        "{\"name\":\"get_weather\",\"parameters\":{\"properties\":{\"city\":{%s}}}}}]}";
    snprintf(body_req, sizeof body_req, auto_req, "\"type\":\"string\"");
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, body_req, &reply, &body),
                                 200);
    free(reply);
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_int_equal(m.format, MSG_FORMAT_TOOLS);
    assert_string_equal(m.schema, "{\"form\":\"xml\",\"tools\":[{\"name\":\"get_time\"},{\"name\":"
                                  "\"get_weather\",\"parameters\":{\"properties\":{\"city\":{"
                                  "\"type\":\"string\"}}}}]}");
    snprintf(body_req, sizeof body_req, auto_req, "\"multipleOf\":2");
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, body_req, &reply, &body),
                                 200);
    free(reply);
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_int_equal(m.format, MSG_FORMAT_TEXT);
    assert_int_equal(m.n_schema, 0);
}

static void tokenize_and_detokenize_round_trip(void **state)
{
    (void)state;
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/tokenize", NULL, "{\"content\":\"Hello world\"}", &reply,
                                 &body),
                     200);
    assert_string_equal(body, "{\"count\":8,\"max_model_len\":1024,\"tokens\":[39,68,317,78,281,"
                              "274,75,67]}");
    free(reply);
    /* a chat's messages: the prompt a chat request sends verifyd, as the template makes it */
    const char *msgs = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                       "\"chat_template_kwargs\":{\"enable_thinking\":false}}";
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, msgs, &reply, &body), 200);
    free(reply);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_int_equal(gwh_request("POST", "/tokenize", NULL, msgs, &reply, &body), 200);
    json_t *j = json_loads(body, 0, NULL);
    const json_t *toks = json_object_get(j, "tokens");
    assert_int_equal(json_array_size(toks), m.n_prompt);
    assert_int_equal(json_integer_value(json_object_get(j, "count")), m.n_prompt);
    for (uint32_t i = 0; i < m.n_prompt; i++)
        assert_int_equal(json_integer_value(json_array_get(toks, i)), p[i]);
    json_decref(j);
    free(reply);
    assert_int_equal(gwh_request("POST", "/tokenize", NULL, "{\"messages\":[{\"role\":\"x\"}]}",
                                 &reply, &body),
                     400);
    free(reply);
    /* continue_final_message: verifyd's prompt ends with the final message's text, open */
    const char *cont = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":"
                       "\"assistant\",\"content\":\"Hello wor\"}],\"continue_final_message\":true,"
                       "\"add_generation_prompt\":false,\"chat_template_kwargs\":{"
                       "\"enable_thinking\":false}}";
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, cont, &reply, &body), 200);
    free(reply);
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    char ids[2048] = "{\"tokens\":[";
    for (uint32_t i = 0; i < m.n_prompt; i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%u", i ? "," : "", p[i]);
    strcat(ids, "]}");
    assert_int_equal(gwh_request("POST", "/detokenize", NULL, ids, &reply, &body), 200);
    assert_string_equal(body, "{\"content\":\"<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>"
                              "assistant\\n<think>\\n\\n</think>\\n\\nHello wor\"}");
    free(reply);
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL,
                                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                 "\"continue_final_message\":true}",
                                 &reply, &body),
                     400);
    assert_string_equal(body, "{\"error\":{\"message\":\"Invalid value for 'continue_final_message'"
                              ": it continues the final message, so 'add_generation_prompt' (true "
                              "by default), which opens a new one, must be false.\",\"type\":"
                              "\"invalid_request_error\",\"param\":\"continue_final_message\","
                              "\"code\":\"invalid_value\"}}");
    free(reply);
    assert_int_equal(gwh_request("POST", "/detokenize", NULL,
                                 "{\"tokens\":[505,39,68,317,78,281,274,75,67]}", &reply, &body),
                     200);
    assert_string_equal(body, "{\"content\":\"<|im_start|>Hello world\"}");
    free(reply);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(n_choices_are_generated_one_after_the_other),
        cmocka_unit_test(best_of_returns_the_likeliest_candidates),
        cmocka_unit_test(prompt_batches_number_the_choices_prompt_by_prompt),
        cmocka_unit_test(echo_opens_the_text_and_the_logprobs_with_the_prompt),
        cmocka_unit_test(echo_streams_the_prompt_first_in_each_choice),
        cmocka_unit_test(truncate_prompt_tokens_keeps_the_prompts_end),
        cmocka_unit_test(bad_words_go_to_verifyd_as_token_sequences),
        cmocka_unit_test(echo_with_missing_prompt_logprobs_is_an_error),
        cmocka_unit_test(prompt_logprobs_come_with_each_completion_choice),
        cmocka_unit_test(chat_prompt_logprobs_and_their_errors),
        cmocka_unit_test(chat_echo_opens_the_content_with_the_assistants_message),
        cmocka_unit_test(prediction_goes_to_verifyd_and_usage_counts_it),
        cmocka_unit_test(continuous_usage_rides_on_every_chunk),
        cmocka_unit_test(required_call_sends_the_tool_spec),
        cmocka_unit_test(tokenize_and_detokenize_round_trip),
    };
    return cmocka_run_group_tests(tests, gwh_setup, gwh_teardown);
}
