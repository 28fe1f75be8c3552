#include "gateway/toolcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/callm.h"
#include "common/tbuf.h"

static const char CALL_OPEN[] = "<tool_call>";
static const char CALL_CLOSE[] = "</tool_call>";
#define CALL_OPEN_LEN (sizeof CALL_OPEN - 1)
#define CALL_CLOSE_LEN (sizeof CALL_CLOSE - 1)

/* --- a growable string ------------------------------------------------------------------- */

/* The characters of a JSON string (no quotes) as Python's json.dumps(ensure_ascii=False)
 * writes them. */
static void tc_put_json_chars(tbuf *b, const char *s, size_t n)
{
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                esc = u;
            }
        }
        if (esc) {
            tbuf_put(b, s + i - run, run);
            run = 0;
            tbuf_puts(b, esc);
        } else {
            run++;
        }
    }
    tbuf_put(b, s + n - run, run);
}

static void tc_put_json_string(tbuf *b, const char *s, size_t n)
{
    tbuf_put(b, "\"", 1);
    tc_put_json_chars(b, s, n);
    tbuf_put(b, "\"", 1);
}

static bool tc_space(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

static void tc_trim(const char **s, size_t *n)
{
    while (*n > 0 && tc_space(**s)) {
        (*s)++;
        (*n)--;
    }
    while (*n > 0 && tc_space((*s)[*n - 1]))
        (*n)--;
}

static char *tc_strndup(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* --- the JSON form ---------------------------------------------------------------------- */

/* Skips a JSON value that jansson already accepted: strings with escapes, nested brackets. */
static size_t tc_skip_value(const char *s, size_t n, size_t i)
{
    int depth = 0;
    bool in_str = false;
    for (; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"') {
                in_str = false;
                if (depth == 0)
                    return i + 1;
            }
            continue;
        }
        if (c == '"')
            in_str = true;
        else if (c == '{' || c == '[')
            depth++;
        else if (c == '}' || c == ']') {
            if (depth == 0)
                return i; /* end of a scalar at the enclosing object's end */
            if (--depth == 0)
                return i + 1;
        } else if (depth == 0 && (c == ',' || tc_space(c)))
            return i;
    }
    return i;
}

/* The text span of the value of a top-level key spelled plainly (no escapes) in an object. */
static bool tc_member_span(const char *s, size_t n, const char *key, size_t *vs, size_t *ve)
{
    size_t klen = strlen(key), i = 0;
    while (i < n && tc_space(s[i]))
        i++;
    if (i >= n || s[i] != '{')
        return false;
    i++;
    for (;;) {
        while (i < n && (tc_space(s[i]) || s[i] == ','))
            i++;
        if (i >= n || s[i] != '"')
            return false;
        size_t ks = i + 1, ke = tc_skip_value(s, n, i) - 1;
        i = ke + 1;
        while (i < n && tc_space(s[i]))
            i++;
        if (i >= n || s[i] != ':')
            return false;
        i++;
        while (i < n && tc_space(s[i]))
            i++;
        size_t start = i;
        i = tc_skip_value(s, n, i);
        if (ke - ks == klen && memcmp(s + ks, key, klen) == 0) {
            *vs = start;
            *ve = i;
            return true;
        }
    }
}

static td_err tc_parse_json(const char *s, size_t n, tool_call *out)
{
    json_error_t je;
    json_t *root = json_loadb(s, n, 0, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        return err_set(TD_EFORMAT, "tool call: not a JSON object: %s", je.text);
    }
    const json_t *name = json_object_get(root, "name");
    const char *key = json_object_get(root, "arguments") ? "arguments" : "parameters";
    const json_t *args = json_object_get(root, key);
    /* Names and arguments are C strings from here on: a NUL inside would cut them. */
    if (!json_is_string(name) || json_string_length(name) == 0 ||
        strlen(json_string_value(name)) != json_string_length(name) ||
        (json_is_string(args) && strlen(json_string_value(args)) != json_string_length(args))) {
        json_decref(root);
        return err_set(TD_EFORMAT, "tool call: no function name, or a NUL character in it");
    }
    out->name = tc_strndup(json_string_value(name), json_string_length(name));
    size_t vs, ve;
    /* none, null or "": no arguments */
    if (!args || json_is_null(args) || (json_is_string(args) && json_string_length(args) == 0))
        out->arguments = tc_strndup("{}", 2);
    else if (json_is_string(args)) /* arguments already given as JSON text */
        out->arguments = tc_strndup(json_string_value(args), json_string_length(args));
    else if (tc_member_span(s, n, key, &vs, &ve))
        out->arguments = tc_strndup(s + vs, ve - vs);
    else
        out->arguments = json_dumps(args, JSON_ENCODE_ANY);
    json_decref(root);
    if (!out->name || !out->arguments) {
        tool_call_free(out);
        return err_set(TD_ENOMEM, "tool call: out of memory");
    }
    return TD_OK;
}

