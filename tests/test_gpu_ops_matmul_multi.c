/* cuda_matmul_multi (one activation rounding for the matrices that read the same input):
 * each output is bit for bit what a separate cuda_matmul gives, for mixed groups (Q4_K +
 * Q6_K as attn_q/k/v of a Q4_K_M file, BF16/F32/F16 members, Q5_K, Q8_0, a 33000-row Q4_K
 * that one token runs on the dp4a single-token kernel beside a small Q4_K on the tensor-core
 * kernel, so one group needs two roundings of one type: below sm_90, or on sm_90 under
 * TANDEM_MMD=regs) at n_tok 1, 5, 16, 33, 65 (two
 * chunks) and 70, members of one type that run in one launch (sets of up to 4 on the bulk-copy,
 * window, F32 and F16/BF16 kernels, rows ending inside a unit; F16/BF16 members sharing one
 * activation split); and within the quantisation bound of
 * cpu_matmul, so the group and the
 * separate calls cannot agree on a wrong answer. Groups queued back to back without a wait
 * (the next rounding overwrites the scratch the previous group's kernels read) give the same
 * bits. The profiler counts a group's launches (roundings + kernels) exactly; a recorded
 * group replays on new inputs bit for bit; a bad member fails the group before anything is
 * enqueued. Skips (77) without CUDA or a device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/backend.h"
#include "kernels/backend_prof.h"
#include "kernels/cuda_mem.h"
#include "kernels/ops.h"
#include "tests/support/gpu_check.h"

#define SKIP_EXIT 77

#ifndef TANDEM_HAVE_CUDA

GPU_CHECK_SKIP_MAIN

#else

GPU_CHECK_SANITIZER_OPTIONS

#define MAX_TOK 70
#define MAX_MEM 8
#define XBLOCK 256  /* inputs per activation scale (MM_XBLOCK) */
#define XQMAX 32639 /* largest rounded activation (MM_XQMAX) */

static const int64_t n_toks[] = {1, 5, 16, 33, 65, MAX_TOK};

/* ---- a weight on both sides ---------------------------------------------------------- */

typedef struct test_weight {
    ops_weight host; /* data in host memory, for the CPU */
    ops_weight dev;  /* the same bytes on the device */
    float *deq;      /* [rows][cols] dequantised (cpu_dequantize_row) */
} test_weight;

/* Random weights in [-1, 1) rounded to type by cpu_quantize_row. */
static void weight_init(test_weight *tw, td_dtype type, int64_t rows, int64_t cols)
{
    uint64_t rb = 0;
    assert_int_equal(dtype_bytes(type, (uint64_t)cols, &rb), TD_OK);
    uint8_t *bytes = malloc((size_t)(rows * (int64_t)rb));
    float *f = rng_floats(rows * cols, 1.0f);
    tw->deq = malloc((size_t)(rows * cols) * sizeof(float));
    assert_non_null(bytes);
    assert_non_null(tw->deq);
    for (int64_t r = 0; r < rows; r++) {
        assert_int_equal(cpu_quantize_row(type, f + r * cols, bytes + r * rb, cols), TD_OK);
        assert_int_equal(cpu_dequantize_row(type, bytes + r * rb, tw->deq + r * cols, cols),
                         TD_OK);
    }
    free(f);
    assert_int_equal(ops_weight_init(&tw->host, type, rows, cols, bytes), TD_OK);
    tw->dev = tw->host;
    tw->dev.data = dput(bytes, (size_t)(rows * (int64_t)rb));
}

static void weight_free(test_weight *tw)
{
    free((void *)tw->host.data);
    cuda_mem_free((void *)tw->dev.data);
    free(tw->deq);
}

static bool is_quant(td_dtype t)
{
    return t != TD_F32 && t != TD_F16 && t != TD_BF16;
}

/* Activations in [-2, 2) with one large input per token, so blocks get different scales. */
static float *make_x(int64_t cols, uint64_t seed)
{
    rng_seed(seed);
    float *x = rng_floats(MAX_TOK * cols, 2.0f);
    for (int64_t t = 0; t < MAX_TOK; t++)
        x[t * cols + (t * 7919) % cols] *= 16.0f;
    return x;
}

