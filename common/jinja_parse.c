/* Jinja tokens -> tree, by jinja2's grammar (parser.py): the same operator precedence
 * (or < and < not < comparisons < + - < ~ < * / // % < ** < unary - + < filters, tests and
 * postfix), conditional expressions, tuples without parentheses, implicit string
 * concatenation, test arguments without parentheses ("x is divisibleby 3").
 *
 * Statements: if/elif/else, for (with else, an `if` filter and tuple targets), set (also
 * namespace attributes and the block form), macro, filter, with, break, continue, print and
 * transformers' generation block (rendered as its body). Anything else is a compile error. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/jinja_int.h"

#define PARSE_MAX_DEPTH 200

typedef struct jparser {
    jinja_tmpl *t;
    const jtok *tok; /* [n] */
    size_t n, i;
    int depth;       /* expression and statement nesting */
    int loops;       /* enclosing for loops (of the current macro body) */
    jnode *macro;    /* innermost macro being parsed, or NULL */
    jmp_buf jb;
    td_err code;
} jparser;

_Noreturn __attribute__((format(printf, 4, 5))) static void
parse_fail(jparser *P, td_err code, int line, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    err_set(code, "template line %d: %s", line, msg);
    P->code = code;
    longjmp(P->jb, 1);
}

static void *palloc(jparser *P, size_t n)
{
    void *p = jarena_alloc(&P->t->arena, n);
    if (!p)
        parse_fail(P, TD_ENOMEM, P->tok[P->i].line, "out of memory");
    return p;
}

static const jtok *cur(jparser *P) { return &P->tok[P->i]; }
static const jtok *peek(jparser *P) { return &P->tok[P->i + 1 < P->n ? P->i + 1 : P->i]; }
static const jtok *next(jparser *P)
{
    const jtok *t = &P->tok[P->i];
    if (P->i + 1 < P->n)
        P->i++;
    return t;
}

static const char *const op_text[] = {
    [JOP_ADD] = "+", [JOP_SUB] = "-", [JOP_MUL] = "*", [JOP_DIV] = "/", [JOP_FLOORDIV] = "//",
    [JOP_MOD] = "%", [JOP_POW] = "**", [JOP_TILDE] = "~", [JOP_LBRACKET] = "[",
    [JOP_RBRACKET] = "]", [JOP_LPAREN] = "(", [JOP_RPAREN] = ")", [JOP_LBRACE] = "{",
    [JOP_RBRACE] = "}", [JOP_EQ] = "==", [JOP_NE] = "!=", [JOP_GT] = ">", [JOP_GE] = ">=",
    [JOP_LT] = "<", [JOP_LE] = "<=", [JOP_ASSIGN] = "=", [JOP_DOT] = ".", [JOP_COLON] = ":",
    [JOP_PIPE] = "|", [JOP_COMMA] = ",", [JOP_SEMICOLON] = ";", [JOP_IN] = "in",
    [JOP_NOTIN] = "not in",
};

/* What a token is, for messages ("'endif'", "end of template"). */
static const char *describe(const jtok *t, char *buf, size_t cap)
{
    switch (t->kind) {
    case JT_EOF: return "end of template";
    case JT_DATA: return "template data";
    case JT_VAR_BEGIN: return "begin of print statement";
    case JT_VAR_END: return "end of print statement";
    case JT_BLOCK_BEGIN: return "begin of statement block";
    case JT_BLOCK_END: return "end of statement block";
    case JT_STRING: return "string";
    case JT_INT: return "integer";
    case JT_FLOAT: return "float";
    case JT_NAME: snprintf(buf, cap, "'%.*s'", (int)(t->n > 64 ? 64 : t->n), t->p); return buf;
    case JT_OP: snprintf(buf, cap, "'%s'", op_text[t->op]); return buf;
    }
    return "token";
}

_Noreturn static void fail_expected(jparser *P, const char *what)
{
    char buf[96];
    parse_fail(P, TD_EFORMAT, cur(P)->line, "expected %s, got %s", what, describe(cur(P), buf, sizeof buf));
}

