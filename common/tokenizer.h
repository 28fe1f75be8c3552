/* Byte-level BPE tokenizer (the GPT-2 scheme of Qwen2, Qwen3 and Qwen3.5 vocabularies), as
 * GGUF `tokenizer.ggml.*` metadata describes it. Hugging Face `tokenizers` is the oracle:
 * for the same vocabulary and text the ids are identical.
 *
 * Encoding, in the order Hugging Face applies it:
 *   1. invalid UTF-8 is replaced: every maximal ill-formed subsequence becomes one U+FFFD
 *      (the rule of Python's bytes.decode("utf-8", "replace") and Rust's from_utf8_lossy,
 *      so it matches what a Python caller would hand Hugging Face);
 *   2. added tokens (CONTROL and USER_DEFINED types) are split out of the raw text, leftmost
 *      then longest match, before any normalisation;
 *   3. every other segment is NFC-normalised (utf8proc), pre-tokenised with the model's
 *      regular expression (PCRE2, UTF + UCP, JIT), and each piece is merged by BPE rank over
 *      the GPT-2 byte-to-unicode alphabet.
 * Decoding maps each character of a normal token back through the inverse byte table (a
 * token with a character outside the table contributes its own UTF-8 bytes, as Hugging Face
 * does); added tokens print as their text; UNUSED tokens (padding rows of the embedding)
 * print nothing. Invalid UTF-8 in the decoded bytes becomes U+FFFD, one per maximal
 * ill-formed subsequence.
 *
 * A loaded tokenizer is read-only except for a word cache guarded by a mutex: encode and
 * decode may run on many threads at once. A tok_stream belongs to one thread. */
#ifndef TANDEM_COMMON_TOKENIZER_H
#define TANDEM_COMMON_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

struct gguf_file;

/* Pre-tokeniser regular expression, from tokenizer.ggml.pre. */
typedef enum tok_pre {
    TOK_PRE_QWEN2 = 0, /* "qwen2": Qwen2, Qwen2.5, Qwen3 */
    TOK_PRE_QWEN35,    /* "qwen35": Qwen3.5, Qwen3.6 (letters include combining marks) */
} tok_pre;

/* Token types, the values GGUF's tokenizer.ggml.token_type stores. */
typedef enum tok_type {
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,      /* special added token (<|im_start|>): split out, skippable */
    TOK_TYPE_USER_DEFINED = 4, /* non-special added token (<think>): split out, always printed */
    TOK_TYPE_UNUSED = 5,       /* padding rows: never produced, decode to nothing */
    TOK_TYPE_BYTE = 6,         /* byte-fallback tokens: not part of byte-level BPE, refused */
} tok_type;

typedef struct tok_str {
    const char *ptr; /* not NUL-terminated */
    size_t len;      /* bytes */
} tok_str;

/* Special token ids; -1 when the vocabulary has none. */
typedef struct tok_specials {
    int32_t bos, eos, eot, pad, unk;
    bool add_bos; /* tokenizer.ggml.add_bos_token: TOK_ENC_ADD_SPECIAL prepends bos */
    bool add_eos; /* tokenizer.ggml.add_eos_token: TOK_ENC_ADD_SPECIAL appends eos */
} tok_specials;

/* Everything a tokenizer is built from (what GGUF stores), all copied by tok_init. */
typedef struct tok_desc {
    tok_pre pre;
    uint32_t n_tokens;         /* vocabulary size */
    const tok_str *tokens;     /* [n_tokens] text; byte-level alphabet for normal tokens */
    const int32_t *types;      /* [n_tokens] tok_type values, or NULL: all NORMAL */
    uint32_t n_merges;
    const tok_str *merges;     /* [n_merges] "left right"; index = rank (0 merges first) */
    tok_specials specials;
} tok_desc;

typedef struct tokenizer tokenizer;

/* Growable outputs, appended to by encode and decode; zero-initialise, then *_free. */
typedef struct tok_ids {
    int32_t *ids; /* [n] token ids */
    size_t n;     /* ids held */
    size_t cap;   /* ids allocated */
} tok_ids;

typedef struct tok_bytes {
    char *ptr;  /* [len] text, kept NUL-terminated for printing */
    size_t len; /* bytes, without the NUL */
    size_t cap; /* bytes allocated */
} tok_bytes;

