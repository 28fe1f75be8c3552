/* The message types: one pack and one unpack per type, built from the codec in msg_codec.c.
 * Each type's value rules live in one check_<type> function that pack (TD_EINVAL: our own
 * bug or bad data from further up) and unpack (TD_EFORMAT: a bad peer) both call. */
#include "common/msg.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/msg_codec.h"

static const char *const type_names[MSG_TYPE_END] = {
    [MSG_HELLO] = "hello",
    [MSG_PING] = "ping",
    [MSG_PONG] = "pong",
    [MSG_ERROR] = "error",
    [MSG_SHBUF_ANNOUNCE] = "shbuf_announce",
    [MSG_GEN_START] = "gen_start",
    [MSG_GEN_EVENT] = "gen_event",
    [MSG_GEN_CANCEL] = "gen_cancel",
    [MSG_ACK] = "ack",
    [MSG_STATUS_GET] = "status_get",
    [MSG_STATUS] = "status",
    [MSG_PROPOSE] = "propose",
    [MSG_PROPOSAL] = "proposal",
    [MSG_KV_ATTACH] = "kv_attach",
    [MSG_KV_POOLS] = "kv_pools",
    [MSG_KV_OPEN] = "kv_open",
    [MSG_KV_SLOT] = "kv_slot",
    [MSG_KV_CLOSE] = "kv_close",
    [MSG_SVC_LIST_GET] = "svc_list_get",
    [MSG_SVC_LIST] = "svc_list",
    [MSG_SVC_RESTART] = "svc_restart",
};

const char *msg_type_name(msg_type type)
{
    if ((int)type <= 0 || type >= MSG_TYPE_END || !type_names[type])
        return "unknown";
    return type_names[type];
}

td_err msg_unpack_header(const void *buf, size_t len, msg_header *hdr)
{
    TD_ASSERT(hdr);
    msg_reader r;
    msg_reader_init(&r, buf, len, "message");
    return msg_read_envelope(&r, 0, 0, hdr);
}

/* An inline char array must hold its NUL: anything else is a caller's bug. */
#define ASSERT_TERMINATED(arr) TD_ASSERT(memchr((arr), 0, sizeof(arr)) != NULL)

static void set_request_id(uint64_t *dst, const msg_header *h)
{
    if (dst)
        *dst = h->request_id;
}

/* --- hello ------------------------------------------------------------------------------- */

static td_err check_hello(const msg_hello *m, td_err code)
{
    if (m->role < MSG_ROLE_GATEWAY || m->role >= MSG_ROLE_END)
        return err_set(code, "hello: unknown role %d", (int)m->role);
    if (m->pid == 0)
        return err_set(code, "hello: pid 0");
    if (m->protocol != MSG_PROTOCOL_VERSION)
        return err_set(code == TD_EFORMAT ? TD_EPROTO : code,
                       "hello: peer speaks protocol version %u; this build speaks version %u",
                       m->protocol, MSG_PROTOCOL_VERSION);
    return TD_OK;
}

td_err msg_pack_hello(msg_buf *out, uint64_t request_id, const msg_hello *m)
{
    TD_ASSERT(out && m);
    ASSERT_TERMINATED(m->build_id);
    TD_TRY(check_hello(m, TD_EINVAL));
    msg_writer w;
    msg_write_begin(&w, out, MSG_HELLO, request_id, 4);
    msg_write_uint(&w, (uint64_t)m->role);
    msg_write_uint(&w, m->pid);
    msg_write_uint(&w, m->protocol);
    msg_write_str(&w, m->build_id);
    return msg_write_end(&w);
}

td_err msg_unpack_hello(const void *buf, size_t len, uint64_t *request_id, msg_hello *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    uint64_t role = 0, pid = 0, protocol = 0;
    msg_reader_init(&r, buf, len, "hello");
    TD_TRY(msg_read_envelope(&r, MSG_HELLO, 4, &h));
    TD_TRY(msg_read_uint(&r, "role", MSG_ROLE_END - 1, &role));
    TD_TRY(msg_read_uint(&r, "pid", UINT32_MAX, &pid));
    TD_TRY(msg_read_uint(&r, "protocol", UINT16_MAX, &protocol));
    TD_TRY(msg_read_str(&r, "build_id", out->build_id, sizeof out->build_id));
    TD_TRY(msg_read_end(&r));
    out->role = (msg_role)role;
    out->pid = (uint32_t)pid;
    out->protocol = (uint16_t)protocol;
    TD_TRY(check_hello(out, TD_EFORMAT));
    set_request_id(request_id, &h);
    return TD_OK;
}

