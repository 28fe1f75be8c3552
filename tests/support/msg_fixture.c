/* Fixtures for the message tests (see msg_fixture.h). */
#include "tests/support/msg_fixture.h"

#include <stdlib.h>
#include <string.h>

const uint32_t msg_fixture_prompt[7] = {151644, 872, 198, 9707, 0, 248319, 4294967295u};
const uint32_t msg_fixture_stop[2] = {151645, 248046};
const uint32_t msg_fixture_bias_tok[3] = {7, 248319, 0};
const float msg_fixture_bias[3] = {-100.0f, 2.5f, 100.0f};
const char msg_fixture_schema[] = "{\"type\":\"object\",\"required\":[\"a\"]}";
const uint32_t msg_fixture_tokens[4] = {17, 0, 248070, 65536};
const uint32_t msg_fixture_taps[3] = {1, 3, 6};

static const msg_logprob fixture_logprobs[4] = {
    {-0.25f, 1, 2, {17, 5}, {-0.25f, -1.75f}},
    {-3.5f, 2, 2, {9, 0}, {-0.125f, -3.5f}},
    {0.0f, 1, 2, {248070, 1}, {0.0f, -30.0f}},
    {-1.0f, 248320, 2, {65536, 65537}, {-1.0f, -1.0f}},
};
static const uint32_t fixture_draft[3] = {42, 7, 511};
static const uint32_t fixture_q_ids[3][3] = {{3, 42, 70}, {7, 0, 0}, {0, 100, 511}};
static const float fixture_q_p[3][3] = {{0.25f, 0.5f, 0.25f}, {1.0f, 0, 0}, {0.125f, 0.375f, 0.5f}};
static const msg_draft_q fixture_q[3] = {
    {fixture_q_ids[0], fixture_q_p[0], 3},
    {fixture_q_ids[1], fixture_q_p[1], 1},
    {fixture_q_ids[2], fixture_q_p[2], 3},
};

msg_hello msg_fixture_hello(void)
{
    msg_hello m = {.role = MSG_ROLE_VERIFYD, .pid = 4242, .protocol = MSG_PROTOCOL_VERSION};
    strcpy(m.build_id, "v0.1-12-gabcdef0");
    return m;
}

msg_shbuf_announce msg_fixture_shbuf(void)
{
    msg_shbuf_announce m = {.generation = 3, .kind = MSG_SHBUF_CUDA, .size = 17179869184ull};
    strcpy(m.name, "target.kv.0");
    strcpy(m.device_uuid, "GPU-8f3c2a1e-1b2c-4d5e-9f00-0123456789ab");
    return m;
}

static const uint32_t fixture_predict[3] = {7, 8, 151643};
static const uint32_t fixture_allowed[2] = {3, 151645};
static const uint32_t fixture_bad[5] = {2, 10, 11, 1, 151643}; /* [10 11], [151643] */

msg_gen_start msg_fixture_gen_start(void)
{
    msg_gen_start m = {
        .seq_id = 0x0123456789abcdefull,
        .prompt = msg_fixture_prompt,
        .n_prompt = 7,
        .max_tokens = 512,
        .sampler = {.temperature = 0.7f, .top_k = 20, .top_p = 0.95f, .min_p = 0.05f,
                    .seed = 18446744073709551615ull},
        .stop = msg_fixture_stop,
        .n_stop = 2,
        .logprobs = true,
        .top_logprobs = 5,
        .ignore_eos = true,
        .presence_penalty = 0.5f,
        .frequency_penalty = -1.75f,
        .bias_tok = msg_fixture_bias_tok,
        .bias = msg_fixture_bias,
        .n_bias = 3,
        .format = MSG_FORMAT_JSON_SCHEMA,
        .schema = msg_fixture_schema,
        .n_schema = sizeof msg_fixture_schema - 1,
        .think_open = true,
        .think_start = 151667,
        .think_end = 151668,
        .repetition_penalty = 1.125f,
        .min_tokens = 9,
        .prompt_logprobs = true,
        .predict = fixture_predict,
        .n_predict = 3,
        .allowed = fixture_allowed,
        .n_allowed = 2,
        .bad = fixture_bad,
        .n_bad = 5,
    };
    return m;
}

