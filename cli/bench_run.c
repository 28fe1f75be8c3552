/* The timed parts of `tandem bench` (see bench_run.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/bench_run.h"
#include "common/args.h"
#include "draftd/dflash.h"

#define BENCH_WARMUP 2
#define BENCH_RND (1u << 22) /* floats of random values copied over state arrays */

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Whether the runs are followed by profiled ones: a profiler that skips ops (--skip-ops) only
 * times what is left. */
static bool bench_profiling(const ops_backend *be)
{
    return ops_prof_active(be) && !ops_prof_skipping(be);
}

static int bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void bench_done(bench_time *t, double *s, int n)
{
    qsort(s, (size_t)n, sizeof s[0], bench_cmp);
    t->ok = true;
    t->iters = n;
    t->ms = s[n / 2] * 1e3;
}

/* The mean in milliseconds of n runs in seconds: comparable with the profile's summed op
 * times, where a median is not. */
static double bench_mean_ms(const double *s, int n)
{
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += s[i];
    return sum / n * 1e3;
}

static void bench_fail(bench_time *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bench_fail(bench_time *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->why, sizeof t->why, fmt, ap);
    va_end(ap);
    t->ok = false;
}

static const char *const bench_parts[] = {"decode", "decode32k", "verify16", "verify32",
                                          "prefill", "prefill-chunked", "draft", "sampling",
                                          "split", "verify16-32k", "verify-short", "graphs"};

const char *bench_part_names(void)
{
    static char names[160];
    if (!names[0])
        for (size_t i = 0, at = 0; i < sizeof bench_parts / sizeof bench_parts[0]; i++)
            at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "",
                                   bench_parts[i]);
    return names;
}

td_err bench_parts_parse(const char *list, unsigned *parts)
{
    const int n = (int)(sizeof bench_parts / sizeof bench_parts[0]);
    char hint[200];
    snprintf(hint, sizeof hint, "the parts: %s", bench_part_names());
    uint64_t mask = 0;
    TD_TRY(args_names(list, bench_parts, n, &mask, "part", hint));
    if (!mask)
        return err_set(TD_EINVAL, "the list names no part (%s)", hint);
    *parts = (unsigned)mask;
    return TD_OK;
}

void bench_skip(bench_time *t)
{
    bench_fail(t, "%s", BENCH_SKIPPED);
}

/* Uniform values in [-1, 1): finite stand-ins for keys, values and recurrent state. */
static float *bench_random(size_t n, uint64_t seed)
{
    float *r = malloc(n * sizeof *r);
    if (!r)
        return NULL;
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        r[i] = (float)((s * 0x2545f4914f6cdd1dull) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    }
    return r;
}

/* --- copy bandwidth ---------------------------------------------------------------------- */

void bench_copy_bw(const ops_backend *be, size_t bytes, int iters, bench_time *t, double *gbps)
{
    void *src = NULL, *dst = NULL;
    double *s = malloc((size_t)iters * sizeof *s);
    *gbps = 0;
    td_err e = s ? be->alloc(be, &src, bytes) : err_set(TD_ENOMEM, "out of memory");
    if (e == TD_OK)
        e = be->alloc(be, &dst, bytes);
    /* Touched before timing: first use of fresh pages is not the copy's cost. */
    if (e == TD_OK)
        e = be->zero(be, src, bytes);
    if (e == TD_OK)
        e = be->zero(be, dst, bytes);
    for (int i = -BENCH_WARMUP; e == TD_OK && i < iters; i++) {
        double t0 = bench_now();
        e = be->copy(be, dst, src, bytes);
        if (e == TD_OK)
            e = be->sync(be);
        if (i >= 0)
            s[i] = bench_now() - t0;
    }
    if (e == TD_OK) {
        bench_done(t, s, iters);
        *gbps = 2.0 * (double)bytes / (t->ms * 1e-3) / 1e9;
    } else {
        bench_fail(t, "copying %zu bytes: %s", bytes, err_msg());
    }
    be->release(be, src);
    be->release(be, dst);
    free(s);
}

/* --- the target ---------------------------------------------------------------------------- */

