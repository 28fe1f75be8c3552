/* Values as text, the way Python writes them: str() and repr() (what {{ x }} and the string
 * filter print, containers included), json.dumps (the tojson filter transformers installs:
 * ensure_ascii=False, ", " and ": " separators unless indent or separators say otherwise),
 * float repr (shortest digits that read back to the same double), and markupsafe's escape. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "common/jinja_int.h"

const char *jv_type_name(jv v)
{
    switch ((jv_kind)v.kind) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return v.flags & JV_F_MARKUP ? "Markup" : "str";
    case JV_LIST: return v.flags & JV_F_TUPLE ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "TemplateNamespace";
    case JV_MACRO: return "Macro";
    case JV_LOOP: return "LoopContext";
    case JV_FUNC: return "function";
    case JV_METHOD: return "builtin_function_or_method";
    case JV_MISSING: break;
    }
    return "object";
}

const char *jv_obj_repr(jv v)
{
    switch ((jv_kind)v.kind) {
    case JV_NONE: return "None";
    case JV_UNDEF: return "jinja2.runtime.Undefined object";
    case JV_STR: return v.flags & JV_F_MARKUP ? "markupsafe.Markup object" : "str object";
    case JV_NS: return "transformers.utils.chat_template_utils.TemplateNamespace object";
    case JV_MACRO: return "jinja2.runtime.Macro object";
    case JV_LOOP: return "jinja2.runtime.LoopContext object";
    case JV_BOOL: return "bool object";
    case JV_INT: return "int object";
    case JV_FLOAT: return "float object";
    case JV_LIST: return v.flags & JV_F_TUPLE ? "tuple object" : "list object";
    case JV_DICT: return "dict object";
    case JV_FUNC: return "function object";
    case JV_METHOD: return "builtin_function_or_method object";
    case JV_MISSING: break;
    }
    return "object";
}

/* ---- float repr ---------------------------------------------------------------------------- */

/* Shortest decimal digits of f (> 0, finite) that read back as f; the value is
 * 0.DIGITS * 10^decpt. Among the shortest strings, the one nearest f (as David Gay's dtoa mode
 * 0, which Python uses). */
static void float_digits(double f, char digits[24], int *decpt)
{
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        char *e = strchr(buf, 'e');
        int exp10 = atoi(e + 1);
        uint64_t m = 0;
        for (char *p = buf; p < e; p++)
            if (*p >= '0' && *p <= '9')
                m = m * 10 + (uint64_t)(*p - '0');
        /* the nearest prec-digit decimal, else a neighbour of it may still read back when the
         * rounding interval is lopsided (at powers of two) */
        uint64_t low = 1;
        for (int i = 1; i < prec; i++)
            low *= 10;
        int scale = exp10 - prec + 1; /* value = mantissa * 10^scale */
        uint64_t cand[3] = {m, m + 1, m == low ? m * 10 - 1 : m - 1};
        int cscale[3] = {scale, scale, m == low ? scale - 1 : scale};
        for (int c = 0; c < 3; c++) {
            char t[48];
            snprintf(t, sizeof t, "%llue%d", (unsigned long long)cand[c], cscale[c]);
            if (strtod(t, NULL) != f)
                continue;
            int nd = snprintf(digits, 24, "%llu", (unsigned long long)cand[c]);
            *decpt = cscale[c] + nd;
            while (nd > 1 && digits[nd - 1] == '0')
                digits[--nd] = 0;
            return;
        }
    }
    /* %.17e always reads back; not reached */
    snprintf(digits, 24, "0");
    *decpt = 1;
}

void py_float_repr(double f, char out[32])
{
    if (isnan(f)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(out, f < 0 ? "-inf" : "inf");
        return;
    }
    char *o = out;
    if (signbit(f)) {
        *o++ = '-';
        f = -f;
    }
    if (f == 0) {
        strcpy(o, "0.0");
        return;
    }
    char d[24];
    int decpt;
    float_digits(f, d, &decpt);
    int nd = (int)strlen(d);
    if (decpt <= -4 || decpt > 16) {
        *o++ = d[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, d + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        int e = decpt - 1;
        sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    } else if (decpt <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -decpt; i++)
            *o++ = '0';
        memcpy(o, d, (size_t)nd);
        o[nd] = 0;
    } else if (decpt >= nd) {
        memcpy(o, d, (size_t)nd);
        o += nd;
        for (int i = nd; i < decpt; i++)
            *o++ = '0';
        strcpy(o, ".0");
    } else {
        memcpy(o, d, (size_t)decpt);
        o += decpt;
        *o++ = '.';
        memcpy(o, d + decpt, (size_t)(nd - decpt));
        o[nd - decpt] = 0;
    }
}

/* ---- str / repr ------------------------------------------------------------------------------ */

static void check_depth(jev *ev, uint32_t depth)
{
    if (depth > ev->lim.max_depth)
        jev_fail(ev, TD_ERANGE, "maximum recursion depth exceeded (values nested more than %u levels)",
                 ev->lim.max_depth);
}

