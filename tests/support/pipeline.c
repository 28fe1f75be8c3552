/* The pipeline test harness (see pipeline.h). */
#include "tests/support/pipeline.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/kvclient.h"
#include "kernels/ops.h"
#include "tests/support/tmp_dir.h"

static const char *const pl_names[PL_SVC_N] = {"kvd", "verifyd", "draftd"};

td_err pl_call_raw(pipeline *p, const char *service, const void *req, size_t len, msg_buf *reply,
                   int timeout_ms);

int pl_setup(pipeline *p)
{
    memset(p, 0, sizeof *p);
    const char *build = getenv("TANDEM_BUILD_DIR");
    snprintf(p->build, sizeof p->build, "%s", build ? build : "build");
    for (int i = 0; i < PL_SVC_N; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", p->build, pl_names[i]);
        if (access(path, X_OK) != 0) {
            fprintf(stderr, "pipeline: %s is not built; skipping\n", path);
            return 77;
        }
    }
    if (!tmp_dir_make(p->dir, sizeof p->dir, "tdp"))
        return -1;
    setenv("TANDEM_RUNTIME_DIR", p->dir, 1);
    char url[BUS_URL_MAX];
    nng_socket s;
    if (bus_endpoint(url, sizeof url, "gateway-events") != TD_OK || nng_pull0_open(&s) != 0)
        return -1;
    nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, (size_t)8 << 20);
    if (nng_listen(s, url, NULL, 0) != 0)
        return -1;
    p->pull = s.id;
    if (bus_endpoint(url, sizeof url, "verifyd") != TD_OK ||
        bus_client_init(&p->vd, url, NULL) != TD_OK)
        return -1;
    p->next_rid = 1;
    return 0;
}

/* fork + exec of exe with argv, output to log. */
static pid_t pl_spawn(const char *exe, const char *const *argv, const char *log)
{
    setenv("OMP_NUM_THREADS", "1", 1);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    return pid > 0 ? pid : 0;
}

