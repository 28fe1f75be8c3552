/* Fuzz target over everything the gateway reads from clients and from the model's output: the
 * first byte picks the reader, the rest is its input.
 *   0 chat body, 1 completion body, 2 tokenize body, 3 detokenize body (req_parse*)
 *   4 one tool-call block (tool_parse, with a tools schema)
 *   5 model output through the stop filter, reasoning and tool-call splits in pieces whose
 *     sizes come from the input itself
 *   6 a tool spec (cm_compile, what a request's tools become), then calls matched against it
 *   7 a call body matched against the tools' spec (cm_feed)
 *   8 (that byte alone; others modulo 8) a /v1/responses body (req_parse_responses), with
 *     a store that keeps a conversation under "resp_1"
 *   9 (that byte alone) a list query, "k=v&k=v..." (req_list_page over five items)
 *   10 (that byte alone) text against structural tags (cm_feed of a fixed tags spec)
 * Besides not crashing: every text a split passes on must be valid UTF-8 when its input was,
 * an error always comes with a status and a message, and a body the matcher takes whole
 * parses into a call of the declared function with declared parameters only. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/reasoning.h"
#include "gateway/request.h"
#include "gateway/respstore.h"
#include "gateway/stopstr.h"
#include "common/callm.h"
#include "gateway/toolcall.h"

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":{"
    "\"s\":{\"type\":\"string\"},\"i\":{\"type\":\"integer\"},\"b\":{\"type\":\"boolean\"},"
    "\"o\":{\"type\":\"object\"},\"a\":{\"type\":[\"array\",\"null\"]}}}}}]";

static void check_error(td_err e, const api_error *err)
{
    if (e != TD_OK && (err->status < 400 || err->message[0] == 0))
        abort();
}

static td_err sink_think(void *ctx, bool reasoning, const char *text, size_t len)
{
    tool_split *t = ctx;
    if (len == 0)
        abort(); /* empty pieces are never passed on */
    return reasoning ? TD_OK : tool_split_push(t, text, len);
}

/* A begun call's arguments as streamed (stream_args). */
static struct {
    bool open;
    char args[1 << 16];
    size_t len;
} streamed;

static td_err sink_tool(void *ctx, tool_emit_kind kind, const char *text, size_t len,
                        const tool_call *call)
{
    (void)ctx;
    switch (kind) {
    case TOOL_EMIT_TEXT:
    case TOOL_EMIT_ARGS:
        if (len == 0 || (kind == TOOL_EMIT_ARGS && !streamed.open))
            abort(); /* empty text is never passed on; arguments only of a begun call */
        if (kind == TOOL_EMIT_TEXT) {
            streamed.open = false; /* a begun call whose block did not parse: its text */
        } else {
            if (streamed.len + len <= sizeof streamed.args)
                memcpy(streamed.args + streamed.len, text, len);
            streamed.len += len;
        }
        break;
    case TOOL_EMIT_OPEN:
        if (!call->name[0] || call->arguments || streamed.open)
            abort();
        streamed.open = true;
        streamed.len = 0;
        break;
    case TOOL_EMIT_CALL:
        /* calls have a name and arguments; a begun one's start with what was streamed */
        if (!call->name[0] || !call->arguments[0] ||
            call->streamed != (streamed.open ? streamed.len : 0) ||
            memcmp(call->arguments, streamed.args, call->streamed <= sizeof streamed.args
                                                       ? call->streamed : 0) != 0)
            abort();
        streamed.open = false;
        streamed.len = 0;
        break;
    }
    return TD_OK;
}

/* A list query's page: at most limit items (20 unless limit is given), first_id and last_id
 * those of its first and last item. */
static void list_query(const char *body, size_t len)
{
    char *q = malloc(len + 1);
    req_arg args[32];
    size_t n = 0;
    if (!q)
        abort();
    memcpy(q, body, len);
    q[len] = 0;
    for (char *kv = q; kv && n < 32;) {
        char *amp = strchr(kv, '&'), *eq;
        if (amp)
            *amp = 0;
        eq = strchr(kv, '=');
        if (eq)
            *eq = 0;
        args[n++] = (req_arg){.key = kv, .value = eq ? eq + 1 : NULL};
        kv = amp ? amp + 1 : NULL;
    }
    json_t *items = json_loads("[{\"id\":\"a\"},{\"id\":\"b\"},{\"id\":\"c\"},"
                               "{\"id\":\"d\"},{\"id\":\"e\"}]", 0, NULL);
    json_t *page;
    api_error err;
    td_err e = req_list_page(items, args, n, &page, &err);
    check_error(e, &err);
    if (e == TD_OK) {
        const json_t *data = json_object_get(page, "data");
        const size_t k = json_array_size(data);
        const json_t *first = json_object_get(page, "first_id");
        const json_t *last = json_object_get(page, "last_id");
        if (k > 20 && !memmem(body, len, "limit", 5))
            abort();
        if (k > 5 || (k == 0) != json_is_null(first) || (k == 0) != json_is_null(last) ||
            (k && (!json_equal(json_object_get(json_array_get(data, 0), "id"), first) ||
                   !json_equal(json_object_get(json_array_get(data, k - 1), "id"), last))))
            abort();
        json_decref(page);
    }
    json_decref(items);
    free(q);
}

