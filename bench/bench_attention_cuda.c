/* bench_attention_cuda: the time of one cuda_attention call on the shapes the 27B target and
 * its DFlash drafter run: decode (1 query) at 1K and 32K keys, verify blocks of 16 and 32
 * queries and a 64-query prefill chunk over 1K keys, a 1K decode and a 16-query verify in a
 * cache of 32K keys (the launch sized for the cache, the keys in use read from the device, as
 * a recorded step runs), a 16-query verify over 32K keys (24 query heads, 4 kv heads, head_dim
 * 256, f16 cache, causal, sigmoid output gate), and the drafter's 16-query block (32 / 8
 * heads, head_dim 128, f32 cache, bidirectional) over 1K of context.
 *
 * Each case rotates over enough copies of the cache that L2 cannot keep it (as the model's
 * layers each read their own cache), times back-to-back calls with CUDA events (median of
 * several runs) and prints microseconds per call with the cache bytes read per second.
 * Options: --case NAME (a case of the table, e.g. "verify16"), --calls N. */
#include <math.h>
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
    printf("bench_attention_cuda: this build has no CUDA\n");
    return 1;
}

#else

#define BENCH_NAME "bench_attention_cuda"
#include "bench/bench_cuda.h"

#define ROTATE_BYTES ((size_t)512 << 20) /* cache copies per case: ~10x an H200's L2 */
#define MAX_COPIES 16
#define RUNS 7

typedef struct att_case {
    const char *name;
    int64_t n_q, n_head, n_head_kv, head_dim, n_kv;
    td_dtype kv_type;
    ops_mask_kind mask;
    bool gate;
    int64_t cap; /* 0, or the keys the cache holds and the call is launched for, n_kv of them
                  * in use, read from the device (as a recorded decode step runs) */
} att_case;

