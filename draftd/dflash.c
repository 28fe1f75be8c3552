/* DFlash drafter: loading, context K/V from target features, one-pass block proposal. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "draftd/dflash.h"
#include "common/log.h"

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

/* Scratch of the drafter's passes, in backend memory, kept by the model and grown on demand
 * (allocating device memory per call would stall the GPU). */
typedef struct dfl_work {
    int64_t cap;   /* rows the buffers hold (>= block_size) */
    float *x;      /* [cap][hidden] residual stream */
    float *h;      /* [cap][hidden] normed sublayer input; fused context features */
    float *q;      /* [cap][wide] queries, gate; context K */
    float *a;      /* [cap][wide] attention output; context V */
    float *f;      /* [cap][wide] up projection */
    int32_t *ids;  /* [2 cap] token ids of a block, or the positions of n new context rows
                    * followed by their ring slots (the rows their K/V go to) */
    int32_t *iota; /* [cap] 0, 1, ..: a block's K/V rows after the valid ring entries */
    int32_t *host; /* [2 cap] host staging of ids */
} dfl_work;

/* wide: the widest of the attention, FFN and residual rows. */
static int64_t dfl_wide(const dflash_config *c)
{
    int64_t w = (int64_t)c->n_heads * c->head_dim;
    int64_t kvw = (int64_t)c->n_kv_heads * c->head_dim;
    if ((int64_t)c->ffn > w)
        w = c->ffn;
    if (kvw > w)
        w = kvw;
    if ((int64_t)c->hidden > w)
        w = c->hidden;
    return w;
}

static void dfl_work_release(const ops_backend *be, dfl_work *w)
{
    float **f[] = {&w->x, &w->h, &w->q, &w->a, &w->f};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        be->release(be, *f[i]);
        *f[i] = NULL;
    }
    be->release(be, w->ids);
    free(w->host);
    w->ids = w->iota = w->host = NULL;
    w->cap = 0;
}

/* Makes the model's scratch hold n rows. */
static td_err dfl_work_reserve(const dfl_model *m, int64_t n)
{
    dfl_work *w = m->work;
    const ops_backend *be = m->be;
    if (n <= w->cap)
        return TD_OK;
    dfl_work_release(be, w);
    size_t r = (size_t)n, f = sizeof(float), H = m->cfg.hidden, W = (size_t)dfl_wide(&m->cfg);
    struct {
        void **p;
        size_t bytes;
    } want[] = {
        {(void **)&w->x, r * H * f}, {(void **)&w->h, r * H * f}, {(void **)&w->q, r * W * f},
        {(void **)&w->a, r * W * f}, {(void **)&w->f, r * W * f},
        {(void **)&w->ids, 3 * r * sizeof(int32_t)}, /* ids, then iota */
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        td_err e = be->alloc(be, want[i].p, want[i].bytes);
        if (e != TD_OK) {
            dfl_work_release(be, w);
            return err_wrap(e, "drafter scratch for %lld rows", (long long)n);
        }
    }
    w->iota = w->ids + 2 * r;
    w->host = malloc(2 * r * sizeof(int32_t));
    if (!w->host) {
        dfl_work_release(be, w);
        return err_set(TD_ENOMEM, "out of memory for drafter scratch of %lld rows", (long long)n);
    }
    for (int64_t i = 0; i < n; i++)
        w->host[i] = (int32_t)i;
    td_err e = be->to_device(be, w->iota, w->host, r * sizeof(int32_t));
    if (e != TD_OK) {
        dfl_work_release(be, w);
        return err_wrap(e, "drafter scratch for %lld rows", (long long)n);
    }
    w->cap = n;
    return TD_OK;
}

/* Visits every weight of the drafter (not the borrowed embedding and head): the pointer to
 * its data and its size in bytes. */
typedef td_err (*dfl_visit_fn)(void *ctx, const void **data, size_t bytes);

