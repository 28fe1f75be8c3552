/* Compiles a JSON Schema, first half: reads the keywords into one node per schema object.
 * $ref targets and $defs are queued rather than recursed into, so a recursive schema becomes a
 * graph and the C stack only follows plain nesting; jsonc_pack.c then resolves the graph. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonc_cc.h"

td_err jcc_nomem(void)
{
    return err_set(TD_ENOMEM, "schema: out of memory");
}

td_err jcc_grow(void **p, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap)
        return TD_OK;
    uint32_t c = need < 64 ? 64 : need * 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q)
        return jcc_nomem();
    *p = q;
    *cap = c;
    return TD_OK;
}

td_err jcc_pool_add(jcc *c, const void *bytes, size_t n, uint32_t *off)
{
    *off = (uint32_t)c->pool_len;
    if (n == 0)
        return TD_OK;
    if (c->pool_len + n > JCC_POOL_MAX)
        return err_set(TD_ENOTSUP, "schema: names and enum values take more than %zu bytes",
                       JCC_POOL_MAX);
    if (c->pool_len + n > c->pool_cap) {
        size_t cap = (c->pool_len + n) * 2;
        uint8_t *p = realloc(c->pool, cap);
        if (!p)
            return jcc_nomem();
        c->pool = p;
        c->pool_cap = cap;
    }
    memcpy(c->pool + c->pool_len, bytes, n);
    c->pool_len += n;
    return TD_OK;
}

/* Appends "/" and a key, escaped as a JSON pointer token; returns the length to restore. */
static size_t jcc_path_push(jcc *c, const char *key, size_t len)
{
    size_t old = c->path_len, at = old;
    char *p = c->path;
    if (at + 1 < JCC_PATH_MAX)
        p[at++] = '/';
    for (size_t i = 0; i < len && at + 2 < JCC_PATH_MAX; i++) {
        if (key[i] == '~' || key[i] == '/') {
            p[at++] = '~';
            p[at++] = key[i] == '~' ? '0' : '1';
        } else {
            p[at++] = key[i] ? key[i] : '?';
        }
    }
    p[at] = 0;
    c->path_len = at;
    return old;
}

static void jcc_path_pop(jcc *c, size_t old)
{
    c->path_len = old;
    c->path[old] = 0;
}

static void jcc_leaf_any(jc_node *n)
{
    memset(n, 0, sizeof *n);
    n->kind = JN_LEAF;
    n->types = JT_ALL;
    n->addl = JC_NODE_ANY;
    n->items = JC_NODE_ANY;
    n->max_len = UINT32_MAX;
    n->max_items = UINT32_MAX;
    n->int_min = INT64_MIN;
    n->int_max = INT64_MAX;
    n->num_min = -INFINITY;
    n->num_max = INFINITY;
}

td_err jcc_node_new(jcc *c, const char *ptr, uint16_t *out)
{
    if (c->n_nodes >= JC_NODES_MAX)
        return err_set(TD_ENOTSUP, "schema: more than %d subschemas", JC_NODES_MAX);
    jcc_node *x = &c->nodes[c->n_nodes];
    memset(x, 0, sizeof *x);
    jcc_leaf_any(&x->n);
    x->mask = JT_ALL;
    x->ptr = strdup(ptr);
    if (!x->ptr)
        return jcc_nomem();
    *out = (uint16_t)c->n_nodes++;
    return TD_OK;
}

static size_t jcc_memo_slot(const jcc *c, const json_t *j)
{
    size_t h = (size_t)(((uintptr_t)j >> 4) * 0x9E3779B97F4A7C15ull) & (JCC_MEMO_SLOTS - 1);
    while (c->memo[h].j && c->memo[h].j != j)
        h = (h + 1) & (JCC_MEMO_SLOTS - 1);
    return h;
}

