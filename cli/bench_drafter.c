/* The synthetic DFlash drafter of `tandem bench`: config.json as the z-lab checkpoints write it
 * and model.safetensors with random bf16 weights (unit-variance outputs for unit-variance
 * inputs, norm weights 1). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_model.h"
#include "common/safetensors.h"
#include "kernels/ops.h"

static td_err bd_config_write(const char *path, const bmodel_drafter *d)
{
    json_t *c = json_object(), *taps = json_array(), *types = json_array(), *dc = json_object();
    json_t *arch = json_array();
    if (!c || !taps || !types || !dc || !arch) {
        json_decref(c), json_decref(taps), json_decref(types), json_decref(dc), json_decref(arch);
        return err_set(TD_ENOMEM, "out of memory");
    }
    json_array_append_new(arch, json_string("DFlashDraftModel"));
    json_object_set_new(c, "architectures", arch);
    json_object_set_new(c, "model_type", json_string("qwen3"));
    json_object_set_new(c, "dtype", json_string("bfloat16"));
    json_object_set_new(c, "attention_bias", json_false());
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "hidden_size", json_integer(d->hidden));
    json_object_set_new(c, "intermediate_size", json_integer(d->ffn));
    json_object_set_new(c, "num_hidden_layers", json_integer(d->n_layer));
    json_object_set_new(c, "num_attention_heads", json_integer(d->n_head));
    json_object_set_new(c, "num_key_value_heads", json_integer(d->n_head_kv));
    json_object_set_new(c, "head_dim", json_integer(d->head_dim));
    json_object_set_new(c, "num_target_layers", json_integer(d->n_target_layers));
    json_object_set_new(c, "max_position_embeddings", json_integer(262144));
    json_object_set_new(c, "rms_norm_eps", json_real(d->eps));
    json_object_set_new(c, "rope_theta", json_real(d->rope_theta));
    json_object_set_new(c, "rope_scaling", json_null());
    json_object_set_new(c, "sliding_window", json_null());
    json_object_set_new(c, "use_sliding_window", json_false());
    json_object_set_new(c, "max_window_layers", json_integer(d->n_layer));
    json_object_set_new(c, "tie_word_embeddings", json_false());
    json_object_set_new(c, "vocab_size", json_integer(d->vocab));
    json_object_set_new(c, "block_size", json_integer(d->block));
    for (int64_t i = 0; i < d->n_layer; i++)
        json_array_append_new(types, json_string("full_attention"));
    json_object_set_new(c, "layer_types", types);
    json_object_set_new(dc, "mask_token_id", json_integer(d->mask_token));
    for (int64_t i = 0; i < d->n_taps; i++)
        json_array_append_new(taps, json_integer(d->taps[i]));
    if (d->n_taps)
        json_object_set_new(dc, "target_layer_ids", taps);
    else
        json_decref(taps); /* the config's default rule picks them */
    json_object_set_new(c, "dflash_config", dc);
    int rc = json_dump_file(c, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(c);
    return rc == 0 ? TD_OK : err_set(TD_EIO, "%s: cannot write", path);
}

typedef struct bd_tensor {
    char name[96];
    uint64_t shape[2];  /* PyTorch order: [out, in], or [n] for vectors */
    uint32_t n_dims;
    bool ones;          /* norm weight */
    uint16_t *data;     /* [shape[0] * shape[1]] bf16 */
} bd_tensor;

static uint64_t bd_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Rows in parallel, each with its own stream (bytes independent of the thread count). */
static void bd_fill(bd_tensor *t, uint64_t seed)
{
    const int64_t rows = (int64_t)t->shape[0], cols = t->n_dims == 2 ? (int64_t)t->shape[1] : 1;
    if (t->ones) {
        uint16_t one = ops_f32_to_bf16(1.0f);
        for (int64_t i = 0; i < rows * cols; i++)
            t->data[i] = one;
        return;
    }
    const float amp = sqrtf(3.0f / (float)cols);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        uint64_t st = bd_mix(seed ^ bd_mix((uint64_t)r));
        for (int64_t c = 0; c < cols; c++) {
            st ^= st >> 12, st ^= st << 25, st ^= st >> 27;
            float u = (float)((st * 0x2545f4914f6cdd1dull) >> 40) * (1.0f / 16777216.0f);
            t->data[r * cols + c] = ops_f32_to_bf16(amp * (2.0f * u - 1.0f));
        }
    }
}

