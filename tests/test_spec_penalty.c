/* Logit bias, presence/frequency penalties, allowed tokens and bad words (verifyd/penalty.h):
 * the exact additions a verify block's rows get (the drafts before a row count as emitted),
 * and generation with them: greedy output with a DFlash drafter equals plain decoding with the penalties applied
 * by hand to the target's logits, a bias of +100 forces its token, the penalties change what
 * is generated, and sampled output follows the target's penalised distribution. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/support/chi_square.h"
#include "tests/support/model_fixture.h"
#include "tests/support/tmp_dir.h"
#include "verifyd/penalty.h"
#include "verifyd/spec.h"



#define MODEL_PATH "tests/data/models/qwen35-tiny-f32.gguf"

/* --- the additions themselves ------------------------------------------------------------ */

#define V 10

static void expect_row(const float *row, const float *want, int r)
{
    for (int t = 0; t < V; t++)
        if (row[t] != want[t])
            fail_msg("row %d token %d: %.9g, expected %.9g", r, t, (double)row[t],
                     (double)want[t]);
}

static void test_rows_count_the_drafts_before_them(void **ctx)
{
    (void)ctx;
    const ops_backend *be = ops_backend_cpu();
    const int32_t bias_tok[] = {7, 3};
    const float bias[] = {-2.0f, 1.5f};
    pen_cfg cfg = {.presence = 0.5f, .frequency = 0.25f, .bias_tok = bias_tok, .bias = bias,
                   .n_bias = 2};
    pen_state p;
    assert_int_equal(pen_init(&p, &cfg, V), TD_OK);
    const int32_t emitted[] = {3, 3, 5, -1, V};
    assert_int_equal(pen_emit(&p, emitted, 5), TD_OK);
    float lg[5 * V];
    for (int i = 0; i < 5 * V; i++)
        lg[i] = 0.125f * (float)i;
    float want[5][V];
    for (int r = 0; r < 5; r++)
        for (int t = 0; t < V; t++)
            want[r][t] = lg[r * V + t];
    /* row 0: 3 twice (1.5 - (0.5 + 2 * 0.25)), 5 once (-(0.5 + 0.25)), 7 biased; row 1 after
     * draft 5: 5 twice; row 2 after draft 9; row 3 after an id outside the vocabulary (it
     * counts as nothing); row 4 after draft 5 again: three times */
    const float add5[5] = {-0.75f, -1.0f, -1.0f, -1.0f, -1.25f};
    for (int r = 0; r < 5; r++) {
        want[r][3] += 0.5f;
        want[r][5] += add5[r];
        want[r][7] += -2.0f;
        if (r >= 2)
            want[r][9] += -0.75f;
    }
    const int32_t drafts[] = {5, 9, V + 3, 5};
    assert_int_equal(pen_apply(&p, be, lg, drafts, 5), TD_OK);
    for (int r = 0; r < 5; r++)
        expect_row(lg + r * V, want[r], r);

    /* the drafts were only for those rows: one row now gets row 0's additions again */
    float one[V] = {0}, want1[V] = {0};
    want1[3] = 0.5f;
    want1[5] = -0.75f;
    want1[7] = -2.0f;
    assert_int_equal(pen_apply(&p, be, one, NULL, 1), TD_OK);
    expect_row(one, want1, 0);

    /* emitting 9 makes it count; a reset forgets every emission but keeps the bias */
    const int32_t nine = 9;
    assert_int_equal(pen_emit(&p, &nine, 1), TD_OK);
    memset(one, 0, sizeof one);
    want1[9] = -0.75f;
    assert_int_equal(pen_apply(&p, be, one, NULL, 1), TD_OK);
    expect_row(one, want1, 0);
    assert_int_equal(pen_start(&p, NULL, 0), TD_OK);
    memset(one, 0, sizeof one);
    memset(want1, 0, sizeof want1);
    want1[3] = 1.5f;
    want1[7] = -2.0f;
    assert_int_equal(pen_apply(&p, be, one, NULL, 1), TD_OK);
    expect_row(one, want1, 0);
    pen_free(&p, be);

    /* a penalty that cancels a bias exactly adds nothing; a negative penalty raises */
    const int32_t t2[] = {2};
    const float b2[] = {0.75f};
    cfg = (pen_cfg){.presence = 0.5f, .frequency = 0.25f, .bias_tok = t2, .bias = b2,
                    .n_bias = 1};
    assert_int_equal(pen_init(&p, &cfg, V), TD_OK);
    assert_int_equal(pen_emit(&p, t2, 1), TD_OK);
    memset(one, 0, sizeof one);
    memset(want1, 0, sizeof want1);
    assert_int_equal(pen_apply(&p, be, one, NULL, 1), TD_OK);
    expect_row(one, want1, 0);
    pen_free(&p, be);
    cfg = (pen_cfg){.presence = -1.0f, .frequency = -0.5f};
    assert_int_equal(pen_init(&p, &cfg, V), TD_OK);
    assert_int_equal(pen_emit(&p, t2, 1), TD_OK);
    assert_int_equal(pen_emit(&p, t2, 1), TD_OK);
    want1[2] = 2.0f;
    assert_int_equal(pen_apply(&p, be, one, NULL, 1), TD_OK);
    expect_row(one, want1, 0);
    pen_free(&p, be);
}