/* The end of the JSON string literal starting at s[i] == '"' (the index after its closing
 * quote), or 0 when the text ends first. */
static size_t tc_string_end(const char *s, size_t n, size_t i)
{
    for (i++; i < n; i++) {
        if (s[i] == '\\')
            i++;
        else if (s[i] == '"')
            return i + 1;
    }
    return 0;
}

static size_t tc_skip_space(const char *s, size_t n, size_t i)
{
    while (i < n && tc_space(s[i]))
        i++;
    return i;
}

/* Bytes of s [n] without an unfinished UTF-8 character at its end (a lead byte with fewer
 * continuation bytes after it than it announces). */
static size_t tc_whole_chars(const char *s, size_t n)
{
    size_t k = 0;
    while (k < 3 && k < n && ((unsigned char)s[n - 1 - k] & 0xC0) == 0x80)
        k++;
    if (k < n) {
        const unsigned char lead = (unsigned char)s[n - 1 - k];
        const size_t want = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
        if (want > k)
            return n - k - 1;
    }
    return n;
}

/* Scans JSON text s [n] on from f->at + f->scan with the state f holds there; true once the
 * outermost bracket closed (f->scan just past it). */
static bool tc_json_scan(const char *s, size_t n, tool_fast *f)
{
    for (size_t i = f->at + f->scan; i < n; i++) {
        const char c = s[i];
        f->scan++;
        if (f->in_str) {
            if (f->esc)
                f->esc = false;
            else if (c == '\\')
                f->esc = true;
            else if (c == '"')
                f->in_str = false;
        } else if (c == '"') {
            f->in_str = true;
        } else if (c == '{' || c == '[') {
            f->depth++;
        } else if ((c == '}' || c == ']') && --f->depth == 0) {
            return true;
        }
    }
    return false;
}

/* The JSON form of an open block, partial (tool_split's stream_args): when it opens
 * {"name": "...", "arguments": {  (or "parameters"), out gets the name and the arguments
 * object's text so far (its own text is what the whole call keeps, tc_parse_json), up to its
 * closing brace, and *open where the object stands when it is still open; else out->name stays
 * NULL: the call comes whole at the end. */
static td_err tc_json_prefix(const char *s, size_t n, tool_call *out, tool_fast *open)
{
    size_t i = tc_skip_space(s, n, 0), e;
    if (i >= n || s[i] != '{')
        return TD_OK;
    i = tc_skip_space(s, n, i + 1);
    if (n - i < 7 || memcmp(s + i, "\"name\"", 6) != 0)
        return TD_OK;
    i = tc_skip_space(s, n, i + 6);
    if (i >= n || s[i] != ':')
        return TD_OK;
    i = tc_skip_space(s, n, i + 1);
    if (i >= n || s[i] != '"' || !(e = tc_string_end(s, n, i)))
        return TD_OK;
    json_t *name = json_loadb(s + i, e - i, JSON_DECODE_ANY, NULL);
    const bool named = json_is_string(name) && json_string_length(name) > 0 &&
                       strlen(json_string_value(name)) == json_string_length(name);
    i = tc_skip_space(s, n, e);
    bool args = i < n && s[i] == ',';
    i = args ? tc_skip_space(s, n, i + 1) : i;
    if (args && n - i > 12 && memcmp(s + i, "\"arguments\"", 11) == 0)
        i += 11;
    else if (args && n - i > 13 && memcmp(s + i, "\"parameters\"", 12) == 0)
        i += 12;
    else
        args = false;
    i = args ? tc_skip_space(s, n, i) : i;
    args = args && i < n && s[i] == ':';
    i = args ? tc_skip_space(s, n, i + 1) : i;
    args = args && i < n && s[i] == '{';
    if (named && args) {
        tool_fast f = {.kind = TOOL_FAST_JSON, .at = i};
        const bool closed = tc_json_scan(s, n, &f);
        f.done = closed ? f.scan : tc_whole_chars(s + i, f.scan);
        if (!closed)
            *open = f;
        out->name = tc_strndup(json_string_value(name), json_string_length(name));
        out->arguments = tc_strndup(s + i, f.done);
        if (!out->name || !out->arguments) {
            tool_call_free(out);
            json_decref(name);
            return err_set(TD_ENOMEM, "tool call: out of memory");
        }
    }
    json_decref(name);
    return TD_OK;
}

