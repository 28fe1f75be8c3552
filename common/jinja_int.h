/* Internals of the Jinja interpreter (common/jinja.h), shared by its files:
 *   jinja_lex.c     source -> tokens (whitespace control, trim_blocks, lstrip_blocks)
 *   jinja_parse.c   tokens -> tree: statements (jinja2's grammar)
 *   jinja_parse_expr.c  expressions (jinja2's operator precedence)
 *   jinja_value.c   arena, strings (UTF-8 by code point), lists, dicts, JSON -> values
 *   jinja_format.c  Python str()/repr(), json.dumps, float repr
 *   jinja_ops.c     operators, comparison, attribute and item access
 *   jinja_eval.c    statements and expressions
 *   jinja_filters.c filters
 *   jinja_tests.c   tests (is defined, is mapping ...)
 *   jinja_methods.c str/dict/list methods, loop attributes and global functions
 *
 * Everything a render creates lives in one arena freed at the end, and a runtime error unwinds
 * with longjmp to jinja_render: a template can fail at almost any operation, and checking a
 * return code after each of them would bury the semantics this code exists to pin down. */
#ifndef TANDEM_COMMON_JINJA_INT_H
#define TANDEM_COMMON_JINJA_INT_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/jinja.h"

/* ---- arena --------------------------------------------------------------------------- */

typedef struct jarena_chunk jarena_chunk;

typedef struct jarena {
    jarena_chunk *head;
    size_t used;  /* bytes handed out, counted against limit */
    size_t limit; /* bytes */
} jarena;

/* 16-byte aligned, zeroed; NULL when the limit would be passed (or malloc fails). */
void *jarena_alloc(jarena *a, size_t n);
void jarena_free(jarena *a);

/* ---- values ---------------------------------------------------------------------------- */

typedef enum jv_kind {
    JV_UNDEF,   /* Jinja Undefined; s holds the message a use of it fails with ("" = none) */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,    /* list, or tuple when flags has JV_F_TUPLE */
    JV_DICT,    /* string keys, insertion order */
    JV_NS,      /* namespace(): a mutable dict read and written by attribute */
    JV_MACRO,
    JV_LOOP,    /* the `loop` variable of a for loop */
    JV_FUNC,    /* a global function; id is a jfunc_id */
    JV_METHOD,  /* a bound method; id is a jmeth_id, recv the receiver */
    JV_MISSING, /* internal: an argument not given */
} jv_kind;

enum {
    JV_F_MARKUP = 1, /* JV_STR: markupsafe.Markup (from |safe, |escape) */
    JV_F_TUPLE = 2,  /* JV_LIST: a tuple */
};

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jmacro jmacro;
typedef struct jloop jloop;

typedef struct jv {
    uint8_t kind;  /* jv_kind */
    uint8_t flags; /* JV_F_* */
    uint16_t id;   /* JV_FUNC: jfunc_id; JV_METHOD: jmeth_id */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p; /* UTF-8, not NUL-terminated */
            size_t n;      /* bytes */
        } s;
        jlist *l;
        jdict *d;
        jmacro *m;
        jloop *loop;
        struct jv *recv; /* JV_METHOD */
    };
} jv;

struct jlist {
    size_t n;   /* items */
    size_t cap; /* items allocated */
    jv *v;      /* [cap] */
};

typedef struct jdict_ent {
    const char *k; /* key, UTF-8 */
    size_t kn;     /* key bytes */
    jv v;
} jdict_ent;

struct jdict {
    size_t n;         /* entries */
    size_t cap;       /* entries allocated */
    jdict_ent *e;     /* [cap], insertion order */
    uint32_t *index;  /* open-addressing hash of entry numbers + 1 (0 = empty), or NULL while small */
    size_t index_cap; /* slots, a power of two */
};

/* ---- tokens and tree ------------------------------------------------------------------- */

typedef enum jtok_kind {
    JT_EOF,
    JT_DATA,        /* template text */
    JT_VAR_BEGIN,   /* {{ */
    JT_VAR_END,     /* }} */
    JT_BLOCK_BEGIN, /* {% */
    JT_BLOCK_END,   /* %} */
    JT_NAME,
    JT_STRING,      /* escapes decoded */
    JT_INT,
    JT_FLOAT,
    JT_OP,          /* op holds the jop */
} jtok_kind;