/* make_x's activations on the device; *host keeps them for the references. */
static float *make_dx(int64_t cols, uint64_t seed, float **host)
{
    *host = make_x(cols, seed);
    return dput(*host, (size_t)(MAX_TOK * cols) * sizeof(float));
}

/* y [n][rows] of the GPU against cpu_matmul: a quantised weight meets x rounded per 256
 * inputs to d = max|x| / XQMAX, so an output moves by at most sum_b d_b / 2 * sum_{k in b}
 * |w_k|; f32 summation in either order adds at most 1e-5 of sum |w x| here (cols <= 1024). */
static bool close_to_cpu(const char *what, const float *y, const test_weight *tw,
                         const float *x, int64_t n)
{
    const int64_t rows = tw->host.rows, cols = tw->host.cols;
    float *want = malloc((size_t)(n * rows) * sizeof(float));
    cpu_matmul(want, x, &tw->host, n);
    bool ok = true;
    for (int64_t t = 0; t < n && ok; t++)
        for (int64_t r = 0; r < rows && ok; r++) {
            const float *xt = x + t * cols, *wr = tw->deq + r * cols;
            double bound = 0, mag = 0;
            for (int64_t b = 0; b < cols; b += XBLOCK) {
                double amax = 0, wsum = 0;
                for (int64_t k = b; k < b + XBLOCK && k < cols; k++) {
                    amax = fmax(amax, fabs((double)xt[k]));
                    wsum += fabs((double)wr[k]);
                    mag += fabs((double)xt[k] * (double)wr[k]);
                }
                if (is_quant(tw->host.type))
                    bound += amax / XQMAX / 2 * wsum;
            }
            bound += 1e-5 * mag;
            const double got = y[t * rows + r], ref = want[t * rows + r];
            if (!(fabs(got - ref) <= bound)) {
                printf("%s: y[%lld][%lld] = %.9g, cpu %.9g, bound %.3g\n", what, (long long)t,
                       (long long)r, got, ref, bound);
                ok = false;
            }
        }
    free(want);
    return ok;
}

/* ---- groups ----------------------------------------------------------------------------- */

typedef struct member {
    td_dtype type;
    int64_t rows;
} member;

typedef struct group {
    const char *name;
    int64_t cols;
    int n;
    member m[MAX_MEM];
} group;

/* What the model's groups look like (attention q/k/v of a Q4_K_M file, FFN gate/up,
 * DeltaNet projections with float alpha/beta), and mixes that interleave layouts. */
static const group groups[] = {
    {"q4k q4k q6k (attention, Q4_K_M)", 512, 3, {{TD_Q4_K, 96}, {TD_Q4_K, 40}, {TD_Q6_K, 24}}},
    {"q4k q6k bf16 f32", 768, 4, {{TD_Q4_K, 33}, {TD_Q6_K, 17}, {TD_BF16, 9}, {TD_F32, 5}}},
    {"bf16 q6k f16 q4k q8_0 q5k q6k", 512, 7,
     {{TD_BF16, 16}, {TD_Q6_K, 31}, {TD_F16, 8}, {TD_Q4_K, 64}, {TD_Q8_0, 19}, {TD_Q5_K, 48},
      {TD_Q6_K, 7}}},
    /* 33000 rows: one token takes the dp4a single-token kernel (its own activation
     * placement) while the 200-row Q4_K stays on the tensor cores: two roundings in one
     * group. On sm_90 one token takes the bulk-copy kernel (the plain layout) on both, so
     * the group shares one rounding there; TANDEM_MMD=regs brings the two back. */
    {"q4k 33000 rows + q4k 200 rows + q4k 33000 rows", 256, 3,
     {{TD_Q4_K, 33000}, {TD_Q4_K, 200}, {TD_Q4_K, 33000}}},
    {"f32 f32 (no quantised member)", 256, 2, {{TD_F32, 12}, {TD_F32, 3}}},
    {"q8_0 alone", 1024, 1, {{TD_Q8_0, 77}}},
    /* five members of one type: one launch of four and one of one where the kernel takes
     * sets (the bulk-copy and window kernels, F32); rows that end inside a unit of 8 rows or
     * a tile of 16, and a 1-row member */
    {"five q6k", 512, 5,
     {{TD_Q6_K, 40}, {TD_Q6_K, 9}, {TD_Q6_K, 1}, {TD_Q6_K, 300}, {TD_Q6_K, 17}}},
    {"three q4k + five f32 (6144 inputs: rounded by the bulk-copy kernel)", 6144, 8,
     {{TD_Q4_K, 24}, {TD_F32, 3}, {TD_Q4_K, 7}, {TD_F32, 5}, {TD_F32, 1}, {TD_F32, 8},
      {TD_F32, 2}, {TD_Q4_K, 33}}},
    /* a drafter's q/k/v and more BF16 beside an F16: BF16 sets of 4 + 1 (tiles of 16 rows,
     * members ending inside one), the F16 alone */
    {"five bf16 + f16 (drafter projections)", 640, 6,
     {{TD_BF16, 64}, {TD_BF16, 16}, {TD_BF16, 9}, {TD_F16, 24}, {TD_BF16, 33}, {TD_BF16, 1}}},
    /* Q6_K rows of 1024 inputs in even numbers: the window and wide kernels copy them by
     * pairs, one tensor map per member */
    {"five q6k by pairs", 1024, 5,
     {{TD_Q6_K, 40}, {TD_Q6_K, 6}, {TD_Q6_K, 2}, {TD_Q6_K, 300}, {TD_Q6_K, 18}}},
};

