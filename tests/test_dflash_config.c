/* DFlash drafter config.json: the published checkpoints' shapes parse to exact values, masks
 * and RoPE resolve as transformers' Qwen3Config does, default tap layers match Python's
 * round(), refusals are clear, and the tensor check names what is missing or mis-shaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dflash_config.h"

#define FIXTURES "tests/data/dflash/"

static char *read_text(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        fail_msg("cannot open %s (tests run from the repository root)", path);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

static td_err parse_str(dflash_config *cfg, const char *json)
{
    return dflash_config_parse(cfg, json, strlen(json));
}

static void assert_msg_has(const char *word)
{
    if (!strstr(err_msg(), word))
        fail_msg("message \"%s\" lacks \"%s\"", err_msg(), word);
}

/* The smallest config the parser accepts, for the cases below to extend. */
#define MINI_KEYS                                                                            \
    "\"num_hidden_layers\":2,\"hidden_size\":64,\"intermediate_size\":128,"                   \
    "\"num_attention_heads\":4,\"vocab_size\":1000,\"dflash_config\":{\"mask_token_id\":999}"

static void test_qwen3_8b_config_parses_to_exact_values(void **state)
{
    (void)state;
    dflash_config c;
    assert_int_equal(dflash_config_load(&c, FIXTURES "qwen3-8b-dflash-b16.json"), TD_OK);
    assert_int_equal(c.n_layers, 5);
    assert_int_equal(c.hidden, 4096);
    assert_int_equal(c.ffn, 12288);
    assert_int_equal(c.n_heads, 32);
    assert_int_equal(c.n_kv_heads, 8);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.vocab, 151936);
    assert_int_equal(c.block_size, 16);
    assert_int_equal(c.mask_token_id, 151669);
    assert_true(c.rope_theta == 1000000.0);
    assert_true(c.rms_eps == 1e-6);
    assert_true(c.taps_given);
    assert_int_equal(c.n_taps, 5);
    const uint32_t taps[5] = {1, 9, 17, 25, 33};
    assert_memory_equal(c.target_layer_ids, taps, sizeof taps);
    assert_int_equal(c.n_target_layers, 36);
    assert_int_equal(c.sliding_window, 0);
    for (int i = 0; i < 5; i++) {
        assert_false(c.layers[i].sliding);
        assert_false(c.layers[i].causal);
        assert_int_equal(c.layers[i].window, 0);
    }
    assert_true(c.input_embedding_scale == 1.0);
    assert_true(c.output_multiplier == 1.0);
    assert_true(c.final_logit_softcap == 0.0);
    assert_int_equal(dflash_config_resolve(&c, 36), TD_OK);
    assert_memory_equal(c.target_layer_ids, taps, sizeof taps);
}

static void test_qwen35_27b_config_parses_to_exact_values(void **state)
{
    (void)state;
    dflash_config c;
    assert_int_equal(dflash_config_load(&c, FIXTURES "qwen3.5-27b-dflash.json"), TD_OK);
    assert_int_equal(c.hidden, 5120);
    assert_int_equal(c.ffn, 17408);
    assert_int_equal(c.vocab, 248320);
    assert_int_equal(c.mask_token_id, 248070);
    assert_true(c.rope_theta == 1e7);
    const uint32_t taps[5] = {1, 16, 31, 46, 61};
    assert_memory_equal(c.target_layer_ids, taps, sizeof taps);
    assert_int_equal(c.n_target_layers, 64);
    for (int i = 0; i < 5; i++)
        assert_false(c.layers[i].causal);
    assert_int_equal(dflash_config_resolve(&c, 64), TD_OK);
}

static void test_qwen36_config_has_four_causal_sliding_layers_then_one_full(void **state)
{
    (void)state;
    dflash_config c;
    assert_int_equal(dflash_config_load(&c, FIXTURES "qwen3.6-27b-dflash.json"), TD_OK);
    assert_true(c.rope_theta == 1e7); /* from rope_parameters */
    assert_int_equal(c.sliding_window, 2048);
    for (int i = 0; i < 4; i++) {
        assert_true(c.layers[i].sliding);
        assert_true(c.layers[i].causal);
        assert_int_equal(c.layers[i].window, 2048);
    }
    assert_false(c.layers[4].sliding);
    assert_false(c.layers[4].causal);
    assert_int_equal(c.layers[4].window, 0);
}

