/* The little protocol the shared-buffer tests speak between a parent and a child process over
 * an fdpass socket: a fixed-size message (a text, a buffer descriptor, an event descriptor)
 * with at most one fd beside it, and the byte pattern both sides write and check. */
#ifndef TANDEM_TESTS_SUPPORT_SHBUF_WIRE_H
#define TANDEM_TESTS_SUPPORT_SHBUF_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/shbuf.h"

typedef struct sw_msg {
    char text[256];         /* "ok", a command, or "fail: <why>" */
    shbuf_desc desc;        /* a buffer that travels with an fd */
    shbuf_event_desc event; /* an interprocess event handle */
} sw_msg;

/* Sends text with the optional descriptors and fd (-1: none). */
td_err sw_send(int sock, const char *text, const shbuf_desc *desc, const shbuf_event_desc *event,
               int fd, int timeout_ms);

/* Receives one message; *fd = the descriptor that came with it, or -1. */
td_err sw_recv(int sock, sw_msg *w, int *fd, int timeout_ms);

/* Child side: reports "fail: what: <err_msg()>" to the parent and returns exit status 1. */
int sw_child_fail(int sock, const char *what, int timeout_ms);

/* Parent side: TD_OK when the child answered "ok" with no fd; else an error carrying its text. */
td_err sw_expect_ok(int sock, int timeout_ms);

/* Byte i of the test pattern for seed. */
uint8_t sw_pattern_byte(size_t i, unsigned seed);

#endif
