#include "gateway/request.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/callm.h"
#include "common/jsonc.h"

const char *req_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown value";
}

static td_err req_bad_type(api_error *e, const char *param, const char *expected, const json_t *v)
{
    return apierr_set(e, 400, "invalid_type", param,
                      "Invalid type for '%s': expected %s, but got %s instead.", param, expected,
                      req_type_name(v));
}

td_err req_load_json(const char *body, size_t len, json_t **root, api_error *e)
{
    json_error_t je;
    *root = NULL;
    json_t *v = json_loadb(body, len, 0, &je);
    if (!v)
        return apierr_set(e, 400, "invalid_json", NULL,
                          "The request body is not valid JSON: %s (line %d, column %d).", je.text,
                          je.line, je.column);
    if (!json_is_object(v)) {
        td_err r = apierr_set(e, 400, "invalid_json", NULL,
                              "The request body must be a JSON object, but got %s instead.",
                              req_type_name(v));
        json_decref(v);
        return r;
    }
    *root = v;
    return TD_OK;
}

/* --- typed fields: absent or null keeps the default -------------------------------------- */

static const json_t *req_field(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

static td_err req_bool(const json_t *obj, const char *key, const char *param, bool *out,
                       api_error *e)
{
    const json_t *v = req_field(obj, key);
    if (!v)
        return TD_OK;
    if (!json_is_boolean(v))
        return req_bad_type(e, param, "a boolean", v);
    *out = json_is_true(v);
    return TD_OK;
}

/* Integers, and numbers with an integral value (2.0) as JavaScript clients send them. */
static td_err req_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                      bool *given, api_error *e)
{
    const json_t *v = req_field(obj, key);
    if (given)
        *given = v != NULL;
    if (!v)
        return TD_OK;
    int64_t x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (int64_t)json_real_value(v);
    } else {
        return req_bad_type(e, key, "an integer", v);
    }
    if (x < lo || x > hi)
        return apierr_set(e, 400, "invalid_value", key,
                          "Invalid value for '%s': expected an integer from %lld to %lld, but got "
                          "%lld instead.",
                          key, (long long)lo, (long long)hi, (long long)x);
    *out = x;
    return TD_OK;
}

/* A number in [lo, hi], or in (lo, hi] when lo_open. */
static td_err req_number(const json_t *obj, const char *key, double lo, bool lo_open, double hi,
                         double *out, api_error *e)
{
    const json_t *v = req_field(obj, key);
    if (!v)
        return TD_OK;
    if (!json_is_number(v))
        return req_bad_type(e, key, "a number", v);
    double x = json_number_value(v);
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
        return apierr_set(e, 400, "invalid_value", key,
                          "Invalid value for '%s': expected a number in %c%g, %g], but got %g "
                          "instead.",
                          key, lo_open ? '(' : '[', lo, hi, x);
    *out = x;
    return TD_OK;
}

/* A JSON integer in [0, max] (a token id), into *out. */
static bool req_token_id(const json_t *v, json_int_t max, uint32_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max)
        return false;
    *out = (uint32_t)json_integer_value(v);
    return true;
}

/* --- chat messages -------------------------------------------------------------------------- */

static bool req_role_known(const char *role)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (strcmp(role, roles[i]) == 0)
            return true;
    return false;
}

/* Text given as a string or as an array of text parts ({"type": "text", "text": ...}; other
 * part types are images and audio, which a text model cannot read), the parts joined with
 * sep; base names the field in errors. */
static td_err req_text_parts(const json_t *c, const char *base, const char *sep, json_t **out,
                             api_error *e)
{
    char param[APIERR_PARAM_MAX];
    if (json_is_string(c)) {
        *out = json_incref((json_t *)c);
        return TD_OK;
    }
    if (!json_is_array(c))
        return req_bad_type(e, base, "a string or an array of content parts", c);
    size_t total = 0, i;
    const json_t *part;
    json_array_foreach(c, i, part) {
        snprintf(param, sizeof param, "%s[%zu]", base, i);
        if (!json_is_object(part))
            return req_bad_type(e, param, "an object", part);
        const json_t *type = json_object_get(part, "type");
        const json_t *text = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0)
            return apierr_set(e, 400, "invalid_value", param,
                              "Only text content parts are supported; %s has type '%s'.", param,
                              json_is_string(type) ? json_string_value(type) : "(none)");
        if (!json_is_string(text)) {
            snprintf(param, sizeof param, "%s[%zu].text", base, i);
            return req_bad_type(e, param, "a string", text ? text : json_null());
        }
        total += json_string_length(text) + strlen(sep);
    }
    char *joined = malloc(total + 1);
    if (!joined)
        return apierr_set(e, 500, NULL, NULL, "out of memory");
    size_t n = 0;
    json_array_foreach(c, i, part) {
        const json_t *text = json_object_get(part, "text");
        if (i > 0) {
            memcpy(joined + n, sep, strlen(sep));
            n += strlen(sep);
        }
        memcpy(joined + n, json_string_value(text), json_string_length(text));
        n += json_string_length(text);
    }
    *out = json_stringn(joined, n);
    free(joined);
    if (!*out)
        return apierr_set(e, 500, NULL, NULL, "out of memory");
    return TD_OK;
}

