/* NNG req/rep helpers: runtime directory, endpoints, a multi-context server, a thread-safe
 * client (see bus.h for the rules every socket follows). */
#include "common/bus.h"

#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

/* Reconnect backoff of a client: quick after a daemon restarts, capped so an absent server
 * costs a few attempts a second. */
#define BUS_RECONNECT_MIN_MS 10
#define BUS_RECONNECT_MAX_MS 250

/* A client with no connection for this long replaces its dialer. NNG 1.5's dialer stops for
 * good when an attempt fails with NNG_ECLOSED, and its ipc transport reports that when the
 * peer closed the new connection before the client wrote its SP header (EPIPE): a daemon
 * killed with the connection in its listen queue, or just after accepting it. A working
 * dialer tries at least every BUS_RECONNECT_MAX_MS, so the bound replaces only a dead one, or
 * one facing an absent server (where a fresh dialer costs a few more attempts). */
#define BUS_REDIAL_AFTER_MS 1000
/* How often a call waiting for a connection checks that bound. */
#define BUS_REDIAL_CHECK_MS 250
/* How long closing a client may take: NNG 1.5's request sockets can hang in nng_close (seen
 * about once in a hundred runs after connections were closed for exceeding a receive limit;
 * NNG's "REQ protocol can hang on close"), and a daemon must not hang with them. */
#define BUS_CLOSE_WAIT_MS 2000
/* A client's connection is dropped by NNG only for a reply over this many times its limit. */
#define BUS_CLIENT_DROP_FACTOR 4

void bus_opts_default(bus_opts *o)
{
    TD_ASSERT(o);
    o->recv_max = BUS_RECV_MAX_DEFAULT;
    o->send_timeout_ms = 5000;
    o->recv_timeout_ms = 5000;
    o->workers = 4;
    o->spin_us = 0;
}

