/* Making and freeing the CUDA backend table: the plain one, or a profiler over it when the
 * environment asks (TANDEM_PROFILE). Kept apart from kernels/cuda so the CUDA library never
 * calls back into this one. */
#include "kernels/backend.h"

#include <stdio.h>

#include "kernels/backend_prof.h"
#include "kernels/cuda_mem.h"

td_err ops_backend_cuda_init(ops_backend **out, int dev)
{
    *out = NULL;
#ifdef TANDEM_HAVE_CUDA
    ops_backend *be;
    TD_TRY(cuda_backend_init(&be, dev));
    if (!ops_prof_wanted()) {
        *out = be;
        return TD_OK;
    }
    td_err e = ops_prof_wrap(out, be);
    if (e != TD_OK)
        cuda_backend_free(be);
    return e;
#else
    (void)dev;
    return err_set(TD_ENOTSUP, "this build has no CUDA backend (built without nvcc)");
#endif
}

void ops_backend_cuda_free(ops_backend *be)
{
#ifdef TANDEM_HAVE_CUDA
    if (!be)
        return;
    if (!be->prof) {
        cuda_backend_free(be);
        return;
    }
    const ops_backend *inner = ops_prof_inner(be);
    ops_prof_free(be);
    cuda_backend_free(inner);
#else
    (void)be;
#endif
}

void ops_backend_describe(const ops_backend *be, char *out, size_t cap)
{
    if (be->kind != OPS_BACKEND_CUDA) {
        snprintf(out, cap, "cpu");
        return;
    }
#ifdef TANDEM_HAVE_CUDA
    int arch = cuda_code_arch(be->device);
    if (arch > 0) {
        snprintf(out, cap, "cuda:%d (sm_%d code)", be->device, arch / 10);
        return;
    }
#endif
    snprintf(out, cap, "cuda:%d", be->device);
}
