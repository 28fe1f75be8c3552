/* Programmatic dependent launch (kernels/cuda/launch.cuh): long chains of kernels where each
 * reads what the one before it wrote (an embedding row, then adds and scales in place), at
 * one block, one wave and many waves, run directly and replayed from a CUDA graph whose
 * recording also holds a fill and a copy between kernels, and chains through copies and
 * small uploads made as kernels (cuda_mem_copy_chained, cuda_mem_copy2d_chained,
 * cuda_mem_upload). On sm_90 each
 * kernel is scheduled while the one before it still runs; a kernel that touched memory
 * before its griddepcontrol.wait would read a stale value and lose an increment, so the sums
 * below are exact only if every wait is in place. Skipped (77) without CUDA or a device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/backend.h"
#include "kernels/cuda_mem.h"
#include "kernels/ops.h"
#include "tests/support/gpu_check.h"

#ifndef TANDEM_HAVE_CUDA

int main(void)
{
    printf("skipped: this build has no CUDA\n");
    return 77;
}

#else

#include <cuda_runtime_api.h>

GPU_CHECK_SANITIZER_OPTIONS

/* The probe that decides whether launches are programmatic (and the sm_90 kernels are
 * chosen) names the arch of the code that runs: one this build holds (sm_86 or sm_90), none
 * newer than the device. A build for sm_86 alone on a Hopper runs sm_86 code. */
static void test_code_arch_is_the_running_codes(void **state)
{
    (void)state;
    int dev = 0, major = 0, minor = 0;
    assert_int_equal(cudaGetDevice(&dev), cudaSuccess);
    assert_int_equal(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
                     cudaSuccess);
    assert_int_equal(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev),
                     cudaSuccess);
    const int arch = cuda_code_arch(dev);
    printf("device %d: compute capability %d.%d, code for sm_%d\n", dev, major, minor,
           arch / 10);
    assert_true(arch == 860 || arch == 900);
    assert_true(arch <= major * 100 + minor * 10);
    assert_int_equal(cuda_code_arch(dev), arch); /* cached */
    ops_backend *be = NULL;
    assert_int_equal(ops_backend_cuda_init(&be, dev), TD_OK);
    char where[64], want[64];
    ops_backend_describe(be, where, sizeof where);
    snprintf(want, sizeof want, "cuda:%d (sm_%d code)", dev, arch / 10);
    assert_string_equal(where, want);
    ops_backend_cuda_free(be);
}

/* The shared memory the kernels' choices see: the device's, or TANDEM_SMEM_OPTIN's bytes
 * where those are fewer (run_gpu_tests under it makes a larger GPU choose as a smaller one). */