td_err bmodel_drafter_write(const char *dir, const bmodel_drafter *d, uint64_t seed)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    TD_TRY(bd_config_write(path, d));

    const uint64_t h = (uint64_t)d->hidden, f = (uint64_t)d->ffn, hd = (uint64_t)d->head_dim;
    const uint64_t q = (uint64_t)d->n_head * hd, kv = (uint64_t)d->n_head_kv * hd;
    const uint64_t taps = (uint64_t)(d->n_taps ? d->n_taps : d->n_layer); /* default: one per layer */
    size_t n = 3 + 11 * (size_t)d->n_layer;
    bd_tensor *t = calloc(n, sizeof *t);
    st_entry *ent = calloc(n, sizeof *ent);
    if (!t || !ent) {
        free(t), free(ent);
        return err_set(TD_ENOMEM, "out of memory");
    }
    size_t k = 0;
#define BD_T(is_ones, d0, d1, ...)                                                         \
    do {                                                                                   \
        snprintf(t[k].name, sizeof t[k].name, __VA_ARGS__);                                \
        t[k].shape[0] = (d0), t[k].shape[1] = (d1), t[k].n_dims = (d1) != 0 ? 2 : 1;           \
        t[k++].ones = (is_ones);                                                           \
    } while (0)
    BD_T(false, h, taps * h, "fc.weight");
    BD_T(true, h, 0, "hidden_norm.weight");
    BD_T(true, h, 0, "norm.weight");
    for (int64_t l = 0; l < d->n_layer; l++) {
        BD_T(true, h, 0, "layers.%lld.input_layernorm.weight", (long long)l);
        BD_T(true, h, 0, "layers.%lld.post_attention_layernorm.weight", (long long)l);
        BD_T(false, q, h, "layers.%lld.self_attn.q_proj.weight", (long long)l);
        BD_T(false, kv, h, "layers.%lld.self_attn.k_proj.weight", (long long)l);
        BD_T(false, kv, h, "layers.%lld.self_attn.v_proj.weight", (long long)l);
        BD_T(false, h, q, "layers.%lld.self_attn.o_proj.weight", (long long)l);
        BD_T(true, hd, 0, "layers.%lld.self_attn.q_norm.weight", (long long)l);
        BD_T(true, hd, 0, "layers.%lld.self_attn.k_norm.weight", (long long)l);
        BD_T(false, f, h, "layers.%lld.mlp.gate_proj.weight", (long long)l);
        BD_T(false, f, h, "layers.%lld.mlp.up_proj.weight", (long long)l);
        BD_T(false, h, f, "layers.%lld.mlp.down_proj.weight", (long long)l);
    }
#undef BD_T
    TD_ASSERT(k == n);
    td_err e = TD_OK;
    for (size_t i = 0; i < n && e == TD_OK; i++) {
        uint64_t elems = t[i].shape[0] * (t[i].n_dims == 2 ? t[i].shape[1] : 1);
        t[i].data = malloc(elems * 2);
        if (!t[i].data) {
            e = err_set(TD_ENOMEM, "out of memory for drafter tensor %s", t[i].name);
            break;
        }
        bd_fill(&t[i], bd_mix(seed + i));
        ent[i] = (st_entry){.name = t[i].name, .dtype = ST_BF16, .n_dims = t[i].n_dims,
                            .shape = t[i].shape, .data = t[i].data, .bytes = elems * 2};
    }
    if (e == TD_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        e = st_write(path, ent, n, NULL, 0);
    }
    for (size_t i = 0; i < n; i++)
        free(t[i].data);
    free(t);
    free(ent);
    return e == TD_OK ? TD_OK : err_wrap(e, "writing the drafter into %s", dir);
}
