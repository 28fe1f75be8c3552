/* Message unpack against hostile input built with msgpack-c's own packer (an encoder
 * independent of our reader): other versions, unknown types, lying lengths, wrong field types,
 * trailing bytes, extra fields, oversized strings, out-of-range values. Every input is an
 * exact-size heap copy, so ASan flags any read past it. */
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
#include "tests/support/msg_fixture.h"

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

#define GEN_START_FIELDS 23

/* The gen_start fields after the stop ids up to the format: logprobs off, no alternatives,
 * eos stops, no penalties, no logit bias. */
static void hostile_gen_start_mid(hostile *h)
{
    msgpack_pack_false(&h->pk);
    msgpack_pack_uint32(&h->pk, 0);
    msgpack_pack_false(&h->pk);
    msgpack_pack_float(&h->pk, 0);
    msgpack_pack_float(&h->pk, 0);
    msgpack_pack_array(&h->pk, 0);
    msgpack_pack_bin(&h->pk, 0);
}

/* The structured-output fields: format, schema (n bytes of '{'), think_open, think_start,
 * think_end; then no repetition penalty, no min_tokens, no prompt log probabilities, no
 * prediction, no allowed set, no bad words. */
static void hostile_format(hostile *h, uint32_t format, uint32_t n, bool open, uint32_t start,
                           uint32_t end)
{
    msgpack_pack_uint32(&h->pk, format);
    msgpack_pack_bin(&h->pk, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_bin_body(&h->pk, "{", 1);
    if (open)
        msgpack_pack_true(&h->pk);
    else
        msgpack_pack_false(&h->pk);
    msgpack_pack_uint32(&h->pk, start);
    msgpack_pack_uint32(&h->pk, end);
    msgpack_pack_float(&h->pk, 0);
    msgpack_pack_uint32(&h->pk, 0);
    msgpack_pack_false(&h->pk);
    msgpack_pack_array(&h->pk, 0);
    msgpack_pack_array(&h->pk, 0);
    msgpack_pack_array(&h->pk, 0);
}

/* And the rest: plain text. */
static void hostile_gen_start_tail(hostile *h)
{
    hostile_gen_start_mid(h);
    hostile_format(h, MSG_FORMAT_TEXT, 0, false, MSG_TOKEN_NONE, MSG_TOKEN_NONE);
}

/* Unpacks the built bytes (exact-size copy) as type and returns the code. */
static td_err hostile_unpack(hostile *h, msg_type type)
{
    uint8_t *b = msg_fixture_copy(h->sb.data, h->sb.size);
    td_err e = msg_fixture_unpack_as(type, b, h->sb.size);
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
        assert_int_equal(msg_fixture_unpack_as((msg_type)t, top, sizeof top), TD_EFORMAT);

    /* the payload array */
    hostile h;
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, UINT32_MAX);
    assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);

    /* the prompt array: 2^32-1 tokens announced, none present */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, GEN_START_FIELDS);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_array(&h.pk, UINT32_MAX);
    for (int i = 0; i < 22; i++) /* enough bytes for the payload's 23 fields to be plausible */
        msgpack_pack_nil(&h.pk);
    assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "prompt"));

    /* one more prompt token than the limit, with every token present */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, GEN_START_FIELDS);
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
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, GEN_START_FIELDS);
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
    for (int i = 0; i < 8; i++) /* bytes enough for the payload's fields to be plausible */
        msgpack_pack_nil(&h.pk);
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
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, GEN_START_FIELDS);
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
    hostile_gen_start_tail(&h);
    uint8_t *b = msg_fixture_copy(h.sb.data, h.sb.size);
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
    assert_int_equal(msg_fixture_pack_all(bufs), TD_OK);
    for (int t = 1; t < MSG_TYPE_END; t++) {
        uint8_t *plus = malloc(bufs[t].len + 1);
        assert_non_null(plus);
        memcpy(plus, bufs[t].data, bufs[t].len);
        plus[bufs[t].len] = 0xc0; /* one nil after the message */
        assert_int_equal(msg_fixture_unpack_as((msg_type)t, plus, bufs[t].len + 1), TD_EFORMAT);
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
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, GEN_START_FIELDS);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_array(&h.pk, 1);
    msgpack_pack_uint32(&h.pk, 3);
    msgpack_pack_uint32(&h.pk, 10);
    msgpack_pack_array(&h.pk, 6);
    for (int i = 0; i < 18; i++)
        msgpack_pack_nil(&h.pk);
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
        hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, GEN_START_FIELDS);
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
        hostile_gen_start_tail(&h);
        assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);
    }
    /* float64 too large for an f32 */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, GEN_START_FIELDS);
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
        hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_EVENT, 8);
        msgpack_pack_uint64(&h.pk, 1);
        msgpack_pack_uint64(&h.pk, cases[i].kind);
        msgpack_pack_array(&h.pk, 1);
        msgpack_pack_uint32(&h.pk, 42);
        msgpack_pack_array(&h.pk, 0); /* no logprobs */
        msgpack_pack_uint64(&h.pk, cases[i].finish);
        msgpack_pack_array(&h.pk, 5);
        msgpack_pack_uint32(&h.pk, 1);
        msgpack_pack_uint32(&h.pk, 2);
        msgpack_pack_uint32(&h.pk, 3);
        msgpack_pack_uint32(&h.pk, 0);
        msgpack_pack_uint32(&h.pk, 0);
        msgpack_pack_uint64(&h.pk, cases[i].code);
        hostile_str(&h, cases[i].message, strlen(cases[i].message));
        td_err e = hostile_unpack(&h, MSG_GEN_EVENT);
        if (e != cases[i].want)
            fail_msg("case %zu: got %s (%s)", i, err_name(e), err_msg());
    }
}


