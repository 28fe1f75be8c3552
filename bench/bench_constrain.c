/* bench_constrain: what structured output costs verifyd on the host (verifyd/constrain.h).
 * Builds a vocabulary of Qwen's size laid out like a real one (single bytes, words with and
 * without a leading space, numbers, whitespace runs, JSON punctuation, CJK characters and
 * their partial byte pairs, words with quotes or newlines in them), then prints: the time to
 * build its tables and tries, and the time of one token mask (a trie walk, the memo cleared
 * before each) after texts that stop in the document's different places, for json_object
 * mode, a schema, a tool call, GBNF and Lark grammars and a regex, and a 16-row verify
 * block's masks along a document (memo on, as in a generation).
 * Usage: bench_constrain [n_vocab] [repeats] (defaults: 248320, 20). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/tokenizer.h"
#include "kernels/backend.h"
#include "verifyd/constrain.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct vocab_build {
    tok_str *tok;
    int32_t *types;
    uint32_t n, cap;
    tok_bytes text; /* every token's alphabet string, back to back */
    size_t *off;
} vocab_build;

/* One more normal token of raw bytes b[0..n). */
static void vb_add(vocab_build *v, const void *b, size_t n)
{
    if (v->n == v->cap)
        return;
    v->off[v->n] = v->text.len;
    if (tok_alphabet_of(b, n, &v->text) != TD_OK) {
        fprintf(stderr, "bench_constrain: %s\n", err_msg());
        exit(1);
    }
    v->types[v->n++] = TOK_TYPE_NORMAL;
}

static void vb_add_str(vocab_build *v, const char *s)
{
    vb_add(v, s, strlen(s));
}

/* Word i of a base-26 alphabet, 2..7 letters: distinct for distinct i. */
static size_t word(uint32_t i, char *out)
{
    size_t n = 0;
    uint32_t len = 2 + i % 6;
    for (uint32_t k = 0; k < len; k++, i /= 26)
        out[n++] = (char)('a' + i % 26);
    out[n] = 0;
    return n;
}

