/* Host state of programmatic dependent launch (launch.cuh): which devices take it, whether
 * it is switched off, and how many CTAs of a kernel one wave holds. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/launch.cuh"

extern "C" {
#include "kernels/cuda_mem.h"
}

namespace {

/* Per device ordinal, filled on first use: 0 unknown, else 1 | pdl << 1 | n_sm << 2. Devices
 * do not change under a running process, so a racing second fill writes the same value. */
uint64_t g_dev[PDL_MAX_DEV];

/* 0 unknown, 1 on, 2 off (TANDEM_PDL=off or 0, or the runtime refused the attribute). */
int g_mode;

/* 2 when the environment switches name off ("off" or "0"), else 1: a g_mode-style value. */
int env_mode(const char *name)
{
    const char *e = getenv(name);
    return e && (strcmp(e, "off") == 0 || strcmp(e, "0") == 0) ? 2 : 1;
}

bool pdl_on(void)
{
    int m = __atomic_load_n(&g_mode, __ATOMIC_RELAXED);
    if (m == 0) {
        m = env_mode("TANDEM_PDL");
        int unknown = 0; /* a refusal recorded meanwhile stays */
        __atomic_compare_exchange_n(&g_mode, &unknown, m, false, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED);
        m = __atomic_load_n(&g_mode, __ATOMIC_RELAXED);
    }
    return m == 1;
}

/* 0 unknown, 1 on, 2 off (TANDEM_EARLY_READS=off or 0) */
int g_early;

/* 0 unknown, 1 on, 2 off (TANDEM_ROUND_PDL=off or 0) */
int g_round;

/* The SM count of device dev (0 when it cannot be asked) and whether its code runs
 * griddepcontrol (code_arch 900 and up). */
int dev_info(int dev, bool *pdl)
{
    uint64_t v = __atomic_load_n(&g_dev[dev], __ATOMIC_RELAXED);
    if (v == 0) {
        int n_sm = 0;
        if (cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            *pdl = false;
            return 0;
        }
        v = 1 | ((uint64_t)n_sm << 2) | (code_arch(dev) >= 900 ? 2 : 0);
        __atomic_store_n(&g_dev[dev], v, __ATOMIC_RELAXED);
    }
    *pdl = (v & 2) != 0;
    return (int)(v >> 2);
}

/* CTAs of fn per SM for the block shape: the cached value when the cache holds this shape
 * (bits 0-15: CTAs per SM + 1, 16-31: threads, 32-63: shared memory bytes), else asked and
 * cached. 0 when it cannot be asked. */
int ctas_per_sm(const void *fn, unsigned threads, size_t smem, uint64_t *occ)
{
    const uint64_t shape = ((uint64_t)(threads & 0xffffu) << 16) | ((uint64_t)smem << 32);
    const uint64_t v = __atomic_load_n(occ, __ATOMIC_RELAXED);
    if ((v & 0xffffu) != 0 && (v & ~(uint64_t)0xffffu) == shape)
        return (int)(v & 0xffffu) - 1;
    int n = 0;
    if (threads > 0xffffu || smem > 0xffffffffu ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, (int)threads, smem) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (n < 0xffff)
        __atomic_store_n(occ, shape | (uint64_t)(n + 1), __ATOMIC_RELAXED);
    return n;
}

/* Per device ordinal: code_arch + 1, 0 not asked yet. */
int g_arch[PDL_MAX_DEV];

__global__ void arch_probe_kernel(int *out)
{
#ifdef __CUDA_ARCH__
    *out = __CUDA_ARCH__;
#endif
}

/* Runs the probe on device dev (current or not) on a stream of its own, so that a stream
 * being recorded elsewhere is not touched. */
int probe_arch(int dev)
{
    int cur = 0, arch = 0, *d = NULL;
    cudaStream_t st = NULL;
    if (cudaGetDevice(&cur) != cudaSuccess || (cur != dev && cudaSetDevice(dev) != cudaSuccess))
        goto out;
    if (cudaMalloc((void **)&d, sizeof *d) == cudaSuccess &&
        cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess) {
        arch_probe_kernel<<<1, 1, 0, st>>>(d);
        if (cudaMemcpyAsync(&arch, d, sizeof arch, cudaMemcpyDeviceToHost, st) != cudaSuccess ||
            cudaStreamSynchronize(st) != cudaSuccess)
            arch = 0;
    }
    if (st)
        (void)cudaStreamDestroy(st);
    if (d)
        (void)cudaFree(d);
    if (cur != dev)
        (void)cudaSetDevice(cur);
out:
    (void)cudaGetLastError();
    return arch;
}

