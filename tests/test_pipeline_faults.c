/* Faults with real processes: kill -9 draftd mid-generation and the greedy text is unchanged
 * (verifyd falls back to plain steps, then speculates again once draftd is back); a stopped
 * (SIGSTOP) draftd is timed out and skipped the same way until it answers again; kill -9
 * kvd and the running generation ends with an error event, then the next one succeeds;
 * kill -9 verifyd and kvd reclaims its slots, so a restarted verifyd gets them all; hostile
 * bytes to every daemon's socket get error replies and the daemons keep serving. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fdpass.h"
#include "tests/support/model_fixture.h"
#include "tests/support/pipeline.h"
#include "verifyd/spec.h"

#define N_CTX 1024
#define WAIT_MS 120000

static pipeline pl;
static tgt_model *tm;
static char model[PL_PATH_MAX], draft[PL_PATH_MAX];
static uint64_t next_seq = 1;

static const char *kvd_args[] = {"--slots", "4", "--log-level", "info", NULL};
static const char *vd_args[] = {"--model", model, "--draft", draft, "--ctx", "1024",
                                "--log-level", "info", NULL};
static const char *dd_args[] = {"--model", model, "--draft", draft, "--log-level", "info", NULL};

static int setup(void **ctx)
{
    (void)ctx;
    int rc = pl_setup(&pl);
    if (rc != 0)
        return rc == 77 ? (exit(77), -1) : -1;
    mf_drafter silent = {16, 3, true, PL_REPEAT_TOKEN, false};
    if (pl_write_pair(&pl, 3.0f, &silent, 9, "silent", model, draft, &tm) != TD_OK)
        return -1;
    return pl_start_all(&pl, kvd_args, vd_args, dd_args) == TD_OK ? 0 : -1;
}

static int teardown(void **ctx)
{
    (void)ctx;
    tgt_free(tm);
    return pl_teardown(&pl) == 0 ? 0 : -1;
}

static void plain(const int32_t *prompt, int64_t np, int64_t n, int32_t *out)
{
    const spec_cfg cfg = {.n_ctx = N_CTX, .block = 1};
    if (mf_generate(tm, &cfg, prompt, np, n, out, NULL) != TD_OK)
        fail_msg("plain decoding: %s", err_msg());
}

static uint64_t start(const uint32_t *prompt, uint32_t n, uint32_t max_tokens)
{
    msg_gen_start g = {.seq_id = next_seq++, .prompt = prompt, .n_prompt = n,
                       .max_tokens = max_tokens, .sampler = {.top_p = 1.0f}, .ignore_eos = true};
    td_err e = pl_gen(&pl, &g);
    if (e != TD_OK) {
        pl_dump_logs(&pl);
        fail_msg("gen_start: %s", err_msg());
    }
    return g.seq_id;
}

static pl_result *wait_done(uint64_t id, int timeout_ms)
{
    pl_result *r = pl_wait(&pl, id, timeout_ms);
    if (!r) {
        pl_dump_logs(&pl);
        fail_msg("sequence %llu did not finish", (unsigned long long)id);
    }
    return r;
}

/* A generation of n tokens equals plain decoding. */
static void check_generation(uint32_t salt, uint32_t n)
{
    uint32_t p[6] = {salt, 279, salt + 1, 7, 279, 9};
    int32_t ip[6], want[400];
    for (int i = 0; i < 6; i++)
        ip[i] = (int32_t)p[i];
    plain(ip, 6, n, want);
    pl_result *r = wait_done(start(p, 6, n), WAIT_MS);
    assert_int_equal(r->last_kind, MSG_EVENT_DONE);
    assert_int_equal(r->n_tokens, n);
    assert_memory_equal(r->tokens, want, n * sizeof(int32_t));
}

