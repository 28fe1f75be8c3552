/* A generation's logit bias and penalties (OpenAI's logit_bias, presence_penalty and
 * frequency_penalty; vLLM's repetition_penalty and min_tokens): every row of target logits a
 * token is chosen from gets, at token t with logit l,
 *
 *     rep(l) + bias[t] - fmaf(frequency, c, presence)   when t was emitted c > 0 times before
 *                                                     the row's position,
 *     rep(l) + bias[t]                                when it was not,
 *
 * where rep(l) = l / repetition for l > 0 and l * repetition otherwise when t is in the prompt
 * or was emitted, else l; and the stop tokens get -inf while fewer than min_tokens tokens were
 * emitted; with an allowed set (vLLM's allowed_token_ids) every other token gets -inf; with
 * bad words (vLLM's bad_words, as token sequences) the last token of one gets -inf where the
 * tokens generated before the row end with the rest of it (a one-token word: always).
 * Applied before acceptance, sampling and log probabilities. The counts are of
 * generated tokens only (the prompt's do not count), and a verify block's row i counts the
 * drafts before it as emitted, so that a row gets exactly what plain decoding would give it
 * at that position: speculative output stays equal to plain output. The changes are built on
 * the host (a sparse list per row, one definition of the value) and made on the backend
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
    float repetition;        /* > 0; 0 or 1: none */
    int32_t min_tokens;      /* the stop tokens are refused before this many were emitted */
    const int32_t *stop;     /* [n_stop] the generation's stop tokens (ids outside the
                              * vocabulary are ignored) */
    int32_t n_stop;
    const int32_t *allowed;  /* [n_allowed] the only tokens that may be chosen (0: all) */
    int32_t n_allowed;
    const int32_t *bad;      /* [n_bad] bad words: each a length L >= 1, then L token ids */
    int32_t n_bad;
} pen_cfg;

typedef struct pen_state {
    bool on;              /* anything to add at all */
    float presence, frequency;
    float rep;            /* repetition penalty, 1: none */
    int64_t n_vocab;
    uint8_t *in_prompt;   /* [n_vocab] 1 for the prompt's tokens (with rep only) */
    int32_t *ptok;        /* [n_ptok] the prompt's distinct tokens (with rep only) */
    int64_t n_ptok;
    int32_t min_tokens;
    int32_t *stop;        /* [n_stop] distinct stop tokens in the vocabulary (with min_tokens) */
    int32_t n_stop;
    int32_t *where;       /* [n_vocab] a token's entry in the row being built, or -1 (with
                           * min_tokens) */
    int64_t n_emitted;    /* tokens emitted so far */
    ops_logit_add *bias;  /* [n_bias] the biased tokens by id, each once */
    int32_t n_bias;
    uint32_t *count;      /* [n_vocab] emissions so far, or NULL without count penalties */
    int32_t *seen;        /* [n_seen] the tokens with a count, first emission first */
    int64_t n_seen, seen_cap;
    unsigned char *host;  /* staging: off [rows + 1] (padded to 8 bytes), then the entries */
    size_t host_cap;
    void *dev;            /* the same on the backend */
    size_t dev_cap;
    int32_t *bad;         /* [n_bad] the bad words (pen_cfg's layout) */
    int32_t n_bad;
    int32_t n_bad_words;  /* words in bad */
    int32_t *hist;        /* [hist_cap] the last tokens generated, oldest first (bad words) */
    int32_t hist_cap;     /* the longest bad word's length - 1 */
    int32_t n_hist;
    uint32_t *allow;      /* [OPS_MASK_WORDS(n_vocab)] the allowed set, or NULL: all */
    void *allow_dev;      /* [allow_rows][words] the same for each row of a block (backend) */
    int64_t allow_rows;
} pen_state;

/* TD_EINVAL for a biased, allowed or bad-word token outside the vocabulary, a biased one given
 * twice, a value that is not finite, a repetition penalty that is not positive, a negative
 * min_tokens, a bad word whose length does not fit its entries; TD_ENOMEM. */
td_err pen_init(pen_state *p, const pen_cfg *cfg, int64_t n_vocab);
/* be: the backend that holds p->dev (may be NULL when nothing was applied yet). */
void pen_free(pen_state *p, const ops_backend *be);

/* A new generation after prompt [n_prompt] (ids outside the vocabulary are ignored): nothing
 * emitted. TD_ENOMEM. */
td_err pen_start(pen_state *p, const int32_t *prompt, int64_t n_prompt);

/* tok [n] were emitted (in order). Ids outside the vocabulary are ignored. */
td_err pen_emit(pen_state *p, const int32_t *tok, int64_t n);

/* Applies the bias and penalties to rows 0..n-1 of logits [n][n_vocab] (backend memory of be):
 * row i as if drafts [0..i-1] had been emitted too (drafts may be NULL when n == 1; a draft
 * outside the vocabulary counts as nothing). A no-op when nothing applies. */
td_err pen_apply(pen_state *p, const ops_backend *be, float *logits, const int32_t *drafts,
                 int64_t n);

#endif
