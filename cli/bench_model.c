/* The synthetic qwen35 target of `tandem bench`: shapes, the Q4_K_M type of every tensor,
 * and random valid weights (see bench_model.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_model.h"
#include "kernels/ops.h"

static const bmodel_shape bmodel_shapes[] = {
    {
        /* Qwen3.5 / Qwen3.6 27B (DESIGN section 5) and its z-lab DFlash drafter. */
        .name = "27b", .n_layer = 64, .n_nextn = 1, .n_embd = 5120, .n_ff = 17408,
        .n_head = 24, .n_head_kv = 4, .head_dim = 256, .n_rot = 64,
        .rope_sections = {11, 11, 10, 0}, .rope_theta = 1e7f, .eps = 1e-6f,
        .n_ctx_train = 262144, .full_attn_interval = 4, .conv_k = 4, .d_state = 128,
        .n_k_head = 16, .n_v_head = 48, .n_vocab = 248320, .n_pad = 250,
        .d_layer = 5, .d_head = 32, .d_head_kv = 8, .d_head_dim = 128, .d_block = 16,
        .d_n_taps = 5, .d_taps = {1, 16, 31, 46, 61},
    },
    {
        /* Small enough for tests on the CPU; every width a multiple of the K-quant block
         * (256) and every tensor kind present, with both Q4_K and Q6_K layers of each
         * more-bits tensor. */
        .name = "tiny", .n_layer = 8, .n_nextn = 1, .n_embd = 256, .n_ff = 512,
        .n_head = 4, .n_head_kv = 2, .head_dim = 64, .n_rot = 16,
        .rope_sections = {3, 3, 2, 0}, .rope_theta = 1e7f, .eps = 1e-6f,
        .n_ctx_train = 262144, .full_attn_interval = 4, .conv_k = 4, .d_state = 64,
        .n_k_head = 2, .n_v_head = 4, .n_vocab = 1024, .n_pad = 6,
        .d_layer = 2, .d_head = 4, .d_head_kv = 2, .d_head_dim = 64, .d_block = 16,
        .d_n_taps = 2, .d_taps = {1, 5},
    },
};

const bmodel_shape *bmodel_shape_find(const char *name)
{
    for (size_t i = 0; i < sizeof bmodel_shapes / sizeof bmodel_shapes[0]; i++)
        if (!strcmp(bmodel_shapes[i].name, name))
            return &bmodel_shapes[i];
    return NULL;
}

const char *bmodel_shape_names(void)
{
    return "27b|tiny";
}

int64_t bmodel_mask_token(const bmodel_shape *s)
{
    return s->n_vocab - s->n_pad;
}

/* --- random numbers ------------------------------------------------------------------- */

static uint64_t bm_mix(uint64_t x)
{
    /* splitmix64's finaliser: neighbouring seeds give unrelated streams */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t bm_next(uint64_t *s)
{
    /* xorshift64*: the state must never be 0, which bm_mix of anything practically is not */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* Uniform in [lo, hi). */
static float bm_uniform(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)(bm_next(s) >> 40) * (1.0f / 16777216.0f);
}

/* --- tensors ---------------------------------------------------------------------------- */

typedef enum bm_fill {
    BM_ONES,      /* norm weights: 1 (stored as 1 + w with w = 0, or plain 1 for ssm_norm) */
    BM_UNIFORM,   /* uniform in [-amp, amp) */
    BM_SSM_A,     /* -exp(A_log) with A_log = log(U(1, 16)), as the reference initialises it */
    BM_DT_BIAS,   /* softplus^-1(dt), dt ~ U(1e-3, 0.1): decays exp(g) stay in (0, 1) */
} bm_fill;

typedef struct bm_tensor {
    char name[64];
    td_dtype type;
    uint32_t n_dims;      /* 1 or 2 */
    int64_t ne[2];        /* GGUF order: ne[0] = row length (inputs), ne[1] = rows */
    bm_fill fill;
    float amp;            /* BM_UNIFORM: half width */
} bm_tensor;

typedef struct bm_list {
    bm_tensor *t;         /* [n] in file order */
    size_t n, cap;
} bm_list;

/* llama.cpp's use_more_bits: layer i of the n layers that carry a tensor gets more bits in
 * the first and last eighth and every third layer between. */
static bool bm_more_bits(int64_t i, int64_t n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static td_err bm_add(bm_list *l, const char *name, td_dtype type, int64_t ne0, int64_t ne1,
                     bm_fill fill)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        bm_tensor *t = realloc(l->t, cap * sizeof *t);
        if (!t)
            return err_set(TD_ENOMEM, "out of memory listing tensors");
        l->t = t;
        l->cap = cap;
    }
    bm_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    TD_ASSERT(strlen(name) < sizeof t->name);
    strcpy(t->name, name);
    t->type = type;
    t->n_dims = ne1 > 0 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1 > 0 ? ne1 : 1;
    t->fill = fill;
    /* Unit-variance inputs give unit-variance outputs: var(U(-a, a)) = a^2 / 3 = 1 / inputs. */
    t->amp = sqrtf(3.0f / (float)ne0);
    return TD_OK;
}

