/* The JSON Schema compiler's working state, shared by its two halves: jsonc_compile.c reads
 * the schema's keywords into a graph of nodes, jsonc_pack.c resolves that graph (cycles, enum
 * filtering, type restrictions, empty languages) and packs it into a jc_schema. */
#ifndef TANDEM_COMMON_JSONC_CC_H
#define TANDEM_COMMON_JSONC_CC_H

#include <jansson.h>

#include "common/jsonc_int.h"

enum {
    JCC_NEST_MAX = 128,    /* schema objects nested in one another (the C stack follows them) */
    JCC_PATH_MAX = 512,    /* bytes of a JSON pointer kept for messages */
    JCC_MEMO_SLOTS = 8192, /* open-addressing table from schema object to node, > 2 * nodes */
    JCC_LITS_MAX = 65535,  /* values of one enum: the matcher's candidate range is 16-bit */
    JCC_NAME_MAX = 65535,  /* bytes of one property name */
    JCC_VALID_BUDGET = 1 << 24, /* steps checking enum / const values, ~0.1 s */
};
#define JCC_POOL_MAX ((size_t)16 << 20) /* bytes of names and literals */

typedef struct jcc_node {
    jc_node n;     /* LEAF fields are final save what packing prunes */
    uint8_t mask;  /* UNION: type restriction still to push into the branches */
    uint16_t base; /* LIT: node whose language the values must also be in */
    json_t *vals;  /* LIT: candidate values (JSON array, owned) */
    json_t *src;   /* schema object still to compile (queued), else NULL */
    char *ptr;     /* JSON pointer of the schema, for messages (owned) */
} jcc_node;

typedef struct jcc_prop {
    uint32_t off, len; /* name bytes in the pool */
    uint16_t node;
    uint8_t required;
} jcc_prop;

typedef struct jcc {
    json_t *root;
    jcc_node *nodes;       /* [JC_NODES_MAX], n_nodes used */
    uint32_t n_nodes;
    uint16_t *queue;       /* [JC_NODES_MAX] nodes whose src is still to compile */
    uint32_t n_queue;
    jcc_prop *props;       /* [n_props] per object node, sorted by name */
    uint32_t n_props, cap_props;
    uint16_t *br;          /* [n_br] union branches; prefixItems nodes */
    uint32_t n_br, cap_br;
    uint8_t *pool;         /* [pool_len] names, then literals */
    size_t pool_len, pool_cap;
    uint8_t *ne;           /* [n_nodes] JT_* bits with a non-empty language */
    uint32_t budget;       /* steps left checking enum / const values */
    gm_dfa **pats;         /* [n_pats] automata of the string patterns (moved to the schema) */
    uint32_t n_pats, cap_pats;
    struct {
        const json_t *j;
        uint16_t node;
    } *memo;               /* [JCC_MEMO_SLOTS] */
    char path[JCC_PATH_MAX];
    size_t path_len;
} jcc;

td_err jcc_nomem(void);
/* Grows *p (elements of elem bytes) to hold need of them. */
td_err jcc_grow(void **p, uint32_t *cap, uint32_t need, size_t elem);
/* Appends bytes[0..n) to the pool; *off is where they start. */
td_err jcc_pool_add(jcc *c, const void *bytes, size_t n, uint32_t *off);
/* A new node matching anything, with ptr (copied) for messages. */
td_err jcc_node_new(jcc *c, const char *ptr, uint16_t *out);

/* minimum, maximum, exclusiveMinimum, exclusiveMaximum of schema object j (draft 4's boolean
 * exclusive forms too) into n's range (jsonc_range.c); a range with no number takes the number
 * types out of *mask. TD_EINVAL for a bound that is not a number. */
td_err jcc_bounds(jcc *c, json_t *j, jc_node *n, uint8_t *mask);

/* After the whole schema is read: resolves the graph from root and fills s. */
td_err jcc_finish(jcc *c, uint16_t root, jc_schema *s);

#endif
