/* The HTTP server: libmicrohttpd with one thread per connection, so a connection may block
 * while its generation runs (a stream is pulled by that thread, waiting on verifyd's events,
 * and notices the client leaving by polling its socket).
 *
 * Bodies are read up to --max-body; a larger one is read and dropped (up to a hard limit, past
 * which the connection is closed) and answered 413, so clients get the error instead of a
 * reset connection. Responses come from api_handle. */
#ifndef TANDEM_GATEWAY_HTTP_H
#define TANDEM_GATEWAY_HTTP_H

#include <stdint.h>

#include "common/err.h"
#include "gateway/gateway.h"

typedef struct http_server http_server;

/* Listens on host:port (port 0: any free port; see http_port). */
td_err http_start(http_server **out, gw_state *g, const char *host, uint16_t port);

/* The port the server listens on. */
uint16_t http_port(const http_server *s);

/* Stops accepting, closes connections and joins their threads. */
void http_stop(http_server *s);

#endif
