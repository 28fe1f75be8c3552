/* The target forward pass on the CUDA backend: logits and every layer's residual against the
 * transformers golden files (with an f32 KV cache the CPU's bound; with the GPU's default f16
 * cache the bound its rounding needs), the GPU's block of tokens equal bit
 * for bit to running them one at a time (what lossless greedy speculation on the GPU needs),
 * and exact rollback. Skipped (77) without a CUDA device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/backend.h"
#include "kernels/cuda_mem.h"
#include "tests/support/gpu_check.h"
#include "tests/support/ops_golden.h"
#include "verifyd/target.h"

#ifndef TANDEM_HAVE_CUDA

GPU_CHECK_SKIP_MAIN

#else

static ops_backend *gpu;

static const char *const models[] = {
    "qwen35-tiny-f32", "qwen35-tiny-bf16", "qwen35-tiny-q8_0", "qwen3-tiny-f32",
    "qwen3-tied-q4_k", "qwen3-tied-q5_k",  "qwen3-tied-q6_k",  "qwen3-tied-q4_k_m",
};

static tgt_model *load_gpu(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "tests/data/models/%s.gguf", name);
    tgt_model *m = NULL;
    if (tgt_load_on(&m, path, gpu) != TD_OK)
        fail_msg("%s: %s", path, err_msg());
    return m;
}

/* n floats of backend memory copied to a new host array */
static float *download(const float *dev, int64_t n)
{
    float *h = malloc((size_t)n * sizeof(float));
    assert_int_equal(gpu->to_host(gpu, h, dev, (size_t)n * sizeof(float)), TD_OK);
    return h;
}

static float *dev_alloc(int64_t n)
{
    float *p = NULL;
    assert_int_equal(gpu->alloc(gpu, (void **)&p, (size_t)n * sizeof(float)), TD_OK);
    /* poison: NaN everywhere, so an element never written fails the comparisons */
    float *nan = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        nan[i] = NAN;
    assert_int_equal(gpu->to_device(gpu, p, nan, (size_t)n * sizeof(float)), TD_OK);
    free(nan);
    return p;
}

/* 1e-4 of the logit range for float weights, as on the CPU. Quantised weights: the GPU
 * multiplies activations rounded to 16-bit integers per 256 inputs (max error 2^-16 of the
 * block's largest input; the CPU uses f32), which on the tiny models' single-block rows moves
 * logits by up to 1.2e-3 of the range (measured by replaying that rounding on the CPU). */
static void expect_close(const char *what, const float *got, const float *want, int64_t n,
                         double tol)
{
    int64_t at;
    double r = golden_range_error(got, want, n, &at);
    if (!(r <= tol))
        fail_msg("%s: error %.3g of the range at %lld (got %.6g, want %.6g)", what, r,
                 (long long)at, got[at], want[at]);
}

/* Each model twice: with an f32 KV cache (the bounds above) and with the f16 cache the GPU
 * keeps by default, whose rounding alone moves the tiny models' logits by up to 5.1e-4 of
 * the range (measured on the CPU, test_target_kv16): 1e-3 for float weights, 3e-3 with the
 * quantised weights' activation rounding on top. */
static void gpu_target_golden(const char *name, td_dtype kv_type, int64_t delta_chunk)
{
    const char *const models[] = {name};
    for (size_t k = 0; k < 1; k++) {
        tgt_model *m = load_gpu(models[k]);
        assert_int_equal(m->kv_type, TD_F16); /* the GPU's default */
        m->kv_type = kv_type;
        assert_int_equal(tgt_set_delta_chunk(m, delta_chunk), TD_OK);
        char path[256];
        snprintf(path, sizeof path, "tests/data/golden/%s.gguf", models[k]);
        gguf_file *g = golden_open_path(path);
        int64_t T = golden_count(g, "tokens"), V = m->hp.n_vocab, D = m->hp.n_embd;
        int64_t L = m->hp.n_layer;
        const int32_t *tokens = golden_tensor(g, "tokens", TD_I32, T);
        int32_t taps[64];
        for (int64_t i = 0; i < L; i++)
            taps[i] = (int32_t)i;
        float *dl = dev_alloc(T * V), *dh = dev_alloc(T * L * D);
        tgt_state st;
        assert_int_equal(tgt_state_init(&st, m, T), TD_OK);
        tgt_out out = {.logits = dl, .taps = taps, .n_taps = L, .tap_out = dh};
        if (tgt_forward(m, &st, tokens, T, false, &out) != TD_OK)
            fail_msg("%s: %s", models[k], err_msg());
        float *logits = download(dl, T * V), *hid = download(dh, T * L * D);
        char what[128];
        snprintf(what, sizeof what, "%s logits (%s KV, delta chunk %lld)", models[k],
                 dtype_name(kv_type), (long long)delta_chunk);
        const gguf_tensor *wq = gguf_find_tensor(m->file, "blk.0.ffn_down.weight");
        bool fw = wq && (wq->type == TD_F32 || wq->type == TD_F16 || wq->type == TD_BF16);
        double tol = kv_type == TD_F32 ? (fw ? 1e-4 : 2e-3) : (fw ? 1e-3 : 3e-3);
        expect_close(what, logits, golden_tensor(g, "logits", TD_F32, T * V), T * V, tol);
        float *one = malloc((size_t)(T * D) * sizeof(float));
        for (int64_t l = 0; l < L; l++) {
            for (int64_t t = 0; t < T; t++)
                memcpy(one + t * D, hid + (t * L + l) * D, (size_t)D * sizeof(float));
            char hname[64];
            snprintf(hname, sizeof hname, "hidden.%lld", (long long)l);
            snprintf(what, sizeof what, "%s %s (%s KV)", models[k], hname, dtype_name(kv_type));
            expect_close(what, one, golden_tensor(g, hname, TD_F32, T * D), T * D, tol);
        }
        free(one);
        free(logits);
        free(hid);
        gpu->release(gpu, dl);
        gpu->release(gpu, dh);
        tgt_state_free(&st);
        gguf_close(g);
        tgt_free(m);
    }
}

