/* The JSON constraint's number ranges (common/jsonc.h): minimum, maximum, exclusiveMinimum and
 * exclusiveMaximum on integers (exact int64 ends) and on reals (what strtod reads the text as):
 * texts cut at an exact byte, every short text against the members of a range, and random
 * ranges against what a reader takes numbers written near their ends for. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/jsonc.h"
#include "tests/support/jsonc_check.h"

/* minimum / maximum and their exclusive forms on integers: a number is rejected at the first
 * byte after which no integer of the range can be completed, and done only inside the range. */
static void integer_ranges_reject_at_the_first_byte_no_member_follows(void **state)
{
    (void)state;
    static const jc_case small[] = {
        DONE("-5"), DONE("0"), DONE("-0"), DONE("120"), DONE("7"), DONE("-1"), DONE("13 "),
        VIABLE("-"), REJECT("-", "6"), REJECT("-5", "0"), REJECT("12", "1"), REJECT("13", "0"),
        REJECT("99", "9"), REJECT("", "\"1\""), REJECT("1", ".0"),
    };
    check_cases("{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120}", small, N_OF(small));
    static const jc_case teens[] = {
        VIABLE("1"), DONE("10"), DONE("20"), REJECT("", "3"), REJECT("2", "1"), REJECT("", "-"),
        REJECT("", "0"), REJECT("1", " "),
    };
    check_cases("{\"type\":\"integer\",\"minimum\":10,\"maximum\":20}", teens, N_OF(teens));
    static const jc_case positive[] = {DONE("1"), DONE("99999999999"), REJECT("", "0"),
                                       REJECT("", "-")};
    check_cases("{\"type\":\"integer\",\"exclusiveMinimum\":0}", positive, N_OF(positive));
    check_cases("{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":true}", positive,
                N_OF(positive));
    check_cases("{\"type\":\"integer\",\"minimum\":0.5}", positive, N_OF(positive));
    static const jc_case halves[] = {DONE("1"), DONE("2"), REJECT("", "0"), REJECT("", "3"),
                                     REJECT("2", "0")};
    check_cases("{\"type\":\"integer\",\"exclusiveMinimum\":0.5,\"exclusiveMaximum\":2.5}", halves,
                N_OF(halves));
    check_cases("{\"type\":\"integer\",\"minimum\":1,\"maximum\":3,\"exclusiveMaximum\":true}",
                halves, N_OF(halves));
    static const jc_case bottom[] = {
        DONE("-9223372036854775808"), DONE("-9223372036854775800"), VIABLE("-922337203685477580"),
        REJECT("-922337203685477580", "9"), REJECT("-9", "1"), REJECT("", "1"),
        REJECT("-9223372036854775", "7"), VIABLE("-9223372036854775"),
    };
    check_cases("{\"type\":\"integer\",\"minimum\":-9223372036854775808,"
                "\"maximum\":-9223372036854775800}", bottom, N_OF(bottom));
    static const jc_case top[] = {DONE("9223372036854775807"), DONE("0"), DONE("-0"),
                                  REJECT("922337203685477580", "8"), REJECT("-", "1")};
    check_cases("{\"type\":\"integer\",\"minimum\":0,\"maximum\":1e300}", top, N_OF(top));
    /* another type beside the integers keeps its values; an empty range drops the integers */
    static const jc_case mixed[] = {DONE("\"x\""), DONE("4"), REJECT("", "5"), REJECT("-", "1")};
    check_cases("{\"type\":[\"integer\",\"string\"],\"minimum\":0,\"maximum\":4}", mixed,
                N_OF(mixed));
    static const jc_case none[] = {DONE("\"x\""), REJECT("", "4")};
    check_cases("{\"type\":[\"integer\",\"string\"],\"minimum\":5,\"maximum\":4}", none, N_OF(none));
    /* bounds assert nothing on other types; enum values outside the range are dropped */
    static const jc_case str[] = {DONE("\"ab\""), REJECT("", "1")};
    check_cases("{\"type\":\"string\",\"minimum\":3}", str, N_OF(str));
    static const jc_case en[] = {DONE("2"), DONE("3"), REJECT("", "1")};
    check_cases("{\"type\":\"integer\",\"minimum\":2,\"enum\":[1,2,3,\"a\"]}", en, N_OF(en));
}

/* Every text of up to 7 bytes of "-0123456789" under a range within +-999999, walked as a tree
 * (a rejected text's extensions are not fed): accepted exactly when it begins the decimal
 * form of a member ("-0" being 0), done exactly when it is one. */
static uint8_t *range_marks; /* [12^7]: bit 0 a prefix of a member's text, bit 1 a member's */

