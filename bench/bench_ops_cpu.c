/* CPU matmul throughput: weight bytes read per second for a square matrix of each supported
 * type at batch 1 (decode) and 16 (a speculative verify block), and for Q4_K and Q6_K read
 * with inputs rounded to bf16 (x_bf16, the drafter's products; rows marked "/xb"). At batch 1
 * the number to compare with is the machine's memory bandwidth.
 *
 * usage: bench_ops_cpu [n (default 4096)] [seconds per measurement (default 0.5)]
 * Threads: OMP_NUM_THREADS. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <omp.h>

#include "kernels/ops.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per call of y = x . W^T, averaged over at least min_s of calls. */
static double time_matmul(float *y, const float *x, const ops_weight *w, int64_t n_tok,
                          double min_s)
{
    cpu_matmul(y, x, w, n_tok); /* warm the caches and the thread team */
    int reps = 0;
    double t0 = now_s(), t;
    do {
        cpu_matmul(y, x, w, n_tok);
        reps++;
        t = now_s() - t0;
    } while (t < min_s);
    return t / reps;
}

int main(int argc, char **argv)
{
    const int64_t n = argc > 1 ? atoll(argv[1]) : 4096;
    const double min_s = argc > 2 ? atof(argv[2]) : 0.5;
    if (n <= 0 || n % 256 != 0 || min_s <= 0) {
        fprintf(stderr, "usage: %s [n: a multiple of 256] [seconds > 0]\n", argv[0]);
        return 2;
    }
    static const struct {
        td_dtype type;
        bool x_bf16;
    } types[] = {{TD_F32, false},  {TD_F16, false},  {TD_BF16, false}, {TD_Q8_0, false},
                 {TD_Q6_K, false}, {TD_Q5_K, false}, {TD_Q4_K, false}, {TD_Q6_K, true},
                 {TD_Q4_K, true}};
    const int64_t batches[] = {1, 16};

    float *src = malloc((size_t)(n * n) * sizeof *src);
    float *x = malloc((size_t)(16 * n) * sizeof *x);
    float *y = malloc((size_t)(16 * n) * sizeof *y);
    void *q = malloc((size_t)(n * n) * sizeof(float)); /* F32 is the largest row */
    if (!src || !x || !y || !q) {
        fprintf(stderr, "out of memory for a %lldx%lld matrix\n", (long long)n, (long long)n);
        return 1;
    }
    srand(1);
    for (int64_t i = 0; i < n * n; i++)
        src[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (int64_t i = 0; i < 16 * n; i++)
        x[i] = (float)rand() / (float)RAND_MAX - 0.5f;

    printf("matmul %lldx%lld, %d threads\n", (long long)n, (long long)n, omp_get_max_threads());
    printf("%-7s %9s %12s %12s %12s %12s\n", "type", "MiB", "T=1 ms", "T=1 GB/s", "T=16 ms",
           "T=16 GB/s");
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const td_dtype type = types[i].type;
        ops_weight w;
        if (ops_weight_init(&w, type, n, n, q) != TD_OK) {
            fprintf(stderr, "%s: %s\n", dtype_name(type), err_msg());
            return 1;
        }
        for (int64_t r = 0; r < n; r++)
            if (cpu_quantize_row(type, src + r * n, (char *)q + r * w.row_bytes, n) != TD_OK) {
                fprintf(stderr, "%s: %s\n", dtype_name(type), err_msg());
                return 1;
            }
        w.x_bf16 = types[i].x_bf16;
        const double bytes = (double)w.row_bytes * (double)n;
        char name[16];
        snprintf(name, sizeof name, "%s%s", dtype_name(type), w.x_bf16 ? "/xb" : "");
        printf("%-7s %9.1f", name, bytes / (1 << 20));
        for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
            double s = time_matmul(y, x, &w, batches[b], min_s);
            printf(" %12.3f %12.2f", s * 1e3, bytes / s / 1e9);
        }
        printf("\n");
        fflush(stdout);
    }
    free(src);
    free(x);
    free(y);
    free(q);
    return 0;
}