static void test_smem_optin_is_the_device_or_the_lower_switch(void **state)
{
    (void)state;
    int dev = 0, real = 0;
    assert_int_equal(cudaGetDevice(&dev), cudaSuccess);
    assert_int_equal(cudaDeviceGetAttribute(&real, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                     cudaSuccess);
    int want = real;
    const char *e = getenv("TANDEM_SMEM_OPTIN");
    if (e && *e) {
        char *end = NULL;
        const long long v = strtoll(e, &end, 10);
        if (*end == '\0' && v > 0 && v < real)
            want = (int)v;
    }
    printf("device %d: %d bytes of shared memory per block, %d as the kernels see it\n", dev,
           real, cuda_smem_optin(dev));
    assert_int_equal(cuda_smem_optin(dev), want);
    assert_int_equal(cuda_smem_optin(dev), want); /* cached */
}

#define CHAIN 300 /* add + scale pairs per chain */

/* Elements per chain: one block; 64 blocks of 256 (one wave on any GPU: its CTAs trigger
 * their dependents early); 2^22 (the grid-stride cap of 4096 blocks: several waves). */
static const int64_t sizes[] = {1, 64 * 256, (int64_t)1 << 22};

/* every one of the n floats at d equals want exactly */
static void expect_all(const char *what, const float *d, int64_t n, float want)
{
    float *h = dget(d, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        if (h[i] != want)
            fail_msg("%s: element %lld of %lld is %.9g, want %.9g", what, (long long)i,
                     (long long)n, h[i], want);
    free(h);
}

static float *dev_ones(int64_t n)
{
    float *h = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        h[i] = 1.0f;
    float *d = dput(h, (size_t)n * sizeof(float));
    free(h);
    return d;
}

/* x += 1 then x *= 1, CHAIN times: each kernel reads the previous one's output in place */
static void chain_launch(float *x, const float *one, int64_t n)
{
    for (int i = 0; i < CHAIN; i++) {
        GPU_OK(cuda_add(x, x, one, n, gpu_st));
        GPU_OK(cuda_scale(x, x, 1.0f, n, gpu_st));
    }
}

/* x = row 1 of an F32 table (row 0 zeros, row 1 all 5) by get_rows, then the chain */
static void test_pdl_chain_sees_each_predecessor_write(void **state)
{
    (void)state;
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        const int64_t n = sizes[s];
        const size_t bytes = (size_t)n * sizeof(float);
        float *table = calloc(2 * (size_t)n, sizeof(float));
        for (int64_t i = 0; i < n; i++)
            table[n + i] = 5.0f;
        const int32_t id = 1;
        void *dtable = dput(table, 2 * bytes);
        int32_t *did = dput(&id, sizeof id);
        ops_weight w;
        assert_int_equal(ops_weight_init(&w, TD_F32, 2, n, dtable), TD_OK);
        float *x = dpoison(bytes), *one = dev_ones(n);
        const uint64_t before = cuda_launch_count();
        GPU_OK(cuda_get_rows(x, &w, did, 1, gpu_st));
        chain_launch(x, one, n);
        assert_int_equal(cuda_launch_count() - before, 1 + 2 * CHAIN); /* one launch per op */
        char what[64];
        snprintf(what, sizeof what, "direct chain of %lld", (long long)n);
        expect_all(what, x, n, 5.0f + (float)CHAIN);
        free(table);
        cuda_mem_free(dtable);
        cuda_mem_free(did);
        cuda_mem_free(x);
        cuda_mem_free(one);
    }
}

/* Recorded: fill x with zeros, the chain on x, copy x to y, one more add on y. Every replay
 * starts from the fill, so x ends at CHAIN and y at CHAIN + 1 after each. */
static void test_pdl_graph_replay_keeps_order_across_fill_and_copy(void **state)
{
    (void)state;
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        const int64_t n = sizes[s];
        const size_t bytes = (size_t)n * sizeof(float);
        float *x = NULL, *y = NULL, *one = dev_ones(n);
        GPU_OK(cuda_mem_alloc((void **)&x, bytes));
        GPU_OK(cuda_mem_alloc((void **)&y, bytes));
        GPU_OK(cuda_stream_sync(gpu_st)); /* dev_ones' upload is not part of the recording */
        GPU_OK(cuda_graph_begin(gpu_st));
        GPU_OK(cuda_mem_fill(x, 0, bytes, gpu_st));
        chain_launch(x, one, n);
        GPU_OK(cuda_mem_copy(y, x, bytes, gpu_st));
        GPU_OK(cuda_add(y, y, one, n, gpu_st));
        void *graph = NULL;
        GPU_OK(cuda_graph_end(gpu_st, &graph));
        char what[64];
        for (int rep = 0; rep < 3; rep++) {
            GPU_OK(cuda_mem_fill(x, 0xFF, bytes, gpu_st)); /* NaN: a skipped fill shows */
            GPU_OK(cuda_mem_fill(y, 0xFF, bytes, gpu_st));
            GPU_OK(cuda_graph_launch(graph, gpu_st));
            snprintf(what, sizeof what, "replay %d of %lld, x", rep, (long long)n);
            expect_all(what, x, n, (float)CHAIN);
            snprintf(what, sizeof what, "replay %d of %lld, y", rep, (long long)n);
            expect_all(what, y, n, (float)(CHAIN + 1));
        }
        cuda_graph_free(graph);
        cuda_mem_free(x);
        cuda_mem_free(y);
        cuda_mem_free(one);
    }
}

/* cuda_mem_copy_chained inside a chain: x += 1, y = x, y += 1, x = y, 50 times, each copy a
 * programmatic dependent kernel (4-byte pieces for one float, 16-byte ones otherwise); a copy
 * that read before its wait, or a kernel that read before the copy finished, loses a step.
 * Then a copy the kernel cannot take (1-byte aligned, odd length) goes through
 * cudaMemcpyAsync and still gives the bytes. */