static uint32_t range_code(const char *t, size_t n)
{
    uint32_t c = 0;
    for (size_t i = 0; i < n; i++)
        c = c * 12 + (t[i] == '-' ? 1u : (uint32_t)(t[i] - '0') + 2);
    return c;
}

static void range_mark(const char *t)
{
    size_t n = strlen(t);
    for (size_t i = 1; i <= n; i++)
        range_marks[range_code(t, i)] |= 1;
    range_marks[range_code(t, n)] |= 2;
}

static void range_walk(const jc_schema *s, const uint8_t *st, char *t, size_t n, uint64_t *fed)
{
    static const char alphabet[] = "-0123456789";
    const size_t size = jc_state_size(s);
    uint8_t *next = malloc(size);
    assert_non_null(next);
    for (size_t i = 0; i < sizeof alphabet - 1; i++) {
        t[n] = alphabet[i];
        jc_state_copy(s, next, st);
        const uint8_t b = (uint8_t)t[n];
        const bool ok = jc_feed(s, next, &b, 1), want = range_marks[range_code(t, n + 1)] & 1;
        (*fed)++;
        if (ok != want)
            fail_msg("text %.*s: accepted %d, expected %d", (int)n + 1, t, ok, want);
        if (!ok)
            continue;
        if (jc_done(s, next) != ((range_marks[range_code(t, n + 1)] & 2) != 0))
            fail_msg("text %.*s: done %d, expected %d", (int)n + 1, t, !jc_done(s, next),
                     jc_done(s, next));
        if (n + 1 < 7)
            range_walk(s, next, t, n + 1, fed);
    }
    free(next);
}

static void integer_ranges_accept_exactly_the_prefixes_of_their_members(void **state)
{
    (void)state;
    static const int64_t ranges[][2] = {{-5, 120},  {10, 20},    {0, 0},         {-7, -3},
                                        {100, 100}, {1, 999999}, {-999999, -1},  {37, 4210},
                                        {-4210, -37}, {0, 9},    {-1, 1},        {-999999, 999999},
                                        {-20, -10}, {5, 50000},  {-6543, 98}};
    range_marks = malloc(35831808); /* 12^7 */
    assert_non_null(range_marks);
    for (size_t r = 0; r < N_OF(ranges); r++) {
        const int64_t lo = ranges[r][0], hi = ranges[r][1];
        memset(range_marks, 0, 35831808);
        char t[16], schema[128];
        for (int64_t v = lo; v <= hi; v++) {
            snprintf(t, sizeof t, "%lld", (long long)v);
            range_mark(t);
        }
        if (lo <= 0 && hi >= 0)
            range_mark("-0");
        /* the two ends written as the other bound forms say the same range */
        const char *forms[] = {"{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}",
                               "{\"type\":\"integer\",\"exclusiveMinimum\":%lld,"
                               "\"exclusiveMaximum\":%lld}"};
        for (int f = 0; f < 2; f++) {
            snprintf(schema, sizeof schema, forms[f], (long long)(lo - f), (long long)(hi + f));
            jc_schema *s = compile_ok(schema);
            uint8_t *st = malloc(jc_state_size(s));
            assert_non_null(st);
            jc_state_init(s, st);
            uint64_t fed = 0;
            range_walk(s, st, t, 0, &fed);
            assert_true(fed >= 11);
            free(st);
            jc_schema_free(s);
        }
    }
    free(range_marks);
}

/* Bounds where reals are allowed: a number is what strtod reads (the nearest double), so 0.1
 * meets minimum 0.1 and so does any text that reads as that double; no exponent. */
static void number_ranges_compare_what_the_text_reads_as(void **state)
{
    (void)state;
    static const jc_case unit[] = {
        DONE("0"), DONE("1"), DONE("0.5"), DONE("1.0"), DONE("1.000"), DONE("-0"), DONE("-0.0"),
        DONE("0.999"), VIABLE("0."), VIABLE("-0."), VIABLE("-"), REJECT("1.0", "1"),
        REJECT("1", "1"), REJECT("", "2"), REJECT("-0.", "1"), REJECT("-", "1"),
        REJECT("0.5", "e"), REJECT("1", "e"),
    };
    check_cases("{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", unit, N_OF(unit));
    /* 0.1 is 0.1000000000000000055511151231257827...; texts from the midpoint with the double
     * below (0.09999999999999999861...) read as it */
    static const jc_case tenth[] = {
        DONE("0.1"), DONE("0.10000"), DONE("7"), DONE("0.09999999999999999862"),
        VIABLE("0.0999999999999999986"), REJECT("0.0", "8"),
        REJECT("0.09999999999999999", "7"), REJECT("", "-"),
    };
    check_cases("{\"type\":\"number\",\"minimum\":0.1}", tenth, N_OF(tenth));
    static const jc_case open[] = {DONE("0.5"), DONE("0.0001"), REJECT("", "1"), REJECT("0", " "),
                                   REJECT("", "-"), VIABLE("0.000")};
    check_cases("{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1}", open,
                N_OF(open));
    static const jc_case neg[] = {DONE("-2.5"), DONE("13.25"), DONE("-0.0"), DONE("13"),
                                  REJECT("-2.5", "1"), REJECT("13.2", "6"), REJECT("2", "0"),
                                  REJECT("-", "3")};
    check_cases("{\"type\":[\"number\",\"null\"],\"minimum\":-2.5,\"maximum\":13.25}", neg,
                N_OF(neg));
}

