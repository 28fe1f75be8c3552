/* devarg: the --device argument of the daemons and of tandem generate (env TANDEM_DEVICE):
 * "cpu", "cuda" (device 0) or "cuda:N". Parsing only; opening the device is the caller's
 * (a backend for the compute daemons, a driver device for kvd's pools). */
#ifndef TANDEM_COMMON_DEVARG_H
#define TANDEM_COMMON_DEVARG_H

#include "common/err.h"

/* *ordinal = -1 for "cpu", else the CUDA device number. TD_EINVAL (message names the text)
 * for anything else. */
td_err devarg_parse(const char *text, int *ordinal);

#endif
