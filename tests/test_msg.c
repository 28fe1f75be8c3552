/* Message pack/unpack: exact wire bytes written by hand from the msgpack specification,
 * round trips of every type with exact values, every truncation of every message, and the
 * limits pack enforces. Hostile inputs are in test_msg_hostile.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/msg.h"
#include "tests/support/msg_fixture.h"

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
    msg_hello in = msg_fixture_hello(), out;
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
    msg_shbuf_announce in = msg_fixture_shbuf(), out;
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
    msg_gen_start in = msg_fixture_gen_start(), out;
    uint64_t rid = 0;
    assert_int_equal(msg_pack_gen_start(&b, 0xabcdef, &in), TD_OK);
    assert_int_equal(msg_unpack_gen_start(b.data, b.len, &rid, &out), TD_OK);
    assert_int_equal(rid, 0xabcdef);
    assert_int_equal(out.seq_id, 0x0123456789abcdefull);
    assert_int_equal(out.n_prompt, 7);
    assert_memory_equal(out.prompt, msg_fixture_prompt, sizeof msg_fixture_prompt);
    assert_int_equal(out.max_tokens, 512);
    assert_true(out.sampler.temperature == 0.7f);
    assert_int_equal(out.sampler.top_k, 20);
    assert_true(out.sampler.top_p == 0.95f);
    assert_true(out.sampler.min_p == 0.05f);
    assert_int_equal(out.sampler.seed, 18446744073709551615ull);
    assert_int_equal(out.n_stop, 2);
    assert_memory_equal(out.stop, msg_fixture_stop, sizeof msg_fixture_stop);
    assert_int_equal(out.format, MSG_FORMAT_JSON_SCHEMA);
    assert_int_equal(out.n_schema, strlen(msg_fixture_schema));
    assert_string_equal(out.schema, msg_fixture_schema);
    assert_true(out.think_open);
    assert_int_equal(out.think_start, 151667);
    assert_int_equal(out.think_end, 151668);
    assert_true(out.repetition_penalty == 1.125f);
    assert_int_equal(out.min_tokens, 9);
    assert_true(out.prompt_logprobs);
    assert_int_equal(out.n_predict, 3);
    assert_int_equal(out.predict[2], 151643);
    assert_int_equal(out.n_allowed, 2);
    assert_int_equal(out.allowed[1], 151645);
    assert_int_equal(out.n_bad, 5);
    assert_int_equal(out.bad[2], 11);
    assert_int_equal(out.bad[4], 151643);
    msg_free_gen_start(&out);
    assert_null(out.bad);
    assert_null(out.predict);
    assert_null(out.allowed);
    assert_null(out.prompt);
    assert_null(out.schema);

    /* a schema needs the schema format and the format needs one; a reasoning block needs
     * its end token */
    msg_gen_start bad = in;
    bad.format = MSG_FORMAT_JSON_OBJECT;
    assert_int_equal(msg_pack_gen_start(&b, 1, &bad), TD_EINVAL);
    bad.schema = NULL;
    bad.n_schema = 0;
    bad.think_end = MSG_TOKEN_NONE;
    assert_int_equal(msg_pack_gen_start(&b, 1, &bad), TD_EINVAL);
    bad.think_end = 7;
    assert_int_equal(msg_pack_gen_start(&b, 1, &bad), TD_OK);
    bad.format = MSG_FORMAT_JSON_SCHEMA;
    assert_int_equal(msg_pack_gen_start(&b, 1, &bad), TD_EINVAL);
    bad.format = MSG_FORMAT_END;
    assert_int_equal(msg_pack_gen_start(&b, 1, &bad), TD_EINVAL);
    msg_gen_start worse = in; /* a bad word's length must fit its entries, 1..64 tokens */
    static const uint32_t overrun[3] = {3, 10, 11}, empty[2] = {0, 10}, fits[3] = {2, 10, 11};
    worse.bad = overrun;
    worse.n_bad = 3;
    assert_int_equal(msg_pack_gen_start(&b, 1, &worse), TD_EINVAL);
    worse.bad = empty;
    worse.n_bad = 2;
    assert_int_equal(msg_pack_gen_start(&b, 1, &worse), TD_EINVAL);
    worse.bad = fits;
    worse.n_bad = 3;
    assert_int_equal(msg_pack_gen_start(&b, 1, &worse), TD_OK);
    bad.format = MSG_FORMAT_GRAMMAR; /* a grammar or a regex needs its text */
    assert_int_equal(msg_pack_gen_start(&b, 1, &bad), TD_EINVAL);
    bad.format = MSG_FORMAT_REGEX;
    assert_int_equal(msg_pack_gen_start(&b, 1, &bad), TD_EINVAL);
    static const char re[] = "[A-Z]\\d{2}";
    bad.schema = re;
    bad.n_schema = sizeof re - 1;
    assert_int_equal(msg_pack_gen_start(&b, 1, &bad), TD_OK);
    assert_int_equal(msg_unpack_gen_start(b.data, b.len, NULL, &out), TD_OK);
    assert_int_equal(out.format, MSG_FORMAT_REGEX);
    assert_string_equal(out.schema, re);
    msg_free_gen_start(&out);

    /* the prompt only: max_tokens 0 */
    msg_gen_start only = in;
    only.max_tokens = 0;
    only.prompt_logprobs = false;
    assert_int_equal(msg_pack_gen_start(&b, 1, &only), TD_OK);
    assert_int_equal(msg_unpack_gen_start(b.data, b.len, NULL, &out), TD_OK);
    assert_int_equal(out.max_tokens, 0);
    assert_false(out.prompt_logprobs);
    msg_free_gen_start(&out);

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

    msg_gen_event tok = msg_fixture_gen_event(MSG_EVENT_TOKEN);
    assert_int_equal(msg_pack_gen_event(&b, 21, &tok), TD_OK);
    assert_int_equal(msg_unpack_gen_event(b.data, b.len, &rid, &out), TD_OK);
    assert_int_equal(rid, 21);
    assert_int_equal(out.seq_id, 9);
    assert_int_equal(out.kind, MSG_EVENT_TOKEN);
    assert_int_equal(out.n_tokens, 4);
    assert_memory_equal(out.tokens, msg_fixture_tokens, sizeof msg_fixture_tokens);
    assert_int_equal(out.finish, MSG_FINISH_NONE);
    assert_int_equal(out.usage.prompt_tokens, 7);
    assert_int_equal(out.usage.completion_tokens, 40);
    assert_int_equal(out.usage.steps, 5);
    assert_int_equal(out.code, TD_OK);
    assert_string_equal(out.message, "");
    msg_free_gen_event(&out);

    msg_gen_event done = msg_fixture_gen_event(MSG_EVENT_DONE);
    assert_int_equal(msg_pack_gen_event(&b, 22, &done), TD_OK);
    assert_int_equal(msg_unpack_gen_event(b.data, b.len, &rid, &out), TD_OK);
    assert_int_equal(rid, 22);
    assert_int_equal(out.kind, MSG_EVENT_DONE);
    assert_int_equal(out.finish, MSG_FINISH_LENGTH);
    assert_memory_equal(out.tokens, msg_fixture_tokens, sizeof msg_fixture_tokens);
    msg_free_gen_event(&out);

    msg_gen_event err = msg_fixture_gen_event(MSG_EVENT_ERROR);
    assert_int_equal(msg_pack_gen_event(&b, 23, &err), TD_OK);
    assert_int_equal(msg_unpack_gen_event(b.data, b.len, &rid, &out), TD_OK);
    assert_int_equal(out.kind, MSG_EVENT_ERROR);
    assert_int_equal(out.finish, MSG_FINISH_ERROR);
    assert_int_equal(out.code, TD_ENOMEM);
    assert_string_equal(out.message, "kv pages exhausted: 0 of 4096 free");
    assert_int_equal(out.n_tokens, 0);
    assert_null(out.tokens);
    msg_free_gen_event(&out);

    /* prompt tokens come with one log probability each, and nothing ends with them */
    msg_gen_event prompt = msg_fixture_gen_event_logprobs();
    prompt.kind = MSG_EVENT_PROMPT;
    assert_int_equal(msg_pack_gen_event(&b, 24, &prompt), TD_OK);
    assert_int_equal(msg_unpack_gen_event(b.data, b.len, &rid, &out), TD_OK);
    assert_int_equal(out.kind, MSG_EVENT_PROMPT);
    assert_int_equal(out.n_tokens, 4);
    assert_int_equal(out.n_logprobs, 4);
    assert_true(out.logprobs[3].logprob == prompt.logprobs[3].logprob);
    assert_false(msg_event_last(out.kind));
    msg_free_gen_event(&out);
    prompt.n_logprobs = 0;
    prompt.logprobs = NULL;
    assert_int_equal(msg_pack_gen_event(&b, 25, &prompt), TD_EINVAL);
    prompt = msg_fixture_gen_event_logprobs();
    prompt.kind = MSG_EVENT_PROMPT;
    prompt.finish = MSG_FINISH_STOP;
    assert_int_equal(msg_pack_gen_event(&b, 26, &prompt), TD_EINVAL);
    assert_true(msg_event_last(MSG_EVENT_DONE) && msg_event_last(MSG_EVENT_ERROR));
    assert_false(msg_event_last(MSG_EVENT_TOKEN));
    msg_buf_free(&b);
}

