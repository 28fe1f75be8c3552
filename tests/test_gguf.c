/* GGUF reader and writer: round trips of every metadata and tensor type, hand-built images
 * with exact expected values, typed getters, and files on disk.
 *
 * `test_gguf --write-sample PATH` writes the sample file described by sample_writer() and
 * exits: tests/py/test_gguf_interop.py reads it with gguf-py's GGUFReader. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/gguf.h"

/* --- the sample file (tests/py/test_gguf_interop.py expects exactly this) ---------------- */

static const uint8_t s_u8[] = {0, 1, 255};
static const int8_t s_i8[] = {-128, 0, 127};
static const uint16_t s_u16[] = {0, 65535};
static const int16_t s_i16[] = {-32768, 32767};
static const uint32_t s_u32[] = {0, 1, 4294967295u};
static const int32_t s_i32[] = {-2147483647 - 1, -1, 2147483647};
static const float s_f32[] = {0.5f, -1.25f, 3.0e38f};
static const uint8_t s_bool[] = {1, 0, 1};
static const uint64_t s_u64[] = {0, 18446744073709551615ull};
static const int64_t s_i64[] = {-9223372036854775807ll - 1, 9223372036854775807ll};
static const double s_f64[] = {0.1, -1e300};
static const char *const s_strs[] = {"a", "", "\xc3\xbc"};

/* Tensor k holds byte (7*i + k) at byte i. */
static uint8_t *pattern(uint64_t size, int k)
{
    uint8_t *p = malloc(size);
    assert_non_null(p);
    for (uint64_t i = 0; i < size; i++)
        p[i] = (uint8_t)(7 * i + (uint64_t)k);
    return p;
}

static void add_pattern_tensor(gguf_writer *w, const char *name, td_dtype type, uint32_t n_dims,
                               const int64_t *ne, uint64_t size, int k)
{
    uint8_t *p = pattern(size, k);
    assert_int_equal(gguf_writer_add_tensor(w, name, type, n_dims, ne, p, size), TD_OK);
    free(p);
}

/* [[1, 2, 3], [4]] of INT32, and [[["x"]], [[], ["y", "z"]]] of STRING. */
static void set_nested(gguf_writer *w)
{
    static const int32_t a[] = {1, 2, 3}, b[] = {4};
    gguf_value inner[2] = {
        {.type = GGUF_TYPE_ARRAY, .arr = {.elem = GGUF_TYPE_INT32, .n = 3, .raw = (const uint8_t *)a}},
        {.type = GGUF_TYPE_ARRAY, .arr = {.elem = GGUF_TYPE_INT32, .n = 1, .raw = (const uint8_t *)b}},
    };
    gguf_value outer = {.type = GGUF_TYPE_ARRAY, .arr = {.elem = GGUF_TYPE_ARRAY, .n = 2, .items = inner}};
    gguf_writer_set_value(w, "test.arr_nested", &outer);

    gguf_value x = {.type = GGUF_TYPE_STRING, .str = {"x", 1}};
    gguf_value yz[2] = {{.type = GGUF_TYPE_STRING, .str = {"y", 1}}, {.type = GGUF_TYPE_STRING, .str = {"z", 1}}};
    gguf_value l1a[1] = {{.type = GGUF_TYPE_ARRAY, .arr = {.elem = GGUF_TYPE_STRING, .n = 1, .items = &x}}};
    gguf_value l1b[2] = {
        {.type = GGUF_TYPE_ARRAY, .arr = {.elem = GGUF_TYPE_STRING, .n = 0}},
        {.type = GGUF_TYPE_ARRAY, .arr = {.elem = GGUF_TYPE_STRING, .n = 2, .items = yz}},
    };
    gguf_value l2[2] = {
        {.type = GGUF_TYPE_ARRAY, .arr = {.elem = GGUF_TYPE_ARRAY, .n = 1, .items = l1a}},
        {.type = GGUF_TYPE_ARRAY, .arr = {.elem = GGUF_TYPE_ARRAY, .n = 2, .items = l1b}},
    };
    gguf_value top = {.type = GGUF_TYPE_ARRAY, .arr = {.elem = GGUF_TYPE_ARRAY, .n = 2, .items = l2}};
    gguf_writer_set_value(w, "test.arr_nested3", &top);
}