/* A proposal of one token (id 5) whose single distribution has the given ids and raw bin. */
static void hostile_proposal_pool(hostile *h, const uint32_t *ids, uint32_t n_ids,
                                  const void *bin, size_t bin_len, uint32_t n_q, uint64_t q_gen,
                                  uint64_t q_offset, uint64_t q_rows);

static void hostile_proposal(hostile *h, const uint32_t *ids, uint32_t n_ids, const void *bin,
                             size_t bin_len, uint32_t n_q)
{
    hostile_proposal_pool(h, ids, n_ids, bin, bin_len, n_q, 0, 0, 0);
}

/* The same with the proposal pool fields (generation, byte offset, rows). */
static void hostile_proposal_pool(hostile *h, const uint32_t *ids, uint32_t n_ids,
                                  const void *bin, size_t bin_len, uint32_t n_q, uint64_t q_gen,
                                  uint64_t q_offset, uint64_t q_rows)
{
    hostile_begin(h, MSG_PROTOCOL_VERSION, MSG_PROPOSAL, 7);
    msgpack_pack_uint64(&h->pk, 1);
    msgpack_pack_uint64(&h->pk, 10);
    msgpack_pack_array(&h->pk, 1);
    msgpack_pack_uint32(&h->pk, 5);
    msgpack_pack_array(&h->pk, n_q);
    for (uint32_t k = 0; k < n_q; k++) {
        msgpack_pack_array(&h->pk, 2);
        msgpack_pack_array(&h->pk, n_ids);
        for (uint32_t i = 0; i < n_ids; i++)
            msgpack_pack_uint32(&h->pk, ids[i]);
        msgpack_pack_bin(&h->pk, bin_len);
        msgpack_pack_bin_body(&h->pk, bin, bin_len);
    }
    msgpack_pack_uint64(&h->pk, q_gen);
    msgpack_pack_uint64(&h->pk, q_offset);
    msgpack_pack_uint64(&h->pk, q_rows);
}

