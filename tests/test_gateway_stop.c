/* Stop strings in the gateway: what each streamed piece lets through, exactly. Text that may
 * begin a stop string waits for the next piece; a stop string is never sent, never split
 * across two sent pieces, and the text ends right before its first occurrence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "gateway/stopstr.h"

/* Pushes pieces (NULL-terminated) and writes what came out of each as "[a][b]...", then the
 * flush as "|rest", into out. */
static void run_as(const char *const *stops, size_t n_stops, const char *const *pieces,
                   bool keep_stop, char *out, size_t cap, bool *stopped)
{
    size_t lens[8] = {0};
    for (size_t i = 0; i < n_stops; i++)
        lens[i] = strlen(stops[i]);
    stop_filter f;
    stop_init(&f, stops, lens, n_stops);
    f.keep_stop = keep_stop;
    size_t n = 0;
    out[0] = 0;
    for (size_t i = 0; pieces[i]; i++) {
        const char *p;
        size_t len;
        assert_int_equal(stop_push(&f, pieces[i], strlen(pieces[i]), &p, &len), TD_OK);
        n += (size_t)snprintf(out + n, cap - n, "[%.*s]", (int)len, p);
    }
    const char *p;
    size_t len;
    stop_flush(&f, &p, &len);
    snprintf(out + n, cap - n, "|%.*s", (int)len, p);
    *stopped = f.stopped;
    stop_free(&f);
}

static void run(const char *const *stops, size_t n_stops, const char *const *pieces, char *out,
                size_t cap, bool *stopped)
{
    run_as(stops, n_stops, pieces, false, out, cap, stopped);
}

/* include_stop_str_in_output: the text ends with the stop string, in one piece or across
 * pieces (held, then sent with the rest of the match). */
static void kept_stop_string_ends_the_text(void **state)
{
    (void)state;
    const char *stops[] = {"END", "world"};
    const char *one[] = {"abcENDdef", "more", NULL};
    const char *across[] = {"Hello, wo", "r", "ld!", NULL};
    char out[256];
    bool stopped;
    run_as(stops, 2, one, true, out, sizeof out, &stopped);
    assert_string_equal(out, "[abcEND][]|");
    run_as(stops, 2, across, true, out, sizeof out, &stopped);
    assert_string_equal(out, "[Hello, ][][world]|");
    assert_true(stopped);
}

static void stop_string_inside_one_piece_cuts_before_it(void **state)
{
    (void)state;
    const char *stops[] = {"END"};
    const char *pieces[] = {"abcENDdef", "more", NULL};
    char out[256];
    bool stopped;
    run(stops, 1, pieces, out, sizeof out, &stopped);
    assert_string_equal(out, "[abc][]|");
    assert_true(stopped);
}

static void stop_string_across_pieces_is_held_then_dropped(void **state)
{
    (void)state;
    const char *stops[] = {"world"};
    const char *pieces[] = {"Hello, wo", "r", "ld!", NULL};
    char out[256];
    bool stopped;
    run(stops, 1, pieces, out, sizeof out, &stopped);
    assert_string_equal(out, "[Hello, ][][]|");
    assert_true(stopped);
}

static void held_prefix_is_released_when_the_match_fails(void **state)
{
    (void)state;
    const char *stops[] = {"world"};
    const char *pieces[] = {"Hello, wo", "rm", "s", NULL};
    char out[256];
    bool stopped;
    run(stops, 1, pieces, out, sizeof out, &stopped);
    assert_string_equal(out, "[Hello, ][worm][s]|");
    assert_false(stopped);
}

static void held_prefix_is_flushed_at_the_end(void **state)
{
    (void)state;
    const char *stops[] = {"</s>"};
    const char *pieces[] = {"done </", NULL};
    char out[256];
    bool stopped;
    run(stops, 1, pieces, out, sizeof out, &stopped);
    assert_string_equal(out, "[done ]|</");
    assert_false(stopped);
}

static void earliest_of_several_stop_strings_wins(void **state)
{
    (void)state;
    const char *stops[] = {"xyz", "b"};
    const char *pieces[] = {"axyzb", NULL};
    char out[256];
    bool stopped;
    run(stops, 2, pieces, out, sizeof out, &stopped);
    assert_string_equal(out, "[a]|");
    assert_true(stopped);
}

static void longest_possible_prefix_is_held(void **state)
{
    (void)state;
    /* "aab" must not be missed: after "xaa" both "a" and "aa" are stop prefixes. */
    const char *stops[] = {"aab"};
    const char *pieces[] = {"xaa", "ab", NULL};
    char out[256];
    bool stopped;
    run(stops, 1, pieces, out, sizeof out, &stopped);
    assert_string_equal(out, "[x][a]|");
    assert_true(stopped);
}

static void multibyte_stop_string_never_splits_a_character(void **state)
{
    (void)state;
    /* "é" is C3 A9; the piece boundary falls between two characters only. */
    const char *stops[] = {"\xc3\xa9t\xc3\xa9"};
    const char *pieces[] = {"caf\xc3\xa9", " \xc3\xa9", "t", "\xc3\xa9 fin", NULL};
    char out[256];
    bool stopped;
    run(stops, 1, pieces, out, sizeof out, &stopped);
    assert_string_equal(out, "[caf][\xc3\xa9 ][][]|");
    assert_true(stopped);
}

static void no_stop_strings_passes_everything_at_once(void **state)
{
    (void)state;
    const char *pieces[] = {"a", "bc", NULL};
    char out[256];
    bool stopped;
    run(NULL, 0, pieces, out, sizeof out, &stopped);
    assert_string_equal(out, "[a][bc]|");
    assert_false(stopped);
}

static void stop_string_that_is_the_whole_first_piece_sends_nothing(void **state)
{
    (void)state;
    const char *stops[] = {"\n\n"};
    const char *pieces[] = {"\n", "\n", "tail", NULL};
    char out[256];
    bool stopped;
    run(stops, 1, pieces, out, sizeof out, &stopped);
    assert_string_equal(out, "[][][]|");
    assert_true(stopped);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stop_string_inside_one_piece_cuts_before_it),
        cmocka_unit_test(kept_stop_string_ends_the_text),
        cmocka_unit_test(stop_string_across_pieces_is_held_then_dropped),
        cmocka_unit_test(held_prefix_is_released_when_the_match_fails),
        cmocka_unit_test(held_prefix_is_flushed_at_the_end),
        cmocka_unit_test(earliest_of_several_stop_strings_wins),
        cmocka_unit_test(longest_possible_prefix_is_held),
        cmocka_unit_test(multibyte_stop_string_never_splits_a_character),
        cmocka_unit_test(no_stop_strings_passes_everything_at_once),
        cmocka_unit_test(stop_string_that_is_the_whole_first_piece_sends_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