static bool is_op(jparser *P, jop op) { return cur(P)->kind == JT_OP && cur(P)->op == op; }
static bool is_name(jparser *P, const char *name)
{
    const jtok *t = cur(P);
    return t->kind == JT_NAME && t->n == strlen(name) && !memcmp(t->p, name, t->n);
}
static bool skip_op(jparser *P, jop op)
{
    if (!is_op(P, op))
        return false;
    next(P);
    return true;
}
static bool skip_name(jparser *P, const char *name)
{
    if (!is_name(P, name))
        return false;
    next(P);
    return true;
}
static void expect_op(jparser *P, jop op)
{
    if (!skip_op(P, op)) {
        char what[16];
        snprintf(what, sizeof what, "'%s'", op_text[op]);
        fail_expected(P, what);
    }
}
static void expect_kind(jparser *P, jtok_kind k, const char *what)
{
    if (cur(P)->kind != k)
        fail_expected(P, what);
    next(P);
}
static const char *expect_name(jparser *P)
{
    if (cur(P)->kind != JT_NAME)
        fail_expected(P, "a name");
    const jtok *t = next(P);
    char *s = palloc(P, t->n + 1);
    memcpy(s, t->p, t->n);
    return s;
}

static jnode *nn(jparser *P, jn_kind kind, int line)
{
    jnode *n = palloc(P, sizeof *n);
    n->kind = (uint8_t)kind;
    n->line = line;
    return n;
}

/* Growable node list in the arena. */
typedef struct nvec {
    jnode **v;
    size_t n, cap;
} nvec;

