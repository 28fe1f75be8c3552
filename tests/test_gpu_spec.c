/* The drafter and the speculative loop on the CUDA backend: the DFlash drafter's two draft
 * steps against the PyTorch reference (the same golden files and bound as the CPU test), and
 * greedy speculative generation with target, drafter and acceptance on the GPU equal token
 * for token to plain greedy decoding on the GPU, for several prompts and block sizes, also
 * with presence/frequency penalties and a logit bias, and with a response format (masks on the
 * device, cuda_logit_mask; every output a viable prefix of a valid document). How
 * often the GPU's tokens equal the CPU's is printed, not required: logits that differ in the
 * last bits may pick another token where two are nearly tied. Skipped (77) without a CUDA
 * device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "draftd/dflash.h"
#include "kernels/backend.h"
#include "kernels/cuda_mem.h"
#include "tests/support/model_fixture.h"
#include "tests/support/ops_golden.h"
#include "verifyd/spec.h"
#include "verifyd/target.h"

#define TARGET_PATH "tests/data/models/qwen35-tiny-f32.gguf"
#define N_GEN 40  /* tokens generated per prompt */
#define N_PROMPTS 5

static ops_backend *gpu;
static const char *const drafters[] = {"dflash-b16", "dflash-b8", "dflash-swa"};

static tgt_model *load_target(const ops_backend *be)
{
    tgt_model *m = NULL;
    if (tgt_load_on(&m, TARGET_PATH, be) != TD_OK)
        fail_msg("%s: %s", TARGET_PATH, err_msg());
    return m;
}

static dfl_model *load_drafter(const tgt_model *tm, const char *name)
{
    char dir[256];
    snprintf(dir, sizeof dir, "tests/data/drafter/%s", name);
    dfl_model *dm = NULL;
    if (dfl_load_on(&dm, dir, (uint32_t)tm->hp.n_layer, &tm->tok_embd, &tm->output, tm->be) !=
        TD_OK)
        fail_msg("%s: %s", dir, err_msg());
    return dm;
}

static void expect_close(const char *what, const float *got, const float *want, int64_t n,
                         double tol)
{
    int64_t at;
    double r = golden_range_error(got, want, n, &at);
    if (!(r <= tol))
        fail_msg("%s: error %.3g of the range at %lld (got %.6g, want %.6g)", what, r,
                 (long long)at, got[at], want[at]);
}

/* Two consecutive draft steps of dm on its backend be, the second reusing the context K/V of
 * the first (a fresh state of dm's kv_type): logits[0], logits[1] [(B-1) * V] on the host. */
static void two_steps(const ops_backend *be, dfl_model *dm, gguf_file *g, const float *feat,
                      int64_t V, float *logits[2])
{
    uint32_t L1, L2, B = dm->cfg.block_size;
    assert_int_equal(gguf_get_u32(g, "golden.step1.n_ctx", &L1), TD_OK);
    assert_int_equal(gguf_get_u32(g, "golden.step2.n_ctx", &L2), TD_OK);
    const int64_t row = dm->cfg.n_taps * dm->target_hidden, nl = (int64_t)(B - 1) * V;
    float *dfeat = NULL, *dlogits = NULL;
    assert_int_equal(ops_backend_upload(be, (void **)&dfeat, feat,
                                        (size_t)(L2 * row) * sizeof(float)),
                     TD_OK);
    assert_int_equal(be->alloc(be, (void **)&dlogits, (size_t)nl * sizeof(float)), TD_OK);
    dfl_state ds;
    assert_int_equal(dfl_state_init(&ds, dm, 64), TD_OK);
    uint32_t at = 0;
    for (int step = 1; step <= 2; step++) {
        uint32_t L = step == 1 ? L1 : L2;
        assert_int_equal(dfl_add_context(dm, &ds, dfeat + (int64_t)at * row, L - at), TD_OK);
        at = L;
        char name[64];
        snprintf(name, sizeof name, "step%d.block", step);
        const int32_t *block = golden_tensor(g, name, TD_I32, B);
        assert_int_equal(dfl_propose(dm, &ds, block[0], B - 1, dlogits), TD_OK);
        logits[step - 1] = malloc((size_t)nl * sizeof(float));
        assert_int_equal(be->to_host(be, logits[step - 1], dlogits, (size_t)nl * sizeof(float)),
                         TD_OK);
    }
    /* A pending token outside the vocabulary is refused before anything runs. */
    assert_int_equal(dfl_propose(dm, &ds, (int32_t)V, B - 1, dlogits), TD_ERANGE);
    dfl_state_free(&ds);
    be->release(be, dfeat);
    be->release(be, dlogits);
}

