/* Device helpers the CUDA twins share: the CPU's scalar functions (same formulas, so a
 * kernel and its oracle differ only by rounding), reductions in a fixed order, the Philox
 * generator, and stream-ordered scratch memory. Include only from .cu files.
 *
 * Fixed order: a warp reduces by xor butterfly (every lane ends with the same value, since
 * each step pairs the same two partial results), a block reduces warp results in warp order.
 * The order depends on blockDim only, which each kernel fixes, so results never depend on
 * timing or on what else is in the launch. */
#ifndef TANDEM_KERNELS_CUDA_OPS_DEV_CUH
#define TANDEM_KERNELS_CUDA_OPS_DEV_CUH

#include <math.h>
#include <stdint.h>

#include "kernels/cuda/cuda_common.h"

#define DEV_FULL_MASK 0xffffffffu

/* Threads of a row norm's block (norm.cu); a kernel that norms rows itself uses as many, so
 * its sums meet in the same order (fused.cu's qk_norm_rope). */
#define DEV_NORM_THREADS 256

/* 1 / (1 + e^-x) without overflow, as cpu_sigmoid. */
__device__ __forceinline__ float dev_sigmoid(float x)
{
    float e = expf(-fabsf(x));
    return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

/* log(1 + e^x) without overflow, as cpu_softplus. */
__device__ __forceinline__ float dev_softplus(float x)
{
    return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
}

/* x * sigmoid(x) and silu(gate) * up, as cpu_silu and cpu_swiglu (one definition for every
 * kernel that applies them, so fused and plain launches give the same bits). */
__device__ __forceinline__ float dev_silu(float x)
{
    return x * dev_sigmoid(x);
}

__device__ __forceinline__ float dev_swiglu(float gate, float up)
{
    return gate * dev_sigmoid(gate) * up;
}

__device__ __forceinline__ float dev_warp_sum(float v)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(DEV_FULL_MASK, v, off);
    return v;
}

__device__ __forceinline__ double dev_warp_sum(double v)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(DEV_FULL_MASK, v, off);
    return v;
}

/* fmaxf ignores a NaN operand, as the CPU's fmaxf loops do. */
__device__ __forceinline__ float dev_warp_max(float v)
{
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(DEV_FULL_MASK, v, off));
    return v;
}

/* Waits at barrier id for n threads of the block (whole warps); id 0 is __syncthreads, for
 * the whole block. */
__device__ __forceinline__ void dev_bar(int id, int n)
{
    if (id == 0)
        __syncthreads();
    else
        asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}

/* Sum of v over the n threads from thread first (whole warps, meeting at barrier bar),
 * returned to each of them; the same tree as dev_block_sum over a block of n threads. sh: 33
 * elements of shared memory of this group, free for reuse when the call returns. */
template <typename T> __device__ T dev_group_sum(T v, T *sh, int first, int n, int bar)
{
    const int t = (int)threadIdx.x - first, lane = t & 31, w = t >> 5, nw = (n + 31) >> 5;
    v = dev_warp_sum(v);
    dev_bar(bar, n); /* sh may still be read by the previous call */
    if (lane == 0)
        sh[w] = v;
    dev_bar(bar, n);
    if (w == 0) {
        v = lane < nw ? sh[lane] : (T)0;
        v = dev_warp_sum(v);
        if (lane == 0)
            sh[32] = v;
    }
    dev_bar(bar, n);
    return sh[32];
}

/* Sum of v over the block, returned to every thread. sh: 33 elements of shared memory, free
 * for reuse when the call returns. Every thread of the block must call it. */
template <typename T> __device__ T dev_block_sum(T v, T *sh)
{
    return dev_group_sum(v, sh, 0, (int)blockDim.x, 0);
}

/* The scale of an RMS norm over n values whose sum of squares is ss, and of an L2 norm: in
 * f64 until the end, as the CPU's. */
__device__ __forceinline__ float dev_rms_inv(double ss, int64_t n, float eps)
{
    return (float)(1.0 / sqrt(ss / (double)n + (double)eps));
}
/* One value of the gated RMSNorm (cpu_rmsnorm_silu): rmsnorm(x) * w * g with g = dev_gate(z),
 * inv from dev_rms_inv; w NULL: no weight (wi unused). */
__device__ __forceinline__ float dev_gate(float z)
{
    return __fmul_rn(z, dev_sigmoid(z));
}
__device__ __forceinline__ float dev_rmsnorm_silu_one(float x, float inv, const float *w, float wi,
                                                      float g)
{
    return __fmul_rn(w ? __fmul_rn(__fmul_rn(x, inv), wi) : __fmul_rn(x, inv), g);
}

__device__ __forceinline__ float dev_l2_inv(double ss, float eps)
{
    return (float)(1.0 / sqrt(ss + (double)eps));
}

/* Max of v over the block (NaN ignored unless every value is NaN), as dev_block_sum. */
__device__ __forceinline__ float dev_block_max(float v, float *sh)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = dev_warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : -INFINITY;
        v = dev_warp_max(v);
        if (lane == 0)
            sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}

/* Philox4x32-10 and the uniform double of ops_rand_uniform (kernels/cpu/sample.c): integer
 * arithmetic only, so the device draws exactly the host's numbers. */
__device__ __forceinline__ double dev_rand_uniform(uint64_t seed, uint64_t counter)
{
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    uint64_t bits = (((uint64_t)c0 << 32) | c1) >> 11; /* 53 bits */
    return (double)bits * 0x1p-53;
}

/* Stream-ordered scratch (cudaMallocAsync: after the first calls the pool serves it without
 * a device-wide synchronisation). Running out of memory is TD_ENOMEM. A failed call leaves
 * CUDA's last-error slot clear, so the next launch check does not report it again. */
static inline td_err dev_scratch_alloc(void **p, size_t bytes, cudaStream_t st,
                                       const char *what)
{
    *p = NULL;
    if (bytes == 0)
        return TD_OK;
    cudaError_t e = cudaMallocAsync(p, bytes, st);
    if (e == cudaSuccess)
        return TD_OK;
    (void)cudaGetLastError();
    *p = NULL;
    if (e == cudaErrorMemoryAllocation)
        return err_set(TD_ENOMEM, "%s: no room for %zu bytes of device scratch", what, bytes);
    return err_set(TD_ECUDA, "%s: cudaMallocAsync(%zu): %s", what, bytes,
                   cudaGetErrorString(e));
}

static inline void dev_scratch_free(void *p, cudaStream_t st)
{
    if (p)
        (void)cudaFreeAsync(p, st);
}

#endif