static void test_header_names_type_and_request_id(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    msg_gen_start gs = msg_fixture_gen_start();
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


static void test_gen_cancel_wire_bytes_match_the_msgpack_spec(void **state)
{
    (void)state;
    /* [1, 8, 2, [uint16 0x1234]] */
    static const uint8_t want[] = {0x94, 0x01, 0x08, 0x02, 0x91, 0xcd, 0x12, 0x34};
    msg_buf b;
    msg_buf_init(&b);
    msg_gen_cancel c = {.seq_id = 0x1234};
    assert_int_equal(msg_pack_gen_cancel(&b, 2, &c), TD_OK);
    assert_int_equal(b.len, sizeof want);
    assert_memory_equal(b.data, want, sizeof want);
    msg_gen_cancel out;
    uint64_t rid = 0;
    assert_int_equal(msg_unpack_gen_cancel(b.data, b.len, &rid, &out), TD_OK);
    assert_int_equal(out.seq_id, 0x1234);
    assert_int_equal(rid, 2);
    msg_buf_free(&b);
}

static void test_proposal_probabilities_travel_as_little_endian_f32(void **state)
{
    (void)state;
    /* one token 5 with q = {5: 0.5} in the message, no pool rows:
     * [1, 13, 0, [1, 2, [5], [[[5], bin8 4 00 00 00 3f]], 0, 0, 0]] */
    static const uint8_t want[] = {0x94, 0x01, 0x0d, 0x00, 0x97, 0x01, 0x02, 0x91, 0x05,
                                   0x91, 0x92, 0x91, 0x05, 0xc4, 0x04, 0x00, 0x00, 0x00, 0x3f,
                                   0x00, 0x00, 0x00};
    static const uint32_t tok[1] = {5}, ids[1] = {5};
    static const float p[1] = {0.5f};
    msg_draft_q q = {ids, p, 1};
    msg_proposal m = {.seq_id = 1, .n_past = 2, .tokens = tok, .n_tokens = 1, .q = &q, .n_q = 1};
    msg_buf b;
    msg_buf_init(&b);
    assert_int_equal(msg_pack_proposal(&b, 0, &m), TD_OK);
    assert_int_equal(b.len, sizeof want);
    assert_memory_equal(b.data, want, sizeof want);
    msg_buf_free(&b);
}

static void test_proposal_in_the_pool_carries_only_generation_offset_and_rows(void **state)
{
    (void)state;
    /* two tokens whose distributions are rows of proposal pool generation 3 at byte 256:
     * [1, 13, 0, [1, 2, [5, 6], [], 3, 256, 2]] */
    static const uint8_t want[] = {0x94, 0x01, 0x0d, 0x00, 0x97, 0x01, 0x02, 0x92, 0x05, 0x06,
                                   0x90, 0x03, 0xcd, 0x01, 0x00, 0x02};
    static const uint32_t tok[2] = {5, 6};
    msg_proposal m = {.seq_id = 1, .n_past = 2, .tokens = tok, .n_tokens = 2, .q_gen = 3,
                      .q_offset = 256, .q_rows = 2};
    msg_buf b;
    msg_buf_init(&b);
    assert_int_equal(msg_pack_proposal(&b, 0, &m), TD_OK);
    assert_int_equal(b.len, sizeof want);
    assert_memory_equal(b.data, want, sizeof want);
    msg_proposal out;
    assert_int_equal(msg_unpack_proposal(b.data, b.len, NULL, &out), TD_OK);
    assert_int_equal(out.q_gen, 3);
    assert_int_equal(out.q_offset, 256);
    assert_int_equal(out.q_rows, 2);
    assert_int_equal(out.n_q, 0);
    msg_free_proposal(&out);
    /* rows for another number of tokens, or at generation 0, are refused */
    m.q_rows = 1;
    assert_int_equal(msg_pack_proposal(&b, 0, &m), TD_EINVAL);
    m.q_rows = 2;
    m.q_gen = 0;
    assert_int_equal(msg_pack_proposal(&b, 0, &m), TD_EINVAL);
    msg_buf_free(&b);
}

static void test_gen_start_carries_logprobs_and_ignore_eos(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    msg_gen_start in = msg_fixture_gen_start(), out;
    assert_int_equal(msg_pack_gen_start(&b, 1, &in), TD_OK);
    assert_int_equal(msg_unpack_gen_start(b.data, b.len, NULL, &out), TD_OK);
    assert_true(out.logprobs);
    assert_int_equal(out.top_logprobs, 5);
    assert_true(out.ignore_eos);
    msg_free_gen_start(&out);
    in.logprobs = false;
    in.top_logprobs = 0;
    in.ignore_eos = false;
    assert_int_equal(msg_pack_gen_start(&b, 1, &in), TD_OK);
    assert_int_equal(msg_unpack_gen_start(b.data, b.len, NULL, &out), TD_OK);
    assert_false(out.logprobs);
    assert_int_equal(out.top_logprobs, 0);
    assert_false(out.ignore_eos);
    msg_free_gen_start(&out);
    msg_buf_free(&b);
}

static void test_gen_start_carries_penalties_and_logit_bias(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    msg_gen_start in = msg_fixture_gen_start(), out;
    assert_int_equal(msg_pack_gen_start(&b, 1, &in), TD_OK);
    assert_int_equal(msg_unpack_gen_start(b.data, b.len, NULL, &out), TD_OK);
    assert_true(out.presence_penalty == 0.5f);
    assert_true(out.frequency_penalty == -1.75f);
    assert_int_equal(out.n_bias, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(out.bias_tok[i], msg_fixture_bias_tok[i]);
        assert_true(out.bias[i] == msg_fixture_bias[i]);
    }
    msg_free_gen_start(&out);
    assert_null(out.bias_tok);
    /* none of them */
    in.presence_penalty = in.frequency_penalty = 0;
    in.n_bias = 0;
    in.bias_tok = NULL;
    in.bias = NULL;
    assert_int_equal(msg_pack_gen_start(&b, 1, &in), TD_OK);
    assert_int_equal(msg_unpack_gen_start(b.data, b.len, NULL, &out), TD_OK);
    assert_int_equal(out.n_bias, 0);
    assert_null(out.bias_tok);
    assert_true(out.presence_penalty == 0.0f && out.frequency_penalty == 0.0f);
    msg_free_gen_start(&out);
    /* out of range: refused when packing */
    in = msg_fixture_gen_start();
    in.presence_penalty = 2.5f;
    assert_int_equal(msg_pack_gen_start(&b, 1, &in), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "presence penalty"));
    in = msg_fixture_gen_start();
    in.frequency_penalty = NAN;
    assert_int_equal(msg_pack_gen_start(&b, 1, &in), TD_EINVAL);
    in = msg_fixture_gen_start();
    const float big[3] = {0, 100.5f, 0};
    in.bias = big;
    assert_int_equal(msg_pack_gen_start(&b, 1, &in), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "logit bias 100.5 for token 248319"));
    in = msg_fixture_gen_start();
    in.n_bias = MSG_BIAS_MAX + 1;
    assert_int_equal(msg_pack_gen_start(&b, 1, &in), TD_EINVAL);
    msg_buf_free(&b);
}

