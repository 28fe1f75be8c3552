/* bench_stream_cuda: what the boundary between two dependent weight-streaming products costs,
 * as separate launches (the forward pass today) and inside one persistent kernel.
 *
 * A product here has the single-token bulk kernel's shape without its arithmetic: one CTA
 * per SM of 8 warps, each warp a ring of 2 stages, a stage = 8 rows x 8 blocks of 144 bytes
 * (Q4_K super-blocks) brought by `cp.async.bulk` (147 KB of ring per SM); lane (r, q) reads
 * row r's blocks q, q + 4 of each stage from shared memory and `dp4a`s them against integers
 * made from the activation of the block (WORK passes per block). Its activations are the
 * first `cols` outputs of the product before it, so every product depends on the one before.
 * A chain of products alternates two shapes of the 27B: A = 6144 -> 5120 (17.7 MB, ssm_out),
 * B = 5120 -> 17408 (50.1 MB, ffn_gate), over 4 copies of each (L2 cannot keep them).
 *
 *   launches    one launch per product, each a programmatic dependent of the one before
 *               (griddepcontrol.wait before reading its activations, launch_dependents at
 *               its start; its rings fill before the wait), all recorded in one CUDA graph;
 *   persistent  one launch for the whole chain: a product's end is a grid barrier (every CTA
 *               counts itself done, release; the CTA's thread 0 spins on the count, acquire),
 *               and each warp's ring runs on into the next product's weights while the
 *               product ends, the barrier is waited for and the activations are read;
 *   flags       the persistent kernel without the barrier: a warp that writes a unit's 8
 *               outputs adds 8 to its 256-row block's count (release), and a lane of the next
 *               product waits (acquire) for the count of each block of activations it reads,
 *               so a product starts on the blocks the one before has finished (units go to
 *               CTAs round-robin, so the blocks finish in order through the product);
 *   streaming   the persistent kernel with no barrier and no activations read: the rings
 *               alone, the bound.
 * Every mode takes the units round-robin over the CTAs (CTA b: units b, b + G, ...).
 * It prints microseconds per product pair and the rate over the weight bytes, best of 10
 * replays of a 40-product chain. Options: --work N (default 4), --pairs N (default 20).
 * sm_90 only. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

extern "C" { /* the C headers bench_cuda.h includes, with C linkage */
#include "common/err.h"
#include "kernels/cuda_mem.h"
#include "kernels/ops.h"
}

#define BENCH_NAME "bench_stream_cuda"
#include "bench/bench_cuda.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MMB_SM90 1
#else
#define MMB_SM90 0
#endif
#include "kernels/cuda/matmul_bulk_copy.cuh"

#define WARPS 8
#ifndef STAGES
#define STAGES 2 /* per warp */
#endif
#ifndef UROWS
#define UROWS 8 /* rows per unit */
#endif
#define KC 8      /* blocks per row and stage */
#define KB 144    /* bytes per block */
#define SLOT (KC * KB)
#define MAX_COLS 6144
#define MAX_PHASES 128
#define COPIES 4
/* barriers, stage owners and unit counters before the activations and the ring */
#define HDR (((WARPS * STAGES * (8 + 12) + MAX_PHASES * 4) + 127) / 128 * 128)

enum mode { M_LAUNCHES, M_PERSISTENT, M_FLAGS, M_STREAMING, N_MODES };
#define MAX_KB 80 /* 256-row blocks of a product's output (17408 rows: 68) */

struct phase {
    const uint8_t *w; /* rows x (cols / 256) blocks */
    float *y;         /* rows outputs */
    const float *x;   /* cols activations: the previous product's y */
    int rows, cols;
};
struct chain {
    phase p[MAX_PHASES];
    int n;
};

/* Phases p0 .. p1 - 1; MODE as above. done: the CTAs that finished each phase. CTA b owns
 * units b, b + G, ... of a phase (UROWS rows each) and its warps take them one at a time from
 * a shared counter, as the bulk kernel's do; a warp that finds a phase's units gone goes on
 * to the next phase's, so its ring runs on while the others finish. */
