/* The target's forward pass over a block of tokens (on any backend), and the per-sequence state
 * it runs against: attention KV cache, DeltaNet recurrent and conv state, rollback record.
 *
 * Per layer: x += mixer(attn_norm(x)); x += ffn_down(silu(ffn_gate(h)) * ffn_up(h)) with
 * h = ffn_norm(x). The mixer is gated attention or Gated DeltaNet (DESIGN sections 5, 6). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "verifyd/target.h"
#include "verifyd/target_int.h"

/* Scratch of forward passes, in backend memory, kept by the model and grown on demand
 * (allocating device memory per call would stall the GPU). */
typedef struct tgt_work {
    int64_t cap_tok;  /* tokens the buffers below hold */
    int64_t cap_pos;  /* positions pos holds */
    int64_t n_tok;    /* tokens of the forward pass running */
    float *x;         /* [cap_tok][n_embd] residual stream */
    float *h;         /* [cap_tok][n_embd] normed input of a sublayer */
    float *a;         /* [cap_tok][max mixer width]: q+gate (attention) or raw qkv (DeltaNet) */
    float *b;         /* [cap_tok][max mixer width]: k (attention) or conv output (DeltaNet) */
    float *c;         /* [cap_tok][max mixer width]: v (attention) or z (DeltaNet) */
    float *o;         /* [cap_tok][max mixer width]: attention or recurrence output */
    float *gb;        /* DeltaNet [4][cap_tok][n_v_head]: the ssm_alpha and ssm_beta outputs
                       * [n_tok][n_v_head] each, then g and beta [n_tok][2][n_v_head]
                       * (cpu_delta_prep's layout) when no rollback record takes them */
    float *ff1;       /* [cap_tok][n_ff] */
    float *ff2;       /* [cap_tok][n_ff] */
    int32_t *ids;     /* [cap_tok] token ids */
    int32_t *step_pos; /* [1 + cap_tok]: the keys attention sees after this forward
                        * (n_past + n_tok), then the positions of its tokens */
    int32_t *host_pos; /* [1 + cap_tok] host staging of step_pos */
    int32_t *pos;     /* [cap_pos] absolute positions 0.. (the keys') */
    int64_t n_kv;     /* keys attention is launched for: n_past + n_tok, or n_ctx for a
                       * recording (which then reads the count from step_pos[0]) */
    uint64_t gen;     /* changes whenever a buffer above moves (recordings hold addresses) */
    ops_delta *replay; /* host [cap_replay]: a rollback's per-layer replays (grown once) */
    int64_t cap_replay;
} tgt_work;

static int64_t tgt_mixer_width(const tgt_hparams *hp)
{
    int64_t w = hp->n_head * hp->head_dim * (hp->attn_gate ? 2 : 1);
    if (hp->arch == TGT_ARCH_QWEN35 && hp->conv_ch > w)
        w = hp->conv_ch;
    if (hp->n_embd > w)
        w = hp->n_embd;
    return w;
}

static void tgt_work_release(const ops_backend *be, tgt_work *w)
{
    float **f[] = {&w->x, &w->h, &w->a, &w->b, &w->c, &w->o, &w->gb, &w->ff1, &w->ff2};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        be->release(be, *f[i]);
        *f[i] = NULL;
    }
    be->release(be, w->ids);
    be->release(be, w->step_pos);
    be->release(be, w->pos);
    free(w->host_pos);
    w->ids = w->step_pos = w->pos = w->host_pos = NULL;
    w->cap_tok = w->cap_pos = 0;
    w->gen = tgt_gen_next();
}

uint64_t tgt_gen_next(void)
{
    static uint64_t next = 1;
    return __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
}

uint64_t tgt_work_gen(const tgt_model *m)
{
    return m->work->gen;
}

td_err tgt_work_init(tgt_model *m)
{
    m->work = calloc(1, sizeof *m->work);
    return m->work ? TD_OK : err_set(TD_ENOMEM, "out of memory loading the model");
}

void tgt_work_free(const tgt_model *m)
{
    if (!m->work)
        return;
    tgt_work_release(m->be, m->work);
    free(m->work->replay);
    free(m->work);
}

