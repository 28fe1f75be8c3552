/* Lark grammars into rules (common/gram.h): the notation of Lark's EBNF as vLLM's
 * guided_grammar takes it, read as a language of characters. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gram_int.h"

#define LK_NEST_MAX 100 /* groups inside groups (the parser recurses per group) */
#define LK_NAME_MAX 108 /* bytes of a name (at most 100), with the prefix of an imported one */

/* Lark's `common` library, the terminals `%import common.X` brings, written for a matcher of
 * characters: a string holds no unescaped quote and no newline, a C comment ends at its
 * first star-slash. Its names live under the prefix LK_COMMON. */
#define LK_COMMON "common."
static const char lk_common[] =
    "DIGIT: \"0\"..\"9\"\n"
    "HEXDIGIT: \"a\"..\"f\" | \"A\"..\"F\" | DIGIT\n"
    "INT: DIGIT+\n"
    "SIGNED_INT: [\"+\" | \"-\"] INT\n"
    "DECIMAL: INT \".\" INT? | \".\" INT\n"
    "_EXP: (\"e\" | \"E\") SIGNED_INT\n"
    "FLOAT: INT _EXP | DECIMAL _EXP?\n"
    "SIGNED_FLOAT: [\"+\" | \"-\"] FLOAT\n"
    "NUMBER: FLOAT | INT\n"
    "SIGNED_NUMBER: [\"+\" | \"-\"] NUMBER\n"
    "ESCAPED_STRING: \"\\\"\" (/[^\"\\\\\\n]/ | \"\\\\\" /./)* \"\\\"\"\n"
    "LCASE_LETTER: \"a\"..\"z\"\n"
    "UCASE_LETTER: \"A\"..\"Z\"\n"
    "LETTER: UCASE_LETTER | LCASE_LETTER\n"
    "WORD: LETTER+\n"
    "CNAME: (\"_\" | LETTER) (\"_\" | LETTER | DIGIT)*\n"
    "WS_INLINE: (\" \" | /\\t/)+\n"
    "WS: /[ \\t\\f\\r\\n]/+\n"
    "CR: /\\r/\n"
    "LF: /\\n/\n"
    "NEWLINE: (CR? LF)+\n"
    "SH_COMMENT: /#[^\\n]*/\n"
    "CPP_COMMENT: /\\/\\/[^\\n]*/\n"
    "C_COMMENT: \"/*\" (/[^*]/ | /\\*+[^*\\/]/)* /\\*+\\// \n"
    "SQL_COMMENT: /--[^\\n]*/\n";

#define LK_PARAMS_MAX 16     /* parameters of a template */
#define LK_TEMPLATES_MAX 256 /* templates defined */
#define LK_INSTANCES_MAX 256 /* templates instantiated with different arguments */
#define LK_CANON_MAX 1024    /* arguments kept to be shared by body (more are not shared) */

/* A template, `name{a, b}: body`: its body is read again for every instance, with each
 * parameter's name standing for the instance's argument. */
typedef struct lk_template {
    const char *name, *param[LK_PARAMS_MAX];
    size_t len, param_len[LK_PARAMS_MAX];
    int n_params;
    const char *body; /* after the ':' */
} lk_template;

/* A template used with given arguments (rules), and the rule of that instance. */
typedef struct lk_instance {
    const char *name, *at; /* the name as used, and where (for errors) */
    size_t len;
    int32_t arg[LK_PARAMS_MAX];
    int n_args;
    int32_t rule;
} lk_instance;

typedef struct lk_parser {
    gm_src x;
    const char *prefix; /* put before every name: LK_COMMON while the library is read */
    int32_t first;      /* the first rule defined, the start when there is no `start` */
    int32_t ig, igs;    /* with %ignore: one ignored item, and any run of them; else -1 */
    bool common;        /* the library is read */
    lk_template *tpl;   /* [n_tpl] the templates defined so far */
    lk_instance *inst;  /* [n_inst] the instances used so far, made after the whole text */
    int32_t *canon;     /* [n_canon] arguments that are not one name, each body once */
    int n_tpl, n_inst, n_canon;
    const lk_template *env;   /* the template whose body is read, or NULL */
    const int32_t *env_arg;   /* what its parameters stand for */
} lk_parser;

static bool lk_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_';
}

/* Past the name (letters, digits, '_') at x->p, if any. */
static void lk_skip_name(gm_src *x)
{
    while (x->p < x->end && lk_name_char(*x->p))
        x->p++;
}

/* A terminal's name has an upper-case letter first (after underscores); a rule's lower. */
static bool lk_is_terminal(const char *n, size_t len)
{
    size_t i = 0;
    while (i < len && n[i] == '_')
        i++;
    return i < len && n[i] >= 'A' && n[i] <= 'Z';
}

