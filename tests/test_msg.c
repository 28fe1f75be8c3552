/* Message pack/unpack: exact wire bytes written by hand from the msgpack specification,
 * round trips of every type with exact values, every truncation of every message, and hostile
 * inputs built with msgpack-c's own packer (an encoder independent of our reader). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/msg.h"

/* --- fixtures: one valid struct per type ------------------------------------------------- */

static const uint32_t prompt_ids[] = {151644, 872, 198, 9707, 0, 248319, 4294967295u};
static const uint32_t stop_ids[] = {151645, 248046};
static const uint32_t event_ids[] = {17, 0, 248070, 65536};

static msg_hello hello_fixture(void)
{
    msg_hello m = {.role = MSG_ROLE_VERIFYD, .pid = 4242, .protocol = MSG_PROTOCOL_VERSION};
    strcpy(m.build_id, "v0.1-12-gabcdef0");
    return m;
}

static msg_shbuf_announce shbuf_fixture(void)
{
    msg_shbuf_announce m = {.generation = 3, .kind = MSG_SHBUF_CUDA, .size = 17179869184ull};
    strcpy(m.name, "target.kv.0");
    strcpy(m.device_uuid, "GPU-8f3c2a1e-1b2c-4d5e-9f00-0123456789ab");
    return m;
}

static msg_gen_start gen_start_fixture(void)
{
    msg_gen_start m = {
        .seq_id = 0x0123456789abcdefull,
        .prompt = prompt_ids,
        .n_prompt = 7,
        .max_tokens = 512,
        .sampler = {.temperature = 0.7f, .top_k = 20, .top_p = 0.95f, .min_p = 0.05f,
                    .seed = 18446744073709551615ull},
        .stop = stop_ids,
        .n_stop = 2,
    };
    return m;
}

