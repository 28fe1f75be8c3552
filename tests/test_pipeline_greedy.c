/* The pipeline with real processes (kvd, verifyd, draftd), verifyd driven over its socket as
 * the gateway drives it: greedy output equals the in-process speculative loop step for step
 * and plain decoding; 16 concurrent sequences equal each run alone; the prefix cache serves a
 * longer prompt with the tokens of a fresh prefill; log probabilities equal the target's;
 * stop ids, max_tokens, the context end, cancellation and bad requests behave as the
 * contract says. Target: the tiny qwen35 model scaled to repeat token 279; drafter: one whose
 * every slot proposes 279, so blocks are accepted fully, partly or not at all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/model_fixture.h"
#include "tests/support/pipeline.h"
#include "verifyd/spec.h"

#define N_CTX 256
#define WAIT_MS 120000

static pipeline pl;
static tgt_model *tm;
static dfl_model *dm;
static uint64_t next_seq = 1;

/* The daemons with verifyd's prefill in DeltaNet chunks of delta_chunk (0: token by token)
 * and at most draft_max drafts verified per step (0: whole blocks), each drafting step's
 * block picked by measured cost and acceptance when draft_auto; the in-process references
 * prefill the same way. */
static int setup_with(int64_t delta_chunk, int64_t draft_max, bool draft_auto)
{
    int rc = pl_setup(&pl);
    if (rc != 0)
        return rc == 77 ? (exit(77), -1) : -1;
    char model[PL_PATH_MAX], draft[PL_PATH_MAX];
    mf_drafter silent = {16, 3, true, PL_REPEAT_TOKEN, false};
    if (pl_write_pair(&pl, 3.0f, &silent, 9, "silent", model, draft, &tm) != TD_OK ||
        dfl_load(&dm, draft, (uint32_t)tm->hp.n_layer, &tm->tok_embd, &tm->output) != TD_OK ||
        tgt_set_delta_chunk(tm, delta_chunk) != TD_OK)
        return -1;
    char chunk[24], dmax[24];
    snprintf(chunk, sizeof chunk, "%lld", (long long)delta_chunk);
    snprintf(dmax, sizeof dmax, "%lld", (long long)draft_max);
    const char *kvd_args[] = {"--slots", "16", "--log-level", "info", NULL};
    const char *vd_args[] = {"--model", model, "--draft", draft, "--ctx", "256",
                             "--draft-timeout-ms", "30000", "--delta-chunk", chunk,
                             "--draft-max", dmax, "--log-level", "info",
                             draft_auto ? "--draft-auto" : NULL, NULL};
    const char *dd_args[] = {"--model", model, "--draft", draft, "--log-level", "info", NULL};
    return pl_start_all(&pl, kvd_args, vd_args, dd_args) == TD_OK ? 0 : -1;
}

static int setup(void **ctx)
{
    (void)ctx;
    return setup_with(0, 0, false);
}

static int setup_chunked(void **ctx)
{
    (void)ctx;
    return setup_with(4, 5, true);
}

static int teardown(void **ctx)
{
    (void)ctx;
    dfl_free(dm);
    tgt_free(tm);
    return pl_teardown(&pl) == 0 ? 0 : -1;
}

/* n tokens after prompt in one process: with the drafter (speculative) or without (plain). */
static spec_stats reference(const dfl_model *drafter, const int32_t *prompt, int64_t np,
                            int64_t n, const ops_sampler *smp, int32_t *out)
{
    const spec_cfg cfg = {.dm = drafter, .n_ctx = N_CTX, .ring = N_CTX, .block = 1,
                          .sampler = *smp};
    spec_stats st;
    if (mf_generate(tm, &cfg, prompt, np, n, out, &st) != TD_OK)
        fail_msg("reference: %s", err_msg());
    return st;
}

static void make_prompt(uint32_t *u, int32_t *p, int64_t n, int salt)
{
    for (int64_t i = 0; i < n; i++) {
        p[i] = (int32_t)((i * 31 + salt * 17 + 3) % tm->hp.n_vocab);
        if ((i + salt) % 7 == 3)
            p[i] = 279;
        u[i] = (uint32_t)p[i];
    }
}

