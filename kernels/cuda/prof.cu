/* Timing events and the launch counter the profiler reads (kernels/backend_prof.c). */
#include "kernels/cuda/cuda_common.h"

extern "C" {
#include "kernels/cuda_mem.h"
}

unsigned long long cuda_launches = 0;

extern "C" uint64_t cuda_launch_count(void)
{
    return (uint64_t)__atomic_load_n(&cuda_launches, __ATOMIC_RELAXED);
}

/* A failed call also sits in CUDA's last-error slot: cleared so a later launch check does
 * not report it as its own. */
static td_err ev_fail(cudaError_t e, const char *what)
{
    (void)cudaGetLastError();
    return err_set(TD_ECUDA, "%s: %s", what, cudaGetErrorString(e));
}

extern "C" td_err cuda_event_create(cuda_event *ev)
{
    TD_ASSERT(ev != NULL);
    cudaEvent_t e = NULL;
    cudaError_t r = cudaEventCreate(&e);
    if (r != cudaSuccess)
        return ev_fail(r, "cudaEventCreate");
    *ev = e;
    return TD_OK;
}

extern "C" void cuda_event_free(cuda_event ev)
{
    if (ev)
        (void)cudaEventDestroy(ev);
}

extern "C" td_err cuda_event_record(cuda_event ev, ops_stream st)
{
    cudaError_t r = cudaEventRecord(ev, st);
    return r == cudaSuccess ? TD_OK : ev_fail(r, "cudaEventRecord");
}

extern "C" td_err cuda_event_wait(cuda_event ev)
{
    cudaError_t r = cudaEventSynchronize(ev);
    return r == cudaSuccess ? TD_OK : ev_fail(r, "cudaEventSynchronize");
}

extern "C" td_err cuda_event_elapsed_us(double *us, cuda_event begin, cuda_event end)
{
    float ms = 0;
    cudaError_t r = cudaEventElapsedTime(&ms, begin, end);
    if (r != cudaSuccess)
        return ev_fail(r, "cudaEventElapsedTime");
    *us = (double)ms * 1e3;
    return TD_OK;
}