/* The repetition penalty scales the logits of the prompt's and the emitted tokens (divides a
 * positive one, multiplies a negative one) before the bias and the count penalties; the stop
 * tokens get -inf in every row before min_tokens were emitted, the drafts before a row
 * counting. */
static void test_repetition_and_min_tokens_rows(void **ctx)
{
    (void)ctx;
    const ops_backend *be = ops_backend_cpu();
    const int32_t bias_tok[] = {6, 1};
    const float bias[] = {1.5f, 0.25f};
    const int32_t stop[] = {9, 4, 9, -1, V};
    pen_cfg cfg = {.presence = 0.5f, .bias_tok = bias_tok, .bias = bias, .n_bias = 2,
                   .repetition = 2.0f, .min_tokens = 3, .stop = stop, .n_stop = 5};
    pen_state p;
    assert_int_equal(pen_init(&p, &cfg, V), TD_OK);
    const int32_t prompt[] = {1, 2, 2, -3, V + 1};
    assert_int_equal(pen_start(&p, prompt, 5), TD_OK);
    const int32_t five = 5;
    assert_int_equal(pen_emit(&p, &five, 1), TD_OK); /* one emitted: rows 0, 1 are short */
    float lg[3 * V], want[3][V];
    for (int r = 0; r < 3; r++)
        for (int t = 0; t < V; t++)
            lg[r * V + t] = want[r][t] = (t % 2 ? 1.0f : -1.0f) * (0.5f + (float)t);
    for (int r = 0; r < 3; r++) {
        /* prompt tokens 1 (biased) and 2 scaled; 5 emitted: scaled and penalised; 6 biased */
        want[r][1] = want[r][1] / 2.0f + 0.25f;
        want[r][2] = want[r][2] * 2.0f;
        want[r][5] = want[r][5] / 2.0f - 0.5f;
        want[r][6] += 1.5f;
        if (r < 2)
            want[r][4] = want[r][9] = -INFINITY;
    }
    want[1][8] *= 2.0f; /* draft 8 before row 1: scaled and penalised, then 0 before row 2 */
    want[1][8] -= 0.5f;
    want[2][8] = want[2][8] * 2.0f - 0.5f;
    want[2][0] = want[2][0] * 2.0f - 0.5f;
    const int32_t drafts[] = {8, 0};
    assert_int_equal(pen_apply(&p, be, lg, drafts, 3), TD_OK);
    for (int r = 0; r < 3; r++)
        expect_row(lg + r * V, want[r], r);
    /* a new prompt: the old one no longer scales */
    const int32_t prompt2[] = {3};
    assert_int_equal(pen_start(&p, prompt2, 1), TD_OK);
    float one[V], want1[V];
    for (int t = 0; t < V; t++)
        one[t] = want1[t] = 3.0f;
    want1[3] = 1.5f;
    want1[1] = 3.25f;
    want1[6] = 4.5f;
    want1[4] = want1[9] = -INFINITY; /* nothing emitted again */
    assert_int_equal(pen_apply(&p, be, one, NULL, 1), TD_OK);
    expect_row(one, want1, 0);
    pen_free(&p, be);
}