/* The node of schema object j, queued for compiling when new. */
static td_err jcc_queue(jcc *c, const json_t *j, const char *ptr, uint16_t *out)
{
    size_t h = jcc_memo_slot(c, j);
    if (c->memo[h].j) {
        *out = c->memo[h].node;
        return TD_OK;
    }
    TD_TRY(jcc_node_new(c, ptr, out));
    c->memo[h].j = j;
    c->memo[h].node = *out;
    c->nodes[*out].src = (json_t *)j;
    c->queue[c->n_queue++] = *out;
    return TD_OK;
}

static td_err jcc_schema(jcc *c, json_t *j, uint16_t idx, int depth);

/* Compiles j, found at c->path, now; booleans need no node of their own. */
static td_err jcc_child(jcc *c, json_t *j, int depth, uint16_t *out)
{
    if (json_is_boolean(j)) {
        *out = json_is_true(j) ? JC_NODE_ANY : JC_NODE_NONE;
        return TD_OK;
    }
    TD_TRY(jcc_node_new(c, c->path, out));
    return jcc_schema(c, j, *out, depth + 1);
}

/* jcc_child at c->path + "/" + key. */
static td_err jcc_child_at(jcc *c, json_t *j, const char *key, size_t len, int depth, uint16_t *out)
{
    size_t old = jcc_path_push(c, key, len);
    td_err e = jcc_child(c, j, depth, out);
    jcc_path_pop(c, old);
    return e;
}

static td_err jcc_count(jcc *c, json_t *j, const char *key, uint32_t *out)
{
    json_t *v = json_object_get(j, key);
    if (!v)
        return TD_OK;
    double d = json_is_integer(v) ? (double)json_integer_value(v)
             : json_is_real(v)    ? json_real_value(v)
                                  : -1;
    if (!(d >= 0) || d != floor(d))
        return err_set(TD_EINVAL, "schema %s/%s: must be a non-negative integer", c->path, key);
    *out = d >= (double)UINT32_MAX ? UINT32_MAX : (uint32_t)d;
    return TD_OK;
}

static const struct {
    const char *name;
    uint8_t bits;
} jcc_types[] = {
    {"null", JT_NULL},   {"boolean", JT_BOOL}, {"integer", JT_INT}, {"number", JT_INT | JT_FRAC},
    {"string", JT_STR},  {"array", JT_ARR},    {"object", JT_OBJ},
};

static td_err jcc_type_name(jcc *c, json_t *v, const char *where, uint8_t *mask)
{
    if (json_is_string(v))
        for (size_t i = 0; i < sizeof jcc_types / sizeof jcc_types[0]; i++)
            if (strcmp(json_string_value(v), jcc_types[i].name) == 0) {
                *mask |= jcc_types[i].bits;
                return TD_OK;
            }
    if (!json_is_string(v))
        return err_set(TD_EINVAL, "schema %s/type%s: must be a type name", c->path, where);
    return err_set(TD_EINVAL, "schema %s/type%s: unknown type '%s'", c->path, where,
                   json_string_value(v));
}

static td_err jcc_type(jcc *c, json_t *j, uint8_t *mask)
{
    json_t *t = json_object_get(j, "type");
    *mask = JT_ALL;
    if (!t)
        return TD_OK;
    *mask = 0;
    if (!json_is_array(t))
        return jcc_type_name(c, t, "", mask);
    if (json_array_size(t) == 0)
        return err_set(TD_EINVAL, "schema %s/type: empty list of types", c->path);
    for (size_t i = 0; i < json_array_size(t); i++) {
        char where[24];
        snprintf(where, sizeof where, "/%zu", i);
        TD_TRY(jcc_type_name(c, json_array_get(t, i), where, mask));
    }
    return TD_OK;
}

static int jcc_name_cmp(const jcc *c, const jcc_prop *a, const jcc_prop *b)
{
    uint32_t n = a->len < b->len ? a->len : b->len;
    int r = memcmp(c->pool + a->off, c->pool + b->off, n);
    return r ? r : (a->len > b->len) - (a->len < b->len);
}

