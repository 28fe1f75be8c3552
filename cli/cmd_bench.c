/* tandem bench: how close the engine comes to the GPU's memory bandwidth on real model
 * shapes. Builds (or loads) a qwen35 model on the CUDA backend (the CPU backend when there is
 * no GPU, with a note), then prints, as a table and as JSON: the device's copy bandwidth,
 * weight bytes per decode token, plain decode at 1K and 32K context against the bandwidth
 * limit, verify of 16 and 32 tokens against one decode step, the drafter's step, the cost of
 * running verifyd and draftd as two processes (with and without MPS), and the speculative
 * tokens/s those times give at acceptance lengths 4, 6 and 8. With --profile (or
 * TANDEM_PROFILE=1) it also prints, per step of each phase, where the time goes: every
 * backend op's calls, kernel launches, device and host time (kernels/backend_prof.h). */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/bench_model.h"
#include "cli/bench_run.h"
#include "cli/bench_split.h"
#include "cli/cmd.h"
#include "common/args.h"
#include "common/cudrv.h"
#include "common/dflash_config.h"

#define BENCH_SEED 20260101u
#define BENCH_SPLIT_CALLS 2000
#define BENCH_NOTES 12

typedef struct bench_report {
    const char *shape;         /* synthetic shape name, or NULL with --model */
    char device[160];          /* "cuda:0 NVIDIA H200 (sm_90 code)", "cpu" */
    bool on_gpu;
    const char *model_path;    /* the GGUF timed */
    uint64_t model_bytes;      /* its size */
    double t_build, t_save, t_load; /* seconds: synthesise, write, load + upload */
    const char *draft_dir;
    const char *draft_backend;
    const char *draft_numerics; /* its context and products: "f16 context, f32 inputs" */
    bool draft_elsewhere;      /* the drafter ran on another backend than the target */
    uint64_t draft_bytes;      /* read per draft step: drafter weights + the target's LM head */
    uint64_t weight_bytes;     /* read per decode token */
    uint64_t state_short, state_long; /* KV + recurrent state bytes per decode token */
    size_t copy_bytes;         /* bytes per timed copy */
    bench_time copy;
    double copy_gbps;          /* (read + written) / time */
    bench_target_times tgt;
    bench_prefill_cfg prefill; /* how the prompt rows prefill */
    bench_time draft[BENCH_DRAFT_SIZES]; /* blocks of bench_draft_sizes[i] tokens */
    bench_time samp_draw[BENCH_SAMPLERS];   /* a block's drafts (sample_rows or argmax) */
    bench_time samp_accept[BENCH_SAMPLERS]; /* acceptance of a 16-token block */
    bsplit_result split, split_mps;
    int iters;
    char notes[BENCH_NOTES][320];
    int n_notes;
} bench_report;

static void bench_note(bench_report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bench_note(bench_report *r, const char *fmt, ...)
{
    if (r->n_notes == BENCH_NOTES)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->notes[r->n_notes++], sizeof r->notes[0], fmt, ap);
    va_end(ap);
}

/* Whether an environment entry ("NAME=value") is a TANDEM_ setting that can change what runs
 * or how fast (the _DIR variables only place files). */
static bool bench_env_setting(const char *entry)
{
    const char *eq = strchr(entry, '=');
    return strncmp(entry, "TANDEM_", 7) == 0 && eq &&
           !(eq - entry >= 4 && strncmp(eq - 4, "_DIR", 4) == 0);
}

/* A note naming the TANDEM_ settings of the environment, so that a report says which kernel
 * choices it ran with (none: no note). */
