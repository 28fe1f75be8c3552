/* Models for speculative-decoding tests, written as real files: a DFlash drafter checkpoint
 * for a target (random bf16 weights, or "silent" ones whose every slot proposes one token),
 * and a copy of a target GGUF that repeats one token more readily (so steps accept nothing,
 * part of a block, or all of it). */
#ifndef TANDEM_TESTS_SUPPORT_MODEL_FIXTURE_H
#define TANDEM_TESTS_SUPPORT_MODEL_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "verifyd/target.h"

typedef struct mf_drafter {
    int block;        /* block_size */
    int n_layers;     /* also the number of taps */
    bool silent;      /* o_proj and down_proj zero: every slot proposes the same token */
    uint32_t mask_id; /* the mask token (the silent drafter's proposal) */
    bool sliding;     /* layer 0 causal sliding-window attention (window 4), the rest full */
} mf_drafter;

/* Writes dir/config.json and dir/model.safetensors of a drafter for tm. */
td_err mf_drafter_write(const char *dir, const tgt_model *tm, const mf_drafter *ds, uint64_t seed);

/* Copies the f32 GGUF src to path with token x's embedding and output rows set to s times its
 * embedding: the larger s, the more the target keeps repeating x once it appears. */
td_err mf_target_write_scaled(const char *path, const char *src, int32_t x, float s);

#endif