static bool jcc_in_strings(json_t *list, size_t end, const char *s, size_t len)
{
    for (size_t i = 0; i < end; i++) {
        json_t *v = json_array_get(list, i);
        if (json_string_length(v) == len && memcmp(json_string_value(v), s, len) == 0)
            return true;
    }
    return false;
}

/* properties, required, additionalProperties: a sorted range of names. Names that are only
 * required get the additionalProperties schema, so that one bit per name tracks them all. */
static td_err jcc_object(jcc *c, json_t *j, jc_node *n, int depth)
{
    json_t *props = json_object_get(j, "properties"), *req = json_object_get(j, "required");
    json_t *addl = json_object_get(j, "additionalProperties");
    if (props && !json_is_object(props))
        return err_set(TD_EINVAL, "schema %s/properties: must be an object", c->path);
    if (req && !json_is_array(req))
        return err_set(TD_EINVAL, "schema %s/required: must be an array of strings", c->path);
    if (addl)
        TD_TRY(jcc_child_at(c, addl, "additionalProperties", strlen("additionalProperties"), depth,
                                &n->addl));
    size_t count = props ? json_object_size(props) : 0;
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        json_t *r = json_array_get(req, i);
        if (!json_is_string(r))
            return err_set(TD_EINVAL, "schema %s/required/%zu: must be a string", c->path, i);
        const char *s = json_string_value(r);
        size_t len = json_string_length(r);
        if (!(props && json_object_getn(props, s, len)) && !jcc_in_strings(req, i, s, len))
            count++;
    }
    if (count > JC_PROPS_MAX)
        return err_set(TD_ENOTSUP, "schema %s/properties: more than %d properties", c->path,
                       JC_PROPS_MAX);
    uint32_t first = c->n_props;
    TD_TRY(jcc_grow((void **)&c->props, &c->cap_props, first + (uint32_t)count, sizeof *c->props));
    c->n_props += (uint32_t)count;
    uint32_t k = first;
    void *it = props ? json_object_iter(props) : NULL;
    for (; it; it = json_object_iter_next(props, it)) {
        const char *name = json_object_iter_key(it);
        size_t len = json_object_iter_key_len(it);
        json_t *v = json_object_iter_value(it);
        if (len > JCC_NAME_MAX)
            return err_set(TD_ENOTSUP, "schema %s/properties: a name longer than %d bytes",
                           c->path, JCC_NAME_MAX);
        uint16_t node = 0;
        size_t old = jcc_path_push(c, "properties", 10);
        td_err e = jcc_child_at(c, v, name, len, depth, &node);
        jcc_path_pop(c, old);
        TD_TRY(e);
        jcc_prop *p = &c->props[k++];
        p->len = (uint32_t)len;
        p->node = node;
        p->required = req && jcc_in_strings(req, json_array_size(req), name, len);
        TD_TRY(jcc_pool_add(c, name, len, &p->off));
    }
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        json_t *r = json_array_get(req, i);
        const char *s = json_string_value(r);
        size_t len = json_string_length(r);
        if ((props && json_object_getn(props, s, len)) || jcc_in_strings(req, i, s, len))
            continue;
        if (len > JCC_NAME_MAX)
            return err_set(TD_ENOTSUP, "schema %s/required/%zu: a name longer than %d bytes",
                           c->path, i, JCC_NAME_MAX);
        jcc_prop *p = &c->props[k++];
        p->len = (uint32_t)len;
        p->node = n->addl;
        p->required = 1;
        TD_TRY(jcc_pool_add(c, s, len, &p->off));
    }
    for (uint32_t a = first + 1; a < k; a++) /* insertion sort: at most 64 names */
        for (uint32_t b = a; b > first && jcc_name_cmp(c, &c->props[b - 1], &c->props[b]) > 0;
             b--) {
            jcc_prop t = c->props[b];
            c->props[b] = c->props[b - 1];
            c->props[b - 1] = t;
        }
    n->first = first;
    n->n = (uint32_t)count;
    return TD_OK;
}

