/* bench_sample_cuda: the time of the sampler on a drafter's block on the GPU: one
 * cuda_sample_rows call over 15 rows of the 27B vocabulary (248320 logits each) per setting
 * (temperature alone, top_k 40 with top_p 0.95, top_p 0.95 alone, top_k 1500) on three kinds
 * of rows: peaked (uniform in [-6, 0) with a dozen tokens at 20, 19, ...: top_p 0.95 keeps 3
 * tokens, as after a confident model), flat (uniform in [-8, 8): the kept set of top_p 0.95
 * is most of the vocabulary) and normal (sums of four uniforms in [-0.5, 0.5): near-normal
 * with a small spread, as a model with random weights gives; top_p's cut lands where
 * thousands of logits share a value bin).
 *
 * Times back-to-back calls with CUDA events (median of several runs) and prints milliseconds
 * per call. Then the log probabilities of a verified block (16 rows, 20 alternatives each):
 * cuda_logprob_rows with its download of the records, against downloading the rows and
 * running cpu_logprob_rows on the host. Last, the selections of a speculative step on peaked
 * rows: cuda_argmax of one row (greedy decoding) and of 16, greedy acceptance of a 16-token
 * block, and sampled acceptance (temperature 0.8) of one with the drafts of 15 rows.
 * Options: --rows N (default 15), --calls N. */
#include <time.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cuda_mem.h"
#include "kernels/ops.h"

#ifndef TANDEM_HAVE_CUDA

int main(void)
{
    printf("bench_sample_cuda: this build has no CUDA\n");
    return 1;
}

#else

#define BENCH_NAME "bench_sample_cuda"
#include "bench/bench_cuda.h"

#define VOCAB 248320
#define RUNS 7

static const struct {
    const char *name;
    ops_sampler s;
} settings[] = {
    {"temp 0.8", {.temperature = 0.8f, .top_p = 1, .seed = 1}},
    {"top_k 40 top_p 0.95", {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 1}},
    {"top_p 0.95", {.temperature = 0.8f, .top_p = 0.95f, .seed = 1}},
    {"top_k 1500", {.temperature = 0.8f, .top_k = 1500, .top_p = 1, .seed = 1}},
};
#define N_SETTINGS (sizeof settings / sizeof settings[0])

enum { PEAKED, FLAT, NORMAL };

/* rows rows of logits on the device of a kind (see the top of the file) */
static float *make_rows(int rows, int kind)
{
    const size_t n = (size_t)rows * VOCAB;
    float *h = bench_alloc(n * sizeof *h), *d = NULL;
    for (size_t i = 0; i < n; i++)
        h[i] = kind == PEAKED ? 3 * rnd() - 3
               : kind == FLAT ? 8 * rnd()
                              : 0.5f * (rnd() + rnd() + rnd() + rnd());
    if (kind == PEAKED)
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < 12; j++)
                h[(size_t)r * VOCAB + (size_t)(j * 20011 + r * 7) % VOCAB] = 20.0f - (float)j;
    TRY(cuda_mem_alloc((void **)&d, n * sizeof *d));
    TRY(cuda_mem_upload(d, h, n * sizeof *d, st));
    free(h);
    return d;
}

/* Milliseconds per cuda_sample_rows call over rows rows of logits. */
static double bench_one(const float *logits, float *q, int32_t *tok, int rows,
                        const ops_sampler *s, int calls)
{
    TRY(cuda_sample_rows(tok, q, logits, rows, VOCAB, s, 0, 1, st)); /* scratch, first touches */
    double ms[RUNS];
    for (int r = 0; r < RUNS; r++) {
        CU(cudaEventRecord(ev0, (cudaStream_t)st));
        for (int i = 0; i < calls; i++)
            TRY(cuda_sample_rows(tok, q, logits, rows, VOCAB, s, (uint64_t)i * 64, 4, st));
        CU(cudaEventRecord(ev1, (cudaStream_t)st));
        ms[r] = elapsed_ms() / calls;
    }
    TRY(cuda_stream_sync(st));
    return median(ms, RUNS);
}

/* Milliseconds per call of f(a) back to back, median of runs (the first call warms up). */
typedef struct sel_args {
    const float *logits, *q;
    float *p;
    int32_t *ids, *res;
    int rows;
} sel_args;

static double bench_calls(void (*f)(const sel_args *), const sel_args *a, int calls)
{
    f(a);
    double ms[RUNS];
    for (int r = 0; r < RUNS; r++) {
        CU(cudaEventRecord(ev0, (cudaStream_t)st));
        for (int i = 0; i < calls; i++)
            f(a);
        CU(cudaEventRecord(ev1, (cudaStream_t)st));
        ms[r] = elapsed_ms() / calls;
    }
    TRY(cuda_stream_sync(st));
    return median(ms, RUNS);
}

static void call_argmax(const sel_args *a)
{
    TRY(cuda_argmax(a->ids, a->logits, a->rows, VOCAB, st));
}

static void call_accept_greedy(const sel_args *a)
{
    TRY(cuda_accept_greedy(a->ids, a->res, a->logits, a->ids + 16, a->rows, VOCAB, st));
}

