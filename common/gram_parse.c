/* GBNF grammars and regular expressions into rules (common/gram.h). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/gram_int.h"

#define GM_NEST_MAX 100 /* groups inside groups (the parsers recurse per group) */

/* --- building rules ----------------------------------------------------------------------- */

td_err gb_push(gm_build *b, gm_seq *s, uint32_t kind, uint32_t lo, uint32_t hi)
{
    if (b->total >= GM_ELEMENTS_MAX)
        return err_set(TD_ENOTSUP, "the grammar needs more than %d elements (quantifiers are "
                       "written out)", GM_ELEMENTS_MAX);
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        gm_el *el = realloc(s->el, cap * sizeof *el);
        if (!el)
            return err_set(TD_ENOMEM, "out of memory for a grammar");
        s->el = el;
        s->cap = cap;
    }
    s->el[s->n++] = (gm_el){kind, lo, hi};
    b->total++;
    return TD_OK;
}

td_err gb_rule(gm_build *b, const char *name, size_t len, int32_t owner, int32_t *id)
{
    if (b->n_rules == b->cap_rules) {
        int32_t cap = b->cap_rules ? 2 * b->cap_rules : 16;
        gm_seq *body = realloc(b->body, (size_t)cap * sizeof *body);
        if (body)
            b->body = body;
        char **nm = body ? realloc(b->name, (size_t)cap * sizeof *nm) : NULL;
        if (nm)
            b->name = nm;
        int32_t *ow = nm ? realloc(b->owner, (size_t)cap * sizeof *ow) : NULL;
        if (ow)
            b->owner = ow;
        bool *def = ow ? realloc(b->defined, (size_t)cap * sizeof *def) : NULL;
        if (!def)
            return err_set(TD_ENOMEM, "out of memory for a grammar");
        b->defined = def;
        b->cap_rules = cap;
    }
    char *nm = NULL;
    if (name) {
        nm = malloc(len + 1);
        if (!nm)
            return err_set(TD_ENOMEM, "out of memory for a grammar");
        memcpy(nm, name, len);
        nm[len] = 0;
    }
    const int32_t r = b->n_rules++;
    b->body[r] = (gm_seq){0};
    b->name[r] = nm;
    b->owner[r] = owner < 0 ? r : owner;
    b->defined[r] = false;
    *id = r;
    return TD_OK;
}

int32_t gb_find(const gm_build *b, const char *name, size_t len)
{
    for (int32_t r = 0; r < b->n_rules; r++)
        if (b->name[r] && strlen(b->name[r]) == len && memcmp(b->name[r], name, len) == 0)
            return r;
    return -1;
}

td_err gb_named(gm_build *b, const char *name, size_t len, int32_t *id)
{
    *id = gb_find(b, name, len);
    return *id >= 0 ? TD_OK : gb_rule(b, name, len, -1, id);
}

void gb_truncate(gm_build *b, int32_t n_rules)
{
    for (int32_t r = n_rules; r < b->n_rules; r++) {
        b->total -= b->body[r].n;
        free(b->body[r].el);
        free(b->name[r]);
    }
    b->n_rules = n_rules;
}

void gb_free(gm_build *b)
{
    for (int32_t r = 0; r < b->n_rules; r++) {
        free(b->body[r].el);
        free(b->name[r]);
    }
    free(b->body);
    free(b->name);
    free(b->owner);
    free(b->defined);
    memset(b, 0, sizeof *b);
}

static td_err gb_append(gm_build *b, int32_t rule, const gm_el *item, size_t n)
{
    for (size_t i = 0; i < n; i++)
        TD_TRY(gb_push(b, &b->body[rule], item[i].kind, item[i].lo, item[i].hi));
    return TD_OK;
}

