/* draftd: owns the drafter weights and proposes blocks (DESIGN sections 1, 4 and 7). It keeps
 * no state of its own that matters: each slot's drafter context lives in kvd's draft pool
 * and the target's features in kvd's target pool, so it can be killed or swapped at any
 * time. On the CPU the target's token embedding and LM head come from the target GGUF mapped
 * read-only (the page cache shares the bytes with verifyd); with --device cuda[:N] they are
 * verifyd's device copies, shared buffers handed on by kvd at attach (the GGUF is then read
 * for shapes only), and kvd's pools must be of the cuda kind on the same GPU.
 *
 * Talks to: verifyd (propose / hello / ping on draftd.ipc, one at a time), kvd (attach over
 * kvd.sock when the first proposal arrives or the pools change). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/args.h"
#include "common/bus.h"
#include "common/daemon.h"
#include "common/devarg.h"
#include "common/kvclient.h"
#include "common/log.h"
#include "draftd/propose.h"
#include "verifyd/target.h"

typedef struct draftd {
    const tgt_model *tm;   /* the target GGUF (host mapping): shapes, CPU heads */
    dfl_model *dm;
    drf d;
    kvc kv;                /* pools, attached on demand */
    const char *kvd_fd;    /* kvd's fd socket */
    uint8_t dev_uuid[CUDRV_UUID_BYTES]; /* GPU: the drafter's device (zero on the CPU) */
    uint64_t proposals;    /* answered */
} draftd;

/* On a GPU: the pools must be cuda buffers of the drafter's GPU, and the drafter's embedding
 * and LM head become verifyd's shared copies (checked against the GGUF's shapes). */
static td_err draftd_bind_heads(draftd *dd)
{
    bool gpu = dd->dm->be->kind == OPS_BACKEND_CUDA;
    if ((kvc_kind(&dd->kv) == SHBUF_KIND_CUDA) != gpu ||
        (gpu && memcmp(kvc_device_uuid(&dd->kv), dd->dev_uuid, CUDRV_UUID_BYTES) != 0))
        return err_set(TD_EINVAL, "kvd's pools are not on the drafter's device: start kvd, "
                       "verifyd and draftd with the same --device");
    if (!gpu)
        return TD_OK;
    const ops_weight *w[2] = {&dd->tm->tok_embd, &dd->tm->output};
    const shbuf *sb[2] = {dd->kv.embd, dd->kv.output ? dd->kv.output : dd->kv.embd};
    bool tied = dd->tm->output.data == dd->tm->tok_embd.data;
    if (!dd->kv.embd || (!tied && !dd->kv.output))
        return err_set(TD_EPROTO, "kvd has no embedding and LM head from verifyd (is verifyd "
                       "on the GPU?)");
    for (int i = 0; i < 2; i++) {
        uint64_t bytes = (uint64_t)w[i]->rows * w[i]->row_bytes;
        if (shbuf_size(sb[i]) < bytes)
            return err_set(TD_EPROTO, "verifyd's %s has %llu bytes, the model's %llu",
                           shbuf_info(sb[i])->name, (unsigned long long)shbuf_size(sb[i]),
                           (unsigned long long)bytes);
    }
    dd->dm->tok_embd.data = kvc_base(sb[0]);
    dd->dm->lm_head.data = kvc_base(sb[1]);
    return TD_OK;
}

/* Maps kvd's pools for the pool generation verifyd names (again when kvd or the layout
 * changed). */