static void bench_note_env(bench_report *r)
{
    extern char **environ;
    char list[300] = "";
    size_t len = 0;
    for (char **e = environ; *e; e++)
        if (bench_env_setting(*e) && len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", len ? " " : "", *e);
    if (len)
        bench_note(r, "TANDEM_ settings in the environment: %s", list);
}

/* --- derived numbers --------------------------------------------------------------------- */

/* ms one decode token takes when bytes move at the measured copy bandwidth. */
static double bench_limit_ms(const bench_report *r, uint64_t bytes)
{
    return r->copy_gbps > 0 ? (double)bytes / (r->copy_gbps * 1e9) * 1e3 : 0;
}

/* The draft step for blocks of bench_draft_sizes[i] tokens (the whole block's where that one
 * was not measured); 0 when none was. */
static double bench_draft_ms(const bench_report *r, int i)
{
    return r->draft[i].ok ? r->draft[i].ms : r->draft[0].ok ? r->draft[0].ms : 0;
}

/* One speculative step: draft, verify (16 tokens, or the blocks of verify), roll back, plus
 * the split cost (us); draft_ms < 0 takes the measured draft step of a whole block. 0 when a
 * part is missing. */
static double bench_step_with(const bench_report *r, const bsplit_result *sp, double draft_ms,
                              const bench_time *verify)
{
    if (draft_ms < 0)
        draft_ms = bench_draft_ms(r, 0);
    if (draft_ms <= 0 || !verify->ok || !r->tgt.rollback.ok || !sp->measured)
        return 0;
    return draft_ms + verify->ms + r->tgt.rollback.ms + sp->cost_us * 1e-3;
}

static double bench_step_ms(const bench_report *r, const bsplit_result *sp, double draft_ms)
{
    return bench_step_with(r, sp, draft_ms, &r->tgt.verify16);
}

/* The best of plain decoding and blocks of 4, 8 and 16 tokens (what --draft-auto picks
 * between on these costs) where each draft is accepted with the one probability q that gives
 * tau tokens a step with blocks of 16: its tokens/s, *block its size; 0 when a part is
 * missing. */
static double bench_picked(const bench_report *r, const bsplit_result *sp, int tau, int *block)
{
    const bench_time *t = &r->tgt.decode_short;
    if (!t->ok || tau < 1 || tau > 16)
        return 0;
    double lo = 0, hi = 1; /* sum_{k<16} q^k = tau, by bisection */
    for (int it = 0; it < 100; it++) {
        const double q = 0.5 * (lo + hi);
        double sum = 0, run = 1;
        for (int k = 0; k < 16; k++, run *= q)
            sum += run;
        *(sum < tau ? &lo : &hi) = q;
    }
    const double q = 0.5 * (lo + hi);
    const int sizes[4] = {1, 4, 8, 16}, draft[4] = {0, 2, 1, 0}; /* into bench_draft_sizes */
    const bench_time *verify[4] = {NULL, &r->tgt.verify4, &r->tgt.verify8, &r->tgt.verify16};
    double best = 0;
    for (int i = 0; i < 4; i++) {
        const double step = i ? bench_step_with(r, sp, bench_draft_ms(r, draft[i]), verify[i])
                              : t->ms;
        double tokens = 0, run = 1;
        for (int k = 0; k < sizes[i]; k++, run *= q)
            tokens += run;
        if (step > 0 && tokens * 1e3 / step > best) {
            best = tokens * 1e3 / step;
            *block = sizes[i];
        }
    }
    return best;
}

/* The draft step at the bandwidth limit: what it would take on the target's device. Only
 * meaningful when the drafter ran elsewhere (0 otherwise). */
static double bench_draft_limit_ms(const bench_report *r)
{
    return r->draft_elsewhere ? bench_limit_ms(r, r->draft_bytes) : 0;
}

/* The speed targets the benchmark is held to (on an H200, 27B shape): plain decode at >= 85%
 * of the bandwidth limit, verify of 16 tokens <= 1.3x a decode step, draft step <= 0.35x,
 * the process split under MPS <= 1% of a speculative step. value < 0: not measured. */
typedef struct bench_goal {
    const char *key, *what;
    double goal, value;
    bool at_least; /* met when value >= goal (else value <= goal) */
    bool percent;  /* shown as a percentage (else as a ratio, "x") */
} bench_goal;

#define BENCH_GOALS 4

static void bench_goals(const bench_report *r, bench_goal out[BENCH_GOALS])
{
    const bench_target_times *t = &r->tgt;
    const double d1 = t->decode_short.ok ? t->decode_short.ms : 0;
    const double lim = bench_limit_ms(r, r->weight_bytes);
    const double step = bench_step_ms(r, &r->split_mps, -1);
    const bench_goal all[BENCH_GOALS] = {
        {"decode_fraction_of_limit", "decode 1K of the limit", 0.85,
         d1 > 0 && lim > 0 ? lim / d1 : -1, true, true},
        {"verify16_ratio", "verify 16", 1.3, d1 > 0 && t->verify16.ok ? t->verify16.ms / d1 : -1,
         false, false},
        {"draft_ratio", "draft step", 0.35, d1 > 0 && r->draft[0].ok ? r->draft[0].ms / d1 : -1, false,
         false},
        {"split_mps_fraction", "split under MPS", 0.01,
         step > 0 ? r->split_mps.cost_us * 1e-3 / step : -1, false, true},
    };
    memcpy(out, all, sizeof all);
}

static bool bench_goal_met(const bench_goal *g)
{
    return g->value >= 0 && (g->at_least ? g->value >= g->goal : g->value <= g->goal);
}

/* --- table ----------------------------------------------------------------------------- */

static void bench_row_time(const char *what, const bench_time *t, const char *extra)
{
    if (t->ok)
        printf("  %-36s %10.3f ms  %s\n", what, t->ms, extra);
    else
        printf("  %-36s %10s     (%s)\n", what, "n/a", t->why);
}

/* The phases that were profiled, in print order. */
static int bench_profiled(const bench_report *r, const bench_time **t, const char **name)
{
    const bench_time *all[BENCH_PHASES] = {&r->tgt.decode_short,  &r->tgt.decode_long,
                                           &r->tgt.verify4,       &r->tgt.verify8,
                                           &r->tgt.verify16,      &r->tgt.verify32,
                                           &r->tgt.verify16_long, &r->tgt.prefill,
                                           &r->tgt.prefill_chunked, &r->draft[0]};
    static const char *const names[BENCH_PHASES] = {
        "decode, 1K context", "decode, 32K context", "verify 4 tokens (1K context)",
        "verify 8 tokens (1K context)", "verify 16 tokens (1K context)",
        "verify 32 tokens (1K context)", "verify 16 tokens (32K context)",
        "prefill, one forward pass of a 1K prompt",
        "prefill, one forward pass, chunked delta rule", "draft step (16 positions + propose)"};
    int n = 0;
    for (int i = 0; i < BENCH_PHASES; i++) {
        if (!all[i]->ok || all[i]->prof.steps == 0)
            continue;
        t[n] = all[i];
        name[n++] = names[i];
    }
    return n;
}

static void bench_print_profiles(const bench_report *r)
{
    const bench_time *t[BENCH_PHASES];
    const char *name[BENCH_PHASES];
    int n = bench_profiled(r, t, name);
    for (int i = 0; i < n; i++) {
        printf("\nprofile: ");
        fflush(stdout);
        ops_prof_print(stdout, name[i], &t[i]->prof, t[i]->prof_ms);
    }
}

static void bench_print(const bench_report *r)
{
    char x[200];
    printf("tandem bench: %s on %s\n", r->shape ? r->shape : r->model_path, r->device);
    printf("  model   %s (%.3f GB", r->model_path, (double)r->model_bytes / 1e9);
    if (r->shape)
        printf("; synthetic %s, Q4_K_M mix; built %.1f s, written %.1f s", r->shape, r->t_build,
               r->t_save);
    printf("; loaded %.1f s)\n", r->t_load);
    printf("  drafter %s\n\n", r->draft_dir ? r->draft_dir : "none");

    const bench_target_times *t = &r->tgt;
    if (r->copy.ok)
        printf("  %-36s %10.1f GB/s (%.2f GiB copied, read + written)\n", "copy bandwidth",
               r->copy_gbps, (double)r->copy_bytes / (1u << 30));
    else
        printf("  %-36s %10s     (%s)\n", "copy bandwidth", "n/a", r->copy.why);
    double lim = bench_limit_ms(r, r->weight_bytes);
    printf("  %-36s %10.3f GB   limit %.3f ms = %.1f tok/s\n", "weight bytes per decode token",
           (double)r->weight_bytes / 1e9, lim, lim > 0 ? 1e3 / lim : 0.0);
    const bench_time *dec[2] = {&t->decode_short, &t->decode_long};
    const uint64_t st[2] = {r->state_short, r->state_long};
    const char *name[2] = {"decode, 1K context", "decode, 32K context"};
    for (int i = 0; i < 2; i++) {
        double with_state = bench_limit_ms(r, r->weight_bytes + st[i]);
        snprintf(x, sizeof x, "%7.1f tok/s  %5.1f%% of limit (%.1f%% counting %.3f GB KV/state)",
                 dec[i]->ok ? 1e3 / dec[i]->ms : 0, dec[i]->ok ? 100 * lim / dec[i]->ms : 0,
                 dec[i]->ok ? 100 * with_state / dec[i]->ms : 0, (double)st[i] / 1e9);
        bench_row_time(name[i], dec[i], x);
    }
    double d1 = t->decode_short.ok ? t->decode_short.ms : 0;
    snprintf(x, sizeof x, "%.3fx decode", d1 > 0 && t->verify4.ok ? t->verify4.ms / d1 : 0);
    bench_row_time("verify 4 tokens (1K context)", &t->verify4, x);
    snprintf(x, sizeof x, "%.3fx decode", d1 > 0 && t->verify8.ok ? t->verify8.ms / d1 : 0);
    bench_row_time("verify 8 tokens (1K context)", &t->verify8, x);
    snprintf(x, sizeof x, "%.3fx decode", d1 > 0 && t->verify16.ok ? t->verify16.ms / d1 : 0);
    bench_row_time("verify 16 tokens (1K context)", &t->verify16, x);
    snprintf(x, sizeof x, "%.3fx decode", d1 > 0 && t->verify32.ok ? t->verify32.ms / d1 : 0);
    bench_row_time("verify 32 tokens (1K context)", &t->verify32, x);
    const double dl = t->decode_long.ok ? t->decode_long.ms : 0;
    snprintf(x, sizeof x, "%.3fx decode at 32K",
             dl > 0 && t->verify16_long.ok ? t->verify16_long.ms / dl : 0);
    bench_row_time("verify 16 tokens (32K context)", &t->verify16_long, x);
    bench_row_time("rollback (keep 8 of 16)", &t->rollback, "");
    snprintf(x, sizeof x, "%7.1f tok/s  (%lld passes of %lld tokens from position 0)",
             t->prefill.ok ? BENCH_PROMPT * 1e3 / t->prefill.ms : 0,
             (long long)(BENCH_PROMPT / r->prefill.pass), (long long)r->prefill.pass);
    bench_row_time("prefill, 1K-token prompt", &t->prefill, x);
    snprintf(x, sizeof x, "%7.1f tok/s  (the DeltaNet recurrence in chunks of %lld)",
             t->prefill_chunked.ok ? BENCH_PROMPT * 1e3 / t->prefill_chunked.ms : 0,
             (long long)r->prefill.delta_chunk);
    bench_row_time("prefill, chunked delta rule", &t->prefill_chunked, x);
    const bench_time *gd[2] = {&t->graph_direct1, &t->graph_direct16};
    const bench_time *gr[2] = {&t->graph_record1, &t->graph_record16};
    const bench_time *gp[2] = {&t->decode_short, &t->verify16};
    const char *gname[2][2] = {{"decode: first pass, op by op", "decode: second pass, recorded"},
                               {"verify 16: first pass, op by op",
                                "verify 16: second pass, recorded"}};
    for (int i = 0; i < 2; i++) {
        const double rep = gp[i]->ok ? gp[i]->ms : 0;
        snprintf(x, sizeof x, "%.3fx a replay", rep > 0 && gd[i]->ok ? gd[i]->ms / rep : 0);
        bench_row_time(gname[i][0], gd[i], x);
        snprintf(x, sizeof x, "%.3fx a replay (recording + the first replay)",
                 rep > 0 && gr[i]->ok ? gr[i]->ms / rep : 0);
        bench_row_time(gname[i][1], gr[i], x);
    }
    snprintf(x, sizeof x, "%.3fx decode  [%s backend%s%s; queued by the host in %.3f ms]",
             d1 > 0 && r->draft[0].ok ? r->draft[0].ms / d1 : 0, r->draft_backend,
             *r->draft_numerics ? ", " : "", r->draft_numerics, r->draft[0].host_ms);
    bench_row_time("draft step (16 positions + propose)", &r->draft[0], x);
    for (int k = 1; k < BENCH_DRAFT_SIZES; k++) {
        char name[48];
        snprintf(name, sizeof name, "  block of %d (%d positions + %d rows)", bench_draft_sizes[k],
                 bench_draft_sizes[k], bench_draft_sizes[k] - 1);
        snprintf(x, sizeof x, "%.3fx decode",
                 d1 > 0 && r->draft[k].ok ? r->draft[k].ms / d1 : 0);
        bench_row_time(name, &r->draft[k], x);
    }
    double dlim = bench_draft_limit_ms(r);
    if (dlim > 0)
        printf("  %-36s %10.3f ms  %.3fx decode  (%.3f GB: drafter weights + LM head, read once)\n",
               "draft step at the bandwidth limit", dlim, d1 > 0 ? dlim / d1 : 0.0,
               (double)r->draft_bytes / 1e9);
    static const char *const srow[BENCH_SAMPLERS][2] = {
        {"sampling: 15 drafts, temp 0.8", "sampling: accept 16, temp 0.8"},
        {"sampling: 15 drafts, + top_p 0.95", "sampling: accept 16, + top_p 0.95"},
        {"greedy: 15 drafts (argmax)", "greedy: accept 16"}};
    for (int k = 0; k < BENCH_SAMPLERS; k++) {
        bench_row_time(srow[k][0], &r->samp_draw[k], "");
        bench_row_time(srow[k][1], &r->samp_accept[k], "");
    }
    const bsplit_result *sp[2] = {&r->split, &r->split_mps};
    const char *sname[2] = {"process split, no MPS", "process split, MPS"};
    for (int i = 0; i < 2; i++) {
        double step = bench_step_ms(r, sp[i], -1);
        if (sp[i]->measured)
            printf("  %-36s %10.1f us  %s%.2f%% of a step (%s; step %.1f us, same work in one "
                   "process %.1f us)\n", sname[i], sp[i]->cost_us, step > 0 ? "" : "n/a ",
                   step > 0 ? 100 * sp[i]->cost_us * 1e-3 / step : 0.0,
                   sp[i]->gpu ? "GPU kernels" : "CPU only", sp[i]->step_us, sp[i]->local_us);
        else
            printf("  %-36s %10s     (%s)\n", sname[i], "n/a", sp[i]->why);
    }
    for (int k = 0; k < 4; k++) {
        const bsplit_result *s = sp[k % 2];
        double step = bench_step_ms(r, s, k < 2 ? -1 : dlim);
        if (step <= 0)
            continue;
        static const char *const name[4] = {
            "projected speculative, no MPS", "projected speculative, MPS",
            "  same, draft at its limit, no MPS", "  same, draft at its limit, MPS"};
        printf("  %-36s  tau 4: %.1f  tau 6: %.1f  tau 8: %.1f tok/s\n", name[k], 4e3 / step,
               6e3 / step, 8e3 / step);
    }
    const double step8 = bench_step_with(r, &r->split_mps, bench_draft_ms(r, 1), &r->tgt.verify8);
    if (step8 > 0)
        printf("  %-36s  tau 4: %.1f  tau 6: %.1f tok/s\n", "  blocks of 8 (--draft-max 7), MPS",
               4e3 / step8, 6e3 / step8);
    const bool mps = r->split_mps.measured;
    if (bench_step_with(r, mps ? &r->split_mps : &r->split, -1, &r->tgt.verify4) > 0) {
        printf("  %-36s ", mps ? "  picked blocks (--draft-auto), MPS"
                               : "  picked blocks (--draft-auto), no MPS");
        for (int tau = 4; tau <= 8; tau += 2) {
            int block = 0;
            const double v = bench_picked(r, mps ? &r->split_mps : &r->split, tau, &block);
            printf(" tau %d: %.1f tok/s (block %d)", tau, v, block);
        }
        printf("\n");
    }
    printf("  (projection: tau / (draft + verify 16 (or 8, with the draft step of 8) + rollback "
           "+ split), plain decode "
           "%.1f tok/s; picked: the best of plain and blocks of 4, 8, 16, each draft accepted "
           "with the one probability that gives tau with blocks of 16)\n",
           d1 > 0 ? 1e3 / d1 : 0.0);
    bench_goal g[BENCH_GOALS];
    bench_goals(r, g);
    printf("  targets (H200, 27B):");
    for (int i = 0; i < BENCH_GOALS; i++) {
        const double k = g[i].percent ? 100 : 1;
        const char *u = g[i].percent ? "%" : "x";
        printf("%s %s %s %.*f%s: ", i ? ";" : "", g[i].what, g[i].at_least ? ">=" : "<=",
               g[i].percent ? 0 : 2, k * g[i].goal, u);
        if (g[i].value < 0)
            printf("n/a");
        else
            printf("%.*f%s %s", g[i].percent ? 2 : 3, k * g[i].value, u,
                   bench_goal_met(&g[i]) ? "met" : "short");
    }
    printf("\n");
    bench_print_profiles(r);
    if (r->n_notes)
        printf("\nnotes:\n");
    for (int i = 0; i < r->n_notes; i++)
        printf("  - %s\n", r->notes[i]);
}

/* --- JSON ------------------------------------------------------------------------------ */

static json_t *bench_json_time(const bench_time *t, double decode_ms)
{
    json_t *o = json_object();
    json_object_set_new(o, "ms", t->ok ? json_real(t->ms) : json_null());
    if (t->ok && decode_ms > 0)
        json_object_set_new(o, "ratio_to_decode", json_real(t->ms / decode_ms));
    json_object_set_new(o, "iters", json_integer(t->ok ? t->iters : 0));
    if (!t->ok)
        json_object_set_new(o, "why", json_string(t->why));
    return o;
}

/* {"4": tok/s, "6": ..., up to tau_max} of steps of step ms (null where step <= 0). */
static json_t *bench_json_taus(int tau_max, double step)
{
    json_t *p = json_object();
    for (int tau = 4; tau <= tau_max; tau += 2) {
        char k[12];
        snprintf(k, sizeof k, "%d", tau);
        json_object_set_new(p, k, step > 0 ? json_real(tau * 1e3 / step) : json_null());
    }
    return p;
}

static json_t *bench_json_split(const bench_report *r, const bsplit_result *sp)
{
    json_t *o = json_object();
    json_object_set_new(o, "measured", json_boolean(sp->measured));
    if (!sp->measured) {
        json_object_set_new(o, "why", json_string(sp->why));
        return o;
    }
    double step = bench_step_ms(r, sp, -1), step_lim = bench_step_ms(r, sp, bench_draft_limit_ms(r));
    json_object_set_new(o, "gpu", json_boolean(sp->gpu));
    json_object_set_new(o, "cost_us", json_real(sp->cost_us));
    json_object_set_new(o, "step_us", json_real(sp->step_us));
    json_object_set_new(o, "local_us", json_real(sp->local_us));
    json_object_set_new(o, "fraction_of_step",
                        step > 0 ? json_real(sp->cost_us * 1e-3 / step) : json_null());
    json_object_set_new(o, "projected_tok_s", bench_json_taus(8, step));
    if (step_lim > 0)
        json_object_set_new(o, "projected_tok_s_draft_at_limit", bench_json_taus(8, step_lim));
    const double step8 = bench_step_with(r, sp, bench_draft_ms(r, 1), &r->tgt.verify8);
    if (step8 > 0)
        json_object_set_new(o, "projected_tok_s_blocks_of_8", bench_json_taus(6, step8));
    if (step8 > 0 && r->tgt.verify4.ok && r->tgt.verify16.ok) {
        json_t *p = json_object();
        for (int tau = 4; tau <= 8; tau += 2) {
            int block = 0;
            const double v = bench_picked(r, sp, tau, &block);
            char k[12];
            snprintf(k, sizeof k, "%d", tau);
            json_object_set_new(p, k, json_pack("{s:f, s:i}", "tok_s", v, "block", block));
        }
        json_object_set_new(o, "projected_tok_s_picked", p);
    }
    return o;
}

static td_err bench_json_write(const bench_report *r, const char *path)
{
    json_t *j = json_object();
    const bench_target_times *t = &r->tgt;
    double d1 = t->decode_short.ok ? t->decode_short.ms : 0;
    double lim = bench_limit_ms(r, r->weight_bytes);
    json_object_set_new(j, "device", json_string(r->device));
    json_object_set_new(j, "backend", json_string(r->on_gpu ? "cuda" : "cpu"));
    json_object_set_new(j, "model", json_string(r->model_path));
    json_object_set_new(j, "synthetic_shape", r->shape ? json_string(r->shape) : json_null());
    json_object_set_new(j, "model_bytes", json_integer((json_int_t)r->model_bytes));
    json_object_set_new(j, "build_s", json_real(r->t_build));
    json_object_set_new(j, "save_s", json_real(r->t_save));
    json_object_set_new(j, "load_s", json_real(r->t_load));
    json_object_set_new(j, "iters", json_integer(r->iters));
    json_object_set_new(j, "copy_bytes", json_integer((json_int_t)r->copy_bytes));
    json_object_set_new(j, "copy_bandwidth_gbps", r->copy.ok ? json_real(r->copy_gbps) : json_null());
    json_object_set_new(j, "weight_bytes_per_token", json_integer((json_int_t)r->weight_bytes));
    json_object_set_new(j, "bandwidth_limit_ms", lim > 0 ? json_real(lim) : json_null());
    json_t *dec = json_object();
    const bench_time *dt[2] = {&t->decode_short, &t->decode_long};
    const int64_t ctx[2] = {BENCH_CTX_SHORT, BENCH_CTX_LONG};
    const uint64_t st[2] = {r->state_short, r->state_long};
    for (int i = 0; i < 2; i++) {
        json_t *o = bench_json_time(dt[i], 0);
        double ws = bench_limit_ms(r, r->weight_bytes + st[i]);
        json_object_set_new(o, "context", json_integer(ctx[i]));
        json_object_set_new(o, "state_bytes_per_token", json_integer((json_int_t)st[i]));
        json_object_set_new(o, "tok_s", dt[i]->ok ? json_real(1e3 / dt[i]->ms) : json_null());
        json_object_set_new(o, "fraction_of_limit",
                            dt[i]->ok && lim > 0 ? json_real(lim / dt[i]->ms) : json_null());
        json_object_set_new(o, "fraction_of_limit_with_state",
                            dt[i]->ok && ws > 0 ? json_real(ws / dt[i]->ms) : json_null());
        json_object_set_new(dec, i ? "32k" : "1k", o);
    }
    json_object_set_new(j, "decode", dec);
    json_t *ver = json_object();
    json_object_set_new(ver, "4", bench_json_time(&t->verify4, d1));
    json_object_set_new(ver, "8", bench_json_time(&t->verify8, d1));
    json_object_set_new(ver, "16", bench_json_time(&t->verify16, d1));
    json_object_set_new(ver, "32", bench_json_time(&t->verify32, d1));
    /* at 32K, against the decode step at 32K */
    json_object_set_new(ver, "16_32k", bench_json_time(&t->verify16_long,
                                                       t->decode_long.ok ? t->decode_long.ms : 0));
    json_object_set_new(j, "verify", ver);
    json_object_set_new(j, "rollback", bench_json_time(&t->rollback, d1));
    json_t *pf = bench_json_time(&t->prefill, 0);
    json_object_set_new(pf, "tokens", json_integer(BENCH_PROMPT));
    json_object_set_new(pf, "chunk", json_integer(r->prefill.pass));
    json_object_set_new(pf, "tok_s", t->prefill.ok ? json_real(BENCH_PROMPT * 1e3 / t->prefill.ms)
                                                   : json_null());
    json_object_set_new(j, "prefill", pf);
    json_t *pc = bench_json_time(&t->prefill_chunked, 0);
    json_object_set_new(pc, "chunk", json_integer(r->prefill.pass));
    json_object_set_new(pc, "delta_chunk", json_integer(r->prefill.delta_chunk));
    json_object_set_new(pc, "tok_s", t->prefill_chunked.ok
                                         ? json_real(BENCH_PROMPT * 1e3 / t->prefill_chunked.ms)
                                         : json_null());
    json_object_set_new(j, "prefill_chunked", pc);
    json_t *gj = json_object();
    const bench_time *gt[2][3] = {{&t->graph_direct1, &t->graph_record1, &t->decode_short},
                                  {&t->graph_direct16, &t->graph_record16, &t->verify16}};
    for (int i = 0; i < 2; i++) {
        json_t *g = json_object();
        for (int k = 0; k < 2; k++) {
            json_t *o = bench_json_time(gt[i][k], 0);
            if (gt[i][k]->ok && gt[i][2]->ok) /* against a replay of the same pass */
                json_object_set_new(o, "ratio_to_replay", json_real(gt[i][k]->ms / gt[i][2]->ms));
            json_object_set_new(g, k ? "record" : "direct", o);
        }
        json_object_set_new(gj, i ? "verify16" : "decode", g);
    }
    json_object_set_new(j, "graphs", gj);
    json_t *dr = bench_json_time(&r->draft[0], d1);
    json_object_set_new(dr, "backend", json_string(r->draft_backend ? r->draft_backend : "none"));
    json_object_set_new(dr, "numerics", json_string(r->draft_numerics));
    json_object_set_new(dr, "bytes", json_integer((json_int_t)r->draft_bytes));
    json_object_set_new(dr, "host_ms",
                        r->draft[0].ok ? json_real(r->draft[0].host_ms) : json_null());
    for (int k = 1; k < BENCH_DRAFT_SIZES; k++) {
        char key[16];
        snprintf(key, sizeof key, "block%d", bench_draft_sizes[k]);
        json_object_set_new(dr, key, bench_json_time(&r->draft[k], d1));
    }
    json_object_set_new(dr, "limit_ms", bench_draft_limit_ms(r) > 0 ? json_real(bench_draft_limit_ms(r))
                                                                  : json_null());
    json_object_set_new(j, "draft", dr);
    json_t *smp = json_array();
    for (int k = 0; k < BENCH_SAMPLERS; k++) {
        json_t *o = json_object();
        json_object_set_new(o, "sampler", json_string(bench_sampler_names[k]));
        json_object_set_new(o, "draw", bench_json_time(&r->samp_draw[k], d1));
        json_object_set_new(o, "accept", bench_json_time(&r->samp_accept[k], d1));
        json_array_append_new(smp, o);
    }
    json_object_set_new(j, "sampling", smp);
    json_t *sp = json_object();
    json_object_set_new(sp, "no_mps", bench_json_split(r, &r->split));
    json_object_set_new(sp, "mps", bench_json_split(r, &r->split_mps));
    json_object_set_new(j, "split", sp);
    json_object_set_new(j, "projection",
                        json_string("projected_tok_s = tau / (draft + verify 16 + rollback + "
                                    "split cost); _blocks_of_8: with verify 8 and the draft "
                                    "step of 8 (--draft-max 7); _picked: the best of plain "
                                    "decoding and blocks of 4, 8, 16 (each with its own draft "
                                    "step) with each draft accepted with the probability that "
                                    "gives tau with blocks of 16"));
    bench_goal g[BENCH_GOALS];
    bench_goals(r, g);
    json_t *tg = json_object();
    for (int i = 0; i < BENCH_GOALS; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "goal", json_real(g[i].goal));
        json_object_set_new(o, "at_least", json_boolean(g[i].at_least));
        json_object_set_new(o, "value", g[i].value >= 0 ? json_real(g[i].value) : json_null());
        json_object_set_new(o, "met", g[i].value >= 0 ? json_boolean(bench_goal_met(&g[i]))
                                                      : json_null());
        json_object_set_new(tg, g[i].key, o);
    }
    json_object_set_new(j, "targets", tg);
    const bench_time *pt[5];
    const char *pname[5];
    int np = bench_profiled(r, pt, pname);
    if (np) {
        json_t *prof = json_object();
        for (int i = 0; i < np; i++) {
            const ops_prof_table *tb = &pt[i]->prof;
            double per = 1.0 / (double)tb->steps;
            json_t *ph = json_object(), *ops = json_array();
            json_object_set_new(ph, "steps", json_integer((json_int_t)tb->steps));
            json_object_set_new(ph, "wall_ms", json_real(pt[i]->prof_ms));
            json_object_set_new(ph, "device_timed", json_boolean(tb->device_timed));
            for (int k = 0; k < tb->n_rows; k++) {
                const ops_prof_row *row = &tb->rows[k];
                json_t *o = json_object();
                json_object_set_new(o, "op", json_string(row->op));
                json_object_set_new(o, "calls", json_real((double)row->calls * per));
                json_object_set_new(o, "launches", json_real((double)row->launches * per));
                json_object_set_new(o, "device_us", json_real(row->dev_us * per));
                json_object_set_new(o, "host_us", json_real(row->host_us * per));
                json_array_append_new(ops, o);
            }
            json_object_set_new(ph, "per_step", ops);
            json_object_set_new(prof, pname[i], ph);
        }
        json_object_set_new(j, "profile", prof);
    }
    json_t *notes = json_array();
    for (int i = 0; i < r->n_notes; i++)
        json_array_append_new(notes, json_string(r->notes[i]));
    json_object_set_new(j, "notes", notes);
    extern char **environ;
    json_t *env = json_object();
    for (char **e = environ; env && *e; e++) {
        if (!bench_env_setting(*e))
            continue;
        const char *eq = strchr(*e, '=');
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(eq - *e), *e);
        json_object_set_new(env, key, json_string(eq + 1)); /* skipped unless UTF-8 */
    }
    json_object_set_new(j, "environment", env);
    int rc = json_dump_file(j, path, JSON_INDENT(2));
    json_decref(j);
    return rc == 0 ? TD_OK : err_set(TD_EIO, "%s: cannot write", path);
}

