/* OpenAI request parsing in the gateway: accepted bodies give exactly the values the backend
 * will see, and every kind of bad body gives a 400 with an exact OpenAI error body naming the
 * field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/request.h"
#include "gateway/respstore.h"

/* Parses body and checks the status and the exact error body. */
/* A completion body that asks for a format: it parses to that format and text. */
static void expect_format(const char *body, msg_format format, const char *text)
{
    gw_request r;
    api_error e;
    if (req_parse(&r, REQ_COMPLETION, body, strlen(body), &e) != TD_OK)
        fail_msg("%s: %s", body, e.message);
    assert_int_equal(r.format, format);
    assert_string_equal(r.schema, text);
    assert_int_equal(r.n_schema, strlen(text));
    req_free(&r);
}

static void expect_error(req_kind kind, const char *body, int status, const char *error_json)
{
    gw_request r;
    api_error e;
    td_err err = req_parse(&r, kind, body, strlen(body), &e);
    assert_int_not_equal(err, TD_OK);
    assert_int_equal(e.status, status);
    char *s = apierr_render(&e);
    assert_non_null(s);
    assert_string_equal(s, error_json);
    free(s);
}

static void chat_body_gives_exact_values(void **state)
{
    (void)state;
    const char *body =
        "{\"model\": \"tiny\", \"messages\": ["
        "{\"role\": \"developer\", \"content\": \"Be brief.\"},"
        "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"},"
        "{\"type\": \"text\", \"text\": \"b\"}]},"
        "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", "
        "\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": "
        "\"{\\\"x\\\": 1}\"}}]},"
        "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"42\"}],"
        "\"temperature\": 0, \"top_p\": 0.5, \"top_k\": -1, \"min_p\": 0.05, \"seed\": -7,"
        "\"max_tokens\": 10, \"max_completion_tokens\": 20, \"stop\": [\"\", \"END\", \"\\n\\n\"],"
        "\"stream\": true, \"stream_options\": {\"include_usage\": true},"
        "\"logprobs\": true, \"top_logprobs\": 3, \"n\": 3, \"ignore_eos\": true,"
        "\"skip_special_tokens\": false,"
        "\"chat_template_kwargs\": {\"enable_thinking\": false},"
        "\"presence_penalty\": 1.5, \"frequency_penalty\": -0.5,"
        "\"logit_bias\": {\"11\": -100, \"0\": 2.5, \"248319\": 100},"
        "\"stop_token_ids\": [5, 248046],"
        "\"some_future_field\": {\"x\": [1]}}";
    gw_request r;
    api_error e;
    assert_int_equal(req_parse(&r, REQ_CHAT, body, strlen(body), &e), TD_OK);
    assert_string_equal(r.model, "tiny");
    char *msgs = json_dumps(r.messages, JSON_COMPACT);
    assert_string_equal(msgs,
                        "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                        "{\"role\":\"user\",\"content\":\"a\\nb\"},"
                        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
                        "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
                        "{\"x\":1}}}]},"
                        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}]");
    free(msgs);
    assert_true(r.sampling.temperature == 0.0);
    assert_true(r.sampling.top_p == 0.5);
    assert_int_equal(r.sampling.top_k, 0);
    assert_true(r.sampling.min_p == 0.05);
    assert_true(r.sampling.has_seed);
    assert_true(r.sampling.seed == (uint64_t)-7);
    assert_int_equal(r.max_tokens, 20); /* max_completion_tokens wins */
    assert_int_equal(r.n, 3);
    assert_int_equal(r.n_stop, 2);      /* the empty stop string is dropped */
    assert_string_equal(r.stop[0], "END");
    assert_int_equal(r.stop_len[1], 2);
    assert_true(r.stream);
    assert_true(r.include_usage);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 3);
    assert_true(r.ignore_eos);
    assert_true(r.keep_special);
    assert_int_equal(r.enable_thinking, CHAT_THINK_OFF);
    assert_true(r.add_generation_prompt);
    assert_null(r.tools);
    assert_false(r.parse_tools);
    assert_true(r.sampling.presence_penalty == 1.5);
    assert_true(r.sampling.frequency_penalty == -0.5);
    assert_int_equal(r.n_bias, 3);
    assert_int_equal(r.bias_tok[0], 11);
    assert_true(r.bias[0] == -100.0f);
    assert_int_equal(r.bias_tok[1], 0);
    assert_true(r.bias[1] == 2.5f);
    assert_int_equal(r.bias_tok[2], 248319);
    assert_true(r.bias[2] == 100.0f);
    assert_int_equal(r.n_stop_ids, 2);
    assert_int_equal(r.stop_ids[0], 5);
    assert_int_equal(r.stop_ids[1], 248046);
    req_free(&r);
}

/* reasoning_effort "none" turns the template's thinking off, unless chat_template_kwargs says
 * otherwise; other efforts leave it; an unknown one is 400. */
static void chat_reasoning_effort(void **state)
{
    (void)state;
    static const struct {
        const char *extra;
        chat_think want;
    } cases[] = {
        {"\"reasoning_effort\": \"none\"", CHAT_THINK_OFF},
        {"\"reasoning_effort\": \"high\"", CHAT_THINK_UNSET},
        {"\"reasoning_effort\": null", CHAT_THINK_UNSET},
        {"\"reasoning_effort\": \"none\", \"chat_template_kwargs\": {\"enable_thinking\": true}",
         CHAT_THINK_ON},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                 "%s}", cases[i].extra);
        gw_request r;
        api_error e;
        assert_int_equal(req_parse(&r, REQ_CHAT, body, strlen(body), &e), TD_OK);
        assert_int_equal(r.enable_thinking, cases[i].want);
        req_free(&r);
    }
    expect_error(REQ_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                 "\"reasoning_effort\": 2}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'reasoning_effort': expected "
                 "'none', 'minimal', 'low', 'medium', 'high' or 'xhigh'.\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"reasoning_effort\",\"code\":"
                 "\"invalid_value\"}}");
}

static void chat_defaults_when_fields_are_absent(void **state)
{
    (void)state;
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                       "\"temperature\": null, \"tools\": [{\"type\": \"function\", "
                       "\"function\": {\"name\": \"f\"}}]}";
    gw_request r;
    api_error e;
    assert_int_equal(req_parse(&r, REQ_CHAT, body, strlen(body), &e), TD_OK);
    assert_null(r.model);
    assert_true(r.sampling.temperature == 1.0);
    assert_true(r.sampling.top_p == 1.0);
    assert_false(r.sampling.has_seed);
    assert_int_equal(r.max_tokens, -1);
    assert_int_equal(r.n_stop, 0);
    assert_false(r.stream);
    assert_false(r.logprobs);
    assert_false(r.keep_special);
    assert_int_equal(r.enable_thinking, CHAT_THINK_UNSET);
    assert_non_null(r.tools);
    assert_true(r.parse_tools);
    assert_true(r.sampling.presence_penalty == 0.0 && r.sampling.frequency_penalty == 0.0);
    assert_int_equal(r.n_bias, 0);
    assert_null(r.bias_tok);
    req_free(&r);
    const char *none = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                       "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
                       "\"tool_choice\": \"none\"}";
    assert_int_equal(req_parse(&r, REQ_CHAT, none, strlen(none), &e), TD_OK);
    assert_null(r.tools);
    assert_false(r.parse_tools);
    assert_false(r.force_call);
    assert_int_equal(r.format, MSG_FORMAT_TEXT);
    req_free(&r);
}

/* tool_choice "required" and a named function make the answer open with a tool call (the
 * named one alone is shown to the model); without tools, for a missing name or with a
 * response_format, they are refused. */
static void a_required_tool_call_sets_the_tool_call_format(void **state)
{
    (void)state;
    gw_request r;
    api_error e;
    const char *tools = "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, "
                        "{\"type\": \"function\", \"function\": {\"name\": \"g\"}}]";
    char body[512];
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
             "%s, \"tool_choice\": \"required\"}", tools);
    assert_int_equal(req_parse(&r, REQ_CHAT, body, strlen(body), &e), TD_OK);
    assert_true(r.force_call && r.parse_tools);
    assert_int_equal(r.format, MSG_FORMAT_TOOL_CALL);
    assert_int_equal(json_array_size(r.tools), 2);
    req_free(&r);
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
             "%s, \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"g\"}}}",
             tools);
    assert_int_equal(req_parse(&r, REQ_CHAT, body, strlen(body), &e), TD_OK);
    assert_int_equal(r.format, MSG_FORMAT_TOOL_CALL);
    assert_int_equal(json_array_size(r.tools), 1);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(json_array_get(r.tools, 0), "function"),
                                          "name")),
        "g");
    req_free(&r);
    /* allowed_tools: those alone shown; "required" makes one of them the answer's call */
    const char *three = "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, "
                        "{\"type\": \"function\", \"function\": {\"name\": \"g\"}}, "
                        "{\"type\": \"function\", \"function\": {\"name\": \"h\"}}]";
    static const char *const modes[] = {"required", "auto"};
    for (int k = 0; k < 2; k++) {
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": "
                 "\"hi\"}], %s, \"tool_choice\": {\"type\": \"allowed_tools\", "
                 "\"allowed_tools\": {\"mode\": \"%s\", \"tools\": [{\"type\": \"function\", "
                 "\"function\": {\"name\": \"h\"}}, {\"type\": \"function\", \"function\": "
                 "{\"name\": \"f\"}}]}}}", three, modes[k]);
        assert_int_equal(req_parse(&r, REQ_CHAT, body, strlen(body), &e), TD_OK);
        char *shown = json_dumps(r.tools, JSON_COMPACT);
        assert_string_equal(shown, "[{\"type\":\"function\",\"function\":{\"name\":\"h\"}},"
                                   "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]");
        free(shown);
        assert_int_equal(r.force_call, k == 0);
        assert_int_equal(r.format, k == 0 ? MSG_FORMAT_TOOL_CALL : MSG_FORMAT_TEXT);
        assert_true(r.parse_tools);
        req_free(&r);
    }
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
             "%s, \"tool_choice\": {\"type\": \"allowed_tools\", \"allowed_tools\": "
             "{\"mode\": \"auto\", \"tools\": [{\"type\": \"function\", \"function\": "
             "{\"name\": \"x\"}}]}}}", three);
    expect_error(REQ_CHAT, body, 400,
                 "{\"error\":{\"message\":\"Invalid value for 'tool_choice': no tool named 'x' "
                 "in 'tools'.\",\"type\":\"invalid_request_error\",\"param\":\"tool_choice\","
                 "\"code\":\"invalid_value\"}}");
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
             "%s, \"tool_choice\": {\"type\": \"allowed_tools\", \"allowed_tools\": "
             "{\"mode\": \"any\", \"tools\": []}}}", three);
    expect_error(REQ_CHAT, body, 400,
                 "{\"error\":{\"message\":\"Invalid value for 'tool_choice': expected "
                 "{\\\"type\\\": \\\"allowed_tools\\\", \\\"allowed_tools\\\": "
                 "{\\\"mode\\\": \\\"auto\\\" or \\\"required\\\", \\\"tools\\\": "
                 "[{\\\"type\\\": \\\"function\\\", \\\"function\\\": {\\\"name\\\": "
                 "...}}, ...]}}.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"tool_choice\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_CHAT,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                 "\"tool_choice\": \"required\"}",
                 400,
                 "{\"error\":{\"message\":\"Invalid value for 'tool_choice': a tool call is "
                 "required but no 'tools' were given.\",\"type\":\"invalid_request_error\","
                 "\"param\":\"tool_choice\",\"code\":\"invalid_value\"}}");
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
             "%s, \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"h\"}}}",
             tools);
    expect_error(REQ_CHAT, body, 400,
                 "{\"error\":{\"message\":\"Invalid value for 'tool_choice': no tool named 'h' "
                 "in 'tools'.\",\"type\":\"invalid_request_error\",\"param\":\"tool_choice\","
                 "\"code\":\"invalid_value\"}}");
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
             "%s, \"tool_choice\": \"required\", \"response_format\": {\"type\": "
             "\"json_object\"}}", tools);
    expect_error(REQ_CHAT, body, 400,
                 "{\"error\":{\"message\":\"Invalid value for 'response_format': a required "
                 "tool call ('tool_choice') and a structured answer cannot both be asked for.\","
                 "\"type\":\"invalid_request_error\",\"param\":\"response_format\",\"code\":"
                 "\"invalid_value\"}}");
}

