/* Jinja filters with jinja2's behaviour (filters.py) and transformers' tojson (json.dumps
 * with ensure_ascii=False and its indent/separators/sort_keys arguments). The table is looked
 * up by name when a template is compiled; a name missing here is a compile error rather than
 * a surprise at render time. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja_int.h"

typedef jv (*filter_fn)(jev *ev, jv v, const jcall *c);

static bool given(jv v) { return v.kind != JV_MISSING; }

/* soft_str: strings (Markup included) as they are, everything else through str(). */
static jv soft_str(jev *ev, jv v)
{
    return jv_to_str(ev, v);
}

static jv f_tojson(jev *ev, jv v, const jcall *c)
{
    static const char *const p[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    jv a[4];
    jcall_bind(ev, "tojson", c, p, 4, a);
    jjson_opts o = {.item_sep = ", ", .key_sep = ": "};
    o.ensure_ascii = given(a[0]) && jv_truthy(a[0]);
    o.sort_keys = given(a[3]) && jv_truthy(a[3]);
    if (given(a[1]) && a[1].kind != JV_NONE) {
        if (a[1].kind == JV_STR) {
            o.indent = jv_str_copy(ev, a[1].s.p, a[1].s.n).s.p;
        } else if (a[1].kind == JV_INT) {
            int64_t w = a[1].i < 0 ? 0 : a[1].i > 64 ? -1 : a[1].i;
            if (w < 0)
                jev_fail(ev, TD_ENOTSUP, "tojson: indent wider than 64 is not supported");
            char *s = jev_alloc(ev, (size_t)w + 1);
            memset(s, ' ', (size_t)w);
            o.indent = s;
        } else {
            jev_fail(ev, TD_EINVAL, "tojson: indent must be an integer or a string, not %s", jv_type_name(a[1]));
        }
        o.item_sep = ",";
    }
    if (given(a[2]) && a[2].kind != JV_NONE) {
        jv s = a[2];
        if (s.kind != JV_LIST || s.l->n != 2 || s.l->v[0].kind != JV_STR || s.l->v[1].kind != JV_STR)
            jev_fail(ev, TD_EINVAL, "tojson: separators must be a pair of strings");
        o.item_sep = jv_str_copy(ev, s.l->v[0].s.p, s.l->v[0].s.n).s.p;
        o.key_sep = jv_str_copy(ev, s.l->v[1].s.p, s.l->v[1].s.n).s.p;
    }
    jbuf b = {0};
    jv_write_json(ev, &b, v, &o, 0);
    return jbuf_str(&b);
}

static jv f_trim(jev *ev, jv v, const jcall *c)
{
    static const char *const p[] = {"chars"};
    jv a[1];
    jcall_bind(ev, "trim", c, p, 1, a);
    return jstr_strip(ev, soft_str(ev, v), a[0], true, true);
}

static jv f_length(jev *ev, jv v, const jcall *c)
{
    jcall_bind(ev, "length", c, NULL, 0, NULL);
    return jv_int(jv_length(ev, v));
}

static jv f_string(jev *ev, jv v, const jcall *c)
{
    jcall_bind(ev, "string", c, NULL, 0, NULL);
    return soft_str(ev, v);
}

static jv pairs(jev *ev, jv d)
{
    jv out = jv_list_new(ev, d.d->n);
    for (size_t i = 0; i < d.d->n; i++) {
        jv pair = jv_list_new(ev, 2);
        pair.l->v[0] = jv_strn(d.d->e[i].k, d.d->e[i].kn);
        pair.l->v[1] = d.d->e[i].v;
        pair.l->n = 2;
        pair.flags = JV_F_TUPLE;
        out.l->v[i] = pair;
    }
    out.l->n = d.d->n;
    return out;
}

static jv f_items(jev *ev, jv v, const jcall *c)
{
    jcall_bind(ev, "items", c, NULL, 0, NULL);
    if (v.kind == JV_UNDEF)
        return jv_list_new(ev, 0);
    if (v.kind != JV_DICT)
        jev_fail(ev, TD_EINVAL, "Can only get item pairs from a mapping.");
    return pairs(ev, v);
}

static jv f_safe(jev *ev, jv v, const jcall *c)
{
    jcall_bind(ev, "safe", c, NULL, 0, NULL);
    jv s = soft_str(ev, v);
    s.flags |= JV_F_MARKUP;
    return s;
}

static jv f_escape(jev *ev, jv v, const jcall *c)
{
    jcall_bind(ev, "escape", c, NULL, 0, NULL);
    if (v.kind == JV_STR && (v.flags & JV_F_MARKUP))
        return v;
    jv s = soft_str(ev, v);
    jbuf b = {0};
    jv_write_escaped(ev, &b, s.s.p, s.s.n);
    jv r = jbuf_str(&b);
    r.flags = JV_F_MARKUP;
    return r;
}

static jv f_default(jev *ev, jv v, const jcall *c)
{
    static const char *const p[] = {"default_value", "boolean"};
    jv a[2];
    jcall_bind(ev, "default", c, p, 2, a);
    jv dflt = given(a[0]) ? a[0] : jv_str("");
    bool boolean = given(a[1]) && jv_truthy(a[1]);
    if (v.kind == JV_UNDEF || (boolean && !jv_truthy(v)))
        return dflt;
    return v;
}

static jv f_join(jev *ev, jv v, const jcall *c)
{
    static const char *const p[] = {"d", "attribute"};
    jv a[2];
    jcall_bind(ev, "join", c, p, 2, a);
    jv sep = given(a[0]) ? soft_str(ev, a[0]) : jv_str("");
    jv items = jv_iterate(ev, v);
    jbuf b = {0};
    for (size_t i = 0; i < items.l->n; i++) {
        jv it = items.l->v[i];
        if (given(a[1]) && a[1].kind != JV_NONE) {
            jv attr = jv_to_str(ev, a[1]);
            it = jv_getattr(ev, it, attr.s.p, attr.s.n);
        }
        if (i)
            jbuf_put(ev, &b, sep.s.p, sep.s.n);
        jv_write_str(ev, &b, it, 0);
    }
    jev_charge(ev, b.n);
    return jbuf_str(&b);
}

static jv f_case(jev *ev, jv v, const jcall *c, const char *name, char mode)
{
    jcall_bind(ev, name, c, NULL, 0, NULL);
    return jstr_case(ev, soft_str(ev, v), mode);
}
static jv f_upper(jev *ev, jv v, const jcall *c) { return f_case(ev, v, c, "upper", 'u'); }
static jv f_lower(jev *ev, jv v, const jcall *c) { return f_case(ev, v, c, "lower", 'l'); }
static jv f_capitalize(jev *ev, jv v, const jcall *c) { return f_case(ev, v, c, "capitalize", 'c'); }

/* jinja2's title filter: each chunk after a run of [-\s({[<] gets a capital first letter. */
static jv f_title(jev *ev, jv v, const jcall *c)
{
    jcall_bind(ev, "title", c, NULL, 0, NULL);
    jv s = soft_str(ev, v);
    jbuf b = {0};
    size_t i = 0;
    while (i < s.s.n) {
        size_t j = i;
        while (j < s.s.n) { /* a run of separators */
            size_t next;
            uint32_t cp = utf8_decode(s.s.p, s.s.n, j, &next);
            if (!(py_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<'))
                break;
            j = next;
        }
        jbuf_put(ev, &b, s.s.p + i, j - i);
        if (j >= s.s.n)
            break;
        size_t k = j;
        while (k < s.s.n) {
            size_t next;
            uint32_t cp = utf8_decode(s.s.p, s.s.n, k, &next);
            if (py_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<')
                break;
            k = next;
        }
        size_t first = utf8_next(s.s.p, s.s.n, j);
        jv head = jstr_case(ev, jv_strn(s.s.p + j, first - j), 'u');
        jv tail = jstr_case(ev, jv_strn(s.s.p + first, k - first), 'l');
        jbuf_put(ev, &b, head.s.p, head.s.n);
        jbuf_put(ev, &b, tail.s.p, tail.s.n);
        i = k;
    }
    return jbuf_str(&b);
}

static jv f_first(jev *ev, jv v, const jcall *c)
{
    jcall_bind(ev, "first", c, NULL, 0, NULL);
    jv items = jv_iterate(ev, v);
    return items.l->n ? items.l->v[0] : jv_undef(ev, "No first item, sequence was empty.");
}

static jv f_last(jev *ev, jv v, const jcall *c)
{
    jcall_bind(ev, "last", c, NULL, 0, NULL);
    jv items = jv_iterate(ev, v);
    return items.l->n ? items.l->v[items.l->n - 1] : jv_undef(ev, "No last item, sequence was empty.");
}

static jv copy_list(jev *ev, jv items)
{
    jv r = jv_list_new(ev, items.l->n);
    if (items.l->n)
        jmemcpy(r.l->v, items.l->v, items.l->n * sizeof(jv));
    r.l->n = items.l->n;
    return r;
}

static jv f_list(jev *ev, jv v, const jcall *c)
{
    jcall_bind(ev, "list", c, NULL, 0, NULL);
    return copy_list(ev, jv_iterate(ev, v));
}

static jv f_reverse(jev *ev, jv v, const jcall *c)
{
    jcall_bind(ev, "reverse", c, NULL, 0, NULL);
    if (v.kind == JV_STR)
        return jv_slice(ev, v, jv_none(), jv_none(), jv_int(-1));
    jv r = copy_list(ev, jv_iterate(ev, v));
    for (size_t a = 0, b = r.l->n; b > a + 1; a++, b--) {
        jv t = r.l->v[a];
        r.l->v[a] = r.l->v[b - 1];
        r.l->v[b - 1] = t;
    }
    return r;
}

static jv f_replace(jev *ev, jv v, const jcall *c)
{
    static const char *const p[] = {"old", "new", "count"};
    jv a[3];
    jcall_bind(ev, "replace", c, p, 3, a);
    if (!given(a[0]) || !given(a[1]))
        jev_fail(ev, TD_EINVAL, "do_replace() missing required arguments 'old' and 'new'");
    int64_t count = given(a[2]) && a[2].kind == JV_INT ? a[2].i : -1;
    return jstr_replace(ev, soft_str(ev, v), soft_str(ev, a[0]), soft_str(ev, a[1]), count);
}

/* Python int(str, base) for a decimal/prefixed literal with optional sign and spaces. */
static bool parse_int(jv s, int base, int64_t *out)
{
    char buf[80];
    if (s.s.n >= sizeof buf)
        return false;
    memcpy(buf, s.s.p, s.s.n);
    buf[s.s.n] = 0;
    char *p = buf;
    while (*p == ' ' || (*p >= '\t' && *p <= '\r'))
        p++;
    if (!*p || memchr(p, '_', strlen(p)))
        return false;
    char *end;
    long long v = strtoll(p, &end, base);
    while (*end == ' ' || (*end >= '\t' && *end <= '\r'))
        end++;
    if (*end || end == p)
        return false;
    *out = v;
    return true;
}

static jv f_int(jev *ev, jv v, const jcall *c)
{
    static const char *const p[] = {"default", "base"};
    jv a[2];
    jcall_bind(ev, "int", c, p, 2, a);
    jv dflt = given(a[0]) ? a[0] : jv_int(0);
    int base = given(a[1]) && a[1].kind == JV_INT ? (int)a[1].i : 10;
    int64_t i;
    switch ((jv_kind)v.kind) {
    case JV_INT: return v;
    case JV_BOOL: return jv_int(v.b);
    case JV_FLOAT:
        if (!isfinite(v.f) || fabs(v.f) >= 9.2e18)
            return dflt;
        return jv_int((int64_t)v.f);
    case JV_STR:
        if (parse_int(v, base, &i))
            return jv_int(i);
        {
            char buf[80];
            if (v.s.n < sizeof buf) {
                memcpy(buf, v.s.p, v.s.n);
                buf[v.s.n] = 0;
                char *end;
                double f = strtod(buf, &end);
                if (end != buf && !*end && isfinite(f) && fabs(f) < 9.2e18)
                    return jv_int((int64_t)f);
            }
        }
        return dflt;
    default: return dflt;
    }
}

static jv f_float(jev *ev, jv v, const jcall *c)
{
    static const char *const p[] = {"default"};
    jv a[1];
    jcall_bind(ev, "float", c, p, 1, a);
    jv dflt = given(a[0]) ? a[0] : jv_float(0.0);
    if (v.kind == JV_FLOAT)
        return v;
    if (v.kind == JV_INT || v.kind == JV_BOOL)
        return jv_float(v.kind == JV_INT ? (double)v.i : (double)v.b);
    if (v.kind == JV_STR && v.s.n < 80) {
        char buf[80];
        memcpy(buf, v.s.p, v.s.n);
        buf[v.s.n] = 0;
        char *end;
        double f = strtod(buf, &end);
        while (*end == ' ' || *end == '\n' || *end == '\t')
            end++;
        if (end != buf && !*end)
            return jv_float(f);
    }
    return dflt;
}

static jv f_abs(jev *ev, jv v, const jcall *c)
{
    jcall_bind(ev, "abs", c, NULL, 0, NULL);
    if (v.kind == JV_FLOAT)
        return jv_float(fabs(v.f));
    if (v.kind == JV_INT || v.kind == JV_BOOL) {
        int64_t x = v.kind == JV_INT ? v.i : v.b;
        return x < 0 ? jv_neg(ev, jv_int(x), true) : jv_int(x);
    }
    jev_fail(ev, TD_EINVAL, "bad operand type for abs(): '%s'", jv_type_name(v));
}

/* Attribute paths as jinja2's make_attrgetter: "a.b", integer parts index. */
static jv get_path(jev *ev, jv v, jv attr)
{
    if (attr.kind == JV_INT)
        return jv_getitem(ev, v, attr);
    jv path = jv_to_str(ev, attr);
    size_t i = 0;
    while (i <= path.s.n) {
        const char *dot = memchr(path.s.p + i, '.', path.s.n - i);
        size_t e = dot ? (size_t)(dot - path.s.p) : path.s.n;
        jv part = jv_strn(path.s.p + i, e - i);
        int64_t idx;
        bool numeric = part.s.n > 0 && part.s.n < 19 && strspn(part.s.p, "0123456789") >= part.s.n;
        if (numeric) {
            idx = 0;
            for (size_t k = 0; k < part.s.n; k++)
                idx = idx * 10 + (part.s.p[k] - '0');
            v = jv_getitem(ev, v, jv_int(idx));
        } else {
            v = jv_getitem(ev, v, part);
        }
        if (!dot)
            break;
        i = e + 1;
    }
    return v;
}

/* map(attribute=..., default=...) or map('filter', args...) */
static jv f_map(jev *ev, jv v, const jcall *c)
{
    jv items = jv_iterate(ev, v);
    jv out = jv_list_new(ev, items.l->n);
    const jv *attr = NULL, *dflt = NULL;
    for (size_t k = 0; k < c->n_kw; k++) {
        if (!strcmp(c->kw[k], "attribute"))
            attr = &c->kw_val[k];
        else if (!strcmp(c->kw[k], "default"))
            dflt = &c->kw_val[k];
    }
    int fn = -1;
    jcall rest = {0};
    if (!attr) {
        if (c->n_pos == 0)
            jev_fail(ev, TD_EINVAL, "map requires a filter argument");
        jv name = jv_to_str(ev, c->pos[0]);
        char nm[64];
        snprintf(nm, sizeof nm, "%.*s", (int)(name.s.n < 63 ? name.s.n : 63), name.s.p);
        fn = jinja_filter_find(nm);
        if (fn < 0)
            jev_fail(ev, TD_EINVAL, "No filter named '%s'.", nm);
        rest.pos = c->pos + 1;
        rest.n_pos = c->n_pos - 1;
        rest.kw = c->kw;
        rest.kw_val = c->kw_val;
        rest.n_kw = c->n_kw;
    }
    for (size_t i = 0; i < items.l->n; i++) {
        jev_charge(ev, 0);
        jv x = items.l->v[i];
        if (attr) {
            x = get_path(ev, x, *attr);
            if (x.kind == JV_UNDEF && dflt)
                x = *dflt;
        } else {
            x = jinja_filter_apply(ev, fn, x, &rest);
        }
        out.l->v[out.l->n++] = x;
    }
    return out;
}

static int test_by_name(jev *ev, jv name)
{
    jv s = jv_to_str(ev, name);
    char nm[64];
    snprintf(nm, sizeof nm, "%.*s", (int)(s.s.n < 63 ? s.s.n : 63), s.s.p);
    int t = jinja_test_find(nm);
    if (t < 0)
        jev_fail(ev, TD_EINVAL, "No test named '%s'.", nm);
    return t;
}

/* select/reject(test, args...) and selectattr/rejectattr(attr, test, args...) */
static jv select_common(jev *ev, jv v, const jcall *c, bool by_attr, bool keep)
{
    jv items = jv_iterate(ev, v);
    size_t skip = by_attr ? 1 : 0;
    if (by_attr && c->n_pos < 1)
        jev_fail(ev, TD_EINVAL, "Missing parameter for attribute name");
    int t = c->n_pos > skip ? test_by_name(ev, c->pos[skip]) : -1;
    jcall rest = {0};
    if (c->n_pos > skip + 1) {
        rest.pos = c->pos + skip + 1;
        rest.n_pos = c->n_pos - skip - 1;
    }
    rest.kw = c->kw;
    rest.kw_val = c->kw_val;
    rest.n_kw = c->n_kw;
    jv out = jv_list_new(ev, 0);
    for (size_t i = 0; i < items.l->n; i++) {
        jev_charge(ev, 0);
        jv x = items.l->v[i], probe = by_attr ? get_path(ev, x, c->pos[0]) : x;
        bool ok = t >= 0 ? jinja_test_apply(ev, t, probe, &rest) : jv_truthy(probe);
        if (ok == keep)
            jv_list_push(ev, out, x);
    }
    return out;
}
static jv f_select(jev *ev, jv v, const jcall *c) { return select_common(ev, v, c, false, true); }
static jv f_reject(jev *ev, jv v, const jcall *c) { return select_common(ev, v, c, false, false); }
static jv f_selectattr(jev *ev, jv v, const jcall *c) { return select_common(ev, v, c, true, true); }
static jv f_rejectattr(jev *ev, jv v, const jcall *c) { return select_common(ev, v, c, true, false); }

/* Sort key: the attribute, lower-cased when a string and not case sensitive. */
typedef struct sort_item {
    jv key, val;
} sort_item;

/* Stable merge sort by key; jv_cmp may fail the render (unorderable keys), so no qsort. */
static void merge_sort(jev *ev, sort_item *v, sort_item *tmp, size_t n, bool desc)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    merge_sort(ev, v, tmp, h, desc);
    merge_sort(ev, v + h, tmp, n - h, desc);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c = jv_cmp(ev, v[j].key, v[i].key);
        tmp[k++] = (desc ? c > 0 : c < 0) ? v[j++] : v[i++];
    }
    while (i < h)
        tmp[k++] = v[i++];
    while (j < n)
        tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
    jev_charge(ev, n);
}

static sort_item *sort_keys(jev *ev, jv items, jv attr, bool case_sensitive, bool desc)
{
    size_t n = items.l->n;
    sort_item *s = jev_alloc(ev, (n ? n : 1) * sizeof *s);
    for (size_t i = 0; i < n; i++) {
        jv x = items.l->v[i], k = given(attr) && attr.kind != JV_NONE ? get_path(ev, x, attr) : x;
        if (!case_sensitive && k.kind == JV_STR)
            k = jstr_case(ev, k, 'l');
        s[i].key = k;
        s[i].val = x;
    }
    sort_item *tmp = jev_alloc(ev, (n ? n : 1) * sizeof *tmp);
    merge_sort(ev, s, tmp, n, desc);
    return s;
}

static jv f_sort(jev *ev, jv v, const jcall *c)
{
    static const char *const p[] = {"reverse", "case_sensitive", "attribute"};
    jv a[3];
    jcall_bind(ev, "sort", c, p, 3, a);
    jv items = jv_iterate(ev, v);
    bool rev = given(a[0]) && jv_truthy(a[0]);
    sort_item *s = sort_keys(ev, items, a[2], given(a[1]) && jv_truthy(a[1]), rev);
    size_t n = items.l->n;
    jv out = jv_list_new(ev, n);
    for (size_t i = 0; i < n; i++)
        out.l->v[i] = s[i].val;
    out.l->n = n;
    return out;
}

static jv f_unique(jev *ev, jv v, const jcall *c)
{
    static const char *const p[] = {"case_sensitive", "attribute"};
    jv a[2];
    jcall_bind(ev, "unique", c, p, 2, a);
    jv items = jv_iterate(ev, v), seen = jv_list_new(ev, 0), out = jv_list_new(ev, 0);
    bool cs = given(a[0]) && jv_truthy(a[0]);
    for (size_t i = 0; i < items.l->n; i++) {
        jv x = items.l->v[i], k = given(a[1]) && a[1].kind != JV_NONE ? get_path(ev, x, a[1]) : x;
        if (!cs && k.kind == JV_STR)
            k = jstr_case(ev, k, 'l');
        bool dup = false;
        for (size_t j = 0; j < seen.l->n && !dup; j++)
            dup = jv_equal(ev, seen.l->v[j], k, 0);
        jev_charge(ev, seen.l->n);
        if (!dup) {
            jv_list_push(ev, seen, k);
            jv_list_push(ev, out, x);
        }
    }
    return out;
}

static jv minmax(jev *ev, jv v, const jcall *c, bool want_max)
{
    static const char *const p[] = {"case_sensitive", "attribute"};
    jv a[2];
    jcall_bind(ev, want_max ? "max" : "min", c, p, 2, a);
    jv items = jv_iterate(ev, v);
    if (items.l->n == 0)
        return jv_undef(ev, "No aggregated item, sequence was empty.");
    sort_item *s = sort_keys(ev, items, a[1], given(a[0]) && jv_truthy(a[0]), false);
    if (!want_max)
        return s[0].val;
    /* max() keeps the first of equal maxima */
    size_t k = items.l->n - 1;
    while (k > 0 && jv_cmp(ev, s[k - 1].key, s[k].key) == 0)
        k--;
    return s[k].val;
}
static jv f_min(jev *ev, jv v, const jcall *c) { return minmax(ev, v, c, false); }
static jv f_max(jev *ev, jv v, const jcall *c) { return minmax(ev, v, c, true); }

static jv f_sum(jev *ev, jv v, const jcall *c)
{
    static const char *const p[] = {"attribute", "start"};
    jv a[2];
    jcall_bind(ev, "sum", c, p, 2, a);
    jv acc = given(a[1]) ? a[1] : jv_int(0);
    jv items = jv_iterate(ev, v);
    for (size_t i = 0; i < items.l->n; i++) {
        jv x = items.l->v[i];
        if (given(a[0]) && a[0].kind != JV_NONE)
            x = get_path(ev, x, a[0]);
        acc = jv_binop(ev, JOP_ADD, acc, x);
    }
    return acc;
}

static jv f_indent(jev *ev, jv v, const jcall *c)
{
    static const char *const p[] = {"width", "first", "blank"};
    jv a[3];
    jcall_bind(ev, "indent", c, p, 3, a);
    jv ind;
    if (given(a[0]) && a[0].kind == JV_STR) {
        ind = a[0];
    } else {
        int64_t w = given(a[0]) ? (a[0].kind == JV_INT ? a[0].i : 0) : 4;
        ind = jv_binop(ev, JOP_MUL, jv_str(" "), jv_int(w));
    }
    bool first = given(a[1]) && jv_truthy(a[1]), blank = given(a[2]) && jv_truthy(a[2]);
    /* jinja2 appends a newline so that splitlines keeps a trailing empty line */
    jv s = jv_binop(ev, JOP_ADD, soft_str(ev, v), jv_str("\n"));
    jcall none = {0};
    jv m;
    TD_ASSERT(jv_method_find(ev, s, "splitlines", 10, &m));
    jv sl = jv_call(ev, m, &none);
    jbuf b = {0};
    if (first)
        jbuf_put(ev, &b, ind.s.p, ind.s.n);
    for (size_t i = 0; i < sl.l->n; i++) {
        jv line = sl.l->v[i];
        if (i) {
            jbuf_putc(ev, &b, '\n');
            if (blank || line.s.n)
                jbuf_put(ev, &b, ind.s.p, ind.s.n);
        }
        jbuf_put(ev, &b, line.s.p, line.s.n);
    }
    jv r = jbuf_str(&b);
    r.flags = s.flags;
    return r;
}

static jv f_dictsort(jev *ev, jv v, const jcall *c)
{
    static const char *const p[] = {"case_sensitive", "by", "reverse"};
    jv a[3];
    jcall_bind(ev, "dictsort", c, p, 3, a);
    if (v.kind != JV_DICT)
        jev_fail(ev, TD_EINVAL, "'%s' object has no attribute 'items'", jv_type_name(v));
    jv items = pairs(ev, v);
    bool by_value = given(a[1]) && a[1].kind == JV_STR && a[1].s.n == 5 && !memcmp(a[1].s.p, "value", 5);
    bool rev = given(a[2]) && jv_truthy(a[2]);
    sort_item *s = sort_keys(ev, items, jv_int(by_value ? 1 : 0), given(a[0]) && jv_truthy(a[0]), rev);
    size_t n = items.l->n;
    jv out = jv_list_new(ev, n);
    for (size_t i = 0; i < n; i++)
        out.l->v[i] = s[i].val;
    out.l->n = n;
    return out;
}

static jv f_attr(jev *ev, jv v, const jcall *c)
{
    static const char *const p[] = {"name"};
    jv a[1];
    jcall_bind(ev, "attr", c, p, 1, a);
    jv name = jv_to_str(ev, a[0]);
    /* a Python attribute only, never an item: d|attr('key') is undefined for a dict key */
    if (v.kind == JV_NS || v.kind == JV_LOOP || v.kind == JV_UNDEF)
        return jv_getattr(ev, v, name.s.p, name.s.n);
    jv m;
    if (jv_method_find(ev, v, name.s.p, name.s.n, &m))
        return m;
    jbuf b = {0};
    jv_write_repr(ev, &b, name, 0);
    return jv_undef(ev, "'%s' has no attribute %.*s", jv_obj_repr(v), (int)b.n, b.p);
}

static jv f_round(jev *ev, jv v, const jcall *c)
{
    static const char *const p[] = {"precision", "method"};
    jv a[2];
    jcall_bind(ev, "round", c, p, 2, a);
    if (v.kind != JV_INT && v.kind != JV_FLOAT && v.kind != JV_BOOL)
        jev_fail(ev, TD_EINVAL, "round: expected a number, got %s", jv_type_name(v));
    double x = v.kind == JV_FLOAT ? v.f : v.kind == JV_INT ? (double)v.i : v.b;
    int64_t prec = given(a[0]) && a[0].kind == JV_INT ? a[0].i : 0;
    double scale = pow(10.0, (double)prec);
    const char *method = "common";
    char mbuf[16] = "common";
    if (given(a[1]) && a[1].kind == JV_STR && a[1].s.n < sizeof mbuf) {
        memcpy(mbuf, a[1].s.p, a[1].s.n);
        mbuf[a[1].s.n] = 0;
        method = mbuf;
    }
    double r;
    if (!strcmp(method, "ceil"))
        r = ceil(x * scale) / scale;
    else if (!strcmp(method, "floor"))
        r = floor(x * scale) / scale;
    else if (!strcmp(method, "common"))
        r = nearbyint(x * scale) / scale; /* Python's round: half to even */
    else
        jev_fail(ev, TD_EINVAL, "method must be common, ceil or floor");
    return jv_float(r);
}

static const struct {
    const char *name;
    filter_fn fn;
} filters[] = {
    {"tojson", f_tojson}, {"trim", f_trim}, {"length", f_length}, {"count", f_length},
    {"string", f_string}, {"items", f_items}, {"safe", f_safe}, {"escape", f_escape},
    {"e", f_escape}, {"default", f_default}, {"d", f_default}, {"join", f_join},
    {"upper", f_upper}, {"lower", f_lower}, {"title", f_title}, {"capitalize", f_capitalize},
    {"first", f_first}, {"last", f_last}, {"list", f_list}, {"reverse", f_reverse},
    {"replace", f_replace}, {"int", f_int}, {"float", f_float}, {"abs", f_abs}, {"map", f_map},
    {"select", f_select}, {"reject", f_reject}, {"selectattr", f_selectattr},
    {"rejectattr", f_rejectattr}, {"sort", f_sort}, {"unique", f_unique}, {"min", f_min},
    {"max", f_max}, {"sum", f_sum}, {"indent", f_indent}, {"dictsort", f_dictsort},
    {"attr", f_attr}, {"round", f_round},
};

#define N_FILTERS (sizeof filters / sizeof filters[0])

int jinja_filter_find(const char *name)
{
    for (size_t i = 0; i < N_FILTERS; i++)
        if (!strcmp(filters[i].name, name))
            return (int)i;
    return -1;
}

jv jinja_filter_apply(jev *ev, int fn, jv v, const jcall *c)
{
    TD_ASSERT(fn >= 0 && (size_t)fn < N_FILTERS);
    jev_charge(ev, 0);
    return filters[fn].fn(ev, v, c);
}
