/* safetensors reader and writer: exact bytes against the reference implementation's output,
 * every truncation, every corruption with its error code and message words. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/safetensors.h"

/* The bytes the Python `safetensors` package (0.8) writes for
 *   serialize({"w": float32 [1.0, -2.5], "h": bfloat16 bits [0x3f80, 0xc000, 0x0001],
 *              "m": uint8 [[7]]}, metadata={"format": "pt"})
 * : length 200, compact JSON padded with 4 spaces, then the data, largest dtype first. */
#define REF_HEADER                                                                           \
    "{\"__metadata__\":{\"format\":\"pt\"},"                                                 \
    "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"                         \
    "\"h\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[8,14]},"                       \
    "\"m\":{\"dtype\":\"U8\",\"shape\":[1,1],\"data_offsets\":[14,15]}}    "
static const uint8_t ref_data[15] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0,
                                     0x80, 0x3f, 0x00, 0xc0, 0x01, 0x00, 0x07};

static const float w_vals[2] = {1.0f, -2.5f};
static const uint16_t h_vals[3] = {0x3f80, 0xc000, 0x0001};
static const uint8_t m_vals[1] = {7};

/* Builds [u64 len][header][data] in a malloc'd buffer of exactly the image size, so ASan
 * flags any read past it. */
static uint8_t *image_make(const char *header, const void *data, size_t data_len, size_t *size)
{
    size_t hl = strlen(header);
    *size = 8 + hl + data_len;
    uint8_t *b = malloc(*size ? *size : 1);
    assert_non_null(b);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    if (data_len)
        memcpy(b + 8 + hl, data, data_len);
    return b;
}

static uint8_t *ref_image(size_t *size)
{
    return image_make(REF_HEADER, ref_data, sizeof ref_data, size);
}

static void test_reads_reference_image(void **state)
{
    (void)state;
    size_t size;
    uint8_t *img = ref_image(&size);
    assert_int_equal(size, 223);
    st_file *f;
    assert_int_equal(st_open_memory(&f, img, size), TD_OK);
    assert_int_equal(f->header_size, 200);
    assert_int_equal(f->n_tensors, 3);
    /* sorted by data offset */
    assert_string_equal(f->tensors[0].name, "w");
    assert_string_equal(f->tensors[1].name, "h");
    assert_string_equal(f->tensors[2].name, "m");

    const st_tensor *w = st_find(f, "w");
    assert_ptr_equal(w, &f->tensors[0]);
    assert_int_equal(w->dtype, ST_F32);
    assert_true(w->supported);
    assert_int_equal(w->n_dims, 1);
    assert_int_equal(w->shape[0], 2);
    assert_int_equal(w->n_elements, 2);
    assert_int_equal(w->offset, 0);
    assert_int_equal(w->bytes, 8);
    assert_ptr_equal(w->data, img + 208);
    assert_memory_equal(w->data, w_vals, 8);

    const st_tensor *h = st_find(f, "h");
    assert_int_equal(h->dtype, ST_BF16);
    assert_int_equal(h->offset, 8);
    assert_int_equal(h->bytes, 6);
    assert_memory_equal(h->data, h_vals, 6);
    td_dtype type;
    assert_int_equal(st_tensor_type(h, &type), TD_OK);
    assert_int_equal(type, TD_BF16);

    const st_tensor *m = st_find(f, "m");
    assert_int_equal(m->dtype, ST_U8);
    assert_false(m->supported);
    assert_int_equal(m->n_dims, 2);
    assert_int_equal(m->shape[0], 1);
    assert_int_equal(m->shape[1], 1);
    assert_int_equal(((const uint8_t *)m->data)[0], 7);
    assert_int_equal(st_tensor_type(m, &type), TD_ENOTSUP);
    assert_non_null(strstr(err_msg(), "\"m\""));
    assert_non_null(strstr(err_msg(), "U8"));

    assert_null(st_find(f, "x"));
    assert_null(st_find(f, ""));
    assert_int_equal(f->n_meta, 1);
    assert_string_equal(st_meta_get(f, "format"), "pt");
    assert_null(st_meta_get(f, "other"));
    st_close(f);
    free(img);
}

static void test_serialize_matches_reference_bytes(void **state)
{
    (void)state;
    const uint64_t s_w[1] = {2}, s_h[1] = {3}, s_m[2] = {1, 1};
    /* Given smallest first: the writer must still lay out F32, BF16, U8. */
    const st_entry e[3] = {
        {"m", ST_U8, 2, s_m, m_vals, 1},
        {"h", ST_BF16, 1, s_h, h_vals, 6},
        {"w", ST_F32, 1, s_w, w_vals, 8},
    };
    const st_meta meta[1] = {{"format", "pt"}};
    uint8_t *out;
    size_t out_size;
    assert_int_equal(st_serialize(e, 3, meta, 1, &out, &out_size), TD_OK);
    size_t ref_size;
    uint8_t *ref = ref_image(&ref_size);
    assert_int_equal(out_size, ref_size);
    assert_memory_equal(out, ref, ref_size);
    free(out);
    free(ref);
}