/* --- ping / pong ------------------------------------------------------------------------- */

static td_err pack_ping_like(msg_buf *out, msg_type type, uint64_t request_id, const msg_ping *m)
{
    TD_ASSERT(out && m && (m->data || m->data_len == 0));
    if (m->data_len > MSG_PING_DATA_MAX)
        return err_set(TD_EINVAL, "%s: %u data bytes exceed the limit of %u",
                       msg_type_name(type), m->data_len, MSG_PING_DATA_MAX);
    msg_writer w;
    msg_write_begin(&w, out, type, request_id, 2);
    msg_write_uint(&w, m->nonce);
    msg_write_bin(&w, m->data, m->data_len);
    return msg_write_end(&w);
}

static td_err unpack_ping_like(const void *buf, size_t len, msg_type type, uint64_t *request_id,
                               msg_ping *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    msg_reader_init(&r, buf, len, msg_type_name(type));
    TD_TRY(msg_read_envelope(&r, type, 2, &h));
    TD_TRY(msg_read_uint(&r, "nonce", UINT64_MAX, &out->nonce));
    TD_TRY(msg_read_bin(&r, "data", MSG_PING_DATA_MAX, &out->data, &out->data_len));
    TD_TRY(msg_read_end(&r));
    set_request_id(request_id, &h);
    return TD_OK;
}

td_err msg_pack_ping(msg_buf *out, uint64_t request_id, const msg_ping *m)
{
    return pack_ping_like(out, MSG_PING, request_id, m);
}

td_err msg_unpack_ping(const void *buf, size_t len, uint64_t *request_id, msg_ping *out)
{
    return unpack_ping_like(buf, len, MSG_PING, request_id, out);
}

td_err msg_pack_pong(msg_buf *out, uint64_t request_id, const msg_ping *m)
{
    return pack_ping_like(out, MSG_PONG, request_id, m);
}

td_err msg_unpack_pong(const void *buf, size_t len, uint64_t *request_id, msg_ping *out)
{
    return unpack_ping_like(buf, len, MSG_PONG, request_id, out);
}

/* --- error ------------------------------------------------------------------------------- */

static td_err check_error(const msg_error *m, td_err code)
{
    if (m->code <= TD_OK || m->code >= TD_ERR_COUNT)
        return err_set(code, "error: code %d is not an error", (int)m->code);
    return TD_OK;
}

td_err msg_pack_error(msg_buf *out, uint64_t request_id, const msg_error *m)
{
    TD_ASSERT(out && m);
    ASSERT_TERMINATED(m->message);
    TD_TRY(check_error(m, TD_EINVAL));
    msg_writer w;
    msg_write_begin(&w, out, MSG_ERROR, request_id, 2);
    msg_write_uint(&w, (uint64_t)m->code);
    msg_write_str(&w, m->message);
    return msg_write_end(&w);
}

td_err msg_unpack_error(const void *buf, size_t len, uint64_t *request_id, msg_error *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    uint64_t code = 0;
    msg_reader_init(&r, buf, len, "error");
    TD_TRY(msg_read_envelope(&r, MSG_ERROR, 2, &h));
    TD_TRY(msg_read_uint(&r, "code", TD_ERR_COUNT - 1, &code));
    TD_TRY(msg_read_str(&r, "message", out->message, sizeof out->message));
    TD_TRY(msg_read_end(&r));
    out->code = (td_err)code;
    TD_TRY(check_error(out, TD_EFORMAT));
    set_request_id(request_id, &h);
    return TD_OK;
}

/* --- shbuf_announce ---------------------------------------------------------------------- */

td_err msg_check_shbuf_announce(const msg_shbuf_announce *m, td_err code)
{
    if (m->name[0] == '\0')
        return err_set(code, "shbuf_announce: empty buffer name");
    if (m->kind < MSG_SHBUF_CPU || m->kind >= MSG_SHBUF_KIND_END)
        return err_set(code, "shbuf_announce %s: unknown kind %d", m->name, (int)m->kind);
    if (m->size == 0)
        return err_set(code, "shbuf_announce %s: size 0", m->name);
    if (m->kind == MSG_SHBUF_CUDA && m->device_uuid[0] == '\0')
        return err_set(code, "shbuf_announce %s: cuda buffer without a device UUID", m->name);
    if (m->kind == MSG_SHBUF_CPU && m->device_uuid[0] != '\0')
        return err_set(code, "shbuf_announce %s: cpu buffer with a device UUID", m->name);
    return TD_OK;
}

