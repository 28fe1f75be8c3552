/* cuda_attention against cpu_attention (the oracle) over the shapes the engine runs: decode
 * over long contexts (split keys), verify blocks of 16 and 64 queries with causal and tree
 * masks, prefill chunks, GQA groups (also wider than one block's rows), f32 and f16 caches,
 * padded cache rows, sliding windows, bidirectional blocks, the output gate, queries that
 * see no key; and the batch invariance greedy speculative decoding needs: a query's output
 * is bit-identical alone (decode), in a verify block, in a long prefill chunk, and under a
 * chain-shaped tree mask, whatever rows per block the kernel takes; the tensor-core kernel
 * of the drafter's blocks against the CPU and the staged kernel. Skips (77) without CUDA or a
 * device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cuda_mem.h"
#include "kernels/ops.h"
#include "tests/support/gpu_check.h"

#define SKIP_EXIT 77

#ifndef TANDEM_HAVE_CUDA

GPU_CHECK_SKIP_MAIN

#else

#include <cuda_runtime_api.h>

GPU_CHECK_SANITIZER_OPTIONS

typedef enum att_keys {
    KEYS_CTX_THEN_BLOCK, /* ctx context keys at 0..ctx-1, then the queries' own keys */
    KEYS_NONE,           /* n_kv = 0 */
    KEYS_AFTER_QUERIES,  /* every key later than every query: causal sees nothing */
    KEYS_LATER_MASKED,   /* keys at 0..n_kv-1, queries from ctx/2: causal masks the rest */
} att_keys;

typedef struct att_case {
    const char *name;
    int64_t n_q, n_head, n_head_kv, head_dim, ctx;
    ops_mask_kind mask;
    int32_t window;
    td_dtype kv_type;
    bool gated;    /* qwen35 layout: per head D query values then D gate values */
    bool kv_pad;   /* cache rows further apart than n_head_kv * head_dim */
    att_keys keys;
    bool chain;    /* OPS_MASK_TREE: a chain (each node's parent is the previous one) */
} att_case;

/* Host data of a case; a.* point into it. */
typedef struct att_host {
    ops_attn a;
    size_t q_n, kv_n, bits_n; /* elements of q, of k (and v), words of tree_bits */
} att_host;

static void att_build(const att_case *c, att_host *h)
{
    memset(h, 0, sizeof *h);
    ops_attn *a = &h->a;
    const int64_t D = c->head_dim;
    a->n_q = c->n_q, a->n_head = c->n_head, a->n_head_kv = c->n_head_kv, a->head_dim = D;
    a->scale = 1.0f / sqrtf((float)D);
    a->q_head_stride = c->gated ? 2 * D : D;
    a->q_tok_stride = c->n_head * a->q_head_stride;
    h->q_n = (size_t)(c->n_q * a->q_tok_stride);
    /* |q| <= 2, |k| <= 1: scaled scores spread ~0.7, so the softmax is neither flat nor one-hot */
    float *q = rng_floats((int64_t)h->q_n, 2.0f);
    a->q = q;
    if (c->gated) {
        a->gate = q + D;
        a->gate_tok_stride = a->q_tok_stride;
        a->gate_head_stride = a->q_head_stride;
    }
    a->n_kv = c->keys == KEYS_NONE ? 0 : c->ctx + c->n_q;
    a->kv_head_stride = D;
    a->kv_tok_stride = c->n_head_kv * D + (c->kv_pad ? 24 : 0);
    a->kv_type = c->kv_type;
    h->kv_n = (size_t)(a->n_kv * a->kv_tok_stride);
    float *k = rng_floats((int64_t)h->kv_n, 1.0f), *v = rng_floats((int64_t)h->kv_n, 1.0f);
    if (c->kv_type == TD_F16) {
        uint16_t *k16 = malloc(h->kv_n * 2 + 2), *v16 = malloc(h->kv_n * 2 + 2);
        for (size_t i = 0; i < h->kv_n; i++)
            k16[i] = ops_f32_to_f16(k[i]), v16[i] = ops_f32_to_f16(v[i]);
        free(k), free(v);
        a->k = k16, a->v = v16;
    } else {
        a->k = k, a->v = v;
    }

    /* block positions: ctx + index, or ctx + depth in the tree */
    int32_t *q_pos = malloc((size_t)c->n_q * 4), *k_pos = malloc((size_t)(a->n_kv + 1) * 4);
    int64_t *parent = malloc((size_t)c->n_q * 8);
    int32_t *depth = malloc((size_t)c->n_q * 4);
    for (int64_t j = 0; j < c->n_q; j++) {
        parent[j] = j == 0 ? -1 : c->chain ? j - 1 : (int64_t)(rng_u64() % (uint64_t)j);
        depth[j] = parent[j] < 0 ? 0 : depth[parent[j]] + 1;
        const int32_t off = c->mask == OPS_MASK_TREE ? depth[j] : (int32_t)j;
        q_pos[j] = (int32_t)c->ctx + off;
        if (c->keys == KEYS_AFTER_QUERIES)
            q_pos[j] = off;
        if (c->keys == KEYS_LATER_MASKED)
            q_pos[j] = (int32_t)(c->ctx / 2) + off;
    }
    for (int64_t i = 0; i < a->n_kv; i++) {
        const int64_t j = i - c->ctx;
        k_pos[i] = j < 0 ? (int32_t)i : q_pos[j];
        if (c->keys == KEYS_AFTER_QUERIES)
            k_pos[i] = (int32_t)(c->n_q + 10 + i);
        if (c->keys == KEYS_LATER_MASKED)
            k_pos[i] = (int32_t)i;
    }
    a->q_pos = q_pos, a->k_pos = k_pos;
    a->mask = c->mask;
    a->window = c->window;
    if (c->mask == OPS_MASK_TREE) {
        const int64_t words = (c->n_q + 63) / 64;
        h->bits_n = (size_t)(c->n_q * words);
        uint64_t *bits = calloc(h->bits_n, 8);
        for (int64_t t = 0; t < c->n_q; t++)
            for (int64_t j = t; j >= 0; j = parent[j]) /* itself and its ancestors */
                bits[t * words + j / 64] |= 1ull << (j % 64);
        a->n_tree = c->n_q;
        a->tree_bits = bits;
    }
    free(parent);
    free(depth);
}

