/* Responses requests (request.h): a /v1/responses body becomes the chat request it stands for.
 *
 *   instructions              -> a system message first
 *   input (string)            -> one user message
 *   input items               -> messages: {role, content} messages (input_text / output_text
 *                                parts), function_call -> an assistant message's tool_calls
 *                                (consecutive calls share one), function_call_output -> a tool
 *                                message, reasoning -> reasoning_content of the next assistant
 *                                turn
 *   tools (flat functions)    -> {"type": "function", "function": {...}}
 *   tool_choice {type, name}  -> {"type": "function", "function": {"name": ...}}
 *   tool_choice allowed_tools -> the chat's {"type": "allowed_tools", "allowed_tools": {...}}
 *   text.format               -> response_format
 *   max_output_tokens         -> max_completion_tokens
 *   include "message.output_text.logprobs" -> logprobs (top_logprobs alternatives)
 *   reasoning.effort          -> reasoning_effort ("none": the template's thinking off)
 *   previous_response_id      -> the conversation kept with that response before the input
 *   truncation "auto"         -> truncate_prompt_tokens -1 (the prompt's last tokens that fit)
 *
 * and the sampling fields of both APIs pass as they are. */
#include <stdio.h>
#include <string.h>

#include "gateway/request_int.h"
#include "gateway/respstore.h"

/* The fields that mean the same in both APIs. */
static const char *const RESP_PASS[] = {
    "model", "stream", "temperature", "top_p", "parallel_tool_calls", "top_k", "min_p", "seed",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "logit_bias",
    "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens",
    "include_stop_str_in_output", "allowed_token_ids", "bad_words", "chat_template_kwargs",
    "chat_template", "structured_outputs",
};

static td_err resp_oom(api_error *e)
{
    return apierr_set(e, 500, NULL, NULL, "out of memory");
}

/* The keys of src that are present and not null, set on dst (false when out of memory). */
static bool resp_copy_keys(json_t *dst, const json_t *src, const char *const *keys, int n)
{
    for (int k = 0; dst && k < n; k++) {
        const json_t *v = req_field(src, keys[k]);
        if (v && json_object_set(dst, keys[k], (json_t *)v) != 0)
            return false;
    }
    return dst != NULL;
}

static td_err resp_missing(api_error *e, const char *param)
{
    return apierr_set(e, 400, "missing_required_parameter", param,
                      "Missing required parameter: '%s'.", param);
}

/* The text of a message item's content: a string, or input_text / output_text parts joined
 * with "\n" (a refusal part counts as text). */
static td_err resp_content(const json_t *c, const char *base, json_t **out, api_error *e)
{
    char param[APIERR_PARAM_MAX];
    if (json_is_string(c)) {
        *out = json_incref((json_t *)c);
        return TD_OK;
    }
    if (!json_is_array(c))
        return req_bad_type(e, base, "a string or an array of content parts", c);
    json_t *parts = json_array();
    if (!parts)
        return resp_oom(e);
    size_t i;
    const json_t *part;
    json_array_foreach(c, i, part) {
        snprintf(param, sizeof param, "%.64s[%zu]", base, i);
        const json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        const char *t = json_is_string(type) ? json_string_value(type) : "";
        const bool refusal = strcmp(t, "refusal") == 0;
        if (!json_is_object(part)) {
            json_decref(parts);
            return req_bad_type(e, param, "an object", part);
        }
        if (strcmp(t, "input_text") && strcmp(t, "output_text") && !refusal) {
            json_decref(parts);
            return apierr_set(e, 400, "invalid_value", param,
                              "Only text content parts (input_text, output_text) are "
                              "supported; %s has type '%s'.", param, json_is_string(type) ? t
                                                                                 : "(none)");
        }
        const json_t *text = json_object_get(part, refusal ? "refusal" : "text");
        if (!json_is_string(text)) {
            json_decref(parts);
            snprintf(param, sizeof param, "%.64s[%zu].%s", base, i, refusal ? "refusal" : "text");
            return req_bad_type(e, param, "a string", text ? text : json_null());
        }
        if (json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", text))) {
            json_decref(parts);
            return resp_oom(e);
        }
    }
    const td_err r = req_text_parts(parts, base, "\n", out, e);
    json_decref(parts);
    return r;
}