static msg_gen_start gen(const uint32_t *prompt, uint32_t n, uint32_t max_tokens)
{
    msg_gen_start g = {.seq_id = next_seq++, .prompt = prompt, .n_prompt = n,
                       .max_tokens = max_tokens, .sampler = {.top_p = 1.0f}, .ignore_eos = true};
    return g;
}

static pl_result *wait_done(uint64_t seq_id)
{
    pl_result *r = pl_wait(&pl, seq_id, WAIT_MS);
    if (!r) {
        pl_dump_logs(&pl);
        fail_msg("sequence %llu did not finish", (unsigned long long)seq_id);
    }
    TD_ASSERT(r); /* fail_msg does not return */
    return r;
}

static void test_greedy_equals_the_in_process_loop_and_plain_decoding(void **ctx)
{
    (void)ctx;
    enum { N = 10, GEN = 48 };
    uint32_t prompts[N][160];
    int32_t iprompts[N][160];
    int64_t np[N];
    uint64_t ids[N];
    msg_status before;
    assert_int_equal(pl_status(&pl, &before), TD_OK);
    for (int k = 0; k < N; k++) { /* all at once: the scheduler interleaves them */
        np[k] = 2 + k * 16; /* up to 146: prefills of three chunks */
        make_prompt(prompts[k], iprompts[k], np[k], k);
        msg_gen_start g = gen(prompts[k], (uint32_t)np[k], GEN);
        ids[k] = g.seq_id;
        assert_int_equal(pl_gen(&pl, &g), TD_OK);
    }
    ops_sampler greedy = {0};
    int64_t accepted = 0;
    for (int k = 0; k < N; k++) {
        int32_t spec[GEN], plain[GEN];
        spec_stats st = reference(dm, iprompts[k], np[k], GEN, &greedy, spec);
        reference(NULL, iprompts[k], np[k], GEN, &greedy, plain);
        assert_memory_equal(spec, plain, sizeof spec);
        pl_result *r = wait_done(ids[k]);
        assert_int_equal(r->last_kind, MSG_EVENT_DONE);
        assert_int_equal(r->finish, MSG_FINISH_LENGTH);
        assert_int_equal(r->n_tokens, GEN);
        for (int i = 0; i < GEN; i++)
            if (r->tokens[i] != spec[i])
                fail_msg("prompt %d: token %d is %d, in-process %d", k, i, r->tokens[i], spec[i]);
        /* the same steps: every block came from draftd and was judged the same way */
        assert_int_equal(r->usage.steps, st.steps);
        assert_int_equal(r->usage.prompt_tokens, np[k]);
        assert_int_equal(r->usage.completion_tokens, GEN);
        accepted += st.accepted;
    }
    msg_status after;
    assert_int_equal(pl_status(&pl, &after), TD_OK);
    assert_true(accepted > 30); /* 71 with these prompts: draftd's blocks were used */
    assert_int_equal(after.accepted - before.accepted, accepted);
    assert_int_equal(after.requests - before.requests, N);
    assert_int_equal(after.active, 0);
}

static void test_sixteen_concurrent_sequences_equal_each_run_alone(void **ctx)
{
    (void)ctx;
    enum { N = 16, GEN = 24 };
    uint32_t prompts[N][40];
    int32_t ip[N][40];
    int32_t alone[N][GEN];
    uint64_t ids[N];
    for (int k = 0; k < N; k++) {
        make_prompt(prompts[k], ip[k], 5 + k, 100 + k);
        msg_gen_start g = gen(prompts[k], 5 + k, GEN);
        if (k % 2) { /* half of them sample: their random streams are per position */
            g.sampler.temperature = 0.9f;
            g.sampler.seed = 1000 + k;
        }
        assert_int_equal(pl_gen(&pl, &g), TD_OK);
        pl_result *r = wait_done(g.seq_id);
        assert_int_equal(r->n_tokens, GEN);
        memcpy(alone[k], r->tokens, sizeof alone[k]);
    }
    for (int k = 0; k < N; k++) {
        msg_gen_start g = gen(prompts[k], 5 + k, GEN);
        if (k % 2) {
            g.sampler.temperature = 0.9f;
            g.sampler.seed = 1000 + k;
        }
        ids[k] = g.seq_id;
        assert_int_equal(pl_gen(&pl, &g), TD_OK);
    }
    for (int k = 0; k < N; k++) {
        pl_result *r = wait_done(ids[k]);
        assert_int_equal(r->finish, MSG_FINISH_LENGTH);
        assert_int_equal(r->n_tokens, GEN);
        if (memcmp(r->tokens, alone[k], sizeof alone[k]) != 0)
            fail_msg("sequence %d differs from its run alone", k);
    }
}