static td_err draftd_attach(draftd *dd, uint64_t pool_gen)
{
    if (dd->kv.fd >= 0 && kvc_alive(&dd->kv) && dd->kv.target_gen == pool_gen && dd->kv.draft)
        return TD_OK;
    const dflash_config *c = &dd->dm->cfg;
    uint32_t taps[DFLASH_MAX_TAPS];
    for (uint32_t i = 0; i < c->n_taps; i++)
        taps[i] = c->target_layer_ids[i];
    msg_kv_attach req = {
        .role = MSG_ROLE_DRAFTD, .pid = (uint32_t)getpid(), .taps = taps, .n_taps = c->n_taps,
        .params = {.block = c->block_size, .n_taps = c->n_taps,
                   .n_embd = (uint32_t)dd->dm->target_hidden, .d_layers = c->n_layers,
                   .d_kv = c->n_kv_heads, .d_head_dim = c->head_dim,
                   .n_vocab = (uint32_t)dd->dm->lm_head.rows,
                   .d_kv_bytes = dfl_kv_bytes(dd->dm)},
    };
    td_err e = kvc_attach(&dd->kv, dd->kvd_fd, &req, 2000);
    if (e != TD_OK)
        return err_wrap(e, "attaching to kvd");
    if (!dd->kv.draft)
        e = err_set(TD_EPROTO, "kvd gave no draft pool");
    if (e == TD_OK)
        e = draftd_bind_heads(dd);
    if (e != TD_OK) {
        kvc_detach(&dd->kv);
        return e;
    }
    LOG_INFO("attached to kvd: target pool generation %llu, draft pool generation %llu",
             (unsigned long long)dd->kv.target_gen, (unsigned long long)dd->kv.draft_gen);
    if (dd->kv.target_gen != pool_gen)
        return err_set(TD_EBUSY, "kvd's target pool (generation %llu) is not the one verifyd "
                       "writes (%llu)", (unsigned long long)dd->kv.target_gen,
                       (unsigned long long)pool_gen);
    return TD_OK;
}

static td_err draftd_propose(draftd *dd, uint64_t rid, const uint8_t *req, size_t len,
                             msg_buf *reply)
{
    msg_propose m;
    msg_proposal out;
    TD_TRY(msg_unpack_propose(req, len, NULL, &m));
    TD_TRY(draftd_attach(dd, m.pool_gen));
    if (m.slot >= dd->kv.lay.p.slots)
        return err_set(TD_ERANGE, "slot %u of %u", m.slot, dd->kv.lay.p.slots);
    TD_TRY(drf_propose(&dd->d, &dd->kv.lay, kvc_target_slot(&dd->kv, m.slot),
                       kvc_draft_slot(&dd->kv, m.slot), dd->kv.q ? kvc_base(dd->kv.q) : NULL,
                       dd->kv.q_gen, &m, &out));
    if (dd->d.rebuilt)
        LOG_INFO("slot %u: drafter context rebuilt from the feature ring (%lld positions)",
                 m.slot, (long long)dd->d.added);
    dd->proposals++;
    return msg_pack_proposal(reply, rid, &out);
}

static td_err draftd_handle(void *user, const uint8_t *req, size_t len, msg_buf *reply)
{
    draftd *dd = user;
    msg_header h;
    TD_TRY(msg_unpack_header(req, len, &h));
    td_err e = TD_OK;
    if (daemon_answer_common(req, len, &h, MSG_ROLE_DRAFTD, reply, &e))
        return e;
    if (h.type == MSG_PROPOSE)
        return draftd_propose(dd, h.request_id, req, len, reply);
    return err_set(TD_EPROTO, "draftd does not answer %s messages", msg_type_name(h.type));
}