static void test_gen_event_logprobs_and_cached_tokens_round_trip(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    msg_gen_event in = msg_fixture_gen_event_logprobs(), out;
    assert_int_equal(msg_pack_gen_event(&b, 5, &in), TD_OK);
    assert_int_equal(msg_unpack_gen_event(b.data, b.len, NULL, &out), TD_OK);
    assert_int_equal(out.usage.cached_tokens, 5);
    assert_int_equal(out.usage.predicted_tokens, 11);
    assert_int_equal(out.n_logprobs, 4);
    assert_true(out.logprobs[0].logprob == -0.25f);
    assert_int_equal(out.logprobs[0].rank, 1);
    assert_int_equal(out.logprobs[1].rank, 2);
    assert_int_equal(out.logprobs[3].rank, 248320);
    assert_int_equal(out.logprobs[0].n_top, 2);
    assert_int_equal(out.logprobs[0].top_id[1], 5);
    assert_true(out.logprobs[0].top_logprob[1] == -1.75f);
    assert_true(out.logprobs[1].logprob == -3.5f);
    assert_int_equal(out.logprobs[2].top_id[0], 248070);
    assert_true(out.logprobs[2].top_logprob[1] == -30.0f);
    assert_int_equal(out.logprobs[3].top_id[1], 65537);
    msg_free_gen_event(&out);
    assert_null(out.logprobs);
    msg_buf_free(&b);
}

