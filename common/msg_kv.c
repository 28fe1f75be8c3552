/* Messages of the speculative link and of kvd: propose/proposal (verifyd <-> draftd),
 * kv_attach/kv_pools (over kvd's fd socket), kv_open/kv_slot/kv_close (over kvd.ipc). Same
 * rules as msg.c: one check_<type> shared by pack (TD_EINVAL) and unpack (TD_EFORMAT). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/msg.h"
#include "common/msg_codec.h"

/* --- propose ------------------------------------------------------------------------------- */

static td_err check_propose(const msg_propose *m, td_err code)
{
    if (m->n_past < 1)
        return err_set(code, "propose: n_past 0 (the prompt has not run)");
    if (m->n_draft < 1 || m->n_draft > MSG_DRAFT_MAX)
        return err_set(code, "propose: n_draft %u, allowed 1..%u", m->n_draft, MSG_DRAFT_MAX);
    return msg_check_sampler("propose", &m->sampler, code);
}

td_err msg_pack_propose(msg_buf *out, uint64_t request_id, const msg_propose *m)
{
    TD_ASSERT(out && m);
    TD_TRY(check_propose(m, TD_EINVAL));
    msg_writer w;
    msg_write_begin(&w, out, MSG_PROPOSE, request_id, 8);
    msg_write_uint(&w, m->seq_id);
    msg_write_uint(&w, m->slot);
    msg_write_uint(&w, m->slot_gen);
    msg_write_uint(&w, m->pool_gen);
    msg_write_uint(&w, m->n_past);
    msg_write_uint(&w, m->pending);
    msg_write_uint(&w, m->n_draft);
    msg_write_sampler(&w, &m->sampler);
    return msg_write_end(&w);
}

td_err msg_unpack_propose(const void *buf, size_t len, uint64_t *request_id, msg_propose *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    uint64_t slot = 0, n_past = 0, pending = 0, n_draft = 0;
    msg_reader_init(&r, buf, len, "propose");
    TD_TRY(msg_read_envelope(&r, MSG_PROPOSE, 8, &h));
    TD_TRY(msg_read_uint(&r, "seq_id", UINT64_MAX, &out->seq_id));
    TD_TRY(msg_read_uint(&r, "slot", UINT32_MAX, &slot));
    TD_TRY(msg_read_uint(&r, "slot_gen", UINT64_MAX, &out->slot_gen));
    TD_TRY(msg_read_uint(&r, "pool_gen", UINT64_MAX, &out->pool_gen));
    TD_TRY(msg_read_uint(&r, "n_past", UINT32_MAX, &n_past));
    TD_TRY(msg_read_uint(&r, "pending", UINT32_MAX, &pending));
    TD_TRY(msg_read_uint(&r, "n_draft", MSG_DRAFT_MAX, &n_draft));
    TD_TRY(msg_read_sampler(&r, &out->sampler));
    TD_TRY(msg_read_end(&r));
    out->slot = (uint32_t)slot;
    out->n_past = (uint32_t)n_past;
    out->pending = (uint32_t)pending;
    out->n_draft = (uint32_t)n_draft;
    TD_TRY(check_propose(out, TD_EFORMAT));
    msg_put_request_id(request_id, &h);
    return TD_OK;
}

/* --- proposal ------------------------------------------------------------------------------ */

static td_err check_proposal(const msg_proposal *m, td_err code)
{
    if (m->n_tokens < 1 || m->n_tokens > MSG_DRAFT_MAX)
        return err_set(code, "proposal: %u tokens, allowed 1..%u", m->n_tokens, MSG_DRAFT_MAX);
    if (m->n_q != 0 && m->n_q != m->n_tokens)
        return err_set(code, "proposal: %u distributions for %u tokens", m->n_q, m->n_tokens);
    if (m->q_rows != 0 && m->q_rows != m->n_tokens)
        return err_set(code, "proposal: %u pool rows for %u tokens", m->q_rows, m->n_tokens);
    if (m->q_rows != 0 && m->n_q != 0)
        return err_set(code, "proposal: distributions both in the message and in the pool");
    if (m->q_rows != 0 && (m->q_gen == 0 || m->q_offset % sizeof(float) != 0))
        return err_set(code, "proposal: pool rows at generation %llu, offset %llu",
                       (unsigned long long)m->q_gen, (unsigned long long)m->q_offset);
    for (uint32_t i = 0; i < m->n_q; i++) {
        const msg_draft_q *q = &m->q[i];
        if (q->n < 1 || q->n > MSG_Q_SUPPORT_MAX)
            return err_set(code, "proposal: distribution %u has %u entries, allowed 1..%u", i,
                           q->n, MSG_Q_SUPPORT_MAX);
        for (uint32_t j = 0; j < q->n; j++) {
            if (j > 0 && q->ids[j] <= q->ids[j - 1])
                return err_set(code, "proposal: distribution %u ids are not increasing at %u",
                               i, j);
            if (!isfinite(q->p[j]) || !(q->p[j] > 0.0f))
                return err_set(code, "proposal: distribution %u entry %u is %g, not > 0", i, j,
                               (double)q->p[j]);
        }
    }
    return TD_OK;
}

