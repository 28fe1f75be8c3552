/* The synthetic model of `tandem bench`: the tiny shape's GGUF (written by the command, as
 * another engine would read it) loads as a qwen35 target, every tensor has the type llama.cpp's
 * Q4_K_M rule gives it, its tokenizer loads and encodes to the ids the layout implies, its chat
 * template is the Qwen3.5 one, a forward pass gives finite logits, and the synthetic drafter
 * loads against it and proposes finite logits.
 *
 * Needs $TANDEM_BUILD_DIR/tandem (skipped when it is not built). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/gguf.h"
#include "common/tokenizer.h"
#include "draftd/dflash.h"
#include "tests/support/tmp_dir.h"
#include "verifyd/target.h"

static char bt_tandem[1024];
static char bt_dir[64];
static char bt_model[128];
static char bt_draft[128];

static int bt_run(const char *args)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s >/dev/null 2>&1", bt_tandem, args);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int bt_setup(void **state)
{
    (void)state;
    if (!tmp_dir_make(bt_dir, sizeof bt_dir, "tbm"))
        return -1;
    snprintf(bt_model, sizeof bt_model, "%s/tiny.gguf", bt_dir);
    snprintf(bt_draft, sizeof bt_draft, "%s/draft", bt_dir);
    char args[512];
    snprintf(args, sizeof args, "bench --shape tiny --build-only --save %s --save-draft %s",
             bt_model, bt_draft);
    return bt_run(args) == 0 ? 0 : -1;
}

static int bt_teardown(void **state)
{
    (void)state;
    return tmp_dir_remove(bt_dir) ? 0 : -1;
}

/* --- the target -------------------------------------------------------------------------- */

static void test_tiny_gguf_loads_as_a_qwen35_target(void **state)
{
    (void)state;
    tgt_model *m;
    assert_int_equal(tgt_load(&m, bt_model), TD_OK);
    const tgt_hparams *hp = &m->hp;
    assert_int_equal(hp->arch, TGT_ARCH_QWEN35);
    assert_int_equal(hp->n_layer, 8); /* block_count 9 minus the MTP block */
    assert_int_equal(hp->n_embd, 256);
    assert_int_equal(hp->n_ff, 512);
    assert_int_equal(hp->n_vocab, 1024);
    assert_int_equal(hp->n_head, 4);
    assert_int_equal(hp->n_head_kv, 2);
    assert_int_equal(hp->head_dim, 64);
    assert_int_equal(hp->n_rot, 16);
    assert_int_equal(hp->full_attn_interval, 4);
    assert_int_equal(hp->conv_k, 4);
    assert_int_equal(hp->d_k, 64);
    assert_int_equal(hp->d_v, 64);
    assert_int_equal(hp->n_k_head, 2);
    assert_int_equal(hp->n_v_head, 4);
    assert_int_equal(hp->n_ctx_train, 262144);
    assert_true(hp->rope_theta == 1e7f);
    assert_true(hp->eps == 1e-6f);
    assert_int_equal(m->n_attn_layers, 2);
    assert_int_equal(m->n_delta_layers, 6);
    assert_int_equal(m->layers[3].kind, TGT_LAYER_ATTN);
    assert_int_equal(m->layers[7].kind, TGT_LAYER_ATTN);
    assert_int_equal(m->layers[6].kind, TGT_LAYER_DELTA);
    tgt_free(m);
}

/* The Q4_K_M type of every tensor of the tiny shape (8 main layers, attention at 3 and 7,
 * then the MTP block 8), worked out by hand from use_more_bits(i, n) = i < n/8 || i >= 7n/8 ||
 * (i - n/8) % 3 == 2 over the blocks that carry the tensor: ffn_down (n = 9) at blocks
 * 0, 3, 6, 7, 8; attn_v (n = 3: blocks 3, 7, 8) at its third, block 8; attn_qkv (n = 6,
 * DeltaNet layers 0, 1, 2, 4, 5, 6) at its third and sixth, layers 2 and 6. */