td_err msg_pack_shbuf_announce(msg_buf *out, uint64_t request_id, const msg_shbuf_announce *m)
{
    TD_ASSERT(out && m);
    ASSERT_TERMINATED(m->name);
    ASSERT_TERMINATED(m->device_uuid);
    TD_TRY(msg_check_shbuf_announce(m, TD_EINVAL));
    msg_writer w;
    msg_write_begin(&w, out, MSG_SHBUF_ANNOUNCE, request_id, 5);
    msg_write_str(&w, m->name);
    msg_write_uint(&w, m->generation);
    msg_write_uint(&w, (uint64_t)m->kind);
    msg_write_uint(&w, m->size);
    msg_write_str(&w, m->device_uuid);
    return msg_write_end(&w);
}

td_err msg_unpack_shbuf_announce(const void *buf, size_t len, uint64_t *request_id,
                                 msg_shbuf_announce *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    uint64_t kind = 0;
    msg_reader_init(&r, buf, len, "shbuf_announce");
    TD_TRY(msg_read_envelope(&r, MSG_SHBUF_ANNOUNCE, 5, &h));
    TD_TRY(msg_read_str(&r, "name", out->name, sizeof out->name));
    TD_TRY(msg_read_uint(&r, "generation", UINT64_MAX, &out->generation));
    TD_TRY(msg_read_uint(&r, "kind", MSG_SHBUF_KIND_END - 1, &kind));
    TD_TRY(msg_read_uint(&r, "size", UINT64_MAX, &out->size));
    TD_TRY(msg_read_str(&r, "device_uuid", out->device_uuid, sizeof out->device_uuid));
    TD_TRY(msg_read_end(&r));
    out->kind = (msg_shbuf_kind)kind;
    TD_TRY(msg_check_shbuf_announce(out, TD_EFORMAT));
    set_request_id(request_id, &h);
    return TD_OK;
}

/* --- sampler (a nested array, shared by every message that carries sampler settings) ----- */

#define SAMPLER_FIELDS 5

td_err msg_check_sampler(const char *what, const msg_sampler *s, td_err code)
{
    if (!isfinite(s->temperature) || s->temperature < 0.0f)
        return err_set(code, "%s: temperature %g is not >= 0", what, (double)s->temperature);
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f))
        return err_set(code, "%s: top_p %g is not in (0, 1]", what, (double)s->top_p);
    if (!(s->min_p >= 0.0f && s->min_p <= 1.0f))
        return err_set(code, "%s: min_p %g is not in [0, 1]", what, (double)s->min_p);
    return TD_OK;
}

void msg_write_sampler(msg_writer *w, const msg_sampler *s)
{
    msg_write_array(w, SAMPLER_FIELDS);
    msg_write_f32(w, s->temperature);
    msg_write_uint(w, s->top_k);
    msg_write_f32(w, s->top_p);
    msg_write_f32(w, s->min_p);
    msg_write_uint(w, s->seed);
}

td_err msg_read_sampler(msg_reader *r, msg_sampler *s)
{
    uint64_t top_k = 0;
    TD_TRY(msg_read_array(r, "sampler", SAMPLER_FIELDS));
    TD_TRY(msg_read_f32(r, "sampler.temperature", &s->temperature));
    TD_TRY(msg_read_uint(r, "sampler.top_k", UINT32_MAX, &top_k));
    TD_TRY(msg_read_f32(r, "sampler.top_p", &s->top_p));
    TD_TRY(msg_read_f32(r, "sampler.min_p", &s->min_p));
    TD_TRY(msg_read_uint(r, "sampler.seed", UINT64_MAX, &s->seed));
    s->top_k = (uint32_t)top_k;
    return TD_OK;
}

/* --- gen_start --------------------------------------------------------------------------- */

