/* Forward passes of the target as recorded CUDA graphs: the ~1600 launches of a 27B decode
 * step become one replay. A recording holds the addresses of everything it touches, so it
 * is kept per (state arrays, scratch buffers, outputs, tokens, record, taps) and made again
 * when any of them changes; what changes every step (token ids, positions) is read from
 * device memory that tgt_forward fills before the replay, the number of keys attention reads
 * included (its launch is sized for the whole cache; splits past the count return at once),
 * so replay and direct run give the same bits (tests/test_gpu_graph.c). Which passes are
 * recorded, and which recording a new one replaces, is verifyd/graph_pick.h's choice: a pass
 * is recorded the second time it comes, so one that never repeats runs op by op. */
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/log.h"
#include "kernels/backend_prof.h"
#include "verifyd/graph_pick.h"
#include "verifyd/target_int.h"

typedef struct tgt_graph_key {
    uint64_t state_gen, work_gen;
    int64_t n_tok, delta_chunk;
    bool record, last_only;
    const float *logits, *tap_out;
    int64_t n_taps;
    uint64_t taps_hash;
} tgt_graph_key;

struct tgt_graphs {
    gp_table pick;                 /* which passes are recorded, and where */
    tgt_graph_key key[GP_SLOTS];   /* of each slot's recording */
    void *exec[GP_SLOTS];          /* the backend's recordings, NULL = none */
    bool failed;                   /* recording failed once: forward passes run op by op */
    tgt_graph_counts counts;
};

td_err tgt_graphs_init(tgt_model *m)
{
    const ops_backend *be = m->be;
    const char *env = getenv("TANDEM_GRAPHS");
    m->use_graphs = false;
    if (!be->graph_begin || (env && !strcmp(env, "0")))
        return TD_OK;
    m->graphs = calloc(1, sizeof *m->graphs);
    if (!m->graphs)
        return err_set(TD_ENOMEM, "out of memory for the recorded forward passes");
    m->use_graphs = true;
    /* a recording names the scratch: made for the longest pass at once, it does not move
     * (and leave every recording stale) when the first longer pass comes */
    return tgt_work_reserve(m, TGT_RESERVE_TOK, 0);
}

void tgt_graphs_forget(const tgt_model *m)
{
    if (!m->graphs)
        return;
    if (m->be->sync)
        (void)m->be->sync(m->be); /* no recording is freed while it runs */
    for (int i = 0; i < GP_SLOTS; i++) {
        if (m->graphs->exec[i])
            m->be->graph_free(m->be, m->graphs->exec[i]);
        m->graphs->exec[i] = NULL;
    }
    memset(&m->graphs->pick, 0, sizeof m->graphs->pick);
}

void tgt_graphs_free(tgt_model *m)
{
    tgt_graphs_forget(m);
    free(m->graphs);
    m->graphs = NULL;
}

bool tgt_graph_wanted(const tgt_model *m)
{
    return m->use_graphs && m->graphs && !m->graphs->failed && m->be->graph_begin &&
           !ops_prof_on(m->be);
}

void tgt_graph_stats(const tgt_model *m, tgt_graph_counts *c)
{
    static const tgt_graph_counts none;
    *c = m->graphs ? m->graphs->counts : none;
}

static tgt_graph_key tgt_key_of(const tgt_model *m, const tgt_state *s, int64_t n_tok,
                                bool record, const tgt_out *out)
{
    const int64_t n_taps = out ? out->n_taps : 0;
    tgt_graph_key key = {
        .state_gen = s->gen, .work_gen = tgt_work_gen(m), .n_tok = n_tok,
        .delta_chunk = m->delta_chunk, .record = record,
        .last_only = out && out->last_only, .logits = out ? out->logits : NULL,
        .tap_out = n_taps ? out->tap_out : NULL, .n_taps = n_taps,
        .taps_hash = n_taps ? td_hash(TD_HASH_SEED, out->taps, (size_t)n_taps * sizeof *out->taps)
                            : TD_HASH_SEED,
    };
    return key;
}