/* Content as the templates want it: a string, text parts joined with "\n". */
static td_err req_content(const json_t *c, size_t mi, json_t **out, api_error *e)
{
    char base[APIERR_PARAM_MAX];
    snprintf(base, sizeof base, "messages[%zu].content", mi);
    return req_text_parts(c, base, "\n", out, e);
}

/* An assistant message's tool calls, with string arguments that hold a JSON object turned into
 * that object: the Qwen templates iterate the arguments as a mapping. */
static td_err req_tool_calls(const json_t *calls, size_t mi, json_t **out, api_error *e)
{
    char param[APIERR_PARAM_MAX];
    snprintf(param, sizeof param, "messages[%zu].tool_calls", mi);
    if (!json_is_array(calls))
        return req_bad_type(e, param, "an array", calls);
    json_t *copy = json_array();
    size_t i;
    const json_t *call;
    json_array_foreach(calls, i, call) {
        snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu]", mi, i);
        const json_t *fn = json_is_object(call) ? json_object_get(call, "function") : NULL;
        const json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        const json_t *args = json_is_object(fn) ? json_object_get(fn, "arguments") : NULL;
        if (!json_is_object(call)) {
            json_decref(copy);
            return req_bad_type(e, param, "an object", call);
        }
        if (!json_is_object(fn) || !json_is_string(name)) {
            json_decref(copy);
            return apierr_set(e, 400, "invalid_value", param,
                              "Invalid value for '%s': expected a function with a string name.",
                              param);
        }
        if (args && !json_is_string(args) && !json_is_object(args) && !json_is_null(args)) {
            json_decref(copy);
            snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu].function.arguments",
                     mi, i);
            return req_bad_type(e, param, "a string", args);
        }
        json_t *fn2 = json_copy((json_t *)fn);
        if (json_is_string(args)) {
            json_t *parsed = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
            if (json_is_object(parsed))
                json_object_set(fn2, "arguments", parsed);
            json_decref(parsed);
        } else if (!args || json_is_null(args)) {
            json_object_set_new(fn2, "arguments", json_object());
        }
        json_t *call2 = json_copy((json_t *)call);
        json_object_set_new(call2, "function", fn2);
        json_array_append_new(copy, call2);
    }
    *out = copy;
    return TD_OK;
}

static td_err req_message(const json_t *m, size_t mi, json_t *out_list, api_error *e)
{
    char param[APIERR_PARAM_MAX];
    snprintf(param, sizeof param, "messages[%zu]", mi);
    if (!json_is_object(m))
        return req_bad_type(e, param, "an object", m);
    snprintf(param, sizeof param, "messages[%zu].role", mi);
    const json_t *role = json_object_get(m, "role");
    if (!role)
        return apierr_set(e, 400, "missing_required_parameter", param,
                          "Missing required parameter: '%s'.", param);
    if (!json_is_string(role))
        return req_bad_type(e, param, "a string", role);
    if (!req_role_known(json_string_value(role)))
        return apierr_set(e, 400, "invalid_value", param,
                          "Invalid value for '%s': '%s'. Supported values are: 'system', "
                          "'developer', 'user', 'assistant' and 'tool'.",
                          param, json_string_value(role));
    bool assistant = strcmp(json_string_value(role), "assistant") == 0;

    json_t *msg = json_copy((json_t *)m);
    if (!msg)
        return apierr_set(e, 500, NULL, NULL, "out of memory");
    /* The Qwen templates know system, user, assistant and tool. */
    if (strcmp(json_string_value(role), "developer") == 0)
        json_object_set_new(msg, "role", json_string("system"));

    const json_t *content = req_field(m, "content");
    td_err r = TD_OK;
    if (content) {
        json_t *c = NULL;
        r = req_content(content, mi, &c, e);
        if (r == TD_OK)
            json_object_set_new(msg, "content", c);
    } else if (!assistant) {
        snprintf(param, sizeof param, "messages[%zu].content", mi);
        r = apierr_set(e, 400, "missing_required_parameter", param,
                       "Missing required parameter: '%s'.", param);
    }
    static const char *const text_fields[] = {"name", "tool_call_id", "reasoning_content"};
    for (size_t k = 0; r == TD_OK && k < sizeof text_fields / sizeof text_fields[0]; k++) {
        const json_t *v = req_field(m, text_fields[k]);
        if (v && !json_is_string(v)) {
            snprintf(param, sizeof param, "messages[%zu].%s", mi, text_fields[k]);
            r = req_bad_type(e, param, "a string", v);
        }
    }
    const json_t *calls = req_field(m, "tool_calls");
    if (r == TD_OK && calls) {
        json_t *c = NULL;
        r = req_tool_calls(calls, mi, &c, e);
        if (r == TD_OK)
            json_object_set_new(msg, "tool_calls", c);
    }
    if (r != TD_OK) {
        json_decref(msg);
        return r;
    }
    json_array_append_new(out_list, msg);
    return TD_OK;
}


/* tool_choice {"type": "function", "function": {"name": N}}: the model is told about N alone
 * and must call it (a required call with one tool). */
