/* One proposal against a kvd slot (see propose.h). */
#include "draftd/propose.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/hash.h"

td_err drf_init(drf *d, const dfl_model *dm, uint64_t drafter_id)
{
    memset(d, 0, sizeof *d);
    d->dm = dm;
    d->drafter_id = drafter_id;
    d->n_vocab = dm->lm_head.rows;
    int64_t B = dm->cfg.block_size;
    if (B < 2 || B - 1 > MSG_DRAFT_MAX)
        return err_set(TD_ENOTSUP, "drafter block size %lld is outside 2..%d", (long long)B,
                       MSG_DRAFT_MAX + 1);
    size_t n = (size_t)(B - 1) * (size_t)d->n_vocab;
    const ops_backend *be = dm->be;
    td_err e = be->alloc(be, (void **)&d->dlogits, n * sizeof *d->dlogits);
    if (e == TD_OK)
        e = be->alloc(be, (void **)&d->dq, n * sizeof *d->dq);
    if (e == TD_OK)
        e = be->alloc(be, (void **)&d->ids, (size_t)(B - 1) * sizeof *d->ids);
    if (e != TD_OK) {
        drf_free(d);
        return err_wrap(e, "drafter logits");
    }
    d->q = malloc(n * sizeof *d->q);
    d->q_ids = malloc(n * sizeof *d->q_ids);
    d->q_p = malloc(n * sizeof *d->q_p);
    if (!d->q || !d->q_ids || !d->q_p) {
        drf_free(d);
        return err_set(TD_ENOMEM, "out of memory for the drafter's scratch");
    }
    return TD_OK;
}

void drf_free(drf *d)
{
    if (d->dm) {
        d->dm->be->release(d->dm->be, d->dlogits);
        d->dm->be->release(d->dm->be, d->dq);
        d->dm->be->release(d->dm->be, d->ids);
        d->dm->be->release(d->dm->be, d->feat);
    }
    free(d->q);
    free(d->q_ids);
    free(d->q_p);
    memset(d, 0, sizeof *d);
}

/* Hashes the first max bytes of path and its size into *h. */
static td_err hash_file(uint64_t *h, const char *path, size_t max)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return err_set(TD_ENOENT, "%s: cannot open", path);
    uint8_t buf[4096];
    size_t got, total = 0;
    while (total < max && (got = fread(buf, 1, sizeof buf, f)) > 0) {
        *h = td_hash(*h, buf, got);
        total += got;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0) {
        uint64_t size = (uint64_t)st.st_size;
        *h = td_hash(*h, &size, sizeof size);
    }
    fclose(f);
    return TD_OK;
}

td_err drf_drafter_id(const char *dir, uint64_t *id)
{
    char path[4096];
    uint64_t h = TD_HASH_SEED;
    snprintf(path, sizeof path, "%s/config.json", dir);
    TD_TRY(hash_file(&h, path, (size_t)1 << 20));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    TD_TRY(hash_file(&h, path, (size_t)1 << 16));
    *id = h ? h : 1; /* 0 is what a fresh (zeroed) header holds */
    return TD_OK;
}

/* Writes the slot's header (host copy hdr) to the draft pool, after the work queued before
 * it on the backend (so the header never claims context rows not yet written). */
static td_err drf_header_put(const drf *d, uint8_t *dhdr, const kvl_draft_header *hdr)
{
    const ops_backend *be = d->dm->be;
    return be->to_device(be, dhdr, hdr, sizeof *hdr);
}

/* Adds the ring rows of positions from..to-1 to the context, at most a ring's wrap at a time,
 * recording the progress in the header so a draftd killed half-way resumes correctly. A bf16
 * ring (a GPU's) is widened DRF_FEAT_ROWS positions at a time into d->feat first: exactly the
 * values the drafter's products read of f32 features (they round their inputs to bf16). */
static td_err drf_add(drf *d, const kvl_layout *lay, const uint8_t *ring, dfl_state *ds,
                      uint8_t *dhdr, kvl_draft_header *hdr, int64_t to)
{
    const ops_backend *be = d->dm->be;
    const bool bf16 = lay->p.feat_bytes == 2;
    int64_t R = lay->p.ring, row = (int64_t)lay->p.n_taps * lay->p.n_embd;
    if (bf16 && d->feat_cap < DRF_FEAT_ROWS * row) {
        be->release(be, d->feat);
        d->feat = NULL;
        d->feat_cap = 0;
        TD_TRY(err_wrap(be->alloc(be, (void **)&d->feat,
                                  (size_t)(DRF_FEAT_ROWS * row) * sizeof(float)),
                        "widening the feature ring"));
        d->feat_cap = DRF_FEAT_ROWS * row;
    }
    while (ds->n_ctx < to) {
        int64_t p = ds->n_ctx, r = p % R;
        int64_t n = to - p < R - r ? to - p : R - r;
        const int64_t most = bf16 ? DRF_FEAT_ROWS : 256; /* bounds the scratch */
        if (n > most)
            n = most;
        const float *feat = (const float *)ring + r * row;
        if (bf16) {
            TD_TRY(be->from_bf16(be, d->feat, (const uint16_t *)ring + r * row, n * row));
            feat = d->feat;
        }
        TD_TRY(dfl_add_context(d->dm, ds, feat, n));
        hdr->n_ctx = ds->n_ctx;
        TD_TRY(drf_header_put(d, dhdr, hdr));
        d->added += n;
    }
    return TD_OK;
}

