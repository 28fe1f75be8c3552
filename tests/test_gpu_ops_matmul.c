/* cuda_matmul against cpu_matmul (the oracle) for every weight type, odd shapes and
 * n_tok in {1, 2, 3, 7, 8, 16, 31, 32, 64, 70}; batch invariance bit for bit (token t of a
 * batch equals token t computed alone, what lossless greedy speculation on the GPU relies
 * on; for quantised types a single token runs on the bulk-copy kernel on sm_90 (the
 * default there), elsewhere on the tensor-core kernel, or on the dp4a single-token kernel for
 * the 33000-row Q4_K matrix, so this also proves the kernels' arithmetic identical); single
 * tokens under TANDEM_MMD=bulk, =mma and =regs and batches under TANDEM_MMQ=bulk (child
 * processes of this program) byte for byte against each other on sm_90, on the 27B target's
 * shapes among others;
 * cuda_dequantize_row and cuda_get_rows bit-identical to the CPU; the errors bad weights
 * get; weights with x_bf16 (inputs rounded to bf16: the exact path's bits on the rounded
 * inputs, and the Q6_K x bf16 kernel within its bound of them). Outputs are poisoned with NaN before each call, so an element a kernel never writes
 * fails. Skips (77) without CUDA or a device.
 *
 * Bounds (derived where they are used): F32 weights only differ from the CPU by f32
 * summation order; F16/BF16 weights meet the activations split exactly into bf16 pieces on
 * the tensor cores, so only the tensor cores' f32 accumulation rounds (checked against a host
 * f64 sum, and bit for bit on inputs whose sums are exact). Quantised weights meet
 * activations rounded to 16-bit integers per 256 inputs (kernels/cuda/matmul_internal.h),
 * so each output is checked twice: against a
 * host f64 evaluation of exactly that rounding (replicated here bit for bit), which leaves
 * only f32 rounding and catches any misplaced weight, scale or token; and against
 * cpu_matmul within the rounding's worst case plus the same f32 term. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cuda/matmul_bulk_addr.h"
#include "kernels/cuda/matmul_q6x.h"
#include "kernels/cuda_mem.h"
#include "kernels/ops.h"
#include "tests/support/gpu_check.h"

#define SKIP_EXIT 77

#ifndef TANDEM_HAVE_CUDA

GPU_CHECK_SKIP_MAIN

#else

#include <cuda_runtime_api.h>

GPU_CHECK_SANITIZER_OPTIONS

#define MAX_TOK 70
#define XBLOCK 256   /* inputs per activation scale (MM_XBLOCK) */
#define XQMAX 32639  /* largest rounded activation (MM_XQMAX) */
#define U 0x1p-24    /* f32 unit roundoff */

static const int64_t n_toks[] = {1, 2, 3, 7, 8, 16, 31, 32, 64, MAX_TOK};

/* ---- a weight on both sides ---------------------------------------------------------- */

typedef struct test_weight {
    ops_weight host;   /* data in host memory, for the CPU */
    ops_weight dev;    /* the same bytes on the device */
    float *deq;        /* [rows][cols] the dequantised weights (cpu_dequantize_row) */
    float *wmax;       /* [rows] max |w| of each row */
} test_weight;

/* Random weights in [-1, 1) rounded to type by cpu_quantize_row, row by row. */
static void weight_init(test_weight *tw, td_dtype type, int64_t rows, int64_t cols)
{
    uint64_t rb = 0;
    assert_int_equal(dtype_bytes(type, (uint64_t)cols, &rb), TD_OK);
    uint8_t *bytes = malloc((size_t)(rows * (int64_t)rb));
    float *f = rng_floats(rows * cols, 1.0f);
    assert_non_null(bytes);
    tw->deq = malloc((size_t)(rows * cols) * sizeof(float));
    tw->wmax = calloc((size_t)rows, sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        assert_int_equal(cpu_quantize_row(type, f + r * cols, bytes + r * rb, cols), TD_OK);
        assert_int_equal(cpu_dequantize_row(type, bytes + r * rb, tw->deq + r * cols, cols),
                         TD_OK);
        for (int64_t i = 0; i < cols; i++)
            tw->wmax[r] = fmaxf(tw->wmax[r], fabsf(tw->deq[r * cols + i]));
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
    free(tw->wmax);
}

static bool is_quant(td_dtype t)
{
    return t != TD_F32 && t != TD_F16 && t != TD_BF16;
}

/* ---- the host replica of the GPU's activation rounding ---------------------------------- */

/* xr[i] = d * q exactly as the kernel rounds it (the same IEEE f32 operations in the same
 * order: d = amax / 32639, id = 1 / d, q = rint(x * id) clamped), dx[i] = that block's d. */
static void round_like_gpu(const float *x, int64_t cols, double *xr, float *dx)
{
    for (int64_t b0 = 0; b0 < cols; b0 += XBLOCK) {
        const int64_t n = cols - b0 < XBLOCK ? cols - b0 : XBLOCK;
        float amax = 0.0f;
        for (int64_t i = 0; i < n; i++)
            amax = fmaxf(amax, fabsf(x[b0 + i]));
        const float d = amax / (float)XQMAX;
        const float id = d > 0.0f ? 1.0f / d : 0.0f;
        for (int64_t i = 0; i < n; i++) {
            float q = rintf(x[b0 + i] * id);
            q = q > XQMAX ? XQMAX : q < -XQMAX ? -XQMAX : q;
            xr[b0 + i] = (double)d * (double)q;
            dx[b0 + i] = d;
        }
    }
}

/* ---- one weight, every batch size ------------------------------------------------------ */

/* Per (token, row): the reference values and the bounds of the header comment. */
typedef struct expect {
    float *cpu;   /* [n_tok][rows] cpu_matmul */
    double *ref;  /* [n_tok][rows] f64 sum of w * (x as the GPU rounds it); = cpu for F */
    double *tol_ref; /* [n_tok][rows] allowed |gpu - ref|: f32 rounding only */
    double *tol_cpu; /* [n_tok][rows] allowed |gpu - cpu| */
} expect;

static void expect_init(expect *e, const test_weight *tw, const float *x, int64_t n_tok)
{
    const int64_t rows = tw->host.rows, cols = tw->host.cols;
    const bool quant = is_quant(tw->host.type);
    const bool tc = tw->host.type == TD_F16 || tw->host.type == TD_BF16; /* tensor cores */
    e->cpu = malloc((size_t)(n_tok * rows) * sizeof(float));
    e->ref = malloc((size_t)(n_tok * rows) * sizeof(double));
    e->tol_ref = malloc((size_t)(n_tok * rows) * sizeof(double));
    e->tol_cpu = malloc((size_t)(n_tok * rows) * sizeof(double));
    cpu_matmul(e->cpu, x, &tw->host, n_tok);
    double *xr = malloc((size_t)cols * sizeof(double));
    float *dx = malloc((size_t)cols * sizeof(float));
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xt = x + t * cols;
        round_like_gpu(xt, cols, xr, dx);
        for (int64_t r = 0; r < rows; r++) {
            const float *w = tw->deq + r * cols;
            double ref = 0, xerr = 0, mag = 0;
            for (int64_t i = 0; i < cols; i++) {
                ref += (double)w[i] * (quant ? xr[i] : (double)xt[i]);
                /* |x - d q| <= d/2, plus x * (1/d) being rounded once: 2^-23 |x| */
                xerr += fabs((double)w[i]) * (0.5 * dx[i] + 0x1p-23 * fabs((double)xt[i]));
                /* The GPU's intermediate terms: d*sc*q and dmin*m (Q4_K/Q5_K), or q - 32
                 * (Q6_K) before their cancellation; 2 * max|w| of the row bounds the offset
                 * part (the test quantiser's mins and offsets stay within the row's range). */
                mag += (fabs((double)w[i]) + (quant ? 2.0 * tw->wmax[r] : 0.0)) *
                       fabs((double)xt[i]);
            }
            /* f32 rounding: the GPU rounds each k-block's contribution a handful of times
             * (integer-to-float conversions, the scale products, one fma each) and chains
             * at most cols/128/4 k-blocks per warp plus 3 warp additions (quantised); or
             * chains cols/256/4 * 8 fmas per lane plus a 5-level butterfly and the warps
             * (F32). The CPU rounds 256-wide f32 tile sums and its f32 dequantised
             * weights (1.5 ulp each). Every such error is at most u times a partial sum
             * bounded by mag, so (count) * u * mag bounds the total; the counts below
             * overstate both sides by more than 2x. */
            double gpu_f32 = (32.0 + (double)cols / 64.0) * U * mag;
            const double cpu_f32 = 300.0 * U * mag;
            if (tc) {
                /* F16/BF16 (matmul_float_mma.cu): the products are exact; one MMA adds 16
                 * of them to its accumulator c, and tensor cores align the terms to the
                 * largest and truncate, so it errs by at most ~2 ulp per term and its
                 * normalisation, in two k8 halves at worst: 40 u (|c| + sum |p|). A chain
                 * restarts every 128-column k-block and has 24 MMAs (F16: 48), each bounded
                 * by the block's share of mag; then one f32 add per k-block into the warp's
                 * total (at most ceil(cols/128/4)) and 3 warp additions, each <= u mag. */
                const double chain = tw->host.type == TD_F16 ? 48.0 : 24.0;
                gpu_f32 = (40.0 * chain + (double)cols / 512.0 + 5.0) * U * mag;
            }
            e->ref[t * rows + r] = quant || tc ? ref : (double)e->cpu[t * rows + r];
            e->tol_ref[t * rows + r] = quant || tc ? gpu_f32 : gpu_f32 + cpu_f32;
            e->tol_cpu[t * rows + r] = (quant ? xerr : 0.0) + gpu_f32 + cpu_f32;
        }
    }
    free(xr);
    free(dx);
}