static td_err dfl_visit(dfl_model *m, dfl_visit_fn fn, void *ctx)
{
    const dflash_config *c = &m->cfg;
    size_t H = (size_t)c->hidden * sizeof(float), hd = (size_t)c->head_dim * sizeof(float);
#define DFL_W(w) TD_TRY(fn(ctx, &(w).data, (size_t)(w).rows * (w).row_bytes))
#define DFL_V(v, b) TD_TRY(fn(ctx, (const void **)&(v), (b)))
    DFL_W(m->fc);
    DFL_V(m->hidden_norm, H);
    DFL_V(m->norm, H);
    for (uint32_t il = 0; il < c->n_layers; il++) {
        dfl_layer *L = &m->layers[il];
        DFL_V(L->in_norm, H);
        DFL_V(L->post_norm, H);
        DFL_V(L->q_norm, hd);
        DFL_V(L->k_norm, hd);
        DFL_W(L->wq);
        DFL_W(L->wk);
        DFL_W(L->wv);
        DFL_W(L->wo);
        DFL_W(L->gate);
        DFL_W(L->up);
        DFL_W(L->down);
    }
#undef DFL_W
#undef DFL_V
    return TD_OK;
}

#define DFL_ALIGN 256 /* bytes: every weight starts on a 256-byte boundary of the arena */

static size_t dfl_aligned(size_t bytes)
{
    return (bytes + DFL_ALIGN - 1) / DFL_ALIGN * DFL_ALIGN;
}

static td_err dfl_count(void *ctx, const void **data, size_t bytes)
{
    (void)data;
    *(size_t *)ctx += dfl_aligned(bytes);
    return TD_OK;
}

typedef struct dfl_placer {
    const ops_backend *be;
    uint8_t *arena; /* backend memory */
    size_t at;      /* bytes used */
} dfl_placer;

static td_err dfl_place_one(void *ctx, const void **data, size_t bytes)
{
    dfl_placer *p = ctx;
    uint8_t *dst = p->arena + p->at;
    TD_TRY(p->be->to_device(p->be, dst, *data, bytes));
    *data = dst;
    p->at += dfl_aligned(bytes);
    return TD_OK;
}

/* Copies every drafter weight into one arena of backend memory and points the model at it. */
static td_err dfl_place(dfl_model *m, const ops_backend *be)
{
    size_t total = 0;
    TD_TRY(dfl_visit(m, dfl_count, &total));
    dfl_placer p = {.be = be};
    TD_TRY(err_wrap(be->alloc(be, (void **)&p.arena, total), "drafter weights (%zu bytes)",
                    total));
    /* The arena is owned from here on, so a failed copy is released by dfl_free. */
    m->dev_arena = p.arena;
    TD_TRY(dfl_visit(m, dfl_place_one, &p));
    return be->sync(be);
}

td_err dfl_load(dfl_model **out, const char *dir, uint32_t n_target_layers,
                const ops_weight *tok_embd, const ops_weight *lm_head)
{
    return dfl_load_on(out, dir, n_target_layers, tok_embd, lm_head, ops_backend_cpu());
}

