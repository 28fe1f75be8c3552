/* The process split without the processes: a sequence whose target state lives in a kvd-style
 * slot (kvlayout + tgt_state_bind), whose features go to the slot's ring, and whose blocks
 * come from draftd's proposal code (drf_propose over the draft slot) produces exactly the
 * tokens and the step count of the in-process speculative loop (spec_step), greedy and
 * sampled; a new draftd with the same drafter continues the slot's context without
 * rebuilding it, another drafter rebuilds it from the ring; a kept slot serves a longer
 * prompt (prefix cache) with the tokens of a fresh prefill. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/kvlayout.h"
#include "draftd/propose.h"
#include "tests/support/model_fixture.h"
#include "tests/support/tmp_dir.h"
#include "verifyd/spec.h"

#define MODEL_PATH "tests/data/models/qwen35-tiny-f32.gguf"
#define N_CTX 256

static char tmpdir[64];
static tgt_model *tm;     /* the scaled target: repeats token 279 */
static dfl_model *dm;     /* a silent drafter proposing 279 */
static dfl_model *dm_rnd; /* a random drafter (rarely right) */

static int setup(void **ctx)
{
    (void)ctx;
    if (!tmp_dir_make(tmpdir, sizeof tmpdir, "tandem-split"))
        return -1;
    char path[160], dir[160];
    snprintf(path, sizeof path, "%s/scaled.gguf", tmpdir);
    if (mf_target_write_scaled(path, MODEL_PATH, 279, 3.0f) != TD_OK || tgt_load(&tm, path) != TD_OK)
        return -1;
    mf_drafter silent = {16, 3, true, 279, false}, rnd = {16, 2, false, 5, false};
    snprintf(dir, sizeof dir, "%s/silent", tmpdir);
    if (mf_drafter_make(&dm, dir, tm, &silent, 9) != TD_OK)
        return -1;
    snprintf(dir, sizeof dir, "%s/random", tmpdir);
    if (mf_drafter_make(&dm_rnd, dir, tm, &rnd, 77) != TD_OK)
        return -1;
    return 0;
}

static int teardown(void **ctx)
{
    (void)ctx;
    dfl_free(dm);
    dfl_free(dm_rnd);
    tgt_free(tm);
    return tmp_dir_remove(tmpdir) ? 0 : -1;
}

/* One slot's memory in both pools. */
typedef struct slot_mem {
    kvl_layout lay;
    uint8_t *t, *d; /* target and draft slot */
    float *q;       /* proposal pool [block-1][n_vocab] */
} slot_mem;

static void slot_init(slot_mem *m, const dfl_model *drafter, uint32_t ring)
{
    kvl_params p = {
        .slots = 1, .n_ctx = N_CTX, .ring = ring, .block = drafter->cfg.block_size,
        .n_attn = (uint32_t)tm->n_attn_layers, .n_kv = (uint32_t)tm->hp.n_head_kv,
        .head_dim = (uint32_t)tm->hp.head_dim, .n_delta = (uint32_t)tm->n_delta_layers,
        .n_v_head = (uint32_t)tm->hp.n_v_head, .d_k = (uint32_t)tm->hp.d_k,
        .d_v = (uint32_t)tm->hp.d_v, .conv_k = (uint32_t)tm->hp.conv_k,
        .conv_ch = (uint32_t)tm->hp.conv_ch, .n_taps = drafter->cfg.n_taps,
        .n_embd = (uint32_t)tm->hp.n_embd, .d_layers = drafter->cfg.n_layers,
        .d_kv = drafter->cfg.n_kv_heads, .d_head_dim = drafter->cfg.head_dim,
        .n_vocab = (uint32_t)tm->hp.n_vocab, .kv_bytes = tgt_kv_bytes(tm),
        .d_kv_bytes = dfl_kv_bytes(drafter), .feat_bytes = 4,
    };
    assert_int_equal(kvl_compute(&p, &m->lay), TD_OK);
    assert_int_equal(m->lay.q_bytes, (uint64_t)(p.block - 1) * p.n_vocab * sizeof(float));
    m->q = calloc(1, m->lay.q_bytes);
    assert_non_null(m->q);
    m->t = aligned_alloc(4096, m->lay.target_slot);
    m->d = aligned_alloc(4096, m->lay.draft_slot);
    assert_non_null(m->t);
    assert_non_null(m->d);
    memset(m->t, 0, m->lay.target_slot);
    memset(m->d, 0, m->lay.draft_slot);
}