static void att_host_free(att_host *h)
{
    free((void *)h->a.q), free((void *)h->a.k), free((void *)h->a.v);
    free((void *)h->a.q_pos), free((void *)h->a.k_pos), free((void *)h->a.tree_bits);
}

/* A copy of h->a with every array on the device (out unset). */
static ops_attn att_upload(const att_host *h)
{
    ops_attn d = h->a;
    const size_t kv_bytes = h->kv_n * (h->a.kv_type == TD_F16 ? 2 : 4);
    d.q = dput(h->a.q, h->q_n * 4);
    d.gate = h->a.gate ? d.q + (h->a.gate - h->a.q) : NULL;
    d.k = dput(h->a.k, kv_bytes);
    d.v = dput(h->a.v, kv_bytes);
    d.q_pos = dput(h->a.q_pos, (size_t)h->a.n_q * 4);
    d.k_pos = dput(h->a.k_pos, (size_t)h->a.n_kv * 4);
    d.tree_bits = h->a.tree_bits ? dput(h->a.tree_bits, h->bits_n * 8) : NULL;
    return d;
}

static void att_dev_free(ops_attn *d)
{
    cuda_mem_free((void *)d->q), cuda_mem_free((void *)d->k), cuda_mem_free((void *)d->v);
    cuda_mem_free((void *)d->q_pos), cuda_mem_free((void *)d->k_pos);
    cuda_mem_free((void *)d->tree_bits);
}

/* Runs d into a poisoned output; returns the host copy [n_q][n_head][head_dim]. */
static float *att_run(ops_attn d)
{
    const size_t bytes = (size_t)(d.n_q * d.n_head * d.head_dim) * 4;
    d.out = dpoison(bytes);
    GPU_OK(cuda_attention(&d, gpu_st));
    float *got = dget(d.out, bytes);
    cuda_mem_free(d.out);
    return got;
}

/* Both sides sum f32 dot products (in different orders), the CPU then keeps p and the value
 * sums in f64, the GPU in f32 over splits of 128 keys folded in f32: the difference is a few
 * 1e-6 of max|v| = 1 for these shapes. 2e-5 absolute leaves room and still fails any
 * masking, scaling or indexing mistake, which moves outputs by ~1e-2 or more. */
#define ATT_ATOL 2e-5f

/* Builds case c into h and returns the CPU's output for it (n_out values). */
static float *att_reference(const att_case *c, att_host *h, int64_t *n_out)
{
    att_build(c, h);
    *n_out = c->n_q * c->n_head * c->head_dim;
    float *ref = malloc((size_t)(*n_out + 1) * 4);
    assert_non_null(ref);
    h->a.out = ref;
    cpu_attention(&h->a);
    return ref;
}

