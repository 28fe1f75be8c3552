/* A client finds its server again after any restart window. A daemon killed and restarted
 * leaves its endpoint in several states in turn: a stale socket file that refuses, no file,
 * a listening socket that drops what it accepted (the dying process, or one killed just
 * after it listened), then the new server. The client must be connected to the new server
 * within a bound, whatever it met on the way: NNG 1.5's ipc dialer gives up for good when a
 * connection fails with EPIPE during the SP handshake. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/bus.h"
#include "tests/support/clock.h"
#include "tests/support/tmp_dir.h"
#include "tests/support/watchdog.h"

/* ms a call may take once the new server listens: the client's redial bound plus room for
 * a loaded machine. */
#define BACK_WITHIN_MS 4000

static char base_dir[256]; /* mkdtemp folder, TANDEM_RUNTIME_DIR of this run */
static unsigned seed;      /* the run's seed; TANDEM_TEST_SEED replays a run */
static unsigned rng;       /* rand_r state, starts at seed */

/* 0..max_ms from the run's seed. */
static int gap_ms(int max_ms)
{
    return rand_r(&rng) % (max_ms + 1);
}

/* Echoes the request. */
static td_err echo(void *user, const uint8_t *req, size_t len, msg_buf *reply)
{
    (void)user;
    return msg_buf_assign(reply, req, len);
}

/* A plain listening AF_UNIX socket at path (the file replaced if present). */
static int raw_listen(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    assert_true(strlen(path) < sizeof a.sun_path);
    strcpy(a.sun_path, path);
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (const struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 16), 0);
    return fd;
}

/* A stale socket file: bound once, nobody listens, connecting is refused. */
static void leave_stale_socket(const char *path)
{
    close(raw_listen(path));
}

/* Listens for ms and closes every connection as soon as it is accepted, without a byte:
 * the client's handshake then fails on a closed peer. Leaves a stale socket file. */
static void drop_connections(const char *path, int ms)
{
    int fd = raw_listen(path);
    double until = now_ms() + ms;
    while (now_ms() < until) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 1) == 1) {
            int conn = accept(fd, NULL, NULL);
            if (conn >= 0)
                close(conn);
        }
    }
    close(fd);
}

static void test_client_reconnects_after_every_kind_of_restart_window(void **state)
{
    (void)state;
    enum { CYCLES = 50 };
    char url[BUS_URL_MAX];
    assert_int_equal(bus_endpoint(url, sizeof url, "redial"), TD_OK);
    const char *path = url + strlen("ipc://");
    bus_server *s;
    assert_int_equal(bus_server_init(&s, url, NULL, echo, NULL), TD_OK);
    bus_client *c;
    assert_int_equal(bus_client_init(&c, url, NULL), TD_OK);
    msg_buf reply;
    msg_buf_init(&reply);
    double worst = 0;
    int slow = 0; /* calls over 500 ms: their client had to replace a dialer that gave up */
    for (int i = 0; i < CYCLES; i++) {
        char req[16];
        int n = snprintf(req, sizeof req, "cycle %d", i);
        double t0 = now_ms();
        td_err e = bus_client_call(c, req, (size_t)n, &reply, BACK_WITHIN_MS);
        double dt = now_ms() - t0;
        if (e != TD_OK)
            fail_msg("cycle %d (seed %u): no reply %.0f ms after the server came back: %s", i,
                     seed, dt, err_msg());
        assert_int_equal(reply.len, n);
        assert_memory_equal(reply.data, req, n);
        worst = dt > worst ? dt : worst;
        slow += dt > 500;

        bus_server_free(s);
        leave_stale_socket(path);
        sleep_ms(gap_ms(40));
        assert_int_equal(unlink(path), 0);
        sleep_ms(gap_ms(40));
        drop_connections(path, 50 + gap_ms(250));
        sleep_ms(gap_ms(40));
        assert_int_equal(bus_server_init(&s, url, NULL, echo, NULL), TD_OK);
    }
    printf("%d restart windows (seed %u): slowest reconnecting call %.0f ms, %d over 500 ms\n",
           CYCLES, seed, worst, slow);
    msg_buf_free(&reply);
    bus_client_free(c);
    bus_server_free(s);
}

static int group_setup(void **state)
{
    (void)state;
    const char *env = getenv("TANDEM_TEST_SEED");
    seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    rng = seed;
    if (!tmp_dir_make(base_dir, sizeof base_dir, "tandem-test-redial"))
        return -1;
    setenv("TANDEM_RUNTIME_DIR", base_dir, 1);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    return tmp_dir_remove(base_dir) ? 0 : -1;
}

int main(void)
{
    test_watchdog("test_bus_redial", 300); /* ~40 s under sanitizers */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_reconnects_after_every_kind_of_restart_window),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
