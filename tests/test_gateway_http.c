/* The gateway over real HTTP against a stand-in verifyd (tests/support/gw_harness.h): exact
 * bodies and SSE streams for chat and completions, what reaches verifyd in gen_start, stop
 * strings that cancel the generation, tool calls, reasoning, logprobs, errors in the middle of
 * a stream, waiting while verifyd is busy, client disconnects that cancel, auth, HTTP errors,
 * metrics, and a verifyd restart that ends open streams. test_gateway_api has the OpenAI
 * extras (n, best_of, batches, echo, predictions, tool specs, /tokenize). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/clock.h"
#include "tests/support/fake_verifyd.h"
#include "gateway/background.h"
#include "gateway/respstore.h"
#include "tests/support/gw_harness.h"

static const char HI[] = "[{\"role\":\"user\",\"content\":\"hi\"}]";

/* --- chat ----------------------------------------------------------------------------------- */

static void chat_whole_response_and_what_verifyd_receives(void **state)
{
    (void)state;
    fake_script s = {.step = 2, .cached = 3};
    gwh_encode("Hello world", &s); /* 8 tokens: 4 steps of 2 */
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    int st = gwh_request("POST", "/v1/chat/completions", NULL,
                         "{\"model\":\"qwen35-tiny\",\"messages\":[{\"role\":\"user\",\"content\":"
                         "\"hi\"}],\"max_tokens\":10,\"temperature\":0,\"seed\":5,"
                         "\"chat_template_kwargs\":{\"enable_thinking\":false},\"unknown\":1}",
                         &reply, &body);
    assert_int_equal(st, 200);
    gwh_normalize(body);
    uint32_t want[256], got[256], stop[8];
    size_t n = gwh_prompt(HI, true, want);
    char expect[1024];
    snprintf(expect, sizeof expect,
             "{\"id\":\"chatcmpl-X\",\"object\":\"chat.completion\",\"created\":0,\"model\":"
             "\"qwen35-tiny\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
             "\"content\":\"Hello world\"},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
             "\"usage\":{\"prompt_tokens\":%zu,\"completion_tokens\":8,\"total_tokens\":%zu,"
             "\"prompt_tokens_details\":{\"cached_tokens\":3},\"acceptance_length\":2.0}}",
             n, n + 8);
    assert_string_equal(body, expect);
    free(reply);

    msg_gen_start m;
    assert_true(fake_verifyd_last_start(gwh_fake, &m, got, 256, stop, 8));
    assert_int_equal(m.n_prompt, n);
    assert_memory_equal(got, want, n * sizeof *got);
    assert_int_equal(m.max_tokens, 10);
    assert_true(m.sampler.temperature == 0.0f);
    assert_int_equal(m.sampler.seed, 5);
    assert_int_equal(m.n_stop, 1);
    assert_int_equal(stop[0], 506); /* <|im_end|>: eos and eot of the tiny vocabulary */
    assert_false(m.logprobs);
    assert_false(m.ignore_eos);
}

static void chat_stream_sends_exact_chunks(void **state)
{
    (void)state;
    fake_script s = {.step = 3};
    gwh_encode("Hello world", &s);
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    int st = gwh_request("POST", "/v1/chat/completions", NULL,
                         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,"
                         "\"stream_options\":{\"include_usage\":true},\"chat_template_kwargs\":"
                         "{\"enable_thinking\":false}}",
                         &reply, &body);
    assert_int_equal(st, 200);
    assert_non_null(strstr(reply, "Content-Type: text/event-stream"));
    gwh_normalize(body);
    /* Steps of 3 tokens: "Hello world" decodes as "Hel" + "lo wo" + "rld"? Take it from the
     * tokenizer so only the framing is pinned here. */
    char pieces[3][32];
    for (int k = 0; k < 3; k++) {
        tok_bytes b = {0};
        uint32_t n = k < 2 ? 3 : s.n_tokens - 6;
        assert_int_equal(tok_decode(gwh_g.tok, (const int32_t *)s.tokens + 3 * k, n, 0, &b), TD_OK);
        snprintf(pieces[k], sizeof pieces[k], "%s", b.ptr);
        tok_bytes_free(&b);
    }
    const char *head = "data: {\"id\":\"chatcmpl-X\",\"object\":\"chat.completion.chunk\","
                       "\"created\":0,\"model\":\"qwen35-tiny\",\"choices\":[{\"index\":0,";
    uint32_t prompt[256];
    size_t n = gwh_prompt(HI, true, prompt);
    char expect[4096];
    snprintf(expect, sizeof expect,
             "%s\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
             "\"finish_reason\":null}],\"usage\":null}\n\n"
             "%s\"delta\":{\"content\":\"%s\"},\"logprobs\":null,\"finish_reason\":null}],"
             "\"usage\":null}\n\n"
             "%s\"delta\":{\"content\":\"%s\"},\"logprobs\":null,\"finish_reason\":null}],"
             "\"usage\":null}\n\n"
             "%s\"delta\":{\"content\":\"%s\"},\"logprobs\":null,\"finish_reason\":null}],"
             "\"usage\":null}\n\n"
             "%s\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n\n"
             "data: {\"id\":\"chatcmpl-X\",\"object\":\"chat.completion.chunk\",\"created\":0,"
             "\"model\":\"qwen35-tiny\",\"choices\":[],\"usage\":{\"prompt_tokens\":%zu,"
             "\"completion_tokens\":8,\"total_tokens\":%zu,\"prompt_tokens_details\":"
             "{\"cached_tokens\":0},\"acceptance_length\":2.667}}\n\n"
             "data: [DONE]\n\n",
             head, head, pieces[0], head, pieces[1], head, pieces[2], head, n, n + 8);
    assert_string_equal(body, expect);
    free(reply);
}

static void stop_string_ends_the_text_and_cancels_verifyd(void **state)
{
    (void)state;
    fake_script s = {.step = 2, .delay_ms = 30};
    gwh_encode("hello END world and more", &s);
    fake_verifyd_script(gwh_fake, &s);
    int cancels = fake_verifyd_cancels(gwh_fake);
    char *reply, *body;
    int st = gwh_request("POST", "/v1/chat/completions", NULL,
                         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stop\":[\"END\"]"
                         ","
                         "\"chat_template_kwargs\":{\"enable_thinking\":false}}",
                         &reply, &body);
    assert_int_equal(st, 200);
    json_t *j = json_loads(body, 0, NULL);
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(choice, "message"),
                                                          "content")),
                        "hello ");
    assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")), "stop");
    /* "hello END" is 7 tokens: the tokens after the stop string do not count. */
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"),
                                                        "completion_tokens")),
                     7);
    json_decref(j);
    free(reply);
    assert_int_equal(fake_verifyd_cancels(gwh_fake), cancels + 1);
    /* include_stop_str_in_output: the text ends with the stop string */
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":\"x\",\"stop\":\"END\",\"include_stop_str_in_output\""
                                 ":true}",
                                 &reply, &body),
                     200);
    assert_non_null(strstr(body, "\"text\":\"hello END\",\"logprobs\":null,\"finish_reason\":"
                                 "\"stop\""));
    free(reply);
}

/* Control tokens in the output print nothing, or their text with skip_special_tokens false
 * (vLLM's). */
/* vLLM's chat_template: the request's own template renders the prompt verifyd gets (and
 * /tokenize counts); one that does not parse is a 400 naming it. */
static void a_requests_own_chat_template_renders_its_prompt(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(gwh_fake, &s);
    static const char tmpl[] =
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}";
    char req[1024], *reply, *body;
    snprintf(req, sizeof req, "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
             "{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template\":\"%s\"}", tmpl);
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, req, &reply, &body), 200);
    free(reply);
    uint32_t want[64], got[64], stop[8];
    const size_t n = gwh_tokens("[system] Be brief.\n[user] hi\n[assistant] ", 0, want, 64);
    msg_gen_start m;
    assert_true(fake_verifyd_last_start(gwh_fake, &m, got, 64, stop, 8));
    assert_int_equal(m.n_prompt, n);
    assert_memory_equal(got, want, n * sizeof *got);
    assert_int_equal(gwh_request("POST", "/tokenize", NULL, req, &reply, &body), 200);
    char count[32];
    snprintf(count, sizeof count, "\"count\":%zu,", n);
    assert_non_null(strstr(body, count));
    free(reply);
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL,
                                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                 "\"chat_template\":\"{% for m in messages %}\"}", &reply, &body),
                     400);
    assert_non_null(strstr(body, "\"message\":\"Invalid value for 'chat_template': "));
    assert_non_null(strstr(body, "\"param\":\"chat_template\",\"code\":\"invalid_value\""));
    free(reply);
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL,
                                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                 "\"chat_template\":7}", &reply, &body), 400);
    assert_string_equal(body, "{\"error\":{\"message\":\"Invalid type for 'chat_template': "
                              "expected a string, but got an integer instead.\",\"type\":"
                              "\"invalid_request_error\",\"param\":\"chat_template\",\"code\":"
                              "\"invalid_type\"}}");
    free(reply);
}