static void att_check(const att_case *c)
{
    att_host h;
    int64_t n_out = 0;
    float *ref = att_reference(c, &h, &n_out);
    ops_attn d = att_upload(&h);
    float *got = att_run(d);
    if (!check_close(c->name, got, ref, n_out, 0, ATT_ATOL))
        fail_msg("attention case %s differs from the CPU", c->name);
    if (c->keys == KEYS_NONE || c->keys == KEYS_AFTER_QUERIES)
        for (int64_t i = 0; i < n_out; i++)
            assert_true(got[i] == 0.0f); /* a query that sees no key gets zeros */
    free(got);
    free(ref);
    att_dev_free(&d);
    att_host_free(&h);
}

static void test_attention_decode_over_long_contexts(void **state)
{
    (void)state;
    static const att_case cs[] = {
        /* qwen35 full-attention layer: 24 heads over 4 kv heads of 256, gated, f16 cache */
        {"decode 5000 keys", 1, 24, 4, 256, 4999, OPS_MASK_CAUSAL, 0, TD_F16, true, false, 0, 0},
        {"decode 1 key", 1, 4, 4, 64, 0, OPS_MASK_CAUSAL, 0, TD_F32, false, false, 0, 0},
        {"decode 128 keys", 1, 8, 2, 128, 127, OPS_MASK_CAUSAL, 0, TD_F32, false, true, 0, 0},
        {"decode 129 keys", 1, 8, 2, 128, 128, OPS_MASK_CAUSAL, 0, TD_F16, false, false, 0, 0},
        {"decode window 2048", 1, 32, 8, 128, 3000, OPS_MASK_CAUSAL, 2048, TD_F16, false, false,
         0, 0},
        {"decode head_dim 16", 1, 2, 1, 16, 700, OPS_MASK_CAUSAL, 0, TD_F32, true, false, 0, 0},
    };
    rng_seed(11);
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        att_check(&cs[i]);
}

static void test_attention_verify_blocks_causal_and_tree(void **state)
{
    (void)state;
    static const att_case cs[] = {
        {"verify 16", 16, 32, 8, 128, 300, OPS_MASK_CAUSAL, 0, TD_F16, false, true, 0, 0},
        {"verify 64 qwen35", 64, 24, 4, 256, 1000, OPS_MASK_CAUSAL, 0, TD_F16, true, false, 0, 0},
        {"tree 16", 16, 32, 8, 128, 200, OPS_MASK_TREE, 0, TD_F16, false, false, 0, 0},
        {"tree 64", 64, 8, 8, 64, 130, OPS_MASK_TREE, 0, TD_F32, true, false, 0, 0},
        {"tree 70 (two mask words)", 70, 4, 2, 16, 40, OPS_MASK_TREE, 0, TD_F32, false, false, 0,
         0},
        {"tree 16 window 8", 16, 4, 1, 64, 100, OPS_MASK_TREE, 8, TD_F16, false, false, 0, 0},
    };
    rng_seed(12);
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        att_check(&cs[i]);
}

static void test_attention_prefill_windows_and_bidirectional(void **state)
{
    (void)state;
    static const att_case cs[] = {
        {"prefill 64 window 16", 64, 2, 1, 16, 0, OPS_MASK_CAUSAL, 16, TD_F32, false, false, 0,
         0},
        {"prefill 200 over 300", 200, 8, 4, 64, 300, OPS_MASK_CAUSAL, 0, TD_F16, true, true, 0,
         0},
        /* DFlash drafter block: every context key and all block keys */
        {"bidirectional 16", 16, 32, 8, 128, 500, OPS_MASK_BIDIRECTIONAL, 0, TD_F32, false,
         false, 0, 0},
        {"bidirectional 16 window 100", 16, 32, 8, 128, 500, OPS_MASK_BIDIRECTIONAL, 100,
         TD_F16, false, false, 0, 0},
        /* a GQA group wider than one block's 16 rows */
        {"group of 32", 3, 32, 1, 64, 200, OPS_MASK_CAUSAL, 0, TD_F32, false, false, 0, 0},
        {"no keys", 4, 4, 2, 32, 0, OPS_MASK_CAUSAL, 0, TD_F32, true, false, KEYS_NONE, 0},
        {"no visible key", 5, 4, 2, 32, 300, OPS_MASK_CAUSAL, 0, TD_F16, true, false,
         KEYS_AFTER_QUERIES, 0},
    };
    rng_seed(13);
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        att_check(&cs[i]);
}

/* Sets variable name to val (NULL: unsets it); returns its old value for env_restore. */
static char *env_swap(const char *name, const char *val)
{
    const char *saved = getenv(name);
    char *keep = saved ? strdup(saved) : NULL;
    if (val)
        setenv(name, val, 1);
    else
        unsetenv(name);
    return keep;
}