#define BM_ADD(l, type, ne0, ne1, fill, ...)                                               \
    do {                                                                                   \
        char nm_[64];                                                                      \
        snprintf(nm_, sizeof nm_, __VA_ARGS__);                                            \
        TD_TRY(bm_add(l, nm_, type, ne0, ne1, fill));                                      \
    } while (0)

/* The tensors of one full-attention block (a main layer, or the MTP block's layer). */
static td_err bm_attn_block(bm_list *l, const bmodel_shape *s, int64_t il, td_dtype v,
                            td_dtype down)
{
    const int64_t D = s->n_embd, F = s->n_ff;
    const int64_t q_out = s->n_head * s->head_dim, kv_out = s->n_head_kv * s->head_dim;
    BM_ADD(l, TD_Q4_K, D, kv_out, BM_UNIFORM, "blk.%lld.attn_k.weight", (long long)il);
    BM_ADD(l, TD_F32, s->head_dim, 0, BM_ONES, "blk.%lld.attn_k_norm.weight", (long long)il);
    BM_ADD(l, TD_F32, D, 0, BM_ONES, "blk.%lld.attn_norm.weight", (long long)il);
    BM_ADD(l, TD_Q4_K, q_out, D, BM_UNIFORM, "blk.%lld.attn_output.weight", (long long)il);
    BM_ADD(l, TD_Q4_K, D, 2 * q_out, BM_UNIFORM, "blk.%lld.attn_q.weight", (long long)il);
    BM_ADD(l, TD_F32, s->head_dim, 0, BM_ONES, "blk.%lld.attn_q_norm.weight", (long long)il);
    BM_ADD(l, v, D, kv_out, BM_UNIFORM, "blk.%lld.attn_v.weight", (long long)il);
    BM_ADD(l, down, F, D, BM_UNIFORM, "blk.%lld.ffn_down.weight", (long long)il);
    BM_ADD(l, TD_Q4_K, D, F, BM_UNIFORM, "blk.%lld.ffn_gate.weight", (long long)il);
    BM_ADD(l, TD_Q4_K, D, F, BM_UNIFORM, "blk.%lld.ffn_up.weight", (long long)il);
    if (il >= s->n_layer) {
        /* The MTP block's own tensors, as the converter names them. */
        BM_ADD(l, TD_Q4_K, 2 * D, D, BM_UNIFORM, "blk.%lld.nextn.eh_proj.weight", (long long)il);
        BM_ADD(l, TD_F32, D, 0, BM_ONES, "blk.%lld.nextn.enorm.weight", (long long)il);
        BM_ADD(l, TD_F32, D, 0, BM_ONES, "blk.%lld.nextn.hnorm.weight", (long long)il);
        BM_ADD(l, TD_F32, D, 0, BM_ONES, "blk.%lld.nextn.shared_head_norm.weight", (long long)il);
    }
    BM_ADD(l, TD_F32, D, 0, BM_ONES, "blk.%lld.post_attention_norm.weight", (long long)il);
    return TD_OK;
}

/* Every tensor of the file in the converter's order (per block, names sorted). The more-bits
 * counts run over every block that carries the tensor, the MTP block's included, as
 * llama.cpp's quantiser counts the tensors of the file. */
