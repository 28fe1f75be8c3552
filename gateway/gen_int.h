/* What gen.c, gen_prompt.c, gen_responses.c and background.c share: one request's state
 * (api_stream) and the steps of building and running it. Private to the gateway's generation
 * files. */
#ifndef TANDEM_GATEWAY_GEN_INT_H
#define TANDEM_GATEWAY_GEN_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/tbuf.h"
#include "gateway/background.h"
#include "gateway/gen.h"
#include "gateway/link.h"
#include "gateway/logprobs.h"
#include "gateway/output.h"
#include "gateway/render.h"


/* A prompt of the request and what its choices share. */
typedef struct gen_prompt {
    int32_t *ids;        /* [n] token ids (owned) */
    size_t n;
    bool truncated;      /* truncate_prompt_tokens dropped its first tokens */
    uint32_t max_tokens; /* per choice */
    const char *echo;    /* echo: the prompt's text, as the client gave it or decoded (its ids
                          * when truncated) */
    size_t echo_len;     /* bytes */
    char *echo_owned;    /* the decoding of a prompt of ids (echo points here), or NULL */
    lp_token *plp;       /* echo with logprobs, or prompt_logprobs: [n] the prompt tokens',
                          * from the PROMPT events of its first choice (entry 0 has none),
                          * with gen_prompt_top alternatives */
    size_t n_plp;        /* entries filled */
} gen_prompt;

/* Alternatives kept per prompt token: echo's (with logprobs) or prompt_logprobs', whichever
 * asks more. */
static inline uint32_t gen_prompt_top(const gw_request *r)
{
    const uint32_t echo = r->echo && r->logprobs ? r->top_logprobs : 0;
    const uint32_t plp = r->prompt_lp ? r->prompt_top : 0;
    return echo > plp ? echo : plp;
}

/* /v1/responses: the output items made so far and the one being written. */
typedef struct resp_state {
    json_t *items;       /* the finished output items (an array made with the request) */
    out_kind open;       /* the kind of the item being written: OUT_REASONING, OUT_CONTENT,
                          * or 0 for none */
    char item_id[40];    /* its id: "rs_..." or "msg_..." */
    char call_item_id[40]; /* the function call being written: its item's id, "fc_..." */
    char call_id[96];      /* and its call_id */
    tbuf text;           /* its text so far */
    json_t *lp;          /* a message's output_text logprobs so far (with include
                          * "message.output_text.logprobs"), or NULL */
    uint64_t seq;        /* sequence_number of the next event */
    bool started;        /* a background response left "queued" */
} resp_state;

/* A request's generations (best_of for each prompt, prompt by prompt) run one after the
 * other; generation i is prompt i / best_of's candidate i % best_of, and its choice index
 * while streamed or unranked. The fields from lg to the end of the streams' part are those of
 * the generation running, reset for the next one. */
struct api_stream {
    gw_state *g;
    gw_request req;
    gen_prompt *prompts; /* [n_prompts]: completions' prompts, or the chat's rendered one */
    size_t n_prompts;
    uint32_t n_gens;     /* n_prompts * best_of */
    bool in_think;       /* the prompt leaves a reasoning block open */
    msg_format format;   /* what verifyd enforces: the request's format, or the tools format */
    tok_ids predict;     /* the prediction's tokens (none without one) */
    uint32_t *bad;       /* [n_bad] the bad words' token sequences (msg_gen_start.bad), or
                          * NULL */
    uint32_t n_bad;
    char *tool_spec;     /* the tools as verifyd matches calls against them (common/callm.h):
                          * a required call's, or those of tool_choice "auto" when they can be
                          * enforced; else NULL */
    output_opts oo;      /* how each choice's tokens become its output */
    render_ctx rc;       /* rc.index: the choice */
    char id[48];         /* "chatcmpl-<24 hex>" */
    int client_fd;       /* the client's socket, polled to notice it leaving; -1 unknown */
    bool done;           /* every choice ended, or the request failed: nothing more comes */
    bool client_gone;    /* the client left (or the gateway stops): nothing more is sent */
    bool failed;         /* the request ended with err */
    api_error err;
    gw_usage total;      /* of the choices so far: prompt once, completions summed */
    gw_usage live;       /* continuous_usage_stats: total with the running choice's so far */
    json_t *choices;     /* whole replies: the finished choices' objects */
    double *scores;      /* best_of > n: [n_gens] each one's log probability per token */