/* --- the XML form ----------------------------------------------------------------------- */

/* The JSON type the tool's schema gives parameter param of function fn, or NULL. */
static const char *tc_param_type(const json_t *tools, const char *fn, const char *param)
{
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        const json_t *name = json_object_get(f, "name");
        if (!json_is_string(name) || strcmp(json_string_value(name), fn) != 0)
            continue;
        const json_t *props = json_object_get(json_object_get(f, "parameters"), "properties");
        return cm_value_type(json_object_get(props, param));
    }
    return NULL;
}

static bool tc_text_is(const char *s, size_t n, const char *word)
{
    return strlen(word) == n && memcmp(s, word, n) == 0;
}

/* Appends a parameter value as JSON of the schema's type (see the header). */
static void tc_put_value(tbuf *b, const char *v, size_t n, const char *type)
{
    if (type && strcmp(type, "string") == 0) {
        tc_put_json_string(b, v, n);
        return;
    }
    if (type && strcmp(type, "boolean") == 0) {
        if (tc_text_is(v, n, "true") || tc_text_is(v, n, "True"))
            tbuf_puts(b, "true");
        else if (tc_text_is(v, n, "false") || tc_text_is(v, n, "False"))
            tbuf_puts(b, "false");
        else if (tc_text_is(v, n, "null"))
            tbuf_puts(b, "null");
        else
            tc_put_json_string(b, v, n);
        return;
    }
    if (type && strcmp(type, "null") == 0 && (tc_text_is(v, n, "None") || tc_text_is(v, n, "null"))) {
        tbuf_puts(b, "null");
        return;
    }
    const char *s = v;
    size_t m = n;
    tc_trim(&s, &m);
    json_t *j = m ? json_loadb(s, m, JSON_DECODE_ANY, NULL) : NULL;
    bool ok = j != NULL;
    if (ok && type && !json_is_null(j)) { /* null: the value left out, as the schema may allow */
        if (strcmp(type, "integer") == 0 || strcmp(type, "number") == 0)
            ok = json_is_number(j);
        else if (strcmp(type, "object") == 0)
            ok = json_is_object(j);
        else if (strcmp(type, "array") == 0)
            ok = json_is_array(j);
    }
    json_decref(j);
    if (ok)
        tbuf_put(b, s, m);
    else
        tc_put_json_string(b, v, n);
}

static const char *tc_find(const char *s, size_t n, const char *needle)
{
    return memmem(s, n, needle, strlen(needle));
}

static const char FN[] = "<function=", PARAM[] = "<parameter=", PARAM_END[] = "</parameter>",
                  FN_END[] = "</function>";
#define LIT_LEN(lit) (sizeof lit - 1)

/* s [n] starts with the literal (or, when partial, is a beginning of it: more may come). */
static bool tc_at(const char *s, size_t n, const char *lit, size_t lit_len, bool partial)
{
    if (n >= lit_len)
        return memcmp(s, lit, lit_len) == 0;
    return partial && memcmp(s, lit, n) == 0;
}