static void test_nothing_asked_adds_nothing_and_bad_settings_are_refused(void **ctx)
{
    (void)ctx;
    const ops_backend *be = ops_backend_cpu();
    pen_cfg none = {0};
    pen_state p;
    assert_int_equal(pen_init(&p, &none, V), TD_OK);
    assert_false(p.on);
    const int32_t tok[] = {1, 2, 3};
    assert_int_equal(pen_emit(&p, tok, 3), TD_OK);
    float lg[V] = {0};
    assert_int_equal(pen_apply(&p, be, lg, NULL, 1), TD_OK);
    for (int t = 0; t < V; t++)
        assert_true(lg[t] == 0.0f);
    assert_null(p.dev);
    pen_free(&p, be);

    const int32_t out_of_vocab[] = {V};
    const float one[] = {1.0f}, nan[] = {NAN};
    pen_cfg bad = {.bias_tok = out_of_vocab, .bias = one, .n_bias = 1};
    assert_int_equal(pen_init(&p, &bad, V), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "outside the vocabulary"));
    const int32_t negative[] = {-1};
    bad.bias_tok = negative;
    assert_int_equal(pen_init(&p, &bad, V), TD_EINVAL);
    bad.bias_tok = tok;
    bad.bias = nan;
    assert_int_equal(pen_init(&p, &bad, V), TD_EINVAL);
    bad = (pen_cfg){.presence = INFINITY};
    assert_int_equal(pen_init(&p, &bad, V), TD_EINVAL);
    const int32_t twice[] = {4, 2, 4};
    const float three[] = {1.0f, 2.0f, 3.0f};
    bad = (pen_cfg){.bias_tok = twice, .bias = three, .n_bias = 3};
    assert_int_equal(pen_init(&p, &bad, V), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "token 4: given twice"));
    bad = (pen_cfg){.allowed = out_of_vocab, .n_allowed = 1};
    assert_int_equal(pen_init(&p, &bad, V), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "allowed token 10: outside the vocabulary"));

    /* an allowed set: every other token of every row gets -inf, the biases still add */
    const int32_t allowed[] = {2, 7, 2};
    const int32_t seven[] = {7};
    const float half[] = {0.5f};
    pen_cfg only = {.allowed = allowed, .n_allowed = 3, .bias_tok = seven, .bias = half,
                    .n_bias = 1};
    assert_int_equal(pen_init(&p, &only, V), TD_OK);
    assert_true(p.on);
    float rows[2][V];
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < V; t++)
            rows[r][t] = (float)t;
    const int32_t drafts[] = {2};
    assert_int_equal(pen_apply(&p, be, &rows[0][0], drafts, 2), TD_OK);
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < V; t++)
            assert_true(t == 2   ? rows[r][t] == 2.0f
                        : t == 7 ? rows[r][t] == 7.5f
                                 : rows[r][t] == -INFINITY);
    pen_free(&p, be);
}

/* Bad words (vLLM's): a one-token word is refused on every row; a longer one's last token is
 * refused where what was generated before the row (the history, then the block's drafts) ends
 * with its other tokens, and only there; a token refused by two words is one entry. Bad
 * words whose lengths do not fit, or with ids outside the vocabulary, are refused. */
