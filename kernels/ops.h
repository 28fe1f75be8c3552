/* The compute ops, one header for both backends.
 *
 * CPU implementations are cpu_<op> (kernels/cpu/<idea>.c); they are the numerical oracle.
 * The CUDA twins are cuda_<op> with the same arguments followed by a stream (kernels/cuda/).
 * Activations are f32. Pointers are plain host (or device) memory; every parameter says its
 * shape as [outer]...[inner] in elements. A "stride" is the distance in ELEMENTS between
 * consecutive rows/tokens/heads, so a view into an interleaved tensor needs no copy (e.g.
 * qwen35's attn_q output is per head 256 query values then 256 gate values: q = out,
 * gate = out + 256, head stride 512, token stride n_head * 512).
 *
 * Errors: weights and token ids come from files and clients, so the calls that take them
 * return td_err; shapes that disagree inside the engine are programmer errors (TD_ASSERT). */
#ifndef TANDEM_KERNELS_OPS_H
#define TANDEM_KERNELS_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/err.h"

/* The CUDA twins take this stream last (cudaStream_t is a struct CUstream_st *). */
typedef struct CUstream_st *ops_stream;

/* ---------------------------------------------------------------------------------------
 * Weights and element types
 * ------------------------------------------------------------------------------------- */

/* A weight matrix as GGUF stores it: rows of cols elements (GGUF ne[0] = cols, ne[1] = rows).
 * y = x . W^T maps cols inputs to rows outputs. */
typedef struct ops_weight {
    td_dtype type;     /* one of the types ops_type_supported() accepts */
    int64_t rows;      /* output features (GGUF ne[1]) */
    int64_t cols;      /* input features (GGUF ne[0]); a multiple of the type's block size */
    size_t row_bytes;  /* bytes of one row: cols / block * block bytes */
    const void *data;  /* [rows][row_bytes], rows packed back to back */
    bool x_bf16;       /* the product reads x rounded to bf16 (nearest even) instead of x:
                        * y = bf16(x) . W^T. Faster on a GPU (F16/BF16 weights meet one
                        * tensor-core piece of each input instead of three; Q6_K at 1-16
                        * tokens has a kernel of its own) where the result only steers a
                        * guess: the drafter's products (dfl_set_x_bf16). false from
                        * ops_weight_init. */
} ops_weight;

/* True for the types the ops read and write: F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K. */
bool ops_type_supported(td_dtype type);

/* Fills *w for a [rows][cols] matrix of type at data. TD_ENOTSUP for a type the ops do not
 * handle, TD_EINVAL when cols is not a multiple of the block size or a size is <= 0 or
 * overflows. */
td_err ops_weight_init(ops_weight *w, td_dtype type, int64_t rows, int64_t cols,
                       const void *data);

/* IEEE binary16 and bfloat16 <-> f32. To-half rounds to nearest even; NaN stays NaN (its
 * payload may come back quieted). */
float ops_f16_to_f32(uint16_t h);
uint16_t ops_f32_to_f16(float f);
float ops_bf16_to_f32(uint16_t h);
uint16_t ops_f32_to_bf16(float f);

/* out[n] = x[n] rounded to binary16 (ops_f32_to_f16 each; kernels/cpu/convert.c): how an
 * f16 KV cache is written. */
void cpu_to_f16(uint16_t *out, const float *x, int64_t n);

/* out[n] = x[n] as bfloat16 (ops_f32_to_bf16 each), and back (exact): how a GPU's feature
 * ring stores the target's tap features, which the drafter reads rounded to bf16 anyway. */
void cpu_to_bf16(uint16_t *out, const float *x, int64_t n);
void cpu_from_bf16(float *out, const uint16_t *x, int64_t n);

/* Appends a block's keys and values to an attention cache: token t's rows k[t], v[t] (row
 * elements each, f32) go to rows rows[t] of k_cache and v_cache (elements of type: TD_F32
 * copies, TD_F16 rounds as cpu_to_f16). rows [n_tok] is memory of the caller's backend, so
 * the positions can change without the call changing (a replayed CUDA graph). */
void cpu_kv_store(void *k_cache, void *v_cache, td_dtype type, const float *k, const float *v,
                  const int32_t *rows, int64_t n_tok, int64_t row);

/* Bytes of one element of a K/V cache of type t (TD_F32 or TD_F16). */
static inline size_t ops_kv_elem_bytes(td_dtype t)
{
    return t == TD_F16 ? 2 : 4;
}

/* cpu_kv_store's arguments but the keys: where qk_norm_rope stores the keys it finishes and
 * the values beside them (row = n_head_kv * head_dim). */
typedef struct ops_kv_dst {
    void *k_cache, *v_cache;
    td_dtype type;
    const float *v;       /* [n_tok][row] */
    const int32_t *rows;  /* [n_tok] cache rows, memory of the caller's backend */
    int64_t row;
    /* NULL, or where the q heads go as another layer's keys (a call whose q side is a second
     * layer's k rows: n_head == n_head_kv, q_head == head_dim): the same store of the
     * finished q heads and qv [n_tok][row] into these caches, at the same rows */
    void *qk_cache, *qv_cache;
    const float *qv;
} ops_kv_dst;

/* ---------------------------------------------------------------------------------------
 * Quantisation (kernels/cpu/quant.c: the one place that knows each block layout)
 * ------------------------------------------------------------------------------------- */

/* dst[n] = the n elements of type stored at src (n / block blocks). TD_ENOTSUP for an
 * unsupported type, TD_EINVAL when n is not a multiple of the block size. */
td_err cpu_dequantize_row(td_dtype type, const void *src, float *dst, int64_t n);