/* Of a string value still being written (v [n], after its '>'), where the bytes no later text
 * can change end, scanning from `from` (what is before it is known to be such): nothing from a
 * '<' that is or may become a tag on (*tag: a whole tag is there, which the value may end at),
 * no trailing whitespace (the newline before the closing tag, or the end of the block), no
 * unfinished UTF-8 character. The value's leading newline (the template's) is the caller's. */
static size_t tc_value_stable(const char *v, size_t n, size_t from, bool *tag)
{
    static const char *const tags[] = {PARAM, PARAM_END, FN_END, "</tool_call>"};
    *tag = false;
    size_t m = from;
    for (; m < n; m++) {
        if (v[m] != '<')
            continue;
        bool stop = false;
        for (size_t k = 0; k < sizeof tags / sizeof tags[0]; k++) {
            const size_t len = strlen(tags[k]);
            if (tc_at(v + m, n - m, tags[k], len, true)) {
                stop = true;
                *tag |= n - m >= len;
            }
        }
        if (stop)
            break;
    }
    while (m > from && tc_space(v[m - 1]))
        m--;
    return from + tc_whole_chars(v + from, m - from);
}

/* Parses the XML form. open (partial): s is an open block's text so far; out gets the
 * arguments that no later text can change (the name when it is complete, else NULL; "{"
 * without its "}", each finished parameter, and of a string parameter being written its text
 * so far, see tc_value_stable, which *open then locates), and TD_EFORMAT only for what no later
 * text can mend. open NULL: the whole block. */
static td_err tc_parse_xml(const char *s, size_t n, const json_t *tools, tool_fast *open,
                           tool_call *out)
{
    const bool partial = open != NULL;
    const char *end = s + n;
    const char *p = s + LIT_LEN(FN);
    const char *gt = memchr(p, '>', (size_t)(end - p));
    if (!gt)
        return partial ? TD_OK : err_set(TD_EFORMAT, "tool call: <function= without '>'");
    const char *name = p;
    size_t name_len = (size_t)(gt - p);
    tc_trim(&name, &name_len);
    if (name_len == 0 || memchr(name, 0, name_len))
        return err_set(TD_EFORMAT, "tool call: no function name, or a NUL character in it");
    out->name = tc_strndup(name, name_len);
    if (!out->name)
        return err_set(TD_ENOMEM, "tool call: out of memory");
    tbuf args = {0};
    tbuf_puts(&args, "{");
    bool first = true;
    td_err err = TD_OK;
    p = gt + 1;
    for (;;) {
        while (p < end && tc_space(*p))
            p++;
        const size_t left = (size_t)(end - p);
        if (p >= end || tc_at(p, left, FN_END, LIT_LEN(FN_END), partial))
            break;
        if (!tc_at(p, left, PARAM, LIT_LEN(PARAM), partial)) {
            err = err_set(TD_EFORMAT, "tool call: expected <parameter= or </function>");
            break;
        }
        if (left <= LIT_LEN(PARAM))
            break; /* partial: the tag is still being written */
        p += LIT_LEN(PARAM);
        gt = memchr(p, '>', (size_t)(end - p));
        if (!gt) {
            if (!partial)
                err = err_set(TD_EFORMAT, "tool call: <parameter= without '>'");
            break;
        }
        const char *pname = p;
        size_t pname_len = (size_t)(gt - p);
        tc_trim(&pname, &pname_len);
        char *pn = tc_strndup(pname, pname_len);
        const char *type = pn && tools ? tc_param_type(tools, out->name, pn) : NULL;
        free(pn);
        if (!first)
            tbuf_puts(&args, ", ");
        first = false;
        tc_put_json_string(&args, pname, pname_len);
        tbuf_puts(&args, ": ");
        const char *v = gt + 1;
        /* A value ends at </parameter>; a model that forgets it ends it at the next tag. */
        const char *ve = tc_find(v, (size_t)(end - v), PARAM_END);
        if (!ve && partial) { /* still being written: only a string streams */
            if (type && strcmp(type, "string") == 0) {
                const size_t vn = (size_t)(end - v), skip = vn > 0 && v[0] == '\n';
                bool tag;
                const size_t m = tc_value_stable(v, vn, skip, &tag);
                tbuf_put(&args, "\"", 1);
                tc_put_json_chars(&args, v + skip, m - skip);
                *open = (tool_fast){.kind = TOOL_FAST_XML, .at = (size_t)(v - s), .done = m};
            }
            break;
        }
        const char *next = ve ? ve + LIT_LEN(PARAM_END) : NULL;
        if (!ve) {
            const char *a = tc_find(v, (size_t)(end - v), PARAM);
            const char *f = tc_find(v, (size_t)(end - v), FN_END);
            ve = a && (!f || a < f) ? a : f ? f : end;
            next = ve;
        }
        size_t vn = (size_t)(ve - v);
        /* The template writes "\n" + value + "\n". */
        if (vn > 0 && v[0] == '\n') {
            v++;
            vn--;
        }
        if (vn > 0 && v[vn - 1] == '\n')
            vn--;
        tc_put_value(&args, v, vn, type);
        p = next;
    }
    if (err == TD_OK && !partial)
        tbuf_puts(&args, "}");
    if (err == TD_OK && args.oom)
        err = err_set(TD_ENOMEM, "tool call: out of memory");
    if (err != TD_OK) {
        free(args.p);
        tool_call_free(out);
        return err;
    }
    out->arguments = args.p;
    return TD_OK;
}

