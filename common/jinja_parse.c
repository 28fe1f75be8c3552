/* Jinja tokens -> tree: statements, by jinja2's parser.py, and the parser's token helpers
 * (expressions are in jinja_parse_expr.c).
 *
 * Statements: if/elif/else, for (with else, an `if` filter and tuple targets), set (also
 * namespace attributes and the block form), macro, filter, with, break, continue, print and
 * transformers' generation block (rendered as its body). Anything else is a compile error:
 * TD_ENOTSUP for Jinja features outside the subset (extends, include, call blocks, recursive
 * loops), TD_EFORMAT for what is not Jinja at all. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/jinja_int.h"

void jp_parse_fail(jparser *P, td_err code, int line, const char *fmt, ...)
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

void *jp_palloc(jparser *P, size_t n)
{
    void *p = jarena_alloc(&P->t->arena, n);
    if (!p)
        jp_parse_fail(P, TD_ENOMEM, P->tok[P->i].line, "out of memory");
    return p;
}

const jtok *jp_cur(jparser *P) { return &P->tok[P->i]; }
const jtok *jp_peek(jparser *P) { return &P->tok[P->i + 1 < P->n ? P->i + 1 : P->i]; }
const jtok *jp_next(jparser *P)
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
const char *jp_describe(const jtok *t, char *buf, size_t cap)
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

void jp_fail_expected(jparser *P, const char *what)
{
    char buf[96];
    jp_parse_fail(P, TD_EFORMAT, jp_cur(P)->line, "expected %s, got %s", what, jp_describe(jp_cur(P), buf, sizeof buf));
}

bool jp_is_op(jparser *P, jop op) { return jp_cur(P)->kind == JT_OP && jp_cur(P)->op == op; }
bool jp_is_name(jparser *P, const char *name)
{
    const jtok *t = jp_cur(P);
    return t->kind == JT_NAME && t->n == strlen(name) && !memcmp(t->p, name, t->n);
}
bool jp_skip_op(jparser *P, jop op)
{
    if (!jp_is_op(P, op))
        return false;
    jp_next(P);
    return true;
}
bool jp_skip_name(jparser *P, const char *name)
{
    if (!jp_is_name(P, name))
        return false;
    jp_next(P);
    return true;
}
void jp_expect_op(jparser *P, jop op)
{
    if (!jp_skip_op(P, op)) {
        char what[16];
        snprintf(what, sizeof what, "'%s'", op_text[op]);
        jp_fail_expected(P, what);
    }
}
void jp_expect_kind(jparser *P, jtok_kind k, const char *what)
{
    if (jp_cur(P)->kind != k)
        jp_fail_expected(P, what);
    jp_next(P);
}
const char *jp_expect_name(jparser *P)
{
    if (jp_cur(P)->kind != JT_NAME)
        jp_fail_expected(P, "a name");
    const jtok *t = jp_next(P);
    char *s = jp_palloc(P, t->n + 1);
    memcpy(s, t->p, t->n);
    return s;
}

jnode *jp_nn(jparser *P, jn_kind kind, int line)
{
    jnode *n = jp_palloc(P, sizeof *n);
    n->kind = (uint8_t)kind;
    n->line = line;
    return n;
}

void jp_nvec_push(jparser *P, nvec *v, jnode *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        jnode **nv = jp_palloc(P, cap * sizeof *nv);
        if (v->n)
            memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

void jp_enter(jparser *P)
{
    if (++P->depth > PARSE_MAX_DEPTH)
        jp_parse_fail(P, TD_ERANGE, jp_cur(P)->line, "template nested too deeply (more than %d levels)",
                      PARSE_MAX_DEPTH);
}
void jp_leave(jparser *P) { P->depth--; }

/* ---- statements ------------------------------------------------------------------------ */

static jbody subparse(jparser *P, const char *const *end_tags, const char *closing);

/* Parses the body of a statement up to one of end_tags; leaves the end tag's name current. */
static jbody parse_statements(jparser *P, const char *const *end_tags, const char *closing, bool drop)
{
    jp_skip_op(P, JOP_COLON);
    jp_expect_kind(P, JT_BLOCK_END, "end of statement block");
    jbody b = subparse(P, end_tags, closing);
    if (drop)
        jp_next(P);
    return b;
}

