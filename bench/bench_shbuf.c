/* bench_shbuf: what sharing a cpu buffer costs between two real processes.
 * Prints, in microseconds (median and p99 over N iterations after warm-up):
 * - fdpass round trip: one message with one fd to the peer and a reply back;
 * - create + export + send + peer import + peer release + reply, for a 64 MiB buffer;
 * and the bandwidth of the peer reading the whole buffer once it is mapped (GB/s).
 * Usage: bench_shbuf [iterations] (default 200). The program starts itself as the peer. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/fdpass.h"
#include "common/shbuf.h"

#define BENCH_CHILD_FLAG "--bench-peer"
#define BENCH_SIZE ((uint64_t)64 << 20) /* bytes per shared buffer */
#define TIMEOUT_MS 10000

typedef struct bench_msg {
    char op;         /* 'p' ping, 'i' import, 'r' read all, 'q' quit */
    shbuf_desc desc; /* 'i' and 'r': the buffer that came with the fd */
    double value;    /* peer's answer to 'r': seconds spent reading */
} bench_msg;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void print_stats(const char *what, double *us, int n)
{
    qsort(us, (size_t)n, sizeof us[0], cmp_double);
    printf("%-44s median %9.1f us   p99 %9.1f us\n", what, us[n / 2], us[(n * 99) / 100]);
}

/* The peer: answers each message; imports and releases buffers it is sent. */
static int peer_main(int sock)
{
    for (;;) {
        bench_msg m;
        size_t len, n;
        int fd = -1;
        if (fdpass_recv(sock, &m, sizeof m, &len, &fd, 1, &n, TIMEOUT_MS) != TD_OK)
            return 1;
        if (m.op == 'q')
            return 0;
        m.value = 0;
        if (m.op == 'i' || m.op == 'r') {
            shbuf *sb;
            if (n != 1 || shbuf_import(&sb, &m.desc, fd) != TD_OK) {
                fprintf(stderr, "peer: %s\n", err_msg());
                return 1;
            }
            if (m.op == 'r') {
                const uint64_t *p = shbuf_host(sb);
                double t0 = now_s();
                uint64_t sum = 0;
                for (size_t i = 0; i < shbuf_size(sb) / 8; i++)
                    sum += p[i];
                m.value = now_s() - t0 + (sum == 1 ? 1e-12 : 0); /* keep the loop */
            }
            shbuf_release(sb);
        }
        if (n == 1)
            close(fd);
        if (fdpass_send(sock, &m, sizeof m, NULL, 0, TIMEOUT_MS) != TD_OK)
            return 1;
    }
}

static void round_trip(int sock, bench_msg *m, int fd)
{
    size_t len, n;
    int rfd;
    if (fdpass_send(sock, m, sizeof *m, &fd, fd >= 0, TIMEOUT_MS) != TD_OK ||
        fdpass_recv(sock, m, sizeof *m, &len, &rfd, 1, &n, TIMEOUT_MS) != TD_OK) {
        fprintf(stderr, "bench_shbuf: %s\n", err_msg());
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], BENCH_CHILD_FLAG) == 0)
        return peer_main(atoi(argv[2]));
    int iters = argc > 1 ? atoi(argv[1]) : 200;
    if (iters < 10)
        iters = 10;
    int sv[2];
    if (fdpass_socketpair(sv) != TD_OK)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        char fdstr[16];
        snprintf(fdstr, sizeof fdstr, "%d", sv[1]);
        close(sv[0]);
        fcntl(sv[1], F_SETFD, 0);
        execl("/proc/self/exe", argv[0], BENCH_CHILD_FLAG, fdstr, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    int sock = sv[0];
    double *us = calloc((size_t)iters, sizeof *us);

    shbuf *probe;
    if (shbuf_create(&probe, SHBUF_KIND_CPU, "bench.probe", 4096, NULL) != TD_OK)
        return 1;
    shbuf_desc pdesc;
    int pfd;
    shbuf_export(probe, &pdesc, &pfd);
    for (int i = -10; i < iters; i++) {
        bench_msg m = {.op = 'p'};
        double t0 = now_s();
        round_trip(sock, &m, pfd);
        if (i >= 0)
            us[i] = (now_s() - t0) * 1e6;
    }
    print_stats("fdpass round trip (1 fd)", us, iters);

    for (int i = -3; i < iters; i++) {
        double t0 = now_s();
        shbuf *sb;
        shbuf_desc desc;
        int fd;
        if (shbuf_create(&sb, SHBUF_KIND_CPU, "bench.buf", BENCH_SIZE, NULL) != TD_OK ||
            shbuf_export(sb, &desc, &fd) != TD_OK) {
            fprintf(stderr, "bench_shbuf: %s\n", err_msg());
            return 1;
        }
        bench_msg m = {.op = 'i', .desc = desc};
        round_trip(sock, &m, fd);
        close(fd);
        shbuf_release(sb);
        if (i >= 0)
            us[i] = (now_s() - t0) * 1e6;
    }
    print_stats("64 MiB create+export+import+release", us, iters);

    shbuf *sb;
    shbuf_desc desc;
    int fd;
    if (shbuf_create(&sb, SHBUF_KIND_CPU, "bench.read", BENCH_SIZE, NULL) != TD_OK ||
        shbuf_export(sb, &desc, &fd) != TD_OK)
        return 1;
    memset(shbuf_host(sb), 1, BENCH_SIZE);
    bench_msg m = {.op = 'r', .desc = desc};
    round_trip(sock, &m, fd);
    printf("%-44s %9.2f GB/s (first touch of the mapping included)\n", "peer reads 64 MiB",
           (double)BENCH_SIZE / m.value * 1e-9);
    close(fd);
    shbuf_release(sb);

    m.op = 'q';
    fdpass_send(sock, &m, sizeof m, NULL, 0, TIMEOUT_MS);
    int status;
    waitpid(pid, &status, 0);
    close(pfd);
    shbuf_release(probe);
    free(us);
    close(sock);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