static void test_proposal_distributions_are_checked(void **state)
{
    (void)state;
    hostile h;
    const uint32_t ids[2] = {3, 9}, down[2] = {9, 3};
    const float ok[2] = {0.25f, 0.75f}, zero[2] = {0.25f, 0.0f}, nan[2] = {NAN, 1.0f};
    hostile_proposal(&h, ids, 2, ok, sizeof ok, 1);
    assert_int_equal(hostile_unpack(&h, MSG_PROPOSAL), TD_OK);
    hostile_proposal(&h, down, 2, ok, sizeof ok, 1);
    assert_int_equal(hostile_unpack(&h, MSG_PROPOSAL), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "increasing"));
    hostile_proposal(&h, ids, 2, zero, sizeof zero, 1);
    assert_int_equal(hostile_unpack(&h, MSG_PROPOSAL), TD_EFORMAT);
    hostile_proposal(&h, ids, 2, nan, sizeof nan, 1);
    assert_int_equal(hostile_unpack(&h, MSG_PROPOSAL), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "finite"));
    hostile_proposal(&h, ids, 2, ok, sizeof ok - 1, 1); /* 7 bytes for two floats */
    assert_int_equal(hostile_unpack(&h, MSG_PROPOSAL), TD_EFORMAT);
    hostile_proposal(&h, ids, 2, ok, sizeof ok, 2); /* two distributions for one token */
    assert_int_equal(hostile_unpack(&h, MSG_PROPOSAL), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "distributions"));
    hostile_proposal(&h, ids, 0, ok, 0, 1); /* an empty distribution */
    assert_int_equal(hostile_unpack(&h, MSG_PROPOSAL), TD_EFORMAT);

    /* pool rows: one per token, at a generation, at a float boundary, never both ways */
    hostile_proposal_pool(&h, ids, 2, ok, sizeof ok, 0, 4, 64, 1);
    assert_int_equal(hostile_unpack(&h, MSG_PROPOSAL), TD_OK);
    hostile_proposal_pool(&h, ids, 2, ok, sizeof ok, 0, 4, 64, 2);
    assert_int_equal(hostile_unpack(&h, MSG_PROPOSAL), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "pool rows"));
    hostile_proposal_pool(&h, ids, 2, ok, sizeof ok, 0, 0, 64, 1);
    assert_int_equal(hostile_unpack(&h, MSG_PROPOSAL), TD_EFORMAT);
    hostile_proposal_pool(&h, ids, 2, ok, sizeof ok, 0, 4, 66, 1);
    assert_int_equal(hostile_unpack(&h, MSG_PROPOSAL), TD_EFORMAT);
    hostile_proposal_pool(&h, ids, 2, ok, sizeof ok, 1, 4, 64, 1);
    assert_int_equal(hostile_unpack(&h, MSG_PROPOSAL), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "both"));
    hostile_proposal_pool(&h, ids, 2, ok, sizeof ok, 0, 4, (uint64_t)1 << 41, 1);
    assert_int_equal(hostile_unpack(&h, MSG_PROPOSAL), TD_EFORMAT);
    hostile_proposal_pool(&h, ids, 2, ok, sizeof ok, 0, 4, 64, MSG_DRAFT_MAX + 1);
    assert_int_equal(hostile_unpack(&h, MSG_PROPOSAL), TD_EFORMAT);
}

/* A gen_start up to its logit bias: one prompt token, greedy, no stop ids, then the tail's
 * first three fields and the penalties. */
static void hostile_gen_start_to_bias(hostile *h, float presence, float frequency)
{
    hostile_begin(h, MSG_PROTOCOL_VERSION, MSG_GEN_START, GEN_START_FIELDS);
    msgpack_pack_uint64(&h->pk, 1);
    msgpack_pack_array(&h->pk, 1);
    msgpack_pack_uint32(&h->pk, 3);
    msgpack_pack_uint32(&h->pk, 10);
    msgpack_pack_array(&h->pk, 5);
    msgpack_pack_float(&h->pk, 0);
    msgpack_pack_uint32(&h->pk, 0);
    msgpack_pack_float(&h->pk, 1);
    msgpack_pack_float(&h->pk, 0);
    msgpack_pack_uint64(&h->pk, 0);
    msgpack_pack_array(&h->pk, 0);
    msgpack_pack_false(&h->pk);
    msgpack_pack_uint32(&h->pk, 0);
    msgpack_pack_false(&h->pk);
    msgpack_pack_float(&h->pk, presence);
    msgpack_pack_float(&h->pk, frequency);
}

