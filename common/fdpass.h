/* fdpass: file descriptors plus a small byte payload between local processes.
 *
 * NNG cannot carry file descriptors, so shared buffers travel over their own AF_UNIX
 * SOCK_SEQPACKET socket with SCM_RIGHTS: one message = one payload (1..FDPASS_MAX_PAYLOAD
 * bytes, kept whole by SEQPACKET) + 0..FDPASS_MAX_FDS descriptors. Receiving is defensive,
 * because the peer is another process: a truncated payload or control message is an
 * error, every descriptor that arrived with a refused message is closed, and accepted
 * descriptors are close-on-exec. Every call takes a timeout in milliseconds (-1 waits
 * forever; daemons should not use it). */
#ifndef TANDEM_COMMON_FDPASS_H
#define TANDEM_COMMON_FDPASS_H

#include <stddef.h>

#include "common/err.h"

#define FDPASS_MAX_FDS 16       /* descriptors per message */
#define FDPASS_MAX_PAYLOAD 4096 /* bytes per message */

/* A connected pair (both ends close-on-exec), for a parent and the child it spawns. */
td_err fdpass_socketpair(int socks[2]);

/* Sends payload (1..FDPASS_MAX_PAYLOAD bytes) and n_fds descriptors as one message. The
 * descriptors stay owned by the caller. TD_ETIMEOUT, TD_ECLOSED (peer gone) or TD_EIO. */
td_err fdpass_send(int sock, const void *payload, size_t len, const int *fds, size_t n_fds,
                   int timeout_ms);

/* Receives one message: at most cap payload bytes into payload (*len = bytes received) and
 * at most max_fds descriptors into fds (*n_fds = count; the caller owns them). A message
 * with a larger payload or more descriptors is refused with TD_EPROTO and its descriptors
 * are closed. TD_ECLOSED when the peer has closed, TD_ETIMEOUT when nothing arrived. */
td_err fdpass_recv(int sock, void *payload, size_t cap, size_t *len, int *fds, size_t max_fds,
                   size_t *n_fds, int timeout_ms);

/* Writes "<dir>/<name>.sock" to out after checking that dir is a directory owned by this
 * user with no group/other permissions (anyone who can reach the socket can hand us
 * descriptors and read buffers) and that the path fits a sockaddr_un. */
td_err fdpass_path(const char *dir, const char *name, char *out, size_t cap);

/* Binds and listens on path (from fdpass_path), replacing a stale socket file. */
td_err fdpass_listen(const char *path, int *sock);

/* Accepts one connection; refuses (and closes) a peer running as another user. */
td_err fdpass_accept(int listen_sock, int timeout_ms, int *sock);

/* Connects to a listening path. TD_ENOENT when nobody listens there. */
td_err fdpass_connect(const char *path, int *sock);

#endif
