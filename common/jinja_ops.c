/* Operators on values with Python's semantics (what jinja2 compiles templates to): truthiness,
 * ==/</in, + - * / // % ** with int/float/str/list rules and Python's error messages, and
 * attribute and item access as jinja2's sandbox does them (a real attribute first, then the
 * item; a miss is an Undefined whose use fails with "'dict object' has no attribute 'x'"). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/jinja_int.h"

bool jv_truthy(jv v)
{
    switch ((jv_kind)v.kind) {
    case JV_UNDEF:
    case JV_NONE:
    case JV_MISSING: return false;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0;
    case JV_STR: return v.s.n > 0;
    case JV_LIST: return v.l->n > 0;
    case JV_DICT: return v.d->n > 0;
    default: return true;
    }
}

static bool is_num(jv v) { return v.kind == JV_INT || v.kind == JV_BOOL || v.kind == JV_FLOAT; }
static bool is_intlike(jv v) { return v.kind == JV_INT || v.kind == JV_BOOL; }
static int64_t as_int(jv v) { return v.kind == JV_BOOL ? (int64_t)v.b : v.i; }
static double as_float(jv v) { return v.kind == JV_FLOAT ? v.f : (double)as_int(v); }

/* Exact comparison of an integer with a double, as Python does it. */
static int cmp_int_float(int64_t i, double f)
{
    if (isnan(f))
        return 2; /* unordered */
    if (f >= 9223372036854775808.0)
        return -1;
    if (f < -9223372036854775808.0)
        return 1;
    double fl = floor(f);
    int64_t fi = (int64_t)fl;
    if (i != fi)
        return i < fi ? -1 : 1;
    return fl == f ? 0 : -1; /* i == floor(f) < f */
}

static int cmp_num(jv a, jv b)
{
    if (is_intlike(a) && is_intlike(b)) {
        int64_t x = as_int(a), y = as_int(b);
        return (x > y) - (x < y);
    }
    if (a.kind == JV_FLOAT && b.kind == JV_FLOAT) {
        if (isnan(a.f) || isnan(b.f))
            return 2;
        return (a.f > b.f) - (a.f < b.f);
    }
    if (a.kind == JV_FLOAT) {
        int c = cmp_int_float(as_int(b), a.f);
        return c == 2 ? 2 : -c;
    }
    return cmp_int_float(as_int(a), b.f);
}

static int cmp_bytes(const char *a, size_t an, const char *b, size_t bn)
{
    size_t n = an < bn ? an : bn;
    int c = n ? memcmp(a, b, n) : 0;
    if (c)
        return c < 0 ? -1 : 1;
    return (an > bn) - (an < bn);
}

bool jv_equal(jev *ev, jv a, jv b, uint32_t depth)
{
    if (depth > ev->lim.max_depth)
        jev_fail(ev, TD_ERANGE, "maximum recursion depth exceeded in comparison");
    if (is_num(a) && is_num(b))
        return cmp_num(a, b) == 0;
    if (a.kind != b.kind)
        return false;
    switch ((jv_kind)a.kind) {
    case JV_UNDEF:
    case JV_NONE:
    case JV_MISSING: return true;
    case JV_STR:
        jev_charge(ev, a.s.n);
        return a.s.n == b.s.n && (a.s.n == 0 || !memcmp(a.s.p, b.s.p, a.s.n));
    case JV_LIST:
        if ((a.flags & JV_F_TUPLE) != (b.flags & JV_F_TUPLE) || a.l->n != b.l->n)
            return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!jv_equal(ev, a.l->v[i], b.l->v[i], depth + 1))
                return false;
        return true;
    case JV_DICT:
        if (a.d->n != b.d->n)
            return false;
        for (size_t i = 0; i < a.d->n; i++) {
            jv *o = jdict_get(b.d, a.d->e[i].k, a.d->e[i].kn);
            if (!o || !jv_equal(ev, a.d->e[i].v, *o, depth + 1))
                return false;
        }
        return true;
    case JV_NS: return a.d == b.d;
    case JV_MACRO: return a.m == b.m;
    case JV_LOOP: return a.loop == b.loop;
    case JV_FUNC: return a.id == b.id;
    default: return false;
    }
}

_Noreturn static void fail_order(jev *ev, const char *op, jv a, jv b)
{
    jev_fail(ev, TD_EINVAL, "'%s' not supported between instances of '%s' and '%s'", op,
             jv_type_name(a), jv_type_name(b));
}