static td_err bm_list_build(bm_list *l, const bmodel_shape *s)
{
    const int64_t D = s->n_embd, F = s->n_ff, inner = s->n_v_head * s->d_state;
    const int64_t conv_ch = 2 * s->n_k_head * s->d_state + inner;
    const int64_t n_block = s->n_layer + s->n_nextn;
    const int64_t n_attn = s->n_layer / s->full_attn_interval + s->n_nextn;
    const int64_t n_delta = s->n_layer - s->n_layer / s->full_attn_interval;
    int64_t i_attn = 0, i_delta = 0;

    TD_TRY(bm_add(l, "token_embd.weight", TD_Q4_K, D, s->n_vocab, BM_UNIFORM));
    l->t[l->n - 1].amp = sqrtf(3.0f); /* embedding rows of unit variance */
    for (int64_t il = 0; il < n_block; il++) {
        bool attn = il >= s->n_layer || (il + 1) % s->full_attn_interval == 0;
        td_dtype down = bm_more_bits(il, n_block) ? TD_Q6_K : TD_Q4_K;
        if (attn) {
            td_dtype v = bm_more_bits(i_attn++, n_attn) ? TD_Q6_K : TD_Q4_K;
            TD_TRY(bm_attn_block(l, s, il, v, down));
            continue;
        }
        td_dtype qkv = bm_more_bits(i_delta++, n_delta) ? TD_Q6_K : TD_Q4_K;
        BM_ADD(l, TD_Q4_K, D, inner, BM_UNIFORM, "blk.%lld.attn_gate.weight", (long long)il);
        BM_ADD(l, TD_F32, D, 0, BM_ONES, "blk.%lld.attn_norm.weight", (long long)il);
        BM_ADD(l, qkv, D, conv_ch, BM_UNIFORM, "blk.%lld.attn_qkv.weight", (long long)il);
        BM_ADD(l, down, F, D, BM_UNIFORM, "blk.%lld.ffn_down.weight", (long long)il);
        BM_ADD(l, TD_Q4_K, D, F, BM_UNIFORM, "blk.%lld.ffn_gate.weight", (long long)il);
        BM_ADD(l, TD_Q4_K, D, F, BM_UNIFORM, "blk.%lld.ffn_up.weight", (long long)il);
        BM_ADD(l, TD_F32, D, 0, BM_ONES, "blk.%lld.post_attention_norm.weight", (long long)il);
        BM_ADD(l, TD_F32, s->n_v_head, 0, BM_SSM_A, "blk.%lld.ssm_a", (long long)il);
        BM_ADD(l, TD_F32, D, s->n_v_head, BM_UNIFORM, "blk.%lld.ssm_alpha.weight", (long long)il);
        BM_ADD(l, TD_F32, D, s->n_v_head, BM_UNIFORM, "blk.%lld.ssm_beta.weight", (long long)il);
        BM_ADD(l, TD_F32, s->conv_k, conv_ch, BM_UNIFORM, "blk.%lld.ssm_conv1d.weight", (long long)il);
        BM_ADD(l, TD_F32, s->n_v_head, 0, BM_DT_BIAS, "blk.%lld.ssm_dt.bias", (long long)il);
        BM_ADD(l, TD_F32, s->d_state, 0, BM_ONES, "blk.%lld.ssm_norm.weight", (long long)il);
        BM_ADD(l, TD_Q5_K, inner, D, BM_UNIFORM, "blk.%lld.ssm_out.weight", (long long)il);
    }
    TD_TRY(bm_add(l, "output_norm.weight", TD_F32, D, 0, BM_ONES));
    TD_TRY(bm_add(l, "output.weight", TD_Q6_K, D, s->n_vocab, BM_UNIFORM));
    return TD_OK;
}

/* --- weights ---------------------------------------------------------------------------- */

/* Quantised matrices are filled with blocks drawn at random from a pool of blocks quantised
 * from uniform values of the tensor's amplitude: every block is a valid block of the
 * quantiser, and drawing costs a copy instead of a quantisation per weight (27 billion
 * weights would take minutes). */
#define BM_POOL_BLOCKS 16384

typedef struct bm_pool {
    td_dtype type;
    float amp;
    size_t block_bytes;  /* bytes of one block */
    uint8_t *blocks;     /* [BM_POOL_BLOCKS][block_bytes] */
} bm_pool;

typedef struct bm_pools {
    bm_pool p[32];
    int n;
} bm_pools;

static void bm_pools_free(bm_pools *ps)
{
    for (int i = 0; i < ps->n; i++)
        free(ps->p[i].blocks);
    ps->n = 0;
}

static td_err bm_pool_get(bm_pools *ps, td_dtype type, float amp, uint64_t seed,
                          const bm_pool **out)
{
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i].type == type && ps->p[i].amp == amp) {
            *out = &ps->p[i];
            return TD_OK;
        }
    TD_ASSERT(ps->n < (int)(sizeof ps->p / sizeof ps->p[0]));
    const dtype_info *dt = dtype_get(type);
    TD_ASSERT(dt && dt->block > 1);
    bm_pool *p = &ps->p[ps->n];
    p->type = type;
    p->amp = amp;
    p->block_bytes = dt->bytes;
    p->blocks = malloc((size_t)BM_POOL_BLOCKS * dt->bytes);
    if (!p->blocks)
        return err_set(TD_ENOMEM, "out of memory for a block pool");
    enum { CHUNK = 64 }; /* blocks quantised per task */
    td_err e = TD_OK;
