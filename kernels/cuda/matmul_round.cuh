/* The activation rounding of the quantised matmuls, one 256-input block of one token by one
 * warp (mm_xquant in matmul_internal.h has the layout and the reasons): the one definition
 * that the rounding kernel (matmul.cu, into the scratch every kernel reads) and the bulk-copy
 * single-token kernel (matmul_bulk.cu, straight into its shared memory) both call, so the
 * two give the same bits. Include only from .cu files, after matmul_internal.h. */
#ifndef TANDEM_KERNELS_CUDA_MATMUL_ROUND_CUH
#define TANDEM_KERNELS_CUDA_MATMUL_ROUND_CUH

#include <stdint.h>
#include <string.h>

#include "kernels/cuda/matmul_internal.h"

namespace {

/* Three int8 digits of s: s = 65536 * s2 + 256 * s1 + s0, s0 and s1 in -128..127. */
__device__ __forceinline__ void digits3(int s, int8_t (&d)[3])
{
    const int s0 = ((s + 128) & 255) - 128;
    const int r = (s - s0) / 256; /* exact */
    const int s1 = ((r + 128) & 255) - 128;
    d[0] = (int8_t)s0;
    d[1] = (int8_t)s1;
    d[2] = (int8_t)((r - s1) / 256);
}

/* What lane l gets from rounding a block whose inputs 8l .. 8l+7 it holds. */
struct mm_round {
    uint4 q;  /* the 8 rounded inputs as hi/lo digits interleaved per UNIT: 16 bytes */
    float d;  /* the block's scale: max|x| / MM_XQMAX, NaN if the block holds NaN or inf */
    int s16;  /* sum of q over inputs 16 (l / 2) .. +15 (lanes l and l ^ 1) */
    int s32;  /* sum of q over inputs 32 (l / 4) .. +31 */
};

/* Every lane of the warp calls it with its 8 inputs v (zeros past the row): d = max|x| /
 * MM_XQMAX, q = rint(x * (1/d)) clamped to +-MM_XQMAX, q = 256 hi + lo. A block holding NaN
 * or inf gets d = NaN, so the outputs that use it are NaN as on the CPU, instead of the bad
 * value silently rounding to 0. */
template <int UNIT> __device__ __forceinline__ mm_round mm_round_block(const float (&v)[8])
{
    float amax = 0.0f;
    bool bad = false;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        amax = fmaxf(amax, fabsf(v[e]));
        bad |= !isfinite(v[e]);
    }
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    bad = __any_sync(0xffffffffu, bad);
    mm_round r;
    r.d = bad ? __int_as_float(0x7fc00000) : __fdiv_rn(amax, (float)MM_XQMAX);
    const float id = r.d > 0.0f ? __fdiv_rn(1.0f, r.d) : 0.0f;
    uint8_t out[16]; /* unit u of the lane (inputs UNIT u ..): hi[UNIT], lo[UNIT] */
    int s8 = 0;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        int q = __float2int_rn(__fmul_rn(v[e], id));
        q = q > MM_XQMAX ? MM_XQMAX : q < -MM_XQMAX ? -MM_XQMAX : q;
        s8 += q;
        const int l0 = ((q + 128) & 255) - 128;
        const int u = e / UNIT, k = e % UNIT;
        out[2 * UNIT * u + k] = (uint8_t)((q - l0) / 256);
        out[2 * UNIT * u + UNIT + k] = (uint8_t)l0;
    }
    memcpy(&r.q, out, sizeof r.q);
    r.s16 = s8 + __shfl_xor_sync(0xffffffffu, s8, 1);
    r.s32 = r.s16 + __shfl_xor_sync(0xffffffffu, r.s16, 2);
    return r;
}

} /* namespace */

#endif