typedef enum jop {
    JOP_ADD, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_TILDE,
    JOP_LBRACKET, JOP_RBRACKET, JOP_LPAREN, JOP_RPAREN, JOP_LBRACE, JOP_RBRACE,
    JOP_EQ, JOP_NE, JOP_GT, JOP_GE, JOP_LT, JOP_LE, JOP_ASSIGN, JOP_DOT, JOP_COLON,
    JOP_PIPE, JOP_COMMA, JOP_SEMICOLON,
    /* compare-only operators, used in the tree */
    JOP_IN, JOP_NOTIN,
} jop;

typedef struct jtok {
    uint8_t kind; /* jtok_kind */
    uint8_t op;   /* JT_OP: jop */
    int line;     /* 1-based */
    const char *p; /* JT_DATA, JT_NAME, JT_STRING: text (in the source or the tree's arena) */
    size_t n;      /* bytes */
    int64_t i;     /* JT_INT */
    double f;      /* JT_FLOAT */
} jtok;

/* Splits src into tokens (allocated in a, *out[*n_out], the last one JT_EOF). On a syntax
 * error returns TD_EFORMAT with "template line N: ..." in err_msg(). */
td_err jinja_lex(jarena *a, const char *src, size_t len, jtok **out, size_t *n_out);

typedef enum jn_kind {
    /* expressions */
    JN_CONST,     /* val */
    JN_NAME,      /* name */
    JN_GETATTR,   /* a.name */
    JN_GETITEM,   /* a[b] */
    JN_SLICE,     /* [a:b:c], each may be NULL */
    JN_CALL,      /* a(args) */
    JN_FILTER,    /* a | fn(args); a is NULL in a filter block */
    JN_TEST,      /* a is fn(args) */
    JN_NOT,       /* not a */
    JN_NEG,       /* -a */
    JN_POS,       /* +a */
    JN_BINOP,     /* a op b, op a jop */
    JN_AND,
    JN_OR,
    JN_CONCAT,    /* kids joined with ~ */
    JN_COMPARE,   /* a, then (ops[i], kids[i]) */
    JN_CONDEXPR,  /* b if a else c (c may be NULL) */
    JN_LIST,      /* kids */
    JN_TUPLE,     /* kids */
    JN_DICT,      /* kids: key, value, key, value ... */
    JN_NSREF,     /* assignment target name.attr: name, attr */
    /* statements */
    JN_DATA,      /* val: text */
    JN_OUTPUT,    /* {{ a }} */
    JN_IF,        /* if a: body else: else_ (an elif is an IF inside else_) */
    JN_FOR,       /* for target in a [if b]: body else: else_ */
    JN_SET,       /* set target = a */
    JN_SETBLOCK,  /* set target [| filters in a]: body */
    JN_MACRO,     /* name(args): body */
    JN_FILTERBLOCK, /* filter a: body */
    JN_WITH,      /* with kids (target, value pairs): body */
    JN_BREAK,
    JN_CONTINUE,
} jn_kind;

typedef struct jnode jnode;

/* Arguments of a call, filter or test; or a macro's parameters (pos: NAME nodes, kw_val
 * unused, defaults: the trailing parameters' default expressions). */
typedef struct jargs {
    jnode **pos;         /* [n_pos] */
    size_t n_pos;
    const char **kw;     /* [n_kw] keyword names, NUL-terminated */
    jnode **kw_val;      /* [n_kw] */
    size_t n_kw;
    jnode *star;         /* *args, or NULL */
    jnode *dstar;        /* **kwargs, or NULL */
} jargs;

typedef struct jbody {
    jnode **v; /* [n] statements */
    size_t n;
} jbody;

