/* Control messages: gen_cancel, ack, verifyd's status, and the supervisor's service list and
 * restart request (see msg.h). Same rules as msg.c: one check_<type> shared by pack
 * (TD_EINVAL) and unpack (TD_EFORMAT). */
#include <stdlib.h>
#include <string.h>

#include "common/msg.h"
#include "common/msg_codec.h"

/* --- gen_cancel / ack ---------------------------------------------------------------------- */

td_err msg_pack_gen_cancel(msg_buf *out, uint64_t request_id, const msg_gen_cancel *m)
{
    TD_ASSERT(out && m);
    msg_writer w;
    msg_write_begin(&w, out, MSG_GEN_CANCEL, request_id, 1);
    msg_write_uint(&w, m->seq_id);
    return msg_write_end(&w);
}

td_err msg_unpack_gen_cancel(const void *buf, size_t len, uint64_t *request_id,
                             msg_gen_cancel *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    msg_reader_init(&r, buf, len, "gen_cancel");
    TD_TRY(msg_read_envelope(&r, MSG_GEN_CANCEL, 1, &h));
    TD_TRY(msg_read_uint(&r, "seq_id", UINT64_MAX, &out->seq_id));
    TD_TRY(msg_read_end(&r));
    msg_put_request_id(request_id, &h);
    return TD_OK;
}

td_err msg_pack_ack(msg_buf *out, uint64_t request_id, const msg_ack *m)
{
    TD_ASSERT(out && m);
    msg_writer w;
    msg_write_begin(&w, out, MSG_ACK, request_id, 1);
    msg_write_uint(&w, m->id);
    return msg_write_end(&w);
}

td_err msg_unpack_ack(const void *buf, size_t len, uint64_t *request_id, msg_ack *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    msg_reader_init(&r, buf, len, "ack");
    TD_TRY(msg_read_envelope(&r, MSG_ACK, 1, &h));
    TD_TRY(msg_read_uint(&r, "id", UINT64_MAX, &out->id));
    TD_TRY(msg_read_end(&r));
    msg_put_request_id(request_id, &h);
    return TD_OK;
}

/* --- requests without fields ------------------------------------------------------------- */

static td_err pack_empty(msg_buf *out, msg_type type, uint64_t request_id)
{
    TD_ASSERT(out);
    msg_writer w;
    msg_write_begin(&w, out, type, request_id, 0);
    return msg_write_end(&w);
}

static td_err unpack_empty(const void *buf, size_t len, msg_type type, uint64_t *request_id)
{
    msg_reader r;
    msg_header h;
    msg_reader_init(&r, buf, len, msg_type_name(type));
    TD_TRY(msg_read_envelope(&r, type, 0, &h));
    TD_TRY(msg_read_end(&r));
    msg_put_request_id(request_id, &h);
    return TD_OK;
}

td_err msg_pack_status_get(msg_buf *out, uint64_t request_id)
{
    return pack_empty(out, MSG_STATUS_GET, request_id);
}

td_err msg_unpack_status_get(const void *buf, size_t len, uint64_t *request_id)
{
    return unpack_empty(buf, len, MSG_STATUS_GET, request_id);
}

td_err msg_pack_svc_list_get(msg_buf *out, uint64_t request_id)
{
    return pack_empty(out, MSG_SVC_LIST_GET, request_id);
}

td_err msg_unpack_svc_list_get(const void *buf, size_t len, uint64_t *request_id)
{
    return unpack_empty(buf, len, MSG_SVC_LIST_GET, request_id);
}

/* --- status ------------------------------------------------------------------------------ */

#define STATUS_FIELDS 26

static td_err check_status(const msg_status *m, td_err code)
{
    if (m->n_hist > MSG_ACCEPT_HIST_MAX)
        return err_set(code, "status: %u histogram bins, allowed at most %u", m->n_hist,
                       MSG_ACCEPT_HIST_MAX);
    if (m->cached_tokens > m->prompt_tokens)
        return err_set(code, "status: %llu cached of %llu prompt tokens",
                       (unsigned long long)m->cached_tokens,
                       (unsigned long long)m->prompt_tokens);
    if (m->accepted > m->drafted)
        return err_set(code, "status: %llu of %llu draft tokens accepted",
                       (unsigned long long)m->accepted, (unsigned long long)m->drafted);
    return TD_OK;
}

