/* kvd's request handling (see server.h). */
#include "kvd/server.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/daemon.h"
#include "common/kvclient.h"
#include "common/log.h"

td_err kvd_init(kvd *k, uint32_t slots, uint64_t gpu_mem, const cudrv_device *dev)
{
    memset(k, 0, sizeof *k);
    if (slots > KVL_SLOTS_MAX)
        return err_set(TD_ERANGE, "slots %u is outside 1..%u", slots, KVL_SLOTS_MAX);
    k->slots_auto = slots == 0;
    k->slots = slots ? slots : KVD_SLOTS_AUTO;
    k->gpu_mem = gpu_mem;
    k->kind = SHBUF_KIND_CPU;
    if (dev) {
        TD_TRY(cudrv_device_open_uuid(&k->dev, dev->uuid));
        k->kind = SHBUF_KIND_CUDA;
        /* kvd launches no kernels: the stack its context would reserve is room for slots */
        if (cudrv_ctx_lean(&k->dev) != TD_OK)
            LOG_WARN("the CUDA context keeps its default limits: %s", err_msg());
    }
    for (int i = 0; i < KVD_CONNS_MAX; i++)
        k->conns[i].fd = -1;
    TD_TRY(kvs_init(&k->table, k->slots));
    pthread_mutex_init(&k->lock, NULL);
    return TD_OK;
}

void kvd_free(kvd *k)
{
    for (int i = 0; i < KVD_CONNS_MAX; i++)
        if (k->conns[i].fd >= 0)
            close(k->conns[i].fd);
    shbuf_release(k->target);
    shbuf_release(k->draft);
    shbuf_release(k->q);
    for (uint32_t i = 0; i < k->n_heads; i++)
        shbuf_release(k->heads[i]);
    kvs_free(&k->table);
    if (k->kind == SHBUF_KIND_CUDA)
        cudrv_device_close(&k->dev);
    pthread_mutex_destroy(&k->lock);
    memset(k, 0, sizeof *k);
}

/* --- kvd.ipc ------------------------------------------------------------------------------ */

static uint64_t kvd_pool_gen(const kvd *k)
{
    return k->target ? shbuf_info(k->target)->generation : 0;
}

static td_err kvd_open(kvd *k, uint64_t rid, const msg_kv_open *m, msg_kv_slot *out)
{
    if (!k->target)
        return err_set(TD_EBUSY, "kvd has no pools yet: verifyd has not attached");
    for (int i = 0; i < KVD_DEDUP; i++)
        if (k->dedup[i].pid == m->pid && k->dedup[i].request_id == rid) {
            *out = k->dedup[i].reply; /* a retried request: the same slot again */
            return TD_OK;
        }
    if (m->n_tokens >= k->params.n_ctx)
        return err_set(TD_ERANGE, "a prompt of %u tokens leaves no room in a context of %u",
                       m->n_tokens, k->params.n_ctx);
    kvs_grant g;
    TD_TRY(kvs_open(&k->table, m->pid, m->tokens, m->n_tokens, &g));
    *out = (msg_kv_slot){.slot = g.slot, .slot_gen = g.gen, .pool_gen = kvd_pool_gen(k),
                         .n_cached = g.n_cached};
    k->dedup[k->dedup_next] = (kvd_dedup){.pid = m->pid, .request_id = rid, .reply = *out};
    k->dedup_next = (k->dedup_next + 1) % KVD_DEDUP;
    LOG_DEBUG("open: pid %u slot %u gen %llu, %u of %u tokens cached%s", m->pid, g.slot,
              (unsigned long long)g.gen, g.n_cached, m->n_tokens, g.evicted ? " (evicted)" : "");
    return TD_OK;
}

static td_err kvd_close(kvd *k, const msg_kv_close *m)
{
    if (m->keep && m->n_tokens > k->params.n_ctx)
        return err_set(TD_ERANGE, "kv_close: %u tokens in a context of %u", m->n_tokens,
                       k->params.n_ctx);
    return kvs_close(&k->table, m->slot, m->slot_gen, m->keep, m->tokens, m->n_tokens);
}