td_err gb_repeat(gm_build *b, int32_t rule, size_t start, long min, long max)
{
    gm_seq *s = &b->body[rule];
    const size_t n = s->n - start;
    TD_ASSERT(n > 0 && min >= 0 && (max < 0 || max >= min));
    gm_el *item = malloc(n * sizeof *item);
    if (!item)
        return err_set(TD_ENOMEM, "out of memory for a grammar");
    memcpy(item, s->el + start, n * sizeof *item);
    s->n = start;
    b->total -= n;
    const int32_t owner = b->owner[rule];
    td_err e = TD_OK;
    for (long i = 0; i < min && e == TD_OK; i++)
        e = gb_append(b, rule, item, n);
    if (e == TD_OK && max < 0) { /* rep ::= item rep | (nothing) */
        int32_t r;
        e = gb_rule(b, NULL, 0, owner, &r);
        if (e == TD_OK)
            e = gb_append(b, r, item, n);
        if (e == TD_OK)
            e = gb_push(b, &b->body[r], GM_REF, (uint32_t)r, 0);
        if (e == TD_OK)
            e = gb_push(b, &b->body[r], GM_ALT, 0, 0);
        if (e == TD_OK)
            e = gb_push(b, &b->body[r], GM_END, 0, 0);
        if (e == TD_OK)
            e = gb_push(b, &b->body[rule], GM_REF, (uint32_t)r, 0);
    } else if (e == TD_OK && max > min) { /* opt_i ::= item opt_(i+1) | (nothing) */
        int32_t first = -1, prev = -1;
        for (long i = min; i < max && e == TD_OK; i++) {
            int32_t r;
            e = gb_rule(b, NULL, 0, owner, &r);
            if (e == TD_OK)
                e = gb_append(b, r, item, n);
            if (e == TD_OK && prev >= 0) /* prev's body: item, then this one */
                e = gb_push(b, &b->body[prev], GM_REF, (uint32_t)r, 0);
            if (e == TD_OK && prev >= 0)
                e = gb_push(b, &b->body[prev], GM_ALT, 0, 0);
            if (e == TD_OK && prev >= 0)
                e = gb_push(b, &b->body[prev], GM_END, 0, 0);
            first = first < 0 ? r : first;
            prev = r;
        }
        if (e == TD_OK)
            e = gb_push(b, &b->body[prev], GM_ALT, 0, 0);
        if (e == TD_OK)
            e = gb_push(b, &b->body[prev], GM_END, 0, 0);
        if (e == TD_OK)
            e = gb_push(b, &b->body[rule], GM_REF, (uint32_t)first, 0);
    }
    free(item);
    return e;
}

/* --- character sets ----------------------------------------------------------------------- */

td_err gm_syntax(const gm_src *x, const char *what)
{
    int line = 1, col = 1;
    for (const char *q = x->s; q < x->p; q++) {
        col = *q == '\n' ? 1 : col + 1;
        line += *q == '\n';
    }
    if (x->regex && !x->lark)
        return err_set(TD_EINVAL, "regular expression, at byte %td: %s", x->p - x->s, what);
    return err_set(TD_EINVAL, "grammar, line %d, column %d: %s", line, col, what);
}

td_err gm_range_add(const gm_src *x, gm_ranges *r, uint32_t lo, uint32_t hi)
{
    if (lo > hi)
        return gm_syntax(x, "a character range goes backwards");
    if (r->n == (int)(sizeof r->lo / sizeof r->lo[0]))
        return err_set(TD_ENOTSUP, "a character class of more than %zu ranges",
                       sizeof r->lo / sizeof r->lo[0]);
    r->lo[r->n] = lo;
    r->hi[r->n++] = hi;
    return TD_OK;
}

/* Sorted, overlapping and touching ranges merged. */
static void gm_ranges_merge(gm_ranges *r)
{
    for (int i = 1; i < r->n; i++) /* insertion sort: classes are short */
        for (int j = i; j > 0 && r->lo[j] < r->lo[j - 1]; j--) {
            uint32_t t = r->lo[j];
            r->lo[j] = r->lo[j - 1], r->lo[j - 1] = t;
            t = r->hi[j];
            r->hi[j] = r->hi[j - 1], r->hi[j - 1] = t;
        }
    int m = 0;
    for (int i = 0; i < r->n; i++) {
        if (m > 0 && r->lo[i] <= r->hi[m - 1] + 1) {
            r->hi[m - 1] = r->hi[i] > r->hi[m - 1] ? r->hi[i] : r->hi[m - 1];
            continue;
        }
        r->lo[m] = r->lo[i];
        r->hi[m++] = r->hi[i];
    }
    r->n = m;
}

/* --- case classes (Python's re.IGNORECASE) ------------------------------------------------- */

/* Characters whose simple case mappings tie them to another: a class is every character with
 * the same lower(upper(c)), so k, K and the Kelvin sign are one, s, S and the long s another.
 * 1456 characters map elsewhere and 1424 are mapped to (Unicode 15, utf8proc 2.9). */
#define GM_CASED_MAX 4096

typedef struct gm_cased {
    uint32_t cp, key;
} gm_cased;

static gm_cased gm_by_cp[GM_CASED_MAX], gm_by_key[GM_CASED_MAX];
static int gm_n_cased;
static pthread_once_t gm_cased_once = PTHREAD_ONCE_INIT;

static uint32_t gm_case_key(uint32_t cp)
{
    return (uint32_t)utf8proc_tolower(utf8proc_toupper((utf8proc_int32_t)cp));
}

static int gm_cased_cmp_key(const void *a, const void *b)
{
    const gm_cased *p = a, *q = b;
    return p->key != q->key ? (p->key < q->key ? -1 : 1) : (p->cp > q->cp) - (p->cp < q->cp);
}