/* Writes src[n] as type at dst (dtype_bytes(type, n) bytes). A plain round-to-nearest
 * quantiser (for building test and benchmark models, not a tuned one). Errors as above. */
td_err cpu_quantize_row(td_dtype type, const float *src, void *dst, int64_t n);

/* out[n][w->cols] = rows ids[i] of w dequantised (token embedding lookup).
 * TD_ERANGE when an id is outside [0, w->rows). */
td_err cpu_get_rows(float *out, const ops_weight *w, const int32_t *ids, int64_t n);

/* ---------------------------------------------------------------------------------------
 * Matrix multiply (kernels/cpu/matmul.c)
 * ------------------------------------------------------------------------------------- */

/* y[n_tok][w->rows] = x[n_tok][w->cols] . W^T, any n_tok >= 1 (each weight row is read once
 * per 64 tokens). Products accumulate in f32 per 256-wide tile and f64 across tiles.
 * y must not overlap x. */
void cpu_matmul(float *y, const float *x, const ops_weight *w, int64_t n_tok);

#define OPS_MM_GROUP_MAX 16 /* members of one matmul_multi group (the model's are 2-4) */

/* One product of a group of matrices that read the same input (cuda_matmul_multi and the
 * backend's matmul_multi): y[n_tok][w->rows] = x[n_tok][w->cols] . W^T. */
typedef struct ops_mm_out {
    float *y;            /* [n_tok][w->rows]; overlaps neither x nor another y of the group */
    const ops_weight *w; /* [rows][cols]; cols is the same for every member of a group */
} ops_mm_out;

#ifdef TANDEM_HAVE_CUDA
/* CUDA twins of the matrix multiply and the row dequantisers (kernels/cuda/matmul*.cu,
 * layout and reduction order in kernels/cuda/NOTES.md). Every pointer is a device pointer
 * (w is a host struct whose data is on the device, in the GGUF/CPU byte layout); the calls
 * only enqueue work on st.
 *
 * cuda_matmul: y[n_tok][w->rows] = x[n_tok][w->cols] . W^T, any n_tok >= 1. Batch
 * invariant: token t's outputs are bit-identical whatever n_tok and the other tokens are.
 * F32/F16/BF16 weights meet the f32 activations directly; for the quantised types each
 * token's activations are first rounded to 16-bit integers per 256 inputs (2^-16 of the
 * largest), the integer dot products are exact, and scales are applied in f32 in a fixed
 * order. TD_ENOTSUP for a type ops_type_supported() refuses; TD_EINVAL when a quantised
 * weight's data is not 16-byte aligned; TD_ENOMEM / TD_ECUDA when scratch memory or a launch
 * fails. Scratch for the rounded activations is kept per (device, stream) and grown on first
 * use, so warm a stream up before capturing it in a CUDA graph. */
td_err cuda_matmul(float *y, const float *x, const ops_weight *w, int64_t n_tok,
                   ops_stream st);

/* cpu_swiglu_matmul: a quantised weight's activation rounding computes gate = silu(gate) * up
 * as cuda_swiglu does (and stores it), one launch less; other weights run cuda_swiglu, then
 * cuda_matmul. y bit for bit what that pair gives. */
td_err cuda_swiglu_matmul(float *y, float *gate, const float *up, const ops_weight *w,
                          int64_t n_tok, ops_stream st);

/* cuda_matmul_multi: mm[i].y = x . mm[i].w^T for i < n (1 <= n <= OPS_MM_GROUP_MAX), all
 * reading x[n_tok][cols]. Each y is bit for bit what cuda_matmul gives; the quantised members
 * share one activation rounding per layout their kernels read (one per group when they share
 * the interleave and the kernel kind), so the group costs fewer launches than n cuda_matmul
 * calls. Errors as cuda_matmul; a type or alignment error is found before anything is
 * enqueued. */
td_err cuda_matmul_multi(const float *x, const ops_mm_out *mm, int n, int64_t n_tok,
                         ops_stream st);

/* out[n][w->cols] = rows ids[i] of w dequantised, bit-identical to cpu_get_rows. ids [n] are
 * on the device, so a bad id cannot be reported without waiting for the GPU: validate ids on
 * the host; an id outside [0, w->rows) gives a row of NaN. */
td_err cuda_get_rows(float *out, const ops_weight *w, const int32_t *ids, int64_t n,
                     ops_stream st);

/* dst[n] = the n elements of type at src, bit-identical to cpu_dequantize_row. Errors as
 * cpu_dequantize_row, plus TD_ECUDA for a failed launch. */
td_err cuda_dequantize_row(td_dtype type, const void *src, float *dst, int64_t n,
                           ops_stream st);
#endif

/* ---------------------------------------------------------------------------------------
 * Norms and elementwise (kernels/cpu/norm.c, kernels/cpu/act.c)
 * ------------------------------------------------------------------------------------- */

/* Row r of x is x[r * stride .. r * stride + dim); out has the same layout and may be x.
 * out = x / sqrt(mean(x^2) + eps) * w; w [dim] or NULL for no weight. */
void cpu_rmsnorm(float *out, const float *x, const float *w, int64_t n_rows, int64_t dim,
                 int64_t stride, float eps);

/* Same row layout; out = x / sqrt(sum(x^2) + eps). */
void cpu_l2norm(float *out, const float *x, int64_t n_rows, int64_t dim, int64_t stride,
                float eps);

