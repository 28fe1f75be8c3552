/* Background responses (background.h): a table of jobs under one lock. A job's worker thread
 * runs the request with gen_run and, after every step, moves the events it rendered into the
 * job's log and, when the status moved, renders the response object anew; readers copy from
 * the log at their own offsets. A job is freed when the table, its worker and its readers have
 * all let it go. */
#include "gateway/background.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "gateway/gen_int.h"
#include "gateway/respstore.h"

#define BG_WAIT_MS 100     /* a reader's longest wait before it checks its client */
#define BG_CANCEL_WAIT_S 30 /* how long a cancel waits for the job to end */

struct bg_job {
    bg_table *t;
    char id[48];
    api_stream *s;     /* the worker's request; NULL once it ended */
    int refs;          /* the table's list, the worker, each reader */
    bool listed;       /* found by id */
    bool cancel;       /* asked to stop (the worker reads it atomically) */
    bool deleted;      /* DELETE came: the kept response is forgotten as it ends */
    bool done;         /* the request ended: log and object are final */
    int stage;         /* of the object rendered: 0 queued, 1 in progress, 2 ended */
    char status[16];   /* its status */
    uint64_t ended;    /* order of ending: the oldest ended jobs' events go first */
    tbuf log;          /* every event so far, as sent */
    char *object;      /* the response object as it stands (JSON), NULL when out of memory */
    bg_job *next;      /* in the table's list */
};

struct bg_table {
    gw_state *g;
    pthread_mutex_t mu;
    pthread_cond_t changed; /* a job's log, object or end moved, or a worker left */
    bg_job *jobs;           /* listed, newest first */
    size_t max_running, running, listed;
    size_t max_bytes;       /* of the ended jobs' events kept */
    uint64_t n_ended;
};

td_err bg_init(bg_table **out, gw_state *g, size_t max_running, size_t max_bytes)
{
    TD_ASSERT(max_running >= 1 && max_bytes >= 1);
    bg_table *t = calloc(1, sizeof *t);
    if (!t)
        return err_set(TD_ENOMEM, "background responses: out of memory");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_mutex_init(&t->mu, NULL) != 0 || pthread_cond_init(&t->changed, &ca) != 0) {
        pthread_condattr_destroy(&ca);
        free(t);
        return err_set(TD_EIO, "background responses: cannot make a lock");
    }
    pthread_condattr_destroy(&ca);
    t->g = g;
    t->max_running = max_running;
    t->max_bytes = max_bytes;
    *out = t;
    return TD_OK;
}

static void bg_job_free(bg_job *j)
{
    free(j->log.p);
    free(j->object);
    free(j);
}

/* Lets go of one reference (under the lock). */
static void bg_unref(bg_job *j)
{
    if (--j->refs == 0)
        bg_job_free(j);
}

/* Takes j out of the list (under the lock). */
static void bg_unlist(bg_table *t, bg_job *j)
{
    if (!j->listed)
        return;
    for (bg_job **p = &t->jobs; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            break;
        }
    j->listed = false;
    t->listed--;
    bg_unref(j);
}

/* The listed job with id, or NULL (under the lock). */
static bg_job *bg_find(bg_table *t, const char *id)
{
    for (bg_job *j = t->jobs; j; j = j->next)
        if (strcmp(j->id, id) == 0)
            return j;
    return NULL;
}

/* Drops the oldest ended jobs while more than max_running have ended or their events pass
 * max_bytes (under the lock). */
static void bg_trim(bg_table *t)
{
    for (;;) {
        size_t n = 0, bytes = 0;
        bg_job *oldest = NULL;
        for (bg_job *j = t->jobs; j; j = j->next)
            if (j->done) {
                n++;
                bytes += j->log.len;
                if (!oldest || j->ended < oldest->ended)
                    oldest = j;
            }
        if (n <= t->max_running && bytes <= t->max_bytes)
            return;
        bg_unlist(t, oldest);
    }
}

