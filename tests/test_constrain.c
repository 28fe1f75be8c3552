/* Structured output in verifyd (verifyd/constrain.h): the masks built by walking the
 * vocabulary's trie (and the plain-string shortcut) equal a token-by-token check of every
 * token against the matcher; a block's rows are masked after the drafts before them and a
 * block is cut at its first refused draft; the reasoning phases; and generation: speculative
 * greedy output with two drafters equals plain decoding with the masks applied by hand, and
 * every output (greedy or sampled) is a viable prefix of a valid document, complete when it
 * ends with an end-of-generation token. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/support/model_fixture.h"
#include "tests/support/tmp_dir.h"
#include "gateway/toolcall.h"
#include "verifyd/constrain.h"
#include "verifyd/spec.h"

#define MODEL_PATH "tests/data/models/qwen35-tiny-f32.gguf"

static tokenizer *TOK;
static tgt_model *TM;
static cst_vocab VOC;
static char tmpdir[64];

static const char SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\",\"minimum\":-3,\"maximum\":150},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"bc\","
    "null]},\"maxItems\":3},\"note\":{\"type\":\"string\"}},\"required\":[\"name\",\"age\"],"
    "\"additionalProperties\":false}";

static int setup(void **ctx)
{
    (void)ctx;
    if (tgt_load(&TM, MODEL_PATH) != TD_OK || tok_load_gguf(&TOK, TM->file) != TD_OK)
        return -1;
    if (cst_vocab_init(&VOC, TOK, TM->hp.n_vocab) != TD_OK)
        return -1;
    return tmp_dir_make(tmpdir, sizeof tmpdir, "tandem-cst") ? 0 : -1;
}

static int teardown(void **ctx)
{
    (void)ctx;
    cst_vocab_free(&VOC);
    tok_free(TOK);
    tgt_free(TM);
    return tmp_dir_remove(tmpdir) ? 0 : -1;
}

static bool bit(const uint32_t *m, int64_t t)
{
    return m[t / 32] >> (t % 32) & 1u;
}

/* The id of a token whose bytes are exactly s, or -1. */
static int32_t id_of_bytes(const char *s)
{
    for (int64_t t = 0; t < VOC.n_vocab; t++) {
        const tok_str b = t < tok_n_vocab(TOK) ? tok_bytes_of(TOK, (int32_t)t) : (tok_str){0};
        if (tok_type_of(TOK, (int32_t)t) == TOK_TYPE_NORMAL && b.len == strlen(s) &&
            memcmp(b.ptr, s, b.len) == 0)
            return (int32_t)t;
    }
    return -1;
}

/* Token ids spelling text, one single-byte token per byte. */
static int64_t spell(const char *text, int32_t *ids)
{
    int64_t n = 0;
    for (const char *p = text; *p; p++) {
        const char one[2] = {*p, 0};
        ids[n] = id_of_bytes(one);
        assert_true(ids[n] >= 0);
        n++;
    }
    return n;
}

/* What the mask must be after text in (schema sc): every token checked on its own. */
static void mask_by_hand(const jc_schema *sc, const void *st, uint32_t *want)
{
    memset(want, 0, (size_t)VOC.words * sizeof *want);
    const size_t size = jc_state_size(sc);
    void *tmp = malloc(size);
    assert_non_null(tmp);
    for (int64_t t = 0; t < VOC.n_vocab; t++) {
        bool ok;
        if (bit(VOC.eog, t)) {
            ok = jc_done(sc, st);
        } else if (t >= tok_n_vocab(TOK) || tok_type_of(TOK, (int32_t)t) != TOK_TYPE_NORMAL) {
            ok = false;
        } else {
            const tok_str b = tok_bytes_of(TOK, (int32_t)t);
            jc_state_copy(sc, tmp, st);
            ok = b.len > 0 && jc_feed(sc, tmp, (const uint8_t *)b.ptr, b.len);
        }
        if (ok)
            want[t / 32] |= 1u << (t % 32);
    }
    free(tmp);
}

static void expect_same_mask(const uint32_t *got, const uint32_t *want, const char *what)
{
    for (int64_t t = 0; t < VOC.n_vocab; t++)
        if (bit(got, t) != bit(want, t))
            fail_msg("%s: token %lld is %s, expected %s", what, (long long)t,
                     bit(got, t) ? "allowed" : "refused", bit(want, t) ? "allowed" : "refused");
}

/* The state's mask against the by-hand one after each prefix of texts. */
static void check_masks(msg_format format, const char *schema, const char *const *texts,
                        size_t n_texts)
{
    cst_cfg cfg = {.format = format, .schema = schema, .n_schema = schema ? strlen(schema) : 0,
                   .think_start = -1, .think_end = -1};
    const size_t W = (size_t)VOC.words;
    uint32_t *got = malloc(W * 4), *want = malloc(W * 4);
    int allowed_min = 1 << 30;
    for (size_t k = 0; k < n_texts; k++) {
        cst_state c;
        assert_int_equal(cst_init(&c, &cfg, &VOC, 4), TD_OK);
        int32_t ids[256];
        const int64_t n = spell(texts[k], ids);
        assert_int_equal(cst_emit(&c, ids, n), TD_OK);
        assert_int_equal(cst_mask(&c, got), TD_OK);
        mask_by_hand(c.schema, c.cur, want);
        expect_same_mask(got, want, texts[k]);
        /* twice: the second comes from the memo */
        assert_int_equal(cst_mask(&c, got), TD_OK);
        expect_same_mask(got, want, texts[k]);
        int allowed = 0;
        for (int64_t t = 0; t < VOC.n_vocab; t++)
            allowed += bit(want, t);
        allowed_min = allowed < allowed_min ? allowed : allowed_min;
        cst_free(&c, NULL);
    }
    assert_true(allowed_min >= 1);
    free(got);
    free(want);
}

static void test_masks_equal_a_check_of_every_token(void **ctx)
{
    (void)ctx;
    const char *const obj[] = {"", " ", "{", "{\"", "{\"ke", "{\"key\":", "{\"key\": \"va",
                               "{\"key\": \"va\\", "{\"key\": \"v\\u00", "{\"k\":[1, -0.",
                               "{\"k\":{}", "{\"k\":{}}", "{\"k\":tr", "{\"k\":{\"a\":[\"x\"]"};
    check_masks(MSG_FORMAT_JSON_OBJECT, NULL, obj, sizeof obj / sizeof *obj);
    const char *const sch[] = {"", "{", "{\"", "{\"n", "{\"name\"", "{\"name\": \"ab",
                               "{\"name\": \"abcdefghijk", "{\"name\": \"x\", \"", "{\"age\": 4",
                               "{\"age\": -", "{\"age\": 1", "{\"age\": 15", "{\"age\": 0",
                               "{\"age\": 4, \"name\": \"\", \"tags\": [", "{\"age\": 4, \"name\": "
                               "\"\", \"tags\": [\"a\", nu", "{\"age\":1,\"name\":\"\"}",
                               "{\"name\":\"\",\"age\":1,\"note\":\"", "{\"name\":\"\",\"age\":1,"
                               "\"note\":\"\xe4\xbd"};
    check_masks(MSG_FORMAT_JSON_SCHEMA, SCHEMA, sch, sizeof sch / sizeof *sch);
}

