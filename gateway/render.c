#include "gateway/render.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *render_dump(const json_t *v)
{
    return json_dumps(v, JSON_COMPACT | JSON_REAL_PRECISION(15));
}

/* "data: " + json + "\n\n"; releases v. */
static char *render_sse(json_t *v)
{
    char *s = v ? render_dump(v) : NULL;
    json_decref(v);
    if (!s)
        return NULL;
    size_t n = strlen(s);
    char *out = malloc(n + 9);
    if (out) {
        memcpy(out, "data: ", 6);
        memcpy(out + 6, s, n);
        memcpy(out + 6 + n, "\n\n", 3);
    }
    free(s);
    return out;
}

char *render_event(const char *type, json_t *data)
{
    char *s = data ? render_dump(data) : NULL;
    json_decref(data);
    if (!s)
        return NULL;
    const size_t n = strlen(s), t = strlen(type);
    char *out = malloc(t + n + 17);
    if (out)
        snprintf(out, t + n + 17, "event: %s\ndata: %s\n\n", type, s);
    free(s);
    return out;
}

static char *render_body(json_t *v)
{
    char *s = v ? render_dump(v) : NULL;
    json_decref(v);
    return s;
}

static json_t *render_text(const char *s, size_t n)
{
    return json_stringn(s ? s : "", s ? n : 0);
}

json_t *render_usage(const gw_usage *u)
{
    json_t *o = json_object();
    json_t *details = json_object();
    json_object_set_new(o, "prompt_tokens", json_integer(u->prompt_tokens));
    json_object_set_new(o, "completion_tokens", json_integer(u->completion_tokens));
    json_object_set_new(o, "total_tokens",
                        json_integer((json_int_t)u->prompt_tokens + u->completion_tokens));
    json_object_set_new(details, "cached_tokens", json_integer(u->cached_tokens));
    json_object_set_new(o, "prompt_tokens_details", details);
    if (u->predicted)
        json_object_set_new(o, "completion_tokens_details",
                            json_pack("{s:I,s:I}", "accepted_prediction_tokens",
                                      (json_int_t)u->accepted_prediction,
                                      "rejected_prediction_tokens",
                                      (json_int_t)u->rejected_prediction));
    render_acceptance(o, u);
    return o;
}

void render_acceptance(json_t *usage, const gw_usage *u)
{
    if (u->steps > 0) {
        /* Rounded to 1/1000: a figure for people, not bits. */
        double tau = (double)(long long)((double)u->completion_tokens / u->steps * 1000 + 0.5) /
                     1000;
        json_object_set_new(usage, "acceptance_length", json_real(tau));
    }
}

json_t *render_tool_call(const render_ctx *c, const out_piece *p)
{
    char id[96];
    snprintf(id, sizeof id, "call_%s_%u", c->call_ids ? c->call_ids : "0", p->call_index);
    json_t *fn = json_object();
    json_object_set_new(fn, "name", json_string(p->call.name));
    json_object_set_new(fn, "arguments", json_string(p->call.arguments ? p->call.arguments
                                                                       : ""));
    json_t *call = json_object();
    json_object_set_new(call, "id", json_string(id));
    json_object_set_new(call, "type", json_string("function"));
    json_object_set_new(call, "function", fn);
    return call;
}

json_t *render_delta(const render_ctx *c, const out_piece *p)
{
    json_t *d = json_object();
    switch (p->kind) {
    case OUT_CONTENT:
        json_object_set_new(d, "content", render_text(p->text, p->len));
        break;
    case OUT_REASONING:
        json_object_set_new(d, "reasoning_content", render_text(p->text, p->len));
        break;
    case OUT_TOOL_CALL:
    case OUT_CALL_OPEN:
    case OUT_CALL_ARGS: {
        /* a call whole or begun: id, type and name; more of a begun one: its arguments */
        const char *more = p->kind == OUT_CALL_ARGS ? p->text
                           : p->kind == OUT_TOOL_CALL && p->call.streamed
                               ? p->call.arguments + p->call.streamed
                               : NULL;
        json_t *call = more ? json_pack("{s:{s:s}}", "function", "arguments", more)
                            : render_tool_call(c, p);
        json_t *indexed = json_object();
        json_object_set_new(indexed, "index", json_integer(p->call_index));
        json_object_update(indexed, call);
        json_decref(call);
        json_t *arr = json_array();
        json_array_append_new(arr, indexed);
        json_object_set_new(d, "tool_calls", arr);
        break;
    }
    }
    return d;
}

static json_t *render_envelope(const render_ctx *c, const char *object)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(c->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(c->created));
    json_object_set_new(o, "model", json_string(c->model));
    return o;
}

