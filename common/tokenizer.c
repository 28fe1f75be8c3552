/* Tokenizer construction from a tok_desc, lookups, and the top of encoding: invalid UTF-8
 * replacement and the added-token split. BPE is in tok_bpe.c, the regex in tok_pretok.c,
 * decoding in tok_decode.c, GGUF loading in tok_gguf.c. */
#include "common/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/tok_internal.h"

uint64_t toki_hash(const void *p, size_t n)
{
    const uint64_t h = td_hash(TD_HASH_SEED, p, n);
    return h ? h : 1;
}

static uint32_t tok_pow2_at_least(uint64_t n)
{
    uint32_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

/* --- vocabulary string -> id ---------------------------------------------------------- */

static int32_t tok_vocab_find(const tokenizer *t, const char *s, size_t n)
{
    uint32_t mask = t->vocab.cap - 1;
    for (uint32_t i = (uint32_t)toki_hash(s, n) & mask;; i = (i + 1) & mask) {
        int32_t id = t->vocab.slots[i];
        if (id < 0)
            return -1;
        tok_str x = toki_text(t, id);
        if (x.len == n && memcmp(x.ptr, s, n) == 0)
            return id;
    }
}

/* Keeps the first id of a duplicated string. */
static void tok_vocab_insert(tokenizer *t, int32_t id)
{
    tok_str x = toki_text(t, id);
    uint32_t mask = t->vocab.cap - 1;
    for (uint32_t i = (uint32_t)toki_hash(x.ptr, x.len) & mask;; i = (i + 1) & mask) {
        int32_t o = t->vocab.slots[i];
        if (o < 0) {
            t->vocab.slots[i] = id;
            return;
        }
        tok_str y = toki_text(t, o);
        if (y.len == x.len && memcmp(y.ptr, x.ptr, x.len) == 0)
            return;
    }
}

/* --- (left, right) -> merge ----------------------------------------------------------- */

static uint32_t tok_pair_slot(uint64_t key, uint32_t cap)
{
    return (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & (cap - 1);
}

/* A pair listed twice keeps the later rank, as Hugging Face's merge map does. */
static void tok_pair_insert(toki_pairmap *m, uint64_t key, uint32_t rank, int32_t id)
{
    for (uint32_t i = tok_pair_slot(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->slots[i].key == UINT64_MAX || m->slots[i].key == key) {
            m->slots[i] = (toki_merge){key, rank, id};
            return;
        }
    }
}

/* --- construction ---------------------------------------------------------------------- */

/* Decoded bytes of a normal token: each character through the inverse byte table; a token
 * with any character outside the table gives its own UTF-8 (Hugging Face's ByteLevel
 * decoder does the same), so decoding never fails. */
static size_t tok_byte_decode(const char *s, size_t n, uint8_t *dst)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        if (toki_utf8_next((const uint8_t *)s + i, n - i, &len) != TOKI_UTF8_OK)
            goto raw;
        uint32_t cp;
        const uint8_t *p = (const uint8_t *)s + i;
        if (len == 1)
            cp = p[0];
        else if (len == 2)
            cp = (uint32_t)(p[0] & 0x1f) << 6 | (p[1] & 0x3f);
        else
            goto raw; /* every alphabet character is below U+0800 */
        int b = toki_cp_byte(cp);
        if (b < 0)
            goto raw;
        dst[o++] = (uint8_t)b;
        i += len;
    }
    return o;
raw:
    memcpy(dst, s, n);
    return n;
}

static int tok_added_cmp(const void *a, const void *b, void *arg)
{
    const tokenizer *t = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    tok_str sx = toki_text(t, x), sy = toki_text(t, y);
    uint8_t fx = (uint8_t)sx.ptr[0], fy = (uint8_t)sy.ptr[0];
    if (fx != fy)
        return fx < fy ? -1 : 1;
    if (sx.len != sy.len)
        return sx.len > sy.len ? -1 : 1;
    return x < y ? -1 : x > y;
}

