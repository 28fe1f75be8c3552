/* A profiling wrapper over a backend table: every op and copy runs the wrapped backend's and
 * is timed, so a step of the model shows where its time goes without touching model code.
 *
 * On the GPU each call is bracketed by two CUDA events on the backend's stream (device time
 * of the work the call enqueued, launch gaps excluded) and the host time spent in the call
 * is kept beside it (launch overhead). Events are read back when the stream has finished
 * them: at sync and to_host, or when a step has more pending calls than the event pool holds
 * (then the profiler waits, which only the profiled run pays). On the CPU the host time is
 * the op's time. Kernel launches are counted at the launch sites of kernels/cuda
 * (cuda_launch_count).
 *
 * Zero cost when off: without TANDEM_PROFILE (or an explicit ops_prof_wrap) the backend table
 * is the plain one and nothing here runs. A profiler serves one thread, like the backend. */
#ifndef TANDEM_KERNELS_BACKEND_PROF_H
#define TANDEM_KERNELS_BACKEND_PROF_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/backend.h"

#define OPS_PROF_MAX_ROWS 48

typedef struct ops_prof_row {
    const char *op;    /* "matmul", "copy", ... (static storage) */
    uint64_t calls;    /* calls of the op */
    uint64_t launches; /* kernel launches they made (0 on the CPU) */
    double dev_us;     /* microseconds of device time (CPU: host time) */
    double host_us;    /* microseconds the host spent in the calls (enqueueing on the GPU) */
} ops_prof_row;

/* What a profiler counted since its last reset, ops with at least one call only, by
 * decreasing device time. */
typedef struct ops_prof_table {
    ops_prof_row rows[OPS_PROF_MAX_ROWS];
    int n_rows;
    uint64_t steps;     /* ops_prof_step marks since the reset (0: not divided per step) */
    bool device_timed;  /* dev_us comes from CUDA events (false: host clock) */
    uint64_t lost;      /* calls whose device time could not be read (a failed event) */
} ops_prof_table;

/* True when the environment asks for profiling: TANDEM_PROFILE set, non-empty, not "0". */
bool ops_prof_wanted(void);

/* *out = a table running inner's ops, timed (profiling starts enabled). inner must outlive
 * it. TD_ENOMEM, or TD_ECUDA when CUDA events cannot be made. */
td_err ops_prof_wrap(ops_backend **out, const ops_backend *inner);
/* Makes the ops named in list (comma-separated, the profile table's names; empty: none)
 * return TD_OK at once without running, for what is left of a step to be timed: results
 * are then wrong. Replaces the previous list. Ops that move data (to_device, to_host, copy,
 * copy2d, zero) cannot be skipped. TD_EINVAL for those and for unknown names (the list in
 * force stays). */
td_err ops_prof_skip(const ops_backend *be, const char *list);
/* Whether be is a profiler with ops to skip. */
bool ops_prof_skipping(const ops_backend *be);
/* The backend a profiler wraps (be itself when be is not a profiler). */
const ops_backend *ops_prof_inner(const ops_backend *be);
/* Frees a table made by ops_prof_wrap (not the inner backend). NULL is fine. */
void ops_prof_free(ops_backend *be);

/* The calls below do nothing when be is not a profiler. */
bool ops_prof_active(const ops_backend *be);
/* Whether calls are being timed now (a profiler, not paused): recorded graphs must then
 * neither be made nor replayed. */
bool ops_prof_on(const ops_backend *be);
/* Pauses (calls pass through untimed and uncounted) or resumes profiling. */
void ops_prof_enable(const ops_backend *be, bool on);
/* Forgets every count (pending device times are dropped after the stream finishes them). */
void ops_prof_reset(const ops_backend *be);
/* Marks the end of one step (a decode, a verify, a draft) for per-step figures. */
void ops_prof_step(const ops_backend *be);
/* The counts so far (waits for the stream so every device time is in). An empty table (0
 * rows) when be is not a profiler. */
td_err ops_prof_snapshot(const ops_backend *be, ops_prof_table *t);

/* Prints t as a table headed by title: per step (when t->steps > 0) calls, launches,
 * device and host microseconds and the share of device time; wall_ms, when > 0, is the
 * measured time of one step, so the idle device time (launch gaps, host work) shows. */
void ops_prof_print(FILE *f, const char *title, const ops_prof_table *t, double wall_ms);

#endif