    link_gen *lg;        /* the generation at verifyd; NULL once closed */
    gw_output out;       /* tokens -> content, reasoning, tool calls */
    bool out_ready;      /* out was initialised (and must be freed) */
    char call_ids[24];   /* hex: tool-call ids */
    int64_t last_event_ms; /* monotonic ms of verifyd's last event (silence timeout) */
    const char *finish;  /* "stop", "length", "tool_calls" */
    gw_usage usage;      /* the choice's completion, steps and cached tokens (the prompt: total) */
    bool any_call;       /* a tool call was produced: finish "stop" becomes "tool_calls" */
    double lp_sum;       /* best_of > n: the log probabilities of the choice's tokens, summed */
    bool echoed;         /* the prompt opened the choice's text */
    bool counted;        /* the choice's usage is in total */

    /* whole replies */
    tbuf content, reasoning; /* the text of every piece of each kind */
    bool has_reasoning;  /* reasoning came (the message gets "reasoning_content") */
    json_t *calls;       /* tool calls (message form) */
    json_t *lp;          /* chat: logprobs content array; completions: the logprobs object */
    size_t text_offset;  /* completions: characters sent so far (logprobs text_offset) */

    /* streams */
    bool stream;         /* the client asked for SSE */
    bool sent_role;      /* the first chunk (the role) went out */
    json_t *lp_pending;  /* streams: logprobs waiting for the next chunk (chat: the content
                            array; completions: the logprobs object) */
    tbuf sse;            /* rendered events not yet read */
    size_t sse_off;      /* bytes of sse already read */

    resp_state rs;       /* req.responses */

    /* background responses (background.c) */
    bg_job *job;         /* the job this request runs as, or NULL */
    bool cancelled;      /* the job was cancelled: it ends with status "cancelled" */
    bg_job *follow;      /* a reader of a job's events (GET ?stream=true), or NULL; a reader
                          * uses only the fields from here on and client_fd */
    size_t follow_off;   /* bytes of the job's events read */
    uint64_t follow_skip; /* events still to pass over (starting_after + 1) */
};

/* The prompt of the generation running. */
static inline gen_prompt *gen_cur(const api_stream *s)
{
    return &s->prompts[s->rc.index / s->req.best_of];
}

/* Appends chunk (malloc'd, freed here) to the stream's unread events. */
void gen_sse_put(api_stream *s, char *chunk);
/* The request failed for want of memory (unless it failed already). */
void gen_oom(api_stream *s);
/* 2 n_bytes random hex digits into out. */
void gen_hex(char *out, size_t n_bytes);

/* True when the client of socket fd (-1: none known) closed its side of the connection. */
bool gen_client_gone(int fd);
/* Starts the choice s->rc.index at verifyd, waiting while it is busy. */
td_err gen_start(api_stream *s, api_error *e);
/* Runs s (checked, not started) to its end on this thread: the start (a failure ends it as
 * failed), response.in_progress, then every event; after(s, arg) follows each of these. */
void gen_run(api_stream *s, void (*after)(api_stream *s, void *arg), void *arg);

/* --- /v1/responses (gen_responses.c): the chat generation rendered as a response ---------- */

/* A stream's first events: response.created, response.in_progress. */
void resp_begin(api_stream *s);
/* One piece of output into the items (and, streamed, its events). lp: the logprobs for a
 * content piece (reference taken), or NULL. */
void resp_piece(api_stream *s, const out_piece *p, json_t *lp);
/* The generation ended with finish ("stop", "length", "tool_calls"): the open item closed and,
 * streamed, response.completed or response.incomplete. */
void resp_end(api_stream *s, const char *finish);
/* The request failed (s->err): streamed, an error event and response.failed. */
void resp_failed(api_stream *s);
/* A background response's first events: response.created and response.queued (status
 * "queued"). */
void resp_queued(api_stream *s);
/* A background response started at verifyd: response.in_progress. */
void resp_started(api_stream *s);
/* The response object as it stands: "queued" before its start, "in_progress", then its end's
 * status (NULL when out of memory). */
json_t *resp_now(api_stream *s);
/* An ended background response's object, kept (with `store`) when it failed or was cancelled,
 * which resp_end does not keep (NULL when out of memory). */
json_t *resp_ended(api_stream *s);
/* The whole response object, or NULL when out of memory. */
char *resp_body(api_stream *s, const char *finish);
void resp_free(resp_state *rs);

/* The request's prompts as token ids, each with its budget (and its echo). */
td_err gen_prompts(api_stream *s, api_error *e);

/* n token ids of param against the vocabulary (the request parser knows only their form). */
td_err gen_check_ids(const api_stream *s, const char *param, const uint32_t *ids, size_t n,
                     api_error *e);

/* The tool spec verifyd matches calls against (s->tool_spec, s->format). */
td_err gen_tool_spec(api_stream *s, api_error *e);

/* The prediction's tokens (s->predict). */
td_err gen_prediction(api_stream *s, api_error *e);
/* The bad words' token sequences into s->bad: each word without its leading whitespace, and
 * after one space when that tokenizes differently (a word inside the text); 400 past the
 * message's limits. */
td_err gen_bad_words(api_stream *s, api_error *e);

#endif
