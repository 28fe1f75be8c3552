/* bench_split: what running the drafter in its own process (draftd) adds to a speculative
 * step, against the single-process loop (spec_seq).
 *
 * 1. The tiny test model with the real daemons: kvd and draftd from this build are started in
 *    a private runtime directory; this program plays verifyd (a sequence in a kvd slot, blocks
 *    proposed by draftd over its socket, features through the shared ring) and times each
 *    step against spec_step with the same drafter in this process. The split's cost per step
 *    is the difference of the medians; the propose round trip minus the in-process drafting
 *    time is what messages and the process switch add to the drafting.
 * 2. The messages of a 27B-class shape (vocabulary 248320, blocks of 16): a proposal of 15
 *    tokens, with sampled distributions over a top-20 support or the full vocabulary, packed,
 *    sent to a second process (this program again, `--echo URL`), answered and unpacked.
 *
 * Prints microseconds and shares of a step. Usage: bench_split [steps] (default 300). */
#include <fcntl.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/bus.h"
#include "common/daemon.h"
#include "common/kvclient.h"
#include "draftd/propose.h"
#include "verifyd/spec.h"

#define BS_MODEL "tests/data/models/qwen35-tiny-f32.gguf"
#define BS_DRAFT "tests/data/drafter/dflash-b16"
#define BS_CTX 2048
#define BS_BIG_VOCAB 248320 /* Qwen3.5's vocabulary */

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n ? v[n / 2] : 0;
}

static pid_t spawn(const char *exe, const char *const *argv, const char *log)
{
    fflush(NULL);
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
    return pid;
}

/* --- 2: the echo end and the large-vocabulary messages ------------------------------------- */

static uint32_t *echo_ids;
static float *echo_p;

/* Answers a propose with n_draft tokens and, when it samples, distributions of top_k entries
 * (0: the full large vocabulary). */
static td_err echo_handle(void *user, const uint8_t *req, size_t len, msg_buf *reply)
{
    (void)user;
    msg_propose m;
    msg_header h;
    TD_TRY(msg_unpack_header(req, len, &h));
    TD_TRY(msg_unpack_propose(req, len, NULL, &m));
    static uint32_t tokens[MSG_DRAFT_MAX];
    msg_draft_q q[MSG_DRAFT_MAX];
    uint32_t support = m.sampler.top_k ? m.sampler.top_k : BS_BIG_VOCAB;
    for (uint32_t i = 0; i < m.n_draft; i++) {
        tokens[i] = i * 7919 % BS_BIG_VOCAB;
        q[i] = (msg_draft_q){echo_ids, echo_p, support};
    }
    msg_proposal out = {.seq_id = m.seq_id, .n_past = m.n_past, .tokens = tokens,
                        .n_tokens = m.n_draft, .q = q,
                        .n_q = m.sampler.temperature > 0 ? m.n_draft : 0};
    return msg_pack_proposal(reply, h.request_id, &out);
}

static int echo_main(const char *url)
{
    echo_ids = malloc(BS_BIG_VOCAB * sizeof *echo_ids);
    echo_p = malloc(BS_BIG_VOCAB * sizeof *echo_p);
    if (!echo_ids || !echo_p)
        return 1;
    for (uint32_t i = 0; i < BS_BIG_VOCAB; i++) {
        echo_ids[i] = i;
        echo_p[i] = 1.0f / BS_BIG_VOCAB;
    }
    daemon_signals();
    bus_server *srv;
    bus_opts o;
    bus_opts_default(&o);
    o.workers = 1;
    o.recv_timeout_ms = 100;
    if (bus_server_init(&srv, url, &o, echo_handle, NULL) != TD_OK)
        return 1;
    while (!daemon_stopping()) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    bus_server_free(srv);
    free(echo_ids);
    free(echo_p);
    return 0;
}

