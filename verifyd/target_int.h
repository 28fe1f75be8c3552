/* Internal to the target files: the forward-pass scratch the model keeps. */
#ifndef TANDEM_VERIFYD_TARGET_INT_H
#define TANDEM_VERIFYD_TARGET_INT_H

#include "verifyd/target.h"

/* Gives the model its (empty) forward scratch (target_forward.c). */
td_err tgt_work_init(tgt_model *m);
/* Releases the model's forward scratch. */
void tgt_work_free(const tgt_model *m);

/* The layers of one forward pass (target_forward.c): everything after the token ids and
 * positions are in the scratch, only backend calls (so it can be recorded as a graph). */
td_err tgt_run(const tgt_model *m, tgt_state *s, int64_t n_tok, bool record, const tgt_out *out);
/* Generation of the scratch buffers (changes when they move). */
uint64_t tgt_work_gen(const tgt_model *m);
/* A new identity for state arrays (tgt_state.gen). */
uint64_t tgt_gen_next(void);

/* Makes the model's scratch hold n_tok tokens at positions below n_pos (a new tgt_work_gen
 * whenever a buffer moves). */
td_err tgt_work_reserve(const tgt_model *m, int64_t n_tok, int64_t n_pos);
/* target_graph.c: turns graphs on for a model placed on be (tgt_load_on), with the scratch
 * made for TGT_RESERVE_TOK tokens at once. */
td_err tgt_graphs_init(tgt_model *m);
void tgt_graphs_free(tgt_model *m);
/* Whether this forward pass can run as a graph. */
bool tgt_graph_wanted(const tgt_model *m);
/* For a pass tgt_graph_wanted allows: the slot of the recording it runs as (recorded by
 * tgt_graph_run if it is new), or -1 to run it op by op (verifyd/graph_pick.h). */
int tgt_graph_pick(const tgt_model *m, const tgt_state *s, int64_t n_tok, bool record,
                   const tgt_out *out);
/* tgt_run(m, s, n_tok, record, out) as a replay of slot's recording, made now if the slot
 * was just picked for it. Falls back to running it directly, and turns graphs off for the
 * model, when recording fails. */
td_err tgt_graph_run(const tgt_model *m, tgt_state *s, int slot, int64_t n_tok, bool record,
                     const tgt_out *out);

#endif