static msg_gen_event gen_event_fixture(msg_event_kind kind)
{
    msg_gen_event m = {.seq_id = 9, .kind = kind, .tokens = event_ids, .n_tokens = 4,
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

/* A malloc'd copy of exactly n bytes, so ASan flags a read past the end. */
static uint8_t *exact_copy(const void *p, size_t n)
{
    uint8_t *b = malloc(n ? n : 1);
    assert_non_null(b);
    if (n)
        memcpy(b, p, n);
    return b;
}

/* --- exact bytes --------------------------------------------------------------------------- */

static void test_ping_wire_bytes_match_the_msgpack_spec(void **state)
{
    (void)state;
    /* [1, 2, 5, [7, bin8 "ab"]]: fixarray(4), fixint version 1, fixint type 2 (ping),
     * fixint request id 5, fixarray(2), fixint nonce 7, bin8 len 2 */
    static const uint8_t want[] = {0x94, 0x01, 0x02, 0x05, 0x92, 0x07, 0xc4, 0x02, 'a', 'b'};
    msg_buf b;
    msg_buf_init(&b);
    msg_ping p = {.nonce = 7, .data = (const uint8_t *)"ab", .data_len = 2};
    assert_int_equal(msg_pack_ping(&b, 5, &p), TD_OK);
    assert_int_equal(b.len, sizeof want);
    assert_memory_equal(b.data, want, sizeof want);
    msg_buf_free(&b);
}

static void test_hello_wire_bytes_match_the_msgpack_spec(void **state)
{
    (void)state;
    /* request id 300 -> uint16 0xcd 01 2c; pid 70000 -> uint32 0xce 00 01 11 70;
     * build id "ab" -> fixstr 0xa2 */
    static const uint8_t want[] = {0x94, 0x01, 0x01, 0xcd, 0x01, 0x2c, 0x94, 0x03, 0xce,
                                   0x00, 0x01, 0x11, 0x70, 0x01, 0xa2, 'a', 'b'};
    msg_buf b;
    msg_buf_init(&b);
    msg_hello h = {.role = MSG_ROLE_DRAFTD, .pid = 70000, .protocol = 1};
    strcpy(h.build_id, "ab");
    assert_int_equal(msg_pack_hello(&b, 300, &h), TD_OK);
    assert_int_equal(b.len, sizeof want);
    assert_memory_equal(b.data, want, sizeof want);
    msg_buf_free(&b);
}

/* --- round trips --------------------------------------------------------------------------- */

static void test_hello_round_trip(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    msg_hello in = hello_fixture(), out;
    uint64_t rid = 0;
    assert_int_equal(msg_pack_hello(&b, 77, &in), TD_OK);
    assert_int_equal(msg_unpack_hello(b.data, b.len, &rid, &out), TD_OK);
    assert_int_equal(rid, 77);
    assert_int_equal(out.role, MSG_ROLE_VERIFYD);
    assert_int_equal(out.pid, 4242);
    assert_int_equal(out.protocol, MSG_PROTOCOL_VERSION);
    assert_string_equal(out.build_id, "v0.1-12-gabcdef0");
    msg_buf_free(&b);
}

static void test_ping_and_pong_round_trip_with_data(void **state)
{
    (void)state;
    uint8_t data[300];
    for (int i = 0; i < 300; i++)
        data[i] = (uint8_t)(i * 7 + 1);
    msg_buf b;
    msg_buf_init(&b);
    msg_ping in = {.nonce = 0xfedcba9876543210ull, .data = data, .data_len = 300}, out;
    uint64_t rid = 0;
    assert_int_equal(msg_pack_ping(&b, UINT64_MAX, &in), TD_OK);
    assert_int_equal(msg_unpack_ping(b.data, b.len, &rid, &out), TD_OK);
    assert_int_equal(rid, UINT64_MAX);
    assert_int_equal(out.nonce, 0xfedcba9876543210ull);
    assert_int_equal(out.data_len, 300);
    assert_memory_equal(out.data, data, 300);
    /* bin data is not copied: it lies inside the packed bytes */
    assert_true(out.data > b.data && out.data + 300 <= b.data + b.len);
    /* a pong is not a ping */
    assert_int_equal(msg_unpack_pong(b.data, b.len, &rid, &out), TD_EPROTO);
    assert_int_equal(msg_pack_pong(&b, 1, &in), TD_OK);
    assert_int_equal(msg_unpack_pong(b.data, b.len, &rid, &out), TD_OK);
    assert_int_equal(rid, 1);
    assert_memory_equal(out.data, data, 300);
    /* empty data */
    msg_ping empty = {.nonce = 0};
    assert_int_equal(msg_pack_ping(&b, 0, &empty), TD_OK);
    assert_int_equal(msg_unpack_ping(b.data, b.len, NULL, &out), TD_OK);
    assert_int_equal(out.data_len, 0);
    assert_int_equal(out.nonce, 0);
    msg_buf_free(&b);
}

static void test_error_round_trip(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    msg_error in = {.code = TD_ETIMEOUT}, out;
    memset(in.message, 'x', MSG_ERROR_MAX); /* the longest allowed message */
    in.message[MSG_ERROR_MAX] = '\0';
    in.message[0] = 'k';
    uint64_t rid = 0;
    assert_int_equal(msg_pack_error(&b, 12, &in), TD_OK);
    assert_int_equal(msg_unpack_error(b.data, b.len, &rid, &out), TD_OK);
    assert_int_equal(rid, 12);
    assert_int_equal(out.code, TD_ETIMEOUT);
    assert_int_equal(strlen(out.message), MSG_ERROR_MAX);
    assert_string_equal(out.message, in.message);
    msg_buf_free(&b);
}

static void test_shbuf_announce_round_trip(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    msg_shbuf_announce in = shbuf_fixture(), out;
    assert_int_equal(msg_pack_shbuf_announce(&b, 3, &in), TD_OK);
    assert_int_equal(msg_unpack_shbuf_announce(b.data, b.len, NULL, &out), TD_OK);
    assert_string_equal(out.name, "target.kv.0");
    assert_int_equal(out.generation, 3);
    assert_int_equal(out.kind, MSG_SHBUF_CUDA);
    assert_int_equal(out.size, 17179869184ull);
    assert_string_equal(out.device_uuid, "GPU-8f3c2a1e-1b2c-4d5e-9f00-0123456789ab");

    msg_shbuf_announce cpu = {.generation = 0, .kind = MSG_SHBUF_CPU, .size = 4096};
    strcpy(cpu.name, "features");
    assert_int_equal(msg_pack_shbuf_announce(&b, 4, &cpu), TD_OK);
    assert_int_equal(msg_unpack_shbuf_announce(b.data, b.len, NULL, &out), TD_OK);
    assert_int_equal(out.kind, MSG_SHBUF_CPU);
    assert_string_equal(out.device_uuid, "");
    assert_int_equal(out.size, 4096);
    msg_buf_free(&b);
}

static void test_gen_start_round_trip(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    msg_gen_start in = gen_start_fixture(), out;
    uint64_t rid = 0;
    assert_int_equal(msg_pack_gen_start(&b, 0xabcdef, &in), TD_OK);
    assert_int_equal(msg_unpack_gen_start(b.data, b.len, &rid, &out), TD_OK);
    assert_int_equal(rid, 0xabcdef);
    assert_int_equal(out.seq_id, 0x0123456789abcdefull);
    assert_int_equal(out.n_prompt, 7);
    assert_memory_equal(out.prompt, prompt_ids, sizeof prompt_ids);
    assert_int_equal(out.max_tokens, 512);
    assert_true(out.sampler.temperature == 0.7f);
    assert_int_equal(out.sampler.top_k, 20);
    assert_true(out.sampler.top_p == 0.95f);
    assert_true(out.sampler.min_p == 0.05f);
    assert_int_equal(out.sampler.seed, 18446744073709551615ull);
    assert_int_equal(out.n_stop, 2);
    assert_memory_equal(out.stop, stop_ids, sizeof stop_ids);
    msg_free_gen_start(&out);
    assert_null(out.prompt);

    /* no stop tokens; the longest prompt */
    uint32_t *big = malloc(MSG_PROMPT_MAX * sizeof *big);
    assert_non_null(big);
    for (uint32_t i = 0; i < MSG_PROMPT_MAX; i++)
        big[i] = i * 2654435761u;
    in.prompt = big;
    in.n_prompt = MSG_PROMPT_MAX;
    in.n_stop = 0;
    in.stop = NULL;
    assert_int_equal(msg_pack_gen_start(&b, 1, &in), TD_OK);
    assert_int_equal(msg_unpack_gen_start(b.data, b.len, NULL, &out), TD_OK);
    assert_int_equal(out.n_prompt, MSG_PROMPT_MAX);
    assert_memory_equal(out.prompt, big, MSG_PROMPT_MAX * sizeof *big);
    assert_int_equal(out.n_stop, 0);
    assert_null(out.stop);
    msg_free_gen_start(&out);
    free(big);
    msg_buf_free(&b);
}

static void test_gen_event_round_trip_for_each_kind(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    msg_gen_event out;
    uint64_t rid = 0;

    msg_gen_event tok = gen_event_fixture(MSG_EVENT_TOKEN);
    assert_int_equal(msg_pack_gen_event(&b, 21, &tok), TD_OK);
    assert_int_equal(msg_unpack_gen_event(b.data, b.len, &rid, &out), TD_OK);
    assert_int_equal(rid, 21);
    assert_int_equal(out.seq_id, 9);
    assert_int_equal(out.kind, MSG_EVENT_TOKEN);
    assert_int_equal(out.n_tokens, 4);
    assert_memory_equal(out.tokens, event_ids, sizeof event_ids);
    assert_int_equal(out.finish, MSG_FINISH_NONE);
    assert_int_equal(out.usage.prompt_tokens, 7);
    assert_int_equal(out.usage.completion_tokens, 40);
    assert_int_equal(out.usage.steps, 5);
    assert_int_equal(out.code, TD_OK);
    assert_string_equal(out.message, "");
    msg_free_gen_event(&out);

    msg_gen_event done = gen_event_fixture(MSG_EVENT_DONE);
    assert_int_equal(msg_pack_gen_event(&b, 22, &done), TD_OK);
    assert_int_equal(msg_unpack_gen_event(b.data, b.len, &rid, &out), TD_OK);
    assert_int_equal(rid, 22);
    assert_int_equal(out.kind, MSG_EVENT_DONE);
    assert_int_equal(out.finish, MSG_FINISH_LENGTH);
    assert_memory_equal(out.tokens, event_ids, sizeof event_ids);
    msg_free_gen_event(&out);

    msg_gen_event err = gen_event_fixture(MSG_EVENT_ERROR);
    assert_int_equal(msg_pack_gen_event(&b, 23, &err), TD_OK);
    assert_int_equal(msg_unpack_gen_event(b.data, b.len, &rid, &out), TD_OK);
    assert_int_equal(out.kind, MSG_EVENT_ERROR);
    assert_int_equal(out.finish, MSG_FINISH_ERROR);
    assert_int_equal(out.code, TD_ENOMEM);
    assert_string_equal(out.message, "kv pages exhausted: 0 of 4096 free");
    assert_int_equal(out.n_tokens, 0);
    assert_null(out.tokens);
    msg_free_gen_event(&out);
    msg_buf_free(&b);
}

static void test_header_names_type_and_request_id(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    msg_gen_start gs = gen_start_fixture();
    assert_int_equal(msg_pack_gen_start(&b, 1ull << 40, &gs), TD_OK);
    msg_header h;
    assert_int_equal(msg_unpack_header(b.data, b.len, &h), TD_OK);
    assert_int_equal(h.version, MSG_PROTOCOL_VERSION);
    assert_int_equal(h.type, MSG_GEN_START);
    assert_int_equal(h.request_id, 1ull << 40);
    assert_string_equal(msg_type_name(h.type), "gen_start");
    assert_string_equal(msg_type_name((msg_type)0), "unknown");
    assert_string_equal(msg_type_name(MSG_TYPE_END), "unknown");
    msg_buf_free(&b);
}

/* --- truncation ---------------------------------------------------------------------------- */

/* Unpacks bytes with the unpack function of the given type and frees what it allocated. */
static td_err unpack_as(msg_type type, const uint8_t *buf, size_t len)
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
        fail_msg("no unpack for type %d", (int)type);
    }
    return TD_EINVAL;
}

