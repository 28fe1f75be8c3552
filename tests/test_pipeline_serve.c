/* tandem serve supervising the real daemons: tandem status lists each with its pid and
 * health; a daemon killed with -9 is started again (kvd's running generation ends with an
 * error event first) and the next generation equals plain decoding; tandem restart swaps the
 * drafter while a generation streams, without changing its greedy text; SIGTERM stops every
 * service and the supervisor exits 0. */
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
#include <time.h>
#include <unistd.h>

#include "tests/support/model_fixture.h"
#include "tests/support/pipeline.h"
#include "verifyd/spec.h"

#define N_CTX 1024
#define WAIT_MS 120000

static pipeline pl;
static tgt_model *tm;
static char model[PL_PATH_MAX], draft[PL_PATH_MAX], draft2[PL_PATH_MAX];
static uint64_t next_seq = 1;

static int setup(void **ctx)
{
    (void)ctx;
    int rc = pl_setup(&pl);
    if (rc != 0)
        return rc == 77 ? (exit(77), -1) : -1;
    snprintf(draft2, sizeof draft2, "%s/silent2", pl.dir);
    mf_drafter silent = {16, 3, true, PL_REPEAT_TOKEN, false};
    if (pl_write_pair(&pl, 3.0f, &silent, 9, "silent", model, draft, &tm) != TD_OK ||
        mf_drafter_write(draft2, tm, &silent, 10) != TD_OK)
        return -1;
    const char *args[] = {"--model", model, "--draft", draft, "--ctx", "1024", "--slots", "4",
                          "--draft-max", "9", "--log-level", "info", NULL};
    pl_start_serve(&pl, args);
    if (pl_wait_ready(&pl, true, 30000) != TD_OK) {
        pl_dump_logs(&pl);
        return -1;
    }
    return 0;
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
    if (pl_gen(&pl, &g) != TD_OK) {
        pl_dump_logs(&pl);
        fail_msg("gen_start: %s", err_msg());
    }
    return g.seq_id;
}

static pl_result *wait_done(uint64_t id)
{
    pl_result *r = pl_wait(&pl, id, WAIT_MS);
    if (!r) {
        pl_dump_logs(&pl);
        fail_msg("sequence %llu did not finish", (unsigned long long)id);
    }
    return r;
}

static void check_generation(uint32_t salt, uint32_t n)
{
    uint32_t p[4] = {salt, 279, salt + 1, 7};
    int32_t ip[4] = {(int32_t)salt, 279, (int32_t)salt + 1, 7}, want[300];
    plain(ip, 4, n, want);
    pl_result *r = wait_done(start(p, 4, n));
    assert_int_equal(r->last_kind, MSG_EVENT_DONE);
    assert_int_equal(r->n_tokens, n);
    assert_memory_equal(r->tokens, want, n * sizeof(int32_t));
}

