/* Slot layout of kvd's pools (see kvlayout.h). */
#include "common/kvlayout.h"

#include <string.h>

/* Appends a region of n bytes at the 64-byte aligned end of *at; returns its offset. */
static uint64_t kvl_take(uint64_t *at, uint64_t n)
{
    uint64_t off = (*at + 63) & ~(uint64_t)63;
    *at = off + n;
    return off;
}

static uint64_t kvl_round_page(uint64_t n)
{
    return (n + 4095) & ~(uint64_t)4095;
}

static td_err kvl_bound(const char *field, uint32_t v, uint32_t lo, uint32_t hi)
{
    if (v < lo || v > hi)
        return err_set(TD_ERANGE, "layout: %s = %u is outside %u..%u", field, v, lo, hi);
    return TD_OK;
}

/* Every operand is at most 2^20, so each product of three stays below 2^60; the totals are
 * checked against KVL_POOL_MAX as they grow. */
td_err kvl_compute(const kvl_params *p, kvl_layout *out)
{
    TD_ASSERT(p && out);
    memset(out, 0, sizeof *out);
    TD_TRY(kvl_bound("slots", p->slots, 1, KVL_SLOTS_MAX));
    TD_TRY(kvl_bound("n_ctx", p->n_ctx, 2, KVL_CTX_MAX));
    TD_TRY(kvl_bound("block", p->block, 1, KVL_BLOCK_MAX));
    TD_TRY(kvl_bound("n_attn", p->n_attn, 0, KVL_LAYERS_MAX));
    TD_TRY(kvl_bound("n_delta", p->n_delta, 0, KVL_LAYERS_MAX));
    TD_TRY(kvl_bound("d_layers", p->d_layers, 0, KVL_LAYERS_MAX));
    if (p->n_attn + p->n_delta == 0)
        return err_set(TD_EINVAL, "layout: a target without layers");
    const char *names[] = {"n_kv", "head_dim", "n_v_head", "d_k", "d_v", "conv_ch", "n_taps",
                           "n_embd", "d_kv", "d_head_dim"};
    const uint32_t vals[] = {p->n_kv, p->head_dim, p->n_v_head, p->d_k, p->d_v, p->conv_ch,
                             p->n_taps, p->n_embd, p->d_kv, p->d_head_dim};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
        TD_TRY(kvl_bound(names[i], vals[i], 0, KVL_WIDTH_MAX));
    TD_TRY(kvl_bound("n_vocab", p->n_vocab, 0, KVL_VOCAB_MAX));
    TD_TRY(kvl_bound("conv_k", p->conv_k, p->n_delta ? 2 : 0, 64));
    TD_TRY(kvl_bound("ring", p->ring, p->n_taps ? 1 : 0, p->n_taps ? KVL_CTX_MAX : 0));
    if (p->n_attn && (!p->n_kv || !p->head_dim))
        return err_set(TD_EINVAL, "layout: attention layers without KV heads or head size");
    if (p->n_attn ? p->kv_bytes != 2 && p->kv_bytes != 4 : p->kv_bytes != 0)
        return err_set(TD_EINVAL, "layout: kv_bytes = %u (2 or 4 with attention layers, else 0)",
                       p->kv_bytes);
    if (p->n_taps ? p->feat_bytes != 2 && p->feat_bytes != 4 : p->feat_bytes != 0)
        return err_set(TD_EINVAL, "layout: feat_bytes = %u (2 or 4 with taps, else 0)",
                       p->feat_bytes);
    if (p->d_layers ? p->d_kv_bytes != 2 && p->d_kv_bytes != 4 : p->d_kv_bytes != 0)
        return err_set(TD_EINVAL, "layout: d_kv_bytes = %u (2 or 4 with a drafter, else 0)",
                       p->d_kv_bytes);
    if (p->n_delta && (!p->n_v_head || !p->d_k || !p->d_v || !p->conv_ch))
        return err_set(TD_EINVAL, "layout: DeltaNet layers with a zero dimension");
    if (p->n_taps && !p->n_embd)
        return err_set(TD_EINVAL, "layout: taps without a feature width");
    if (p->d_layers && (!p->n_taps || !p->d_kv || !p->d_head_dim))
        return err_set(TD_EINVAL, "layout: a drafter needs taps, KV heads and a head size");

    const uint64_t f = sizeof(float);
    uint64_t kv = (uint64_t)p->n_attn * p->n_ctx * p->n_kv * p->head_dim * p->kv_bytes;
    uint64_t ssm = (uint64_t)p->n_delta * p->n_v_head * p->d_k * p->d_v * f;
    uint64_t conv = p->n_delta ? (uint64_t)p->n_delta * (p->conv_k - 1) * p->conv_ch * f : 0;
    uint64_t rec_rows = (uint64_t)p->n_delta * p->block * p->conv_ch * f;
    uint64_t rec_gb = (uint64_t)p->n_delta * p->block * 2 * p->n_v_head * f;
    uint64_t feat = (uint64_t)p->ring * p->n_taps * p->n_embd * p->feat_bytes;
    uint64_t parts[] = {kv, ssm, conv, rec_rows, rec_gb, feat};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (parts[i] > KVL_POOL_MAX)
            return err_set(TD_ERANGE, "layout: a target slot region of %llu bytes is too large",
                           (unsigned long long)parts[i]);
    uint64_t at = 0;
    out->k = kvl_take(&at, kv);
    out->v = kvl_take(&at, kv);
    out->ssm = kvl_take(&at, ssm);
    out->conv = kvl_take(&at, conv);
    out->rec_ssm0 = kvl_take(&at, ssm);
    out->rec_conv0 = kvl_take(&at, conv);
    out->rec_xconv = kvl_take(&at, rec_rows);
    out->rec_qkv = kvl_take(&at, rec_rows);
    out->rec_gb = kvl_take(&at, rec_gb);
    out->feat = kvl_take(&at, feat);
    out->target_slot = kvl_round_page(at);
    if (out->target_slot > KVL_POOL_MAX / p->slots)
        return err_set(TD_ERANGE, "layout: %u slots of %llu bytes exceed the pool limit of %llu",
                       p->slots, (unsigned long long)out->target_slot,
                       (unsigned long long)KVL_POOL_MAX);
    out->target_bytes = out->target_slot * p->slots;

    if (p->d_layers) {
        uint64_t rows = (uint64_t)p->ring + p->block;
        uint64_t dkv = (uint64_t)p->d_layers * rows * p->d_kv * p->d_head_dim * p->d_kv_bytes;
        if (dkv > KVL_POOL_MAX)
            return err_set(TD_ERANGE, "layout: drafter context of %llu bytes is too large",
                           (unsigned long long)dkv);
        at = 0;
        out->d_header = kvl_take(&at, sizeof(kvl_draft_header));
        out->d_k = kvl_take(&at, dkv);
        out->d_v = kvl_take(&at, dkv);
        out->d_pos = kvl_take(&at, rows * sizeof(int32_t));
        out->draft_slot = kvl_round_page(at);
        if (out->draft_slot > KVL_POOL_MAX / p->slots)
            return err_set(TD_ERANGE, "layout: %u draft slots of %llu bytes are too large",
                           p->slots, (unsigned long long)out->draft_slot);
        out->draft_bytes = out->draft_slot * p->slots;
    }
    if (p->n_vocab && p->n_taps && p->block > 1)
        out->q_bytes = (uint64_t)(p->block - 1) * p->n_vocab * f;
    out->p = *p;
    return TD_OK;
}

