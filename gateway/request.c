#include "gateway/request.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/request_int.h"

const char *req_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown value";
}

td_err req_bad_type(api_error *e, const char *param, const char *expected, const json_t *v)
{
    return apierr_set(e, 400, "invalid_type", param,
                      "Invalid type for '%s': expected %s, but got %s instead.", param, expected,
                      req_type_name(v));
}

td_err req_load_json(const char *body, size_t len, json_t **root, api_error *e)
{
    json_error_t je;
    *root = NULL;
    json_t *v = json_loadb(body, len, 0, &je);
    if (!v)
        return apierr_set(e, 400, "invalid_json", NULL,
                          "The request body is not valid JSON: %s (line %d, column %d).", je.text,
                          je.line, je.column);
    if (!json_is_object(v)) {
        td_err r = apierr_set(e, 400, "invalid_json", NULL,
                              "The request body must be a JSON object, but got %s instead.",
                              req_type_name(v));
        json_decref(v);
        return r;
    }
    *root = v;
    return TD_OK;
}

/* --- typed fields: absent or null keeps the default -------------------------------------- */

const json_t *req_field(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

td_err req_bool(const json_t *obj, const char *key, const char *param, bool *out,
                api_error *e)
{
    const json_t *v = req_field(obj, key);
    if (!v)
        return TD_OK;
    if (!json_is_boolean(v))
        return req_bad_type(e, param, "a boolean", v);
    *out = json_is_true(v);
    return TD_OK;
}

/* Integers, and numbers with an integral value (2.0) as JavaScript clients send them. */
td_err req_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
               bool *given, api_error *e)
{
    const json_t *v = req_field(obj, key);
    if (given)
        *given = v != NULL;
    if (!v)
        return TD_OK;
    int64_t x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (int64_t)json_real_value(v);
    } else {
        return req_bad_type(e, key, "an integer", v);
    }
    if (x < lo || x > hi)
        return apierr_set(e, 400, "invalid_value", key,
                          "Invalid value for '%s': expected an integer from %lld to %lld, but got "
                          "%lld instead.",
                          key, (long long)lo, (long long)hi, (long long)x);
    *out = x;
    return TD_OK;
}

/* A number in [lo, hi], or in (lo, hi] when lo_open. */
td_err req_number(const json_t *obj, const char *key, double lo, bool lo_open, double hi,
                  double *out, api_error *e)
{
    const json_t *v = req_field(obj, key);
    if (!v)
        return TD_OK;
    if (!json_is_number(v))
        return req_bad_type(e, key, "a number", v);
    double x = json_number_value(v);
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
        return apierr_set(e, 400, "invalid_value", key,
                          "Invalid value for '%s': expected a number in %c%g, %g], but got %g "
                          "instead.",
                          key, lo_open ? '(' : '[', lo, hi, x);
    *out = x;
    return TD_OK;
}

/* A JSON integer in [0, max] (a token id), into *out. */
bool req_token_id(const json_t *v, json_int_t max, uint32_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max)
        return false;
    *out = (uint32_t)json_integer_value(v);
    return true;
}

/* --- completions ---------------------------------------------------------------------------- */

static td_err req_prompt_ids(req_prompt *pr, const json_t *arr, const char *param, api_error *e)
{
    size_t n = json_array_size(arr);
    pr->ids = malloc((n ? n : 1) * sizeof *pr->ids);
    if (!pr->ids)
        return apierr_set(e, 500, NULL, NULL, "out of memory");
    size_t i;
    const json_t *v;
    json_array_foreach(arr, i, v) {
        uint32_t id;
        if (!req_token_id(v, INT32_MAX, &id)) {
            char p[APIERR_PARAM_MAX];
            snprintf(p, sizeof p, "%s[%zu]", param, i);
            return apierr_set(e, 400, "invalid_value", p,
                              "Invalid value for '%s': expected a token id (a non-negative "
                              "integer).",
                              p);
        }
        pr->ids[i] = (int32_t)id;
    }
    pr->n_ids = n;
    return TD_OK;
}