/* Gives name back the value env_swap returned (and frees it). */
static void env_restore(const char *name, char *keep)
{
    if (keep)
        setenv(name, keep, 1);
    else
        unsetenv(name);
    free(keep);
}

/* Runs d with variable name set to val (NULL: unset), then restores the variable. */
static float *att_run_env(ops_attn d, const char *name, const char *val)
{
    char *keep = env_swap(name, val);
    float *got = att_run(d);
    env_restore(name, keep);
    return got;
}

/* The same with two variables. */
static float *att_run_env2(ops_attn d, const char *n1, const char *v1, const char *n2,
                           const char *v2)
{
    char *keep = env_swap(n1, v1);
    float *got = att_run_env(d, n2, v2);
    env_restore(n1, keep);
    return got;
}

/* The same 16 queries computed as a decode step each (n_kv up to the query itself), as one
 * verify block (split keys, folded by the combine kernel), as the tail of a 256-query
 * prefill chunk (512 blocks: each block folds its splits itself) and under a chain tree mask:
 * every bit equal; and the CPU within tolerance where cpu_too. On an f16 cache the same with
 * the fold in chunks of splits: the verify block and the prefill chunk folding chunks in
 * their blocks (TANDEM_ATT_CHUNKS=on), each decode step handing the combine a partial per
 * split (auto). */
static void bit_identity(int64_t D, int64_t ctx, bool cpu_too)
{
    const int64_t n_head = 32, n_head_kv = 8, B = 16, P = 256;
    /* the prefill chunk covers positions ctx+B-P .. ctx+B-1; its last B are the block */
    const att_case chunk = {"chunk", P, n_head, n_head_kv, D, ctx + B - P, OPS_MASK_CAUSAL, 0,
                            TD_F16, true, false, 0, 0};
    att_host h;
    att_build(&chunk, &h);
    ops_attn d = att_upload(&h);
    const int64_t row = n_head * D; /* output values per query */
    float *pre = att_run(d);

    ops_attn blk = d; /* the last B queries over the same keys */
    blk.n_q = B;
    blk.q = d.q + (P - B) * d.q_tok_stride;
    blk.gate = d.gate + (P - B) * d.gate_tok_stride;
    blk.q_pos = d.q_pos + (P - B);
    float *ver = att_run(blk);
    assert_true(check_same_bits("verify block vs prefill chunk", ver, pre + (P - B) * row,
                                (size_t)(B * row) * 4));
    if (D == 128 || D == 256) { /* the tensor-core kernel's head sizes */
        float *ver_c = att_run_env(blk, "TANDEM_ATT_CHUNKS", "on");
        float *pre_c = att_run_env(d, "TANDEM_ATT_CHUNKS", "on");
        float *ver_s = att_run_env(blk, "TANDEM_ATT_CHUNKS", "split");
        assert_true(check_same_bits("chunks: verify block vs prefill chunk", ver_c,
                                    pre_c + (P - B) * row, (size_t)(B * row) * 4));
        assert_true(check_same_bits("chunks: folded in blocks vs in the combine", ver_c, ver_s,
                                    (size_t)(B * row) * 4));
        for (int64_t t = 0; t < B; t++) {
            ops_attn one = blk;
            one.n_q = 1;
            one.q = blk.q + t * d.q_tok_stride;
            one.gate = blk.gate + t * d.gate_tok_stride;
            one.q_pos = blk.q_pos + t;
            one.n_kv = ctx + t + 1;
            float *dec = att_run_env(one, "TANDEM_ATT_CHUNKS", "auto");
            char what[64];
            snprintf(what, sizeof what, "chunks: decode query %lld vs verify block", (long long)t);
            assert_true(check_same_bits(what, dec, ver_c + t * row, (size_t)row * 4));
            free(dec);
        }
        if (cpu_too) {
            float *ref = malloc((size_t)(P * row) * 4);
            h.a.out = ref;
            cpu_attention(&h.a);
            assert_true(check_close("chunks: prefill chunk vs CPU", pre_c, ref, P * row, 0,
                                    ATT_ATOL));
            free(ref);
        }
        free(ver_s);
        free(pre_c);
        free(ver_c);
    }

    for (int64_t t = 0; t < B; t++) {
        ops_attn one = blk; /* decode: the cache ends at the query's own key */
        one.n_q = 1;
        one.q = blk.q + t * d.q_tok_stride;
        one.gate = blk.gate + t * d.gate_tok_stride;
        one.q_pos = blk.q_pos + t;
        one.n_kv = ctx + t + 1;
        float *dec = att_run(one);
        char what[64];
        snprintf(what, sizeof what, "decode query %lld vs verify block", (long long)t);
        assert_true(check_same_bits(what, dec, ver + t * row, (size_t)row * 4));
        free(dec);
    }

    /* a chain tree over the block is the causal mask again */
    uint64_t chain[16];
    for (int64_t t = 0; t < B; t++)
        chain[t] = (2ull << t) - 1; /* itself and every earlier block key */
    ops_attn tree = blk;
    tree.mask = OPS_MASK_TREE;
    tree.n_tree = B;
    tree.tree_bits = dput(chain, sizeof chain);
    float *tr = att_run(tree);
    assert_true(check_same_bits("chain tree vs causal", tr, ver, (size_t)(B * row) * 4));
    cuda_mem_free((void *)tree.tree_bits);

    if (cpu_too) { /* and the CPU agrees with all of them */
        float *ref = malloc((size_t)(P * row) * 4);
        h.a.out = ref;
        cpu_attention(&h.a);
        assert_true(check_close("prefill chunk vs CPU", pre, ref, P * row, 0, ATT_ATOL));
        free(ref);
    }
    free(tr);
    free(ver);
    free(pre);
    att_dev_free(&d);
    att_host_free(&h);
}

