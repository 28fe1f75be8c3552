/* Models for speculative-decoding tests, written as real files: a DFlash drafter checkpoint
 * for a target (random bf16 weights, or "silent" ones whose every slot proposes one token),
 * and a copy of a target GGUF that repeats one token more readily (so steps accept nothing,
 * part of a block, or all of it); and the generation loop the tests compare against. */
#ifndef TANDEM_TESTS_SUPPORT_MODEL_FIXTURE_H
#define TANDEM_TESTS_SUPPORT_MODEL_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "draftd/dflash.h"
#include "verifyd/spec.h"
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

/* mf_drafter_write, then the drafter loaded for tm (sharing its embedding and LM head). */
td_err mf_drafter_make(dfl_model **out, const char *dir, const tgt_model *tm,
                       const mf_drafter *ds, uint64_t seed);

/* mf_drafter_make into root/name; the running (cmocka) test fails where it cannot. */
dfl_model *mf_drafter_in(const char *root, const char *name, const tgt_model *tm,
                         const mf_drafter *ds, uint64_t seed);

/* Fails the running test unless a drafter's context ring of 8 slots over 21 positions of
 * random features (more than the ring) holds the same last 8 positions whether they are
 * given all at once, in pieces of 3 that wrap inside a piece, or one by one: the next block's
 * logits the same bits each way, for both element types of the context; and a block's first
 * 1, 3 or block_size - 2 rows of logits alone (dfl_propose's n_rows) are the bits of those rows
 * of the whole block, nothing written past them, 0 or block_size rows refused. Runs on dm's
 * backend, leaving dm->kv_type as it found it. */
void mf_dflash_ring_check(const tgt_model *tm, dfl_model *dm);

/* Copies the f32 GGUF src to path with token x's embedding and output rows set to s times its
 * embedding: the larger s, the more the target keeps repeating x once it appears. */
td_err mf_target_write_scaled(const char *path, const char *src, int32_t x, float s);

/* The first n tokens after prompt from s (set up, nothing run yet): its prefill, then steps;
 * tokens a last step emits past n are dropped. An error of spec, or TD_EINVAL for a step that
 * emits no token or more than a block. */
td_err mf_spec_run(spec_seq *s, const int32_t *prompt, int64_t n_prompt, int64_t n, int32_t *out);

/* The same in a sequence of its own set up by cfg; its stats go to *stats (may be NULL). */
td_err mf_generate(const tgt_model *tm, const spec_cfg *cfg, const int32_t *prompt,
                   int64_t n_prompt, int64_t n, int32_t *out, spec_stats *stats);

#endif
