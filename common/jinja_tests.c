/* Jinja tests ("x is defined", "x is mapping" ...) with jinja2's semantics (tests.py): Python
 * type checks as jinja2 writes them, so `true is number` holds, `true is integer` does not,
 * an Undefined is iterable and a sequence but not a mapping. */
#include <string.h>

#include "common/jinja_int.h"

typedef bool (*test_fn)(jev *ev, jv v, const jcall *c);

static bool given(jv v) { return v.kind != JV_MISSING; }

static jv one_arg(jev *ev, const char *name, const jcall *c)
{
    static const char *const p[] = {"other"};
    jv a[1];
    jcall_bind(ev, name, c, p, 1, a);
    if (!given(a[0]))
        jev_fail(ev, TD_EINVAL, "%s() missing 1 required positional argument", name);
    return a[0];
}

static bool no_args(jev *ev, const char *name, const jcall *c)
{
    jcall_bind(ev, name, c, NULL, 0, NULL);
    return true;
}

static bool t_defined(jev *ev, jv v, const jcall *c) { return no_args(ev, "defined", c) && v.kind != JV_UNDEF; }
static bool t_undefined(jev *ev, jv v, const jcall *c) { return no_args(ev, "undefined", c) && v.kind == JV_UNDEF; }
static bool t_none(jev *ev, jv v, const jcall *c) { return no_args(ev, "none", c) && v.kind == JV_NONE; }
static bool t_boolean(jev *ev, jv v, const jcall *c) { return no_args(ev, "boolean", c) && v.kind == JV_BOOL; }
static bool t_false(jev *ev, jv v, const jcall *c) { return no_args(ev, "false", c) && v.kind == JV_BOOL && !v.b; }
static bool t_true(jev *ev, jv v, const jcall *c) { return no_args(ev, "true", c) && v.kind == JV_BOOL && v.b; }
static bool t_integer(jev *ev, jv v, const jcall *c) { return no_args(ev, "integer", c) && v.kind == JV_INT; }
static bool t_float(jev *ev, jv v, const jcall *c) { return no_args(ev, "float", c) && v.kind == JV_FLOAT; }
static bool t_number(jev *ev, jv v, const jcall *c)
{
    return no_args(ev, "number", c) && (v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL);
}
static bool t_string(jev *ev, jv v, const jcall *c) { return no_args(ev, "string", c) && v.kind == JV_STR; }
static bool t_mapping(jev *ev, jv v, const jcall *c) { return no_args(ev, "mapping", c) && v.kind == JV_DICT; }
static bool t_iterable(jev *ev, jv v, const jcall *c)
{
    return no_args(ev, "iterable", c) && (v.kind == JV_STR || v.kind == JV_LIST || v.kind == JV_DICT ||
                                          v.kind == JV_UNDEF || v.kind == JV_LOOP);
}
static bool t_sequence(jev *ev, jv v, const jcall *c)
{
    return no_args(ev, "sequence", c) && (v.kind == JV_STR || v.kind == JV_LIST || v.kind == JV_DICT ||
                                          v.kind == JV_UNDEF);
}
static bool t_callable(jev *ev, jv v, const jcall *c)
{
    return no_args(ev, "callable", c) && (v.kind == JV_MACRO || v.kind == JV_FUNC ||
                                          v.kind == JV_METHOD || v.kind == JV_UNDEF);
}
static bool t_escaped(jev *ev, jv v, const jcall *c)
{
    return no_args(ev, "escaped", c) && v.kind == JV_STR && (v.flags & JV_F_MARKUP);
}

static bool t_sameas(jev *ev, jv v, const jcall *c)
{
    jv o = one_arg(ev, "sameas", c);
    if (v.kind != o.kind)
        return false;
    switch ((jv_kind)v.kind) {
    case JV_NONE: return true;
    case JV_BOOL: return v.b == o.b;
    case JV_INT: return v.i == o.i && v.i >= -5 && v.i <= 256; /* CPython's cached small ints */
    case JV_STR: return v.s.p == o.s.p && v.s.n == o.s.n;
    case JV_LIST: return v.l == o.l;
    case JV_DICT: case JV_NS: return v.d == o.d;
    case JV_MACRO: return v.m == o.m;
    case JV_FUNC: return v.id == o.id;
    default: return false;
    }
}