/* The error body of a bad logit_bias (param logit_bias, code invalid_value). */
static void expect_bias_error(const char *bias, const char *message)
{
    char body[32768], want[1024];
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logit_bias\": %s}",
             bias);
    snprintf(want, sizeof want,
             "{\"error\":{\"message\":\"%s\",\"type\":\"invalid_request_error\",\"param\":"
             "\"logit_bias\",\"code\":\"%s\"}}",
             message, strncmp(message, "Invalid type", 12) == 0 ? "invalid_type" : "invalid_value");
    expect_error(REQ_CHAT, body, 400, want);
}

static void bad_logit_bias_and_penalties_are_400(void **state)
{
    (void)state;
    const char *keys = "Invalid key in 'logit_bias': keys must be token ids (decimal integers).";
    expect_bias_error("[1, 2]", "Invalid type for 'logit_bias': expected an object, but got an "
                                "array instead.");
    expect_bias_error("{\"abc\": 1}", keys);
    expect_bias_error("{\"-1\": 1}", keys);
    expect_bias_error("{\"\": 1}", keys);
    expect_bias_error("{\"1.5\": 1}", keys);
    expect_bias_error("{\"12345678901\": 1}", keys);
    expect_bias_error("{\"4294967296\": 1}", keys);
    expect_bias_error("{\"5\": \"high\"}", "Invalid type for 'logit_bias': expected numbers as "
                                           "values, but got a string instead.");
    expect_bias_error("{\"5\": 100.5}", "Invalid value for 'logit_bias': the bias of token 5 "
                                        "must be from -100 to 100, but got 100.5 instead.");
    expect_bias_error("{\"5\": -101}", "Invalid value for 'logit_bias': the bias of token 5 "
                                       "must be from -100 to 100, but got -101 instead.");
    expect_bias_error("{\"7\": 1, \"07\": 2}",
                      "Invalid value for 'logit_bias': token 7 appears twice.");
    /* one entry over the limit */
    char big[16 * 1100] = "{";
    size_t at = 1;
    for (int i = 0; i <= REQ_BIAS_MAX; i++)
        at += (size_t)snprintf(big + at, sizeof big - at, "%s\"%d\": 1", i ? ", " : "", i);
    snprintf(big + at, sizeof big - at, "}");
    expect_bias_error(big, "Invalid value for 'logit_bias': at most 1024 entries, but got 1025.");
    /* exactly the limit, and an empty object, are fine */
    big[at - 11] = '}'; /* drop ', "1024": 1' */
    big[at - 10] = '\0';
    char body[16 * 1100 + 128];
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logit_bias\": %s}", big);
    gw_request r;
    api_error e;
    assert_int_equal(req_parse(&r, REQ_CHAT, body, strlen(body), &e), TD_OK);
    assert_int_equal(r.n_bias, REQ_BIAS_MAX);
    assert_int_equal(r.bias_tok[REQ_BIAS_MAX - 1], REQ_BIAS_MAX - 1);
    req_free(&r);
    const char *empty = "{\"prompt\": \"x\", \"logit_bias\": {}, \"presence_penalty\": -2, "
                        "\"frequency_penalty\": 2}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, empty, strlen(empty), &e), TD_OK);
    assert_int_equal(r.n_bias, 0);
    assert_true(r.sampling.presence_penalty == -2.0 && r.sampling.frequency_penalty == 2.0);
    assert_int_equal(r.n, 1); /* one choice unless n says more */
    assert_int_equal(r.best_of, 1); /* as many candidates as choices unless best_of says more */
    req_free(&r);
    /* stop_token_ids: an array of at most 32 ids */
    const char *ids_bad[][2] = {
        {"5", "Invalid type for 'stop_token_ids': expected an array, but got an integer "
              "instead.\",\"type\":\"invalid_request_error\",\"param\":\"stop_token_ids\","
              "\"code\":\"invalid_type\"}}"},
        {"[1, -2]", "Invalid value for 'stop_token_ids': item 1 is not a token id.\",\"type\":"
                    "\"invalid_request_error\",\"param\":\"stop_token_ids\",\"code\":"
                    "\"invalid_value\"}}"},
        {"[1.5]", "Invalid value for 'stop_token_ids': item 0 is not a token id.\",\"type\":"
                  "\"invalid_request_error\",\"param\":\"stop_token_ids\",\"code\":"
                  "\"invalid_value\"}}"},
        {"[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,"
         "32]",
         "Invalid value for 'stop_token_ids': at most 32 token ids, but got 33.\",\"type\":"
         "\"invalid_request_error\",\"param\":\"stop_token_ids\",\"code\":"
         "\"invalid_value\"}}"},
    };
    for (size_t k = 0; k < sizeof ids_bad / sizeof ids_bad[0]; k++) {
        char body[512], want[512];
        snprintf(body, sizeof body, "{\"prompt\": \"x\", \"stop_token_ids\": %s}",
                 ids_bad[k][0]);
        snprintf(want, sizeof want, "{\"error\":{\"message\":\"%s", ids_bad[k][1]);
        expect_error(REQ_COMPLETION, body, 400, want);
    }
    expect_error(REQ_CHAT,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                 "\"response_format\": \"json\"}",
                 400,
                 "{\"error\":{\"message\":\"Invalid type for 'response_format': expected an "
                 "object, but got a string instead.\",\"type\":\"invalid_request_error\","
                 "\"param\":\"response_format\",\"code\":\"invalid_type\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"presence_penalty\": 2.5}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'presence_penalty': expected a "
                 "number in [-2, 2], but got 2.5 instead.\",\"type\":\"invalid_request_error\","
                 "\"param\":\"presence_penalty\",\"code\":\"invalid_value\"}}");
}

static void repetition_penalty_and_min_tokens_are_checked(void **state)
{
    (void)state;
    gw_request r;
    api_error e;
    const char *ok = "{\"prompt\": \"x\", \"max_tokens\": 9, \"repetition_penalty\": 1.25, "
                     "\"min_tokens\": 9}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, ok, strlen(ok), &e), TD_OK);
    assert_true(r.sampling.repetition_penalty == 1.25);
    assert_int_equal(r.sampling.min_tokens, 9);
    req_free(&r);
    const char *none = "{\"prompt\": \"x\"}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, none, strlen(none), &e), TD_OK);
    assert_true(r.sampling.repetition_penalty == 1.0);
    assert_int_equal(r.sampling.min_tokens, 0);
    req_free(&r);
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"repetition_penalty\": 0}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'repetition_penalty': expected a "
                 "number in (0, 10], but got 0 instead.\",\"type\":\"invalid_request_error\","
                 "\"param\":\"repetition_penalty\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_CHAT,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                 "\"max_completion_tokens\": 4, \"min_tokens\": 5}",
                 400,
                 "{\"error\":{\"message\":\"Invalid value for 'min_tokens': 5 is more than "
                 "max_tokens (4).\",\"type\":\"invalid_request_error\",\"param\":\"min_tokens\","
                 "\"code\":\"invalid_value\"}}");
}