static void test_dflash_config_keys_override_top_level(void **state)
{
    (void)state;
    dflash_config c;
    assert_int_equal(parse_str(&c, "{\"num_hidden_layers\":2,\"hidden_size\":64,\"intermediate_size\":128,"
                                   "\"num_attention_heads\":4,\"vocab_size\":1000,\"block_size\":8,"
                                   "\"mask_token_id\":5,\"output_multiplier\":3,\"is_causal\":true,"
                                   "\"dflash_config\":{\"block_size\":16,\"mask_token_id\":998,"
                                   "\"output_multiplier\":0.25,\"final_logit_softcapping\":30.0,"
                                   "\"input_embedding_scale\":2.5,\"is_causal\":false,"
                                   "\"target_layer_ids\":[3,7],\"num_target_layers\":12}}"),
                     TD_OK);
    assert_int_equal(c.block_size, 16);
    assert_int_equal(c.mask_token_id, 998);
    assert_true(c.output_multiplier == 0.25);
    assert_true(c.final_logit_softcap == 30.0);
    assert_true(c.input_embedding_scale == 2.5);
    assert_false(c.layers[0].causal);
    assert_int_equal(c.n_taps, 2);
    assert_int_equal(c.target_layer_ids[1], 7);
    assert_int_equal(c.n_target_layers, 12);
    /* defaults where the file is silent */
    assert_int_equal(c.n_kv_heads, 4);
    assert_int_equal(c.head_dim, 16); /* hidden / heads */
    assert_true(c.rope_theta == 10000.0);
    assert_true(c.rms_eps == 1e-6);
}

static void test_mini_config_defaults(void **state)
{
    (void)state;
    dflash_config c;
    assert_int_equal(parse_str(&c, "{" MINI_KEYS "}"), TD_OK);
    assert_int_equal(c.block_size, 16);
    assert_false(c.taps_given);
    assert_int_equal(c.n_taps, 0);
    assert_int_equal(c.n_target_layers, 0);
    assert_false(c.layers[1].sliding);
    assert_false(c.layers[1].causal);
}

/* Expected ids computed with Python: [int(round(1 + i*(nt-4)/(nd-1))) for i in range(nd)],
 * nt // 2 for one layer. (10, 5) and (18, 5) have ties that round to even both ways. */
