/* Structured output: what a vocabulary is to the matchers, built once per model
 * (verifyd/constrain.h): token bytes, the sets of plain tokens, and byte tries. */
#include <stdlib.h>
#include <string.h>

#include "verifyd/constrain_int.h"

/* Whole UTF-8 characters (Unicode's well-formed sequences), every byte >= 0x20, no '"' or
 * '\\': what jc_free_string promises to accept without a change. */
static bool cst_plain_bytes(const uint8_t *b, size_t n)
{
    size_t i = 0;
    while (i < n) {
        const uint8_t c = b[i];
        if (c < 0x20 || c == '"' || c == '\\')
            return false;
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint8_t lo = 0x80, hi = 0xbf; /* the second byte's range */
        if (c >= 0xc2 && c <= 0xdf)
            k = 2;
        else if (c >= 0xe0 && c <= 0xef) {
            k = 3;
            lo = c == 0xe0 ? 0xa0 : 0x80;
            hi = c == 0xed ? 0x9f : 0xbf;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 4;
            lo = c == 0xf0 ? 0x90 : 0x80;
            hi = c == 0xf4 ? 0x8f : 0xbf;
        } else
            return false;
        if (n - i < k || b[i + 1] < lo || b[i + 1] > hi)
            return false;
        for (size_t j = 2; j < k; j++)
            if (b[i + j] < 0x80 || b[i + j] > 0xbf)
                return false;
        i += k;
    }
    return true;
}

typedef struct cst_entry {
    const uint8_t *p;
    uint32_t n;
    int32_t id;
} cst_entry;