static void special_tokens_show_when_asked_for(void **state)
{
    (void)state;
    for (int keep = 0; keep < 2; keep++) {
        fake_script s = {.step = 3};
        gwh_encode("a<|im_start|>b<|endoftext|>c", &s);
        assert_int_equal(s.n_tokens, 5);
        fake_verifyd_script(gwh_fake, &s);
        char *reply, *body;
        assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                     keep ? "{\"prompt\":\"x\",\"skip_special_tokens\":false}"
                                          : "{\"prompt\":\"x\"}",
                                     &reply, &body),
                         200);
        assert_non_null(strstr(body, keep ? "\"text\":\"a<|im_start|>b<|endoftext|>c\""
                                          : "\"text\":\"abc\""));
        free(reply);
    }
}

static void tool_call_in_the_output_becomes_tool_calls(void **state)
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
        "\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":"
        "{\"type\":\"string\"}}}}}]%s}";
    char body_req[1024];
    snprintf(body_req, sizeof body_req, req, "");
    char *reply, *body;
    int st = gwh_request("POST", "/v1/chat/completions", NULL, body_req, &reply, &body);
    if (st != 200)
        fail_msg("%d %s", st, body);
    gwh_normalize(body);
    assert_non_null(strstr(body, "\"message\":{\"role\":\"assistant\",\"content\":null,"
                                 "\"tool_calls\":[{\"id\":\"call_X_0\",\"type\":\"function\","
                                 "\"function\":{\"name\":\"get_weather\",\"arguments\":"
                                 "\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},\"logprobs\":null,"
                                 "\"finish_reason\":\"tool_calls\"}"));
    free(reply);
    snprintf(body_req, sizeof body_req, req, ",\"stream\":true");
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, body_req, &reply, &body),
                                 200);
    gwh_normalize(body);
    /* streamed as written: the call with its name, then its arguments step by step (4 tokens
     * a step) as far as they are certain */
    static const char *const deltas[] = {
        "{\"tool_calls\":[{\"index\":0,\"id\":\"call_X_0\",\"type\":\"function\","
        "\"function\":{\"name\":\"get_weather\",\"arguments\":\"\"}}]}",
        "{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\"}}]}",
        "{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"city\\\": \\\"P\"}}]}",
        "{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"aris\"}}]}",
        "{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"\"}}]}",
        "{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"}\"}}]}",
    };
    const char *at = body;
    for (size_t i = 0; i < sizeof deltas / sizeof deltas[0]; i++) {
        char chunk[512];
        snprintf(chunk, sizeof chunk, "\"delta\":%s,\"logprobs\":null,\"finish_reason\":null}",
                 deltas[i]);
        const char *next = strstr(at, chunk);
        if (!next)
            fail_msg("delta %zu (%s) not after %.40s", i, deltas[i], at);
        at = next + strlen(chunk);
    }
    const char *fin = "\"delta\":{},\"logprobs\":null,\"finish_reason\":\"tool_calls\"";
    assert_non_null(strstr(at, "\"delta\":"));
    assert_memory_equal(strstr(at, "\"delta\":"), fin, strlen(fin)); /* and nothing else */
    size_t n_calls = 0;
    for (const char *c = strstr(body, "\"tool_calls\":["); c; c = strstr(c + 1, "\"tool_calls\":["))
        n_calls++;
    assert_int_equal(n_calls, sizeof deltas / sizeof deltas[0]);
    assert_non_null(strstr(body, "\"delta\":{},\"logprobs\":null,\"finish_reason\":"
                                 "\"tool_calls\"}]}\n\ndata: [DONE]\n\n"));
    assert_null(strstr(body, "\"content\":\"<"));
    free(reply);
}

/* parallel_tool_calls false: the answer ends with its first call (verifyd is told to stop), the
 * second call and the text after it are not sent. */
static void one_tool_call_when_parallel_calls_are_off(void **state)
{
    (void)state;
    fake_script s = {.step = 3};
    gwh_encode("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
               "</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
               "Rome\n</parameter>\n</function>\n</tool_call>\nDone, thanks for asking, and more "
               "text after the calls.",
               &s);
    const char *req =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"chat_template_kwargs\":"
        "{\"enable_thinking\":false},\"parallel_tool_calls\":false,\"tools\":[{\"type\":"
        "\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
        "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]%s}";
    char body_req[1024];
    for (int stream = 0; stream < 2; stream++) {
        fake_verifyd_script(gwh_fake, &s);
        const int cancels = fake_verifyd_cancels(gwh_fake);
        snprintf(body_req, sizeof body_req, req, stream ? ",\"stream\":true" : "");
        char *reply, *body;
        int st = gwh_request("POST", "/v1/chat/completions", NULL, body_req, &reply, &body);
        if (st != 200)
            fail_msg("%d %s", st, body);
        gwh_normalize(body);
        assert_non_null(strstr(body, "Paris"));
        assert_null(strstr(body, "Rome"));
        assert_null(strstr(body, "Done"));
        assert_non_null(strstr(body, "\"finish_reason\":\"tool_calls\""));
        assert_int_equal(fake_verifyd_cancels(gwh_fake), cancels + 1);
        free(reply);
    }
}

static void reasoning_opened_by_the_prompt_is_split_off(void **state)
{
    (void)state;
    fake_script s = {.step = 5};
    gwh_encode("Let me see.\n</think>\n\nParis.", &s);
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL,
                                 "{\"messages\":[{\"role\":\"user\",\"content\":\"capital?\"}]}",
                                 &reply, &body),
                     200);
    assert_non_null(strstr(body, "\"message\":{\"role\":\"assistant\",\"content\":\"Paris.\","
                                 "\"reasoning_content\":\"Let me see.\"}"));
    free(reply);
}

static void logprobs_of_each_token_with_alternatives(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64, 493}, .n_tokens = 2};
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL,
                                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs"
                                 "\":"
                                 "true,\"top_logprobs\":2,\"chat_template_kwargs\":"
                                 "{\"enable_thinking\":false}}",
                                 &reply, &body),
                     200);
    /* The fake gives token i log probability -0.25 (i + 1), alternative k (id + k) 1 less per k;
     * 65 is "b", 494 is "ON". */
    assert_non_null(strstr(
        body, "\"logprobs\":{\"content\":[{\"token\":\"a\",\"logprob\":-0.25,\"bytes\":[97],"
              "\"top_logprobs\":[{\"token\":\"a\",\"logprob\":-0.25,\"bytes\":[97]},{\"token\":"
              "\"b\",\"logprob\":-1.25,\"bytes\":[98]}]},{\"token\":\" pattern\",\"logprob\":"
              "-0.5,\"bytes\":[32,112,97,116,116,101,114,110],\"top_logprobs\":[{\"token\":"
              "\" pattern\",\"logprob\":-0.5,\"bytes\":[32,112,97,116,116,101,114,110]},"
              "{\"token\":\"ON\",\"logprob\":-1.5,\"bytes\":[79,78]}]}],\"refusal\":null}"));
    free(reply);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(gwh_fake, &m, p, 256, stop, 8));
    assert_true(m.logprobs);
    assert_int_equal(m.top_logprobs, 2);
}

