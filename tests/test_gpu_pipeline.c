/* The pipeline on the GPU with real processes: kvd (pools of the cuda kind), verifyd (target
 * on the GPU, state in kvd's pools, its embedding and LM head shared with draftd) and draftd
 * (drafter on the GPU over those shared buffers) all with --device cuda, on the committed tiny
 * models. Checks, with exact token ids: greedy output through the pipeline equals plain greedy
 * decoding on the GPU in one process, for several prompts at once; kill -9 of draftd
 * mid-generation leaves the text unchanged and a restarted draftd speculates again; sampled
 * output with a seed equals the single-process GPU speculative loop with the same seed (the
 * random streams belong to positions, not processes, DESIGN section 4 / dflash.h), with the
 * distributions travelling through kvd's proposal pool; log probabilities computed on the GPU
 * equal the target's log-softmax, the prompt's too (with the bits of the same rows in one
 * process); a prediction drafts whole blocks of the output and changes no token; verifyd's
 * weights on the GPU hold the embedding and LM head once (in the shared buffers, not also in
 * its own arena); kvd without --slots sizes its pools to the GPU (refused where there is no
 * room, 16 slots where there is). Skipped (77) without a CUDA device or without the daemons
 * built. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "draftd/dflash.h"
#include "kernels/backend.h"
#include "kernels/cuda_mem.h"
#include "tests/support/model_fixture.h"
#include "tests/support/pipeline.h"
#include "verifyd/spec.h"
#include "verifyd/target.h"

#define TARGET_PATH "tests/data/models/qwen35-tiny-f32.gguf"
#define DRAFT_PATH "tests/data/drafter/dflash-b16"
#define N_CTX 256
#define WAIT_MS 120000

static ops_backend *gpu;
static pipeline pl;
static tgt_model *tm; /* the target on the GPU, for the single-process references */
static dfl_model *dm; /* the drafter on the GPU */
static uint64_t next_seq = 1;

static const char *const kvd_args[] = {"--slots", "8", "--device", "cuda", "--log-level",
                                       "info", NULL};
/* debug logs: a failed proposal's reason is in verifyd's log (draftd detached: why) */
static const char *const vd_args[] = {"--model", TARGET_PATH, "--draft", DRAFT_PATH, "--ctx",
                                      "256", "--draft-timeout-ms", "30000", "--device", "cuda",
                                      "--log-level", "debug", NULL};
static const char *const dd_args[] = {"--model", TARGET_PATH, "--draft", DRAFT_PATH, "--device",
                                      "cuda", "--log-level", "debug", NULL};

/* The reference models and the three daemons; false (with the reason printed) on failure. */
static bool start_all(void)
{
    if (tgt_load_on(&tm, TARGET_PATH, gpu) != TD_OK ||
        dfl_load_on(&dm, DRAFT_PATH, (uint32_t)tm->hp.n_layer, &tm->tok_embd, &tm->output,
                    gpu) != TD_OK) {
        fprintf(stderr, "loading the models: %s\n", err_msg());
        return false;
    }
    return pl_start_all(&pl, kvd_args, vd_args, dd_args) == TD_OK;
}

/* n tokens after prompt in this process on the GPU: speculative with drafter, else plain. */
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

/* Prompt p: 3..25 pseudo-random ids of the vocabulary (as test_gpu_spec makes them). */
static int64_t make_prompt(int p, uint32_t *u, int32_t *ip)
{
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(p + 1);
    int64_t n = 3 + (p * 7) % 23;
    for (int64_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ip[i] = (int32_t)(x % (uint64_t)tm->hp.n_vocab);
        u[i] = (uint32_t)ip[i];
    }
    return n;
}

/* Prompt p (make_prompt) in u and its first gen greedy tokens on the GPU in one process. */
static int64_t greedy_case(int p, uint32_t *u, int64_t gen, int32_t *want)
{
    int32_t ip[32];
    ops_sampler g0 = {0};
    const int64_t n = make_prompt(p, u, ip);
    reference(NULL, ip, n, gen, &g0, want);
    return n;
}

static uint64_t start(const uint32_t *prompt, int64_t n, uint32_t max_tokens,
                      const msg_sampler *smp)
{
    msg_gen_start g = {.seq_id = next_seq++, .prompt = prompt, .n_prompt = (uint32_t)n,
                       .max_tokens = max_tokens, .sampler = *smp, .ignore_eos = true};
    if (pl_gen(&pl, &g) != TD_OK)
        fail_msg("gen_start: %s", err_msg());
    return g.seq_id;
}