static void test_default_target_layer_ids_match_python_round(void **state)
{
    (void)state;
    static const struct {
        uint32_t n_target, n_draft;
        uint32_t ids[8];
    } cases[] = {
        {64, 5, {1, 16, 31, 46, 61}},     {36, 5, {1, 9, 17, 25, 33}},
        {32, 5, {1, 8, 15, 22, 29}},      {48, 8, {1, 7, 14, 20, 26, 32, 39, 45}},
        {10, 5, {1, 2, 4, 6, 7}},         {18, 5, {1, 4, 8, 12, 15}},
        {40, 6, {1, 8, 15, 23, 30, 37}},  {24, 4, {1, 8, 14, 21}},
        {16, 7, {1, 3, 5, 7, 9, 11, 13}}, {4, 3, {1, 1, 1}},
        {64, 1, {32}},                    {7, 1, {3}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char json[512];
        snprintf(json, sizeof json,
                 "{\"num_hidden_layers\":%u,\"hidden_size\":64,\"intermediate_size\":128,"
                 "\"num_attention_heads\":4,\"vocab_size\":1000,\"dflash_config\":{\"mask_token_id\":1}}",
                 cases[k].n_draft);
        dflash_config c;
        assert_int_equal(parse_str(&c, json), TD_OK);
        assert_int_equal(dflash_config_resolve(&c, cases[k].n_target), TD_OK);
        assert_int_equal(c.n_taps, cases[k].n_draft);
        for (uint32_t i = 0; i < cases[k].n_draft; i++)
            if (c.target_layer_ids[i] != cases[k].ids[i])
                fail_msg("target %u, drafter %u: id[%u] = %u, Python gives %u", cases[k].n_target,
                         cases[k].n_draft, i, c.target_layer_ids[i], cases[k].ids[i]);
    }
}

static void test_resolve_refuses_a_mismatched_target(void **state)
{
    (void)state;
    dflash_config c;
    assert_int_equal(dflash_config_load(&c, FIXTURES "qwen3.5-27b-dflash.json"), TD_OK);
    assert_int_equal(dflash_config_resolve(&c, 36), TD_EINVAL);
    assert_msg_has("64-layer");
    assert_msg_has("36 layers");

    assert_int_equal(parse_str(&c, "{" MINI_KEYS ",\"target_layer_ids\":[1,12]}"), TD_OK);
    assert_int_equal(dflash_config_resolve(&c, 12), TD_ERANGE);
    assert_msg_has("target_layer_ids[1] = 12");
    assert_int_equal(dflash_config_resolve(&c, 13), TD_OK);

    /* a 2-layer target gives the default formula a negative span */
    assert_int_equal(parse_str(&c, "{" MINI_KEYS "}"), TD_OK);
    assert_int_equal(dflash_config_resolve(&c, 2), TD_ERANGE);
    assert_msg_has("default target_layer_ids[1]");
    assert_int_equal(dflash_config_resolve(&c, 0), TD_EINVAL);
}

static void test_sliding_window_follows_qwen3config(void **state)
{
    (void)state;
    dflash_config c;
    /* No layer_types: transformers makes layers >= max_window_layers sliding. */
    assert_int_equal(parse_str(&c, "{" MINI_KEYS ",\"num_hidden_layers\":4,\"use_sliding_window\":true,"
                                   "\"sliding_window\":100,\"max_window_layers\":2}"),
                     TD_OK);
    const bool sliding[4] = {false, false, true, true};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(c.layers[i].sliding, sliding[i]);
        assert_int_equal(c.layers[i].causal, sliding[i]);
        assert_int_equal(c.layers[i].window, sliding[i] ? 100 : 0);
    }
    /* use_sliding_window without a window: transformers' default of 4096. */
    assert_int_equal(parse_str(&c, "{" MINI_KEYS ",\"use_sliding_window\":true,"
                                   "\"layer_types\":[\"sliding_attention\",\"full_attention\"]}"),
                     TD_OK);
    assert_int_equal(c.layers[0].window, 4096);
    /* Sliding layer types without use_sliding_window: causal, but no window (as the
     * reference, whose Qwen3Config drops the window). */
    assert_int_equal(parse_str(&c, "{" MINI_KEYS ",\"sliding_window\":512,"
                                   "\"layer_types\":[\"sliding_attention\",\"full_attention\"]}"),
                     TD_OK);
    assert_true(c.layers[0].sliding);
    assert_true(c.layers[0].causal);
    assert_int_equal(c.layers[0].window, 0);
    /* is_causal false makes sliding layers bidirectional within the window. */
    assert_int_equal(parse_str(&c, "{" MINI_KEYS ",\"use_sliding_window\":true,\"sliding_window\":512,"
                                   "\"is_causal\":false,"
                                   "\"layer_types\":[\"sliding_attention\",\"sliding_attention\"]}"),
                     TD_OK);
    assert_false(c.layers[1].causal);
    assert_int_equal(c.layers[1].window, 512);
    /* is_causal true makes full layers causal. */
    assert_int_equal(parse_str(&c, "{" MINI_KEYS ",\"is_causal\":true}"), TD_OK);
    assert_true(c.layers[0].causal);
    assert_int_equal(c.layers[0].window, 0);
}

static void test_rope_sources_resolve_like_transformers(void **state)
{
    (void)state;
    dflash_config c;
    assert_int_equal(parse_str(&c, "{" MINI_KEYS ",\"rope_theta\":500000,\"rope_scaling\":{\"type\":\"default\"}}"),
                     TD_OK);
    assert_true(c.rope_theta == 500000.0);
    assert_int_equal(parse_str(&c, "{" MINI_KEYS ",\"rope_theta\":5,\"rope_scaling\":null,"
                                   "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1e6}}"),
                     TD_OK);
    assert_true(c.rope_theta == 1e6);
    assert_int_equal(parse_str(&c, "{" MINI_KEYS ",\"rope_parameters\":{\"full_attention\":"
                                   "{\"rope_type\":\"default\",\"rope_theta\":2e6},\"sliding_attention\":"
                                   "{\"rope_type\":\"default\",\"rope_theta\":2e6}}}"),
                     TD_OK);
    assert_true(c.rope_theta == 2e6);
}

typedef struct refusal {
    const char *what;
    const char *extra; /* keys appended to MINI_KEYS (a later key replaces an earlier one) */
    td_err code;
    const char *words[2];
} refusal;

