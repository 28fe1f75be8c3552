/* Grammar matcher: decides, byte by byte, whether a text is still the beginning of a sentence
 * of a context-free grammar over Unicode code points, and whether it already is a whole one.
 * Structured output by a grammar (llama.cpp's "grammar", vLLM's guided_grammar) or a regular
 * expression (vLLM's guided_regex) keeps only the tokens whose bytes pass, as
 * verifyd/constrain.h does for JSON schemas.
 *
 * Grammars are GBNF, llama.cpp's notation: rules `name ::= alternatives` (names of letters,
 * digits, '-' and '_'; a newline ends a rule except right after '::=', inside parentheses or
 * after '|'), "root" the sentence; literals "..." and character classes [...] / [^...] with
 * ranges, escapes \n \r \t \\ \" \' \[ \] \- \/ \xHH \uHHHH \UHHHHHHHH; '.' any character;
 * groups ( ); '|'; the quantifiers ? * + {m} {m,} {m,n} on the item before them; rule
 * references; # comments. Refused with TD_EINVAL: syntax errors, a rule defined twice, an
 * undefined rule, no root, and left recursion (a rule that can reach itself before any
 * character, which includes an open repetition of an item that can be empty). Token
 * references (<[id]>, <name>) and groups nested deeper than 100 are TD_ENOTSUP.
 *
 * Lark grammars (the EBNF of the Lark parser, as vLLM's guided_grammar takes them), read as
 * languages of characters: definitions `name: alternatives` (rules, lower-case names; a '?' or '!'
 * before the name and a priority `.n` after it shape Lark's trees only and are ignored) and `NAME:
 * alternatives` (terminals, upper-case, built only of strings, regular expressions and terminals),
 * one per line, a line that begins with '|' going on with the definition before; `start` is the
 * sentence, else the first definition. Items: strings "..." or '...' (GBNF's escapes; a trailing
 * `i`: either case), ranges "a".."z", regular expressions /.../ (as below; flags `i`: either case,
 * a character matching those of its case class lower(upper(c)) as in Python's re, `s`: '.' takes
 * \n too, `x`: white space and # comments skipped, `u`, `m`: nothing), names, groups ( ),
 * templates (`name{a, b}: body` defines one, `name{x, "y"}` uses it: its body with each parameter
 * standing for its argument; at most 256 templates, 16 parameters and 256 uses with different
 * arguments), optional [ ], the quantifiers ? * + ~n ~n..m, `-> alias` at an alternative's end
 * (ignored), // comments; `%import common.NAME [-> ALIAS]` and `%import common (NAME, ...)`
 * (Lark's common terminals: DIGIT, HEXDIGIT, INT, SIGNED_INT, DECIMAL, FLOAT, SIGNED_FLOAT,
 * NUMBER, SIGNED_NUMBER, ESCAPED_STRING, LCASE_LETTER, UCASE_LETTER, LETTER, WORD, CNAME,
 * WS_INLINE, WS, CR, LF, NEWLINE, SH_COMMENT, CPP_COMMENT, C_COMMENT, SQL_COMMENT), `%override
 * NAME: ...` / `%extend NAME: ...` (a definition above replaced, or given more alternatives) and
 * `%ignore item`: what it names may stand between any two items of a rule (and a repetition's
 * items), before the sentence and after it. Terminals are not matched longest first as Lark's
 * lexer does: a text that a different split into the same terminals reads is taken too.
 * TD_ENOTSUP: other imports and directives, the flag l; left recursion is refused as in GBNF.
 *
 * Regular expressions (the text must match whole): literals, '.' (any character but \n), classes
 * [...] / [^...] with ranges and \d \w \s \D \W \S (ASCII: [0-9], [A-Za-z0-9_], [ \t\n\r\f\v] and
 * their complements) inside and outside them, groups ( ), (?: ), (?P<n> ) and (?<n> ), '|', the
 * quantifiers ? * + {m} {m,} {m,n} (a lazy '?' after them changes nothing for a whole match),
 * escapes as in GBNF plus \f \v \0 and any escaped punctuation, '^' at the start and '$' at the
 * end of a top-level alternative, Python's inline flags a (folding ASCII letters only), i (either
 * case: a character matches those of its case class lower(upper(c))), s ('.' takes \n too), x
 * (white space and # comments skipped), u and m (nothing: anchors stand only at the ends) for the
 * rest of the expression at its start, (?i), or for a group, (?i-s:...). TD_ENOTSUP for what a
 * grammar cannot say or this does not take: backreferences, lookaround, \b \B \A \Z, possessive
 * quantifiers, the flag L. A JSON Schema pattern (gm_compile_pattern: no inline flags, ECMA-262
 * has none) reads '.' and \s as ECMA-262 does: '.' is any character but a line terminator (\n, \r,
 * U+2028, U+2029), \s also takes U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F,
 * U+3000 and U+FEFF.
 *
 * Text: the bytes must be UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF);
 * a character may be split across feeds, and its first bytes are refused when no character
 * they can begin is allowed there. Limits: GM_ELEMENTS_MAX grammar elements after the
 * quantifiers are written out (a quantifier's bounds at most GM_REPEAT_MAX), and a state of
 * GM_STATE_BYTES: the parse stacks of an ambiguous or deeply nested text that no longer fit
 * make its next character refused (the text stays a valid prefix), and so does a character
 * whose expansion meets more than GM_VISIT_MAX distinct stacks (each is expanded once, however
 * many ways lead to it); a grammar whose start does either is TD_ENOTSUP. */