td_err msg_pack_proposal(msg_buf *out, uint64_t request_id, const msg_proposal *m)
{
    TD_ASSERT(out && m && (m->tokens || m->n_tokens == 0) && (m->q || m->n_q == 0));
    TD_TRY(check_proposal(m, TD_EINVAL));
    msg_writer w;
    msg_write_begin(&w, out, MSG_PROPOSAL, request_id, 7);
    msg_write_uint(&w, m->seq_id);
    msg_write_uint(&w, m->n_past);
    msg_write_u32_array(&w, m->tokens, m->n_tokens);
    msg_write_array(&w, m->n_q);
    for (uint32_t i = 0; i < m->n_q; i++) {
        msg_write_array(&w, 2);
        msg_write_u32_array(&w, m->q[i].ids, m->q[i].n);
        msg_write_f32_bin(&w, m->q[i].p, m->q[i].n);
    }
    msg_write_uint(&w, m->q_gen);
    msg_write_uint(&w, m->q_offset);
    msg_write_uint(&w, m->q_rows);
    return msg_write_end(&w);
}

void msg_free_proposal(msg_proposal *m)
{
    if (!m)
        return;
    for (uint32_t i = 0; m->q && i < m->n_q; i++) {
        free((void *)m->q[i].ids);
        free((void *)m->q[i].p);
    }
    free((void *)m->q);
    free((void *)m->tokens);
    m->q = NULL;
    m->tokens = NULL;
    m->n_q = m->n_tokens = 0;
}

td_err msg_unpack_proposal(const void *buf, size_t len, uint64_t *request_id,
                           msg_proposal *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    uint64_t n_past = 0;
    uint32_t *tokens = NULL, n_q = 0;
    msg_draft_q *q = NULL;
    td_err e;
    msg_reader_init(&r, buf, len, "proposal");
    TD_TRY(msg_read_envelope(&r, MSG_PROPOSAL, 7, &h));
    if ((e = msg_read_uint(&r, "seq_id", UINT64_MAX, &out->seq_id)) ||
        (e = msg_read_uint(&r, "n_past", UINT32_MAX, &n_past)) ||
        (e = msg_read_u32_array(&r, "tokens", 1, MSG_DRAFT_MAX, &tokens, &out->n_tokens)))
        goto fail;
    out->tokens = tokens;
    out->n_past = (uint32_t)n_past;
    if ((e = msg_read_array_len(&r, "q", MSG_DRAFT_MAX, &n_q)))
        goto fail;
    if (n_q) {
        q = calloc(n_q, sizeof *q);
        if (!q) {
            e = err_set(TD_ENOMEM, "proposal: cannot allocate %u distributions", n_q);
            goto fail;
        }
        out->q = q;
        out->n_q = n_q;
    }
    for (uint32_t i = 0; i < n_q; i++) {
        uint32_t *ids = NULL;
        float *p = NULL;
        if ((e = msg_read_array(&r, "q[]", 2)) ||
            (e = msg_read_u32_array(&r, "q[].ids", 1, MSG_Q_SUPPORT_MAX, &ids, &q[i].n)))
            goto fail;
        q[i].ids = ids;
        if ((e = msg_read_f32_bin(&r, "q[].p", q[i].n, &p)))
            goto fail;
        q[i].p = p;
    }
    uint64_t q_rows = 0;
    if ((e = msg_read_uint(&r, "q_gen", UINT64_MAX, &out->q_gen)) ||
        (e = msg_read_uint(&r, "q_offset", KVL_POOL_MAX, &out->q_offset)) ||
        (e = msg_read_uint(&r, "q_rows", MSG_DRAFT_MAX, &q_rows)))
        goto fail;
    out->q_rows = (uint32_t)q_rows;
    if ((e = msg_read_end(&r)) || (e = check_proposal(out, TD_EFORMAT)))
        goto fail;
    msg_put_request_id(request_id, &h);
    return TD_OK;
fail:
    msg_free_proposal(out);
    memset(out, 0, sizeof *out);
    return e;
}

/* --- kv_attach / kv_pools ------------------------------------------------------------------ */