td_err msg_pack_status(msg_buf *out, uint64_t request_id, const msg_status *m)
{
    TD_ASSERT(out && m);
    MSG_ASSERT_TERMINATED(m->model);
    MSG_ASSERT_TERMINATED(m->not_ready);
    TD_TRY(check_status(m, TD_EINVAL));
    msg_writer w;
    msg_write_begin(&w, out, MSG_STATUS, request_id, STATUS_FIELDS);
    msg_write_str(&w, m->model);
    msg_write_uint(&w, m->n_ctx);
    msg_write_uint(&w, m->n_vocab);
    msg_write_bool(&w, m->ready);
    msg_write_bool(&w, m->draft_attached);
    msg_write_uint(&w, m->block);
    msg_write_uint(&w, m->slots);
    msg_write_uint(&w, m->active);
    msg_write_uint(&w, m->queued);
    msg_write_uint(&w, m->requests);
    msg_write_uint(&w, m->prompt_tokens);
    msg_write_uint(&w, m->cached_tokens);
    msg_write_uint(&w, m->completion_tokens);
    msg_write_uint(&w, m->steps);
    msg_write_uint(&w, m->drafted);
    msg_write_uint(&w, m->accepted);
    msg_write_uint(&w, m->prefill_us);
    msg_write_uint(&w, m->draft_us);
    msg_write_uint(&w, m->verify_us);
    msg_write_uint(&w, m->draft_attaches);
    msg_write_uint(&w, m->draft_failures);
    msg_write_uint(&w, m->graph_recorded);
    msg_write_uint(&w, m->graph_replayed);
    msg_write_uint(&w, m->graph_direct);
    msg_write_str(&w, m->not_ready);
    msg_write_array(&w, m->n_hist);
    for (uint32_t i = 0; i < m->n_hist; i++)
        msg_write_uint(&w, m->accept_hist[i]);
    return msg_write_end(&w);
}

td_err msg_unpack_status(const void *buf, size_t len, uint64_t *request_id, msg_status *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    uint64_t v[6] = {0};
    msg_reader_init(&r, buf, len, "status");
    TD_TRY(msg_read_envelope(&r, MSG_STATUS, STATUS_FIELDS, &h));
    TD_TRY(msg_read_str(&r, "model", out->model, sizeof out->model));
    TD_TRY(msg_read_uint(&r, "n_ctx", UINT32_MAX, &v[0]));
    TD_TRY(msg_read_uint(&r, "n_vocab", UINT32_MAX, &v[1]));
    TD_TRY(msg_read_bool(&r, "ready", &out->ready));
    TD_TRY(msg_read_bool(&r, "draft_attached", &out->draft_attached));
    TD_TRY(msg_read_uint(&r, "block", UINT32_MAX, &v[2]));
    TD_TRY(msg_read_uint(&r, "slots", UINT32_MAX, &v[3]));
    TD_TRY(msg_read_uint(&r, "active", UINT32_MAX, &v[4]));
    TD_TRY(msg_read_uint(&r, "queued", UINT32_MAX, &v[5]));
    TD_TRY(msg_read_uint(&r, "requests", UINT64_MAX, &out->requests));
    TD_TRY(msg_read_uint(&r, "prompt_tokens", UINT64_MAX, &out->prompt_tokens));
    TD_TRY(msg_read_uint(&r, "cached_tokens", UINT64_MAX, &out->cached_tokens));
    TD_TRY(msg_read_uint(&r, "completion_tokens", UINT64_MAX, &out->completion_tokens));
    TD_TRY(msg_read_uint(&r, "steps", UINT64_MAX, &out->steps));
    TD_TRY(msg_read_uint(&r, "drafted", UINT64_MAX, &out->drafted));
    TD_TRY(msg_read_uint(&r, "accepted", UINT64_MAX, &out->accepted));
    TD_TRY(msg_read_uint(&r, "prefill_us", UINT64_MAX, &out->prefill_us));
    TD_TRY(msg_read_uint(&r, "draft_us", UINT64_MAX, &out->draft_us));
    TD_TRY(msg_read_uint(&r, "verify_us", UINT64_MAX, &out->verify_us));
    TD_TRY(msg_read_uint(&r, "draft_attaches", UINT64_MAX, &out->draft_attaches));
    TD_TRY(msg_read_uint(&r, "draft_failures", UINT64_MAX, &out->draft_failures));
    TD_TRY(msg_read_uint(&r, "graph_recorded", UINT64_MAX, &out->graph_recorded));
    TD_TRY(msg_read_uint(&r, "graph_replayed", UINT64_MAX, &out->graph_replayed));
    TD_TRY(msg_read_uint(&r, "graph_direct", UINT64_MAX, &out->graph_direct));
    TD_TRY(msg_read_str(&r, "not_ready", out->not_ready, sizeof out->not_ready));
    TD_TRY(msg_read_array_len(&r, "accept_hist", MSG_ACCEPT_HIST_MAX, &out->n_hist));
    for (uint32_t i = 0; i < out->n_hist; i++)
        TD_TRY(msg_read_uint(&r, "accept_hist", UINT64_MAX, &out->accept_hist[i]));
    TD_TRY(msg_read_end(&r));
    out->n_ctx = (uint32_t)v[0];
    out->n_vocab = (uint32_t)v[1];
    out->block = (uint32_t)v[2];
    out->slots = (uint32_t)v[3];
    out->active = (uint32_t)v[4];
    out->queued = (uint32_t)v[5];
    TD_TRY(check_status(out, TD_EFORMAT));
    msg_put_request_id(request_id, &h);
    return TD_OK;
}