/* Per device ordinal: the opt-in shared memory per block + 1 and per SM + 1, 0 not asked. */
int g_optin[PDL_MAX_DEV], g_per_sm[PDL_MAX_DEV];

/* TANDEM_SMEM_OPTIN when it names a number of bytes below limit, else limit. */
int smem_cap(int limit)
{
    const char *e = getenv("TANDEM_SMEM_OPTIN");
    if (!e || !*e)
        return limit;
    char *end = NULL;
    const long long v = strtoll(e, &end, 10);
    return *end == '\0' && v > 0 && v < limit ? (int)v : limit;
}

int smem_ask(int dev, cudaDeviceAttr attr, int *cache)
{
    int v = dev >= 0 && dev < PDL_MAX_DEV ? __atomic_load_n(&cache[dev], __ATOMIC_RELAXED) : 0;
    if (v != 0)
        return v - 1;
    int optin = 0, n = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&n, attr, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    const int cap = smem_cap(optin);
    if (attr == cudaDevAttrMaxSharedMemoryPerBlockOptin)
        n = cap;
    else if (cap < optin && cap + 1024 < n)
        n = cap + 1024;
    if (dev < PDL_MAX_DEV)
        __atomic_store_n(&cache[dev], n + 1, __ATOMIC_RELAXED);
    return n;
}

} /* namespace */

int smem_optin_bytes(int dev)
{
    return smem_ask(dev, cudaDevAttrMaxSharedMemoryPerBlockOptin, g_optin);
}

int smem_sm_bytes(int dev)
{
    return smem_ask(dev, cudaDevAttrMaxSharedMemoryPerMultiprocessor, g_per_sm);
}

td_err sm_count(int dev, int *n)
{
    bool pdl = false;
    if (dev >= 0 && dev < PDL_MAX_DEV)
        *n = dev_info(dev, &pdl);
    else if (cudaDeviceGetAttribute(n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        *n = 0;
    if (*n > 0)
        return TD_OK;
    (void)cudaGetLastError();
    return err_set(TD_ECUDA, "the SM count of device %d cannot be asked", dev);
}

extern "C" int cuda_smem_optin(int dev)
{
    return smem_optin_bytes(dev);
}

int code_arch(int dev)
{
    if (dev < 0 || dev >= PDL_MAX_DEV)
        return 0;
    int v = __atomic_load_n(&g_arch[dev], __ATOMIC_RELAXED);
    if (v == 0) {
        v = probe_arch(dev) + 1;
        __atomic_store_n(&g_arch[dev], v, __ATOMIC_RELAXED);
    }
    return v - 1;
}

extern "C" int cuda_code_arch(int dev)
{
    return code_arch(dev);
}

pdl_plan pdl_plan_get(const void *fn, uint64_t blocks, unsigned threads, size_t smem,
                      uint64_t *occ)
{
    pdl_plan p = {false, false};
    int dev = 0;
    if (!pdl_on())
        return p;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return p;
    }
    if (dev < 0 || dev >= PDL_MAX_DEV)
        return p;
    const int n_sm = dev_info(dev, &p.pdl);
    if (!p.pdl)
        return p;
    const int per_sm = ctas_per_sm(fn, threads, smem, &occ[dev]);
    p.early = blocks <= (uint64_t)per_sm * (uint64_t)n_sm;
    return p;
}

void pdl_refuse(void)
{
    __atomic_store_n(&g_mode, 2, __ATOMIC_RELAXED);
}

bool pdl_enabled(void)
{
    return pdl_on();
}

/* The cached value of the off switch name in *slot. */
static bool switch_on(int *slot, const char *name)
{
    int m = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if (m == 0) {
        m = env_mode(name);
        __atomic_store_n(slot, m, __ATOMIC_RELAXED);
    }
    return m == 1;
}

bool pdl_early_reads(void)
{
    return switch_on(&g_early, "TANDEM_EARLY_READS");
}

bool pdl_round_after_any(void)
{
    return switch_on(&g_round, "TANDEM_ROUND_PDL");
}