/* n bias token ids (all 5), then a bin of n_val floats (all v). */
static void hostile_bias(hostile *h, uint32_t n, uint32_t n_val, float v)
{
    msgpack_pack_array(&h->pk, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_uint32(&h->pk, 5);
    msgpack_pack_bin(&h->pk, 4 * n_val);
    for (uint32_t i = 0; i < n_val; i++) {
        uint32_t bits;
        memcpy(&bits, &v, 4);
        const uint8_t le[4] = {(uint8_t)bits, (uint8_t)(bits >> 8), (uint8_t)(bits >> 16),
                               (uint8_t)(bits >> 24)};
        msgpack_pack_bin_body(&h->pk, le, 4);
    }
}

static void test_gen_start_penalties_and_logit_bias_are_checked(void **state)
{
    (void)state;
    hostile h;
    /* a valid one: read back */
    hostile_gen_start_to_bias(&h, -2, 2);
    hostile_bias(&h, 2, 2, -100);
    hostile_format(&h, MSG_FORMAT_TEXT, 0, false, MSG_TOKEN_NONE, MSG_TOKEN_NONE);
    uint8_t *b = msg_fixture_copy(h.sb.data, h.sb.size);
    msg_gen_start gs;
    assert_int_equal(msg_unpack_gen_start(b, h.sb.size, NULL, &gs), TD_OK);
    assert_true(gs.presence_penalty == -2.0f && gs.frequency_penalty == 2.0f);
    assert_int_equal(gs.n_bias, 2);
    assert_int_equal(gs.bias_tok[1], 5);
    assert_true(gs.bias[1] == -100.0f);
    msg_free_gen_start(&gs);
    free(b);
    msgpack_sbuffer_destroy(&h.sb);
    /* penalties beyond +-2 or not finite */
    const float pen[][2] = {{2.5f, 0}, {0, -2.01f}, {NAN, 0}, {0, INFINITY}};
    const char *const why[] = {"presence penalty", "presence penalty", "presence_penalty",
                               "frequency_penalty"};
    for (size_t k = 0; k < 4; k++) {
        hostile_gen_start_to_bias(&h, pen[k][0], pen[k][1]);
        hostile_bias(&h, 0, 0, 0);
        hostile_format(&h, MSG_FORMAT_TEXT, 0, false, MSG_TOKEN_NONE, MSG_TOKEN_NONE);
        assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);
        assert_non_null(strstr(err_msg(), why[k]));
    }
    /* fewer or more values than ids */
    for (uint32_t n_val = 1; n_val <= 3; n_val += 2) {
        hostile_gen_start_to_bias(&h, 0, 0);
        hostile_bias(&h, 2, n_val, 1);
        hostile_format(&h, MSG_FORMAT_TEXT, 0, false, MSG_TOKEN_NONE, MSG_TOKEN_NONE);
        assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);
        assert_non_null(strstr(err_msg(), "bias"));
    }
    /* a bias beyond +-100, a NaN bias */
    hostile_gen_start_to_bias(&h, 0, 0);
    hostile_bias(&h, 1, 1, 100.5f);
    hostile_format(&h, MSG_FORMAT_TEXT, 0, false, MSG_TOKEN_NONE, MSG_TOKEN_NONE);
    assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "logit bias 100.5"));
    hostile_gen_start_to_bias(&h, 0, 0);
    hostile_bias(&h, 1, 1, NAN);
    hostile_format(&h, MSG_FORMAT_TEXT, 0, false, MSG_TOKEN_NONE, MSG_TOKEN_NONE);
    assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);
    /* one entry over the limit */
    hostile_gen_start_to_bias(&h, 0, 0);
    hostile_bias(&h, MSG_BIAS_MAX + 1, MSG_BIAS_MAX + 1, 1);
    hostile_format(&h, MSG_FORMAT_TEXT, 0, false, MSG_TOKEN_NONE, MSG_TOKEN_NONE);
    assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "bias_tok"));
}