/* --- the run ---------------------------------------------------------------------------- */

static int bench_fail(const char *what)
{
    fprintf(stderr, "tandem bench: %s%s%s\n", what, *err_msg() ? ": " : "", err_msg());
    return 1;
}

/* A temporary directory under $TMPDIR (or /tmp). */
static bool bench_tmpdir(char *out, size_t cap)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(out, cap, "%s/tandem-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(out) != NULL;
}

/* Builds the synthetic model and writes it to path. */
static td_err bench_build(const bmodel_shape *s, const char *path, bench_report *r)
{
    double t0 = bench_now();
    gguf_writer *w;
    TD_TRY(bmodel_build(&w, s, BENCH_SEED));
    double t1 = bench_now();
    td_err e = gguf_writer_write(w, path);
    gguf_writer_free(w);
    r->t_build = t1 - t0;
    r->t_save = bench_now() - t1;
    return e;
}

static td_err bench_build_drafter(const bmodel_shape *s, const tgt_hparams *hp, const char *dir)
{
    bmodel_drafter d;
    bmodel_drafter_init(&d, s, hp->n_embd, hp->n_ff, hp->n_vocab, hp->n_layer);
    mkdir(dir, 0755);
    return bmodel_drafter_write(dir, &d, BENCH_SEED + 1);
}

