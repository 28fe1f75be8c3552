/* Element types and quant block layouts (DESIGN section 8): the one place that knows them.
 *
 * Dequantisation follows the arithmetic order of ggml/gguf-py ((d * sc) * q - dmin * m in
 * f32), so rows come out bit-identical to gguf.quants.dequantize. The quantisers are plain
 * round-to-nearest with scales rounded up so no value is clipped: valid blocks for test and
 * benchmark models, not tuned for quality. */
#include <math.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "kernels/cpu/simd.h"
#include "kernels/kquant.h"
#include "kernels/ops.h"

#define QK8_0 32   /* weights per Q8_0 block */
#define QK_K 256   /* weights per K-quant super-block */

/* Byte sizes of one block, as laid out in DESIGN section 8. */
#define Q8_0_BYTES 34
#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q6_K_BYTES 210

/* --- scalar types ------------------------------------------------------------------- */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Branch-free (masks only) so the F16 row loops vectorise: a subnormal half is mant * 2^-24,
 * exact in f32 without touching subnormal f32 arithmetic. */
static inline __attribute__((always_inline)) float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t em = h & 0x7fff;  /* exponent and mantissa */
    uint32_t mant = h & 0x3ff;
    uint32_t normal = sign | ((em << 13) + (112u << 23)); /* rebias 15 -> 127 */
    uint32_t special = sign | 0x7f800000u | (mant << 13); /* inf, NaN */
    float sub = (float)mant * 0x1p-24f;
    uint32_t subnormal = sign | f32_bits(sub);
    uint32_t m_special = 0u - (uint32_t)(em >= 0x7c00); /* all ones or zero: masks, not */
    uint32_t m_normal = (0u - (uint32_t)(em >= 0x400)) & ~m_special; /* branches */
    uint32_t bits = (special & m_special) | (normal & m_normal) |
                    (subnormal & ~(m_special | m_normal));
    return f32_from_bits(bits);
}

float ops_f16_to_f32(uint16_t h)
{
    return f16_to_f32(h);
}

uint16_t ops_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return sign | 0x7e00 | (uint16_t)((a >> 13) & 0x3ff);
    int e = (int)(a >> 23) - 127; /* unbiased exponent */
    if (e > 15)
        return sign | 0x7c00;
    uint32_t m = (a & 0x7fffff) | 0x800000; /* 24-bit significand with the hidden bit */
    if (a == 0)
        return sign;
    if (e >= -14) {
        uint32_t h = ((uint32_t)(e + 15) << 10) | ((m >> 13) & 0x3ff);
        uint32_t rem = m & 0x1fff;
        if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
            h++; /* a carry into the exponent is the correct rounding (up to inf) */
        return sign | (uint16_t)h;
    }
    /* subnormal half: value in units of 2^-24 is m * 2^(e+1) */
    int shift = -(e + 1);
    if (shift > 24)
        return sign;
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1)))
        q++;
    return sign | (uint16_t)q;
}

float ops_bf16_to_f32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

uint16_t ops_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* The smallest f16 >= v (v >= 0), so a scale stored as f16 never shrinks and clips. */
static uint16_t f16_ceil(float v)
{
    uint16_t h = ops_f32_to_f16(v);
    if (ops_f16_to_f32(h) < v)
        h++;
    return h;
}

static uint16_t rd_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

/* A little-endian u16 at any alignment (one load on x86). */
static inline uint16_t ld_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void wr_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

/* --- supported types ------------------------------------------------------------------ */

bool ops_type_supported(td_dtype type)
{
    switch (type) {
    case TD_F32:
    case TD_F16:
    case TD_BF16:
    case TD_Q8_0:
    case TD_Q4_K:
    case TD_Q5_K:
    case TD_Q6_K:
        return true;
    default:
        return false;
    }
}

static td_err check_row(td_dtype type, int64_t n)
{
    if (!ops_type_supported(type))
        return err_set(TD_ENOTSUP, "type %s (%d) is not supported by the ops", dtype_name(type),
                       (int)type);
    const dtype_info *info = dtype_get(type);
    TD_ASSERT(info != NULL);
    if (n < 0 || n % info->block != 0)
        return err_set(TD_EINVAL, "%lld elements of %s: not a multiple of the block size %u",
                       (long long)n, info->name, info->block);
    return TD_OK;
}

