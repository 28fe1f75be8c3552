/* Structured output: a generation's token masks from its matcher (JSON Schema, tool call,
 * grammar; verifyd/constrain.h), walked over the vocabulary's tries through a cache of the
 * matcher's transitions. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/hash.h"
#include "kernels/ops.h"
#include "verifyd/constrain_int.h"

static void cst_dfa_free(struct cst_dfa *f);

/* The matcher of the generation: the JSON schema's, the tool call's, the grammar's, or none. */
static void cst_copy(const cst_state *c, uint8_t *dst, const uint8_t *src)
{
    if (c->schema)
        jc_state_copy(c->schema, dst, src);
    else if (c->call)
        cm_state_copy(c->call, dst, src);
    else if (c->gram)
        gm_state_copy(c->gram, dst, src);
}

static bool cst_feed(const cst_state *c, uint8_t *st, const uint8_t *bytes, size_t n)
{
    return c->schema ? jc_feed(c->schema, st, bytes, n)
           : c->call ? cm_feed(c->call, st, bytes, n)
                     : gm_feed(c->gram, st, bytes, n);
}

static bool cst_done(const cst_state *c, const uint8_t *st)
{
    return c->schema ? jc_done(c->schema, st) : c->call ? cm_done(c->call, st)
                                                        : gm_done(c->gram, st);
}

void cst_compiled_free(cst_compiled *f)
{
    jc_schema_free(f->schema);
    cm_free(f->call);
    gm_free(f->gram);
    memset(f, 0, sizeof *f);
}

td_err cst_compile(const cst_cfg *cfg, const cst_vocab *v, cst_compiled *out)
{
    TD_ASSERT(cfg && out);
    memset(out, 0, sizeof *out);
    if (cfg->format == MSG_FORMAT_TEXT)
        return TD_OK;
    if (!v)
        return err_set(TD_ENOTSUP, "structured output needs the model's tokenizer, which its "
                       "file does not have");
    const int32_t ids[2] = {cfg->think_start, cfg->think_end};
    for (int k = 0; k < 2; k++)
        if (ids[k] < -1 || ids[k] >= v->n_vocab)
            return err_set(TD_EINVAL, "reasoning token %d: outside the vocabulary of %lld",
                           ids[k], (long long)v->n_vocab);
    if (cfg->think_end < 0 && (cfg->think_open || cfg->think_start >= 0))
        return err_set(TD_EINVAL, "a reasoning block with no token to end it");
    if (cfg->format == MSG_FORMAT_CHOICE || cfg->format == MSG_FORMAT_TAGS) {
        td_err e = cm_compile(cfg->schema, cfg->n_schema, &out->call);
        if (e != TD_OK)
            out->call = NULL;
        return e;
    }
    if (cfg->format == MSG_FORMAT_GRAMMAR || cfg->format == MSG_FORMAT_REGEX) {
        td_err e = cfg->format == MSG_FORMAT_GRAMMAR
                       ? gm_compile_grammar(cfg->schema, cfg->n_schema, &out->gram)
                       : gm_compile_regex(cfg->schema, cfg->n_schema, &out->gram);
        if (e != TD_OK)
            out->gram = NULL;
        return e;
    }
    if (cfg->format == MSG_FORMAT_TOOL_CALL || cfg->format == MSG_FORMAT_TOOLS) {
        if (v->call_open < 0 || v->call_close < 0)
            return err_set(TD_ENOTSUP, "matching tool calls needs the model's <tool_call> and "
                           "</tool_call> tokens, which its vocabulary does not have");
        if (cfg->format == MSG_FORMAT_TOOLS && cfg->n_schema == 0)
            return err_set(TD_EINVAL, "the tools format needs a tool spec");
        td_err e = cfg->n_schema ? cm_compile(cfg->schema, cfg->n_schema, &out->call) : TD_OK;
        if (e != TD_OK)
            out->call = NULL;
        return e;
    }
    const bool schema = cfg->format == MSG_FORMAT_JSON_SCHEMA ||
                        cfg->format == MSG_FORMAT_JSON_SCHEMA_COMPACT;
    const bool compact = cfg->format == MSG_FORMAT_JSON_OBJECT_COMPACT ||
                         cfg->format == MSG_FORMAT_JSON_SCHEMA_COMPACT;
    td_err e = jc_compile_ws(schema ? cfg->schema : NULL, schema ? cfg->n_schema : 0, compact,
                             &out->schema);
    if (e != TD_OK)
        out->schema = NULL;
    return e;
}