static void bench_messages(const char *dir, int calls)
{
    char url[BUS_URL_MAX], log[512];
    snprintf(url, sizeof url, "ipc://%s/echo.ipc", dir);
    snprintf(log, sizeof log, "%s/echo.log", dir);
    const char *argv[] = {"/proc/self/exe", "--echo", url, NULL};
    pid_t pid = spawn("/proc/self/exe", argv, log);
    bus_client *c;
    bus_opts o;
    bus_opts_default(&o);
    o.recv_max = (size_t)128 << 20;
    if (bus_client_init(&c, url, &o) != TD_OK)
        return;
    static const struct {
        const char *what;
        float temperature;
        uint32_t top_k;
    } kinds[] = {{"greedy: 15 tokens", 0.0f, 0},
                 {"sampled, top-20 support: 15 x 20 probabilities", 0.7f, 20},
                 {"sampled, full vocabulary: 15 x 248320 probabilities", 0.7f, 0}};
    printf("\nmessages of a vocabulary of %d, blocks of 16 (propose -> proposal between two "
           "processes):\n", BS_BIG_VOCAB);
    printf("  %-55s %10s %12s %12s\n", "proposal", "bytes", "pack+unpack", "round trip");
    msg_buf b;
    msg_buf_init(&b);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        int n = kinds[k].top_k == 0 && kinds[k].temperature > 0 ? calls / 20 + 3 : calls;
        double *rtt = malloc((size_t)n * sizeof *rtt), *codec = malloc((size_t)n * sizeof *codec);
        size_t bytes = 0;
        for (int i = -3; i < n; i++) {
            msg_propose req = {.seq_id = 1, .slot = 0, .n_past = 100, .pending = 5,
                               .n_draft = 15,
                               .sampler = {.temperature = kinds[k].temperature,
                                           .top_k = kinds[k].top_k, .top_p = 1.0f}};
            double t0 = now_us();
            if (msg_pack_propose(&b, (uint64_t)i + 10, &req) != TD_OK ||
                bus_client_call(c, b.data, b.len, &b, 30000) != TD_OK)
                break;
            double t1 = now_us();
            msg_proposal p;
            if (msg_unpack_proposal(b.data, b.len, NULL, &p) != TD_OK)
                break;
            double t2 = now_us();
            /* the server's pack of the same proposal costs about what unpack does here */
            msg_buf rb;
            msg_buf_init(&rb);
            msg_pack_proposal(&rb, 1, &p);
            double t3 = now_us();
            bytes = rb.len;
            msg_buf_free(&rb);
            msg_free_proposal(&p);
            if (i >= 0) {
                rtt[i] = t2 - t0;
                codec[i] = (t2 - t1) + (t3 - t2);
            }
        }
        printf("  %-55s %10zu %10.1f us %10.1f us\n", kinds[k].what, bytes, median(codec, n),
               median(rtt, n));
        free(rtt);
        free(codec);
    }
    msg_buf_free(&b);
    bus_client_free(c);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* --- 1: the tiny model with kvd and draftd --------------------------------------------------- */

typedef struct split_run {
    double *step, *rtt, *verify; /* [steps] microseconds */
} split_run;

