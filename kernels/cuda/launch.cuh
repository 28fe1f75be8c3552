/* Programmatic dependent launch (PDL) for the kernels of a forward pass (launch.cu holds
 * the host state). Include only from .cu files.
 *
 * Why: a 27B decode step is ~1450 kernels, ~550 of them a few us long, and a kernel's CTAs
 * are normally scheduled only once the previous grid has drained, so launch latency sits
 * between every two of them. A kernel started by pdl_launch on sm_90+ is a programmatic
 * dependent of the kernel before it on the stream: its CTAs may be scheduled once every CTA
 * of that kernel has executed griddepcontrol.launch_dependents (or exited), and wait in
 * griddepcontrol.wait, which returns when the kernels it depends on have completed and
 * their memory is visible. Only when CTAs start changes, never what they compute.
 *
 * The contract of a kernel started by pdl_launch:
 *  - its first parameter is `bool early` and every thread calls pdl_enter(early) once,
 *    before any global write, any read of memory the kernel before it may write, and any
 *    early return. Reads of weights (never written while a model runs), or of memory its
 *    caller says the work right before does not write (ops_delta.settled), may come first:
 *    they then overlap that kernel. Every thread waits, so the kernel completes only after
 *    the kernel before it has, and completion stays transitive along the stream: a kernel
 *    that waits for its predecessor may rely on every earlier kernel having finished
 *    (matmul.cu's scratch reuse rests on this too).
 *  - early (chosen by pdl_launch) is true when the whole grid is resident at once on this
 *    device (one wave, from the kernel's occupancy): the kernel then lets its dependents
 *    launch right after its wait, so their CTAs are scheduled while it runs and start the
 *    moment it completes. A grid of several waves triggers at exit only: dependents launch
 *    only once every CTA has triggered, that is when its last wave has started, and would
 *    then sit in wait beside that wave holding SM slots that other streams (or the other
 *    process under MPS) could use, to save one launch latency against several waves of
 *    work.
 * A kernel launched without the attribute before it (sampling), or a copy, fill,
 * event or graph launch before it, orders it as a plain launch would: programmatic
 * serialization only relaxes the dependency on a preceding kernel. Under stream capture
 * the attribute becomes a programmatic edge between the two kernel nodes
 * (cudaGraphDependencyTypeProgrammatic), so a replayed graph overlaps the same way.
 * Plain launches instead: below sm_90, with TANDEM_PDL=off (for measuring), and for the
 * rest of the process once the runtime refused the attribute. griddepcontrol.wait returns
 * at once in a kernel launched without it, and compiles to nothing below sm_90. */
#ifndef TANDEM_KERNELS_CUDA_LAUNCH_CUH
#define TANDEM_KERNELS_CUDA_LAUNCH_CUH

#include <stdint.h>

#include "kernels/cuda/cuda_common.h"

/* --- device side ------------------------------------------------------------------------ */

/* Waits for the kernels this grid depends on (completed, memory visible), then, when early,
 * lets the dependent kernel launch. */
__device__ __forceinline__ void pdl_enter(bool early)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (early)
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    (void)early;
}

/* Asks for the 128-byte line at p to be brought into L2 (nothing waits for it): what a
 * kernel may do with a weight before pdl_enter. */
__device__ __forceinline__ void dev_prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p));
}

/* --- host side -------------------------------------------------------------------------- */

/* Whether kernels of one token read their weights (and what their caller marks settled)
 * before pdl_enter; TANDEM_EARLY_READS=off reads everything after it, as blocks of several
 * tokens always do. */
bool pdl_early_reads(void);

/* Whether the quantised matmuls' activation rounding (matmul.cu) launches as a programmatic
 * dependent of whatever kernel is before it; TANDEM_ROUND_PDL=off only right after a
 * quantised matmul, as before the other kernels of a forward pass took part. */
bool pdl_round_after_any(void);

#define PDL_MAX_DEV 64 /* device ordinals served; launches on higher ones are plain */

/* __CUDA_ARCH__ of the device code this process runs on device dev (asked once by a probe
 * kernel, then cached): 900 for sm_90 code, 860 where a build for sm_86 alone runs its PTX,
 * compiled by the driver, on a Hopper. What sm_90 code has (griddepcontrol, bulk copies,
 * mbarriers) exists where this is >= 900, whatever the device could run, so host code
 * choosing such a kernel or the programmatic launch asks this, not the compute capability.
 * 0 when the probe cannot run. */
int code_arch(int dev);

