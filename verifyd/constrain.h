/* Structured output (OpenAI response_format json_object / json_schema): which tokens keep a
 * generation's text a viable prefix of a valid document, as a mask on every row of target
 * logits a token is chosen from.
 *
 * The text is matched byte by byte by common/jsonc; a token is allowed at a row when all of
 * its bytes are accepted after the text so far. Rows are masked like the logit bias is added
 * (verifyd/penalty.h): row i of a verify block is masked as if the drafts before it had been
 * emitted, so speculative output stays equal to plain decoding with the same format, and a
 * block is cut before its first draft the format refuses (that draft could never be
 * accepted). Masks are built on the host by walking a byte trie of the vocabulary from the
 * matcher's state (every token sharing a prefix shares the walk), and applied beside the
 * logits on the backend (ops_backend.logit_mask): no logits cross. Inside a string whose
 * content is free, the tokens made only of plain characters are allowed as a precomputed set
 * and only the others are walked.
 *
 * The tool-call format (tool_choice "required" or a named function): the answer's first token
 * is the model's "<tool_call>"; the call's body is matched by common/callm (a function of the
 * request with arguments valid under its parameters' schemas) and "</tool_call>" is allowed
 * once the body is whole; after it the text is free, and each further call is matched the
 * same way. Without a tool spec the body is free and only the end of generation is refused
 * until "</tool_call>". The tools format (tool_choice "auto") leaves the text alone (no mask
 * at all) and matches the body of every call the model opens. Reasoning blocks are not
 * looked at by it. A choice (guided_choice) is a document matched by callm as well: one of
 * its strings, then the end of generation; so are structural tags (free text whose triggers
 * open schema-matched structures; the end of generation wherever the text is free). A
 * grammar (GBNF) or a regular expression is a document matched by common/gram: a sentence of
 * it, then the end of generation.
 *
 * A thinking model's reasoning block is left free: when the prompt leaves one open, the
 * format applies from the token after its end token; when the output may open one itself,
 * its start token is allowed first. Once the document is complete only the end-of-generation
 * tokens (and trailing whitespace) are allowed. A state that no token of the vocabulary
 * continues gets an empty mask: the generation then fails with a clear error rather than
 * ending with a broken document. */
#ifndef TANDEM_VERIFYD_CONSTRAIN_H
#define TANDEM_VERIFYD_CONSTRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/jsonc.h"
#include "common/msg.h"
#include "common/tokenizer.h"
#include "kernels/backend.h"
#include "common/callm.h"
#include "common/gram.h"

/* A byte trie of tokens: node 0 is the root (no byte); children in increasing byte order. */
typedef struct cst_trie {
    uint8_t *byte;        /* [n_nodes] the byte leading to the node */
    int32_t *child;       /* [n_nodes] first child, or -1 */
    int32_t *sibling;     /* [n_nodes] next sibling, or -1 */
    int32_t *tok;         /* [n_nodes] first token whose bytes end here, or -1 */
    int32_t n_nodes;
    int32_t depth;        /* longest token, bytes */
} cst_trie;

/* What a model's vocabulary is to the matcher: built once per model, read-only after. */
typedef struct cst_vocab {
    int64_t n_vocab;      /* rows of the model's logits (may exceed the tokenizer's) */
    int64_t words;        /* OPS_MASK_WORDS(n_vocab) */
    uint8_t *bytes;       /* every token's bytes back to back */
    uint32_t *off;        /* [n_vocab + 1] token i is bytes [off[i], off[i + 1]) */
    int32_t *same_next;   /* [n_vocab] next token with the same bytes, or -1 */
    uint32_t *normal;     /* [words] tokens that can be document text (normal, with bytes) */
    uint32_t *plain;      /* [words] those of plain string characters only (see the top) */
    uint32_t *plain_nolt; /* [words] those without '<' (free text inside a tool call) */
    uint32_t *eog;        /* [words] end-of-generation tokens */
    int32_t call_open;    /* "<tool_call>", or -1 */
    int32_t call_close;   /* "</tool_call>", or -1 */
    cst_trie all;         /* every normal token with bytes */
    cst_trie other;       /* those not in plain */
    cst_trie plain_lt;    /* the plain ones with a '<' */
} cst_vocab;