typedef struct bench_tgt {
    const tgt_model *m;
    const ops_backend *be;
    tgt_state st;
    float *logits;      /* backend [32][n_vocab] */
    float *tap_out;     /* backend [pass][n_taps][n_embd], or NULL */
    const int32_t *taps;
    int64_t n_taps;
    int64_t pass;       /* tokens per prefill forward pass */
    int32_t tokens[BENCH_PREFILL_MAX]; /* host: ids of a block or a prompt chunk */
    double *s;          /* [iters] seconds */
} bench_tgt;

/* Copies the random values over n floats of backend memory. */
static td_err bench_fill(const ops_backend *be, float *dst, size_t n, const float *rnd)
{
    for (size_t off = 0; off < n; off += BENCH_RND) {
        size_t k = n - off < BENCH_RND ? n - off : BENCH_RND;
        TD_TRY(be->to_device(be, dst + off, rnd, k * sizeof(float)));
    }
    return TD_OK;
}

static td_err bench_state_fill(bench_tgt *b)
{
    const tgt_hparams *hp = &b->m->hp;
    float *rnd = bench_random(BENCH_RND, 7);
    if (!rnd)
        return err_set(TD_ENOMEM, "out of memory");
    size_t kv = (size_t)(b->st.n_ctx * hp->n_head_kv * hp->head_dim);
    size_t ssm = (size_t)(hp->n_v_head * hp->d_k * hp->d_v);
    size_t conv = (size_t)((hp->conv_k - 1) * hp->conv_ch);
    td_err e = TD_OK;
    if (b->st.kv_type == TD_F16) {
        /* an f16 cache gets the same values as halves: 2 halves per float slot copied */
        uint16_t *h = (uint16_t *)rnd;
        for (size_t i = 0; i < BENCH_RND; i++)
            h[i] = ops_f32_to_f16(rnd[i]); /* in place, front to back: i < 2i */
        kv /= 2;
    }
    for (int64_t l = 0; e == TD_OK && l < b->st.n_attn; l++) {
        e = bench_fill(b->be, b->st.k[l], kv, rnd);
        if (e == TD_OK)
            e = bench_fill(b->be, b->st.v[l], kv, rnd);
    }
    if (b->st.kv_type == TD_F16) {
        free(rnd); /* the recurrent state wants floats again */
        rnd = bench_random(BENCH_RND, 7);
        if (!rnd)
            return err_set(TD_ENOMEM, "out of memory");
    }
    for (int64_t l = 0; e == TD_OK && l < b->st.n_delta; l++) {
        e = bench_fill(b->be, b->st.ssm[l], ssm, rnd);
        if (e == TD_OK)
            e = bench_fill(b->be, b->st.conv[l], conv, rnd);
    }
    if (e == TD_OK)
        e = b->be->sync(b->be);
    free(rnd);
    return e;
}

/* One forward of n tokens at context ctx, synced. */
static td_err bench_forward(bench_tgt *b, int64_t ctx, int64_t n)
{
    tgt_out out = {.logits = b->logits, .last_only = n == 1, .taps = n > 1 ? b->taps : NULL,
                   .n_taps = n > 1 ? b->n_taps : 0, .tap_out = n > 1 ? b->tap_out : NULL};
    b->st.n_past = ctx;
    TD_TRY(tgt_forward(b->m, &b->st, b->tokens, n, n > 1, &out));
    return b->be->sync(b->be);
}

/* With a profiling backend: BENCH_PROF_ITERS more forwards, profiled (the rollback after each
 * is not), into t->prof and t->prof_ms. */
static void bench_step_profile(bench_tgt *b, int64_t ctx, int64_t n, bench_time *t, int64_t keep)
{
    const ops_backend *be = b->be;
    double s[BENCH_PROF_ITERS];
    td_err e = TD_OK;
    ops_prof_reset(be);
    for (int i = 0; e == TD_OK && i < BENCH_PROF_ITERS; i++) {
        ops_prof_enable(be, true);
        double t0 = bench_now();
        e = bench_forward(b, ctx, n);
        s[i] = bench_now() - t0;
        ops_prof_step(be);
        ops_prof_enable(be, false);
        if (e == TD_OK && keep)
            e = tgt_state_keep(b->m, &b->st, keep);
    }
    if (e == TD_OK)
        e = ops_prof_snapshot(be, &t->prof);
    if (e == TD_OK) {
        t->prof_ms = bench_mean_ms(s, BENCH_PROF_ITERS);
    } else {
        memset(&t->prof, 0, sizeof t->prof);
    }
}

