/* DFlash drafter: loading, context K/V from target features, one-pass block proposal. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "draftd/dflash.h"

/* --- loading ---------------------------------------------------------------------------- */

typedef struct dfl_loader {
    dfl_model *m;
    size_t used, cap; /* floats of m->owned */
} dfl_loader;

static td_err dfl_matrix(dfl_loader *ld, ops_weight *w, const char *name)
{
    const st_tensor *t = st_find(ld->m->st, name);
    td_dtype type;
    if (!t)
        return err_set(TD_EFORMAT, "drafter tensor %s is missing", name);
    TD_TRY(st_tensor_type(t, &type));
    if (t->n_dims != 2)
        return err_set(TD_EFORMAT, "drafter tensor %s is not a matrix", name);
    td_err e = ops_weight_init(w, type, (int64_t)t->shape[0], (int64_t)t->shape[1], t->data);
    return e == TD_OK ? TD_OK : err_wrap(e, "drafter tensor %s", name);
}

static td_err dfl_vector(dfl_loader *ld, const float **out, const char *name)
{
    const st_tensor *t = st_find(ld->m->st, name);
    td_dtype type;
    if (!t)
        return err_set(TD_EFORMAT, "drafter tensor %s is missing", name);
    TD_TRY(st_tensor_type(t, &type));
    if (ld->used + t->n_elements > ld->cap)
        return err_set(TD_EFORMAT, "drafter tensor %s is larger than expected", name);
    float *dst = ld->m->owned + ld->used;
    /* Copied even when F32: safetensors data carries no alignment promise. */
    TD_TRY(cpu_dequantize_row(type, t->data, dst, (int64_t)t->n_elements));
    ld->used += t->n_elements;
    *out = dst;
    return TD_OK;
}

static td_err dfl_load_tensors(dfl_loader *ld)
{
    dfl_model *m = ld->m;
    const dflash_config *c = &m->cfg;
    char n[128];
    TD_TRY(dfl_matrix(ld, &m->fc, "fc.weight"));
    TD_TRY(dfl_vector(ld, &m->hidden_norm, "hidden_norm.weight"));
    TD_TRY(dfl_vector(ld, &m->norm, "norm.weight"));
    for (uint32_t il = 0; il < c->n_layers; il++) {
        dfl_layer *L = &m->layers[il];
#define DFL_NAME(suffix) (snprintf(n, sizeof n, "layers.%u." suffix, il), n)
        TD_TRY(dfl_vector(ld, &L->in_norm, DFL_NAME("input_layernorm.weight")));
        TD_TRY(dfl_vector(ld, &L->post_norm, DFL_NAME("post_attention_layernorm.weight")));
        TD_TRY(dfl_vector(ld, &L->q_norm, DFL_NAME("self_attn.q_norm.weight")));
        TD_TRY(dfl_vector(ld, &L->k_norm, DFL_NAME("self_attn.k_norm.weight")));
        TD_TRY(dfl_matrix(ld, &L->wq, DFL_NAME("self_attn.q_proj.weight")));
        TD_TRY(dfl_matrix(ld, &L->wk, DFL_NAME("self_attn.k_proj.weight")));
        TD_TRY(dfl_matrix(ld, &L->wv, DFL_NAME("self_attn.v_proj.weight")));
        TD_TRY(dfl_matrix(ld, &L->wo, DFL_NAME("self_attn.o_proj.weight")));
        TD_TRY(dfl_matrix(ld, &L->gate, DFL_NAME("mlp.gate_proj.weight")));
        TD_TRY(dfl_matrix(ld, &L->up, DFL_NAME("mlp.up_proj.weight")));
        TD_TRY(dfl_matrix(ld, &L->down, DFL_NAME("mlp.down_proj.weight")));
#undef DFL_NAME
    }
    return TD_OK;
}