msg_gen_event msg_fixture_gen_event(msg_event_kind kind)
{
    msg_gen_event m = {.seq_id = 9, .kind = kind, .tokens = msg_fixture_tokens, .n_tokens = 4,
                       .usage = {.prompt_tokens = 7, .completion_tokens = 40, .steps = 5}};
    if (kind == MSG_EVENT_DONE)
        m.finish = MSG_FINISH_LENGTH;
    if (kind == MSG_EVENT_ERROR) {
        m.finish = MSG_FINISH_ERROR;
        m.code = TD_ENOMEM;
        m.n_tokens = 0;
        m.tokens = NULL;
        strcpy(m.message, "kv pages exhausted: 0 of 4096 free");
    }
    return m;
}

msg_gen_event msg_fixture_gen_event_logprobs(void)
{
    msg_gen_event m = msg_fixture_gen_event(MSG_EVENT_TOKEN);
    m.logprobs = fixture_logprobs;
    m.n_logprobs = 4;
    m.usage.cached_tokens = 5;
    m.usage.predicted_tokens = 11;
    return m;
}

msg_status msg_fixture_status(void)
{
    msg_status m = {
        .n_ctx = 4096, .n_vocab = 248320, .ready = true, .draft_attached = true, .block = 16,
        .slots = 16, .active = 3, .queued = 1, .requests = 1ull << 33, .prompt_tokens = 9000,
        .cached_tokens = 4000, .completion_tokens = 12345, .steps = 1500, .drafted = 22500,
        .accepted = 10845, .prefill_us = 111, .draft_us = 222, .verify_us = 333,
        .draft_attaches = 2, .draft_failures = 5, .graph_recorded = 7,
        .graph_replayed = 1ull << 40, .graph_direct = 13, .n_hist = 17,
    };
    strcpy(m.model, "qwen35-tiny");
    for (uint32_t i = 0; i < m.n_hist; i++)
        m.accept_hist[i] = i * i;
    return m;
}

msg_propose msg_fixture_propose(void)
{
    msg_propose m = {
        .seq_id = 77, .slot = 15, .slot_gen = 1ull << 40, .pool_gen = 1764443000123456789ull,
        .n_past = 1200, .pending = 248069, .n_draft = 15,
        .sampler = {.temperature = 0.6f, .top_k = 20, .top_p = 0.95f, .min_p = 0.0f, .seed = 9},
    };
    return m;
}

msg_proposal msg_fixture_proposal(int with_q)
{
    msg_proposal m = {.seq_id = 77, .n_past = 1200, .tokens = fixture_draft, .n_tokens = 3};
    if (with_q) {
        m.q = fixture_q;
        m.n_q = 3;
    }
    return m;
}

msg_kv_attach msg_fixture_kv_attach(void)
{
    msg_kv_attach m = {.role = MSG_ROLE_DRAFTD, .pid = 31337, .taps = msg_fixture_taps,
                       .n_taps = 3};
    m.params = (kvl_params){.slots = 16, .n_ctx = 4096, .ring = 4096, .block = 16, .n_attn = 2,
                            .n_kv = 2, .head_dim = 16, .n_delta = 6, .n_v_head = 6, .d_k = 16,
                            .d_v = 16, .conv_k = 4, .conv_ch = 160, .n_taps = 3, .n_embd = 32,
                            .d_layers = 2, .d_kv = 2, .d_head_dim = 16, .kv_bytes = 4,
                            .d_kv_bytes = 2, .feat_bytes = 2};
    return m;
}

msg_kv_pools msg_fixture_kv_pools(void)
{
    msg_kv_pools m = {.params = msg_fixture_kv_attach().params, .n_pools = 2};
    m.pools[0] = (msg_shbuf_announce){.generation = 5, .kind = MSG_SHBUF_CPU, .size = 1u << 24};
    strcpy(m.pools[0].name, "kvd.target");
    m.pools[1] = msg_fixture_shbuf();
    strcpy(m.pools[1].name, "kvd.draft");
    return m;
}

msg_svc_list msg_fixture_svc_list(void)
{
    msg_svc_list m = {.n = 3};
    m.svc[0] = (msg_svc){.name = "kvd", .pid = 100, .uptime_ms = 5000, .restarts = 0};
    m.svc[1] = (msg_svc){.name = "verifyd", .pid = 101, .uptime_ms = 4000, .restarts = 2};
    m.svc[2] = (msg_svc){.name = "draftd", .pid = 0, .uptime_ms = 0, .restarts = 7};
    return m;
}