/* Every valid number text of up to two integer and three fraction digits under eight ranges:
 * accepted whole and done exactly when strtod reads it inside the range; and every text of up
 * to 6 bytes of "-0123456789." that the matcher accepts is the beginning of such a number. */
typedef struct real_range {
    const char *schema;
    double lo, hi;         /* what the text may read as */
    bool lo_open, hi_open; /* ends excluded */
    bool integer;          /* type "integer": ilo..ihi exactly instead */
    int64_t ilo, ihi;
} real_range;

static bool real_in(const real_range *r, double x)
{
    return (r->lo_open ? x > r->lo : x >= r->lo) && (r->hi_open ? x < r->hi : x <= r->hi);
}

/* Whether a done text is inside r as a reader takes it: strtod, or an exact int64. */
static bool real_text_in(const real_range *r, const char *t)
{
    errno = 0;
    const long long v = strtoll(t, NULL, 10);
    if (!r->integer) /* an integer's text must fit int64 for jansson, a real's need not */
        return (strchr(t, '.') || errno == 0) && real_in(r, strtod(t, NULL));
    return errno == 0 && v >= r->ilo && v <= r->ihi;
}

static bool real_done_text(const jc_schema *s, uint8_t *st, const char *t)
{
    jc_state_init(s, st);
    return jc_feed(s, st, (const uint8_t *)t, strlen(t)) && jc_done(s, st);
}

/* Whether text[0..n) (accepted) extends to a done number that strtod reads inside r, trying at
 * each byte the greatest and the least digit the matcher takes and '.', within *budget steps. */
static bool real_complete(const jc_schema *s, const real_range *r, char *text, int n, int *budget)
{
    uint8_t st[512];
    assert_true(jc_state_size(s) <= sizeof st);
    text[n] = 0;
    if (real_done_text(s, st, text))
        return real_text_in(r, text);
    if (n >= JC_NUMBER_MAX || --*budget < 0)
        return false;
    char tries[3];
    int n_try = 0;
    for (int hi = 1; hi >= 0; hi--)
        for (int k = 0; k < 10; k++) {
            const char d = (char)(hi ? '9' - k : '0' + k);
            text[n] = d;
            text[n + 1] = 0;
            jc_state_init(s, st);
            if (jc_feed(s, st, (const uint8_t *)text, (size_t)n + 1)) {
                if (n_try == 0 || tries[n_try - 1] != d)
                    tries[n_try++] = d;
                break;
            }
        }
    tries[n_try++] = '.';
    for (int i = 0; i < n_try; i++) {
        text[n] = tries[i];
        text[n + 1] = 0;
        jc_state_init(s, st);
        if (jc_feed(s, st, (const uint8_t *)text, (size_t)n + 1) &&
            real_complete(s, r, text, n + 1, budget))
            return true;
    }
    return false;
}

