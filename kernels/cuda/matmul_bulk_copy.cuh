/* Bulk copies and mbarriers on sm_90, as the bulk-copy matmul kernels use them
 * (matmul_bulk.cu for one token, matmul_bulk_mma.cu for several): a stage of a ring is one
 * mbarrier; the thread that issues a stage's copies announces their bytes (expect_tx) and
 * arrives once, so the phase completes when the last byte has landed and not before, and a
 * reader waits (try_wait.parity) only for the stage it reads next. Every wait is bounded.
 * Device code for sm_90 only: include where MMB_SM90 is set (see matmul_bulk.cu). */
#ifndef TANDEM_KERNELS_CUDA_MATMUL_BULK_COPY_CUH
#define TANDEM_KERNELS_CUDA_MATMUL_BULK_COPY_CUH

#include <stdint.h>

namespace {

#if MMB_SM90

/* --- barriers and bulk copies ------------------------------------------------------------- */

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void bar_init(uint64_t *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
                 : "memory");
}

/* Makes the initialised barriers visible to the copy engine (the async proxy). */
__device__ __forceinline__ void bar_init_fence()
{
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* The phase's one arrival, announcing the bytes its copies will bring. */
__device__ __forceinline__ void bar_arrive_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(
                     smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

/* `bytes` more to come from copies on the current phase (no arrival). */
__device__ __forceinline__ void bar_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

/* The phase's one arrival. */
__device__ __forceinline__ void bar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar))
                 : "memory");
}

__device__ __forceinline__ bool bar_try(uint64_t *bar, uint32_t parity)
{
    uint32_t done;
    asm volatile("{\n .reg .pred p;\n"
                 " mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
    return done != 0;
}

/* Waits for the phase of the given parity to complete, sleeping >= 256 ns between polls
 * after SPIN polls (a sleep may last twice that: ring waits of a microsecond or less spin);
 * traps after 2^24 polls (seconds): only a wrong byte count or a lost copy gets there. */
template <unsigned SPIN = 16> __device__ __forceinline__ void bar_wait(uint64_t *bar, uint32_t parity)
{
    if (bar_try(bar, parity))
        return;
    for (uint32_t n = 0; !bar_try(bar, parity); n++) {
        if (n >= (1u << 24))
            __trap();
        if (n >= SPIN)
            __nanosleep(256);
    }
}

/* True in exactly one lane of the (converged) warp. */
__device__ __forceinline__ bool elect_one()
{
    uint32_t pred;
    asm volatile("{\n .reg .pred p;\n elect.sync _|p, 0xffffffff;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(pred));
    return pred != 0;
}

/* An L2 policy for data read once: evict it first. */
__device__ __forceinline__ uint64_t evict_first_policy()
{
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

/* An L2 policy for data other CTAs read too: keep it. */
__device__ __forceinline__ uint64_t evict_last_policy()
{
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    return p;
}

/* bytes (a multiple of 16) from global src to shared dst, both 16-byte aligned, completing
 * on bar. */
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes,
                                          uint64_t *bar, uint64_t policy)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;" ::"r"(smem_addr(dst)),
                 "l"(__cvta_generic_to_global(src)), "r"(bytes), "r"(smem_addr(bar)),
                 "l"(policy)
                 : "memory");
}

/* The box of the 2-D tensor map at map (a kernel parameter or global memory) whose first
 * element is (x, y) into shared dst (128-byte aligned), completing on bar; elements past the
 * tensor arrive as zeros and count as copied. */
__device__ __forceinline__ void tensor_copy_2d(void *dst, const void *map, int x, int y,
                                               uint64_t *bar, uint64_t policy)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(smem_addr(dst)),
                 "l"((uint64_t)map), "r"(x), "r"(y), "r"(smem_addr(bar)), "l"(policy)
                 : "memory");
}

#endif /* MMB_SM90 */

} /* namespace */

#endif
