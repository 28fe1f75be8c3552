/* The synthetic tokenizer of the benchmark model: a byte-level BPE vocabulary (GPT-2 scheme,
 * pre-tokeniser qwen35) of exactly the model's vocabulary size, laid out like Qwen's:
 *
 *   [0, 256)                  one token per byte, in the alphabet's code point order
 *   [256, n_base)             merged tokens: two letters, then a merged token plus a letter,
 *                             one level at a time (a leading space is the alphabet's 'Ġ'), so
 *                             every merge joins two existing tokens into a new one
 *   [n_base, n_base + 26)     the Qwen added tokens (<|endoftext|>, <|im_start|>, <|im_end|> ...)
 *   [n_base + 26, n_vocab)    [PADi] rows (UNUSED), as the converter pads the embedding
 *
 * Real text encodes to multi-byte tokens and decodes back, and llama.cpp's loader accepts it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_model.h"
#include "common/tokenizer.h"

#define BV_N_ADDED 26

/* Qwen's added tokens in id order; <|...|> are special (CONTROL), the tags plain text that
 * is still split out (USER_DEFINED). */
static const char *const bv_added[BV_N_ADDED] = {
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
};
enum { BV_ENDOFTEXT = 0, BV_IM_END = 2 };

/* Letters merged into longer tokens, most frequent English letters first; index 0 is the
 * space, which only ever starts a token (the pre-tokeniser attaches it to the next word). */
static const char bv_letters[] = " etaoinsrhldcumfpgwybvkxjqzETAOINSRHLDCUMFPGWYBVKXJQZ";

/* GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68
 * bytes take U+0100 onwards in byte order. */
static bool bv_printable(unsigned b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

static unsigned bv_byte_cp(unsigned b)
{
    if (bv_printable(b))
        return b;
    unsigned n = 0;
    for (unsigned c = 0; c < b; c++)
        n += !bv_printable(c);
    return 256 + n;
}

/* UTF-8 of a code point below U+0800 (the alphabet's range). */
static size_t bv_utf8(unsigned cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

typedef struct bv_arena {
    char *p;        /* [cap] NUL-terminated strings back to back */
    size_t used;    /* bytes */
    size_t cap;     /* bytes */
} bv_arena;

static const char *bv_put(bv_arena *a, const char *x, const char *sep, const char *y)
{
    size_t nx = strlen(x), ns = strlen(sep), ny = strlen(y);
    TD_ASSERT(a->used + nx + ns + ny + 1 <= a->cap);
    char *s = a->p + a->used;
    memcpy(s, x, nx);
    memcpy(s + nx, sep, ns);
    memcpy(s + nx + ns, y, ny + 1);
    a->used += nx + ns + ny + 1;
    return s;
}

td_err bmodel_vocab_set(gguf_writer *w, int64_t n_vocab, int64_t n_pad)
{
    const int64_t n_base = n_vocab - BV_N_ADDED - n_pad;
    const int64_t n_merges = n_base - 256;
    if (n_pad < 0 || n_base < 256 || n_vocab > INT32_MAX)
        return err_set(TD_EINVAL, "a vocabulary of %lld tokens with %lld padding rows has no room "
                       "for the 256 byte tokens and %d added tokens", (long long)n_vocab,
                       (long long)n_pad, BV_N_ADDED);
    /* Merged tokens are at most 8 letters of 2 bytes here (4 levels reach 7 million). */
    bv_arena a = {.cap = (size_t)n_vocab * 24 + (size_t)n_merges * 40};
    a.p = malloc(a.cap);
    const char **tokens = malloc((size_t)n_vocab * sizeof *tokens);
    const char **merges = malloc((size_t)(n_merges ? n_merges : 1) * sizeof *merges);
    int32_t *types = malloc((size_t)n_vocab * sizeof *types);
    int32_t *level = malloc((size_t)(n_merges + 64) * sizeof *level); /* ids of the last level */
    td_err e = TD_OK;
    if (!a.p || !tokens || !merges || !types || !level) {
        e = err_set(TD_ENOMEM, "out of memory for a %lld-token vocabulary", (long long)n_vocab);
        goto done;
    }

    /* Byte tokens in code point order; letter l of bv_letters is token letter_id[l]. */
    int64_t id = 0;
    int32_t letter_id[sizeof bv_letters];
    for (unsigned pass = 0; pass < 2; pass++)
        for (unsigned b = 0; b < 256; b++) {
            if (bv_printable(b) != (pass == 0))
                continue;
            char u[3] = {0};
            bv_utf8(bv_byte_cp(b), u);
            for (size_t l = 0; l < sizeof bv_letters - 1; l++)
                if ((unsigned char)bv_letters[l] == b)
                    letter_id[l] = (int32_t)id;
            types[id] = TOK_TYPE_NORMAL;
            tokens[id++] = bv_put(&a, u, "", "");
        }

    /* Merged tokens, level by level: level 2 pairs every letter (the space included) with
     * every letter but the space; level k+1 extends each level-k token by such a letter. */
    const int64_t n_letters = (int64_t)sizeof bv_letters - 1;
    int64_t lv_begin = 0, lv_end = 0, n_made = 0;
    for (int64_t l = 0; l < n_letters; l++)
        level[lv_end++] = letter_id[l];
    while (n_made < n_merges) {
        int64_t next_end = lv_end;
        for (int64_t i = lv_begin; i < lv_end && n_made < n_merges; i++)
            for (int64_t l = 1; l < n_letters && n_made < n_merges; l++) {
                const char *left = tokens[level[i]], *right = tokens[letter_id[l]];
                merges[n_made++] = bv_put(&a, left, " ", right);
                types[id] = TOK_TYPE_NORMAL;
                tokens[id] = bv_put(&a, left, "", right);
                level[next_end++] = (int32_t)id++;
            }
        lv_begin = lv_end;
        lv_end = next_end;
    }
    TD_ASSERT(id == n_base);

    for (int64_t i = 0; i < BV_N_ADDED; i++) {
        types[id] = bv_added[i][1] == '|' ? TOK_TYPE_CONTROL : TOK_TYPE_USER_DEFINED;
        tokens[id++] = bv_added[i];
    }
    for (; id < n_vocab; id++) {
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%lld]", (long long)id);
        types[id] = TOK_TYPE_UNUSED;
        tokens[id] = bv_put(&a, pad, "", "");
    }

    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen35");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, (uint64_t)n_vocab);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)n_vocab);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, (uint64_t)n_merges);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)(n_base + BV_ENDOFTEXT));
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(n_base + BV_IM_END));
    gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)(n_base + BV_IM_END));
    gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)(n_base + BV_ENDOFTEXT));
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    gguf_writer_set_str(w, "tokenizer.chat_template", bmodel_chat_template);
done:
    free(level);
    free(types);
    free(merges);
    free(tokens);
    free(a.p);
    return e;
}