static void test_bad_words_refuse_their_last_token_after_the_rest(void **ctx)
{
    (void)ctx;
    const ops_backend *be = ops_backend_cpu();
    /* [7], [2 3], [1 2 3] (3 twice), [4 5 6] */
    const int32_t bad[] = {1, 7, 2, 2, 3, 3, 1, 2, 3, 3, 4, 5, 6};
    pen_cfg cfg = {.bad = bad, .n_bad = 13};
    pen_state p;
    assert_int_equal(pen_init(&p, &cfg, V), TD_OK);
    assert_int_equal(pen_start(&p, NULL, 0), TD_OK);
    const int32_t gen[] = {9, 1, 4};
    assert_int_equal(pen_emit(&p, gen, 3), TD_OK); /* history ... 1 4 */
    /* rows after drafts 5, 2, 8: row 0 (..1 4) nothing; row 1 (..4 5) refuses 6; row 2
     * (..5 2) refuses 3; row 3 (..2 8) nothing; 7 refused everywhere */
    float lg[4 * V], want[4][V];
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < V; t++)
            lg[r * V + t] = want[r][t] = (float)(t + 10 * r);
    for (int r = 0; r < 4; r++)
        want[r][7] = -INFINITY;
    want[1][6] = -INFINITY;
    want[2][3] = -INFINITY;
    const int32_t drafts[] = {5, 2, 8};
    assert_int_equal(pen_apply(&p, be, lg, drafts, 4), TD_OK);
    for (int r = 0; r < 4; r++)
        expect_row(lg + r * V, want[r], r);
    /* history ... 1 2: one row refuses 3 (two words end there) and 7 */
    const int32_t two = 2;
    assert_int_equal(pen_emit(&p, &two, 1), TD_OK);
    float one[V], want1[V];
    for (int t = 0; t < V; t++)
        one[t] = want1[t] = 1.0f;
    want1[3] = want1[7] = -INFINITY;
    assert_int_equal(pen_apply(&p, be, one, NULL, 1), TD_OK);
    expect_row(one, want1, 0);
    /* a new generation forgets the history */
    assert_int_equal(pen_start(&p, NULL, 0), TD_OK);
    for (int t = 0; t < V; t++)
        one[t] = want1[t] = 1.0f;
    want1[7] = -INFINITY;
    assert_int_equal(pen_apply(&p, be, one, NULL, 1), TD_OK);
    expect_row(one, want1, 0);
    pen_free(&p, be);

    const int32_t overrun[] = {2, 3}, zero[] = {0, 3}, outside[] = {1, V};
    const pen_cfg bads[] = {{.bad = overrun, .n_bad = 2}, {.bad = zero, .n_bad = 2},
                            {.bad = outside, .n_bad = 2}};
    for (int k = 0; k < 3; k++)
        assert_int_equal(pen_init(&p, &bads[k], V), TD_EINVAL);
}

#undef V

/* --- generation ----------------------------------------------------------------------------- */

static char tmpdir[64];

static int setup_dir(void **ctx)
{
    (void)ctx;
    return tmp_dir_make(tmpdir, sizeof tmpdir, "tandem-pen") ? 0 : -1;
}

static int remove_dir(void **ctx)
{
    (void)ctx;
    return tmp_dir_remove(tmpdir) ? 0 : -1;
}

/* n tokens after prompt through spec (with the drafter dm, or plain when NULL). */
static void generate(const tgt_model *tm, const dfl_model *dm, const int32_t *prompt,
                     int64_t n_prompt, int64_t n, const ops_sampler *smp, const pen_cfg *pen,
                     int32_t *out)
{
    const spec_cfg cfg = {.dm = dm, .n_ctx = 256, .block = 1, .sampler = *smp, .pen = *pen};
    if (mf_generate(tm, &cfg, prompt, n_prompt, n, out, NULL) != TD_OK)
        fail_msg("generate: %s", err_msg());
}

/* The penalties applied by hand to a row of logits lg [nv]: the repetition penalty to the
 * prompt's and the generated tokens (in_prompt, count), then bias - (presence + frequency *
 * count) for a generated token (computed as fmaf), the bias for the others; -inf for the stop
 * tokens while fewer than min_tokens were generated. */
