/* Shared buffers: the common part and the cpu kind (memfd). The cuda kind and the
 * interprocess events are in shbuf_cuda.c. */
#include "common/shbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/shbuf_cuda.h"

struct shbuf {
    shbuf_desc desc;  /* name, generation, kind, size (bytes), device UUID */
    int fd;           /* cpu kind: the memfd, kept to export again; -1 for cuda */
    void *host;       /* cpu kind: MAP_SHARED mapping of desc.size bytes */
    shbuf_cuda *cuda; /* cuda kind: allocation and its device mapping */
};

/* Seals every cpu buffer carries: its size is fixed for life, so a mapping of desc.size bytes
 * can never run past the end of the file (which would make accesses SIGBUS). */
#define SHBUF_SEALS (F_SEAL_SHRINK | F_SEAL_GROW)
#define SHBUF_MEMFD_PREFIX "tandem:"

static _Atomic uint64_t shbuf_last_generation;

/* Nanoseconds since the epoch, or one more than the last generation handed out: ordered
 * within a process and, as long as the clock does not step back, across restarts. */
static uint64_t shbuf_generation_next(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    uint64_t last = atomic_load(&shbuf_last_generation);
    for (;;) {
        uint64_t next = now > last ? now : last + 1;
        if (atomic_compare_exchange_weak(&shbuf_last_generation, &last, next))
            return next;
    }
}

/* Names go into memfd names, logs and messages: keep them short and plain. */
static int shbuf_name_ok(const char *name, size_t cap)
{
    size_t n = strnlen(name, cap);
    if (n == 0 || n >= cap)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.' || c == ':'))
            return 0;
    }
    return 1;
}

static td_err shbuf_cpu_map(shbuf *sb)
{
    void *p = mmap(NULL, (size_t)sb->desc.size, PROT_READ | PROT_WRITE, MAP_SHARED, sb->fd, 0);
    if (p == MAP_FAILED)
        return err_set(errno == ENOMEM ? TD_ENOMEM : TD_EIO,
                       "shared buffer %s: mmap of %llu bytes: %s", sb->desc.name,
                       (unsigned long long)sb->desc.size, strerror(errno));
    sb->host = p;
    return TD_OK;
}

static td_err shbuf_cpu_create(shbuf *sb)
{
    char mname[sizeof SHBUF_MEMFD_PREFIX + SHBUF_NAME_MAX];
    snprintf(mname, sizeof mname, SHBUF_MEMFD_PREFIX "%s", sb->desc.name);
    sb->fd = memfd_create(mname, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (sb->fd < 0)
        return err_set(TD_EIO, "shared buffer %s: memfd_create: %s", sb->desc.name,
                       strerror(errno));
    if (ftruncate(sb->fd, (off_t)sb->desc.size) != 0)
        return err_set(errno == ENOSPC || errno == EFBIG ? TD_ENOMEM : TD_EIO,
                       "shared buffer %s: ftruncate to %llu bytes: %s", sb->desc.name,
                       (unsigned long long)sb->desc.size, strerror(errno));
    /* F_SEAL_SEAL too: a peer must not add F_SEAL_FUTURE_WRITE and break later imports. */
    if (fcntl(sb->fd, F_ADD_SEALS, SHBUF_SEALS | F_SEAL_SEAL) != 0)
        return err_set(TD_EIO, "shared buffer %s: sealing: %s", sb->desc.name, strerror(errno));
    return shbuf_cpu_map(sb);
}

/* Checks that fd is the memfd this descriptor describes before mapping it. */
static td_err shbuf_cpu_import(shbuf *sb, int fd)
{
    const char *name = sb->desc.name;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return err_set(TD_EINVAL, "shared buffer %s: fd %d: %s", name, fd, strerror(errno));
    char link[64], target[256];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    char want[sizeof "/memfd:" SHBUF_MEMFD_PREFIX + SHBUF_NAME_MAX + sizeof " (deleted)"];
    snprintf(want, sizeof want, "/memfd:" SHBUF_MEMFD_PREFIX "%s (deleted)", name);
    if (!S_ISREG(st.st_mode) || strncmp(target, "/memfd:", 7) != 0)
        return err_set(TD_EINVAL, "shared buffer %s: fd is not a memfd (%s)", name,
                       n > 0 ? target : "unknown file");
    if (strcmp(target, want) != 0)
        return err_set(TD_EINVAL, "shared buffer %s: fd is %s, not this buffer's memfd", name,
                       target);
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & SHBUF_SEALS) != SHBUF_SEALS)
        return err_set(TD_EINVAL, "shared buffer %s: memfd is not sealed against resizing "
                       "(seals 0x%x); a peer could truncate it under the mapping", name,
                       seals < 0 ? 0 : (unsigned)seals);
    if ((uint64_t)st.st_size != sb->desc.size)
        return err_set(TD_EINVAL, "shared buffer %s: memfd holds %llu bytes, descriptor says "
                       "%llu", name, (unsigned long long)st.st_size,
                       (unsigned long long)sb->desc.size);
    sb->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (sb->fd < 0)
        return err_set(TD_EIO, "shared buffer %s: dup: %s", name, strerror(errno));
    return shbuf_cpu_map(sb);
}

