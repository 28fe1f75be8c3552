/* Messages between tandem's own daemons: msgpack over NNG (DESIGN section 3).
 *
 * Every message is one msgpack array, the envelope:
 *
 *     [version u16, type u16, request_id u64, [payload fields...]]
 *
 * version is MSG_PROTOCOL_VERSION; a peer speaking another version is refused with TD_EPROTO
 * (the version is checked before anything else, so a future envelope shape still gets that
 * answer). type is a msg_type; its payload is a fixed list of fields in a fixed order.
 * request_id is chosen by the sender of a request and copied into its reply; a caller that
 * retries a failed call reuses the id, so servers treat a repeated id as the same request
 * (common/bus.h says why retries, and no NNG resends, are the only repeats).
 *
 * One msg_pack_<type> and one msg_unpack_<type> per type. Pack checks the struct against the
 * same limits unpack enforces (TD_EINVAL otherwise) and replaces the buffer's contents. Unpack
 * accepts exactly one well-formed message of that type: the exact field count, each field's
 * msgpack type, integer ranges, string/array/bin lengths within the MSG_*_MAX limits, enum
 * values, and nothing after the message. Malformed, truncated or oversized input is TD_EFORMAT;
 * another protocol version, an unknown type or a type other than the one asked for is
 * TD_EPROTO. Unpack never reads outside [buf, buf + len) and never allocates more than the
 * input could describe. Unpacked strings are NUL-terminated copies (embedded NUL bytes are
 * refused); bin fields point into the input buffer; u32 arrays are allocated and released by
 * msg_free_<type>. The request_id out-parameter of unpack may be NULL.
 *
 * Adding a message type: a value in msg_type (wire numbers never change), its name in
 * msg_type_name, a struct, msg_pack_/msg_unpack_ (and msg_free_ when it owns arrays) in
 * msg.c, a line in tests/fuzz/fuzz_msg.c and round-trip/hostile cases in tests/test_msg.c. */
#ifndef TANDEM_COMMON_MSG_H
#define TANDEM_COMMON_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/kvlayout.h"

#define MSG_PROTOCOL_VERSION 1

/* Field limits (bytes for strings and bins, items for arrays). */
#define MSG_BUILD_ID_MAX 64          /* hello.build_id */
#define MSG_PING_DATA_MAX (1u << 20) /* ping/pong.data */
#define MSG_ERROR_MAX 1023           /* error message (err_msg() holds 1023 + NUL) */
#define MSG_NAME_MAX 63              /* shared buffer name */
#define MSG_UUID_MAX 63              /* device UUID string, "GPU-8f3c...-..." is 40 */
#define MSG_PROMPT_MAX (1u << 18)    /* gen_start prompt tokens (262144: the models' context) */
#define MSG_STOP_MAX 64              /* gen_start stop token ids */
#define MSG_PREDICT_MAX (1u << 16)   /* gen_start prediction tokens */
#define MSG_ALLOWED_MAX (1u << 16)   /* gen_start allowed tokens */
#define MSG_BAD_MAX (1u << 14)       /* gen_start bad-word entries (lengths and ids) */
#define MSG_BAD_LEN_MAX 64           /* tokens of one bad word */
#define MSG_BIAS_MAX 1024            /* gen_start logit bias entries */
#define MSG_PENALTY_MAX 2.0f         /* gen_start presence/frequency penalty magnitude (OpenAI) */
#define MSG_BIAS_VALUE_MAX 100.0f    /* gen_start logit bias magnitude (OpenAI) */
#define MSG_SCHEMA_MAX (256u << 10)  /* gen_start JSON Schema text (bytes) */
#define MSG_REPETITION_MAX 10.0f     /* gen_start repetition penalty (above 0) */
#define MSG_TOKEN_NONE UINT32_MAX    /* a token id field that names no token */
#define MSG_EVENT_TOKENS_MAX 256     /* gen_event tokens (a step commits at most 16) */
#define MSG_TOP_LOGPROBS_MAX 20      /* gen_start.top_logprobs, alternatives per token (OpenAI) */
#define MSG_MODEL_NAME_MAX 255       /* status.model */
#define MSG_ACCEPT_HIST_MAX 65       /* status.accept_hist bins: 0..64 tokens per step */
#define MSG_DRAFT_MAX 63             /* propose.n_draft: tokens after the pending one */
#define MSG_Q_SUPPORT_MAX (1u << 20) /* proposal q entries per draft token (vocabulary size) */
#define MSG_TOKENS_MAX MSG_PROMPT_MAX /* kv_open / kv_close token lists */
#define MSG_TAPS_MAX 64              /* kv_attach.taps */
#define MSG_POOLS_MAX 5              /* kv_pools: target, draft, proposal pools, 2 heads */
#define MSG_HEADS_MAX 2              /* kv_attach.heads: token embedding, LM head */
#define MSG_SVC_NAME_MAX 31          /* supervisor service names */
#define MSG_SVC_MAX 8                /* services in svc_list */
#define MSG_PATH_MAX 1023            /* svc_restart.draft */

