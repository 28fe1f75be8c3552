/* What the grammar parsers (gram_parse.c) hand the matcher (gram.c). */
#ifndef TANDEM_COMMON_GRAM_INT_H
#define TANDEM_COMMON_GRAM_INT_H

#include "common/gram.h"

#define GM_CP_MAX 0x10ffffu /* the last code point */

/* A rule's body: alternatives separated by GM_ALT, closed by GM_END. A character set is a
 * GM_CHAR or GM_CHAR_NOT element (its first range) followed by GM_CHAR_ALT elements (the
 * others); the set holds a code point inside any range (GM_CHAR) or inside none
 * (GM_CHAR_NOT). */
typedef enum gm_kind {
    GM_END = 0,  /* end of the rule (and of its last alternative) */
    GM_ALT,      /* end of an alternative, the next one follows */
    GM_REF,      /* the rule lo */
    GM_CHAR,     /* a set's first range [lo, hi] */
    GM_CHAR_NOT, /* the same, the set negated */
    GM_CHAR_ALT, /* a further range [lo, hi] of the set before */
} gm_kind;

typedef struct gm_el {
    uint32_t kind; /* gm_kind */
    uint32_t lo, hi;
} gm_el;

typedef struct gm_seq {
    gm_el *el;     /* [n] */
    size_t n, cap;
} gm_seq;

/* Rules as the parsers write them; rule ids index every array. */
typedef struct gm_build {
    gm_seq *body;     /* [n_rules] */
    char **name;      /* [n_rules] the rule's name, or NULL for one a group or quantifier made */
    int32_t *owner;   /* [n_rules] the named rule whose text made it (itself when named) */
    bool *defined;    /* [n_rules] */
    int32_t n_rules, cap_rules;
    size_t total;     /* elements in all bodies */
} gm_build;

td_err gb_push(gm_build *b, gm_seq *s, uint32_t kind, uint32_t lo, uint32_t hi);
/* A new rule (name: NULL, or name[0..len) for a named one), its id in *id. */
td_err gb_rule(gm_build *b, const char *name, size_t len, int32_t owner, int32_t *id);
/* Replaces the item s->el[start..n) by itself min..max times (max -1: no maximum). */
td_err gb_repeat(gm_build *b, int32_t rule, size_t start, long min, long max);
/* The rule named name[0..len), or -1. */
int32_t gb_find(const gm_build *b, const char *name, size_t len);
/* The rule named name[0..len), made (undefined) when new. */
td_err gb_named(gm_build *b, const char *name, size_t len, int32_t *id);
void gb_free(gm_build *b);
/* Frees the rules made since there were n_rules (their names, bodies and element counts). */
void gb_truncate(gm_build *b, int32_t n_rules);

/* --- what the parsers share (gram_parse.c; the Lark grammars of gram_lark.c use it) ------- */

typedef struct gm_ranges {
    uint32_t lo[256], hi[256];
    int n;
    bool neg;
} gm_ranges;

typedef struct gm_src {
    const char *s, *p, *end; /* the text, where the parser is, its end */
    gm_build *b;
    bool regex;
    bool lark;               /* a Lark grammar: errors by line and column, also in regexes */
    bool ecma;               /* JSON Schema's pattern: ECMA-262's '.' and \s */
    bool fold;               /* regex: letters match either case (flag i) */
    bool dotall;             /* regex: '.' matches a newline too (flag s) */
    bool verbose;            /* regex: white space and # comments skipped (flag x) */
    bool ascii;              /* regex: fold ASCII letters only (the inline flag a) */
    const char *lead;        /* regex: where global inline flags may still stand, e.g. (?i) */
    const char *alt;         /* regex: where the top-level alternative being read began */
    bool caret, dollar;      /* regex: it began with '^' / ended with '$' */
} gm_src;

/* A syntax error at x->p: TD_EINVAL naming the line and column (a regex: the byte). */
td_err gm_syntax(const gm_src *x, const char *what);
/* Adds [lo, hi] to r (TD_EINVAL when backwards, TD_ENOTSUP past 256 ranges). */
td_err gm_range_add(const gm_src *x, gm_ranges *r, uint32_t lo, uint32_t hi);
/* Adds [lo, hi] and every character of the same case class as one in it (c, C and, for k,
 * the Kelvin sign), as Python's re.IGNORECASE matches them. */
td_err gm_range_add_folded(const gm_src *x, gm_ranges *r, uint32_t lo, uint32_t hi);
/* The set r (merged in place) as one item of rule. */
td_err gm_set_emit(gm_build *b, int32_t rule, gm_ranges *r);
/* The character cp as one item of rule; with x->fold, any of its case class. */
td_err gm_char_emit(const gm_src *x, int32_t rule, uint32_t cp);
/* A character of a literal or a class (an escape, or one UTF-8 character). In a regex, *cls
 * gets the letter of a class escape (\d \w \s \D \W \S) instead. */
td_err gm_char(gm_src *x, uint32_t *cp, char *cls);
/* '*', '+' or '?' at x->p: true with its bounds (max -1: none) and x->p past it. */
bool gm_star_plus_opt(gm_src *x, long *min, long *max);
/* Decimal digits at p (capped at 100000) into *v, -1 when there are none; returns the end. */
const char *gm_number(const char *p, const char *end, long *v);
/* A regex's alternatives at x->p into rule, up to the end, or a ')' when depth > 0. */
td_err re_alternatives(gm_src *x, int32_t rule, int depth);

typedef struct gm_scratch gm_scratch;

struct gm_grammar {
    gm_scratch *scratch;   /* what feeding writes (so one thread feeds a grammar at a time) */
    gm_el *el;             /* [n_el] every rule's body, back to back */
    uint32_t n_el;
    uint32_t *start;       /* [n_rules] a rule's first element */
    int32_t n_rules;
    uint8_t init[GM_STATE_BYTES]; /* the state before any text */
};

/* Stacks expanded by g's feeding so far (what building an automaton may spend). */
uint64_t gm_steps(const gm_grammar *g);

/* The grammar of b from rule root, checked and ready to match, where e (the parse's outcome)
 * is TD_OK; else e. b is freed either way. what: "grammar" or "regular expression", for
 * messages. */
td_err gm_finish(td_err e, gm_build *b, int32_t root, const char *what, gm_grammar **out);

#endif