/* Shared memory a block may opt in to on device dev (cached), and shared memory per SM: the
 * device's, or less where TANDEM_SMEM_OPTIN=BYTES names less (then per SM at most that plus
 * the 1 KB the system keeps per block), so that a larger GPU makes the kernel choices of a
 * smaller one, e.g. an RTX 3090's 101376 on a Hopper, for tests and measurements. A value
 * that is not a number of bytes below the device's is ignored. 0 when it cannot be asked.
 * Every choice of a kernel by shared memory asks these, never the device itself. */
int smem_optin_bytes(int dev);
int smem_sm_bytes(int dev);

/* The SM count of device dev into *n, asked once per device; TD_ECUDA when it cannot be
 * asked. */
td_err sm_count(int dev, int *n);

/* How one launch goes out. */
typedef struct pdl_plan {
    bool pdl;   /* with the programmatic stream serialization attribute */
    bool early; /* the kernel's `early` argument: the grid is one wave on this device */
} pdl_plan;

/* The plan for a grid of blocks CTAs of threads threads and smem bytes of dynamic shared
 * memory of kernel fn on the current device. occ[PDL_MAX_DEV] caches fn's CTAs per SM for
 * that block shape per device (zero-initialised; one array per kernel). Never fails: what
 * cannot be asked gives a plain launch. */
pdl_plan pdl_plan_get(const void *fn, uint64_t blocks, unsigned threads, size_t smem,
                      uint64_t *occ);

/* After a launch with the attribute failed and the same launch without it succeeded: plain
 * launches from now on. */
void pdl_refuse(void);

/* Whether launches take the attribute: not switched off by TANDEM_PDL and never refused. */
bool pdl_enabled(void);

/* One occupancy cache per kernel. */
template <auto K> uint64_t *pdl_occ_cache(void)
{
    static uint64_t occ[PDL_MAX_DEV];
    return occ;
}

/* Launches k(args...) on st with smem bytes of dynamic shared memory, as a programmatic
 * dependent of the kernel before it when pdl and pdl_enabled(); where the runtime refuses
 * the attribute, plainly, and plainly from then on (pdl_refuse). Not counted; an error is
 * cleared from the runtime (reported by the caller, not again by the next launch) and
 * returned. */
template <typename... P, typename... A>
cudaError_t launch_ex(void (*k)(P...), dim3 grid, dim3 block, size_t smem, bool pdl,
                      cudaStream_t st, A... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl && pdl_enabled() ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, k, args...);
    if (e != cudaSuccess && cfg.numAttrs) {
        (void)cudaGetLastError();
        cfg.numAttrs = 0;
        e = cudaLaunchKernelEx(&cfg, k, args...);
        if (e == cudaSuccess) /* the attribute was what failed */
            pdl_refuse();
    }
    if (e != cudaSuccess)
        (void)cudaGetLastError();
    return e;
}

/* Lets kernel K have up to bytes of dynamic shared memory (more than the 48 KB a launch gets
 * without opting in), once per device ordinal dev; every call for K passes the same bytes.
 * More than smem_optin_bytes is refused as the device itself refuses more than it has. */
template <auto K> td_err smem_optin(int dev, size_t bytes)
{
    static int done[PDL_MAX_DEV];
    if (dev >= 0 && dev < PDL_MAX_DEV && __atomic_load_n(&done[dev], __ATOMIC_ACQUIRE))
        return TD_OK;
    if (bytes > (size_t)smem_optin_bytes(dev))
        return err_set(TD_ECUDA, "a kernel asks for %zu bytes of shared memory per block; the "
                       "device gives %d", bytes, smem_optin_bytes(dev));
    CUDA_TRY(cudaFuncSetAttribute((const void *)K, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)bytes));
    if (dev >= 0 && dev < PDL_MAX_DEV)
        __atomic_store_n(&done[dev], 1, __ATOMIC_RELEASE);
    return TD_OK;
}

/* Launches K<<<grid, block, smem, st>>>(early, args...) as a programmatic dependent where it
 * can (see the top of this file), counted as one launch. what names the kernel in the
 * error message. (A kernel that falls back to a plain launch keeps its early: its
 * launch_dependents is then a no-op.) */
template <auto K, typename... A>
td_err pdl_launch(const char *what, dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                  A... args)
{
    const uint64_t blocks = (uint64_t)grid.x * grid.y * grid.z;
    const pdl_plan p = pdl_plan_get((const void *)K, blocks, block.x * block.y * block.z,
                                    smem, pdl_occ_cache<K>());
    const cudaError_t e = launch_ex(K, grid, block, smem, p.pdl, st, p.early, args...);
    cuda_launch_note(1);
    if (e != cudaSuccess)
        return err_set(TD_ECUDA, "%s launch (%llu CTAs of %u threads): %s", what,
                       (unsigned long long)blocks, block.x * block.y * block.z,
                       cudaGetErrorString(e));
    return TD_OK;
}

#endif