/* Packs the fixture of every type into bufs[type]. */
static void pack_all(msg_buf bufs[MSG_TYPE_END])
{
    static const uint8_t data[5] = {1, 2, 3, 4, 5};
    msg_hello hello = hello_fixture();
    msg_ping ping = {.nonce = 99, .data = data, .data_len = 5};
    msg_error error = {.code = TD_EBUSY};
    strcpy(error.message, "draftd is busy");
    msg_shbuf_announce shbuf = shbuf_fixture();
    msg_gen_start gs = gen_start_fixture();
    msg_gen_event ge = gen_event_fixture(MSG_EVENT_DONE);
    for (int t = 0; t < MSG_TYPE_END; t++)
        msg_buf_init(&bufs[t]);
    assert_int_equal(msg_pack_hello(&bufs[MSG_HELLO], 1000, &hello), TD_OK);
    assert_int_equal(msg_pack_ping(&bufs[MSG_PING], 1001, &ping), TD_OK);
    assert_int_equal(msg_pack_pong(&bufs[MSG_PONG], 1002, &ping), TD_OK);
    assert_int_equal(msg_pack_error(&bufs[MSG_ERROR], 1003, &error), TD_OK);
    assert_int_equal(msg_pack_shbuf_announce(&bufs[MSG_SHBUF_ANNOUNCE], 1004, &shbuf), TD_OK);
    assert_int_equal(msg_pack_gen_start(&bufs[MSG_GEN_START], 1005, &gs), TD_OK);
    assert_int_equal(msg_pack_gen_event(&bufs[MSG_GEN_EVENT], 1006, &ge), TD_OK);
}

