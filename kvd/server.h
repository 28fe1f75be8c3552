/* kvd's state and request handling, apart from its main loop so tests and the daemon share
 * it: the pools (shared buffers laid out by common/kvlayout), the slot table, attach over the
 * fd socket, kv_open / kv_close / hello / ping over kvd.ipc, and reclaiming the slots of
 * processes that are gone. */
#ifndef TANDEM_KVD_SERVER_H
#define TANDEM_KVD_SERVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/kvlayout.h"
#include "common/msg.h"
#include "common/shbuf.h"
#include "kvd/slots.h"

#define KVD_CONNS_MAX 32 /* processes attached over the fd socket at once */
#define KVD_SLOTS_AUTO 16 /* slots without --slots: on the CPU; on a GPU at most, as fit */
/* Bytes of the GPU that sizing the pools leaves free besides the drafter's reserve: what the
 * services allocate after verifyd's attach (recorded CUDA graphs, per-stream scratch, the
 * MPS server) and the driver's rounding. */
#define KVD_GPU_MARGIN ((uint64_t)512 << 20)
#define KVD_DEDUP 64     /* kv_open replies remembered for retried request ids */

typedef struct kvd_conn {
    int fd;         /* accepted fd-socket connection; -1 = unused */
    uint32_t pid;   /* from its kv_attach; 0 before */
    msg_role role;  /* from its kv_attach */
} kvd_conn;

typedef struct kvd_dedup {
    uint32_t pid;
    uint64_t request_id;
    msg_kv_slot reply;
} kvd_dedup;

typedef struct kvd {
    pthread_mutex_t lock;     /* guards everything below but conns (the fd loop's alone) */
    uint32_t slots;           /* sequence slots of each pool (--slots; sized to the GPU) */
    bool slots_auto;          /* no --slots: on a GPU as many as fit, up to KVD_SLOTS_AUTO */
    uint64_t gpu_mem;         /* bytes of the GPU all services may use (0: all of it) */
    shbuf_kind kind;          /* the pools' kind: cpu, or cuda on dev (--device) */
    cudrv_device dev;         /* cuda: the GPU holding the pools */
    kvs_table table;
    kvl_params params;        /* current layout parameters (valid with target) */
    shbuf *target;            /* target pool, or NULL before verifyd's first attach */
    shbuf *draft;             /* draft pool, or NULL before draftd's first attach */
    shbuf *q;                 /* proposal pool (with target when the layout has one) */
    shbuf *heads[MSG_HEADS_MAX]; /* [n_heads] verifyd's token embedding and LM head (GPU),
                               * passed on to draftd */
    uint32_t n_heads;
    uint32_t taps[MSG_TAPS_MAX]; /* [n_taps] verifyd's tap layers: draftd's must match */
    uint32_t n_taps;
    kvd_dedup dedup[KVD_DEDUP];
    uint32_t dedup_next;
    kvd_conn conns[KVD_CONNS_MAX];
} kvd;

/* Pools of the cpu kind (dev NULL) or of the cuda kind on dev (kvd keeps its own reference
 * to the device). slots 0: KVD_SLOTS_AUTO on the CPU; on a GPU, sized at verifyd's attach to
 * the memory free then (less the drafter's reserve, KVD_GPU_MARGIN, and what gpu_mem leaves
 * out), up to KVD_SLOTS_AUTO. */
td_err kvd_init(kvd *k, uint32_t slots, uint64_t gpu_mem, const cudrv_device *dev);
void kvd_free(kvd *k);

/* The kvd.ipc handler (a bus_handler): user is the kvd. */
td_err kvd_handle(void *user, const uint8_t *req, size_t req_len, msg_buf *reply);

/* Answers one kv_attach read from an fd-socket connection, with in_fds[n_in] the fds that
 * came with it (verifyd's heads; they stay the caller's): the kv_pools reply and the fds to
 * send with it (*n_fds of them, at most MSG_POOLS_MAX; the caller closes them after
 * sending), or an error. */
td_err kvd_attach(kvd *k, const uint8_t *req, size_t len, const int *in_fds, size_t n_in,
                  msg_buf *reply, int *fds, size_t *n_fds, uint32_t *pid, msg_role *role);

/* Frees the slots of an owner that went away; returns how many. */
uint32_t kvd_reclaim_owner(kvd *k, uint32_t pid);

/* Frees the slots of owners that no longer exist (kill(pid, 0)); returns how many. */
uint32_t kvd_reclaim_dead(kvd *k);

#endif
