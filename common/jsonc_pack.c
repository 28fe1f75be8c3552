/* Compiles a JSON Schema, second half: resolves the graph of nodes that jsonc_compile.c read,
 * in steps:
 *   1. refuse $ref / anyOf cycles that never reach a value (the matcher would loop on them);
 *   2. keep only the enum / const values that the rest of their schema accepts;
 *   3. push the type of a union ({"type": "object", "anyOf": [...]}) into its branches;
 *   4. find each node's non-empty types (a least fixpoint: a recursive schema that needs
 *      endless nesting is empty);
 *   5. pack: flatten unions, drop empty branches and unusable properties, serialise literals. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/jsonc_cc.h"

/* --- step 1: cycles that never reach a value -------------------------------------------------- */

static td_err jcc_acyclic(jcc *c, uint16_t idx, uint8_t *color)
{
    if (color[idx] == 2)
        return TD_OK;
    if (color[idx] == 1)
        return err_set(TD_EINVAL, "schema %s: a $ref / anyOf cycle that never reaches a value",
                       c->nodes[idx].ptr);
    color[idx] = 1;
    const jc_node *n = &c->nodes[idx].n;
    if (n->kind == JN_UNION)
        for (uint32_t i = 0; i < n->n; i++)
            TD_TRY(jcc_acyclic(c, c->br[n->first + i], color));
    if (n->kind == JN_LIT)
        TD_TRY(jcc_acyclic(c, c->nodes[idx].base, color));
    color[idx] = 2;
    return TD_OK;
}

/* --- step 2: enum / const values through the rest of their schema ----------------------------- */

static uint8_t jcc_vtype(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_NULL: return JT_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return JT_BOOL;
    case JSON_INTEGER: return JT_INT;
    case JSON_REAL: {
        double d = json_real_value(v);
        return (uint8_t)(JT_FRAC | (d == floor(d) ? JT_INT : 0));
    }
    case JSON_STRING: return JT_STR;
    case JSON_ARRAY: return JT_ARR;
    case JSON_OBJECT: return JT_OBJ;
    }
    return 0;
}

static uint32_t jcc_code_points(const json_t *v)
{
    const uint8_t *s = (const uint8_t *)json_string_value(v);
    uint32_t n = 0;
    for (size_t i = 0; i < json_string_length(v); i++)
        n += (s[i] & 0xC0) != 0x80;
    return n;
}

/* Whether string v holds a match of the pattern d (its code points through the automaton). */
static bool jcc_pattern_holds(const gm_dfa *d, const json_t *v)
{
    const uint8_t *p = (const uint8_t *)json_string_value(v);
    const size_t n = json_string_length(v);
    uint16_t st = 0;
    for (size_t i = 0; i < n && st != GM_DFA_DEAD;) { /* jansson's strings are UTF-8 */
        utf8proc_int32_t cp;
        const utf8proc_ssize_t k = utf8proc_iterate(p + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0)
            return false;
        st = gm_dfa_step(d, st, (uint32_t)cp);
        i += (size_t)k;
    }
    return st != GM_DFA_DEAD && gm_dfa_accepts(d, st);
}

/* Whether v is in node idx's language. Unions shared along many paths make this exponential,
 * so every call spends one unit of c->budget and an empty budget answers false. */
