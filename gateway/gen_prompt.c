/* Building a request's prompts (gen_int.h): the chat template or the completion prompts, the
 * context budget, echo's text, the tool spec and the prediction's tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/callm.h"
#include "common/log.h"
#include "gateway/gen_int.h"
#include "gateway/reasoning.h"

td_err gen_chat_prompt(gw_state *g, const gw_request *req, tok_ids *ids, bool *in_think,
                       api_error *e)
{
    chat_template *own = NULL; /* the request's chat_template */
    if (req->chat_template &&
        chat_template_init(&own, req->chat_template, req->chat_template_len) != TD_OK)
        return apierr_set(e, 400, "invalid_value", "chat_template",
                          "Invalid value for 'chat_template': %s", err_msg());
    const chat_template *tmpl = own ? own : g->tmpl;
    if (!tmpl)
        return apierr_set(e, 400, "no_chat_template", NULL,
                          "The model file has no chat template; use /v1/completions, or send "
                          "one as 'chat_template'.");
    chat_opts o = {
        .tools = req->tools,
        .add_generation_prompt = req->add_generation_prompt,
        .continue_final = req->continue_final,
        .enable_thinking = req->enable_thinking,
        .kwargs = req->template_kwargs,
        .bos_token = g->chat.bos_token,
        .eos_token = g->chat.eos_token,
    };
    char *text = NULL;
    size_t len = 0;
    const td_err rendered = chat_template_render(tmpl, req->messages, &o, &text, &len);
    chat_template_free(own);
    if (rendered != TD_OK)
        return apierr_set(e, 400, "invalid_messages", req_prompt_param(req),
                          "The chat template cannot render these messages: %s", err_msg());
    *in_think = think_prompt_open(text, len);
    td_err err = tok_encode(g->tok, text, len, 0, ids);
    free(text);
    if (err != TD_OK) {
        tok_ids_free(ids);
        return apierr_set(e, 500, NULL, NULL, "tokenizing the prompt failed: %s", err_msg());
    }
    return TD_OK;
}

/* A chat's echo (vLLM's): the last message's text when the assistant wrote it (a list's text
 * parts joined by newlines), else nothing. */
static td_err gen_chat_echo(api_stream *s, api_error *e)
{
    gen_prompt *gp = &s->prompts[0];
    const json_t *msgs = json_object_get(s->req.root, "messages");
    const json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const json_t *role = json_object_get(last, "role"), *content = json_object_get(last, "content");
    gp->echo = "";
    if (!json_is_string(role) || strcmp(json_string_value(role), "assistant") != 0)
        return TD_OK;
    if (json_is_string(content)) {
        gp->echo = json_string_value(content);
        gp->echo_len = json_string_length(content);
        return TD_OK;
    }
    tbuf b = {0};
    size_t i, parts = 0;
    const json_t *part;
    json_array_foreach(content, i, part) {
        const json_t *text = json_object_get(part, "text");
        if (!json_is_string(text))
            continue;
        if ((parts++ && !tbuf_put(&b, "\n", 1)) ||
            !tbuf_put(&b, json_string_value(text), json_string_length(text))) {
            free(b.p);
            return apierr_set(e, 500, "internal_error", NULL, "the gateway ran out of memory");
        }
    }
    gp->echo_owned = b.p;
    gp->echo = b.p ? b.p : "";
    gp->echo_len = b.len;
    return TD_OK;
}

static td_err gen_prompt_chat(api_stream *s, api_error *e)
{
    tok_ids ids = {0};
    TD_TRY(gen_chat_prompt(s->g, &s->req, &ids, &s->in_think, e));
    s->prompts[0].ids = ids.ids;
    s->prompts[0].n = ids.n;
    return s->req.echo ? gen_chat_echo(s, e) : TD_OK;
}

