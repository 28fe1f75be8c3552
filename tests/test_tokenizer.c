/* Tokenizer on a tiny hand-made vocabulary with exact expected ids: merge priority, the
 * pre-tokeniser regexes, added-token longest match before NFC, bytes through the GPT-2 byte
 * table, invalid UTF-8, decoding and streaming UTF-8 buffering, refusal of bad vocabularies,
 * and loading from GGUF metadata. Comparison with Hugging Face on a real Qwen vocabulary is
 * tests/py/test_tokenizer_hf.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"
#include "common/tokenizer.h"

/* --- the vocabulary ------------------------------------------------------------------- */
/* Ids 0..255 are the one-character tokens of bytes 0..255 (id = byte), then these. */
enum {
    ID_GW = 256,      /* "Ġw": a space glued to the next word */
    ID_BC,            /* "bc" */
    ID_AB,            /* "ab" */
    ID_ABC,           /* "abc" = a + bc */
    ID_AA,            /* "aa" */
    ID_AAAA,          /* "aaaa" */
    ID_QM,            /* "'M" */
    ID_L9F98,         /* bytes 9F 98: "Łĺ" in the byte alphabet */
    ID_IM_START,      /* <|im_start|>, CONTROL */
    ID_IM,            /* <|im, USER_DEFINED: a prefix of the one above */
    ID_THINK,         /* <think>, USER_DEFINED */
    ID_PAD,           /* [PAD], UNUSED */
    ID_MZ,            /* "Mz" */
    ID_E_ACUTE_DECOMP,/* "e" U+0301 (decomposed), USER_DEFINED: matched before NFC */
    ID_IM_END,        /* <|im_end|>, CONTROL */
    ID_X_CC,          /* "x" + byte CC: a letter and the first byte of U+0301 */
    ID_12,            /* "12": never made, digits are split one by one */
    N_TOKENS
};

static const char *const extra_tokens[] = {
    "\xc4\xa0w", "bc", "ab", "abc", "aa", "aaaa", "'M", "\xc5\x81\xc4\xba", "<|im_start|>",
    "<|im", "<think>", "[PAD]", "Mz", "e\xcc\x81", "<|im_end|>", "x\xc3\x8c", "12",
};

/* Lowest rank first. */
static const char *const merges_default[] = {
    "b c", "a b", "a bc", "a a", "aa aa", "\xc4\xa0 w", "M z", "' M", "\xc5\x81 \xc4\xba", "x \xc3\x8c", "1 2",
};
/* The same merges with "a b" before "b c". */
static const char *const merges_ab_first[] = {
    "a b", "b c", "a bc", "a a", "aa aa", "\xc4\xa0 w", "M z", "' M", "\xc5\x81 \xc4\xba", "x \xc3\x8c", "1 2",
};

typedef struct vocab {
    char byte_chars[256][3]; /* UTF-8 of each byte's character */
    tok_str tokens[N_TOKENS];
    int32_t types[N_TOKENS];
    tok_str merges[16];
} vocab;

/* GPT-2's bytes_to_unicode, written out as its reference defines it: printable bytes keep
 * their code point, the rest get 256, 257, ... in byte order. */
static void vocab_fill(vocab *v, const char *const *merges, size_t n_merges, tok_desc *d, tok_pre pre)
{
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        uint32_t cp = keep ? (uint32_t)b : next++;
        char *p = v->byte_chars[b];
        size_t len;
        if (cp < 0x80) {
            p[0] = (char)cp;
            len = 1;
        } else {
            p[0] = (char)(0xc0 | (cp >> 6));
            p[1] = (char)(0x80 | (cp & 0x3f));
            len = 2;
        }
        v->tokens[b] = (tok_str){p, len};
        v->types[b] = TOK_TYPE_NORMAL;
    }
    for (int i = 256; i < N_TOKENS; i++) {
        v->tokens[i] = (tok_str){extra_tokens[i - 256], strlen(extra_tokens[i - 256])};
        v->types[i] = TOK_TYPE_NORMAL;
    }
    v->types[ID_IM_START] = TOK_TYPE_CONTROL;
    v->types[ID_IM_END] = TOK_TYPE_CONTROL;
    v->types[ID_IM] = TOK_TYPE_USER_DEFINED;
    v->types[ID_THINK] = TOK_TYPE_USER_DEFINED;
    v->types[ID_E_ACUTE_DECOMP] = TOK_TYPE_USER_DEFINED;
    v->types[ID_PAD] = TOK_TYPE_UNUSED;
    for (size_t i = 0; i < n_merges; i++)
        v->merges[i] = (tok_str){merges[i], strlen(merges[i])};
    *d = (tok_desc){
        .pre = pre,
        .n_tokens = N_TOKENS,
        .tokens = v->tokens,
        .types = v->types,
        .n_merges = (uint32_t)n_merges,
        .merges = v->merges,
        .specials = {.bos = -1, .eos = ID_IM_END, .eot = -1, .pad = -1, .unk = -1},
    };
}