td_err dfl_load(dfl_model **out, const char *dir, uint32_t n_target_layers,
                const ops_weight *tok_embd, const ops_weight *lm_head)
{
    char path[4096];
    *out = NULL;
    dfl_model *m = calloc(1, sizeof *m);
    if (!m)
        return err_set(TD_ENOMEM, "out of memory loading the drafter");
    snprintf(path, sizeof path, "%s/config.json", dir);
    td_err e = dflash_config_load(&m->cfg, path);
    if (e == TD_OK)
        e = dflash_config_resolve(&m->cfg, n_target_layers);
    const dflash_config *c = &m->cfg;
    if (e == TD_OK && (tok_embd->cols != c->hidden || lm_head->cols != c->hidden))
        e = err_set(TD_EFORMAT, "drafter hidden size %u differs from the target's %lld",
                    c->hidden, (long long)tok_embd->cols);
    if (e == TD_OK && c->mask_token_id >= tok_embd->rows)
        e = err_set(TD_EFORMAT, "drafter mask token %u is outside the target vocabulary of %lld",
                    c->mask_token_id, (long long)tok_embd->rows);
    if (e == TD_OK) {
        m->target_hidden = tok_embd->cols;
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        e = st_open(&m->st, path);
    }
    if (e == TD_OK)
        e = dflash_tensors_check(c, m->st, (uint32_t)m->target_hidden);
    dfl_loader ld = {.m = m};
    if (e == TD_OK) {
        ld.cap = (size_t)c->hidden * (2 + 2 * c->n_layers) + (size_t)c->head_dim * 2 * c->n_layers;
        m->owned = malloc(ld.cap * sizeof(float));
        m->layers = calloc(c->n_layers, sizeof *m->layers);
        if (!m->owned || !m->layers)
            e = err_set(TD_ENOMEM, "out of memory loading the drafter");
    }
    if (e == TD_OK)
        e = dfl_load_tensors(&ld);
    if (e != TD_OK) {
        dfl_free(m);
        return err_wrap(e, "loading drafter %s", dir);
    }
    m->tok_embd = *tok_embd;
    m->lm_head = *lm_head;
    *out = m;
    return TD_OK;
}

void dfl_free(dfl_model *m)
{
    if (!m)
        return;
    if (m->st)
        st_close(m->st);
    free(m->layers);
    free(m->owned);
    free(m);
}

/* --- state ------------------------------------------------------------------------------ */

td_err dfl_state_init(dfl_state *s, const dfl_model *m, int64_t cap)
{
    const dflash_config *c = &m->cfg;
    memset(s, 0, sizeof *s);
    if (cap <= 0 || cap > INT32_MAX / 2)
        return err_set(TD_EINVAL, "drafter context window %lld is out of range", (long long)cap);
    s->cap = cap;
    s->block = c->block_size;
    s->n_layers = c->n_layers;
    size_t slots = (size_t)(cap + s->block), kv = (size_t)c->n_kv_heads * c->head_dim;
    s->k = calloc(c->n_layers, sizeof *s->k);
    s->v = calloc(c->n_layers, sizeof *s->v);
    s->pos = calloc(slots, sizeof *s->pos);
    bool ok = s->k && s->v && s->pos;
    for (uint32_t i = 0; ok && i < c->n_layers; i++) {
        s->k[i] = calloc(slots * kv, sizeof(float));
        s->v[i] = calloc(slots * kv, sizeof(float));
        ok = s->k[i] && s->v[i];
    }
    if (!ok) {
        dfl_state_free(s);
        return err_set(TD_ENOMEM, "out of memory for a drafter context of %lld", (long long)cap);
    }
    return TD_OK;
}

td_err dfl_state_bind(dfl_state *s, const dfl_model *m, int64_t cap, int64_t rows, float *k,
                      float *v, int32_t *pos)
{
    const dflash_config *c = &m->cfg;
    memset(s, 0, sizeof *s);
    if (cap <= 0 || cap > INT32_MAX / 2 || rows < cap + (int64_t)c->block_size)
        return err_set(TD_EINVAL, "drafter context window %lld in %lld rows is out of range",
                       (long long)cap, (long long)rows);
    s->bound = true;
    s->cap = cap;
    s->block = c->block_size;
    s->n_layers = c->n_layers;
    s->pos = pos;
    s->k = calloc(c->n_layers, sizeof *s->k);
    s->v = calloc(c->n_layers, sizeof *s->v);
    if (!s->k || !s->v) {
        dfl_state_free(s);
        return err_set(TD_ENOMEM, "out of memory binding a drafter context");
    }
    size_t layer = (size_t)rows * c->n_kv_heads * c->head_dim;
    for (uint32_t i = 0; i < c->n_layers; i++) {
        s->k[i] = k + i * layer;
        s->v[i] = v + i * layer;
    }
    return TD_OK;
}