static void test_block_rows_follow_their_drafts_and_stop_at_a_refused_one(void **ctx)
{
    (void)ctx;
    cst_cfg cfg = {.format = MSG_FORMAT_JSON_OBJECT, .think_start = -1, .think_end = -1};
    cst_state c;
    assert_int_equal(cst_init(&c, &cfg, &VOC, 8), TD_OK);
    int32_t ids[16];
    const int64_t n = spell("{\"a\":}", ids);
    /* '{' '"' 'a' '"' ':' are fine, '}' right after ':' is not */
    assert_int_equal(cst_allowed(&c, ids, n), 5);
    assert_int_equal(cst_allowed(&c, ids, 3), 3);
    int32_t bad = id_of_bytes("x");
    assert_int_equal(cst_allowed(&c, &bad, 1), 0);
    /* rows 0..4 masked after drafts 0..i-1, on the backend, against one state at a time */
    const int64_t V = VOC.n_vocab, W = VOC.words;
    float *lg = malloc((size_t)(5 * V) * sizeof *lg);
    for (int64_t i = 0; i < 5 * V; i++)
        lg[i] = 0.5f;
    assert_int_equal(cst_apply(&c, ops_backend_cpu(), lg, ids, 5), TD_OK);
    uint32_t *want = malloc((size_t)W * 4);
    for (int64_t r = 0; r < 5; r++) {
        cst_state one;
        assert_int_equal(cst_init(&one, &cfg, &VOC, 1), TD_OK);
        assert_int_equal(cst_emit(&one, ids, r), TD_OK);
        assert_int_equal(cst_mask(&one, want), TD_OK);
        for (int64_t t = 0; t < V; t++)
            if ((lg[r * V + t] == 0.5f) != bit(want, t))
                fail_msg("row %lld token %lld", (long long)r, (long long)t);
        cst_free(&one, NULL);
    }
    /* emitting a refused token is an error and changes nothing */
    assert_int_equal(cst_emit(&c, ids, 5), TD_OK);
    assert_int_equal(cst_emit(&c, &ids[5], 1), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "does not continue the response format"));
    int32_t one = id_of_bytes("1");
    assert_int_equal(cst_allowed(&c, &one, 1), 1);
    free(want);
    free(lg);
    cst_free(&c, ops_backend_cpu());
}

static void test_reasoning_stays_free_until_its_end_token(void **ctx)
{
    (void)ctx;
    const int32_t open = id_of_bytes("a"), close = id_of_bytes("b"); /* stand-ins */
    const int32_t brace = id_of_bytes("{"), x = id_of_bytes("x");
    int32_t eog = -1;
    for (int64_t t = 0; t < VOC.n_vocab && eog < 0; t++)
        if (bit(VOC.eog, t))
            eog = (int32_t)t;
    assert_true(eog >= 0);
    const size_t W = (size_t)VOC.words;
    uint32_t *m = malloc(W * 4);
    /* the prompt left the block open: anything but the end of generation, then the document */
    cst_cfg cfg = {.format = MSG_FORMAT_JSON_OBJECT, .think_open = true, .think_start = open,
                   .think_end = close};
    cst_state c;
    assert_int_equal(cst_init(&c, &cfg, &VOC, 4), TD_OK);
    assert_int_equal(cst_mask(&c, m), TD_OK);
    assert_true(bit(m, x) && bit(m, brace) && bit(m, close) && !bit(m, eog));
    const int32_t think[] = {x, x, close};
    assert_int_equal(cst_allowed(&c, think, 3), 3);
    assert_int_equal(cst_emit(&c, think, 3), TD_OK);
    assert_int_equal(cst_mask(&c, m), TD_OK);
    assert_true(!bit(m, x) && bit(m, brace) && !bit(m, close));
    cst_free(&c, NULL);
    /* the output may open one itself, first */
    cfg.think_open = false;
    assert_int_equal(cst_init(&c, &cfg, &VOC, 4), TD_OK);
    assert_int_equal(cst_mask(&c, m), TD_OK);
    assert_true(bit(m, open) && bit(m, brace) && !bit(m, x) && !bit(m, close));
    const int32_t late[] = {brace, open};
    assert_int_equal(cst_allowed(&c, late, 2), 1);
    const int32_t early[] = {open, x, close, brace};
    assert_int_equal(cst_allowed(&c, early, 4), 4);
    cst_free(&c, NULL);
    /* a complete document: only the end of generation (and whitespace) */
    cfg = (cst_cfg){.format = MSG_FORMAT_JSON_OBJECT, .think_start = -1, .think_end = -1};
    assert_int_equal(cst_init(&c, &cfg, &VOC, 4), TD_OK);
    int32_t ids[8];
    const int64_t n = spell("{}", ids);
    assert_int_equal(cst_emit(&c, ids, n), TD_OK);
    assert_int_equal(cst_mask(&c, m), TD_OK);
    assert_true(bit(m, eog) && !bit(m, brace) && bit(m, id_of_bytes(" ")));
    assert_int_equal(cst_emit(&c, &eog, 1), TD_OK);
    assert_int_equal(cst_mask(&c, m), TD_OK);
    for (int64_t t = 0; t < VOC.n_vocab; t++)
        assert_int_equal(bit(m, t), bit(VOC.eog, t));
    cst_free(&c, NULL);
    free(m);
}

/* The tool-call format: the answer opens with <tool_call> (after a reasoning block), the end
 * of generation waits for </tool_call>, then anything goes; speculative greedy equals plain. */
static void test_a_required_tool_call_opens_the_answer(void **ctx)
{
    (void)ctx;
    const int32_t open = tok_id_of(TOK, "<tool_call>", 11), close = tok_id_of(TOK, "</tool_call>", 12);
    const int32_t think = tok_id_of(TOK, "<think>", 7), unthink = tok_id_of(TOK, "</think>", 8);
    const int32_t x = id_of_bytes("x");
    int32_t eog = -1;
    for (int64_t t = 0; t < VOC.n_vocab && eog < 0; t++)
        if (bit(VOC.eog, t))
            eog = (int32_t)t;
    assert_true(open >= 0 && close >= 0 && think >= 0 && unthink >= 0 && eog >= 0);
    assert_int_equal(VOC.call_open, open);
    assert_int_equal(VOC.call_close, close);
    const size_t W = (size_t)VOC.words;
    uint32_t *m = malloc(W * 4);
    cst_cfg cfg = {.format = MSG_FORMAT_TOOL_CALL, .think_start = think, .think_end = unthink};
    cst_state c;
    assert_int_equal(cst_init(&c, &cfg, &VOC, 4), TD_OK);
    assert_int_equal(cst_mask(&c, m), TD_OK);
    int n_set = 0;
    for (int64_t t = 0; t < VOC.n_vocab; t++)
        n_set += bit(m, t);
    assert_true(n_set == 2 && bit(m, open) && bit(m, think));
    const int32_t direct[] = {open, x, eog};
    assert_int_equal(cst_allowed(&c, direct, 3), 2);
    const int32_t thought[] = {think, x, eog};
    assert_int_equal(cst_allowed(&c, thought, 3), 2);
    const int32_t full[] = {think, x, unthink, open, x, close, x, eog};
    assert_int_equal(cst_allowed(&c, full, 8), 8);
    assert_int_equal(cst_allowed(&c, &x, 1), 0);
    assert_int_equal(cst_emit(&c, full, 4), TD_OK); /* inside the call */
    assert_int_equal(cst_mask(&c, m), TD_OK);
    for (int64_t t = 0; t < VOC.n_vocab; t++)
        assert_int_equal(bit(m, t), !bit(VOC.eog, t));
    assert_int_equal(cst_emit(&c, full + 4, 2), TD_OK); /* after it */
    assert_int_equal(cst_mask(&c, m), TD_OK);
    for (int64_t t = 0; t < VOC.n_vocab; t++)
        assert_true(bit(m, t));
    cst_free(&c, NULL);
    free(m);

    /* generation: the first token is the opener, speculative equals plain */
    cfg.think_start = cfg.think_end = -1;
    dfl_model *dm;
    char dir[160];
    snprintf(dir, sizeof dir, "%s/t", tmpdir);
    assert_int_equal(mf_drafter_make(&dm, dir, TM, &(mf_drafter){16, 2, false, 5, true}, 901),
                     TD_OK);
    for (int p = 0; p < 3; p++) {
        const int32_t prompt[4] = {15 + p, 279, 20, 33};
        int32_t plain[32], spec[32];
        spec_cfg sc = {.n_ctx = 256, .block = 1, .cst = cfg, .vocab = &VOC};
        assert_int_equal(mf_generate(TM, &sc, prompt, 4, 32, plain, NULL), TD_OK);
        sc.dm = dm;
        assert_int_equal(mf_generate(TM, &sc, prompt, 4, 32, spec, NULL), TD_OK);
        assert_int_equal(plain[0], open);
        assert_memory_equal(plain, spec, sizeof plain);
        bool closed = false;
        for (int i = 1; i < 32; i++) {
            assert_true(closed || !bit(VOC.eog, plain[i]));
            closed = closed || plain[i] == close;
        }
    }
    dfl_free(dm);
}