static gguf_writer *sample_writer(void)
{
    gguf_writer *w = gguf_writer_new();
    assert_non_null(w);
    gguf_writer_set_str(w, "general.architecture", "tandem-test");
    gguf_value v;
    v = (gguf_value){.type = GGUF_TYPE_UINT8, .u64 = 200};
    gguf_writer_set_value(w, "test.u8", &v);
    v = (gguf_value){.type = GGUF_TYPE_INT8, .i64 = -100};
    gguf_writer_set_value(w, "test.i8", &v);
    v = (gguf_value){.type = GGUF_TYPE_UINT16, .u64 = 60000};
    gguf_writer_set_value(w, "test.u16", &v);
    v = (gguf_value){.type = GGUF_TYPE_INT16, .i64 = -30000};
    gguf_writer_set_value(w, "test.i16", &v);
    gguf_writer_set_u32(w, "test.u32", 4000000000u);
    gguf_writer_set_i32(w, "test.i32", -2000000000);
    gguf_writer_set_f32(w, "test.f32", 3.25f);
    gguf_writer_set_bool(w, "test.bool", true);
    gguf_writer_set_str(w, "test.str", "h\xc3\xa9llo\n\"world\"");
    gguf_writer_set_u64(w, "test.u64", 1099511627777ull);
    v = (gguf_value){.type = GGUF_TYPE_INT64, .i64 = -9000000000000000000ll};
    gguf_writer_set_value(w, "test.i64", &v);
    v = (gguf_value){.type = GGUF_TYPE_FLOAT64, .f64 = -2.718281828459045};
    gguf_writer_set_value(w, "test.f64", &v);
    gguf_writer_set_arr(w, "test.arr_u8", GGUF_TYPE_UINT8, s_u8, 3);
    gguf_writer_set_arr(w, "test.arr_i8", GGUF_TYPE_INT8, s_i8, 3);
    gguf_writer_set_arr(w, "test.arr_u16", GGUF_TYPE_UINT16, s_u16, 2);
    gguf_writer_set_arr(w, "test.arr_i16", GGUF_TYPE_INT16, s_i16, 2);
    gguf_writer_set_arr(w, "test.arr_u32", GGUF_TYPE_UINT32, s_u32, 3);
    gguf_writer_set_arr(w, "test.arr_i32", GGUF_TYPE_INT32, s_i32, 3);
    gguf_writer_set_arr(w, "test.arr_f32", GGUF_TYPE_FLOAT32, s_f32, 3);
    gguf_writer_set_arr(w, "test.arr_bool", GGUF_TYPE_BOOL, s_bool, 3);
    gguf_writer_set_arr(w, "test.arr_u64", GGUF_TYPE_UINT64, s_u64, 2);
    gguf_writer_set_arr(w, "test.arr_i64", GGUF_TYPE_INT64, s_i64, 2);
    gguf_writer_set_arr(w, "test.arr_f64", GGUF_TYPE_FLOAT64, s_f64, 2);
    gguf_writer_set_arr_str(w, "test.arr_str", s_strs, 3);
    gguf_writer_set_arr(w, "test.arr_empty", GGUF_TYPE_UINT32, NULL, 0);
    set_nested(w);
    add_pattern_tensor(w, "token_embd.weight", TD_F32, 2, (int64_t[]){8, 3}, 96, 0);
    add_pattern_tensor(w, "blk.0.attn_q.weight", TD_F16, 2, (int64_t[]){16, 2}, 64, 1);
    add_pattern_tensor(w, "blk.0.attn_k.weight", TD_Q8_0, 2, (int64_t[]){64, 2}, 136, 2);
    add_pattern_tensor(w, "blk.0.ffn_up.weight", TD_Q4_K, 3, (int64_t[]){256, 2, 1}, 288, 3);
    return w;
}

static gguf_file *open_writer(gguf_writer *w, uint8_t **image)
{
    uint64_t size;
    assert_int_equal(gguf_writer_write_mem(w, image, &size), TD_OK);
    gguf_file *g = NULL;
    td_err e = gguf_open_memory(&g, *image, size);
    if (e)
        fail_msg("gguf_open_memory: %s", err_msg());
    return g;
}

/* --- round trips ------------------------------------------------------------------------ */