static void test_control_messages_round_trip(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    uint64_t rid = 0;

    msg_ack ack = {.id = 0xffffffffffull}, ack_out;
    assert_int_equal(msg_pack_ack(&b, 8, &ack), TD_OK);
    assert_int_equal(msg_unpack_ack(b.data, b.len, &rid, &ack_out), TD_OK);
    assert_int_equal(ack_out.id, 0xffffffffffull);
    assert_int_equal(rid, 8);

    assert_int_equal(msg_pack_status_get(&b, 9), TD_OK);
    assert_int_equal(b.len, 5); /* [1, 10, 9, []] */
    assert_int_equal(msg_unpack_status_get(b.data, b.len, &rid), TD_OK);
    assert_int_equal(rid, 9);
    assert_int_equal(msg_unpack_svc_list_get(b.data, b.len, &rid), TD_EPROTO);

    msg_status st = msg_fixture_status(), st_out;
    assert_int_equal(msg_pack_status(&b, 10, &st), TD_OK);
    assert_int_equal(msg_unpack_status(b.data, b.len, NULL, &st_out), TD_OK);
    assert_string_equal(st_out.model, "qwen35-tiny");
    assert_int_equal(st_out.n_ctx, 4096);
    assert_int_equal(st_out.n_vocab, 248320);
    assert_true(st_out.ready && st_out.draft_attached);
    assert_int_equal(st_out.block, 16);
    assert_int_equal(st_out.slots, 16);
    assert_int_equal(st_out.active, 3);
    assert_int_equal(st_out.queued, 1);
    assert_int_equal(st_out.requests, 1ull << 33);
    assert_int_equal(st_out.prompt_tokens, 9000);
    assert_int_equal(st_out.cached_tokens, 4000);
    assert_int_equal(st_out.completion_tokens, 12345);
    assert_int_equal(st_out.steps, 1500);
    assert_int_equal(st_out.drafted, 22500);
    assert_int_equal(st_out.accepted, 10845);
    assert_int_equal(st_out.prefill_us, 111);
    assert_int_equal(st_out.draft_us, 222);
    assert_int_equal(st_out.verify_us, 333);
    assert_int_equal(st_out.draft_attaches, 2);
    assert_int_equal(st_out.draft_failures, 5);
    assert_int_equal(st_out.graph_recorded, 7);
    assert_int_equal(st_out.graph_replayed, 1ull << 40);
    assert_int_equal(st_out.graph_direct, 13);
    assert_string_equal(st_out.not_ready, "");
    assert_int_equal(st_out.n_hist, 17);
    assert_int_equal(st_out.accept_hist[16], 256);
    st.ready = false; /* and why */
    snprintf(st.not_ready, sizeof st.not_ready, "kvd attach: the pools do not fit the GPU");
    assert_int_equal(msg_pack_status(&b, 9, &st), TD_OK);
    assert_int_equal(msg_unpack_status(b.data, b.len, NULL, &st_out), TD_OK);
    assert_false(st_out.ready);
    assert_string_equal(st_out.not_ready, "kvd attach: the pools do not fit the GPU");

    msg_svc_list sl = msg_fixture_svc_list(), sl_out;
    assert_int_equal(msg_pack_svc_list(&b, 11, &sl), TD_OK);
    assert_int_equal(msg_unpack_svc_list(b.data, b.len, NULL, &sl_out), TD_OK);
    assert_int_equal(sl_out.n, 3);
    assert_string_equal(sl_out.svc[1].name, "verifyd");
    assert_int_equal(sl_out.svc[1].pid, 101);
    assert_int_equal(sl_out.svc[1].uptime_ms, 4000);
    assert_int_equal(sl_out.svc[1].restarts, 2);
    assert_int_equal(sl_out.svc[2].pid, 0);

    msg_svc_restart sr = msg_fixture_svc_restart(), sr_out;
    assert_int_equal(msg_pack_svc_restart(&b, 12, &sr), TD_OK);
    assert_int_equal(msg_unpack_svc_restart(b.data, b.len, NULL, &sr_out), TD_OK);
    assert_string_equal(sr_out.name, "draftd");
    assert_string_equal(sr_out.draft, "/models/dflash-b16");
    msg_buf_free(&b);
}

