#include "cli/cli_ids.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

static bool cli_ids_sep(char c)
{
    return c == ',' || c == ' ' || c == '\t' || c == '[' || c == ']' || c == '\r';
}

td_err cli_parse_ids(const char *s, size_t n, tok_ids *out)
{
    out->n = 0;
    size_t i = 0;
    while (i < n) {
        if (cli_ids_sep(s[i])) {
            i++;
            continue;
        }
        long long v = 0;
        size_t start = i;
        bool neg = s[i] == '-';
        if (neg)
            i++;
        while (i < n && s[i] >= '0' && s[i] <= '9' && v <= INT32_MAX)
            v = v * 10 + (s[i++] - '0');
        if (i == start + neg || (i < n && !cli_ids_sep(s[i])) || v > INT32_MAX)
            return err_set(TD_EINVAL, "token ids: '%.*s' is not a token id",
                           (int)((n - start) > 32 ? 32 : n - start), s + start);
        if (out->n == out->cap) {
            size_t cap = out->cap ? out->cap * 2 : 64;
            int32_t *p = realloc(out->ids, cap * sizeof *p);
            if (!p)
                return err_set(TD_ENOMEM, "out of memory");
            out->ids = p;
            out->cap = cap;
        }
        out->ids[out->n++] = (int32_t)(neg ? -v : v);
    }
    return TD_OK;
}
