/* tandem serve: the supervisor. Starts kvd, verifyd, draftd (with a drafter) and the gateway
 * (when its executable exists) as child processes, the sibling executables of this one;
 * restarts any that dies after a back-off (1 s doubling to 30 s, back to 1 s once it has run
 * a minute); writes each one's output to <runtime dir>/logs/<service>.log (to stderr with
 * --foreground); stops them all on SIGINT/SIGTERM. Its control socket (tandem.ipc) answers
 * svc_list_get (tandem status) and svc_restart (tandem restart, e.g. swapping the drafter
 * while requests stream). Children are started with fork + exec and nothing else in between
 * (NNG must not run in a forked child). With --device cuda[:N] the GPU services run as clients
 * of an MPS control daemon (serve_mps.h); <runtime dir>/serve-info.txt tells tandem status
 * the device and whether MPS is in use. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cmd.h"
#include "cli/serve_mps.h"
#include "common/args.h"
#include "common/bus.h"
#include "common/daemon.h"
#include "common/devarg.h"
#include "common/log.h"
#include "kernels/ops.h"
#include "verifyd/spec.h"

#define SV_BACKOFF_MIN_MS 1000
#define SV_BACKOFF_MAX_MS 30000
#define SV_HEALTHY_S 60.0   /* a service that ran this long restarts quickly again */
#define SV_STOP_WAIT_S 10.0 /* SIGTERM, then SIGKILL after this */
#define SV_ARGS_MAX 40

enum { SV_KVD, SV_VERIFYD, SV_DRAFTD, SV_GATEWAY, SV_N };

typedef struct sv_service {
    const char *name;
    char exe[PATH_MAX + 32];
    char log[PATH_MAX + 48];
    bool enabled;
    pid_t pid;              /* 0 while down */
    double started;         /* monotonic seconds of the last start */
    double next_start;      /* while down: when to start again */
    int backoff_ms;         /* wait before the next restart */
    uint32_t restarts;      /* starts after the first */
    bool restart_asked;     /* tandem restart: stop it and start it at once */
    double kill_at;         /* while stopping it for a restart: SIGKILL at this time */
} sv_service;

typedef struct sv_opts {
    char model[PATH_MAX];
    char draft[PATH_MAX];   /* "" without a drafter */
    char host[256];
    int64_t port, ctx, slots, delta_chunk, draft_max;
    int64_t gpu_mem;        /* kvd --gpu-mem (MiB; 0: the whole GPU) */
    bool draft_auto;        /* verifyd --draft-auto */
    char dir[PATH_MAX];     /* runtime directory */
    const char *log_level;
    bool foreground;
    char device[24];        /* "cpu" or "cuda:N", passed to kvd, verifyd and draftd */
} sv_opts;

typedef struct sv {
    pthread_mutex_t lock;   /* guards everything: the control socket reads and asks */
    pthread_cond_t changed; /* a service was started */
    sv_service svc[SV_N];
    sv_opts o;
    mps_ctl mps;            /* the services' environment (MPS variables with a GPU) */
} sv;

static double sv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --- children ------------------------------------------------------------------------------ */

