/* tandem tokenize / tandem detokenize: the tokenizer of a GGUF file from the command line.
 *
 *   tandem tokenize --model M.gguf TEXT            ids, comma separated
 *   tandem tokenize --model M.gguf --json TEXT     a JSON array
 *   tandem tokenize --model M.gguf --file F        the whole file as one text
 *   tandem tokenize --model M.gguf --lines F       each line of F as its own text, one JSON
 *                                                  array per line (thousands of cases, one load)
 *   tandem detokenize --model M.gguf 1,2,3         the text, exactly (no newline added)
 *   tandem detokenize --model M.gguf --lines F     each line of ids -> one escaped line
 *
 * Lines end at '\n' only, so a '\r' before it stays part of the text. With --escapes, lines
 * given to tokenize may write \n \r \t \\ and \xHH (any byte, also invalid UTF-8), and
 * detokenize --lines always writes its output lines that way (\\, \n, \r, \t, other control
 * bytes as \xHH; everything else as is), so texts with line breaks fit on one line. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_ids.h"
#include "cli/cli_file.h"
#include "cli/cmd.h"
#include "common/args.h"
#include "common/tokenizer.h"

/* --- helpers ------------------------------------------------------------------------------ */

/* The whole file in a malloc'd buffer (NUL-terminated for convenience); 1 after a message. */
static int tokcli_read_file(const char *path, char **out, size_t *len)
{
    if (cli_read_file(path, out, len) == TD_OK)
        return 0;
    fprintf(stderr, "tandem: %s\n", err_msg());
    return 1;
}

static int tokcli_hex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Undoes the escapes of --escapes in place; returns -1 on a malformed escape. */
static long tokcli_unescape(char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\') {
            s[o++] = s[i];
            continue;
        }
        if (++i == n)
            return -1;
        switch (s[i]) {
        case 'n': s[o++] = '\n'; break;
        case 'r': s[o++] = '\r'; break;
        case 't': s[o++] = '\t'; break;
        case '\\': s[o++] = '\\'; break;
        case 'x': {
            int hi = i + 2 < n ? tokcli_hex(s[i + 1]) : -1;
            int lo = i + 2 < n ? tokcli_hex(s[i + 2]) : -1;
            if (hi < 0 || lo < 0)
                return -1;
            s[o++] = (char)(hi * 16 + lo);
            i += 2;
            break;
        }
        default:
            return -1;
        }
    }
    return (long)o;
}

static void tokcli_put_escaped(FILE *f, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\')
            fputs("\\\\", f);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
}

static void tokcli_put_ids(FILE *f, const tok_ids *ids, bool json)
{
    if (json)
        fputc('[', f);
    for (size_t i = 0; i < ids->n; i++)
        fprintf(f, i ? ",%d" : "%d", ids->ids[i]);
    fputs(json ? "]\n" : "\n", f);
}

/* cli_parse_ids with this command's messages and exit codes (2: not ids, 1: no memory). */
static int tokcli_parse_ids(const char *s, size_t n, tok_ids *out, const char *where)
{
    td_err e = cli_parse_ids(s, n, out);
    if (e == TD_OK)
        return 0;
    fprintf(stderr, "tandem detokenize: %s: %s\n", where, err_msg());
    return e == TD_EINVAL ? 2 : 1;
}

static int tokcli_finish(const char *cmd, int rc)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "tandem %s: writing the output failed\n", cmd);
        return 1;
    }
    return rc;
}

/* --- tokenize ------------------------------------------------------------------------------- */

static int tokcli_encode_lines(const tokenizer *t, char *buf, size_t len, bool escapes, unsigned flags)
{
    tok_ids ids = {0};
    size_t line = 0;
    int rc = 0;
    for (size_t at = 0; at < len && rc == 0;) {
        char *nl = memchr(buf + at, '\n', len - at);
        size_t n = nl ? (size_t)(nl - (buf + at)) : len - at;
        line++;
        long m = escapes ? tokcli_unescape(buf + at, n) : (long)n;
        if (m < 0) {
            fprintf(stderr, "tandem tokenize: line %zu: a bad escape (use \\n \\r \\t \\\\ \\xHH)\n", line);
            rc = 2;
            break;
        }
        ids.n = 0;
        if (tok_encode(t, buf + at, (size_t)m, flags, &ids) != TD_OK) {
            fprintf(stderr, "tandem tokenize: line %zu: %s\n", line, err_msg());
            rc = 1;
            break;
        }
        tokcli_put_ids(stdout, &ids, true);
        at += n + 1;
    }
    tok_ids_free(&ids);
    return rc;
}

