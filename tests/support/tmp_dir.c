/* Test folders under /tmp (tests/support/tmp_dir.h). */
#define _XOPEN_SOURCE 700
#include "tests/support/tmp_dir.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

bool tmp_dir_make(char *dir, size_t cap, const char *prefix)
{
    const int n = snprintf(dir, cap, "/tmp/%s-XXXXXX", prefix);
    return n > 0 && (size_t)n < cap && mkdtemp(dir) != NULL;
}

static int tmp_dir_unlink(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 ? 0 : -1;
}

bool tmp_dir_remove(const char *dir)
{
    return nftw(dir, tmp_dir_unlink, 16, FTW_DEPTH | FTW_PHYS) == 0;
}