int main(int argc, char **argv)
{
    const char *runtime_dir = NULL, *log_level = NULL, *model = NULL, *draft = NULL;
    const char *endpoint = NULL, *kvd_fd = NULL, *device = "cpu";
    bool help = false;
    const args_opt opts[] = {
        {"model", ARGS_STRING, &model, "TANDEM_MODEL", "target GGUF file (its embedding and LM head)", 0, 0, 'm'},
        {"draft", ARGS_STRING, &draft, "TANDEM_DRAFT", "drafter folder (config.json + model.safetensors)", 0, 0, 0},
        {"runtime-dir", ARGS_STRING, &runtime_dir, "TANDEM_RUNTIME_DIR", "private directory of the sockets", 0, 0, 0},
        {"log-level", ARGS_STRING, &log_level, "TANDEM_LOG", "debug, info, warn, error or off", 0, 0, 0},
        {"endpoint", ARGS_STRING, &endpoint, "TANDEM_DRAFTD_ENDPOINT", "draftd's bus endpoint", 0, 0, 0},
        {"kvd-fd-socket", ARGS_STRING, &kvd_fd, "TANDEM_KVD_FD_SOCKET", "kvd's fd socket", 0, 0, 0},
        {"device", ARGS_STRING, &device, "TANDEM_DEVICE", "where the drafter runs: cpu, cuda or cuda:N (with kvd and verifyd)", 0, 0, 0},
        ARGS_END,
    };
    static const char usage[] = "draftd --model M.gguf --draft DIR [--device cpu|cuda[:N]]";
    if (args_parse(argc, argv, 1, opts, NULL, 0, NULL, &help) != TD_OK) {
        fprintf(stderr, "draftd: %s\n", err_msg());
        args_usage(usage, opts);
        return 2;
    }
    if (help) {
        args_usage(usage, opts);
        return 0;
    }
    if (!model || !draft) {
        fprintf(stderr, "draftd: give --model and --draft\n");
        return 2;
    }
    char url[BUS_URL_MAX], fd_path[256];
    if (daemon_setup("draftd", runtime_dir, log_level) != TD_OK ||
        daemon_endpoint(url, sizeof url, endpoint, "draftd") != TD_OK ||
        daemon_kvd_fd_path(fd_path, sizeof fd_path, kvd_fd) != TD_OK) {
        fprintf(stderr, "draftd: %s\n", err_msg());
        return 1;
    }
    daemon_signals();
    draftd dd = {.kvd_fd = fd_path};
    kvc_init(&dd.kv);
    tgt_model *tm = NULL;
    bus_server *srv = NULL;
    uint64_t id = 0;
    int rc = 1, ordinal = -1;
    bool drf_ok = false;
    ops_backend *cuda_be = NULL;
    if (devarg_parse(device, &ordinal) != TD_OK ||
        (ordinal >= 0 && ops_backend_cuda_init(&cuda_be, ordinal) != TD_OK)) {
        LOG_ERROR("--device %s: %s", device, err_msg());
        goto out;
    }
    if (cuda_be) {
        cudrv_device dev = {0};
        if (cudrv_load() != TD_OK || cudrv_device_open_ordinal(&dev, ordinal) != TD_OK) {
            LOG_ERROR("--device %s: %s", device, err_msg());
            goto out;
        }
        memcpy(dd.dev_uuid, dev.uuid, sizeof dd.dev_uuid);
        cudrv_device_close(&dev);
    }
    if (tgt_load(&tm, model) != TD_OK) {
        LOG_ERROR("cannot load %s: %s", model, err_msg());
        goto out;
    }
    dd.tm = tm;
    /* On a GPU the heads given here are host views for shapes only: draftd_bind_heads points
     * the drafter at verifyd's device copies before its first pass. */
    if (dfl_load_on(&dd.dm, draft, (uint32_t)tm->hp.n_layer, &tm->tok_embd, &tm->output,
                    cuda_be ? cuda_be : ops_backend_cpu()) != TD_OK ||
        drf_drafter_id(draft, &id) != TD_OK || drf_init(&dd.d, dd.dm, id) != TD_OK) {
        LOG_ERROR("drafter %s: %s", draft, err_msg());
        goto out;
    }
    drf_ok = true;
    bus_opts bo;
    bus_opts_default(&bo);
    bo.workers = 1; /* proposals of one slot must not overlap: its context is rewritten */
    bo.recv_timeout_ms = 200;
    if (bus_server_init(&srv, url, &bo, draftd_handle, &dd) != TD_OK) {
        LOG_ERROR("%s", err_msg());
        goto out;
    }
    char where[64];
    ops_backend_describe(cuda_be ? cuda_be : ops_backend_cpu(), where, sizeof where);
    LOG_INFO("serving drafter %s (block %u, %u layers) on %s, %s", draft,
             dd.dm->cfg.block_size, dd.dm->cfg.n_layers, where, url);
    while (!daemon_stopping()) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    LOG_INFO("stopping after %llu proposals", (unsigned long long)dd.proposals);
    rc = 0;
out:
    bus_server_free(srv);
    kvc_detach(&dd.kv);
    if (drf_ok)
        drf_free(&dd.d);
    dfl_free(dd.dm);
    tgt_free(tm);
    if (cuda_be)
        ops_backend_cuda_free(cuda_be);
    return rc;
}