static int cmp_op(jev *ev, const char *op, jv a, jv b, uint32_t depth)
{
    if (a.kind == JV_UNDEF)
        jev_fail_undef(ev, a);
    if (b.kind == JV_UNDEF)
        jev_fail_undef(ev, b);
    if (is_num(a) && is_num(b))
        return cmp_num(a, b);
    if (a.kind == JV_STR && b.kind == JV_STR) {
        jev_charge(ev, a.s.n < b.s.n ? a.s.n : b.s.n);
        return cmp_bytes(a.s.p, a.s.n, b.s.p, b.s.n); /* UTF-8 order = code point order */
    }
    if (a.kind == JV_LIST && b.kind == JV_LIST && (a.flags & JV_F_TUPLE) == (b.flags & JV_F_TUPLE)) {
        if (depth > ev->lim.max_depth)
            jev_fail(ev, TD_ERANGE, "maximum recursion depth exceeded in comparison");
        size_t n = a.l->n < b.l->n ? a.l->n : b.l->n;
        for (size_t i = 0; i < n; i++)
            if (!jv_equal(ev, a.l->v[i], b.l->v[i], depth + 1))
                return cmp_op(ev, op, a.l->v[i], b.l->v[i], depth + 1);
        return (a.l->n > b.l->n) - (a.l->n < b.l->n);
    }
    fail_order(ev, op, a, b);
}

int jv_cmp(jev *ev, jv a, jv b)
{
    int c = cmp_op(ev, "<", a, b, 0);
    return c == 2 ? 1 : c;
}

static bool contains(jev *ev, jv container, jv item)
{
    switch ((jv_kind)container.kind) {
    case JV_STR:
        if (item.kind != JV_STR)
            jev_fail(ev, TD_EINVAL, "'in <string>' requires string as left operand, not %s", jv_type_name(item));
        jev_charge(ev, container.s.n);
        return item.s.n == 0 || memmem(container.s.p, container.s.n, item.s.p, item.s.n) != NULL;
    case JV_LIST:
        for (size_t i = 0; i < container.l->n; i++)
            if (jv_equal(ev, container.l->v[i], item, 0))
                return true;
        return false;
    case JV_DICT:
        if (item.kind == JV_STR)
            return jdict_get(container.d, item.s.p, item.s.n) != NULL;
        if (item.kind == JV_LIST && !(item.flags & JV_F_TUPLE))
            jev_fail(ev, TD_EINVAL, "unhashable type: 'list'");
        if (item.kind == JV_DICT || item.kind == JV_NS)
            jev_fail(ev, TD_EINVAL, "unhashable type: '%s'", jv_type_name(item));
        return false;
    case JV_UNDEF: return false;
    default:
        jev_fail(ev, TD_EINVAL, "argument of type '%s' is not iterable", jv_type_name(container));
    }
}

jv jv_compare(jev *ev, int op, jv a, jv b)
{
    switch (op) {
    case JOP_EQ: return jv_bool(jv_equal(ev, a, b, 0));
    case JOP_NE: return jv_bool(!jv_equal(ev, a, b, 0));
    case JOP_IN: return jv_bool(contains(ev, b, a));
    case JOP_NOTIN: return jv_bool(!contains(ev, b, a));
    }
    const char *name = op == JOP_LT ? "<" : op == JOP_LE ? "<=" : op == JOP_GT ? ">" : ">=";
    int c = cmp_op(ev, name, a, b, 0);
    if (c == 2)
        return jv_bool(false); /* NaN */
    switch (op) {
    case JOP_LT: return jv_bool(c < 0);
    case JOP_LE: return jv_bool(c <= 0);
    case JOP_GT: return jv_bool(c > 0);
    default: return jv_bool(c >= 0);
    }
}

/* ---- arithmetic ------------------------------------------------------------------------------ */

static const char *op_sym(int op)
{
    switch (op) {
    case JOP_ADD: return "+";
    case JOP_SUB: return "-";
    case JOP_MUL: return "*";
    case JOP_DIV: return "/";
    case JOP_FLOORDIV: return "//";
    case JOP_MOD: return "%";
    default: return "** or pow()";
    }
}

_Noreturn static void fail_operands(jev *ev, int op, jv a, jv b)
{
    jev_fail(ev, TD_EINVAL, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op),
             jv_type_name(a), jv_type_name(b));
}

