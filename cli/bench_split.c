/* The process-split cost of `tandem bench` (see bench_split.h). */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/bench_split.h"
#include "cli/serve_mps.h"
#include "common/bus.h"
#include "common/msg.h"
#include "kernels/backend.h"
#include "verifyd/dlink.h"

#define BS_TIMEOUT_MS 10000   /* one call */
#define BS_DEADLINE_MS 120000 /* a whole pair, CUDA start-up included */
#define BS_WARMUP 200
#define BS_KERNEL_FLOATS 4096 /* a kernel that takes a few microseconds: the step's sync point */
#define BS_VOCAB 248320       /* token ids of the proposal: any id of a real vocabulary */
#define BS_EXIT_CPU 3         /* the server's exit status when it had no CUDA device */

static double bs_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int bs_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double bs_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], bs_cmp);
    return v[n / 2];
}

/* --- the two ends ------------------------------------------------------------------------ */

typedef struct bs_gpu {
    ops_backend *cuda;     /* NULL when no CUDA device is usable */
    const ops_backend *be; /* cuda, or the CPU backend */
    float *buf;            /* [BS_KERNEL_FLOATS] backend memory */
} bs_gpu;

static td_err bs_gpu_init(bs_gpu *g, int device)
{
    memset(g, 0, sizeof *g);
    if (ops_backend_cuda_init(&g->cuda, device) != TD_OK)
        g->cuda = NULL;
    g->be = g->cuda ? g->cuda : ops_backend_cpu();
    TD_TRY(g->be->alloc(g->be, (void **)&g->buf, BS_KERNEL_FLOATS * sizeof(float)));
    return g->be->zero(g->be, g->buf, BS_KERNEL_FLOATS * sizeof(float));
}

static void bs_gpu_free(bs_gpu *g)
{
    if (g->buf)
        g->be->release(g->be, g->buf);
    if (g->cuda)
        ops_backend_cuda_free(g->cuda);
}

/* One small kernel and the wait for it: where a process hands the GPU to the other. */
static td_err bs_kernel(const bs_gpu *g)
{
    TD_TRY(g->be->scale(g->be, g->buf, g->buf, 1.0f, BS_KERNEL_FLOATS));
    return g->be->sync(g->be);
}

/* draftd's end: a propose in, a kernel, a proposal of n_draft tokens out. */
static td_err bs_handle(void *user, const uint8_t *req, size_t len, msg_buf *reply)
{
    const bs_gpu *g = user;
    msg_propose p;
    uint64_t rid;
    TD_TRY(msg_unpack_propose(req, len, &rid, &p));
    TD_TRY(bs_kernel(g));
    uint32_t tokens[MSG_DRAFT_MAX];
    for (uint32_t i = 0; i < p.n_draft; i++)
        tokens[i] = (p.pending + 7919u * (i + 1)) % BS_VOCAB;
    msg_proposal r = {.seq_id = p.seq_id, .n_past = p.n_past, .tokens = tokens,
                      .n_tokens = p.n_draft};
    return msg_pack_proposal(reply, rid, &r);
}

int bsplit_serve(const char *url, int device)
{
    /* Blocked before the server's threads start, so only sigwait sees SIGTERM. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    bs_gpu g;
    bus_server *s = NULL;
    bus_opts o;
    bus_opts_default(&o);
    o.workers = 1; /* draftd drafts one block at a time */
    td_err e = bs_gpu_init(&g, device);
    if (e == TD_OK)
        e = bus_server_init(&s, url, &o, bs_handle, &g);
    if (e != TD_OK) {
        fprintf(stderr, "tandem bench split server: %s\n", err_msg());
        bs_gpu_free(&g);
        return 1;
    }
    int sig;
    sigwait(&set, &sig);
    bus_server_free(s);
    /* The exit status tells the parent which backend this end ran its kernels on. */
    int rc = g.cuda ? 0 : BS_EXIT_CPU;
    bs_gpu_free(&g);
    return rc;
}

