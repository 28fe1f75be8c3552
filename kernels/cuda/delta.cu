/* Gated delta rule, token by token (twin of kernels/cpu/delta.c).
 *
 * Every step of the recurrence works on columns of S independently: with S [d_k][d_v],
 * column j needs only S[:, j], k, q, v_j, g and beta (kv_j = sum_i S[i][j] k[i], then
 * S[:, j] += k u_j, o_j = sum_i S[i][j] q[i]). A block owns 32 columns of one value head
 * (qwen35: 48 heads x 4 = 192 blocks) and keeps them in registers for the whole sequence;
 * its DELTA_RG warps split the d_k rows of each column (warp w: rows w*32 .. w*32+31), so a
 * column's sums over i are DELTA_RG chains of 32 in order, added in warp order through
 * shared memory. That fixed order is the same whether a token runs alone (decode) or inside
 * a verify block or prefill chunk. Why warps over rows: one warp per 32 columns left a
 * decode step with 192 warps on the GPU and each token behind two 128-long dependent FMA
 * chains (the H200 profile: 32 us per layer for 6 MB of state traffic, 166 us for a 16-token
 * verify); four warps cut the chains to 32 and give four times the loads in flight.
 * The state stays f32 in memory between calls. With the gated norm (ops_delta.norm_z) and one
 * token a block holds a whole head as four such column groups and norms the head's output at
 * the end: one launch instead of the recurrence's and rmsnorm_silu's, 48 per 27B decode step. */
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_dev.cuh"

#define DELTA_COLS 32    /* columns (lanes) per column group */
#define DELTA_RG 4       /* warps per column group, each over a quarter of the rows */
#define DELTA_MAX_DK 128 /* rows of a column held in registers across the warps */
#define DELTA_RS (DELTA_MAX_DK / DELTA_RG) /* rows per warp */
#define DELTA_GT (DELTA_COLS * DELTA_RG)   /* threads per column group */
#define DELTA_NORM_NG 4  /* column groups per block with the gated norm: a head of <= 128 */
static_assert(DELTA_GT == 128, "a column group's threads are one FUSED_HEAD_THREADS row of the norm");

/* One recurrence's columns of value head blockIdx.y: column group cg of the block's NG owns
 * columns (blockIdx.x * NG + cg) * DELTA_COLS.. and meets at its own barrier, so NG groups
 * run as NG blocks of one group would (bit for bit: the same chains). NG > 1 only with the
 * gated norm, where one block holds the head's every column; after the recurrence each
 * group norms every NG-th token's row of the head with rmsnorm_silu_kernel's tree (a row of
 * 128 threads, f32 squares, f64 across its four warps), so the fused launch gives the bits
 * of the two. FULL: d_k is DELTA_MAX_DK, so every row of every warp exists and the row tests
 * vanish at compile time (the H200 profile of a 16-token verify, d_k 128: ~600 instructions
 * per token and warp, most of them 64-bit row tests kept in a register of spilled
 * predicates, each shared-memory load of k and q issued alone, 25 us per layer). The
 * arithmetic is the same either way. wait is pdl_enter: first, or with EARLY (one token whose
 * caller says the kernel before writes neither the state nor the norm's z: ops_delta.settled)
 * after the state's and the norm's reads, which then overlap that kernel. */
