/* The target's forward pass over a block of tokens (CPU backend), and the per-sequence state
 * it runs against: attention KV cache, DeltaNet recurrent and conv state, rollback record.
 *
 * Per layer: x += mixer(attn_norm(x)); x += ffn_down(silu(ffn_gate(h)) * ffn_up(h)) with
 * h = ffn_norm(x). The mixer is gated attention or Gated DeltaNet (DESIGN sections 5, 6). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "verifyd/target.h"

/* Scratch for one forward pass of n_tok tokens; sized from the model, freed at the end. */
typedef struct tgt_scratch {
    float *x;      /* [n_tok][n_embd] residual stream */
    float *h;      /* [n_tok][n_embd] normed input of a sublayer */
    float *a;      /* [n_tok][max mixer width]: q+gate (attention) or raw qkv (DeltaNet) */
    float *b;      /* [n_tok][max mixer width]: k (attention) or conv output (DeltaNet) */
    float *c;      /* [n_tok][max mixer width]: v (attention) or z (DeltaNet) */
    float *o;      /* [n_tok][max mixer width]: attention or recurrence output */
    float *gb;     /* [n_tok][2][n_v_head]: g then beta (DeltaNet) */
    float *ff1;    /* [n_tok][n_ff] */
    float *ff2;    /* [n_tok][n_ff] */
    int32_t *pos;  /* [n_past + n_tok] absolute positions 0.. */
} tgt_scratch;

static int64_t tgt_mixer_width(const tgt_hparams *hp)
{
    int64_t w = hp->n_head * hp->head_dim * (hp->attn_gate ? 2 : 1);
    if (hp->arch == TGT_ARCH_QWEN35 && hp->conv_ch > w)
        w = hp->conv_ch;
    if (hp->n_embd > w)
        w = hp->n_embd;
    return w;
}

static void tgt_scratch_free(tgt_scratch *s)
{
    free(s->x);
    free(s->h);
    free(s->a);
    free(s->b);
    free(s->c);
    free(s->o);
    free(s->gb);
    free(s->ff1);
    free(s->ff2);
    free(s->pos);
}

static td_err tgt_scratch_init(tgt_scratch *s, const tgt_hparams *hp, int64_t n_tok,
                               int64_t n_pos)
{
    size_t t = (size_t)n_tok, mw = (size_t)tgt_mixer_width(hp);
    memset(s, 0, sizeof *s);
    s->x = malloc(t * (size_t)hp->n_embd * sizeof(float));
    s->h = malloc(t * (size_t)hp->n_embd * sizeof(float));
    s->a = malloc(t * mw * sizeof(float));
    s->b = malloc(t * mw * sizeof(float));
    s->c = malloc(t * mw * sizeof(float));
    s->o = malloc(t * mw * sizeof(float));
    s->gb = malloc(t * 2 * (size_t)(hp->n_v_head + 1) * sizeof(float));
    s->ff1 = malloc(t * (size_t)hp->n_ff * sizeof(float));
    s->ff2 = malloc(t * (size_t)hp->n_ff * sizeof(float));
    s->pos = malloc((size_t)n_pos * sizeof(int32_t));
    if (!s->x || !s->h || !s->a || !s->b || !s->c || !s->o || !s->gb || !s->ff1 || !s->ff2 ||
        !s->pos) {
        tgt_scratch_free(s);
        return err_set(TD_ENOMEM, "out of memory for a forward pass of %lld tokens",
                       (long long)n_tok);
    }
    for (int64_t i = 0; i < n_pos; i++)
        s->pos[i] = (int32_t)i;
    return TD_OK;
}

/* --- state ------------------------------------------------------------------------------ */

static size_t tgt_ssm_floats(const tgt_hparams *hp)
{
    return (size_t)(hp->n_v_head * hp->d_k * hp->d_v);
}

static size_t tgt_conv_floats(const tgt_hparams *hp)
{
    return (size_t)((hp->conv_k - 1) * hp->conv_ch);
}

/* Frees a per-layer list; its arrays too unless they live in caller memory (n = 0). */
static void tgt_free_list(float **list, int64_t n)
{
    if (!list)
        return;
    for (int64_t i = 0; i < n; i++)
        free(list[i]);
    free(list);
}

