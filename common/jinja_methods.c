/* Callables of the Jinja interpreter: Python's str, dict and list methods as the sandbox
 * exposes them (mutating list and dict methods are refused with jinja2's "access to attribute
 * 'append' of 'list' object is unsafe."), the attributes and methods of `loop`, and the
 * globals transformers provides (raise_exception, namespace, range, dict, strftime_now).
 *
 * Case mapping uses simple (one code point to one) Unicode mappings; Python's full mappings
 * differ for a few characters such as 'ß'.upper(). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "common/jinja_int.h"

/* ---- string helpers (also used by filters) ------------------------------------------------- */

static bool in_chars(uint32_t cp, jv chars)
{
    if (chars.kind != JV_STR)
        return py_isspace(cp);
    for (size_t i = 0; i < chars.s.n;) {
        size_t next;
        if (utf8_decode(chars.s.p, chars.s.n, i, &next) == cp)
            return true;
        i = next;
    }
    return false;
}

size_t jinja_py_strip(const char *text, size_t n, bool left, bool right, size_t *start)
{
    size_t first = n, last_end = 0; /* the first character kept, the end of the last */
    bool seen = false;
    for (size_t i = 0, next; i < n; i = next)
        if (!py_isspace(utf8_decode(text, n, i, &next))) {
            if (!seen)
                first = i;
            seen = true;
            last_end = next;
        }
    const size_t a = left ? first : 0;
    *start = a;
    return !right ? n : seen ? last_end : a;
}

jv jstr_strip(jev *ev, jv s, jv chars, bool left, bool right)
{
    if (chars.kind != JV_STR && chars.kind != JV_NONE && chars.kind != JV_MISSING)
        jev_fail(ev, TD_EINVAL, "strip arg must be None or str");
    jev_charge(ev, s.s.n);
    size_t a = 0, b = s.s.n;
    while (left && a < b) {
        size_t next;
        if (!in_chars(utf8_decode(s.s.p, b, a, &next), chars))
            break;
        a = next;
    }
    while (right && b > a) {
        size_t start = b - 1, next;
        while (start > a && ((unsigned char)s.s.p[start] & 0xC0) == 0x80)
            start--;
        if (!in_chars(utf8_decode(s.s.p, b, start, &next), chars))
            break;
        b = start;
    }
    jv r = jv_strn(s.s.p + a, b - a);
    r.flags = s.flags;
    return r;
}

static bool is_cased(uint32_t cp)
{
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

/* mode: 'l' lower, 'u' upper, 't' title, 'c' capitalize, 's' swapcase */
jv jstr_case(jev *ev, jv s, char mode)
{
    jev_charge(ev, s.s.n);
    jbuf b = {0};
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s.s.n;) {
        size_t next;
        uint32_t cp = utf8_decode(s.s.p, s.s.n, i, &next);
        utf8proc_int32_t c = (utf8proc_int32_t)cp, o = c;
        switch (mode) {
        case 'l': o = utf8proc_tolower(c); break;
        case 'u': o = utf8proc_toupper(c); break;
        case 't': o = prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c); break;
        case 'c': o = first ? utf8proc_totitle(c) : utf8proc_tolower(c); break;
        case 's': o = utf8proc_islower(c) ? utf8proc_toupper(c) : utf8proc_isupper(c) ? utf8proc_tolower(c) : c; break;
        }
        prev_cased = is_cased(cp);
        first = false;
        char enc[4];
        jbuf_put(ev, &b, enc, jinja_utf8_encode((uint32_t)o, enc));
        i = next;
    }
    jv r = jbuf_str(&b);
    r.flags = s.flags;
    return r;
}

jv jstr_replace(jev *ev, jv s, jv old, jv repl, int64_t count)
{
    if (old.kind != JV_STR || repl.kind != JV_STR)
        jev_fail(ev, TD_EINVAL, "replace() argument must be str, not %s",
                 jv_type_name(old.kind != JV_STR ? old : repl));
    jev_charge(ev, s.s.n);
    jbuf b = {0};
    size_t i = 0;
    if (old.s.n == 0) { /* Python inserts the replacement around every character */
        while (count != 0) {
            jbuf_put(ev, &b, repl.s.p, repl.s.n);
            count--;
            if (i >= s.s.n)
                break;
            size_t next = utf8_next(s.s.p, s.s.n, i);
            jbuf_put(ev, &b, s.s.p + i, next - i);
            i = next;
        }
    } else {
        while (count != 0 && i <= s.s.n) {
            const char *hit = memmem(s.s.p + i, s.s.n - i, old.s.p, old.s.n);
            if (!hit)
                break;
            size_t at = (size_t)(hit - s.s.p);
            jbuf_put(ev, &b, s.s.p + i, at - i);
            jbuf_put(ev, &b, repl.s.p, repl.s.n);
            i = at + old.s.n;
            count--;
        }
    }
    jbuf_put(ev, &b, s.s.p + i, s.s.n - i);
    jev_charge(ev, b.n);
    jv r = jbuf_str(&b);
    r.flags = s.flags;
    return r;
}

