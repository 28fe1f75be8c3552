/* Tool calls in Qwen model output -> OpenAI `tool_calls`.
 *
 * The Qwen chat templates teach the model to answer with blocks
 *
 *     <tool_call>
 *     {"name": "get_weather", "arguments": {"city": "Paris"}}          (Qwen3: JSON)
 *     </tool_call>
 *
 *     <tool_call>
 *     <function=get_weather>
 *     <parameter=city>
 *     Paris
 *     </parameter>
 *     </function>
 *     </tool_call>                                        (Qwen3-Coder, Qwen3.5: XML)
 *
 * tool_parse reads one block's body into a name and an `arguments` JSON text. The JSON form's
 * arguments are the model's own JSON text (validated, not re-printed). XML parameter values are
 * plain text (the template prints strings as they are and other values as JSON); each becomes
 * the JSON type the tool's schema gives the parameter (string, integer, number, boolean,
 * object, array; the JSON null for any of them but string), and without a schema a value
 * that parses as JSON is taken as JSON, anything else as a string. The arguments object is printed as Python's json.dumps prints it
 * ({"a": 1, "b": "x"}), as the templates' tojson does.
 *
 * tool_split separates streamed content text from tool-call blocks: text before, between and
 * after blocks passes on as content (whitespace next to a block is dropped), each complete
 * block is parsed and passed on as a call. A block that does not parse is passed on as the
 * content text it was, so nothing the model wrote is lost. With stream_args, a block's call is
 * also passed on while it is written: begun once its name is complete, then its arguments'
 * JSON text piece by piece as far as no later text can change it (XML: finished parameters
 * and a string parameter's text so far; JSON, {"name": ..., "arguments": {...}} in that
 * order: the arguments object's own text so far), so that the pieces are always the
 * beginning of the arguments the whole call has in the end. */
#ifndef TANDEM_GATEWAY_TOOLCALL_H
#define TANDEM_GATEWAY_TOOLCALL_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "common/err.h"

typedef struct tool_call {
    char *name;      /* NUL-terminated function name */
    char *arguments; /* NUL-terminated JSON text of an object */
    size_t streamed; /* tool_split: bytes of arguments passed on before (TOOL_EMIT_ARGS) */
} tool_call;

/* Parses the text between <tool_call> and </tool_call>. tools is the request's tools array
 * (for parameter types) or NULL. TD_EFORMAT with a message when it is not a tool call. */
td_err tool_parse(const char *body, size_t len, const json_t *tools, tool_call *out);
void tool_call_free(tool_call *c);

/* What the split passes on, in order. */
typedef enum tool_emit_kind {
    TOOL_EMIT_TEXT, /* content text (text, len) */
    TOOL_EMIT_CALL, /* a whole call (call) */
    TOOL_EMIT_OPEN, /* stream_args: a call begins (call: its name; arguments NULL) */
    TOOL_EMIT_ARGS, /* stream_args: more of the begun call's arguments (text, len) */
} tool_emit_kind;

/* A call begun by TOOL_EMIT_OPEN ends as a TOOL_EMIT_CALL whose arguments start with the
 * call->streamed bytes passed on by TOOL_EMIT_ARGS, or, when its block does not parse in the
 * end, as the TOOL_EMIT_TEXT it was. */
typedef td_err (*tool_emit)(void *ctx, tool_emit_kind kind, const char *text, size_t len,
                            const tool_call *call);

typedef enum tool_state {
    TOOL_TEXT = 0, /* content; "<tool_call>" may start */
    TOOL_IN,       /* inside a block, waiting for "</tool_call>" */
} tool_state;

/* Where an open block's arguments stand after they were passed on: the XML string value or the
 * JSON arguments object that new text continues, so that only the new text is looked at. */
typedef struct tool_fast {
    int kind;      /* 0: nowhere (the open block is parsed again), else TOOL_FAST_* */
    size_t at;     /* in the open block's text: the value's first byte, the object's '{' */
    size_t done;   /* bytes of it passed on (XML: its leading newline included) */
    size_t scan;   /* JSON: bytes of it scanned, and there: */
    size_t depth;  /*   the brackets open, */
    bool in_str;   /*   inside a string, */
    bool esc;      /*   right after a backslash in it */
} tool_fast;

enum { TOOL_FAST_XML = 1, TOOL_FAST_JSON };

typedef struct tool_split {
    tool_state state;
    const json_t *tools; /* borrowed: the request's tools, for parameter types */
    bool called;         /* at least one call was passed on */
    bool closed_only;    /* the calls were matched as they were generated: a block the output
                          * ends inside is cut off, passed on as text, not parsed */
    bool after_call;     /* no content since the last block: leading whitespace is dropped */
    bool stream_args;    /* pass XML calls on while they are written (see above) */
    bool opened;         /* stream_args: the open block's call was passed on as begun */
    char *sent;          /* stream_args: [sent_len] its arguments passed on so far */
    size_t sent_len, sent_cap;
    char *hold;          /* [hold_len] undecided text, or the open block's body */
    size_t hold_len;     /* bytes */
    size_t hold_cap;     /* bytes allocated */
    char *scratch;       /* [scratch_cap] hold + the new piece */
    size_t scratch_cap;
    tool_fast fast;      /* stream_args: where new text only continues what was passed on */
    tool_emit emit;
    void *ctx;
} tool_split;

void tool_split_init(tool_split *s, const json_t *tools, tool_emit emit, void *ctx);
void tool_split_free(tool_split *s);
td_err tool_split_push(tool_split *s, const char *text, size_t len);
/* The end of the output: an unterminated block is parsed as if it were closed (a model may
 * end without "</tool_call>"), or with closed_only passed on as the text it was. */
td_err tool_split_flush(tool_split *s);

#endif