static void test_every_truncation_of_every_type_is_a_format_error(void **state)
{
    (void)state;
    msg_buf bufs[MSG_TYPE_END];
    pack_all(bufs);
    for (int t = 1; t < MSG_TYPE_END; t++) {
        const msg_buf *b = &bufs[t];
        uint8_t *whole = exact_copy(b->data, b->len);
        assert_int_equal(unpack_as((msg_type)t, whole, b->len), TD_OK);
        free(whole);
        for (size_t n = 0; n < b->len; n++) {
            uint8_t *cut = exact_copy(b->data, n);
            td_err e = unpack_as((msg_type)t, cut, n);
            if (e != TD_EFORMAT)
                fail_msg("%s cut to %zu of %zu bytes: %s (%s)", msg_type_name((msg_type)t), n,
                         b->len, err_name(e), err_msg());
            msg_header h;
            assert_int_not_equal(msg_unpack_header(cut, n, &h), TD_EPROTO);
            free(cut);
        }
    }
    for (int t = 0; t < MSG_TYPE_END; t++)
        msg_buf_free(&bufs[t]);
}

static void test_every_message_is_refused_by_every_other_type(void **state)
{
    (void)state;
    msg_buf bufs[MSG_TYPE_END];
    pack_all(bufs);
    for (int t = 1; t < MSG_TYPE_END; t++)
        for (int u = 1; u < MSG_TYPE_END; u++)
            if (u != t)
                assert_int_equal(unpack_as((msg_type)u, bufs[t].data, bufs[t].len), TD_EPROTO);
    for (int t = 0; t < MSG_TYPE_END; t++)
        msg_buf_free(&bufs[t]);
}

/* --- hostile input, built with msgpack-c's packer ------------------------------------------ */

typedef struct hostile {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} hostile;

/* Starts [version, type, request_id, [n_fields ...]]. */
static void hostile_begin(hostile *h, uint64_t version, uint64_t type, uint32_t n_fields)
{
    msgpack_sbuffer_init(&h->sb);
    msgpack_packer_init(&h->pk, &h->sb, msgpack_sbuffer_write);
    msgpack_pack_array(&h->pk, 4);
    msgpack_pack_uint64(&h->pk, version);
    msgpack_pack_uint64(&h->pk, type);
    msgpack_pack_uint64(&h->pk, 1);
    msgpack_pack_array(&h->pk, n_fields);
}

static void hostile_str(hostile *h, const char *s, size_t n)
{
    msgpack_pack_str(&h->pk, n);
    msgpack_pack_str_body(&h->pk, s, n);
}

/* Unpacks the built bytes (exact-size copy) as type and returns the code. */
static td_err hostile_unpack(hostile *h, msg_type type)
{
    uint8_t *b = exact_copy(h->sb.data, h->sb.size);
    td_err e = unpack_as(type, b, h->sb.size);
    free(b);
    msgpack_sbuffer_destroy(&h->sb);
    return e;
}

/* A hello payload from msgpack-c with the given pid and build id. */
static void hostile_hello(hostile *h, uint64_t version, uint64_t pid, const char *build,
                          size_t build_len)
{
    hostile_begin(h, version, MSG_HELLO, 4);
    msgpack_pack_uint64(&h->pk, MSG_ROLE_KVD);
    msgpack_pack_uint64(&h->pk, pid);
    msgpack_pack_uint64(&h->pk, MSG_PROTOCOL_VERSION);
    hostile_str(h, build, build_len);
}

static void test_msgpack_c_encoding_is_accepted(void **state)
{
    (void)state;
    hostile h;
    hostile_hello(&h, MSG_PROTOCOL_VERSION, 31337, "b", 1);
    assert_int_equal(hostile_unpack(&h, MSG_HELLO), TD_OK);
}

static void test_other_protocol_version_is_a_protocol_error_naming_both(void **state)
{
    (void)state;
    hostile h;
    hostile_hello(&h, 2, 1, "", 0);
    assert_int_equal(hostile_unpack(&h, MSG_HELLO), TD_EPROTO);
    assert_non_null(strstr(err_msg(), "version 2"));
    assert_non_null(strstr(err_msg(), "version 1"));

    /* the version is checked before the envelope's shape: a future layout still gets EPROTO */
    static const uint8_t future[] = {0x91, 0x07};
    msg_header hdr;
    assert_int_equal(msg_unpack_header(future, sizeof future, &hdr), TD_EPROTO);
    assert_non_null(strstr(err_msg(), "version 7"));
    /* and a mismatched hello.protocol field inside a current envelope */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_HELLO, 4);
    msgpack_pack_uint64(&h.pk, MSG_ROLE_KVD);
    msgpack_pack_uint64(&h.pk, 5);
    msgpack_pack_uint64(&h.pk, 9);
    hostile_str(&h, "", 0);
    assert_int_equal(hostile_unpack(&h, MSG_HELLO), TD_EPROTO);
    assert_non_null(strstr(err_msg(), "version 9"));
}