static jnode *parse_assign_target(jparser *P, bool with_namespace, const char *extra_end)
{
    jnode *t = jp_tuple(P, true, true, extra_end, false);
    bool ok = t->kind == JN_NAME || t->kind == JN_NSREF;
    if (t->kind == JN_TUPLE) {
        ok = t->n_kids > 0;
        for (size_t i = 0; i < t->n_kids; i++)
            ok = ok && t->kids[i]->kind == JN_NAME;
    }
    if (t->kind == JN_NSREF && !with_namespace)
        ok = false;
    if (!ok)
        jp_parse_fail(P, TD_EFORMAT, t->line, "can't assign to this expression");
    return t;
}

static jnode *parse_for(jparser *P, int line)
{
    jnode *n = jp_nn(P, JN_FOR, line);
    n->target = parse_assign_target(P, false, "in");
    if (!jp_skip_name(P, "in"))
        jp_fail_expected(P, "'in'");
    n->a = jp_tuple(P, false, false, "recursive", false);
    if (jp_skip_name(P, "if"))
        n->b = jp_expression(P, true);
    if (jp_is_name(P, "recursive"))
        jp_parse_fail(P, TD_ENOTSUP, line, "recursive for loops are not supported");
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const ends2[] = {"endfor", NULL};
    P->loops++;
    n->body = parse_statements(P, ends, "for", false);
    P->loops--;
    if (jp_is_name(P, "else")) {
        jp_next(P);
        n->else_ = parse_statements(P, ends2, "for", true);
    } else {
        jp_next(P);
    }
    return n;
}

static jnode *parse_if(jparser *P, int line)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const ends2[] = {"endif", NULL};
    jnode *result = jp_nn(P, JN_IF, line), *node = result;
    for (;;) {
        node->a = jp_tuple(P, false, false, NULL, false);
        node->body = parse_statements(P, ends, "if", false);
        const jtok *t = jp_next(P);
        if (t->n == 4 && !memcmp(t->p, "elif", 4)) {
            jnode *e = jp_nn(P, JN_IF, t->line);
            node->else_.v = jp_palloc(P, sizeof(jnode *));
            node->else_.v[0] = e;
            node->else_.n = 1;
            node = e;
            jp_enter(P);
            continue;
        }
        if (t->n == 4 && !memcmp(t->p, "else", 4))
            node->else_ = parse_statements(P, ends2, "if", true);
        break;
    }
    for (jnode *e = result; e != node; e = e->else_.v[0])
        jp_leave(P);
    return result;
}

static jnode *parse_set(jparser *P, int line)
{
    jnode *target = parse_assign_target(P, true, NULL);
    if (jp_skip_op(P, JOP_ASSIGN)) {
        jnode *n = jp_nn(P, JN_SET, line);
        n->target = target;
        n->a = jp_tuple(P, false, true, NULL, false);
        return n;
    }
    static const char *const ends[] = {"endset", NULL};
    jnode *n = jp_nn(P, JN_SETBLOCK, line);
    n->target = target;
    n->a = jp_filter(P, NULL, false);
    n->body = parse_statements(P, ends, "set", true);
    return n;
}