static void response_format_is_parsed_and_checked(void **state)
{
    (void)state;
    gw_request r;
    api_error e;
    /* response_format: text, json_object, json_schema (compact, compiled), or refused */
    const char *text = "{\"prompt\": \"x\", \"response_format\": {\"type\": \"text\"}}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, text, strlen(text), &e), TD_OK);
    assert_int_equal(r.format, MSG_FORMAT_TEXT);
    assert_null(r.schema);
    req_free(&r);
    const char *obj = "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\"}}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, obj, strlen(obj), &e), TD_OK);
    assert_int_equal(r.format, MSG_FORMAT_JSON_OBJECT);
    assert_null(r.schema);
    req_free(&r);
    const char *sch = "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", "
                      "\"json_schema\": {\"name\": \"p\", \"strict\": true, \"schema\": "
                      "{\"type\": \"object\", \"properties\": {\"a\": {\"enum\": [1, \"\u00e9\"]}}, "
                      "\"required\": [\"a\"]}}}}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, sch, strlen(sch), &e), TD_OK);
    assert_int_equal(r.format, MSG_FORMAT_JSON_SCHEMA);
    assert_string_equal(r.schema, "{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[1,"
                                  "\"\xc3\xa9\"]}},\"required\":[\"a\"]}");
    assert_int_equal(r.n_schema, strlen(r.schema));
    req_free(&r);
    const char *any = "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", "
                      "\"json_schema\": {\"name\": \"any\"}}}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, any, strlen(any), &e), TD_OK);
    assert_int_equal(r.format, MSG_FORMAT_JSON_SCHEMA);
    assert_string_equal(r.schema, "true");
    req_free(&r);
    const char *rf_bad[][2] = {
        {"{\"type\": \"yaml\"}",
         "Unsupported value for 'response_format.type': 'yaml'; supported are 'text', "
         "'json_object', 'json_schema' and 'structural_tag'.\",\"type\":"
         "\"invalid_request_error\",\"param\":"
         "\"response_format.type\",\"code\":\"unsupported_value\"}}"},
        {"{\"type\": \"json_schema\"}",
         "Invalid value for 'response_format.json_schema': expected an object.\",\"type\":"
         "\"invalid_request_error\",\"param\":\"response_format.json_schema\",\"code\":"
         "\"invalid_value\"}}"},
        {"{\"type\": \"json_schema\", \"json_schema\": {\"name\": 3}}",
         "Invalid type for 'response_format.json_schema.name': expected a string.\",\"type\":"
         "\"invalid_request_error\",\"param\":\"response_format.json_schema.name\",\"code\":"
         "\"invalid_type\"}}"},
        {"{\"type\": \"json_schema\", \"json_schema\": {\"schema\": [1]}}",
         "Invalid type for 'response_format.json_schema.schema': expected an object.\","
         "\"type\":\"invalid_request_error\",\"param\":\"response_format.json_schema."
         "schema\",\"code\":\"invalid_type\"}}"},
        {"{\"type\": \"json_schema\", \"json_schema\": {\"schema\": {\"type\": \"strin\"}}}",
         "Invalid value for 'response_format.json_schema.schema': "},
        {"{\"type\": \"json_schema\", \"json_schema\": {\"schema\": {\"pattern\": \"(a\"}}}",
         "Invalid value for 'response_format.json_schema.schema': schema #/pattern: regular "
         "expression, at byte 2: missing ')'"},
        {"{\"type\": \"json_schema\", \"json_schema\": {\"schema\": {\"multipleOf\": 2}}}",
         "Invalid value for 'response_format.json_schema.schema': schema #/multipleOf: "
         "keyword 'multipleOf' is not enforced\",\"type\":\"invalid_request_error\","
         "\"param\":\"response_format.json_schema.schema\",\"code\":\"unsupported_value\""},
    };
    for (size_t k = 0; k < sizeof rf_bad / sizeof rf_bad[0]; k++) {
        char body[512];
        snprintf(body, sizeof body, "{\"prompt\": \"x\", \"response_format\": %s}", rf_bad[k][0]);
        assert_int_equal(req_parse(&r, REQ_COMPLETION, body, strlen(body), &e), TD_EINVAL);
        assert_int_equal(e.status, 400);
        char *got = apierr_render(&e);
        assert_non_null(got);
        if (!strstr(got, rf_bad[k][1]))
            fail_msg("%s: %s", body, got);
        if (k == 4)
            assert_non_null(strstr(got, "strin"));
        if (k == 5) /* a pattern that does not parse: the schema is invalid */
            assert_non_null(strstr(got, "\"code\":\"invalid_value\""));
        free(got);
    }
    /* a schema past the message's limit */
    const size_t huge = MSG_SCHEMA_MAX + 64;
    char *hb = malloc(huge + 256);
    assert_non_null(hb);
    int at = snprintf(hb, 256, "{\"prompt\": \"x\", \"response_format\": {\"type\": "
                      "\"json_schema\", \"json_schema\": {\"schema\": {\"description\": \"");
    memset(hb + at, 'd', huge);
    strcpy(hb + at + huge, "\"}}}}");
    assert_int_equal(req_parse(&r, REQ_COMPLETION, hb, strlen(hb), &e), TD_EINVAL);
    char *got = apierr_render(&e);
    assert_non_null(strstr(got, "as compact JSON, at most 262144 are supported"));
    free(got);
    free(hb);
}

static void malformed_json_is_400(void **state)
{
    (void)state;
    expect_error(REQ_CHAT, "{\"messages\": [", 400,
                 "{\"error\":{\"message\":\"The request body is not valid JSON: ']' expected "
                 "near end of file (line 1, column 14).\",\"type\":"
                 "\"invalid_request_error\",\"param\":null,\"code\":\"invalid_json\"}}");
    expect_error(REQ_CHAT, "[1, 2]", 400,
                 "{\"error\":{\"message\":\"The request body must be a JSON object, but got an "
                 "array instead.\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":"
                 "\"invalid_json\"}}");
    expect_error(REQ_CHAT, "", 400,
                 "{\"error\":{\"message\":\"The request body is not valid JSON: '[' or '{' "
                 "expected near end of file (line 1, column 0).\",\"type\":"
                 "\"invalid_request_error\",\"param\":null,\"code\":\"invalid_json\"}}");
}

static void invalid_utf8_in_a_string_is_400(void **state)
{
    (void)state;
    gw_request r;
    api_error e;
    const char *bodies[] = {
        "{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"\xc3\"}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"\xed\xa0\x80\"}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000b\"}]}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        assert_int_equal(req_parse(&r, REQ_CHAT, bodies[i], strlen(bodies[i]), &e), TD_EINVAL);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.code, "invalid_json");
        /* The body stays valid JSON even when the parser quotes the bad bytes. */
        char *s = apierr_render(&e);
        json_t *back = json_loads(s, 0, NULL);
        assert_non_null(back);
        json_decref(back);
        free(s);
    }
}

static void wrong_types_name_the_field(void **state)
{
    (void)state;
    expect_error(REQ_CHAT,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": "
                 "\"10\"}",
                 400,
                 "{\"error\":{\"message\":\"Invalid type for 'max_tokens': expected an integer, "
                 "but got a string instead.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"max_tokens\",\"code\":\"invalid_type\"}}");
    expect_error(REQ_CHAT, "{\"messages\": {\"role\": \"user\"}}", 400,
                 "{\"error\":{\"message\":\"Invalid type for 'messages': expected an array, but "
                 "got an object instead.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"messages\",\"code\":\"invalid_type\"}}");
    expect_error(REQ_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400,
                 "{\"error\":{\"message\":\"Invalid type for 'messages[0].content': expected a "
                 "string or an array of content parts, but got an integer instead.\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"messages[0].content\",\"code\":"
                 "\"invalid_type\"}}");
    expect_error(REQ_CHAT,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stream\": 1}", 400,
                 "{\"error\":{\"message\":\"Invalid type for 'stream': expected a boolean, but "
                 "got an integer instead.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"stream\",\"code\":\"invalid_type\"}}");
    expect_error(REQ_CHAT,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"model\": 3}", 400,
                 "{\"error\":{\"message\":\"Invalid type for 'model': expected a string, but got "
                 "an integer instead.\",\"type\":\"invalid_request_error\",\"param\":\"model\","
                 "\"code\":\"invalid_type\"}}");
    expect_error(REQ_CHAT,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stop\": [\"a\", "
                 "2]}",
                 400,
                 "{\"error\":{\"message\":\"Invalid type for 'stop[1]': expected a string, but "
                 "got an integer instead.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"stop[1]\",\"code\":\"invalid_type\"}}");
}

static void empty_or_missing_messages_are_400(void **state)
{
    (void)state;
    expect_error(REQ_CHAT, "{\"messages\": []}", 400,
                 "{\"error\":{\"message\":\"Invalid 'messages': empty array. Expected an array "
                 "with minimum length 1, but got an empty array instead.\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"messages\",\"code\":\"empty_array\"}}");
    expect_error(REQ_CHAT, "{\"model\": \"m\"}", 400,
                 "{\"error\":{\"message\":\"Missing required parameter: 'messages'.\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"messages\",\"code\":"
                 "\"missing_required_parameter\"}}");
    expect_error(REQ_CHAT, "{\"messages\": [{\"role\": \"user\"}]}", 400,
                 "{\"error\":{\"message\":\"Missing required parameter: 'messages[0].content'.\","
                 "\"type\":\"invalid_request_error\",\"param\":\"messages[0].content\",\"code\":"
                 "\"missing_required_parameter\"}}");
}