typedef struct group_run {
    test_weight w[MAX_MEM];
    ops_mm_out out[MAX_MEM]; /* device outputs [MAX_TOK][rows] of the multi call */
    float *sep[MAX_MEM];     /* device outputs of separate cuda_matmul calls */
} group_run;

static void run_init(group_run *g, const group *gr)
{
    for (int i = 0; i < gr->n; i++) {
        weight_init(&g->w[i], gr->m[i].type, gr->m[i].rows, gr->cols);
        const size_t bytes = (size_t)(MAX_TOK * gr->m[i].rows) * sizeof(float);
        g->out[i].y = dpoison(bytes);
        g->out[i].w = &g->w[i].dev;
        g->sep[i] = dpoison(bytes);
    }
}

static void run_free(group_run *g, const group *gr)
{
    for (int i = 0; i < gr->n; i++) {
        weight_free(&g->w[i]);
        cuda_mem_free(g->out[i].y);
        cuda_mem_free(g->sep[i]);
    }
}

/* The multi call's outputs against the separate calls' (same bits) and the CPU (bound). */
static void expect_group(const char *what, const group_run *g, const group *gr,
                         const float *x, int64_t n, bool vs_cpu)
{
    for (int i = 0; i < gr->n; i++) {
        const size_t bytes = (size_t)(n * gr->m[i].rows) * sizeof(float);
        float *got = dget(g->out[i].y, bytes), *want = dget(g->sep[i], bytes);
        char at[256];
        snprintf(at, sizeof at, "%s: %s n_tok %lld member %d (%s, %lld rows)", gr->name, what,
                 (long long)n, i, dtype_name(gr->m[i].type), (long long)gr->m[i].rows);
        assert_true(check_same_bits(at, got, want, bytes));
        if (vs_cpu)
            assert_true(close_to_cpu(at, got, &g->w[i], x, n));
        free(got);
        free(want);
    }
}

static void poison_outputs(const group_run *g, const group *gr)
{
    for (int i = 0; i < gr->n; i++)
        GPU_OK(cuda_mem_fill(g->out[i].y, 0xFF,
                             (size_t)(MAX_TOK * gr->m[i].rows) * sizeof(float), gpu_st));
}