static jnode *parse_macro(jparser *P, int line)
{
    jnode *n = jp_nn(P, JN_MACRO, line);
    n->name = jp_expect_name(P);
    jp_expect_op(P, JOP_LPAREN);
    nvec params = {0}, defaults = {0};
    while (!jp_is_op(P, JOP_RPAREN)) {
        if (params.n)
            jp_expect_op(P, JOP_COMMA);
        jnode *p = jp_nn(P, JN_NAME, jp_cur(P)->line);
        p->name = jp_expect_name(P);
        if (jp_skip_op(P, JOP_ASSIGN))
            jp_nvec_push(P, &defaults, jp_expression(P, true));
        else if (defaults.n)
            jp_parse_fail(P, TD_EFORMAT, p->line, "non-default argument follows default argument");
        jp_nvec_push(P, &params, p);
    }
    jp_expect_op(P, JOP_RPAREN);
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
    const jtok *t = jp_cur(P);
    if (t->kind != JT_NAME)
        jp_fail_expected(P, "a tag name");
    int line = t->line;
    char tag[32];
    snprintf(tag, sizeof tag, "%.*s", (int)(t->n < 31 ? t->n : 31), t->p);
    jp_next(P);
    jp_enter(P);
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
        n = jp_nn(P, JN_FILTERBLOCK, line);
        n->a = jp_filter(P, NULL, true);
        n->body = parse_statements(P, ends, "filter", true);
    } else if (!strcmp(tag, "with")) {
        static const char *const ends[] = {"endwith", NULL};
        n = jp_nn(P, JN_WITH, line);
        nvec kids = {0};
        while (jp_cur(P)->kind != JT_BLOCK_END) {
            if (kids.n)
                jp_expect_op(P, JOP_COMMA);
            jnode *target = parse_assign_target(P, false, NULL);
            if (target->kind != JN_NAME)
                jp_parse_fail(P, TD_ENOTSUP, line, "with: only plain names can be assigned");
            jp_nvec_push(P, &kids, target);
            jp_expect_op(P, JOP_ASSIGN);
            jp_nvec_push(P, &kids, jp_expression(P, true));
        }
        n->kids = kids.v;
        n->n_kids = kids.n;
        n->body = parse_statements(P, ends, "with", true);
    } else if (!strcmp(tag, "generation")) {
        /* transformers' assistant-mask block: renders as its body */
        static const char *const ends[] = {"endgeneration", NULL};
        n = jp_nn(P, JN_IF, line);
        n->a = jp_nn(P, JN_CONST, line);
        n->a->val = jv_bool(true);
        n->body = parse_statements(P, ends, "generation", true);
    } else if (!strcmp(tag, "print")) {
        n = jp_nn(P, JN_OUTPUT, line);
        n->a = jp_tuple(P, false, true, NULL, false);
    } else if (!strcmp(tag, "break") || !strcmp(tag, "continue")) {
        if (!P->loops)
            jp_parse_fail(P, TD_EFORMAT, line, "'%s' outside of a for loop", tag);
        n = jp_nn(P, tag[0] == 'b' ? JN_BREAK : JN_CONTINUE, line);
    } else if (!strcmp(tag, "extends") || !strcmp(tag, "include") || !strcmp(tag, "import") ||
               !strcmp(tag, "from") || !strcmp(tag, "block") || !strcmp(tag, "call") ||
               !strcmp(tag, "autoescape") || !strcmp(tag, "do") || !strcmp(tag, "trans")) {
        jp_parse_fail(P, TD_ENOTSUP, line, "the '%s' tag is not supported", tag);
    } else {
        jp_parse_fail(P, TD_EFORMAT, line, "unknown tag '%s'", tag);
    }
    jp_leave(P);
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
        const jtok *t = jp_cur(P);
        if (t->kind == JT_EOF) {
            if (end_tags)
                jp_parse_fail(P, TD_EFORMAT, t->line,
                              "unexpected end of template, expected '%s' to close the '%s' block",
                           end_tags[0], closing);
            break;
        }
        if (t->kind == JT_DATA) {
            jnode *d = jp_nn(P, JN_DATA, t->line);
            d->val = jv_strn(t->p, t->n);
            jp_nvec_push(P, &body, d);
            jp_next(P);
        } else if (t->kind == JT_VAR_BEGIN) {
            jp_next(P);
            jnode *o = jp_nn(P, JN_OUTPUT, t->line);
            o->a = jp_tuple(P, false, true, NULL, false);
            jp_expect_kind(P, JT_VAR_END, "end of print statement '}}'");
            jp_nvec_push(P, &body, o);
        } else if (t->kind == JT_BLOCK_BEGIN) {
            jp_next(P);
            if (tag_in(jp_cur(P), end_tags))
                break;
            /* an end tag that closes nothing here: name it rather than "unknown tag" */
            static const char *const closers[] = {"endif", "endfor", "else", "elif", "endset", "endmacro",
                                                  "endfilter", "endwith", "endgeneration", NULL};
            if (tag_in(jp_cur(P), closers)) {
                char buf[96];
                const char *what = jp_describe(jp_cur(P), buf, sizeof buf);
                if (!end_tags)
                    jp_parse_fail(P, TD_EFORMAT, jp_cur(P)->line, "unexpected %s with no block to close", what);
                jp_parse_fail(P, TD_EFORMAT, jp_cur(P)->line, "unexpected %s, expected '%s' to close the '%s' block",
                              what, end_tags[0], closing);
            }
            jp_nvec_push(P, &body, parse_statement(P));
            jp_expect_kind(P, JT_BLOCK_END, "end of statement block '%}'");
        } else {
            char buf[96];
            jp_parse_fail(P, TD_EFORMAT, t->line, "unexpected %s", jp_describe(t, buf, sizeof buf));
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
