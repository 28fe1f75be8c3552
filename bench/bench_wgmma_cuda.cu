/* bench_wgmma_cuda: how fast the 16-token Q4_K k-block work could run on Hopper's warpgroup
 * MMAs (`wgmma.mma_async`, sm_90a), with the same exact integers as today's kernels.
 *
 * Today's window kernel (kernels/cuda/matmul_bulk_mma.cu) multiplies each 32-weight
 * sub-block by the activations' hi and lo digits with `mma.sync` and then applies the
 * sub-block's 6-bit scale as integer products: H = sum_j sc_j dot_hi_j, L = sum_j sc_j
 * dot_lo_j, ~128 IMAD per 16-row k-block and warp at 16 tokens, 441 instructions in all,
 * issued at ~49% of the slots (kernels/cuda/NOTES.md, "2-16 tokens"). Here the scale goes
 * into the weights instead: sc = 8 sh + sl with sh, sl in 0..7, so sh q and sl q (q a 4-bit
 * weight) are at most 105 and fit u8 operands; H = 8 sum (sh q) x + sum (sl q) x over the
 * whole super-block, two accumulators chained through all eight sub-blocks with no scale
 * products, and L the same with the lo digits. A warpgroup (4 warps, 64 rows) does a
 * k-block as 16 `wgmma.mma_async.m64n32k32.s32.u8.s8`: A = the scaled weights from
 * registers, B = 32 columns from shared memory (16 tokens x {hi, lo} digits). The integers
 * are the ones the single-token kernel makes, so the bits would be too.
 *
 * What runs: one CTA per SM of WG warpgroups; every warpgroup walks the same NKB staged
 * k-blocks (64 rows of Q4_K super-blocks, the 16 tokens' digits and scales) ITER times,
 * doing per k-block what a kernel would: the qs and scale loads, the scale split and nibble
 * unpacking, the 16 MMAs, the mins term as three k16 `mma.sync` digit products, and the f32
 * steps of one reduction chain (I = 256 H + L, acc += dx d I - dx dmin M). No weight
 * streaming: the number is the work's own rate, to hold against the rate a product streams
 * weights at (copy bandwidth / 0.5625 bytes per weight).
 *
 * First a check: one pass writes every (row, token, k-block)'s H and L, compared with the
 * host's sums over the same bytes (this also checks the B descriptor and the fragment
 * layouts; --lbo/--sbo set the descriptor's two strides, read as the K and the N
 * direction's, or with --swap as N's and K's). Then the timing, best of 10.
 * Options: --iter N (default 200), --wg 2|3 (default 2). sm_90 devices only. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

extern "C" { /* the C headers bench_cuda.h includes, with C linkage */
#include "common/err.h"
#include "kernels/cuda_mem.h"
#include "kernels/ops.h"
}

#define BENCH_NAME "bench_wgmma_cuda"
#include "bench/bench_cuda.h"
#include "kernels/kquant.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_OK 1
#else
#define WG_OK 0
#endif

#define NKB 8                   /* k-blocks staged per CTA */
#define ROWS 64                 /* a warpgroup's tile */
#define NTOK 16                 /* tokens */
#define WB 144                  /* bytes of a Q4_K super-block */
#define SLICE 1024              /* bytes of B for one 32-input slice: 32 columns x 32 */
#define W_BYTES (NKB * ROWS * WB)
#define B_BYTES (NKB * 8 * SLICE)
#define S_BYTES (NKB * NTOK * 16) /* per (k-block, token): dx and three sum digits */
#define SMEM (W_BYTES + B_BYTES + S_BYTES)

/* The weight of sub-block j that k slot s of lane layout holds: slot 4t + e (s < 16) is
 * weight 8t + e, slot 16 + 4t + e is weight 8t + 4 + e (a lane's 8 bytes of a 32-byte qs
 * run serve its two A registers; B is staged in the same order). */
