/* The timed parts of `tandem bench` (cli/bench_run.c): device copy bandwidth, target decode
 * and verify steps, rollback, and the drafter's step. Every time is the median of iters runs
 * after a warm-up, measured on the host around a stream sync, so it is what a caller of the
 * step waits. A part that cannot run (no memory for a 32K context, a drafter that fails to
 * load) says why and the others still run. */
#ifndef TANDEM_CLI_BENCH_RUN_H
#define TANDEM_CLI_BENCH_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/backend_prof.h"
#include "verifyd/target.h"

#define BENCH_CTX_SHORT 1024  /* positions before the decoded token: "1K context" */
#define BENCH_CTX_LONG 32768  /* "32K context" */
#define BENCH_KEEP 8          /* tokens kept of a 16-token verify when timing the rollback */
#define BENCH_PROF_ITERS 5    /* profiled runs per measurement (after the timed ones) */
#define BENCH_PROMPT 1024     /* tokens of the timed prompt */
#define BENCH_PREFILL_CHUNK 64 /* tokens per prefill forward pass, as verifyd runs them */
#define BENCH_PREFILL_MAX 512  /* the most tokens per prefill forward pass --prefill-chunk takes */

typedef struct bench_time {
    bool ok;            /* measured */
    double ms;          /* median milliseconds */
    int iters;          /* runs the median is over */
    char why[256];      /* when not measured */
    /* With a profiling backend: separate runs after the timed ones (the events cost time,
     * so the median above stays unprofiled) */
    ops_prof_table prof; /* per-op counts of the profiled runs (prof.steps of them) */
    double prof_ms;     /* mean milliseconds of a profiled run */
    double host_ms;     /* median milliseconds the host took to queue a run (0: not taken) */
} bench_time;

#define BENCH_PHASES 10 /* phases that may be profiled: the target's nine and the draft step */

typedef struct bench_target_times {
    bench_time decode_short;  /* one token at BENCH_CTX_SHORT */
    bench_time decode_long;   /* one token at BENCH_CTX_LONG */
    bench_time verify16;      /* 16 tokens recorded for rollback, every position's logits */
    bench_time verify32;      /* the same with 32 tokens */
    bench_time verify4;       /* the same with 4 tokens: a block cut short */
    bench_time verify8;       /* the same with 8 tokens */
    bench_time verify16_long; /* 16 tokens at BENCH_CTX_LONG (long-context speculation) */
    bench_time rollback;      /* tgt_state_keep of BENCH_KEEP after a 16-token verify */
    bench_time prefill;       /* a BENCH_PROMPT-token prompt from position 0 (profile: per
                               * chunk), the DeltaNet recurrence token by token */
    bench_time prefill_chunked; /* the same with the chunked recurrence */
    /* A pass's first two runs where passes become CUDA graphs (verifyd/graph_pick.h): op by
     * op, then recorded and replayed; one token and 16 (recorded for rollback), 1K context */
    bench_time graph_direct1, graph_record1;
    bench_time graph_direct16, graph_record16;
} bench_target_times;

/* The parts `tandem bench --only` picks from (all by default); the copy bandwidth and the
 * model's load always run. */
enum {
    BENCH_PART_DECODE = 1u << 0,          /* decode_short */
    BENCH_PART_DECODE32K = 1u << 1,       /* decode_long */
    BENCH_PART_VERIFY16 = 1u << 2,        /* verify16 and the rollback after it */
    BENCH_PART_VERIFY32 = 1u << 3,        /* verify32 */
    BENCH_PART_PREFILL = 1u << 4,         /* prefill */
    BENCH_PART_PREFILL_CHUNKED = 1u << 5, /* prefill_chunked */
    BENCH_PART_DRAFT = 1u << 6,           /* the draft step */
    BENCH_PART_SAMPLING = 1u << 7,        /* bench_sampling */
    BENCH_PART_SPLIT = 1u << 8,           /* the process split, without and with MPS */
    BENCH_PART_VERIFY16_32K = 1u << 9,    /* verify16_long */
    BENCH_PART_VERIFY_SHORT = 1u << 10,   /* verify4 and verify8 */
    BENCH_PART_GRAPHS = 1u << 11,         /* graph_direct*, graph_record* */
    BENCH_PART_ALL = (1u << 12) - 1,
};