static void bench_device_name(bench_report *r, const ops_backend *be)
{
    if (be->kind != OPS_BACKEND_CUDA) {
        snprintf(r->device, sizeof r->device, "cpu");
        return;
    }
    cudrv_device d;
    char where[64];
    ops_backend_describe(be, where, sizeof where); /* "cuda:N (sm_XX code)" */
    const char *code = strchr(where, ' ');
    int n = code ? (int)(code - where) : (int)strlen(where);
    if (cudrv_device_open_ordinal(&d, be->device) == TD_OK)
        snprintf(r->device, sizeof r->device, "%.*s %s%s", n, where, d.name, code ? code : "");
    else
        snprintf(r->device, sizeof r->device, "%s", where);
    cudrv_device_close(&d);
}

/* The drafter's tap layers from its config (what verify copies out for it). */
static int64_t bench_taps(const char *dir, const tgt_model *m, int32_t *taps)
{
    char path[4200];
    dflash_config cfg;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (dflash_config_load(&cfg, path) != TD_OK ||
        dflash_config_resolve(&cfg, (uint32_t)m->hp.n_layer) != TD_OK)
        return 0;
    for (uint32_t i = 0; i < cfg.n_taps; i++)
        taps[i] = (int32_t)cfg.target_layer_ids[i];
    return cfg.n_taps;
}