static int slot_weight(int s)
{
    return s < 16 ? 8 * (s / 4) + s % 4 : 8 * ((s - 16) / 4) + 4 + s % 4;
}

#if WG_OK
__device__ __forceinline__ uint64_t wg_desc(const void *smem, int lbo, int sbo)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((a >> 4) & 0x3FFF) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFF) << 32);
}

__device__ __forceinline__ void wg_mma(int (&d)[16], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint64_t desc, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.s32.u8.s8 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "{%16, %17, %18, %19}, %20, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]),
                   "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]),
                   "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(accumulate));
}

__device__ __forceinline__ void fence_regs(int (&d)[16])
{
#pragma unroll
    for (int i = 0; i < 16; i++)
        asm volatile("" : "+r"(d[i])::"memory");
}

/* m16n8k16 s8 x s8 -> s32 (the mins digits) */
__device__ __forceinline__ void mma16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, "
                 "{%6}, {%0, %1, %2, %3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}
#endif

/* CHECK: write H and L of every (k-block, row, token) to hl instead of timing. */
template <int WG, bool CHECK>
__global__ void __launch_bounds__(WG * 128, 1)
    wg_kernel(const uint8_t *src, int iter, int lbo, int sbo, float *out, int2 *hl)
{
#if WG_OK
    extern __shared__ __align__(128) uint8_t smem[];
    const uint8_t *W = smem, *B = smem + W_BYTES;
    const float *S = (const float *)(smem + W_BYTES + B_BYTES);
    for (int i = threadIdx.x; i < SMEM / 16; i += WG * 128)
        ((uint4 *)smem)[i] = ((const uint4 *)src)[i];
    __syncthreads();
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2,
              t = lane & 3;
    const int r0 = warp * 16 + g, r1 = r0 + 8; /* this lane's rows of the tile */
    float acc[2][4] = {};                      /* (row, token 2t + {0, 1} + 8 {0, 1}) */
    int dh[16] = {}, dl[16] = {};
    for (int it = 0; it < iter; it++) {
        for (int kb = 0; kb < NKB; kb++) {
            const uint8_t *w0 = W + ((size_t)kb * ROWS + r0) * WB;
            const uint8_t *w1 = W + ((size_t)kb * ROWS + r1) * WB;
            /* scales: the split digits of each sub-block, per row */
            uint32_t sh[2][8], sl[2][8], mn[2][2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uint8_t *w = r ? w1 : w0;
                uint8_t s[12];
                const uint32_t *sw = (const uint32_t *)(w + 4);
                const uint32_t s0 = sw[0], s1 = sw[1], s2 = sw[2];
                memcpy(s, &s0, 4), memcpy(s + 4, &s1, 4), memcpy(s + 8, &s2, 4);
                uint32_t m4[2] = {0, 0};
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    int sc, m;
                    kq_scale_min(s, j, &sc, &m);
                    sh[r][j] = (uint32_t)sc >> 3;
                    sl[r][j] = (uint32_t)sc & 7;
                    m4[j >> 2] |= (uint32_t)m << (8 * (j & 3));
                }
                mn[r][0] = m4[0], mn[r][1] = m4[1];
            }
            /* the weights: 8 bytes of each 32-byte qs run per row */
            uint2 q[2][4];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                q[0][c] = *(const uint2 *)(w0 + 16 + 32 * c + 8 * t);
                q[1][c] = *(const uint2 *)(w1 + 16 + 32 * c + 8 * t);
            }
            /* A fragments of both digit chains, all made before the fence (wgmma reads them
             * asynchronously): a0 / a2 row r0, a1 / a3 row r1 */
            uint32_t ah[8][4], al[8][4];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int c = j >> 1, sh4 = 4 * (j & 1);
                const uint32_t a[4] = {(q[0][c].x >> sh4) & 0x0F0F0F0Fu,
                                       (q[1][c].x >> sh4) & 0x0F0F0F0Fu,
                                       (q[0][c].y >> sh4) & 0x0F0F0F0Fu,
                                       (q[1][c].y >> sh4) & 0x0F0F0F0Fu};
#pragma unroll
                for (int k = 0; k < 4; k++) { /* bytes <= 15 times <= 7: no carry */
                    ah[j][k] = a[k] * sh[k & 1][j];
                    al[j][k] = a[k] * sl[k & 1][j];
                }
            }
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint64_t desc = wg_desc(B + ((size_t)kb * 8 + j) * SLICE, lbo, sbo);
                wg_mma(dh, ah[j][0], ah[j][1], ah[j][2], ah[j][3], desc, j > 0);
                wg_mma(dl, al[j][0], al[j][1], al[j][2], al[j][3], desc, j > 0);
            }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            /* the mins term meanwhile: M = sum_j m_j sum32_j, three digits of the sums */
            int mc[3][4] = {};
            const uint32_t *sd = (const uint32_t *)(S + ((size_t)kb * NTOK + g) * 4);