static jv split_ws(jev *ev, jv s, int64_t maxsplit, bool from_right)
{
    jv out = jv_list_new(ev, 0);
    const char *p = s.s.p;
    size_t n = s.s.n;
    if (!from_right) {
        size_t i = 0;
        for (;;) {
            while (i < n && py_isspace(utf8_decode(p, n, i, &(size_t){0})))
                i = utf8_next(p, n, i);
            if (i >= n)
                break;
            if (maxsplit == 0) {
                size_t e = n;
                jv rest = jstr_strip(ev, jv_strn(p + i, e - i), jv_none(), false, true);
                jv_list_push(ev, out, rest);
                break;
            }
            size_t j = i;
            while (j < n && !py_isspace(utf8_decode(p, n, j, &(size_t){0})))
                j = utf8_next(p, n, j);
            jv_list_push(ev, out, jv_strn(p + i, j - i));
            maxsplit--;
            i = j;
        }
        return out;
    }
    /* rsplit: collect from the right, then reverse */
    size_t e = n;
    for (;;) {
        jv t = jstr_strip(ev, jv_strn(p, e), jv_none(), false, true);
        e = t.s.n;
        if (e == 0)
            break;
        if (maxsplit == 0) {
            jv_list_push(ev, out, jstr_strip(ev, jv_strn(p, e), jv_none(), true, false));
            break;
        }
        size_t j = e;
        while (j > 0) {
            size_t start = j - 1;
            while (start > 0 && ((unsigned char)p[start] & 0xC0) == 0x80)
                start--;
            if (py_isspace(utf8_decode(p, e, start, &(size_t){0})))
                break;
            j = start;
        }
        jv_list_push(ev, out, jv_strn(p + j, e - j));
        maxsplit--;
        e = j;
    }
    for (size_t a = 0, b = out.l->n; b > a + 1; a++, b--) {
        jv t = out.l->v[a];
        out.l->v[a] = out.l->v[b - 1];
        out.l->v[b - 1] = t;
    }
    return out;
}

jv jstr_split(jev *ev, jv s, jv sep, int64_t maxsplit, bool from_right)
{
    jev_charge(ev, s.s.n);
    if (maxsplit < 0)
        maxsplit = -1;
    if (sep.kind == JV_NONE || sep.kind == JV_MISSING)
        return split_ws(ev, s, maxsplit, from_right);
    if (sep.kind != JV_STR)
        jev_fail(ev, TD_EINVAL, "must be str or None, not %s", jv_type_name(sep));
    if (sep.s.n == 0)
        jev_fail(ev, TD_EINVAL, "empty separator");
    jv out = jv_list_new(ev, 0);
    const char *p = s.s.p;
    if (!from_right) {
        size_t i = 0;
        for (;;) {
            const char *hit = maxsplit != 0 ? memmem(p + i, s.s.n - i, sep.s.p, sep.s.n) : NULL;
            if (!hit) {
                jv_list_push(ev, out, jv_strn(p + i, s.s.n - i));
                break;
            }
            size_t at = (size_t)(hit - p);
            jv_list_push(ev, out, jv_strn(p + i, at - i));
            i = at + sep.s.n;
            maxsplit--;
        }
    } else {
        size_t e = s.s.n;
        for (;;) {
            size_t at = SIZE_MAX;
            if (maxsplit != 0 && e >= sep.s.n)
                for (size_t k = e - sep.s.n + 1; k-- > 0;)
                    if (!memcmp(p + k, sep.s.p, sep.s.n)) {
                        at = k;
                        break;
                    }
            if (at == SIZE_MAX) {
                jv_list_push(ev, out, jv_strn(p, e));
                break;
            }
            jv_list_push(ev, out, jv_strn(p + at + sep.s.n, e - at - sep.s.n));
            e = at;
            maxsplit--;
        }
        for (size_t a = 0, b = out.l->n; b > a + 1; a++, b--) {
            jv t = out.l->v[a];
            out.l->v[a] = out.l->v[b - 1];
            out.l->v[b - 1] = t;
        }
    }
    for (size_t i = 0; i < out.l->n; i++)
        out.l->v[i].flags = s.flags;
    return out;
}