static void write_params(msg_writer *w, const kvl_params *p)
{
    uint32_t v[KVL_N_PARAMS];
    kvl_params_to_array(p, v);
    msg_write_u32_array(w, v, KVL_N_PARAMS);
}

static td_err read_params(msg_reader *r, kvl_params *p)
{
    uint32_t v[KVL_N_PARAMS];
    TD_TRY(msg_read_array(r, "params", KVL_N_PARAMS));
    for (uint32_t i = 0; i < KVL_N_PARAMS; i++) {
        uint64_t x = 0;
        TD_TRY(msg_read_uint(r, "params", UINT32_MAX, &x));
        v[i] = (uint32_t)x;
    }
    kvl_params_from_array(p, v);
    return TD_OK;
}

/* A list of shared-buffer announcements: [[name, generation, kind, size, uuid]...]. */
static void write_announces(msg_writer *w, const msg_shbuf_announce *a, uint32_t n)
{
    msg_write_array(w, n);
    for (uint32_t i = 0; i < n; i++) {
        msg_write_array(w, 5);
        msg_write_str(w, a[i].name);
        msg_write_uint(w, a[i].generation);
        msg_write_uint(w, (uint64_t)a[i].kind);
        msg_write_uint(w, a[i].size);
        msg_write_str(w, a[i].device_uuid);
    }
}

static td_err read_announces(msg_reader *r, const char *what, msg_shbuf_announce *out,
                             uint32_t max, uint32_t *n)
{
    TD_TRY(msg_read_array_len(r, what, max, n));
    for (uint32_t i = 0; i < *n; i++) {
        msg_shbuf_announce *a = &out[i];
        uint64_t kind = 0;
        TD_TRY(msg_read_array(r, what, 5));
        TD_TRY(msg_read_str(r, "name", a->name, sizeof a->name));
        TD_TRY(msg_read_uint(r, "generation", UINT64_MAX, &a->generation));
        TD_TRY(msg_read_uint(r, "kind", MSG_SHBUF_KIND_END - 1, &kind));
        TD_TRY(msg_read_uint(r, "size", UINT64_MAX, &a->size));
        TD_TRY(msg_read_str(r, "device_uuid", a->device_uuid, sizeof a->device_uuid));
        a->kind = (msg_shbuf_kind)kind;
    }
    return TD_OK;
}

static td_err check_kv_attach(const msg_kv_attach *m, td_err code)
{
    if (m->role != MSG_ROLE_VERIFYD && m->role != MSG_ROLE_DRAFTD)
        return err_set(code, "kv_attach: role %d cannot attach", (int)m->role);
    if (m->pid == 0)
        return err_set(code, "kv_attach: pid 0");
    if (m->n_taps > MSG_TAPS_MAX)
        return err_set(code, "kv_attach: %u taps, allowed at most %u", m->n_taps, MSG_TAPS_MAX);
    if (m->n_heads > MSG_HEADS_MAX || (m->n_heads && m->role != MSG_ROLE_VERIFYD))
        return err_set(code, "kv_attach: %u heads from role %d", m->n_heads, (int)m->role);
    if (m->reserve && m->role != MSG_ROLE_VERIFYD)
        return err_set(code, "kv_attach: a reserve from role %d", (int)m->role);
    for (uint32_t i = 0; i < m->n_heads; i++)
        TD_TRY(msg_check_shbuf_announce(&m->heads[i], code));
    return TD_OK;
}

td_err msg_pack_kv_attach(msg_buf *out, uint64_t request_id, const msg_kv_attach *m)
{
    TD_ASSERT(out && m && (m->taps || m->n_taps == 0));
    for (uint32_t i = 0; i < m->n_heads && i < MSG_HEADS_MAX; i++) {
        MSG_ASSERT_TERMINATED(m->heads[i].name);
        MSG_ASSERT_TERMINATED(m->heads[i].device_uuid);
    }
    TD_TRY(check_kv_attach(m, TD_EINVAL));
    msg_writer w;
    msg_write_begin(&w, out, MSG_KV_ATTACH, request_id, 6);
    msg_write_uint(&w, (uint64_t)m->role);
    msg_write_uint(&w, m->pid);
    write_params(&w, &m->params);
    msg_write_u32_array(&w, m->taps, m->n_taps);
    write_announces(&w, m->heads, m->n_heads);
    msg_write_uint(&w, m->reserve);
    return msg_write_end(&w);
}