static const char TOOLS[] =
    "{\"form\":\"xml\",\"tools\":[{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\",\"enum\":[\"Paris\",\"Rome\"]},\"days\":"
    "{\"type\":\"integer\",\"minimum\":1,\"maximum\":14}},\"required\":[\"city\"]}},"
    "{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}]}";

/* The same functions in the JSON form (get_time takes no other keys). */
static const char TOOLS_JSON[] =
    "{\"form\":\"json\",\"tools\":[{\"name\":\"get_weather\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"enum\":[\"Paris\",\"Rome\"]},"
    "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14}},\"required\":[\"city\"]}},"
    "{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\",\"properties\":{},"
    "\"additionalProperties\":false}}]}";

/* Free text inside calls: a string parameter, and any parameter of a function without
 * properties. */
static const char FREE_TOOLS[] =
    "{\"form\":\"xml\",\"tools\":[{\"name\":\"note\",\"parameters\":{\"properties\":{"
    "\"text\":{\"type\":\"string\"},\"short\":{\"type\":\"string\",\"maxLength\":3}}}},"
    "{\"name\":\"echo\"}]}";

/* What the mask must be inside a call body (matcher state st): every token checked alone. */
static void call_mask_by_hand(const cm_grammar *g, const void *st, uint32_t *want)
{
    memset(want, 0, (size_t)VOC.words * sizeof *want);
    void *tmp = malloc(cm_state_size(g));
    assert_non_null(tmp);
    for (int64_t t = 0; t < VOC.n_vocab; t++) {
        bool ok = false;
        if (t == VOC.call_close) {
            ok = cm_done(g, st);
        } else if (t < tok_n_vocab(TOK) && tok_type_of(TOK, (int32_t)t) == TOK_TYPE_NORMAL) {
            const tok_str b = tok_bytes_of(TOK, (int32_t)t);
            cm_state_copy(g, tmp, st);
            ok = b.len > 0 && cm_feed(g, tmp, (const uint8_t *)b.ptr, b.len);
        }
        if (ok)
            want[t / 32] |= 1u << (t % 32);
    }
    free(tmp);
}

/* A tool spec: inside the call only what continues a call of a declared function with valid
 * arguments (each mask equal to a check of every token), "</tool_call>" once the body is
 * whole; generations in either form (speculative equal to plain) write calls the gateway
 * parses into a declared function with arguments its schema accepts. */
static void test_a_tool_spec_makes_the_call_valid(void **ctx)
{
    (void)ctx;
    const int32_t open = VOC.call_open, close = VOC.call_close, x = id_of_bytes("x");
    cst_cfg cfg = {.format = MSG_FORMAT_TOOL_CALL, .schema = TOOLS, .n_schema = strlen(TOOLS),
                   .think_start = -1, .think_end = -1};
    const size_t W = (size_t)VOC.words;
    uint32_t *got = malloc(W * 4), *want = malloc(W * 4);
    static const char *const bodies[] = {
        "", "\n<function=get_", "\n<function=get_weather>\n<parameter=city>\nPa",
        "\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=days>\n1",
        "\n<function=get_time>\n</function>\n",
    };
    for (size_t k = 0; k < sizeof bodies / sizeof bodies[0]; k++) {
        cst_state c;
        assert_int_equal(cst_init(&c, &cfg, &VOC, 4), TD_OK);
        int32_t ids[256];
        ids[0] = open;
        const int64_t n = 1 + spell(bodies[k], ids + 1);
        assert_int_equal(cst_emit(&c, ids, n), TD_OK);
        assert_int_equal(cst_mask(&c, got), TD_OK);
        call_mask_by_hand(c.call, c.cur, want);
        expect_same_mask(got, want, bodies[k]);
        assert_int_equal(bit(got, close), k == 4);
        assert_int_equal(cst_mask(&c, got), TD_OK); /* from the memo */
        expect_same_mask(got, want, bodies[k]);
        /* a block stops at the first refused draft */
        int32_t more[3] = {x, x, x};
        if (k == 2) {
            spell("rX", more);
            assert_int_equal(cst_allowed(&c, more, 2), 1);
        } else if (k == 4) {
            more[0] = close;
            assert_int_equal(cst_allowed(&c, more, 3), 3); /* free after the call */
        }
        cst_free(&c, NULL);
    }
    /* free text: the plain tokens without '<' are taken without a walk, and the masks are
     * still the check of every token (also after a held newline or '<', and where a
     * maxLength counts) */
    cst_cfg free_cfg = cfg;
    free_cfg.schema = FREE_TOOLS;
    free_cfg.n_schema = strlen(FREE_TOOLS);
    static const char *const free_bodies[] = {
        "<function=note>\n<parameter=text>\nsome words", "<function=note>\n<parameter=text>\na\n",
        "<function=note>\n<parameter=text>\na </par", "<function=note>\n<parameter=short>\nab",
        "<function=echo>\n<parameter=anything>\nfree \"text\"",
    };
    for (size_t k = 0; k < sizeof free_bodies / sizeof free_bodies[0]; k++) {
        cst_state c;
        assert_int_equal(cst_init(&c, &free_cfg, &VOC, 4), TD_OK);
        int32_t ids[256];
        ids[0] = open;
        const int64_t n = 1 + spell(free_bodies[k], ids + 1);
        assert_int_equal(cst_emit(&c, ids, n), TD_OK);
        assert_int_equal(cm_free_text(c.call, c.cur), k == 0 || k == 4);
        assert_int_equal(cst_mask(&c, got), TD_OK);
        call_mask_by_hand(c.call, c.cur, want);
        expect_same_mask(got, want, free_bodies[k]);
        cst_free(&c, NULL);
    }
    free(got);
    free(want);

    dfl_model *dm;
    char dir[160];
    snprintf(dir, sizeof dir, "%s/c", tmpdir);
    assert_int_equal(mf_drafter_make(&dm, dir, TM, &(mf_drafter){16, 2, false, 5, true}, 902),
                     TD_OK);
    json_t *tools = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
        "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":"
        "\"integer\"}}}}}]", 0, NULL);
    int calls = 0, weather = 0;
    for (int p = 0; p < 8; p++) { /* the XML form, then the JSON one */
        enum { N = 96 };
        const int32_t prompt[4] = {15 + p % 4, 279, 20, 33};
        int32_t plain[N], spec[N];
        cst_cfg fc = cfg;
        if (p >= 4) {
            fc.schema = TOOLS_JSON;
            fc.n_schema = strlen(TOOLS_JSON);
        }
        spec_cfg sc = {.n_ctx = 256, .block = 1, .cst = fc, .vocab = &VOC};
        assert_int_equal(mf_generate(TM, &sc, prompt, 4, N, plain, NULL), TD_OK);
        sc.dm = dm;
        assert_int_equal(mf_generate(TM, &sc, prompt, 4, N, spec, NULL), TD_OK);
        assert_memory_equal(plain, spec, sizeof plain);
        assert_int_equal(plain[0], open);
        int end = 1;
        while (end < N && plain[end] != close)
            end++;
        tok_bytes text = {0};
        assert_int_equal(tok_decode(TOK, plain + 1, (size_t)(end - 1), 0, &text), TD_OK);
        if (end == N) { /* still inside the call: the beginning of a valid one */
            cm_grammar *g;
            assert_int_equal(cm_compile(fc.schema, fc.n_schema, &g), TD_OK);
            uint8_t *st = malloc(cm_state_size(g));
            cm_state_init(g, st);
            assert_true(cm_feed(g, st, (const uint8_t *)text.ptr, text.len));
            free(st);
            cm_free(g);
            tok_bytes_free(&text);
            continue;
        }
        tool_call call;
        assert_int_equal(tool_parse(text.ptr, text.len, tools, &call), TD_OK);
        json_t *args = json_loads(call.arguments, 0, NULL);
        assert_non_null(args);
        if (strcmp(call.name, "get_weather") == 0) {
            const char *city = json_string_value(json_object_get(args, "city"));
            assert_true(city && (strcmp(city, "Paris") == 0 || strcmp(city, "Rome") == 0));
            const json_t *days = json_object_get(args, "days");
            assert_true(!days || (json_is_integer(days) && json_integer_value(days) >= 1 &&
                                  json_integer_value(days) <= 14));
            weather++;
        } else {
            assert_string_equal(call.name, "get_time");
            assert_int_equal(json_object_size(args), 0);
        }
        json_decref(args);
        tool_call_free(&call);
        tok_bytes_free(&text);
        calls++;
    }
    assert_true(calls >= 3 && weather >= 1); /* the random model seldom ends a JSON one */
    json_decref(tools);
    dfl_free(dm);
}