/* ---- calls --------------------------------------------------------------------------------- */

void jcall_bind(jev *ev, const char *what, const jcall *c, const char *const *params,
                size_t n_params, jv *slots)
{
    if (c->n_pos > n_params)
        jev_fail(ev, TD_EINVAL, "%s() takes at most %zu argument(s) (%zu given)", what, n_params, c->n_pos);
    for (size_t i = 0; i < n_params; i++)
        slots[i] = i < c->n_pos ? c->pos[i] : jv_missing();
    for (size_t k = 0; k < c->n_kw; k++) {
        size_t i = 0;
        while (i < n_params && strcmp(params[i], c->kw[k]) != 0)
            i++;
        if (i == n_params)
            jev_fail(ev, TD_EINVAL, "%s() got an unexpected keyword argument '%s'", what, c->kw[k]);
        if (slots[i].kind != JV_MISSING)
            jev_fail(ev, TD_EINVAL, "%s() got multiple values for argument '%s'", what, c->kw[k]);
        slots[i] = c->kw_val[k];
    }
}

static int64_t want_int(jev *ev, jv v, int64_t dflt)
{
    if (v.kind == JV_MISSING || v.kind == JV_NONE)
        return dflt;
    if (v.kind == JV_BOOL)
        return v.b;
    if (v.kind != JV_INT)
        jev_fail(ev, TD_EINVAL, "'%s' object cannot be interpreted as an integer", jv_type_name(v));
    return v.i;
}

static jv want_str(jev *ev, jv v)
{
    if (v.kind != JV_STR)
        jev_fail(ev, TD_EINVAL, "must be str, not %s", jv_type_name(v));
    return v;
}

/* ---- methods ------------------------------------------------------------------------------- */

typedef enum jmeth_impl {
    JM_NONE, /* a real method of the type that is not implemented */
    JM_UNSAFE, /* mutates: refused by the immutable sandbox */
    JM_STARTSWITH, JM_ENDSWITH, JM_SPLIT, JM_RSPLIT, JM_STRIP, JM_LSTRIP, JM_RSTRIP, JM_LOWER,
    JM_UPPER, JM_TITLE, JM_CAPITALIZE, JM_SWAPCASE, JM_REPLACE, JM_FIND, JM_RFIND, JM_STR_INDEX,
    JM_STR_RINDEX, JM_COUNT,
    JM_JOIN, JM_SPLITLINES, JM_ISDIGIT, JM_ISALPHA, JM_ISALNUM, JM_ISSPACE, JM_ISLOWER, JM_ISUPPER,
    JM_REMOVEPREFIX, JM_REMOVESUFFIX,
    JM_ITEMS, JM_KEYS, JM_VALUES, JM_GET, JM_COPY,
    JM_INDEX,
    JM_CYCLE, JM_CHANGED,
} jmeth_impl;

typedef struct jmeth {
    uint8_t kind; /* jv_kind of the receiver */
    const char *name;
    jmeth_impl impl;
} jmeth;