td_err cst_vocab_init(cst_vocab *v, const tokenizer *t, int64_t n_vocab);
void cst_vocab_free(cst_vocab *v);

/* A format checked and compiled (cst_compile). */
typedef struct cst_compiled {
    jc_schema *schema;    /* JSON formats */
    cm_grammar *call;     /* the tool-call formats with a tool spec, a choice */
    gm_grammar *gram;     /* a grammar or a regular expression */
} cst_compiled;

void cst_compiled_free(cst_compiled *f);

/* What a generation asks for (msg_gen_start's fields). */
typedef struct cst_cfg {
    msg_format format;    /* MSG_FORMAT_TEXT: nothing to do */
    const char *schema;   /* [n_schema] JSON Schema text (MSG_FORMAT_JSON_SCHEMA), or the tool
                           * spec (MSG_FORMAT_TOOL_CALL, _TOOLS), choice spec
                           * (MSG_FORMAT_CHOICE) or tags spec (MSG_FORMAT_TAGS), cm_compile's
                           * (a required call without one: a free body), a GBNF grammar
                           * (MSG_FORMAT_GRAMMAR) or a regular expression (MSG_FORMAT_REGEX),
                           * common/gram.h's */
    size_t n_schema;
    bool think_open;      /* the prompt leaves a reasoning block open */
    int32_t think_start;  /* the token that opens one, or -1 */
    int32_t think_end;    /* the token that closes it, or -1 */
    const cst_compiled *compiled; /* the format already checked and compiled (cst_compile;
                                   * kept by the caller until cst_free), or NULL */
} cst_cfg;

#define CST_MEMO 8           /* masks remembered per generation */
#define CST_DFA_STATES 2048  /* matcher states a generation's transition cache holds */
#define CST_DFA_BYTES (8u << 20) /* and their bytes at most */
#define CST_MASK_BUDGET_S 1.0 /* a mask's walk longer than this fails the generation */

typedef enum cst_phase {
    CST_OPEN = 0,  /* output start: a reasoning block may open, else the answer begins */
    CST_THINK,     /* inside a reasoning block: anything but the end of generation */
    CST_DOC,       /* the document (JSON formats) */
    CST_END,       /* an end-of-generation token was emitted: only those */
    CST_CALL,      /* the answer's first token: the tool-call opener (tool-call format) */
    CST_IN_CALL,   /* inside that call: its body (anything but the end of generation without
                    * a tool spec), then "</tool_call>" */
    CST_FREE,      /* after it: anything; "<tool_call>" opens a call matched again (with a
                    * tool spec) */
} cst_phase;