static void test_roundtrip_keeps_every_scalar_type(void **state)
{
    (void)state;
    gguf_writer *w = sample_writer();
    uint8_t *image;
    gguf_file *g = open_writer(w, &image);
    assert_int_equal(g->version, 3);
    assert_int_equal(g->n_kv, 28);
    assert_int_equal(g->alignment, 32);

    const gguf_value *v = gguf_get(g, "test.u8");
    assert_int_equal(v->type, GGUF_TYPE_UINT8);
    assert_int_equal(v->u64, 200);
    v = gguf_get(g, "test.i8");
    assert_int_equal(v->type, GGUF_TYPE_INT8);
    assert_int_equal(v->i64, -100);
    v = gguf_get(g, "test.u16");
    assert_int_equal(v->type, GGUF_TYPE_UINT16);
    assert_int_equal(v->u64, 60000);
    v = gguf_get(g, "test.i16");
    assert_int_equal(v->type, GGUF_TYPE_INT16);
    assert_int_equal(v->i64, -30000);
    v = gguf_get(g, "test.u32");
    assert_int_equal(v->type, GGUF_TYPE_UINT32);
    assert_int_equal(v->u64, 4000000000u);
    v = gguf_get(g, "test.i32");
    assert_int_equal(v->type, GGUF_TYPE_INT32);
    assert_int_equal(v->i64, -2000000000);
    v = gguf_get(g, "test.f32");
    assert_int_equal(v->type, GGUF_TYPE_FLOAT32);
    assert_true(v->f64 == 3.25);
    v = gguf_get(g, "test.bool");
    assert_int_equal(v->type, GGUF_TYPE_BOOL);
    assert_true(v->b);
    v = gguf_get(g, "test.u64");
    assert_int_equal(v->type, GGUF_TYPE_UINT64);
    assert_true(v->u64 == 1099511627777ull);
    v = gguf_get(g, "test.i64");
    assert_int_equal(v->type, GGUF_TYPE_INT64);
    assert_true(v->i64 == -9000000000000000000ll);
    v = gguf_get(g, "test.f64");
    assert_int_equal(v->type, GGUF_TYPE_FLOAT64);
    assert_true(v->f64 == -2.718281828459045);

    gguf_str s;
    assert_int_equal(gguf_get_str(g, "test.str", &s), TD_OK);
    assert_int_equal(s.len, 14);
    assert_memory_equal(s.ptr, "h\xc3\xa9llo\n\"world\"", 14);
    assert_true(gguf_str_eq(s, "h\xc3\xa9llo\n\"world\""));
    assert_false(gguf_str_eq(s, "h\xc3\xa9llo"));
    assert_int_equal(gguf_get_str(g, "general.architecture", &s), TD_OK);
    assert_true(gguf_str_eq(s, "tandem-test"));
    /* Keys keep the order they were first set in. */
    assert_true(gguf_str_eq(g->kv[0].key, "general.architecture"));
    assert_true(gguf_str_eq(g->kv[1].key, "test.u8"));
    assert_true(gguf_str_eq(g->kv[27].key, "test.arr_nested3"));
    gguf_close(g);
    free(image);
    gguf_writer_free(w);
}

static void test_roundtrip_keeps_every_array_type(void **state)
{
    (void)state;
    gguf_writer *w = sample_writer();
    uint8_t *image;
    gguf_file *g = open_writer(w, &image);
    const gguf_value *a;
    int64_t i;
    double d;

    static const struct {
        const char *key;
        gguf_type elem;
        uint64_t n;
        int64_t first, last;
    } ints[] = {
        {"test.arr_u8", GGUF_TYPE_UINT8, 3, 0, 255},
        {"test.arr_i8", GGUF_TYPE_INT8, 3, -128, 127},
        {"test.arr_u16", GGUF_TYPE_UINT16, 2, 0, 65535},
        {"test.arr_i16", GGUF_TYPE_INT16, 2, -32768, 32767},
        {"test.arr_u32", GGUF_TYPE_UINT32, 3, 0, 4294967295ll},
        {"test.arr_i32", GGUF_TYPE_INT32, 3, -2147483648ll, 2147483647},
        {"test.arr_bool", GGUF_TYPE_BOOL, 3, 1, 1},
        {"test.arr_i64", GGUF_TYPE_INT64, 2, INT64_MIN, INT64_MAX},
    };
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        assert_int_equal(gguf_get_arr(g, ints[k].key, &a), TD_OK);
        assert_int_equal(a->arr.elem, ints[k].elem);
        assert_int_equal(a->arr.n, ints[k].n);
        assert_null(a->arr.items);
        assert_int_equal(gguf_arr_i64(a, 0, &i), TD_OK);
        assert_true(i == ints[k].first);
        assert_int_equal(gguf_arr_i64(a, ints[k].n - 1, &i), TD_OK);
        assert_true(i == ints[k].last);
        assert_int_equal(gguf_arr_i64(a, ints[k].n, &i), TD_ERANGE);
    }
    assert_int_equal(gguf_get_arr(g, "test.arr_bool", &a), TD_OK);
    assert_int_equal(gguf_arr_i64(a, 1, &i), TD_OK);
    assert_int_equal(i, 0);

    assert_int_equal(gguf_get_arr(g, "test.arr_u64", &a), TD_OK);
    assert_int_equal(gguf_arr_i64(a, 0, &i), TD_OK);
    assert_int_equal(i, 0);
    assert_int_equal(gguf_arr_i64(a, 1, &i), TD_EFORMAT); /* 2^64-1 does not fit */
    assert_non_null(strstr(err_msg(), "does not fit"));
    assert_int_equal(gguf_arr_f64(a, 1, &d), TD_OK);
    assert_true(d == 18446744073709551615.0);

    assert_int_equal(gguf_get_arr(g, "test.arr_f32", &a), TD_OK);
    assert_int_equal(a->arr.elem, GGUF_TYPE_FLOAT32);
    assert_int_equal(gguf_arr_f64(a, 1, &d), TD_OK);
    assert_true(d == -1.25);
    assert_int_equal(gguf_arr_f64(a, 2, &d), TD_OK);
    assert_true(d == (double)3.0e38f);
    assert_int_equal(gguf_arr_i64(a, 0, &i), TD_EFORMAT);
    assert_int_equal(gguf_get_arr(g, "test.arr_f64", &a), TD_OK);
    assert_int_equal(gguf_arr_f64(a, 0, &d), TD_OK);
    assert_true(d == 0.1);
    assert_int_equal(gguf_arr_f64(a, 1, &d), TD_OK);
    assert_true(d == -1e300);

    gguf_str s;
    assert_int_equal(gguf_get_arr(g, "test.arr_str", &a), TD_OK);
    assert_int_equal(a->arr.elem, GGUF_TYPE_STRING);
    assert_int_equal(a->arr.n, 3);
    assert_int_equal(gguf_arr_str(a, 0, &s), TD_OK);
    assert_true(gguf_str_eq(s, "a"));
    assert_int_equal(gguf_arr_str(a, 1, &s), TD_OK);
    assert_int_equal(s.len, 0);
    assert_int_equal(gguf_arr_str(a, 2, &s), TD_OK);
    assert_true(gguf_str_eq(s, "\xc3\xbc"));
    assert_int_equal(gguf_arr_str(a, 3, &s), TD_ERANGE);
    assert_int_equal(gguf_arr_i64(a, 0, &i), TD_EFORMAT);

    assert_int_equal(gguf_get_arr(g, "test.arr_empty", &a), TD_OK);
    assert_int_equal(a->arr.elem, GGUF_TYPE_UINT32);
    assert_int_equal(a->arr.n, 0);
    assert_int_equal(gguf_arr_i64(a, 0, &i), TD_ERANGE);
    assert_int_equal(gguf_get_arr(g, "test.u8", &a), TD_EFORMAT);
    gguf_close(g);
    free(image);
    gguf_writer_free(w);
}