static void gm_cased_build(void)
{
    static uint8_t is_key[(GM_CP_MAX + 1) / 8];
    for (uint32_t cp = 0; cp <= GM_CP_MAX; cp++) {
        const uint32_t key = gm_case_key(cp);
        if (key != cp)
            is_key[key / 8] |= (uint8_t)(1u << key % 8);
    }
    int n = 0;
    for (uint32_t cp = 0; cp <= GM_CP_MAX; cp++) { /* in order of cp */
        const uint32_t key = gm_case_key(cp);
        if (key == cp && !(is_key[cp / 8] >> cp % 8 & 1))
            continue;
        TD_ASSERT(n < GM_CASED_MAX);
        gm_by_cp[n++] = (gm_cased){cp, key};
    }
    memcpy(gm_by_key, gm_by_cp, (size_t)n * sizeof *gm_by_key);
    qsort(gm_by_key, (size_t)n, sizeof *gm_by_key, gm_cased_cmp_key);
    gm_n_cased = n;
}

/* The first entry of v[0..n) whose field (cp or key) is >= at. */
static int gm_cased_lower_bound(const gm_cased *v, int n, bool by_key, uint32_t at)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if ((by_key ? v[mid].key : v[mid].cp) < at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Adds [lo, hi] to r, merging r's ranges first when it is full. */
static td_err gm_range_add_merging(const gm_src *x, gm_ranges *r, uint32_t lo, uint32_t hi)
{
    if (r->n == (int)(sizeof r->lo / sizeof r->lo[0]))
        gm_ranges_merge(r);
    return gm_range_add(x, r, lo, hi);
}

td_err gm_range_add_folded(const gm_src *x, gm_ranges *r, uint32_t lo, uint32_t hi)
{
    TD_TRY(gm_range_add_merging(x, r, lo, hi));
    pthread_once(&gm_cased_once, gm_cased_build);
    for (int i = gm_cased_lower_bound(gm_by_cp, gm_n_cased, false, lo);
         i < gm_n_cased && gm_by_cp[i].cp <= hi; i++) {
        const uint32_t key = gm_by_cp[i].key;
        for (int j = gm_cased_lower_bound(gm_by_key, gm_n_cased, true, key);
             j < gm_n_cased && gm_by_key[j].key == key; j++) {
            const uint32_t c = gm_by_key[j].cp;
            if (x->ascii && (c >= 0x80 || gm_by_cp[i].cp >= 0x80))
                continue;
            if (c < lo || c > hi)
                TD_TRY(gm_range_add_merging(x, r, c, c));
        }
    }
    return TD_OK;
}

td_err gm_set_emit(gm_build *b, int32_t rule, gm_ranges *r)
{
    gm_ranges_merge(r);
    if (r->n == 0) /* [^] : any character; [] was refused while parsing */
        return gb_push(b, &b->body[rule], GM_CHAR, 0, GM_CP_MAX);
    for (int i = 0; i < r->n; i++)
        TD_TRY(gb_push(b, &b->body[rule], i ? GM_CHAR_ALT : r->neg ? GM_CHAR_NOT : GM_CHAR,
                       r->lo[i], r->hi[i]));
    return TD_OK;
}

td_err gm_char_emit(const gm_src *x, int32_t rule, uint32_t cp)
{
    gm_ranges r = {.n = 0};
    if (x->fold)
        TD_TRY(gm_range_add_folded(x, &r, cp, cp));
    if (r.n <= 1)
        return gb_push(x->b, &x->b->body[rule], GM_CHAR, cp, cp);
    return gm_set_emit(x->b, rule, &r);
}

/* \d \w \s (neg: \D \W \S) into r. ECMA-262's \s (x->ecma) is its WhiteSpace and
 * LineTerminator: the ASCII ones, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F,
 * U+205F, U+3000 and U+FEFF. */
static td_err gm_class_escape(const gm_src *x, gm_ranges *r, char c, bool neg)
{
    static const uint32_t digit[] = {'0', '9'};
    static const uint32_t word[] = {'0', '9', 'A', 'Z', '_', '_', 'a', 'z'};
    static const uint32_t space[] = {'\t', '\r', ' ', ' '};
    static const uint32_t espace[] = {'\t',   '\r',   ' ',    ' ',    0xA0,   0xA0,
                                      0x1680, 0x1680, 0x2000, 0x200A, 0x2028, 0x2029,
                                      0x202F, 0x202F, 0x205F, 0x205F, 0x3000, 0x3000,
                                      0xFEFF, 0xFEFF};
    const uint32_t *v = c == 'd' ? digit : c == 'w' ? word : x->ecma ? espace : space;
    const int n = c == 'd' ? 1 : c == 'w' ? 4 : x->ecma ? 10 : 2;
    if (!neg) {
        for (int i = 0; i < n; i++)
            TD_TRY(gm_range_add(x, r, v[2 * i], v[2 * i + 1]));
        return TD_OK;
    }
    uint32_t at = 0; /* the gaps between the sorted ranges */
    for (int i = 0; i < n; i++) {
        if (v[2 * i] > at)
            TD_TRY(gm_range_add(x, r, at, v[2 * i] - 1));
        at = v[2 * i + 1] + 1;
    }
    return gm_range_add(x, r, at, GM_CP_MAX);
}

/* --- characters --------------------------------------------------------------------------- */

static int gm_hex(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One UTF-8 character at x->p (valid, shortest form, no surrogate) into *cp. */
static td_err gm_utf8(gm_src *x, uint32_t *cp)
{
    utf8proc_int32_t c;
    const utf8proc_ssize_t k =
        utf8proc_iterate((const utf8proc_uint8_t *)x->p, x->end - x->p, &c);
    if (k <= 0)
        return gm_syntax(x, "the text is not UTF-8");
    x->p += k;
    *cp = (uint32_t)c;
    return TD_OK;
}

/* A character of a literal or a class (an escape, or one UTF-8 character). In a regex, *cls
 * gets the letter of a class escape (\d \w \s \D \W \S) instead. */
td_err gm_char(gm_src *x, uint32_t *cp, char *cls)
{
    if (cls)
        *cls = 0;
    if (x->p >= x->end)
        return gm_syntax(x, "the text ends inside a literal or class");
    if (*x->p != '\\')
        return gm_utf8(x, cp);
    if (x->end - x->p < 2)
        return gm_syntax(x, "the text ends after a backslash");
    const char c = x->p[1];
    x->p += 2;
    int digits = 0;
    switch (c) {
    case 'n': *cp = '\n'; return TD_OK;
    case 'r': *cp = '\r'; return TD_OK;
    case 't': *cp = '\t'; return TD_OK;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '/':
        *cp = (uint32_t)c;
        return TD_OK;
    default:
        break;
    }
    if (digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            const int h = x->p < x->end ? gm_hex(*x->p) : -1;
            if (h < 0)
                return gm_syntax(x, "a \\x, \\u or \\U escape needs its hex digits");
            v = v << 4 | (uint32_t)h;
            x->p++;
        }
        if (v > GM_CP_MAX || (v >= 0xd800 && v <= 0xdfff))
            return gm_syntax(x, "an escape names no Unicode character");
        *cp = v;
        return TD_OK;
    }
    if (!x->regex) {
        x->p -= 2;
        return gm_syntax(x, "unknown escape");
    }
    switch (c) {
    case 'f': *cp = '\f'; return TD_OK;
    case 'v': *cp = '\v'; return TD_OK;
    case '0': *cp = 0; return TD_OK;
    case 'd': case 'w': case 's': case 'D': case 'W': case 'S':
        if (cls) {
            *cls = c;
            return TD_OK;
        }
        break;
    default:
        break;
    }
    if ((c >= '1' && c <= '9') || c == 'b' || c == 'B' || c == 'A' || c == 'Z' || c == 'z' ||
        c == 'G' || c == 'k' || c == 'p' || c == 'P')
        return err_set(TD_ENOTSUP, "regular expression, at byte %td: \\%c is not supported",
                       x->p - 2 - x->s, c);
    if ((unsigned char)c < 0x80 && !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                                     (c >= '0' && c <= '9'))) {
        *cp = (uint32_t)c; /* escaped punctuation is itself */
        return TD_OK;
    }
    x->p -= 2;
    return gm_syntax(x, "unknown escape");
}