static void add_by_hand(float *lg, int64_t nv, const float *bias, const int *count,
                        const uint8_t *in_prompt, int64_t generated, const pen_cfg *pen)
{
    for (int64_t t = 0; t < nv; t++) {
        const float add = count[t] ? bias[t] - fmaf(pen->frequency, (float)count[t],
                                                     pen->presence)
                                   : bias[t];
        const float rep = pen->repetition == 0.0f ? 1.0f : pen->repetition;
        if (rep != 1.0f && (count[t] || in_prompt[t]))
            lg[t] = lg[t] > 0 ? lg[t] / rep : lg[t] * rep;
        if (add != 0.0f)
            lg[t] += add;
    }
    for (int32_t i = 0; generated < pen->min_tokens && i < pen->n_stop; i++)
        lg[pen->stop[i]] = -INFINITY;
}

/* Plain greedy decoding with the penalties applied by hand to each row of target logits. */
static void reference(const tgt_model *tm, const int32_t *prompt, int64_t n_prompt, int64_t n,
                      const pen_cfg *pen, int32_t *out)
{
    const int64_t nv = tm->hp.n_vocab;
    tgt_state st;
    assert_int_equal(tgt_state_init(&st, tm, 256), TD_OK);
    float *lg = malloc((size_t)nv * sizeof *lg), *bias = calloc((size_t)nv, sizeof *bias);
    int *count = calloc((size_t)nv, sizeof *count);
    uint8_t *in_prompt = calloc((size_t)nv, 1);
    assert_non_null(lg);
    assert_non_null(bias);
    assert_non_null(count);
    assert_non_null(in_prompt);
    for (int32_t i = 0; i < pen->n_bias; i++)
        bias[pen->bias_tok[i]] = pen->bias[i];
    for (int64_t i = 0; i < n_prompt; i++)
        in_prompt[prompt[i]] = 1;
    tgt_out o = {.logits = lg, .last_only = true};
    assert_int_equal(tgt_forward(tm, &st, prompt, n_prompt, false, &o), TD_OK);
    for (int64_t k = 0; k < n; k++) {
        add_by_hand(lg, nv, bias, count, in_prompt, k, pen);
        out[k] = (int32_t)cpu_argmax(lg, nv);
        count[out[k]]++;
        assert_int_equal(tgt_forward(tm, &st, &out[k], 1, false, &o), TD_OK);
    }
    tgt_state_free(&st);
    free(lg);
    free(bias);
    free(count);
    free(in_prompt);
}

static void test_speculative_greedy_with_penalties_equals_plain_decoding(void **ctx)
{
    (void)ctx;
    tgt_model *tm;
    assert_int_equal(tgt_load(&tm, MODEL_PATH), TD_OK);
    const mf_drafter shapes[] = {{8, 1, false, 7, false}, {16, 2, false, 5, true}};
    dfl_model *dm[2];
    for (int k = 0; k < 2; k++) {
        char name[32];
        snprintf(name, sizeof name, "d%d", k);
        dm[k] = mf_drafter_in(tmpdir, name, tm, &shapes[k], 300 + (uint64_t)k);
    }
    const int32_t bias_tok[] = {11, 279, 42};
    const float bias[] = {3.5f, -4.0f, 1.25f};
    const int32_t stop[] = {279, 20};
    const pen_cfg pens[] = {
        {.presence = 1.5f, .frequency = 0.5f},
        {.frequency = 2.0f, .bias_tok = bias_tok, .bias = bias, .n_bias = 3},
        {.presence = -0.75f, .frequency = 0.25f, .bias_tok = bias_tok, .bias = bias,
         .n_bias = 2},
        {.repetition = 1.8f},
        {.repetition = 0.7f, .presence = 0.5f, .bias_tok = bias_tok, .bias = bias, .n_bias = 3},
        {.min_tokens = 20, .stop = stop, .n_stop = 2},
    };
    const pen_cfg none = {0};
    ops_sampler greedy = {0};
    const int64_t n = 32;
    int changed[sizeof pens / sizeof *pens] = {0};
    for (int p = 0; p < 3; p++) {
        const int32_t prompt[5] = {10 + 7 * p, 20, 279, 40 + p, 279};
        int32_t plain[64], spec[64], ref[64], unpen[64];
        generate(tm, NULL, prompt, 5, n, &greedy, &none, unpen);
        for (size_t c = 0; c < sizeof pens / sizeof *pens; c++) {
            reference(tm, prompt, 5, n, &pens[c], ref);
            generate(tm, NULL, prompt, 5, n, &greedy, &pens[c], plain);
            for (int k = 0; k < 2; k++) {
                generate(tm, dm[k], prompt, 5, n, &greedy, &pens[c], spec);
                for (int64_t i = 0; i < n; i++)
                    if (ref[i] != plain[i] || ref[i] != spec[i])
                        fail_msg("prompt %d penalties %zu drafter %d: token %lld: by hand %d, "
                                 "plain %d, speculative %d",
                                 p, c, k, (long long)i, ref[i], plain[i], spec[i]);
            }
            changed[c] += memcmp(ref, unpen, (size_t)n * sizeof *ref) != 0;
        }
    }
    /* the penalties must matter on these prompts (the tiny model repeats itself) */
    for (size_t c = 0; c < sizeof pens / sizeof *pens; c++)
        if (changed[c] == 0)
            fail_msg("penalties %zu changed nothing on any prompt", c);
    for (int k = 0; k < 2; k++)
        dfl_free(dm[k]);
    tgt_free(tm);
}