static void expect_free(expect *e)
{
    free(e->cpu);
    free(e->ref);
    free(e->tol_ref);
    free(e->tol_cpu);
}

/* Every element of y [n][rows] written (finite) and within both bounds. */
static bool check_outputs(const char *what, const float *y, const expect *e, int64_t n,
                          int64_t rows)
{
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t k = t * rows + r;
            const double g = y[k];
            if (!isfinite(g) || fabs(g - e->ref[k]) > e->tol_ref[k] ||
                fabs(g - (double)e->cpu[k]) > e->tol_cpu[k]) {
                fprintf(stderr,
                        "%s: token %lld row %lld: gpu %.9g, rounded-x reference %.9g (tol "
                        "%.3g), cpu %.9g (tol %.3g)\n",
                        what, (long long)t, (long long)r, g, e->ref[k], e->tol_ref[k],
                        (double)e->cpu[k], e->tol_cpu[k]);
                return false;
            }
        }
    return true;
}

/* The major arch of the code the current device runs (9 for sm_90 code, 8 for an sm_86
 * build, also where a Hopper runs its PTX) and the shared memory a block may opt in to. */
static void device_caps(int *major, int *optin)
{
    int dev = 0;
    assert_int_equal(cudaGetDevice(&dev), cudaSuccess);
    *major = cuda_code_arch(dev) / 100;
    *optin = cuda_smem_optin(dev);
    assert_true(*optin > 0);
}

/* y [n][rows] from the GPU into a poisoned buffer. */
static float *gpu_matmul(const test_weight *tw, const float *dx, int64_t n)
{
    const size_t bytes = (size_t)(n * tw->dev.rows) * sizeof(float);
    float *dy = dpoison(bytes);
    GPU_OK(cuda_matmul(dy, dx, &tw->dev, n, gpu_st));
    float *y = dget(dy, bytes);
    cuda_mem_free(dy);
    return y;
}

/* cuda_matmul of one weight for every n in ns[n_ns] (each at most MAX_TOK): every output
 * written, within the bounds, and token t bit-identical to token t computed alone. */
static void check_weight_at(td_dtype type, int64_t rows, int64_t cols, const int64_t *ns,
                            size_t n_ns)
{
    char what[96];
    snprintf(what, sizeof what, "%s %lld x %lld", dtype_name(type), (long long)rows,
             (long long)cols);
    test_weight tw;
    weight_init(&tw, type, rows, cols);
    /* activations in [-2, 2) with one large input per token, so blocks get different
     * scales and the largest input of a block is not always near 2 */
    float *x = rng_floats(MAX_TOK * cols, 2.0f);
    for (int64_t t = 0; t < MAX_TOK; t++)
        x[t * cols + (t * 7919) % cols] *= 16.0f;
    float *dx = dput(x, (size_t)(MAX_TOK * cols) * sizeof(float));
    expect e;
    expect_init(&e, &tw, x, MAX_TOK);

    float *alone = malloc((size_t)(MAX_TOK * rows) * sizeof(float));
    for (int64_t t = 0; t < MAX_TOK; t++) {
        float *y = gpu_matmul(&tw, dx + t * cols, 1);
        memcpy(alone + t * rows, y, (size_t)rows * sizeof(float));
        free(y);
    }
    char at[192];
    snprintf(at, sizeof at, "%s alone", what);
    assert_true(check_outputs(at, alone, &e, MAX_TOK, rows));

    for (size_t k = 0; k < n_ns; k++) {
        const int64_t n = ns[k];
        float *y = gpu_matmul(&tw, dx, n);
        snprintf(at, sizeof at, "%s n_tok %lld", what, (long long)n);
        assert_true(check_outputs(at, y, &e, n, rows));
        for (int64_t t = 0; t < n; t++) {
            snprintf(at, sizeof at, "%s n_tok %lld token %lld vs alone", what, (long long)n,
                     (long long)t);
            assert_true(check_same_bits(at, y + t * rows, alone + t * rows,
                                        (size_t)rows * sizeof(float)));
        }
        free(y);
    }
    free(alone);
    expect_free(&e);
    cuda_mem_free(dx);
    free(x);
    weight_free(&tw);
}