/* The tools format (tool_choice "auto"): no mask outside calls (the logits untouched), each
 * call the model opens matched from its start, again after the previous one closed; forced
 * into calls by a logit bias, generations (speculative equal to plain) write only calls the
 * gateway parses into declared functions with valid arguments. */
static void test_calls_the_model_opens_are_matched(void **ctx)
{
    (void)ctx;
    const int32_t open = VOC.call_open, close = VOC.call_close, x = id_of_bytes("x");
    cst_cfg cfg = {.format = MSG_FORMAT_TOOLS, .schema = TOOLS, .n_schema = strlen(TOOLS),
                   .think_start = -1, .think_end = -1};
    const size_t W = (size_t)VOC.words;
    const int64_t V = VOC.n_vocab;
    uint32_t *got = malloc(W * 4), *want = malloc(W * 4);
    float *lg = malloc((size_t)(2 * V) * sizeof *lg);
    const ops_backend *be = ops_backend_cpu();
    cst_state c;
    assert_int_equal(cst_init(&c, &cfg, &VOC, 4), TD_OK);
    for (int64_t i = 0; i < 2 * V; i++)
        lg[i] = 1.0f;
    const int32_t text[2] = {x, x};
    assert_int_equal(cst_apply(&c, be, lg, text, 2), TD_OK);
    for (int64_t i = 0; i < 2 * V; i++)
        assert_true(lg[i] == 1.0f);
    assert_int_equal(cst_emit(&c, text, 2), TD_OK);
    for (int round = 0; round < 2; round++) {
        int32_t ids[256];
        ids[0] = open;
        const int64_t n = 1 + spell("\n<function=get_weather>\n<parameter=city>\nRo", ids + 1);
        assert_int_equal(cst_emit(&c, ids, 1), TD_OK);
        assert_int_equal(cst_mask(&c, got), TD_OK);
        call_mask_by_hand(c.call, c.cur, want);
        expect_same_mask(got, want, "a call's start");
        assert_int_equal(cst_emit(&c, ids + 1, n - 1), TD_OK);
        assert_int_equal(cst_mask(&c, got), TD_OK);
        call_mask_by_hand(c.call, c.cur, want);
        expect_same_mask(got, want, "a call's city");
        const int32_t bad = id_of_bytes("X");
        assert_int_equal(cst_allowed(&c, &bad, 1), 0);
        const int64_t m = spell("me\n</parameter>\n</function>\n", ids);
        ids[m] = close;
        ids[m + 1] = x;
        assert_int_equal(cst_emit(&c, ids, m + 2), TD_OK);
        assert_int_equal(cst_mask(&c, got), TD_OK);
        for (int64_t t = 0; t < V; t++)
            assert_true(bit(got, t));
    }
    cst_free(&c, be);

    dfl_model *dm;
    char dir[160];
    snprintf(dir, sizeof dir, "%s/a", tmpdir);
    assert_int_equal(mf_drafter_make(&dm, dir, TM, &(mf_drafter){16, 2, false, 5, true}, 903),
                     TD_OK);
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                               "\"parameters\":{\"properties\":{\"city\":{\"type\":\"string\"},"
                               "\"days\":{\"type\":\"integer\"}}}}}]",
                               0, NULL);
    const float push = 30.0f; /* the model opens calls wherever it may */
    int calls = 0;
    for (int p = 0; p < 3; p++) {
        enum { N = 160 };
        const int32_t prompt[4] = {40 + p, 279, 20, 33};
        int32_t plain[N], spec[N];
        spec_cfg sc = {.n_ctx = 256, .block = 1, .cst = cfg, .vocab = &VOC,
                       .pen = {.bias_tok = &open, .bias = &push, .n_bias = 1}};
        assert_int_equal(mf_generate(TM, &sc, prompt, 4, N, plain, NULL), TD_OK);
        sc.dm = dm;
        assert_int_equal(mf_generate(TM, &sc, prompt, 4, N, spec, NULL), TD_OK);
        assert_memory_equal(plain, spec, sizeof plain);
        for (int at = 0; at < N;) {
            assert_int_equal(plain[at], open);
            int end = at + 1;
            while (end < N && plain[end] != close)
                end++;
            if (end == N)
                break;
            tok_bytes body = {0};
            assert_int_equal(tok_decode(TOK, plain + at + 1, (size_t)(end - at - 1), 0, &body),
                             TD_OK);
            tool_call call;
            assert_int_equal(tool_parse(body.ptr, body.len, tools, &call), TD_OK);
            json_t *args = json_loads(call.arguments, 0, NULL);
            if (strcmp(call.name, "get_weather") == 0) {
                const char *city = json_string_value(json_object_get(args, "city"));
                assert_true(city && (strcmp(city, "Paris") == 0 || strcmp(city, "Rome") == 0));
            } else {
                assert_string_equal(call.name, "get_time");
            }
            json_decref(args);
            tool_call_free(&call);
            tok_bytes_free(&body);
            calls++;
            at = end + 1;
        }
    }
    assert_true(calls >= 4);
    json_decref(tools);
    dfl_free(dm);
    free(got);
    free(want);
    free(lg);
}