/* The rule named prefix + n[0..len), made (undefined) when new. */
static td_err lk_named(lk_parser *k, const char *n, size_t len, int32_t *id)
{
    char full[LK_NAME_MAX];
    const size_t pl = strlen(k->prefix);
    if (len > 100 || pl + len >= sizeof full)
        return gm_syntax(&k->x, "a name of more than 100 bytes");
    memcpy(full, k->prefix, pl);
    memcpy(full + pl, n, len);
    return gb_named(k->x.b, full, pl + len, id);
}

/* Spaces, tabs and // comments; newlines too when nl. */
static void lk_space(gm_src *x, bool nl)
{
    while (x->p < x->end) {
        const char c = *x->p;
        if (c == ' ' || c == '\t' || c == '\r' || (nl && c == '\n')) {
            x->p++;
        } else if (c == '/' && x->end - x->p >= 2 && x->p[1] == '/') {
            while (x->p < x->end && *x->p != '\n')
                x->p++;
        } else {
            break;
        }
    }
}

/* At a newline: whether the definition goes on with a '|' on a later line (x->p then at the
 * '|'; unchanged otherwise). */
static bool lk_continues(gm_src *x)
{
    gm_src y = *x;
    lk_space(&y, true);
    if (y.p < y.end && *y.p == '|') {
        x->p = y.p;
        return true;
    }
    return false;
}

/* A string literal after its quote q, into rule; with the flag i, each letter either case. */
static td_err lk_string(lk_parser *k, int32_t rule, char q)
{
    gm_src *x = &k->x;
    const char *s0 = x->p;
    uint32_t cps[2] = {0, 0};
    size_t n = 0;
    while (x->p < x->end && *x->p != q && *x->p != '\n') {
        uint32_t cp;
        TD_TRY(gm_char(x, &cp, NULL));
        if (n < 2)
            cps[n] = cp;
        n++;
    }
    if (x->p >= x->end || *x->p != q)
        return gm_syntax(x, "a string is not closed on its line");
    x->p++;
    const bool fold = x->p < x->end && *x->p == 'i' &&
                      !(x->p + 1 < x->end && lk_name_char(x->p[1]));
    x->p += fold;
    gm_src save = *x;
    lk_space(x, false);
    if (x->end - x->p >= 2 && x->p[0] == '.' && x->p[1] == '.') { /* "a".."z" */
        x->p += 2;
        lk_space(x, false);
        if (x->p >= x->end || (*x->p != '"' && *x->p != '\''))
            return gm_syntax(x, "a range needs a string of one character after '..'");
        const char q2 = *x->p++;
        uint32_t hi;
        TD_TRY(gm_char(x, &hi, NULL));
        if (x->p >= x->end || *x->p != q2 || n != 1)
            return gm_syntax(x, "a range's ends are strings of one character each");
        x->p++;
        gm_ranges r = {.n = 0};
        TD_TRY(gm_range_add(x, &r, cps[0], hi));
        return gm_set_emit(x->b, rule, &r);
    }
    *x = save;
    if (n == 0)
        return gm_syntax(x, "an empty string");
    gm_src y = *x; /* the characters again, now into the rule */
    y.p = s0;
    y.fold = fold;
    while (*y.p != q) {
        uint32_t cp;
        TD_TRY(gm_char(&y, &cp, NULL));
        TD_TRY(gm_char_emit(&y, rule, cp));
    }
    return TD_OK;
}

/* A regular expression after its '/', up to and past its closing '/', into rule. */
static td_err lk_regex(lk_parser *k, int32_t rule, int depth)
{
    gm_src *x = &k->x;
    const char *r0 = x->p;
    bool in_class = false;
    for (; x->p < x->end && *x->p != '\n' && (in_class || *x->p != '/'); x->p++) {
        if (*x->p == '\\' && x->p + 1 < x->end)
            x->p++;
        else if (*x->p == '[')
            in_class = true;
        else if (*x->p == ']')
            in_class = false;
    }
    if (x->p >= x->end || *x->p != '/')
        return gm_syntax(x, "a regular expression is not closed on its line");
    const char *r1 = x->p++;
    if (r1 == r0)
        return gm_syntax(x, "an empty regular expression");
    bool fold = false, dotall = false, verbose = false;
    for (; x->p < x->end && lk_name_char(*x->p); x->p++) { /* Python's; m: nothing here */
        const char f = *x->p;
        if (f == 'l')
            return err_set(TD_ENOTSUP, "grammar: the regular expression flag l is not "
                           "supported (i, m, s, u and x are)");
        if (f != 'i' && f != 'm' && f != 's' && f != 'u' && f != 'x')
            return gm_syntax(x, "a regular expression's flags are among i, m, s, l, u, x");
        fold = fold || f == 'i';
        dotall = dotall || f == 's';
        verbose = verbose || f == 'x';
    }
    gm_build *b = x->b;
    int32_t g;
    TD_TRY(gb_rule(b, NULL, 0, b->owner[rule], &g));
    b->defined[g] = true;
    gm_src y = *x;
    y.p = r0;
    y.end = r1;
    y.regex = true;
    y.fold = fold;
    y.dotall = dotall;
    y.verbose = verbose;
    y.lead = r0;
    TD_TRY(re_alternatives(&y, g, depth + 1));
    if (y.p < y.end)
        return gm_syntax(&y, "unbalanced ')' in a regular expression");
    TD_TRY(gb_push(b, &b->body[g], GM_END, 0, 0));
    return gb_push(b, &b->body[rule], GM_REF, (uint32_t)g, 0);
}