static td_err jcc_schema_list(jcc *c, json_t *list, const char *key, int depth, uint32_t *first,
                             uint32_t *count)
{
    if (!json_is_array(list))
        return err_set(TD_EINVAL, "schema %s/%s: must be an array of schemas", c->path, key);
    size_t n = json_array_size(list);
    *first = c->n_br;
    *count = (uint32_t)n;
    TD_TRY(jcc_grow((void **)&c->br, &c->cap_br, c->n_br + (uint32_t)n, sizeof *c->br));
    c->n_br += (uint32_t)n;
    size_t old = jcc_path_push(c, key, strlen(key));
    for (size_t i = 0; i < n; i++) {
        uint16_t node = 0;
        char num[24];
        td_err e = jcc_child_at(c, json_array_get(list, i), num,
                               (size_t)snprintf(num, sizeof num, "%zu", i), depth, &node);
        if (e != TD_OK) {
            jcc_path_pop(c, old);
            return e;
        }
        c->br[*first + i] = node;
    }
    jcc_path_pop(c, old);
    return TD_OK;
}

/* items, prefixItems, additionalItems (the draft-4 tuple form is prefixItems). */
static td_err jcc_array(jcc *c, json_t *j, jc_node *n, int depth)
{
    json_t *items = json_object_get(j, "items"), *prefix = json_object_get(j, "prefixItems");
    json_t *rest = items;
    if (items && json_is_array(items)) {
        if (prefix)
            return err_set(TD_EINVAL, "schema %s/items: must be a schema beside prefixItems",
                           c->path);
        prefix = items;
        rest = json_object_get(j, "additionalItems");
    }
    if (prefix)
        TD_TRY(jcc_schema_list(c, prefix, prefix == items ? "items" : "prefixItems", depth,
                              &n->pfirst, &n->pn));
    if (rest) {
        const char *key = rest == items ? "items" : "additionalItems";
        TD_TRY(jcc_child_at(c, rest, key, strlen(key), depth, &n->items));
    }
    TD_TRY(jcc_count(c, j, "minItems", &n->min_items));
    return jcc_count(c, j, "maxItems", &n->max_items);
}

/* "pattern": its automaton, kept in c->pats, numbered in n->pattern. */
static td_err jcc_pattern(jcc *c, json_t *j, jc_node *n)
{
    json_t *v = json_object_get(j, "pattern");
    if (!v)
        return TD_OK;
    if (!json_is_string(v))
        return err_set(TD_EINVAL, "schema %s/pattern: must be a string", c->path);
    if (c->n_pats == UINT16_MAX - 1)
        return err_set(TD_ENOTSUP, "schema %s/pattern: more than %d patterns", c->path,
                       UINT16_MAX - 1);
    gm_grammar *g = NULL;
    td_err e = gm_compile_pattern(json_string_value(v), json_string_length(v), &g);
    gm_dfa *d = NULL;
    if (e == TD_OK)
        e = gm_dfa_build(g, &d);
    gm_free(g);
    if (e == TD_OK)
        e = jcc_grow((void **)&c->pats, &c->cap_pats, c->n_pats + 1, sizeof *c->pats);
    if (e != TD_OK) {
        gm_dfa_free(d);
        return e == TD_ENOMEM ? e : err_wrap(e, "schema %s/pattern", c->path);
    }
    c->pats[c->n_pats++] = d;
    n->pattern = (uint16_t)c->n_pats;
    return TD_OK;
}