/* A class after its '[' up to and past its ']', into rule. */
static td_err gm_class(gm_src *x, int32_t rule)
{
    gm_ranges r = {.n = 0};
    r.neg = x->p < x->end && *x->p == '^';
    x->p += r.neg;
    bool first = true;
    for (;;) {
        if (x->p >= x->end)
            return gm_syntax(x, "a character class is not closed");
        if (*x->p == ']' && !(first && x->regex))
            break;
        uint32_t lo, hi;
        char cls;
        TD_TRY(gm_char(x, &lo, x->regex ? &cls : NULL));
        first = false;
        if (x->regex && cls) {
            TD_TRY(gm_class_escape(x, &r, (char)(cls | 0x20), cls < 'a'));
            continue;
        }
        hi = lo;
        if (x->end - x->p >= 2 && x->p[0] == '-' && x->p[1] != ']') {
            x->p++;
            char cls2;
            TD_TRY(gm_char(x, &hi, x->regex ? &cls2 : NULL));
            if (x->regex && cls2)
                return gm_syntax(x, "a range ends in a class escape");
        }
        TD_TRY(x->fold ? gm_range_add_folded(x, &r, lo, hi) : gm_range_add(x, &r, lo, hi));
    }
    x->p++; /* ']' */
    if (r.n == 0 && !r.neg)
        return gm_syntax(x, "an empty character class matches nothing");
    return gm_set_emit(x->b, rule, &r);
}