static tokenizer *make_tok(tok_pre pre, const char *const *merges, size_t n_merges)
{
    static vocab v;
    tok_desc d;
    vocab_fill(&v, merges, n_merges, &d, pre);
    tokenizer *t = NULL;
    td_err e = tok_init(&t, &d);
    if (e != TD_OK)
        fail_msg("tok_init: %s", err_msg());
    return t;
}

#define N_MERGES (sizeof merges_default / sizeof merges_default[0])

static int setup(void **state)
{
    *state = make_tok(TOK_PRE_QWEN35, merges_default, N_MERGES);
    return 0;
}

static int teardown(void **state)
{
    tok_free(*state);
    return 0;
}

/* Encodes text (len bytes) and compares with the expected ids. */
static void check_ids_n(const tokenizer *t, const char *text, size_t len, unsigned flags,
                        const int32_t *want, size_t n_want)
{
    tok_ids ids = {0};
    assert_int_equal(tok_encode(t, text, len, flags, &ids), TD_OK);
    if (ids.n != n_want || memcmp(ids.ids, want, n_want * sizeof(int32_t)) != 0) {
        fprintf(stderr, "encode(\"%.*s\"): got", (int)len, text);
        for (size_t i = 0; i < ids.n; i++)
            fprintf(stderr, " %d", ids.ids[i]);
        fprintf(stderr, ", want");
        for (size_t i = 0; i < n_want; i++)
            fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
        fail();
    }
    tok_ids_free(&ids);
}

#define CHECK_IDS(t, text, flags, ...)                                                        \
    do {                                                                                      \
        static const int32_t want_[] = {__VA_ARGS__};                                         \
        check_ids_n(t, text, sizeof(text) - 1, flags, want_, sizeof want_ / sizeof want_[0]); \
    } while (0)

static void check_decode(const tokenizer *t, const int32_t *ids, size_t n, unsigned flags, const char *want,
                         size_t want_len)
{
    tok_bytes out = {0};
    assert_int_equal(tok_decode(t, ids, n, flags, &out), TD_OK);
    assert_int_equal(out.len, want_len);
    assert_memory_equal(out.ptr, want, want_len);
    tok_bytes_free(&out);
}

#define CHECK_DECODE(t, flags, want, ...)                                                      \
    do {                                                                                       \
        static const int32_t ids_[] = {__VA_ARGS__};                                           \
        check_decode(t, ids_, sizeof ids_ / sizeof ids_[0], flags, want, sizeof(want) - 1);    \
    } while (0)

/* --- encoding ------------------------------------------------------------------------- */

static void merges_apply_lowest_rank_first(void **state)
{
    tokenizer *t = *state;
    /* "b c" (rank 0) before "a b" (rank 1), then "a bc" makes abc. */
    CHECK_IDS(t, "abc", 0, ID_ABC);
    CHECK_IDS(t, "abd", 0, ID_AB, 'd');
    tokenizer *t2 = make_tok(TOK_PRE_QWEN35, merges_ab_first, N_MERGES);
    /* With "a b" first, "ab" + "c" has no merge: two tokens. */
    CHECK_IDS(t2, "abc", 0, ID_AB, 'c');
    tok_free(t2);
}

static void equal_ranks_merge_leftmost_first(void **state)
{
    tokenizer *t = *state;
    CHECK_IDS(t, "aaa", 0, ID_AA, 'a');
    /* aa a a a -> aa aa a -> aaaa a */
    CHECK_IDS(t, "aaaaa", 0, ID_AAAA, 'a');
}