/* Wire numbers: never renumber, only append. */
typedef enum msg_type {
    MSG_HELLO = 1,
    MSG_PING = 2,
    MSG_PONG = 3,
    MSG_ERROR = 4,
    MSG_SHBUF_ANNOUNCE = 5,
    MSG_GEN_START = 6,
    MSG_GEN_EVENT = 7,
    MSG_GEN_CANCEL = 8,
    MSG_ACK = 9,
    MSG_STATUS_GET = 10,
    MSG_STATUS = 11,
    MSG_PROPOSE = 12,
    MSG_PROPOSAL = 13,
    MSG_KV_ATTACH = 14,
    MSG_KV_POOLS = 15,
    MSG_KV_OPEN = 16,
    MSG_KV_SLOT = 17,
    MSG_KV_CLOSE = 18,
    MSG_SVC_LIST_GET = 19,
    MSG_SVC_LIST = 20,
    MSG_SVC_RESTART = 21,
    MSG_TYPE_END /* one past the last type */
} msg_type;

/* "gen_start"; "unknown" for values outside msg_type. */
const char *msg_type_name(msg_type type);

/* A growable byte buffer that pack functions fill and bus replies land in. */
typedef struct msg_buf {
    uint8_t *data; /* [cap] */
    size_t len;    /* bytes in use */
    size_t cap;    /* bytes allocated */
} msg_buf;

void msg_buf_init(msg_buf *b);
void msg_buf_free(msg_buf *b);
/* Replaces the contents with a copy of [data, data + len). */
td_err msg_buf_assign(msg_buf *b, const void *data, size_t len);
/* Appends bytes. */
td_err msg_buf_append(msg_buf *b, const void *data, size_t len);

typedef struct msg_header {
    uint16_t version;    /* MSG_PROTOCOL_VERSION (anything else was refused) */
    msg_type type;       /* a known type */
    uint64_t request_id; /* sender's id of the request this message is or answers */
} msg_header;

/* Checks the envelope only (version, type, request id, payload array present) so a receiver
 * can dispatch on hdr->type; the payload is checked by that type's unpack. */
td_err msg_unpack_header(const void *buf, size_t len, msg_header *hdr);

/* --- hello: first message on a connection; says who is talking ------------------------- */

typedef enum msg_role {
    MSG_ROLE_GATEWAY = 1,
    MSG_ROLE_VERIFYD = 2,
    MSG_ROLE_DRAFTD = 3,
    MSG_ROLE_KVD = 4,
    MSG_ROLE_CLI = 5, /* the tandem command, tests, benchmarks */
    MSG_ROLE_END
} msg_role;

typedef struct msg_hello {
    msg_role role;
    uint32_t pid;                        /* sender's process id, > 0 */
    uint16_t protocol;                   /* protocol version the sender speaks */
    char build_id[MSG_BUILD_ID_MAX + 1]; /* NUL-terminated, may be empty */
} msg_hello;

td_err msg_pack_hello(msg_buf *out, uint64_t request_id, const msg_hello *m);
td_err msg_unpack_hello(const void *buf, size_t len, uint64_t *request_id, msg_hello *out);

/* --- ping / pong: liveness and round-trip time; pong echoes the ping's fields ----------- */

