/* bench_launch_cuda: what one link of a chain of dependent kernels costs on this GPU, the
 * unit a decode step is made of (~640 kernels, each reading what the one before wrote).
 *
 * A chain of 400 kernels of 256 threads is recorded as a CUDA graph and replayed; it prints
 * microseconds per link (the best of 10 replays) for grids of 1, 132 and 264 blocks, four
 * kinds of work after the dependency and three ways of waiting for it:
 *   work   none      the wait alone, then one store per thread;
 *          load      one 4-byte load of the previous kernel's output per thread;
 *          row       a row of 5120 floats (an activation row of the 27B) read by every block,
 *                    20 loads per thread issued together (one memory round trip);
 *          row-dep   the same row with each load's address depending on the last value
 *                    (20 round trips in a row: a loop that waits on every load);
 *   link   pdl       programmatic dependent launch as the forward pass uses it
 *                    (launch.cuh: griddepcontrol.wait, then launch_dependents);
 *          plain     no launch attribute: each kernel starts after the last one drained;
 *          flags     programmatic launch without griddepcontrol.wait: every block of a link
 *                    counts itself done (release add) and the next link's blocks spin on
 *                    that count (acquire loads) before reading.
 * Options: none. sm_90 for pdl and flags (below, pdl and flags launch as plain). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime.h>

extern "C" { /* the C headers bench_cuda.h includes, with C linkage */
#include "common/err.h"
#include "kernels/cuda_mem.h"
#include "kernels/ops.h"
}

#define BENCH_NAME "bench_launch_cuda"
#include "bench/bench_cuda.h"

#define LINKS 400
#define THREADS 256
#define ROW 5120
#define PER (ROW / THREADS) /* a row's loads per thread */

enum work { W_NONE, W_LOAD, W_ROW, W_ROW_DEP, N_WORK };
enum link { L_PDL, L_PLAIN, L_FLAGS, N_LINK };
static const char *work_name[N_WORK] = {"none", "load", "row", "row-dep"};
static const char *link_name[N_LINK] = {"pdl", "plain", "flags"};

/* Link i of a chain: waits for link i - 1 as LINK says, reads its output as WORK says and
 * writes one value per thread. done[i]: the blocks of link i that finished (flags). */
template <int WORK, int LINK>
__global__ void __launch_bounds__(THREADS) link_kernel(const float *in, float *out, unsigned *done,
                                                      int i)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (LINK == L_PDL)
        asm volatile("griddepcontrol.wait;" ::: "memory");
    if (LINK == L_FLAGS && i > 0) {
        if (threadIdx.x == 0)
            while (load_acquire(&done[i - 1]) < gridDim.x)
                ;
        __syncthreads();
    }
    if (LINK != L_PLAIN)
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    float s = 0;
    if (WORK == W_LOAD) {
        s = __ldcg(&in[threadIdx.x]);
    } else if (WORK == W_ROW) {
        float v[PER];
#pragma unroll
        for (int j = 0; j < PER; j++)
            v[j] = __ldcg(&in[threadIdx.x + j * THREADS]);
#pragma unroll
        for (int j = 0; j < PER; j++)
            s += v[j];
    } else if (WORK == W_ROW_DEP) {
        for (int j = 0; j < PER; j++) /* the address waits for the last value */
            s += __ldcg(&in[threadIdx.x + j * THREADS + (s > 1e30f)]);
    }
    out[blockIdx.x * THREADS + threadIdx.x] = s * 0x1p-40f + 1.0f;
    if (LINK == L_FLAGS) {
        __syncthreads();
        if (threadIdx.x == 0)
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(&done[i]) : "memory");
    }
}

typedef void (*link_fn)(const float *, float *, unsigned *, int);

template <int WORK> static link_fn pick(int l)
{
    return l == L_PDL ? link_kernel<WORK, L_PDL> : l == L_PLAIN ? link_kernel<WORK, L_PLAIN>
                                                                : link_kernel<WORK, L_FLAGS>;
}

static link_fn kernel_of(int w, int l)
{
    switch (w) {
    case W_NONE:
        return pick<W_NONE>(l);
    case W_LOAD:
        return pick<W_LOAD>(l);
    case W_ROW:
        return pick<W_ROW>(l);
    default:
        return pick<W_ROW_DEP>(l);
    }
}

/* Microseconds per link of a recorded chain of LINKS kernels of `blocks` blocks. */
static double chain_us(link_fn fn, int blocks, bool programmatic, float *buf[2], unsigned *done)
{
    cudaStream_t s = (cudaStream_t)st;
    cudaGraph_t g;
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CU(cudaMemsetAsync(done, 0, LINKS * sizeof(unsigned), s));
    for (int i = 0; i < LINKS; i++) {
        cudaLaunchAttribute at;
        at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)blocks);
        cfg.blockDim = dim3(THREADS);
        cfg.stream = s;
        cfg.attrs = &at;
        cfg.numAttrs = programmatic && i > 0 ? 1 : 0; /* link 0 follows the memset */
        const float *in = buf[i & 1];
        float *out = buf[(i + 1) & 1];
        CU(cudaLaunchKernelEx(&cfg, fn, in, out, done, i));
    }
    CU(cudaStreamEndCapture(s, &g));
    return bench_graph_best_ms(g, 3, 10) * 1e3 / LINKS;
}

int main(int argc, char **argv)
{
    (void)argv;
    if (argc > 1) {
        fprintf(stderr, "usage: " BENCH_NAME "\n");
        return 2;
    }
    const struct cudaDeviceProp prop = bench_cuda_start();
    const bool sm90 = prop.major >= 9;
    const size_t bytes = (size_t)264 * THREADS * sizeof(float);
    float *buf[2];
    unsigned *done = NULL;
    for (int k = 0; k < 2; k++) {
        TRY(cuda_mem_alloc((void **)&buf[k], bytes));
        CU(cudaMemset(buf[k], 0, bytes));
    }
    TRY(cuda_mem_alloc((void **)&done, LINKS * sizeof(unsigned)));
    printf(BENCH_NAME " on %s (%d SMs): chains of %d kernels of %d threads in a graph, us per "
                      "link (best of 10 replays)%s\n\n",
           prop.name, prop.multiProcessorCount, LINKS, THREADS,
           sm90 ? "" : "; below sm_90 every link is plain");
    printf("%-8s %7s", "work", "blocks");
    for (int l = 0; l < N_LINK; l++)
        printf(" %8s", link_name[l]);
    printf("\n");
    const int grids[] = {1, 132, 264};
    for (int w = 0; w < N_WORK; w++)
        for (int b = 0; b < 3; b++) {
            printf("%-8s %7d", work_name[w], grids[b]);
            for (int l = 0; l < N_LINK; l++)
                printf(" %8.3f", chain_us(kernel_of(w, l), grids[b], sm90 && l != L_PLAIN, buf,
                                          done));
            printf("\n");
        }
    for (int k = 0; k < 2; k++)
        cuda_mem_free(buf[k]);
    cuda_mem_free(done);
    bench_cuda_end();
    return 0;
}