static void check_weight(td_dtype type, int64_t rows, int64_t cols)
{
    check_weight_at(type, rows, cols, n_toks, sizeof n_toks / sizeof *n_toks);
}

/* Shapes: one row, rows that are not a multiple of the 16-row MMA tile, the 4-row float
 * tile or the single-token kernel's 2-row warps (5, 257, 7001), cols of exactly one block,
 * a few blocks, and many blocks whose count is not a multiple of the 4 warps / lane groups
 * that split them (10 and 21 super-blocks; 169 Q8_0 blocks). 33000 rows (more than 128 per
 * SM on any GPU up to 257 SMs) make 9..16 tokens take the 32-row tile; 7001 rows x 5
 * super-blocks make one token take 2-row warps that each do several row pairs on GPUs up
 * to ~140 SMs (more than 48 rows per SM), with chains of 2, 1, 1, 1 k-blocks. */
static void test_matmul_k_quants_match_cpu_at_every_batch_size(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{1, 256},   {5, 256},     {37, 256},
                                        {19, 768},  {257, 2560},  {67, 5376},
                                        {300, 512}, {7001, 1280}, {33000, 256}};
    static const td_dtype types[] = {TD_Q4_K, TD_Q5_K, TD_Q6_K};
    rng_seed(11);
    for (size_t t = 0; t < sizeof types / sizeof *types; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            check_weight(types[t], shapes[s][0], shapes[s][1]);
}

static void test_matmul_q8_0_matches_cpu_at_every_batch_size(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{1, 32},    {5, 32},     {37, 32},  {19, 96},
                                        {257, 1056}, {67, 5408}, {300, 160}, {33000, 64}};
    rng_seed(12);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        check_weight(TD_Q8_0, shapes[s][0], shapes[s][1]);
}

/* Odd cols make rows misaligned for 16-byte loads (the scalar path; 300 is a multiple of 4
 * but not of 8); 256, 512, 2560 and 5384 take the vector path. F32: 2560 gives warps 0-1
 * three 256-column chunks and warps 2-3 two, 5384 has a partial last chunk. F16/BF16 (128-
 * column k-blocks over 4 warps, 16-row tiles): 5 rows is less than a tile, 257 one row past
 * 16 tiles, 2560 is 5 k-blocks per warp, 5384 is 43 (warp 3 has one fewer) with only 8
 * columns in the last; 1..70 tokens take one, two and four 8-token n-tiles per CTA, partial
 * n-tiles and several token groups. */
static void test_matmul_float_types_match_cpu_at_every_batch_size(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{1, 1},      {5, 256},   {37, 7},   {19, 300},
                                        {257, 2560}, {67, 5384}, {300, 512}};
    static const td_dtype types[] = {TD_F32, TD_F16, TD_BF16};
    rng_seed(13);
    for (size_t t = 0; t < sizeof types / sizeof *types; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            check_weight(types[t], shapes[s][0], shapes[s][1]);
}

/* F16/BF16 at the DFlash drafter's step sizes on a 27B-wide row (5120 columns, 40 k-blocks,
 * 10 per warp) and odd shapes: 1000 rows (a partial last 16-row tile), 5384 columns (a
 * partial last k-block of 8 columns, which the sm_90 bulk rings leave to register loads),
 * 9000 x 1160 (563 row tiles: on an H100/H200 enough CTAs for 9-16 tokens to load their
 * activations ahead by default) and 5122 columns (cols % 8 != 0: the scalar path). 9, 15,
 * 16 tokens take a 9-16 token kernel, 17 and 32 the 4-n-tile one, 1 the cp.async ring.
 * Every batch must equal each token alone bit for bit and stay within the f64 bound; then
 * the same under TANDEM_MMH=ahead (activations loaded ahead for every grid) and on sm_90
 * under TANDEM_MMH=bulk (bulk-copy rings), so every 9-16 token path gives the single
 * token's bits. */
static void test_matmul_half_weights_draft_step_sizes_match_alone_bits(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{1000, 5120}, {203, 5384}, {9000, 1160}, {45, 5122}};
    static const char *const paths[] = {NULL, "ahead", "bulk"};
    static const int64_t ns[] = {1, 9, 15, 16, 17, 32};
    static const td_dtype types[] = {TD_BF16, TD_F16};
    int major = 0, optin = 0;
    device_caps(&major, &optin);
    const char *saved = getenv("TANDEM_MMH");
    char *keep = saved ? strdup(saved) : NULL;
    for (int pass = 0; pass < (major >= 9 ? 3 : 2); pass++) {
        if (paths[pass])
            setenv("TANDEM_MMH", paths[pass], 1);
        else
            unsetenv("TANDEM_MMH");
        rng_seed(17);
        for (size_t t = 0; t < sizeof types / sizeof *types; t++)
            for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
                check_weight_at(types[t], shapes[k][0], shapes[k][1], ns,
                                sizeof ns / sizeof *ns);
    }
    if (keep)
        setenv("TANDEM_MMH", keep, 1);
    else
        unsetenv("TANDEM_MMH");
    free(keep);
}

/* One cuda_matmul_multi of w read with x_bf16 and w read exactly, n tokens of dx: the members'
 * outputs must be want_bf16 and want_exact [n][rows] bit for bit. */
static void check_mixed_group(const char *what, const ops_weight *w, const float *dx, int64_t n,
                              const float *want_bf16, const float *want_exact)
{
    const size_t yb = (size_t)(n * w->rows) * sizeof(float);
    float *dy0 = dpoison(yb), *dy1 = dpoison(yb);
    ops_weight wb = *w, we = *w;
    wb.x_bf16 = true;
    we.x_bf16 = false;
    const ops_mm_out mm[] = {{dy0, &wb}, {dy1, &we}};
    GPU_OK(cuda_matmul_multi(dx, mm, 2, n, gpu_st));
    float *y0 = dget(dy0, yb), *y1 = dget(dy1, yb);
    assert_true(check_same_bits(what, y0, want_bf16, yb));
    assert_true(check_same_bits(what, y1, want_exact, yb));
    free(y0);
    free(y1);
    cuda_mem_free(dy0);
    cuda_mem_free(dy1);
}

/* x[n] rounded to bf16 (ops_f32_to_bf16), as f32, in new memory. */
static float *bf16_copy(const float *x, int64_t n)
{
    float *r = malloc((size_t)n * sizeof(float));
    assert_non_null(r);
    for (int64_t i = 0; i < n; i++)
        r[i] = ops_bf16_to_f32(ops_f32_to_bf16(x[i]));
    return r;
}