typedef struct msg_ping {
    uint64_t nonce;      /* echoed (e.g. the sender's clock in ns) */
    const uint8_t *data; /* [data_len] echoed bytes; after unpack, points into the input */
    uint32_t data_len;   /* bytes, <= MSG_PING_DATA_MAX */
} msg_ping;

td_err msg_pack_ping(msg_buf *out, uint64_t request_id, const msg_ping *m);
td_err msg_unpack_ping(const void *buf, size_t len, uint64_t *request_id, msg_ping *out);
td_err msg_pack_pong(msg_buf *out, uint64_t request_id, const msg_ping *m);
td_err msg_unpack_pong(const void *buf, size_t len, uint64_t *request_id, msg_ping *out);

/* --- error: the reply to a request that failed ------------------------------------------ */

typedef struct msg_error {
    td_err code;                     /* TD_EINVAL .. TD_ERR_COUNT - 1, never TD_OK */
    char message[MSG_ERROR_MAX + 1]; /* NUL-terminated */
} msg_error;

td_err msg_pack_error(msg_buf *out, uint64_t request_id, const msg_error *m);
td_err msg_unpack_error(const void *buf, size_t len, uint64_t *request_id, msg_error *out);

/* --- shbuf_announce: a shared buffer exists; its fd travels separately (AF_UNIX) -------- */

typedef enum msg_shbuf_kind {
    MSG_SHBUF_CPU = 1,  /* memfd_create region */
    MSG_SHBUF_CUDA = 2, /* CUDA VMM allocation exported as a POSIX fd */
    MSG_SHBUF_KIND_END
} msg_shbuf_kind;

typedef struct msg_shbuf_announce {
    char name[MSG_NAME_MAX + 1];         /* NUL-terminated, non-empty */
    uint64_t generation;                 /* bumps each time the named buffer is re-created */
    msg_shbuf_kind kind;
    uint64_t size;                       /* bytes, > 0 */
    char device_uuid[MSG_UUID_MAX + 1];  /* cuda: the GPU's UUID, non-empty; cpu: empty */
} msg_shbuf_announce;

td_err msg_pack_shbuf_announce(msg_buf *out, uint64_t request_id, const msg_shbuf_announce *m);
td_err msg_unpack_shbuf_announce(const void *buf, size_t len, uint64_t *request_id,
                                 msg_shbuf_announce *out);

/* --- gen_start / gen_event: one generation, gateway <-> verifyd ------------------------- */

/* Sampler settings; the same values shape target and drafter distributions (DESIGN 4). */
typedef struct msg_sampler {
    float temperature; /* >= 0, finite; 0 = greedy */
    uint32_t top_k;    /* candidates kept; 0 = all */
    float top_p;       /* nucleus mass in (0, 1]; 1 = off */
    float min_p;       /* in [0, 1]: drop tokens below min_p * max prob; 0 = off */
    uint64_t seed;     /* sampling RNG seed */
} msg_sampler;

/* Structured output of a generation (OpenAI response_format). */
typedef enum msg_format {
    MSG_FORMAT_TEXT = 0,        /* anything */
    MSG_FORMAT_JSON_OBJECT = 1, /* one JSON object (json_object mode) */
    MSG_FORMAT_JSON_SCHEMA = 2, /* one JSON value valid under msg_gen_start.schema */
    MSG_FORMAT_TOOL_CALL = 3,   /* the answer opens with a tool call (<tool_call> ...
                                 * </tool_call>, tool_choice "required") */
    MSG_FORMAT_TOOLS = 4,       /* anything, but each tool call the model opens is matched
                                 * against the tool spec (tool_choice "auto") */
    MSG_FORMAT_CHOICE = 5,      /* exactly one of the strings of the choice spec in schema
                                 * (common/callm.h) */
    MSG_FORMAT_GRAMMAR = 6,     /* a sentence of the GBNF grammar in schema (common/gram.h) */
    MSG_FORMAT_REGEX = 7,       /* a text the regular expression in schema matches whole */
    MSG_FORMAT_JSON_OBJECT_COMPACT = 8, /* MSG_FORMAT_JSON_OBJECT without any whitespace */
    MSG_FORMAT_JSON_SCHEMA_COMPACT = 9, /* MSG_FORMAT_JSON_SCHEMA without any whitespace */
    MSG_FORMAT_TAGS = 10,       /* free text with the structural tags of the tags spec in
                                 * schema (common/callm.h) */
    MSG_FORMAT_END
} msg_format;