/* One prompt: a string or an array of token ids (param names it in errors). */
static td_err req_one_prompt(req_prompt *pr, const json_t *p, const char *param, api_error *e)
{
    if (json_is_string(p)) {
        pr->text = json_string_value(p);
        pr->len = json_string_length(p);
    } else if (json_is_array(p)) {
        TD_TRY(req_prompt_ids(pr, p, param, e));
    } else {
        return req_bad_type(e, param, "a string or an array of token ids", p);
    }
    if (pr->text ? pr->len == 0 : pr->n_ids == 0)
        return apierr_set(e, 400, "invalid_value", param,
                          "Invalid value for '%s': the prompt is empty.", param);
    return TD_OK;
}

static td_err req_completion(gw_request *r, api_error *e)
{
    const json_t *p = json_object_get(r->root, "prompt");
    if (!p || json_is_null(p))
        return apierr_set(e, 400, "missing_required_parameter", "prompt",
                          "Missing required parameter: 'prompt'.");
    /* A string, an array of token ids, or a batch: an array of strings and id arrays. */
    const json_t *first = json_array_get(p, 0);
    const bool batch = json_is_array(p) && (json_is_string(first) || json_is_array(first));
    size_t n = batch ? json_array_size(p) : 1;
    if (n > REQ_PROMPTS_MAX)
        return apierr_set(e, 400, "invalid_value", "prompt",
                          "Invalid value for 'prompt': at most %d prompts per request are "
                          "supported, got %zu.",
                          REQ_PROMPTS_MAX, n);
    if (!(r->prompts = calloc(n, sizeof *r->prompts)))
        return apierr_set(e, 500, NULL, NULL, "out of memory");
    r->n_prompts = n;
    for (size_t i = 0; i < n; i++) {
        char param[APIERR_PARAM_MAX] = "prompt";
        if (batch)
            snprintf(param, sizeof param, "prompt[%zu]", i);
        TD_TRY(req_one_prompt(&r->prompts[i], batch ? json_array_get(p, i) : p, param, e));
    }

    TD_TRY(req_bool(r->root, "echo", "echo", &r->echo, e));
    /* The legacy completions API generates 16 tokens unless told otherwise; with echo, 0
     * scores the prompt alone. */
    r->max_tokens = 16;
    TD_TRY(req_int(r->root, "max_tokens", r->echo ? 0 : 1, INT32_MAX, &r->max_tokens, NULL, e));
    int64_t lp = 0;
    bool given = false;
    TD_TRY(req_int(r->root, "logprobs", 0, REQ_TOP_LOGPROBS_MAX, &lp, &given, e));
    r->logprobs = given;
    r->top_logprobs = (uint32_t)lp;
    const json_t *suffix = req_field(r->root, "suffix");
    if (suffix && (!json_is_string(suffix) || json_string_length(suffix) > 0))
        return apierr_set(e, 400, "unsupported_value", "suffix",
                          "Unsupported value for 'suffix': insertion is not supported.");
    int64_t best_of = 0;
    TD_TRY(req_int(r->root, "best_of", 1, REQ_N_MAX, &best_of, NULL, e));
    r->best_of = (uint32_t)best_of;
    return TD_OK;
}

/* best_of against n and stream, once both are read: at least n candidates (n when absent),
 * and a stream cannot show candidates that are only ranked at the end. */
