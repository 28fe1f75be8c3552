/* BPE over one pre-tokenised piece, exactly as Hugging Face's BPE model merges a word: start
 * from one symbol per byte (the token of its byte-alphabet character), then repeatedly merge
 * the adjacent pair with the lowest merge rank, leftmost first among equal ranks, using a
 * heap of candidate pairs whose stale entries are skipped when popped. O(n log n) per piece,
 * so a 100 kB run of one script without spaces stays fast. */
#include <stdlib.h>
#include <string.h>

#include "common/tok_internal.h"

enum {
    TOK_CACHE_SLOTS = 1u << 15,       /* entries (half may be used before a reset) */
    TOK_CACHE_ARENA = 4u << 20,       /* bytes of keys and ids */
    TOK_CACHE_MAX_PIECE = 256,        /* longer pieces are rare and not cached */
    TOK_STACK_SYMS = 128,             /* pieces up to this many bytes need no malloc */
};

typedef struct tok_sym {
    int32_t id;   /* token; -1 once merged into the symbol on its left */
    int32_t prev; /* index of the previous live symbol, -1 at the start */
    int32_t next; /* index of the next live symbol, -1 at the end */
} tok_sym;

typedef struct tok_cand {
    uint32_t rank; /* merge rank: lowest first */
    uint32_t pos;  /* left symbol index: leftmost first among equal ranks */
    int32_t id;    /* token the merge makes, to recognise stale entries */
} tok_cand;

