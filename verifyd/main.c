/* verifyd: owns the target model (loaded once) and the speculative loop of every sequence
 * (DESIGN sections 1 and 4): prefill, verification of drafted blocks, acceptance, rollback,
 * stop conditions, log probabilities, and the scheduler that interleaves sequences.
 *
 * Talks to: the gateway (gen_start / gen_cancel / status_get on verifyd.ipc; token events
 * pushed to gateway-events.ipc), draftd (propose on draftd.ipc; without it, plain decoding
 * with the same output), kvd (attach over kvd.sock for the sequence memory, kv_open /
 * kv_close on kvd.ipc).
 *
 * --device cuda[:N] puts the target on that GPU: kvd's pools must then be of the cuda kind
 * on the same GPU (sequence state and feature ring stay on the device), and the target's
 * token embedding and LM head are loaded straight into shared buffers of the cuda kind that
 * go to draftd through kvd: the GPU holds them once, for both models. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/args.h"
#include "common/bus.h"
#include "common/daemon.h"
#include "common/devarg.h"
#include "common/dflash_config.h"
#include "common/log.h"
#include "common/tokenizer.h"
#include "verifyd/sched.h"

/* What verifyd reads from the model's tokenizer: the end-of-generation ids as a [n_vocab]
 * table and the vocabulary for response formats. Both stay NULL when the file has no
 * tokenizer (then only the request's stop ids end a generation and formats are refused). */
static void verifyd_vocab(const tgt_model *tm, uint8_t **eog, cst_vocab **vocab)
{
    *eog = NULL;
    *vocab = NULL;
    tokenizer *tok = NULL;
    if (tok_load_gguf(&tok, tm->file) != TD_OK) {
        LOG_WARN("no tokenizer in the model (%s): only stop ids end generations, response "
                 "formats are refused", err_msg());
        return;
    }
    *eog = calloc((size_t)tm->hp.n_vocab, 1);
    for (int64_t i = 0; *eog && i < tm->hp.n_vocab; i++)
        (*eog)[i] = i < (int64_t)tok_n_vocab(tok) && tok_is_eog(tok, (int32_t)i);
    cst_vocab *v = calloc(1, sizeof *v);
    if (v && cst_vocab_init(v, tok, tm->hp.n_vocab) == TD_OK) {
        *vocab = v;
    } else {
        LOG_WARN("response formats are refused: %s", v ? err_msg() : "out of memory");
        free(v);
    }
    tok_free(tok);
}

static void verifyd_model_name(const tgt_model *tm, const char *path, char *out, size_t cap)
{
    gguf_str name;
    if (gguf_get_str(tm->file, "general.name", &name) == TD_OK && name.len > 0) {
        snprintf(out, cap, "%.*s", (int)name.len, name.ptr);
        return;
    }
    const char *base = strrchr(path, '/');
    snprintf(out, cap, "%s", base ? base + 1 : path);
}

/* Where a CUDA target's token embedding and LM head live: shared buffers of the cuda kind
 * (heads[0] the embedding, heads[1] the untied LM head), created as the load asks for them
 * (tgt_place_hook) so the model uses them in place and draftd maps the same memory. */
typedef struct verifyd_heads {
    cudrv_device dev; /* the target's GPU */
    shbuf **heads;    /* [MSG_HEADS_MAX], released by main after the model */
} verifyd_heads;

static td_err verifyd_head_mem(void *ctx, const char *name, size_t bytes, void **out)
{
    verifyd_heads *h = ctx;
    bool embd = !strcmp(name, "token_embd.weight");
    TD_ASSERT(embd || !strcmp(name, "output.weight"));
    shbuf **sb = &h->heads[embd ? 0 : 1];
    TD_TRY(shbuf_create(sb, SHBUF_KIND_CUDA, embd ? KVC_HEAD_EMBD : KVC_HEAD_OUTPUT, bytes,
                        &h->dev));
    *out = kvc_base(*sb);
    return TD_OK;
}