static void test_gen_start_format_fields_are_checked(void **state)
{
    (void)state;
    hostile h;
    /* a schema of the largest size, read back NUL-terminated */
    hostile_gen_start_to_bias(&h, 0, 0);
    hostile_bias(&h, 0, 0, 0);
    hostile_format(&h, MSG_FORMAT_JSON_SCHEMA, MSG_SCHEMA_MAX, true, 4, 5);
    uint8_t *b = msg_fixture_copy(h.sb.data, h.sb.size);
    msg_gen_start gs;
    assert_int_equal(msg_unpack_gen_start(b, h.sb.size, NULL, &gs), TD_OK);
    assert_int_equal(gs.format, MSG_FORMAT_JSON_SCHEMA);
    assert_int_equal(gs.n_schema, MSG_SCHEMA_MAX);
    assert_int_equal(gs.schema[0], '{');
    assert_int_equal(gs.schema[MSG_SCHEMA_MAX], 0);
    assert_true(gs.think_open && gs.think_start == 4 && gs.think_end == 5);
    msg_free_gen_start(&gs);
    free(b);
    msgpack_sbuffer_destroy(&h.sb);
    /* one byte over; a schema without its format; the format without a schema; an unknown
     * format; a reasoning block that cannot end */
    const struct {
        uint32_t format, n;
        bool open;
        uint32_t end;
        const char *why;
    } bad[] = {
        {MSG_FORMAT_JSON_SCHEMA, MSG_SCHEMA_MAX + 1, false, 5, "schema"},
        {MSG_FORMAT_JSON_OBJECT, 3, false, 5, "schema of 3 bytes"},
        {MSG_FORMAT_JSON_SCHEMA, 0, false, 5, "schema of 0 bytes"},
        {MSG_FORMAT_JSON_OBJECT_COMPACT, 3, false, 5, "schema of 3 bytes"},
        {MSG_FORMAT_JSON_SCHEMA_COMPACT, 0, false, 5, "schema of 0 bytes"},
        {MSG_FORMAT_END, 0, false, 5, "format"},
        {MSG_FORMAT_JSON_OBJECT, 0, true, MSG_TOKEN_NONE, "reasoning block"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        hostile_gen_start_to_bias(&h, 0, 0);
        hostile_bias(&h, 0, 0, 0);
        hostile_format(&h, bad[k].format, bad[k].n, bad[k].open, MSG_TOKEN_NONE, bad[k].end);
        assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);
        assert_non_null(strstr(err_msg(), bad[k].why));
    }
}

