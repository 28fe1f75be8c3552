#include "common/err.h"

#include <stdarg.h>
#include <string.h>

static _Thread_local char err_buf[1024];

static const char *const err_names[TD_ERR_COUNT] = {
    [TD_OK] = "OK",           [TD_EINVAL] = "EINVAL",     [TD_EIO] = "EIO",
    [TD_ENOMEM] = "ENOMEM",   [TD_EFORMAT] = "EFORMAT",   [TD_ERANGE] = "ERANGE",
    [TD_ENOTSUP] = "ENOTSUP", [TD_ENOENT] = "ENOENT",     [TD_ETIMEOUT] = "ETIMEOUT",
    [TD_ECLOSED] = "ECLOSED", [TD_EPROTO] = "EPROTO",     [TD_EBUSY] = "EBUSY",
    [TD_ECUDA] = "ECUDA",     [TD_ECANCELED] = "ECANCELED",
};

const char *err_name(td_err code)
{
    if ((int)code < 0 || code >= TD_ERR_COUNT)
        return "EUNKNOWN";
    return err_names[code];
}

td_err err_set(td_err code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    return code;
}

td_err err_wrap(td_err code, const char *fmt, ...)
{
    char old[sizeof err_buf];
    memcpy(old, err_buf, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n + 2 >= sizeof err_buf)
        return code;
    /* "context: old message", cut to the buffer */
    size_t at = (size_t)n, room = sizeof err_buf - at - 1;
    size_t len = strnlen(old, sizeof old - 1);
    const char sep[] = ": ";
    size_t take = room < 2 ? room : 2;
    memcpy(err_buf + at, sep, take);
    at += take;
    room -= take;
    if (len > room)
        len = room;
    memcpy(err_buf + at, old, len);
    err_buf[at + len] = '\0';
    return code;
}

const char *err_msg(void)
{
    return err_buf;
}

void err_clear(void)
{
    err_buf[0] = '\0';
}