static void number_ranges_accept_exactly_the_numbers_that_read_inside(void **state)
{
    (void)state;
    static const real_range ranges[] = {
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}",
         0, 1, false, false, false, 0, 0},
        {"{\"type\":\"number\",\"minimum\":0.1,\"maximum\":0.3}",
         0.1, 0.3, false, false, false, 0, 0},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1}",
         0, 1, true, true, false, 0, 0},
        {"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":13.25}",
         -2.5, 13.25, false, false, false, 0, 0},
        {"{\"type\":\"number\",\"minimum\":-0.001,\"maximum\":0.001}",
         -0.001, 0.001, false, false, false, 0, 0},
        {"{\"type\":\"number\",\"minimum\":10,\"exclusiveMaximum\":10.5}",
         10, 10.5, false, true, false, 0, 0},
        {"{\"type\":\"number\",\"exclusiveMinimum\":-7.125,\"maximum\":-0.5}",
         -7.125, -0.5, true, false, false, 0, 0},
        {"{\"type\":\"number\",\"minimum\":0.7,\"maximum\":0.7}",
         0.7, 0.7, false, false, false, 0, 0},
    };
    for (size_t r = 0; r < N_OF(ranges); r++) {
        jc_schema *s = compile_ok(ranges[r].schema);
        uint8_t *st = malloc(jc_state_size(s));
        assert_non_null(st);
        char t[16];
        int members = 0;
        for (int neg = 0; neg < 2; neg++)
            for (int ip = 0; ip < 100; ip++)
                for (int fd = 0; fd <= 3; fd++)
                    for (int f = 0; f < (fd ? (fd == 1 ? 10 : fd == 2 ? 100 : 1000) : 1); f++) {
                        if (fd)
                            snprintf(t, sizeof t, "%s%d.%0*d", neg ? "-" : "", ip, fd, f);
                        else
                            snprintf(t, sizeof t, "%s%d", neg ? "-" : "", ip);
                        const bool in = real_in(&ranges[r], strtod(t, NULL));
                        members += in;
                        if (real_done_text(s, st, t) != in)
                            fail_msg("%s, %s: done %d, reads inside %d", ranges[r].schema, t, !in,
                                     in);
                    }
        assert_true(members >= 1);
        /* the matcher's accepted texts of up to 6 bytes each begin a member it accepts */
        static const char alphabet[] = "-0123456789.";
        for (uint32_t code = 0; code < 12u * 12 * 12 * 12 * 12 * 12; code++) {
            int n = 0;
            for (uint32_t c = code; n < 6; c /= 12)
                t[n++] = alphabet[c % 12];
            t[n] = 0;
            jc_state_init(s, st);
            if (!jc_feed(s, st, (const uint8_t *)t, 6))
                continue;
            /* a completion the matcher steers (the greatest or least digit it takes, or a
             * '.'), which strtod must read inside the range */
            char done[80];
            memcpy(done, t, 7);
            int budget = 20000;
            const bool found = real_complete(s, &ranges[r], done, 6, &budget);
            if (!found)
                fail_msg("%s: \"%s\" accepted but no number inside the range begins with it",
                         ranges[r].schema, t);
        }
        free(st);
        jc_schema_free(s);
    }
}

/* Random ranges of integers and reals (ends near powers of ten from 1e-9 to 1e18, spans from
 * nothing to huge, open or closed, either end absent) against numbers written near their ends:
 * a text is done exactly when a reader takes it inside (strtod, or the exact integer), and a
 * text cut short by the matcher was cut where some number of the range still began. */
/* xorshift64: a number below n */
static uint32_t rng_below(uint64_t *x, uint32_t n)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return (uint32_t)(*x >> 32) % n;
}

static double rand_near(uint64_t *g, int e)
{
    const double m = (double)(rng_below(g, 1u << 30) + 1) / (double)(1u << 30);
    return (rng_below(g, 2) ? -1 : 1) * m * pow(10.0, e);
}

/* ,"kw":v with v an integer or the double's 17 significant digits */
static void bound_kw(char *out, size_t cap, const char *kw, double v, bool integer)
{
    if (integer)
        snprintf(out, cap, ",\"%s\":%lld", kw, (long long)v);
    else
        snprintf(out, cap, ",\"%s\":%.17g", kw, v);
}

