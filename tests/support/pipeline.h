/* Tests with the real daemons (kvd, verifyd, draftd): a private runtime directory, each daemon
 * started from $TANDEM_BUILD_DIR with fork + exec (its log in <dir>/<name>.log), the
 * gateway's side played by the test: a PULL socket on gateway-events.ipc collecting token
 * events, and a bus client of verifyd.ipc sending gen_start / gen_cancel / status_get. */
#ifndef TANDEM_TESTS_SUPPORT_PIPELINE_H
#define TANDEM_TESTS_SUPPORT_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/bus.h"
#include "common/msg.h"
#include "tests/support/model_fixture.h"

enum { PL_KVD, PL_VERIFYD, PL_DRAFTD, PL_SVC_N };

#define PL_SEQ_MAX 4096   /* generations one pipeline follows */
#define PL_TOKENS_MAX 4096 /* tokens kept per generation */

/* Everything the events of one generation said. */
typedef struct pl_result {
    uint64_t seq_id;
    int32_t tokens[PL_TOKENS_MAX]; /* [n_tokens] in order */
    uint32_t n_tokens;
    msg_logprob *logprobs;         /* [n_tokens] when logprobs were asked (malloc'd) */
    uint32_t n_logprobs;
    int32_t prompt[PL_TOKENS_MAX]; /* [n_prompt] the tokens of PROMPT events, in order */
    uint32_t n_prompt;
    msg_logprob *prompt_lp;        /* [n_prompt] theirs (malloc'd) */
    bool prompt_late;              /* a PROMPT event came after a TOKEN event */
    uint32_t n_events;
    bool done;                     /* a DONE or ERROR event arrived */
    msg_event_kind last_kind;      /* DONE or ERROR */
    msg_finish finish;
    td_err code;                   /* ERROR: the code */
    char message[MSG_ERROR_MAX + 1];
    msg_usage usage;               /* of the last event */
} pl_result;

typedef struct pipeline {
    char dir[64];                  /* the runtime directory */
    char build[1024];              /* where the daemons are */
    pid_t pid[PL_SVC_N];           /* 0 when not running */
    pid_t serve;                   /* tandem serve, when it runs the daemons */
    uint32_t pull;                 /* nng_socket id of the event socket */
    bus_client *vd;                /* verifyd.ipc */
    pl_result *res[PL_SEQ_MAX];    /* [n_res] */
    int n_res;
    uint64_t next_rid;             /* request ids */
} pipeline;

/* Whether r's log probabilities are the log-softmax of rows [n_tokens][n_vocab] (row i for
 * token i) within tol, each with the n_top best tokens of its row in cpu_topk's order and
 * theirs; the first difference goes to stderr. */
/* log(sum of exp(row[0..n))), summed in f64 from the row's largest value. */
double pl_logsumexp(const float *row, int64_t n);

bool pl_logprobs_match(const pl_result *r, const float *rows, int64_t n_vocab, uint32_t n_top,
                       double tol);

/* Creates the directory and the event socket. Returns 0, or 77 (skip) when the daemons are
 * not built, or -1. */
int pl_setup(pipeline *p);

/* Stops every daemon (SIGTERM, then SIGKILL) and removes the directory. Returns how many
 * did not exit with status 0 (their logs are printed). */
int pl_teardown(pipeline *p);

/* Starts a daemon with --runtime-dir and the given further arguments (NULL-terminated);
 * OMP_NUM_THREADS=1 so several daemons share the test machine's cores. */
pid_t pl_start(pipeline *p, int svc, const char *const *args);

/* Starts "<build>/tandem serve --runtime-dir <dir> --no-gateway" with further arguments
 * (NULL-terminated); its output goes to <dir>/serve.log. */
pid_t pl_start_serve(pipeline *p, const char *const *args);

/* Stops tandem serve with sig; returns its exit status (or 128 + signal, -1 after 20 s). */
int pl_stop_serve(pipeline *p, int sig);

/* The pid (0 when down) and restart count of a service of tandem serve. */
td_err pl_svc(pipeline *p, const char *name, uint32_t *pid, uint32_t *restarts);

/* Sends sig and waits for the daemon to end (at most 10 s); returns its exit status or
 * 128 + signal. */
int pl_stop(pipeline *p, int svc, int sig);

/* Waits until verifyd says ready (and, with want_draft, that draftd is attached). */
td_err pl_wait_ready(pipeline *p, bool want_draft, int timeout_ms);

/* verifyd's status. */
td_err pl_status(pipeline *p, msg_status *out);

/* Sends gen_start; TD_OK when acked, else the error reply's code (err_msg() has its text). */
td_err pl_gen(pipeline *p, const msg_gen_start *gs);
td_err pl_cancel(pipeline *p, uint64_t seq_id);

/* Collects events until seq_id is done (NULL after timeout_ms). */
pl_result *pl_wait(pipeline *p, uint64_t seq_id, int timeout_ms);

/* Collects events until the generation has at least n tokens or is done. */
pl_result *pl_wait_tokens(pipeline *p, uint64_t seq_id, uint32_t n, int timeout_ms);

/* Sends raw bytes to a daemon's bus endpoint (service "verifyd", "draftd", "kvd") and returns
 * the reply in *reply. */
td_err pl_call_raw(pipeline *p, const char *service, const void *req, size_t len, msg_buf *reply,
                   int timeout_ms);

/* Prints the daemons' logs to stderr (after a failure). */
void pl_dump_logs(const pipeline *p);

#define PL_PATH_MAX 128
#define PL_REPEAT_TOKEN 279 /* the token the pipeline tests' target repeats */

/* The model pair the pipeline tests serve: <dir>/scaled.gguf, the tiny qwen35 test model with
 * PL_REPEAT_TOKEN's rows scaled by s (model_fixture.h), and drafter d written with seed into
 * <dir>/<name>. The paths land in model and draft ([PL_PATH_MAX]); *tm is the loaded target. */
td_err pl_write_pair(pipeline *p, float s, const mf_drafter *d, uint64_t seed, const char *name,
                     char *model, char *draft, tgt_model **tm);

/* Starts kvd, verifyd and draftd with these arguments and waits up to 30 s for verifyd to be
 * ready with the drafter attached (the daemons' logs are printed when it is not). */
td_err pl_start_all(pipeline *p, const char *const *kvd, const char *const *vd,
                    const char *const *dd);

#endif
