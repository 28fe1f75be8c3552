/* A gateway served over real HTTP on a free port, against the stand-in verifyd
 * (tests/support/fake_verifyd.h), for tests of exact bodies and streams: a small HTTP/1.0
 * client, the model's tokens and prompts computed apart from the gateway's code, and the
 * cmocka group setup and teardown. */
#ifndef TANDEM_TESTS_SUPPORT_GW_HARNESS_H
#define TANDEM_TESTS_SUPPORT_GW_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway/gateway.h"
#include "tests/support/fake_verifyd.h"

#define GWH_MODEL "tests/data/models/qwen35-tiny-f32.gguf"
#define GWH_N_CTX 1024 /* positions: room for the tools' system prompt, not for 60 words + 1000 */

extern gw_state gwh_g;          /* the gateway (its tokenizer, its config) */
extern fake_verifyd *gwh_fake;  /* the stand-in verifyd */

/* A connection to the gateway, a request on it, and its whole reply (*body points into
 * *reply; the status is returned). */
int gwh_connect(void);
void gwh_send(int fd, const char *method, const char *path, const char *headers,
              const char *body, size_t body_len);
int gwh_read(int fd, char **reply, char **body);
/* One request (body may be NULL) on a new connection: the status. */
int gwh_request(const char *method, const char *path, const char *headers, const char *body,
                char **reply, char **out_body);

/* Replaces the random parts of ids and the times: chatcmpl-<hex> -> chatcmpl-X, cmpl-<hex> ->
 * cmpl-X, "call_<hex>_ -> "call_X_, and the Responses API's "resp_, "rs_, "msg_, "fc_ likewise;
 * "created":<n> -> "created":0, and so "created_at" and "completed_at". */
void gwh_normalize(char *s);

/* text's tokens as the fake's whole output. */
void gwh_encode(const char *text, fake_script *s);
/* text's tokens with flags (TOK_ENC_*), into out [cap]. */
size_t gwh_tokens(const char *text, unsigned flags, uint32_t *out, size_t cap);
/* The prompt tokens of the messages (JSON), rendered independently of the gateway's code. */
size_t gwh_prompt(const char *messages_json, bool think_off, uint32_t *out);

/* Polls /health until it answers want (fails the test after 5 s). */
void gwh_wait_health(int want);
/* A new stand-in verifyd at the gateway's endpoints, answering hello with pid. */
td_err gwh_fake_start(uint32_t pid);

int gwh_setup(void **state);
int gwh_teardown(void **state);

#endif