static int bench_main(const bmodel_shape *shape, const char *model, const char *draft,
                      const char *save, const char *save_draft, int device, int iters,
                      const char *json_path, bool profile, const char *skip_ops,
                      const bench_prefill_cfg *pf, unsigned parts)
{
    bench_report r = {.iters = iters, .shape = model ? NULL : shape->name, .prefill = *pf};
    double t_start = bench_now();

    /* The two-process pair first: under MPS both ends must be the MPS server's clients, which
     * works best before this process holds a CUDA context of its own. */
    if (parts & BENCH_PART_SPLIT) {
        bsplit_measure(device, BENCH_SPLIT_CALLS, (int)shape->d_block, &r.split, &r.split_mps);
    } else {
        snprintf(r.split.why, sizeof r.split.why, "%s", BENCH_SKIPPED);
        snprintf(r.split_mps.why, sizeof r.split_mps.why, "%s", r.split.why);
    }
    if (parts != BENCH_PART_ALL)
        bench_note(&r, "--only: the parts left out were not measured");

    ops_backend *cuda = NULL;
    const ops_backend *be;
    if (ops_backend_cuda_init(&cuda, device) == TD_OK) {
        be = cuda;
        r.on_gpu = true;
    } else {
        bench_note(&r, "the CUDA backend is unavailable (%s): everything ran on the CPU backend; these "
                   "are not GPU numbers", err_msg());
        cuda = NULL;
        be = ops_backend_cpu();
    }
    bench_device_name(&r, be);
    /* Profiling: only the profiled runs of each phase are timed op by op. */
    ops_backend *prof = NULL;
    if ((profile || skip_ops || ops_prof_wanted()) && !ops_prof_active(be)) {
        if (ops_prof_wrap(&prof, be) == TD_OK)
            be = prof;
        else
            bench_note(&r, "no profile: %s", err_msg());
    }
    if (skip_ops) {
        if (!ops_prof_active(be) || ops_prof_skip(be, skip_ops) != TD_OK) {
            int rc = bench_fail("--skip-ops");
            ops_prof_free(prof);
            if (cuda)
                ops_backend_cuda_free(cuda);
            return rc;
        }
        bench_note(&r, "--skip-ops %s: those ops did not run, so the results are wrong and the "
                   "times are what the rest of each step costs", skip_ops);
    }
    ops_prof_enable(be, false);
    if (ops_prof_active(be) && !skip_ops)
        bench_note(&r, "profiled: %d more runs per phase after the timed ones, each op bracketed "
                   "by CUDA events (the profile tables' wall times include that cost)",
                   BENCH_PROF_ITERS);

    /* Bandwidth before the model takes its memory. */
    r.copy_bytes = r.on_gpu ? (size_t)4 << 30 : (size_t)256 << 20;
    bench_copy_bw(be, r.copy_bytes, iters, &r.copy, &r.copy_gbps);
    if (!r.on_gpu)
        bench_note(&r, "CPU copy bandwidth is one thread's memcpy of 256 MiB");

    char tmp[4096] = "", path[4096], ddir[4096];
    int rc = 0;
    tgt_model *m = NULL;
    if (!bench_tmpdir(tmp, sizeof tmp)) {
        err_set(TD_EIO, "mkdtemp: %s", strerror(errno));
        rc = bench_fail("a temporary directory");
        goto out;
    }
    if (model) {
        snprintf(path, sizeof path, "%s", model);
    } else {
        if (snprintf(path, sizeof path, "%s/model.gguf", tmp) >= (int)sizeof path) {
            err_set(TD_ERANGE, "temporary directory path too long: %s", tmp);
            rc = bench_fail("a temporary directory");
            goto out;
        }
        if (save)
            snprintf(path, sizeof path, "%s", save);
        if (bench_build(shape, path, &r) != TD_OK) {
            rc = bench_fail("building the synthetic model");
            goto out;
        }
    }
    r.model_path = path;
    double t0 = bench_now();
    if (tgt_load_on(&m, path, be) != TD_OK) {
        rc = bench_fail("loading the model");
        goto out;
    }
    r.t_load = bench_now() - t0;
    r.model_bytes = m->file->size;
    if (!model && !save) {
        unlink(path); /* the mapping keeps it readable; nothing is left behind */
        r.model_path = "a temporary file (removed)";
    }
    if (m->hp.arch != TGT_ARCH_QWEN35)
        bench_note(&r, "not a qwen35 model: the numbers are for its own architecture");

    if (draft) {
        snprintf(ddir, sizeof ddir, "%s", draft);
    } else {
        snprintf(ddir, sizeof ddir, "%s", save_draft ? save_draft : tmp);
        if (bench_build_drafter(shape, &m->hp, ddir) != TD_OK)
            bench_note(&r, "building the synthetic drafter failed: %s", err_msg());
    }
    r.draft_dir = ddir;
    int32_t taps[DFLASH_MAX_TAPS];
    int64_t n_taps = bench_taps(ddir, m, taps);

    r.weight_bytes = bench_weight_bytes(m);
    r.state_short = bench_state_bytes(m, BENCH_CTX_SHORT);
    r.state_long = bench_state_bytes(m, BENCH_CTX_LONG);
    bench_target(m, taps, n_taps, iters, &r.prefill, parts, &r.tgt);
    tgt_graph_counts gc;
    tgt_graph_stats(m, &gc);
    if (gc.replayed)
        bench_note(&r, "target steps ran as CUDA graphs (%llu recordings, %llu replays, %llu "
                   "passes op by op before a recording; TANDEM_GRAPHS=0 runs them all op by op)",
                   (unsigned long long)gc.recorded, (unsigned long long)gc.replayed,
                   (unsigned long long)gc.direct);
    else if (r.on_gpu)
        bench_note(&r, "target steps ran op by op (no CUDA graphs)");
    if (parts & BENCH_PART_DECODE32K)
        bench_note(&r, "32K context: the KV cache and recurrent state hold random finite values "
                   "and n_past is set; no 32K-token prefill ran");

    /* The drafter runs on the target's backend; a few runs where that is the CPU. */
    int draft_iters = r.on_gpu ? iters : (iters > 3 ? 3 : iters);
    if (parts & BENCH_PART_DRAFT) {
        bench_draft(m, ddir, draft_iters, r.draft, &r.draft_backend, &r.draft_numerics);
    } else {
        for (int k = 0; k < BENCH_DRAFT_SIZES; k++)
            bench_skip(&r.draft[k]);
        r.draft_backend = be->name;
        r.draft_numerics = "";
    }
    r.draft_elsewhere = strcmp(r.draft_backend, be->name) != 0;
    r.draft_bytes = bench_draft_bytes(m, ddir);
    if (r.draft_elsewhere)
        bench_note(&r, "the drafter ran on the %s backend (%d runs): its step is not a %s time",
                   r.draft_backend, draft_iters, be->name);
    if (!draft && !save_draft)
        r.draft_dir = "synthetic, in a temporary folder (removed)";
    /* what sampling adds to a step: the drafts of a block and the acceptance of 16 tokens */
    if (parts & BENCH_PART_SAMPLING) {
        bench_sampling(be, m->hp.n_vocab, 16, draft_iters, r.samp_draw, r.samp_accept);
    } else {
        for (int k = 0; k < BENCH_SAMPLERS; k++) {
            bench_skip(&r.samp_draw[k]);
            bench_skip(&r.samp_accept[k]);
        }
    }
    bench_note_env(&r);
    bench_note(&r, "total %.1f s", bench_now() - t_start);
    bench_print(&r);
    if (json_path && bench_json_write(&r, json_path) != TD_OK)
        rc = bench_fail("writing the JSON report");
out:
    tgt_free(m);
    if (*tmp) {
        /* What was made in the temporary folder (the files may not exist). */
        static const char *const made[] = {"model.gguf", "config.json", "model.safetensors"};
        for (size_t i = 0; i < sizeof made / sizeof made[0]; i++) {
            char p[4200];
            snprintf(p, sizeof p, "%s/%s", tmp, made[i]);
            unlink(p);
        }
        rmdir(tmp);
    }
    ops_prof_free(prof);
    if (cuda)
        ops_backend_cuda_free(cuda);
    return rc;
}