template <int MODE>
__global__ void __launch_bounds__(WARPS * 32, 1)
    stream_kernel(const __grid_constant__ chain c, int p0, int p1, int work, unsigned *done)
{
    unsigned *ready = done + 1; /* [phase][256-row block]: rows out (M_FLAGS) */
#if MMB_SM90
    if (MODE == M_LAUNCHES)
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    extern __shared__ __align__(128) uint8_t smem[];
    uint64_t *bars = (uint64_t *)smem;                /* [WARPS * STAGES] */
    int *own = (int *)(bars + WARPS * STAGES);        /* [WARPS * STAGES][3]: phase, unit, stage */
    int *cnt = own + WARPS * STAGES * 3;              /* [MAX_PHASES] units taken */
    float *xs = (float *)(smem + HDR);                /* [MAX_COLS] */
    uint8_t *ring = smem + HDR + MAX_COLS * sizeof(float);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 2, q = lane & 3;
    const int G = gridDim.x, b = blockIdx.x;
    if (threadIdx.x == 0) {
        for (int i = 0; i < WARPS * STAGES; i++)
            bar_init(&bars[i], 1);
        bar_init_fence();
    }
    for (int i = threadIdx.x; i < MAX_PHASES; i += WARPS * 32)
        cnt[i] = 0;
    __syncthreads();
    uint64_t *wbar = bars + warp * STAGES;
    int *wown = own + warp * STAGES * 3;
    uint8_t *wring = ring + (size_t)warp * STAGES * UROWS * SLOT;
    const uint64_t policy = evict_first_policy();
    auto units = [&](int p) { return (int64_t)((c.p[p].rows + UROWS - 1) / UROWS); };
    auto nst = [&](int p) { return (c.p[p].cols / 256 + KC - 1) / KC; };
    auto take = [&](int p) { /* the CTA's next unit of phase p, or -1 */
        int u = 0;
        if (lane == 0)
            u = atomicAdd(&cnt[p], 1);
        u = b + G * __shfl_sync(0xffffffffu, u, 0);
        return u < units(p) ? u : -1;
    };
    int ip = p0, iu = take(p0), ist = 0; /* the next stage to issue */
    auto find = [&]() {
        while (iu < 0 && ++ip < p1)
            iu = take(ip);
    };
    find();
    int issued = 0;
    auto issue = [&](int slot) {
        if (lane == 0)
            wown[slot * 3] = ip, wown[slot * 3 + 1] = iu, wown[slot * 3 + 2] = ist;
        if (elect_one()) {
            const phase &ph = c.p[ip];
            const int nkb = ph.cols / 256, k0 = ist * KC;
            const int kc = nkb - k0 < KC ? nkb - k0 : KC;
            const int row0 = iu * UROWS, nr = ph.rows - row0 < UROWS ? ph.rows - row0 : UROWS;
            const uint32_t run = (uint32_t)kc * KB;
            bar_arrive_tx(&wbar[slot], run * (uint32_t)nr);
            const uint8_t *src = ph.w + ((size_t)row0 * nkb + k0) * KB;
            for (int i = 0; i < nr; i++)
                bulk_copy(wring + ((size_t)slot * UROWS + i) * SLOT, src + (size_t)i * nkb * KB,
                          run, &wbar[slot], policy);
        }
        issued++;
        if (++ist == nst(ip)) {
            ist = 0;
            iu = take(ip);
            find();
        }
    };
    for (int s = 0; s < STAGES && ip < p1; s++)
        issue(s);
    __syncwarp();

    int slot = 0, consumed = 0;
    uint32_t parity = 0;
    for (int p = p0; p < p1; p++) {
        const phase &ph = c.p[p];
        const int nkb = ph.cols / 256;
        /* the activations: after the product before this one is complete */
        if (MODE == M_FLAGS) {
            /* no barrier: each block of activations is waited for where it is read */
        } else if (MODE == M_LAUNCHES) {
            asm volatile("griddepcontrol.wait;" ::: "memory");
        } else if (MODE == M_PERSISTENT && p > p0) {
            if (threadIdx.x == 0) {
                const unsigned want = (unsigned)G * (unsigned)(p - p0);
                while (load_acquire(done) < want)
                    ;
            }
            __syncthreads();
        }
        for (int i = threadIdx.x; MODE != M_FLAGS && i < ph.cols; i += WARPS * 32)
            xs[i] = MODE == M_STREAMING ? 1.0f : __ldcg(ph.x + i);
        if (MODE != M_FLAGS)
            __syncthreads();
        /* this warp's stages of phase p, in the order they were issued */
        float acc = 0.0f;
        while (consumed < issued && wown[slot * 3] == p) {
            const int u = wown[slot * 3 + 1], st = wown[slot * 3 + 2];
            bar_wait(&wbar[slot], parity);
            const int k0 = st * KC, row0 = u * UROWS;
            const int nr = ph.rows - row0 < UROWS ? ph.rows - row0 : UROWS;
            const uint8_t *rowp = wring + ((size_t)slot * UROWS + (r < nr ? r : 0)) * SLOT;
            for (int e = q; e < KC && k0 + e < nkb; e += 4) {
                float xv;
                if (MODE == M_FLAGS) { /* block k0 + e of the product before: all its rows */
                    if (p > p0)
                        while (load_acquire(ready + (p - 1) * MAX_KB + k0 + e) < 256u)
                            ;
                    xv = __ldcg(ph.x + (k0 + e) * 256);
                } else {
                    xv = xs[(k0 + e) * 256];
                }
                const int xi = (int)(xv * 64.0f) * 0x01010101;
                const uint4 *blk = (const uint4 *)(rowp + e * KB);
                int sum = 0;
                for (int pass = 0; pass < work; pass++)
#pragma unroll
                    for (int k = 0; k < KB / 16; k++) {
                        const uint4 v = blk[k];
                        sum = __dp4a((int)v.x, xi + pass, sum);
                        sum = __dp4a((int)v.y, xi, sum);
                        sum = __dp4a((int)v.z, xi, sum);
                        sum = __dp4a((int)v.w, xi, sum);
                    }
                acc = fmaf((float)sum, 1e-6f, acc);
            }
            if (st == nst(p) - 1) { /* the unit's last stage: the row's output */
                acc += __shfl_down_sync(0xffffffffu, acc, 1);
                acc += __shfl_down_sync(0xffffffffu, acc, 2);
                if (q == 0 && r < nr)
                    ph.y[row0 + r] = acc;
                acc = 0.0f;
                if (MODE == M_FLAGS) { /* 8 more rows of block row0 / 256 are out */
                    __syncwarp();
                    if (lane == 0) {
                        __threadfence();
                        atomicAdd(ready + p * MAX_KB + row0 / 256, UROWS);
                    }
                }
            }
            __syncwarp(); /* every lane is done with the stage before it is refilled */
            consumed++;
            if (ip < p1)
                issue(slot);
            __syncwarp();
            if (++slot == STAGES)
                slot = 0, parity ^= 1;
        }
        if (MODE != M_FLAGS)
            __syncthreads(); /* every warp is done with xs and has written its outputs */
        if (MODE == M_PERSISTENT && threadIdx.x == 0) {
            __threadfence();
            atomicAdd(done, 1u);
        }
    }
#else
    (void)c, (void)p0, (void)p1, (void)work, (void)done, (void)ready;
#endif
}