td_err cst_init(cst_state *c, const cst_cfg *cfg, const cst_vocab *v, int64_t block)
{
    memset(c, 0, sizeof *c);
    TD_ASSERT(cfg && block >= 1);
    if (cfg->format == MSG_FORMAT_TEXT)
        return TD_OK;
    const bool call = cfg->format == MSG_FORMAT_TOOL_CALL || cfg->format == MSG_FORMAT_TOOLS;
    if (cfg->compiled) { /* the caller's: cst_free leaves it */
        c->schema = cfg->compiled->schema;
        c->call = cfg->compiled->call;
        c->gram = cfg->compiled->gram;
    } else {
        cst_compiled f;
        TD_TRY(cst_compile(cfg, v, &f));
        c->schema = f.schema;
        c->call = f.call;
        c->gram = f.gram;
        c->own_schema = true;
    }
    c->on = true;
    c->v = v;
    c->block = block;
    c->answer = cfg->format == MSG_FORMAT_TOOLS ? CST_FREE : call ? CST_CALL : CST_DOC;
    /* states stay aligned in arrays; a byte for the memo key's phase without a schema */
    c->size = c->call     ? cm_state_size(c->call)
              : c->gram   ? gm_state_size(c->gram)
              : call      ? 8
                          : (jc_state_size(c->schema) + 7) & ~(size_t)7;
    c->think_start = cfg->think_start;
    c->think_end = cfg->think_end;
    c->think_open = cfg->think_open;
    const int32_t depth = v->all.depth;
    c->cur = malloc(c->size);
    c->rows = malloc((size_t)block * c->size);
    c->row_phase = malloc((size_t)block * sizeof *c->row_phase);
    c->walk = malloc((size_t)(depth + 2) * c->size); /* also the memo key's scratch */
    c->walk_node = malloc((size_t)(depth + 1) * sizeof *c->walk_node);
    c->host = malloc((size_t)(block * v->words) * sizeof *c->host);
    bool ok = c->cur && c->rows && c->row_phase && c->walk && c->walk_node && c->host;
    for (int i = 0; ok && i < CST_MEMO; i++) {
        c->memo[i].key = malloc(1 + c->size);
        c->memo[i].mask = malloc((size_t)v->words * sizeof(uint32_t));
        ok = c->memo[i].key && c->memo[i].mask;
    }
    if (!ok) {
        cst_free(c, NULL);
        return err_set(TD_ENOMEM, "out of memory for a structured-output state");
    }
    c->dfa.cap = CST_DFA_STATES;
    c->budget_s = CST_MASK_BUDGET_S;
    cst_reset(c);
    return TD_OK;
}

void cst_free(cst_state *c, const ops_backend *be)
{
    if (be && c->dev)
        be->release(be, c->dev);
    if (c->own_schema) {
        jc_schema_free(c->schema);
        cm_free(c->call);
        gm_free(c->gram);
    }
    free(c->cur);
    free(c->rows);
    free(c->row_phase);
    free(c->walk);
    free(c->walk_node);
    cst_dfa_free(&c->dfa);
    free(c->host);
    for (int i = 0; i < CST_MEMO; i++) {
        free(c->memo[i].key);
        free(c->memo[i].mask);
    }
    memset(c, 0, sizeof *c);
}

