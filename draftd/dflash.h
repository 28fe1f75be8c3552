/* The DFlash block-diffusion drafter (DESIGN section 7): a z-lab checkpoint (config.json +
 * model.safetensors) that proposes block_size - 1 tokens in one forward pass, conditioned on
 * the target's tap-layer features of every committed position.
 *
 * It has no embedding or LM head of its own: it borrows the target's token_embd and output
 * matrices (ops_weight views owned by the target model).
 *
 * It runs on the target's backend: weights, scratch, context state, features in and logits
 * out are all memory of that backend (host memory for the CPU backend). */
#ifndef TANDEM_DRAFTD_DFLASH_H
#define TANDEM_DRAFTD_DFLASH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/dflash_config.h"
#include "common/err.h"
#include "common/safetensors.h"
#include "kernels/backend.h"
#include "kernels/ops.h"

typedef struct dfl_layer {
    const float *in_norm;   /* input_layernorm [hidden] */
    const float *post_norm; /* post_attention_layernorm [hidden] */
    const float *q_norm;    /* [head_dim] */
    const float *k_norm;    /* [head_dim] */
    ops_weight wq;          /* [n_heads*head_dim][hidden] */
    ops_weight wk;          /* [n_kv_heads*head_dim][hidden] */
    ops_weight wv;          /* [n_kv_heads*head_dim][hidden] */
    ops_weight wo;          /* [hidden][n_heads*head_dim] */
    ops_weight gate;        /* [ffn][hidden] */
    ops_weight up;          /* [ffn][hidden] */
    ops_weight down;        /* [hidden][ffn] */
} dfl_layer;

typedef struct dfl_model {
    dflash_config cfg;        /* resolved against the target (n_taps > 0) */
    int64_t target_hidden;    /* width of one tap feature */
    st_file *st;              /* owns the mapping the weights point into */
    ops_weight fc;            /* [hidden][n_taps*target_hidden] */
    const float *hidden_norm; /* [hidden] */
    const float *norm;        /* [hidden] final norm */
    dfl_layer *layers;        /* [n_layers] */
    ops_weight tok_embd;      /* the target's [vocab][hidden] (a view; not owned) */
    ops_weight lm_head;       /* the target's output [vocab][hidden] (a view; not owned) */
    float *owned;             /* f32 copies of the norm vectors (host) */
    const ops_backend *be;    /* where the weights live and the passes run */
    td_dtype kv_type;         /* element type of the context K/V of new states: TD_F16 on a
                               * GPU (the tensor-core attention of f16 caches), TD_F32 on the
                               * CPU (the reference); set before dfl_state_init to choose */
    void *dev_arena;          /* the weights' backend copy (NULL on the CPU: the mapping) */
    struct dfl_work *work;    /* scratch reused by every pass (one caller at a time) */
} dfl_model;

/* Loads dir/config.json and dir/model.safetensors for a target with n_target_layers main
 * layers whose embedding and LM head are given, on the CPU. Errors name the file, key or
 * tensor. */
td_err dfl_load(dfl_model **out, const char *dir, uint32_t n_target_layers,
                const ops_weight *tok_embd, const ops_weight *lm_head);
/* The same on the target's backend be: tok_embd and lm_head are views of the target placed
 * on be (tgt_load_on), and a GPU backend gets a device copy of the drafter's weights. */
td_err dfl_load_on(dfl_model **out, const char *dir, uint32_t n_target_layers,
                   const ops_weight *tok_embd, const ops_weight *lm_head,
                   const ops_backend *be);
void dfl_free(dfl_model *m);

/* Whether every product of the drafter (fc, the layers, the LM head) reads its inputs rounded
 * to bf16 (ops_weight.x_bf16): set by dfl_load_on on a GPU backend unless TANDEM_DRAFT_ACT=f32,
 * off on the CPU. Proposals only steer the target's verification, so
 * the drafter may trade exactness for speed (the reference runs it in bf16). */
void dfl_set_x_bf16(dfl_model *m, bool on);

/* The drafter's memory of one sequence: context K/V of the committed positions in a ring of
 * cap slots (positions stay absolute; the oldest fall out when it wraps), plus room for one
 * block after the valid entries. */