static void completions_stream_with_usage(void **state)
{
    (void)state;
    fake_script s = {.step = 2};
    gwh_encode("Paris.", &s); /* 4 tokens */
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":[39,68],\"max_tokens\":3,\"stream\":true,"
                                 "\"stream_options\":{\"include_usage\":true}}",
                                 &reply, &body),
                     200);
    gwh_normalize(body);
    const char *head = "data: {\"id\":\"cmpl-X\",\"object\":\"text_completion\",\"created\":0,"
                       "\"model\":\"qwen35-tiny\",\"choices\":[{\"index\":0,";
    char expect[2048];
    /* max_tokens 3 cuts the fourth token: finish length. */
    snprintf(expect, sizeof expect,
             "%s\"text\":\"Par\",\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n"
             "%s\"text\":\"is\",\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n"
             "%s\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"length\"}],\"usage\":null}\n\n"
             "data: {\"id\":\"cmpl-X\",\"object\":\"text_completion\",\"created\":0,\"model\":"
             "\"qwen35-tiny\",\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":"
             "3,\"total_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":0},"
             "\"acceptance_length\":1.5}}\n\ndata: [DONE]\n\n",
             head, head, head);
    assert_string_equal(body, expect);
    free(reply);
}

static void completions_stream_logprobs_ride_on_their_text(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64, 493}, .n_tokens = 2};
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL,
                                 "{\"prompt\":\"x\",\"logprobs\":1,\"stream\":true}"
                                 "", &reply, &body),
                     200);
    gwh_normalize(body);
    const char *head = "data: {\"id\":\"cmpl-X\",\"object\":\"text_completion\",\"created\":0,"
                       "\"model\":\"qwen35-tiny\",\"choices\":[{\"index\":0,";
    char expect[2048];
    snprintf(expect, sizeof expect,
             "%s\"text\":\"a\",\"logprobs\":{\"tokens\":[\"a\"],\"token_logprobs\":[-0.25],"
             "\"top_logprobs\":[{\"a\":-0.25}],\"text_offset\":[0]},\"finish_reason\":null}]}\n\n"
             "%s\"text\":\" pattern\",\"logprobs\":{\"tokens\":[\" pattern\"],\"token_logprobs\":"
             "[-0.5],\"top_logprobs\":[{\" pattern\":-0.5}],\"text_offset\":[1]},"
             "\"finish_reason\":null}]}\n\n"
             "%s\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"stop\"}]}\n\n"
             "data: [DONE]\n\n",
             head, head, head);
    assert_string_equal(body, expect);
    free(reply);
}

/* --- failures ----------------------------------------------------------------------------------- */

static void error_in_the_middle_of_a_stream_ends_it_cleanly(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .error_after = 1, .tokens = {64, 65, 66}, .n_tokens = 3};
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL,
                                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\""
                                 ":"
                                 "true,\"chat_template_kwargs\":{\"enable_thinking\":false}}",
                                 &reply, &body),
                     200);
    gwh_normalize(body);
    const char *head = "data: {\"id\":\"chatcmpl-X\",\"object\":\"chat.completion.chunk\","
                       "\"created\":0,\"model\":\"qwen35-tiny\",\"choices\":[{\"index\":0,";
    char expect[2048];
    snprintf(expect, sizeof expect,
             "%s\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
             "\"finish_reason\":null}]}\n\n"
             "%s\"delta\":{\"content\":\"a\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
             "data: {\"error\":{\"message\":\"The generation failed: scripted failure\",\"type\":"
             "\"server_error\",\"param\":null,\"code\":\"internal_error\"}}\n\n"
             "data: [DONE]\n\n",
             head, head);
    assert_string_equal(body, expect);
    free(reply);
    /* The same failure without streaming is a 500 with the error body. */
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL,
                                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &reply,
                                 &body),
                     500);
    assert_string_equal(body, "{\"error\":{\"message\":\"The generation failed: scripted failure\","
                              "\"type\":\"server_error\",\"param\":null,\"code\":"
                              "\"internal_error\"}}");
    free(reply);
}

/* /v1/responses: the chat generation as Responses output items, whole and as typed events. */
static const char RESP_TOOL[] =
    "{\"type\":\"function\",\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"}}}}";

/* The response object after "created_at":0, with status, completed_at, output and usage. */
static void resp_object(char *out, size_t cap, const char *status, const char *completed,
                        const char *output, const char *usage)
{
    snprintf(out, cap,
             "{\"id\":\"resp_X\",\"object\":\"response\",\"created_at\":0,\"status\":\"%s\","
             "\"background\":false,\"completed_at\":%s,\"error\":null,\"incomplete_details\":"
             "null,\"instructions\":\"Be brief.\",\"max_output_tokens\":null,\"max_tool_calls\":"
             "null,\"metadata\":{\"k\":\"v\"},\"model\":\"qwen35-tiny\",\"output\":%s,"
             "\"parallel_tool_calls\":true,\"previous_response_id\":null,\"reasoning\":"
             "{\"effort\":null,\"summary\":null},\"store\":false,\"temperature\":1.0,\"text\":"
             "{\"format\":{\"type\":\"text\"}},\"tool_choice\":\"auto\",\"tools\":[%s],"
             "\"top_logprobs\":0,\"top_p\":1.0,\"truncation\":\"disabled\",\"usage\":%s,"
             "\"user\":null}",
             status, completed, output, RESP_TOOL, usage);
}