static void test_roundtrip_keeps_nested_arrays(void **state)
{
    (void)state;
    gguf_writer *w = sample_writer();
    uint8_t *image;
    gguf_file *g = open_writer(w, &image);
    const gguf_value *a;
    int64_t i;
    gguf_str s;

    assert_int_equal(gguf_get_arr(g, "test.arr_nested", &a), TD_OK);
    assert_int_equal(a->arr.elem, GGUF_TYPE_ARRAY);
    assert_int_equal(a->arr.n, 2);
    const gguf_value *a0 = &a->arr.items[0], *a1 = &a->arr.items[1];
    assert_int_equal(a0->arr.elem, GGUF_TYPE_INT32);
    assert_int_equal(a0->arr.n, 3);
    assert_int_equal(gguf_arr_i64(a0, 2, &i), TD_OK);
    assert_int_equal(i, 3);
    assert_int_equal(a1->arr.n, 1);
    assert_int_equal(gguf_arr_i64(a1, 0, &i), TD_OK);
    assert_int_equal(i, 4);

    assert_int_equal(gguf_get_arr(g, "test.arr_nested3", &a), TD_OK);
    assert_int_equal(a->arr.n, 2);
    const gguf_value *l2a = &a->arr.items[0], *l2b = &a->arr.items[1];
    assert_int_equal(l2a->arr.elem, GGUF_TYPE_ARRAY);
    assert_int_equal(l2a->arr.n, 1);
    assert_int_equal(l2a->arr.items[0].arr.elem, GGUF_TYPE_STRING);
    assert_int_equal(gguf_arr_str(&l2a->arr.items[0], 0, &s), TD_OK);
    assert_true(gguf_str_eq(s, "x"));
    assert_int_equal(l2b->arr.n, 2);
    assert_int_equal(l2b->arr.items[0].arr.n, 0);
    assert_int_equal(gguf_arr_str(&l2b->arr.items[1], 1, &s), TD_OK);
    assert_true(gguf_str_eq(s, "z"));
    gguf_close(g);
    free(image);
    gguf_writer_free(w);
}

/* Bytes per block from ggml's type traits (gguf-py GGML_QUANT_SIZES agrees except Q8_1,
 * whose 36-byte block gguf-py still lists as 40). */
static const struct {
    td_dtype type;
    uint32_t block, bytes;
} ggml_sizes[] = {
    {TD_F32, 1, 4},          {TD_F16, 1, 2},          {TD_Q4_0, 32, 18},      {TD_Q4_1, 32, 20},
    {TD_Q5_0, 32, 22},       {TD_Q5_1, 32, 24},       {TD_Q8_0, 32, 34},      {TD_Q8_1, 32, 36},
    {TD_Q2_K, 256, 84},      {TD_Q3_K, 256, 110},     {TD_Q4_K, 256, 144},    {TD_Q5_K, 256, 176},
    {TD_Q6_K, 256, 210},     {TD_Q8_K, 256, 292},     {TD_IQ2_XXS, 256, 66},  {TD_IQ2_XS, 256, 74},
    {TD_IQ3_XXS, 256, 98},   {TD_IQ1_S, 256, 50},     {TD_IQ4_NL, 32, 18},    {TD_IQ3_S, 256, 110},
    {TD_IQ2_S, 256, 82},     {TD_IQ4_XS, 256, 136},   {TD_I8, 1, 1},          {TD_I16, 1, 2},
    {TD_I32, 1, 4},          {TD_I64, 1, 8},          {TD_F64, 1, 8},         {TD_IQ1_M, 256, 56},
    {TD_BF16, 1, 2},         {TD_TQ1_0, 256, 54},     {TD_TQ2_0, 256, 66},    {TD_MXFP4, 32, 17},
};
#define N_SIZES (sizeof ggml_sizes / sizeof ggml_sizes[0])

