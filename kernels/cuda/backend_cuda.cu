/* The CUDA backend: device memory on one GPU and the cuda_* twins, all on one stream.
 * (ops_backend_cuda_init in kernels/backend.c adds the profiler when asked.) */
#include <stdlib.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/launch.cuh"

extern "C" {
#include "kernels/backend.h"
#include "kernels/cuda_mem.h"
}

static td_err be_cuda_alloc(const ops_backend *be, void **p, size_t bytes)
{
    (void)be;
    return cuda_mem_alloc(p, bytes);
}

static void be_cuda_release(const ops_backend *be, void *p)
{
    (void)be;
    cuda_mem_free(p);
}

static td_err be_cuda_to_device(const ops_backend *be, void *dst, const void *src, size_t bytes)
{
    return cuda_mem_upload(dst, src, bytes, be->stream);
}

static td_err be_cuda_to_host(const ops_backend *be, void *dst, const void *src, size_t bytes)
{
    return cuda_mem_download(dst, src, bytes, be->stream);
}

static td_err be_cuda_copy(const ops_backend *be, void *dst, const void *src, size_t bytes)
{
    return cuda_mem_copy_chained(dst, src, bytes, be->stream);
}

static td_err be_cuda_copy2d(const ops_backend *be, void *dst, size_t dpitch, const void *src,
                             size_t spitch, size_t width, size_t rows)
{
    return cuda_mem_copy2d_chained(dst, dpitch, src, spitch, width, rows, be->stream);
}

static td_err be_cuda_zero(const ops_backend *be, void *p, size_t bytes)
{
    return cuda_mem_fill(p, 0, bytes, be->stream);
}

static td_err be_cuda_sync(const ops_backend *be)
{
    return cuda_stream_sync(be->stream);
}

static td_err be_cuda_matmul(const ops_backend *be, float *y, const float *x, const ops_weight *w,
                             int64_t n_tok)
{
    return cuda_matmul(y, x, w, n_tok, be->stream);
}

static td_err be_cuda_matmul_multi(const ops_backend *be, const float *x, const ops_mm_out *mm,
                                   int n, int64_t n_tok)
{
    return cuda_matmul_multi(x, mm, n, n_tok, be->stream);
}

static td_err be_cuda_get_rows(const ops_backend *be, float *out, const ops_weight *w,
                               const int32_t *ids, int64_t n)
{
    return cuda_get_rows(out, w, ids, n, be->stream);
}

static td_err be_cuda_rmsnorm(const ops_backend *be, float *out, const float *x, const float *w,
                              int64_t n_rows, int64_t dim, int64_t stride, float eps)
{
    return cuda_rmsnorm(out, x, w, n_rows, dim, stride, eps, be->stream);
}

static td_err be_cuda_l2norm(const ops_backend *be, float *out, const float *x, int64_t n_rows,
                             int64_t dim, int64_t stride, float eps)
{
    return cuda_l2norm(out, x, n_rows, dim, stride, eps, be->stream);
}

#define BE_CUDA_BINARY(name)                                                                 \
    static td_err be_cuda_##name(const ops_backend *be, float *out, const float *a,          \
                                 const float *b, int64_t n)                                  \
    {                                                                                        \
        return cuda_##name(out, a, b, n, be->stream);                                        \
    }
#define BE_CUDA_UNARY(name)                                                                  \
    static td_err be_cuda_##name(const ops_backend *be, float *out, const float *x, int64_t n) \
    {                                                                                        \
        return cuda_##name(out, x, n, be->stream);                                           \
    }
BE_CUDA_BINARY(add)
BE_CUDA_BINARY(mul)
BE_CUDA_BINARY(swiglu)
BE_CUDA_UNARY(silu)
BE_CUDA_UNARY(sigmoid)
BE_CUDA_UNARY(softplus)

static td_err be_cuda_scale(const ops_backend *be, float *out, const float *x, float s, int64_t n)
{
    return cuda_scale(out, x, s, n, be->stream);
}

static td_err be_cuda_rope_neox(const ops_backend *be, float *x, int64_t n_tok, int64_t n_head,
                                int64_t tok_stride, int64_t head_stride, int64_t n_rot,
                                const int32_t *pos, float theta)
{
    return cuda_rope_neox(x, n_tok, n_head, tok_stride, head_stride, n_rot, pos, theta,
                          be->stream);
}

static td_err be_cuda_attention(const ops_backend *be, const ops_attn *a)
{
    return cuda_attention(a, be->stream);
}