static void long_piece_merges_completely(void **state)
{
    tokenizer *t = *state;
    size_t n = 100000;
    char *s = malloc(n);
    assert_non_null(s);
    memset(s, 'a', n);
    tok_ids ids = {0};
    assert_int_equal(tok_encode(t, s, n, 0, &ids), TD_OK);
    assert_int_equal(ids.n, n / 4);
    for (size_t i = 0; i < ids.n; i++)
        assert_int_equal(ids.ids[i], ID_AAAA);
    tok_ids_free(&ids);
    free(s);
}

static void space_joins_the_following_word(void **state)
{
    tokenizer *t = *state;
    CHECK_IDS(t, "a w", 0, 'a', ID_GW);
    /* Two spaces before a word: the first stands alone (\s+(?!\S)), the second joins. */
    CHECK_IDS(t, "a  w", 0, 'a', ' ', ID_GW);
}

static void contractions_split_case_insensitively(void **state)
{
    tokenizer *t = *state;
    /* "'M" is its own piece, so "M z" (ranked before "' M") cannot merge across it. */
    CHECK_IDS(t, "I'Mz", 0, 'I', ID_QM, 'z');
    CHECK_IDS(t, "xMz", 0, 'x', ID_MZ);
    CHECK_IDS(t, "I'mz", 0, 'I', '\'', 'm', 'z');
}

static void digits_are_single_pieces(void **state)
{
    tokenizer *t = *state;
    CHECK_IDS(t, "123", 0, '1', '2', '3');
}

static void bytes_map_through_the_byte_table(void **state)
{
    tokenizer *t = *state;
    CHECK_IDS(t, "\xc3\xa9", 0, 0xc3, 0xa9);                       /* é */
    CHECK_IDS(t, "\xf0\x9f\x98\x80", 0, 0xf0, ID_L9F98, 0x80);     /* 😀: "ð" "Łĺ" "Ģ" */
    CHECK_IDS(t, "\t\n", 0, '\t', '\n');
    static const char nul[] = {'a', 0, 'b'};
    check_ids_n(t, nul, 3, 0, (const int32_t[]){'a', 0, 'b'}, 3);
}

static void added_tokens_longest_match_first(void **state)
{
    tokenizer *t = *state;
    CHECK_IDS(t, "a<|im_start|>b", 0, 'a', ID_IM_START, 'b');
    CHECK_IDS(t, "<|im_end|>", 0, ID_IM_END);
    CHECK_IDS(t, "<|im_x", 0, ID_IM, '_', 'x');
    CHECK_IDS(t, "<think>x</think>", 0, ID_THINK, 'x', '<', '/', 't', 'h', 'i', 'n', 'k', '>');
    CHECK_IDS(t, "<|im_start|><|im_start|>", 0, ID_IM_START, ID_IM_START);
}

static void split_special_keeps_control_text_plain(void **state)
{
    tokenizer *t = *state;
    /* CONTROL tokens are not matched; the USER_DEFINED prefix "<|im" still is. */
    CHECK_IDS(t, "<|im_start|>", TOK_ENC_SPLIT_SPECIAL, ID_IM, '_', 's', 't', 'a', 'r', 't', '|', '>');
    CHECK_IDS(t, "<think>", TOK_ENC_SPLIT_SPECIAL, ID_THINK);
}

static void added_tokens_match_before_nfc(void **state)
{
    tokenizer *t = *state;
    /* e + U+0301 is an added token as written; anywhere else it is normalised to é. */
    CHECK_IDS(t, "e\xcc\x81", 0, ID_E_ACUTE_DECOMP);
    CHECK_IDS(t, "\xc3\xa9", 0, 0xc3, 0xa9);
    CHECK_IDS(t, "<think>xe\xcc\x81" "a", 0, ID_THINK, 'x', ID_E_ACUTE_DECOMP, 'a');
}