static void test_propose_and_proposal_round_trip(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    msg_propose pr = msg_fixture_propose(), pr_out;
    assert_int_equal(msg_pack_propose(&b, 13, &pr), TD_OK);
    assert_int_equal(msg_unpack_propose(b.data, b.len, NULL, &pr_out), TD_OK);
    assert_int_equal(pr_out.seq_id, 77);
    assert_int_equal(pr_out.slot, 15);
    assert_int_equal(pr_out.slot_gen, 1ull << 40);
    assert_int_equal(pr_out.pool_gen, 1764443000123456789ull);
    assert_int_equal(pr_out.n_past, 1200);
    assert_int_equal(pr_out.pending, 248069);
    assert_int_equal(pr_out.n_draft, 15);
    assert_true(pr_out.sampler.temperature == 0.6f);
    assert_int_equal(pr_out.sampler.top_k, 20);
    assert_int_equal(pr_out.sampler.seed, 9);

    msg_proposal greedy = msg_fixture_proposal(0), out;
    assert_int_equal(msg_pack_proposal(&b, 14, &greedy), TD_OK);
    assert_int_equal(msg_unpack_proposal(b.data, b.len, NULL, &out), TD_OK);
    assert_int_equal(out.n_tokens, 3);
    assert_int_equal(out.tokens[2], 511);
    assert_int_equal(out.n_q, 0);
    assert_null(out.q);
    msg_free_proposal(&out);

    msg_proposal sampled = msg_fixture_proposal(1);
    assert_int_equal(msg_pack_proposal(&b, 15, &sampled), TD_OK);
    assert_int_equal(msg_unpack_proposal(b.data, b.len, NULL, &out), TD_OK);
    assert_int_equal(out.n_q, 3);
    assert_int_equal(out.q[0].n, 3);
    assert_int_equal(out.q[0].ids[2], 70);
    assert_true(out.q[0].p[1] == 0.5f);
    assert_int_equal(out.q[1].n, 1);
    assert_true(out.q[1].p[0] == 1.0f);
    assert_int_equal(out.q[2].ids[2], 511);
    assert_true(out.q[2].p[0] == 0.125f);
    msg_free_proposal(&out);
    assert_null(out.q);
    msg_buf_free(&b);
}