/* argv of a service from the options (strings point into s->o). */
static int sv_argv(sv *s, int i, const char **argv, char *num, size_t num_cap)
{
    const sv_opts *o = &s->o;
    int n = 0;
    argv[n++] = s->svc[i].exe;
    argv[n++] = "--runtime-dir";
    argv[n++] = o->dir;
    if (o->log_level) {
        argv[n++] = "--log-level";
        argv[n++] = o->log_level;
    }
    const size_t w = num_cap / 6;
    char *ctx = num, *slots = num + w, *port = num + 2 * w, *chunk = num + 3 * w;
    char *dmax = num + 4 * w, *gmem = num + 5 * w;
    snprintf(ctx, w, "%lld", (long long)o->ctx);
    snprintf(slots, w, "%lld", (long long)o->slots);
    snprintf(gmem, w, "%lld", (long long)o->gpu_mem);
    snprintf(port, w, "%lld", (long long)o->port);
    snprintf(chunk, w, "%lld", (long long)o->delta_chunk);
    snprintf(dmax, w, "%lld", (long long)o->draft_max);
    if (i != SV_GATEWAY) {
        argv[n++] = "--device";
        argv[n++] = o->device;
    }
    switch (i) {
    case SV_KVD:
        argv[n++] = "--slots";
        argv[n++] = slots;
        argv[n++] = "--gpu-mem";
        argv[n++] = gmem;
        break;
    case SV_VERIFYD:
        argv[n++] = "--model";
        argv[n++] = o->model;
        argv[n++] = "--ctx";
        argv[n++] = ctx;
        argv[n++] = "--delta-chunk";
        argv[n++] = chunk;
        argv[n++] = "--draft-max";
        argv[n++] = dmax;
        if (o->draft_auto)
            argv[n++] = "--draft-auto";
        if (o->draft[0]) {
            argv[n++] = "--draft";
            argv[n++] = o->draft;
        }
        break;
    case SV_DRAFTD:
        argv[n++] = "--model";
        argv[n++] = o->model;
        argv[n++] = "--draft";
        argv[n++] = o->draft;
        break;
    case SV_GATEWAY:
        argv[n++] = "--model";
        argv[n++] = o->model;
        argv[n++] = "--host";
        argv[n++] = o->host;
        argv[n++] = "--port";
        argv[n++] = port;
        argv[n++] = "--ctx";
        argv[n++] = ctx;
        break;
    }
    argv[n] = NULL;
    return n;
}

/* Starts service i (lock held). */
static void sv_start(sv *s, int i)
{
    sv_service *v = &s->svc[i];
    const char *argv[SV_ARGS_MAX];
    char num[120];
    sv_argv(s, i, argv, num, sizeof num);
    bool foreground = s->o.foreground;
    char **env = s->mps.env;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* async-signal-safe calls only until exec */
        if (!foreground) {
            int fd = open(v->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
            }
        }
        close_range(3, ~0u, 0); /* the supervisor's sockets stay with it */
        execve(v->exe, (char *const *)argv, env);
        _exit(127);
    }
    double now = sv_now();
    if (pid < 0) {
        LOG_ERROR("cannot start %s: %s", v->name, strerror(errno));
        v->next_start = now + v->backoff_ms / 1000.0;
        return;
    }
    if (v->started > 0)
        v->restarts++;
    v->pid = pid;
    v->started = now;
    v->kill_at = 0;
    pthread_cond_broadcast(&s->changed);
    LOG_INFO("started %s (pid %d)", v->name, (int)pid);
}

/* A child ended: schedule its restart (lock held). */
static void sv_reaped(sv *s, pid_t pid, int status)
{
    for (int i = 0; i < SV_N; i++) {
        sv_service *v = &s->svc[i];
        if (v->pid != pid)
            continue;
        v->pid = 0;
        double now = sv_now();
        if (v->restart_asked) {
            v->restart_asked = false;
            v->backoff_ms = SV_BACKOFF_MIN_MS;
            sv_start(s, i);
            return;
        }
        if (now - v->started >= SV_HEALTHY_S)
            v->backoff_ms = SV_BACKOFF_MIN_MS;
        if (WIFSIGNALED(status))
            LOG_WARN("%s (pid %d) was killed by signal %d; restarting in %.1f s", v->name,
                     (int)pid, WTERMSIG(status), v->backoff_ms / 1000.0);
        else
            LOG_WARN("%s (pid %d) exited with status %d; restarting in %.1f s", v->name, (int)pid,
                     WEXITSTATUS(status), v->backoff_ms / 1000.0);
        v->next_start = now + v->backoff_ms / 1000.0;
        v->backoff_ms = v->backoff_ms * 2 > SV_BACKOFF_MAX_MS ? SV_BACKOFF_MAX_MS : v->backoff_ms * 2;
        return;
    }
}

/* One turn of the main loop (lock held): reap, start what is due, escalate slow stops. */
static void sv_turn(sv *s)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
        sv_reaped(s, pid, status);
    double now = sv_now();
    for (int i = 0; i < SV_N; i++) {
        sv_service *v = &s->svc[i];
        if (!v->enabled)
            continue;
        if (v->pid == 0 && now >= v->next_start)
            sv_start(s, i);
        if (v->pid && v->restart_asked && v->kill_at > 0 && now >= v->kill_at) {
            kill(v->pid, SIGKILL);
            v->kill_at = 0;
        }
    }
}