/* Elementwise over n values; out may alias any input. */
void cpu_add(float *out, const float *a, const float *b, int64_t n);   /* a + b */
void cpu_mul(float *out, const float *a, const float *b, int64_t n);   /* a * b */
void cpu_scale(float *out, const float *x, float s, int64_t n);        /* x * s */
void cpu_silu(float *out, const float *x, int64_t n);                  /* x * sigmoid(x) */
void cpu_sigmoid(float *out, const float *x, int64_t n);               /* 1 / (1 + e^-x) */
void cpu_softplus(float *out, const float *x, int64_t n);              /* log(1 + e^x) */
/* Logit softcapping: out = cap * tanh(x / cap), cap > 0. */
void cpu_softcap(float *out, const float *x, float cap, int64_t n);
/* out = silu(gate) * up, all [n]. */
void cpu_swiglu(float *out, const float *gate, const float *up, int64_t n);

/* Row-wise softmax: out[n_rows][n] from x[n_rows][n] (contiguous); out may be x. */
void cpu_softmax(float *out, const float *x, int64_t n_rows, int64_t n);

/* Index of the largest of x[n] (the lowest index on ties; NaN never wins). n >= 1. */
int64_t cpu_argmax(const float *x, int64_t n);

/* The k largest of x[n], largest first (lower index first on ties): idx[k], val[k] (val may
 * be NULL). 1 <= k <= n. */
void cpu_topk(int32_t *idx, float *val, const float *x, int64_t n, int64_t k);

/* ---------------------------------------------------------------------------------------
 * RoPE (kernels/cpu/rope.c)
 * ------------------------------------------------------------------------------------- */

/* NeoX RoPE in place, partial rotary: in each head, dims j and j + n_rot/2 (j < n_rot/2) are
 * rotated by angle pos * theta^(-2j / n_rot); dims n_rot.. pass through.
 * x: head h of token t starts at x + t * tok_stride + h * head_stride.
 * pos [n_tok]: absolute positions. n_rot is even and >= 2. */
void cpu_rope_neox(float *x, int64_t n_tok, int64_t n_head, int64_t tok_stride,
                   int64_t head_stride, int64_t n_rot, const int32_t *pos, float theta);

/* ---------------------------------------------------------------------------------------
 * Attention (kernels/cpu/attention.c)
 * ------------------------------------------------------------------------------------- */

typedef enum ops_mask_kind {
    OPS_MASK_CAUSAL,        /* key position <= query position */
    OPS_MASK_BIDIRECTIONAL, /* every key */
    OPS_MASK_TREE,          /* causal for the keys before the last n_tree; the last n_tree keys
                             * only where the query's ancestor bit is set */
} ops_mask_kind;

typedef struct ops_attn {
    int64_t n_q;        /* query tokens */
    int64_t n_head;     /* query heads */
    int64_t n_head_kv;  /* key/value heads; n_head is a multiple; query head h reads kv head
                         * h / (n_head / n_head_kv) */
    int64_t head_dim;   /* values per head, same for q, k, v */
    float scale;        /* logit scale, usually 1/sqrt(head_dim) */

    const float *q;       /* query head h of token t at q + t*q_tok_stride + h*q_head_stride */
    int64_t q_tok_stride;  /* elements */
    int64_t q_head_stride; /* elements */
    const int32_t *q_pos;  /* [n_q] absolute position of each query */

    /* Key cache: key i, kv head g at k + i*kv_tok_stride + g*kv_head_stride (elements of
     * kv_type); the value cache v has the same layout. */
    td_dtype kv_type;       /* TD_F32 or TD_F16 */
    const void *k;
    const void *v;
    int64_t kv_tok_stride;  /* elements between consecutive keys (n_head_kv*head_dim if dense) */
    int64_t kv_head_stride; /* elements between kv heads of one key (head_dim if dense) */
    const int32_t *k_pos;   /* [n_kv] absolute position of each key */
    int64_t n_kv;           /* keys */
    const int32_t *n_kv_dev; /* NULL, or (memory of the call's backend) the keys to use,
                              * at most n_kv, which then only sizes the launch: a recorded
                              * call follows the cache as it grows. Not with OPS_MASK_TREE */

    ops_mask_kind mask;
    int32_t window;         /* sliding window in positions, 0 = none: a key is visible only
                             * when q_pos - k_pos < window (causal, tree) or
                             * |q_pos - k_pos| < window (bidirectional) */
    /* OPS_MASK_TREE: query t sees tree key j (key index n_kv - n_tree + j) iff bit j%64 of
     * tree_bits[t * tree_words + j/64] is set; tree_words = (n_tree + 63) / 64. */
    int64_t n_tree;
    const uint64_t *tree_bits; /* [n_q][tree_words] */

    /* Optional output gate: out *= sigmoid(gate); gate head h of token t at
     * gate + t*gate_tok_stride + h*gate_head_stride, [head_dim]. NULL = no gate. */
    const float *gate;
    int64_t gate_tok_stride;  /* elements */
    int64_t gate_head_stride; /* elements */

    float *out;             /* [n_q][n_head][head_dim], contiguous */
} ops_attn;

/* softmax(scale * q . k^T + mask) . v per query head. A query that sees no key gets zeros. */
void cpu_attention(const ops_attn *a);

/* ---------------------------------------------------------------------------------------
 * Recurrent pieces of Gated DeltaNet (kernels/cpu/conv.c, kernels/cpu/delta.c)
 * ------------------------------------------------------------------------------------- */

/* Causal depthwise conv1d with carried state, no bias, no activation (SiLU is separate):
 * out[t][c] = sum_i w[c*k + i] * x[t - k + 1 + i][c], where inputs before t = 0 come from
 * state (oldest first). x: token t at x + t*x_stride, [n_ch]; out [n_tok][n_ch] contiguous
 * (must not overlap x or state). w [n_ch][k]. state [k-1][n_ch]: the k-1 previous raw inputs,
 * oldest first; updated in place to the state after the last token. state_all: NULL, or
 * [n_tok][k-1][n_ch] receiving the state after every token (for rollback). */