/* x_bf16 (the drafter's products on a GPU): the product reads x rounded to bf16 (nearest
 * even). For BF16 and F16 weights the activation split then holds one piece instead of three
 * (the pieces m and l of a bf16 value are zeros, so the MMAs left out added nothing), for a
 * quantised weight x is rounded by one more launch (Q6_K too: its own kernel, under
 * TANDEM_Q6X=on, is the next test): either way every token equals cuda_matmul of the rounded
 * x bit for bit (F32 weights read the same rounded copy), which is within the bounds above of
 * cpu_matmul of it (and cpu_matmul with x_bf16 is cpu_matmul of the rounded x:
 * test_ops_matmul). Shapes: the drafter's 5120-wide rows, a partial k-block (5384), the scalar
 * path (5122), one row; 1, 9, 15, 16, 17 and 32 tokens take every path; a mixed group (x_bf16
 * and exact members, two splits) gives each member what it gives alone. */
static void test_matmul_x_bf16_reads_the_rounded_inputs(void **state)
{
    (void)state;
    setenv("TANDEM_Q6X", "off", 1);
    static const int64_t shapes[][2] = {{1000, 5120}, {203, 5384}, {45, 5122}, {1, 256}};
    static const int64_t ns[] = {1, 9, 15, 16, 17, 32};
    static const td_dtype types[] = {TD_BF16, TD_F16, TD_F32, TD_Q4_K, TD_Q6_K};
    const int64_t N = 32;
    rng_seed(23);
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
            const td_dtype type = types[ti];
            const int64_t rows = shapes[k][0], cols = shapes[k][1];
            if (cols % dtype_get(type)->block != 0)
                continue;
            char what[128];
            test_weight tw;
            weight_init(&tw, type, rows, cols);
            float *x = rng_floats(N * cols, 2.0f), *xr = bf16_copy(x, N * cols);
            float *dx = dput(x, (size_t)(N * cols) * sizeof(float));
            float *dxr = dput(xr, (size_t)(N * cols) * sizeof(float));
            expect e;
            expect_init(&e, &tw, xr, N);
            for (size_t j = 0; j < sizeof ns / sizeof *ns; j++) {
                const int64_t n = ns[j];
                snprintf(what, sizeof what, "%s %lld x %lld x_bf16 n_tok %lld",
                         dtype_name(type), (long long)rows, (long long)cols, (long long)n);
                float *want = gpu_matmul(&tw, dxr, n), *exact = gpu_matmul(&tw, dx, n);
                tw.dev.x_bf16 = true;
                float *got = gpu_matmul(&tw, dx, n);
                tw.dev.x_bf16 = false;
                assert_true(check_outputs(what, got, &e, n, rows));
                assert_true(check_same_bits(what, got, want, (size_t)(n * rows) * 4));
                /* the rounding took effect: random inputs are rarely bf16 values */
                assert_memory_not_equal(got, exact, (size_t)(n * rows) * 4);
                free(want);
                free(exact);
                free(got);
            }
            /* a group of an x_bf16 member and an exact one of the same type and shape */
            const int64_t n = 16;
            float *want0 = gpu_matmul(&tw, dxr, n), *want1 = gpu_matmul(&tw, dx, n);
            snprintf(what, sizeof what, "%s %lld x %lld mixed group", dtype_name(type),
                     (long long)rows, (long long)cols);
            check_mixed_group(what, &tw.dev, dx, n, want0, want1);
            free(want0);
            free(want1);
            expect_free(&e);
            cuda_mem_free(dx);
            cuda_mem_free(dxr);
            free(x);
            free(xr);
            weight_free(&tw);
        }
    unsetenv("TANDEM_Q6X");
}

/* Q6_K with x_bf16 at 1..16 tokens on its own kernel (matmul_q6x.cu, TANDEM_Q6X=on): every
 * output written and within (96 + cols / 8) u sum |w x| of the f64 sum of the dequantised
 * weights times the rounded inputs (each step's MMA adds 16 exact products, ~40 u of their
 * magnitude by the bound of the F16/BF16 tests; then one fma per step, cols / 16 of them),
 * each token of a batch bit-identical to it alone, and a group with an exact Q6_K member gives
 * each what it gives alone. Shapes: the drafter's 5120-wide rows (where the device's shared
 * memory holds 16 tokens of them: not on sm_86), 21 blocks per row (row_bytes 2 mod 4: every
 * other row starts 2 bytes past a word boundary), one block, one row, rows past a 16-row
 * tile. */
static void test_matmul_q6x_matches_the_rounded_inputs(void **state)
{
    (void)state;
    setenv("TANDEM_Q6X", "on", 1);
    static const int64_t shapes[][2] = {{1000, 5120}, {203, 5376}, {45, 256}, {1, 768},
                                        {7001, 1280}};
    static const int64_t ns[] = {1, 7, 9, 15, 16};
    const int64_t N = 16;
    int major = 0, optin = 0;
    device_caps(&major, &optin);
    rng_seed(29);
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        const int64_t rows = shapes[k][0], cols = shapes[k][1];
        if (major < 8 || q6x_smem_bytes(cols, Q6X_MAX_TOK) > (size_t)optin) {
            printf("Q6_K x bf16 %lld x %lld: not on this device's kernel\n", (long long)rows,
                   (long long)cols);
            continue;
        }
        char what[128];
        test_weight tw;
        weight_init(&tw, TD_Q6_K, rows, cols);
        float *x = rng_floats(N * cols, 2.0f), *xr = bf16_copy(x, N * cols);
        float *dx = dput(x, (size_t)(N * cols) * sizeof(float));
        tw.dev.x_bf16 = true;
        float *alone = malloc((size_t)(N * rows) * sizeof(float));
        for (int64_t t = 0; t < N; t++) {
            float *y = gpu_matmul(&tw, dx + t * cols, 1);
            memcpy(alone + t * rows, y, (size_t)rows * sizeof(float));
            free(y);
        }
        for (int64_t t = 0; t < N; t++)
            for (int64_t r = 0; r < rows; r++) {
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < cols; i++) {
                    const double p = (double)tw.deq[r * cols + i] * (double)xr[t * cols + i];
                    ref += p;
                    mag += fabs(p);
                }
                const double g = alone[t * rows + r];
                const double tol = (96.0 + (double)cols / 8.0) * U * mag;
                if (!isfinite(g) || fabs(g - ref) > tol)
                    fail_msg("Q6_K x bf16 %lld x %lld token %lld row %lld: %.9g, f64 %.9g "
                             "(tol %.3g)",
                             (long long)rows, (long long)cols, (long long)t, (long long)r, g,
                             ref, tol);
            }
        for (size_t j = 0; j < sizeof ns / sizeof *ns; j++) {
            const int64_t n = ns[j];
            float *y = gpu_matmul(&tw, dx, n);
            for (int64_t t = 0; t < n; t++) {
                snprintf(what, sizeof what, "Q6_K x bf16 %lld x %lld n_tok %lld token %lld",
                         (long long)rows, (long long)cols, (long long)n, (long long)t);
                assert_true(check_same_bits(what, y + t * rows, alone + t * rows,
                                            (size_t)rows * sizeof(float)));
            }
            free(y);
        }
        /* beside an exact member of the same weight */
        const int64_t n = 15;
        tw.dev.x_bf16 = false;
        float *want1 = gpu_matmul(&tw, dx, n);
        snprintf(what, sizeof what, "Q6_K x bf16 %lld x %lld in a group", (long long)rows,
                 (long long)cols);
        check_mixed_group(what, &tw.dev, dx, n, alone, want1);
        free(want1);
        free(alone);
        cuda_mem_free(dx);
        free(x);
        free(xr);
        weight_free(&tw);
    }
    unsetenv("TANDEM_Q6X");
}