static void sv_stop_all(sv *s)
{
    pthread_mutex_lock(&s->lock);
    for (int i = SV_N - 1; i >= 0; i--)
        if (s->svc[i].pid)
            kill(s->svc[i].pid, SIGTERM);
    double until = sv_now() + SV_STOP_WAIT_S;
    for (;;) {
        int left = 0;
        for (int i = 0; i < SV_N; i++) {
            sv_service *v = &s->svc[i];
            int status;
            if (v->pid && waitpid(v->pid, &status, WNOHANG) == v->pid) {
                LOG_INFO("%s stopped", v->name);
                v->pid = 0;
            }
            left += v->pid != 0;
        }
        if (!left)
            break;
        if (sv_now() >= until) {
            for (int i = 0; i < SV_N; i++)
                if (s->svc[i].pid) {
                    LOG_WARN("%s did not stop in %.0f s; killing it", s->svc[i].name,
                             SV_STOP_WAIT_S);
                    kill(s->svc[i].pid, SIGKILL);
                    waitpid(s->svc[i].pid, NULL, 0);
                    s->svc[i].pid = 0;
                }
            break;
        }
        pthread_mutex_unlock(&s->lock);
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
}

/* --- control socket --------------------------------------------------------------------- */

static td_err sv_list(sv *s, uint64_t rid, msg_buf *reply)
{
    msg_svc_list m = {0};
    double now = sv_now();
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < SV_N; i++) {
        const sv_service *v = &s->svc[i];
        if (!v->enabled)
            continue;
        msg_svc *o = &m.svc[m.n++];
        snprintf(o->name, sizeof o->name, "%s", v->name);
        o->pid = (uint32_t)v->pid;
        o->uptime_ms = v->pid ? (uint64_t)((now - v->started) * 1000) : 0;
        o->restarts = v->restarts;
    }
    pthread_mutex_unlock(&s->lock);
    return msg_pack_svc_list(reply, rid, &m);
}

/* Stops the service and starts it again at once (with a new drafter folder for draftd);
 * answers with the new pid once it runs. */
static td_err sv_restart(sv *s, uint64_t rid, const msg_svc_restart *m, msg_buf *reply)
{
    int i = 0;
    while (i < SV_N && strcmp(s->svc[i].name, m->name) != 0)
        i++;
    if (i == SV_N || !s->svc[i].enabled)
        return err_set(TD_ENOENT, "no service %s runs here", m->name);
    if (m->draft[0] && i != SV_DRAFTD)
        return err_set(TD_EINVAL, "only draftd takes a drafter folder");
    if (m->draft[0]) {
        char cfg[PATH_MAX + 16];
        struct stat st;
        snprintf(cfg, sizeof cfg, "%s/config.json", m->draft);
        if (m->draft[0] != '/' || stat(cfg, &st) != 0)
            return err_set(TD_ENOENT, "%s is not a drafter folder (an absolute path with a "
                           "config.json)", m->draft);
    }
    pthread_mutex_lock(&s->lock);
    sv_service *v = &s->svc[i];
    if (m->draft[0])
        snprintf(s->o.draft, sizeof s->o.draft, "%s", m->draft);
    double t0 = sv_now();
    if (v->pid) {
        v->restart_asked = true;
        v->kill_at = t0 + SV_STOP_WAIT_S;
        kill(v->pid, SIGTERM);
    } else {
        v->next_start = 0; /* down and backing off: start it now */
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)SV_STOP_WAIT_S + 5;
    while (!(v->pid && v->started >= t0) &&
           pthread_cond_timedwait(&s->changed, &s->lock, &ts) != ETIMEDOUT)
        ;
    bool ok = v->pid && v->started >= t0;
    msg_ack ack = {.id = (uint64_t)v->pid};
    pthread_mutex_unlock(&s->lock);
    if (!ok)
        return err_set(TD_ETIMEOUT, "%s did not restart in time", m->name);
    LOG_INFO("%s restarted on request%s%s", m->name, m->draft[0] ? " with drafter " : "",
             m->draft);
    return msg_pack_ack(reply, rid, &ack);
}

