/* The JSON Schema compiler's number ranges (see jsonc_cc.h): minimum / maximum /
 * exclusiveMinimum / exclusiveMaximum become, per sign of the text, the least and greatest
 * magnitude (jc_side) the matcher in jsonc.c compares a number's digits with. Integers only:
 * exact int64 ends. With reals: the number is what a reader's strtod makes of it (the nearest
 * double, ties to even), so "0.1" meets minimum 0.1 although its decimal value is below that
 * double's; the ends are the midpoints between a bound's double and its neighbour, each
 * included when the tie rounds to the bound's side, then rounded inward to the fraction digits
 * a JC_NUMBER_MAX-byte number there can have (no such number lies between the two). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/jsonc_cc.h"

/* A bound keyword's number as the integer bound it makes: the least integer >= v (up: a lower
 * bound), else the greatest <= v, one further inward when exclusive. *out saturates at the
 * int64 ends; *empty when no int64 is on the right side of it. */
static void jcc_int_bound(const json_t *v, bool up, bool exclusive, int64_t *out, bool *empty)
{
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (exclusive && i == (up ? INT64_MAX : INT64_MIN))
            *empty = true;
        *out = exclusive ? (up ? i + (i != INT64_MAX) : i - (i != INT64_MIN)) : i;
        return;
    }
    const double d = json_real_value(v), r = up ? ceil(d) : floor(d);
    const double b = exclusive && r == d ? (up ? r + 1 : r - 1) : r;
    /* 2^63 is the first double past INT64_MAX; -2^63 is INT64_MIN itself */
    if (b >= 9223372036854775808.0) {
        *empty = *empty || up;
        *out = INT64_MAX;
    } else if (b < -9223372036854775808.0) {
        *empty = *empty || !up;
        *out = INT64_MIN;
    } else {
        *out = (int64_t)b;
    }
}

/* A bound keyword's number as the least (up) or greatest double a number read as a double may
 * be: the double itself, or the next one inward when exclusive; an integer bound that no double
 * equals, the nearest double inward. */
static double jcc_real_bound(const json_t *v, bool up, bool exclusive)
{
    const double dir = up ? INFINITY : -INFINITY;
    if (json_is_integer(v)) {
        const json_int_t i = json_integer_value(v);
        double d = (double)i;
        if (up ? (long double)d < (long double)i : (long double)d > (long double)i)
            d = nextafter(d, dir);
        if (exclusive && (long double)d == (long double)i)
            d = nextafter(d, dir);
        return d;
    }
    const double d = json_real_value(v);
    return exclusive ? nextafter(d, dir) : d;
}

/* A magnitude's digits being worked on: d[0] is a spare leading zero for a carry, then the
 * integer digits, then the fraction's. */
typedef struct jcc_mag {
    char d[1600];
    int n_int, n_frac; /* digits after the spare one */
} jcc_mag;

/* From printf's "%.NLf" text of a non-negative value (or an unsigned integer's "%llu"). */
static void jcc_mag_of(jcc_mag *m, const char *text)
{
    const char *dot = strchr(text, '.');
    size_t ni = dot ? (size_t)(dot - text) : strlen(text), nf = dot ? strlen(dot + 1) : 0;
    while (ni > 0 && *text == '0')
        text++, ni--;
    if (ni + nf + 1 > sizeof m->d)
        nf = sizeof m->d - 1 - ni; /* not reached: doubles' expansions are shorter */
    m->d[0] = '0';
    memcpy(m->d + 1, text, ni);
    memcpy(m->d + 1 + ni, dot ? dot + 1 : "", nf);
    m->n_int = (int)ni, m->n_frac = (int)nf;
    while (m->n_frac > 0 && m->d[m->n_int + m->n_frac] == '0')
        m->n_frac--;
}

/* a <=> b */
static int jcc_mag_cmp(const jcc_mag *a, const jcc_mag *b)
{
    if (a->n_int != b->n_int)
        return a->n_int < b->n_int ? -1 : 1;
    const int n = a->n_int + (a->n_frac > b->n_frac ? a->n_frac : b->n_frac);
    for (int i = 1; i <= n; i++) {
        const char x = i <= a->n_int + a->n_frac ? a->d[i] : '0';
        const char y = i <= b->n_int + b->n_frac ? b->d[i] : '0';
        if (x != y)
            return x < y ? -1 : 1;
    }
    return 0;
}