static const jmeth methods[] = {
    {JV_STR, "startswith", JM_STARTSWITH}, {JV_STR, "endswith", JM_ENDSWITH},
    {JV_STR, "split", JM_SPLIT}, {JV_STR, "rsplit", JM_RSPLIT}, {JV_STR, "strip", JM_STRIP},
    {JV_STR, "lstrip", JM_LSTRIP}, {JV_STR, "rstrip", JM_RSTRIP}, {JV_STR, "lower", JM_LOWER},
    {JV_STR, "upper", JM_UPPER}, {JV_STR, "title", JM_TITLE}, {JV_STR, "capitalize", JM_CAPITALIZE},
    {JV_STR, "swapcase", JM_SWAPCASE}, {JV_STR, "replace", JM_REPLACE}, {JV_STR, "find", JM_FIND},
    {JV_STR, "rfind", JM_RFIND}, {JV_STR, "count", JM_COUNT}, {JV_STR, "join", JM_JOIN},
    {JV_STR, "splitlines", JM_SPLITLINES}, {JV_STR, "isdigit", JM_ISDIGIT},
    {JV_STR, "isalpha", JM_ISALPHA}, {JV_STR, "isalnum", JM_ISALNUM}, {JV_STR, "isspace", JM_ISSPACE},
    {JV_STR, "islower", JM_ISLOWER}, {JV_STR, "isupper", JM_ISUPPER},
    {JV_STR, "removeprefix", JM_REMOVEPREFIX}, {JV_STR, "removesuffix", JM_REMOVESUFFIX},
    {JV_STR, "casefold", JM_NONE}, {JV_STR, "center", JM_NONE}, {JV_STR, "encode", JM_NONE},
    {JV_STR, "expandtabs", JM_NONE}, {JV_STR, "format", JM_NONE}, {JV_STR, "format_map", JM_NONE},
    {JV_STR, "index", JM_STR_INDEX}, {JV_STR, "rindex", JM_STR_RINDEX},
    {JV_STR, "isascii", JM_NONE}, {JV_STR, "isdecimal", JM_NONE},
    {JV_STR, "isidentifier", JM_NONE}, {JV_STR, "isnumeric", JM_NONE},
    {JV_STR, "isprintable", JM_NONE}, {JV_STR, "istitle", JM_NONE}, {JV_STR, "ljust", JM_NONE},
    {JV_STR, "maketrans", JM_NONE}, {JV_STR, "partition", JM_NONE}, {JV_STR, "rjust", JM_NONE}, {JV_STR, "rpartition", JM_NONE}, {JV_STR, "translate", JM_NONE},
    {JV_STR, "zfill", JM_NONE},
    {JV_DICT, "items", JM_ITEMS}, {JV_DICT, "keys", JM_KEYS}, {JV_DICT, "values", JM_VALUES},
    {JV_DICT, "get", JM_GET}, {JV_DICT, "copy", JM_COPY}, {JV_DICT, "fromkeys", JM_NONE},
    {JV_DICT, "clear", JM_UNSAFE}, {JV_DICT, "pop", JM_UNSAFE}, {JV_DICT, "popitem", JM_UNSAFE},
    {JV_DICT, "setdefault", JM_UNSAFE}, {JV_DICT, "update", JM_UNSAFE},
    {JV_LIST, "index", JM_INDEX}, {JV_LIST, "count", JM_COUNT}, {JV_LIST, "copy", JM_COPY},
    {JV_LIST, "append", JM_UNSAFE}, {JV_LIST, "clear", JM_UNSAFE}, {JV_LIST, "extend", JM_UNSAFE},
    {JV_LIST, "insert", JM_UNSAFE}, {JV_LIST, "pop", JM_UNSAFE}, {JV_LIST, "remove", JM_UNSAFE},
    {JV_LIST, "reverse", JM_UNSAFE}, {JV_LIST, "sort", JM_UNSAFE},
    {JV_LOOP, "cycle", JM_CYCLE}, {JV_LOOP, "changed", JM_CHANGED},
};

#define N_METHODS (sizeof methods / sizeof methods[0])

bool jv_method_find(jev *ev, jv obj, const char *name, size_t n, jv *out)
{
    for (size_t i = 0; i < N_METHODS; i++) {
        const jmeth *m = &methods[i];
        if (m->kind != obj.kind || strlen(m->name) != n || memcmp(m->name, name, n) != 0)
            continue;
        bool tuple = obj.kind == JV_LIST && (obj.flags & JV_F_TUPLE);
        if (tuple && m->impl != JM_INDEX && m->impl != JM_COUNT)
            return false; /* tuples have only count and index */
        if (m->impl == JM_UNSAFE) {
            *out = jv_undef(ev, "access to attribute '%s' of '%s' object is unsafe.", m->name, jv_type_name(obj));
            return true;
        }
        jv *recv = jev_alloc(ev, sizeof *recv);
        *recv = obj;
        jv r = {.kind = JV_METHOD, .id = (uint16_t)i};
        r.recv = recv;
        *out = r;
        return true;
    }
    return false;
}

static bool str_test(jv s, jmeth_impl what)
{
    if (s.s.n == 0)
        return false;
    bool any_cased = false;
    for (size_t i = 0; i < s.s.n;) {
        size_t next;
        utf8proc_int32_t c = (utf8proc_int32_t)utf8_decode(s.s.p, s.s.n, i, &next);
        utf8proc_category_t cat = utf8proc_category(c);
        bool alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
        bool digit = cat == UTF8PROC_CATEGORY_ND;
        switch (what) {
        case JM_ISDIGIT: if (!digit) return false; break;
        case JM_ISALPHA: if (!alpha) return false; break;
        case JM_ISALNUM: if (!alpha && !digit && cat != UTF8PROC_CATEGORY_NL && cat != UTF8PROC_CATEGORY_NO) return false; break;
        case JM_ISSPACE: if (!py_isspace((uint32_t)c)) return false; break;
        case JM_ISLOWER:
            if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT) return false;
            any_cased |= cat == UTF8PROC_CATEGORY_LL;
            break;
        default: /* JM_ISUPPER */
            if (cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT) return false;
            any_cased |= cat == UTF8PROC_CATEGORY_LU;
            break;
        }
        i = next;
    }
    return what == JM_ISLOWER || what == JM_ISUPPER ? any_cased : true;
}