static void test_matmul_multi_equals_separate_matmuls_bit_for_bit(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof groups / sizeof *groups; k++) {
        const group *gr = &groups[k];
        rng_seed(100 + k);
        group_run g;
        run_init(&g, gr);
        float *x = NULL, *dx = make_dx(gr->cols, 7 + k, &x);
        for (size_t j = 0; j < sizeof n_toks / sizeof *n_toks; j++) {
            const int64_t n = n_toks[j];
            poison_outputs(&g, gr);
            for (int i = 0; i < gr->n; i++)
                GPU_OK(cuda_matmul(g.sep[i], dx, &g.w[i].dev, n, gpu_st));
            GPU_OK(cuda_matmul_multi(dx, g.out, gr->n, n, gpu_st));
            /* the CPU check is slow on the 33000-row members: the small batches suffice */
            expect_group("after separate calls", &g, gr, x, n, n <= 5 || gr->cols >= 512);
        }
        cuda_mem_free(dx);
        free(x);
        run_free(&g, gr);
    }
}

/* Two groups queued back to back, and a group followed by a separate matmul on the same
 * stream, no wait between: each rounding overwrites the scratch the kernels before it read,
 * which is safe only if it waits for all of them (matmul_quant_group). Group A ends with
 * its longest matrices so their kernels are still running when B's rounding is launched. */
static void test_matmul_multi_back_to_back_groups_keep_their_inputs(void **state)
{
    (void)state;
    const group *ga = &groups[3], *gb = &groups[0];
    assert_true(ga->m[0].rows == 33000 && gb->m[2].type == TD_Q6_K);
    rng_seed(41);
    group_run a, b;
    run_init(&a, ga);
    run_init(&b, gb);
    float *xa = NULL, *xb = NULL;
    float *dxa = make_dx(ga->cols, 3, &xa), *dxb = make_dx(gb->cols, 4, &xb);
    for (size_t j = 0; j < sizeof n_toks / sizeof *n_toks; j++) {
        const int64_t n = n_toks[j];
        for (int i = 0; i < ga->n; i++)
            GPU_OK(cuda_matmul(a.sep[i], dxa, &a.w[i].dev, n, gpu_st));
        for (int i = 0; i < gb->n; i++)
            GPU_OK(cuda_matmul(b.sep[i], dxb, &b.w[i].dev, n, gpu_st));
        GPU_OK(cuda_stream_sync(gpu_st));
        poison_outputs(&a, ga);
        poison_outputs(&b, gb);
        GPU_OK(cuda_matmul_multi(dxa, a.out, ga->n, n, gpu_st));
        GPU_OK(cuda_matmul_multi(dxb, b.out, gb->n, n, gpu_st));
        GPU_OK(cuda_matmul_multi(dxa, a.out, ga->n, n, gpu_st));
        /* a separate matmul right after a group: its rounding follows the group's kernels */
        float *dy = dpoison((size_t)(n * gb->m[2].rows) * sizeof(float));
        GPU_OK(cuda_matmul(dy, dxb, &b.w[2].dev, n, gpu_st));
        expect_group("back to back", &a, ga, xa, n, false);
        expect_group("back to back", &b, gb, xb, n, false);
        const size_t bytes = (size_t)(n * gb->m[2].rows) * sizeof(float);
        float *got = dget(dy, bytes), *want = dget(b.sep[2], bytes);
        assert_true(check_same_bits("matmul after a group", got, want, bytes));
        free(got);
        free(want);
        cuda_mem_free(dy);
    }
    cuda_mem_free(dxa);
    cuda_mem_free(dxb);
    free(xa);
    free(xb);
    run_free(&a, ga);
    run_free(&b, gb);
}

/* The profiler's count for a group: one rounding per layout and chunk, one kernel per
 * quantised member and chunk (a single-token chunk: the single-token path's launches per
 * member), per chunk one activation split for all F16/BF16 members and a kernel per set of
 * up to 4 of one type, one per F32 set of up to 4 members and chunk; a separate quantised matmul is two per chunk. Q4_K + Q6_K + BF16 + F32 at 5
 * tokens: a rounding for each of Q4_K and Q6_K (their digits interleave differently), two
 * quantised kernels, the BF16 split and kernel, the F32 kernel. */
