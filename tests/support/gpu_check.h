/* Helpers of the GPU op tests (tests/test_gpu_ops*.c): device copies of host data, NaN
 * poisoned outputs, a seeded generator, and comparisons that name the first bad element.
 * A failing device call aborts with CUDA's message (a test must not go on with no data);
 * the comparisons return false after printing, for assert_true. CUDA builds only. */
#ifndef TANDEM_TESTS_SUPPORT_GPU_CHECK_H
#define TANDEM_TESTS_SUPPORT_GPU_CHECK_H

/* The main of a GPU test in a build without CUDA: skipped (exit 77). */
#define GPU_CHECK_SKIP_MAIN                                                                  \
    int main(void)                                                                           \
    {                                                                                        \
        printf("skipped: this build has no CUDA\n");                                        \
        return 77;                                                                           \
    }

#ifdef TANDEM_HAVE_CUDA

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda_mem.h"
#include "kernels/ops.h"

/* In a cmocka test: expr must return TD_OK. */
#define GPU_OK(expr)                                                                         \
    do {                                                                                     \
        td_err gpu_ok_e_ = (expr);                                                           \
        if (gpu_ok_e_ != TD_OK)                                                              \
            fail_msg("%s: %s: %s", #expr, err_name(gpu_ok_e_), err_msg());                   \
    } while (0)

/* Sanitizer builds of a GPU test: the driver keeps process-lifetime allocations that
 * LeakSanitizer would report, and maps memory where ASan's shadow gap would be. Once per
 * test program, at file scope. */
#define GPU_CHECK_SANITIZER_OPTIONS                                                          \
    const char *__lsan_default_suppressions(void);                                          \
    const char *__lsan_default_suppressions(void)                                           \
    {                                                                                        \
        return "leak:libcuda.so\n";                                                         \
    }                                                                                        \
    const char *__asan_default_options(void);                                               \
    const char *__asan_default_options(void)                                                \
    {                                                                                        \
        return "protect_shadow_gap=0";                                                       \
    }

/* The stream every helper and test uses (created by gpu_check_init). */
extern ops_stream gpu_st;

/* Creates gpu_st; false (with a message printed) when there is no usable device. With
 * TANDEM_TEST_FILTER set, the cmocka groups run after it run only the tests whose names
 * match it (cmocka's pattern: * and ?); the variable is then removed from the environment,
 * so child processes started by a test do not inherit it. */
bool gpu_check_init(void);
void gpu_check_free(void);

/* xorshift64*: the same numbers on every machine for a seed. */
void rng_seed(uint64_t seed);
uint64_t rng_u64(void);
float rng_f(void); /* uniform in [-1, 1) */
/* malloc'ed n values rng_f() * scale (never NULL). */
float *rng_floats(int64_t n, float scale);

/* Device copy of bytes at h (cuda_mem_free it). */
void *dput(const void *h, size_t bytes);
/* Device buffer of bytes 0xFF: NaN as floats, -1 as int32, so unwritten outputs show. */
void *dpoison(size_t bytes);
/* malloc'ed host copy of bytes at d (waits for gpu_st). */
void *dget(const void *d, size_t bytes);

/* |got - want| <= atol + rtol * |want| for every element; NaN matches only NaN. */
bool check_close(const char *what, const float *got, const float *want, int64_t n, float rtol,
                 float atol);
/* The same bytes. */
bool check_same_bits(const char *what, const void *got, const void *want, size_t bytes);

#endif /* TANDEM_HAVE_CUDA */

/* Launches of a single-token quantised matmul on the current device: 1 where the bulk-copy
 * kernel rounds its own activations (sm_90), else 2 (the rounding kernel and the matmul).
 * Also in CPU-only builds, whose GPU tests skip before asking. */
int gpu_check_one_token_launches(void);

#endif