static td_err sv_handle(void *user, const uint8_t *req, size_t len, msg_buf *reply)
{
    sv *s = user;
    msg_header h;
    TD_TRY(msg_unpack_header(req, len, &h));
    td_err e = TD_OK;
    if (daemon_answer_common(req, len, &h, MSG_ROLE_CLI, reply, &e))
        return e;
    if (h.type == MSG_SVC_LIST_GET) {
        TD_TRY(msg_unpack_svc_list_get(req, len, NULL));
        return sv_list(s, h.request_id, reply);
    }
    if (h.type == MSG_SVC_RESTART) {
        msg_svc_restart m;
        TD_TRY(msg_unpack_svc_restart(req, len, NULL, &m));
        return sv_restart(s, h.request_id, &m, reply);
    }
    return err_set(TD_EPROTO, "the supervisor does not answer %s messages",
                   msg_type_name(h.type));
}

/* --- setup ---------------------------------------------------------------------------------- */

/* path relative to the working directory or to the folder above this executable's, made
 * absolute; false when neither exists. */
static bool sv_find(const char *rel, const char *exe_dir, char *out, size_t cap)
{
    char cand[PATH_MAX * 2];
    const char *src = getenv("TANDEM_SOURCE_DIR");
    const char *bases[3] = {".", exe_dir, src};
    for (int k = 0; k < 3; k++) {
        if (!bases[k])
            continue;
        snprintf(cand, sizeof cand, k == 1 ? "%s/../%s" : "%s/%s", bases[k], rel);
        char real[PATH_MAX];
        if (realpath(cand, real) && strlen(real) < cap) {
            strcpy(out, real);
            return true;
        }
    }
    return false;
}

/* <runtime dir>/serve-info.txt for tandem status: the device and MPS lines (written to a
 * temporary name and renamed, so a reader never sees half). */
static void sv_info_write(const sv *s)
{
    char path[PATH_MAX + 32], tmp[PATH_MAX + 40], mps[1024];
    snprintf(path, sizeof path, "%s/serve-info.txt", s->o.dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    mps_describe(&s->mps, mps, sizeof mps);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        LOG_WARN("%s: %s (tandem status will not show the device)", tmp, strerror(errno));
        return;
    }
    fprintf(f, "device: %s\nmps: %s\n", s->o.device, mps);
    if (fclose(f) != 0 || rename(tmp, path) != 0)
        LOG_WARN("%s: %s (tandem status will not show the device)", path, strerror(errno));
}

static void sv_info_remove(const sv *s)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/serve-info.txt", s->o.dir);
    unlink(path);
}

static int sv_fail(const char *what)
{
    fprintf(stderr, "tandem serve: %s%s%s\n", what, *err_msg() ? ": " : "", err_msg());
    return 1;
}

