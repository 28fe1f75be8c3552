/* What the matmul .cu files share: the launchers behind cuda_matmul (kernels/cuda/matmul.cu
 * dispatches; matmul_quant.cu and matmul_float.cu hold one kernel idea each). Include only
 * from .cu files, after cuda_common.h. */
#ifndef TANDEM_KERNELS_CUDA_MATMUL_INTERNAL_H
#define TANDEM_KERNELS_CUDA_MATMUL_INTERNAL_H

#include <cuda.h>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul_bulk_addr.h"

/* Tokens per launch: one pass over the weights serves this many tokens; cuda_matmul loops
 * over larger n_tok. */
#define MM_CHUNK 64

/* Inputs per activation scale: one K-quant super-block, so a super-block's integer dot
 * products are summed exactly and scaled once. */
#define MM_XBLOCK 256

/* Largest |q| of a rounded activation: 127 * 256 + 127, so q = 256 * hi + lo with hi in
 * -127..127 and lo in -128..127, both int8 MMA operands. */
#define MM_XQMAX 32639

/* Bytes of integer sums kept per (x block, token), see mm_xquant. */
#define MM_XSUM_BYTES 96

/* Activations of one chunk rounded to 16-bit integers for the tensor-core kernels. Per
 * token and x block b (inputs 256b..256b+255, the last block possibly shorter):
 * d = max|x| / MM_XQMAX and q = rint(x * (1/d)), so |x - d*q| <= d/2 (2^-16 of the block's
 * largest input). q is stored as two int8 digits, q = 256 * hi + lo, interleaved per `unit`
 * inputs (8 for the k32 MMA types, 4 for Q6_K): the unit of inputs u*unit.. is bytes
 * 2*unit*u.. = hi[unit], lo[unit], so one load gives a lane the hi and lo B fragments.
 * Tokens n_tok..n_pad-1 are zeros.
 *
 * xsum holds, per (block, token), the sums of q the K-quant offsets need, each as three
 * int8 digits s = 65536*s2 + 256*s1 + s0 (s0, s1 in -128..127) so they are MMA operands:
 *   bytes  0..31: sums of 32 inputs (j = 0..7, the Q4_K/Q5_K mins): for u = 0, 1 at 16u:
 *                 s0[4u..4u+3], s1[4u..4u+3], s2[4u..4u+3], 4 unused bytes;
 *   bytes 32..95: sums of 16 inputs (k = 0..15, Q6_K's -32 offset): for u = 0..3 at
 *                 32 + 16u: s0[4u..4u+3], s1[..], s2[..], 4 unused bytes.
 * Lane t's 16 bytes at 16t (resp. 32 + 16t) are the three B fragments of a k16 MMA over
 * the sums. */
typedef struct mm_xquant {
    const int8_t *xq;   /* [n_pad][2 * cols] hi/lo digits, interleaved per unit */
    const float *xd;    /* [ceil(cols / 256)][n_pad] scale d of each x block */
    const int8_t *xsum; /* [ceil(cols / 256)][n_pad][MM_XSUM_BYTES] */
    int n_tok;          /* real tokens, 1..MM_CHUNK */
    int n_pad;          /* tokens in the layout: 8, 16, 32 or 64 */
} mm_xquant;

/* Inputs per hi/lo interleave unit the kernel for type expects (8 or 4). */
int mmq_unit(td_dtype type);

/* Where the single-token kernel (matmul_decode.cu) wants the 16 bytes of inputs 8u..8u+7
 * (u = 0..31, hi/lo digits in the type's interleave `unit`) of each 256-input block: at byte
 * 16 * mm_decode_unit_pos(u, unit) of the block's 512, so that the k-th 16-byte load of lane
 * i of a 4-lane group is what that lane needs and the 4 lanes read 64 contiguous bytes:
 *   unit 8 (Q4_K/Q5_K): u = 8i + k (sub-block 2i + k / 4, inputs 8 (k % 4)..);
 *   unit 4 (Q6_K): u = 16n + 4qq + 2gh + e with i = 2n + gh, k = 2qq + e (half n, quarter
 *   qq, weights 16gh + 8e.. of the quarter).
 * Only the placement differs from the plain layout, never a value. */