td_err ops_weight_init(ops_weight *w, td_dtype type, int64_t rows, int64_t cols,
                       const void *data)
{
    TD_ASSERT(w != NULL);
    if (rows <= 0 || cols <= 0)
        return err_set(TD_EINVAL, "weight of %lld x %lld elements", (long long)rows,
                       (long long)cols);
    TD_TRY(check_row(type, cols));
    uint64_t row_bytes;
    TD_TRY(dtype_bytes(type, (uint64_t)cols, &row_bytes));
    if ((uint64_t)rows > SIZE_MAX / row_bytes)
        return err_set(TD_EINVAL, "weight of %lld rows of %llu bytes overflows", (long long)rows,
                       (unsigned long long)row_bytes);
    w->type = type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = (size_t)row_bytes;
    w->data = data;
    w->x_bf16 = false;
    return TD_OK;
}

/* --- dequantisation, one block at a time ----------------------------------------------- */

static inline __attribute__((always_inline)) void dequant_q8_0(const uint8_t *b, float *y)
{
    float d = f16_to_f32(rd_u16(b));
    const int8_t *q = (const int8_t *)(b + 2);
#pragma omp simd
    for (int i = 0; i < QK8_0; i++)
        y[i] = d * (float)q[i];
}

static inline __attribute__((always_inline)) void dequant_q4_k(const uint8_t *b, float *y)
{
    float d = f16_to_f32(rd_u16(b));
    float dmin = f16_to_f32(rd_u16(b + 2));
    const uint8_t *s = b + 4;
    const uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++) {
        int sc0, m0, sc1, m1;
        kq_scale_min(s, 2 * c, &sc0, &m0);
        kq_scale_min(s, 2 * c + 1, &sc1, &m1);
        float d0 = d * sc0, dm0 = dmin * m0, d1 = d * sc1, dm1 = dmin * m1;
        const uint8_t *q = qs + 32 * c;
        float *o = y + 64 * c;
#pragma omp simd
        for (int l = 0; l < 32; l++) {
            o[l] = d0 * (float)(q[l] & 0xF) - dm0;
            o[l + 32] = d1 * (float)(q[l] >> 4) - dm1;
        }
    }
}

static inline __attribute__((always_inline)) void dequant_q5_k(const uint8_t *b, float *y)
{
    float d = f16_to_f32(rd_u16(b));
    float dmin = f16_to_f32(rd_u16(b + 2));
    const uint8_t *s = b + 4;
    const uint8_t *qh = b + 16;
    const uint8_t *qs = b + 48;
    for (int c = 0; c < 4; c++) {
        int sc0, m0, sc1, m1;
        kq_scale_min(s, 2 * c, &sc0, &m0);
        kq_scale_min(s, 2 * c + 1, &sc1, &m1);
        float d0 = d * sc0, dm0 = dmin * m0, d1 = d * sc1, dm1 = dmin * m1;
        const uint8_t *q = qs + 32 * c;
        float *o = y + 64 * c;
#pragma omp simd
        for (int l = 0; l < 32; l++) {
            int lo = (q[l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4);
            int hi = (q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
            o[l] = d0 * (float)lo - dm0;
            o[l + 32] = d1 * (float)hi - dm1;
        }
    }
}

static inline __attribute__((always_inline)) void dequant_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b;
    const uint8_t *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = f16_to_f32(rd_u16(b + 208));
    for (int n = 0; n < 2; n++) {
        const uint8_t *l_ = ql + 64 * n;
        const uint8_t *h_ = qh + 32 * n;
        const int8_t *s_ = sc + 8 * n;
        float *o = y + 128 * n;
        for (int g = 0; g < 2; g++) { /* 16 weights share one scale per quarter */
            const float s0 = d * (float)s_[g], s1 = d * (float)s_[g + 2];
            const float s2 = d * (float)s_[g + 4], s3 = d * (float)s_[g + 6];
#pragma omp simd
            for (int l = 16 * g; l < 16 * g + 16; l++) {
                int w0 = ((l_[l] & 0xF) | (((h_[l] >> 0) & 3) << 4)) - 32;
                int w1 = ((l_[l + 32] & 0xF) | (((h_[l] >> 2) & 3) << 4)) - 32;
                int w2 = ((l_[l] >> 4) | (((h_[l] >> 4) & 3) << 4)) - 32;
                int w3 = ((l_[l + 32] >> 4) | (((h_[l] >> 6) & 3) << 4)) - 32;
                o[l] = s0 * (float)w0;
                o[l + 32] = s1 * (float)w1;
                o[l + 64] = s2 * (float)w2;
                o[l + 96] = s3 * (float)w3;
            }
        }
    }
}

/* F16 rows with the F16C conversion instruction (8 values per instruction): the portable
 * mask arithmetic above runs about 10x slower. */
#if defined(__x86_64__)
__attribute__((target("avx,f16c")))
static void f16_row_f16c(const uint8_t *b, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 2 * i))));
    for (; i < n; i++)
        dst[i] = f16_to_f32(ld_u16(b + 2 * i));
}