static void test_pdl_chained_copies_keep_order(void **state)
{
    (void)state;
    enum { STEPS = 50 };
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        const int64_t n = sizes[s];
        const size_t bytes = (size_t)n * sizeof(float);
        float *x = dev_ones(n), *one = dev_ones(n), *y = dpoison(bytes);
        const uint64_t before = cuda_launch_count();
        for (int i = 0; i < STEPS; i++) {
            GPU_OK(cuda_add(x, x, one, n, gpu_st));
            GPU_OK(cuda_mem_copy_chained(y, x, bytes, gpu_st));
            GPU_OK(cuda_add(y, y, one, n, gpu_st));
            GPU_OK(cuda_mem_copy_chained(x, y, bytes, gpu_st));
        }
        assert_int_equal(cuda_launch_count() - before, 4 * STEPS); /* the copies are kernels */
        char what[64];
        snprintf(what, sizeof what, "chained copies of %lld, x", (long long)n);
        expect_all(what, x, n, 1.0f + 2 * STEPS);
        snprintf(what, sizeof what, "chained copies of %lld, y", (long long)n);
        expect_all(what, y, n, 1.0f + 2 * STEPS);
        cuda_mem_free(x);
        cuda_mem_free(y);
        cuda_mem_free(one);
    }
    unsigned char h[1001];
    for (size_t i = 0; i < sizeof h; i++)
        h[i] = (unsigned char)(i * 7 + 3);
    unsigned char *src = dput(h, sizeof h), *dst = dpoison(sizeof h);
    const uint64_t before = cuda_launch_count();
    GPU_OK(cuda_mem_copy_chained(dst + 1, src + 1, sizeof h - 2, gpu_st));
    assert_int_equal(cuda_launch_count() - before, 0); /* not a kernel of ours */
    unsigned char *got = dget(dst, sizeof h);
    assert_memory_equal(got + 1, h + 1, sizeof h - 2);
    free(got);
    cuda_mem_free(src);
    cuda_mem_free(dst);
}

/* cuda_mem_copy2d_chained inside a chain (x += 1, y = x row by row, y += 1, x = y, 50 times,
 * rows of 48 x 3072 floats, each copy a programmatic dependent kernel); then the bytes
 * between different pitches with 16- and 4-byte pieces and with more rows than a grid has in
 * y (70000), nothing written between the rows, and a copy the kernel cannot take (an odd
 * width) through cudaMemcpy2DAsync, not a kernel of ours. */