/* Decimal digits at p (capped at 100000), -1 when there are none; returns the end. */
const char *gm_number(const char *p, const char *end, long *v)
{
    *v = -1;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        const long d = (*v < 0 ? 0 : *v) * 10 + (*p - '0');
        *v = d > 100000 ? 100000 : d;
    }
    return p;
}

/* {m}, {m,}, {m,n} or {,n} at x->p: true with the bounds (max -1: none) and x->p past it;
 * false (x->p unchanged) when the text there is not one. */
static bool gm_braces(gm_src *x, long *min, long *max)
{
    long a, b = -1;
    const char *p = gm_number(x->p + 1, x->end, &a);
    const bool comma = p < x->end && *p == ',';
    if (comma)
        p = gm_number(p + 1, x->end, &b);
    if (p >= x->end || *p != '}' || (a < 0 && (!comma || b < 0)))
        return false;
    *min = a < 0 ? 0 : a;
    *max = comma ? b : *min;
    x->p = p + 1;
    return true;
}

/* Whether {m}, {m,}, {m,n} or {,n} is at x->p (x unchanged). */
static bool gm_at_braces(const gm_src *x)
{
    gm_src y = *x;
    long min, max;
    return y.p < y.end && *y.p == '{' && gm_braces(&y, &min, &max);
}

bool gm_star_plus_opt(gm_src *x, long *min, long *max)
{
    if (x->p >= x->end || (*x->p != '*' && *x->p != '+' && *x->p != '?'))
        return false;
    *min = *x->p == '+';
    *max = *x->p == '?' ? 1 : -1;
    x->p++;
    return true;
}

/* A quantifier after the item s->el[start..) of rule, if one follows. */
static td_err gm_quantifier(gm_src *x, int32_t rule, size_t start)
{
    long min, max;
    if (!gm_star_plus_opt(x, &min, &max) &&
        (x->p >= x->end || *x->p != '{' || !gm_braces(x, &min, &max)))
        return TD_OK;
    if (start == x->b->body[rule].n)
        return gm_syntax(x, "a quantifier with nothing before it to repeat");
    if (min > GM_REPEAT_MAX || max > GM_REPEAT_MAX)
        return err_set(TD_ENOTSUP, "a repetition bound above %d", GM_REPEAT_MAX);
    if (max >= 0 && max < min)
        return gm_syntax(x, "a repetition's maximum is below its minimum");
    if (x->regex && x->p < x->end && *x->p == '?')
        x->p++; /* lazy: the same language */
    else if (x->regex && x->p < x->end && *x->p == '+')
        return err_set(TD_ENOTSUP, "regular expression: possessive quantifiers are not "
                       "supported");
    if (x->regex && x->p < x->end && (*x->p == '*' || *x->p == '+' || *x->p == '?' ||
                                      gm_at_braces(x)))
        return gm_syntax(x, "multiple repeat");
    return gb_repeat(x->b, rule, start, min, max);
}

/* --- GBNF ---------------------------------------------------------------------------------- */

/* The characters of spaces and # comments (each up to its line's end). */
static void gm_skip_space(gm_src *x, const char *spaces)
{
    while (x->p < x->end) {
        if (*x->p && strchr(spaces, *x->p)) {
            x->p++;
        } else if (*x->p == '#') {
            while (x->p < x->end && *x->p != '\n')
                x->p++;
        } else {
            break;
        }
    }
}

/* Spaces, tabs and # comments; newlines too when nl. */
static void gbnf_space(gm_src *x, bool nl)
{
    gm_skip_space(x, nl ? " \t\r\n" : " \t\r");
}

static bool gbnf_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

static td_err gbnf_alternatives(gm_src *x, int32_t rule, int depth);