static td_err tok_check_desc(const tok_desc *d)
{
    if (d->pre != TOK_PRE_QWEN2 && d->pre != TOK_PRE_QWEN35)
        return err_set(TD_EINVAL, "tokenizer: unknown pre-tokeniser %d", (int)d->pre);
    if (d->n_tokens == 0 || d->n_tokens > INT32_MAX - 1 || !d->tokens)
        return err_set(TD_EFORMAT, "tokenizer: vocabulary of %u tokens", d->n_tokens);
    if (d->n_merges && !d->merges)
        return err_set(TD_EINVAL, "tokenizer: %u merges without a list", d->n_merges);
    for (uint32_t i = 0; d->types && i < d->n_tokens; i++) {
        if (d->types[i] < TOK_TYPE_NORMAL || d->types[i] > TOK_TYPE_BYTE)
            return err_set(TD_EFORMAT, "tokenizer: token %u has type %d (expected 1..6)", i, d->types[i]);
        if (d->types[i] == TOK_TYPE_BYTE)
            return err_set(TD_ENOTSUP, "tokenizer: token %u is a byte-fallback token, which "
                           "byte-level BPE does not use", i);
    }
    const struct {
        const char *name;
        int32_t id;
    } sp[] = {{"bos", d->specials.bos}, {"eos", d->specials.eos}, {"eot", d->specials.eot},
              {"pad", d->specials.pad}, {"unk", d->specials.unk}};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++)
        if (sp[i].id < -1 || sp[i].id >= (int64_t)d->n_tokens)
            return err_set(TD_EFORMAT, "tokenizer: %s token id %d outside the vocabulary of %u",
                           sp[i].name, sp[i].id, d->n_tokens);
    return TD_OK;
}

static td_err tok_build_strings(tokenizer *t, const tok_desc *d)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < d->n_tokens; i++) {
        if (d->tokens[i].len && !d->tokens[i].ptr)
            return err_set(TD_EINVAL, "tokenizer: token %u has no text", i);
        total += d->tokens[i].len;
    }
    if (total >= UINT32_MAX)
        return err_set(TD_ERANGE, "tokenizer: %llu bytes of token text", (unsigned long long)total);
    t->text = malloc(total + 1);
    t->text_off = malloc(sizeof(uint32_t) * (d->n_tokens + 1u));
    t->out = malloc(total + 1);
    t->out_off = malloc(sizeof(uint32_t) * (d->n_tokens + 1u));
    t->type = malloc(d->n_tokens);
    if (!t->text || !t->text_off || !t->out || !t->out_off || !t->type)
        return err_set(TD_ENOMEM, "tokenizer: %llu bytes of token text", (unsigned long long)total);
    uint32_t o = 0, ob = 0;
    for (uint32_t i = 0; i < d->n_tokens; i++) {
        t->type[i] = (uint8_t)(d->types ? d->types[i] : TOK_TYPE_NORMAL);
        t->text_off[i] = o;
        t->out_off[i] = ob;
        if (d->tokens[i].len)
            memcpy(t->text + o, d->tokens[i].ptr, d->tokens[i].len);
        switch (t->type[i]) {
        case TOK_TYPE_NORMAL:
            ob += (uint32_t)tok_byte_decode(t->text + o, d->tokens[i].len, t->out + ob);
            break;
        case TOK_TYPE_UNUSED:
            break;
        default: /* added and unknown tokens print their text */
            memcpy(t->out + ob, t->text + o, d->tokens[i].len);
            ob += (uint32_t)d->tokens[i].len;
            break;
        }
        o += (uint32_t)d->tokens[i].len;
    }
    t->text_off[d->n_tokens] = o;
    t->out_off[d->n_tokens] = ob;
    return TD_OK;
}