void cst_reset(cst_state *c)
{
    if (!c->on)
        return;
    if (c->schema)
        jc_state_init(c->schema, c->cur);
    else if (c->call)
        cm_state_init(c->call, c->cur);
    else if (c->gram)
        gm_state_init(c->gram, c->cur);
    c->phase = c->answer == CST_FREE  ? CST_FREE /* calls anywhere, the rest untouched */
               : c->think_open        ? CST_THINK
               : c->think_start >= 0  ? CST_OPEN
                                      : c->answer;
}

/* One token after (phase, st), in place; false when the format does not allow it (then
 * both are unspecified). */
static bool cst_advance(const cst_state *c, cst_phase *phase, uint8_t *st, int32_t tok)
{
    const cst_vocab *v = c->v;
    if (tok < 0 || tok >= v->n_vocab)
        return false;
    switch (*phase) {
    case CST_THINK:
        if (tok == c->think_end)
            *phase = c->answer;
        return !cst_bit(v->eog, tok);
    case CST_END:
        return cst_bit(v->eog, tok);
    case CST_OPEN:
        if (tok == c->think_start) {
            *phase = CST_THINK;
            return true;
        }
        *phase = c->answer;
        if (c->answer == CST_CALL)
            return cst_advance(c, phase, st, tok);
        break;
    case CST_CALL:
        *phase = CST_IN_CALL;
        return tok == v->call_open;
    case CST_IN_CALL:
        if (tok == v->call_close) {
            *phase = CST_FREE;
            return !c->call || cm_done(c->call, st);
        }
        if (!c->call)
            return !cst_bit(v->eog, tok);
        return cst_bit(v->normal, tok) &&
               cm_feed(c->call, st, v->bytes + v->off[tok], v->off[tok + 1] - v->off[tok]);
    case CST_FREE:
        if (c->call && tok == v->call_open) { /* a call opens: its body is matched */
            *phase = CST_IN_CALL;
            cm_state_init(c->call, st);
        }
        return true;
    case CST_DOC:
        break;
    }
    if (cst_bit(v->eog, tok)) {
        *phase = CST_END;
        return cst_done(c, st);
    }
    return cst_bit(v->normal, tok) &&
           cst_feed(c, st, v->bytes + v->off[tok], v->off[tok + 1] - v->off[tok]);
}

static uint64_t cst_hash(const uint8_t *p, size_t n)
{
    return td_hash(TD_HASH_SEED, p, n) | 1;
}

static double cst_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Counts a walk's trie nodes; true (and c->over set) once the mask has run past its time
 * budget, looked at every 4096 nodes. */
static bool cst_over(cst_state *c)
{
    if ((++c->nodes & 4095) != 0)
        return c->over;
    c->over = c->over || cst_now() > c->deadline;
    return c->over;
}

/* The tokens of trie tr whose bytes st accepts, into mask: state by state, each byte fed to
 * a copy (what the transition cache falls back on). */
static void cst_walk_bytes(cst_state *c, const cst_trie *tr, const uint8_t *st, uint32_t *mask)
{
    const size_t sz = c->size;
    uint8_t *S = c->walk; /* S + d * sz: the state after the path's first d bytes */
    cst_copy(c, S, st);
    int32_t d = 0, node = tr->child[0];
    for (;;) {
        if (node < 0) {
            if (d == 0)
                return;
            node = tr->sibling[c->walk_node[--d]];
            continue;
        }
        if (cst_over(c))
            return;
        uint8_t *next = S + (size_t)(d + 1) * sz;
        cst_copy(c, next, S + (size_t)d * sz);
        if (cst_feed(c, next, &tr->byte[node], 1)) {
            for (int32_t t = tr->tok[node]; t >= 0; t = c->v->same_next[t])
                cst_set(mask, t);
            if (tr->child[node] >= 0) {
                c->walk_node[d++] = node;
                node = tr->child[node];
                continue;
            }
        }
        node = tr->sibling[node];
    }
}

enum { CST_DFA_UNKNOWN = -1, CST_DFA_REFUSED = -2, CST_DFA_FULL = -3 };