/* 1000 keys of head_dim 128 (8 splits), and 70000 keys of head_dim 40 (547 splits: the
 * combine kernel folds them in two rounds, and 24 of its 64 threads hold no value). */
static void test_attention_query_is_bit_identical_alone_in_block_and_in_chunk(void **state)
{
    (void)state;
    rng_seed(14);
    bit_identity(128, 1000, true);
    bit_identity(256, 600, true);
    bit_identity(40, 70000, false);
}

/* One run of a series that must agree bit for bit: the first (*first NULL) is held to the
 * CPU's ref and kept in *first, every later one must have its bits and is freed. */
static void series_check(const char *what, float *got, float **first, const float *ref,
                         int64_t n_out)
{
    if (!*first) {
        if (!check_close(what, got, ref, n_out, 0, ATT_ATOL))
            fail_msg("attention case %s differs from the CPU", what);
        *first = got;
        return;
    }
    assert_true(check_same_bits(what, got, *first, (size_t)n_out * 4));
    free(got);
}

/* The staged kernel's rows per block (TANDEM_ATT_ROWS=2, 4, 8, 16; by default chosen from
 * the grid) only share out the work: decode, verify, tree, drafter and folding prefill
 * calls give the same bits under every size, and agree with the CPU. */
static void test_attention_rows_per_block_change_no_bit(void **state)
{
    (void)state;
    static const att_case cs[] = {
        {"decode 1000 qwen35", 1, 24, 4, 256, 999, OPS_MASK_CAUSAL, 0, TD_F16, true, false, 0,
         0},
        {"verify 16 qwen35", 16, 24, 4, 256, 700, OPS_MASK_CAUSAL, 0, TD_F16, true, false, 0, 0},
        {"drafter 16", 16, 32, 8, 128, 400, OPS_MASK_BIDIRECTIONAL, 0, TD_F32, false, true, 0,
         0},
        {"tree 16 f32 256", 16, 8, 2, 256, 300, OPS_MASK_TREE, 0, TD_F32, true, false, 0, 0},
        {"decode head_dim 64, 3 rows", 1, 3, 1, 64, 900, OPS_MASK_CAUSAL, 0, TD_F32, false,
         false, 0, 0},
        /* 512 blocks of 16 rows: each folds its splits itself */
        {"prefill 256 folding", 256, 32, 8, 64, 200, OPS_MASK_CAUSAL, 0, TD_F16, true, false,
         0, 0},
        /* 32 splits, the last 16 masked for every row: their partials are empty */
        {"decode, later keys masked", 1, 24, 4, 256, 4000, OPS_MASK_CAUSAL, 0, TD_F16, true,
         false, KEYS_LATER_MASKED, 0},
    };
    static const char *const rows[] = {NULL, "2", "4", "8", "16"};
    char *keep = env_swap("TANDEM_ATT_ROWS", NULL);
    rng_seed(15);
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const att_case *c = &cs[i];
        att_host h;
        int64_t n_out = 0;
        float *ref = att_reference(c, &h, &n_out);
        ops_attn d = att_upload(&h);
        float *first = NULL;
        for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
            free(env_swap("TANDEM_ATT_ROWS", rows[k]));
            float *got = att_run(d);
            char what[96];
            snprintf(what, sizeof what, "%s, rows %s", c->name, rows[k] ? rows[k] : "auto");
            series_check(what, got, &first, ref, n_out);
        }
        free(first);
        free(ref);
        att_dev_free(&d);
        att_host_free(&h);
    }
    env_restore("TANDEM_ATT_ROWS", keep);
}