__host__ __device__ __forceinline__ int mm_decode_unit_pos(int u, int unit)
{
    if (unit == 8)
        return 4 * (u & 7) + (u >> 3);
    return 8 * ((u >> 2) & 3) + 4 * (u & 1) + 2 * (u >> 4) + ((u >> 1) & 1);
}

/* The device a launch goes to, as the launchers need it. */
typedef struct mm_device {
    int n_sm;  /* multiprocessors: picks the row tile (results never depend on it) */
    bool pdl;  /* programmatic dependent launch (sm_90+): the matmul kernel starts while the
                * activation rounding before it still runs, streaming weights meanwhile */
} mm_device;

/* The set of the n (1..MM_SET_MAX) members mm[], of one type and width, in units of
 * unit_rows rows (mm_set, matmul_bulk_addr.h). */
mm_set mm_set_of(const ops_mm_out *mm, int n, int64_t unit_rows);

/* y[n_tok][w->rows] = xq . W^T for Q8_0, Q4_K, Q5_K, Q6_K (matmul_quant.cu). w->data is
 * 16-byte aligned (cuda_matmul checks). With dev->pdl the kernel is launched as a
 * programmatic dependent of the kernel before it on st (which wrote xq) and waits for it
 * before its first read of xq. */
td_err mmq_launch(float *y, const mm_xquant *xq, const ops_weight *w, const mm_device *dev,
                  cudaStream_t st);

/* A tensor-core quantised kernel's signature (mmq_kernel in matmul_quant.cu, mmqb_kernel in
 * matmul_bulk_mma.cu), and their one launch: grid CTAs of `threads` threads with smem bytes
 * of dynamic shared memory, as a programmatic dependent with dev->pdl (plain launches from
 * the first refusal on); what names the kernel in errors. */
typedef void (*mmq_kernel_fn)(float *y, const uint8_t *w, uint32_t row_bytes, int64_t rows,
                              int64_t cols, mm_xquant xq);
td_err mmq_launch_grid(mmq_kernel_fn k, int64_t grid, int threads, int smem, float *y,
                       const mm_xquant *xq, const ops_weight *w, const mm_device *dev,
                       cudaStream_t st, const char *what);

/* Whether one token (n_tok == 1) on type takes the single-token kernel (matmul_decode.cu)
 * instead of mmq_launch; its activations are then laid out by mm_decode_unit_pos. */
bool mmd_supported(td_dtype type);

/* Whether the single-token kernel for type wants its activations placed by
 * mm_decode_unit_pos (else the plain layout). */
bool mmd_placed(td_dtype type);

/* y[0][w->rows] = xq . W^T for one token (xq->n_tok == 1) and a type mmd_supported accepts,
 * with the same arithmetic as mmq_launch (so the same bits). PDL as for mmq_launch. */
td_err mmd_launch(float *y, const mm_xquant *xq, const ops_weight *w, const mm_device *dev,
                  cudaStream_t st);

/* Whether a single token on w runs faster on the single-token kernel than on the
 * tensor-core kernel (measured on an H200, see matmul_decode.cu); both give the same bits. */
bool mmd_preferred(const ops_weight *w, const mm_device *dev);

/* Whether one token on w can run on the bulk-copy kernel (matmul_bulk.cu): an sm_90+
 * device, a type it covers (Q4_K, Q5_K, Q6_K, Q8_0), 16-byte aligned data and a row short
 * enough that the token's activations and the rings fit one CTA's shared memory. */
bool mmb_supported(const ops_weight *w);

/* Whether the bulk-copy kernel for w rounds x itself (w->cols <= MMB_FUSE_COLS). */
bool mmb_fused(const ops_weight *w);

/* mm[i].y[0][rows] = x[0][cols] . mm[i].w^T for one token and n (1..MM_SET_MAX) members of
 * one type and width where mmb_supported, in one launch, with the arithmetic of mmq_launch
 * (so the same bits): from x (only where mmb_fused; xq NULL), rounded in the kernel by the
 * rounding kernel's code (matmul_round.cuh), or else from xq (plain layout, xq->n_tok == 1;
 * x NULL). Launched as a programmatic dependent of the kernel before
 * it on st (with dev->pdl), it waits for that one before reading x or xq. */
td_err mmb_launch(const ops_mm_out *mm, int n, const float *x, const mm_xquant *xq,
                  const mm_device *dev, cudaStream_t st);

/* The current device's code arch and opt-in shared memory per block (code_arch and
 * smem_optin_bytes of launch.cuh, which cache them per device). */