/* F16/BF16 on the tensor cores with results that must be exact: row r of W has one nonzero
 * weight, at column 37r mod 512 (distinct for every row, so across the rows every k slot of
 * the fragment mapping is used), and y = w x has a single product. BF16 weights are signed
 * powers of two and x keeps its full 24-bit significands, so the three bf16 pieces of x must
 * add back to x exactly; F16 weights use all 11 significand bits (both bf16 pieces of the
 * weight count) and x is rounded to 13 bits, so w x fits an f32. Checked bit for bit at 1,
 * 16 and 37 tokens. */
static void test_matmul_half_weights_single_products_are_exact(void **state)
{
    (void)state;
    rng_seed(16);
    const int64_t rows = 300, cols = 512, n = 37;
    for (int k = 0; k < 2; k++) {
        const td_dtype type = k ? TD_F16 : TD_BF16;
        float *wf = calloc((size_t)(rows * cols), sizeof(float));
        float *x = rng_floats(n * cols, 4.0f);
        assert_non_null(wf);
        for (int64_t i = 0; i < n * cols; i++) {
            int e = 0;
            const float m = frexpf(x[i], &e);
            if (type == TD_F16)
                x[i] = ldexpf(rintf(m * 8192.0f) / 8192.0f, e);
            if (x[i] == 0.0f) /* no signed zeros to argue about */
                x[i] = 1.0f;
        }
        float *want = malloc((size_t)(n * rows) * sizeof(float));
        for (int64_t r = 0; r < rows; r++) {
            const float sign = r & 1 ? -1.0f : 1.0f;
            const float frac = type == TD_BF16 ? 1.0f : (float)(1024 + (r * 613) % 1024);
            const int e = type == TD_BF16 ? (int)(r % 9) - 4 : (int)(r % 7) - 13;
            const float v = sign * ldexpf(frac, e);
            wf[r * cols + r * 37 % cols] = v;
            for (int64_t t = 0; t < n; t++)
                want[t * rows + r] = (float)((double)v * (double)x[t * cols + r * 37 % cols]);
        }
        uint64_t rb = 0;
        assert_int_equal(dtype_bytes(type, (uint64_t)cols, &rb), TD_OK);
        uint8_t *bytes = malloc((size_t)(rows * (int64_t)rb));
        for (int64_t r = 0; r < rows; r++)
            assert_int_equal(cpu_quantize_row(type, wf + r * cols, bytes + r * rb, cols), TD_OK);
        test_weight tw = {0};
        assert_int_equal(ops_weight_init(&tw.dev, type, rows, cols, bytes), TD_OK);
        tw.dev.data = dput(bytes, (size_t)(rows * (int64_t)rb));
        float *dx = dput(x, (size_t)(n * cols) * sizeof(float));
        static const int64_t ns[] = {1, 16, 37};
        for (size_t j = 0; j < sizeof ns / sizeof *ns; j++) {
            float *y = gpu_matmul(&tw, dx, ns[j]);
            char what[64];
            snprintf(what, sizeof what, "%s exact products, n_tok %lld", dtype_name(type),
                     (long long)ns[j]);
            assert_true(check_same_bits(what, y, want, (size_t)(ns[j] * rows) * sizeof(float)));
            free(y);
        }
        cuda_mem_free(dx);
        cuda_mem_free((void *)tw.dev.data);
        free(bytes);
        free(want);
        free(x);
        free(wf);
    }
}

/* A NaN input makes its own token's outputs NaN (as on the CPU) and leaves the other tokens
 * of the batch bit-identical to computing them alone. */
static void test_matmul_nan_input_stays_in_its_token(void **state)
{
    (void)state;
    static const td_dtype types[] = {TD_Q4_K, TD_Q6_K, TD_Q8_0, TD_F16};
    rng_seed(14);
    for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
        const int64_t rows = 40, cols = 512, n = 3;
        test_weight tw;
        weight_init(&tw, types[k], rows, cols);
        float *x = rng_floats(n * cols, 1.0f);
        x[cols + 300] = NAN; /* token 1 */
        float *dx = dput(x, (size_t)(n * cols) * sizeof(float));
        float *y = gpu_matmul(&tw, dx, n);
        for (int64_t r = 0; r < rows; r++)
            assert_true(isnan(y[rows + r]));
        for (int64_t t = 0; t < n; t += 2) {
            float *one = gpu_matmul(&tw, dx + t * cols, 1);
            for (int64_t r = 0; r < rows; r++)
                assert_false(isnan(one[r]));
            assert_true(check_same_bits(dtype_name(types[k]), y + t * rows, one,
                                        (size_t)rows * sizeof(float)));
            free(one);
        }
        free(y);
        cuda_mem_free(dx);
        free(x);
        weight_free(&tw);
    }
}

/* Weights the kernels cannot take get an error, not a launch: an unsupported type and
 * quantised data that is not 16-byte aligned. Float weights at any address work (scalar
 * loads), checked against the CPU. */
static void test_matmul_rejects_bad_weights(void **state)
{
    (void)state;
    float *dy = dpoison(64 * sizeof(float));
    float *dx = dpoison(256 * sizeof(float));
    uint8_t *raw = dpoison(4096);
    ops_weight w = {.type = TD_Q4_0, .rows = 1, .cols = 32, .row_bytes = 18, .data = raw};
    assert_int_equal(cuda_matmul(dy, dx, &w, 1, gpu_st), TD_ENOTSUP);
    assert_int_equal(ops_weight_init(&w, TD_Q4_K, 2, 256, raw + 8), TD_OK);
    assert_int_equal(cuda_matmul(dy, dx, &w, 1, gpu_st), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "aligned"));
    cuda_mem_free(raw);
    cuda_mem_free(dx);
    cuda_mem_free(dy);

    /* F32 weights 4 bytes past an aligned address, x one float past one */
    rng_seed(15);
    const int64_t rows = 9, cols = 264;
    float *wf = rng_floats(rows * cols, 1.0f), *x = rng_floats(cols + 1, 1.0f);
    float *dwf = dpoison((size_t)(rows * cols + 1) * sizeof(float));
    GPU_OK(cuda_mem_upload(dwf + 1, wf, (size_t)(rows * cols) * sizeof(float), gpu_st));
    float *dxx = dput(x, (size_t)(cols + 1) * sizeof(float));
    ops_weight hw, gw;
    assert_int_equal(ops_weight_init(&hw, TD_F32, rows, cols, wf), TD_OK);
    gw = hw;
    gw.data = dwf + 1;
    float *dyy = dpoison((size_t)rows * sizeof(float));
    GPU_OK(cuda_matmul(dyy, dxx + 1, &gw, 1, gpu_st));
    float *got = dget(dyy, (size_t)rows * sizeof(float));
    float want[9];
    cpu_matmul(want, x + 1, &hw, 1);
    /* f32 sums of 264 products in different orders: 300 u of sum |w x| <= 300 u * 264 */
    assert_true(check_close("F32 at odd addresses", got, want, rows, 0, 300 * 264 * 0x1p-24f));
    free(got);
    cuda_mem_free(dyy);
    cuda_mem_free(dxx);
    cuda_mem_free(dwf);
    free(x);
    free(wf);
}

