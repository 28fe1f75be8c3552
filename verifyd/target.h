/* The target model: `qwen35` (hybrid Gated DeltaNet + gated attention, DESIGN section 5) and
 * `qwen3` (dense, DESIGN section 6) GGUF files, loaded as llama.cpp's converter writes them,
 * and their forward pass over a block of tokens against a per-sequence state.
 *
 * Every shape comes from the file's metadata; nothing about a particular model size is a
 * constant here. Weights stay in the GGUF mapping (quantised types are read by the ops). */
#ifndef TANDEM_VERIFYD_TARGET_H
#define TANDEM_VERIFYD_TARGET_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/gguf.h"
#include "kernels/backend.h"
#include "kernels/ops.h"

/* Tokens the scratch holds from the start where forward passes are recorded: verifyd's longest
 * pass (a 64-token prefill chunk or verify block). A longer pass grows it. */
#define TGT_RESERVE_TOK 64

typedef enum tgt_arch {
    TGT_ARCH_QWEN3,
    TGT_ARCH_QWEN35,
} tgt_arch;

typedef enum tgt_layer_kind {
    TGT_LAYER_ATTN,  /* full (gated, for qwen35) attention */
    TGT_LAYER_DELTA, /* Gated DeltaNet */
} tgt_layer_kind;

typedef struct tgt_hparams {
    tgt_arch arch;
    int64_t n_embd;      /* residual width (embedding_length) */
    int64_t n_ff;        /* SwiGLU inner width (feed_forward_length) */
    int64_t n_layer;     /* layers run: block_count - nextn_predict_layers */
    int64_t n_vocab;     /* rows of token_embd */
    int64_t n_ctx_train; /* context_length, 0 when absent */
    float eps;           /* RMSNorm eps (also the L2-norm eps of DeltaNet) */

    /* attention layers */
    int64_t n_head;      /* query heads */
    int64_t n_head_kv;   /* key/value heads */
    int64_t head_dim;    /* key_length */
    int64_t n_rot;       /* rotated dims per head (rope.dimension_count, default head_dim) */
    float rope_theta;    /* rope.freq_base */
    bool attn_gate;      /* qwen35: attn_q yields per head head_dim query then head_dim gate */
    int64_t full_attn_interval; /* qwen35: layer i is attention when (i+1) % this == 0 */

    /* DeltaNet layers (qwen35) */
    int64_t conv_k;      /* ssm.conv_kernel: taps of the causal conv */
    int64_t d_k;         /* ssm.state_size: key/query values per head */
    int64_t n_k_head;    /* ssm.group_count: key/query heads */
    int64_t n_v_head;    /* ssm.time_step_rank: value heads */
    int64_t d_v;         /* ssm.inner_size / n_v_head: values per value head */
    int64_t conv_ch;     /* channels through the conv: 2*n_k_head*d_k + n_v_head*d_v */
} tgt_hparams;

typedef struct tgt_layer {
    tgt_layer_kind kind;
    const float *attn_norm;   /* [n_embd] */
    const float *ffn_norm;    /* [n_embd] (post_attention_norm in qwen35) */
    ops_weight ffn_gate;      /* [n_ff][n_embd] */
    ops_weight ffn_up;        /* [n_ff][n_embd] */
    ops_weight ffn_down;      /* [n_embd][n_ff] */

    /* TGT_LAYER_ATTN */
    ops_weight wq;            /* [n_head*head_dim*(attn_gate ? 2 : 1)][n_embd] */
    ops_weight wk;            /* [n_head_kv*head_dim][n_embd] */
    ops_weight wv;            /* [n_head_kv*head_dim][n_embd] */
    ops_weight wo;            /* [n_embd][n_head*head_dim] */
    const float *q_norm;      /* [head_dim] */
    const float *k_norm;      /* [head_dim] */

    /* TGT_LAYER_DELTA */
    ops_weight wqkv;          /* [conv_ch][n_embd]: q (n_k_head*d_k), k (same), v (n_v_head*d_v) */
    ops_weight wz;            /* attn_gate: [n_v_head*d_v][n_embd] */
    ops_weight walpha;        /* ssm_alpha: [n_v_head][n_embd] */
    ops_weight wbeta;         /* ssm_beta: [n_v_head][n_embd] */
    ops_weight wssm_out;      /* [n_embd][n_v_head*d_v] */
    const float *conv_w;      /* ssm_conv1d: [conv_ch][conv_k] */
    const float *ssm_a;       /* [n_v_head]: -exp(A_log) */
    const float *dt_bias;     /* [n_v_head] */
    const float *ssm_norm;    /* [d_v] */
} tgt_layer;