/* *parts from a comma-separated list of part names (bench_part_names()); TD_EINVAL naming
 * the first unknown or empty one, or for a list naming none. */
td_err bench_parts_parse(const char *list, unsigned *parts);

/* The part names, comma-separated, in the order of the BENCH_PART_* bits. */
const char *bench_part_names(void);

/* Marks t as not measured because --only left its part out (why: BENCH_SKIPPED). */
#define BENCH_SKIPPED "not measured: --only left it out"
void bench_skip(bench_time *t);

/* How the prompt is prefilled. */
typedef struct bench_prefill_cfg {
    int64_t pass;        /* tokens per forward pass (1 .. BENCH_PREFILL_MAX, dividing
                          * BENCH_PROMPT) */
    int64_t delta_chunk; /* positions per chunk of prefill_chunked's recurrence */
} bench_prefill_cfg;

/* Device-to-device copy of bytes, timed iters times: bandwidth counts bytes read + written. */
void bench_copy_bw(const ops_backend *be, size_t bytes, int iters, bench_time *t, double *gbps);

/* The target's steps at BENCH_CTX_SHORT and BENCH_CTX_LONG (those of parts; the others
 * bench_skip) (profiled too when m's backend is
 * a profiler, ops_prof_active), the prompt both ways (m->delta_chunk 0, then pf->delta_chunk;
 * m's own value restored after). The state's KV cache and
 * recurrent state are filled with random finite values and n_past is set, instead of
 * prefilling 32K tokens. taps: the drafter's tap layers (copied out by verify, as the
 * speculative loop does). */
void bench_target(tgt_model *m, const int32_t *taps, int64_t n_taps, int iters,
                  const bench_prefill_cfg *pf, unsigned parts, bench_target_times *out);

/* The draft step's block sizes timed: the drafter's whole block (16), and 8 and 4 tokens
 * (verifyd --draft-max 7, 3; what --draft-auto may pick), capped at the drafter's block. */
#define BENCH_DRAFT_SIZES 3
extern const int bench_draft_sizes[BENCH_DRAFT_SIZES];

/* The drafter's step for blocks of b tokens: its context takes b newly committed positions,
 * then it proposes one block with b - 1 rows of logits (after a context of BENCH_CTX_SHORT
 * positions); t[i] for bench_draft_sizes[i] (skipped where that is more than the drafter's
 * block). backend names where it ran: the model's backend (the drafter borrows the placed
 * target's embedding and head, so it runs on the GPU when the model is there); numerics its
 * context K/V and its products' inputs, e.g. "f16 context, bf16 inputs" (TANDEM_DRAFT_KV,
 * TANDEM_DRAFT_ACT), "" when it did not load. */
void bench_draft(const tgt_model *m, const char *dir, int iters,
                 bench_time t[BENCH_DRAFT_SIZES], const char **backend, const char **numerics);

#define BENCH_SAMPLERS 3 /* sampler settings bench_sampling times */
extern const char *const bench_sampler_names[BENCH_SAMPLERS];

/* What choosing tokens adds to a speculative step on be, for n_vocab tokens and blocks of
 * block tokens, under each of BENCH_SAMPLERS settings (temperature 0.8; with top_p 0.95;
 * greedy): draw[k] the drafts of one block from block - 1 rows of logits (sample_rows, or
 * argmax when greedy), accept[k] the acceptance of a verified block of block rows
 * (accept_sampled, or accept_greedy), on random logits in [-8, 8), each call timed up to a
 * sync. */
void bench_sampling(const ops_backend *be, int64_t n_vocab, int64_t block, int iters,
                    bench_time *draw, bench_time *accept);

/* Bytes of weights one decode token reads: every tensor of the layers run, the head, one
 * row of token_embd (all of it when it is also the head). */
uint64_t bench_weight_bytes(const tgt_model *m);

/* Bytes one draft step reads at least: the drafter's weights (dir/model.safetensors) and the
 * target's LM head; 0 when the file cannot be read. */
uint64_t bench_draft_bytes(const tgt_model *m, const char *dir);

/* Bytes of sequence state one decode token at context ctx reads and writes: the attention
 * KV cache of ctx positions (read) and the DeltaNet recurrent and conv state (read + write). */
uint64_t bench_state_bytes(const tgt_model *m, int64_t ctx);

double bench_now(void); /* seconds, monotonic */

#endif
