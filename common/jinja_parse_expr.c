/* Jinja expressions, by jinja2's parser.py: or < and < not < comparisons (chained, with in
 * and not in) < + - < ~ < * / // % < ** < unary - + < postfix (.attr, [item], [a:b:c], calls)
 * with filters and tests binding to the unary operand ("-x|abs" filters -x); conditional
 * expressions; tuples without parentheses; adjacent string literals joined; test arguments
 * without parentheses ("x is divisibleby 3"). */
#include <stdio.h>
#include <string.h>

#include "common/jinja_int.h"

static jnode *jp_unary(jparser *P, bool with_filter);

static void jp_call_args(jparser *P, jargs *a)
{
    int line = jp_cur(P)->line;
    jp_expect_op(P, JOP_LPAREN);
    nvec pos = {0}, kwv = {0};
    const char *kwn[64];
    bool need_comma = false;
    while (!jp_is_op(P, JOP_RPAREN)) {
        if (need_comma) {
            jp_expect_op(P, JOP_COMMA);
            if (jp_is_op(P, JOP_RPAREN))
                break;
        }
        if (jp_is_op(P, JOP_MUL) || jp_is_op(P, JOP_POW)) {
            bool dstar = jp_is_op(P, JOP_POW);
            if (a->dstar || (!dstar && a->star))
                jp_parse_fail(P, TD_EFORMAT, line, "invalid syntax for function call expression");
            jp_next(P);
            if (dstar)
                a->dstar = jp_expression(P, true);
            else
                a->star = jp_expression(P, true);
        } else if (jp_cur(P)->kind == JT_NAME && jp_peek(P)->kind == JT_OP && jp_peek(P)->op == JOP_ASSIGN) {
            if (a->dstar)
                jp_parse_fail(P, TD_EFORMAT, line, "invalid syntax for function call expression");
            if (kwv.n == sizeof kwn / sizeof kwn[0])
                jp_parse_fail(P, TD_ENOTSUP, line, "too many keyword arguments");
            kwn[kwv.n] = jp_expect_name(P);
            jp_next(P);
            jp_nvec_push(P, &kwv, jp_expression(P, true));
        } else {
            if (a->star || a->dstar || kwv.n)
                jp_parse_fail(P, TD_EFORMAT, line, "invalid syntax for function call expression");
            jp_nvec_push(P, &pos, jp_expression(P, true));
        }
        need_comma = true;
    }
    jp_expect_op(P, JOP_RPAREN);
    a->pos = pos.v;
    a->n_pos = pos.n;
    a->kw_val = kwv.v;
    a->n_kw = kwv.n;
    if (kwv.n) {
        a->kw = jp_palloc(P, kwv.n * sizeof *a->kw);
        memcpy(a->kw, kwn, kwv.n * sizeof *a->kw);
    }
}

/* "|name(args)" repeated; node is NULL for a filter block. */
jnode *jp_filter(jparser *P, jnode *node, bool start_inline)
{
    while (jp_is_op(P, JOP_PIPE) || start_inline) {
        if (!start_inline)
            jp_next(P);
        int line = jp_cur(P)->line;
        const char *name = jp_expect_name(P);
        if (jp_is_op(P, JOP_DOT))
            jp_parse_fail(P, TD_ENOTSUP, line, "dotted filter names are not supported");
        int fn = jinja_filter_find(name);
        if (fn < 0)
            jp_parse_fail(P, TD_ENOTSUP, line, "no filter named '%s'", name);
        jnode *f = jp_nn(P, JN_FILTER, line);
        f->fn = (uint16_t)fn;
        f->a = node;
        f->name = name;
        if (jp_is_op(P, JOP_LPAREN))
            jp_call_args(P, &f->args);
        node = f;
        start_inline = false;
    }
    return node;
}

static jnode *jp_test(jparser *P, jnode *node)
{
    int line = jp_next(P)->line; /* "is" */
    bool negated = jp_skip_name(P, "not");
    const char *name = jp_expect_name(P);
    if (jp_is_op(P, JOP_DOT))
        jp_parse_fail(P, TD_ENOTSUP, line, "dotted test names are not supported");
    int fn = jinja_test_find(name);
    if (fn < 0)
        jp_parse_fail(P, TD_ENOTSUP, line, "no test named '%s'", name);
    jnode *t = jp_nn(P, JN_TEST, line);
    t->fn = (uint16_t)fn;
    t->a = node;
    t->name = name;
    const jtok *c = jp_cur(P);
    if (jp_is_op(P, JOP_LPAREN)) {
        jp_call_args(P, &t->args);
    } else if ((c->kind == JT_NAME || c->kind == JT_STRING || c->kind == JT_INT || c->kind == JT_FLOAT ||
                jp_is_op(P, JOP_LBRACKET) || jp_is_op(P, JOP_LBRACE)) &&
               !jp_is_name(P, "else") && !jp_is_name(P, "or") && !jp_is_name(P, "and")) {
        if (jp_is_name(P, "is"))
            jp_parse_fail(P, TD_EFORMAT, c->line, "you cannot chain multiple tests with is");
        jnode *arg = jp_postfix(P, jp_primary(P, false));
        t->args.pos = jp_palloc(P, sizeof *t->args.pos);
        t->args.pos[0] = arg;
        t->args.n_pos = 1;
    }
    if (negated) {
        jnode *n = jp_nn(P, JN_NOT, line);
        n->a = t;
        return n;
    }
    return t;
}

