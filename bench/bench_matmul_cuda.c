/* bench_matmul_cuda: how close cuda_matmul comes to the GPU's memory bandwidth on the 27B
 * target's shapes (hidden 5120, FFN 17408, DeltaNet qkv 10240, attention q 12288, value
 * heads 6144, LM head 248320), per weight type, for 1 token (decode), 16 / 32 tokens
 * (a speculative verify block) and 64 (a prefill chunk).
 *
 * First it measures the copy bandwidth (device-to-device cudaMemcpy of 4 GiB, counting the
 * bytes read plus the bytes written), the practical ceiling of a kernel that only streams.
 * Then for each (shape, type): the time per call (CUDA events around back-to-back calls,
 * median of several runs, rotating over enough copies of the weights that L2 cannot keep
 * them), the weight bytes per second, that as a fraction of the copy bandwidth, and the
 * times of 16, 32 and 64 tokens relative to 1. Prints a table, then the same numbers as JSON.
 *
 * The kernels are chosen once per process (TANDEM_MMD for one token, TANDEM_MMQ for more),
 * so before anything else the program measures one token under each of TANDEM_MMD=bulk (the
 * sm_90 bulk-copy kernel), =regs (dp4a) and =mma (tensor cores), and 16 and 64 tokens under
 * TANDEM_MMQ=mmq (the tensor-core kernel, where on sm_90 9-16 tokens default to the window
 * kernel and 17-64 to the wide kernel), and F16/BF16 at 16 tokens under TANDEM_MMH=regs (the
 * register path, where large grids default to loading the activations ahead), in a child
 * process each, one after the other (the GPU is never shared), and prints those as extra
 * columns beside the default choice's.
 * Runs in about two minutes on an H100/H200-class GPU. Options narrow it down, e.g. to put one
 * kernel under a profiler: --shape NAME (a shape of the table, e.g. ffn_down), --type T
 * (e.g. Q4_K), --no-variants (no child processes: the default kernels only), --resident (one
 * copy of the weights, so that those smaller than L2 are read from it after the first call:
 * how fast the kernels go when their weights need not come from memory), --x-bf16 (every
 * product reads its inputs rounded to bf16, ops_weight.x_bf16: the drafter's products under
 * TANDEM_DRAFT_ACT=bf16, e.g. the Q6_K LM head at 16 tokens on its own kernel). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "kernels/cuda_mem.h"
#include "kernels/ops.h"

#ifndef TANDEM_HAVE_CUDA

int main(void)
{
    printf("bench_matmul_cuda: this build has no CUDA\n");
    return 1;
}

#else

#define BENCH_NAME "bench_matmul_cuda"
#include "bench/bench_cuda.h"

#define COPY_BYTES ((size_t)4 << 30)   /* copied per bandwidth run */
#define ROTATE_BYTES ((size_t)512 << 20) /* weight copies per shape: ~10x an H100/H200 L2 */
#define MAX_COPIES 16
#define RUNS 7                          /* timed runs, median taken */
#define CALLS 24                        /* calls per timed run */
#define MAX_TOK 64

typedef struct shape {
    const char *name;
    int64_t cols, rows; /* in -> out */
    bool lm_head;       /* only the type the 27B Q4_K_M file uses for it */
} shape;

static const shape shapes[] = {
    {"ffn_gate/up", 5120, 17408, false}, {"ffn_down", 17408, 5120, false},
    {"attn_qkv", 5120, 10240, false},    {"attn_q", 5120, 12288, false},
    {"ssm/attn_out", 6144, 5120, false}, {"lm_head", 5120, 248320, true},
};

static const td_dtype types[] = {TD_F32, TD_F16, TD_BF16, TD_Q8_0, TD_Q4_K, TD_Q5_K, TD_Q6_K};
static const int64_t toks[] = {1, 16, 32, 64};
#define N_TOKS (sizeof toks / sizeof toks[0])

/* The kernels measured in child processes: column name, the variable that picks the
 * kernel and its value, which token count (toks[]) is timed, and whether it picks among
 * the F16/BF16 kernels (else the quantised ones). */