static void bad_values_are_400(void **state)
{
    (void)state;
    expect_error(REQ_CHAT, "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'messages[0].role': 'robot'. "
                 "Supported values are: 'system', 'developer', 'user', 'assistant' and 'tool'.\","
                 "\"type\":\"invalid_request_error\",\"param\":\"messages[0].role\",\"code\":"
                 "\"invalid_value\"}}");
    expect_error(REQ_CHAT,
                 "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", "
                 "\"image_url\": {\"url\": \"x\"}}]}]}",
                 400,
                 "{\"error\":{\"message\":\"Only text content parts are supported; "
                 "messages[0].content[0] has type 'image_url'.\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"messages[0].content[0]\",\"code\":"
                 "\"invalid_value\"}}");
    expect_error(REQ_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 129}",
                 400,
                 "{\"error\":{\"message\":\"Invalid value for 'n': expected an integer from 1 to "
                 "128, but got 129 instead.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"n\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"n\": 3, \"best_of\": 2}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'best_of': it must be at least n "
                 "(3), but got 2.\",\"type\":\"invalid_request_error\",\"param\":\"best_of\","
                 "\"code\":\"invalid_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"best_of\": 2, \"stream\": true}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'best_of': a stream cannot rank 2 "
                 "candidates to send 1; stream with best_of equal to n.\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"best_of\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"n\": 0}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'n': expected an integer from 1 to "
                 "128, but got 0 instead.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"n\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_CHAT,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": 2.5}",
                 400,
                 "{\"error\":{\"message\":\"Invalid value for 'temperature': expected a number in "
                 "[0, 2], but got 2.5 instead.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"temperature\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_p\": 0}",
                 400,
                 "{\"error\":{\"message\":\"Invalid value for 'top_p': expected a number in (0, "
                 "1], but got 0 instead.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"top_p\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_CHAT,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 0}",
                 400,
                 "{\"error\":{\"message\":\"Invalid value for 'max_tokens': expected an integer "
                 "from 1 to 2147483647, but got 0 instead.\",\"type\":\"invalid_request_error\","
                 "\"param\":\"max_tokens\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_CHAT,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}",
                 400,
                 "{\"error\":{\"message\":\"Invalid value for 'top_logprobs': 'logprobs' must be "
                 "set to true when 'top_logprobs' is used.\",\"type\":\"invalid_request_error\","
                 "\"param\":\"top_logprobs\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_CHAT,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, "
                 "\"top_logprobs\": 21}",
                 400,
                 "{\"error\":{\"message\":\"Invalid value for 'top_logprobs': expected an integer "
                 "from 0 to 20, but got 21 instead.\",\"type\":\"invalid_request_error\","
                 "\"param\":\"top_logprobs\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_CHAT,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stream_options\": "
                 "{\"include_usage\": true}}",
                 400,
                 "{\"error\":{\"message\":\"Invalid value for 'stream_options': only allowed "
                 "when 'stream' is true.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"stream_options\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_CHAT,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": "
                 "[{\"type\": \"function\"}]}",
                 400,
                 "{\"error\":{\"message\":\"Invalid value for 'tools[0]': expected {\\\"type\\\": "
                 "\\\"function\\\", \\\"function\\\": {\\\"name\\\": ...}}.\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"tools[0]\",\"code\":\"invalid_value\"}}");
}

static void completion_prompt_forms(void **state)
{
    (void)state;
    gw_request r;
    api_error e;
    const char *text = "{\"prompt\": \"Once upon\", \"logprobs\": 2}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, text, strlen(text), &e), TD_OK);
    assert_int_equal(r.n_prompts, 1);
    assert_int_equal(r.prompts[0].len, 9);
    assert_memory_equal(r.prompts[0].text, "Once upon", 9);
    assert_int_equal(r.max_tokens, 16); /* the completions API default */
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 2);
    req_free(&r);
    const char *ids = "{\"prompt\": [[5, 0, 511]], \"max_tokens\": 3}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, ids, strlen(ids), &e), TD_OK);
    assert_int_equal(r.n_prompts, 1);
    assert_null(r.prompts[0].text);
    assert_int_equal(r.prompts[0].n_ids, 3);
    assert_int_equal(r.prompts[0].ids[0], 5);
    assert_int_equal(r.prompts[0].ids[2], 511);
    assert_int_equal(r.max_tokens, 3);
    assert_false(r.logprobs);
    req_free(&r);
    const char *one = "{\"prompt\": [\"x\"]}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, one, strlen(one), &e), TD_OK);
    assert_int_equal(r.n_prompts, 1);
    assert_memory_equal(r.prompts[0].text, "x", 1);
    req_free(&r);
    /* a batch: texts and id lists mixed, in order */
    const char *batch = "{\"prompt\": [\"ab\", [7, 8], \"c\"], \"n\": 2}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, batch, strlen(batch), &e), TD_OK);
    assert_int_equal(r.n_prompts, 3);
    assert_memory_equal(r.prompts[0].text, "ab", 2);
    assert_int_equal(r.prompts[1].n_ids, 2);
    assert_int_equal(r.prompts[1].ids[1], 8);
    assert_int_equal(r.prompts[2].len, 1);
    assert_int_equal(r.n, 2);
    req_free(&r);
}

static void completion_bad_prompts_are_400(void **state)
{
    (void)state;
    expect_error(REQ_COMPLETION, "{\"prompt\": [\"a\", \"\"]}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'prompt[1]': the prompt is "
                 "empty.\",\"type\":\"invalid_request_error\",\"param\":\"prompt[1]\","
                 "\"code\":\"invalid_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": [[1], 2]}", 400,
                 "{\"error\":{\"message\":\"Invalid type for 'prompt[1]': expected a string or "
                 "an array of token ids, but got an integer instead.\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"prompt[1]\",\"code\":\"invalid_type\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": [[1], [2, -1]]}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'prompt[1][1]': expected a token "
                 "id (a non-negative integer).\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"prompt[1][1]\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": [\"a\", \"b\", \"c\"], \"best_of\": 400}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'best_of': expected an integer "
                 "from 1 to 128, but got 400 instead.\",\"type\":\"invalid_request_error\","
                 "\"param\":\"best_of\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": [\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", "
                 "\"g\", \"h\", \"i\"], \"best_of\": 128}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'prompt': 9 prompts of 128 "
                 "candidates each make more than the 1024 generations a request may have.\","
                 "\"type\":\"invalid_request_error\",\"param\":\"prompt\",\"code\":"
                 "\"invalid_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": [1, -2]}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'prompt[1]': expected a token id (a "
                 "non-negative integer).\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"prompt[1]\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"\"}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'prompt': the prompt is empty.\","
                 "\"type\":\"invalid_request_error\",\"param\":\"prompt\",\"code\":"
                 "\"invalid_value\"}}");
    /* max_tokens 0 scores an echoed prompt; without echo it asks for nothing */
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": 0}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'max_tokens': expected an integer "
                 "from 1 to 2147483647, but got 0 instead.\",\"type\":\"invalid_request_error\","
                 "\"param\":\"max_tokens\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"skip_special_tokens\": \"no\"}", 400,
                 "{\"error\":{\"message\":\"Invalid type for 'skip_special_tokens': expected a "
                 "boolean, but got a string instead.\",\"type\":\"invalid_request_error\","
                 "\"param\":\"skip_special_tokens\",\"code\":\"invalid_type\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"echo\": 1}", 400,
                 "{\"error\":{\"message\":\"Invalid type for 'echo': expected a boolean, but got "
                 "an integer instead.\",\"type\":\"invalid_request_error\",\"param\":\"echo\","
                 "\"code\":\"invalid_type\"}}");
    gw_request r;
    api_error e;
    const char *echo = "{\"prompt\": \"x\", \"echo\": true, \"max_tokens\": 0, \"logprobs\": 0}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, echo, strlen(echo), &e), TD_OK);
    assert_true(r.echo && r.logprobs);
    assert_int_equal(r.max_tokens, 0);
    req_free(&r);
    expect_error(REQ_COMPLETION, "{\"max_tokens\": 5}", 400,
                 "{\"error\":{\"message\":\"Missing required parameter: 'prompt'.\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"prompt\",\"code\":"
                 "\"missing_required_parameter\"}}");
}

/* Guided decoding: vLLM's guided_choice and structured_outputs.choice become the choice
 * format with its spec, guided_json (an object or its text), structured_outputs.json and
 * llama.cpp's json_schema the JSON schema format, guided_regex and structured_outputs.regex
 * the regex format, guided_grammar (GBNF or Lark), structured_outputs.grammar and llama.cpp's
 * grammar the grammar format, each with its text; structured_outputs' json_object and its
 * options (null members absent, disable_additional_properties closing the schema's objects);
 * two ways at once, an unknown kind, an option away from its default that is not enforced, a
 * bad choice list, a regex or grammar the matcher refuses are 400. */
