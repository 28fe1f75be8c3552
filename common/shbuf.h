/* shbuf: memory shared between tandem's processes (DESIGN section 2).
 *
 * A shared buffer is (name, generation, kind, size in bytes) plus a file descriptor. The
 * process that creates it exports a descriptor (the metadata, which the messages layer
 * carries over NNG) and an fd (which fdpass carries over AF_UNIX); a peer imports the two
 * and gets its own mapping. Every side, owner or importer, holds a reference: the memory
 * lives until the last one is released, so an importer keeps reading and writing after the
 * exporter has exited.
 *
 * Kinds:
 * - SHBUF_KIND_CPU: a memfd (memfd_create + ftruncate) mapped MAP_SHARED, sealed against
 *   shrinking and growing so no peer can truncate it under a mapping (which would turn
 *   reads into SIGBUS). Import refuses anything that is not a memfd sealed that way.
 * - SHBUF_KIND_CUDA: a CUDA VMM allocation (cuMemCreate with a POSIX fd handle, rounded up
 *   to the allocation granularity), mapped read/write on the device whose UUID the
 *   descriptor names. Without CUDA this kind is TD_ENOTSUP.
 *
 * Calls on the cuda kind (and on events) make the buffer's device primary context current on
 * the calling thread, as driver calls act on the current context.
 *
 * Ordering: nothing orders one process's GPU work before another's reads. Send "ready" only
 * after the producer's stream has finished (synchronise) or after recording a shbuf_event
 * that the consumer waits on. */
#ifndef TANDEM_COMMON_SHBUF_H
#define TANDEM_COMMON_SHBUF_H

#include <stdint.h>

#include "common/cudrv.h"
#include "common/err.h"

typedef enum shbuf_kind {
    SHBUF_KIND_CPU = 1,
    SHBUF_KIND_CUDA = 2,
} shbuf_kind;

#define SHBUF_NAME_MAX 64 /* bytes of a name, including the terminating NUL */

/* What a peer needs, next to the fd, to import a buffer. Plain data: every field is checked
 * again by shbuf_import, since it comes from another process. */
typedef struct shbuf_desc {
    char name[SHBUF_NAME_MAX];             /* NUL-terminated, non-empty */
    uint64_t generation;                   /* grows each time a buffer is created (also
                                            * across restarts), so a stale one is told apart */
    uint32_t kind;                         /* shbuf_kind */
    uint64_t size;                         /* bytes usable by both sides */
    uint8_t device_uuid[CUDRV_UUID_BYTES]; /* cuda kind: the GPU holding it; zero for cpu */
} shbuf_desc;

typedef struct shbuf shbuf;

/* Creates a buffer of size bytes (zero-filled). dev names the GPU for the cuda kind and must
 * be NULL for the cpu kind. The buffer keeps its own reference to the device's context, so
 * dev may be closed before the buffer is released. */
td_err shbuf_create(shbuf **out, shbuf_kind kind, const char *name, uint64_t size,
                    const cudrv_device *dev);

/* Fills desc and returns a new close-on-exec fd for one peer; the caller closes *fd after
 * sending it. Works on imported buffers too (they can be passed on). */
td_err shbuf_export(const shbuf *sb, shbuf_desc *desc, int *fd);

/* Maps a buffer a peer exported. fd stays owned by the caller (close it once this returns).
 * TD_EFORMAT for a malformed descriptor, TD_EINVAL for an fd that is not what the
 * descriptor says (not a sealed memfd, smaller than size, not a CUDA allocation), TD_ENOENT
 * when the named GPU is not visible, TD_ENOTSUP for the cuda kind without CUDA. */
td_err shbuf_import(shbuf **out, const shbuf_desc *desc, int fd);

/* Unmaps and drops this process's reference; NULL is fine. */
void shbuf_release(shbuf *sb);

const shbuf_desc *shbuf_info(const shbuf *sb);
uint64_t shbuf_size(const shbuf *sb); /* bytes */

/* cpu kind: the mapping (NULL for the cuda kind). */
void *shbuf_host(const shbuf *sb);

/* cuda kind: the CUdeviceptr of the mapping, valid in the context of the device the buffer
 * lives on (0 for the cpu kind). */
uint64_t shbuf_devptr(const shbuf *sb);

/* ---- interprocess CUDA events: cross-process ordering of GPU work ----
 * The producer creates an event and exports its handle once; the consumer imports it. Per
 * step: the producer records it on the stream that wrote the data, then says "ready"; the
 * consumer makes its stream wait on it (GPU-side) or synchronises on it (host-side). The
 * creating process must keep the event until every importer has released it. */

#define SHBUF_EVENT_HANDLE_BYTES 64 /* CU_IPC_HANDLE_SIZE */

typedef struct shbuf_event_desc {
    uint8_t handle[SHBUF_EVENT_HANDLE_BYTES]; /* CUipcEventHandle bytes */
    uint8_t device_uuid[CUDRV_UUID_BYTES];    /* the GPU the event belongs to */
} shbuf_event_desc;

typedef struct shbuf_event shbuf_event;

td_err shbuf_event_create(shbuf_event **out, const cudrv_device *dev);
td_err shbuf_event_export(const shbuf_event *ev, shbuf_event_desc *desc);
td_err shbuf_event_import(shbuf_event **out, const shbuf_event_desc *desc);

/* stream is a CUstream (== cudaStream_t); NULL means the legacy default stream. */
td_err shbuf_event_record(shbuf_event *ev, void *stream);
/* Makes stream wait, on the GPU, for the work before the latest record. */
td_err shbuf_event_wait(shbuf_event *ev, void *stream);
/* Blocks the calling thread until the work before the latest record has finished. */
td_err shbuf_event_sync(shbuf_event *ev);

void shbuf_event_release(shbuf_event *ev);

#endif