static td_err check_gen_start(const msg_gen_start *m, td_err code)
{
    if (m->n_prompt < 1 || m->n_prompt > MSG_PROMPT_MAX)
        return err_set(code, "gen_start: %u prompt tokens, allowed 1..%u", m->n_prompt,
                       MSG_PROMPT_MAX);
    if (m->n_stop > MSG_STOP_MAX)
        return err_set(code, "gen_start: %u stop tokens, allowed at most %u", m->n_stop,
                       MSG_STOP_MAX);
    if (m->n_predict > MSG_PREDICT_MAX)
        return err_set(code, "gen_start: a prediction of %u tokens, allowed at most %u",
                       m->n_predict, MSG_PREDICT_MAX);
    for (uint32_t i = 0; i < m->n_bad; i += 1 + m->bad[i])
        if (m->bad[i] < 1 || m->bad[i] > MSG_BAD_LEN_MAX || m->bad[i] >= m->n_bad - i)
            return err_set(code, "gen_start: bad word at entry %u: %u tokens in %u entries left "
                           "(1..%u tokens each)", i, m->bad[i], m->n_bad - i - 1,
                           MSG_BAD_LEN_MAX);
    if (m->n_bad > MSG_BAD_MAX)
        return err_set(code, "gen_start: %u bad-word entries, at most %u", m->n_bad,
                       MSG_BAD_MAX);
    if (m->n_allowed > MSG_ALLOWED_MAX)
        return err_set(code, "gen_start: %u allowed tokens, at most %u", m->n_allowed,
                       MSG_ALLOWED_MAX);
    if (m->top_logprobs > MSG_TOP_LOGPROBS_MAX)
        return err_set(code, "gen_start: top_logprobs %u, allowed at most %u", m->top_logprobs,
                       MSG_TOP_LOGPROBS_MAX);
    if (m->top_logprobs > 0 && !m->logprobs && !m->prompt_logprobs)
        return err_set(code, "gen_start: top_logprobs %u without logprobs", m->top_logprobs);
    if (!(fabsf(m->presence_penalty) <= MSG_PENALTY_MAX) ||
        !(fabsf(m->frequency_penalty) <= MSG_PENALTY_MAX))
        return err_set(code, "gen_start: presence penalty %g / frequency penalty %g, allowed "
                       "-%g..%g", (double)m->presence_penalty, (double)m->frequency_penalty,
                       (double)MSG_PENALTY_MAX, (double)MSG_PENALTY_MAX);
    if (m->n_bias > MSG_BIAS_MAX)
        return err_set(code, "gen_start: %u logit bias entries, allowed at most %u", m->n_bias,
                       MSG_BIAS_MAX);
    for (uint32_t i = 0; i < m->n_bias; i++)
        if (!(fabsf(m->bias[i]) <= MSG_BIAS_VALUE_MAX))
            return err_set(code, "gen_start: logit bias %g for token %u, allowed -%g..%g",
                           (double)m->bias[i], m->bias_tok[i], (double)MSG_BIAS_VALUE_MAX,
                           (double)MSG_BIAS_VALUE_MAX);
    if ((uint32_t)m->format >= MSG_FORMAT_END)
        return err_set(code, "gen_start: format %u unknown", (unsigned)m->format);
    if (((m->format == MSG_FORMAT_JSON_SCHEMA || m->format == MSG_FORMAT_TOOLS ||
          m->format == MSG_FORMAT_CHOICE || m->format == MSG_FORMAT_GRAMMAR ||
          m->format == MSG_FORMAT_REGEX || m->format == MSG_FORMAT_JSON_SCHEMA_COMPACT ||
          m->format == MSG_FORMAT_TAGS) &&
         m->n_schema == 0) ||
        (m->n_schema > 0 && (m->format == MSG_FORMAT_TEXT ||
                             m->format == MSG_FORMAT_JSON_OBJECT ||
                             m->format == MSG_FORMAT_JSON_OBJECT_COMPACT)) ||
        m->n_schema > MSG_SCHEMA_MAX)
        return err_set(code, "gen_start: a schema of %u bytes with format %u (a JSON schema, "
                       "the tools format, a choice, a grammar, a regular expression or tags need "
                       "1..%u bytes, a required tool call "
                       "may have a tool spec, text and JSON objects none)", m->n_schema,
                       (unsigned)m->format, MSG_SCHEMA_MAX);
    if (!(m->repetition_penalty >= 0 && m->repetition_penalty <= MSG_REPETITION_MAX))
        return err_set(code, "gen_start: repetition penalty %g, allowed 0 (none) or up to %g",
                       (double)m->repetition_penalty, (double)MSG_REPETITION_MAX);
    if (m->format != MSG_FORMAT_TEXT && m->think_end == MSG_TOKEN_NONE &&
        (m->think_open || m->think_start != MSG_TOKEN_NONE))
        return err_set(code, "gen_start: a reasoning block with no token to end it");
    return msg_check_sampler("gen_start", &m->sampler, code);
}