static const size_t SMEM = HDR + MAX_COLS * sizeof(float) + (size_t)WARPS * STAGES * UROWS * SLOT;

/* The kernel of each mode, indexed by enum mode. */
typedef void (*stream_fn)(chain, int, int, int, unsigned *);
static const stream_fn kernels[N_MODES] = {stream_kernel<M_LAUNCHES>, stream_kernel<M_PERSISTENT>,
                                           stream_kernel<M_FLAGS>, stream_kernel<M_STREAMING>};

static double run_us(int mode, const chain &c, int work, unsigned *done, int sms)
{
    cudaStream_t s = (cudaStream_t)st;
    cudaGraph_t g;
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CU(cudaMemsetAsync(done, 0, (1 + (size_t)MAX_PHASES * MAX_KB) * sizeof(unsigned), s));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)sms);
    cfg.blockDim = dim3(WARPS * 32);
    cfg.dynamicSmemBytes = SMEM;
    cfg.stream = s;
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    if (mode == M_LAUNCHES) {
        for (int p = 0; p < c.n; p++) {
            cfg.attrs = &at;
            cfg.numAttrs = p > 0 ? 1 : 0; /* the first follows the memset */
            CU(cudaLaunchKernelEx(&cfg, kernels[mode], c, p, p + 1, work, done));
        }
    } else {
        CU(cudaLaunchKernelEx(&cfg, kernels[mode], c, 0, c.n, work, done));
    }
    CU(cudaStreamEndCapture(s, &g));
    return bench_graph_best_ms(g, 3, 10) * 1e3;
}