static void test_prefix_cache_serves_a_longer_prompt_like_a_fresh_prefill(void **ctx)
{
    (void)ctx;
    uint32_t p1[20], p2[64];
    int32_t ip1[20], ip2[64];
    make_prompt(p1, ip1, 20, 55);
    msg_gen_start g = gen(p1, 20, 30);
    assert_int_equal(pl_gen(&pl, &g), TD_OK);
    pl_result *r1 = wait_done(g.seq_id);
    assert_int_equal(r1->n_tokens, 30);
    assert_int_equal(r1->usage.cached_tokens, 0);
    /* the finished sequence's slot holds the prompt and the first 29 tokens (the 30th was
     * emitted, never run); a prompt that extends them reuses all 49 */
    memcpy(p2, p1, sizeof p1);
    for (int i = 0; i < 30; i++)
        p2[20 + i] = (uint32_t)r1->tokens[i];
    p2[50] = 279, p2[51] = 4, p2[52] = 8;
    for (int i = 0; i < 53; i++)
        ip2[i] = (int32_t)p2[i];
    msg_gen_start g2 = gen(p2, 53, 20);
    assert_int_equal(pl_gen(&pl, &g2), TD_OK);
    pl_result *r2 = wait_done(g2.seq_id);
    assert_int_equal(r2->usage.cached_tokens, 49);
    assert_int_equal(r2->usage.prompt_tokens, 53);
    int32_t want[20];
    ops_sampler greedy = {0};
    reference(NULL, ip2, 53, 20, &greedy, want);
    assert_int_equal(r2->n_tokens, 20);
    assert_memory_equal(r2->tokens, want, sizeof want);
}

static void test_logprobs_are_the_targets_log_softmax(void **ctx)
{
    (void)ctx;
    enum { GEN = 12, TOP = 5 };
    uint32_t p[9];
    int32_t ip[9 + GEN];
    make_prompt(p, ip, 9, 7);
    msg_gen_start g = gen(p, 9, GEN);
    g.logprobs = true;
    g.top_logprobs = TOP;
    assert_int_equal(pl_gen(&pl, &g), TD_OK);
    pl_result *r = wait_done(g.seq_id);
    assert_int_equal(r->n_tokens, GEN);
    assert_int_equal(r->n_logprobs, GEN);
    /* every position's logits in one forward pass over prompt + generated tokens */
    memcpy(ip + 9, r->tokens, GEN * sizeof(int32_t));
    int64_t V = tm->hp.n_vocab, T = 9 + GEN - 1;
    float *lg = malloc((size_t)(T * V) * sizeof(float));
    tgt_state st;
    assert_int_equal(tgt_state_init(&st, tm, 64), TD_OK);
    tgt_out o = {.logits = lg};
    assert_int_equal(tgt_forward(tm, &st, ip, T, false, &o), TD_OK);
    assert_true(pl_logprobs_match(r, lg + 8 * V, V, TOP, 1e-4));
    for (int i = 0; i < GEN; i++) /* greedy picks the most likely */
        assert_int_equal(r->logprobs[i].top_id[0], r->tokens[i]);
    tgt_state_free(&st);
    free(lg);
}

/* Prompt log probabilities: prompts of 1, 16, 17 and 37 tokens with max_tokens 0 end with
 * DONE (length) and no token after PROMPT events holding tokens 1.. of the prompt, each with
 * the bits of cpu_logprob_rows on the rows of 16-token passes with every row's logits (as
 * verifyd runs them) and within 1e-4 of one whole pass; asked again with generated tokens,
 * the prompt was cached by the first request yet is not reused, the values repeat with the
 * new alternatives, every PROMPT event precedes the tokens, and the tokens are greedy's. */