static void responses_items_whole_and_streamed(void **state)
{
    (void)state;
    fake_script s = {.step = 200, .cached = 2};
    gwh_encode("Let me see.\n</think>\n\nParis.\n<tool_call>\n<function=get_weather>\n"
               "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>", &s);
    /* the chat request the response stands for: its prompt is what verifyd must get */
    char req[2048];
    snprintf(req, sizeof req, "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
             "{\"role\":\"user\",\"content\":\"weather?\"}],\"tools\":[{\"type\":\"function\","
             "\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
             "\"properties\":{\"city\":{\"type\":\"string\"}}}}}]}");
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, req, &reply, &body), 200);
    free(reply);
    static uint32_t want[4096], got[4096], stop[8];
    msg_gen_start m;
    assert_true(fake_verifyd_last_start(gwh_fake, &m, want, 4096, stop, 8));
    const uint32_t n = m.n_prompt;

    static char expect[32768], obj[4096];
    const char *items =
        "[{\"id\":\"rs_X\",\"type\":\"reasoning\",\"summary\":[],\"content\":[{\"type\":"
        "\"reasoning_text\",\"text\":\"Let me see.\"}],\"status\":\"completed\"},"
        "{\"id\":\"msg_X\",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\","
        "\"content\":[{\"type\":\"output_text\",\"annotations\":[],\"text\":\"Paris.\"}]},"
        "{\"id\":\"fc_X\",\"type\":\"function_call\",\"status\":\"completed\",\"call_id\":"
        "\"call_X_0\",\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}]";
    char usage[512];
    snprintf(usage, sizeof usage,
             "{\"input_tokens\":%u,\"input_tokens_details\":{\"cached_tokens\":2},"
             "\"output_tokens\":%u,\"output_tokens_details\":{\"reasoning_tokens\":8},"
             "\"total_tokens\":%u,\"acceptance_length\":%u.0}",
             n, s.n_tokens, n + s.n_tokens, s.n_tokens);
    for (int stream = 0; stream < 2; stream++) {
        fake_verifyd_script(gwh_fake, &s);
        snprintf(req, sizeof req, "{\"input\":\"weather?\",\"instructions\":\"Be brief.\","
                 "\"metadata\":{\"k\":\"v\"},\"tools\":[%s]%s}", RESP_TOOL,
                 stream ? ",\"stream\":true" : "");
        int st = gwh_request("POST", "/v1/responses", NULL, req, &reply, &body);
        if (st != 200)
            fail_msg("%d %s", st, body);
        gwh_normalize(body);
        assert_true(fake_verifyd_last_start(gwh_fake, &m, got, 4096, stop, 8));
        assert_int_equal(m.n_prompt, n);
        assert_memory_equal(got, want, n * sizeof *got);
        resp_object(obj, sizeof obj, "completed", "0", items, usage);
        if (!stream) {
            assert_string_equal(body, obj);
            free(reply);
            continue;
        }
        assert_non_null(strstr(reply, "Content-Type: text/event-stream"));
        static char start[4096];
        resp_object(start, sizeof start, "in_progress", "null", "[]", "null");
        snprintf(expect, sizeof expect,
                 "event: response.created\ndata: {\"type\":\"response.created\","
                 "\"sequence_number\":0,\"response\":%s}\n\n"
                 "event: response.in_progress\ndata: {\"type\":\"response.in_progress\","
                 "\"sequence_number\":1,\"response\":%s}\n\n"
                 "event: response.output_item.added\ndata: {\"type\":"
                 "\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,"
                 "\"item\":{\"id\":\"rs_X\",\"type\":\"reasoning\",\"summary\":[],\"content\":[],"
                 "\"status\":\"in_progress\"}}\n\n"
                 "event: response.content_part.added\ndata: {\"type\":"
                 "\"response.content_part.added\",\"sequence_number\":3,\"item_id\":\"rs_X\","
                 "\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"reasoning_text\","
                 "\"text\":\"\"}}\n\n"
                 "event: response.reasoning_text.delta\ndata: {\"type\":"
                 "\"response.reasoning_text.delta\",\"sequence_number\":4,\"item_id\":\"rs_X\","
                 "\"output_index\":0,\"content_index\":0,\"delta\":\"Let me see.\"}\n\n"
                 "event: response.reasoning_text.done\ndata: {\"type\":"
                 "\"response.reasoning_text.done\",\"sequence_number\":5,\"item_id\":\"rs_X\","
                 "\"output_index\":0,\"content_index\":0,\"text\":\"Let me see.\"}\n\n"
                 "event: response.content_part.done\ndata: {\"type\":"
                 "\"response.content_part.done\",\"sequence_number\":6,\"item_id\":\"rs_X\","
                 "\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"reasoning_text\","
                 "\"text\":\"Let me see.\"}}\n\n"
                 "event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\","
                 "\"sequence_number\":7,\"output_index\":0,\"item\":{\"id\":\"rs_X\",\"type\":"
                 "\"reasoning\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":"
                 "\"Let me see.\"}],\"status\":\"completed\"}}\n\n"
                 "event: response.output_item.added\ndata: {\"type\":"
                 "\"response.output_item.added\",\"sequence_number\":8,\"output_index\":1,"
                 "\"item\":{\"id\":\"msg_X\",\"type\":\"message\",\"status\":\"in_progress\","
                 "\"role\":\"assistant\",\"content\":[]}}\n\n"
                 "event: response.content_part.added\ndata: {\"type\":"
                 "\"response.content_part.added\",\"sequence_number\":9,\"item_id\":\"msg_X\","
                 "\"output_index\":1,\"content_index\":0,\"part\":{\"type\":\"output_text\","
                 "\"annotations\":[],\"text\":\"\"}}\n\n"
                 "event: response.output_text.delta\ndata: {\"type\":"
                 "\"response.output_text.delta\",\"sequence_number\":10,\"item_id\":\"msg_X\","
                 "\"output_index\":1,\"content_index\":0,\"delta\":\"Paris.\",\"logprobs\":[]}\n\n"
                 "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\","
                 "\"sequence_number\":11,\"item_id\":\"msg_X\",\"output_index\":1,"
                 "\"content_index\":0,\"text\":\"Paris.\",\"logprobs\":[]}\n\n"
                 "event: response.content_part.done\ndata: {\"type\":"
                 "\"response.content_part.done\",\"sequence_number\":12,\"item_id\":\"msg_X\","
                 "\"output_index\":1,\"content_index\":0,\"part\":{\"type\":\"output_text\","
                 "\"annotations\":[],\"text\":\"Paris.\"}}\n\n"
                 "event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\","
                 "\"sequence_number\":13,\"output_index\":1,\"item\":{\"id\":\"msg_X\",\"type\":"
                 "\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":"
                 "[{\"type\":\"output_text\",\"annotations\":[],\"text\":\"Paris.\"}]}}\n\n"
                 "event: response.output_item.added\ndata: {\"type\":"
                 "\"response.output_item.added\",\"sequence_number\":14,\"output_index\":2,"
                 "\"item\":{\"id\":\"fc_X\",\"type\":\"function_call\",\"status\":\"in_progress\","
                 "\"call_id\":\"call_X_0\",\"name\":\"get_weather\",\"arguments\":\"\"}}\n\n"
                 "event: response.function_call_arguments.delta\ndata: {\"type\":"
                 "\"response.function_call_arguments.delta\",\"sequence_number\":15,\"item_id\":"
                 "\"fc_X\",\"output_index\":2,\"delta\":\"{\\\"city\\\": \\\"Paris\\\"\"}\n\n"
                 "event: response.function_call_arguments.delta\ndata: {\"type\":"
                 "\"response.function_call_arguments.delta\",\"sequence_number\":16,\"item_id\":"
                 "\"fc_X\",\"output_index\":2,\"delta\":\"}\"}\n\n"
                 "event: response.function_call_arguments.done\ndata: {\"type\":"
                 "\"response.function_call_arguments.done\",\"sequence_number\":17,\"item_id\":"
                 "\"fc_X\",\"output_index\":2,\"name\":\"get_weather\",\"arguments\":"
                 "\"{\\\"city\\\": \\\"Paris\\\"}\"}\n\n"
                 "event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\","
                 "\"sequence_number\":18,\"output_index\":2,\"item\":{\"id\":\"fc_X\",\"type\":"
                 "\"function_call\",\"status\":\"completed\",\"call_id\":\"call_X_0\",\"name\":"
                 "\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}\n\n"
                 "event: response.completed\ndata: {\"type\":\"response.completed\","
                 "\"sequence_number\":19,\"response\":%s}\n\n",
                 start, start, obj);
        assert_string_equal(body, expect);
        free(reply);
    }
}

/* GET /v1/responses/<id>/input_items: the kept request's input items (each with an id and a
 * status, a message's text as parts), newest first, pages by the query string (percent-decoded,
 * include[] accepted); DELETE there is 405, an unknown id 404, a bad limit 400. */
static void responses_input_items_are_listed(void **state)
{
    (void)state;
    assert_int_equal(rstore_init(&gwh_g.responses, 8, 1 << 20), TD_OK);
    fake_script s = {.step = 1, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/responses", NULL,
                                 "{\"input\":[{\"role\":\"user\",\"content\":\"weather?\"},"
                                 "{\"type\":\"function_call\",\"id\":\"fc_given\",\"call_id\":"
                                 "\"c1\",\"name\":\"get_weather\",\"arguments\":\"{}\"},"
                                 "{\"type\":\"function_call_output\",\"call_id\":\"c1\","
                                 "\"output\":\"sunny\"},{\"type\":\"message\",\"role\":"
                                 "\"assistant\",\"content\":\"Sunny.\",\"status\":"
                                 "\"incomplete\"},{\"role\":\"user\",\"content\":[{\"type\":"
                                 "\"input_text\",\"text\":\"thanks\"}]}]}", &reply, &body),
                     200);
    char path[256], id[64];
    const char *at = strstr(body, "\"id\":\"resp_");
    assert_non_null(at);
    snprintf(id, sizeof id, "%.*s", (int)strcspn(at + 6, "\""), at + 6);
    free(reply);

    snprintf(path, sizeof path, "/v1/responses/%s/input_items", id);
    assert_int_equal(gwh_request("GET", path, NULL, NULL, &reply, &body), 200);
    char first[64], last[64];
    at = strstr(body, "\"first_id\":\"");
    assert_non_null(at);
    snprintf(first, sizeof first, "%.*s", (int)strcspn(at + 12, "\""), at + 12);
    at = strstr(body, "\"last_id\":\"");
    assert_non_null(at);
    snprintf(last, sizeof last, "%.*s", (int)strcspn(at + 11, "\""), at + 11);
    gwh_normalize(body);
    const char *user2 = "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":"
                        "\"thanks\"}],\"type\":\"message\",\"id\":\"msg_X\",\"status\":"
                        "\"completed\"}";
    const char *user1 = "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":"
                        "\"weather?\"}],\"type\":\"message\",\"id\":\"msg_X\",\"status\":"
                        "\"completed\"}";
    const char *call = "{\"type\":\"function_call\",\"id\":\"fc_given\",\"call_id\":\"c1\","
                       "\"name\":\"get_weather\",\"arguments\":\"{}\",\"status\":\"completed\"}";
    const char *output = "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":"
                         "\"sunny\",\"id\":\"fco_X\",\"status\":\"completed\"}";
    const char *assistant = "{\"type\":\"message\",\"role\":\"assistant\",\"content\":"
                            "[{\"type\":\"output_text\",\"text\":\"Sunny.\",\"annotations\":[]}],"
                            "\"status\":\"incomplete\",\"id\":\"msg_X\"}";
    static char want[4096];
    snprintf(want, sizeof want, "{\"object\":\"list\",\"data\":[%s,%s,%s,%s,%s],\"first_id\":"
             "\"msg_X\",\"last_id\":\"msg_X\",\"has_more\":false}", user2, assistant, output,
             call, user1);
    assert_string_equal(body, want);
    free(reply);

    /* oldest first, two at a time, after the first */
    snprintf(path, sizeof path, "/v1/responses/%s/input_items?order=asc&limit=2&after=%s"
             "&include%%5B%%5D=message.output_text.logprobs", id, last);
    assert_int_equal(gwh_request("GET", path, NULL, NULL, &reply, &body), 200);
    gwh_normalize(body);
    snprintf(want, sizeof want, "{\"object\":\"list\",\"data\":[%s,%s],\"first_id\":"
             "\"fc_given\",\"last_id\":\"fco_X\",\"has_more\":true}", call, output);
    assert_string_equal(body, want);
    free(reply);
    snprintf(path, sizeof path, "/v1/responses/%s/input_items?limit=1&before=%s", id, last);
    assert_int_equal(gwh_request("GET", path, NULL, NULL, &reply, &body), 200);
    gwh_normalize(body);
    snprintf(want, sizeof want, "{\"object\":\"list\",\"data\":[%s],\"first_id\":\"fc_given\","
             "\"last_id\":\"fc_given\",\"has_more\":true}", call);
    assert_string_equal(body, want);
    free(reply);

    snprintf(path, sizeof path, "/v1/responses/%s/input_items?limit=0", id);
    assert_int_equal(gwh_request("GET", path, NULL, NULL, &reply, &body), 400);
    assert_string_equal(body, "{\"error\":{\"message\":\"Invalid value for 'limit': expected an "
                              "integer from 1 to 100, got '0'.\",\"type\":"
                              "\"invalid_request_error\",\"param\":\"limit\",\"code\":"
                              "\"invalid_value\"}}");
    free(reply);
    snprintf(path, sizeof path, "/v1/responses/%s/input_items", id);
    assert_int_equal(gwh_request("DELETE", path, NULL, NULL, &reply, &body), 405);
    assert_non_null(strstr(reply, "Allow: GET, HEAD\r\n"));
    free(reply);
    snprintf(path, sizeof path, "/v1/responses/%s/items", id);
    assert_int_equal(gwh_request("GET", path, NULL, NULL, &reply, &body), 404);
    free(reply);
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    assert_int_equal(gwh_request("DELETE", path, NULL, NULL, &reply, &body), 200);
    free(reply);
    snprintf(path, sizeof path, "/v1/responses/%s/input_items", id);
    assert_int_equal(gwh_request("GET", path, NULL, NULL, &reply, &body), 404);
    char msg[256];
    snprintf(msg, sizeof msg, "{\"error\":{\"message\":\"Response with id '%s' not found.\","
             "\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"not_found\"}}", id);
    assert_string_equal(body, msg);
    free(reply);
    rstore_free(gwh_g.responses);
    gwh_g.responses = NULL;
}

