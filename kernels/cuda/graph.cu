/* CUDA graphs of a stream's work (kernels/cuda_mem.h): a model step recorded once and
 * replayed, so ~1600 launches cost one. */
#include "kernels/cuda/cuda_common.h"

extern "C" {
#include "kernels/cuda_mem.h"
}

#define GRAPH_PREP_COLS 65536 /* inputs of the widest matmul the prepared scratch serves */
#define GRAPH_PREP_TOK 64     /* cuda_matmul's chunk: the most tokens one scratch use holds */

static td_err graph_fail(cudaError_t e, const char *what)
{
    (void)cudaGetLastError();
    return err_set(TD_ECUDA, "%s: %s", what, cudaGetErrorString(e));
}

extern "C" td_err cuda_graph_begin(ops_stream st)
{
    cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed);
    return e == cudaSuccess ? TD_OK : graph_fail(e, "cudaStreamBeginCapture");
}

extern "C" td_err cuda_graph_end(ops_stream st, void **graph)
{
    *graph = NULL;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(st, &g);
    if (e != cudaSuccess) {
        if (g)
            (void)cudaGraphDestroy(g);
        return graph_fail(e, "cudaStreamEndCapture (a call could not be recorded)");
    }
    cudaGraphExec_t x = NULL;
    e = cudaGraphInstantiate(&x, g, 0);
    (void)cudaGraphDestroy(g); /* the executable graph keeps what it needs */
    if (e != cudaSuccess)
        return graph_fail(e, "cudaGraphInstantiate");
    *graph = x;
    return TD_OK;
}

extern "C" td_err cuda_graph_launch(void *graph, ops_stream st)
{
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)graph, st);
    return e == cudaSuccess ? TD_OK : graph_fail(e, "cudaGraphLaunch");
}

extern "C" void cuda_graph_free(void *graph)
{
    if (graph)
        (void)cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

extern "C" td_err cuda_graph_prepare(ops_stream st)
{
    /* One Q4_K row (read as x and, x_bf16, as x rounded to bf16), then one BF16 row, of
     * GRAPH_PREP_COLS inputs times GRAPH_PREP_TOK tokens of zeros: the matmuls size their
     * scratch (rounded activations; the bf16 copy; the F16/BF16 split) by inputs and tokens,
     * not by the weight's rows. The BF16 row is the longer. */
    const size_t w_bytes = (size_t)GRAPH_PREP_COLS * 2;
    const size_t x_bytes = (size_t)GRAPH_PREP_COLS * GRAPH_PREP_TOK * sizeof(float);
    void *w = NULL, *x = NULL, *y = NULL;
    td_err r = cuda_mem_alloc(&w, w_bytes);
    if (r == TD_OK)
        r = cuda_mem_alloc(&x, x_bytes);
    if (r == TD_OK)
        r = cuda_mem_alloc(&y, GRAPH_PREP_TOK * sizeof(float));
    if (r == TD_OK)
        r = cuda_mem_fill(w, 0, w_bytes, st);
    if (r == TD_OK)
        r = cuda_mem_fill(x, 0, x_bytes, st);
    ops_weight wt;
    if (r == TD_OK)
        r = ops_weight_init(&wt, TD_Q4_K, 1, GRAPH_PREP_COLS, w);
    if (r == TD_OK)
        r = cuda_matmul((float *)y, (const float *)x, &wt, GRAPH_PREP_TOK, st);
    if (r == TD_OK) { /* and through the bf16-rounded activations (x_bf16) */
        wt.x_bf16 = true;
        r = cuda_matmul((float *)y, (const float *)x, &wt, GRAPH_PREP_TOK, st);
    }
    if (r == TD_OK)
        r = ops_weight_init(&wt, TD_BF16, 1, GRAPH_PREP_COLS, w);
    if (r == TD_OK)
        r = cuda_matmul((float *)y, (const float *)x, &wt, GRAPH_PREP_TOK, st);
    if (r == TD_OK)
        r = cuda_stream_sync(st);
    cuda_mem_free(w);
    cuda_mem_free(x);
    cuda_mem_free(y);
    return r;
}
