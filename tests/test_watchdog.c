/* The test watchdog (tests/support/watchdog.h): a child that hangs with two threads blocked
 * is aborted once its time is up, after printing the watchdog's line and one stack per
 * other thread. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/spawn.h"
#include "tests/support/watchdog.h"

#define LOG_ENV "TANDEM_TEST_WATCHDOG_LOG"

static pthread_mutex_t never_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t never_cv = PTHREAD_COND_INITIALIZER;

/* A thread waiting for a signal nobody sends. */
static void *blocked_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&never_mu);
    for (;;)
        pthread_cond_wait(&never_cv, &never_mu);
    return NULL;
}

/* The hanging child: stderr into the log file, a watchdog of 1 s, a blocked thread, and the
 * main thread asleep. */
static int child_hang(void)
{
    const char *log = getenv(LOG_ENV);
    if (!log || !freopen(log, "w", stderr))
        return 2;
    test_watchdog("the hanging child", 1);
    pthread_t th;
    if (pthread_create(&th, NULL, blocked_main, NULL) != 0)
        return 3;
    for (;;)
        sleep(60);
}

static void test_watchdog_prints_every_other_threads_stack_then_aborts(void **state)
{
    (void)state;
    char log[] = "/tmp/tandem-test-watchdog-XXXXXX";
    const int fd = mkstemp(log);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(setenv(LOG_ENV, log, 1), 0);
    int sock = -1;
    pid_t pid = 0;
    assert_int_equal(spawn_self("hang", &sock, &pid), 0);
    assert_int_equal(spawn_wait(pid, 60000), 128 + SIGABRT);
    close(sock);

    FILE *f = fopen(log, "r");
    assert_non_null(f);
    char text[1 << 16];
    const size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(log);
    assert_non_null(strstr(text, "watchdog: the hanging child still running after 1 s"));
    int threads = 0;
    for (const char *p = text; (p = strstr(p, "--- thread ")) != NULL; p++)
        threads++;
    assert_int_equal(threads, 2); /* the main thread and the blocked one, not the watchdog */
}

int main(int argc, char **argv)
{
    const char *mode;
    int sock;
    if (spawn_is_child(argc, argv, &mode, &sock))
        return strcmp(mode, "hang") == 0 ? child_hang() : 2;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_watchdog_prints_every_other_threads_stack_then_aborts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