struct jnode {
    uint8_t kind;       /* jn_kind */
    uint8_t op;         /* JN_BINOP: jop */
    uint16_t fn;        /* JN_FILTER / JN_TEST: index in the filter / test table */
    int line;           /* 1-based */
    jv val;             /* JN_CONST, JN_DATA */
    const char *name;   /* JN_NAME, JN_GETATTR, JN_NSREF (the namespace), JN_MACRO; NUL-terminated */
    const char *attr;   /* JN_NSREF */
    jnode *a, *b, *c;   /* operands, see jn_kind */
    jnode *target;      /* JN_FOR, JN_SET, JN_SETBLOCK: NAME, NSREF or TUPLE of NAMEs */
    jnode **kids;       /* [n_kids] */
    size_t n_kids;
    uint8_t *ops;       /* JN_COMPARE: [n_kids] jop */
    jargs args;         /* JN_CALL, JN_FILTER, JN_TEST, JN_MACRO (parameters) */
    jbody body, else_;  /* statements */
    bool uses_varargs;  /* JN_MACRO: the body reads `varargs` (extra positional arguments) */
    bool uses_kwargs;   /* JN_MACRO: the body reads `kwargs` (extra keyword arguments) */
};

struct jinja_tmpl {
    jarena arena; /* tokens, tree, decoded strings */
    jbody body;
};

/* Parses tokens into t->body. Errors as jinja_lex. */
td_err jinja_parse(jinja_tmpl *t, const jtok *toks, size_t n_toks);

/* ---- parser (jinja_parse.c: statements and helpers, jinja_parse_expr.c: expressions) ---- */

#define PARSE_MAX_DEPTH 200 /* nesting of expressions and statements */

typedef struct jparser {
    jinja_tmpl *t;
    const jtok *tok; /* [n] */
    size_t n, i;     /* tokens, current token */
    int depth;       /* expression and statement nesting */
    int loops;       /* enclosing for loops (of the current macro body) */
    jnode *macro;    /* innermost macro being parsed, or NULL */
    jmp_buf jb;      /* jinja_parse's recovery point */
    td_err code;
} jparser;

/* Growable node list in the template's arena. */
typedef struct nvec {
    jnode **v; /* [cap] */
    size_t n, cap;
} nvec;