static void nfc_composes_outside_added_tokens(void **state)
{
    /* A tokenizer without the decomposed added token: e + U+0301 becomes é (C3 A9). */
    static vocab v;
    tok_desc d;
    vocab_fill(&v, merges_default, N_MERGES, &d, TOK_PRE_QWEN35);
    v.types[ID_E_ACUTE_DECOMP] = TOK_TYPE_NORMAL;
    tokenizer *t = NULL;
    assert_int_equal(tok_init(&t, &d), TD_OK);
    CHECK_IDS(t, "e\xcc\x81", 0, 0xc3, 0xa9);
    CHECK_IDS(t, "ab\xcc\x81", 0, ID_AB, 0xcc, 0x81); /* no precomposed b-acute */
    tok_free(t);
    (void)state;
}

static void qwen35_keeps_combining_marks_in_words(void **state)
{
    (void)state;
    /* x + U+0301 (CC 81) has no precomposed form. qwen35 keeps the mark in the word, so the
     * merge "x Ì" applies; qwen2 cuts the word before the mark. */
    tokenizer *t35 = make_tok(TOK_PRE_QWEN35, merges_default, N_MERGES);
    tokenizer *t2 = make_tok(TOK_PRE_QWEN2, merges_default, N_MERGES);
    CHECK_IDS(t35, "x\xcc\x81", 0, ID_X_CC, 0x81);
    CHECK_IDS(t2, "x\xcc\x81", 0, 'x', 0xcc, 0x81);
    tok_free(t35);
    tok_free(t2);
}

static void invalid_utf8_becomes_replacement_characters(void **state)
{
    tokenizer *t = *state;
    /* Each maximal ill-formed subpart is one U+FFFD (EF BF BD). */
    CHECK_IDS(t, "a\xff" "b", 0, 'a', 0xef, 0xbf, 0xbd, 'b');
    CHECK_IDS(t, "\xe2\x82", 0, 0xef, 0xbf, 0xbd);
    CHECK_IDS(t, "\xed\xa0\x80", 0, 0xef, 0xbf, 0xbd, 0xef, 0xbf, 0xbd, 0xef, 0xbf, 0xbd);
    CHECK_IDS(t, "\xf0\x9f\x98" "a", 0, 0xef, 0xbf, 0xbd, 'a');
    CHECK_IDS(t, "\xc0\xaf", 0, 0xef, 0xbf, 0xbd, 0xef, 0xbf, 0xbd);
}

static void add_special_follows_the_vocabulary(void **state)
{
    static vocab v;
    tok_desc d;
    vocab_fill(&v, merges_default, N_MERGES, &d, TOK_PRE_QWEN35);
    d.specials.bos = ID_IM_START;
    d.specials.add_bos = true;
    tokenizer *t = NULL;
    assert_int_equal(tok_init(&t, &d), TD_OK);
    CHECK_IDS(t, "ab", TOK_ENC_ADD_SPECIAL, ID_IM_START, ID_AB);
    CHECK_IDS(t, "ab", 0, ID_AB);
    tok_free(t);
    CHECK_IDS((tokenizer *)*state, "ab", TOK_ENC_ADD_SPECIAL, ID_AB); /* add_bos false */
}

/* --- decoding ------------------------------------------------------------------------ */

static void decode_maps_characters_back_to_bytes(void **state)
{
    tokenizer *t = *state;
    CHECK_DECODE(t, 0, "a w", 'a', ID_GW);
    CHECK_DECODE(t, 0, "\xf0\x9f\x98\x80", 0xf0, ID_L9F98, 0x80);
    CHECK_DECODE(t, 0, "\xc3\xa9", 0xc3, 0xa9);
    CHECK_DECODE(t, 0, "\0", 0);
    check_decode(t, NULL, 0, 0, "", 0);
}

static void decode_prints_added_tokens_as_text(void **state)
{
    tokenizer *t = *state;
    CHECK_DECODE(t, 0, "<|im_start|>x<think>", ID_IM_START, 'x', ID_THINK);
    CHECK_DECODE(t, TOK_DEC_SKIP_SPECIAL, "x<think>", ID_IM_START, 'x', ID_THINK, ID_IM_END);
    CHECK_DECODE(t, 0, "ab", 'a', ID_PAD, 'b'); /* UNUSED prints nothing */
}