typedef struct msg_gen_start {
    uint64_t seq_id;        /* sequence this generation runs in */
    const uint32_t *prompt; /* [n_prompt] token ids */
    uint32_t n_prompt;      /* tokens, 1..MSG_PROMPT_MAX */
    uint32_t max_tokens;    /* new tokens at most; 0: the prompt only (its state is kept for
                             * the prefix cache, and its PROMPT events come with
                             * prompt_logprobs) */
    msg_sampler sampler;
    const uint32_t *stop;   /* [n_stop] token ids that end the generation */
    uint32_t n_stop;        /* tokens, 0..MSG_STOP_MAX */
    bool logprobs;          /* send each emitted token's log probability */
    uint32_t top_logprobs;  /* and this many most likely alternatives, 0..MSG_TOP_LOGPROBS_MAX
                             * (non-zero only with logprobs or prompt_logprobs) */
    bool ignore_eos;        /* the model's end-of-generation tokens do not stop it (stop ids
                             * still do) */
    float presence_penalty; /* -MSG_PENALTY_MAX..MSG_PENALTY_MAX: subtracted from the logit of
                             * a token generated before */
    float frequency_penalty; /* the same range: and this much per time it was generated */
    const uint32_t *bias_tok; /* [n_bias] token ids whose logits get bias (verifyd checks them
                               * against the vocabulary) */
    const float *bias;      /* [n_bias] -MSG_BIAS_VALUE_MAX..MSG_BIAS_VALUE_MAX */
    uint32_t n_bias;        /* 0..MSG_BIAS_MAX */
    msg_format format;      /* structured output: what the text must be */
    const char *schema;     /* [n_schema] JSON Schema text (MSG_FORMAT_JSON_SCHEMA), the
                             * tool spec of MSG_FORMAT_TOOL_CALL / MSG_FORMAT_TOOLS
                             * (common/callm.h: a call's body is matched against it; a
                             * required call without one has a free body), the choice spec,
                             * the grammar or the regular expression, kept
                             * NUL-terminated by unpack; NULL otherwise */
    uint32_t n_schema;      /* bytes, 1..MSG_SCHEMA_MAX with a schema (optional for a required
                             * tool call), else 0 */
    /* With a format other than text: */
    bool think_open;        /* the prompt leaves a reasoning block open: the format applies
                             * after think_end */
    uint32_t think_start;   /* the token that opens a reasoning block (the output may begin with
                             * one, then the format applies after think_end), or MSG_TOKEN_NONE */
    uint32_t think_end;     /* the token that closes it, or MSG_TOKEN_NONE (then a reasoning
                             * block never ends and think_open/think_start must not be used) */
    float repetition_penalty; /* 0 (none) or in (0, MSG_REPETITION_MAX]: a prompt or generated
                               * token's positive logit is divided by it, a negative one
                               * multiplied */
    uint32_t min_tokens;    /* the stop tokens are refused before this many were generated */
    bool prompt_logprobs;   /* send the log probability of every prompt token after the first
                             * (PROMPT events, before any TOKEN event; top_logprobs
                             * alternatives each with logprobs): the whole prompt runs, the
                             * prefix cache is not read */
    const uint32_t *predict; /* [n_predict] what the output is expected to be much like
                              * (OpenAI's predicted outputs): where the output follows it, its
                              * next tokens are the drafts; the output is the same either way */
    uint32_t n_predict;     /* tokens, 0..MSG_PREDICT_MAX */
    const uint32_t *allowed; /* [n_allowed] the only tokens that may be chosen (vLLM's
                              * allowed_token_ids), or none: all */
    uint32_t n_allowed;     /* tokens, 0..MSG_ALLOWED_MAX */
    const uint32_t *bad;    /* [n_bad] token sequences that must not be generated (vLLM's
                             * bad_words): each its length (1..MSG_BAD_LEN_MAX), then its ids;
                             * the last token of one is refused where the tokens generated
                             * before it end with the others */
    uint32_t n_bad;         /* entries, 0..MSG_BAD_MAX */
} msg_gen_start;

