/* Error codes and the last error's message.
 *
 * Two kinds of error (STYLE): programmer errors abort through TD_ASSERT with file:line;
 * anything that comes from outside (a client, a file, a peer, the GPU running out of memory)
 * returns a td_err and leaves a message that names the problem, readable with err_msg(). */
#ifndef TANDEM_COMMON_ERR_H
#define TANDEM_COMMON_ERR_H

#include <stdio.h>
#include <stdlib.h>

typedef enum td_err {
    TD_OK = 0,
    TD_EINVAL,    /* bad argument or request */
    TD_EIO,       /* a system call failed (errno in the message) */
    TD_ENOMEM,    /* out of host or device memory */
    TD_EFORMAT,   /* a file or message is malformed, truncated or hostile */
    TD_ERANGE,    /* a size or index is out of bounds */
    TD_ENOTSUP,   /* valid but not supported (a dtype, a RoPE scaling, ...) */
    TD_ENOENT,    /* a named thing does not exist */
    TD_ETIMEOUT,  /* a peer did not answer in time */
    TD_ECLOSED,   /* a peer or socket went away */
    TD_EPROTO,    /* a peer broke the protocol (version, type, sequence) */
    TD_EBUSY,     /* temporarily unavailable: try again */
    TD_ECUDA,     /* a CUDA call failed */
    TD_ECANCELED, /* the operation was cancelled */
    TD_ERR_COUNT
} td_err;

/* Short stable name of a code ("EFORMAT"). */
const char *err_name(td_err code);

/* Records the message of the error being returned (thread-local) and returns code, so a
 * failure reads: return err_set(TD_EFORMAT, "tensor %s: offset %llu past end", ...). */
td_err err_set(td_err code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes the current message with context: "loading x.gguf: " + old message. */
td_err err_wrap(td_err code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The message of the last err_set on this thread ("" when none). */
const char *err_msg(void);

/* Forgets the last message. */
void err_clear(void);

/* Programmer errors and impossible states: abort with file:line. Always on. */
#define TD_ASSERT(cond)                                                                      \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond);     \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

/* Propagates a non-zero td_err from an expression. */
#define TD_TRY(expr)                                                                         \
    do {                                                                                     \
        td_err td_try_e_ = (expr);                                                           \
        if (td_try_e_ != TD_OK)                                                              \
            return td_try_e_;                                                                \
    } while (0)

#endif