/* The item s->el[start..n) of rule repeated min..max times (max -1: no maximum); in a rule
 * with %ignore, ignored items may stand between the repetitions. */
static td_err lk_repeat(lk_parser *k, int32_t rule, size_t start, long min, long max)
{
    gm_build *b = k->x.b;
    if (k->igs < 0 || max == 0 || max == 1)
        return gb_repeat(b, rule, start, min, max);
    /* group ::= item (igs item){min-1..max-1}, and the rule's item becomes group (or group?
     * when min is 0: then igs item repeats 0..max-1 times) */
    int32_t item, group;
    TD_TRY(gb_rule(b, NULL, 0, b->owner[rule], &item));
    TD_TRY(gb_rule(b, NULL, 0, b->owner[rule], &group));
    b->defined[item] = b->defined[group] = true;
    gm_seq *s = &b->body[rule];
    for (size_t i = start; i < s->n; i++)
        TD_TRY(gb_push(b, &b->body[item], s->el[i].kind, s->el[i].lo, s->el[i].hi));
    b->total -= s->n - start;
    s->n = start;
    TD_TRY(gb_push(b, &b->body[item], GM_END, 0, 0));
    TD_TRY(gb_push(b, &b->body[group], GM_REF, (uint32_t)item, 0));
    const size_t t0 = b->body[group].n;
    TD_TRY(gb_push(b, &b->body[group], GM_REF, (uint32_t)k->igs, 0));
    TD_TRY(gb_push(b, &b->body[group], GM_REF, (uint32_t)item, 0));
    TD_TRY(gb_repeat(b, group, t0, min > 0 ? min - 1 : 0, max < 0 ? -1 : max - 1));
    TD_TRY(gb_push(b, &b->body[group], GM_END, 0, 0));
    TD_TRY(gb_push(b, &b->body[rule], GM_REF, (uint32_t)group, 0));
    return min == 0 ? gb_repeat(b, rule, b->body[rule].n - 1, 0, 1) : TD_OK;
}

/* Decimal digits at x->p (capped at 100000) into *v; false when there are none. */
static bool lk_number(gm_src *x, long *v)
{
    x->p = gm_number(x->p, x->end, v);
    return *v >= 0;
}

/* A quantifier (? * + ~n ~n..m) after the item s->el[start..n) of rule, if one follows. */
static td_err lk_quantifier(lk_parser *k, int32_t rule, size_t start)
{
    gm_src *x = &k->x;
    lk_space(x, false);
    if (x->p >= x->end)
        return TD_OK;
    long min, max;
    if (!gm_star_plus_opt(x, &min, &max)) { /* ~n or ~n..m */
        if (*x->p != '~')
            return TD_OK;
        x->p++;
        lk_space(x, false);
        if (!lk_number(x, &min))
            return gm_syntax(x, "'~' needs a number");
        max = min;
        if (x->end - x->p >= 2 && x->p[0] == '.' && x->p[1] == '.') {
            x->p += 2;
            if (!lk_number(x, &max))
                return gm_syntax(x, "'~ n..' needs a second number");
        }
    }
    if (min > GM_REPEAT_MAX || max > GM_REPEAT_MAX)
        return err_set(TD_ENOTSUP, "a repetition bound above %d", GM_REPEAT_MAX);
    if (max >= 0 && max < min)
        return gm_syntax(x, "a repetition's maximum is below its minimum");
    lk_space(x, false);
    if (x->p < x->end && (*x->p == '*' || *x->p == '+' || *x->p == '?' || *x->p == '~'))
        return gm_syntax(x, "a quantifier after a quantifier");
    return lk_repeat(k, rule, start, min, max);
}

static td_err lk_alternatives(lk_parser *k, int32_t rule, int depth, bool terminal);

/* A group's alternatives after its opening bracket, up to and past the closing one. */
static td_err lk_group(lk_parser *k, int32_t rule, int depth, bool terminal, char close)
{
    gm_src *x = &k->x;
    if (depth >= LK_NEST_MAX)
        return err_set(TD_ENOTSUP, "groups nested deeper than %d", LK_NEST_MAX);
    gm_build *b = x->b;
    int32_t g;
    TD_TRY(gb_rule(b, NULL, 0, b->owner[rule], &g));
    b->defined[g] = true;
    TD_TRY(lk_alternatives(k, g, depth + 1, terminal));
    lk_space(x, true);
    if (x->p >= x->end || *x->p != close)
        return gm_syntax(x, close == ')' ? "expected ')'" : "expected ']'");
    x->p++;
    TD_TRY(gb_push(b, &b->body[g], GM_END, 0, 0));
    return gb_push(b, &b->body[rule], GM_REF, (uint32_t)g, 0);
}

