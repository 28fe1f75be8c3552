/* The shared-buffer tests' parent/child protocol (see shbuf_wire.h). */
#include "tests/support/shbuf_wire.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/fdpass.h"

td_err sw_send(int sock, const char *text, const shbuf_desc *desc, const shbuf_event_desc *event,
               int fd, int timeout_ms)
{
    sw_msg w;
    memset(&w, 0, sizeof w);
    snprintf(w.text, sizeof w.text, "%s", text);
    if (desc)
        w.desc = *desc;
    if (event)
        w.event = *event;
    return fdpass_send(sock, &w, sizeof w, &fd, fd >= 0 ? 1 : 0, timeout_ms);
}

td_err sw_recv(int sock, sw_msg *w, int *fd, int timeout_ms)
{
    size_t len = 0, n = 0;
    *fd = -1;
    TD_TRY(fdpass_recv(sock, w, sizeof *w, &len, fd, 1, &n, timeout_ms));
    if (len != sizeof *w) {
        if (n)
            close(*fd);
        *fd = -1;
        return err_set(TD_EPROTO, "short test message (%zu bytes)", len);
    }
    w->text[sizeof w->text - 1] = '\0';
    if (!n)
        *fd = -1;
    return TD_OK;
}

int sw_child_fail(int sock, const char *what, int timeout_ms)
{
    char text[256];
    snprintf(text, sizeof text, "fail: %s: %s", what, err_msg());
    fprintf(stderr, "child: %s\n", text);
    sw_send(sock, text, NULL, NULL, -1, timeout_ms);
    return 1;
}

td_err sw_expect_ok(int sock, int timeout_ms)
{
    sw_msg w;
    int fd;
    TD_TRY(sw_recv(sock, &w, &fd, timeout_ms));
    if (fd >= 0) {
        close(fd);
        return err_set(TD_EPROTO, "the child's answer came with an fd");
    }
    if (strcmp(w.text, "ok") != 0)
        return err_set(TD_EPROTO, "the child answered '%s'", w.text);
    return TD_OK;
}

uint8_t sw_pattern_byte(size_t i, unsigned seed)
{
    return (uint8_t)(i * 131u + seed * 29u + (i >> 9) * 7u + (seed << 4));
}