static void test_unknown_type_is_a_protocol_error(void **state)
{
    (void)state;
    static const uint64_t bad_types[] = {0, MSG_TYPE_END, 99, 65535};
    for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
        hostile h;
        hostile_begin(&h, MSG_PROTOCOL_VERSION, bad_types[i], 0);
        msg_header hdr;
        assert_int_equal(msg_unpack_header(h.sb.data, h.sb.size, &hdr), TD_EPROTO);
        assert_non_null(strstr(err_msg(), "unknown message type"));
        assert_int_equal(hostile_unpack(&h, MSG_PING), TD_EPROTO);
    }
    /* a type wider than u16 is malformed, not merely unknown */
    hostile h;
    hostile_begin(&h, MSG_PROTOCOL_VERSION, 65536, 0);
    assert_int_equal(hostile_unpack(&h, MSG_PING), TD_EFORMAT);
}

static void test_huge_array_counts_without_data_are_refused_before_allocating(void **state)
{
    (void)state;
    /* top level: array32 of 2^32-1 items and nothing else */
    static const uint8_t top[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    msg_header hdr;
    assert_int_equal(msg_unpack_header(top, sizeof top, &hdr), TD_EFORMAT);
    for (int t = 1; t < MSG_TYPE_END; t++)
        assert_int_equal(unpack_as((msg_type)t, top, sizeof top), TD_EFORMAT);

    /* the payload array */
    hostile h;
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, UINT32_MAX);
    assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);

    /* the prompt array: 2^32-1 tokens announced, none present */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, 5);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_array(&h.pk, UINT32_MAX);
    assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "prompt"));

    /* one more prompt token than the limit, with every token present */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, 5);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_array(&h.pk, MSG_PROMPT_MAX + 1);
    for (uint32_t i = 0; i < MSG_PROMPT_MAX + 1; i++)
        msgpack_pack_uint32(&h.pk, 5);
    assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "limit"));

    /* bin32 of 4 GiB - 1 announced in a ping */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_PING, 2);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_bin(&h.pk, UINT32_MAX);
    assert_int_equal(hostile_unpack(&h, MSG_PING), TD_EFORMAT);
}

static void test_wrong_field_types_are_format_errors_naming_the_field(void **state)
{
    (void)state;
    hostile h;
    /* pid as a string */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_HELLO, 4);
    msgpack_pack_uint64(&h.pk, MSG_ROLE_KVD);
    hostile_str(&h, "12", 2);
    msgpack_pack_uint64(&h.pk, MSG_PROTOCOL_VERSION);
    hostile_str(&h, "", 0);
    assert_int_equal(hostile_unpack(&h, MSG_HELLO), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "pid"));
    assert_non_null(strstr(err_msg(), "string"));

    /* temperature as an integer */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, 5);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_array(&h.pk, 1);
    msgpack_pack_uint32(&h.pk, 3);
    msgpack_pack_uint32(&h.pk, 10);
    msgpack_pack_array(&h.pk, 5);
    msgpack_pack_uint32(&h.pk, 1);
    msgpack_pack_uint32(&h.pk, 0);
    msgpack_pack_float(&h.pk, 1.0f);
    msgpack_pack_float(&h.pk, 0.0f);
    msgpack_pack_uint64(&h.pk, 0);
    msgpack_pack_array(&h.pk, 0);
    assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "sampler.temperature"));

    /* a map where the payload array should be */
    msgpack_sbuffer_init(&h.sb);
    msgpack_packer_init(&h.pk, &h.sb, msgpack_sbuffer_write);
    msgpack_pack_array(&h.pk, 4);
    msgpack_pack_uint64(&h.pk, MSG_PROTOCOL_VERSION);
    msgpack_pack_uint64(&h.pk, MSG_PING);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_map(&h.pk, 0);
    assert_int_equal(hostile_unpack(&h, MSG_PING), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "map"));

    /* nil, bool and a negative number where the nonce belongs */
    for (int k = 0; k < 3; k++) {
        hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_PING, 2);
        if (k == 0)
            msgpack_pack_nil(&h.pk);
        else if (k == 1)
            msgpack_pack_true(&h.pk);
        else
            msgpack_pack_int64(&h.pk, -1);
        msgpack_pack_bin(&h.pk, 0);
        assert_int_equal(hostile_unpack(&h, MSG_PING), TD_EFORMAT);
        assert_non_null(strstr(err_msg(), "nonce"));
    }
    /* a string where the ping's bin belongs */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_PING, 2);
    msgpack_pack_uint64(&h.pk, 1);
    hostile_str(&h, "ab", 2);
    assert_int_equal(hostile_unpack(&h, MSG_PING), TD_EFORMAT);
}