/* A string field of an item, required. */
static td_err resp_item_str(const json_t *it, const char *key, const char *base,
                            const json_t **out, api_error *e)
{
    char param[APIERR_PARAM_MAX];
    snprintf(param, sizeof param, "%.64s.%s", base, key);
    *out = json_object_get(it, key);
    if (!*out)
        return resp_missing(e, param);
    if (!json_is_string(*out))
        return req_bad_type(e, param, "a string", *out);
    return TD_OK;
}

/* The conversation being built: messages, and reasoning waiting for its assistant turn. */
typedef struct resp_conv {
    json_t *msgs;
    json_t *reasoning; /* a JSON string, or NULL */
    bool open_calls;   /* the last message is an assistant turn that tool calls may join */
} resp_conv;

static td_err resp_append(resp_conv *c, json_t *msg, api_error *e)
{
    if (!msg || json_array_append_new(c->msgs, msg) != 0)
        return resp_oom(e);
    return TD_OK;
}

/* An assistant message gets the reasoning that came before it. */
static void resp_take_reasoning(resp_conv *c, json_t *msg)
{
    if (c->reasoning && msg)
        json_object_set_new(msg, "reasoning_content", c->reasoning);
    else
        json_decref(c->reasoning);
    c->reasoning = NULL;
}

static td_err resp_message(resp_conv *c, const json_t *it, const char *base, api_error *e)
{
    char param[APIERR_PARAM_MAX];
    snprintf(param, sizeof param, "%.64s.role", base);
    const json_t *role = json_object_get(it, "role");
    if (!role)
        return resp_missing(e, param);
    if (!json_is_string(role))
        return req_bad_type(e, param, "a string", role);
    const char *r = json_string_value(role);
    if (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer") &&
        strcmp(r, "assistant"))
        return apierr_set(e, 400, "invalid_value", param,
                          "Invalid value for '%s': '%s'. Supported values are: 'user', "
                          "'system', 'developer' and 'assistant'.", param, r);
    snprintf(param, sizeof param, "%.64s.content", base);
    const json_t *content = json_object_get(it, "content");
    if (!content)
        return resp_missing(e, param);
    json_t *text = NULL;
    TD_TRY(resp_content(content, param, &text, e));
    json_t *msg = json_pack("{s:s,s:o}", "role", r, "content", text);
    const bool assistant = strcmp(r, "assistant") == 0;
    if (assistant)
        resp_take_reasoning(c, msg);
    c->open_calls = assistant;
    return resp_append(c, msg, e);
}

static td_err resp_call(resp_conv *c, const json_t *it, const char *base, api_error *e)
{
    const json_t *call_id, *name, *args;
    TD_TRY(resp_item_str(it, "call_id", base, &call_id, e));
    TD_TRY(resp_item_str(it, "name", base, &name, e));
    TD_TRY(resp_item_str(it, "arguments", base, &args, e));
    json_t *call = json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", call_id, "type", "function",
                             "function", "name", name, "arguments", args);
    if (!call)
        return resp_oom(e);
    json_t *msg = c->open_calls ? json_array_get(c->msgs, json_array_size(c->msgs) - 1) : NULL;
    if (!msg) {
        msg = json_pack("{s:s,s:s}", "role", "assistant", "content", "");
        resp_take_reasoning(c, msg);
        const td_err r = resp_append(c, msg, e);
        if (r != TD_OK) {
            json_decref(call);
            return r;
        }
        c->open_calls = true;
    }
    json_t *calls = json_object_get(msg, "tool_calls");
    if (!calls) {
        calls = json_array();
        json_object_set_new(msg, "tool_calls", calls);
    }
    if (!calls || json_array_append_new(calls, call) != 0)
        return resp_oom(e);
    return TD_OK;
}

