/* Chat requests (request.h): messages as the chat template wants them, tools and tool_choice,
 * the template's arguments. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/request_int.h"

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
td_err req_text_parts(const json_t *c, const char *base, const char *sep, json_t **out,
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


td_err req_effort(const json_t *v, const char *param, api_error *e)
{
    static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    for (size_t k = 0; json_is_string(v) && k < sizeof efforts / sizeof efforts[0]; k++)
        if (strcmp(json_string_value(v), efforts[k]) == 0)
            return TD_OK;
    return apierr_set(e, 400, "invalid_value", param,
                      "Invalid value for '%s': expected 'none', 'minimal', 'low', 'medium', "
                      "'high' or 'xhigh'.", param);
}

/* The tools of r named by names (function names as JSON strings, each one of r->tools) alone:
 * the model is told about those only. */
static td_err req_only_tools(gw_request *r, const json_t *names, api_error *e)
{
    json_t *only = json_array();
    if (!only)
        return apierr_set(e, 500, NULL, NULL, "out of memory for the tools");
    size_t k;
    const json_t *name;
    json_array_foreach(names, k, name) {
        size_t i;
        const json_t *t, *found = NULL;
        json_array_foreach(r->tools, i, t) {
            if (json_equal(json_object_get(json_object_get(t, "function"), "name"), name))
                found = t;
        }
        if (!found) {
            json_decref(only);
            return apierr_set(e, 400, "invalid_value", "tool_choice",
                              "Invalid value for 'tool_choice': no tool named '%s' in 'tools'.",
                              json_is_string(name) ? json_string_value(name) : "?");
        }
        if (json_array_append(only, (json_t *)found) != 0) {
            json_decref(only);
            return apierr_set(e, 500, NULL, NULL, "out of memory for the tools");
        }
    }
    json_decref(r->named_tools);
    r->named_tools = only;
    r->tools = only;
    return TD_OK;
}

/* tool_choice {"type": "function", "function": {"name": N}}: the model is told about N alone
 * and must call it (a required call with one tool); {"type": "allowed_tools", "allowed_tools":
 * {"mode": "auto" | "required", "tools": [{"type": "function", "function": {"name"}}, ...]}}:
 * it is told about those alone, and must call one of them with mode "required". */
static td_err req_named_tool(gw_request *r, const json_t *choice, api_error *e)
{
    const json_t *type = json_object_get(choice, "type");
    if (json_is_string(type) && strcmp(json_string_value(type), "allowed_tools") == 0) {
        const json_t *at = json_object_get(choice, "allowed_tools");
        const json_t *mode = json_object_get(at, "mode"), *list = json_object_get(at, "tools");
        const char *m = json_is_string(mode) ? json_string_value(mode) : "";
        if ((strcmp(m, "auto") && strcmp(m, "required")) || !json_is_array(list) ||
            json_array_size(list) == 0)
            return apierr_set(e, 400, "invalid_value", "tool_choice",
                              "Invalid value for 'tool_choice': expected {\"type\": "
                              "\"allowed_tools\", \"allowed_tools\": {\"mode\": \"auto\" or "
                              "\"required\", \"tools\": [{\"type\": \"function\", \"function\": "
                              "{\"name\": ...}}, ...]}}.");
        json_t *names = json_array();
        size_t i;
        const json_t *t;
        json_array_foreach(list, i, t) {
            const json_t *name = json_object_get(json_object_get(t, "function"), "name");
            if (!json_is_string(name) || json_array_append(names, (json_t *)name) != 0) {
                json_decref(names);
                return json_is_string(name)
                           ? apierr_set(e, 500, NULL, NULL, "out of memory for the tools")
                           : apierr_set(e, 400, "invalid_value", "tool_choice",
                                        "Invalid value for 'tool_choice': allowed_tools.tools[%zu] "
                                        "has no function name.", i);
            }
        }
        const td_err err = r->tools ? req_only_tools(r, names, e)
                                    : apierr_set(e, 400, "invalid_value", "tool_choice",
                                                 "Invalid value for 'tool_choice': allowed tools "
                                                 "but no 'tools' were given.");
        json_decref(names);
        r->force_call = err == TD_OK && strcmp(m, "required") == 0;
        return err;
    }
    const json_t *fn = json_object_get(choice, "function");
    const json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
    if (!json_is_string(name))
        return apierr_set(e, 400, "invalid_value", "tool_choice",
                          "Invalid value for 'tool_choice': expected {\"type\": \"function\", "
                          "\"function\": {\"name\": ...}} or {\"type\": \"allowed_tools\", ...}.");
    json_t *names = json_pack("[O]", name);
    const td_err err = names ? req_only_tools(r, names, e)
                             : apierr_set(e, 500, NULL, NULL, "out of memory for the tools");
    json_decref(names);
    r->force_call = err == TD_OK;
    return err;
}

td_err req_chat(gw_request *r, api_error *e)
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
    TD_TRY(req_bool(r->root, "continue_final_message", "continue_final_message",
                    &r->continue_final, e));
    TD_TRY(req_bool(r->root, "echo", "echo", &r->echo, e));
    if (r->continue_final && r->add_generation_prompt)
        return apierr_set(e, 400, "invalid_value", "continue_final_message",
                          "Invalid value for 'continue_final_message': it continues the final "
                          "message, so 'add_generation_prompt' (true by default), which opens a "
                          "new one, must be false.");
    const json_t *tmpl = req_field(r->root, "chat_template");
    if (tmpl && !json_is_string(tmpl))
        return req_bad_type(e, "chat_template", "a string", tmpl);
    if (tmpl && json_string_length(tmpl) == 0)
        return apierr_set(e, 400, "invalid_value", "chat_template",
                          "Invalid value for 'chat_template': an empty template.");
    r->chat_template = tmpl ? json_string_value(tmpl) : NULL;
    r->chat_template_len = tmpl ? json_string_length(tmpl) : 0;
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
    /* OpenAI's reasoning_effort: "none" turns the template's thinking off (unless
     * chat_template_kwargs says otherwise); the others leave it as the template has it. */
    const json_t *effort = req_field(r->root, "reasoning_effort");
    if (effort) {
        TD_TRY(req_effort(effort, "reasoning_effort", e));
        if (strcmp(json_string_value(effort), "none") == 0 &&
            r->enable_thinking == CHAT_THINK_UNSET)
            r->enable_thinking = CHAT_THINK_OFF;
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

