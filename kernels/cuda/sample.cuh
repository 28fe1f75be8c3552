/* What the sampler's files share: sample.cu (the paths of cuda_sample_probs), sample_cut.cu
 * (top-p's cut by mass) and sample_draw.cu (the draw and sampled acceptance). Include only
 * from .cu files. */
#ifndef TANDEM_KERNELS_CUDA_SAMPLE_CUH
#define TANDEM_KERNELS_CUDA_SAMPLE_CUH

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/select.cuh"

#define SAMPLE_THREADS 1024

/* exp((l - max) / temperature) as cpu's cand_e, in f32: 1 for the max itself (also +inf),
 * 0 for NaN. */
__device__ __forceinline__ float smp_e(float l, float mx, float inv_t)
{
    if (l == mx)
        return 1.0f;
    if (isnan(l))
        return 0.0f;
    return expf((l - mx) * inv_t);
}

__device__ __forceinline__ bool smp_bad_max(float mx)
{
    return isnan(mx) || mx == -INFINITY;
}

/* Inclusive prefix sum of v over the block, in a fixed order (Hillis-Steele); sh has
 * blockDim.x elements. Every thread must call it. */
static __device__ double smp_block_scan(double v, double *sh)
{
    __syncthreads();
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned off = 1; off < blockDim.x; off <<= 1) {
        double add = threadIdx.x >= off ? sh[threadIdx.x - off] : 0.0;
        __syncthreads();
        v += add;
        sh[threadIdx.x] = v;
        __syncthreads();
    }
    return v;
}

/* Smallest v over the block (exact in any order; no NaN), none where a lane has no value;
 * sh: 33 elements. Every thread must call it. */
template <typename T> __device__ T smp_block_min(T v, T *sh, T none)
{
    for (int off = 16; off > 0; off >>= 1) {
        const T o = __shfl_xor_sync(DEV_FULL_MASK, v, off);
        v = o < v ? o : v;
    }
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : none;
        for (int off = 16; off > 0; off >>= 1) {
            const T o = __shfl_xor_sync(DEV_FULL_MASK, v, off);
            v = o < v ? o : v;
        }
        if (lane == 0)
            sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}

/* A row of the nucleus path (top_p alone): its mass, and whether smp_cut_rows cuts it. */
typedef struct smp_row {
    double whole; /* the row's mass */
    float mx, lo; /* its best and smallest finite logits */
    int64_t best; /* the best entry */
    int cut;      /* 1: cut by mass */
} smp_row;

/* cuda_sample_probs of rows rows of logits [rows][n_vocab] into p (sample.cu). */
td_err smp_probs_rows(float *p, const float *logits, int64_t rows, int64_t n_vocab,
                      const ops_sampler *s, ops_stream st);

/* Scratch bytes smp_cut_rows needs for rows rows of S slices (16-byte aligned). */
size_t smp_cut_bytes(int64_t rows, int S);

/* The cut by mass of the rows of logits [rows][n] that info marks, into p (sample_cut.cu):
 * inv_t = 1 / temperature; scratch: smp_cut_bytes(rows, S) bytes of the split passes'
 * buffer, count: its counters. Rows info does not mark are left as they are. */
td_err smp_cut_rows(float *p, const float *logits, int64_t rows, int64_t n, int S, float inv_t,
                    double top_p, double min_p, const smp_row *info, void *scratch,
                    unsigned *count, cudaStream_t st);

#endif
