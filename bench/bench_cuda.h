/* What the CUDA benchmarks share: error exits naming the program (BENCH_NAME), a
 * reproducible random source, host allocation that exits when memory runs out, the median of
 * runs, the device's start and end, and CUDA event timing on one stream. Included by one source file per program (static
 * definitions). */
#ifndef TANDEM_BENCH_CUDA_H
#define TANDEM_BENCH_CUDA_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "common/err.h"
#include "kernels/cuda_mem.h"
#include "kernels/ops.h"

#ifndef BENCH_NAME
#error "define BENCH_NAME (the program's name, for error messages) before bench_cuda.h"
#endif

#define TRY(expr)                                                                            \
    do {                                                                                     \
        td_err try_e_ = (expr);                                                              \
        if (try_e_ != TD_OK) {                                                               \
            fprintf(stderr, BENCH_NAME ": %s: %s\n", #expr, err_msg());                      \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define CU(expr)                                                                             \
    do {                                                                                     \
        cudaError_t cu_e_ = (expr);                                                          \
        if (cu_e_ != cudaSuccess) {                                                          \
            fprintf(stderr, BENCH_NAME ": %s: %s\n", #expr, cudaGetErrorString(cu_e_));      \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

/* malloc that exits with a message when the host is out of memory */
static void *bench_alloc(size_t bytes)
{
    void *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, BENCH_NAME ": out of host memory\n");
        exit(1);
    }
    return p;
}

static ops_stream st;
static cudaEvent_t ev0, ev1;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float rnd(void) /* uniform in [-1, 1) */
{
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (float)((double)((rng * 0x2545F4914F6CDD1Dull) >> 11) * 0x1p-52 - 1.0);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* Makes st, ev0 and ev1 and returns the device's properties; exits 1 with a message when
 * there is no usable CUDA device. */
static struct cudaDeviceProp bench_cuda_start(void)
{
    if (!cuda_available()) {
        printf(BENCH_NAME ": no usable CUDA device\n");
        exit(1);
    }
    TRY(cuda_stream_create(&st));
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));
    struct cudaDeviceProp prop;
    int dev = 0;
    CU(cudaGetDevice(&dev));
    CU(cudaGetDeviceProperties(&prop, dev));
    return prop;
}

static void bench_cuda_end(void)
{
    CU(cudaEventDestroy(ev0));
    CU(cudaEventDestroy(ev1));
    cuda_stream_free(st);
}

/* Elapsed milliseconds between ev0 and ev1 after both were recorded on st. */
static double elapsed_ms(void)
{
    float ms = 0;
    CU(cudaEventSynchronize(ev1));
    CU(cudaEventElapsedTime(&ms, ev0, ev1));
    return ms;
}

#ifdef __CUDACC__
/* An acquire load of a counter other blocks raise with release adds (device code of the
 * .cu benchmarks). */
__device__ __forceinline__ unsigned load_acquire(const unsigned *p)
{
    unsigned v = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
    v = *(volatile const unsigned *)p;
#endif
    return v;
}
#endif

/* Instantiates the recorded graph g, replays it `warm` times on st, then times `reps`
 * replays one at a time and returns the fastest in milliseconds; destroys g. */
static inline double bench_graph_best_ms(cudaGraph_t g, int warm, int reps)
{
    cudaStream_t s = (cudaStream_t)st;
    cudaGraphExec_t ge;
    CU(cudaGraphInstantiate(&ge, g, 0));
    for (int w = 0; w < warm; w++)
        CU(cudaGraphLaunch(ge, s));
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        CU(cudaEventRecord(ev0, s));
        CU(cudaGraphLaunch(ge, s));
        CU(cudaEventRecord(ev1, s));
        const double ms = elapsed_ms();
        best = ms < best ? ms : best;
    }
    CU(cudaGraphExecDestroy(ge));
    CU(cudaGraphDestroy(g));
    return best;
}

/* The options of a benchmark that times a table of cases: --case NAME (only that one) and
 * --calls N (1..100000, calls per timed run). Returns false after printing the usage for
 * anything else. */
static inline bool bench_case_args(int argc, char **argv, const char **only, int *calls)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--case") == 0 && i + 1 < argc) {
            *only = argv[++i];
        } else if (strcmp(argv[i], "--calls") == 0 && i + 1 < argc) {
            *calls = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: " BENCH_NAME " [--case NAME] [--calls N]\n");
            return false;
        }
    }
    if (*calls < 1 || *calls > 100000) {
        fprintf(stderr, BENCH_NAME ": --calls must be 1..100000\n");
        return false;
    }
    return true;
}

#endif