static td_dtype bt_expected_type(const char *name)
{
    int layer;
    char part[64];
    if (!strcmp(name, "token_embd.weight"))
        return TD_Q4_K;
    if (!strcmp(name, "output.weight"))
        return TD_Q6_K;
    if (!strcmp(name, "output_norm.weight"))
        return TD_F32;
    if (sscanf(name, "blk.%d.%63s", &layer, part) != 2)
        return TD_DTYPE_LIMIT;
    if (!strcmp(part, "ffn_down.weight"))
        return layer == 0 || layer == 3 || layer == 6 || layer >= 7 ? TD_Q6_K : TD_Q4_K;
    if (!strcmp(part, "attn_v.weight"))
        return layer == 8 ? TD_Q6_K : TD_Q4_K;
    if (layer == 8 && !strcmp(part, "nextn.eh_proj.weight"))
        return TD_Q4_K;
    if (layer == 8 && (!strcmp(part, "nextn.enorm.weight") || !strcmp(part, "nextn.hnorm.weight") ||
                       !strcmp(part, "nextn.shared_head_norm.weight")))
        return TD_F32;
    if (!strcmp(part, "attn_qkv.weight"))
        return layer == 2 || layer == 6 ? TD_Q6_K : TD_Q4_K;
    if (!strcmp(part, "ssm_out.weight"))
        return TD_Q5_K;
    static const char *const q4[] = {"attn_q.weight", "attn_k.weight", "attn_output.weight",
                                     "attn_gate.weight", "ffn_gate.weight", "ffn_up.weight"};
    for (size_t i = 0; i < sizeof q4 / sizeof q4[0]; i++)
        if (!strcmp(part, q4[i]))
            return TD_Q4_K;
    static const char *const f32[] = {"attn_norm.weight", "post_attention_norm.weight",
                                      "attn_q_norm.weight", "attn_k_norm.weight", "ssm_a",
                                      "ssm_dt.bias", "ssm_conv1d.weight", "ssm_norm.weight",
                                      "ssm_alpha.weight", "ssm_beta.weight"};
    for (size_t i = 0; i < sizeof f32 / sizeof f32[0]; i++)
        if (!strcmp(part, f32[i]))
            return TD_F32;
    return TD_DTYPE_LIMIT;
}