td_err tool_parse(const char *body, size_t len, const json_t *tools, tool_call *out)
{
    memset(out, 0, sizeof *out);
    tc_trim(&body, &len);
    if (len > 0 && body[0] == '{')
        return tc_parse_json(body, len, out);
    if (len >= 10 && memcmp(body, "<function=", 10) == 0)
        return tc_parse_xml(body, len, json_is_array(tools) ? tools : NULL, NULL, out);
    return err_set(TD_EFORMAT, "tool call: neither a JSON object nor a <function=...> block");
}

void tool_call_free(tool_call *c)
{
    free(c->name);
    free(c->arguments);
    c->name = c->arguments = NULL;
}

/* --- streaming split ---------------------------------------------------------------------- */

void tool_split_init(tool_split *s, const json_t *tools, tool_emit emit, void *ctx)
{
    memset(s, 0, sizeof *s);
    s->tools = tools;
    s->emit = emit;
    s->ctx = ctx;
}

void tool_split_free(tool_split *s)
{
    free(s->hold);
    free(s->scratch);
    free(s->sent);
    memset(s, 0, sizeof *s);
}

static td_err tool_reserve(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return TD_OK;
    size_t c = need < 256 ? 256 : need * 2;
    char *b = realloc(*buf, c);
    if (!b)
        return err_set(TD_ENOMEM, "tool calls: out of memory");
    *buf = b;
    *cap = c;
    return TD_OK;
}

static td_err tool_keep(tool_split *s, const char *p, size_t n)
{
    TD_TRY(tool_reserve(&s->hold, &s->hold_cap, n + 1));
    memmove(s->hold, p, n);
    s->hold_len = n;
    return TD_OK;
}

/* The open block's call is no longer being passed on. */
static void tool_unopen(tool_split *s)
{
    s->opened = false;
    s->fast = (tool_fast){0};
}

/* A finished block: a call, or when it does not parse, the text it was. */
static td_err tool_block(tool_split *s, const char *body, size_t n, bool closed)
{
    tool_call c;
    td_err e = tool_parse(body, n, s->tools, &c);
    s->after_call = true;
    const bool opened = s->opened;
    tool_unopen(s);
    if (e == TD_OK && opened && s->sent_len > 0 &&
        (strlen(c.arguments) < s->sent_len || memcmp(c.arguments, s->sent, s->sent_len) != 0)) {
        /* e.g. a JSON call whose "arguments" come twice, the last not the object streamed:
         * the call cannot end what was sent, so it ends as the text it was */
        tool_call_free(&c);
        e = TD_EFORMAT;
    }
    if (e == TD_OK) {
        c.streamed = opened ? s->sent_len : 0;
        e = s->emit(s->ctx, TOOL_EMIT_CALL, NULL, 0, &c);
        tool_call_free(&c);
        s->called = true;
        return e;
    }
    if (e != TD_EFORMAT)
        return e;
    TD_TRY(s->emit(s->ctx, TOOL_EMIT_TEXT, CALL_OPEN, CALL_OPEN_LEN, NULL));
    if (n > 0)
        TD_TRY(s->emit(s->ctx, TOOL_EMIT_TEXT, body, n, NULL));
    return closed ? s->emit(s->ctx, TOOL_EMIT_TEXT, CALL_CLOSE, CALL_CLOSE_LEN, NULL) : TD_OK;
}