static void nvec_push(jparser *P, nvec *v, jnode *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        jnode **nv = palloc(P, cap * sizeof *nv);
        if (v->n)
            memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static void enter(jparser *P)
{
    if (++P->depth > PARSE_MAX_DEPTH)
        parse_fail(P, TD_ERANGE, cur(P)->line, "template nested too deeply (more than %d levels)",
                   PARSE_MAX_DEPTH);
}
static void leave(jparser *P) { P->depth--; }

static jnode *parse_expression(jparser *P, bool with_condexpr);
static jnode *parse_tuple(jparser *P, bool simplified, bool with_condexpr, const char *extra_end,
                          bool explicit_parens);
static jnode *parse_unary(jparser *P, bool with_filter);
static jnode *parse_primary(jparser *P, bool with_namespace);
static jnode *parse_postfix(jparser *P, jnode *node);

static void parse_call_args(jparser *P, jargs *a)
{
    int line = cur(P)->line;
    expect_op(P, JOP_LPAREN);
    nvec pos = {0}, kwv = {0};
    const char *kwn[64];
    bool need_comma = false;
    while (!is_op(P, JOP_RPAREN)) {
        if (need_comma) {
            expect_op(P, JOP_COMMA);
            if (is_op(P, JOP_RPAREN))
                break;
        }
        if (is_op(P, JOP_MUL) || is_op(P, JOP_POW)) {
            bool dstar = is_op(P, JOP_POW);
            if (a->dstar || (!dstar && a->star))
                parse_fail(P, TD_EFORMAT, line, "invalid syntax for function call expression");
            next(P);
            if (dstar)
                a->dstar = parse_expression(P, true);
            else
                a->star = parse_expression(P, true);
        } else if (cur(P)->kind == JT_NAME && peek(P)->kind == JT_OP && peek(P)->op == JOP_ASSIGN) {
            if (a->dstar)
                parse_fail(P, TD_EFORMAT, line, "invalid syntax for function call expression");
            if (kwv.n == sizeof kwn / sizeof kwn[0])
                parse_fail(P, TD_ENOTSUP, line, "too many keyword arguments");
            kwn[kwv.n] = expect_name(P);
            next(P);
            nvec_push(P, &kwv, parse_expression(P, true));
        } else {
            if (a->star || a->dstar || kwv.n)
                parse_fail(P, TD_EFORMAT, line, "invalid syntax for function call expression");
            nvec_push(P, &pos, parse_expression(P, true));
        }
        need_comma = true;
    }
    expect_op(P, JOP_RPAREN);
    a->pos = pos.v;
    a->n_pos = pos.n;
    a->kw_val = kwv.v;
    a->n_kw = kwv.n;
    if (kwv.n) {
        a->kw = palloc(P, kwv.n * sizeof *a->kw);
        memcpy(a->kw, kwn, kwv.n * sizeof *a->kw);
    }
}

/* "|name(args)" repeated; node is NULL for a filter block. */
static jnode *parse_filter(jparser *P, jnode *node, bool start_inline)
{
    while (is_op(P, JOP_PIPE) || start_inline) {
        if (!start_inline)
            next(P);
        int line = cur(P)->line;
        const char *name = expect_name(P);
        if (is_op(P, JOP_DOT))
            parse_fail(P, TD_ENOTSUP, line, "dotted filter names are not supported");
        int fn = jinja_filter_find(name);
        if (fn < 0)
            parse_fail(P, TD_ENOTSUP, line, "no filter named '%s'", name);
        jnode *f = nn(P, JN_FILTER, line);
        f->fn = (uint16_t)fn;
        f->a = node;
        f->name = name;
        if (is_op(P, JOP_LPAREN))
            parse_call_args(P, &f->args);
        node = f;
        start_inline = false;
    }
    return node;
}

static jnode *parse_test(jparser *P, jnode *node)
{
    int line = next(P)->line; /* "is" */
    bool negated = skip_name(P, "not");
    const char *name = expect_name(P);
    if (is_op(P, JOP_DOT))
        parse_fail(P, TD_ENOTSUP, line, "dotted test names are not supported");
    int fn = jinja_test_find(name);
    if (fn < 0)
        parse_fail(P, TD_ENOTSUP, line, "no test named '%s'", name);
    jnode *t = nn(P, JN_TEST, line);
    t->fn = (uint16_t)fn;
    t->a = node;
    t->name = name;
    const jtok *c = cur(P);
    if (is_op(P, JOP_LPAREN)) {
        parse_call_args(P, &t->args);
    } else if ((c->kind == JT_NAME || c->kind == JT_STRING || c->kind == JT_INT || c->kind == JT_FLOAT ||
                is_op(P, JOP_LBRACKET) || is_op(P, JOP_LBRACE)) &&
               !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
        if (is_name(P, "is"))
            parse_fail(P, TD_EFORMAT, c->line, "you cannot chain multiple tests with is");
        jnode *arg = parse_postfix(P, parse_primary(P, false));
        t->args.pos = palloc(P, sizeof *t->args.pos);
        t->args.pos[0] = arg;
        t->args.n_pos = 1;
    }
    if (negated) {
        jnode *n = nn(P, JN_NOT, line);
        n->a = t;
        return n;
    }
    return t;
}

static jnode *parse_filter_expr(jparser *P, jnode *node)
{
    for (;;) {
        if (is_op(P, JOP_PIPE)) {
            node = parse_filter(P, node, false);
        } else if (is_name(P, "is")) {
            node = parse_test(P, node);
        } else if (is_op(P, JOP_LPAREN)) {
            jnode *c = nn(P, JN_CALL, cur(P)->line);
            c->a = node;
            parse_call_args(P, &c->args);
            node = c;
        } else {
            return node;
        }
    }
}

/* [start:stop:step] or an expression, inside brackets. */
static jnode *parse_subscribed(jparser *P)
{
    int line = cur(P)->line;
    jnode *args[3] = {0};
    if (is_op(P, JOP_COLON)) {
        next(P);
    } else {
        jnode *e = parse_expression(P, true);
        if (!is_op(P, JOP_COLON))
            return e;
        next(P);
        args[0] = e;
    }
    if (!is_op(P, JOP_COLON) && !is_op(P, JOP_RBRACKET) && !is_op(P, JOP_COMMA))
        args[1] = parse_expression(P, true);
    if (skip_op(P, JOP_COLON) && !is_op(P, JOP_RBRACKET) && !is_op(P, JOP_COMMA))
        args[2] = parse_expression(P, true);
    jnode *s = nn(P, JN_SLICE, line);
    s->a = args[0];
    s->b = args[1];
    s->c = args[2];
    return s;
}

static jnode *parse_postfix(jparser *P, jnode *node)
{
    for (;;) {
        int line = cur(P)->line;
        if (skip_op(P, JOP_DOT)) {
            const jtok *t = cur(P);
            if (t->kind == JT_NAME) {
                jnode *g = nn(P, JN_GETATTR, line);
                g->a = node;
                g->name = expect_name(P);
                node = g;
            } else if (t->kind == JT_INT) {
                jnode *g = nn(P, JN_GETITEM, line);
                g->a = node;
                g->b = nn(P, JN_CONST, line);
                g->b->val = jv_int(next(P)->i);
                node = g;
            } else {
                fail_expected(P, "a name or number");
            }
        } else if (skip_op(P, JOP_LBRACKET)) {
            nvec args = {0};
            while (!is_op(P, JOP_RBRACKET)) {
                if (args.n)
                    expect_op(P, JOP_COMMA);
                nvec_push(P, &args, parse_subscribed(P));
            }
            expect_op(P, JOP_RBRACKET);
            if (args.n == 0)
                parse_fail(P, TD_EFORMAT, line, "expected subscript expression");
            jnode *g = nn(P, JN_GETITEM, line);
            g->a = node;
            if (args.n == 1) {
                g->b = args.v[0];
            } else {
                g->b = nn(P, JN_TUPLE, line);
                g->b->kids = args.v;
                g->b->n_kids = args.n;
            }
            node = g;
        } else if (is_op(P, JOP_LPAREN)) {
            jnode *c = nn(P, JN_CALL, line);
            c->a = node;
            parse_call_args(P, &c->args);
            node = c;
        } else {
            return node;
        }
    }
}

static jnode *parse_primary(jparser *P, bool with_namespace)
{
    const jtok *t = cur(P);
    int line = t->line;
    jnode *node;
    enter(P);
    if (t->kind == JT_NAME) {
        const char *name = expect_name(P);
        node = nn(P, JN_CONST, line);
        if (!strcmp(name, "true") || !strcmp(name, "True")) {
            node->val = jv_bool(true);
        } else if (!strcmp(name, "false") || !strcmp(name, "False")) {
            node->val = jv_bool(false);
        } else if (!strcmp(name, "none") || !strcmp(name, "None")) {
            node->val = jv_none();
        } else if (with_namespace && is_op(P, JOP_DOT)) {
            next(P);
            node->kind = JN_NSREF;
            node->name = name;
            node->attr = expect_name(P);
        } else {
            node->kind = JN_NAME;
            node->name = name;
            if (P->macro && !strcmp(name, "varargs"))
                P->macro->uses_varargs = true;
            if (P->macro && !strcmp(name, "kwargs"))
                P->macro->uses_kwargs = true;
        }
    } else if (t->kind == JT_STRING) {
        size_t total = 0, k = P->i;
        for (; P->tok[k].kind == JT_STRING; k++)
            total += P->tok[k].n;
        node = nn(P, JN_CONST, line);
        if (k == P->i + 1) {
            node->val = jv_strn(t->p, t->n);
            next(P);
        } else {
            char *s = palloc(P, total + 1);
            size_t o = 0;
            while (cur(P)->kind == JT_STRING) {
                memcpy(s + o, cur(P)->p, cur(P)->n);
                o += cur(P)->n;
                next(P);
            }
            node->val = jv_strn(s, total);
        }
    } else if (t->kind == JT_INT || t->kind == JT_FLOAT) {
        node = nn(P, JN_CONST, line);
        node->val = t->kind == JT_INT ? jv_int(t->i) : jv_float(t->f);
        next(P);
    } else if (skip_op(P, JOP_LPAREN)) {
        node = parse_tuple(P, false, true, NULL, true);
        expect_op(P, JOP_RPAREN);
    } else if (skip_op(P, JOP_LBRACKET)) {
        node = nn(P, JN_LIST, line);
        nvec items = {0};
        while (!is_op(P, JOP_RBRACKET)) {
            if (items.n)
                expect_op(P, JOP_COMMA);
            if (is_op(P, JOP_RBRACKET))
                break;
            nvec_push(P, &items, parse_expression(P, true));
        }
        expect_op(P, JOP_RBRACKET);
        node->kids = items.v;
        node->n_kids = items.n;
    } else if (skip_op(P, JOP_LBRACE)) {
        node = nn(P, JN_DICT, line);
        nvec items = {0};
        while (!is_op(P, JOP_RBRACE)) {
            if (items.n)
                expect_op(P, JOP_COMMA);
            if (is_op(P, JOP_RBRACE))
                break;
            nvec_push(P, &items, parse_expression(P, true));
            expect_op(P, JOP_COLON);
            nvec_push(P, &items, parse_expression(P, true));
        }
        expect_op(P, JOP_RBRACE);
        node->kids = items.v;
        node->n_kids = items.n;
    } else {
        char buf[96];
        parse_fail(P, TD_EFORMAT, line, "unexpected %s", describe(t, buf, sizeof buf));
    }
    leave(P);
    return node;
}

static jnode *parse_unary(jparser *P, bool with_filter)
{
    int line = cur(P)->line;
    jnode *node;
    enter(P);
    if (is_op(P, JOP_SUB) || is_op(P, JOP_ADD)) {
        jn_kind k = is_op(P, JOP_SUB) ? JN_NEG : JN_POS;
        next(P);
        node = nn(P, k, line);
        node->a = parse_unary(P, false);
    } else {
        node = parse_primary(P, false);
    }
    node = parse_postfix(P, node);
    if (with_filter)
        node = parse_filter_expr(P, node);
    leave(P);
    return node;
}

static jnode *binop(jparser *P, jop op, jnode *a, jnode *b, int line)
{
    jnode *n = nn(P, JN_BINOP, line);
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(jparser *P)
{
    jnode *left = parse_unary(P, true);
    while (is_op(P, JOP_POW)) {
        int line = next(P)->line;
        left = binop(P, JOP_POW, left, parse_unary(P, true), line);
    }
    return left;
}

static jnode *parse_math2(jparser *P)
{
    jnode *left = parse_pow(P);
    while (is_op(P, JOP_MUL) || is_op(P, JOP_DIV) || is_op(P, JOP_FLOORDIV) || is_op(P, JOP_MOD)) {
        const jtok *t = next(P);
        left = binop(P, (jop)t->op, left, parse_pow(P), t->line);
    }
    return left;
}

static jnode *parse_concat(jparser *P)
{
    int line = cur(P)->line;
    jnode *first = parse_math2(P);
    if (!is_op(P, JOP_TILDE))
        return first;
    nvec args = {0};
    nvec_push(P, &args, first);
    while (skip_op(P, JOP_TILDE))
        nvec_push(P, &args, parse_math2(P));
    jnode *n = nn(P, JN_CONCAT, line);
    n->kids = args.v;
    n->n_kids = args.n;
    return n;
}

static jnode *parse_math1(jparser *P)
{
    jnode *left = parse_concat(P);
    while (is_op(P, JOP_ADD) || is_op(P, JOP_SUB)) {
        const jtok *t = next(P);
        left = binop(P, (jop)t->op, left, parse_concat(P), t->line);
    }
    return left;
}

static jnode *parse_compare(jparser *P)
{
    int line = cur(P)->line;
    jnode *expr = parse_math1(P);
    nvec operands = {0};
    uint8_t ops[64];
    for (;;) {
        jop op;
        if (cur(P)->kind == JT_OP && (is_op(P, JOP_EQ) || is_op(P, JOP_NE) || is_op(P, JOP_LT) ||
                                      is_op(P, JOP_LE) || is_op(P, JOP_GT) || is_op(P, JOP_GE))) {
            op = (jop)next(P)->op;
        } else if (skip_name(P, "in")) {
            op = JOP_IN;
        } else if (is_name(P, "not") && peek(P)->kind == JT_NAME && peek(P)->n == 2 &&
                   !memcmp(peek(P)->p, "in", 2)) {
            next(P);
            next(P);
            op = JOP_NOTIN;
        } else {
            break;
        }
        if (operands.n == sizeof ops)
            parse_fail(P, TD_ENOTSUP, line, "comparison chain too long");
        ops[operands.n] = (uint8_t)op;
        nvec_push(P, &operands, parse_math1(P));
    }
    if (!operands.n)
        return expr;
    jnode *n = nn(P, JN_COMPARE, line);
    n->a = expr;
    n->kids = operands.v;
    n->n_kids = operands.n;
    n->ops = palloc(P, operands.n);
    memcpy(n->ops, ops, operands.n);
    return n;
}

static jnode *parse_not(jparser *P)
{
    if (is_name(P, "not")) {
        int line = next(P)->line;
        enter(P);
        jnode *n = nn(P, JN_NOT, line);
        n->a = parse_not(P);
        leave(P);
        return n;
    }
    return parse_compare(P);
}

static jnode *parse_and(jparser *P)
{
    jnode *left = parse_not(P);
    while (is_name(P, "and")) {
        jnode *n = nn(P, JN_AND, next(P)->line);
        n->a = left;
        n->b = parse_not(P);
        left = n;
    }
    return left;
}

static jnode *parse_or(jparser *P)
{
    jnode *left = parse_and(P);
    while (is_name(P, "or")) {
        jnode *n = nn(P, JN_OR, next(P)->line);
        n->a = left;
        n->b = parse_and(P);
        left = n;
    }
    return left;
}

static jnode *parse_condexpr(jparser *P)
{
    int line = cur(P)->line;
    jnode *expr1 = parse_or(P);
    while (skip_name(P, "if")) {
        jnode *n = nn(P, JN_CONDEXPR, line);
        n->a = parse_or(P);
        n->b = expr1;
        if (skip_name(P, "else")) {
            enter(P);
            n->c = parse_condexpr(P);
            leave(P);
        }
        expr1 = n;
    }
    return expr1;
}

static jnode *parse_expression(jparser *P, bool with_condexpr)
{
    enter(P);
    jnode *n = with_condexpr ? parse_condexpr(P) : parse_or(P);
    leave(P);
    return n;
}

static bool is_tuple_end(jparser *P, const char *extra_end)
{
    const jtok *t = cur(P);
    if (t->kind == JT_VAR_END || t->kind == JT_BLOCK_END || is_op(P, JOP_RPAREN))
        return true;
    return extra_end && is_name(P, extra_end);
}

static jnode *parse_tuple(jparser *P, bool simplified, bool with_condexpr, const char *extra_end,
                          bool explicit_parens)
{
    int line = cur(P)->line;
    nvec args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n)
            expect_op(P, JOP_COMMA);
        if (is_tuple_end(P, extra_end))
            break;
        nvec_push(P, &args, simplified ? parse_primary(P, true) : parse_expression(P, with_condexpr));
        if (is_op(P, JOP_COMMA))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (args.n)
            return args.v[0];
        if (!explicit_parens)
            fail_expected(P, "an expression");
    }
    jnode *n = nn(P, JN_TUPLE, line);
    n->kids = args.v;
    n->n_kids = args.n;
    return n;
}