/* One forward of n tokens at context ctx, iters times; with keep > 0 each is followed by a
 * rollback to keep tokens, timed into *rb. */
static void bench_step(bench_tgt *b, int64_t ctx, int64_t n, int iters, bench_time *t,
                       int64_t keep, bench_time *rb)
{
    double *r = keep ? malloc((size_t)iters * sizeof *r) : NULL;
    td_err e = keep && !r ? err_set(TD_ENOMEM, "out of memory") : TD_OK;
    for (int i = -BENCH_WARMUP; e == TD_OK && i < iters; i++) {
        double t0 = bench_now();
        e = bench_forward(b, ctx, n);
        double t1 = bench_now();
        if (e == TD_OK && keep) {
            e = tgt_state_keep(b->m, &b->st, keep);
            if (e == TD_OK)
                e = b->be->sync(b->be);
            if (i >= 0)
                r[i] = bench_now() - t1;
        }
        if (i >= 0)
            b->s[i] = t1 - t0;
    }
    if (e == TD_OK) {
        bench_done(t, b->s, iters);
        if (keep)
            bench_done(rb, r, iters);
        if (bench_profiling(b->be))
            bench_step_profile(b, ctx, n, t, keep);
    } else {
        bench_fail(t, "%s", err_msg());
        if (keep)
            bench_fail(rb, "%s", err_msg());
    }
    free(r);
}

/* bench_step without a rollback where the part is wanted, else marks t as skipped. */
static void bench_part(bench_tgt *b, unsigned wanted, int64_t ctx, int64_t n, int iters,
                       bench_time *t)
{
    if (wanted)
        bench_step(b, ctx, n, iters, t, 0, NULL);
    else
        bench_skip(t);
}

/* What a pass of n tokens at BENCH_CTX_SHORT costs before it replays a recording
 * (verifyd/graph_pick.h): run op by op the first time it comes (*direct), recorded and
 * replayed the second (*record); each pair from a model that has forgotten its recordings.
 * Not measured where forward passes are not recorded. */
static void bench_graph_costs(bench_tgt *b, int64_t n, int iters, bench_time *direct,
                              bench_time *record)
{
    double *r = malloc((size_t)iters * sizeof *r);
    td_err e = r ? TD_OK : err_set(TD_ENOMEM, "out of memory");
    tgt_graph_counts c0, c1;
    tgt_graph_stats(b->m, &c0);
    for (int i = -1; e == TD_OK && i < iters; i++) {
        tgt_graphs_forget(b->m);
        double t0 = bench_now();
        e = bench_forward(b, BENCH_CTX_SHORT, n);
        double t1 = bench_now();
        if (e == TD_OK)
            e = bench_forward(b, BENCH_CTX_SHORT, n);
        if (i >= 0) {
            b->s[i] = t1 - t0;
            r[i] = bench_now() - t1;
        }
    }
    tgt_graph_stats(b->m, &c1);
    if (e != TD_OK) {
        bench_fail(direct, "%s", err_msg());
        bench_fail(record, "%s", err_msg());
    } else if (c1.recorded == c0.recorded) {
        bench_fail(direct, "forward passes are not recorded here (no CUDA graphs)");
        bench_fail(record, "forward passes are not recorded here (no CUDA graphs)");
    } else {
        bench_done(direct, b->s, iters);
        bench_done(record, r, iters);
    }
    tgt_graphs_forget(b->m);
    free(r);
}

/* One prompt of BENCH_PROMPT tokens from position 0, in chunks of b->pass as verifyd
 * prefills (taps of every position, logits of the last), synced at the end. */
static td_err bench_prompt(bench_tgt *b)
{
    b->st.n_past = 0;
    for (int64_t at = 0; at < BENCH_PROMPT; at += b->pass) {
        tgt_out out = {.logits = b->logits, .last_only = true, .taps = b->taps,
                       .n_taps = b->n_taps, .tap_out = b->tap_out};
        TD_TRY(tgt_forward(b->m, &b->st, b->tokens, b->pass, false, &out));
        if (bench_profiling(b->be))
            ops_prof_step(b->be); /* the profile's rows are per chunk */
    }
    return b->be->sync(b->be);
}