td_err dfl_load_on(dfl_model **out, const char *dir, uint32_t n_target_layers,
                   const ops_weight *tok_embd, const ops_weight *lm_head,
                   const ops_backend *be)
{
    char path[4096];
    *out = NULL;
    dfl_model *m = calloc(1, sizeof *m);
    if (!m)
        return err_set(TD_ENOMEM, "out of memory loading the drafter");
    m->be = ops_backend_cpu(); /* until the weights are placed: what dfl_free releases with */
    m->work = calloc(1, sizeof *m->work);
    snprintf(path, sizeof path, "%s/config.json", dir);
    td_err e = m->work ? dflash_config_load(&m->cfg, path)
                       : err_set(TD_ENOMEM, "out of memory loading the drafter");
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
    m->kv_type = TD_F32;
    if (e == TD_OK && be->kind != OPS_BACKEND_CPU) {
        m->be = be;
        const char *kv = getenv("TANDEM_DRAFT_KV"); /* f32: the CPU's context on a GPU */
        m->kv_type = kv && strcmp(kv, "f32") == 0 ? TD_F32 : TD_F16;
        if (kv && *kv && strcmp(kv, "f32") != 0 && strcmp(kv, "f16") != 0)
            LOG_WARN("TANDEM_DRAFT_KV=%s is neither f32 nor f16: the context is f16", kv);
        e = err_wrap(dfl_place(m, be), "placing the drafter on %s", be->name);
    } else if (e == TD_OK) {
        m->be = be; /* host memory either way; a profiler over the CPU stays in the path */
    }
    if (e == TD_OK)
        e = dfl_work_reserve(m, c->block_size);
    if (e != TD_OK) {
        dfl_free(m);
        return err_wrap(e, "loading drafter %s", dir);
    }
    m->tok_embd = *tok_embd;
    m->lm_head = *lm_head;
    /* bf16 (a GPU's default): the products' inputs rounded (one tensor-core piece instead of
     * three; the 27B drafter's step 10.5% shorter on an H200); f32: the CPU's exact inputs */
    const char *act = getenv("TANDEM_DRAFT_ACT");
    if (act && *act && strcmp(act, "f32") != 0 && strcmp(act, "bf16") != 0)
        LOG_WARN("TANDEM_DRAFT_ACT=%s is neither f32 nor bf16: the default applies", act);
    dfl_set_x_bf16(m, be->kind != OPS_BACKEND_CPU && !(act && strcmp(act, "f32") == 0));
    *out = m;
    return TD_OK;
}

void dfl_set_x_bf16(dfl_model *m, bool on)
{
    m->fc.x_bf16 = on;
    m->lm_head.x_bf16 = on;
    for (uint32_t il = 0; il < m->cfg.n_layers; il++) {
        dfl_layer *L = &m->layers[il];
        ops_weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            w[i]->x_bf16 = on;
    }
}

void dfl_free(dfl_model *m)
{
    if (!m)
        return;
    if (m->work) {
        dfl_work_release(m->be, m->work);
        free(m->work);
    }
    if (m->dev_arena)
        m->be->release(m->be, m->dev_arena);
    if (m->st)
        st_close(m->st);
    free(m->layers);
    free(m->owned);
    free(m);
}

/* --- state ------------------------------------------------------------------------------ */

uint32_t dfl_kv_bytes(const dfl_model *m)
{
    return (uint32_t)ops_kv_elem_bytes(m->kv_type);
}

td_err dfl_state_init(dfl_state *s, const dfl_model *m, int64_t cap)
{
    const dflash_config *c = &m->cfg;
    const ops_backend *be = m->be;
    memset(s, 0, sizeof *s);
    if (cap <= 0 || cap > INT32_MAX / 2)
        return err_set(TD_EINVAL, "drafter context window %lld is out of range", (long long)cap);
    s->be = be;
    s->cap = cap;
    s->block = c->block_size;
    s->n_layers = c->n_layers;
    s->kv_type = m->kv_type;
    size_t slots = (size_t)(cap + s->block);
    size_t kv = (size_t)c->n_kv_heads * c->head_dim * ops_kv_elem_bytes(s->kv_type);
    s->k = calloc(c->n_layers, sizeof *s->k);
    s->v = calloc(c->n_layers, sizeof *s->v);
    td_err e = s->k && s->v ? TD_OK : err_set(TD_ENOMEM, "out of memory for a drafter context");
    if (e == TD_OK)
        e = be->alloc(be, (void **)&s->pos, slots * sizeof *s->pos);
    if (e == TD_OK)
        e = be->zero(be, s->pos, slots * sizeof *s->pos);
    for (uint32_t i = 0; e == TD_OK && i < c->n_layers; i++) {
        e = be->alloc(be, &s->k[i], slots * kv);
        if (e == TD_OK)
            e = be->zero(be, s->k[i], slots * kv);
        if (e == TD_OK)
            e = be->alloc(be, &s->v[i], slots * kv);
        if (e == TD_OK)
            e = be->zero(be, s->v[i], slots * kv);
    }
    if (e != TD_OK) {
        dfl_state_free(s);
        return err_wrap(e, "a drafter context of %lld", (long long)cap);
    }
    return TD_OK;
}