static void guided_decoding_fields(void **state)
{
    (void)state;
    gw_request r;
    api_error e;
    static const char *const choice[] = {
        "{\"prompt\": \"x\", \"guided_choice\": [\"yes\", \"no\"]}",
        "{\"prompt\": \"x\", \"structured_outputs\": {\"choice\": [\"yes\", \"no\"]}}",
    };
    for (int i = 0; i < 2; i++) {
        assert_int_equal(req_parse(&r, REQ_COMPLETION, choice[i], strlen(choice[i]), &e), TD_OK);
        assert_int_equal(r.format, MSG_FORMAT_CHOICE);
        assert_string_equal(r.schema, "{\"form\":\"choice\",\"choices\":[\"yes\",\"no\"]}");
        req_free(&r);
    }
    static const char *const json[] = {
        "{\"prompt\": \"x\", \"guided_json\": {\"type\": \"integer\"}}",
        "{\"prompt\": \"x\", \"guided_json\": \"{\\\"type\\\": \\\"integer\\\"}\"}",
        "{\"prompt\": \"x\", \"structured_outputs\": {\"json\": {\"type\": \"integer\"}}}",
        "{\"prompt\": \"x\", \"json_schema\": {\"type\": \"integer\"}}",
    };
    for (int i = 0; i < 4; i++) {
        assert_int_equal(req_parse(&r, REQ_COMPLETION, json[i], strlen(json[i]), &e), TD_OK);
        assert_int_equal(r.format, MSG_FORMAT_JSON_SCHEMA);
        assert_string_equal(r.schema, "{\"type\":\"integer\"}");
        req_free(&r);
    }
    static const struct {
        const char *body;
        msg_format format;
        const char *text;
    } gram[] = {
        {"{\"prompt\": \"x\", \"guided_regex\": \"[a-z]+\\\\d\"}", MSG_FORMAT_REGEX, "[a-z]+\\d"},
        {"{\"prompt\": \"x\", \"structured_outputs\": {\"regex\": \"a|b\"}}", MSG_FORMAT_REGEX,
         "a|b"},
        {"{\"prompt\": \"x\", \"guided_grammar\": \"root ::= \\\"a\\\"+\"}", MSG_FORMAT_GRAMMAR,
         "root ::= \"a\"+"},
        {"{\"prompt\": \"x\", \"structured_outputs\": {\"grammar\": \"root ::= [0-9]\"}}",
         MSG_FORMAT_GRAMMAR, "root ::= [0-9]"},
        {"{\"prompt\": \"x\", \"grammar\": \"root ::= x\\nx ::= \\\"y\\\"\"}", MSG_FORMAT_GRAMMAR,
         "root ::= x\nx ::= \"y\""},
        {"{\"prompt\": \"x\", \"guided_grammar\": \"?start: x+\\nx: 'y'i\"}", MSG_FORMAT_GRAMMAR,
         "?start: x+\nx: 'y'i"},
    };
    /* vLLM's options beside the kind: null members are absent, closed objects */
    const char *so = "{\"prompt\": \"x\", \"structured_outputs\": {\"regex\": null, \"json\": "
                     "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"object\"}, "
                     "\"b\": {\"type\": \"object\", \"additionalProperties\": true}}}, "
                     "\"disable_additional_properties\": true, \"disable_fallback\": true, "
                     "\"disable_any_whitespace\": false, \"whitespace_pattern\": null}}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, so, strlen(so), &e), TD_OK);
    assert_int_equal(r.format, MSG_FORMAT_JSON_SCHEMA);
    assert_string_equal(r.schema, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                                  "\"object\",\"additionalProperties\":false},\"b\":{\"type\":"
                                  "\"object\",\"additionalProperties\":true}},"
                                  "\"additionalProperties\":false}");
    req_free(&r);
    so = "{\"prompt\": \"x\", \"structured_outputs\": {\"json_object\": true, \"json\": null}}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, so, strlen(so), &e), TD_OK);
    assert_int_equal(r.format, MSG_FORMAT_JSON_OBJECT);
    req_free(&r);
    /* disable_any_whitespace: the compact JSON formats; a regex as it is */
    static const struct {
        const char *so;
        msg_format format;
    } compact[] = {
        {"{\"json_object\": true, \"disable_any_whitespace\": true}",
         MSG_FORMAT_JSON_OBJECT_COMPACT},
        {"{\"json\": {\"type\": \"integer\"}, \"disable_any_whitespace\": true}",
         MSG_FORMAT_JSON_SCHEMA_COMPACT},
        {"{\"json\": \"{}\", \"disable_any_whitespace\": false}", MSG_FORMAT_JSON_SCHEMA},
        {"{\"regex\": \"a b\", \"disable_any_whitespace\": true}", MSG_FORMAT_REGEX},
    };
    for (size_t i = 0; i < sizeof compact / sizeof compact[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\": \"x\", \"structured_outputs\": %s}",
                 compact[i].so);
        assert_int_equal(req_parse(&r, REQ_COMPLETION, body, strlen(body), &e), TD_OK);
        assert_int_equal(r.format, compact[i].format);
        req_free(&r);
    }
    for (size_t i = 0; i < sizeof gram / sizeof gram[0]; i++)
        expect_format(gram[i].body, gram[i].format, gram[i].text);
    expect_error(REQ_COMPLETION,
                 "{\"prompt\": \"x\", \"guided_choice\": [\"a\"], \"guided_json\": {}}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'guided_json': ask for one "
                 "structured output only (response_format, guided_json, guided_choice, "
                 "guided_regex, guided_grammar, structured_outputs, json_schema, grammar).\","
                 "\"type\":\"invalid_request_error\",\"param\":\"guided_json\",\"code\":"
                 "\"invalid_value\"}}");
    expect_error(REQ_COMPLETION,
                 "{\"prompt\": \"x\", \"structured_outputs\": {\"regex\": \"a+\", \"choice\": "
                 "[\"a\"]}}",
                 400,
                 "{\"error\":{\"message\":\"Invalid value for 'structured_outputs': give one of "
                 "'json', 'choice', 'regex', 'grammar', 'json_object' and 'structural_tag'.\","
                 "\"type\":\"invalid_request_error\",\"param\":\"structured_outputs\",\"code\":"
                 "\"invalid_value\"}}");
    expect_error(REQ_COMPLETION,
                 "{\"prompt\": \"x\", \"structured_outputs\": {\"structural_tag\": \"a\"}}", 400,
                 "{\"error\":{\"message\":\"Invalid value for "
                 "'structured_outputs.structural_tag': the text is not JSON.\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"structured_outputs.structural_tag\","
                 "\"code\":\"invalid_value\"}}");
    expect_error(REQ_COMPLETION,
                 "{\"prompt\": \"x\", \"structured_outputs\": {\"pattern\": \"a\"}}", 400,
                 "{\"error\":{\"message\":\"Unsupported value for 'structured_outputs': "
                 "'pattern'; supported are 'json', 'choice', 'regex', 'grammar', 'json_object' "
                 "and 'structural_tag'.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"structured_outputs\",\"code\":\"unsupported_value\"}}");
    /* vLLM's structural tags: response_format, or structured_outputs' JSON text of them */
    static const char *const tags[] = {
        "{\"prompt\": \"x\", \"response_format\": {\"type\": \"structural_tag\", "
        "\"structures\": [{\"begin\": \"<f=a>\", \"schema\": {\"type\": \"object\"}, "
        "\"end\": \"</f>\", \"x\": 1}], \"triggers\": [\"<f=\"]}}",
        "{\"prompt\": \"x\", \"structured_outputs\": {\"structural_tag\": \"{\\\"type\\\": "
        "\\\"structural_tag\\\", \\\"triggers\\\": [\\\"<f=\\\"], \\\"structures\\\": "
        "[{\\\"begin\\\": \\\"<f=a>\\\", \\\"schema\\\": {\\\"type\\\": \\\"object\\\"}, "
        "\\\"end\\\": \\\"</f>\\\"}]}\"}}",
    };
    static const char TAGS[] = "{\"form\":\"tags\",\"triggers\":[\"<f=\"],\"structures\":"
                               "[{\"begin\":\"<f=a>\",\"schema\":{\"type\":\"object\"},"
                               "\"end\":\"</f>\"}]}";
    for (int i = 0; i < 2; i++)
        expect_format(tags[i], MSG_FORMAT_TAGS, TAGS);
    expect_error(REQ_COMPLETION,
                 "{\"prompt\": \"x\", \"response_format\": {\"type\": \"structural_tag\", "
                 "\"structures\": [{\"begin\": \"<g>\", \"schema\": {}, \"end\": \"x\"}], "
                 "\"triggers\": [\"<f\"]}}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'response_format': structural "
                 "tag: structures[0].begin '<g>' does not begin with a trigger\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"response_format\",\"code\":"
                 "\"invalid_value\"}}");
    /* xgrammar's newer form: triggered tags whose content is a JSON schema */
    const char *newer = "{\"prompt\": \"x\", \"response_format\": {\"type\": \"structural_tag\", "
                        "\"format\": {\"type\": \"triggered_tags\", \"triggers\": [\"<f=\"], "
                        "\"tags\": [{\"begin\": \"<f=a>\", \"content\": {\"type\": "
                        "\"json_schema\", \"json_schema\": {\"type\": \"object\"}}, \"end\": "
                        "\"</f>\"}], \"at_least_one\": false}}}";
    expect_format(newer, MSG_FORMAT_TAGS, TAGS);
    expect_error(REQ_COMPLETION,
                 "{\"prompt\": \"x\", \"response_format\": {\"type\": \"structural_tag\", "
                 "\"format\": {\"type\": \"or\"}}}", 400,
                 "{\"error\":{\"message\":\"Unsupported value for 'response_format': of the "
                 "\\\"format\\\" form only \\\"triggered_tags\\\" is taken.\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"response_format\",\"code\":"
                 "\"unsupported_value\"}}");
    const char *flagged = "{\"prompt\": \"x\", \"response_format\": {\"type\": "
                          "\"structural_tag\", \"format\": {\"type\": \"triggered_tags\", "
                          "\"triggers\": [\"<\"], \"tags\": [{\"begin\": \"<a>\", \"content\": "
                          "{\"type\": \"json_schema\", \"json_schema\": true}, \"end\": "
                          "\"</a>\"}], \"at_least_one\": false, \"stop_after_first\": true}}}";
    expect_format(flagged, MSG_FORMAT_TAGS,
                  "{\"form\":\"tags\",\"triggers\":[\"<\"],\"structures\":[{\"begin\":"
                  "\"<a>\",\"schema\":true,\"end\":\"</a>\"}],\"stop_after_first\":true}");
    expect_error(REQ_COMPLETION,
                 "{\"prompt\": \"x\", \"response_format\": {\"type\": \"structural_tag\", "
                 "\"format\": {\"type\": \"triggered_tags\", \"triggers\": [\"<\"], \"tags\": "
                 "[{\"begin\": \"<a>\", \"content\": {\"type\": \"json_schema\", "
                 "\"json_schema\": true}, \"end\": \"x\"}], \"at_least_one\": \"yes\"}}}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'response_format': structural "
                 "tag: at_least_one must be a boolean\",\"type\":\"invalid_request_error\","
                 "\"param\":\"response_format\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_COMPLETION,
                 "{\"prompt\": \"x\", \"response_format\": {\"type\": \"structural_tag\", "
                 "\"format\": {\"type\": \"triggered_tags\", \"triggers\": [\"<\"], \"tags\": "
                 "[{\"begin\": \"<a>\", \"content\": {\"type\": \"regex\"}, \"end\": \"x\"}]}}}",
                 400,
                 "{\"error\":{\"message\":\"Unsupported value for "
                 "'response_format.format.tags[0]': only a tag whose content is {\\\"type\\\": "
                 "\\\"json_schema\\\", \\\"json_schema\\\": ...} is taken.\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"response_format.format.tags[0]\","
                 "\"code\":\"unsupported_value\"}}");
    expect_error(REQ_COMPLETION,
                 "{\"prompt\": \"x\", \"response_format\": {\"type\": \"structural_tag\", "
                 "\"triggers\": [\"<f\"]}}", 400,
                 "{\"error\":{\"message\":\"Invalid type for 'response_format.structures': "
                 "expected an array, but got null instead.\",\"type\":\"invalid_request_error\","
                 "\"param\":\"response_format.structures\",\"code\":\"invalid_type\"}}");
    expect_error(REQ_COMPLETION,
                 "{\"prompt\": \"x\", \"structured_outputs\": {\"json\": {}, "
                 "\"whitespace_pattern\": \" ?\"}}",
                 400,
                 "{\"error\":{\"message\":\"Unsupported value for "
                 "'structured_outputs.whitespace_pattern': JSON is matched with the whitespace "
                 "JSON allows, or none with disable_any_whitespace (give null).\",\"type\":"
                 "\"invalid_request_error\",\"param\":"
                 "\"structured_outputs.whitespace_pattern\",\"code\":\"unsupported_value\"}}");
    expect_error(REQ_COMPLETION,
                 "{\"prompt\": \"x\", \"guided_json\": {}, \"guided_whitespace_pattern\": \" \"}",
                 400,
                 "{\"error\":{\"message\":\"Unsupported value for 'guided_whitespace_pattern': "
                 "JSON is matched with the whitespace JSON allows, or none with "
                 "structured_outputs' disable_any_whitespace (give null).\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"guided_whitespace_pattern\",\"code\":"
                 "\"unsupported_value\"}}");
    expect_error(REQ_COMPLETION,
                 "{\"prompt\": \"x\", \"structured_outputs\": {\"json_object\": 1}}", 400,
                 "{\"error\":{\"message\":\"Invalid type for 'structured_outputs.json_object': "
                 "expected a boolean, but got an integer instead.\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"structured_outputs.json_object\","
                 "\"code\":\"invalid_type\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"guided_regex\": \"(a\"}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'guided_regex': regular "
                 "expression, at byte 2: missing ')'\",\"type\":\"invalid_request_error\","
                 "\"param\":\"guided_regex\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"guided_regex\": \"(?=a)\"}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'guided_regex': regular "
                 "expression, at byte 1: lookaround and other (? groups are not supported\","
                 "\"type\":\"invalid_request_error\",\"param\":\"guided_regex\","
                 "\"code\":\"unsupported_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"guided_regex\": \"(?L)^a\"}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'guided_regex': regular "
                 "expression, at byte 2: the inline flag L is not supported (a, i, m, s, u and "
                 "x are)\",\"type\":\"invalid_request_error\",\"param\":\"guided_regex\","
                 "\"code\":\"unsupported_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"grammar\": \"root ::= nope\"}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'grammar': grammar: the rule "
                 "'nope' is used but not defined\",\"type\":\"invalid_request_error\","
                 "\"param\":\"grammar\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"guided_grammar\": \"start: \\\"a\\\" ]\"}",
                 400,
                 "{\"error\":{\"message\":\"Invalid value for 'guided_grammar': grammar, line 1, "
                 "column 12: unbalanced bracket\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"guided_grammar\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_COMPLETION,
                 "{\"prompt\": \"x\", \"guided_grammar\": \"%import foo.X\\nstart: X\"}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'guided_grammar': grammar: only "
                 "Lark's `common` library can be imported\",\"type\":\"invalid_request_error\","
                 "\"param\":\"guided_grammar\",\"code\":\"unsupported_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"guided_grammar\": \"\"}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'guided_grammar': it is empty.\","
                 "\"type\":\"invalid_request_error\",\"param\":\"guided_grammar\",\"code\":"
                 "\"invalid_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"guided_regex\": 5}", 400,
                 "{\"error\":{\"message\":\"Invalid type for 'guided_regex': expected a string, "
                 "but got an integer instead.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"guided_regex\",\"code\":\"invalid_type\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"guided_choice\": [\"a\", \"\"]}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'guided_choice': choice: "
                 "choices[1] must be a string of 1..1024 bytes\",\"type\":"
                 "\"invalid_request_error\",\"param\":\"guided_choice\",\"code\":"
                 "\"invalid_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"guided_json\": \"{no\"}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'guided_json': the text is not "
                 "JSON.\",\"type\":\"invalid_request_error\",\"param\":\"guided_json\",\"code\":"
                 "\"invalid_value\"}}");
}

