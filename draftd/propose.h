/* draftd's answer to one propose request, apart from sockets (so tests and the benchmark run
 * it in one process): bring the slot's drafter context up to the committed length from the
 * target pool's feature ring, draft a block after the pending token, and build the proposal.
 *
 * The drafter context lives in kvd's draft pool (a kvl_draft_header, then K/V and positions),
 * so it outlives a draftd process: a restarted draftd with the same drafter continues from
 * header.n_ctx. A context that belongs to another slot generation or another drafter, or
 * that fell behind by more than the ring holds, is rebuilt from the last ring rows.
 *
 * Everything runs on the drafter's backend: the slots (and the proposal pool) are memory of
 * that backend, i.e. kvd pools of the matching kind. Greedy drafts are the row argmaxes,
 * found on the backend (only the token ids come to the host); sampling downloads the
 * drafter logits, draws on the host and writes the distributions to the proposal pool. */
#ifndef TANDEM_DRAFTD_PROPOSE_H
#define TANDEM_DRAFTD_PROPOSE_H

#include <stdint.h>

#include "common/err.h"
#include "common/kvlayout.h"
#include "common/msg.h"
#include "draftd/dflash.h"

#define DRF_FEAT_ROWS 64 /* ring positions widened from bf16 and added to the context at once */

typedef struct drf {
    const dfl_model *dm;
    uint64_t drafter_id;  /* written into the headers of the contexts it builds */
    int64_t n_vocab;      /* tokens */
    float *dlogits;       /* [block-1][n_vocab] drafter logits (backend memory) */
    int32_t *ids;         /* [block-1] row argmaxes (backend memory) */
    float *dq;            /* [block-1][n_vocab] filtered draft distributions (backend memory;
                           * sampling without a proposal pool) */
    float *q;             /* [block-1][n_vocab] host copy of dq (sampling without a pool) */
    uint32_t *q_ids;      /* [block-1][n_vocab] sparse q: ids of the non-zero entries */
    float *q_p;           /* [block-1][n_vocab] sparse q: their probabilities */
    msg_draft_q rows[MSG_DRAFT_MAX]; /* [block-1] views into q_ids / q_p */
    uint32_t tokens[MSG_DRAFT_MAX];  /* [block-1] the drafts */
    float *feat;          /* [DRF_FEAT_ROWS][n_taps][n_embd] ring rows widened from bf16
                           * (backend memory, made on first use), or NULL */
    int64_t feat_cap;     /* floats feat holds */
    int64_t added;        /* context positions added by the last call (rebuilds included) */
    bool rebuilt;         /* the last call rebuilt a sequence's context from the ring (another
                           * drafter wrote it, or it fell behind the ring) */
} drf;

td_err drf_init(drf *d, const dfl_model *dm, uint64_t drafter_id);
void drf_free(drf *d);

/* A 64-bit identity of the drafter files in dir (config.json bytes, safetensors size and
 * header), the same for every process that loads the same drafter. */
td_err drf_drafter_id(const char *dir, uint64_t *id);

/* Answers req against one slot: tslot is the start of the slot in the target pool, dslot in
 * the draft pool, laid out by lay (backend memory). Sampled distributions go to qpool
 * (lay.q_bytes of backend memory, the proposal pool of generation q_gen; out names the rows)
 * or, with qpool NULL, into out's sparse q. Everything is in memory when it returns. out
 * points into d's scratch until the next call. Requests that do not fit the layout or the
 * drafter are TD_EINVAL / TD_ERANGE. */
td_err drf_propose(drf *d, const kvl_layout *lay, const uint8_t *tslot, uint8_t *dslot,
                   uint8_t *qpool, uint64_t q_gen, const msg_propose *req, msg_proposal *out);

#endif
