#include "cli/cli_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

td_err cli_read_file(const char *path, char **out, size_t *len)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f)
        return err_set(TD_EIO, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    td_err e = TD_OK;
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1)
            break;
        if (cap >= CLI_FILE_MAX) {
            e = err_set(TD_ERANGE, "%s: larger than %zu bytes", path, CLI_FILE_MAX);
            break;
        }
        char *b = realloc(buf, cap * 2);
        if (!b) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = b;
        cap *= 2;
    }
    if (!buf && e == TD_OK)
        e = err_set(TD_ENOMEM, "%s: out of memory", path);
    if (e == TD_OK && ferror(f))
        e = err_set(TD_EIO, "%s: read error", path);
    if (f != stdin)
        fclose(f);
    if (e != TD_OK) {
        free(buf);
        return e;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return TD_OK;
}