static bool jcc_valid(jcc *c, uint16_t idx, json_t *v)
{
    if (c->budget == 0)
        return false;
    c->budget--;
    const jcc_node *x = &c->nodes[idx];
    const jc_node *n = &x->n;
    if (n->kind == JN_LIT) {
        for (size_t i = 0; i < json_array_size(x->vals); i++)
            if (json_equal(json_array_get(x->vals, i), v))
                return jcc_valid(c, x->base, v);
        return false;
    }
    if (n->kind == JN_UNION) {
        if (!(jcc_vtype(v) & x->mask))
            return false;
        for (uint32_t i = 0; i < n->n; i++)
            if (jcc_valid(c, c->br[n->first + i], v))
                return true;
        return false;
    }
    if (!(jcc_vtype(v) & n->types))
        return false;
    if (n->has_range && json_is_number(v)) { /* exactly, as a reader compares the two */
        const long double x = json_is_integer(v) ? (long double)json_integer_value(v)
                                                 : (long double)json_real_value(v);
        if (!(n->types & JT_FRAC))
            return x >= (long double)n->int_min && x <= (long double)n->int_max;
        return x >= (long double)n->num_min && x <= (long double)n->num_max;
    }
    if (json_is_string(v)) {
        uint32_t len = jcc_code_points(v);
        return len >= n->min_len && len <= n->max_len &&
               (!n->pattern || jcc_pattern_holds(c->pats[n->pattern - 1], v));
    }
    if (json_is_array(v)) {
        size_t len = json_array_size(v);
        if (len < n->min_items || len > n->max_items)
            return false;
        for (size_t i = 0; i < len; i++)
            if (!jcc_valid(c, i < n->pn ? c->br[n->pfirst + i] : n->items, json_array_get(v, i)))
                return false;
        return true;
    }
    if (!json_is_object(v))
        return true;
    for (uint32_t i = 0; i < n->n; i++) {
        const jcc_prop *p = &c->props[n->first + i];
        if (p->required && !json_object_getn(v, (const char *)c->pool + p->off, p->len))
            return false;
    }
    for (void *it = json_object_iter(v); it; it = json_object_iter_next(v, it)) {
        const char *k = json_object_iter_key(it);
        size_t len = json_object_iter_key_len(it);
        uint16_t node = n->addl;
        for (uint32_t i = 0; i < n->n; i++) {
            const jcc_prop *p = &c->props[n->first + i];
            if (p->len == len && memcmp(c->pool + p->off, k, len) == 0)
                node = p->node;
        }
        if (!jcc_valid(c, node, json_object_iter_value(it)))
            return false;
    }
    return true;
}

/* --- step 3: a union's type into its branches ------------------------------------------------- */

static td_err jcc_restrict(jcc *c, uint16_t idx, uint8_t m, uint16_t *out)
{
    *out = idx;
    jcc_node *x = &c->nodes[idx];
    if (x->n.kind == JN_LEAF && !(x->n.types & ~m))
        return TD_OK;
    if (x->n.kind == JN_LIT) {
        bool all = true;
        for (size_t i = 0; i < json_array_size(x->vals); i++)
            all = all && (jcc_vtype(json_array_get(x->vals, i)) & m);
        if (all)
            return TD_OK;
    }
    uint16_t y;
    TD_TRY(jcc_node_new(c, c->nodes[idx].ptr, &y));
    x = &c->nodes[idx];
    jcc_node *z = &c->nodes[y];
    z->n = x->n;
    z->base = x->base;
    *out = y;
    if (x->n.kind == JN_LEAF) {
        z->n.types &= m;
        return TD_OK;
    }
    if (x->n.kind == JN_LIT) {
        z->vals = json_array();
        if (!z->vals)
            return jcc_nomem();
        for (size_t i = 0; i < json_array_size(x->vals); i++) {
            json_t *v = json_array_get(x->vals, i);
            if ((jcc_vtype(v) & m) && json_array_append(z->vals, v) != 0)
                return jcc_nomem();
        }
        return TD_OK;
    }
    uint8_t mm = m & x->mask;
    uint32_t n = x->n.n, from = x->n.first;
    TD_TRY(jcc_grow((void **)&c->br, &c->cap_br, c->n_br + n, sizeof *c->br));
    z->n.first = c->n_br;
    c->n_br += n;
    for (uint32_t i = 0; i < n; i++) {
        uint16_t b;
        TD_TRY(jcc_restrict(c, c->br[from + i], mm, &b));
        c->br[c->nodes[y].n.first + i] = b;
    }
    return TD_OK;
}

/* --- step 4: non-empty types ------------------------------------------------------------------ */

/* Items an array can hold: fewer when some item's schema has an empty language. */
static uint32_t jcc_max_items(const jcc *c, const jc_node *n)
{
    uint32_t k = 0;
    while (k < n->pn && c->ne[c->br[n->pfirst + k]])
        k++;
    if (k == n->pn && c->ne[n->items])
        return n->max_items;
    return k < n->max_items ? k : n->max_items;
}