static void test_matmul_multi_launches_are_counted(void **state)
{
    (void)state;
    unsetenv("TANDEM_PROFILE");
    ops_backend *gpu = NULL, *be = NULL;
    GPU_OK(ops_backend_cuda_init(&gpu, 0));
    GPU_OK(ops_prof_wrap(&be, gpu));
    const group *gr = &groups[1]; /* Q4_K, Q6_K, BF16, F32 */
    rng_seed(5);
    group_run g;
    run_init(&g, gr);
    float *x = NULL, *dx = make_dx(gr->cols, 9, &x);
    GPU_OK(cuda_stream_sync(gpu_st));
    GPU_OK(gpu->matmul_multi(gpu, dx, g.out, gr->n, 65)); /* scratch growth, uncounted */
    GPU_OK(gpu->sync(gpu));
    ops_prof_reset(be);
    GPU_OK(be->matmul_multi(be, dx, g.out, gr->n, 5));  /* 2 roundings + 2 + 2 kernels */
    GPU_OK(be->matmul_multi(be, dx, g.out, gr->n, 65)); /* two chunks of that */
    GPU_OK(be->matmul(be, g.sep[0], dx, &g.w[0].dev, 5)); /* rounding + kernel */
    GPU_OK(be->sync(be));
    ops_prof_table t;
    GPU_OK(ops_prof_snapshot(be, &t));
    const ops_prof_row *multi = NULL, *mm = NULL;
    for (int i = 0; i < t.n_rows; i++) {
        if (!strcmp(t.rows[i].op, "matmul_multi"))
            multi = &t.rows[i];
        if (!strcmp(t.rows[i].op, "matmul"))
            mm = &t.rows[i];
    }
    assert_non_null(multi);
    assert_non_null(mm);
    assert_int_equal(multi->calls, 2);
    /* 5 tokens: 7 = two roundings, two quantised kernels, the BF16 activation split and
     * kernel, the F32 kernel; 65 tokens: that for the 64-token chunk, then the 1-token chunk
     * (the quantised members on the single-token path, BF16 split and kernel, F32) */
    assert_int_equal(multi->launches, 7 + 7 + 2 * gpu_check_one_token_launches() + 3);
    assert_int_equal(mm->calls, 1);
    assert_int_equal(mm->launches, 2);
    assert_int_equal(t.lost, 0);
    /* the profiled group wrote what the plain one does */
    for (int i = 0; i < gr->n; i++)
        GPU_OK(cuda_matmul(g.sep[i], dx, &g.w[i].dev, 65, be->stream));
    GPU_OK(be->sync(be));
    expect_group("profiled", &g, gr, x, 65, false);
    cuda_mem_free(dx);
    free(x);
    run_free(&g, gr);
    ops_prof_free(be);
    ops_backend_cuda_free(gpu);
}

/* The launches of one group call, counted by the profiler. */
static int64_t group_launches(const ops_backend *be, const ops_mm_out *out, int n,
                              const float *dx, int64_t n_tok)
{
    ops_prof_reset(be);
    GPU_OK(be->matmul_multi(be, dx, out, n, n_tok));
    GPU_OK(be->sync(be));
    ops_prof_table t;
    GPU_OK(ops_prof_snapshot(be, &t));
    for (int i = 0; i < t.n_rows; i++)
        if (!strcmp(t.rows[i].op, "matmul_multi"))
            return t.rows[i].launches;
    fail_msg("no matmul_multi row in the profile");
    return -1;
}

/* Group gr on new weights and inputs (seed): its launches at n_tok[i] are want[i]. */
static void expect_launches(const ops_backend *gpu, const ops_backend *be, const group *gr,
                            uint64_t seed, const int64_t *n_tok, const int64_t *want, int n)
{
    group_run c;
    run_init(&c, gr);
    float *x = NULL, *dx = make_dx(gr->cols, seed, &x);
    GPU_OK(gpu->matmul_multi(gpu, dx, c.out, gr->n, 65)); /* scratch growth */
    GPU_OK(gpu->sync(gpu));
    for (int i = 0; i < n; i++)
        assert_int_equal(group_launches(be, c.out, gr->n, dx, n_tok[i]), want[i]);
    cuda_mem_free(dx);
    free(x);
    run_free(&c, gr);
}

/* Members of one type run in one launch (up to 4) where the kernel takes sets: the sm_90
 * bulk-copy kernel for one token, the window kernel for 2-16 tokens of Q4_K/Q5_K/Q6_K, the
 * F32 and F16/BF16 kernels at any batch; the tensor-core kernel (2-16 tokens elsewhere, Q8_0
 * on sm_90) keeps one launch per member.
 * The bits are the separate calls' (test above). */
