/* kvd client: attach over the fd socket, sequence open/close over the bus (kvclient.h). */
#include "common/kvclient.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/fdpass.h"

void kvc_init(kvc *c)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
}

void kvc_announce_from_desc(msg_shbuf_announce *a, const shbuf_desc *d)
{
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", d->name);
    a->generation = d->generation;
    a->kind = d->kind == SHBUF_KIND_CUDA ? MSG_SHBUF_CUDA : MSG_SHBUF_CPU;
    a->size = d->size;
    if (d->kind == SHBUF_KIND_CUDA) {
        char uuid[CUDRV_UUID_STR_LEN];
        cudrv_uuid_format(d->device_uuid, uuid);
        snprintf(a->device_uuid, sizeof a->device_uuid, "%s", uuid);
    }
}

td_err kvc_desc_from_announce(shbuf_desc *d, const msg_shbuf_announce *a)
{
    memset(d, 0, sizeof *d);
    if (strlen(a->name) >= sizeof d->name)
        return err_set(TD_EFORMAT, "shared buffer name %s is too long", a->name);
    strcpy(d->name, a->name);
    d->generation = a->generation;
    d->kind = a->kind == MSG_SHBUF_CUDA ? SHBUF_KIND_CUDA : SHBUF_KIND_CPU;
    d->size = a->size;
    if (a->kind == MSG_SHBUF_CUDA)
        TD_TRY(cudrv_uuid_parse(a->device_uuid, d->device_uuid));
    return TD_OK;
}

td_err kvc_reply_error(const msg_buf *reply, const char *what)
{
    msg_error e;
    if (msg_unpack_error(reply->data, reply->len, NULL, &e) == TD_OK)
        return err_set(e.code, "%s", e.message);
    msg_header h;
    if (msg_unpack_header(reply->data, reply->len, &h) == TD_OK)
        return err_set(TD_EPROTO, "%s: unexpected %s reply", what, msg_type_name(h.type));
    return err_set(TD_EPROTO, "%s: unreadable reply", what);
}

static void kvc_release_all(kvc *c)
{
    shbuf *all[] = {c->target, c->draft, c->q, c->embd, c->output};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        shbuf_release(all[i]);
}

void kvc_detach(kvc *c)
{
    kvc_release_all(c);
    if (c->fd >= 0)
        close(c->fd);
    kvc_init(c);
}

static void close_fds(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        close(fds[i]);
}

/* Imports pool i of the reply with fds[i]. */
static td_err kvc_import(shbuf **out, const msg_shbuf_announce *a, int fd, uint64_t need)
{
    shbuf_desc d;
    TD_TRY(kvc_desc_from_announce(&d, a));
    if (d.size < need)
        return err_set(TD_EPROTO, "kvd pool %s has %llu bytes, the layout needs %llu", d.name,
                       (unsigned long long)d.size, (unsigned long long)need);
    return shbuf_import(out, &d, fd);
}

/* Imports every buffer of the reply into the field its name says; the pools share one kind
 * and device. */
static td_err kvc_import_all(kvc *c, const msg_kv_pools *pools, const int *fds)
{
    for (uint32_t i = 0; i < pools->n_pools; i++) {
        const msg_shbuf_announce *a = &pools->pools[i];
        shbuf **dst = NULL;
        uint64_t need = 1;
        if (strcmp(a->name, KVC_POOL_TARGET) == 0) {
            dst = &c->target;
            need = c->lay.target_bytes;
            c->target_gen = a->generation;
        } else if (strcmp(a->name, KVC_POOL_DRAFT) == 0) {
            dst = &c->draft;
            need = c->lay.draft_bytes;
            c->draft_gen = a->generation;
        } else if (strcmp(a->name, KVC_POOL_Q) == 0) {
            dst = &c->q;
            need = c->lay.q_bytes;
            c->q_gen = a->generation;
        } else if (strcmp(a->name, KVC_HEAD_EMBD) == 0) {
            dst = &c->embd;
        } else if (strcmp(a->name, KVC_HEAD_OUTPUT) == 0) {
            dst = &c->output;
        }
        if (!dst)
            return err_set(TD_EPROTO, "kvd sent an unknown buffer %s", a->name);
        if (*dst)
            return err_set(TD_EPROTO, "kvd sent buffer %s twice", a->name);
        if (a->kind != pools->pools[0].kind ||
            strcmp(a->device_uuid, pools->pools[0].device_uuid) != 0)
            return err_set(TD_EPROTO, "kvd's buffers %s and %s are not on the same device",
                           pools->pools[0].name, a->name);
        TD_TRY(kvc_import(dst, a, fds[i], need));
    }
    if (!c->target)
        return err_set(TD_EPROTO, "kvd sent no target pool");
    return TD_OK;
}

td_err kvc_attach(kvc *c, const char *fd_path, const msg_kv_attach *req, int timeout_ms)
{
    return kvc_attach_fds(c, fd_path, req, NULL, 0, timeout_ms);
}