td_err msg_pack_gen_start(msg_buf *out, uint64_t request_id, const msg_gen_start *m);
td_err msg_unpack_gen_start(const void *buf, size_t len, uint64_t *request_id,
                            msg_gen_start *out);
/* Frees the arrays unpack allocated; safe on a zeroed struct. */
void msg_free_gen_start(msg_gen_start *m);

typedef enum msg_event_kind {
    MSG_EVENT_TOKEN = 1, /* newly committed tokens; more follow */
    MSG_EVENT_DONE = 2,  /* last event: finish reason and usage */
    MSG_EVENT_ERROR = 3, /* last event: the generation failed (code, message) */
    MSG_EVENT_PROMPT = 4, /* prompt tokens with their log probabilities (prompt_logprobs): the
                           * prompt from its second token on, in order, over as many events as
                           * it takes */
    MSG_EVENT_KIND_END
} msg_event_kind;

typedef enum msg_finish {
    MSG_FINISH_NONE = 0,   /* token events */
    MSG_FINISH_STOP = 1,   /* a stop or end-of-turn token */
    MSG_FINISH_LENGTH = 2, /* max_tokens or the context end */
    MSG_FINISH_CANCEL = 3, /* cancelled by the client */
    MSG_FINISH_ERROR = 4,  /* error events */
    MSG_FINISH_END
} msg_finish;

typedef struct msg_usage {
    uint32_t prompt_tokens;     /* tokens */
    uint32_t completion_tokens; /* tokens emitted */
    uint32_t steps;             /* target verify passes while decoding; tau = tokens / steps */
    uint32_t cached_tokens;     /* prompt tokens reused from the prefix cache, <= prompt_tokens */
    uint32_t predicted_tokens;  /* drafts taken from the prediction and accepted */
} msg_usage;

/* Log probabilities of one emitted token under the target (log-softmax of its raw logits, no
 * sampler filters), and its most likely alternatives, most likely first. */
typedef struct msg_logprob {
    float logprob;                           /* <= 0 */
    uint32_t rank;                           /* tokens at least as likely, itself included
                                              * (1: the most likely), 0: none (ops_logprob) */
    uint32_t n_top;                          /* 0..MSG_TOP_LOGPROBS_MAX */
    uint32_t top_id[MSG_TOP_LOGPROBS_MAX];   /* [n_top] token ids */
    float top_logprob[MSG_TOP_LOGPROBS_MAX]; /* [n_top] their log probabilities */
} msg_logprob;

/* Whether an event of this kind is a generation's last (DONE, ERROR). */
static inline bool msg_event_last(msg_event_kind kind)
{
    return kind == MSG_EVENT_DONE || kind == MSG_EVENT_ERROR;
}

/* Kind and fields agree: TOKEN and PROMPT have finish NONE (PROMPT one logprob per token);
 * DONE has STOP, LENGTH or CANCEL; ERROR has finish ERROR and a code other than TD_OK; only
 * ERROR carries a code and message. */
typedef struct msg_gen_event {
    uint64_t seq_id;
    msg_event_kind kind;
    const uint32_t *tokens;          /* [n_tokens] committed token ids, in order */
    uint32_t n_tokens;               /* tokens, 0..MSG_EVENT_TOKENS_MAX */
    const msg_logprob *logprobs;     /* [n_logprobs] one per token, or none */
    uint32_t n_logprobs;             /* 0 or n_tokens */
    msg_finish finish;
    msg_usage usage;                 /* running totals */
    td_err code;                     /* ERROR: why; else TD_OK */
    char message[MSG_ERROR_MAX + 1]; /* ERROR: NUL-terminated text; else empty */
} msg_gen_event;

td_err msg_pack_gen_event(msg_buf *out, uint64_t request_id, const msg_gen_event *m);
td_err msg_unpack_gen_event(const void *buf, size_t len, uint64_t *request_id,
                            msg_gen_event *out);
void msg_free_gen_event(msg_gen_event *m);

/* --- gen_cancel / ack ---------------------------------------------------------------------- */