/* Two consecutive draft steps on the GPU, the second reusing the device context K/V of the
 * first. With exact inputs (TANDEM_DRAFT_ACT=f32): logits within 1e-4 of the range of the reference
 * with an f32 context, within 1e-3 with the f16 one (the CPU test's bounds). With every
 * product reading its inputs rounded to bf16 (a GPU's default) and an f16 context:
 * within DFL_BF16_REF of the reference, and within DFL_BF16_CPU of the CPU drafter with bf16
 * inputs and an f16 context (its twin: what is left is the order of the sums, and an input
 * that lands on the other side of a rounding because of it; on the CPU the f32 context against
 * the f16 one alone moves the bf16 drafter's logits by up to 4.2e-3 of their range, through
 * such roundings, so the twin keeps the GPU's context type). */
#define DFL_BF16_REF 1e-2
#define DFL_BF16_CPU 3e-3
static void test_gpu_dflash_two_steps_match_reference(void **ctx)
{
    (void)ctx;
    tgt_model *tm = load_target(gpu), *tc = load_target(ops_backend_cpu());
    int64_t V = tm->hp.n_vocab;
    double worst_ref = 0, worst_cpu = 0;
    for (size_t k = 0; k < sizeof drafters / sizeof *drafters; k++) {
        dfl_model *dm = load_drafter(tm, drafters[k]), *cm = load_drafter(tc, drafters[k]);
        char path[256], what[128];
        snprintf(path, sizeof path, "tests/data/golden/%s.gguf", drafters[k]);
        gguf_file *g = golden_open_path(path);
        uint32_t L2, B;
        assert_int_equal(gguf_get_u32(g, "golden.step2.n_ctx", &L2), TD_OK);
        assert_int_equal(gguf_get_u32(g, "golden.block_size", &B), TD_OK);
        assert_int_equal(B, dm->cfg.block_size);
        const int64_t nl = (int64_t)(B - 1) * V;
        const float *feat = golden_tensor(g, "features", TD_F32,
                                          (int64_t)L2 * dm->cfg.n_taps * tm->hp.n_embd);
        /* the GPU's defaults (unless TANDEM_DRAFT_KV / TANDEM_DRAFT_ACT say otherwise); the
         * CPU's */
        const char *kv = getenv("TANDEM_DRAFT_KV"), *act = getenv("TANDEM_DRAFT_ACT");
        if (!kv || !*kv)
            assert_int_equal(dm->kv_type, TD_F16);
        if (!act || !*act)
            assert_true(dm->fc.x_bf16 && dm->lm_head.x_bf16 && dm->layers[0].down.x_bf16);
        assert_true(cm->kv_type == TD_F32 && !cm->fc.x_bf16 && !cm->lm_head.x_bf16);
        float *got[2], *twin[2];
        dfl_set_x_bf16(dm, true);
        dm->kv_type = TD_F16;
        two_steps(gpu, dm, g, feat, V, got);
        dfl_set_x_bf16(cm, true);
        cm->kv_type = TD_F16;
        two_steps(ops_backend_cpu(), cm, g, feat, V, twin);
        for (int step = 1; step <= 2; step++) {
            char name[64];
            snprintf(name, sizeof name, "step%d.logits", step);
            const float *want = golden_tensor(g, name, TD_F32, nl);
            int64_t at;
            const double r = golden_range_error(got[step - 1], want, nl, &at);
            const double c = golden_range_error(got[step - 1], twin[step - 1], nl, &at);
            worst_ref = r > worst_ref ? r : worst_ref;
            worst_cpu = c > worst_cpu ? c : worst_cpu;
            snprintf(what, sizeof what, "GPU %s %s (bf16 inputs)", drafters[k], name);
            expect_close(what, got[step - 1], want, nl, DFL_BF16_REF);
            snprintf(what, sizeof what, "GPU %s %s (bf16 inputs) against the CPU's",
                     drafters[k], name);
            expect_close(what, got[step - 1], twin[step - 1], nl, DFL_BF16_CPU);
            free(got[step - 1]);
            free(twin[step - 1]);
        }
        dfl_set_x_bf16(dm, false);
        for (int f16 = 1; f16 >= 0; f16--) {
            dm->kv_type = f16 ? TD_F16 : TD_F32;
            two_steps(gpu, dm, g, feat, V, got);
            for (int step = 1; step <= 2; step++) {
                char name[64];
                snprintf(name, sizeof name, "step%d.logits", step);
                snprintf(what, sizeof what, "GPU %s %s (%s context)", drafters[k], name,
                         f16 ? "f16" : "f32");
                expect_close(what, got[step - 1], golden_tensor(g, name, TD_F32, nl), nl,
                             f16 ? 1e-3 : 1e-4);
                free(got[step - 1]);
            }
        }
        gguf_close(g);
        dfl_free(dm);
        dfl_free(cm);
    }
    printf("GPU drafter with bf16 inputs: %.3g of the range from the reference at worst, %.3g "
           "from the CPU drafter with bf16 inputs\n",
           worst_ref, worst_cpu);
    tgt_free(tm);
    tgt_free(tc);
}

