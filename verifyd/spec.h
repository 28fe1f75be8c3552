/* The speculative loop of one sequence (DESIGN section 4, chain mode), in one process:
 * the drafter proposes block_size - 1 tokens after the pending token, the target verifies the
 * block in one forward pass, and acceptance keeps the longest run the target agrees with
 * (greedy) or applies lossless speculative sampling (temperature > 0). Without a drafter the
 * same object decodes plainly, one token per step.
 *
 * Everything runs on the target's backend (tm->be): the drafter must be loaded on the same
 * backend (dfl_load_on). Greedy acceptance stays there and brings only the accept length and
 * next token to the host; sampling downloads the logits rows it compares.
 *
 * State: committed length L = positions whose target KV/state/features exist, and one
 * pending token b (sampled, emitted, not yet run through the target). */
#ifndef TANDEM_VERIFYD_SPEC_H
#define TANDEM_VERIFYD_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "draftd/dflash.h"
#include "kernels/ops.h"
#include "verifyd/blockpick.h"
#include "verifyd/constrain.h"
#include "verifyd/penalty.h"
#include "verifyd/target.h"

#define SPEC_MAX_BLOCK 64 /* tokens per verify block (block_size of the drafter) */
_Static_assert(SPEC_MAX_BLOCK == BP_MAX, "a block pick covers every block");
#define SPEC_PROMPT_LP_ROWS 16 /* prompt tokens per prefill pass with prompt log probabilities */

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
    const dfl_model *dm;      /* in-process drafter; NULL: plain, or blocks from elsewhere */
    tgt_state ts;
    dfl_state ds;
    ops_sampler sampler;
    pen_state pen;            /* logit bias and penalties of the generation */
    cst_state cst;            /* its response format */
    int64_t block;            /* tokens per verify block: drafter block_size, or 1 */
    int64_t draft_max;        /* drafts an in-process step verifies at most (0: block - 1) */
    bool draft_auto;          /* in-process steps' blocks chosen by bp (blockpick.h) */
    blockpick bp;
    float *pend;              /* with draft_auto: [SPEC_MAX_BLOCK][n_taps][n_embd] features of
                               * committed positions not yet in the drafter's context (backend
                               * memory): plain steps leave them there, the next drafting step
                               * (or a full buffer) adds them in one pass */
    int64_t n_pend;
    int32_t pending;          /* b: the last emitted token, not yet run through the target */
    bool has_pending;
    int32_t *taps;            /* [n_taps] target layer ids feeding the drafter */
    int64_t n_taps;
    float *feat;              /* [block or prefill chunk][n_taps][n_embd] tap outputs
                               * (backend memory) */
    void *ring;               /* NULL, or [ring_rows][n_taps][n_embd]: features of committed
                               * position p go to row p % ring_rows (a drafter elsewhere;
                               * backend memory), f32 or with ring_bf16 bf16 */
    int64_t ring_rows;
    bool ring_bf16;
    bool recorded;            /* the last spec_verify's target pass recorded a CUDA graph (its
                               * time is then not the block size's) */
    float *logits;            /* [block][n_vocab] target logits of a verify pass (backend) */
    float *dlogits;           /* [block-1][n_vocab] drafter logits (backend memory; with the
                               * in-process drafter only, else NULL) */
    int32_t *ids;             /* [2*block+2] backend: row argmaxes [block], accept result [2],
                               * drafts [block] */
    int32_t *lp_tok;          /* [block] backend: tokens whose log probabilities a client
                               * asked for (blocks drafted elsewhere: verifyd, else NULL) */
    ops_logprob *lp;          /* [block] backend: theirs, computed beside the logits */
    float *q;                 /* [block-1][n_vocab] host room for drafter distributions that
                               * arrive in a message (sampling, blocks drafted elsewhere, else
                               * NULL) */
    float *dp;                /* [block][n_vocab] backend scratch: the block's filtered target
                               * distributions (sampling only, else NULL) */
    float *dq;                /* [block-1][n_vocab] backend: the drafts' distributions
                               * (sampling with block > 1, else NULL) */
    int64_t prefill_chunk;    /* tokens per prefill forward pass */
    int64_t lp_rows;          /* rows of logits, lp_tok and lp: block, or SPEC_PROMPT_LP_ROWS
                               * when larger and prompt log probabilities are wanted */
    bool prompt_lp;           /* each prefill pass gives its prompt tokens' log probabilities
                               * (prefill_chunk is then lp_rows) */
    int32_t prompt_top;       /* with prompt_lp: alternatives per prompt token */
    ops_logprob plp[SPEC_PROMPT_LP_ROWS]; /* [n_plp] of the last prefill pass: those of
                               * prompt tokens plp_first.. (host) */
    int64_t n_plp;
    int64_t plp_first;
    const int32_t *prompt;    /* [n_prompt] the prompt being prefilled (the caller's) */
    int64_t n_prompt;
    int64_t prompt_at;        /* prompt tokens in the state so far */
    spec_stats stats;
} spec_seq;

