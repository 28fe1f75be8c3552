/* Shared by the message tests: one valid struct of each type, an exact-size copy helper, and
 * unpack-by-type (so a test can loop over every type). */
#ifndef TANDEM_TESTS_SUPPORT_MSG_FIXTURE_H
#define TANDEM_TESTS_SUPPORT_MSG_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "common/msg.h"

extern const uint32_t msg_fixture_prompt[7]; /* gen_start prompt token ids */
extern const uint32_t msg_fixture_stop[2];   /* gen_start stop token ids */
extern const uint32_t msg_fixture_bias_tok[3]; /* gen_start logit bias: token ids */
extern const float msg_fixture_bias[3];        /* and their biases */
extern const char msg_fixture_schema[];        /* gen_start's JSON Schema */
extern const uint32_t msg_fixture_tokens[4]; /* gen_event token ids */
extern const uint32_t msg_fixture_taps[3];   /* kv_attach tap layer ids */

msg_hello msg_fixture_hello(void);
msg_shbuf_announce msg_fixture_shbuf(void);
msg_gen_start msg_fixture_gen_start(void);
msg_gen_event msg_fixture_gen_event(msg_event_kind kind);
/* A token event of the fixture tokens, each with a log probability and two alternatives. */
msg_gen_event msg_fixture_gen_event_logprobs(void);
msg_status msg_fixture_status(void);
msg_propose msg_fixture_propose(void);
/* Three draft tokens; with_q adds their sparse distributions (ids 3, 70, 511 ...). */
msg_proposal msg_fixture_proposal(int with_q);
msg_kv_attach msg_fixture_kv_attach(void);
msg_kv_pools msg_fixture_kv_pools(void);
msg_svc_list msg_fixture_svc_list(void);
msg_svc_restart msg_fixture_svc_restart(void);

/* A malloc'd copy of exactly n bytes, so ASan flags a read past the end. */
uint8_t *msg_fixture_copy(const void *p, size_t n);

/* Unpacks bytes with the unpack function of the given type and frees what it allocated. */
td_err msg_fixture_unpack_as(msg_type type, const uint8_t *buf, size_t len);

/* Packs one fixture of every type into bufs[type] (bufs[0] stays empty); request ids are
 * 1000 + type. Free each with msg_buf_free. */
td_err msg_fixture_pack_all(msg_buf bufs[MSG_TYPE_END]);

#endif
