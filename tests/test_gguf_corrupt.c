/* GGUF reader on broken and hostile images: every kind of corruption gives its error code and
 * a message naming the problem and where, a file cut at any byte is an error, and nothing is
 * read outside the image (each image lives in a buffer of exactly its size, so the sanitizer
 * build catches any over-read). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"

typedef struct bytes {
    uint8_t b[1024];
    size_t n;
} bytes;

static void put(bytes *x, const void *p, size_t n)
{
    assert_true(x->n + n <= sizeof x->b);
    memcpy(x->b + x->n, p, n);
    x->n += n;
}
static void put_u8(bytes *x, uint8_t v) { put(x, &v, 1); }
static void put_u32(bytes *x, uint32_t v) { put(x, &v, 4); }
static void put_u64(bytes *x, uint64_t v) { put(x, &v, 8); }
static void put_str(bytes *x, const char *s)
{
    put_u64(x, strlen(s));
    put(x, s, strlen(s));
}
static void put_header(bytes *x, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    put(x, "GGUF", 4);
    put_u32(x, version);
    put_u64(x, n_tensors);
    put_u64(x, n_kv);
}
static void put_kv_u32(bytes *x, const char *key, uint32_t v)
{
    put_str(x, key);
    put_u32(x, GGUF_TYPE_UINT32);
    put_u32(x, v);
}
/* A tensor info with n_dims dims ne[] of type id type at data offset off. */
static void put_ti(bytes *x, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off)
{
    put_str(x, name);
    put_u32(x, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        put_u64(x, ne[d]);
    put_u32(x, type);
    put_u64(x, off);
}
/* Pads to 32 and appends n data bytes. */
static void put_data(bytes *x, size_t n)
{
    while (x->n % 32)
        put_u8(x, 0);
    for (size_t i = 0; i < n; i++)
        put_u8(x, (uint8_t)i);
}

/* Opens a copy of x in a buffer of exactly its size and expects code and a message holding
 * each of the words (NULL ends the list). */
static void expect_refused(const bytes *x, td_err code, const char *w1, const char *w2)
{
    uint8_t *copy = malloc(x->n ? x->n : 1);
    assert_non_null(copy);
    memcpy(copy, x->b, x->n);
    gguf_file *g = (gguf_file *)copy; /* must be reset to NULL */
    td_err e = gguf_open_memory(&g, copy, x->n);
    if (e != code)
        fail_msg("expected %s, got %s: %s", err_name(code), err_name(e), err_msg());
    assert_null(g);
    if (w1 && !strstr(err_msg(), w1))
        fail_msg("message '%s' lacks '%s'", err_msg(), w1);
    if (w2 && !strstr(err_msg(), w2))
        fail_msg("message '%s' lacks '%s'", err_msg(), w2);
    free(copy);
}

static void expect_ok(const bytes *x)
{
    gguf_file *g = NULL;
    if (gguf_open_memory(&g, x->b, x->n))
        fail_msg("unexpected error: %s", err_msg());
    gguf_close(g);
}

/* --- header ----------------------------------------------------------------------------- */

static void test_bad_magic_is_refused(void **state)
{
    (void)state;
    bytes x = {0};
    put(&x, "GGML", 4);
    put_u32(&x, 3);
    put_u64(&x, 0);
    put_u64(&x, 0);
    expect_refused(&x, TD_EFORMAT, "not a GGUF file", NULL);
}

static void test_version_1_is_refused(void **state)
{
    (void)state;
    bytes x = {0};
    put_header(&x, 1, 0, 0);
    expect_refused(&x, TD_ENOTSUP, "version 1", "not supported");
}

static void test_version_4_is_refused(void **state)
{
    (void)state;
    bytes x = {0};
    put_header(&x, 4, 0, 0);
    expect_refused(&x, TD_ENOTSUP, "unsupported GGUF version 4", NULL);
}

static void test_big_endian_file_is_refused(void **state)
{
    (void)state;
    bytes x = {0};
    put(&x, "GGUF", 4);
    put(&x, "\0\0\0\3", 4);
    put(&x, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 16);
    expect_refused(&x, TD_ENOTSUP, "big-endian", NULL);
}

static void test_huge_n_kv_is_refused_before_allocating(void **state)
{
    (void)state;
    bytes x = {0};
    put_header(&x, 3, 0, 1ull << 63);
    put_kv_u32(&x, "k", 1);
    expect_refused(&x, TD_EFORMAT, "n_kv = 9223372036854775808", "cannot fit");
    /* One more pair than the bytes could hold, even at 13 bytes each. */
    bytes y = {0};
    put_header(&y, 3, 0, 2);
    put_kv_u32(&y, "k", 1); /* 17 bytes < 2 * 13 */
    expect_refused(&y, TD_EFORMAT, "n_kv = 2", "cannot fit");
}

static void test_huge_n_tensors_is_refused_before_allocating(void **state)
{
    (void)state;
    bytes x = {0};
    put_header(&x, 3, UINT64_MAX, 0);
    expect_refused(&x, TD_EFORMAT, "n_tensors = 18446744073709551615", "cannot fit");
    /* The header's estimate passes (a key of 13 bytes) but the real key takes 121. */
    bytes y = {0};
    put_header(&y, 3, 3, 1);
    put_str(&y, "k");
    put_u32(&y, GGUF_TYPE_STRING);
    char text[101];
    memset(text, 'x', 100);
    text[100] = '\0';
    put_str(&y, text);
    put_ti(&y, "t", 1, (uint64_t[]){1}, 0, 0);
    put_ti(&y, "u", 1, (uint64_t[]){1}, 0, 32);
    expect_refused(&y, TD_EFORMAT, "n_tensors = 3", "after the metadata");
}

/* --- metadata --------------------------------------------------------------------------- */

static void test_key_length_past_the_end_is_refused(void **state)
{
    (void)state;
    bytes x = {0};
    put_header(&x, 3, 0, 1);
    put_u64(&x, 1ull << 62);
    put(&x, "k\4\0\0\0\1\0\0\0", 9);
    expect_refused(&x, TD_EFORMAT, "string length 4611686018427387904 at byte offset 24", "past the end");
}

static void test_value_string_length_past_the_end_is_refused(void **state)
{
    (void)state;
    bytes x = {0};
    put_header(&x, 3, 0, 1);
    put_str(&x, "general.name");
    put_u32(&x, GGUF_TYPE_STRING);
    put_u64(&x, 6);
    put(&x, "abcde", 5);
    expect_refused(&x, TD_EFORMAT, "key 'general.name'", "string length 6");
}

static void test_unknown_value_type_is_refused(void **state)
{
    (void)state;
    bytes x = {0};
    put_header(&x, 3, 0, 1);
    put_str(&x, "k");
    put_u32(&x, 13);
    put_u32(&x, 0);
    expect_refused(&x, TD_EFORMAT, "key 'k'", "unknown value type 13 at byte offset 33");
}

static void test_unknown_array_element_type_is_refused(void **state)
{
    (void)state;
    bytes x = {0};
    put_header(&x, 3, 0, 1);
    put_str(&x, "arr");
    put_u32(&x, GGUF_TYPE_ARRAY);
    put_u32(&x, 77);
    put_u64(&x, 0);
    expect_refused(&x, TD_EFORMAT, "key 'arr'", "unknown element type 77");
}

static void test_array_longer_than_the_file_is_refused(void **state)
{
    (void)state;
    static const gguf_type elems[] = {GGUF_TYPE_UINT8, GGUF_TYPE_UINT64, GGUF_TYPE_STRING, GGUF_TYPE_ARRAY};
    for (size_t k = 0; k < 4; k++) {
        bytes x = {0};
        put_header(&x, 3, 0, 1);
        put_str(&x, "arr");
        put_u32(&x, GGUF_TYPE_ARRAY);
        put_u32(&x, elems[k]);
        put_u64(&x, 1ull << 61);
        put_u64(&x, 0);
        expect_refused(&x, TD_EFORMAT, "array of 2305843009213693952", "past the end");
    }
}

/* An array nested `levels` deep around an empty u8 array: the innermost counts as level 1. */
static void put_nested(bytes *x, int levels)
{
    put_header(x, 3, 0, 1);
    put_str(x, "deep");
    put_u32(x, GGUF_TYPE_ARRAY);
    for (int i = 1; i < levels; i++) {
        put_u32(x, GGUF_TYPE_ARRAY);
        put_u64(x, 1);
    }
    put_u32(x, GGUF_TYPE_UINT8);
    put_u64(x, 0);
}

static void test_arrays_nested_too_deep_are_refused(void **state)
{
    (void)state;
    bytes ok = {0};
    put_nested(&ok, GGUF_MAX_NESTING);
    expect_ok(&ok);
    bytes x = {0};
    put_nested(&x, GGUF_MAX_NESTING + 1);
    expect_refused(&x, TD_EFORMAT, "key 'deep'", "nested deeper than 8 levels");
}

static void test_bool_other_than_0_or_1_is_refused(void **state)
{
    (void)state;
    bytes x = {0};
    put_header(&x, 3, 0, 1);
    put_str(&x, "flag");
    put_u32(&x, GGUF_TYPE_BOOL);
    put_u8(&x, 2);
    expect_refused(&x, TD_EFORMAT, "key 'flag'", "neither 0 nor 1");
    bytes y = {0};
    put_header(&y, 3, 0, 1);
    put_str(&y, "flags");
    put_u32(&y, GGUF_TYPE_ARRAY);
    put_u32(&y, GGUF_TYPE_BOOL);
    put_u64(&y, 3);
    put(&y, "\1\0\377", 3);
    expect_refused(&y, TD_EFORMAT, "bool byte 255 at byte offset 55", NULL);
}

static void test_empty_and_duplicate_keys_are_refused(void **state)
{
    (void)state;
    bytes x = {0};
    put_header(&x, 3, 0, 1);
    put_kv_u32(&x, "", 1);
    expect_refused(&x, TD_EFORMAT, "empty key at byte offset 24", NULL);
    bytes y = {0};
    put_header(&y, 3, 0, 3);
    put_kv_u32(&y, "general.a", 1);
    put_kv_u32(&y, "general.b", 2);
    put_kv_u32(&y, "general.a", 3);
    expect_refused(&y, TD_EFORMAT, "duplicate key 'general.a'", "entries 0 and 2");
}

static void test_bad_alignment_is_refused(void **state)
{
    (void)state;
    /* not powers of two, and powers of two past GGUF_MAX_ALIGNMENT (a file rewritten with
     * them would be padded by up to that many bytes) */
    static const struct {
        uint32_t a;
        const char *why;
    } bad[] = {{0, "not a power of two"},
               {3, "not a power of two"},
               {48, "not a power of two"},
               {0x80000001u, "not a power of two"},
               {GGUF_MAX_ALIGNMENT * 2, "is more than 1048576"},
               {0x80000000u, "is more than 1048576"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        bytes x = {0};
        put_header(&x, 3, 0, 1);
        put_kv_u32(&x, "general.alignment", bad[k].a);
        char want[64];
        snprintf(want, sizeof want, "general.alignment = %u", bad[k].a);
        expect_refused(&x, TD_EFORMAT, want, bad[k].why);
    }
    bytes s = {0};
    put_header(&s, 3, 0, 1);
    put_str(&s, "general.alignment");
    put_u32(&s, GGUF_TYPE_STRING);
    put_str(&s, "64");
    expect_refused(&s, TD_EFORMAT, "general.alignment", "expected an unsigned integer");
    bytes big = {0};
    put_header(&big, 3, 0, 1);
    put_str(&big, "general.alignment");
    put_u32(&big, GGUF_TYPE_UINT64);
    put_u64(&big, 1ull << 33);
    expect_refused(&big, TD_EFORMAT, "general.alignment", "does not fit");
}

/* --- tensor infos ----------------------------------------------------------------------- */

static void test_misaligned_tensor_is_refused(void **state)
{
    (void)state;
    bytes x = {0};
    put_header(&x, 3, 1, 0);
    put_ti(&x, "blk.0.w", 1, (uint64_t[]){4}, 0, 16);
    put_data(&x, 64);
    expect_refused(&x, TD_EFORMAT, "tensor 'blk.0.w': offset 16", "not a multiple of the alignment 32");
}

static void test_overlapping_tensors_are_refused(void **state)
{
    (void)state;
    bytes x = {0};
    put_header(&x, 3, 3, 0);
    put_ti(&x, "c", 1, (uint64_t[]){4}, 0, 128);
    put_ti(&x, "a", 1, (uint64_t[]){16}, 0, 0);
    put_ti(&x, "b", 1, (uint64_t[]){16}, 0, 32);
    put_data(&x, 160);
    expect_refused(&x, TD_EFORMAT, "tensors 'a' and 'b' overlap", "[0, 64)");
}

static void test_tensor_past_the_end_of_the_file_is_refused(void **state)
{
    (void)state;
    bytes x = {0};
    put_header(&x, 3, 1, 0);
    put_ti(&x, "w", 2, (uint64_t[]){4, 4}, 0, 0);
    put_data(&x, 63);
    expect_refused(&x, TD_EFORMAT, "tensor 'w': 64 bytes", "past the end of the file");
    /* An offset that wraps around 2^64 when the data offset is added. */
    bytes y = {0};
    put_header(&y, 3, 1, 0);
    put_ti(&y, "w", 1, (uint64_t[]){4}, 0, UINT64_MAX - 31);
    put_data(&y, 16);
    expect_refused(&y, TD_EFORMAT, "tensor 'w'", "past the end of the file");
}

static void test_unknown_tensor_type_is_refused(void **state)
{
    (void)state;
    static const uint32_t ids[] = {4, 5, 31, 99, UINT32_MAX};
    for (size_t k = 0; k < 5; k++) {
        bytes x = {0};
        put_header(&x, 3, 1, 0);
        put_ti(&x, "emb", 1, (uint64_t[]){32}, ids[k], 0);
        put_data(&x, 128);
        char want[48];
        snprintf(want, sizeof want, "unknown tensor type id %u", ids[k]);
        expect_refused(&x, TD_ENOTSUP, "tensor 'emb'", want);
    }
}

static void test_duplicate_tensor_names_are_refused(void **state)
{
    (void)state;
    bytes x = {0};
    put_header(&x, 3, 2, 0);
    put_ti(&x, "output.weight", 1, (uint64_t[]){8}, 0, 0);
    put_ti(&x, "output.weight", 1, (uint64_t[]){8}, 0, 32);
    put_data(&x, 64);
    expect_refused(&x, TD_EFORMAT, "duplicate tensor name 'output.weight'", "tensors 0 and 1");
}

static void test_bad_dimensions_are_refused(void **state)
{
    (void)state;
    bytes a = {0};
    put_header(&a, 3, 1, 0);
    put_ti(&a, "t", 0, NULL, 0, 0);
    put_data(&a, 32);
    expect_refused(&a, TD_EFORMAT, "tensor 't'", "n_dims 0 is outside 1..4");
    bytes b = {0};
    put_header(&b, 3, 1, 0);
    put_ti(&b, "t", 5, (uint64_t[]){1, 1, 1, 1, 1}, 0, 0);
    put_data(&b, 32);
    expect_refused(&b, TD_EFORMAT, "tensor 't'", "n_dims 5 is outside 1..4");
    bytes c = {0};
    put_header(&c, 3, 1, 0);
    put_ti(&c, "t", 3, (uint64_t[]){4, 0, 2}, 0, 0);
    put_data(&c, 32);
    expect_refused(&c, TD_EFORMAT, "tensor 't'", "dimension 1 is 0");
    bytes d = {0};
    put_header(&d, 3, 1, 0);
    put_ti(&d, "t", 2, (uint64_t[]){1ull << 32, 1ull << 32}, 0, 0);
    put_data(&d, 32);
    expect_refused(&d, TD_EFORMAT, "tensor 't'", "element count overflows at dimension 1");
    bytes e = {0};
    put_header(&e, 3, 1, 0);
    put_ti(&e, "t", 1, (uint64_t[]){1ull << 63}, 0, 0);
    put_data(&e, 32);
    expect_refused(&e, TD_EFORMAT, "tensor 't'", "dimension 0 is 9223372036854775808");
    /* 2^62 F64 elements fit int64 but not a byte count. */
    bytes f = {0};
    put_header(&f, 3, 1, 0);
    put_ti(&f, "t", 1, (uint64_t[]){1ull << 62}, 28, 0);
    put_data(&f, 32);
    expect_refused(&f, TD_EFORMAT, "tensor 't'", "byte size overflows");
}

static void test_row_not_a_multiple_of_the_block_is_refused(void **state)
{
    (void)state;
    bytes x = {0};
    put_header(&x, 3, 1, 0);
    put_ti(&x, "blk.3.ffn_down.weight", 2, (uint64_t[]){128, 2}, 12, 0);
    put_data(&x, 144);
    expect_refused(&x, TD_EFORMAT, "tensor 'blk.3.ffn_down.weight'", "ne[0] = 128 is not a multiple of the Q4_K block size 256");
}

static void test_bad_tensor_names_are_refused(void **state)
{
    (void)state;
    bytes a = {0};
    put_header(&a, 3, 1, 0);
    put_ti(&a, "", 1, (uint64_t[]){1}, 0, 0);
    put_data(&a, 32);
    expect_refused(&a, TD_EFORMAT, "tensor 0 at byte offset 24", "name of 0 bytes");
    bytes b = {0};
    put_header(&b, 3, 1, 0);
    put_u64(&b, 3);
    put(&b, "a\0b", 3);
    put_u32(&b, 1);
    put_u64(&b, 1);
    put_u32(&b, 0);
    put_u64(&b, 0);
    put_data(&b, 32);
    expect_refused(&b, TD_EFORMAT, "name of 3 bytes", "NUL");
    char longname[GGUF_MAX_NAME + 2];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    bytes c = {0};
    put_header(&c, 3, 1, 0);
    put_ti(&c, longname, 1, (uint64_t[]){1}, 0, 0);
    put_data(&c, 32);
    expect_refused(&c, TD_EFORMAT, "name of 256 bytes", "longer than 255");
    /* 255 bytes is still fine. */
    longname[GGUF_MAX_NAME] = '\0';
    bytes d = {0};
    put_header(&d, 3, 1, 0);
    put_ti(&d, longname, 1, (uint64_t[]){1}, 0, 0);
    put_data(&d, 32);
    expect_ok(&d);
}

/* --- truncation ------------------------------------------------------------------------- */

static uint8_t *valid_image(uint64_t *size, uint64_t *data_end)
{
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "qwen3");
    gguf_writer_set_u32(w, "qwen3.block_count", 2);
    gguf_writer_set_f32(w, "qwen3.rope.freq_base", 1e6f);
    gguf_writer_set_bool(w, "flag", true);
    static const char *const toks[] = {"a", "bc", "", "def"};
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
    static const int32_t types[] = {1, 1, 3, 1};
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, 4);
    gguf_value leaf = {.type = GGUF_TYPE_ARRAY, .arr = {.elem = GGUF_TYPE_UINT16, .n = 2, .raw = (const uint8_t *)"\1\0\2\0"}};
    gguf_value nested = {.type = GGUF_TYPE_ARRAY, .arr = {.elem = GGUF_TYPE_ARRAY, .n = 1, .items = &leaf}};
    gguf_writer_set_value(w, "nested", &nested);
    uint8_t buf[300] = {0};
    assert_int_equal(gguf_writer_add_tensor(w, "a", TD_F32, 1, (int64_t[]){5}, buf, 20), TD_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "b", TD_Q8_0, 2, (int64_t[]){32, 2}, buf, 68), TD_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "c", TD_F16, 1, (int64_t[]){3}, buf, 6), TD_OK);
    uint8_t *image;
    assert_int_equal(gguf_writer_write_mem(w, &image, size), TD_OK);
    gguf_writer_free(w);
    gguf_file *g = NULL;
    assert_int_equal(gguf_open_memory(&g, image, *size), TD_OK);
    const gguf_tensor *c = gguf_find_tensor(g, "c");
    *data_end = g->data_offset + c->offset + c->size;
    gguf_close(g);
    return image;
}