void cpu_conv1d_causal(float *out, float *state, float *state_all, const float *x,
                       int64_t x_stride, const float *w, int64_t n_tok, int64_t n_ch,
                       int64_t k);

typedef struct ops_delta {
    int64_t n_tok;
    int64_t n_k_head;   /* query/key heads */
    int64_t n_v_head;   /* value heads, a multiple of n_k_head; value head h uses key head
                         * h % n_k_head (GGUF order) */
    int64_t d_k;        /* query/key values per head */
    int64_t d_v;        /* value values per head */

    const float *q;     /* token t, key head g at q + t*q_tok_stride + g*d_k, [d_k] */
    const float *k;     /* token t, key head g at k + t*k_tok_stride + g*d_k, [d_k] */
    const float *v;     /* token t, value head h at v + t*v_tok_stride + h*d_v, [d_v] */
    int64_t q_tok_stride, k_tok_stride, v_tok_stride; /* elements */
    const float *g;     /* token t at g + t*gb_tok_stride, [n_v_head] log decay (<= 0):
                         * S = exp(g) S */
    const float *beta;  /* token t at beta + t*gb_tok_stride, [n_v_head] write strength in
                         * [0,1] */
    int64_t gb_tok_stride; /* elements between tokens of g and of beta; 0 = n_v_head (dense
                            * [n_tok][n_v_head] arrays). cpu_delta_prep's [n_tok][2][n_v_head]
                            * output is g = gb, beta = gb + n_v_head, stride 2*n_v_head */

    float *state;       /* [n_v_head][d_k][d_v], updated in place */
    const float *state_in; /* NULL, or [n_v_head][d_k][d_v] to start from instead of state
                            * (state is then only written: a rollback without a copy) */
    float *state_prev;  /* NULL, or [n_v_head][d_k][d_v] receiving the state before the first
                         * token (a rollback point, without a separate copy) */
    float *state_all;   /* NULL, or [n_tok][n_v_head][d_k][d_v]: state after every token */
    float *out;         /* [n_tok][n_v_head][d_v], contiguous; NULL: not written (a replay
                         * that only wants the state) */

    /* Optional gated RMSNorm of the output (Gated DeltaNet's y), one launch with the
     * recurrence on the GPU: with norm_z set, out ends as cpu_rmsnorm_silu(out, out, norm_w,
     * norm_z, n_tok * n_v_head, d_v, norm_eps) makes it; out must then be set. */
    const float *norm_w; /* [d_v] or NULL (no weight) */
    const float *norm_z; /* [n_tok][n_v_head][d_v] contiguous, the gate's input; NULL: no norm */
    float norm_eps;

    /* Chunked form (prefill): chunk > 0 runs the same recurrence a chunk of positions at a
     * time as matrix products (the state only at chunk ends; the outputs from the state at the
     * chunk's start and the chunk's own tokens, through a triangular solve), up to
     * OPS_DELTA_CHUNK_MAX positions per chunk. The sums differ from the token-by-token form's
     * in order (close, not the same bits). Chunks end where the absolute position is a
     * multiple of chunk: token t is at position *pos0 + t (pos0: backend memory, so a
     * recorded pass reads it at replay; NULL = 0), so a run cut anywhere at chunk ends gives
     * the bits of the run whole. Needs state_all NULL (no per-token states), d_k <=
     * OPS_DELTA_CHUNK_DK and d_v <= OPS_DELTA_CHUNK_DV. */
    int64_t chunk;
    const int32_t *pos0;

    /* The caller's word that the work enqueued right before this call writes none of state,
     * state_in and norm_z (a forward pass: the DeltaNet inputs before it write q, k, v, g and
     * beta): the GPU's one-token kernel with the norm then reads them while that work still
     * runs. The CPU ignores it. */
    bool settled;
} ops_delta;

#define OPS_DELTA_CHUNK_MAX 64  /* positions per chunk of the chunked form */
#define OPS_DELTA_CHUNK_DK 128  /* largest d_k of the chunked form */
#define OPS_DELTA_CHUNK_DV 256  /* largest d_v of the chunked form */

/* Gated delta rule, per token and value head h with S = state[h]:
 * S = exp(g) S; kv = S^T k; S += k (x) (beta (v - kv)); o = S^T q. q, k are used as given
 * (normalise and scale them first). Then the gated norm when d->norm_z is set. With
 * d->chunk, the chunked form of the same (ops_delta.chunk). */
void cpu_delta_rule(const ops_delta *d);
/* d[0..n-1], recurrences that share no memory (a rollback's replay of every layer): each as
 * cpu_delta_rule. */
void cpu_delta_rule_many(const ops_delta *d, int64_t n);

/* ---------------------------------------------------------------------------------------
 * Fused chains (kernels/cpu/fused.c): one pass (one GPU launch) for what a layer did as
 * several ops. Each gives bit for bit what its chain of cpu_* ops gives, so fusing changes
 * no CPU result.
 * ------------------------------------------------------------------------------------- */

/* Residual add then the next RMSNorm, rows of dim contiguous: x += h; out = rmsnorm(x) * w
 * (cpu_add then cpu_rmsnorm with stride dim; w may be NULL). out may be h, never x. */
void cpu_add_rmsnorm(float *x, const float *h, float *out, const float *w, int64_t n_rows,
                     int64_t dim, float eps);

/* Gated RMSNorm of Gated DeltaNet's output: out = rmsnorm(x) * w * silu(z), rows of dim
 * contiguous (cpu_rmsnorm, cpu_silu of z, cpu_mul). out may be x; z is only read. */