/* The prompt iters times (fewer where a run is long: at most ~20 s in all), then profiled. */
static void bench_prefill(bench_tgt *b, int iters, bench_time *t)
{
    td_err e = bench_prompt(b); /* warm-up: scratch growth, graph recordings */
    int n = 0;
    double spent = 0;
    while (e == TD_OK && n < iters && (n < 3 || spent < 20)) {
        double t0 = bench_now();
        e = bench_prompt(b);
        b->s[n] = bench_now() - t0;
        spent += b->s[n++];
    }
    if (e != TD_OK) {
        bench_fail(t, "%s", err_msg());
        return;
    }
    bench_done(t, b->s, n);
    if (!bench_profiling(b->be))
        return;
    ops_prof_reset(b->be);
    ops_prof_enable(b->be, true);
    double t0 = bench_now();
    e = bench_prompt(b);
    double s = bench_now() - t0;
    ops_prof_enable(b->be, false);
    if (e == TD_OK)
        e = ops_prof_snapshot(b->be, &t->prof);
    if (e == TD_OK)
        t->prof_ms = s * 1e3 / (double)(BENCH_PROMPT / b->pass);
    else
        memset(&t->prof, 0, sizeof t->prof);
}

void bench_target(tgt_model *m, const int32_t *taps, int64_t n_taps, int iters,
                  const bench_prefill_cfg *pf, unsigned parts, bench_target_times *out)
{
    memset(out, 0, sizeof *out);
    TD_ASSERT(pf->pass >= 1 && pf->pass <= BENCH_PREFILL_MAX && BENCH_PROMPT % pf->pass == 0);
    bench_tgt b = {.m = m, .be = m->be, .taps = taps, .n_taps = n_taps, .pass = pf->pass};
    const tgt_hparams *hp = &m->hp;
    for (int i = 0; i < BENCH_PREFILL_MAX; i++)
        b.tokens[i] = (int32_t)((1000 + 7919 * i) % hp->n_vocab);
    b.s = malloc((size_t)iters * sizeof *b.s);
    td_err e = b.s ? TD_OK : err_set(TD_ENOMEM, "out of memory");
    if (e == TD_OK)
        e = b.be->alloc(b.be, (void **)&b.logits, (size_t)(32 * hp->n_vocab) * sizeof(float));
    if (e == TD_OK && n_taps)
        e = b.be->alloc(b.be, (void **)&b.tap_out,
                        (size_t)(b.pass * n_taps * hp->n_embd) * sizeof(float));
    /* Room for the long context plus a block. */
    if (e == TD_OK)
        e = tgt_state_init(&b.st, m, BENCH_CTX_LONG + 64);
    if (e == TD_OK)
        e = bench_state_fill(&b);
    if (e != TD_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", err_msg());
        bench_fail(&out->decode_short, "%s", why);
        bench_fail(&out->decode_long, "%s", why);
        bench_fail(&out->verify16, "%s", why);
        bench_fail(&out->verify32, "%s", why);
        bench_fail(&out->verify4, "%s", why);
        bench_fail(&out->verify8, "%s", why);
        bench_fail(&out->verify16_long, "%s", why);
        bench_fail(&out->rollback, "%s", why);
        bench_fail(&out->prefill, "%s", why);
        bench_fail(&out->prefill_chunked, "%s", why);
        bench_fail(&out->graph_direct1, "%s", why);
        bench_fail(&out->graph_record1, "%s", why);
        bench_fail(&out->graph_direct16, "%s", why);
        bench_fail(&out->graph_record16, "%s", why);
    } else {
        bench_part(&b, parts & BENCH_PART_DECODE, BENCH_CTX_SHORT, 1, iters, &out->decode_short);
        bench_part(&b, parts & BENCH_PART_DECODE32K, BENCH_CTX_LONG, 1, iters, &out->decode_long);
        if (parts & BENCH_PART_VERIFY16) {
            bench_step(&b, BENCH_CTX_SHORT, 16, iters, &out->verify16, BENCH_KEEP, &out->rollback);
        } else {
            bench_skip(&out->verify16);
            bench_skip(&out->rollback);
        }
        bench_part(&b, parts & BENCH_PART_VERIFY32, BENCH_CTX_SHORT, 32, iters, &out->verify32);
        bench_part(&b, parts & BENCH_PART_VERIFY_SHORT, BENCH_CTX_SHORT, 4, iters, &out->verify4);
        bench_part(&b, parts & BENCH_PART_VERIFY_SHORT, BENCH_CTX_SHORT, 8, iters, &out->verify8);
        bench_part(&b, parts & BENCH_PART_VERIFY16_32K, BENCH_CTX_LONG, 16, iters,
                   &out->verify16_long);
        const int64_t was = m->delta_chunk;
        if (!(parts & BENCH_PART_PREFILL))
            bench_skip(&out->prefill);
        else if (tgt_set_delta_chunk(m, 0) == TD_OK)
            bench_prefill(&b, iters, &out->prefill);
        else
            bench_fail(&out->prefill, "%s", err_msg());
        if (!(parts & BENCH_PART_PREFILL_CHUNKED))
            bench_skip(&out->prefill_chunked);
        else if (tgt_set_delta_chunk(m, pf->delta_chunk) == TD_OK)
            bench_prefill(&b, iters, &out->prefill_chunked);
        else
            bench_fail(&out->prefill_chunked, "%s", err_msg());
        m->delta_chunk = was;
        if (parts & BENCH_PART_GRAPHS) {
            bench_graph_costs(&b, 1, iters, &out->graph_direct1, &out->graph_record1);
            bench_graph_costs(&b, 16, iters, &out->graph_direct16, &out->graph_record16);
        } else {
            bench_skip(&out->graph_direct1);
            bench_skip(&out->graph_record1);
            bench_skip(&out->graph_direct16);
            bench_skip(&out->graph_record16);
        }
    }
    if (b.st.be)
        tgt_state_free(&b.st);
    if (b.logits)
        b.be->release(b.be, b.logits);
    if (b.tap_out)
        b.be->release(b.be, b.tap_out);
    free(b.s);
}