typedef struct dfl_state {
    int64_t cap;        /* ring slots: the drafter's context window */
    int64_t n_ctx;      /* committed positions added so far (absolute) */
    int64_t block;      /* block slots reserved after the ring (config block_size) */
    const ops_backend *be; /* the model's backend, which owns the arrays (unless bound) */
    td_dtype kv_type;   /* TD_F32 or TD_F16: the elements of k and v (the model's kv_type) */
    void **k;           /* per layer: [cap + block][n_kv_heads][head_dim] (backend memory) */
    void **v;           /* per layer: [cap + block][n_kv_heads][head_dim] (backend memory) */
    int32_t *pos;       /* [cap + block] absolute position held by each slot (backend memory) */
    int64_t n_layers;
    bool bound;         /* k, v and pos live in caller memory (dfl_state_bind) */
} dfl_state;

td_err dfl_state_init(dfl_state *s, const dfl_model *m, int64_t cap);
/* Bytes of one context K/V element of new states (kvlayout's d_kv_bytes): 2 or 4. */
uint32_t dfl_kv_bytes(const dfl_model *m);
/* A state over caller memory of the model's backend (a kvd draft slot): k and v are
 * [n_layers][rows][n_kv_heads][head_dim] of the model's kv_type with rows >= cap +
 * block_size, pos is [rows]. Nothing is cleared; n_ctx starts at 0 (a caller resuming a kept
 * context sets it). */
td_err dfl_state_bind(dfl_state *s, const dfl_model *m, int64_t cap, int64_t rows, void *k,
                      void *v, int32_t *pos);
/* Frees what init allocated (only the pointer lists of a bound state). */
void dfl_state_free(dfl_state *s);
void dfl_state_reset(dfl_state *s);

/* Random streams of speculative sampling: one per (absolute position, role), so a token's
 * draw depends neither on how the steps were cut nor on which process draws it (the
 * in-process loop, verifyd, draftd). */
enum { DFL_RNG_TARGET = 0, DFL_RNG_ACCEPT = 1, DFL_RNG_DRAFT = 2, DFL_RNG_ROLES = 4 };

/* The counter of the stream of role at position pos (for ops_rand_uniform, cpu_sample_draw). */
uint64_t dfl_rng_ctr(int64_t pos, int role);

/* Drafter logits [B-1][n_vocab] (dfl_propose) -> drafts block[1..B-1] (host memory): the
 * argmax of each row when greedy, else a draw from each row's filtered distribution, written
 * to q [B-1][n_vocab], with the DFL_RNG_DRAFT stream of its position L + i. Runs on be next to
 * the logits (logits, q and the scratch ids [B-1] are backend memory): only the B - 1 token
 * ids come to the host. TD_EINVAL when a row has no finite logit. The one drafting rule of
 * the in-process loop and of draftd, so both draft the same tokens. */
td_err dfl_draft_tokens(const ops_backend *be, const ops_sampler *smp, const float *logits,
                        int64_t B, int64_t n_vocab, int64_t L, int32_t *ids, int32_t *block,
                        float *q);

/* Adds n newly committed positions n_ctx..n_ctx+n-1 from their target features
 * feat[n][n_taps][target_hidden] (tap-layer outputs in target_layer_ids order; backend
 * memory). */
td_err dfl_add_context(const dfl_model *m, dfl_state *s, const float *feat, int64_t n);

/* Drafts one block: the pending token b at position s->n_ctx followed by block_size - 1 MASK
 * slots. logits (backend memory): [n_rows][vocab] for the positions n_ctx+1 .. n_ctx+n_rows
 * (after output_multiplier and softcapping), n_rows in 1..block_size-1: the whole block runs
 * through the layers (its slots attend to each other), only the LM head is cut to the rows
 * asked for, so they are the bits of the same rows of a whole block's logits. TD_ERANGE for a
 * token id outside the vocabulary, TD_EINVAL for n_rows outside that range. On a GPU the work
 * is only enqueued: the logits are ready for the next op on the backend's stream or after
 * to_host. */
td_err dfl_propose(const dfl_model *m, dfl_state *s, int32_t pending, int64_t n_rows,
                   float *logits);

#endif