static td_err gbnf_sequence(gm_src *x, int32_t rule, int depth)
{
    gm_build *b = x->b;
    for (;;) {
        gbnf_space(x, depth > 0);
        if (x->p >= x->end)
            return TD_OK;
        const size_t start = b->body[rule].n;
        const char c = *x->p;
        if (c == '"') {
            x->p++;
            while (x->p < x->end && *x->p != '"') {
                uint32_t cp;
                TD_TRY(gm_char(x, &cp, NULL));
                TD_TRY(gb_push(b, &b->body[rule], GM_CHAR, cp, cp));
            }
            if (x->p >= x->end)
                return gm_syntax(x, "a literal is not closed");
            x->p++;
        } else if (c == '[') {
            x->p++;
            TD_TRY(gm_class(x, rule));
        } else if (c == '.') {
            x->p++;
            TD_TRY(gb_push(b, &b->body[rule], GM_CHAR, 0, GM_CP_MAX));
        } else if (c == '(') {
            if (depth >= GM_NEST_MAX)
                return err_set(TD_ENOTSUP, "groups nested deeper than %d", GM_NEST_MAX);
            x->p++;
            int32_t g;
            TD_TRY(gb_rule(b, NULL, 0, b->owner[rule], &g));
            b->defined[g] = true;
            TD_TRY(gbnf_alternatives(x, g, depth + 1));
            gbnf_space(x, true);
            if (x->p >= x->end || *x->p != ')')
                return gm_syntax(x, "expected ')'");
            x->p++;
            TD_TRY(gb_push(b, &b->body[g], GM_END, 0, 0));
            TD_TRY(gb_push(b, &b->body[rule], GM_REF, (uint32_t)g, 0));
        } else if (gbnf_name_char(c)) {
            const char *n0 = x->p;
            while (x->p < x->end && gbnf_name_char(*x->p))
                x->p++;
            const char *n1 = x->p;
            gbnf_space(x, false);
            if (x->end - x->p >= 3 && memcmp(x->p, "::=", 3) == 0) {
                x->p = n0;
                return gm_syntax(x, "a rule begins before the line of the one before ends");
            }
            x->p = n1;
            int32_t r;
            TD_TRY(gb_named(b, n0, (size_t)(n1 - n0), &r));
            TD_TRY(gb_push(b, &b->body[rule], GM_REF, (uint32_t)r, 0));
        } else if (c == '<') {
            return err_set(TD_ENOTSUP, "grammar: token references (<...>) are not supported");
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            return gm_syntax(x, "a quantifier with nothing before it to repeat");
        } else {
            return TD_OK; /* '|', ')', a newline: the caller's */
        }
        gbnf_space(x, depth > 0);
        TD_TRY(gm_quantifier(x, rule, start));
    }
}

static td_err gbnf_alternatives(gm_src *x, int32_t rule, int depth)
{
    TD_TRY(gbnf_sequence(x, rule, depth));
    while (x->p < x->end && *x->p == '|') {
        x->p++;
        TD_TRY(gb_push(x->b, &x->b->body[rule], GM_ALT, 0, 0));
        gbnf_space(x, true);
        TD_TRY(gbnf_sequence(x, rule, depth));
    }
    return TD_OK;
}

static td_err gbnf_rules(gm_src *x, int32_t *root)
{
    gm_build *b = x->b;
    gbnf_space(x, true);
    while (x->p < x->end) {
        const char *n0 = x->p;
        while (x->p < x->end && gbnf_name_char(*x->p))
            x->p++;
        if (x->p == n0)
            return gm_syntax(x, "expected a rule name");
        const char *n1 = x->p;
        gbnf_space(x, false);
        if (x->end - x->p < 3 || memcmp(x->p, "::=", 3) != 0)
            return gm_syntax(x, "expected '::='");
        x->p += 3;
        int32_t r;
        TD_TRY(gb_named(b, n0, (size_t)(n1 - n0), &r));
        if (b->defined[r]) {
            x->p = n0;
            return gm_syntax(x, "the rule is defined twice");
        }
        b->defined[r] = true;
        gbnf_space(x, true); /* the body may begin on the next line */
        TD_TRY(gbnf_alternatives(x, r, 0));
        TD_TRY(gb_push(b, &b->body[r], GM_END, 0, 0));
        gbnf_space(x, false);
        if (x->p < x->end && *x->p != '\n')
            return gm_syntax(x, *x->p == ')' ? "unbalanced ')'" : "unexpected character");
        gbnf_space(x, true);
    }
    for (int32_t r = 0; r < b->n_rules; r++) {
        if (b->name[r] && !b->defined[r])
            return err_set(TD_EINVAL, "grammar: the rule '%s' is used but not defined",
                           b->name[r]);
        if (b->name[r] && strcmp(b->name[r], "root") == 0)
            *root = r;
    }
    if (*root < 0)
        return err_set(TD_EINVAL, "grammar: no rule 'root'");
    return TD_OK;
}

td_err gm_compile_gbnf(const char *text, size_t len, gm_grammar **out)
{
    *out = NULL;
    gm_build b = {0};
    gm_src x = {.s = text, .p = text, .end = text + len, .b = &b};
    int32_t root = -1;
    const td_err e = gbnf_rules(&x, &root);
    return gm_finish(e, &b, root, "grammar", out);
}

/* --- regular expressions ------------------------------------------------------------------- */

/* Python's verbose flag: white space and # comments outside classes mean nothing. */
static void re_verbose_space(gm_src *x)
{
    if (x->verbose)
        gm_skip_space(x, " \t\n\r\f\v");
}

/* Python's inline flags after the "(?" of the group opened at open, x->p at the first letter:
 * "flags)" sets them for the rest of the expression (only at its start), "flags-flags:" for
 * the group, *group true and x->p past the ':'. ECMA-262 (a JSON Schema pattern) has none. */