/* F16C and AVX with the AVX state saved by the OS (CPUID leaf 1: ECX's F16C, AVX and OSXSAVE
 * bits; XCR0's SSE and AVX bits), read once. (__builtin_cpu_supports knows no "f16c" in
 * clang 14, the fuzz build's compiler.) */
static bool have_f16c(void)
{
    static int known; /* 0: not read yet, 1: no, 2: yes */
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k == 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        bool ok = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) && (c & bit_AVX) &&
                  (c & bit_OSXSAVE);
        if (ok) {
            unsigned lo = 0, hi = 0;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            ok = (lo & 6) == 6;
        }
        k = ok ? 2 : 1;
        __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    }
    return k == 2;
}
#endif

/* The body of cpu_dequantize_row, compiled for AVX2 and for plain x86-64 (kernels/cpu/simd.h):
 * the block loops above are written to vectorise, and 8-wide vectors roughly double the
 * matmul's dequantisation rate. */
static inline __attribute__((always_inline)) td_err dequantize_row(td_dtype type,
                                                                   const void *src, float *dst,
                                                                   int64_t n)
{
    TD_TRY(check_row(type, n));
    const uint8_t *b = src;
    switch (type) {
    case TD_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case TD_F16:
#if defined(__x86_64__)
        if (have_f16c()) {
            f16_row_f16c(b, dst, n);
            break;
        }
#endif
#pragma omp simd
        for (int64_t i = 0; i < n; i++)
            dst[i] = f16_to_f32(ld_u16(b + 2 * i));
        break;
    case TD_BF16:
#pragma omp simd
        for (int64_t i = 0; i < n; i++)
            dst[i] = f32_from_bits((uint32_t)ld_u16(b + 2 * i) << 16);
        break;
    case TD_Q8_0:
        for (int64_t i = 0; i < n / QK8_0; i++)
            dequant_q8_0(b + i * Q8_0_BYTES, dst + i * QK8_0);
        break;
    case TD_Q4_K:
        for (int64_t i = 0; i < n / QK_K; i++)
            dequant_q4_k(b + i * Q4_K_BYTES, dst + i * QK_K);
        break;
    case TD_Q5_K:
        for (int64_t i = 0; i < n / QK_K; i++)
            dequant_q5_k(b + i * Q5_K_BYTES, dst + i * QK_K);
        break;
    case TD_Q6_K:
        for (int64_t i = 0; i < n / QK_K; i++)
            dequant_q6_k(b + i * Q6_K_BYTES, dst + i * QK_K);
        break;
    default:
        TD_ASSERT(!"check_row let an unsupported type through");
    }
    return TD_OK;
}

#if defined(__x86_64__)
CPU_AVX2_TARGET static td_err dequantize_row_avx2(td_dtype type, const void *src, float *dst,
                                                  int64_t n)
{
    return dequantize_row(type, src, dst, n);
}
#endif