void cpu_rmsnorm_silu(float *out, const float *x, const float *w, const float *z,
                      int64_t n_rows, int64_t dim, float eps);

/* Gated DeltaNet's short convolution and its activation: cpu_conv1d_causal, then
 * cpu_silu(out, out, n_tok * n_ch). */
void cpu_conv1d_silu(float *out, float *state, float *state_all, const float *x,
                     int64_t x_stride, const float *w, int64_t n_tok, int64_t n_ch, int64_t k);

/* Attention's per-head norms and rotary embedding of q and k: cpu_rmsnorm(q, q, q_norm,
 * n_tok * n_head, head_dim, q_head, eps) and cpu_rmsnorm(k, k, k_norm, n_tok * n_head_kv,
 * head_dim, head_dim, eps), then cpu_rope_neox(q, n_tok, n_head, n_head * q_head, q_head,
 * n_rot, pos, theta) and cpu_rope_neox(k, n_tok, n_head_kv, n_head_kv * head_dim, head_dim,
 * ...): q's token t, head h at q + (t * n_head + h) * q_head, k's at k + (t * n_head_kv + h)
 * * head_dim. n_head 0 (q NULL): k only. */
void cpu_qk_norm_rope(float *q, float *k, const float *q_norm, const float *k_norm,
                      int64_t n_tok, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                      int64_t q_head, int64_t n_rot, const int32_t *pos, float theta, float eps);

/* The FFN's activation and down projection: gate = silu(gate) * up in place, both
 * [n_tok][w->cols] (cpu_swiglu), then y[n_tok][w->rows] = gate . W^T (cpu_matmul). y shares
 * no memory with gate or up. */
void cpu_swiglu_matmul(float *y, float *gate, const float *up, const ops_weight *w,
                       int64_t n_tok);

/* Gated DeltaNet's recurrence inputs for n_tok tokens at once (DESIGN section 5):
 * gb [n_tok][2][n_v_head]: g = softplus(alpha + dt_bias) * ssm_a, then beta' = sigmoid(beta);
 * alpha, beta [n_tok][n_v_head] (the ssm_alpha, ssm_beta projections); dt_bias, ssm_a
 * [n_v_head]. In qkv (token t at qkv + t*qkv_stride: q [n_k_head][d_k], then k, then v) q
 * and k are L2-normalised per head (eps) in place and q is scaled by 1/sqrt(d_k).
 * The chain it replaces: sigmoid; per token add, softplus, mul, l2norm, scale. */
void cpu_delta_prep(float *gb, float *qkv, const float *alpha, const float *beta,
                    const float *dt_bias, const float *ssm_a, int64_t n_tok, int64_t n_v_head,
                    int64_t n_k_head, int64_t d_k, int64_t qkv_stride, float eps);

/* Gated DeltaNet's recurrence inputs from its projections, in one pass (one launch on the
 * GPU): alpha = h . w_alpha^T and beta = h . w_beta^T (cpu_matmul, F32 weights), qkv =
 * conv1d_silu(raw) with the carried window (cpu_conv1d_silu, no state_all), then
 * cpu_delta_prep(gb, qkv, alpha, beta, dt_bias, ssm_a, n_tok, n_v_head, n_k_head, d_k, n_ch,
 * eps). */
typedef struct ops_dn_in {
    int64_t n_tok;
    const float *h;             /* [n_tok][w_alpha->cols] the layer's normed input */
    const ops_weight *w_alpha;  /* [n_v_head][cols] (ssm_alpha), any weight type */
    const ops_weight *w_beta;   /* [n_v_head][cols] (ssm_beta), as w_alpha */
    float *alpha, *beta;        /* [n_tok][n_v_head] each: the projections (the CPU's scratch;
                                 * the GPU may leave them unwritten) */
    const float *raw;           /* token t at raw + t*raw_stride, [n_ch]: the conv input */
    int64_t raw_stride;         /* elements */
    const float *conv_w;        /* [n_ch][conv_k] */
    float *conv_state;          /* [conv_k - 1][n_ch], advanced by n_tok */
    float *conv_prev;           /* NULL, or [conv_k - 1][n_ch] receiving conv_state as it was
                                 * before the first token (a rollback point, no separate copy) */
    int64_t n_ch, conv_k;       /* channels (q, k, v of every head), taps */
    float *qkv;                 /* [n_tok][n_ch] out: q and k normed (q scaled), v */
    float *gb;                  /* [n_tok][2][n_v_head] out: g, then beta (cpu_delta_prep) */
    const float *dt_bias;       /* [n_v_head] */
    const float *ssm_a;         /* [n_v_head] */
    int64_t n_v_head, n_k_head, d_k; /* heads; values per q/k head (q, k: channels 0..2*n_k_head*d_k) */
    float eps;
} ops_dn_in;

void cpu_deltanet_in(const ops_dn_in *p);

/* ---------------------------------------------------------------------------------------
 * Sampling (kernels/cpu/sample.c)
 * ------------------------------------------------------------------------------------- */

typedef struct ops_sampler {
    float temperature; /* 0 = greedy (argmax); else logits / temperature */
    int32_t top_k;     /* keep the top_k most likely tokens; <= 0 = off */
    float top_p;       /* keep the smallest most-likely set with mass >= top_p; >= 1 = off */
    float min_p;       /* keep tokens with p >= min_p * max p; <= 0 = off */
    uint64_t seed;     /* RNG key: same seed and step -> same draw */
} ops_sampler;