static void test_tensor_types_follow_the_q4_k_m_rule(void **state)
{
    (void)state;
    gguf_file *g;
    assert_int_equal(gguf_open(&g, bt_model), TD_OK);
    /* token_embd, output_norm, output; 11 tensors per attention layer, 14 per DeltaNet one,
     * 15 for the MTP block (an attention layer and its 4 nextn tensors), as the converter
     * writes them. */
    assert_int_equal(g->n_tensors, 3 + 2 * 11 + 6 * 14 + 15);
    int n_q6 = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        td_dtype want = bt_expected_type(t->name);
        if (want != t->type)
            fail_msg("%s is %s, expected %s", t->name, dtype_name(t->type), dtype_name(want));
        n_q6 += t->type == TD_Q6_K;
    }
    assert_int_equal(n_q6, 5 + 1 + 2 + 1); /* ffn_down, attn_v, attn_qkv, output */
    const gguf_tensor *t = gguf_find_tensor(g, "blk.8.nextn.eh_proj.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 2 * 256);
    assert_int_equal(t->ne[1], 256);
    t = gguf_find_tensor(g, "blk.2.attn_qkv.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 256);
    assert_int_equal(t->ne[1], 2 * 2 * 64 + 4 * 64); /* q, k (2 heads x 64), v (4 x 64) */
    t = gguf_find_tensor(g, "blk.3.attn_q.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[1], 2 * 4 * 64); /* query and gate per head */
    t = gguf_find_tensor(g, "blk.0.ssm_conv1d.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 4);
    assert_int_equal(t->ne[1], 512);
    uint32_t u;
    assert_int_equal(gguf_get_u32(g, "qwen35.block_count", &u), TD_OK);
    assert_int_equal(u, 9);
    assert_int_equal(gguf_get_u32(g, "qwen35.nextn_predict_layers", &u), TD_OK);
    assert_int_equal(u, 1);
    assert_int_equal(gguf_get_u32(g, "general.file_type", &u), TD_OK);
    assert_int_equal(u, 15);
    const gguf_value *sec;
    assert_int_equal(gguf_get_arr(g, "qwen35.rope.dimension_sections", &sec), TD_OK);
    assert_int_equal(sec->arr.elem, GGUF_TYPE_INT32);
    assert_int_equal(sec->arr.n, 4);
    gguf_close(g);
}

/* The converter's tiny qwen35 file has the same layer pattern (8 main layers, interval 4, one
 * MTP block): every tensor name of one is in the other. */
static void test_tensor_names_match_the_converters_file(void **state)
{
    (void)state;
    gguf_file *g, *ref;
    assert_int_equal(gguf_open(&g, bt_model), TD_OK);
    assert_int_equal(gguf_open(&ref, "tests/data/models/qwen35-tiny-f32.gguf"), TD_OK);
    assert_int_equal(g->n_tensors, ref->n_tensors);
    for (uint64_t i = 0; i < ref->n_tensors; i++) {
        const gguf_tensor *r = &ref->tensors[i], *t = gguf_find_tensor(g, r->name);
        if (!t)
            fail_msg("%s of the converter's file is missing", r->name);
        assert_int_equal(t->n_dims, r->n_dims);
    }
    gguf_close(ref);
    gguf_close(g);
}

static void test_weights_are_finite_with_unit_norms(void **state)
{
    (void)state;
    gguf_file *g;
    assert_int_equal(gguf_open(&g, bt_model), TD_OK);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        int64_t n = t->ne[0] * t->ne[1];
        float *x = malloc((size_t)n * sizeof *x);
        assert_non_null(x);
        assert_int_equal(cpu_dequantize_row(t->type, t->data, x, n), TD_OK);
        double sum2 = 0;
        for (int64_t k = 0; k < n; k++) {
            if (!isfinite(x[k]))
                fail_msg("%s[%lld] is not finite", t->name, (long long)k);
            sum2 += (double)x[k] * x[k];
        }
        if (strstr(t->name, "norm.weight"))
            assert_true(sum2 == (double)n); /* every norm weight is exactly 1 */
        else if (t->n_dims == 2) {
            /* Unit-variance outputs: mean square 1 / ne[0] (embedding rows: 1), within
             * quantisation error. */
            double ms = sum2 / (double)n;
            if (strcmp(t->name, "token_embd.weight"))
                ms *= (double)t->ne[0];
            if (ms < 0.8 || ms > 1.25)
                fail_msg("%s: mean square %.3f of the unit-variance scale", t->name, ms);
        }
        free(x);
    }
    gguf_close(g);
}

static void test_forward_pass_gives_finite_logits(void **state)
{
    (void)state;
    tgt_model *m;
    assert_int_equal(tgt_load(&m, bt_model), TD_OK);
    tgt_state s;
    assert_int_equal(tgt_state_init(&s, m, 64), TD_OK);
    const int32_t tokens[6] = {257, 724, 3, 993, 1000, 42};
    float *logits = malloc(6 * 1024 * sizeof *logits);
    assert_non_null(logits);
    tgt_out out = {.logits = logits};
    assert_int_equal(tgt_forward(m, &s, tokens, 6, false, &out), TD_OK);
    for (int p = 0; p < 6; p++) {
        double sum = 0, sum2 = 0;
        for (int v = 0; v < 1024; v++) {
            float x = logits[p * 1024 + v];
            if (!isfinite(x))
                fail_msg("logit %d of position %d is not finite", v, p);
            sum += x, sum2 += (double)x * x;
        }
        double var = sum2 / 1024 - (sum / 1024) * (sum / 1024);
        assert_true(var > 0.01); /* real spread, not a constant */
    }
    free(logits);
    tgt_state_free(&s);
    tgt_free(m);
}

/* --- the tokenizer --------------------------------------------------------------------- */

static void test_tokenizer_loads_with_the_layout_ids(void **state)
{
    (void)state;
    gguf_file *g;
    tokenizer *t;
    assert_int_equal(gguf_open(&g, bt_model), TD_OK);
    assert_int_equal(tok_load_gguf(&t, g), TD_OK);
    assert_int_equal(tok_n_vocab(t), 1024);
    assert_int_equal(tok_pre_of(t), TOK_PRE_QWEN35);
    /* 256 byte tokens + 736 merged = 992, then <|endoftext|> <|im_start|> <|im_end|> ... */
    assert_int_equal(tok_id_of(t, "<|endoftext|>", 13), 992);
    assert_int_equal(tok_id_of(t, "<|im_start|>", 12), 993);
    assert_int_equal(tok_id_of(t, "<|im_end|>", 10), 994);
    assert_int_equal(tok_id_of(t, "<think>", 7), 1016);
    assert_int_equal(tok_id_of(t, "</think>", 8), 1017);
    assert_int_equal(tok_type_of(t, 993), TOK_TYPE_CONTROL);
    assert_int_equal(tok_type_of(t, 1016), TOK_TYPE_USER_DEFINED);
    assert_int_equal(tok_type_of(t, 1018), TOK_TYPE_UNUSED); /* [PAD1018]: the drafter's mask */
    const tok_specials *sp = tok_specials_of(t);
    assert_int_equal(sp->eos, 994);
    assert_int_equal(sp->eot, 994);
    assert_int_equal(sp->bos, 992);
    assert_false(sp->add_bos);

    /* " the": merges by rank "Ġ t" (rank 1) then "h e" (rank 468, row of h = 9th letter) give
     * Ġt = 256 + 1 and he = 256 + 468; "Ġt he" is no merge. */
    tok_ids ids = {0};
    assert_int_equal(tok_encode(t, " the", 4, 0, &ids), TD_OK);
    assert_int_equal(ids.n, 2);
    assert_int_equal(ids.ids[0], 257);
    assert_int_equal(ids.ids[1], 724);
    ids.n = 0;
    const char *text = "<|im_start|>user\nHello, World! \xc3\xa9t\xc3\xa9 42<|im_end|>";
    assert_int_equal(tok_encode(t, text, strlen(text), 0, &ids), TD_OK);
    assert_int_equal(ids.ids[0], 993);
    assert_int_equal(ids.ids[ids.n - 1], 994);
    tok_bytes back = {0};
    assert_int_equal(tok_decode(t, ids.ids, ids.n, 0, &back), TD_OK);
    assert_string_equal(back.ptr, text);
    /* Byte tokens in the alphabet's code point order: the 188 printable bytes first ('!' is
     * 0, 0xFF is 187), then U+0100.. for the others (byte 0 is 188, 255 is U+0143). */
    static const struct { int32_t id; const char *text; } bytes[] = {
        {0, "!"}, {93, "~"}, {94, "\xc2\xa1"}, {187, "\xc3\xbf"}, {188, "\xc4\x80"},
        {255, "\xc5\x83"},
    };
    for (size_t i = 0; i < sizeof bytes / sizeof bytes[0]; i++) {
        tok_str s = tok_text_of(t, bytes[i].id);
        assert_int_equal(s.len, strlen(bytes[i].text));
        assert_memory_equal(s.ptr, bytes[i].text, s.len);
    }
    /* "\xc3\xa9" is the byte tokens of 0xC3 (id 106 + 0xC3 - 174) and 0xA9 (94 + 0xA9 - 161). */
    ids.n = 0;
    assert_int_equal(tok_encode(t, "\xc3\xa9", 2, 0, &ids), TD_OK);
    assert_int_equal(ids.n, 2);
    assert_int_equal(ids.ids[0], 127);
    assert_int_equal(ids.ids[1], 102);
    tok_ids_free(&ids);
    tok_bytes_free(&back);
    tok_free(t);
    gguf_close(g);
}

static void test_chat_template_is_the_qwen35_one(void **state)
{
    (void)state;
    FILE *f = fopen("tests/data/chat/Qwen3.5-4B.jinja", "rb");
    assert_non_null(f);
    static char want[65536];
    size_t n = fread(want, 1, sizeof want, f);
    fclose(f);
    assert_true(n > 1000 && n < sizeof want);
    gguf_file *g;
    gguf_str tpl;
    assert_int_equal(gguf_open(&g, bt_model), TD_OK);
    assert_int_equal(gguf_get_str(g, "tokenizer.chat_template", &tpl), TD_OK);
    assert_int_equal(tpl.len, n);
    assert_memory_equal(tpl.ptr, want, n);
    gguf_close(g);
}

/* --- the drafter ----------------------------------------------------------------------- */

static void test_drafter_loads_and_proposes_finite_logits(void **state)
{
    (void)state;
    tgt_model *m;
    assert_int_equal(tgt_load(&m, bt_model), TD_OK);
    dfl_model *d;
    assert_int_equal(dfl_load(&d, bt_draft, 8, &m->tok_embd, &m->output), TD_OK);
    assert_int_equal(d->cfg.n_layers, 2);
    assert_int_equal(d->cfg.hidden, 256);
    assert_int_equal(d->cfg.n_heads, 4);
    assert_int_equal(d->cfg.n_kv_heads, 2);
    assert_int_equal(d->cfg.head_dim, 64);
    assert_int_equal(d->cfg.block_size, 16);
    assert_int_equal(d->cfg.mask_token_id, 1018);
    assert_int_equal(d->cfg.n_taps, 2);
    assert_int_equal(d->cfg.target_layer_ids[0], 1);
    assert_int_equal(d->cfg.target_layer_ids[1], 5);

    /* Context from the target's own tap features of a few tokens. */
    tgt_state s;
    assert_int_equal(tgt_state_init(&s, m, 64), TD_OK);
    const int32_t tokens[4] = {257, 724, 3, 993};
    const int32_t taps[2] = {1, 5};
    float *feat = malloc(4 * 2 * 256 * sizeof *feat);
    float *logits = malloc(15 * 1024 * sizeof *logits);
    assert_non_null(feat);
    assert_non_null(logits);
    tgt_out out = {.taps = taps, .n_taps = 2, .tap_out = feat};
    assert_int_equal(tgt_forward(m, &s, tokens, 4, false, &out), TD_OK);
    dfl_state ds;
    assert_int_equal(dfl_state_init(&ds, d, 64), TD_OK);
    assert_int_equal(dfl_add_context(d, &ds, feat, 4), TD_OK);
    assert_int_equal(dfl_propose(d, &ds, 42, 15, logits), TD_OK);
    for (int i = 0; i < 15 * 1024; i++)
        if (!isfinite(logits[i]))
            fail_msg("drafter logit %d is not finite", i);
    free(feat);
    free(logits);
    dfl_state_free(&ds);
    dfl_free(d);
    tgt_state_free(&s);
    tgt_free(m);
}

static void test_unknown_shape_and_missing_save_are_refused(void **state)
{
    (void)state;
    assert_int_equal(bt_run("bench --shape 70b --build-only --save /tmp/never.gguf"), 2);
    assert_int_equal(bt_run("bench --shape tiny --build-only"), 2);
    assert_int_equal(access("/tmp/never.gguf", F_OK), -1);
}

int main(void)
{
    const char *build = getenv("TANDEM_BUILD_DIR");
    snprintf(bt_tandem, sizeof bt_tandem, "%s/tandem", build ? build : "build");
    if (access(bt_tandem, X_OK) != 0) {
        fprintf(stderr, "test_bench_model: %s is not built; skipping\n", bt_tandem);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_gguf_loads_as_a_qwen35_target),
        cmocka_unit_test(test_tensor_types_follow_the_q4_k_m_rule),
        cmocka_unit_test(test_tensor_names_match_the_converters_file),
        cmocka_unit_test(test_weights_are_finite_with_unit_norms),
        cmocka_unit_test(test_forward_pass_gives_finite_logits),
        cmocka_unit_test(test_tokenizer_loads_with_the_layout_ids),
        cmocka_unit_test(test_chat_template_is_the_qwen35_one),
        cmocka_unit_test(test_drafter_loads_and_proposes_finite_logits),
        cmocka_unit_test(test_unknown_shape_and_missing_save_are_refused),
    };
    return cmocka_run_group_tests(tests, bt_setup, bt_teardown);
}