static shbuf *shbuf_alloc(void)
{
    shbuf *sb = calloc(1, sizeof *sb);
    if (sb)
        sb->fd = -1;
    return sb;
}

td_err shbuf_create(shbuf **out, shbuf_kind kind, const char *name, uint64_t size,
                    const cudrv_device *dev)
{
    TD_ASSERT(out && name);
    TD_ASSERT((kind == SHBUF_KIND_CPU && !dev) || (kind == SHBUF_KIND_CUDA && dev));
    *out = NULL;
    if (!shbuf_name_ok(name, SHBUF_NAME_MAX))
        return err_set(TD_EINVAL, "shared buffer name \"%s\": 1..%d of [A-Za-z0-9._:-]", name,
                       SHBUF_NAME_MAX - 1);
    if (size == 0 || size > (uint64_t)PTRDIFF_MAX)
        return err_set(TD_EINVAL, "shared buffer %s: size %llu bytes is out of range", name,
                       (unsigned long long)size);
    shbuf *sb = shbuf_alloc();
    if (!sb)
        return err_set(TD_ENOMEM, "shared buffer %s: out of memory", name);
    memcpy(sb->desc.name, name, strlen(name) + 1);
    sb->desc.generation = shbuf_generation_next();
    sb->desc.kind = (uint32_t)kind;
    sb->desc.size = size;
    td_err e = kind == SHBUF_KIND_CPU
                   ? shbuf_cpu_create(sb)
                   : shbuf_cuda_create(&sb->cuda, size, dev, sb->desc.device_uuid);
    if (e != TD_OK) {
        shbuf_release(sb);
        return e;
    }
    *out = sb;
    return TD_OK;
}

td_err shbuf_export(const shbuf *sb, shbuf_desc *desc, int *fd)
{
    TD_ASSERT(sb && desc && fd);
    *fd = -1;
    if (sb->desc.kind == SHBUF_KIND_CPU) {
        *fd = fcntl(sb->fd, F_DUPFD_CLOEXEC, 0);
        if (*fd < 0)
            return err_set(TD_EIO, "shared buffer %s: dup: %s", sb->desc.name, strerror(errno));
    } else {
        TD_TRY(shbuf_cuda_export(sb->cuda, fd));
    }
    *desc = sb->desc;
    return TD_OK;
}

td_err shbuf_import(shbuf **out, const shbuf_desc *desc, int fd)
{
    TD_ASSERT(out && desc);
    *out = NULL;
    if (!shbuf_name_ok(desc->name, SHBUF_NAME_MAX))
        return err_set(TD_EFORMAT, "shared buffer descriptor: bad or unterminated name");
    if (desc->kind != SHBUF_KIND_CPU && desc->kind != SHBUF_KIND_CUDA)
        return err_set(TD_EFORMAT, "shared buffer %s: unknown kind %u", desc->name,
                       (unsigned)desc->kind);
    if (desc->size == 0 || desc->size > (uint64_t)PTRDIFF_MAX)
        return err_set(TD_EFORMAT, "shared buffer %s: size %llu bytes is out of range",
                       desc->name, (unsigned long long)desc->size);
    if (fd < 0 || fcntl(fd, F_GETFD) < 0)
        return err_set(TD_EINVAL, "shared buffer %s: fd %d is not open", desc->name, fd);
    shbuf *sb = shbuf_alloc();
    if (!sb)
        return err_set(TD_ENOMEM, "shared buffer %s: out of memory", desc->name);
    sb->desc = *desc;
    td_err e;
    if (desc->kind == SHBUF_KIND_CPU) {
        memset(sb->desc.device_uuid, 0, sizeof sb->desc.device_uuid);
        e = shbuf_cpu_import(sb, fd);
    } else {
        e = shbuf_cuda_import(&sb->cuda, desc->size, desc->device_uuid, fd);
    }
    if (e != TD_OK) {
        shbuf_release(sb);
        return e;
    }
    *out = sb;
    return TD_OK;
}

void shbuf_release(shbuf *sb)
{
    if (!sb)
        return;
    if (sb->host)
        munmap(sb->host, (size_t)sb->desc.size);
    if (sb->fd >= 0)
        close(sb->fd);
    shbuf_cuda_release(sb->cuda);
    free(sb);
}

const shbuf_desc *shbuf_info(const shbuf *sb)
{
    return &sb->desc;
}

uint64_t shbuf_size(const shbuf *sb)
{
    return sb->desc.size;
}

void *shbuf_host(const shbuf *sb)
{
    return sb->host;
}

uint64_t shbuf_devptr(const shbuf *sb)
{
    return sb->cuda ? shbuf_cuda_devptr(sb->cuda) : 0;
}