static td_err re_inline_flags(gm_src *x, const char *open, int depth, bool *group)
{
    /* i s x a; u is the default and m changes nothing, '^' and '$' standing only at ends */
    bool on[4] = {false}, off[4] = {false}, minus = false;
    for (; x->p < x->end && *x->p != ')' && *x->p != ':'; x->p++) {
        const char f = *x->p;
        const char *k = f ? strchr("isxa", f) : NULL;
        if (x->ecma) {
            return err_set(TD_EINVAL, "regular expression, at byte %td: a JSON Schema pattern "
                           "(ECMA-262) has no inline flags", open + 1 - x->s);
        } else if (f == '-' && !minus) {
            minus = true;
        } else if (f == 'L') {
            return err_set(TD_ENOTSUP, "regular expression, at byte %td: the inline flag L is "
                           "not supported (a, i, m, s, u and x are)", x->p - x->s);
        } else if ((f != 'u' && f != 'm' && !k) || (minus && (f == 'a' || f == 'u'))) {
            return gm_syntax(x, "unknown inline flag");
        } else if (k) {
            (minus ? off : on)[k - "isxa"] = true;
        }
    }
    if (x->p >= x->end)
        return gm_syntax(x, "missing ')' or ':' after inline flags");
    *group = *x->p == ':';
    if (!*group && (minus || depth > 0 || open != x->lead))
        return gm_syntax(x, minus ? "flags can be turned off only for a group (?-i:...)"
                                  : "global flags not at the start of the expression");
    x->p++;
    if (!*group) {
        x->lead = x->p;
        if (x->alt == open)
            x->alt = x->p; /* '^' may follow */
    }
    x->fold = (x->fold || on[0]) && !off[0];
    x->dotall = (x->dotall || on[1]) && !off[1];
    x->verbose = (x->verbose || on[2]) && !off[2];
    x->ascii = x->ascii || on[3];
    return TD_OK;
}

static td_err re_sequence(gm_src *x, int32_t rule, int depth)
{
    gm_build *b = x->b;
    for (re_verbose_space(x); x->p < x->end; re_verbose_space(x)) {
        const size_t start = b->body[rule].n;
        const char c = *x->p;
        if (c == '|' || (c == ')' && depth > 0))
            return TD_OK;
        if (c == ')')
            return gm_syntax(x, "unbalanced ')'");
        if (c == '^' || c == '$') { /* anchors: at a top-level alternative's ends only */
            const bool end = x->p + 1 == x->end || x->p[1] == '|';
            if (depth > 0 || (c == '^' && x->p != x->alt) || (c == '$' && !end))
                return err_set(TD_ENOTSUP, "regular expression, at byte %td: '%c' is only "
                               "supported at the %s", x->p - x->s, c, c == '^' ? "start" : "end");
            x->caret = x->caret || c == '^';
            x->dollar = x->dollar || c == '$';
            x->p++;
            continue;
        }
        if (c == '(') {
            if (depth >= GM_NEST_MAX)
                return err_set(TD_ENOTSUP, "groups nested deeper than %d", GM_NEST_MAX);
            const char *open = x->p++;
            const gm_src outer = *x; /* the flags outside the group */
            if (x->p < x->end && *x->p == '?') {
                const char *q = x->p + 1;
                if (q < x->end && (*q == '-' || (*q && strchr("aiLmsux", *q)))) {
                    x->p = q;
                    bool group = false;
                    TD_TRY(re_inline_flags(x, open, depth, &group));
                    if (!group)
                        continue;
                } else if (q < x->end && *q == ':') {
                    x->p = q + 1;
                } else if (q < x->end && (*q == 'P' || *q == '<') &&
                           (*q == 'P' ? q + 1 < x->end && q[1] == '<' : q + 1 < x->end &&
                            q[1] != '=' && q[1] != '!')) {
                    const char *gt = memchr(q, '>', (size_t)(x->end - q));
                    if (!gt)
                        return gm_syntax(x, "a group name is not closed");
                    x->p = gt + 1;
                } else {
                    return err_set(TD_ENOTSUP, "regular expression, at byte %td: lookaround "
                                   "and other (? groups are not supported", x->p - x->s);
                }
            }
            int32_t g;
            TD_TRY(gb_rule(b, NULL, 0, b->owner[rule], &g));
            b->defined[g] = true;
            TD_TRY(re_alternatives(x, g, depth + 1));
            if (x->p >= x->end || *x->p != ')')
                return gm_syntax(x, "missing ')'");
            x->p++;
            x->fold = outer.fold;
            x->dotall = outer.dotall;
            x->verbose = outer.verbose;
            x->ascii = outer.ascii;
            TD_TRY(gb_push(b, &b->body[g], GM_END, 0, 0));
            TD_TRY(gb_push(b, &b->body[rule], GM_REF, (uint32_t)g, 0));
        } else if (c == '[') {
            x->p++;
            TD_TRY(gm_class(x, rule));
        } else if (c == '.' && x->dotall) {
            x->p++;
            TD_TRY(gb_push(b, &b->body[rule], GM_CHAR, 0, GM_CP_MAX));
        } else if (c == '.') { /* any character but \n; ECMA-262: but a line terminator */
            x->p++;
            gm_ranges r = {.n = 0, .neg = true};
            TD_TRY(gm_range_add(x, &r, '\n', '\n'));
            if (x->ecma) {
                TD_TRY(gm_range_add(x, &r, '\r', '\r'));
                TD_TRY(gm_range_add(x, &r, 0x2028, 0x2029));
            }
            TD_TRY(gm_set_emit(b, rule, &r));
        } else if (c == '*' || c == '+' || c == '?' ||
                   gm_at_braces(x)) {
            return gm_syntax(x, "nothing to repeat");
        } else {
            uint32_t cp;
            char cls;
            TD_TRY(gm_char(x, &cp, &cls));
            if (cls) {
                gm_ranges r = {.n = 0};
                TD_TRY(gm_class_escape(x, &r, (char)(cls | 0x20), cls < 'a'));
                TD_TRY(gm_set_emit(b, rule, &r));
            } else {
                TD_TRY(gm_char_emit(x, rule, cp));
            }
        }
        re_verbose_space(x);
        TD_TRY(gm_quantifier(x, rule, start));
    }
    return TD_OK;
}