static td_err resp_call_output(resp_conv *c, const json_t *it, const char *base, api_error *e)
{
    char param[APIERR_PARAM_MAX];
    const json_t *call_id;
    TD_TRY(resp_item_str(it, "call_id", base, &call_id, e));
    snprintf(param, sizeof param, "%.64s.output", base);
    const json_t *output = json_object_get(it, "output");
    if (!output)
        return resp_missing(e, param);
    json_t *text = NULL;
    TD_TRY(resp_content(output, param, &text, e));
    c->open_calls = false;
    return resp_append(c, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", call_id,
                                    "content", text), e);
}

/* A reasoning item's text: its reasoning_text parts, else its summary_text parts. */
static td_err resp_reasoning(resp_conv *c, const json_t *it, const char *base, api_error *e)
{
    char param[APIERR_PARAM_MAX];
    static const char *const keys[] = {"content", "summary"};
    for (int k = 0; k < 2; k++) {
        const json_t *parts = req_field(it, keys[k]);
        if (!parts)
            continue;
        snprintf(param, sizeof param, "%.64s.%s", base, keys[k]);
        if (!json_is_array(parts))
            return req_bad_type(e, param, "an array", parts);
        if (json_array_size(parts) == 0)
            continue;
        json_t *joined = json_array();
        size_t i;
        const json_t *p;
        json_array_foreach(parts, i, p) {
            const json_t *text = json_is_object(p) ? json_object_get(p, "text") : NULL;
            if (!json_is_string(text)) {
                json_decref(joined);
                snprintf(param, sizeof param, "%.64s.%s[%zu].text", base, keys[k], i);
                return req_bad_type(e, param, "a string", text ? text : json_null());
            }
            json_array_append_new(joined, json_pack("{s:s,s:O}", "type", "text", "text", text));
        }
        json_t *text = NULL;
        const td_err r = req_text_parts(joined, param, "\n", &text, e);
        json_decref(joined);
        TD_TRY(r);
        json_decref(c->reasoning);
        c->reasoning = text;
        return TD_OK;
    }
    return TD_OK;
}

static td_err resp_item(resp_conv *c, const json_t *it, size_t i, api_error *e)
{
    char base[40];
    snprintf(base, sizeof base, "input[%zu]", i);
    if (!json_is_object(it))
        return req_bad_type(e, base, "an object", it);
    const json_t *type = req_field(it, "type");
    if (type && !json_is_string(type)) {
        char param[APIERR_PARAM_MAX];
        snprintf(param, sizeof param, "%.64s.type", base);
        return req_bad_type(e, param, "a string", type);
    }
    const char *t = type ? json_string_value(type) : "message";
    if (strcmp(t, "message") == 0)
        return resp_message(c, it, base, e);
    if (strcmp(t, "function_call") == 0)
        return resp_call(c, it, base, e);
    if (strcmp(t, "function_call_output") == 0)
        return resp_call_output(c, it, base, e);
    if (strcmp(t, "reasoning") == 0)
        return resp_reasoning(c, it, base, e);
    return apierr_set(e, 400, "invalid_value", base,
                      "Invalid value for '%s.type': '%s'. Supported input items are: 'message', "
                      "'function_call', 'function_call_output' and 'reasoning'.", base, t);
}

td_err req_responses_items(json_t *msgs, const json_t *items, api_error *e)
{
    resp_conv c = {.msgs = msgs};
    size_t i;
    const json_t *it;
    td_err r = TD_OK;
    json_array_foreach(items, i, it) {
        r = resp_item(&c, it, i, e);
        if (r != TD_OK)
            break;
    }
    json_decref(c.reasoning);
    return r;
}

/* The conversation (history, then input; r->resp_conv) and the chat's messages: the
 * instructions first, then the conversation. */
