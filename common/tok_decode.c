/* Decoding: the GPT-2 byte alphabet, UTF-8 classification with U+FFFD replacement of
 * maximal ill-formed subparts (Unicode's recommended practice, what Python's "replace" and
 * Rust's from_utf8_lossy do), whole and streaming decode, and the growable outputs. */
#include <stdlib.h>
#include <string.h>

#include "common/tok_internal.h"

static const char tok_replacement[3] = {(char)0xef, (char)0xbf, (char)0xbd}; /* U+FFFD */

/* --- growable outputs ------------------------------------------------------------------ */

td_err toki_ids_push(tok_ids *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p)
            return err_set(TD_ENOMEM, "tokenizer: %zu ids", cap);
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return TD_OK;
}

td_err toki_bytes_append(tok_bytes *b, const void *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *q = realloc(b->ptr, cap);
        if (!q)
            return err_set(TD_ENOMEM, "tokenizer: %zu bytes of text", cap);
        b->ptr = q;
        b->cap = cap;
    }
    if (n)
        memcpy(b->ptr + b->len, p, n);
    b->len += n;
    b->ptr[b->len] = '\0';
    return TD_OK;
}

void tok_ids_free(tok_ids *v)
{
    free(v->ids);
    *v = (tok_ids){0};
}

void tok_bytes_free(tok_bytes *b)
{
    free(b->ptr);
    *b = (tok_bytes){0};
}

/* --- byte alphabet --------------------------------------------------------------------- */
/* GPT-2 keeps the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF as themselves and gives
 * the other 68 bytes, in byte order, the code points 256.. (so a space is U+0120). */

uint32_t toki_byte_cp(uint8_t b)
{
    if (b <= 0x20)
        return 256u + b;
    if (b >= 0x7f && b <= 0xa0)
        return 256u + 33u + (b - 0x7fu);
    if (b == 0xad)
        return 256u + 67u;
    return b;
}

int toki_cp_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7e) || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff))
        return (int)cp;
    if (cp >= 256 && cp <= 256 + 32)
        return (int)(cp - 256);
    if (cp >= 256 + 33 && cp <= 256 + 66)
        return (int)(cp - 256 - 33 + 0x7f);
    if (cp == 256 + 67)
        return 0xad;
    return -1;
}

size_t toki_put_cp(char *p, uint32_t cp)
{
    TD_ASSERT(cp < 0x800);
    if (cp < 0x80) {
        p[0] = (char)cp;
        return 1;
    }
    p[0] = (char)(0xc0 | (cp >> 6));
    p[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

td_err tok_alphabet_of(const uint8_t *b, size_t n, tok_bytes *out)
{
    for (size_t i = 0; i < n; i++) {
        char c[2];
        TD_TRY(toki_bytes_append(out, c, toki_put_cp(c, toki_byte_cp(b[i]))));
    }
    return TD_OK;
}

/* --- UTF-8 ------------------------------------------------------------------------------ */

int toki_utf8_next(const uint8_t *s, size_t n, size_t *len)
{
    TD_ASSERT(n >= 1);
    uint8_t c = s[0];
    if (c < 0x80) {
        *len = 1;
        return TOKI_UTF8_OK;
    }
    /* Well-formed sequences (Unicode table 3-7): the lead byte fixes the length and the
     * range of the second byte; later bytes are 80..BF. */
    size_t need;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        need = 1;
    else if (c == 0xe0)
        need = 2, lo = 0xa0;
    else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef)
        need = 2;
    else if (c == 0xed)
        need = 2, hi = 0x9f;
    else if (c == 0xf0)
        need = 3, lo = 0x90;
    else if (c >= 0xf1 && c <= 0xf3)
        need = 3;
    else if (c == 0xf4)
        need = 3, hi = 0x8f;
    else {
        *len = 1;
        return TOKI_UTF8_BAD;
    }
    for (size_t k = 1; k <= need; k++) {
        if (k >= n) {
            *len = n;
            return TOKI_UTF8_SHORT;
        }
        uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xbf;
        if (s[k] < l || s[k] > h) {
            *len = k;
            return TOKI_UTF8_BAD;
        }
    }
    *len = need + 1;
    return TOKI_UTF8_OK;
}

td_err toki_utf8_lossy(const uint8_t *s, size_t n, bool final, tok_bytes *out, size_t *kept)
{
    size_t run = 0, i = 0; /* s[run..i) is valid and not yet written */
    *kept = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t len;
        int r = toki_utf8_next(s + i, n - i, &len);
        if (r == TOKI_UTF8_OK) {
            i += len;
            continue;
        }
        TD_TRY(toki_bytes_append(out, s + run, i - run));
        if (r == TOKI_UTF8_SHORT && !final) {
            *kept = len;
            return TD_OK;
        }
        TD_TRY(toki_bytes_append(out, tok_replacement, sizeof tok_replacement));
        i += len;
        run = i;
    }
    return toki_bytes_append(out, s + run, i - run);
}