/* bad_words (vLLM's): strings kept for tokenizing; not a list, not strings, words of only
 * whitespace or too long, too many words are 400. */
static void bad_words_field(void **state)
{
    (void)state;
    gw_request r;
    api_error e;
    const char *ok = "{\"prompt\": \"x\", \"bad_words\": [\"damn\", \"  oh no\"]}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, ok, strlen(ok), &e), TD_OK);
    assert_int_equal(json_array_size(r.bad_words), 2);
    req_free(&r);
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"bad_words\": \"damn\"}", 400,
                 "{\"error\":{\"message\":\"Invalid type for 'bad_words': expected an array of "
                 "strings, but got a string instead.\",\"type\":\"invalid_request_error\","
                 "\"param\":\"bad_words\",\"code\":\"invalid_type\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"bad_words\": [\"a\", 3]}", 400,
                 "{\"error\":{\"message\":\"Invalid type for 'bad_words[1]': expected a string, "
                 "but got an integer instead.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"bad_words[1]\",\"code\":\"invalid_type\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"bad_words\": [\" \\n\"]}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'bad_words[0]': a bad word is 1 to "
                 "256 bytes of text (besides leading whitespace), without NUL characters.\","
                 "\"type\":\"invalid_request_error\",\"param\":\"bad_words[0]\",\"code\":"
                 "\"invalid_value\"}}");
    char body[4096] = "{\"prompt\": \"x\", \"bad_words\": [\"w\"";
    for (int i = 0; i < REQ_BAD_WORDS_MAX; i++)
        strcat(body, ",\"w\"");
    strcat(body, "]}");
    expect_error(REQ_COMPLETION, body, 400,
                 "{\"error\":{\"message\":\"Invalid value for 'bad_words': at most 128 words are "
                 "supported, got 129.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"bad_words\",\"code\":\"invalid_value\"}}");
}

/* allowed_token_ids (vLLM's): a list of token ids, 1..65536 of them. */
static void allowed_token_ids_field(void **state)
{
    (void)state;
    gw_request r;
    api_error e;
    const char *ok = "{\"prompt\": \"x\", \"allowed_token_ids\": [3, 0, 511]}";
    assert_int_equal(req_parse(&r, REQ_COMPLETION, ok, strlen(ok), &e), TD_OK);
    assert_int_equal(r.n_allowed, 3);
    assert_int_equal(r.allowed[2], 511);
    req_free(&r);
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"allowed_token_ids\": []}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'allowed_token_ids': 1 to 65536 "
                 "token ids, got 0.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"allowed_token_ids\",\"code\":\"invalid_value\"}}");
    expect_error(REQ_COMPLETION, "{\"prompt\": \"x\", \"allowed_token_ids\": [1, \"2\"]}", 400,
                 "{\"error\":{\"message\":\"Invalid value for 'allowed_token_ids': item 1 is not "
                 "a token id.\",\"type\":\"invalid_request_error\",\"param\":"
                 "\"allowed_token_ids\",\"code\":\"invalid_value\"}}");
}

static void tokenize_and_detokenize_bodies(void **state)
{
    (void)state;
    json_t *root;
    const char *text;
    size_t len;
    bool add;
    api_error e;
    const char *b1 = "{\"content\": \"hi there\", \"add_special\": false}";
    assert_int_equal(req_parse_tokenize(b1, strlen(b1), &root, &text, &len, &add, &e), TD_OK);
    assert_int_equal(len, 8);
    assert_false(add);
    json_decref(root);
    const char *b2 = "{\"prompt\": \"x\"}";
    assert_int_equal(req_parse_tokenize(b2, strlen(b2), &root, &text, &len, &add, &e), TD_OK);
    assert_string_equal(text, "x");
    assert_true(add);
    json_decref(root);
    const char *b3 = "{\"content\": [1]}";
    assert_int_equal(req_parse_tokenize(b3, strlen(b3), &root, &text, &len, &add, &e), TD_EINVAL);
    assert_null(root);
    assert_string_equal(e.param, "content");

    int32_t *ids;
    size_t n;
    const char *d1 = "{\"tokens\": [0, 511, 7]}";
    assert_int_equal(req_parse_detokenize(d1, strlen(d1), 512, &ids, &n, &e), TD_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 511);
    free(ids);
    const char *d2 = "{\"tokens\": [0, 512]}";
    assert_int_equal(req_parse_detokenize(d2, strlen(d2), 512, &ids, &n, &e), TD_EINVAL);
    char *s = apierr_render(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"Invalid value for 'tokens[1]': expected a "
                           "token id from 0 to 511.\",\"type\":\"invalid_request_error\","
                           "\"param\":\"tokens[1]\",\"code\":\"invalid_value\"}}");
    free(s);
}