td_err dfl_state_bind(dfl_state *s, const dfl_model *m, int64_t cap, int64_t rows, void *k,
                      void *v, int32_t *pos)
{
    const dflash_config *c = &m->cfg;
    memset(s, 0, sizeof *s);
    if (cap <= 0 || cap > INT32_MAX / 2 || rows < cap + (int64_t)c->block_size)
        return err_set(TD_EINVAL, "drafter context window %lld in %lld rows is out of range",
                       (long long)cap, (long long)rows);
    s->be = m->be;
    s->bound = true;
    s->cap = cap;
    s->block = c->block_size;
    s->n_layers = c->n_layers;
    s->kv_type = m->kv_type;
    s->pos = pos;
    s->k = calloc(c->n_layers, sizeof *s->k);
    s->v = calloc(c->n_layers, sizeof *s->v);
    if (!s->k || !s->v) {
        dfl_state_free(s);
        return err_set(TD_ENOMEM, "out of memory binding a drafter context");
    }
    size_t layer = (size_t)rows * c->n_kv_heads * c->head_dim * ops_kv_elem_bytes(s->kv_type);
    for (uint32_t i = 0; i < c->n_layers; i++) {
        s->k[i] = (uint8_t *)k + i * layer;
        s->v[i] = (uint8_t *)v + i * layer;
    }
    return TD_OK;
}

void dfl_state_free(dfl_state *s)
{
    if (!s->bound && s->be) {
        for (int64_t i = 0; i < s->n_layers; i++) {
            if (s->k)
                s->be->release(s->be, s->k[i]);
            if (s->v)
                s->be->release(s->be, s->v[i]);
        }
        s->be->release(s->be, s->pos);
    }
    free(s->k);
    free(s->v);
    memset(s, 0, sizeof *s);
}

void dfl_state_reset(dfl_state *s)
{
    s->n_ctx = 0;
}

/* --- compute ---------------------------------------------------------------------------- */

/* Layer il's Q = RoPE(q_norm(q)) [n][n_heads * head_dim] (q NULL: none), K = RoPE(k_norm(k))
 * and V = v for its projections q, k, v [n][heads * head_dim] (f32 scratch): the norms and
 * rotations in one launch, which stores K and V (as the state's kv_type) at rows at + rows[i]
 * of the layer's context (rows: backend memory). */
static td_err dfl_qk_store(const dfl_model *m, const dfl_state *s, uint32_t il, float *q, float *k,
                           const float *v, int64_t n, const int32_t *pos, int64_t at,
                           const int32_t *rows)
{
    const dflash_config *c = &m->cfg;
    const dfl_layer *L = &m->layers[il];
    int64_t hd = c->head_dim, kvw = (int64_t)c->n_kv_heads * hd;
    size_t skip = (size_t)(at * kvw) * ops_kv_elem_bytes(s->kv_type);
    const ops_kv_dst dst = {.k_cache = (uint8_t *)s->k[il] + skip,
                            .v_cache = (uint8_t *)s->v[il] + skip, .type = s->kv_type,
                            .v = v, .rows = rows, .row = kvw};
    return m->be->qk_norm_rope(m->be, q, k, q ? L->q_norm : NULL, L->k_norm, n,
                               q ? c->n_heads : 0, c->n_kv_heads, hd, hd, hd, pos,
                               (float)c->rope_theta, (float)c->rms_eps, &dst);
}

/* The context keys ka, kb and values va, vb [n][n_kv_heads * head_dim] of layers a and b:
 * each layer's k norm and rotation and both stores in one launch, layer a's keys through the
 * op's q side (whose heads get the very operations of the k side), at rows[i] of each
 * layer's context. */