/* An NNG result as a td_err whose message ends with NNG's own text. */
static td_err nng_fail(int rv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static td_err nng_fail(int rv, const char *fmt, ...)
{
    td_err code;
    switch (rv) {
    case NNG_ETIMEDOUT:
        code = TD_ETIMEOUT;
        break;
    case NNG_ECLOSED:
    case NNG_ECONNSHUT:
    case NNG_ECONNRESET:
    case NNG_ECONNABORTED:
        code = TD_ECLOSED;
        break;
    case NNG_ENOMEM:
        code = TD_ENOMEM;
        break;
    case NNG_EMSGSIZE:
        code = TD_ERANGE;
        break;
    case NNG_EADDRINUSE:
    case NNG_EBUSY:
        code = TD_EBUSY;
        break;
    case NNG_EINVAL:
    case NNG_EADDRINVAL:
        code = TD_EINVAL;
        break;
    case NNG_ENOENT:
        code = TD_ENOENT;
        break;
    case NNG_ECANCELED:
        code = TD_ECANCELED;
        break;
    case NNG_ENOTSUP:
        code = TD_ENOTSUP;
        break;
    default:
        code = TD_EIO;
        break;
    }
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return err_set(code, "%s: %s", what, nng_strerror(rv));
}

/* --- runtime directory and endpoints ------------------------------------------------------ */

td_err bus_runtime_dir(char *out, size_t cap)
{
    TD_ASSERT(out && cap > 0);
    const char *env = getenv("TANDEM_RUNTIME_DIR");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    char path[4096];
    int n;
    if (env && env[0])
        n = snprintf(path, sizeof path, "%s", env);
    else if (xdg && xdg[0])
        n = snprintf(path, sizeof path, "%s/tandem", xdg);
    else
        n = snprintf(path, sizeof path, "/tmp/tandem-%u", (unsigned)geteuid());
    if (n < 0 || (size_t)n >= sizeof path)
        return err_set(TD_ERANGE, "runtime directory path is too long");
    while (n > 1 && path[n - 1] == '/')
        path[--n] = '\0';
    if ((size_t)n >= cap)
        return err_set(TD_ERANGE, "runtime directory %s: path longer than %zu bytes", path,
                       cap - 1);

    if (mkdir(path, 0700) == 0) {
        /* mkdir's mode passes through the umask; set the intended mode explicitly. */
        if (chmod(path, 0700) != 0)
            return err_set(TD_EIO, "runtime directory %s: chmod: %s", path, strerror(errno));
    } else if (errno != EEXIST) {
        return err_set(TD_EIO, "cannot create runtime directory %s: %s", path, strerror(errno));
    }
    /* lstat, not stat: a symbolic link planted in a shared /tmp could point anywhere. */
    struct stat st;
    if (lstat(path, &st) != 0)
        return err_set(TD_EIO, "runtime directory %s: %s", path, strerror(errno));
    if (S_ISLNK(st.st_mode))
        return err_set(TD_EINVAL,
                       "runtime directory %s is a symbolic link; refusing it (point "
                       "TANDEM_RUNTIME_DIR at a real directory)",
                       path);
    if (!S_ISDIR(st.st_mode))
        return err_set(TD_EINVAL, "runtime directory %s exists and is not a directory", path);
    if (st.st_uid != geteuid())
        return err_set(TD_EINVAL,
                       "runtime directory %s is owned by uid %u, not by this user (uid %u); "
                       "refusing it (set TANDEM_RUNTIME_DIR to a directory of your own)",
                       path, (unsigned)st.st_uid, (unsigned)geteuid());
    if (st.st_mode & 077)
        return err_set(TD_EINVAL,
                       "runtime directory %s has mode %04o, open to other users; it must be "
                       "private (chmod 700 %s)",
                       path, (unsigned)(st.st_mode & 07777), path);
    memcpy(out, path, (size_t)n + 1);
    return TD_OK;
}

td_err bus_endpoint(char *url, size_t cap, const char *service)
{
    TD_ASSERT(url && service);
    size_t len = strlen(service);
    if (len == 0 || len > 32)
        return err_set(TD_EINVAL, "service name \"%s\": must be 1..32 characters", service);
    for (size_t i = 0; i < len; i++) {
        char ch = service[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
            return err_set(TD_EINVAL, "service name \"%s\": only a-z, 0-9, _ and - are allowed",
                           service);
    }
    char dir[4096];
    TD_TRY(bus_runtime_dir(dir, sizeof dir));
    struct sockaddr_un sun;
    size_t path_len = strlen(dir) + 1 + len + 4;
    if (path_len >= sizeof sun.sun_path)
        return err_set(TD_ERANGE,
                       "socket path %s/%s.ipc is %zu bytes, AF_UNIX allows %zu: set "
                       "TANDEM_RUNTIME_DIR to a shorter directory",
                       dir, service, path_len, sizeof sun.sun_path - 1);
    int n = snprintf(url, cap, "ipc://%s/%s.ipc", dir, service);
    if (n < 0 || (size_t)n >= cap)
        return err_set(TD_ERANGE, "endpoint URL for %s does not fit %zu bytes", service, cap);
    return TD_OK;
}

/* Options every socket gets, before any dialer or listener exists (pipes copy them). */
static td_err socket_configure(nng_socket sock, const bus_opts *o, size_t nng_max,
                               const char *url)
{
    int rv;
    if ((rv = nng_socket_set_size(sock, NNG_OPT_RECVMAXSZ, nng_max)) != 0 ||
        (rv = nng_socket_set_ms(sock, NNG_OPT_SENDTIMEO, o->send_timeout_ms)) != 0 ||
        (rv = nng_socket_set_ms(sock, NNG_OPT_RECVTIMEO, o->recv_timeout_ms)) != 0)
        return nng_fail(rv, "%s: setting socket options", url);
    return TD_OK;
}

static void opts_resolve(bus_opts *dst, const bus_opts *src)
{
    if (src)
        *dst = *src;
    else
        bus_opts_default(dst);
    if (dst->recv_max == 0)
        dst->recv_max = BUS_RECV_MAX_DEFAULT;
    TD_ASSERT(dst->send_timeout_ms > 0 && dst->recv_timeout_ms > 0 && dst->workers > 0);
}

/* --- server ------------------------------------------------------------------------------- */

typedef struct bus_worker {
    struct bus_server *server;
    nng_ctx ctx;
    nng_aio *aio;
    msg_buf reply; /* reused for every reply this worker sends */
    pthread_t thread;
    bool started;
    int exited; /* atomic: worker_main returned */
} bus_worker;

struct bus_server {
    nng_socket sock;
    int stopping; /* atomic: bus_server_free has begun */
    bus_opts opts;
    bus_handler handler;
    void *user;
    bus_worker *workers; /* [opts.workers] */
    char url[BUS_URL_MAX];
};

/* Turns a failed handler's error into the MSG_ERROR reply. */
static td_err reply_with_error(bus_worker *w, td_err code, const uint8_t *req, size_t len)
{
    msg_error m = {.code = code};
    snprintf(m.message, sizeof m.message, "%s", err_msg());
    msg_header h;
    uint64_t request_id = msg_unpack_header(req, len, &h) == TD_OK ? h.request_id : 0;
    return msg_pack_error(&w->reply, request_id, &m);
}

/* Runs the handler on one request and sends the reply; owns req. */
static void worker_serve(bus_worker *w, nng_msg *req)
{
    bus_server *s = w->server;
    const uint8_t *body = nng_msg_body(req);
    size_t len = nng_msg_len(req);
    w->reply.len = 0;
    err_clear();
    td_err e = s->handler(s->user, body, len, &w->reply);
    if (e != TD_OK) {
        LOG_DEBUG("%s: request failed: %s: %s", s->url, err_name(e), err_msg());
        if ((e = reply_with_error(w, e, body, len)) != TD_OK) {
            LOG_ERROR("%s: cannot build the error reply: %s", s->url, err_msg());
            nng_msg_free(req);
            return;
        }
    }
    /* The request message becomes the reply: the context keeps the routing header apart. */
    nng_msg_clear(req);
    int rv = nng_msg_append(req, w->reply.data, w->reply.len);
    if (rv != 0) {
        LOG_ERROR("%s: reply of %zu bytes: %s", s->url, w->reply.len, nng_strerror(rv));
        nng_msg_free(req);
        return;
    }
    nng_aio_set_msg(w->aio, req);
    nng_aio_set_timeout(w->aio, s->opts.send_timeout_ms);
    nng_ctx_send(w->ctx, w->aio);
    nng_aio_wait(w->aio);
    if ((rv = nng_aio_result(w->aio)) != 0) {
        /* The client went away or stopped reading: its call fails on its side. */
        LOG_DEBUG("%s: reply not sent: %s", s->url, nng_strerror(rv));
        nng_msg_free(nng_aio_get_msg(w->aio));
    }
}

static void *worker_main(void *arg)
{
    bus_worker *w = arg;
    bus_server *s = w->server;
    while (!__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) {
        /* No NNG timer on the receive: bus_server_free wakes the worker by cancelling it.
         * An aio that NNG 1.5's expiry thread still held while bus_server_free freed it
         * aborted the process ("panic: pthread_mutex_lock: Invalid argument", seen about once
         * in 50 runs of test_gateway_http under load). */
        nng_aio_set_timeout(w->aio, NNG_DURATION_INFINITE);
        nng_ctx_recv(w->ctx, w->aio);
        nng_aio_wait(w->aio);
        int rv = nng_aio_result(w->aio);
        if (rv == NNG_ECANCELED)
            continue; /* bus_server_free woke us */
        if (rv == NNG_ECLOSED)
            break; /* the socket is gone: nothing more will arrive */
        if (rv != 0) {
            LOG_WARN("%s: receive failed: %s", s->url, nng_strerror(rv));
            continue;
        }
        worker_serve(w, nng_aio_get_msg(w->aio));
    }
    __atomic_store_n(&w->exited, 1, __ATOMIC_RELEASE);
    return NULL;
}

td_err bus_server_init(bus_server **out, const char *url, const bus_opts *opts,
                       bus_handler handler, void *user)
{
    TD_ASSERT(out && url && handler);
    *out = NULL;
    bus_server *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(TD_ENOMEM, "bus server: out of memory");
    opts_resolve(&s->opts, opts);
    s->handler = handler;
    s->user = user;
    if (strlen(url) >= sizeof s->url) {
        free(s);
        return err_set(TD_ERANGE, "endpoint URL %s is longer than %d bytes", url, BUS_URL_MAX - 1);
    }
    strcpy(s->url, url);
    s->workers = calloc((size_t)s->opts.workers, sizeof *s->workers);
    int rv;
    if (!s->workers) {
        free(s);
        return err_set(TD_ENOMEM, "bus server: out of memory");
    }
    if ((rv = nng_rep0_open(&s->sock)) != 0) {
        free(s->workers);
        free(s);
        return nng_fail(rv, "%s: opening a reply socket", url);
    }
    td_err e = socket_configure(s->sock, &s->opts, s->opts.recv_max, url);
    for (int i = 0; e == TD_OK && i < s->opts.workers; i++) {
        bus_worker *w = &s->workers[i];
        w->server = s;
        msg_buf_init(&w->reply);
        if ((rv = nng_ctx_open(&w->ctx, s->sock)) != 0 ||
            (rv = nng_aio_alloc(&w->aio, NULL, NULL)) != 0)
            e = nng_fail(rv, "%s: creating worker %d", url, i);
    }
    nng_listener l;
    if (e == TD_OK && (rv = nng_listener_create(&l, s->sock, url)) != 0)
        e = nng_fail(rv, "cannot listen on %s", url);
    if (e == TD_OK && strncmp(url, "ipc://", 6) == 0 &&
        (rv = nng_listener_set_int(l, NNG_OPT_IPC_PERMISSIONS, 0600)) != 0)
        e = nng_fail(rv, "%s: setting socket file permissions", url);
    if (e == TD_OK && (rv = nng_listener_start(l, 0)) != 0)
        e = nng_fail(rv, "cannot listen on %s", url);
    for (int i = 0; e == TD_OK && i < s->opts.workers; i++) {
        bus_worker *w = &s->workers[i];
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0)
            e = err_set(TD_EIO, "%s: cannot start worker thread %d", url, i);
        else
            w->started = true;
    }
    if (e != TD_OK) {
        bus_server_free(s);
        return e;
    }
    LOG_DEBUG("%s: serving with %d workers", url, s->opts.workers);
    *out = s;
    return TD_OK;
}

void bus_server_free(bus_server *s)
{
    if (!s)
        return;
    /* The workers stop before the socket closes: NNG 1.5 can crash when a context operation
     * starts on one thread while nng_close tears the socket down on another. A worker is
     * woken from its receive by cancelling it, again until it has seen the flag (it may have
     * been about to start a new receive); one inside its handler finishes it first (a reply
     * being sent at that moment may be cut off: its client sees the connection close). */
    __atomic_store_n(&s->stopping, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < s->opts.workers; i++) {
        bus_worker *w = &s->workers[i];
        if (!w->started)
            continue;
        while (!__atomic_load_n(&w->exited, __ATOMIC_ACQUIRE)) {
            nng_aio_cancel(w->aio);
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        pthread_join(w->thread, NULL);
    }
    /* Each aio stopped (off NNG's expiry lists, its last completion over) before the socket
     * closes and before it is freed. */
    for (int i = 0; i < s->opts.workers; i++)
        if (s->workers[i].aio)
            nng_aio_stop(s->workers[i].aio);
    nng_close(s->sock);
    for (int i = 0; i < s->opts.workers; i++) {
        bus_worker *w = &s->workers[i];
        if (w->aio)
            nng_aio_free(w->aio);
        msg_buf_free(&w->reply);
    }
    free(s->workers);
    free(s);
}

/* --- client ------------------------------------------------------------------------------- */

struct bus_client {
    nng_socket sock;
    bus_opts opts;
    pthread_mutex_t lock;   /* guards n_pipes and no_pipe_since; taken by pipe callbacks */
    int n_pipes;            /* open connections (a dialer has at most one) */
    nng_time no_pipe_since; /* ms, nng_clock: n_pipes last became 0, or the dialer started */
    pthread_mutex_t dial_lock; /* guards dialer; held across nng_dialer_close, which may wait
                                * for pipe callbacks, so those never take it */
    nng_dialer dialer;
    char url[BUS_URL_MAX];
};

/* Connection events, on an NNG thread: counted so a timeout can say whether a server was
 * there at all, and so a dialer that gave up is noticed (client_redial_if_stale). */
static void client_pipe_event(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)p;
    bus_client *c = arg;
    pthread_mutex_lock(&c->lock);
    if (ev == NNG_PIPE_EV_ADD_POST)
        c->n_pipes++;
    else if (ev == NNG_PIPE_EV_REM_POST && c->n_pipes > 0 && --c->n_pipes == 0)
        c->no_pipe_since = nng_clock();
    pthread_mutex_unlock(&c->lock);
}

/* Replaces the dialer when the client has had no connection for BUS_REDIAL_AFTER_MS (see
 * there why). A failure only logs: the next check tries again. */
static void client_redial_if_stale(bus_client *c)
{
    pthread_mutex_lock(&c->dial_lock);
    pthread_mutex_lock(&c->lock);
    nng_time now = nng_clock();
    bool stale = c->n_pipes == 0 && now - c->no_pipe_since >= BUS_REDIAL_AFTER_MS;
    if (stale)
        c->no_pipe_since = now;
    pthread_mutex_unlock(&c->lock);
    if (stale) {
        LOG_DEBUG("%s: no connection for %d ms: dialing afresh", c->url, BUS_REDIAL_AFTER_MS);
        nng_dialer_close(c->dialer);
        nng_dialer d;
        int rv = nng_dial(c->sock, c->url, &d, NNG_FLAG_NONBLOCK);
        if (rv == 0)
            c->dialer = d;
        else
            LOG_WARN("%s: cannot dial again: %s", c->url, nng_strerror(rv));
    }
    pthread_mutex_unlock(&c->dial_lock);
}

/* The size above which NNG itself drops a client's connection: BUS_CLIENT_DROP_FACTOR times
 * recv_max. A reply between the two is received whole and refused by bus_client_call, and
 * the connection stays: NNG 1.5's ipc transport, closing a pipe from its receive path for a
 * message over the limit, was seen to leave the socket's later nng_close waiting forever
 * (a few runs in a hundred of test_bus under load). */
static size_t client_drop_size(size_t recv_max)
{
    return recv_max > SIZE_MAX / BUS_CLIENT_DROP_FACTOR ? SIZE_MAX
                                                        : recv_max * BUS_CLIENT_DROP_FACTOR;
}

td_err bus_client_init(bus_client **out, const char *url, const bus_opts *opts)
{
    TD_ASSERT(out && url);
    *out = NULL;
    if (strlen(url) >= BUS_URL_MAX)
        return err_set(TD_ERANGE, "endpoint URL %s is longer than %d bytes", url, BUS_URL_MAX - 1);
    bus_client *c = calloc(1, sizeof *c);
    if (!c)
        return err_set(TD_ENOMEM, "bus client: out of memory");
    opts_resolve(&c->opts, opts);
    strcpy(c->url, url);
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->dial_lock, NULL);
    c->no_pipe_since = nng_clock();
    int rv;
    if ((rv = nng_req0_open(&c->sock)) != 0) {
        pthread_mutex_destroy(&c->dial_lock);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return nng_fail(rv, "%s: opening a request socket", url);
    }
    td_err e = socket_configure(c->sock, &c->opts, client_drop_size(c->opts.recv_max), url);
    if (e == TD_OK &&
        ((rv = nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
         (rv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, BUS_RECONNECT_MIN_MS)) != 0 ||
         (rv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, BUS_RECONNECT_MAX_MS)) != 0 ||
         (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_ADD_POST, client_pipe_event, c)) != 0 ||
         (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST, client_pipe_event, c)) != 0))
        e = nng_fail(rv, "%s: setting socket options", url);
    /* Non-blocking: the first attempt runs in the background and retries until a server
     * appears, so daemons can start in any order. */
    if (e == TD_OK && (rv = nng_dial(c->sock, url, &c->dialer, NNG_FLAG_NONBLOCK)) != 0)
        e = nng_fail(rv, "cannot connect to %s", url);
    if (e != TD_OK) {
        nng_close(c->sock);
        pthread_mutex_destroy(&c->dial_lock);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return e;
    }
    *out = c;
    return TD_OK;
}

