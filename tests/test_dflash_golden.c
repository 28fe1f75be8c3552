/* The DFlash drafter against the PyTorch reference of DESIGN section 7 (scripts/dflash_ref.py):
 * for three tiny drafters (full, sliding and non-causal sliding layers, embedding scale,
 * output multiplier, softcapping, default tap layers), two consecutive draft steps where the
 * second reuses the cached context K/V of the first and adds only the new positions; each
 * with the CPU's f32 context K/V and with the f16 one a GPU keeps (within 1e-3 of the range),
 * and as a GPU runs it by default, the f16 context and every product reading its inputs
 * rounded to bf16 (dfl_set_x_bf16; within 1e-2, and the rounding visible). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/support/model_fixture.h"
#include "tests/support/ops_golden.h"

#include "draftd/dflash.h"
#include "verifyd/target.h"

static const char *const drafters[] = {"dflash-b16", "dflash-b8", "dflash-swa"};


static void expect_close(const char *what, const float *got, const float *want, int64_t n,
                         double tol)
{
    int64_t at;
    double r = golden_range_error(got, want, n, &at);
    if (!(r <= tol))
        fail_msg("%s: error %.3g of the range at %lld (got %.6g, want %.6g) exceeds %.3g", what,
                 r, (long long)at, got[at], want[at], tol);
}

static void test_dflash_two_steps_match_reference(void **ctx)
{
    (void)ctx;
    tgt_model *tm;
    assert_int_equal(tgt_load(&tm, "tests/data/models/qwen35-tiny-f32.gguf"), TD_OK);
    int64_t V = tm->hp.n_vocab, H = tm->hp.n_embd;
    for (size_t k = 0; k < sizeof drafters / sizeof *drafters; k++) {
        char path[256], what[128];
        snprintf(path, sizeof path, "tests/data/drafter/%s", drafters[k]);
        dfl_model *dm;
        if (dfl_load(&dm, path, (uint32_t)tm->hp.n_layer, &tm->tok_embd, &tm->output) != TD_OK)
            fail_msg("%s: %s", path, err_msg());
        snprintf(path, sizeof path, "tests/data/golden/%s.gguf", drafters[k]);
        gguf_file *g = golden_open_path(path);
        uint32_t L1, L2, B;
        assert_int_equal(gguf_get_u32(g, "golden.step1.n_ctx", &L1), TD_OK);
        assert_int_equal(gguf_get_u32(g, "golden.step2.n_ctx", &L2), TD_OK);
        assert_int_equal(gguf_get_u32(g, "golden.block_size", &B), TD_OK);
        assert_int_equal(B, dm->cfg.block_size);
        int64_t nt = dm->cfg.n_taps;
        const int32_t *toks = golden_tensor(g, "context.tokens", TD_I32, L2);
        const float *feat = golden_tensor(g, "features", TD_F32, (int64_t)L2 * nt * H);

        /* The features the target computes for these tokens are the golden ones. */
        tgt_state ts;
        assert_int_equal(tgt_state_init(&ts, tm, L2), TD_OK);
        int32_t taps[64];
        for (int64_t i = 0; i < nt; i++)
            taps[i] = (int32_t)dm->cfg.target_layer_ids[i];
        float *ours = malloc((size_t)(L2 * nt * H) * sizeof(float));
        tgt_out o = {.taps = taps, .n_taps = nt, .tap_out = ours};
        assert_int_equal(tgt_forward(tm, &ts, toks, L2, false, &o), TD_OK);
        snprintf(what, sizeof what, "%s target features", drafters[k]);
        expect_close(what, ours, feat, (int64_t)L2 * nt * H, 1e-4);
        tgt_state_free(&ts);
        free(ours);

        /* The CPU's f32 context, the f16 one of a GPU (rounded once when stored), and that
         * with the inputs of every product rounded to bf16 (a GPU's default). */
        assert_int_equal(dm->kv_type, TD_F32);
        assert_false(dm->fc.x_bf16 || dm->lm_head.x_bf16 || dm->layers[0].wq.x_bf16);
        for (int mode = 0; mode <= 2; mode++) {
            const int f16 = mode >= 1, bf16 = mode == 2;
            dm->kv_type = f16 ? TD_F16 : TD_F32;
            dfl_set_x_bf16(dm, bf16);
            dfl_state ds;
            assert_int_equal(dfl_state_init(&ds, dm, 64), TD_OK);
            assert_int_equal(ds.kv_type, dm->kv_type);
            float *logits = malloc((size_t)((B - 1) * V) * sizeof(float));
            uint32_t at = 0;
            for (int step = 1; step <= 2; step++) {
                uint32_t L = step == 1 ? L1 : L2;
                assert_int_equal(dfl_add_context(dm, &ds, feat + (int64_t)at * nt * H, L - at),
                                 TD_OK);
                at = L;
                char name[64];
                snprintf(name, sizeof name, "step%d.block", step);
                const int32_t *block = golden_tensor(g, name, TD_I32, B);
                assert_int_equal(dfl_propose(dm, &ds, block[0], B - 1, logits), TD_OK);
                snprintf(name, sizeof name, "step%d.logits", step);
                snprintf(what, sizeof what, "%s %s (%s context%s)", drafters[k], name,
                         f16 ? "f16" : "f32", bf16 ? ", bf16 inputs" : "");
                const float *want = golden_tensor(g, name, TD_F32, (int64_t)(B - 1) * V);
                expect_close(what, logits, want, (int64_t)(B - 1) * V,
                             bf16 ? 1e-2 : f16 ? 1e-3 : 1e-4);
                int64_t where; /* and the f16 context / bf16 inputs are: their rounding shows */
                const double r = golden_range_error(logits, want, (B - 1) * V, &where);
                if (f16 && !(r > (bf16 ? 1e-4 : 1e-6)))
                    fail_msg("%s: no trace of the rounding (%.3g of the range)", what, r);
                if (bf16)
                    printf("%s: %.3g of the range\n", what, r);
            }
            free(logits);
            dfl_state_free(&ds);
        }
        gguf_close(g);
        dfl_free(dm);
    }
    tgt_free(tm);
}

