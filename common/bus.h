/* The bus: request/reply between tandem's daemons over NNG ipc:// sockets (DESIGN section 3).
 *
 * Endpoints live in a private runtime directory (bus_runtime_dir) as <service>.ipc. A server
 * runs a handler (request bytes -> reply bytes) on several NNG contexts at once, one worker
 * thread each; a client is thread-safe and each call waits at most its own timeout.
 *
 * Safety rules every socket follows:
 * - NNG_OPT_RECVMAXSZ is set: a server drops the connection of a request over
 *   bus_opts.recv_max instead of buffering it; a client refuses a reply over its recv_max
 *   with TD_ERANGE and keeps the connection, and drops it (NNG's limit) only for a reply
 *   over 4 times that.
 * - Send and receive timeouts are set on the socket and on every operation (NNG's default is
 *   to wait forever).
 * - Resends are off (NNG_OPT_REQ_RESENDTIME infinite). NNG's default re-sends a request
 *   that has no reply after 60 s, and re-sends at once on a new connection when the old one
 *   closes: a long generation would start twice. With resends off NNG ends such a call with
 *   a connection reset instead (TD_ECLOSED here), so one call reaches a server at most once.
 *   A caller may still retry after TD_ECLOSED or TD_ETIMEOUT, when the server may already
 *   have acted; so requests are idempotent by request id (msg.h): a retry reuses the id, and
 *   a server that sees an id again answers it as the same request.
 * - NNG is never used in a forked child before exec: tests and benchmarks that need two
 *   processes fork and exec a fresh binary.
 *
 * Errors map to td_err with NNG's error text in the message: a timeout is TD_ETIMEOUT, a closed
 * socket or a connection lost during a call is TD_ECLOSED. */
#ifndef TANDEM_COMMON_BUS_H
#define TANDEM_COMMON_BUS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/msg.h"

/* ipc:// plus the longest AF_UNIX socket path (107 bytes) and its NUL. */
#define BUS_URL_MAX 128

typedef struct bus_opts {
    size_t recv_max;         /* bytes: largest message accepted; 0 = BUS_RECV_MAX_DEFAULT */
    int32_t send_timeout_ms; /* ms a send may wait (for a connection or a full queue) */
    int32_t recv_timeout_ms; /* ms a socket-level receive may wait */
    int workers;             /* server: requests handled at the same time (threads) */
    int32_t spin_us;         /* client: us a call polls for its reply before it sleeps (a
                                thread woken from a sleep starts tens of us late; polling
                                holds a core meanwhile); 0 = sleep at once */
} bus_opts;

/* 8 MiB: a gen_start with the longest prompt (MSG_PROMPT_MAX tokens, <= 5 bytes each) is
 * 1.3 MiB. */
#define BUS_RECV_MAX_DEFAULT ((size_t)8 << 20)

/* recv_max 8 MiB, send and receive timeouts 5 s, 4 workers, no polling. */
void bus_opts_default(bus_opts *o);

/* The private runtime directory: $TANDEM_RUNTIME_DIR, else $XDG_RUNTIME_DIR/tandem, else
 * /tmp/tandem-<uid>. Creates it with mode 0700 when missing (not its parents). Refuses a path
 * that is a symbolic link or not a directory, a directory owned by another user, or one with
 * any group/other permission bits (TD_EINVAL, with the fix in the message). */
td_err bus_runtime_dir(char *out, size_t cap);

/* "ipc://<runtime dir>/<service>.ipc" for a service name of 1..32 characters [a-z0-9_-];
 * TD_ERANGE when the socket path would not fit AF_UNIX's 107 bytes. */
td_err bus_endpoint(char *url, size_t cap, const char *service);

/* Answers one request: reads req[0..req_len) and writes the reply into *reply (empty on
 * entry). Runs on a worker thread, possibly on several at once. Returning an error instead
 * sends the client an MSG_ERROR message with that code, err_msg() as text and the request's
 * request id (0 when the request has no readable envelope). */
typedef td_err (*bus_handler)(void *user, const uint8_t *req, size_t req_len, msg_buf *reply);

typedef struct bus_server bus_server;

/* Listens on url (socket file mode 0600 for ipc://) and starts opts->workers workers. */
td_err bus_server_init(bus_server **out, const char *url, const bus_opts *opts,
                       bus_handler handler, void *user);

/* Lets running handlers finish, joins the workers, then stops listening. */
void bus_server_free(bus_server *s);

typedef struct bus_client bus_client;

/* Connects in the background (and reconnects after a drop): init succeeds before a server
 * exists; calls then wait for it up to their timeout. A client that has had no connection
 * for a second starts a fresh dialer, at its next call or while a call waits, because NNG
 * 1.5's dialer can stop retrying for good after a failed handshake (a server killed while
 * a connection was being made): a call reaches a restarted server within about a second
 * of it listening. */
td_err bus_client_init(bus_client **out, const char *url, const bus_opts *opts);

/* Sends one request and waits up to timeout_ms (> 0) in total for its reply, which replaces
 * the contents of *reply. Thread-safe: concurrent calls run on their own NNG contexts.
 * TD_ETIMEOUT when no reply came in time (the message says whether a server was connected);
 * TD_ECLOSED when the connection dropped during the call (the server went away, or a message
 * exceeded a receive limit); TD_ERANGE for a reply over this client's recv_max. */
td_err bus_client_call(bus_client *c, const void *req, size_t req_len, msg_buf *reply,
                       int32_t timeout_ms);

/* Closes the connection; no call may be in flight. */
void bus_client_free(bus_client *c);

#endif