static json_t *render_finish(const char *finish)
{
    return finish ? json_string(finish) : json_null();
}

/* A choice chunk's usage: the running one (continuous_usage_stats), or null (include_usage). */
static void render_chunk_usage(const render_ctx *c, json_t *o)
{
    if (c->live_usage)
        json_object_set_new(o, "usage", render_usage(c->live_usage));
    else if (c->usage_null)
        json_object_set_new(o, "usage", json_null());
}

char *render_chat_chunk(const render_ctx *c, json_t *delta, const char *finish, json_t *logprobs)
{
    json_t *o = render_envelope(c, "chat.completion.chunk");
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(c->index));
    json_object_set_new(choice, "delta", delta ? delta : json_object());
    json_object_set_new(choice, "logprobs", logprobs ? logprobs : json_null());
    json_object_set_new(choice, "finish_reason", render_finish(finish));
    json_t *choices = json_array();
    json_array_append_new(choices, choice);
    json_object_set_new(o, "choices", choices);
    render_chunk_usage(c, o);
    return render_sse(o);
}

char *render_chat_usage_chunk(const render_ctx *c, const gw_usage *u)
{
    json_t *o = render_envelope(c, "chat.completion.chunk");
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", render_usage(u));
    return render_sse(o);
}

json_t *render_chat_choice(const render_ctx *c, const char *content, size_t content_len,
                           const char *reasoning, size_t reasoning_len, json_t *tool_calls,
                           const char *finish, json_t *logprobs)
{
    json_t *msg = json_object();
    json_object_set_new(msg, "role", json_string("assistant"));
    json_object_set_new(msg, "content", content ? render_text(content, content_len) : json_null());
    if (reasoning)
        json_object_set_new(msg, "reasoning_content", render_text(reasoning, reasoning_len));
    if (tool_calls && json_array_size(tool_calls) > 0)
        json_object_set(msg, "tool_calls", tool_calls);
    json_decref(tool_calls);
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(c->index));
    json_object_set_new(choice, "message", msg);
    json_object_set_new(choice, "logprobs", logprobs ? logprobs : json_null());
    json_object_set_new(choice, "finish_reason", render_finish(finish));
    return choice;
}

static char *render_response(const render_ctx *c, const char *object, json_t *choices,
                             const gw_usage *u, json_t *prompt_logprobs)
{
    if (!choices) {
        json_decref(prompt_logprobs);
        return NULL;
    }
    json_t *o = render_envelope(c, object);
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", render_usage(u));
    if (prompt_logprobs)
        json_object_set_new(o, "prompt_logprobs", prompt_logprobs);
    return render_body(o);
}

char *render_chat_response(const render_ctx *c, json_t *choices, const gw_usage *u,
                           json_t *prompt_logprobs)
{
    return render_response(c, "chat.completion", choices, u, prompt_logprobs);
}

json_t *render_completion_choice(const render_ctx *c, const char *text, size_t len,
                                 const char *finish, json_t *logprobs)
{
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(c->index));
    json_object_set_new(choice, "text", render_text(text, len));
    json_object_set_new(choice, "logprobs", logprobs ? logprobs : json_null());
    json_object_set_new(choice, "finish_reason", render_finish(finish));
    return choice;
}

char *render_completion_chunk(const render_ctx *c, const char *text, size_t len,
                              const char *finish, json_t *logprobs)
{
    json_t *o = render_envelope(c, "text_completion");
    json_t *choices = json_array();
    json_array_append_new(choices, render_completion_choice(c, text, len, finish, logprobs));
    json_object_set_new(o, "choices", choices);
    render_chunk_usage(c, o);
    return render_sse(o);
}

char *render_completion_usage_chunk(const render_ctx *c, const gw_usage *u)
{
    json_t *o = render_envelope(c, "text_completion");
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", render_usage(u));
    return render_sse(o);
}

char *render_completion_response(const render_ctx *c, json_t *choices, const gw_usage *u)
{
    return render_response(c, "text_completion", choices, u, NULL);
}

char *render_models(const char *model, int64_t created, int64_t max_model_len)
{
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(model));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(created));
    json_object_set_new(m, "owned_by", json_string("tandem"));
    if (max_model_len > 0)
        json_object_set_new(m, "max_model_len", json_integer(max_model_len));
    json_t *data = json_array();
    json_array_append_new(data, m);
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    return render_body(o);
}

char *render_sse_error(const api_error *e)
{
    char *body = apierr_render(e);
    if (!body)
        return NULL;
    size_t n = strlen(body);
    char *out = malloc(n + 9);
    if (out) {
        memcpy(out, "data: ", 6);
        memcpy(out + 6, body, n);
        memcpy(out + 6 + n, "\n\n", 3);
    }
    free(body);
    return out;
}
