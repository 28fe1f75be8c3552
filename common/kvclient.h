/* kvclient: the verifyd/draftd side of kvd (pipeline contract, "Memory").
 *
 * Attach: connect to kvd's fd socket, send kv_attach, receive kv_pools with the pools' fds,
 * import them (common/shbuf.h) and compute the slot layout (common/kvlayout.h). The
 * connection stays open: kvd learns from its close that this process is gone, and this
 * process learns from its hang-up that kvd is gone (kvc_alive). Sequences are opened and
 * closed over kvd.ipc (bus) with kvc_open / kvc_close. */
#ifndef TANDEM_COMMON_KVCLIENT_H
#define TANDEM_COMMON_KVCLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/bus.h"
#include "common/err.h"
#include "common/kvlayout.h"
#include "common/msg.h"
#include "common/shbuf.h"

typedef struct kvc {
    int fd;             /* connection to kvd's fd socket; -1 when detached */
    kvl_layout lay;     /* offsets inside a slot, from kvd's parameters */
    shbuf *target;      /* the target pool, [slots][lay.target_slot] bytes */
    shbuf *draft;       /* the draft pool, [slots][lay.draft_slot] bytes; NULL when none */
    uint64_t target_gen; /* generation of the mapped target pool */
    uint64_t draft_gen;  /* generation of the mapped draft pool (0 when none) */
} kvc;

/* An empty, detached client. */
void kvc_init(kvc *c);

/* Attaches (detaching first when attached). fd_path is kvd's fd socket (fdpass_path). kvd's
 * error replies come back as their code and message; TD_ENOENT when no kvd listens. */
td_err kvc_attach(kvc *c, const char *fd_path, const msg_kv_attach *req, int timeout_ms);

/* Releases the pools and closes the connection. */
void kvc_detach(kvc *c);

/* False once kvd has closed the connection (it exited) or when detached; never blocks. */
bool kvc_alive(kvc *c);

/* First byte of a slot in the target (resp. draft) pool. */
uint8_t *kvc_target_slot(const kvc *c, uint32_t slot);
uint8_t *kvc_draft_slot(const kvc *c, uint32_t slot);

/* kv_open over kvd.ipc; kvd's error replies come back as their code and message. */
td_err kvc_open(bus_client *bus, uint64_t request_id, const msg_kv_open *req, msg_kv_slot *out,
                int timeout_ms);
/* kv_close over kvd.ipc. */
td_err kvc_close(bus_client *bus, uint64_t request_id, const msg_kv_close *req, int timeout_ms);

/* Turns an error reply into its code and message (TD_EPROTO when the reply is neither the
 * expected type nor an error). Shared by every client of the daemons. */
td_err kvc_reply_error(const msg_buf *reply, const char *what);

/* shbuf descriptor <-> the announcement that carries it in messages. */
void kvc_announce_from_desc(msg_shbuf_announce *a, const shbuf_desc *d);
td_err kvc_desc_from_announce(shbuf_desc *d, const msg_shbuf_announce *a);

#endif
