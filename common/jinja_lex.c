/* Jinja template source -> tokens.
 *
 * Whitespace control follows jinja2's lexer as transformers configures it: trim_blocks drops
 * the one newline right after a block or comment tag, lstrip_blocks drops the spaces and tabs
 * between a line start and a block or comment tag (never before {{), "-" beside a delimiter
 * strips all whitespace on that side, "+" before a block turns lstrip off for it, and the
 * source's \r\n and \r read as \n with one trailing newline dropped (keep_trailing_newline is
 * off). "Whitespace" is Python's: str.isspace, not just ASCII. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja_int.h"

typedef struct jlex {
    jarena *a;
    const char *s; /* normalised source */
    size_t n;      /* bytes */
    size_t pos;
    int line;
    jtok *tok;     /* [cap] */
    size_t n_tok, cap;
} jlex;

static td_err lex_nomem(void)
{
    return err_set(TD_ENOMEM, "template: out of memory");
}

static td_err lex_push(jlex *L, jtok t)
{
    if (L->n_tok == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        jtok *v = jarena_alloc(L->a, cap * sizeof *v);
        if (!v)
            return lex_nomem();
        if (L->n_tok)
            memcpy(v, L->tok, L->n_tok * sizeof *v);
        L->tok = v;
        L->cap = cap;
    }
    L->tok[L->n_tok++] = t;
    return TD_OK;
}

static td_err lex_simple(jlex *L, jtok_kind kind)
{
    jtok t = {.kind = (uint8_t)kind, .line = L->line};
    return lex_push(L, t);
}

static int count_nl(const char *p, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += p[i] == '\n';
    return k;
}

/* Length of the whitespace code point at p[i..n), 0 when it is not whitespace. */
static size_t space_at(const char *p, size_t n, size_t i)
{
    size_t next;
    uint32_t cp = utf8_decode(p, n, i, &next);
    return py_isspace(cp) ? next - i : 0;
}

static size_t skip_space(const char *p, size_t n, size_t i)
{
    size_t k;
    while (i < n && (k = space_at(p, n, i)) > 0)
        i += k;
    return i;
}

/* Bytes of text once Python's rstrip() has run. */
static size_t rstrip_len(const char *p, size_t n)
{
    size_t end = n;
    while (end > 0) {
        size_t start = end - 1;
        while (start > 0 && ((unsigned char)p[start] & 0xC0) == 0x80)
            start--;
        if (!space_at(p, end, start))
            break;
        end = start;
    }
    return end;
}

typedef enum tag_kind { TAG_NONE, TAG_VAR, TAG_BLOCK, TAG_COMMENT, TAG_RAW } tag_kind;

/* "{% raw %}" (with optional -/+ and whitespace) at i: returns the bytes it spans, else 0. */
static size_t raw_begin_at(const char *s, size_t n, size_t i, const char *word)
{
    size_t j = i + 2;
    if (j < n && (s[j] == '-' || s[j] == '+'))
        j++;
    j = skip_space(s, n, j);
    size_t wl = strlen(word);
    if (j + wl > n || memcmp(s + j, word, wl) != 0)
        return 0;
    j = skip_space(s, n, j + wl);
    if (j + 3 <= n && !memcmp(s + j, "-%}", 3))
        return skip_space(s, n, j + 3) - i;
    if (j + 2 <= n && !memcmp(s + j, "%}", 2))
        return j + 2 - i;
    return 0;
}

/* Finds the next tag start at or after L->pos. */
static tag_kind next_tag(const jlex *L, size_t *at)
{
    const char *s = L->s;
    for (size_t i = L->pos; i + 1 < L->n; i++) {
        if (s[i] != '{')
            continue;
        char c = s[i + 1];
        if (c == '%') {
            *at = i;
            return raw_begin_at(s, L->n, i, "raw") ? TAG_RAW : TAG_BLOCK;
        }
        if (c == '{' || c == '#') {
            *at = i;
            return c == '{' ? TAG_VAR : TAG_COMMENT;
        }
    }
    return TAG_NONE;
}

