/* Drafter checkpoints and scaled targets for tests (see model_fixture.h). */
#include "tests/support/model_fixture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "common/gguf.h"
#include "common/safetensors.h"
#include "kernels/ops.h"

typedef struct mf_writer {
    st_entry e[160];
    void *bufs[160];
    uint64_t *shapes[160];
    char *names[160];
    size_t n;
    uint64_t rng;
} mf_writer;

static float mf_uniform(mf_writer *w)
{
    w->rng = w->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((w->rng >> 40) & 0xffffff) / (float)0x1000000;
}

/* A bf16 tensor of uniform values in offset +- scale. */
static td_err mf_put(mf_writer *w, const char *name, const uint64_t *shape, uint32_t n_dims,
                     float scale, float offset)
{
    if (w->n == sizeof w->e / sizeof w->e[0])
        return err_set(TD_ERANGE, "too many tensors");
    uint64_t n = 1;
    for (uint32_t i = 0; i < n_dims; i++)
        n *= shape[i];
    uint16_t *b = malloc(n * sizeof *b);
    uint64_t *sh = malloc(n_dims * sizeof *sh);
    char *nm = strdup(name);
    if (!b || !sh || !nm) {
        free(b), free(sh), free(nm);
        return err_set(TD_ENOMEM, "out of memory");
    }
    for (uint64_t i = 0; i < n; i++)
        b[i] = ops_f32_to_bf16(offset + scale * (2.0f * mf_uniform(w) - 1.0f));
    memcpy(sh, shape, n_dims * sizeof *sh);
    w->bufs[w->n] = b;
    w->shapes[w->n] = sh;
    w->names[w->n] = nm;
    w->e[w->n] = (st_entry){nm, ST_BF16, n_dims, sh, b, n * 2};
    w->n++;
    return TD_OK;
}

td_err mf_drafter_write(const char *dir, const tgt_model *tm, const mf_drafter *ds, uint64_t seed)
{
    mkdir(dir, 0700);
    uint64_t H = (uint64_t)tm->hp.n_embd, nh = 4, nkv = 2, hd = 8, ff = 2 * H;
    uint32_t n_taps = (uint32_t)ds->n_layers;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return err_set(TD_EIO, "%s: cannot write", path);
    fprintf(f, "{\"architectures\": [\"DFlashDraftModel\"], \"model_type\": \"qwen3\", "
               "\"hidden_size\": %llu, \"intermediate_size\": %llu, \"num_attention_heads\": %llu, "
               "\"num_key_value_heads\": %llu, \"head_dim\": %llu, \"num_hidden_layers\": %d, "
               "\"rms_norm_eps\": 1e-06, \"rope_theta\": 10000, \"vocab_size\": %lld, "
               "\"block_size\": %d, \"num_target_layers\": %lld, \"use_sliding_window\": %s, "
               "\"sliding_window\": 4, \"layer_types\": [",
            (unsigned long long)H, (unsigned long long)ff, (unsigned long long)nh,
            (unsigned long long)nkv, (unsigned long long)hd, ds->n_layers,
            (long long)tm->hp.n_vocab, ds->block, (long long)tm->hp.n_layer,
            ds->sliding ? "true" : "false");
    for (int i = 0; i < ds->n_layers; i++)
        fprintf(f, "%s\"%s\"", i ? ", " : "",
                ds->sliding && i == 0 ? "sliding_attention" : "full_attention");
    fprintf(f, "], \"dflash_config\": {\"mask_token_id\": %u}}\n", ds->mask_id);
    fclose(f);

    mf_writer *w = calloc(1, sizeof *w);
    if (!w)
        return err_set(TD_ENOMEM, "out of memory");
    w->rng = seed;
    float keep = ds->silent ? 0.0f : 1.0f;
    char name[128];
    td_err e = TD_OK;
#define PUT(nm, sc, off, ...)                                                                \
    do {                                                                                     \
        const uint64_t shape_[] = {__VA_ARGS__};                                             \
        if (e == TD_OK)                                                                      \
            e = mf_put(w, nm, shape_, sizeof shape_ / sizeof shape_[0], sc, off);            \
    } while (0)
    PUT("fc.weight", 0.3f, 0, H, n_taps * H);
    PUT("hidden_norm.weight", 0.2f, 1, H);
    PUT("norm.weight", ds->silent ? 0 : 0.2f, 1, H);
    for (int l = 0; l < ds->n_layers; l++) {
#define LNAME(s) (snprintf(name, sizeof name, "layers.%d." s, l), name)
        PUT(LNAME("input_layernorm.weight"), 0.2f, 1, H);
        PUT(LNAME("post_attention_layernorm.weight"), 0.2f, 1, H);
        PUT(LNAME("self_attn.q_proj.weight"), 0.4f, 0, nh * hd, H);
        PUT(LNAME("self_attn.k_proj.weight"), 0.4f, 0, nkv * hd, H);
        PUT(LNAME("self_attn.v_proj.weight"), 0.4f, 0, nkv * hd, H);
        PUT(LNAME("self_attn.o_proj.weight"), 0.4f * keep, 0, H, nh * hd);
        PUT(LNAME("self_attn.q_norm.weight"), 0.2f, 1, hd);
        PUT(LNAME("self_attn.k_norm.weight"), 0.2f, 1, hd);
        PUT(LNAME("mlp.gate_proj.weight"), 0.4f, 0, ff, H);
        PUT(LNAME("mlp.up_proj.weight"), 0.4f, 0, ff, H);
        PUT(LNAME("mlp.down_proj.weight"), 0.4f * keep, 0, H, ff);
#undef LNAME
    }
#undef PUT
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (e == TD_OK)
        e = st_write(path, w->e, w->n, NULL, 0);
    for (size_t i = 0; i < w->n; i++) {
        free(w->bufs[i]);
        free(w->shapes[i]);
        free(w->names[i]);
    }
    free(w);
    return e;
}