/* The filtered, renormalised distribution p[n_vocab] that a draw uses, zero outside the kept
 * set. Order: softmax(logits / temperature), then top_k, top_p (on the top-k renormalised
 * mass), min_p (relative to the max), renormalise. temperature 0 gives one-hot(argmax).
 * At least the most likely token is always kept. TD_EINVAL for a negative, NaN or infinite
 * temperature, a negative or NaN top_p or min_p, or logits with no finite value; TD_ENOMEM
 * when scratch space cannot be had. */
td_err cpu_sample_probs(float *p, const float *logits, int64_t n_vocab, const ops_sampler *s);

/* The Philox4x32-10 block function (Salmon et al. 2011, as in Random123 and cuRAND). */
void ops_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* A uniform double in [0, 1) from (seed, counter): Philox4x32-10 with key = seed (low word
 * first) and counter = {counter low, counter high, 0, 0}; the top 53 bits of out[0]:out[1].
 * The CUDA side draws the same numbers. */
double ops_rand_uniform(uint64_t seed, uint64_t counter);

/* A token drawn from p[n_vocab] (need not be normalised, but must have a positive entry;
 * zeros are never drawn) with u = ops_rand_uniform(seed, step): the first index whose running
 * sum exceeds u * sum(p). */
int32_t cpu_sample_draw(const float *p, int64_t n_vocab, uint64_t seed, uint64_t step);

/* Draws one token from each of n rows of logits [n][n_vocab] (a drafter's block): in row
 * order, q [i] = cpu_sample_probs(row i) and tok [i] = cpu_sample_draw(q [i], s->seed,
 * ctr + i * ctr_step). Errors as cpu_sample_probs (the rows before a failing one are done). */
td_err cpu_sample_rows(int32_t *tok, float *q, const float *logits, int64_t n, int64_t n_vocab,
                       const ops_sampler *s, uint64_t ctr, uint64_t ctr_step);

/* One sparse change to a row of logits (a logit bias, penalties). */
typedef struct ops_logit_add {
    int32_t tok;  /* 0 <= tok < n_vocab */
    float rep;    /* a repetition penalty: a positive logit is divided by it, a negative one
                   * multiplied (1: none) */
    float delta;  /* then added to the token's logit */
} ops_logit_add;

/* Rows of logits [n][n_vocab] get sparse changes: row i's logit l of add[j].tok becomes
 * (rep == 1 ? l : l > 0 ? l / rep : l * rep) + delta for j in off[i] .. off[i+1] - 1 (off
 * [n + 1], off[0] = 0; a token at most once per row). f32 operations, one entry per logit, so
 * the result does not depend on the order. */
void cpu_logit_add(float *logits, int64_t n, int64_t n_vocab, const int32_t *off,
                   const ops_logit_add *add);

/* 32-bit words of one row of a token mask: bit t % 32 of word t / 32 is token t. */
#define OPS_MASK_WORDS(n_vocab) (((n_vocab) + 31) / 32)

/* Rows of logits [n][n_vocab] keep the tokens their row of allow [n][OPS_MASK_WORDS(n_vocab)]
 * has set; every other logit becomes -inf (structured output: tokens that would break the
 * document). Bits past n_vocab are ignored. */
void cpu_logit_mask(float *logits, int64_t n, int64_t n_vocab, const uint32_t *allow);

#define OPS_TOP_LOGPROBS_MAX 20 /* most likely alternatives an ops_logprob holds */

/* A token's log probability under a row of logits, and the row's most likely tokens. */
typedef struct ops_logprob {
    float logprob;                           /* <= 0 */
    int32_t rank;                            /* tokens of the row whose logit is >= the
                                              * token's, itself included (1: the most likely;
                                              * vLLM's rank), or 0: a token outside the
                                              * vocabulary, or a NaN logit */
    int32_t n_top;
    int32_t top_id[OPS_TOP_LOGPROBS_MAX];    /* [n_top] best first (cpu_topk's order) */
    float top_logprob[OPS_TOP_LOGPROBS_MAX]; /* [n_top] */
} ops_logprob;

/* For each of n rows of logits [n][n_vocab]: out[i].logprob = logits[i][tok[i]] - lse(row i)
 * with lse = max + log(sum of exp(l - max)) summed in f64, its rank, and the min(n_top,
 * n_vocab) best tokens of the row (cpu_topk) with theirs; every value is capped at 0
 * (rounding must not give a positive log probability). A token outside the vocabulary gets
 * -inf and rank 0.
 * 0 <= n_top <= OPS_TOP_LOGPROBS_MAX. */
void cpu_logprob_rows(ops_logprob *out, const float *logits, const int32_t *tok, int64_t n,
                      int64_t n_vocab, int n_top);

/* The counters of a block's acceptance draws (ops_rand_uniform with the sampler's seed): the
 * test of draft i (1 <= i < n) uses accept + i * step; the draw after rejecting draft i, or
 * the bonus draw after all n - 1 drafts were accepted (i = n), uses target + i * step. */
typedef struct ops_accept_rng {
    uint64_t accept; /* test counter at index 0 (the block's first token, never tested) */
    uint64_t target; /* draw counter at index 0 */
    uint64_t step;   /* counter distance between two positions */
} ops_accept_rng;

/* Lossless speculative sampling of a verified block [b, d1..d(n-1)]: logits [n][n_vocab] are
 * the target's rows 0..n-1, q [n-1][n_vocab] the distributions draft [n-1] was drawn from (q
 * and draft may be NULL when n == 1). For i = 1..n-1 in order: p = cpu_sample_probs(row
 * i-1) into p [n][n_vocab] row i-1; d_i is accepted when q(d_i) > 0 and u * q(d_i) < p(d_i)
 * (f64, u the test number of i); on the first rejection next is drawn from max(p - q, 0)
 * (from p when that is all zero) and a = i - 1; with every draft accepted next is drawn from
 * row n-1's p and a = n - 1. result [2] = {a, next}. A draft outside the vocabulary is
 * rejected. The rows of p past the last one used are left as they were. Errors as
 * cpu_sample_probs (for the rows it reaches). */