#pragma unroll
            for (int dgt = 0; dgt < 3; dgt++) {
                const uint32_t b0 = sd[1 + dgt] >> (8 * t); /* stand-in for the digit fragment */
                mma16(mc[dgt], t < 2 ? mn[0][t] : 0u, t < 2 ? mn[1][t] : 0u, b0);
            }
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            fence_regs(dh), fence_regs(dl);
            const float d0 = (float)(w0[0] | (w0[1] << 8)) * 1e-5f,
                        d1 = (float)(w1[0] | (w1[1] << 8)) * 1e-5f;
#pragma unroll
            for (int e = 0; e < 4; e++) { /* (row e >> 1 ? r1 : r0, token 2t + (e & 1) + 8 j) */
#pragma unroll
                for (int jt = 0; jt < 2; jt++) {
                    const int i = 4 * jt + e;
                    const int H = 8 * dh[i] + dl[i], L = 8 * dh[i + 8] + dl[i + 8];
                    const int row = e >> 1 ? r1 : r0, tok = 8 * jt + 2 * t + (e & 1);
                    if (CHECK)
                        hl[((size_t)kb * ROWS + row) * NTOK + tok] = make_int2(H, L);
                    const float dx = S[((size_t)kb * NTOK + tok) * 4];
                    const int M = mc[0][e] + 256 * mc[1][e] + 65536 * mc[2][e];
                    float &a = acc[e >> 1][2 * jt + (e & 1)];
                    const float I = __fmaf_rn(256.0f, (float)H, (float)L);
                    a = __fmaf_rn(dx * (e >> 1 ? d1 : d0), I, a);
                    a = __fmaf_rn(-(dx * 1e-3f), (float)M, a);
                }
            }
        }
    }
    float s = 0.0f;
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 4; k++)
            s += acc[r][k];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
#else
    (void)src, (void)iter, (void)lbo, (void)sbo, (void)out, (void)hl;
#endif
}

typedef void (*wg_fn)(const uint8_t *, int, int, int, float *, int2 *);