typedef struct variant {
    const char *name, *env, *value;
    size_t tok; /* index into toks */
    bool half;
} variant;
static const variant variants[] = {{"bulk", "TANDEM_MMD", "bulk", 0, false},
                                   {"regs", "TANDEM_MMD", "regs", 0, false},
                                   {"mma", "TANDEM_MMD", "mma", 0, false},
                                   {"mmq16", "TANDEM_MMQ", "mmq", 1, false},
                                   {"mmq64", "TANDEM_MMQ", "mmq", 3, false},
                                   {"regs16", "TANDEM_MMH", "regs", 1, true}};
#define N_VARIANTS (sizeof variants / sizeof variants[0])

typedef struct result {
    const shape *s;
    td_dtype type;
    size_t bytes;             /* weight bytes read per call */
    double us[N_TOKS];        /* median time per call, microseconds */
    double us_v[N_VARIANTS];  /* the time of variants[i]; 0: not measured */
} result;

/* Device-to-device copy bandwidth in GB/s (bytes read + bytes written). */
static double copy_bandwidth(void)
{
    size_t free_b = 0, total_b = 0;
    CU(cudaMemGetInfo(&free_b, &total_b));
    size_t n = COPY_BYTES;
    while (2 * n + ((size_t)1 << 30) > free_b && n > ((size_t)256 << 20))
        n /= 2;
    void *a = NULL, *b = NULL;
    TRY(cuda_mem_alloc(&a, n));
    TRY(cuda_mem_alloc(&b, n));
    TRY(cuda_mem_fill(a, 0x11, n, st));
    TRY(cuda_mem_copy(b, a, n, st)); /* warm-up */
    double gbps[5];
    for (int r = 0; r < 5; r++) {
        CU(cudaEventRecord(ev0, (cudaStream_t)st));
        TRY(cuda_mem_copy(r & 1 ? a : b, r & 1 ? b : a, n, st));
        CU(cudaEventRecord(ev1, (cudaStream_t)st));
        gbps[r] = 2.0 * (double)n / (elapsed_ms() * 1e-3) / 1e9;
    }
    cuda_mem_free(a);
    cuda_mem_free(b);
    if (n != COPY_BYTES)
        printf("(copy of %zu MiB: not enough free memory for 4 GiB)\n", n >> 20);
    return median(gbps, 5);
}

/* One (shape, type): fills `copies` device copies of a random weight (16 quantised random
 * rows repeated), then times each of the first n_toks token counts. */
static bool resident; /* --resident: one copy of the weights */
static bool x_bf16;   /* --x-bf16: the weights' x_bf16 */