/* Passes on more of the begun call's arguments (s->sent grows by them). */
static td_err tool_more(tool_split *s, const char *text, size_t n)
{
    if (n == 0)
        return TD_OK;
    TD_TRY(tool_reserve(&s->sent, &s->sent_cap, s->sent_len + n + 1));
    memcpy(s->sent + s->sent_len, text, n);
    s->sent_len += n;
    s->sent[s->sent_len] = 0;
    return s->emit(s->ctx, TOOL_EMIT_ARGS, text, n, NULL);
}

/* The fast way on (s->fast): new text continues the string value or the object passed on so
 * far; 1 when it did (done), 0 when the block must be parsed again. */
static int tool_stream_fast(tool_split *s, td_err *r)
{
    tool_fast *f = &s->fast;
    const char *v = s->hold + f->at;
    const size_t n = s->hold_len - f->at;
    tbuf esc = {0};
    *r = TD_OK;
    if (f->kind == TOOL_FAST_XML) {
        if (f->done == 0 && n > 0 && v[0] == '\n')
            f->done = 1; /* the template's newline */
        bool tag;
        const size_t m = tc_value_stable(v, n, f->done, &tag);
        if (tag)
            return 0; /* the value may end here: the parser decides */
        tc_put_json_chars(&esc, v + f->done, m - f->done);
        f->done = m;
    } else {
        const bool closed = tc_json_scan(s->hold, s->hold_len, f);
        const size_t m = closed ? f->scan : tc_whole_chars(v, f->scan);
        if (m > f->done) { /* a half character held back may leave nothing new */
            tbuf_put(&esc, v + f->done, m - f->done);
            f->done = m;
        }
        if (closed)
            f->kind = 0; /* the arguments are whole: nothing more until the block ends */
    }
    *r = esc.oom ? err_set(TD_ENOMEM, "tool calls: out of memory") : tool_more(s, esc.p, esc.len);
    free(esc.p);
    return 1;
}

/* stream_args: the open block's text so far (s->hold) -> its call begun, and the arguments no
 * later text can change passed on beyond what was. */
static td_err tool_stream(tool_split *s)
{
    td_err r;
    if (s->fast.kind && tool_stream_fast(s, &r))
        return r;
    const size_t lead = tc_skip_space(s->hold, s->hold_len, 0);
    const char *body = s->hold + lead;
    const size_t n = s->hold_len - lead;
    tool_call c = {0};
    tool_fast open = {0};
    td_err e = TD_OK;
    if (n > 0 && body[0] == '{')
        e = tc_json_prefix(body, n, &c, &open);
    else if (n > LIT_LEN(FN) && memcmp(body, FN, LIT_LEN(FN)) == 0)
        e = tc_parse_xml(body, n, json_is_array(s->tools) ? s->tools : NULL, &open, &c);
    s->fast = (tool_fast){0};
    if (e != TD_OK || !c.name) {
        tool_call_free(&c);
        return e == TD_EFORMAT ? TD_OK : e; /* what does not parse ends as text */
    }
    r = TD_OK;
    if (!s->opened) {
        s->opened = true;
        s->sent_len = 0;
        const tool_call named = {.name = c.name};
        r = s->emit(s->ctx, TOOL_EMIT_OPEN, NULL, 0, &named);
    }
    const size_t len = strlen(c.arguments);
    if (r == TD_OK && len > s->sent_len)
        r = tool_more(s, c.arguments + s->sent_len, len - s->sent_len);
    if (r == TD_OK && open.kind) {
        s->fast = open;
        s->fast.at += lead;
    }
    tool_call_free(&c);
    return r;
}