static td_err req_named_tool(gw_request *r, const json_t *choice, api_error *e)
{
    const json_t *fn = json_object_get(choice, "function");
    const json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
    if (!json_is_string(name))
        return apierr_set(e, 400, "invalid_value", "tool_choice",
                          "Invalid value for 'tool_choice': expected {\"type\": \"function\", "
                          "\"function\": {\"name\": ...}}.");
    size_t i;
    const json_t *t;
    json_array_foreach(r->tools, i, t) {
        const json_t *tn = json_object_get(json_object_get(t, "function"), "name");
        if (json_equal(tn, name)) {
            json_decref(r->named_tools);
            r->named_tools = json_array();
            if (!r->named_tools || json_array_append(r->named_tools, (json_t *)t) != 0)
                return apierr_set(e, 500, NULL, NULL, "out of memory for the tools");
            r->tools = r->named_tools;
            r->force_call = true;
            return TD_OK;
        }
    }
    return apierr_set(e, 400, "invalid_value", "tool_choice",
                      "Invalid value for 'tool_choice': no tool named '%s' in 'tools'.",
                      json_string_value(name));
}
static td_err req_chat(gw_request *r, api_error *e)
{
    const json_t *msgs = json_object_get(r->root, "messages");
    if (!msgs)
        return apierr_set(e, 400, "missing_required_parameter", "messages",
                          "Missing required parameter: 'messages'.");
    if (!json_is_array(msgs))
        return req_bad_type(e, "messages", "an array", msgs);
    if (json_array_size(msgs) == 0)
        return apierr_set(e, 400, "empty_array", "messages",
                          "Invalid 'messages': empty array. Expected an array with minimum "
                          "length 1, but got an empty array instead.");
    r->messages = json_array();
    if (!r->messages)
        return apierr_set(e, 500, NULL, NULL, "out of memory");
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m) TD_TRY(req_message(m, i, r->messages, e));

    const json_t *tools = req_field(r->root, "tools");
    if (tools) {
        if (!json_is_array(tools))
            return req_bad_type(e, "tools", "an array", tools);
        const json_t *t;
        json_array_foreach(tools, i, t) {
            char param[APIERR_PARAM_MAX];
            snprintf(param, sizeof param, "tools[%zu]", i);
            const json_t *fn = json_is_object(t) ? json_object_get(t, "function") : NULL;
            const json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
            if (!json_is_string(name))
                return apierr_set(e, 400, "invalid_value", param,
                                  "Invalid value for '%s': expected {\"type\": \"function\", "
                                  "\"function\": {\"name\": ...}}.",
                                  param);
        }
        if (json_array_size(tools) > 0)
            r->tools = tools;
    }
    const json_t *choice = req_field(r->root, "tool_choice");
    bool choice_none = false;
    if (choice) {
        if (json_is_string(choice)) {
            const char *c = json_string_value(choice);
            if (strcmp(c, "none") && strcmp(c, "auto") && strcmp(c, "required"))
                return apierr_set(e, 400, "invalid_value", "tool_choice",
                                  "Invalid value for 'tool_choice': '%s'. Supported values are: "
                                  "'none', 'auto', 'required' or a function object.",
                                  c);
            choice_none = strcmp(c, "none") == 0;
            r->force_call = strcmp(c, "required") == 0;
        } else if (json_is_object(choice)) {
            TD_TRY(req_named_tool(r, choice, e));
        } else {
            return req_bad_type(e, "tool_choice", "a string or an object", choice);
        }
        if (r->force_call && !r->tools)
            return apierr_set(e, 400, "invalid_value", "tool_choice",
                              "Invalid value for 'tool_choice': a tool call is required but no "
                              "'tools' were given.");
    }
    r->parallel_calls = true;
    TD_TRY(req_bool(r->root, "parallel_tool_calls", "parallel_tool_calls", &r->parallel_calls,
                    e));
    /* tool_choice "none": the model is not told about the tools and nothing is parsed. */
    if (choice_none)
        r->tools = NULL;
    r->parse_tools = r->tools != NULL;

    r->add_generation_prompt = true;
    TD_TRY(req_bool(r->root, "add_generation_prompt", "add_generation_prompt",
                    &r->add_generation_prompt, e));
    const json_t *kw = req_field(r->root, "chat_template_kwargs");
    if (kw) {
        if (!json_is_object(kw))
            return req_bad_type(e, "chat_template_kwargs", "an object", kw);
        r->template_kwargs = kw;
        const json_t *think = req_field(kw, "enable_thinking");
        if (think) {
            if (!json_is_boolean(think))
                return req_bad_type(e, "chat_template_kwargs.enable_thinking", "a boolean", think);
            r->enable_thinking = json_is_true(think) ? CHAT_THINK_ON : CHAT_THINK_OFF;
        }
    }

    bool given = false;
    int64_t top = 0;
    TD_TRY(req_bool(r->root, "logprobs", "logprobs", &r->logprobs, e));
    TD_TRY(req_int(r->root, "top_logprobs", 0, REQ_TOP_LOGPROBS_MAX, &top, &given, e));
    if (given && !r->logprobs)
        return apierr_set(e, 400, "invalid_value", "top_logprobs",
                          "Invalid value for 'top_logprobs': 'logprobs' must be set to true "
                          "when 'top_logprobs' is used.");
    r->top_logprobs = (uint32_t)top;

    /* max_completion_tokens replaces the deprecated max_tokens when both are given. */
    TD_TRY(req_int(r->root, "max_tokens", 1, INT32_MAX, &r->max_tokens, NULL, e));
    TD_TRY(req_int(r->root, "max_completion_tokens", 1, INT32_MAX, &r->max_tokens, NULL, e));
    return TD_OK;
}

