/* A compute backend: where tensors live and which implementation of each op runs on them.
 * The model code (target forward, drafter, speculative step) calls ops through this table,
 * so one forward pass serves the CPU (the reference) and the GPU.
 *
 * Every op takes the cpu_<op> arguments (pointers are backend memory) and returns td_err: on
 * the GPU a launch can fail, and that is an error from outside, not a crash. Ops on one
 * backend run in order (one CUDA stream); results are visible to the host after to_host or
 * sync. */
#ifndef TANDEM_KERNELS_BACKEND_H
#define TANDEM_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "kernels/ops.h"

typedef enum ops_backend_kind {
    OPS_BACKEND_CPU,
    OPS_BACKEND_CUDA,
} ops_backend_kind;

typedef struct ops_backend ops_backend;
struct ops_prof;

struct ops_backend {
    ops_backend_kind kind;
    const char *name;   /* "cpu", "cuda" */
    ops_stream stream;  /* CUDA: the stream every op runs on; CPU: NULL */
    int device;         /* CUDA device ordinal; CPU: -1 */
    int64_t delta_chunk_max; /* the largest ops_delta.chunk delta_rule runs (for d_k up to
                              * OPS_DELTA_CHUNK_DK): OPS_DELTA_CHUNK_MAX, or on a GPU what
                              * its shared memory per block holds */
    struct ops_prof *prof; /* the profiler this table is (kernels/backend_prof.h), or NULL */

    /* memory (bytes); free and release accept NULL */
    td_err (*alloc)(const ops_backend *be, void **p, size_t bytes);
    void (*release)(const ops_backend *be, void *p);
    td_err (*to_device)(const ops_backend *be, void *dst, const void *src, size_t bytes);
    td_err (*to_host)(const ops_backend *be, void *dst, const void *src, size_t bytes);
    td_err (*copy)(const ops_backend *be, void *dst, const void *src, size_t bytes);
    /* rows copies of width bytes: row r from src + r*spitch to dst + r*dpitch */
    td_err (*copy2d)(const ops_backend *be, void *dst, size_t dpitch, const void *src,
                     size_t spitch, size_t width, size_t rows);
    td_err (*zero)(const ops_backend *be, void *p, size_t bytes);
    td_err (*sync)(const ops_backend *be);