static td_err req_best_of(gw_request *r, api_error *e)
{
    if (r->best_of == 0)
        r->best_of = r->n;
    if (r->best_of < r->n)
        return apierr_set(e, 400, "invalid_value", "best_of",
                          "Invalid value for 'best_of': it must be at least n (%u), but got %u.",
                          r->n, r->best_of);
    if (r->n_prompts * r->best_of > REQ_GENERATIONS_MAX)
        return apierr_set(e, 400, "invalid_value", "prompt",
                          "Invalid value for 'prompt': %zu prompts of %u candidates each make "
                          "more than the %d generations a request may have.",
                          r->n_prompts, r->best_of, REQ_GENERATIONS_MAX);
    if (r->stream && r->best_of > r->n)
        return apierr_set(e, 400, "invalid_value", "best_of",
                          "Invalid value for 'best_of': a stream cannot rank %u candidates to "
                          "send %u; stream with best_of equal to n.",
                          r->best_of, r->n);
    return TD_OK;
}

/* --- fields both endpoints share ------------------------------------------------------------- */

size_t req_leading_space(const char *s, size_t n)
{
    size_t k = 0;
    while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n' || s[k] == '\r'))
        k++;
    return k;
}

/* bad_words (vLLM's): strings, each tokenized later (gen_bad_words). */
static td_err req_bad_words(gw_request *r, api_error *e)
{
    const json_t *b = req_field(r->root, "bad_words");
    if (!b)
        return TD_OK;
    if (!json_is_array(b))
        return req_bad_type(e, "bad_words", "an array of strings", b);
    if (json_array_size(b) > REQ_BAD_WORDS_MAX)
        return apierr_set(e, 400, "invalid_value", "bad_words",
                          "Invalid value for 'bad_words': at most %d words are supported, got "
                          "%zu.",
                          REQ_BAD_WORDS_MAX, json_array_size(b));
    size_t i;
    const json_t *v;
    json_array_foreach(b, i, v) {
        char param[APIERR_PARAM_MAX];
        snprintf(param, sizeof param, "bad_words[%zu]", i);
        if (!json_is_string(v))
            return req_bad_type(e, param, "a string", v);
        const char *w = json_string_value(v);
        const size_t n = json_string_length(v);
        if (req_leading_space(w, n) == n || n > REQ_BAD_WORD_LEN_MAX || memchr(w, 0, n))
            return apierr_set(e, 400, "invalid_value", param,
                              "Invalid value for '%s': a bad word is 1 to %d bytes of text "
                              "(besides leading whitespace), without NUL characters.",
                              param, REQ_BAD_WORD_LEN_MAX);
    }
    r->bad_words = json_array_size(b) ? b : NULL;
    return TD_OK;
}

static td_err req_stop(gw_request *r, api_error *e)
{
    const json_t *s = req_field(r->root, "stop");
    if (!s)
        return TD_OK;
    if (json_is_string(s)) {
        if (json_string_length(s) > REQ_STOP_LEN_MAX)
            return apierr_set(e, 400, "invalid_value", "stop",
                              "Invalid value for 'stop': a stop string may be at most %d bytes.",
                              REQ_STOP_LEN_MAX);
        if (json_string_length(s) > 0) {
            r->stop[0] = json_string_value(s);
            r->stop_len[0] = json_string_length(s);
            r->n_stop = 1;
        }
        return TD_OK;
    }
    if (!json_is_array(s))
        return req_bad_type(e, "stop", "a string or an array of strings", s);
    if (json_array_size(s) > REQ_STOP_MAX)
        return apierr_set(e, 400, "invalid_value", "stop",
                          "Invalid value for 'stop': at most %d stop strings are supported, got "
                          "%zu.",
                          REQ_STOP_MAX, json_array_size(s));
    size_t i;
    const json_t *v;
    json_array_foreach(s, i, v) {
        char param[APIERR_PARAM_MAX];
        snprintf(param, sizeof param, "stop[%zu]", i);
        if (!json_is_string(v))
            return req_bad_type(e, param, "a string", v);
        if (json_string_length(v) > REQ_STOP_LEN_MAX)
            return apierr_set(e, 400, "invalid_value", param,
                              "Invalid value for '%s': a stop string may be at most %d bytes.",
                              param, REQ_STOP_LEN_MAX);
        /* An empty stop string would end every generation before its first token. */
        if (json_string_length(v) == 0)
            continue;
        r->stop[r->n_stop] = json_string_value(v);
        r->stop_len[r->n_stop] = json_string_length(v);
        r->n_stop++;
    }
    return TD_OK;
}