/* --- svc_list / svc_restart -------------------------------------------------------------- */

static td_err check_svc_name(const char *what, const char *name, td_err code)
{
    if (name[0] == '\0')
        return err_set(code, "%s: empty service name", what);
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_' || *c == '-'))
            return err_set(code, "%s: service name \"%s\" has a character outside [a-z0-9_-]",
                           what, name);
    return TD_OK;
}

static td_err check_svc_list(const msg_svc_list *m, td_err code)
{
    if (m->n > MSG_SVC_MAX)
        return err_set(code, "svc_list: %u services, allowed at most %u", m->n, MSG_SVC_MAX);
    for (uint32_t i = 0; i < m->n; i++)
        TD_TRY(check_svc_name("svc_list", m->svc[i].name, code));
    return TD_OK;
}

td_err msg_pack_svc_list(msg_buf *out, uint64_t request_id, const msg_svc_list *m)
{
    TD_ASSERT(out && m);
    for (uint32_t i = 0; i < m->n && i < MSG_SVC_MAX; i++)
        MSG_ASSERT_TERMINATED(m->svc[i].name);
    TD_TRY(check_svc_list(m, TD_EINVAL));
    msg_writer w;
    msg_write_begin(&w, out, MSG_SVC_LIST, request_id, 1);
    msg_write_array(&w, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        msg_write_array(&w, 4);
        msg_write_str(&w, m->svc[i].name);
        msg_write_uint(&w, m->svc[i].pid);
        msg_write_uint(&w, m->svc[i].uptime_ms);
        msg_write_uint(&w, m->svc[i].restarts);
    }
    return msg_write_end(&w);
}

td_err msg_unpack_svc_list(const void *buf, size_t len, uint64_t *request_id,
                           msg_svc_list *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    msg_reader_init(&r, buf, len, "svc_list");
    TD_TRY(msg_read_envelope(&r, MSG_SVC_LIST, 1, &h));
    TD_TRY(msg_read_array_len(&r, "services", MSG_SVC_MAX, &out->n));
    for (uint32_t i = 0; i < out->n; i++) {
        msg_svc *s = &out->svc[i];
        uint64_t pid = 0, restarts = 0;
        TD_TRY(msg_read_array(&r, "services[]", 4));
        TD_TRY(msg_read_str(&r, "services[].name", s->name, sizeof s->name));
        TD_TRY(msg_read_uint(&r, "services[].pid", UINT32_MAX, &pid));
        TD_TRY(msg_read_uint(&r, "services[].uptime_ms", UINT64_MAX, &s->uptime_ms));
        TD_TRY(msg_read_uint(&r, "services[].restarts", UINT32_MAX, &restarts));
        s->pid = (uint32_t)pid;
        s->restarts = (uint32_t)restarts;
    }
    TD_TRY(msg_read_end(&r));
    TD_TRY(check_svc_list(out, TD_EFORMAT));
    msg_put_request_id(request_id, &h);
    return TD_OK;
}

td_err msg_pack_svc_restart(msg_buf *out, uint64_t request_id, const msg_svc_restart *m)
{
    TD_ASSERT(out && m);
    MSG_ASSERT_TERMINATED(m->name);
    MSG_ASSERT_TERMINATED(m->draft);
    TD_TRY(check_svc_name("svc_restart", m->name, TD_EINVAL));
    msg_writer w;
    msg_write_begin(&w, out, MSG_SVC_RESTART, request_id, 2);
    msg_write_str(&w, m->name);
    msg_write_str(&w, m->draft);
    return msg_write_end(&w);
}

td_err msg_unpack_svc_restart(const void *buf, size_t len, uint64_t *request_id,
                              msg_svc_restart *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    msg_reader_init(&r, buf, len, "svc_restart");
    TD_TRY(msg_read_envelope(&r, MSG_SVC_RESTART, 2, &h));
    TD_TRY(msg_read_str(&r, "name", out->name, sizeof out->name));
    TD_TRY(msg_read_str(&r, "draft", out->draft, sizeof out->draft));
    TD_TRY(msg_read_end(&r));
    TD_TRY(check_svc_name("svc_restart", out->name, TD_EFORMAT));
    msg_put_request_id(request_id, &h);
    return TD_OK;
}
