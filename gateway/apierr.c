#include "gateway/apierr.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

static const char *apierr_type(int status)
{
    if (status == 401)
        return "authentication_error";
    if (status >= 500)
        return "server_error";
    return "invalid_request_error";
}

td_err apierr_set(api_error *e, int status, const char *code, const char *param, const char *fmt,
                  ...)
{
    e->status = status;
    e->type = apierr_type(status);
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    if (status >= 400 && status < 500)
        return TD_EINVAL;
    return status == 503 ? TD_EBUSY : TD_EIO;
}

/* A JSON string of text that may have been cut inside a UTF-8 character by vsnprintf, or may
 * quote a client's bytes: invalid sequences become '?' so the body is always valid JSON. */
static json_t *apierr_string(const char *text)
{
    json_t *s = json_string(text);
    if (s)
        return s;
    size_t n = strlen(text);
    char *copy = malloc(n + 1);
    if (!copy)
        return NULL;
    for (size_t i = 0; i <= n; i++)
        copy[i] = (unsigned char)text[i] >= 0x80 ? '?' : text[i];
    s = json_string(copy);
    free(copy);
    return s;
}

char *apierr_render(const api_error *e)
{
    json_t *inner = json_object();
    json_t *root = json_object();
    if (!inner || !root) {
        json_decref(inner);
        json_decref(root);
        return NULL;
    }
    json_object_set_new(inner, "message", apierr_string(e->message));
    json_object_set_new(inner, "type", json_string(e->type ? e->type : apierr_type(e->status)));
    json_object_set_new(inner, "param", e->param[0] ? apierr_string(e->param) : json_null());
    json_object_set_new(inner, "code", e->code ? json_string(e->code) : json_null());
    json_object_set_new(root, "error", inner);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}
