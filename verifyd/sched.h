/* verifyd's scheduler: one thread owns the target and runs every active sequence, one unit
 * of work per sequence per round in arrival order (a prefill chunk of at most 64 tokens, or
 * one speculative step), pushing each sequence's events as soon as its unit is done.
 *
 * Requests arrive on bus worker threads (sched_handle: gen_start, gen_cancel, status_get,
 * hello, ping) and wait in a bounded queue until kvd hands them a slot. Each sequence's
 * target state lives in its kvd slot (tgt_state_bind), with the feature ring draftd reads;
 * the pools are memory of the target's backend (cuda-kind pools for a GPU target), so the
 * state never leaves the device. Sampled proposals' distributions arrive in kvd's proposal
 * pool.
 * Blocks come from draftd over the draft link; without it (absent, slow, erroring) a step is
 * a plain one and the output is unchanged. Where the output follows the request's prediction
 * (OpenAI's predicted outputs), the prediction's next tokens are the block's drafts instead,
 * verified the same way (deterministic proposals: q is one-hot). */
#ifndef TANDEM_VERIFYD_SCHED_H
#define TANDEM_VERIFYD_SCHED_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/bus.h"
#include "common/kvclient.h"
#include "common/msg.h"
#include "verifyd/blockpick.h"
#include "verifyd/dlink.h"
#include "verifyd/events.h"
#include "verifyd/spec.h"
#include "verifyd/target.h"

typedef struct sched_cfg {
    const tgt_model *tm;
    char model_name[MSG_MODEL_NAME_MAX + 1]; /* the target's general.name */
    int64_t n_ctx;              /* positions per sequence: prompt + generated */
    int64_t ring;               /* feature ring rows (0 without taps) */
    int64_t block;              /* tokens per verify block: the drafter's, or 1 */
    int64_t draft_max;          /* drafts (or predicted tokens) a step verifies at most, the
                                 * rest of a proposal left unchecked (0: block - 1) */
    bool draft_auto;            /* each drafted step's block chosen by measured cost and
                                 * acceptance (blockpick.h), at most sched_verify_block */
    int32_t taps[MSG_TAPS_MAX]; /* [n_taps] target layers whose features draftd reads */
    int64_t n_taps;
    /* the drafter as its folder gives it (all 0 without one), for sizing kvd's pools on a
     * GPU: its context's shape and the bytes of its weights */
    uint32_t d_layers, d_kv, d_head_dim;
    uint64_t d_weight_bytes;
    const uint8_t *eog;         /* [n_vocab] 1 for the model's end-of-generation ids, or NULL */
    const cst_vocab *vocab;     /* the vocabulary for response formats, or NULL (no tokenizer:
                                 * formats are refused) */
    uint32_t max_queue;         /* requests waiting for a slot at most */
    int draft_timeout_ms;       /* a proposal may take at least this long (ms) */
    const char *kvd_url;        /* kvd's bus endpoint */
    const char *kvd_fd_path;    /* kvd's fd socket */
    const char *draftd_url;     /* draftd's bus endpoint, or NULL: plain decoding only */
    const char *events_url;     /* the gateway's event endpoint */
    /* GPU (tm->be is CUDA): kvd's pools must be of the cuda kind on this GPU, and the heads
     * go to kvd with every attach, for draftd */
    uint8_t dev_uuid[CUDRV_UUID_BYTES];     /* the GPU the target runs on */
    const shbuf *heads[MSG_HEADS_MAX];      /* [n_heads] token embedding, LM head (untied) */
    uint32_t n_heads;
} sched_cfg;

/* draftd's CUDA context and working memory beside its weights, which kvd leaves free when it
 * sizes its pools to a GPU before draftd is up (measured: ~660 MiB for the 27B drafter on an
 * H100). */
#define SCHED_DRAFTD_WORK ((uint64_t)768 << 20)

/* Tokens a step verifies at most: the block, or 1 + draft_max when that is fewer. */
static inline int64_t sched_verify_block(const sched_cfg *c)
{
    return spec_block_most(c->block, c->draft_max);
}