/* Emits the text before a tag with the tag's whitespace control applied. */
static td_err lex_text(jlex *L, size_t end, tag_kind kind, char sign, bool line_starting)
{
    const char *p = L->s + L->pos;
    size_t n = end - L->pos;
    int lines = count_nl(p, n);
    if (sign == '-') {
        n = rstrip_len(p, n);
    } else if (sign != '+' && kind != TAG_VAR) {
        /* lstrip_blocks: only whitespace between the line start and the tag */
        size_t l_pos = n;
        while (l_pos > 0 && p[l_pos - 1] != '\n')
            l_pos--;
        if ((l_pos > 0 || line_starting) && l_pos < n && skip_space(p, n, l_pos) == n)
            n = l_pos;
    }
    if (n > 0) {
        jtok t = {.kind = JT_DATA, .line = L->line, .p = p, .n = n};
        TD_TRY(lex_push(L, t));
    }
    L->line += lines;
    return TD_OK;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* Digits with single '_' separators ((\d+_)*\d+); returns the end, or i when none. */
static size_t scan_digits(const char *s, size_t n, size_t i)
{
    size_t j = i;
    if (j >= n || !is_digit(s[j]))
        return i;
    while (j < n) {
        while (j < n && is_digit(s[j]))
            j++;
        if (j + 1 < n && s[j] == '_' && is_digit(s[j + 1]))
            j++;
        else
            break;
    }
    return j;
}

/* jinja2's float_re at i: returns its end, or i when it does not match. */
static size_t scan_float(const char *s, size_t n, size_t i)
{
    if (i > 0 && s[i - 1] == '.')
        return i;
    size_t j = scan_digits(s, n, i);
    if (j == i)
        return i;
    size_t frac = j;
    if (j < n && s[j] == '.') {
        size_t k = scan_digits(s, n, j + 1);
        if (k > j + 1)
            frac = k;
    }
    if (frac < n && (s[frac] == 'e' || s[frac] == 'E')) {
        size_t k = frac + 1;
        if (k < n && (s[k] == '+' || s[k] == '-'))
            k++;
        size_t e = scan_digits(s, n, k);
        if (e > k)
            return e;
    }
    return frac > j ? frac : i;
}

static int hexval(char c)
{
    if (is_digit(c))
        return c - '0';
    c = (char)(c | 0x20);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static td_err lex_number(jlex *L, size_t *pos)
{
    const char *s = L->s;
    size_t i = *pos, end = scan_float(s, L->n, i);
    char buf[128];
    size_t k = 0;
    if (end > i) {
        for (size_t j = i; j < end; j++)
            if (s[j] != '_' && k + 1 < sizeof buf)
                buf[k++] = s[j];
        buf[k] = 0;
        jtok t = {.kind = JT_FLOAT, .line = L->line, .f = strtod(buf, NULL)};
        *pos = end;
        return lex_push(L, t);
    }
    int base = 10;
    size_t j = i;
    if (s[i] == '0' && i + 1 < L->n && s[i + 1] && strchr("bBoOxX", s[i + 1])) {
        char b = (char)(s[i + 1] | 0x20);
        base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
        j = i + 2;
    }
    uint64_t v = 0;
    bool any = false, overflow = false;
    while (j < L->n) {
        /* one optional '_' before each digit */
        size_t k = j + (s[j] == '_' && (any || base != 10));
        int d = k < L->n ? hexval(s[k]) : -1;
        if (d < 0 || d >= base)
            break;
        if (base == 10 && s[i] == '0' && d != 0)
            break; /* "0(_?0)*": a decimal literal does not start with 0 */
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base)
            overflow = true;
        v = v * (uint64_t)base + (uint64_t)d;
        any = true;
        j = k + 1;
    }
    if (!any)
        return err_set(TD_EFORMAT, "template line %d: malformed number", L->line);
    if (overflow || v > INT64_MAX)
        return err_set(TD_ENOTSUP, "template line %d: integer literal too large", L->line);
    jtok t = {.kind = JT_INT, .line = L->line, .i = (int64_t)v};
    *pos = j;
    return lex_push(L, t);
}

/* Decodes a string literal body like Python's unicode-escape codec after backslashreplace
 * (what jinja2 does), into out (at least 4 * n + 16 bytes), its length in *out_n. */
static td_err decode_string(const char *s, size_t n, char *out, size_t *out_n, int line)
{
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\') {
            out[k++] = s[i++];
            continue;
        }
        if (i + 1 >= n) {
            out[k++] = '\\';
            break;
        }
        char c = s[i + 1];
        i += 2;
        uint32_t cp;
        switch (c) {
        case '\n': continue;
        case '\\': out[k++] = '\\'; continue;
        case '\'': out[k++] = '\''; continue;
        case '"': out[k++] = '"'; continue;
        case 'a': out[k++] = 7; continue;
        case 'b': out[k++] = 8; continue;
        case 'f': out[k++] = 12; continue;
        case 'n': out[k++] = '\n'; continue;
        case 'r': out[k++] = '\r'; continue;
        case 't': out[k++] = '\t'; continue;
        case 'v': out[k++] = 11; continue;
        case 'x': case 'u': case 'U': {
            int want = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            cp = 0;
            for (int d = 0; d < want; d++) {
                int h = i < n ? hexval(s[i]) : -1;
                if (h < 0)
                    return err_set(TD_EFORMAT, "template line %d: truncated \\%c escape in string", line, c);
                cp = cp * 16 + (uint32_t)h;
                i++;
            }
            break;
        }
        case 'N':
            return err_set(TD_ENOTSUP, "template line %d: \\N{...} escapes are not supported", line);
        default:
            if (c >= '0' && c <= '7') {
                cp = (uint32_t)(c - '0');
                for (int d = 0; d < 2 && i < n && s[i] >= '0' && s[i] <= '7'; d++)
                    cp = cp * 8 + (uint32_t)(s[i++] - '0');
                break;
            }
            if ((unsigned char)c >= 0x80) {
                /* backslashreplace turned the character into an escape the codec then
                 * leaves alone: the text reads backslash, backslash-escape of it */
                size_t next;
                cp = utf8_decode(s, n, i - 1, &next);
                i = next;
                k += (size_t)sprintf(out + k, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", cp);
                continue;
            }
            out[k++] = '\\';
            out[k++] = c;
            continue;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return err_set(TD_ENOTSUP, "template line %d: string escape U+%04X is not a Unicode scalar", line, cp);
        char enc[4];
        size_t m = jinja_utf8_encode(cp, enc);
        memcpy(out + k, enc, m);
        k += m;
    }
    *out_n = k;
    return TD_OK;
}

static td_err lex_string(jlex *L, size_t *pos)
{
    const char *s = L->s;
    char q = s[*pos];
    size_t i = *pos + 1;
    bool escaped = false;
    for (; i < L->n; i++) {
        if (s[i] == '\\' && i + 1 < L->n) {
            escaped = true;
            i++;
        } else if (s[i] == q) {
            break;
        }
    }
    if (i >= L->n)
        return err_set(TD_EFORMAT, "template line %d: unterminated string", L->line);
    const char *body = s + *pos + 1;
    size_t n = i - *pos - 1;
    jtok t = {.kind = JT_STRING, .line = L->line, .p = body, .n = n};
    if (escaped) {
        /* every escape shrinks or, for "\<non-ASCII>", grows to at most 11 bytes from 3 */
        char *out = jarena_alloc(L->a, n * 4 + 16);
        if (!out)
            return lex_nomem();
        TD_TRY(decode_string(body, n, out, &t.n, L->line));
        t.p = out;
    }
    L->line += count_nl(body, n);
    *pos = i + 1;
    return lex_push(L, t);
}

static const struct {
    const char *s;
    jop op;
} lex_ops[] = {
    {"//", JOP_FLOORDIV}, {"**", JOP_POW}, {"==", JOP_EQ}, {"!=", JOP_NE}, {">=", JOP_GE},
    {"<=", JOP_LE}, {"+", JOP_ADD}, {"-", JOP_SUB}, {"/", JOP_DIV}, {"*", JOP_MUL},
    {"%", JOP_MOD}, {"~", JOP_TILDE}, {"[", JOP_LBRACKET}, {"]", JOP_RBRACKET},
    {"(", JOP_LPAREN}, {")", JOP_RPAREN}, {"{", JOP_LBRACE}, {"}", JOP_RBRACE},
    {">", JOP_GT}, {"<", JOP_LT}, {"=", JOP_ASSIGN}, {".", JOP_DOT}, {":", JOP_COLON},
    {"|", JOP_PIPE}, {",", JOP_COMMA}, {";", JOP_SEMICOLON},
};

#define LEX_MAX_BRACKETS 256

/* Tokens inside {{ }} or {% %}, up to and including the end delimiter. */
static td_err lex_tag(jlex *L, tag_kind kind, bool *line_starting)
{
    const char *s = L->s;
    size_t i = L->pos;
    char stack[LEX_MAX_BRACKETS];
    int depth = 0;
    int start_line = L->line;
    while (i < L->n) {
        if (depth == 0) {
            const char *close = kind == TAG_BLOCK ? "%}" : "}}";
            if (kind == TAG_BLOCK && i + 3 <= L->n && s[i] == '+' && !memcmp(s + i + 1, close, 2)) {
                L->pos = i + 3;
                *line_starting = false;
                return lex_simple(L, JT_BLOCK_END);
            }
            if (i + 3 <= L->n && s[i] == '-' && !memcmp(s + i + 1, close, 2)) {
                TD_TRY(lex_simple(L, kind == TAG_BLOCK ? JT_BLOCK_END : JT_VAR_END));
                size_t e = skip_space(s, L->n, i + 3);
                L->line += count_nl(s + i, e - i);
                *line_starting = e > i + 3 && s[e - 1] == '\n';
                L->pos = e;
                return TD_OK;
            }
            if (i + 2 <= L->n && !memcmp(s + i, close, 2)) {
                TD_TRY(lex_simple(L, kind == TAG_BLOCK ? JT_BLOCK_END : JT_VAR_END));
                i += 2;
                *line_starting = false;
                if (kind == TAG_BLOCK && i < L->n && s[i] == '\n') { /* trim_blocks */
                    i++;
                    L->line++;
                    *line_starting = true;
                }
                L->pos = i;
                return TD_OK;
            }
        }
        size_t sp = space_at(s, L->n, i);
        if (sp) {
            L->line += s[i] == '\n';
            i += sp;
            continue;
        }
        char c = s[i];
        if (is_digit(c)) {
            TD_TRY(lex_number(L, &i));
            continue;
        }
        if (is_name_start(c)) {
            size_t j = i;
            while (j < L->n && is_name_char(s[j]))
                j++;
            if (j < L->n && (unsigned char)s[j] >= 0x80)
                return err_set(TD_ENOTSUP, "template line %d: non-ASCII identifiers are not supported", L->line);
            jtok t = {.kind = JT_NAME, .line = L->line, .p = s + i, .n = j - i};
            TD_TRY(lex_push(L, t));
            i = j;
            continue;
        }
        if (c == '\'' || c == '"') {
            TD_TRY(lex_string(L, &i));
            continue;
        }
        size_t k;
        for (k = 0; k < sizeof lex_ops / sizeof lex_ops[0]; k++) {
            size_t m = strlen(lex_ops[k].s);
            if (i + m <= L->n && !memcmp(s + i, lex_ops[k].s, m))
                break;
        }
        if (k == sizeof lex_ops / sizeof lex_ops[0]) {
            if ((unsigned char)c >= 0x80)
                return err_set(TD_EFORMAT, "template line %d: unexpected character '%.*s'", L->line,
                               (int)(utf8_next(s, L->n, i) - i), s + i);
            return err_set(TD_EFORMAT, "template line %d: unexpected character '%c'", L->line, c);
        }
        jop op = lex_ops[k].op;
        if (op == JOP_LBRACE || op == JOP_LPAREN || op == JOP_LBRACKET) {
            if (depth == LEX_MAX_BRACKETS)
                return err_set(TD_ERANGE, "template line %d: brackets nested too deeply", L->line);
            stack[depth++] = op == JOP_LBRACE ? '}' : op == JOP_LPAREN ? ')' : ']';
        } else if (op == JOP_RBRACE || op == JOP_RPAREN || op == JOP_RBRACKET) {
            if (depth == 0)
                return err_set(TD_EFORMAT, "template line %d: unexpected '%c'", L->line, c);
            if (stack[--depth] != c)
                return err_set(TD_EFORMAT, "template line %d: unexpected '%c', expected '%c'",
                               L->line, c, stack[depth]);
        }
        jtok t = {.kind = JT_OP, .op = (uint8_t)op, .line = L->line};
        TD_TRY(lex_push(L, t));
        i += strlen(lex_ops[k].s);
    }
    return err_set(TD_EFORMAT, "template line %d: unexpected end of template inside the tag opened on line %d, expected '%s'",
                   L->line, start_line, kind == TAG_BLOCK ? "%}" : "}}");
}

/* Finds "[-+]?#}" or, for raw, "{%[-+]? endraw %}"; handles the text before and after. */
static td_err lex_comment(jlex *L, bool *line_starting)
{
    const char *s = L->s;
    for (size_t i = L->pos; i + 1 < L->n; i++) {
        if (s[i] != '#' || s[i + 1] != '}')
            continue;
        size_t e = i + 2;
        bool trim = true;
        if (i > L->pos && s[i - 1] == '+') {
            trim = false;
        } else if (i > L->pos && s[i - 1] == '-') {
            e = skip_space(s, L->n, e);
            trim = false;
        }
        if (trim && e < L->n && s[e] == '\n')
            e++;
        L->line += count_nl(s + L->pos, e - L->pos);
        *line_starting = e > 0 && s[e - 1] == '\n' && e > i + 2;
        L->pos = e;
        return TD_OK;
    }
    return err_set(TD_EFORMAT, "template line %d: missing end of comment tag", L->line);
}

static td_err lex_raw(jlex *L, size_t begin_len, bool *line_starting)
{
    const char *s = L->s;
    L->line += count_nl(s + L->pos, begin_len);
    L->pos += begin_len;
    bool begin_ends_line = s[L->pos - 1] == '\n';
    for (size_t i = L->pos; i + 1 < L->n; i++) {
        if (s[i] != '{' || s[i + 1] != '%')
            continue;
        size_t j = i + 2;
        char sign = j < L->n && (s[j] == '-' || s[j] == '+') ? s[j] : 0;
        j = skip_space(s, L->n, j + (sign ? 1 : 0));
        if (j + 6 > L->n || memcmp(s + j, "endraw", 6) != 0)
            continue;
        j = skip_space(s, L->n, j + 6);
        size_t e;
        bool nl = false;
        if (j + 3 <= L->n && (s[j] == '+' || s[j] == '-') && !memcmp(s + j + 1, "%}", 2)) {
            e = s[j] == '-' ? skip_space(s, L->n, j + 3) : j + 3;
            nl = s[j] == '-' && e > j + 3 && s[e - 1] == '\n';
        } else if (j + 2 <= L->n && !memcmp(s + j, "%}", 2)) {
            e = j + 2;
            if (e < L->n && s[e] == '\n') {
                e++;
                nl = true;
            }
        } else {
            continue;
        }
        TD_TRY(lex_text(L, i, TAG_BLOCK, sign, begin_ends_line));
        L->line += count_nl(s + i, e - i);
        L->pos = e;
        *line_starting = nl;
        return TD_OK;
    }
    return err_set(TD_EFORMAT, "template line %d: missing end of raw directive", L->line);
}

td_err jinja_lex(jarena *a, const char *src, size_t len, jtok **out, size_t *n_out)
{
    /* newlines normalised, one trailing newline dropped */
    char *s = jarena_alloc(a, len + 1);
    if (!s)
        return lex_nomem();
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n > 0 && s[n - 1] == '\n')
        n--;
    jlex L = {.a = a, .s = s, .n = n, .line = 1};
    bool line_starting = true;
    while (L.pos < L.n) {
        size_t at;
        tag_kind kind = next_tag(&L, &at);
        if (kind == TAG_NONE) {
            jtok t = {.kind = JT_DATA, .line = L.line, .p = s + L.pos, .n = n - L.pos};
            TD_TRY(lex_push(&L, t));
            L.line += count_nl(s + L.pos, n - L.pos);
            break;
        }
        char sign = at + 2 < n && (s[at + 2] == '-' || s[at + 2] == '+') ? s[at + 2] : 0;
        TD_TRY(lex_text(&L, at, kind == TAG_RAW ? TAG_BLOCK : kind, sign, line_starting));
        L.pos = at;
        if (kind == TAG_RAW) {
            TD_TRY(lex_raw(&L, raw_begin_at(s, n, at, "raw"), &line_starting));
            continue;
        }
        L.pos = at + 2 + (sign ? 1 : 0);
        if (kind == TAG_COMMENT) {
            TD_TRY(lex_comment(&L, &line_starting));
            continue;
        }
        TD_TRY(lex_simple(&L, kind == TAG_BLOCK ? JT_BLOCK_BEGIN : JT_VAR_BEGIN));
        TD_TRY(lex_tag(&L, kind, &line_starting));
    }
    TD_TRY(lex_simple(&L, JT_EOF));
    *out = L.tok;
    *n_out = L.n_tok;
    return TD_OK;
}
