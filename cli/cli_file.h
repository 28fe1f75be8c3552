/* Reading a whole input file for a command. */
#ifndef TANDEM_CLI_FILE_H
#define TANDEM_CLI_FILE_H

#include <stddef.h>

#include "common/err.h"

#define CLI_FILE_MAX ((size_t)256 << 20) /* bytes of one input file */

/* The whole of path ("-": stdin) in a malloc'd buffer, NUL-terminated (*len bytes without
 * it). TD_EIO naming the file (open or read error), TD_ERANGE past CLI_FILE_MAX bytes,
 * TD_ENOMEM. */
td_err cli_read_file(const char *path, char **out, size_t *len);

#endif