static td_err dfl_k_store_pair(const dfl_model *m, const dfl_state *s, uint32_t a, float *ka,
                               const float *va, uint32_t b, float *kb, const float *vb,
                               int64_t n, const int32_t *pos, const int32_t *rows)
{
    const dflash_config *c = &m->cfg;
    int64_t hd = c->head_dim;
    const ops_kv_dst dst = {.k_cache = s->k[b], .v_cache = s->v[b], .type = s->kv_type,
                            .v = vb, .rows = rows, .row = (int64_t)c->n_kv_heads * hd,
                            .qk_cache = s->k[a], .qv_cache = s->v[a], .qv = va};
    return m->be->qk_norm_rope(m->be, ka, kb, m->layers[a].k_norm, m->layers[b].k_norm, n,
                               c->n_kv_heads, c->n_kv_heads, hd, hd, hd, pos,
                               (float)c->rope_theta, (float)c->rms_eps, &dst);
}

/* Copies the host rows src[n][row_bytes] of new positions n_ctx.. (n <= cap) into their ring
 * slots of dst, a run of consecutive slots per copy. */
static td_err dfl_ring_put(const ops_backend *be, const dfl_state *s, void *dst, const void *src,
                           int64_t n, size_t row_bytes)
{
    for (int64_t i = 0; i < n;) {
        int64_t slot = (s->n_ctx + i) % s->cap, run = s->cap - slot;
        if (run > n - i)
            run = n - i;
        TD_TRY(be->to_device(be, (uint8_t *)dst + (size_t)slot * row_bytes,
                             (const uint8_t *)src + (size_t)i * row_bytes,
                             (size_t)run * row_bytes));
        i += run;
    }
    return TD_OK;
}

td_err dfl_add_context(const dfl_model *m, dfl_state *s, const float *feat, int64_t n)
{
    const dflash_config *c = &m->cfg;
    const ops_backend *be = m->be;
    if (n <= 0)
        return TD_OK;
    if (n > s->cap) { /* only the last cap positions stay: one store per ring slot */
        feat += (n - s->cap) * (int64_t)c->n_taps * m->target_hidden;
        s->n_ctx += n - s->cap;
        n = s->cap;
    }
    int64_t H = c->hidden, kvw = (int64_t)c->n_kv_heads * c->head_dim;
    TD_TRY(err_wrap(dfl_work_reserve(m, n), "adding %lld drafter context positions",
                    (long long)n));
    dfl_work *w = m->work;
    float *h = w->h;
    /* the positions and their ring slots in one copy */
    int32_t *pos = w->ids, *rows = w->ids + n;
    for (int64_t i = 0; i < n; i++) {
        w->host[i] = (int32_t)(s->n_ctx + i);
        w->host[n + i] = (int32_t)((s->n_ctx + i) % s->cap);
    }
    TD_TRY(be->to_device(be, pos, w->host, (size_t)(2 * n) * sizeof(int32_t)));
    /* H_t = hidden_norm(fc(concat of tap features)); it enters k_proj/v_proj as it is. */
    TD_TRY(be->matmul(be, h, feat, &m->fc, n));
    TD_TRY(be->rmsnorm(be, h, h, m->hidden_norm, n, H, H, (float)c->rms_eps));
    /* Every layer's k and v read the same H: one matmul_multi for up to G layers at a time
     * (the matrices of one type then share launches), into the scratch w->q (k) and w->a
     * (v), layer l's rows at l * n * kvw (n rows of dfl_wide >= kvw floats each); the key
     * norms and rotations of two layers at a time then store them in the ring's slots of the
     * new positions. */
    int64_t G = dfl_wide(c) / kvw;
    if (G > OPS_MM_GROUP_MAX / 2)
        G = OPS_MM_GROUP_MAX / 2;
    for (uint32_t l0 = 0; l0 < c->n_layers; l0 += (uint32_t)G) {
        int64_t g = (int64_t)c->n_layers - l0 < G ? (int64_t)c->n_layers - l0 : G;
        ops_mm_out proj[OPS_MM_GROUP_MAX];
        for (int64_t i = 0; i < g; i++) {
            uint32_t il = l0 + (uint32_t)i;
            proj[2 * i] = (ops_mm_out){w->q + i * n * kvw, &m->layers[il].wk};
            proj[2 * i + 1] = (ops_mm_out){w->a + i * n * kvw, &m->layers[il].wv};
        }
        TD_TRY(be->matmul_multi(be, h, proj, (int)(2 * g), n));
        for (int64_t i = 0; i < g; i += 2) {
            uint32_t il = l0 + (uint32_t)i;
            if (i + 1 < g)
                TD_TRY(dfl_k_store_pair(m, s, il, proj[2 * i].y, proj[2 * i + 1].y, il + 1,
                                        proj[2 * i + 2].y, proj[2 * i + 3].y, n, pos, rows));
            else
                TD_TRY(dfl_qk_store(m, s, il, NULL, proj[2 * i].y, proj[2 * i + 1].y, n, pos, 0,
                                    rows));
        }
    }
    TD_TRY(dfl_ring_put(be, s, s->pos, w->host, n, sizeof(int32_t)));
    s->n_ctx += n;
    return TD_OK;
}

