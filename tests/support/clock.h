/* Wall-clock helpers of the tests that wait for daemons and sockets: a monotonic time in
 * milliseconds and a sleep of that many milliseconds. */
#ifndef TANDEM_TESTS_SUPPORT_CLOCK_H
#define TANDEM_TESTS_SUPPORT_CLOCK_H

#include <time.h>

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

#endif
