#include "gateway/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gateway/background.h"
#include "gateway/gen.h"
#include "gateway/render.h"
#include "gateway/request.h"
#include "gateway/respstore.h"

typedef enum api_route {
    ROUTE_NONE = 0,
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_RESPONSES,
    ROUTE_RESPONSE, /* /v1/responses/<id> */
    ROUTE_RESPONSE_ITEMS, /* /v1/responses/<id>/input_items */
    ROUTE_RESPONSE_CANCEL, /* /v1/responses/<id>/cancel */
    ROUTE_INPUT_TOKENS,   /* /v1/responses/input_tokens */
    ROUTE_MODELS,
    ROUTE_MODEL, /* /v1/models/<name> */
    ROUTE_HEALTH,
    ROUTE_METRICS,
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
} api_route;

typedef struct api_route_def {
    const char *path;
    api_route route;
    bool post;          /* POST, else GET (and HEAD) */
    bool auth;          /* needs the API key when one is set */
    metrics_endpoint ep;
} api_route_def;

static const api_route_def ROUTES[] = {
    {"/v1/chat/completions", ROUTE_CHAT, true, true, MET_EP_CHAT},
    {"/v1/completions", ROUTE_COMPLETIONS, true, true, MET_EP_COMPLETIONS},
    {"/v1/responses", ROUTE_RESPONSES, true, true, MET_EP_RESPONSES},
    {"/v1/responses/input_tokens", ROUTE_INPUT_TOKENS, true, true, MET_EP_RESPONSES},
    {"/v1/models", ROUTE_MODELS, false, true, MET_EP_MODELS},
    {"/health", ROUTE_HEALTH, false, false, MET_EP_HEALTH},
    {"/metrics", ROUTE_METRICS, false, false, MET_EP_METRICS},
    {"/tokenize", ROUTE_TOKENIZE, true, true, MET_EP_TOKENIZE},
    {"/detokenize", ROUTE_DETOKENIZE, true, true, MET_EP_DETOKENIZE},
};

static void api_json(api_reply *r, int status, char *body)
{
    r->status = body ? status : 500;
    r->content_type = "application/json";
    r->body = body ? body : strdup("{\"error\":{\"message\":\"out of memory\",\"type\":"
                                   "\"server_error\",\"param\":null,\"code\":null}}");
    r->body_len = r->body ? strlen(r->body) : 0;
}

static void api_error_reply(api_reply *r, int status, const char *code, const char *fmt,
                            const char *arg)
{
    api_error e;
    apierr_set(&e, status, code, NULL, fmt, arg);
    gen_reply_error(r, &e);
}

static void api_no_response(gw_state *g, const char *id, api_reply *r)
{
    api_error_reply(r, 404, "not_found",
                    g->responses ? "Response with id '%s' not found."
                                 : "Response with id '%s' not found: this gateway keeps no "
                                   "responses (--responses-kept 0).",
                    id);
}

/* GET /v1/responses/<id>: the response (a background one as it stands, or its events with
 * ?stream=true); DELETE: forgets it (stopping a background one). */
static void api_response(gw_state *g, const char *id, const api_call *c, bool del,
                         api_reply *r)
{
    json_t *o = NULL;
    bool stream = false;
    int64_t after = -1;
    api_error e;
    if (!del && req_response_query(c->args, c->n_args, &stream, &after, &e) != TD_OK) {
        gen_reply_error(r, &e);
        return;
    }
    if (!del && g->background && bg_get(g->background, id, stream, after, c->client_fd, r))
        return;
    if (stream) {
        const bool kept = g->responses && rstore_get(g->responses, id, RSTORE_RESPONSE, &o);
        json_decref(o);
        if (!kept)
            api_no_response(g, id, r);
        else
            api_error_reply(r, 400, "invalid_request",
                            "The events of response '%s' are not kept: only those of background "
                            "responses are (the latest --responses-background of them).",
                            id);
        return;
    }
    bool found = false;
    if (del) {
        const bool job = g->background && bg_delete(g->background, id);
        found = (g->responses && rstore_delete(g->responses, id)) || job;
    } else {
        found = g->responses && rstore_get(g->responses, id, RSTORE_RESPONSE, &o);
    }
    if (!found) {
        api_no_response(g, id, r);
        return;
    }
    if (del)
        o = json_pack("{s:s,s:s,s:b}", "id", id, "object", "response", "deleted", 1);
    char *body = o ? render_dump(o) : NULL;
    json_decref(o);
    api_json(r, 200, body);
}