td_err msg_unpack_kv_attach(const void *buf, size_t len, uint64_t *request_id,
                            msg_kv_attach *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    uint64_t role = 0, pid = 0;
    uint32_t *taps = NULL;
    td_err e;
    msg_reader_init(&r, buf, len, "kv_attach");
    TD_TRY(msg_read_envelope(&r, MSG_KV_ATTACH, 6, &h));
    if ((e = msg_read_uint(&r, "role", MSG_ROLE_END - 1, &role)) ||
        (e = msg_read_uint(&r, "pid", UINT32_MAX, &pid)) ||
        (e = read_params(&r, &out->params)) ||
        (e = msg_read_u32_array(&r, "taps", 0, MSG_TAPS_MAX, &taps, &out->n_taps)) ||
        (e = read_announces(&r, "heads", out->heads, MSG_HEADS_MAX, &out->n_heads)) ||
        (e = msg_read_uint(&r, "reserve", UINT64_MAX, &out->reserve)) ||
        (e = msg_read_end(&r)))
        goto fail;
    out->role = (msg_role)role;
    out->pid = (uint32_t)pid;
    out->taps = taps;
    if ((e = check_kv_attach(out, TD_EFORMAT)))
        goto fail;
    msg_put_request_id(request_id, &h);
    return TD_OK;
fail:
    free(taps);
    memset(out, 0, sizeof *out);
    return e;
}

void msg_free_kv_attach(msg_kv_attach *m)
{
    if (!m)
        return;
    free((void *)m->taps);
    m->taps = NULL;
    m->n_taps = 0;
}

static td_err check_kv_pools(const msg_kv_pools *m, td_err code)
{
    if (m->n_pools < 1 || m->n_pools > MSG_POOLS_MAX)
        return err_set(code, "kv_pools: %u pools, allowed 1..%u", m->n_pools, MSG_POOLS_MAX);
    for (uint32_t i = 0; i < m->n_pools; i++)
        TD_TRY(msg_check_shbuf_announce(&m->pools[i], code));
    return TD_OK;
}

td_err msg_pack_kv_pools(msg_buf *out, uint64_t request_id, const msg_kv_pools *m)
{
    TD_ASSERT(out && m);
    for (uint32_t i = 0; i < m->n_pools && i < MSG_POOLS_MAX; i++) {
        MSG_ASSERT_TERMINATED(m->pools[i].name);
        MSG_ASSERT_TERMINATED(m->pools[i].device_uuid);
    }
    TD_TRY(check_kv_pools(m, TD_EINVAL));
    msg_writer w;
    msg_write_begin(&w, out, MSG_KV_POOLS, request_id, 2);
    write_params(&w, &m->params);
    write_announces(&w, m->pools, m->n_pools);
    return msg_write_end(&w);
}

td_err msg_unpack_kv_pools(const void *buf, size_t len, uint64_t *request_id,
                           msg_kv_pools *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    msg_reader_init(&r, buf, len, "kv_pools");
    TD_TRY(msg_read_envelope(&r, MSG_KV_POOLS, 2, &h));
    TD_TRY(read_params(&r, &out->params));
    TD_TRY(read_announces(&r, "pools", out->pools, MSG_POOLS_MAX, &out->n_pools));
    TD_TRY(msg_read_end(&r));
    TD_TRY(check_kv_pools(out, TD_EFORMAT));
    msg_put_request_id(request_id, &h);
    return TD_OK;
}

/* --- kv_open / kv_slot / kv_close ---------------------------------------------------------- */

td_err msg_pack_kv_open(msg_buf *out, uint64_t request_id, const msg_kv_open *m)
{
    TD_ASSERT(out && m && (m->tokens || m->n_tokens == 0));
    if (m->pid == 0)
        return err_set(TD_EINVAL, "kv_open: pid 0");
    if (m->n_tokens < 1 || m->n_tokens > MSG_TOKENS_MAX)
        return err_set(TD_EINVAL, "kv_open: %u tokens, allowed 1..%u", m->n_tokens,
                       MSG_TOKENS_MAX);
    msg_writer w;
    msg_write_begin(&w, out, MSG_KV_OPEN, request_id, 2);
    msg_write_uint(&w, m->pid);
    msg_write_u32_array(&w, m->tokens, m->n_tokens);
    return msg_write_end(&w);
}