static const char *const jcc_refused[] = {
    "patternProperties", "propertyNames", "multipleOf", "uniqueItems", "minProperties", "maxProperties",
    "contains", "minContains", "maxContains", "not", "if", "then", "else", "dependencies",
    "dependentRequired", "dependentSchemas", "unevaluatedProperties", "unevaluatedItems",
    "$dynamicRef", "$recursiveRef",
};
static const char *const jcc_local[] = {
    "properties", "required", "additionalProperties", "items", "prefixItems", "additionalItems",
    "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum",
};
static const char *const jcc_combinators[] = {"anyOf", "oneOf", "allOf", "$ref"};

/* "#", "#/$defs/<name>", "#/definitions/<name>": the target's node, queued when new. */
static td_err jcc_ref(jcc *c, json_t *ref, uint16_t *out)
{
    if (!json_is_string(ref))
        return err_set(TD_EINVAL, "schema %s/$ref: must be a string", c->path);
    const char *s = json_string_value(ref);
    if (strcmp(s, "#") == 0)
        return jcc_queue(c, c->root, "#", out);
    const char *defs = strncmp(s, "#/$defs/", 8) == 0 ? "$defs"
                     : strncmp(s, "#/definitions/", 14) == 0 ? "definitions"
                                                              : NULL;
    const char *name = defs ? s + 3 + strlen(defs) : NULL;
    if (!defs || strchr(name, '/'))
        return err_set(TD_ENOTSUP,
                       "schema %s/$ref: only '#', '#/$defs/<name>' and '#/definitions/<name>' "
                       "are supported, not '%s'", c->path, s);
    char *dec = malloc(strlen(name) + 1);
    if (!dec)
        return jcc_nomem();
    size_t n = 0;
    for (const char *p = name; *p; p++) {
        if (*p == '~' && (p[1] == '0' || p[1] == '1')) {
            dec[n++] = p[1] == '0' ? '~' : '/';
            p++;
        } else if (*p == '~') {
            free(dec);
            return err_set(TD_EINVAL, "schema %s/$ref: bad escape in '%s'", c->path, s);
        } else {
            dec[n++] = *p;
        }
    }
    json_t *table = json_object_get(c->root, defs);
    json_t *target = json_is_object(table) ? json_object_getn(table, dec, n) : NULL;
    free(dec);
    if (!target)
        return err_set(TD_EINVAL, "schema %s/$ref: no definition '%s'", c->path, s);
    return jcc_queue(c, target, s, out);
}

/* anyOf / oneOf / allOf / $ref: a union, restricted to `mask` once everything is built. */
static td_err jcc_union(jcc *c, json_t *j, const char *kw, jcc_node *x, int depth)
{
    json_t *v = json_object_get(j, kw);
    jc_node *n = &x->n;
    n->kind = JN_UNION;
    if (strcmp(kw, "$ref") == 0) {
        uint16_t target;
        TD_TRY(jcc_ref(c, v, &target));
        TD_TRY(jcc_grow((void **)&c->br, &c->cap_br, c->n_br + 1, sizeof *c->br));
        n->first = c->n_br;
        n->n = 1;
        c->br[c->n_br++] = target;
        return TD_OK;
    }
    if (!json_is_array(v) || json_array_size(v) == 0)
        return err_set(TD_EINVAL, "schema %s/%s: must be a non-empty array of schemas", c->path,
                       kw);
    if (strcmp(kw, "allOf") == 0 && json_array_size(v) > 1)
        return err_set(TD_ENOTSUP, "schema %s/allOf: %zu subschemas (only one is supported)",
                       c->path, json_array_size(v));
    if (json_array_size(v) > JC_BRANCHES_MAX)
        return err_set(TD_ENOTSUP, "schema %s/%s: more than %d subschemas", c->path, kw,
                       JC_BRANCHES_MAX);
    return jcc_schema_list(c, v, kw, depth, &n->first, &n->n);
}