td_err cpu_dequantize_row(td_dtype type, const void *src, float *dst, int64_t n)
{
#if defined(__x86_64__)
    if (cpu_has_avx2_fma())
        return dequantize_row_avx2(type, src, dst, n);
#endif
    return dequantize_row(type, src, dst, n);
}

/* --- quantisation, one block at a time ------------------------------------------------- */

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

static void quant_q8_0(const float *x, uint8_t *b)
{
    float amax = 0;
    for (int i = 0; i < QK8_0; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    uint16_t dh = f16_ceil(amax / 127.0f);
    float d = ops_f16_to_f32(dh);
    wr_u16(b, dh);
    int8_t *q = (int8_t *)(b + 2);
    for (int i = 0; i < QK8_0; i++)
        q[i] = (int8_t)(d > 0 ? clampi((int)lrintf(x[i] / d), -127, 127) : 0);
}

/* Scales and mins of the 8 sub-blocks of a Q4_K/Q5_K block with levels 0..qmax: fills the
 * header (d, dmin, 12 scale bytes) and returns the per-sub-block step d*sc and offset
 * dmin*m so the caller quantises q = round((x + off) / step). */
static void kq_header(const float *x, int qmax, uint8_t *b, float step[8], float off[8])
{
    float mn[8], mx[8], need[8];
    float max_min = 0;
    for (int j = 0; j < 8; j++) {
        mn[j] = 0; /* the offset is -dmin*m <= 0, so the range always contains 0 */
        mx[j] = 0;
        for (int l = 0; l < 32; l++) {
            mn[j] = fminf(mn[j], x[32 * j + l]);
            mx[j] = fmaxf(mx[j], x[32 * j + l]);
        }
        max_min = fmaxf(max_min, -mn[j]);
    }
    uint16_t dminh = f16_ceil(max_min / 63.0f);
    float dmin = ops_f16_to_f32(dminh);
    uint8_t sc[8], m[8];
    float max_need = 0;
    for (int j = 0; j < 8; j++) {
        m[j] = (uint8_t)(dmin > 0 ? clampi((int)ceilf(-mn[j] / dmin), 0, 63) : 0);
        need[j] = (mx[j] + dmin * m[j]) / (float)qmax; /* step covering the top value */
        max_need = fmaxf(max_need, need[j]);
    }
    uint16_t dh = f16_ceil(max_need / 63.0f);
    float d = ops_f16_to_f32(dh);
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(d > 0 ? clampi((int)ceilf(need[j] / d), 0, 63) : 0);
        step[j] = d * sc[j];
        off[j] = dmin * m[j];
    }
    wr_u16(b, dh);
    wr_u16(b + 2, dminh);
    uint8_t *s = b + 4;
    for (int i = 0; i < 4; i++) {
        s[i] = (uint8_t)(sc[i] | ((sc[i + 4] >> 4) << 6));
        s[i + 4] = (uint8_t)(m[i] | ((m[i + 4] >> 4) << 6));
        s[i + 8] = (uint8_t)((sc[i + 4] & 0xF) | ((m[i + 4] & 0xF) << 4));
    }
}

static int kq_level(float x, float step, float off, int qmax)
{
    return step > 0 ? clampi((int)lrintf((x + off) / step), 0, qmax) : 0;
}

static void quant_q4_k(const float *x, uint8_t *b)
{
    float step[8], off[8];
    kq_header(x, 15, b, step, off);
    uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = kq_level(x[64 * c + l], step[2 * c], off[2 * c], 15);
            int hi = kq_level(x[64 * c + 32 + l], step[2 * c + 1], off[2 * c + 1], 15);
            qs[32 * c + l] = (uint8_t)(lo | (hi << 4));
        }
}

static void quant_q5_k(const float *x, uint8_t *b)
{
    float step[8], off[8];
    kq_header(x, 31, b, step, off);
    uint8_t *qh = b + 16;
    uint8_t *qs = b + 48;
    memset(qh, 0, 32);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = kq_level(x[64 * c + l], step[2 * c], off[2 * c], 31);
            int hi = kq_level(x[64 * c + 32 + l], step[2 * c + 1], off[2 * c + 1], 31);
            qs[32 * c + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
            qh[l] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
        }
}