template <bool FULL, int NG, bool EARLY, class Wait>
__device__ __forceinline__ void delta_run(const ops_delta &d, Wait wait)
{
    if constexpr (!EARLY)
        wait();
    __shared__ float qs[NG][DELTA_MAX_DK], ks[NG][DELTA_MAX_DK];
    __shared__ float red[NG][DELTA_RG][DELTA_COLS]; /* per-warp partial sums of the columns */
    const int64_t dk = FULL ? DELTA_MAX_DK : d.d_k, dv = d.d_v, nv = d.n_v_head;
    const int64_t gbs = d.gb_tok_stride ? d.gb_tok_stride : nv;
    const int64_t h = blockIdx.y, kh = h % d.n_k_head;
    const int cg = NG > 1 ? (int)threadIdx.x / DELTA_GT : 0, tid = (int)threadIdx.x % DELTA_GT;
    const int bar = NG > 1 ? 1 + cg : 0; /* the group's barrier (0: the block is the group) */
    const int lane = tid % DELTA_COLS, w = tid / DELTA_COLS;
    const int64_t j = ((int64_t)blockIdx.x * NG + cg) * DELTA_COLS + lane;
    const int i0 = w * DELTA_RS; /* this warp's first row */
    const int dk_rows = FULL ? DELTA_MAX_DK : (int)dk; /* d_k <= DELTA_MAX_DK (delta_check) */
    auto row = [&](int r) { return FULL || i0 + r < dk_rows; }; /* row i0 + r exists */
    auto sync = [&]() { dev_bar(bar, DELTA_GT); };
    const bool live = j < dv;
    float *S = d.state + h * dk * dv + j; /* S[i][j] at S[i * dv] */
    const float *S0 = (d.state_in ? d.state_in : d.state) + h * dk * dv + j;
    float s[DELTA_RS];
#pragma unroll
    for (int r = 0; r < DELTA_RS; r++)
        s[r] = live && row(r) ? S0[(int64_t)(i0 + r) * dv] : 0.0f;
    /* EARLY: the norm's z and weight for the token too, then the wait */
    float ze = 0.0f, we = 1.0f;
    if constexpr (EARLY) {
        if (NG > 1 && d.n_tok == 1 && cg == 0 && tid < dv) {
            ze = d.norm_z[h * dv + tid];
            we = d.norm_w ? d.norm_w[tid] : 1.0f;
        }
        wait();
    }
    /* the state before the block (the rollback point): with one column group per block it
     * waits in registers and is stored after the tokens (H200, a 16-token verify layer:
     * 13.6 us against 14.0 with its 3 MB of stores issued before the tokens' chains); the
     * head-per-block kernel (one token) stores it now */
    float s0[NG == 1 ? DELTA_RS : 1];
    auto store_prev = [&](const float *v) {
        float *P = d.state_prev + h * dk * dv + j;
#pragma unroll
        for (int r = 0; r < DELTA_RS; r++)
            if (row(r))
                P[(int64_t)(i0 + r) * dv] = v[r];
    };
    if constexpr (NG == 1) {
#pragma unroll
        for (int r = 0; r < DELTA_RS; r++)
            s0[r] = s[r];
    } else if (live && d.state_prev) {
        store_prev(s);
    }
    /* Token t's inputs are loaded while tokens t - 2 and t - 1 run (one q and one k value
     * per thread), so no memory latency sits between two tokens' chains. */
    static_assert(DELTA_GT >= DELTA_MAX_DK, "one q and one k value per thread");
    struct tok_in {
        float q, k, g, b, v;
    };
    tok_in n1 = {0, 0, 0, 0, 0}, n2 = n1; /* tokens t and t + 1 at the top of token t */
    auto fetch = [&](int64_t t, tok_in &n) {
        if (tid < dk_rows) {
            n.q = d.q[t * d.q_tok_stride + kh * dk + tid];
            n.k = d.k[t * d.k_tok_stride + kh * dk + tid];
        }
        n.g = d.g[t * gbs + h];
        n.b = d.beta[t * gbs + h];
        n.v = live ? d.v[t * d.v_tok_stride + h * dv + j] : 0.0f;
    };
    if (d.n_tok > 0)
        fetch(0, n1);
    if (d.n_tok > 1)
        fetch(1, n2);
    /* NG > 1 (one token): the norm's z and weight for the token are read now, while the
     * state loads, not behind the recurrence; its output row stays in shared memory */
    __shared__ float orow[NG > 1 ? NG * DELTA_COLS : 1];
    float z0 = ze, w0 = we;
    if (!EARLY && NG > 1 && d.n_tok == 1 && cg == 0 && tid < dv) {
        z0 = d.norm_z[h * dv + tid];
        w0 = d.norm_w ? d.norm_w[tid] : 1.0f;
    }
    for (int64_t t = 0; t < d.n_tok; t++) {
        sync(); /* the previous token is done with qs, ks and red */
        if (tid < dk_rows) {
            qs[cg][tid] = n1.q;
            ks[cg][tid] = n1.k;
        }
        const float decay = expf(n1.g);
        const float beta = n1.b, vj = n1.v;
        n1 = n2;
        if (t + 2 < d.n_tok)
            fetch(t + 2, n2);
        sync();
        /* S = exp(g) S and this warp's part of kv = S^T k in one sweep */
        float kv = 0;
#pragma unroll
        for (int r = 0; r < DELTA_RS; r++)
            if (row(r)) {
                s[r] *= decay;
                kv = fmaf(s[r], ks[cg][i0 + r], kv);
            }
        red[cg][w][lane] = kv;
        sync();
        kv = red[cg][0][lane];
#pragma unroll
        for (int g = 1; g < DELTA_RG; g++)
            kv += red[cg][g][lane];
        const float u = beta * (vj - kv);
        /* S += k (x) u, then this warp's part of o = S^T q */
        float o = 0;
#pragma unroll
        for (int r = 0; r < DELTA_RS; r++)
            if (row(r)) {
                s[r] = fmaf(ks[cg][i0 + r], u, s[r]);
                o = fmaf(s[r], qs[cg][i0 + r], o);
            }
        sync(); /* every warp has read red */
        red[cg][w][lane] = o;
        sync();
        if (w == 0 && live && d.out) {
            float sum = red[cg][0][lane];
#pragma unroll
            for (int g = 1; g < DELTA_RG; g++)
                sum += red[cg][g][lane];
            d.out[(t * nv + h) * dv + j] = sum;
            if (NG > 1)
                orow[cg * DELTA_COLS + lane] = sum;
        }
        if (live && d.state_all) {
            float *sa = d.state_all + (t * nv + h) * dk * dv + j;
#pragma unroll
            for (int r = 0; r < DELTA_RS; r++)
                if (row(r))
                    sa[(int64_t)(i0 + r) * dv] = s[r];
        }
    }
    if constexpr (NG == 1)
        if (live && d.state_prev)
            store_prev(s0);
    if (live) {
#pragma unroll
        for (int r = 0; r < DELTA_RS; r++)
            if (row(r))
                S[(int64_t)(i0 + r) * dv] = s[r];
    }
    if (NG == 1)
        return;
    /* The gated norm of every token's row: group cg takes tokens cg, cg + NG, ...; thread tid
     * value tid of the row (d_v <= DELTA_GT), as rmsnorm_silu_kernel's thread tid. */
    __shared__ double nsh[NG][33];
    __syncthreads(); /* every group's outputs are written (and visible to the block) */
    for (int64_t t = cg; t < d.n_tok; t += NG) {
        float *o = d.out + (t * nv + h) * dv;
        const float *z = d.norm_z + (t * nv + h) * dv;
        const bool in = tid < dv, one = d.n_tok == 1; /* one: the row, z and w are at hand */
        const float x = in ? (one ? orow[tid] : o[tid]) : 0.0f;
        const float zt = in ? (one ? z0 : z[tid]) : 0.0f;
        const float wi = d.norm_w && in ? (one ? w0 : d.norm_w[tid]) : 1.0f;
        const float part = in ? fmaf(x, x, 0.0f) : 0.0f;
        const float gate = dev_gate(zt);
        const float inv = dev_rms_inv(
            dev_group_sum((double)part, nsh[cg], cg * DELTA_GT, DELTA_GT, bar), dv, d.norm_eps);
        if (in)
            o[tid] = dev_rmsnorm_silu_one(x, inv, d.norm_w, wi, gate);
    }
}