_Noreturn static void fail_overflow(jev *ev)
{
    jev_fail(ev, TD_ENOTSUP, "integer result out of the supported 64-bit range");
}

static jv repeat(jev *ev, jv seq, int64_t times)
{
    size_t len = seq.kind == JV_STR ? seq.s.n : seq.l->n;
    if (times < 0 || len == 0)
        times = 0; /* an empty sequence stays empty however often it repeats */
    if (seq.kind == JV_STR) {
        if (seq.s.n && (uint64_t)times > ev->lim.max_memory / seq.s.n)
            jev_fail(ev, TD_ERANGE, "template rendering needs more than %zu bytes of memory", ev->lim.max_memory);
        jbuf b = {0};
        for (int64_t i = 0; i < times; i++)
            jbuf_put(ev, &b, seq.s.p, seq.s.n);
        jev_charge(ev, b.n);
        jv r = jbuf_str(&b);
        r.flags = seq.flags;
        return r;
    }
    if (seq.l->n && (uint64_t)times > ev->lim.max_memory / (seq.l->n * sizeof(jv)))
        jev_fail(ev, TD_ERANGE, "template rendering needs more than %zu bytes of memory", ev->lim.max_memory);
    jv r = jv_list_new(ev, (size_t)times * seq.l->n);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.l->n; k++)
            r.l->v[r.l->n++] = seq.l->v[k];
    jev_charge(ev, r.l->n);
    r.flags = seq.flags;
    return r;
}

static jv concat_str(jev *ev, jv a, jv b)
{
    bool markup = (a.flags | b.flags) & JV_F_MARKUP;
    jbuf buf = {0};
    /* Markup + str escapes the plain side (markupsafe) */
    if (markup && !(a.flags & JV_F_MARKUP))
        jv_write_escaped(ev, &buf, a.s.p, a.s.n);
    else
        jbuf_put(ev, &buf, a.s.p, a.s.n);
    if (markup && !(b.flags & JV_F_MARKUP))
        jv_write_escaped(ev, &buf, b.s.p, b.s.n);
    else
        jbuf_put(ev, &buf, b.s.p, b.s.n);
    jev_charge(ev, buf.n);
    jv r = jbuf_str(&buf);
    r.flags = markup ? JV_F_MARKUP : 0;
    return r;
}

static double py_fmod(double a, double b)
{
    double m = fmod(a, b);
    if (m != 0 && ((b < 0) != (m < 0)))
        m += b;
    else if (m == 0)
        m = copysign(0.0, b);
    return m;
}

/* CPython's float_floor_div */
static double py_floordiv(double x, double y)
{
    double mod = fmod(x, y), div = (x - mod) / y;
    if (mod != 0 && (y < 0) != (mod < 0))
        div -= 1.0;
    if (div == 0)
        return copysign(0.0, x / y);
    double fl = floor(div);
    return div - fl > 0.5 ? fl + 1.0 : fl;
}

static jv arith_int(jev *ev, int op, int64_t x, int64_t y)
{
    int64_t r;
    switch (op) {
    case JOP_ADD: if (__builtin_add_overflow(x, y, &r)) fail_overflow(ev); return jv_int(r);
    case JOP_SUB: if (__builtin_sub_overflow(x, y, &r)) fail_overflow(ev); return jv_int(r);
    case JOP_MUL: if (__builtin_mul_overflow(x, y, &r)) fail_overflow(ev); return jv_int(r);
    case JOP_DIV:
        if (y == 0)
            jev_fail(ev, TD_EINVAL, "division by zero");
        return jv_float((double)x / (double)y);
    case JOP_FLOORDIV:
    case JOP_MOD: {
        if (y == 0)
            jev_fail(ev, TD_EINVAL, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {
            if (op == JOP_MOD)
                return jv_int(0);
            fail_overflow(ev);
        }
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
            q -= 1;
            m += y;
        }
        return jv_int(op == JOP_FLOORDIV ? q : m);
    }
    default: { /* POW */
        if (y < 0) {
            if (x == 0)
                jev_fail(ev, TD_EINVAL, "0.0 cannot be raised to a negative power");
            return jv_float(pow((double)x, (double)y));
        }
        int64_t acc = 1, base = x;
        while (y > 0) {
            if (y & 1 && __builtin_mul_overflow(acc, base, &acc))
                fail_overflow(ev);
            y >>= 1;
            if (y && __builtin_mul_overflow(base, base, &base))
                fail_overflow(ev);
        }
        return jv_int(acc);
    }
    }
}