static td_err tool_run(tool_split *s, const char *p, size_t n)
{
    while (n > 0) {
        if (s->state == TOOL_IN) {
            const char *end = memmem(p, n, CALL_CLOSE, CALL_CLOSE_LEN);
            if (!end) {
                TD_TRY(tool_keep(s, p, n));
                return s->stream_args ? tool_stream(s) : TD_OK;
            }
            TD_TRY(tool_block(s, p, (size_t)(end - p), true));
            s->state = TOOL_TEXT;
            size_t skip = (size_t)(end - p) + CALL_CLOSE_LEN;
            p += skip;
            n -= skip;
            continue;
        }
        const char *open = memmem(p, n, CALL_OPEN, CALL_OPEN_LEN);
        if (open) {
            size_t c = (size_t)(open - p);
            while (c > 0 && tc_space(p[c - 1])) /* whitespace before a block is dropped */
                c--;
            if (c > 0)
                TD_TRY(s->emit(s->ctx, TOOL_EMIT_TEXT, p, c, NULL));
            s->state = TOOL_IN;
            size_t skip = (size_t)(open - p) + CALL_OPEN_LEN;
            p += skip;
            n -= skip;
            continue;
        }
        /* Hold a possible "<tool_call>" beginning and the whitespace before it. */
        size_t keep = 0;
        for (size_t k = CALL_OPEN_LEN - 1 < n ? CALL_OPEN_LEN - 1 : n; k > 0; k--)
            if (memcmp(p + n - k, CALL_OPEN, k) == 0) {
                keep = k;
                break;
            }
        while (keep < n && tc_space(p[n - keep - 1]))
            keep++;
        /* Whitespace right after a block is dropped as well. */
        size_t lead = 0;
        if (s->after_call)
            while (lead < n - keep && tc_space(p[lead]))
                lead++;
        if (n - keep > lead) {
            TD_TRY(s->emit(s->ctx, TOOL_EMIT_TEXT, p + lead, n - keep - lead, NULL));
            s->after_call = false;
        }
        return tool_keep(s, p + n - keep, keep);
    }
    return TD_OK;
}

td_err tool_split_push(tool_split *s, const char *text, size_t len)
{
    if (len == 0)
        return TD_OK;
    if (s->state == TOOL_IN) { /* the open block grows: only its new end is looked at */
        const size_t old = s->hold_len, from = old > CALL_CLOSE_LEN ? old - CALL_CLOSE_LEN : 0;
        TD_TRY(tool_reserve(&s->hold, &s->hold_cap, old + len + 1));
        memcpy(s->hold + old, text, len);
        s->hold_len = old + len;
        if (!memmem(s->hold + from, s->hold_len - from, CALL_CLOSE, CALL_CLOSE_LEN))
            return s->stream_args ? tool_stream(s) : TD_OK;
        s->hold_len = old; /* the block ends in this text: the whole way below */
    }
    size_t n = s->hold_len + len;
    TD_TRY(tool_reserve(&s->scratch, &s->scratch_cap, n + 1));
    if (s->hold_len)
        memcpy(s->scratch, s->hold, s->hold_len);
    memcpy(s->scratch + s->hold_len, text, len);
    s->hold_len = 0;
    return tool_run(s, s->scratch, n);
}

td_err tool_split_flush(tool_split *s)
{
    size_t n = s->hold_len;
    s->hold_len = 0;
    if (s->state == TOOL_IN) {
        s->state = TOOL_TEXT;
        if (!s->closed_only)
            return tool_block(s, s->hold, n, false);
        tool_unopen(s);
        TD_TRY(s->emit(s->ctx, TOOL_EMIT_TEXT, CALL_OPEN, CALL_OPEN_LEN, NULL));
        return n > 0 ? s->emit(s->ctx, TOOL_EMIT_TEXT, s->hold, n, NULL) : TD_OK;
    }
    /* What is held is whitespace (and maybe a cut-off "<tool_c"); right after a block the
     * whitespace goes. */
    size_t lead = 0;
    if (s->after_call)
        while (lead < n && tc_space(s->hold[lead]))
            lead++;
    return n > lead ? s->emit(s->ctx, TOOL_EMIT_TEXT, s->hold + lead, n - lead, NULL) : TD_OK;
}