#ifndef TANDEM_COMMON_GRAM_H
#define TANDEM_COMMON_GRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define GM_ELEMENTS_MAX 65000 /* elements of a compiled grammar (positions are 16-bit) */
#define GM_REPEAT_MAX 1000    /* bounds of {m,n} */
#define GM_STATE_BYTES 4096   /* bytes of a matcher state */
#define GM_DEPTH_MAX 256      /* positions on one parse stack */
#define GM_VISIT_MAX 2048     /* distinct stacks one character's expansion may meet */

typedef struct gm_grammar gm_grammar;

/* text[0..len): a GBNF grammar. TD_EINVAL (the message names the line and column),
 * TD_ENOTSUP, TD_ENOMEM. */
td_err gm_compile_gbnf(const char *text, size_t len, gm_grammar **out);
/* text[0..len): a Lark grammar, as vLLM's guided_grammar takes one (see below). TD_EINVAL (the
 * message names the line and column), TD_ENOTSUP, TD_ENOMEM. */
td_err gm_compile_lark(const char *text, size_t len, gm_grammar **out);
/* GBNF when a line of text begins with a name and '::=', else Lark. */
td_err gm_compile_grammar(const char *text, size_t len, gm_grammar **out);
/* re[0..len): a regular expression (see the top). TD_EINVAL, TD_ENOTSUP, TD_ENOMEM. */
td_err gm_compile_regex(const char *re, size_t len, gm_grammar **out);
/* The same, as JSON Schema's "pattern" reads it: the text holds a match (a search) rather
 * than being one; a top-level alternative that begins with '^' (ends with '$') is held at the
 * text's start (end). */
td_err gm_compile_pattern(const char *re, size_t len, gm_grammar **out);
void gm_free(gm_grammar *g);

/* A state is a plain byte blob of gm_state_size(g) bytes (8-byte aligned, no pointers). */
size_t gm_state_size(const gm_grammar *g);
void gm_state_init(const gm_grammar *g, void *st);
/* Copies the bytes in use (the rest of dst is left as it was). */
void gm_state_copy(const gm_grammar *g, void *dst, const void *src);
/* The bytes in use, from the start: what decides the future, all of it determined (equal
 * bytes, equal futures). */
size_t gm_state_used(const void *st);
/* Feeds bytes[0..n); false when some byte makes the text no longer a viable prefix (*st is
 * then unspecified). Feeding writes scratch memory of g: one thread at a time per grammar. */
bool gm_feed(const gm_grammar *g, void *st, const uint8_t *bytes, size_t n);
/* True when the text so far is a whole sentence (a longer one may still follow). */
bool gm_done(const gm_grammar *g, const void *st);

/* A grammar as a deterministic automaton over code points, for grammars with finitely many
 * states (regular expressions): built once, it steps a code point with a binary search and a
 * table lookup, and its state is one number. */
#define GM_DFA_STATES 4096  /* states at most */
#define GM_DFA_TRANSITIONS (1u << 16) /* states x classes at most */
#define GM_DFA_STEPS (1u << 20) /* stacks expanded while building at most (~0.05 s) */
#define GM_DFA_DEAD 0xffffu /* no state: the text cannot go on */
#define GM_DFA_FAR 0xffffu  /* dmin of a state that cannot end */

typedef struct gm_dfa {
    uint32_t n_states;   /* state 0 is the start */
    uint32_t n_classes;  /* code points [lo[k], lo[k + 1]) behave alike (lo[n] = U+110000) */
    uint32_t *lo;        /* [n_classes + 1] */
    uint16_t *next;      /* [n_states][n_classes] the state after a code point, or DEAD */
    uint16_t *dmin;      /* [n_states] code points to an accepting state at least, or FAR */
    uint16_t *dmax;      /* [n_states] code points to an accepting state at most (the
                            longest completion), FAR when a loop makes them unbounded */
} gm_dfa;

/* g's automaton: TD_ENOTSUP past GM_DFA_STATES states, GM_DFA_TRANSITIONS transitions or
 * GM_DFA_STEPS parse steps (or for a grammar that nests without end), TD_ENOMEM. */
td_err gm_dfa_build(const gm_grammar *g, gm_dfa **out);
void gm_dfa_free(gm_dfa *d);
/* The state after code point cp from state s, or GM_DFA_DEAD. */
uint16_t gm_dfa_step(const gm_dfa *d, uint16_t s, uint32_t cp);
static inline bool gm_dfa_accepts(const gm_dfa *d, uint16_t s)
{
    return d->dmin[s] == 0;
}
/* Whether state s can still reach acceptance in at least `least` and at most `most` more code
 * points, as far as the shortest and the longest way tell (a loop whose lengths skip some,
 * such as (aa)*, is taken to reach every length past its shortest). */
static inline bool gm_dfa_room(const gm_dfa *d, uint16_t s, uint32_t least, uint32_t most)
{
    return d->dmin[s] <= most && (d->dmax[s] == GM_DFA_FAR || d->dmax[s] >= least);
}
/* Whether some code point of [lo, hi] goes on from state s to a state with room for least ..
 * most more code points (gm_dfa_room; 0 and UINT32_MAX: any way on). */
bool gm_dfa_meets(const gm_dfa *d, uint16_t s, uint32_t lo, uint32_t hi, uint32_t least,
                  uint32_t most);

#endif