td_err cpu_accept_sampled(int32_t *result, float *p, const float *logits, const float *q,
                          const int32_t *draft, int64_t n, int64_t n_vocab, const ops_sampler *s,
                          const ops_accept_rng *rng);


/* ---------------------------------------------------------------------------------------
 * CUDA twins (kernels/cuda/<idea>.cu; kernels/cuda/NOTES.md says how each is laid out)
 *
 * Same arguments as the CPU op, every pointer a device pointer (structs such as ops_attn
 * are host structs holding device pointers), then the stream. They only enqueue work: the
 * td_err reports an unsupported shape (TD_ENOTSUP), a scratch allocation (TD_ENOMEM) or a
 * launch that failed (TD_ECUDA); a fault inside a kernel shows at the next synchronising
 * call (cuda_mem_download, cuda_stream_sync). Shape mistakes are TD_ASSERTs as on the CPU.
 * Every twin is deterministic (no floating-point atomics, fixed reduction orders) and
 * batch invariant: a row, token or query gets bit-identical results whatever else is in the
 * same call, so greedy speculative decoding on the GPU equals plain decoding.
 * ------------------------------------------------------------------------------------- */
#ifdef TANDEM_HAVE_CUDA

td_err cuda_rmsnorm(float *out, const float *x, const float *w, int64_t n_rows, int64_t dim,
                    int64_t stride, float eps, ops_stream st);
td_err cuda_l2norm(float *out, const float *x, int64_t n_rows, int64_t dim, int64_t stride,
                   float eps, ops_stream st);

td_err cuda_add(float *out, const float *a, const float *b, int64_t n, ops_stream st);
td_err cuda_mul(float *out, const float *a, const float *b, int64_t n, ops_stream st);
td_err cuda_scale(float *out, const float *x, float s, int64_t n, ops_stream st);
td_err cuda_silu(float *out, const float *x, int64_t n, ops_stream st);
td_err cuda_sigmoid(float *out, const float *x, int64_t n, ops_stream st);
td_err cuda_softplus(float *out, const float *x, int64_t n, ops_stream st);
td_err cuda_softcap(float *out, const float *x, float cap, int64_t n, ops_stream st);
td_err cuda_swiglu(float *out, const float *gate, const float *up, int64_t n, ops_stream st);
td_err cuda_softmax(float *out, const float *x, int64_t n_rows, int64_t n, ops_stream st);

/* Per row of x[n_rows][n]: idx[n_rows] (device) = cpu_argmax of the row. */
td_err cuda_argmax(int32_t *idx, const float *x, int64_t n_rows, int64_t n, ops_stream st);
/* Per row of x[n_rows][n]: idx[n_rows][k], val[n_rows][k] (val may be NULL) = cpu_topk of
 * the row. 1 <= k <= min(n, 1024); TD_ENOTSUP for a larger k. */
td_err cuda_topk(int32_t *idx, float *val, const float *x, int64_t n_rows, int64_t n,
                 int64_t k, ops_stream st);

td_err cuda_rope_neox(float *x, int64_t n_tok, int64_t n_head, int64_t tok_stride,
                      int64_t head_stride, int64_t n_rot, const int32_t *pos, float theta,
                      ops_stream st);

/* cpu_attention with a's pointers on the device. head_dim <= 256 (TD_ENOTSUP above). */
td_err cuda_attention(const ops_attn *a, ops_stream st);

/* cpu_conv1d_causal and cpu_conv1d_silu (one launch); k <= 16 (TD_ENOTSUP above). */
td_err cuda_conv1d_causal(float *out, float *state, float *state_all, const float *x,
                          int64_t x_stride, const float *w, int64_t n_tok, int64_t n_ch,
                          int64_t k, ops_stream st);
td_err cuda_conv1d_silu(float *out, float *state, float *state_all, const float *x,
                        int64_t x_stride, const float *w, int64_t n_tok, int64_t n_ch,
                        int64_t k, ops_stream st);

/* cpu_delta_rule with d's pointers on the device; d_k <= 128 (TD_ENOTSUP above). */
td_err cuda_delta_rule(const ops_delta *d, ops_stream st);
/* The largest ops_delta.chunk cuda_delta_rule runs on device dev (for d_k up to
 * OPS_DELTA_CHUNK_DK): what its shared memory per block holds, at most OPS_DELTA_CHUNK_MAX;
 * 0 where the device cannot be asked. */
int64_t cuda_delta_chunk_max(int dev);
/* cpu_delta_rule_many on the device: recurrences of one shape share a launch (up to 16). */
td_err cuda_delta_rule_many(const ops_delta *d, int64_t n, ops_stream st);

/* cpu_to_f16 (kernels/cuda/convert.cu): round to nearest even, bit-identical. */
td_err cuda_to_f16(uint16_t *out, const float *x, int64_t n, ops_stream st);
/* cpu_to_bf16 and cpu_from_bf16 (kernels/cuda/convert.cu), bit-identical (NaN included). */
td_err cuda_to_bf16(uint16_t *out, const float *x, int64_t n, ops_stream st);
td_err cuda_from_bf16(float *out, const uint16_t *x, int64_t n, ops_stream st);

/* cpu_kv_store (kernels/cuda/convert.cu), rows on the device. */
td_err cuda_kv_store(void *k_cache, void *v_cache, td_dtype type, const float *k,
                     const float *v, const int32_t *rows, int64_t n_tok, int64_t row,
                     ops_stream st);