static void test_prompt_logprobs_are_the_targets_log_softmax(void **ctx)
{
    (void)ctx;
    enum { TOP = 4, GEN = 5 };
    const int64_t lens[] = {1, 16, 17, 37};
    const int64_t V = tm->hp.n_vocab;
    for (size_t c = 0; c < sizeof lens / sizeof lens[0]; c++) {
        const int64_t n = lens[c];
        uint32_t p[37];
        int32_t ip[37];
        make_prompt(p, ip, n, 11);
        float *lg = malloc((size_t)(n * V) * sizeof(float));
        float *whole = malloc((size_t)(n * V) * sizeof(float));
        tgt_state st;
        assert_int_equal(tgt_state_init(&st, tm, 64), TD_OK);
        for (int64_t at = 0; at < n; at += 16) {
            tgt_out o = {.logits = lg + at * V};
            assert_int_equal(tgt_forward(tm, &st, ip + at, n - at < 16 ? n - at : 16, false, &o),
                             TD_OK);
        }
        assert_int_equal(tgt_state_reset(tm, &st), TD_OK);
        tgt_out o = {.logits = whole};
        assert_int_equal(tgt_forward(tm, &st, ip, n, false, &o), TD_OK);
        tgt_state_free(&st);
        ops_logprob want[36];
        if (n > 1)
            cpu_logprob_rows(want, lg, ip + 1, n - 1, V, TOP);

        for (int round = 0; round < 2; round++) {
            msg_gen_start g = gen(p, (uint32_t)n, round ? GEN : 0);
            g.prompt_logprobs = true;
            g.logprobs = true;
            g.top_logprobs = round ? 2 : TOP;
            assert_int_equal(pl_gen(&pl, &g), TD_OK);
            pl_result *r = wait_done(g.seq_id);
            assert_int_equal(r->last_kind, MSG_EVENT_DONE);
            assert_int_equal(r->finish, MSG_FINISH_LENGTH);
            assert_int_equal(r->n_prompt, n - 1);
            assert_false(r->prompt_late);
            assert_int_equal(r->usage.cached_tokens, 0);
            assert_int_equal(r->usage.prompt_tokens, n);
            for (int64_t i = 0; i + 1 < n; i++) {
                assert_int_equal(r->prompt[i], ip[i + 1]);
                assert_true(r->prompt_lp[i].logprob == want[i].logprob);
                assert_int_equal(r->prompt_lp[i].n_top, round ? 2 : TOP);
                for (uint32_t k = 0; k < r->prompt_lp[i].n_top; k++) {
                    assert_int_equal(r->prompt_lp[i].top_id[k], want[i].top_id[k]);
                    assert_true(r->prompt_lp[i].top_logprob[k] == want[i].top_logprob[k]);
                }
                const float *row = whole + i * V;
                const double lp = row[ip[i + 1]] - pl_logsumexp(row, V);
                assert_true(fabs(lp - (double)r->prompt_lp[i].logprob) < 1e-4);
            }
            if (round == 0) {
                assert_int_equal(r->n_tokens, 0);
                assert_int_equal(r->usage.completion_tokens, 0);
            } else {
                int32_t plain[GEN];
                ops_sampler greedy = {0};
                reference(NULL, ip, n, GEN, &greedy, plain);
                assert_int_equal(r->n_tokens, GEN);
                assert_memory_equal(r->tokens, plain, sizeof plain);
                assert_int_equal(r->n_logprobs, GEN);
            }
        }
        free(lg);
        free(whole);
    }
}

/* A prediction (OpenAI's predicted outputs) never changes the output: the greedy tokens come
 * back whether it is the output itself (most steps then commit whole blocks of it), the
 * output with every seventh token wrong, the output after three wrong tokens (followed again
 * once four generated tokens are found in it), or nothing like it. */