static void decode_replaces_invalid_bytes(void **state)
{
    tokenizer *t = *state;
    CHECK_DECODE(t, 0, "\xef\xbf\xbd", 0xc3);                  /* unfinished at the end */
    CHECK_DECODE(t, 0, "\xef\xbf\xbd" "a", 0xf0, 0x9f, 'a');    /* broken by 'a' */
    CHECK_DECODE(t, 0, "\xef\xbf\xbd\xef\xbf\xbd", 0xff, 0x80); /* never valid */
}

static void decode_rejects_ids_outside_the_vocabulary(void **state)
{
    tokenizer *t = *state;
    tok_bytes out = {0};
    assert_int_equal(tok_decode(t, (const int32_t[]){'a'}, 1, 0, &out), TD_OK);
    assert_int_equal(tok_decode(t, (const int32_t[]){'b', N_TOKENS}, 2, 0, &out), TD_ERANGE);
    assert_non_null(strstr(err_msg(), "position 1"));
    assert_int_equal(tok_decode(t, (const int32_t[]){-1}, 1, 0, &out), TD_ERANGE);
    assert_string_equal(out.ptr, "a"); /* what came before the failing call stays */
    tok_stream s;
    tok_stream_init(&s, t, 0);
    assert_int_equal(tok_stream_push(&s, (const int32_t[]){0xf0, 1 << 30}, 2, &out), TD_ERANGE);
    assert_int_equal(s.n_pend, 0); /* nothing of the failing push was taken */
    tok_bytes_free(&out);
}

static void stream_emits_a_character_only_when_complete(void **state)
{
    tokenizer *t = *state;
    tok_stream s;
    tok_bytes out = {0};
    tok_stream_init(&s, t, 0);
    /* 😀 = F0 9F 98 80 over three tokens: nothing until the last byte arrives. */
    assert_int_equal(tok_stream_push(&s, (const int32_t[]){0xf0}, 1, &out), TD_OK);
    assert_int_equal(out.len, 0);
    assert_int_equal(tok_stream_push(&s, (const int32_t[]){ID_L9F98}, 1, &out), TD_OK);
    assert_int_equal(out.len, 0);
    assert_int_equal(tok_stream_push(&s, (const int32_t[]){0x80}, 1, &out), TD_OK);
    assert_int_equal(out.len, 4);
    assert_memory_equal(out.ptr, "\xf0\x9f\x98\x80", 4);
    assert_int_equal(tok_stream_flush(&s, &out), TD_OK);
    assert_int_equal(out.len, 4);
    tok_bytes_free(&out);
}

static void stream_replaces_invalid_bytes_at_once(void **state)
{
    tokenizer *t = *state;
    tok_stream s;
    tok_bytes out = {0};
    tok_stream_init(&s, t, 0);
    assert_int_equal(tok_stream_push(&s, (const int32_t[]){0xff}, 1, &out), TD_OK);
    assert_string_equal(out.ptr, "\xef\xbf\xbd"); /* FF can never start a character */
    assert_int_equal(tok_stream_push(&s, (const int32_t[]){0xe2, 0x82}, 2, &out), TD_OK);
    assert_string_equal(out.ptr, "\xef\xbf\xbd"); /* E2 82 may still become a character */
    assert_int_equal(tok_stream_push(&s, (const int32_t[]){'x'}, 1, &out), TD_OK);
    assert_string_equal(out.ptr, "\xef\xbf\xbd\xef\xbf\xbdx");
    assert_int_equal(tok_stream_push(&s, (const int32_t[]){0xc3}, 1, &out), TD_OK);
    assert_int_equal(tok_stream_flush(&s, &out), TD_OK); /* unfinished at the end */
    assert_string_equal(out.ptr, "\xef\xbf\xbd\xef\xbf\xbdx\xef\xbf\xbd");
    tok_bytes_free(&out);
}