    /* ops: arguments as the cpu_<op> of kernels/ops.h */
    td_err (*matmul)(const ops_backend *be, float *y, const float *x, const ops_weight *w,
                     int64_t n_tok);
    /* mm[i].y = x . mm[i].w^T for i < n (1..OPS_MM_GROUP_MAX), all reading x[n_tok][cols]:
     * each y bit for bit what matmul gives. On the GPU the quantised members share one
     * activation rounding (cuda_matmul_multi), a launch saved per extra member. */
    td_err (*matmul_multi)(const ops_backend *be, const float *x, const ops_mm_out *mm, int n,
                           int64_t n_tok);
    td_err (*get_rows)(const ops_backend *be, float *out, const ops_weight *w,
                       const int32_t *ids, int64_t n);
    td_err (*rmsnorm)(const ops_backend *be, float *out, const float *x, const float *w,
                      int64_t n_rows, int64_t dim, int64_t stride, float eps);
    td_err (*l2norm)(const ops_backend *be, float *out, const float *x, int64_t n_rows,
                     int64_t dim, int64_t stride, float eps);
    td_err (*add)(const ops_backend *be, float *out, const float *a, const float *b, int64_t n);
    td_err (*mul)(const ops_backend *be, float *out, const float *a, const float *b, int64_t n);
    td_err (*scale)(const ops_backend *be, float *out, const float *x, float s, int64_t n);
    td_err (*silu)(const ops_backend *be, float *out, const float *x, int64_t n);
    td_err (*sigmoid)(const ops_backend *be, float *out, const float *x, int64_t n);
    td_err (*softplus)(const ops_backend *be, float *out, const float *x, int64_t n);
    td_err (*swiglu)(const ops_backend *be, float *out, const float *gate, const float *up,
                     int64_t n);
    td_err (*rope_neox)(const ops_backend *be, float *x, int64_t n_tok, int64_t n_head,
                        int64_t tok_stride, int64_t head_stride, int64_t n_rot,
                        const int32_t *pos, float theta);
    td_err (*attention)(const ops_backend *be, const ops_attn *a);
    td_err (*conv1d_causal)(const ops_backend *be, float *out, float *state, float *state_all,
                            const float *x, int64_t x_stride, const float *w, int64_t n_tok,
                            int64_t n_ch, int64_t k);
    td_err (*delta_rule)(const ops_backend *be, const ops_delta *d);
    /* cpu_delta_rule_many: n recurrences that share no memory, as few launches as may be */
    td_err (*delta_rule_many)(const ops_backend *be, const ops_delta *d, int64_t n);
    /* out[n] = x[n] as binary16 (cpu_to_f16): storing an f16 KV cache */
    td_err (*to_f16)(const ops_backend *be, uint16_t *out, const float *x, int64_t n);
    /* cpu_to_bf16, cpu_from_bf16: a GPU's feature ring holds bf16 */
    td_err (*to_bf16)(const ops_backend *be, uint16_t *out, const float *x, int64_t n);
    td_err (*from_bf16)(const ops_backend *be, float *out, const uint16_t *x, int64_t n);
    /* the fused chains of kernels/ops.h */
    td_err (*add_rmsnorm)(const ops_backend *be, float *x, const float *h, float *out,
                          const float *w, int64_t n_rows, int64_t dim, float eps);
    td_err (*swiglu_matmul)(const ops_backend *be, float *y, float *gate, const float *up,
                            const ops_weight *w, int64_t n_tok);
    /* cpu_qk_norm_rope, then (kv not NULL) cpu_kv_store of the keys and kv->v: a block's K/V
     * rows into a cache at rows given in backend memory; with kv->qk_cache also of the q
     * heads and kv->qv (another layer's keys and values) */
    td_err (*qk_norm_rope)(const ops_backend *be, float *q, float *k, const float *q_norm,
                           const float *k_norm, int64_t n_tok, int64_t n_head, int64_t n_head_kv,
                           int64_t head_dim, int64_t q_head, int64_t n_rot, const int32_t *pos,
                           float theta, float eps, const ops_kv_dst *kv);
    td_err (*deltanet_in)(const ops_backend *be, const ops_dn_in *p);
    td_err (*softcap)(const ops_backend *be, float *out, const float *x, float cap, int64_t n);
    /* idx[n_rows] = cpu_argmax of each row of x[n_rows][n] */
    td_err (*argmax)(const ops_backend *be, int32_t *idx, const float *x, int64_t n_rows,
                     int64_t n);
    /* Greedy acceptance of a verified block (cuda_accept_greedy): argmax [n] of each row of
     * logits [n][n_vocab], result [2] = {accepted drafts a, next token argmax(row a)} given
     * draft [n-1] (NULL when n == 1). Only result needs to come to the host. */
    td_err (*accept_greedy)(const ops_backend *be, int32_t *argmax, int32_t *result,
                            const float *logits, const int32_t *draft, int64_t n,
                            int64_t n_vocab);
    /* One draw from each of n rows of logits [n][n_vocab] (cpu_sample_rows, cuda_sample_rows):
     * q [n][n_vocab] the filtered distributions, tok [n] the tokens, counters ctr + i *
     * ctr_step; s a host struct, every pointer backend memory. Only tok needs to come to the
     * host; on the GPU tok -1 says a row had no finite logit (the CPU returns TD_EINVAL). */
    td_err (*sample_rows)(const ops_backend *be, int32_t *tok, float *q, const float *logits,
                          int64_t n, int64_t n_vocab, const ops_sampler *s, uint64_t ctr,
                          uint64_t ctr_step);
    /* Sampled acceptance of a verified block (cpu_accept_sampled, cuda_accept_sampled):
     * result [2] = {accepted drafts a, next token} from logits [n][n_vocab], the drafts'
     * distributions q [n-1][n_vocab] and draft [n-1] (q, draft NULL when n == 1), with p
     * [n][n_vocab] as scratch; s and rng are host structs, every pointer backend memory.
     * Only result needs to come to the host; on the GPU next = -1 says a row the walk
     * reached had no finite logit (the CPU returns TD_EINVAL). */
    td_err (*accept_sampled)(const ops_backend *be, int32_t *result, float *p,
                             const float *logits, const float *q, const int32_t *draft,
                             int64_t n, int64_t n_vocab, const ops_sampler *s,
                             const ops_accept_rng *rng);
    /* Sparse additions to rows of logits [n][n_vocab] (cpu_logit_add, cuda_logit_add): off
     * [n + 1] and add [off[n]], every pointer backend memory. */
    td_err (*logit_add)(const ops_backend *be, float *logits, int64_t n, int64_t n_vocab,
                        const int32_t *off, const ops_logit_add *add);
    /* Token masks on rows of logits [n][n_vocab] (cpu_logit_mask, cuda_logit_mask): allow
     * [n][OPS_MASK_WORDS(n_vocab)], every pointer backend memory. */
    td_err (*logit_mask)(const ops_backend *be, float *logits, int64_t n, int64_t n_vocab,
                         const uint32_t *allow);
    /* Log probabilities of tok [n] under the rows of logits [n][n_vocab] with the n_top most
     * likely tokens of each row (cpu_logprob_rows, cuda_logprob_rows): out [n]; every
     * pointer backend memory. Only out needs to come to the host. */
    td_err (*logprob_rows)(const ops_backend *be, ops_logprob *out, const float *logits,
                           const int32_t *tok, int64_t n, int64_t n_vocab, int n_top);