static void split_output(const uint8_t *data, size_t size)
{
    static const char *const stops[] = {"END", "</s>", "\n\n\n"};
    static const size_t stop_lens[] = {3, 4, 3};
    json_t *tools = json_loads(TOOLS, 0, NULL);
    stop_filter f;
    stop_init(&f, stops, stop_lens, 3);
    tool_split ts;
    tool_split_init(&ts, tools, sink_tool, NULL);
    ts.stream_args = size > 0 && (data[0] & 2);
    streamed.open = false;
    streamed.len = 0;
    think_split th;
    think_init(&th, size > 0 && (data[0] & 1), sink_think, &ts);
    size_t i = size > 0 ? 1 : 0;
    while (i < size) {
        size_t n = 1 + data[i] % 13; /* piece size from the input */
        if (n > size - i)
            n = size - i;
        const char *out;
        size_t out_len;
        if (stop_push(&f, (const char *)data + i, n, &out, &out_len) != TD_OK ||
            think_push(&th, out, out_len) != TD_OK)
            break;
        i += n;
    }
    const char *rest;
    size_t rest_len;
    stop_flush(&f, &rest, &rest_len);
    if (think_push(&th, rest, rest_len) == TD_OK && think_flush(&th) == TD_OK)
        tool_split_flush(&ts);
    think_free(&th);
    tool_split_free(&ts);
    stop_free(&f);
    json_decref(tools);
}

/* A spec from the input; when it compiles, a few bodies go through it. */
static void spec_then_calls(const char *spec, size_t len)
{
    static const char *const bodies[] = {
        "<function=f>\n<parameter=s>\nx\n</parameter>\n</function>",
        "{\"name\": \"f\", \"arguments\": {}}",
        "<function=a>\n</function>\n",
        "x <f=a>{\"k\": [1]}</f> y <<f=b>",
    };
    cm_grammar *g = NULL;
    if (cm_compile(spec, len, &g) != TD_OK)
        return;
    uint8_t *st = malloc(cm_state_size(g));
    for (size_t i = 0; st && i < sizeof bodies / sizeof bodies[0]; i++) {
        cm_state_init(g, st);
        if (cm_feed(g, st, (const uint8_t *)bodies[i], strlen(bodies[i])))
            (void)cm_done(g, st);
    }
    free(st);
    cm_free(g);
}

/* Text against structural tags: free text takes every byte; a structure, its begin, JSON and
 * end only. */
static void text_against_tags(const uint8_t *text, size_t len)
{
    static const char spec[] =
        "{\"form\":\"tags\",\"triggers\":[\"<f=\",\"[[\"],\"structures\":["
        "{\"begin\":\"<f=a>\",\"schema\":{\"type\":\"object\",\"properties\":{\"k\":"
        "{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}}},\"end\":\"</f>\"},"
        "{\"begin\":\"<f=ab>\",\"schema\":{\"enum\":[\"x\",1]},\"end\":\"\\n\"},"
        "{\"begin\":\"[[b]]\",\"schema\":true,\"end\":\"]]\"}]}";
    static cm_grammar *g;
    if (!g && cm_compile(spec, strlen(spec), &g) != TD_OK)
        abort();
    uint8_t *st = malloc(cm_state_size(g)), *copy = malloc(cm_state_size(g));
    if (!st || !copy)
        abort();
    cm_state_init(g, st);
    for (size_t i = 0; i < len; i++) {
        const bool free_text = cm_done(g, st);
        cm_state_copy(g, copy, st);
        const bool ok = cm_feed(g, st, text + i, 1);
        if (free_text && !ok)
            abort(); /* free text takes every byte */
        if (!ok || !cm_feed(g, copy, text + i, 1)) /* a copy goes on alike */
            break;
    }
    free(st);
    free(copy);
}

/* The body against TOOLS as an XML spec: taken whole, the gateway reads it as a call of f with
 * f's parameters only, its arguments a JSON object. */