/* --- the drafter ----------------------------------------------------------------------------- */

const int bench_draft_sizes[BENCH_DRAFT_SIZES] = {16, 8, 4};

/* The timed runs of one block size b: b new context positions, then a block's b - 1 rows of
 * logits; with prof, BENCH_PROF_ITERS profiled runs after them. */
static td_err bench_draft_size(const tgt_model *m, dfl_model *dm, dfl_state *ds,
                               const float *feat, float *logits, int64_t b, int iters,
                               bool prof, bench_time *t, double *s, double *q)
{
    const ops_backend *be = m->be;
    int n_prof = prof ? BENCH_PROF_ITERS : 0;
    double ps[BENCH_PROF_ITERS];
    td_err e = TD_OK;
    for (int i = -BENCH_WARMUP; e == TD_OK && i < iters + n_prof; i++) {
        if (i == iters) {
            ops_prof_reset(be);
            ops_prof_enable(be, true);
        }
        double t0 = bench_now();
        e = dfl_add_context(dm, ds, feat, b);
        if (e == TD_OK)
            e = dfl_propose(dm, ds, (int32_t)(4242 % m->hp.n_vocab), b - 1, logits);
        double t1 = bench_now();
        if (e == TD_OK)
            e = be->sync(be);
        if (i >= iters) {
            ps[i - iters] = bench_now() - t0;
            ops_prof_step(be);
        } else if (i >= 0) {
            s[i] = bench_now() - t0;
            q[i] = t1 - t0;
        }
    }
    ops_prof_enable(be, false);
    if (e != TD_OK)
        return e;
    bench_done(t, q, iters); /* the host's queueing time first: bench_done sorts */
    double host = t->ms;
    bench_done(t, s, iters);
    t->host_ms = host;
    if (prof && ops_prof_snapshot(be, &t->prof) == TD_OK)
        t->prof_ms = bench_mean_ms(ps, BENCH_PROF_ITERS);
    return TD_OK;
}

/* The draft steps on the model's backend, with the embedding and LM head borrowed from the
 * placed target. Each timed step ends with a sync so GPU work is counted, not just
 * enqueued; only the whole block's step is profiled. */