static uint64_t tgt_key_hash(const tgt_graph_key *k)
{
    const uint64_t f[] = {k->state_gen, k->work_gen, (uint64_t)k->n_tok, (uint64_t)k->delta_chunk,
                          (uint64_t)k->record << 1 | (uint64_t)k->last_only,
                          (uint64_t)(uintptr_t)k->logits, (uint64_t)(uintptr_t)k->tap_out,
                          (uint64_t)k->n_taps, k->taps_hash};
    return td_hash(TD_HASH_SEED, f, sizeof f);
}

static bool tgt_key_eq(const tgt_graph_key *a, const tgt_graph_key *b)
{
    return a->state_gen == b->state_gen && a->work_gen == b->work_gen && a->n_tok == b->n_tok &&
           a->delta_chunk == b->delta_chunk && a->record == b->record &&
           a->last_only == b->last_only && a->logits == b->logits &&
           a->tap_out == b->tap_out && a->n_taps == b->n_taps && a->taps_hash == b->taps_hash;
}

typedef struct tgt_pick_ctx {
    const struct tgt_graphs *G;
    const tgt_graph_key *key;
} tgt_pick_ctx;

static bool tgt_slot_is(void *user, int i)
{
    const tgt_pick_ctx *c = user;
    return c->G->exec[i] && tgt_key_eq(&c->G->key[i], c->key);
}

int tgt_graph_pick(const tgt_model *m, const tgt_state *s, int64_t n_tok, bool record,
                   const tgt_out *out)
{
    struct tgt_graphs *G = m->graphs;
    tgt_graph_key key = tgt_key_of(m, s, n_tok, record, out);
    tgt_pick_ctx ctx = {.G = G, .key = &key};
    int slot = -1;
    switch (gp_pick(&G->pick, tgt_key_hash(&key), tgt_slot_is, &ctx, &slot)) {
    case GP_REPLAY:
        return slot;
    case GP_RECORD:
        if (G->exec[slot])
            m->be->graph_free(m->be, G->exec[slot]);
        G->exec[slot] = NULL; /* tgt_graph_run records it */
        G->key[slot] = key;
        return slot;
    case GP_DIRECT:
        break;
    }
    G->counts.direct++;
    return -1;
}

/* Records tgt_run into *exec. On failure nothing is being recorded any more. */
static td_err tgt_graph_record(const tgt_model *m, tgt_state *s, int64_t n_tok, bool record,
                               const tgt_out *out, void **exec)
{
    const ops_backend *be = m->be;
    TD_TRY(be->graph_begin(be));
    td_err e = tgt_run(m, s, n_tok, record, out);
    void *g = NULL;
    td_err e2 = be->graph_end(be, &g);
    if (e != TD_OK) {
        if (g)
            be->graph_free(be, g);
        return e;
    }
    TD_TRY(e2);
    *exec = g;
    return TD_OK;
}

td_err tgt_graph_run(const tgt_model *m, tgt_state *s, int slot, int64_t n_tok, bool record,
                     const tgt_out *out)
{
    struct tgt_graphs *G = m->graphs;
    const ops_backend *be = m->be;
    if (!G->exec[slot]) {
        td_err e = tgt_graph_record(m, s, n_tok, record, out, &G->exec[slot]);
        if (e != TD_OK) {
            /* not a fault of the step: run it directly, and from now on always */
            LOG_WARN("target: CUDA graphs off (%s); forward passes run op by op", err_msg());
            G->failed = true;
            G->exec[slot] = NULL;
            gp_free(&G->pick, slot);
            err_clear();
            G->counts.direct++;
            return tgt_run(m, s, n_tok, record, out);
        }
        G->counts.recorded++;
    }
    G->counts.replayed++;
    return be->graph_launch(be, G->exec[slot]);
}