td_err msg_unpack_kv_open(const void *buf, size_t len, uint64_t *request_id, msg_kv_open *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    uint64_t pid = 0;
    uint32_t *tokens = NULL;
    td_err e;
    msg_reader_init(&r, buf, len, "kv_open");
    TD_TRY(msg_read_envelope(&r, MSG_KV_OPEN, 2, &h));
    if ((e = msg_read_uint(&r, "pid", UINT32_MAX, &pid)) ||
        (e = msg_read_u32_array(&r, "tokens", 1, MSG_TOKENS_MAX, &tokens, &out->n_tokens)) ||
        (e = msg_read_end(&r)))
        goto fail;
    if (pid == 0) {
        e = err_set(TD_EFORMAT, "kv_open: pid 0");
        goto fail;
    }
    out->pid = (uint32_t)pid;
    out->tokens = tokens;
    msg_put_request_id(request_id, &h);
    return TD_OK;
fail:
    free(tokens);
    memset(out, 0, sizeof *out);
    return e;
}

void msg_free_kv_open(msg_kv_open *m)
{
    if (!m)
        return;
    free((void *)m->tokens);
    m->tokens = NULL;
    m->n_tokens = 0;
}

td_err msg_pack_kv_slot(msg_buf *out, uint64_t request_id, const msg_kv_slot *m)
{
    TD_ASSERT(out && m);
    msg_writer w;
    msg_write_begin(&w, out, MSG_KV_SLOT, request_id, 4);
    msg_write_uint(&w, m->slot);
    msg_write_uint(&w, m->slot_gen);
    msg_write_uint(&w, m->pool_gen);
    msg_write_uint(&w, m->n_cached);
    return msg_write_end(&w);
}

td_err msg_unpack_kv_slot(const void *buf, size_t len, uint64_t *request_id, msg_kv_slot *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    uint64_t slot = 0, n_cached = 0;
    msg_reader_init(&r, buf, len, "kv_slot");
    TD_TRY(msg_read_envelope(&r, MSG_KV_SLOT, 4, &h));
    TD_TRY(msg_read_uint(&r, "slot", UINT32_MAX, &slot));
    TD_TRY(msg_read_uint(&r, "slot_gen", UINT64_MAX, &out->slot_gen));
    TD_TRY(msg_read_uint(&r, "pool_gen", UINT64_MAX, &out->pool_gen));
    TD_TRY(msg_read_uint(&r, "n_cached", UINT32_MAX, &n_cached));
    TD_TRY(msg_read_end(&r));
    out->slot = (uint32_t)slot;
    out->n_cached = (uint32_t)n_cached;
    msg_put_request_id(request_id, &h);
    return TD_OK;
}

static td_err check_kv_close(const msg_kv_close *m, td_err code)
{
    if (m->n_tokens > MSG_TOKENS_MAX)
        return err_set(code, "kv_close: %u tokens, allowed at most %u", m->n_tokens,
                       MSG_TOKENS_MAX);
    if (!m->keep && m->n_tokens != 0)
        return err_set(code, "kv_close: tokens given for a slot that is not kept");
    return TD_OK;
}

td_err msg_pack_kv_close(msg_buf *out, uint64_t request_id, const msg_kv_close *m)
{
    TD_ASSERT(out && m && (m->tokens || m->n_tokens == 0));
    TD_TRY(check_kv_close(m, TD_EINVAL));
    msg_writer w;
    msg_write_begin(&w, out, MSG_KV_CLOSE, request_id, 4);
    msg_write_uint(&w, m->slot);
    msg_write_uint(&w, m->slot_gen);
    msg_write_bool(&w, m->keep);
    msg_write_u32_array(&w, m->tokens, m->n_tokens);
    return msg_write_end(&w);
}

td_err msg_unpack_kv_close(const void *buf, size_t len, uint64_t *request_id,
                           msg_kv_close *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    uint64_t slot = 0;
    uint32_t *tokens = NULL;
    td_err e;
    msg_reader_init(&r, buf, len, "kv_close");
    TD_TRY(msg_read_envelope(&r, MSG_KV_CLOSE, 4, &h));
    if ((e = msg_read_uint(&r, "slot", UINT32_MAX, &slot)) ||
        (e = msg_read_uint(&r, "slot_gen", UINT64_MAX, &out->slot_gen)) ||
        (e = msg_read_bool(&r, "keep", &out->keep)) ||
        (e = msg_read_u32_array(&r, "tokens", 0, MSG_TOKENS_MAX, &tokens, &out->n_tokens)) ||
        (e = msg_read_end(&r)))
        goto fail;
    out->slot = (uint32_t)slot;
    out->tokens = tokens;
    if ((e = check_kv_close(out, TD_EFORMAT)))
        goto fail;
    msg_put_request_id(request_id, &h);
    return TD_OK;
fail:
    free(tokens);
    memset(out, 0, sizeof *out);
    return e;
}

void msg_free_kv_close(msg_kv_close *m)
{
    if (!m)
        return;
    free((void *)m->tokens);
    m->tokens = NULL;
    m->n_tokens = 0;
}