static uint8_t jcc_ne_of(const jcc *c, uint16_t idx)
{
    const jcc_node *x = &c->nodes[idx];
    const jc_node *n = &x->n;
    uint8_t t = 0;
    if (n->kind == JN_LIT) {
        for (size_t i = 0; i < json_array_size(x->vals); i++)
            t |= jcc_vtype(json_array_get(x->vals, i));
        return t;
    }
    if (n->kind == JN_UNION) {
        for (uint32_t i = 0; i < n->n; i++)
            t |= c->ne[c->br[n->first + i]];
        return t;
    }
    t = n->types & (JT_NULL | JT_BOOL | JT_INT | JT_FRAC);
    if ((n->types & JT_STR) && n->min_len <= n->max_len)
        t |= JT_STR;
    if ((n->types & JT_ARR) && n->min_items <= jcc_max_items(c, n))
        t |= JT_ARR;
    bool obj = n->types & JT_OBJ;
    for (uint32_t i = 0; obj && i < n->n; i++)
        obj = !c->props[n->first + i].required || c->ne[c->props[n->first + i].node];
    return (uint8_t)(t | (obj ? JT_OBJ : 0));
}

/* --- step 5: pack ----------------------------------------------------------------------------- */

static td_err jcc_dump(jcc *c, json_t *v);

static td_err jcc_dump_str(jcc *c, const char *s, size_t len)
{
    json_t *j = json_stringn(s, len);
    char *text = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    if (!text)
        return jcc_nomem();
    uint32_t off;
    td_err e = jcc_pool_add(c, text, strlen(text), &off);
    free(text);
    return e;
}

/* Compact serialisation, appended to the pool. */
static td_err jcc_dump(jcc *c, json_t *v)
{
    uint32_t off;
    char buf[40];
    switch (json_typeof(v)) {
    case JSON_NULL: return jcc_pool_add(c, "null", 4, &off);
    case JSON_TRUE: return jcc_pool_add(c, "true", 4, &off);
    case JSON_FALSE: return jcc_pool_add(c, "false", 5, &off);
    case JSON_INTEGER:
        snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return jcc_pool_add(c, buf, strlen(buf), &off);
    case JSON_REAL: {
        double d = json_real_value(v);
        for (int p = 1; p <= 17; p++) {
            snprintf(buf, sizeof buf, "%.*g", p, d);
            if (strtod(buf, NULL) == d)
                break;
        }
        if (!strpbrk(buf, ".e"))
            strcat(buf, ".0");
        return jcc_pool_add(c, buf, strlen(buf), &off);
    }
    case JSON_STRING: return jcc_dump_str(c, json_string_value(v), json_string_length(v));
    case JSON_ARRAY:
        TD_TRY(jcc_pool_add(c, "[", 1, &off));
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i)
                TD_TRY(jcc_pool_add(c, ",", 1, &off));
            TD_TRY(jcc_dump(c, json_array_get(v, i)));
        }
        return jcc_pool_add(c, "]", 1, &off);
    case JSON_OBJECT:
        TD_TRY(jcc_pool_add(c, "{", 1, &off));
        for (void *it = json_object_iter(v); it; it = json_object_iter_next(v, it)) {
            if (it != json_object_iter(v))
                TD_TRY(jcc_pool_add(c, ",", 1, &off));
            TD_TRY(jcc_dump_str(c, json_object_iter_key(it), json_object_iter_key_len(it)));
            TD_TRY(jcc_pool_add(c, ":", 1, &off));
            TD_TRY(jcc_dump(c, json_object_iter_value(it)));
        }
        return jcc_pool_add(c, "}", 1, &off);
    }
    return TD_OK;
}

static int jcc_str_cmp(const uint8_t *pool, const jc_str *a, const jc_str *b)
{
    uint32_t n = a->len < b->len ? a->len : b->len;
    int r = memcmp(pool + a->off, pool + b->off, n);
    return r ? r : (a->len > b->len) - (a->len < b->len);
}

typedef struct jcc_out {
    jc_schema *s;
    uint32_t cap_lits, cap_leaves;
    uint16_t *stamp; /* [n_nodes] 1 + the union whose leaves last took the node */
} jcc_out;

/* Non-empty leaves under union idx, once each, appended to s->leaves for union `to`. A node
 * is visited once per `to` (stamped), so shared sub-unions cost nothing more. */