static void test_new_messages_refuse_values_that_break_their_rules(void **state)
{
    (void)state;
    hostile h;
    /* gen_event: alternatives with fewer log probabilities than ids; a positive logprob */
    for (int k = 0; k < 2; k++) {
        hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_EVENT, 8);
        msgpack_pack_uint64(&h.pk, 1);
        msgpack_pack_uint64(&h.pk, MSG_EVENT_TOKEN);
        msgpack_pack_array(&h.pk, 1);
        msgpack_pack_uint32(&h.pk, 42);
        msgpack_pack_array(&h.pk, 1);
        msgpack_pack_array(&h.pk, 3);
        msgpack_pack_float(&h.pk, k == 0 ? -1.0f : 0.5f);
        msgpack_pack_array(&h.pk, 2);
        msgpack_pack_uint32(&h.pk, 42);
        msgpack_pack_uint32(&h.pk, 43);
        msgpack_pack_array(&h.pk, k == 0 ? 1 : 2);
        msgpack_pack_float(&h.pk, -1.0f);
        if (k == 1)
            msgpack_pack_float(&h.pk, -2.0f);
        msgpack_pack_uint64(&h.pk, MSG_FINISH_NONE);
        msgpack_pack_array(&h.pk, 5);
        for (int i = 0; i < 5; i++)
            msgpack_pack_uint32(&h.pk, 1);
        msgpack_pack_uint64(&h.pk, TD_OK);
        hostile_str(&h, "", 0);
        assert_int_equal(hostile_unpack(&h, MSG_GEN_EVENT), TD_EFORMAT);
    }
    /* gen_start: logprobs as an integer instead of a bool */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_GEN_START, GEN_START_FIELDS);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_array(&h.pk, 1);
    msgpack_pack_uint32(&h.pk, 3);
    msgpack_pack_uint32(&h.pk, 10);
    msgpack_pack_array(&h.pk, 5);
    msgpack_pack_float(&h.pk, 0);
    msgpack_pack_uint32(&h.pk, 0);
    msgpack_pack_float(&h.pk, 1);
    msgpack_pack_float(&h.pk, 0);
    msgpack_pack_uint64(&h.pk, 0);
    msgpack_pack_array(&h.pk, 0);
    msgpack_pack_uint32(&h.pk, 1);
    msgpack_pack_uint32(&h.pk, 0);
    msgpack_pack_false(&h.pk);
    assert_int_equal(hostile_unpack(&h, MSG_GEN_START), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "logprobs"));
    /* kv_attach from a gateway, and with pid 0 */
    for (int k = 0; k < 2; k++) {
        hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_KV_ATTACH, 4);
        msgpack_pack_uint64(&h.pk, k == 0 ? MSG_ROLE_GATEWAY : MSG_ROLE_VERIFYD);
        msgpack_pack_uint64(&h.pk, k == 0 ? 7 : 0);
        msgpack_pack_array(&h.pk, KVL_N_PARAMS);
        for (int i = 0; i < KVL_N_PARAMS; i++)
            msgpack_pack_uint32(&h.pk, 1);
        msgpack_pack_array(&h.pk, 0);
        assert_int_equal(hostile_unpack(&h, MSG_KV_ATTACH), TD_EFORMAT);
    }
    /* kv_pools: a cpu pool with a device UUID */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_KV_POOLS, 2);
    msgpack_pack_array(&h.pk, KVL_N_PARAMS);
    for (int i = 0; i < KVL_N_PARAMS; i++)
        msgpack_pack_uint32(&h.pk, 1);
    msgpack_pack_array(&h.pk, 1);
    msgpack_pack_array(&h.pk, 5);
    hostile_str(&h, "kvd.target", 10);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_uint64(&h.pk, MSG_SHBUF_CPU);
    msgpack_pack_uint64(&h.pk, 4096);
    hostile_str(&h, "GPU-1", 5);
    assert_int_equal(hostile_unpack(&h, MSG_KV_POOLS), TD_EFORMAT);
    /* kv_close: tokens for a slot that is not kept */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_KV_CLOSE, 4);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_uint64(&h.pk, 1);
    msgpack_pack_false(&h.pk);
    msgpack_pack_array(&h.pk, 1);
    msgpack_pack_uint32(&h.pk, 3);
    assert_int_equal(hostile_unpack(&h, MSG_KV_CLOSE), TD_EFORMAT);
    /* svc_list: nine services; a service name with a slash */
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_SVC_LIST, 1);
    msgpack_pack_array(&h.pk, MSG_SVC_MAX + 1);
    for (int i = 0; i < MSG_SVC_MAX + 1; i++) {
        msgpack_pack_array(&h.pk, 4);
        hostile_str(&h, "kvd", 3);
        msgpack_pack_uint32(&h.pk, 1);
        msgpack_pack_uint32(&h.pk, 1);
        msgpack_pack_uint32(&h.pk, 1);
    }
    assert_int_equal(hostile_unpack(&h, MSG_SVC_LIST), TD_EFORMAT);
    hostile_begin(&h, MSG_PROTOCOL_VERSION, MSG_SVC_RESTART, 2);
    hostile_str(&h, "../kvd", 6);
    hostile_str(&h, "", 0);
    assert_int_equal(hostile_unpack(&h, MSG_SVC_RESTART), TD_EFORMAT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
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
        cmocka_unit_test(test_proposal_distributions_are_checked),
        cmocka_unit_test(test_new_messages_refuse_values_that_break_their_rules),
        cmocka_unit_test(test_gen_start_penalties_and_logit_bias_are_checked),
        cmocka_unit_test(test_gen_start_format_fields_are_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
