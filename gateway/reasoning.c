#include "gateway/reasoning.h"

#include <stdlib.h>
#include <string.h>

static const char THINK_OPEN[] = "<think>";
static const char THINK_CLOSE[] = "</think>";
#define OPEN_LEN (sizeof THINK_OPEN - 1)
#define CLOSE_LEN (sizeof THINK_CLOSE - 1)

void think_init(think_split *t, bool in_think, think_emit emit, void *ctx)
{
    memset(t, 0, sizeof *t);
    t->state = in_think ? THINK_IN : THINK_START;
    t->strip_nl = in_think;
    t->emit = emit;
    t->ctx = ctx;
}

void think_free(think_split *t)
{
    free(t->hold);
    free(t->scratch);
    memset(t, 0, sizeof *t);
}

static td_err think_reserve(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return TD_OK;
    size_t c = need < 256 ? 256 : need * 2;
    char *b = realloc(*buf, c);
    if (!b)
        return err_set(TD_ENOMEM, "reasoning split: out of memory");
    *buf = b;
    *cap = c;
    return TD_OK;
}

static td_err think_keep(think_split *t, const char *s, size_t n)
{
    TD_TRY(think_reserve(&t->hold, &t->hold_cap, n + 1));
    memmove(t->hold, s, n);
    t->hold_len = n;
    return TD_OK;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

/* Bytes at the end of s[0..n) that are a proper beginning of marker. */
static size_t marker_tail(const char *s, size_t n, const char *marker, size_t mlen)
{
    for (size_t k = mlen - 1 < n ? mlen - 1 : n; k > 0; k--)
        if (memcmp(s + n - k, marker, k) == 0)
            return k;
    return 0;
}

static td_err think_emit_text(think_split *t, bool reasoning, const char *s, size_t n)
{
    if (t->strip_nl) {
        while (n > 0 && *s == '\n') {
            s++;
            n--;
        }
        if (n == 0)
            return TD_OK;
        t->strip_nl = false;
    }
    return t->emit(t->ctx, reasoning, s, n);
}

/* Processes s[0..n) (hold already folded in) in the current state. */
static td_err think_run(think_split *t, const char *s, size_t n)
{
    while (n > 0) {
        if (t->state == THINK_CONTENT)
            return think_emit_text(t, false, s, n);
        if (t->state == THINK_START) {
            size_t ws = 0;
            while (ws < n && is_space(s[ws]))
                ws++;
            size_t rest = n - ws;
            if (rest >= OPEN_LEN && memcmp(s + ws, THINK_OPEN, OPEN_LEN) == 0) {
                t->state = THINK_IN;
                t->strip_nl = true;
                s += ws + OPEN_LEN;
                n -= ws + OPEN_LEN;
                continue;
            }
            if (rest < OPEN_LEN && memcmp(s + ws, THINK_OPEN, rest) == 0)
                return think_keep(t, s, n); /* whitespace, maybe the start of "<think>" */
            t->state = THINK_CONTENT;
            continue;
        }
        /* THINK_IN */
        const char *end = memmem(s, n, THINK_CLOSE, CLOSE_LEN);
        if (end) {
            size_t r = (size_t)(end - s);
            while (r > 0 && s[r - 1] == '\n')
                r--;
            if (r > 0)
                TD_TRY(think_emit_text(t, true, s, r));
            t->state = THINK_CONTENT;
            t->strip_nl = true;
            size_t skip = (size_t)(end - s) + CLOSE_LEN;
            s += skip;
            n -= skip;
            continue;
        }
        /* Hold a possible "</think>" beginning and the newlines before it. */
        size_t keep = marker_tail(s, n, THINK_CLOSE, CLOSE_LEN);
        while (keep < n && s[n - keep - 1] == '\n')
            keep++;
        if (n - keep > 0)
            TD_TRY(think_emit_text(t, true, s, n - keep));
        return think_keep(t, s + n - keep, keep);
    }
    return TD_OK;
}

td_err think_push(think_split *t, const char *text, size_t len)
{
    if (len == 0)
        return TD_OK;
    size_t n = t->hold_len + len;
    TD_TRY(think_reserve(&t->scratch, &t->scratch_cap, n + 1));
    if (t->hold_len)
        memcpy(t->scratch, t->hold, t->hold_len);
    memcpy(t->scratch + t->hold_len, text, len);
    t->hold_len = 0;
    return think_run(t, t->scratch, n);
}

td_err think_flush(think_split *t)
{
    size_t n = t->hold_len;
    t->hold_len = 0;
    if (n == 0)
        return TD_OK;
    if (t->state == THINK_IN) {
        while (n > 0 && t->hold[n - 1] == '\n')
            n--;
        return n ? think_emit_text(t, true, t->hold, n) : TD_OK;
    }
    return think_emit_text(t, false, t->hold, n);
}

/* The last occurrence of needle in s[0..n), or NULL. */
static const char *think_last(const char *s, size_t n, const char *needle, size_t nlen)
{
    const char *last = NULL;
    for (const char *p = s; (p = memmem(p, n - (size_t)(p - s), needle, nlen)); p += nlen)
        last = p;
    return last;
}

bool think_prompt_open(const char *prompt, size_t len)
{
    /* Only the last turn counts: a user who writes "<think>" does not open a block. */
    static const char TURN[] = "<|im_start|>";
    const char *turn = think_last(prompt, len, TURN, sizeof TURN - 1);
    if (turn) {
        len -= (size_t)(turn - prompt);
        prompt = turn;
    }
    const char *last = think_last(prompt, len, THINK_OPEN, OPEN_LEN);
    if (!last)
        return false;
    size_t after = (size_t)(last - prompt) + OPEN_LEN;
    return memmem(prompt + after, len - after, THINK_CLOSE, CLOSE_LEN) == NULL;
}
