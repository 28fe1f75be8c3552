/* The CUDA MPS control daemon of tandem serve. Without MPS every process on a GPU has its own
 * context and the GPU switches between them each time work alternates: about 290 us per
 * draft/verify round trip on an H200, against about 10 us when verifyd and draftd are clients
 * of one MPS server. So with a cuda device the supervisor starts `nvidia-cuda-mps-control -d`
 * with private pipe and log directories under its runtime directory, gives the services an
 * environment naming them, and tells the daemon to quit when it stops (and waits for it to be
 * gone: its pid file removed, nothing listening on its control socket). A daemon the user
 * already runs (CUDA_MPS_PIPE_DIRECTORY set) is used and left alone. Where MPS cannot be had,
 * the services run without it and a warning says what that costs. */
#ifndef TANDEM_CLI_SERVE_MPS_H
#define TANDEM_CLI_SERVE_MPS_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

typedef enum mps_mode {
    MPS_MODE_UNUSED, /* cpu device: nothing to do */
    MPS_MODE_OWN,    /* a control daemon this supervisor started (and stops) */
    MPS_MODE_USER,   /* the user's, named by CUDA_MPS_PIPE_DIRECTORY (never started or stopped) */
    MPS_MODE_OFF,    /* a GPU without MPS: --no-mps, or the daemon was missing or failed */
} mps_mode;

typedef struct mps_ctl {
    mps_mode mode;
    char pipe_dir[PATH_MAX];  /* OWN/USER: CUDA_MPS_PIPE_DIRECTORY of the services; OFF+late */
    char log_dir[PATH_MAX];   /* OWN: CUDA_MPS_LOG_DIRECTORY of the services; OFF+late */
    char why[4 * PATH_MAX];   /* OFF: why not; USER: a note when its control socket is absent */
    char **env;               /* [n_env + 1] the services' environment, NULL-terminated */
    size_t n_env;             /* entries before the NULL */
    char *own[2];             /* the "CUDA_MPS_...=" strings env adds (malloc'd), or NULL */
    char out_log[PATH_MAX];   /* where the control program's own output goes */
    bool late;                /* OFF: a daemon we started did not listen in time; pipe_dir
                               * and log_dir stay its own, and mps_free stops it if it came up */
} mps_ctl;

/* Decides how the services reach the GPU and builds their environment. gpu: the device is
 * cuda; no_mps: --no-mps; run_dir: the runtime directory (OWN puts <run_dir>/mps/{pipe,log}
 * there; the control program's output goes to logs_dir/mps.log). A control daemon left in
 * run_dir by an earlier supervisor that was killed is told to quit first. Failing to get MPS
 * is not an error (mode OFF, with a warning logged); TD_ENOMEM is. */
td_err mps_init(mps_ctl *m, bool gpu, bool no_mps, const char *run_dir, const char *logs_dir);

/* Starts a control daemon of m's own under run_dir/mps, whatever the environment names (the
 * control program's output goes to logs_dir/mps.log): mode OWN, or OFF with m->why and
 * nothing logged. mps_init's way for serve; tandem bench's split measurement calls it. */
td_err mps_start(mps_ctl *m, const char *run_dir, const char *logs_dir);

/* Tells an OWN daemon to quit (the services, its clients, must have stopped) and frees the
 * environment. Safe on a zeroed or already freed mps_ctl. */
void mps_free(mps_ctl *m);

/* One line for tandem status: "in use (...)", "not used (...)", "off: ...". */
void mps_describe(const mps_ctl *m, char *out, size_t cap);

#endif