/* --- completions ---------------------------------------------------------------------------- */

static td_err req_prompt_ids(req_prompt *pr, const json_t *arr, const char *param, api_error *e)
{
    size_t n = json_array_size(arr);
    pr->ids = malloc((n ? n : 1) * sizeof *pr->ids);
    if (!pr->ids)
        return apierr_set(e, 500, NULL, NULL, "out of memory");
    size_t i;
    const json_t *v;
    json_array_foreach(arr, i, v) {
        uint32_t id;
        if (!req_token_id(v, INT32_MAX, &id)) {
            char p[APIERR_PARAM_MAX];
            snprintf(p, sizeof p, "%s[%zu]", param, i);
            return apierr_set(e, 400, "invalid_value", p,
                              "Invalid value for '%s': expected a token id (a non-negative "
                              "integer).",
                              p);
        }
        pr->ids[i] = (int32_t)id;
    }
    pr->n_ids = n;
    return TD_OK;
}

/* One prompt: a string or an array of token ids (param names it in errors). */
static td_err req_one_prompt(req_prompt *pr, const json_t *p, const char *param, api_error *e)
{
    if (json_is_string(p)) {
        pr->text = json_string_value(p);
        pr->len = json_string_length(p);
    } else if (json_is_array(p)) {
        TD_TRY(req_prompt_ids(pr, p, param, e));
    } else {
        return req_bad_type(e, param, "a string or an array of token ids", p);
    }
    if (pr->text ? pr->len == 0 : pr->n_ids == 0)
        return apierr_set(e, 400, "invalid_value", param,
                          "Invalid value for '%s': the prompt is empty.", param);
    return TD_OK;
}

static td_err req_completion(gw_request *r, api_error *e)
{
    const json_t *p = json_object_get(r->root, "prompt");
    if (!p || json_is_null(p))
        return apierr_set(e, 400, "missing_required_parameter", "prompt",
                          "Missing required parameter: 'prompt'.");
    /* A string, an array of token ids, or a batch: an array of strings and id arrays. */
    const json_t *first = json_array_get(p, 0);
    const bool batch = json_is_array(p) && (json_is_string(first) || json_is_array(first));
    size_t n = batch ? json_array_size(p) : 1;
    if (n > REQ_PROMPTS_MAX)
        return apierr_set(e, 400, "invalid_value", "prompt",
                          "Invalid value for 'prompt': at most %d prompts per request are "
                          "supported, got %zu.",
                          REQ_PROMPTS_MAX, n);
    if (!(r->prompts = calloc(n, sizeof *r->prompts)))
        return apierr_set(e, 500, NULL, NULL, "out of memory");
    r->n_prompts = n;
    for (size_t i = 0; i < n; i++) {
        char param[APIERR_PARAM_MAX] = "prompt";
        if (batch)
            snprintf(param, sizeof param, "prompt[%zu]", i);
        TD_TRY(req_one_prompt(&r->prompts[i], batch ? json_array_get(p, i) : p, param, e));
    }

    TD_TRY(req_bool(r->root, "echo", "echo", &r->echo, e));
    /* The legacy completions API generates 16 tokens unless told otherwise; with echo, 0
     * scores the prompt alone. */
    r->max_tokens = 16;
    TD_TRY(req_int(r->root, "max_tokens", r->echo ? 0 : 1, INT32_MAX, &r->max_tokens, NULL, e));
    int64_t lp = 0;
    bool given = false;
    TD_TRY(req_int(r->root, "logprobs", 0, REQ_TOP_LOGPROBS_MAX, &lp, &given, e));
    r->logprobs = given;
    r->top_logprobs = (uint32_t)lp;
    const json_t *suffix = req_field(r->root, "suffix");
    if (suffix && (!json_is_string(suffix) || json_string_length(suffix) > 0))
        return apierr_set(e, 400, "unsupported_value", "suffix",
                          "Unsupported value for 'suffix': insertion is not supported.");
    int64_t best_of = 0;
    TD_TRY(req_int(r->root, "best_of", 1, REQ_N_MAX, &best_of, NULL, e));
    r->best_of = (uint32_t)best_of;
    return TD_OK;
}

/* best_of against n and stream, once both are read: at least n candidates (n when absent),
 * and a stream cannot show candidates that are only ranked at the end. */
static td_err req_best_of(gw_request *r, api_error *e)
{
    if (r->best_of == 0)
        r->best_of = r->n;
    if (r->best_of < r->n)
        return apierr_set(e, 400, "invalid_value", "best_of",
                          "Invalid value for 'best_of': it must be at least n (%u), but got %u.",
                          r->n, r->best_of);
    if (r->n_prompts * r->best_of > REQ_GENERATIONS_MAX)
        return apierr_set(e, 400, "invalid_value", "prompt",
                          "Invalid value for 'prompt': %zu prompts of %u candidates each make "
                          "more than the %d generations a request may have.",
                          r->n_prompts, r->best_of, REQ_GENERATIONS_MAX);
    if (r->stream && r->best_of > r->n)
        return apierr_set(e, 400, "invalid_value", "best_of",
                          "Invalid value for 'best_of': a stream cannot rank %u candidates to "
                          "send %u; stream with best_of equal to n.",
                          r->best_of, r->n);
    return TD_OK;
}