msg_svc_restart msg_fixture_svc_restart(void)
{
    msg_svc_restart m = {.name = "draftd"};
    strcpy(m.draft, "/models/dflash-b16");
    return m;
}

uint8_t *msg_fixture_copy(const void *p, size_t n)
{
    uint8_t *b = malloc(n ? n : 1);
    TD_ASSERT(b);
    if (n)
        memcpy(b, p, n);
    return b;
}

td_err msg_fixture_unpack_as(msg_type type, const uint8_t *buf, size_t len)
{
    switch (type) {
    case MSG_HELLO: {
        msg_hello m;
        return msg_unpack_hello(buf, len, NULL, &m);
    }
    case MSG_PING: {
        msg_ping m;
        return msg_unpack_ping(buf, len, NULL, &m);
    }
    case MSG_PONG: {
        msg_ping m;
        return msg_unpack_pong(buf, len, NULL, &m);
    }
    case MSG_ERROR: {
        msg_error m;
        return msg_unpack_error(buf, len, NULL, &m);
    }
    case MSG_SHBUF_ANNOUNCE: {
        msg_shbuf_announce m;
        return msg_unpack_shbuf_announce(buf, len, NULL, &m);
    }
    case MSG_GEN_START: {
        msg_gen_start m;
        td_err e = msg_unpack_gen_start(buf, len, NULL, &m);
        msg_free_gen_start(&m);
        return e;
    }
    case MSG_GEN_EVENT: {
        msg_gen_event m;
        td_err e = msg_unpack_gen_event(buf, len, NULL, &m);
        msg_free_gen_event(&m);
        return e;
    }
    case MSG_GEN_CANCEL: {
        msg_gen_cancel m;
        return msg_unpack_gen_cancel(buf, len, NULL, &m);
    }
    case MSG_ACK: {
        msg_ack m;
        return msg_unpack_ack(buf, len, NULL, &m);
    }
    case MSG_STATUS_GET:
        return msg_unpack_status_get(buf, len, NULL);
    case MSG_STATUS: {
        msg_status m;
        return msg_unpack_status(buf, len, NULL, &m);
    }
    case MSG_PROPOSE: {
        msg_propose m;
        return msg_unpack_propose(buf, len, NULL, &m);
    }
    case MSG_PROPOSAL: {
        msg_proposal m;
        td_err e = msg_unpack_proposal(buf, len, NULL, &m);
        msg_free_proposal(&m);
        return e;
    }
    case MSG_KV_ATTACH: {
        msg_kv_attach m;
        td_err e = msg_unpack_kv_attach(buf, len, NULL, &m);
        msg_free_kv_attach(&m);
        return e;
    }
    case MSG_KV_POOLS: {
        msg_kv_pools m;
        return msg_unpack_kv_pools(buf, len, NULL, &m);
    }
    case MSG_KV_OPEN: {
        msg_kv_open m;
        td_err e = msg_unpack_kv_open(buf, len, NULL, &m);
        msg_free_kv_open(&m);
        return e;
    }
    case MSG_KV_SLOT: {
        msg_kv_slot m;
        return msg_unpack_kv_slot(buf, len, NULL, &m);
    }
    case MSG_KV_CLOSE: {
        msg_kv_close m;
        td_err e = msg_unpack_kv_close(buf, len, NULL, &m);
        msg_free_kv_close(&m);
        return e;
    }
    case MSG_SVC_LIST_GET:
        return msg_unpack_svc_list_get(buf, len, NULL);
    case MSG_SVC_LIST: {
        msg_svc_list m;
        return msg_unpack_svc_list(buf, len, NULL, &m);
    }
    case MSG_SVC_RESTART: {
        msg_svc_restart m;
        return msg_unpack_svc_restart(buf, len, NULL, &m);
    }
    default:
        TD_ASSERT(!"a message type without a fixture");
    }
    return TD_EINVAL;
}

