/* Loading qwen3 / qwen35 GGUF files: hyperparameters from metadata, tensors checked for
 * presence, type and shape against them (tensor names as llama.cpp's converter writes them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verifyd/target.h"
#include "verifyd/target_int.h"

/* Reads an integer hyperparameter "<arch>.<key>"; def < 0 means required. */
static td_err tgt_key_i64(const gguf_file *g, const char *arch, const char *key, int64_t def,
                          int64_t *out)
{
    char full[160];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    td_err e = gguf_get_i64(g, full, out);
    if (e == TD_ENOENT && def >= 0) {
        *out = def;
        return TD_OK;
    }
    if (e != TD_OK)
        return err_wrap(e, "model metadata");
    if (*out < 0 || *out > (int64_t)1 << 40)
        return err_set(TD_EFORMAT, "model metadata %s = %lld is out of range", full,
                       (long long)*out);
    return TD_OK;
}

static td_err tgt_key_f32(const gguf_file *g, const char *arch, const char *key, float def,
                          bool required, float *out)
{
    char full[160];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    td_err e = gguf_get_f32(g, full, out);
    if (e == TD_ENOENT && !required) {
        *out = def;
        return TD_OK;
    }
    return e == TD_OK ? TD_OK : err_wrap(e, "model metadata");
}