static bool affix_match(jev *ev, jv s, jv affix, bool end)
{
    if (affix.kind == JV_LIST && (affix.flags & JV_F_TUPLE)) {
        for (size_t i = 0; i < affix.l->n; i++)
            if (affix_match(ev, s, affix.l->v[i], end))
                return true;
        return false;
    }
    if (affix.kind != JV_STR)
        jev_fail(ev, TD_EINVAL, "%s first arg must be str or a tuple of str, not %s",
                 end ? "endswith" : "startswith", jv_type_name(affix));
    if (affix.s.n > s.s.n)
        return false;
    return !memcmp(s.s.p + (end ? s.s.n - affix.s.n : 0), affix.s.p, affix.s.n);
}

static jv splitlines(jev *ev, jv s, bool keepends)
{
    jv out = jv_list_new(ev, 0);
    size_t start = 0;
    for (size_t i = 0; i < s.s.n;) {
        size_t next;
        uint32_t c = utf8_decode(s.s.p, s.s.n, i, &next);
        bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) ||
                   c == 0x85 || c == 0x2028 || c == 0x2029;
        if (!brk) {
            i = next;
            continue;
        }
        size_t end = next;
        if (c == '\r' && end < s.s.n && s.s.p[end] == '\n')
            end++;
        jv_list_push(ev, out, jv_strn(s.s.p + start, (keepends ? end : i) - start));
        start = i = end;
    }
    if (start < s.s.n)
        jv_list_push(ev, out, jv_strn(s.s.p + start, s.s.n - start));
    return out;
}

