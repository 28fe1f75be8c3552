/* Logging shared by every daemon and the CLI: one line per event on stderr,
 * "2026-11-29T18:00:00.123Z verifyd INFO message", level from TANDEM_LOG or log_init. */
#ifndef TANDEM_COMMON_LOG_H
#define TANDEM_COMMON_LOG_H

typedef enum log_level {
    LOG_LEVEL_DEBUG = 0,
    LOG_LEVEL_INFO,
    LOG_LEVEL_WARN,
    LOG_LEVEL_ERROR,
    LOG_LEVEL_OFF,
} log_level;

/* Names the process in every line and sets the threshold; the environment variable
 * TANDEM_LOG (debug|info|warn|error|off) overrides level. */
void log_init(const char *process, log_level level);

/* Parses "debug", "info", "warn", "error", "off"; returns -1 when unknown. */
int log_level_parse(const char *s);

void log_set_level(log_level level);
log_level log_get_level(void);

void log_write(log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_DEBUG(...) log_write(LOG_LEVEL_DEBUG, __VA_ARGS__)
#define LOG_INFO(...) log_write(LOG_LEVEL_INFO, __VA_ARGS__)
#define LOG_WARN(...) log_write(LOG_LEVEL_WARN, __VA_ARGS__)
#define LOG_ERROR(...) log_write(LOG_LEVEL_ERROR, __VA_ARGS__)

#endif
