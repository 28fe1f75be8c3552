/* The DFlash drafter's config.json (the z-lab checkpoints, DESIGN section 7) and the check
 * that its model.safetensors holds every tensor with the shape that config implies.
 *
 * Key lookup: a key inside "dflash_config" overrides the top-level key of the same name;
 * JSON null counts as absent. Sliding windows follow transformers' Qwen3Config, which the
 * reference drafter is built on: "sliding_window" takes effect only when "use_sliding_window"
 * is true, and without "layer_types" layers from "max_window_layers" on are sliding. */
#ifndef TANDEM_COMMON_DFLASH_CONFIG_H
#define TANDEM_COMMON_DFLASH_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/safetensors.h"

#define DFLASH_MAX_LAYERS 64 /* drafter layers (published drafters have 1..8) */
#define DFLASH_MAX_TAPS 64   /* target layers tapped for features */

typedef struct dflash_layer {
    bool sliding;    /* layer_types[i] == "sliding_attention" */
    bool causal;     /* a query at position p sees keys p' <= p only */
    uint32_t window; /* tokens: keys need p - p' < window (|p - p'| when not causal); 0 = no limit */
} dflash_layer;

typedef struct dflash_config {
    uint32_t n_layers;           /* num_hidden_layers */
    uint32_t hidden;             /* hidden_size: width of the block stream and of H_t */
    uint32_t ffn;                /* intermediate_size: SwiGLU width */
    uint32_t n_heads;            /* num_attention_heads */
    uint32_t n_kv_heads;         /* num_key_value_heads (default n_heads); divides n_heads */
    uint32_t head_dim;           /* head_dim (default hidden / n_heads) */
    uint32_t vocab;              /* vocab_size: the target's vocabulary */
    uint32_t block_size;         /* tokens per drafted block (default 16) */
    uint32_t mask_token_id;      /* token id of the MASK slots, < vocab */
    double rope_theta;           /* RoPE base (default 10000, as transformers) */
    double rms_eps;              /* rms_norm_eps (default 1e-6) */
    uint32_t n_taps;             /* entries in target_layer_ids; 0 until resolved when absent */
    uint32_t target_layer_ids[DFLASH_MAX_TAPS]; /* [n_taps] target layer whose output is tapped */
    bool taps_given;             /* target_layer_ids came from the file */
    uint32_t n_target_layers;    /* num_target_layers: the target depth trained against; 0 = absent */
    uint32_t sliding_window;     /* tokens, as declared (0 = none or disabled) */
    dflash_layer layers[DFLASH_MAX_LAYERS]; /* [n_layers] attention mask of each layer */
    double input_embedding_scale;  /* block embeddings are multiplied by this (default 1) */
    double output_multiplier;      /* logits are multiplied by this (default 1) */
    double final_logit_softcap;    /* logits = cap * tanh(logits / cap) when > 0; 0 = off */
} dflash_config;

/* Parses config.json text. Errors name the key: TD_EFORMAT (not JSON, wrong type, missing
 * required key), TD_ERANGE (a value out of bounds), TD_ENOTSUP (a valid config this drafter
 * runtime does not implement: RoPE scaling such as YaRN, another architecture, attention
 * bias, a layer type other than full/sliding attention). */
td_err dflash_config_parse(dflash_config *cfg, const char *json, size_t len);

/* Reads and parses a config.json file; errors are prefixed with the path. */
td_err dflash_config_load(dflash_config *cfg, const char *path);

/* Binds the config to a target with n_target main layers: fills the default
 * target_layer_ids when the file has none (round(1 + i * (n_target - 4) / (n_layers - 1)),
 * half to even; n_target div 2 for a one-layer drafter) and checks every id < n_target and
 * that num_target_layers, when present, equals n_target. */
td_err dflash_config_resolve(dflash_config *cfg, uint32_t n_target);

/* Checks that st holds every drafter tensor with the shape the config implies (PyTorch
 * [out, in] order): fc.weight [hidden, n_taps * target_hidden], hidden_norm.weight and
 * norm.weight [hidden], and per layer the norms, q/k/v/o projections, q/k norms and the MLP.
 * A missing, mis-shaped or non-BF16/F16/F32 tensor is an error naming it. Needs a resolved
 * config (n_taps > 0). */
td_err dflash_tensors_check(const dflash_config *cfg, const st_file *st, uint32_t target_hidden);

#endif