/* gateway -> verifyd: stop a generation (its last event is DONE with finish CANCEL, unless it
 * had already ended). Answered with ack. */
typedef struct msg_gen_cancel {
    uint64_t seq_id;
} msg_gen_cancel;

td_err msg_pack_gen_cancel(msg_buf *out, uint64_t request_id, const msg_gen_cancel *m);
td_err msg_unpack_gen_cancel(const void *buf, size_t len, uint64_t *request_id,
                             msg_gen_cancel *out);

/* The success reply of a request that returns nothing else (gen_start, gen_cancel, kv_close,
 * svc_restart). */
typedef struct msg_ack {
    uint64_t id; /* what the request acted on (seq_id, slot), else 0 */
} msg_ack;

td_err msg_pack_ack(msg_buf *out, uint64_t request_id, const msg_ack *m);
td_err msg_unpack_ack(const void *buf, size_t len, uint64_t *request_id, msg_ack *out);

/* --- status_get / status: verifyd's state, for /health and /metrics ---------------------- */

/* status_get has no fields. */
td_err msg_pack_status_get(msg_buf *out, uint64_t request_id);
td_err msg_unpack_status_get(const void *buf, size_t len, uint64_t *request_id);

typedef struct msg_status {
    char model[MSG_MODEL_NAME_MAX + 1]; /* the target's general.name (NUL-terminated) */
    uint32_t n_ctx;             /* positions per sequence (prompt + generated) */
    uint32_t n_vocab;           /* tokens */
    bool ready;                 /* generations are accepted now (model loaded, kvd attached) */
    bool draft_attached;        /* draftd answers proposals (speculative decoding is on) */
    uint32_t block;             /* tokens a verify block holds at most (the drafter's block, or
                                 * 1 + verifyd --draft-max; 1: plain decoding only) */
    uint32_t slots;             /* sequences that run at once */
    uint32_t active;            /* sequences running */
    uint32_t queued;            /* generations waiting for a slot */
    uint64_t requests;          /* generations started since verifyd started */
    uint64_t prompt_tokens;     /* tokens */
    uint64_t cached_tokens;     /* prompt tokens served from the prefix cache */
    uint64_t completion_tokens; /* tokens emitted */
    uint64_t steps;             /* verify passes while decoding */
    uint64_t drafted;           /* draft tokens proposed */
    uint64_t accepted;          /* draft tokens accepted */
    uint64_t prefill_us;        /* microseconds in prompt passes */
    uint64_t draft_us;          /* microseconds waiting for draftd */
    uint64_t verify_us;         /* microseconds in verify passes */
    uint64_t draft_attaches;    /* times draftd was found (again) */
    uint64_t draft_failures;    /* proposals that failed or came too late */
    uint64_t graph_recorded;    /* target forward passes recorded as CUDA graphs */
    uint64_t graph_replayed;    /* passes run as a replay of a recording */
    uint64_t graph_direct;      /* passes run op by op where graphs are on (not worth one) */
    char not_ready[MSG_ERROR_MAX + 1]; /* not ready: what verifyd waits for (its last kvd
                                        * attach's error); "" when ready */
    uint32_t n_hist;            /* bins used, 0..MSG_ACCEPT_HIST_MAX */
    uint64_t accept_hist[MSG_ACCEPT_HIST_MAX]; /* [n_hist] steps by tokens committed (0..) */
} msg_status;

td_err msg_pack_status(msg_buf *out, uint64_t request_id, const msg_status *m);
td_err msg_unpack_status(const void *buf, size_t len, uint64_t *request_id, msg_status *out);

/* --- propose / proposal: verifyd asks draftd for a block ---------------------------------- */

/* The features of positions 0..n_past-1 are in the target pool's feature ring of slot (the
 * last ring rows of them); draftd brings its context up to n_past and drafts n_draft tokens
 * after pending (at position n_past) with the sampler's settings and random streams. */
typedef struct msg_propose {
    uint64_t seq_id;
    uint32_t slot;          /* kvd slot of the sequence */
    uint64_t slot_gen;      /* kvd's generation of the slot's contents */
    uint64_t pool_gen;      /* generation of the target pool the features are in */
    uint32_t n_past;        /* committed positions L, >= 1 */
    uint32_t pending;       /* token id at position L */
    uint32_t n_draft;       /* tokens wanted, 1..MSG_DRAFT_MAX */
    msg_sampler sampler;
} msg_propose;