static jnode *jp_filter_expr(jparser *P, jnode *node)
{
    for (;;) {
        if (jp_is_op(P, JOP_PIPE)) {
            node = jp_filter(P, node, false);
        } else if (jp_is_name(P, "is")) {
            node = jp_test(P, node);
        } else if (jp_is_op(P, JOP_LPAREN)) {
            jnode *c = jp_nn(P, JN_CALL, jp_cur(P)->line);
            c->a = node;
            jp_call_args(P, &c->args);
            node = c;
        } else {
            return node;
        }
    }
}

/* [start:stop:step] or an expression, inside brackets. */
static jnode *jp_subscribed(jparser *P)
{
    int line = jp_cur(P)->line;
    jnode *args[3] = {0};
    if (jp_is_op(P, JOP_COLON)) {
        jp_next(P);
    } else {
        jnode *e = jp_expression(P, true);
        if (!jp_is_op(P, JOP_COLON))
            return e;
        jp_next(P);
        args[0] = e;
    }
    if (!jp_is_op(P, JOP_COLON) && !jp_is_op(P, JOP_RBRACKET) && !jp_is_op(P, JOP_COMMA))
        args[1] = jp_expression(P, true);
    if (jp_skip_op(P, JOP_COLON) && !jp_is_op(P, JOP_RBRACKET) && !jp_is_op(P, JOP_COMMA))
        args[2] = jp_expression(P, true);
    jnode *s = jp_nn(P, JN_SLICE, line);
    s->a = args[0];
    s->b = args[1];
    s->c = args[2];
    return s;
}

jnode *jp_postfix(jparser *P, jnode *node)
{
    for (;;) {
        int line = jp_cur(P)->line;
        if (jp_skip_op(P, JOP_DOT)) {
            const jtok *t = jp_cur(P);
            if (t->kind == JT_NAME) {
                jnode *g = jp_nn(P, JN_GETATTR, line);
                g->a = node;
                g->name = jp_expect_name(P);
                node = g;
            } else if (t->kind == JT_INT) {
                jnode *g = jp_nn(P, JN_GETITEM, line);
                g->a = node;
                g->b = jp_nn(P, JN_CONST, line);
                g->b->val = jv_int(jp_next(P)->i);
                node = g;
            } else {
                jp_fail_expected(P, "a name or number");
            }
        } else if (jp_skip_op(P, JOP_LBRACKET)) {
            nvec args = {0};
            while (!jp_is_op(P, JOP_RBRACKET)) {
                if (args.n)
                    jp_expect_op(P, JOP_COMMA);
                jp_nvec_push(P, &args, jp_subscribed(P));
            }
            jp_expect_op(P, JOP_RBRACKET);
            if (args.n == 0)
                jp_parse_fail(P, TD_EFORMAT, line, "expected subscript expression");
            jnode *g = jp_nn(P, JN_GETITEM, line);
            g->a = node;
            if (args.n == 1) {
                g->b = args.v[0];
            } else {
                for (size_t i = 0; i < args.n; i++)
                    if (args.v[i]->kind == JN_SLICE)
                        jp_parse_fail(P, TD_ENOTSUP, line, "slices inside a subscript tuple are not supported");
                g->b = jp_nn(P, JN_TUPLE, line);
                g->b->kids = args.v;
                g->b->n_kids = args.n;
            }
            node = g;
        } else if (jp_is_op(P, JOP_LPAREN)) {
            jnode *c = jp_nn(P, JN_CALL, line);
            c->a = node;
            jp_call_args(P, &c->args);
            node = c;
        } else {
            return node;
        }
    }
}