static void test_write_then_open_file(void **state)
{
    (void)state;
    char path[] = "/tmp/tandem_st_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    const uint64_t s_w[1] = {2}, s_h[1] = {3}, s_m[2] = {1, 1};
    const st_entry e[3] = {
        {"m", ST_U8, 2, s_m, m_vals, 1},
        {"h", ST_BF16, 1, s_h, h_vals, 6},
        {"w", ST_F32, 1, s_w, w_vals, 8},
    };
    const st_meta meta[1] = {{"format", "pt"}};
    assert_int_equal(st_write(path, e, 3, meta, 1), TD_OK);

    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    uint8_t buf[256];
    size_t n = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    size_t ref_size;
    uint8_t *ref = ref_image(&ref_size);
    assert_int_equal(n, ref_size);
    assert_memory_equal(buf, ref, ref_size);
    free(ref);

    st_file *f;
    assert_int_equal(st_open(&f, path), TD_OK);
    assert_int_equal(f->size, 223);
    assert_memory_equal(st_find(f, "w")->data, w_vals, 8);
    assert_memory_equal(st_find(f, "h")->data, h_vals, 6);
    st_close(f);
    unlink(path);
}

static void test_every_truncation_is_an_error(void **state)
{
    (void)state;
    size_t size;
    uint8_t *img = ref_image(&size);
    for (size_t cut = 0; cut < size; cut++) {
        uint8_t *p = malloc(cut ? cut : 1);
        memcpy(p, img, cut);
        st_file *f = (st_file *)1;
        td_err e = st_open_memory(&f, p, cut);
        if (e != TD_EFORMAT)
            fail_msg("prefix of %zu bytes: got %s (%s)", cut, err_name(e), err_msg());
        assert_null(f);
        assert_true(strlen(err_msg()) > 0);
        free(p);
    }
    free(img);
}

typedef struct bad_case {
    const char *what;
    const char *header;
    size_t data_len;  /* zero bytes of data after the header */
    td_err code;
    const char *words[3];
} bad_case;

static const bad_case bad_cases[] = {
    {"not json", "{\"a\":", 0, TD_EFORMAT, {"invalid JSON", "line 1"}},
    {"root is an array", "[1,2]", 0, TD_EFORMAT, {"not a JSON object"}},
    {"trailing garbage", "{} x", 0, TD_EFORMAT, {"invalid JSON"}},
    {"invalid utf-8", "{\"a\xff\":1}", 0, TD_EFORMAT, {"invalid JSON"}},
    {"NUL in a name", "{\"a\\u0000b\":{}}", 0, TD_EFORMAT, {"invalid JSON", "u0000"}},
    {"metadata not an object", "{\"__metadata__\":[1]}", 0, TD_EFORMAT, {"__metadata__", "not an object"}},
    {"metadata value not a string", "{\"__metadata__\":{\"k\":1}}", 0, TD_EFORMAT,
     {"__metadata__", "\"k\"", "not a string"}},
    {"entry not an object", "{\"t\":[1]}", 0, TD_EFORMAT, {"tensor \"t\"", "not a JSON object"}},
    {"no dtype", "{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, TD_EFORMAT, {"tensor \"t\"", "no dtype"}},
    {"dtype not a string", "{\"t\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, TD_EFORMAT,
     {"tensor \"t\"", "dtype is not a string"}},
    {"unknown dtype", "{\"t\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, TD_ENOTSUP,
     {"tensor \"t\"", "unknown dtype", "Q4"}},
    {"lower-case dtype", "{\"t\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, TD_ENOTSUP,
     {"tensor \"t\"", "unknown dtype"}},
    {"no shape", "{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, TD_EFORMAT, {"tensor \"t\"", "no shape"}},
    {"shape not an array", "{\"t\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", 4, TD_EFORMAT,
     {"tensor \"t\"", "shape is not an array"}},
    {"negative dim", "{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, TD_EFORMAT,
     {"tensor \"t\"", "shape[0]", "non-negative integer"}},
    {"real dim", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1,2.0],\"data_offsets\":[0,8]}}", 8, TD_EFORMAT,
     {"tensor \"t\"", "shape[1]"}},
    {"rank 9", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, TD_ERANGE,
     {"tensor \"t\"", "rank 9"}},
    {"element count overflow",
     "{\"t\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,1]}}", 1, TD_ERANGE,
     {"tensor \"t\"", "overflows"}},
    {"byte size overflow", "{\"t\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,1]}}", 1,
     TD_ERANGE, {"tensor \"t\"", "overflows"}},
    {"F4 odd count", "{\"t\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, TD_EFORMAT,
     {"tensor \"t\"", "whole number of bytes"}},
    {"no data_offsets", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, TD_EFORMAT, {"tensor \"t\"", "no data_offsets"}},
    {"one offset", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, TD_EFORMAT,
     {"tensor \"t\"", "[begin, end]"}},
    {"negative offset", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, TD_EFORMAT,
     {"tensor \"t\"", "[begin, end]"}},
    {"end before begin", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, TD_EFORMAT,
     {"tensor \"t\"", "end before begin"}},
    {"past the end", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, TD_EFORMAT,
     {"tensor \"t\"", "past the end"}},
    {"huge end", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[9223372036854775803,9223372036854775807]}}",
     4, TD_EFORMAT, {"tensor \"t\"", "past the end"}},
    {"size mismatch", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,6]}}", 8, TD_EFORMAT,
     {"tensor \"t\"", "needs 8 bytes", "span 6"}},
    {"overlap",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[6,10]}}", 10, TD_EFORMAT,
     {"\"b\"", "overlaps", "\"a\""}},
    {"same range twice",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, TD_EFORMAT, {"overlaps", "\"a\"", "\"b\""}},
    {"duplicate name",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, TD_EFORMAT, {"duplicate", "\"a\""}},
};