static void call_against_spec(const uint8_t *body, size_t len)
{
    static const char spec[] =
        "{\"form\":\"xml\",\"tools\":[{\"name\":\"f\",\"parameters\":{\"properties\":{"
        "\"s\":{\"type\":\"string\"},\"i\":{\"type\":\"integer\"},\"b\":{\"type\":\"boolean\"},"
        "\"o\":{\"type\":\"object\"},\"a\":{\"type\":[\"array\",\"null\"]}}}}]}";
    static cm_grammar *g; /* TOOLS' function, compiled once for the whole run */
    if (!g && cm_compile(spec, strlen(spec), &g) != TD_OK)
        abort();
    uint8_t *st = malloc(cm_state_size(g));
    if (!st)
        return;
    cm_state_init(g, st);
    const bool whole = cm_feed(g, st, body, len) && cm_done(g, st);
    free(st);
    if (!whole)
        return;
    json_t *tools = json_loads(TOOLS, 0, NULL);
    tool_call c;
    if (tool_parse((const char *)body, len, tools, &c) != TD_OK || strcmp(c.name, "f") != 0)
        abort();
    json_t *args = json_loads(c.arguments, JSON_ALLOW_NUL, NULL);
    const char *k;
    json_t *v;
    if (!json_is_object(args))
        abort();
    json_object_foreach(args, k, v) {
        if (strlen(k) != 1 || !strchr("sibao", k[0]))
            abort();
        if ((k[0] == 'i' && !json_is_integer(v)) || (k[0] == 'b' && !json_is_boolean(v)) ||
            (k[0] == 'o' && !json_is_object(v)) || (k[0] == 's' && !json_is_string(v)) ||
            (k[0] == 'a' && !json_is_array(v) && !json_is_null(v)))
            abort();
    }
    json_decref(args);
    tool_call_free(&c);
    json_decref(tools);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    api_error err;
    switch (data[0] >= 8 && data[0] <= 10 ? data[0] : data[0] % 8) {
    case 0:
    case 1:
    case 8: {
        gw_request r;
        static rstore *store; /* one kept conversation, for previous_response_id */
        if (!store) {
            json_t *conv = json_loads("[{\"role\":\"user\",\"content\":\"a\"},{\"role\":"
                                      "\"assistant\",\"content\":\"b\"}]", 0, NULL);
            if (rstore_init(&store, 4, 1 << 20) != TD_OK ||
                !rstore_put(store, "resp_1", conv, conv, conv))
                abort();
            json_decref(conv);
        }
        td_err e = data[0] == 8 ? req_parse_responses(&r, body, len, store, &err)
                                : req_parse(&r, data[0] % 8 == 0 ? REQ_CHAT : REQ_COMPLETION,
                                            body, len, &err);
        check_error(e, &err);
        if (e == TD_OK)
            req_free(&r);
        break;
    }
    case 2: {
        json_t *root;
        const char *text;
        size_t text_len;
        bool add;
        td_err e = req_parse_tokenize(body, len, &root, &text, &text_len, &add, &err);
        check_error(e, &err);
        if (e == TD_OK)
            json_decref(root);
        break;
    }
    case 3: {
        int32_t *ids;
        size_t n;
        td_err e = req_parse_detokenize(body, len, 512, &ids, &n, &err);
        check_error(e, &err);
        if (e == TD_OK) {
            for (size_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= 512)
                    abort();
            free(ids);
        }
        break;
    }
    case 4: {
        json_t *tools = json_loads(TOOLS, 0, NULL);
        tool_call c;
        if (tool_parse(body, len, tools, &c) == TD_OK) {
            /* The XML form of valid UTF-8 (what the decoder gives) always prints a JSON
             * object (checked without NUL bytes, which jansson refuses in keys). */
            json_t *utf8 = json_stringn(body, len);
            bool valid = utf8 != NULL && !memchr(body, 0, len);
            json_decref(utf8);
            if (valid && len > 0 && memchr(body, '<', len) && !memchr(body, '{', len)) {
                json_t *args = json_loads(c.arguments, JSON_ALLOW_NUL, NULL);
                if (!json_is_object(args))
                    abort();
                json_decref(args);
            }
            tool_call_free(&c);
        }
        json_decref(tools);
        break;
    }
    case 6:
        spec_then_calls(body, len);
        break;
    case 9:
        list_query(body, len);
        break;
    case 10:
        text_against_tags(data + 1, len);
        break;
    case 7:
        call_against_spec(data + 1, len);
        break;
    default:
        split_output(data + 1, len);
        break;
    }
    return 0;
}