static tokenizer *make_vocab(uint32_t n_vocab)
{
    vocab_build v = {.cap = n_vocab - 2};
    v.tok = calloc(n_vocab, sizeof *v.tok);
    v.types = calloc(n_vocab, sizeof *v.types);
    v.off = calloc(n_vocab + 1, sizeof *v.off);
    for (int b = 0; b < 256; b++) {
        const uint8_t one = (uint8_t)b;
        vb_add(&v, &one, 1);
    }
    static const char *const punct[] = {
        "\",", "\":", "{\"", "\"}", "\"]", "[\"", "\": \"", "\", \"", "\":\"", "},", "},{", "}]",
        "[{", "\n", "\n\n", "\r\n", "\t", "\t\t", "\",\n", "\":{", "\": {", "\": [", "{\n",
        "}\n", "]\n", "\\n", "\\\"", "\\\\", "://", ".\n", ");\n", "();", " {", " }", " [",
        " \"", " =", " ==", "true", "false", "null", " true", " false", " null", "\"\n", "'s",
    };
    for (size_t i = 0; i < sizeof punct / sizeof *punct; i++)
        vb_add_str(&v, punct[i]);
    char buf[96];
    for (int k = 2; k <= 64; k++) { /* whitespace runs, also after a newline */
        memset(buf, ' ', (size_t)k);
        vb_add(&v, buf, (size_t)k);
        buf[0] = '\n';
        vb_add(&v, buf, (size_t)k);
    }
    for (int i = 0; i < 1000; i++) { /* numbers */
        snprintf(buf, sizeof buf, "%d", i);
        if (i >= 10)
            vb_add_str(&v, buf);
        snprintf(buf, sizeof buf, " %d", i);
        vb_add_str(&v, buf);
    }
    for (uint32_t cp = 0x4E00; cp < 0x4E00 + 20000; cp++) { /* CJK characters */
        const uint8_t u[3] = {(uint8_t)(0xE0 | cp >> 12), (uint8_t)(0x80 | (cp >> 6 & 0x3F)),
                              (uint8_t)(0x80 | (cp & 0x3F))};
        vb_add(&v, u, 3);
        if ((cp & 0x3F) == 0)
            vb_add(&v, u, 2); /* and the byte pairs that begin them */
    }
    for (uint32_t i = 0; v.n < v.cap; i++) { /* words, some with a quote or a newline */
        const size_t n = word(i, buf + 1);
        buf[0] = ' ';
        switch (i % 20) {
        case 0: vb_add(&v, buf + 1, n); break;
        case 1: buf[n + 1] = '"'; vb_add(&v, buf + 1, n + 1); break;
        case 2: buf[n + 1] = '\n'; vb_add(&v, buf, n + 2); break;
        case 3: buf[0] = '"'; vb_add(&v, buf, n + 1); break;
        default: vb_add(&v, buf, n + 1); break;
        }
    }
    /* a tool call's markers, the end of text and of a turn: printable ASCII is its own
     * alphabet spelling */
    v.cap += 4;
    vb_add_str(&v, "<tool_call>");
    vb_add_str(&v, "</tool_call>");
    vb_add_str(&v, "<|endoftext|>");
    vb_add_str(&v, "<|im_end|>");
    for (uint32_t i = v.n - 4; i < v.n; i++)
        v.types[i] = TOK_TYPE_CONTROL;
    v.off[v.n] = v.text.len;
    for (uint32_t i = 0; i < v.n; i++)
        v.tok[i] = (tok_str){v.text.ptr + v.off[i], v.off[i + 1] - v.off[i]};
    tok_desc d = {.pre = TOK_PRE_QWEN35, .n_tokens = v.n, .tokens = v.tok, .types = v.types,
                  .specials = {.bos = -1, .eos = (int32_t)v.n - 2, .eot = (int32_t)v.n - 1,
                               .pad = -1, .unk = -1}};
    tokenizer *tk = NULL;
    if (tok_init(&tk, &d) != TD_OK) {
        fprintf(stderr, "bench_constrain: %s\n", err_msg());
        exit(1);
    }
    free(v.tok);
    free(v.types);
    free(v.off);
    tok_bytes_free(&v.text);
    return tk;
}

static const char SCHEMA[] =
    "{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"name\",\"age\","
    "\"tags\"],\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"email\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]},\"tags\":{\"type\":"
    "\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]}}}}";

static const char TOOLS[] =
    "{\"form\":\"xml\",\"tools\":[{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\",\"enum\":[\"Paris\",\"Rome\",\"Tokyo\"]},"
    "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14},\"note\":{\"type\":"
    "\"string\"}},\"required\":[\"city\"]}},{\"name\":\"get_time\"}]}";

/* The state after text, fed as single-byte tokens (id = byte). */
static void emit_text(cst_state *c, const char *text)
{
    for (const char *p = text; *p; p++) {
        const int32_t id = (uint8_t)*p;
        if (cst_emit(c, &id, 1) != TD_OK) {
            fprintf(stderr, "bench_constrain: \"%s\": %s\n", text, err_msg());
            exit(1);
        }
    }
}

static void forget(cst_state *c)
{
    for (int i = 0; i < CST_MEMO; i++)
        c->memo[i].hash = 0;
}