template <bool FULL, int NG, bool EARLY>
__global__ void __launch_bounds__(DELTA_GT *NG) delta_kernel(bool early, ops_delta d)
{
    delta_run<FULL, NG, EARLY>(d, [&]() { pdl_enter(early); });
}

/* Up to DELTA_BATCH recurrences of one shape in one launch (blockIdx.z: which): the
 * pointers of each, the rest from d. (64, a 27B rollback's 48 layers in one launch, measured
 * no faster on the H200: rollback 0.194-0.247 ms against 0.194-0.232 with three launches.) */
#define DELTA_BATCH 16
struct delta_ptrs {
    const float *q, *k, *v, *g, *beta, *state_in;
    float *state, *state_prev, *state_all, *out;
};
struct delta_batch {
    ops_delta d;
    delta_ptrs p[DELTA_BATCH];
};

template <bool FULL>
__global__ void __launch_bounds__(DELTA_GT) delta_many_kernel(bool early, delta_batch b)
{
    ops_delta d = b.d;
    const delta_ptrs &p = b.p[blockIdx.z];
    d.q = p.q, d.k = p.k, d.v = p.v, d.g = p.g, d.beta = p.beta, d.state_in = p.state_in;
    d.state = p.state, d.state_prev = p.state_prev, d.state_all = p.state_all, d.out = p.out;
    delta_run<FULL, 1, false>(d, [&]() { pdl_enter(early); });
}

/* ---------------------------------------------------------------------------------------
 * The chunked form (ops_delta.chunk; the math at delta_chunk_head in kernels/cpu/delta.c).
 * A block owns DC_COLS columns of one value head (qwen35: 48 x 2 = 96 blocks, one wave) and
 * keeps them in shared memory; per chunk of c tokens it stages the chunk's keys and queries,
 * then
 *   1. the lower triangles of K K^T and Q K^T with their decays (A, P): tiles of 4 x 4, two
 *      threads per tile over alternate runs of 4 rows of d_k, added in the same order,
 *   2. W = K S and Q S from the chunk's starting state: thread (column, tq) for tokens
 *      tq, tq + 4, ...; the right-hand sides beta (v - e^G W) go to U, e^G Q S stays in
 *      registers,
 *   3. the forward substitution U_t -= sum_(s<t) A_ts U_s in s order: one thread per column,
 *      its chunk of U in registers,
 *   4. the outputs e^G Q S + sum_(s<=t) P_ts U_s and the state at the chunk's end
 *      e^G_last S + sum_s e^(G_last - G_s) k_s U_s (thread (column, tq): rows of quarter tq).
 * Every sum has one fixed order, so a result depends only on the chunk's inputs and where
 * its ends lie. The gated norm is a launch of its own after it. */
