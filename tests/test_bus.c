/* The bus between two real processes: the test binary starts itself again as the server
 * (fork + exec, so the child has no NNG state from the parent) and the parent calls it over
 * ipc:// in a private temporary runtime directory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/bus.h"
#include "common/msg.h"
#include "tests/support/clock.h"
#include "tests/support/spawn.h"
#include "tests/support/tmp_dir.h"
#include "tests/support/watchdog.h"

/* The server child reads its URL from here (it inherits the parent's environment). */
#define URL_ENV "TANDEM_TEST_BUS_URL"

static char base_dir[256]; /* mkdtemp folder holding every runtime dir of this run */
static char run_dir[300];  /* base_dir/rt: TANDEM_RUNTIME_DIR of the bus tests */

/* --- the server child ---------------------------------------------------------------------- */

static int big_served; /* "BIG" requests this server child has answered */

/* Requests with a msgpack envelope: ping -> pong echoing request id, nonce and data, after
 * sleeping the number of ms in data "sleep:<ms>"; data "fail" -> a handler error.
 * Anything else is raw: "BIG <n>" -> n bytes (i * 31) & 255; "BIGS?" -> how many BIG
 * requests were served, in decimal; other bytes -> reversed + '!'. */
static td_err child_handle(void *user, const uint8_t *req, size_t len, msg_buf *reply)
{
    (void)user;
    if (len == 5 && memcmp(req, "BIGS?", 5) == 0) {
        char num[16];
        int n = snprintf(num, sizeof num, "%d", __atomic_load_n(&big_served, __ATOMIC_SEQ_CST));
        return msg_buf_assign(reply, num, (size_t)n);
    }
    msg_header h;
    if (msg_unpack_header(req, len, &h) == TD_OK) {
        msg_ping p;
        uint64_t rid;
        TD_TRY(msg_unpack_ping(req, len, &rid, &p));
        if (p.data_len == 4 && memcmp(p.data, "fail", 4) == 0)
            return err_set(TD_EBUSY, "worker busy: try later");
        if (p.data_len > 6 && p.data_len < 16 && memcmp(p.data, "sleep:", 6) == 0) {
            char ms[16];
            memcpy(ms, p.data + 6, p.data_len - 6);
            ms[p.data_len - 6] = '\0';
            sleep_ms(atoi(ms));
        }
        return msg_pack_pong(reply, rid, &p);
    }
    if (len > 4 && len < 20 && memcmp(req, "BIG ", 4) == 0) {
        char num[20];
        memcpy(num, req + 4, len - 4);
        num[len - 4] = '\0';
        size_t n = (size_t)strtoull(num, NULL, 10);
        uint8_t *big = malloc(n);
        if (!big)
            return err_set(TD_ENOMEM, "no memory for %zu bytes", n);
        for (size_t i = 0; i < n; i++)
            big[i] = (uint8_t)(i * 31);
        td_err e = msg_buf_assign(reply, big, n);
        free(big);
        __atomic_add_fetch(&big_served, 1, __ATOMIC_SEQ_CST);
        return e;
    }
    for (size_t i = 0; i < len; i++)
        TD_TRY(msg_buf_append(reply, &req[len - 1 - i], 1));
    return msg_buf_append(reply, "!", 1);
}

/* Serves until the parent closes its end of sock; 'R' on sock says it is listening. */
static int child_serve(int sock)
{
    const char *url = getenv(URL_ENV);
    bus_server *s;
    if (!url || bus_server_init(&s, url, NULL, child_handle, NULL) != TD_OK) {
        fprintf(stderr, "server child: %s\n", err_msg());
        (void)!write(sock, "E", 1);
        return 2;
    }
    (void)!write(sock, "R", 1);
    char ch;
    while (read(sock, &ch, 1) > 0) {
    }
    bus_server_free(s);
    return 0;
}

/* Sends the server at URL_ENV a request one byte over its 8 MiB limit and expects the
 * connection lost at once. A process of its own: NNG 1.5's close of a socket whose peer cut
 * such a send was seen to wait forever (about 1 run in 70 under load), and a close that never
 * returns stalls every later close and dial of the process. So the client is left open. */