void dfl_state_free(dfl_state *s)
{
    if (s->bound) {
        free(s->k);
        free(s->v);
        memset(s, 0, sizeof *s);
        return;
    }
    for (int64_t i = 0; i < s->n_layers; i++) {
        if (s->k)
            free(s->k[i]);
        if (s->v)
            free(s->v[i]);
    }
    free(s->k);
    free(s->v);
    free(s->pos);
    memset(s, 0, sizeof *s);
}

void dfl_state_reset(dfl_state *s)
{
    s->n_ctx = 0;
}

/* --- compute ---------------------------------------------------------------------------- */

/* K = RoPE(k_norm(k_proj(x))), V = v_proj(x) for n rows of x at positions pos, written to
 * the slots starting at slot (rows stay contiguous; the caller handles ring wrap). */
static void dfl_kv(const dfl_model *m, const dfl_layer *L, const float *x, int64_t n,
                   const int32_t *pos, float *k_out, float *v_out)
{
    const dflash_config *c = &m->cfg;
    int64_t hd = c->head_dim, kvw = (int64_t)c->n_kv_heads * hd;
    cpu_matmul(k_out, x, &L->wk, n);
    cpu_matmul(v_out, x, &L->wv, n);
    cpu_rmsnorm(k_out, k_out, L->k_norm, n * c->n_kv_heads, hd, hd, (float)c->rms_eps);
    cpu_rope_neox(k_out, n, c->n_kv_heads, kvw, hd, hd, pos, (float)c->rope_theta);
}

td_err dfl_add_context(const dfl_model *m, dfl_state *s, const float *feat, int64_t n)
{
    const dflash_config *c = &m->cfg;
    if (n <= 0)
        return TD_OK;
    int64_t H = c->hidden, kvw = (int64_t)c->n_kv_heads * c->head_dim;
    float *h = malloc((size_t)(n * H) * sizeof(float));
    float *kb = malloc((size_t)(n * kvw) * sizeof(float));
    float *vb = malloc((size_t)(n * kvw) * sizeof(float));
    int32_t *pos = malloc((size_t)n * sizeof(int32_t));
    if (!h || !kb || !vb || !pos) {
        free(h), free(kb), free(vb), free(pos);
        return err_set(TD_ENOMEM, "out of memory adding %lld drafter context positions",
                       (long long)n);
    }
    for (int64_t i = 0; i < n; i++)
        pos[i] = (int32_t)(s->n_ctx + i);
    /* H_t = hidden_norm(fc(concat of tap features)); it enters k_proj/v_proj as it is. */
    cpu_matmul(h, feat, &m->fc, n);
    cpu_rmsnorm(h, h, m->hidden_norm, n, H, H, (float)c->rms_eps);
    for (uint32_t il = 0; il < c->n_layers; il++) {
        dfl_kv(m, &m->layers[il], h, n, pos, kb, vb);
        for (int64_t i = 0; i < n; i++) {
            int64_t slot = (s->n_ctx + i) % s->cap;
            memcpy(s->k[il] + slot * kvw, kb + i * kvw, (size_t)kvw * sizeof(float));
            memcpy(s->v[il] + slot * kvw, vb + i * kvw, (size_t)kvw * sizeof(float));
        }
    }
    for (int64_t i = 0; i < n; i++)
        s->pos[(s->n_ctx + i) % s->cap] = pos[i];
    s->n_ctx += n;
    free(h), free(kb), free(vb), free(pos);
    return TD_OK;
}