static void test_a_prediction_drafts_where_the_output_follows_it(void **ctx)
{
    (void)ctx;
    enum { GEN = 48, NP = 20 };
    uint32_t p[NP];
    int32_t ip[NP], want[GEN];
    make_prompt(p, ip, NP, 13);
    ops_sampler greedy = {0};
    reference(NULL, ip, NP, GEN, &greedy, want);
    uint32_t pred[4][GEN + 3];
    uint32_t n_pred[4] = {GEN, GEN, GEN + 3 - 10, 40};
    for (int i = 0; i < GEN; i++) {
        pred[0][i] = (uint32_t)want[i];
        pred[1][i] = i % 7 == 6 ? (uint32_t)(want[i] + 1) % (uint32_t)tm->hp.n_vocab
                                : (uint32_t)want[i];
    }
    pred[2][0] = pred[2][1] = pred[2][2] = (uint32_t)(want[0] + 2) % (uint32_t)tm->hp.n_vocab;
    for (int i = 10; i < GEN; i++)
        pred[2][i - 7] = (uint32_t)want[i];
    for (int i = 0; i < 40; i++)
        pred[3][i] = (uint32_t)(5 + i);
    uint32_t got[4];
    for (int k = 0; k < 4; k++) {
        msg_gen_start g = gen(p, NP, GEN);
        g.predict = pred[k];
        g.n_predict = n_pred[k];
        assert_int_equal(pl_gen(&pl, &g), TD_OK);
        pl_result *r = wait_done(g.seq_id);
        assert_int_equal(r->last_kind, MSG_EVENT_DONE);
        assert_int_equal(r->n_tokens, GEN);
        assert_memory_equal(r->tokens, want, sizeof want);
        got[k] = r->usage.predicted_tokens;
        if (k == 0) /* after the prefill's token, three steps of 15 drafts and a bonus token */
            assert_int_equal(r->usage.steps, 3);
    }
    assert_int_equal(got[0], 45);
    assert_true(got[1] > 0 && got[1] < got[0]);
    assert_true(got[2] > 0 && got[2] < got[0]);
}

static void test_stop_ids_max_tokens_and_the_context_end(void **ctx)
{
    (void)ctx;
    uint32_t p[250];
    int32_t ip[250], plain[40];
    make_prompt(p, ip, 12, 9);
    ops_sampler greedy = {0};
    reference(NULL, ip, 12, 40, &greedy, plain);
    int stop_at = 9;
    while (stop_at < 40) { /* a token that does not occur earlier */
        bool seen = false;
        for (int i = 0; i < stop_at; i++)
            seen |= plain[i] == plain[stop_at];
        if (!seen)
            break;
        stop_at++;
    }
    assert_true(stop_at < 40);
    uint32_t unused = 0; /* a second stop id that never comes */
    for (bool seen = true; seen; unused++) {
        seen = false;
        for (int i = 0; i < 40; i++)
            seen |= (uint32_t)plain[i] == unused;
        if (!seen)
            break;
    }
    uint32_t stop[2] = {unused, (uint32_t)plain[stop_at]};
    msg_gen_start g = gen(p, 12, 40);
    g.stop = stop;
    g.n_stop = 2;
    assert_int_equal(pl_gen(&pl, &g), TD_OK);
    pl_result *r = wait_done(g.seq_id);
    assert_int_equal(r->finish, MSG_FINISH_STOP);
    assert_int_equal(r->n_tokens, stop_at + 1); /* the stop token is the last one sent */
    assert_memory_equal(r->tokens, plain, (size_t)(stop_at + 1) * sizeof(int32_t));
    assert_int_equal(r->usage.completion_tokens, stop_at + 1);

    g = gen(p, 12, 5);
    assert_int_equal(pl_gen(&pl, &g), TD_OK);
    r = wait_done(g.seq_id);
    assert_int_equal(r->finish, MSG_FINISH_LENGTH);
    assert_int_equal(r->n_tokens, 5);
    assert_memory_equal(r->tokens, plain, 5 * sizeof(int32_t));

    /* 250 prompt tokens in 256 positions: 6 more run, the 7th is emitted, then the end */
    make_prompt(p, ip, 250, 3);
    g = gen(p, 250, 100);
    assert_int_equal(pl_gen(&pl, &g), TD_OK);
    r = wait_done(g.seq_id);
    assert_int_equal(r->finish, MSG_FINISH_LENGTH);
    assert_int_equal(r->n_tokens, N_CTX - 250 + 1);
}