int cmd_tokenize(int argc, char **argv)
{
    bool json = false, help = false, escapes = false, add_special = false, split_special = false;
    const char *model = NULL, *file = NULL, *lines = NULL;
    const args_opt opts[] = {
        {.name = "model", .type = ARGS_STRING, .value = &model, .env = "TANDEM_MODEL",
                 .help = "GGUF file with the tokenizer", .short_name = 'm'},
        {.name = "json", .type = ARGS_FLAG, .value = &json, .help = "print a JSON array"},
        {.name = "file", .type = ARGS_STRING, .value = &file, .help = "read the text from this file"},
        {.name = "lines", .type = ARGS_STRING, .value = &lines,
                 .help = "encode each line of this file; one JSON array per line"},
        {.name = "escapes", .type = ARGS_FLAG, .value = &escapes,
                 .help = "--lines: lines use \\n \\r \\t \\\\ \\xHH"},
        {.name = "add-special", .type = ARGS_FLAG, .value = &add_special,
                 .help = "add bos/eos when the vocabulary asks for it"},
        {.name = "split-special", .type = ARGS_FLAG, .value = &split_special,
                 .help = "treat special tokens' text as plain text"},
        ARGS_END,
    };
    static const char usage[] = "tandem tokenize --model M.gguf [--json] (TEXT | --file F | --lines F [--escapes])";
    const char *pos[1];
    int npos = 0;
    if (args_parse(argc, argv, 1, opts, pos, 1, &npos, &help) != TD_OK) {
        fprintf(stderr, "tandem tokenize: %s\n", err_msg());
        args_usage(usage, opts);
        return 2;
    }
    if (help) {
        args_usage(usage, opts);
        return 0;
    }
    if (!model || npos + !!file + !!lines != 1 || (escapes && !lines)) {
        fprintf(stderr, "tandem tokenize: need --model and exactly one of TEXT, --file, --lines "
                        "(--escapes only with --lines)\n");
        args_usage(usage, opts);
        return 2;
    }
    tokenizer *t = NULL;
    if (tok_open(&t, model) != TD_OK) {
        fprintf(stderr, "tandem tokenize: %s\n", err_msg());
        return 1;
    }
    unsigned flags = (add_special ? TOK_ENC_ADD_SPECIAL : 0) | (split_special ? TOK_ENC_SPLIT_SPECIAL : 0);
    char *buf = NULL;
    size_t len = 0;
    int rc = 0;
    if (file || lines)
        rc = tokcli_read_file(file ? file : lines, &buf, &len);
    if (rc == 0 && lines) {
        rc = tokcli_encode_lines(t, buf, len, escapes, flags);
    } else if (rc == 0) {
        tok_ids ids = {0};
        const char *text = file ? buf : pos[0];
        if (tok_encode(t, text, file ? len : strlen(text), flags, &ids) != TD_OK) {
            fprintf(stderr, "tandem tokenize: %s\n", err_msg());
            rc = 1;
        } else {
            tokcli_put_ids(stdout, &ids, json);
        }
        tok_ids_free(&ids);
    }
    free(buf);
    tok_free(t);
    return tokcli_finish("tokenize", rc);
}

/* --- detokenize ---------------------------------------------------------------------------- */

/* Decodes ids whole, or (seed != 0) through a tok_stream fed chunks of 1..4 ids whose sizes
 * come from seed: the two must give the same text. */