#pragma omp parallel for schedule(dynamic)
    for (int64_t c = 0; c < BM_POOL_BLOCKS / CHUNK; c++) {
        float x[CHUNK * 256];
        int64_t n = (int64_t)CHUNK * dt->block;
        TD_ASSERT(n <= (int64_t)(sizeof x / sizeof x[0]));
        uint64_t st = bm_mix(seed ^ bm_mix((uint64_t)type * 1000003u + (uint64_t)c));
        for (int64_t i = 0; i < n; i++)
            x[i] = bm_uniform(&st, -amp, amp);
        if (cpu_quantize_row(type, x, p->blocks + (size_t)c * CHUNK * dt->bytes, n) != TD_OK) {
#pragma omp critical
            e = TD_EINVAL;
        }
    }
    if (e != TD_OK) {
        free(p->blocks);
        return err_set(e, "quantising a %s block pool failed", dt->name);
    }
    ps->n++;
    *out = p;
    return TD_OK;
}

static float bm_value(bm_fill fill, float amp, uint64_t *st)
{
    switch (fill) {
    case BM_ONES:
        return 1.0f;
    case BM_UNIFORM:
        return bm_uniform(st, -amp, amp);
    case BM_SSM_A:
        return -bm_uniform(st, 1.0f, 16.0f);
    case BM_DT_BIAS:
        return logf(expm1f(bm_uniform(st, 1e-3f, 0.1f)));
    }
    TD_ASSERT(!"unknown fill");
    return 0.0f;
}

/* Fills dst with tensor t (dtype_bytes of its elements); rows in parallel, each row its own
 * random stream, so the bytes do not depend on the thread count. */
static td_err bm_tensor_fill(uint8_t *dst, const bm_tensor *t, bm_pools *pools, uint64_t seed)
{
    const int64_t rows = t->ne[1], cols = t->ne[0];
    if (t->type == TD_F32) {
        float *f = (float *)dst;
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            uint64_t st = bm_mix(seed ^ bm_mix((uint64_t)r));
            for (int64_t c = 0; c < cols; c++)
                f[r * cols + c] = bm_value(t->fill, t->amp, &st);
        }
        return TD_OK;
    }
    TD_ASSERT(t->fill == BM_UNIFORM);
    const bm_pool *p;
    TD_TRY(bm_pool_get(pools, t->type, t->amp, seed, &p));
    const dtype_info *dt = dtype_get(t->type);
    const int64_t per_row = cols / dt->block;
    const size_t bb = p->block_bytes;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        uint64_t st = bm_mix(seed ^ bm_mix((uint64_t)r));
        uint8_t *row = dst + (size_t)r * (size_t)per_row * bb;
        for (int64_t b = 0; b < per_row; b++)
            memcpy(row + (size_t)b * bb, p->blocks + (bm_next(&st) % BM_POOL_BLOCKS) * bb, bb);
    }
    return TD_OK;
}

/* --- the file ----------------------------------------------------------------------------- */