/* $defs / definitions anywhere are compiled too, so that a broken one is reported. */
static td_err jcc_defs(jcc *c, json_t *j)
{
    static const char *const tables[] = {"$defs", "definitions"};
    for (size_t t = 0; t < 2; t++) {
        json_t *defs = json_object_get(j, tables[t]);
        if (!defs)
            continue;
        if (!json_is_object(defs))
            return err_set(TD_EINVAL, "schema %s/%s: must be an object", c->path, tables[t]);
        for (void *it = json_object_iter(defs); it; it = json_object_iter_next(defs, it)) {
            json_t *v = json_object_iter_value(it);
            size_t old = jcc_path_push(c, tables[t], strlen(tables[t]));
            jcc_path_push(c, json_object_iter_key(it), json_object_iter_key_len(it));
            uint16_t node;
            td_err e = jcc_queue(c, v, c->path, &node);
            jcc_path_pop(c, old);
            TD_TRY(e);
        }
    }
    return TD_OK;
}

/* Fills node idx from the schema j found at c->path. */
static td_err jcc_schema(jcc *c, json_t *j, uint16_t idx, int depth)
{
    if (json_is_boolean(j)) {
        c->nodes[idx].n.types = json_is_true(j) ? JT_ALL : 0;
        return TD_OK;
    }
    if (!json_is_object(j))
        return err_set(TD_EINVAL, "schema %s: must be an object or a boolean", c->path);
    if (depth > JCC_NEST_MAX)
        return err_set(TD_ENOTSUP, "schema %s: nested deeper than %d levels", c->path,
                       JCC_NEST_MAX);
    for (size_t i = 0; i < sizeof jcc_refused / sizeof jcc_refused[0]; i++) {
        json_t *v = json_object_get(j, jcc_refused[i]);
        if (v && !(json_is_false(v) && strcmp(jcc_refused[i], "uniqueItems") == 0))
            return err_set(TD_ENOTSUP, "schema %s/%s: keyword '%s' is not enforced", c->path,
                           jcc_refused[i], jcc_refused[i]);
    }
    TD_TRY(jcc_defs(c, j));
    const char *comb = NULL;
    for (size_t i = 0; i < sizeof jcc_combinators / sizeof jcc_combinators[0]; i++) {
        if (!json_object_get(j, jcc_combinators[i]))
            continue;
        if (comb)
            return err_set(TD_ENOTSUP, "schema %s: '%s' together with '%s' is not supported",
                           c->path, comb, jcc_combinators[i]);
        comb = jcc_combinators[i];
    }
    for (size_t i = 0; comb && i < sizeof jcc_local / sizeof jcc_local[0]; i++)
        if (json_object_get(j, jcc_local[i]))
            return err_set(TD_ENOTSUP, "schema %s: '%s' beside '%s' is not supported", c->path,
                           jcc_local[i], comb);
    uint8_t mask;
    TD_TRY(jcc_type(c, j, &mask));

    json_t *en = json_object_get(j, "enum"), *cn = json_object_get(j, "const");
    uint16_t body = idx;
    if (en || cn) {
        if (en && (!json_is_array(en) || json_array_size(en) == 0))
            return err_set(TD_EINVAL, "schema %s/enum: must be a non-empty array", c->path);
        json_t *vals = json_array();
        if (!vals)
            return jcc_nomem();
        c->nodes[idx].vals = vals;
        for (size_t i = 0; i < (en ? json_array_size(en) : 1); i++) {
            json_t *v = en ? json_array_get(en, i) : cn;
            if ((!cn || json_equal(v, cn)) && json_array_append(vals, v) != 0)
                return jcc_nomem();
        }
        if (json_array_size(vals) > JCC_LITS_MAX)
            return err_set(TD_ENOTSUP, "schema %s/enum: more than %d values", c->path,
                           JCC_LITS_MAX);
        c->nodes[idx].n.kind = JN_LIT;
        TD_TRY(jcc_node_new(c, c->path, &body));
        c->nodes[idx].base = body;
    }
    jcc_node *x = &c->nodes[body];
    if (comb) {
        x->mask = mask;
        return jcc_union(c, j, comb, x, depth);
    }
    TD_TRY(jcc_bounds(c, j, &x->n, &mask));
    x->n.types = mask;
    TD_TRY(jcc_count(c, j, "minLength", &x->n.min_len));
    TD_TRY(jcc_count(c, j, "maxLength", &x->n.max_len));
    x->n.has_len = x->n.min_len > 0 || x->n.max_len != UINT32_MAX;
    TD_TRY(jcc_pattern(c, j, &x->n));
    TD_TRY(jcc_object(c, j, &x->n, depth));
    return jcc_array(c, j, &x->n, depth);
}