/* Completions prompt i (a batch's prompts are named prompt[i] in errors). */
static td_err gen_prompt_completion(api_stream *s, size_t i, api_error *e)
{
    gw_state *g = s->g;
    req_prompt *rp = &s->req.prompts[i];
    gen_prompt *gp = &s->prompts[i];
    if (rp->ids) {
        uint32_t n_vocab = tok_n_vocab(g->tok);
        for (size_t k = 0; k < rp->n_ids; k++)
            if ((uint32_t)rp->ids[k] >= n_vocab) {
                char param[64];
                if (s->n_prompts > 1)
                    snprintf(param, sizeof param, "prompt[%zu][%zu]", i, k);
                else
                    snprintf(param, sizeof param, "prompt[%zu]", k);
                return apierr_set(e, 400, "invalid_value", param,
                                  "Invalid value for '%s': token id %d is outside the "
                                  "vocabulary (0 to %u).",
                                  param, rp->ids[k], n_vocab - 1);
            }
        gp->ids = rp->ids;
        gp->n = rp->n_ids;
        rp->ids = NULL;
        return TD_OK;
    }
    tok_ids ids = {0};
    if (tok_encode(g->tok, rp->text, rp->len, TOK_ENC_ADD_SPECIAL, &ids) != TD_OK) {
        tok_ids_free(&ids);
        return apierr_set(e, 500, NULL, NULL, "tokenizing the prompt failed: %s", err_msg());
    }
    gp->ids = ids.ids;
    gp->n = ids.n;
    return TD_OK;
}

td_err gen_check_ids(const api_stream *s, const char *param, const uint32_t *ids, size_t n,
                     api_error *e)
{
    const uint32_t n_vocab = tok_n_vocab(s->g->tok);
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= n_vocab)
            return apierr_set(e, 400, "invalid_value", param,
                              "Invalid value for '%s': token id %u is outside the vocabulary "
                              "(0 to %u).",
                              param, ids[i], n_vocab - 1);
    return TD_OK;
}

uint32_t gen_ctx(gw_state *g)
{
    if (g->cfg.ctx > 0)
        return (uint32_t)g->cfg.ctx;
    msg_status st;
    if (g->link && link_status(g->link, &st) && st.n_ctx > 0)
        return st.n_ctx;
    return g->model_ctx;
}

/* Prompt gp's tokens per choice, against the context and the server's limit. */
static td_err gen_budget(api_stream *s, gen_prompt *gp, api_error *e)
{
    gw_state *g = s->g;
    uint64_t ctx = gen_ctx(g);
    const char *where = req_prompt_param(&s->req), *budget = req_budget_param(&s->req);
    const size_t n_prompt = gp->n;
    int64_t limit = g->cfg.max_tokens_limit;
    if (s->req.max_tokens > 0 && limit > 0 && s->req.max_tokens > limit)
        return apierr_set(e, 400, "invalid_value", budget,
                          "Invalid value for '%s': this server generates at most %lld "
                          "tokens per request, but %lld were requested.", budget,
                          (long long)limit, (long long)s->req.max_tokens);
    if (n_prompt == 0)
        return apierr_set(e, 400, "invalid_value", where, "The prompt has no tokens.");
    if (ctx > 0) {
        uint64_t want = s->req.max_tokens > 0 ? (uint64_t)s->req.max_tokens : 1;
        if (n_prompt + want > ctx)
            return apierr_set(e, 400, "context_length_exceeded", where,
                              "This model's maximum context length is %llu tokens. However, you "
                              "requested %llu tokens (%zu in the %s, %llu in the completion). "
                              "Please reduce the length of the %s or completion.",
                              (unsigned long long)ctx, (unsigned long long)(n_prompt + want),
                              n_prompt, where, (unsigned long long)want, where);
    }
    uint64_t n = s->req.max_tokens >= 0 ? (uint64_t)s->req.max_tokens
                 : ctx > 0                ? ctx - n_prompt
                                          : 4096;
    if (s->req.max_tokens <= 0 && limit > 0 && n > (uint64_t)limit)
        n = (uint64_t)limit;
    gp->max_tokens = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    return TD_OK;
}

/* echo: the prompt's text (the client's, or the decoding of its ids). */
static td_err gen_echo_setup(api_stream *s, size_t i, api_error *e)
{
    const req_prompt *rp = &s->req.prompts[i];
    gen_prompt *gp = &s->prompts[i];
    if (rp->text && !gp->truncated) {
        gp->echo = rp->text;
        gp->echo_len = rp->len;
    } else {
        tok_bytes t = {0};
        if (tok_decode(s->g->tok, gp->ids, gp->n, 0, &t) != TD_OK) {
            tok_bytes_free(&t);
            return apierr_set(e, 500, NULL, NULL, "decoding the prompt failed: %s", err_msg());
        }
        gp->echo_owned = t.ptr; /* NULL for an empty text */
        gp->echo = t.ptr ? t.ptr : "";
        gp->echo_len = t.len;
    }
    return TD_OK;
}