/* logit_bias: {"token id": bias, ...}, a bias in [-100, 100], at most REQ_BIAS_MAX entries;
 * keys are decimal token ids (checked against the vocabulary when the prompt is made), and
 * one id written twice ("7", "07") is refused. */
static td_err req_logit_bias(gw_request *r, api_error *e)
{
    const json_t *lb = req_field(r->root, "logit_bias");
    if (!lb)
        return TD_OK;
    if (!json_is_object(lb))
        return req_bad_type(e, "logit_bias", "an object", lb);
    const size_t n = json_object_size(lb);
    if (n > REQ_BIAS_MAX)
        return apierr_set(e, 400, "invalid_value", "logit_bias",
                          "Invalid value for 'logit_bias': at most %d entries, but got %zu.",
                          REQ_BIAS_MAX, n);
    if (n == 0)
        return TD_OK;
    r->bias_tok = malloc(n * sizeof *r->bias_tok);
    r->bias = malloc(n * sizeof *r->bias);
    if (!r->bias_tok || !r->bias)
        return apierr_set(e, 500, NULL, NULL, "out of memory for 'logit_bias'");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)lb, key, v) {
        uint64_t id = 0;
        size_t len = strlen(key);
        bool ok = len >= 1 && len <= 10;
        for (size_t i = 0; ok && i < len; i++) {
            ok = key[i] >= '0' && key[i] <= '9';
            id = id * 10 + (uint64_t)(key[i] - '0');
        }
        if (!ok || id > UINT32_MAX)
            return apierr_set(e, 400, "invalid_value", "logit_bias",
                              "Invalid key in 'logit_bias': keys must be token ids (decimal "
                              "integers).");
        if (!json_is_number(v))
            return req_bad_type(e, "logit_bias", "numbers as values", v);
        const double x = json_number_value(v);
        if (!(x >= -100 && x <= 100))
            return apierr_set(e, 400, "invalid_value", "logit_bias",
                              "Invalid value for 'logit_bias': the bias of token %llu must be "
                              "from -100 to 100, but got %g instead.",
                              (unsigned long long)id, x);
        for (size_t j = 0; j < r->n_bias; j++)
            if (r->bias_tok[j] == id)
                return apierr_set(e, 400, "invalid_value", "logit_bias",
                                  "Invalid value for 'logit_bias': token %llu appears twice.",
                                  (unsigned long long)id);
        r->bias_tok[r->n_bias] = (uint32_t)id;
        r->bias[r->n_bias] = (float)x;
        r->n_bias++;
    }
    return TD_OK;
}

/* stop_token_ids: at most REQ_STOP_IDS_MAX token ids (checked against the vocabulary when the
 * prompt is made). */
/* The items of array a as token ids in [0, max] into out [size of a]; param names a. */
static td_err req_id_items(const json_t *a, const char *param, json_int_t max, uint32_t *out,
                           api_error *e)
{
    size_t i;
    const json_t *v;
    json_array_foreach(a, i, v) {
        if (!req_token_id(v, max, &out[i]))
            return apierr_set(e, 400, "invalid_value", param,
                              "Invalid value for '%s': item %zu is not a token id.", param, i);
    }
    return TD_OK;
}

static td_err req_stop_ids(gw_request *r, api_error *e)
{
    const json_t *a = req_field(r->root, "stop_token_ids");
    if (!a)
        return TD_OK;
    if (!json_is_array(a))
        return req_bad_type(e, "stop_token_ids", "an array", a);
    if (json_array_size(a) > REQ_STOP_IDS_MAX)
        return apierr_set(e, 400, "invalid_value", "stop_token_ids",
                          "Invalid value for 'stop_token_ids': at most %d token ids, but got %zu.",
                          REQ_STOP_IDS_MAX, json_array_size(a));
    TD_TRY(req_id_items(a, "stop_token_ids", UINT32_MAX, r->stop_ids, e));
    r->n_stop_ids = json_array_size(a);
    return TD_OK;
}

