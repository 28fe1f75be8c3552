/* One segment of text between added tokens: NFC (utf8proc), then the model's pre-tokeniser
 * regex (PCRE2, UTF + UCP, JIT), then BPE per piece. Pieces are the regex matches and,
 * as in Hugging Face's Split with behaviour "Isolated", any text between matches (these
 * patterns match every character, so in practice there is none). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/tok_internal.h"

/* The regexes of the Hugging Face tokenizer.json files (DESIGN section 9). */
static const char *const tok_patterns[] = {
    [TOK_PRE_QWEN2] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                      "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    [TOK_PRE_QWEN35] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
                       "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

enum {
    TOK_JIT_STACK_MAX = 64u << 20, /* bytes; only used when the default 32 KiB runs out */
};

td_err toki_re_compile(tokenizer *t)
{
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)tok_patterns[t->pre], PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &code, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return err_set(TD_EINVAL, "tokenizer: pre-tokeniser regex, offset %zu: %s", (size_t)at, msg);
    }
    /* Without JIT (a build or CPU without it) pcre2_match interprets: slower, same result. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    t->re = re;
    return TD_OK;
}

void toki_re_free(tokenizer *t)
{
    pcre2_code_free(t->re);
    t->re = NULL;
}

/* One match at or after off; PCRE2_ERROR_JIT_STACKLIMIT retried on a big JIT stack. */
static int tok_re_match(const tokenizer *t, const uint8_t *s, size_t n, size_t off, pcre2_match_data *md,
                        pcre2_match_context **mctx, pcre2_jit_stack **stack)
{
    int rc = pcre2_match(t->re, s, n, off, PCRE2_NO_UTF_CHECK, md, *mctx);
    if (rc != PCRE2_ERROR_JIT_STACKLIMIT || *stack)
        return rc;
    *mctx = pcre2_match_context_create(NULL);
    *stack = pcre2_jit_stack_create(32 * 1024, TOK_JIT_STACK_MAX, NULL);
    if (!*mctx || !*stack)
        return PCRE2_ERROR_NOMEMORY;
    pcre2_jit_stack_assign(*mctx, NULL, *stack);
    return pcre2_match(t->re, s, n, off, PCRE2_NO_UTF_CHECK, md, *mctx);
}

static td_err tok_pieces(const tokenizer *t, const uint8_t *s, size_t n, tok_ids *out)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!md)
        return err_set(TD_ENOMEM, "tokenizer: regex match data");
    pcre2_match_context *mctx = NULL;
    pcre2_jit_stack *stack = NULL;
    td_err e = TD_OK;
    size_t gap = 0, pos = 0; /* s[gap..) is not yet in a piece; the next search starts at pos */
    while (pos < n && e == TD_OK) {
        int rc = tok_re_match(t, s, n, pos, md, &mctx, &stack);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            e = err_set(TD_EINVAL, "tokenizer: pre-tokeniser regex failed at byte %zu: %s", pos, msg);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t start = ov[0], end = ov[1];
        if (end == start) {
            /* An empty match (these patterns make none) still advances one character, which
             * then belongs to the text between matches. */
            size_t len = 1;
            if (end < n)
                (void)toki_utf8_next(s + end, n - end, &len);
            pos = end + len;
            continue;
        }
        if (start > gap)
            e = toki_bpe_piece(t, s + gap, start - gap, out);
        if (e == TD_OK)
            e = toki_bpe_piece(t, s + start, end - start, out);
        gap = pos = end;
    }
    if (e == TD_OK && gap < n)
        e = toki_bpe_piece(t, s + gap, n - gap, out);
    pcre2_match_data_free(md);
    pcre2_match_context_free(mctx);
    pcre2_jit_stack_free(stack);
    return e;
}

td_err toki_encode_segment(const tokenizer *t, const char *s, size_t n, tok_ids *out)
{
    size_t i = 0;
    while (i < n && (uint8_t)s[i] < 0x80)
        i++;
    if (i == n) /* ASCII is already NFC */
        return tok_pieces(t, (const uint8_t *)s, n, out);
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t len = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nfc,
                                        UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (len < 0) {
        free(nfc);
        return err_set(len == UTF8PROC_ERROR_NOMEM ? TD_ENOMEM : TD_EINVAL,
                       "tokenizer: NFC normalisation: %s", utf8proc_errmsg(len));
    }
    td_err e = tok_pieces(t, nfc, (size_t)len, out);
    free(nfc);
    return e;
}
