/* Evaluation of a parsed template: statements, expressions, scopes and macro calls, plus the
 * public jinja_compile / jinja_render.
 *
 * Scopes follow jinja2: each for-loop iteration, macro call and with-block gets a fresh scope
 * over the enclosing one (so a `set` inside a loop does not survive the iteration: templates
 * use namespace() for that), `if` blocks do not; a macro body sees the scope it was defined in
 * as it is at call time, never its caller's variables. Name lookup ends at the render
 * variables, then the global functions; a miss is an Undefined ("'x' is undefined"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja_int.h"

typedef enum jflow { JFLOW_NEXT, JFLOW_BREAK, JFLOW_CONTINUE } jflow;

/* Nested evaluation frames allowed: a deep tree inside deep macro recursion must fail cleanly
 * long before the C stack (8 MiB, frames of about 1 KiB under AddressSanitizer) runs out. */
#define JEV_MAX_NEST 1500

static void nest_enter(jev *ev)
{
    if (++ev->nest > JEV_MAX_NEST)
        jev_fail(ev, TD_ERANGE, "template evaluation nested more than %d levels deep", JEV_MAX_NEST);
}

static jv eval(jev *ev, const jnode *n, jscope *sc);
static jflow exec_body(jev *ev, const jbody *b, jscope *sc);

void jinja_limits_default(jinja_limits *lim)
{
    lim->max_output = (size_t)32 << 20;
    lim->max_memory = (size_t)256 << 20;
    lim->max_steps = 20000000;
    lim->max_depth = 200;
}