/* POST /v1/responses/<id>/cancel: stops a background response. */
static void api_cancel(gw_state *g, const char *id, api_reply *r)
{
    if (g->background && bg_cancel(g->background, id, r))
        return;
    json_t *o = NULL; /* a background response whose events are no longer kept */
    if (!g->responses || !rstore_get(g->responses, id, RSTORE_RESPONSE, &o)) {
        api_no_response(g, id, r);
        return;
    }
    const json_t *bg = json_object_get(o, "background");
    const json_t *st = json_object_get(o, "status");
    const char *status = json_is_string(st) ? json_string_value(st) : "";
    if (json_is_true(bg) && strcmp(status, "cancelled") == 0) {
        char *body = render_dump(o);
        json_decref(o);
        api_json(r, 200, body);
        return;
    }
    if (json_is_true(bg))
        bg_cannot_cancel(r, status);
    else
        api_error_reply(r, 400, "invalid_request",
                        "Only responses created with 'background': true can be cancelled; '%s' "
                        "was not.", id);
    json_decref(o);
}

/* GET /v1/responses/<id>/input_items: a page of the kept response's input items. */
static void api_input_items(gw_state *g, const char *id, const api_call *c, api_reply *r)
{
    json_t *items = NULL, *page = NULL;
    if (!g->responses || !rstore_get(g->responses, id, RSTORE_INPUT, &items)) {
        api_no_response(g, id, r);
        return;
    }
    api_error e;
    const td_err err = req_list_page(items, c->args, c->n_args, &page, &e);
    json_decref(items);
    if (err != TD_OK) {
        gen_reply_error(r, &e);
        return;
    }
    char *body = render_dump(page);
    json_decref(page);
    api_json(r, 200, body);
}

/* Constant-time comparison of the Bearer key, so its bytes cannot be guessed by timing. */
static bool api_key_ok(const char *key, const char *header)
{
    static const char bearer[] = "Bearer ";
    if (!header || strncasecmp(header, bearer, sizeof bearer - 1) != 0)
        return false;
    const char *given = header + sizeof bearer - 1;
    while (*given == ' ')
        given++;
    size_t n = strlen(key), m = strlen(given);
    unsigned diff = n != m;
    for (size_t i = 0; i < m; i++)
        diff |= (unsigned char)given[i] ^ (unsigned char)key[i < n ? i : 0];
    return diff == 0;
}

static void api_models(gw_state *g, api_reply *r)
{
    api_json(r, 200, render_models(g->model_name, g->started, gen_ctx(g)));
}

static void api_model(gw_state *g, const char *name, api_reply *r)
{
    if (strcmp(name, g->model_name) != 0) {
        api_error e;
        apierr_set(&e, 404, "model_not_found", "model", "The model '%s' does not exist.", name);
        gen_reply_error(r, &e);
        return;
    }
    json_t *m = json_pack("{s:s,s:s,s:I,s:s}", "id", g->model_name, "object", "model", "created",
                          (json_int_t)g->started, "owned_by", "tandem");
    char *body = m ? render_dump(m) : NULL;
    json_decref(m);
    api_json(r, 200, body);
}

static void api_health(gw_state *g, api_reply *r)
{
    msg_status st;
    bool up = g->link && link_status(g->link, &st);
    if (up && st.ready) {
        api_json(r, 200, strdup("{\"status\":\"ok\"}"));
        return;
    }
    json_t *o = json_pack("{s:s}", "status", "loading");
    if (o && up && st.not_ready[0]) /* what verifyd waits for */
        json_object_set_new(o, "reason", json_string(st.not_ready));
    api_json(r, 503, o ? render_dump(o) : NULL);
    json_decref(o);
}

static void api_metrics(gw_state *g, api_reply *r)
{
    msg_status st;
    bool up = g->link && link_status(g->link, &st);
    size_t kept = 0, bytes = 0;
    if (g->responses)
        rstore_usage(g->responses, &kept, &bytes);
    __atomic_store_n(&g->metrics.responses_kept, kept, __ATOMIC_RELAXED);
    __atomic_store_n(&g->metrics.responses_bytes, bytes, __ATOMIC_RELAXED);
    size_t running = 0, listed = 0;
    if (g->background)
        bg_usage(g->background, &running, &listed);
    __atomic_store_n(&g->metrics.background_running, running, __ATOMIC_RELAXED);
    r->body = metrics_render(&g->metrics, up ? &st : NULL);
    if (!r->body) {
        api_json(r, 500, NULL);
        return;
    }
    r->status = 200;
    r->content_type = "text/plain; version=0.0.4; charset=utf-8";
    r->body_len = strlen(r->body);
}