static jv call_method(jev *ev, jv mv, const jcall *c)
{
    const jmeth *m = &methods[mv.id];
    jv self = *mv.recv;
    jv a[3];
    static const char *const p_affix[] = {"prefix", "start", "end"};
    static const char *const p_split[] = {"sep", "maxsplit"};
    static const char *const p_chars[] = {"chars"};
    static const char *const p_replace[] = {"old", "new", "count"};
    static const char *const p_sub[] = {"sub"};
    static const char *const p_iter[] = {"iterable"};
    static const char *const p_keep[] = {"keepends"};
    static const char *const p_get[] = {"key", "default"};
    static const char *const p_value[] = {"value"};
    jev_charge(ev, 0);
    switch (m->impl) {
    case JM_STARTSWITH:
    case JM_ENDSWITH:
        jcall_bind(ev, m->name, c, p_affix, 3, a);
        if (a[0].kind == JV_MISSING)
            jev_fail(ev, TD_EINVAL, "%s() takes at least 1 argument (0 given)", m->name);
        if (a[1].kind != JV_MISSING || a[2].kind != JV_MISSING)
            jev_fail(ev, TD_ENOTSUP, "%s(): start and end arguments are not supported", m->name);
        return jv_bool(affix_match(ev, self, a[0], m->impl == JM_ENDSWITH));
    case JM_SPLIT:
    case JM_RSPLIT:
        jcall_bind(ev, m->name, c, p_split, 2, a);
        return jstr_split(ev, self, a[0], want_int(ev, a[1], -1), m->impl == JM_RSPLIT);
    case JM_STRIP:
    case JM_LSTRIP:
    case JM_RSTRIP:
        jcall_bind(ev, m->name, c, p_chars, 1, a);
        return jstr_strip(ev, self, a[0], m->impl != JM_RSTRIP, m->impl != JM_LSTRIP);
    case JM_LOWER: case JM_UPPER: case JM_TITLE: case JM_CAPITALIZE: case JM_SWAPCASE:
        jcall_bind(ev, m->name, c, NULL, 0, a);
        return jstr_case(ev, self, m->impl == JM_LOWER ? 'l' : m->impl == JM_UPPER ? 'u' :
                                   m->impl == JM_TITLE ? 't' : m->impl == JM_CAPITALIZE ? 'c' : 's');
    case JM_REPLACE:
        jcall_bind(ev, m->name, c, p_replace, 3, a);
        if (a[0].kind == JV_MISSING || a[1].kind == JV_MISSING)
            jev_fail(ev, TD_EINVAL, "replace expected at least 2 arguments");
        return jstr_replace(ev, self, a[0], a[1], want_int(ev, a[2], -1));
    case JM_FIND:
    case JM_RFIND:
    case JM_STR_INDEX:
    case JM_STR_RINDEX: {
        jcall_bind(ev, m->name, c, p_sub, 1, a);
        jv sub = want_str(ev, a[0]);
        jev_charge(ev, self.s.n);
        const char *hit = NULL;
        if (m->impl == JM_FIND || m->impl == JM_STR_INDEX) {
            hit = memmem(self.s.p, self.s.n, sub.s.p, sub.s.n);
        } else if (sub.s.n <= self.s.n) {
            for (size_t k = self.s.n - sub.s.n + 1; k-- > 0 && !hit;)
                if (!memcmp(self.s.p + k, sub.s.p, sub.s.n))
                    hit = self.s.p + k;
        }
        if (!hit && (m->impl == JM_STR_INDEX || m->impl == JM_STR_RINDEX))
            jev_fail(ev, TD_EINVAL, "substring not found");
        return jv_int(hit ? (int64_t)utf8_len(self.s.p, (size_t)(hit - self.s.p)) : -1);
    }
    case JM_COUNT: {
        jcall_bind(ev, m->name, c, p_value, 1, a);
        if (self.kind == JV_LIST) {
            int64_t k = 0;
            for (size_t i = 0; i < self.l->n; i++)
                k += jv_equal(ev, self.l->v[i], a[0], 0);
            return jv_int(k);
        }
        jv sub = want_str(ev, a[0]);
        jev_charge(ev, self.s.n);
        if (sub.s.n == 0)
            return jv_int((int64_t)utf8_len(self.s.p, self.s.n) + 1);
        int64_t k = 0;
        for (size_t i = 0; i + sub.s.n <= self.s.n;) {
            const char *hit = memmem(self.s.p + i, self.s.n - i, sub.s.p, sub.s.n);
            if (!hit)
                break;
            k++;
            i = (size_t)(hit - self.s.p) + sub.s.n;
        }
        return jv_int(k);
    }
    case JM_JOIN: {
        jcall_bind(ev, m->name, c, p_iter, 1, a);
        jv items = jv_iterate(ev, a[0]);
        jbuf b = {0};
        for (size_t i = 0; i < items.l->n; i++) {
            jv it = items.l->v[i];
            if (it.kind != JV_STR)
                jev_fail(ev, TD_EINVAL, "sequence item %zu: expected str instance, %s found", i, jv_type_name(it));
            if (i)
                jbuf_put(ev, &b, self.s.p, self.s.n);
            jbuf_put(ev, &b, it.s.p, it.s.n);
        }
        jev_charge(ev, b.n);
        return jbuf_str(&b);
    }
    case JM_SPLITLINES:
        jcall_bind(ev, m->name, c, p_keep, 1, a);
        return splitlines(ev, self, jv_truthy(a[0]));
    case JM_ISDIGIT: case JM_ISALPHA: case JM_ISALNUM: case JM_ISSPACE: case JM_ISLOWER: case JM_ISUPPER:
        jcall_bind(ev, m->name, c, NULL, 0, a);
        return jv_bool(str_test(self, m->impl));
    case JM_REMOVEPREFIX:
    case JM_REMOVESUFFIX: {
        jcall_bind(ev, m->name, c, p_affix, 1, a);
        jv x = want_str(ev, a[0]);
        bool end = m->impl == JM_REMOVESUFFIX;
        if (!affix_match(ev, self, x, end))
            return self;
        jv r = jv_strn(self.s.p + (end ? 0 : x.s.n), self.s.n - x.s.n);
        r.flags = self.flags;
        return r;
    }
    case JM_ITEMS:
    case JM_KEYS:
    case JM_VALUES: {
        jcall_bind(ev, m->name, c, NULL, 0, a);
        jv out = jv_list_new(ev, self.d->n);
        for (size_t i = 0; i < self.d->n; i++) {
            jv k = jv_strn(self.d->e[i].k, self.d->e[i].kn);
            if (m->impl == JM_ITEMS) {
                jv pair = jv_list_new(ev, 2);
                pair.l->v[0] = k;
                pair.l->v[1] = self.d->e[i].v;
                pair.l->n = 2;
                pair.flags = JV_F_TUPLE;
                out.l->v[i] = pair;
            } else {
                out.l->v[i] = m->impl == JM_KEYS ? k : self.d->e[i].v;
            }
        }
        out.l->n = self.d->n;
        return out;
    }
    case JM_GET: {
        jcall_bind(ev, m->name, c, p_get, 2, a);
        if (a[0].kind == JV_MISSING)
            jev_fail(ev, TD_EINVAL, "get expected at least 1 argument, got 0");
        jv *v = a[0].kind == JV_STR ? jdict_get(self.d, a[0].s.p, a[0].s.n) : NULL;
        return v ? *v : a[1].kind == JV_MISSING ? jv_none() : a[1];
    }
    case JM_COPY:
        jcall_bind(ev, m->name, c, NULL, 0, a);
        if (self.kind == JV_LIST) {
            jv r = jv_list_new(ev, self.l->n);
            jmemcpy(r.l->v, self.l->v, self.l->n * sizeof(jv));
            r.l->n = self.l->n;
            return r;
        } else {
            jv r = jv_dict_new(ev);
            for (size_t i = 0; i < self.d->n; i++)
                jdict_set(ev, r.d, self.d->e[i].k, self.d->e[i].kn, self.d->e[i].v);
            return r;
        }
    case JM_INDEX:
        jcall_bind(ev, m->name, c, p_value, 1, a);
        for (size_t i = 0; i < self.l->n; i++)
            if (jv_equal(ev, self.l->v[i], a[0], 0))
                return jv_int((int64_t)i);
        {
            jbuf b = {0};
            jv_write_repr(ev, &b, a[0], 0);
            jev_fail(ev, TD_EINVAL, "%.*s is not in %s", (int)b.n, b.p, self.flags & JV_F_TUPLE ? "tuple" : "list");
        }
    case JM_CYCLE:
        if (c->n_kw || c->n_pos == 0)
            jev_fail(ev, TD_EINVAL, "no items for cycling given");
        return c->pos[self.loop->i % c->n_pos];
    case JM_CHANGED: {
        jv now = jv_list_new(ev, c->n_pos);
        jmemcpy(now.l->v, c->pos, c->n_pos * sizeof(jv));
        now.l->n = c->n_pos;
        jv last = self.loop->changed_last;
        self.loop->changed_last = now;
        return jv_bool(last.kind == JV_MISSING || !jv_equal(ev, last, now, 0));
    }
    default:
        jev_fail(ev, TD_ENOTSUP, "the %s method %s() is not supported", jv_type_name(self), m->name);
    }
}