static td_err resp_messages(gw_request *r, const json_t *body, const json_t *history,
                            json_t *chat, api_error *e)
{
    const json_t *ins = req_field(body, "instructions");
    if (ins && !json_is_string(ins))
        return req_bad_type(e, "instructions", "a string", ins);
    const json_t *input = req_field(body, "input");
    if (!input)
        return resp_missing(e, "input");
    if (!json_is_string(input) && !json_is_array(input))
        return req_bad_type(e, "input", "a string or an array of input items", input);
    if (json_is_array(input) && json_array_size(input) == 0)
        return apierr_set(e, 400, "empty_array", "input",
                          "Invalid 'input': empty array. Expected an array with minimum length "
                          "1, but got an empty array instead.");
    r->resp_conv = history ? json_deep_copy(history) : json_array();
    json_t *msgs = json_array();
    if (!r->resp_conv || !msgs || json_object_set_new(chat, "messages", msgs) != 0)
        return resp_oom(e);
    if (json_is_string(input)) {
        if (json_array_append_new(r->resp_conv, json_pack("{s:s,s:O}", "role", "user",
                                                          "content", input)) != 0)
            return resp_oom(e);
    } else {
        TD_TRY(req_responses_items(r->resp_conv, input, e));
    }
    if (ins && json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content",
                                                     ins)) != 0)
        return resp_oom(e);
    if (json_array_extend(msgs, r->resp_conv) != 0)
        return resp_oom(e);
    return TD_OK;
}

/* Flat function tools -> chat tools. */
static td_err resp_tools(const json_t *body, json_t *chat, api_error *e)
{
    const json_t *tools = req_field(body, "tools");
    if (!tools)
        return TD_OK;
    if (!json_is_array(tools))
        return req_bad_type(e, "tools", "an array", tools);
    json_t *out = json_array();
    if (!out || json_object_set_new(chat, "tools", out) != 0)
        return resp_oom(e);
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        char param[APIERR_PARAM_MAX];
        snprintf(param, sizeof param, "tools[%zu]", i);
        if (!json_is_object(t))
            return req_bad_type(e, param, "an object", t);
        const json_t *type = json_object_get(t, "type");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
            return apierr_set(e, 400, "invalid_value", param,
                              "Invalid value for '%s.type': '%s'. Only 'function' tools are "
                              "supported.", param,
                              json_is_string(type) ? json_string_value(type) : "(none)");
        const json_t *name;
        TD_TRY(resp_item_str(t, "name", param, &name, e));
        json_t *fn = json_pack("{s:O}", "name", name);
        static const char *const keys[] = {"description", "parameters", "strict"};
        if (!resp_copy_keys(fn, t, keys, 3)) {
            json_decref(fn);
            return resp_oom(e);
        }
        if (json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function",
                                                 fn)) != 0)
            return resp_oom(e);
    }
    return TD_OK;
}

static td_err resp_tool_choice(const json_t *body, json_t *chat, api_error *e)
{
    const json_t *tc = req_field(body, "tool_choice");
    if (!tc)
        return TD_OK;
    if (json_is_string(tc)) /* none, auto, required: the chat request checks them */
        return json_object_set(chat, "tool_choice", (json_t *)tc) == 0
                   ? TD_OK
                   : resp_oom(e);
    if (!json_is_object(tc))
        return req_bad_type(e, "tool_choice", "a string or an object", tc);
    const json_t *type = json_object_get(tc, "type");
    if (json_is_string(type) && strcmp(json_string_value(type), "allowed_tools") == 0) {
        /* {"mode", "tools": [{"type": "function", "name"}]} -> the chat's form */
        json_t *list = json_array();
        size_t i;
        const json_t *t;
        json_array_foreach(json_object_get(tc, "tools"), i, t) {
            json_t *one = json_pack("{s:s,s:{s:O?}}", "type", "function", "function", "name",
                                    json_object_get(t, "name"));
            if (!list || json_array_append_new(list, one) != 0) {
                json_decref(list);
                return resp_oom(e);
            }
        }
        const json_t *mode = json_object_get(tc, "mode");
        json_t *at = list ? json_pack("{s:s,s:{s:O?,s:o}}", "type", "allowed_tools",
                                      "allowed_tools", "mode", mode, "tools", list)
                          : NULL;
        return at && json_object_set_new(chat, "tool_choice", at) == 0 ? TD_OK : resp_oom(e);
    }
    const json_t *name = json_object_get(tc, "name");
    if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
        !json_is_string(name))
        return apierr_set(e, 400, "invalid_value", "tool_choice",
                          "Invalid value for 'tool_choice': expected 'none', 'auto', "
                          "'required', {\"type\": \"function\", \"name\": ...} or "
                          "{\"type\": \"allowed_tools\", \"mode\": ..., \"tools\": [...]}.");
    if (json_object_set_new(chat, "tool_choice",
                            json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name",
                                      name)) != 0)
        return resp_oom(e);
    return TD_OK;
}