static void test_roundtrip_keeps_every_tensor_type_and_size(void **state)
{
    (void)state;
    gguf_writer *w = gguf_writer_new();
    char name[N_SIZES][32];
    uint64_t sizes[N_SIZES];
    for (size_t k = 0; k < N_SIZES; k++) {
        snprintf(name[k], sizeof name[k], "t%zu.%s", k, dtype_name(ggml_sizes[k].type));
        /* Three rows of two blocks each, and a second dimension of 3. */
        sizes[k] = 2ull * 3 * ggml_sizes[k].bytes;
        add_pattern_tensor(w, name[k], ggml_sizes[k].type, 2,
                           (int64_t[]){2 * ggml_sizes[k].block, 3}, sizes[k], (int)k);
    }
    uint8_t *image;
    gguf_file *g = open_writer(w, &image);
    assert_int_equal(g->n_tensors, N_SIZES);
    assert_int_equal(g->data_offset % 32, 0);
    uint64_t offset = 0;
    for (size_t k = 0; k < N_SIZES; k++) {
        const gguf_tensor *t = gguf_find_tensor(g, name[k]);
        assert_non_null(t);
        assert_ptr_equal(t, &g->tensors[k]);
        assert_int_equal(t->type, ggml_sizes[k].type);
        assert_int_equal(t->n_dims, 2);
        assert_int_equal(t->ne[0], 2 * ggml_sizes[k].block);
        assert_int_equal(t->ne[1], 3);
        assert_int_equal(t->ne[2], 1);
        assert_int_equal(t->ne[3], 1);
        assert_int_equal(t->size, sizes[k]);
        assert_int_equal(t->offset, offset);
        assert_ptr_equal(t->data, image + g->data_offset + offset);
        uint8_t *want = pattern(sizes[k], (int)k);
        assert_memory_equal(t->data, want, sizes[k]);
        free(want);
        offset += (sizes[k] + 31) / 32 * 32;
    }
    assert_int_equal(g->data_offset + offset, g->size);
    assert_null(gguf_find_tensor(g, "t0"));
    assert_null(gguf_find_tensor(g, ""));
    gguf_close(g);
    free(image);
    gguf_writer_free(w);
}

static void test_custom_alignment_places_tensors_on_its_multiples(void **state)
{
    (void)state;
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_u32(w, "general.alignment", 256);
    add_pattern_tensor(w, "a", TD_F32, 1, (int64_t[]){3}, 12, 0);
    add_pattern_tensor(w, "b", TD_I8, 1, (int64_t[]){5}, 5, 1);
    uint8_t *image;
    gguf_file *g = open_writer(w, &image);
    assert_int_equal(g->alignment, 256);
    assert_int_equal(g->data_offset, 256);
    assert_int_equal(gguf_find_tensor(g, "a")->offset, 0);
    assert_int_equal(gguf_find_tensor(g, "b")->offset, 256);
    assert_int_equal(g->size, 768);
    gguf_close(g);
    free(image);
    gguf_writer_free(w);
}

/* --- hand-built images ------------------------------------------------------------------ */

typedef struct bytes {
    uint8_t b[512];
    size_t n;
} bytes;

static void put(bytes *x, const void *p, size_t n)
{
    assert_true(x->n + n <= sizeof x->b);
    memcpy(x->b + x->n, p, n);
    x->n += n;
}
static void put_u32(bytes *x, uint32_t v) { put(x, &v, 4); }
static void put_u64(bytes *x, uint64_t v) { put(x, &v, 8); }
static void put_str(bytes *x, const char *s)
{
    put_u64(x, strlen(s));
    put(x, s, strlen(s));
}

/* Version v, two keys (u32 "a" = 7; string "name" = "xy"), one F32 tensor "t" of 4 floats. */
static void build_small(bytes *x, uint32_t version)
{
    put(x, "GGUF", 4);
    put_u32(x, version);
    put_u64(x, 1); /* n_tensors */
    put_u64(x, 2); /* n_kv */
    put_str(x, "a");
    put_u32(x, GGUF_TYPE_UINT32);
    put_u32(x, 7);
    put_str(x, "name");
    put_u32(x, GGUF_TYPE_STRING);
    put_str(x, "xy");
    put_str(x, "t");
    put_u32(x, 1);
    put_u64(x, 4);
    put_u32(x, TD_F32);
    put_u64(x, 0);
    /* 24 + 17 + 26 + 33 = 100 bytes so far: pad to 128. */
    while (x->n % 32)
        put(x, "\0", 1);
    const float data[4] = {1.0f, -2.0f, 0.5f, 8.0f};
    put(x, data, sizeof data);
}