static const att_case cases[] = {
    {"decode1k", 1, 24, 4, 256, 1024, TD_F16, OPS_MASK_CAUSAL, true, 0},
    {"decode32k", 1, 24, 4, 256, 32768, TD_F16, OPS_MASK_CAUSAL, true, 0},
    {"decode1k-of-32k", 1, 24, 4, 256, 1024, TD_F16, OPS_MASK_CAUSAL, true, 32832},
    {"verify16", 16, 24, 4, 256, 1040, TD_F16, OPS_MASK_CAUSAL, true, 0},
    {"verify32", 32, 24, 4, 256, 1056, TD_F16, OPS_MASK_CAUSAL, true, 0},
    {"verify16-of-32k", 16, 24, 4, 256, 1040, TD_F16, OPS_MASK_CAUSAL, true, 32832},
    {"verify16-32k", 16, 24, 4, 256, 32784, TD_F16, OPS_MASK_CAUSAL, true, 0},
    {"prefill64", 64, 24, 4, 256, 1024, TD_F16, OPS_MASK_CAUSAL, true, 0},
    {"draft16", 16, 32, 8, 128, 1040, TD_F32, OPS_MASK_BIDIRECTIONAL, false, 0},
    {"draft16-f16", 16, 32, 8, 128, 1040, TD_F16, OPS_MASK_BIDIRECTIONAL, false, 0},
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* Random device buffer of n values of type t (F32 or F16). */
static void *rand_dev(td_dtype t, size_t n)
{
    const size_t eb = ops_kv_elem_bytes(t);
    void *h = bench_alloc(n * eb), *d = NULL;
    for (size_t i = 0; i < n; i++) {
        const float x = rnd();
        if (t == TD_F16)
            ((uint16_t *)h)[i] = ops_f32_to_f16(x);
        else
            ((float *)h)[i] = x;
    }
    TRY(cuda_mem_alloc(&d, n * eb));
    TRY(cuda_mem_upload(d, h, n * eb, st));
    free(h);
    return d;
}

/* Microseconds per call of one case; *bytes: the K and V bytes one call reads. */
static double bench_case(const att_case *c, int calls, double *bytes)
{
    const int64_t qw = c->n_head * c->head_dim * (c->gate ? 2 : 1); /* q and gate per token */
    const int64_t kvw = c->n_head_kv * c->head_dim;
    const size_t eb = ops_kv_elem_bytes(c->kv_type);
    const size_t cache = (size_t)(c->n_kv * kvw) * eb;
    int copies = (int)((ROTATE_BYTES + 2 * cache - 1) / (2 * cache));
    copies = copies < 2 ? 2 : copies > MAX_COPIES ? MAX_COPIES : copies;
    *bytes = 2.0 * (double)cache;

    const int64_t n_alloc = c->cap ? c->cap : c->n_kv;
    float *q = rand_dev(TD_F32, (size_t)(c->n_q * qw));
    void *k[MAX_COPIES], *v[MAX_COPIES];
    for (int i = 0; i < copies; i++) {
        k[i] = rand_dev(c->kv_type, (size_t)(n_alloc * kvw));
        v[i] = rand_dev(c->kv_type, (size_t)(n_alloc * kvw));
    }
    int32_t *hpos = bench_alloc((size_t)n_alloc * sizeof *hpos);
    for (int64_t i = 0; i < n_alloc; i++)
        hpos[i] = (int32_t)i;
    int32_t *kpos = NULL, *n_kv_dev = NULL;
    const int32_t n_use = (int32_t)c->n_kv;
    float *out = NULL;
    TRY(cuda_mem_alloc((void **)&kpos, (size_t)n_alloc * sizeof *kpos));
    TRY(cuda_mem_upload(kpos, hpos, (size_t)n_alloc * sizeof *kpos, st));
    TRY(cuda_mem_alloc((void **)&n_kv_dev, sizeof n_use));
    TRY(cuda_mem_upload(n_kv_dev, &n_use, sizeof n_use, st));
    TRY(cuda_mem_alloc((void **)&out, (size_t)(c->n_q * c->n_head * c->head_dim) * sizeof(float)));
    free(hpos);

    ops_attn a = {
        .n_q = c->n_q, .n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim,
        .scale = 1.0f / sqrtf((float)c->head_dim), .q = q, .q_tok_stride = qw,
        .q_head_stride = c->head_dim * (c->gate ? 2 : 1),
        .q_pos = kpos + (c->n_kv - c->n_q), /* the queries are the last keys */
        .kv_type = c->kv_type, .kv_tok_stride = kvw, .kv_head_stride = c->head_dim,
        .k_pos = kpos, .n_kv = n_alloc, .n_kv_dev = c->cap ? n_kv_dev : NULL, .mask = c->mask,
        .gate = c->gate ? q + c->head_dim : NULL, .gate_tok_stride = qw,
        .gate_head_stride = c->head_dim * 2, .out = out,
    };
    for (int i = 0; i < copies; i++) { /* warm-up: scratch, first touches */
        a.k = k[i], a.v = v[i];
        TRY(cuda_attention(&a, st));
    }
    double us[RUNS];
    for (int r = 0; r < RUNS; r++) {
        CU(cudaEventRecord(ev0, (cudaStream_t)st));
        for (int i = 0; i < calls; i++) {
            const int j = (r * calls + i) % copies;
            a.k = k[j], a.v = v[j];
            TRY(cuda_attention(&a, st));
        }
        CU(cudaEventRecord(ev1, (cudaStream_t)st));
        us[r] = elapsed_ms() * 1e3 / calls;
    }
    TRY(cuda_stream_sync(st));
    for (int i = 0; i < copies; i++) {
        cuda_mem_free(k[i]);
        cuda_mem_free(v[i]);
    }
    cuda_mem_free(q);
    cuda_mem_free(kpos);
    cuda_mem_free(n_kv_dev);
    cuda_mem_free(out);
    return median(us, RUNS);
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    int calls = 64;
    if (!bench_case_args(argc, argv, &only, &calls))
        return 2;
    const struct cudaDeviceProp prop = bench_cuda_start();
    printf("bench_attention_cuda on %s (%d SMs), %d calls per run, median of %d runs\n\n",
           prop.name, prop.multiProcessorCount, calls, RUNS);
    printf("%-16s %4s %9s %5s %6s  %10s %10s\n", "case", "n_q", "heads", "dim", "n_kv",
           "us/call", "K+V GB/s");
    int done = 0;
    for (size_t i = 0; i < N_CASES; i++) {
        const att_case *c = &cases[i];
        if (only && strcmp(only, c->name) != 0)
            continue;
        double bytes = 0;
        const double us = bench_case(c, calls, &bytes);
        char heads[16];
        snprintf(heads, sizeof heads, "%lld/%lld", (long long)c->n_head, (long long)c->n_head_kv);
        printf("%-16s %4lld %9s %5lld %6lld  %10.2f %10.1f\n", c->name, (long long)c->n_q,
               heads, (long long)c->head_dim, (long long)c->n_kv, us, bytes / (us * 1e-6) / 1e9);
        fflush(stdout);
        done++;
    }
    if (!done) {
        fprintf(stderr, BENCH_NAME ": no case named %s\n", only);
        return 2;
    }
    bench_cuda_end();
    return 0;
}

#endif
