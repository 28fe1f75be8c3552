/* Device memory and streams for the CUDA twins (kernels/cuda/cuda_mem.cu), as td_err calls
 * a C caller can use: the engine places weights and activations, the GPU tests move data to
 * and from the ops. A GPU running out of memory is an error from outside: TD_ENOMEM with a
 * message, never a crash.
 *
 * cuda_available() exists in every build (false without CUDA), so callers pick a backend at
 * run time; the rest needs TANDEM_HAVE_CUDA. */
#ifndef TANDEM_KERNELS_CUDA_MEM_H
#define TANDEM_KERNELS_CUDA_MEM_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "kernels/ops.h"

#ifdef TANDEM_HAVE_CUDA

/* True when a CUDA device is present and a context can be made on the current device (a
 * driver, a device, not in a prohibited compute mode). */
bool cuda_available(void);

/* The stack each GPU thread may use. A context reserves it for every thread the GPU can
 * hold (1 KiB by default: ~270 MiB on an H100, ~125 MiB on an RTX 3090); the deepest kernel
 * here needs 168 bytes on sm_90 and 184 on sm_86 (delta_kernel, nvcc 13.0 `-Xptxas -v`). A
 * kernel that needs more raises the limit when it is launched, and more stays reserved. */
#define CUDA_STACK_BYTES 256
/* Sets the current device's context to CUDA_STACK_BYTES of stack, no device malloc heap and
 * no printf buffer (no kernel here uses either): ~220 MiB back on an H100. Tries each; the
 * first refusal is returned, and a context left with a limit as it was only holds more
 * memory than it needs (the backend goes on). */
td_err cuda_context_lean(void);
/* The current device's stack limit now (CUDA_STACK_BYTES unless a kernel raised it). */
size_t cuda_stack_bytes(void);

/* *p = bytes of device memory (NULL for 0 bytes). TD_ENOMEM when the device has no room. */
td_err cuda_mem_alloc(void **p, size_t bytes);
/* Frees what cuda_mem_alloc gave (NULL is fine). Waits for work using it on any stream. */
void cuda_mem_free(void *p);

/* Host -> device, queued on st; src may be reused when the call returns. Up to
 * CUDA_UPLOAD_INLINE bytes go as a kernel carrying them in its parameters, a programmatic
 * dependent of the kernel before it (launch.cuh); more by cudaMemcpyAsync. */
#define CUDA_UPLOAD_INLINE 1024
td_err cuda_mem_upload(void *dst, const void *src, size_t bytes, ops_stream st);
/* Device -> host; returns when the bytes are in dst (waits for st, so it also reports a
 * fault in earlier work on st). */
td_err cuda_mem_download(void *dst, const void *src, size_t bytes, ops_stream st);
/* Device -> device, queued on st. */
td_err cuda_mem_copy(void *dst, const void *src, size_t bytes, ops_stream st);
/* Device -> device (the ranges do not overlap), queued on st as a kernel that is a
 * programmatic dependent of the kernel before it (launch.cuh) where the bytes allow (4-byte aligned, up to 64 MiB; else as
 * cuda_mem_copy): a copy node or cudaMemcpyAsync between two kernels of a forward pass makes
 * the second wait for the first to drain before it can even launch. */
td_err cuda_mem_copy_chained(void *dst, const void *src, size_t bytes, ops_stream st);
/* rows copies of width bytes, device -> device: row r from src + r*spitch to dst + r*dpitch,
 * queued on st as one call. */
td_err cuda_mem_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t rows, ops_stream st);
/* The same (no row overlapping another's source) as one kernel, a programmatic dependent of
 * the kernel before it, where the bytes allow (addresses, pitches and width 4-byte aligned,
 * up to 64 MiB in all; else as cuda_mem_copy2d), for the reason of cuda_mem_copy_chained. */
td_err cuda_mem_copy2d_chained(void *dst, size_t dpitch, const void *src, size_t spitch,
                               size_t width, size_t rows, ops_stream st);
/* Sets bytes of device memory to byte value, queued on st. */
td_err cuda_mem_fill(void *p, int value, size_t bytes, ops_stream st);

/* A new non-blocking stream; NULL (the legacy default stream) is also a valid ops_stream. */
td_err cuda_stream_create(ops_stream *st);
void cuda_stream_free(ops_stream st);
/* Waits for everything queued on st; reports a fault of earlier work as TD_ECUDA. */
td_err cuda_stream_sync(ops_stream st);

/* Timing events (kernels/cuda/prof.cu), for the profiler. cudaEvent_t is a struct
 * CUevent_st *. */
typedef struct CUevent_st *cuda_event;
td_err cuda_event_create(cuda_event *ev);
void cuda_event_free(cuda_event ev);
/* Queues ev on st: it completes when the work queued before it has. */
td_err cuda_event_record(cuda_event ev, ops_stream st);
/* Waits until ev has completed. */
td_err cuda_event_wait(cuda_event ev);
/* Microseconds between two completed events. */
td_err cuda_event_elapsed_us(double *us, cuda_event begin, cuda_event end);

/* CUDA graphs (kernels/cuda/graph.cu): work queued on st between begin and end is recorded,
 * not run (relaxed capture mode: calls that are not stream work, such as attribute queries,
 * stay allowed), and end instantiates it. A failed end leaves st capturing nothing and
 * CUDA's error slot clear. */
td_err cuda_graph_begin(ops_stream st);
td_err cuda_graph_end(ops_stream st, void **graph);
td_err cuda_graph_launch(void *graph, ops_stream st);
void cuda_graph_free(void *graph);
/* Grows the matmuls' activation scratch of st (the quantised types' rounding, the F16/BF16
 * split) to what any matmul of up to 65536 inputs needs, so a graph captured afterwards never
 * holds a buffer a later growth frees (cuda_matmul grows them on demand and frees the old). */
td_err cuda_graph_prepare(ops_stream st);

/* __CUDA_ARCH__ of the device code this process runs on device dev: 900 for sm_90 code, 860
 * for an sm_86 build's PTX compiled by the driver for a newer GPU (launch.cuh: code_arch).
 * 0 when it cannot be asked. */
int cuda_code_arch(int dev);

/* Shared memory a block may opt in to on device dev, as the kernels' choices see it: the
 * device's, or less under TANDEM_SMEM_OPTIN (launch.cuh: smem_optin_bytes). 0 when it cannot
 * be asked. */
int cuda_smem_optin(int dev);

/* Kernel launches made by the CUDA twins so far in this process (every launch site of
 * kernels/cuda counts itself). */
uint64_t cuda_launch_count(void);

#else

static inline bool cuda_available(void)
{
    return false;
}

#endif /* TANDEM_HAVE_CUDA */

#endif