/* The prompt's tokens of a parsed chat request, which is freed. */
static td_err api_prompt_ids(gw_state *g, gw_request *req, tok_ids *ids, api_error *e)
{
    bool in_think;
    const td_err err = gen_chat_prompt(g, req, ids, &in_think, e);
    req_free(req);
    return err;
}

/* POST /v1/responses/input_tokens: how many tokens the prompt of a Responses body holds (its
 * previous response's conversation, instructions, input and tools, as the template renders
 * them; before any truncation). */
static void api_input_tokens(gw_state *g, const api_call *c, api_reply *r)
{
    api_error e;
    tok_ids ids = {0};
    gw_request req;
    td_err err = req_parse_responses(&req, c->body, c->body_len, g->responses, &e);
    if (err == TD_OK)
        err = api_prompt_ids(g, &req, &ids, &e);
    if (err != TD_OK) {
        tok_ids_free(&ids);
        gen_reply_error(r, &e);
        return;
    }
    json_t *o = json_pack("{s:s,s:I}", "object", "response.input_tokens", "input_tokens",
                          (json_int_t)ids.n);
    tok_ids_free(&ids);
    char *body = o ? render_dump(o) : NULL;
    json_decref(o);
    api_json(r, 200, body);
}

/* {"content": text} (or "prompt"), or a chat's {"messages": [...]} with the fields that shape
 * its prompt (tools, chat_template_kwargs, add_generation_prompt, continue_final_message) -> the
 * tokens, their count and the context they must fit. */
static void api_tokenize(gw_state *g, const api_call *c, api_reply *r)
{
    api_error e;
    tok_ids ids = {0};
    json_t *probe = json_loadb(c->body, c->body_len, 0, NULL);
    const bool chat = json_is_object(probe) && json_object_get(probe, "messages");
    json_decref(probe);
    td_err err;
    if (chat) {
        gw_request req;
        err = req_parse(&req, REQ_CHAT, c->body, c->body_len, &e);
        if (err == TD_OK)
            err = api_prompt_ids(g, &req, &ids, &e);
    } else {
        json_t *root = NULL;
        const char *text;
        size_t len;
        bool add_special;
        err = req_parse_tokenize(c->body, c->body_len, &root, &text, &len, &add_special, &e);
        if (err == TD_OK &&
            tok_encode(g->tok, text, len, add_special ? TOK_ENC_ADD_SPECIAL : 0, &ids) != TD_OK)
            err = apierr_set(&e, 500, NULL, NULL, "tokenizing failed: %s", err_msg());
        json_decref(root);
    }
    if (err != TD_OK) {
        tok_ids_free(&ids);
        gen_reply_error(r, &e);
        return;
    }
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < ids.n; i++)
        json_array_append_new(arr, json_integer(ids.ids[i]));
    json_t *o = arr ? json_pack("{s:I,s:I,s:o}", "count", (json_int_t)ids.n, "max_model_len",
                                (json_int_t)gen_ctx(g), "tokens", arr)
                    : NULL;
    tok_ids_free(&ids);
    char *body = o ? render_dump(o) : NULL;
    json_decref(o);
    api_json(r, 200, body);
}

static void api_detokenize(gw_state *g, const api_call *c, api_reply *r)
{
    api_error e;
    int32_t *ids;
    size_t n;
    if (req_parse_detokenize(c->body, c->body_len, tok_n_vocab(g->tok), &ids, &n, &e) != TD_OK) {
        gen_reply_error(r, &e);
        return;
    }
    tok_bytes text = {0};
    td_err err = tok_decode(g->tok, ids, n, 0, &text);
    free(ids);
    json_t *o = err == TD_OK ? json_pack("{s:s%}", "content", text.ptr ? text.ptr : "", text.len)
                             : NULL;
    tok_bytes_free(&text);
    char *body = o ? render_dump(o) : NULL;
    json_decref(o);
    api_json(r, 200, body);
}