static void test_hand_built_v3_image_gives_exact_values(void **state)
{
    (void)state;
    bytes x = {0};
    build_small(&x, 3);
    assert_int_equal(x.n, 144);
    gguf_file *g = NULL;
    assert_int_equal(gguf_open_memory(&g, x.b, x.n), TD_OK);
    assert_int_equal(g->version, 3);
    assert_int_equal(g->n_kv, 2);
    assert_int_equal(g->n_tensors, 1);
    assert_int_equal(g->data_offset, 128);
    assert_int_equal(g->size, 144);
    uint32_t a;
    assert_int_equal(gguf_get_u32(g, "a", &a), TD_OK);
    assert_int_equal(a, 7);
    gguf_str s;
    assert_int_equal(gguf_get_str(g, "name", &s), TD_OK);
    assert_int_equal(s.len, 2);
    assert_ptr_equal(s.ptr, (const char *)x.b + 24 + 17 + 8 + 4 + 4 + 8); /* into the image */
    const gguf_tensor *t = gguf_find_tensor(g, "t");
    assert_non_null(t);
    assert_string_equal(t->name, "t");
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->ne[0], 4);
    assert_int_equal(t->type, TD_F32);
    assert_int_equal(t->size, 16);
    assert_ptr_equal(t->data, x.b + 128);
    float f[4];
    memcpy(f, t->data, sizeof f);
    assert_true(f[0] == 1.0f && f[1] == -2.0f && f[2] == 0.5f && f[3] == 8.0f);
    gguf_close(g);
}

static void test_hand_built_v2_image_parses_like_v3(void **state)
{
    (void)state;
    bytes x = {0};
    build_small(&x, 2);
    gguf_file *g = NULL;
    assert_int_equal(gguf_open_memory(&g, x.b, x.n), TD_OK);
    assert_int_equal(g->version, 2);
    assert_int_equal(g->data_offset, 128);
    assert_int_equal(gguf_find_tensor(g, "t")->size, 16);
    gguf_close(g);
}

static void test_file_without_tensors_may_end_before_the_data_section(void **state)
{
    (void)state;
    bytes x = {0};
    put(&x, "GGUF", 4);
    put_u32(&x, 3);
    put_u64(&x, 0);
    put_u64(&x, 1);
    put_str(&x, "k");
    put_u32(&x, GGUF_TYPE_BOOL);
    put(&x, "\1", 1);
    gguf_file *g = NULL;
    assert_int_equal(gguf_open_memory(&g, x.b, x.n), TD_OK);
    assert_int_equal(x.n, 38);
    assert_int_equal(g->data_offset, 64);
    bool b = false;
    assert_int_equal(gguf_get_bool(g, "k", &b), TD_OK);
    assert_true(b);
    gguf_close(g);
}

/* --- typed getters ---------------------------------------------------------------------- */

static void test_getters_convert_only_values_that_fit(void **state)
{
    (void)state;
    gguf_writer *w = sample_writer();
    uint8_t *image;
    gguf_file *g = open_writer(w, &image);
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f;
    bool b;
    gguf_str s;
    const gguf_value *a;

    assert_int_equal(gguf_get_u32(g, "test.u8", &u32), TD_OK);
    assert_int_equal(u32, 200);
    assert_int_equal(gguf_get_u32(g, "test.u32", &u32), TD_OK);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(gguf_get_u32(g, "test.u64", &u32), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "test.u64"));
    assert_int_equal(gguf_get_u32(g, "test.i8", &u32), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "-100"));
    assert_int_equal(gguf_get_u64(g, "test.u64", &u64), TD_OK);
    assert_true(u64 == 1099511627777ull);
    assert_int_equal(gguf_get_i64(g, "test.i16", &i64), TD_OK);
    assert_int_equal(i64, -30000);
    assert_int_equal(gguf_get_i64(g, "test.u32", &i64), TD_OK);
    assert_int_equal(i64, 4000000000ll);
    assert_int_equal(gguf_get_i64(g, "test.f32", &i64), TD_EFORMAT);
    assert_int_equal(gguf_get_f32(g, "test.f32", &f), TD_OK);
    assert_true(f == 3.25f);
    assert_int_equal(gguf_get_f32(g, "test.i32", &f), TD_OK);
    assert_true(f == -2000000000.0f);
    assert_int_equal(gguf_get_f32(g, "test.f64", &f), TD_OK);
    assert_true(f == (float)-2.718281828459045);
    assert_int_equal(gguf_get_bool(g, "test.bool", &b), TD_OK);
    assert_true(b);
    assert_int_equal(gguf_get_bool(g, "test.u8", &b), TD_EFORMAT);
    assert_int_equal(gguf_get_u32(g, "test.bool", &u32), TD_EFORMAT);
    assert_int_equal(gguf_get_str(g, "test.u8", &s), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "expected STRING"));
    assert_int_equal(gguf_get_u32(g, "test.str", &u32), TD_EFORMAT);

    assert_int_equal(gguf_get_u32(g, "no.such.key", &u32), TD_ENOENT);
    assert_non_null(strstr(err_msg(), "no.such.key"));
    assert_int_equal(gguf_get_str(g, "no.such.key", &s), TD_ENOENT);
    assert_int_equal(gguf_get_arr(g, "no.such.key", &a), TD_ENOENT);
    assert_null(gguf_get(g, "no.such.key"));
    assert_null(gguf_get(g, "test"));
    gguf_close(g);
    free(image);
    gguf_writer_free(w);
}