/* Rounds m inward (up: a least magnitude, rounded up; else down) to at most f fraction digits,
 * so that the numbers of at most f fraction digits it admits are the same; an end that is not
 * included moves one unit of digit f inward. False when a greatest magnitude would go below 0. */
static bool jcc_mag_round(jcc_mag *m, int f, bool up, bool incl)
{
    const bool cut = m->n_frac > f;
    if (cut)
        m->n_frac = f;
    if (up ? (cut || !incl) : (!cut && !incl)) {
        for (int i = m->n_int + m->n_frac + 1; i <= m->n_int + f; i++)
            m->d[i] = '0'; /* the fraction padded to f digits */
        m->n_frac = f;
        int i = m->n_int + f;
        if (up) {
            for (; i > 0 && m->d[i] == '9'; i--)
                m->d[i] = '0';
            m->d[i]++; /* d[0], always '0', takes the last carry */
        } else {
            for (; i > 0 && m->d[i] == '0'; i--)
                m->d[i] = '9';
            if (i == 0)
                return false;
            m->d[i]--;
        }
    }
    if (m->d[0] != '0') { /* the carry made a new integer digit */
        memmove(m->d + 1, m->d, (size_t)(m->n_int + m->n_frac + 1));
        m->d[0] = '0';
        m->n_int++;
    }
    while (m->n_int > 0 && m->d[1] == '0') {
        memmove(m->d + 1, m->d + 2, (size_t)(m->n_int + m->n_frac - 1));
        m->n_int--;
    }
    while (m->n_frac > 0 && m->d[m->n_int + m->n_frac] == '0')
        m->n_frac--;
    return true;
}

static td_err jcc_dec_put(jcc *c, const jcc_mag *m, jc_dec *out)
{
    out->n_int = (uint16_t)m->n_int, out->n_frac = (uint16_t)m->n_frac;
    return jcc_pool_add(c, m->d + 1, (size_t)(m->n_int + m->n_frac), &out->off);
}

/* One sign's magnitudes [lo, hi] (has_lo / has_hi false: unbounded) into side; neg: the text
 * has a '-'. lo and hi are exact; incl_*: whether each end itself is in the range. */
static td_err jcc_side(jcc *c, jc_side *side, bool neg, bool has_lo, long double lo,
                       bool incl_lo, bool has_hi, long double hi, bool incl_hi)
{
    jcc_mag a, b;
    char text[1700];
    const int room = JC_NUMBER_MAX - (neg ? 1 : 0); /* digits and '.' of one number */
    memset(side, 0, sizeof *side);
    if (has_lo && lo > 0) {
        snprintf(text, sizeof text, "%.1100Lf", lo);
        jcc_mag_of(&a, text);
        const int ni = a.n_int > 0 ? a.n_int : 1;
        if (ni > room)
            return TD_OK; /* no number of this sign is that large */
        jcc_mag_round(&a, ni + 1 < room ? room - ni - 1 : 0, true, incl_lo);
    } else {
        jcc_mag_of(&a, "0");
    }
    side->inf = !has_hi;
    if (has_hi) {
        snprintf(text, sizeof text, "%.1100Lf", hi);
        jcc_mag_of(&b, text);
        const int ni = b.n_int > 0 ? b.n_int : 1;
        if (ni > room) {
            side->inf = 1; /* every number of this sign is smaller */
        } else if (!jcc_mag_round(&b, ni + 1 < room ? room - ni - 1 : 0, false, incl_hi) ||
                   jcc_mag_cmp(&a, &b) > 0) {
            return TD_OK;
        }
    }
    side->ok = 1;
    TD_TRY(jcc_dec_put(c, &a, &side->lo));
    return side->inf ? TD_OK : jcc_dec_put(c, &b, &side->hi);
}

static bool jcc_even(double d)
{
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    return (bits & 1) == 0;
}

/* minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers; draft 4's boolean
 * exclusiveMinimum / exclusiveMaximum make minimum / maximum strict). They bind only numbers:
 * with no number type in mask they assert nothing. A range with no number takes the number
 * types out of *mask. */
