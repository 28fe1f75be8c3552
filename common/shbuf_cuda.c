/* Shared buffers, cuda kind (CUDA VMM allocations exported as POSIX fds), and the
 * interprocess CUDA events that order GPU work across processes. */
#include "common/shbuf_cuda.h"

#include "common/shbuf.h"

#ifndef TANDEM_HAVE_CUDA

static td_err shbuf_cuda_unsupported(void)
{
    return err_set(TD_ENOTSUP, "cuda shared buffers need a build of tandem with CUDA");
}

td_err shbuf_cuda_create(shbuf_cuda **out, uint64_t size, const cudrv_device *dev,
                         uint8_t uuid[CUDRV_UUID_BYTES])
{
    (void)size, (void)dev, (void)uuid;
    *out = NULL;
    return shbuf_cuda_unsupported();
}

td_err shbuf_cuda_export(const shbuf_cuda *m, int *fd)
{
    (void)m;
    *fd = -1;
    return shbuf_cuda_unsupported();
}

td_err shbuf_cuda_import(shbuf_cuda **out, uint64_t size, const uint8_t uuid[CUDRV_UUID_BYTES],
                         int fd)
{
    (void)size, (void)uuid, (void)fd;
    *out = NULL;
    return shbuf_cuda_unsupported();
}

uint64_t shbuf_cuda_devptr(const shbuf_cuda *m)
{
    (void)m;
    return 0;
}

void shbuf_cuda_release(shbuf_cuda *m)
{
    (void)m;
}

td_err shbuf_event_create(shbuf_event **out, const cudrv_device *dev)
{
    (void)dev;
    *out = NULL;
    return shbuf_cuda_unsupported();
}

td_err shbuf_event_export(const shbuf_event *ev, shbuf_event_desc *desc)
{
    (void)ev, (void)desc;
    return shbuf_cuda_unsupported();
}

td_err shbuf_event_import(shbuf_event **out, const shbuf_event_desc *desc)
{
    (void)desc;
    *out = NULL;
    return shbuf_cuda_unsupported();
}

td_err shbuf_event_record(shbuf_event *ev, void *stream)
{
    (void)ev, (void)stream;
    return shbuf_cuda_unsupported();
}

td_err shbuf_event_wait(shbuf_event *ev, void *stream)
{
    (void)ev, (void)stream;
    return shbuf_cuda_unsupported();
}

td_err shbuf_event_sync(shbuf_event *ev)
{
    (void)ev;
    return shbuf_cuda_unsupported();
}

void shbuf_event_release(shbuf_event *ev)
{
    (void)ev;
}

#else /* TANDEM_HAVE_CUDA */

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct shbuf_cuda {
    cudrv_device dev;                    /* holds a primary-context reference of its own */
    CUmemGenericAllocationHandle handle; /* this process's reference to the allocation */
    int have_handle;                     /* handle must be released */
    CUdeviceptr ptr;                     /* base of the reserved address range; 0 = none */
    int mapped;                          /* handle is mapped at ptr */
    size_t span;                         /* bytes: reserved and mapped (size rounded up to
                                          * the allocation granularity) */
    int import_fd;                       /* imported: our duplicate of the fd it came from
                                          * (the driver refuses to export an imported handle
                                          * again, so passing it on duplicates this); else -1 */
};

/* Device memory on dev, exportable as a POSIX fd. */
static CUmemAllocationProp shbuf_cuda_prop(const cudrv_device *dev)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev->ordinal;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
}