int main(int argc, char **argv)
{
    int iter = 200, wg = 2, lbo = 128, sbo = 256, swap = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iter") && i + 1 < argc)
            iter = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--wg") && i + 1 < argc)
            wg = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lbo") && i + 1 < argc)
            lbo = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sbo") && i + 1 < argc)
            sbo = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--swap"))
            swap = 1;
        else {
            fprintf(stderr,
                    "usage: " BENCH_NAME " [--iter N] [--wg 2|3] [--lbo B] [--sbo B] [--swap]\n");
            return 2;
        }
    }
    if (iter < 1 || (wg != 2 && wg != 3)) {
        fprintf(stderr, BENCH_NAME ": --iter >= 1, --wg 2 or 3\n");
        return 2;
    }
    const struct cudaDeviceProp prop = bench_cuda_start();
    if (prop.major != 9) {
        printf(BENCH_NAME ": needs an sm_90 device (wgmma); this one is sm_%d%d\n", prop.major,
               prop.minor);
        bench_cuda_end();
        return 0;
    }
    const int sms = prop.multiProcessorCount;
    /* a slice's 8 core matrices, 4 along N at sbo and 2 along K at lbo (--swap: N at lbo,
     * K at sbo), apart and within SLICE */
    const int n_at = swap ? lbo : sbo, k_at = swap ? sbo : lbo;
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < 8; k++) {
            const int a = (i / 2) * n_at + (i % 2) * k_at, b = (k / 2) * n_at + (k % 2) * k_at;
            if (lbo % 16 || sbo % 16 || a < 0 || a + 128 > SLICE ||
                (i != k && abs(a - b) < 128)) {
                fprintf(stderr, BENCH_NAME ": --lbo/--sbo must place a slice's 8 core "
                                "matrices apart within %d bytes\n", SLICE);
                return 2;
            }
        }
    /* the staged bytes: weights (random qs, scales, d), B digits, per-token dx and sums */
    uint8_t *h = (uint8_t *)bench_alloc(SMEM);
    int8_t *xd = (int8_t *)bench_alloc((size_t)NKB * 256 * NTOK * 2); /* [kb][input][tok][2] */
    for (size_t i = 0; i < W_BYTES; i++)
        h[i] = (uint8_t)(rnd() * 128.0f + 128.0f);
    for (size_t i = 0; i < (size_t)NKB * 256 * NTOK * 2; i++)
        xd[i] = (int8_t)(rnd() * 127.0f);
    for (int kb = 0; kb < NKB; kb++)
        for (int j = 0; j < 8; j++)
            for (int n = 0; n < 32; n++)
                for (int s = 0; s < 32; s++) {
                    const int tok = n & 15, dig = n >> 4, in = 32 * j + slot_weight(s);
                    const size_t at = (size_t)W_BYTES + ((size_t)kb * 8 + j) * SLICE +
                                      (size_t)(n / 8) * n_at + (size_t)(s / 16) * k_at +
                                      (size_t)(n % 8) * 16 + s % 16;
                    h[at] = (uint8_t)xd[(((size_t)kb * 256 + in) * NTOK + tok) * 2 + dig];
                }
    float *sf = (float *)(h + W_BYTES + B_BYTES);
    for (int i = 0; i < NKB * NTOK; i++) {
        sf[4 * i] = 1e-3f * (1.0f + rnd());
        for (int k = 1; k < 4; k++)
            ((uint32_t *)sf)[4 * i + k] = (uint32_t)(rng >> (8 * k));
    }
    uint8_t *dsrc = NULL;
    float *dout = NULL;
    int2 *dhl = NULL;
    TRY(cuda_mem_alloc((void **)&dsrc, SMEM));
    TRY(cuda_mem_alloc((void **)&dout, (size_t)sms * wg * 128 * sizeof(float)));
    TRY(cuda_mem_alloc((void **)&dhl, (size_t)NKB * ROWS * NTOK * sizeof(int2)));
    CU(cudaMemcpy(dsrc, h, SMEM, cudaMemcpyHostToDevice));
    const wg_fn run[2] = {wg == 2 ? wg_kernel<2, false> : wg_kernel<3, false>,
                          wg == 2 ? wg_kernel<2, true> : wg_kernel<3, true>};
    for (int k = 0; k < 2; k++)
        CU(cudaFuncSetAttribute(run[k], cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    cudaStream_t s = (cudaStream_t)st;

    /* the check: H and L against the host's sums */
    run[1]<<<1, wg * 128, SMEM, s>>>(dsrc, 1, lbo, sbo, dout, dhl);
    CU(cudaGetLastError());
    CU(cudaStreamSynchronize(s));
    int2 *hl = (int2 *)bench_alloc((size_t)NKB * ROWS * NTOK * sizeof(int2));
    CU(cudaMemcpy(hl, dhl, (size_t)NKB * ROWS * NTOK * sizeof(int2), cudaMemcpyDeviceToHost));
    long bad = 0;
    long long *want = (long long *)bench_alloc((size_t)NKB * ROWS * NTOK * 2 * sizeof(long long));
    for (int kb = 0; kb < NKB; kb++)
        for (int row = 0; row < ROWS; row++) {
            const uint8_t *w = h + ((size_t)kb * ROWS + row) * WB;
            for (int tok = 0; tok < NTOK; tok++) {
                long long H = 0, L = 0;
                for (int j = 0; j < 8; j++) {
                    int sc, m;
                    kq_scale_min(w + 4, j, &sc, &m);
                    for (int i = 0; i < 32; i++) {
                        const int qv = (w[16 + 32 * (j / 2) + i] >> (4 * (j & 1))) & 15;
                        const int8_t *x = xd + (((size_t)kb * 256 + 32 * j + i) * NTOK + tok) * 2;
                        H += (long long)sc * qv * x[0];
                        L += (long long)sc * qv * x[1];
                    }
                }
                want[(((size_t)kb * ROWS + row) * NTOK + tok) * 2] = H;
                want[(((size_t)kb * ROWS + row) * NTOK + tok) * 2 + 1] = L;
            }
        }
    for (int kb = 0; kb < NKB; kb++)
        for (int row = 0; row < ROWS; row++)
            for (int tok = 0; tok < NTOK; tok++) {
                const size_t i = ((size_t)kb * ROWS + row) * NTOK + tok;
                const int2 got = hl[i];
                if (got.x == want[2 * i] && got.y == want[2 * i + 1])
                    continue;
                if (bad < 8) { /* where the value belongs, if it is anyone's H or L */
                    printf("mismatch kb %d row %d token %d: H %d (want %lld), L %d (want %lld);",
                           kb, row, tok, got.x, want[2 * i], got.y, want[2 * i + 1]);
                    for (size_t k = 0; k < (size_t)NKB * ROWS * NTOK * 2; k++)
                        if (want[k] == got.x || want[k] == got.y)
                            printf(" %s of kb %zu row %zu token %zu", k & 1 ? "L" : "H",
                                   k / 2 / (ROWS * NTOK), k / 2 / NTOK % ROWS, k / 2 % NTOK);
                    printf("\n");
                }
                bad++;
            }
    free(want);
    printf(BENCH_NAME " on %s (%d SMs), %d warpgroups per SM, lbo %d sbo %d: check %s (%ld of "
                      "%d sums differ)\n",
           prop.name, sms, wg, lbo, sbo, bad ? "FAILED" : "passed", bad, NKB * ROWS * NTOK);

    /* the timing */
    double best = 1e30;
    for (int r = 0; r < 11; r++) {
        CU(cudaEventRecord(ev0, s));
        run[0]<<<sms, wg * 128, SMEM, s>>>(dsrc, iter, lbo, sbo, dout, dhl);
        CU(cudaEventRecord(ev1, s));
        const double ms = elapsed_ms();
        if (r > 0 && ms < best)
            best = ms;
    }
    CU(cudaGetLastError());
    const double weights = (double)sms * wg * iter * NKB * ROWS * 256.0;
    const double rate = weights / (best * 1e-3); /* weights per second */
    printf("%d k-blocks of 64 rows x 16 tokens per warpgroup: %.3f ms, %.2f T weights/s; "
           "5120 -> 17408 Q4_K (89.1 M weights) would take %.2f us of this work, the copy "
           "rate streams weights at %.2f T/s at 3.0 TB/s and %.2f T/s at 4.3 TB/s\n",
           iter * NKB, best, rate / 1e12, 89.128960e6 / rate * 1e6, 3.0e12 / 0.5625 / 1e12,
           4.3e12 / 0.5625 / 1e12);
    free(h), free(xd), free(hl);
    cuda_mem_free(dsrc), cuda_mem_free(dout), cuda_mem_free(dhl);
    bench_cuda_end();
    return bad ? 1 : 0;
}