/* Python str.isprintable for one non-ASCII code point. */
static bool py_isprintable(uint32_t cp)
{
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP:
        return false;
    default:
        return true;
    }
}

static void write_str_repr(jev *ev, jbuf *b, const char *p, size_t n)
{
    jev_charge(ev, n);
    bool has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jbuf_putc(ev, b, q);
    size_t run = 0; /* start of the pending run of bytes copied as they are */
    for (size_t i = 0; i < n;) {
        size_t next;
        uint32_t c = utf8_decode(p, n, i, &next);
        char esc[16];
        const char *e = NULL;
        if (c == (uint32_t)q || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            esc[2] = 0;
            e = esc;
        } else if (c == '\t') {
            e = "\\t";
        } else if (c == '\n') {
            e = "\\n";
        } else if (c == '\r') {
            e = "\\r";
        } else if (c < 0x20 || c == 0x7F) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            e = esc;
        } else if (c >= 0x80 && !py_isprintable(c)) {
            snprintf(esc, sizeof esc, c <= 0xFF ? "\\x%02x" : c <= 0xFFFF ? "\\u%04x" : "\\U%08x", c);
            e = esc;
        }
        if (e) {
            jbuf_put(ev, b, p + run, i - run);
            jbuf_puts(ev, b, e);
            run = next;
        }
        i = next;
    }
    jbuf_put(ev, b, p + run, n - run);
    jbuf_putc(ev, b, q);
}

static void write_scalar(jev *ev, jbuf *b, jv v)
{
    char buf[40];
    switch ((jv_kind)v.kind) {
    case JV_NONE: jbuf_puts(ev, b, "None"); return;
    case JV_BOOL: jbuf_puts(ev, b, v.b ? "True" : "False"); return;
    case JV_INT: snprintf(buf, sizeof buf, "%lld", (long long)v.i); jbuf_puts(ev, b, buf); return;
    case JV_FLOAT: py_float_repr(v.f, buf); jbuf_puts(ev, b, buf); return;
    case JV_MACRO: jbuf_puts(ev, b, "<Macro '"); jbuf_puts(ev, b, v.m->node->name); jbuf_puts(ev, b, "'>"); return;
    case JV_LOOP:
        snprintf(buf, sizeof buf, "<LoopContext %zu/%zu>", v.loop->i + 1, v.loop->n);
        jbuf_puts(ev, b, buf);
        return;
    case JV_FUNC: jbuf_puts(ev, b, "<function>"); return;
    case JV_METHOD: jbuf_puts(ev, b, "<built-in method>"); return;
    default: TD_ASSERT(!"not a scalar"); return;
    }
}

void jv_write_repr(jev *ev, jbuf *b, jv v, uint32_t depth)
{
    check_depth(ev, depth);
    switch ((jv_kind)v.kind) {
    case JV_UNDEF: jbuf_puts(ev, b, "Undefined"); return;
    case JV_MISSING: jbuf_puts(ev, b, "missing"); return;
    case JV_STR:
        if (v.flags & JV_F_MARKUP) {
            jbuf_puts(ev, b, "Markup(");
            write_str_repr(ev, b, v.s.p, v.s.n);
            jbuf_putc(ev, b, ')');
        } else {
            write_str_repr(ev, b, v.s.p, v.s.n);
        }
        return;
    case JV_LIST: {
        bool tuple = v.flags & JV_F_TUPLE;
        jbuf_putc(ev, b, tuple ? '(' : '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i)
                jbuf_puts(ev, b, ", ");
            jv_write_repr(ev, b, v.l->v[i], depth + 1);
        }
        if (tuple && v.l->n == 1)
            jbuf_putc(ev, b, ',');
        jbuf_putc(ev, b, tuple ? ')' : ']');
        return;
    }
    case JV_DICT:
    case JV_NS: {
        if (v.kind == JV_NS)
            jbuf_puts(ev, b, "<Namespace ");
        jbuf_putc(ev, b, '{');
        for (size_t i = 0; i < v.d->n; i++) {
            if (i)
                jbuf_puts(ev, b, ", ");
            write_str_repr(ev, b, v.d->e[i].k, v.d->e[i].kn);
            jbuf_puts(ev, b, ": ");
            jv_write_repr(ev, b, v.d->e[i].v, depth + 1);
        }
        jbuf_putc(ev, b, '}');
        if (v.kind == JV_NS)
            jbuf_putc(ev, b, '>');
        return;
    }
    default:
        write_scalar(ev, b, v);
    }
}

void jv_write_str(jev *ev, jbuf *b, jv v, uint32_t depth)
{
    if (v.kind == JV_STR)
        jbuf_put(ev, b, v.s.p, v.s.n);
    else if (v.kind == JV_UNDEF)
        return;
    else
        jv_write_repr(ev, b, v, depth);
}

