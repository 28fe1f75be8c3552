#include "common/dflash_config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* config.json of a drafter is a few KB; anything this large is not one. */
#define DFLASH_CONFIG_MAX_BYTES (16u << 20)

typedef struct cfg_src {
    json_t *root; /* the config object */
    json_t *dc;   /* its "dflash_config" object, or NULL */
} cfg_src;

/* The value of key: dflash_config's first, then the top level; NULL when absent or null. */
static json_t *cfg_get(const cfg_src *s, const char *key)
{
    json_t *v = s->dc ? json_object_get(s->dc, key) : NULL;
    if (v && !json_is_null(v))
        return v;
    v = json_object_get(s->root, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* Which object a key is read from, for messages. */
static const char *cfg_where(const cfg_src *s, const char *key)
{
    json_t *v = s->dc ? json_object_get(s->dc, key) : NULL;
    return v && !json_is_null(v) ? "dflash_config." : "";
}

/* An integer key in [lo, hi]. Absent: *out = def when !required, else TD_EFORMAT. */
static td_err cfg_u32(const cfg_src *s, const char *key, bool required, uint32_t def, int64_t lo,
                      int64_t hi, uint32_t *out)
{
    json_t *v = cfg_get(s, key);
    if (!v) {
        if (required)
            return err_set(TD_EFORMAT, "config.json: %s is missing", key);
        *out = def;
        return TD_OK;
    }
    if (!json_is_integer(v))
        return err_set(TD_EFORMAT, "config.json: %s%s is not an integer", cfg_where(s, key), key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return err_set(TD_ERANGE, "config.json: %s%s = %lld is outside [%lld, %lld]",
                       cfg_where(s, key), key, (long long)x, (long long)lo, (long long)hi);
    *out = (uint32_t)x;
    return TD_OK;
}

/* A finite number key (integer or real), absent -> def. */
static td_err cfg_f64(const cfg_src *s, const char *key, double def, double *out)
{
    json_t *v = cfg_get(s, key);
    if (!v) {
        *out = def;
        return TD_OK;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return err_set(TD_EFORMAT, "config.json: %s%s is not a number", cfg_where(s, key), key);
    *out = json_number_value(v);
    return TD_OK;
}

/* A boolean key: absent -> *present = false. */
static td_err cfg_bool(const cfg_src *s, const char *key, bool *present, bool *out)
{
    json_t *v = cfg_get(s, key);
    *present = v != NULL;
    if (!v)
        return TD_OK;
    if (!json_is_boolean(v))
        return err_set(TD_EFORMAT, "config.json: %s%s is not true or false", cfg_where(s, key), key);
    *out = json_is_true(v);
    return TD_OK;
}

/* Architecture keys that change the tensors or the math: refuse what is not implemented. */
static td_err cfg_check_arch(const cfg_src *s)
{
    json_t *arch = cfg_get(s, "architectures");
    if (arch) {
        if (!json_is_array(arch))
            return err_set(TD_EFORMAT, "config.json: architectures is not an array");
        bool found = false;
        const char *first = "";
        for (size_t i = 0; i < json_array_size(arch); i++) {
            json_t *a = json_array_get(arch, i);
            if (!json_is_string(a))
                return err_set(TD_EFORMAT, "config.json: architectures[%zu] is not a string", i);
            if (i == 0)
                first = json_string_value(a);
            found |= !strcmp(json_string_value(a), "DFlashDraftModel");
        }
        if (!found)
            return err_set(TD_ENOTSUP, "config.json: architectures [\"%.60s\"...] is not "
                           "DFlashDraftModel, the only drafter architecture implemented", first);
    }
    json_t *mt = cfg_get(s, "model_type");
    if (mt && (!json_is_string(mt) || strcmp(json_string_value(mt), "qwen3")))
        return err_set(TD_ENOTSUP, "config.json: model_type \"%.60s\" is not supported: DFlash "
                       "drafters are qwen3 blocks", json_is_string(mt) ? json_string_value(mt) : "?");
    json_t *act = cfg_get(s, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        return err_set(TD_ENOTSUP, "config.json: hidden_act \"%.60s\" is not supported (silu is)",
                       json_is_string(act) ? json_string_value(act) : "?");
    bool present, bias = false;
    TD_TRY(cfg_bool(s, "attention_bias", &present, &bias));
    if (bias)
        return err_set(TD_ENOTSUP, "config.json: attention_bias true is not supported: the "
                       "drafter's projections have no bias");
    return TD_OK;
}

/* One RoPE parameter object (transformers' rope_parameters / rope_scaling): only the default
 * (unscaled) RoPE over the full head is implemented. */
static td_err cfg_rope_one(json_t *rp, const char *what, double top_theta, double *theta)
{
    if (!json_is_object(rp))
        return err_set(TD_EFORMAT, "config.json: %s is not an object", what);
    json_t *type = json_object_get(rp, "rope_type");
    if (!type || json_is_null(type))
        type = json_object_get(rp, "type");
    if (type && !json_is_null(type)) {
        if (!json_is_string(type))
            return err_set(TD_EFORMAT, "config.json: %s.rope_type is not a string", what);
        if (strcmp(json_string_value(type), "default"))
            return err_set(TD_ENOTSUP, "config.json: %s asks for RoPE scaling \"%.40s\"; only the "
                           "default (unscaled) RoPE is implemented", what, json_string_value(type));
    }
    json_t *prf = json_object_get(rp, "partial_rotary_factor");
    if (prf && !json_is_null(prf) && (!json_is_number(prf) || json_number_value(prf) != 1.0))
        return err_set(TD_ENOTSUP, "config.json: %s.partial_rotary_factor other than 1 is not "
                       "supported", what);
    json_t *t = json_object_get(rp, "rope_theta");
    *theta = top_theta;
    if (t && !json_is_null(t)) {
        if (!json_is_number(t))
            return err_set(TD_EFORMAT, "config.json: %s.rope_theta is not a number", what);
        *theta = json_number_value(t);
    }
    return TD_OK;
}

/* RoPE base as transformers resolves it: rope_scaling when set, else rope_parameters (flat, or
 * nested per layer type); rope_theta inside it, else the top-level rope_theta, else 10000. */
static td_err cfg_rope(const cfg_src *s, double *theta)
{
    double top = 10000.0;
    TD_TRY(cfg_f64(s, "rope_theta", 10000.0, &top));
    const char *key = "rope_scaling";
    json_t *rp = cfg_get(s, key);
    if (!rp) {
        key = "rope_parameters";
        rp = cfg_get(s, key);
    }
    *theta = top;
    if (rp) {
        json_t *full = json_is_object(rp) ? json_object_get(rp, "full_attention") : NULL;
        json_t *slid = json_is_object(rp) ? json_object_get(rp, "sliding_attention") : NULL;
        if (json_is_object(full) || json_is_object(slid)) {
            double tf = top, ts = top;
            char what[64];
            if (full) {
                snprintf(what, sizeof what, "%s.full_attention", key);
                TD_TRY(cfg_rope_one(full, what, top, &tf));
            }
            if (slid) {
                snprintf(what, sizeof what, "%s.sliding_attention", key);
                TD_TRY(cfg_rope_one(slid, what, top, &ts));
            }
            if (full && slid && tf != ts)
                return err_set(TD_ENOTSUP, "config.json: %s gives full and sliding layers different "
                               "RoPE bases (%g, %g); one base is implemented", key, tf, ts);
            *theta = full ? tf : ts;
        } else {
            TD_TRY(cfg_rope_one(rp, key, top, theta));
        }
    }
    if (!isfinite(*theta) || *theta <= 1.0)
        return err_set(TD_ERANGE, "config.json: RoPE base %g must be a number above 1", *theta);
    return TD_OK;
}

static td_err cfg_taps(const cfg_src *s, dflash_config *cfg)
{
    json_t *ids = cfg_get(s, "target_layer_ids");
    if (!ids)
        return TD_OK;
    const char *w = cfg_where(s, "target_layer_ids");
    if (!json_is_array(ids))
        return err_set(TD_EFORMAT, "config.json: %starget_layer_ids is not an array", w);
    size_t n = json_array_size(ids);
    if (n == 0 || n > DFLASH_MAX_TAPS)
        return err_set(TD_ERANGE, "config.json: %starget_layer_ids has %zu entries, not 1..%d", w, n,
                       DFLASH_MAX_TAPS);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 65535)
            return err_set(TD_ERANGE, "config.json: %starget_layer_ids[%zu] is not a layer index in "
                           "[0, 65535]", w, i);
        cfg->target_layer_ids[i] = (uint32_t)json_integer_value(v);
    }
    cfg->n_taps = (uint32_t)n;
    cfg->taps_given = true;
    return TD_OK;
}

/* Per-layer masks, as the reference builds them from Qwen3Config. */
static td_err cfg_layers(const cfg_src *s, dflash_config *cfg)
{
    bool present, use_sw = false, causal_given, causal = false;
    TD_TRY(cfg_bool(s, "use_sliding_window", &present, &use_sw));
    TD_TRY(cfg_bool(s, "is_causal", &causal_given, &causal));

    /* transformers' default window is 4096 when the key is missing; an explicit null means none. */
    bool sw_null = json_is_null(json_object_get(s->root, "sliding_window")) ||
                   (s->dc && json_is_null(json_object_get(s->dc, "sliding_window")));
    uint32_t sw;
    TD_TRY(cfg_u32(s, "sliding_window", false, sw_null ? 0 : 4096, 1, INT32_MAX, &sw));
    if (!use_sw)
        sw = 0;
    cfg->sliding_window = sw;

    json_t *types = cfg_get(s, "layer_types");
    if (types) {
        if (!json_is_array(types))
            return err_set(TD_EFORMAT, "config.json: layer_types is not an array");
        if (json_array_size(types) != cfg->n_layers)
            return err_set(TD_EFORMAT, "config.json: layer_types has %zu entries for %u layers",
                           json_array_size(types), cfg->n_layers);
    }
    uint32_t max_window_layers;
    TD_TRY(cfg_u32(s, "max_window_layers", false, 28, 0, INT32_MAX, &max_window_layers));
    for (uint32_t i = 0; i < cfg->n_layers; i++) {
        dflash_layer *l = &cfg->layers[i];
        if (types) {
            json_t *t = json_array_get(types, i);
            if (!json_is_string(t))
                return err_set(TD_EFORMAT, "config.json: layer_types[%u] is not a string", i);
            const char *name = json_string_value(t);
            if (!strcmp(name, "sliding_attention"))
                l->sliding = true;
            else if (!strcmp(name, "full_attention"))
                l->sliding = false;
            else
                return err_set(TD_ENOTSUP, "config.json: layer_types[%u] = \"%.40s\" is not "
                               "supported (full_attention and sliding_attention are)", i, name);
        } else {
            l->sliding = sw && i >= max_window_layers;
        }
        l->window = l->sliding ? sw : 0;
        l->causal = causal_given ? causal : l->sliding;
    }
    return TD_OK;
}

static td_err cfg_parse_root(const cfg_src *s, dflash_config *cfg)
{
    TD_TRY(cfg_check_arch(s));
    TD_TRY(cfg_u32(s, "num_hidden_layers", true, 0, 1, DFLASH_MAX_LAYERS, &cfg->n_layers));
    TD_TRY(cfg_u32(s, "hidden_size", true, 0, 1, 1 << 16, &cfg->hidden));
    TD_TRY(cfg_u32(s, "intermediate_size", true, 0, 1, 1 << 20, &cfg->ffn));
    TD_TRY(cfg_u32(s, "num_attention_heads", true, 0, 1, 1024, &cfg->n_heads));
    TD_TRY(cfg_u32(s, "num_key_value_heads", false, cfg->n_heads, 1, cfg->n_heads, &cfg->n_kv_heads));
    if (cfg->n_heads % cfg->n_kv_heads)
        return err_set(TD_EFORMAT, "config.json: num_attention_heads %u is not a multiple of "
                       "num_key_value_heads %u", cfg->n_heads, cfg->n_kv_heads);
    TD_TRY(cfg_u32(s, "head_dim", false, cfg->hidden / cfg->n_heads, 1, 4096, &cfg->head_dim));
    if (cfg->head_dim < 2 || cfg->head_dim % 2)
        return err_set(TD_ERANGE, "config.json: head_dim %u is not even: RoPE rotates pairs",
                       cfg->head_dim);
    TD_TRY(cfg_u32(s, "vocab_size", true, 0, 1, 1 << 24, &cfg->vocab));
    TD_TRY(cfg_u32(s, "block_size", false, 16, 2, 1024, &cfg->block_size));
    TD_TRY(cfg_u32(s, "mask_token_id", true, 0, 0, (int64_t)cfg->vocab - 1, &cfg->mask_token_id));
    TD_TRY(cfg_f64(s, "rms_norm_eps", 1e-6, &cfg->rms_eps));
    if (!(cfg->rms_eps > 0 && cfg->rms_eps < 1))
        return err_set(TD_ERANGE, "config.json: rms_norm_eps %g is not in (0, 1)", cfg->rms_eps);
    TD_TRY(cfg_rope(s, &cfg->rope_theta));
    TD_TRY(cfg_taps(s, cfg));
    TD_TRY(cfg_u32(s, "num_target_layers", false, 0, 1, 65536, &cfg->n_target_layers));
    TD_TRY(cfg_layers(s, cfg));
    TD_TRY(cfg_f64(s, "input_embedding_scale", 1.0, &cfg->input_embedding_scale));
    TD_TRY(cfg_f64(s, "output_multiplier", 1.0, &cfg->output_multiplier));
    TD_TRY(cfg_f64(s, "final_logit_softcapping", 0.0, &cfg->final_logit_softcap));
    if (cfg->final_logit_softcap < 0)
        return err_set(TD_ERANGE, "config.json: final_logit_softcapping %g is negative",
                       cfg->final_logit_softcap);
    return TD_OK;
}

td_err dflash_config_parse(dflash_config *cfg, const char *json, size_t len)
{
    memset(cfg, 0, sizeof *cfg);
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root)
        return err_set(TD_EFORMAT, "config.json: invalid JSON at line %d column %d: %s", je.line,
                       je.column, je.text);
    td_err e = TD_OK;
    cfg_src s = {root, NULL};
    if (!json_is_object(root)) {
        e = err_set(TD_EFORMAT, "config.json: not a JSON object");
        goto done;
    }
    s.dc = json_object_get(root, "dflash_config");
    if (s.dc && json_is_null(s.dc))
        s.dc = NULL;
    if (s.dc && !json_is_object(s.dc)) {
        e = err_set(TD_EFORMAT, "config.json: dflash_config is not an object");
        goto done;
    }
    e = cfg_parse_root(&s, cfg);
done:
    json_decref(root);
    if (e != TD_OK)
        memset(cfg, 0, sizeof *cfg);
    return e;
}

td_err dflash_config_load(dflash_config *cfg, const char *path)
{
    memset(cfg, 0, sizeof *cfg);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return err_set(TD_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = malloc(DFLASH_CONFIG_MAX_BYTES + 1);
    if (!buf) {
        fclose(fp);
        return err_set(TD_ENOMEM, "%s: out of memory", path);
    }
    size_t n = fread(buf, 1, DFLASH_CONFIG_MAX_BYTES + 1, fp);
    bool failed = ferror(fp);
    fclose(fp);
    td_err e;
    if (failed)
        e = err_set(TD_EIO, "%s: read failed", path);
    else if (n > DFLASH_CONFIG_MAX_BYTES)
        e = err_set(TD_ERANGE, "%s: larger than %u bytes: not a config.json", path,
                    DFLASH_CONFIG_MAX_BYTES);
    else if ((e = dflash_config_parse(cfg, buf, n)) != TD_OK)
        err_wrap(e, "%s", path);
    free(buf);
    return e;
}

/* Python's round(num / den) for den > 0: nearest integer, ties to even. */
static int64_t round_half_even(int64_t num, int64_t den)
{
    int64_t q = num / den, r = num % den;
    if (r < 0) { /* floor division */
        q -= 1;
        r += den;
    }
    if (2 * r > den || (2 * r == den && (q & 1)))
        q += 1;
    return q;
}

td_err dflash_config_resolve(dflash_config *cfg, uint32_t n_target)
{
    TD_ASSERT(cfg->n_layers > 0);
    if (n_target == 0)
        return err_set(TD_EINVAL, "drafter: the target has no layers");
    if (cfg->n_target_layers && cfg->n_target_layers != n_target)
        return err_set(TD_EINVAL, "drafter: trained for a %u-layer target (num_target_layers) but "
                       "the target has %u layers", cfg->n_target_layers, n_target);
    if (!cfg->taps_given) {
        uint32_t n = cfg->n_layers;
        TD_ASSERT(n <= DFLASH_MAX_TAPS);
        for (uint32_t i = 0; i < n; i++) {
            /* round() applies to the whole 1 + i * span / (n - 1), ties included. */
            int64_t id = n == 1 ? n_target / 2
                                : round_half_even((int64_t)(n - 1) + (int64_t)i * ((int64_t)n_target - 4),
                                                  n - 1);
            if (id < 0 || id >= n_target)
                return err_set(TD_ERANGE, "drafter: default target_layer_ids[%u] = %lld is outside "
                               "the target's %u layers", i, (long long)id, n_target);
            cfg->target_layer_ids[i] = (uint32_t)id;
        }
        cfg->n_taps = n;
    }
    for (uint32_t i = 0; i < cfg->n_taps; i++)
        if (cfg->target_layer_ids[i] >= n_target)
            return err_set(TD_ERANGE, "drafter: target_layer_ids[%u] = %u is not a layer of the "
                           "%u-layer target", i, cfg->target_layer_ids[i], n_target);
    return TD_OK;
}

/* --- tensor check ------------------------------------------------------------------- */

static td_err check_one(const st_file *st, bool *seen, const char *name, uint32_t n_dims,
                        uint64_t d0, uint64_t d1)
{
    const st_tensor *t = st_find(st, name);
    if (!t)
        return err_set(TD_ENOENT, "drafter tensor \"%s\" is missing", name);
    seen[t - st->tensors] = true;
    uint64_t want[2] = {d0, d1};
    bool ok = t->n_dims == n_dims;
    for (uint32_t i = 0; ok && i < n_dims; i++)
        ok = t->shape[i] == want[i];
    if (!ok) {
        char got[160];
        size_t k = 0;
        for (uint32_t i = 0; i < t->n_dims && k < sizeof got - 24; i++)
            k += (size_t)snprintf(got + k, sizeof got - k, "%s%llu", i ? ", " : "",
                                  (unsigned long long)t->shape[i]);
        got[k] = '\0';
        if (n_dims == 1)
            return err_set(TD_EFORMAT, "drafter tensor \"%s\" has shape [%s]; the config implies "
                           "[%llu]", name, got, (unsigned long long)d0);
        return err_set(TD_EFORMAT, "drafter tensor \"%s\" has shape [%s]; the config implies "
                       "[%llu, %llu]", name, got, (unsigned long long)d0, (unsigned long long)d1);
    }
    td_dtype type;
    return st_tensor_type(t, &type);
}

td_err dflash_tensors_check(const dflash_config *cfg, const st_file *st, uint32_t target_hidden)
{
    TD_ASSERT(cfg->n_taps > 0 && cfg->n_layers > 0 && target_hidden > 0);
    bool *seen = calloc(st->n_tensors ? st->n_tensors : 1, sizeof *seen);
    if (!seen)
        return err_set(TD_ENOMEM, "drafter: out of memory");
    const uint64_t h = cfg->hidden, f = cfg->ffn, hd = cfg->head_dim;
    const uint64_t q = (uint64_t)cfg->n_heads * hd, kv = (uint64_t)cfg->n_kv_heads * hd;
    td_err e = TD_OK;
#define CHECK(name, nd, a, b)                                                                \
    do {                                                                                     \
        if ((e = check_one(st, seen, name, nd, a, b)) != TD_OK)                              \
            goto done;                                                                       \
    } while (0)
    CHECK("fc.weight", 2, h, (uint64_t)cfg->n_taps * target_hidden);
    CHECK("hidden_norm.weight", 1, h, 0);
    CHECK("norm.weight", 1, h, 0);
    for (uint32_t l = 0; l < cfg->n_layers; l++) {
        static const struct {
            const char *suffix;
            uint32_t n_dims;
            int d0, d1; /* 'h' hidden, 'f' ffn, 'd' head_dim, 'q' heads*head_dim, 'k' kv*head_dim */
        } parts[] = {
            {"input_layernorm.weight", 1, 'h', 0},
            {"post_attention_layernorm.weight", 1, 'h', 0},
            {"self_attn.q_proj.weight", 2, 'q', 'h'},
            {"self_attn.k_proj.weight", 2, 'k', 'h'},
            {"self_attn.v_proj.weight", 2, 'k', 'h'},
            {"self_attn.o_proj.weight", 2, 'h', 'q'},
            {"self_attn.q_norm.weight", 1, 'd', 0},
            {"self_attn.k_norm.weight", 1, 'd', 0},
            {"mlp.gate_proj.weight", 2, 'f', 'h'},
            {"mlp.up_proj.weight", 2, 'f', 'h'},
            {"mlp.down_proj.weight", 2, 'h', 'f'},
        };
        for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++) {
            uint64_t dim[2];
            int sym[2] = {parts[p].d0, parts[p].d1};
            for (int j = 0; j < 2; j++)
                dim[j] = sym[j] == 'h' ? h : sym[j] == 'f' ? f : sym[j] == 'd' ? hd
                       : sym[j] == 'q' ? q : sym[j] == 'k' ? kv : 0;
            char name[96];
            snprintf(name, sizeof name, "layers.%u.%s", l, parts[p].suffix);
            CHECK(name, parts[p].n_dims, dim[0], dim[1]);
        }
    }
#undef CHECK
    /* A tensor the config does not account for (a sixth layer, a bias) would be silently
     * ignored and give wrong drafts: refuse it. */
    for (size_t i = 0; i < st->n_tensors; i++)
        if (!seen[i]) {
            e = err_set(TD_EFORMAT, "drafter tensor \"%.120s\" is not part of the model the config "
                        "describes (%u layers)", st->tensors[i].name, cfg->n_layers);
            break;
        }
done:
    free(seen);
    return e;
}