td_err msg_fixture_pack_all(msg_buf bufs[MSG_TYPE_END])
{
    static const uint8_t data[5] = {1, 2, 3, 4, 5};
    msg_hello hello = msg_fixture_hello();
    msg_ping ping = {.nonce = 99, .data = data, .data_len = 5};
    msg_error error = {.code = TD_EBUSY};
    strcpy(error.message, "draftd is busy");
    msg_shbuf_announce shbuf = msg_fixture_shbuf();
    msg_gen_start gs = msg_fixture_gen_start();
    msg_gen_event ge = msg_fixture_gen_event_logprobs();
    for (int t = 0; t < MSG_TYPE_END; t++)
        msg_buf_init(&bufs[t]);
    TD_TRY(msg_pack_hello(&bufs[MSG_HELLO], 1000, &hello));
    TD_TRY(msg_pack_ping(&bufs[MSG_PING], 1001, &ping));
    TD_TRY(msg_pack_pong(&bufs[MSG_PONG], 1002, &ping));
    TD_TRY(msg_pack_error(&bufs[MSG_ERROR], 1003, &error));
    TD_TRY(msg_pack_shbuf_announce(&bufs[MSG_SHBUF_ANNOUNCE], 1004, &shbuf));
    TD_TRY(msg_pack_gen_start(&bufs[MSG_GEN_START], 1005, &gs));
    TD_TRY(msg_pack_gen_event(&bufs[MSG_GEN_EVENT], 1006, &ge));
    msg_gen_cancel gc = {.seq_id = 0xfeedull};
    TD_TRY(msg_pack_gen_cancel(&bufs[MSG_GEN_CANCEL], 1000 + MSG_GEN_CANCEL, &gc));
    msg_ack ack = {.id = 300};
    TD_TRY(msg_pack_ack(&bufs[MSG_ACK], 1000 + MSG_ACK, &ack));
    TD_TRY(msg_pack_status_get(&bufs[MSG_STATUS_GET], 1000 + MSG_STATUS_GET));
    msg_status st = msg_fixture_status();
    TD_TRY(msg_pack_status(&bufs[MSG_STATUS], 1000 + MSG_STATUS, &st));
    msg_propose pr = msg_fixture_propose();
    TD_TRY(msg_pack_propose(&bufs[MSG_PROPOSE], 1000 + MSG_PROPOSE, &pr));
    msg_proposal pl = msg_fixture_proposal(1);
    TD_TRY(msg_pack_proposal(&bufs[MSG_PROPOSAL], 1000 + MSG_PROPOSAL, &pl));
    msg_kv_attach ka = msg_fixture_kv_attach();
    TD_TRY(msg_pack_kv_attach(&bufs[MSG_KV_ATTACH], 1000 + MSG_KV_ATTACH, &ka));
    msg_kv_pools kp = msg_fixture_kv_pools();
    TD_TRY(msg_pack_kv_pools(&bufs[MSG_KV_POOLS], 1000 + MSG_KV_POOLS, &kp));
    msg_kv_open ko = {.pid = 4242, .tokens = msg_fixture_prompt, .n_tokens = 7};
    TD_TRY(msg_pack_kv_open(&bufs[MSG_KV_OPEN], 1000 + MSG_KV_OPEN, &ko));
    msg_kv_slot ks = {.slot = 3, .slot_gen = 12, .pool_gen = 5, .n_cached = 6};
    TD_TRY(msg_pack_kv_slot(&bufs[MSG_KV_SLOT], 1000 + MSG_KV_SLOT, &ks));
    msg_kv_close kc = {.slot = 3, .slot_gen = 12, .keep = true, .tokens = msg_fixture_prompt,
                       .n_tokens = 7};
    TD_TRY(msg_pack_kv_close(&bufs[MSG_KV_CLOSE], 1000 + MSG_KV_CLOSE, &kc));
    TD_TRY(msg_pack_svc_list_get(&bufs[MSG_SVC_LIST_GET], 1000 + MSG_SVC_LIST_GET));
    msg_svc_list sl = msg_fixture_svc_list();
    TD_TRY(msg_pack_svc_list(&bufs[MSG_SVC_LIST], 1000 + MSG_SVC_LIST, &sl));
    msg_svc_restart sr = msg_fixture_svc_restart();
    TD_TRY(msg_pack_svc_restart(&bufs[MSG_SVC_RESTART], 1000 + MSG_SVC_RESTART, &sr));
    return TD_OK;
}