typedef struct tgt_model {
    tgt_hparams hp;
    gguf_file *file;          /* owns the mapping the weights point into */
    ops_weight tok_embd;      /* [n_vocab][n_embd] */
    ops_weight output;        /* [n_vocab][n_embd]; token_embd when the file has no output */
    const float *output_norm; /* [n_embd] */
    tgt_layer *layers;        /* [n_layer] */
    int64_t n_attn_layers;    /* layers of kind TGT_LAYER_ATTN */
    int64_t n_delta_layers;   /* layers of kind TGT_LAYER_DELTA */
    float *owned;             /* f32 copies of small vectors stored as F16/BF16 in the file */
    const ops_backend *be;    /* where the weights live and the forward pass runs */
    td_dtype kv_type;         /* element type of the attention KV cache of new states: TD_F16
                               * on a GPU (half the bytes attention reads), TD_F32 on the CPU
                               * (the reference); set before tgt_state_init to choose */
    void *dev_arena;          /* the weights' backend copy (NULL on the CPU: the mapping) */
    size_t arena_bytes;       /* bytes of dev_arena (0 on the CPU) */
    size_t placed_bytes;      /* bytes of weights in caller memory (tgt_place_hook) */
    struct tgt_work *work;    /* scratch reused by forward passes (one caller at a time) */
    bool use_graphs;          /* run forward passes as recorded CUDA graphs (verifyd/
                               * target_graph.c): on when the backend has graphs, unless
                               * TANDEM_GRAPHS=0; cleared by itself if recording fails */
    struct tgt_graphs *graphs; /* the recorded forward passes (with them, the scratch is
                                * made for TGT_RESERVE_TOK tokens at load) */
    int64_t delta_chunk;      /* a prefill of several tokens runs the DeltaNet recurrence in
                               * chunks of this many positions (ops_delta.chunk, chunk ends at
                               * multiples of it); 0: token by token. A verify block and a
                               * single token are always token by token. Set by
                               * tgt_set_delta_chunk */
} tgt_model;

/* Loads a qwen3 or qwen35 GGUF file. Every tensor's presence, type and shape is checked
 * against the metadata; the error names the tensor or key. */
td_err tgt_load(tgt_model **out, const char *path);
/* The same on a backend: a GPU backend gets a device copy of every weight. */
td_err tgt_load_on(tgt_model **out, const char *path, const ops_backend *be);

/* Caller memory for the token embedding and LM head when the weights are placed on a device
 * backend: verifyd gives shared buffers that draftd maps, so the GPU holds those matrices
 * once. mem is asked for "token_embd.weight" and, unless the output is tied to it,
 * "output.weight", with their size in bytes; it sets *out to backend memory of at least that
 * size, aligned to 256 bytes, which the model then uses instead of its own arena (the caller keeps it alive until
 * tgt_free, and frees it itself, also when the load fails), or leaves *out NULL to keep the
 * tensor in the arena. An error from mem fails the load. Not called on the CPU backend,
 * whose weights stay in the file's mapping. */
typedef struct tgt_place_hook {
    td_err (*mem)(void *ctx, const char *name, size_t bytes, void **out);
    void *ctx;
} tgt_place_hook;

/* tgt_load_on, with hook (may be NULL) choosing where the two matrices above live. */
td_err tgt_load_placed(tgt_model **out, const char *path, const ops_backend *be,
                       const tgt_place_hook *hook);
td_err tgt_load_gguf(tgt_model **out, gguf_file *file); /* takes ownership of file on success */
void tgt_free(tgt_model *m);

/* Sets m->delta_chunk to n (0 .. OPS_DELTA_CHUNK_MAX). The chunked form gives outputs within
 * rounding of the token-by-token form, not its bits: a prompt resumed from the prefix cache
 * (its state made by decoding) then differs in the last bits from the same prompt prefilled
 * whole. TD_EINVAL out of range; TD_ENOTSUP where the heads are wider than it handles. */
td_err tgt_set_delta_chunk(tgt_model *m, int64_t n);

/* One sequence's memory: the attention KV cache and the DeltaNet recurrent and conv state,
 * plus what a partial accept needs to roll back without re-running the model. The arrays are
 * memory of the model's backend; the pointer lists are host memory. */
