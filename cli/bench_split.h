/* What splitting verifyd and draftd into two processes costs per speculative step, measured
 * between two real processes: verifyd's end sends a propose message of the real size, draftd's
 * end runs one small GPU kernel and answers with a proposal of block-1 tokens, then verifyd's
 * end runs one small kernel. Without MPS the GPU switches between the two processes' contexts
 * at every turn; under the CUDA MPS server both share one. The cost is that step's median
 * minus the same two kernels in one process.
 *
 * Both ends are fresh processes (the benchmark runs itself: `tandem bench --split-serve URL`
 * and `--split-client URL`), started before the benchmark creates its own CUDA context, so
 * that under MPS both are its clients. */
#ifndef TANDEM_CLI_BENCH_SPLIT_H
#define TANDEM_CLI_BENCH_SPLIT_H

#include <stdbool.h>
#include <stdint.h>

typedef struct bsplit_result {
    bool measured;      /* the pair ran and reported */
    bool gpu;           /* both ends ran their kernel on a CUDA device (else the CPU backend) */
    double step_us;     /* median: propose -> kernel -> proposal -> kernel, across processes */
    double local_us;    /* median: the two kernels in one process, no messages */
    double cost_us;     /* step_us - local_us: what the split adds to a speculative step */
    char why[256];      /* when not measured: the reason */
} bsplit_result;

/* Runs the pair without MPS, then under a private MPS control daemon when one starts (stopped
 * again afterwards). calls: round trips timed (after a warm-up); block: tokens per proposal
 * plus one. */
void bsplit_measure(int device, int calls, int block, bsplit_result *plain, bsplit_result *mps);

/* The two ends (each a process of its own); return the exit code. */
int bsplit_serve(const char *url, int device);
int bsplit_client(const char *url, int device, int calls, int block);

#endif