td_err dfl_propose(const dfl_model *m, dfl_state *s, int32_t pending, float *logits)
{
    const dflash_config *c = &m->cfg;
    int64_t B = c->block_size, H = c->hidden, hd = c->head_dim;
    int64_t qw = (int64_t)c->n_heads * hd, kvw = (int64_t)c->n_kv_heads * hd;
    int64_t n_valid = s->n_ctx < s->cap ? s->n_ctx : s->cap;
    int64_t wmax = qw > (int64_t)c->ffn ? qw : (int64_t)c->ffn;
    if (wmax < H)
        wmax = H;
    float *x = malloc((size_t)(B * H) * sizeof(float));
    float *h = malloc((size_t)(B * H) * sizeof(float));
    float *q = malloc((size_t)(B * wmax) * sizeof(float));
    float *a = malloc((size_t)(B * wmax) * sizeof(float));
    float *f = malloc((size_t)(B * wmax) * sizeof(float));
    int32_t *ids = malloc((size_t)B * sizeof(int32_t));
    td_err e = TD_OK;
    if (!x || !h || !q || !a || !f || !ids) {
        e = err_set(TD_ENOMEM, "out of memory drafting a block");
        goto done;
    }
    ids[0] = pending;
    for (int64_t i = 1; i < B; i++)
        ids[i] = (int32_t)c->mask_token_id;
    e = cpu_get_rows(x, &m->tok_embd, ids, B);
    if (e != TD_OK) {
        e = err_wrap(e, "drafter block");
        goto done;
    }
    if (c->input_embedding_scale != 1.0)
        cpu_scale(x, x, (float)c->input_embedding_scale, B * H);
    /* Block slots sit right after the valid ring entries, at positions n_ctx..n_ctx+B-1. */
    int32_t *bpos = s->pos + n_valid;
    for (int64_t i = 0; i < B; i++)
        bpos[i] = (int32_t)(s->n_ctx + i);

    for (uint32_t il = 0; il < c->n_layers; il++) {
        const dfl_layer *L = &m->layers[il];
        const dflash_layer *lt = &c->layers[il];
        cpu_rmsnorm(h, x, L->in_norm, B, H, H, (float)c->rms_eps);
        cpu_matmul(q, h, &L->wq, B);
        cpu_rmsnorm(q, q, L->q_norm, B * c->n_heads, hd, hd, (float)c->rms_eps);
        cpu_rope_neox(q, B, c->n_heads, qw, hd, hd, bpos, (float)c->rope_theta);
        dfl_kv(m, L, h, B, bpos, s->k[il] + n_valid * kvw, s->v[il] + n_valid * kvw);
        ops_attn at = {
            .n_q = B, .n_head = c->n_heads, .n_head_kv = c->n_kv_heads, .head_dim = hd,
            .scale = 1.0f / sqrtf((float)hd), .q = q, .q_tok_stride = qw, .q_head_stride = hd,
            .q_pos = bpos, .kv_type = TD_F32, .k = s->k[il], .v = s->v[il],
            .kv_tok_stride = kvw, .kv_head_stride = hd, .k_pos = s->pos, .n_kv = n_valid + B,
            .mask = lt->causal ? OPS_MASK_CAUSAL : OPS_MASK_BIDIRECTIONAL,
            .window = (int32_t)lt->window, .out = a,
        };
        cpu_attention(&at);
        cpu_matmul(h, a, &L->wo, B);
        cpu_add(x, x, h, B * H);
        cpu_rmsnorm(h, x, L->post_norm, B, H, H, (float)c->rms_eps);
        cpu_matmul(q, h, &L->gate, B);
        cpu_matmul(f, h, &L->up, B);
        cpu_swiglu(q, q, f, B * c->ffn);
        cpu_matmul(h, q, &L->down, B);
        cpu_add(x, x, h, B * H);
    }
    /* Slot k (1..B-1) proposes the token at position n_ctx + k. */
    cpu_rmsnorm(h, x + H, m->norm, B - 1, H, H, (float)c->rms_eps);
    cpu_matmul(logits, h, &m->lm_head, B - 1);
    int64_t nl = (B - 1) * m->lm_head.rows;
    if (c->output_multiplier != 1.0)
        cpu_scale(logits, logits, (float)c->output_multiplier, nl);
    if (c->final_logit_softcap > 0) {
        float cap = (float)c->final_logit_softcap;
        for (int64_t i = 0; i < nl; i++)
            logits[i] = cap * tanhf(logits[i] / cap);
    }
done:
    free(x), free(h), free(q), free(a), free(f), free(ids);
    return e;
}

/* --- drafting ----------------------------------------------------------------------------- */

uint64_t dfl_rng_ctr(int64_t pos, int role)
{
    return (uint64_t)pos * DFL_RNG_ROLES + (uint64_t)role;
}

td_err dfl_draft_tokens(const ops_sampler *smp, const float *logits, int64_t B, int64_t V,
                        int64_t L, int32_t *block, float *q)
{
    for (int64_t i = 1; i < B; i++) {
        const float *lg = logits + (i - 1) * V;
        if (smp->temperature == 0.0f) {
            block[i] = (int32_t)cpu_argmax(lg, V);
            continue;
        }
        float *qi = q + (i - 1) * V;
        TD_TRY(cpu_sample_probs(qi, lg, V, smp));
        block[i] = cpu_sample_draw(qi, V, smp->seed, dfl_rng_ctr(L + i, DFL_RNG_DRAFT));
    }
    return TD_OK;
}