/* Makes the model's scratch hold n_tok tokens at positions below n_pos. */
td_err tgt_work_reserve(const tgt_model *m, int64_t n_tok, int64_t n_pos)
{
    const tgt_hparams *hp = &m->hp;
    const ops_backend *be = m->be;
    tgt_work *w = m->work;
    if (n_tok > w->cap_tok) {
        tgt_work_release(be, w);
        size_t t = (size_t)n_tok, mw = (size_t)tgt_mixer_width(hp), f = sizeof(float);
        struct {
            float **p;
            size_t bytes;
        } want[] = {
            {&w->x, t * (size_t)hp->n_embd * f}, {&w->h, t * (size_t)hp->n_embd * f},
            {&w->a, t * mw * f},                 {&w->b, t * mw * f},
            {&w->c, t * mw * f},                 {&w->o, t * mw * f},
            {&w->gb, t * 4 * (size_t)(hp->n_v_head + 1) * f},
            {&w->ff1, t * (size_t)hp->n_ff * f}, {&w->ff2, t * (size_t)hp->n_ff * f},
        };
        for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
            td_err e = be->alloc(be, (void **)want[i].p, want[i].bytes);
            if (e != TD_OK) {
                tgt_work_release(be, w);
                return err_wrap(e, "scratch for a forward pass of %lld tokens", (long long)n_tok);
            }
        }
        td_err e = be->alloc(be, (void **)&w->ids, t * sizeof(int32_t));
        if (e == TD_OK)
            e = be->alloc(be, (void **)&w->step_pos, (t + 1) * sizeof(int32_t));
        if (e == TD_OK && !(w->host_pos = malloc((t + 1) * sizeof(int32_t))))
            e = err_set(TD_ENOMEM, "out of memory for %lld positions", (long long)n_tok);
        if (e != TD_OK) {
            tgt_work_release(be, w);
            return e;
        }
        w->cap_tok = n_tok;
    }
    if (n_pos > w->cap_pos) {
        int64_t cap = n_pos < 4096 ? 4096 : n_pos;
        int32_t *host = malloc((size_t)cap * sizeof(int32_t));
        if (!host)
            return err_set(TD_ENOMEM, "out of memory for %lld positions", (long long)cap);
        for (int64_t i = 0; i < cap; i++)
            host[i] = (int32_t)i;
        be->release(be, w->pos);
        w->pos = NULL;
        w->cap_pos = 0;
        td_err e = ops_backend_upload(be, (void **)&w->pos, host, (size_t)cap * sizeof(int32_t));
        free(host);
        TD_TRY(e);
        w->cap_pos = cap;
        w->gen = tgt_gen_next();
    }
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

/* Frees a per-layer list; its arrays too (one allocation, tgt_alloc_list) unless they live
 * in caller memory (n = 0). */
static void tgt_free_list(const ops_backend *be, float **list, int64_t n)
{
    if (!list)
        return;
    if (n > 0)
        be->release(be, list[0]);
    free(list);
}

/* The distance in floats between consecutive arrays of a per-layer list of arrays of floats
 * each (tgt_alloc_list and tgt_view_list place them at one stride in one block), so that one
 * 2D copy moves a slice of every layer; floats for a list of one. */
static size_t tgt_list_stride(float *const *list, int64_t n, size_t floats)
{
    if (n < 2)
        return floats;
    const size_t d = (size_t)(list[1] - list[0]);
    for (int64_t i = 2; i < n; i++)
        TD_ASSERT((size_t)(list[i] - list[i - 1]) == d);
    TD_ASSERT(list[1] > list[0] && d >= floats);
    return d;
}

/* Bytes of one element of the KV cache. */
uint32_t tgt_kv_bytes(const tgt_model *m)
{
    return m->n_attn_layers ? (uint32_t)ops_kv_elem_bytes(m->kv_type) : 0;
}

static void tgt_free_kv(const ops_backend *be, void **list, int64_t n)
{
    if (!list)
        return;
    for (int64_t i = 0; i < n; i++)
        be->release(be, list[i]);
    free(list);
}

