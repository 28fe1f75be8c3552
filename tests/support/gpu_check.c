/* Helpers of the GPU op tests (gpu_check.h). */
#include "tests/support/gpu_check.h"

#ifdef TANDEM_HAVE_CUDA

#include <cuda_runtime_api.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

ops_stream gpu_st;

static void must(td_err e, const char *what)
{
    if (e != TD_OK) {
        fprintf(stderr, "%s: %s: %s\n", what, err_name(e), err_msg());
        abort();
    }
}

bool gpu_check_init(void)
{
    /* only the tests it names (* and ?); kept here and taken out of the environment, so a
     * test's child processes (test_gpu_ops_matmul's variants) run their own tests */
    static char filter[256];
    const char *f = getenv("TANDEM_TEST_FILTER");
    if (f && *f) {
        snprintf(filter, sizeof filter, "%s", f);
        cmocka_set_test_filter(filter);
    }
    unsetenv("TANDEM_TEST_FILTER");
    if (!cuda_available()) {
        printf("skipped: no usable CUDA device\n");
        return false;
    }
    if (cuda_stream_create(&gpu_st) != TD_OK) {
        printf("skipped: no stream: %s\n", err_msg());
        return false;
    }
    return true;
}

void gpu_check_free(void)
{
    cuda_stream_free(gpu_st);
    gpu_st = NULL;
}

static uint64_t rng_state;

void rng_seed(uint64_t seed)
{
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
}

uint64_t rng_u64(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

float rng_f(void)
{
    return (float)((double)(rng_u64() >> 11) * 0x1p-52 - 1.0);
}

float *rng_floats(int64_t n, float scale)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    TD_ASSERT(x != NULL);
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_f() * scale;
    return x;
}

void *dput(const void *h, size_t bytes)
{
    void *d = NULL;
    must(cuda_mem_alloc(&d, bytes ? bytes : 4), "device allocation");
    must(cuda_mem_upload(d, h, bytes, gpu_st), "upload");
    return d;
}

void *dpoison(size_t bytes)
{
    void *d = NULL;
    must(cuda_mem_alloc(&d, bytes ? bytes : 4), "device allocation");
    must(cuda_mem_fill(d, 0xFF, bytes, gpu_st), "fill");
    return d;
}

void *dget(const void *d, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 4);
    TD_ASSERT(h != NULL);
    must(cuda_mem_download(h, d, bytes, gpu_st), "download");
    return h;
}

bool check_close(const char *what, const float *got, const float *want, int64_t n, float rtol,
                 float atol)
{
    for (int64_t i = 0; i < n; i++) {
        if ((isnan(want[i]) && isnan(got[i])) || got[i] == want[i])
            continue;
        if (!(fabsf(got[i] - want[i]) <= atol + rtol * fabsf(want[i]))) {
            fprintf(stderr, "%s: [%lld] = %.9g, CPU %.9g (of %lld)\n", what, (long long)i,
                    got[i], want[i], (long long)n);
            return false;
        }
    }
    return true;
}

bool check_same_bits(const char *what, const void *got, const void *want, size_t bytes)
{
    if (memcmp(got, want, bytes) == 0)
        return true;
    const uint8_t *g = got, *w = want;
    size_t i = 0;
    while (g[i] == w[i])
        i++;
    fprintf(stderr, "%s: differs at byte %zu of %zu\n", what, i, bytes);
    return false;
}

int gpu_check_one_token_launches(void)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess)
        return 2;
    return cuda_code_arch(dev) >= 900 ? 1 : 2; /* sm_90 code, not an sm_90 device */
}

#else

int gpu_check_one_token_launches(void)
{
    return 2;
}

#endif /* TANDEM_HAVE_CUDA */
