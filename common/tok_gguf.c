/* Loading a tokenizer from GGUF metadata (the tokenizer.ggml.* keys llama.cpp's converter
 * writes). Kept apart from tokenizer.c so the core links without the GGUF reader. */
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"
#include "common/tok_internal.h"

/* A string array as tok_str pointers into the mapping (valid while g is open). */
static td_err tok_gguf_strs(const gguf_file *g, const char *key, tok_str **out, uint32_t *n)
{
    const gguf_value *arr;
    TD_TRY(gguf_get_arr(g, key, &arr));
    if (arr->arr.elem != GGUF_TYPE_STRING)
        return err_set(TD_EFORMAT, "%s is an array of %s, expected STRING", key,
                       gguf_type_name(arr->arr.elem));
    if (arr->arr.n > INT32_MAX - 1)
        return err_set(TD_EFORMAT, "%s has %llu entries", key, (unsigned long long)arr->arr.n);
    *n = (uint32_t)arr->arr.n;
    *out = malloc(sizeof(tok_str) * (*n ? *n : 1));
    if (!*out)
        return err_set(TD_ENOMEM, "%s: %u strings", key, *n);
    for (uint32_t i = 0; i < *n; i++) {
        gguf_str s;
        td_err e = gguf_arr_str(arr, i, &s);
        if (e != TD_OK) {
            free(*out);
            *out = NULL;
            return err_wrap(e, "%s[%u]", key, i);
        }
        (*out)[i] = (tok_str){s.ptr, (size_t)s.len};
    }
    return TD_OK;
}

static td_err tok_gguf_types(const gguf_file *g, uint32_t n_tokens, int32_t **out)
{
    const char *key = "tokenizer.ggml.token_type";
    *out = NULL;
    if (!gguf_get(g, key))
        return TD_OK; /* all NORMAL */
    const gguf_value *arr;
    TD_TRY(gguf_get_arr(g, key, &arr));
    if (arr->arr.n != n_tokens)
        return err_set(TD_EFORMAT, "%s has %llu entries for %u tokens", key,
                       (unsigned long long)arr->arr.n, n_tokens);
    int32_t *types = malloc(sizeof(int32_t) * (n_tokens ? n_tokens : 1));
    if (!types)
        return err_set(TD_ENOMEM, "%s: %u entries", key, n_tokens);
    for (uint32_t i = 0; i < n_tokens; i++) {
        int64_t v;
        td_err e = gguf_arr_i64(arr, i, &v);
        if (e != TD_OK) {
            free(types);
            return err_wrap(e, "%s[%u]", key, i);
        }
        types[i] = v < INT32_MIN || v > INT32_MAX ? 0 : (int32_t)v; /* 0: refused by tok_init */
    }
    *out = types;
    return TD_OK;
}

/* An optional token id key: -1 when absent. */
static td_err tok_gguf_id(const gguf_file *g, const char *key, uint32_t n_tokens, int32_t *out)
{
    *out = -1;
    if (!gguf_get(g, key))
        return TD_OK;
    uint32_t v;
    TD_TRY(gguf_get_u32(g, key, &v));
    if (v >= n_tokens)
        return err_set(TD_EFORMAT, "%s = %u is outside the vocabulary of %u tokens", key, v, n_tokens);
    *out = (int32_t)v;
    return TD_OK;
}

static td_err tok_gguf_flag(const gguf_file *g, const char *key, bool *out)
{
    *out = false;
    return gguf_get(g, key) ? gguf_get_bool(g, key, out) : TD_OK;
}

static td_err tok_gguf_desc(const gguf_file *g, tok_desc *d, tok_str **tokens, int32_t **types, tok_str **merges)
{
    gguf_str model, pre;
    if (!gguf_get(g, "tokenizer.ggml.model"))
        return err_set(TD_ENOENT, "the file has no tokenizer (tokenizer.ggml.model is missing)");
    TD_TRY(gguf_get_str(g, "tokenizer.ggml.model", &model));
    if (!gguf_str_eq(model, "gpt2"))
        return err_set(TD_ENOTSUP, "tokenizer model '%.*s' is not supported (only byte-level BPE, "
                       "'gpt2')", (int)(model.len > 64 ? 64 : model.len), model.ptr);
    if (!gguf_get(g, "tokenizer.ggml.pre"))
        return err_set(TD_ENOTSUP, "tokenizer.ggml.pre is missing: the pre-tokeniser is unknown "
                       "(supported: qwen2, qwen35)");
    TD_TRY(gguf_get_str(g, "tokenizer.ggml.pre", &pre));
    TD_TRY(tok_pre_parse(pre.ptr, (size_t)pre.len, &d->pre));

    TD_TRY(tok_gguf_strs(g, "tokenizer.ggml.tokens", tokens, &d->n_tokens));
    d->tokens = *tokens;
    TD_TRY(tok_gguf_types(g, d->n_tokens, types));
    d->types = *types;
    if (!gguf_get(g, "tokenizer.ggml.merges"))
        return err_set(TD_EFORMAT, "tokenizer.ggml.merges is missing (byte-level BPE needs it)");
    TD_TRY(tok_gguf_strs(g, "tokenizer.ggml.merges", merges, &d->n_merges));
    d->merges = *merges;

    tok_specials *sp = &d->specials;
    TD_TRY(tok_gguf_id(g, "tokenizer.ggml.bos_token_id", d->n_tokens, &sp->bos));
    TD_TRY(tok_gguf_id(g, "tokenizer.ggml.eos_token_id", d->n_tokens, &sp->eos));
    TD_TRY(tok_gguf_id(g, "tokenizer.ggml.eot_token_id", d->n_tokens, &sp->eot));
    TD_TRY(tok_gguf_id(g, "tokenizer.ggml.padding_token_id", d->n_tokens, &sp->pad));
    TD_TRY(tok_gguf_id(g, "tokenizer.ggml.unknown_token_id", d->n_tokens, &sp->unk));
    TD_TRY(tok_gguf_flag(g, "tokenizer.ggml.add_bos_token", &sp->add_bos));
    TD_TRY(tok_gguf_flag(g, "tokenizer.ggml.add_eos_token", &sp->add_eos));
    return TD_OK;
}

td_err tok_load_gguf(tokenizer **out, const gguf_file *g)
{
    TD_ASSERT(out && g);
    *out = NULL;
    tok_desc d = {0};
    tok_str *tokens = NULL, *merges = NULL;
    int32_t *types = NULL;
    td_err e = tok_gguf_desc(g, &d, &tokens, &types, &merges);
    if (e != TD_OK)
        e = err_wrap(e, "tokenizer");
    else
        e = tok_init(out, &d); /* its messages start with "tokenizer:" */
    free(tokens);
    free(types);
    free(merges);
    if (e != TD_OK)
        return e;
    tokenizer *t = *out;
    if (t->sp.eot < 0) {
        int32_t id = tok_id_of(t, "<|im_end|>", 10);
        if (id >= 0 && t->type[id] == TOK_TYPE_CONTROL)
            t->sp.eot = id;
    }
    return TD_OK;
}

td_err tok_open(tokenizer **out, const char *path)
{
    TD_ASSERT(out && path);
    *out = NULL;
    gguf_file *g;
    TD_TRY(gguf_open(&g, path));
    td_err e = tok_load_gguf(out, g);
    gguf_close(g);
    return e != TD_OK ? err_wrap(e, "%s", path) : TD_OK;
}