static void test_gpu_target_matches_transformers(void **ctx)
{
    (void)ctx;
    for (size_t k = 0; k < sizeof models / sizeof *models; k++) {
        gpu_target_golden(models[k], TD_F32, 0);
        gpu_target_golden(models[k], TD_F16, 0);
        gpu_target_golden(models[k], TD_F32, 4); /* the chunked recurrence: the same bounds */
    }
}

/* A block of n tokens gives, for each token, exactly the logits of running the tokens one
 * at a time: verify and decode agree bit for bit on the GPU. */
static void test_gpu_target_block_equals_one_at_a_time(void **ctx)
{
    (void)ctx;
    const char *names[] = {"qwen35-tiny-f32", "qwen3-tied-q4_k_m"};
    for (size_t k = 0; k < 2; k++) {
        tgt_model *m = load_gpu(names[k]);
        int64_t V = m->hp.n_vocab, n = 16;
        int32_t toks[24];
        for (int i = 0; i < 24; i++)
            toks[i] = (int32_t)((i * 37 + 11) % V);
        tgt_state a, b;
        assert_int_equal(tgt_state_init(&a, m, 64), TD_OK);
        assert_int_equal(tgt_state_init(&b, m, 64), TD_OK);
        float *da = dev_alloc(n * V), *db = dev_alloc(V);
        assert_int_equal(tgt_forward(m, &a, toks, 8, false, NULL), TD_OK);
        assert_int_equal(tgt_forward(m, &b, toks, 8, false, NULL), TD_OK);
        tgt_out oa = {.logits = da};
        assert_int_equal(tgt_forward(m, &a, toks + 8, n, true, &oa), TD_OK);
        float *block = download(da, n * V);
        for (int64_t t = 0; t < n; t++) {
            tgt_out ob = {.logits = db};
            assert_int_equal(tgt_forward(m, &b, toks + 8 + t, 1, false, &ob), TD_OK);
            float *single = download(db, V);
            if (memcmp(single, block + t * V, (size_t)V * sizeof(float)))
                fail_msg("%s: token %lld of a block differs from running it alone", names[k],
                         (long long)t);
            free(single);
        }
        /* rollback: keep 5 of the block, then the next token agrees with a fresh run */
        assert_int_equal(tgt_state_keep(m, &a, 5), TD_OK);
        tgt_state c;
        assert_int_equal(tgt_state_init(&c, m, 64), TD_OK);
        assert_int_equal(tgt_forward(m, &c, toks, 13, false, NULL), TD_OK);
        tgt_out o1 = {.logits = da}, o2 = {.logits = db};
        assert_int_equal(tgt_forward(m, &a, toks + 20, 1, false, &o1), TD_OK);
        assert_int_equal(tgt_forward(m, &c, toks + 20, 1, false, &o2), TD_OK);
        float *x = download(da, V), *y = download(db, V);
        assert_memory_equal(x, y, (size_t)V * sizeof(float));
        free(x);
        free(y);
        free(block);
        gpu->release(gpu, da);
        gpu->release(gpu, db);
        tgt_state_free(&a);
        tgt_state_free(&b);
        tgt_state_free(&c);
        tgt_free(m);
    }
}

/* The forward passes above (every kernel of a prefill, a block and single tokens of each
 * model) ran in the backend's lean stack: none made the driver raise it (a deeper kernel
 * needs CUDA_STACK_BYTES raised with it, or each process reserves more than kvd counted). */
static void test_gpu_kernels_fit_the_lean_stack(void **state)
{
    (void)state;
    assert_int_equal(cuda_stack_bytes(), CUDA_STACK_BYTES);
}

int main(void)
{
    if (!cuda_available() || ops_backend_cuda_init(&gpu, 0) != TD_OK) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_target_matches_transformers),
        cmocka_unit_test(test_gpu_target_block_equals_one_at_a_time),
        cmocka_unit_test(test_gpu_kernels_fit_the_lean_stack), /* last: after every pass */
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ops_backend_cuda_free(gpu);
    return rc;
}

#endif /* TANDEM_HAVE_CUDA */