/* Room for the prompt tokens' log probabilities (the first token has none). */
static td_err gen_plp_setup(gen_prompt *gp, api_error *e)
{
    if (!(gp->plp = calloc(gp->n, sizeof *gp->plp)))
        return apierr_set(e, 500, "internal_error", NULL, "the gateway ran out of memory");
    gp->plp[0] = (lp_token){.id = gp->ids[0], .none = true};
    gp->n_plp = 1;
    return TD_OK;
}

/* truncate_prompt_tokens: the prompt's last tokens only (the text echoed is then theirs). */
static void gen_truncate(api_stream *s, gen_prompt *gp)
{
    const uint64_t keep = s->req.truncate > 0 ? (uint64_t)s->req.truncate : gen_ctx(s->g);
    if (s->req.truncate == 0 || keep == 0 || gp->n <= keep)
        return;
    memmove(gp->ids, gp->ids + (gp->n - keep), (size_t)keep * sizeof *gp->ids);
    gp->n = (size_t)keep;
    gp->truncated = true;
}

td_err gen_prompts(api_stream *s, api_error *e)
{
    const bool chat = s->req.kind == REQ_CHAT;
    s->n_prompts = chat ? 1 : s->req.n_prompts;
    s->n_gens = (uint32_t)s->n_prompts * s->req.best_of;
    if (!(s->prompts = calloc(s->n_prompts, sizeof *s->prompts)))
        return apierr_set(e, 500, "internal_error", NULL, "the gateway ran out of memory");
    for (size_t i = 0; i < s->n_prompts; i++) {
        TD_TRY(chat ? gen_prompt_chat(s, e) : gen_prompt_completion(s, i, e));
        gen_truncate(s, &s->prompts[i]);
        TD_TRY(gen_budget(s, &s->prompts[i], e));
        if (s->req.echo && !chat)
            TD_TRY(gen_echo_setup(s, i, e));
        if ((s->req.echo && s->req.logprobs) || s->req.prompt_lp)
            TD_TRY(gen_plp_setup(&s->prompts[i], e));
    }
    return TD_OK;
}

/* The tool spec, {"form": "xml" | "json", "tools": [{"name", "parameters"}]}, in the form the
 * chat template teaches (its text shows "<function=" for the XML one), for a required call
 * (tools that cannot be enforced are the request's 400) or for tool_choice "auto" (then the
 * calls are left free instead, as they are for a model without the call tokens). */
td_err gen_tool_spec(api_stream *s, api_error *e)
{
    s->format = s->req.format;
    const bool required = s->req.format == MSG_FORMAT_TOOL_CALL;
    if (!required && (s->req.format != MSG_FORMAT_TEXT || !s->req.parse_tools ||
                      tok_id_of(s->g->tok, "<tool_call>", 11) < 0 ||
                      tok_id_of(s->g->tok, "</tool_call>", 12) < 0))
        return TD_OK;
    const char *tmpl = s->req.chat_template ? s->req.chat_template : s->g->chat.template_text;
    const bool xml = tmpl && strstr(tmpl, "<function=");
    json_t *tools = json_array();
    size_t i;
    const json_t *t;
    json_array_foreach(s->req.tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        json_t *one = json_pack("{s:O}", "name", json_object_get(f, "name"));
        const json_t *params = json_object_get(f, "parameters");
        if (one && params)
            json_object_set(one, "parameters", (json_t *)params);
        if (!tools || !one || json_array_append_new(tools, one) != 0) {
            json_decref(tools);
            return apierr_set(e, 500, "internal_error", NULL, "the gateway ran out of memory");
        }
    }
    json_t *spec = json_pack("{s:s,s:o}", "form", xml ? "xml" : "json", "tools", tools);
    s->tool_spec = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(spec);
    if (!s->tool_spec)
        return apierr_set(e, 500, "internal_error", NULL, "the gateway ran out of memory");
    /* checked here as verifyd will */
    cm_grammar *g = NULL;
    td_err err = strlen(s->tool_spec) > MSG_SCHEMA_MAX
                     ? err_set(TD_ENOTSUP, "the tools take %zu bytes as JSON, at most %u are "
                               "matched", strlen(s->tool_spec), MSG_SCHEMA_MAX)
                     : cm_compile(s->tool_spec, strlen(s->tool_spec), &g);
    cm_free(g);
    if (err == TD_ENOMEM)
        return apierr_set(e, 500, "internal_error", NULL, "the gateway ran out of memory");
    if (err != TD_OK && required)
        return apierr_set(e, 400, err == TD_ENOTSUP ? "unsupported_value" : "invalid_value",
                          "tools", "The tools cannot be enforced for a required call: %s",
                          err_msg());
    if (err != TD_OK) {
        LOG_INFO("tool calls are left unmatched: %s", err_msg());
        free(s->tool_spec);
        s->tool_spec = NULL;
        return TD_OK;
    }
    if (!required)
        s->format = MSG_FORMAT_TOOLS;
    return TD_OK;
}