/* Fails the parse with "template line N: ..." and unwinds to jinja_parse. */
_Noreturn void jp_parse_fail(jparser *P, td_err code, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
_Noreturn void jp_fail_expected(jparser *P, const char *what);
void *jp_palloc(jparser *P, size_t n);
const jtok *jp_cur(jparser *P);
const jtok *jp_peek(jparser *P);
const jtok *jp_next(jparser *P);
const char *jp_describe(const jtok *t, char *buf, size_t cap);
bool jp_is_op(jparser *P, jop op);
bool jp_is_name(jparser *P, const char *name);
bool jp_skip_op(jparser *P, jop op);
bool jp_skip_name(jparser *P, const char *name);
void jp_expect_op(jparser *P, jop op);
void jp_expect_kind(jparser *P, jtok_kind k, const char *what);
const char *jp_expect_name(jparser *P);
jnode *jp_nn(jparser *P, jn_kind kind, int line);
void jp_nvec_push(jparser *P, nvec *v, jnode *x);
void jp_enter(jparser *P); /* one nesting level deeper, failing past PARSE_MAX_DEPTH */
void jp_leave(jparser *P);

/* Expressions, as jinja2's Parser methods of the same names. */
jnode *jp_expression(jparser *P, bool with_condexpr);
jnode *jp_tuple(jparser *P, bool simplified, bool with_condexpr, const char *extra_end, bool explicit_parens);
jnode *jp_primary(jparser *P, bool with_namespace);
jnode *jp_postfix(jparser *P, jnode *node);
/* "|name(args)" chains; node is NULL for a filter block or set block. */
jnode *jp_filter(jparser *P, jnode *node, bool start_inline);

/* Filter and test tables: index by name, -1 when unknown. */
int jinja_filter_find(const char *name);
int jinja_test_find(const char *name);

/* ---- evaluation ------------------------------------------------------------------------ */

typedef struct jscope jscope;
struct jscope {
    jscope *parent; /* NULL above the template's top level */
    jdict vars;
};

struct jmacro {
    const jnode *node; /* JN_MACRO */
    jscope *closure;   /* where it was defined */
};

struct jloop {
    const jv *items; /* [n] the (filtered) sequence */
    size_t n;
    size_t i;        /* current index0 */
    jv changed_last; /* loop.changed(): the last arguments seen, JV_MISSING at first */
};

/* Growable byte buffer in the arena. */
typedef struct jbuf {
    char *p;
    size_t n;   /* bytes used */
    size_t cap; /* bytes allocated */
} jbuf;

typedef struct jev {
    jarena arena;
    jmp_buf jb;            /* jinja_render's recovery point */
    jinja_limits lim;
    jbuf *out;             /* the buffer output goes to (a macro call swaps it) */
    jbuf main_out;
    uint64_t steps;        /* work done, against lim.max_steps */
    uint32_t depth;        /* nested macro calls */
    uint32_t nest;         /* nested eval/exec calls: bounds the C stack */
    int line;              /* template line being executed */
    jdict globals;         /* the render variables */
    jscope *root;          /* template top level */
    td_err code;           /* the failure being unwound */
} jev;

/* Fails the render: records the message and unwinds to jinja_render. */
_Noreturn void jev_fail(jev *ev, td_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Fails with the message of an undefined value (UndefinedError). */
_Noreturn void jev_fail_undef(jev *ev, jv u);
void *jev_alloc(jev *ev, size_t n);
/* Charges the work of scanning n bytes (or one step when n is 0) against max_steps. */
void jev_charge(jev *ev, size_t n);

/* Values: constructors */
static inline jv jv_none(void) { jv v = {.kind = JV_NONE}; return v; }
static inline jv jv_missing(void) { jv v = {.kind = JV_MISSING}; return v; }
static inline jv jv_bool(bool b) { jv v = {.kind = JV_BOOL}; v.b = b; return v; }
static inline jv jv_int(int64_t i) { jv v = {.kind = JV_INT}; v.i = i; return v; }
static inline jv jv_float(double f) { jv v = {.kind = JV_FLOAT}; v.f = f; return v; }
static inline jv jv_strn(const char *p, size_t n) { jv v = {.kind = JV_STR}; v.s.p = p; v.s.n = n; return v; }
jv jv_str(const char *cstr);
/* An Undefined whose use fails with the printf-formatted message. */
jv jv_undef(jev *ev, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Copies n bytes into the arena. */
jv jv_str_copy(jev *ev, const char *p, size_t n);
jv jv_list_new(jev *ev, size_t cap);
void jv_list_push(jev *ev, jv list, jv item);
jv jv_dict_new(jev *ev);
void jdict_set(jev *ev, jdict *d, const char *k, size_t kn, jv v);
jv *jdict_get(const jdict *d, const char *k, size_t kn);
/* Converts a JSON value (strings are borrowed, not copied). */
jv jv_from_json(jev *ev, const json_t *j, uint32_t depth);

/* memcpy that allows n == 0 with NULL pointers (an empty list has no storage). */
static inline void jmemcpy(void *dst, const void *src, size_t n)
{
    if (n)
        memcpy(dst, src, n);
}

/* Buffers */
void jbuf_put(jev *ev, jbuf *b, const char *p, size_t n);
static inline void jbuf_puts(jev *ev, jbuf *b, const char *s) { jbuf_put(ev, b, s, strlen(s)); }
void jbuf_putc(jev *ev, jbuf *b, char c);
jv jbuf_str(jbuf *b);

/* UTF-8 (jinja_value.c) */
size_t utf8_len(const char *p, size_t n);             /* code points */
size_t utf8_next(const char *p, size_t n, size_t i);  /* byte offset after the code point at i */
uint32_t utf8_decode(const char *p, size_t n, size_t i, size_t *next);
size_t jinja_utf8_encode(uint32_t cp, char out[4]);
size_t utf8_offset(const char *p, size_t n, size_t k); /* byte offset of code point k (n if past) */
bool py_isspace(uint32_t cp);                          /* Python str.isspace */

/* Formatting (jinja_format.c) */
const char *jv_type_name(jv v);  /* Python type name: "str", "int", "NoneType" ... */
const char *jv_obj_repr(jv v);   /* Jinja's object_type_repr: "dict object", "None" ... */
void jv_write_str(jev *ev, jbuf *b, jv v, uint32_t depth);  /* Python str() */
void jv_write_repr(jev *ev, jbuf *b, jv v, uint32_t depth); /* Python repr() */
jv jv_to_str(jev *ev, jv v);                                /* str(), as a value */
typedef struct jjson_opts {
    const char *indent;    /* NULL: one line */
    const char *item_sep;  /* ", " or "," with indent */
    const char *key_sep;   /* ": " */
    bool sort_keys;
    bool ensure_ascii;
} jjson_opts;
void jv_write_json(jev *ev, jbuf *b, jv v, const jjson_opts *o, uint32_t level);
void py_float_repr(double f, char out[32]);
void jv_write_escaped(jev *ev, jbuf *b, const char *p, size_t n); /* HTML escape as markupsafe */

/* Operators (jinja_ops.c) */
bool jv_truthy(jv v);
bool jv_equal(jev *ev, jv a, jv b, uint32_t depth);
jv jv_binop(jev *ev, int op, jv a, jv b);
jv jv_compare(jev *ev, int op, jv a, jv b);
jv jv_getattr(jev *ev, jv obj, const char *name, size_t n);
jv jv_getitem(jev *ev, jv obj, jv key);
jv jv_slice(jev *ev, jv obj, jv start, jv stop, jv step);
jv jv_neg(jev *ev, jv a, bool negate);
/* Items of an iterable (list, tuple, dict keys, string characters, Undefined: none). */
jv jv_iterate(jev *ev, jv v);
/* len(); fails for values without one. */
int64_t jv_length(jev *ev, jv v);
/* Python ordering (<); fails for unorderable pairs. */
int jv_cmp(jev *ev, jv a, jv b);

/* Calls (jinja_eval.c for macros, jinja_methods.c for the rest) */
typedef struct jcall {
    const jv *pos;          /* [n_pos] */
    size_t n_pos;
    const char *const *kw;  /* [n_kw] names */
    const jv *kw_val;       /* [n_kw] */
    size_t n_kw;
} jcall;

/* Binds a call's arguments to the named parameters (slots start as JV_MISSING); fails
 * on surplus, unknown or duplicate arguments, naming what. */
void jcall_bind(jev *ev, const char *what, const jcall *c, const char *const *params,
                size_t n_params, jv *slots);
jv jv_call(jev *ev, jv fn, const jcall *c);
jv jev_call_macro(jev *ev, jv macro, const jcall *c);

typedef enum jfunc_id {
    JF_RAISE_EXCEPTION, JF_NAMESPACE, JF_RANGE, JF_DICT, JF_STRFTIME_NOW, JF_COUNT
} jfunc_id;
/* The global functions, looked up after the render variables. */
bool jinja_global_find(const char *name, size_t n, jv *out);
/* A method named name of obj, when obj's type has one (a bound JV_METHOD). */
bool jv_method_find(jev *ev, jv obj, const char *name, size_t n, jv *out);
/* The attributes of `loop`. */
jv jloop_attr(jev *ev, jv loop, const char *name, size_t n);

/* String operations shared by methods and filters (jinja_methods.c); results keep the
 * receiver's Markup flag, as markupsafe's overrides do. */
jv jstr_strip(jev *ev, jv s, jv chars, bool left, bool right);
jv jstr_case(jev *ev, jv s, char mode); /* 'l'ower 'u'pper 't'itle 'c'apitalize 's'wapcase */
jv jstr_replace(jev *ev, jv s, jv old, jv repl, int64_t count);
jv jstr_split(jev *ev, jv s, jv sep, int64_t maxsplit, bool from_right);

/* Applying filters (jinja_filters.c) and tests (jinja_tests.c) */
jv jinja_filter_apply(jev *ev, int fn, jv v, const jcall *c);
bool jinja_test_apply(jev *ev, int fn, jv v, const jcall *c);

#endif