static void test_truncation_at_every_byte_is_an_error(void **state)
{
    (void)state;
    uint64_t size, end;
    uint8_t *image = valid_image(&size, &end);
    assert_true(end < size); /* the last tensor is followed by padding */
    int refused = 0;
    for (uint64_t n = 0; n <= size; n++) {
        uint8_t *cut = malloc(n ? n : 1);
        memcpy(cut, image, n);
        gguf_file *g = NULL;
        td_err e = gguf_open_memory(&g, cut, n);
        if (n < end) {
            if (e != TD_EFORMAT)
                fail_msg("cut at %llu of %llu: got %s (%s)", (unsigned long long)n,
                         (unsigned long long)size, err_name(e), err_msg());
            assert_null(g);
            assert_true(strstr(err_msg(), "truncated") || strstr(err_msg(), "past the end") ||
                        strstr(err_msg(), "cannot fit"));
            refused++;
        } else {
            /* Only the padding after the last tensor is gone: still a complete file. */
            if (e)
                fail_msg("cut at %llu: %s", (unsigned long long)n, err_msg());
            gguf_close(g);
        }
        free(cut);
    }
    assert_int_equal(refused, end);
    free(image);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_magic_is_refused),
        cmocka_unit_test(test_version_1_is_refused),
        cmocka_unit_test(test_version_4_is_refused),
        cmocka_unit_test(test_big_endian_file_is_refused),
        cmocka_unit_test(test_huge_n_kv_is_refused_before_allocating),
        cmocka_unit_test(test_huge_n_tensors_is_refused_before_allocating),
        cmocka_unit_test(test_key_length_past_the_end_is_refused),
        cmocka_unit_test(test_value_string_length_past_the_end_is_refused),
        cmocka_unit_test(test_unknown_value_type_is_refused),
        cmocka_unit_test(test_unknown_array_element_type_is_refused),
        cmocka_unit_test(test_array_longer_than_the_file_is_refused),
        cmocka_unit_test(test_arrays_nested_too_deep_are_refused),
        cmocka_unit_test(test_bool_other_than_0_or_1_is_refused),
        cmocka_unit_test(test_empty_and_duplicate_keys_are_refused),
        cmocka_unit_test(test_bad_alignment_is_refused),
        cmocka_unit_test(test_misaligned_tensor_is_refused),
        cmocka_unit_test(test_overlapping_tensors_are_refused),
        cmocka_unit_test(test_tensor_past_the_end_of_the_file_is_refused),
        cmocka_unit_test(test_unknown_tensor_type_is_refused),
        cmocka_unit_test(test_duplicate_tensor_names_are_refused),
        cmocka_unit_test(test_bad_dimensions_are_refused),
        cmocka_unit_test(test_row_not_a_multiple_of_the_block_is_refused),
        cmocka_unit_test(test_bad_tensor_names_are_refused),
        cmocka_unit_test(test_truncation_at_every_byte_is_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