/* One layer of the block pass over x[B][H], the block's K/V going to the slots after the
 * n_valid ring entries. The first layer normalises x into h itself; every layer ends with its
 * residual add fused with the next norm (add_rmsnorm: the same chain, one launch): the next
 * layer's input norm, after the last layer the output norm, so h holds that norm next. */
static td_err dfl_block_layer(const dfl_model *m, dfl_state *s, uint32_t il, int64_t n_valid)
{
    const dflash_config *c = &m->cfg;
    const ops_backend *be = m->be;
    const dfl_layer *L = &m->layers[il];
    const dflash_layer *lt = &c->layers[il];
    dfl_work *w = m->work;
    int64_t B = c->block_size, H = c->hidden, hd = c->head_dim;
    int64_t qw = (int64_t)c->n_heads * hd, kvw = (int64_t)c->n_kv_heads * hd;
    float eps = (float)c->rms_eps;
    const int32_t *bpos = s->pos + n_valid;
    if (il == 0)
        TD_TRY(be->rmsnorm(be, w->h, w->x, L->in_norm, B, H, H, eps));
    /* Q, K and V of the block (K, V in the scratch a and f before they are stored) */
    const ops_mm_out proj[] = {{w->a, &L->wk}, {w->f, &L->wv}, {w->q, &L->wq}};
    TD_TRY(be->matmul_multi(be, w->h, proj, 3, B));
    TD_TRY(dfl_qk_store(m, s, il, w->q, w->a, w->f, B, bpos, n_valid, w->iota));
    ops_attn at = {
        .n_q = B, .n_head = c->n_heads, .n_head_kv = c->n_kv_heads, .head_dim = hd,
        .scale = 1.0f / sqrtf((float)hd), .q = w->q, .q_tok_stride = qw, .q_head_stride = hd,
        .q_pos = bpos, .kv_type = s->kv_type, .k = s->k[il], .v = s->v[il],
        .kv_tok_stride = kvw, .kv_head_stride = hd, .k_pos = s->pos, .n_kv = n_valid + B,
        .mask = lt->causal ? OPS_MASK_CAUSAL : OPS_MASK_BIDIRECTIONAL,
        .window = (int32_t)lt->window, .out = w->a,
    };
    TD_TRY(be->attention(be, &at));
    TD_TRY(be->matmul(be, w->h, w->a, &L->wo, B));
    TD_TRY(be->add_rmsnorm(be, w->x, w->h, w->h, L->post_norm, B, H, eps));
    const ops_mm_out gate_up[] = {{w->q, &L->gate}, {w->f, &L->up}};
    TD_TRY(be->matmul_multi(be, w->h, gate_up, 2, B));
    TD_TRY(be->swiglu_matmul(be, w->h, w->q, w->f, &L->down, B));
    const float *next = il + 1 < c->n_layers ? m->layers[il + 1].in_norm : m->norm;
    return be->add_rmsnorm(be, w->x, w->h, w->h, next, B, H, eps);
}