/* The id ("resp_...") in a response body, into id[cap]. */
static void bg_id_of(const char *body, char *id, size_t cap)
{
    const char *at = strstr(body, "\"id\":\"resp_");
    assert_non_null(at);
    snprintf(id, cap, "%.*s", (int)strcspn(at + 6, "\""), at + 6);
}

/* GET /v1/responses/<id> until its status is want (fails after 5 s); its body into *reply. */
static void bg_wait_status(const char *id, const char *want, char **reply, char **body)
{
    char path[128], needle[64];
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    snprintf(needle, sizeof needle, "\"status\":\"%s\"", want);
    for (int i = 0; i < 500; i++) {
        assert_int_equal(gwh_request("GET", path, NULL, NULL, reply, body), 200);
        if (strstr(*body, needle))
            return;
        free(*reply);
        usleep(10000);
    }
    assert_int_equal(gwh_request("GET", path, NULL, NULL, reply, body), 200);
    fail_msg("response %s never became %s: %s", id, want, *body);
}

/* The fake's script s, then POST body (a background request): its response's id in id. */
static void bg_post(const fake_script *s, const char *body, char *id, size_t cap)
{
    char *reply, *out;
    fake_verifyd_script(gwh_fake, s);
    assert_int_equal(gwh_request("POST", "/v1/responses", NULL, body, &reply, &out), 200);
    bg_id_of(out, id, cap);
    free(reply);
}

/* "background": true answers at once with the response queued and runs it on: while verifyd
 * is busy it stays queued and a cancel ends it before it starts; a cancel while it runs keeps
 * the output so far; more than --responses-background running are refused; a streamed one's
 * events come again, byte for byte, from GET ?stream=true&starting_after=N; DELETE stops one. */
