/* Synthetic models of real shapes for `tandem bench` (no checkpoint needed):
 *
 * - a qwen35 target GGUF with every tensor under its real name and shape, quantised like
 *   llama.cpp's Q4_K_M (Q4_K for most matrices; Q6_K for output and the "more bits" layers of
 *   ffn_down / attn_v / attn_qkv; Q5_K for ssm_out; F32 norms and small ssm tensors), the
 *   converter's metadata and its MTP block after the main layers (tandem never runs it, but
 *   llama.cpp's qwen35 loader requires its tensors once nextn_predict_layers says it is
 *   there), a byte-level BPE tokenizer of exactly the vocabulary size and the Qwen3.5 chat
 *   template, so other engines load the same file;
 * - a DFlash drafter (config.json + model.safetensors, bf16) for that target.
 *
 * Weights are random but valid: quantised blocks of uniform values scaled so every matrix
 * maps unit-variance inputs to unit-variance outputs, norm weights 1, DeltaNet decay and
 * time-step parameters in the ranges trained models have; activations stay finite through
 * every layer. Generation is deterministic for a seed and spread over OpenMP threads. */
#ifndef TANDEM_CLI_BENCH_MODEL_H
#define TANDEM_CLI_BENCH_MODEL_H

#include <stdint.h>

#include "common/err.h"
#include "common/gguf.h"

#define BMODEL_MAX_TAPS 8

/* One model size: the target's shape and its drafter's. */
typedef struct bmodel_shape {
    const char *name;          /* "27b", "tiny" */
    int64_t n_layer;           /* main layers */
    int64_t n_nextn;           /* MTP blocks after the main layers (written, never run) */
    int64_t n_embd;            /* residual width */
    int64_t n_ff;              /* SwiGLU inner width */
    int64_t n_head;            /* attention query heads */
    int64_t n_head_kv;         /* attention key/value heads */
    int64_t head_dim;          /* values per attention head */
    int64_t n_rot;             /* rotated dims per head */
    int32_t rope_sections[4];  /* M-RoPE dims per axis (pairs), as the converter writes them */
    float rope_theta;          /* RoPE base */
    float eps;                 /* RMSNorm eps */
    int64_t n_ctx_train;       /* context_length */
    int64_t full_attn_interval; /* layer i is attention when (i+1) % this == 0 */
    int64_t conv_k;            /* DeltaNet conv taps */
    int64_t d_state;           /* DeltaNet key (and value) values per head */
    int64_t n_k_head;          /* DeltaNet key/query heads */
    int64_t n_v_head;          /* DeltaNet value heads */
    int64_t n_vocab;           /* rows of token_embd and output */
    int64_t n_pad;             /* padding rows at the end of the vocabulary ([PADi], UNUSED) */

    int64_t d_layer;           /* drafter layers */
    int64_t d_head;            /* drafter query heads */
    int64_t d_head_kv;         /* drafter key/value heads */
    int64_t d_head_dim;        /* drafter values per head */
    int64_t d_block;           /* drafted block size */
    int64_t d_n_taps;          /* target layers tapped */
    int32_t d_taps[BMODEL_MAX_TAPS]; /* [d_n_taps] target_layer_ids */
} bmodel_shape;

/* The shape called name ("27b", "tiny"), or NULL. */
const bmodel_shape *bmodel_shape_find(const char *name);

/* "27b|tiny": the names bmodel_shape_find knows, for usage lines. */
const char *bmodel_shape_names(void);

/* Token id of the drafter's MASK slots: the first padding row (248070 for the 27B shape). */
int64_t bmodel_mask_token(const bmodel_shape *s);

/* The whole target GGUF in a new writer (free it with gguf_writer_free): metadata, tokenizer
 * and tensors. The writer holds the one copy of the weights (17.07 GB for 27b: 16.81 GB of
 * main model, 0.26 GB of MTP block). */
td_err bmodel_build(gguf_writer **out, const bmodel_shape *s, uint64_t seed);

/* Sets tokenizer.ggml.* and tokenizer.chat_template (cli/bench_vocab.c): n_vocab tokens =
 * the 256 byte-level tokens, merged tokens, the 26 Qwen added tokens, then n_pad [PADi]. */
td_err bmodel_vocab_set(gguf_writer *w, int64_t n_vocab, int64_t n_pad);

/* The Qwen3.5 chat template (a copy of tests/data/chat/Qwen3.5-4B.jinja). */
extern const char bmodel_chat_template[];

/* A DFlash drafter for one target. */
typedef struct bmodel_drafter {
    int64_t n_layer;          /* drafter layers */
    int64_t hidden;           /* = the target's n_embd (it borrows the target's embedding) */
    int64_t ffn;              /* SwiGLU inner width */
    int64_t n_head;           /* query heads */
    int64_t n_head_kv;        /* key/value heads */
    int64_t head_dim;         /* values per head */
    int64_t block;            /* block_size */
    int64_t vocab;            /* the target's vocabulary */
    int64_t mask_token;       /* < vocab */
    int64_t n_target_layers;  /* the target's main layers */
    int64_t n_taps;           /* entries of taps; 0: config.json leaves target_layer_ids out */
    int32_t taps[BMODEL_MAX_TAPS]; /* [n_taps] target_layer_ids */
    double rope_theta;        /* RoPE base */
    double eps;               /* RMSNorm eps */
} bmodel_drafter;

/* The drafter of shape s for a target of these dimensions (the shape's own target, or any
 * qwen35 file given to the benchmark). The shape's taps are kept when they fit the target's
 * depth, else left to the config's default rule. */
void bmodel_drafter_init(bmodel_drafter *d, const bmodel_shape *s, int64_t n_embd, int64_t n_ff,
                         int64_t n_vocab, int64_t n_target_layers);

/* Writes dir/config.json and dir/model.safetensors (bf16); dir must exist. */
td_err bmodel_drafter_write(const char *dir, const bmodel_drafter *d, uint64_t seed);

#endif