#define DC_COLS 64
#define DC_THREADS 256
#define DC_TQ (DC_THREADS / DC_COLS)              /* threads per column */
#define DC_TOK (OPS_DELTA_CHUNK_MAX / DC_TQ)      /* tokens of a chunk per thread */
#define DC_ROWS (OPS_DELTA_CHUNK_DK / DC_TQ)      /* state rows per thread */
static_assert(DC_TOK * DC_TQ == OPS_DELTA_CHUNK_MAX && DC_ROWS * DC_TQ == OPS_DELTA_CHUNK_DK,
              "the chunk and d_k split evenly over a column's threads");
static_assert(OPS_DELTA_CHUNK_MAX <= 64, "the prefix of g is a scan of two values per lane");

/* Shared memory: K, Q [C][ks], A, P [C][C+1], S [dk16][DC_COLS], U [C][DC_COLS], G, e^G,
 * beta, e^(G_last - G) [C]; dk16 = d_k rounded up to 16 (rows past d_k hold zeros, so each
 * thread's quarter of the rows is whole float4s), ks = dk16 + 4 (16-byte rows). */
struct dc_layout {
    int C, dk16, ks, cp;
    size_t k, q, a, p, s, u, g, eg, beta, ds, floats;
};

__host__ __device__ static inline dc_layout dc_layout_of(int C, int dk)
{
    dc_layout l;
    l.C = C, l.dk16 = (dk + 15) / 16 * 16, l.ks = l.dk16 + 4, l.cp = C + 1;
    l.k = 0, l.q = l.k + (size_t)C * l.ks, l.a = l.q + (size_t)C * l.ks;
    l.p = l.a + (size_t)C * l.cp, l.s = l.p + (size_t)C * l.cp;
    l.u = l.s + (size_t)l.dk16 * DC_COLS, l.g = l.u + (size_t)C * DC_COLS;
    l.eg = l.g + C, l.beta = l.eg + C, l.ds = l.beta + C, l.floats = l.ds + C;
    return l;
}

/* Tile index -> (row block tb, column block sb <= tb) of the lower triangle, row by row. */
__device__ __forceinline__ void dc_tile(int tile, int &tb, int &sb)
{
    tb = (int)((sqrtf(8.0f * (float)tile + 1.0f) - 1.0f) * 0.5f);
    while (tb * (tb + 1) / 2 > tile)
        tb--;
    while ((tb + 1) * (tb + 2) / 2 <= tile)
        tb++;
    sb = tile - tb * (tb + 1) / 2;
}

/* The chunk's rows of q or k (d_k values from src + t * stride) into X [c][ks], zeros past
 * d_k; float4 loads where every row is 16-byte aligned. */
__device__ __forceinline__ void dc_stage(float *X, const float *src, int64_t stride, int cn,
                                         int dk, const dc_layout &L, int tid)
{
    if (dk % 4 == 0 && stride % 4 == 0 && ((uintptr_t)src & 15) == 0) {
        const int n4 = L.dk16 / 4, dk4 = dk / 4;
#pragma unroll 4
        for (int x = tid; x < cn * n4; x += DC_THREADS) {
            const int t = x / n4, i4 = x % n4;
            const float4 v = i4 < dk4 ? *(const float4 *)(src + t * stride + 4 * i4)
                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            *(float4 *)&X[t * L.ks + 4 * i4] = v;
        }
        return;
    }
#pragma unroll 4
    for (int x = tid; x < cn * L.dk16; x += DC_THREADS) {
        const int t = x / L.dk16, i = x % L.dk16;
        X[t * L.ks + i] = i < dk ? src[t * stride + i] : 0.0f;
    }
}

