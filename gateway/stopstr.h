/* Stop strings: generated text is cut before the first occurrence of any of them, and the
 * stop string itself is not sent (with keep_stop, vLLM's include_stop_str_in_output, the
 * text is cut after it instead).
 *
 * Text arrives in pieces (one per decoded step), and a stop string may straddle two pieces.
 * So the filter holds back the longest tail of the text that is the beginning of some stop
 * string: "Hello, wor" with stop "world" passes "Hello, " and keeps "wor" until the next
 * piece shows whether "world" follows. Nothing sent is ever taken back, and no stop string is
 * ever split across two sent pieces. Pieces and stop strings are valid UTF-8, so every cut
 * falls between characters. */
#ifndef TANDEM_GATEWAY_STOPSTR_H
#define TANDEM_GATEWAY_STOPSTR_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

typedef struct stop_filter {
    const char *const *stops; /* [n_stops] stop strings (borrowed; outlive the filter) */
    const size_t *stop_lens;  /* [n_stops] bytes of each, > 0 */
    size_t n_stops;
    char *hold;               /* [hold_len] text held back: a prefix of some stop string */
    size_t hold_len;          /* bytes */
    size_t hold_cap;          /* bytes allocated */
    char *out;                /* [out_cap] held text + the new piece; what push returns */
    size_t out_cap;           /* bytes allocated */
    bool keep_stop;           /* the stop string found ends the text sent (set after init) */
    bool stopped;             /* a stop string was found: everything after it is dropped */
    size_t stop_index;        /* which stop string, when stopped */
} stop_filter;

void stop_init(stop_filter *f, const char *const *stops, const size_t *stop_lens,
               size_t n_stops);
void stop_free(stop_filter *f);

/* Feeds text[0..len) and sets *out / *out_len to the text that may be sent now (valid until the
 * next call). After a stop string is found, f->stopped is set and later pushes pass nothing. */
td_err stop_push(stop_filter *f, const char *text, size_t len, const char **out, size_t *out_len);

/* The end of the generation: returns what is still held (no stop string can complete now). */
void stop_flush(stop_filter *f, const char **out, size_t *out_len);

#endif