/* Loads the target on be; on a GPU with its embedding and LM head in heads (announced to kvd
 * through c) and c->dev_uuid set. */
static td_err verifyd_load(tgt_model **tm, const char *path, const ops_backend *be,
                           sched_cfg *c, shbuf **heads)
{
    if (be->kind == OPS_BACKEND_CPU)
        return tgt_load_on(tm, path, be);
    verifyd_heads h = {.heads = heads};
    TD_TRY(cudrv_load());
    TD_TRY(cudrv_device_open_ordinal(&h.dev, be->device));
    memcpy(c->dev_uuid, h.dev.uuid, sizeof c->dev_uuid);
    tgt_place_hook hook = {.mem = verifyd_head_mem, .ctx = &h};
    td_err e = tgt_load_placed(tm, path, be, &hook);
    cudrv_device_close(&h.dev); /* each buffer holds its own reference to the device */
    if (e != TD_OK)
        return e;
    c->n_heads = (*tm)->output.data == (*tm)->tok_embd.data ? 1 : 2;
    for (uint32_t i = 0; i < c->n_heads; i++) {
        TD_ASSERT(heads[i]); /* a device load asks the hook for each of them */
        c->heads[i] = heads[i];
    }
    LOG_INFO("weights on %s: %zu bytes in the model's arena, %zu bytes in shared buffers "
             "(token embedding and LM head, held once for verifyd and draftd)", be->name,
             (*tm)->arena_bytes, (*tm)->placed_bytes);
    return TD_OK;
}

/* Taps, block size and the context's shape from the drafter's config.json, and the size of
 * its weights (draftd's to load) for sizing kvd's pools on a GPU. */
static td_err verifyd_draft_config(sched_cfg *c, const char *dir)
{
    char path[4096];
    dflash_config dc;
    snprintf(path, sizeof path, "%s/config.json", dir);
    TD_TRY(dflash_config_load(&dc, path));
    TD_TRY(dflash_config_resolve(&dc, (uint32_t)c->tm->hp.n_layer));
    if (dc.block_size < 2 || dc.block_size > SPEC_MAX_BLOCK)
        return err_set(TD_ENOTSUP, "%s: block_size %u is outside 2..%d", path, dc.block_size,
                       SPEC_MAX_BLOCK);
    if (dc.n_taps > MSG_TAPS_MAX)
        return err_set(TD_ENOTSUP, "%s: %u taps", path, dc.n_taps);
    snprintf(path, sizeof path, "%s/model.safetensors", dir); /* draftd's to read */
    struct stat st;
    c->d_weight_bytes = stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
    c->d_layers = dc.n_layers;
    c->d_kv = dc.n_kv_heads;
    c->d_head_dim = dc.head_dim;
    c->block = dc.block_size;
    c->n_taps = dc.n_taps;
    for (uint32_t i = 0; i < dc.n_taps; i++)
        c->taps[i] = (int32_t)dc.target_layer_ids[i];
    return TD_OK;
}