void bg_drain(bg_table *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    while (t->running > 0)
        pthread_cond_wait(&t->changed, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

void bg_free(bg_table *t)
{
    if (!t)
        return;
    while (t->jobs)
        bg_unlist(t, t->jobs);
    pthread_cond_destroy(&t->changed);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

bool bg_cancel_asked(const bg_job *job)
{
    return __atomic_load_n(&job->cancel, __ATOMIC_SEQ_CST);
}

static void bg_ask_stop(bg_job *j)
{
    __atomic_store_n(&j->cancel, true, __ATOMIC_SEQ_CST);
}

/* After each step of the worker's request: its new events into the log and, when its status
 * moved, its object rendered anew. */
static void bg_after(api_stream *s, void *arg)
{
    bg_job *j = arg;
    bg_table *t = j->t;
    const int stage = s->done ? 2 : s->rs.started ? 1 : 0;
    char *object = NULL;
    const char *status = NULL;
    bool render = stage != j->stage; /* only the worker writes stage */
    if (render) {
        json_t *o = s->done ? resp_ended(s) : resp_now(s);
        const json_t *st = o ? json_object_get(o, "status") : NULL;
        status = json_is_string(st) ? json_string_value(st) : "failed";
        object = o ? render_dump(o) : NULL;
        if (!object)
            LOG_WARN("background response %s: out of memory rendering it", j->id);
        pthread_mutex_lock(&t->mu);
        snprintf(j->status, sizeof j->status, "%s", status);
        json_decref(o);
    } else {
        pthread_mutex_lock(&t->mu);
    }
    if (s->sse.len > s->sse_off && !tbuf_put(&j->log, s->sse.p + s->sse_off,
                                             s->sse.len - s->sse_off))
        LOG_WARN("background response %s: out of memory keeping its events", j->id);
    s->sse.len = s->sse_off = 0;
    if (render) {
        free(j->object);
        j->object = object;
        j->stage = stage;
    }
    pthread_cond_broadcast(&t->changed);
    pthread_mutex_unlock(&t->mu);
}

static void *bg_worker(void *arg)
{
    bg_job *j = arg;
    bg_table *t = j->t;
    api_stream *s = j->s;
    gen_run(s, bg_after, j);
    pthread_mutex_lock(&t->mu);
    const bool deleted = j->deleted;
    j->done = true;
    j->ended = ++t->n_ended;
    pthread_cond_broadcast(&t->changed);
    pthread_mutex_unlock(&t->mu);
    if (deleted && t->g->responses)
        rstore_delete(t->g->responses, j->id);
    api_stream_free(s);
    pthread_mutex_lock(&t->mu);
    j->s = NULL;
    t->running--;
    bg_trim(t);
    bg_unref(j);
    pthread_cond_broadcast(&t->changed);
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* A reader of j's events after `after` (under the lock; NULL when out of memory). */
static api_stream *bg_reader(bg_job *j, int64_t after, int client_fd)
{
    api_stream *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->g = j->t->g;
    f->client_fd = client_fd;
    f->follow = j;
    f->follow_skip = after < 0 ? 0 : (uint64_t)after + 1; /* after is -1 or >= 0 */
    j->refs++;
    return f;
}

static void bg_stream_reply(api_reply *r, api_stream *f)
{
    r->status = 200;
    r->content_type = "text/event-stream";
    r->stream = f;
}

static void bg_object_reply(api_reply *r, char *body)
{
    api_error e;
    if (!body) {
        apierr_set(&e, 500, "internal_error", NULL, "the gateway ran out of memory");
        gen_reply_error(r, &e);
        return;
    }
    r->status = 200;
    r->content_type = "application/json";
    r->body = body;
    r->body_len = strlen(body);
}

void bg_start(api_stream *s, api_reply *r)
{
    bg_table *t = s->g->background;
    api_error e;
    if (!t) {
        apierr_set(&e, 400, "unsupported_parameter", "background",
                   "Unsupported parameter: 'background': this gateway runs no background "
                   "responses (--responses-background 0).");
        goto fail;
    }
    bg_job *j = calloc(1, sizeof *j);
    if (!j) {
        apierr_set(&e, 500, "internal_error", NULL, "the gateway ran out of memory");
        goto fail;
    }
    j->t = t;
    j->s = s;
    snprintf(j->id, sizeof j->id, "%s", s->id);
    snprintf(j->status, sizeof j->status, "queued");
    s->job = j;
    s->stream = true; /* the events are kept for readers, whether or not one asked now */
    s->sent_role = true;
    resp_queued(s);
    json_t *o = resp_now(s);
    j->object = o ? render_dump(o) : NULL;
    json_decref(o);
    if (!tbuf_put(&j->log, s->sse.p, s->sse.len) || !j->object) {
        bg_job_free(j);
        s->job = NULL;
        apierr_set(&e, 500, "internal_error", NULL, "the gateway ran out of memory");
        goto fail;
    }
    s->sse.len = 0;
    const bool stream = s->req.stream;
    const int client_fd = s->client_fd;
    s->client_fd = -1; /* the job outlives the request's connection */
    char *body = stream ? NULL : strdup(j->object);
    pthread_mutex_lock(&t->mu);
    if (t->running >= t->max_running) {
        pthread_mutex_unlock(&t->mu);
        free(body);
        bg_job_free(j);
        s->job = NULL;
        char n[32];
        snprintf(n, sizeof n, "%zu", t->max_running);
        apierr_set(&e, 429, "too_many_background_responses", "background",
                   "%s background responses are running already, as many as this gateway "
                   "runs at once (--responses-background); try again later.", n);
        goto fail;
    }
    /* the worker waits for this lock before it touches the table */
    pthread_attr_t attr;
    pthread_t th;
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&th, &attr, bg_worker, j);
        pthread_attr_destroy(&attr);
    }
    if (rc != 0) {
        pthread_mutex_unlock(&t->mu);
        free(body);
        bg_job_free(j);
        s->job = NULL;
        apierr_set(&e, 503, "server_busy", NULL,
                   "The gateway cannot start a thread for a background response: %s.",
                   strerror(rc));
        goto fail;
    }
    api_stream *f = stream ? bg_reader(j, -1, client_fd) : NULL;
    j->refs += 2; /* the list and the worker */
    j->listed = true;
    j->next = t->jobs;
    t->jobs = j;
    t->listed++;
    t->running++;
    pthread_mutex_unlock(&t->mu);
    /* s belongs to the worker now */
    if (stream && !f) {
        apierr_set(&e, 500, "internal_error", NULL, "the gateway ran out of memory");
        gen_reply_error(r, &e);
        return;
    }
    if (stream)
        bg_stream_reply(r, f);
    else
        bg_object_reply(r, body);
    return;
fail:
    gen_reply_error(r, &e);
    api_stream_free(s);
}

bool bg_get(bg_table *t, const char *id, bool stream, int64_t after, int client_fd,
            api_reply *r)
{
    pthread_mutex_lock(&t->mu);
    bg_job *j = bg_find(t, id);
    if (!j) {
        pthread_mutex_unlock(&t->mu);
        return false;
    }
    api_stream *f = stream ? bg_reader(j, after, client_fd) : NULL;
    char *body = !stream && j->object ? strdup(j->object) : NULL;
    pthread_mutex_unlock(&t->mu);
    if (stream && f)
        bg_stream_reply(r, f);
    else if (stream)
        bg_object_reply(r, NULL);
    else
        bg_object_reply(r, body);
    return true;
}

bool bg_cancel(bg_table *t, const char *id, api_reply *r)
{
    pthread_mutex_lock(&t->mu);
    bg_job *j = bg_find(t, id);
    if (!j) {
        pthread_mutex_unlock(&t->mu);
        return false;
    }
    j->refs++;
    const bool was_done = j->done;
    if (!was_done)
        bg_ask_stop(j);
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += BG_CANCEL_WAIT_S;
    while (!j->done && pthread_cond_timedwait(&t->changed, &t->mu, &until) != ETIMEDOUT) {
    }
    char status[sizeof j->status];
    memcpy(status, j->status, sizeof status);
    const bool done = j->done;
    char *body = j->object ? strdup(j->object) : NULL;
    bg_unref(j);
    pthread_mutex_unlock(&t->mu);
    if (done && strcmp(status, "cancelled") != 0) {
        free(body);
        bg_cannot_cancel(r, status);
        return true;
    }
    bg_object_reply(r, body);
    return true;
}

void bg_cannot_cancel(api_reply *r, const char *status)
{
    api_error e;
    apierr_set(&e, 400, "invalid_request", NULL,
               "Cannot cancel a response that has ended (its status is '%s').", status);
    gen_reply_error(r, &e);
}

bool bg_delete(bg_table *t, const char *id)
{
    pthread_mutex_lock(&t->mu);
    bg_job *j = bg_find(t, id);
    if (j) {
        j->deleted = true;
        bg_ask_stop(j);
        bg_unlist(t, j);
    }
    pthread_mutex_unlock(&t->mu);
    return j != NULL;
}

void bg_usage(bg_table *t, size_t *running, size_t *listed)
{
    pthread_mutex_lock(&t->mu);
    *running = t->running;
    *listed = t->listed;
    pthread_mutex_unlock(&t->mu);
}

ssize_t bg_read(api_stream *s, char *buf, size_t cap)
{
    bg_job *j = s->follow;
    bg_table *t = j->t;
    ssize_t got = -1;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (s->follow_skip > 0 && s->follow_off < j->log.len) {
            const char *at = j->log.p + s->follow_off;
            const char *end = memmem(at, j->log.len - s->follow_off, "\n\n", 2);
            if (!end)
                break;
            s->follow_off += (size_t)(end + 2 - at);
            s->follow_skip--;
        }
        if (s->follow_skip == 0 && s->follow_off < j->log.len) {
            size_t n = j->log.len - s->follow_off;
            if (n > cap)
                n = cap;
            memcpy(buf, j->log.p + s->follow_off, n);
            s->follow_off += n;
            got = (ssize_t)n;
            break;
        }
        if (j->done) {
            got = 0; /* every event was read (or there were fewer than starting_after) */
            break;
        }
        if (gen_client_gone(s->client_fd) || __atomic_load_n(&t->g->stopping, __ATOMIC_SEQ_CST))
            break;
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += BG_WAIT_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&t->changed, &t->mu, &until);
    }
    pthread_mutex_unlock(&t->mu);
    return got;
}

void bg_unfollow(api_stream *s)
{
    bg_table *t = s->follow->t;
    pthread_mutex_lock(&t->mu);
    bg_unref(s->follow);
    pthread_mutex_unlock(&t->mu);
    s->follow = NULL;
}