/* The context ring on the GPU (mf_dflash_ring_check): one store per slot also where a
 * call brings more positions than the ring holds; with exact and with bf16 inputs. */
static void test_gpu_dflash_ring_keeps_the_last_positions(void **ctx)
{
    (void)ctx;
    tgt_model *tm = load_target(gpu);
    dfl_model *dm = load_drafter(tm, "dflash-b16");
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        dfl_set_x_bf16(dm, bf16);
        mf_dflash_ring_check(tm, dm);
    }
    dfl_free(dm);
    tgt_free(tm);
}

/* Generates N_GEN tokens after prompt (plain decoding when dm is NULL). */
static spec_stats generate(const tgt_model *tm, const dfl_model *dm, const int32_t *prompt,
                           int64_t n_prompt, int32_t *out)
{
    const spec_cfg cfg = {.dm = dm, .n_ctx = 256, .block = 1};
    spec_stats st;
    if (mf_generate(tm, &cfg, prompt, n_prompt, N_GEN, out, &st) != TD_OK)
        fail_msg("generate: %s", err_msg());
    return st;
}

static void make_prompt(int p, int64_t V, int32_t *prompt, int64_t *n)
{
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(p + 1);
    *n = 3 + (p * 7) % 23;
    for (int64_t i = 0; i < *n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        prompt[i] = (int32_t)(x % (uint64_t)V);
    }
}

/* Greedy speculative generation on the GPU (drafts and acceptance on the device) gives the
 * tokens of plain greedy decoding on the GPU, for three drafters (blocks of 16 and 8, and
 * sliding-window layers) and several prompts, with exact drafter inputs (TANDEM_DRAFT_ACT=f32)
 * and with bf16 ones (a GPU's default; how many drafts each accepts is printed). */