td_err mf_target_write_scaled(const char *path, const char *src, int32_t x, float s)
{
    gguf_file *g;
    TD_TRY(gguf_open(&g, src));
    gguf_writer *w = gguf_writer_new();
    td_err e = TD_OK;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        if (kv->value.type == GGUF_TYPE_STRING) {
            char *v = strndup(kv->value.str.ptr, kv->value.str.len);
            gguf_writer_set_str(w, key, v ? v : "");
            free(v);
        } else if (kv->value.type == GGUF_TYPE_UINT32) {
            gguf_writer_set_u32(w, key, (uint32_t)kv->value.u64);
        } else if (kv->value.type == GGUF_TYPE_FLOAT32) {
            gguf_writer_set_f32(w, key, (float)kv->value.f64);
        } /* the tokenizer is not needed: the copy stops on stop ids only */
    }
    const gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    if (!emb || emb->type != TD_F32) {
        gguf_writer_free(w);
        gguf_close(g);
        return err_set(TD_EFORMAT, "%s: needs an f32 token_embd", src);
    }
    const float *ex = (const float *)emb->data + x * emb->ne[0];
    for (uint64_t i = 0; e == TD_OK && i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        bool scaled = !strcmp(t->name, "token_embd.weight") || !strcmp(t->name, "output.weight");
        float *copy = NULL;
        const void *data = t->data;
        if (scaled && t->type == TD_F32) {
            copy = malloc(t->size);
            if (!copy) {
                e = err_set(TD_ENOMEM, "out of memory");
                break;
            }
            memcpy(copy, t->data, t->size);
            for (int64_t c = 0; c < t->ne[0]; c++)
                copy[x * t->ne[0] + c] = s * ex[c];
            data = copy;
        }
        e = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, data, t->size);
        free(copy);
    }
    if (e == TD_OK)
        e = gguf_writer_write(w, path);
    gguf_writer_free(w);
    gguf_close(g);
    return e;
}

td_err mf_drafter_make(dfl_model **out, const char *dir, const tgt_model *tm,
                       const mf_drafter *ds, uint64_t seed)
{
    TD_TRY(mf_drafter_write(dir, tm, ds, seed));
    return dfl_load(out, dir, (uint32_t)tm->hp.n_layer, &tm->tok_embd, &tm->output);
}

dfl_model *mf_drafter_in(const char *root, const char *name, const tgt_model *tm,
                         const mf_drafter *ds, uint64_t seed)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    dfl_model *dm = NULL;
    if (mf_drafter_make(&dm, dir, tm, ds, seed) != TD_OK)
        fail_msg("%s: %s", dir, err_msg());
    return dm;
}

td_err mf_spec_run(spec_seq *s, const int32_t *prompt, int64_t n_prompt, int64_t n, int32_t *out)
{
    TD_TRY(spec_prefill(s, prompt, n_prompt, &out[0]));
    int32_t step[SPEC_MAX_BLOCK];
    for (int64_t got = 1; got < n;) {
        int64_t k = 0;
        TD_TRY(spec_step(s, step, &k));
        if (k < 1 || k > s->block)
            return err_set(TD_EINVAL, "a step emitted %lld tokens with a block of %lld",
                           (long long)k, (long long)s->block);
        for (int64_t i = 0; i < k && got < n; i++)
            out[got++] = step[i];
    }
    return TD_OK;
}