typedef struct cst_state {
    bool on;              /* a format applies */
    const cst_vocab *v;
    jc_schema *schema;    /* JSON formats; NULL for the tool-call format */
    cm_grammar *call;     /* the tool-call formats with a tool spec, a choice; else NULL */
    gm_grammar *gram;     /* a grammar or a regular expression; else NULL */
    bool own_schema;      /* schema and call compiled by cst_init (else cfg->compiled) */
    size_t size;          /* bytes of a matcher state (8 without a matcher) */
    cst_phase phase;
    cst_phase answer;     /* the answer's first phase: CST_DOC or CST_CALL */
    int32_t think_start, think_end;
    bool think_open;
    uint8_t *cur;         /* [size] the matcher after the emitted text */
    int64_t block;        /* rows of a block at most */
    uint8_t *rows;        /* [block][size] states along a block's drafts */
    cst_phase *row_phase; /* [block] */
    uint8_t *walk;        /* [trie depth + 2][size] the trie walk's states */
    int32_t *walk_node;   /* [trie depth + 1] */
    /* Transitions between the matcher states the trie walks meet (a lazy DFA, built as
     * walks go and kept across masks: a walk then costs a table lookup per trie node once
     * its states were seen). State k is bytes [off[k], off[k] + len[k]) of blob (its
     * canonical bytes: cst_canon); next[k * 256 + b] is the state after byte b, or
     * CST_DFA_UNKNOWN / CST_DFA_REFUSED. Emptied when full. */
    struct cst_dfa {
        uint8_t *blob;
        size_t blob_used;
        uint32_t *off, *len;  /* [CST_DFA_STATES] */
        uint64_t *hash;       /* [CST_DFA_STATES] */
        int32_t *next;        /* [CST_DFA_STATES][256] */
        int32_t *slot;        /* [2 * CST_DFA_STATES] open addressing, -1 empty */
        int32_t n;
        int32_t cap;          /* states at most: CST_DFA_STATES (tests lower it) */
        uint8_t *key;         /* [size] scratch */
        int32_t *ids;         /* [trie depth + 1] the walk's states */
    } dfa;
    double budget_s;      /* a mask's time: CST_MASK_BUDGET_S (tests lower it) */
    double deadline;      /* when the mask being walked runs out of time (cst_now) */
    uint64_t nodes;       /* trie nodes walked for it */
    bool over;            /* it ran out */
    uint32_t *host;       /* [block][words] masks being built */
    void *dev;            /* [block][words] the same on the backend, or NULL until used */
    /* Masks of recent states (a string's content leaves its state as it was, so the rows
     * of a block inside one string share one mask): key = state bytes + phase. */
    struct cst_memo {
        uint64_t hash;    /* 0: empty */
        uint8_t *key;     /* [size + 1] */
        uint32_t *mask;   /* [words] */
        uint64_t used;    /* last use (c->clock) */
    } memo[CST_MEMO];
    uint64_t clock;
} cst_state;

/* Checks cfg against the vocabulary and compiles its schema or tool spec into *out (nothing
 * for text; the caller frees it with cst_compiled_free). Errors as cst_init's. */
td_err cst_compile(const cst_cfg *cfg, const cst_vocab *v, cst_compiled *out);

/* TD_EINVAL / TD_ENOTSUP for a schema jsonc, a tool spec callm or a grammar gram refuses (its
 * message),
 * TD_ENOTSUP for a format
 * without a vocabulary (a model file without a tokenizer) or a tool-call format for a
 * vocabulary without the tool-call tokens, TD_EINVAL for reasoning tokens
 * outside it; TD_ENOMEM. v may be NULL for MSG_FORMAT_TEXT. block: rows of a verify block
 * at most. */
td_err cst_init(cst_state *c, const cst_cfg *cfg, const cst_vocab *v, int64_t block);
/* be: the backend that holds c->dev (may be NULL when nothing was applied yet). */
void cst_free(cst_state *c, const ops_backend *be);

/* A new generation: nothing emitted. */
void cst_reset(cst_state *c);

/* How many of drafts [n] the format lets through in order (each allowed after the ones
 * before it); n when it is off. */
int64_t cst_allowed(cst_state *c, const int32_t *drafts, int64_t n);

/* Masks rows 0..n-1 of logits [n][n_vocab] (backend memory of be): row i after drafts
 * [0..i-1] (NULL when n == 1), which must be allowed (cst_allowed). A no-op when off. */
td_err cst_apply(cst_state *c, const ops_backend *be, float *logits, const int32_t *drafts,
                 int64_t n);

/* tok [n] were emitted. TD_EINVAL when one was not allowed (the logits gave no allowed
 * token a finite value); the state is then unchanged. */
td_err cst_emit(cst_state *c, const int32_t *tok, int64_t n);

/* The allowed set of the current state into mask [words] (tests and tools). cst_apply and
 * cst_mask fail with TD_ENOTSUP when a mask's walk takes longer than CST_MASK_BUDGET_S (a
 * format too costly to match: the generation ends with that error, nothing else waits). */
td_err cst_mask(cst_state *c, uint32_t *mask);

#endif
