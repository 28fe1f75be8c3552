/* Fuzz target for message unpacking: every input goes to the envelope unpack and to every
 * per-type unpack. Beyond "no crash, no over-read", each accepted message must agree with its
 * envelope (type, request id) and have one canonical encoding: pack(unpack(x)) unpacks again
 * and packs to the same bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/msg.h"

#define FUZZ_CHECK(cond)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "fuzz_msg: %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond,         \
                    err_msg());                                                              \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

#define FREE_NOTHING(m) (void)(m)

/* Unpacks as one type; when accepted, checks the envelope agrees and the encoding is stable. */
#define FUZZ_TYPE(TYPE, STRUCT, NAME, FREE)                                                  \
    do {                                                                                     \
        STRUCT m1, m2;                                                                       \
        uint64_t rid1 = 0, rid2 = 0;                                                         \
        if (msg_unpack_##NAME(data, size, &rid1, &m1) == TD_OK) {                            \
            FUZZ_CHECK(hdr_ok && hdr.type == (TYPE) && hdr.request_id == rid1);              \
            FUZZ_CHECK(msg_pack_##NAME(&a, rid1, &m1) == TD_OK);                             \
            FUZZ_CHECK(msg_unpack_##NAME(a.data, a.len, &rid2, &m2) == TD_OK);               \
            FUZZ_CHECK(rid2 == rid1);                                                        \
            FUZZ_CHECK(msg_pack_##NAME(&b, rid2, &m2) == TD_OK);                             \
            FUZZ_CHECK(a.len == b.len && memcmp(a.data, b.data, a.len) == 0);                \
            FREE(&m2);                                                                       \
            FREE(&m1);                                                                       \
            accepted++;                                                                      \
        }                                                                                    \
    } while (0)

/* The same for a type without fields. */
#define FUZZ_EMPTY(TYPE, NAME)                                                               \
    do {                                                                                     \
        uint64_t rid1 = 0, rid2 = 0;                                                         \
        if (msg_unpack_##NAME(data, size, &rid1) == TD_OK) {                                 \
            FUZZ_CHECK(hdr_ok && hdr.type == (TYPE) && hdr.request_id == rid1);              \
            FUZZ_CHECK(msg_pack_##NAME(&a, rid1) == TD_OK);                                  \
            FUZZ_CHECK(msg_unpack_##NAME(a.data, a.len, &rid2) == TD_OK && rid2 == rid1);    \
            accepted++;                                                                      \
        }                                                                                    \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    msg_buf a, b;
    msg_buf_init(&a);
    msg_buf_init(&b);
    msg_header hdr;
    int hdr_ok = msg_unpack_header(data, size, &hdr) == TD_OK;
    int accepted = 0;

    FUZZ_TYPE(MSG_HELLO, msg_hello, hello, FREE_NOTHING);
    FUZZ_TYPE(MSG_PING, msg_ping, ping, FREE_NOTHING);
    FUZZ_TYPE(MSG_PONG, msg_ping, pong, FREE_NOTHING);
    FUZZ_TYPE(MSG_ERROR, msg_error, error, FREE_NOTHING);
    FUZZ_TYPE(MSG_SHBUF_ANNOUNCE, msg_shbuf_announce, shbuf_announce, FREE_NOTHING);
    FUZZ_TYPE(MSG_GEN_START, msg_gen_start, gen_start, msg_free_gen_start);
    FUZZ_TYPE(MSG_GEN_EVENT, msg_gen_event, gen_event, msg_free_gen_event);
    FUZZ_TYPE(MSG_GEN_CANCEL, msg_gen_cancel, gen_cancel, FREE_NOTHING);
    FUZZ_TYPE(MSG_ACK, msg_ack, ack, FREE_NOTHING);
    FUZZ_EMPTY(MSG_STATUS_GET, status_get);
    FUZZ_TYPE(MSG_STATUS, msg_status, status, FREE_NOTHING);
    FUZZ_TYPE(MSG_PROPOSE, msg_propose, propose, FREE_NOTHING);
    FUZZ_TYPE(MSG_PROPOSAL, msg_proposal, proposal, msg_free_proposal);
    FUZZ_TYPE(MSG_KV_ATTACH, msg_kv_attach, kv_attach, msg_free_kv_attach);
    FUZZ_TYPE(MSG_KV_POOLS, msg_kv_pools, kv_pools, FREE_NOTHING);
    FUZZ_TYPE(MSG_KV_OPEN, msg_kv_open, kv_open, msg_free_kv_open);
    FUZZ_TYPE(MSG_KV_SLOT, msg_kv_slot, kv_slot, FREE_NOTHING);
    FUZZ_TYPE(MSG_KV_CLOSE, msg_kv_close, kv_close, msg_free_kv_close);
    FUZZ_EMPTY(MSG_SVC_LIST_GET, svc_list_get);
    FUZZ_TYPE(MSG_SVC_LIST, msg_svc_list, svc_list, FREE_NOTHING);
    FUZZ_TYPE(MSG_SVC_RESTART, msg_svc_restart, svc_restart, FREE_NOTHING);

    /* a message is at most one type */
    FUZZ_CHECK(accepted <= 1);
    msg_buf_free(&a);
    msg_buf_free(&b);
    return 0;
}