td_err mf_generate(const tgt_model *tm, const spec_cfg *cfg, const int32_t *prompt,
                   int64_t n_prompt, int64_t n, int32_t *out, spec_stats *stats)
{
    spec_seq s;
    TD_TRY(spec_init_cfg(&s, tm, cfg));
    td_err e = mf_spec_run(&s, prompt, n_prompt, n, out);
    if (stats)
        *stats = s.stats;
    spec_free(&s);
    return e;
}

/* The first n rows of a block alone against the whole block's logits want [nl] (host). */
static void dflash_rows_check(dfl_model *dm, dfl_state *ds, const float *want, int64_t nl)
{
    const ops_backend *be = dm->be;
    const int64_t B = dm->cfg.block_size, V = nl / (B - 1);
    uint8_t *got = malloc((size_t)nl * sizeof(float));
    float *dpart = NULL;
    assert_non_null(got);
    assert_int_equal(be->alloc(be, (void **)&dpart, (size_t)nl * sizeof(float)), TD_OK);
    const int64_t rows[] = {1, 3, B - 2};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        const size_t part = (size_t)(rows[i] * V) * sizeof(float);
        memset(got, 0xa5, (size_t)nl * sizeof(float));
        assert_int_equal(be->to_device(be, dpart, got, (size_t)nl * sizeof(float)), TD_OK);
        assert_int_equal(dfl_propose(dm, ds, 279, rows[i], dpart), TD_OK);
        assert_int_equal(be->to_host(be, got, dpart, (size_t)nl * sizeof(float)), TD_OK);
        if (memcmp(got, want, part) != 0)
            fail_msg("%lld rows of a block: other logits than the whole block's",
                     (long long)rows[i]);
        for (size_t b = part; b < (size_t)nl * sizeof(float); b++)
            if (got[b] != 0xa5)
                fail_msg("%lld rows of a block: byte %zu past them written", (long long)rows[i],
                         b);
    }
    assert_int_equal(dfl_propose(dm, ds, 279, 0, dpart), TD_EINVAL);
    assert_int_equal(dfl_propose(dm, ds, 279, B, dpart), TD_EINVAL);
    be->release(be, dpart);
    free(got);
}

void mf_dflash_ring_check(const tgt_model *tm, dfl_model *dm)
{
    const ops_backend *be = dm->be;
    const td_dtype kept = dm->kv_type;
    const int64_t n = 21, row = (int64_t)dm->cfg.n_taps * tm->hp.n_embd;
    const int64_t nl = (int64_t)(dm->cfg.block_size - 1) * tm->hp.n_vocab;
    float *feat = malloc((size_t)(n * row) * sizeof(float)), *dfeat = NULL, *dlogits = NULL;
    float *want = malloc((size_t)nl * sizeof(float)), *got = malloc((size_t)nl * sizeof(float));
    assert_non_null(feat);
    uint64_t x = 88172645463325252ull;
    for (int64_t i = 0; i < n * row; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        feat[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5);
    }
    assert_int_equal(ops_backend_upload(be, (void **)&dfeat, feat, (size_t)(n * row) * sizeof(float)),
                     TD_OK);
    assert_int_equal(be->alloc(be, (void **)&dlogits, (size_t)nl * sizeof(float)), TD_OK);
    for (int f16 = 0; f16 <= 1; f16++) {
        dm->kv_type = f16 ? TD_F16 : TD_F32;
        const int64_t pieces[] = {n, 3, 1};
        for (size_t k = 0; k < sizeof pieces / sizeof *pieces; k++) {
            dfl_state ds;
            assert_int_equal(dfl_state_init(&ds, dm, 8), TD_OK);
            for (int64_t at = 0; at < n; at += pieces[k]) {
                int64_t m = n - at < pieces[k] ? n - at : pieces[k];
                assert_int_equal(dfl_add_context(dm, &ds, dfeat + at * row, m), TD_OK);
            }
            assert_int_equal(ds.n_ctx, n);
            assert_int_equal(dfl_propose(dm, &ds, 279, dm->cfg.block_size - 1, dlogits), TD_OK);
            assert_int_equal(be->to_host(be, k ? got : want, dlogits, (size_t)nl * sizeof(float)),
                             TD_OK);
            if (k && memcmp(got, want, (size_t)nl * sizeof(float)) != 0)
                fail_msg("%s context in pieces of %lld: other logits than all at once",
                         f16 ? "f16" : "f32", (long long)pieces[k]);
            if (!k)
                dflash_rows_check(dm, &ds, want, nl);
            dfl_state_free(&ds);
        }
    }
    dm->kv_type = kept;
    be->release(be, dfeat);
    be->release(be, dlogits);
    free(want);
    free(got);
    free(feat);
}
