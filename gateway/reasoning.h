/* Reasoning split: thinking models (Qwen3, Qwen3.5) write their reasoning between <think> and
 * </think> before the answer; OpenAI-style servers return it as `reasoning_content` apart from
 * `content`.
 *
 * The reasoning starts either in the prompt (Qwen3.5's generation prompt ends with
 * "<think>\n", so the output opens inside the block) or in the output (Qwen3 writes "<think>"
 * itself, possibly after whitespace). The splitter works on streamed text: a piece that could
 * still become "<think>" or "</think>" is held until the next piece decides it. The newlines the
 * templates put around the block are not part of either text: newlines right after <think> and
 * right before </think> are dropped, and so are newlines right after </think>, the same
 * clean-up the Qwen templates apply to reasoning in the history (strip('\n')). */
#ifndef TANDEM_GATEWAY_REASONING_H
#define TANDEM_GATEWAY_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

/* Receives split text in order; reasoning tells which side a piece is on. */
typedef td_err (*think_emit)(void *ctx, bool reasoning, const char *text, size_t len);

typedef enum think_state {
    THINK_START = 0, /* output start: "<think>" may still come (after whitespace) */
    THINK_IN,        /* inside the reasoning block */
    THINK_CONTENT,   /* the answer: everything passes through */
} think_state;

typedef struct think_split {
    think_state state;
    bool strip_nl;   /* at the start of reasoning or content: newlines are dropped */
    char *hold;      /* [hold_len] undecided text (a marker's beginning, trailing newlines) */
    size_t hold_len; /* bytes */
    size_t hold_cap; /* bytes allocated */
    char *scratch;   /* [scratch_cap] hold + the new piece */
    size_t scratch_cap;
    think_emit emit;
    void *ctx;
} think_split;

/* in_think: the prompt already opened the block (think_prompt_open). */
void think_init(think_split *t, bool in_think, think_emit emit, void *ctx);
void think_free(think_split *t);
td_err think_push(think_split *t, const char *text, size_t len);
/* The end of the output: held text is emitted on its side (a cut-off marker as plain text). */
td_err think_flush(think_split *t);

/* True when the rendered prompt ends inside a reasoning block: in its last ChatML turn (from
 * the last "<|im_start|>", or the whole prompt without one) the last "<think>" has no
 * "</think>" after it. */
bool think_prompt_open(const char *prompt, size_t len);

#endif