static void test_a_bias_of_100_forces_its_token_greedy_and_sampled(void **ctx)
{
    (void)ctx;
    tgt_model *tm;
    assert_int_equal(tgt_load(&tm, MODEL_PATH), TD_OK);
    mf_drafter ds = {8, 1, false, 9, false};
    dfl_model *dm = mf_drafter_in(tmpdir, "force", tm, &ds, 77);
    const int32_t tok[] = {123};
    const float up[] = {100.0f};
    const pen_cfg force = {.bias_tok = tok, .bias = up, .n_bias = 1};
    const int32_t prompt[3] = {5, 6, 7};
    const ops_sampler smps[] = {{0}, {.temperature = 1.0f, .top_p = 1.0f, .seed = 99}};
    for (int s = 0; s < 2; s++)
        for (int with = 0; with < 2; with++) {
            int32_t out[24];
            generate(tm, with ? dm : NULL, prompt, 3, 24, &smps[s], &force, out);
            for (int i = 0; i < 24; i++)
                if (out[i] != 123)
                    fail_msg("%s, %s drafter: token %d is %d, not the forced 123",
                             s ? "sampled" : "greedy", with ? "with" : "without", i, out[i]);
        }
    dfl_free(dm);
    tgt_free(tm);
}

/* allowed_token_ids: greedy and sampled, with and without the drafter, every token is one of
 * the set; greedy speculative output equals plain. */
static void test_allowed_tokens_are_the_only_ones_chosen(void **ctx)
{
    (void)ctx;
    tgt_model *tm;
    assert_int_equal(tgt_load(&tm, MODEL_PATH), TD_OK);
    mf_drafter ds = {8, 1, false, 9, false};
    dfl_model *dm = mf_drafter_in(tmpdir, "allow", tm, &ds, 78);
    const int32_t allowed[] = {11, 279, 300, 4};
    const pen_cfg only = {.allowed = allowed, .n_allowed = 4};
    const int32_t prompt[3] = {5, 6, 7};
    const ops_sampler smps[] = {{0}, {.temperature = 1.0f, .top_p = 1.0f, .seed = 99}};
    for (int s = 0; s < 2; s++) {
        int32_t out[2][24];
        for (int with = 0; with < 2; with++) {
            generate(tm, with ? dm : NULL, prompt, 3, 24, &smps[s], &only, out[with]);
            for (int i = 0; i < 24; i++)
                if (out[with][i] != 11 && out[with][i] != 279 && out[with][i] != 300 &&
                    out[with][i] != 4)
                    fail_msg("token %d is %d, not an allowed one", i, out[with][i]);
        }
        if (s == 0)
            assert_memory_equal(out[0], out[1], sizeof out[0]);
    }
    dfl_free(dm);
    tgt_free(tm);
}