static jv arith_float(jev *ev, int op, double x, double y)
{
    switch (op) {
    case JOP_ADD: return jv_float(x + y);
    case JOP_SUB: return jv_float(x - y);
    case JOP_MUL: return jv_float(x * y);
    case JOP_DIV:
        if (y == 0)
            jev_fail(ev, TD_EINVAL, "float division by zero");
        return jv_float(x / y);
    case JOP_FLOORDIV:
        if (y == 0)
            jev_fail(ev, TD_EINVAL, "float floor division by zero");
        return jv_float(py_floordiv(x, y));
    case JOP_MOD:
        if (y == 0)
            jev_fail(ev, TD_EINVAL, "float modulo");
        return jv_float(py_fmod(x, y));
    default:
        if (x == 0 && y < 0)
            jev_fail(ev, TD_EINVAL, "0.0 cannot be raised to a negative power");
        return jv_float(pow(x, y));
    }
}

jv jv_binop(jev *ev, int op, jv a, jv b)
{
    if (a.kind == JV_UNDEF)
        jev_fail_undef(ev, a);
    if (b.kind == JV_UNDEF)
        jev_fail_undef(ev, b);
    if (is_num(a) && is_num(b)) {
        if (is_intlike(a) && is_intlike(b))
            return arith_int(ev, op, as_int(a), as_int(b));
        return arith_float(ev, op, as_float(a), as_float(b));
    }
    if (op == JOP_ADD) {
        if (a.kind == JV_STR && b.kind == JV_STR)
            return concat_str(ev, a, b);
        if (a.kind == JV_LIST && b.kind == JV_LIST && (a.flags & JV_F_TUPLE) == (b.flags & JV_F_TUPLE)) {
            jv r = jv_list_new(ev, a.l->n + b.l->n);
            jmemcpy(r.l->v, a.l->v, a.l->n * sizeof(jv));
            if (b.l->n)
                memcpy(r.l->v + a.l->n, b.l->v, b.l->n * sizeof(jv));
            r.l->n = a.l->n + b.l->n;
            r.flags = a.flags;
            jev_charge(ev, r.l->n);
            return r;
        }
        if (a.kind == JV_STR || a.kind == JV_LIST)
            jev_fail(ev, TD_EINVAL, "can only concatenate %s (not \"%s\") to %s",
                     a.kind == JV_STR ? "str" : jv_type_name(a), jv_type_name(b),
                     a.kind == JV_STR ? "str" : jv_type_name(a));
    }
    if (op == JOP_MUL) {
        if ((a.kind == JV_STR || a.kind == JV_LIST) && is_intlike(b))
            return repeat(ev, a, as_int(b));
        if ((b.kind == JV_STR || b.kind == JV_LIST) && is_intlike(a))
            return repeat(ev, b, as_int(a));
        if (a.kind == JV_STR || a.kind == JV_LIST)
            jev_fail(ev, TD_EINVAL, "can't multiply sequence by non-int of type '%s'", jv_type_name(b));
        if (b.kind == JV_STR || b.kind == JV_LIST)
            jev_fail(ev, TD_EINVAL, "can't multiply sequence by non-int of type '%s'", jv_type_name(a));
    }
    if (op == JOP_MOD && a.kind == JV_STR)
        jev_fail(ev, TD_ENOTSUP, "printf-style string formatting (str %% args) is not supported");
    fail_operands(ev, op, a, b);
}

jv jv_neg(jev *ev, jv a, bool negate)
{
    if (a.kind == JV_UNDEF)
        jev_fail_undef(ev, a);
    if (a.kind == JV_FLOAT)
        return jv_float(negate ? -a.f : a.f);
    if (is_intlike(a)) {
        int64_t x = as_int(a);
        if (negate && x == INT64_MIN)
            fail_overflow(ev);
        return jv_int(negate ? -x : x);
    }
    jev_fail(ev, TD_EINVAL, "bad operand type for unary %c: '%s'", negate ? '-' : '+', jv_type_name(a));
}

/* ---- attribute and item access ---------------------------------------------------------- */