static jscope *scope_new(jev *ev, jscope *parent)
{
    jscope *s = jev_alloc(ev, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(jev *ev, jscope *sc, const char *name, jv v)
{
    jdict_set(ev, &sc->vars, name, strlen(name), v);
}

static jv lookup(jev *ev, jscope *sc, const char *name)
{
    size_t n = strlen(name);
    for (jscope *s = sc; s; s = s->parent) {
        jv *v = jdict_get(&s->vars, name, n);
        if (v)
            return *v;
    }
    jv *v = jdict_get(&ev->globals, name, n);
    if (v)
        return *v;
    jv g;
    if (jinja_global_find(name, n, &g))
        return g;
    return jv_undef(ev, "'%s' is undefined", name);
}

/* Evaluates call arguments (positional, keyword, *list, **dict) into c. */
static void eval_args(jev *ev, const jargs *a, jscope *sc, jcall *c)
{
    size_t n_pos = a->n_pos, n_kw = a->n_kw;
    jv star = {0}, dstar = {0};
    if (a->star) {
        star = eval(ev, a->star, sc);
        if (star.kind != JV_LIST)
            star = jv_iterate(ev, star);
        n_pos += star.l->n;
    }
    if (a->dstar) {
        dstar = eval(ev, a->dstar, sc);
        if (dstar.kind != JV_DICT)
            jev_fail(ev, TD_EINVAL, "argument after ** must be a mapping, not %s", jv_type_name(dstar));
        n_kw += dstar.d->n;
    }
    jv *pos = n_pos ? jev_alloc(ev, n_pos * sizeof *pos) : NULL;
    jv *kw_val = n_kw ? jev_alloc(ev, n_kw * sizeof *kw_val) : NULL;
    const char **kw = n_kw ? jev_alloc(ev, n_kw * sizeof *kw) : NULL;
    for (size_t i = 0; i < a->n_pos; i++)
        pos[i] = eval(ev, a->pos[i], sc);
    if (a->star && star.l->n)
        memcpy(pos + a->n_pos, star.l->v, star.l->n * sizeof *pos);
    for (size_t i = 0; i < a->n_kw; i++) {
        kw[i] = a->kw[i];
        kw_val[i] = eval(ev, a->kw_val[i], sc);
    }
    if (a->dstar) {
        for (size_t i = 0; i < dstar.d->n; i++) {
            char *k = jev_alloc(ev, dstar.d->e[i].kn + 1);
            memcpy(k, dstar.d->e[i].k, dstar.d->e[i].kn);
            kw[a->n_kw + i] = k;
            kw_val[a->n_kw + i] = dstar.d->e[i].v;
        }
    }
    c->pos = pos;
    c->n_pos = n_pos;
    c->kw = kw;
    c->kw_val = kw_val;
    c->n_kw = n_kw;
}

static jv eval_filter(jev *ev, const jnode *n, jscope *sc, const jv *block)
{
    jv arg;
    if (!n->a)
        arg = *block;
    else if (block && n->a->kind == JN_FILTER)
        arg = eval_filter(ev, n->a, sc, block);
    else
        arg = eval(ev, n->a, sc);
    jcall c;
    eval_args(ev, &n->args, sc, &c);
    return jinja_filter_apply(ev, n->fn, arg, &c);
}

static jv eval_compare(jev *ev, const jnode *n, jscope *sc)
{
    jv left = eval(ev, n->a, sc);
    for (size_t i = 0; i < n->n_kids; i++) {
        jv right = eval(ev, n->kids[i], sc);
        if (!jv_compare(ev, n->ops[i], left, right).b)
            return jv_bool(false);
        left = right;
    }
    return jv_bool(true);
}

static jv eval_node(jev *ev, const jnode *n, jscope *sc);

static jv eval(jev *ev, const jnode *n, jscope *sc)
{
    nest_enter(ev);
    jv v = eval_node(ev, n, sc);
    ev->nest--;
    return v;
}

static jv eval_node(jev *ev, const jnode *n, jscope *sc)
{
    switch ((jn_kind)n->kind) {
    case JN_CONST: return n->val;
    case JN_NAME: return lookup(ev, sc, n->name);
    case JN_GETATTR: return jv_getattr(ev, eval(ev, n->a, sc), n->name, strlen(n->name));
    case JN_GETITEM: {
        jv obj = eval(ev, n->a, sc);
        if (n->b->kind == JN_SLICE) {
            const jnode *s = n->b;
            jv a = s->a ? eval(ev, s->a, sc) : jv_none();
            jv b = s->b ? eval(ev, s->b, sc) : jv_none();
            jv c = s->c ? eval(ev, s->c, sc) : jv_none();
            return jv_slice(ev, obj, a, b, c);
        }
        return jv_getitem(ev, obj, eval(ev, n->b, sc));
    }
    case JN_CALL: {
        jv fn = eval(ev, n->a, sc);
        jcall c;
        eval_args(ev, &n->args, sc, &c);
        return jv_call(ev, fn, &c);
    }
    case JN_FILTER: return eval_filter(ev, n, sc, NULL);
    case JN_TEST: {
        jv v = eval(ev, n->a, sc);
        jcall c;
        eval_args(ev, &n->args, sc, &c);
        return jv_bool(jinja_test_apply(ev, n->fn, v, &c));
    }
    case JN_NOT: return jv_bool(!jv_truthy(eval(ev, n->a, sc)));
    case JN_NEG: return jv_neg(ev, eval(ev, n->a, sc), true);
    case JN_POS: return jv_neg(ev, eval(ev, n->a, sc), false);
    case JN_BINOP: {
        jv a = eval(ev, n->a, sc);
        return jv_binop(ev, n->op, a, eval(ev, n->b, sc));
    }
    case JN_AND: {
        jv a = eval(ev, n->a, sc);
        return jv_truthy(a) ? eval(ev, n->b, sc) : a;
    }
    case JN_OR: {
        jv a = eval(ev, n->a, sc);
        return jv_truthy(a) ? a : eval(ev, n->b, sc);
    }
    case JN_CONCAT: {
        jbuf b = {0};
        for (size_t i = 0; i < n->n_kids; i++)
            jv_write_str(ev, &b, eval(ev, n->kids[i], sc), 0);
        jev_charge(ev, b.n);
        return jbuf_str(&b);
    }
    case JN_COMPARE: return eval_compare(ev, n, sc);
    case JN_CONDEXPR:
        if (jv_truthy(eval(ev, n->a, sc)))
            return eval(ev, n->b, sc);
        if (n->c)
            return eval(ev, n->c, sc);
        return jv_undef(ev, "the inline if-expression on line %d evaluated to false and no else section was defined.",
                        n->line);
    case JN_LIST:
    case JN_TUPLE: {
        jv l = jv_list_new(ev, n->n_kids);
        for (size_t i = 0; i < n->n_kids; i++)
            l.l->v[i] = eval(ev, n->kids[i], sc);
        l.l->n = n->n_kids;
        if (n->kind == JN_TUPLE)
            l.flags = JV_F_TUPLE;
        return l;
    }
    case JN_DICT: {
        jv d = jv_dict_new(ev);
        for (size_t i = 0; i + 1 < n->n_kids; i += 2) {
            jv k = eval(ev, n->kids[i], sc);
            if (k.kind != JV_STR)
                jev_fail(ev, TD_ENOTSUP, "dict keys other than strings are not supported (got %s)", jv_type_name(k));
            jdict_set(ev, d.d, k.s.p, k.s.n, eval(ev, n->kids[i + 1], sc));
        }
        return d;
    }
    default:
        TD_ASSERT(!"not an expression");
        return jv_none();
    }
}

/* ---- assignment ------------------------------------------------------------------------------ */

static void assign(jev *ev, const jnode *target, jv v, jscope *sc)
{
    if (target->kind == JN_NAME) {
        scope_set(ev, sc, target->name, v);
        return;
    }
    if (target->kind == JN_NSREF) {
        jv ns = lookup(ev, sc, target->name);
        if (ns.kind != JV_NS)
            jev_fail(ev, TD_EINVAL, "cannot assign attribute on non-namespace object");
        if (target->attr[0] == '_')
            jev_fail(ev, TD_EINVAL,
                     "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'. "
                     "Please rename the attribute.", target->attr);
        jdict_set(ev, ns.d, target->attr, strlen(target->attr), v);
        return;
    }
    TD_ASSERT(target->kind == JN_TUPLE);
    jv items = jv_iterate(ev, v);
    size_t want = target->n_kids, got = items.l->n;
    if (got > want)
        jev_fail(ev, TD_EINVAL, "too many values to unpack (expected %zu)", want);
    if (got < want)
        jev_fail(ev, TD_EINVAL, "not enough values to unpack (expected %zu, got %zu)", want, got);
    for (size_t i = 0; i < want; i++)
        scope_set(ev, sc, target->kids[i]->name, items.l->v[i]);
}

/* ---- macros ------------------------------------------------------------------------------------ */

jv jev_call_macro(jev *ev, jv macro, const jcall *c)
{
    const jnode *m = macro.m->node;
    const jargs *params = &m->args;
    size_t np = params->n_pos;
    if (c->n_pos > np && !m->uses_varargs)
        jev_fail(ev, TD_EINVAL, "macro '%s' takes not more than %zu argument(s)", m->name, np);
    if (ev->depth >= ev->lim.max_depth)
        jev_fail(ev, TD_ERANGE, "macro calls nested more than %u deep", ev->lim.max_depth);
    jev_charge(ev, 0);
    jscope *sc = scope_new(ev, macro.m->closure);
    jv *slot = jev_alloc(ev, (np ? np : 1) * sizeof *slot);
    for (size_t i = 0; i < np; i++)
        slot[i] = i < c->n_pos ? c->pos[i] : jv_missing();
    jv extra_kw = jv_dict_new(ev);
    for (size_t k = 0; k < c->n_kw; k++) {
        size_t i = 0;
        while (i < np && strcmp(params->pos[i]->name, c->kw[k]) != 0)
            i++;
        if (i < np) {
            if (slot[i].kind != JV_MISSING)
                jev_fail(ev, TD_EINVAL, "macro '%s' got multiple values for argument '%s'", m->name, c->kw[k]);
            slot[i] = c->kw_val[k];
        } else if (m->uses_kwargs) {
            jdict_set(ev, extra_kw.d, c->kw[k], strlen(c->kw[k]), c->kw_val[k]);
        } else {
            jev_fail(ev, TD_EINVAL, "macro '%s' takes no keyword argument '%s'", m->name, c->kw[k]);
        }
    }
    size_t first_default = np - params->n_kw;
    for (size_t i = 0; i < np; i++) {
        if (slot[i].kind == JV_MISSING) {
            /* defaults are evaluated at call time, and may read earlier parameters */
            slot[i] = i >= first_default ? eval(ev, params->kw_val[i - first_default], sc)
                                         : jv_undef(ev, "parameter '%s' was not provided", params->pos[i]->name);
        }
        scope_set(ev, sc, params->pos[i]->name, slot[i]);
    }
    if (m->uses_varargs) {
        jv va = jv_list_new(ev, 0);
        for (size_t i = np; i < c->n_pos; i++)
            jv_list_push(ev, va, c->pos[i]);
        va.flags = JV_F_TUPLE;
        scope_set(ev, sc, "varargs", va);
    }
    if (m->uses_kwargs)
        scope_set(ev, sc, "kwargs", extra_kw);
    jbuf *saved = ev->out, capture = {0};
    int line = ev->line;
    ev->out = &capture;
    ev->depth++;
    exec_body(ev, &m->body, sc);
    ev->depth--;
    ev->out = saved;
    ev->line = line;
    return jbuf_str(&capture);
}

/* ---- statements ------------------------------------------------------------------------------ */

static jflow exec_for(jev *ev, const jnode *n, jscope *sc)
{
    jv seq = jv_iterate(ev, eval(ev, n->a, sc));
    const jv *items = seq.l->v;
    size_t count = seq.l->n;
    if (n->b) { /* "for x in xs if cond": the loop sees only the items that pass */
        jv kept = jv_list_new(ev, count);
        for (size_t i = 0; i < count; i++) {
            jev_charge(ev, 0);
            jscope *tmp = scope_new(ev, sc);
            assign(ev, n->target, items[i], tmp);
            if (jv_truthy(eval(ev, n->b, tmp)))
                kept.l->v[kept.l->n++] = items[i];
        }
        items = kept.l->v;
        count = kept.l->n;
    }
    if (count == 0)
        return exec_body(ev, &n->else_, scope_new(ev, sc));
    jloop *lp = jev_alloc(ev, sizeof *lp);
    lp->items = items;
    lp->n = count;
    lp->changed_last = jv_missing();
    jv loop = {.kind = JV_LOOP};
    loop.loop = lp;
    for (size_t i = 0; i < count; i++) {
        jev_charge(ev, 0);
        lp->i = i;
        jscope *it = scope_new(ev, sc);
        assign(ev, n->target, items[i], it);
        scope_set(ev, it, "loop", loop);
        if (exec_body(ev, &n->body, it) == JFLOW_BREAK)
            break;
    }
    return JFLOW_NEXT;
}

static jv capture_body(jev *ev, const jbody *b, jscope *sc)
{
    jbuf *saved = ev->out, capture = {0};
    ev->out = &capture;
    exec_body(ev, b, sc);
    ev->out = saved;
    return jbuf_str(&capture);
}

static jflow exec_node(jev *ev, const jnode *n, jscope *sc);

static jflow exec(jev *ev, const jnode *n, jscope *sc)
{
    nest_enter(ev);
    jflow f = exec_node(ev, n, sc);
    ev->nest--;
    return f;
}

static jflow exec_node(jev *ev, const jnode *n, jscope *sc)
{
    ev->line = n->line;
    switch ((jn_kind)n->kind) {
    case JN_DATA:
        jbuf_put(ev, ev->out, n->val.s.p, n->val.s.n);
        return JFLOW_NEXT;
    case JN_OUTPUT:
        jv_write_str(ev, ev->out, eval(ev, n->a, sc), 0);
        return JFLOW_NEXT;
    case JN_IF:
        return exec_body(ev, jv_truthy(eval(ev, n->a, sc)) ? &n->body : &n->else_, sc);
    case JN_FOR: return exec_for(ev, n, sc);
    case JN_SET:
        assign(ev, n->target, eval(ev, n->a, sc), sc);
        return JFLOW_NEXT;
    case JN_SETBLOCK: {
        jv v = capture_body(ev, &n->body, sc);
        if (n->a)
            v = eval_filter(ev, n->a, sc, &v);
        assign(ev, n->target, v, sc);
        return JFLOW_NEXT;
    }
    case JN_MACRO: {
        jv m = {.kind = JV_MACRO};
        m.m = jev_alloc(ev, sizeof *m.m);
        m.m->node = n;
        m.m->closure = sc;
        scope_set(ev, sc, n->name, m);
        return JFLOW_NEXT;
    }
    case JN_FILTERBLOCK: {
        jv v = capture_body(ev, &n->body, sc);
        jv_write_str(ev, ev->out, eval_filter(ev, n->a, sc, &v), 0);
        return JFLOW_NEXT;
    }
    case JN_WITH: {
        jscope *inner = scope_new(ev, sc);
        for (size_t i = 0; i + 1 < n->n_kids; i += 2)
            assign(ev, n->kids[i], eval(ev, n->kids[i + 1], sc), inner);
        return exec_body(ev, &n->body, inner);
    }
    case JN_BREAK: return JFLOW_BREAK;
    case JN_CONTINUE: return JFLOW_CONTINUE;
    default:
        TD_ASSERT(!"not a statement");
        return JFLOW_NEXT;
    }
}

static jflow exec_body(jev *ev, const jbody *b, jscope *sc)
{
    for (size_t i = 0; i < b->n; i++) {
        jflow f = exec(ev, b->v[i], sc);
        if (f != JFLOW_NEXT)
            return f;
    }
    return JFLOW_NEXT;
}

/* ---- public API ------------------------------------------------------------------------------ */

/* Strict UTF-8: no overlong forms, surrogates or code points past U+10FFFF. */
static bool utf8_valid(const char *p, size_t n, size_t *bad)
{
    const unsigned char *s = (const unsigned char *)p;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            *bad = i;
            return false;
        }
        if (i + len > n) {
            *bad = i;
            return false;
        }
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) {
                *bad = i;
                return false;
            }
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            *bad = i;
            return false;
        }
        i += len;
    }
    return true;
}