static float *att_run_mma(ops_attn d, const char *val)
{
    return att_run_env(d, "TANDEM_ATT_MMA", val);
}

/* Runs d on a tensor-core kernel (*got) and on the staged kernel (*staged,
 * TANDEM_ATT_MMA=0), both held to the CPU's ref; differ: and the two sums differ, so the
 * switch really changes the kernel. */
static void att_run_both(const char *name, ops_attn d, const float *ref, int64_t n_out,
                         bool differ, float **got, float **staged)
{
    char what[128];
    *got = att_run_mma(d, NULL);
    *staged = att_run_mma(d, "0");
    snprintf(what, sizeof what, "%s: tensor cores vs CPU", name);
    if (!check_close(what, *got, ref, n_out, 0, ATT_ATOL))
        fail_msg("attention case %s differs from the CPU", what);
    snprintf(what, sizeof what, "%s: staged vs CPU", name);
    if (!check_close(what, *staged, ref, n_out, 0, ATT_ATOL))
        fail_msg("attention case %s differs from the CPU", what);
    if (differ)
        assert_true(memcmp(*got, *staged, (size_t)n_out * 4) != 0);
}

/* The tensor-core kernel of f16 caches (head_dim 128 and 256: every call of such a model)
 * against the CPU and against the staged kernel it replaces there (TANDEM_ATT_MMA=0); its
 * bits do not change with the rows per block (TANDEM_ATT_ROWS=8, 16), or when a call whose
 * partials would be too many runs as several over ranges of queries (TANDEM_ATT_SCRATCH_MAX
 * lowered), or when each block walks several splits (TANDEM_ATT_SPLIT_Z=1, 3); the fold in
 * chunks of splits (TANDEM_ATT_CHUNKS=split, auto, on) gives one set of bits under all three
 * and every walk, within the CPU's tolerance; with the key count read from the device (a
 * recorded step's launch sized for the whole cache), they are the bits of the call launched
 * for exactly those keys. Cases: splits whose last
 * 16-key step is partial, splits no row sees (later keys masked, a window), GQA groups of
 * 1 to 8, trees and verify blocks, padded cache rows, large and tiny queries. */