td_err msg_pack_gen_start(msg_buf *out, uint64_t request_id, const msg_gen_start *m)
{
    TD_ASSERT(out && m && (m->n_bias == 0 || (m->bias_tok && m->bias)));
    TD_TRY(check_gen_start(m, TD_EINVAL));
    TD_ASSERT(m->prompt && (m->stop || m->n_stop == 0) && (m->schema || m->n_schema == 0) &&
              (m->predict || m->n_predict == 0) && (m->allowed || m->n_allowed == 0) &&
              (m->bad || m->n_bad == 0));
    msg_writer w;
    msg_write_begin(&w, out, MSG_GEN_START, request_id, 23);
    msg_write_uint(&w, m->seq_id);
    msg_write_u32_array(&w, m->prompt, m->n_prompt);
    msg_write_uint(&w, m->max_tokens);
    msg_write_sampler(&w, &m->sampler);
    msg_write_u32_array(&w, m->stop, m->n_stop);
    msg_write_bool(&w, m->logprobs);
    msg_write_uint(&w, m->top_logprobs);
    msg_write_bool(&w, m->ignore_eos);
    msg_write_f32(&w, m->presence_penalty);
    msg_write_f32(&w, m->frequency_penalty);
    msg_write_u32_array(&w, m->bias_tok, m->n_bias);
    msg_write_f32_bin(&w, m->bias, m->n_bias);
    msg_write_uint(&w, (uint64_t)m->format);
    msg_write_bin(&w, (const uint8_t *)m->schema, m->n_schema);
    msg_write_bool(&w, m->think_open);
    msg_write_uint(&w, m->think_start);
    msg_write_uint(&w, m->think_end);
    msg_write_f32(&w, m->repetition_penalty);
    msg_write_uint(&w, m->min_tokens);
    msg_write_bool(&w, m->prompt_logprobs);
    msg_write_u32_array(&w, m->predict, m->n_predict);
    msg_write_u32_array(&w, m->allowed, m->n_allowed);
    msg_write_u32_array(&w, m->bad, m->n_bad);
    return msg_write_end(&w);
}