static void stream_in_random_chunks_equals_whole_decode(void **state)
{
    tokenizer *t = *state;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int round = 0; round < 500; round++) {
        int32_t ids[40];
        size_t n = 1 + round % 40;
        for (size_t i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            /* Mostly bytes 0x80..0xff so characters straddle tokens. */
            uint32_t r = (uint32_t)(rng >> 33);
            ids[i] = (int32_t)(r % 4 ? 0x80 + r % 0x80 : r % N_TOKENS);
        }
        tok_bytes whole = {0}, streamed = {0};
        assert_int_equal(tok_decode(t, ids, n, 0, &whole), TD_OK);
        tok_stream s;
        tok_stream_init(&s, t, 0);
        for (size_t i = 0; i < n;) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t k = 1 + (rng >> 40) % 4;
            if (k > n - i)
                k = n - i;
            assert_int_equal(tok_stream_push(&s, ids + i, k, &streamed), TD_OK);
            i += k;
        }
        assert_int_equal(tok_stream_flush(&s, &streamed), TD_OK);
        assert_int_equal(streamed.len, whole.len);
        assert_memory_equal(streamed.ptr, whole.ptr, whole.len);
        tok_bytes_free(&whole);
        tok_bytes_free(&streamed);
    }
}

/* --- lookups ------------------------------------------------------------------------- */

static void lookups_find_tokens_by_text(void **state)
{
    tokenizer *t = *state;
    assert_int_equal(tok_id_of(t, "<|im_start|>", 12), ID_IM_START);
    assert_int_equal(tok_id_of(t, "\xc4\xa0w", 3), ID_GW);
    assert_int_equal(tok_id_of(t, "nope", 4), -1);
    assert_int_equal(tok_n_vocab(t), N_TOKENS);
    tok_str s = tok_text_of(t, ID_ABC);
    assert_int_equal(s.len, 3);
    assert_memory_equal(s.ptr, "abc", 3);
    assert_int_equal(tok_type_of(t, ID_THINK), TOK_TYPE_USER_DEFINED);
    assert_true(tok_is_eog(t, ID_IM_END));
    assert_false(tok_is_eog(t, ID_IM_START));
}

/* --- refusals ------------------------------------------------------------------------- */

static td_err init_modified(void (*modify)(vocab *v, tok_desc *d))
{
    static vocab v;
    tok_desc d;
    vocab_fill(&v, merges_default, N_MERGES, &d, TOK_PRE_QWEN35);
    modify(&v, &d);
    tokenizer *t = NULL;
    td_err e = tok_init(&t, &d);
    assert_true((e == TD_OK) == (t != NULL));
    tok_free(t);
    return e;
}

static void merge_result_missing(vocab *v, tok_desc *d)
{
    (void)d;
    v->merges[3] = (tok_str){"b d", 3}; /* "bd" is not a token */
}
static void merge_without_space(vocab *v, tok_desc *d)
{
    (void)d;
    v->merges[0] = (tok_str){"bc", 2};
}
static void byte_type(vocab *v, tok_desc *d)
{
    (void)d;
    v->types[5] = TOK_TYPE_BYTE;
}
static void type_out_of_range(vocab *v, tok_desc *d)
{
    (void)d;
    v->types[7] = 9;
}
static void eos_out_of_range(vocab *v, tok_desc *d)
{
    (void)v;
    d->specials.eos = N_TOKENS;
}

static void bad_vocabularies_are_refused(void **state)
{
    (void)state;
    assert_int_equal(init_modified(merge_result_missing), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "merge 3 'b d'"));
    assert_int_equal(init_modified(merge_without_space), TD_EFORMAT);
    assert_int_equal(init_modified(byte_type), TD_ENOTSUP);
    assert_int_equal(init_modified(type_out_of_range), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "token 7"));
    assert_int_equal(init_modified(eos_out_of_range), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "eos"));
}

/* --- the word cache ---------------------------------------------------------------------- */

/* Word i in base 26 over "ab..z" with a leading space: distinct pieces, many merges. */
static size_t cache_word(char *buf, unsigned i)
{
    size_t n = 0;
    buf[n++] = ' ';
    do {
        buf[n++] = (char)('a' + i % 26);
        i /= 26;
    } while (i);
    buf[n++] = 'a';
    buf[n++] = 'b';
    buf[n++] = 'c';
    return n;
}

