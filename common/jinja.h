/* A Jinja2 interpreter for chat templates.
 *
 * Renders the subset of Jinja2 that model chat templates use, with the semantics of Python's
 * jinja2 as Hugging Face transformers configures it (ImmutableSandboxedEnvironment with
 * trim_blocks and lstrip_blocks, the loopcontrols extension, its own tojson filter,
 * raise_exception and strftime_now): the rendering must equal transformers' byte for byte.
 *
 * A template is parsed once into a tree (jinja_compile) and rendered many times against a JSON
 * object of variables (jinja_render); a compiled template is never written by a render, so
 * several threads may render it at once. Values inside the interpreter follow Python: string
 * slicing and methods by code point, truthiness, integer arithmetic, dict order preserved,
 * str() and repr() of containers, json.dumps for tojson.
 *
 * Templates come from model files, so they are untrusted: a construct outside the subset is a
 * compile error (TD_ENOTSUP) naming it, and a render is bounded in output size, memory, work
 * and call depth (jinja_limits), never crashing or hanging. */
#ifndef TANDEM_COMMON_JINJA_H
#define TANDEM_COMMON_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/err.h"

typedef struct jinja_tmpl jinja_tmpl;

/* Bounds on one render; exceeding one is TD_ERANGE with a message naming it. */
typedef struct jinja_limits {
    size_t max_output;  /* bytes of rendered text */
    size_t max_memory;  /* bytes of evaluation state: values, captured macro output */
    uint64_t max_steps; /* loop iterations + calls + 1 per 256 bytes a string operation scans */
    uint32_t max_depth; /* nested macro calls, and nesting of values walked by repr/tojson */
} jinja_limits;

/* 32 MiB output, 256 MiB memory, 20M steps, depth 200. */
void jinja_limits_default(jinja_limits *lim);

/* Parses a template (UTF-8; \r\n and \r read as \n, one trailing newline dropped as Jinja
 * does). Errors: TD_EFORMAT for syntax ("template line 3: expected 'endif', got end of
 * template"), TD_ENOTSUP for constructs outside the subset (extends, include, call blocks,
 * recursive loops, unknown filters and tests). On error *out is NULL. */
td_err jinja_compile(jinja_tmpl **out, const char *src, size_t len);

void jinja_free(jinja_tmpl *t);

/* Renders with the variables of vars (a JSON object, or NULL for none) in scope; they shadow
 * the built-in globals (raise_exception, namespace, range, dict, strftime_now). lim may be
 * NULL for the defaults. On success *out is a malloc'd NUL-terminated string of *out_len bytes
 * (the text may itself contain NUL bytes from JSON "\u0000").
 *
 * Errors carry Python jinja2's message where it has one, so callers can compare:
 * raise_exception('msg') fails with exactly "msg" (TD_EINVAL); a use of an undefined value
 * fails with "'dict object' has no attribute 'content'" and the like (TD_EINVAL); a type
 * error with Python's wording (TD_EINVAL); a limit with TD_ERANGE. *err_line (when err_line
 * is non-NULL) gets the template line of the failing statement, 0 when unknown. */
td_err jinja_render(const jinja_tmpl *t, const json_t *vars, const jinja_limits *lim, char **out,
                    size_t *out_len, int *err_line);

/* text[0, n) (UTF-8) without the whitespace Python's str.strip() takes off: leading
 * (left) and trailing (right). Returns the kept bytes' end; *start gets their start. */
size_t jinja_py_strip(const char *text, size_t n, bool left, bool right, size_t *start);

#endif
