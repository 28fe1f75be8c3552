/* The HTTP API, apart from the HTTP server: a request (method, path, auth header, body) goes
 * in, a reply comes out: a whole body, or a stream of server-sent events the server pulls
 * from with api_stream_read on the connection's own thread.
 *
 *   POST /v1/chat/completions   POST /v1/completions   POST /v1/responses
 *   GET /v1/models[/<name>]     GET /health            GET /metrics
 *   POST /tokenize              POST /detokenize
 *
 *   GET, DELETE /v1/responses/<id> (a kept response; a background one as it stands, or
 *                                  its events with ?stream=true&starting_after=N)
 *   POST /v1/responses/<id>/cancel (stops a background response)
 *   GET /v1/responses/<id>/input_items (its input items: ?limit, order, after, before, include)
 *   POST /v1/responses/input_tokens (a Responses body's prompt tokens, counted)
 *
 * Unknown paths are 404, a known path with another method 405 (with Allow), a body over
 * --max-body 413, a missing or wrong Bearer key 401, verifyd down or not ready 503. */
#ifndef TANDEM_GATEWAY_API_H
#define TANDEM_GATEWAY_API_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "gateway/gateway.h"
#include "gateway/metrics.h"
#include "gateway/request.h"

typedef struct api_call {
    const char *method;        /* "GET", "POST", ... */
    const char *path;          /* without the query string */
    const req_arg *args;       /* [n_args] the query string's parameters, in order */
    size_t n_args;
    const char *authorization; /* the Authorization header, or NULL */
    const char *body;          /* [body_len] request body */
    size_t body_len;           /* bytes */
    bool body_too_large;       /* the body passed max_body and was not kept */
    int client_fd;             /* the client's socket, to notice it leaving; -1 unknown */
} api_call;

typedef struct api_stream api_stream;

typedef struct api_reply {
    int status;                /* HTTP status */
    const char *content_type;  /* static string */
    char *body;                /* malloc'd body of body_len bytes, or NULL for a stream */
    size_t body_len;
    api_stream *stream;        /* an SSE stream, or NULL */
    const char *allow;         /* 405: the Allow header, else NULL */
    bool auth_challenge;       /* 401: add WWW-Authenticate: Bearer */
    metrics_endpoint endpoint; /* for the request counter */
} api_reply;

/* Answers one request. Never fails: every problem is an error reply. */
void api_handle(gw_state *g, const api_call *c, api_reply *r);

/* Copies up to cap bytes of the stream into buf, waiting for the generation as needed.
 * Returns the bytes copied (> 0), 0 at the end of the stream, -1 when the client went away or
 * the stream cannot continue (the caller closes the connection). */
ssize_t api_stream_read(api_stream *s, char *buf, size_t cap);

/* Ends the stream (cancelling its generation when it is still running) and frees it. */
void api_stream_free(api_stream *s);

#endif