/* Waits until the supervisor reports a pid for name other than old. */
static uint32_t wait_new_pid(const char *name, uint32_t old)
{
    for (int waited = 0; waited < 30000; waited += 20) {
        uint32_t pid = 0, restarts = 0;
        if (pl_svc(&pl, name, &pid, &restarts) == TD_OK && pid && pid != old)
            return pid;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    pl_dump_logs(&pl);
    fail_msg("%s was not started again", name);
    return 0;
}

static void test_status_lists_every_service_with_its_health(void **ctx)
{
    (void)ctx;
    char cmd[1400], line[512];
    snprintf(cmd, sizeof cmd, "%s/tandem status --runtime-dir %s", pl.build, pl.dir);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    bool header = false, kvd = false, verifyd = false, draftd = false;
    while (fgets(line, sizeof line, f)) {
        header |= strncmp(line, "service", 7) == 0;
        kvd |= strncmp(line, "kvd ", 4) == 0 && strstr(line, " ok") != NULL;
        /* the drafter's blocks of 16, cut by tandem serve --draft-max 9 (verifyd's) */
        verifyd |= strncmp(line, "verifyd ", 8) == 0 &&
                   strstr(line, "ready, draftd attached (blocks of 10)") != NULL;
        draftd |= strncmp(line, "draftd ", 7) == 0 && strstr(line, " ok") != NULL;
    }
    assert_int_equal(pclose(f), 0);
    assert_true(header && kvd && verifyd && draftd);
    uint32_t pid = 0, restarts = 7;
    assert_int_equal(pl_svc(&pl, "verifyd", &pid, &restarts), TD_OK);
    assert_true(pid > 0);
    assert_int_equal(restarts, 0);
    assert_int_equal(pl_svc(&pl, "gateway", &pid, &restarts), TD_ENOENT);
}

static void test_a_killed_verifyd_is_restarted_and_serves_the_next_request(void **ctx)
{
    (void)ctx;
    uint32_t old = 0, restarts = 0;
    assert_int_equal(pl_svc(&pl, "verifyd", &old, &restarts), TD_OK);
    uint32_t p[3] = {5, 6, 279};
    uint64_t id = start(p, 3, 900);
    assert_non_null(pl_wait_tokens(&pl, id, 5, WAIT_MS));
    kill((pid_t)old, SIGKILL);
    wait_new_pid("verifyd", old);
    assert_int_equal(pl_svc(&pl, "verifyd", &old, &restarts), TD_OK);
    assert_int_equal(restarts, 1);
    assert_int_equal(pl_wait_ready(&pl, true, 30000), TD_OK);
    check_generation(30, 100);
}

static void test_a_killed_kvd_errors_its_generations_then_is_restarted(void **ctx)
{
    (void)ctx;
    uint32_t old = 0, restarts = 0;
    assert_int_equal(pl_svc(&pl, "kvd", &old, &restarts), TD_OK);
    uint32_t p[3] = {8, 9, 279};
    uint64_t id = start(p, 3, 900);
    assert_non_null(pl_wait_tokens(&pl, id, 5, WAIT_MS));
    kill((pid_t)old, SIGKILL);
    pl_result *r = wait_done(id);
    assert_int_equal(r->last_kind, MSG_EVENT_ERROR);
    assert_int_equal(r->code, TD_ECLOSED);
    wait_new_pid("kvd", old);
    assert_int_equal(pl_wait_ready(&pl, true, 30000), TD_OK);
    check_generation(31, 100);
}

static void test_restart_swaps_the_drafter_while_a_generation_streams(void **ctx)
{
    (void)ctx;
    enum { GEN = 800 };
    uint32_t old = 0, restarts = 0;
    assert_int_equal(pl_svc(&pl, "draftd", &old, &restarts), TD_OK);
    uint32_t p[4] = {12, 279, 13, 14};
    int32_t ip[4] = {12, 279, 13, 14}, want[GEN];
    plain(ip, 4, GEN, want);
    uint64_t id = start(p, 4, GEN);
    assert_non_null(pl_wait_tokens(&pl, id, 10, WAIT_MS));
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "%s/tandem restart draftd --draft %s --runtime-dir %s > /dev/null",
             pl.build, draft2, pl.dir);
    assert_int_equal(system(cmd), 0);
    pl_result *r = wait_done(id);
    assert_int_equal(r->last_kind, MSG_EVENT_DONE);
    assert_memory_equal(r->tokens, want, sizeof want);
    uint32_t now_pid = 0;
    assert_int_equal(pl_svc(&pl, "draftd", &now_pid, &restarts), TD_OK);
    assert_true(now_pid != old);
    /* the new drafter is used: proposals keep being accepted */
    assert_int_equal(pl_wait_ready(&pl, true, 30000), TD_OK);
    msg_status a, b;
    assert_int_equal(pl_status(&pl, &a), TD_OK);
    check_generation(33, 120);
    assert_int_equal(pl_status(&pl, &b), TD_OK);
    assert_true(b.accepted > a.accepted);
    /* a service that does not run here is refused */
    snprintf(cmd, sizeof cmd, "%s/tandem restart gateway --runtime-dir %s 2> /dev/null",
             pl.build, pl.dir);
    assert_int_not_equal(system(cmd), 0);
}

static void test_sigterm_stops_every_service(void **ctx)
{
    (void)ctx;
    uint32_t pids[3], restarts;
    const char *names[3] = {"kvd", "verifyd", "draftd"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(pl_svc(&pl, names[i], &pids[i], &restarts), TD_OK);
    assert_int_equal(pl_stop_serve(&pl, SIGTERM), 0);
    for (int i = 0; i < 3; i++)
        assert_int_not_equal(kill((pid_t)pids[i], 0), 0);
}

int main(void)
{
    /* One thread per process: the daemons and this test share CI's two cores. */
    omp_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_lists_every_service_with_its_health),
        cmocka_unit_test(test_a_killed_verifyd_is_restarted_and_serves_the_next_request),
        cmocka_unit_test(test_a_killed_kvd_errors_its_generations_then_is_restarted),
        cmocka_unit_test(test_restart_swaps_the_drafter_while_a_generation_streams),
        cmocka_unit_test(test_sigterm_stops_every_service),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