pid_t pl_start(pipeline *p, int svc, const char *const *args)
{
    char exe[1200], log[128];
    snprintf(exe, sizeof exe, "%s/%s", p->build, pl_names[svc]);
    snprintf(log, sizeof log, "%s/%s.log", p->dir, pl_names[svc]);
    const char *argv[64];
    int n = 0;
    argv[n++] = exe;
    argv[n++] = "--runtime-dir";
    argv[n++] = p->dir;
    for (int i = 0; args && args[i] && n < 62; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    p->pid[svc] = pl_spawn(exe, argv, log);
    return p->pid[svc];
}

pid_t pl_start_serve(pipeline *p, const char *const *args)
{
    char exe[1200], log[128];
    snprintf(exe, sizeof exe, "%s/tandem", p->build);
    snprintf(log, sizeof log, "%s/serve.log", p->dir);
    const char *argv[64];
    int n = 0;
    argv[n++] = exe;
    argv[n++] = "serve";
    argv[n++] = "--runtime-dir";
    argv[n++] = p->dir;
    argv[n++] = "--no-gateway";
    for (int i = 0; args && args[i] && n < 62; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    p->serve = pl_spawn(exe, argv, log);
    return p->serve;
}

int pl_stop_serve(pipeline *p, int sig)
{
    if (!p->serve)
        return -1;
    kill(p->serve, sig);
    int status = 0;
    for (int waited = 0; waited < 20000; waited += 5) {
        if (waitpid(p->serve, &status, WNOHANG) == p->serve) {
            p->serve = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(p->serve, SIGKILL);
    waitpid(p->serve, &status, 0);
    p->serve = 0;
    return -1;
}

td_err pl_svc(pipeline *p, const char *name, uint32_t *pid, uint32_t *restarts)
{
    msg_buf b;
    msg_buf_init(&b);
    msg_svc_list list;
    td_err e = msg_pack_svc_list_get(&b, p->next_rid++);
    if (e == TD_OK)
        e = pl_call_raw(p, "tandem", b.data, b.len, &b, 5000);
    if (e == TD_OK && msg_unpack_svc_list(b.data, b.len, NULL, &list) != TD_OK)
        e = kvc_reply_error(&b, "svc_list_get");
    msg_buf_free(&b);
    TD_TRY(e);
    for (uint32_t i = 0; i < list.n; i++)
        if (!strcmp(list.svc[i].name, name)) {
            *pid = list.svc[i].pid;
            *restarts = list.svc[i].restarts;
            return TD_OK;
        }
    return err_set(TD_ENOENT, "no service %s", name);
}

int pl_stop(pipeline *p, int svc, int sig)
{
    pid_t pid = p->pid[svc];
    if (!pid)
        return -1;
    kill(pid, sig);
    int status = 0;
    for (int waited = 0; waited < 10000; waited += 5) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            p->pid[svc] = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    p->pid[svc] = 0;
    return -1;
}

int pl_teardown(pipeline *p)
{
    int bad = 0;
    if (p->serve) {
        int status = pl_stop_serve(p, SIGTERM);
        if (status != 0) {
            fprintf(stderr, "pipeline: tandem serve exited with status %d on SIGTERM\n", status);
            bad++;
        }
    }
    for (int i = PL_SVC_N - 1; i >= 0; i--) {
        if (!p->pid[i])
            continue;
        int status = pl_stop(p, i, SIGTERM);
        if (status != 0) { /* a crash, or the sanitizer's report at exit */
            fprintf(stderr, "pipeline: %s exited with status %d on SIGTERM\n", pl_names[i],
                    status);
            bad++;
        }
    }
    if (bad)
        pl_dump_logs(p);
    bus_client_free(p->vd);
    if (p->pull) {
        nng_socket s = {.id = p->pull};
        nng_close(s);
    }
    for (int i = 0; i < p->n_res; i++) {
        free(p->res[i]->logprobs);
        free(p->res[i]->prompt_lp);
        free(p->res[i]);
    }
    if (p->dir[0] && !tmp_dir_remove(p->dir))
        fprintf(stderr, "pipeline: cannot remove %s\n", p->dir);
    memset(p, 0, sizeof *p);
    return bad;
}

void pl_dump_logs(const pipeline *p)
{
    static const char *const files[] = {"kvd.log", "verifyd.log", "draftd.log", "serve.log",
                                        "logs/kvd.log", "logs/verifyd.log", "logs/draftd.log"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[128], line[1024];
        snprintf(path, sizeof path, "%s/%s", p->dir, files[i]);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        fprintf(stderr, "---- %s ----\n", path);
        while (fgets(line, sizeof line, f))
            fputs(line, stderr);
        fclose(f);
    }
}

/* One request/reply with verifyd. */
static td_err pl_call(pipeline *p, msg_buf *b, int timeout_ms)
{
    return bus_client_call(p->vd, b->data, b->len, b, timeout_ms);
}

td_err pl_status(pipeline *p, msg_status *out)
{
    msg_buf b;
    msg_buf_init(&b);
    td_err e = msg_pack_status_get(&b, p->next_rid++);
    if (e == TD_OK)
        e = pl_call(p, &b, 2000);
    if (e == TD_OK && msg_unpack_status(b.data, b.len, NULL, out) != TD_OK)
        e = kvc_reply_error(&b, "status_get");
    msg_buf_free(&b);
    return e;
}

static long long pl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

td_err pl_wait_ready(pipeline *p, bool want_draft, int timeout_ms)
{
    /* a wall-clock deadline: a status call that times out takes seconds, not the 20 ms of
     * the pause between calls */
    const long long until = pl_now_ms() + timeout_ms;
    while (pl_now_ms() < until) {
        msg_status st;
        if (pl_status(p, &st) == TD_OK && st.ready && (!want_draft || st.draft_attached))
            return TD_OK;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return err_set(TD_ETIMEOUT, "verifyd not ready%s within %d ms",
                   want_draft ? " with draftd" : "", timeout_ms);
}

static td_err pl_ack(pipeline *p, msg_buf *b)
{
    td_err e = pl_call(p, b, 5000);
    msg_ack ack;
    if (e == TD_OK && msg_unpack_ack(b->data, b->len, NULL, &ack) != TD_OK)
        e = kvc_reply_error(b, "request");
    msg_buf_free(b);
    return e;
}

td_err pl_gen(pipeline *p, const msg_gen_start *gs)
{
    msg_buf b;
    msg_buf_init(&b);
    TD_TRY(msg_pack_gen_start(&b, p->next_rid++, gs));
    return pl_ack(p, &b);
}

td_err pl_cancel(pipeline *p, uint64_t seq_id)
{
    msg_buf b;
    msg_buf_init(&b);
    msg_gen_cancel c = {.seq_id = seq_id};
    TD_TRY(msg_pack_gen_cancel(&b, p->next_rid++, &c));
    return pl_ack(p, &b);
}

static pl_result *pl_find(pipeline *p, uint64_t seq_id)
{
    for (int i = 0; i < p->n_res; i++)
        if (p->res[i]->seq_id == seq_id)
            return p->res[i];
    if (p->n_res == PL_SEQ_MAX)
        return NULL;
    pl_result *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->seq_id = seq_id;
    p->res[p->n_res++] = r;
    return r;
}

/* Receives and files one event; false after timeout_ms without one. */
static bool pl_pump(pipeline *p, int timeout_ms)
{
    nng_socket s = {.id = p->pull};
    void *buf = NULL;
    size_t len = 0;
    /* Polled on our own clock: NNG 1.5's timer can miss an expiry. */
    for (int waited = 0;; waited++) {
        int rv = nng_recv(s, &buf, &len, NNG_FLAG_ALLOC | NNG_FLAG_NONBLOCK);
        if (rv == 0)
            break;
        if (rv != NNG_EAGAIN || waited >= timeout_ms)
            return false;
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    msg_gen_event ev;
    if (msg_unpack_gen_event(buf, len, NULL, &ev) != TD_OK) {
        fprintf(stderr, "pipeline: bad event: %s\n", err_msg());
        nng_free(buf, len);
        return true;
    }
    nng_free(buf, len);
    pl_result *r = pl_find(p, ev.seq_id);
    if (r) {
        r->n_events++;
        const bool prompt = ev.kind == MSG_EVENT_PROMPT;
        msg_logprob **lps = prompt ? &r->prompt_lp : &r->logprobs;
        uint32_t *n_lps = prompt ? &r->n_prompt : &r->n_logprobs;
        r->prompt_late = r->prompt_late || (prompt && r->n_tokens > 0);
        if (ev.n_logprobs) {
            msg_logprob *lp = realloc(*lps, (*n_lps + ev.n_logprobs) * sizeof *lp);
            if (lp) {
                memcpy(lp + *n_lps, ev.logprobs, ev.n_logprobs * sizeof *lp);
                *lps = lp;
                if (!prompt)
                    r->n_logprobs += ev.n_logprobs;
            }
        }
        int32_t *toks = prompt ? r->prompt : r->tokens;
        uint32_t *n_toks = prompt ? &r->n_prompt : &r->n_tokens;
        for (uint32_t i = 0; i < ev.n_tokens && *n_toks < PL_TOKENS_MAX; i++)
            toks[(*n_toks)++] = (int32_t)ev.tokens[i];
        r->usage = ev.usage;
        if (msg_event_last(ev.kind)) {
            r->done = true;
            r->last_kind = ev.kind;
            r->finish = ev.finish;
            r->code = ev.code;
            snprintf(r->message, sizeof r->message, "%s", ev.message);
        }
    }
    msg_free_gen_event(&ev);
    return true;
}


pl_result *pl_wait_tokens(pipeline *p, uint64_t seq_id, uint32_t n, int timeout_ms)
{
    long long end = pl_now_ms() + timeout_ms;
    for (;;) {
        pl_result *r = pl_find(p, seq_id);
        if (r && (r->done || r->n_tokens >= n))
            return r;
        long long left = end - pl_now_ms();
        if (left <= 0)
            return NULL;
        pl_pump(p, (int)(left < 100 ? left : 100));
    }
}

pl_result *pl_wait(pipeline *p, uint64_t seq_id, int timeout_ms)
{
    return pl_wait_tokens(p, seq_id, UINT32_MAX, timeout_ms);
}

td_err pl_call_raw(pipeline *p, const char *service, const void *req, size_t len, msg_buf *reply,
                   int timeout_ms)
{
    (void)p;
    char url[BUS_URL_MAX];
    bus_client *c;
    TD_TRY(bus_endpoint(url, sizeof url, service));
    TD_TRY(bus_client_init(&c, url, NULL));
    td_err e = bus_client_call(c, req, len, reply, timeout_ms);
    bus_client_free(c);
    return e;
}

td_err pl_write_pair(pipeline *p, float s, const mf_drafter *d, uint64_t seed, const char *name,
                     char *model, char *draft, tgt_model **tm)
{
    snprintf(model, PL_PATH_MAX, "%s/scaled.gguf", p->dir);
    snprintf(draft, PL_PATH_MAX, "%s/%s", p->dir, name);
    TD_TRY(mf_target_write_scaled(model, "tests/data/models/qwen35-tiny-f32.gguf",
                                  PL_REPEAT_TOKEN, s));
    TD_TRY(tgt_load(tm, model));
    return mf_drafter_write(draft, *tm, d, seed);
}

td_err pl_start_all(pipeline *p, const char *const *kvd, const char *const *vd,
                    const char *const *dd)
{
    pl_start(p, PL_KVD, kvd);
    pl_start(p, PL_VERIFYD, vd);
    pl_start(p, PL_DRAFTD, dd);
    td_err e = pl_wait_ready(p, true, 30000);
    if (e != TD_OK) {
        fprintf(stderr, "%s\n", err_msg());
        pl_dump_logs(p);
    }
    return e;
}

double pl_logsumexp(const float *row, int64_t n)
{
    double mx = row[0], sum = 0;
    for (int64_t t = 1; t < n; t++)
        mx = row[t] > mx ? row[t] : mx;
    for (int64_t t = 0; t < n; t++)
        sum += exp(row[t] - mx);
    return mx + log(sum);
}

bool pl_logprobs_match(const pl_result *r, const float *rows, int64_t n_vocab, uint32_t n_top,
                       double tol)
{
    if (r->n_logprobs != r->n_tokens || n_top > OPS_TOP_LOGPROBS_MAX) {
        fprintf(stderr, "%u log probabilities for %u tokens\n", r->n_logprobs, r->n_tokens);
        return false;
    }
    for (uint32_t i = 0; i < r->n_tokens; i++) {
        const float *row = rows + (int64_t)i * n_vocab;
        const double lse = pl_logsumexp(row, n_vocab);
        const msg_logprob *lp = &r->logprobs[i];
        if (!(fabs(lp->logprob - (row[r->tokens[i]] - lse)) < tol) || lp->n_top != n_top) {
            fprintf(stderr, "token %u: log probability %.7g with %u alternatives, the logits "
                    "give %.7g with %u\n", i, lp->logprob, lp->n_top, row[r->tokens[i]] - lse,
                    n_top);
            return false;
        }
        int32_t idx[OPS_TOP_LOGPROBS_MAX];
        float val[OPS_TOP_LOGPROBS_MAX];
        if (n_top > 0)
            cpu_topk(idx, val, row, n_vocab, n_top);
        for (uint32_t j = 0; j < n_top; j++)
            if ((int32_t)lp->top_id[j] != idx[j] ||
                !(fabs(lp->top_logprob[j] - (val[j] - lse)) < tol)) {
                fprintf(stderr, "token %u: alternative %u is %u (%.7g), the logits give %d "
                        "(%.7g)\n", i, j, lp->top_id[j], lp->top_logprob[j], idx[j],
                        val[j] - lse);
                return false;
            }
    }
    return true;
}
