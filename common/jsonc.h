/* JSON constraint: decides, byte by byte, whether a text is still the beginning of at least one
 * JSON document valid under a JSON Schema ("viable prefix"), and whether it already is a whole
 * one. Structured output ("response_format": json_object / json_schema) keeps, at every step,
 * only the tokens whose bytes all pass: the caller feeds a token's bytes into a copy of the
 * current state and keeps the token when no byte is rejected.
 *
 * Text: standard JSON (RFC 8259). Whitespace (space, \t, \n, \r) where JSON allows it, also before
 * and after the document, at most JC_WS_MAX bytes in a row (a model must not loop on whitespace
 * forever), or none at all in a compact schema (jc_compile_ws); numbers at most JC_NUMBER_MAX
 * bytes; at most JC_DEPTH_MAX open objects and arrays (deeper input is rejected, which also bounds
 * recursion through $ref). Strings: no raw byte below 0x20; escapes \" \\ \/ \b \f \n \r \t \uXXXX
 * (hex in any case), a \u high surrogate must be followed by a \u low one, a lone low one is
 * rejected; raw bytes >= 0x80 must be UTF-8 (no overlong forms, no U+D800..DFFF, nothing above
 * U+10FFFF), and a character may be split across feeds. A number ends at the first byte that
 * cannot continue it, which is then matched by what follows; a top-level number is done wherever
 * it could end. Numbers end only where jansson can read them back: an integer (no fraction, no
 * exponent) within int64, and a real whose integer digits plus exponent stay below 308 (so it
 * cannot overflow a double; this refuses a few reals near DBL_MAX, like 5e307 written as 0.5e308).
 * A longer integer stays viable, since ".0" would still make it a real; with type "integer" it is
 * rejected at the digit that overflows.
 *
 * Schema keywords enforced: type (a name or an array of names: string, number, integer,
 * boolean, null, object, array; "integer" is -?(0|[1-9][0-9]*) only), properties, required,
 * additionalProperties (absent or true: any other key, any value; false: none; a schema: the
 * other keys' values), items (a schema; false: nothing past prefixItems; the draft-4 array form
 * is read as prefixItems, with additionalItems for the rest), prefixItems, minItems, maxItems,
 * minLength and maxLength (code points of the decoded string: an escape, or a surrogate pair,
 * is one), minimum, maximum, exclusiveMinimum and exclusiveMaximum (draft 4's boolean forms
 * too; they bind numbers only): a number is rejected at the first byte after which no number
 * of the range can follow ("13" then "0" under maximum 120), and may end only inside it. Type
 * "integer": exact int64 ends (a real bound rounded inward; "-0" is 0). Reals: the value is
 * what strtod reads (the nearest double, ties to even), as a reader compares it, so "0.1"
 * meets minimum 0.1 and "0.10000000000000001" maximum 0.1; a ranged number has no exponent,
 * and its ends are rounded inward to the fraction digits a JC_NUMBER_MAX-byte number there can
 * hold (which loses no such number). An empty range drops the numbers. Also enforced: enum
 * and const; pattern (a string holds a match of the regular expression, searched as JSON
 * Schema says: common/gram.h's gm_compile_pattern, ECMA-262's common syntax with its \s and
 * '.', and ASCII \d \w; a string is cut at the first character after which no
 * match can be completed, within maxLength when there is one, and reaching minLength (with both,
 * a completion of a length in between is assumed when the shortest fits one and the longest
 * the other)); anyOf and oneOf (both as a union: oneOf's "exactly one" is not
 * enforced), allOf with one subschema, $ref to "#", "#/$defs/<name>" or
 * "#/definitions/<name>" (~0 and ~1 decoded), $defs / definitions, and the boolean schemas true
 * and false. Keywords combine as JSON Schema says (type object + properties: both apply);
 * anyOf / oneOf / allOf / $ref may stand beside type, enum, const and annotations, but not
 * beside other assertions (TD_ENOTSUP), nor two of them together.
 *
 * enum and const values are matched as their compact serialisation, byte for byte: no spaces,
 * object keys in the order written, strings escaped as jansson writes them (UTF-8 kept, "/" not
 * escaped), reals in the shortest form that reads back to the same double ("0.1"; "1.0" stays a
 * real). Values that the schema's other keywords rule out are dropped at compile time.
 *
 * Objects: properties in any order, each at most once ('}' only once every required one
 * appeared). A key is compared with the declared names by its decoded bytes, so "\u0061" is the
 * property "a"; a key that is a prefix of a declared name stays both until its closing quote.
 * A repeated declared key is rejected; a repeated undeclared key is not (the state has a fixed
 * size), and jansson keeps the last one.
 *
 * Ignored: title, description, default, examples, $schema, $id, $anchor, $comment, format,
 * deprecated, readOnly, writeOnly, contentEncoding, contentMediaType, discriminator, nullable
 * and any other unknown keyword. Refused with TD_ENOTSUP (they would constrain the value in
 * ways not enforced): patternProperties, propertyNames, multipleOf, uniqueItems,
 * minProperties, maxProperties,
 * contains, minContains, maxContains, not, if, then, else, dependencies, dependentRequired,
 * dependentSchemas, unevaluatedProperties, unevaluatedItems, $dynamicRef, $recursiveRef
 * ("uniqueItems": false asserts nothing and is accepted).
 *
 * Empty languages: a subschema that no value satisfies (false, minItems > maxItems, a required
 * property whose schema is false, a $ref loop that needs endless nesting, ...) is accepted and
 * simply never matched: a property it guards cannot be written, an anyOf branch is dropped. A
 * schema whose whole language is empty is refused with TD_EINVAL, so every prefix that jc_feed
 * accepts can be completed (save for documents that would need more than JC_DEPTH_MAX levels).
 *
 * Nondeterminism (anyOf / oneOf with branches that begin alike) is a set of live alternatives,
 * each a deterministic stack; they fork at the first byte of a value, die on their own, and
 * identical ones merge. With more than JC_ALT_MAX alive the byte that would make them is
 * rejected, so a valid but highly ambiguous document can be cut short. Type arrays, enum
 * values sharing a prefix and keys that may be declared or not never fork. A schema without
 * anyOf / oneOf has one alternative, and jc_state_size is then small.
 *
 * Compile limits (TD_ENOTSUP): the JC_*_MAX below, schema objects nested 128 deep, 65535 values
 * per enum, 16 MiB of property names and enum values, and a bounded amount of work checking
 * enum / const values against the rest of their schema. A 150 KiB schema compiles in ~10 ms. */