/* Generation with bad words: greedy with the drafter equals plain decoding, a two-token
 * sequence the unconstrained output holds never appears with the word refused, and a
 * one-token word never appears at all (also sampled). */
static void test_bad_words_never_appear_in_the_output(void **ctx)
{
    (void)ctx;
    tgt_model *tm;
    assert_int_equal(tgt_load(&tm, MODEL_PATH), TD_OK);
    mf_drafter ds = {8, 1, false, 9, false};
    dfl_model *dm = mf_drafter_in(tmpdir, "bad", tm, &ds, 79);
    const int32_t prompt[3] = {5, 6, 7};
    const ops_sampler greedy = {0};
    const pen_cfg none = {0};
    enum { N = 32 };
    int32_t free_out[N];
    generate(tm, NULL, prompt, 3, N, &greedy, &none, free_out);
    int at = 1; /* a pair the free output holds: it must go */
    while (at < N && free_out[at] == free_out[at - 1])
        at++;
    assert_true(at < N);
    const int32_t bad[] = {2, free_out[at - 1], free_out[at], 1, free_out[0]};
    const pen_cfg cfg = {.bad = bad, .n_bad = 5};
    const ops_sampler smps[] = {{0}, {.temperature = 1.0f, .top_p = 1.0f, .seed = 5}};
    for (int s = 0; s < 2; s++) {
        int32_t out[2][N];
        for (int with = 0; with < 2; with++) {
            generate(tm, with ? dm : NULL, prompt, 3, N, &smps[s], &cfg, out[with]);
            for (int i = 0; i < N; i++) {
                if (out[with][i] == free_out[0])
                    fail_msg("token %d is the one-token bad word %d", i, free_out[0]);
                if (i > 0 && out[with][i - 1] == bad[1] && out[with][i] == bad[2])
                    fail_msg("tokens %d, %d are the bad word %d %d", i - 1, i, bad[1], bad[2]);
            }
        }
        if (s == 0)
            assert_memory_equal(out[0], out[1], sizeof out[0]);
    }
    dfl_free(dm);
    tgt_free(tm);
}

/* The target's penalised p(t3 | prompt, t1, t2) under smp, into p [nv]. */
static void penalised_p(const tgt_model *tm, const int32_t *prompt, int32_t t1, int32_t t2,
                        const float *bias, const pen_cfg *pen, const ops_sampler *smp,
                        double *p)
{
    const int64_t nv = tm->hp.n_vocab;
    tgt_state st;
    assert_int_equal(tgt_state_init(&st, tm, 8), TD_OK);
    const int32_t ctx5[5] = {prompt[0], prompt[1], prompt[2], t1, t2};
    float *lg = malloc((size_t)nv * sizeof *lg), *pf = malloc((size_t)nv * sizeof *pf);
    int *count = calloc((size_t)nv, sizeof *count);
    assert_non_null(lg);
    assert_non_null(pf);
    assert_non_null(count);
    tgt_out o = {.logits = lg, .last_only = true};
    assert_int_equal(tgt_forward(tm, &st, ctx5, 5, false, &o), TD_OK);
    count[t1]++;
    count[t2]++;
    uint8_t *in_prompt = calloc((size_t)nv, 1);
    assert_non_null(in_prompt);
    for (int i = 0; i < 3; i++)
        in_prompt[prompt[i]] = 1;
    add_by_hand(lg, nv, bias, count, in_prompt, 2, pen);
    free(in_prompt);
    assert_int_equal(cpu_sample_probs(pf, lg, nv, smp), TD_OK);
    for (int64_t i = 0; i < nv; i++)
        p[i] = pf[i];
    tgt_state_free(&st);
    free(lg), free(pf), free(count);
}