static pl_result *wait_done(uint64_t seq_id)
{
    pl_result *r = pl_wait(&pl, seq_id, WAIT_MS);
    if (!r) {
        pl_dump_logs(&pl);
        fail_msg("sequence %llu did not finish", (unsigned long long)seq_id);
    }
    TD_ASSERT(r); /* fail_msg does not return */
    if (r->last_kind != MSG_EVENT_DONE) {
        pl_dump_logs(&pl);
        fail_msg("sequence %llu ended with %s: %s", (unsigned long long)seq_id,
                 err_name(r->code), r->message);
    }
    return r;
}

static void expect_tokens(const char *what, const pl_result *r, const int32_t *want, int64_t n)
{
    if ((int64_t)r->n_tokens != n)
        fail_msg("%s: %u tokens, want %lld", what, r->n_tokens, (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (r->tokens[i] != want[i])
            fail_msg("%s: token %lld is %d, single-process GPU %d", what, (long long)i,
                     r->tokens[i], want[i]);
}

/* verifyd's log line of its weights on the GPU: the model's arena lacks exactly the token
 * embedding and LM head (bytes as in the reference model loaded here without sharing), and
 * the shared buffers hold them, so the GPU does not keep a second copy. */
static void test_gpu_pipeline_verifyd_holds_embedding_and_head_once(void **ctx)
{
    (void)ctx;
    static const char key[] = "weights on cuda: ";
    char path[128], line[1024];
    snprintf(path, sizeof path, "%s/verifyd.log", pl.dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t arena = 0, shared = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        const char *at = strstr(line, key);
        found = at && sscanf(at + strlen(key), "%zu bytes in the model's arena, %zu bytes in "
                             "shared buffers", &arena, &shared) == 2;
    }
    fclose(f);
    if (!found)
        fail_msg("%s has no line \"%s<arena> bytes ... <shared> bytes ...\"", path, key);
    bool tied = tm->output.data == tm->tok_embd.data;
    size_t embd = (size_t)tm->tok_embd.rows * tm->tok_embd.row_bytes;
    size_t head = tied ? 0 : (size_t)tm->output.rows * tm->output.row_bytes;
    size_t al = 256; /* bytes: each weight's alignment in the arena */
    assert_int_equal(shared, embd + head);
    assert_int_equal(tm->placed_bytes, 0);
    assert_int_equal(arena, tm->arena_bytes - (embd + al - 1) / al * al -
                                (head + al - 1) / al * al);
    printf("verifyd on the GPU: %zu bytes of weights in its arena, %zu shared with draftd "
           "(held once)\n", arena, shared);
}

/* Several prompts at once through the pipeline: every token equals plain greedy decoding on
 * the GPU in one process, and draftd's blocks were used (drafts proposed and accepted). */
static void test_gpu_pipeline_greedy_equals_single_process_plain_greedy(void **ctx)
{
    (void)ctx;
    enum { N = 6, GEN = 48 };
    uint32_t prompts[N][32];
    int32_t iprompts[N][32], want[N][GEN];
    int64_t np[N];
    uint64_t ids[N];
    msg_status s0, s1;
    msg_sampler greedy = {.top_p = 1.0f};
    ops_sampler g0 = {0};
    assert_int_equal(pl_status(&pl, &s0), TD_OK);
    assert_true(s0.draft_attached);
    for (int k = 0; k < N; k++) {
        np[k] = make_prompt(k, prompts[k], iprompts[k]);
        ids[k] = start(prompts[k], np[k], GEN, &greedy);
    }
    for (int k = 0; k < N; k++) {
        reference(NULL, iprompts[k], np[k], GEN, &g0, want[k]);
        pl_result *r = wait_done(ids[k]);
        char what[64];
        snprintf(what, sizeof what, "greedy prompt %d", k);
        expect_tokens(what, r, want[k], GEN);
        assert_int_equal(r->finish, MSG_FINISH_LENGTH);
        assert_int_equal(r->usage.completion_tokens, GEN);
    }
    assert_int_equal(pl_status(&pl, &s1), TD_OK);
    assert_true(s1.drafted > s0.drafted);
    printf("GPU pipeline greedy == single-process GPU plain for %d prompts; %llu of %llu "
           "drafts accepted in %llu steps\n", N,
           (unsigned long long)(s1.accepted - s0.accepted),
           (unsigned long long)(s1.drafted - s0.drafted),
           (unsigned long long)(s1.steps - s0.steps));
}

/* Log probabilities through the GPU pipeline (computed in verifyd beside the logits, only
 * the records leaving the GPU): each emitted token's and its 5 best alternatives' equal the
 * log-softmax of a one-process GPU forward pass over prompt + output, within 1e-4, the same
 * alternatives in the same order. */
static void test_gpu_pipeline_logprobs_are_the_targets_log_softmax(void **ctx)
{
    (void)ctx;
    enum { GEN = 12, TOP = 5 };
    uint32_t prompt[32];
    int32_t ip[32 + GEN];
    const int64_t np = make_prompt(3, prompt, ip);
    msg_gen_start g = {.seq_id = next_seq++, .prompt = prompt, .n_prompt = (uint32_t)np,
                       .max_tokens = GEN, .sampler = {.top_p = 1.0f}, .ignore_eos = true,
                       .logprobs = true, .top_logprobs = TOP};
    if (pl_gen(&pl, &g) != TD_OK)
        fail_msg("gen_start: %s", err_msg());
    pl_result *r = wait_done(g.seq_id);
    assert_int_equal(r->n_tokens, GEN);
    assert_int_equal(r->n_logprobs, GEN);
    memcpy(ip + np, r->tokens, GEN * sizeof(int32_t));
    const int64_t V = tm->hp.n_vocab, T = np + GEN - 1;
    float *dlg = NULL, *lg = malloc((size_t)(T * V) * sizeof(float));
    assert_int_equal(gpu->alloc(gpu, (void **)&dlg, (size_t)(T * V) * sizeof(float)), TD_OK);
    tgt_state st;
    assert_int_equal(tgt_state_init(&st, tm, N_CTX), TD_OK);
    tgt_out o = {.logits = dlg};
    assert_int_equal(tgt_forward(tm, &st, ip, T, false, &o), TD_OK);
    assert_int_equal(gpu->to_host(gpu, lg, dlg, (size_t)(T * V) * sizeof(float)), TD_OK);
    assert_true(pl_logprobs_match(r, lg + (np - 1) * V, V, TOP, 1e-4));
    for (int i = 0; i < GEN; i++) /* greedy picks the most likely */
        assert_int_equal(r->logprobs[i].top_id[0], r->tokens[i]);
    tgt_state_free(&st);
    gpu->release(gpu, dlg);
    free(lg);
}

/* Prompt log probabilities through the GPU pipeline (max_tokens 0, then with 5 generated
 * tokens), prompts of 1, 16, 17 and 37 tokens: each PROMPT event's record has the bits of
 * cuda_logprob_rows on the rows of a one-process GPU prefill in 16-token passes keeping every
 * row's logits (as verifyd runs it), and is within 1e-4 of the log-softmax of one whole GPU
 * pass; the generated tokens are plain greedy decoding's. */
static void test_gpu_pipeline_prompt_logprobs_are_the_targets_log_softmax(void **ctx)
{
    (void)ctx;
    enum { TOP = 4, GEN = 5 };
    const int64_t lens[] = {1, 16, 17, 37};
    const int64_t V = tm->hp.n_vocab;
    for (size_t c = 0; c < sizeof lens / sizeof lens[0]; c++) {
        const int64_t n = lens[c];
        uint32_t p[64];
        int32_t ip[64];
        int64_t got = 0;
        for (int salt = 30; got < n; salt++) { /* make_prompt's ids, n of them */
            uint32_t u[32];
            int32_t i32[32];
            int64_t m = make_prompt(salt, u, i32);
            for (int64_t i = 0; i < m && got < n; i++, got++)
                p[got] = u[i], ip[got] = i32[i];
        }
        const size_t bytes = (size_t)(n * V) * sizeof(float);
        float *dlg = NULL, *dwhole = NULL, *whole = malloc(bytes);
        int32_t *dtok = NULL;
        ops_logprob *dlp = NULL, want[64];
        assert_int_equal(gpu->alloc(gpu, (void **)&dlg, bytes), TD_OK);
        assert_int_equal(gpu->alloc(gpu, (void **)&dwhole, bytes), TD_OK);
        assert_int_equal(gpu->alloc(gpu, (void **)&dtok, 64 * sizeof(int32_t)), TD_OK);
        assert_int_equal(gpu->alloc(gpu, (void **)&dlp, 64 * sizeof(ops_logprob)), TD_OK);
        tgt_state st;
        assert_int_equal(tgt_state_init(&st, tm, N_CTX), TD_OK);
        for (int64_t at = 0; at < n; at += 16) {
            tgt_out o = {.logits = dlg + at * V};
            assert_int_equal(tgt_forward(tm, &st, ip + at, n - at < 16 ? n - at : 16, false, &o),
                             TD_OK);
        }
        assert_int_equal(tgt_state_reset(tm, &st), TD_OK);
        tgt_out o = {.logits = dwhole};
        assert_int_equal(tgt_forward(tm, &st, ip, n, false, &o), TD_OK);
        assert_int_equal(gpu->to_host(gpu, whole, dwhole, bytes), TD_OK);
        tgt_state_free(&st);
        if (n > 1) {
            assert_int_equal(gpu->to_device(gpu, dtok, ip + 1, (size_t)(n - 1) * sizeof(int32_t)),
                             TD_OK);
            assert_int_equal(gpu->logprob_rows(gpu, dlp, dlg, dtok, n - 1, V, TOP), TD_OK);
            assert_int_equal(gpu->to_host(gpu, want, dlp, (size_t)(n - 1) * sizeof *want), TD_OK);
        }
        for (int round = 0; round < 2; round++) {
            msg_gen_start g = {.seq_id = next_seq++, .prompt = p, .n_prompt = (uint32_t)n,
                               .max_tokens = round ? GEN : 0, .sampler = {.top_p = 1.0f},
                               .ignore_eos = true, .logprobs = true, .top_logprobs = TOP,
                               .prompt_logprobs = true};
            if (pl_gen(&pl, &g) != TD_OK)
                fail_msg("gen_start: %s", err_msg());
            pl_result *r = wait_done(g.seq_id);
            assert_int_equal(r->finish, MSG_FINISH_LENGTH);
            assert_int_equal(r->n_prompt, n - 1);
            assert_false(r->prompt_late);
            assert_int_equal(r->usage.prompt_tokens, n);
            assert_int_equal(r->usage.cached_tokens, 0);
            for (int64_t i = 0; i + 1 < n; i++) {
                const msg_logprob *lp = &r->prompt_lp[i];
                assert_int_equal(r->prompt[i], ip[i + 1]);
                if (!(lp->logprob == want[i].logprob) || lp->n_top != TOP)
                    fail_msg("prompt of %lld, token %lld: %.9g with %u alternatives, the "
                             "reference rows %.9g", (long long)n, (long long)i + 1,
                             lp->logprob, lp->n_top, want[i].logprob);
                for (int k = 0; k < TOP; k++) {
                    assert_int_equal(lp->top_id[k], want[i].top_id[k]);
                    assert_true(lp->top_logprob[k] == want[i].top_logprob[k]);
                }
                const float *row = whole + i * V;
                const double lse = pl_logsumexp(row, V);
                if (!(fabs(row[ip[i + 1]] - lse - lp->logprob) < 1e-4))
                    fail_msg("prompt of %lld, token %lld: %.9g, one whole pass gives %.9g",
                             (long long)n, (long long)i + 1, lp->logprob, row[ip[i + 1]] - lse);
            }
            if (round == 0) {
                assert_int_equal(r->n_tokens, 0);
            } else {
                int32_t plain[GEN];
                ops_sampler g0 = {0};
                reference(NULL, ip, n, GEN, &g0, plain);
                expect_tokens("greedy after prompt log probabilities", r, plain, GEN);
            }
        }
        gpu->release(gpu, dlp);
        gpu->release(gpu, dtok);
        gpu->release(gpu, dwhole);
        gpu->release(gpu, dlg);
        free(whole);
    }
}

/* A prediction equal to the output (OpenAI's predicted outputs) drafts the blocks: the greedy
 * tokens of plain decoding on the GPU in 3 steps with 45 predicted tokens accepted (after the
 * prefill's token, three blocks of 15 and a bonus token each); one wrong every seventh token
 * still gives the same tokens with fewer accepted. */
static void test_gpu_pipeline_a_prediction_drafts_the_output(void **ctx)
{
    (void)ctx;
    enum { GEN = 48 };
    uint32_t p[32], pred[2][GEN];
    int32_t want[GEN];
    const int64_t n = greedy_case(17, p, GEN, want);
    for (int i = 0; i < GEN; i++) {
        pred[0][i] = (uint32_t)want[i];
        pred[1][i] = i % 7 == 6 ? (uint32_t)(want[i] + 1) % (uint32_t)tm->hp.n_vocab
                                : (uint32_t)want[i];
    }
    uint32_t accepted[2];
    for (int k = 0; k < 2; k++) {
        msg_gen_start g = {.seq_id = next_seq++, .prompt = p, .n_prompt = (uint32_t)n,
                           .max_tokens = GEN, .sampler = {.top_p = 1.0f}, .ignore_eos = true,
                           .predict = pred[k], .n_predict = GEN};
        if (pl_gen(&pl, &g) != TD_OK)
            fail_msg("gen_start: %s", err_msg());
        pl_result *r = wait_done(g.seq_id);
        expect_tokens(k ? "greedy with a prediction partly wrong" : "greedy with its prediction",
                      r, want, GEN);
        accepted[k] = r->usage.predicted_tokens;
        if (k == 0)
            assert_int_equal(r->usage.steps, 3);
    }
    assert_int_equal(accepted[0], 45);
    assert_true(accepted[1] > 0 && accepted[1] < accepted[0]);
}

/* kill -9 draftd in the middle of a generation: verifyd decodes plainly with the same tokens;
 * a restarted draftd maps the pools and heads again and speculates with identical output. */
static void test_gpu_pipeline_kill_draftd_mid_generation_keeps_the_text(void **ctx)
{
    (void)ctx;
    enum { GEN = 200 };
    uint32_t p[32];
    int32_t want[GEN];
    msg_sampler greedy = {.top_p = 1.0f};
    int64_t n = greedy_case(11, p, GEN, want);
    msg_status s0, s1, s2;
    assert_int_equal(pl_status(&pl, &s0), TD_OK);
    uint64_t id = start(p, n, GEN, &greedy);
    assert_non_null(pl_wait_tokens(&pl, id, 30, WAIT_MS));
    assert_int_equal(pl_stop(&pl, PL_DRAFTD, SIGKILL), 128 + SIGKILL);
    pl_result *r = wait_done(id);
    expect_tokens("greedy across kill -9 of draftd", r, want, GEN);
    assert_int_equal(pl_status(&pl, &s1), TD_OK);
    assert_false(s1.draft_attached);

    pl_start(&pl, PL_DRAFTD, dd_args);
    assert_int_equal(pl_wait_ready(&pl, true, 60000), TD_OK);
    id = start(p, n, GEN, &greedy);
    r = wait_done(id);
    expect_tokens("greedy after draftd came back", r, want, GEN);
    assert_int_equal(pl_status(&pl, &s2), TD_OK);
    assert_true(s2.drafted > s1.drafted);
}

/* Sampling with a seed: the pipeline's tokens and steps equal the single-process speculative
 * loop on the GPU with the same drafter and seed, for several settings. */
static void test_gpu_pipeline_sampled_tokens_equal_the_single_process_loop(void **ctx)
{
    (void)ctx;
    enum { GEN = 40, K = 3 };
    const msg_sampler smp[K] = {
        {.temperature = 0.8f, .top_p = 1.0f, .seed = 1},
        {.temperature = 1.0f, .top_k = 40, .top_p = 0.9f, .seed = 77},
        {.temperature = 0.6f, .top_p = 1.0f, .min_p = 0.05f, .seed = 12345},
    };
    for (int k = 0; k < K; k++) {
        uint32_t p[32];
        int32_t ip[32], want[GEN];
        int64_t n = make_prompt(20 + k, p, ip);
        ops_sampler os = {.temperature = smp[k].temperature, .top_k = (int32_t)smp[k].top_k,
                          .top_p = smp[k].top_p, .min_p = smp[k].min_p, .seed = smp[k].seed};
        spec_stats st = reference(dm, ip, n, GEN, &os, want);
        pl_result *r = wait_done(start(p, n, GEN, &smp[k]));
        char what[64];
        snprintf(what, sizeof what, "sampled, seed %llu", (unsigned long long)smp[k].seed);
        expect_tokens(what, r, want, GEN);
        assert_int_equal(r->usage.steps, st.steps);
    }
}

/* kvd's log so far; "" when it cannot be read. */
static const char *kvd_log(void)
{
    static char buf[1 << 16];
    char path[128];
    snprintf(path, sizeof path, "%s/kvd.log", pl.dir);
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    return buf;
}

/* kvd without --slots sizes its pools on the GPU at verifyd's attach: refused, with what a
 * slot takes, where --gpu-mem leaves no room; 16 slots (the most) where the tiny models leave
 * plenty, and the pipeline decodes as before on them. */
static void test_gpu_pipeline_kvd_sizes_its_pools_to_the_gpu(void **ctx)
{
    (void)ctx;
    static const char *const tight[] = {"--device", "cuda", "--gpu-mem", "1", "--log-level",
                                        "info", NULL};
    static const char *const fit[] = {"--device", "cuda", "--log-level", "info", NULL};
    assert_int_equal(pl_stop(&pl, PL_KVD, SIGTERM), 0);
    pl_start(&pl, PL_KVD, tight);
    struct timespec ts = {2, 0}; /* verifyd notices kvd's restart and tries to attach */
    nanosleep(&ts, NULL);
    msg_status st;
    assert_int_equal(pl_status(&pl, &st), TD_OK);
    assert_false(st.ready);
    const char *log = kvd_log();
    if (!strstr(log, "the pools do not fit the GPU") ||
        !strstr(log, "one sequence slot of 256 positions takes")) {
        pl_dump_logs(&pl);
        fail_msg("kvd did not refuse the attach for want of room");
    }
    assert_int_equal(pl_stop(&pl, PL_KVD, SIGTERM), 0);
    pl_start(&pl, PL_KVD, fit);
    assert_int_equal(pl_wait_ready(&pl, false, 60000), TD_OK);
    assert_int_equal(pl_status(&pl, &st), TD_OK);
    assert_int_equal(st.slots, 16);
    assert_non_null(strstr(kvd_log(), "sized the pools to the GPU: 16 slots of 256 positions"));
    enum { GEN = 40 };
    uint32_t p[32];
    int32_t want[GEN];
    msg_sampler greedy = {.top_p = 1.0f};
    int64_t n = greedy_case(31, p, GEN, want);
    expect_tokens("greedy on pools sized to the GPU", wait_done(start(p, n, GEN, &greedy)),
                  want, GEN);
}

int main(void)
{
    if (!cuda_available() || ops_backend_cuda_init(&gpu, 0) != TD_OK) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    int rc = pl_setup(&pl);
    if (rc != 0) {
        ops_backend_cuda_free(gpu);
        return rc == 77 ? 77 : 1;
    }
    if (start_all()) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_gpu_pipeline_verifyd_holds_embedding_and_head_once),
            cmocka_unit_test(test_gpu_pipeline_greedy_equals_single_process_plain_greedy),
            cmocka_unit_test(test_gpu_pipeline_sampled_tokens_equal_the_single_process_loop),
            cmocka_unit_test(test_gpu_pipeline_logprobs_are_the_targets_log_softmax),
            cmocka_unit_test(test_gpu_pipeline_prompt_logprobs_are_the_targets_log_softmax),
            cmocka_unit_test(test_gpu_pipeline_a_prediction_drafts_the_output),
            cmocka_unit_test(test_gpu_pipeline_kill_draftd_mid_generation_keeps_the_text),
            cmocka_unit_test(test_gpu_pipeline_kvd_sizes_its_pools_to_the_gpu),
        };
        rc = cmocka_run_group_tests(tests, NULL, NULL);
    } else {
        rc = 1;
    }
    msg_status st;
    if (pl_status(&pl, &st) == TD_OK) {
        printf("verifyd: draft attached %d, attaches %llu, failures %llu, drafted %llu, "
               "accepted %llu, steps %llu; graphs: %llu recorded, %llu replays, %llu passes op "
               "by op\n", st.draft_attached,
               (unsigned long long)st.draft_attaches, (unsigned long long)st.draft_failures,
               (unsigned long long)st.drafted, (unsigned long long)st.accepted,
               (unsigned long long)st.steps, (unsigned long long)st.graph_recorded,
               (unsigned long long)st.graph_replayed, (unsigned long long)st.graph_direct);
        /* the generations above decode many steps of one size: verifyd records and replays */
        if (rc == 0 && (st.graph_recorded == 0 || st.graph_replayed <= st.graph_recorded ||
                        st.graph_direct == 0)) {
            fprintf(stderr, "verifyd's status counts no CUDA graph replays\n");
            rc = 1;
        }
    }
    if (rc != 0) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "ls -la %s >&2", pl.dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot list %s\n", pl.dir);
        pl_dump_logs(&pl); /* every daemon's log, so a GPU run says why */
    }
    if (pl_teardown(&pl) != 0)
        rc = 1; /* a daemon did not exit cleanly (its log is printed) */
    dfl_free(dm);
    tgt_free(tm);
    ops_backend_cuda_free(gpu);
    return rc;
}