static void call_accept_sampled(const sel_args *a)
{
    static const ops_sampler s = {.temperature = 0.8f, .top_p = 1, .seed = 1};
    static const ops_accept_rng rng = {.accept = 1, .target = 0, .step = 4};
    TRY(cuda_accept_sampled(a->res, a->p, a->logits, a->q, a->ids + 16, a->rows, VOCAB, &s,
                            &rng, st));
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Milliseconds for the log probabilities of rows rows of logits, on the device (with) or on
 * the host after a download (without), records on the host at the end; median of runs. */
static double bench_logprobs(const float *logits, int rows, bool on_device)
{
    int32_t *htok = bench_alloc((size_t)rows * sizeof *htok), *tok = NULL;
    for (int i = 0; i < rows; i++)
        htok[i] = i * 1009;
    ops_logprob *out = NULL, *hout = bench_alloc((size_t)rows * sizeof *hout);
    float *hl = on_device ? NULL : bench_alloc((size_t)rows * VOCAB * sizeof *hl);
    TRY(cuda_mem_alloc((void **)&tok, (size_t)rows * sizeof *tok));
    TRY(cuda_mem_upload(tok, htok, (size_t)rows * sizeof *tok, st));
    TRY(cuda_mem_alloc((void **)&out, (size_t)rows * sizeof *out));
    double ms[RUNS + 1];
    for (int r = 0; r <= RUNS; r++) { /* run 0 warms up */
        TRY(cuda_stream_sync(st));
        const double t0 = now_ms();
        if (on_device) {
            TRY(cuda_logprob_rows(out, logits, tok, rows, VOCAB, OPS_TOP_LOGPROBS_MAX, st));
            TRY(cuda_mem_download(hout, out, (size_t)rows * sizeof *hout, st));
        } else {
            TRY(cuda_mem_download(hl, logits, (size_t)rows * VOCAB * sizeof *hl, st));
            cpu_logprob_rows(hout, hl, htok, rows, VOCAB, OPS_TOP_LOGPROBS_MAX);
        }
        ms[r] = now_ms() - t0;
    }
    cuda_mem_free(tok);
    cuda_mem_free(out);
    free(htok);
    free(hout);
    free(hl);
    return median(ms + 1, RUNS);
}

int main(int argc, char **argv)
{
    int rows = 15, calls = 20;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rows") == 0 && i + 1 < argc) {
            rows = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--calls") == 0 && i + 1 < argc) {
            calls = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_sample_cuda [--rows N] [--calls N]\n");
            return 2;
        }
    }
    if (rows < 1 || rows > 64 || calls < 1 || calls > 10000) {
        fprintf(stderr, BENCH_NAME ": --rows must be 1..64, --calls 1..10000\n");
        return 2;
    }
    const struct cudaDeviceProp prop = bench_cuda_start();
    printf("bench_sample_cuda on %s: cuda_sample_rows over %d rows of %d logits, %d calls per "
           "run, median of %d runs\n\n", prop.name, rows, VOCAB, calls, RUNS);
    printf("%-22s %12s %12s %12s\n", "setting", "peaked ms", "flat ms", "normal ms");
    float *peaked = make_rows(rows, PEAKED), *flat = make_rows(rows, FLAT);
    float *normal = make_rows(rows, NORMAL), *q = NULL;
    int32_t *tok = NULL;
    TRY(cuda_mem_alloc((void **)&q, (size_t)rows * VOCAB * sizeof *q));
    TRY(cuda_mem_alloc((void **)&tok, (size_t)rows * sizeof *tok));
    for (size_t i = 0; i < N_SETTINGS; i++) {
        const double a = bench_one(peaked, q, tok, rows, &settings[i].s, calls);
        const double b = bench_one(flat, q, tok, rows, &settings[i].s, calls);
        const double c = bench_one(normal, q, tok, rows, &settings[i].s, calls);
        printf("%-22s %12.3f %12.3f %12.3f\n", settings[i].name, a, b, c);
        fflush(stdout);
    }
    float *block = make_rows(16, PEAKED);
    printf("\nlog probabilities of 16 rows, %d alternatives each, records on the host:\n",
           OPS_TOP_LOGPROBS_MAX);
    printf("  cuda_logprob_rows + download of the records   %8.3f ms\n",
           bench_logprobs(block, 16, true));
    printf("  download of the rows + cpu_logprob_rows       %8.3f ms\n",
           bench_logprobs(block, 16, false));
    /* drafts: the sampled tokens of 15 of the block's rows, so that some are accepted */
    float *p = NULL;
    int32_t *ids = NULL, *res = NULL;
    TRY(cuda_mem_alloc((void **)&p, (size_t)16 * VOCAB * sizeof *p));
    TRY(cuda_mem_alloc((void **)&ids, 32 * sizeof *ids));
    TRY(cuda_mem_alloc((void **)&res, 2 * sizeof *res));
    TRY(cuda_sample_rows(ids + 16, q, block, 15, VOCAB, &settings[0].s, 0, 1, st));
    sel_args a = {.logits = block, .q = q, .p = p, .ids = ids, .res = res, .rows = 1};
    printf("\nselections of a speculative step (peaked rows):\n");
    printf("  cuda_argmax, 1 row                            %8.3f ms\n",
           bench_calls(call_argmax, &a, calls));
    a.rows = 16;
    printf("  cuda_argmax, 16 rows                          %8.3f ms\n",
           bench_calls(call_argmax, &a, calls));
    printf("  cuda_accept_greedy, 16 rows                   %8.3f ms\n",
           bench_calls(call_accept_greedy, &a, calls));
    printf("  cuda_accept_sampled, 16 rows, temp 0.8        %8.3f ms\n",
           bench_calls(call_accept_sampled, &a, calls));
    cuda_mem_free(p);
    cuda_mem_free(ids);
    cuda_mem_free(res);
    cuda_mem_free(block);
    cuda_mem_free(peaked);
    cuda_mem_free(flat);
    cuda_mem_free(normal);
    cuda_mem_free(q);
    cuda_mem_free(tok);
    bench_cuda_end();
    return 0;
}

#endif
