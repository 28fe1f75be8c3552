/* A stand-in for verifyd in gateway tests: answers hello, status_get, gen_start and gen_cancel
 * on a bus server, and pushes a scripted generation's events to the gateway's event socket, so
 * the gateway can be tested to the byte without a model. */
#ifndef TANDEM_TESTS_SUPPORT_FAKE_VERIFYD_H
#define TANDEM_TESTS_SUPPORT_FAKE_VERIFYD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/msg.h"

#define FAKE_TOKENS_MAX 1024

/* What the next generations do. */
typedef struct fake_script {
    uint32_t tokens[FAKE_TOKENS_MAX]; /* the whole output, before max_tokens */
    uint32_t n_tokens;
    uint32_t step;          /* tokens per TOKEN event (acceptance length), >= 1 */
    int delay_ms;           /* before each event */
    int error_after;        /* > 0: an ERROR event (TD_EIO, "scripted failure") after this many
                               TOKEN events */
    bool hang;              /* after the tokens, send nothing more (no DONE) */
    int busy;               /* answer this many gen_start calls with TD_EBUSY first */
    td_err start_error;     /* answer gen_start with this error instead (TD_OK: ack) */
    uint32_t cached;        /* cached prompt tokens to report */
    float lp_per_seed;      /* every log probability reported lowered by this times
                               15 - the generation's seed % 16 (fake_logprob's values
                               otherwise), so a larger seed reports likelier tokens */
    uint32_t prompt_lp_drop; /* asked for prompt log probabilities: leave out the last this
                                many (a broken verifyd) */
    uint32_t predicted;     /* accepted prediction tokens to report */
} fake_script;

typedef struct fake_verifyd fake_verifyd;

/* Serves on verifyd_url and pushes to events_url; hello answers with pid, status with n_ctx,
 * the model name and ready. */
td_err fake_verifyd_start(fake_verifyd **out, const char *verifyd_url, const char *events_url,
                          uint32_t pid, uint32_t n_ctx, bool ready);
void fake_verifyd_stop(fake_verifyd *f);

void fake_verifyd_script(fake_verifyd *f, const fake_script *s);

/* The last gen_start received: its fields (arrays copied into prompt / stop, capacities in
 * items; schema, predict and bad point to the fake's copies, their first 4095 bytes, 256 and
 * 512 entries, until the next start). False when none came. */
bool fake_verifyd_last_start(fake_verifyd *f, msg_gen_start *m, uint32_t *prompt,
                             uint32_t prompt_cap, uint32_t *stop, uint32_t stop_cap);

/* gen_cancel calls received, and gen_start calls answered with ack. */
int fake_verifyd_cancels(fake_verifyd *f);
/* From now on hello answers with this pid, as a verifyd restarted between two polls would. */
void fake_verifyd_set_pid(fake_verifyd *f, uint32_t pid);
int fake_verifyd_starts(fake_verifyd *f);
/* From now on status says ready, or not ready with why (verifyd's reason). */
void fake_verifyd_set_ready(fake_verifyd *f, bool ready, const char *why);

/* The log probability the fake reports for the i-th token of a generation, and for its k-th
 * alternative (alternative 0 is the token itself, k > 0 is token id + k). */
float fake_logprob(uint32_t i, uint32_t k);
/* And for prompt token i (>= 1) and its k-th alternative (prompt token id + k), sent in
 * PROMPT events of 16 tokens when prompt_logprobs is asked for. */
float fake_prompt_logprob(uint32_t i, uint32_t k);

#endif