static int bench_tiny(const char *dir, const char *exe_dir, int steps)
{
    char kvd[4200], draftd[4200], log[600], model[4096], draft[4096];
    double *t_in = NULL, *t_sp = NULL, *t_rtt = NULL, *t_draft = NULL, *t_ver = NULL;
    if (!realpath(BS_MODEL, model) || !realpath(BS_DRAFT, draft)) {
        fprintf(stderr, "bench_split: run from the source tree (needs %s)\n", BS_MODEL);
        return 1;
    }
    snprintf(kvd, sizeof kvd, "%s/kvd", exe_dir);
    snprintf(draftd, sizeof draftd, "%s/draftd", exe_dir);
    snprintf(log, sizeof log, "%s/daemons.log", dir);
    const char *kvd_argv[] = {kvd, "--runtime-dir", dir, "--slots", "1", NULL};
    const char *dd_argv[] = {draftd, "--runtime-dir", dir, "--model", model, "--draft", draft, NULL};
    pid_t pk = spawn(kvd, kvd_argv, log), pd = spawn(draftd, dd_argv, log);

    tgt_model *tm = NULL;
    dfl_model *dm = NULL;
    int rc = 1;
    bus_client *kvbus = NULL, *dd = NULL;
    kvc kv;
    kvc_init(&kv);
    if (tgt_load(&tm, model) != TD_OK ||
        dfl_load(&dm, draft, (uint32_t)tm->hp.n_layer, &tm->tok_embd, &tm->output) != TD_OK) {
        fprintf(stderr, "bench_split: %s\n", err_msg());
        goto out;
    }
    const tgt_hparams *hp = &tm->hp;
    uint32_t taps[DFLASH_MAX_TAPS];
    int32_t itaps[DFLASH_MAX_TAPS];
    for (uint32_t i = 0; i < dm->cfg.n_taps; i++)
        itaps[i] = (int32_t)(taps[i] = dm->cfg.target_layer_ids[i]);
    msg_kv_attach at = {
        .role = MSG_ROLE_VERIFYD, .pid = (uint32_t)getpid(), .taps = taps, .n_taps = dm->cfg.n_taps,
        .params = {.n_ctx = BS_CTX, .ring = BS_CTX, .block = dm->cfg.block_size,
                   .n_attn = (uint32_t)tm->n_attn_layers, .n_kv = (uint32_t)hp->n_head_kv,
                   .head_dim = (uint32_t)hp->head_dim, .n_delta = (uint32_t)tm->n_delta_layers,
                   .n_v_head = (uint32_t)hp->n_v_head, .d_k = (uint32_t)hp->d_k,
                   .d_v = (uint32_t)hp->d_v, .conv_k = (uint32_t)hp->conv_k,
                   .conv_ch = (uint32_t)hp->conv_ch, .n_taps = dm->cfg.n_taps,
                   .n_embd = (uint32_t)hp->n_embd,
                   .kv_bytes = tgt_kv_bytes(tm)},
    };
    char fd_path[600], url[BUS_URL_MAX];
    snprintf(fd_path, sizeof fd_path, "%s/kvd.sock", dir);
    td_err e = TD_ETIMEOUT;
    for (int i = 0; i < 200 && e != TD_OK; i++) { /* kvd starting */
        e = kvc_attach(&kv, fd_path, &at, 2000);
        if (e != TD_OK) {
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    snprintf(url, sizeof url, "ipc://%s/kvd.ipc", dir);
    msg_kv_slot slot;
    uint32_t prompt_u[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    msg_kv_open open = {.pid = (uint32_t)getpid(), .tokens = prompt_u, .n_tokens = 8};
    if (e != TD_OK || bus_client_init(&kvbus, url, NULL) != TD_OK ||
        kvc_open(kvbus, 1, &open, &slot, 5000) != TD_OK) {
        fprintf(stderr, "bench_split: kvd: %s\n", err_msg());
        goto out;
    }
    snprintf(url, sizeof url, "ipc://%s/draftd.ipc", dir);
    bus_client_init(&dd, url, NULL);

    const kvl_layout *l = &kv.lay;
    uint8_t *base = kvc_target_slot(&kv, slot.slot);
    tgt_state_mem mem = {
        .k = (float *)(base + l->k), .v = (float *)(base + l->v), .ssm = (float *)(base + l->ssm),
        .conv = (float *)(base + l->conv), .rec_ssm0 = (float *)(base + l->rec_ssm0),
        .rec_conv0 = (float *)(base + l->rec_conv0), .rec_xconv = (float *)(base + l->rec_xconv),
        .rec_qkv = (float *)(base + l->rec_qkv), .rec_gb = (float *)(base + l->rec_gb),
        .rec_cap = l->p.block,
    };
    ops_sampler greedy = {0};
    spec_cfg cfg = {.n_ctx = BS_CTX, .block = dm->cfg.block_size, .taps = itaps,
                    .n_taps = dm->cfg.n_taps, .state = &mem, .feat_ring = (float *)(base + l->feat),
                    .ring_rows = l->p.ring, .sampler = greedy};
    spec_seq in, sp;
    int32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[SPEC_MAX_BLOCK], first;
    t_in = calloc((size_t)steps, sizeof(double));
    t_sp = calloc((size_t)steps, sizeof(double));
    t_rtt = calloc((size_t)steps, sizeof(double));
    t_draft = calloc((size_t)steps, sizeof(double));
    t_ver = calloc((size_t)steps, sizeof(double));
    if (!t_in || !t_sp || !t_rtt || !t_draft || !t_ver ||
        spec_init(&in, tm, dm, BS_CTX, BS_CTX, &greedy) != TD_OK ||
        spec_init_cfg(&sp, tm, &cfg) != TD_OK) {
        fprintf(stderr, "bench_split: %s\n", err_msg());
        goto out;
    }
    /* one process: draft + verify */
    int64_t n;
    spec_prefill(&in, prompt, 8, &first);
    for (int i = 0; i < steps; i++) {
        if (spec_room(&in) < 2 * (int64_t)dm->cfg.block_size)
            spec_prefill(&in, prompt, 8, &first);
        double d0 = in.stats.t_draft, t0 = now_us();
        spec_step(&in, out, &n);
        t_in[i] = now_us() - t0;
        t_draft[i] = (in.stats.t_draft - d0) * 1e6;
    }
    /* two processes: propose to draftd, verify here */
    msg_buf b;
    msg_buf_init(&b);
    uint64_t rid = 1;
    spec_prefill(&sp, prompt, 8, &first);
    for (int i = 0; i < steps; i++) {
        if (spec_room(&sp) < 2 * (int64_t)dm->cfg.block_size)
            spec_prefill(&sp, prompt, 8, &first);
        int64_t B = dm->cfg.block_size;
        int32_t block[SPEC_MAX_BLOCK] = {sp.pending};
        double t0 = now_us();
        msg_propose req = {.seq_id = 1, .slot = slot.slot, .slot_gen = slot.slot_gen,
                           .pool_gen = kv.target_gen, .n_past = (uint32_t)sp.ts.n_past,
                           .pending = (uint32_t)sp.pending, .n_draft = (uint32_t)(B - 1),
                           .sampler = {.top_p = 1.0f}};
        msg_proposal p;
        if (msg_pack_propose(&b, rid++, &req) != TD_OK ||
            bus_client_call(dd, b.data, b.len, &b, 30000) != TD_OK ||
            msg_unpack_proposal(b.data, b.len, NULL, &p) != TD_OK) {
            fprintf(stderr, "bench_split: propose: %s\n", err_msg());
            goto out;
        }
        for (int64_t j = 1; j < B; j++)
            block[j] = (int32_t)p.tokens[j - 1];
        msg_free_proposal(&p);
        double t1 = now_us();
        spec_verify(&sp, block, B, NULL, out, &n);
        double t2 = now_us();
        t_sp[i] = t2 - t0;
        t_rtt[i] = t1 - t0;
        t_ver[i] = t2 - t1;
    }
    msg_buf_free(&b);
    double m_in = median(t_in, steps), m_sp = median(t_sp, steps);
    double m_rtt = median(t_rtt, steps), m_draft = median(t_draft, steps);
    double m_ver = median(t_ver, steps);
    printf("tiny model (%s, drafter %s), greedy, %d steps of 16-token blocks, medians:\n",
           BS_MODEL, BS_DRAFT, steps);
    printf("  one process:   step %9.1f us (draft %.1f us)\n", m_in, m_draft);
    printf("  two processes: step %9.1f us (propose round trip %.1f us, verify %.1f us)\n", m_sp,
           m_rtt, m_ver);
    printf("  split cost:    %9.1f us per step, %.1f%% of the one-process step\n", m_sp - m_in,
           100.0 * (m_sp - m_in) / m_in);
    printf("  messages and process switch: %.1f us per step (round trip - drafting), %.1f%%\n",
           m_rtt - m_draft, 100.0 * (m_rtt - m_draft) / m_in);
    spec_free(&in);
    spec_free(&sp);
    rc = 0;
out:
    free(t_in), free(t_sp), free(t_rtt), free(t_draft), free(t_ver);
    bus_client_free(dd);
    bus_client_free(kvbus);
    kvc_detach(&kv);
    dfl_free(dm);
    tgt_free(tm);
    kill(pd, SIGTERM);
    kill(pk, SIGTERM);
    waitpid(pd, NULL, 0);
    waitpid(pk, NULL, 0);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--echo"))
        return echo_main(argv[2]);
    int steps = argc > 1 ? atoi(argv[1]) : 300;
    if (steps < 1) {
        fprintf(stderr, "usage: bench_split [steps >= 1]\n");
        return 2;
    }
    omp_set_num_threads(1); /* the two ends share the machine's cores: keep them comparable */
    setenv("OMP_NUM_THREADS", "1", 1);
    char dir[] = "/tmp/tandem-bench-XXXXXX", exe_dir[4096];
    ssize_t n = readlink("/proc/self/exe", exe_dir, sizeof exe_dir - 1);
    if (!mkdtemp(dir) || n <= 0)
        return 1;
    exe_dir[n] = '\0';
    *strrchr(exe_dir, '/') = '\0';
    setenv("TANDEM_RUNTIME_DIR", dir, 1);
    int rc = bench_tiny(dir, exe_dir, steps);
    bench_messages(dir, steps);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_split: cannot remove %s\n", dir);
    return rc;
}