static int child_huge(void)
{
    const char *url = getenv(URL_ENV);
    bus_client *c;
    if (!url || bus_client_init(&c, url, NULL) != TD_OK) {
        fprintf(stderr, "huge child: %s\n", err_msg());
        return 2;
    }
    size_t len = BUS_RECV_MAX_DEFAULT + 1;
    uint8_t *huge = calloc(1, len);
    if (!huge)
        return 2;
    huge[0] = 'x';
    msg_buf reply;
    msg_buf_init(&reply);
    double t0 = now_ms();
    td_err e = bus_client_call(c, huge, len, &reply, 5000);
    double dt = now_ms() - t0;
    if (e != TD_ECLOSED || !strstr(err_msg(), "connection lost") || dt > 2000.0) {
        fprintf(stderr, "huge child: got %d after %.0f ms: %s\n", (int)e, dt, err_msg());
        return 1;
    }
    return 0;
}

/* --- helpers in the parent ----------------------------------------------------------------- */

typedef struct server_proc {
    pid_t pid;
    int sock;
} server_proc;

/* Starts the server child on url and waits until it listens. */
static server_proc server_start(const char *url)
{
    server_proc p;
    assert_int_equal(setenv(URL_ENV, url, 1), 0);
    assert_int_equal(spawn_self("serve", &p.sock, &p.pid), 0);
    struct pollfd pfd = {.fd = p.sock, .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 10000), 1);
    char ch = 0;
    assert_int_equal(read(p.sock, &ch, 1), 1);
    assert_int_equal(ch, 'R');
    return p;
}

/* Tells the child to stop and checks that it shut down cleanly. */
static void server_stop(server_proc *p)
{
    close(p->sock);
    assert_int_equal(spawn_wait(p->pid, 10000), 0);
}

static void endpoint(char *url, const char *service)
{
    assert_int_equal(bus_endpoint(url, BUS_URL_MAX, service), TD_OK);
}

static bus_client *client_open_spin(const char *url, size_t recv_max, int32_t spin_us)
{
    bus_opts o;
    bus_opts_default(&o);
    o.recv_max = recv_max;
    o.spin_us = spin_us;
    bus_client *c;
    assert_int_equal(bus_client_init(&c, url, &o), TD_OK);
    return c;
}

static bus_client *client_open(const char *url, size_t recv_max)
{
    return client_open_spin(url, recv_max, 0);
}

/* --- tests --------------------------------------------------------------------------------- */