/* A per-layer list pointing at n consecutive arrays of floats each, starting at base. */
static float **tgt_view_list(int64_t n, float *base, size_t floats)
{
    float **list = calloc((size_t)(n > 0 ? n : 1), sizeof *list);
    for (int64_t i = 0; list && i < n; i++)
        list[i] = base + (size_t)i * floats;
    return list;
}

static float **tgt_alloc_list(int64_t n, size_t floats)
{
    float **list = calloc((size_t)(n > 0 ? n : 1), sizeof *list);
    if (!list)
        return NULL;
    for (int64_t i = 0; i < n; i++) {
        list[i] = calloc(floats ? floats : 1, sizeof(float));
        if (!list[i]) {
            tgt_free_list(list, n);
            return NULL;
        }
    }
    return list;
}

static void tgt_rec_free(tgt_state *s, int64_t n_delta)
{
    if (s->bound)
        n_delta = 0;
    tgt_free_list(s->rec_ssm0, n_delta);
    tgt_free_list(s->rec_conv0, n_delta);
    tgt_free_list(s->rec_xconv, n_delta);
    tgt_free_list(s->rec_qkv, n_delta);
    tgt_free_list(s->rec_gb, n_delta);
    s->rec_ssm0 = s->rec_conv0 = s->rec_xconv = s->rec_qkv = s->rec_gb = NULL;
    s->rec_cap = 0;
    s->rec_n_tok = 0;
}

/* Makes the rollback record hold at least n_tok tokens. */
static td_err tgt_rec_reserve(const tgt_model *m, tgt_state *s, int64_t n_tok)
{
    if (s->rec_cap >= n_tok)
        return TD_OK;
    if (s->bound)
        return err_set(TD_ERANGE, "a recorded forward of %lld tokens; the bound state records %lld",
                       (long long)n_tok, (long long)s->rec_cap);
    const tgt_hparams *hp = &m->hp;
    int64_t nd = m->n_delta_layers;
    tgt_rec_free(s, nd);
    s->rec_ssm0 = tgt_alloc_list(nd, tgt_ssm_floats(hp));
    s->rec_conv0 = tgt_alloc_list(nd, tgt_conv_floats(hp));
    s->rec_xconv = tgt_alloc_list(nd, (size_t)(n_tok * hp->conv_ch));
    s->rec_qkv = tgt_alloc_list(nd, (size_t)(n_tok * hp->conv_ch));
    s->rec_gb = tgt_alloc_list(nd, (size_t)(n_tok * 2 * hp->n_v_head));
    if (!s->rec_ssm0 || !s->rec_conv0 || !s->rec_xconv || !s->rec_qkv || !s->rec_gb) {
        tgt_rec_free(s, nd);
        return err_set(TD_ENOMEM, "out of memory for the rollback record of %lld tokens",
                       (long long)n_tok);
    }
    s->rec_cap = n_tok;
    return TD_OK;
}

td_err tgt_state_init(tgt_state *s, const tgt_model *m, int64_t n_ctx)
{
    const tgt_hparams *hp = &m->hp;
    memset(s, 0, sizeof *s);
    if (n_ctx <= 0 || n_ctx > INT32_MAX)
        return err_set(TD_EINVAL, "context size %lld is out of range", (long long)n_ctx);
    s->n_ctx = n_ctx;
    s->n_attn = m->n_attn_layers;
    s->n_delta = m->n_delta_layers;
    size_t kv = (size_t)(n_ctx * hp->n_head_kv * hp->head_dim);
    s->k = tgt_alloc_list(s->n_attn, kv);
    s->v = tgt_alloc_list(s->n_attn, kv);
    s->ssm = tgt_alloc_list(s->n_delta, tgt_ssm_floats(hp));
    s->conv = tgt_alloc_list(s->n_delta, tgt_conv_floats(hp));
    if (!s->k || !s->v || !s->ssm || !s->conv) {
        tgt_state_free(s);
        return err_set(TD_ENOMEM, "out of memory for a context of %lld positions",
                       (long long)n_ctx);
    }
    return TD_OK;
}