/* ---- loop ---------------------------------------------------------------------------------- */

jv jloop_attr(jev *ev, jv loop, const char *name, size_t n)
{
    const jloop *l = loop.loop;
    int64_t i = (int64_t)l->i, len = (int64_t)l->n;
#define IS(s) (n == sizeof(s) - 1 && !memcmp(name, s, n))
    if (IS("index")) return jv_int(i + 1);
    if (IS("index0")) return jv_int(i);
    if (IS("revindex")) return jv_int(len - i);
    if (IS("revindex0")) return jv_int(len - i - 1);
    if (IS("first")) return jv_bool(i == 0);
    if (IS("last")) return jv_bool(i == len - 1);
    if (IS("length")) return jv_int(len);
    if (IS("depth")) return jv_int(1);
    if (IS("depth0")) return jv_int(0);
    if (IS("previtem")) return i > 0 ? l->items[i - 1] : jv_undef(ev, "there is no previous item");
    if (IS("nextitem")) return i + 1 < len ? l->items[i + 1] : jv_undef(ev, "there is no next item");
#undef IS
    jv m;
    if (jv_method_find(ev, loop, name, n, &m))
        return m;
    jbuf b = {0};
    jv_write_repr(ev, &b, jv_strn(name, n), 0);
    return jv_undef(ev, "'jinja2.runtime.LoopContext object' has no attribute %.*s", (int)b.n, b.p);
}

/* ---- globals ------------------------------------------------------------------------------- */

static const char *const global_names[JF_COUNT] = {
    [JF_RAISE_EXCEPTION] = "raise_exception", [JF_NAMESPACE] = "namespace", [JF_RANGE] = "range",
    [JF_DICT] = "dict", [JF_STRFTIME_NOW] = "strftime_now",
};

bool jinja_global_find(const char *name, size_t n, jv *out)
{
    for (int i = 0; i < JF_COUNT; i++) {
        if (strlen(global_names[i]) == n && !memcmp(global_names[i], name, n)) {
            jv f = {.kind = JV_FUNC, .id = (uint16_t)i};
            *out = f;
            return true;
        }
    }
    return false;
}

#define JINJA_MAX_RANGE 100000 /* jinja2.sandbox.MAX_RANGE */