/* --- fields both endpoints share ------------------------------------------------------------- */

static td_err req_stop(gw_request *r, api_error *e)
{
    const json_t *s = req_field(r->root, "stop");
    if (!s)
        return TD_OK;
    if (json_is_string(s)) {
        if (json_string_length(s) > REQ_STOP_LEN_MAX)
            return apierr_set(e, 400, "invalid_value", "stop",
                              "Invalid value for 'stop': a stop string may be at most %d bytes.",
                              REQ_STOP_LEN_MAX);
        if (json_string_length(s) > 0) {
            r->stop[0] = json_string_value(s);
            r->stop_len[0] = json_string_length(s);
            r->n_stop = 1;
        }
        return TD_OK;
    }
    if (!json_is_array(s))
        return req_bad_type(e, "stop", "a string or an array of strings", s);
    if (json_array_size(s) > REQ_STOP_MAX)
        return apierr_set(e, 400, "invalid_value", "stop",
                          "Invalid value for 'stop': at most %d stop strings are supported, got "
                          "%zu.",
                          REQ_STOP_MAX, json_array_size(s));
    size_t i;
    const json_t *v;
    json_array_foreach(s, i, v) {
        char param[APIERR_PARAM_MAX];
        snprintf(param, sizeof param, "stop[%zu]", i);
        if (!json_is_string(v))
            return req_bad_type(e, param, "a string", v);
        if (json_string_length(v) > REQ_STOP_LEN_MAX)
            return apierr_set(e, 400, "invalid_value", param,
                              "Invalid value for '%s': a stop string may be at most %d bytes.",
                              param, REQ_STOP_LEN_MAX);
        /* An empty stop string would end every generation before its first token. */
        if (json_string_length(v) == 0)
            continue;
        r->stop[r->n_stop] = json_string_value(v);
        r->stop_len[r->n_stop] = json_string_length(v);
        r->n_stop++;
    }
    return TD_OK;
}

/* logit_bias: {"token id": bias, ...}, a bias in [-100, 100], at most REQ_BIAS_MAX entries;
 * keys are decimal token ids (checked against the vocabulary when the prompt is made), and
 * one id written twice ("7", "07") is refused. */
static td_err req_logit_bias(gw_request *r, api_error *e)
{
    const json_t *lb = req_field(r->root, "logit_bias");
    if (!lb)
        return TD_OK;
    if (!json_is_object(lb))
        return req_bad_type(e, "logit_bias", "an object", lb);
    const size_t n = json_object_size(lb);
    if (n > REQ_BIAS_MAX)
        return apierr_set(e, 400, "invalid_value", "logit_bias",
                          "Invalid value for 'logit_bias': at most %d entries, but got %zu.",
                          REQ_BIAS_MAX, n);
    if (n == 0)
        return TD_OK;
    r->bias_tok = malloc(n * sizeof *r->bias_tok);
    r->bias = malloc(n * sizeof *r->bias);
    if (!r->bias_tok || !r->bias)
        return apierr_set(e, 500, NULL, NULL, "out of memory for 'logit_bias'");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)lb, key, v) {
        uint64_t id = 0;
        size_t len = strlen(key);
        bool ok = len >= 1 && len <= 10;
        for (size_t i = 0; ok && i < len; i++) {
            ok = key[i] >= '0' && key[i] <= '9';
            id = id * 10 + (uint64_t)(key[i] - '0');
        }
        if (!ok || id > UINT32_MAX)
            return apierr_set(e, 400, "invalid_value", "logit_bias",
                              "Invalid key in 'logit_bias': keys must be token ids (decimal "
                              "integers).");
        if (!json_is_number(v))
            return req_bad_type(e, "logit_bias", "numbers as values", v);
        const double x = json_number_value(v);
        if (!(x >= -100 && x <= 100))
            return apierr_set(e, 400, "invalid_value", "logit_bias",
                              "Invalid value for 'logit_bias': the bias of token %llu must be "
                              "from -100 to 100, but got %g instead.",
                              (unsigned long long)id, x);
        for (size_t j = 0; j < r->n_bias; j++)
            if (r->bias_tok[j] == id)
                return apierr_set(e, 400, "invalid_value", "logit_bias",
                                  "Invalid value for 'logit_bias': token %llu appears twice.",
                                  (unsigned long long)id);
        r->bias_tok[r->n_bias] = (uint32_t)id;
        r->bias[r->n_bias] = (float)x;
        r->n_bias++;
    }
    return TD_OK;
}

/* stop_token_ids: at most REQ_STOP_IDS_MAX token ids (checked against the vocabulary when the
 * prompt is made). */