__global__ void __launch_bounds__(DC_THREADS) delta_chunk_kernel(bool early, ops_delta d)
{
    pdl_enter(early);
    extern __shared__ float4 dc_mem[];
    float *sm = (float *)dc_mem;
    const int dk = (int)d.d_k;
    const dc_layout L = dc_layout_of((int)d.chunk, dk);
    float *K = sm + L.k, *Q = sm + L.q, *A = sm + L.a, *P = sm + L.p, *S = sm + L.s;
    float *U = sm + L.u, *G = sm + L.g, *EG = sm + L.eg, *B = sm + L.beta, *DS = sm + L.ds;
    const int64_t dv = d.d_v, nv = d.n_v_head, h = blockIdx.y, kh = h % d.n_k_head;
    const int64_t gbs = d.gb_tok_stride ? d.gb_tok_stride : nv;
    const int tid = (int)threadIdx.x, col = tid % DC_COLS, tq = tid / DC_COLS;
    const int64_t j = (int64_t)blockIdx.x * DC_COLS + col;
    const bool live = j < dv;
    const float *S0 = (d.state_in ? d.state_in : d.state) + h * dk * dv + j;
    for (int i = tq; i < L.dk16; i += DC_TQ) {
        const float x = live && i < dk ? S0[(int64_t)i * dv] : 0.0f;
        S[i * DC_COLS + col] = x;
        if (live && i < dk && d.state_prev)
            d.state_prev[h * dk * dv + (int64_t)i * dv + j] = x;
    }
    const int64_t p0 = d.pos0 ? *d.pos0 : 0;
    const int nr = L.dk16 / DC_TQ, r0 = tq * nr; /* this thread's rows of the state */
    for (int64_t a = 0, c; a < d.n_tok; a += c) {
        c = L.C - (p0 + a) % L.C;
        if (c > d.n_tok - a)
            c = d.n_tok - a;
        const int cn = (int)c;
        __syncthreads(); /* the chunk before is done with everything */
        dc_stage(K, d.k + a * d.k_tok_stride + kh * dk, d.k_tok_stride, cn, dk, L, tid);
        dc_stage(Q, d.q + a * d.q_tok_stride + kh * dk, d.q_tok_stride, cn, dk, L, tid);
        if (tid < 32) { /* G_t = g_0 + ... + g_t: a scan over the lanes (tokens t, t + 32) */
            const int t0 = tid, t1 = tid + 32;
            float g0 = t0 < cn ? d.g[(a + t0) * gbs + h] : 0.0f;
            float g1 = t1 < cn ? d.g[(a + t1) * gbs + h] : 0.0f;
            const float b0 = t0 < cn ? d.beta[(a + t0) * gbs + h] : 0.0f;
            const float b1 = t1 < cn ? d.beta[(a + t1) * gbs + h] : 0.0f;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float y0 = __shfl_up_sync(0xffffffffu, g0, o);
                const float y1 = __shfl_up_sync(0xffffffffu, g1, o);
                if (tid >= o)
                    g0 += y0, g1 += y1;
            }
            g1 += __shfl_sync(0xffffffffu, g0, 31);
            if (t0 < cn)
                G[t0] = g0, B[t0] = b0;
            if (t1 < cn)
                G[t1] = g1, B[t1] = b1;
        }
        __syncthreads();
        if (tid < cn) {
            EG[tid] = expf(G[tid]);
            DS[tid] = expf(G[cn - 1] - G[tid]);
        }
        /* 1. A_ts = beta_t e^(G_t - G_s) k_t . k_s (s < t), P_ts = e^(G_t - G_s) q_t . k_s
         * (s <= t) */
        const int nb = (cn + 3) / 4, ntile = nb * (nb + 1) / 2;
        for (int x = tid; x < 2 * ntile; x += DC_THREADS) {
            int tb, sb;
            dc_tile(x >> 1, tb, sb);
            const int half = x & 1;
            float kk[4][4] = {}, qk[4][4] = {};
            int tr[4], sr[4]; /* rows past the chunk read its last row; their sums are unused */
#pragma unroll
            for (int r = 0; r < 4; r++) {
                tr[r] = min(4 * tb + r, cn - 1);
                sr[r] = min(4 * sb + r, cn - 1);
            }
            for (int i = 4 * half; i < L.dk16; i += 8) {
                float4 kt[4], qt[4], ksr[4];
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    kt[r] = *(const float4 *)&K[tr[r] * L.ks + i];
                    qt[r] = *(const float4 *)&Q[tr[r] * L.ks + i];
                    ksr[r] = *(const float4 *)&K[sr[r] * L.ks + i];
                }
#pragma unroll
                for (int r = 0; r < 4; r++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        kk[r][e] = fmaf(kt[r].x, ksr[e].x, kk[r][e]);
                        kk[r][e] = fmaf(kt[r].y, ksr[e].y, kk[r][e]);
                        kk[r][e] = fmaf(kt[r].z, ksr[e].z, kk[r][e]);
                        kk[r][e] = fmaf(kt[r].w, ksr[e].w, kk[r][e]);
                        qk[r][e] = fmaf(qt[r].x, ksr[e].x, qk[r][e]);
                        qk[r][e] = fmaf(qt[r].y, ksr[e].y, qk[r][e]);
                        qk[r][e] = fmaf(qt[r].z, ksr[e].z, qk[r][e]);
                        qk[r][e] = fmaf(qt[r].w, ksr[e].w, qk[r][e]);
                    }
            }
            /* the pair's halves, added as half 0 + half 1 by both; the lanes in this round
             * are the first ones of the warp */
            const int in_round = 2 * ntile - (x - (tid & 31));
            const unsigned pair = in_round >= 32 ? 0xffffffffu : (1u << in_round) - 1;
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float ok = __shfl_xor_sync(pair, kk[r][e], 1);
                    const float oq = __shfl_xor_sync(pair, qk[r][e], 1);
                    kk[r][e] = half ? ok + kk[r][e] : kk[r][e] + ok;
                    qk[r][e] = half ? oq + qk[r][e] : qk[r][e] + oq;
                }
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int t = 4 * tb + r, s = 4 * sb + e;
                    if (t >= cn || s > t)
                        continue;
                    const float decay = expf(G[t] - G[s]);
                    if (half == 0 && s < t)
                        A[t * L.cp + s] = B[t] * decay * kk[r][e];
                    if (half == 1)
                        P[t * L.cp + s] = decay * qk[r][e];
                }
        }
        /* 2. W = K S, Q S for tokens tq, tq + 4, ... of column col (their v loads first) */
        float vv[DC_TOK], w[DC_TOK] = {}, o[DC_TOK] = {};