/* The error of a call that did not get its reply. */
static td_err call_fail(bus_client *c, int rv, int32_t timeout_ms)
{
    pthread_mutex_lock(&c->lock);
    int n_pipes = c->n_pipes;
    pthread_mutex_unlock(&c->lock);
    /* With resends off, NNG ends a call whose connection closes with ECONNRESET. */
    if (rv == NNG_ECONNRESET || rv == NNG_ECONNSHUT || rv == NNG_ECONNABORTED)
        return err_set(TD_ECLOSED,
                       "%s: connection lost during the call (the server went away, or a "
                       "message exceeded a receive limit; this client drops replies over %zu "
                       "bytes): %s",
                       c->url, client_drop_size(c->opts.recv_max), nng_strerror(rv));
    if (rv == NNG_ETIMEDOUT && n_pipes == 0)
        return nng_fail(rv, "%s: no server reachable within %d ms", c->url, timeout_ms);
    if (rv == NNG_ETIMEDOUT)
        return nng_fail(rv, "%s: no reply within %d ms", c->url, timeout_ms);
    return nng_fail(rv, "%s: call failed", c->url);
}

/* The completion of a call's aio, signalled to the caller waiting for it. */
typedef struct call_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC */
    bool done;
    int ready; /* done, for a caller polling without the lock (atomic) */
} call_wait;