/* --- decoding ----------------------------------------------------------------------------- */

void tok_stream_init(tok_stream *s, const tokenizer *t, unsigned flags)
{
    TD_ASSERT(s && t);
    *s = (tok_stream){.t = t, .flags = flags};
}

/* Feeds decoded bytes: first completes (or rejects) the character waiting in pend. */
static td_err tok_stream_bytes(tok_stream *s, const uint8_t *p, size_t n, tok_bytes *out)
{
    size_t i = 0;
    while (s->n_pend && i < n) {
        s->pend[s->n_pend++] = p[i++];
        size_t len;
        int r = toki_utf8_next(s->pend, s->n_pend, &len);
        if (r == TOKI_UTF8_OK) {
            TD_TRY(toki_bytes_append(out, s->pend, s->n_pend));
            s->n_pend = 0;
        } else if (r == TOKI_UTF8_BAD) {
            /* pend held a valid prefix, so the byte just added broke it: one U+FFFD for the
             * prefix, and that byte starts afresh. */
            TD_ASSERT(len == s->n_pend - 1);
            TD_TRY(toki_bytes_append(out, tok_replacement, sizeof tok_replacement));
            s->n_pend = 0;
            i--;
        }
    }
    if (i < n) {
        size_t kept;
        TD_TRY(toki_utf8_lossy(p + i, n - i, false, out, &kept));
        TD_ASSERT(kept <= 3);
        memcpy(s->pend, p + n - kept, kept);
        s->n_pend = (uint32_t)kept;
    }
    return TD_OK;
}

td_err tok_stream_push(tok_stream *s, const int32_t *ids, size_t n, tok_bytes *out)
{
    TD_ASSERT(s && s->t && out && (ids || n == 0));
    const tokenizer *t = s->t;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->n_vocab)
            return err_set(TD_ERANGE, "tokenizer: id %d at position %zu is outside the "
                           "vocabulary of %u", ids[i], i, t->n_vocab);
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if ((s->flags & TOK_DEC_SKIP_SPECIAL) && t->type[id] == TOK_TYPE_CONTROL)
            continue;
        TD_TRY(tok_stream_bytes(s, t->out + t->out_off[id], t->out_off[id + 1] - t->out_off[id], out));
    }
    return TD_OK;
}

tok_str tok_bytes_of(const tokenizer *t, int32_t id)
{
    TD_ASSERT(t && id >= 0 && (uint32_t)id < t->n_vocab);
    return (tok_str){(const char *)t->out + t->out_off[id], t->out_off[id + 1] - t->out_off[id]};
}

td_err tok_stream_flush(tok_stream *s, tok_bytes *out)
{
    TD_ASSERT(s && out);
    td_err e = TD_OK;
    if (s->n_pend)
        e = toki_bytes_append(out, tok_replacement, sizeof tok_replacement);
    s->n_pend = 0;
    return e;
}

td_err tok_decode(const tokenizer *t, const int32_t *ids, size_t n, unsigned flags, tok_bytes *out)
{
    TD_ASSERT(t && out);
    size_t len0 = out->len;
    tok_stream s;
    tok_stream_init(&s, t, flags);
    td_err e = tok_stream_push(&s, ids, n, out);
    if (e == TD_OK)
        e = tok_stream_flush(&s, out);
    if (e != TD_OK && out->ptr) {
        out->len = len0;
        out->ptr[len0] = '\0';
    }
    return e;
}