static void test_kill_draftd_mid_generation_keeps_the_greedy_text(void **ctx)
{
    (void)ctx;
    enum { GEN = 700 };
    uint32_t p[5] = {11, 279, 12, 13, 279};
    int32_t ip[5] = {11, 279, 12, 13, 279}, want[GEN];
    plain(ip, 5, GEN, want);
    msg_status s0, s1, s2;
    assert_int_equal(pl_status(&pl, &s0), TD_OK);
    uint64_t id = start(p, 5, GEN);
    assert_non_null(pl_wait_tokens(&pl, id, 40, WAIT_MS));
    assert_int_equal(pl_stop(&pl, PL_DRAFTD, SIGKILL), 128 + SIGKILL);
    pl_result *r = wait_done(id, WAIT_MS);
    assert_int_equal(r->last_kind, MSG_EVENT_DONE);
    assert_int_equal(r->n_tokens, GEN);
    assert_memory_equal(r->tokens, want, sizeof want);
    assert_int_equal(pl_status(&pl, &s1), TD_OK);
    assert_false(s1.draft_attached);
    assert_true(s1.drafted > s0.drafted);

    /* back: verifyd finds it again and speculates with it */
    pl_start(&pl, PL_DRAFTD, dd_args);
    assert_int_equal(pl_wait_ready(&pl, true, 30000), TD_OK);
    check_generation(40, 120);
    assert_int_equal(pl_status(&pl, &s2), TD_OK);
    assert_true(s2.drafted > s1.drafted);
    assert_true(s2.draft_attaches >= s1.draft_attaches + 1);
}

static void test_a_stalled_draftd_is_skipped_until_it_answers_again(void **ctx)
{
    (void)ctx;
    enum { GEN = 300 };
    uint32_t p[4] = {15, 279, 16, 17};
    int32_t ip[4] = {15, 279, 16, 17}, want[GEN];
    plain(ip, 4, GEN, want);
    msg_status s0, s1, s2;
    assert_int_equal(pl_wait_ready(&pl, true, 30000), TD_OK);
    assert_int_equal(pl_status(&pl, &s0), TD_OK);
    uint64_t id = start(p, 4, GEN);
    assert_non_null(pl_wait_tokens(&pl, id, 20, WAIT_MS));
    kill(pl.pid[PL_DRAFTD], SIGSTOP); /* alive but silent: proposals time out */
    pl_result *r = wait_done(id, WAIT_MS);
    assert_int_equal(r->last_kind, MSG_EVENT_DONE);
    assert_memory_equal(r->tokens, want, sizeof want);
    assert_int_equal(pl_status(&pl, &s1), TD_OK);
    assert_false(s1.draft_attached);
    assert_true(s1.draft_failures > s0.draft_failures);
    kill(pl.pid[PL_DRAFTD], SIGCONT);
    assert_int_equal(pl_wait_ready(&pl, true, 30000), TD_OK);
    check_generation(80, 100);
    assert_int_equal(pl_status(&pl, &s2), TD_OK);
    assert_true(s2.drafted > s1.drafted);
}

static void test_kill_kvd_ends_running_generations_with_an_error_then_serves_again(void **ctx)
{
    (void)ctx;
    uint32_t p[3] = {21, 22, 279};
    uint64_t id = start(p, 3, 900);
    assert_non_null(pl_wait_tokens(&pl, id, 20, WAIT_MS));
    assert_int_equal(pl_stop(&pl, PL_KVD, SIGKILL), 128 + SIGKILL);
    pl_result *r = wait_done(id, WAIT_MS);
    assert_int_equal(r->last_kind, MSG_EVENT_ERROR);
    assert_int_equal(r->code, TD_ECLOSED);
    assert_non_null(strstr(r->message, "kvd"));
    assert_true(r->n_tokens < 900);
    /* while kvd is away verifyd refuses new work instead of queueing it forever */
    msg_status st;
    assert_int_equal(pl_status(&pl, &st), TD_OK);
    assert_false(st.ready);
    msg_gen_start g = {.seq_id = next_seq++, .prompt = p, .n_prompt = 3, .max_tokens = 5,
                       .sampler = {.top_p = 1.0f}};
    assert_int_equal(pl_gen(&pl, &g), TD_EBUSY);

    pl_start(&pl, PL_KVD, kvd_args);
    assert_int_equal(pl_wait_ready(&pl, false, 30000), TD_OK);
    check_generation(50, 150);
    /* draftd followed kvd to its new pools */
    assert_int_equal(pl_wait_ready(&pl, true, 30000), TD_OK);
    msg_status a, b;
    assert_int_equal(pl_status(&pl, &a), TD_OK);
    check_generation(60, 150);
    assert_int_equal(pl_status(&pl, &b), TD_OK);
    assert_true(b.drafted > a.drafted);
}