static void test_gpu_spec_greedy_equals_plain_greedy(void **ctx)
{
    (void)ctx;
    tgt_model *tg = load_target(gpu), *tc = load_target(ops_backend_cpu());
    int64_t V = tg->hp.n_vocab, same_cpu = 0, total = 0, accepted = 0, drafted = 0;
    int64_t accepted_bf16 = 0;
    for (size_t k = 0; k < sizeof drafters / sizeof *drafters; k++) {
        dfl_model *dm = load_drafter(tg, drafters[k]);
        dfl_set_x_bf16(dm, false);
        for (int p = 0; p < N_PROMPTS; p++) {
            int32_t prompt[32], plain[N_GEN], spec[N_GEN], cpu[N_GEN];
            int64_t np;
            make_prompt(p, V, prompt, &np);
            generate(tg, NULL, prompt, np, plain);
            spec_stats st = generate(tg, dm, prompt, np, spec);
            for (int64_t i = 0; i < N_GEN; i++)
                if (plain[i] != spec[i])
                    fail_msg("%s prompt %d: token %lld differs (plain %d, speculative %d)",
                             drafters[k], p, (long long)i, plain[i], spec[i]);
            assert_int_equal(st.generated, st.steps + 1 + st.accepted);
            accepted += st.accepted;
            drafted += st.drafted;
            dfl_set_x_bf16(dm, true);
            st = generate(tg, dm, prompt, np, spec);
            dfl_set_x_bf16(dm, false);
            for (int64_t i = 0; i < N_GEN; i++)
                if (plain[i] != spec[i])
                    fail_msg("%s prompt %d, bf16 drafter inputs: token %lld differs (plain %d, "
                             "speculative %d)",
                             drafters[k], p, (long long)i, plain[i], spec[i]);
            accepted_bf16 += st.accepted;
            if (k == 0) {
                generate(tc, NULL, prompt, np, cpu);
                int64_t i = 0;
                while (i < N_GEN && cpu[i] == plain[i])
                    i++;
                same_cpu += i;
                total += N_GEN;
            }
        }
        dfl_free(dm);
    }
    printf("GPU speculative == GPU plain for %zu drafters x %d prompts; %lld of %lld drafts "
           "accepted (%lld with bf16 drafter inputs); GPU equals the CPU for the first %lld of "
           "%lld tokens (summed over prompts)\n",
           sizeof drafters / sizeof *drafters, N_PROMPTS, (long long)accepted,
           (long long)drafted, (long long)accepted_bf16, (long long)same_cpu, (long long)total);
    tgt_free(tc);
    tgt_free(tg);
}

/* N_GEN tokens after prompt under base, plainly (into plain) and with the drafter dm: the
 * same tokens. */
static void plain_equals_speculative(const tgt_model *tg, const spec_cfg *base,
                                     const dfl_model *dm, const char *name, int p,
                                     const int32_t *prompt, int64_t np, int32_t *plain)
{
    int32_t spec[N_GEN];
    spec_cfg cfg = *base;
    if (mf_generate(tg, &cfg, prompt, np, N_GEN, plain, NULL) != TD_OK)
        fail_msg("plain: %s", err_msg());
    cfg.dm = dm;
    if (mf_generate(tg, &cfg, prompt, np, N_GEN, spec, NULL) != TD_OK)
        fail_msg("speculative: %s", err_msg());
    for (int64_t i = 0; i < N_GEN; i++)
        if (plain[i] != spec[i])
            fail_msg("%s prompt %d: token %lld differs (plain %d, speculative %d)", name, p,
                     (long long)i, plain[i], spec[i]);
}

/* With presence/frequency penalties and a logit bias (added on the device, cuda_logit_add):
 * speculative greedy on the GPU still equals plain greedy on the GPU, and the penalties change
 * what is generated. */
