/* Speculative decoding is lossless: greedy output with a DFlash drafter equals plain greedy
 * decoding for many prompts, lengths, block sizes and drafter shapes (full and sliding
 * layers), including drafters that get long runs accepted; sampled output keeps the
 * target's distribution (chi-square test). Drafters are written here as real checkpoints
 * (config.json + bf16 model.safetensors) for the tiny qwen35 test model. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "verifyd/spec.h"

#define MODEL_PATH "tests/data/models/qwen35-tiny-f32.gguf"

static uint64_t rng_state;

static float rng_uniform(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / (float)0x1000000;
}

typedef struct drafter_shape {
    int block;       /* block_size */
    int n_layers;
    bool sliding;    /* layer 0 causal sliding (window 4), the rest full */
    bool silent;     /* o_proj and down_proj zero: every slot proposes the same token */
    uint32_t mask_id;
} drafter_shape;

static void put_bf16(const char *name, const uint64_t *shape, uint32_t n_dims, float scale,
                     float offset, st_entry *e, uint16_t **bufs, size_t *nb)
{
    uint64_t n = 1;
    for (uint32_t i = 0; i < n_dims; i++)
        n *= shape[i];
    uint16_t *b = malloc(n * sizeof *b);
    for (uint64_t i = 0; i < n; i++)
        b[i] = ops_f32_to_bf16(offset + scale * (2.0f * rng_uniform() - 1.0f));
    bufs[*nb] = b;
    e[*nb] = (st_entry){strdup(name), ST_BF16, n_dims, NULL, b, n * 2};
    uint64_t *sh = malloc(n_dims * sizeof *sh);
    memcpy(sh, shape, n_dims * sizeof *sh);
    e[*nb].shape = sh;
    (*nb)++;
}

/* Writes a random drafter for tm into dir. */
static void drafter_write(const char *dir, const tgt_model *tm, const drafter_shape *ds,
                          uint64_t seed)
{
    rng_state = seed;
    mkdir(dir, 0700);
    uint64_t H = (uint64_t)tm->hp.n_embd, nh = 4, nkv = 2, hd = 8, ff = 2 * H;
    uint32_t n_taps = (uint32_t)ds->n_layers;
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
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

    st_entry e[128];
    uint16_t *bufs[128];
    size_t nb = 0;
    char name[128];
    float zero = ds->silent ? 0.0f : 1.0f;
    put_bf16("fc.weight", (uint64_t[]){H, n_taps * H}, 2, 0.3f, 0, e, bufs, &nb);
    put_bf16("hidden_norm.weight", (uint64_t[]){H}, 1, 0.2f, 1, e, bufs, &nb);
    put_bf16("norm.weight", (uint64_t[]){H}, 1, ds->silent ? 0 : 0.2f, 1, e, bufs, &nb);
    for (int l = 0; l < ds->n_layers; l++) {
#define LNAME(s) (snprintf(name, sizeof name, "layers.%d." s, l), name)
        put_bf16(LNAME("input_layernorm.weight"), (uint64_t[]){H}, 1, 0.2f, 1, e, bufs, &nb);
        put_bf16(LNAME("post_attention_layernorm.weight"), (uint64_t[]){H}, 1, 0.2f, 1, e, bufs, &nb);
        put_bf16(LNAME("self_attn.q_proj.weight"), (uint64_t[]){nh * hd, H}, 2, 0.4f, 0, e, bufs, &nb);
        put_bf16(LNAME("self_attn.k_proj.weight"), (uint64_t[]){nkv * hd, H}, 2, 0.4f, 0, e, bufs, &nb);
        put_bf16(LNAME("self_attn.v_proj.weight"), (uint64_t[]){nkv * hd, H}, 2, 0.4f, 0, e, bufs, &nb);
        put_bf16(LNAME("self_attn.o_proj.weight"), (uint64_t[]){H, nh * hd}, 2, 0.4f * zero, 0, e, bufs, &nb);
        put_bf16(LNAME("self_attn.q_norm.weight"), (uint64_t[]){hd}, 1, 0.2f, 1, e, bufs, &nb);
        put_bf16(LNAME("self_attn.k_norm.weight"), (uint64_t[]){hd}, 1, 0.2f, 1, e, bufs, &nb);
        put_bf16(LNAME("mlp.gate_proj.weight"), (uint64_t[]){ff, H}, 2, 0.4f, 0, e, bufs, &nb);
        put_bf16(LNAME("mlp.up_proj.weight"), (uint64_t[]){ff, H}, 2, 0.4f, 0, e, bufs, &nb);
        put_bf16(LNAME("mlp.down_proj.weight"), (uint64_t[]){H, ff}, 2, 0.4f * zero, 0, e, bufs, &nb);
#undef LNAME
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_write(path, e, nb, NULL, 0) != TD_OK)
        fail_msg("st_write: %s", err_msg());
    for (size_t i = 0; i < nb; i++) {
        free(bufs[i]);
        free((void *)e[i].name);
        free((void *)e[i].shape);
    }
}