/* prediction: {"type": "content", "content": text or [{"type": "text", "text": ...}, ...]},
 * the parts joined. */
static td_err req_prediction(gw_request *r, api_error *e)
{
    const json_t *p = req_field(r->root, "prediction");
    if (!p)
        return TD_OK;
    if (!json_is_object(p))
        return req_bad_type(e, "prediction", "an object", p);
    const json_t *type = json_object_get(p, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "content") != 0)
        return apierr_set(e, 400, "invalid_value", "prediction.type",
                          "Invalid value for 'prediction.type': supported value is 'content'.");
    const json_t *c = json_object_get(p, "content");
    if (!c)
        return apierr_set(e, 400, "missing_required_parameter", "prediction.content",
                          "Missing required parameter: 'prediction.content'.");
    json_t *text;
    TD_TRY(req_text_parts(c, "prediction.content", "", &text, e));
    r->prediction_len = json_string_length(text);
    r->prediction = malloc(r->prediction_len + 1);
    if (r->prediction) {
        memcpy(r->prediction, json_string_value(text), r->prediction_len);
        r->prediction[r->prediction_len] = 0;
    }
    json_decref(text);
    return r->prediction ? TD_OK : apierr_set(e, 500, NULL, NULL, "out of memory");
}

/* allowed_token_ids: 1..MSG_ALLOWED_MAX token ids (checked against the vocabulary when the
 * prompt is made). */
static td_err req_allowed(gw_request *r, api_error *e)
{
    const json_t *a = req_field(r->root, "allowed_token_ids");
    if (!a)
        return TD_OK;
    if (!json_is_array(a))
        return req_bad_type(e, "allowed_token_ids", "an array of token ids", a);
    const size_t n = json_array_size(a);
    if (n == 0 || n > MSG_ALLOWED_MAX)
        return apierr_set(e, 400, "invalid_value", "allowed_token_ids",
                          "Invalid value for 'allowed_token_ids': 1 to %u token ids, got %zu.",
                          MSG_ALLOWED_MAX, n);
    if (!(r->allowed = malloc(n * sizeof *r->allowed)))
        return apierr_set(e, 500, NULL, NULL, "out of memory");
    TD_TRY(req_id_items(a, "allowed_token_ids", INT32_MAX, r->allowed, e));
    r->n_allowed = n;
    return TD_OK;
}