/* The prediction's tokens (its text as plain text: no special tokens). */
td_err gen_prediction(api_stream *s, api_error *e)
{
    if (tok_encode(s->g->tok, s->req.prediction, s->req.prediction_len, TOK_ENC_SPLIT_SPECIAL,
                   &s->predict) != TD_OK)
        return apierr_set(e, 500, NULL, NULL, "tokenizing the prediction failed: %s", err_msg());
    if (s->predict.n > MSG_PREDICT_MAX)
        return apierr_set(e, 400, "invalid_value", "prediction",
                          "Invalid value for 'prediction': at most %u tokens are supported, got "
                          "%zu.",
                          MSG_PREDICT_MAX, s->predict.n);
    return TD_OK;
}


td_err gen_bad_words(api_stream *s, api_error *e)
{
    const json_t *words = s->req.bad_words;
    size_t cap = 0, i;
    const json_t *v;
    json_array_foreach(words, i, v) {
        const char *w = json_string_value(v);
        const size_t n = json_string_length(v), lead = req_leading_space(w, n);
        char spaced[REQ_BAD_WORD_LEN_MAX + 2] = " ";
        memcpy(spaced + 1, w + lead, n - lead);
        tok_ids a = {0}, b = {0};
        td_err err = tok_encode(s->g->tok, w + lead, n - lead, 0, &a);
        if (err == TD_OK)
            err = tok_encode(s->g->tok, spaced, n - lead + 1, 0, &b);
        const bool same = a.n == b.n && memcmp(a.ids, b.ids, a.n * sizeof *a.ids) == 0;
        char param[APIERR_PARAM_MAX];
        snprintf(param, sizeof param, "bad_words[%zu]", i);
        if (err == TD_OK && (a.n > MSG_BAD_LEN_MAX || b.n > MSG_BAD_LEN_MAX))
            err = apierr_set(e, 400, "invalid_value", param,
                             "Invalid value for '%s': %zu tokens, at most %u are supported.",
                             param, a.n > b.n ? a.n : b.n, MSG_BAD_LEN_MAX);
        else if (err != TD_OK)
            err = apierr_set(e, 500, NULL, NULL, "tokenizing a bad word failed: %s", err_msg());
        const size_t need = s->n_bad + 2 + a.n + b.n;
        if (err == TD_OK && need > MSG_BAD_MAX)
            err = apierr_set(e, 400, "invalid_value", "bad_words",
                             "Invalid value for 'bad_words': %zu tokens in all, at most %u are "
                             "supported.",
                             need, MSG_BAD_MAX);
        if (err == TD_OK && need > cap) {
            cap = 2 * need;
            uint32_t *grown = realloc(s->bad, cap * sizeof *grown);
            if (!grown)
                err = apierr_set(e, 500, "internal_error", NULL, "the gateway ran out of memory");
            else
                s->bad = grown;
        }
        for (int k = 0; err == TD_OK && k < (same ? 1 : 2); k++) {
            const tok_ids *t = k ? &b : &a;
            if (t->n == 0)
                continue;
            s->bad[s->n_bad++] = (uint32_t)t->n;
            for (size_t j = 0; j < t->n; j++)
                s->bad[s->n_bad++] = (uint32_t)t->ids[j];
        }
        tok_ids_free(&a);
        tok_ids_free(&b);
        if (err != TD_OK)
            return err;
    }
    return TD_OK;
}