/* Generates n tokens after prompt; returns the stats. */
static spec_stats generate(const tgt_model *tm, const dfl_model *dm, const int32_t *prompt,
                           int64_t n_prompt, int64_t n, const ops_sampler *smp, int32_t *out)
{
    spec_seq s;
    if (spec_init(&s, tm, dm, 256, 0, smp) != TD_OK)
        fail_msg("spec_init: %s", err_msg());
    assert_int_equal(spec_prefill(&s, prompt, n_prompt, &out[0]), TD_OK);
    int64_t got = 1;
    int32_t step[SPEC_MAX_BLOCK];
    while (got < n) {
        int64_t k;
        assert_int_equal(spec_step(&s, step, &k), TD_OK);
        for (int64_t i = 0; i < k && got < n; i++)
            out[got++] = step[i];
    }
    spec_stats st = s.stats;
    spec_free(&s);
    return st;
}

static char tmpdir[64];

static int setup_dir(void **ctx)
{
    (void)ctx;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tandem-spec-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_dir(void **ctx)
{
    (void)ctx;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_spec_greedy_equals_plain_for_many_prompts_and_blocks(void **ctx)
{
    (void)ctx;
    tgt_model *tm;
    assert_int_equal(tgt_load(&tm, MODEL_PATH), TD_OK);
    const drafter_shape shapes[] = {
        {2, 1, false, false, 7},  {4, 2, true, false, 11}, {8, 1, false, false, 3},
        {16, 2, true, false, 5},  {16, 3, false, false, 500},
    };
    ops_sampler greedy = {0};
    int64_t n = 48, total_acc = 0, runs = 0;
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        char dir[128];
        snprintf(dir, sizeof dir, "%s/d%zu", tmpdir, k);
        drafter_write(dir, tm, &shapes[k], 1000 + k);
        dfl_model *dm;
        if (dfl_load(&dm, dir, (uint32_t)tm->hp.n_layer, &tm->tok_embd, &tm->output) != TD_OK)
            fail_msg("dfl_load: %s", err_msg());
        for (int p = 0; p < 6; p++) {
            int32_t prompt[32], a[64], b[64];
            int64_t np = 2 + (p * 5) % 19;
            rng_state = 77 + (uint64_t)p;
            for (int64_t i = 0; i < np; i++)
                prompt[i] = (int32_t)(rng_uniform() * (float)tm->hp.n_vocab);
            generate(tm, NULL, prompt, np, n, &greedy, a);
            spec_stats st = generate(tm, dm, prompt, np, n, &greedy, b);
            for (int64_t i = 0; i < n; i++)
                if (a[i] != b[i])
                    fail_msg("drafter %zu prompt %d: token %lld differs (plain %d, speculative %d)",
                             k, p, (long long)i, a[i], b[i]);
            total_acc += st.accepted;
            runs++;
        }
        dfl_free(dm);
    }
    assert_true(runs == 30);
    (void)total_acc;
    tgt_free(tm);
}

/* Writes a copy of the model in which token x's embedding and output rows are s times its
 * embedding:
 * the larger s, the more the target keeps repeating x once it appears. */
static void target_write_scaled(const char *path, const char *src, int32_t x, float s)
{
    gguf_file *g;
    assert_int_equal(gguf_open(&g, src), TD_OK);
    gguf_writer *w = gguf_writer_new();
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        switch (kv->value.type) {
        case GGUF_TYPE_STRING: {
            char *v = strndup(kv->value.str.ptr, kv->value.str.len);
            gguf_writer_set_str(w, key, v);
            free(v);
            break;
        }
        case GGUF_TYPE_UINT32:
            gguf_writer_set_u32(w, key, (uint32_t)kv->value.u64);
            break;
        case GGUF_TYPE_FLOAT32:
            gguf_writer_set_f32(w, key, (float)kv->value.f64);
            break;
        default:
            break; /* the tokenizer is not needed here */
        }
    }
    const gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(emb);
    assert_int_equal(emb->type, TD_F32);
    const float *ex = (const float *)emb->data + x * emb->ne[0];
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        bool scaled = !strcmp(t->name, "token_embd.weight") || !strcmp(t->name, "output.weight");
        float *copy = NULL;
        const void *data = t->data;
        if (scaled) {
            /* both rows of x become s times its embedding, so x's logit grows with s
             * whenever the residual points along that embedding */
            assert_int_equal(t->type, TD_F32);
            copy = malloc(t->size);
            memcpy(copy, t->data, t->size);
            for (int64_t c = 0; c < t->ne[0]; c++)
                copy[x * t->ne[0] + c] = s * ex[c];
            data = copy;
        }
        assert_int_equal(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, data, t->size), TD_OK);
        free(copy);
    }
    assert_int_equal(gguf_writer_write(w, path), TD_OK);
    gguf_writer_free(w);
    gguf_close(g);
}