/* /v1/responses: the chat request a Responses body stands for, exactly. */
static void responses_body_gives_the_chat_request(void **state)
{
    (void)state;
    const char *body =
        "{\"model\": \"tiny\", \"instructions\": \"Be brief.\", \"input\": ["
        "{\"role\": \"user\", \"content\": [{\"type\": \"input_text\", \"text\": \"a\"},"
        "{\"type\": \"input_text\", \"text\": \"b\"}]},"
        "{\"type\": \"reasoning\", \"id\": \"rs_1\", \"summary\": [],"
        "\"content\": [{\"type\": \"reasoning_text\", \"text\": \"hmm\"}]},"
        "{\"type\": \"message\", \"role\": \"assistant\","
        "\"content\": [{\"type\": \"output_text\", \"text\": \"Let me look.\"}]},"
        "{\"type\": \"function_call\", \"call_id\": \"c1\", \"name\": \"f\","
        "\"arguments\": \"{\\\"x\\\": 1}\"},"
        "{\"type\": \"function_call\", \"call_id\": \"c2\", \"name\": \"f\","
        "\"arguments\": \"{}\"},"
        "{\"type\": \"function_call_output\", \"call_id\": \"c1\", \"output\": \"42\"},"
        "{\"type\": \"function_call_output\", \"call_id\": \"c2\", \"output\": "
        "[{\"type\": \"input_text\", \"text\": \"7\"}]},"
        "{\"role\": \"developer\", \"content\": \"Now answer.\"}],"
        "\"tools\": [{\"type\": \"function\", \"name\": \"f\", \"description\": \"F.\","
        "\"parameters\": {\"type\": \"object\"}, \"strict\": true}],"
        "\"tool_choice\": {\"type\": \"function\", \"name\": \"f\"},"
        "\"parallel_tool_calls\": false, \"max_output_tokens\": 33, \"temperature\": 0.5,"
        "\"top_p\": 0.9, \"top_k\": 7, \"store\": true, \"metadata\": {\"k\": \"v\"},"
        "\"include\": [\"message.output_text.logprobs\"], \"top_logprobs\": 3,"
        "\"reasoning\": {\"effort\": \"none\"}, \"truncation\": \"auto\","
        "\"n\": 5, \"messages\": 3}";
    gw_request r;
    api_error e;
    assert_int_equal(req_parse_responses(&r, body, strlen(body), NULL, &e), TD_OK);
    assert_true(r.responses);
    assert_int_equal(r.kind, REQ_CHAT);
    assert_string_equal(r.model, "tiny");
    char *msgs = json_dumps(r.messages, JSON_COMPACT);
    assert_string_equal(msgs,
                        "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                        "{\"role\":\"user\",\"content\":\"a\\nb\"},"
                        "{\"role\":\"assistant\",\"content\":\"Let me look.\","
                        "\"reasoning_content\":\"hmm\",\"tool_calls\":["
                        "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                        "\"arguments\":{\"x\":1}}},"
                        "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                        "\"arguments\":{}}}]},"
                        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"},"
                        "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"7\"},"
                        "{\"role\":\"system\",\"content\":\"Now answer.\"}]");
    free(msgs);
    char *tools = json_dumps(r.tools, JSON_COMPACT);
    assert_string_equal(tools, "[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                               "\"description\":\"F.\",\"parameters\":{\"type\":\"object\"},"
                               "\"strict\":true}}]");
    free(tools);
    assert_true(r.force_call);
    assert_int_equal(r.format, MSG_FORMAT_TOOL_CALL);
    assert_false(r.parallel_calls);
    assert_int_equal(r.max_tokens, 33);
    assert_true(r.sampling.temperature == 0.5 && r.sampling.top_p == 0.9);
    assert_int_equal(r.sampling.top_k, 7);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 3);
    assert_int_equal(r.enable_thinking, CHAT_THINK_OFF);
    assert_int_equal(r.truncate, -1);
    assert_int_equal(r.n, 1); /* chat fields are not Responses fields */
    assert_false(r.stream);
    req_free(&r);

    /* a string input, text.format, and nothing asked for: the defaults */
    const char *plain = "{\"input\": \"hi\", \"text\": {\"format\": {\"type\": \"json_schema\","
                        "\"name\": \"p\", \"schema\": {\"type\": \"object\"}}},"
                        "\"top_logprobs\": 2, \"stream\": true}";
    assert_int_equal(req_parse_responses(&r, plain, strlen(plain), NULL, &e), TD_OK);
    msgs = json_dumps(r.messages, JSON_COMPACT);
    assert_string_equal(msgs, "[{\"role\":\"user\",\"content\":\"hi\"}]");
    free(msgs);
    assert_int_equal(r.format, MSG_FORMAT_JSON_SCHEMA);
    assert_string_equal(r.schema, "{\"type\":\"object\"}");
    assert_false(r.logprobs); /* top_logprobs alone: no include, no logprobs */
    assert_int_equal(r.max_tokens, -1);
    assert_int_equal(r.enable_thinking, CHAT_THINK_UNSET);
    assert_true(r.stream);
    assert_null(r.tools);
    req_free(&r);
}

/* previous_response_id: the kept conversation comes before the input, the instructions before
 * both; an unknown id is 404, and without a store 400. */
