/* kvlayout: where each piece of a sequence's memory lies inside kvd's shared pools, computed
 * by one function (kvl_compute) from one parameter set, so kvd, verifyd and draftd agree
 * byte for byte (pipeline contract, DESIGN sections 1-2).
 *
 * Two pools, each one shared buffer holding `slots` equal slots (slot i at i * slot bytes):
 * - target pool (written by verifyd; draftd reads the feature ring): the target's attention
 *   KV, DeltaNet recurrent and conv state, the rollback record of one verify block, and the
 *   feature ring of tap-layer outputs (position p at ring row p % ring).
 * - draft pool (draftd's): a small header, the drafter's context K/V over ring + block rows
 *   and the absolute position of each row. It outlives a draftd process, so a restarted
 *   draftd continues where the last one stopped.
 * - proposal pool (written by draftd, read by verifyd): one block's draft distributions q,
 *   [block - 1][n_vocab] f32, so sampled proposals do not travel inside messages. There is
 *   one, not one per slot: draftd answers one proposal at a time and verifyd reads the rows
 *   before it asks for the next.
 * All arrays are f32 but the target's attention K/V and the drafter's context K/V, whose
 * elements are f32 or f16 (kv_bytes, d_kv_bytes: the caches' types, f16 on a GPU), in host
 * memory for the cpu kind of shared buffer and in device memory for the cuda kind (the same
 * offsets either way); every region starts on a 64-byte boundary and every slot on a
 * 4096-byte one. */
#ifndef TANDEM_COMMON_KVLAYOUT_H
#define TANDEM_COMMON_KVLAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

/* Bounds kvl_compute enforces (the parameters arrive from other processes). */
#define KVL_SLOTS_MAX 1024
#define KVL_CTX_MAX (1u << 20)      /* positions per sequence */
#define KVL_BLOCK_MAX 64            /* verify block tokens (SPEC_MAX_BLOCK) */
#define KVL_LAYERS_MAX 1024         /* layers of one kind */
#define KVL_WIDTH_MAX (1u << 16)    /* heads, head dims, channels, widths */
#define KVL_POOL_MAX ((uint64_t)1 << 40) /* bytes of one pool */
#define KVL_VOCAB_MAX (1u << 20)    /* tokens of the vocabulary (MSG_Q_SUPPORT_MAX) */

typedef struct kvl_params {
    uint32_t slots;      /* sequence slots in each pool, >= 1 */
    uint32_t n_ctx;      /* positions per sequence (target KV rows), >= 2 */
    uint32_t ring;       /* feature ring rows = drafter context window; 0 when n_taps is 0 */
    uint32_t block;      /* tokens of a verify block: rollback record rows, drafter block rows */
    uint32_t n_attn;     /* target attention layers */
    uint32_t n_kv;       /* KV heads of an attention layer */
    uint32_t head_dim;   /* values per attention head */
    uint32_t n_delta;    /* target DeltaNet layers (0 for qwen3) */
    uint32_t n_v_head;   /* DeltaNet value heads */
    uint32_t d_k;        /* DeltaNet key values per head */
    uint32_t d_v;        /* DeltaNet values per value head */
    uint32_t conv_k;     /* DeltaNet conv taps */
    uint32_t conv_ch;    /* DeltaNet conv channels */
    uint32_t n_taps;     /* tapped target layers feeding the drafter (0: no ring, no drafter) */
    uint32_t n_embd;     /* width of one tap feature (the target's residual width) */
    uint32_t d_layers;   /* drafter layers (0: no draft pool) */
    uint32_t d_kv;       /* drafter KV heads */
    uint32_t d_head_dim; /* drafter values per head */
    uint32_t n_vocab;    /* target vocabulary (tokens): proposal pool rows; 0 = no pool */
    uint32_t kv_bytes;   /* bytes of a target K/V element: 4 (f32) or 2 (f16); 0 without
                          * attention layers */
    uint32_t d_kv_bytes; /* bytes of a drafter context K/V element: 4 or 2; 0 without a
                          * drafter */
    uint32_t feat_bytes; /* bytes of a feature ring element: 4 (f32) or 2 (bf16: a GPU's,
                          * whose drafter reads its inputs rounded to bf16); 0 without taps */
} kvl_params;