/* st's canonical bytes into key (equal futures where equal bytes): the matcher's live bytes
 * (JSON, grammar), or for a tool call the whole state after a copy into zeros; their count. */
static size_t cst_canon(const cst_state *c, uint8_t *key, const uint8_t *st)
{
    if (c->schema) {
        jc_state_copy(c->schema, key, st);
        return jc_state_used(key);
    }
    if (c->gram) {
        gm_state_copy(c->gram, key, st);
        return gm_state_used(key);
    }
    memset(key, 0, c->size);
    cst_copy(c, key, st);
    return c->size;
}

static void cst_dfa_free(struct cst_dfa *f)
{
    const int32_t cap = f->cap;
    free(f->blob);
    free(f->off);
    free(f->len);
    free(f->hash);
    free(f->next);
    free(f->slot);
    free(f->key);
    free(f->ids);
    memset(f, 0, sizeof *f);
    f->cap = cap;
}

static void cst_dfa_clear(struct cst_dfa *f)
{
    f->n = 0;
    f->blob_used = 0;
    memset(f->slot, 0xff, 2 * CST_DFA_STATES * sizeof *f->slot);
}

/* The id of state st (added when new); CST_DFA_FULL when the cache has no room. */
static int32_t cst_dfa_intern(cst_state *c, const uint8_t *st)
{
    struct cst_dfa *f = &c->dfa;
    const size_t len = cst_canon(c, f->key, st);
    const uint64_t h = cst_hash(f->key, len);
    uint32_t i = (uint32_t)h & (2 * CST_DFA_STATES - 1);
    for (; f->slot[i] >= 0; i = (i + 1) & (2 * CST_DFA_STATES - 1)) {
        const int32_t k = f->slot[i];
        if (f->hash[k] == h && f->len[k] == len && memcmp(f->blob + f->off[k], f->key, len) == 0)
            return k;
    }
    if (f->n >= f->cap || f->blob_used + len > CST_DFA_BYTES)
        return CST_DFA_FULL;
    const int32_t k = f->n++;
    memcpy(f->blob + f->blob_used, f->key, len);
    f->off[k] = (uint32_t)f->blob_used;
    f->len[k] = (uint32_t)len;
    f->hash[k] = h;
    f->blob_used += len;
    memset(f->next + (size_t)k * 256, 0xff, 256 * sizeof *f->next); /* all CST_DFA_UNKNOWN */
    f->slot[i] = k;
    return k;
}

/* The state after byte b from state k: a state, CST_DFA_REFUSED or CST_DFA_FULL. */
static int32_t cst_dfa_step(cst_state *c, int32_t k, uint8_t b)
{
    struct cst_dfa *f = &c->dfa;
    int32_t *t = &f->next[(size_t)k * 256 + b];
    if (*t != CST_DFA_UNKNOWN)
        return *t;
    uint8_t *S = c->walk; /* the byte walk's rows are free while the cache walks */
    memcpy(S, f->blob + f->off[k], f->len[k]);
    if (!cst_feed(c, S, &b, 1))
        return *t = CST_DFA_REFUSED;
    const int32_t n = cst_dfa_intern(c, S);
    if (n != CST_DFA_FULL)
        *t = n;
    return n;
}

/* cst_walk_bytes by the transition cache; false when the cache filled up (mask then holds a
 * part of the tokens). */