#ifndef TANDEM_COMMON_JSONC_H
#define TANDEM_COMMON_JSONC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

enum {
    JC_WS_MAX = 64,       /* whitespace bytes in a row */
    JC_NUMBER_MAX = 64,   /* bytes of one number */
    JC_DEPTH_MAX = 32,    /* open objects and arrays */
    JC_ALT_MAX = 32,      /* live alternatives */
    JC_NODES_MAX = 4096,  /* compiled subschemas, counting copies made for type restrictions */
    JC_PROPS_MAX = 64,    /* properties of one object schema, required-only names included */
    JC_BRANCHES_MAX = 128 /* subschemas of one anyOf / oneOf */
};

/* Compiled schema: immutable, shareable between threads. */
typedef struct jc_schema jc_schema;

/* schema[0..len): JSON text of a JSON Schema; NULL means "any JSON object" (OpenAI json_object
 * mode). TD_EINVAL for malformed or invalid schemas (the message names the JSON pointer, e.g.
 * "schema #/properties/a/type: unknown type 'strin'"), TD_ENOTSUP for keywords or combinations
 * not enforced and for the limits above (naming the keyword and its pointer), TD_ENOMEM. */
td_err jc_compile(const char *schema, size_t len, jc_schema **out);
/* jc_compile; compact: no whitespace anywhere, the document as JSON_COMPACT writes it. */
td_err jc_compile_ws(const char *schema, size_t len, bool compact, jc_schema **out);
void jc_schema_free(jc_schema *s);

/* A matcher state is a plain byte blob of at most jc_state_size(s) bytes, 4-byte aligned, with
 * no pointers into itself: the caller may keep a stack of them and copy them. The live part is
 * at the front and its length in a header, so copies of shallow states are cheap: 8 bytes of
 * header, then per alternative 20 bytes plus 12 per open object or array (40 bytes inside
 * {"a":"...). jc_state_size is 412 bytes for a schema that cannot fork (no anyOf / oneOf with
 * two live branches), else 12936. The live part alone decides everything that follows, so it
 * may serve as a cache key; what a finished token leaves is cleared, so states reached along
 * different paths mostly compare equal. */
size_t jc_state_size(const jc_schema *s);
/* The state before the first byte. */
void jc_state_init(const jc_schema *s, void *st);
/* Copies the live part of src (bytes: jc_state_used). */
void jc_state_copy(const jc_schema *s, void *dst, const void *src);
/* Bytes of the live part. */
size_t jc_state_used(const void *st);

/* Feeds bytes[0..n); false when some byte makes the text no longer a viable prefix (*st is
 * then unspecified: callers feed into a copy). */
bool jc_feed(const jc_schema *s, void *st, const uint8_t *bytes, size_t n);

/* True when the bytes so far are a whole valid document (trailing whitespace allowed): the
 * generation may end here. */
bool jc_done(const jc_schema *s, const void *st);

/* True when every live alternative is inside a string whose content is unconstrained (not an
 * enum / const literal, not a key that could still be a declared name, no minLength /
 * maxLength), at a character boundary with no escape pending. Then any byte string made of whole
 * UTF-8 characters, every byte >= 0x20 and none '"' or '\\', is accepted and leaves the state
 * exactly as it was, so such a token may be kept without feeding it. */
bool jc_free_string(const jc_schema *s, const void *st);

#endif