static td_err req_stop_ids(gw_request *r, api_error *e)
{
    const json_t *a = req_field(r->root, "stop_token_ids");
    if (!a)
        return TD_OK;
    if (!json_is_array(a))
        return req_bad_type(e, "stop_token_ids", "an array", a);
    if (json_array_size(a) > REQ_STOP_IDS_MAX)
        return apierr_set(e, 400, "invalid_value", "stop_token_ids",
                          "Invalid value for 'stop_token_ids': at most %d token ids, but got %zu.",
                          REQ_STOP_IDS_MAX, json_array_size(a));
    size_t i;
    const json_t *v;
    json_array_foreach(a, i, v) {
        if (!req_token_id(v, UINT32_MAX, &r->stop_ids[r->n_stop_ids]))
            return apierr_set(e, 400, "invalid_value", "stop_token_ids",
                              "Invalid value for 'stop_token_ids': item %zu is not a token id.",
                              i);
        r->n_stop_ids++;
    }
    return TD_OK;
}

/* response_format: {"type": "text"}, {"type": "json_object"} (one JSON object), or
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}} (one
 * JSON value valid under the schema; without "schema", any JSON value). The schema is compiled
 * here so that what the matcher cannot enforce is this request's 400, not a failed
 * generation. */
/* A JSON Schema (schema, named param in errors; NULL: any JSON value) as the format, compiled
 * here so that what the matcher cannot enforce is this request's 400. */
static td_err req_json_schema(gw_request *r, const json_t *schema, const char *param,
                              api_error *e)
{
    if (schema && !json_is_object(schema) && !json_is_boolean(schema))
        return apierr_set(e, 400, "invalid_type", param,
                          "Invalid type for '%s': expected an object.", param);
    char *text = schema ? json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY) : strdup("true");
    if (!text)
        return apierr_set(e, 500, NULL, NULL, "out of memory for the response format's schema");
    const size_t n = strlen(text);
    if (n > MSG_SCHEMA_MAX) {
        free(text);
        return apierr_set(e, 400, "invalid_value", param,
                          "Invalid value for '%s': %zu bytes as compact JSON, at most %u are "
                          "supported.",
                          param, n, MSG_SCHEMA_MAX);
    }
    jc_schema *compiled = NULL;
    const td_err c = jc_compile(text, n, &compiled);
    jc_schema_free(compiled);
    if (c != TD_OK) {
        free(text);
        if (c == TD_ENOMEM)
            return apierr_set(e, 500, NULL, NULL, "%s", err_msg());
        return apierr_set(e, 400, c == TD_ENOTSUP ? "unsupported_value" : "invalid_value", param,
                          "Invalid value for '%s': %s", param, err_msg());
    }
    r->format = MSG_FORMAT_JSON_SCHEMA;
    r->schema = text;
    r->n_schema = n;
    return TD_OK;
}

static td_err req_response_format(gw_request *r, api_error *e)
{
    r->format = MSG_FORMAT_TEXT;
    const json_t *rf = req_field(r->root, "response_format");
    if (!rf)
        return TD_OK;
    if (!json_is_object(rf))
        return req_bad_type(e, "response_format", "an object", rf);
    const json_t *type = json_object_get(rf, "type");
    if (!json_is_string(type))
        return apierr_set(e, 400, "invalid_value", "response_format.type",
                          "Invalid value for 'response_format.type': expected a string.");
    const char *t = json_string_value(type);
    if (strcmp(t, "text") == 0)
        return TD_OK;
    if (strcmp(t, "json_object") == 0) {
        r->format = MSG_FORMAT_JSON_OBJECT;
        return TD_OK;
    }
    if (strcmp(t, "json_schema") != 0)
        return apierr_set(e, 400, "unsupported_value", "response_format.type",
                          "Unsupported value for 'response_format.type': '%s'; supported are "
                          "'text', 'json_object' and 'json_schema'.", t);
    const json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return apierr_set(e, 400, "invalid_value", "response_format.json_schema",
                          "Invalid value for 'response_format.json_schema': expected an object.");
    const json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict");
    if (name && !json_is_string(name))
        return apierr_set(e, 400, "invalid_type", "response_format.json_schema.name",
                          "Invalid type for 'response_format.json_schema.name': expected a "
                          "string.");
    if (strict && !json_is_boolean(strict) && !json_is_null(strict))
        return apierr_set(e, 400, "invalid_type", "response_format.json_schema.strict",
                          "Invalid type for 'response_format.json_schema.strict': expected a "
                          "boolean.");
    return req_json_schema(r, json_object_get(js, "schema"), "response_format.json_schema.schema",
                           e);
}

/* vLLM's guided decoding: guided_json (a schema, or its JSON text), guided_choice (strings),
 * or structured_outputs {"json": ...} / {"choice": [...]}; one way of asking at most. */