static void call_done(void *arg)
{
    call_wait *w = arg;
    pthread_mutex_lock(&w->mu);
    w->done = true;
    __atomic_store_n(&w->ready, 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Polls w for at most spin_us: true once the operation is done. */
static bool call_spin(call_wait *w, int32_t spin_us)
{
    if (spin_us <= 0)
        return false;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int64_t limit_ns = (int64_t)spin_us * 1000;
    for (;;) {
        for (int i = 0; i < 64; i++)
            if (__atomic_load_n(&w->ready, __ATOMIC_ACQUIRE))
                return true;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((int64_t)(t.tv_sec - t0.tv_sec) * 1000000000 + (t.tv_nsec - t0.tv_nsec) > limit_ns)
            return false;
    }
}

/* Grace after a call's deadline before it is cancelled by hand. */
#define BUS_CALL_GRACE_MS 200

/* Waits for the aio's operation, at most until deadline (+ grace): then it is cancelled
 * explicitly, because NNG 1.5's timer can miss an expiry (a call was seen waiting forever
 * on a send after its server was killed). With redial set (a send, which waits for a
 * connection), checks every BUS_REDIAL_CHECK_MS that the client's dialer has not given up.
 * Returns the operation's result, NNG_ETIMEDOUT when it had to be cancelled. */
static int call_wait_aio(call_wait *w, nng_aio *aio, nng_time deadline, bus_client *redial,
                         int32_t spin_us)
{
    bool cancelled = false;
    call_spin(w, spin_us); /* then the lock finds done set, or sleeps as without it */
    pthread_mutex_lock(&w->mu);
    while (!w->done) {
        nng_time now = nng_clock(), until = deadline + BUS_CALL_GRACE_MS;
        if (now >= until) {
            pthread_mutex_unlock(&w->mu);
            nng_aio_cancel(aio);
            nng_aio_wait(aio);
            pthread_mutex_lock(&w->mu);
            cancelled = true;
            break;
        }
        if (redial && until > now + BUS_REDIAL_CHECK_MS)
            until = now + BUS_REDIAL_CHECK_MS;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)(until - now) * 1000000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        if (redial && !w->done) {
            pthread_mutex_unlock(&w->mu);
            client_redial_if_stale(redial);
            pthread_mutex_lock(&w->mu);
        }
    }
    w->done = false;
    __atomic_store_n(&w->ready, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&w->mu);
    nng_aio_wait(aio); /* the callback has returned */
    int rv = nng_aio_result(aio);
    return cancelled && rv == NNG_ECANCELED ? NNG_ETIMEDOUT : rv;
}

td_err bus_client_call(bus_client *c, const void *req, size_t req_len, msg_buf *reply,
                       int32_t timeout_ms)
{
    TD_ASSERT(c && (req || req_len == 0) && reply && timeout_ms > 0);
    nng_ctx ctx;
    nng_aio *aio = NULL;
    nng_msg *m = NULL;
    call_wait w = {.done = false};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&w.mu, NULL);
    int rv;
    td_err e = TD_OK;
    client_redial_if_stale(c);
    if ((rv = nng_ctx_open(&ctx, c->sock)) != 0) {
        e = nng_fail(rv, "%s: opening a request context", c->url);
        goto done;
    }
    if ((rv = nng_aio_alloc(&aio, call_done, &w)) != 0 || (rv = nng_msg_alloc(&m, req_len)) != 0) {
        if (aio)
            nng_aio_free(aio);
        aio = NULL;
        nng_ctx_close(ctx);
        e = nng_fail(rv, "%s: request of %zu bytes", c->url, req_len);
        goto done;
    }
    if (req_len)
        memcpy(nng_msg_body(m), req, req_len);

    nng_time deadline = nng_clock() + (nng_time)timeout_ms;
    nng_aio_set_msg(aio, m);
    nng_aio_set_timeout(aio, timeout_ms);
    nng_ctx_send(ctx, aio);
    if ((rv = call_wait_aio(&w, aio, deadline, c, c->opts.spin_us)) != 0) {
        nng_msg_free(nng_aio_get_msg(aio)); /* a failed send hands the message back */
        e = call_fail(c, rv, timeout_ms);
        goto out;
    }
    /* The send completes once the request has a connection; the rest of the time is the
     * reply's. */
    nng_time now = nng_clock();
    nng_aio_set_timeout(aio, now < deadline ? (nng_duration)(deadline - now) : 1);
    nng_ctx_recv(ctx, aio);
    if ((rv = call_wait_aio(&w, aio, deadline, NULL, c->opts.spin_us)) != 0) {
        e = call_fail(c, rv, timeout_ms);
        goto out;
    }
    nng_msg *r = nng_aio_get_msg(aio);
    if (nng_msg_len(r) > c->opts.recv_max)
        e = err_set(TD_ERANGE, "%s: the reply of %zu bytes is over this client's receive limit "
                               "of %zu bytes",
                    c->url, nng_msg_len(r), c->opts.recv_max);
    else
        e = msg_buf_assign(reply, nng_msg_body(r), nng_msg_len(r));
    nng_msg_free(r);

out:
    nng_ctx_close(ctx);
    nng_aio_free(aio);
done:
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return e;
}

static void *client_close_main(void *arg)
{
    bus_client *c = arg;
    nng_close(c->sock);
    return NULL;
}

void bus_client_free(bus_client *c)
{
    if (!c)
        return;
    /* nng_close returns after the pipes' notifications ran: none can touch c afterwards. It
     * runs on a thread of its own for at most BUS_CLOSE_WAIT_MS; a close that does not come
     * back leaves its socket and c behind (a leak, where it would have been a hang). */
    pthread_t t;
    if (pthread_create(&t, NULL, client_close_main, c) != 0) {
        nng_close(c->sock);
    } else {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        const long long ns = until.tv_nsec + (long long)BUS_CLOSE_WAIT_MS * 1000000;
        until.tv_sec += (time_t)(ns / 1000000000);
        until.tv_nsec = (long)(ns % 1000000000);
        if (pthread_timedjoin_np(t, NULL, &until) != 0) {
            LOG_WARN("%s: closing the connection did not finish within %d ms: left behind",
                     c->url, BUS_CLOSE_WAIT_MS);
            pthread_detach(t);
            return;
        }
    }
    pthread_mutex_destroy(&c->dial_lock);
    pthread_mutex_destroy(&c->lock);
    free(c);
}