/* ---- statements ------------------------------------------------------------------------ */

static jbody subparse(jparser *P, const char *const *end_tags, const char *closing);

/* Parses the body of a statement up to one of end_tags; leaves the end tag's name current. */
static jbody parse_statements(jparser *P, const char *const *end_tags, const char *closing, bool drop)
{
    skip_op(P, JOP_COLON);
    expect_kind(P, JT_BLOCK_END, "end of statement block");
    jbody b = subparse(P, end_tags, closing);
    if (drop)
        next(P);
    return b;
}

static jnode *parse_assign_target(jparser *P, bool with_namespace, const char *extra_end)
{
    jnode *t = parse_tuple(P, true, true, extra_end, false);
    bool ok = t->kind == JN_NAME || t->kind == JN_NSREF;
    if (t->kind == JN_TUPLE) {
        ok = t->n_kids > 0;
        for (size_t i = 0; i < t->n_kids; i++)
            ok = ok && t->kids[i]->kind == JN_NAME;
    }
    if (t->kind == JN_NSREF && !with_namespace)
        ok = false;
    if (!ok)
        parse_fail(P, TD_EFORMAT, t->line, "can't assign to this expression");
    return t;
}

static jnode *parse_for(jparser *P, int line)
{
    jnode *n = nn(P, JN_FOR, line);
    n->target = parse_assign_target(P, false, "in");
    if (!skip_name(P, "in"))
        fail_expected(P, "'in'");
    n->a = parse_tuple(P, false, false, "recursive", false);
    if (skip_name(P, "if"))
        n->b = parse_expression(P, true);
    if (is_name(P, "recursive"))
        parse_fail(P, TD_ENOTSUP, line, "recursive for loops are not supported");
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const ends2[] = {"endfor", NULL};
    P->loops++;
    n->body = parse_statements(P, ends, "for", false);
    P->loops--;
    if (is_name(P, "else")) {
        next(P);
        n->else_ = parse_statements(P, ends2, "for", true);
    } else {
        next(P);
    }
    return n;
}