static void test_type_names_and_sizes(void **state)
{
    (void)state;
    assert_string_equal(gguf_type_name(GGUF_TYPE_UINT8), "UINT8");
    assert_string_equal(gguf_type_name(GGUF_TYPE_FLOAT64), "FLOAT64");
    assert_string_equal(gguf_type_name(GGUF_TYPE_ARRAY), "ARRAY");
    assert_string_equal(gguf_type_name((gguf_type)13), "?");
    assert_int_equal(gguf_type_size(GGUF_TYPE_INT16), 2);
    assert_int_equal(gguf_type_size(GGUF_TYPE_FLOAT32), 4);
    assert_int_equal(gguf_type_size(GGUF_TYPE_INT64), 8);
    assert_int_equal(gguf_type_size(GGUF_TYPE_BOOL), 1);
    assert_int_equal(gguf_type_size(GGUF_TYPE_STRING), 0);
}

/* --- the writer's own checks ------------------------------------------------------------ */

static void test_writer_refuses_bad_tensors_and_values(void **state)
{
    (void)state;
    gguf_writer *w = gguf_writer_new();
    float f[4] = {0};
    assert_int_equal(gguf_writer_add_tensor(w, "x", TD_F32, 1, (int64_t[]){4}, f, 16), TD_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "x", TD_F32, 1, (int64_t[]){4}, f, 16), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "duplicate"));
    assert_int_equal(gguf_writer_add_tensor(w, "y", TD_F32, 1, (int64_t[]){4}, f, 12), TD_EINVAL);
    assert_int_equal(gguf_writer_add_tensor(w, "y", TD_Q8_0, 1, (int64_t[]){4}, f, 16), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "block size 32"));
    assert_int_equal(gguf_writer_add_tensor(w, "y", TD_F32, 0, (int64_t[]){4}, f, 16), TD_EINVAL);
    assert_int_equal(gguf_writer_add_tensor(w, "y", TD_F32, 2, (int64_t[]){4, 0}, f, 0), TD_EINVAL);
    assert_int_equal(gguf_writer_add_tensor(w, "y", (td_dtype)4, 1, (int64_t[]){4}, f, 16), TD_EINVAL);

    /* An alignment that is not a power of two is reported when writing. */
    gguf_writer_set_u32(w, "general.alignment", 48);
    uint8_t *image;
    uint64_t size;
    assert_int_equal(gguf_writer_write_mem(w, &image, &size), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "power of two"));
    gguf_writer_set_u32(w, "general.alignment", GGUF_MAX_ALIGNMENT * 2);
    assert_int_equal(gguf_writer_write_mem(w, &image, &size), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "at most 1048576"));
    gguf_writer_set_u32(w, "general.alignment", 64); /* replaces the value */
    assert_int_equal(gguf_writer_write_mem(w, &image, &size), TD_OK);
    /* header 24, key 33, tensor info 33: data at 128, 16 bytes padded to 64 */
    assert_int_equal(size, 192);
    free(image);

    /* A value out of its type's range sticks as the writer's error. */
    gguf_value v = {.type = GGUF_TYPE_UINT8, .u64 = 256};
    gguf_writer_set_value(w, "too.big", &v);
    assert_int_equal(gguf_writer_write_mem(w, &image, &size), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "too.big"));
    gguf_writer_free(w);
}

static void test_writer_refuses_arrays_nested_too_deep(void **state)
{
    (void)state;
    gguf_value levels[GGUF_MAX_NESTING + 1];
    levels[0] = (gguf_value){.type = GGUF_TYPE_ARRAY, .arr = {.elem = GGUF_TYPE_UINT8, .n = 0}};
    for (int d = 1; d <= GGUF_MAX_NESTING; d++)
        levels[d] = (gguf_value){.type = GGUF_TYPE_ARRAY, .arr = {.elem = GGUF_TYPE_ARRAY, .n = 1, .items = &levels[d - 1]}};
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_value(w, "deepest.allowed", &levels[GGUF_MAX_NESTING - 1]);
    uint8_t *image;
    gguf_file *g = open_writer(w, &image);
    const gguf_value *a = gguf_get(g, "deepest.allowed");
    for (int d = 1; d < GGUF_MAX_NESTING; d++) {
        assert_int_equal(a->arr.n, 1);
        a = &a->arr.items[0];
    }
    assert_int_equal(a->arr.elem, GGUF_TYPE_UINT8);
    gguf_close(g);
    free(image);
    gguf_writer_set_value(w, "too.deep", &levels[GGUF_MAX_NESTING]);
    uint64_t size;
    assert_int_equal(gguf_writer_write_mem(w, &image, &size), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "nested too deep"));
    gguf_writer_free(w);
}

