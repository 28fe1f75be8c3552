/* A growable NUL-terminated text buffer, for text built piece by piece (rendered events,
 * tool-call arguments, the metrics page). An append that cannot be made (out of memory, or a
 * size past SIZE_MAX / 4) leaves the text as it was, returns false and sets oom, which stays
 * set, so a caller may check once at the end that nothing was lost (later appends are still
 * tried: an error event can follow a failed one). */
#ifndef TANDEM_COMMON_TBUF_H
#define TANDEM_COMMON_TBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct tbuf {
    char *p;    /* [cap] bytes, NUL-terminated at len; NULL before the first append */
    size_t len; /* bytes of text */
    size_t cap; /* bytes allocated */
    bool oom;   /* an append failed: the text is incomplete */
} tbuf;

/* Appends the n bytes at s; false (and oom) when it cannot. */
bool tbuf_put(tbuf *b, const void *s, size_t n);

/* Appends the string s. */
bool tbuf_puts(tbuf *b, const char *s);

/* Appends printf's output for fmt. */
bool tbuf_printf(tbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Frees the text; b is empty again (oom cleared). */
void tbuf_free(tbuf *b);

#endif