static void responses_run_in_the_background(void **state)
{
    (void)state;
    assert_int_equal(rstore_init(&gwh_g.responses, 16, 1 << 20), TD_OK);
    assert_int_equal(bg_init(&gwh_g.background, &gwh_g, 2, 1 << 20), TD_OK);
    char *reply, *body, id[64], path[160];
    const char *req = "{\"input\":\"hi\",\"background\":true}";

    /* queued behind a busy verifyd, cancelled there: never started */
    fake_script s = {.step = 1, .busy = 1000000};
    gwh_encode("Hello there, friend.", &s);
    fake_verifyd_script(gwh_fake, &s);
    const int starts = fake_verifyd_starts(gwh_fake);
    assert_int_equal(gwh_request("POST", "/v1/responses", NULL, req, &reply, &body), 200);
    bg_id_of(body, id, sizeof id);
    assert_non_null(strstr(body, "\"status\":\"queued\",\"background\":true,"));
    assert_non_null(strstr(body, "\"output\":[],"));
    assert_non_null(strstr(body, "\"usage\":null"));
    free(reply);
    bg_wait_status(id, "queued", &reply, &body);
    free(reply);
    snprintf(path, sizeof path, "/v1/responses/%s/cancel", id);
    for (int k = 0; k < 2; k++) { /* the second cancel answers the same */
        const int st = gwh_request("POST", path, NULL, NULL, &reply, &body);
        if (st != 200)
            fail_msg("cancel: %d %s", st, body);
        assert_non_null(strstr(body, "\"status\":\"cancelled\",\"background\":true,"));
        assert_non_null(strstr(body, "\"output\":[],"));
        free(reply);
    }
    assert_int_equal(fake_verifyd_starts(gwh_fake), starts);
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    assert_int_equal(gwh_request("GET", path, NULL, NULL, &reply, &body), 200);
    assert_non_null(strstr(body, "\"status\":\"cancelled\""));
    free(reply);

    /* cancelled while it runs (a token each 20 ms): the output so far, the generation
     * cancelled at verifyd */
    s = (fake_script){.step = 1, .delay_ms = 20};
    static char words[1501];
    for (size_t i = 0; i + 5 < sizeof words; i += 5)
        memcpy(words + i, "word ", 6);
    s.n_tokens = (uint32_t)gwh_tokens(words, 0, s.tokens, FAKE_TOKENS_MAX);
    assert_true(s.n_tokens >= 300 && s.n_tokens <= FAKE_TOKENS_MAX);
    fake_verifyd_script(gwh_fake, &s);
    const int cancels = fake_verifyd_cancels(gwh_fake);
    assert_int_equal(gwh_request("POST", "/v1/responses", NULL, req, &reply, &body), 200);
    bg_id_of(body, id, sizeof id);
    free(reply);
    bg_wait_status(id, "in_progress", &reply, &body);
    assert_non_null(strstr(body, "\"output\":[],"));
    free(reply);
    usleep(200000);
    snprintf(path, sizeof path, "/v1/responses/%s/cancel", id);
    assert_int_equal(gwh_request("POST", path, NULL, NULL, &reply, &body), 200);
    assert_non_null(strstr(body, "\"status\":\"cancelled\""));
    /* the template opens a reasoning block: the words so far are its text */
    assert_non_null(strstr(body, "\"type\":\"reasoning_text\",\"text\":\"word word"));
    assert_non_null(strstr(body, "\"status\":\"incomplete\"}]"));
    assert_non_null(strstr(body, "\"output_tokens\":"));
    assert_null(strstr(body, "\"output_tokens\":0,"));
    free(reply);
    assert_true(fake_verifyd_cancels(gwh_fake) > cancels);

    /* two running (verifyd sends nothing after the tokens), a third refused; DELETE stops
     * them and they stay unknown */
    s = (fake_script){.step = 1, .hang = true};
    gwh_encode("Hi.", &s);
    fake_verifyd_script(gwh_fake, &s);
    char ids[2][64];
    for (int k = 0; k < 2; k++) {
        assert_int_equal(gwh_request("POST", "/v1/responses", NULL, req, &reply, &body), 200);
        bg_id_of(body, ids[k], sizeof ids[k]);
        free(reply);
    }
    assert_int_equal(gwh_request("POST", "/v1/responses", NULL, req, &reply, &body), 429);
    assert_string_equal(body, "{\"error\":{\"message\":\"2 background responses are running "
                              "already, as many as this gateway runs at once "
                              "(--responses-background); try again later.\",\"type\":"
                              "\"invalid_request_error\",\"param\":\"background\",\"code\":"
                              "\"too_many_background_responses\"}}");
    free(reply);
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "/v1/responses/%s", ids[k]);
        assert_int_equal(gwh_request("DELETE", path, NULL, NULL, &reply, &body), 200);
        free(reply);
    }
    bg_drain(gwh_g.background);
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "/v1/responses/%s", ids[k]);
        assert_int_equal(gwh_request("GET", path, NULL, NULL, &reply, &body), 404);
        free(reply);
    }

    /* streamed: created and queued, in_progress, the foreground stream's events; read again
     * after any sequence number */
    s = (fake_script){.step = 2};
    gwh_encode("Hello there, friend.", &s);
    fake_verifyd_script(gwh_fake, &s);
    assert_int_equal(gwh_request("POST", "/v1/responses", NULL,
                                 "{\"input\":\"hi\",\"background\":true,\"stream\":true}",
                                 &reply, &body),
                     200);
    bg_id_of(body, id, sizeof id);
    const char *events[] = {"response.created", "response.queued", "response.in_progress",
                            "response.output_item.added", "response.content_part.added"};
    const char *at = body;
    for (size_t k = 0; k < sizeof events / sizeof *events; k++) {
        char want[96];
        snprintf(want, sizeof want, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%zu,",
                 events[k], events[k], k);
        assert_true(strncmp(at, want, strlen(want)) == 0);
        at = strstr(at, "\n\n") + 2;
    }
    assert_non_null(strstr(body, "event: response.completed\n"));
    assert_non_null(strstr(body, "\"text\":\"Hello there, friend.\""));
    char *whole = strdup(body);
    free(reply);
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true", id);
    assert_int_equal(gwh_request("GET", path, NULL, NULL, &reply, &body), 200);
    assert_string_equal(body, whole);
    free(reply);
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true&starting_after=2", id);
    assert_int_equal(gwh_request("GET", path, NULL, NULL, &reply, &body), 200);
    const char *third = strstr(strstr(strstr(whole, "\n\n") + 2, "\n\n") + 2, "\n\n") + 2;
    assert_string_equal(body, third);
    free(reply);
    free(whole);
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true&starting_after="
             "9223372036854775807", id);
    assert_int_equal(gwh_request("GET", path, NULL, NULL, &reply, &body), 200);
    assert_string_equal(body, "");
    free(reply);
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true&starting_after=-1", id);
    assert_int_equal(gwh_request("GET", path, NULL, NULL, &reply, &body), 400);
    free(reply);
    snprintf(path, sizeof path, "/v1/responses/%s/cancel", id);
    assert_int_equal(gwh_request("POST", path, NULL, NULL, &reply, &body), 400);
    assert_non_null(strstr(body, "its status is 'completed'"));
    free(reply);
    assert_int_equal(gwh_request("GET", path, NULL, NULL, &reply, &body), 405);
    free(reply);

    /* queued while verifyd loads, run once it is ready */
    fake_verifyd_set_ready(gwh_fake, false, "loading weights");
    gwh_wait_health(503);
    s = (fake_script){.step = 1};
    gwh_encode("Hello there, friend.", &s);
    bg_post(&s, req, id, sizeof id);
    usleep(300000);
    bg_wait_status(id, "queued", &reply, &body);
    free(reply);
    fake_verifyd_set_ready(gwh_fake, true, NULL);
    gwh_wait_health(200);
    bg_wait_status(id, "completed", &reply, &body);
    assert_non_null(strstr(body, "\"text\":\"Hello there, friend.\""));
    free(reply);

    /* one left running (and one queued behind a busy verifyd) when the gateway stops: both
     * end at once */
    s = (fake_script){.step = 1, .hang = true};
    gwh_encode("Hi.", &s);
    bg_post(&s, req, id, sizeof id);
    bg_wait_status(id, "in_progress", &reply, &body);
    free(reply);
    s.busy = 1000000;
    fake_verifyd_script(gwh_fake, &s);
    assert_int_equal(gwh_request("POST", "/v1/responses", NULL, req, &reply, &body), 200);
    free(reply);
    const double t0 = now_ms();
    __atomic_store_n(&gwh_g.stopping, true, __ATOMIC_SEQ_CST);
    bg_drain(gwh_g.background);
    __atomic_store_n(&gwh_g.stopping, false, __ATOMIC_SEQ_CST);
    assert_true(now_ms() - t0 < 1000);
    size_t running, listed;
    bg_usage(gwh_g.background, &running, &listed);
    assert_int_equal(running, 0);
    bg_free(gwh_g.background);

    /* events past the byte budget are not kept once the job ends; its response is */
    assert_int_equal(bg_init(&gwh_g.background, &gwh_g, 2, 1), TD_OK);
    s = (fake_script){.step = 1};
    gwh_encode("Hello there, friend.", &s);
    bg_post(&s, req, id, sizeof id);
    bg_wait_status(id, "completed", &reply, &body);
    free(reply);
    bg_drain(gwh_g.background);
    bg_usage(gwh_g.background, &running, &listed);
    assert_int_equal(listed, 0);
    snprintf(path, sizeof path, "/v1/responses/%s?stream=true", id);
    assert_int_equal(gwh_request("GET", path, NULL, NULL, &reply, &body), 400);
    assert_non_null(strstr(body, "are not kept"));
    free(reply);
    bg_free(gwh_g.background);
    gwh_g.background = NULL;
    rstore_free(gwh_g.responses);
    gwh_g.responses = NULL;
}

/* POST /v1/responses/input_tokens: the count of the prompt the body's chat request has, as
 * /tokenize counts that chat; a bad body is the Responses request's 400; GET is 405. */
static void responses_input_tokens_are_counted(void **state)
{
    (void)state;
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/tokenize", NULL,
                                 "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                                 "{\"role\":\"user\",\"content\":\"weather?\"}],\"tools\":[{"
                                 "\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                                 "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":"
                                 "{\"type\":\"string\"}}}}}]}", &reply, &body), 200);
    const char *count = strstr(body, "\"count\":");
    assert_non_null(count);
    const long n = strtol(count + 8, NULL, 10);
    assert_true(n > 20);
    free(reply);
    char req[1024], want[128];
    snprintf(req, sizeof req, "{\"input\":\"weather?\",\"instructions\":\"Be brief.\","
             "\"tools\":[%s]}", RESP_TOOL);
    assert_int_equal(gwh_request("POST", "/v1/responses/input_tokens", NULL, req, &reply, &body),
                     200);
    snprintf(want, sizeof want, "{\"object\":\"response.input_tokens\",\"input_tokens\":%ld}", n);
    assert_string_equal(body, want);
    free(reply);
    assert_int_equal(gwh_request("POST", "/v1/responses/input_tokens", NULL,
                                 "{\"input\":[]}", &reply, &body), 400);
    assert_non_null(strstr(body, "\"param\":\"input\""));
    free(reply);
    assert_int_equal(gwh_request("GET", "/v1/responses/input_tokens", NULL, NULL, &reply, &body),
                     405);
    assert_non_null(strstr(reply, "Allow: POST\r\n"));
    free(reply);
}