/* --- files on disk ---------------------------------------------------------------------- */

static void test_open_file_maps_the_same_content(void **state)
{
    (void)state;
    char path[] = "/tmp/tandem-test-gguf-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    gguf_writer *w = sample_writer();
    assert_int_equal(gguf_writer_write(w, path), TD_OK);
    gguf_file *g = NULL;
    assert_int_equal(gguf_open(&g, path), TD_OK);
    assert_non_null(g->map);
    assert_int_equal(g->n_tensors, 4);
    const gguf_tensor *t = gguf_find_tensor(g, "blk.0.ffn_up.weight");
    assert_int_equal(t->type, TD_Q4_K);
    assert_int_equal(t->n_dims, 3);
    assert_int_equal(((uintptr_t)t->data) % 32, 0);
    uint8_t *want = pattern(288, 3);
    assert_memory_equal(t->data, want, 288);
    free(want);
    gguf_close(g);

    /* Cut it short: the error names the file and the problem. */
    assert_int_equal(truncate(path, 10), 0);
    g = (gguf_file *)1;
    assert_int_equal(gguf_open(&g, path), TD_EFORMAT);
    assert_null(g);
    assert_non_null(strstr(err_msg(), path));
    assert_non_null(strstr(err_msg(), "truncated"));
    assert_int_equal(truncate(path, 0), 0);
    assert_int_equal(gguf_open(&g, path), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "magic"));
    unlink(path);
    assert_int_equal(gguf_open(&g, path), TD_ENOENT);
    assert_non_null(strstr(err_msg(), path));
    assert_int_equal(gguf_open(&g, "/tmp"), TD_EINVAL);
    assert_int_equal(gguf_writer_write(w, "/nonexistent-dir/x.gguf"), TD_ENOENT);
    gguf_writer_free(w);
}

static void test_large_vocab_array_reads_every_string_in_place(void **state)
{
    (void)state;
    enum { N = 248320 };
    char (*text)[16] = malloc((size_t)N * 16);
    const char **v = malloc((size_t)N * sizeof *v);
    for (int i = 0; i < N; i++) {
        snprintf(text[i], 16, "tok%d", i);
        v[i] = text[i];
    }
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", v, N);
    uint8_t *image;
    gguf_file *g = open_writer(w, &image);
    const gguf_value *a;
    assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.tokens", &a), TD_OK);
    assert_int_equal(a->arr.n, N);
    gguf_str s;
    assert_int_equal(gguf_arr_str(a, 0, &s), TD_OK);
    assert_true(gguf_str_eq(s, "tok0"));
    assert_int_equal(gguf_arr_str(a, N - 1, &s), TD_OK);
    assert_true(gguf_str_eq(s, "tok248319"));
    /* Every string reads back and points into the image, right after its 8-byte length. */
    const char *at = a->arr.items[0].str.ptr;
    assert_true((const uint8_t *)at > image && (const uint8_t *)at < image + g->size);
    char want[16];
    for (int i = 0; i < N; i++) {
        s = a->arr.items[i].str;
        snprintf(want, sizeof want, "tok%d", i);
        if (!gguf_str_eq(s, want) || s.ptr != at)
            fail_msg("element %d: '%.*s' at %p, expected '%s' at %p", i, (int)s.len, s.ptr,
                     (const void *)s.ptr, want, (const void *)at);
        at += s.len + 8;
    }
    gguf_close(g);
    free(image);
    gguf_writer_free(w);
    free(v);
    free(text);
}

static int write_sample(const char *path)
{
    gguf_writer *w = sample_writer();
    td_err e = gguf_writer_write(w, path);
    gguf_writer_free(w);
    if (e) {
        fprintf(stderr, "test_gguf: %s\n", err_msg());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--write-sample"))
        return write_sample(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_keeps_every_scalar_type),
        cmocka_unit_test(test_roundtrip_keeps_every_array_type),
        cmocka_unit_test(test_roundtrip_keeps_nested_arrays),
        cmocka_unit_test(test_roundtrip_keeps_every_tensor_type_and_size),
        cmocka_unit_test(test_custom_alignment_places_tensors_on_its_multiples),
        cmocka_unit_test(test_hand_built_v3_image_gives_exact_values),
        cmocka_unit_test(test_hand_built_v2_image_parses_like_v3),
        cmocka_unit_test(test_file_without_tensors_may_end_before_the_data_section),
        cmocka_unit_test(test_getters_convert_only_values_that_fit),
        cmocka_unit_test(test_type_names_and_sizes),
        cmocka_unit_test(test_writer_refuses_bad_tensors_and_values),
        cmocka_unit_test(test_writer_refuses_arrays_nested_too_deep),
        cmocka_unit_test(test_open_file_maps_the_same_content),
        cmocka_unit_test(test_large_vocab_array_reads_every_string_in_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