static void test_each_corruption_has_its_error(void **state)
{
    (void)state;
    static const uint8_t zeros[64];
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        size_t size;
        uint8_t *img = image_make(c->header, zeros, c->data_len, &size);
        st_file *f = (st_file *)1;
        td_err e = st_open_memory(&f, img, size);
        if (e != c->code)
            fail_msg("%s: expected %s, got %s (%s)", c->what, err_name(c->code), err_name(e), err_msg());
        assert_null(f);
        for (int w = 0; w < 3 && c->words[w]; w++)
            if (!strstr(err_msg(), c->words[w]))
                fail_msg("%s: message \"%s\" lacks \"%s\"", c->what, err_msg(), c->words[w]);
        free(img);
    }
}

static void test_header_length_limits(void **state)
{
    (void)state;
    uint8_t img[16] = {0};
    /* 100000001 = 0x05F5E101: one byte over the limit, checked before the file size. */
    img[0] = 0x01, img[1] = 0xE1, img[2] = 0xF5, img[3] = 0x05;
    st_file *f;
    assert_int_equal(st_open_memory(&f, img, sizeof img), TD_ERANGE);
    assert_non_null(strstr(err_msg(), "100000001"));
    assert_non_null(strstr(err_msg(), "limit"));
    /* All ones: must not wrap around when compared with the file size. */
    memset(img, 0xff, 8);
    assert_int_equal(st_open_memory(&f, img, sizeof img), TD_ERANGE);
    /* 9 bytes of header in a 16-byte file: one byte short. */
    memset(img, 0, 8);
    img[0] = 9;
    assert_int_equal(st_open_memory(&f, img, sizeof img), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "past the end"));
}

static void test_other_dtypes_validate_but_are_flagged(void **state)
{
    (void)state;
    static const uint8_t zeros[64];
    const char *hdr =
        "{\"e4\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]},"
        "\"i64\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[8,16]},"
        "\"f4\":{\"dtype\":\"F4\",\"shape\":[2,3],\"data_offsets\":[16,19]},"
        "\"f6\":{\"dtype\":\"F6_E3M2\",\"shape\":[4],\"data_offsets\":[19,22]},"
        "\"c\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[24,32]},"
        "\"b\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[32,34]},"
        "\"h\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[34,36]}}";
    size_t size;
    uint8_t *img = image_make(hdr, zeros, 36, &size);
    st_file *f;
    assert_int_equal(st_open_memory(&f, img, size), TD_OK);
    assert_int_equal(f->n_tensors, 7);
    const st_tensor *t = st_find(f, "i64");
    assert_int_equal(t->dtype, ST_I64);
    assert_int_equal(t->n_dims, 0);
    assert_int_equal(t->n_elements, 1);
    assert_int_equal(t->bytes, 8);
    assert_false(t->supported);
    assert_int_equal(st_find(f, "f4")->bytes, 3);
    assert_int_equal(st_find(f, "f6")->bytes, 3);
    assert_int_equal(st_find(f, "c")->bytes, 8);
    td_dtype type;
    assert_int_equal(st_tensor_type(st_find(f, "e4"), &type), TD_ENOTSUP);
    assert_non_null(strstr(err_msg(), "\"e4\""));
    assert_non_null(strstr(err_msg(), "F8_E4M3"));
    assert_int_equal(st_tensor_type(st_find(f, "h"), &type), TD_OK);
    assert_int_equal(type, TD_F16);
    st_close(f);
    free(img);
}