/* The fused chains (kernels/cuda/fused.cu): the CPU's formulas, the sums of squares in the
 * norms' fixed order (f32 per thread, f64 across the block), so within rounding of the CPU
 * and batch invariant. cuda_delta_prep: d_k <= 1024. */
td_err cuda_add_rmsnorm(float *x, const float *h, float *out, const float *w, int64_t n_rows,
                        int64_t dim, float eps, ops_stream st);
/* cpu_qk_norm_rope in one launch, each head the bits of cuda_rmsnorm then cuda_rope_neox;
 * head_dim <= 1024; n_head 0 (q NULL): k only. kv (or NULL): then cpu_kv_store of the
 * finished keys and kv->v, in the same launch (the bits of cuda_kv_store after it). */
td_err cuda_qk_norm_rope(float *q, float *k, const float *q_norm, const float *k_norm,
                         int64_t n_tok, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                         int64_t q_head, int64_t n_rot, const int32_t *pos, float theta,
                         float eps, const ops_kv_dst *kv, ops_stream st);
td_err cuda_rmsnorm_silu(float *out, const float *x, const float *w, const float *z,
                         int64_t n_rows, int64_t dim, float eps, ops_stream st);
/* cpu_deltanet_in: one launch where conv_k is 4, d_k <= 128, n_tok <= 64 and both
 * projections are F32 of one shape (else the matmul, conv1d_silu and delta_prep launches; the
 * same bits either way). */
td_err cuda_deltanet_in(const ops_dn_in *p, ops_stream st);
td_err cuda_delta_prep(float *gb, float *qkv, const float *alpha, const float *beta,
                       const float *dt_bias, const float *ssm_a, int64_t n_tok,
                       int64_t n_v_head, int64_t n_k_head, int64_t d_k, int64_t qkv_stride,
                       float eps, ops_stream st);

/* cpu_sample_probs on the device (s is a host struct). The settings are checked here
 * (TD_EINVAL as on the CPU); logits with no finite value cannot be seen without waiting for
 * the GPU, so they give p all zeros, which cuda_sample_draw answers with -1. */
td_err cuda_sample_probs(float *p, const float *logits, int64_t n_vocab, const ops_sampler *s,
                         ops_stream st);
/* *tok (device) = cpu_sample_draw(p, n_vocab, seed, step), or -1 when p has no positive
 * entry. The same Philox numbers as ops_rand_uniform. */
td_err cuda_sample_draw(int32_t *tok, const float *p, int64_t n_vocab, uint64_t seed,
                        uint64_t step, ops_stream st);

/* cpu_sample_rows on the device: cuda_sample_probs of each row into q, then one block per
 * row draws with cuda_sample_draw's rule, so only tok [n] needs to come to the host (no
 * logits or distributions do). All pointers device memory, s a host struct. Settings are
 * checked as on the CPU; a row with no finite logit gives tok -1 (the CPU: TD_EINVAL). */
td_err cuda_sample_rows(int32_t *tok, float *q, const float *logits, int64_t n, int64_t n_vocab,
                        const ops_sampler *s, uint64_t ctr, uint64_t ctr_step, ops_stream st);

/* cpu_logprob_rows on the device, a block per row, so that only out [n] comes to the host:
 * the exponentials in f32 with f64 partial sums (within ~1e-6 of the CPU's log
 * probabilities), the same best tokens in the same order. All pointers device memory. */
td_err cuda_logprob_rows(ops_logprob *out, const float *logits, const int32_t *tok, int64_t n,
                         int64_t n_vocab, int n_top, ops_stream st);

/* cpu_logit_add on the device (kernels/cuda/sample.cu): a block per row. All pointers device
 * memory. */
td_err cuda_logit_add(float *logits, int64_t n, int64_t n_vocab, const int32_t *off,
                      const ops_logit_add *add, ops_stream st);

/* cpu_logit_mask on the device (kernels/cuda/select.cu). All pointers device memory. */
td_err cuda_logit_mask(float *logits, int64_t n, int64_t n_vocab, const uint32_t *allow,
                       ops_stream st);

/* Greedy acceptance of a verified block without copying logits to the host (DESIGN 4.3).
 * logits [n][n_vocab]: target logits p0..p(n-1) of the block [b, d1..d(n-1)];
 * draft [n-1]: d1..d(n-1). Writes argmax [n] (argmax of each row) and result [2] =
 * {a, next}: a = the largest k with d_i == argmax(p(i-1)) for every i <= k, next =
 * argmax(p_a). All device pointers; n >= 1. */
td_err cuda_accept_greedy(int32_t *argmax, int32_t *result, const float *logits,
                          const int32_t *draft, int64_t n, int64_t n_vocab, ops_stream st);

/* cpu_accept_sampled on the device (kernels/cuda/sample.cu): cuda_sample_probs of every row
 * into p [n][n_vocab], then one block walks the tests in the CPU's order and precision and
 * draws next with cuda_sample_draw's rule; only result [2] needs to come to the host. All
 * pointers device memory (s and rng host structs). The decision equals the CPU's unless a
 * p(d_i) or the draw's target lies within p's rounding of the test or of a token boundary
 * (cuda_sample_probs, cuda_sample_draw); a row with no finite logit that the walk reaches
 * gives next = -1. */
td_err cuda_accept_sampled(int32_t *result, float *p, const float *logits, const float *q,
                           const int32_t *draft, int64_t n, int64_t n_vocab,
                           const ops_sampler *s, const ops_accept_rng *rng, ops_stream st);

#endif /* TANDEM_HAVE_CUDA */

#endif