static td_err req_common(gw_request *r, api_error *e)
{
    const json_t *model = req_field(r->root, "model");
    if (model && !json_is_string(model))
        return req_bad_type(e, "model", "a string", model);
    r->model = model ? json_string_value(model) : NULL;

    TD_TRY(req_bool(r->root, "stream", "stream", &r->stream, e));
    TD_TRY(req_prediction(r, e));
    const json_t *so = req_field(r->root, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return req_bad_type(e, "stream_options", "an object", so);
        if (!r->stream)
            return apierr_set(e, 400, "invalid_value", "stream_options",
                              "Invalid value for 'stream_options': only allowed when 'stream' is "
                              "true.");
        TD_TRY(req_bool(so, "include_usage", "stream_options.include_usage", &r->include_usage,
                        e));
        TD_TRY(req_bool(so, "continuous_usage_stats", "stream_options.continuous_usage_stats",
                        &r->continuous_usage, e));
    }
    int64_t plp = 0;
    TD_TRY(req_int(r->root, "prompt_logprobs", -1, REQ_TOP_LOGPROBS_MAX, &plp, &r->prompt_lp, e));
    if (plp < 0)
        return apierr_set(e, 400, "invalid_value", "prompt_logprobs",
                          "Invalid value for 'prompt_logprobs': -1 (the whole vocabulary) is not "
                          "served; at most %d alternatives per prompt token.",
                          REQ_TOP_LOGPROBS_MAX);
    if (r->prompt_lp && r->stream)
        return apierr_set(e, 400, "invalid_value", "prompt_logprobs",
                          "Invalid value for 'prompt_logprobs': not available with 'stream'; "
                          "ask without streaming.");
    r->prompt_top = (uint32_t)plp;
    int64_t n = 1;
    TD_TRY(req_int(r->root, "n", 1, REQ_N_MAX, &n, NULL, e));
    r->n = (uint32_t)n;
    TD_TRY(req_int(r->root, "truncate_prompt_tokens", -1, INT32_MAX, &r->truncate, NULL, e));
    if (r->truncate == 0 && req_field(r->root, "truncate_prompt_tokens"))
        return apierr_set(e, 400, "invalid_value", "truncate_prompt_tokens",
                          "Invalid value for 'truncate_prompt_tokens': expected -1 (the context's "
                          "size) or a number of tokens from 1, but got 0 instead.");

    req_sampling *s = &r->sampling;
    s->temperature = 1.0;
    s->top_p = 1.0;
    TD_TRY(req_number(r->root, "temperature", 0, false, 2, &s->temperature, e));
    TD_TRY(req_number(r->root, "top_p", 0, true, 1, &s->top_p, e));
    TD_TRY(req_number(r->root, "min_p", 0, false, 1, &s->min_p, e));
    TD_TRY(req_int(r->root, "top_k", -1, INT32_MAX, &s->top_k, NULL, e));
    if (s->top_k < 0)
        s->top_k = 0;
    int64_t seed = 0;
    TD_TRY(req_int(r->root, "seed", INT64_MIN, INT64_MAX, &seed, &s->has_seed, e));
    s->seed = (uint64_t)seed;
    TD_TRY(req_number(r->root, "presence_penalty", -2, false, 2, &s->presence_penalty, e));
    TD_TRY(req_number(r->root, "frequency_penalty", -2, false, 2, &s->frequency_penalty, e));
    s->repetition_penalty = 1.0;
    TD_TRY(req_number(r->root, "repetition_penalty", 0, true, MSG_REPETITION_MAX,
                      &s->repetition_penalty, e));
    TD_TRY(req_int(r->root, "min_tokens", 0, UINT32_MAX, &s->min_tokens, NULL, e));
    if (r->max_tokens >= 0 && s->min_tokens > r->max_tokens)
        return apierr_set(e, 400, "invalid_value", "min_tokens",
                          "Invalid value for 'min_tokens': %lld is more than max_tokens (%lld).",
                          (long long)s->min_tokens, (long long)r->max_tokens);
    TD_TRY(req_logit_bias(r, e));
    TD_TRY(req_response_format(r, e));
    TD_TRY(req_guided(r, e));
    if (r->force_call && r->format != MSG_FORMAT_TEXT)
        return apierr_set(e, 400, "invalid_value", "response_format",
                          "Invalid value for 'response_format': a required tool call "
                          "('tool_choice') and a structured answer cannot both be asked for.");
    if (r->force_call)
        r->format = MSG_FORMAT_TOOL_CALL;
    TD_TRY(req_stop_ids(r, e));
    TD_TRY(req_bool(r->root, "ignore_eos", "ignore_eos", &r->ignore_eos, e));
    TD_TRY(req_bool(r->root, "include_stop_str_in_output", "include_stop_str_in_output",
                    &r->keep_stop, e));
    bool skip = true;
    TD_TRY(req_bool(r->root, "skip_special_tokens", "skip_special_tokens", &skip, e));
    r->keep_special = !skip;
    TD_TRY(req_allowed(r, e));
    TD_TRY(req_bad_words(r, e));
    return req_stop(r, e);
}