int main(int argc, char **argv)
{
    const char *runtime_dir = NULL, *log_level = NULL, *model = NULL, *draft = NULL;
    const char *endpoint = NULL, *events = NULL, *draftd = NULL, *kvd = NULL, *kvd_fd = NULL;
    const char *device = "cpu";
    int64_t n_ctx = 4096, ring = 4096, max_queue = 64, draft_timeout = 100, workers = 4;
    int64_t delta_chunk = 0, draft_max = 0;
    bool help = false, no_draft = false, draft_auto = false;
    const args_opt opts[] = {
        {"model", ARGS_STRING, &model, "TANDEM_MODEL", "target GGUF file", 0, 0, 'm'},
        {"draft", ARGS_STRING, &draft, "TANDEM_DRAFT", "drafter folder (its config.json: taps and block size)", 0, 0, 0},
        {"ctx", ARGS_INT, &n_ctx, "TANDEM_CTX", "positions per sequence (prompt + generated)", 2, KVL_CTX_MAX, 0},
        {"ring", ARGS_INT, &ring, NULL, "feature ring rows (the drafter's context window)", 1, KVL_CTX_MAX, 0},
        {"max-queue", ARGS_INT, &max_queue, NULL, "generations waiting for a slot at most", 0, 1 << 20, 0},
        {"draft-timeout-ms", ARGS_INT, &draft_timeout, NULL, "a proposal may take at least this long", 1, 600000, 0},
        {"no-draft", ARGS_FLAG, &no_draft, NULL, "never ask draftd (plain decoding)", 0, 0, 0},
        {"draft-max", ARGS_INT, &draft_max, "TANDEM_DRAFT_MAX", "drafts a step verifies at most (0: the drafter's whole block, block_size - 1): a shorter block costs less to verify where few drafts are accepted", 0, SPEC_MAX_BLOCK - 1, 0},
        {"draft-auto", ARGS_FLAG, &draft_auto, "TANDEM_DRAFT_AUTO", "each step verifies as many drafts (up to --draft-max) as give the most tokens per second by the steps' measured cost and acceptance, none where drafting does not pay (seeded sampled outputs then depend on timing)", 0, 0, 0},
        {"runtime-dir", ARGS_STRING, &runtime_dir, "TANDEM_RUNTIME_DIR", "private directory of the sockets", 0, 0, 0},
        {"log-level", ARGS_STRING, &log_level, "TANDEM_LOG", "debug, info, warn, error or off", 0, 0, 0},
        {"endpoint", ARGS_STRING, &endpoint, "TANDEM_VERIFYD_ENDPOINT", "verifyd's bus endpoint", 0, 0, 0},
        {"events", ARGS_STRING, &events, "TANDEM_EVENTS_ENDPOINT", "the gateway's event endpoint", 0, 0, 0},
        {"draftd", ARGS_STRING, &draftd, "TANDEM_DRAFTD_ENDPOINT", "draftd's bus endpoint", 0, 0, 0},
        {"kvd", ARGS_STRING, &kvd, "TANDEM_KVD_ENDPOINT", "kvd's bus endpoint", 0, 0, 0},
        {"kvd-fd-socket", ARGS_STRING, &kvd_fd, "TANDEM_KVD_FD_SOCKET", "kvd's fd socket", 0, 0, 0},
        {"workers", ARGS_INT, &workers, NULL, "bus requests served at once", 1, 64, 0},
        {"device", ARGS_STRING, &device, "TANDEM_DEVICE", "where the target runs: cpu, cuda or cuda:N (kvd's pools must be there too)", 0, 0, 0},
        {"delta-chunk", ARGS_INT, &delta_chunk, "TANDEM_DELTA_CHUNK", "prefill runs the DeltaNet recurrence in chunks of N positions (0: token by token, whose bits a prompt resumed from the prefix cache keeps)", 0, OPS_DELTA_CHUNK_MAX, 0},
        ARGS_END,
    };
    static const char usage[] =
        "verifyd --model M.gguf [--draft DIR] [--ctx N] [--device cpu|cuda[:N]]";
    if (args_parse(argc, argv, 1, opts, NULL, 0, NULL, &help) != TD_OK) {
        fprintf(stderr, "verifyd: %s\n", err_msg());
        args_usage(usage, opts);
        return 2;
    }
    if (help) {
        args_usage(usage, opts);
        return 0;
    }
    if (!model) {
        fprintf(stderr, "verifyd: give --model\n");
        return 2;
    }
    char url[BUS_URL_MAX], ev_url[BUS_URL_MAX], dd_url[BUS_URL_MAX], kv_url[BUS_URL_MAX];
    char kv_fd[256];
    if (daemon_setup("verifyd", runtime_dir, log_level) != TD_OK ||
        daemon_endpoint(url, sizeof url, endpoint, "verifyd") != TD_OK ||
        daemon_endpoint(ev_url, sizeof ev_url, events, "gateway-events") != TD_OK ||
        daemon_endpoint(dd_url, sizeof dd_url, draftd, "draftd") != TD_OK ||
        daemon_endpoint(kv_url, sizeof kv_url, kvd, "kvd") != TD_OK ||
        daemon_kvd_fd_path(kv_fd, sizeof kv_fd, kvd_fd) != TD_OK) {
        fprintf(stderr, "verifyd: %s\n", err_msg());
        return 1;
    }
    daemon_signals();

    tgt_model *tm = NULL;
    uint8_t *eog = NULL;
    cst_vocab *vocab = NULL;
    sched *sc = NULL;
    bus_server *srv = NULL;
    ops_backend *cuda_be = NULL;
    shbuf *heads[MSG_HEADS_MAX] = {0};
    int rc = 1, ordinal = -1;
    if (devarg_parse(device, &ordinal) != TD_OK ||
        (ordinal >= 0 && ops_backend_cuda_init(&cuda_be, ordinal) != TD_OK)) {
        LOG_ERROR("--device %s: %s", device, err_msg());
        goto out;
    }
    sched_cfg cfg = {
        .n_ctx = n_ctx, .block = 1, .max_queue = (uint32_t)max_queue,
        .draft_timeout_ms = (int)draft_timeout, .draft_max = draft_max,
        .draft_auto = draft_auto, .kvd_url = kv_url,
        .kvd_fd_path = kv_fd,
        .draftd_url = no_draft ? NULL : dd_url, .events_url = ev_url,
    };
    if (verifyd_load(&tm, model, cuda_be ? cuda_be : ops_backend_cpu(), &cfg, heads) != TD_OK) {
        LOG_ERROR("cannot load %s on %s: %s", model, device, err_msg());
        goto out;
    }
    if (tgt_set_delta_chunk(tm, delta_chunk) != TD_OK) {
        LOG_ERROR("--delta-chunk: %s", err_msg());
        goto out;
    }
    cfg.tm = tm;
    verifyd_model_name(tm, model, cfg.model_name, sizeof cfg.model_name);
    if (draft && verifyd_draft_config(&cfg, draft) != TD_OK) {
        LOG_ERROR("drafter %s: %s", draft, err_msg());
        goto out;
    }
    cfg.ring = cfg.n_taps ? (ring < n_ctx ? ring : n_ctx) : 0;
    verifyd_vocab(tm, &eog, &vocab);
    cfg.eog = eog;
    cfg.vocab = vocab;
    if (sched_start(&sc, &cfg) != TD_OK) {
        LOG_ERROR("%s", err_msg());
        goto out;
    }
    bus_opts bo;
    bus_opts_default(&bo);
    bo.workers = (int)workers;
    bo.recv_timeout_ms = 200;
    if (bus_server_init(&srv, url, &bo, sched_handle, sc) != TD_OK) {
        LOG_ERROR("%s", err_msg());
        goto out;
    }
    char where[64];
    ops_backend_describe(cuda_be ? cuda_be : ops_backend_cpu(), where, sizeof where);
    LOG_INFO("serving %s (%s) on %s, %s: context %lld, block %lld%s", cfg.model_name, model,
             where, url, (long long)n_ctx, (long long)sched_verify_block(&cfg),
             cfg.block > 1 ? "" : " (plain decoding)");
    while (!daemon_stopping()) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    LOG_INFO("stopping");
    rc = 0;
out:
    bus_server_free(srv);
    sched_stop(sc);
    free(eog);
    if (vocab)
        cst_vocab_free(vocab);
    free(vocab);
    tgt_free(tm); /* before the shared buffers its embedding and LM head live in */
    for (int i = 0; i < MSG_HEADS_MAX; i++)
        shbuf_release(heads[i]);
    if (cuda_be)
        ops_backend_cuda_free(cuda_be);
    return rc;
}