td_err tgt_state_bind(tgt_state *s, const tgt_model *m, int64_t n_ctx, const tgt_state_mem *mem)
{
    const tgt_hparams *hp = &m->hp;
    memset(s, 0, sizeof *s);
    if (n_ctx <= 0 || n_ctx > INT32_MAX || mem->rec_cap < 0)
        return err_set(TD_EINVAL, "context size %lld is out of range", (long long)n_ctx);
    s->bound = true;
    s->n_ctx = n_ctx;
    s->n_attn = m->n_attn_layers;
    s->n_delta = m->n_delta_layers;
    size_t kv = (size_t)(n_ctx * hp->n_head_kv * hp->head_dim);
    size_t rows = (size_t)(mem->rec_cap * hp->conv_ch);
    s->k = tgt_view_list(s->n_attn, mem->k, kv);
    s->v = tgt_view_list(s->n_attn, mem->v, kv);
    s->ssm = tgt_view_list(s->n_delta, mem->ssm, tgt_ssm_floats(hp));
    s->conv = tgt_view_list(s->n_delta, mem->conv, tgt_conv_floats(hp));
    s->rec_ssm0 = tgt_view_list(s->n_delta, mem->rec_ssm0, tgt_ssm_floats(hp));
    s->rec_conv0 = tgt_view_list(s->n_delta, mem->rec_conv0, tgt_conv_floats(hp));
    s->rec_xconv = tgt_view_list(s->n_delta, mem->rec_xconv, rows);
    s->rec_qkv = tgt_view_list(s->n_delta, mem->rec_qkv, rows);
    s->rec_gb = tgt_view_list(s->n_delta, mem->rec_gb, (size_t)(mem->rec_cap * 2 * hp->n_v_head));
    s->rec_cap = mem->rec_cap;
    if (!s->k || !s->v || !s->ssm || !s->conv || !s->rec_ssm0 || !s->rec_conv0 ||
        !s->rec_xconv || !s->rec_qkv || !s->rec_gb) {
        tgt_state_free(s);
        return err_set(TD_ENOMEM, "out of memory binding a sequence state");
    }
    return TD_OK;
}

void tgt_state_free(tgt_state *s)
{
    int64_t na = s->bound ? 0 : s->n_attn, nd = s->bound ? 0 : s->n_delta;
    tgt_free_list(s->k, na);
    tgt_free_list(s->v, na);
    tgt_free_list(s->ssm, nd);
    tgt_free_list(s->conv, nd);
    tgt_rec_free(s, s->n_delta);
    memset(s, 0, sizeof *s);
}

void tgt_state_reset(const tgt_model *m, tgt_state *s)
{
    const tgt_hparams *hp = &m->hp;
    for (int64_t i = 0; i < s->n_delta; i++) {
        memset(s->ssm[i], 0, tgt_ssm_floats(hp) * sizeof(float));
        memset(s->conv[i], 0, tgt_conv_floats(hp) * sizeof(float));
    }
    s->n_past = 0;
    s->rec_n_tok = 0;
}

void tgt_state_copy(const tgt_model *m, tgt_state *dst, const tgt_state *src)
{
    const tgt_hparams *hp = &m->hp;
    TD_ASSERT(dst->n_ctx == src->n_ctx && dst->n_attn == src->n_attn &&
              dst->n_delta == src->n_delta);
    size_t kv = (size_t)(src->n_past * hp->n_head_kv * hp->head_dim) * sizeof(float);
    for (int64_t i = 0; i < src->n_attn; i++) {
        memcpy(dst->k[i], src->k[i], kv);
        memcpy(dst->v[i], src->v[i], kv);
    }
    for (int64_t i = 0; i < src->n_delta; i++) {
        memcpy(dst->ssm[i], src->ssm[i], tgt_ssm_floats(hp) * sizeof(float));
        memcpy(dst->conv[i], src->conv[i], tgt_conv_floats(hp) * sizeof(float));
    }
    dst->n_past = src->n_past;
    dst->rec_n_tok = 0;
}