/* The mask after each text (after the token first, when >= 0), best of repeats. */
static void time_masks(const cst_vocab *voc, const cst_cfg *cfg, const char *name, int32_t first,
                       const char *const *texts, size_t n_texts, int repeats)
{
    uint32_t *m = malloc((size_t)voc->words * sizeof *m);
    for (size_t k = 0; k < n_texts; k++) {
        cst_state c;
        if (cst_init(&c, cfg, voc, 16) != TD_OK) {
            fprintf(stderr, "bench_constrain: %s\n", err_msg());
            exit(1);
        }
        if (first >= 0 && cst_emit(&c, &first, 1) != TD_OK) {
            fprintf(stderr, "bench_constrain: %s\n", err_msg());
            exit(1);
        }
        emit_text(&c, texts[k]);
        double best = 1e9, cold = 0;
        for (int r = 0; r < repeats; r++) {
            forget(&c);
            const double t0 = now_s();
            cst_mask(&c, m);
            const double t = now_s() - t0;
            cold = r == 0 ? t : cold;
            best = t < best ? t : best;
        }
        int allowed = 0;
        for (int64_t t = 0; t < voc->n_vocab; t++)
            allowed += (int)(m[t / 32] >> (t % 32) & 1u);
        char shown[40]; /* the text's end, newlines as \n */
        const size_t len = strlen(texts[k]);
        const char *p = texts[k] + (len > 30 ? len - 30 : 0);
        size_t n = (size_t)snprintf(shown, sizeof shown, "%s", len > 30 ? "..." : "");
        for (; *p && n + 3 < sizeof shown; p++)
            n += (size_t)snprintf(shown + n, sizeof shown - n, *p == '\n' ? "\\n" : "%c", *p);
        printf("%-12s %-34s %8.3f ms %8.3f ms  %7d tokens allowed\n", name, shown, cold * 1e3,
               best * 1e3, allowed);
        cst_free(&c, NULL);
    }
    free(m);
}

