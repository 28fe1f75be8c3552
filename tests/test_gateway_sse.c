/* Response rendering in the gateway: the exact bytes of SSE chunks (chat and completions),
 * the usage chunk, an error event, whole responses and the model list. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "gateway/render.h"

static const render_ctx CTX = {
    .id = "chatcmpl-0123456789abcdef01234567",
    .created = 1700000000,
    .model = "tiny",
    .usage_null = false,
    .call_ids = "feedc0de",
};

static void expect(char *got, const char *want)
{
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

/* A choices array of one (reference taken). */
static json_t *one(json_t *choice)
{
    json_t *a = json_array();
    assert_non_null(a);
    assert_int_equal(json_array_append_new(a, choice), 0);
    return a;
}

static void first_chunk_carries_the_role(void **state)
{
    (void)state;
    json_t *delta = json_pack("{s:s,s:s}", "role", "assistant", "content", "");
    expect(render_chat_chunk(&CTX, delta, NULL, NULL),
           "data: {\"id\":\"chatcmpl-0123456789abcdef01234567\",\"object\":"
           "\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"tiny\",\"choices\":"
           "[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
           "\"finish_reason\":null}]}\n\n");
}

static void content_reasoning_and_tool_call_deltas(void **state)
{
    (void)state;
    out_piece content = {.kind = OUT_CONTENT, .text = "h\xc3\xa9 \"q\"\n", .len = 8};
    expect(render_chat_chunk(&CTX, render_delta(&CTX, &content), NULL, NULL),
           "data: {\"id\":\"chatcmpl-0123456789abcdef01234567\",\"object\":"
           "\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"tiny\",\"choices\":"
           "[{\"index\":0,\"delta\":{\"content\":\"h\xc3\xa9 \\\"q\\\"\\n\"},\"logprobs\":null,"
           "\"finish_reason\":null}]}\n\n");
    out_piece reasoning = {.kind = OUT_REASONING, .text = "hmm", .len = 3};
    expect(render_chat_chunk(&CTX, render_delta(&CTX, &reasoning), NULL, NULL),
           "data: {\"id\":\"chatcmpl-0123456789abcdef01234567\",\"object\":"
           "\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"tiny\",\"choices\":"
           "[{\"index\":0,\"delta\":{\"reasoning_content\":\"hmm\"},\"logprobs\":null,"
           "\"finish_reason\":null}]}\n\n");
    out_piece call = {.kind = OUT_TOOL_CALL,
                      .call = {.name = "get_weather", .arguments = "{\"city\": \"Paris\"}"},
                      .call_index = 1};
    expect(render_chat_chunk(&CTX, render_delta(&CTX, &call), NULL, NULL),
           "data: {\"id\":\"chatcmpl-0123456789abcdef01234567\",\"object\":"
           "\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"tiny\",\"choices\":"
           "[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_feedc0de_1\","
           "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
           "\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
}

static void last_chunk_and_usage_chunk(void **state)
{
    (void)state;
    render_ctx c = CTX;
    c.usage_null = true; /* include_usage: the choice chunks say "usage":null */
    expect(render_chat_chunk(&c, NULL, "stop", NULL),
           "data: {\"id\":\"chatcmpl-0123456789abcdef01234567\",\"object\":"
           "\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"tiny\",\"choices\":"
           "[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
           "\"usage\":null}\n\n");
    gw_usage u = {.prompt_tokens = 12, .completion_tokens = 7, .cached_tokens = 4, .steps = 3};
    expect(render_chat_usage_chunk(&c, &u),
           "data: {\"id\":\"chatcmpl-0123456789abcdef01234567\",\"object\":"
           "\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"tiny\",\"choices\":[],"
           "\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":7,\"total_tokens\":19,"
           "\"prompt_tokens_details\":{\"cached_tokens\":4},\"acceptance_length\":2.333}}\n\n");
    assert_string_equal(RENDER_SSE_DONE, "data: [DONE]\n\n");
}

static void error_event_in_a_stream(void **state)
{
    (void)state;
    api_error e;
    apierr_set(&e, 503, "backend_unavailable", NULL, "verifyd went away during the generation");
    expect(render_sse_error(&e),
           "data: {\"error\":{\"message\":\"verifyd went away during the generation\",\"type\":"
           "\"server_error\",\"param\":null,\"code\":\"backend_unavailable\"}}\n\n");
}

static void whole_chat_response_with_tool_calls(void **state)
{
    (void)state;
    out_piece call = {.kind = OUT_TOOL_CALL, .call = {.name = "f", .arguments = "{}"}};
    json_t *calls = json_array();
    json_array_append_new(calls, render_tool_call(&CTX, &call));
    gw_usage u = {.prompt_tokens = 5, .completion_tokens = 9};
    expect(render_chat_response(&CTX, one(render_chat_choice(&CTX, NULL, 0, "why", 3, calls,
                                                             "tool_calls", NULL)),
                                &u, NULL),
           "{\"id\":\"chatcmpl-0123456789abcdef01234567\",\"object\":\"chat.completion\","
           "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"message\":"
           "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"why\",\"tool_calls\":"
           "[{\"id\":\"call_feedc0de_0\",\"type\":\"function\",\"function\":{\"name\":\"f\","
           "\"arguments\":\"{}\"}}]},\"logprobs\":null,\"finish_reason\":\"tool_calls\"}],"
           "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":9,\"total_tokens\":14,"
           "\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
    /* n choices: each object and chunk carries its index */
    render_ctx second = CTX;
    second.index = 1;
    json_t *two = one(render_chat_choice(&CTX, "Hi", 2, NULL, 0, NULL, "length", NULL));
    json_array_append_new(two, render_chat_choice(&second, "Yo", 2, NULL, 0, NULL, "stop", NULL));
    expect(render_chat_response(&CTX, two, &u, NULL),
           "{\"id\":\"chatcmpl-0123456789abcdef01234567\",\"object\":\"chat.completion\","
           "\"created\":1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"message\":"
           "{\"role\":\"assistant\",\"content\":\"Hi\"},\"logprobs\":null,\"finish_reason\":"
           "\"length\"},{\"index\":1,\"message\":{\"role\":\"assistant\",\"content\":\"Yo\"},"
           "\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,"
           "\"completion_tokens\":9,\"total_tokens\":14,\"prompt_tokens_details\":"
           "{\"cached_tokens\":0}}}");
    expect(render_chat_chunk(&second, NULL, "stop", NULL),
           "data: {\"id\":\"chatcmpl-0123456789abcdef01234567\",\"object\":"
           "\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"tiny\",\"choices\":"
           "[{\"index\":1,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}]}\n\n");
}

static void completion_chunks_and_response(void **state)
{
    (void)state;
    render_ctx c = CTX;
    c.id = "cmpl-42";
    expect(render_completion_chunk(&c, " upon", 5, NULL, NULL),
           "data: {\"id\":\"cmpl-42\",\"object\":\"text_completion\",\"created\":1700000000,"
           "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"text\":\" upon\",\"logprobs\":null,"
           "\"finish_reason\":null}]}\n\n");
    gw_usage u = {.prompt_tokens = 2, .completion_tokens = 16, .steps = 4};
    expect(render_completion_response(
               &c, one(render_completion_choice(&c, " upon a time", 12, "length", NULL)), &u),
           "{\"id\":\"cmpl-42\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":"
           "\"tiny\",\"choices\":[{\"index\":0,\"text\":\" upon a time\",\"logprobs\":null,"
           "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":"
           "16,\"total_tokens\":18,\"prompt_tokens_details\":{\"cached_tokens\":0},"
           "\"acceptance_length\":4.0}}");
    expect(render_completion_usage_chunk(&c, &u),
           "data: {\"id\":\"cmpl-42\",\"object\":\"text_completion\",\"created\":1700000000,"
           "\"model\":\"tiny\",\"choices\":[],\"usage\":{\"prompt_tokens\":2,"
           "\"completion_tokens\":16,\"total_tokens\":18,\"prompt_tokens_details\":"
           "{\"cached_tokens\":0},\"acceptance_length\":4.0}}\n\n");
}

static void model_list(void **state)
{
    (void)state;
    expect(render_models("qwen35-tiny", 1700000000, 4096),
           "{\"object\":\"list\",\"data\":[{\"id\":\"qwen35-tiny\",\"object\":\"model\","
           "\"created\":1700000000,\"owned_by\":\"tandem\",\"max_model_len\":4096}]}");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(first_chunk_carries_the_role),
        cmocka_unit_test(content_reasoning_and_tool_call_deltas),
        cmocka_unit_test(last_chunk_and_usage_chunk),
        cmocka_unit_test(error_event_in_a_stream),
        cmocka_unit_test(whole_chat_response_with_tool_calls),
        cmocka_unit_test(completion_chunks_and_response),
        cmocka_unit_test(model_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