/* Byte order, a prefix before what extends it, then ids: the order a trie is built in. */
static int cst_entry_cmp(const void *a, const void *b)
{
    const cst_entry *x = a, *y = b;
    const uint32_t m = x->n < y->n ? x->n : y->n;
    const int c = m ? memcmp(x->p, y->p, m) : 0;
    if (c)
        return c;
    if (x->n != y->n)
        return x->n < y->n ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static void cst_trie_free(cst_trie *tr)
{
    free(tr->byte);
    free(tr->child);
    free(tr->sibling);
    free(tr->tok);
    memset(tr, 0, sizeof *tr);
}

/* The trie of e [n] (sorted by cst_entry_cmp). With chain, tokens of equal bytes are linked
 * in same_next (the first one is the node's token either way). */
static td_err cst_trie_build(cst_trie *tr, const cst_entry *e, int32_t n, int32_t *same_next,
                             bool chain)
{
    memset(tr, 0, sizeof *tr);
    size_t cap = 1, depth = 0;
    for (int32_t i = 0; i < n; i++) {
        cap += e[i].n;
        depth = e[i].n > depth ? e[i].n : depth;
    }
    if (cap > INT32_MAX)
        return err_set(TD_ENOTSUP, "a vocabulary of %zu token bytes", cap);
    tr->byte = malloc(cap);
    tr->child = malloc(cap * sizeof(int32_t));
    tr->sibling = malloc(cap * sizeof(int32_t));
    tr->tok = malloc(cap * sizeof(int32_t));
    int32_t *path = malloc((depth + 1) * sizeof(int32_t)); /* node at each depth of e[i - 1] */
    if (!tr->byte || !tr->child || !tr->sibling || !tr->tok || !path) {
        free(path);
        cst_trie_free(tr);
        return err_set(TD_ENOMEM, "out of memory for a vocabulary trie of %zu nodes", cap);
    }
    int32_t nn = 1;
    tr->byte[0] = 0;
    tr->child[0] = tr->sibling[0] = tr->tok[0] = -1;
    path[0] = 0;
    int32_t last_end = -1; /* node where e[i - 1] ended */
    for (int32_t i = 0; i < n; i++) {
        uint32_t common = 0, prev_n = i ? e[i - 1].n : 0;
        while (i && common < prev_n && common < e[i].n && e[i - 1].p[common] == e[i].p[common])
            common++;
        for (uint32_t d = common; d < e[i].n; d++) {
            const int32_t node = nn++;
            tr->byte[node] = e[i].p[d];
            tr->child[node] = tr->sibling[node] = tr->tok[node] = -1;
            /* Sorted input: a new child of path[d] comes after all its children so far, and the
             * last of them is on e[i - 1]'s path (when e[i - 1] went below path[d]). */
            if (d == common && d < prev_n)
                tr->sibling[path[d + 1]] = node;
            else
                tr->child[path[d]] = node;
            path[d + 1] = node;
        }
        const int32_t end = path[e[i].n];
        if (tr->tok[end] < 0) {
            tr->tok[end] = e[i].id;
        } else if (chain) {
            TD_ASSERT(end == last_end);
            same_next[e[i - 1].id] = e[i].id;
        }
        last_end = end;
    }
    free(path);
    tr->n_nodes = nn;
    tr->depth = (int32_t)depth;
    return TD_OK;
}

void cst_vocab_free(cst_vocab *v)
{
    free(v->bytes);
    free(v->off);
    free(v->same_next);
    free(v->normal);
    free(v->plain);
    free(v->plain_nolt);
    free(v->eog);
    cst_trie_free(&v->all);
    cst_trie_free(&v->other);
    cst_trie_free(&v->plain_lt);
    memset(v, 0, sizeof *v);
}

td_err cst_vocab_init(cst_vocab *v, const tokenizer *t, int64_t n_vocab)
{
    memset(v, 0, sizeof *v);
    TD_ASSERT(t && n_vocab >= 1 && n_vocab < INT32_MAX);
    const int64_t nt = (int64_t)tok_n_vocab(t) < n_vocab ? (int64_t)tok_n_vocab(t) : n_vocab;
    size_t total = 0;
    for (int64_t i = 0; i < nt; i++)
        total += tok_bytes_of(t, (int32_t)i).len;
    if (total > UINT32_MAX)
        return err_set(TD_ENOTSUP, "a vocabulary of %zu token bytes", total);
    v->n_vocab = n_vocab;
    v->words = OPS_MASK_WORDS(n_vocab);
    v->bytes = malloc(total ? total : 1);
    v->off = malloc((size_t)(n_vocab + 1) * sizeof *v->off);
    v->same_next = malloc((size_t)n_vocab * sizeof *v->same_next);
    v->normal = calloc((size_t)v->words, sizeof *v->normal);
    v->plain = calloc((size_t)v->words, sizeof *v->plain);
    v->plain_nolt = calloc((size_t)v->words, sizeof *v->plain_nolt);
    v->eog = calloc((size_t)v->words, sizeof *v->eog);
    cst_entry *all = malloc((size_t)(nt ? nt : 1) * sizeof *all);
    cst_entry *other = malloc((size_t)(nt ? nt : 1) * sizeof *other);
    cst_entry *lt = malloc((size_t)(nt ? nt : 1) * sizeof *lt);
    if (!v->bytes || !v->off || !v->same_next || !v->normal || !v->plain || !v->plain_nolt ||
        !v->eog || !all || !other || !lt) {
        free(all);
        free(other);
        free(lt);
        cst_vocab_free(v);
        return err_set(TD_ENOMEM, "out of memory for the vocabulary's structured-output tables");
    }
    size_t at = 0;
    int32_t n_all = 0, n_other = 0, n_lt = 0;
    for (int64_t i = 0; i < n_vocab; i++) {
        v->off[i] = (uint32_t)at;
        v->same_next[i] = -1;
        if (i >= nt)
            continue;
        const tok_str s = tok_bytes_of(t, (int32_t)i);
        memcpy(v->bytes + at, s.ptr, s.len);
        const cst_entry e = {v->bytes + at, (uint32_t)s.len, (int32_t)i};
        at += s.len;
        if (tok_is_eog(t, (int32_t)i))
            cst_set(v->eog, i);
        if (tok_type_of(t, (int32_t)i) != TOK_TYPE_NORMAL || s.len == 0)
            continue;
        cst_set(v->normal, i);
        all[n_all++] = e;
        if (!cst_plain_bytes(e.p, e.n)) {
            other[n_other++] = e;
            continue;
        }
        cst_set(v->plain, i);
        if (memchr(e.p, '<', e.n))
            lt[n_lt++] = e;
        else
            cst_set(v->plain_nolt, i);
    }
    v->off[n_vocab] = (uint32_t)at;
    v->call_open = tok_id_of(t, "<tool_call>", 11);
    v->call_close = tok_id_of(t, "</tool_call>", 12);
    qsort(all, (size_t)n_all, sizeof *all, cst_entry_cmp);
    qsort(other, (size_t)n_other, sizeof *other, cst_entry_cmp);
    qsort(lt, (size_t)n_lt, sizeof *lt, cst_entry_cmp);
    td_err e = cst_trie_build(&v->all, all, n_all, v->same_next, true);
    if (e == TD_OK)
        e = cst_trie_build(&v->other, other, n_other, v->same_next, false);
    if (e == TD_OK)
        e = cst_trie_build(&v->plain_lt, lt, n_lt, v->same_next, false);
    free(all);
    free(other);
    free(lt);
    if (e != TD_OK)
        cst_vocab_free(v);
    return e;
}