static void test_kvd_messages_round_trip(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    msg_kv_attach ka = msg_fixture_kv_attach(), ka_out;
    assert_int_equal(msg_pack_kv_attach(&b, 1, &ka), TD_OK);
    assert_int_equal(msg_unpack_kv_attach(b.data, b.len, NULL, &ka_out), TD_OK);
    assert_int_equal(ka_out.role, MSG_ROLE_DRAFTD);
    assert_int_equal(ka_out.pid, 31337);
    assert_memory_equal(&ka_out.params, &ka.params, sizeof ka.params);
    assert_int_equal(ka_out.n_taps, 3);
    assert_memory_equal(ka_out.taps, msg_fixture_taps, sizeof msg_fixture_taps);
    assert_int_equal(ka_out.n_heads, 0);
    msg_free_kv_attach(&ka_out);

    /* verifyd on a GPU announces its two heads with the attach; draftd may not */
    msg_kv_attach kv = ka;
    kv.role = MSG_ROLE_VERIFYD;
    kv.n_heads = 2;
    kv.heads[0] = (msg_shbuf_announce){"verifyd.tok_embd", 9, MSG_SHBUF_CUDA, 1u << 20,
                                       "GPU-8f3c2a1e-1b2c-4d5e-9f00-0123456789ab"};
    kv.heads[1] = (msg_shbuf_announce){"verifyd.output", 10, MSG_SHBUF_CUDA, 3u << 20,
                                       "GPU-8f3c2a1e-1b2c-4d5e-9f00-0123456789ab"};
    kv.reserve = (3ull << 30) + 12345; /* a drafter's weights and working memory */
    assert_int_equal(msg_pack_kv_attach(&b, 1, &kv), TD_OK);
    assert_int_equal(msg_unpack_kv_attach(b.data, b.len, NULL, &ka_out), TD_OK);
    assert_int_equal(ka_out.reserve, (3ull << 30) + 12345);
    assert_int_equal(ka_out.n_heads, 2);
    assert_string_equal(ka_out.heads[1].name, "verifyd.output");
    assert_int_equal(ka_out.heads[1].generation, 10);
    assert_int_equal(ka_out.heads[1].size, 3u << 20);
    assert_int_equal(ka_out.heads[0].kind, MSG_SHBUF_CUDA);
    assert_string_equal(ka_out.heads[0].device_uuid, kv.heads[0].device_uuid);
    msg_free_kv_attach(&ka_out);
    kv.role = MSG_ROLE_DRAFTD;
    assert_int_equal(msg_pack_kv_attach(&b, 1, &kv), TD_EINVAL);
    kv.n_heads = 0; /* nor a reserve: only verifyd knows what the drafter needs */
    assert_int_equal(msg_pack_kv_attach(&b, 1, &kv), TD_EINVAL);
    kv.reserve = 0;
    assert_int_equal(msg_pack_kv_attach(&b, 1, &kv), TD_OK);

    msg_kv_pools kp = msg_fixture_kv_pools(), kp_out;
    assert_int_equal(msg_pack_kv_pools(&b, 2, &kp), TD_OK);
    assert_int_equal(msg_unpack_kv_pools(b.data, b.len, NULL, &kp_out), TD_OK);
    assert_memory_equal(&kp_out.params, &kp.params, sizeof kp.params);
    assert_int_equal(kp_out.n_pools, 2);
    assert_string_equal(kp_out.pools[0].name, "kvd.target");
    assert_int_equal(kp_out.pools[0].kind, MSG_SHBUF_CPU);
    assert_int_equal(kp_out.pools[0].size, 1u << 24);
    assert_int_equal(kp_out.pools[0].generation, 5);
    assert_string_equal(kp_out.pools[1].name, "kvd.draft");
    assert_string_equal(kp_out.pools[1].device_uuid, "GPU-8f3c2a1e-1b2c-4d5e-9f00-0123456789ab");

    msg_kv_open ko = {.pid = 9, .tokens = msg_fixture_prompt, .n_tokens = 7}, ko_out;
    assert_int_equal(msg_pack_kv_open(&b, 3, &ko), TD_OK);
    assert_int_equal(msg_unpack_kv_open(b.data, b.len, NULL, &ko_out), TD_OK);
    assert_int_equal(ko_out.pid, 9);
    assert_int_equal(ko_out.n_tokens, 7);
    assert_memory_equal(ko_out.tokens, msg_fixture_prompt, sizeof msg_fixture_prompt);
    msg_free_kv_open(&ko_out);

    msg_kv_slot ks = {.slot = 1023, .slot_gen = 1ull << 50, .pool_gen = 77, .n_cached = 4095},
                ks_out;
    assert_int_equal(msg_pack_kv_slot(&b, 4, &ks), TD_OK);
    assert_int_equal(msg_unpack_kv_slot(b.data, b.len, NULL, &ks_out), TD_OK);
    assert_int_equal(ks_out.slot, 1023);
    assert_int_equal(ks_out.slot_gen, 1ull << 50);
    assert_int_equal(ks_out.pool_gen, 77);
    assert_int_equal(ks_out.n_cached, 4095);

    msg_kv_close kc = {.slot = 2, .slot_gen = 3, .keep = true, .tokens = msg_fixture_stop,
                       .n_tokens = 2}, kc_out;
    assert_int_equal(msg_pack_kv_close(&b, 5, &kc), TD_OK);
    assert_int_equal(msg_unpack_kv_close(b.data, b.len, NULL, &kc_out), TD_OK);
    assert_int_equal(kc_out.slot, 2);
    assert_int_equal(kc_out.slot_gen, 3);
    assert_true(kc_out.keep);
    assert_memory_equal(kc_out.tokens, msg_fixture_stop, sizeof msg_fixture_stop);
    msg_free_kv_close(&kc_out);
    kc = (msg_kv_close){.slot = 2, .slot_gen = 3};
    assert_int_equal(msg_pack_kv_close(&b, 6, &kc), TD_OK);
    assert_int_equal(msg_unpack_kv_close(b.data, b.len, NULL, &kc_out), TD_OK);
    assert_false(kc_out.keep);
    assert_int_equal(kc_out.n_tokens, 0);
    msg_buf_free(&b);
}