void bench_draft(const tgt_model *m, const char *dir, int iters,
                 bench_time t[BENCH_DRAFT_SIZES], const char **backend, const char **numerics)
{
    const ops_backend *be = m->be;
    memset(t, 0, BENCH_DRAFT_SIZES * sizeof *t);
    *backend = be->name;
    *numerics = "";
    dfl_model *dm = NULL;
    dfl_state ds;
    memset(&ds, 0, sizeof ds);
    float *feat = NULL, *logits = NULL;
    double *s = malloc((size_t)iters * sizeof *s), *q = malloc((size_t)iters * sizeof *q);
    td_err e = s && q ? dfl_load_on(&dm, dir, (uint32_t)m->hp.n_layer, &m->tok_embd, &m->output, be)
                 : err_set(TD_ENOMEM, "out of memory");
    const int64_t chunk = 64;
    int64_t row = 0, B = 0;
    if (e == TD_OK) {
        row = (int64_t)dm->cfg.n_taps * m->hp.n_embd;
        B = dm->cfg.block_size;
        const bool f16 = dm->kv_type == TD_F16, bf16 = dm->lm_head.x_bf16;
        *numerics = f16 ? (bf16 ? "f16 context, bf16 inputs" : "f16 context, f32 inputs")
                        : (bf16 ? "f32 context, bf16 inputs" : "f32 context, f32 inputs");
        /* The ring holds the context, the block and every timed step's new positions. */
        const int64_t runs = iters + BENCH_WARMUP + BENCH_PROF_ITERS;
        e = dfl_state_init(&ds, dm, BENCH_CTX_SHORT + (B + 12) * runs + 64);
    }
    if (e == TD_OK && B > chunk)
        e = err_set(TD_EINVAL, "a drafter block of %lld tokens (at most %lld timed)",
                    (long long)B, (long long)chunk);
    if (e == TD_OK) {
        float *host = bench_random((size_t)(chunk * row), 11);
        e = host ? ops_backend_upload(be, (void **)&feat, host,
                                      (size_t)(chunk * row) * sizeof(float))
                 : err_set(TD_ENOMEM, "out of memory");
        free(host);
    }
    if (e == TD_OK)
        e = be->alloc(be, (void **)&logits,
                      (size_t)((B - 1) * m->hp.n_vocab) * sizeof *logits);
    for (int64_t p = 0; e == TD_OK && p < BENCH_CTX_SHORT; p += chunk)
        e = dfl_add_context(dm, &ds, feat, chunk);
    if (e == TD_OK)
        e = be->sync(be);
    for (int k = 0; k < BENCH_DRAFT_SIZES; k++) {
        const int64_t b = k ? bench_draft_sizes[k] : B;
        if (e != TD_OK)
            bench_fail(&t[k], "%s", err_msg());
        else if (k && b >= B)
            bench_fail(&t[k], "the drafter's blocks are %lld tokens", (long long)B);
        else if (bench_draft_size(m, dm, &ds, feat, logits, b, iters, !k && bench_profiling(be),
                                  &t[k], s, q) != TD_OK) {
            e = TD_EINVAL;
            bench_fail(&t[k], "%s", err_msg());
        }
    }
    if (dm) {
        dfl_state_free(&ds);
        dfl_free(dm);
    }
    be->release(be, feat);
    be->release(be, logits);
    free(s);
    free(q);
}

/* --- sampling ------------------------------------------------------------------------------ */

const char *const bench_sampler_names[BENCH_SAMPLERS] = {"temperature 0.8",
                                                         "temperature 0.8, top_p 0.95", "greedy"};