static void cache_resets_keep_results_identical(void **state)
{
    tokenizer *t = *state;
    enum { N_WORDS = 40000 }; /* more pieces than the cache holds before it resets */
    tok_ids *first = calloc(N_WORDS, sizeof *first);
    assert_non_null(first);
    char buf[16];
    for (unsigned round = 0; round < 2; round++) {
        for (unsigned i = 0; i < N_WORDS; i++) {
            size_t n = cache_word(buf, i);
            tok_ids ids = {0};
            assert_int_equal(tok_encode(t, buf, n, 0, &ids), TD_OK);
            if (round == 0) {
                first[i] = ids;
                continue;
            }
            assert_int_equal(ids.n, first[i].n);
            assert_memory_equal(ids.ids, first[i].ids, ids.n * sizeof(int32_t));
            tok_ids_free(&ids);
        }
    }
    /* " b" + "abc" = " babc": "b c" (rank 0) beats the "a b" (rank 1) queued beside it. */
    tok_ids ids = {0};
    size_t n = cache_word(buf, 1);
    assert_int_equal(tok_encode(t, buf, n, 0, &ids), TD_OK);
    assert_int_equal(ids.n, 3);
    assert_int_equal(ids.ids[0], ' ');
    assert_int_equal(ids.ids[1], 'b');
    assert_int_equal(ids.ids[2], ID_ABC); /* "b c" first; the queued "a b" is then stale */
    tok_ids_free(&ids);
    for (unsigned i = 0; i < N_WORDS; i++)
        tok_ids_free(&first[i]);
    free(first);
}

typedef struct thread_job {
    const tokenizer *t;
    int ok;
} thread_job;

static const char *const thread_texts[] = {
    "abc abd aaa aaaaa", "<|im_start|>I'Mz a w\xf0\x9f\x98\x80", "x\xcc\x81 123 <think>ab</think>", "e\xcc\x81 \xff ab",
};

static void *thread_encode(void *arg)
{
    thread_job *job = arg;
    job->ok = 1;
    for (int r = 0; r < 2000 && job->ok; r++) {
        const char *s = thread_texts[r % 4];
        tok_ids a = {0}, b = {0};
        char word[16];
        size_t wn = cache_word(word, (unsigned)r * 7u);
        if (tok_encode(job->t, s, strlen(s), 0, &a) != TD_OK || tok_encode(job->t, word, wn, 0, &b) != TD_OK)
            job->ok = 0;
        tok_ids_free(&a);
        tok_ids_free(&b);
    }
    return NULL;
}

static void concurrent_encodes_agree(void **state)
{
    tokenizer *t = *state;
    pthread_t th[4];
    thread_job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){t, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thread_encode, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_true(jobs[i].ok);
    }
    /* After all that sharing the cache still gives the exact ids. */
    CHECK_IDS(t, "<|im_start|>I'Mz a w\xf0\x9f\x98\x80", 0, ID_IM_START, 'I', ID_QM, 'z', ' ', 'a', ID_GW, 0xf0,
              ID_L9F98, 0x80);
}

/* --- GGUF ------------------------------------------------------------------------------ */

/* The test vocabulary as a GGUF image; model/pre NULL leave the key out. */
static void write_vocab_gguf(const char *model, const char *pre, uint8_t **img, uint64_t *size)
{
    static vocab v;
    tok_desc d;
    vocab_fill(&v, merges_default, N_MERGES, &d, TOK_PRE_QWEN35);
    char *tokens[N_TOKENS];
    for (int i = 0; i < N_TOKENS; i++) {
        tokens[i] = calloc(1, v.tokens[i].len + 1);
        memcpy(tokens[i], v.tokens[i].ptr, v.tokens[i].len);
    }
    gguf_writer *w = gguf_writer_new();
    assert_non_null(w);
    gguf_writer_set_str(w, "general.architecture", "qwen35");
    if (model)
        gguf_writer_set_str(w, "tokenizer.ggml.model", model);
    if (pre)
        gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tokens, N_TOKENS);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v.types, N_TOKENS);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges_default, N_MERGES);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", ID_IM_END);
    gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", ID_PAD);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    assert_int_equal(gguf_writer_write_mem(w, img, size), TD_OK);
    gguf_writer_free(w);
    for (int i = 0; i < N_TOKENS; i++)
        free(tokens[i]);
}