/* size rounded up to the minimum granularity; both sides compute it the same way. */
static td_err shbuf_cuda_span(const cudrv_device *dev, uint64_t size, size_t *span)
{
    const cudrv_api *api = cudrv_get();
    CUmemAllocationProp prop = shbuf_cuda_prop(dev);
    size_t gran = 0;
    TD_TRY(cudrv_check(api->cuMemGetAllocationGranularity(&gran, &prop,
                                                          CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                       "cuMemGetAllocationGranularity"));
    TD_ASSERT(gran > 0);
    if (size > SIZE_MAX - gran)
        return err_set(TD_ERANGE, "cuda shared buffer of %llu bytes is too large",
                       (unsigned long long)size);
    *span = (size_t)((size + gran - 1) / gran * gran);
    return TD_OK;
}

/* Reserves an address range, maps the allocation there and grants this device read/write
 * (VMM mappings start with no access at all). */
static td_err shbuf_cuda_map(shbuf_cuda *m)
{
    const cudrv_api *api = cudrv_get();
    CUdeviceptr ptr = 0;
    TD_TRY(cudrv_check(api->cuMemAddressReserve(&ptr, m->span, 0, 0, 0), "cuMemAddressReserve"));
    m->ptr = ptr;
    TD_TRY(cudrv_check(api->cuMemMap(m->ptr, m->span, 0, m->handle, 0), "cuMemMap"));
    m->mapped = 1;
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = m->dev.ordinal;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return cudrv_check(api->cuMemSetAccess(m->ptr, m->span, &access, 1), "cuMemSetAccess");
}

static td_err shbuf_cuda_supported(const cudrv_device *dev)
{
    const cudrv_api *api = cudrv_get();
    CUdevice d;
    int vmm = 0, posix_fd = 0;
    TD_TRY(cudrv_check(api->cuDeviceGet(&d, dev->ordinal), "cuDeviceGet"));
    TD_TRY(cudrv_check(api->cuDeviceGetAttribute(
                           &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d),
                       "cuDeviceGetAttribute"));
    TD_TRY(cudrv_check(api->cuDeviceGetAttribute(
                           &posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                           d),
                       "cuDeviceGetAttribute"));
    if (!vmm || !posix_fd)
        return err_set(TD_ENOTSUP, "GPU %d (%s) cannot share memory through POSIX fds "
                       "(virtual memory management %s, fd handles %s)", dev->ordinal, dev->name,
                       vmm ? "yes" : "no", posix_fd ? "yes" : "no");
    return TD_OK;
}

static shbuf_cuda *shbuf_cuda_alloc(void)
{
    shbuf_cuda *m = calloc(1, sizeof(shbuf_cuda));
    if (m)
        m->import_fd = -1;
    return m;
}

td_err shbuf_cuda_create(shbuf_cuda **out, uint64_t size, const cudrv_device *dev,
                         uint8_t uuid[CUDRV_UUID_BYTES])
{
    *out = NULL;
    TD_TRY(cudrv_load());
    shbuf_cuda *m = shbuf_cuda_alloc();
    if (!m)
        return err_set(TD_ENOMEM, "cuda shared buffer: out of host memory");
    const cudrv_api *api = cudrv_get();
    td_err e = cudrv_device_open_ordinal(&m->dev, dev->ordinal);
    if (e == TD_OK)
        e = cudrv_device_bind(&m->dev);
    if (e == TD_OK)
        e = shbuf_cuda_supported(&m->dev);
    if (e == TD_OK)
        e = shbuf_cuda_span(&m->dev, size, &m->span);
    if (e == TD_OK) {
        CUmemAllocationProp prop = shbuf_cuda_prop(&m->dev);
        e = cudrv_check(api->cuMemCreate(&m->handle, m->span, &prop, 0), "cuMemCreate");
        m->have_handle = e == TD_OK;
    }
    if (e == TD_OK)
        e = shbuf_cuda_map(m);
    /* Zero it (as a memfd is) and finish before anyone else can see it. */
    if (e == TD_OK)
        e = cudrv_check(api->cuMemsetD8_v2(m->ptr, 0, m->span), "cuMemsetD8");
    if (e == TD_OK)
        e = cudrv_check(api->cuCtxSynchronize(), "cuCtxSynchronize");
    if (e != TD_OK) {
        e = err_wrap(e, "cuda shared buffer of %llu bytes on GPU %d", (unsigned long long)size,
                     dev->ordinal);
        shbuf_cuda_release(m);
        return e;
    }
    memcpy(uuid, m->dev.uuid, CUDRV_UUID_BYTES);
    *out = m;
    return TD_OK;
}

td_err shbuf_cuda_export(const shbuf_cuda *m, int *fd)
{
    *fd = -1;
    if (m->import_fd >= 0) {
        int h = fcntl(m->import_fd, F_DUPFD_CLOEXEC, 0);
        if (h < 0)
            return err_set(TD_EIO, "cuda shared buffer export: dup: %s", strerror(errno));
        *fd = h;
        return TD_OK;
    }
    const cudrv_api *api = cudrv_get();
    TD_TRY(cudrv_device_bind(&m->dev));
    int h = -1;
    TD_TRY(cudrv_check(api->cuMemExportToShareableHandle(
                           &h, m->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                       "cuMemExportToShareableHandle"));
    /* The driver's fd is not close-on-exec; a child exec'ed meanwhile would keep the GPU
     * memory alive. */
    if (fcntl(h, F_SETFD, FD_CLOEXEC) != 0) {
        int e = errno;
        close(h);
        return err_set(TD_EIO, "cuda shared buffer export: fcntl: %s", strerror(e));
    }
    *fd = h;
    return TD_OK;
}

td_err shbuf_cuda_import(shbuf_cuda **out, uint64_t size, const uint8_t uuid[CUDRV_UUID_BYTES],
                         int fd)
{
    *out = NULL;
    TD_TRY(cudrv_load());
    shbuf_cuda *m = shbuf_cuda_alloc();
    if (!m)
        return err_set(TD_ENOMEM, "cuda shared buffer: out of host memory");
    const cudrv_api *api = cudrv_get();
    td_err e = cudrv_device_open_uuid(&m->dev, uuid);
    if (e == TD_OK)
        e = cudrv_device_bind(&m->dev);
    if (e == TD_OK)
        e = shbuf_cuda_span(&m->dev, size, &m->span);
    if (e == TD_OK) {
        e = cudrv_check(api->cuMemImportFromShareableHandle(
                            &m->handle, (void *)(uintptr_t)fd,
                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                        "cuMemImportFromShareableHandle");
        m->have_handle = e == TD_OK;
        if (e != TD_OK)
            e = err_wrap(TD_EINVAL, "fd %d is not a CUDA allocation", fd);
    }
    if (e == TD_OK) {
        m->import_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (m->import_fd < 0)
            e = err_set(TD_EIO, "cuda shared buffer import: dup: %s", strerror(errno));
    }
    if (e == TD_OK) {
        e = shbuf_cuda_map(m);
        if (e != TD_OK)
            e = err_wrap(TD_EINVAL, "mapping %zu bytes (descriptor: %llu) of the imported "
                         "allocation; is it smaller than the descriptor says?",
                         m->span, (unsigned long long)size);
    }
    if (e != TD_OK) {
        char s[CUDRV_UUID_STR_LEN];
        cudrv_uuid_format(uuid, s);
        e = err_wrap(e, "importing cuda shared buffer on %s", s);
        shbuf_cuda_release(m);
        return e;
    }
    *out = m;
    return TD_OK;
}

uint64_t shbuf_cuda_devptr(const shbuf_cuda *m)
{
    return (uint64_t)m->ptr;
}

void shbuf_cuda_release(shbuf_cuda *m)
{
    if (!m)
        return;
    if (m->dev.ctx) {
        const cudrv_api *api = cudrv_get();
        /* Failures here leave nothing to do but report: the allocation is freed once every
         * process has released it anyway. */
        cudrv_device_bind(&m->dev);
        if (m->mapped)
            api->cuMemUnmap(m->ptr, m->span);
        if (m->ptr)
            api->cuMemAddressFree(m->ptr, m->span);
        if (m->have_handle)
            api->cuMemRelease(m->handle);
        cudrv_device_close(&m->dev);
    }
    if (m->import_fd >= 0)
        close(m->import_fd);
    free(m);
}

/* ---- interprocess events ---- */

struct shbuf_event {
    cudrv_device dev; /* holds a primary-context reference of its own */
    CUevent event;    /* created here (owner) or opened from a peer's handle */
};

/* Keeps *out when opened is TD_OK, frees it otherwise. */
static td_err shbuf_event_finish(shbuf_event **out, td_err opened)
{
    shbuf_event *ev = *out;
    if (opened == TD_OK)
        return TD_OK;
    cudrv_device_close(&ev->dev);
    free(ev);
    *out = NULL;
    return opened;
}

td_err shbuf_event_create(shbuf_event **out, const cudrv_device *dev)
{
    TD_ASSERT(out && dev);
    *out = NULL;
    TD_TRY(cudrv_load());
    shbuf_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return err_set(TD_ENOMEM, "cuda event: out of host memory");
    *out = ev;
    td_err e = cudrv_device_open_ordinal(&ev->dev, dev->ordinal);
    if (e == TD_OK)
        e = cudrv_device_bind(&ev->dev);
    /* Interprocess events must not record timing. */
    if (e == TD_OK)
        e = cudrv_check(cudrv_get()->cuEventCreate(&ev->event, CU_EVENT_INTERPROCESS |
                                                                   CU_EVENT_DISABLE_TIMING),
                        "cuEventCreate");
    return shbuf_event_finish(out, e);
}

td_err shbuf_event_export(const shbuf_event *ev, shbuf_event_desc *desc)
{
    TD_ASSERT(ev && desc);
    TD_TRY(cudrv_device_bind(&ev->dev));
    CUipcEventHandle h;
    TD_TRY(cudrv_check(cudrv_get()->cuIpcGetEventHandle(&h, ev->event), "cuIpcGetEventHandle"));
    _Static_assert(sizeof h.reserved == SHBUF_EVENT_HANDLE_BYTES, "CUipcEventHandle size");
    memcpy(desc->handle, h.reserved, SHBUF_EVENT_HANDLE_BYTES);
    memcpy(desc->device_uuid, ev->dev.uuid, CUDRV_UUID_BYTES);
    return TD_OK;
}

td_err shbuf_event_import(shbuf_event **out, const shbuf_event_desc *desc)
{
    TD_ASSERT(out && desc);
    *out = NULL;
    TD_TRY(cudrv_load());
    shbuf_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return err_set(TD_ENOMEM, "cuda event: out of host memory");
    *out = ev;
    td_err e = cudrv_device_open_uuid(&ev->dev, desc->device_uuid);
    if (e == TD_OK)
        e = cudrv_device_bind(&ev->dev);
    if (e == TD_OK) {
        CUipcEventHandle h;
        memcpy(h.reserved, desc->handle, SHBUF_EVENT_HANDLE_BYTES);
        e = cudrv_check(cudrv_get()->cuIpcOpenEventHandle(&ev->event, h), "cuIpcOpenEventHandle");
        if (e != TD_OK)
            e = err_wrap(TD_EINVAL, "importing cuda event");
    }
    return shbuf_event_finish(out, e);
}

td_err shbuf_event_record(shbuf_event *ev, void *stream)
{
    TD_ASSERT(ev);
    TD_TRY(cudrv_device_bind(&ev->dev));
    return cudrv_check(cudrv_get()->cuEventRecord(ev->event, (CUstream)stream), "cuEventRecord");
}

td_err shbuf_event_wait(shbuf_event *ev, void *stream)
{
    TD_ASSERT(ev);
    TD_TRY(cudrv_device_bind(&ev->dev));
    return cudrv_check(cudrv_get()->cuStreamWaitEvent((CUstream)stream, ev->event, 0),
                       "cuStreamWaitEvent");
}

td_err shbuf_event_sync(shbuf_event *ev)
{
    TD_ASSERT(ev);
    TD_TRY(cudrv_device_bind(&ev->dev));
    return cudrv_check(cudrv_get()->cuEventSynchronize(ev->event), "cuEventSynchronize");
}

void shbuf_event_release(shbuf_event *ev)
{
    if (!ev)
        return;
    if (ev->event && cudrv_device_bind(&ev->dev) == TD_OK)
        cudrv_get()->cuEventDestroy_v2(ev->event);
    cudrv_device_close(&ev->dev);
    free(ev);
}

#endif /* TANDEM_HAVE_CUDA */