td_err device_caps(int *arch, int *optin);

/* Whether a chunk of n_pad tokens on w can run on the window kernel (n_pad 8, 16) or the wide
 * kernel (n_pad 32, 64) of matmul_bulk_mma.cu: sm_90 code, Q4_K, Q5_K (where the driver
 * encodes tensor maps) or Q6_K, 16-byte aligned data, cols a multiple of 256. */
bool mmqb_supported(const ops_weight *w, int n_pad);

/* mmq_launch for n (1..MM_SET_MAX) members of one type and width, in one launch, on the
 * window kernel (n_pad 16) or the wide kernel (32, 64) of matmul_bulk_mma.cu: weights and
 * activations of a few k-blocks at a time staged by bulk copies, the activations shared by
 * the CTA's tiles; the same fragments, chains and reduction, so the same bits. */
td_err mmqb_launch(const ops_mm_out *mm, int n, const mm_xquant *xq, const mm_device *dev,
                   cudaStream_t st);

/* Whether the driver encodes tensor maps (cuTensorMapEncodeTiled); asked once. */
bool mm_rows_map_ok(void);

/* *map = w's rows as a 2-D tensor for cp.async.bulk.tensor, `per` rows (1 or 2) to a tensor
 * row: elements of elem bytes (1 or 8; per * w->row_bytes / elem per tensor row, a 16-byte
 * multiple; w->rows a multiple of per), boxes of box_x elements x box_y tensor rows, no
 * swizzle, zeros past the tensor. */
td_err mm_rows_map(CUtensorMap *map, const ops_weight *w, int elem, int per, unsigned box_x,
                   unsigned box_y);

/* Whether a chunk of n_pad tokens on w can run on the warpgroup kernel
 * (sm90a/matmul_wgmma.cu): n_pad 8 or 16, Q4_K or Q5_K, 16-byte aligned data, cols a
 * multiple of 256, and a device that runs its sm_90a code (an H100 or H200) with the shared
 * memory it needs. */
bool wgq_supported(const ops_weight *w, int n_pad);

/* mmq_launch for n (1..MM_SET_MAX) Q4_K or Q5_K members of one type and width at n_pad 8 or
 * 16, in one launch, on the warpgroup kernel, reading xq in the warpgroup layout
 * (mm_wg_pos): the same chains and integers, so the same bits. */
td_err wgq_launch(const ops_mm_out *mm, int n, const mm_xquant *xq, const mm_device *dev,
                  cudaStream_t st);

/* Programmatic dependent launch, device side (no-ops before sm_90): let the dependent
 * kernel launch now; wait until the kernels this one depends on have finished and their
 * writes are visible. */
__device__ __forceinline__ void mm_launch_dependents(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void mm_wait_dependencies(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* c += A . B, one mma.sync m16n8k16 with bf16 A and B and f32 accumulation (sm_80+). */
__device__ __forceinline__ void mm_mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* mm[i].y[n_tok][rows] = x[n_tok][cols] . mm[i].w^T for n (1..MM_SET_MAX) F32 members of
 * one width, in one launch (matmul_float.cu), 1 <= n_tok <= MM_CHUNK. */
td_err mmf_launch(const ops_mm_out *mm, int n, const float *x, int n_tok, cudaStream_t st);

/* The same for n >= 1 F16/BF16 members of one width on the tensor cores, the activations
 * split exactly into bf16 pieces once for all of them (matmul_float_mma.cu), then one
 * kernel per member; 1 <= n_tok <= MM_CHUNK. */
td_err mmh_launch(const ops_mm_out *mm, int n, const float *x, int n_tok, cudaStream_t st);

/* Whether y = bf16(x) . W^T of n_tok tokens runs on the Q6_K x bf16 kernel (matmul_q6x.cu):
 * a Q6_K weight with x_bf16, 1..16 tokens, the tokens' bf16 rows fitting the device's shared
 * memory, sm_80+, under TANDEM_Q6X=on (on an H200 it is slower than the quantised path on
 * the rounded x: kernels/cuda/NOTES.md). Elsewhere the caller rounds x and takes the
 * quantised path. */
bool q6x_takes(const ops_weight *w, int64_t n_tok);
td_err q6x_launch(float *y, const float *x, const ops_weight *w, int n_tok, cudaStream_t st);

#endif