td_err kvd_handle(void *user, const uint8_t *req, size_t req_len, msg_buf *reply)
{
    kvd *k = user;
    msg_header h;
    TD_TRY(msg_unpack_header(req, req_len, &h));
    td_err e = TD_OK;
    if (daemon_answer_common(req, req_len, &h, MSG_ROLE_KVD, reply, &e))
        return e;
    switch (h.type) {
    case MSG_KV_OPEN: {
        msg_kv_open m;
        msg_kv_slot out;
        TD_TRY(msg_unpack_kv_open(req, req_len, NULL, &m));
        pthread_mutex_lock(&k->lock);
        e = kvd_open(k, h.request_id, &m, &out);
        pthread_mutex_unlock(&k->lock);
        msg_free_kv_open(&m);
        TD_TRY(e);
        return msg_pack_kv_slot(reply, h.request_id, &out);
    }
    case MSG_KV_CLOSE: {
        msg_kv_close m;
        TD_TRY(msg_unpack_kv_close(req, req_len, NULL, &m));
        pthread_mutex_lock(&k->lock);
        e = kvd_close(k, &m);
        pthread_mutex_unlock(&k->lock);
        msg_ack ack = {.id = m.slot};
        msg_free_kv_close(&m);
        TD_TRY(e);
        return msg_pack_ack(reply, h.request_id, &ack);
    }
    default:
        return err_set(TD_EPROTO, "kvd does not answer %s messages", msg_type_name(h.type));
    }
}

/* --- attach ------------------------------------------------------------------------------- */

static td_err kvd_pool_create(kvd *k, shbuf **out, const char *name, uint64_t bytes)
{
    td_err e = shbuf_create(out, k->kind, name, bytes,
                            k->kind == SHBUF_KIND_CUDA ? &k->dev : NULL);
    if (e != TD_OK)
        return err_wrap(e, "creating the %s pool of %llu bytes", name,
                        (unsigned long long)bytes);
    LOG_INFO("created pool %s: %llu bytes, generation %llu", name, (unsigned long long)bytes,
             (unsigned long long)shbuf_info(*out)->generation);
    return TD_OK;
}

/* The room for the pools on the GPU now: its free memory (within gpu_mem of all) less what
 * the drafter still needs (reserve) and KVD_GPU_MARGIN; *why says how it was counted. */
static td_err kvd_gpu_room(const kvd *k, uint64_t reserve, uint64_t *room, char *why,
                           size_t cap)
{
    uint64_t free_b = 0, total_b = 0;
    TD_TRY(cudrv_mem_info(&k->dev, &free_b, &total_b));
    uint64_t avail = free_b;
    if (k->gpu_mem) {
        const uint64_t used = total_b > free_b ? total_b - free_b : 0;
        const uint64_t left = k->gpu_mem > used ? k->gpu_mem - used : 0;
        avail = left < free_b ? left : free_b;
    }
    /* reserve comes from a peer: saturate rather than wrap */
    const uint64_t keep =
        reserve > UINT64_MAX - KVD_GPU_MARGIN ? UINT64_MAX : reserve + KVD_GPU_MARGIN;
    *room = avail > keep ? avail - keep : 0;
    char in_all[64];
    if (k->gpu_mem)
        snprintf(in_all, sizeof in_all, "%.0f MiB in all, --gpu-mem %.0f", kvl_mib(total_b),
                 kvl_mib(k->gpu_mem));
    else
        snprintf(in_all, sizeof in_all, "%.0f MiB in all", kvl_mib(total_b));
    snprintf(why, cap, "%.0f MiB free on the GPU (%s), %.0f MiB kept for the drafter and %.0f "
             "as a margin", kvl_mib(avail), in_all, kvl_mib(reserve), kvl_mib(KVD_GPU_MARGIN));
    return TD_OK;
}

/* How many slots of layout want (its drafter part counted where verifyd knew the drafter)
 * fit the GPU now; with log, says so. */
static td_err kvd_gpu_slots(const kvd *k, const kvl_params *want, uint64_t reserve, bool log,
                            uint32_t *slots)
{
    uint64_t room = 0;
    char why[256];
    TD_TRY(kvd_gpu_room(k, reserve, &room, why, sizeof why));
    td_err e = kvl_fit(want, room, KVD_SLOTS_AUTO, slots);
    if (e != TD_OK)
        return err_wrap(e, "the pools do not fit the GPU (%s): lower verifyd's --ctx or "
                        "--ring, run it without a drafter, or free GPU memory", why);
    if (log)
        LOG_INFO("sized the pools to the GPU: %u slots of %u positions (%s)", *slots,
                 want->n_ctx, why);
    return TD_OK;
}

/* The pools of verifyd's layout p: the target pool and, where the layout has one, the
 * proposal pool; on a GPU a failure says how many slots would fit. */
static td_err kvd_pools_create(kvd *k, const kvl_params *p, const kvl_params *want,
                               uint64_t reserve, shbuf **target, shbuf **q)
{
    kvl_layout lay;
    TD_TRY(kvl_compute(p, &lay));
    td_err e = kvd_pool_create(k, target, KVC_POOL_TARGET, lay.target_bytes);
    if (e == TD_OK && lay.q_bytes && (e = kvd_pool_create(k, q, KVC_POOL_Q, lay.q_bytes))) {
        shbuf_release(*target);
        *target = NULL;
    }
    if (e == TD_OK || k->kind != SHBUF_KIND_CUDA)
        return e;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", err_msg());
    uint32_t fit = 0;
    if (kvd_gpu_slots(k, want, reserve, false, &fit) != TD_OK)
        return err_set(e, "%s; %s", msg, err_msg());
    return err_set(e, "%s; %u slots of %u positions fit the GPU now (kvd --slots %u, or no "
                   "--slots to size them to it)", msg, fit, p->n_ctx, fit);
}

