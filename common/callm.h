/* Tool-call matcher: decides, byte by byte, whether a text is still the beginning of a tool
 * call's body (what a model writes between its <tool_call> and </tool_call> tokens) that
 * names one of the request's functions with arguments valid under that function's
 * parameters, and whether it already is a whole one. A required tool call (tool_choice
 * "required" or a named function) keeps only the tokens whose bytes pass, as
 * verifyd/constrain.h does for response formats.
 *
 * The body has the form the chat template teaches, read back as gateway/toolcall.h reads it:
 *
 *   XML (Qwen3-Coder, Qwen3.5):  <function=NAME>                 between the tags: up to 8
 *                                <parameter=PARAM>                spaces, tabs or newlines
 *                                VALUE                            (the template writes one
 *                                </parameter>                     newline); names exactly
 *                                ...                              as declared
 *                                </function>
 *     A function's parameters are its `properties`: each at most once, in any order, every
 *     `required` one before </function> (a function without `properties` takes any names
 *     with free values). A value is everything up to the first "</parameter>", less one
 *     newline at each end. A parameter whose schema's (first non-null) type is "string" has
 *     its raw text as the string: it is matched as that JSON string under the parameter's
 *     schema (enum, const, minLength, maxLength hold); any other type (or a schema that
 *     constrains without a type) has JSON text matched under the schema, with no whitespace
 *     before or after it; a schema that says nothing takes any text.
 *   JSON (Qwen3):                {"name": NAME, "arguments": {...}}
 *     One JSON object, matched by common/jsonc under the union over the functions of
 *     {"name": const NAME, "arguments": its parameters}.
 *
 * Parameter schemas are JSON Schemas as jsonc enforces them ($ref into the parameters' own
 * $defs / definitions works); what jsonc refuses is refused here with its message.
 *
 * The same matcher takes a choice (vLLM's guided_choice): the text is exactly one of a list
 * of strings, byte for byte; and structural tags (vLLM's structural_tag): the text is free
 * until it ends with one of the triggers, which opens the structures whose begin starts with
 * it; the text then goes on with one of those begins whole, a JSON value valid under that
 * structure's schema, and its end, and is free again (the JSON ends where the end's first
 * byte comes once it is whole). Triggers may not hold one another, nor a begin be the
 * beginning of another; every begin opens with a trigger; ends are not empty. With
 * at_least_one the text is whole only after a structure; with stop_after_first nothing
 * follows the first. */
#ifndef TANDEM_COMMON_CALLM_H
#define TANDEM_COMMON_CALLM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/err.h"

#define CM_FUNCTIONS_MAX 128 /* functions of one request */
#define CM_PARAMS_MAX 64     /* declared parameters of one function */
#define CM_NAME_MAX 1024     /* bytes of a function or parameter name */
#define CM_WS_MAX 8          /* whitespace bytes between two tags */
#define CM_CHOICES_MAX 1024  /* strings of a choice */
#define CM_TRIGGERS_MAX 16   /* triggers of structural tags */

typedef struct cm_grammar cm_grammar;

/* spec[0..len): {"form": "xml" | "json", "tools": [{"name": "...", "parameters": {...}}, ...]}
 * (1..CM_FUNCTIONS_MAX distinct names, parameters optional), or {"form": "choice",
 * "choices": ["...", ...]} (1..CM_CHOICES_MAX strings of 1..CM_NAME_MAX bytes, any bytes;
 * repeats are one), or {"form": "tags", "triggers": ["...", ...] (1..CM_TRIGGERS_MAX),
 * "structures": [{"begin": "...", "schema": {...}, "end": "..."}, ...] (1..CM_FUNCTIONS_MAX),
 * "at_least_one": bool, "stop_after_first": bool} (strings of 1..CM_NAME_MAX bytes).
 * TD_EINVAL for a malformed spec or schema, TD_ENOTSUP for what cannot be enforced (a name
 * with '<', '>' or a newline, more than CM_PARAMS_MAX parameters, jsonc's refusals, triggers
 * or begins that hold or begin one another), TD_ENOMEM. */
td_err cm_compile(const char *spec, size_t len, cm_grammar **out);
void cm_free(cm_grammar *g);

/* A state is a plain byte blob of cm_state_size(g) bytes (8-byte aligned, no pointers). */
size_t cm_state_size(const cm_grammar *g);
void cm_state_init(const cm_grammar *g, void *st);
/* The type a parameter's value is read as: the schema's "type", or the first of its types
 * that is not "null" (["integer", "null"]: "integer"), or NULL. The gateway reads a call's
 * XML values by it too (gateway/toolcall.h). */
const char *cm_value_type(const json_t *schema);

/* Copies what decides the future (the rest of dst is left as it was). */
void cm_state_copy(const cm_grammar *g, void *dst, const void *src);

/* Feeds bytes[0..n); false when some byte makes the text no longer a viable prefix (*st is
 * then unspecified). */
bool cm_feed(const cm_grammar *g, void *st, const uint8_t *bytes, size_t n);

/* True inside a parameter's value where every byte string of whole UTF-8 characters, each
 * byte >= 0x20 and none '"', a backslash or '<', is accepted and leaves the state exactly as
 * it was (free text, or a string whose content jsonc leaves free), so such a token may be
 * kept without feeding it. */
bool cm_free_text(const cm_grammar *g, const void *st);

/* True when the bytes so far are a whole call (trailing whitespace allowed), or one of the
 * choices (a longer one may still follow). */
bool cm_done(const cm_grammar *g, const void *st);

#endif