td_err msg_pack_propose(msg_buf *out, uint64_t request_id, const msg_propose *m);
td_err msg_unpack_propose(const void *buf, size_t len, uint64_t *request_id, msg_propose *out);

/* One draft token's distribution q: its non-zero entries, ids strictly increasing. */
typedef struct msg_draft_q {
    const uint32_t *ids; /* [n] token ids */
    const float *p;      /* [n] probabilities, finite and > 0 */
    uint32_t n;          /* entries, 1..MSG_Q_SUPPORT_MAX */
} msg_draft_q;

/* Sampled proposals put the distributions of d1..dn in kvd's proposal pool (dense rows of
 * n_vocab f32, written and made visible before the reply is sent): q_rows says so and where.
 * The sparse q inside the message is the other way to carry them (a peer without the pool);
 * at most one of the two is used. */
typedef struct msg_proposal {
    uint64_t seq_id;
    uint32_t n_past;        /* the request's n_past */
    const uint32_t *tokens; /* [n_tokens] d1..dn */
    uint32_t n_tokens;      /* 1..MSG_DRAFT_MAX */
    const msg_draft_q *q;   /* [n_q] distributions of d1..dn in the message, or none */
    uint32_t n_q;           /* 0 or n_tokens */
    uint64_t q_gen;         /* generation of the proposal pool holding the rows (q_rows > 0) */
    uint64_t q_offset;      /* bytes from the pool's start to row 0, a multiple of 4 */
    uint32_t q_rows;        /* 0 or n_tokens: rows [q_rows][n_vocab] f32 in the pool */
} msg_proposal;

td_err msg_pack_proposal(msg_buf *out, uint64_t request_id, const msg_proposal *m);
td_err msg_unpack_proposal(const void *buf, size_t len, uint64_t *request_id,
                           msg_proposal *out);
void msg_free_proposal(msg_proposal *m);

/* --- kvd: attach (over kvd's fd socket), sequences (over kvd.ipc) ------------------------- */

/* A process maps kvd's pools. verifyd sends the target part of params (slots is kvd's own
 * and ignored; the drafter part, where it knows the drafter, only for sizing the pools) and
 * the tap layer ids; draftd sends its drafter part (d_layers, d_kv,
 * d_head_dim, block) and its tap ids, which must equal verifyd's. verifyd on a GPU also
 * hands over its token embedding and LM head (heads, whose fds follow in the same fdpass
 * message, in this order), which kvd passes on to draftd. */
typedef struct msg_kv_attach {
    msg_role role;          /* MSG_ROLE_VERIFYD or MSG_ROLE_DRAFTD */
    uint32_t pid;           /* > 0 */
    kvl_params params;
    const uint32_t *taps;   /* [n_taps] target layer ids */
    uint32_t n_taps;        /* 0..MSG_TAPS_MAX */
    msg_shbuf_announce heads[MSG_HEADS_MAX]; /* [n_heads] verifyd only */
    uint32_t n_heads;       /* 0..MSG_HEADS_MAX */
    uint64_t reserve;       /* verifyd: bytes the drafter still needs on the pools' GPU
                             * besides its context pool (its weights and working memory;
                             * 0 when it has them already or there is none), which kvd
                             * leaves free when it sizes the pools to the GPU; draftd: 0 */
} msg_kv_attach;

td_err msg_pack_kv_attach(msg_buf *out, uint64_t request_id, const msg_kv_attach *m);
td_err msg_unpack_kv_attach(const void *buf, size_t len, uint64_t *request_id,
                            msg_kv_attach *out);
void msg_free_kv_attach(msg_kv_attach *m);

/* kvd's answer to an attach: the full parameters (kvl_compute gives the offsets) and the
 * buffers, whose fds follow in the same fdpass message in the same order. Each is known by
 * its name (KVC_POOL_* in common/kvclient.h): the target pool first, then what the role
 * uses of the draft pool, the proposal pool and verifyd's heads. */