td_err msg_unpack_gen_start(const void *buf, size_t len, uint64_t *request_id,
                            msg_gen_start *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    uint64_t max_tokens = 0, top_logprobs = 0, format = 0, think_start = 0, think_end = 0;
    uint64_t min_tokens = 0;
    uint32_t *prompt = NULL, *stop = NULL, *bias_tok = NULL, *predict = NULL, *allowed = NULL;
    uint32_t *bad = NULL;
    float *bias = NULL;
    char *schema = NULL;
    const uint8_t *schema_in = NULL;
    td_err e;
    msg_reader_init(&r, buf, len, "gen_start");
    TD_TRY(msg_read_envelope(&r, MSG_GEN_START, 23, &h));
    if ((e = msg_read_uint(&r, "seq_id", UINT64_MAX, &out->seq_id)) ||
        (e = msg_read_u32_array(&r, "prompt", 1, MSG_PROMPT_MAX, &prompt, &out->n_prompt)) ||
        (e = msg_read_uint(&r, "max_tokens", UINT32_MAX, &max_tokens)) ||
        (e = msg_read_sampler(&r, &out->sampler)) ||
        (e = msg_read_u32_array(&r, "stop", 0, MSG_STOP_MAX, &stop, &out->n_stop)) ||
        (e = msg_read_bool(&r, "logprobs", &out->logprobs)) ||
        (e = msg_read_uint(&r, "top_logprobs", MSG_TOP_LOGPROBS_MAX, &top_logprobs)) ||
        (e = msg_read_bool(&r, "ignore_eos", &out->ignore_eos)) ||
        (e = msg_read_f32(&r, "presence_penalty", &out->presence_penalty)) ||
        (e = msg_read_f32(&r, "frequency_penalty", &out->frequency_penalty)) ||
        (e = msg_read_u32_array(&r, "bias_tok", 0, MSG_BIAS_MAX, &bias_tok, &out->n_bias)) ||
        (e = msg_read_f32_bin(&r, "bias", out->n_bias, &bias)) ||
        (e = msg_read_uint(&r, "format", MSG_FORMAT_END - 1, &format)) ||
        (e = msg_read_bin(&r, "schema", MSG_SCHEMA_MAX, &schema_in, &out->n_schema)) ||
        (e = msg_read_bool(&r, "think_open", &out->think_open)) ||
        (e = msg_read_uint(&r, "think_start", MSG_TOKEN_NONE, &think_start)) ||
        (e = msg_read_uint(&r, "think_end", MSG_TOKEN_NONE, &think_end)) ||
        (e = msg_read_f32(&r, "repetition_penalty", &out->repetition_penalty)) ||
        (e = msg_read_uint(&r, "min_tokens", UINT32_MAX, &min_tokens)) ||
        (e = msg_read_bool(&r, "prompt_logprobs", &out->prompt_logprobs)) ||
        (e = msg_read_u32_array(&r, "predict", 0, MSG_PREDICT_MAX, &predict, &out->n_predict)) ||
        (e = msg_read_u32_array(&r, "allowed", 0, MSG_ALLOWED_MAX, &allowed, &out->n_allowed)) ||
        (e = msg_read_u32_array(&r, "bad", 0, MSG_BAD_MAX, &bad, &out->n_bad)) ||
        (e = msg_read_end(&r)))
        goto fail;
    if (out->n_schema > 0) {
        if (!(schema = malloc(out->n_schema + 1))) {
            e = err_set(TD_ENOMEM, "gen_start: out of memory for a schema of %u bytes",
                        out->n_schema);
            goto fail;
        }
        memcpy(schema, schema_in, out->n_schema);
        schema[out->n_schema] = 0;
    }
    out->schema = schema;
    out->format = (msg_format)format;
    out->think_start = (uint32_t)think_start;
    out->think_end = (uint32_t)think_end;
    out->min_tokens = (uint32_t)min_tokens;
    out->prompt = prompt;
    out->predict = predict;
    out->allowed = allowed;
    out->bad = bad;
    out->stop = stop;
    out->bias_tok = bias_tok;
    out->bias = bias;
    out->max_tokens = (uint32_t)max_tokens;
    out->top_logprobs = (uint32_t)top_logprobs;
    if ((e = check_gen_start(out, TD_EFORMAT)))
        goto fail;
    set_request_id(request_id, &h);
    return TD_OK;
fail:
    free(prompt);
    free(predict);
    free(allowed);
    free(bad);
    free(stop);
    free(bias_tok);
    free(bias);
    free(schema);
    memset(out, 0, sizeof *out);
    return e;
}

void msg_free_gen_start(msg_gen_start *m)
{
    if (!m)
        return;
    free((void *)m->prompt);
    free((void *)m->predict);
    free((void *)m->allowed);
    free((void *)m->bad);
    free((void *)m->stop);
    free((void *)m->bias_tok);
    free((void *)m->bias);
    free((void *)m->schema);
    m->prompt = m->stop = m->bias_tok = m->predict = m->allowed = m->bad = NULL;
    m->bias = NULL;
    m->schema = NULL;
    m->n_prompt = m->n_stop = m->n_bias = m->n_schema = m->n_predict = m->n_allowed = 0;
    m->n_bad = 0;
}

/* --- gen_event --------------------------------------------------------------------------- */