/* --build-only: the synthetic files and nothing else (for other engines and tests). */
static int bench_build_only(const bmodel_shape *shape, const char *save, const char *save_draft)
{
    bench_report r = {0};
    if (bench_build(shape, save, &r) != TD_OK)
        return bench_fail("building the synthetic model");
    printf("wrote %s (built %.1f s, written %.1f s)\n", save, r.t_build, r.t_save);
    if (!save_draft)
        return 0;
    tgt_hparams hp = {.n_embd = shape->n_embd, .n_ff = shape->n_ff, .n_vocab = shape->n_vocab,
                      .n_layer = shape->n_layer};
    if (bench_build_drafter(shape, &hp, save_draft) != TD_OK)
        return bench_fail("writing the synthetic drafter");
    printf("wrote %s/config.json and %s/model.safetensors\n", save_draft, save_draft);
    return 0;
}

int cmd_bench(int argc, char **argv)
{
    const char *model = NULL, *draft = NULL, *save = NULL, *save_draft = NULL, *json = NULL;
    const char *shape_name = "27b", *split_serve = NULL, *split_client = NULL, *skip_ops = NULL;
    const char *only = NULL;
    int64_t device = 0, iters = 10, split_block = 16, delta_chunk = OPS_DELTA_CHUNK_MAX;
    int64_t pass = BENCH_PREFILL_CHUNK;
    bool help = false, build_only = false, profile = false;
    char shape_help[96];
    snprintf(shape_help, sizeof shape_help, "synthetic model shape (%s)", bmodel_shape_names());
    char only_help[256];
    snprintf(only_help, sizeof only_help,
             "measure only these parts (comma-separated: %s); the others are reported as not "
             "measured", bench_part_names());
    const args_opt opts[] = {
        {"model", ARGS_STRING, &model, NULL, "time this qwen35 GGUF instead of a synthetic one", 0, 0, 'm'},
        {"draft", ARGS_STRING, &draft, NULL, "DFlash drafter folder (default: a synthetic one)", 0, 0, 0},
        {"save", ARGS_STRING, &save, NULL, "write the synthetic GGUF to this file (and keep it)", 0, 0, 0},
        {"save-draft", ARGS_STRING, &save_draft, NULL, "write the synthetic drafter into this folder", 0, 0, 0},
        {"build-only", ARGS_FLAG, &build_only, NULL, "only write --save (and --save-draft), time nothing", 0, 0, 0},
        {"device", ARGS_INT, &device, "TANDEM_DEVICE", "CUDA device ordinal", 0, 1023, 0},
        {"shape", ARGS_STRING, &shape_name, NULL, shape_help, 0, 0, 0},
        {"json", ARGS_STRING, &json, NULL, "also write the results as JSON to this file", 0, 0, 0},
        {"iters", ARGS_INT, &iters, NULL, "timed runs per measurement (the median is reported)", 1, 100000, 'n'},
        {"profile", ARGS_FLAG, &profile, NULL, "also time every backend op of each phase (as TANDEM_PROFILE=1)", 0, 0, 0},
        {"delta-chunk", ARGS_INT, &delta_chunk, NULL, "positions per chunk of the chunked-recurrence prefill row", 1, OPS_DELTA_CHUNK_MAX, 0},
        {"prefill-chunk", ARGS_INT, &pass, NULL, "tokens per prefill forward pass of the 1K prompt (a power of two)", 1, BENCH_PREFILL_MAX, 0},
        {"skip-ops", ARGS_STRING, &skip_ops, NULL, "ops (the profile's names, comma-separated) that do not run: times what the rest costs, results wrong; no profile", 0, 0, 0},
        {"only", ARGS_STRING, &only, NULL, only_help, 0, 0, 0},
        /* the two ends of the process-split measurement (the benchmark starts them itself) */
        {"split-serve", ARGS_STRING, &split_serve, NULL, "(internal) draftd end at this URL", 0, 0, 0},
        {"split-client", ARGS_STRING, &split_client, NULL, "(internal) verifyd end at this URL", 0, 0, 0},
        {"split-block", ARGS_INT, &split_block, NULL, "(internal) block size of the proposals", 2, 64, 0},
        ARGS_END,
    };
    const char *usage = "tandem bench [--model FILE] [--draft DIR] [--save FILE] [--device N] "
                        "[--shape 27b|tiny] [--json FILE] [--iters N] [--profile] [--skip-ops LIST] "
                        "[--only PARTS] [--delta-chunk N] [--prefill-chunk N]";
    if (args_parse(argc, argv, 1, opts, NULL, 0, NULL, &help) != TD_OK) {
        fprintf(stderr, "tandem bench: %s\n", err_msg());
        args_usage(usage, opts);
        return 2;
    }
    if (help) {
        args_usage(usage, opts);
        return 0;
    }
    if (split_serve)
        return bsplit_serve(split_serve, (int)device);
    if (split_client)
        return bsplit_client(split_client, (int)device, (int)iters, (int)split_block);
    if (BENCH_PROMPT % pass) {
        fprintf(stderr, "tandem bench: --prefill-chunk %lld does not divide the %d-token prompt\n",
                (long long)pass, BENCH_PROMPT);
        return 2;
    }
    unsigned parts = BENCH_PART_ALL;
    if (only && bench_parts_parse(only, &parts) != TD_OK) {
        fprintf(stderr, "tandem bench: --only: %s\n", err_msg());
        return 2;
    }
    const bench_prefill_cfg pf = {.pass = pass, .delta_chunk = delta_chunk};
    const bmodel_shape *shape = bmodel_shape_find(shape_name);
    if (!shape) {
        fprintf(stderr, "tandem bench: unknown --shape '%s' (%s)\n", shape_name,
                bmodel_shape_names());
        return 2;
    }
    if (build_only) {
        if (!save) {
            fprintf(stderr, "tandem bench: --build-only needs --save FILE\n");
            return 2;
        }
        return bench_build_only(shape, save, save_draft);
    }
    if (model && save) {
        fprintf(stderr, "tandem bench: --save writes the synthetic model; with --model there is none\n");
        return 2;
    }
    /* Before minutes of measuring: the files given must be there. */
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", draft ? draft : "");
    if ((model && access(model, R_OK) != 0) || (draft && access(cfg, R_OK) != 0)) {
        fprintf(stderr, "tandem bench: %s: %s\n", model && access(model, R_OK) != 0 ? model : cfg,
                strerror(errno));
        return 1;
    }
    return bench_main(shape, model, draft, save, save_draft, (int)device, (int)iters, json,
                      profile, skip_ops, &pf, parts);
}