/* Whether n[0..len) is a parameter of the template being read: then *id is its argument. */
static bool lk_param(const lk_parser *k, const char *n, size_t len, int32_t *id)
{
    for (int i = 0; k->env && i < k->env->n_params; i++)
        if (k->env->param_len[i] == len && memcmp(k->env->param[i], n, len) == 0) {
            *id = k->env_arg[i];
            return true;
        }
    return false;
}

/* *v as an array of cap items of size sz, allocated (zeroed) on first use. */
static td_err lk_room(void *v, int cap, size_t sz)
{
    void **p = v;
    if (!*p && !(*p = calloc((size_t)cap, sz)))
        return err_set(TD_ENOMEM, "out of memory for a grammar");
    return TD_OK;
}

/* An argument's rule g as the rule that stands for it: the one it names when that is all it
 * is, else the first argument with the same body, so that a template which uses itself with
 * its own parameters or the same strings has finitely many instances. */
static td_err lk_canonical(lk_parser *k, int32_t g, int32_t *id)
{
    const gm_seq *s = &k->x.b->body[g];
    if (s->n == 2 && s->el[0].kind == GM_REF) {
        *id = (int32_t)s->el[0].lo;
        return TD_OK;
    }
    for (int i = 0; i < k->n_canon; i++) {
        const gm_seq *c = &k->x.b->body[k->canon[i]];
        if (c->n == s->n && memcmp(c->el, s->el, s->n * sizeof *s->el) == 0) {
            *id = k->canon[i];
            return TD_OK;
        }
    }
    *id = g;
    if (k->n_canon == LK_CANON_MAX)
        return TD_OK;
    TD_TRY(lk_room(&k->canon, LK_CANON_MAX, sizeof *k->canon));
    k->canon[k->n_canon++] = g;
    return TD_OK;
}

/* A template's use in rule, name[0..len){args} with x->p past the '{': its instance's rule in
 * *id, made after the whole text is read (the template may be defined below). */
static td_err lk_use(lk_parser *k, int32_t rule, const char *name, size_t len, int depth,
                     int32_t *id)
{
    gm_src *x = &k->x;
    gm_build *b = x->b;
    if (depth >= LK_NEST_MAX)
        return err_set(TD_ENOTSUP, "groups nested deeper than %d", LK_NEST_MAX);
    lk_instance use = {.name = name, .at = name, .len = len};
    for (;;) {
        lk_space(x, true);
        if (use.n_args == LK_PARAMS_MAX)
            return err_set(TD_ENOTSUP, "grammar: a template of more than %d arguments",
                           LK_PARAMS_MAX);
        int32_t g;
        TD_TRY(gb_rule(b, NULL, 0, b->owner[rule], &g));
        b->defined[g] = true;
        TD_TRY(lk_alternatives(k, g, depth + 1, false));
        if (b->body[g].n == 0)
            return gm_syntax(x, "a template's argument is empty");
        TD_TRY(gb_push(b, &b->body[g], GM_END, 0, 0));
        TD_TRY(lk_canonical(k, g, &use.arg[use.n_args++]));
        lk_space(x, true);
        if (x->p < x->end && *x->p == ',') {
            x->p++;
            continue;
        }
        if (x->p < x->end && *x->p == '}') {
            x->p++;
            break;
        }
        return gm_syntax(x, "expected ',' or '}'");
    }
    for (int i = 0; i < k->n_inst; i++) {
        const lk_instance *u = &k->inst[i];
        if (u->len == len && memcmp(u->name, name, len) == 0 && u->n_args == use.n_args &&
            memcmp(u->arg, use.arg, (size_t)use.n_args * sizeof *use.arg) == 0) {
            *id = u->rule;
            return TD_OK;
        }
    }
    if (k->n_inst == LK_INSTANCES_MAX)
        return err_set(TD_ENOTSUP, "grammar: templates used with more than %d different "
                       "arguments", LK_INSTANCES_MAX);
    TD_TRY(lk_room(&k->inst, LK_INSTANCES_MAX, sizeof *k->inst));
    TD_TRY(gb_rule(b, NULL, 0, b->owner[rule], &use.rule));
    b->defined[use.rule] = true;
    k->inst[k->n_inst++] = use;
    *id = use.rule;
    return TD_OK;
}