static void bench_one(result *res, const shape *s, td_dtype type, const float *dx, float *dy,
                      size_t n_toks)
{
    uint64_t rb64 = 0;
    TRY(dtype_bytes(type, (uint64_t)s->cols, &rb64));
    const size_t rb = (size_t)rb64, bytes = rb * (size_t)s->rows;
    int copies = (int)((ROTATE_BYTES + bytes - 1) / bytes);
    copies = copies < 2 ? 2 : copies > MAX_COPIES ? MAX_COPIES : copies;
    if (resident)
        copies = 1;

    /* 16 random rows, quantised on the host */
    enum { TILE = 16 };
    float *f = bench_alloc((size_t)s->cols * sizeof(float));
    uint8_t *tile = bench_alloc(TILE * rb);
    for (int r = 0; r < TILE; r++) {
        for (int64_t i = 0; i < s->cols; i++)
            f[i] = rnd();
        TRY(cpu_quantize_row(type, f, tile + (size_t)r * rb, s->cols));
    }
    uint8_t *w[MAX_COPIES];
    for (int c = 0; c < copies; c++)
        TRY(cuda_mem_alloc((void **)&w[c], bytes));
    /* the tile, then doubling copies within the first matrix, then the other copies */
    size_t have = TILE * rb < bytes ? TILE * rb : bytes;
    TRY(cuda_mem_upload(w[0], tile, have, st));
    while (have < bytes) {
        size_t n = have < bytes - have ? have : bytes - have;
        TRY(cuda_mem_copy(w[0] + have, w[0], n, st));
        have += n;
    }
    for (int c = 1; c < copies; c++)
        TRY(cuda_mem_copy(w[c], w[0], bytes, st));
    free(f);
    free(tile);

    ops_weight wt[MAX_COPIES];
    for (int c = 0; c < copies; c++) {
        TRY(ops_weight_init(&wt[c], type, s->rows, s->cols, w[c]));
        wt[c].x_bf16 = x_bf16;
    }
    res->s = s;
    res->type = type;
    res->bytes = bytes;
    for (size_t k = 0; k < n_toks; k++) {
        for (int c = 0; c < copies; c++) /* warm-up: scratch, first touches */
            TRY(cuda_matmul(dy, dx, &wt[c], toks[k], st));
        double us[RUNS];
        for (int r = 0; r < RUNS; r++) {
            CU(cudaEventRecord(ev0, (cudaStream_t)st));
            for (int i = 0; i < CALLS; i++)
                TRY(cuda_matmul(dy, dx, &wt[(r * CALLS + i) % copies], toks[k], st));
            CU(cudaEventRecord(ev1, (cudaStream_t)st));
            us[r] = elapsed_ms() * 1e3 / CALLS;
        }
        res->us[k] = median(us, RUNS);
    }
    TRY(cuda_stream_sync(st));
    for (int c = 0; c < copies; c++)
        cuda_mem_free(w[c]);
}

static const char *only_shape, *only_type; /* --shape, --type: NULL for all */

/* The (shape, type) pairs in table order: the LM head only in the type the 27B file uses,
 * and only those --shape and --type name. */
static bool measured(size_t i, size_t k)
{
    if (only_shape && strcmp(only_shape, shapes[i].name) != 0)
        return false;
    if (only_type && strcasecmp(only_type, dtype_name(types[k])) != 0)
        return false;
    return !shapes[i].lm_head || types[k] == TD_Q6_K;
}

static bool is_quant(td_dtype t)
{
    return t != TD_F32 && t != TD_F16 && t != TD_BF16;
}

enum { MAX_RES = sizeof shapes / sizeof *shapes * sizeof types / sizeof *types };

/* Device copies of MAX_TOK random input rows (the same numbers in every process: rnd()'s
 * state is untouched before) and room for the outputs. */
static void io_init(float **dx, float **dy)
{
    int64_t max_cols = 0, max_rows = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        max_cols = shapes[i].cols > max_cols ? shapes[i].cols : max_cols;
        max_rows = shapes[i].rows > max_rows ? shapes[i].rows : max_rows;
    }
    float *hx = bench_alloc((size_t)(MAX_TOK * max_cols) * sizeof(float));
    for (int64_t i = 0; i < MAX_TOK * max_cols; i++)
        hx[i] = rnd();
    TRY(cuda_mem_alloc((void **)dx, (size_t)(MAX_TOK * max_cols) * sizeof(float)));
    TRY(cuda_mem_alloc((void **)dy, (size_t)(MAX_TOK * max_rows) * sizeof(float)));
    TRY(cuda_mem_upload(*dx, hx, (size_t)(MAX_TOK * max_cols) * sizeof(float), st));
    free(hx);
}

/* A child's part: v's token count of every quantised (v->half: F16/BF16) (shape, type) under
 * the kernel choice it was given, the times (0 for the other types, and for the bulk kernels
 * below sm_90) written to fd in table order. */