int main(int argc, char **argv)
{
    const uint32_t n_vocab = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 248320;
    const int repeats = argc > 2 ? atoi(argv[2]) : 20;
    if (n_vocab < 40000 || repeats < 1) {
        fprintf(stderr, "usage: bench_constrain [n_vocab >= 40000] [repeats]\n");
        return 2;
    }
    double t0 = now_s();
    tokenizer *tk = make_vocab(n_vocab);
    cst_vocab voc;
    double t1 = now_s();
    if (cst_vocab_init(&voc, tk, n_vocab) != TD_OK) {
        fprintf(stderr, "bench_constrain: %s\n", err_msg());
        return 1;
    }
    double t2 = now_s();
    printf("vocabulary of %u tokens: made in %.1f ms, structured-output tables in %.1f ms "
           "(trie of %d nodes, %d of them for the non-plain tokens)\n", n_vocab,
           (t1 - t0) * 1e3, (t2 - t1) * 1e3, voc.all.n_nodes, voc.other.n_nodes);
    printf("one mask (trie walk): the first of a generation (its transition cache empty), "
           "then the best of %d (the cache warm, the mask memo emptied):\n", repeats);
    const char *const obj[] = {"", "{", "{\"", "{\"ke", "{\"key\": ", "{\"key\": \"val",
                               "{\"key\": \"val\\", "{\"key\": 12", "{\"key\": [1, ",
                               "{\"key\": tr", "{\"key\": {}}"};
    const cst_cfg json = {.format = MSG_FORMAT_JSON_OBJECT, .think_start = -1, .think_end = -1};
    time_masks(&voc, &json, "json_object", -1, obj, sizeof obj / sizeof *obj, repeats);
    const char *const sch[] = {"{", "{\"", "{\"na", "{\"name\": \"Al", "{\"name\": \"Al\", ",
                               "{\"age\": 4", "{\"email\": ", "{\"email\": \"a@",
                               "{\"tags\": [\"re", "{\"tags\": [], \"age\": 1, \"name\": \"\"}"};
    const cst_cfg schema = {.format = MSG_FORMAT_JSON_SCHEMA, .schema = SCHEMA,
                            .n_schema = sizeof SCHEMA - 1, .think_start = -1, .think_end = -1};
    time_masks(&voc, &schema, "json_schema", -1, sch, sizeof sch / sizeof *sch, repeats);
    /* a required tool call's body (Qwen3.5's XML form), after its <tool_call> */
    const char *const call[] = {"", "\n<function=", "\n<function=get_weather>\n",
                                "\n<function=get_weather>\n<parameter=city>\nPa",
                                "\n<function=get_weather>\n<parameter=note>\nsome text",
                                "\n<function=get_weather>\n<parameter=days>\n1"};
    const cst_cfg tool = {.format = MSG_FORMAT_TOOL_CALL, .schema = TOOLS,
                          .n_schema = sizeof TOOLS - 1, .think_start = -1, .think_end = -1};
    time_masks(&voc, &tool, "tool_call", voc.call_open, call, sizeof call / sizeof *call,
               repeats);

    /* a GBNF grammar and a regular expression: fixed words, a free line, numbers */
    static const char GBNF[] = "root ::= \"Title: \" line \"\\nItems:\" (\"\\n- \" item){1,5}\n"
                               "line ::= [^\\n]+\n"
                               "item ::= [a-z ]{1,40} \" (\" [0-9]{1,3} \")\"\n";
    const char *const gtexts[] = {"", "Title: ", "Title: The long way home",
                                  "Title: x\nItems:\n- ", "Title: x\nItems:\n- apples (",
                                  "Title: x\nItems:\n- apples (12)"};
    const cst_cfg gram = {.format = MSG_FORMAT_GRAMMAR, .schema = GBNF,
                          .n_schema = sizeof GBNF - 1, .think_start = -1, .think_end = -1};
    time_masks(&voc, &gram, "grammar", -1, gtexts, sizeof gtexts / sizeof *gtexts, repeats);
    /* a Lark grammar whose %ignore lets spaces stand between any two items */
    static const char LARK[] = "?start: sum\n?sum: product ((\"+\" | \"-\") product)*\n"
                               "?product: atom ((\"*\" | \"/\") atom)*\n"
                               "?atom: NUMBER | CNAME \"(\" sum \")\" | \"(\" sum \")\"\n"
                               "%import common (NUMBER, CNAME, WS)\n%ignore WS\n";
    const char *const ltexts[] = {"", "1 + ", "(1 + 2) * ", "  12.5e3 - max(", "sin (x1 "};
    const cst_cfg lk = {.format = MSG_FORMAT_GRAMMAR, .schema = LARK,
                        .n_schema = sizeof LARK - 1, .think_start = -1, .think_end = -1};
    time_masks(&voc, &lk, "lark", -1, ltexts, sizeof ltexts / sizeof *ltexts, repeats);
    static const char RE[] = "(\\d{3}-){2}\\d{4}|[A-Z][a-z]+( [A-Z][a-z]+)*";
    const char *const rtexts[] = {"", "555-", "555-123-", "Ann", "Ann Lee Mar"};
    const cst_cfg rex = {.format = MSG_FORMAT_REGEX, .schema = RE, .n_schema = sizeof RE - 1,
                         .think_start = -1, .think_end = -1};
    time_masks(&voc, &rex, "regex", -1, rtexts, sizeof rtexts / sizeof *rtexts, repeats);

    /* A generation's verify blocks: 16 rows after 15 single-byte drafts along a document, the
     * memo kept between blocks; masks only (the backend op is the CPU's, not timed apart). */
    static const char doc[] =
        "{\"name\": \"Alice Liddell of Oxford\", \"age\": 7, \"email\": null, \"tags\": "
        "[\"red\", \"blue\"]}";
    cst_state c;
    if (cst_init(&c, &schema, &voc, 16) != TD_OK)
        return 1;
    float *lg = malloc((size_t)16 * n_vocab * sizeof *lg);
    const ops_backend *be = ops_backend_cpu();
    int32_t ids[sizeof doc];
    for (size_t i = 0; i < sizeof doc - 1; i++)
        ids[i] = (uint8_t)doc[i];
    double total = 0;
    int blocks = 0;
    for (size_t at = 0; at + 16 <= sizeof doc - 1; at += 16, blocks++) {
        const double s0 = now_s();
        cst_apply(&c, be, lg, ids + at, 16);
        total += now_s() - s0;
        cst_emit(&c, ids + at, 16);
    }
    printf("verify blocks of 16 rows along a %zu-byte document: %.3f ms per block (%d blocks, "
           "memo on; includes the CPU backend's masking of 16 x %u logits)\n", sizeof doc - 1,
           total / blocks * 1e3, blocks, n_vocab);
    cst_free(&c, be);
    free(lg);
    cst_vocab_free(&voc);
    tok_free(tk);
    return 0;
}