static const refusal refusals[] = {
    {"yarn in rope_scaling", ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0}", TD_ENOTSUP,
     {"yarn", "rope_scaling"}},
    {"linear in rope_parameters", ",\"rope_parameters\":{\"type\":\"linear\",\"factor\":2}", TD_ENOTSUP,
     {"linear", "rope_parameters"}},
    {"dynamic per layer type", ",\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"dynamic\"}}",
     TD_ENOTSUP, {"dynamic", "full_attention"}},
    {"two rope bases", ",\"rope_parameters\":{\"full_attention\":{\"rope_theta\":1e6},"
     "\"sliding_attention\":{\"rope_theta\":1e4}}", TD_ENOTSUP, {"different", "RoPE"}},
    {"partial rotary", ",\"rope_parameters\":{\"rope_theta\":1e6,\"partial_rotary_factor\":0.25}",
     TD_ENOTSUP, {"partial_rotary_factor"}},
    {"DFlash2", ",\"architectures\":[\"DFlash2DraftModel\"]", TD_ENOTSUP, {"DFlash2DraftModel"}},
    {"llama model_type", ",\"model_type\":\"llama\"", TD_ENOTSUP, {"llama"}},
    {"attention bias", ",\"attention_bias\":true", TD_ENOTSUP, {"attention_bias"}},
    {"gelu", ",\"hidden_act\":\"gelu\"", TD_ENOTSUP, {"gelu"}},
    {"linear attention layer", ",\"layer_types\":[\"full_attention\",\"linear_attention\"]", TD_ENOTSUP,
     {"layer_types[1]", "linear_attention"}},
    {"layer_types length", ",\"layer_types\":[\"full_attention\"]", TD_EFORMAT, {"layer_types", "2 layers"}},
    {"kv heads not dividing", ",\"num_key_value_heads\":3", TD_EFORMAT, {"num_key_value_heads 3"}},
    {"kv heads above heads", ",\"num_key_value_heads\":8", TD_ERANGE, {"num_key_value_heads"}},
    {"mask outside vocab", ",\"dflash_config\":{\"mask_token_id\":1000}", TD_ERANGE,
     {"dflash_config.mask_token_id", "1000"}},
    {"mask not an integer", ",\"dflash_config\":{\"mask_token_id\":\"7\"}", TD_EFORMAT,
     {"mask_token_id", "not an integer"}},
    {"no mask", ",\"dflash_config\":{}", TD_EFORMAT, {"mask_token_id", "missing"}},
    {"zero layers", ",\"num_hidden_layers\":0", TD_ERANGE, {"num_hidden_layers"}},
    {"65 layers", ",\"num_hidden_layers\":65", TD_ERANGE, {"num_hidden_layers"}},
    {"real hidden size", ",\"hidden_size\":64.0", TD_EFORMAT, {"hidden_size", "not an integer"}},
    {"odd head_dim", ",\"head_dim\":7", TD_ERANGE, {"head_dim 7"}},
    {"empty taps", ",\"target_layer_ids\":[]", TD_ERANGE, {"target_layer_ids", "0 entries"}},
    {"negative tap", ",\"target_layer_ids\":[1,-1]", TD_ERANGE, {"target_layer_ids[1]"}},
    {"taps not an array", ",\"target_layer_ids\":3", TD_EFORMAT, {"target_layer_ids"}},
    {"zero eps", ",\"rms_norm_eps\":0", TD_ERANGE, {"rms_norm_eps"}},
    {"string eps", ",\"rms_norm_eps\":\"1e-6\"", TD_EFORMAT, {"rms_norm_eps"}},
    {"theta 1", ",\"rope_theta\":1", TD_ERANGE, {"RoPE base"}},
    {"zero window", ",\"use_sliding_window\":true,\"sliding_window\":0", TD_ERANGE, {"sliding_window"}},
    {"is_causal string", ",\"is_causal\":\"yes\"", TD_EFORMAT, {"is_causal"}},
    {"negative softcap", ",\"final_logit_softcapping\":-1", TD_ERANGE, {"final_logit_softcapping"}},
    {"block size 1", ",\"block_size\":1", TD_ERANGE, {"block_size"}},
};

static void test_refusals_have_code_and_words(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json, "{" MINI_KEYS "%s}", refusals[i].extra);
        dflash_config c;
        td_err e = parse_str(&c, json);
        if (e != refusals[i].code)
            fail_msg("%s: expected %s, got %s (%s)", refusals[i].what, err_name(refusals[i].code),
                     err_name(e), err_msg());
        for (int w = 0; w < 2 && refusals[i].words[w]; w++)
            if (!strstr(err_msg(), refusals[i].words[w]))
                fail_msg("%s: message \"%s\" lacks \"%s\"", refusals[i].what, err_msg(),
                         refusals[i].words[w]);
    }
}