td_err jcc_bounds(jcc *c, json_t *j, jc_node *n, uint8_t *mask)
{
    static const char *const kw[] = {"minimum", "maximum", "exclusiveMinimum",
                                     "exclusiveMaximum"};
    json_t *v[4];
    bool any = false;
    for (int i = 0; i < 4; i++) {
        v[i] = json_object_get(j, kw[i]);
        if (v[i] && !json_is_number(v[i]) && !(i >= 2 && json_is_boolean(v[i])))
            return err_set(TD_EINVAL, "schema %s/%s: must be a number", c->path, kw[i]);
        any = any || (v[i] && json_is_number(v[i]));
    }
    if (!any || !(*mask & (JT_INT | JT_FRAC)))
        return TD_OK;
    n->has_range = 1;
    if (!(*mask & JT_FRAC)) { /* integers only: exact */
        int64_t lo = INT64_MIN, hi = INT64_MAX, b;
        bool empty = false;
        for (int i = 0; i < 4; i++) {
            if (!v[i] || !json_is_number(v[i]))
                continue;
            const bool up = i % 2 == 0; /* minimum, exclusiveMinimum: a lower bound */
            jcc_int_bound(v[i], up, i >= 2 || json_is_true(v[i + 2]), &b, &empty);
            if (up && b > lo)
                lo = b;
            if (!up && b < hi)
                hi = b;
        }
        if (empty || lo > hi) {
            *mask &= (uint8_t)~JT_INT;
            return TD_OK;
        }
        n->int_min = lo, n->int_max = hi;
        /* -x of a negative int64 as a magnitude, INT64_MIN included */
        const uint64_t mlo = lo < 0 ? (uint64_t)(-(lo + 1)) + 1 : 0;
        const uint64_t mhi = hi < 0 ? (uint64_t)(-(hi + 1)) + 1 : 0;
        if (hi >= 0)
            TD_TRY(jcc_side(c, &n->sides[0], false, lo > 0, lo > 0 ? (long double)lo : 0, true,
                            true, (long double)hi, true));
        if (lo <= 0)
            TD_TRY(jcc_side(c, &n->sides[1], true, hi < 0, (long double)mhi, true, true,
                            (long double)mlo, true));
        /* (an int64 is exact in a long double, so the sides' digits are the integers') */
        return TD_OK;
    }
    double lo = -INFINITY, hi = INFINITY;
    for (int i = 0; i < 4; i++) {
        if (!v[i] || !json_is_number(v[i]))
            continue;
        const bool up = i % 2 == 0;
        const double b = jcc_real_bound(v[i], up, i >= 2 || json_is_true(v[i + 2]));
        if (up && b > lo)
            lo = b;
        if (!up && b < hi)
            hi = b;
    }
    if (lo > hi) {
        *mask &= (uint8_t)~(JT_INT | JT_FRAC);
        return TD_OK;
    }
    n->num_min = lo, n->num_max = hi;
    /* the texts that read as lo or more: from the midpoint below lo; as hi or less: up to the
     * midpoint above hi (a tie goes to the even neighbour). Beyond +-DBL_MAX: no end. */
    const double below = nextafter(lo, -INFINITY), above = nextafter(hi, INFINITY);
    const bool has_lo = lo > -INFINITY && below > -INFINITY;
    const bool has_hi = hi < INFINITY && above < INFINITY;
    const long double elo = has_lo ? ((long double)below + (long double)lo) / 2 : 0;
    const long double ehi = has_hi ? ((long double)hi + (long double)above) / 2 : 0;
    const bool ilo = jcc_even(lo), ihi = jcc_even(hi);
    if (!has_hi || ehi > 0)
        TD_TRY(jcc_side(c, &n->sides[0], false, has_lo && elo > 0, elo, ilo, has_hi, ehi, ihi));
    if (!has_lo || elo < 0)
        TD_TRY(jcc_side(c, &n->sides[1], true, has_hi && ehi < 0, -ehi, ihi, has_lo, -elo, ilo));
    if (!n->sides[0].ok && !n->sides[1].ok)
        *mask &= (uint8_t)~(JT_INT | JT_FRAC);
    return TD_OK;
}