/* After text, the mask of a document callm matches (a choice, structural tags): what a check
 * of every token lets through, the end of generation where the document is whole (not the
 * call's end token). Returns whether it is whole there; got gets the mask. */
static bool doc_mask_after(const cst_cfg *cfg, const char *text, uint32_t *got, uint32_t *want)
{
    cst_state c;
    assert_int_equal(cst_init(&c, cfg, &VOC, 4), TD_OK);
    int32_t ids[64];
    const int64_t n = spell(text, ids);
    assert_int_equal(cst_emit(&c, ids, n), TD_OK);
    assert_int_equal(cst_mask(&c, got), TD_OK);
    call_mask_by_hand(c.call, c.cur, want);
    want[VOC.call_close / 32] &= ~(1u << (VOC.call_close % 32));
    const bool done = cm_done(c.call, c.cur);
    if (done)
        for (int64_t w = 0; w < VOC.words; w++)
            want[w] |= VOC.eog[w];
    expect_same_mask(got, want, text);
    cst_free(&c, NULL);
    return done;
}

/* A choice: the masks allow what goes on with one of the strings (the end of generation
 * once one is whole); generations write exactly one of them and end. */
static void test_a_choice_is_one_of_its_strings(void **ctx)
{
    (void)ctx;
    static const char SPEC[] = "{\"form\":\"choice\",\"choices\":[\"Paris\",\"Rome\",\"Par\","
                               "\"New York\"]}";
    cst_cfg cfg = {.format = MSG_FORMAT_CHOICE, .schema = SPEC, .n_schema = sizeof SPEC - 1,
                   .think_start = -1, .think_end = -1};
    const size_t W = (size_t)VOC.words;
    uint32_t *got = malloc(W * 4), *want = malloc(W * 4);
    static const char *const texts[] = {"", "Pa", "Par", "Paris", "New "};
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++)
        doc_mask_after(&cfg, texts[k], got, want);
    free(got);
    free(want);
    int ends = 0;
    for (int p = 0; p < 4; p++) {
        enum { N = 24 };
        const int32_t prompt[4] = {60 + p, 279, 20, 33};
        int32_t out[N];
        spec_cfg sc = {.n_ctx = 256, .block = 1, .cst = cfg, .vocab = &VOC};
        assert_int_equal(mf_generate(TM, &sc, prompt, 4, N, out, NULL), TD_OK);
        int end = 0;
        while (end < N && !bit(VOC.eog, out[end]))
            end++;
        tok_bytes text = {0};
        assert_int_equal(tok_decode(TOK, out, (size_t)end, 0, &text), TD_OK);
        const char *t = text.ptr ? text.ptr : "";
        assert_true(end < N);
        assert_true(strcmp(t, "Paris") == 0 || strcmp(t, "Rome") == 0 || strcmp(t, "Par") == 0 ||
                    strcmp(t, "New York") == 0);
        tok_bytes_free(&text);
        ends++;
    }
    assert_int_equal(ends, 4);
}

/* Structural tags: free text (every token, the end of generation too) until a trigger opens
 * a structure, whose begin, JSON and end the masks then hold to (each mask equal to a check of
 * every token); generations stay viable and are whole where they end. */
static void test_structural_tags_hold_what_their_triggers_open(void **ctx)
{
    (void)ctx;
    static const char SPEC[] =
        "{\"form\":\"tags\",\"triggers\":[\"<f=\"],\"structures\":["
        "{\"begin\":\"<f=w>\",\"schema\":{\"type\":\"object\",\"properties\":{\"c\":{\"enum\":"
        "[\"Paris\",\"Rome\"]}},\"required\":[\"c\"],\"additionalProperties\":false},"
        "\"end\":\"</f>\"},{\"begin\":\"<f=t>\",\"schema\":{\"type\":\"integer\"},\"end\":\"!\"}]}";
    cst_cfg cfg = {.format = MSG_FORMAT_TAGS, .schema = SPEC, .n_schema = sizeof SPEC - 1,
                   .think_start = -1, .think_end = -1};
    const size_t W = (size_t)VOC.words;
    uint32_t *got = malloc(W * 4), *want = malloc(W * 4);
    static const char *const texts[] = {"",           "hi <f",        "a <f=",
                                        "<f=w>{\"c\"", "<f=t>12",     "x <f=w>{\"c\": \"Rome\"}</",
                                        "<f=t>7! and", "<f=w>{\"c\":\"Paris\"}"};
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        /* free text lets every normal token through and the end of generation */
        const bool free_text = k == 0 || k == 1 || k == 6;
        assert_int_equal(doc_mask_after(&cfg, texts[k], got, want), free_text);
        int64_t eog = 0;
        while (!bit(VOC.eog, eog))
            eog++;
        assert_int_equal(bit(got, eog), free_text);
        if (free_text)
            assert_true(bit(got, id_of_bytes("x")) && bit(got, id_of_bytes("<")));
    }
    /* stop_after_first: after the first structure only the end of generation */
    static const char STOP[] = "{\"form\":\"tags\",\"triggers\":[\"<f=\"],\"structures\":["
                               "{\"begin\":\"<f=t>\",\"schema\":{\"type\":\"integer\"},"
                               "\"end\":\"!\"}],\"stop_after_first\":true}";
    cst_cfg stop = {.format = MSG_FORMAT_TAGS, .schema = STOP, .n_schema = sizeof STOP - 1,
                    .think_start = -1, .think_end = -1};
    cst_state c;
    assert_int_equal(cst_init(&c, &stop, &VOC, 4), TD_OK);
    int32_t ids[64];
    const int64_t n = spell("a <f=t>5!", ids);
    assert_int_equal(cst_emit(&c, ids, n), TD_OK);
    assert_int_equal(cst_mask(&c, got), TD_OK);
    expect_same_mask(got, VOC.eog, "after the first structure");
    cst_free(&c, NULL);
    free(got);
    free(want);
    /* generations: what they write the matcher takes, whole where they end */
    for (int p = 0; p < 4; p++) {
        enum { N = 32 };
        const int32_t prompt[4] = {70 + p, 279, 20, 33};
        int32_t out[N];
        spec_cfg sc = {.n_ctx = 256, .block = 1, .cst = cfg, .vocab = &VOC};
        assert_int_equal(mf_generate(TM, &sc, prompt, 4, N, out, NULL), TD_OK);
        cm_grammar *g = NULL;
        assert_int_equal(cm_compile(SPEC, sizeof SPEC - 1, &g), TD_OK);
        uint8_t *st = malloc(cm_state_size(g));
        cm_state_init(g, st);
        int end = 0;
        while (end < N && !bit(VOC.eog, out[end])) {
            const tok_str b = tok_bytes_of(TOK, out[end]);
            assert_true(cm_feed(g, st, (const uint8_t *)b.ptr, b.len));
            end++;
        }
        if (end < N)
            assert_true(cm_done(g, st));
        free(st);
        cm_free(g);
    }
}