static td_err jcc_flatten(jcc *c, jcc_out *o, uint16_t idx, uint16_t to)
{
    const jc_node *n = &c->nodes[idx].n;
    for (uint32_t i = 0; i < n->n; i++) {
        uint16_t b = c->br[n->first + i];
        if (o->stamp[b] == to + 1)
            continue;
        o->stamp[b] = (uint16_t)(to + 1);
        if (c->nodes[b].n.kind == JN_UNION) {
            TD_TRY(jcc_flatten(c, o, b, to));
            continue;
        }
        if (!c->ne[b])
            continue;
        TD_TRY(jcc_grow((void **)&o->s->leaves, &o->cap_leaves, o->s->n_leaves + 1,
                       sizeof *o->s->leaves));
        o->s->leaves[o->s->n_leaves++] = b;
    }
    return TD_OK;
}

static int jcc_lit_cmp(const void *a, const void *b, void *pool)
{
    return jcc_str_cmp(pool, a, b);
}

static td_err jcc_lits(jcc *c, jcc_out *o, jc_node *n, json_t *vals)
{
    jc_schema *s = o->s;
    n->first = s->n_lits;
    n->n = 0;
    size_t count = json_array_size(vals);
    if (count == 0)
        return TD_OK;
    TD_TRY(jcc_grow((void **)&s->lits, &o->cap_lits, s->n_lits + (uint32_t)count, sizeof *s->lits));
    for (size_t i = 0; i < count; i++) {
        size_t at = c->pool_len;
        TD_TRY(jcc_dump(c, json_array_get(vals, i)));
        s->lits[n->first + i] = (jc_str){(uint32_t)at, (uint32_t)(c->pool_len - at)};
    }
    qsort_r(s->lits + n->first, count, sizeof *s->lits, jcc_lit_cmp, c->pool);
    uint32_t k = 0; /* equal serialisations (1 and 1 in one enum) once */
    for (size_t i = 0; i < count; i++)
        if (k == 0 || jcc_str_cmp(c->pool, &s->lits[n->first + k - 1], &s->lits[n->first + i]))
            s->lits[n->first + k++] = s->lits[n->first + i];
    n->n = k;
    s->n_lits += k;
    return TD_OK;
}

static td_err jcc_pack(jcc *c, uint16_t root, jc_schema *s)
{
    jcc_out o = {s, 0, 0, calloc(c->n_nodes, sizeof *o.stamp)};
    s->n_nodes = c->n_nodes;
    s->nodes = calloc(c->n_nodes, sizeof *s->nodes);
    uint16_t *alias = calloc(c->n_nodes, sizeof *alias);
    if (!s->nodes || !alias || !o.stamp) {
        free(alias);
        free(o.stamp);
        return jcc_nomem();
    }
    td_err e = TD_OK;
    s->max_alts = 1;
    for (uint32_t i = 0; i < c->n_nodes && e == TD_OK; i++) {
        jc_node *n = &s->nodes[i];
        *n = c->nodes[i].n;
        alias[i] = (uint16_t)i;
        if (n->kind == JN_LIT)
            e = jcc_lits(c, &o, n, c->nodes[i].vals);
        if (n->kind != JN_UNION)
            continue;
        n->first = s->n_leaves;
        e = jcc_flatten(c, &o, (uint16_t)i, (uint16_t)i);
        n->n = s->n_leaves - n->first;
        /* A union of one leaf is that leaf, of none nothing: the matcher forks only where there
         * is a choice. */
        if (n->n < 2)
            alias[i] = n->n ? s->leaves[n->first] : JC_NODE_NONE;
        else
            s->max_alts = JC_ALT_MAX;
    }
    free(o.stamp);
    s->n_props = c->n_props;
    s->names = malloc((c->n_props ? c->n_props : 1) * sizeof *s->names);
    s->prop_nodes = malloc((c->n_props ? c->n_props : 1) * sizeof *s->prop_nodes);
    s->n_prefix = c->n_br;
    s->prefix = malloc((c->n_br ? c->n_br : 1) * sizeof *s->prefix);
    if (e == TD_OK && (!s->names || !s->prop_nodes || !s->prefix))
        e = jcc_nomem();
    for (uint32_t i = 0; e == TD_OK && i < c->n_props; i++) {
        s->names[i] = (jc_str){c->props[i].off, c->props[i].len};
        s->prop_nodes[i] = alias[c->props[i].node];
    }
    for (uint32_t i = 0; e == TD_OK && i < c->n_br; i++)
        s->prefix[i] = alias[c->br[i]];
    for (uint32_t i = 0; e == TD_OK && i < c->n_nodes; i++) {
        jc_node *n = &s->nodes[i];
        if (n->kind != JN_LEAF)
            continue;
        n->types = c->ne[i];
        n->max_items = jcc_max_items(c, n);
        n->addl = c->ne[n->addl] ? alias[n->addl] : JC_NODE_NONE;
        n->items = alias[n->items];
        n->required = n->usable = 0;
        for (uint32_t k = 0; k < n->n; k++) {
            n->required |= (uint64_t)c->props[n->first + k].required << k;
            n->usable |= (uint64_t)(c->ne[c->props[n->first + k].node] != 0) << k;
        }
    }
    s->root = alias[root];
    free(alias);
    return e;
}