int cmd_serve(int argc, char **argv)
{
    const char *model = NULL, *draft = NULL, *host = "127.0.0.1", *runtime_dir = NULL;
    const char *log_level = NULL, *device = "cpu";
    int64_t port = 8080, ctx = 4096, slots = 0, delta_chunk = 0, draft_max = 0, gpu_mem = 0;
    bool foreground = false, no_gateway = false, no_mps = false, help = false;
    bool draft_auto = false;
    const args_opt opts[] = {
        {"model", ARGS_STRING, &model, "TANDEM_MODEL", "target GGUF file (default: the demo model)", 0, 0, 'm'},
        {"draft", ARGS_STRING, &draft, "TANDEM_DRAFT", "DFlash drafter folder (\"\": none)", 0, 0, 0},
        {"host", ARGS_STRING, &host, "TANDEM_HOST", "HTTP address", 0, 0, 0},
        {"port", ARGS_INT, &port, "TANDEM_PORT", "HTTP port", 0, 65535, 0},
        {"ctx", ARGS_INT, &ctx, "TANDEM_CTX", "positions per sequence", 2, 1 << 20, 0},
        {"slots", ARGS_INT, &slots, "TANDEM_SLOTS", "sequences held at once (0: 16 on the CPU; on a GPU as many as fit beside the models, up to 16)", 0, 1024, 0},
        {"gpu-mem", ARGS_INT, &gpu_mem, "TANDEM_GPU_MEM", "MiB of the GPU the services may use together when kvd sizes its pools (0: all of it)", 0, 1 << 24, 0},
        {"runtime-dir", ARGS_STRING, &runtime_dir, "TANDEM_RUNTIME_DIR", "private directory of the sockets and logs", 0, 0, 0},
        {"log-level", ARGS_STRING, &log_level, "TANDEM_LOG", "debug, info, warn, error or off (every service)", 0, 0, 0},
        {"foreground", ARGS_FLAG, &foreground, NULL, "services log to stderr instead of their log files", 0, 0, 0},
        {"no-gateway", ARGS_FLAG, &no_gateway, NULL, "run the backend only (kvd, verifyd, draftd)", 0, 0, 0},
        {"device", ARGS_STRING, &device, "TANDEM_DEVICE", "where kvd, verifyd and draftd run: cpu, cuda or cuda:N", 0, 0, 0},
        {"delta-chunk", ARGS_INT, &delta_chunk, "TANDEM_DELTA_CHUNK", "verifyd's prefill runs the DeltaNet recurrence in chunks of N positions (0: token by token)", 0, OPS_DELTA_CHUNK_MAX, 0},
        {"draft-max", ARGS_INT, &draft_max, "TANDEM_DRAFT_MAX", "drafts verifyd checks per step at most (0: the drafter's whole block)", 0, SPEC_MAX_BLOCK - 1, 0},
        {"draft-auto", ARGS_FLAG, &draft_auto, "TANDEM_DRAFT_AUTO", "verifyd picks each step's block (up to --draft-max) by measured cost and acceptance, none where drafting does not pay", 0, 0, 0},
        {"no-mps", ARGS_FLAG, &no_mps, NULL, "with a GPU: do not start an MPS control daemon (each draft/verify round trip then pays a context switch)", 0, 0, 0},
        ARGS_END,
    };
    static const char usage[] =
        "tandem serve [--model M.gguf] [--draft DIR] [--host H] [--port P] [--ctx N] [--slots N] "
        "[--gpu-mem MIB] [--device cpu|cuda[:N]] [--no-mps]";
    if (args_parse(argc, argv, 1, opts, NULL, 0, NULL, &help) != TD_OK) {
        fprintf(stderr, "tandem serve: %s\n", err_msg());
        args_usage(usage, opts);
        return 2;
    }
    if (help) {
        args_usage(usage, opts);
        return 0;
    }
    int ordinal;
    if (devarg_parse(device, &ordinal) != TD_OK) {
        fprintf(stderr, "tandem serve: %s\n", err_msg());
        return 2;
    }
    bool gpu = ordinal >= 0;
    sv *s = calloc(1, sizeof *s);
    if (!s)
        return sv_fail("out of memory");
    int rc = 1;
    bus_server *ctl = NULL;
    bool locks = false;
    char exe_dir[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe_dir, sizeof exe_dir - 1);
    if (n <= 0) {
        rc = sv_fail("cannot find this executable's folder");
        goto out;
    }
    exe_dir[n] = '\0';
    *strrchr(exe_dir, '/') = '\0';

    sv_opts *o = &s->o;
    /* No model: the demo model (models/demo/) once it exists, the tiny test model until then. */
    bool demo = !model;
    if (model && !realpath(model, o->model)) {
        err_set(TD_ENOENT, "%s: %s", model, strerror(errno));
        rc = sv_fail("--model");
        goto out;
    }
    if (demo && !sv_find("models/demo/demo.gguf", exe_dir, o->model, sizeof o->model) &&
        !sv_find("tests/data/models/qwen35-tiny-f32.gguf", exe_dir, o->model, sizeof o->model)) {
        err_set(TD_ENOENT, "no demo model found");
        rc = sv_fail("give --model");
        goto out;
    }
    if (draft && draft[0] && !realpath(draft, o->draft)) {
        err_set(TD_ENOENT, "%s: %s", draft, strerror(errno));
        rc = sv_fail("--draft");
        goto out;
    }
    if (demo && !draft) {
        bool demo_model = strstr(o->model, "models/demo/") != NULL;
        sv_find(demo_model ? "models/demo/drafter" : "tests/data/drafter/dflash-b16", exe_dir,
                o->draft, sizeof o->draft);
    }
    snprintf(o->host, sizeof o->host, "%s", host);
    o->port = port;
    o->ctx = ctx;
    o->slots = slots;
    o->gpu_mem = gpu_mem;
    o->delta_chunk = delta_chunk;
    o->draft_max = draft_max;
    o->draft_auto = draft_auto;
    o->log_level = log_level;
    o->foreground = foreground;
    if (gpu) /* the canonical spelling: the services and tandem status show the same */
        snprintf(o->device, sizeof o->device, "cuda:%d", ordinal);
    else
        snprintf(o->device, sizeof o->device, "cpu");
    if (daemon_setup("tandem", runtime_dir, log_level) != TD_OK ||
        bus_runtime_dir(o->dir, sizeof o->dir) != TD_OK) {
        rc = sv_fail("runtime directory");
        goto out;
    }
    char logs[PATH_MAX + 8];
    _Static_assert(sizeof((sv_service *)0)->log >= sizeof logs + 16, "log path room");
    snprintf(logs, sizeof logs, "%s/logs", o->dir);
    if (mkdir(logs, 0700) != 0 && errno != EEXIST) {
        err_set(TD_EIO, "%s: %s", logs, strerror(errno));
        rc = sv_fail("logs");
        goto out;
    }

    static const char *const names[SV_N] = {"kvd", "verifyd", "draftd", "gateway"};
    for (int i = 0; i < SV_N; i++) {
        sv_service *v = &s->svc[i];
        v->name = names[i];
        snprintf(v->exe, sizeof v->exe, "%s/%s", exe_dir, names[i]);
        snprintf(v->log, sizeof v->log, "%s/%s.log", logs, names[i]);
        v->backoff_ms = SV_BACKOFF_MIN_MS;
        v->enabled = access(v->exe, X_OK) == 0 && (i != SV_DRAFTD || o->draft[0]) &&
                     (i != SV_GATEWAY || !no_gateway);
        if (!v->enabled && i != SV_GATEWAY && (i != SV_DRAFTD || o->draft[0])) {
            err_set(TD_ENOENT, "%s is missing", v->exe);
            rc = sv_fail("services");
            goto out;
        }
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->changed, NULL);
    locks = true;
    daemon_signals();
    /* A closed terminal stops the services (and the MPS daemon) as Ctrl-C does. */
    struct sigaction stop;
    sigaction(SIGTERM, NULL, &stop);
    sigaction(SIGHUP, &stop, NULL);
    char url[BUS_URL_MAX];
    bus_opts bo;
    bus_opts_default(&bo);
    bo.workers = 2;
    bo.recv_timeout_ms = 200;
    if (daemon_endpoint(url, sizeof url, NULL, "tandem") != TD_OK ||
        bus_server_init(&ctl, url, &bo, sv_handle, s) != TD_OK) {
        rc = sv_fail("control socket");
        goto out;
    }
    /* After the control socket: holding it proves no other supervisor uses this directory,
     * so an MPS daemon found under it was left by a dead one. */
    if (mps_init(&s->mps, gpu, no_mps, o->dir, logs) != TD_OK) {
        rc = sv_fail("MPS");
        goto out;
    }
    sv_info_write(s);
    LOG_INFO("serving %s%s%s on %s; runtime directory %s, logs in %s%s", o->model,
             o->draft[0] ? " with drafter " : " without a drafter", o->draft, o->device, o->dir,
             logs, s->svc[SV_GATEWAY].enabled ? "" : " (no gateway: HTTP is not served)");
    if (s->svc[SV_GATEWAY].enabled)
        LOG_INFO("HTTP on %s:%lld", o->host, (long long)o->port);
    while (!daemon_stopping()) {
        pthread_mutex_lock(&s->lock);
        sv_turn(s);
        pthread_mutex_unlock(&s->lock);
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    LOG_INFO("stopping every service");
    sv_stop_all(s);
    rc = 0;
out:
    /* every path out, once the services (its clients) are gone */
    mps_free(&s->mps);
    if (ctl)
        sv_info_remove(s);
    bus_server_free(ctl);
    if (locks) {
        pthread_cond_destroy(&s->changed);
        pthread_mutex_destroy(&s->lock);
    }
    free(s);
    return rc;
}