/* The context ring on the CPU (mf_dflash_ring_check). */
static void test_dflash_ring_keeps_the_last_positions(void **ctx)
{
    (void)ctx;
    tgt_model *tm;
    assert_int_equal(tgt_load(&tm, "tests/data/models/qwen35-tiny-f32.gguf"), TD_OK);
    dfl_model *dm;
    assert_int_equal(dfl_load(&dm, "tests/data/drafter/dflash-b16", (uint32_t)tm->hp.n_layer,
                              &tm->tok_embd, &tm->output),
                     TD_OK);
    mf_dflash_ring_check(tm, dm);
    dfl_free(dm);
    tgt_free(tm);
}

/* A drafter asked to pair with a target of another width or a vocabulary without its mask
 * token is refused with a message naming the mismatch. */
static void test_dflash_refuses_mismatched_target(void **ctx)
{
    (void)ctx;
    tgt_model *tm;
    assert_int_equal(tgt_load(&tm, "tests/data/models/qwen3-tiny-f32.gguf"), TD_OK);
    dfl_model *dm = NULL;
    assert_int_not_equal(dfl_load(&dm, "tests/data/drafter/dflash-b16", (uint32_t)tm->hp.n_layer,
                                  &tm->tok_embd, &tm->output), TD_OK);
    assert_null(dm);
    assert_non_null(strstr(err_msg(), "dflash-b16"));
    assert_int_not_equal(dfl_load(&dm, "tests/data/drafter/no-such-drafter", 8, &tm->tok_embd,
                                  &tm->output), TD_OK);
    assert_non_null(strstr(err_msg(), "no-such-drafter"));
    tgt_free(tm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dflash_two_steps_match_reference),
        cmocka_unit_test(test_dflash_ring_keeps_the_last_positions),
        cmocka_unit_test(test_dflash_refuses_mismatched_target),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