static jv undef_attr(jev *ev, jv obj, const char *name, size_t n)
{
    jbuf b = {0};
    jbuf_putc(ev, &b, '\'');
    jbuf_puts(ev, &b, jv_obj_repr(obj));
    jbuf_puts(ev, &b, "' has no attribute ");
    jv_write_repr(ev, &b, jv_strn(name, n), 0);
    jv u = jbuf_str(&b);
    u.kind = JV_UNDEF;
    return u;
}

static jv undef_elem(jev *ev, jv obj, jv key)
{
    jbuf b = {0};
    jbuf_puts(ev, &b, jv_obj_repr(obj));
    jbuf_puts(ev, &b, " has no element ");
    jv_write_repr(ev, &b, key, 0);
    jv u = jbuf_str(&b);
    u.kind = JV_UNDEF;
    return u;
}

jv jv_getattr(jev *ev, jv obj, const char *name, size_t n)
{
    jv m;
    switch ((jv_kind)obj.kind) {
    case JV_UNDEF: jev_fail_undef(ev, obj);
    case JV_DICT:
        if (jv_method_find(ev, obj, name, n, &m))
            return m;
        {
            jv *v = jdict_get(obj.d, name, n);
            return v ? *v : undef_attr(ev, obj, name, n);
        }
    case JV_NS: {
        jv *v = jdict_get(obj.d, name, n);
        return v ? *v : undef_attr(ev, obj, name, n);
    }
    case JV_LOOP: return jloop_attr(ev, obj, name, n);
    default:
        if (jv_method_find(ev, obj, name, n, &m))
            return m;
        return undef_attr(ev, obj, name, n);
    }
}

/* A code point index into a string, or its byte offsets when it is not ASCII. */
static const size_t *cp_offsets(jev *ev, jv s, size_t *ncp)
{
    size_t n = utf8_len(s.s.p, s.s.n);
    *ncp = n;
    if (n == s.s.n)
        return NULL;
    size_t *off = jev_alloc(ev, (n + 1) * sizeof *off);
    size_t i = 0, k = 0;
    while (i < s.s.n) {
        off[k++] = i;
        i = utf8_next(s.s.p, s.s.n, i);
    }
    off[k] = s.s.n;
    jev_charge(ev, s.s.n);
    return off;
}

jv jv_getitem(jev *ev, jv obj, jv key)
{
    if (obj.kind == JV_UNDEF)
        jev_fail_undef(ev, obj);
    jv m;
    switch ((jv_kind)obj.kind) {
    case JV_LIST:
    case JV_STR:
        if (is_intlike(key)) {
            int64_t i = as_int(key);
            size_t len, ncp;
            const size_t *off = NULL;
            if (obj.kind == JV_LIST) {
                len = obj.l->n;
            } else {
                off = cp_offsets(ev, obj, &ncp);
                len = ncp;
            }
            if (i < 0)
                i += (int64_t)len;
            if (i < 0 || (uint64_t)i >= len)
                return undef_elem(ev, obj, key);
            if (obj.kind == JV_LIST)
                return obj.l->v[i];
            size_t b0 = off ? off[i] : (size_t)i, b1 = off ? off[i + 1] : (size_t)i + 1;
            jv r = jv_strn(obj.s.p + b0, b1 - b0);
            r.flags = obj.flags;
            return r;
        }
        break;
    case JV_DICT:
        if (key.kind == JV_STR) {
            jv *v = jdict_get(obj.d, key.s.p, key.s.n);
            if (v)
                return *v;
        }
        break;
    default:
        break;
    }
    if (key.kind == JV_STR) {
        if (obj.kind == JV_NS || obj.kind == JV_LOOP)
            return jv_getattr(ev, obj, key.s.p, key.s.n);
        if (jv_method_find(ev, obj, key.s.p, key.s.n, &m))
            return m;
        return undef_attr(ev, obj, key.s.p, key.s.n);
    }
    return undef_elem(ev, obj, key);
}

static bool slice_index(jev *ev, jv v, int64_t *out)
{
    if (v.kind == JV_NONE || v.kind == JV_MISSING)
        return false;
    if (!is_intlike(v))
        jev_fail(ev, TD_EINVAL, "slice indices must be integers or None or have an __index__ method");
    *out = as_int(v);
    return true;
}