int bsplit_client(const char *url, int device, int calls, int block)
{
    bs_gpu g;
    bus_client *c = NULL;
    double *t = malloc((size_t)calls * sizeof *t);
    msg_buf req, rep;
    msg_buf_init(&req);
    msg_buf_init(&rep);
    td_err e = t ? bs_gpu_init(&g, device) : err_set(TD_ENOMEM, "out of memory");
    bus_opts o;
    bus_opts_default(&o);
    o.spin_us = e == TD_OK && g.cuda ? DLINK_SPIN_US : 0; /* as verifyd's link to draftd */
    if (e == TD_OK)
        e = bus_client_init(&c, url, &o);
    double local = 0, step = 0;
    /* The same two kernels in one process: what the step costs without the split. */
    for (int i = -BS_WARMUP; e == TD_OK && i < calls; i++) {
        double t0 = bs_now_us();
        e = bs_kernel(&g);
        if (e == TD_OK)
            e = bs_kernel(&g);
        if (i >= 0)
            t[i] = bs_now_us() - t0;
    }
    if (e == TD_OK)
        local = bs_median(t, calls);
    msg_propose p = {.seq_id = 1, .slot = 0, .slot_gen = 1, .pool_gen = 1, .n_past = 1024,
                     .pending = 42, .n_draft = (uint32_t)(block - 1),
                     .sampler = {.temperature = 0.0f, .top_p = 1.0f}};
    for (int i = -BS_WARMUP; e == TD_OK && i < calls; i++) {
        uint64_t rid = (uint64_t)(i + BS_WARMUP + 1), got_rid = 0;
        msg_proposal r;
        double t0 = bs_now_us();
        p.n_past = 1024 + (uint32_t)(i + BS_WARMUP);
        e = msg_pack_propose(&req, rid, &p);
        if (e == TD_OK)
            e = bus_client_call(c, req.data, req.len, &rep, BS_TIMEOUT_MS);
        if (e == TD_OK)
            e = msg_unpack_proposal(rep.data, rep.len, &got_rid, &r);
        if (e == TD_OK) {
            if (got_rid != rid || r.n_tokens != p.n_draft)
                e = err_set(TD_EPROTO, "proposal %llu answers request %llu with %u tokens",
                            (unsigned long long)got_rid, (unsigned long long)rid, r.n_tokens);
            msg_free_proposal(&r);
        }
        if (e == TD_OK)
            e = bs_kernel(&g);
        if (i >= 0)
            t[i] = bs_now_us() - t0;
    }
    if (e == TD_OK)
        step = bs_median(t, calls);
    if (e == TD_OK)
        printf("bsplit gpu=%d step_us=%.3f local_us=%.3f\n", g.cuda != NULL, step, local);
    else
        fprintf(stderr, "tandem bench split client: %s\n", err_msg());
    fflush(stdout);
    if (c)
        bus_client_free(c);
    if (t)
        bs_gpu_free(&g);
    msg_buf_free(&req);
    msg_buf_free(&rep);
    free(t);
    return e == TD_OK ? 0 : 1;
}

/* --- the parent: processes, MPS ---------------------------------------------------------- */