static bool tok_cand_less(tok_cand a, tok_cand b)
{
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static void tok_heap_push(tok_cand *h, size_t *n, tok_cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!tok_cand_less(c, h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static tok_cand tok_heap_pop(tok_cand *h, size_t *n)
{
    tok_cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && tok_cand_less(h[c + 1], h[c]))
            c++;
        if (!tok_cand_less(h[c], last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

static const toki_merge *tok_merge_find(const tokenizer *t, int32_t left, int32_t right)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint32_t mask = t->merges.cap - 1;
    for (uint32_t i = (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & mask;; i = (i + 1) & mask) {
        const toki_merge *m = &t->merges.slots[i];
        if (m->key == key)
            return m;
        if (m->key == UINT64_MAX)
            return NULL;
    }
}

static void tok_cand_add(const tokenizer *t, const tok_sym *sym, int32_t pos, tok_cand *h, size_t *nh)
{
    int32_t next = sym[pos].next;
    if (next < 0)
        return;
    const toki_merge *m = tok_merge_find(t, sym[pos].id, sym[next].id);
    if (m)
        tok_heap_push(h, nh, (tok_cand){m->rank, (uint32_t)pos, m->id});
}

/* Merges s[0..n) into symbols; appends the resulting ids. */
static td_err tok_bpe_run(const tokenizer *t, const uint8_t *s, size_t n, tok_ids *out)
{
    tok_sym sym_stack[TOK_STACK_SYMS];
    tok_cand heap_stack[3 * TOK_STACK_SYMS];
    tok_sym *sym = sym_stack;
    tok_cand *heap = heap_stack;
    if (n > TOK_STACK_SYMS) {
        sym = malloc(n * sizeof *sym);
        heap = malloc(3 * n * sizeof *heap); /* n-1 pairs, then at most 2 per merge */
        if (!sym || !heap) {
            free(sym);
            free(heap);
            return err_set(TD_ENOMEM, "tokenizer: piece of %zu bytes", n);
        }
    }
    /* A byte whose character is not a token: the unknown token when there is one, else the
     * byte is dropped (Hugging Face's BPE without unk_token does the same). */
    int32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_tok[s[i]];
        if (id < 0)
            id = t->sp.unk;
        if (id < 0)
            continue;
        sym[m] = (tok_sym){id, m - 1, -1};
        if (m > 0)
            sym[m - 1].next = m;
        m++;
    }
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < m; i++)
        tok_cand_add(t, sym, i, heap, &nh);
    while (nh) {
        tok_cand c = tok_heap_pop(heap, &nh);
        tok_sym *a = &sym[c.pos];
        if (a->id < 0 || a->next < 0)
            continue;
        const toki_merge *mg = tok_merge_find(t, a->id, sym[a->next].id);
        if (!mg || mg->id != c.id)
            continue; /* stale: a neighbour changed since this candidate was queued */
        int32_t b = a->next;
        a->id = c.id;
        a->next = sym[b].next;
        sym[b].id = -1;
        if (a->next >= 0)
            sym[a->next].prev = (int32_t)c.pos;
        if (a->prev >= 0)
            tok_cand_add(t, sym, a->prev, heap, &nh);
        tok_cand_add(t, sym, (int32_t)c.pos, heap, &nh);
    }
    td_err e = TD_OK;
    for (int32_t i = m ? 0 : -1; i >= 0 && e == TD_OK; i = sym[i].next)
        e = toki_ids_push(out, sym[i].id);
    if (sym != sym_stack) {
        free(sym);
        free(heap);
    }
    return e;
}

/* --- word cache ----------------------------------------------------------------------- */

td_err toki_cache_init(toki_cache **out)
{
    toki_cache *c = calloc(1, sizeof *c);
    if (!c)
        return err_set(TD_ENOMEM, "tokenizer: word cache");
    c->cap = TOK_CACHE_SLOTS;
    c->arena_cap = TOK_CACHE_ARENA;
    c->slots = calloc(c->cap, sizeof *c->slots);
    c->arena = malloc(c->arena_cap);
    if (!c->slots || !c->arena || pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c->slots);
        free(c->arena);
        free(c);
        return err_set(TD_ENOMEM, "tokenizer: word cache");
    }
    *out = c;
    return TD_OK;
}

void toki_cache_free(toki_cache *c)
{
    if (!c)
        return;
    pthread_mutex_destroy(&c->mu);
    free(c->slots);
    free(c->arena);
    free(c);
}

/* Slot of the piece, or of the empty slot where it would go. Caller holds mu. */
static toki_cache_entry *tok_cache_slot(toki_cache *c, uint64_t h, const uint8_t *s, size_t n)
{
    uint32_t mask = c->cap - 1;
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        toki_cache_entry *e = &c->slots[i];
        if (e->hash == 0 || (e->hash == h && e->key_len == n && memcmp(c->arena + e->key, s, n) == 0))
            return e;
    }
}

static bool tok_cache_get(toki_cache *c, uint64_t h, const uint8_t *s, size_t n, tok_ids *out, td_err *err)
{
    pthread_mutex_lock(&c->mu);
    toki_cache_entry *e = tok_cache_slot(c, h, s, n);
    bool hit = e->hash != 0;
    *err = TD_OK;
    if (hit) {
        const int32_t *ids = (const int32_t *)(void *)(c->arena + e->ids);
        for (uint32_t i = 0; i < e->n_ids && *err == TD_OK; i++)
            *err = toki_ids_push(out, ids[i]);
    }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

static void tok_cache_put(toki_cache *c, uint64_t h, const uint8_t *s, size_t n, const int32_t *ids, size_t n_ids)
{
    size_t key_at, ids_at, need;
    pthread_mutex_lock(&c->mu);
    key_at = c->arena_len;
    ids_at = (key_at + n + 3) & ~(size_t)3;
    need = ids_at + n_ids * sizeof(int32_t);
    if (c->count >= c->cap / 2 || need > c->arena_cap) {
        memset(c->slots, 0, sizeof *c->slots * c->cap);
        c->count = 0;
        c->arena_len = 0;
        key_at = 0;
        ids_at = (n + 3) & ~(size_t)3;
        need = ids_at + n_ids * sizeof(int32_t);
    }
    toki_cache_entry *e = tok_cache_slot(c, h, s, n);
    if (e->hash == 0 && need <= c->arena_cap) {
        memcpy(c->arena + key_at, s, n);
        memcpy(c->arena + ids_at, ids, n_ids * sizeof(int32_t));
        *e = (toki_cache_entry){h, (uint32_t)key_at, (uint32_t)n, (uint32_t)ids_at, (uint32_t)n_ids};
        c->arena_len = (uint32_t)need;
        c->count++;
    }
    pthread_mutex_unlock(&c->mu);
}

td_err toki_bpe_piece(const tokenizer *t, const uint8_t *s, size_t n, tok_ids *out)
{
    if (n == 0)
        return TD_OK;
    if (n == 1) {
        int32_t id = t->byte_tok[s[0]] >= 0 ? t->byte_tok[s[0]] : t->sp.unk;
        return id >= 0 ? toki_ids_push(out, id) : TD_OK;
    }
    if (n > TOK_CACHE_MAX_PIECE)
        return tok_bpe_run(t, s, n, out);
    uint64_t h = toki_hash(s, n);
    td_err e;
    if (tok_cache_get(t->cache, h, s, n, out, &e))
        return e;
    size_t at = out->n;
    TD_TRY(tok_bpe_run(t, s, n, out));
    tok_cache_put(t->cache, h, s, n, out->ids + at, out->n - at);
    return TD_OK;
}