void tok_ids_free(tok_ids *v);
void tok_bytes_free(tok_bytes *b);

/* Builds a tokenizer. TD_EFORMAT (with the token or merge index in the message) for a
 * merge whose parts or result are not tokens, a special id out of range, a type outside
 * 1..6; TD_ENOTSUP for BYTE tokens (byte fallback is not byte-level BPE). */
td_err tok_init(tokenizer **out, const tok_desc *d);

/* From GGUF metadata: tokenizer.ggml.model must be "gpt2" and tokenizer.ggml.pre "qwen2" or
 * "qwen35" (anything else: TD_ENOTSUP naming the value). The file may be closed afterwards.
 * When the file names no EOT token, a CONTROL token "<|im_end|>" becomes eot (chat models
 * end a turn with it). */
td_err tok_load_gguf(tokenizer **out, const struct gguf_file *g);

/* Opens path, loads the tokenizer, closes the file. */
td_err tok_open(tokenizer **out, const char *path);

void tok_free(tokenizer *t);

enum {
    TOK_ENC_ADD_SPECIAL = 1u << 0,   /* bos/eos around the text when add_bos/add_eos say so */
    TOK_ENC_SPLIT_SPECIAL = 1u << 1, /* CONTROL tokens' text is plain text (client content
                                        must not forge <|im_start|>); USER_DEFINED still match */
};

/* Appends the ids of text[0..len) to out. Errors only on allocation failure or a regex
 * engine failure; any byte string is accepted (see the header comment for invalid UTF-8). */
td_err tok_encode(const tokenizer *t, const char *text, size_t len, unsigned flags, tok_ids *out);

enum {
    TOK_DEC_SKIP_SPECIAL = 1u << 0, /* CONTROL tokens print nothing */
};

/* Appends the text of ids to out. TD_ERANGE (naming the position) for an id outside the
 * vocabulary; out keeps what was appended before the call. */
td_err tok_decode(const tokenizer *t, const int32_t *ids, size_t n, unsigned flags, tok_bytes *out);

/* Streaming decode: the text of each pushed token as soon as it is complete UTF-8. Bytes
 * of an unfinished character wait for the next token; bytes that can never become a
 * character come out as U+FFFD at once. push* + flush gives exactly tok_decode's text. */
typedef struct tok_stream {
    const tokenizer *t;
    unsigned flags;   /* TOK_DEC_* */
    uint8_t pend[4];  /* a valid but unfinished UTF-8 prefix (at most 3 bytes) */
    uint32_t n_pend;  /* bytes in pend */
} tok_stream;

void tok_stream_init(tok_stream *s, const tokenizer *t, unsigned flags);
/* TD_ERANGE for an id outside the vocabulary (the stream is unchanged by that id). */
td_err tok_stream_push(tok_stream *s, const int32_t *ids, size_t n, tok_bytes *out);
/* Emits U+FFFD for an unfinished character left at the end, and resets the stream. */
td_err tok_stream_flush(tok_stream *s, tok_bytes *out);

/* Lookups. */
uint32_t tok_n_vocab(const tokenizer *t);
tok_pre tok_pre_of(const tokenizer *t);
/* The id whose vocabulary string is exactly text[0..len), or -1. */
int32_t tok_id_of(const tokenizer *t, const char *text, size_t len);
/* The vocabulary string of id (byte-level alphabet for normal tokens); id must be valid. */
tok_str tok_text_of(const tokenizer *t, int32_t id);
tok_type tok_type_of(const tokenizer *t, int32_t id);
/* Appends the vocabulary string of raw bytes b[0..n) (each byte as its GPT-2 byte-level
 * alphabet character): what a normal token that decodes to those bytes is spelled as. */
td_err tok_alphabet_of(const uint8_t *b, size_t n, tok_bytes *out);

/* The bytes id decodes to, as they are (a normal token may hold part of a character: no
 * U+FFFD repair); id must be valid. Valid while t lives. */
tok_str tok_bytes_of(const tokenizer *t, int32_t id);
const tok_specials *tok_specials_of(const tokenizer *t);
/* True for eos and eot: generation stops there. */
bool tok_is_eog(const tokenizer *t, int32_t id);

/* "qwen2" -> TOK_PRE_QWEN2 ...; TD_ENOTSUP naming the value when unknown. */
td_err tok_pre_parse(const char *name, size_t len, tok_pre *out);

#endif
