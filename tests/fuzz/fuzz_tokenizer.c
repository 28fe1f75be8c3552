/* Fuzz target: the tokenizer on hostile input. The first byte picks what the rest is:
 *   even: a text (any bytes) for a small fixed vocabulary; bits 1-2 pick the encode flags.
 *         Encoding must succeed with ids inside the vocabulary and never UNUSED ones; whole
 *         and streaming decode (chunk sizes taken from the text) must agree; an ASCII text
 *         without '<' must decode back to itself.
 *   odd:  a GGUF image: tok_load_gguf either refuses it with a message or gives a tokenizer
 *         that encodes and decodes a sample text.
 * Invariants are TD_ASSERTs, so a broken one is a crash the fuzzer reports; over-reads are
 * caught by the sanitizers. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"
#include "common/tokenizer.h"

enum { FUZZ_N_EXTRA = 9, FUZZ_N_TOKENS = 256 + FUZZ_N_EXTRA };

static const char *const fuzz_extra[FUZZ_N_EXTRA] = {
    "\xc4\xa0t", "he", "\xc4\xa0the", "in", "ing", "<|im_start|>", "<|im_end|>", "<think>", "[PAD]",
};
static const int32_t fuzz_extra_type[FUZZ_N_EXTRA] = {1, 1, 1, 1, 1, 3, 3, 4, 5};
static const char *const fuzz_merges[] = {"\xc4\xa0 t", "h e", "\xc4\xa0t he", "i n", "in g"};

static tokenizer *fuzz_vocab(void)
{
    static tokenizer *t;
    if (t)
        return t;
    static char chars[256][3];
    static tok_str tokens[FUZZ_N_TOKENS];
    static int32_t types[FUZZ_N_TOKENS];
    static tok_str merges[sizeof fuzz_merges / sizeof fuzz_merges[0]];
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        uint32_t cp = keep ? (uint32_t)b : next++;
        size_t n = 1;
        if (cp < 0x80) {
            chars[b][0] = (char)cp;
        } else {
            chars[b][0] = (char)(0xc0 | (cp >> 6));
            chars[b][1] = (char)(0x80 | (cp & 0x3f));
            n = 2;
        }
        tokens[b] = (tok_str){chars[b], n};
        types[b] = TOK_TYPE_NORMAL;
    }
    for (int i = 0; i < FUZZ_N_EXTRA; i++) {
        tokens[256 + i] = (tok_str){fuzz_extra[i], strlen(fuzz_extra[i])};
        types[256 + i] = fuzz_extra_type[i];
    }
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++)
        merges[i] = (tok_str){fuzz_merges[i], strlen(fuzz_merges[i])};
    tok_desc d = {
        .pre = TOK_PRE_QWEN35, .n_tokens = FUZZ_N_TOKENS, .tokens = tokens, .types = types,
        .n_merges = sizeof merges / sizeof merges[0], .merges = merges,
        .specials = {.bos = 256 + 5, .eos = 256 + 6, .eot = -1, .pad = -1, .unk = -1, .add_bos = true},
    };
    TD_ASSERT(tok_init(&t, &d) == TD_OK);
    return t;
}

static void fuzz_text(const uint8_t *s, size_t n, unsigned mode)
{
    tokenizer *t = fuzz_vocab();
    unsigned flags = ((mode >> 1) & 1 ? TOK_ENC_ADD_SPECIAL : 0) | ((mode >> 2) & 1 ? TOK_ENC_SPLIT_SPECIAL : 0);
    tok_ids ids = {0};
    TD_ASSERT(tok_encode(t, (const char *)s, n, flags, &ids) == TD_OK);
    for (size_t i = 0; i < ids.n; i++) {
        TD_ASSERT(ids.ids[i] >= 0 && (uint32_t)ids.ids[i] < tok_n_vocab(t));
        TD_ASSERT(tok_type_of(t, ids.ids[i]) != TOK_TYPE_UNUSED);
    }
    tok_bytes whole = {0}, streamed = {0};
    TD_ASSERT(tok_decode(t, ids.ids, ids.n, 0, &whole) == TD_OK);
    tok_stream st;
    tok_stream_init(&st, t, 0);
    for (size_t i = 0, k = 0; i < ids.n; i += k) {
        k = 1 + (n ? s[i % n] % 5 : 0);
        if (k > ids.n - i)
            k = ids.n - i;
        TD_ASSERT(tok_stream_push(&st, ids.ids + i, k, &streamed) == TD_OK);
    }
    TD_ASSERT(tok_stream_flush(&st, &streamed) == TD_OK);
    TD_ASSERT(streamed.len == whole.len && (whole.len == 0 || memcmp(streamed.ptr, whole.ptr, whole.len) == 0));
    bool plain = !(flags & TOK_ENC_ADD_SPECIAL);
    for (size_t i = 0; i < n && plain; i++)
        plain = s[i] < 0x80 && s[i] != '<';
    if (plain)
        TD_ASSERT(whole.len == n && (n == 0 || memcmp(whole.ptr, s, n) == 0));
    tok_ids_free(&ids);
    tok_bytes_free(&whole);
    tok_bytes_free(&streamed);
}

static void fuzz_gguf(const uint8_t *s, size_t n)
{
    gguf_file *g = NULL;
    if (gguf_open_memory(&g, s, n) != TD_OK)
        return;
    tokenizer *t = NULL;
    if (tok_load_gguf(&t, g) == TD_OK) {
        static const char sample[] = "Hi <|im_start|> the \xf0\x9f\x98\x80 \xff";
        tok_ids ids = {0};
        tok_bytes text = {0};
        TD_ASSERT(tok_encode(t, sample, sizeof sample - 1, TOK_ENC_ADD_SPECIAL, &ids) == TD_OK);
        TD_ASSERT(tok_decode(t, ids.ids, ids.n, 0, &text) == TD_OK);
        tok_ids_free(&ids);
        tok_bytes_free(&text);
        tok_free(t);
    } else {
        TD_ASSERT(t == NULL && err_msg()[0] != '\0');
    }
    gguf_close(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (data[0] & 1)
        fuzz_gguf(data + 1, size - 1);
    else
        fuzz_text(data + 1, size - 1, data[0]);
    return 0;
}
