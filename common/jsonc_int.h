/* Inside the JSON constraint: the compiled schema, built by jsonc_compile.c and jsonc_pack.c
 * and walked by the matcher in jsonc.c. Every node is final: type restrictions are pushed into
 * the branches, unions are flattened to their leaves, and whatever has an empty language is
 * pruned. */
#ifndef TANDEM_COMMON_JSONC_INT_H
#define TANDEM_COMMON_JSONC_INT_H

#include "common/gram.h"
#include "common/jsonc.h"

/* Value types, one bit each; JSON Schema's "number" is JT_INT | JT_FRAC. */
enum {
    JT_NULL = 1,
    JT_BOOL = 2,
    JT_INT = 4,  /* numbers of the integer grammar */
    JT_FRAC = 8, /* numbers with a fraction or an exponent */
    JT_STR = 16,
    JT_ARR = 32,
    JT_OBJ = 64,
    JT_ALL = 127
};

enum {
    JN_LEAF,  /* a value of one of `types`, with the constraints of its type */
    JN_UNION, /* any of leaves[first..first+n) */
    JN_LIT    /* one of the literals lits[first..first+n), sorted by bytes */
};

/* Node 0 matches nothing, node 1 anything. */
enum { JC_NODE_NONE = 0, JC_NODE_ANY = 1 };

/* A non-negative decimal bound: the digits of its integer part (none below 1), then of its
 * fraction (the last one non-zero), at pool[off..off+n_int+n_frac). */
typedef struct jc_dec {
    uint32_t off;
    uint16_t n_int, n_frac;
} jc_dec;

/* The magnitudes a number of one sign may have under a range, both ends included, each written
 * with at most as many fraction digits as a JC_NUMBER_MAX-byte number near it can have. */
typedef struct jc_side {
    uint8_t ok;   /* some number of this sign is in the range */
    uint8_t inf;  /* no greatest magnitude (hi unused) */
    uint16_t pad;
    jc_dec lo, hi;
} jc_side;

typedef struct jc_node {
    uint8_t kind;        /* JN_* */
    uint8_t types;       /* JT_* bits of the values this node has (non-empty ones only) */
    uint8_t has_len;     /* string: min_len / max_len restrict it */
    uint8_t has_range;   /* number: minimum / maximum restrict it (sides) */
    uint16_t addl;       /* object: node of undeclared keys' values; JC_NODE_NONE: none allowed */
    uint16_t items;      /* array: node of the items after the prefix */
    uint16_t pattern;    /* string: 1 + its pattern's automaton in jc_schema.pats, or 0 */
    uint16_t pad;
    uint32_t min_len;    /* string: code points */
    uint32_t max_len;    /* string: code points */
    uint32_t min_items;  /* array: items */
    uint32_t max_items;  /* array: items, lowered to where an item can no longer exist */
    uint32_t first, n;   /* LEAF: props (names/prop_nodes); UNION: leaves; LIT: lits */
    uint32_t pfirst, pn; /* LEAF: prefix items, nodes prefix[pfirst..pfirst+pn) */
    uint64_t required;   /* LEAF: bit i set when property first+i must appear */
    uint64_t usable;     /* LEAF: bit i set when property first+i has a value that can exist */
    int64_t int_min;     /* integers only (no JT_FRAC): smallest value (INT64_MIN: none) */
    int64_t int_max;     /* largest value (INT64_MAX: none) */
    double num_min;      /* with JT_FRAC: the least double a number may read as (-inf: none) */
    double num_max;      /* the greatest (inf: none) */
    jc_side sides[2];    /* has_range: magnitudes of numbers without and with a '-' */
} jc_node;

typedef struct jc_str {
    uint32_t off, len; /* bytes in jc_schema.pool */
} jc_str;

struct jc_schema {
    jc_node *nodes;       /* [n_nodes] */
    uint32_t n_nodes;
    uint16_t root;        /* node of the document */
    uint16_t max_alts;    /* 1 when no union can fork, else JC_ALT_MAX */
    jc_str *names;        /* [n_props] declared names (decoded), sorted per object node */
    uint16_t *prop_nodes; /* [n_props] node of each declared name's value */
    uint32_t n_props;
    jc_str *lits;         /* [n_lits] compact serialisations of enum / const values */
    uint32_t n_lits;
    uint16_t *leaves;     /* [n_leaves] branches of the unions, none a union */
    uint32_t n_leaves;
    uint16_t *prefix;     /* [n_prefix] prefixItems nodes */
    uint32_t n_prefix;
    uint8_t *pool;        /* [pool_len] bytes of names and literals */
    size_t pool_len;
    gm_dfa **pats;        /* [n_pats] automata of the string patterns */
    uint32_t n_pats;
    uint8_t ws_max;       /* whitespace bytes allowed in a row: JC_WS_MAX, or 0 (compact) */
};

#endif