static td_err check_gen_event(const msg_gen_event *m, td_err code)
{
    if (m->kind < MSG_EVENT_TOKEN || m->kind >= MSG_EVENT_KIND_END)
        return err_set(code, "gen_event: unknown kind %d", (int)m->kind);
    if ((int)m->finish < 0 || m->finish >= MSG_FINISH_END)
        return err_set(code, "gen_event: unknown finish reason %d", (int)m->finish);
    if ((int)m->code < 0 || m->code >= TD_ERR_COUNT)
        return err_set(code, "gen_event: unknown error code %d", (int)m->code);
    if (m->n_tokens > MSG_EVENT_TOKENS_MAX)
        return err_set(code, "gen_event: %u tokens, allowed at most %u", m->n_tokens,
                       MSG_EVENT_TOKENS_MAX);
    bool is_error = m->kind == MSG_EVENT_ERROR;
    bool finish_ok = m->kind == MSG_EVENT_DONE    ? (m->finish != MSG_FINISH_NONE &&
                                                       m->finish != MSG_FINISH_ERROR)
                     : m->kind == MSG_EVENT_ERROR ? m->finish == MSG_FINISH_ERROR
                                                  : m->finish == MSG_FINISH_NONE;
    if (!finish_ok)
        return err_set(code, "gen_event: finish reason %d does not fit event kind %d",
                       (int)m->finish, (int)m->kind);
    if (is_error != (m->code != TD_OK))
        return err_set(code, "gen_event: error code %d with event kind %d", (int)m->code,
                       (int)m->kind);
    if (!is_error && m->message[0] != '\0')
        return err_set(code, "gen_event: message on a non-error event");
    if (m->usage.cached_tokens > m->usage.prompt_tokens)
        return err_set(code, "gen_event: %u cached tokens of a %u-token prompt",
                       m->usage.cached_tokens, m->usage.prompt_tokens);
    if ((m->n_logprobs != 0 || m->kind == MSG_EVENT_PROMPT) && m->n_logprobs != m->n_tokens)
        return err_set(code, "gen_event: %u logprobs for %u tokens", m->n_logprobs,
                       m->n_tokens);
    for (uint32_t i = 0; i < m->n_logprobs; i++) {
        const msg_logprob *lp = &m->logprobs[i];
        if (lp->n_top > MSG_TOP_LOGPROBS_MAX)
            return err_set(code, "gen_event: token %u has %u alternatives, allowed at most %u",
                           i, lp->n_top, MSG_TOP_LOGPROBS_MAX);
        if (!(lp->logprob <= 0.0f))
            return err_set(code, "gen_event: token %u has log probability %g > 0", i,
                           (double)lp->logprob);
        if (lp->rank > INT32_MAX)
            return err_set(code, "gen_event: token %u has rank %u", i, lp->rank);
        for (uint32_t j = 0; j < lp->n_top; j++)
            if (!(lp->top_logprob[j] <= 0.0f))
                return err_set(code, "gen_event: token %u alternative %u has log probability %g",
                               i, j, (double)lp->top_logprob[j]);
    }
    return TD_OK;
}

static td_err read_logprobs(msg_reader *r, msg_gen_event *out, msg_logprob **lps)
{
    uint32_t n = 0;
    *lps = NULL;
    TD_TRY(msg_read_array_len(r, "logprobs", MSG_EVENT_TOKENS_MAX, &n));
    if (n == 0)
        return TD_OK;
    msg_logprob *v = calloc(n, sizeof *v);
    if (!v)
        return err_set(TD_ENOMEM, "gen_event: cannot allocate %u logprobs", n);
    *lps = v;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t *ids = NULL, n_ids = 0, n_lp = 0;
        uint64_t rank = 0;
        TD_TRY(msg_read_array(r, "logprobs[]", 4));
        TD_TRY(msg_read_f32(r, "logprobs[].logprob", &v[i].logprob));
        TD_TRY(msg_read_uint(r, "logprobs[].rank", INT32_MAX, &rank));
        v[i].rank = (uint32_t)rank;
        TD_TRY(msg_read_u32_array(r, "logprobs[].top_id", 0, MSG_TOP_LOGPROBS_MAX, &ids, &n_ids));
        if (n_ids)
            memcpy(v[i].top_id, ids, n_ids * sizeof *ids);
        free(ids);
        TD_TRY(msg_read_f32_array(r, "logprobs[].top_logprob", MSG_TOP_LOGPROBS_MAX,
                                  v[i].top_logprob, &n_lp));
        if (n_lp != n_ids)
            return err_set(TD_EFORMAT, "gen_event: token %u has %u alternative ids and %u "
                           "log probabilities", i, n_ids, n_lp);
        v[i].n_top = n_ids;
    }
    out->n_logprobs = n;
    return TD_OK;
}