typedef struct msg_kv_pools {
    kvl_params params;
    msg_shbuf_announce pools[MSG_POOLS_MAX]; /* [n_pools] */
    uint32_t n_pools;                        /* 1..MSG_POOLS_MAX */
} msg_kv_pools;

td_err msg_pack_kv_pools(msg_buf *out, uint64_t request_id, const msg_kv_pools *m);
td_err msg_unpack_kv_pools(const void *buf, size_t len, uint64_t *request_id,
                           msg_kv_pools *out);

/* Opens a sequence for a prompt: kvd hands a slot, reusing a cached one whose tokens are all
 * a prefix of this prompt (shorter than it) when there is one. */
typedef struct msg_kv_open {
    uint32_t pid;           /* the owner; its slots are reclaimed when it dies */
    const uint32_t *tokens; /* [n_tokens] the prompt */
    uint32_t n_tokens;      /* 1..MSG_TOKENS_MAX */
} msg_kv_open;

td_err msg_pack_kv_open(msg_buf *out, uint64_t request_id, const msg_kv_open *m);
td_err msg_unpack_kv_open(const void *buf, size_t len, uint64_t *request_id, msg_kv_open *out);
void msg_free_kv_open(msg_kv_open *m);

typedef struct msg_kv_slot {
    uint32_t slot;      /* index in the pools */
    uint64_t slot_gen;  /* generation of its contents (same as the cached sequence's on reuse) */
    uint64_t pool_gen;  /* generation of the target pool the slot is in */
    uint32_t n_cached;  /* leading prompt tokens whose state the slot already holds */
} msg_kv_slot;

td_err msg_pack_kv_slot(msg_buf *out, uint64_t request_id, const msg_kv_slot *m);
td_err msg_unpack_kv_slot(const void *buf, size_t len, uint64_t *request_id, msg_kv_slot *out);

/* Ends a sequence. With keep, the slot's state is that of exactly tokens (every committed
 * position, in order) and is kept for the prefix cache; without, the slot is freed. */
typedef struct msg_kv_close {
    uint32_t slot;
    uint64_t slot_gen;
    bool keep;
    const uint32_t *tokens; /* [n_tokens] committed tokens (keep), else none */
    uint32_t n_tokens;      /* 0..MSG_TOKENS_MAX */
} msg_kv_close;

td_err msg_pack_kv_close(msg_buf *out, uint64_t request_id, const msg_kv_close *m);
td_err msg_unpack_kv_close(const void *buf, size_t len, uint64_t *request_id,
                           msg_kv_close *out);
void msg_free_kv_close(msg_kv_close *m);

/* --- supervisor control (tandem serve's socket): list services, restart one -------------- */

td_err msg_pack_svc_list_get(msg_buf *out, uint64_t request_id);
td_err msg_unpack_svc_list_get(const void *buf, size_t len, uint64_t *request_id);

typedef struct msg_svc {
    char name[MSG_SVC_NAME_MAX + 1]; /* "kvd", "verifyd", "draftd", "gateway" */
    uint32_t pid;                    /* 0 when not running */
    uint64_t uptime_ms;              /* since its last start; 0 when not running */
    uint32_t restarts;               /* starts after the first */
} msg_svc;

typedef struct msg_svc_list {
    msg_svc svc[MSG_SVC_MAX]; /* [n] */
    uint32_t n;               /* 0..MSG_SVC_MAX */
} msg_svc_list;

td_err msg_pack_svc_list(msg_buf *out, uint64_t request_id, const msg_svc_list *m);
td_err msg_unpack_svc_list(const void *buf, size_t len, uint64_t *request_id,
                           msg_svc_list *out);

typedef struct msg_svc_restart {
    char name[MSG_SVC_NAME_MAX + 1]; /* service to restart, non-empty */
    char draft[MSG_PATH_MAX + 1];    /* draftd: the drafter folder to switch to; "" = same */
} msg_svc_restart;

td_err msg_pack_svc_restart(msg_buf *out, uint64_t request_id, const msg_svc_restart *m);
td_err msg_unpack_svc_restart(const void *buf, size_t len, uint64_t *request_id,
                              msg_svc_restart *out);

#endif