static jnode *parse_if(jparser *P, int line)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const ends2[] = {"endif", NULL};
    jnode *result = nn(P, JN_IF, line), *node = result;
    for (;;) {
        node->a = parse_tuple(P, false, false, NULL, false);
        node->body = parse_statements(P, ends, "if", false);
        const jtok *t = next(P);
        if (t->n == 4 && !memcmp(t->p, "elif", 4)) {
            jnode *e = nn(P, JN_IF, t->line);
            node->else_.v = palloc(P, sizeof(jnode *));
            node->else_.v[0] = e;
            node->else_.n = 1;
            node = e;
            enter(P);
            continue;
        }
        if (t->n == 4 && !memcmp(t->p, "else", 4))
            node->else_ = parse_statements(P, ends2, "if", true);
        break;
    }
    for (jnode *e = result; e != node; e = e->else_.v[0])
        leave(P);
    return result;
}

static jnode *parse_set(jparser *P, int line)
{
    jnode *target = parse_assign_target(P, true, NULL);
    if (skip_op(P, JOP_ASSIGN)) {
        jnode *n = nn(P, JN_SET, line);
        n->target = target;
        n->a = parse_tuple(P, false, true, NULL, false);
        return n;
    }
    static const char *const ends[] = {"endset", NULL};
    jnode *n = nn(P, JN_SETBLOCK, line);
    n->target = target;
    n->a = parse_filter(P, NULL, false);
    n->body = parse_statements(P, ends, "set", true);
    return n;
}

