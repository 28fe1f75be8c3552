/* tandem generate: text generation in one process, with the speculative loop when a drafter
 * is given; tandem logits: the target's top tokens per position (a check for people). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli_file.h"
#include "cli/cli_ids.h"
#include "cli/cmd.h"
#include "common/args.h"
#include "common/devarg.h"
#include "common/tokenizer.h"
#include "verifyd/spec.h"

/* The demo pair scripts/train/finish.sh writes (relative to the working directory): the model
 * when --model is not given, and its drafter when the model is that default too (a drafter is
 * trained for one target). */
#define GEN_DEMO_MODEL "models/demo/demo.gguf"
#define GEN_DEMO_DRAFT "models/demo/drafter"

static bool gen_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Parses "1,2,3" into a malloc'd array of at least one id. */
static td_err gen_parse_ids(const char *text, int32_t **ids, int64_t *n)
{
    tok_ids v = {0};
    td_err e = cli_parse_ids(text, strlen(text), &v);
    if (e == TD_OK && v.n == 0)
        e = err_set(TD_EINVAL, "token ids: none given");
    if (e != TD_OK) {
        tok_ids_free(&v);
        return e;
    }
    *ids = v.ids;
    *n = (int64_t)v.n;
    return TD_OK;
}

#define GEN_BIAS_MAX 1024

/* --logit-bias "ID=BIAS,ID=BIAS,...": token ids and their biases (each in [-100, 100]). */
static td_err gen_parse_bias(const char *text, int32_t *tok, float *bias, int32_t *n)
{
    *n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        const long id = strtol(p, &end, 10);
        if (end == p || *end != '=' || errno || id < 0 || id > INT32_MAX)
            return err_set(TD_EINVAL, "--logit-bias: expected ID=BIAS at \"%.20s\"", p);
        p = end + 1;
        const double v = strtod(p, &end);
        if (end == p || (*end && *end != ',') || !(v >= -100 && v <= 100))
            return err_set(TD_EINVAL, "--logit-bias: token %ld: expected a bias from -100 to 100 "
                           "at \"%.20s\"", id, p);
        if (*n == GEN_BIAS_MAX)
            return err_set(TD_EINVAL, "--logit-bias: at most %d entries", GEN_BIAS_MAX);
        tok[*n] = (int32_t)id;
        bias[*n] = (float)v;
        (*n)++;
        p = *end ? end + 1 : end;
    }
    return TD_OK;
}

/* --device: "cpu", "cuda" (device 0) or "cuda:N". *be is the CPU backend or a new CUDA
 * backend the caller frees with ops_backend_cuda_free. */
static td_err gen_backend(const char *text, const ops_backend **be, ops_backend **owned)
{
    *owned = NULL;
    *be = ops_backend_cpu();
    int dev = -1;
    TD_TRY(devarg_parse(text, &dev));
    if (dev < 0)
        return TD_OK;
    TD_TRY(ops_backend_cuda_init(owned, dev));
    *be = *owned;
    return TD_OK;
}

static int gen_fail(const char *cmd, const char *what)
{
    fprintf(stderr, "tandem %s: %s%s%s\n", cmd, what, *err_msg() ? ": " : "", err_msg());
    return 1;
}

/* Writes newly generated ids as text (through the streaming decoder) or as ids. */
static void gen_emit(tok_stream *ts, bool ids, const int32_t *tok, int64_t n, bool *first)
{
    if (ids) {
        for (int64_t i = 0; i < n; i++) {
            printf("%s%d", *first ? "" : ",", tok[i]);
            *first = false;
        }
        return;
    }
    tok_bytes b = {0};
    if (tok_stream_push(ts, tok, (size_t)n, &b) == TD_OK)
        fwrite(b.ptr, 1, b.len, stdout);
    tok_bytes_free(&b);
    fflush(stdout);
}