static void test_attention_f16_tensor_core_kernel(void **state)
{
    (void)state;
    static const att_case cs[] = {
        /* 40 splits, the last of 8 keys */
        {"decode 5000 qwen35", 1, 24, 4, 256, 4999, OPS_MASK_CAUSAL, 0, TD_F16, true, false, 0,
         0},
        {"decode, later keys masked", 1, 24, 4, 256, 4000, OPS_MASK_CAUSAL, 0, TD_F16, true,
         false, KEYS_LATER_MASKED, 0},
        {"verify 16 over 3000", 16, 24, 4, 256, 3000, OPS_MASK_CAUSAL, 0, TD_F16, true, false,
         0, 0},
        {"tree 16, head_dim 256", 16, 8, 2, 256, 1000, OPS_MASK_TREE, 0, TD_F16, true, false, 0,
         0},
        {"decode head_dim 128, no GQA, padded", 1, 3, 3, 128, 2000, OPS_MASK_CAUSAL, 0, TD_F16,
         false, true, 0, 0},
        {"decode head_dim 128, half a split", 1, 16, 2, 128, 1087, OPS_MASK_CAUSAL, 0, TD_F16,
         false, false, 0, 0},
        {"decode, window 300", 1, 24, 4, 256, 3000, OPS_MASK_CAUSAL, 300, TD_F16, true, false,
         0, 0},
        {"prefill 64 over 200", 64, 24, 4, 256, 200, OPS_MASK_CAUSAL, 0, TD_F16, true, false, 0,
         0},
        {"bidirectional 16, window 100", 16, 8, 2, 128, 500, OPS_MASK_BIDIRECTIONAL, 100, TD_F16,
         false, false, 0, 0},
    };
    static const char *const rows[] = {"8", "16"};
    char *keep_rows = env_swap("TANDEM_ATT_ROWS", NULL);
    rng_seed(17);
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const att_case *c = &cs[i];
        att_host h;
        int64_t n_out = 0;
        float *ref = att_reference(c, &h, &n_out);
        if (i == 1) { /* heads 0 and 1 of the query scaled by 2^17 (past f16's range) and
                       * 2^-20: each row is split at its own scale */
            float *q = (float *)h.a.q;
            for (int64_t k = 0; k < c->head_dim; k++) {
                q[k] *= 131072.0f;
                q[h.a.q_head_stride + k] *= 0x1p-20f;
            }
            h.a.out = ref;
            cpu_attention(&h.a);
        }
        ops_attn d = att_upload(&h);
        char what[128];
        float *got = NULL, *staged = NULL;
        att_run_both(c->name, d, ref, n_out, i == 0, &got, &staged);
        for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
            float *o = att_run_env(d, "TANDEM_ATT_ROWS", rows[k]);
            snprintf(what, sizeof what, "%s: rows %s", c->name, rows[k]);
            assert_true(check_same_bits(what, o, got, (size_t)n_out * 4));
            free(o);
        }
        static const char *const zs[] = {"1", "3"};
        for (size_t k = 0; k < sizeof zs / sizeof zs[0]; k++) {
            float *o = att_run_env(d, "TANDEM_ATT_SPLIT_Z", zs[k]);
            snprintf(what, sizeof what, "%s: %s blocks along the splits", c->name, zs[k]);
            assert_true(check_same_bits(what, o, got, (size_t)n_out * 4));
            free(o);
        }
        /* the fold in chunks of splits: the same bits whoever folds a chunk (the combine:
         * split; the blocks where each has a chunk: auto; the blocks: on), however many
         * blocks walk the keys, and within the CPU's tolerance */
        static const char *const chunks[] = {"split", "auto", "on"};
        float *two = NULL;
        for (size_t m = 0; m < sizeof chunks / sizeof chunks[0]; m++) {
            float *o = att_run_env(d, "TANDEM_ATT_CHUNKS", chunks[m]);
            snprintf(what, sizeof what, "%s: chunks %s", c->name, chunks[m]);
            series_check(what, o, &two, ref, n_out);
            for (size_t k = 0; k < sizeof zs / sizeof zs[0]; k++) {
                o = att_run_env2(d, "TANDEM_ATT_CHUNKS", chunks[m], "TANDEM_ATT_SPLIT_Z", zs[k]);
                snprintf(what, sizeof what, "%s: chunks %s, %s blocks along the splits",
                         c->name, chunks[m], zs[k]);
                assert_true(check_same_bits(what, o, two, (size_t)n_out * 4));
                free(o);
            }
        }
        free(two);
        { /* partials for 3 queries (or 1) at a time: several calls */
            const int64_t per_q = (int64_t)((h.a.n_kv + 127) / 128) * c->n_head * (c->head_dim + 2) * 4;
            char cap[32];
            snprintf(cap, sizeof cap, "%lld", (long long)(3 * per_q + 5));
            float *o = att_run_env(d, "TANDEM_ATT_SCRATCH_MAX", cap);
            snprintf(what, sizeof what, "%s: queries in ranges", c->name);
            assert_true(check_same_bits(what, o, got, (size_t)n_out * 4));
            free(o);
        }
        /* 4300 of the 5000 keys, their count on the device; and 300 */
        static const int32_t uses[] = {4300, 300};
        for (size_t u = 0; i == 0 && u < sizeof uses / sizeof uses[0]; u++) {
            const int32_t n_use = uses[u];
            ops_attn dev = d, exact = d;
            dev.n_kv_dev = dput(&n_use, sizeof n_use);
            exact.n_kv = n_use;
            exact.q_pos = dev.k_pos + n_use - 1; /* the last key in use is the query's own */
            dev.q_pos = exact.q_pos;
            float *want = att_run(exact), *o = att_run(dev);
            snprintf(what, sizeof what, "%d keys on the device", (int)n_use);
            assert_true(check_same_bits(what, o, want, (size_t)n_out * 4));
            float *oz = att_run_env(dev, "TANDEM_ATT_SPLIT_Z", "3"); /* walking past the count */
            snprintf(what, sizeof what, "%d keys on the device, 3 blocks along", (int)n_use);
            assert_true(check_same_bits(what, oz, want, (size_t)n_out * 4));
            free(oz);
            /* in chunks: 3 blocks along 34 splits (4300 keys) fold chunks of them, along 3
             * splits (300 keys) hand over splits, decided from the count on the device */
            float *want_c = att_run_env(exact, "TANDEM_ATT_CHUNKS", "auto");
            float *oc = att_run_env2(dev, "TANDEM_ATT_CHUNKS", "auto", "TANDEM_ATT_SPLIT_Z", "3");
            snprintf(what, sizeof what, "%d keys on the device, chunks", (int)n_use);
            assert_true(check_same_bits(what, oc, want_c, (size_t)n_out * 4));
            free(oc);
            free(want_c);
            /* the count matters: the call over all 5000 keys differs */
            assert_true(memcmp(want, got, (size_t)n_out * 4) != 0);
            free(want), free(o);
            cuda_mem_free((void *)dev.n_kv_dev);
        }
        free(got);
        free(staged);
        free(ref);
        att_dev_free(&d);
        att_host_free(&h);
    }
    env_restore("TANDEM_ATT_ROWS", keep_rows);
}