/* A drafter whose layers add nothing proposes the same token t in every slot (the LM head of
 * its mask embedding). Against targets that repeat t more or less readily, steps accept
 * nothing, part of the block, or all of it; the output always equals plain decoding. */
static void test_spec_partial_and_full_accepts_stay_lossless(void **ctx)
{
    (void)ctx;
    const int32_t x = 279;
    const float scales[] = {1.5f, 2.0f, 3.0f, 5.0f, 20.0f};
    int64_t hist[9] = {0}, n = 60;
    ops_sampler greedy = {0};
    for (size_t k = 0; k < sizeof scales / sizeof *scales; k++) {
        char path[160], dir[160];
        snprintf(path, sizeof path, "%s/scaled%zu.gguf", tmpdir, k);
        target_write_scaled(path, MODEL_PATH, x, scales[k]);
        tgt_model *tm;
        if (tgt_load(&tm, path) != TD_OK)
            fail_msg("%s: %s", path, err_msg());
        drafter_shape ds = {8, 1, false, true, (uint32_t)x};
        snprintf(dir, sizeof dir, "%s/silent%zu", tmpdir, k);
        drafter_write(dir, tm, &ds, 9);
        dfl_model *dm;
        assert_int_equal(dfl_load(&dm, dir, (uint32_t)tm->hp.n_layer, &tm->tok_embd, &tm->output), TD_OK);
        for (int p = 0; p < 3; p++) {
            int32_t prompt[4] = {10 + p, 20, x, 40 + p}, plain[64], spec[64];
            generate(tm, NULL, prompt, 4, n, &greedy, plain);
            spec_stats st = generate(tm, dm, prompt, 4, n, &greedy, spec);
            for (int64_t i = 0; i < n; i++)
                if (plain[i] != spec[i])
                    fail_msg("scale %g prompt %d: token %lld differs (plain %d, speculative %d)",
                             scales[k], p, (long long)i, plain[i], spec[i]);
            for (int a = 1; a <= 8; a++)
                hist[a] += st.accept_hist[a];
        }
        dfl_free(dm);
        tgt_free(tm);
    }
    int64_t partial = 0;
    for (int a = 2; a <= 7; a++)
        partial += hist[a];
    if (!(hist[1] > 0 && partial > 0 && hist[8] > 0))
        fail_msg("accept lengths not all exercised: 1:%lld 2..7:%lld 8:%lld", (long long)hist[1],
                 (long long)partial, (long long)hist[8]);
}

/* Sampling at temperature 0.7 with top-k 12: the token after the first one, over many seeds,
 * follows the target's own distribution p(t2 | prompt, t1) whether or not a drafter is used
 * (chi-square, p > 1e-4 for both, on the most frequent t1). */
