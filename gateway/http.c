#include "gateway/http.h"

#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "common/log.h"
#include "gateway/api.h"

/* Connections at once; each has its own thread. */
#define HTTP_CONNECTIONS_MAX 1024
/* Seconds an idle keep-alive connection stays open. */
#define HTTP_IDLE_TIMEOUT_S 300
/* Bytes of an oversized body read and dropped before the 413; past this the answer is sent at
 * once and the connection closed. */
#define HTTP_DRAIN_MIN ((uint64_t)64 << 20)

struct http_server {
    gw_state *g;
    struct MHD_Daemon *d;
    uint16_t port;
};

/* One request being received. */
typedef struct http_req {
    char *body;        /* [len] bytes kept */
    size_t len, cap;
    uint64_t received; /* bytes of body seen, kept or not */
    bool too_large;    /* passed max_body: the rest is dropped */
} http_req;

/* The query string's parameters, collected by http_arg. */
typedef struct http_args {
    req_arg *v;
    size_t n, cap;
    bool oom; /* not all were collected */
} http_args;

static enum MHD_Result http_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                const char *value)
{
    (void)kind;
    http_args *a = cls;
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 8;
        req_arg *v = realloc(a->v, cap * sizeof *v);
        if (!v) {
            a->oom = true;
            return MHD_NO;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = (req_arg){.key = key, .value = value};
    return MHD_YES;
}

static uint64_t http_drain_limit(const http_server *s)
{
    uint64_t four = (uint64_t)s->g->cfg.max_body * 4;
    return four > HTTP_DRAIN_MIN ? four : HTTP_DRAIN_MIN;
}

static ssize_t http_stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    ssize_t n = api_stream_read(cls, buf, max);
    if (n > 0)
        return n;
    return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void http_stream_free(void *cls)
{
    api_stream_free(cls);
}

static enum MHD_Result http_send(struct MHD_Connection *con, api_reply *r)
{
    struct MHD_Response *resp;
    if (r->stream) {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, http_stream_read,
                                                 r->stream, http_stream_free);
        if (!resp) {
            api_stream_free(r->stream);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    } else {
        resp = MHD_create_response_from_buffer(r->body_len, r->body, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
            free(r->body);
            return MHD_NO;
        }
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type);
    if (r->allow)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow);
    if (r->auth_challenge)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ok = MHD_queue_response(con, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static enum MHD_Result http_access(void *cls, struct MHD_Connection *con, const char *url,
                                   const char *method, const char *version,
                                   const char *upload_data, size_t *upload_data_size,
                                   void **con_cls)
{
    (void)version;
    http_server *s = cls;
    http_req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r)
            return MHD_NO;
        *con_cls = r;
        const char *cl =
            MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > http_drain_limit(s)) {
            /* Too large to read and drop: answer now; MHD closes the connection after it. */
            r->too_large = true;
        } else {
            return MHD_YES;
        }
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        r->received += n;
        if (!r->too_large && r->len + n > (uint64_t)s->g->cfg.max_body) {
            r->too_large = true;
            free(r->body);
            r->body = NULL;
            r->len = r->cap = 0;
        }
        if (r->too_large) {
            if (r->received <= http_drain_limit(s))
                return MHD_YES;
        } else {
            if (r->len + n + 1 > r->cap) {
                size_t cap = (r->len + n + 1) * 2;
                if (cap > (size_t)s->g->cfg.max_body + 1)
                    cap = (size_t)s->g->cfg.max_body + 1;
                char *b = realloc(r->body, cap);
                if (!b)
                    return MHD_NO;
                r->body = b;
                r->cap = cap;
            }
            memcpy(r->body + r->len, upload_data, n);
            r->len += n;
            return MHD_YES;
        }
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(con, MHD_CONNECTION_INFO_CONNECTION_FD);
    http_args args = {0};
    MHD_get_connection_values(con, MHD_GET_ARGUMENT_KIND, http_arg, &args);
    if (args.oom) {
        free(args.v);
        return MHD_NO;
    }
    api_call c = {
        .method = method,
        .path = url,
        .args = args.v,
        .n_args = args.n,
        .authorization =
            MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
        .body = r->body ? r->body : "",
        .body_len = r->len,
        .body_too_large = r->too_large,
        .client_fd = ci ? ci->connect_fd : -1,
    };
    api_reply rep;
    api_handle(s->g, &c, &rep);
    free(args.v);
    metrics_request(&s->g->metrics, rep.endpoint, rep.status);
    /* Probes of /health and /metrics are routine; other failures are worth a line. */
    bool probe = rep.endpoint == MET_EP_HEALTH || rep.endpoint == MET_EP_METRICS;
    if (!probe && (rep.status >= 500 || rep.status == 413))
        LOG_INFO("%s %s -> %d", method, url, rep.status);
    else
        LOG_DEBUG("%s %s -> %d", method, url, rep.status);
    return http_send(con, &rep);
}

static void http_completed(void *cls, struct MHD_Connection *con, void **con_cls,
                           enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)con;
    (void)toe;
    http_req *r = *con_cls;
    if (r) {
        free(r->body);
        free(r);
        *con_cls = NULL;
    }
}

static void http_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n > 0 && line[n - 1] == '\n')
        line[--n] = 0;
    /* A client that leaves in the middle of a stream is routine, not a warning. */
    if (strstr(line, "application error generating"))
        LOG_DEBUG("http: %s", line);
    else
        LOG_WARN("http: %s", line);
}

td_err http_start(http_server **out, gw_state *g, const char *host, uint16_t port)
{
    *out = NULL;
    char portstr[8];
    snprintf(portstr, sizeof portstr, "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int rv = getaddrinfo(host, portstr, &hints, &ai);
    if (rv != 0)
        return err_set(TD_EINVAL, "--host %s: %s", host, gai_strerror(rv));
    http_server *s = calloc(1, sizeof *s);
    if (!s) {
        freeaddrinfo(ai);
        return err_set(TD_ENOMEM, "http: out of memory");
    }
    s->g = g;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* The logger first, so MHD reports even option errors through it. */
    s->d = MHD_start_daemon(flags, port, NULL, NULL, http_access, s, MHD_OPTION_EXTERNAL_LOGGER,
                            http_log, NULL, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, http_completed, s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_CONNECTIONS_MAX,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_IDLE_TIMEOUT_S,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        free(s);
        return err_set(TD_EIO, "cannot listen on %s:%u (in use, or not an address of this host)",
                       host, port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : port;
    *out = s;
    return TD_OK;
}

uint16_t http_port(const http_server *s)
{
    return s->port;
}

void http_stop(http_server *s)
{
    if (!s)
        return;
    MHD_stop_daemon(s->d);
    free(s);
}