jv jv_to_str(jev *ev, jv v)
{
    if (v.kind == JV_STR)
        return v;
    jbuf b = {0};
    jv_write_str(ev, &b, v, 0);
    return jbuf_str(&b);
}

/* ---- json.dumps ------------------------------------------------------------------------------ */

static void write_json_str(jev *ev, jbuf *b, const char *p, size_t n, bool ensure_ascii)
{
    jev_charge(ev, n);
    jbuf_putc(ev, b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n;) {
        size_t next;
        uint32_t c = utf8_decode(p, n, i, &next);
        char esc[16];
        const char *e = NULL;
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
                if (c >= 0x10000) {
                    uint32_t u = c - 0x10000;
                    snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (u >> 10), 0xDC00 + (u & 0x3FF));
                } else {
                    snprintf(esc, sizeof esc, "\\u%04x", c);
                }
                e = esc;
            }
        }
        if (e) {
            jbuf_put(ev, b, p + run, i - run);
            jbuf_puts(ev, b, e);
            run = next;
        }
        i = next;
    }
    jbuf_put(ev, b, p + run, n - run);
    jbuf_putc(ev, b, '"');
}

static void json_newline(jev *ev, jbuf *b, const jjson_opts *o, uint32_t level)
{
    jbuf_putc(ev, b, '\n');
    for (uint32_t i = 0; i < level; i++)
        jbuf_puts(ev, b, o->indent);
}

typedef struct kv_ref {
    const jdict_ent *e;
} kv_ref;

static int kv_cmp(const void *a, const void *b)
{
    const jdict_ent *x = ((const kv_ref *)a)->e, *y = ((const kv_ref *)b)->e;
    size_t n = x->kn < y->kn ? x->kn : y->kn;
    int c = memcmp(x->k, y->k, n); /* UTF-8 byte order is code point order */
    return c ? c : (x->kn > y->kn) - (x->kn < y->kn);
}

void jv_write_json(jev *ev, jbuf *b, jv v, const jjson_opts *o, uint32_t level)
{
    check_depth(ev, level);
    char buf[40];
    switch ((jv_kind)v.kind) {
    case JV_NONE: jbuf_puts(ev, b, "null"); return;
    case JV_BOOL: jbuf_puts(ev, b, v.b ? "true" : "false"); return;
    case JV_INT: snprintf(buf, sizeof buf, "%lld", (long long)v.i); jbuf_puts(ev, b, buf); return;
    case JV_FLOAT:
        if (isnan(v.f))
            jbuf_puts(ev, b, "NaN");
        else if (isinf(v.f))
            jbuf_puts(ev, b, v.f < 0 ? "-Infinity" : "Infinity");
        else {
            py_float_repr(v.f, buf);
            jbuf_puts(ev, b, buf);
        }
        return;
    case JV_STR: write_json_str(ev, b, v.s.p, v.s.n, o->ensure_ascii); return;
    case JV_LIST:
        if (v.l->n == 0) {
            jbuf_puts(ev, b, "[]");
            return;
        }
        jbuf_putc(ev, b, '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i)
                jbuf_puts(ev, b, o->item_sep);
            if (o->indent)
                json_newline(ev, b, o, level + 1);
            jv_write_json(ev, b, v.l->v[i], o, level + 1);
        }
        if (o->indent)
            json_newline(ev, b, o, level);
        jbuf_putc(ev, b, ']');
        return;
    case JV_DICT: {
        size_t n = v.d->n;
        if (n == 0) {
            jbuf_puts(ev, b, "{}");
            return;
        }
        kv_ref *order = jev_alloc(ev, n * sizeof *order);
        for (size_t i = 0; i < n; i++)
            order[i].e = &v.d->e[i];
        if (o->sort_keys) {
            jev_charge(ev, n * 16);
            qsort(order, n, sizeof *order, kv_cmp);
        }
        jbuf_putc(ev, b, '{');
        for (size_t i = 0; i < n; i++) {
            if (i)
                jbuf_puts(ev, b, o->item_sep);
            if (o->indent)
                json_newline(ev, b, o, level + 1);
            write_json_str(ev, b, order[i].e->k, order[i].e->kn, o->ensure_ascii);
            jbuf_puts(ev, b, o->key_sep);
            jv_write_json(ev, b, order[i].e->v, o, level + 1);
        }
        if (o->indent)
            json_newline(ev, b, o, level);
        jbuf_putc(ev, b, '}');
        return;
    }
    default:
        jev_fail(ev, TD_EINVAL, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

void jv_write_escaped(jev *ev, jbuf *b, const char *p, size_t n)
{
    jev_charge(ev, n);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        const char *e;
        switch (p[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '\'': e = "&#39;"; break;
        case '"': e = "&#34;"; break;
        default: continue;
        }
        jbuf_put(ev, b, p + run, i - run);
        jbuf_puts(ev, b, e);
        run = i + 1;
    }
    jbuf_put(ev, b, p + run, n - run);
}