/* One alternative: items up to a '|', a closing bracket, an alias, or the line's end. */
static td_err lk_sequence(lk_parser *k, int32_t rule, int depth, bool terminal)
{
    gm_src *x = &k->x;
    gm_build *b = x->b;
    for (bool first = true;; first = false) {
        lk_space(x, depth > 0);
        if (x->p >= x->end)
            return TD_OK;
        const char c = *x->p;
        const bool item = c == '"' || c == '\'' || c == '/' || c == '(' || c == '[' ||
                          lk_name_char(c);
        if (!item) {
            if (c == '-' && x->end - x->p >= 2 && x->p[1] == '>') { /* -> alias: a tree's */
                x->p += 2;
                lk_space(x, false);
                const char *a0 = x->p;
                lk_skip_name(x);
                if (x->p == a0)
                    return gm_syntax(x, "'->' needs a name");
                lk_space(x, depth > 0);
            } else if (c == '*' || c == '+' || c == '?' || c == '~') {
                return gm_syntax(x, "a quantifier with nothing before it to repeat");
            }
            return TD_OK; /* '|', ')', ']', a newline: the caller's */
        }
        if (!first && !terminal && k->igs >= 0)
            TD_TRY(gb_push(b, &b->body[rule], GM_REF, (uint32_t)k->igs, 0));
        const size_t start = b->body[rule].n;
        if (c == '"' || c == '\'') {
            x->p++;
            TD_TRY(lk_string(k, rule, c));
        } else if (c == '/') {
            x->p++;
            TD_TRY(lk_regex(k, rule, depth));
        } else if (c == '(' || c == '[') {
            x->p++;
            TD_TRY(lk_group(k, rule, depth, terminal, c == '(' ? ')' : ']'));
            if (c == '[')
                TD_TRY(gb_repeat(b, rule, start, 0, 1));
        } else {
            const char *n0 = x->p;
            lk_skip_name(x);
            const char *n1 = x->p;
            lk_space(x, false);
            if (x->p < x->end && (*x->p == ':' || *x->p == '.')) {
                x->p = n0;
                return gm_syntax(x, "a definition begins before the line of the one before "
                                 "ends");
            }
            const bool use = x->p < x->end && *x->p == '{';
            x->p = use ? x->p + 1 : n1;
            if (terminal && (use || !lk_is_terminal(n0, (size_t)(n1 - n0)))) {
                x->p = n0;
                return gm_syntax(x, "a terminal can only use strings, regular expressions "
                                 "and terminals, not a rule");
            }
            int32_t r;
            if (use)
                TD_TRY(lk_use(k, rule, n0, (size_t)(n1 - n0), depth, &r));
            else if (!lk_param(k, n0, (size_t)(n1 - n0), &r))
                TD_TRY(lk_named(k, n0, (size_t)(n1 - n0), &r));
            TD_TRY(gb_push(b, &b->body[rule], GM_REF, (uint32_t)r, 0));
        }
        TD_TRY(lk_quantifier(k, rule, start));
    }
}

static td_err lk_alternatives(lk_parser *k, int32_t rule, int depth, bool terminal)
{
    gm_src *x = &k->x;
    TD_TRY(lk_sequence(k, rule, depth, terminal));
    for (;;) {
        if (depth == 0 && x->p < x->end && *x->p == '\n' && !lk_continues(x))
            return TD_OK;
        if (x->p >= x->end || *x->p != '|')
            return TD_OK;
        x->p++;
        TD_TRY(gb_push(x->b, &x->b->body[rule], GM_ALT, 0, 0));
        TD_TRY(lk_sequence(k, rule, depth, terminal));
    }
}

static td_err lk_read(lk_parser *k);

/* %import common.NAME [-> ALIAS] or %import common (NAME, ...): each name a terminal of the
 * library, under its own name or the alias. */