static td_err tok_build_maps(tokenizer *t, const tok_desc *d)
{
    t->vocab.cap = tok_pow2_at_least((uint64_t)d->n_tokens * 2);
    t->vocab.slots = malloc(sizeof(int32_t) * t->vocab.cap);
    t->merges.cap = tok_pow2_at_least((uint64_t)d->n_merges * 2);
    t->merges.slots = malloc(sizeof(toki_merge) * t->merges.cap);
    if (!t->vocab.slots || !t->merges.slots)
        return err_set(TD_ENOMEM, "tokenizer: lookup tables for %u tokens", d->n_tokens);
    memset(t->vocab.slots, 0xff, sizeof(int32_t) * t->vocab.cap);
    memset(t->merges.slots, 0xff, sizeof(toki_merge) * t->merges.cap);
    for (uint32_t i = 0; i < d->n_tokens; i++)
        tok_vocab_insert(t, (int32_t)i);

    for (int b = 0; b < 256; b++) {
        char u[4];
        t->byte_tok[b] = tok_vocab_find(t, u, toki_put_cp(u, toki_byte_cp((uint8_t)b)));
    }

    size_t cat_cap = 256;
    char *cat = malloc(cat_cap);
    if (!cat)
        return err_set(TD_ENOMEM, "tokenizer: merge buffer");
    td_err e = TD_OK;
    for (uint32_t r = 0; r < d->n_merges && e == TD_OK; r++) {
        tok_str m = d->merges[r];
        /* "left right": the first space after the first byte separates (byte-level strings
         * hold no raw space; a leading one would belong to the left part). */
        const char *sp = m.len > 1 ? memchr(m.ptr + 1, ' ', m.len - 1) : NULL;
        if (!m.ptr || !sp) {
            e = err_set(TD_EFORMAT, "tokenizer: merge %u '%.*s' is not 'left right'", r,
                        (int)(m.len > 64 ? 64 : m.len), m.ptr ? m.ptr : "");
            break;
        }
        size_t ll = (size_t)(sp - m.ptr), rl = m.len - ll - 1;
        int32_t left = tok_vocab_find(t, m.ptr, ll), right = tok_vocab_find(t, sp + 1, rl);
        if (ll + rl > cat_cap) {
            cat_cap = ll + rl;
            char *n = realloc(cat, cat_cap);
            if (!n) {
                e = err_set(TD_ENOMEM, "tokenizer: merge buffer");
                break;
            }
            cat = n;
        }
        memcpy(cat, m.ptr, ll);
        memcpy(cat + ll, sp + 1, rl);
        int32_t merged = tok_vocab_find(t, cat, ll + rl);
        if (left < 0 || right < 0 || merged < 0)
            e = err_set(TD_EFORMAT, "tokenizer: merge %u '%.*s': %s is not a token", r,
                        (int)(m.len > 64 ? 64 : m.len), m.ptr,
                        left < 0 ? "the left part" : right < 0 ? "the right part" : "the result");
        else
            tok_pair_insert(&t->merges, (uint64_t)(uint32_t)left << 32 | (uint32_t)right, r, merged);
    }
    free(cat);
    return e;
}

static td_err tok_build_added(tokenizer *t)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++)
        if ((t->type[i] == TOK_TYPE_CONTROL || t->type[i] == TOK_TYPE_USER_DEFINED) &&
            t->text_off[i + 1] > t->text_off[i])
            n++;
    t->added = malloc(sizeof(int32_t) * (n ? n : 1));
    if (!t->added)
        return err_set(TD_ENOMEM, "tokenizer: %u added tokens", n);
    n = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++)
        if ((t->type[i] == TOK_TYPE_CONTROL || t->type[i] == TOK_TYPE_USER_DEFINED) &&
            t->text_off[i + 1] > t->text_off[i])
            t->added[n++] = (int32_t)i;
    t->n_added = n;
    qsort_r(t->added, n, sizeof(int32_t), tok_added_cmp, t);
    uint32_t k = 0;
    for (int b = 0; b <= 256; b++) {
        while (b < 256 && k < n && (uint8_t)toki_text(t, t->added[k]).ptr[0] < b)
            k++;
        t->added_at[b] = b < 256 ? k : n;
    }
    return TD_OK;
}

td_err tok_init(tokenizer **out, const tok_desc *d)
{
    TD_ASSERT(out && d);
    *out = NULL;
    TD_TRY(tok_check_desc(d));
    tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return err_set(TD_ENOMEM, "tokenizer: out of memory");
    t->pre = d->pre;
    t->n_vocab = d->n_tokens;
    t->sp = d->specials;
    td_err e = tok_build_strings(t, d);
    if (e == TD_OK)
        e = tok_build_maps(t, d);
    if (e == TD_OK)
        e = tok_build_added(t);
    if (e == TD_OK)
        e = toki_re_compile(t);
    if (e == TD_OK)
        e = toki_cache_init(&t->cache);
    if (e != TD_OK) {
        tok_free(t);
        return e;
    }
    *out = t;
    return TD_OK;
}

void tok_free(tokenizer *t)
{
    if (!t)
        return;
    toki_re_free(t);
    toki_cache_free(t->cache);
    free(t->text);
    free(t->text_off);
    free(t->out);
    free(t->out_off);
    free(t->type);
    free(t->vocab.slots);
    free(t->merges.slots);
    free(t->added);
    free(t);
}