/* ---- every kernel on the same inputs: the bulk-copy kernels against the others ----------- */

/* The kernels are picked once per process (TANDEM_MMD for single tokens, TANDEM_MMQ for
 * several), so each variant runs in a child process of this program ("--single-tokens FILE"
 * with them set): for every bulk_shapes matrix the child computes BULK_TOK tokens one token
 * at a time and batches of every bulk_batches size, checks the single tokens against the
 * batches' first tokens bit for bit and, under TANDEM_MMD=bulk, against cpu_matmul, and
 * writes all outputs to FILE; the parent then compares the files of TANDEM_MMD=bulk, =mma
 * (tensor cores) with TANDEM_MMQ=mmq (batches on the tensor-core kernel only), =regs
 * (dp4a) with TANDEM_MMQ=bulk9 (9-16 tokens on the window kernel, also for the Q4_K rows
 * that take the warpgroup kernel by default, 17-64 on the wide kernel, 2-8 on the
 * tensor-core kernel; stages refilled as before 2026-12-07, TANDEM_MMQ_REFILL=late), =bulk
 * with TANDEM_MMQ=wg (Q4_K and Q5_K at 2-16 tokens on the warpgroup kernel where the device
 * runs sm_90a code), its tiles reduced at a cluster barrier and, with TANDEM_WGQ_RED=async,
 * asynchronously, byte for byte. */
#define BULK_TOK 3  /* single tokens per matrix */
#define BULK_XTOK 32 /* inputs per matrix: the largest batch */

/* 2..8 tokens: one n-tile; 9 and 16: two (16- or 32-row tiles, by rows per SM); 31, 32:
 * four. */
static const int64_t bulk_batches[] = {2, 5, 8, 9, 16, 31, 32};

typedef struct bulk_shape {
    td_dtype type;
    int64_t rows, cols;
} bulk_shape;

/* 3 and 37 rows (less than a unit of 8, and a partial last unit), 7001 (one row in the last
 * unit), 33000; k-blocks per row fewer than a stage, not a multiple of the stage (21, 5, 33
 * Q8_0 blocks: a partial last k-block) and many; the 27B target's ffn_gate/up, ffn_down,
 * attn_qkv and ssm/attn_out shapes (rows x cols). Q6_K and Q8_0 rows start at every even
 * offset modulo 16, and the matrix's last run ends past its last 16-byte boundary. Q6_K rows
 * of a multiple of 1024 inputs in an even number go to the window and wide kernels by pairs
 * (38 x 1024: a last tile of 6 rows), others one by one (37 x 2048: one row unpaired). */
static const bulk_shape bulk_shapes[] = {
    {TD_Q4_K, 3, 256},      {TD_Q4_K, 37, 768},     {TD_Q4_K, 7001, 1280},
    {TD_Q4_K, 33000, 256},  {TD_Q4_K, 300, 5376},   {TD_Q4_K, 17408, 5120},
    {TD_Q4_K, 5120, 17408}, {TD_Q4_K, 10240, 5120}, {TD_Q4_K, 5120, 6144},
    {TD_Q5_K, 3, 256},      {TD_Q5_K, 37, 768},     {TD_Q5_K, 7001, 1280},
    {TD_Q5_K, 300, 5376},   {TD_Q5_K, 17408, 5120}, {TD_Q5_K, 5120, 17408},
    {TD_Q5_K, 10240, 5120}, {TD_Q5_K, 5120, 6144},  {TD_Q6_K, 3, 256},
    {TD_Q6_K, 37, 768},     {TD_Q6_K, 7001, 1280},  {TD_Q6_K, 33000, 256},
    {TD_Q6_K, 300, 5376},   {TD_Q6_K, 17408, 5120}, {TD_Q6_K, 5120, 17408},
    {TD_Q6_K, 10240, 5120}, {TD_Q6_K, 5120, 6144},  {TD_Q6_K, 38, 1024},
    {TD_Q6_K, 37, 2048},    {TD_Q8_0, 3, 32},
    {TD_Q8_0, 37, 96},      {TD_Q8_0, 7001, 1056},  {TD_Q8_0, 33000, 64},
    {TD_Q8_0, 300, 5408},   {TD_Q8_0, 17408, 5120}, {TD_Q8_0, 5120, 17408},
    {TD_Q8_0, 10240, 5120}, {TD_Q8_0, 5120, 6144},
};

static const char *g_single_out; /* the child's output file */

/* The child's one test: see the section comment. */
static void single_tokens_child(void **state)
{
    (void)state;
    const char *variant = getenv("TANDEM_MMD");
    const bool check_cpu = variant && strcmp(variant, "bulk") == 0;
    FILE *f = fopen(g_single_out, "wb");
    assert_non_null(f);
    for (size_t k = 0; k < sizeof bulk_shapes / sizeof *bulk_shapes; k++) {
        const bulk_shape *b = &bulk_shapes[k];
        char what[96];
        snprintf(what, sizeof what, "TANDEM_MMD=%s %s %lld x %lld", variant ? variant : "",
                 dtype_name(b->type), (long long)b->rows, (long long)b->cols);
        rng_seed(31 + k); /* the same weights and inputs in every child */
        test_weight tw;
        weight_init(&tw, b->type, b->rows, b->cols);
        float *x = rng_floats(BULK_XTOK * b->cols, 2.0f);
        for (int64_t t = 0; t < BULK_XTOK; t++)
            x[t * b->cols + (t * 7919) % b->cols] *= 16.0f;
        float *dx = dput(x, (size_t)(BULK_XTOK * b->cols) * sizeof(float));
        float *alone = malloc((size_t)(BULK_TOK * b->rows) * sizeof(float));
        for (int64_t t = 0; t < BULK_TOK; t++) {
            float *y = gpu_matmul(&tw, dx + t * b->cols, 1);
            memcpy(alone + t * b->rows, y, (size_t)b->rows * sizeof(float));
            free(y);
        }
        for (size_t j = 0; j < sizeof bulk_batches / sizeof *bulk_batches; j++) {
            const int64_t n = bulk_batches[j];
            float *batch = gpu_matmul(&tw, dx, n);
            char at[160];
            snprintf(at, sizeof at, "%s: n_tok %lld vs alone", what, (long long)n);
            const int64_t k_tok = n < BULK_TOK ? n : BULK_TOK;
            assert_true(
                check_same_bits(at, batch, alone, (size_t)(k_tok * b->rows) * sizeof(float)));
            assert_int_equal(fwrite(batch, sizeof(float), (size_t)(n * b->rows), f),
                             (size_t)(n * b->rows));
            free(batch);
        }
        if (check_cpu) {
            expect e;
            expect_init(&e, &tw, x, BULK_TOK);
            assert_true(check_outputs(what, alone, &e, BULK_TOK, b->rows));
            expect_free(&e);
        }
        assert_int_equal(fwrite(alone, sizeof(float), (size_t)(BULK_TOK * b->rows), f),
                         (size_t)(BULK_TOK * b->rows));
        free(alone);
        cuda_mem_free(dx);
        free(x);
        weight_free(&tw);
    }
    assert_int_equal(fclose(f), 0);
}