static void test_bad_json_and_every_truncation(void **state)
{
    (void)state;
    dflash_config c;
    assert_int_equal(parse_str(&c, "[]"), TD_EFORMAT);
    assert_msg_has("not a JSON object");
    assert_int_equal(parse_str(&c, "{" MINI_KEYS ",\"dflash_config\":[1]}"), TD_EFORMAT);
    assert_msg_has("dflash_config is not an object");
    assert_int_equal(parse_str(&c, "{\"hidden_size\":64}"), TD_EFORMAT);
    assert_msg_has("num_hidden_layers is missing");

    size_t len;
    char *text = read_text(FIXTURES "qwen3.6-27b-dflash.json", &len);
    for (size_t cut = 0; cut < len; cut++) {
        /* the valid JSON ends at the closing brace; whitespace after it may be cut */
        char *p = malloc(cut ? cut : 1);
        memcpy(p, text, cut);
        td_err e = dflash_config_parse(&c, p, cut);
        bool whole = memchr(text + cut, '}', len - cut) == NULL;
        if (!whole && e != TD_EFORMAT)
            fail_msg("prefix of %zu bytes: got %s", cut, err_name(e));
        free(p);
    }
    free(text);

    assert_int_equal(dflash_config_load(&c, "/nonexistent/config.json"), TD_EIO);
    assert_msg_has("/nonexistent/config.json");
}

/* --- tensor check: a tiny drafter (hidden 8, ffn 12, 2 heads of 4, 1 KV head, 2 layers,
 * 3 taps of a 6-wide target) ------------------------------------------------------------ */

#define TINY_JSON                                                                             \
    "{\"num_hidden_layers\":2,\"hidden_size\":8,\"intermediate_size\":12,"                    \
    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":4,\"vocab_size\":50,"    \
    "\"dflash_config\":{\"mask_token_id\":49,\"target_layer_ids\":[0,2,4]}}"

typedef struct tiny_model {
    st_entry e[40];
    char names[40][64];
    uint64_t shapes[40][2];
    size_t n;
} tiny_model;

static void tiny_add(tiny_model *m, const char *name, st_dtype dt, uint32_t n_dims, uint64_t d0,
                     uint64_t d1)
{
    static const uint8_t zeros[1024];
    TD_ASSERT(m->n < 40);
    size_t i = m->n++;
    snprintf(m->names[i], sizeof m->names[i], "%s", name);
    m->shapes[i][0] = d0;
    m->shapes[i][1] = d1;
    uint64_t bytes;
    TD_ASSERT(st_dtype_bytes(dt, n_dims == 1 ? d0 : d0 * d1, &bytes) == TD_OK && bytes <= sizeof zeros);
    m->e[i] = (st_entry){m->names[i], dt, n_dims, m->shapes[i], zeros, bytes};
}

/* All tensors of the tiny drafter; `skip` is left out, `odd` gets shape [odd_d0, odd_d1]. */
static void tiny_build(tiny_model *m, const char *skip, const char *odd, uint32_t odd_n, uint64_t odd_d0,
                       uint64_t odd_d1)
{
    memset(m, 0, sizeof *m);
    static const struct {
        const char *name;
        uint32_t n_dims;
        uint64_t d0, d1;
    } top[] = {{"fc.weight", 2, 8, 18}, {"hidden_norm.weight", 1, 8, 0}, {"norm.weight", 1, 8, 0}};
    static const struct {
        const char *suffix;
        uint32_t n_dims;
        uint64_t d0, d1;
    } per[] = {
        {"input_layernorm.weight", 1, 8, 0},   {"post_attention_layernorm.weight", 1, 8, 0},
        {"self_attn.q_proj.weight", 2, 8, 8},  {"self_attn.k_proj.weight", 2, 4, 8},
        {"self_attn.v_proj.weight", 2, 4, 8},  {"self_attn.o_proj.weight", 2, 8, 8},
        {"self_attn.q_norm.weight", 1, 4, 0},  {"self_attn.k_norm.weight", 1, 4, 0},
        {"mlp.gate_proj.weight", 2, 12, 8},    {"mlp.up_proj.weight", 2, 12, 8},
        {"mlp.down_proj.weight", 2, 8, 12},
    };
    char name[64];
    for (size_t i = 0; i < 3 + 2 * 11; i++) {
        uint32_t nd;
        uint64_t d0, d1;
        if (i < 3) {
            snprintf(name, sizeof name, "%s", top[i].name);
            nd = top[i].n_dims, d0 = top[i].d0, d1 = top[i].d1;
        } else {
            size_t l = (i - 3) / 11, p = (i - 3) % 11;
            snprintf(name, sizeof name, "layers.%zu.%s", l, per[p].suffix);
            nd = per[p].n_dims, d0 = per[p].d0, d1 = per[p].d1;
        }
        if (skip && !strcmp(name, skip))
            continue;
        if (odd && !strcmp(name, odd))
            nd = odd_n, d0 = odd_d0, d1 = odd_d1;
        tiny_add(m, name, ST_BF16, nd, d0, d1);
    }
}