static void random_ranges_agree_with_what_readers_read(void **state)
{
    (void)state;
    uint64_t g = 0x2545F4914F6CDD1Dull;
    for (int trial = 0; trial < 400; trial++) {
        const bool integer = rng_below(&g, 3) == 0;
        const int e = integer ? (int)rng_below(&g, 19) : (int)rng_below(&g, 28) - 9;
        double lo = rand_near(&g, e), hi;
        switch (rng_below(&g, 4)) {
        case 0: hi = lo; break;
        case 1: hi = nextafter(nextafter(lo, INFINITY), INFINITY); break;
        case 2: hi = lo + fabs(rand_near(&g, e - (int)rng_below(&g, 4))); break;
        default: hi = lo + fabs(rand_near(&g, e + (int)rng_below(&g, 3))); break;
        }
        if (integer) {
            lo = trunc(lo), hi = trunc(hi);
            if (fabs(lo) > 9e18 || fabs(hi) > 9e18)
                continue;
        }
        const bool lo_open = rng_below(&g, 3) == 0, hi_open = rng_below(&g, 3) == 0;
        const bool has_lo = rng_below(&g, 6) != 0, has_hi = rng_below(&g, 6) != 0;
        char schema[256], a[64] = "", b[64] = "";
        if (has_lo)
            bound_kw(a, sizeof a, lo_open ? "exclusiveMinimum" : "minimum", lo, integer);
        if (has_hi)
            bound_kw(b, sizeof b, hi_open ? "exclusiveMaximum" : "maximum", hi, integer);
        snprintf(schema, sizeof schema, "{\"type\":\"%s\"%s%s}", integer ? "integer" : "number",
                 a, b);
        real_range r = {schema, has_lo ? lo : -INFINITY, has_hi ? hi : INFINITY,
                        has_lo && lo_open, has_hi && hi_open, integer, INT64_MIN, INT64_MAX};
        if (integer && has_lo) /* |lo|, |hi| <= 9e18 here */
            r.ilo = (int64_t)lo + (lo_open ? 1 : 0);
        if (integer && has_hi)
            r.ihi = (int64_t)hi - (hi_open ? 1 : 0);
        const bool empty = integer ? r.ilo > r.ihi
                                   : (lo_open || hi_open ? !(r.lo < r.hi) : !(r.lo <= r.hi)) &&
                                         has_lo && has_hi;
        jc_schema *s = NULL;
        const td_err err = jc_compile(schema, strlen(schema), &s);
        if (empty) {
            if (err == TD_OK) /* an open range of adjacent doubles may still hold nothing */
                jc_schema_free(s);
            continue;
        }
        if (err != TD_OK)
            fail_msg("%s: %s", schema, err_msg());
        uint8_t *st = malloc(jc_state_size(s));
        assert_non_null(st);
        for (int k = 0; k < 120; k++) {
            /* a number near an end: the end's neighbours written with 1..20 significant digits,
             * or an integer next to it */
            const double at = rng_below(&g, 2) ? r.lo : r.hi;
            if (!isfinite(at))
                continue;
            double x = at;
            for (int m = (int)rng_below(&g, 7) - 3; m != 0; m += m < 0 ? 1 : -1)
                x = nextafter(x, m < 0 ? -INFINITY : INFINITY);
            char t[1200];
            if (integer) {
                snprintf(t, sizeof t, "%lld", (long long)trunc(x) + (long long)rng_below(&g, 5) - 2);
            } else if (rng_below(&g, 3) == 0) {
                /* the exact midpoint between x and a neighbour, where strtod's tie goes to the
                 * even one, or a unit of its last digit off it */
                const double y = nextafter(x, rng_below(&g, 2) ? INFINITY : -INFINITY);
                snprintf(t, sizeof t, "%.1100Lf", ((long double)x + (long double)y) / 2);
                size_t n = strlen(t);
                while (t[n - 1] == '0')
                    t[--n] = 0;
                if (t[n - 1] == '.') /* an integer midpoint: no fraction */
                    t[--n] = 0;
                const int nudge = (int)rng_below(&g, 3) - 1; /* -1, 0, +1 in the last digit */
                if (nudge && t[n - 1] != '.' && t[n - 1] + nudge >= '0' && t[n - 1] + nudge <= '9')
                    t[n - 1] = (char)(t[n - 1] + nudge);
            } else {
                snprintf(t, sizeof t, "%.*f", (int)rng_below(&g, 21),
                         x); /* fixed notation: a ranged number has no exponent */
            }
            if (strlen(t) > JC_NUMBER_MAX)
                continue;
            jc_state_init(s, st);
            const size_t n = strlen(t);
            size_t ok = 0;
            for (; ok < n; ok++)
                if (!jc_feed(s, st, (const uint8_t *)t + ok, 1))
                    break;
            const bool done = ok == n && jc_done(s, st);
            if (done != real_text_in(&r, t))
                fail_msg("%s, %s: done %d, inside %d", schema, t, done, !done);
            if (ok < n && ok > 0) { /* cut at byte ok: what it accepted still begins a member */
                char text[JC_NUMBER_MAX + 16];
                memcpy(text, t, ok);
                int budget = 20000;
                if (!real_complete(s, &r, text, (int)ok, &budget))
                    fail_msg("%s: \"%.*s\" accepted, but no number inside begins with it",
                             schema, (int)ok, t);
            }
        }
        free(st);
        jc_schema_free(s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(integer_ranges_reject_at_the_first_byte_no_member_follows),
        cmocka_unit_test(integer_ranges_accept_exactly_the_prefixes_of_their_members),
        cmocka_unit_test(number_ranges_compare_what_the_text_reads_as),
        cmocka_unit_test(number_ranges_accept_exactly_the_numbers_that_read_inside),
        cmocka_unit_test(random_ranges_agree_with_what_readers_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