static td_err lk_import(lk_parser *k)
{
    gm_src *x = &k->x;
    lk_space(x, false);
    if (x->end - x->p < 6 || memcmp(x->p, "common", 6) != 0 ||
        (x->p + 6 < x->end && lk_name_char(x->p[6])))
        return err_set(TD_ENOTSUP, "grammar: only Lark's `common` library can be imported");
    x->p += 6;
    if (!k->common) { /* the library, once, under its prefix */
        lk_parser lib = {.x = {.s = lk_common, .p = lk_common,
                               .end = lk_common + sizeof lk_common - 1, .b = x->b,
                               .lark = true},
                         .prefix = LK_COMMON, .first = -1, .ig = -1, .igs = -1};
        const td_err e = lk_read(&lib);
        TD_ASSERT(e == TD_OK || e == TD_ENOMEM || e == TD_ENOTSUP);
        TD_TRY(e);
        k->common = true;
    }
    const bool list = x->p < x->end && (*x->p == ' ' || *x->p == '(');
    lk_space(x, false);
    if (list && (x->p >= x->end || *x->p != '('))
        return gm_syntax(x, "expected '.NAME' or '(NAME, ...)' after %import common");
    if (!list && (x->p >= x->end || *x->p != '.'))
        return gm_syntax(x, "expected '.NAME' or '(NAME, ...)' after %import common");
    x->p++;
    for (;;) {
        lk_space(x, list);
        const char *n0 = x->p;
        lk_skip_name(x);
        const char *n1 = x->p;
        if (n1 == n0)
            return gm_syntax(x, "expected a name to import");
        char full[LK_NAME_MAX];
        const int fl = snprintf(full, sizeof full, LK_COMMON "%.*s", (int)(n1 - n0), n0);
        const int32_t from = fl < (int)sizeof full ? gb_find(x->b, full, (size_t)fl) : -1;
        if (from < 0 || !x->b->defined[from]) {
            x->p = n0;
            return gm_syntax(x, "Lark's common library has no such terminal");
        }
        const char *a0 = n0, *a1 = n1;
        lk_space(x, list);
        if (x->end - x->p >= 2 && x->p[0] == '-' && x->p[1] == '>') {
            x->p += 2;
            lk_space(x, list);
            a0 = x->p;
            lk_skip_name(x);
            a1 = x->p;
            if (a1 == a0)
                return gm_syntax(x, "'->' needs a name");
            lk_space(x, list);
        }
        int32_t to;
        TD_TRY(lk_named(k, a0, (size_t)(a1 - a0), &to));
        if (x->b->defined[to]) {
            x->p = a0;
            return gm_syntax(x, "the name is defined twice");
        }
        x->b->defined[to] = true;
        TD_TRY(gb_push(x->b, &x->b->body[to], GM_REF, (uint32_t)from, 0));
        TD_TRY(gb_push(x->b, &x->b->body[to], GM_END, 0, 0));
        if (!list)
            return TD_OK;
        if (x->p < x->end && *x->p == ',') {
            x->p++;
            continue;
        }
        if (x->p < x->end && *x->p == ')') {
            x->p++;
            return TD_OK;
        }
        return gm_syntax(x, "expected ',' or ')'");
    }
}

/* %override NAME: alternatives (the definition replaced) or, with extend, %extend NAME:
 * alternatives (more of them); NAME defined above, x->p after the directive. */
static td_err lk_redefine(lk_parser *k, bool extend)
{
    gm_src *x = &k->x;
    gm_build *b = x->b;
    lk_space(x, false);
    x->p += x->p < x->end && (*x->p == '?' || *x->p == '!');
    const char *n0 = x->p;
    lk_skip_name(x);
    const size_t len = (size_t)(x->p - n0);
    if (len == 0)
        return gm_syntax(x, "expected the name of a rule or terminal");
    lk_space(x, false);
    if (x->p >= x->end || *x->p != ':')
        return gm_syntax(x, "expected ':'");
    x->p++;
    int32_t r;
    TD_TRY(lk_named(k, n0, len, &r));
    if (!b->defined[r]) {
        x->p = n0;
        return gm_syntax(x, extend ? "%extend needs a definition above it"
                                   : "%override needs a definition above it");
    }
    gm_seq *body = &b->body[r];
    const size_t keep = extend ? body->n - 1 : 0; /* without its end */
    b->total -= body->n - keep;
    body->n = keep;
    if (extend)
        TD_TRY(gb_push(b, body, GM_ALT, 0, 0));
    TD_TRY(lk_alternatives(k, r, 0, lk_is_terminal(n0, len)));
    return gb_push(b, &b->body[r], GM_END, 0, 0);
}

/* A line that begins with '%' (x->p there). */
static td_err lk_directive(lk_parser *k)
{
    gm_src *x = &k->x;
    const char *d0 = ++x->p;
    lk_skip_name(x);
    const size_t n = (size_t)(x->p - d0);
    if (n == 6 && memcmp(d0, "import", 6) == 0)
        return lk_import(k);
    if (n == 6 && memcmp(d0, "ignore", 6) == 0) { /* one more alternative of ig */
        gm_build *b = x->b;
        if (k->ig < 0)
            return gm_syntax(x, "%ignore must begin its line");
        if (b->body[k->ig].n)
            TD_TRY(gb_push(b, &b->body[k->ig], GM_ALT, 0, 0));
        const size_t at = b->body[k->ig].n;
        lk_space(x, false);
        TD_TRY(lk_alternatives(k, k->ig, 0, true));
        if (b->body[k->ig].n == at)
            return gm_syntax(x, "%ignore needs what to ignore");
        return TD_OK;
    }
    if ((n == 8 && memcmp(d0, "override", 8) == 0) || (n == 6 && memcmp(d0, "extend", 6) == 0))
        return lk_redefine(k, n == 6);
    x->p = d0 - 1;
    return err_set(TD_ENOTSUP, "grammar: the directive %%%.*s is not supported (%%import "
                   "common, %%ignore, %%override and %%extend are)", (int)n, d0);
}

/* A template's definition, name[0..len){params}: body with x->p at the '{': recorded, and its
 * body read once with every parameter standing for any character, for its errors and its
 * end (what that reading made is dropped). */