static void slot_free(slot_mem *m)
{
    free(m->t);
    free(m->d);
    free(m->q);
}

/* A split sequence over the slot: features to the ring, blocks from outside. */
static void split_init(spec_seq *s, slot_mem *m, const dfl_model *drafter,
                       const ops_sampler *smp)
{
    const kvl_layout *l = &m->lay;
    tgt_state_mem mem = {
        .k = (float *)(m->t + l->k), .v = (float *)(m->t + l->v),
        .ssm = (float *)(m->t + l->ssm), .conv = (float *)(m->t + l->conv),
        .rec_ssm0 = (float *)(m->t + l->rec_ssm0), .rec_conv0 = (float *)(m->t + l->rec_conv0),
        .rec_xconv = (float *)(m->t + l->rec_xconv), .rec_qkv = (float *)(m->t + l->rec_qkv),
        .rec_gb = (float *)(m->t + l->rec_gb), .rec_cap = l->p.block,
    };
    int32_t taps[DFLASH_MAX_TAPS];
    for (uint32_t i = 0; i < drafter->cfg.n_taps; i++)
        taps[i] = (int32_t)drafter->cfg.target_layer_ids[i];
    spec_cfg cfg = {
        .n_ctx = N_CTX, .block = drafter->cfg.block_size, .taps = taps,
        .n_taps = drafter->cfg.n_taps, .state = &mem, .feat_ring = m->t + l->feat,
        .ring_rows = l->p.ring, .sampler = *smp,
    };
    assert_int_equal(spec_init_cfg(s, tm, &cfg), TD_OK);
}

/* One split step: drf_propose, then spec_verify. */
static void split_step(spec_seq *s, slot_mem *m, drf *d, uint64_t slot_gen, int32_t *out,
                       int64_t *n)
{
    int64_t V = tm->hp.n_vocab, room = spec_room(s);
    int64_t B = s->block < room ? s->block : room;
    int32_t block[SPEC_MAX_BLOCK] = {s->pending};
    if (B > 1) {
        msg_propose req = {
            .seq_id = 1, .slot = 0, .slot_gen = slot_gen, .n_past = (uint32_t)s->ts.n_past,
            .pending = (uint32_t)s->pending, .n_draft = (uint32_t)(B - 1),
            .sampler = {.temperature = s->sampler.temperature, .top_k = (uint32_t)s->sampler.top_k,
                        .top_p = s->sampler.top_p, .min_p = s->sampler.min_p,
                        .seed = s->sampler.seed},
        };
        msg_proposal p;
        assert_int_equal(drf_propose(d, &m->lay, m->t, m->d, (uint8_t *)m->q, 5, &req, &p),
                         TD_OK);
        assert_int_equal(p.n_tokens, B - 1);
        for (int64_t i = 1; i < B; i++)
            block[i] = (int32_t)p.tokens[i - 1];
        if (s->sampler.temperature > 0) {
            /* the distributions come through the proposal pool, not the message */
            assert_int_equal(p.n_q, 0);
            assert_int_equal(p.q_rows, B - 1);
            assert_int_equal(p.q_gen, 5);
            assert_int_equal(p.q_offset, 0);
            memcpy(s->q, m->q, (size_t)((B - 1) * V) * sizeof(float));
        }
    }
    assert_int_equal(spec_verify(s, block, B, s->q, out, n), TD_OK);
}