td_err msg_pack_gen_event(msg_buf *out, uint64_t request_id, const msg_gen_event *m)
{
    TD_ASSERT(out && m);
    ASSERT_TERMINATED(m->message);
    TD_TRY(check_gen_event(m, TD_EINVAL));
    TD_ASSERT(m->tokens || m->n_tokens == 0);
    TD_ASSERT(m->logprobs || m->n_logprobs == 0);
    msg_writer w;
    msg_write_begin(&w, out, MSG_GEN_EVENT, request_id, 8);
    msg_write_uint(&w, m->seq_id);
    msg_write_uint(&w, (uint64_t)m->kind);
    msg_write_u32_array(&w, m->tokens, m->n_tokens);
    msg_write_array(&w, m->n_logprobs);
    for (uint32_t i = 0; i < m->n_logprobs; i++) {
        const msg_logprob *lp = &m->logprobs[i];
        msg_write_array(&w, 4);
        msg_write_f32(&w, lp->logprob);
        msg_write_uint(&w, lp->rank);
        msg_write_u32_array(&w, lp->top_id, lp->n_top);
        msg_write_f32_array(&w, lp->top_logprob, lp->n_top);
    }
    msg_write_uint(&w, (uint64_t)m->finish);
    msg_write_array(&w, 5);
    msg_write_uint(&w, m->usage.prompt_tokens);
    msg_write_uint(&w, m->usage.completion_tokens);
    msg_write_uint(&w, m->usage.steps);
    msg_write_uint(&w, m->usage.cached_tokens);
    msg_write_uint(&w, m->usage.predicted_tokens);
    msg_write_uint(&w, (uint64_t)m->code);
    msg_write_str(&w, m->message);
    return msg_write_end(&w);
}

td_err msg_unpack_gen_event(const void *buf, size_t len, uint64_t *request_id,
                            msg_gen_event *out)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    msg_reader r;
    msg_header h;
    uint64_t kind = 0, finish = 0, code = 0;
    uint64_t prompt_tokens = 0, completion_tokens = 0, steps = 0, cached = 0, predicted = 0;
    uint32_t *tokens = NULL;
    msg_logprob *lps = NULL;
    td_err e;
    msg_reader_init(&r, buf, len, "gen_event");
    TD_TRY(msg_read_envelope(&r, MSG_GEN_EVENT, 8, &h));
    if ((e = msg_read_uint(&r, "seq_id", UINT64_MAX, &out->seq_id)) ||
        (e = msg_read_uint(&r, "kind", MSG_EVENT_KIND_END - 1, &kind)) ||
        (e = msg_read_u32_array(&r, "tokens", 0, MSG_EVENT_TOKENS_MAX, &tokens,
                                &out->n_tokens)) ||
        (e = read_logprobs(&r, out, &lps)) ||
        (e = msg_read_uint(&r, "finish", MSG_FINISH_END - 1, &finish)) ||
        (e = msg_read_array(&r, "usage", 5)) ||
        (e = msg_read_uint(&r, "usage.prompt_tokens", UINT32_MAX, &prompt_tokens)) ||
        (e = msg_read_uint(&r, "usage.completion_tokens", UINT32_MAX, &completion_tokens)) ||
        (e = msg_read_uint(&r, "usage.steps", UINT32_MAX, &steps)) ||
        (e = msg_read_uint(&r, "usage.cached_tokens", UINT32_MAX, &cached)) ||
        (e = msg_read_uint(&r, "usage.predicted_tokens", UINT32_MAX, &predicted)) ||
        (e = msg_read_uint(&r, "code", TD_ERR_COUNT - 1, &code)) ||
        (e = msg_read_str(&r, "message", out->message, sizeof out->message)) ||
        (e = msg_read_end(&r)))
        goto fail;
    out->kind = (msg_event_kind)kind;
    out->tokens = tokens;
    out->finish = (msg_finish)finish;
    out->usage.prompt_tokens = (uint32_t)prompt_tokens;
    out->usage.completion_tokens = (uint32_t)completion_tokens;
    out->usage.steps = (uint32_t)steps;
    out->usage.cached_tokens = (uint32_t)cached;
    out->usage.predicted_tokens = (uint32_t)predicted;
    out->logprobs = lps;
    out->code = (td_err)code;
    if ((e = check_gen_event(out, TD_EFORMAT)))
        goto fail;
    set_request_id(request_id, &h);
    return TD_OK;
fail:
    free(tokens);
    free(lps);
    memset(out, 0, sizeof *out);
    return e;
}

void msg_free_gen_event(msg_gen_event *m)
{
    if (!m)
        return;
    free((void *)m->tokens);
    free((void *)m->logprobs);
    m->tokens = NULL;
    m->logprobs = NULL;
    m->n_tokens = 0;
    m->n_logprobs = 0;
}