/* The tensor-core kernel (bidirectional blocks over an f32 cache, head_dim 64 and 128: the
 * DFlash drafter) against the CPU and against the staged kernel it replaces there
 * (TANDEM_ATT_MMA=0), over 16, 32 and 64 rows per block, partial row tiles, splits of 1, 16
 * and 128 keys, windows that hide whole splits, padded cache rows and the output gate; and a
 * query gives the same bits alone as in its block. */
static void test_attention_tensor_core_kernel(void **state)
{
    (void)state;
    static const att_case cs[] = {
        /* 16 rows of 64 per kv head: a block any device holds (an sm_86 block too) */
        {"4 queries x 8/2 x 64 over 300", 4, 8, 2, 64, 296, OPS_MASK_BIDIRECTIONAL, 0, TD_F32,
         false, false, 0, 0},
        /* the 27B drafter: 64 rows per kv head, 1040 keys (the last split holds 16) */
        {"drafter 16 x 32/8 x 128 over 1040", 16, 32, 8, 128, 1024, OPS_MASK_BIDIRECTIONAL, 0,
         TD_F32, false, false, 0, 0},
        {"5 queries x 4 heads of 64 over 305", 5, 8, 2, 64, 300, OPS_MASK_BIDIRECTIONAL, 0,
         TD_F32, false, false, 0, 0},
        {"40 queries, no GQA, 3 tiles", 40, 8, 8, 128, 90, OPS_MASK_BIDIRECTIONAL, 0, TD_F32,
         false, false, 0, 0},
        {"1 query, 1 key", 1, 4, 4, 64, 0, OPS_MASK_BIDIRECTIONAL, 0, TD_F32, false, false, 0,
         0},
        {"exactly 128 keys", 16, 4, 1, 128, 112, OPS_MASK_BIDIRECTIONAL, 0, TD_F32, false,
         false, 0, 0},
        {"window 100, padded rows", 16, 8, 2, 128, 500, OPS_MASK_BIDIRECTIONAL, 100, TD_F32,
         false, true, 0, 0},
        {"gated, head_dim 64", 16, 8, 2, 64, 129, OPS_MASK_BIDIRECTIONAL, 0, TD_F32, true,
         false, 0, 0},
    };
    /* The drafter's 64 rows of head_dim 128 take 198 KB of shared memory: an H100's or H200's
     * block holds them, an sm_86 block (99 KB, or TANDEM_SMEM_OPTIN=101376) does not, and
     * there the staged kernel runs them. */
    int dev = 0;
    assert_int_equal(cudaGetDevice(&dev), cudaSuccess);
    const bool roomy = cuda_smem_optin(dev) >= 200 * 1024;
    rng_seed(16);
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const att_case *c = &cs[i];
        att_host h;
        int64_t n_out = 0;
        float *ref = att_reference(c, &h, &n_out);
        ops_attn d = att_upload(&h);
        float *got = NULL, *staged = NULL;
        att_run_both(c->name, d, ref, n_out, i == 0 || (i == 1 && roomy), &got, &staged);
        char what[128];
        const int64_t row = c->n_head * c->head_dim;
        for (int64_t t = 0; t < c->n_q; t += c->n_q > 8 ? 7 : 1) {
            ops_attn one = d;
            one.n_q = 1;
            one.q = d.q + t * d.q_tok_stride;
            one.gate = d.gate ? d.gate + t * d.gate_tok_stride : NULL;
            one.q_pos = d.q_pos + t;
            float *alone = att_run_mma(one, NULL);
            snprintf(what, sizeof what, "%s: query %lld alone vs in the block", c->name,
                     (long long)t);
            assert_true(check_same_bits(what, alone, got + t * row, (size_t)row * 4));
            free(alone);
        }
        free(got);
        free(staged);
        free(ref);
        att_dev_free(&d);
        att_host_free(&h);
    }
}

int main(void)
{
    if (!gpu_check_init())
        return SKIP_EXIT;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_decode_over_long_contexts),
        cmocka_unit_test(test_attention_verify_blocks_causal_and_tree),
        cmocka_unit_test(test_attention_prefill_windows_and_bidirectional),
        cmocka_unit_test(test_attention_query_is_bit_identical_alone_in_block_and_in_chunk),
        cmocka_unit_test(test_attention_rows_per_block_change_no_bit),
        cmocka_unit_test(test_attention_tensor_core_kernel),
        cmocka_unit_test(test_attention_f16_tensor_core_kernel),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gpu_check_free();
    return rc;
}

#endif /* TANDEM_HAVE_CUDA */