void bench_sampling(const ops_backend *be, int64_t V, int64_t B, int iters, bench_time *draw,
                    bench_time *accept)
{
    static const ops_sampler smp[BENCH_SAMPLERS] = {
        {.temperature = 0.8f, .top_p = 1.0f, .seed = 42},
        {.temperature = 0.8f, .top_p = 0.95f, .seed = 42},
        {.temperature = 0.0f, .top_p = 1.0f, .seed = 42},
    };
    memset(draw, 0, BENCH_SAMPLERS * sizeof *draw);
    memset(accept, 0, BENCH_SAMPLERS * sizeof *accept);
    const size_t n = (size_t)B * (size_t)V;
    float *logits = NULL, *p = NULL, *q = NULL;
    int32_t *ids = NULL; /* [B - 1] drafts, the acceptance result [2], greedy's argmax [B] */
    double *sd = malloc((size_t)iters * sizeof *sd), *sa = malloc((size_t)iters * sizeof *sa);
    float *host = bench_random(n, 13);
    td_err e = sd && sa && host && B >= 2 ? TD_OK : err_set(TD_ENOMEM, "out of memory");
    if (e == TD_OK) {
        for (size_t i = 0; i < n; i++)
            host[i] *= 8.0f; /* peaked enough that top_p cuts */
        e = ops_backend_upload(be, (void **)&logits, host, n * sizeof *host);
    }
    if (e == TD_OK)
        e = be->alloc(be, (void **)&p, n * sizeof *p);
    if (e == TD_OK)
        e = be->alloc(be, (void **)&q, (n - (size_t)V) * sizeof *q);
    if (e == TD_OK)
        e = be->alloc(be, (void **)&ids, (size_t)(2 * B + 1) * sizeof *ids);
    const ops_accept_rng rng = {.accept = 1, .target = 0, .step = 4};
    for (int k = 0; k < BENCH_SAMPLERS; k++) {
        for (int i = -BENCH_WARMUP; e == TD_OK && i < iters; i++) {
            const bool greedy = smp[k].temperature == 0;
            double t0 = bench_now();
            e = greedy ? be->argmax(be, ids, logits + V, B - 1, V)
                       : be->sample_rows(be, ids, q, logits + V, B - 1, V, &smp[k], 2, 4);
            if (e == TD_OK)
                e = be->sync(be);
            double t1 = bench_now();
            if (e == TD_OK && greedy)
                e = be->accept_greedy(be, ids + B + 1, ids + B - 1, logits, ids, B, V);
            else if (e == TD_OK)
                e = be->accept_sampled(be, ids + B - 1, p, logits, q, ids, B, V, &smp[k], &rng);
            if (e == TD_OK)
                e = be->sync(be);
            if (i >= 0) {
                sd[i] = t1 - t0;
                sa[i] = bench_now() - t1;
            }
        }
        if (e == TD_OK) {
            bench_done(&draw[k], sd, iters);
            bench_done(&accept[k], sa, iters);
        } else {
            bench_fail(&draw[k], "%s", err_msg());
            bench_fail(&accept[k], "%s", err_msg());
        }
    }
    be->release(be, logits);
    be->release(be, p);
    be->release(be, q);
    be->release(be, ids);
    free(host);
    free(sd);
    free(sa);
}

/* --- bytes per token ----------------------------------------------------------------------- */

uint64_t bench_weight_bytes(const tgt_model *m)
{
    const gguf_file *g = m->file;
    bool tied = gguf_find_tensor(g, "output.weight") == NULL;
    uint64_t total = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        long long layer;
        if (sscanf(t->name, "blk.%lld.", &layer) == 1 && layer >= m->hp.n_layer)
            continue; /* MTP blocks: never run */
        if (!strcmp(t->name, "token_embd.weight") && !tied)
            total += t->size / (uint64_t)t->ne[1]; /* one row looked up */
        else
            total += t->size;
    }
    return total;
}

uint64_t bench_draft_bytes(const tgt_model *m, const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_file *st;
    if (st_open(&st, path) != TD_OK)
        return 0;
    uint64_t total = 0;
    for (size_t i = 0; i < st->n_tensors; i++)
        total += st->tensors[i].bytes;
    st_close(st);
    const gguf_tensor *head = gguf_find_tensor(m->file, "output.weight");
    if (!head)
        head = gguf_find_tensor(m->file, "token_embd.weight");
    return total + (head ? head->size : 0);
}

uint64_t bench_state_bytes(const tgt_model *m, int64_t ctx)
{
    const tgt_hparams *hp = &m->hp;
    uint64_t f = sizeof(float), kv_elem = ops_kv_elem_bytes(m->kv_type);
    uint64_t kv = (uint64_t)m->n_attn_layers * (uint64_t)ctx * 2 *
                  (uint64_t)(hp->n_head_kv * hp->head_dim) * kv_elem;
    uint64_t rec = (uint64_t)m->n_delta_layers * 2 *
                   (uint64_t)(hp->n_v_head * hp->d_k * hp->d_v + (hp->conv_k - 1) * hp->conv_ch) * f;
    return kv + rec;
}