#define JINJA_TEMPLATE_MEMORY ((size_t)1 << 30) /* bytes of tokens and tree, at most */

td_err jinja_compile(jinja_tmpl **out, const char *src, size_t len)
{
    *out = NULL;
    size_t bad;
    if (!utf8_valid(src, len, &bad))
        return err_set(TD_EFORMAT, "template: invalid UTF-8 at byte %zu", bad);
    jinja_tmpl *t = calloc(1, sizeof *t);
    if (!t)
        return err_set(TD_ENOMEM, "template: out of memory");
    t->arena.limit = JINJA_TEMPLATE_MEMORY;
    jtok *toks;
    size_t n_toks;
    td_err e = jinja_lex(&t->arena, src, len, &toks, &n_toks);
    if (e == TD_OK)
        e = jinja_parse(t, toks, n_toks);
    if (e != TD_OK) {
        jinja_free(t);
        return e;
    }
    *out = t;
    return TD_OK;
}

void jinja_free(jinja_tmpl *t)
{
    if (!t)
        return;
    jarena_free(&t->arena);
    free(t);
}

td_err jinja_render(const jinja_tmpl *t, const json_t *vars, const jinja_limits *lim, char **out,
                    size_t *out_len, int *err_line)
{
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (err_line)
        *err_line = 0;
    if (vars && !json_is_object(vars))
        return err_set(TD_EINVAL, "template variables must be a JSON object");
    jev *ev = calloc(1, sizeof *ev);
    if (!ev)
        return err_set(TD_ENOMEM, "template: out of memory");
    if (lim)
        ev->lim = *lim;
    else
        jinja_limits_default(&ev->lim);
    ev->arena.limit = ev->lim.max_memory;
    ev->out = &ev->main_out;
    if (setjmp(ev->jb)) {
        td_err code = ev->code;
        if (err_line)
            *err_line = ev->line;
        jarena_free(&ev->arena);
        free(ev);
        return code;
    }
    if (vars)
        ev->globals = *jv_from_json(ev, vars, 0).d;
    ev->root = scope_new(ev, NULL);
    exec_body(ev, &t->body, ev->root);
    size_t n = ev->main_out.n;
    char *s = malloc(n + 1);
    if (!s) {
        jarena_free(&ev->arena);
        free(ev);
        return err_set(TD_ENOMEM, "template: out of memory for %zu bytes of output", n);
    }
    if (n)
        memcpy(s, ev->main_out.p, n);
    s[n] = 0;
    jarena_free(&ev->arena);
    free(ev);
    *out = s;
    if (out_len)
        *out_len = n;
    return TD_OK;
}