void api_handle(gw_state *g, const api_call *c, api_reply *r)
{
    memset(r, 0, sizeof *r);
    r->endpoint = MET_EP_OTHER;
    const api_route_def *def = NULL;
    const char *model_name = NULL;
    for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0]; i++)
        if (strcmp(c->path, ROUTES[i].path) == 0)
            def = &ROUTES[i];
    static const api_route_def model_route = {"/v1/models/", ROUTE_MODEL, false, true,
                                              MET_EP_MODELS};
    static const api_route_def response_route = {"/v1/responses/", ROUTE_RESPONSE, false, true,
                                                 MET_EP_RESPONSES};
    if (!def && strncmp(c->path, model_route.path, strlen(model_route.path)) == 0) {
        def = &model_route;
        model_name = c->path + strlen(model_route.path);
    }
    static const api_route_def items_route = {"/input_items", ROUTE_RESPONSE_ITEMS, false, true,
                                              MET_EP_RESPONSES};
    static const api_route_def cancel_route = {"/cancel", ROUTE_RESPONSE_CANCEL, true, true,
                                               MET_EP_RESPONSES};
    char id[128] = "";
    if (!def && strncmp(c->path, response_route.path, strlen(response_route.path)) == 0) {
        const char *rest = c->path + strlen(response_route.path);
        const char *slash = strchr(rest, '/');
        const size_t len = slash ? (size_t)(slash - rest) : strlen(rest);
        const bool items = slash && strcmp(slash, items_route.path) == 0;
        const bool cancel = slash && strcmp(slash, cancel_route.path) == 0;
        if (len > 0 && len < sizeof id && (!slash || items || cancel)) {
            memcpy(id, rest, len);
            id[len] = 0;
            def = items ? &items_route : cancel ? &cancel_route : &response_route;
        }
    }
    if (!def) {
        api_error_reply(r, 404, "not_found", "Unknown request URL: %s.", c->path);
        return;
    }
    r->endpoint = def->ep;
    bool is_post = strcmp(c->method, "POST") == 0;
    bool is_get = strcmp(c->method, "GET") == 0 || strcmp(c->method, "HEAD") == 0;
    const bool is_delete = strcmp(c->method, "DELETE") == 0;
    const bool deletable = def->route == ROUTE_RESPONSE;
    if (def->post ? !is_post : !(is_get || (deletable && is_delete))) {
        api_error_reply(r, 405, "method_not_allowed", "Method %s is not allowed here.", c->method);
        r->allow = def->post ? "POST" : deletable ? "GET, HEAD, DELETE" : "GET, HEAD";
        return;
    }
    if (def->auth && g->cfg.api_key && g->cfg.api_key[0] &&
        !api_key_ok(g->cfg.api_key, c->authorization)) {
        api_error_reply(r, 401, "invalid_api_key", "%s",
                        c->authorization ? "Incorrect API key provided."
                                         : "Missing API key: send 'Authorization: Bearer <key>'.");
        r->auth_challenge = true;
        return;
    }
    if (c->body_too_large) {
        char limit[64];
        snprintf(limit, sizeof limit, "%lld", (long long)g->cfg.max_body);
        api_error_reply(r, 413, "request_too_large",
                        "The request body is larger than this server accepts (%s bytes).", limit);
        return;
    }
    switch (def->route) {
    case ROUTE_CHAT: gen_handle(g, c, REQ_CHAT, r); break;
    case ROUTE_COMPLETIONS: gen_handle(g, c, REQ_COMPLETION, r); break;
    case ROUTE_RESPONSES: gen_handle(g, c, REQ_RESPONSES, r); break;
    case ROUTE_RESPONSE: api_response(g, id, c, is_delete, r); break;
    case ROUTE_RESPONSE_CANCEL: api_cancel(g, id, r); break;
    case ROUTE_RESPONSE_ITEMS: api_input_items(g, id, c, r); break;
    case ROUTE_INPUT_TOKENS: api_input_tokens(g, c, r); break;
    case ROUTE_MODELS: api_models(g, r); break;
    case ROUTE_MODEL: api_model(g, model_name, r); break;
    case ROUTE_HEALTH: api_health(g, r); break;
    case ROUTE_METRICS: api_metrics(g, r); break;
    case ROUTE_TOKENIZE: api_tokenize(g, c, r); break;
    case ROUTE_DETOKENIZE: api_detokenize(g, c, r); break;
    case ROUTE_NONE: break;
    }
}