static void test_empty_tensors_gaps_and_trailing_bytes_are_accepted(void **state)
{
    (void)state;
    static const uint8_t data[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    const char *hdr =
        "{\"z1\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[4,4]},"
        "\"z2\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[4,4]},"
        "\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
        "\"y\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[6,9]}}";
    size_t size;
    uint8_t *img = image_make(hdr, data, sizeof data, &size);
    st_file *f;
    assert_int_equal(st_open_memory(&f, img, size), TD_OK);
    assert_int_equal(st_find(f, "z1")->bytes, 0);
    assert_int_equal(st_find(f, "z1")->n_elements, 0);
    assert_memory_equal(st_find(f, "x")->data, data + 2, 2);
    assert_memory_equal(st_find(f, "y")->data, data + 6, 3);
    st_close(f);
    free(img);
}

static void test_writer_refuses_bad_entries(void **state)
{
    (void)state;
    const uint64_t s2[1] = {2};
    const float v[2] = {1, 2};
    uint8_t *out;
    size_t size;
    const st_entry wrong_size[1] = {{"t", ST_F32, 1, s2, v, 4}};
    assert_int_equal(st_serialize(wrong_size, 1, NULL, 0, &out, &size), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "\"t\""));
    assert_null(out);
    const st_entry dup[2] = {{"t", ST_F32, 1, s2, v, 8}, {"t", ST_F32, 1, s2, v, 8}};
    assert_int_equal(st_serialize(dup, 2, NULL, 0, &out, &size), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "duplicate"));
    const st_entry reserved[1] = {{"__metadata__", ST_F32, 1, s2, v, 8}};
    assert_int_equal(st_serialize(reserved, 1, NULL, 0, &out, &size), TD_EINVAL);
    const st_entry bad_utf8[1] = {{"t\xff", ST_F32, 1, s2, v, 8}};
    assert_int_equal(st_serialize(bad_utf8, 1, NULL, 0, &out, &size), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "UTF-8"));
    assert_int_equal(st_write("/nonexistent-dir/x.safetensors", wrong_size, 0, NULL, 0), TD_EIO);
    assert_non_null(strstr(err_msg(), "/nonexistent-dir/x.safetensors"));
}

static void test_open_reports_missing_and_unreadable_files(void **state)
{
    (void)state;
    st_file *f = (st_file *)1;
    assert_int_equal(st_open(&f, "/nonexistent/model.safetensors"), TD_EIO);
    assert_null(f);
    assert_non_null(strstr(err_msg(), "/nonexistent/model.safetensors"));
    assert_int_equal(st_open(&f, "/tmp"), TD_EIO);
    assert_non_null(strstr(err_msg(), "not a regular file"));

    char path[] = "/tmp/tandem_st_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "abc", 3), 3);
    close(fd);
    assert_int_equal(st_open(&f, path), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), path));
    assert_non_null(strstr(err_msg(), "3 bytes"));
    unlink(path);
}

static void test_find_uses_exact_names(void **state)
{
    (void)state;
    /* Names sharing prefixes and a UTF-8 name; lookups must be exact. */
    static const uint8_t zeros[16];
    const char *hdr =
        "{\"layers.1.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
        "\"layers.10.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]},"
        "\"layers.1\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]},"
        "\"caf\\u00e9\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[3,4]}}";
    size_t size;
    uint8_t *img = image_make(hdr, zeros, 4, &size);
    st_file *f;
    assert_int_equal(st_open_memory(&f, img, size), TD_OK);
    assert_int_equal(st_find(f, "layers.1.w")->offset, 0);
    assert_int_equal(st_find(f, "layers.10.w")->offset, 1);
    assert_int_equal(st_find(f, "layers.1")->offset, 2);
    assert_int_equal(st_find(f, "caf\xc3\xa9")->offset, 3);
    assert_null(st_find(f, "layers.1.w "));
    assert_null(st_find(f, "layers"));
    st_close(f);
    free(img);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_reference_image),
        cmocka_unit_test(test_serialize_matches_reference_bytes),
        cmocka_unit_test(test_write_then_open_file),
        cmocka_unit_test(test_every_truncation_is_an_error),
        cmocka_unit_test(test_each_corruption_has_its_error),
        cmocka_unit_test(test_header_length_limits),
        cmocka_unit_test(test_other_dtypes_validate_but_are_flagged),
        cmocka_unit_test(test_empty_tensors_gaps_and_trailing_bytes_are_accepted),
        cmocka_unit_test(test_writer_refuses_bad_entries),
        cmocka_unit_test(test_open_reports_missing_and_unreadable_files),
        cmocka_unit_test(test_find_uses_exact_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