static void test_cancel_ends_a_generation_with_finish_cancel(void **ctx)
{
    (void)ctx;
    uint32_t p[4] = {1, 2, 3, 4};
    msg_gen_start g = gen(p, 4, 200);
    assert_int_equal(pl_gen(&pl, &g), TD_OK);
    assert_int_equal(pl_cancel(&pl, g.seq_id), TD_OK);
    pl_result *r = wait_done(g.seq_id);
    assert_int_equal(r->last_kind, MSG_EVENT_DONE);
    assert_int_equal(r->finish, MSG_FINISH_CANCEL);
    assert_true(r->n_tokens < 200);
    /* cancelling what is not running is acknowledged too */
    assert_int_equal(pl_cancel(&pl, 987654321), TD_OK);
}

static void test_bad_requests_get_errors_with_the_numbers(void **ctx)
{
    (void)ctx;
    static uint32_t big[300];
    msg_gen_start g = gen(big, N_CTX, 10);
    assert_int_equal(pl_gen(&pl, &g), TD_ERANGE);
    assert_non_null(strstr(err_msg(), "256 tokens"));
    assert_non_null(strstr(err_msg(), "256 positions"));
    uint32_t bad[3] = {1, 512, 3};
    g = gen(bad, 3, 10);
    assert_int_equal(pl_gen(&pl, &g), TD_ERANGE);
    assert_non_null(strstr(err_msg(), "vocabulary of 512"));
    /* a logit bias for a token outside the vocabulary */
    const uint32_t bias_tok[2] = {7, 512};
    const float bias[2] = {1.0f, -1.0f};
    g = gen(bad, 1, 10);
    g.bias_tok = bias_tok;
    g.bias = bias;
    g.n_bias = 2;
    assert_int_equal(pl_gen(&pl, &g), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "logit bias for token 512: outside the vocabulary of 512"));
    /* a second generation under a running sequence's id */
    uint32_t p[4] = {5, 6, 7, 8};
    g = gen(p, 4, 200);
    assert_int_equal(pl_gen(&pl, &g), TD_OK);
    msg_gen_start dup = g;
    assert_int_equal(pl_gen(&pl, &dup), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "already running"));
    pl_result *r = wait_done(g.seq_id);
    assert_int_equal(r->n_tokens, 200);
}

/* verifyd --delta-chunk 4: prompts of several prefill passes (the chunks cut where the
 * passes are not) give the tokens of the in-process loop prefilling the same way, and
 * speculative decoding gives plain decoding's, also with the blocks verifyd picks step by
 * step (this group runs --draft-auto). */
static void test_chunked_prefill_equals_the_in_process_loop(void **ctx)
{
    (void)ctx;
    enum { N = 3, GEN = 24 };
    const int64_t np[N] = {5, 70, 143};
    uint32_t prompts[N][160];
    int32_t iprompts[N][160];
    uint64_t ids[N];
    for (int k = 0; k < N; k++) {
        make_prompt(prompts[k], iprompts[k], np[k], 30 + k);
        msg_gen_start g = gen(prompts[k], (uint32_t)np[k], GEN);
        ids[k] = g.seq_id;
        assert_int_equal(pl_gen(&pl, &g), TD_OK);
    }
    ops_sampler greedy = {0};
    for (int k = 0; k < N; k++) {
        int32_t spec[GEN], plain[GEN];
        reference(dm, iprompts[k], np[k], GEN, &greedy, spec);
        reference(NULL, iprompts[k], np[k], GEN, &greedy, plain);
        assert_memory_equal(spec, plain, sizeof spec);
        pl_result *r = wait_done(ids[k]);
        assert_int_equal(r->last_kind, MSG_EVENT_DONE);
        assert_int_equal(r->n_tokens, GEN);
        assert_memory_equal(r->tokens, spec, sizeof spec);
    }
    /* verifyd did prefill in chunks: the first token's log probability has the bits of the
     * in-process chunked prefill (64-token passes, as verifyd runs them), which differ from a
     * token-by-token prefill's */
    const int64_t n = np[N - 1], V = tm->hp.n_vocab;
    msg_gen_start g = gen(prompts[N - 1], (uint32_t)n, 1);
    g.logprobs = true;
    g.top_logprobs = 3;
    assert_int_equal(pl_gen(&pl, &g), TD_OK);
    float *row[2] = {malloc((size_t)V * sizeof(float)), malloc((size_t)V * sizeof(float))};
    for (int c = 0; c < 2; c++) {
        assert_int_equal(tgt_set_delta_chunk(tm, c ? 0 : 4), TD_OK);
        tgt_state st;
        assert_int_equal(tgt_state_init(&st, tm, N_CTX), TD_OK);
        tgt_out o = {.logits = row[c], .last_only = true};
        for (int64_t at = 0; at < n; at += 64)
            assert_int_equal(tgt_forward(tm, &st, iprompts[N - 1] + at, n - at < 64 ? n - at : 64,
                                         false, at + 64 >= n ? &o : NULL),
                             TD_OK);
        tgt_state_free(&st);
    }
    assert_int_equal(tgt_set_delta_chunk(tm, 4), TD_OK);
    assert_memory_not_equal(row[0], row[1], (size_t)V * sizeof(float));
    pl_result *r = wait_done(g.seq_id);
    assert_int_equal(r->n_logprobs, 1);
    for (int c = 0; c < 2; c++) {
        ops_logprob lp;
        cpu_logprob_rows(&lp, row[c], &r->tokens[0], 1, V, 3);
        if (c == 0)
            assert_true(lp.logprob == r->logprobs[0].logprob);
        else
            assert_true(lp.logprob != r->logprobs[0].logprob);
    }
    free(row[0]), free(row[1]);
}