static bool t_cmp(jev *ev, jv v, const jcall *c, const char *name, int op)
{
    return jv_compare(ev, op, v, one_arg(ev, name, c)).b;
}
static bool t_eq(jev *ev, jv v, const jcall *c) { return t_cmp(ev, v, c, "eq", JOP_EQ); }
static bool t_ne(jev *ev, jv v, const jcall *c) { return t_cmp(ev, v, c, "ne", JOP_NE); }
static bool t_lt(jev *ev, jv v, const jcall *c) { return t_cmp(ev, v, c, "lt", JOP_LT); }
static bool t_le(jev *ev, jv v, const jcall *c) { return t_cmp(ev, v, c, "le", JOP_LE); }
static bool t_gt(jev *ev, jv v, const jcall *c) { return t_cmp(ev, v, c, "gt", JOP_GT); }
static bool t_ge(jev *ev, jv v, const jcall *c) { return t_cmp(ev, v, c, "ge", JOP_GE); }
static bool t_in(jev *ev, jv v, const jcall *c) { return t_cmp(ev, v, c, "in", JOP_IN); }

static bool t_odd(jev *ev, jv v, const jcall *c)
{
    no_args(ev, "odd", c);
    return jv_equal(ev, jv_binop(ev, JOP_MOD, v, jv_int(2)), jv_int(1), 0);
}
static bool t_even(jev *ev, jv v, const jcall *c)
{
    no_args(ev, "even", c);
    return jv_equal(ev, jv_binop(ev, JOP_MOD, v, jv_int(2)), jv_int(0), 0);
}
static bool t_divisibleby(jev *ev, jv v, const jcall *c)
{
    jv d = one_arg(ev, "divisibleby", c);
    return jv_equal(ev, jv_binop(ev, JOP_MOD, v, d), jv_int(0), 0);
}
static bool t_lower(jev *ev, jv v, const jcall *c)
{
    no_args(ev, "lower", c);
    jv s = jv_to_str(ev, v);
    return s.s.n > 0 && jv_equal(ev, jstr_case(ev, s, 'l'), s, 0) && !jv_equal(ev, jstr_case(ev, s, 'u'), s, 0);
}
static bool t_upper(jev *ev, jv v, const jcall *c)
{
    no_args(ev, "upper", c);
    jv s = jv_to_str(ev, v);
    return s.s.n > 0 && jv_equal(ev, jstr_case(ev, s, 'u'), s, 0) && !jv_equal(ev, jstr_case(ev, s, 'l'), s, 0);
}
static bool t_filter(jev *ev, jv v, const jcall *c)
{
    no_args(ev, "filter", c);
    if (v.kind != JV_STR || v.s.n >= 64)
        return false;
    char nm[64];
    memcpy(nm, v.s.p, v.s.n);
    nm[v.s.n] = 0;
    return jinja_filter_find(nm) >= 0;
}
static bool t_test(jev *ev, jv v, const jcall *c)
{
    no_args(ev, "test", c);
    if (v.kind != JV_STR || v.s.n >= 64)
        return false;
    char nm[64];
    memcpy(nm, v.s.p, v.s.n);
    nm[v.s.n] = 0;
    return jinja_test_find(nm) >= 0;
}

static const struct {
    const char *name;
    test_fn fn;
} tests[] = {
    {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"boolean", t_boolean},
    {"false", t_false}, {"true", t_true}, {"integer", t_integer}, {"float", t_float},
    {"number", t_number}, {"string", t_string}, {"mapping", t_mapping}, {"iterable", t_iterable},
    {"sequence", t_sequence}, {"callable", t_callable}, {"escaped", t_escaped},
    {"sameas", t_sameas}, {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq}, {"ne", t_ne},
    {"!=", t_ne}, {"lt", t_lt}, {"lessthan", t_lt}, {"<", t_lt}, {"le", t_le}, {"<=", t_le},
    {"gt", t_gt}, {"greaterthan", t_gt}, {">", t_gt}, {"ge", t_ge}, {">=", t_ge}, {"in", t_in},
    {"odd", t_odd}, {"even", t_even}, {"divisibleby", t_divisibleby}, {"lower", t_lower},
    {"upper", t_upper}, {"filter", t_filter}, {"test", t_test},
};

#define N_TESTS (sizeof tests / sizeof tests[0])

int jinja_test_find(const char *name)
{
    for (size_t i = 0; i < N_TESTS; i++)
        if (!strcmp(tests[i].name, name))
            return (int)i;
    return -1;
}

bool jinja_test_apply(jev *ev, int fn, jv v, const jcall *c)
{
    TD_ASSERT(fn >= 0 && (size_t)fn < N_TESTS);
    jev_charge(ev, 0);
    return tests[fn].fn(ev, v, c);
}