/* --- mixers ----------------------------------------------------------------------------- */

/* Gated (qwen35) or plain (qwen3) attention over h[n_tok] at positions n_past..; writes
 * this block's K/V into the cache and the mixer output (before attn_output) into sc->o. */
static void tgt_attention(const tgt_model *m, const tgt_layer *L, float *kc, float *vc,
                          int64_t n_past, int64_t n_tok, tgt_scratch *sc)
{
    const tgt_hparams *hp = &m->hp;
    int64_t hd = hp->head_dim, q_head = hp->attn_gate ? 2 * hd : hd;
    int64_t q_tok = hp->n_head * q_head, kv_tok = hp->n_head_kv * hd;
    float *q = sc->a, *k = sc->b, *v = sc->c;
    cpu_matmul(q, sc->h, &L->wq, n_tok);
    cpu_matmul(k, sc->h, &L->wk, n_tok);
    cpu_matmul(v, sc->h, &L->wv, n_tok);
    /* q_norm covers the query half of each head, never the gate. */
    cpu_rmsnorm(q, q, L->q_norm, n_tok * hp->n_head, hd, q_head, hp->eps);
    cpu_rmsnorm(k, k, L->k_norm, n_tok * hp->n_head_kv, hd, hd, hp->eps);
    const int32_t *pos = sc->pos + n_past;
    cpu_rope_neox(q, n_tok, hp->n_head, q_tok, q_head, hp->n_rot, pos, hp->rope_theta);
    cpu_rope_neox(k, n_tok, hp->n_head_kv, kv_tok, hd, hp->n_rot, pos, hp->rope_theta);
    memcpy(kc + n_past * kv_tok, k, (size_t)(n_tok * kv_tok) * sizeof(float));
    memcpy(vc + n_past * kv_tok, v, (size_t)(n_tok * kv_tok) * sizeof(float));

    ops_attn at = {
        .n_q = n_tok, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hd,
        .scale = 1.0f / sqrtf((float)hd),
        .q = q, .q_tok_stride = q_tok, .q_head_stride = q_head, .q_pos = pos,
        .kv_type = TD_F32, .k = kc, .v = vc, .kv_tok_stride = kv_tok, .kv_head_stride = hd,
        .k_pos = sc->pos, .n_kv = n_past + n_tok, .mask = OPS_MASK_CAUSAL,
        .gate = hp->attn_gate ? q + hd : NULL, .gate_tok_stride = q_tok,
        .gate_head_stride = q_head, .out = sc->o,
    };
    cpu_attention(&at);
}

/* Gated DeltaNet over h[n_tok]: conv state and recurrent state advance by n_tok; the
 * output (before ssm_out) goes to sc->o. With rec_* non-NULL the recurrence inputs are kept. */