static td_err req_guided(gw_request *r, api_error *e)
{
    const json_t *gj = req_field(r->root, "guided_json");
    const json_t *gc = req_field(r->root, "guided_choice");
    const json_t *so = req_field(r->root, "structured_outputs");
    const char *param = gj ? "guided_json" : gc ? "guided_choice" : "structured_outputs";
    if (!gj && !gc && !so)
        return TD_OK;
    if ((gj != NULL) + (gc != NULL) + (so != NULL) > 1 || r->format != MSG_FORMAT_TEXT)
        return apierr_set(e, 400, "invalid_value", param,
                          "Invalid value for '%s': ask for one structured output only "
                          "(response_format, guided_json, guided_choice, structured_outputs).",
                          param);
    if (so) {
        if (!json_is_object(so))
            return req_bad_type(e, "structured_outputs", "an object", so);
        gj = json_object_get(so, "json");
        gc = json_object_get(so, "choice");
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)so, k, v) {
            if (strcmp(k, "json") != 0 && strcmp(k, "choice") != 0)
                return apierr_set(e, 400, "unsupported_value", "structured_outputs",
                                  "Unsupported value for 'structured_outputs': '%s'; supported "
                                  "are 'json' and 'choice'.",
                                  k);
        }
        if ((gj != NULL) == (gc != NULL))
            return apierr_set(e, 400, "invalid_value", "structured_outputs",
                              "Invalid value for 'structured_outputs': give one of 'json' and "
                              "'choice'.");
        param = gj ? "structured_outputs.json" : "structured_outputs.choice";
    }
    if (gj && json_is_string(gj)) { /* the schema as JSON text */
        json_t *parsed = json_loads(json_string_value(gj), 0, NULL);
        if (!parsed)
            return apierr_set(e, 400, "invalid_value", param,
                              "Invalid value for '%s': the text is not JSON.", param);
        td_err err = req_json_schema(r, parsed, param, e);
        json_decref(parsed);
        return err;
    }
    if (gj)
        return req_json_schema(r, gj, param, e);
    if (!json_is_array(gc))
        return req_bad_type(e, param, "an array of strings", gc);
    json_t *spec = json_pack("{s:s,s:O}", "form", "choice", "choices", gc);
    char *text = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(spec);
    if (!text)
        return apierr_set(e, 500, NULL, NULL, "out of memory");
    cm_grammar *g = NULL;
    td_err c = strlen(text) > MSG_SCHEMA_MAX
                   ? err_set(TD_ENOTSUP, "%zu bytes as JSON, at most %u are supported",
                             strlen(text), MSG_SCHEMA_MAX)
                   : cm_compile(text, strlen(text), &g);
    cm_free(g);
    if (c != TD_OK) {
        free(text);
        if (c == TD_ENOMEM)
            return apierr_set(e, 500, NULL, NULL, "%s", err_msg());
        return apierr_set(e, 400, c == TD_ENOTSUP ? "unsupported_value" : "invalid_value", param,
                          "Invalid value for '%s': %s", param, err_msg());
    }
    r->format = MSG_FORMAT_CHOICE;
    r->schema = text;
    r->n_schema = strlen(text);
    return TD_OK;
}

/* prediction: {"type": "content", "content": text or [{"type": "text", "text": ...}, ...]},
 * the parts joined. */
static td_err req_prediction(gw_request *r, api_error *e)
{
    const json_t *p = req_field(r->root, "prediction");
    if (!p)
        return TD_OK;
    if (!json_is_object(p))
        return req_bad_type(e, "prediction", "an object", p);
    const json_t *type = json_object_get(p, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "content") != 0)
        return apierr_set(e, 400, "invalid_value", "prediction.type",
                          "Invalid value for 'prediction.type': supported value is 'content'.");
    const json_t *c = json_object_get(p, "content");
    if (!c)
        return apierr_set(e, 400, "missing_required_parameter", "prediction.content",
                          "Missing required parameter: 'prediction.content'.");
    json_t *text;
    TD_TRY(req_text_parts(c, "prediction.content", "", &text, e));
    r->prediction_len = json_string_length(text);
    r->prediction = malloc(r->prediction_len + 1);
    if (r->prediction) {
        memcpy(r->prediction, json_string_value(text), r->prediction_len);
        r->prediction[r->prediction_len] = 0;
    }
    json_decref(text);
    return r->prediction ? TD_OK : apierr_set(e, 500, NULL, NULL, "out of memory");
}