/* A failure in the middle: the error event, then response.failed with the items finished. */
static void responses_stream_failing_midway(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .error_after = 1, .tokens = {64, 65, 66}, .n_tokens = 3};
    fake_verifyd_script(gwh_fake, &s);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/responses", NULL,
                                 "{\"input\":\"hi\",\"stream\":true,\"reasoning\":{\"effort\":"
                                 "\"none\"}}", &reply, &body), 200);
    gwh_normalize(body);
    const char *tail =
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\","
        "\"sequence_number\":4,\"item_id\":\"msg_X\",\"output_index\":0,\"content_index\":0,"
        "\"delta\":\"a\",\"logprobs\":[]}\n\n"
        "event: error\ndata: {\"type\":\"error\",\"sequence_number\":5,\"code\":"
        "\"internal_error\",\"message\":\"The generation failed: scripted failure\",\"param\":"
        "null}\n\n"
        "event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":6,"
        "\"response\":{\"id\":\"resp_X\",\"object\":\"response\",\"created_at\":0,\"status\":"
        "\"failed\",\"background\":false,\"completed_at\":null,\"error\":{\"code\":"
        "\"internal_error\",\"message\":\"The generation failed: scripted failure\"},";
    const char *at = strstr(body, "event: response.output_text.delta");
    assert_non_null(at);
    assert_memory_equal(at, tail, strlen(tail));
    assert_non_null(strstr(at, "\"output\":[],"));
    assert_non_null(strstr(at, "\"usage\":null,\"user\":null}}\n\n"));
    assert_int_equal(strlen(strstr(at, "\"usage\":null,\"user\":null}}\n\n")),
                     strlen("\"usage\":null,\"user\":null}}\n\n")); /* the end: no [DONE] */
    free(reply);
    /* not streamed: a 500 with the error body, as a chat request gets */
    fake_verifyd_script(gwh_fake, &s);
    assert_int_equal(gwh_request("POST", "/v1/responses", NULL, "{\"input\":\"hi\"}", &reply,
                                 &body), 500);
    assert_string_equal(body, "{\"error\":{\"message\":\"The generation failed: scripted failure\","
                              "\"type\":\"server_error\",\"param\":null,\"code\":"
                              "\"internal_error\"}}");
    free(reply);
}

static void busy_verifyd_is_waited_for(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .busy = 3, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(gwh_fake, &s);
    int starts = fake_verifyd_starts(gwh_fake);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL, "{\"prompt\":\"x\"}", &reply,
                                 &body),
                     200);
    assert_non_null(strstr(body, "\"text\":\"a\""));
    free(reply);
    assert_int_equal(fake_verifyd_starts(gwh_fake), starts + 1);
}

static void prompt_longer_than_the_context_is_400_with_the_numbers(void **state)
{
    (void)state;
    char req[2048] = "{\"messages\":[{\"role\":\"user\",\"content\":\"";
    for (int i = 0; i < 60; i++)
        strcat(req, "word ");
    strcat(req, "\"}],\"max_tokens\":1000}");
    char msgs[1024] = "[{\"role\":\"user\",\"content\":\"";
    for (int i = 0; i < 60; i++)
        strcat(msgs, "word ");
    strcat(msgs, "\"}]");
    uint32_t prompt[512];
    size_t n = gwh_prompt(msgs, false, prompt);
    char *reply, *body;
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, req, &reply, &body), 400);
    char expect[1024];
    snprintf(expect, sizeof expect,
             "{\"error\":{\"message\":\"This model's maximum context length is 1024 tokens. "
             "However, you requested %zu tokens (%zu in the messages, 1000 in the completion). "
             "Please reduce the length of the messages or completion.\",\"type\":"
             "\"invalid_request_error\",\"param\":\"messages\",\"code\":"
             "\"context_length_exceeded\"}}",
             n + 1000, n);
    assert_string_equal(body, expect);
    free(reply);
    /* verifyd refusing a start for its context is the same kind of error. */
    fake_script s = {.start_error = TD_ERANGE};
    fake_verifyd_script(gwh_fake, &s);
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL, "{\"prompt\":\"x\"}", &reply,
                                 &body),
                     400);
    assert_string_equal(body, "{\"error\":{\"message\":\"prompt of too many tokens for the "
                              "context\",\"type\":\"invalid_request_error\",\"param\":\"prompt\","
                              "\"code\":\"context_length_exceeded\"}}");
    free(reply);
}

static void client_disconnect_cancels_the_generation(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .hang = true, .tokens = {64, 65}, .n_tokens = 2};
    fake_verifyd_script(gwh_fake, &s);
    int cancels = fake_verifyd_cancels(gwh_fake);
    int fd = gwh_connect();
    const char *req = "{\"prompt\":\"x\",\"stream\":true}";
    gwh_send(fd, "POST", "/v1/completions", NULL, req, strlen(req));
    char buf[4096];
    size_t got = 0;
    while (!strstr(buf, "\"text\":\"b\"") && got < sizeof buf - 1) {
        ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
        assert_true(r > 0);
        got += (size_t)r;
        buf[got] = 0;
    }
    close(fd);
    for (int i = 0; i < 100 && fake_verifyd_cancels(gwh_fake) == cancels; i++)
        sleep_ms(20);
    assert_int_equal(fake_verifyd_cancels(gwh_fake), cancels + 1);
}

static void client_leaving_a_whole_request_cancels_it_too(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .hang = true, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(gwh_fake, &s);
    int cancels = fake_verifyd_cancels(gwh_fake);
    int starts = fake_verifyd_starts(gwh_fake);
    int fd = gwh_connect();
    const char *req = "{\"prompt\":\"x\"}";
    gwh_send(fd, "POST", "/v1/completions", NULL, req, strlen(req));
    for (int i = 0; i < 100 && fake_verifyd_starts(gwh_fake) == starts; i++)
        sleep_ms(10);
    close(fd);
    for (int i = 0; i < 100 && fake_verifyd_cancels(gwh_fake) == cancels; i++)
        sleep_ms(20);
    assert_int_equal(fake_verifyd_cancels(gwh_fake), cancels + 1);
}

static void api_key_is_required_when_set(void **state)
{
    (void)state;
    gwh_g.cfg.api_key = "sekret";
    char *reply, *body;
    assert_int_equal(gwh_request("GET", "/v1/models", NULL, NULL, &reply, &body), 401);
    assert_non_null(strstr(reply, "WWW-Authenticate: Bearer"));
    assert_string_equal(body, "{\"error\":{\"message\":\"Missing API key: send 'Authorization: "
                              "Bearer <key>'.\",\"type\":\"authentication_error\",\"param\":null,"
                              "\"code\":\"invalid_api_key\"}}");
    free(reply);
    assert_int_equal(gwh_request("GET", "/v1/models", "Authorization: Bearer sekreT\r\n", NULL,
                                 &reply,
                                 &body),
                     401);
    assert_non_null(strstr(body, "Incorrect API key provided."));
    free(reply);
    assert_int_equal(gwh_request("GET", "/v1/models", "Authorization: Bearer sekret\r\n", NULL,
                                 &reply,
                                 &body),
                     200);
    free(reply);
    assert_int_equal(gwh_request("GET", "/health", NULL, NULL, &reply, &body), 200);
    assert_string_equal(body, "{\"status\":\"ok\"}");
    free(reply);
    gwh_g.cfg.api_key = NULL;
}

static void http_errors_have_openai_bodies(void **state)
{
    (void)state;
    char *reply, *body;
    assert_int_equal(gwh_request("GET", "/v2/nothing", NULL, NULL, &reply, &body), 404);
    assert_string_equal(body, "{\"error\":{\"message\":\"Unknown request URL: /v2/nothing.\","
                              "\"type\":\"invalid_request_error\",\"param\":null,\"code\":"
                              "\"not_found\"}}");
    free(reply);
    assert_int_equal(gwh_request("DELETE", "/v1/completions", NULL, NULL, &reply, &body), 405);
    assert_non_null(strstr(reply, "Allow: POST"));
    free(reply);
    char big[8192];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, big, &reply, &body), 413);
    assert_string_equal(body, "{\"error\":{\"message\":\"The request body is larger than this "
                              "server accepts (4096 bytes).\",\"type\":\"invalid_request_error\","
                              "\"param\":null,\"code\":\"request_too_large\"}}");
    free(reply);
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL, "{\"messages\":", &reply,
                                 &body),
                     400);
    assert_non_null(strstr(body, "\"code\":\"invalid_json\""));
    free(reply);
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL,
                                 "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}"
                                 "", &reply,
                                 &body),
                     400);
    assert_non_null(strstr(body, "\"code\":\"invalid_json\""));
    free(reply);
    assert_int_equal(gwh_request("POST", "/v1/chat/completions", NULL,
                                 "{\"model\":\"gpt-4\",\"messages\":[{\"role\":\"user\",\"content\""
                                 ":"
                                 "\"x\"}]}",
                                 &reply, &body),
                     400);
    assert_string_equal(body, "{\"error\":{\"message\":\"The model 'gpt-4' does not exist; this "
                              "server serves 'qwen35-tiny'.\",\"type\":\"invalid_request_error\","
                              "\"param\":\"model\",\"code\":\"model_not_found\"}}");
    free(reply);
    /* The server is unharmed: a good request still works. */
    fake_script s = {.step = 1, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(gwh_fake, &s);
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL, "{\"prompt\":\"x\"}", &reply,
                                 &body),
                     200);
    free(reply);
}

