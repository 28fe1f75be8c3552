/* Fixtures for the message tests (see msg_fixture.h). */
#include "tests/support/msg_fixture.h"

#include <stdlib.h>
#include <string.h>

const uint32_t msg_fixture_prompt[7] = {151644, 872, 198, 9707, 0, 248319, 4294967295u};
const uint32_t msg_fixture_stop[2] = {151645, 248046};
const uint32_t msg_fixture_tokens[4] = {17, 0, 248070, 65536};

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
    msg_gen_event ge = msg_fixture_gen_event(MSG_EVENT_DONE);
    for (int t = 0; t < MSG_TYPE_END; t++)
        msg_buf_init(&bufs[t]);
    TD_TRY(msg_pack_hello(&bufs[MSG_HELLO], 1000, &hello));
    TD_TRY(msg_pack_ping(&bufs[MSG_PING], 1001, &ping));
    TD_TRY(msg_pack_pong(&bufs[MSG_PONG], 1002, &ping));
    TD_TRY(msg_pack_error(&bufs[MSG_ERROR], 1003, &error));
    TD_TRY(msg_pack_shbuf_announce(&bufs[MSG_SHBUF_ANNOUNCE], 1004, &shbuf));
    TD_TRY(msg_pack_gen_start(&bufs[MSG_GEN_START], 1005, &gs));
    TD_TRY(msg_pack_gen_event(&bufs[MSG_GEN_EVENT], 1006, &ge));
    return TD_OK;
}
