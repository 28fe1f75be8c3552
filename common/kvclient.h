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

/* Names of the buffers kv_pools hands out (msg_kv_pools). */
#define KVC_POOL_TARGET "kvd.target"          /* target pool */
#define KVC_POOL_DRAFT "kvd.draft"            /* draft pool (draftd) */
#define KVC_POOL_Q "kvd.q"                    /* proposal pool */
#define KVC_HEAD_EMBD "verifyd.tok_embd"      /* the target's token embedding (GPU) */
#define KVC_HEAD_OUTPUT "verifyd.output"      /* the target's LM head (GPU; absent if tied) */

/* Pools of either kind: memory of the pools' device (host memory for the cpu kind, device
 * memory for the cuda kind). A GPU process must run on the device the pools live on. */
typedef struct kvc {
    int fd;             /* connection to kvd's fd socket; -1 when detached */
    kvl_layout lay;     /* offsets inside a slot, from kvd's parameters */
    shbuf *target;      /* the target pool, [slots][lay.target_slot] bytes */
    shbuf *draft;       /* the draft pool, [slots][lay.draft_slot] bytes; NULL when none */
    shbuf *q;           /* the proposal pool, lay.q_bytes; NULL when none */
    shbuf *embd;        /* verifyd's token embedding, [n_vocab][row bytes]; NULL when none */
    shbuf *output;      /* verifyd's LM head; NULL when none (or tied to embd) */
    uint64_t target_gen; /* generation of the mapped target pool */
    uint64_t draft_gen;  /* generation of the mapped draft pool (0 when none) */
    uint64_t q_gen;      /* generation of the mapped proposal pool (0 when none) */
} kvc;

/* An empty, detached client. */
void kvc_init(kvc *c);

/* Attaches (detaching first when attached). fd_path is kvd's fd socket (fdpass_path). kvd's
 * error replies come back as their code and message; TD_ENOENT when no kvd listens. */
td_err kvc_attach(kvc *c, const char *fd_path, const msg_kv_attach *req, int timeout_ms);
/* The same, sending fds[n_fds] (req->heads, in order) with the request; they stay the
 * caller's. */
td_err kvc_attach_fds(kvc *c, const char *fd_path, const msg_kv_attach *req, const int *fds,
                      size_t n_fds, int timeout_ms);

/* Releases the pools and closes the connection. */
void kvc_detach(kvc *c);

/* False once kvd has closed the connection (it exited) or when detached; never blocks. */
bool kvc_alive(kvc *c);

/* First byte of a buffer: the host mapping (cpu kind) or the device address (cuda kind). */
uint8_t *kvc_base(const shbuf *sb);

/* First byte of a slot in the target (resp. draft) pool, memory of the pools' kind. */
uint8_t *kvc_target_slot(const kvc *c, uint32_t slot);
uint8_t *kvc_draft_slot(const kvc *c, uint32_t slot);

/* The pools' kind (SHBUF_KIND_CPU or SHBUF_KIND_CUDA) and, for cuda, the GPU's UUID; asserts
 * the client is attached. */
shbuf_kind kvc_kind(const kvc *c);
const uint8_t *kvc_device_uuid(const kvc *c);

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
