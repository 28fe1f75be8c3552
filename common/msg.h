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

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define MSG_PROTOCOL_VERSION 1

/* Field limits (bytes for strings and bins, items for arrays). */
#define MSG_BUILD_ID_MAX 64          /* hello.build_id */
#define MSG_PING_DATA_MAX (1u << 20) /* ping/pong.data */
#define MSG_ERROR_MAX 1023           /* error message (err_msg() holds 1023 + NUL) */
#define MSG_NAME_MAX 63              /* shared buffer name */
#define MSG_UUID_MAX 63              /* device UUID string, "GPU-8f3c...-..." is 40 */
#define MSG_PROMPT_MAX (1u << 18)    /* gen_start prompt tokens (262144: the models' context) */
#define MSG_STOP_MAX 64              /* gen_start stop token ids */
#define MSG_EVENT_TOKENS_MAX 256     /* gen_event tokens (a step commits at most 16) */

/* Wire numbers: never renumber, only append. */
typedef enum msg_type {
    MSG_HELLO = 1,
    MSG_PING = 2,
    MSG_PONG = 3,
    MSG_ERROR = 4,
    MSG_SHBUF_ANNOUNCE = 5,
    MSG_GEN_START = 6,
    MSG_GEN_EVENT = 7,
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

typedef struct msg_gen_start {
    uint64_t seq_id;        /* sequence this generation runs in */
    const uint32_t *prompt; /* [n_prompt] token ids */
    uint32_t n_prompt;      /* tokens, 1..MSG_PROMPT_MAX */
    uint32_t max_tokens;    /* new tokens at most, >= 1 */
    msg_sampler sampler;
    const uint32_t *stop;   /* [n_stop] token ids that end the generation */
    uint32_t n_stop;        /* tokens, 0..MSG_STOP_MAX */
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
} msg_usage;

/* Kind and fields agree: TOKEN has finish NONE; DONE has STOP, LENGTH or CANCEL; ERROR has
 * finish ERROR and a code other than TD_OK; only ERROR carries a code and message. */
typedef struct msg_gen_event {
    uint64_t seq_id;
    msg_event_kind kind;
    const uint32_t *tokens;          /* [n_tokens] committed token ids, in order */
    uint32_t n_tokens;               /* tokens, 0..MSG_EVENT_TOKENS_MAX */
    msg_finish finish;
    msg_usage usage;                 /* running totals */
    td_err code;                     /* ERROR: why; else TD_OK */
    char message[MSG_ERROR_MAX + 1]; /* ERROR: NUL-terminated text; else empty */
} msg_gen_event;

td_err msg_pack_gen_event(msg_buf *out, uint64_t request_id, const msg_gen_event *m);
td_err msg_unpack_gen_event(const void *buf, size_t len, uint64_t *request_id,
                            msg_gen_event *out);
void msg_free_gen_event(msg_gen_event *m);

#endif