/* text.format -> response_format. */
static td_err resp_format(const json_t *body, json_t *chat, api_error *e)
{
    const json_t *text = req_field(body, "text");
    if (!text)
        return TD_OK;
    if (!json_is_object(text))
        return req_bad_type(e, "text", "an object", text);
    const json_t *f = req_field(text, "format");
    if (!f)
        return TD_OK;
    if (!json_is_object(f))
        return req_bad_type(e, "text.format", "an object", f);
    const json_t *type = json_object_get(f, "type");
    const char *t = json_is_string(type) ? json_string_value(type) : "";
    json_t *rf = NULL;
    if (strcmp(t, "text") == 0)
        return TD_OK;
    if (strcmp(t, "json_object") == 0) {
        rf = json_pack("{s:s}", "type", "json_object");
    } else if (strcmp(t, "json_schema") == 0) {
        const json_t *schema = json_object_get(f, "schema");
        if (!schema)
            return resp_missing(e, "text.format.schema");
        json_t *js = json_pack("{s:O}", "schema", schema);
        static const char *const keys[] = {"name", "strict", "description"};
        if (!resp_copy_keys(js, f, keys, 3)) {
            json_decref(js);
            return resp_oom(e);
        }
        rf = json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js);
    } else {
        return apierr_set(e, 400, "invalid_value", "text.format.type",
                          "Invalid value for 'text.format.type': '%s'. Supported values are: "
                          "'text', 'json_object' and 'json_schema'.",
                          json_is_string(type) ? t : "(none)");
    }
    if (!rf || json_object_set_new(chat, "response_format", rf) != 0)
        return resp_oom(e);
    const json_t *tc = json_object_get(chat, "tool_choice");
    if (json_is_object(tc) || (json_is_string(tc) && !strcmp(json_string_value(tc), "required")))
        return apierr_set(e, 400, "invalid_value", "text.format",
                          "Invalid value for 'text.format': a required tool call "
                          "('tool_choice') and a structured answer cannot both be asked for.");
    return TD_OK;
}

