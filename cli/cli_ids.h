/* Token-id lists as people type them on the command line. */
#ifndef TANDEM_CLI_IDS_H
#define TANDEM_CLI_IDS_H

#include <stddef.h>

#include "common/err.h"
#include "common/tokenizer.h"

/* "1,2,3", "[1, 2, 3]" or "1 2 3" (s[0..n)) -> out (replacing its contents; it may come out
 * empty). TD_EINVAL naming the piece that is not an int32 id; TD_ENOMEM. Range against a
 * vocabulary is the caller's check. */
td_err cli_parse_ids(const char *s, size_t n, tok_ids *out);

#endif