static td_err tiny_check(tiny_model *m, uint32_t target_hidden)
{
    dflash_config c;
    assert_int_equal(parse_str(&c, TINY_JSON), TD_OK);
    uint8_t *img;
    size_t size;
    assert_int_equal(st_serialize(m->e, m->n, NULL, 0, &img, &size), TD_OK);
    st_file *st;
    assert_int_equal(st_open_memory(&st, img, size), TD_OK);
    td_err e = dflash_tensors_check(&c, st, target_hidden);
    st_close(st);
    free(img);
    return e;
}

static void test_tensor_check_accepts_the_complete_drafter(void **state)
{
    (void)state;
    tiny_model m;
    tiny_build(&m, NULL, NULL, 0, 0, 0);
    assert_int_equal(m.n, 25);
    assert_int_equal(tiny_check(&m, 6), TD_OK);
    /* the same file against a 5-wide target: fc must be [8, 15] */
    assert_int_equal(tiny_check(&m, 5), TD_EFORMAT);
    assert_msg_has("\"fc.weight\" has shape [8, 18]");
    assert_msg_has("implies [8, 15]");
}

static void test_tensor_check_names_missing_and_misshaped_tensors(void **state)
{
    (void)state;
    tiny_model m;
    tiny_build(&m, "layers.1.mlp.down_proj.weight", NULL, 0, 0, 0);
    assert_int_equal(tiny_check(&m, 6), TD_ENOENT);
    assert_msg_has("\"layers.1.mlp.down_proj.weight\" is missing");

    tiny_build(&m, "hidden_norm.weight", NULL, 0, 0, 0);
    assert_int_equal(tiny_check(&m, 6), TD_ENOENT);
    assert_msg_has("\"hidden_norm.weight\"");

    /* k_proj sized for 2 KV heads: [8, 8] where 1 KV head of 4 gives [4, 8] */
    tiny_build(&m, NULL, "layers.0.self_attn.k_proj.weight", 2, 8, 8);
    assert_int_equal(tiny_check(&m, 6), TD_EFORMAT);
    assert_msg_has("\"layers.0.self_attn.k_proj.weight\" has shape [8, 8]");
    assert_msg_has("implies [4, 8]");

    /* transposed down_proj */
    tiny_build(&m, NULL, "layers.1.mlp.down_proj.weight", 2, 12, 8);
    assert_int_equal(tiny_check(&m, 6), TD_EFORMAT);
    assert_msg_has("implies [8, 12]");

    /* a norm stored as [1, 8] */
    tiny_build(&m, NULL, "norm.weight", 2, 1, 8);
    assert_int_equal(tiny_check(&m, 6), TD_EFORMAT);
    assert_msg_has("\"norm.weight\" has shape [1, 8]; the config implies [8]");
}

static void test_tensor_check_refuses_unsupported_dtypes_and_extra_tensors(void **state)
{
    (void)state;
    tiny_model m;
    tiny_build(&m, "layers.0.self_attn.q_norm.weight", NULL, 0, 0, 0);
    tiny_add(&m, "layers.0.self_attn.q_norm.weight", ST_F8_E4M3, 1, 4, 0);
    assert_int_equal(tiny_check(&m, 6), TD_ENOTSUP);
    assert_msg_has("\"layers.0.self_attn.q_norm.weight\"");
    assert_msg_has("F8_E4M3");

    tiny_build(&m, NULL, NULL, 0, 0, 0);
    tiny_add(&m, "layers.2.input_layernorm.weight", ST_BF16, 1, 8, 0);
    assert_int_equal(tiny_check(&m, 6), TD_EFORMAT);
    assert_msg_has("\"layers.2.input_layernorm.weight\" is not part of the model");

    tiny_build(&m, NULL, NULL, 0, 0, 0);
    tiny_add(&m, "layers.0.self_attn.q_proj.bias", ST_F32, 1, 8, 0);
    assert_int_equal(tiny_check(&m, 6), TD_EFORMAT);
    assert_msg_has("q_proj.bias");
}