jnode *jp_primary(jparser *P, bool with_namespace)
{
    const jtok *t = jp_cur(P);
    int line = t->line;
    jnode *node;
    jp_enter(P);
    if (t->kind == JT_NAME) {
        const char *name = jp_expect_name(P);
        node = jp_nn(P, JN_CONST, line);
        if (!strcmp(name, "true") || !strcmp(name, "True")) {
            node->val = jv_bool(true);
        } else if (!strcmp(name, "false") || !strcmp(name, "False")) {
            node->val = jv_bool(false);
        } else if (!strcmp(name, "none") || !strcmp(name, "None")) {
            node->val = jv_none();
        } else if (with_namespace && jp_is_op(P, JOP_DOT)) {
            jp_next(P);
            node->kind = JN_NSREF;
            node->name = name;
            node->attr = jp_expect_name(P);
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
        node = jp_nn(P, JN_CONST, line);
        if (k == P->i + 1) {
            node->val = jv_strn(t->p, t->n);
            jp_next(P);
        } else {
            char *s = jp_palloc(P, total + 1);
            size_t o = 0;
            while (jp_cur(P)->kind == JT_STRING) {
                memcpy(s + o, jp_cur(P)->p, jp_cur(P)->n);
                o += jp_cur(P)->n;
                jp_next(P);
            }
            node->val = jv_strn(s, total);
        }
    } else if (t->kind == JT_INT || t->kind == JT_FLOAT) {
        node = jp_nn(P, JN_CONST, line);
        node->val = t->kind == JT_INT ? jv_int(t->i) : jv_float(t->f);
        jp_next(P);
    } else if (jp_skip_op(P, JOP_LPAREN)) {
        node = jp_tuple(P, false, true, NULL, true);
        jp_expect_op(P, JOP_RPAREN);
    } else if (jp_skip_op(P, JOP_LBRACKET)) {
        node = jp_nn(P, JN_LIST, line);
        nvec items = {0};
        while (!jp_is_op(P, JOP_RBRACKET)) {
            if (items.n)
                jp_expect_op(P, JOP_COMMA);
            if (jp_is_op(P, JOP_RBRACKET))
                break;
            jp_nvec_push(P, &items, jp_expression(P, true));
        }
        jp_expect_op(P, JOP_RBRACKET);
        node->kids = items.v;
        node->n_kids = items.n;
    } else if (jp_skip_op(P, JOP_LBRACE)) {
        node = jp_nn(P, JN_DICT, line);
        nvec items = {0};
        while (!jp_is_op(P, JOP_RBRACE)) {
            if (items.n)
                jp_expect_op(P, JOP_COMMA);
            if (jp_is_op(P, JOP_RBRACE))
                break;
            jp_nvec_push(P, &items, jp_expression(P, true));
            jp_expect_op(P, JOP_COLON);
            jp_nvec_push(P, &items, jp_expression(P, true));
        }
        jp_expect_op(P, JOP_RBRACE);
        node->kids = items.v;
        node->n_kids = items.n;
    } else {
        char buf[96];
        jp_parse_fail(P, TD_EFORMAT, line, "unexpected %s", jp_describe(t, buf, sizeof buf));
    }
    jp_leave(P);
    return node;
}

static jnode *jp_unary(jparser *P, bool with_filter)
{
    int line = jp_cur(P)->line;
    jnode *node;
    jp_enter(P);
    if (jp_is_op(P, JOP_SUB) || jp_is_op(P, JOP_ADD)) {
        jn_kind k = jp_is_op(P, JOP_SUB) ? JN_NEG : JN_POS;
        jp_next(P);
        node = jp_nn(P, k, line);
        node->a = jp_unary(P, false);
    } else {
        node = jp_primary(P, false);
    }
    node = jp_postfix(P, node);
    if (with_filter)
        node = jp_filter_expr(P, node);
    jp_leave(P);
    return node;
}

static jnode *jp_binop(jparser *P, jop op, jnode *a, jnode *b, int line)
{
    jnode *n = jp_nn(P, JN_BINOP, line);
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *jp_pow(jparser *P)
{
    jnode *left = jp_unary(P, true);
    while (jp_is_op(P, JOP_POW)) {
        int line = jp_next(P)->line;
        left = jp_binop(P, JOP_POW, left, jp_unary(P, true), line);
    }
    return left;
}

static jnode *jp_math2(jparser *P)
{
    jnode *left = jp_pow(P);
    while (jp_is_op(P, JOP_MUL) || jp_is_op(P, JOP_DIV) || jp_is_op(P, JOP_FLOORDIV) || jp_is_op(P, JOP_MOD)) {
        const jtok *t = jp_next(P);
        left = jp_binop(P, (jop)t->op, left, jp_pow(P), t->line);
    }
    return left;
}

static jnode *jp_concat(jparser *P)
{
    int line = jp_cur(P)->line;
    jnode *first = jp_math2(P);
    if (!jp_is_op(P, JOP_TILDE))
        return first;
    nvec args = {0};
    jp_nvec_push(P, &args, first);
    while (jp_skip_op(P, JOP_TILDE))
        jp_nvec_push(P, &args, jp_math2(P));
    jnode *n = jp_nn(P, JN_CONCAT, line);
    n->kids = args.v;
    n->n_kids = args.n;
    return n;
}

static jnode *jp_math1(jparser *P)
{
    jnode *left = jp_concat(P);
    while (jp_is_op(P, JOP_ADD) || jp_is_op(P, JOP_SUB)) {
        const jtok *t = jp_next(P);
        left = jp_binop(P, (jop)t->op, left, jp_concat(P), t->line);
    }
    return left;
}

static jnode *jp_compare(jparser *P)
{
    int line = jp_cur(P)->line;
    jnode *expr = jp_math1(P);
    nvec operands = {0};
    uint8_t ops[64];
    for (;;) {
        jop op;
        if (jp_cur(P)->kind == JT_OP && (jp_is_op(P, JOP_EQ) || jp_is_op(P, JOP_NE) || jp_is_op(P, JOP_LT) ||
                                      jp_is_op(P, JOP_LE) || jp_is_op(P, JOP_GT) || jp_is_op(P, JOP_GE))) {
            op = (jop)jp_next(P)->op;
        } else if (jp_skip_name(P, "in")) {
            op = JOP_IN;
        } else if (jp_is_name(P, "not") && jp_peek(P)->kind == JT_NAME && jp_peek(P)->n == 2 &&
                   !memcmp(jp_peek(P)->p, "in", 2)) {
            jp_next(P);
            jp_next(P);
            op = JOP_NOTIN;
        } else {
            break;
        }
        if (operands.n == sizeof ops)
            jp_parse_fail(P, TD_ENOTSUP, line, "comparison chain too long");
        ops[operands.n] = (uint8_t)op;
        jp_nvec_push(P, &operands, jp_math1(P));
    }
    if (!operands.n)
        return expr;
    jnode *n = jp_nn(P, JN_COMPARE, line);
    n->a = expr;
    n->kids = operands.v;
    n->n_kids = operands.n;
    n->ops = jp_palloc(P, operands.n);
    memcpy(n->ops, ops, operands.n);
    return n;
}

static jnode *jp_not(jparser *P)
{
    if (jp_is_name(P, "not")) {
        int line = jp_next(P)->line;
        jp_enter(P);
        jnode *n = jp_nn(P, JN_NOT, line);
        n->a = jp_not(P);
        jp_leave(P);
        return n;
    }
    return jp_compare(P);
}

static jnode *jp_and(jparser *P)
{
    jnode *left = jp_not(P);
    while (jp_is_name(P, "and")) {
        jnode *n = jp_nn(P, JN_AND, jp_next(P)->line);
        n->a = left;
        n->b = jp_not(P);
        left = n;
    }
    return left;
}

static jnode *jp_or(jparser *P)
{
    jnode *left = jp_and(P);
    while (jp_is_name(P, "or")) {
        jnode *n = jp_nn(P, JN_OR, jp_next(P)->line);
        n->a = left;
        n->b = jp_and(P);
        left = n;
    }
    return left;
}

static jnode *jp_condexpr(jparser *P)
{
    int line = jp_cur(P)->line;
    jnode *expr1 = jp_or(P);
    while (jp_skip_name(P, "if")) {
        jnode *n = jp_nn(P, JN_CONDEXPR, line);
        n->a = jp_or(P);
        n->b = expr1;
        if (jp_skip_name(P, "else")) {
            jp_enter(P);
            n->c = jp_condexpr(P);
            jp_leave(P);
        }
        expr1 = n;
    }
    return expr1;
}

jnode *jp_expression(jparser *P, bool with_condexpr)
{
    jp_enter(P);
    jnode *n = with_condexpr ? jp_condexpr(P) : jp_or(P);
    jp_leave(P);
    return n;
}

static bool jp_is_tuple_end(jparser *P, const char *extra_end)
{
    const jtok *t = jp_cur(P);
    if (t->kind == JT_VAR_END || t->kind == JT_BLOCK_END || jp_is_op(P, JOP_RPAREN))
        return true;
    return extra_end && jp_is_name(P, extra_end);
}

jnode *jp_tuple(jparser *P, bool simplified, bool with_condexpr, const char *extra_end,
                bool explicit_parens)
{
    int line = jp_cur(P)->line;
    nvec args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n)
            jp_expect_op(P, JOP_COMMA);
        if (jp_is_tuple_end(P, extra_end))
            break;
        jp_nvec_push(P, &args, simplified ? jp_primary(P, true) : jp_expression(P, with_condexpr));
        if (jp_is_op(P, JOP_COMMA))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (args.n)
            return args.v[0];
        if (!explicit_parens)
            jp_fail_expected(P, "an expression");
    }
    jnode *n = jp_nn(P, JN_TUPLE, line);
    n->kids = args.v;
    n->n_kids = args.n;
    return n;
}
