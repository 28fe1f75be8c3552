/* bench_delta_cuda: the time of one cuda_delta_rule call (one Gated DeltaNet layer's
 * recurrence) on the 27B target's shape (16 key heads, 48 value heads, d_k = d_v = 128):
 * a decode token, a 16-token verify block (keeping the state before it, the rollback point),
 * the same keeping the state after every token, and a 64-token prefill chunk token by token
 * and in the chunked form (chunks of 64, 32 and 16 positions), each with the gated output
 * norm as the model runs it.
 *
 * Back-to-back calls rotate over 8 copies of the inputs and states (one layer's recurrent
 * state is 3 MB; the 27B has 48 such layers), timed with CUDA events, median of several
 * runs, printed in microseconds per call. Options: --case NAME, --calls N. */
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
    printf("bench_delta_cuda: this build has no CUDA\n");
    return 1;
}

#else

#define BENCH_NAME "bench_delta_cuda"
#include "bench/bench_cuda.h"

#define COPIES 8
#define RUNS 7
#define NK 16
#define NV 48
#define DK 128
#define DV 128

typedef struct delta_case {
    const char *name;
    int64_t n_tok, chunk;
    bool state_prev, state_all; /* the rollback point (as verify keeps it); every state */
} delta_case;

static const delta_case cases[] = {
    {"decode", 1, 0, false, false},      {"verify16", 16, 0, true, false},
    {"states16", 16, 0, false, true},    {"prefill64", 64, 0, false, false},
    {"chunked64", 64, 64, false, false}, {"chunked32", 64, 32, false, false},
    {"chunked16", 64, 16, false, false},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static float *dev_floats(size_t n, float scale, float offset)
{
    float *h = bench_alloc(n * sizeof(float)), *d = NULL;
    for (size_t i = 0; i < n; i++)
        h[i] = offset + scale * rnd();
    TRY(cuda_mem_alloc((void **)&d, n * sizeof(float)));
    TRY(cuda_mem_upload(d, h, n * sizeof(float), st));
    free(h);
    return d;
}

/* [T][2][NV]: g in [-0.5, -0.1] (a decay <= 1), then beta in [0.3, 0.9] */
static float *dev_gb(int64_t T)
{
    const size_t n = (size_t)(T * 2 * NV);
    float *h = bench_alloc(n * sizeof(float)), *d = NULL;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < NV; i++) {
            h[t * 2 * NV + i] = -0.3f + 0.2f * rnd();
            h[t * 2 * NV + NV + i] = 0.6f + 0.3f * rnd();
        }
    TRY(cuda_mem_alloc((void **)&d, n * sizeof(float)));
    TRY(cuda_mem_upload(d, h, n * sizeof(float), st));
    free(h);
    return d;
}

/* Microseconds per call of one case. */
static double bench_case(const delta_case *c, int calls)
{
    const int64_t T = c->n_tok, ch = 2 * NK * DK + NV * DV; /* the model's qkv row */
    const size_t ns = (size_t)NV * DK * DV;
    float *qkv[COPIES], *gb[COPIES], *state[COPIES], *out[COPIES], *z[COPIES];
    float *all = NULL, *prev = NULL, *w = dev_floats(DV, 0.2f, 1.0f);
    int32_t *pos = NULL, p0 = 0;
    for (int i = 0; i < COPIES; i++) {
        /* q and k of size ~1 per head, as after their norms; g <= 0, beta in (0, 1) */
        qkv[i] = dev_floats((size_t)(T * ch), 0.15f, 0.0f);
        gb[i] = dev_gb(T);
        state[i] = dev_floats(ns, 0.5f, 0.0f);
        out[i] = dev_floats((size_t)(T * NV * DV), 0.0f, 0.0f);
        z[i] = dev_floats((size_t)(T * NV * DV), 1.0f, 0.0f);
    }
    if (c->state_all)
        TRY(cuda_mem_alloc((void **)&all, (size_t)T * ns * sizeof(float)));
    if (c->state_prev)
        TRY(cuda_mem_alloc((void **)&prev, ns * sizeof(float)));
    TRY(cuda_mem_alloc((void **)&pos, sizeof p0));
    TRY(cuda_mem_upload(pos, &p0, sizeof p0, st));
    ops_delta d = {
        .n_tok = T, .n_k_head = NK, .n_v_head = NV, .d_k = DK, .d_v = DV,
        .q_tok_stride = ch, .k_tok_stride = ch, .v_tok_stride = ch, .gb_tok_stride = 2 * NV,
        .state_all = all, .state_prev = prev, .norm_w = w, .norm_eps = 1e-6f, .chunk = c->chunk,
        .pos0 = c->chunk ? pos : NULL,
    };
    double us[RUNS];
    for (int r = -1; r < RUNS; r++) { /* run -1: warm-up */
        CU(cudaEventRecord(ev0, (cudaStream_t)st));
        for (int i = 0; i < calls; i++) {
            const int j = (r + 1) * calls + i;
            const int k = j % COPIES;
            d.q = qkv[k], d.k = qkv[k] + NK * DK, d.v = qkv[k] + 2 * NK * DK;
            d.g = gb[k], d.beta = gb[k] + NV;
            d.state = state[k], d.out = out[k], d.norm_z = z[k];
            TRY(cuda_delta_rule(&d, st));
        }
        CU(cudaEventRecord(ev1, (cudaStream_t)st));
        const double ms = elapsed_ms();
        if (r >= 0)
            us[r] = ms * 1e3 / calls;
    }
    TRY(cuda_stream_sync(st));
    for (int i = 0; i < COPIES; i++) {
        cuda_mem_free(qkv[i]), cuda_mem_free(gb[i]), cuda_mem_free(state[i]);
        cuda_mem_free(out[i]), cuda_mem_free(z[i]);
    }
    if (all)
        cuda_mem_free(all);
    if (prev)
        cuda_mem_free(prev);
    cuda_mem_free(pos);
    cuda_mem_free(w);
    return median(us, RUNS);
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    int calls = 48;
    if (!bench_case_args(argc, argv, &only, &calls))
        return 2;
    const struct cudaDeviceProp prop = bench_cuda_start();
    printf("bench_delta_cuda on %s (%d SMs), %d calls per run, median of %d runs\n"
           "one layer: %d key heads, %d value heads, d_k %d, d_v %d, gated norm\n\n",
           prop.name, prop.multiProcessorCount, calls, RUNS, NK, NV, DK, DV);
    printf("%-10s %6s %6s %10s  %10s\n", "case", "tokens", "chunk", "us/call", "us/token");
    int done = 0;
    for (size_t i = 0; i < N_CASES; i++) {
        const delta_case *c = &cases[i];
        if (only && strcmp(only, c->name) != 0)
            continue;
        const double us = bench_case(c, calls);
        printf("%-10s %6lld %6lld %10.2f  %10.3f\n", c->name, (long long)c->n_tok,
               (long long)c->chunk, us, us / (double)c->n_tok);
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