static bool cst_walk_dfa(cst_state *c, const cst_trie *tr, const uint8_t *st, uint32_t *mask)
{
    struct cst_dfa *f = &c->dfa;
    if (!f->next) {
        f->blob = malloc(CST_DFA_BYTES);
        f->off = malloc(CST_DFA_STATES * sizeof *f->off);
        f->len = malloc(CST_DFA_STATES * sizeof *f->len);
        f->hash = malloc(CST_DFA_STATES * sizeof *f->hash);
        f->slot = malloc(2 * CST_DFA_STATES * sizeof *f->slot);
        f->key = malloc(c->size);
        f->ids = malloc((size_t)(c->v->all.depth + 1) * sizeof *f->ids);
        f->next = malloc((size_t)CST_DFA_STATES * 256 * sizeof *f->next);
        if (!f->blob || !f->off || !f->len || !f->hash || !f->slot || !f->key || !f->ids ||
            !f->next) {
            cst_dfa_free(f);
            return false;
        }
        cst_dfa_clear(f);
    }
    int32_t *ids = f->ids;
    ids[0] = cst_dfa_intern(c, st);
    if (ids[0] < 0)
        return false;
    int32_t d = 0, node = tr->child[0];
    for (;;) {
        if (node < 0) {
            if (d == 0)
                return true;
            node = tr->sibling[c->walk_node[--d]];
            continue;
        }
        if (cst_over(c))
            return true;
        const int32_t k = cst_dfa_step(c, ids[d], tr->byte[node]);
        if (k == CST_DFA_FULL)
            return false;
        if (k >= 0) {
            for (int32_t t = tr->tok[node]; t >= 0; t = c->v->same_next[t])
                cst_set(mask, t);
            if (tr->child[node] >= 0) {
                c->walk_node[d++] = node;
                ids[d] = k;
                node = tr->child[node];
                continue;
            }
        }
        node = tr->sibling[node];
    }
}

/* The tokens of trie tr whose bytes st accepts, into mask: through the transition cache,
 * emptied and walked byte by byte when it fills up (or cannot be had). */
static void cst_walk(cst_state *c, const cst_trie *tr, const uint8_t *st, uint32_t *mask)
{
    if (cst_walk_dfa(c, tr, st, mask))
        return;
    if (c->dfa.next)
        cst_dfa_clear(&c->dfa);
    cst_walk_bytes(c, tr, st, mask);
}

/* The allowed set after (phase, st) into mask [words]; TD_ENOTSUP when its walk ran past
 * CST_MASK_BUDGET_S (a grammar whose matching is too costly). */
static td_err cst_mask_of(cst_state *c, cst_phase phase, const uint8_t *st, uint32_t *mask)
{
    const cst_vocab *v = c->v;
    const size_t W = (size_t)v->words;
    if (phase == CST_END) {
        memcpy(mask, v->eog, W * sizeof *mask);
        return TD_OK;
    }
    if (phase == CST_THINK || (phase == CST_IN_CALL && !c->call) || phase == CST_FREE) {
        for (size_t w = 0; w < W; w++)
            mask[w] = phase == CST_FREE ? ~0u : ~v->eog[w];
        return TD_OK;
    }
    if (c->answer == CST_CALL && phase != CST_IN_CALL) { /* CST_CALL, or CST_OPEN before it */
        memset(mask, 0, W * sizeof *mask);
        cst_set(mask, v->call_open);
        if (phase == CST_OPEN && c->think_start >= 0)
            cst_set(mask, c->think_start);
        return TD_OK;
    }
    /* the key: the state's bytes as the matcher's copy leaves them, then the phase */
    uint8_t *key = c->walk;
    memset(key, 0, c->size);
    cst_copy(c, key, st);
    key[c->size] = (uint8_t)phase;
    const uint64_t h = cst_hash(key, 1 + c->size);
    struct cst_memo *slot = &c->memo[0];
    for (int i = 0; i < CST_MEMO; i++) {
        struct cst_memo *m = &c->memo[i];
        if (m->hash == h && memcmp(m->key, key, 1 + c->size) == 0) {
            m->used = ++c->clock;
            memcpy(mask, m->mask, W * sizeof *mask);
            return TD_OK;
        }
        if (m->used < slot->used)
            slot = m;
    }
    memcpy(slot->key, key, 1 + c->size);
    slot->hash = 0; /* until the mask is whole */
    c->deadline = cst_now() + c->budget_s;
    c->over = false;
    c->nodes = 0;
    if (c->schema && jc_free_string(c->schema, st)) {
        memcpy(mask, v->plain, W * sizeof *mask);
        cst_walk(c, &v->other, st, mask);
    } else if (c->call && cm_free_text(c->call, st)) {
        memcpy(mask, v->plain_nolt, W * sizeof *mask);
        cst_walk(c, &v->other, st, mask);
        cst_walk(c, &v->plain_lt, st, mask);
    } else {
        memset(mask, 0, W * sizeof *mask);
        cst_walk(c, &v->all, st, mask);
    }
    if (c->over || cst_now() > c->deadline)
        return err_set(TD_ENOTSUP, "structured output: one token mask took more than %g s "
                       "(the format is too costly to match on this vocabulary)", c->budget_s);
    if (phase == CST_IN_CALL) { /* the call's body: its end token once whole */
        if (cst_done(c, st))
            cst_set(mask, v->call_close);
    } else if (cst_done(c, st)) {
        for (size_t w = 0; w < W; w++)
            mask[w] |= v->eog[w];
    }
    if (phase == CST_OPEN && c->think_start >= 0)
        cst_set(mask, c->think_start);
    slot->hash = h;
    slot->used = ++c->clock;
    memcpy(slot->mask, mask, W * sizeof *mask);
    return TD_OK;
}

