#include "common/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static char log_process[32] = "tandem";
static log_level log_threshold = LOG_LEVEL_INFO;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const log_names[] = {"DEBUG", "INFO", "WARN", "ERROR", "OFF"};

int log_level_parse(const char *s)
{
    if (!s)
        return -1;
    for (int i = 0; i <= LOG_LEVEL_OFF; i++)
        if (strcasecmp(s, log_names[i]) == 0)
            return i;
    if (strcasecmp(s, "warning") == 0)
        return LOG_LEVEL_WARN;
    return -1;
}

void log_init(const char *process, log_level level)
{
    if (process)
        snprintf(log_process, sizeof log_process, "%s", process);
    log_threshold = level;
    int env = log_level_parse(getenv("TANDEM_LOG"));
    if (env >= 0)
        log_threshold = (log_level)env;
}

void log_set_level(log_level level)
{
    log_threshold = level;
}

log_level log_get_level(void)
{
    return log_threshold;
}

void log_write(log_level level, const char *fmt, ...)
{
    if (level < log_threshold || level >= LOG_LEVEL_OFF)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char line[2048];
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, log_process, log_names[level]);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_lock);
    fprintf(stderr, "%s\n", line);
    fflush(stderr);
    pthread_mutex_unlock(&log_lock);
}