static void test_signed_and_wide_encodings_of_valid_values_are_accepted(void **state)
{
    (void)state;
    /* ping with nonce as int32 12345 (0xd2) and request id as uint64 (0xcf) */
    static const uint8_t ok[] = {0x94, 0x01, 0x02, 0xcf, 0, 0, 0, 0, 0, 0, 0, 9,
                                 0x92, 0xd2, 0x00, 0x00, 0x30, 0x39, 0xc4, 0x00};
    msg_ping p;
    uint64_t rid = 0;
    assert_int_equal(msg_unpack_ping(ok, sizeof ok, &rid, &p), TD_OK);
    assert_int_equal(rid, 9);
    assert_int_equal(p.nonce, 12345);
    /* int8 -1 (0xd0 0xff) is negative */
    static const uint8_t neg[] = {0x94, 0x01, 0x02, 0x01, 0x92, 0xd0, 0xff, 0xc4, 0x00};
    assert_int_equal(msg_unpack_ping(neg, sizeof neg, NULL, &p), TD_EFORMAT);
    /* 0xc1 is never valid msgpack */
    static const uint8_t never[] = {0x94, 0x01, 0x02, 0x01, 0x92, 0xc1, 0xc4, 0x00};
    assert_int_equal(msg_unpack_ping(never, sizeof never, NULL, &p), TD_EFORMAT);

    /* sampler floats as float64 */
    hostile h;
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, 5);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_array(&h.pk, 1);
    msgpack_pack_uint32(&h.pk, 3);
    msgpack_pack_uint32(&h.pk, 10);
    msgpack_pack_array(&h.pk, 5);
    msgpack_pack_double(&h.pk, 0.5);
    msgpack_pack_uint32(&h.pk, 0);
    msgpack_pack_double(&h.pk, 1.0);
    msgpack_pack_double(&h.pk, 0.25);
    msgpack_pack_uint64(&h.pk, 0);
    msgpack_pack_array(&h.pk, 0);
    uint8_t *b = exact_copy(h.sb.data, h.sb.size);
    msg_gen_start gs;
    assert_int_equal(msg_unpack_gen_start(b, h.sb.size, NULL, &gs), TD_OK);
    assert_true(gs.sampler.temperature == 0.5f);
    assert_true(gs.sampler.min_p == 0.25f);
    assert_int_equal(gs.prompt[0], 3);
    msg_free_gen_start(&gs);
    free(b);
    msgpack_sbuffer_destroy(&h.sb);
}

static void test_trailing_bytes_and_extra_fields_are_refused(void **state)
{
    (void)state;
    msg_buf bufs[MSG_TYPE_END];
    pack_all(bufs);
    for (int t = 1; t < MSG_TYPE_END; t++) {
        uint8_t *plus = malloc(bufs[t].len + 1);
        assert_non_null(plus);
        memcpy(plus, bufs[t].data, bufs[t].len);
        plus[bufs[t].len] = 0xc0; /* one nil after the message */
        assert_int_equal(unpack_as((msg_type)t, plus, bufs[t].len + 1), TD_EFORMAT);
        assert_non_null(strstr(err_msg(), "trailing"));
        free(plus);
    }
    for (int t = 0; t < MSG_TYPE_END; t++)
        msg_buf_free(&bufs[t]);

    hostile h;
    /* a ping payload with a third field */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_PING, 3);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_bin(&h.pk, 0);
    msgpack_pack_uint64(&h.pk, 1);
    assert_int_equal(hostile_unpack(&h, MSG_PING), TD_EFORMAT);
    /* a ping payload with one field missing */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_PING, 1);
    msgpack_pack_uint64(&h.pk, 1);
    assert_int_equal(hostile_unpack(&h, MSG_PING), TD_EFORMAT);
    /* an envelope of five items */
    msgpack_sbuffer_init(&h.sb);
    msgpack_packer_init(&h.pk, &h.sb, msgpack_sbuffer_write);
    msgpack_pack_array(&h.pk, 5);
    msgpack_pack_uint64(&h.pk, MSG_PROTOCOL_VERSION);
    msgpack_pack_uint64(&h.pk, MSG_PING);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_array(&h.pk, 2);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_bin(&h.pk, 0);
    msgpack_pack_nil(&h.pk);
    assert_int_equal(hostile_unpack(&h, MSG_PING), TD_EFORMAT);
    /* a sampler with a sixth setting */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, 5);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_array(&h.pk, 1);
    msgpack_pack_uint32(&h.pk, 3);
    msgpack_pack_uint32(&h.pk, 10);
    msgpack_pack_array(&h.pk, 6);
    assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "sampler"));
}

static void test_strings_over_their_limit_or_with_nul_are_refused(void **state)
{
    (void)state;
    char s[MSG_ERROR_MAX + 2];
    memset(s, 'a', sizeof s);
    hostile h;
    hostile_hello(&h, MSG_PROTOCOL_VERSION, 1, s, MSG_BUILD_ID_MAX);
    assert_int_equal(hostile_unpack(&h, MSG_HELLO), TD_OK);
    hostile_hello(&h, MSG_PROTOCOL_VERSION, 1, s, MSG_BUILD_ID_MAX + 1);
    assert_int_equal(hostile_unpack(&h, MSG_HELLO), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "build_id"));
    hostile_hello(&h, MSG_PROTOCOL_VERSION, 1, "a\0b", 3);
    assert_int_equal(hostile_unpack(&h, MSG_HELLO), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "NUL"));

    for (size_t n = MSG_ERROR_MAX; n <= MSG_ERROR_MAX + 1; n++) {
        hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_ERROR, 2);
        msgpack_pack_uint64(&h.pk, TD_EIO);
        hostile_str(&h, s, n);
        assert_int_equal(hostile_unpack(&h, MSG_ERROR), n == MSG_ERROR_MAX ? TD_OK : TD_EFORMAT);
    }
    /* str32 announcing 4 GiB - 1 */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_ERROR, 2);
    msgpack_pack_uint64(&h.pk, TD_EIO);
    msgpack_pack_str(&h.pk, UINT32_MAX);
    assert_int_equal(hostile_unpack(&h, MSG_ERROR), TD_EFORMAT);

    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_SHBUF_ANNOUNCE, 5);
    hostile_str(&h, s, MSG_NAME_MAX + 1);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_uint64(&h.pk, MSG_SHBUF_CPU);
    msgpack_pack_uint64(&h.pk, 4096);
    hostile_str(&h, "", 0);
    assert_int_equal(hostile_unpack(&h, MSG_SHBUF_ANNOUNCE), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "name"));
}

