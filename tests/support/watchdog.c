/* The test watchdog (watchdog.h). */
#include "tests/support/watchdog.h"

#include <dirent.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define WD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WD_ASAN 1
#endif
#endif
#ifdef WD_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

static const char *wd_what;
static int wd_seconds;
static volatile sig_atomic_t wd_dumped; /* the signalled thread has printed its stack */

/* SIGUSR2 in the thread to report: its id, then its stack (the process is about to abort, so
 * the handler's formatting need not be async-signal-safe). */
static void wd_dump(int sig)
{
    (void)sig;
    fprintf(stderr, "--- thread %ld\n", (long)syscall(SYS_gettid));
    fflush(stderr);
#ifdef WD_ASAN
    __sanitizer_print_stack_trace();
#else
    void *pc[64];
    backtrace_symbols_fd(pc, backtrace(pc, 64), 2);
#endif
    wd_dumped = 1;
}

static void *wd_main(void *arg)
{
    (void)arg;
    struct timespec left = {wd_seconds, 0};
    while (nanosleep(&left, &left) != 0) {
    }
    fprintf(stderr, "watchdog: %s still running after %d s; the stacks of its threads:\n",
            wd_what, wd_seconds);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = wd_dump;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, NULL);
    const long me = syscall(SYS_gettid);
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        const long tid = atol(e->d_name);
        if (tid <= 0 || tid == me)
            continue;
        wd_dumped = 0;
        if (syscall(SYS_tgkill, (long)getpid(), tid, SIGUSR2) != 0)
            continue;
        for (int i = 0; i < 200 && !wd_dumped; i++)
            usleep(10000);
    }
    if (d)
        closedir(d);
    abort();
}

void test_watchdog(const char *what, int seconds)
{
    wd_what = what;
    wd_seconds = seconds;
    pthread_t th;
    if (pthread_create(&th, NULL, wd_main, NULL) == 0)
        pthread_detach(th);
}