static void bm_metadata_set(gguf_writer *w, const bmodel_shape *s)
{
    char name[96];
    snprintf(name, sizeof name, "tandem-bench-qwen35-%s", s->name);
    gguf_writer_set_str(w, "general.architecture", "qwen35");
    gguf_writer_set_str(w, "general.type", "model");
    gguf_writer_set_str(w, "general.name", name);
    gguf_writer_set_u32(w, "qwen35.block_count", (uint32_t)(s->n_layer + s->n_nextn));
    gguf_writer_set_u32(w, "qwen35.context_length", (uint32_t)s->n_ctx_train);
    gguf_writer_set_u32(w, "qwen35.embedding_length", (uint32_t)s->n_embd);
    gguf_writer_set_u32(w, "qwen35.feed_forward_length", (uint32_t)s->n_ff);
    gguf_writer_set_u32(w, "qwen35.attention.head_count", (uint32_t)s->n_head);
    gguf_writer_set_u32(w, "qwen35.attention.head_count_kv", (uint32_t)s->n_head_kv);
    gguf_writer_set_f32(w, "qwen35.rope.freq_base", s->rope_theta);
    gguf_writer_set_f32(w, "qwen35.attention.layer_norm_rms_epsilon", s->eps);
    gguf_writer_set_u32(w, "qwen35.attention.key_length", (uint32_t)s->head_dim);
    gguf_writer_set_u32(w, "qwen35.attention.value_length", (uint32_t)s->head_dim);
    gguf_writer_set_arr(w, "qwen35.rope.dimension_sections", GGUF_TYPE_INT32, s->rope_sections, 4);
    gguf_writer_set_u32(w, "qwen35.rope.dimension_count", (uint32_t)s->n_rot);
    gguf_writer_set_u32(w, "qwen35.ssm.conv_kernel", (uint32_t)s->conv_k);
    gguf_writer_set_u32(w, "qwen35.ssm.state_size", (uint32_t)s->d_state);
    gguf_writer_set_u32(w, "qwen35.ssm.group_count", (uint32_t)s->n_k_head);
    gguf_writer_set_u32(w, "qwen35.ssm.time_step_rank", (uint32_t)s->n_v_head);
    gguf_writer_set_u32(w, "qwen35.ssm.inner_size", (uint32_t)(s->n_v_head * s->d_state));
    gguf_writer_set_u32(w, "qwen35.full_attention_interval", (uint32_t)s->full_attn_interval);
    if (s->n_nextn > 0)
        gguf_writer_set_u32(w, "qwen35.nextn_predict_layers", (uint32_t)s->n_nextn);
    gguf_writer_set_u32(w, "general.file_type", 15); /* llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M */
    gguf_writer_set_u32(w, "general.quantization_version", 2);
}

td_err bmodel_build(gguf_writer **out, const bmodel_shape *s, uint64_t seed)
{
    *out = NULL;
    gguf_writer *w = gguf_writer_new();
    if (!w)
        return err_set(TD_ENOMEM, "out of memory");
    bm_metadata_set(w, s);
    bm_list l = {0};
    bm_pools pools = {0};
    uint8_t *buf = NULL;
    td_err e = bmodel_vocab_set(w, s->n_vocab, s->n_pad);
    if (e == TD_OK)
        e = bm_list_build(&l, s);
    /* One scratch buffer of the largest tensor: the writer copies each tensor it is given. */
    uint64_t max_bytes = 0;
    for (size_t i = 0; e == TD_OK && i < l.n; i++) {
        uint64_t bytes = 0;
        e = dtype_bytes(l.t[i].type, (uint64_t)(l.t[i].ne[0] * l.t[i].ne[1]), &bytes);
        if (bytes > max_bytes)
            max_bytes = bytes;
    }
    if (e == TD_OK && !(buf = malloc(max_bytes)))
        e = err_set(TD_ENOMEM, "out of memory for a %llu-byte tensor", (unsigned long long)max_bytes);
    for (size_t i = 0; e == TD_OK && i < l.n; i++) {
        const bm_tensor *t = &l.t[i];
        uint64_t bytes = 0;
        dtype_bytes(t->type, (uint64_t)(t->ne[0] * t->ne[1]), &bytes);
        e = bm_tensor_fill(buf, t, &pools, bm_mix(seed + i));
        if (e == TD_OK)
            e = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, buf, bytes);
    }
    free(buf);
    bm_pools_free(&pools);
    free(l.t);
    if (e != TD_OK) {
        gguf_writer_free(w);
        return err_wrap(e, "building the %s model", s->name);
    }
    *out = w;
    return TD_OK;
}

/* --- the drafter's dimensions ------------------------------------------------------------ */

void bmodel_drafter_init(bmodel_drafter *d, const bmodel_shape *s, int64_t n_embd, int64_t n_ff,
                         int64_t n_vocab, int64_t n_target_layers)
{
    memset(d, 0, sizeof *d);
    d->n_layer = s->d_layer;
    d->hidden = n_embd;
    d->ffn = n_ff;
    d->n_head = s->d_head;
    d->n_head_kv = s->d_head_kv;
    d->head_dim = s->d_head_dim;
    d->block = s->d_block;
    d->vocab = n_vocab;
    d->mask_token = bmodel_mask_token(s) < n_vocab ? bmodel_mask_token(s) : n_vocab - 1;
    d->n_target_layers = n_target_layers;
    bool fits = true;
    for (int64_t i = 0; i < s->d_n_taps; i++)
        fits = fits && s->d_taps[i] < n_target_layers;
    if (fits) {
        d->n_taps = s->d_n_taps;
        memcpy(d->taps, s->d_taps, sizeof d->taps);
    }
    d->rope_theta = s->rope_theta;
    d->eps = s->eps;
}