/* verifyd --draft-max 5 (this group's): a prediction that is the output itself commits 6
 * tokens a step, not whole blocks of 16, and the output is plain decoding's. */
static void test_draft_max_caps_the_tokens_a_step_verifies(void **ctx)
{
    (void)ctx;
    enum { GEN = 48, NP = 20 };
    uint32_t p[NP], pred[GEN];
    int32_t ip[NP], want[GEN];
    make_prompt(p, ip, NP, 13);
    ops_sampler greedy = {0};
    reference(NULL, ip, NP, GEN, &greedy, want);
    for (int i = 0; i < GEN; i++)
        pred[i] = (uint32_t)want[i];
    msg_gen_start g = gen(p, NP, GEN);
    g.predict = pred;
    g.n_predict = GEN;
    assert_int_equal(pl_gen(&pl, &g), TD_OK);
    pl_result *r = wait_done(g.seq_id);
    assert_int_equal(r->last_kind, MSG_EVENT_DONE);
    assert_int_equal(r->n_tokens, GEN);
    assert_memory_equal(r->tokens, want, sizeof want);
    /* after the prefill's token, 47 more: eight steps of 5 drafts and a bonus token, the last
     * one cut by max_tokens (its drafts count as accepted: the prediction test's first case
     * counts 45 for three steps of 15 the same way) */
    assert_int_equal(r->usage.steps, 8);
    assert_int_equal(r->usage.predicted_tokens, 8 * 5);
    msg_status st;
    assert_int_equal(pl_status(&pl, &st), TD_OK);
    assert_int_equal(st.block, 6); /* the drafter's 16, cut to 1 + 5 */
}

int main(void)
{
    /* One thread per process: three daemons and this test share CI's two cores. */
    omp_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_equals_the_in_process_loop_and_plain_decoding),
        cmocka_unit_test(test_sixteen_concurrent_sequences_equal_each_run_alone),
        cmocka_unit_test(test_prefix_cache_serves_a_longer_prompt_like_a_fresh_prefill),
        cmocka_unit_test(test_logprobs_are_the_targets_log_softmax),
        cmocka_unit_test(test_prompt_logprobs_are_the_targets_log_softmax),
        cmocka_unit_test(test_a_prediction_drafts_where_the_output_follows_it),
        cmocka_unit_test(test_stop_ids_max_tokens_and_the_context_end),
        cmocka_unit_test(test_cancel_ends_a_generation_with_finish_cancel),
        cmocka_unit_test(test_bad_requests_get_errors_with_the_numbers),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    const struct CMUnitTest chunked[] = {
        cmocka_unit_test(test_chunked_prefill_equals_the_in_process_loop),
        cmocka_unit_test(test_draft_max_caps_the_tokens_a_step_verifies),
    };
    return rc | cmocka_run_group_tests(chunked, setup_chunked, teardown);
}