static void test_pack_refuses_new_types_out_of_range(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    msg_gen_start gs = msg_fixture_gen_start();
    gs.top_logprobs = MSG_TOP_LOGPROBS_MAX + 1;
    assert_int_equal(msg_pack_gen_start(&b, 1, &gs), TD_EINVAL);
    gs = msg_fixture_gen_start();
    gs.logprobs = false; /* alternatives for the prompt's tokens only */
    assert_int_equal(msg_pack_gen_start(&b, 1, &gs), TD_OK);
    gs.prompt_logprobs = false; /* alternatives without the token's own log probability */
    assert_int_equal(msg_pack_gen_start(&b, 1, &gs), TD_EINVAL);
    msg_gen_event ev = msg_fixture_gen_event_logprobs();
    ev.n_logprobs = 3;
    assert_int_equal(msg_pack_gen_event(&b, 1, &ev), TD_EINVAL);
    ev = msg_fixture_gen_event_logprobs();
    ev.usage.cached_tokens = 8;
    assert_int_equal(msg_pack_gen_event(&b, 1, &ev), TD_EINVAL);
    msg_logprob bad = {.logprob = 0.5f};
    ev = msg_fixture_gen_event_logprobs();
    ev.n_tokens = 1;
    ev.n_logprobs = 1;
    ev.logprobs = &bad;
    assert_int_equal(msg_pack_gen_event(&b, 1, &ev), TD_EINVAL);
    bad = (msg_logprob){.logprob = -1.0f, .rank = (uint32_t)INT32_MAX + 1};
    assert_int_equal(msg_pack_gen_event(&b, 1, &ev), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "rank 2147483648"));
    msg_propose pr = msg_fixture_propose();
    pr.n_draft = MSG_DRAFT_MAX + 1;
    assert_int_equal(msg_pack_propose(&b, 1, &pr), TD_EINVAL);
    pr = msg_fixture_propose();
    pr.n_past = 0;
    assert_int_equal(msg_pack_propose(&b, 1, &pr), TD_EINVAL);
    msg_proposal pl = msg_fixture_proposal(1);
    pl.n_q = 2;
    assert_int_equal(msg_pack_proposal(&b, 1, &pl), TD_EINVAL);
    static const uint32_t dup_ids[2] = {4, 4};
    static const float dup_p[2] = {0.5f, 0.5f};
    msg_draft_q dup = {dup_ids, dup_p, 2};
    pl = msg_fixture_proposal(0);
    pl.n_tokens = 1;
    pl.q = &dup;
    pl.n_q = 1;
    assert_int_equal(msg_pack_proposal(&b, 1, &pl), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "increasing"));
    msg_kv_attach ka = msg_fixture_kv_attach();
    ka.role = MSG_ROLE_GATEWAY;
    assert_int_equal(msg_pack_kv_attach(&b, 1, &ka), TD_EINVAL);
    msg_kv_pools kp = msg_fixture_kv_pools();
    kp.n_pools = 0;
    assert_int_equal(msg_pack_kv_pools(&b, 1, &kp), TD_EINVAL);
    msg_kv_close kc = {.keep = false, .tokens = msg_fixture_stop, .n_tokens = 2};
    assert_int_equal(msg_pack_kv_close(&b, 1, &kc), TD_EINVAL);
    msg_kv_open ko = {.pid = 0, .tokens = msg_fixture_stop, .n_tokens = 2};
    assert_int_equal(msg_pack_kv_open(&b, 1, &ko), TD_EINVAL);
    msg_status st = msg_fixture_status();
    st.accepted = st.drafted + 1;
    assert_int_equal(msg_pack_status(&b, 1, &st), TD_EINVAL);
    msg_svc_restart sr = {.name = "Draftd"};
    assert_int_equal(msg_pack_svc_restart(&b, 1, &sr), TD_EINVAL);
    msg_buf_free(&b);
}

