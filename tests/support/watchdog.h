/* A watchdog for tests whose rare hang would otherwise end only at ctest's timeout, with no
 * trace: once the time is up it prints the stack of every thread of the process to stderr
 * and aborts, so the log says where each thread waited. */
#ifndef TANDEM_TESTS_SUPPORT_WATCHDOG_H
#define TANDEM_TESTS_SUPPORT_WATCHDOG_H

/* Starts this process's watchdog thread: after `seconds`, "watchdog: <what> still running",
 * each other thread's stack (SIGUSR2 to it; under AddressSanitizer its symbolized trace,
 * else glibc's backtrace), then abort(). Call it in the test's own process, not in a
 * spawned child. */
void test_watchdog(const char *what, int seconds);

#endif
