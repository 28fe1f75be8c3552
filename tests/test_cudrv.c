/* cudrv without a GPU: UUID text round trips, and a clean error (never a crash or a loader
 * failure) where there is no driver or device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/cudrv.h"

static const uint8_t uuid_seq[CUDRV_UUID_BYTES] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05,
                                                   0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b,
                                                   0x0c, 0x0d, 0xfe, 0xff};

static void test_uuid_formats_like_nvidia_smi(void **state)
{
    (void)state;
    char s[CUDRV_UUID_STR_LEN];
    cudrv_uuid_format(uuid_seq, s);
    assert_string_equal(s, "GPU-00010203-0405-0607-0809-0a0b0c0dfeff");
}

static void test_uuid_parses_every_accepted_spelling(void **state)
{
    (void)state;
    static const char *ok[] = {
        "GPU-00010203-0405-0607-0809-0a0b0c0dfeff",
        "MIG-00010203-0405-0607-0809-0a0b0c0dfeff",
        "00010203-0405-0607-0809-0A0B0C0DFEFF",
        "000102030405060708090a0b0c0dfeff",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint8_t u[CUDRV_UUID_BYTES];
        memset(u, 0x55, sizeof u);
        assert_int_equal(cudrv_uuid_parse(ok[i], u), TD_OK);
        assert_memory_equal(u, uuid_seq, CUDRV_UUID_BYTES);
    }
}

static void test_uuid_rejects_malformed_text(void **state)
{
    (void)state;
    static const char *bad[] = {
        "",
        "GPU-",
        "GPU-00010203-0405-0607-0809-0a0b0c0dfe",     /* 30 digits */
        "GPU-00010203-0405-0607-0809-0a0b0c0dfeff00", /* 34 digits */
        "GPU-00010203-0405-0607-0809-0a0b0c0dfeg0",   /* not hex */
        "XPU-00010203-0405-0607-0809-0a0b0c0dfeff",
        "0",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t u[CUDRV_UUID_BYTES];
        assert_int_equal(cudrv_uuid_parse(bad[i], u), TD_EINVAL);
        assert_non_null(strstr(err_msg(), "bad GPU UUID"));
    }
}

static void test_load_result_agrees_with_availability(void **state)
{
    (void)state;
    td_err e = cudrv_load();
    int count = -1;
    td_err ec = cudrv_device_count(&count);
    assert_int_equal(ec, e);
    if (e != TD_OK) {
        /* No driver, no device, or a CPU-only build: a reason, never a crash. */
        assert_true(e == TD_ENOTSUP || e == TD_ECUDA);
        assert_true(strlen(err_msg()) > 0);
        assert_false(cudrv_available());
        assert_int_equal(count, 0);
        cudrv_device dev;
        assert_int_equal(cudrv_device_open(&dev, "GPU-00010203-0405-0607-0809-0a0b0c0dfeff"), e);
        assert_null(dev.ctx);
        cudrv_device_close(&dev);
        return;
    }
    assert_int_equal(cudrv_available(), count > 0);
    cudrv_device dev;
    assert_int_equal(cudrv_device_open(&dev, "GPU-00010203-0405-0607-0809-0a0b0c0dfeff"),
                     TD_ENOENT);
    assert_int_equal(cudrv_device_open(&dev, "9999"), TD_ENOENT);
    assert_int_equal(cudrv_device_open(&dev, "gpu zero"), TD_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uuid_formats_like_nvidia_smi),
        cmocka_unit_test(test_uuid_parses_every_accepted_spelling),
        cmocka_unit_test(test_uuid_rejects_malformed_text),
        cmocka_unit_test(test_load_result_agrees_with_availability),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