td_err drf_propose(drf *d, const kvl_layout *lay, const uint8_t *tslot, uint8_t *dslot,
                   uint8_t *qpool, uint64_t q_gen, const msg_propose *req, msg_proposal *out)
{
    const dfl_model *dm = d->dm;
    int64_t B = (int64_t)req->n_draft + 1, V = d->n_vocab, L = req->n_past, R = lay->p.ring;
    memset(out, 0, sizeof *out);
    d->added = 0;
    d->rebuilt = false;
    if (B < 2 || B > (int64_t)dm->cfg.block_size)
        return err_set(TD_EINVAL, "%u draft tokens asked of a drafter with blocks of %u",
                       req->n_draft, dm->cfg.block_size);
    if (req->n_past > lay->p.n_ctx || req->pending >= (uint32_t)V)
        return err_set(TD_ERANGE, "propose at position %u with token %u (context %u, "
                       "vocabulary %lld)", req->n_past, req->pending, lay->p.n_ctx, (long long)V);
    if (lay->draft_slot == 0 ||
        (int64_t)lay->p.n_taps * lay->p.n_embd != (int64_t)dm->cfg.n_taps * dm->target_hidden ||
        lay->p.d_layers != dm->cfg.n_layers || lay->p.d_kv != dm->cfg.n_kv_heads ||
        lay->p.d_head_dim != dm->cfg.head_dim ||
        lay->p.d_kv_bytes != dfl_kv_bytes(dm))
        return err_set(TD_EINVAL, "the pools do not fit this drafter");

    if (qpool && lay->q_bytes < (uint64_t)(B - 1) * (uint64_t)V * sizeof(float))
        return err_set(TD_EINVAL, "the proposal pool of %llu bytes does not hold %lld rows of "
                       "%lld", (unsigned long long)lay->q_bytes, (long long)(B - 1),
                       (long long)V);

    const ops_backend *be = dm->be;
    uint8_t *dhdr = dslot + lay->d_header;
    kvl_draft_header hdr;
    TD_TRY(be->to_host(be, &hdr, dhdr, sizeof hdr));
    dfl_state ds;
    TD_TRY(dfl_state_bind(&ds, dm, R, R + lay->p.block, dslot + lay->d_k, dslot + lay->d_v,
                          (int32_t *)(dslot + lay->d_pos)));
    td_err e = TD_OK;
    if (hdr.slot_gen != req->slot_gen || hdr.drafter_id != d->drafter_id ||
        hdr.n_ctx < 0 || hdr.n_ctx > L || L - hdr.n_ctx > R) {
        /* Someone else's context, or one the ring no longer covers: rebuild from the last R
         * committed positions (all there are when fewer). */
        d->rebuilt = hdr.slot_gen == req->slot_gen; /* else: a new sequence's first block */
        hdr.slot_gen = req->slot_gen;
        hdr.drafter_id = d->drafter_id;
        hdr.n_ctx = L > R ? L - R : 0;
        e = drf_header_put(d, dhdr, &hdr);
    }
    ds.n_ctx = hdr.n_ctx;
    if (e == TD_OK)
        e = drf_add(d, lay, tslot + lay->feat, &ds, dhdr, &hdr, L);
    int32_t block[MSG_DRAFT_MAX + 1];
    if (e == TD_OK)
        e = dfl_propose(dm, &ds, (int32_t)req->pending, B - 1, d->dlogits);
    ops_sampler smp = {
        .temperature = req->sampler.temperature,
        .top_k = req->sampler.top_k > INT32_MAX ? INT32_MAX : (int32_t)req->sampler.top_k,
        .top_p = req->sampler.top_p, .min_p = req->sampler.min_p, .seed = req->sampler.seed,
    };
    /* drafted next to the logits; sampled distributions straight into the pool when there
     * is one, else to the host for the message */
    if (e == TD_OK)
        e = dfl_draft_tokens(be, &smp, d->dlogits, B, V, L, d->ids, block,
                             qpool ? (float *)qpool : d->dq);
    if (e == TD_OK && smp.temperature != 0.0f && !qpool)
        e = be->to_host(be, d->q, d->dq, (size_t)((B - 1) * V) * sizeof(float));
    /* verifyd (another process) reads the context rows, header and distributions next */
    if (e == TD_OK)
        e = be->sync(be);
    dfl_state_free(&ds);
    TD_TRY(e);
    for (int64_t i = 1; i < B; i++)
        d->tokens[i - 1] = (uint32_t)block[i];
    out->seq_id = req->seq_id;
    out->n_past = req->n_past;
    out->tokens = d->tokens;
    out->n_tokens = req->n_draft;
    if (smp.temperature == 0.0f)
        return TD_OK;
    if (qpool) {
        out->q_gen = q_gen;
        out->q_offset = 0;
        out->q_rows = req->n_draft;
        return TD_OK;
    }
    for (int64_t i = 0; i < B - 1; i++) {
        const float *q = d->q + i * V;
        uint32_t *ids = d->q_ids + i * V;
        float *p = d->q_p + i * V;
        uint32_t n = 0;
        for (int64_t t = 0; t < V; t++)
            if (q[t] > 0.0f) {
                ids[n] = (uint32_t)t;
                p[n++] = q[t];
            }
        d->rows[i] = (msg_draft_q){.ids = ids, .p = p, .n = n};
    }
    out->q = d->rows;
    out->n_q = req->n_draft;
    return TD_OK;
}