int64_t cst_allowed(cst_state *c, const int32_t *drafts, int64_t n)
{
    if (!c->on || n <= 0)
        return n > 0 ? n : 0;
    uint8_t *st = c->rows;
    cst_phase ph = c->phase;
    cst_copy(c, st, c->cur);
    for (int64_t i = 0; i < n; i++)
        if (!cst_advance(c, &ph, st, drafts[i]))
            return i;
    return n;
}

td_err cst_apply(cst_state *c, const ops_backend *be, float *logits, const int32_t *drafts,
                 int64_t n)
{
    if (!c->on || n <= 0)
        return TD_OK;
    TD_ASSERT(n <= c->block && (n == 1 || drafts));
    const cst_vocab *v = c->v;
    const size_t sz = c->size, W = (size_t)v->words;
    cst_copy(c, c->rows, c->cur);
    c->row_phase[0] = c->phase;
    for (int64_t i = 1; i < n; i++) {
        c->row_phase[i] = c->row_phase[i - 1];
        cst_copy(c, c->rows + (size_t)i * sz, c->rows + (size_t)(i - 1) * sz);
        const bool ok = cst_advance(c, &c->row_phase[i], c->rows + (size_t)i * sz, drafts[i - 1]);
        TD_ASSERT(ok); /* the caller cut the block at cst_allowed */
    }
    bool all_free = true; /* outside any call (the tools format): nothing to mask */
    for (int64_t i = 0; i < n; i++)
        all_free = all_free && c->row_phase[i] == CST_FREE;
    if (all_free)
        return TD_OK;
    for (int64_t i = 0; i < n; i++)
        TD_TRY(cst_mask_of(c, c->row_phase[i], c->rows + (size_t)i * sz, c->host + (size_t)i * W));
    if (!c->dev)
        TD_TRY(be->alloc(be, &c->dev, (size_t)c->block * W * sizeof(uint32_t)));
    TD_TRY(be->to_device(be, c->dev, c->host, (size_t)n * W * sizeof(uint32_t)));
    return be->logit_mask(be, logits, n, v->n_vocab, (const uint32_t *)c->dev);
}

td_err cst_emit(cst_state *c, const int32_t *tok, int64_t n)
{
    if (!c->on)
        return TD_OK;
    uint8_t *st = c->rows;
    cst_phase ph = c->phase;
    cst_copy(c, st, c->cur);
    for (int64_t i = 0; i < n; i++)
        if (!cst_advance(c, &ph, st, tok[i]))
            return err_set(TD_EINVAL, "token %d does not continue the response format (no "
                           "token it allows had a finite logit)", tok[i]);
    cst_copy(c, c->cur, st);
    c->phase = ph;
    return TD_OK;
}

td_err cst_mask(cst_state *c, uint32_t *mask)
{
    TD_ASSERT(c->on);
    return cst_mask_of(c, c->phase, c->cur, mask);
}