static void test_gpu_spec_greedy_with_penalties_equals_plain_greedy(void **ctx)
{
    (void)ctx;
    tgt_model *tg = load_target(gpu);
    const int64_t V = tg->hp.n_vocab;
    const int32_t bias_tok[] = {11, 279, 42};
    const float bias[] = {3.5f, -4.0f, 1.25f};
    const spec_cfg base = {.n_ctx = 256, .block = 1,
                           .pen = {.presence = 0.5f, .frequency = 1.5f, .bias_tok = bias_tok,
                                   .bias = bias, .n_bias = 3}};
    int changed = 0;
    for (size_t k = 0; k < 2; k++) {
        dfl_model *dm = load_drafter(tg, drafters[k]);
        for (int p = 0; p < N_PROMPTS; p++) {
            int32_t prompt[32], plain[N_GEN], unpen[N_GEN];
            int64_t np;
            make_prompt(p, V, prompt, &np);
            plain_equals_speculative(tg, &base, dm, drafters[k], p, prompt, np, plain);
            if (k == 0) {
                generate(tg, NULL, prompt, np, unpen);
                changed += memcmp(plain, unpen, sizeof plain) != 0;
            }
        }
        dfl_free(dm);
    }
    assert_true(changed >= 1);
    tgt_free(tg);
}

/* out [n] is a viable prefix of a document of sc (complete where an end-of-generation token
 * came). */
static void expect_viable(const cst_vocab *voc, const tokenizer *tok, const jc_schema *sc,
                          const int32_t *out, int64_t n)
{
    void *st = malloc(jc_state_size(sc));
    jc_state_init(sc, st);
    for (int64_t i = 0; i < n; i++) {
        if (voc->eog[out[i] / 32] >> (out[i] % 32) & 1u) {
            assert_true(jc_done(sc, st));
            break;
        }
        const tok_str b = tok_bytes_of(tok, out[i]);
        if (!jc_feed(sc, st, (const uint8_t *)b.ptr, b.len))
            fail_msg("token %lld (%d) breaks the document", (long long)i, out[i]);
    }
    free(st);
}

/* A response format (masks applied on the device): speculative greedy on the GPU equals plain
 * greedy on the GPU, and both are documents of the schema. */
static void test_gpu_spec_greedy_with_a_format_equals_plain_greedy(void **ctx)
{
    (void)ctx;
    static const char schema[] =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"n\":"
        "{\"type\":\"integer\"}},\"required\":[\"name\",\"n\"],\"additionalProperties\":false}";
    tgt_model *tg = load_target(gpu);
    tokenizer *tok = NULL;
    cst_vocab voc;
    jc_schema *sc = NULL;
    if (tok_load_gguf(&tok, tg->file) != TD_OK || cst_vocab_init(&voc, tok, tg->hp.n_vocab) != TD_OK ||
        jc_compile(schema, sizeof schema - 1, &sc) != TD_OK)
        fail_msg("%s", err_msg());
    const spec_cfg base = {.n_ctx = 256, .block = 1, .vocab = &voc,
                           .cst = {.format = MSG_FORMAT_JSON_SCHEMA, .schema = schema,
                                   .n_schema = sizeof schema - 1, .think_start = -1,
                                   .think_end = -1}};
    for (size_t k = 0; k < 2; k++) {
        dfl_model *dm = load_drafter(tg, drafters[k]);
        for (int p = 0; p < N_PROMPTS; p++) {
            int32_t prompt[32], plain[N_GEN];
            int64_t np;
            make_prompt(p, tg->hp.n_vocab, prompt, &np);
            plain_equals_speculative(tg, &base, dm, drafters[k], p, prompt, np, plain);
            expect_viable(&voc, tok, sc, plain, N_GEN);
        }
        dfl_free(dm);
    }
    jc_schema_free(sc);
    cst_vocab_free(&voc);
    tok_free(tok);
    tgt_free(tg);
}

int main(void)
{
    if (!cuda_available() || ops_backend_cuda_init(&gpu, 0) != TD_OK) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_dflash_two_steps_match_reference),
        cmocka_unit_test(test_gpu_dflash_ring_keeps_the_last_positions),
        cmocka_unit_test(test_gpu_spec_greedy_equals_plain_greedy),
        cmocka_unit_test(test_gpu_spec_greedy_with_penalties_equals_plain_greedy),
        cmocka_unit_test(test_gpu_spec_greedy_with_a_format_equals_plain_greedy),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ops_backend_cuda_free(gpu);
    return rc;
}
