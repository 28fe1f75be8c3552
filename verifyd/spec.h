/* The speculative loop of one sequence (DESIGN section 4, chain mode), in one process:
 * the drafter proposes block_size - 1 tokens after the pending token, the target verifies the
 * block in one forward pass, and acceptance keeps the longest run the target agrees with
 * (greedy) or applies lossless speculative sampling (temperature > 0). Without a drafter the
 * same object decodes plainly, one token per step.
 *
 * State: committed length L = positions whose target KV/state/features exist, and one
 * pending token b (sampled, emitted, not yet run through the target). */
#ifndef TANDEM_VERIFYD_SPEC_H
#define TANDEM_VERIFYD_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "draftd/dflash.h"
#include "kernels/ops.h"
#include "verifyd/target.h"

#define SPEC_MAX_BLOCK 64 /* tokens per verify block (block_size of the drafter) */

typedef struct spec_stats {
    int64_t steps;            /* speculative (or plain) steps after prefill */
    int64_t generated;        /* tokens emitted, the prefill's first token included */
    int64_t drafted;          /* draft tokens proposed */
    int64_t accepted;         /* draft tokens accepted */
    int64_t accept_hist[SPEC_MAX_BLOCK + 1]; /* steps by tokens committed (1..block) */
    double t_prefill;         /* seconds */
    double t_draft;           /* seconds in the drafter (context update + proposal) */
    double t_verify;          /* seconds in target forward passes after prefill */
} spec_stats;

typedef struct spec_seq {
    const tgt_model *tm;
    const dfl_model *dm;      /* NULL: plain decoding */
    tgt_state ts;
    dfl_state ds;
    ops_sampler sampler;
    int64_t block;            /* tokens per verify block: drafter block_size, or 1 */
    int32_t pending;          /* b: the last emitted token, not yet run through the target */
    bool has_pending;
    int32_t *taps;            /* [n_taps] target layer ids feeding the drafter */
    int64_t n_taps;
    float *feat;              /* [block or prefill chunk][n_taps][n_embd] tap outputs */
    float *logits;            /* [block][n_vocab] target logits of a verify pass */
    float *dlogits;           /* [block-1][n_vocab] drafter logits */
    float *p;                 /* [n_vocab] scratch distribution */
    float *q;                 /* [block-1][n_vocab] drafter distributions (sampling) */
    int64_t prefill_chunk;    /* tokens per prefill forward pass */
    spec_stats stats;
} spec_seq;

/* dm may be NULL. n_ctx bounds prompt + generated tokens; ring is the drafter's context
 * window (0: 4096). */
td_err spec_init(spec_seq *s, const tgt_model *tm, const dfl_model *dm, int64_t n_ctx,
                 int64_t ring, const ops_sampler *sampler);
void spec_free(spec_seq *s);

/* Runs the prompt through the target (in chunks; features go to the drafter) and samples
 * the first token, which becomes pending and is returned in *first. TD_ERANGE for an empty
 * prompt, a token outside the vocabulary or a prompt that leaves no room in the context. */
td_err spec_prefill(spec_seq *s, const int32_t *prompt, int64_t n, int32_t *first);

/* One step: out[0..*n_out) are the newly emitted tokens (accepted drafts then the next
 * pending token), 1 <= *n_out <= block. TD_ERANGE when the context is full. */
td_err spec_step(spec_seq *s, int32_t *out, int64_t *n_out);

/* Positions left in the context (a step needs block of them). */
int64_t spec_room(const spec_seq *s);

#endif