#pragma unroll
        for (int m = 0; m < DC_TOK; m++) {
            const int t = tq + DC_TQ * m;
            vv[m] = live && t < cn ? d.v[(a + t) * d.v_tok_stride + h * dv + j] : 0.0f;
        }
        for (int i = 0; i < L.dk16; i += 4) {
            const float s0 = S[(i + 0) * DC_COLS + col], s1 = S[(i + 1) * DC_COLS + col];
            const float s2 = S[(i + 2) * DC_COLS + col], s3 = S[(i + 3) * DC_COLS + col];
#pragma unroll
            for (int m = 0; m < DC_TOK; m++) {
                const int t = tq + DC_TQ * m;
                if (t >= cn)
                    break;
                const float4 kt = *(const float4 *)&K[t * L.ks + i];
                const float4 qt = *(const float4 *)&Q[t * L.ks + i];
                w[m] = fmaf(kt.w, s3, fmaf(kt.z, s2, fmaf(kt.y, s1, fmaf(kt.x, s0, w[m]))));
                o[m] = fmaf(qt.w, s3, fmaf(qt.z, s2, fmaf(qt.y, s1, fmaf(qt.x, s0, o[m]))));
            }
        }
        __syncthreads(); /* EG, A and P are written */
#pragma unroll
        for (int m = 0; m < DC_TOK; m++) {
            const int t = tq + DC_TQ * m;
            if (t >= cn)
                break;
            U[t * DC_COLS + col] = B[t] * (vv[m] - EG[t] * w[m]);
            o[m] *= EG[t];
        }
        __syncthreads();
        /* 3. U_t -= A_ts U_s for s = 0, 1, ... in order, each column in one thread's
         * registers */
        if (tq == 0) {
            float u[OPS_DELTA_CHUNK_MAX];
#pragma unroll
            for (int t = 0; t < OPS_DELTA_CHUNK_MAX; t++)
                u[t] = t < cn ? U[t * DC_COLS + col] : 0.0f;
#pragma unroll
            for (int s = 0; s < OPS_DELTA_CHUNK_MAX - 1; s++) {
                if (s + 1 >= cn)
                    break;
#pragma unroll
                for (int t = s + 1; t < OPS_DELTA_CHUNK_MAX; t++)
                    if (t < cn)
                        u[t] = fmaf(-A[t * L.cp + s], u[s], u[t]);
            }
#pragma unroll
            for (int t = 0; t < OPS_DELTA_CHUNK_MAX; t++)
                if (t < cn)
                    U[t * DC_COLS + col] = u[t];
        }
        __syncthreads();
        /* 4. the outputs (s by s, the thread's tokens side by side) */
        for (int s = 0; s < cn; s++) {
            const float us = U[s * DC_COLS + col];
#pragma unroll
            for (int m = 0; m < DC_TOK; m++) {
                const int t = tq + DC_TQ * m;
                if (t >= s && t < cn)
                    o[m] = fmaf(P[t * L.cp + s], us, o[m]);
            }
        }
#pragma unroll
        for (int m = 0; m < DC_TOK; m++) {
            const int t = tq + DC_TQ * m;
            if (live && d.out && t < cn)
                d.out[((a + t) * nv + h) * dv + j] = o[m];
        }
        /* and the state at the chunk's end, rows r0 .. r0 + nr - 1 */
        const float egl = EG[cn - 1];
        float st[DC_ROWS];