/* The tiny drafters scripts/dflash_ref.py writes with torch and the safetensors package
 * (tests/data/drafter/<name>/) load, resolve against their 8-layer, 32-wide target, and pass
 * the tensor check. */
static void load_drafter(const char *name, dflash_config *c, st_file **st)
{
    char path[256];
    snprintf(path, sizeof path, "tests/data/drafter/%s/config.json", name);
    if (dflash_config_load(c, path) != TD_OK)
        fail_msg("%s", err_msg());
    assert_int_equal(dflash_config_resolve(c, 8), TD_OK);
    snprintf(path, sizeof path, "tests/data/drafter/%s/model.safetensors", name);
    if (st_open(st, path) != TD_OK)
        fail_msg("%s", err_msg());
    if (dflash_tensors_check(c, *st, 32) != TD_OK)
        fail_msg("%s: %s", name, err_msg());
    assert_int_equal((*st)->n_tensors, 3 + 2 * 11);
}

static void test_reference_drafters_load_and_check(void **state)
{
    (void)state;
    dflash_config c;
    st_file *st;

    load_drafter("dflash-b16", &c, &st);
    assert_int_equal(c.block_size, 16);
    assert_int_equal(c.n_taps, 3);
    assert_int_equal(c.target_layer_ids[2], 6);
    assert_int_equal(st_find(st, "fc.weight")->shape[1], 96);
    assert_int_equal(st_find(st, "fc.weight")->dtype, ST_BF16);
    assert_false(c.layers[0].causal || c.layers[1].causal);
    st_close(st);

    load_drafter("dflash-b8", &c, &st);
    assert_int_equal(c.block_size, 8); /* dflash_config over the top-level 16 */
    assert_false(c.taps_given);
    assert_int_equal(c.n_taps, 2);
    assert_int_equal(c.target_layer_ids[0], 1);
    assert_int_equal(c.target_layer_ids[1], 5);
    assert_true(c.input_embedding_scale == 1.5);
    assert_true(c.output_multiplier == 0.75);
    assert_true(c.final_logit_softcap == 6.0);
    for (int i = 0; i < 2; i++) {
        assert_false(c.layers[i].causal);
        assert_int_equal(c.layers[i].window, 5);
    }
    st_close(st);

    load_drafter("dflash-swa", &c, &st);
    assert_true(c.layers[0].sliding && c.layers[0].causal);
    assert_int_equal(c.layers[0].window, 6);
    assert_false(c.layers[1].sliding || c.layers[1].causal);
    assert_int_equal(c.layers[1].window, 0);
    assert_int_equal(c.target_layer_ids[0], 2);
    st_close(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_8b_config_parses_to_exact_values),
        cmocka_unit_test(test_qwen35_27b_config_parses_to_exact_values),
        cmocka_unit_test(test_qwen36_config_has_four_causal_sliding_layers_then_one_full),
        cmocka_unit_test(test_dflash_config_keys_override_top_level),
        cmocka_unit_test(test_mini_config_defaults),
        cmocka_unit_test(test_default_target_layer_ids_match_python_round),
        cmocka_unit_test(test_resolve_refuses_a_mismatched_target),
        cmocka_unit_test(test_sliding_window_follows_qwen3config),
        cmocka_unit_test(test_rope_sources_resolve_like_transformers),
        cmocka_unit_test(test_refusals_have_code_and_words),
        cmocka_unit_test(test_bad_json_and_every_truncation),
        cmocka_unit_test(test_tensor_check_accepts_the_complete_drafter),
        cmocka_unit_test(test_tensor_check_names_missing_and_misshaped_tensors),
        cmocka_unit_test(test_tensor_check_refuses_unsupported_dtypes_and_extra_tensors),
        cmocka_unit_test(test_reference_drafters_load_and_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