int main(int argc, char **argv)
{
    int work = 4, pairs = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--work") && i + 1 < argc)
            work = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            pairs = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: " BENCH_NAME " [--work N] [--pairs N]\n");
            return 2;
        }
    }
    if (work < 0 || work > 64 || pairs < 1 || 2 * pairs > MAX_PHASES) {
        fprintf(stderr, BENCH_NAME ": --work 0..64, --pairs 1..%d\n", MAX_PHASES / 2);
        return 2;
    }
    const struct cudaDeviceProp prop = bench_cuda_start();
    if (prop.major < 9) {
        printf(BENCH_NAME ": needs sm_90 (bulk copies); this device is sm_%d%d\n", prop.major,
               prop.minor);
        bench_cuda_end();
        return 0;
    }
    const int sms = prop.multiProcessorCount;
    for (int m = 0; m < N_MODES; m++)
        CU(cudaFuncSetAttribute(kernels[m], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)SMEM));
    const int shape[2][2] = {{6144, 5120}, {5120, 17408}}; /* cols, rows: A, B */
    uint8_t *w[2][COPIES];
    float *y[2];
    size_t wbytes[2];
    for (int k = 0; k < 2; k++) {
        wbytes[k] = (size_t)shape[k][1] * (shape[k][0] / 256) * KB;
        for (int j = 0; j < COPIES; j++) {
            TRY(cuda_mem_alloc((void **)&w[k][j], wbytes[k]));
            CU(cudaMemset(w[k][j], 0x11 * (j + 1), wbytes[k]));
        }
        TRY(cuda_mem_alloc((void **)&y[k], (size_t)shape[k][1] * sizeof(float)));
        CU(cudaMemset(y[k], 0, (size_t)shape[k][1] * sizeof(float)));
    }
    unsigned *done = NULL;
    TRY(cuda_mem_alloc((void **)&done, (1 + (size_t)MAX_PHASES * MAX_KB) * sizeof(unsigned)));
    chain c;
    memset(&c, 0, sizeof c);
    c.n = 2 * pairs;
    for (int p = 0; p < c.n; p++) {
        const int k = p & 1;
        c.p[p] = phase{w[k][(p / 2) % COPIES], y[k], y[1 - k], shape[k][1], shape[k][0]};
    }
    const double bytes = (double)pairs * (double)(wbytes[0] + wbytes[1]);
    printf(BENCH_NAME " on %s (%d SMs): chains of %d products (A 6144 -> 5120, %.1f MB; B 5120 "
                      "-> 17408, %.1f MB), work %d, best of 10 replays\n\n",
           prop.name, sms, c.n, wbytes[0] / 1e6, wbytes[1] / 1e6, work);
    printf("%-11s %12s %10s\n", "mode", "us per A+B", "GB/s");
    const char *names[] = {"launches", "persistent", "flags", "streaming"};
    for (int m = 0; m < N_MODES; m++) {
        const double us = run_us(m, c, work, done, sms);
        printf("%-11s %12.2f %10.1f\n", names[m], us / pairs, bytes / (us * 1e-6) / 1e9);
    }
    for (int k = 0; k < 2; k++) {
        for (int j = 0; j < COPIES; j++)
            cuda_mem_free(w[k][j]);
        cuda_mem_free(y[k]);
    }
    cuda_mem_free(done);
    bench_cuda_end();
    return 0;
}