static void test_request_reply_between_two_processes_has_exact_bytes(void **state)
{
    (void)state;
    char url[BUS_URL_MAX];
    endpoint(url, "exact");
    server_proc srv = server_start(url);
    bus_client *c = client_open(url, 0);
    msg_buf reply;
    msg_buf_init(&reply);

    uint8_t req[256];
    for (int i = 0; i < 256; i++)
        req[i] = (uint8_t)i;
    assert_int_equal(bus_client_call(c, req, sizeof req, &reply, 5000), TD_OK);
    assert_int_equal(reply.len, 257);
    for (int i = 0; i < 256; i++)
        assert_int_equal(reply.data[i], 255 - i);
    assert_int_equal(reply.data[256], '!');

    assert_int_equal(bus_client_call(c, NULL, 0, &reply, 5000), TD_OK);
    assert_int_equal(reply.len, 1);
    assert_int_equal(reply.data[0], '!');

    /* the socket file is private to its owner */
    struct stat st;
    assert_int_equal(stat(url + strlen("ipc://"), &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);

    msg_buf_free(&reply);
    bus_client_free(c);
    server_stop(&srv);
}

/* A call of a client (polling up to spin_us) to service, which nobody serves, times out
 * within its 300 ms and says so. */
static void expect_nobody_within_timeout(const char *service, int32_t spin_us)
{
    char url[BUS_URL_MAX];
    endpoint(url, service);
    bus_client *c = client_open_spin(url, 0, spin_us);
    msg_buf reply;
    msg_buf_init(&reply);
    double t0 = now_ms();
    assert_int_equal(bus_client_call(c, "hi", 2, &reply, 300), TD_ETIMEOUT);
    double dt = now_ms() - t0;
    assert_true(dt >= 290.0);
    assert_true(dt < 300.0 + 500.0);
    assert_non_null(strstr(err_msg(), "no server reachable within 300 ms"));
    msg_buf_free(&reply);
    bus_client_free(c);
}

static void test_call_to_absent_server_times_out_within_its_timeout(void **state)
{
    (void)state;
    expect_nobody_within_timeout("nobody-here", 0);
    assert_non_null(strstr(err_msg(), "nobody-here.ipc"));
}

/* A ping with data "sleep:<ms>" through c: the pong echoes nonce and data. */
static void ping_sleeping(bus_client *c, uint64_t nonce, int ms)
{
    char data[16];
    const int n = snprintf(data, sizeof data, "sleep:%d", ms);
    msg_ping p = {.nonce = nonce, .data = (const uint8_t *)data, .data_len = (uint32_t)n}, got;
    msg_buf req, reply;
    msg_buf_init(&req);
    msg_buf_init(&reply);
    uint64_t rid = 0;
    assert_int_equal(msg_pack_ping(&req, 1000 + nonce, &p), TD_OK);
    assert_int_equal(bus_client_call(c, req.data, req.len, &reply, 5000), TD_OK);
    assert_int_equal(msg_unpack_pong(reply.data, reply.len, &rid, &got), TD_OK);
    assert_int_equal(rid, 1000 + nonce);
    assert_int_equal(got.nonce, nonce);
    assert_int_equal(got.data_len, (uint32_t)n);
    assert_memory_equal(got.data, data, (size_t)n);
    msg_buf_free(&req);
    msg_buf_free(&reply);
}

static void test_polling_client_gets_fast_and_slow_replies_and_times_out(void **state)
{
    (void)state;
    char url[BUS_URL_MAX];
    endpoint(url, "polling");
    server_proc srv = server_start(url);
    bus_client *c = client_open_spin(url, 0, 2000);
    for (uint64_t i = 0; i < 50; i++)
        ping_sleeping(c, i, 0); /* answered while the caller polls */
    double t0 = now_ms();
    ping_sleeping(c, 50, 30); /* past the 2 ms of polling: the caller sleeps, then wakes */
    const double dt = now_ms() - t0;
    assert_true(dt >= 29.0);
    assert_true(dt < 1000.0);
    ping_sleeping(c, 51, 1);
    /* raw bytes too */
    msg_buf reply;
    msg_buf_init(&reply);
    assert_int_equal(bus_client_call(c, "abc", 3, &reply, 5000), TD_OK);
    assert_int_equal(reply.len, 4);
    assert_memory_equal(reply.data, "cba!", 4);
    msg_buf_free(&reply);
    bus_client_free(c);
    server_stop(&srv);
    /* nobody there: the deadline holds as without polling */
    expect_nobody_within_timeout("polling-nobody", 2000);
}

static void test_reply_larger_than_the_receive_limit_is_refused(void **state)
{
    (void)state;
    char url[BUS_URL_MAX];
    endpoint(url, "limits");
    server_proc srv = server_start(url);
    bus_client *c = client_open(url, 4096);
    msg_buf reply;
    msg_buf_init(&reply);

    assert_int_equal(bus_client_call(c, "BIG 4000", 8, &reply, 5000), TD_OK);
    assert_int_equal(reply.len, 4000);
    assert_int_equal(reply.data[3999], (uint8_t)(3999 * 31));

    /* a reply over the limit is refused and the connection stays (NNG itself drops it only
     * past 4 times the limit, a path not taken here: NNG 1.5's close after such a drop can
     * hang) */
    double t0 = now_ms();
    assert_int_equal(bus_client_call(c, "BIG 10000", 9, &reply, 5000), TD_ERANGE);
    assert_true(now_ms() - t0 < 2000.0); /* refused at once, not after the timeout */
    assert_non_null(strstr(err_msg(), "receive limit of 4096 bytes"));
    assert_non_null(strstr(err_msg(), "10000 bytes"));
    assert_int_equal(reply.len, 4000); /* the reply before, untouched */

    assert_int_equal(bus_client_call(c, "BIG 100", 7, &reply, 5000), TD_OK);
    assert_int_equal(reply.len, 100);
    /* and the refused request was answered once (resends are off): the server answered three
     * BIG requests, not four */
    sleep_ms(300);
    assert_int_equal(bus_client_call(c, "BIGS?", 5, &reply, 5000), TD_OK);
    assert_int_equal(reply.len, 1);
    assert_int_equal(reply.data[0], '3');

    /* the server's own limit (the default 8 MiB) refuses a larger request: the sender's
     * connection is dropped (child_huge), the server and other clients go on */
    pid_t pid;
    int sock;
    assert_int_equal(setenv(URL_ENV, url, 1), 0);
    assert_int_equal(spawn_self("huge", &sock, &pid), 0);
    assert_int_equal(spawn_wait(pid, 30000), 0);
    close(sock);
    assert_int_equal(bus_client_call(c, "ab", 2, &reply, 5000), TD_OK);
    assert_int_equal(reply.len, 3);
    assert_memory_equal(reply.data, "ba!", 3);

    msg_buf_free(&reply);
    bus_client_free(c);
    server_stop(&srv);
}

typedef struct caller {
    bus_client *c;
    uint32_t thread;   /* index of this caller */
    int calls;         /* calls to make */
    int wrong;         /* replies that were not this caller's own answer */
    int failed;        /* calls that returned an error */
} caller;

static void *caller_main(void *arg)
{
    caller *k = arg;
    msg_buf req, reply;
    msg_buf_init(&req);
    msg_buf_init(&reply);
    for (int i = 0; i < k->calls; i++) {
        uint64_t rid = ((uint64_t)k->thread << 32) | (uint64_t)i;
        char data[32];
        /* every third call makes the handler sleep 1 ms so replies finish out of order */
        int n = i % 3 == 0 ? snprintf(data, sizeof data, "sleep:1")
                           : snprintf(data, sizeof data, "t%u-c%d", k->thread, i);
        msg_ping p = {.nonce = rid * 2654435761u, .data = (const uint8_t *)data,
                      .data_len = (uint32_t)n};
        if (msg_pack_ping(&req, rid, &p) != TD_OK ||
            bus_client_call(k->c, req.data, req.len, &reply, 10000) != TD_OK) {
            k->failed++;
            continue;
        }
        msg_ping got;
        uint64_t got_rid = 0;
        if (msg_unpack_pong(reply.data, reply.len, &got_rid, &got) != TD_OK ||
            got_rid != rid || got.nonce != p.nonce || got.data_len != p.data_len ||
            memcmp(got.data, data, (size_t)n) != 0)
            k->wrong++;
    }
    msg_buf_free(&req);
    msg_buf_free(&reply);
    return NULL;
}

static void test_concurrent_client_threads_get_their_own_answers(void **state)
{
    (void)state;
    char url[BUS_URL_MAX];
    endpoint(url, "many");
    server_proc srv = server_start(url);
    bus_client *c = client_open(url, 0);
    enum { THREADS = 8, CALLS = 150 };
    caller k[THREADS];
    pthread_t t[THREADS];
    for (uint32_t i = 0; i < THREADS; i++) {
        k[i] = (caller){.c = c, .thread = i + 1, .calls = CALLS};
        assert_int_equal(pthread_create(&t[i], NULL, caller_main, &k[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(k[i].failed, 0);
        assert_int_equal(k[i].wrong, 0);
    }
    bus_client_free(c);
    server_stop(&srv);
}

typedef struct sleeper {
    bus_client *c;
    td_err result;
} sleeper;

static void *sleeper_main(void *arg)
{
    sleeper *s = arg;
    msg_buf req, reply;
    msg_buf_init(&req);
    msg_buf_init(&reply);
    msg_ping p = {.nonce = 1, .data = (const uint8_t *)"sleep:200", .data_len = 9};
    s->result = msg_pack_ping(&req, 1, &p);
    if (s->result == TD_OK)
        s->result = bus_client_call(s->c, req.data, req.len, &reply, 10000);
    msg_buf_free(&req);
    msg_buf_free(&reply);
    return NULL;
}

static void test_server_handles_requests_on_several_contexts_at_once(void **state)
{
    (void)state;
    char url[BUS_URL_MAX];
    endpoint(url, "parallel");
    server_proc srv = server_start(url);
    bus_client *c = client_open(url, 0);
    /* 8 requests of 200 ms each on 4 workers: two rounds, about 400 ms; one worker would
     * need 1600 ms. */
    enum { N = 8 };
    sleeper s[N];
    pthread_t t[N];
    double t0 = now_ms();
    for (int i = 0; i < N; i++) {
        s[i] = (sleeper){.c = c};
        assert_int_equal(pthread_create(&t[i], NULL, sleeper_main, &s[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(s[i].result, TD_OK);
    }
    double dt = now_ms() - t0;
    assert_true(dt >= 390.0);
    assert_true(dt < 1200.0);
    bus_client_free(c);
    server_stop(&srv);
}

static void test_handler_error_reaches_the_client_as_an_error_message(void **state)
{
    (void)state;
    char url[BUS_URL_MAX];
    endpoint(url, "errors");
    server_proc srv = server_start(url);
    bus_client *c = client_open(url, 0);
    msg_buf req, reply;
    msg_buf_init(&req);
    msg_buf_init(&reply);
    msg_ping p = {.nonce = 5, .data = (const uint8_t *)"fail", .data_len = 4};
    assert_int_equal(msg_pack_ping(&req, 77, &p), TD_OK);
    assert_int_equal(bus_client_call(c, req.data, req.len, &reply, 5000), TD_OK);
    msg_error e;
    uint64_t rid = 0;
    assert_int_equal(msg_unpack_error(reply.data, reply.len, &rid, &e), TD_OK);
    assert_int_equal(rid, 77);
    assert_int_equal(e.code, TD_EBUSY);
    assert_string_equal(e.message, "worker busy: try later");

    /* a request with a readable envelope but a bad payload: the unpack error comes back */
    static const uint8_t bad_ping[] = {0x94, 0x01, 0x02, 0x2a, 0x91, 0x07};
    assert_int_equal(bus_client_call(c, bad_ping, sizeof bad_ping, &reply, 5000), TD_OK);
    assert_int_equal(msg_unpack_error(reply.data, reply.len, &rid, &e), TD_OK);
    assert_int_equal(rid, 42);
    assert_int_equal(e.code, TD_EFORMAT);
    assert_non_null(strstr(e.message, "payload"));

    msg_buf_free(&req);
    msg_buf_free(&reply);
    bus_client_free(c);
    server_stop(&srv);
}

typedef struct killer {
    pid_t pid;
    int after_ms;
} killer;

static void *killer_main(void *arg)
{
    killer *k = arg;
    sleep_ms(k->after_ms);
    kill(k->pid, SIGKILL);
    return NULL;
}

static void test_call_fails_at_once_when_the_server_dies_during_it(void **state)
{
    (void)state;
    char url[BUS_URL_MAX];
    endpoint(url, "dying");
    server_proc srv = server_start(url);
    bus_client *c = client_open(url, 0);
    msg_buf req, reply;
    msg_buf_init(&req);
    msg_buf_init(&reply);
    msg_ping p = {.nonce = 1, .data = (const uint8_t *)"sleep:4000", .data_len = 10};
    assert_int_equal(msg_pack_ping(&req, 1, &p), TD_OK);
    killer k = {.pid = srv.pid, .after_ms = 300};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, killer_main, &k), 0);
    double t0 = now_ms();
    assert_int_equal(bus_client_call(c, req.data, req.len, &reply, 8000), TD_ECLOSED);
    double dt = now_ms() - t0;
    pthread_join(t, NULL);
    assert_true(dt >= 250.0);
    assert_true(dt < 2000.0); /* not the 4 s handler nor the 8 s timeout */
    assert_non_null(strstr(err_msg(), "connection lost"));
    close(srv.sock);
    assert_int_equal(spawn_wait(srv.pid, 10000), 128 + SIGKILL);
    msg_buf_free(&req);
    msg_buf_free(&reply);
    bus_client_free(c);
}

static void test_client_survives_a_server_restart(void **state)
{
    (void)state;
    char url[BUS_URL_MAX];
    endpoint(url, "restart");
    server_proc srv = server_start(url);
    bus_client *c = client_open(url, 0);
    msg_buf reply;
    msg_buf_init(&reply);
    assert_int_equal(bus_client_call(c, "a", 1, &reply, 5000), TD_OK);
    server_stop(&srv);
    td_err e = bus_client_call(c, "b", 1, &reply, 200);
    assert_true(e == TD_ETIMEOUT || e == TD_ECLOSED);
    srv = server_start(url);
    assert_int_equal(bus_client_call(c, "cd", 2, &reply, 5000), TD_OK);
    assert_int_equal(reply.len, 3);
    assert_memory_equal(reply.data, "dc!", 3);
    msg_buf_free(&reply);
    bus_client_free(c);
    server_stop(&srv);
}

static void test_server_refuses_an_endpoint_already_served(void **state)
{
    (void)state;
    char url[BUS_URL_MAX];
    endpoint(url, "taken");
    server_proc srv = server_start(url);
    bus_server *s = NULL;
    assert_int_equal(bus_server_init(&s, url, NULL, child_handle, NULL), TD_EBUSY);
    assert_null(s);
    assert_non_null(strstr(err_msg(), "taken.ipc"));
    server_stop(&srv);
}

static void test_runtime_dir_is_created_private_and_unsafe_ones_are_refused(void **state)
{
    (void)state;
    char dir[512], want[512], path[4096];
    snprintf(want, sizeof want, "%s/fresh", base_dir);
    assert_int_equal(setenv("TANDEM_RUNTIME_DIR", want, 1), 0);
    /* with umask 0 a plain mkdir(0700) would still be 0700; with 0777 passed it would not be:
     * the mode must come out 0700 whatever the umask */
    mode_t old = umask(0);
    assert_int_equal(bus_runtime_dir(dir, sizeof dir), TD_OK);
    umask(old);
    assert_string_equal(dir, want);
    struct stat st;
    assert_int_equal(lstat(dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0700);
    /* a trailing slash names the same directory */
    snprintf(path, sizeof path, "%s/", want);
    assert_int_equal(setenv("TANDEM_RUNTIME_DIR", path, 1), 0);
    assert_int_equal(bus_runtime_dir(dir, sizeof dir), TD_OK);
    assert_string_equal(dir, want);

    assert_int_equal(setenv("TANDEM_RUNTIME_DIR", want, 1), 0);
    assert_int_equal(chmod(want, 0777), 0);
    assert_int_equal(bus_runtime_dir(dir, sizeof dir), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "mode 0777"));
    assert_non_null(strstr(err_msg(), want));
    assert_int_equal(chmod(want, 0750), 0);
    assert_int_equal(bus_runtime_dir(dir, sizeof dir), TD_EINVAL);
    assert_int_equal(chmod(want, 0700), 0);
    assert_int_equal(bus_runtime_dir(dir, sizeof dir), TD_OK);

    /* a symbolic link to a good directory, and a plain file */
    snprintf(path, sizeof path, "%s/link", base_dir);
    assert_int_equal(symlink(want, path), 0);
    assert_int_equal(setenv("TANDEM_RUNTIME_DIR", path, 1), 0);
    assert_int_equal(bus_runtime_dir(dir, sizeof dir), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "symbolic link"));
    unlink(path);
    snprintf(path, sizeof path, "%s/file", base_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(setenv("TANDEM_RUNTIME_DIR", path, 1), 0);
    assert_int_equal(bus_runtime_dir(dir, sizeof dir), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "not a directory"));
    unlink(path);
    /* a missing parent is not created */
    snprintf(path, sizeof path, "%s/no/such", base_dir);
    assert_int_equal(setenv("TANDEM_RUNTIME_DIR", path, 1), 0);
    assert_int_equal(bus_runtime_dir(dir, sizeof dir), TD_EIO);

    /* owned by another user (only root can set that up) */
    if (geteuid() == 0) {
        assert_int_equal(chown(want, 65534, 65534), 0);
        assert_int_equal(setenv("TANDEM_RUNTIME_DIR", want, 1), 0);
        assert_int_equal(bus_runtime_dir(dir, sizeof dir), TD_EINVAL);
        assert_non_null(strstr(err_msg(), "owned by uid 65534"));
        assert_int_equal(chown(want, 0, 0), 0);
    }
    rmdir(want);

    /* fallbacks: $XDG_RUNTIME_DIR/tandem, then /tmp/tandem-<uid> */
    assert_int_equal(unsetenv("TANDEM_RUNTIME_DIR"), 0);
    assert_int_equal(setenv("XDG_RUNTIME_DIR", base_dir, 1), 0);
    snprintf(want, sizeof want, "%s/tandem", base_dir);
    assert_int_equal(bus_runtime_dir(dir, sizeof dir), TD_OK);
    assert_string_equal(dir, want);
    rmdir(want);
    assert_int_equal(unsetenv("XDG_RUNTIME_DIR"), 0);
    snprintf(want, sizeof want, "/tmp/tandem-%u", (unsigned)geteuid());
    assert_int_equal(bus_runtime_dir(dir, sizeof dir), TD_OK);
    assert_string_equal(dir, want);

    assert_int_equal(setenv("TANDEM_RUNTIME_DIR", run_dir, 1), 0);
}

static void test_endpoint_names_are_checked(void **state)
{
    (void)state;
    char url[BUS_URL_MAX], want[512];
    assert_int_equal(bus_endpoint(url, sizeof url, "verifyd"), TD_OK);
    snprintf(want, sizeof want, "ipc://%s/verifyd.ipc", run_dir);
    assert_string_equal(url, want);
    assert_int_equal(bus_endpoint(url, sizeof url, ""), TD_EINVAL);
    assert_int_equal(bus_endpoint(url, sizeof url, "../etc"), TD_EINVAL);
    assert_int_equal(bus_endpoint(url, sizeof url, "Verifyd"), TD_EINVAL);
    assert_int_equal(bus_endpoint(url, sizeof url, "a-service-name-of-33-characters-x"),
                     TD_EINVAL);

    /* a runtime directory too deep for an AF_UNIX socket path */
    char deep[512];
    snprintf(deep, sizeof deep, "%s/%s", base_dir,
             "a-directory-name-long-enough-to-push-the-socket-path-past-107-bytes-x");
    assert_int_equal(setenv("TANDEM_RUNTIME_DIR", deep, 1), 0);
    assert_int_equal(bus_endpoint(url, sizeof url, "verifyd"), TD_ERANGE);
    assert_non_null(strstr(err_msg(), "AF_UNIX"));
    rmdir(deep);
    assert_int_equal(setenv("TANDEM_RUNTIME_DIR", run_dir, 1), 0);
}

static int group_setup(void **state)
{
    (void)state;
    if (!tmp_dir_make(base_dir, sizeof base_dir, "tandem-test-bus"))
        return -1;
    snprintf(run_dir, sizeof run_dir, "%s/rt", base_dir);
    setenv("TANDEM_RUNTIME_DIR", run_dir, 1);
    char dir[512];
    if (bus_runtime_dir(dir, sizeof dir) != TD_OK) {
        fprintf(stderr, "%s\n", err_msg());
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    return tmp_dir_remove(base_dir) ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *mode;
    int sock;
    if (spawn_is_child(argc, argv, &mode, &sock)) {
        if (strcmp(mode, "serve") == 0)
            return child_serve(sock);
        if (strcmp(mode, "huge") == 0)
            _exit(child_huge()); /* no exit handlers: the client stays open (see there) */
        return 2;
    }
    test_watchdog("test_bus", 300); /* ~3 s normally, ~40 s under sanitizers and load */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_reply_between_two_processes_has_exact_bytes),
        cmocka_unit_test(test_call_to_absent_server_times_out_within_its_timeout),
        cmocka_unit_test(test_polling_client_gets_fast_and_slow_replies_and_times_out),
        cmocka_unit_test(test_reply_larger_than_the_receive_limit_is_refused),
        cmocka_unit_test(test_concurrent_client_threads_get_their_own_answers),
        cmocka_unit_test(test_server_handles_requests_on_several_contexts_at_once),
        cmocka_unit_test(test_handler_error_reaches_the_client_as_an_error_message),
        cmocka_unit_test(test_call_fails_at_once_when_the_server_dies_during_it),
        cmocka_unit_test(test_client_survives_a_server_restart),
        cmocka_unit_test(test_server_refuses_an_endpoint_already_served),
        cmocka_unit_test(test_runtime_dir_is_created_private_and_unsafe_ones_are_refused),
        cmocka_unit_test(test_endpoint_names_are_checked),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