/* What the mask must be after a grammar's text: every token checked on its own. */
static void gram_mask_by_hand(const gm_grammar *g, const void *st, uint32_t *want)
{
    memset(want, 0, (size_t)VOC.words * sizeof *want);
    void *tmp = malloc(gm_state_size(g));
    assert_non_null(tmp);
    for (int64_t t = 0; t < VOC.n_vocab; t++) {
        bool ok;
        if (bit(VOC.eog, t)) {
            ok = gm_done(g, st);
        } else if (t >= tok_n_vocab(TOK) || tok_type_of(TOK, (int32_t)t) != TOK_TYPE_NORMAL) {
            ok = false;
        } else {
            const tok_str b = tok_bytes_of(TOK, (int32_t)t);
            gm_state_copy(g, tmp, st);
            ok = b.len > 0 && gm_feed(g, tmp, (const uint8_t *)b.ptr, b.len);
        }
        if (ok)
            want[t / 32] |= 1u << (t % 32);
    }
    free(tmp);
}

/* A GBNF grammar and a regular expression: the masks after prefixes equal a check of every
 * token (the end of generation once the text is whole); greedy generations with and without
 * drafters are equal, and each is a viable prefix of a sentence, whole where it ended (every
 * one of the grammar's, whose sentences are short). */
static void test_a_grammar_or_a_regex_shapes_the_text(void **ctx)
{
    (void)ctx;
    static const char GBNF[] = "root ::= (\"yes\" | \"no\") (\" \" word){0,3} \".\"\n"
                               "word ::= [a-z]{1,5} | [0-9]{1,3}\n";
    static const char RE[] = "[A-Z][a-z]{2,6}( [0-9]+)?!";
    const cst_cfg fmts[2] = {
        {.format = MSG_FORMAT_GRAMMAR, .schema = GBNF, .n_schema = sizeof GBNF - 1,
         .think_start = -1, .think_end = -1},
        {.format = MSG_FORMAT_REGEX, .schema = RE, .n_schema = sizeof RE - 1, .think_start = -1,
         .think_end = -1},
    };
    static const char *const texts[2][5] = {{"", "y", "yes", "yes ab 12", "no x."},
                                            {"", "A", "Abc", "Abc 1", "Abcdefg 12!"}};
    const size_t W = (size_t)VOC.words;
    uint32_t *got = malloc(W * 4), *want = malloc(W * 4);
    const mf_drafter shapes[] = {{8, 1, false, 7, false}, {16, 2, false, 5, true}};
    dfl_model *dm[2];
    for (int k = 0; k < 2; k++) {
        char dir[160];
        snprintf(dir, sizeof dir, "%s/g%d", tmpdir, k);
        assert_int_equal(mf_drafter_make(&dm[k], dir, TM, &shapes[k], 710 + (uint64_t)k), TD_OK);
    }
    int ended[2] = {0, 0};
    for (int f = 0; f < 2; f++) {
        for (int k = 0; k < 5; k++) {
            cst_state c;
            assert_int_equal(cst_init(&c, &fmts[f], &VOC, 4), TD_OK);
            int32_t ids[64];
            const int64_t n = spell(texts[f][k], ids);
            assert_int_equal(cst_emit(&c, ids, n), TD_OK);
            assert_int_equal(cst_mask(&c, got), TD_OK);
            gram_mask_by_hand(c.gram, c.cur, want);
            expect_same_mask(got, want, texts[f][k]);
            int eog = 0, allowed = 0;
            for (int64_t t = 0; t < VOC.n_vocab; t++) {
                eog += bit(got, t) && bit(VOC.eog, t);
                allowed += bit(got, t);
            }
            assert_int_equal(eog > 0, k == 4); /* only the whole text may end */
            assert_true(allowed > 0);
            cst_free(&c, NULL);
        }
        for (int p = 0; p < 3; p++) {
            enum { N = 40 };
            const int32_t prompt[4] = {50 + 3 * p, 279, 20 + f, 33};
            int32_t plain[N], spec[N];
            spec_cfg cfg = {.n_ctx = 256, .block = 1, .cst = fmts[f], .vocab = &VOC};
            assert_int_equal(mf_generate(TM, &cfg, prompt, 4, N, plain, NULL), TD_OK);
            for (int k = 0; k < 2; k++) {
                cfg.dm = dm[k];
                assert_int_equal(mf_generate(TM, &cfg, prompt, 4, N, spec, NULL), TD_OK);
                if (memcmp(plain, spec, sizeof plain) != 0)
                    fail_msg("format %d prompt %d drafter %d: speculative differs from plain",
                             f, p, k);
            }
            cst_state c;
            assert_int_equal(cst_init(&c, &fmts[f], &VOC, 1), TD_OK);
            int64_t end = 0;
            while (end < N && !bit(VOC.eog, plain[end]))
                end++;
            for (int64_t i = 0; i < end; i++) {
                const tok_str b = tok_bytes_of(TOK, plain[i]);
                if (!gm_feed(c.gram, c.cur, (const uint8_t *)b.ptr, b.len))
                    fail_msg("format %d prompt %d: token %lld (%d) leaves the language", f, p,
                             (long long)i, plain[i]);
            }
            if (end < N) {
                assert_true(gm_done(c.gram, c.cur));
                ended[f]++;
            }
            cst_free(&c, NULL);
        }
    }
    for (int k = 0; k < 2; k++)
        dfl_free(dm[k]);
    free(got);
    free(want);
    printf("generations ending with a whole text: grammar %d of 3, regex %d of 3\n", ended[0],
           ended[1]);
    /* the grammar's sentences have at most 22 bytes: after them only the end is allowed */
    assert_int_equal(ended[0], 3);
    assert_true(ended[1] > 0);
}

/* Masks along whole texts, token by token, equal a check of every token, with the transition
 * cache as large as served and as small as 3 states (emptied again and again, most walks
 * finished byte by byte), for a JSON schema, a tool call's free text and a grammar; a mask
 * that runs out of time is an error, and leaves no partial mask in the memo. */
