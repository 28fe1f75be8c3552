/* What the CPU and CUDA code share of the K-quant formats (DESIGN section 8): plain
 * functions, __host__ __device__ under nvcc. */
#ifndef TANDEM_KQUANT_H
#define TANDEM_KQUANT_H

#include <stdint.h>

#ifdef __CUDACC__
#define KQ_HD static __host__ __device__ __forceinline__
#else
#define KQ_HD static inline
#endif

/* The 6-bit scale and min of sub-block j (0..7) from the 12 packed scale bytes s of a Q4_K or
 * Q5_K block. */
KQ_HD void kq_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

#endif