#pragma unroll
        for (int r = 0; r < DC_ROWS; r++)
            st[r] = r < nr ? egl * S[(r0 + r) * DC_COLS + col] : 0.0f;
        for (int s = 0; s < cn; s++) {
            const float us = DS[s] * U[s * DC_COLS + col];
            const float4 *ks = (const float4 *)(K + s * L.ks + r0);
#pragma unroll
            for (int r4 = 0; r4 < DC_ROWS / 4; r4++)
                if (4 * r4 < nr) {
                    const float4 kv = ks[r4];
                    st[4 * r4 + 0] = fmaf(kv.x, us, st[4 * r4 + 0]);
                    st[4 * r4 + 1] = fmaf(kv.y, us, st[4 * r4 + 1]);
                    st[4 * r4 + 2] = fmaf(kv.z, us, st[4 * r4 + 2]);
                    st[4 * r4 + 3] = fmaf(kv.w, us, st[4 * r4 + 3]);
                }
        }
        /* (every thread's reads of S, in step 2, were before the barriers above) */
#pragma unroll
        for (int r = 0; r < DC_ROWS; r++)
            if (r < nr)
                S[(r0 + r) * DC_COLS + col] = st[r];
    }
    __syncthreads();
    if (live)
        for (int i = tq; i < dk; i += DC_TQ)
            d.state[h * dk * dv + (int64_t)i * dv + j] = S[i * DC_COLS + col];
}

static size_t dc_bytes(int64_t chunk, int64_t d_k)
{
    return dc_layout_of((int)chunk, (int)d_k).floats * sizeof(float);
}

extern "C" int64_t cuda_delta_chunk_max(int dev)
{
    const size_t optin = (size_t)smem_optin_bytes(dev);
    int64_t c = OPS_DELTA_CHUNK_MAX;
    while (c > 0 && dc_bytes(c, OPS_DELTA_CHUNK_DK) > optin)
        c--;
    return c;
}

/* The chunked form's launch: a block per DC_COLS columns of a head; then the norm. */
static td_err delta_chunk_launch(const ops_delta *d, ops_stream st)
{
    if (d->chunk > OPS_DELTA_CHUNK_MAX || d->state_all || d->d_k > OPS_DELTA_CHUNK_DK)
        return err_set(TD_ENOTSUP, "chunked delta rule: chunk %lld, d_k %lld%s (at most %d, %d, "
                       "no per-token states)", (long long)d->chunk, (long long)d->d_k,
                       d->state_all ? ", per-token states" : "", OPS_DELTA_CHUNK_MAX,
                       OPS_DELTA_CHUNK_DK);
    const size_t smem = dc_bytes(d->chunk, d->d_k);
    if (smem > 48 * 1024) {
        int dev = 0;
        CUDA_TRY(cudaGetDevice(&dev));
        const size_t optin = (size_t)smem_optin_bytes(dev);
        const size_t most = dc_bytes(OPS_DELTA_CHUNK_MAX, OPS_DELTA_CHUNK_DK);
        if (smem > optin)
            return err_set(TD_ENOTSUP, "chunked delta rule: a chunk of %lld at d_k %lld needs "
                           "%zu bytes of shared memory per block, this GPU gives %zu (chunks of "
                           "at most %lld)", (long long)d->chunk, (long long)d->d_k, smem, optin,
                           (long long)cuda_delta_chunk_max(dev));
        TD_TRY(smem_optin<delta_chunk_kernel>(dev, most < optin ? most : optin));
    }
    const dim3 grid(cuda_blocks(d->d_v, DC_COLS), (unsigned)d->n_v_head), block(DC_THREADS);
    TD_TRY(pdl_launch<delta_chunk_kernel>("chunked delta rule", grid, block, smem, st, *d));
    if (!d->norm_z || d->n_tok == 0)
        return TD_OK;
    return cuda_rmsnorm_silu(d->out, d->out, d->norm_w, d->norm_z, d->n_tok * d->n_v_head,
                             d->d_v, d->norm_eps, st);
}

/* What the GPU cannot run, or TD_OK; *none: there is nothing to do. */
static td_err delta_check(const ops_delta *d, bool *none)
{
    TD_ASSERT(d != NULL && d->q && d->k && d->v && d->g && d->beta && d->state);
    TD_ASSERT(d->n_k_head >= 1 && d->n_v_head % d->n_k_head == 0);
    TD_ASSERT(d->d_k >= 1 && d->d_v >= 1 && d->n_tok >= 0 && (!d->norm_z || d->out));
    if (d->d_k > DELTA_MAX_DK)
        return err_set(TD_ENOTSUP, "delta rule with d_k %lld: the GPU handles up to %d",
                       (long long)d->d_k, DELTA_MAX_DK);
    if (d->n_v_head > 65535 || d->d_v / DELTA_COLS >= INT32_MAX)
        return err_set(TD_ENOTSUP, "delta rule with %lld value heads of %lld",
                       (long long)d->n_v_head, (long long)d->d_v);
    *none = d->n_v_head == 0 || (d->n_tok == 0 && !d->state_prev && !d->state_in);
    return TD_OK;
}

static dim3 delta_grid(const ops_delta *d, unsigned n, int ng)
{
    return dim3(cuda_blocks(d->d_v, DELTA_COLS * ng), (unsigned)d->n_v_head, n);
}