/* --- driver ----------------------------------------------------------------------------------- */

static td_err jcc_run(jcc *c, const char *schema, size_t len, jc_schema *s)
{
    c->nodes = calloc(JC_NODES_MAX, sizeof *c->nodes);
    c->queue = calloc(JC_NODES_MAX, sizeof *c->queue);
    c->memo = calloc(JCC_MEMO_SLOTS, sizeof *c->memo);
    if (!c->nodes || !c->queue || !c->memo)
        return jcc_nomem();
    uint16_t none = 0, any = 0, root = 0;
    TD_TRY(jcc_node_new(c, "#", &none));
    TD_TRY(jcc_node_new(c, "#", &any));
    c->nodes[none].n.types = 0;
    if (!schema) { /* json_object mode: an object, any content */
        TD_TRY(jcc_node_new(c, "#", &root));
        c->nodes[root].n.types = JT_OBJ;
    } else {
        json_error_t je;
        c->root = json_loadb(schema, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!c->root)
            return err_set(TD_EINVAL, "schema: invalid JSON at line %d column %d: %s", je.line,
                           je.column, je.text);
        TD_TRY(jcc_queue(c, c->root, "#", &root));
        for (uint32_t q = 0; q < c->n_queue; q++) {
            jcc_node *x = &c->nodes[c->queue[q]];
            snprintf(c->path, sizeof c->path, "%s", x->ptr);
            c->path_len = strlen(c->path);
            json_t *src = x->src;
            x->src = NULL;
            TD_TRY(jcc_schema(c, src, c->queue[q], 0));
        }
    }
    return jcc_finish(c, root, s);
}

td_err jc_compile(const char *schema, size_t len, jc_schema **out)
{
    return jc_compile_ws(schema, len, false, out);
}

td_err jc_compile_ws(const char *schema, size_t len, bool compact, jc_schema **out)
{
    *out = NULL;
    jcc *c = calloc(1, sizeof *c);
    jc_schema *s = calloc(1, sizeof *s);
    if (!c || !s) {
        free(c);
        free(s);
        return jcc_nomem();
    }
    td_err e = jcc_run(c, schema, len, s);
    for (uint32_t i = 0; c->nodes && i < c->n_nodes; i++) {
        json_decref(c->nodes[i].vals);
        free(c->nodes[i].ptr);
    }
    free(c->nodes);
    free(c->queue);
    free(c->memo);
    free(c->props);
    free(c->br);
    free(c->pool);
    free(c->ne);
    for (uint32_t i = 0; i < c->n_pats; i++)
        gm_dfa_free(c->pats[i]);
    free(c->pats);
    json_decref(c->root);
    free(c);
    if (e != TD_OK) {
        jc_schema_free(s);
        return e;
    }
    s->ws_max = compact ? 0 : JC_WS_MAX;
    *out = s;
    return TD_OK;
}

void jc_schema_free(jc_schema *s)
{
    if (!s)
        return;
    free(s->nodes);
    free(s->names);
    free(s->prop_nodes);
    free(s->lits);
    free(s->leaves);
    free(s->prefix);
    free(s->pool);
    for (uint32_t i = 0; i < s->n_pats; i++)
        gm_dfa_free(s->pats[i]);
    free(s->pats);
    free(s);
}