/* verifyd's heads: imported from the fds that came with its attach (kvd's reference keeps
 * them for draftd), replacing those of an earlier verifyd. They must be on the pools' GPU. */
static td_err kvd_heads_take(kvd *k, const msg_kv_attach *m, const int *fds, size_t n_fds)
{
    if (n_fds != m->n_heads)
        return err_set(TD_EINVAL, "kv_attach: %zu fds for %u heads", n_fds, m->n_heads);
    if (m->n_heads && k->kind != SHBUF_KIND_CUDA)
        return err_set(TD_EINVAL, "kv_attach: heads for pools of the cpu kind");
    shbuf *got[MSG_HEADS_MAX] = {0};
    td_err e = TD_OK;
    for (uint32_t i = 0; e == TD_OK && i < m->n_heads; i++) {
        shbuf_desc d;
        e = kvc_desc_from_announce(&d, &m->heads[i]);
        if (e == TD_OK && (strcmp(d.name, i ? KVC_HEAD_OUTPUT : KVC_HEAD_EMBD) != 0 ||
                           d.kind != SHBUF_KIND_CUDA ||
                           memcmp(d.device_uuid, k->dev.uuid, CUDRV_UUID_BYTES) != 0))
            e = err_set(TD_EINVAL, "kv_attach: head %u (%s) is not a buffer of kvd's GPU", i,
                        d.name);
        if (e == TD_OK)
            e = shbuf_import(&got[i], &d, fds[i]);
    }
    if (e != TD_OK) {
        for (uint32_t i = 0; i < MSG_HEADS_MAX; i++)
            shbuf_release(got[i]);
        return e;
    }
    for (uint32_t i = 0; i < k->n_heads; i++)
        shbuf_release(k->heads[i]);
    memcpy(k->heads, got, sizeof got);
    k->n_heads = m->n_heads;
    return TD_OK;
}

/* verifyd: the target part of the layout; a different layout re-creates the target and
 * proposal pools (dropping every slot and the draft pool, whose rows depend on ring and
 * block). */
static td_err kvd_attach_verifyd(kvd *k, const msg_kv_attach *m, const int *fds, size_t n_fds)
{
    kvl_params want = m->params; /* with the drafter part, for sizing the pools */
    want.slots = 1;
    kvl_params p = m->params;
    p.slots = k->slots;
    p.d_layers = p.d_kv = p.d_head_dim = p.d_kv_bytes = 0;
    if (p.n_taps != m->n_taps)
        return err_set(TD_EINVAL, "kv_attach: %u tap ids for n_taps %u", m->n_taps, p.n_taps);
    kvl_layout lay;
    TD_TRY(kvl_compute(&p, &lay));
    if (want.d_layers)
        TD_TRY(err_wrap(kvl_compute(&want, &lay), "kv_attach: the drafter part"));
    TD_TRY(kvd_heads_take(k, m, fds, n_fds));
    if (k->target && kvl_same_target(&k->params, &p) &&
        (m->n_taps == 0 || memcmp(k->taps, m->taps, m->n_taps * sizeof *m->taps) == 0))
        return TD_OK;
    if (k->slots_auto && k->kind == SHBUF_KIND_CUDA) {
        /* the old pools go first, so that their memory counts as room */
        shbuf_release(k->target);
        shbuf_release(k->draft);
        shbuf_release(k->q);
        k->target = k->draft = k->q = NULL;
        kvs_reset(&k->table);
        TD_TRY(kvd_gpu_slots(k, &want, m->reserve, true, &p.slots));
    }
    shbuf *sb = NULL, *q = NULL;
    TD_TRY(kvd_pools_create(k, &p, &want, m->reserve, &sb, &q));
    if (p.slots != k->table.n) {
        kvs_table t;
        td_err e = kvs_init(&t, p.slots);
        if (e != TD_OK) {
            shbuf_release(sb);
            shbuf_release(q);
            return e;
        }
        kvs_free(&k->table);
        k->table = t;
        k->slots = p.slots;
    }
    shbuf_release(k->target);
    shbuf_release(k->draft);
    shbuf_release(k->q);
    k->target = sb;
    k->q = q;
    k->draft = NULL;
    kvs_reset(&k->table);
    memset(k->dedup, 0, sizeof k->dedup);
    k->params = p;
    if (m->n_taps)
        memcpy(k->taps, m->taps, m->n_taps * sizeof *m->taps);
    k->n_taps = m->n_taps;
    return TD_OK;
}

