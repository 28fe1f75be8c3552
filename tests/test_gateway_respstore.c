/* The gateway's kept responses: what goes in (the response, its conversation, its input items)
 * comes back as it was, the least recently used go
 * first past the count or the bytes, a response larger than the bytes is not kept, a kept id
 * is replaced, deleted ids are gone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/respstore.h"

static void put(rstore *s, const char *id, const char *text)
{
    json_t *r = json_pack("{s:s,s:s}", "id", id, "text", text);
    json_t *c = json_pack("[{s:s,s:s}]", "role", "user", "content", text);
    json_t *in = json_pack("[s]", text);
    assert_true(rstore_put(s, id, r, c, in));
    json_decref(r);
    json_decref(c);
    json_decref(in);
}

/* The text kept under id, or NULL. */
static char *text_of(rstore *s, const char *id)
{
    json_t *r, *c, *in;
    if (!rstore_get(s, id, RSTORE_RESPONSE, &r))
        return NULL;
    assert_true(rstore_get(s, id, RSTORE_CONV, &c));
    assert_true(rstore_get(s, id, RSTORE_INPUT, &in));
    char *t = strdup(json_string_value(json_object_get(r, "text")));
    assert_string_equal(json_string_value(json_object_get(json_array_get(c, 0), "content")), t);
    assert_string_equal(json_string_value(json_array_get(in, 0)), t);
    json_decref(r);
    json_decref(c);
    json_decref(in);
    return t;
}

static void kept_responses_come_back_and_the_least_recently_used_go(void **state)
{
    (void)state;
    rstore *s;
    assert_int_equal(rstore_init(&s, 3, 1 << 20), TD_OK);
    put(s, "a", "one");
    put(s, "b", "two");
    put(s, "c", "three");
    char *t = text_of(s, "a"); /* a is now the most recently used */
    assert_string_equal(t, "one");
    free(t);
    put(s, "d", "four"); /* past 3: b goes, not a */
    assert_null(text_of(s, "b"));
    t = text_of(s, "a");
    assert_string_equal(t, "one");
    free(t);
    put(s, "c", "THREE"); /* replaced in place: still 3 kept */
    size_t n, bytes;
    rstore_usage(s, &n, &bytes);
    assert_int_equal(n, 3);
    t = text_of(s, "c");
    assert_string_equal(t, "THREE");
    free(t);
    assert_true(rstore_delete(s, "c"));
    assert_false(rstore_delete(s, "c"));
    assert_null(text_of(s, "c"));
    json_t *r = json_null();
    assert_false(rstore_get(s, "zz", RSTORE_INPUT, &r));
    assert_null(r);
    rstore_usage(s, &n, &bytes);
    assert_int_equal(n, 2);
    rstore_free(s);
}

static void the_byte_bound_holds(void **state)
{
    (void)state;
    rstore *s;
    /* one entry: id (1 byte) + {"id":"a","text":"<40>"} (60) + [{"role":"user","content":
     * "<40>"}] (70) + ["<40>"] (44) */
    char text[41];
    memset(text, 'x', 40);
    text[40] = 0;
    assert_int_equal(rstore_init(&s, 100, 400), TD_OK);
    put(s, "a", text);
    size_t n, one;
    rstore_usage(s, &n, &one);
    assert_int_equal(n, 1);
    assert_int_equal(one, 1 + 60 + 70 + 44);
    put(s, "b", text);
    put(s, "c", text); /* 3 x 175 > 400: a goes */
    rstore_usage(s, &n, &one);
    assert_int_equal(n, 2);
    assert_null(text_of(s, "a"));
    char big[400]; /* {"text":"<399>"}: 410 bytes, more than the 400 bound alone */
    memset(big, 'y', sizeof big - 1);
    big[sizeof big - 1] = 0;
    json_t *r = json_pack("{s:s}", "text", big), *c = json_array();
    assert_false(rstore_put(s, "big", r, c, c)); /* larger than the bound alone */
    json_decref(r);
    json_decref(c);
    rstore_usage(s, &n, &one);
    assert_int_equal(n, 2); /* and nothing was dropped for it */
    rstore_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kept_responses_come_back_and_the_least_recently_used_go),
        cmocka_unit_test(the_byte_bound_holds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
