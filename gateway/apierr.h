/* The errors the HTTP API answers with: an HTTP status and OpenAI's error body,
 *
 *     {"error":{"message":"...","type":"invalid_request_error","param":"messages","code":null}}
 *
 * Every client mistake the gateway finds (bad JSON, a wrong type, an unknown model, a prompt
 * too long for the context) fills one api_error, so the message, the parameter it names and
 * the status are decided in one place and rendered the same way everywhere. */
#ifndef TANDEM_GATEWAY_APIERR_H
#define TANDEM_GATEWAY_APIERR_H

#include <stddef.h>

#include "common/err.h"

#define APIERR_MESSAGE_MAX 1024 /* bytes of message text, with the NUL */
#define APIERR_PARAM_MAX 96     /* bytes of the parameter path ("messages[3].content[0].type") */

typedef struct api_error {
    int status;                        /* HTTP status: 400, 401, 404, 405, 413, 500, 503 */
    const char *type;                  /* "invalid_request_error", "server_error", ... */
    const char *code;                  /* machine-readable code ("context_length_exceeded"), or NULL */
    char param[APIERR_PARAM_MAX];      /* the offending request field, "" for none (null) */
    char message[APIERR_MESSAGE_MAX];  /* what is wrong, for a person */
} api_error;

/* Fills e (type follows from the status: 4xx invalid_request_error, 401 authentication,
 * 5xx server_error) and returns TD_EINVAL for 4xx, TD_EBUSY for 503 and TD_EIO otherwise, so
 * a parser can write `return apierr_set(e, 400, NULL, "n", "...")`. param and code may be NULL. */
td_err apierr_set(api_error *e, int status, const char *code, const char *param, const char *fmt,
                  ...) __attribute__((format(printf, 5, 6)));

/* The JSON body of e as a malloc'd NUL-terminated string (NULL only when out of memory). */
char *apierr_render(const api_error *e);

#endif