/* n zeroed backend arrays of bytes each (a KV cache per layer); NULL (message set) when
 * memory runs out. */
static void **tgt_alloc_kv(const ops_backend *be, int64_t n, size_t bytes)
{
    void **list = calloc((size_t)(n > 0 ? n : 1), sizeof *list);
    if (!list) {
        err_set(TD_ENOMEM, "out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) {
        if (be->alloc(be, &list[i], bytes ? bytes : 1) != TD_OK ||
            be->zero(be, list[i], bytes ? bytes : 1) != TD_OK) {
            tgt_free_kv(be, list, n);
            return NULL;
        }
    }
    return list;
}

/* Layer i's KV array at base + i * bytes (caller memory). */
static void **tgt_view_kv(int64_t n, void *base, size_t bytes)
{
    void **list = calloc((size_t)(n > 0 ? n : 1), sizeof *list);
    for (int64_t i = 0; list && i < n; i++)
        list[i] = (uint8_t *)base + (size_t)i * bytes;
    return list;
}

/* A per-layer list pointing at n consecutive arrays of floats each, starting at base. */
static float **tgt_view_list(int64_t n, float *base, size_t floats)
{
    float **list = calloc((size_t)(n > 0 ? n : 1), sizeof *list);
    for (int64_t i = 0; list && i < n; i++)
        list[i] = base + (size_t)i * floats;
    return list;
}

/* n zeroed backend arrays of floats each, in one allocation at a stride of floats rounded up
 * to 64 (256 bytes); NULL (message set) when memory runs out. */
static float **tgt_alloc_list(const ops_backend *be, int64_t n, size_t floats)
{
    float **list = calloc((size_t)(n > 0 ? n : 1), sizeof *list);
    if (!list) {
        err_set(TD_ENOMEM, "out of memory");
        return NULL;
    }
    if (n == 0)
        return list;
    const size_t stride = ((floats ? floats : 1) + 63) & ~(size_t)63;
    const size_t bytes = (size_t)n * stride * sizeof(float);
    float *base = NULL;
    if (be->alloc(be, (void **)&base, bytes) != TD_OK) {
        free(list);
        return NULL;
    }
    if (be->zero(be, base, bytes) != TD_OK) {
        be->release(be, base);
        free(list);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        list[i] = base + (size_t)i * stride;
    return list;
}

static void tgt_rec_free(tgt_state *s, int64_t n_delta)
{
    if (s->bound)
        n_delta = 0;
    tgt_free_list(s->be, s->rec_ssm0, n_delta);
    tgt_free_list(s->be, s->rec_conv0, n_delta);
    tgt_free_list(s->be, s->rec_xconv, n_delta);
    tgt_free_list(s->be, s->rec_qkv, n_delta);
    tgt_free_list(s->be, s->rec_gb, n_delta);
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
    s->rec_ssm0 = tgt_alloc_list(s->be, nd, tgt_ssm_floats(hp));
    s->rec_conv0 = s->rec_ssm0 ? tgt_alloc_list(s->be, nd, tgt_conv_floats(hp)) : NULL;
    s->rec_xconv = s->rec_conv0 ? tgt_alloc_list(s->be, nd, (size_t)(n_tok * hp->conv_ch)) : NULL;
    s->rec_qkv = s->rec_xconv ? tgt_alloc_list(s->be, nd, (size_t)(n_tok * hp->conv_ch)) : NULL;
    s->rec_gb = s->rec_qkv ? tgt_alloc_list(s->be, nd, (size_t)(n_tok * 2 * hp->n_v_head)) : NULL;
    if (!s->rec_gb) {
        tgt_rec_free(s, nd);
        return err_wrap(TD_ENOMEM, "the rollback record of %lld tokens", (long long)n_tok);
    }
    s->rec_cap = n_tok;
    s->gen = tgt_gen_next();
    return TD_OK;
}

td_err tgt_state_init(tgt_state *s, const tgt_model *m, int64_t n_ctx)
{
    const tgt_hparams *hp = &m->hp;
    memset(s, 0, sizeof *s);
    s->be = m->be;
    if (n_ctx <= 0 || n_ctx > INT32_MAX)
        return err_set(TD_EINVAL, "context size %lld is out of range", (long long)n_ctx);
    s->n_ctx = n_ctx;
    s->n_attn = m->n_attn_layers;
    s->n_delta = m->n_delta_layers;
    s->kv_type = m->kv_type;
    size_t kv = (size_t)(n_ctx * hp->n_head_kv * hp->head_dim) * ops_kv_elem_bytes(s->kv_type);
    s->k = tgt_alloc_kv(s->be, s->n_attn, kv);
    s->v = s->k ? tgt_alloc_kv(s->be, s->n_attn, kv) : NULL;
    s->ssm = s->v ? tgt_alloc_list(s->be, s->n_delta, tgt_ssm_floats(hp)) : NULL;
    s->conv = s->ssm ? tgt_alloc_list(s->be, s->n_delta, tgt_conv_floats(hp)) : NULL;
    if (!s->conv) {
        tgt_state_free(s);
        return err_wrap(TD_ENOMEM, "a context of %lld positions", (long long)n_ctx);
    }
    s->gen = tgt_gen_next();
    return TD_OK;
}

td_err tgt_state_bind(tgt_state *s, const tgt_model *m, int64_t n_ctx, const tgt_state_mem *mem)
{
    const tgt_hparams *hp = &m->hp;
    memset(s, 0, sizeof *s);
    s->be = m->be;
    if (n_ctx <= 0 || n_ctx > INT32_MAX || mem->rec_cap < 0)
        return err_set(TD_EINVAL, "context size %lld is out of range", (long long)n_ctx);
    s->bound = true;
    s->n_ctx = n_ctx;
    s->n_attn = m->n_attn_layers;
    s->n_delta = m->n_delta_layers;
    s->kv_type = m->kv_type;
    size_t kv = (size_t)(n_ctx * hp->n_head_kv * hp->head_dim) * ops_kv_elem_bytes(s->kv_type);
    size_t rows = (size_t)(mem->rec_cap * hp->conv_ch);
    s->k = tgt_view_kv(s->n_attn, mem->k, kv);
    s->v = tgt_view_kv(s->n_attn, mem->v, kv);
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
    s->gen = tgt_gen_next();
    return TD_OK;
}

void tgt_state_free(tgt_state *s)
{
    if (!s->be) {
        memset(s, 0, sizeof *s);
        return;
    }
    int64_t na = s->bound ? 0 : s->n_attn, nd = s->bound ? 0 : s->n_delta;
    tgt_free_kv(s->be, s->k, na);
    tgt_free_kv(s->be, s->v, na);
    tgt_free_list(s->be, s->ssm, nd);
    tgt_free_list(s->be, s->conv, nd);
    tgt_rec_free(s, s->n_delta);
    memset(s, 0, sizeof *s);
}

td_err tgt_state_reset(const tgt_model *m, tgt_state *s)
{
    const tgt_hparams *hp = &m->hp;
    const ops_backend *be = s->be;
    const int64_t nd = s->n_delta;
    if (nd > 0) { /* every layer's array and the padding between them: one fill per list */
        const size_t ns = tgt_ssm_floats(hp), nc = tgt_conv_floats(hp), f = sizeof(float);
        const size_t ss = tgt_list_stride(s->ssm, nd, ns), sc = tgt_list_stride(s->conv, nd, nc);
        TD_TRY(be->zero(be, s->ssm[0], ((size_t)(nd - 1) * ss + ns) * f));
        TD_TRY(be->zero(be, s->conv[0], ((size_t)(nd - 1) * sc + nc) * f));
    }
    s->n_past = 0;
    s->rec_n_tok = 0;
    return TD_OK;
}

/* --- mixers ----------------------------------------------------------------------------- */

/* Gated (qwen35) or plain (qwen3) attention over h[n_tok] at positions w->step_pos; writes
 * this block's K/V into the cache (kv_type) at those rows and the mixer output (before
 * attn_output) into w->o. */
static td_err tgt_attention(const tgt_model *m, const tgt_layer *L, const tgt_state *s,
                            int64_t ia, tgt_work *w)
{
    const tgt_hparams *hp = &m->hp;
    const ops_backend *be = m->be;
    int64_t n_tok = w->n_tok;
    int64_t hd = hp->head_dim, q_head = hp->attn_gate ? 2 * hd : hd;
    int64_t q_tok = hp->n_head * q_head, kv_tok = hp->n_head_kv * hd;
    float *q = w->a, *k = w->b, *v = w->c;
    const ops_mm_out qkv[] = {{q, &L->wq}, {k, &L->wk}, {v, &L->wv}};
    TD_TRY(be->matmul_multi(be, w->h, qkv, 3, n_tok));
    const int32_t *pos = w->step_pos + 1;
    /* q_norm covers the query half of each head, never the gate. The finished keys and the
     * values go to the cache in the same call, at rows given on the device (a recording
     * stays valid as n_past moves); an f16 cache rounds each key and value once, here. */
    const ops_kv_dst kv = {.k_cache = s->k[ia], .v_cache = s->v[ia], .type = s->kv_type,
                           .v = v, .rows = pos, .row = kv_tok};
    TD_TRY(be->qk_norm_rope(be, q, k, L->q_norm, L->k_norm, n_tok, hp->n_head, hp->n_head_kv, hd,
                            q_head, hp->n_rot, pos, hp->rope_theta, hp->eps, &kv));

    ops_attn a = {
        .n_q = n_tok, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hd,
        .scale = 1.0f / sqrtf((float)hd),
        .q = q, .q_tok_stride = q_tok, .q_head_stride = q_head, .q_pos = pos,
        .kv_type = s->kv_type, .k = s->k[ia], .v = s->v[ia], .kv_tok_stride = kv_tok,
        .kv_head_stride = hd, .k_pos = w->pos, .n_kv = w->n_kv, .n_kv_dev = w->step_pos,
        .mask = OPS_MASK_CAUSAL,
        .gate = hp->attn_gate ? q + hd : NULL, .gate_tok_stride = q_tok,
        .gate_head_stride = q_head, .out = w->o,
    };
    return be->attention(be, &a);
}

/* Gated DeltaNet over h[n_tok]: conv state and recurrent state advance by n_tok; the
 * output (before ssm_out) goes to w->o. With a rollback record (rec_* non-NULL) the
 * recurrence inputs are produced straight into it (no copies), and rec_ssm0 and rec_conv0
 * receive the recurrent state and the conv window before the block. */
static td_err tgt_deltanet(const tgt_model *m, const tgt_layer *L, float *ssm, float *conv,
                           int64_t n_tok, tgt_work *w, float *rec_ssm0, float *rec_conv0,
                           float *rec_xconv, float *rec_qkv, float *rec_gb)
{
    const tgt_hparams *hp = &m->hp;
    const ops_backend *be = m->be;
    int64_t nv = hp->n_v_head, ch = hp->conv_ch;
    int64_t qk = hp->n_k_head * hp->d_k;
    float *raw = rec_xconv ? rec_xconv : w->a, *qkv = rec_qkv ? rec_qkv : w->b, *z = w->c;
    float *alpha = w->gb, *beta = w->gb + n_tok * nv;
    float *gb = rec_gb ? rec_gb : w->gb + 2 * n_tok * nv; /* [n_tok][2][nv] */

    /* the two wide projections of h in one call (the GPU rounds h once), then alpha, beta,
     * the convolution and the recurrence's inputs in one more (one launch on the GPU) */
    const ops_mm_out proj[] = {{raw, &L->wqkv}, {z, &L->wz}};
    TD_TRY(be->matmul_multi(be, w->h, proj, 2, n_tok));
    const ops_dn_in in = {
        .n_tok = n_tok, .h = w->h, .w_alpha = &L->walpha, .w_beta = &L->wbeta,
        .alpha = alpha, .beta = beta, .raw = raw, .raw_stride = ch, .conv_w = L->conv_w,
        .conv_state = conv, .conv_prev = rec_conv0, .n_ch = ch, .conv_k = hp->conv_k, .qkv = qkv, .gb = gb,
        .dt_bias = L->dt_bias, .ssm_a = L->ssm_a, .n_v_head = nv, .n_k_head = hp->n_k_head,
        .d_k = hp->d_k, .eps = hp->eps,
    };
    TD_TRY(be->deltanet_in(be, &in));

    ops_delta d = {
        .n_tok = n_tok, .n_k_head = hp->n_k_head, .n_v_head = nv, .d_k = hp->d_k,
        .d_v = hp->d_v, .q = qkv, .k = qkv + qk, .v = qkv + 2 * qk, .q_tok_stride = ch,
        .k_tok_stride = ch, .v_tok_stride = ch, .g = gb, .beta = gb + nv,
        .gb_tok_stride = 2 * nv, .state = ssm, .state_prev = rec_ssm0, .state_all = NULL,
        .out = w->o,
        /* y = RMSNorm_dv(o) * ssm_norm * silu(z), in the same launch on the GPU */
        .norm_w = L->ssm_norm, .norm_z = z, .norm_eps = hp->eps,
        .settled = true, /* deltanet_in writes none of ssm, rec_ssm0's source and z */
    };
    if (m->delta_chunk && !rec_ssm0 && n_tok > 1) { /* a prefill: the chunked form */
        d.chunk = m->delta_chunk;
        d.pos0 = w->step_pos + 1; /* token 0's position, read where the pass runs */
    }
    return be->delta_rule(be, &d);
}

td_err tgt_set_delta_chunk(tgt_model *m, int64_t n)
{
    const tgt_hparams *hp = &m->hp;
    if (n < 0 || n > OPS_DELTA_CHUNK_MAX)
        return err_set(TD_EINVAL, "delta rule chunk %lld: give 0 (token by token) to %d",
                       (long long)n, OPS_DELTA_CHUNK_MAX);
    if (n && m->n_delta_layers && (hp->d_k > OPS_DELTA_CHUNK_DK || hp->d_v > OPS_DELTA_CHUNK_DV))
        return err_set(TD_ENOTSUP, "the chunked delta rule handles heads of d_k <= %d and d_v <= "
                       "%d, this model's are %lld and %lld", OPS_DELTA_CHUNK_DK,
                       OPS_DELTA_CHUNK_DV, (long long)hp->d_k, (long long)hp->d_v);
    if (n && m->n_delta_layers && n > m->be->delta_chunk_max)
        return err_set(TD_ENOTSUP, "the %s backend runs the chunked delta rule in chunks of at "
                       "most %lld positions (its shared memory per block), not %lld",
                       m->be->name, (long long)m->be->delta_chunk_max, (long long)n);
    m->delta_chunk = n;
    return TD_OK;
}

/* --- forward ---------------------------------------------------------------------------- */

static td_err tgt_layers(const tgt_model *m, tgt_state *s, int64_t n_tok, bool record,
                         const tgt_out *out)
{
    const tgt_hparams *hp = &m->hp;
    const ops_backend *be = m->be;
    tgt_work *w = m->work;
    int64_t D = hp->n_embd, ia = 0, id = 0;
    /* Each residual add is fused with the norm that follows it (the next sublayer's). */
    TD_TRY(be->rmsnorm(be, w->h, w->x, m->layers[0].attn_norm, n_tok, D, D, hp->eps));
    for (int64_t il = 0; il < hp->n_layer; il++) {
        const tgt_layer *L = &m->layers[il];
        if (L->kind == TGT_LAYER_ATTN) {
            TD_TRY(tgt_attention(m, L, s, ia, w));
            TD_TRY(be->matmul(be, w->h, w->o, &L->wo, n_tok));
            ia++;
        } else {
            TD_TRY(tgt_deltanet(m, L, s->ssm[id], s->conv[id], n_tok, w,
                                record ? s->rec_ssm0[id] : NULL, record ? s->rec_conv0[id] : NULL,
                                record ? s->rec_xconv[id] : NULL, record ? s->rec_qkv[id] : NULL,
                                record ? s->rec_gb[id] : NULL));
            TD_TRY(be->matmul(be, w->h, w->o, &L->wssm_out, n_tok));
            id++;
        }
        TD_TRY(be->add_rmsnorm(be, w->x, w->h, w->h, L->ffn_norm, n_tok, D, hp->eps));
        const ops_mm_out gate_up[] = {{w->ff1, &L->ffn_gate}, {w->ff2, &L->ffn_up}};
        TD_TRY(be->matmul_multi(be, w->h, gate_up, 2, n_tok));
        TD_TRY(be->swiglu_matmul(be, w->h, w->ff1, w->ff2, &L->ffn_down, n_tok));
        if (il + 1 < hp->n_layer)
            TD_TRY(be->add_rmsnorm(be, w->x, w->h, w->h, m->layers[il + 1].attn_norm, n_tok, D,
                                   hp->eps));
        else
            TD_TRY(be->add(be, w->x, w->x, w->h, n_tok * D));

        /* tap j of token t at tap_out[t][j]: one strided copy per tap */
        for (int64_t j = 0; out && j < out->n_taps; j++) {
            if (out->taps[j] != il)
                continue;
            size_t row = (size_t)D * sizeof(float);
            TD_TRY(be->copy2d(be, out->tap_out + j * D, (size_t)out->n_taps * row, w->x, row,
                              row, (size_t)n_tok));
        }
    }
    if (out && out->logits) {
        int64_t first = out->last_only ? n_tok - 1 : 0, n = n_tok - first;
        TD_TRY(be->rmsnorm(be, w->h, w->x + first * D, m->output_norm, n, D, D, hp->eps));
        TD_TRY(be->matmul(be, out->logits, w->h, &m->output, n));
    }
    return TD_OK;
}

td_err tgt_run(const tgt_model *m, tgt_state *s, int64_t n_tok, bool record, const tgt_out *out)
{
    tgt_work *w = m->work;
    TD_TRY(m->be->get_rows(m->be, w->x, &m->tok_embd, w->ids, n_tok));
    return tgt_layers(m, s, n_tok, record, out);
}

td_err tgt_forward(const tgt_model *m, tgt_state *s, const int32_t *tokens, int64_t n_tok,
                   bool record, const tgt_out *out)
{
    const tgt_hparams *hp = &m->hp;
    TD_ASSERT(n_tok >= 1 && s->be == m->be);
    if (s->n_past + n_tok > s->n_ctx)
        return err_set(TD_ERANGE, "context full: %lld + %lld tokens exceed %lld positions",
                       (long long)s->n_past, (long long)n_tok, (long long)s->n_ctx);
    /* Checked here: a device lookup cannot report a bad id. */
    for (int64_t i = 0; i < n_tok; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return err_set(TD_ERANGE, "token ids: id %d at %lld is outside the vocabulary of %lld",
                           tokens[i], (long long)i, (long long)hp->n_vocab);
    if (record)
        TD_TRY(tgt_rec_reserve(m, s, n_tok));
    bool graphs = tgt_graph_wanted(m);
    TD_TRY(tgt_work_reserve(m, n_tok, graphs ? s->n_ctx : s->n_past + n_tok));
    tgt_work *w = m->work;
    w->host_pos[0] = (int32_t)(s->n_past + n_tok);
    for (int64_t i = 0; i < n_tok; i++)
        w->host_pos[1 + i] = (int32_t)(s->n_past + i);
    TD_TRY(m->be->to_device(m->be, w->ids, tokens, (size_t)n_tok * sizeof(int32_t)));
    TD_TRY(m->be->to_device(m->be, w->step_pos, w->host_pos,
                            (size_t)(1 + n_tok) * sizeof(int32_t)));
    w->n_tok = n_tok;
    const int slot = graphs ? tgt_graph_pick(m, s, n_tok, record, out) : -1;
    w->n_kv = slot >= 0 ? s->n_ctx : s->n_past + n_tok;
    s->rec_n_tok = 0;
    td_err e = slot >= 0 ? tgt_graph_run(m, s, slot, n_tok, record, out)
                         : tgt_run(m, s, n_tok, record, out);
    if (e != TD_OK)
        return e; /* the state is unusable: the caller resets the sequence */
    if (record) {
        s->rec_n_tok = n_tok;
        s->rec_pos0 = s->n_past;
    }
    s->n_past += n_tok;
    return TD_OK;
}

td_err tgt_state_keep(const tgt_model *m, tgt_state *s, int64_t keep)
{
    const tgt_hparams *hp = &m->hp;
    const ops_backend *be = m->be;
    int64_t n = s->rec_n_tok;
    TD_ASSERT(n > 0 && keep >= 0 && keep <= n && s->n_past == s->rec_pos0 + n);
    /* every layer's replay in one call (they share no memory): a few launches on a GPU; its
     * array is had before anything changes */
    tgt_work *w = m->work;
    if (keep && keep < n && s->n_delta > w->cap_replay) {
        ops_delta *grown = realloc(w->replay, (size_t)s->n_delta * sizeof *grown);
        if (!grown)
            return err_set(TD_ENOMEM, "rollback: out of memory");
        w->replay = grown;
        w->cap_replay = s->n_delta;
    }
    ops_delta *rep = w->replay;
    s->n_past = s->rec_pos0 + keep;
    s->rec_n_tok = 0;
    if (keep == n)
        return TD_OK;
    int64_t ch = hp->conv_ch, nv = hp->n_v_head, km1 = hp->conv_k - 1;
    int64_t qk = hp->n_k_head * hp->d_k;
    /* conv: the last k-1 raw inputs of [state before ; the kept tokens' inputs], which is the
     * tail of rec_conv0 from row keep, then the head of rec_xconv; each one 2D copy over
     * every layer, the lists being strided arrays (a copy per layer and part, 96 on the 27B,
     * took ~0.15 ms of a 0.34 ms rollback on an H200) */
    int64_t n0 = keep < km1 ? km1 - keep : 0;
    size_t row = (size_t)ch * sizeof(float), f = sizeof(float);
    const int64_t nd = s->n_delta;
    td_err e = TD_OK;
    if (nd > 0) {
        const size_t conv = tgt_conv_floats(hp), ssm = tgt_ssm_floats(hp);
        const size_t dp = tgt_list_stride(s->conv, nd, conv) * f;
        if (n0 > 0)
            e = be->copy2d(be, s->conv[0], dp, s->rec_conv0[0] + keep * ch,
                           tgt_list_stride(s->rec_conv0, nd, conv) * f, (size_t)n0 * row,
                           (size_t)nd);
        if (e == TD_OK && km1 > n0)
            e = be->copy2d(be, s->conv[0] + n0 * ch, dp, s->rec_xconv[0] + (keep + n0 - km1) * ch,
                           tgt_list_stride(s->rec_xconv, nd, (size_t)(s->rec_cap * ch)) * f,
                           (size_t)(km1 - n0) * row, (size_t)nd);
        if (e == TD_OK && keep == 0)
            e = be->copy2d(be, s->ssm[0], tgt_list_stride(s->ssm, nd, ssm) * f, s->rec_ssm0[0],
                           tgt_list_stride(s->rec_ssm0, nd, ssm) * f, ssm * f, (size_t)nd);
    }
    for (int64_t i = 0; e == TD_OK && keep > 0 && i < nd; i++) {
        /* the replay starts from the state before the block and writes the kept state; its
         * outputs are not wanted */
        const float *qkv = s->rec_qkv[i];
        rep[i] = (ops_delta){
            .n_tok = keep, .n_k_head = hp->n_k_head, .n_v_head = nv, .d_k = hp->d_k,
            .d_v = hp->d_v, .q = qkv, .k = qkv + qk, .v = qkv + 2 * qk, .q_tok_stride = ch,
            .k_tok_stride = ch, .v_tok_stride = ch, .g = s->rec_gb[i], .beta = s->rec_gb[i] + nv,
            .gb_tok_stride = 2 * nv, .state = s->ssm[i], .state_in = s->rec_ssm0[i],
            .state_prev = NULL, .state_all = NULL, .out = NULL,
        };
    }
    if (e == TD_OK && keep)
        e = be->delta_rule_many(be, rep, s->n_delta);
    return e;
}