static td_err lk_template_define(lk_parser *k, const char *name, size_t len)
{
    gm_src *x = &k->x;
    gm_build *b = x->b;
    for (int i = 0; i < k->n_tpl; i++)
        if (k->tpl[i].len == len && memcmp(k->tpl[i].name, name, len) == 0) {
            x->p = name;
            return gm_syntax(x, "the template is defined twice");
        }
    lk_template t = {.name = name, .len = len};
    x->p++;
    for (;;) {
        lk_space(x, false);
        const char *p0 = x->p;
        lk_skip_name(x);
        if (x->p == p0)
            return gm_syntax(x, "expected a parameter's name");
        if (t.n_params == LK_PARAMS_MAX)
            return err_set(TD_ENOTSUP, "grammar: a template of more than %d parameters",
                           LK_PARAMS_MAX);
        t.param[t.n_params] = p0;
        t.param_len[t.n_params++] = (size_t)(x->p - p0);
        lk_space(x, false);
        if (x->p < x->end && *x->p == ',') {
            x->p++;
            continue;
        }
        if (x->p < x->end && *x->p == '}')
            break;
        return gm_syntax(x, "expected ',' or '}'");
    }
    x->p++;
    lk_space(x, false);
    if (x->p >= x->end || *x->p != ':')
        return gm_syntax(x, "expected ':'");
    t.body = ++x->p;
    if (k->n_tpl == LK_TEMPLATES_MAX)
        return err_set(TD_ENOTSUP, "grammar: more than %d templates", LK_TEMPLATES_MAX);
    TD_TRY(lk_room(&k->tpl, LK_TEMPLATES_MAX, sizeof *k->tpl));
    k->tpl[k->n_tpl++] = t;
    const int32_t n_rules = b->n_rules;
    const int n_inst = k->n_inst, n_canon = k->n_canon;
    int32_t any, body;
    td_err e = gb_rule(b, NULL, 0, -1, &any);
    if (e == TD_OK)
        e = gb_push(b, &b->body[any], GM_CHAR, 0, GM_CP_MAX);
    if (e == TD_OK)
        e = gb_push(b, &b->body[any], GM_END, 0, 0);
    if (e == TD_OK)
        e = gb_rule(b, NULL, 0, -1, &body);
    int32_t args[LK_PARAMS_MAX];
    for (int i = 0; i < t.n_params; i++)
        args[i] = any;
    const lk_template *env = k->env;
    const int32_t *env_arg = k->env_arg;
    k->env = &t;
    k->env_arg = args;
    if (e == TD_OK)
        e = lk_alternatives(k, body, 0, false);
    k->env = env;
    k->env_arg = env_arg;
    gb_truncate(b, n_rules);
    k->n_inst = n_inst;
    k->n_canon = n_canon;
    return e;
}

/* The rules of every instance used, in turn (an instance's body may use more). */
static td_err lk_instantiate(lk_parser *k)
{
    gm_src *x = &k->x;
    for (int i = 0; i < k->n_inst; i++) {
        const lk_instance u = k->inst[i]; /* a copy: reading the body may grow k->inst */
        const lk_template *t = NULL;
        for (int j = 0; j < k->n_tpl && !t; j++)
            if (k->tpl[j].len == u.len && memcmp(k->tpl[j].name, u.name, u.len) == 0)
                t = &k->tpl[j];
        x->p = u.at;
        if (!t)
            return gm_syntax(x, "no template of this name is defined");
        if (t->n_params != u.n_args)
            return gm_syntax(x, "the template is used with another number of arguments than "
                             "it has parameters");
        k->env = t; /* k->tpl no longer grows */
        k->env_arg = u.arg;
        x->p = t->body;
        const td_err e = lk_alternatives(k, u.rule, 0, false);
        k->env = NULL;
        k->env_arg = NULL;
        TD_TRY(e);
        TD_TRY(gb_push(x->b, &x->b->body[u.rule], GM_END, 0, 0));
    }
    x->p = x->end;
    return TD_OK;
}

/* A definition of the rule or terminal n[0..len), x->p after its name (and priority). */
static td_err lk_define(lk_parser *k, const char *n, size_t len)
{
    gm_src *x = &k->x;
    gm_build *b = x->b;
    if (x->p >= x->end || *x->p != ':')
        return gm_syntax(x, "expected ':'");
    x->p++;
    int32_t r;
    TD_TRY(lk_named(k, n, len, &r));
    if (b->defined[r]) {
        x->p = n;
        return gm_syntax(x, "the name is defined twice");
    }
    b->defined[r] = true;
    k->first = k->first < 0 ? r : k->first;
    TD_TRY(lk_alternatives(k, r, 0, lk_is_terminal(n, len)));
    return gb_push(b, &b->body[r], GM_END, 0, 0);
}

