/* Test folders under /tmp: made fresh and private, removed with everything below them. */
#ifndef TANDEM_TESTS_SUPPORT_TMP_DIR_H
#define TANDEM_TESTS_SUPPORT_TMP_DIR_H

#include <stdbool.h>
#include <stddef.h>

/* Makes /tmp/<prefix>-XXXXXX (mode 0700) and writes its path to dir (cap bytes); false when it
 * cannot be made. */
bool tmp_dir_make(char *dir, size_t cap, const char *prefix);

/* Removes dir and everything below it (links are removed, not followed); false when anything
 * is left. */
bool tmp_dir_remove(const char *dir);

#endif