td_err req_parse(gw_request *r, req_kind kind, const char *body, size_t len, api_error *e)
{
    memset(r, 0, sizeof *r);
    json_t *root;
    TD_TRY(req_load_json(body, len, &root, e));
    return req_parse_root(r, kind, root, e);
}

td_err req_parse_root(gw_request *r, req_kind kind, json_t *root, api_error *e)
{
    r->kind = kind;
    r->max_tokens = -1;
    r->root = root;
    td_err err = kind == REQ_CHAT ? req_chat(r, e) : req_completion(r, e);
    if (err == TD_OK)
        err = req_common(r, e);
    if (err == TD_OK)
        err = req_best_of(r, e);
    if (err != TD_OK)
        req_free(r);
    return err;
}

void req_free(gw_request *r)
{
    json_decref(r->messages);
    json_decref(r->root);
    for (size_t i = 0; i < r->n_prompts; i++)
        free(r->prompts[i].ids);
    free(r->prompts);
    free(r->bias_tok);
    free(r->bias);
    free(r->schema);
    free(r->prediction);
    free(r->allowed);
    json_decref(r->named_tools);
    json_decref(r->resp);
    json_decref(r->resp_conv);
    memset(r, 0, sizeof *r);
}

/* --- tokenize / detokenize ------------------------------------------------------------------ */

td_err req_parse_tokenize(const char *body, size_t len, json_t **root, const char **text,
                          size_t *text_len, bool *add_special, api_error *e)
{
    TD_TRY(req_load_json(body, len, root, e));
    const char *key = json_object_get(*root, "content") ? "content" : "prompt";
    const json_t *c = json_object_get(*root, key);
    td_err r = TD_OK;
    *add_special = true;
    if (!c)
        r = apierr_set(e, 400, "missing_required_parameter", "content",
                       "Missing required parameter: 'content'.");
    else if (!json_is_string(c))
        r = req_bad_type(e, key, "a string", c);
    else
        r = req_bool(*root, "add_special", "add_special", add_special, e);
    if (r != TD_OK) {
        json_decref(*root);
        *root = NULL;
        return r;
    }
    *text = json_string_value(c);
    *text_len = json_string_length(c);
    return TD_OK;
}

td_err req_parse_detokenize(const char *body, size_t len, uint32_t n_vocab, int32_t **ids,
                            size_t *n_ids, api_error *e)
{
    json_t *root = NULL;
    *ids = NULL;
    *n_ids = 0;
    TD_TRY(req_load_json(body, len, &root, e));
    const json_t *t = json_object_get(root, "tokens");
    td_err r = TD_OK;
    if (!t)
        r = apierr_set(e, 400, "missing_required_parameter", "tokens",
                       "Missing required parameter: 'tokens'.");
    else if (!json_is_array(t))
        r = req_bad_type(e, "tokens", "an array", t);
    int32_t *v = NULL;
    if (r == TD_OK) {
        v = malloc((json_array_size(t) + 1) * sizeof *v);
        if (!v)
            r = apierr_set(e, 500, NULL, NULL, "out of memory");
    }
    size_t i;
    const json_t *x;
    if (r == TD_OK) {
        json_array_foreach(t, i, x) {
            uint32_t id;
            if (!req_token_id(x, (json_int_t)n_vocab - 1, &id)) {
                char param[APIERR_PARAM_MAX];
                snprintf(param, sizeof param, "tokens[%zu]", i);
                r = apierr_set(e, 400, "invalid_value", param,
                               "Invalid value for '%s': expected a token id from 0 to %u.", param,
                               n_vocab - 1);
                break;
            }
            v[i] = (int32_t)id;
        }
    }
    if (r == TD_OK) {
        *ids = v;
        *n_ids = json_array_size(t);
    } else {
        free(v);
    }
    json_decref(root);
    return r;
}