static void test_masks_stay_right_when_the_transition_cache_fills(void **ctx)
{
    (void)ctx;
    static const char GBNF[] = "root ::= [a-z ]{0,30} \"=\" [0-9]{1,12} \".\"";
    static const char XML[] = "{\"form\":\"xml\",\"tools\":[{\"name\":\"say\",\"parameters\":"
                              "{\"type\":\"object\",\"properties\":{\"text\":{\"type\":"
                              "\"string\"}}}}]}";
    const struct {
        cst_cfg cfg;
        const char *text;
    } cases[] = {
        {{.format = MSG_FORMAT_JSON_SCHEMA, .schema = SCHEMA, .n_schema = sizeof SCHEMA - 1,
          .think_start = -1, .think_end = -1},
         "{\"name\": \"Al Li\", \"age\": 7, \"tags\": [\"a\", \"bc\"]}"},
        {{.format = MSG_FORMAT_GRAMMAR, .schema = GBNF, .n_schema = sizeof GBNF - 1,
          .think_start = -1, .think_end = -1},
         "the sum of it all =1234567."},
        {{.format = MSG_FORMAT_TOOL_CALL, .schema = XML, .n_schema = sizeof XML - 1,
          .think_start = -1, .think_end = -1},
         "\n<function=say>\n<parameter=text>\nsome words here\n</parameter>\n</function>\n"},
    };
    const size_t W = (size_t)VOC.words;
    uint32_t *got = malloc(W * 4), *want = malloc(W * 4);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int small = 0; small < 2; small++) {
            cst_state c;
            assert_int_equal(cst_init(&c, &cases[k].cfg, &VOC, 4), TD_OK);
            if (small)
                c.dfa.cap = 3;
            if (cases[k].cfg.format == MSG_FORMAT_TOOL_CALL)
                assert_int_equal(cst_emit(&c, &VOC.call_open, 1), TD_OK);
            int32_t ids[256];
            const int64_t n = spell(cases[k].text, ids);
            for (int64_t i = 0; i <= n; i++) {
                assert_int_equal(cst_mask(&c, got), TD_OK);
                if (c.schema)
                    mask_by_hand(c.schema, c.cur, want);
                else if (c.gram)
                    gram_mask_by_hand(c.gram, c.cur, want);
                else
                    call_mask_by_hand(c.call, c.cur, want);
                char what[80];
                snprintf(what, sizeof what, "case %zu, cache %s, after %lld bytes", k,
                         small ? "small" : "served", (long long)i);
                if (cases[k].cfg.format == MSG_FORMAT_TOOL_CALL) /* the call's end, by hand */
                    want[VOC.call_close / 32] = (want[VOC.call_close / 32] &
                                                 ~(1u << (VOC.call_close % 32))) |
                                                (uint32_t)bit(got, VOC.call_close)
                                                    << (VOC.call_close % 32);
                expect_same_mask(got, want, what);
                if (i < n && cst_emit(&c, &ids[i], 1) != TD_OK)
                    fail_msg("%s: %s", what, err_msg());
            }
            assert_true(small ? c.dfa.n <= 3 : c.dfa.n > 3);
            cst_free(&c, NULL);
        }
    /* a mask past its time budget fails with the reason; the next one is whole */
    cst_state c;
    assert_int_equal(cst_init(&c, &cases[1].cfg, &VOC, 4), TD_OK);
    c.budget_s = 0;
    assert_int_equal(cst_mask(&c, got), TD_ENOTSUP);
    assert_string_equal(err_msg(), "structured output: one token mask took more than 0 s (the "
                        "format is too costly to match on this vocabulary)");
    c.budget_s = CST_MASK_BUDGET_S;
    assert_int_equal(cst_mask(&c, got), TD_OK);
    gram_mask_by_hand(c.gram, c.cur, want);
    expect_same_mask(got, want, "after a mask ran out of time");
    cst_free(&c, NULL);
    free(got);
    free(want);
}

static void test_bad_formats_are_refused(void **ctx)
{
    (void)ctx;
    cst_state c;
    cst_cfg cfg = {.format = MSG_FORMAT_JSON_SCHEMA, .schema = "{\"type\":\"strin\"}",
                   .n_schema = 16, .think_start = -1, .think_end = -1};
    assert_int_equal(cst_init(&c, &cfg, &VOC, 4), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "strin"));
    cfg = (cst_cfg){.format = MSG_FORMAT_JSON_OBJECT, .think_start = -1, .think_end = -1};
    assert_int_equal(cst_init(&c, &cfg, NULL, 4), TD_ENOTSUP);
    assert_non_null(strstr(err_msg(), "tokenizer"));
    cfg.think_end = (int32_t)VOC.n_vocab;
    assert_int_equal(cst_init(&c, &cfg, &VOC, 4), TD_EINVAL);
    cfg.think_end = -1;
    cfg.think_open = true;
    assert_int_equal(cst_init(&c, &cfg, &VOC, 4), TD_EINVAL);
    /* text: nothing to do, no vocabulary needed */
    cfg = (cst_cfg){.format = MSG_FORMAT_TEXT};
    assert_int_equal(cst_init(&c, &cfg, NULL, 4), TD_OK);
    assert_false(c.on);
    assert_int_equal(cst_allowed(&c, NULL, 3), 3);
    cst_free(&c, NULL);
}

/* --- generation ----------------------------------------------------------------------------- */

/* Plain greedy decoding with each row masked by hand (a token-by-token check). */
static void reference(const cst_cfg *cfg, const int32_t *prompt, int64_t n_prompt, int64_t n,
                      int32_t *out)
{
    const int64_t nv = TM->hp.n_vocab;
    tgt_state st;
    assert_int_equal(tgt_state_init(&st, TM, 256), TD_OK);
    float *lg = malloc((size_t)nv * sizeof *lg);
    uint32_t *m = malloc((size_t)VOC.words * 4);
    cst_state c;
    assert_int_equal(cst_init(&c, cfg, &VOC, 1), TD_OK);
    tgt_out o = {.logits = lg, .last_only = true};
    assert_int_equal(tgt_forward(TM, &st, prompt, n_prompt, false, &o), TD_OK);
    for (int64_t k = 0; k < n; k++) {
        if (c.phase == CST_DOC || c.phase == CST_OPEN)
            mask_by_hand(c.schema, c.cur, m);
        else
            assert_int_equal(cst_mask(&c, m), TD_OK);
        for (int64_t t = 0; t < nv; t++)
            if (!bit(m, t))
                lg[t] = -INFINITY;
        out[k] = (int32_t)cpu_argmax(lg, nv);
        if (cst_emit(&c, &out[k], 1) != TD_OK)
            fail_msg("token %lld: %d: %s", (long long)k, out[k], err_msg());
        assert_int_equal(tgt_forward(TM, &st, &out[k], 1, false, &o), TD_OK);
    }
    cst_free(&c, NULL);
    tgt_state_free(&st);
    free(m);
    free(lg);
}

/* out [n] is a viable prefix (complete when an end-of-generation token came; nothing after). */
static void expect_viable(const cst_cfg *cfg, const int32_t *out, int64_t n, const char *what)
{
    jc_schema *sc;
    assert_int_equal(jc_compile(cfg->schema, cfg->n_schema, &sc), TD_OK);
    void *st = malloc(jc_state_size(sc));
    jc_state_init(sc, st);
    for (int64_t i = 0; i < n; i++) {
        if (bit(VOC.eog, out[i])) {
            if (!jc_done(sc, st))
                fail_msg("%s: ended at token %lld before the document was complete", what,
                         (long long)i);
            for (int64_t j = i + 1; j < n; j++)
                assert_true(bit(VOC.eog, out[j]));
            break;
        }
        const tok_str b = tok_bytes_of(TOK, out[i]);
        if (!jc_feed(sc, st, (const uint8_t *)b.ptr, b.len))
            fail_msg("%s: token %lld (%d) breaks the document", what, (long long)i, out[i]);
    }
    free(st);
    jc_schema_free(sc);
}