/* A generation, from gen_start to its last event. */
typedef struct sched_req {
    msg_gen_start gs;        /* the request (owns prompt and stop) */
    cst_compiled format;     /* its response format's schema or tool spec, compiled once at
                              * gen_start; outlives the sequence's spec */
    uint64_t request_id;     /* of the gen_start, so a retried one is answered the same */
    bool cancel;             /* gen_cancel arrived (guarded by the scheduler's lock) */
    struct sched_req *next;  /* waiting queue */
} sched_req;

/* A running sequence (the scheduler thread's alone). */
typedef struct sched_seq {
    sched_req *req;
    spec_seq spec;
    bool spec_ok;            /* spec is initialised */
    uint32_t slot;           /* kvd slot */
    uint64_t slot_gen;       /* kvd generation of its contents */
    int32_t *prompt;         /* [n_prompt] the prompt as int32 ids */
    int32_t *hist;           /* [n_ctx + 1] prompt, committed tokens, then the pending one */
    int64_t n_hist;          /* == spec.ts.n_past + 1 once the prompt has run */
    uint32_t n_cached;       /* prompt tokens the slot already held */
    int64_t pred_at;         /* the prediction's token the output is expected to go on with,
                              * or -1 while the output does not follow it */
    uint32_t predicted;      /* drafts taken from the prediction and accepted */
    uint32_t completion;     /* tokens emitted */
    blockpick bp;            /* with cfg.draft_auto: the block of its drafting steps, from its
                              * own acceptance (texts differ) and the scheduler's picker's
                              * state when it started */
    bool prefilling;
    bool done;               /* finished: to be removed after this round */
} sched_seq;

typedef struct sched_stats {
    uint64_t requests, prompt_tokens, cached_tokens, completion_tokens;
    uint64_t steps, drafted, accepted;          /* verify passes, draft tokens */
    uint64_t prefill_us, draft_us, verify_us;   /* microseconds */
    uint64_t accept_hist[MSG_ACCEPT_HIST_MAX];  /* steps by tokens committed */
    tgt_graph_counts graphs;                    /* the target's forward passes, after the
                                                 * last round */
} sched_stats;

typedef struct sched {
    sched_cfg cfg;
    pthread_mutex_t lock;     /* guards waiting, n_waiting, running ids, ready, stats, cancel */
    pthread_cond_t wake;      /* new work or stop */
    sched_req *waiting;       /* FIFO of requests without a slot */
    uint32_t n_waiting;
    sched_req *running_req[KVL_SLOTS_MAX]; /* [n_running] requests of running sequences */
    uint32_t n_running;
    bool ready;               /* kvd attached: generations are accepted */
    bool stop;
    sched_stats stats;
    /* the scheduler thread's */
    pthread_t thread;
    bool started;
    kvc kv;                   /* kvd pools */
    bus_client *kvd;          /* kvd.ipc */
    dlink *draft;             /* NULL without draftd */
    events *ev;
    sched_seq *running[KVL_SLOTS_MAX]; /* [n_running], in arrival order */
    uint32_t slots;           /* from kvd's layout */
    uint64_t kv_request_id;
    double verify_ema;        /* seconds per verify pass (proposal deadline) */
    blockpick bp;             /* with cfg.draft_auto: every sequence's steps, the start of each
                               * new sequence's own */
    long long next_attach_ms; /* when to try kvd again */
    bool attached_once;       /* kvd attached at least once since the start */
    char not_ready[MSG_ERROR_MAX + 1]; /* why not ready: the last failed attach (status) */
} sched;

td_err sched_start(sched **out, const sched_cfg *cfg);
/* Stops the thread; running sequences end with an error event. */
void sched_stop(sched *s);

/* The verifyd.ipc handler (a bus_handler; user is the sched). */
td_err sched_handle(void *user, const uint8_t *req, size_t len, msg_buf *reply);

/* --- sched_seq.c: the units of work of one sequence (scheduler thread only) --------------- */

/* Runs one unit of seq (prefill chunk or step) and sends its events; on the last one sets
 * seq->done and closes the slot. */
void sched_seq_unit(sched *s, sched_seq *seq);

/* Ends seq with a DONE (finish CANCEL) or ERROR event (code, with err_msg() as text) and
 * returns its slot to kvd (kept for the prefix cache unless its state may be broken). */
void sched_seq_finish(sched *s, sched_seq *seq, msg_finish finish, td_err code);

#endif