static int bs_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void bs_rmtree(const char *dir)
{
    nftw(dir, bs_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Child environment: MPS clients of m's daemon, or (m NULL) no MPS variables. */
static void bs_child_env(const mps_ctl *m)
{
    if (!m) {
        unsetenv("CUDA_MPS_PIPE_DIRECTORY");
        unsetenv("CUDA_MPS_LOG_DIRECTORY");
        return;
    }
    setenv("CUDA_MPS_PIPE_DIRECTORY", m->pipe_dir, 1);
    setenv("CUDA_MPS_LOG_DIRECTORY", m->log_dir, 1);
}

/* fork + exec at once (NNG and CUDA are never used in a forked child before exec); out_fd
 * gets the child's stdout when non-NULL. */
static pid_t bs_spawn(char *const argv[], const mps_ctl *mps, int *out_fd)
{
    int fds[2] = {-1, -1};
    if (out_fd && pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        bs_child_env(mps);
        if (out_fd) {
            dup2(fds[1], STDOUT_FILENO);
            close(fds[0]);
            close(fds[1]);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    if (out_fd) {
        close(fds[1]);
        *out_fd = pid > 0 ? fds[0] : -1;
        if (pid < 0)
            close(fds[0]);
    }
    return pid;
}

/* Waits for pid up to ms, then kills it. Returns its wait status (or -1). */
static int bs_reap(pid_t pid, int ms)
{
    int st = -1;
    for (int waited = 0; waited <= ms; waited += 10) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return st;
        if (r < 0)
            return -1;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return st;
}

/* Reads the client's report line (until EOF or the deadline). */
static void bs_read(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    double end = bs_now_us() + BS_DEADLINE_MS * 1e3;
    while (n + 1 < cap) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int left = (int)((end - bs_now_us()) / 1e3);
        if (left <= 0 || poll(&pf, 1, left) <= 0)
            break;
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    buf[n] = 0;
}

static void bs_pair(int device, int calls, int block, const mps_ctl *mps, bsplit_result *res)
{
    memset(res, 0, sizeof *res);
    char rt[] = "/tmp/tandem-split-XXXXXX";
    if (!mkdtemp(rt)) {
        snprintf(res->why, sizeof res->why, "mkdtemp: %s", strerror(errno));
        return;
    }
    /* The children find the endpoint through the runtime directory they inherit. */
    char *old = getenv("TANDEM_RUNTIME_DIR") ? strdup(getenv("TANDEM_RUNTIME_DIR")) : NULL;
    setenv("TANDEM_RUNTIME_DIR", rt, 1);
    char url[BUS_URL_MAX], dev[16], n_calls[16], n_block[16];
    snprintf(dev, sizeof dev, "%d", device);
    snprintf(n_calls, sizeof n_calls, "%d", calls);
    snprintf(n_block, sizeof n_block, "%d", block);
    if (bus_endpoint(url, sizeof url, "bench-split") != TD_OK) {
        snprintf(res->why, sizeof res->why, "%s", err_msg());
    } else {
        char *srv[] = {"/proc/self/exe", "bench", "--split-serve", url, "--device", dev, NULL};
        char *cli[] = {"/proc/self/exe", "bench", "--split-client", url, "--device", dev,
                       "--iters", n_calls, "--split-block", n_block, NULL};
        int fd = -1;
        pid_t s = bs_spawn(srv, mps, NULL);
        pid_t c = s > 0 ? bs_spawn(cli, mps, &fd) : -1;
        char line[512] = "";
        int s_status = -1;
        if (c > 0) {
            bs_read(fd, line, sizeof line);
            close(fd);
            bs_reap(c, 5000);
        }
        if (s > 0) {
            kill(s, SIGTERM);
            s_status = bs_reap(s, 5000);
        }
        int gpu;
        if (s <= 0 || c <= 0)
            snprintf(res->why, sizeof res->why, "fork failed: %s", strerror(errno));
        else if (sscanf(line, "bsplit gpu=%d step_us=%lf local_us=%lf", &gpu, &res->step_us,
                        &res->local_us) != 3)
            snprintf(res->why, sizeof res->why, "the split client failed (its message is above)");
        else if (gpu && !(WIFEXITED(s_status) && WEXITSTATUS(s_status) == 0))
            snprintf(res->why, sizeof res->why, "the draftd end had no CUDA device while the "
                     "verifyd end had one (an exclusive compute mode?)");
        else {
            res->measured = true;
            res->gpu = gpu != 0;
            res->cost_us = res->step_us - res->local_us;
        }
    }
    if (old) {
        setenv("TANDEM_RUNTIME_DIR", old, 1);
        free(old);
    } else {
        unsetenv("TANDEM_RUNTIME_DIR");
    }
    bs_rmtree(rt);
}

/* The last line of the MPS server's log (why a client could not connect), or "". */
static void bs_mps_log_tail(const mps_ctl *m, char *out, size_t cap)
{
    char p[PATH_MAX + 16], line[512];
    snprintf(p, sizeof p, "%s/server.log", m->log_dir);
    out[0] = 0;
    FILE *f = fopen(p, "r");
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        if (n == 0 || line[0] == '\n')
            continue;
        n = n < cap ? n : cap - 1; /* a long line is cut */
        memcpy(out, line, n);
        out[n] = 0;
    }
    fclose(f);
    size_t n = strlen(out);
    if (n && out[n - 1] == '\n')
        out[n - 1] = 0;
}

void bsplit_measure(int device, int calls, int block, bsplit_result *plain, bsplit_result *mps)
{
    bs_pair(device, calls, block, NULL, plain);
    memset(mps, 0, sizeof *mps);
    if (!plain->measured) {
        snprintf(mps->why, sizeof mps->why, "not tried: the pair without MPS failed");
        return;
    }
    if (!plain->gpu) {
        snprintf(mps->why, sizeof mps->why, "no CUDA device: MPS does not apply");
        return;
    }
    char dir[] = "/tmp/tandem-mps-XXXXXX";
    if (!mkdtemp(dir)) {
        snprintf(mps->why, sizeof mps->why, "mkdtemp: %s", strerror(errno));
        return;
    }
    mps_ctl m;
    if (mps_start(&m, dir, dir) != TD_OK) {
        snprintf(mps->why, sizeof mps->why, "%s", err_msg());
    } else if (m.mode != MPS_MODE_OWN) {
        snprintf(mps->why, sizeof mps->why, "%.200s", m.why);
    } else {
        bs_pair(device, calls, block, &m, mps);
        if (mps->measured && !mps->gpu) {
            /* Without the device the pair measured messages only: not an MPS number. */
            char tail[256];
            bs_mps_log_tail(&m, tail, sizeof tail);
            mps->measured = false;
            snprintf(mps->why, sizeof mps->why, "the MPS clients could not open the CUDA "
                     "device%s%.150s", *tail ? "; MPS server log: " : "", tail);
        }
    }
    mps_free(&m);
    bs_rmtree(dir);
}
