/* The growable text buffer (tbuf.h). */
#include "common/tbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for n more bytes and the NUL: grows to twice what is needed. No size sum can wrap:
 * a request that would take the text past SIZE_MAX / 4 fails. */
static bool tbuf_room(tbuf *b, size_t n)
{
    if (b->cap > b->len && n < b->cap - b->len)
        return true;
    if (n > SIZE_MAX / 4 - b->len - 1) {
        b->oom = true;
        return false;
    }
    const size_t cap = (b->len + n + 1) * 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

bool tbuf_put(tbuf *b, const void *s, size_t n)
{
    if (!tbuf_room(b, n))
        return false;
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return true;
}

bool tbuf_puts(tbuf *b, const char *s)
{
    return tbuf_put(b, s, strlen(s));
}

bool tbuf_printf(tbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = true;
        return false;
    }
    if (!tbuf_room(b, (size_t)n))
        return false;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

void tbuf_free(tbuf *b)
{
    free(b->p);
    *b = (tbuf){0};
}