typedef struct tgt_state {
    const ops_backend *be; /* the model's backend, which owns the arrays (unless bound) */
    int64_t n_ctx;       /* positions the KV cache holds */
    int64_t n_past;      /* positions whose KV/state exist (committed) */
    int64_t n_attn;      /* attention layers of the model (length of k, v) */
    int64_t n_delta;     /* DeltaNet layers of the model (length of ssm, conv, rec_*) */
    td_dtype kv_type;    /* TD_F32 or TD_F16: the elements of k and v (the model's kv_type) */
    void **k;            /* per attention layer: [n_ctx][n_head_kv][head_dim] of kv_type */
    void **v;            /* per attention layer: [n_ctx][n_head_kv][head_dim] of kv_type */
    float **ssm;         /* per DeltaNet layer: [n_v_head][d_k][d_v] */
    float **conv;        /* per DeltaNet layer: [conv_k-1][conv_ch] raw inputs, oldest first */

    /* Rollback record of the last forward (recorded when its n_tok > 1 and record is set):
     * the DeltaNet state before it and each position's recurrence inputs, so keeping k of its
     * tokens replays only the cheap recurrence, never the weights. */
    int64_t rec_n_tok;   /* tokens of the recorded forward, 0 = nothing recorded */
    int64_t rec_cap;     /* tokens the record buffers hold */
    int64_t rec_pos0;    /* n_past before the recorded forward */
    float **rec_ssm0;    /* per DeltaNet layer: state before, [n_v_head][d_k][d_v] */
    float **rec_conv0;   /* per DeltaNet layer: conv state before, [conv_k-1][conv_ch] */
    float **rec_xconv;   /* per DeltaNet layer: raw conv inputs, [rec_cap][conv_ch] */
    float **rec_qkv;     /* per DeltaNet layer: normed q, k and v, [rec_cap][conv_ch] */
    float **rec_gb;      /* per DeltaNet layer: g then beta, [rec_cap][2][n_v_head] */
    bool bound;          /* the arrays live in caller memory (tgt_state_bind) */
    uint64_t gen;        /* identity of the arrays for recorded forward passes: new whenever
                          * they are (re)made */
} tgt_state;

/* Caller memory for one sequence's state (a kvd slot, laid out by common/kvlayout): each
 * pointer is the first layer's array, the others follow contiguously. */
typedef struct tgt_state_mem {
    void *k;          /* [n_attn][n_ctx][n_head_kv][head_dim] of the model's kv_type */
    void *v;          /* [n_attn][n_ctx][n_head_kv][head_dim] of the model's kv_type */
    float *ssm;       /* [n_delta][n_v_head][d_k][d_v] */
    float *conv;      /* [n_delta][conv_k-1][conv_ch] */
    float *rec_ssm0;  /* [n_delta][n_v_head][d_k][d_v] */
    float *rec_conv0; /* [n_delta][conv_k-1][conv_ch] */
    float *rec_xconv; /* [n_delta][rec_cap][conv_ch] */
    float *rec_qkv;   /* [n_delta][rec_cap][conv_ch] */
    float *rec_gb;    /* [n_delta][rec_cap][2][n_v_head] */
    int64_t rec_cap;  /* tokens the rollback record holds: the largest recorded forward */
} tgt_state_mem;

td_err tgt_state_init(tgt_state *s, const tgt_model *m, int64_t n_ctx);
/* Bytes of one attention K/V element of new states (kvlayout's kv_bytes): 2 for an f16
 * cache, 4 for f32, 0 for a model without attention layers. */
uint32_t tgt_kv_bytes(const tgt_model *m);
/* A state over caller memory: nothing is allocated but the per-layer pointer lists, and
 * nothing is cleared (n_past starts at 0; a caller that resumes a kept state sets it). A
 * recorded forward of more than rec_cap tokens is TD_ERANGE. */
td_err tgt_state_bind(tgt_state *s, const tgt_model *m, int64_t n_ctx, const tgt_state_mem *mem);
/* Frees what init allocated (only the pointer lists of a bound state). */
void tgt_state_free(tgt_state *s);
/* Forgets every position (a new sequence). */
td_err tgt_state_reset(const tgt_model *m, tgt_state *s);

/* What a forward pass returns besides the new state. logits and tap_out are memory of the
 * model's backend (device memory on a GPU); the token ids and taps lists are host memory. */
typedef struct tgt_out {
    float *logits;         /* NULL, or [n_tok][n_vocab] (or [1][n_vocab] with last_only) */
    bool last_only;        /* logits of the last token only */
    const int32_t *taps;   /* layer indices whose output (residual after the layer) to copy */
    int64_t n_taps;
    float *tap_out;        /* [n_tok][n_taps][n_embd] */
} tgt_out;

/* Runs tokens[n_tok] at positions s->n_past.. and advances n_past by n_tok. With record,
 * keeps what tgt_state_keep needs. TD_ERANGE when a token id is outside the vocabulary or
 * the context would overflow (the state is then unchanged). */
td_err tgt_forward(const tgt_model *m, tgt_state *s, const int32_t *tokens, int64_t n_tok,
                   bool record, const tgt_out *out);

/* Forward passes so far, where graphs are on (tgt_graph_wanted): */
typedef struct tgt_graph_counts {
    uint64_t recorded; /* recordings made */
    uint64_t replayed; /* runs of a recording, the first one after it was made included */
    uint64_t direct;   /* passes run op by op: not worth a recording (yet) */
} tgt_graph_counts;
void tgt_graph_stats(const tgt_model *m, tgt_graph_counts *c);
/* Drops every recording and what was seen: the next passes start as a fresh model's. */
void tgt_graphs_forget(const tgt_model *m);

/* After a recorded forward of n tokens, keeps the first keep (0 <= keep <= n): n_past and
 * the DeltaNet state become exactly those of having run only those tokens. KV entries past
 * the new n_past are dead and get overwritten later. */
td_err tgt_state_keep(const tgt_model *m, tgt_state *s, int64_t keep);

#endif
