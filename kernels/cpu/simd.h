/* Which code path of the CPU ops this processor runs: the hot loops (dequantisation, matrix
 * tiles) are compiled twice, for x86-64 with AVX2 and FMA (target "arch=haswell": 8-wide
 * vectors) and for plain x86-64 (SSE2), and picked per call by the processor's features.
 * GCC's target_clones("arch=haswell", ...) would pick by __builtin_cpu_is("haswell"), which
 * no AMD and no newer Intel core matches (they all ran the SSE2 clone), and its
 * "arch=x86-64-v3" clone keeps 128-bit vectors. */
#ifndef TANDEM_KERNELS_CPU_SIMD_H
#define TANDEM_KERNELS_CPU_SIMD_H

#include <stdbool.h>
#include <stdint.h>

#if defined(__x86_64__)
#define CPU_AVX2_TARGET __attribute__((target("avx2,fma")))

/* Reads what libgcc found at start-up: two loads and bit tests. */
static inline bool cpu_has_avx2_fma(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

/* sum of a[i] * b[i] in f32, vectorised (the order the compiler's reduction takes) */
static inline float cpu_dot_f32(const float *a, const float *b, int64_t n)
{
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

#endif