/* n tokens after prompt through the in-process loop (ring rows of drafter context). */
static spec_stats run_inproc(const dfl_model *drafter, int64_t ring, const int32_t *prompt,
                             int64_t np, int64_t n, const ops_sampler *smp, int32_t *out)
{
    const spec_cfg cfg = {.dm = drafter, .n_ctx = N_CTX, .ring = ring, .block = 1,
                          .sampler = *smp};
    spec_stats st;
    if (mf_generate(tm, &cfg, prompt, np, n, out, &st) != TD_OK)
        fail_msg("in-process loop: %s", err_msg());
    return st;
}

/* The same through the slot and drf_propose. */
static spec_stats run_split(const dfl_model *drafter, uint32_t ring, const int32_t *prompt,
                            int64_t np, int64_t n, const ops_sampler *smp, int32_t *out)
{
    slot_mem m;
    slot_init(&m, drafter, ring);
    drf d;
    assert_int_equal(drf_init(&d, drafter, 42), TD_OK);
    spec_seq s;
    split_init(&s, &m, drafter, smp);
    assert_int_equal(spec_prefill(&s, prompt, np, &out[0]), TD_OK);
    int64_t got = 1, k;
    int32_t step[SPEC_MAX_BLOCK];
    while (got < n) {
        split_step(&s, &m, &d, 7, step, &k);
        for (int64_t i = 0; i < k && got < n; i++)
            out[got++] = step[i];
    }
    spec_stats st = s.stats;
    spec_free(&s);
    drf_free(&d);
    slot_free(&m);
    return st;
}

static void test_split_greedy_equals_the_in_process_loop_step_for_step(void **ctx)
{
    (void)ctx;
    ops_sampler greedy = {0};
    int64_t accepted = 0;
    for (int p = 0; p < 6; p++) {
        int32_t prompt[80], a[100], b[100];
        int64_t np = 3 + p * 13; /* up to 68: two prefill chunks */
        for (int64_t i = 0; i < np; i++)
            prompt[i] = (int32_t)((i * 37 + p * 11) % tm->hp.n_vocab);
        prompt[np / 2] = 279;
        uint32_t ring = p % 2 ? 256 : 16; /* a small ring wraps */
        spec_stats sa = run_inproc(dm, ring, prompt, np, 90, &greedy, a);
        spec_stats sb = run_split(dm, ring, prompt, np, 90, &greedy, b);
        for (int i = 0; i < 90; i++)
            if (a[i] != b[i])
                fail_msg("prompt %d: token %d differs (in-process %d, split %d)", p, i, a[i], b[i]);
        assert_int_equal(sa.steps, sb.steps);
        assert_int_equal(sa.accepted, sb.accepted);
        accepted += sb.accepted;
    }
    assert_true(accepted > 50); /* the drafter's blocks were really used */
}

static void test_split_sampling_draws_the_in_process_tokens(void **ctx)
{
    (void)ctx;
    int32_t prompt[5] = {10, 279, 30, 279, 50};
    const dfl_model *drafters[2] = {dm, dm_rnd};
    for (int k = 0; k < 2; k++)
        for (uint64_t seed = 1; seed <= 4; seed++) {
            ops_sampler smp = {.temperature = 0.8f, .top_k = 30, .top_p = 0.95f, .seed = seed};
            int32_t a[40], b[40];
            spec_stats sa = run_inproc(drafters[k], 256, prompt, 5, 40, &smp, a);
            spec_stats sb = run_split(drafters[k], 256, prompt, 5, 40, &smp, b);
            assert_memory_equal(a, b, sizeof a);
            assert_int_equal(sa.steps, sb.steps);
        }
}