/* The head-per-block kernel with the norm, its reads before the wait when early. */
template <bool FULL>
static td_err delta_norm_launch(const ops_delta *d, bool early, dim3 grid, dim3 block,
                                ops_stream st)
{
    const char *what = "delta rule + norm";
    return early ? pdl_launch<delta_kernel<FULL, DELTA_NORM_NG, true>>(what, grid, block, 0, st, *d)
                 : pdl_launch<delta_kernel<FULL, DELTA_NORM_NG, false>>(what, grid, block, 0, st,
                                                                        *d);
}

extern "C" td_err cuda_delta_rule(const ops_delta *d, ops_stream st)
{
    bool none = false;
    TD_TRY(delta_check(d, &none));
    if (none)
        return TD_OK;
    if (d->chunk)
        return delta_chunk_launch(d, st);
    const bool full = d->d_k == DELTA_MAX_DK;
    if (d->norm_z && d->n_tok == 1 && d->d_v <= DELTA_COLS * DELTA_NORM_NG) {
        /* a head per block, the norm after the recurrence: one launch. Only for one token:
         * the four groups of a block share one SM's issue slots, so a block of tokens runs
         * its chains slower than on four SMs (H200, 27B verify of 16 tokens: 15.89 ms
         * against 15.42 with the plain blocks), where a decode step saves the launch (7.36
         * against 7.42 ms) */
        const dim3 grid = delta_grid(d, 1, DELTA_NORM_NG), block(DELTA_GT * DELTA_NORM_NG);
        const bool early = d->settled && pdl_early_reads();
        return full ? delta_norm_launch<true>(d, early, grid, block, st)
                    : delta_norm_launch<false>(d, early, grid, block, st);
    }
    const dim3 grid = delta_grid(d, 1, 1), block(DELTA_GT);
    const td_err e =
        full ? pdl_launch<delta_kernel<true, 1, false>>("delta rule", grid, block, 0, st, *d)
             : pdl_launch<delta_kernel<false, 1, false>>("delta rule", grid, block, 0, st, *d);
    TD_TRY(e);
    if (!d->norm_z || d->n_tok == 0)
        return TD_OK;
    /* several tokens, or heads wider than a block's groups: the norm as its own launch */
    return cuda_rmsnorm_silu(d->out, d->out, d->norm_w, d->norm_z, d->n_tok * d->n_v_head,
                             d->d_v, d->norm_eps, st);
}

/* Whether a and b can share one launch: the same shapes, strides and optional outputs. */
static bool delta_same_shape(const ops_delta *a, const ops_delta *b)
{
    return a->n_tok == b->n_tok && a->n_k_head == b->n_k_head && a->n_v_head == b->n_v_head &&
           a->d_k == b->d_k && a->d_v == b->d_v && a->q_tok_stride == b->q_tok_stride &&
           a->k_tok_stride == b->k_tok_stride && a->v_tok_stride == b->v_tok_stride &&
           a->gb_tok_stride == b->gb_tok_stride && !a->state_in == !b->state_in &&
           !a->state_prev == !b->state_prev && !a->state_all == !b->state_all &&
           !a->out == !b->out && !a->norm_z && !b->norm_z;
}

extern "C" td_err cuda_delta_rule_many(const ops_delta *d, int64_t n, ops_stream st)
{
    TD_ASSERT(n >= 0 && (n == 0 || d != NULL));
    for (int64_t i = 0; i < n;) {
        if (d[i].norm_z) { /* with the norm: alone */
            TD_TRY(cuda_delta_rule(&d[i], st));
            i++;
            continue;
        }
        /* a batch: d[i] and the next ones of its shape, at most DELTA_BATCH */
        bool none = false;
        TD_TRY(delta_check(&d[i], &none));
        delta_batch b;
        b.d = d[i];
        unsigned m = 0;
        for (; m < DELTA_BATCH && i + m < n && delta_same_shape(&d[i], &d[i + m]); m++) {
            const ops_delta *e = &d[i + m];
            if (m)
                TD_TRY(delta_check(e, &none));
            b.p[m] = delta_ptrs{e->q,     e->k,          e->v,          e->g,  e->beta,
                                e->state_in, e->state, e->state_prev, e->state_all, e->out};
        }
        const dim3 grid = delta_grid(&d[i], m, 1), block(DELTA_GT);
        if (!none && d[i].d_k == DELTA_MAX_DK)
            TD_TRY(pdl_launch<delta_many_kernel<true>>("delta rule batch", grid, block, 0, st, b));
        else if (!none)
            TD_TRY(pdl_launch<delta_many_kernel<false>>("delta rule batch", grid, block, 0, st,
                                                        b));
        i += m;
    }
    return TD_OK;
}