/* draftd: its drafter's part, checked against verifyd's taps and block; a different drafter
 * shape re-creates the draft pool (a new drafter then rebuilds its context from the ring). */
static td_err kvd_attach_draftd(kvd *k, const msg_kv_attach *m)
{
    if (!k->target)
        return err_set(TD_EBUSY, "kvd has no target pool yet: verifyd has not attached");
    if (m->n_taps != k->n_taps ||
        (m->n_taps && memcmp(m->taps, k->taps, m->n_taps * sizeof *m->taps) != 0))
        return err_set(TD_EINVAL, "the drafter taps %u target layers that differ from the %u "
                       "verifyd keeps features of", m->n_taps, k->n_taps);
    if (m->params.n_vocab && m->params.n_vocab != k->params.n_vocab)
        return err_set(TD_EINVAL, "the drafter's vocabulary of %u tokens is not verifyd's %u",
                       m->params.n_vocab, k->params.n_vocab);
    if (m->params.block > k->params.block)
        return err_set(TD_EINVAL, "the drafter's block of %u tokens exceeds verifyd's %u",
                       m->params.block, k->params.block);
    kvl_params p = k->params;
    p.d_layers = m->params.d_layers;
    p.d_kv = m->params.d_kv;
    p.d_head_dim = m->params.d_head_dim;
    p.d_kv_bytes = m->params.d_kv_bytes;
    if (p.d_layers == 0)
        return err_set(TD_EINVAL, "kv_attach: a drafter without layers");
    kvl_layout lay;
    TD_TRY(kvl_compute(&p, &lay));
    if (k->draft && kvl_same_draft(&k->params, &p))
        return TD_OK;
    shbuf *sb;
    TD_TRY(kvd_pool_create(k, &sb, KVC_POOL_DRAFT, lay.draft_bytes));
    shbuf_release(k->draft);
    k->draft = sb;
    k->params = p;
    return TD_OK;
}

td_err kvd_attach(kvd *k, const uint8_t *req, size_t len, const int *in_fds, size_t n_in,
                  msg_buf *reply, int *fds, size_t *n_fds, uint32_t *pid, msg_role *role)
{
    msg_kv_attach m;
    uint64_t rid = 0;
    *n_fds = 0;
    TD_TRY(msg_unpack_kv_attach(req, len, &rid, &m));
    pthread_mutex_lock(&k->lock);
    td_err e;
    if (m.role == MSG_ROLE_VERIFYD)
        e = kvd_attach_verifyd(k, &m, in_fds, n_in);
    else if (n_in)
        e = err_set(TD_EINVAL, "kv_attach: draftd sent %zu fds", n_in);
    else
        e = kvd_attach_draftd(k, &m);
    msg_kv_pools out = {.params = k->params};
    /* verifyd: target, proposal pool; draftd: also the draft pool and verifyd's heads */
    bool dd = m.role == MSG_ROLE_DRAFTD;
    shbuf *pools[MSG_POOLS_MAX] = {k->target, k->q, dd ? k->draft : NULL,
                                   dd && k->n_heads > 0 ? k->heads[0] : NULL,
                                   dd && k->n_heads > 1 ? k->heads[1] : NULL};
    for (int i = 0; e == TD_OK && i < MSG_POOLS_MAX; i++) {
        if (!pools[i])
            continue;
        shbuf_desc d;
        if ((e = shbuf_export(pools[i], &d, &fds[*n_fds])) != TD_OK)
            break;
        (*n_fds)++;
        kvc_announce_from_desc(&out.pools[out.n_pools++], &d);
    }
    pthread_mutex_unlock(&k->lock);
    if (e == TD_OK) {
        e = msg_pack_kv_pools(reply, rid, &out);
        *pid = m.pid;
        *role = m.role;
    }
    if (e != TD_OK) {
        for (size_t i = 0; i < *n_fds; i++)
            close(fds[i]);
        *n_fds = 0;
    }
    msg_free_kv_attach(&m);
    return e;
}

/* --- reclaiming ----------------------------------------------------------------------------- */

uint32_t kvd_reclaim_owner(kvd *k, uint32_t pid)
{
    pthread_mutex_lock(&k->lock);
    uint32_t n = kvs_reclaim_owner(&k->table, pid);
    pthread_mutex_unlock(&k->lock);
    if (n)
        LOG_INFO("reclaimed %u slots of pid %u (connection closed)", n, pid);
    return n;
}

static bool kvd_pid_dead(uint32_t pid)
{
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

uint32_t kvd_reclaim_dead(kvd *k)
{
    pthread_mutex_lock(&k->lock);
    uint32_t n = kvs_reclaim_dead(&k->table, kvd_pid_dead);
    pthread_mutex_unlock(&k->lock);
    if (n)
        LOG_INFO("reclaimed %u slots of processes that exited", n);
    return n;
}
