/* The growable text buffer (common/tbuf.h): appends keep the text NUL-terminated across
 * growth, printf output of any length lands whole, a size that cannot be held is refused
 * without touching the text and leaves oom set, and later appends are still made. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tbuf.h"

static void test_appends_grow_and_stay_terminated(void **state)
{
    (void)state;
    tbuf b = {0};
    assert_true(tbuf_put(&b, "", 0)); /* an empty append still makes a string */
    assert_non_null(b.p);
    assert_string_equal(b.p, "");
    char want[5000];
    size_t n = 0;
    for (int i = 0; i < 1000; i++) { /* many growths */
        char piece[8];
        const int k = snprintf(piece, sizeof piece, "%d,", i % 97);
        assert_true(tbuf_put(&b, piece, (size_t)k));
        memcpy(want + n, piece, (size_t)k);
        n += (size_t)k;
        want[n] = 0;
        assert_int_equal(b.len, n);
        assert_true(b.cap > b.len);
        assert_int_equal(b.p[b.len], 0);
    }
    assert_string_equal(b.p, want);
    assert_true(tbuf_puts(&b, "end"));
    assert_int_equal(b.len, n + 3);
    assert_memory_equal(b.p + n, "end", 4);
    assert_false(b.oom);
    tbuf_free(&b);
    assert_null(b.p);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.cap, 0);
}

static void test_printf_output_lands_whole(void **state)
{
    (void)state;
    tbuf b = {0};
    assert_true(tbuf_printf(&b, "%s=%d\n", "a", 1));
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    assert_true(tbuf_printf(&b, "[%s]%llu", big, 18446744073709551615ull));
    assert_int_equal(b.len, 4 + 1 + 2999 + 1 + 20);
    assert_memory_equal(b.p, "a=1\n[x", 6);
    assert_string_equal(b.p + b.len - 21, "]18446744073709551615");
    assert_true(tbuf_printf(&b, "%s", "")); /* nothing to add */
    assert_int_equal(b.len, 4 + 1 + 2999 + 1 + 20);
    tbuf_free(&b);
}

static void test_impossible_size_is_refused_and_remembered(void **state)
{
    (void)state;
    tbuf b = {0};
    assert_true(tbuf_puts(&b, "kept"));
    const size_t cap = b.cap;
    /* sizes whose sum with len + 1, or twice it, would wrap: refused before any arithmetic */
    assert_false(tbuf_put(&b, "", SIZE_MAX));
    assert_false(tbuf_put(&b, "", SIZE_MAX - 4));
    assert_false(tbuf_put(&b, "", SIZE_MAX / 2));
    assert_true(b.oom);
    assert_int_equal(b.len, 4);
    assert_int_equal(b.cap, cap);
    assert_string_equal(b.p, "kept");
    /* a later append is still made; oom stays set */
    assert_true(tbuf_puts(&b, "!"));
    assert_string_equal(b.p, "kept!");
    assert_true(b.oom);
    tbuf_free(&b);
    assert_false(b.oom);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_appends_grow_and_stay_terminated),
        cmocka_unit_test(test_printf_output_lands_whole),
        cmocka_unit_test(test_impossible_size_is_refused_and_remembered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