static jnode *parse_macro(jparser *P, int line)
{
    jnode *n = nn(P, JN_MACRO, line);
    n->name = expect_name(P);
    expect_op(P, JOP_LPAREN);
    nvec params = {0}, defaults = {0};
    while (!is_op(P, JOP_RPAREN)) {
        if (params.n)
            expect_op(P, JOP_COMMA);
        jnode *p = nn(P, JN_NAME, cur(P)->line);
        p->name = expect_name(P);
        if (skip_op(P, JOP_ASSIGN))
            nvec_push(P, &defaults, parse_expression(P, true));
        else if (defaults.n)
            parse_fail(P, TD_EFORMAT, p->line, "non-default argument follows default argument");
        nvec_push(P, &params, p);
    }
    expect_op(P, JOP_RPAREN);
    n->args.pos = params.v;
    n->args.n_pos = params.n;
    n->args.kw_val = defaults.v; /* defaults of the last defaults.n parameters */
    n->args.n_kw = defaults.n;
    static const char *const ends[] = {"endmacro", NULL};
    jnode *outer = P->macro;
    int loops = P->loops;
    P->macro = n;
    P->loops = 0;
    n->body = parse_statements(P, ends, "macro", true);
    P->macro = outer;
    P->loops = loops;
    return n;
}