static void test_kill_verifyd_frees_its_slots_for_the_next_one(void **ctx)
{
    (void)ctx;
    uint32_t p[4][3] = {{31, 1, 2}, {32, 1, 2}, {33, 1, 2}, {34, 1, 2}};
    uint64_t ids[4];
    for (int i = 0; i < 4; i++) /* every one of kvd's 4 slots runs */
        ids[i] = start(p[i], 3, 900);
    for (int i = 0; i < 4; i++)
        assert_non_null(pl_wait_tokens(&pl, ids[i], 2, WAIT_MS));
    assert_int_equal(pl_stop(&pl, PL_VERIFYD, SIGKILL), 128 + SIGKILL);
    pl_start(&pl, PL_VERIFYD, vd_args);
    assert_int_equal(pl_wait_ready(&pl, false, 30000), TD_OK);
    /* four at once again: each needs a slot the dead verifyd held */
    uint64_t again[4];
    int32_t want[4][60];
    for (int i = 0; i < 4; i++) {
        int32_t ip[3] = {(int32_t)p[i][0], 1, 2};
        plain(ip, 3, 60, want[i]);
        again[i] = start(p[i], 3, 60);
    }
    for (int i = 0; i < 4; i++) {
        pl_result *r = wait_done(again[i], 30000);
        assert_int_equal(r->last_kind, MSG_EVENT_DONE);
        assert_memory_equal(r->tokens, want[i], sizeof want[i]);
    }
}

/* Sends raw bytes to service and checks the reply is an error (of code want when not 0). */
static void expect_error(const char *service, const void *req, size_t len, td_err want)
{
    msg_buf reply;
    msg_buf_init(&reply);
    td_err e = pl_call_raw(&pl, service, req, len, &reply, 10000);
    if (e != TD_OK)
        fail_msg("%s: no reply to %zu hostile bytes: %s", service, len, err_msg());
    msg_error m;
    assert_int_equal(msg_unpack_error(reply.data, reply.len, NULL, &m), TD_OK);
    if (want != TD_OK && m.code != want)
        fail_msg("%s: error %s (%s), expected %s", service, err_name(m.code), m.message,
                 err_name(want));
    msg_buf_free(&reply);
}

static void expect_pong(const char *service)
{
    msg_buf b;
    msg_buf_init(&b);
    msg_ping ping = {.nonce = 77};
    assert_int_equal(msg_pack_ping(&b, 5, &ping), TD_OK);
    assert_int_equal(pl_call_raw(&pl, service, b.data, b.len, &b, 10000), TD_OK);
    msg_ping pong;
    assert_int_equal(msg_unpack_pong(b.data, b.len, NULL, &pong), TD_OK);
    assert_int_equal(pong.nonce, 77);
    msg_buf_free(&b);
}