td_err dfl_propose(const dfl_model *m, dfl_state *s, int32_t pending, int64_t n_rows,
                   float *logits)
{
    const dflash_config *c = &m->cfg;
    const ops_backend *be = m->be;
    int64_t B = c->block_size, H = c->hidden;
    int64_t n_valid = s->n_ctx < s->cap ? s->n_ctx : s->cap;
    /* Checked here: a GPU gather cannot report a bad id. */
    if (pending < 0 || pending >= m->tok_embd.rows)
        return err_set(TD_ERANGE, "drafter block: row id %d outside [0, %lld)", pending,
                       (long long)m->tok_embd.rows);
    if (n_rows < 1 || n_rows > B - 1)
        return err_set(TD_EINVAL, "drafter block: %lld rows of logits asked for, 1..%lld there",
                       (long long)n_rows, (long long)(B - 1));
    dfl_work *w = m->work;
    w->host[0] = pending;
    for (int64_t i = 1; i < B; i++)
        w->host[i] = (int32_t)c->mask_token_id;
    TD_TRY(be->to_device(be, w->ids, w->host, (size_t)B * sizeof(int32_t)));
    TD_TRY(err_wrap(be->get_rows(be, w->x, &m->tok_embd, w->ids, B), "drafter block"));
    if (c->input_embedding_scale != 1.0)
        TD_TRY(be->scale(be, w->x, w->x, (float)c->input_embedding_scale, B * H));
    /* Block slots sit right after the valid ring entries, at positions n_ctx..n_ctx+B-1. */
    for (int64_t i = 0; i < B; i++)
        w->host[i] = (int32_t)(s->n_ctx + i);
    TD_TRY(be->to_device(be, s->pos + n_valid, w->host, (size_t)B * sizeof(int32_t)));

    for (uint32_t il = 0; il < c->n_layers; il++)
        TD_TRY(dfl_block_layer(m, s, il, n_valid));
    /* Slot k (1..B-1) proposes the token at position n_ctx + k; h holds the output norm. */
    TD_TRY(be->matmul(be, logits, w->h + H, &m->lm_head, n_rows));
    int64_t nl = n_rows * m->lm_head.rows;
    if (c->output_multiplier != 1.0)
        TD_TRY(be->scale(be, logits, logits, (float)c->output_multiplier, nl));
    if (c->final_logit_softcap > 0)
        TD_TRY(be->softcap(be, logits, logits, (float)c->final_logit_softcap, nl));
    return TD_OK;
}

/* --- drafting ----------------------------------------------------------------------------- */

uint64_t dfl_rng_ctr(int64_t pos, int role)
{
    return (uint64_t)pos * DFL_RNG_ROLES + (uint64_t)role;
}

td_err dfl_draft_tokens(const ops_backend *be, const ops_sampler *smp, const float *logits,
                        int64_t B, int64_t V, int64_t L, int32_t *ids, int32_t *block, float *q)
{
    int64_t n = B - 1;
    if (n < 1)
        return TD_OK;
    if (smp->temperature == 0.0f)
        TD_TRY(be->argmax(be, ids, logits, n, V));
    else
        TD_TRY(be->sample_rows(be, ids, q, logits, n, V, smp, dfl_rng_ctr(L + 1, DFL_RNG_DRAFT),
                               DFL_RNG_ROLES));
    TD_TRY(be->to_host(be, block + 1, ids, (size_t)n * sizeof(int32_t)));
    for (int64_t i = 1; i < B; i++)
        if (block[i] < 0 || block[i] >= V)
            return err_set(TD_EINVAL, "no finite drafter logit for position %lld",
                           (long long)(L + i));
    return TD_OK;
}