static td_err tgt_hparams_read(tgt_hparams *hp, const gguf_file *g)
{
    gguf_str arch_s;
    TD_TRY(err_wrap(gguf_get_str(g, "general.architecture", &arch_s), "model metadata"));
    const char *arch;
    if (gguf_str_eq(arch_s, "qwen35")) {
        hp->arch = TGT_ARCH_QWEN35;
        arch = "qwen35";
    } else if (gguf_str_eq(arch_s, "qwen3")) {
        hp->arch = TGT_ARCH_QWEN3;
        arch = "qwen3";
    } else {
        return err_set(TD_ENOTSUP, "architecture '%.*s' is not supported (qwen35 or qwen3)",
                       (int)(arch_s.len > 64 ? 64 : arch_s.len), arch_s.ptr);
    }
    int64_t n_block, n_nextn;
    TD_TRY(tgt_key_i64(g, arch, "embedding_length", -1, &hp->n_embd));
    TD_TRY(tgt_key_i64(g, arch, "feed_forward_length", -1, &hp->n_ff));
    TD_TRY(tgt_key_i64(g, arch, "block_count", -1, &n_block));
    TD_TRY(tgt_key_i64(g, arch, "nextn_predict_layers", 0, &n_nextn));
    TD_TRY(tgt_key_i64(g, arch, "context_length", 0, &hp->n_ctx_train));
    TD_TRY(tgt_key_i64(g, arch, "attention.head_count", -1, &hp->n_head));
    TD_TRY(tgt_key_i64(g, arch, "attention.head_count_kv", hp->n_head, &hp->n_head_kv));
    int64_t def_head_dim = hp->n_head > 0 ? hp->n_embd / hp->n_head : 0;
    TD_TRY(tgt_key_i64(g, arch, "attention.key_length", def_head_dim, &hp->head_dim));
    TD_TRY(tgt_key_i64(g, arch, "rope.dimension_count", hp->head_dim, &hp->n_rot));
    TD_TRY(tgt_key_f32(g, arch, "attention.layer_norm_rms_epsilon", 0, true, &hp->eps));
    TD_TRY(tgt_key_f32(g, arch, "rope.freq_base", 10000.0f, false, &hp->rope_theta));
    if (n_nextn >= n_block)
        return err_set(TD_EFORMAT, "%s.nextn_predict_layers (%lld) leaves no main layers of %lld",
                       arch, (long long)n_nextn, (long long)n_block);
    hp->n_layer = n_block - n_nextn;
    if (hp->n_embd <= 0 || hp->n_ff <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->head_dim <= 0 || hp->n_layer <= 0)
        return err_set(TD_EFORMAT, "%s: a model dimension is zero", arch);
    if (hp->n_head % hp->n_head_kv)
        return err_set(TD_EFORMAT, "%s: %lld query heads are not a multiple of %lld kv heads",
                       arch, (long long)hp->n_head, (long long)hp->n_head_kv);
    if (hp->n_rot < 2 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return err_set(TD_EFORMAT, "%s.rope.dimension_count %lld does not fit head_dim %lld",
                       arch, (long long)hp->n_rot, (long long)hp->head_dim);
    if (!(hp->eps > 0.0f) || !(hp->rope_theta > 0.0f))
        return err_set(TD_EFORMAT, "%s: rms eps and rope base must be positive", arch);

    if (hp->arch == TGT_ARCH_QWEN3) {
        hp->attn_gate = false;
        hp->full_attn_interval = 1;
        return TD_OK;
    }
    hp->attn_gate = true;
    int64_t inner;
    TD_TRY(tgt_key_i64(g, arch, "full_attention_interval", 4, &hp->full_attn_interval));
    TD_TRY(tgt_key_i64(g, arch, "ssm.conv_kernel", -1, &hp->conv_k));
    TD_TRY(tgt_key_i64(g, arch, "ssm.state_size", -1, &hp->d_k));
    TD_TRY(tgt_key_i64(g, arch, "ssm.group_count", -1, &hp->n_k_head));
    TD_TRY(tgt_key_i64(g, arch, "ssm.time_step_rank", -1, &hp->n_v_head));
    TD_TRY(tgt_key_i64(g, arch, "ssm.inner_size", -1, &inner));
    if (hp->full_attn_interval <= 0 || hp->conv_k < 2 || hp->d_k <= 0 || hp->n_k_head <= 0 ||
        hp->n_v_head <= 0 || inner <= 0 || inner % hp->n_v_head || hp->n_v_head % hp->n_k_head)
        return err_set(TD_EFORMAT, "qwen35: inconsistent ssm.* metadata (conv %lld, state %lld, "
                       "groups %lld, value heads %lld, inner %lld)", (long long)hp->conv_k,
                       (long long)hp->d_k, (long long)hp->n_k_head, (long long)hp->n_v_head,
                       (long long)inner);
    hp->d_v = inner / hp->n_v_head;
    hp->conv_ch = 2 * hp->n_k_head * hp->d_k + hp->n_v_head * hp->d_v;
    return TD_OK;
}

/* Per-load scratch: where f32 copies of small F16/BF16 vectors go. */
typedef struct tgt_loader {
    tgt_model *m;
    size_t owned_used, owned_cap; /* floats */
} tgt_loader;

static const gguf_tensor *tgt_find(const tgt_model *m, const char *name, int64_t ne0,
                                   int64_t ne1, td_err *e)
{
    const gguf_tensor *t = gguf_find_tensor(m->file, name);
    if (!t) {
        *e = err_set(TD_EFORMAT, "tensor %s is missing", name);
        return NULL;
    }
    int64_t want[2] = {ne0, ne1};
    int64_t rows = 1;
    for (uint32_t d = 1; d < t->n_dims; d++)
        rows *= t->ne[d];
    int64_t got[2] = {t->ne[0], rows};
    if (got[0] != want[0] || got[1] != want[1]) {
        *e = err_set(TD_EFORMAT, "tensor %s has shape [%lld, %lld], expected [%lld, %lld]", name,
                     (long long)got[0], (long long)got[1], (long long)want[0],
                     (long long)want[1]);
        return NULL;
    }
    *e = TD_OK;
    return t;
}

static td_err tgt_matrix(tgt_loader *ld, ops_weight *w, const char *name, int64_t cols,
                         int64_t rows)
{
    td_err e;
    const gguf_tensor *t = tgt_find(ld->m, name, cols, rows, &e);
    if (!t)
        return e;
    e = ops_weight_init(w, t->type, rows, cols, t->data);
    return e == TD_OK ? TD_OK : err_wrap(e, "tensor %s", name);
}

/* A small vector (norm weights, ssm_a, dt bias, conv taps) as f32: points into the file when
 * it is F32 there, else converted into the model's owned buffer. */
static td_err tgt_vector(tgt_loader *ld, const float **out, const char *name, int64_t ne0,
                         int64_t ne1)
{
    td_err e;
    const gguf_tensor *t = tgt_find(ld->m, name, ne0, ne1, &e);
    if (!t)
        return e;
    int64_t n = ne0 * ne1;
    if (t->type == TD_F32) {
        *out = t->data;
        return TD_OK;
    }
    if (ld->owned_used + (size_t)n > ld->owned_cap)
        return err_set(TD_EFORMAT, "tensor %s: too many non-F32 vectors", name);
    float *dst = ld->m->owned + ld->owned_used;
    e = cpu_dequantize_row(t->type, t->data, dst, n);
    if (e != TD_OK)
        return err_wrap(e, "tensor %s", name);
    ld->owned_used += (size_t)n;
    *out = dst;
    return TD_OK;
}

static td_err tgt_layer_load(tgt_loader *ld, int64_t il)
{
    const tgt_hparams *hp = &ld->m->hp;
    tgt_layer *L = &ld->m->layers[il];
    char n[128];
#define TGT_NAME(suffix) (snprintf(n, sizeof n, "blk.%lld." suffix, (long long)il), n)
    TD_TRY(tgt_vector(ld, &L->attn_norm, TGT_NAME("attn_norm.weight"), hp->n_embd, 1));
    TD_TRY(tgt_vector(ld, &L->ffn_norm,
                      hp->arch == TGT_ARCH_QWEN35 ? TGT_NAME("post_attention_norm.weight")
                                                  : TGT_NAME("ffn_norm.weight"),
                      hp->n_embd, 1));
    TD_TRY(tgt_matrix(ld, &L->ffn_gate, TGT_NAME("ffn_gate.weight"), hp->n_embd, hp->n_ff));
    TD_TRY(tgt_matrix(ld, &L->ffn_up, TGT_NAME("ffn_up.weight"), hp->n_embd, hp->n_ff));
    TD_TRY(tgt_matrix(ld, &L->ffn_down, TGT_NAME("ffn_down.weight"), hp->n_ff, hp->n_embd));

    if (L->kind == TGT_LAYER_ATTN) {
        int64_t q_rows = hp->n_head * hp->head_dim * (hp->attn_gate ? 2 : 1);
        int64_t kv_rows = hp->n_head_kv * hp->head_dim;
        TD_TRY(tgt_matrix(ld, &L->wq, TGT_NAME("attn_q.weight"), hp->n_embd, q_rows));
        TD_TRY(tgt_matrix(ld, &L->wk, TGT_NAME("attn_k.weight"), hp->n_embd, kv_rows));
        TD_TRY(tgt_matrix(ld, &L->wv, TGT_NAME("attn_v.weight"), hp->n_embd, kv_rows));
        TD_TRY(tgt_matrix(ld, &L->wo, TGT_NAME("attn_output.weight"),
                          hp->n_head * hp->head_dim, hp->n_embd));
        TD_TRY(tgt_vector(ld, &L->q_norm, TGT_NAME("attn_q_norm.weight"), hp->head_dim, 1));
        TD_TRY(tgt_vector(ld, &L->k_norm, TGT_NAME("attn_k_norm.weight"), hp->head_dim, 1));
        return TD_OK;
    }
    int64_t inner = hp->n_v_head * hp->d_v;
    TD_TRY(tgt_matrix(ld, &L->wqkv, TGT_NAME("attn_qkv.weight"), hp->n_embd, hp->conv_ch));
    TD_TRY(tgt_matrix(ld, &L->wz, TGT_NAME("attn_gate.weight"), hp->n_embd, inner));
    TD_TRY(tgt_matrix(ld, &L->walpha, TGT_NAME("ssm_alpha.weight"), hp->n_embd, hp->n_v_head));
    TD_TRY(tgt_matrix(ld, &L->wbeta, TGT_NAME("ssm_beta.weight"), hp->n_embd, hp->n_v_head));
    TD_TRY(tgt_matrix(ld, &L->wssm_out, TGT_NAME("ssm_out.weight"), inner, hp->n_embd));
    TD_TRY(tgt_vector(ld, &L->conv_w, TGT_NAME("ssm_conv1d.weight"), hp->conv_k, hp->conv_ch));
    TD_TRY(tgt_vector(ld, &L->ssm_a, TGT_NAME("ssm_a"), hp->n_v_head, 1));
    TD_TRY(tgt_vector(ld, &L->dt_bias, TGT_NAME("ssm_dt.bias"), hp->n_v_head, 1));
    TD_TRY(tgt_vector(ld, &L->ssm_norm, TGT_NAME("ssm_norm.weight"), hp->d_v, 1));
#undef TGT_NAME
    return TD_OK;
}

/* Upper bound of the floats needed for f32 copies of non-F32 small vectors. */
static size_t tgt_owned_bound(const tgt_hparams *hp)
{
    size_t per_layer = (size_t)(2 * hp->n_embd + 2 * hp->head_dim);
    if (hp->arch == TGT_ARCH_QWEN35)
        per_layer += (size_t)(hp->conv_ch * hp->conv_k + 2 * hp->n_v_head + hp->d_v);
    return per_layer * (size_t)hp->n_layer + (size_t)hp->n_embd;
}

td_err tgt_load_gguf(tgt_model **out, gguf_file *file)
{
    *out = NULL;
    tgt_model *m = calloc(1, sizeof *m);
    if (!m)
        return err_set(TD_ENOMEM, "out of memory loading the model");
    m->file = file;
    m->be = ops_backend_cpu();
    m->kv_type = TD_F32;
    td_err e = tgt_work_init(m);
    if (e == TD_OK)
        e = tgt_hparams_read(&m->hp, file);
    const tgt_hparams *hp = &m->hp;
    tgt_loader ld = {.m = m};
    if (e == TD_OK) {
        ld.owned_cap = tgt_owned_bound(hp);
        m->owned = malloc(ld.owned_cap * sizeof(float));
        m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
        if (!m->owned || !m->layers)
            e = err_set(TD_ENOMEM, "out of memory loading the model");
    }
    if (e == TD_OK) {
        const gguf_tensor *te = gguf_find_tensor(file, "token_embd.weight");
        if (!te)
            e = err_set(TD_EFORMAT, "tensor token_embd.weight is missing");
        else
            m->hp.n_vocab = te->n_dims >= 2 ? te->ne[1] : 0;
    }
    if (e == TD_OK)
        e = tgt_matrix(&ld, &m->tok_embd, "token_embd.weight", hp->n_embd, hp->n_vocab);
    if (e == TD_OK)
        e = tgt_vector(&ld, &m->output_norm, "output_norm.weight", hp->n_embd, 1);
    if (e == TD_OK) {
        if (gguf_find_tensor(file, "output.weight"))
            e = tgt_matrix(&ld, &m->output, "output.weight", hp->n_embd, hp->n_vocab);
        else
            m->output = m->tok_embd;
    }
    for (int64_t il = 0; e == TD_OK && il < hp->n_layer; il++) {
        bool attn = hp->arch == TGT_ARCH_QWEN3 || (il + 1) % hp->full_attn_interval == 0;
        m->layers[il].kind = attn ? TGT_LAYER_ATTN : TGT_LAYER_DELTA;
        if (attn)
            m->n_attn_layers++;
        else
            m->n_delta_layers++;
        e = tgt_layer_load(&ld, il);
    }
    if (e != TD_OK) {
        m->file = NULL; /* the caller keeps the file on failure */
        tgt_free(m);
        return e;
    }
    *out = m;
    return TD_OK;
}

td_err tgt_load(tgt_model **out, const char *path)
{
    gguf_file *g;
    *out = NULL;
    td_err e = gguf_open(&g, path);
    if (e != TD_OK)
        return err_wrap(e, "loading %s", path);
    e = tgt_load_gguf(out, g);
    if (e != TD_OK) {
        gguf_close(g);
        return err_wrap(e, "loading %s", path);
    }
    return TD_OK;
}

/* --- placement on a backend ------------------------------------------------------------- */

/* Calls fn for every weight pointer of the model with its size in bytes, but token_embd
 * with skip_embd and the output matrix with skip_output (a tied one is token_embd, an
 * other one placed in caller memory). */
typedef td_err (*tgt_visit_fn)(void *ctx, const void **data, size_t bytes);

static td_err tgt_visit(tgt_model *m, bool skip_embd, bool skip_output, tgt_visit_fn fn,
                        void *ctx)
{
    const tgt_hparams *hp = &m->hp;
    size_t f = sizeof(float), D = (size_t)hp->n_embd;
#define TGT_W(w) TD_TRY(fn(ctx, &(w).data, (size_t)(w).rows * (w).row_bytes))
#define TGT_V(v, n) TD_TRY(fn(ctx, (const void **)&(v), (size_t)(n) * f))
    if (!skip_embd)
        TGT_W(m->tok_embd);
    if (!skip_output)
        TGT_W(m->output);
    TGT_V(m->output_norm, D);
    for (int64_t il = 0; il < hp->n_layer; il++) {
        tgt_layer *L = &m->layers[il];
        TGT_V(L->attn_norm, D);
        TGT_V(L->ffn_norm, D);
        TGT_W(L->ffn_gate);
        TGT_W(L->ffn_up);
        TGT_W(L->ffn_down);
        if (L->kind == TGT_LAYER_ATTN) {
            TGT_W(L->wq);
            TGT_W(L->wk);
            TGT_W(L->wv);
            TGT_W(L->wo);
            TGT_V(L->q_norm, hp->head_dim);
            TGT_V(L->k_norm, hp->head_dim);
            continue;
        }
        TGT_W(L->wqkv);
        TGT_W(L->wz);
        TGT_W(L->walpha);
        TGT_W(L->wbeta);
        TGT_W(L->wssm_out);
        TGT_V(L->conv_w, hp->conv_ch * hp->conv_k);
        TGT_V(L->ssm_a, hp->n_v_head);
        TGT_V(L->dt_bias, hp->n_v_head);
        TGT_V(L->ssm_norm, hp->d_v);
    }
#undef TGT_W
#undef TGT_V
    return TD_OK;
}

#define TGT_ALIGN 256 /* bytes: every weight starts on a 256-byte boundary of the arena */

static td_err tgt_count(void *ctx, const void **data, size_t bytes)
{
    (void)data;
    size_t *total = ctx;
    *total += (bytes + TGT_ALIGN - 1) / TGT_ALIGN * TGT_ALIGN;
    return TD_OK;
}

typedef struct tgt_placer {
    const ops_backend *be;
    uint8_t *arena;  /* backend memory */
    size_t at;       /* bytes used */
} tgt_placer;

static td_err tgt_place_one(void *ctx, const void **data, size_t bytes)
{
    tgt_placer *p = ctx;
    uint8_t *dst = p->arena + p->at;
    TD_TRY(p->be->to_device(p->be, dst, *data, bytes));
    *data = dst;
    p->at += (bytes + TGT_ALIGN - 1) / TGT_ALIGN * TGT_ALIGN;
    return TD_OK;
}

/* Copies every weight into backend memory and points the model at it: the token embedding
 * and LM head into the memory hook gives for them, everything else into one arena. */
static td_err tgt_place(tgt_model *m, const ops_backend *be, const tgt_place_hook *hook)
{
    static const char *const names[2] = {"token_embd.weight", "output.weight"};
    ops_weight *heads[2] = {&m->tok_embd, &m->output};
    bool tied = m->output.data == m->tok_embd.data;
    int n_heads = tied ? 1 : 2;
    void *given[2] = {NULL, NULL}; /* the hook's memory; the caller's to free */
    for (int i = 0; hook && i < n_heads; i++) {
        size_t bytes = (size_t)heads[i]->rows * heads[i]->row_bytes;
        TD_TRY(err_wrap(hook->mem(hook->ctx, names[i], bytes, &given[i]),
                        "memory for %s (%zu bytes)", names[i], bytes));
        TD_ASSERT((uintptr_t)given[i] % TGT_ALIGN == 0); /* as every weight of the arena */
    }
    bool skip_embd = given[0] != NULL, skip_output = tied || given[1] != NULL;
    size_t total = 0;
    TD_TRY(tgt_visit(m, skip_embd, skip_output, tgt_count, &total));
    tgt_placer p = {.be = be};
    TD_TRY(err_wrap(be->alloc(be, (void **)&p.arena, total), "model weights (%zu bytes)", total));
    td_err e = tgt_visit(m, skip_embd, skip_output, tgt_place_one, &p);
    size_t placed = 0;
    for (int i = 0; e == TD_OK && i < n_heads; i++) {
        if (!given[i])
            continue;
        size_t bytes = (size_t)heads[i]->rows * heads[i]->row_bytes;
        e = be->to_device(be, given[i], heads[i]->data, bytes);
        heads[i]->data = given[i];
        placed += bytes;
    }
    if (e == TD_OK)
        e = be->sync(be);
    if (e != TD_OK) {
        be->release(be, p.arena);
        return e;
    }
    if (tied)
        m->output.data = m->tok_embd.data;
    m->dev_arena = p.arena;
    m->arena_bytes = total;
    m->placed_bytes = placed;
    m->be = be;
    m->kv_type = TD_F16;
    return tgt_graphs_init(m);
}

td_err tgt_load_on(tgt_model **out, const char *path, const ops_backend *be)
{
    return tgt_load_placed(out, path, be, NULL);
}

td_err tgt_load_placed(tgt_model **out, const char *path, const ops_backend *be,
                       const tgt_place_hook *hook)
{
    TD_TRY(tgt_load(out, path));
    if (be->kind == OPS_BACKEND_CPU) {
        (*out)->be = be; /* host memory either way; a profiler over the CPU stays in the path */
        return TD_OK;
    }
    td_err e = tgt_place(*out, be, hook);
    if (e != TD_OK) {
        tgt_free(*out);
        *out = NULL;
        return err_wrap(e, "placing %s on %s", path, be->name);
    }
    return TD_OK;
}

void tgt_free(tgt_model *m)
{
    if (!m)
        return;
    tgt_graphs_free(m);
    tgt_work_free(m);
    if (m->dev_arena)
        m->be->release(m->be, m->dev_arena);
    if (m->file)
        gguf_close(m->file);
    free(m->layers);
    free(m->owned);
    free(m);
}