jv jv_slice(jev *ev, jv obj, jv start, jv stop, jv step)
{
    if (obj.kind == JV_UNDEF)
        jev_fail_undef(ev, obj);
    int64_t st = 1, a = 0, b = 0;
    bool has_a = slice_index(ev, start, &a), has_b = slice_index(ev, stop, &b);
    if (slice_index(ev, step, &st) && st == 0)
        jev_fail(ev, TD_EINVAL, "slice step cannot be zero");
    /* jinja2 compiles slices to plain Python subscripts (no sandbox getitem, no Undefined) */
    if (obj.kind == JV_DICT)
        jev_fail(ev, TD_EINVAL, "unhashable type: 'slice'");
    if (obj.kind != JV_LIST && obj.kind != JV_STR)
        jev_fail(ev, TD_EINVAL, "'%s' object is not subscriptable", jv_type_name(obj));
    size_t ncp = 0;
    const size_t *off = NULL;
    int64_t len;
    if (obj.kind == JV_LIST) {
        len = (int64_t)obj.l->n;
    } else {
        off = cp_offsets(ev, obj, &ncp);
        len = (int64_t)ncp;
    }
    /* PySlice_AdjustIndices */
    if (!has_a)
        a = st > 0 ? 0 : len - 1;
    else if (a < 0 && (a += len) < 0)
        a = st > 0 ? 0 : -1;
    else if (a >= len)
        a = st > 0 ? len : len - 1;
    if (!has_b)
        b = st > 0 ? len : -1;
    else if (b < 0 && (b += len) < 0)
        b = st > 0 ? 0 : -1;
    else if (b >= len)
        b = st > 0 ? len : len - 1;
    int64_t count = 0;
    if (st > 0 && a < b)
        count = (b - a - 1) / st + 1;
    else if (st < 0 && b < a)
        count = (a - b - 1) / (-st) + 1;
    jev_charge(ev, (size_t)count);
    if (obj.kind == JV_LIST) {
        jv r = jv_list_new(ev, (size_t)count);
        for (int64_t k = 0, i = a; k < count; k++, i += st)
            r.l->v[k] = obj.l->v[i];
        r.l->n = (size_t)count;
        r.flags = obj.flags;
        return r;
    }
    if (st == 1) {
        size_t b0 = off ? off[a] : (size_t)a, b1 = off ? off[a + count] : (size_t)(a + count);
        jv r = jv_strn(obj.s.p + b0, b1 - b0);
        r.flags = obj.flags;
        return r;
    }
    jbuf buf = {0};
    for (int64_t k = 0, i = a; k < count; k++, i += st) {
        size_t b0 = off ? off[i] : (size_t)i, b1 = off ? off[i + 1] : (size_t)i + 1;
        jbuf_put(ev, &buf, obj.s.p + b0, b1 - b0);
    }
    jv r = jbuf_str(&buf);
    r.flags = obj.flags;
    return r;
}

jv jv_iterate(jev *ev, jv v)
{
    switch ((jv_kind)v.kind) {
    case JV_LIST: return v;
    case JV_UNDEF: return jv_list_new(ev, 0);
    case JV_DICT: {
        jv r = jv_list_new(ev, v.d->n);
        for (size_t i = 0; i < v.d->n; i++)
            r.l->v[i] = jv_strn(v.d->e[i].k, v.d->e[i].kn);
        r.l->n = v.d->n;
        return r;
    }
    case JV_STR: {
        jv r = jv_list_new(ev, v.s.n);
        for (size_t i = 0; i < v.s.n;) {
            size_t next = utf8_next(v.s.p, v.s.n, i);
            jv c = jv_strn(v.s.p + i, next - i);
            c.flags = v.flags;
            r.l->v[r.l->n++] = c;
            i = next;
        }
        jev_charge(ev, v.s.n);
        return r;
    }
    default:
        jev_fail(ev, TD_EINVAL, "'%s' object is not iterable", jv_type_name(v));
    }
}

int64_t jv_length(jev *ev, jv v)
{
    switch ((jv_kind)v.kind) {
    case JV_STR: jev_charge(ev, v.s.n); return (int64_t)utf8_len(v.s.p, v.s.n);
    case JV_LIST: return (int64_t)v.l->n;
    case JV_DICT: return (int64_t)v.d->n;
    case JV_UNDEF: return 0;
    case JV_LOOP: return (int64_t)v.loop->n;
    default: jev_fail(ev, TD_EINVAL, "object of type '%s' has no len()", jv_type_name(v));
    }
}