static void test_a_new_drafter_process_continues_the_slot_context(void **ctx)
{
    (void)ctx;
    ops_sampler greedy = {0};
    int32_t prompt[6] = {1, 2, 279, 4, 5, 6}, want[70], got[70];
    run_inproc(dm, 256, prompt, 6, 70, &greedy, want);
    slot_mem m;
    slot_init(&m, dm, 256);
    spec_seq s;
    split_init(&s, &m, dm, &greedy);
    assert_int_equal(spec_prefill(&s, prompt, 6, &got[0]), TD_OK);
    int64_t n = 1, k;
    int32_t step[SPEC_MAX_BLOCK];
    drf d;
    /* three "processes": the first drafts a while; the second has the same drafter (same
     * id) and continues the context; the third says it is another drafter (same weights,
     * another id) and rebuilds the context from the ring, to the same values */
    for (int proc = 0; proc < 3; proc++) {
        assert_int_equal(drf_init(&d, dm, proc == 2 ? 43 : 42), TD_OK);
        for (int st = 0; st < 3 && n < 70; st++) {
            split_step(&s, &m, &d, 7, step, &k);
            if (st == 0 && proc == 1)
                assert_false(d.rebuilt);
            if (st == 0 && proc == 2) {
                assert_true(d.rebuilt);
                assert_int_equal(d.added, s.ts.n_past - k); /* every committed position */
            }
            for (int64_t i = 0; i < k && n < 70; i++)
                got[n++] = step[i];
        }
        drf_free(&d);
    }
    assert_int_equal(drf_init(&d, dm, 42), TD_OK);
    while (n < 70) {
        split_step(&s, &m, &d, 7, step, &k);
        for (int64_t i = 0; i < k && n < 70; i++)
            got[n++] = step[i];
    }
    drf_free(&d);
    assert_memory_equal(got, want, sizeof want);
    spec_free(&s);
    slot_free(&m);
}

static void test_a_kept_slot_serves_a_longer_prompt_like_a_fresh_prefill(void **ctx)
{
    (void)ctx;
    ops_sampler greedy = {0};
    slot_mem m;
    slot_init(&m, dm, 256);
    drf d;
    assert_int_equal(drf_init(&d, dm, 42), TD_OK);
    int32_t prompt[100] = {7, 8, 9, 279, 11}, out[40];
    spec_seq s;
    split_init(&s, &m, dm, &greedy);
    assert_int_equal(spec_prefill(&s, prompt, 5, &out[0]), TD_OK);
    int64_t n = 1, k;
    while (n < 30) {
        split_step(&s, &m, &d, 7, out + n, &k);
        n += k;
    }
    /* the slot keeps exactly the committed tokens: prompt + out[0 .. n_past - 5) */
    int64_t kept = s.ts.n_past;
    memcpy(prompt + 5, out, (size_t)(kept - 5) * sizeof *out);
    spec_free(&s);
    int64_t np = kept + 3;
    prompt[kept] = 3, prompt[kept + 1] = 279, prompt[kept + 2] = 1;
    int32_t want[30], got[30];
    run_inproc(NULL, 256, prompt, np, 30, &greedy, want);
    split_init(&s, &m, dm, &greedy);
    assert_int_equal(spec_prefill_begin(&s, prompt, np, kept), TD_OK);
    bool done = false;
    int runs = 0;
    while (!done) {
        assert_int_equal(spec_prefill_next(&s, &done, &got[0]), TD_OK);
        runs++;
    }
    assert_int_equal(runs, 1); /* only the 3 new tokens ran */
    n = 1;
    while (n < 30) {
        int32_t step[SPEC_MAX_BLOCK];
        split_step(&s, &m, &d, 7, step, &k);
        for (int64_t i = 0; i < k && n < 30; i++)
            got[n++] = step[i];
    }
    assert_memory_equal(got, want, sizeof want);
    spec_free(&s);
    drf_free(&d);
    slot_free(&m);
}

int main(void)
{
    /* One thread: the tiny model gains nothing from more, and CI shares two cores. */
    omp_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_greedy_equals_the_in_process_loop_step_for_step),
        cmocka_unit_test(test_split_sampling_draws_the_in_process_tokens),
        cmocka_unit_test(test_a_new_drafter_process_continues_the_slot_context),
        cmocka_unit_test(test_a_kept_slot_serves_a_longer_prompt_like_a_fresh_prefill),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