static int child_main(int fd, const variant *v)
{
    if (!cuda_available())
        return 1;
    TRY(cuda_stream_create(&st));
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));
    int dev = 0, major = 0;
    CU(cudaGetDevice(&dev));
    CU(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    const bool none = strcmp(v->value, "bulk") == 0 && major < 9;
    float *dx = NULL, *dy = NULL;
    io_init(&dx, &dy);
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
            if (!measured(i, k))
                continue;
            result r = {0};
            const bool half = types[k] == TD_F16 || types[k] == TD_BF16;
            if ((v->half ? half : is_quant(types[k])) && !none)
                bench_one(&r, &shapes[i], types[k], dx, dy, v->tok + 1);
            if (write(fd, &r.us[v->tok], sizeof r.us[0]) != (ssize_t)sizeof r.us[0])
                return 1;
        }
    cuda_mem_free(dx);
    cuda_mem_free(dy);
    cuda_stream_free(st);
    return 0;
}

/* Every (shape, type) under variants[v], measured by a child process (fork before this
 * process touches the GPU): us[n] in table order; false if the child failed. */
static bool measure_variant(size_t v, double *us, int n)
{
    int p[2];
    if (pipe(p) != 0)
        return false;
    fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        close(p[0]);
        setenv(variants[v].env, variants[v].value, 1);
        _exit(child_main(p[1], &variants[v]));
    }
    close(p[1]);
    size_t got = 0;
    ssize_t k;
    while (got < (size_t)n * sizeof *us &&
           (k = read(p[0], (char *)us + got, (size_t)n * sizeof *us - got)) > 0)
        got += (size_t)k;
    close(p[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return got == (size_t)n * sizeof *us && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Fraction of the copy rate of bytes in us microseconds, as a column ("-" when absent). */
static void print_frac(size_t bytes, double us, double copy_gbps)
{
    if (us > 0)
        printf(" %6.1f%%", 100.0 * (double)bytes / (us * 1e-6) / 1e9 / copy_gbps);
    else
        printf(" %7s", "-");
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_matmul_cuda [--shape NAME] [--type T] [--no-variants] "
                    "[--resident] [--x-bf16]\n"
                    "shapes:");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        fprintf(stderr, " %s", shapes[i].name);
    fprintf(stderr, "\ntypes:");
    for (size_t k = 0; k < sizeof types / sizeof *types; k++)
        fprintf(stderr, " %s", dtype_name(types[k]));
    fprintf(stderr, "\n");
    return 2;
}

int main(int argc, char **argv)
{
    bool variants_wanted = true;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--shape") == 0 && a + 1 < argc)
            only_shape = argv[++a];
        else if (strcmp(argv[a], "--type") == 0 && a + 1 < argc)
            only_type = argv[++a];
        else if (strcmp(argv[a], "--resident") == 0)
            resident = true;
        else if (strcmp(argv[a], "--x-bf16") == 0)
            x_bf16 = true;
        else if (strcmp(argv[a], "--no-variants") == 0)
            variants_wanted = false;
        else
            return usage();
    }
    int n_res = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (size_t k = 0; k < sizeof types / sizeof *types; k++)
            n_res += measured(i, k);
    if (n_res == 0) {
        fprintf(stderr, "bench_matmul_cuda: no shape and type match --shape/--type\n");
        return usage();
    }
    static double us_v[N_VARIANTS][MAX_RES];
    for (size_t v = 0; v < N_VARIANTS && variants_wanted; v++)
        if (!measure_variant(v, us_v[v], n_res)) {
            fprintf(stderr, "bench_matmul_cuda: the %s=%s pass failed\n", variants[v].env,
                    variants[v].value);
            memset(us_v[v], 0, sizeof us_v[v]);
        }

    const struct cudaDeviceProp prop = bench_cuda_start();

    const double copy_gbps = copy_bandwidth();
    printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20);
    printf("copy bandwidth (read + write): %.0f GB/s\n", copy_gbps);
    printf("one token: of_copy with the default single-token kernel; bulk, regs, mma: with "
           "TANDEM_MMD set so;\nmmq16, mmq64: 16 and 64 tokens with TANDEM_MMQ=mmq; regs16: "
           "F16/BF16 at 16 tokens with TANDEM_MMH=regs\n(us, and /us(1))\n\n");

    float *dx = NULL, *dy = NULL;
    io_init(&dx, &dy);

    result res[MAX_RES];
    n_res = 0;
    printf("%-13s %6s %6s %-5s %9s %9s %8s %7s %7s %7s %7s %9s %7s %7s %7s %9s %7s %9s %7s %9s "
           "%7s\n",
           "shape", "in", "out", "type", "MB", "us(1)", "GB/s", "of_copy", "bulk", "regs", "mma",
           "us(16)", "16/1", "32/1", "64/1", "mmq16", "/1", "mmq64", "/1", "regs16", "/1");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
            if (!measured(i, k))
                continue;
            result *r = &res[n_res];
            bench_one(r, &shapes[i], types[k], dx, dy, N_TOKS);
            for (size_t v = 0; v < N_VARIANTS; v++)
                r->us_v[v] = us_v[v][n_res];
            n_res++;
            const double gbps = (double)r->bytes / (r->us[0] * 1e-6) / 1e9;
            printf("%-13s %6lld %6lld %-5s %9.1f %9.1f %8.0f", r->s->name,
                   (long long)r->s->cols, (long long)r->s->rows, dtype_name(r->type),
                   (double)r->bytes / 1e6, r->us[0], gbps);
            print_frac(r->bytes, r->us[0], copy_gbps);
            for (size_t v = 0; v < N_VARIANTS; v++)
                if (variants[v].tok == 0)
                    print_frac(r->bytes, r->us_v[v], copy_gbps);
            printf(" %9.1f %7.2f %7.2f %7.2f", r->us[1], r->us[1] / r->us[0],
                   r->us[2] / r->us[0], r->us[3] / r->us[0]);
            for (size_t v = 0; v < N_VARIANTS; v++)
                if (variants[v].tok != 0) {
                    if (r->us_v[v] > 0)
                        printf(" %9.1f %7.2f", r->us_v[v], r->us_v[v] / r->us[0]);
                    else
                        printf(" %9s %7s", "-", "-");
                }
            printf("\n");
            fflush(stdout);
        }

    printf("\n{\"device\": \"%s\", \"copy_gbps\": %.1f, \"results\": [", prop.name, copy_gbps);
    for (int i = 0; i < n_res; i++) {
        const result *r = &res[i];
        const double gbps = (double)r->bytes / (r->us[0] * 1e-6) / 1e9;
        printf("%s\n  {\"shape\": \"%s\", \"in\": %lld, \"out\": %lld, \"type\": \"%s\", "
               "\"bytes\": %zu, \"us_1\": %.2f, \"gbps_1\": %.1f, \"frac_of_copy_1\": %.4f, "
               "\"us_16\": %.2f, \"us_32\": %.2f, \"us_64\": %.2f, \"ratio_16\": %.3f, "
               "\"ratio_32\": %.3f, \"ratio_64\": %.3f",
               i ? "," : "", r->s->name, (long long)r->s->cols, (long long)r->s->rows,
               dtype_name(r->type), r->bytes, r->us[0], gbps, gbps / copy_gbps, r->us[1],
               r->us[2], r->us[3], r->us[1] / r->us[0], r->us[2] / r->us[0],
               r->us[3] / r->us[0]);
        for (size_t v = 0; v < N_VARIANTS; v++)
            if (r->us_v[v] > 0 && variants[v].tok == 0)
                printf(", \"us_1_%s\": %.2f, \"frac_of_copy_1_%s\": %.4f", variants[v].name,
                       r->us_v[v], variants[v].name,
                       (double)r->bytes / (r->us_v[v] * 1e-6) / 1e9 / copy_gbps);
            else if (r->us_v[v] > 0)
                printf(", \"us_%lld_%s\": %.2f, \"ratio_%lld_%s\": %.3f",
                       (long long)toks[variants[v].tok], variants[v].name, r->us_v[v],
                       (long long)toks[variants[v].tok], variants[v].name,
                       r->us_v[v] / r->us[0]);
        printf("}");
    }
    printf("\n]}\n");

    cuda_mem_free(dx);
    cuda_mem_free(dy);
    bench_cuda_end();
    return 0;
}

#endif /* TANDEM_HAVE_CUDA */
