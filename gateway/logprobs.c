#include "gateway/logprobs.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double lp_value(float logprob)
{
    if (!isfinite(logprob))
        return logprob > 0 ? 0.0 : -9999.0;
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)logprob);
        if (strtof(buf, NULL) == logprob)
            break;
    }
    return strtod(buf, NULL);
}

/* The token's text and its bytes (see the header for partial characters). */
static td_err lp_token_text(const tokenizer *tok, int32_t id, json_t **text, json_t **bytes)
{
    tok_bytes t = {0};
    tok_stream s;
    tok_stream_init(&s, tok, 0);
    td_err e = tok_stream_push(&s, &id, 1, &t);
    if (e != TD_OK) {
        tok_bytes_free(&t);
        return e;
    }
    size_t complete = t.len;
    /* The unfinished character's bytes, as they are, for "bytes". */
    uint8_t pend[4];
    uint32_t n_pend = s.n_pend;
    memcpy(pend, s.pend, n_pend);
    e = tok_stream_flush(&s, &t); /* U+FFFD for "token" */
    *bytes = json_array();
    *text = e == TD_OK ? json_stringn(t.ptr ? t.ptr : "", t.len) : NULL;
    for (size_t i = 0; *bytes && i < complete; i++)
        json_array_append_new(*bytes, json_integer((unsigned char)t.ptr[i]));
    for (uint32_t i = 0; *bytes && i < n_pend; i++)
        json_array_append_new(*bytes, json_integer(pend[i]));
    tok_bytes_free(&t);
    if (!*text || !*bytes) {
        json_decref(*text);
        json_decref(*bytes);
        return e != TD_OK ? e : err_set(TD_ENOMEM, "logprobs: out of memory");
    }
    return TD_OK;
}

static json_t *lp_entry(const tokenizer *tok, int32_t id, float logprob)
{
    json_t *text, *bytes;
    if (lp_token_text(tok, id, &text, &bytes) != TD_OK)
        return NULL;
    json_t *o = json_object();
    json_object_set_new(o, "token", text);
    json_object_set_new(o, "logprob", json_real(lp_value(logprob)));
    json_object_set_new(o, "bytes", bytes);
    return o;
}

td_err lp_append_chat(json_t *content, const tokenizer *tok, const lp_token *tokens, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        json_t *e = lp_entry(tok, tokens[i].id, tokens[i].logprob);
        json_t *top = json_array();
        if (!e || !top) {
            json_decref(e);
            json_decref(top);
            return err_set(TD_ENOMEM, "logprobs: out of memory or a bad token id");
        }
        for (uint32_t k = 0; k < tokens[i].n_top; k++) {
            json_t *a = lp_entry(tok, tokens[i].top[k].id, tokens[i].top[k].logprob);
            if (!a) {
                json_decref(e);
                json_decref(top);
                return err_set(TD_ENOMEM, "logprobs: out of memory or a bad token id");
            }
            json_array_append_new(top, a);
        }
        json_object_set_new(e, "top_logprobs", top);
        json_array_append_new(content, e);
    }
    return TD_OK;
}

json_t *lp_chat_object(json_t *content)
{
    json_t *o = json_object();
    json_object_set_new(o, "content", content);
    json_object_set_new(o, "refusal", json_null());
    return o;
}

json_t *lp_completion_object(void)
{
    json_t *o = json_object();
    json_object_set_new(o, "tokens", json_array());
    json_object_set_new(o, "token_logprobs", json_array());
    json_object_set_new(o, "top_logprobs", json_array());
    json_object_set_new(o, "text_offset", json_array());
    return o;
}

/* Code points in UTF-8 text (every byte that does not continue a character). */
static size_t lp_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

td_err lp_append_completion(json_t *obj, const tokenizer *tok, const lp_token *tokens, size_t n,
                            size_t *text_offset)
{
    json_t *toks = json_object_get(obj, "tokens");
    json_t *lps = json_object_get(obj, "token_logprobs");
    json_t *tops = json_object_get(obj, "top_logprobs");
    json_t *offs = json_object_get(obj, "text_offset");
    for (size_t i = 0; i < n; i++) {
        json_t *text, *bytes;
        TD_TRY(lp_token_text(tok, tokens[i].id, &text, &bytes));
        json_decref(bytes);
        json_array_append_new(offs, json_integer((json_int_t)*text_offset));
        *text_offset += lp_chars(json_string_value(text), json_string_length(text));
        json_array_append_new(toks, text);
        if (tokens[i].none) {
            json_array_append_new(lps, json_null());
            json_array_append_new(tops, json_null());
            continue;
        }
        json_array_append_new(lps, json_real(lp_value(tokens[i].logprob)));
        json_t *top = json_object();
        for (uint32_t k = 0; k < tokens[i].n_top; k++) {
            json_t *at, *ab;
            if (lp_token_text(tok, tokens[i].top[k].id, &at, &ab) != TD_OK) {
                json_decref(top);
                return err_set(TD_ENOMEM, "logprobs: out of memory or a bad token id");
            }
            json_decref(ab);
            json_object_setn_new(top, json_string_value(at), json_string_length(at),
                                 json_real(lp_value(tokens[i].top[k].logprob)));
            json_decref(at);
        }
        json_array_append_new(tops, top);
    }
    return TD_OK;
}

/* {"logprob": ..., "rank": ..., "decoded_token": ...} set at key id in o (a key already there
 * keeps its place). */
static bool lp_prompt_put(json_t *o, const tokenizer *tok, int32_t id, float logprob,
                          uint32_t rank)
{
    json_t *text, *bytes;
    if (lp_token_text(tok, id, &text, &bytes) != TD_OK)
        return false;
    json_decref(bytes);
    json_t *v = json_object();
    char key[16];
    snprintf(key, sizeof key, "%d", id);
    if (!v || json_object_set_new(v, "logprob", json_real(lp_value(logprob))) != 0 ||
        json_object_set_new(v, "rank", rank ? json_integer(rank) : json_null()) != 0) {
        json_decref(v);
        json_decref(text); /* not handed over yet */
        return false;
    }
    if (json_object_set_new(v, "decoded_token", text) != 0) { /* takes text even so */
        json_decref(v);
        return false;
    }
    return json_object_set_new(o, key, v) == 0;
}

json_t *lp_prompt_list(const tokenizer *tok, const lp_token *tokens, size_t n, uint32_t top)
{
    json_t *list = json_array();
    for (size_t i = 0; list && i < n; i++) {
        const lp_token *t = &tokens[i];
        json_t *o = t->none ? json_null() : json_object();
        bool ok = o != NULL;
        if (ok && !t->none) {
            ok = lp_prompt_put(o, tok, t->id, t->logprob, t->rank);
            for (uint32_t k = 0; ok && k < t->n_top && k < top; k++)
                ok = lp_prompt_put(o, tok, t->top[k].id, t->top[k].logprob, k + 1);
        }
        if (!ok)
            json_decref(o);
        if (!ok || json_array_append_new(list, o) != 0) { /* append_new frees o on failure */
            json_decref(list);
            list = NULL;
        }
    }
    return list;
}