static void test_pdl_chained_2d_copies_keep_order_and_bytes(void **state)
{
    (void)state;
    enum { STEPS = 50, ROWS = 48, W = 3072 };
    const int64_t n = (int64_t)ROWS * W;
    const size_t row = W * sizeof(float);
    float *x = dev_ones(n), *one = dev_ones(n), *y = dpoison((size_t)n * sizeof(float));
    uint64_t before = cuda_launch_count();
    for (int i = 0; i < STEPS; i++) {
        GPU_OK(cuda_add(x, x, one, n, gpu_st));
        GPU_OK(cuda_mem_copy2d_chained(y, row, x, row, row, ROWS, gpu_st));
        GPU_OK(cuda_add(y, y, one, n, gpu_st));
        GPU_OK(cuda_mem_copy2d_chained(x, row, y, row, row, ROWS, gpu_st));
    }
    assert_int_equal(cuda_launch_count() - before, 4 * STEPS);
    expect_all("chained 2D copies, x", x, n, 1.0f + 2 * STEPS);
    expect_all("chained 2D copies, y", y, n, 1.0f + 2 * STEPS);
    cuda_mem_free(x);
    cuda_mem_free(y);
    cuda_mem_free(one);
    static const struct {
        size_t dp, sp, width, rows;
        uint64_t launches;
    } cases[] = {{80, 48, 32, 7, 1}, {60, 24, 20, 7, 1}, {8, 4, 4, 70000, 1}, {61, 24, 21, 7, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const size_t dp = cases[c].dp, sp = cases[c].sp, w = cases[c].width, r = cases[c].rows;
        unsigned char *h = malloc(r * sp);
        for (size_t i = 0; i < r * sp; i++)
            h[i] = (unsigned char)(i * 7 + 3 + c);
        unsigned char *src = dput(h, r * sp), *dst = dpoison(r * dp);
        unsigned char *want = dget(dst, r * dp);
        for (size_t i = 0; i < r; i++)
            memcpy(want + i * dp, h + i * sp, w);
        before = cuda_launch_count();
        GPU_OK(cuda_mem_copy2d_chained(dst, dp, src, sp, w, r, gpu_st));
        assert_int_equal(cuda_launch_count() - before, cases[c].launches);
        unsigned char *got = dget(dst, r * dp);
        if (memcmp(got, want, r * dp) != 0)
            fail_msg("2D copy of %zu rows of %zu bytes, pitches %zu <- %zu: bytes differ", r, w,
                     dp, sp);
        free(got);
        free(want);
        free(h);
        cuda_mem_free(src);
        cuda_mem_free(dst);
    }
}

/* Small uploads (cuda_mem_upload up to CUDA_UPLOAD_INLINE bytes) are kernels of the chain:
 * each step uploads x = i (the same host buffer, rewritten right after the call), adds one
 * and copies x into row i of ys, so row i holds i + 1 only if the upload waited for the
 * copy before it and the add for the upload. Then the bytes themselves: every size around
 * the kernel's classes at offsets 0, 1, 2 and 4 (word and byte paths), the host buffer
 * scribbled on right after each call, one launch each up to the limit and none beyond. */
static void test_pdl_small_uploads_keep_order_and_bytes(void **state)
{
    (void)state;
    enum { STEPS = 40, W = CUDA_UPLOAD_INLINE / 4 };
    static const int64_t widths[] = {1, 3, 64, W};
    for (size_t s = 0; s < sizeof widths / sizeof *widths; s++) {
        const int64_t n = widths[s];
        const size_t bytes = (size_t)n * sizeof(float);
        float *x = dpoison(bytes), *one = dev_ones(n), *ys = dpoison(STEPS * bytes);
        float *h = malloc(bytes);
        const uint64_t before = cuda_launch_count();
        for (int i = 0; i < STEPS; i++) {
            for (int64_t j = 0; j < n; j++)
                h[j] = (float)i;
            GPU_OK(cuda_mem_upload(x, h, bytes, gpu_st));
            for (int64_t j = 0; j < n; j++)
                h[j] = -1.0f; /* taken when the call was made */
            GPU_OK(cuda_add(x, x, one, n, gpu_st));
            GPU_OK(cuda_mem_copy_chained(ys + i * n, x, bytes, gpu_st));
        }
        assert_int_equal(cuda_launch_count() - before, 3 * STEPS); /* the uploads are kernels */
        float *got = dget(ys, STEPS * bytes);
        for (int i = 0; i < STEPS; i++)
            for (int64_t j = 0; j < n; j++)
                if (got[i * n + j] != (float)(i + 1))
                    fail_msg("uploads of %lld floats: step %d element %lld is %.9g, want %d",
                             (long long)n, i, (long long)j, got[i * n + j], i + 1);
        free(got);
        free(h);
        cuda_mem_free(x);
        cuda_mem_free(one);
        cuda_mem_free(ys);
    }
    static const size_t sizes_b[] = {1, 2, 3, 4, 5, 63, 64, 65, 255, 256, 257, 1000,
                                     CUDA_UPLOAD_INLINE - 1, CUDA_UPLOAD_INLINE,
                                     CUDA_UPLOAD_INLINE + 1, 5000};
    static const size_t offs[] = {0, 1, 2, 4};
    unsigned char want[5000], h[5000];
    for (size_t i = 0; i < sizeof want; i++)
        want[i] = (unsigned char)(i * 37 + 11);
    for (size_t a = 0; a < sizeof sizes_b / sizeof *sizes_b; a++) {
        for (size_t o = 0; o < sizeof offs / sizeof *offs; o++) {
            const size_t n = sizes_b[a], off = offs[o], total = n + 16;
            unsigned char *d = dpoison(total);
            unsigned char *before_bytes = dget(d, total);
            memcpy(h, want, n);
            const uint64_t before = cuda_launch_count();
            GPU_OK(cuda_mem_upload(d + off, h, n, gpu_st));
            assert_int_equal(cuda_launch_count() - before, n <= CUDA_UPLOAD_INLINE ? 1 : 0);
            memset(h, 0xA5, n);
            unsigned char *got = dget(d, total);
            if (memcmp(got + off, want, n) != 0)
                fail_msg("upload of %zu bytes at offset %zu: bytes differ", n, off);
            if (memcmp(got, before_bytes, off) != 0 ||
                memcmp(got + off + n, before_bytes + off + n, total - off - n) != 0)
                fail_msg("upload of %zu bytes at offset %zu wrote outside its range", n, off);
            free(got);
            free(before_bytes);
            cuda_mem_free(d);
        }
    }
}

int main(void)
{
    if (!gpu_check_init())
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_code_arch_is_the_running_codes),
        cmocka_unit_test(test_smem_optin_is_the_device_or_the_lower_switch),
        cmocka_unit_test(test_pdl_chain_sees_each_predecessor_write),
        cmocka_unit_test(test_pdl_graph_replay_keeps_order_across_fill_and_copy),
        cmocka_unit_test(test_pdl_chained_copies_keep_order),
        cmocka_unit_test(test_pdl_chained_2d_copies_keep_order_and_bytes),
        cmocka_unit_test(test_pdl_small_uploads_keep_order_and_bytes),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_check_free();
    return rc;
}

#endif