static td_err tokcli_decode(const tokenizer *t, const tok_ids *ids, unsigned flags, uint64_t seed, tok_bytes *out)
{
    if (!seed)
        return tok_decode(t, ids->ids, ids->n, flags, out);
    tok_stream s;
    tok_stream_init(&s, t, flags);
    uint64_t x = seed;
    for (size_t i = 0; i < ids->n;) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
        size_t k = 1 + x % 4;
        if (k > ids->n - i)
            k = ids->n - i;
        TD_TRY(tok_stream_push(&s, ids->ids + i, k, out));
        i += k;
    }
    return tok_stream_flush(&s, out);
}

int cmd_detokenize(int argc, char **argv)
{
    bool help = false, skip_special = false;
    const char *model = NULL, *lines = NULL;
    int64_t stream_seed = 0;
    const args_opt opts[] = {
        {.name = "model", .type = ARGS_STRING, .value = &model, .env = "TANDEM_MODEL",
                 .help = "GGUF file with the tokenizer", .short_name = 'm'},
        {.name = "lines", .type = ARGS_STRING, .value = &lines,
                 .help = "decode each line of ids of this file; one escaped line each"},
        {.name = "skip-special", .type = ARGS_FLAG, .value = &skip_special,
                 .help = "special (CONTROL) tokens print nothing"},
        {.name = "stream", .type = ARGS_INT, .value = &stream_seed,
                 .help = "decode as a stream in chunks of 1..4 ids drawn from this seed", .min = 0, .max = INT64_MAX},
        ARGS_END,
    };
    static const char usage[] = "tandem detokenize --model M.gguf (IDS | --lines F)   IDS: 1,2,3 or [1,2,3]";
    const char *pos[1];
    int npos = 0;
    if (args_parse(argc, argv, 1, opts, pos, 1, &npos, &help) != TD_OK) {
        fprintf(stderr, "tandem detokenize: %s\n", err_msg());
        args_usage(usage, opts);
        return 2;
    }
    if (help) {
        args_usage(usage, opts);
        return 0;
    }
    if (!model || npos + !!lines != 1) {
        fprintf(stderr, "tandem detokenize: need --model and exactly one of IDS, --lines\n");
        args_usage(usage, opts);
        return 2;
    }
    tokenizer *t = NULL;
    if (tok_open(&t, model) != TD_OK) {
        fprintf(stderr, "tandem detokenize: %s\n", err_msg());
        return 1;
    }
    unsigned flags = skip_special ? TOK_DEC_SKIP_SPECIAL : 0;
    tok_ids ids = {0};
    tok_bytes text = {0};
    char *buf = NULL;
    size_t len = 0;
    int rc = 0;
    if (!lines) {
        rc = tokcli_parse_ids(pos[0], strlen(pos[0]), &ids, "argument");
        if (rc == 0 && tokcli_decode(t, &ids, flags, (uint64_t)stream_seed, &text) != TD_OK) {
            fprintf(stderr, "tandem detokenize: %s\n", err_msg());
            rc = 1;
        }
        if (rc == 0)
            fwrite(text.ptr, 1, text.len, stdout);
    } else if ((rc = tokcli_read_file(lines, &buf, &len)) == 0) {
        size_t line = 0;
        for (size_t at = 0; at < len && rc == 0;) {
            char *nl = memchr(buf + at, '\n', len - at);
            size_t n = nl ? (size_t)(nl - (buf + at)) : len - at;
            char where[32];
            snprintf(where, sizeof where, "line %zu", ++line);
            rc = tokcli_parse_ids(buf + at, n, &ids, where);
            text.len = 0;
            if (rc == 0 && tokcli_decode(t, &ids, flags, (uint64_t)stream_seed, &text) != TD_OK) {
                fprintf(stderr, "tandem detokenize: %s: %s\n", where, err_msg());
                rc = 1;
            }
            if (rc == 0) {
                tokcli_put_escaped(stdout, text.ptr ? text.ptr : "", text.len);
                fputc('\n', stdout);
            }
            at += n + 1;
        }
    }
    free(buf);
    tok_ids_free(&ids);
    tok_bytes_free(&text);
    tok_free(t);
    return tokcli_finish("detokenize", rc);
}