td_err kvc_attach_fds(kvc *c, const char *fd_path, const msg_kv_attach *req, const int *send,
                      size_t n_send, int timeout_ms)
{
    kvc_detach(c);
    msg_buf b;
    msg_buf_init(&b);
    uint8_t payload[FDPASS_MAX_PAYLOAD];
    int fds[FDPASS_MAX_FDS];
    size_t len = 0, n_fds = 0;
    int sock = -1;
    msg_kv_pools pools;
    td_err e = msg_pack_kv_attach(&b, 1, req);
    if (e == TD_OK && b.len > FDPASS_MAX_PAYLOAD)
        e = err_set(TD_ERANGE, "kv_attach of %zu bytes does not fit one fd message", b.len);
    if (e == TD_OK)
        e = fdpass_connect(fd_path, &sock);
    if (e == TD_OK)
        e = fdpass_send(sock, b.data, b.len, send, n_send, timeout_ms);
    if (e == TD_OK)
        e = fdpass_recv(sock, payload, sizeof payload, &len, fds, FDPASS_MAX_FDS, &n_fds,
                        timeout_ms);
    msg_buf_free(&b);
    if (e != TD_OK)
        goto fail;
    if (msg_unpack_kv_pools(payload, len, NULL, &pools) != TD_OK) {
        msg_buf r = {.data = payload, .len = len, .cap = len};
        e = kvc_reply_error(&r, "kvd attach");
        goto fail;
    }
    if (n_fds != pools.n_pools) {
        e = err_set(TD_EPROTO, "kvd sent %zu fds for %u pools", n_fds, pools.n_pools);
        goto fail;
    }
    if ((e = kvl_compute(&pools.params, &c->lay)) != TD_OK) {
        e = err_wrap(e, "kvd's layout");
        goto fail;
    }
    if ((e = kvc_import_all(c, &pools, fds)) != TD_OK)
        goto fail;
    close_fds(fds, n_fds);
    c->fd = sock;
    return TD_OK;
fail:
    close_fds(fds, n_fds);
    if (sock >= 0)
        close(sock);
    kvc_release_all(c);
    kvc_init(c);
    return e;
}

bool kvc_alive(kvc *c)
{
    if (c->fd < 0)
        return false;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int r = poll(&p, 1, 0);
    if (r == 0)
        return true;
    if (r < 0)
        return errno == EINTR;
    /* kvd never sends anything after the attach reply: readable means closed */
    return !(p.revents & (POLLIN | POLLHUP | POLLERR));
}

uint8_t *kvc_base(const shbuf *sb)
{
    TD_ASSERT(sb);
    if (shbuf_info(sb)->kind == SHBUF_KIND_CUDA)
        return (uint8_t *)(uintptr_t)shbuf_devptr(sb);
    return shbuf_host(sb);
}

uint8_t *kvc_target_slot(const kvc *c, uint32_t slot)
{
    TD_ASSERT(c->target && slot < c->lay.p.slots);
    return kvc_base(c->target) + (size_t)slot * c->lay.target_slot;
}

uint8_t *kvc_draft_slot(const kvc *c, uint32_t slot)
{
    TD_ASSERT(c->draft && slot < c->lay.p.slots);
    return kvc_base(c->draft) + (size_t)slot * c->lay.draft_slot;
}

shbuf_kind kvc_kind(const kvc *c)
{
    TD_ASSERT(c->target);
    return (shbuf_kind)shbuf_info(c->target)->kind;
}

const uint8_t *kvc_device_uuid(const kvc *c)
{
    TD_ASSERT(c->target);
    return shbuf_info(c->target)->device_uuid;
}

td_err kvc_open(bus_client *bus, uint64_t request_id, const msg_kv_open *req, msg_kv_slot *out,
                int timeout_ms)
{
    msg_buf b;
    msg_buf_init(&b);
    td_err e = msg_pack_kv_open(&b, request_id, req);
    if (e == TD_OK)
        e = bus_client_call(bus, b.data, b.len, &b, timeout_ms);
    if (e == TD_OK && msg_unpack_kv_slot(b.data, b.len, NULL, out) != TD_OK)
        e = kvc_reply_error(&b, "kv_open");
    msg_buf_free(&b);
    return e;
}

td_err kvc_close(bus_client *bus, uint64_t request_id, const msg_kv_close *req, int timeout_ms)
{
    msg_buf b;
    msg_buf_init(&b);
    msg_ack ack;
    td_err e = msg_pack_kv_close(&b, request_id, req);
    if (e == TD_OK)
        e = bus_client_call(bus, b.data, b.len, &b, timeout_ms);
    if (e == TD_OK && msg_unpack_ack(b.data, b.len, NULL, &ack) != TD_OK)
        e = kvc_reply_error(&b, "kv_close");
    msg_buf_free(&b);
    return e;
}