/* --- truncation ---------------------------------------------------------------------------- */

static void test_every_truncation_of_every_type_is_a_format_error(void **state)
{
    (void)state;
    msg_buf bufs[MSG_TYPE_END];
    assert_int_equal(msg_fixture_pack_all(bufs), TD_OK);
    for (int t = 1; t < MSG_TYPE_END; t++) {
        const msg_buf *b = &bufs[t];
        uint8_t *whole = msg_fixture_copy(b->data, b->len);
        assert_int_equal(msg_fixture_unpack_as((msg_type)t, whole, b->len), TD_OK);
        free(whole);
        for (size_t n = 0; n < b->len; n++) {
            uint8_t *cut = msg_fixture_copy(b->data, n);
            td_err e = msg_fixture_unpack_as((msg_type)t, cut, n);
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
    assert_int_equal(msg_fixture_pack_all(bufs), TD_OK);
    for (int t = 1; t < MSG_TYPE_END; t++)
        for (int u = 1; u < MSG_TYPE_END; u++)
            if (u != t)
                assert_int_equal(msg_fixture_unpack_as((msg_type)u, bufs[t].data, bufs[t].len), TD_EPROTO);
    for (int t = 0; t < MSG_TYPE_END; t++)
        msg_buf_free(&bufs[t]);
}

/* --- pack limits --------------------------------------------------------------------------- */

static void test_pack_refuses_structs_that_unpack_would_refuse(void **state)
{
    (void)state;
    msg_buf b;
    msg_buf_init(&b);
    msg_gen_start gs = msg_fixture_gen_start();
    gs.n_prompt = 0;
    assert_int_equal(msg_pack_gen_start(&b, 1, &gs), TD_EINVAL);
    gs = msg_fixture_gen_start();
    gs.sampler.top_p = 2.0f;
    assert_int_equal(msg_pack_gen_start(&b, 1, &gs), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "top_p"));
    gs = msg_fixture_gen_start();
    gs.n_stop = MSG_STOP_MAX + 1;
    assert_int_equal(msg_pack_gen_start(&b, 1, &gs), TD_EINVAL);
    msg_hello hello = msg_fixture_hello();
    hello.pid = 0;
    assert_int_equal(msg_pack_hello(&b, 1, &hello), TD_EINVAL);
    msg_error error = {.code = TD_OK};
    assert_int_equal(msg_pack_error(&b, 1, &error), TD_EINVAL);
    msg_ping ping = {.data = (const uint8_t *)"", .data_len = MSG_PING_DATA_MAX + 1};
    assert_int_equal(msg_pack_ping(&b, 1, &ping), TD_EINVAL);
    msg_gen_event ev = msg_fixture_gen_event(MSG_EVENT_TOKEN);
    ev.finish = MSG_FINISH_STOP;
    assert_int_equal(msg_pack_gen_event(&b, 1, &ev), TD_EINVAL);
    msg_shbuf_announce sb = msg_fixture_shbuf();
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
        cmocka_unit_test(test_gen_cancel_wire_bytes_match_the_msgpack_spec),
        cmocka_unit_test(test_proposal_probabilities_travel_as_little_endian_f32),
        cmocka_unit_test(test_proposal_in_the_pool_carries_only_generation_offset_and_rows),
        cmocka_unit_test(test_gen_start_carries_logprobs_and_ignore_eos),
        cmocka_unit_test(test_gen_start_carries_penalties_and_logit_bias),
        cmocka_unit_test(test_gen_event_logprobs_and_cached_tokens_round_trip),
        cmocka_unit_test(test_control_messages_round_trip),
        cmocka_unit_test(test_propose_and_proposal_round_trip),
        cmocka_unit_test(test_kvd_messages_round_trip),
        cmocka_unit_test(test_pack_refuses_new_types_out_of_range),
        cmocka_unit_test(test_every_truncation_of_every_type_is_a_format_error),
        cmocka_unit_test(test_every_message_is_refused_by_every_other_type),
        cmocka_unit_test(test_pack_refuses_structs_that_unpack_would_refuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