td_err tok_pre_parse(const char *name, size_t len, tok_pre *out)
{
    if (len == 5 && !memcmp(name, "qwen2", 5))
        *out = TOK_PRE_QWEN2;
    else if (len == 6 && !memcmp(name, "qwen35", 6))
        *out = TOK_PRE_QWEN35;
    else
        return err_set(TD_ENOTSUP, "tokenizer: pre-tokeniser '%.*s' is not supported "
                       "(supported: qwen2, qwen35)", (int)(len > 64 ? 64 : len), name);
    return TD_OK;
}

/* --- lookups ----------------------------------------------------------------------------- */

uint32_t tok_n_vocab(const tokenizer *t) { return t->n_vocab; }
tok_pre tok_pre_of(const tokenizer *t) { return t->pre; }
const tok_specials *tok_specials_of(const tokenizer *t) { return &t->sp; }

int32_t tok_id_of(const tokenizer *t, const char *text, size_t len)
{
    return tok_vocab_find(t, text, len);
}

tok_str tok_text_of(const tokenizer *t, int32_t id)
{
    TD_ASSERT(id >= 0 && (uint32_t)id < t->n_vocab);
    return toki_text(t, id);
}

tok_type tok_type_of(const tokenizer *t, int32_t id)
{
    TD_ASSERT(id >= 0 && (uint32_t)id < t->n_vocab);
    return (tok_type)t->type[id];
}

bool tok_is_eog(const tokenizer *t, int32_t id)
{
    return id >= 0 && (id == t->sp.eos || id == t->sp.eot);
}

/* --- encoding -------------------------------------------------------------------------- */

/* The longest added token at s[0..n), or -1. */
static int32_t tok_added_match(const tokenizer *t, const char *s, size_t n, unsigned flags)
{
    uint8_t b = (uint8_t)s[0];
    for (uint32_t k = t->added_at[b]; k < t->added_at[b + 1]; k++) {
        int32_t id = t->added[k];
        if ((flags & TOK_ENC_SPLIT_SPECIAL) && t->type[id] == TOK_TYPE_CONTROL)
            continue;
        tok_str a = toki_text(t, id);
        if (a.len <= n && memcmp(a.ptr, s, a.len) == 0)
            return id;
    }
    return -1;
}

static bool tok_utf8_valid(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t len;
        if (toki_utf8_next(s + i, n - i, &len) != TOKI_UTF8_OK)
            return false;
        i += len;
    }
    return true;
}

static td_err tok_encode_clean(const tokenizer *t, const char *s, size_t n, unsigned flags, tok_ids *out)
{
    size_t seg = 0;
    for (size_t i = 0; i < n;) {
        int32_t id = t->added_at[(uint8_t)s[i]] < t->added_at[(uint8_t)s[i] + 1]
                         ? tok_added_match(t, s + i, n - i, flags)
                         : -1;
        if (id < 0) {
            i++;
            continue;
        }
        if (i > seg)
            TD_TRY(toki_encode_segment(t, s + seg, i - seg, out));
        TD_TRY(toki_ids_push(out, id));
        i += toki_text(t, id).len;
        seg = i;
    }
    if (seg < n)
        TD_TRY(toki_encode_segment(t, s + seg, n - seg, out));
    return TD_OK;
}

td_err tok_encode(const tokenizer *t, const char *text, size_t len, unsigned flags, tok_ids *out)
{
    TD_ASSERT(t && out && (text || len == 0));
    size_t n0 = out->n;
    tok_bytes clean = {0};
    td_err e = TD_OK;
    if (!tok_utf8_valid((const uint8_t *)text, len)) {
        size_t kept;
        e = toki_utf8_lossy((const uint8_t *)text, len, true, &clean, &kept);
        text = clean.ptr;
        len = clean.len;
    }
    if (e == TD_OK && (flags & TOK_ENC_ADD_SPECIAL) && t->sp.add_bos && t->sp.bos >= 0)
        e = toki_ids_push(out, t->sp.bos);
    if (e == TD_OK)
        e = tok_encode_clean(t, text, len, flags, out);
    if (e == TD_OK && (flags & TOK_ENC_ADD_SPECIAL) && t->sp.add_eos && t->sp.eos >= 0)
        e = toki_ids_push(out, t->sp.eos);
    tok_bytes_free(&clean);
    if (e != TD_OK)
        out->n = n0;
    return e;
}
