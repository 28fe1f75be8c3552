/* Command-line options shared by every daemon and the CLI.
 *
 * A program lists its options in a table; args_parse fills the variables they point to from
 * "--name value", "--name=value" or, for flags, "--name", and falls back to an environment
 * variable when the option names one (so a service unit can set TANDEM_VERIFYD_ENDPOINT).
 * Unknown options and bad values are errors with a message, never silently ignored. */
#ifndef TANDEM_COMMON_ARGS_H
#define TANDEM_COMMON_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

typedef enum args_type {
    ARGS_FLAG,   /* bool: present = true */
    ARGS_STRING, /* const char * (points into argv or the environment) */
    ARGS_INT,    /* int64_t */
    ARGS_DOUBLE, /* double */
} args_type;

typedef struct args_opt {
    const char *name;  /* long name without "--" */
    args_type type;
    void *value;       /* bool *, const char **, int64_t *, double * */
    const char *env;   /* environment variable used when the option is absent, or NULL */
    const char *help;  /* one line */
    int64_t min, max;  /* ARGS_INT bounds (both 0: unbounded) */
    char short_name;   /* single-letter alias ("-n"), or 0 */
} args_opt;

#define ARGS_END {0}

/* Parses argv[first..argc). "-x value" works for options with a short_name. Positional arguments are moved to positional[] in order
 * (at most max_positional; more is an error) and counted in *n_positional.
 * "--" ends option parsing. "--help" sets *help (when help is non-NULL) and stops. */
td_err args_parse(int argc, char **argv, int first, const args_opt *opts,
                  const char **positional, int max_positional, int *n_positional, bool *help);

/* Prints "usage: <usage>" and one line per option with its default and environment name. */
void args_usage(const char *usage, const args_opt *opts);

/* The names of a comma-separated list as bits: names[i] (i < n <= 64) sets bit i of *mask;
 * an empty list is no name. TD_EINVAL "no <what> named '<item>' (<hint>)" for the first item,
 * empty ones included, that is none of them. */
td_err args_names(const char *list, const char *const *names, int n, uint64_t *mask,
                  const char *what, const char *hint);

#endif