static void tgt_deltanet(const tgt_model *m, const tgt_layer *L, float *ssm, float *conv,
                         int64_t n_tok, tgt_scratch *sc, float *rec_xconv, float *rec_qkv,
                         float *rec_gb)
{
    const tgt_hparams *hp = &m->hp;
    int64_t nv = hp->n_v_head, ch = hp->conv_ch, inner = nv * hp->d_v;
    int64_t qk = hp->n_k_head * hp->d_k;
    float *raw = sc->a, *qkv = sc->b, *z = sc->c, *g = sc->gb, *beta = sc->gb + n_tok * nv;

    cpu_matmul(raw, sc->h, &L->wqkv, n_tok);
    if (rec_xconv)
        memcpy(rec_xconv, raw, (size_t)(n_tok * ch) * sizeof(float));
    cpu_conv1d_causal(qkv, conv, NULL, raw, ch, L->conv_w, n_tok, ch, hp->conv_k);
    cpu_silu(qkv, qkv, n_tok * ch);
    /* q and k: L2-normalised per head; q also scaled by 1/sqrt(d_k). */
    for (int64_t t = 0; t < n_tok; t++) {
        float *row = qkv + t * ch;
        cpu_l2norm(row, row, 2 * hp->n_k_head, hp->d_k, hp->d_k, hp->eps);
        cpu_scale(row, row, 1.0f / sqrtf((float)hp->d_k), qk);
    }

    cpu_matmul(z, sc->h, &L->wz, n_tok);
    cpu_matmul(g, sc->h, &L->walpha, n_tok);
    cpu_matmul(beta, sc->h, &L->wbeta, n_tok);
    cpu_sigmoid(beta, beta, n_tok * nv);
    for (int64_t t = 0; t < n_tok; t++) {
        float *gt = g + t * nv;
        cpu_add(gt, gt, L->dt_bias, nv);
        cpu_softplus(gt, gt, nv);
        cpu_mul(gt, gt, L->ssm_a, nv);
    }
    if (rec_qkv) {
        memcpy(rec_qkv, qkv, (size_t)(n_tok * ch) * sizeof(float));
        for (int64_t t = 0; t < n_tok; t++) {
            memcpy(rec_gb + (t * 2) * nv, g + t * nv, (size_t)nv * sizeof(float));
            memcpy(rec_gb + (t * 2 + 1) * nv, beta + t * nv, (size_t)nv * sizeof(float));
        }
    }

    ops_delta d = {
        .n_tok = n_tok, .n_k_head = hp->n_k_head, .n_v_head = nv, .d_k = hp->d_k,
        .d_v = hp->d_v, .q = qkv, .k = qkv + qk, .v = qkv + 2 * qk, .q_tok_stride = ch,
        .k_tok_stride = ch, .v_tok_stride = ch, .g = g, .beta = beta, .state = ssm,
        .state_all = NULL, .out = sc->o,
    };
    cpu_delta_rule(&d);
    /* y = RMSNorm_dv(o) * ssm_norm * silu(z) */
    cpu_rmsnorm(sc->o, sc->o, L->ssm_norm, n_tok * nv, hp->d_v, hp->d_v, hp->eps);
    cpu_silu(z, z, n_tok * inner);
    cpu_mul(sc->o, sc->o, z, n_tok * inner);
}

/* --- forward ---------------------------------------------------------------------------- */

td_err tgt_forward(const tgt_model *m, tgt_state *s, const int32_t *tokens, int64_t n_tok,
                   bool record, const tgt_out *out)
{
    const tgt_hparams *hp = &m->hp;
    TD_ASSERT(n_tok >= 1);
    if (s->n_past + n_tok > s->n_ctx)
        return err_set(TD_ERANGE, "context full: %lld + %lld tokens exceed %lld positions",
                       (long long)s->n_past, (long long)n_tok, (long long)s->n_ctx);
    if (record)
        TD_TRY(tgt_rec_reserve(m, s, n_tok));
    tgt_scratch sc;
    TD_TRY(tgt_scratch_init(&sc, hp, n_tok, s->n_past + n_tok));
    td_err e = cpu_get_rows(sc.x, &m->tok_embd, tokens, n_tok);
    if (e != TD_OK) {
        tgt_scratch_free(&sc);
        return err_wrap(e, "token ids");
    }
    if (record) {
        s->rec_n_tok = n_tok;
        s->rec_pos0 = s->n_past;
    } else {
        s->rec_n_tok = 0;
    }

    int64_t D = hp->n_embd, ia = 0, id = 0;
    for (int64_t il = 0; il < hp->n_layer; il++) {
        const tgt_layer *L = &m->layers[il];
        cpu_rmsnorm(sc.h, sc.x, L->attn_norm, n_tok, D, D, hp->eps);
        if (L->kind == TGT_LAYER_ATTN) {
            tgt_attention(m, L, s->k[ia], s->v[ia], s->n_past, n_tok, &sc);
            cpu_matmul(sc.h, sc.o, &L->wo, n_tok);
            ia++;
        } else {
            if (record) {
                memcpy(s->rec_ssm0[id], s->ssm[id], tgt_ssm_floats(hp) * sizeof(float));
                memcpy(s->rec_conv0[id], s->conv[id], tgt_conv_floats(hp) * sizeof(float));
            }
            tgt_deltanet(m, L, s->ssm[id], s->conv[id], n_tok, &sc,
                         record ? s->rec_xconv[id] : NULL, record ? s->rec_qkv[id] : NULL,
                         record ? s->rec_gb[id] : NULL);
            cpu_matmul(sc.h, sc.o, &L->wssm_out, n_tok);
            id++;
        }
        cpu_add(sc.x, sc.x, sc.h, n_tok * D);

        cpu_rmsnorm(sc.h, sc.x, L->ffn_norm, n_tok, D, D, hp->eps);
        cpu_matmul(sc.ff1, sc.h, &L->ffn_gate, n_tok);
        cpu_matmul(sc.ff2, sc.h, &L->ffn_up, n_tok);
        cpu_swiglu(sc.ff1, sc.ff1, sc.ff2, n_tok * hp->n_ff);
        cpu_matmul(sc.h, sc.ff1, &L->ffn_down, n_tok);
        cpu_add(sc.x, sc.x, sc.h, n_tok * D);

        for (int64_t j = 0; out && j < out->n_taps; j++) {
            if (out->taps[j] != il)
                continue;
            for (int64_t t = 0; t < n_tok; t++)
                memcpy(out->tap_out + (t * out->n_taps + j) * D, sc.x + t * D,
                       (size_t)D * sizeof(float));
        }
    }
    s->n_past += n_tok;

    if (out && out->logits) {
        int64_t first = out->last_only ? n_tok - 1 : 0, n = n_tok - first;
        cpu_rmsnorm(sc.h, sc.x + first * D, m->output_norm, n, D, D, hp->eps);
        cpu_matmul(out->logits, sc.h, &m->output, n);
    }
    tgt_scratch_free(&sc);
    return TD_OK;
}

