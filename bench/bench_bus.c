/* bench_bus: what one message costs between two real processes.
 * Prints the round-trip latency of a small request (ping -> pong over ipc://, through
 * bus_client_call and a bus server) in microseconds: median, p99 and mean over N calls after
 * a warm-up, with the caller sleeping until the reply and polling for it (verifyd's link to
 * draftd on a GPU, DLINK_SPIN_US); and the CPU cost of packing + unpacking a ping and a gen_start (512-token prompt).
 * Usage: bench_bus [calls] [ping data bytes] (defaults 20000, 16). The program starts itself
 * (fork + exec) as the server, in the runtime directory bus_runtime_dir picks. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/bus.h"
#include "common/msg.h"
#include "verifyd/dlink.h"

#define SERVER_FLAG "--bench-server"
#define WARMUP 1000
#define TIMEOUT_MS 10000

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The server: answers a ping with the pong that echoes it. */
static td_err echo(void *user, const uint8_t *req, size_t len, msg_buf *reply)
{
    (void)user;
    msg_ping p;
    uint64_t rid;
    TD_TRY(msg_unpack_ping(req, len, &rid, &p));
    return msg_pack_pong(reply, rid, &p);
}

static int server_main(const char *url)
{
    /* Blocked before the server's threads start, so only sigwait sees SIGTERM. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    bus_server *s;
    if (bus_server_init(&s, url, NULL, echo, NULL) != TD_OK) {
        fprintf(stderr, "bench server: %s\n", err_msg());
        return 1;
    }
    int sig;
    sigwait(&set, &sig);
    bus_server_free(s);
    return 0;
}

/* Round-trip latency through the bus, one call at a time; spin_us: bus_opts.spin_us. */
static int bench_round_trip(const char *url, int calls, uint32_t data_len, int32_t spin_us)
{
    bus_client *c;
    bus_opts o;
    bus_opts_default(&o);
    o.spin_us = spin_us;
    if (bus_client_init(&c, url, &o) != TD_OK) {
        fprintf(stderr, "bench_bus: %s\n", err_msg());
        return 1;
    }
    uint8_t *data = calloc(1, data_len ? data_len : 1);
    double *us = malloc((size_t)calls * sizeof *us);
    msg_buf req, reply;
    msg_buf_init(&req);
    msg_buf_init(&reply);
    int rc = 0;
    for (int i = -WARMUP; i < calls && data && us; i++) {
        msg_ping p = {.nonce = (uint64_t)i, .data = data, .data_len = data_len};
        msg_ping got;
        uint64_t rid = 0;
        double t0 = now_us();
        if (msg_pack_ping(&req, (uint64_t)(i + WARMUP), &p) != TD_OK ||
            bus_client_call(c, req.data, req.len, &reply, TIMEOUT_MS) != TD_OK ||
            msg_unpack_pong(reply.data, reply.len, &rid, &got) != TD_OK ||
            rid != (uint64_t)(i + WARMUP) || got.nonce != (uint64_t)i) {
            fprintf(stderr, "bench_bus: call %d: %s\n", i, err_msg());
            rc = 1;
            break;
        }
        if (i >= 0)
            us[i] = now_us() - t0;
    }
    if (rc == 0 && data && us) {
        double sum = 0;
        for (int i = 0; i < calls; i++)
            sum += us[i];
        qsort(us, (size_t)calls, sizeof us[0], cmp_double);
        char how[48] = "sleeping";
        if (spin_us > 0)
            snprintf(how, sizeof how, "polling up to %d us", (int)spin_us);
        printf("bus round trip (ping/pong, %u data bytes, %d calls after %d warm-up, %s): "
               "median %.1f us, p99 %.1f us, mean %.1f us\n",
               data_len, calls, WARMUP, how, us[calls / 2], us[(size_t)(calls - 1) * 99 / 100],
               sum / calls);
    }
    msg_buf_free(&req);
    msg_buf_free(&reply);
    free(us);
    free(data);
    bus_client_free(c);
    return rc;
}

/* CPU cost of msgpack pack + unpack, no I/O. */
static void bench_codec(void)
{
    enum { REPS = 200000, PROMPT = 512 };
    static uint32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = (uint32_t)(i * 2654435761u) % 248320u;
    static const uint32_t stop[2] = {248044, 248046};
    msg_buf b;
    msg_buf_init(&b);

    uint8_t data[16] = {0};
    msg_ping p = {.nonce = 1, .data = data, .data_len = 16}, got;
    double t0 = now_us();
    for (int i = 0; i < REPS; i++)
        if (msg_pack_ping(&b, (uint64_t)i, &p) != TD_OK ||
            msg_unpack_ping(b.data, b.len, NULL, &got) != TD_OK)
            abort();
    double ping_ns = (now_us() - t0) * 1e3 / REPS;
    size_t ping_bytes = b.len;

    msg_gen_start gs = {.seq_id = 7, .prompt = prompt, .n_prompt = PROMPT, .max_tokens = 256,
                        .sampler = {.temperature = 0.6f, .top_k = 20, .top_p = 0.95f},
                        .stop = stop, .n_stop = 2};
    msg_gen_start gs_got;
    t0 = now_us();
    for (int i = 0; i < REPS / 20; i++) {
        if (msg_pack_gen_start(&b, (uint64_t)i, &gs) != TD_OK ||
            msg_unpack_gen_start(b.data, b.len, NULL, &gs_got) != TD_OK)
            abort();
        msg_free_gen_start(&gs_got);
    }
    double gs_us = (now_us() - t0) / (REPS / 20);
    printf("msgpack pack+unpack: ping (%zu bytes) %.0f ns; gen_start with a %d-token prompt "
           "(%zu bytes) %.2f us\n",
           ping_bytes, ping_ns, PROMPT, b.len, gs_us);
    msg_buf_free(&b);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], SERVER_FLAG) == 0)
        return server_main(argv[2]);
    int calls = argc > 1 ? atoi(argv[1]) : 20000;
    long data_len = argc > 2 ? atol(argv[2]) : 16;
    if (calls < 1 || data_len < 0 || data_len > (long)MSG_PING_DATA_MAX) {
        fprintf(stderr, "usage: bench_bus [calls >= 1] [ping data bytes 0..%u]\n",
                MSG_PING_DATA_MAX);
        return 2;
    }
    char service[32], url[BUS_URL_MAX];
    snprintf(service, sizeof service, "bench-bus-%d", (int)getpid());
    if (bus_endpoint(url, sizeof url, service) != TD_OK) {
        fprintf(stderr, "bench_bus: %s\n", err_msg());
        return 1;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("bench_bus: fork");
        return 1;
    }
    if (pid == 0) {
        /* NNG is never used between fork and exec: the server is a fresh process. */
        execl("/proc/self/exe", argv[0], SERVER_FLAG, url, (char *)NULL);
        _exit(127);
    }
    int rc = bench_round_trip(url, calls, (uint32_t)data_len, 0);
    if (rc == 0)
        rc = bench_round_trip(url, calls, (uint32_t)data_len, DLINK_SPIN_US);
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "bench_bus: server exited abnormally (status %d)\n", status);
        rc = 1;
    }
    bench_codec();
    return rc;
}
