/* Which code path of the CPU ops this processor runs: the hot loops (dequantisation, matrix
 * tiles) are compiled twice, for x86-64 with AVX2 and FMA (target "arch=haswell": 8-wide
 * vectors) and for plain x86-64 (SSE2), and picked per call by the processor's features.
 * GCC's target_clones("arch=haswell", ...) would pick by __builtin_cpu_is("haswell"), which
 * no AMD and no newer Intel core matches (they all ran the SSE2 clone), and its
 * "arch=x86-64-v3" clone keeps 128-bit vectors. */
#ifndef TANDEM_KERNELS_CPU_SIMD_H
#define TANDEM_KERNELS_CPU_SIMD_H

#include <stdbool.h>

#if defined(__x86_64__)
#define CPU_AVX2_TARGET __attribute__((target("avx2,fma")))

/* Reads what libgcc found at start-up: two loads and bit tests. */
static inline bool cpu_has_avx2_fma(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

#endif