int cmd_generate(int argc, char **argv)
{
    const char *model = NULL, *draft = NULL, *prompt = NULL, *prompt_ids = NULL;
    const char *device = "cpu";
    int64_t n_max = 64, n_ctx = 4096, top_k = 0, seed = 0, ring = 4096;
    double temp = 0.0, top_p = 1.0, min_p = 0.0, presence = 0.0, frequency = 0.0;
    double repetition = 1.0;
    int64_t min_tokens = 0, draft_max = 0;
    const char *logit_bias = NULL, *json_schema = NULL;
    bool ids = false, ignore_eos = false, help = false, json = false, draft_auto = false;
    const args_opt opts[] = {
        {"model", ARGS_STRING, &model, "TANDEM_MODEL", "target GGUF file (" GEN_DEMO_MODEL " when it exists)", 0, 0, 'm'},
        {"draft", ARGS_STRING, &draft, "TANDEM_DRAFT", "DFlash drafter folder, speculative decoding (" GEN_DEMO_DRAFT " with that model; \"\" for none)", 0, 0, 0},
        {"prompt", ARGS_STRING, &prompt, NULL, "prompt text", 0, 0, 'p'},
        {"prompt-ids", ARGS_STRING, &prompt_ids, NULL, "prompt as comma-separated token ids", 0, 0, 0},
        {"max-tokens", ARGS_INT, &n_max, NULL, "tokens to generate", 1, 1 << 24, 'n'},
        {"ctx", ARGS_INT, &n_ctx, NULL, "context size in positions", 2, INT32_MAX / 2, 0},
        {"ring", ARGS_INT, &ring, NULL, "drafter context window (feature ring slots)", 1, INT32_MAX / 4, 0},
        {"draft-max", ARGS_INT, &draft_max, "TANDEM_DRAFT_MAX", "drafts a step verifies at most (0: the drafter's whole block)", 0, SPEC_MAX_BLOCK - 1, 0},
        {"draft-auto", ARGS_FLAG, &draft_auto, "TANDEM_DRAFT_AUTO", "each step verifies as many drafts (up to --draft-max) as give the most tokens per second by measured cost and acceptance, none where drafting does not pay", 0, 0, 0},
        {"temp", ARGS_DOUBLE, &temp, NULL, "sampling temperature (0 = greedy)", 0, 0, 0},
        {"top-k", ARGS_INT, &top_k, NULL, "keep the k most likely tokens (0 = off)", 0, INT32_MAX, 0},
        {"top-p", ARGS_DOUBLE, &top_p, NULL, "nucleus mass (1 = off)", 0, 0, 0},
        {"min-p", ARGS_DOUBLE, &min_p, NULL, "minimum probability relative to the best (0 = off)", 0, 0, 0},
        {"seed", ARGS_INT, &seed, NULL, "sampling seed", 0, INT64_MAX, 0},
        {"presence-penalty", ARGS_DOUBLE, &presence, NULL, "subtracted from the logit of a token generated before (-2..2)", 0, 0, 0},
        {"frequency-penalty", ARGS_DOUBLE, &frequency, NULL, "and this much per time it was generated (-2..2)", 0, 0, 0},
        {"repetition-penalty", ARGS_DOUBLE, &repetition, NULL, "divides a positive logit of a prompt or generated token, multiplies a negative one (1 = off, up to 10)", 0, 0, 0},
        {"min-tokens", ARGS_INT, &min_tokens, NULL, "no end-of-generation token before this many tokens", 0, INT32_MAX, 0},
        {"logit-bias", ARGS_STRING, &logit_bias, NULL, "biases added to token logits: ID=BIAS,ID=BIAS,... (-100..100)", 0, 0, 0},
        {"json", ARGS_FLAG, &json, NULL, "the output is one JSON object (response_format json_object)", 0, 0, 0},
        {"json-schema", ARGS_STRING, &json_schema, NULL, "the output is one JSON value valid under the JSON Schema in this file", 0, 0, 0},
        {"ids", ARGS_FLAG, &ids, NULL, "print generated token ids instead of text", 0, 0, 0},
        {"ignore-eos", ARGS_FLAG, &ignore_eos, NULL, "do not stop at end-of-generation tokens", 0, 0, 0},
        {"device", ARGS_STRING, &device, "TANDEM_DEVICE", "where target, drafter and acceptance run: cpu, cuda or cuda:N", 0, 0, 0},
        ARGS_END,
    };
    static const char usage[] =
        "tandem generate [--model M.gguf] [--draft DIR] (--prompt TEXT | --prompt-ids 1,2,3) "
        "[-n N] [--temp T --seed S] [--presence-penalty P] [--frequency-penalty F] "
        "[--repetition-penalty R] [--min-tokens N] [--logit-bias ID=B,...] "
        "[--json | --json-schema FILE] [--device cpu|cuda[:N]]";
    if (args_parse(argc, argv, 1, opts, NULL, 0, NULL, &help) != TD_OK) {
        fprintf(stderr, "tandem generate: %s\n", err_msg());
        args_usage(usage, opts);
        return 2;
    }
    if (help) {
        args_usage(usage, opts);
        return 0;
    }
    if (!model && gen_exists(GEN_DEMO_MODEL)) {
        model = GEN_DEMO_MODEL;
        if (!draft && gen_exists(GEN_DEMO_DRAFT "/config.json"))
            draft = GEN_DEMO_DRAFT;
    }
    if (draft && !*draft)
        draft = NULL;
    if (!model) {
        fprintf(stderr, "tandem generate: give --model (the default %s is not here; "
                "scripts/train/finish.sh makes it)\n", GEN_DEMO_MODEL);
        args_usage(usage, opts);
        return 2;
    }
    if (!prompt == !prompt_ids) {
        fprintf(stderr, "tandem generate: give one of --prompt, --prompt-ids\n");
        args_usage(usage, opts);
        return 2;
    }
    if (temp < 0 || top_p < 0 || min_p < 0) {
        fprintf(stderr, "tandem generate: --temp, --top-p and --min-p must not be negative\n");
        return 2;
    }
    if (!(repetition > 0 && repetition <= 10)) {
        fprintf(stderr, "tandem generate: --repetition-penalty must be in (0, 10]\n");
        return 2;
    }
    if (!(fabs(presence) <= 2) || !(fabs(frequency) <= 2)) {
        fprintf(stderr, "tandem generate: --presence-penalty and --frequency-penalty must be "
                        "from -2 to 2\n");
        return 2;
    }
    static int32_t bias_tok[GEN_BIAS_MAX];
    static float bias[GEN_BIAS_MAX];
    int32_t n_bias = 0;
    if (logit_bias && gen_parse_bias(logit_bias, bias_tok, bias, &n_bias) != TD_OK) {
        fprintf(stderr, "tandem generate: %s\n", err_msg());
        return 2;
    }

    tgt_model *tm = NULL;
    dfl_model *dm = NULL;
    tokenizer *tok = NULL;
    cst_vocab vocab = {0};
    char *schema = NULL;
    size_t n_schema = 0;
    int32_t *pids = NULL;
    int64_t n_prompt = 0;
    int rc = 1;
    spec_seq seq;
    bool seq_ok = false;
    const ops_backend *be;
    ops_backend *cuda_be = NULL;
    if (gen_backend(device, &be, &cuda_be) != TD_OK) {
        rc = gen_fail("generate", "cannot open the device");
        goto out;
    }
    if (tgt_load_on(&tm, model, be) != TD_OK) {
        rc = gen_fail("generate", "cannot load the model");
        goto out;
    }
    if (tok_load_gguf(&tok, tm->file) != TD_OK) {
        rc = gen_fail("generate", "cannot load the tokenizer");
        goto out;
    }
    if (json_schema && cli_read_file(json_schema, &schema, &n_schema) != TD_OK) {
        rc = gen_fail("generate", "cannot read --json-schema");
        goto out;
    }
    if ((json || json_schema) && cst_vocab_init(&vocab, tok, tm->hp.n_vocab) != TD_OK) {
        rc = gen_fail("generate", "cannot prepare the vocabulary for --json");
        goto out;
    }
    if (draft && dfl_load_on(&dm, draft, (uint32_t)tm->hp.n_layer, &tm->tok_embd, &tm->output,
                             be) != TD_OK) {
        rc = gen_fail("generate", "cannot load the drafter");
        goto out;
    }
    if (prompt_ids) {
        if (gen_parse_ids(prompt_ids, &pids, &n_prompt) != TD_OK) {
            rc = gen_fail("generate", "bad --prompt-ids");
            goto out;
        }
    } else {
        tok_ids v = {0};
        if (tok_encode(tok, prompt, strlen(prompt), TOK_ENC_ADD_SPECIAL, &v) != TD_OK) {
            rc = gen_fail("generate", "cannot tokenize the prompt");
            goto out;
        }
        pids = v.ids;
        n_prompt = (int64_t)v.n;
    }
    const tok_specials *sp = tok_specials_of(tok);
    const int32_t eog[2] = {sp->eos, sp->eot}; /* what ends the generation below */
    ops_sampler sampler = {
        .temperature = (float)temp, .top_k = (int32_t)top_k, .top_p = (float)top_p,
        .min_p = (float)min_p, .seed = (uint64_t)seed,
    };
    const spec_cfg cfg = {
        .dm = dm, .n_ctx = n_ctx, .ring = ring, .block = 1, .draft_max = draft_max,
        .draft_auto = draft_auto, .sampler = sampler,
        .pen = {.presence = (float)presence, .frequency = (float)frequency,
                .bias_tok = bias_tok, .bias = bias, .n_bias = n_bias,
                .repetition = (float)repetition, .min_tokens = (int32_t)min_tokens,
                .stop = eog, .n_stop = ignore_eos ? 0 : 2},
        .cst = {.format = json_schema ? MSG_FORMAT_JSON_SCHEMA
                          : json      ? MSG_FORMAT_JSON_OBJECT
                                      : MSG_FORMAT_TEXT,
                .schema = schema, .n_schema = n_schema, .think_start = -1, .think_end = -1},
        .vocab = &vocab,
    };
    if (spec_init_cfg(&seq, tm, &cfg) != TD_OK) {
        rc = gen_fail("generate", "cannot set up the sequence");
        goto out;
    }
    seq_ok = true;

    tok_stream ts;
    tok_stream_init(&ts, tok, 0);
    bool first = true;
    int32_t out[SPEC_MAX_BLOCK];
    int64_t n_out = 0, n_gen = 0;
    if (spec_prefill(&seq, pids, n_prompt, &out[0]) != TD_OK) {
        rc = gen_fail("generate", "prefill failed");
        goto out;
    }
    n_out = 1;
    for (;;) {
        /* Tokens after a stop token inside an accepted run are discarded. */
        int64_t keep = 0;
        bool stop = false;
        while (keep < n_out && n_gen + keep < n_max) {
            bool eog = !ignore_eos && tok_is_eog(tok, out[keep]);
            keep++;
            if (eog) {
                stop = true;
                break;
            }
        }
        gen_emit(&ts, ids, out, keep, &first);
        n_gen += keep;
        if (stop || n_gen >= n_max || spec_room(&seq) < 1)
            break;
        if (spec_step(&seq, out, &n_out) != TD_OK) {
            rc = gen_fail("generate", "generation failed");
            goto out;
        }
    }
    if (!ids) {
        tok_bytes b = {0};
        if (tok_stream_flush(&ts, &b) == TD_OK)
            fwrite(b.ptr, 1, b.len, stdout);
        tok_bytes_free(&b);
    }
    printf("\n");
    fflush(stdout);
    const spec_stats *st = &seq.stats;
    double t_gen = st->t_draft + st->t_verify;
    fprintf(stderr,
            "prompt %lld tokens, prefill %.3f s (%.1f tok/s); generated %lld tokens in %.3f s "
            "(%.2f tok/s); steps %lld, acceptance length %.2f, draft %.3f s, verify %.3f s\n",
            (long long)n_prompt, st->t_prefill, st->t_prefill > 0 ? n_prompt / st->t_prefill : 0,
            (long long)n_gen, t_gen, t_gen > 0 ? (n_gen - 1) / t_gen : 0, (long long)st->steps,
            st->steps ? (double)(st->generated - 1) / (double)st->steps : 0, st->t_draft,
            st->t_verify);
    rc = 0;
out:
    if (seq_ok)
        spec_free(&seq);
    free(pids);
    free(schema);
    cst_vocab_free(&vocab);
    tok_free(tok);
    dfl_free(dm);
    tgt_free(tm);
    ops_backend_cuda_free(cuda_be);
    return rc;
}

