/* Generated tokens -> what the client sees: content, reasoning and tool calls.
 *
 * One pipeline serves streamed and whole responses, so both always say the same thing:
 *
 *   token ids -> streaming decoder (whole UTF-8 characters only, special tokens skipped)
 *             -> stop strings (held back while they may still match; the text ends before one)
 *             -> reasoning split (<think>...</think> -> reasoning, the rest -> content)
 *             -> tool-call split (<tool_call> blocks -> calls, when the request has tools)
 *             -> pieces
 *
 * A streamed response sends the pieces of each step as they come; a whole response joins them.
 * Adjacent pieces of one kind are merged. */
#ifndef TANDEM_GATEWAY_OUTPUT_H
#define TANDEM_GATEWAY_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/err.h"
#include "common/tokenizer.h"
#include "gateway/reasoning.h"
#include "gateway/stopstr.h"
#include "gateway/toolcall.h"

typedef enum out_kind {
    OUT_CONTENT = 1,
    OUT_REASONING,
    OUT_TOOL_CALL,
    OUT_CALL_OPEN, /* stream_calls: a call begins (call.name) */
    OUT_CALL_ARGS, /* stream_calls: more of the begun call's arguments (text) */
} out_kind;

/* With stream_calls a call may come as OUT_CALL_OPEN, OUT_CALL_ARGS pieces, then its
 * OUT_TOOL_CALL, whose arguments begin with the call.streamed bytes the ARGS pieces had. */
typedef struct out_piece {
    out_kind kind;
    char *text;          /* CONTENT / REASONING / CALL_ARGS: [len] UTF-8, NUL-terminated */
    size_t len;          /* bytes */
    tool_call call;      /* TOOL_CALL; CALL_OPEN: the name alone */
    uint32_t call_index; /* TOOL_CALL, CALL_*: 0 for the response's first call, 1, ... */
} out_piece;

typedef struct output_opts {
    const char *const *stops; /* [n_stops] stop strings (borrowed), or NULL */
    const size_t *stop_lens;  /* [n_stops] bytes of each */
    size_t n_stops;
    bool reasoning;           /* split <think> blocks off as reasoning (chat) */
    bool in_think;            /* the prompt opened a <think> block (think_prompt_open) */
    const json_t *tools;      /* parse tool calls with these schemas, or NULL: no parsing */
    bool calls_matched;       /* verifyd matched the calls: one the output ends inside is text */
    bool stream_calls;        /* calls in the XML form also come as they are written */
    bool keep_stop;           /* the stop string that ends the text is part of it */
    bool keep_special;        /* control tokens print their text (else nothing) */
} output_opts;

typedef struct gw_output {
    const tokenizer *tok;
    tok_stream ts;
    tok_bytes text;        /* decoder output of the current token */
    stop_filter stop;
    bool reasoning, tools;
    think_split think;
    tool_split tool;
    out_piece *pieces;     /* [n_pieces] produced since the last output_clear */
    size_t n_pieces;
    size_t cap;            /* pieces allocated */
    uint32_t n_calls;      /* tool calls produced so far */
    uint32_t reasoning_tokens; /* tokens pushed inside a reasoning block, its markers
                                * included */
    bool stopped;          /* a stop string ended the text */
    bool finished;         /* output_finish ran */
} gw_output;

td_err output_init(gw_output *o, const tokenizer *tok, const output_opts *opts);
void output_free(gw_output *o);

/* Feeds generated token ids. *n_used (may be NULL) gets how many of them count: all of them,
 * or up to and including the token that completed a stop string (o->stopped is then set and
 * later tokens are ignored). TD_ERANGE for an id outside the vocabulary. */
td_err output_push(gw_output *o, const int32_t *ids, size_t n, size_t *n_used);

/* The end of the generation: flushes every stage. */
td_err output_finish(gw_output *o);

/* Drops the pieces produced so far (after the caller has sent them). */
void output_clear(gw_output *o);

#endif