static void test_out_of_range_values_are_refused(void **state)
{
    (void)state;
    hostile h;
    /* pid 2^32 does not fit a u32; pid 0 is no process */
    hostile_hello(&h, MSG_PROTOCOL_VERSION, 1ull << 32, "", 0);
    assert_int_equal(hostile_unpack(&h, MSG_HELLO), TD_EFORMAT);
    hostile_hello(&h, MSG_PROTOCOL_VERSION, 0, "", 0);
    assert_int_equal(hostile_unpack(&h, MSG_HELLO), TD_EFORMAT);
    /* a version that does not fit a u16 */
    hostile_hello(&h, 65537, 1, "", 0);
    assert_int_equal(hostile_unpack(&h, MSG_HELLO), TD_EFORMAT);

    /* role 0 and role past the last */
    for (uint64_t role = 0; role <= MSG_ROLE_END; role += MSG_ROLE_END) {
        hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_HELLO, 4);
        msgpack_pack_uint64(&h.pk, role);
        msgpack_pack_uint64(&h.pk, 1);
        msgpack_pack_uint64(&h.pk, MSG_PROTOCOL_VERSION);
        hostile_str(&h, "", 0);
        assert_int_equal(hostile_unpack(&h, MSG_HELLO), TD_EFORMAT);
    }
    /* error code TD_OK and past the last code */
    for (uint64_t code = 0; code <= TD_ERR_COUNT; code += TD_ERR_COUNT) {
        hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_ERROR, 2);
        msgpack_pack_uint64(&h.pk, code);
        hostile_str(&h, "x", 1);
        assert_int_equal(hostile_unpack(&h, MSG_ERROR), TD_EFORMAT);
    }
    /* a cuda buffer without a device, a cpu buffer with one, size 0 */
    for (int k = 0; k < 3; k++) {
        hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_SHBUF_ANNOUNCE, 5);
        hostile_str(&h, "kv", 2);
        msgpack_pack_uint64(&h.pk, 1);
        msgpack_pack_uint64(&h.pk, k == 0 ? MSG_SHBUF_CUDA : MSG_SHBUF_CPU);
        msgpack_pack_uint64(&h.pk, k == 2 ? 0 : 4096);
        hostile_str(&h, k == 1 ? "GPU-1" : "", k == 1 ? 5 : 0);
        assert_int_equal(hostile_unpack(&h, MSG_SHBUF_ANNOUNCE), TD_EFORMAT);
    }
    /* sampler: NaN and negative temperature, top_p 0 and 1.5, min_p 2; one token over u32 */
    const float bad[][3] = {{NAN, 1, 0}, {-0.5f, 1, 0}, {INFINITY, 1, 0},
                            {1, 0, 0},   {1, 1.5f, 0},  {1, 1, 2}};
    for (size_t k = 0; k <= sizeof bad / sizeof bad[0]; k++) {
        hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, 5);
        msgpack_pack_uint64(&h.pk, 1);
        msgpack_pack_array(&h.pk, 1);
        msgpack_pack_uint64(&h.pk, k < 6 ? 3 : 1ull << 32);
        msgpack_pack_uint32(&h.pk, 10);
        msgpack_pack_array(&h.pk, 5);
        msgpack_pack_float(&h.pk, k < 6 ? bad[k][0] : 1);
        msgpack_pack_uint32(&h.pk, 0);
        msgpack_pack_float(&h.pk, k < 6 ? bad[k][1] : 1);
        msgpack_pack_float(&h.pk, k < 6 ? bad[k][2] : 0);
        msgpack_pack_uint64(&h.pk, 0);
        msgpack_pack_array(&h.pk, 0);
        assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);
    }
    /* float64 too large for an f32 */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, 5);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_array(&h.pk, 1);
    msgpack_pack_uint32(&h.pk, 3);
    msgpack_pack_uint32(&h.pk, 10);
    msgpack_pack_array(&h.pk, 5);
    msgpack_pack_double(&h.pk, 1e300);
    assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);
}