static jv make_dict(jev *ev, const jcall *c, bool namespace_keys)
{
    if (c->n_pos > 1)
        jev_fail(ev, TD_EINVAL, "dict expected at most 1 argument, got %zu", c->n_pos);
    jv d = jv_dict_new(ev);
    if (c->n_pos == 1) {
        jv src = c->pos[0];
        if (src.kind == JV_DICT || src.kind == JV_NS) {
            for (size_t i = 0; i < src.d->n; i++)
                jdict_set(ev, d.d, src.d->e[i].k, src.d->e[i].kn, src.d->e[i].v);
        } else {
            jv items = jv_iterate(ev, src);
            for (size_t i = 0; i < items.l->n; i++) {
                jv pair = items.l->v[i];
                if (pair.kind != JV_LIST || pair.l->n != 2 || pair.l->v[0].kind != JV_STR)
                    jev_fail(ev, TD_EINVAL, "dictionary update sequence element #%zu is not a (str, value) pair", i);
                jdict_set(ev, d.d, pair.l->v[0].s.p, pair.l->v[0].s.n, pair.l->v[1]);
            }
        }
    }
    for (size_t k = 0; k < c->n_kw; k++)
        jdict_set(ev, d.d, c->kw[k], strlen(c->kw[k]), c->kw_val[k]);
    for (size_t i = 0; namespace_keys && i < d.d->n; i++)
        if (d.d->e[i].kn > 0 && d.d->e[i].k[0] == '_')
            jev_fail(ev, TD_EINVAL,
                     "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%.*s'. "
                     "Please rename the attribute.", (int)d.d->e[i].kn, d.d->e[i].k);
    return d;
}

static jv call_global(jev *ev, jfunc_id id, const jcall *c)
{
    jv a[3];
    switch (id) {
    case JF_RAISE_EXCEPTION: {
        static const char *const p[] = {"message"};
        jcall_bind(ev, "raise_exception", c, p, 1, a);
        if (a[0].kind == JV_MISSING)
            jev_fail(ev, TD_EINVAL, "raise_exception() missing 1 required positional argument: 'message'");
        jv msg = jv_to_str(ev, a[0]);
        jev_fail(ev, TD_EINVAL, "%.*s", (int)msg.s.n, msg.s.p);
    }
    case JF_NAMESPACE: {
        jv ns = make_dict(ev, c, true);
        ns.kind = JV_NS;
        return ns;
    }
    case JF_DICT: return make_dict(ev, c, false);
    case JF_RANGE: {
        if (c->n_kw)
            jev_fail(ev, TD_EINVAL, "range() takes no keyword arguments");
        if (c->n_pos < 1 || c->n_pos > 3)
            jev_fail(ev, TD_EINVAL, "range expected 1 to 3 arguments, got %zu", c->n_pos);
        int64_t start = 0, stop, step = 1;
        if (c->n_pos == 1) {
            stop = want_int(ev, c->pos[0], 0);
        } else {
            start = want_int(ev, c->pos[0], 0);
            stop = want_int(ev, c->pos[1], 0);
            if (c->n_pos == 3)
                step = want_int(ev, c->pos[2], 1);
        }
        if (step == 0)
            jev_fail(ev, TD_EINVAL, "range() arg 3 must not be zero");
        int64_t count = 0;
        if (step > 0 && start < stop)
            count = (int64_t)(((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)step) + 1;
        else if (step < 0 && stop < start)
            count = (int64_t)(((uint64_t)start - (uint64_t)stop - 1) / ((uint64_t)0 - (uint64_t)step)) + 1;
        if (count > JINJA_MAX_RANGE)
            jev_fail(ev, TD_ERANGE, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).",
                     JINJA_MAX_RANGE);
        jv r = jv_list_new(ev, (size_t)count);
        for (int64_t k = 0; k < count; k++)
            r.l->v[k] = jv_int(start + k * step);
        r.l->n = (size_t)count;
        jev_charge(ev, (size_t)count);
        return r;
    }
    case JF_STRFTIME_NOW: {
        static const char *const p[] = {"format"};
        jcall_bind(ev, "strftime_now", c, p, 1, a);
        jv fmt = want_str(ev, a[0]);
        char f[256], out[512];
        if (fmt.s.n >= sizeof f)
            jev_fail(ev, TD_ENOTSUP, "strftime_now: format longer than %zu bytes", sizeof f - 1);
        memcpy(f, fmt.s.p, fmt.s.n);
        f[fmt.s.n] = 0;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(out, sizeof out, f, &tm);
        return jv_str_copy(ev, out, n);
    }
    case JF_COUNT: break;
    }
    TD_ASSERT(!"unknown global function");
    return jv_none();
}

jv jv_call(jev *ev, jv fn, const jcall *c)
{
    switch ((jv_kind)fn.kind) {
    case JV_MACRO: return jev_call_macro(ev, fn, c);
    case JV_FUNC: return call_global(ev, (jfunc_id)fn.id, c);
    case JV_METHOD: return call_method(ev, fn, c);
    case JV_UNDEF: jev_fail_undef(ev, fn);
    default: jev_fail(ev, TD_EINVAL, "'%s' object is not callable", jv_type_name(fn));
    }
}