static td_err be_cuda_conv1d_causal(const ops_backend *be, float *out, float *state,
                                    float *state_all, const float *x, int64_t x_stride,
                                    const float *w, int64_t n_tok, int64_t n_ch, int64_t k)
{
    return cuda_conv1d_causal(out, state, state_all, x, x_stride, w, n_tok, n_ch, k,
                              be->stream);
}

static td_err be_cuda_delta_rule(const ops_backend *be, const ops_delta *d)
{
    return cuda_delta_rule(d, be->stream);
}

static td_err be_cuda_delta_rule_many(const ops_backend *be, const ops_delta *d, int64_t n)
{
    return cuda_delta_rule_many(d, n, be->stream);
}

/* Before each recording the matmul scratch is made as large as it will ever need to be, so
 * no later growth frees a buffer a recording holds. */
static td_err be_cuda_graph_begin(const ops_backend *be)
{
    TD_TRY(cuda_graph_prepare(be->stream));
    return cuda_graph_begin(be->stream);
}

static td_err be_cuda_graph_end(const ops_backend *be, void **graph)
{
    return cuda_graph_end(be->stream, graph);
}

static td_err be_cuda_graph_launch(const ops_backend *be, void *graph)
{
    return cuda_graph_launch(graph, be->stream);
}

static void be_cuda_graph_free(const ops_backend *be, void *graph)
{
    (void)be;
    cuda_graph_free(graph);
}

static td_err be_cuda_to_f16(const ops_backend *be, uint16_t *out, const float *x, int64_t n)
{
    return cuda_to_f16(out, x, n, be->stream);
}

static td_err be_cuda_to_bf16(const ops_backend *be, uint16_t *out, const float *x, int64_t n)
{
    return cuda_to_bf16(out, x, n, be->stream);
}

static td_err be_cuda_from_bf16(const ops_backend *be, float *out, const uint16_t *x, int64_t n)
{
    return cuda_from_bf16(out, x, n, be->stream);
}

static td_err be_cuda_add_rmsnorm(const ops_backend *be, float *x, const float *h, float *out,
                                  const float *w, int64_t n_rows, int64_t dim, float eps)
{
    return cuda_add_rmsnorm(x, h, out, w, n_rows, dim, eps, be->stream);
}

static td_err be_cuda_swiglu_matmul(const ops_backend *be, float *y, float *gate,
                                    const float *up, const ops_weight *w, int64_t n_tok)
{
    return cuda_swiglu_matmul(y, gate, up, w, n_tok, be->stream);
}

static td_err be_cuda_qk_norm_rope(const ops_backend *be, float *q, float *k,
                                   const float *q_norm, const float *k_norm, int64_t n_tok,
                                   int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                                   int64_t q_head, int64_t n_rot, const int32_t *pos,
                                   float theta, float eps, const ops_kv_dst *kv)
{
    return cuda_qk_norm_rope(q, k, q_norm, k_norm, n_tok, n_head, n_head_kv, head_dim, q_head,
                             n_rot, pos, theta, eps, kv, be->stream);
}

static td_err be_cuda_deltanet_in(const ops_backend *be, const ops_dn_in *p)
{
    return cuda_deltanet_in(p, be->stream);
}

static td_err be_cuda_softcap(const ops_backend *be, float *out, const float *x, float cap,
                              int64_t n)
{
    return cuda_softcap(out, x, cap, n, be->stream);
}

static td_err be_cuda_argmax(const ops_backend *be, int32_t *idx, const float *x, int64_t n_rows,
                             int64_t n)
{
    return cuda_argmax(idx, x, n_rows, n, be->stream);
}

static td_err be_cuda_accept_greedy(const ops_backend *be, int32_t *argmax, int32_t *result,
                                    const float *logits, const int32_t *draft, int64_t n,
                                    int64_t n_vocab)
{
    return cuda_accept_greedy(argmax, result, logits, draft, n, n_vocab, be->stream);
}

static td_err be_cuda_sample_rows(const ops_backend *be, int32_t *tok, float *q,
                                  const float *logits, int64_t n, int64_t n_vocab,
                                  const ops_sampler *s, uint64_t ctr, uint64_t ctr_step)
{
    return cuda_sample_rows(tok, q, logits, n, n_vocab, s, ctr, ctr_step, be->stream);
}

static td_err be_cuda_accept_sampled(const ops_backend *be, int32_t *result, float *p,
                                     const float *logits, const float *q, const int32_t *draft,
                                     int64_t n, int64_t n_vocab, const ops_sampler *s,
                                     const ops_accept_rng *rng)
{
    return cuda_accept_sampled(result, p, logits, q, draft, n, n_vocab, s, rng, be->stream);
}