static void gguf_metadata_loads_the_same_tokenizer(void **state)
{
    (void)state;
    uint8_t *img;
    uint64_t size;
    write_vocab_gguf("gpt2", "qwen35", &img, &size);
    gguf_file *g;
    assert_int_equal(gguf_open_memory(&g, img, size), TD_OK);
    tokenizer *t = NULL;
    assert_int_equal(tok_load_gguf(&t, g), TD_OK);
    gguf_close(g); /* the tokenizer keeps its own copy */
    free(img);
    CHECK_IDS(t, "abc<|im_start|>a w\xf0\x9f\x98\x80", 0, ID_ABC, ID_IM_START, 'a', ID_GW, 0xf0, ID_L9F98, 0x80);
    const tok_specials *sp = tok_specials_of(t);
    assert_int_equal(sp->eos, ID_IM_END);
    assert_int_equal(sp->pad, ID_PAD);
    assert_int_equal(sp->bos, -1);
    assert_int_equal(sp->eot, ID_IM_END); /* no eot key: the CONTROL token <|im_end|> */
    assert_int_equal(tok_pre_of(t), TOK_PRE_QWEN35);
    tok_free(t);
}

static td_err load_with(const char *model, const char *pre)
{
    uint8_t *img;
    uint64_t size;
    write_vocab_gguf(model, pre, &img, &size);
    gguf_file *g;
    assert_int_equal(gguf_open_memory(&g, img, size), TD_OK);
    tokenizer *t = NULL;
    td_err e = tok_load_gguf(&t, g);
    tok_free(t);
    gguf_close(g);
    free(img);
    return e;
}

static void gguf_other_models_and_pre_tokenisers_are_refused(void **state)
{
    (void)state;
    assert_int_equal(load_with("llama", "qwen2"), TD_ENOTSUP);
    assert_non_null(strstr(err_msg(), "'llama'"));
    assert_int_equal(load_with("gpt2", "llama-bpe"), TD_ENOTSUP);
    assert_non_null(strstr(err_msg(), "'llama-bpe'"));
    assert_int_equal(load_with("gpt2", NULL), TD_ENOTSUP);
    assert_non_null(strstr(err_msg(), "tokenizer.ggml.pre"));
    assert_int_equal(load_with(NULL, "qwen2"), TD_ENOENT);
    assert_int_equal(load_with("gpt2", "qwen2"), TD_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(merges_apply_lowest_rank_first),
        cmocka_unit_test(equal_ranks_merge_leftmost_first),
        cmocka_unit_test(long_piece_merges_completely),
        cmocka_unit_test(space_joins_the_following_word),
        cmocka_unit_test(contractions_split_case_insensitively),
        cmocka_unit_test(digits_are_single_pieces),
        cmocka_unit_test(bytes_map_through_the_byte_table),
        cmocka_unit_test(added_tokens_longest_match_first),
        cmocka_unit_test(split_special_keeps_control_text_plain),
        cmocka_unit_test(added_tokens_match_before_nfc),
        cmocka_unit_test(nfc_composes_outside_added_tokens),
        cmocka_unit_test(qwen35_keeps_combining_marks_in_words),
        cmocka_unit_test(invalid_utf8_becomes_replacement_characters),
        cmocka_unit_test(add_special_follows_the_vocabulary),
        cmocka_unit_test(decode_maps_characters_back_to_bytes),
        cmocka_unit_test(decode_prints_added_tokens_as_text),
        cmocka_unit_test(decode_replaces_invalid_bytes),
        cmocka_unit_test(decode_rejects_ids_outside_the_vocabulary),
        cmocka_unit_test(stream_emits_a_character_only_when_complete),
        cmocka_unit_test(stream_replaces_invalid_bytes_at_once),
        cmocka_unit_test(stream_in_random_chunks_equals_whole_decode),
        cmocka_unit_test(lookups_find_tokens_by_text),
        cmocka_unit_test(bad_vocabularies_are_refused),
        cmocka_unit_test(cache_resets_keep_results_identical),
        cmocka_unit_test(concurrent_encodes_agree),
        cmocka_unit_test(gguf_metadata_loads_the_same_tokenizer),
        cmocka_unit_test(gguf_other_models_and_pre_tokenisers_are_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
