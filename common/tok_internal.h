/* Internals of the tokenizer shared by its files (tokenizer.c: building and lookups,
 * tok_bpe.c: merges and the word cache, tok_pretok.c: added tokens, NFC and the regex,
 * tok_decode.c: UTF-8 and decoding). Not for use outside common/tok*.c. */
#ifndef TANDEM_COMMON_TOK_INTERNAL_H
#define TANDEM_COMMON_TOK_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "common/tokenizer.h"

/* Open-addressing table of token strings -> id (strings live in the tokenizer). */
typedef struct toki_strmap {
    int32_t *slots; /* [cap] token id, -1 empty */
    uint32_t cap;   /* slots, a power of two, at least twice the vocabulary */
} toki_strmap;

/* (left id, right id) -> (rank, merged id). */
typedef struct toki_merge {
    uint64_t key;  /* left << 32 | right; UINT64_MAX empty */
    uint32_t rank; /* index in the merge list: lower merges first */
    int32_t id;    /* the merged token */
} toki_merge;

typedef struct toki_pairmap {
    toki_merge *slots; /* [cap] */
    uint32_t cap;      /* slots, a power of two, at least twice the merges */
} toki_pairmap;

/* Bounded cache of BPE results: piece bytes -> ids. Cleared whole when full, which keeps it
 * simple and bounded; common words come back quickly. */
typedef struct toki_cache_entry {
    uint64_t hash;    /* 0 empty */
    uint32_t key;     /* offset of the piece bytes in arena */
    uint32_t key_len; /* bytes */
    uint32_t ids;     /* offset (in bytes, 4-aligned) of the ids in arena */
    uint32_t n_ids;   /* ids */
} toki_cache_entry;

typedef struct toki_cache {
    pthread_mutex_t mu;
    toki_cache_entry *slots; /* [cap] */
    uint32_t cap;            /* slots, a power of two */
    uint32_t count;          /* entries used */
    uint8_t *arena;          /* [arena_cap] piece bytes and ids */
    uint32_t arena_len;      /* bytes used */
    uint32_t arena_cap;      /* bytes */
} toki_cache;

struct tokenizer {
    tok_pre pre;
    uint32_t n_vocab;    /* tokens, padding rows included */

    char *text;          /* all vocabulary strings back to back */
    uint32_t *text_off;  /* [n_vocab + 1] token i is text[text_off[i] .. text_off[i+1]) */
    uint8_t *out;        /* all decoded byte strings back to back */
    uint32_t *out_off;   /* [n_vocab + 1] decoded bytes of token i */
    uint8_t *type;       /* [n_vocab] tok_type */

    toki_strmap vocab;   /* vocabulary string -> id (first of duplicates) */
    toki_pairmap merges;
    int32_t byte_tok[256]; /* token of the one-character string of byte b, -1 if none */

    /* Added tokens (CONTROL, USER_DEFINED), bucketed by first byte, longest first, so the
     * first match in a bucket is the longest match at that position. */
    int32_t *added;          /* [n_added] ids */
    uint32_t n_added;
    uint32_t added_at[257];  /* bucket of first byte b is added[added_at[b] .. added_at[b+1]) */

    void *re;            /* pcre2_code_8 * of the pre-tokeniser */
    tok_specials sp;
    toki_cache *cache;   /* mutable behind a const tokenizer: guarded by its mutex */
};

static inline tok_str toki_text(const tokenizer *t, int32_t id)
{
    return (tok_str){t->text + t->text_off[id], t->text_off[id + 1] - t->text_off[id]};
}

/* --- growable outputs ------------------------------------------------------------- */
td_err toki_ids_push(tok_ids *v, int32_t id);
td_err toki_bytes_append(tok_bytes *b, const void *p, size_t n);

/* --- GPT-2 byte <-> unicode alphabet -------------------------------------------------- */
/* Code point that stands for byte b in vocabulary strings (U+0021..U+0143). */
uint32_t toki_byte_cp(uint8_t b);
/* Byte that code point cp stands for, or -1 when cp is not in the alphabet. */
int toki_cp_byte(uint32_t cp);
/* UTF-8 of cp (< 0x800 here) into p; returns bytes written. */
size_t toki_put_cp(char *p, uint32_t cp);

/* --- UTF-8 ------------------------------------------------------------------------ */
enum { TOKI_UTF8_OK = 0, TOKI_UTF8_BAD, TOKI_UTF8_SHORT };
/* Classifies the sequence at s[0..n), n >= 1. OK: *len is the character's length. BAD: *len
 * is the length of the maximal ill-formed subpart (one U+FFFD). SHORT: all n bytes are a
 * valid but unfinished prefix (*len = n). */
int toki_utf8_next(const uint8_t *s, size_t n, size_t *len);
/* Appends s[0..n) with every maximal ill-formed subpart replaced by U+FFFD. When final is
 * false an unfinished prefix at the end is not written: *kept says how many bytes of s are
 * left over (0..3). */
td_err toki_utf8_lossy(const uint8_t *s, size_t n, bool final, tok_bytes *out, size_t *kept);

/* --- pieces ----------------------------------------------------------------------- */
td_err toki_re_compile(tokenizer *t);
void toki_re_free(tokenizer *t);
/* Encodes one segment free of added tokens: NFC, regex, BPE per piece. */
td_err toki_encode_segment(const tokenizer *t, const char *s, size_t n, tok_ids *out);

/* BPE of one piece of raw bytes; appends ids. Uses and fills the cache. */
td_err toki_bpe_piece(const tokenizer *t, const uint8_t *s, size_t n, tok_ids *out);
td_err toki_cache_init(toki_cache **out);
void toki_cache_free(toki_cache *c);

/* 64-bit FNV-1a; never 0 (0 marks empty cache slots). */
uint64_t toki_hash(const void *p, size_t n);

#endif