/* Definitions and directives, one per line, to the end of the text. */
static td_err lk_read(lk_parser *k)
{
    gm_src *x = &k->x;
    for (lk_space(x, true); x->p < x->end; lk_space(x, true)) {
        if (*x->p == '%') {
            TD_TRY(lk_directive(k));
        } else {
            const char *n0 = x->p + (*x->p == '?' || *x->p == '!'); /* tree shaping */
            x->p = n0;
            lk_skip_name(x);
            const char *n1 = x->p;
            if (n1 == n0)
                return gm_syntax(x, "expected a rule or terminal name");
            long prio;
            if (x->p < x->end && *x->p == '.') { /* a priority: it orders a lexer's choices */
                x->p++;
                if (x->p < x->end && *x->p == '-')
                    x->p++;
                if (!lk_number(x, &prio))
                    return gm_syntax(x, "a priority needs a number");
            }
            lk_space(x, false);
            if (x->p < x->end && *x->p == '{')
                TD_TRY(lk_template_define(k, n0, (size_t)(n1 - n0)));
            else
                TD_TRY(lk_define(k, n0, (size_t)(n1 - n0)));
        }
        lk_space(x, false);
        if (x->p < x->end && *x->p != '\n')
            return gm_syntax(x, *x->p == ')' || *x->p == ']' ? "unbalanced bracket"
                                                               : "unexpected character");
    }
    return TD_OK;
}

/* Whether the text has a line that begins with %ignore. */
static bool lk_has_ignore(const char *t, size_t len)
{
    for (const char *p = t, *end = t + len; p < end;) {
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\r'))
            p++;
        if (end - p >= 7 && memcmp(p, "%ignore", 7) == 0)
            return true;
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        p = nl ? nl + 1 : end;
    }
    return false;
}

td_err gm_compile_lark(const char *text, size_t len, gm_grammar **out)
{
    *out = NULL;
    gm_build b = {0};
    lk_parser k = {.x = {.s = text, .p = text, .end = text + len, .b = &b, .lark = true},
                   .prefix = "", .first = -1, .ig = -1, .igs = -1};
    int32_t root = -1;
    td_err e = gb_rule(&b, NULL, 0, -1, &root);
    if (e == TD_OK)
        b.defined[root] = true;
    if (e == TD_OK && lk_has_ignore(text, len)) { /* igs ::= ig igs | (nothing) */
        e = gb_rule(&b, NULL, 0, -1, &k.ig);
        if (e == TD_OK)
            e = gb_rule(&b, NULL, 0, -1, &k.igs);
        if (e == TD_OK) {
            b.defined[k.ig] = b.defined[k.igs] = true;
            const gm_el igs[] = {{GM_REF, (uint32_t)k.ig, 0}, {GM_REF, (uint32_t)k.igs, 0},
                                 {GM_ALT, 0, 0}, {GM_END, 0, 0}};
            for (size_t i = 0; i < 4 && e == TD_OK; i++)
                e = gb_push(&b, &b.body[k.igs], igs[i].kind, igs[i].lo, igs[i].hi);
        }
    }
    if (e == TD_OK)
        e = lk_read(&k);
    if (e == TD_OK)
        e = lk_instantiate(&k);
    free(k.tpl);
    free(k.inst);
    free(k.canon);
    if (e == TD_OK && k.ig >= 0)
        e = gb_push(&b, &b.body[k.ig], GM_END, 0, 0);
    int32_t start = k.first;
    for (int32_t r = 0; e == TD_OK && r < b.n_rules; r++) {
        if (b.name[r] && !b.defined[r])
            e = err_set(TD_EINVAL, "grammar: '%s' is used but not defined", b.name[r]);
        else if (b.name[r] && strcmp(b.name[r], "start") == 0)
            start = r;
    }
    if (e == TD_OK && start < 0)
        e = err_set(TD_EINVAL, "grammar: no rule");
    /* root ::= igs start igs: what %ignore ignores may also open and close the text */
    if (e == TD_OK && k.igs >= 0)
        e = gb_push(&b, &b.body[root], GM_REF, (uint32_t)k.igs, 0);
    if (e == TD_OK)
        e = gb_push(&b, &b.body[root], GM_REF, (uint32_t)start, 0);
    if (e == TD_OK && k.igs >= 0)
        e = gb_push(&b, &b.body[root], GM_REF, (uint32_t)k.igs, 0);
    if (e == TD_OK)
        e = gb_push(&b, &b.body[root], GM_END, 0, 0);
    return gm_finish(e, &b, root, "grammar", out);
}

/* GBNF when a line begins with a name and '::=', else Lark. */
td_err gm_compile_grammar(const char *text, size_t len, gm_grammar **out)
{
    for (const char *p = text, *end = text + len; p < end;) {
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        const char *n0 = p;
        while (p < end && (lk_name_char(*p) || *p == '-'))
            p++;
        const bool named = p > n0;
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        if (named && end - p >= 3 && memcmp(p, "::=", 3) == 0)
            return gm_compile_gbnf(text, len, out);
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        p = nl ? nl + 1 : end;
    }
    return gm_compile_lark(text, len, out);
}