static void test_matmul_multi_joins_members_of_one_type(void **state)
{
    (void)state;
    unsetenv("TANDEM_PROFILE");
    unsetenv("TANDEM_MMD");
    unsetenv("TANDEM_MMQ");
    ops_backend *gpu = NULL, *be = NULL;
    GPU_OK(ops_backend_cuda_init(&gpu, 0));
    GPU_OK(ops_prof_wrap(&be, gpu));
    const bool sm90 = gpu_check_one_token_launches() == 1;
    const group *q6 = &groups[6], *mix = &groups[7];
    assert_int_equal(q6->n, 5);
    assert_int_equal(mix->n, 8);
    rng_seed(15);
    group_run a, b;
    run_init(&a, q6);
    run_init(&b, mix);
    float *xa = NULL, *xb = NULL;
    float *dxa = make_dx(q6->cols, 21, &xa), *dxb = make_dx(mix->cols, 22, &xb);
    GPU_OK(gpu->matmul_multi(gpu, dxa, a.out, q6->n, 65)); /* scratch growth */
    GPU_OK(gpu->matmul_multi(gpu, dxb, b.out, mix->n, 65));
    GPU_OK(gpu->sync(gpu));
    /* five Q6_K at 512 inputs, one token: the bulk-copy kernel rounds x itself, 4 + 1
     * members on sm_90; elsewhere a rounding and a kernel per member */
    assert_int_equal(group_launches(be, a.out, q6->n, dxa, 1), sm90 ? 2 : 1 + 5);
    /* 16 and 5 tokens: rounding, then the window kernel on sm_90 (4 + 1), else mmq per
     * member */
    assert_int_equal(group_launches(be, a.out, q6->n, dxa, 16), sm90 ? 1 + 2 : 1 + 5);
    assert_int_equal(group_launches(be, a.out, q6->n, dxa, 5), sm90 ? 1 + 2 : 1 + 5);
    /* three Q4_K at 6144 inputs round x themselves on sm_90: one launch; at 5 tokens a
     * rounding and one window launch there; the five F32 members: 4 + 1 */
    assert_int_equal(group_launches(be, b.out, mix->n, dxb, 1), (sm90 ? 1 : 1 + 3) + 2);
    assert_int_equal(group_launches(be, b.out, mix->n, dxb, 5), (sm90 ? 1 + 1 : 1 + 3) + 2);
    /* BF16 + F16 (one activation split, a kernel each) beside Q6_K, Q6_K (one rounding) and
     * Q4_K, Q8_0, Q5_K (another), five tokens: the two Q6_K in one window launch on sm_90,
     * the others one each (Q8_0 on the tensor-core kernel): 2 + 4 + 1 + 2; elsewhere all
     * five on the tensor-core kernel: 2 + 5 + 1 + 2 */
    const int64_t five[] = {5}, mixed[] = {2 + (sm90 ? 4 : 5) + 1 + 2};
    expect_launches(gpu, be, &groups[2], 23, five, mixed, 1);
    /* five BF16 and an F16: the split, BF16 sets of 4 and 1, the F16, at every batch size */
    const int64_t toks[] = {1, 16, 33}, halves[] = {1 + 2 + 1, 1 + 2 + 1, 1 + 2 + 1};
    expect_launches(gpu, be, &groups[8], 24, toks, halves, 3);
    /* what the counted calls wrote is what separate calls write */
    for (int i = 0; i < mix->n; i++)
        GPU_OK(cuda_matmul(b.sep[i], dxb, &b.w[i].dev, 5, be->stream));
    GPU_OK(be->sync(be));
    expect_group("counted", &b, mix, xb, 5, false);
    cuda_mem_free(dxa);
    cuda_mem_free(dxb);
    free(xa);
    free(xb);
    run_free(&a, q6);
    run_free(&b, mix);
    ops_prof_free(be);
    ops_backend_cuda_free(gpu);
}

/* A group recorded in a CUDA graph (the target forward's path) replays on new inputs with
 * the bits a direct call gives on them. */