static void test_speculative_greedy_with_a_format_equals_plain_decoding(void **ctx)
{
    (void)ctx;
    const mf_drafter shapes[] = {{8, 1, false, 7, false}, {16, 2, false, 5, true}};
    dfl_model *dm[2];
    for (int k = 0; k < 2; k++) {
        char dir[160];
        snprintf(dir, sizeof dir, "%s/d%d", tmpdir, k);
        assert_int_equal(mf_drafter_make(&dm[k], dir, TM, &shapes[k], 700 + (uint64_t)k), TD_OK);
    }
    const cst_cfg fmts[] = {
        {.format = MSG_FORMAT_JSON_OBJECT, .think_start = -1, .think_end = -1},
        {.format = MSG_FORMAT_JSON_SCHEMA, .schema = SCHEMA, .n_schema = sizeof SCHEMA - 1,
         .think_start = -1, .think_end = -1},
    };
    const int64_t n = 40;
    for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++)
        for (int p = 0; p < 3; p++) {
            const int32_t prompt[5] = {10 + 7 * p, 20, 279, 40 + p, 279};
            int32_t ref[64], plain[64], spec[64];
            reference(&fmts[f], prompt, 5, n, ref);
            expect_viable(&fmts[f], ref, n, "reference");
            spec_cfg cfg = {.n_ctx = 256, .block = 1, .cst = fmts[f], .vocab = &VOC};
            assert_int_equal(mf_generate(TM, &cfg, prompt, 5, n, plain, NULL), TD_OK);
            for (int k = 0; k < 2; k++) {
                cfg.dm = dm[k];
                assert_int_equal(mf_generate(TM, &cfg, prompt, 5, n, spec, NULL), TD_OK);
                for (int64_t i = 0; i < n; i++)
                    if (ref[i] != plain[i] || ref[i] != spec[i])
                        fail_msg("format %zu prompt %d drafter %d token %lld: by hand %d, plain "
                                 "%d, speculative %d", f, p, k, (long long)i, ref[i], plain[i],
                                 spec[i]);
            }
            cfg.dm = NULL;
        }
    for (int k = 0; k < 2; k++)
        dfl_free(dm[k]);
}

/* Blocks drafted elsewhere (spec_verify): drafts equal to the masked greedy answer are all
 * accepted, a wrong draft the format allows stops acceptance there, and a draft the format
 * refuses cuts the block before it (it is never run through the target). */
static void test_verify_blocks_through_the_masks(void **ctx)
{
    (void)ctx;
    const cst_cfg fmt = {.format = MSG_FORMAT_JSON_SCHEMA, .schema = SCHEMA,
                         .n_schema = sizeof SCHEMA - 1, .think_start = -1, .think_end = -1};
    const int32_t prompt[4] = {12, 279, 33, 20};
    int32_t ref[48];
    reference(&fmt, prompt, 4, 48, ref);
    spec_cfg cfg = {.n_ctx = 256, .block = 6, .cst = fmt, .vocab = &VOC};
    spec_seq s;
    assert_int_equal(spec_init_cfg(&s, TM, &cfg), TD_OK);
    int32_t first;
    assert_int_equal(spec_prefill(&s, prompt, 4, &first), TD_OK);
    assert_int_equal(first, ref[0]);
    const int32_t refused = id_of_bytes("\x01"), wrong_ok = id_of_bytes(" ");
    assert_true(refused >= 0 && wrong_ok >= 0);
    int cut_by_wrong = 0, cut_by_format = 0;
    int64_t at = 1; /* ref[0..at) are emitted, ref[at - 1] pending */
    int32_t block[6], out[6];
    for (int round = 0; at + 6 < 48; round++) {
        block[0] = ref[at - 1];
        for (int i = 1; i < 6; i++)
            block[i] = ref[at - 1 + i];
        const int kind = round % 3; /* 0: right drafts, 1: a wrong allowed one, 2: a refused one */
        int j = 3;
        if (kind == 1 && wrong_ok != ref[at - 1 + j]) {
            block[j] = wrong_ok;
            /* only a wrong draft the format allows after the right ones is a test of it */
            cst_state c;
            assert_int_equal(cst_init(&c, &fmt, &VOC, 1), TD_OK);
            assert_int_equal(cst_emit(&c, ref, at - 1 + j), TD_OK);
            if (cst_allowed(&c, &wrong_ok, 1) != 1)
                block[j] = ref[at - 1 + j];
            cst_free(&c, NULL);
        }
        if (kind == 2)
            block[j] = refused;
        const int64_t drafted = s.stats.drafted;
        int64_t n_out;
        assert_int_equal(spec_verify(&s, block, 6, NULL, out, &n_out), TD_OK);
        const bool wrong = block[j] != ref[at - 1 + j];
        assert_int_equal(n_out, wrong ? j : 6);
        assert_int_equal(s.stats.drafted - drafted, kind == 2 ? j - 1 : 5);
        for (int64_t i = 0; i < n_out; i++)
            assert_int_equal(out[i], ref[at + i]);
        cut_by_wrong += kind == 1 && wrong;
        cut_by_format += kind == 2;
        at += n_out;
    }
    assert_true(cut_by_wrong >= 2 && cut_by_format >= 2);
    spec_free(&s);
}

static void test_sampled_output_keeps_the_format(void **ctx)
{
    (void)ctx;
    const mf_drafter shape = {16, 2, false, 5, true};
    dfl_model *dm;
    char dir[160];
    snprintf(dir, sizeof dir, "%s/s", tmpdir);
    assert_int_equal(mf_drafter_make(&dm, dir, TM, &shape, 900), TD_OK);
    const cst_cfg fmt = {.format = MSG_FORMAT_JSON_SCHEMA, .schema = SCHEMA,
                         .n_schema = sizeof SCHEMA - 1, .think_start = -1, .think_end = -1};
    for (uint64_t seed = 1; seed <= 6; seed++) {
        const int32_t prompt[3] = {(int32_t)(30 + seed), 279, 20};
        spec_cfg cfg = {.dm = seed % 2 ? dm : NULL, .n_ctx = 256, .block = 1,
                        .sampler = {.temperature = 1.0f, .seed = seed}, .cst = fmt,
                        .vocab = &VOC};
        int32_t out[64];
        if (mf_generate(TM, &cfg, prompt, 3, 48, out, NULL) != TD_OK)
            fail_msg("seed %llu: %s", (unsigned long long)seed, err_msg());
        char what[32];
        snprintf(what, sizeof what, "seed %llu", (unsigned long long)seed);
        expect_viable(&fmt, out, 48, what);
    }
    dfl_free(dm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_masks_equal_a_check_of_every_token),
        cmocka_unit_test(test_block_rows_follow_their_drafts_and_stop_at_a_refused_one),
        cmocka_unit_test(test_reasoning_stays_free_until_its_end_token),
        cmocka_unit_test(test_a_required_tool_call_opens_the_answer),
        cmocka_unit_test(test_a_tool_spec_makes_the_call_valid),
        cmocka_unit_test(test_calls_the_model_opens_are_matched),
        cmocka_unit_test(test_a_choice_is_one_of_its_strings),
        cmocka_unit_test(test_a_grammar_or_a_regex_shapes_the_text),
        cmocka_unit_test(test_masks_stay_right_when_the_transition_cache_fills),
        cmocka_unit_test(test_structural_tags_hold_what_their_triggers_open),
        cmocka_unit_test(test_bad_formats_are_refused),
        cmocka_unit_test(test_speculative_greedy_with_a_format_equals_plain_decoding),
        cmocka_unit_test(test_verify_blocks_through_the_masks),
        cmocka_unit_test(test_sampled_output_keeps_the_format),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
