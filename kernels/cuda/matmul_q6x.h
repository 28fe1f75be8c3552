/* Where the Q6_K x bf16 kernel (matmul_q6x.cu) finds what it multiplies, in one place that
 * both the kernel and a host test compile (tests/test_cuda_matmul_addresses.c rebuilds every
 * weight of random blocks through these functions and compares them with
 * cpu_dequantize_row). Plain C: no CUDA headers; under nvcc the functions are
 * __host__ __device__.
 *
 * An m16n8k16 MMA gives lane (g = lane / 4, t = lane % 4) the A elements of rows g and g + 8 at
 * k slots 2t, 2t + 1, 2t + 8, 2t + 9, and the B elements of token g at the same slots. Which
 * input a k slot stands for is free as long as A and B agree, so a step (one MMA) takes the
 * 16 weights of one scale of a Q6_K block, and lane t's four slots are the four weights whose
 * 6-bit values come out of the same byte lanes of three 32-bit words: for half h, quarter p
 * and class c (DESIGN section 8: w[l], w[l+32], w[l+64], w[l+96] for l < 32),
 *   ql0 = ql[64h + 16p + 4t ..] (4 bytes), ql1 = ql[64h + 32 + 16p + 4t ..], qh = qh[32h + 16p
 *   + 4t ..], and byte i of q6x_class_bytes(ql0, ql1, qh, c) is the weight of l = 16p + 4t + i
 *   in class c: input 128h + 32c + l of the block, with scale 8h + p + 2c.
 * Its inputs are then 4 consecutive columns (q6x_input), so the B registers of a step are
 * one 8-byte read of the token's bf16 row. */
#ifndef TANDEM_KERNELS_CUDA_MATMUL_Q6X_H
#define TANDEM_KERNELS_CUDA_MATMUL_Q6X_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define Q6X_HD static __host__ __device__ __forceinline__
#else
#define Q6X_HD static inline
#endif

#define Q6X_BLOCK_BYTES 210 /* one Q6_K block of 256 weights */
#define Q6X_QH 128          /* offset of qh[64] in the block */
#define Q6X_SCALES 192      /* offset of the int8 scales[16] */
#define Q6X_D 208           /* offset of the f16 d */
#define Q6X_PAD 16          /* bf16 elements after each token's row in shared memory: rows
                             * 32 bytes apart modulo 128, so the 8 tokens of a read hit
                             * distinct bank pairs */
#define Q6X_MAX_TOK 16

/* Byte offsets, in a block, of lane t's three words of half h, quarter p. */
Q6X_HD int q6x_ql0(int h, int p, int t)
{
    return 64 * h + 16 * p + 4 * t;
}
Q6X_HD int q6x_ql1(int h, int p, int t)
{
    return 64 * h + 32 + 16 * p + 4 * t;
}
Q6X_HD int q6x_qh(int h, int p, int t)
{
    return Q6X_QH + 32 * h + 16 * p + 4 * t;
}

/* The four 6-bit values (0..63, one per byte) of class c in the words at q6x_ql0, q6x_ql1,
 * q6x_qh. */
Q6X_HD uint32_t q6x_class_bytes(uint32_t ql0, uint32_t ql1, uint32_t qh, int c)
{
    const uint32_t lo = 0x0f0f0f0fu, hi = 0x30303030u;
    switch (c) {
    case 0:
        return (ql0 & lo) | ((qh << 4) & hi);
    case 1:
        return (ql1 & lo) | ((qh << 2) & hi);
    case 2:
        return ((ql0 >> 4) & lo) | (qh & hi);
    default:
        return ((ql1 >> 4) & lo) | ((qh >> 2) & hi);
    }
}

/* The block's input (0..255) of byte i of class c, half h, quarter p, lane t. */
Q6X_HD int q6x_input(int h, int p, int c, int t, int i)
{
    return 128 * h + 32 * c + 16 * p + 4 * t + i;
}

/* The scale (0..15) of class c, half h, quarter p. */
Q6X_HD int q6x_scale(int h, int p, int c)
{
    return 8 * h + p + 2 * c;
}

/* Shared bytes of the kernel's CTA: the bf16 activations of n_pad (8 or 16) tokens, each row
 * cols + Q6X_PAD elements. */
Q6X_HD size_t q6x_smem_bytes(int64_t cols, int n_pad)
{
    return (size_t)n_pad * (size_t)(cols + Q6X_PAD) * 2;
}

#endif
