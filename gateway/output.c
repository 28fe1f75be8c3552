#include "gateway/output.h"

#include <stdlib.h>
#include <string.h>

static td_err out_grow(gw_output *o)
{
    if (o->n_pieces < o->cap)
        return TD_OK;
    size_t cap = o->cap ? o->cap * 2 : 8;
    out_piece *p = realloc(o->pieces, cap * sizeof *p);
    if (!p)
        return err_set(TD_ENOMEM, "output: out of memory");
    o->pieces = p;
    o->cap = cap;
    return TD_OK;
}

static td_err out_text(gw_output *o, out_kind kind, const char *text, size_t len)
{
    if (len == 0)
        return TD_OK;
    out_piece *last = o->n_pieces ? &o->pieces[o->n_pieces - 1] : NULL;
    if (last && last->kind == kind) {
        char *t = realloc(last->text, last->len + len + 1);
        if (!t)
            return err_set(TD_ENOMEM, "output: out of memory");
        memcpy(t + last->len, text, len);
        last->text = t;
        last->len += len;
        t[last->len] = 0;
        return TD_OK;
    }
    TD_TRY(out_grow(o));
    out_piece *p = &o->pieces[o->n_pieces];
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->text = malloc(len + 1);
    if (!p->text)
        return err_set(TD_ENOMEM, "output: out of memory");
    memcpy(p->text, text, len);
    p->text[len] = 0;
    p->len = len;
    o->n_pieces++;
    return TD_OK;
}

/* Last stage: content text and calls from the tool split. */
static td_err out_from_tools(void *ctx, tool_emit_kind kind, const char *text, size_t len,
                             const tool_call *call)
{
    gw_output *o = ctx;
    if (kind == TOOL_EMIT_TEXT)
        return out_text(o, OUT_CONTENT, text, len);
    if (kind == TOOL_EMIT_ARGS) {
        if (len == 0)
            return TD_OK;
        TD_TRY(out_text(o, OUT_CALL_ARGS, text, len));
        o->pieces[o->n_pieces - 1].call_index = o->n_calls;
        return TD_OK;
    }
    TD_TRY(out_grow(o));
    out_piece *p = &o->pieces[o->n_pieces];
    memset(p, 0, sizeof *p);
    p->kind = kind == TOOL_EMIT_OPEN ? OUT_CALL_OPEN : OUT_TOOL_CALL;
    p->call.name = strdup(call->name);
    p->call.arguments = call->arguments ? strdup(call->arguments) : NULL;
    p->call.streamed = call->streamed;
    p->call_index = o->n_calls;
    if (!p->call.name || (call->arguments && !p->call.arguments)) {
        tool_call_free(&p->call);
        return err_set(TD_ENOMEM, "output: out of memory");
    }
    o->n_pieces++;
    o->n_calls += kind == TOOL_EMIT_CALL;
    return TD_OK;
}

/* After the reasoning split: content goes through the tool split when there are tools. */
static td_err out_from_think(void *ctx, bool reasoning, const char *text, size_t len)
{
    gw_output *o = ctx;
    if (reasoning)
        return out_text(o, OUT_REASONING, text, len);
    if (o->tools)
        return tool_split_push(&o->tool, text, len);
    return out_text(o, OUT_CONTENT, text, len);
}

/* After the stop filter. */
static td_err out_after_stop(gw_output *o, const char *text, size_t len)
{
    if (o->reasoning)
        return think_push(&o->think, text, len);
    return out_from_think(o, false, text, len);
}

td_err output_init(gw_output *o, const tokenizer *tok, const output_opts *opts)
{
    memset(o, 0, sizeof *o);
    o->tok = tok;
    tok_stream_init(&o->ts, tok, opts->keep_special ? 0 : TOK_DEC_SKIP_SPECIAL);
    stop_init(&o->stop, opts->stops, opts->stop_lens, opts->n_stops);
    o->stop.keep_stop = opts->keep_stop;
    o->reasoning = opts->reasoning;
    o->tools = opts->tools != NULL;
    think_init(&o->think, opts->reasoning && opts->in_think, out_from_think, o);
    tool_split_init(&o->tool, opts->tools, out_from_tools, o);
    o->tool.closed_only = opts->calls_matched;
    o->tool.stream_args = opts->stream_calls;
    return TD_OK;
}

void output_clear(gw_output *o)
{
    for (size_t i = 0; i < o->n_pieces; i++) {
        free(o->pieces[i].text);
        tool_call_free(&o->pieces[i].call);
    }
    o->n_pieces = 0;
}

void output_free(gw_output *o)
{
    output_clear(o);
    free(o->pieces);
    tok_bytes_free(&o->text);
    stop_free(&o->stop);
    think_free(&o->think);
    tool_split_free(&o->tool);
    memset(o, 0, sizeof *o);
}

td_err output_push(gw_output *o, const int32_t *ids, size_t n, size_t *n_used)
{
    TD_ASSERT(!o->finished);
    size_t used = 0;
    for (size_t i = 0; i < n && !o->stopped; i++) {
        o->text.len = 0;
        TD_TRY(tok_stream_push(&o->ts, &ids[i], 1, &o->text));
        used++;
        const char *pass;
        size_t pass_len;
        const bool in_before = o->reasoning && o->think.state == THINK_IN;
        TD_TRY(stop_push(&o->stop, o->text.ptr, o->text.len, &pass, &pass_len));
        TD_TRY(out_after_stop(o, pass, pass_len));
        o->stopped = o->stop.stopped;
        o->reasoning_tokens += in_before || (o->reasoning && o->think.state == THINK_IN);
    }
    if (n_used)
        *n_used = used;
    return TD_OK;
}

td_err output_finish(gw_output *o)
{
    if (o->finished)
        return TD_OK;
    o->finished = true;
    if (!o->stopped) {
        o->text.len = 0;
        TD_TRY(tok_stream_flush(&o->ts, &o->text));
        const char *pass;
        size_t pass_len;
        TD_TRY(stop_push(&o->stop, o->text.ptr, o->text.len, &pass, &pass_len));
        TD_TRY(out_after_stop(o, pass, pass_len));
        o->stopped = o->stop.stopped;
    }
    const char *rest;
    size_t rest_len;
    stop_flush(&o->stop, &rest, &rest_len);
    TD_TRY(out_after_stop(o, rest, rest_len));
    if (o->reasoning)
        TD_TRY(think_flush(&o->think));
    if (o->tools)
        TD_TRY(tool_split_flush(&o->tool));
    return TD_OK;
}