static void test_matmul_multi_replays_from_a_graph(void **state)
{
    (void)state;
    unsetenv("TANDEM_PROFILE");
    ops_backend *gpu = NULL;
    GPU_OK(ops_backend_cuda_init(&gpu, 0));
    const group *gr = &groups[2];
    rng_seed(77);
    group_run g;
    run_init(&g, gr);
    static const int64_t ns[] = {1, 16};
    for (size_t j = 0; j < sizeof ns / sizeof *ns; j++) {
        const int64_t n = ns[j];
        float *x0 = make_x(gr->cols, 1000 + (uint64_t)n);
        float *x1 = make_x(gr->cols, 2000 + (uint64_t)n);
        const size_t xb = (size_t)(MAX_TOK * gr->cols) * sizeof(float);
        float *dx = dput(x0, xb);
        GPU_OK(cuda_stream_sync(gpu_st));
        void *graph = NULL;
        GPU_OK(gpu->graph_begin(gpu));
        td_err e = gpu->matmul_multi(gpu, dx, g.out, gr->n, n);
        td_err e2 = gpu->graph_end(gpu, &graph);
        GPU_OK(e);
        GPU_OK(e2);
        GPU_OK(gpu->to_device(gpu, dx, x1, xb));
        GPU_OK(gpu->graph_launch(gpu, graph));
        GPU_OK(gpu->sync(gpu));
        for (int i = 0; i < gr->n; i++)
            GPU_OK(cuda_matmul(g.sep[i], dx, &g.w[i].dev, n, gpu_st));
        expect_group("graph replay", &g, gr, x1, n, true);
        gpu->graph_free(gpu, graph);
        cuda_mem_free(dx);
        free(x0);
        free(x1);
    }
    run_free(&g, gr);
    ops_backend_cuda_free(gpu);
}

/* An unsupported type or a misaligned quantised member anywhere in the group: the error,
 * and no member's output written (nothing was enqueued). */
static void test_matmul_multi_bad_member_fails_before_any_launch(void **state)
{
    (void)state;
    const group *gr = &groups[0];
    rng_seed(9);
    group_run g;
    run_init(&g, gr);
    float *x = NULL, *dx = make_dx(gr->cols, 11, &x);
    uint8_t *raw = dpoison(40 * 2 * 144 + 64);
    ops_weight bad;
    assert_int_equal(ops_weight_init(&bad, TD_Q4_K, 40, 512, raw + 8), TD_OK);
    ops_mm_out out[3] = {g.out[0], {g.out[1].y, &bad}, g.out[2]};
    poison_outputs(&g, gr);
    assert_int_equal(cuda_matmul_multi(dx, out, 3, 5, gpu_st), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "aligned"));
    ops_weight q40 = {.type = TD_Q4_0, .rows = 40, .cols = 512, .row_bytes = 288, .data = raw};
    out[1].w = &q40;
    assert_int_equal(cuda_matmul_multi(dx, out, 3, 5, gpu_st), TD_ENOTSUP);
    for (int i = 0; i < gr->n; i++) {
        const size_t bytes = (size_t)(5 * gr->m[i].rows) * sizeof(float);
        uint32_t *got = dget(g.out[i].y, bytes);
        for (size_t e = 0; e < bytes / 4; e++)
            if (got[e] != 0xFFFFFFFFu)
                fail_msg("member %d element %zu written by a failed group", i, e);
        free(got);
    }
    cuda_mem_free(raw);
    cuda_mem_free(dx);
    free(x);
    run_free(&g, gr);
}

int main(void)
{
    if (!gpu_check_init())
        return SKIP_EXIT;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_multi_equals_separate_matmuls_bit_for_bit),
        cmocka_unit_test(test_matmul_multi_back_to_back_groups_keep_their_inputs),
        cmocka_unit_test(test_matmul_multi_launches_are_counted),
        cmocka_unit_test(test_matmul_multi_joins_members_of_one_type),
        cmocka_unit_test(test_matmul_multi_replays_from_a_graph),
        cmocka_unit_test(test_matmul_multi_bad_member_fails_before_any_launch),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_check_free();
    return rc;
}

#endif /* TANDEM_HAVE_CUDA */