/* --- the steps in order ----------------------------------------------------------------------- */

static td_err jcc_check_cycles(jcc *c)
{
    uint8_t *color = calloc(c->n_nodes, 1);
    if (!color)
        return jcc_nomem();
    td_err e = TD_OK;
    for (uint32_t i = 0; i < c->n_nodes && e == TD_OK; i++)
        e = jcc_acyclic(c, (uint16_t)i, color);
    free(color);
    return e;
}

static td_err jcc_filter_literals(jcc *c)
{
    c->budget = JCC_VALID_BUDGET;
    for (uint32_t i = 0; i < c->n_nodes; i++) {
        jcc_node *x = &c->nodes[i];
        if (x->n.kind != JN_LIT)
            continue;
        json_t *kept = json_array();
        if (!kept)
            return jcc_nomem();
        for (size_t k = 0; k < json_array_size(x->vals); k++) {
            json_t *v = json_array_get(x->vals, k);
            if (jcc_valid(c, x->base, v) && json_array_append(kept, v) != 0) {
                json_decref(kept);
                return jcc_nomem();
            }
        }
        json_decref(x->vals);
        x->vals = kept;
    }
    if (c->budget == 0)
        return err_set(TD_ENOTSUP, "schema: checking enum / const values against their schema "
                                   "takes more than %d steps", JCC_VALID_BUDGET);
    return TD_OK;
}

static td_err jcc_push_types(jcc *c)
{
    for (uint32_t i = 0, n = c->n_nodes; i < n; i++) { /* nodes made here need nothing pushed */
        if (c->nodes[i].n.kind != JN_UNION || c->nodes[i].mask == JT_ALL)
            continue;
        uint8_t m = c->nodes[i].mask;
        for (uint32_t k = 0; k < c->nodes[i].n.n; k++) {
            uint16_t b;
            TD_TRY(jcc_restrict(c, c->br[c->nodes[i].n.first + k], m, &b));
            c->br[c->nodes[i].n.first + k] = b;
        }
        c->nodes[i].mask = JT_ALL;
    }
    return TD_OK;
}

static td_err jcc_find_nonempty(jcc *c)
{
    c->ne = calloc(c->n_nodes, 1);
    if (!c->ne)
        return jcc_nomem();
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t i = 0; i < c->n_nodes; i++) {
            uint8_t t = jcc_ne_of(c, (uint16_t)i);
            changed = changed || t != c->ne[i];
            c->ne[i] = t;
        }
    }
    return TD_OK;
}

td_err jcc_finish(jcc *c, uint16_t root, jc_schema *s)
{
    TD_TRY(jcc_check_cycles(c));
    TD_TRY(jcc_filter_literals(c));
    TD_TRY(jcc_push_types(c));
    TD_TRY(jcc_find_nonempty(c));
    if (!c->ne[root])
        return err_set(TD_EINVAL, "schema #: no JSON document satisfies it");
    TD_TRY(jcc_pack(c, root, s));
    s->pool = c->pool;
    s->pool_len = c->pool_len;
    c->pool = NULL;
    s->pats = c->pats;
    s->n_pats = c->n_pats;
    c->pats = NULL;
    c->n_pats = 0;
    return TD_OK;
}
