/* The --device argument (see devarg.h). */
#include "common/devarg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

td_err devarg_parse(const char *text, int *ordinal)
{
    *ordinal = -1;
    if (!text || strcmp(text, "cpu") == 0)
        return TD_OK;
    if (strncmp(text, "cuda", 4) != 0 || (text[4] != '\0' && text[4] != ':'))
        return err_set(TD_EINVAL, "--device: expected cpu, cuda or cuda:N, got '%s'", text);
    long long dev = 0;
    if (text[4] == ':') {
        char *end;
        dev = strtoll(text + 5, &end, 10);
        if (end == text + 5 || *end || dev < 0 || dev > INT32_MAX)
            return err_set(TD_EINVAL, "--device: bad CUDA device number in '%s'", text);
    }
    *ordinal = (int)dev;
    return TD_OK;
}
