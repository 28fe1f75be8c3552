/* Log probabilities of generated tokens, in the two shapes of the OpenAI API:
 *
 * chat:        {"content":[{"token":"Hi","logprob":-0.25,"bytes":[72,105],
 *                            "top_logprobs":[{"token":"Hi","logprob":-0.25,"bytes":[72,105]}, ...]}],
 *               "refusal":null}
 * completions: {"tokens":["Hi"],"token_logprobs":[-0.25],"top_logprobs":[{"Hi":-0.25, ...}],
 *               "text_offset":[0]}  (an echoed prompt's first token: null and null)
 *
 * and vLLM's prompt_logprobs, one entry per prompt token (the first: null), the token first,
 * then its alternatives:
 *              [null, {"1024":{"logprob":-2.5,"rank":3,"decoded_token":" the"},
 *                      "11":{"logprob":-0.5,"rank":1,"decoded_token":","}, ...}, ...]
 *
 * A token's text is its own decoding (special tokens included); a token that holds only part
 * of a UTF-8 character shows U+FFFD in "token", and its "bytes" keep the bytes of an unfinished
 * character that the decoder could still complete. JSON has no infinities: a probability of 0
 * is -9999.0, as OpenAI reports it. */
#ifndef TANDEM_GATEWAY_LOGPROBS_H
#define TANDEM_GATEWAY_LOGPROBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/err.h"
#include "common/tokenizer.h"
#include "gateway/request.h"

typedef struct lp_alt {
    int32_t id;
    float logprob; /* natural log */
} lp_alt;

typedef struct lp_token {
    int32_t id;                       /* the generated (or echoed prompt) token */
    bool none;                        /* a prompt's first token: no log probability (null, and
                                       * null alternatives, in a completions object) */
    float logprob;                    /* its log probability under the target */
    uint32_t rank;                    /* tokens at least as likely, itself included (0:
                                       * unknown) */
    uint32_t n_top;                   /* alternatives, 0..REQ_TOP_LOGPROBS_MAX */
    lp_alt top[REQ_TOP_LOGPROBS_MAX]; /* [n_top] most likely first */
} lp_token;

/* The JSON number for a log probability: the shortest decimal that reads back as the same
 * float (-0.1f -> -0.1), -9999 for -inf and NaN. Dump with JSON_REAL_PRECISION(15) or more so
 * the digits survive. */
double lp_value(float logprob);

/* Appends the entries of tokens[0..n) to a chat "content" array. */
td_err lp_append_chat(json_t *content, const tokenizer *tok, const lp_token *tokens, size_t n);

/* {"content": content, "refusal": null}; takes the reference to content. */
json_t *lp_chat_object(json_t *content);

/* Appends tokens[0..n) to a completions logprobs object (made with lp_completion_object);
 * *text_offset is the character offset of the first token's text, advanced past them. */
td_err lp_append_completion(json_t *obj, const tokenizer *tok, const lp_token *tokens, size_t n,
                            size_t *text_offset);

/* {"tokens":[],"token_logprobs":[],"top_logprobs":[],"text_offset":[]} */
json_t *lp_completion_object(void);

/* vLLM's prompt_logprobs of tokens[0..n) with at most top alternatives each (an alternative
 * that is the token itself keeps the token's place, with the alternative's rank); NULL when
 * out of memory or a token id is not the vocabulary's. */
json_t *lp_prompt_list(const tokenizer *tok, const lp_token *tokens, size_t n, uint32_t top);

#endif