static void test_hostile_messages_get_errors_and_every_daemon_keeps_serving(void **ctx)
{
    (void)ctx;
    static const char *const services[] = {"verifyd", "draftd", "kvd"};
    static const uint8_t garbage[] = {0xc1, 0xff, 0x00, 0x13, 0x37};
    static const uint8_t huge[] = {0x94, 0x01, 0x06, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t version2[] = {0x94, 0x02, 0x02, 0x01, 0x92, 0x00, 0xc4, 0x00};
    msg_buf ev;
    msg_buf_init(&ev);
    msg_gen_event done = {.seq_id = 1, .kind = MSG_EVENT_DONE, .finish = MSG_FINISH_STOP};
    assert_int_equal(msg_pack_gen_event(&ev, 9, &done), TD_OK);
    for (int s = 0; s < 3; s++) {
        expect_error(services[s], "", 0, TD_EFORMAT);
        expect_error(services[s], garbage, sizeof garbage, TD_EFORMAT);
        expect_error(services[s], huge, sizeof huge, TD_EFORMAT);
        expect_error(services[s], version2, sizeof version2, TD_EPROTO);
        expect_error(services[s], ev.data, ev.len, TD_EPROTO); /* a type it does not serve */
        expect_error(services[s], ev.data, ev.len / 2, TD_EFORMAT);
        expect_pong(services[s]);
    }
    /* well-formed requests that do not fit: a slot kvd never made, a slot out of range */
    msg_propose pr = {.seq_id = 1, .slot = 999, .n_past = 3, .pending = 1, .n_draft = 15,
                      .sampler = {.top_p = 1.0f}};
    msg_status st;
    assert_int_equal(pl_status(&pl, &st), TD_OK);
    assert_int_equal(msg_pack_propose(&ev, 10, &pr), TD_OK);
    expect_error("draftd", ev.data, ev.len, TD_OK);
    msg_kv_close kc = {.slot = 3, .slot_gen = 424242};
    assert_int_equal(msg_pack_kv_close(&ev, 11, &kc), TD_OK);
    expect_error("kvd", ev.data, ev.len, TD_ENOENT);

    /* kvd's fd socket: garbage gets an error and a closed connection; an attach with taps
     * other than verifyd's is refused */
    char path[256];
    assert_int_equal(fdpass_path(pl.dir, "kvd", path, sizeof path), TD_OK);
    for (int k = 0; k < 2; k++) {
        int sock;
        assert_int_equal(fdpass_connect(path, &sock), TD_OK);
        uint32_t taps[2] = {0, 1};
        msg_kv_attach at = {.role = MSG_ROLE_DRAFTD, .pid = (uint32_t)getpid(), .taps = taps,
                            .n_taps = 2, .params = {.block = 16, .n_taps = 2, .d_layers = 1}};
        assert_int_equal(msg_pack_kv_attach(&ev, 12, &at), TD_OK);
        const void *out = k == 0 ? (const void *)garbage : (const void *)ev.data;
        size_t out_len = k == 0 ? sizeof garbage : ev.len;
        assert_int_equal(fdpass_send(sock, out, out_len, NULL, 0, 5000), TD_OK);
        uint8_t buf[FDPASS_MAX_PAYLOAD];
        int fds[4];
        size_t len = 0, n_fds = 0;
        assert_int_equal(fdpass_recv(sock, buf, sizeof buf, &len, fds, 4, &n_fds, 5000), TD_OK);
        assert_int_equal(n_fds, 0);
        msg_error m;
        assert_int_equal(msg_unpack_error(buf, len, NULL, &m), TD_OK);
        assert_int_equal(m.code, k == 0 ? TD_EFORMAT : TD_EINVAL);
        assert_int_equal(fdpass_recv(sock, buf, sizeof buf, &len, fds, 4, &n_fds, 5000),
                         TD_ECLOSED);
        close(sock);
    }
    msg_buf_free(&ev);
    /* and the pipeline still generates */
    assert_int_equal(pl_wait_ready(&pl, true, 30000), TD_OK);
    check_generation(70, 80);
}

int main(void)
{
    /* One thread per process: three daemons and this test share CI's two cores. */
    omp_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_draftd_mid_generation_keeps_the_greedy_text),
        cmocka_unit_test(test_a_stalled_draftd_is_skipped_until_it_answers_again),
        cmocka_unit_test(test_kill_kvd_ends_running_generations_with_an_error_then_serves_again),
        cmocka_unit_test(test_kill_verifyd_frees_its_slots_for_the_next_one),
        cmocka_unit_test(test_hostile_messages_get_errors_and_every_daemon_keeps_serving),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