static double chi_square_p(const int *obs, const double *expect, int64_t V, int total)
{
    double chi = 0, df = -1, lump_o = 0, lump_e = 0;
    for (int64_t i = 0; i < V; i++) {
        double e = expect[i] * total;
        if (e < 5) {
            lump_o += obs[i];
            lump_e += e;
            if (obs[i] > 0 && expect[i] == 0)
                return 0; /* drawn where the target has zero mass */
            continue;
        }
        chi += (obs[i] - e) * (obs[i] - e) / e;
        df++;
    }
    if (lump_e > 0) {
        chi += (lump_o - lump_e) * (lump_o - lump_e) / lump_e;
        df++;
    }
    /* Wilson-Hilferty approximation of the chi-square upper tail */
    double z = (pow(chi / df, 1.0 / 3) - (1 - 2 / (9 * df))) / sqrt(2 / (9 * df));
    return 0.5 * erfc(z / sqrt(2.0));
}

static void test_spec_sampling_keeps_target_distribution(void **ctx)
{
    (void)ctx;
    tgt_model *tm;
    assert_int_equal(tgt_load(&tm, MODEL_PATH), TD_OK);
    int64_t V = tm->hp.n_vocab;
    drafter_shape ds = {4, 1, false, false, 5};
    char dir[128];
    snprintf(dir, sizeof dir, "%s/sampling", tmpdir);
    drafter_write(dir, tm, &ds, 4242);
    dfl_model *dm;
    assert_int_equal(dfl_load(&dm, dir, (uint32_t)tm->hp.n_layer, &tm->tok_embd, &tm->output), TD_OK);
    int32_t prompt[3] = {100, 200, 300};
    const int runs = 2000;
    int *t1 = calloc((size_t)runs, sizeof *t1), *t2 = calloc((size_t)runs, sizeof *t2);
    int *c1 = calloc((size_t)V, sizeof *c1);
    for (int with = 0; with < 2; with++) {
        memset(c1, 0, (size_t)V * sizeof *c1);
        for (int r = 0; r < runs; r++) {
            ops_sampler smp = {.temperature = 0.7f, .top_k = 12, .top_p = 1.0f, .seed = (uint64_t)r * 7919 + 1};
            int32_t out[2];
            generate(tm, with ? dm : NULL, prompt, 3, 2, &smp, out);
            t1[r] = out[0];
            t2[r] = out[1];
            c1[out[0]]++;
        }
        int32_t best = 0;
        for (int64_t i = 0; i < V; i++)
            if (c1[i] > c1[best])
                best = (int32_t)i;
        /* the target's p(t2 | prompt, best) under the same sampler settings */
        tgt_state st;
        assert_int_equal(tgt_state_init(&st, tm, 8), TD_OK);
        int32_t ctx4[4] = {100, 200, 300, best};
        float *lg = malloc((size_t)V * sizeof(float));
        double *p = malloc((size_t)V * sizeof(double));
        float *pf = malloc((size_t)V * sizeof(float));
        tgt_out o = {.logits = lg, .last_only = true};
        assert_int_equal(tgt_forward(tm, &st, ctx4, 4, false, &o), TD_OK);
        ops_sampler smp = {.temperature = 0.7f, .top_k = 12, .top_p = 1.0f};
        assert_int_equal(cpu_sample_probs(pf, lg, V, &smp), TD_OK);
        for (int64_t i = 0; i < V; i++)
            p[i] = pf[i];
        int *c2 = calloc((size_t)V, sizeof *c2), total = 0;
        for (int r = 0; r < runs; r++)
            if (t1[r] == best) {
                c2[t2[r]]++;
                total++;
            }
        assert_true(total >= 200);
        double pv = chi_square_p(c2, p, V, total);
        if (!(pv > 1e-4))
            fail_msg("%s drafter: p-value %.3g for the second token's distribution", with ? "with" : "without", pv);
        free(c2);
        free(lg);
        free(p);
        free(pf);
        tgt_state_free(&st);
    }
    free(t1);
    free(t2);
    free(c1);
    dfl_free(dm);
    tgt_free(tm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_greedy_equals_plain_for_many_prompts_and_blocks),
        cmocka_unit_test(test_spec_partial_and_full_accepts_stay_lossless),
        cmocka_unit_test(test_spec_sampling_keeps_target_distribution),
    };
    return cmocka_run_group_tests(tests, setup_dir, remove_dir);
}