static void quant_q6_k(const float *x, uint8_t *b)
{
    float need[16];
    float max_need = 0;
    for (int j = 0; j < 16; j++) {
        float amax = 0;
        for (int l = 0; l < 16; l++)
            amax = fmaxf(amax, fabsf(x[16 * j + l]));
        need[j] = amax / 31.0f; /* levels -31..31 of the -32..31 range: symmetric */
        max_need = fmaxf(max_need, need[j]);
    }
    uint16_t dh = f16_ceil(max_need / 127.0f);
    float d = ops_f16_to_f32(dh);
    int8_t *sc = (int8_t *)(b + 192);
    float step[16];
    for (int j = 0; j < 16; j++) {
        sc[j] = (int8_t)(d > 0 ? clampi((int)ceilf(need[j] / d), 0, 127) : 0);
        step[j] = d * sc[j];
    }
    wr_u16(b + 208, dh);
    uint8_t w[QK_K]; /* levels 0..63 (q + 32) */
    for (int i = 0; i < QK_K; i++) {
        float s = step[i / 16];
        w[i] = (uint8_t)(32 + (s > 0 ? clampi((int)lrintf(x[i] / s), -32, 31) : 0));
    }
    uint8_t *ql = b;
    uint8_t *qh = b + 128;
    for (int n = 0; n < 2; n++) {
        const uint8_t *v = w + 128 * n;
        for (int l = 0; l < 32; l++) {
            ql[64 * n + l] = (uint8_t)((v[l] & 0xF) | ((v[l + 64] & 0xF) << 4));
            ql[64 * n + l + 32] = (uint8_t)((v[l + 32] & 0xF) | ((v[l + 96] & 0xF) << 4));
            qh[32 * n + l] = (uint8_t)((v[l] >> 4) | ((v[l + 32] >> 4) << 2) |
                                       ((v[l + 64] >> 4) << 4) | ((v[l + 96] >> 4) << 6));
        }
    }
}

td_err cpu_quantize_row(td_dtype type, const float *src, void *dst, int64_t n)
{
    TD_TRY(check_row(type, n));
    uint8_t *b = dst;
    switch (type) {
    case TD_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case TD_F16:
        for (int64_t i = 0; i < n; i++)
            wr_u16(b + 2 * i, ops_f32_to_f16(src[i]));
        break;
    case TD_BF16:
        for (int64_t i = 0; i < n; i++)
            wr_u16(b + 2 * i, ops_f32_to_bf16(src[i]));
        break;
    case TD_Q8_0:
        for (int64_t i = 0; i < n / QK8_0; i++)
            quant_q8_0(src + i * QK8_0, b + i * Q8_0_BYTES);
        break;
    case TD_Q4_K:
        for (int64_t i = 0; i < n / QK_K; i++)
            quant_q4_k(src + i * QK_K, b + i * Q4_K_BYTES);
        break;
    case TD_Q5_K:
        for (int64_t i = 0; i < n / QK_K; i++)
            quant_q5_k(src + i * QK_K, b + i * Q5_K_BYTES);
        break;
    case TD_Q6_K:
        for (int64_t i = 0; i < n / QK_K; i++)
            quant_q6_k(src + i * QK_K, b + i * Q6_K_BYTES);
        break;
    default:
        TD_ASSERT(!"check_row let an unsupported type through");
    }
    return TD_OK;
}

td_err cpu_get_rows(float *out, const ops_weight *w, const int32_t *ids, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= w->rows)
            return err_set(TD_ERANGE, "row id %d outside [0, %lld)", ids[i],
                           (long long)w->rows);
        const uint8_t *row = (const uint8_t *)w->data + (size_t)ids[i] * w->row_bytes;
        TD_TRY(cpu_dequantize_row(w->type, row, out + i * w->cols, w->cols));
    }
    return TD_OK;
}
