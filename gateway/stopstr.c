#include "gateway/stopstr.h"

#include <stdlib.h>
#include <string.h>

void stop_init(stop_filter *f, const char *const *stops, const size_t *stop_lens,
               size_t n_stops)
{
    memset(f, 0, sizeof *f);
    f->stops = stops;
    f->stop_lens = stop_lens;
    f->n_stops = n_stops;
    for (size_t i = 0; i < n_stops; i++)
        TD_ASSERT(stop_lens[i] > 0);
}

void stop_free(stop_filter *f)
{
    free(f->hold);
    free(f->out);
    memset(f, 0, sizeof *f);
}

static td_err stop_reserve(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return TD_OK;
    size_t c = need < 256 ? 256 : need * 2;
    char *b = realloc(*buf, c);
    if (!b)
        return err_set(TD_ENOMEM, "stop strings: out of memory");
    *buf = b;
    *cap = c;
    return TD_OK;
}

/* Bytes at the end of s[0..n) that are a proper beginning of some stop string. */
static size_t stop_tail(const stop_filter *f, const char *s, size_t n)
{
    size_t best = 0;
    for (size_t i = 0; i < f->n_stops; i++) {
        size_t k = f->stop_lens[i] - 1 < n ? f->stop_lens[i] - 1 : n;
        for (; k > best; k--)
            if (memcmp(s + n - k, f->stops[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

td_err stop_push(stop_filter *f, const char *text, size_t len, const char **out, size_t *out_len)
{
    *out = "";
    *out_len = 0;
    if (f->stopped || len == 0)
        return TD_OK;
    size_t n = f->hold_len + len;
    TD_TRY(stop_reserve(&f->out, &f->out_cap, n + 1));
    if (f->hold_len)
        memcpy(f->out, f->hold, f->hold_len);
    memcpy(f->out + f->hold_len, text, len);
    f->hold_len = 0;

    /* The earliest stop string wins. */
    size_t cut = n;
    for (size_t i = 0; i < f->n_stops; i++) {
        const char *p = memmem(f->out, n, f->stops[i], f->stop_lens[i]);
        if (p && (size_t)(p - f->out) < cut) {
            cut = (size_t)(p - f->out);
            f->stop_index = i;
            f->stopped = true;
        }
    }
    size_t keep = f->stopped ? 0 : stop_tail(f, f->out, n);
    if (keep) {
        TD_TRY(stop_reserve(&f->hold, &f->hold_cap, keep));
        memcpy(f->hold, f->out + n - keep, keep);
        f->hold_len = keep;
    }
    *out = f->out;
    *out_len = !f->stopped   ? n - keep
               : f->keep_stop ? cut + f->stop_lens[f->stop_index]
                              : cut;
    return TD_OK;
}

void stop_flush(stop_filter *f, const char **out, size_t *out_len)
{
    *out = f->hold ? f->hold : "";
    *out_len = f->stopped ? 0 : f->hold_len;
    f->hold_len = 0;
}