/* Tokens a step verifies at most: the block, or 1 + draft_max when that is fewer. */
static inline int64_t spec_block_most(int64_t block, int64_t draft_max)
{
    return draft_max > 0 && 1 + draft_max < block ? 1 + draft_max : block;
}

/* How a sequence is set up (spec_init_cfg). */
typedef struct spec_cfg {
    const dfl_model *dm;        /* in-process drafter, or NULL */
    int64_t n_ctx;              /* positions: prompt + generated tokens */
    int64_t ring;               /* in-process drafter's context window (0: 4096) */
    int64_t block;              /* without dm: tokens per verify block of the blocks a
                                 * drafter elsewhere supplies (1: plain decoding) */
    int64_t draft_max;          /* with dm: drafts a step verifies at most, the rest of the
                                 * drafter's block left unchecked (0: all of them) */
    bool draft_auto;            /* with dm: each step's block chosen by measured cost and
                                 * acceptance (blockpick.h), at most 1 + draft_max */
    const int32_t *taps;        /* without dm: [n_taps] target layers whose features are kept */
    int64_t n_taps;
    const tgt_state_mem *state; /* caller memory for the target state (a kvd slot), or NULL */
    void *feat_ring;            /* NULL, or [ring_rows][n_taps][n_embd] feature ring (memory
                                 * of the target's backend, like state): f32 elements, or
                                 * bf16 ones (cpu_to_bf16) with ring_bf16 */
    int64_t ring_rows;
    bool ring_bf16;
    ops_sampler sampler;
    pen_cfg pen;                /* logit bias and penalties (zero: none) */
    cst_cfg cst;                /* response format (zero: text) */
    const cst_vocab *vocab;     /* the target's vocabulary for a format (NULL: none) */
    bool prompt_logprobs;       /* without dm: the prompt tokens' log probabilities under the
                                 * raw logits, prefill pass by pass (spec_seq.plp) */
    int32_t prompt_top;         /* and this many alternatives each, 0..OPS_TOP_LOGPROBS_MAX */
} spec_cfg;

/* dm may be NULL. n_ctx bounds prompt + generated tokens; ring is the drafter's context
 * window (0: 4096). */
td_err spec_init(spec_seq *s, const tgt_model *tm, const dfl_model *dm, int64_t n_ctx,
                 int64_t ring, const ops_sampler *sampler);
td_err spec_init_cfg(spec_seq *s, const tgt_model *tm, const spec_cfg *cfg);
void spec_free(spec_seq *s);

/* Runs the prompt through the target (in chunks; features go to the drafter) and samples
 * the first token, which becomes pending and is returned in *first. TD_ERANGE for an empty
 * prompt, a token outside the vocabulary or a prompt that leaves no room in the context. */
td_err spec_prefill(spec_seq *s, const int32_t *prompt, int64_t n, int32_t *first);

/* The same, one chunk at a time (a scheduler interleaves sequences): begin checks the
 * prompt (kept by the caller until the prefill ends) and sets the state up; n_cached > 0
 * says the bound state already holds the first n_cached prompt positions (a prefix-cache
 * hit; n_cached < n, no in-process drafter, no prompt log probabilities). Each next runs at
 * most prefill_chunk tokens; when the prompt has run, *done is set and *first is the sampled
 * first token. With prompt log probabilities, each next leaves in plp[0..n_plp) those of the
 * prompt tokens plp_first.. that its pass predicts (the first token has none). */
td_err spec_prefill_begin(spec_seq *s, const int32_t *prompt, int64_t n, int64_t n_cached);
td_err spec_prefill_next(spec_seq *s, bool *done, int32_t *first);

/* One step: out[0..*n_out) are the newly emitted tokens (accepted drafts then the next
 * pending token), 1 <= *n_out <= block. TD_ERANGE when the context is full. */
td_err spec_step(spec_seq *s, int32_t *out, int64_t *n_out);

/* One step with a block drafted elsewhere: block[0] is the pending token, block[1..B) the
 * drafts, q [B-1][n_vocab] their distributions in backend memory (sampling; NULL when greedy,
 * or B = 1 for a plain step). Runs the target over the block, accepts (the one acceptance
 * rule, whoever drafted: dfl_draft_tokens draws the drafts in every process), rolls back,
 * keeps the committed features; out as spec_step. Target logits of the block stay in
 * s->logits (backend memory, with the logit bias and penalties added and the response
 * format's mask applied): out[i] was chosen from row i. A response format cuts the block
 * before its first draft the format refuses. TD_ERANGE when B exceeds the block size or the
 * room left. */
td_err spec_verify(spec_seq *s, const int32_t *block, int64_t B, const float *q, int32_t *out,
                   int64_t *n_out);

/* Positions left in the context (a step needs block of them). */
int64_t spec_room(const spec_seq *s);

#endif