int cmd_logits(int argc, char **argv)
{
    const char *model = NULL, *tokens = NULL;
    int64_t top = 5;
    bool help = false;
    const args_opt opts[] = {
        {"model", ARGS_STRING, &model, "TANDEM_MODEL", "target GGUF file", 0, 0, 'm'},
        {"tokens", ARGS_STRING, &tokens, NULL, "comma-separated token ids", 0, 0, 0},
        {"top", ARGS_INT, &top, NULL, "tokens shown per position", 1, 1000, 0},
        ARGS_END,
    };
    static const char usage[] = "tandem logits --model M.gguf --tokens 1,2,3 [--top K]";
    if (args_parse(argc, argv, 1, opts, NULL, 0, NULL, &help) != TD_OK) {
        fprintf(stderr, "tandem logits: %s\n", err_msg());
        args_usage(usage, opts);
        return 2;
    }
    if (help) {
        args_usage(usage, opts);
        return 0;
    }
    if (!model || !tokens) {
        fprintf(stderr, "tandem logits: give --model and --tokens\n");
        return 2;
    }
    tgt_model *tm = NULL;
    int32_t *ids = NULL, *idx = NULL;
    float *logits = NULL, *val = NULL;
    int64_t n = 0;
    tgt_state st = {0};
    int rc = 1;
    if (gen_parse_ids(tokens, &ids, &n) != TD_OK) {
        rc = gen_fail("logits", "bad --tokens");
        goto out;
    }
    if (tgt_load(&tm, model) != TD_OK) {
        rc = gen_fail("logits", "cannot load the model");
        goto out;
    }
    int64_t V = tm->hp.n_vocab;
    if (top > V)
        top = V;
    logits = malloc((size_t)(n * V) * sizeof(float));
    idx = malloc((size_t)top * sizeof(int32_t));
    val = malloc((size_t)top * sizeof(float));
    if (!logits || !idx || !val || tgt_state_init(&st, tm, n) != TD_OK) {
        rc = gen_fail("logits", "out of memory");
        goto out;
    }
    tgt_out o = {.logits = logits};
    if (tgt_forward(tm, &st, ids, n, false, &o) != TD_OK) {
        rc = gen_fail("logits", "forward pass failed");
        goto out;
    }
    for (int64_t t = 0; t < n; t++) {
        cpu_topk(idx, val, logits + t * V, V, top);
        printf("%lld:", (long long)t);
        for (int64_t j = 0; j < top; j++)
            printf(" %d(%.4f)", idx[j], val[j]);
        printf("\n");
    }
    rc = 0;
out:
    tgt_state_free(&st);
    free(ids);
    free(idx);
    free(val);
    free(logits);
    tgt_free(tm);
    return rc;
}