static td_err be_cuda_logit_add(const ops_backend *be, float *logits, int64_t n, int64_t n_vocab,
                                const int32_t *off, const ops_logit_add *add)
{
    return cuda_logit_add(logits, n, n_vocab, off, add, be->stream);
}

static td_err be_cuda_logit_mask(const ops_backend *be, float *logits, int64_t n, int64_t n_vocab,
                                 const uint32_t *allow)
{
    return cuda_logit_mask(logits, n, n_vocab, allow, be->stream);
}

static td_err be_cuda_logprob_rows(const ops_backend *be, ops_logprob *out, const float *logits,
                                   const int32_t *tok, int64_t n, int64_t n_vocab, int n_top)
{
    return cuda_logprob_rows(out, logits, tok, n, n_vocab, n_top, be->stream);
}

extern "C" td_err cuda_backend_init(ops_backend **out, int dev)
{
    *out = NULL;
    if (!cuda_available())
        return err_set(TD_ENOTSUP, "no usable CUDA device");
    int n = 0;
    CUDA_TRY(cudaGetDeviceCount(&n));
    if (dev < 0 || dev >= n)
        return err_set(TD_EINVAL, "CUDA device %d does not exist (%d present)", dev, n);
    CUDA_TRY(cudaSetDevice(dev));
    (void)cuda_context_lean(); /* a refusal costs memory only; test_gpu_target checks */
    (void)code_arch(dev); /* its probe now, not in the middle of a recording */
    ops_backend *be = (ops_backend *)calloc(1, sizeof *be);
    if (!be)
        return err_set(TD_ENOMEM, "out of memory");
    td_err e = cuda_stream_create(&be->stream);
    if (e != TD_OK) {
        free(be);
        return e;
    }
    be->kind = OPS_BACKEND_CUDA;
    be->name = "cuda";
    be->device = dev;
    be->delta_chunk_max = cuda_delta_chunk_max(dev);
    be->alloc = be_cuda_alloc;
    be->release = be_cuda_release;
    be->to_device = be_cuda_to_device;
    be->to_host = be_cuda_to_host;
    be->copy = be_cuda_copy;
    be->copy2d = be_cuda_copy2d;
    be->zero = be_cuda_zero;
    be->sync = be_cuda_sync;
    be->matmul = be_cuda_matmul;
    be->matmul_multi = be_cuda_matmul_multi;
    be->get_rows = be_cuda_get_rows;
    be->rmsnorm = be_cuda_rmsnorm;
    be->l2norm = be_cuda_l2norm;
    be->add = be_cuda_add;
    be->mul = be_cuda_mul;
    be->scale = be_cuda_scale;
    be->silu = be_cuda_silu;
    be->sigmoid = be_cuda_sigmoid;
    be->softplus = be_cuda_softplus;
    be->swiglu = be_cuda_swiglu;
    be->rope_neox = be_cuda_rope_neox;
    be->attention = be_cuda_attention;
    be->conv1d_causal = be_cuda_conv1d_causal;
    be->delta_rule = be_cuda_delta_rule;
    be->delta_rule_many = be_cuda_delta_rule_many;
    be->to_f16 = be_cuda_to_f16;
    be->to_bf16 = be_cuda_to_bf16;
    be->from_bf16 = be_cuda_from_bf16;
    be->graph_begin = be_cuda_graph_begin;
    be->graph_end = be_cuda_graph_end;
    be->graph_launch = be_cuda_graph_launch;
    be->graph_free = be_cuda_graph_free;
    be->add_rmsnorm = be_cuda_add_rmsnorm;
    be->swiglu_matmul = be_cuda_swiglu_matmul;
    be->qk_norm_rope = be_cuda_qk_norm_rope;
    be->deltanet_in = be_cuda_deltanet_in;
    be->softcap = be_cuda_softcap;
    be->argmax = be_cuda_argmax;
    be->accept_greedy = be_cuda_accept_greedy;
    be->logit_add = be_cuda_logit_add;
    be->logit_mask = be_cuda_logit_mask;
    be->sample_rows = be_cuda_sample_rows;
    be->accept_sampled = be_cuda_accept_sampled;
    be->logprob_rows = be_cuda_logprob_rows;
    *out = be;
    return TD_OK;
}

extern "C" void cuda_backend_free(const ops_backend *be)
{
    if (!be)
        return;
    cuda_stream_sync(be->stream);
    cuda_stream_free(be->stream);
    free((void *)be); /* made by cuda_backend_init; callers hold the table as const */
}