td_err re_alternatives(gm_src *x, int32_t rule, int depth)
{
    TD_TRY(re_sequence(x, rule, depth));
    while (x->p < x->end && *x->p == '|') {
        x->p++;
        TD_TRY(gb_push(x->b, &x->b->body[rule], GM_ALT, 0, 0));
        TD_TRY(re_sequence(x, rule, depth));
    }
    return TD_OK;
}

/* A rule of any text: any ::= [U+0000-U+10FFFF] any | (nothing). */
static td_err re_any(gm_build *b, int32_t owner, int32_t *id)
{
    TD_TRY(gb_rule(b, NULL, 0, owner, id));
    b->defined[*id] = true;
    TD_TRY(gb_push(b, &b->body[*id], GM_CHAR, 0, GM_CP_MAX));
    TD_TRY(gb_push(b, &b->body[*id], GM_REF, (uint32_t)*id, 0));
    TD_TRY(gb_push(b, &b->body[*id], GM_ALT, 0, 0));
    return gb_push(b, &b->body[*id], GM_END, 0, 0);
}

/* The top level of a regex into root: whole (the text is a match) or search (the text holds
 * one: each top-level alternative may have any text before it unless it begins with '^', and
 * after it unless it ends with '$'). */
static td_err re_top(gm_src *x, int32_t root, bool search)
{
    gm_build *b = x->b;
    int32_t any = -1;
    for (bool first = true; first || (x->p < x->end && *x->p == '|'); first = false) {
        if (!first) {
            x->p++;
            TD_TRY(gb_push(b, &b->body[root], GM_ALT, 0, 0));
        }
        x->alt = x->p;
        x->caret = x->dollar = false;
        int32_t alt;
        TD_TRY(gb_rule(b, NULL, 0, root, &alt));
        b->defined[alt] = true;
        TD_TRY(re_sequence(x, alt, 0));
        TD_TRY(gb_push(b, &b->body[alt], GM_END, 0, 0));
        if (search && any < 0 && (!x->caret || !x->dollar))
            TD_TRY(re_any(b, root, &any));
        if (search && !x->caret)
            TD_TRY(gb_push(b, &b->body[root], GM_REF, (uint32_t)any, 0));
        TD_TRY(gb_push(b, &b->body[root], GM_REF, (uint32_t)alt, 0));
        if (search && !x->dollar)
            TD_TRY(gb_push(b, &b->body[root], GM_REF, (uint32_t)any, 0));
    }
    return TD_OK;
}

static td_err re_compile(const char *re, size_t len, bool search, gm_grammar **out)
{
    *out = NULL;
    gm_build b = {0};
    gm_src x = {.s = re, .p = re, .end = re + len, .b = &b, .regex = true, .ecma = search,
                .alt = re, .lead = re};
    int32_t root;
    td_err e = gb_rule(&b, "root", 4, -1, &root);
    if (e == TD_OK) {
        b.defined[root] = true;
        e = re_top(&x, root, search);
    }
    if (e == TD_OK && x.p < x.end) /* re_sequence stopped at a ')' of depth 0 */
        e = gm_syntax(&x, "unbalanced ')'");
    if (e == TD_OK)
        e = gb_push(&b, &b.body[root], GM_END, 0, 0);
    return gm_finish(e, &b, root, "regular expression", out);
}

td_err gm_compile_regex(const char *re, size_t len, gm_grammar **out)
{
    return re_compile(re, len, false, out);
}

td_err gm_compile_pattern(const char *re, size_t len, gm_grammar **out)
{
    return re_compile(re, len, true, out);
}