#define KVL_N_PARAMS 22 /* fields of kvl_params, all uint32_t, in declaration order */

/* The header at the start of every draft slot, written by draftd only. */
typedef struct kvl_draft_header {
    uint64_t slot_gen;   /* kvd's generation of the slot contents this context belongs to */
    uint64_t drafter_id; /* the drafter that wrote it (a hash of its files) */
    int64_t n_ctx;       /* positions in the context, absolute (dfl_state.n_ctx) */
} kvl_draft_header;

/* Byte offsets inside one slot; sizes in bytes. */
typedef struct kvl_layout {
    kvl_params p;
    /* target slot */
    uint64_t k, v;           /* [n_attn][n_ctx][n_kv][head_dim] each, kv_bytes elements */
    uint64_t ssm;            /* [n_delta][n_v_head][d_k][d_v] */
    uint64_t conv;           /* [n_delta][conv_k - 1][conv_ch] raw inputs, oldest first */
    uint64_t rec_ssm0;       /* [n_delta][n_v_head][d_k][d_v] */
    uint64_t rec_conv0;      /* [n_delta][conv_k - 1][conv_ch] */
    uint64_t rec_xconv;      /* [n_delta][block][conv_ch] */
    uint64_t rec_qkv;        /* [n_delta][block][conv_ch] */
    uint64_t rec_gb;         /* [n_delta][block][2][n_v_head] */
    uint64_t feat;           /* [ring][n_taps][n_embd] feature ring, feat_bytes elements */
    uint64_t target_slot;    /* bytes of one target slot */
    uint64_t target_bytes;   /* bytes of the target pool: slots * target_slot */
    /* draft slot (all zero when d_layers is 0) */
    uint64_t d_header;       /* kvl_draft_header */
    uint64_t d_k, d_v;       /* [d_layers][ring + block][d_kv][d_head_dim] each, d_kv_bytes
                              * elements */
    uint64_t d_pos;          /* [ring + block] int32 absolute positions */
    uint64_t draft_slot;     /* bytes of one draft slot */
    uint64_t draft_bytes;    /* bytes of the draft pool: slots * draft_slot */
    /* proposal pool (zero when n_vocab is 0, block is 1 or there are no taps) */
    uint64_t q_bytes;        /* [block - 1][n_vocab] f32 draft distributions */
} kvl_layout;

/* Checks p (every bound above, a ring and block that fit, no overflow) and fills out. The
 * parameters come from other processes: anything wrong is TD_EINVAL or TD_ERANGE with the
 * field named. */
td_err kvl_compute(const kvl_params *p, kvl_layout *out);

/* How many sequence slots laid out as p (its slots ignored; with a drafter part, the draft
 * pool too) fit in room bytes, at most max: each slot takes a target slot and a draft slot,
 * the proposal pool its q_bytes once. TD_ENOMEM when not even one fits, saying what a slot
 * takes (attention KV, DeltaNet state and rollback record, feature ring, drafter context)
 * against the room. */
td_err kvl_fit(const kvl_params *p, uint64_t room, uint32_t max, uint32_t *slots);

/* bytes in MiB, for messages about the pools' sizes */
double kvl_mib(uint64_t bytes);

/* True when a and b lay out the target pool (resp. the draft pool) the same way. */
bool kvl_same_target(const kvl_params *a, const kvl_params *b);
bool kvl_same_draft(const kvl_params *a, const kvl_params *b);

/* The fields of p as an array of KVL_N_PARAMS values and back (for the wire). */
void kvl_params_to_array(const kvl_params *p, uint32_t v[KVL_N_PARAMS]);
void kvl_params_from_array(kvl_params *p, const uint32_t v[KVL_N_PARAMS]);

#endif