static void metrics_show_gateway_and_verifyd_numbers(void **state)
{
    (void)state;
    char *reply, *body;
    assert_int_equal(gwh_request("GET", "/metrics", NULL, NULL, &reply, &body), 200);
    assert_non_null(strstr(reply, "Content-Type: text/plain; version=0.0.4"));
    const char *lines[] = {
        "\ntandem_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} ",
        "\ntandem_requests_total{endpoint=\"/v1/completions\",status=\"405\"} 1\n",
        /* /v2/nothing and /v1/responses/<id>/items, before */
        "\ntandem_requests_total{endpoint=\"other\",status=\"404\"} 2\n",
        "\ntandem_verifyd_up 1\n",
        "\ntandem_verifyd_ready 1\n",
        /* the fake's histogram: 5 steps of 1 token, 2 of 2 */
        "\ntandem_acceptance_length_bucket{le=\"1\"} 5\n",
        "\ntandem_acceptance_length_bucket{le=\"2\"} 7\n",
        "\ntandem_acceptance_length_bucket{le=\"+Inf\"} 7\n",
        "\ntandem_acceptance_length_sum 9\n",
        "\ntandem_verify_seconds_total 3.000000\n",
        "\ntandem_draft_seconds_total 1.500000\n",
        "\ntandem_decode_tokens_per_second 2.000\n",
        "\ntandem_draftd_restarts_total 1\n",
        "\ntandem_graph_recordings_total 3\n",
        "\ntandem_graph_replays_total 40\n",
        "\ntandem_graph_direct_passes_total 4\n",
        "\ntandem_queue_depth 1\n",
        "\ntandem_requests_running 0\n",
        "\ntandem_prediction_tokens_total{outcome=\"accepted\"} ",
        "\ntandem_tool_calls_total ",
        "\ntandem_responses_kept 0\n", /* the harness keeps none */
        "\ntandem_responses_kept_bytes 0\n",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        if (!strstr(body, lines[i]))
            fail_msg("missing in /metrics: %s", lines[i] + 1);
    free(reply);
}

/* Opens a completions stream on a generation that never ends and returns the socket. */
static int open_hanging_stream(void)
{
    fake_script s = {.step = 1, .hang = true, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(gwh_fake, &s);
    int fd = gwh_connect();
    const char *req = "{\"prompt\":\"x\",\"stream\":true}";
    gwh_send(fd, "POST", "/v1/completions", NULL, req, strlen(req));
    return fd;
}

static void verifyd_restart_between_polls_ends_open_streams(void **state)
{
    (void)state;
    int fd = open_hanging_stream();
    sleep_ms(300);
    /* A new verifyd process knows nothing of the old one's generations. */
    fake_verifyd_set_pid(gwh_fake, 2222);
    char *reply, *body;
    assert_int_equal(gwh_read(fd, &reply, &body), 200);
    assert_non_null(strstr(body, "\"text\":\"a\""));
    assert_non_null(strstr(body, "data: {\"error\":{\"message\":\"The generation failed: verifyd "
                                 "restarted during the generation\",\"type\":\"server_error\","
                                 "\"param\":null,\"code\":\"backend_unavailable\"}}\n\n"
                                 "data: [DONE]\n\n"));
    free(reply);
}

/* A verifyd that cannot run yet (kvd refused its pools) says why: /health and new requests
 * answer 503 with that reason; all is well once it is ready again. */
static void not_ready_verifyd_says_why(void **state)
{
    (void)state;
    static const char why[] = "kvd attach: the pools do not fit the GPU (\"tight\")";
    fake_verifyd_set_ready(gwh_fake, false, why);
    gwh_wait_health(503);
    char *reply, *body;
    assert_int_equal(gwh_request("GET", "/health", NULL, NULL, &reply, &body), 503);
    assert_string_equal(body, "{\"status\":\"loading\",\"reason\":\"kvd attach: the pools do "
                        "not fit the GPU (\\\"tight\\\")\"}");
    free(reply);
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL, "{\"prompt\":\"x\"}", &reply,
                                 &body),
                     503);
    assert_non_null(strstr(body, "{\"error\":{\"message\":\"The model is not ready yet "
                                 "(verifyd: kvd attach: the pools do not fit the GPU "
                                 "(\\\"tight\\\")); try again later.\",\"type\":\"server_error\","
                                 "\"param\":null,\"code\":\"model_loading\"}}"));
    free(reply);
    fake_verifyd_set_ready(gwh_fake, true, NULL);
    gwh_wait_health(200);
}

/* Last: stops the fake. A verifyd that dies ends open streams at once (its event connection
 * closes), /health says 503, requests get 503, and all is well once it is back. */
static void verifyd_gone_ends_open_streams_at_once(void **state)
{
    (void)state;
    int fd = open_hanging_stream();
    sleep_ms(300);
    fake_verifyd_stop(gwh_fake);
    gwh_fake = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char *reply, *body;
    assert_int_equal(gwh_read(fd, &reply, &body), 200);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    /* Well before the 3 s without answers that would count as down otherwise. */
    assert_true((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 < 2000);
    assert_non_null(strstr(body, "data: {\"error\":{\"message\":\"The generation failed: verifyd "
                                 "stopped answering during the generation\",\"type\":"
                                 "\"server_error\",\"param\":null,\"code\":"
                                 "\"backend_unavailable\"}}\n\ndata: [DONE]\n\n"));
    free(reply);
    gwh_wait_health(503);
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL, "{\"prompt\":\"x\"}", &reply,
                                 &body),
                     503);
    assert_non_null(strstr(body, "\"code\":\"backend_unavailable\""));
    free(reply);
    assert_int_equal(gwh_fake_start(3333), TD_OK);
    gwh_wait_health(200);
    fake_script s = {.step = 1, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(gwh_fake, &s);
    assert_int_equal(gwh_request("POST", "/v1/completions", NULL, "{\"prompt\":\"x\"}", &reply,
                                 &body),
                     200);
    free(reply);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chat_whole_response_and_what_verifyd_receives),
        cmocka_unit_test(chat_stream_sends_exact_chunks),
        cmocka_unit_test(stop_string_ends_the_text_and_cancels_verifyd),
        cmocka_unit_test(special_tokens_show_when_asked_for),
        cmocka_unit_test(a_requests_own_chat_template_renders_its_prompt),
        cmocka_unit_test(tool_call_in_the_output_becomes_tool_calls),
        cmocka_unit_test(one_tool_call_when_parallel_calls_are_off),
        cmocka_unit_test(reasoning_opened_by_the_prompt_is_split_off),
        cmocka_unit_test(logprobs_of_each_token_with_alternatives),
        cmocka_unit_test(completions_stream_with_usage),
        cmocka_unit_test(completions_stream_logprobs_ride_on_their_text),
        cmocka_unit_test(error_in_the_middle_of_a_stream_ends_it_cleanly),
        cmocka_unit_test(responses_items_whole_and_streamed),
        cmocka_unit_test(responses_stream_failing_midway),
        cmocka_unit_test(responses_input_items_are_listed),
        cmocka_unit_test(responses_input_tokens_are_counted),
        cmocka_unit_test(busy_verifyd_is_waited_for),
        cmocka_unit_test(prompt_longer_than_the_context_is_400_with_the_numbers),
        cmocka_unit_test(client_disconnect_cancels_the_generation),
        cmocka_unit_test(client_leaving_a_whole_request_cancels_it_too),
        cmocka_unit_test(api_key_is_required_when_set),
        cmocka_unit_test(http_errors_have_openai_bodies),
        cmocka_unit_test(metrics_show_gateway_and_verifyd_numbers),
        cmocka_unit_test(verifyd_restart_between_polls_ends_open_streams),
        cmocka_unit_test(not_ready_verifyd_says_why),
        cmocka_unit_test(verifyd_gone_ends_open_streams_at_once),
        cmocka_unit_test(responses_run_in_the_background),
    };
    return cmocka_run_group_tests(tests, gwh_setup, gwh_teardown);
}