static void responses_continue_a_kept_conversation(void **state)
{
    (void)state;
    rstore *store;
    assert_int_equal(rstore_init(&store, 4, 1 << 20), TD_OK);
    json_t *conv = json_loads("[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\","
                              "\"content\":\"b\"}]", 0, NULL);
    json_t *resp = json_pack("{s:s}", "id", "resp_1");
    assert_true(rstore_put(store, "resp_1", resp, conv, conv));
    json_decref(resp);
    json_decref(conv);
    const char *body = "{\"input\": \"c\", \"instructions\": \"Be brief.\", "
                       "\"previous_response_id\": \"resp_1\", \"store\": true}";
    gw_request r;
    api_error e;
    assert_int_equal(req_parse_responses(&r, body, strlen(body), store, &e), TD_OK);
    char *msgs = json_dumps(r.messages, JSON_COMPACT);
    assert_string_equal(msgs, "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                              "{\"role\":\"user\",\"content\":\"a\"},"
                              "{\"role\":\"assistant\",\"content\":\"b\"},"
                              "{\"role\":\"user\",\"content\":\"c\"}]");
    free(msgs);
    char *kept = json_dumps(r.resp_conv, JSON_COMPACT); /* what this response will keep */
    assert_string_equal(kept, "[{\"role\":\"user\",\"content\":\"a\"},"
                              "{\"role\":\"assistant\",\"content\":\"b\"},"
                              "{\"role\":\"user\",\"content\":\"c\"}]");
    free(kept);
    assert_true(r.resp_keep);
    req_free(&r);
    const char *unkept = "{\"input\": \"c\", \"store\": false}";
    assert_int_equal(req_parse_responses(&r, unkept, strlen(unkept), store, &e), TD_OK);
    assert_false(r.resp_keep);
    req_free(&r);

    const char *unknown = "{\"input\": \"c\", \"previous_response_id\": \"resp_9\"}";
    assert_int_not_equal(req_parse_responses(&r, unknown, strlen(unknown), store, &e), TD_OK);
    assert_int_equal(e.status, 404);
    char *s = apierr_render(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"Previous response with id 'resp_9' not "
                           "found.\",\"type\":\"invalid_request_error\",\"param\":"
                           "\"previous_response_id\",\"code\":\"previous_response_not_found\"}}");
    free(s);
    const char *prev = "{\"input\": \"c\", \"previous_response_id\": \"resp_1\"}";
    assert_int_not_equal(req_parse_responses(&r, prev, strlen(prev), NULL, &e), TD_OK);
    s = apierr_render(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"Unsupported parameter: "
                           "'previous_response_id': this gateway keeps no responses "
                           "(--responses-kept 0); send the whole conversation in 'input'.\","
                           "\"type\":\"invalid_request_error\",\"param\":"
                           "\"previous_response_id\",\"code\":\"unsupported_parameter\"}}");
    free(s);
    rstore_free(store);
}

/* Responses' allowed_tools: the chat's, with the function tools it names alone shown. */
static void responses_allowed_tools(void **state)
{
    (void)state;
    const char *body = "{\"input\": \"x\", \"tools\": [{\"type\": \"function\", \"name\": "
                       "\"f\"}, {\"type\": \"function\", \"name\": \"g\"}], \"tool_choice\": "
                       "{\"type\": \"allowed_tools\", \"mode\": \"required\", \"tools\": "
                       "[{\"type\": \"function\", \"name\": \"g\"}]}}";
    gw_request r;
    api_error e;
    assert_int_equal(req_parse_responses(&r, body, strlen(body), NULL, &e), TD_OK);
    char *tc = json_dumps(json_object_get(r.root, "tool_choice"), JSON_COMPACT);
    assert_string_equal(tc, "{\"type\":\"allowed_tools\",\"allowed_tools\":{\"mode\":"
                            "\"required\",\"tools\":[{\"type\":\"function\",\"function\":"
                            "{\"name\":\"g\"}}]}}");
    free(tc);
    char *shown = json_dumps(r.tools, JSON_COMPACT);
    assert_string_equal(shown, "[{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]");
    free(shown);
    assert_true(r.force_call);
    req_free(&r);
}

static void expect_responses_error(const char *body, const char *error_json)
{
    gw_request r;
    api_error e;
    assert_int_not_equal(req_parse_responses(&r, body, strlen(body), NULL, &e), TD_OK);
    assert_int_equal(e.status, 400);
    char *s = apierr_render(&e);
    assert_string_equal(s, error_json);
    free(s);
}

static void responses_bad_bodies_are_400(void **state)
{
    (void)state;
    expect_responses_error("{}", "{\"error\":{\"message\":\"Missing required parameter: "
                                 "'input'.\",\"type\":\"invalid_request_error\",\"param\":"
                                 "\"input\",\"code\":\"missing_required_parameter\"}}");
    expect_responses_error("{\"input\": []}",
                           "{\"error\":{\"message\":\"Invalid 'input': empty array. Expected an "
                           "array with minimum length 1, but got an empty array instead.\","
                           "\"type\":\"invalid_request_error\",\"param\":\"input\",\"code\":"
                           "\"empty_array\"}}");
    expect_responses_error("{\"input\": 3}",
                           "{\"error\":{\"message\":\"Invalid type for 'input': expected a "
                           "string or an array of input items, but got an integer instead.\","
                           "\"type\":\"invalid_request_error\",\"param\":\"input\",\"code\":"
                           "\"invalid_type\"}}");
    expect_responses_error("{\"input\": [{\"role\": \"tool\", \"content\": \"x\"}]}",
                           "{\"error\":{\"message\":\"Invalid value for 'input[0].role': 'tool'. "
                           "Supported values are: 'user', 'system', 'developer' and "
                           "'assistant'.\",\"type\":\"invalid_request_error\",\"param\":"
                           "\"input[0].role\",\"code\":\"invalid_value\"}}");
    expect_responses_error("{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": "
                           "\"input_file\", \"file_id\": \"f\"}]}]}",
                           "{\"error\":{\"message\":\"Only text content parts (input_text, "
                           "output_text) are supported; input[0].content[0] has type "
                           "'input_file'.\",\"type\":\"invalid_request_error\",\"param\":"
                           "\"input[0].content[0]\",\"code\":\"invalid_value\"}}");
    expect_responses_error("{\"input\": [{\"type\": \"function_call_output\", \"call_id\": "
                           "\"c\"}]}",
                           "{\"error\":{\"message\":\"Missing required parameter: "
                           "'input[0].output'.\",\"type\":\"invalid_request_error\",\"param\":"
                           "\"input[0].output\",\"code\":\"missing_required_parameter\"}}");
    expect_responses_error("{\"input\": \"x\", \"tools\": [{\"type\": \"file_search\"}]}",
                           "{\"error\":{\"message\":\"Invalid value for 'tools[0].type': "
                           "'file_search'. Only 'function' tools are supported.\",\"type\":"
                           "\"invalid_request_error\",\"param\":\"tools[0]\",\"code\":"
                           "\"invalid_value\"}}");
    expect_responses_error("{\"input\": \"x\", \"tool_choice\": {\"type\": \"web_search\"}}",
                           "{\"error\":{\"message\":\"Invalid value for 'tool_choice': expected "
                           "'none', 'auto', 'required', {\\\"type\\\": \\\"function\\\", "
                           "\\\"name\\\": ...} or {\\\"type\\\": \\\"allowed_tools\\\", "
                           "\\\"mode\\\": ..., \\\"tools\\\": [...]}.\",\"type\":"
                           "\"invalid_request_error\",\"param\":"
                           "\"tool_choice\",\"code\":\"invalid_value\"}}");
    expect_responses_error("{\"input\": \"x\", \"conversation\": \"conv_1\"}",
                           "{\"error\":{\"message\":\"Unsupported parameter: 'conversation': "
                           "conversations are not kept here; send the conversation in 'input', "
                           "or the previous response's id as 'previous_response_id'.\",\"type\":"
                           "\"invalid_request_error\",\"param\":"
                           "\"conversation\",\"code\":\"unsupported_parameter\"}}");
    expect_responses_error("{\"input\": \"x\", \"max_output_tokens\": 0}",
                           "{\"error\":{\"message\":\"Invalid value for 'max_output_tokens': "
                           "expected an integer from 1 to 2147483647, but got 0 instead.\","
                           "\"type\":\"invalid_request_error\",\"param\":\"max_output_tokens\","
                           "\"code\":\"invalid_value\"}}");
    expect_responses_error("{\"input\": \"x\", \"text\": {\"format\": {\"type\": "
                           "\"json_schema\", \"name\": \"n\"}}}",
                           "{\"error\":{\"message\":\"Missing required parameter: "
                           "'text.format.schema'.\",\"type\":\"invalid_request_error\",\"param\":"
                           "\"text.format.schema\",\"code\":\"missing_required_parameter\"}}");
    expect_responses_error("{\"input\": \"x\", \"tool_choice\": \"required\", \"tools\": "
                           "[{\"type\": \"function\", \"name\": \"f\"}], \"text\": "
                           "{\"format\": {\"type\": \"json_object\"}}}",
                           "{\"error\":{\"message\":\"Invalid value for 'text.format': a "
                           "required tool call ('tool_choice') and a structured answer cannot "
                           "both be asked for.\",\"type\":\"invalid_request_error\",\"param\":"
                           "\"text.format\",\"code\":\"invalid_value\"}}");
    expect_responses_error("{\"input\": \"x\", \"reasoning\": {\"effort\": \"max\"}}",
                           "{\"error\":{\"message\":\"Invalid value for 'reasoning.effort': "
                           "expected 'none', 'minimal', 'low', 'medium', 'high' or 'xhigh'.\","
                           "\"type\":\"invalid_request_error\",\"param\":\"reasoning.effort\","
                           "\"code\":\"invalid_value\"}}");
    expect_responses_error("{\"input\": \"x\", \"temperature\": 3}",
                           "{\"error\":{\"message\":\"Invalid value for 'temperature': expected "
                           "a number in [0, 2], but got 3 instead.\",\"type\":"
                           "\"invalid_request_error\",\"param\":\"temperature\",\"code\":"
                           "\"invalid_value\"}}");
    expect_responses_error("[1]", "{\"error\":{\"message\":\"The request body must be a JSON "
                                  "object, but got an array instead.\",\"type\":"
                                  "\"invalid_request_error\",\"param\":null,\"code\":"
                                  "\"invalid_json\"}}");
}

/* The page of "a".."e" a list query gives: its ids joined, first_id, last_id and has_more
 * (or the error's JSON). */
static char *list_page(const char *query)
{
    json_t *items = json_loads("[{\"id\":\"a\"},{\"id\":\"b\"},{\"id\":\"c\"},"
                               "{\"id\":\"d\"},{\"id\":\"e\"}]", 0, NULL);
    req_arg args[8];
    char buf[256], *save = NULL;
    size_t n = 0;
    snprintf(buf, sizeof buf, "%s", query);
    for (char *kv = strtok_r(buf, "&", &save); kv && n < 8; kv = strtok_r(NULL, "&", &save)) {
        char *eq = strchr(kv, '=');
        if (eq)
            *eq = 0;
        args[n++] = (req_arg){.key = kv, .value = eq ? eq + 1 : NULL};
    }
    json_t *page = NULL;
    api_error e;
    char out[512];
    if (req_list_page(items, args, n, &page, &e) != TD_OK) {
        char *s = apierr_render(&e);
        snprintf(out, sizeof out, "%d %s", e.status, s);
        free(s);
    } else {
        size_t i, at = 0;
        json_t *it;
        assert_string_equal(json_string_value(json_object_get(page, "object")), "list");
        json_array_foreach(json_object_get(page, "data"), i, it)
            at += (size_t)snprintf(out + at, sizeof out - at, "%s",
                                   json_string_value(json_object_get(it, "id")));
        const json_t *first = json_object_get(page, "first_id");
        const json_t *last = json_object_get(page, "last_id");
        snprintf(out + at, sizeof out - at, " %s %s %s",
                 json_is_null(first) ? "null" : json_string_value(first),
                 json_is_null(last) ? "null" : json_string_value(last),
                 json_is_true(json_object_get(page, "has_more")) ? "more" : "end");
        assert_int_equal(json_object_size(page), 5);
    }
    json_decref(page);
    json_decref(items);
    return strdup(out);
}

static void expect_page(const char *query, const char *want)
{
    char *got = list_page(query);
    assert_string_equal(got, want);
    free(got);
}

/* Pages of a list endpoint (GET /v1/responses/<id>/input_items): newest first by default,
 * limit, after and before in either order, and each bad value a 400 naming its parameter. */
static void list_pages(void **state)
{
    (void)state;
    expect_page("", "edcba e a end");
    expect_page("order=asc", "abcde a e end");
    expect_page("order=asc&limit=2", "ab a b more");
    expect_page("order=asc&limit=2&after=b", "cd c d more");
    expect_page("order=asc&limit=2&after=d", "e e e end");
    expect_page("order=asc&after=e", " null null end");
    expect_page("limit=2&after=d", "cb c b more");
    expect_page("order=asc&limit=2&before=e", "cd c d more");
    expect_page("order=asc&limit=2&before=c", "ab a b end");
    expect_page("order=asc&after=a&before=e", "bcd b d end");
    expect_page("order=asc&after=a&before=e&limit=2", "bc b c more");
    expect_page("order=asc&after=d&before=b", " null null end");
    expect_page("limit=100&order=desc&order=asc", "abcde a e end"); /* the last counts */
    expect_page("include[]=message.output_text.logprobs&include=reasoning.encrypted_content&x=1",
                "edcba e a end");
    expect_page("limit=0", "400 {\"error\":{\"message\":\"Invalid value for 'limit': expected "
                           "an integer from 1 to 100, got '0'.\",\"type\":"
                           "\"invalid_request_error\",\"param\":\"limit\",\"code\":"
                           "\"invalid_value\"}}");
    expect_page("limit=101", "400 {\"error\":{\"message\":\"Invalid value for 'limit': "
                             "expected an integer from 1 to 100, got '101'.\",\"type\":"
                             "\"invalid_request_error\",\"param\":\"limit\",\"code\":"
                             "\"invalid_value\"}}");
    char *s = list_page("limit=2x");
    assert_non_null(strstr(s, "got '2x'"));
    free(s);
    s = list_page("limit");
    assert_non_null(strstr(s, "\"param\":\"limit\""));
    free(s);
    s = list_page("limit=-1");
    assert_non_null(strstr(s, "got '-1'"));
    free(s);
    s = list_page("limit=99999999999999999999");
    assert_non_null(strstr(s, "\"param\":\"limit\""));
    free(s);
    expect_page("order=up", "400 {\"error\":{\"message\":\"Invalid value for 'order': "
                            "expected 'asc' or 'desc', got 'up'.\",\"type\":"
                            "\"invalid_request_error\",\"param\":\"order\",\"code\":"
                            "\"invalid_value\"}}");
    expect_page("after=zz", "400 {\"error\":{\"message\":\"Invalid value for 'after': no "
                            "input item of this response has the id 'zz'.\",\"type\":"
                            "\"invalid_request_error\",\"param\":\"after\",\"code\":"
                            "\"invalid_value\"}}");
    s = list_page("before=");
    assert_non_null(strstr(s, "\"param\":\"before\""));
    free(s);
    s = list_page("include=message.input_image");
    assert_non_null(strstr(s, "\"param\":\"include\""));
    assert_non_null(strstr(s, "'message.input_image' is not one of"));
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chat_body_gives_exact_values),
        cmocka_unit_test(chat_defaults_when_fields_are_absent),
        cmocka_unit_test(malformed_json_is_400),
        cmocka_unit_test(bad_logit_bias_and_penalties_are_400),
        cmocka_unit_test(response_format_is_parsed_and_checked),
        cmocka_unit_test(a_required_tool_call_sets_the_tool_call_format),
        cmocka_unit_test(repetition_penalty_and_min_tokens_are_checked),
        cmocka_unit_test(invalid_utf8_in_a_string_is_400),
        cmocka_unit_test(wrong_types_name_the_field),
        cmocka_unit_test(empty_or_missing_messages_are_400),
        cmocka_unit_test(bad_values_are_400),
        cmocka_unit_test(completion_prompt_forms),
        cmocka_unit_test(completion_bad_prompts_are_400),
        cmocka_unit_test(guided_decoding_fields),
        cmocka_unit_test(allowed_token_ids_field),
        cmocka_unit_test(bad_words_field),
        cmocka_unit_test(tokenize_and_detokenize_bodies),
        cmocka_unit_test(chat_reasoning_effort),
        cmocka_unit_test(responses_body_gives_the_chat_request),
        cmocka_unit_test(responses_bad_bodies_are_400),
        cmocka_unit_test(responses_continue_a_kept_conversation),
        cmocka_unit_test(responses_allowed_tools),
        cmocka_unit_test(list_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