void tgt_state_keep(const tgt_model *m, tgt_state *s, int64_t keep)
{
    const tgt_hparams *hp = &m->hp;
    int64_t n = s->rec_n_tok;
    TD_ASSERT(n > 0 && keep >= 0 && keep <= n && s->n_past == s->rec_pos0 + n);
    s->n_past = s->rec_pos0 + keep;
    s->rec_n_tok = 0;
    if (keep == n)
        return;
    int64_t ch = hp->conv_ch, nv = hp->n_v_head, km1 = hp->conv_k - 1;
    int64_t qk = hp->n_k_head * hp->d_k;
    float *g = malloc((size_t)(2 * (keep > 0 ? keep : 1) * nv) * sizeof(float));
    float *o = malloc((size_t)((keep > 0 ? keep : 1) * nv * hp->d_v) * sizeof(float));
    TD_ASSERT(g && o); /* a few KiB per kept token */
    for (int64_t i = 0; i < s->n_delta; i++) {
        /* conv: the last k-1 raw inputs of [state before ; the kept tokens' inputs] */
        for (int64_t r = 0; r < km1; r++) {
            int64_t src = keep + r; /* index into the concatenation, oldest first */
            const float *row = src < km1 ? s->rec_conv0[i] + src * ch
                                         : s->rec_xconv[i] + (src - km1) * ch;
            memcpy(s->conv[i] + r * ch, row, (size_t)ch * sizeof(float));
        }
        memcpy(s->ssm[i], s->rec_ssm0[i], tgt_ssm_floats(hp) * sizeof(float));
        if (keep == 0)
            continue;
        for (int64_t t = 0; t < keep; t++) {
            memcpy(g + t * nv, s->rec_gb[i] + (t * 2) * nv, (size_t)nv * sizeof(float));
            memcpy(g + (keep + t) * nv, s->rec_gb[i] + (t * 2 + 1) * nv,
                   (size_t)nv * sizeof(float));
        }
        const float *qkv = s->rec_qkv[i];
        ops_delta d = {
            .n_tok = keep, .n_k_head = hp->n_k_head, .n_v_head = nv, .d_k = hp->d_k,
            .d_v = hp->d_v, .q = qkv, .k = qkv + qk, .v = qkv + 2 * qk, .q_tok_stride = ch,
            .k_tok_stride = ch, .v_tok_stride = ch, .g = g, .beta = g + keep * nv,
            .state = s->ssm[i], .state_all = NULL, .out = o,
        };
        cpu_delta_rule(&d);
    }
    free(g);
    free(o);
}
