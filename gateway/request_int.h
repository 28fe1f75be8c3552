/* What the parts of the request parser share (request.c, request_chat.c, request_format.c):
 * the typed-field readers and each part's entry. Private to them. */
#ifndef TANDEM_GATEWAY_REQUEST_INT_H
#define TANDEM_GATEWAY_REQUEST_INT_H

#include "gateway/request.h"

/* 400 invalid_type: "Invalid type for 'param': expected ..., but got ... instead." */
td_err req_bad_type(api_error *e, const char *param, const char *expected, const json_t *v);

/* --- typed fields: absent or null keeps the default --------------------------------------- */

/* obj's key, or NULL when absent or null. */
const json_t *req_field(const json_t *obj, const char *key);
td_err req_bool(const json_t *obj, const char *key, const char *param, bool *out,
                api_error *e);
/* Integers, and numbers with an integral value (2.0) as JavaScript clients send them, in
 * [lo, hi]; *given tells whether the field was there (given may be NULL). */
td_err req_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
               bool *given, api_error *e);
/* A number in [lo, hi], or in (lo, hi] when lo_open. */
td_err req_number(const json_t *obj, const char *key, double lo, bool lo_open, double hi,
                  double *out, api_error *e);
/* A JSON integer in [0, max] (a token id), into *out. */
bool req_token_id(const json_t *v, json_int_t max, uint32_t *out);

/* Text given as a string or as an array of text parts ({"type": "text", "text": ...}), the
 * parts joined with sep; base names the field in errors. *out: a JSON string. */
td_err req_text_parts(const json_t *c, const char *base, const char *sep, json_t **out,
                      api_error *e);

/* A reasoning effort (OpenAI's: none, minimal, low, medium, high, xhigh); 400 naming param
 * otherwise. */
td_err req_effort(const json_t *v, const char *param, api_error *e);

/* --- the parts --------------------------------------------------------------------------- */

/* A chat or completion body already loaded (root: its reference is taken) into r, which is
 * zeroed but for responses and resp; on failure r is freed. */
td_err req_parse_root(gw_request *r, req_kind kind, json_t *root, api_error *e);

/* request_chat.c: messages, tools, tool_choice, the template's arguments. */
td_err req_chat(gw_request *r, api_error *e);

/* request_format.c: response_format, then vLLM's guided fields (one way of asking at most). */
td_err req_response_format(gw_request *r, api_error *e);
td_err req_guided(gw_request *r, api_error *e);

#endif