/* include, top_logprobs, max_output_tokens, reasoning, truncation and what is refused. */
static td_err resp_settings(gw_request *r, const json_t *body, json_t *chat, rstore *store,
                            api_error *e)
{
    static const char *const refused[][2] = {
        {"conversation", "conversations are not kept here; send the conversation in 'input', "
                         "or the previous response's id as 'previous_response_id'"},
        {"prompt", "stored prompts are not available here; send 'instructions' and 'input'"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++)
        if (req_field(body, refused[k][0]))
            return apierr_set(e, 400, "unsupported_parameter", refused[k][0],
                              "Unsupported parameter: '%s': %s.", refused[k][0], refused[k][1]);
    bool background = false, keep = true;
    TD_TRY(req_bool(body, "background", "background", &background, e));
    TD_TRY(req_bool(body, "store", "store", &keep, e));
    r->resp_keep = keep && store;
    r->background = background;
    if (background && !store)
        return apierr_set(e, 400, "unsupported_parameter", "background",
                          "Unsupported parameter: 'background': this gateway keeps no responses "
                          "(--responses-kept 0), and a background response is one to fetch.");
    if (background && !keep)
        return apierr_set(e, 400, "invalid_value", "background",
                          "Invalid value for 'background': a background response must be kept: "
                          "'store' cannot be false with it.");
    const json_t *inc = req_field(body, "include");
    bool logprobs = false;
    if (inc && !json_is_array(inc))
        return req_bad_type(e, "include", "an array", inc);
    size_t i;
    const json_t *v;
    json_array_foreach(inc, i, v) {
        char param[APIERR_PARAM_MAX];
        snprintf(param, sizeof param, "include[%zu]", i);
        if (!json_is_string(v))
            return req_bad_type(e, param, "a string", v);
        logprobs |= strcmp(json_string_value(v), "message.output_text.logprobs") == 0;
    }
    int64_t top = 0;
    bool top_given = false;
    TD_TRY(req_int(body, "top_logprobs", 0, REQ_TOP_LOGPROBS_MAX, &top, &top_given, e));
    if (logprobs && (json_object_set_new(chat, "logprobs", json_true()) ||
                     json_object_set_new(chat, "top_logprobs", json_integer(top))))
        return resp_oom(e);
    int64_t max = 0;
    bool max_given = false;
    TD_TRY(req_int(body, "max_output_tokens", 1, INT32_MAX, &max, &max_given, e));
    if (max_given && json_object_set_new(chat, "max_completion_tokens", json_integer(max)))
        return resp_oom(e);
    const json_t *reasoning = req_field(body, "reasoning");
    if (reasoning && !json_is_object(reasoning))
        return req_bad_type(e, "reasoning", "an object", reasoning);
    const json_t *effort = req_field(reasoning, "effort");
    if (effort)
        TD_TRY(req_effort(effort, "reasoning.effort", e));
    if (effort && json_object_set(chat, "reasoning_effort", (json_t *)effort) != 0)
        return resp_oom(e);
    const json_t *trunc = req_field(body, "truncation");
    if (trunc && (!json_is_string(trunc) || (strcmp(json_string_value(trunc), "auto") &&
                                             strcmp(json_string_value(trunc), "disabled"))))
        return apierr_set(e, 400, "invalid_value", "truncation",
                          "Invalid value for 'truncation': expected 'auto' or 'disabled'.");
    if (trunc && strcmp(json_string_value(trunc), "auto") == 0 &&
        json_object_set_new(chat, "truncate_prompt_tokens", json_integer(-1)))
        return resp_oom(e);
    const json_t *meta = req_field(body, "metadata");
    if (meta && !json_is_object(meta))
        return req_bad_type(e, "metadata", "an object", meta);
    return TD_OK;
}

/* previous_response_id: the conversation kept with that response, into *history. */
static td_err resp_history(const json_t *body, rstore *store, json_t **history, api_error *e)
{
    *history = NULL;
    const json_t *prev = req_field(body, "previous_response_id");
    if (!prev)
        return TD_OK;
    if (!json_is_string(prev))
        return req_bad_type(e, "previous_response_id", "a string", prev);
    if (!store)
        return apierr_set(e, 400, "unsupported_parameter", "previous_response_id",
                          "Unsupported parameter: 'previous_response_id': this gateway keeps no "
                          "responses (--responses-kept 0); send the whole conversation in "
                          "'input'.");
    if (!rstore_get(store, json_string_value(prev), RSTORE_CONV, history))
        return apierr_set(e, 404, "previous_response_not_found", "previous_response_id",
                          "Previous response with id '%s' not found.",
                          json_string_value(prev));
    return TD_OK;
}

td_err req_parse_responses(gw_request *r, const char *body, size_t len, rstore *store,
                           api_error *e)
{
    memset(r, 0, sizeof *r);
    json_t *orig, *history = NULL;
    TD_TRY(req_load_json(body, len, &orig, e));
    json_t *chat = json_object();
    td_err err = chat ? TD_OK : resp_oom(e);
    for (size_t k = 0; err == TD_OK && k < sizeof RESP_PASS / sizeof RESP_PASS[0]; k++) {
        json_t *v = json_object_get(orig, RESP_PASS[k]);
        if (v && json_object_set(chat, RESP_PASS[k], v) != 0)
            err = resp_oom(e);
    }
    if (err == TD_OK)
        err = resp_settings(r, orig, chat, store, e);
    if (err == TD_OK)
        err = resp_history(orig, store, &history, e);
    if (err == TD_OK)
        err = resp_messages(r, orig, history, chat, e);
    json_decref(history);
    if (err == TD_OK)
        err = resp_tools(orig, chat, e);
    if (err == TD_OK)
        err = resp_tool_choice(orig, chat, e);
    if (err == TD_OK)
        err = resp_format(orig, chat, e);
    if (err != TD_OK) {
        json_decref(orig);
        json_decref(chat);
        json_decref(r->resp_conv);
        memset(r, 0, sizeof *r);
        return err;
    }
    r->responses = true;
    r->resp = orig;
    return req_parse_root(r, REQ_CHAT, chat, e);
}