    /* Recording a sequence of calls once and replaying it (CUDA graphs); NULL where the
     * backend has none (the CPU, a profiler). Between graph_begin and graph_end the calls
     * only record (nothing runs) and must not read host memory or wait; graph_end gives the
     * recording (*graph) or an error after which nothing is being recorded. A replay runs
     * the recorded calls with the arguments they had, reading memory as it is then. */
    td_err (*graph_begin)(const ops_backend *be);
    td_err (*graph_end)(const ops_backend *be, void **graph);
    td_err (*graph_launch)(const ops_backend *be, void *graph);
    void (*graph_free)(const ops_backend *be, void *graph);
};

/* The CPU backend (host memory; the ops are the cpu_* reference). Never fails. */
const ops_backend *ops_backend_cpu(void);

/* A CUDA backend on device ordinal dev with its own stream. TD_ENOTSUP without CUDA in the
 * build or without a usable device (the message says which). With TANDEM_PROFILE set in the
 * environment the table is a profiler over it (kernels/backend_prof.h). */
td_err ops_backend_cuda_init(ops_backend **out, int dev);
void ops_backend_cuda_free(ops_backend *be);

/* Where be runs, for logs: "cpu", or "cuda:N (sm_XX code)" naming the arch of the device
 * code that runs there (an sm_86 build runs sm_86 code on a Hopper too). */
void ops_backend_describe(const ops_backend *be, char *out, size_t cap);

#ifdef TANDEM_HAVE_CUDA
/* The plain CUDA table (kernels/cuda/backend_cuda.cu), what ops_backend_cuda_init wraps. */
td_err cuda_backend_init(ops_backend **out, int dev);
void cuda_backend_free(const ops_backend *be);
#endif

/* Allocates and uploads: *p = a backend copy of src[bytes]. */
td_err ops_backend_upload(const ops_backend *be, void **p, const void *src, size_t bytes);

#endif