static void test_gen_event_kind_must_agree_with_its_fields(void **state)
{
    (void)state;
    /* kind, finish, code, message */
    static const struct {
        uint64_t kind, finish, code;
        const char *message;
        td_err want;
    } cases[] = {
        {MSG_EVENT_TOKEN, MSG_FINISH_NONE, TD_OK, "", TD_OK},
        {MSG_EVENT_TOKEN, MSG_FINISH_STOP, TD_OK, "", TD_EFORMAT},
        {MSG_EVENT_DONE, MSG_FINISH_NONE, TD_OK, "", TD_EFORMAT},
        {MSG_EVENT_DONE, MSG_FINISH_CANCEL, TD_OK, "", TD_OK},
        {MSG_EVENT_DONE, MSG_FINISH_ERROR, TD_OK, "", TD_EFORMAT},
        {MSG_EVENT_DONE, MSG_FINISH_STOP, TD_EIO, "", TD_EFORMAT},
        {MSG_EVENT_DONE, MSG_FINISH_STOP, TD_OK, "why", TD_EFORMAT},
        {MSG_EVENT_ERROR, MSG_FINISH_ERROR, TD_OK, "x", TD_EFORMAT},
        {MSG_EVENT_ERROR, MSG_FINISH_ERROR, TD_EIO, "disk", TD_OK},
        {MSG_EVENT_ERROR, MSG_FINISH_STOP, TD_EIO, "disk", TD_EFORMAT},
        {0, MSG_FINISH_NONE, TD_OK, "", TD_EFORMAT},
        {MSG_EVENT_KIND_END, MSG_FINISH_NONE, TD_OK, "", TD_EFORMAT},
        {MSG_EVENT_TOKEN, MSG_FINISH_END, TD_OK, "", TD_EFORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hostile h;
        hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_EVENT, 7);
        msgpack_pack_uint64(&h.pk, 1);
        msgpack_pack_uint64(&h.pk, cases[i].kind);
        msgpack_pack_array(&h.pk, 1);
        msgpack_pack_uint32(&h.pk, 42);
        msgpack_pack_uint64(&h.pk, cases[i].finish);
        msgpack_pack_array(&h.pk, 3);
        msgpack_pack_uint32(&h.pk, 1);
        msgpack_pack_uint32(&h.pk, 2);
        msgpack_pack_uint32(&h.pk, 3);
        msgpack_pack_uint64(&h.pk, cases[i].code);
        hostile_str(&h, cases[i].message, strlen(cases[i].message));
        td_err e = hostile_unpack(&h, MSG_GEN_EVENT);
        if (e != cases[i].want)
            fail_msg("case %zu: got %s (%s)", i, err_name(e), err_msg());
    }
}

static void test_pack_refuses_structs_that_unpack_would_refuse(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    msg_gen_start gs = gen_start_fixture();
    gs.n_prompt = 0;
    assert_int_equal(msg_pack_gen_start(&b, 1, &gs), TD_EINVAL);
    gs = gen_start_fixture();
    gs.sampler.top_p = 2.0f;
    assert_int_equal(msg_pack_gen_start(&b, 1, &gs), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "top_p"));
    gs = gen_start_fixture();
    gs.n_stop = MSG_STOP_MAX + 1;
    assert_int_equal(msg_pack_gen_start(&b, 1, &gs), TD_EINVAL);
    msg_hello hello = hello_fixture();
    hello.pid = 0;
    assert_int_equal(msg_pack_hello(&b, 1, &hello), TD_EINVAL);
    msg_error error = {.code = TD_OK};
    assert_int_equal(msg_pack_error(&b, 1, &error), TD_EINVAL);
    msg_ping ping = {.data = (const uint8_t *)"", .data_len = MSG_PING_DATA_MAX + 1};
    assert_int_equal(msg_pack_ping(&b, 1, &ping), TD_EINVAL);
    msg_gen_event ev = gen_event_fixture(MSG_EVENT_TOKEN);
    ev.finish = MSG_FINISH_STOP;
    assert_int_equal(msg_pack_gen_event(&b, 1, &ev), TD_EINVAL);
    msg_shbuf_announce sb = shbuf_fixture();
    sb.name[0] = '\0';
    assert_int_equal(msg_pack_shbuf_announce(&b, 1, &sb), TD_EINVAL);
    msg_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ping_wire_bytes_match_the_msgpack_spec),
        cmocka_unit_test(test_hello_wire_bytes_match_the_msgpack_spec),
        cmocka_unit_test(test_hello_round_trip),
        cmocka_unit_test(test_ping_and_pong_round_trip_with_data),
        cmocka_unit_test(test_error_round_trip),
        cmocka_unit_test(test_shbuf_announce_round_trip),
        cmocka_unit_test(test_gen_start_round_trip),
        cmocka_unit_test(test_gen_event_round_trip_for_each_kind),
        cmocka_unit_test(test_header_names_type_and_request_id),
        cmocka_unit_test(test_every_truncation_of_every_type_is_a_format_error),
        cmocka_unit_test(test_every_message_is_refused_by_every_other_type),
        cmocka_unit_test(test_msgpack_c_encoding_is_accepted),
        cmocka_unit_test(test_other_protocol_version_is_a_protocol_error_naming_both),
        cmocka_unit_test(test_unknown_type_is_a_protocol_error),
        cmocka_unit_test(test_huge_array_counts_without_data_are_refused_before_allocating),
        cmocka_unit_test(test_wrong_field_types_are_format_errors_naming_the_field),
        cmocka_unit_test(test_signed_and_wide_encodings_of_valid_values_are_accepted),
        cmocka_unit_test(test_trailing_bytes_and_extra_fields_are_refused),
        cmocka_unit_test(test_strings_over_their_limit_or_with_nul_are_refused),
        cmocka_unit_test(test_out_of_range_values_are_refused),
        cmocka_unit_test(test_gen_event_kind_must_agree_with_its_fields),
        cmocka_unit_test(test_pack_refuses_structs_that_unpack_would_refuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