static td_err req_common(gw_request *r, api_error *e)
{
    const json_t *model = req_field(r->root, "model");
    if (model && !json_is_string(model))
        return req_bad_type(e, "model", "a string", model);
    r->model = model ? json_string_value(model) : NULL;

    TD_TRY(req_bool(r->root, "stream", "stream", &r->stream, e));
    TD_TRY(req_prediction(r, e));
    const json_t *so = req_field(r->root, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return req_bad_type(e, "stream_options", "an object", so);
        if (!r->stream)
            return apierr_set(e, 400, "invalid_value", "stream_options",
                              "Invalid value for 'stream_options': only allowed when 'stream' is "
                              "true.");
        TD_TRY(req_bool(so, "include_usage", "stream_options.include_usage", &r->include_usage,
                        e));
        TD_TRY(req_bool(so, "continuous_usage_stats", "stream_options.continuous_usage_stats",
                        &r->continuous_usage, e));
    }
    int64_t n = 1;
    TD_TRY(req_int(r->root, "n", 1, REQ_N_MAX, &n, NULL, e));
    r->n = (uint32_t)n;

    req_sampling *s = &r->sampling;
    s->temperature = 1.0;
    s->top_p = 1.0;
    TD_TRY(req_number(r->root, "temperature", 0, false, 2, &s->temperature, e));
    TD_TRY(req_number(r->root, "top_p", 0, true, 1, &s->top_p, e));
    TD_TRY(req_number(r->root, "min_p", 0, false, 1, &s->min_p, e));
    TD_TRY(req_int(r->root, "top_k", -1, INT32_MAX, &s->top_k, NULL, e));
    if (s->top_k < 0)
        s->top_k = 0;
    int64_t seed = 0;
    TD_TRY(req_int(r->root, "seed", INT64_MIN, INT64_MAX, &seed, &s->has_seed, e));
    s->seed = (uint64_t)seed;
    TD_TRY(req_number(r->root, "presence_penalty", -2, false, 2, &s->presence_penalty, e));
    TD_TRY(req_number(r->root, "frequency_penalty", -2, false, 2, &s->frequency_penalty, e));
    s->repetition_penalty = 1.0;
    TD_TRY(req_number(r->root, "repetition_penalty", 0, true, MSG_REPETITION_MAX,
                      &s->repetition_penalty, e));
    TD_TRY(req_int(r->root, "min_tokens", 0, UINT32_MAX, &s->min_tokens, NULL, e));
    if (r->max_tokens >= 0 && s->min_tokens > r->max_tokens)
        return apierr_set(e, 400, "invalid_value", "min_tokens",
                          "Invalid value for 'min_tokens': %lld is more than max_tokens (%lld).",
                          (long long)s->min_tokens, (long long)r->max_tokens);
    TD_TRY(req_logit_bias(r, e));
    TD_TRY(req_response_format(r, e));
    TD_TRY(req_guided(r, e));
    if (r->force_call && r->format != MSG_FORMAT_TEXT)
        return apierr_set(e, 400, "invalid_value", "response_format",
                          "Invalid value for 'response_format': a required tool call "
                          "('tool_choice') and a structured answer cannot both be asked for.");
    if (r->force_call)
        r->format = MSG_FORMAT_TOOL_CALL;
    TD_TRY(req_stop_ids(r, e));
    TD_TRY(req_bool(r->root, "ignore_eos", "ignore_eos", &r->ignore_eos, e));
    TD_TRY(req_bool(r->root, "include_stop_str_in_output", "include_stop_str_in_output",
                    &r->keep_stop, e));
    return req_stop(r, e);
}

td_err req_parse(gw_request *r, req_kind kind, const char *body, size_t len, api_error *e)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = -1;
    td_err err = req_load_json(body, len, &r->root, e);
    if (err == TD_OK)
        err = kind == REQ_CHAT ? req_chat(r, e) : req_completion(r, e);
    if (err == TD_OK)
        err = req_common(r, e);
    if (err == TD_OK)
        err = req_best_of(r, e);
    if (err != TD_OK)
        req_free(r);
    return err;
}

void req_free(gw_request *r)
{
    json_decref(r->messages);
    json_decref(r->root);
    for (size_t i = 0; i < r->n_prompts; i++)
        free(r->prompts[i].ids);
    free(r->prompts);
    free(r->bias_tok);
    free(r->bias);
    free(r->schema);
    free(r->prediction);
    json_decref(r->named_tools);
    memset(r, 0, sizeof *r);
}

/* --- tokenize / detokenize ------------------------------------------------------------------ */

td_err req_parse_tokenize(const char *body, size_t len, json_t **root, const char **text,
                          size_t *text_len, bool *add_special, api_error *e)
{
    TD_TRY(req_load_json(body, len, root, e));
    const char *key = json_object_get(*root, "content") ? "content" : "prompt";
    const json_t *c = json_object_get(*root, key);
    td_err r = TD_OK;
    *add_special = true;
    if (!c)
        r = apierr_set(e, 400, "missing_required_parameter", "content",
                       "Missing required parameter: 'content'.");
    else if (!json_is_string(c))
        r = req_bad_type(e, key, "a string", c);
    else
        r = req_bool(*root, "add_special", "add_special", add_special, e);
    if (r != TD_OK) {
        json_decref(*root);
        *root = NULL;
        return r;
    }
    *text = json_string_value(c);
    *text_len = json_string_length(c);
    return TD_OK;
}

td_err req_parse_detokenize(const char *body, size_t len, uint32_t n_vocab, int32_t **ids,
                            size_t *n_ids, api_error *e)
{
    json_t *root = NULL;
    *ids = NULL;
    *n_ids = 0;
    TD_TRY(req_load_json(body, len, &root, e));
    const json_t *t = json_object_get(root, "tokens");
    td_err r = TD_OK;
    if (!t)
        r = apierr_set(e, 400, "missing_required_parameter", "tokens",
                       "Missing required parameter: 'tokens'.");
    else if (!json_is_array(t))
        r = req_bad_type(e, "tokens", "an array", t);
    int32_t *v = NULL;
    if (r == TD_OK) {
        v = malloc((json_array_size(t) + 1) * sizeof *v);
        if (!v)
            r = apierr_set(e, 500, NULL, NULL, "out of memory");
    }
    size_t i;
    const json_t *x;
    if (r == TD_OK) {
        json_array_foreach(t, i, x) {
            uint32_t id;
            if (!req_token_id(x, (json_int_t)n_vocab - 1, &id)) {
                char param[APIERR_PARAM_MAX];
                snprintf(param, sizeof param, "tokens[%zu]", i);
                r = apierr_set(e, 400, "invalid_value", param,
                               "Invalid value for '%s': expected a token id from 0 to %u.", param,
                               n_vocab - 1);
                break;
            }
            v[i] = (int32_t)id;
        }
    }
    if (r == TD_OK) {
        *ids = v;
        *n_ids = json_array_size(t);
    } else {
        free(v);
    }
    json_decref(root);
    return r;
}