/* Sampling at temperature 0.7 with top-k 12 and penalties, with a drafter that always
 * proposes 279 against a target that repeats 279 readily: where the second token is 279 it
 * was an accepted draft, and the third token came from the row after it in the same block
 * (the draft counted as generated). Over many seeds those third tokens follow the target's
 * penalised p(t3 | prompt, t1, 279), averaged over the runs' t1 (chi-square, p > 1e-4). */
static void test_sampling_with_penalties_keeps_the_penalised_distribution(void **ctx)
{
    (void)ctx;
    char path[160];
    snprintf(path, sizeof path, "%s/scaled.gguf", tmpdir);
    if (mf_target_write_scaled(path, MODEL_PATH, 279, 5.0f) != TD_OK)
        fail_msg("%s: %s", path, err_msg());
    tgt_model *tm;
    assert_int_equal(tgt_load(&tm, path), TD_OK);
    const int64_t nv = tm->hp.n_vocab;
    mf_drafter ds = {4, 1, true, 279, false};
    dfl_model *dm = mf_drafter_in(tmpdir, "sampling", tm, &ds, 4242);
    const int32_t bias_tok[] = {300, 301};
    const float bias[] = {1.5f, -0.5f};
    const pen_cfg pen = {.presence = 0.75f, .frequency = 1.25f, .bias_tok = bias_tok,
                         .bias = bias, .n_bias = 2};
    const ops_sampler smp = {.temperature = 0.7f, .top_k = 12, .top_p = 1.0f};
    const int32_t prompt[3] = {100, 279, 300};
    const int runs = 2000;
    int *by_t1 = calloc((size_t)nv, sizeof *by_t1), *c3 = calloc((size_t)nv, sizeof *c3);
    double *expect = calloc((size_t)nv, sizeof *expect), *p = malloc((size_t)nv * sizeof *p);
    float *bias_all = calloc((size_t)nv, sizeof *bias_all);
    assert_true(by_t1 && c3 && expect && p && bias_all);
    int total = 0;
    for (int r = 0; r < runs; r++) {
        spec_cfg cfg = {.dm = dm, .n_ctx = 64, .block = 1, .sampler = smp, .pen = pen};
        cfg.sampler.seed = (uint64_t)r * 7919 + 3;
        int32_t t[3];
        if (mf_generate(tm, &cfg, prompt, 3, 3, t, NULL) != TD_OK)
            fail_msg("run %d: %s", r, err_msg());
        if (t[1] != 279)
            continue;
        by_t1[t[0]]++;
        c3[t[2]]++;
        total++;
    }
    assert_true(total >= 200);
    bias_all[300] = 1.5f;
    bias_all[301] = -0.5f;
    for (int32_t t1 = 0; t1 < nv; t1++) {
        if (!by_t1[t1])
            continue;
        penalised_p(tm, prompt, t1, 279, bias_all, &pen, &smp, p);
        for (int64_t i = 0; i < nv; i++)
            expect[i] += p[i] * by_t1[t1] / total;
    }
    const double pv = chi_square_p(c3, expect, nv, total);
    if (!(pv > 1e-4))
        fail_msg("p-value %.3g for the third token after an accepted draft over %d runs", pv,
                 total);
    free(by_t1), free(c3), free(expect), free(p), free(bias_all);
    dfl_free(dm);
    tgt_free(tm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_count_the_drafts_before_them),
        cmocka_unit_test(test_repetition_and_min_tokens_rows),
        cmocka_unit_test(test_nothing_asked_adds_nothing_and_bad_settings_are_refused),
        cmocka_unit_test(test_speculative_greedy_with_penalties_equals_plain_decoding),
        cmocka_unit_test(test_a_bias_of_100_forces_its_token_greedy_and_sampled),
        cmocka_unit_test(test_allowed_tokens_are_the_only_ones_chosen),
        cmocka_unit_test(test_bad_words_refuse_their_last_token_after_the_rest),
        cmocka_unit_test(test_bad_words_never_appear_in_the_output),
        cmocka_unit_test(test_sampling_with_penalties_keeps_the_penalised_distribution),
    };
    return cmocka_run_group_tests(tests, setup_dir, remove_dir);
}