static jnode *parse_statement(jparser *P)
{
    const jtok *t = cur(P);
    if (t->kind != JT_NAME)
        fail_expected(P, "a tag name");
    int line = t->line;
    char tag[32];
    snprintf(tag, sizeof tag, "%.*s", (int)(t->n < 31 ? t->n : 31), t->p);
    next(P);
    enter(P);
    jnode *n = NULL;
    if (!strcmp(tag, "for")) {
        n = parse_for(P, line);
    } else if (!strcmp(tag, "if")) {
        n = parse_if(P, line);
    } else if (!strcmp(tag, "set")) {
        n = parse_set(P, line);
    } else if (!strcmp(tag, "macro")) {
        n = parse_macro(P, line);
    } else if (!strcmp(tag, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        n = nn(P, JN_FILTERBLOCK, line);
        n->a = parse_filter(P, NULL, true);
        n->body = parse_statements(P, ends, "filter", true);
    } else if (!strcmp(tag, "with")) {
        static const char *const ends[] = {"endwith", NULL};
        n = nn(P, JN_WITH, line);
        nvec kids = {0};
        while (cur(P)->kind != JT_BLOCK_END) {
            if (kids.n)
                expect_op(P, JOP_COMMA);
            jnode *target = parse_assign_target(P, false, NULL);
            if (target->kind != JN_NAME)
                parse_fail(P, TD_ENOTSUP, line, "with: only plain names can be assigned");
            nvec_push(P, &kids, target);
            expect_op(P, JOP_ASSIGN);
            nvec_push(P, &kids, parse_expression(P, true));
        }
        n->kids = kids.v;
        n->n_kids = kids.n;
        n->body = parse_statements(P, ends, "with", true);
    } else if (!strcmp(tag, "generation")) {
        /* transformers' assistant-mask block: renders as its body */
        static const char *const ends[] = {"endgeneration", NULL};
        n = nn(P, JN_IF, line);
        n->a = nn(P, JN_CONST, line);
        n->a->val = jv_bool(true);
        n->body = parse_statements(P, ends, "generation", true);
    } else if (!strcmp(tag, "print")) {
        n = nn(P, JN_OUTPUT, line);
        n->a = parse_tuple(P, false, true, NULL, false);
    } else if (!strcmp(tag, "break") || !strcmp(tag, "continue")) {
        if (!P->loops)
            parse_fail(P, TD_EFORMAT, line, "'%s' outside of a for loop", tag);
        n = nn(P, tag[0] == 'b' ? JN_BREAK : JN_CONTINUE, line);
    } else if (!strcmp(tag, "extends") || !strcmp(tag, "include") || !strcmp(tag, "import") ||
               !strcmp(tag, "from") || !strcmp(tag, "block") || !strcmp(tag, "call") ||
               !strcmp(tag, "autoescape") || !strcmp(tag, "do") || !strcmp(tag, "trans")) {
        parse_fail(P, TD_ENOTSUP, line, "the '%s' tag is not supported", tag);
    } else {
        parse_fail(P, TD_EFORMAT, line, "unknown tag '%s'", tag);
    }
    leave(P);
    return n;
}

static bool tag_in(const jtok *t, const char *const *tags)
{
    if (!tags || t->kind != JT_NAME)
        return false;
    for (; *tags; tags++)
        if (t->n == strlen(*tags) && !memcmp(t->p, *tags, t->n))
            return true;
    return false;
}

static jbody subparse(jparser *P, const char *const *end_tags, const char *closing)
{
    nvec body = {0};
    for (;;) {
        const jtok *t = cur(P);
        if (t->kind == JT_EOF) {
            if (end_tags)
                parse_fail(P, TD_EFORMAT, t->line,
                           "unexpected end of template, expected '%s' to close the '%s' block",
                           end_tags[0], closing);
            break;
        }
        if (t->kind == JT_DATA) {
            jnode *d = nn(P, JN_DATA, t->line);
            d->val = jv_strn(t->p, t->n);
            nvec_push(P, &body, d);
            next(P);
        } else if (t->kind == JT_VAR_BEGIN) {
            next(P);
            jnode *o = nn(P, JN_OUTPUT, t->line);
            o->a = parse_tuple(P, false, true, NULL, false);
            expect_kind(P, JT_VAR_END, "end of print statement '}}'");
            nvec_push(P, &body, o);
        } else if (t->kind == JT_BLOCK_BEGIN) {
            next(P);
            if (tag_in(cur(P), end_tags))
                break;
            if (cur(P)->kind == JT_NAME && !end_tags) {
                static const char *const stray[] = {"endif", "endfor", "else", "elif", "endset",
                                                    "endmacro", "endfilter", "endwith",
                                                    "endgeneration", NULL};
                if (tag_in(cur(P), stray)) {
                    char buf[96];
                    parse_fail(P, TD_EFORMAT, cur(P)->line, "unexpected %s with no block to close",
                               describe(cur(P), buf, sizeof buf));
                }
            } else if (cur(P)->kind == JT_NAME && end_tags && !tag_in(cur(P), end_tags)) {
                static const char *const ends_any[] = {"endif", "endfor", "else", "elif", "endset",
                                                       "endmacro", "endfilter", "endwith",
                                                       "endgeneration", NULL};
                if (tag_in(cur(P), ends_any)) {
                    char buf[96];
                    parse_fail(P, TD_EFORMAT, cur(P)->line, "unexpected %s, expected '%s' to close the '%s' block",
                               describe(cur(P), buf, sizeof buf), end_tags[0], closing);
                }
            }
            nvec_push(P, &body, parse_statement(P));
            expect_kind(P, JT_BLOCK_END, "end of statement block '%}'");
        } else {
            char buf[96];
            parse_fail(P, TD_EFORMAT, t->line, "unexpected %s", describe(t, buf, sizeof buf));
        }
    }
    jbody b = {body.v, body.n};
    return b;
}

td_err jinja_parse(jinja_tmpl *t, const jtok *toks, size_t n_toks)
{
    jparser P = {.t = t, .tok = toks, .n = n_toks};
    if (setjmp(P.jb))
        return P.code;
    t->body = subparse(&P, NULL, NULL);
    return TD_OK;
}