/* Runs this program as a child with TANDEM_MMD=mmd, (unless NULL) TANDEM_MMQ=mmq and one more
 * setting extra ("NAME=value", or NULL) writing to out; its exit status. */
static int run_single_tokens(const char *mmd, const char *mmq, const char *extra,
                             const char *out)
{
    extern char **environ;
    char env_mmd[64], env_mmq[64];
    snprintf(env_mmd, sizeof env_mmd, "TANDEM_MMD=%s", mmd);
    snprintf(env_mmq, sizeof env_mmq, "TANDEM_MMQ=%s", mmq ? mmq : "");
    size_t n = 0;
    while (environ[n])
        n++;
    char **envp = calloc(n + 4, sizeof *envp);
    assert_non_null(envp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "TANDEM_MMD=", 11) != 0 &&
            strncmp(environ[i], "TANDEM_MMQ=", 11) != 0 &&
            strncmp(environ[i], "TANDEM_MMQ_REFILL=", 18) != 0 &&
            strncmp(environ[i], "TANDEM_WGQ_RED=", 15) != 0)
            envp[m++] = environ[i];
    envp[m++] = env_mmd;
    if (mmq)
        envp[m++] = env_mmq;
    if (extra)
        envp[m++] = (char *)extra;
    char exe[] = "/proc/self/exe", flag[] = "--single-tokens";
    char *argv[] = {exe, flag, (char *)out, NULL};
    pid_t pid = 0;
    const int e = posix_spawn(&pid, exe, NULL, NULL, argv, envp);
    free(envp);
    assert_int_equal(e, 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The whole file at path (n bytes). */
static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    const long len = ftell(f);
    assert_true(len > 0);
    rewind(f);
    uint8_t *buf = malloc((size_t)len);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

/* Shared bytes the bulk kernel's CTA needs for a matrix (matmul_bulk.cu's smem_for: Q4_K and
 * Q6_K the larger of their two CTAs), so the test knows every bulk_shapes matrix really takes
 * that kernel under TANDEM_MMD=bulk. */
static int64_t bulk_smem(const bulk_shape *b)
{
    const int64_t nkb = b->cols / 256;
    switch (b->type) {
    case TD_Q4_K: {
        const int64_t a = mmb_smem_bytes(nkb, MMB_XKB_K, MMB_Q4_K_SLOT, MMB_Q4_K_STAGES, MMB_WARPS);
        const int64_t w = mmb_smem_bytes(nkb, MMB_XKB_K, MMB_Q4_K_WIDE_SLOT,
                                         MMB_Q4_K_WIDE_STAGES, MMB_WIDE_WARPS);
        return a > w ? a : w;
    }
    case TD_Q5_K:
        return mmb_smem_bytes(nkb, MMB_XKB_K, MMB_Q5_K_SLOT, MMB_Q5_K_STAGES, MMB_WARPS);
    case TD_Q6_K: {
        const int64_t a = mmb_smem_bytes(nkb, MMB_XKB_K, MMB_Q6_K_SLOT, MMB_Q6_K_STAGES, MMB_WARPS);
        const int64_t w = mmb_smem_bytes(nkb, MMB_XKB_K, MMB_Q6_K_SLOT, MMB_Q6_K_WIDE_STAGES,
                                         MMB_Q6_K_WIDE_WARPS);
        return a > w ? a : w;
    }
    default:
        return mmb_smem_bytes((b->cols / 32 + 3) / 4, MMB_XKB_Q8, MMB_Q8_0_SLOT,
                              MMB_Q8_0_STAGES, MMB_WARPS);
    }
}

/* On an sm_90 device, single tokens under TANDEM_MMD=bulk (the bulk-copy kernel), =mma (the
 * tensor-core kernel) and =regs (the dp4a kernel), and batches of 2..32 tokens on the
 * tensor-core kernel and (2-16 tokens) on the window and warpgroup kernels, give the same
 * bytes for every
 * bulk_shapes matrix; each single token equals its batches' and (bulk)
 * cpu_matmul within the bounds of check_outputs. Skipped below sm_90, where the bulk kernels
 * do not exist. */
static void test_matmul_bulk_kernels_match_tensor_core_and_dp4a_bits(void **state)
{
    (void)state;
    int major = 0, optin = 0;
    device_caps(&major, &optin);
    if (major < 9) {
        printf("bulk-copy kernel: sm_%d0 code, needs sm_90: skipped\n", major);
        skip();
    }
    for (size_t k = 0; k < sizeof bulk_shapes / sizeof *bulk_shapes; k++)
        assert_true(bulk_smem(&bulk_shapes[k]) <= optin);
    /* batches: the bulk child as by default (2-16 tokens on the window kernel but 9-16 of
     * the 17408-input Q4_K rows on the warpgroup kernel, 17-64 on the wide kernel), the dp4a
     * child with 2-8 tokens on the tensor-core kernel
     * (TANDEM_MMQ=bulk9; its window and wide kernels refilling their stages at an item's
     * end, TANDEM_MMQ_REFILL=late, where the others refill two-stage rings at its start), the
     * mma child on the tensor-core kernel only (TANDEM_MMQ=mmq), two
     * more bulk children with Q4_K and Q5_K on the warpgroup kernel (TANDEM_MMQ=wg), its
     * tiles reduced at a cluster barrier and asynchronously (TANDEM_WGQ_RED=async; on a
     * device without sm_90a code they repeat the first): five children cover the six kernels
     * (the window and wide kernels copy Q4_K and Q5_K weights a tile at a time, Q6_K by
     * pairs of rows where they pair, else a row at a time) */
    static const char *mmd[] = {"bulk", "mma", "regs", "bulk", "bulk"};
    static const char *mmq[] = {NULL, "mmq", "bulk9", "wg", "wg"};
    static const char *extra[] = {NULL, NULL, "TANDEM_MMQ_REFILL=late", NULL,
                                  "TANDEM_WGQ_RED=async"};
    enum { NV = 5 };
    char path[NV][64];
    uint8_t *data[NV];
    size_t len[NV];
    for (int v = 0; v < NV; v++) {
        snprintf(path[v], sizeof path[v], "/tmp/tandem_single_%d_%d.bin", (int)getpid(), v);
        const int rc = run_single_tokens(mmd[v], mmq[v], extra[v], path[v]);
        if (rc != 0)
            fail_msg("TANDEM_MMD=%s TANDEM_MMQ=%s %s child exited with %d", mmd[v],
                     mmq[v] ? mmq[v] : "(unset)", extra[v] ? extra[v] : "", rc);
        data[v] = slurp(path[v], &len[v]);
        remove(path[v]);
    }
    for (int v = 1; v < NV; v++) {
        char what[128];
        snprintf(what, sizeof what, "TANDEM_MMD=bulk vs TANDEM_MMD=%s TANDEM_MMQ=%s %s",
                 mmd[v], mmq[v] ? mmq[v] : "(unset)", extra[v] ? extra[v] : "");
        assert_int_equal(len[v], len[0]);
        assert_true(check_same_bits(what, data[0], data[v], len[0]));
    }
    for (int v = 0; v < NV; v++)
        free(data[v]);
}

/* ---- dequantisation --------------------------------------------------------------------- */

static const td_dtype all_types[] = {TD_F32, TD_F16, TD_BF16, TD_Q8_0,
                                     TD_Q4_K, TD_Q5_K, TD_Q6_K};

/* Every type, 3 super-blocks of random values (plus f16 subnormals and infinities), from an
 * odd address: the GPU's floats equal the CPU's bit for bit. */
static void test_dequantize_row_matches_cpu_bits(void **state)
{
    (void)state;
    rng_seed(21);
    const int64_t n = 768;
    float *f = rng_floats(n, 3.0f);
    f[5] = 3e-6f;   /* an f16 subnormal */
    f[6] = -1e-7f;  /* another */
    f[7] = INFINITY;
    for (size_t k = 0; k < sizeof all_types / sizeof *all_types; k++) {
        const td_dtype type = all_types[k];
        float *src = f;
        float fin[768];
        if (is_quant(type)) { /* the quantisers want finite input */
            memcpy(fin, f, sizeof fin);
            fin[7] = 2.5f;
            src = fin;
        }
        uint64_t bytes = 0;
        assert_int_equal(dtype_bytes(type, (uint64_t)n, &bytes), TD_OK);
        uint8_t *q = malloc((size_t)bytes + 1);
        assert_int_equal(cpu_quantize_row(type, src, q + 1, n), TD_OK);
        float want[768];
        assert_int_equal(cpu_dequantize_row(type, q + 1, want, n), TD_OK);
        uint8_t *dq = dput(q, (size_t)bytes + 1);
        float *dout = dpoison((size_t)n * sizeof(float));
        GPU_OK(cuda_dequantize_row(type, dq + 1, dout, n, gpu_st));
        float *got = dget(dout, (size_t)n * sizeof(float));
        assert_true(check_same_bits(dtype_name(type), got, want, sizeof want));
        free(got);
        cuda_mem_free(dout);
        cuda_mem_free(dq);
        free(q);
    }
    free(f);
    /* what the CPU refuses, the GPU refuses */
    assert_int_equal(cuda_dequantize_row(TD_Q4_0, NULL, NULL, 32, gpu_st), TD_ENOTSUP);
    assert_int_equal(cuda_dequantize_row(TD_Q4_K, NULL, NULL, 100, gpu_st), TD_EINVAL);
}

/* Rows picked by device ids equal cpu_get_rows bit for bit; an id outside the matrix gives a
 * NaN row (it cannot be reported without waiting for the GPU). */
static void test_get_rows_matches_cpu_and_bad_ids_give_nan(void **state)
{
    (void)state;
    rng_seed(22);
    for (size_t k = 0; k < sizeof all_types / sizeof *all_types; k++) {
        const td_dtype type = all_types[k];
        const int64_t rows = 50, cols = 512;
        test_weight tw;
        weight_init(&tw, type, rows, cols);
        const int32_t ids[] = {7, 0, 49, 7, 23};
        const int64_t n = 5;
        float want[5 * 512];
        assert_int_equal(cpu_get_rows(want, &tw.host, ids, n), TD_OK);
        int32_t *did = dput(ids, sizeof ids);
        float *dout = dpoison(sizeof want);
        GPU_OK(cuda_get_rows(dout, &tw.dev, did, n, gpu_st));
        float *got = dget(dout, sizeof want);
        assert_true(check_same_bits(dtype_name(type), got, want, sizeof want));
        free(got);

        const int32_t bad[] = {-1, 3, 50};
        int32_t *dbad = dput(bad, sizeof bad);
        GPU_OK(cuda_get_rows(dout, &tw.dev, dbad, 3, gpu_st));
        got = dget(dout, 3 * (size_t)cols * sizeof(float));
        for (int64_t i = 0; i < cols; i++) {
            assert_true(isnan(got[i]));
            assert_true(isnan(got[2 * cols + i]));
            assert_true(got[cols + i] == tw.deq[3 * cols + i]);
        }
        free(got);
        cuda_mem_free(dbad);
        cuda_mem_free(dout);
        cuda_mem_free(did);
        weight_free(&tw);
    }
}

int main(int argc, char **argv)
{
    if (!gpu_check_init())
        return SKIP_EXIT;
    if (argc == 3 && strcmp(argv[1], "--single-tokens") == 0) { /* a variant's child */
        g_single_out = argv[2];
        const struct CMUnitTest child[] = {cmocka_unit_test(single_tokens_child)};
        int rc = cmocka_run_group_tests(child, NULL, NULL);
        gpu_check_free();
        return rc;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_k_quants_match_cpu_at_every_batch_size),
        cmocka_unit_test(test_matmul_q8_0_matches_cpu_at_every_batch_size),
        cmocka_unit_test(test_matmul_float_types_match_cpu_at_every_batch_size),
        cmocka_unit_test(test_matmul_half_weights_draft_step_sizes_match_alone_bits),
        cmocka_unit_test(test_matmul_half_weights_single_products_are_exact),
        cmocka_unit_test(test_matmul_x_bf16_reads_the_rounded_inputs),
        cmocka_unit_test(test_matmul_q6x_matches_the_rounded_inputs),
        cmocka_unit_test(test_matmul_nan_input_stays_in_its_token),
        cmocka_unit_test(test_matmul_rejects_bad_weights),
        cmocka_unit_test(test_matmul_bulk_kernels_match_tensor_core_and_dp4a_bits),
        cmocka_unit_test(test_dequantize_row_matches_cpu_bits),
        cmocka_unit_test(test_get_rows_matches_cpu_and_bad_ids_give_nan),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_check_free();
    return rc;
}

#endif /* TANDEM_HAVE_CUDA */
