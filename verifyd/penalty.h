/* A generation's logit bias and penalties (OpenAI's logit_bias, presence_penalty and
 * frequency_penalty): every row of target logits a token is chosen from gets, at token t,
 *
 *     bias[t] - fmaf(frequency, c, presence)   when t was emitted c > 0 times before the
 *                                             row's position,
 *     bias[t]                                  when it was not,
 *
 * added to the logit before acceptance, sampling and log probabilities. The counts are of
 * generated tokens only (the prompt's do not count), and a verify block's row i counts the
 * drafts before it as emitted, so that a row gets exactly what plain decoding would give it
 * at that position: speculative output stays equal to plain output. The additions are built
 * on the host (a sparse list per row, one definition of the value) and added on the backend
 * beside the logits (ops_backend.logit_add): no logits cross. */
#ifndef TANDEM_VERIFYD_PENALTY_H
#define TANDEM_VERIFYD_PENALTY_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/backend.h"

/* What a generation asks for; zero: nothing. */
typedef struct pen_cfg {
    float presence;          /* subtracted once from a token emitted before (-2..2 in the API) */
    float frequency;         /* and this much per emission (-2..2 in the API) */
    const int32_t *bias_tok; /* [n_bias] distinct token ids in 0..n_vocab-1 */
    const float *bias;       /* [n_bias] added to their logits */
    int32_t n_bias;
} pen_cfg;

typedef struct pen_state {
    bool on;              /* anything to add at all */
    float presence, frequency;
    int64_t n_vocab;
    ops_logit_add *bias;  /* [n_bias] the biased tokens by id, each once */
    int32_t n_bias;
    uint32_t *count;      /* [n_vocab] emissions so far, or NULL without penalties */
    int32_t *seen;        /* [n_seen] the tokens with a count, first emission first */
    int64_t n_seen, seen_cap;
    unsigned char *host;  /* staging: off [rows + 1] (padded to 8 bytes), then the entries */
    size_t host_cap;
    void *dev;            /* the same on the backend */
    size_t dev_cap;
} pen_state;

/* TD_EINVAL for a biased token outside the vocabulary or given twice, or a value that is not
 * finite; TD_ENOMEM. */
td_err pen_init(pen_state *p, const pen_cfg *cfg, int64_t n_vocab);
/* be: the backend that holds p->dev (may be NULL when nothing was applied yet). */
void pen_free(pen_state *p, const ops_backend *be);

/* A new generation: nothing emitted. */
void pen_reset(pen_state *p);

/* tok [n] were emitted (in order). Ids outside the vocabulary are ignored. */
td_err pen_emit(pen_state *p, const int32_t *tok, int64_t n);

/* Adds the bias and penalties to rows 0..n-1 of logits [n][n_vocab] (backend memory of be):
 * row i as if drafts [0..i-1] had been emitted too (drafts may be NULL when n == 1; a draft
 * outside the vocabulary counts as nothing). A no-op when nothing applies. */
td_err pen_apply(pen_state *p, const ops_backend *be, float *logits, const int32_t *drafts,
                 int64_t n);

#endif