double kvl_mib(uint64_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

td_err kvl_fit(const kvl_params *p, uint64_t room, uint32_t max, uint32_t *slots)
{
    TD_ASSERT(p && slots && max >= 1 && max <= KVL_SLOTS_MAX);
    *slots = 0;
    kvl_params one = *p;
    one.slots = 1;
    kvl_layout l;
    TD_TRY(kvl_compute(&one, &l));
    const uint64_t per = l.target_slot + l.draft_slot;
    const uint64_t n = room > l.q_bytes ? (room - l.q_bytes) / per : 0;
    if (n == 0) {
        const uint64_t kv = 2 * (l.v - l.k), state = l.feat - l.ssm;
        return err_set(TD_ENOMEM, "one sequence slot of %u positions takes %.0f MiB (attention "
                       "KV %.0f, DeltaNet state and rollback record %.0f, feature ring %.0f, "
                       "drafter context %.0f) and the proposal pool %.0f MiB, against %.0f MiB "
                       "of room", p->n_ctx, kvl_mib(per), kvl_mib(kv), kvl_mib(state),
                       kvl_mib(l.target_slot - l.feat), kvl_mib(l.draft_slot),
                       kvl_mib(l.q_bytes), kvl_mib(room));
    }
    *slots = n < max ? (uint32_t)n : max;
    return TD_OK;
}

bool kvl_same_target(const kvl_params *a, const kvl_params *b)
{
    return a->slots == b->slots && a->n_ctx == b->n_ctx && a->ring == b->ring &&
           a->block == b->block && a->n_attn == b->n_attn && a->n_kv == b->n_kv &&
           a->head_dim == b->head_dim && a->n_delta == b->n_delta &&
           a->n_v_head == b->n_v_head && a->d_k == b->d_k && a->d_v == b->d_v &&
           a->conv_k == b->conv_k && a->conv_ch == b->conv_ch && a->n_taps == b->n_taps &&
           a->n_embd == b->n_embd && a->n_vocab == b->n_vocab && a->kv_bytes == b->kv_bytes &&
           a->feat_bytes == b->feat_bytes;
}

bool kvl_same_draft(const kvl_params *a, const kvl_params *b)
{
    return a->slots == b->slots && a->ring == b->ring && a->block == b->block &&
           a->d_layers == b->d_layers && a->d_kv == b->d_kv && a->d_head_dim == b->d_head_dim &&
           a->d_kv_bytes == b->d_kv_bytes;
}

void kvl_params_to_array(const kvl_params *p, uint32_t v[KVL_N_PARAMS])
{
    _Static_assert(sizeof(kvl_params) == KVL_N_PARAMS * sizeof(uint32_t),
                   "kvl_params is KVL_N_PARAMS uint32_t fields");
    memcpy(v, p, sizeof *p);
}

void kvl_params_from_array(kvl_params *p, const uint32_t v[KVL_N_PARAMS])
{
    memcpy(p, v, sizeof *p);
}
