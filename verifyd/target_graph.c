/* Forward passes of the target as recorded CUDA graphs: the ~1600 launches of a 27B decode
 * step become one replay. A recording holds the addresses of everything it touches, so it
 * is kept per (state arrays, scratch buffers, outputs, tokens, record, taps) and made again
 * when any of them changes; what changes every step (token ids, positions) is read from
 * device memory that tgt_forward fills before the replay, the number of keys attention reads
 * included (its launch is sized for the whole cache; splits past the count return at once),
 * so replay and direct run give the same bits (tests/test_gpu_graph.c). */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/backend_prof.h"
#include "verifyd/target_int.h"

#define TGT_GRAPHS_MAX 24 /* recordings kept (decode, the verify sizes --draft-auto picks, a few
                           * sequences) */

typedef struct tgt_graph_key {
    uint64_t state_gen, work_gen;
    int64_t n_tok, delta_chunk;
    bool record, last_only;
    const float *logits, *tap_out;
    int64_t n_taps;
    uint64_t taps_hash;
} tgt_graph_key;

typedef struct tgt_graph {
    tgt_graph_key key;
    void *exec;     /* the backend's recording, NULL = free slot */
    uint64_t used;  /* clock of the last replay (the least recent is replaced) */
} tgt_graph;

struct tgt_graphs {
    tgt_graph g[TGT_GRAPHS_MAX];
    uint64_t clock;
    bool failed;        /* recording failed once: forward passes run op by op */
    uint64_t recorded, replayed;
};

void tgt_graphs_init(tgt_model *m)
{
    const ops_backend *be = m->be;
    const char *env = getenv("TANDEM_GRAPHS");
    m->use_graphs = false;
    if (!be->graph_begin || (env && !strcmp(env, "0")))
        return;
    m->graphs = calloc(1, sizeof *m->graphs);
    m->use_graphs = m->graphs != NULL;
}

static void tgt_graphs_drop(const tgt_model *m)
{
    for (int i = 0; m->graphs && i < TGT_GRAPHS_MAX; i++) {
        if (m->graphs->g[i].exec)
            m->be->graph_free(m->be, m->graphs->g[i].exec);
        m->graphs->g[i].exec = NULL;
    }
}

void tgt_graphs_free(tgt_model *m)
{
    if (!m->graphs)
        return;
    if (m->be->sync)
        (void)m->be->sync(m->be); /* no recording is freed while it runs */
    tgt_graphs_drop(m);
    free(m->graphs);
    m->graphs = NULL;
}

bool tgt_graph_wanted(const tgt_model *m)
{
    return m->use_graphs && m->graphs && !m->graphs->failed && m->be->graph_begin &&
           !ops_prof_on(m->be);
}

void tgt_graph_stats(const tgt_model *m, uint64_t *recorded, uint64_t *replayed)
{
    *recorded = m->graphs ? m->graphs->recorded : 0;
    *replayed = m->graphs ? m->graphs->replayed : 0;
}

static bool tgt_key_eq(const tgt_graph_key *a, const tgt_graph_key *b)
{
    return a->state_gen == b->state_gen && a->work_gen == b->work_gen && a->n_tok == b->n_tok &&
           a->delta_chunk == b->delta_chunk && a->record == b->record &&
           a->last_only == b->last_only && a->logits == b->logits &&
           a->tap_out == b->tap_out && a->n_taps == b->n_taps && a->taps_hash == b->taps_hash;
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

td_err tgt_graph_run(const tgt_model *m, tgt_state *s, int64_t n_tok, bool record,
                     const tgt_out *out)
{
    struct tgt_graphs *G = m->graphs;
    const ops_backend *be = m->be;
    tgt_graph_key key = {
        .state_gen = s->gen, .work_gen = tgt_work_gen(m), .n_tok = n_tok,
        .delta_chunk = m->delta_chunk, .record = record,
        .last_only = out && out->last_only, .logits = out ? out->logits : NULL,
        .tap_out = out && out->n_taps ? out->tap_out : NULL, .n_taps = out ? out->n_taps : 0,
        .taps_hash = 1469598103934665603ull,
    };
    for (int64_t j = 0; j < key.n_taps; j++)
        key.taps_hash = (key.taps_hash ^ (uint64_t)(uint32_t)out->taps[j]) * 1099511628211ull;
    tgt_graph *hit = NULL, *lru = &G->g[0];
    for (int i = 0; i < TGT_GRAPHS_MAX && !hit; i++) {
        if (G->g[i].exec && tgt_key_eq(&G->g[i].key, &key))
            hit = &G->g[i];
        else if (!G->g[i].exec || (lru->exec && G->g[i].used < lru->used))
            lru = &G->g[i];
    }
    if (!hit) {
        void *exec = NULL;
        td_err e = tgt_graph_record(m, s, n_tok, record, out, &exec);
        if (e != TD_OK) {
            /* not a fault of the step: run it directly, and from now on always */
            LOG_WARN("target: CUDA graphs off (%s); forward passes run op by op", err_msg());
            G->failed = true;
            err_clear();
            return tgt_run(m, s, n_tok, record, out);
        }
        if (lru->exec)
            be->graph_free(be, lru->exec);
        lru->exec = exec;
        lru->key = key;
        hit = lru;
        G->recorded++;
    }
    hit->used = ++G->clock;
    G->replayed++;
    return be->graph_launch(be, hit->exec);
}
